/*
 * es_client_engram.c — the client side of expertd's Engram tier
 * (es_client.h, es_engram_proto.h): ENGRAM_OPEN once, then for each FETCH
 * a message with the row ids and a wait for the client slot's done_seq,
 * and the rows read from this client's region of the "engram" segment.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "es_client_int.h"
#include "es_engram_proto.h"
#include "st_engram_file.h"
#include "st_shm.h"
#include "st_util.h"

struct es_client_engram {
	struct st_shm shm;
	const struct es_engram_shm *hdr;
	const uint8_t *region;
	uint32_t region_idx, max_rows;
	uint64_t seq;
	pthread_mutex_t mu;   /* one FETCH at a time (the region is reused) */
};

void es_client_engram_fini(struct es_client_engram *g)
{
	if (!g)
		return;
	st_shm_detach(&g->shm);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

/* The handle's Engram state, opened on first use. */
static int attach(struct es_client *c, struct es_client_engram **ret,
		  struct st_diag *diag)
{
	struct es_client_engram **slot = es_client_engram_ptr(c), *g;
	struct es_engram_open_rep rep;
	struct st_wbuf w;
	const uint8_t *p;
	void *buf = NULL;
	size_t len = 0;
	int r;

	if (*slot) {
		*ret = *slot;
		return 0;
	}
	st_wbuf_init(&w);
	st_wbuf_u32(&w, (uint32_t)getpid());
	r = w.err ? w.err : es_client_rpc(c, ES_MSG_ENGRAM_OPEN, &w, &buf, &p,
					  &len, diag);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	r = es_engram_open_rep_decode(p, len, &rep, diag);
	free(buf);
	if (r < 0)
		return r;
	g = calloc(1, sizeof(*g));
	if (!g)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	r = st_shm_attach(&g->shm, es_client_instance(c), ES_ENGRAM_SHM_KIND,
			  ES_ENGRAM_SHM_LAYOUT, 0, diag);
	if (r < 0) {
		free(g);
		return r;
	}
	g->hdr = (const struct es_engram_shm *)((const uint8_t *)g->shm.base +
						ES_ENGRAM_SHM_OFFSET);
	if (g->shm.size < ES_ENGRAM_SHM_OFFSET + sizeof(*g->hdr) ||
	    rep.region_offset + rep.region_bytes > g->shm.size ||
	    g->hdr->n_layers != rep.n_layers ||
	    g->hdr->n_layers > ES_ENGRAM_MAX_LAYERS ||
	    (uint64_t)rep.max_rows * g->hdr->row_bytes_max > rep.region_bytes) {
		st_shm_detach(&g->shm);
		free(g);
		return st_diag_set(diag, -ST_E_FORMAT, "the Engram segment of "
				   "instance %s does not match expertd's "
				   "ENGRAM_OPEN reply", es_client_instance(c));
	}
	g->region = (const uint8_t *)g->shm.base + rep.region_offset;
	g->region_idx = rep.region;
	g->max_rows = rep.max_rows;
	/* continue after what an earlier handle of this slot finished */
	g->seq = atomic_load(&((struct es_engram_shm *)g->hdr)->slot[rep.region].done_seq);
	pthread_mutex_init(&g->mu, NULL);
	*slot = g;
	*ret = g;
	return 0;
}

int es_client_engram_info(struct es_client *c, struct es_engram_info *ret,
			  struct st_diag *diag)
{
	struct es_client_engram *g;
	int r = attach(c, &g, diag);

	if (r < 0)
		return r;
	memset(ret, 0, sizeof(*ret));
	ret->n_layers = (int)g->hdr->n_layers;
	for (int i = 0; i < ret->n_layers; i++) {
		ret->layer_id[i] = g->hdr->layer_id[i];
		ret->dim[i] = (int)g->hdr->dim[i];
		ret->rows[i] = g->hdr->rows[i];
		ret->row_bytes[i] = g->hdr->row_bytes[i];
	}
	ret->max_rows = (int)g->max_rows;
	ret->cache_rows = g->hdr->cache_rows;
	ret->cache_bytes = g->hdr->cache_bytes;
	ret->io_uring = g->hdr->io_engine == ES_ENGRAM_IO_URING;
	ret->direct = (int)g->hdr->direct;
	return 0;
}

static int check_args(const struct es_client_engram *g, int li, int n,
		      const int64_t *ids, struct st_diag *diag)
{
	if (li < 0 || (uint32_t)li >= g->hdr->n_layers || n < 1 || !ids)
		return st_diag_set(diag, -EINVAL, "Engram fetch: layer index "
				   "%d (of %u) or %d rows out of range", li,
				   g->hdr->n_layers, n);
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= g->hdr->rows[li])
			return st_diag_set(diag, -EINVAL, "Engram fetch: row "
					   "%lld outside layer %d's table [0, "
					   "%lld)", (long long)ids[i], li,
					   (long long)g->hdr->rows[li]);
	return 0;
}

/* Waits until the slot's done_seq is seq: spins a little, then sleeps in
 * 20 us steps, up to timeout_ms. */
static int wait_done(const struct es_client_engram *g, uint64_t seq,
		     int timeout_ms, struct st_diag *diag)
{
	struct es_engram_slot *s =
		(struct es_engram_slot *)&g->hdr->slot[g->region_idx];
	uint64_t deadline = st_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	int status;

	for (int spin = 0;; spin++) {
		if (atomic_load_explicit(&s->done_seq, memory_order_acquire) ==
		    seq)
			break;
		if (spin < 200) {
			sched_yield();
			continue;
		}
		if (st_now_ns() > deadline)
			return st_diag_set(diag, -ST_E_TIMEOUT, "expertd did not "
					   "deliver Engram rows within %d ms",
					   timeout_ms);
		st_sleep_ns(20000);
	}
	status = atomic_load_explicit(&s->status, memory_order_relaxed);
	if (status < 0)
		return st_diag_set(diag, status, "%s", s->msg);
	return 0;
}

/* One FETCH of n <= max_rows rows into dst (raw bytes) or out (floats). */
static int fetch_chunk(struct es_client *c, struct es_client_engram *g, int li,
		       int n, const int64_t *ids, uint8_t *dst, float *out,
		       struct st_diag *diag)
{
	uint32_t rb = g->hdr->row_bytes[li];
	int dim = (int)g->hdr->dim[li];
	struct st_wbuf w;
	uint64_t seq = ++g->seq;
	int r;

	st_wbuf_init(&w);
	es_engram_req_encode(&w, (uint32_t)getpid(), (uint32_t)li, (uint32_t)n,
			     0, seq, ids);
	r = w.err ? w.err : es_client_rpc(c, ES_MSG_ENGRAM, &w, NULL, NULL,
					  NULL, diag);
	st_wbuf_fini(&w);
	if (r == 0)
		r = wait_done(g, seq, es_client_timeout_ms(c), diag);
	if (r < 0)
		return r;
	for (int i = 0; i < n; i++) {
		const uint8_t *row = g->region + (size_t)i * rb;

		if (dst)
			memcpy(dst + (size_t)i * rb, row, rb);
		else
			st_engram_row_decode(row, dim, out + (size_t)i * dim);
	}
	return 0;
}

static int fetch(struct es_client *c, int li, int n, const int64_t *ids,
		 uint8_t *dst, float *out, struct st_diag *diag)
{
	struct es_client_engram *g;
	int r = attach(c, &g, diag);

	if (r < 0)
		return r;
	if ((r = check_args(g, li, n, ids, diag)))
		return r;
	pthread_mutex_lock(&g->mu);
	for (int i = 0; i < n && !r; i += (int)g->max_rows) {
		int m = ST_MIN(n - i, (int)g->max_rows);

		r = fetch_chunk(c, g, li, m, ids + i,
				dst ? dst + (size_t)i * g->hdr->row_bytes[li] : NULL,
				out ? out + (size_t)i * g->hdr->dim[li] : NULL,
				diag);
	}
	pthread_mutex_unlock(&g->mu);
	return r;
}

int es_client_engram_fetch(struct es_client *c, int li, int n,
			   const int64_t *row_ids, float *out,
			   struct st_diag *diag)
{
	return fetch(c, li, n, row_ids, NULL, out, diag);
}

int es_client_engram_fetch_raw(struct es_client *c, int li, int n,
			       const int64_t *row_ids, uint8_t *out,
			       struct st_diag *diag)
{
	return fetch(c, li, n, row_ids, out, NULL, diag);
}

int es_client_engram_prefetch(struct es_client *c, int li, int n,
			      const int64_t *row_ids, struct st_diag *diag)
{
	struct es_client_engram *g;
	int r = attach(c, &g, diag);

	if (r < 0)
		return r;
	if ((r = check_args(g, li, n, row_ids, diag)))
		return r;
	for (int i = 0; i < n && !r; i += ES_ENGRAM_MAX_PREFETCH) {
		int m = ST_MIN(n - i, ES_ENGRAM_MAX_PREFETCH);
		struct st_wbuf w;

		st_wbuf_init(&w);
		es_engram_req_encode(&w, (uint32_t)getpid(), (uint32_t)li,
				     (uint32_t)m, ES_ENGRAM_PREFETCH, 0,
				     row_ids + i);
		r = w.err ? w.err : es_client_rpc(c, ES_MSG_ENGRAM, &w, NULL,
						  NULL, NULL, diag);
		st_wbuf_fini(&w);
	}
	return r;
}

int es_client_engram_stats(struct es_client *c, struct es_engram_stats *ret,
			   struct st_diag *diag)
{
	struct es_client_engram *g;
	struct es_engram_shm *h;
	int r = attach(c, &g, diag);

	if (r < 0)
		return r;
	h = (struct es_engram_shm *)g->hdr;
	memset(ret, 0, sizeof(*ret));
	ret->lookups = atomic_load(&h->lookups);
	ret->hits = atomic_load(&h->hits);
	ret->merged = atomic_load(&h->merged);
	ret->misses = atomic_load(&h->misses);
	ret->prefetch_rows = atomic_load(&h->prefetch_rows);
	ret->reads = atomic_load(&h->reads);
	ret->read_bytes = atomic_load(&h->read_bytes);
	ret->read_errors = atomic_load(&h->read_errors);
	ret->rereads = atomic_load(&h->rereads);
	ret->evictions = atomic_load(&h->evictions);
	ret->cache_used = atomic_load(&h->cache_used);
	for (int b = 0; b < ES_ENGRAM_LAT_BUCKETS; b++)
		ret->lat_hist[b] = atomic_load(&h->lat_hist[b]);
	ret->lat_p50_ns = es_engram_lat_quantile(ret->lat_hist, 0.5);
	ret->lat_p99_ns = es_engram_lat_quantile(ret->lat_hist, 0.99);
	return 0;
}
