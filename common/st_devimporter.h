/*
 * st_devimporter.h — the importer side of a device pool (issue 10), the
 * part expertd and kvd share: answering ST_MSG_DEV_EXPORT / DEV_REVOKE
 * (st_devpool.h), opening and closing the CUDA IPC handles (st_cuda.h) in
 * the order the epoch rules want (old handles closed, after the copy
 * stream drained, before new ones open), registering the daemon's shared
 * host pool as pinned memory once, noticing a dead exporter, and owning
 * the device slot table segment /strata.<instance>.dev<kind>.
 *
 * What to copy and when is the daemon's (es_devpool.c for expertd).
 * One importer per daemon struct; single-threaded (the server thread),
 * but for the thread that pins the host pool (st_devimporter_host_ready).
 */
#ifndef ST_DEVIMPORTER_H
#define ST_DEVIMPORTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "st_cuda.h"
#include "st_devpool.h"
#include "st_proto.h"
#include "st_shm.h"

#define ST_DEVSLOT_SHM_VERSION 3 /* 3: st_shm_header.pool_id */

struct st_devimporter {
	struct st_devimport st;        /* epoch bookkeeping */
	struct st_cuda_import *cu;     /* NULL: nothing imported */
	struct st_shm tab_shm;         /* device slot table segment */
	struct st_devslot_table *tab;  /* in tab_shm, NULL until imported */
	const char *instance;          /* borrowed */
	char tab_kind[16];             /* "devexperts", "devkv" */
	void *host_base;               /* shared host pool to pin (or NULL) */
	uint64_t host_bytes;
	/* the pinning of the host pool, in a thread of its own (issue 27:
	 * tens of GiB take seconds, longer than an EXPORT may wait) */
	pthread_t pin_thread;
	int pin_started;               /* the thread was started */
	_Atomic int host_state;        /* ST_DEVIMPORT_HOST_* */
	/* a sticky CUDA error after an import closed: no import again */
	int cuda_broken;
	char broken_msg[256];
	uint64_t min_slot_bytes;       /* refuse exports with smaller slots */
	uint64_t slot_bytes;
	uint32_t n_slots, n_events;
	uint64_t exports, revokes, peer_deaths;
	/* Optional (kvd): called when an EXPORT of the epoch the table holds
	 * arrives at a restarted importer, after the handles were opened and
	 * before the table is reset, so the daemon can copy back what the
	 * exporter wrote on the device (the table's dirty ranges) while the
	 * old keys are still there.  NULL: nothing. */
	void (*before_reset)(void *ctx, struct st_devimporter *m);
	void *cb_ctx;
};

/* Where the pinning of the host pool stands. */
enum {
	ST_DEVIMPORT_HOST_NONE = 0,    /* not started */
	ST_DEVIMPORT_HOST_PINNING = 1, /* cudaHostRegister running */
	ST_DEVIMPORT_HOST_PINNED = 2,
	ST_DEVIMPORT_HOST_FAILED = 3,  /* copies use pageable memory */
};

/* Sets up an importer of kind for instance (borrowed string); host_base /
 * host_bytes: the shared host pool copies read from or write to (pinned
 * in the background from the first import; NULL: none). */
void st_devimporter_init(struct st_devimporter *m, uint32_t kind,
			 const char *instance, void *host_base,
			 uint64_t host_bytes);

/*
 * Handles a DEV_EXPORT or DEV_REVOKE payload: decodes and validates it,
 * closes / opens handles as st_devimport_plan_* says, resets the device
 * slot table for a new epoch, and appends the reply payload (struct
 * st_devpool_rep) to rep.  Returns 0, or a negative code with diag for the
 * error reply (-ST_E_PROTO malformed, -ST_E_UNSUPPORTED built without
 * CUDA, -ST_E_CUDA the import failed: nothing stays imported then).
 * *ret_reset is set to 1 when the slot table was reset (the daemon drops
 * its own map of device slots).
 */
int st_devimporter_handle(struct st_devimporter *m, uint16_t type,
			  const uint8_t *payload, size_t len,
			  struct st_wbuf *rep, int *ret_reset,
			  struct st_diag *diag);

/*
 * 1 when copies between the host pool and the device may start: the pool
 * is pinned, or pinning failed (copies then go through pageable memory:
 * correct, slower), or there is no host pool; 0 while a background
 * thread pins it (started here by the first call, and by the first
 * import): the daemon keeps its copies for later meanwhile, so an EXPORT
 * is answered without waiting for tens of GiB to be pinned.  host_base /
 * host_bytes must not change once it was called with a pool.  Called from
 * the daemon's main thread.
 */
int st_devimporter_host_ready(struct st_devimporter *m);

/* Periodic: closes the import when the exporter's pid died (returns 1
 * then, so the daemon drops its map), else 0. */
int st_devimporter_tick(struct st_devimporter *m);

/* 1 while a pool is imported. */
static inline int st_devimporter_active(const struct st_devimporter *m)
{
	return m->cu != NULL && m->tab != NULL;
}

/* Closes everything; destroy_table: unlink the slot table segment too. */
void st_devimporter_fini(struct st_devimporter *m, int destroy_table);

#endif
