/*
 * kv_test_util.h — helpers for kvd's daemon tests: start the real kvd binary
 * (STRATA_BUILD_DIR/kvd/kvd) on a private instance and temporary run
 * directory, wait until it answers, kill or stop it, and remove everything
 * it may have left (segment, sockets, run directory).
 */
#ifndef KV_TEST_UTIL_H
#define KV_TEST_UTIL_H

#include <stdint.h>
#include <sys/types.h>

struct kvd_inst {
	char name[64];        /* instance */
	char run_dir[4096];
	pid_t pid;            /* 0 when not running */
	char budget[32];      /* --budget ("": not given) */
	char max_seqs[16];
	char max_rows[16];
	char spill_budget[32]; /* --spill-budget ("0": none) */
	const char *extra[8];  /* more options, NULL-terminated (borrowed) */
};

/* Fills k with a fresh instance name (tag) and run directory; no daemon. */
void kvd_inst_init(struct kvd_inst *k, const char *tag);

/* Starts kvd with k's options and waits (up to 5 s) until it answers a
 * PING.  Returns 0, or -1 if it exited or never answered (then
 * k->pid is 0 and *ret_status, when not NULL, holds its wait status). */
int kvd_start(struct kvd_inst *k, int *ret_status);

/* Runs kvd with k's options and waits for it to exit (up to timeout_ms);
 * returns its exit code, or -1 if it did not exit (then it is killed). */
int kvd_run_expect_exit(const struct kvd_inst *k, const char *run_dir,
			int timeout_ms);

/* Sends sig and reaps the daemon; returns its wait status. */
int kvd_kill(struct kvd_inst *k, int sig);

/* PING over a fresh socket: 0 and kvd's pid / pool epoch, or negative. */
int kvd_ping(const char *run_dir, int timeout_ms, int32_t *ret_pid,
	     uint64_t *ret_epoch);

/* Kills the daemon if running, removes the kv segment and run directory. */
void kvd_cleanup(struct kvd_inst *k);

/* cmocka fixtures: a fresh kvd_inst tagged "<prefix><n>" (not started), and
 * its teardown (SIGTERM if running, cleanup, free). */
struct kvd_inst *kvd_fixture_new(const char *prefix, int n);
int kvd_fixture_teardown(void **state);

/* Number of /dev/shm entries of the instance ("strata.<name>.*"). */
int kvd_count_segments(const char *name);

/* Path of the kv segment in /dev/shm into buf. */
const char *kvd_segment_path(const char *name, char *buf, size_t len);

/* The table entry of (sequence handle, stream, page index) as the pool
 * segment of instance `name` holds it now (read-only mapping): a page id,
 * KV_PAGE_NONE, KV_PAGE_LOST or KV_PAGE_SPILLED | slot; *ret_slot_bytes
 * (may be NULL) gets the spill slot size.  UINT32_MAX - 2 on failure. */
uint32_t kvd_table_entry(const char *name, uint32_t seq, uint32_t stream,
			 uint32_t page_index, uint64_t *ret_slot_bytes);

/* Flips one bit of byte `off` of a file (fsync'ed).  0 or -1. */
int kvd_flip_byte(const char *path, uint64_t off);

/* A test's own redis-server (the remote KV tier's tests): on a free
 * loopback port, no persistence. */
struct kvt_redis {
	pid_t pid;            /* 0 when not running */
	uint16_t port;
	char url[64];         /* redis://127.0.0.1:PORT/0 */
};

/* Starts r's redis-server and waits until it answers (up to 4 s).  0, or
 * -1 (no free port, cannot fork, or it never answered: not installed?),
 * with nothing left running. */
int kvt_redis_start(struct kvt_redis *r);

/* Stops r's redis-server (SIGTERM, waited for); nothing when not running. */
void kvt_redis_stop(struct kvt_redis *r);

#endif
