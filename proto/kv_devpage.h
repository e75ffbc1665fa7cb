/*
 * kv_devpage.h — KV_MSG_SEQ_DEVICE (issue 10): computed asks kvd to make
 * the pages a step reads resident in the device KV page pool (tier T0,
 * st_devpool.h), and kvd answers where each page is (DESIGN.md "Device
 * pools shared by CUDA IPC").
 *
 *   request  u32 n (1..KV_PROTO_MAX_RESERVE), n x {u32 seq (!= 0),
 *            u32 n_rows}: rows [0, n_rows) of every stream of seq will be
 *            read on the device
 *   reply    u64 epoch (the device pool's export epoch, != 0),
 *            u32 n_pages (<= KV_DEVPAGE_MAX_PAGES), n_pages x {u32 page,
 *            u32 slot, u64 key}: for request entry i, stream s, page
 *            index p < ceil(n_rows / page_rows) in that order, the host
 *            page id (KV_PAGE_NONE when the sequence has no page there,
 *            e.g. outside a stream's window), the device slot holding its
 *            first kv_stream_page_used bytes (KV_DEVPAGE_NO_SLOT: not on
 *            the device, read the host page) and the slot's key
 *            (st_devkv_key(page, generation), what the exporter pins
 *            with; 0 with KV_DEVPAGE_NO_SLOT).
 *
 * The copies are enqueued on kvd's stream and their event lanes recorded
 * before the reply; the reader pins each slot (st_devslot_pin: slot, key,
 * epoch), waits on the lane it returns, reads, unpins.
 */
#ifndef KV_DEVPAGE_H
#define KV_DEVPAGE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_proto.h"
#include "st_error.h"
#include "st_proto.h"

#define KV_DEVPAGE_NO_SLOT UINT32_MAX
/* Entries one reply holds (16 bytes each, within ST_MSG_MAX_BYTES). */
#define KV_DEVPAGE_MAX_PAGES ((ST_MSG_MAX_BYTES - 4096) / 16)

struct kv_devpage {
	uint32_t page;  /* host page id or KV_PAGE_NONE */
	uint32_t slot;  /* device slot or KV_DEVPAGE_NO_SLOT */
	uint64_t key;   /* st_devkv_key of the slot's page, 0 without slot */
};

/* Request: n entries (as SEQ_RESERVE's). */
void kv_devpage_encode_req(struct st_wbuf *w, uint32_t n,
			   const struct kv_reserve_entry *e);
/*
 * Decodes a request: n 1..KV_PROTO_MAX_RESERVE (-ST_E_LIMIT above), exact
 * length, no sequence 0.  *ret_entries is malloc'd (owned by the caller on
 * success).  0, -ST_E_PROTO / -ST_E_LIMIT with diag, -ENOMEM.
 */
int kv_devpage_decode_req(const uint8_t *p, size_t len, uint32_t *ret_n,
			  struct kv_reserve_entry **ret_entries,
			  struct st_diag *diag);

/* Reply: epoch and n pages. */
void kv_devpage_encode_rep(struct st_wbuf *w, uint64_t epoch, uint32_t n,
			   const struct kv_devpage *v);
/*
 * Decodes a reply of exactly `want` pages into ret[want] (caller's):
 * epoch != 0, count == want, exact length, a slot always with a non-zero
 * key and a real page, no slot always with key 0.  0 or -ST_E_PROTO with
 * diag.
 */
int kv_devpage_decode_rep(const uint8_t *p, size_t len, uint32_t want,
			  uint64_t *ret_epoch, struct kv_devpage *ret,
			  struct st_diag *diag);

#endif
