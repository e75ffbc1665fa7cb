/* kv_proto.c — kvd messages and pool layout, see kv_proto.h. */
#include "kv_proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "st_util.h"

/* ---- messages ---------------------------------------------------------- */

/* Every decoder ends with this: the payload must be consumed exactly. */
static int rbuf_end(const struct st_rbuf *r, const char *what,
		    struct st_diag *diag)
{
	if (st_rbuf_left(r))
		return st_diag_set(diag, -ST_E_PROTO,
				   "%s: %zu bytes after the last field", what,
				   st_rbuf_left(r));
	return 0;
}

static int short_payload(const char *what, size_t len, struct st_diag *diag)
{
	return st_diag_set(diag, -ST_E_PROTO, "%s: payload of %zu bytes is "
			   "too short", what, len);
}

void kv_proto_encode_hello(struct st_wbuf *w, const struct kv_msg_hello *m)
{
	char name[KV_PROTO_NAME_BYTES];

	memset(name, 0, sizeof(name));
	memcpy(name, m->name, strnlen(m->name, sizeof(name)));
	st_wbuf_u32(w, m->pid);
	st_wbuf_u32(w, m->proto_version);
	st_wbuf_bytes(w, name, sizeof(name));
	st_wbuf_u64(w, m->start_ticks);
	if (m->resume_client_id)
		st_wbuf_u32(w, m->resume_client_id);
}

int kv_proto_decode_hello(const uint8_t *p, size_t len,
			  struct kv_msg_hello *ret, struct st_diag *diag)
{
	struct st_rbuf r;
	int ended = 0;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	/* the version first: a peer of another version gets told so, not
	 * that its HELLO has another length */
	if (st_rbuf_u32(&r, &ret->pid) || st_rbuf_u32(&r, &ret->proto_version))
		return short_payload("HELLO", len, diag);
	if (ret->proto_version != ST_PROTO_VERSION)
		return st_diag_set(diag, -ST_E_VERSION,
				   "HELLO: client speaks protocol version %u, "
				   "kvd speaks %u", ret->proto_version,
				   ST_PROTO_VERSION);
	if (st_rbuf_bytes(&r, ret->name, KV_PROTO_NAME_BYTES) ||
	    st_rbuf_u64(&r, &ret->start_ticks))
		return short_payload("HELLO", len, diag);
	if (st_rbuf_left(&r) == 4)
		st_rbuf_u32(&r, &ret->resume_client_id);
	if (rbuf_end(&r, "HELLO", diag) < 0)
		return -ST_E_PROTO;
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "HELLO: pid %u invalid",
				   ret->pid);
	/* name: printable ASCII, then only NULs */
	for (int i = 0; i < KV_PROTO_NAME_BYTES; i++) {
		unsigned char c = (unsigned char)ret->name[i];

		if (c == 0)
			ended = 1;
		else if (ended || c < 0x20 || c > 0x7e)
			return st_diag_set(diag, -ST_E_PROTO,
					   "HELLO: client name byte %d (0x%02x) "
					   "is not printable ASCII", i, c);
	}
	ret->name[KV_PROTO_NAME_BYTES] = 0;
	return 0;
}

void kv_proto_encode_hello_reply(struct st_wbuf *w,
				 const struct kv_msg_hello_reply *m)
{
	st_wbuf_u32(w, m->client_id);
	st_wbuf_u64(w, m->epoch);
	st_wbuf_u64(w, m->pool_id);
}

int kv_proto_decode_hello_reply(const uint8_t *p, size_t len,
				struct kv_msg_hello_reply *ret)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->client_id) || st_rbuf_u64(&r, &ret->epoch) ||
	    st_rbuf_u64(&r, &ret->pool_id) || st_rbuf_left(&r) ||
	    ret->client_id == 0)
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_ping_reply(struct st_wbuf *w,
				const struct kv_msg_ping_reply *m)
{
	st_wbuf_u32(w, m->pid);
	st_wbuf_u64(w, m->epoch);
	st_wbuf_u32(w, m->ready);
}

int kv_proto_decode_ping_reply(const uint8_t *p, size_t len,
			       struct kv_msg_ping_reply *ret)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->pid) || st_rbuf_u64(&r, &ret->epoch) ||
	    st_rbuf_u32(&r, &ret->ready) || st_rbuf_left(&r))
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_declare(struct st_wbuf *w, const struct kv_msg_declare *m)
{
	uint32_t n = ST_MIN(m->n_streams, (uint32_t)KV_MAX_STREAMS);

	st_wbuf_u32(w, m->n_streams);
	st_wbuf_u32(w, m->page_rows);
	for (uint32_t i = 0; i < n; i++) {
		st_wbuf_u32(w, m->streams[i].row_bytes);
		st_wbuf_u32(w, m->streams[i].tokens_per_row);
		st_wbuf_u32(w, m->streams[i].window_rows);
		st_wbuf_u32(w, m->streams[i].flags);
	}
}

int kv_proto_decode_declare(const uint8_t *p, size_t len,
			    struct kv_msg_declare *ret, struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->n_streams) || st_rbuf_u32(&r, &ret->page_rows))
		return short_payload("DECLARE", len, diag);
	if (ret->n_streams == 0 || ret->n_streams > KV_MAX_STREAMS)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DECLARE: %u streams, must be 1..%d",
				   ret->n_streams, KV_MAX_STREAMS);
	if (ret->page_rows == 0 || ret->page_rows > KV_MAX_PAGE_ROWS)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DECLARE: page_rows %u, must be 1..%u",
				   ret->page_rows, KV_MAX_PAGE_ROWS);
	if (st_rbuf_left(&r) != (size_t)ret->n_streams * 16)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DECLARE: %u streams need %u payload bytes, "
				   "got %zu", ret->n_streams,
				   8 + ret->n_streams * 16, len);
	for (uint32_t i = 0; i < ret->n_streams; i++) {
		struct kv_stream_decl *s = &ret->streams[i];

		st_rbuf_u32(&r, &s->row_bytes);
		st_rbuf_u32(&r, &s->tokens_per_row);
		st_rbuf_u32(&r, &s->window_rows);
		st_rbuf_u32(&r, &s->flags);
		if (s->row_bytes == 0 || s->row_bytes > KV_MAX_ROW_BYTES)
			return st_diag_set(diag, -ST_E_PROTO,
					   "DECLARE: stream %u: row_bytes %u, "
					   "must be 1..%u", i, s->row_bytes,
					   KV_MAX_ROW_BYTES);
	}
	return rbuf_end(&r, "DECLARE", diag);
}

void kv_proto_encode_declare_reply(struct st_wbuf *w,
				   const struct kv_msg_declare_reply *m)
{
	st_wbuf_u64(w, m->layout_hash);
	st_wbuf_u64(w, m->epoch);
	st_wbuf_u64(w, m->pool_bytes);
	st_wbuf_u64(w, m->pool_id);
}

int kv_proto_decode_declare_reply(const uint8_t *p, size_t len,
				  struct kv_msg_declare_reply *ret)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u64(&r, &ret->layout_hash) || st_rbuf_u64(&r, &ret->epoch) ||
	    st_rbuf_u64(&r, &ret->pool_bytes) ||
	    st_rbuf_u64(&r, &ret->pool_id) || st_rbuf_left(&r))
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_reserve(struct st_wbuf *w, uint32_t n,
			     const struct kv_reserve_entry *e)
{
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++) {
		st_wbuf_u32(w, e[i].seq);
		st_wbuf_u32(w, e[i].n_rows);
	}
}

int kv_proto_decode_entries(const char *what, const uint8_t *p, size_t len,
			    uint32_t *ret_n,
			    struct kv_reserve_entry **ret_entries,
			    struct st_diag *diag)
{
	struct kv_reserve_entry *e;
	struct st_rbuf r;
	uint32_t n;

	*ret_n = 0;
	*ret_entries = NULL;
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &n))
		return short_payload(what, len, diag);
	if (n == 0)
		return st_diag_set(diag, -ST_E_PROTO, "%s: no entries", what);
	if (n > KV_PROTO_MAX_RESERVE)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "%s: %u entries, at most %d per request",
				   what, n, KV_PROTO_MAX_RESERVE);
	if (st_rbuf_left(&r) != (size_t)n * 8)
		return st_diag_set(diag, -ST_E_PROTO,
				   "%s: %u entries need %zu payload bytes, "
				   "got %zu", what, n, 4 + (size_t)n * 8, len);
	e = malloc(sizeof(*e) * n);
	if (!e)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		st_rbuf_u32(&r, &e[i].seq);
		st_rbuf_u32(&r, &e[i].n_rows);
		if (e[i].seq == 0) {
			free(e);
			return st_diag_set(diag, -ST_E_PROTO,
					   "%s: entry %u: sequence 0 is never "
					   "valid", what, i);
		}
	}
	*ret_n = n;
	*ret_entries = e;
	return 0;
}

int kv_proto_decode_reserve(const uint8_t *p, size_t len, uint32_t *ret_n,
			    struct kv_reserve_entry **ret_entries,
			    struct st_diag *diag)
{
	return kv_proto_decode_entries("SEQ_RESERVE", p, len, ret_n,
				       ret_entries, diag);
}

void kv_proto_encode_fork(struct st_wbuf *w, const struct kv_msg_fork *m)
{
	st_wbuf_u32(w, m->src);
	st_wbuf_u32(w, m->n_rows);
}

int kv_proto_decode_fork(const uint8_t *p, size_t len, struct kv_msg_fork *ret,
			 struct st_diag *diag)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->src) || st_rbuf_u32(&r, &ret->n_rows))
		return short_payload("SEQ_FORK", len, diag);
	if (rbuf_end(&r, "SEQ_FORK", diag) < 0)
		return -ST_E_PROTO;
	if (ret->src == 0)
		return st_diag_set(diag, -ST_E_PROTO,
				   "SEQ_FORK: sequence 0 is never valid");
	return 0;
}

void kv_proto_encode_demand(struct st_wbuf *w, const struct kv_msg_demand *m)
{
	st_wbuf_u64(w, m->pages);
	st_wbuf_u32(w, m->n_reqs);
	st_wbuf_u64(w, m->grow);
}

int kv_proto_decode_demand(const uint8_t *p, size_t len,
			   struct kv_msg_demand *ret, struct st_diag *diag)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u64(&r, &ret->pages) || st_rbuf_u32(&r, &ret->n_reqs) ||
	    st_rbuf_u64(&r, &ret->grow))
		return short_payload("DEMAND", len, diag);
	if (rbuf_end(&r, "DEMAND", diag) < 0)
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_truncate(struct st_wbuf *w,
			      const struct kv_msg_truncate *m)
{
	st_wbuf_u32(w, m->seq);
	st_wbuf_u32(w, m->n_rows);
}

int kv_proto_decode_truncate(const uint8_t *p, size_t len,
			     struct kv_msg_truncate *ret,
			     struct st_diag *diag)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->seq) || st_rbuf_u32(&r, &ret->n_rows))
		return short_payload("SEQ_TRUNCATE", len, diag);
	if (rbuf_end(&r, "SEQ_TRUNCATE", diag) < 0)
		return -ST_E_PROTO;
	if (ret->seq == 0)
		return st_diag_set(diag, -ST_E_PROTO,
				   "SEQ_TRUNCATE: sequence 0 is never valid");
	return 0;
}

void kv_proto_encode_seq(struct st_wbuf *w, uint32_t seq)
{
	st_wbuf_u32(w, seq);
}

int kv_proto_decode_seq(const uint8_t *p, size_t len, uint32_t *ret_seq,
			struct st_diag *diag)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, ret_seq))
		return short_payload("sequence", len, diag);
	if (rbuf_end(&r, "sequence", diag) < 0)
		return -ST_E_PROTO;
	if (*ret_seq == 0)
		return st_diag_set(diag, -ST_E_PROTO,
				   "sequence 0 is never valid");
	return 0;
}

void kv_proto_encode_stats(struct st_wbuf *w, const struct kv_msg_stats *m)
{
	st_wbuf_u64(w, m->budget_bytes);
	st_wbuf_u64(w, m->pool_bytes);
	st_wbuf_u64(w, m->page_bytes);
	st_wbuf_u32(w, m->page_rows);
	st_wbuf_u32(w, m->n_streams);
	st_wbuf_u64(w, m->n_pages);
	st_wbuf_u64(w, m->pages_used);
	st_wbuf_u64(w, m->pages_peak);
	st_wbuf_u64(w, m->n_seqs);
	st_wbuf_u64(w, m->pages_shared);
	st_wbuf_u64(w, m->epoch);
	st_wbuf_u64(w, m->pool_id);
	st_wbuf_i32(w, m->pid);
	st_wbuf_u32(w, m->n_clients);
	st_wbuf_u32(w, m->max_seqs);
	st_wbuf_u32(w, m->max_rows_per_seq);
	st_wbuf_u64(w, m->pages_cached);
	st_wbuf_u64(w, m->cache_groups);
	st_wbuf_u64(w, m->prefix_lookups);
	st_wbuf_u64(w, m->prefix_pages_hit);
	st_wbuf_u64(w, m->prefix_rows_reused);
	st_wbuf_u64(w, m->prefix_published);
	st_wbuf_u64(w, m->cache_evictions);
	st_wbuf_u64(w, m->spill_budget_bytes);
	st_wbuf_u64(w, m->slot_bytes);
	st_wbuf_u64(w, m->n_slots);
	st_wbuf_u64(w, m->pages_spilled);
	st_wbuf_u64(w, m->spill_pages_total);
	st_wbuf_u64(w, m->spill_bytes_total);
	st_wbuf_u64(w, m->spill_ns_total);
	st_wbuf_u64(w, m->restore_pages_total);
	st_wbuf_u64(w, m->restore_bytes_total);
	st_wbuf_u64(w, m->restore_ns_total);
	st_wbuf_u64(w, m->restore_failures);
	st_wbuf_u32(w, m->spill_direct);
	st_wbuf_u32(w, m->n_pinned);
	st_wbuf_u32(w, m->remote_on);
	st_wbuf_u32(w, 0);
	st_wbuf_u64(w, m->remote_hits);
	st_wbuf_u64(w, m->remote_misses);
	st_wbuf_u64(w, m->remote_bytes_in);
	st_wbuf_u64(w, m->remote_bytes_out);
	st_wbuf_u64(w, m->remote_errors);
	st_wbuf_u64(w, m->remote_published);
	st_wbuf_u64(w, m->remote_rejected);
	st_wbuf_u64(w, m->prefix_ahead_groups);
	st_wbuf_u64(w, m->prefix_ahead_bytes);
	st_wbuf_u64(w, m->prefix_lookup_restores);
	st_wbuf_u64(w, m->prefix_lookup_restore_ns);
}

int kv_proto_decode_stats(const uint8_t *p, size_t len,
			  struct kv_msg_stats *m)
{
	struct st_rbuf r;
	int e = 0;

	st_rbuf_init(&r, p, len);
	e |= st_rbuf_u64(&r, &m->budget_bytes);
	e |= st_rbuf_u64(&r, &m->pool_bytes);
	e |= st_rbuf_u64(&r, &m->page_bytes);
	e |= st_rbuf_u32(&r, &m->page_rows);
	e |= st_rbuf_u32(&r, &m->n_streams);
	e |= st_rbuf_u64(&r, &m->n_pages);
	e |= st_rbuf_u64(&r, &m->pages_used);
	e |= st_rbuf_u64(&r, &m->pages_peak);
	e |= st_rbuf_u64(&r, &m->n_seqs);
	e |= st_rbuf_u64(&r, &m->pages_shared);
	e |= st_rbuf_u64(&r, &m->epoch);
	e |= st_rbuf_u64(&r, &m->pool_id);
	e |= st_rbuf_i32(&r, &m->pid);
	e |= st_rbuf_u32(&r, &m->n_clients);
	e |= st_rbuf_u32(&r, &m->max_seqs);
	e |= st_rbuf_u32(&r, &m->max_rows_per_seq);
	e |= st_rbuf_u64(&r, &m->pages_cached);
	e |= st_rbuf_u64(&r, &m->cache_groups);
	e |= st_rbuf_u64(&r, &m->prefix_lookups);
	e |= st_rbuf_u64(&r, &m->prefix_pages_hit);
	e |= st_rbuf_u64(&r, &m->prefix_rows_reused);
	e |= st_rbuf_u64(&r, &m->prefix_published);
	e |= st_rbuf_u64(&r, &m->cache_evictions);
	e |= st_rbuf_u64(&r, &m->spill_budget_bytes);
	e |= st_rbuf_u64(&r, &m->slot_bytes);
	e |= st_rbuf_u64(&r, &m->n_slots);
	e |= st_rbuf_u64(&r, &m->pages_spilled);
	e |= st_rbuf_u64(&r, &m->spill_pages_total);
	e |= st_rbuf_u64(&r, &m->spill_bytes_total);
	e |= st_rbuf_u64(&r, &m->spill_ns_total);
	e |= st_rbuf_u64(&r, &m->restore_pages_total);
	e |= st_rbuf_u64(&r, &m->restore_bytes_total);
	e |= st_rbuf_u64(&r, &m->restore_ns_total);
	e |= st_rbuf_u64(&r, &m->restore_failures);
	e |= st_rbuf_u32(&r, &m->spill_direct);
	e |= st_rbuf_u32(&r, &m->n_pinned);
	e |= st_rbuf_u32(&r, &m->remote_on);
	e |= st_rbuf_u32(&r, &m->reserved0);
	e |= st_rbuf_u64(&r, &m->remote_hits);
	e |= st_rbuf_u64(&r, &m->remote_misses);
	e |= st_rbuf_u64(&r, &m->remote_bytes_in);
	e |= st_rbuf_u64(&r, &m->remote_bytes_out);
	e |= st_rbuf_u64(&r, &m->remote_errors);
	e |= st_rbuf_u64(&r, &m->remote_published);
	e |= st_rbuf_u64(&r, &m->remote_rejected);
	e |= st_rbuf_u64(&r, &m->prefix_ahead_groups);
	e |= st_rbuf_u64(&r, &m->prefix_ahead_bytes);
	e |= st_rbuf_u64(&r, &m->prefix_lookup_restores);
	e |= st_rbuf_u64(&r, &m->prefix_lookup_restore_ns);
	if (e || st_rbuf_left(&r))
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_prefix(struct st_wbuf *w, int has_seq,
			    const struct kv_msg_prefix *m)
{
	if (has_seq)
		st_wbuf_u32(w, m->seq);
	st_wbuf_u64(w, m->model_id);
	st_wbuf_u32(w, m->n_ids);
	for (uint32_t i = 0; i < m->n_ids; i++)
		st_wbuf_i32(w, m->ids[i]);
	if (has_seq && m->flags)
		st_wbuf_u32(w, m->flags);
}

int kv_proto_decode_prefix(const uint8_t *p, size_t len, int has_seq,
			   struct kv_msg_prefix *ret, struct st_diag *diag)
{
	const char *what = has_seq ? "SEQ_PUBLISH" : "SEQ_CREATE_PREFIX";
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	if ((has_seq && st_rbuf_u32(&r, &ret->seq)) ||
	    st_rbuf_u64(&r, &ret->model_id) || st_rbuf_u32(&r, &ret->n_ids))
		return short_payload(what, len, diag);
	if (has_seq && ret->seq == 0)
		return st_diag_set(diag, -ST_E_PROTO,
				   "%s: sequence 0 is never valid", what);
	if (ret->n_ids == 0)
		return st_diag_set(diag, -ST_E_PROTO, "%s: no token ids", what);
	if (ret->n_ids > KV_PROTO_MAX_IDS)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "%s: %u token ids, at most %d per request",
				   what, ret->n_ids, (int)KV_PROTO_MAX_IDS);
	if (st_rbuf_left(&r) != (size_t)ret->n_ids * 4 &&
	    (!has_seq || st_rbuf_left(&r) != (size_t)ret->n_ids * 4 + 4))
		return st_diag_set(diag, -ST_E_PROTO,
				   "%s: %u ids need %zu more bytes, got %zu",
				   what, ret->n_ids, (size_t)ret->n_ids * 4,
				   st_rbuf_left(&r));
	ret->ids = malloc(sizeof(int32_t) * ret->n_ids);
	if (!ret->ids)
		return -ENOMEM;
	for (uint32_t i = 0; i < ret->n_ids; i++)
		st_rbuf_i32(&r, &ret->ids[i]);
	if (st_rbuf_left(&r)) {
		st_rbuf_u32(&r, &ret->flags);
		if (ret->flags & ~(uint32_t)KV_PUBLISH_F_ALL) {
			free(ret->ids);
			ret->ids = NULL;
			return st_diag_set(diag, -ST_E_PROTO, "%s: unknown "
					   "flags 0x%x", what, ret->flags);
		}
	}
	return 0;
}

void kv_msg_prefix_fini(struct kv_msg_prefix *m)
{
	if (!m)
		return;
	free(m->ids);
	m->ids = NULL;
	m->n_ids = 0;
}

void kv_proto_encode_prefix_reply(struct st_wbuf *w,
				  const struct kv_msg_prefix_reply *m)
{
	st_wbuf_u32(w, m->seq);
	st_wbuf_u32(w, m->n_cached);
}

int kv_proto_decode_prefix_reply(const uint8_t *p, size_t len,
				 struct kv_msg_prefix_reply *ret)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->seq) || st_rbuf_u32(&r, &ret->n_cached) ||
	    st_rbuf_left(&r) || ret->seq == 0)
		return -ST_E_PROTO;
	return 0;
}

void kv_proto_encode_residency(struct st_wbuf *w,
			       const struct kv_msg_residency *m)
{
	st_wbuf_u32(w, m->op);
	st_wbuf_u32(w, m->n);
	for (uint32_t i = 0; i < m->n; i++)
		st_wbuf_u32(w, m->seqs[i]);
}

int kv_proto_decode_residency(const uint8_t *p, size_t len,
			      struct kv_msg_residency *ret,
			      struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &ret->op) || st_rbuf_u32(&r, &ret->n))
		return short_payload("SEQ_RESIDENCY", len, diag);
	if (ret->op < KV_RESIDENCY_RESTORE || ret->op > KV_RESIDENCY_AHEAD)
		return st_diag_set(diag, -ST_E_PROTO,
				   "SEQ_RESIDENCY: operation %u unknown",
				   ret->op);
	if (ret->n == 0)
		return st_diag_set(diag, -ST_E_PROTO,
				   "SEQ_RESIDENCY: no sequences");
	if (ret->n > KV_PROTO_MAX_RESERVE)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "SEQ_RESIDENCY: %u sequences, at most %d "
				   "per request", ret->n, KV_PROTO_MAX_RESERVE);
	if (st_rbuf_left(&r) != (size_t)ret->n * 4)
		return st_diag_set(diag, -ST_E_PROTO,
				   "SEQ_RESIDENCY: %u sequences need %zu more "
				   "bytes, got %zu", ret->n,
				   (size_t)ret->n * 4, st_rbuf_left(&r));
	ret->seqs = malloc(sizeof(uint32_t) * ret->n);
	if (!ret->seqs)
		return -ENOMEM;
	for (uint32_t i = 0; i < ret->n; i++) {
		st_rbuf_u32(&r, &ret->seqs[i]);
		if (ret->seqs[i] == 0) {
			free(ret->seqs);
			ret->seqs = NULL;
			return st_diag_set(diag, -ST_E_PROTO,
					   "SEQ_RESIDENCY: entry %u: sequence "
					   "0 is never valid", i);
		}
	}
	return 0;
}

void kv_proto_encode_prefix_ahead(struct st_wbuf *w,
				  const struct kv_msg_prefix_ahead *m)
{
	uint32_t k = 0;

	st_wbuf_u32(w, m->n_chains);
	for (uint32_t c = 0; c < m->n_chains; c++) {
		st_wbuf_u32(w, m->chain_len[c]);
		for (uint32_t i = 0; i < m->chain_len[c]; i++)
			st_wbuf_u64(w, m->keys[k++]);
	}
}

void kv_msg_prefix_ahead_fini(struct kv_msg_prefix_ahead *m)
{
	free(m->chain_len);
	free(m->keys);
	memset(m, 0, sizeof(*m));
}

int kv_proto_decode_prefix_ahead(const uint8_t *p, size_t len,
				 struct kv_msg_prefix_ahead *ret,
				 struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t n;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &n))
		return short_payload("PREFIX_AHEAD", len, diag);
	if (n > KV_PROTO_MAX_AHEAD_KEYS)
		return st_diag_set(diag, -ST_E_LIMIT, "PREFIX_AHEAD: %u "
				   "chains, at most %d keys per request", n,
				   KV_PROTO_MAX_AHEAD_KEYS);
	/* each chain takes at least 12 bytes: n is bounded by len too */
	if (st_rbuf_left(&r) < (size_t)n * 12)
		return short_payload("PREFIX_AHEAD", len, diag);
	ret->chain_len = malloc(sizeof(uint32_t) * (n ? n : 1));
	ret->keys = malloc(sizeof(uint64_t) * (st_rbuf_left(&r) / 8 + 1));
	if (!ret->chain_len || !ret->keys) {
		kv_msg_prefix_ahead_fini(ret);
		return -ENOMEM;
	}
	for (uint32_t c = 0; c < n; c++) {
		uint32_t k;

		if (st_rbuf_u32(&r, &k) || k == 0 ||
		    st_rbuf_left(&r) < (size_t)k * 8) {
			kv_msg_prefix_ahead_fini(ret);
			return st_diag_set(diag, -ST_E_PROTO, "PREFIX_AHEAD: "
					   "chain %u of %u: %s", c, n,
					   k == 0 ? "no keys" :
					   "keys missing (payload too short)");
		}
		if (ret->n_keys + k > KV_PROTO_MAX_AHEAD_KEYS) {
			kv_msg_prefix_ahead_fini(ret);
			return st_diag_set(diag, -ST_E_LIMIT, "PREFIX_AHEAD: "
					   "more than %d keys",
					   KV_PROTO_MAX_AHEAD_KEYS);
		}
		ret->chain_len[c] = k;
		for (uint32_t i = 0; i < k; i++) {
			uint64_t key;

			st_rbuf_u64(&r, &key);
			if (key == 0) {
				kv_msg_prefix_ahead_fini(ret);
				return st_diag_set(diag, -ST_E_PROTO,
						   "PREFIX_AHEAD: chain %u: "
						   "key %u is 0 (never "
						   "valid)", c, i);
			}
			ret->keys[ret->n_keys++] = key;
		}
		ret->n_chains = c + 1;
	}
	if (st_rbuf_left(&r)) {
		size_t left = st_rbuf_left(&r);

		kv_msg_prefix_ahead_fini(ret);
		return st_diag_set(diag, -ST_E_PROTO, "PREFIX_AHEAD: %zu "
				   "bytes after the last chain", left);
	}
	return 0;
}

void kv_proto_encode_status_list(struct st_wbuf *w, uint32_t n,
				 const int32_t *status, const char *text)
{
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++)
		st_wbuf_i32(w, status[i]);
	if (text)
		kv_proto_encode_text(w, text);
}

int kv_proto_decode_status_list(const uint8_t *p, size_t len, uint32_t n,
				int32_t *ret_status, struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t got;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &got) || got != n ||
	    st_rbuf_left(&r) < (size_t)n * 4)
		return -ST_E_PROTO;
	for (uint32_t i = 0; i < n; i++) {
		st_rbuf_i32(&r, &ret_status[i]);
		if (ret_status[i] > 0)
			return -ST_E_PROTO;
	}
	if (st_rbuf_left(&r) == 0)
		return 0;
	return kv_proto_decode_text(p + 4 + (size_t)n * 4,
				    st_rbuf_left(&r), diag);
}

void kv_proto_encode_u32(struct st_wbuf *w, uint32_t v)
{
	st_wbuf_u32(w, v);
}

int kv_proto_decode_u32(const uint8_t *p, size_t len, uint32_t *ret)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, ret) || st_rbuf_left(&r))
		return -ST_E_PROTO;
	return 0;
}

int kv_proto_decode_empty(const uint8_t *p, size_t len, struct st_diag *diag)
{
	(void)p;
	if (len)
		return st_diag_set(diag, -ST_E_PROTO,
				   "payload of %zu bytes where none is "
				   "expected", len);
	return 0;
}

void kv_proto_encode_text(struct st_wbuf *w, const char *text)
{
	size_t n = text ? strnlen(text, KV_PROTO_MAX_TEXT) : 0;

	st_wbuf_u32(w, (uint32_t)n);
	st_wbuf_bytes(w, text, n);
}

int kv_proto_decode_text(const uint8_t *p, size_t len, struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t n;

	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &n) || n > KV_PROTO_MAX_TEXT ||
	    st_rbuf_left(&r) != n)
		return -ST_E_PROTO;
	if (diag) {
		size_t m = ST_MIN((size_t)n, sizeof(diag->msg) - 1);

		for (size_t i = 0; i < m; i++) {
			unsigned char c = p[4 + i];

			diag->msg[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
		}
		diag->msg[m] = 0;
	}
	return 0;
}

void kv_proto_salvage_header(const void *buf, size_t len,
			     struct st_msg_header *h)
{
	struct st_rbuf r;

	memset(h, 0, sizeof(*h));
	if (!buf)
		return;
	st_rbuf_init(&r, buf, len);
	st_rbuf_u32(&r, &h->magic);
	st_rbuf_u16(&r, &h->version);
	st_rbuf_u16(&r, &h->type);
	st_rbuf_u64(&r, &h->request_id);
	st_rbuf_u32(&r, &h->client_id);
	/* A reply to a reply would confuse the peer: strip the bit. */
	h->type &= (uint16_t)~ST_MSG_REPLY;
}

/* ---- layout ------------------------------------------------------------ */

static int add_region(uint64_t *off, uint64_t count, uint64_t size,
		      uint64_t align, uint64_t *ret_start)
{
	uint64_t bytes;

	if (__builtin_mul_overflow(count, size, &bytes))
		return -ST_E_LIMIT;
	*ret_start = ST_ALIGN_UP(*off, align);
	if (__builtin_add_overflow(*ret_start, bytes, off))
		return -ST_E_LIMIT;
	return 0;
}

int kv_layout_compute(const struct kv_stream_decl *streams, uint32_t n_streams,
		      uint32_t page_rows, uint64_t budget_bytes,
		      uint32_t max_seqs, uint32_t max_rows_per_seq,
		      struct kv_layout *l, struct st_diag *diag)
{
	return kv_layout_compute_spill(streams, n_streams, page_rows,
				       budget_bytes, 0, max_seqs,
				       max_rows_per_seq, l, diag);
}

int kv_layout_compute_spill(const struct kv_stream_decl *streams,
			    uint32_t n_streams, uint32_t page_rows,
			    uint64_t budget_bytes, uint64_t spill_budget_bytes,
			    uint32_t max_seqs, uint32_t max_rows_per_seq,
			    struct kv_layout *l, struct st_diag *diag)
{
	uint64_t off, max_row = 0, max_page = 0, page_bytes, n_pages;
	uint64_t table_entries;
	uint64_t slot_bytes, n_slots;
	char b1[32], b2[32];

	memset(l, 0, sizeof(*l));
	if (n_streams == 0 || n_streams > KV_MAX_STREAMS)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%u KV streams declared, must be 1..%d",
				   n_streams, KV_MAX_STREAMS);
	if (page_rows == 0 || page_rows > KV_MAX_PAGE_ROWS)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "page_rows %u, must be 1..%u", page_rows,
				   KV_MAX_PAGE_ROWS);
	for (uint32_t i = 0; i < n_streams; i++) {
		const struct kv_stream_decl *s = &streams[i];

		if (s->row_bytes == 0 || s->row_bytes > KV_MAX_ROW_BYTES)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "KV stream %u: row_bytes %u, must "
					   "be 1..%u", i, s->row_bytes,
					   KV_MAX_ROW_BYTES);
		if (s->tokens_per_row == 0 ||
		    s->tokens_per_row > KV_MAX_TOKENS_PER_ROW)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "KV stream %u: %u tokens per row, "
					   "must be 1..%u", i,
					   s->tokens_per_row,
					   KV_MAX_TOKENS_PER_ROW);
		if (s->window_rows && s->tokens_per_row != 1)
			return st_diag_set(diag, -ST_E_UNSUPPORTED,
					   "KV stream %u: a window of %u rows "
					   "of %u tokens each; windows are "
					   "supported on streams of one row "
					   "per token only", i, s->window_rows,
					   s->tokens_per_row);
		if (s->flags != 0)
			return st_diag_set(diag, -ST_E_UNSUPPORTED,
					   "KV stream %u: flags 0x%x (state "
					   "streams) are not supported yet", i,
					   s->flags);
		max_row = ST_MAX(max_row, (uint64_t)s->row_bytes);
		max_page = ST_MAX(max_page,
				  (uint64_t)s->row_bytes *
					  kv_stream_page_capacity(s, page_rows));
	}
	if (max_seqs == 0 || max_seqs > KV_MAX_SEQS)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "max_seqs %u, must be 1..%u", max_seqs,
				   KV_MAX_SEQS);
	if (max_rows_per_seq == 0 || max_rows_per_seq > KV_MAX_ROWS_PER_SEQ)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "max_rows_per_seq %u, must be 1..%u",
				   max_rows_per_seq, KV_MAX_ROWS_PER_SEQ);
	page_bytes = ST_ALIGN_UP(max_page, (uint64_t)KV_PAGE_ALIGN);
	if (page_bytes > KV_MAX_PAGE_BYTES)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "a page of %u rows of %llu bytes is %llu "
				   "bytes, over the limit of %llu; use fewer "
				   "rows per page", page_rows,
				   (unsigned long long)max_row,
				   (unsigned long long)page_bytes,
				   (unsigned long long)KV_MAX_PAGE_BYTES);
	n_pages = ST_MIN(budget_bytes / page_bytes, (uint64_t)KV_MAX_PAGES);
	if (n_pages < n_streams)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "KV budget %s holds %llu pages of %llu "
				   "bytes; %u streams need at least one page "
				   "each: raise kvd --budget (strata: --kv-budget) to at "
				   "least %llu bytes (%s)",
				   st_format_bytes(budget_bytes, b1, sizeof(b1)),
				   (unsigned long long)n_pages,
				   (unsigned long long)page_bytes, n_streams,
				   (unsigned long long)(page_bytes * n_streams),
				   st_format_bytes(page_bytes * n_streams, b2,
						   sizeof(b2)));
	slot_bytes = ST_ALIGN_UP(page_bytes, (uint64_t)KV_SLOT_ALIGN);
	n_slots = ST_MIN(spill_budget_bytes / slot_bytes,
			 (uint64_t)KV_MAX_SLOTS);
	if (spill_budget_bytes && n_slots < n_streams)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "spill budget %s holds %llu slots of %llu "
				   "bytes; %u streams need at least one each: "
				   "raise kvd --spill-budget to at least %llu "
				   "bytes or set it to 0 (no spilling)",
				   st_format_bytes(spill_budget_bytes, b1,
						   sizeof(b1)),
				   (unsigned long long)n_slots,
				   (unsigned long long)slot_bytes, n_streams,
				   (unsigned long long)(slot_bytes * n_streams));
	l->spill_budget_bytes = spill_budget_bytes;
	l->slot_bytes = slot_bytes;
	l->n_slots = n_slots;
	l->n_streams = n_streams;
	l->page_rows = page_rows;
	l->max_seqs = max_seqs;
	l->max_rows_per_seq = max_rows_per_seq;
	l->max_pages_per_seq = (uint32_t)ST_MIN(
		(uint64_t)kv_pages_for_rows(max_rows_per_seq, page_rows),
		n_pages / n_streams);
	l->max_row_bytes = (uint32_t)max_row;
	l->page_bytes = page_bytes;
	l->n_pages = n_pages;
	l->budget_bytes = budget_bytes;
	l->streams_off = KV_POOL_STREAMS_OFF;
	off = KV_POOL_STREAMS_OFF + (uint64_t)n_streams *
					    sizeof(struct kv_stream_decl);
	table_entries = (uint64_t)max_seqs * n_streams;
	if (add_region(&off, n_pages, sizeof(struct kv_page_meta),
		       KV_PAGE_ALIGN, &l->pages_off) ||
	    add_region(&off, max_seqs, sizeof(struct kv_seq_entry),
		       KV_PAGE_ALIGN, &l->seqs_off) ||
	    __builtin_mul_overflow(table_entries, l->max_pages_per_seq,
				   &table_entries) ||
	    add_region(&off, table_entries, sizeof(uint32_t), KV_PAGE_ALIGN,
		       &l->table_off) ||
	    add_region(&off, n_slots, sizeof(struct kv_spill_slot),
		       KV_PAGE_ALIGN, &l->slots_off) ||
	    add_region(&off, n_pages, page_bytes,
		       st_shm_region_align(n_pages * page_bytes), &l->data_off) ||
	    off > (1ull << 46))
		return st_diag_set(diag, -ST_E_LIMIT,
				   "KV pool metadata too large (%llu "
				   "sequences x %u streams x %u pages); lower "
				   "--max-seqs or --max-rows-per-seq",
				   (unsigned long long)max_seqs, n_streams,
				   l->max_pages_per_seq);
	l->total_bytes = st_shm_round(off);
	return 0;
}

int kv_prefix_keys(const int32_t *ids, uint32_t page_rows, uint64_t model_id,
		   uint32_t n_pages, uint64_t *ret_keys)
{
	size_t n = 8 + (size_t)page_rows * 4 + 8;
	uint8_t *buf;
	uint64_t parent = 0;

	if (n_pages == 0)
		return 0;
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0; i < n_pages; i++) {
		const int32_t *pid = ids + (size_t)i * page_rows;
		uint8_t *q = buf;

		/* explicit little-endian bytes: the key does not depend on
		 * the host's byte order */
		for (int b = 0; b < 8; b++)
			*q++ = (uint8_t)(parent >> (8 * b));
		for (uint32_t j = 0; j < page_rows; j++) {
			uint32_t v = (uint32_t)pid[j];

			*q++ = (uint8_t)v;
			*q++ = (uint8_t)(v >> 8);
			*q++ = (uint8_t)(v >> 16);
			*q++ = (uint8_t)(v >> 24);
		}
		for (int b = 0; b < 8; b++)
			*q++ = (uint8_t)(model_id >> (8 * b));
		parent = st_xxh3(buf, n);
		if (parent == 0)
			parent = 1;
		ret_keys[i] = parent;
	}
	free(buf);
	return 0;
}

uint64_t kv_layout_hash(const struct kv_layout *l,
			const struct kv_stream_decl *streams)
{
	uint8_t buf[sizeof(*l) + KV_MAX_STREAMS * sizeof(*streams)];
	uint32_t n = ST_MIN(l->n_streams, (uint32_t)KV_MAX_STREAMS);
	uint64_t h;

	memcpy(buf, l, sizeof(*l));
	memcpy(buf + sizeof(*l), streams, n * sizeof(*streams));
	h = st_xxh3(buf, sizeof(*l) + n * sizeof(*streams));
	return h ? h : 1; /* 0 means "skip the check" to st_shm_attach */
}

int kv_layout_read(const void *base, size_t size, uint64_t layout_hash,
		   struct kv_layout *ret, struct kv_stream_decl *streams,
		   struct st_diag *diag)
{
	const struct kv_pool_info *info;
	struct kv_layout l, c;
	struct st_diag sub;
	int r;

	if (size < KV_POOL_STREAMS_OFF)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: segment of %zu bytes has no pool "
				   "header", size);
	info = (const struct kv_pool_info *)((const uint8_t *)base +
					     KV_POOL_INFO_OFF);
	memcpy(&l, &info->layout, sizeof(l));
	if (l.n_streams == 0 || l.n_streams > KV_MAX_STREAMS ||
	    size < KV_POOL_STREAMS_OFF + l.n_streams * sizeof(*streams))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: %u streams recorded (segment of "
				   "%zu bytes)", l.n_streams, size);
	memcpy(streams, (const uint8_t *)base + KV_POOL_STREAMS_OFF,
	       l.n_streams * sizeof(*streams));
	r = kv_layout_compute_spill(streams, l.n_streams, l.page_rows,
				    l.budget_bytes, l.spill_budget_bytes,
				    l.max_seqs, l.max_rows_per_seq, &c, &sub);
	if (r < 0)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: recorded declaration is invalid: "
				   "%s", sub.msg);
	if (memcmp(&c, &l, sizeof(l)))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: recorded layout does not match "
				   "its declaration");
	if (l.total_bytes > size)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: layout needs %llu bytes, segment "
				   "has %zu", (unsigned long long)l.total_bytes,
				   size);
	if (layout_hash && kv_layout_hash(&l, streams) != layout_hash)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "kv pool: layout hash differs from the "
				   "segment header's");
	*ret = l;
	return 0;
}

int kv_decl_equal(uint32_t n_a, const struct kv_stream_decl *a,
		  uint32_t page_rows_a, uint32_t n_b,
		  const struct kv_stream_decl *b, uint32_t page_rows_b)
{
	if (n_a != n_b || page_rows_a != page_rows_b)
		return 0;
	for (uint32_t i = 0; i < n_a; i++)
		if (a[i].row_bytes != b[i].row_bytes ||
		    a[i].tokens_per_row != b[i].tokens_per_row ||
		    a[i].window_rows != b[i].window_rows ||
		    a[i].flags != b[i].flags)
			return 0;
	return 1;
}
