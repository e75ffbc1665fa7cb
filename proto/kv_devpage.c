/*
 * kv_devpage.c — KV_MSG_SEQ_DEVICE encoding and validation (kv_devpage.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "kv_devpage.h"

void kv_devpage_encode_req(struct st_wbuf *w, uint32_t n,
			   const struct kv_reserve_entry *e)
{
	kv_proto_encode_reserve(w, n, e);
}

int kv_devpage_decode_req(const uint8_t *p, size_t len, uint32_t *ret_n,
			  struct kv_reserve_entry **ret_entries,
			  struct st_diag *diag)
{
	return kv_proto_decode_entries("SEQ_DEVICE", p, len, ret_n,
				       ret_entries, diag);
}

void kv_devpage_encode_rep(struct st_wbuf *w, uint64_t epoch, uint32_t n,
			   const struct kv_devpage *v)
{
	st_wbuf_u64(w, epoch);
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++) {
		st_wbuf_u32(w, v[i].page);
		st_wbuf_u32(w, v[i].slot);
		st_wbuf_u64(w, v[i].key);
	}
}

int kv_devpage_decode_rep(const uint8_t *p, size_t len, uint32_t want,
			  uint64_t *ret_epoch, struct kv_devpage *ret,
			  struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t n;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u64(&r, ret_epoch) || st_rbuf_u32(&r, &n))
		return st_diag_set(diag, -ST_E_PROTO, "SEQ_DEVICE reply of "
				   "%zu bytes is too short", len);
	if (*ret_epoch == 0)
		return st_diag_set(diag, -ST_E_PROTO, "SEQ_DEVICE reply: "
				   "epoch 0");
	if (n != want || st_rbuf_left(&r) != (size_t)n * 16)
		return st_diag_set(diag, -ST_E_PROTO, "SEQ_DEVICE reply: %u "
				   "pages in %zu bytes, %u asked for", n, len,
				   want);
	for (uint32_t i = 0; i < n; i++) {
		st_rbuf_u32(&r, &ret[i].page);
		st_rbuf_u32(&r, &ret[i].slot);
		st_rbuf_u64(&r, &ret[i].key);
		if (ret[i].slot == KV_DEVPAGE_NO_SLOT ? ret[i].key != 0 :
		    (ret[i].key == 0 || ret[i].page >= KV_MAX_PAGES))
			return st_diag_set(diag, -ST_E_PROTO, "SEQ_DEVICE "
					   "reply: page %u: slot %u with key "
					   "%llu", i, ret[i].slot,
					   (unsigned long long)ret[i].key);
	}
	return 0;
}
