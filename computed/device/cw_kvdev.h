/*
 * cw_kvdev.h — computed's side of device KV pages (issue 10, DESIGN.md
 * "Device pools shared by CUDA IPC"): before a step whose attention runs on
 * the device, ask kvd (KV_MSG_SEQ_DEVICE, kv_devpage.h) to copy the pages
 * the step reads into the device KV page pool computed exported
 * (cw_devpool), pin each slot in kvd's device slot table
 * /strata.<instance>.devkv, make the compute stream wait on the slot's copy
 * event, and get one device pointer per (sequence, stream, page).  Rows a
 * step writes on the device are marked dirty in the table (after the
 * stream finished writing them); kvd copies them back to the host page
 * before it spills, copies, shares or reuses it, so the host stays
 * authoritative.  Release unpins once the stream passed the reads.
 *
 * Rules for the caller (one thread per struct cw_kvdev; kv_client is
 * thread-safe):
 *   - release a step before acquiring the next one for the same pages (a
 *     page still pinned is never refreshed: kvd copies appended rows into
 *     another slot, and rows written into the old one after that would be
 *     lost);
 *   - a page written on the device is not written on the host as well
 *     (one writer side per page and step; the host copy of a dirty page is
 *     stale until kvd copied it back);
 *   - with no device KV pool (a CPU build, no GPU, --device-kv-budget 0)
 *     cw_kvdev_open says -ENODEV and computed keeps reading host pages
 *     (kv_client_row): the CPU path is unchanged.
 *
 * Paged attention on the device (computed/device/cuda/cw_cu_attn.cu,
 * cw_cu_attend) takes an array of device row pointers: cw_kvdev_rows
 * builds it from a step (entry (i, s, p) of step.ptr[] is at
 * cw_kvdev_index(step, i, s, p), NULL for a page to read from the host pool
 * instead: none when every page fit the device pool).
 *
 * Who calls it (issue 10): the forward pass of the Mixtral / Qwen3-MoE
 * families (cw_model.c, cw_model_set_kvdev) acquires once per step,
 * before layer 0, rows [0, first position of the step) of each of the
 * step's sequences for every layer's stream, reads them through
 * cw_kvdev_rows in every layer's attention (the module's cw_attn_fn on a
 * GPU; the CPU attention on the fake device, whose memory is host shared
 * memory), and releases after the last layer.  The host stays the only
 * writer: computed writes each new K/V row into the host page
 * (kv_client_row_writable) as before, and the step's own rows are read
 * from there; nothing calls cw_kvdev_mark_written yet: it is for a future
 * device-side KV write (the rows would then be written on the device
 * only, never on both sides).
 */
#ifndef CW_KVDEV_H
#define CW_KVDEV_H

#include <stdint.h>

#include "kv_proto.h"
#include "st_error.h"

struct kv_client;
struct kv_devpage;
struct st_cuda_export;

/* The exported device KV pool (cw_devpool_kv, or a test's own export). */
struct cw_kvdev_pool {
	const struct st_cuda_export *x;
	uint64_t epoch;
	uint32_t n_slots, n_events;
	uint64_t slot_bytes;
};

struct cw_kvdev;

/* One step's device pages (cw_kvdev_acquire .. cw_kvdev_release). */
struct cw_kvdev_step {
	uint32_t n_pages;         /* entries below */
	struct kv_devpage *pages; /* kvd's answer (host page id, slot, key) */
	uint8_t **ptr;            /* device address of the page, NULL: read
				   * the host page (not on the device) */
	uint32_t *first;          /* [n_seqs + 1]: first entry of sequence i */
	uint32_t n_seqs, n_streams, page_rows;
	uint32_t on_device;       /* entries with a pointer */
	uint32_t tab_gen;         /* table mapping the pins belong to */
};

/*
 * Opens the device page access of kv client kv (borrowed; declared) for
 * the pool `pool` computed exported to kvd of `instance`.  -ENODEV when
 * pool is NULL (no device KV pool: use host pages).  *ret owned by the
 * caller (cw_kvdev_close).
 */
int cw_kvdev_open(struct cw_kvdev **ret, struct kv_client *kv,
		  const struct cw_kvdev_pool *pool, const char *instance,
		  struct st_diag *diag);

/*
 * Makes rows [0, e[i].n_rows) of every stream of e[i].seq readable on the
 * device for one step: one SEQ_DEVICE request, then every page kvd placed
 * is pinned and `stream` (a cudaStream_t; NULL: the default stream) made
 * to wait on its copy.  ret is filled (release it with cw_kvdev_release,
 * also after an error).  Errors of kv_client_seq_device, -ST_E_STALE (kvd
 * answered for another epoch: computed re-exports, then try again),
 * -ENOMEM.
 */
int cw_kvdev_acquire(struct cw_kvdev *k, int n,
		     const struct kv_reserve_entry *e, void *stream,
		     struct cw_kvdev_step *ret, struct st_diag *diag);

/* Index of (request entry i, stream s, page index p) in a step. */
static inline uint32_t cw_kvdev_index(const struct cw_kvdev_step *st,
				      uint32_t i, uint32_t s, uint32_t p)
{
	uint32_t np = (st->first[i + 1] - st->first[i]) / st->n_streams;

	return st->first[i] + s * np + p;
}

/*
 * The device addresses of rows [r0, r0 + n) of stream s (declared as
 * *decl: row bytes, tokens per row) of request entry i, into ret_rows[n]
 * (host memory; cw_cu_attend wants them copied to the device): row r is in
 * page kv_stream_row_page at kv_stream_row_slot * row_bytes.  0, or
 * -ENOENT when a page of them is not on the device (read those rows from
 * the host pool), -EINVAL when i, s or the rows are out of the step.
 */
int cw_kvdev_rows(const struct cw_kvdev_step *st, uint32_t i, uint32_t s,
		  const struct kv_stream_decl *decl, uint32_t r0, uint32_t n,
		  const uint8_t **ret_rows);

/*
 * Bytes [lo, hi) of the device page of entry idx were written by the step
 * (the stream has finished writing them): marked dirty, kvd copies them
 * back to the host page.  -EINVAL when idx has no device page or the span
 * is empty or past the slot; -ST_E_STALE when kvd restarted since the
 * acquire and its table no longer holds the page in that slot: the rows
 * are then only on the device, write them to the host page (kv_client_row)
 * instead.
 */
int cw_kvdev_mark_written(struct cw_kvdev *k, const struct cw_kvdev_step *st,
			  uint32_t idx, uint64_t lo, uint64_t hi);

/* Waits for stream (NULL: nothing to wait for), at most
 * ST_CUDA_STREAM_TIMEOUT_MS, unpins every page of the step and frees its
 * arrays.  A stream that does not finish keeps that step's pages pinned
 * (it may still read them) and is not waited for again. */
void cw_kvdev_release(struct cw_kvdev *k, struct cw_kvdev_step *st,
		      void *stream);

struct cw_kvdev_stats {
	uint64_t steps, pages, on_device, pin_misses;
};
void cw_kvdev_stats(const struct cw_kvdev *k, struct cw_kvdev_stats *ret);

/* Detaches the table; NULL is a no-op.  Steps must be released first. */
void cw_kvdev_close(struct cw_kvdev *k);

#endif
