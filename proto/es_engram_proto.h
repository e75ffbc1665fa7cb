/*
 * es_engram_proto.h — expertd's Engram tier (DeepSeek-V4.1): its messages
 * and the shared-memory segment the rows are delivered through.
 *
 * Messages (st_proto.h header; es_proto.h error replies):
 *   ES_MSG_ENGRAM_OPEN  req: u32 pid
 *                       rep: u32 region (this client's region index),
 *                            u32 n_layers, u32 max_rows,
 *                            u64 region_offset, u64 region_bytes
 *   ES_MSG_ENGRAM       req: u32 pid, u32 li (Engram layer index), u32 n,
 *                            u32 flags, u64 seq, u64 row[n] (table-local
 *                            row ids, < rows[li])
 *                       rep: u32 hits, u32 misses (at arrival)
 *     flags 0 (FETCH): 1 <= n <= max_rows; expertd copies each row's
 *       stored bytes (dim E4M3, then dim/32 E8M0: st_engram_file.h) into
 *       the client's region in request order, row i at i * row_bytes[li],
 *       then stores status and msg and LAST done_seq = seq (release) in
 *       the client's slot.  The reply comes at once; the client waits for
 *       done_seq.  One FETCH in flight per client (the region is reused).
 *     flags ES_ENGRAM_PREFETCH: 1 <= n <= ES_ENGRAM_MAX_PREFETCH; the rows
 *       are read into the host cache, nothing is delivered (the hash
 *       depends only on token ids, so a client sends them as soon as the
 *       token is known and FETCHes them at the Engram layer).
 *
 * Segment "/strata.<instance>.engram" (st_shm.h, kind "engram"): the
 * st_shm header, struct es_engram_shm at ES_ENGRAM_SHM_OFFSET, then one
 * region per client table entry (ES_MAX_CLIENTS) at regions_offset +
 * index * region_bytes, each max_rows * row_bytes_max bytes.  expertd
 * writes everything; clients only read (their own slot and region).
 */
#ifndef ES_ENGRAM_PROTO_H
#define ES_ENGRAM_PROTO_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "es_pool.h"
#include "st_error.h"
#include "st_proto.h"

#define ES_MSG_ENGRAM_OPEN (ST_MSG_ES_FIRST + 4)  /* 0x0104 */
#define ES_MSG_ENGRAM (ST_MSG_ES_FIRST + 5)       /* 0x0105 */

#define ES_ENGRAM_PREFETCH 1u
#define ES_ENGRAM_MAX_LAYERS 16
#define ES_ENGRAM_MAX_ROWS 4096        /* rows per FETCH */
#define ES_ENGRAM_MAX_PREFETCH 8192    /* rows per PREFETCH */
#define ES_ENGRAM_SHM_KIND "engram"
#define ES_ENGRAM_SHM_LAYOUT 2 /* 2: st_shm_header.pool_id */
#define ES_ENGRAM_SHM_OFFSET 256
/* Read latency histogram: 8 buckets per power of two from 2^8 ns. */
#define ES_ENGRAM_LAT_BUCKETS 256
#define ES_ENGRAM_LAT_MIN_LOG2 8

/* I/O engines (es_engram_shm.io_engine). */
enum { ES_ENGRAM_IO_URING = 1, ES_ENGRAM_IO_PREAD = 2 };

/* One client's delivery status (written by expertd only). */
struct es_engram_slot {
	_Atomic uint64_t done_seq;   /* seq of the last finished FETCH */
	_Atomic int32_t status;      /* its result: 0 or a negative code */
	uint32_t n_rows;
	char msg[240];               /* its error message, "" on success */
};

struct es_engram_shm {
	/* geometry: fixed by the store; the segment's layout hash covers
	 * every field up to cache_rows */
	uint32_t n_layers, max_rows, row_bytes_max;
	uint32_t n_regions;          /* ES_MAX_CLIENTS */
	uint64_t regions_offset, region_bytes;
	int32_t layer_id[ES_ENGRAM_MAX_LAYERS];
	uint32_t dim[ES_ENGRAM_MAX_LAYERS];
	uint32_t row_bytes[ES_ENGRAM_MAX_LAYERS];
	int64_t rows[ES_ENGRAM_MAX_LAYERS];
	/* set by each expertd at start */
	uint64_t cache_rows, cache_bytes;   /* capacity of the host cache */
	uint32_t io_engine;          /* ES_ENGRAM_IO_* */
	uint32_t direct;             /* 1: O_DIRECT reads */
	/* counters (expertd writes, relaxed) */
	_Atomic uint64_t lookups;    /* rows asked for (FETCH + PREFETCH) */
	_Atomic uint64_t hits;       /* found in the cache */
	_Atomic uint64_t merged;     /* found already being read */
	_Atomic uint64_t misses;     /* needed a read */
	_Atomic uint64_t prefetch_rows;
	_Atomic uint64_t reads, read_bytes, read_errors, rereads;
	_Atomic uint64_t evictions, cache_used;
	_Atomic uint64_t lat_hist[ES_ENGRAM_LAT_BUCKETS];
	struct es_engram_slot slot[ES_MAX_CLIENTS];
};

/* Bucket of a read latency (ns) and the lower / upper bound of a bucket. */
int es_engram_lat_bucket(uint64_t ns);
uint64_t es_engram_lat_bucket_lo(int b);
uint64_t es_engram_lat_bucket_hi(int b);

/* Quantile q (0..1) of a latency histogram in ns (bucket midpoint, so
 * within +-6 % of the true value); 0 when empty. */
uint64_t es_engram_lat_quantile(const uint64_t *hist, double q);

struct es_engram_open_rep {
	uint32_t region, n_layers, max_rows;
	uint64_t region_offset, region_bytes;
};

struct es_engram_req {
	uint32_t pid, li, n, flags;
	uint64_t seq;
	const uint8_t *rows_le;      /* n little-endian u64 (borrowed) */
};

void es_engram_open_rep_encode(struct st_wbuf *w,
			       const struct es_engram_open_rep *r);
int es_engram_open_rep_decode(const uint8_t *p, size_t len,
			      struct es_engram_open_rep *ret,
			      struct st_diag *diag);
void es_engram_req_encode(struct st_wbuf *w, uint32_t pid, uint32_t li,
			  uint32_t n, uint32_t flags, uint64_t seq,
			  const int64_t *rows);
/*
 * Decodes an ENGRAM request and validates it: exact length 24 + 8n,
 * li < n_layers, flags 0 or PREFETCH, 1 <= n <= max_rows (FETCH) or
 * ES_ENGRAM_MAX_PREFETCH, every row < rows[li], pid > 0.  0 or
 * -ST_E_PROTO with diag naming the field.
 */
int es_engram_req_decode(const uint8_t *p, size_t len, uint32_t n_layers,
			 uint32_t max_rows, const int64_t *rows,
			 struct es_engram_req *ret, struct st_diag *diag);
/* Row i of a decoded request. */
int64_t es_engram_req_row(const struct es_engram_req *r, uint32_t i);

#endif
