/*
 * cw_devpool.h — computed's device pools (tier T0, issue 10; DESIGN.md
 * sections 1, 3 and 6): computed owns the device memory.  It cudaMallocs
 * the expert slot pool (sized by --device-budget: a share of all experts
 * or bytes) and the KV page pool (--device-kv-budget), exports each with
 * its IPC events to the daemon that fills it (expertd, kvd: ST_MSG_DEV_EXPORT
 * on a REQ socket of its own), records the importers' leases, and frees
 * the memory only when every importer has answered ST_MSG_DEV_REVOKE or is
 * dead (PITFALLS P18).  It reads expert slots through the device slot
 * table expertd keeps in shared memory: pin, wait on the slot's event lane
 * on the compute stream, read, unpin after the stream passed the reads.
 *
 * When an importer restarts (its pid changes) the same allocation is
 * exported again under the same epoch (cw_devpool_check); when computed
 * restarts, its successor allocates and exports under a new epoch and the
 * importers drop the old handles.
 *
 * Thread safety: every function locks the pool (the scheduler thread
 * acquires slots; the main thread checks the importers).
 */
#ifndef CW_DEVPOOL_H
#define CW_DEVPOOL_H

#include <stdint.h>

#include "st_error.h"

struct cw_devpool;

/* What computed knows of the expert pool and the KV pages. */
struct cw_devpool_geom {
	uint32_t n_layers, n_experts, top_k;
	uint64_t record_bytes;     /* one expert record (expertd's) */
	uint64_t kv_page_bytes;    /* one KV page (0: no KV device pool) */
};

struct cw_devpool_opts {
	const char *budget;        /* --device-budget: "25%" of all experts,
				    * or bytes ("8GiB"); NULL: no device pools */
	const char *kv_budget;     /* --device-kv-budget bytes (NULL: 256MiB,
				    * "0": no KV device pool) */
	const char *run_dir, *instance;
	int timeout_ms;            /* per request to expertd / kvd */
};

/*
 * Device slots for a budget: percent of n_layers * n_experts (at least
 * top_k, at most all), or bytes / slot bytes (slot bytes = record_bytes
 * rounded up to ST_DEVPOOL_SLOT_ALIGN).  -EINVAL for a budget that does
 * not parse, -ST_E_BUDGET (message with the minimum) below top_k slots.
 */
int cw_devpool_slots(const struct cw_devpool_geom *g, const char *budget,
		     uint32_t *ret_n_slots, uint64_t *ret_slot_bytes,
		     struct st_diag *diag);

/*
 * Allocates and exports the pools.  -ST_E_UNSUPPORTED (no CUDA in this
 * build, or no device: the reason in diag) means "run on the CPU"; any
 * other error is a real failure (budget, CUDA, an importer refusing).
 * *ret owned by the caller (cw_devpool_close).
 */
int cw_devpool_open(struct cw_devpool **ret, const struct cw_devpool_geom *g,
		    const struct cw_devpool_opts *o, struct st_diag *diag);

/*
 * Periodic (computed's main loop): re-exports to an importer whose pid
 * died (a restarted expertd or kvd imports the same epoch again); drops
 * leases of dead importers.  Returns 0 or the error of a failed re-export
 * (retried at the next call).
 */
int cw_devpool_check(struct cw_devpool *p, struct st_diag *diag);

/*
 * The device address of (layer, expert) when expertd has it READY in a
 * device slot: pins the slot, makes stream (a cudaStream_t, NULL: the
 * default stream) wait for that slot's copy, returns 1 with *ret_ptr and
 * *ret_slot.  0 when it is not on the device (use the host pool), never
 * waiting for other experts.  Release with cw_devpool_unpin once the
 * stream has finished reading it.
 */
int cw_devpool_pin(struct cw_devpool *p, uint32_t layer, uint32_t expert,
		   void *stream, const void **ret_ptr, uint32_t *ret_slot);
void cw_devpool_unpin(struct cw_devpool *p, uint32_t slot);

/*
 * The device KV page pool as exported (for cw_kvdev_open): 0 and *ret
 * filled, or -ENODEV when there is none (--device-kv-budget 0, too small
 * for one page, or kvd refused it).  The export lives until
 * cw_devpool_close.
 */
struct cw_kvdev_pool;
int cw_devpool_kv(struct cw_devpool *p, struct cw_kvdev_pool *ret);

/* Counters for logs and /metrics. */
struct cw_devpool_stats {
	uint32_t n_slots, kv_pages;
	uint64_t slot_bytes, epoch;
	uint64_t pins, misses, exports, reexports;
	uint64_t fake_experts;  /* experts computed by cw_devpool_fake_sync */
	uint64_t fake_failed_syncs; /* STRATA_CUDA_FAKE_SYNC_FAIL's */
};

/*
 * A cw_expert_fn and its cw_expert_sync_fn (cw_device_ops.h; arg: the struct
 * cw_devpool) for the fake device of st_cuda.h (STRATA_CUDA_FAKE=1, tests
 * without a GPU).  Like the CUDA module, fn only pins the expert's device
 * slot and queues it (0, leave it to the CPU path, when it is not in a
 * device slot); sync computes every queued expert from its slot (host
 * memory there) with the CPU reference backend, writes the outputs and
 * unpins, so a run through the device pools must give the CPU path's
 * logits bit for bit.  STRATA_CUDA_FAKE_SYNC_FAIL=N makes every N-th sync
 * fail (outputs NaN, -ST_E_CUDA) to test the model's fallback.  Called
 * from the forward-pass thread only.  sync: 0, -ST_E_CUDA or -ENOMEM.
 */
struct cw_wview;
int cw_devpool_fake_fn(void *arg, int layer, int expert, const uint8_t *rec,
		       const struct cw_wview w[3], int n,
		       const float *const *x, float *const *out);
int cw_devpool_fake_sync(void *arg);
void cw_devpool_stats(struct cw_devpool *p, struct cw_devpool_stats *ret);

/*
 * Revokes every export (waiting up to timeout_ms for each importer's
 * answer, or its death), then frees what no importer can still map.  An
 * allocation whose importer neither answered nor died is left to the
 * driver (freed when computed exits) rather than freed under a reader, and
 * says so.  NULL is a no-op.
 */
void cw_devpool_close(struct cw_devpool *p, int timeout_ms);

#endif
