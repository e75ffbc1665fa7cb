/*
 * es_harness.h — helpers for expertd's multi-process tests: a store made
 * from a fixture model by es_convert, a real expertd binary from the build
 * directory started on a private instance and run directory, reference
 * records read with st_store_read_record, and clean-up of every segment,
 * socket and file a test made (also when it fails).
 */
#ifndef ES_HARNESS_H
#define ES_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "es_pool.h"
#include "st_shm.h"
#include "st_store.h"

/* One expertd under test. */
struct es_h {
	char tmp[512];        /* private temporary directory */
	char store[600];      /* store directory (es_convert output) */
	char run_dir[600];
	char inst[64];
	char log[600];        /* expertd's stderr */
	pid_t pid;            /* running expertd, 0 if none */
	/* reference records, [n_layers * n_experts][record_bytes] */
	struct st_store *st;
	uint8_t *ref;
	int n_layers, n_experts, top_k;
	uint64_t record_bytes;
};

/*
 * Makes a temp dir, converts fixture model `model` (e.g. "kjv-moe") into
 * a store there with es_convert (MXFP4 experts), reads every record as the
 * reference and picks a private instance name from `tag`.  Skips the test
 * (exit 77) when the fixture is absent.  0 or fails the test.
 */
int es_h_init(struct es_h *h, const char *model, const char *tag);

/* Stops expertd if running, removes the segment, sockets and temp dir. */
void es_h_fini(struct es_h *h);

/*
 * Starts build/expertd/expertd --store --instance --run-dir plus the extra
 * arguments (NULL-terminated list) and waits until it serves (pid file
 * with its pid).  Returns 0, or the exit status (> 0) if it exited, or -1
 * on time-out.  stderr goes to h->log (appended).
 */
int es_h_start(struct es_h *h, ...) __attribute__((sentinel));

/* Runs expertd with the given extra arguments and waits for it to exit;
 * returns its exit status and its stderr in errbuf. */
int es_h_run_fail(struct es_h *h, char *errbuf, size_t errlen, ...)
	__attribute__((sentinel));

/* Kills expertd if running, removes the instance's segments and the run
 * directory: a clean slate for the next test of the same binary. */
void es_h_reset(struct es_h *h);

/* SIGTERM and wait (SIGKILL after 5 s).  Returns the exit status, or
 * 128+signal. */
int es_h_stop(struct es_h *h);

/* SIGKILL and reap. */
void es_h_kill9(struct es_h *h);

/* Reference record of (layer, expert). */
const uint8_t *es_h_ref(const struct es_h *h, int layer, int expert);

/* Number of /dev/shm entries named strata.<inst>.* */
int es_h_count_segments(const struct es_h *h);

/* What a running (or killed) expertd of an instance of its own leaves
 * there: the expert pool and the I/O queue (st_ioq.h). */
#define ES_H_SEGMENTS 2

/* Maps the pool segment for inspection (st_shm_attach + view).  0 or
 * negative. */
int es_h_attach(const struct es_h *h, struct st_shm *shm,
		struct es_pool_view *v);

/* Path of <run_dir>/expertd.<suffix>. */
const char *es_h_path(const struct es_h *h, const char *suffix, char *buf,
		      size_t len);

/* Client time-out used by the tests (ms). */
#define ES_H_TIMEOUT_MS 5000

#endif
