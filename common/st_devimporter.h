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
 * One importer per daemon struct; single-threaded (the server thread).
 */
#ifndef ST_DEVIMPORTER_H
#define ST_DEVIMPORTER_H

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
	int host_registered;
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

/* Sets up an importer of kind for instance (borrowed string); host_base /
 * host_bytes: the shared host pool copies read from or write to
 * (registered as pinned at the first import; NULL: none). */
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
