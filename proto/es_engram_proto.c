/*
 * es_engram_proto.c — Engram tier payloads and latency histogram (see
 * es_engram_proto.h).
 */
#include "es_engram_proto.h"

#include <string.h>

int es_engram_lat_bucket(uint64_t ns)
{
	int lg, sub, b;

	if (ns < (1ull << ES_ENGRAM_LAT_MIN_LOG2))
		return 0;
	lg = 63 - __builtin_clzll(ns);
	sub = (int)((ns >> (lg - 3)) & 7);
	b = (lg - ES_ENGRAM_LAT_MIN_LOG2) * 8 + sub;
	return b >= ES_ENGRAM_LAT_BUCKETS ? ES_ENGRAM_LAT_BUCKETS - 1 : b;
}

uint64_t es_engram_lat_bucket_lo(int b)
{
	int lg = b / 8 + ES_ENGRAM_LAT_MIN_LOG2, sub = b % 8;

	if (b == 0)
		return 0;
	return (8ull + (uint64_t)sub) << (lg - 3);
}

uint64_t es_engram_lat_bucket_hi(int b)
{
	return b + 1 >= ES_ENGRAM_LAT_BUCKETS ? UINT64_MAX :
	       es_engram_lat_bucket_lo(b + 1);
}

uint64_t es_engram_lat_quantile(const uint64_t *hist, double q)
{
	uint64_t total = 0, acc = 0, want;

	for (int b = 0; b < ES_ENGRAM_LAT_BUCKETS; b++)
		total += hist[b];
	if (!total)
		return 0;
	want = (uint64_t)(q * (double)total);
	if (want >= total)
		want = total - 1;
	for (int b = 0; b < ES_ENGRAM_LAT_BUCKETS; b++) {
		acc += hist[b];
		if (acc > want) {
			uint64_t lo = es_engram_lat_bucket_lo(b);
			uint64_t hi = es_engram_lat_bucket_hi(b);

			return hi == UINT64_MAX ? lo : lo + (hi - lo) / 2;
		}
	}
	return 0;
}

void es_engram_open_rep_encode(struct st_wbuf *w,
			       const struct es_engram_open_rep *r)
{
	st_wbuf_u32(w, r->region);
	st_wbuf_u32(w, r->n_layers);
	st_wbuf_u32(w, r->max_rows);
	st_wbuf_u64(w, r->region_offset);
	st_wbuf_u64(w, r->region_bytes);
}

int es_engram_open_rep_decode(const uint8_t *p, size_t len,
			      struct es_engram_open_rep *ret,
			      struct st_diag *diag)
{
	struct st_rbuf r;

	st_rbuf_init(&r, p, len);
	if (len != 28 || st_rbuf_u32(&r, &ret->region) ||
	    st_rbuf_u32(&r, &ret->n_layers) || st_rbuf_u32(&r, &ret->max_rows) ||
	    st_rbuf_u64(&r, &ret->region_offset) ||
	    st_rbuf_u64(&r, &ret->region_bytes))
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM_OPEN reply of %zu bytes, expected 28",
				   len);
	if (ret->region >= ES_MAX_CLIENTS || !ret->n_layers ||
	    ret->n_layers > ES_ENGRAM_MAX_LAYERS || !ret->max_rows)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM_OPEN reply: region %u, %u layers, %u rows out of range",
				   ret->region, ret->n_layers, ret->max_rows);
	return 0;
}

void es_engram_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t li,
			  uint32_t n, uint32_t flags, uint64_t seq,
			  const int64_t *rows)
{
	st_wbuf_u32(w, pid);
	st_wbuf_u32(w, li);
	st_wbuf_u32(w, n);
	st_wbuf_u32(w, flags);
	st_wbuf_u64(w, seq);
	for (uint32_t i = 0; i < n; i++)
		st_wbuf_u64(w, (uint64_t)rows[i]);
}

int64_t es_engram_req_row(const struct es_engram_req *r, uint32_t i)
{
	uint64_t v;

	memcpy(&v, r->rows_le + 8 * (size_t)i, 8); /* little-endian host */
	return (int64_t)v;
}

int es_engram_req_decode(const uint8_t *p, size_t len, uint32_t n_layers,
			 uint32_t max_rows, const int64_t *rows,
			 struct es_engram_req *ret, struct st_diag *diag)
{
	struct st_rbuf r;
	uint32_t lim;

	st_rbuf_init(&r, p, len);
	if (len < 24 || st_rbuf_u32(&r, &ret->pid) || st_rbuf_u32(&r, &ret->li) ||
	    st_rbuf_u32(&r, &ret->n) || st_rbuf_u32(&r, &ret->flags) ||
	    st_rbuf_u64(&r, &ret->seq))
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM request of %zu bytes is shorter than its 24-byte head",
				   len);
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "ENGRAM: pid %u", ret->pid);
	if (ret->flags & ~ES_ENGRAM_PREFETCH)
		return st_diag_set(diag, -ST_E_PROTO, "ENGRAM: unknown flags 0x%x",
				   ret->flags);
	if (ret->li >= n_layers)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM: Engram layer index %u, the store has %u",
				   ret->li, n_layers);
	lim = ret->flags & ES_ENGRAM_PREFETCH ? ES_ENGRAM_MAX_PREFETCH : max_rows;
	if (ret->n < 1 || ret->n > lim)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM: %u rows (1..%u per %s)", ret->n, lim,
				   ret->flags ? "PREFETCH" : "FETCH");
	if (len != 24 + 8 * (size_t)ret->n)
		return st_diag_set(diag, -ST_E_PROTO,
				   "ENGRAM: %zu bytes for %u rows (expected %zu)",
				   len, ret->n, 24 + 8 * (size_t)ret->n);
	ret->rows_le = p + 24;
	for (uint32_t i = 0; i < ret->n; i++) {
		int64_t row = es_engram_req_row(ret, i);

		if (row < 0 || row >= rows[ret->li])
			return st_diag_set(diag, -ST_E_PROTO,
					   "ENGRAM: row[%u] = %lld outside layer %u's table [0, %lld)",
					   i, (long long)row, ret->li,
					   (long long)rows[ret->li]);
	}
	return 0;
}
