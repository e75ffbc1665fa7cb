/*
 * kv_devpool.h — kvd's side of the device KV page pool (issue 10, DESIGN.md
 * "Device pools shared by CUDA IPC"): imports the pool computed exported
 * (st_devimporter.h: CUDA IPC handles, its own copy stream, the KV pool
 * segment registered as pinned memory, the device slot table
 * /strata.<instance>.devkv), answers DEV_EXPORT / DEV_REVOKE, and moves
 * page bytes between the host pool (T1, authoritative) and device slots.
 *
 * H2D (KV_MSG_SEQ_DEVICE, kv_devpage.h): for every page a step of
 * computed will read, kvd finds or claims a device slot keyed
 * st_devkv_key(page, generation), enqueues the copy of the page's used
 * bytes (kv_stream_page_used at the rows asked for) on its stream, records
 * the slot's event lane and publishes it READY before replying.  A slot
 * records how many leading bytes it holds (st_devslot.bytes): rows the host
 * appended since are copied on the next request (only the new bytes when
 * the slot is unpinned; into a fresh slot, whole, when computed still pins
 * the old one, which is never rewritten).  A page freed and allocated again
 * (spill, restore, copy-on-write) has a new generation and so a new key:
 * no stale copy is ever served.  Host rows are append-only between
 * requests; rows rewritten in place on the host must not be read through
 * an older device copy (computed does not do that).
 *
 * D2H: computed marks rows it wrote into a device page dirty
 * (st_devslot_dirty_mark, after its stream finished the writes).  kvd
 * copies a dirty range back to the host page, and waits for it, before it
 * reads the host page itself (kv_pool.page_sync: spill, copy-on-write of a
 * fork or reservation, prefix-cache publish), before it reuses or refreshes
 * the slot, before it answers a REVOKE, and, after a kvd restart, before
 * the re-imported table is reset (st_devimporter.before_reset).  A dirty
 * page whose host page was freed meanwhile is dropped.
 *
 * Host pages and in-flight copies: before any request that may free,
 * spill or move pages (every request but SEQ_DEVICE), and before
 * the background prefetch and the client reaper, kvd drains its stream.
 */
#ifndef KV_DEVPOOL_H
#define KV_DEVPOOL_H

#include <stddef.h>
#include <stdint.h>

#include "st_devpool.h"
#include "st_error.h"
#include "st_proto.h"

struct kv_server;
struct kv_devpool;

/* Handles DEV_EXPORT / DEV_REVOKE; reply payload appended to rep.  0 or a
 * negative code with diag. */
int kv_devpool_handle(struct kv_server *s, uint16_t type, const uint8_t *p,
		      size_t len, struct st_wbuf *rep, struct st_diag *diag);

/*
 * KV_MSG_SEQ_DEVICE of client `client` (payload p, len): copies the pages
 * into device slots as described above and appends the reply.  0, or
 * -ST_E_UNSUPPORTED (no device pool imported), -ST_E_NOTFOUND, -EPERM,
 * -ST_E_LIMIT (rows past the sequence's n_rows, or more pages than a reply
 * holds), -ST_E_CHECKSUM / -ST_E_BUDGET (restoring spilled pages first
 * failed), -ST_E_PROTO, -ST_E_CUDA, with diag.  A page for which no slot
 * is free (every slot pinned or used by this request) is answered
 * KV_DEVPAGE_NO_SLOT: computed reads it from the host pool.
 */
int kv_devpool_seq_device(struct kv_server *s, uint32_t client,
			  const uint8_t *p, size_t len, struct st_wbuf *rep,
			  struct st_diag *diag);

/* kv_pool.page_sync (ctx: the struct kv_server): copies the device-written
 * rows of `page` back to the host page and waits for them; nothing when the
 * page has no dirty device copy. */
void kv_devpool_page_sync(void *ctx, uint32_t page);

/* Waits for every copy enqueued (a no-op when none is in flight). */
void kv_devpool_quiesce(struct kv_server *s);

/* Server loop: drops the import when the exporter died. */
void kv_devpool_tick(struct kv_server *s);

/* Counters (all 0 without a device pool). */
struct kv_devpool_stats {
	uint64_t h2d_copies, h2d_bytes;  /* page copies to the device */
	uint64_t d2h_copies, d2h_bytes;  /* dirty ranges copied back */
	uint64_t hits;                   /* pages already on the device */
	uint64_t refreshes;              /* appended rows copied */
	uint64_t no_slot;                /* pages answered KV_DEVPAGE_NO_SLOT */
	uint64_t dropped_dirty;          /* dirty pages whose host page died */
	uint64_t copy_errors;
};
void kv_devpool_stats(const struct kv_server *s, struct kv_devpool_stats *ret);

/* Shutdown: drains and closes; destroy_table removes the table segment. */
void kv_devpool_fini(struct kv_server *s, int destroy_table);

#endif
