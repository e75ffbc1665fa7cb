/*
 * es_proto.c — expertd's wire payloads (es_proto.h) and the pool layout
 * arithmetic and validation (es_pool.h).  Part of the common library so
 * that expertd, its client library and tests share one definition.
 */
#include "es_proto.h"
#include "es_engram_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_util.h"

/* ------------------------------------------------------------------ */
/* pool layout                                                          */

/* a + b with overflow check into *out; 0 or -EINVAL. */
static int add_ok(uint64_t a, uint64_t b, uint64_t *out)
{
	if (a > UINT64_MAX - b)
		return -EINVAL;
	*out = a + b;
	return 0;
}

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
	if (a && b > UINT64_MAX / a)
		return -EINVAL;
	*out = a * b;
	return 0;
}

int es_pool_layout_compute(const struct es_pool_geom *g,
			   struct es_pool_layout *ret)
{
	struct {
		uint32_t version, n_layers, n_experts, n_slots, top_k, pad;
		uint64_t record_bytes, store_id;
	} id;
	uint64_t n_keys, idx_bytes, slot_bytes, end, data_bytes, total;

	memset(ret, 0, sizeof(*ret));
	if (!g->n_layers || !g->n_experts || !g->n_slots || !g->top_k ||
	    !g->record_bytes || g->record_bytes % 4096 ||
	    g->top_k > g->n_experts || g->n_layers > (1u << 20) ||
	    g->n_experts > (1u << 20))
		return -EINVAL;
	n_keys = (uint64_t)g->n_layers * g->n_experts;
	if (g->n_slots > n_keys || n_keys > INT32_MAX)
		return -EINVAL;
	ret->clients_offset = ES_POOL_HEADER_OFFSET + ES_POOL_HEADER_BYTES;
	ret->index_offset = ret->clients_offset +
			    ES_MAX_CLIENTS * sizeof(struct es_pool_client);
	idx_bytes = ST_ALIGN_UP(n_keys * 4, ES_POOL_TABLE_ALIGN);
	ret->slots_offset = ret->index_offset + idx_bytes;
	slot_bytes = (uint64_t)g->n_slots * sizeof(struct es_slot);
	end = ret->slots_offset + slot_bytes;
	if (mul_ok(g->n_slots, g->record_bytes, &data_bytes) < 0)
		return -EINVAL;
	ret->data_offset = ST_ALIGN_UP(end, st_shm_region_align(data_bytes));
	if (add_ok(ret->data_offset, data_bytes, &total) < 0 ||
	    total > UINT64_MAX - ST_SHM_ALIGN)
		return -EINVAL;
	ret->data_bytes = data_bytes;
	ret->total_bytes = st_shm_round(total);
	memset(&id, 0, sizeof(id));
	id.version = ES_POOL_LAYOUT_VERSION;
	id.n_layers = g->n_layers;
	id.n_experts = g->n_experts;
	id.n_slots = g->n_slots;
	id.top_k = g->top_k;
	id.record_bytes = g->record_bytes;
	id.store_id = g->store_id;
	ret->layout_hash = st_xxh3(&id, sizeof(id));
	if (!ret->layout_hash)
		ret->layout_hash = 1; /* 0 means "don't check" to st_shm_attach */
	return 0;
}

static void view_fill(void *base, const struct es_pool_header *h,
		      struct es_pool_view *v)
{
	uint8_t *b = base;

	v->shm = base;
	v->hdr = (struct es_pool_header *)(b + ES_POOL_HEADER_OFFSET);
	v->clients = (struct es_pool_client *)(b + h->clients_offset);
	v->slot_of = (_Atomic int32_t *)(b + h->index_offset);
	v->slots = (struct es_slot *)(b + h->slots_offset);
	v->data = b + h->data_offset;
	v->n_layers = h->n_layers;
	v->n_experts = h->n_experts;
	v->n_slots = h->n_slots;
	v->record_bytes = h->record_bytes;
}

int es_pool_format(void *base, size_t size, const struct es_pool_geom *g,
		   const struct es_pool_layout *l)
{
	struct es_pool_header *h =
		(struct es_pool_header *)((uint8_t *)base + ES_POOL_HEADER_OFFSET);
	struct es_pool_view v;

	if (size < l->total_bytes)
		return -EINVAL;
	h->n_layers = g->n_layers;
	h->n_experts = g->n_experts;
	h->n_slots = g->n_slots;
	h->top_k = g->top_k;
	h->record_bytes = g->record_bytes;
	h->store_id = g->store_id;
	h->budget_bytes = l->data_bytes;
	h->clients_offset = l->clients_offset;
	h->index_offset = l->index_offset;
	h->slots_offset = l->slots_offset;
	h->data_offset = l->data_offset;
	h->data_bytes = l->data_bytes;
	h->max_clients = ES_MAX_CLIENTS;
	h->slot_bytes = sizeof(struct es_slot);
	view_fill(base, h, &v);
	for (uint64_t i = 0; i < (uint64_t)g->n_layers * g->n_experts; i++)
		atomic_store(&v.slot_of[i], -1);
	for (uint32_t s = 0; s < g->n_slots; s++) {
		atomic_store(&v.slots[s].key, ES_KEY_NONE);
		atomic_store(&v.slots[s].state, ES_SLOT_EMPTY);
		atomic_store(&v.slots[s].gen, 1);
	}
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		atomic_store(&v.clients[c].generation, 1);
	/* Pool magic last: a reader that sees it sees formatted tables. */
	atomic_thread_fence(memory_order_release);
	h->magic = ES_POOL_MAGIC;
	return 0;
}

int es_pool_view_init(void *base, size_t size, uint64_t expect_store_id,
		      struct es_pool_view *ret, struct st_diag *diag)
{
	const struct es_pool_header *h;
	struct es_pool_geom g;
	struct es_pool_layout l;

	memset(ret, 0, sizeof(*ret));
	if (size < ES_POOL_HEADER_OFFSET + ES_POOL_HEADER_BYTES)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "expert pool: segment of %zu bytes is too "
				   "small for its header", size);
	h = (const struct es_pool_header *)((const uint8_t *)base +
					    ES_POOL_HEADER_OFFSET);
	atomic_thread_fence(memory_order_acquire);
	if (h->magic != ES_POOL_MAGIC)
		return st_diag_set(diag, -ST_E_BADMAGIC,
				   "expert pool: bad pool magic (segment not "
				   "formatted by expertd)");
	g.n_layers = h->n_layers;
	g.n_experts = h->n_experts;
	g.n_slots = h->n_slots;
	g.top_k = h->top_k;
	g.record_bytes = h->record_bytes;
	g.store_id = h->store_id;
	if (es_pool_layout_compute(&g, &l) < 0 ||
	    l.clients_offset != h->clients_offset ||
	    l.index_offset != h->index_offset ||
	    l.slots_offset != h->slots_offset ||
	    l.data_offset != h->data_offset ||
	    l.data_bytes != h->data_bytes || l.total_bytes != size ||
	    h->max_clients != ES_MAX_CLIENTS ||
	    h->slot_bytes != sizeof(struct es_slot))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "expert pool: geometry in the header "
				   "(%u layers x %u experts, %u slots of %llu "
				   "bytes) does not match its %zu-byte segment",
				   h->n_layers, h->n_experts, h->n_slots,
				   (unsigned long long)h->record_bytes, size);
	if (expect_store_id && h->store_id != expect_store_id)
		return st_diag_set(diag, -ST_E_STALE,
				   "expert pool holds store %016llx, expected "
				   "%016llx (expertd was restarted on another "
				   "store?)",
				   (unsigned long long)h->store_id,
				   (unsigned long long)expect_store_id);
	view_fill(base, h, ret);
	return 0;
}

/* ------------------------------------------------------------------ */
/* payloads                                                             */

static int name_ok(const char *name, size_t n)
{
	size_t i = 0;

	for (; i < n && name[i]; i++)
		if (name[i] < 0x20 || name[i] > 0x7e)
			return 0;
	for (; i < n; i++)
		if (name[i])
			return 0; /* padding must be NUL */
	return 1;
}

void es_hello_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t version,
			 const char *name, uint64_t start_ticks)
{
	char buf[ES_CLIENT_NAME_BYTES];
	size_t n = name ? strlen(name) : 0;

	memset(buf, 0, sizeof(buf));
	memcpy(buf, name ? name : "", ST_MIN(n, sizeof(buf)));
	st_wbuf_u32(w, pid);
	st_wbuf_u32(w, version);
	st_wbuf_bytes(w, buf, sizeof(buf));
	st_wbuf_u64(w, start_ticks);
}

void es_hello_req_encode_resume(struct st_wbuf *w, uint32_t pid,
				uint32_t version, const char *name,
				uint64_t start_ticks, uint32_t resume_id)
{
	es_hello_req_encode(w, pid, version, name, start_ticks);
	st_wbuf_u32(w, resume_id);
}

int es_hello_req_decode(const uint8_t *p, size_t len, struct es_hello_req *ret,
			struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	st_rbuf_init(&r, p, len);
	/* the version first: a client of another version is told so, not
	 * that its HELLO has another length */
	if (len >= 8) {
		st_rbuf_u32(&r, &ret->pid);
		st_rbuf_u32(&r, &ret->version);
		if (ret->version != ES_PROTO_VERSION)
			return st_diag_set(diag, -ST_E_VERSION,
					   "client speaks expertd protocol %u, "
					   "this expertd speaks %d; use "
					   "matching builds", ret->version,
					   ES_PROTO_VERSION);
	}
	if (len != ES_HELLO_REQ_BYTES && len != ES_HELLO_REQ_RESUME_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "HELLO payload is %zu bytes, expected %d "
				   "or %d", len, ES_HELLO_REQ_BYTES,
				   ES_HELLO_REQ_RESUME_BYTES);
	st_rbuf_bytes(&r, ret->name, ES_CLIENT_NAME_BYTES);
	st_rbuf_u64(&r, &ret->start_ticks);
	if (len == ES_HELLO_REQ_RESUME_BYTES)
		st_rbuf_u32(&r, &ret->resume_client_id);
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "HELLO: bad pid %u",
				   ret->pid);
	if (!name_ok(ret->name, ES_CLIENT_NAME_BYTES))
		return st_diag_set(diag, -ST_E_PROTO,
				   "HELLO: client name must be printable ASCII, "
				   "NUL-padded");
	return 0;
}

void es_hello_rep_encode(struct st_wbuf *w, const struct es_hello_rep *r)
{
	st_wbuf_u32(w, r->client_id);
	st_wbuf_u64(w, r->epoch);
	st_wbuf_u64(w, r->pool_id);
	st_wbuf_u32(w, r->pid);
	st_wbuf_u32(w, r->pool_layout);
	st_wbuf_u64(w, r->store_id);
	st_wbuf_u64(w, r->layout_hash);
	st_wbuf_u32(w, r->n_layers);
	st_wbuf_u32(w, r->n_experts);
	st_wbuf_u32(w, r->n_slots);
	st_wbuf_u32(w, r->top_k);
	st_wbuf_u64(w, r->record_bytes);
}

int es_hello_rep_decode(const uint8_t *p, size_t len, struct es_hello_rep *ret,
			struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	if (len != ES_HELLO_REP_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "HELLO reply is %zu bytes, expected %d", len,
				   ES_HELLO_REP_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &ret->client_id);
	st_rbuf_u64(&r, &ret->epoch);
	st_rbuf_u64(&r, &ret->pool_id);
	st_rbuf_u32(&r, &ret->pid);
	st_rbuf_u32(&r, &ret->pool_layout);
	st_rbuf_u64(&r, &ret->store_id);
	st_rbuf_u64(&r, &ret->layout_hash);
	st_rbuf_u32(&r, &ret->n_layers);
	st_rbuf_u32(&r, &ret->n_experts);
	st_rbuf_u32(&r, &ret->n_slots);
	st_rbuf_u32(&r, &ret->top_k);
	st_rbuf_u64(&r, &ret->record_bytes);
	if (!ret->client_id || es_client_id_index(ret->client_id) >=
				       ES_MAX_CLIENTS ||
	    !ret->n_layers || !ret->n_experts || !ret->n_slots ||
	    (uint64_t)ret->n_slots > (uint64_t)ret->n_layers * ret->n_experts ||
	    !ret->record_bytes || ret->record_bytes % 4096 || !ret->pid ||
	    ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO,
				   "HELLO reply: inconsistent fields");
	return 0;
}

void es_ping_rep_encode(struct st_wbuf *w, const struct es_ping_rep *r)
{
	st_wbuf_u32(w, r->pid);
	st_wbuf_u64(w, r->epoch);
	st_wbuf_u32(w, r->ready);
}

int es_ping_rep_decode(const uint8_t *p, size_t len, struct es_ping_rep *ret,
		       struct st_diag *diag)
{
	struct st_rbuf r;

	if (len != ES_PING_REP_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "PING reply is %zu bytes, expected %d", len,
				   ES_PING_REP_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &ret->pid);
	st_rbuf_u64(&r, &ret->epoch);
	st_rbuf_u32(&r, &ret->ready);
	return 0;
}

void es_stats_rep_encode(struct st_wbuf *w, const struct es_stats_rep *r)
{
	st_wbuf_u64(w, r->n_slots);
	st_wbuf_u64(w, r->slots_used);
	st_wbuf_u64(w, r->record_bytes);
	st_wbuf_u64(w, r->pool_bytes);
	st_wbuf_u64(w, r->budget_bytes);
	st_wbuf_u64(w, r->hits);
	st_wbuf_u64(w, r->misses);
	st_wbuf_u64(w, r->evictions);
	st_wbuf_u64(w, r->loads);
	st_wbuf_u64(w, r->load_bytes);
	st_wbuf_u64(w, r->load_ns);
	st_wbuf_u64(w, r->checksum_failures);
	st_wbuf_u64(w, r->epoch);
	st_wbuf_i32(w, r->pid);
	st_wbuf_u32(w, r->n_clients);
}

int es_stats_rep_decode(const uint8_t *p, size_t len, struct es_stats_rep *ret,
			struct st_diag *diag)
{
	struct st_rbuf r;

	if (len != ES_STATS_REP_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "STATS reply is %zu bytes, expected %d", len,
				   ES_STATS_REP_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u64(&r, &ret->n_slots);
	st_rbuf_u64(&r, &ret->slots_used);
	st_rbuf_u64(&r, &ret->record_bytes);
	st_rbuf_u64(&r, &ret->pool_bytes);
	st_rbuf_u64(&r, &ret->budget_bytes);
	st_rbuf_u64(&r, &ret->hits);
	st_rbuf_u64(&r, &ret->misses);
	st_rbuf_u64(&r, &ret->evictions);
	st_rbuf_u64(&r, &ret->loads);
	st_rbuf_u64(&r, &ret->load_bytes);
	st_rbuf_u64(&r, &ret->load_ns);
	st_rbuf_u64(&r, &ret->checksum_failures);
	st_rbuf_u64(&r, &ret->epoch);
	st_rbuf_i32(&r, &ret->pid);
	st_rbuf_u32(&r, &ret->n_clients);
	return 0;
}

void es_acquire_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t layer,
			   uint32_t n, const int *experts)
{
	st_wbuf_u32(w, pid);
	st_wbuf_u32(w, layer);
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++)
		st_wbuf_u32(w, (uint32_t)experts[i]);
}

uint32_t es_acquire_req_expert(const struct es_acquire_req *r, uint32_t i)
{
	const uint8_t *b = r->experts_le + 4 * (size_t)i;

	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

int es_acquire_req_decode(const uint8_t *p, size_t len,
			  const struct es_acquire_limits *lim,
			  struct es_acquire_req *ret, struct st_diag *diag)
{
	struct st_rbuf r;
	uint8_t seen_small[1024];
	uint8_t *seen = seen_small;
	int rc = 0;

	memset(ret, 0, sizeof(*ret));
	if (len < 12)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE payload is %zu bytes, shorter than "
				   "its 12-byte head", len);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &ret->pid);
	st_rbuf_u32(&r, &ret->layer);
	st_rbuf_u32(&r, &ret->n);
	if (ret->n == 0 || ret->n > ES_ACQUIRE_MAX_N ||
	    len != 12 + 4 * (size_t)ret->n)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE/RELEASE: n = %u experts but "
				   "payload of %zu bytes (expected 12 + 4n)",
				   ret->n, len);
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE/RELEASE: bad pid %u", ret->pid);
	if (ret->layer >= lim->n_layers)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE/RELEASE: layer %u out of range "
				   "(the model has %u layers)",
				   ret->layer, lim->n_layers);
	if (ret->n > lim->n_slots)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE/RELEASE: %u experts in one request, "
				   "the pool has only %u slots",
				   ret->n, lim->n_slots);
	ret->experts_le = p + 12;
	if (lim->n_experts > sizeof(seen_small)) {
		seen = calloc(lim->n_experts, 1);
		if (!seen)
			return -ENOMEM;
	} else {
		memset(seen, 0, lim->n_experts);
	}
	for (uint32_t i = 0; i < ret->n; i++) {
		uint32_t e = es_acquire_req_expert(ret, i);

		if (e >= lim->n_experts) {
			rc = st_diag_set(diag, -ST_E_PROTO,
					 "ACQUIRE/RELEASE: expert %u out of "
					 "range (layer %u has %u experts)",
					 e, ret->layer, lim->n_experts);
			break;
		}
		if (seen[e]) {
			rc = st_diag_set(diag, -ST_E_PROTO,
					 "ACQUIRE/RELEASE: expert %u listed "
					 "twice; ids must be distinct", e);
			break;
		}
		seen[e] = 1;
	}
	if (seen != seen_small)
		free(seen);
	return rc;
}

void es_acquire_rep_encode(struct st_wbuf *w, uint32_t n,
			   const struct es_acquire_ent *ents)
{
	st_wbuf_u32(w, n);
	for (uint32_t i = 0; i < n; i++) {
		st_wbuf_i32(w, ents[i].status);
		st_wbuf_u32(w, ents[i].slot);
		st_wbuf_u32(w, ents[i].gen);
	}
}

int es_acquire_rep_decode(const uint8_t *p, size_t len, uint32_t n,
			  uint32_t n_slots, struct es_acquire_ent *ents,
			  struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t got;

	if (len != 4 + 12 * (size_t)n)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE reply is %zu bytes, expected %zu",
				   len, 4 + 12 * (size_t)n);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &got);
	if (got != n)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ACQUIRE reply has %u entries, asked %u",
				   got, n);
	for (uint32_t i = 0; i < n; i++) {
		st_rbuf_i32(&r, &ents[i].status);
		st_rbuf_u32(&r, &ents[i].slot);
		st_rbuf_u32(&r, &ents[i].gen);
		if ((ents[i].status != ES_ACQ_READY &&
		     ents[i].status != ES_ACQ_PENDING) ||
		    ents[i].slot >= n_slots)
			return st_diag_set(diag, -ST_E_PROTO,
					   "ACQUIRE reply entry %u: status %d "
					   "slot %u invalid", i,
					   ents[i].status, ents[i].slot);
	}
	return 0;
}

void es_error_encode(struct st_wbuf *w, const char *msg)
{
	size_t n = msg ? strlen(msg) : 0;

	if (n > ES_ERROR_MAX_BYTES)
		n = ES_ERROR_MAX_BYTES;
	st_wbuf_u32(w, (uint32_t)n);
	st_wbuf_bytes(w, msg ? msg : "", n);
}

int es_error_decode(const uint8_t *p, size_t len, char *buf, size_t buf_len)
{
	struct st_rbuf r;
	uint32_t n;
	size_t k;

	if (buf_len)
		buf[0] = 0;
	if (len == 0)
		return 0;
	st_rbuf_init(&r, p, len);
	if (st_rbuf_u32(&r, &n) < 0 || n != len - 4 || n > ES_ERROR_MAX_BYTES)
		return -ST_E_PROTO;
	if (!buf_len)
		return 0;
	k = ST_MIN((size_t)n, buf_len - 1);
	for (size_t i = 0; i < k; i++) {
		char ch = (char)p[4 + i];

		buf[i] = (ch >= 0x20 && ch <= 0x7e) ? ch : '?';
	}
	buf[k] = 0;
	return 0;
}

void es_event_encode(struct st_wbuf *w, uint32_t pid, uint64_t epoch)
{
	st_wbuf_u32(w, pid);
	st_wbuf_u64(w, epoch);
}

int es_event_decode(const uint8_t *p, size_t len, uint32_t *ret_pid,
		    uint64_t *ret_epoch)
{
	struct st_rbuf r;

	if (len != 12)
		return -ST_E_PROTO;
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, ret_pid);
	st_rbuf_u64(&r, ret_epoch);
	return 0;
}

const char *es_proto_type_name(uint16_t type)
{
	switch (type & ~ST_MSG_REPLY) {
	case ES_MSG_ACQUIRE: return "ACQUIRE";
	case ES_MSG_RELEASE: return "RELEASE";
	case ES_MSG_ROUTE: return "ROUTE";
	case ES_MSG_ENGRAM_OPEN: return "ENGRAM_OPEN";
	case ES_MSG_ENGRAM: return "ENGRAM";
	case ES_EVT_READY: return "EVT_READY";
	case ES_EVT_EPOCH: return "EVT_EPOCH";
	case ES_EVT_SHUTDOWN: return "EVT_SHUTDOWN";
	default: return st_proto_type_name(type);
	}
}

/* ---- ROUTE: routing report and prefetch hint ---- */

static uint32_t le32_at(const uint8_t *b)
{
	return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	       (uint32_t)b[3] << 24;
}

void es_route_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t layer,
			 uint32_t pos, uint32_t n_tokens, uint32_t k,
			 const int *experts, uint32_t n_hint,
			 const int *hint_layer, const int *hint_expert)
{
	st_wbuf_u32(w, pid);
	st_wbuf_u32(w, layer);
	st_wbuf_u32(w, pos);
	st_wbuf_u32(w, n_tokens);
	st_wbuf_u32(w, k);
	st_wbuf_u32(w, n_hint);
	for (uint64_t i = 0; i < (uint64_t)n_tokens * k; i++)
		st_wbuf_u32(w, (uint32_t)experts[i]);
	for (uint32_t i = 0; i < n_hint; i++) {
		st_wbuf_u32(w, (uint32_t)hint_layer[i]);
		st_wbuf_u32(w, (uint32_t)hint_expert[i]);
	}
}

void es_route_req_encode_hint_pos(struct st_wbuf *w, uint32_t hint_pos)
{
	st_wbuf_u32(w, hint_pos);
}

uint32_t es_route_req_expert(const struct es_route_req *r, uint32_t i)
{
	return le32_at(r->experts_le + 4 * (size_t)i);
}

void es_route_req_hint(const struct es_route_req *r, uint32_t i,
		       uint32_t *ret_layer, uint32_t *ret_expert)
{
	*ret_layer = le32_at(r->hints_le + 8 * (size_t)i);
	*ret_expert = le32_at(r->hints_le + 8 * (size_t)i + 4);
}

int es_route_req_decode(const uint8_t *p, size_t len,
			const struct es_acquire_limits *lim,
			struct es_route_req *ret, struct st_diag *diag)
{
	struct st_rbuf r;
	uint64_t n_sel, base;

	memset(ret, 0, sizeof(*ret));
	if (len < 24)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE payload is %zu "
				   "bytes, shorter than its 24-byte head", len);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &ret->pid);
	st_rbuf_u32(&r, &ret->layer);
	st_rbuf_u32(&r, &ret->pos);
	st_rbuf_u32(&r, &ret->n_tokens);
	st_rbuf_u32(&r, &ret->k);
	st_rbuf_u32(&r, &ret->n_hint);
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE: bad pid %u",
				   ret->pid);
	if (ret->layer >= lim->n_layers)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE: layer %u out of "
				   "range (the model has %u layers)",
				   ret->layer, lim->n_layers);
	if (ret->k > ES_ROUTE_MAX_K || ret->n_hint > ES_ROUTE_MAX_HINT)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE: k = %u (max %d) "
				   "or %u hints (max %d)", ret->k,
				   ES_ROUTE_MAX_K, ret->n_hint,
				   ES_ROUTE_MAX_HINT);
	n_sel = (uint64_t)ret->n_tokens * ret->k;
	if (n_sel > ST_MSG_MAX_BYTES)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE: %u tokens x %u "
				   "experts do not fit a message",
				   ret->n_tokens, ret->k);
	base = 24 + 4 * n_sel + 8 * (uint64_t)ret->n_hint;
	if (len != base && len != base + 4)
		return st_diag_set(diag, -ST_E_PROTO, "ROUTE: %u tokens x %u "
				   "experts and %u hints but a payload of %zu "
				   "bytes (expected 24 + 4 n k + 8 hints, "
				   "+ 4 with hint_pos)",
				   ret->n_tokens, ret->k, ret->n_hint, len);
	if (len == base + 4) {
		ret->has_hint_pos = 1;
		ret->hint_pos = le32_at(p + base);
		if (ret->hint_pos < ret->pos)
			return st_diag_set(diag, -ST_E_PROTO, "ROUTE: hints "
					   "for position %u, before the "
					   "report's position %u (a hint "
					   "names the same or a later token)",
					   ret->hint_pos, ret->pos);
	}
	ret->experts_le = p + 24;
	ret->hints_le = p + 24 + 4 * n_sel;
	for (uint64_t i = 0; i < n_sel; i++)
		if (es_route_req_expert(ret, (uint32_t)i) >= lim->n_experts)
			return st_diag_set(diag, -ST_E_PROTO, "ROUTE: expert "
					   "%u out of range (%u experts)",
					   es_route_req_expert(ret, (uint32_t)i),
					   lim->n_experts);
	for (uint32_t i = 0; i < ret->n_hint; i++) {
		uint32_t l, e;

		es_route_req_hint(ret, i, &l, &e);
		if (l >= lim->n_layers || e >= lim->n_experts)
			return st_diag_set(diag, -ST_E_PROTO, "ROUTE: hint %u "
					   "names layer %u expert %u, out of "
					   "range (%u layers, %u experts)", i,
					   l, e, lim->n_layers, lim->n_experts);
	}
	return 0;
}
