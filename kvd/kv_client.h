/*
 * kv_client.h — the client side of kvd, linked into computed (and tests).
 *
 * kvd is format-agnostic (DESIGN.md section 3a): the client declares the
 * model's KV streams (row size in bytes; in this slice one row per token and
 * every row retained) and the page size in rows; kvd sizes the page pool from
 * its byte budget.  A sequence has a page table per stream; the client asks
 * for capacity (rows) in batches, then reads and writes rows straight in the
 * pool segment (/strata.<instance>.kv) through kv_client_row().
 */
#ifndef KV_CLIENT_H
#define KV_CLIENT_H

#include <stdint.h>

#include "st_error.h"

#define KV_MAX_STREAMS 256

struct kv_client;

struct kv_stats {
	uint64_t budget_bytes;
	uint64_t pool_bytes;     /* segment size */
	uint64_t page_bytes;     /* one page of the largest stream */
	uint32_t page_rows;
	uint32_t n_streams;
	uint64_t n_pages;        /* pages the budget holds */
	uint64_t pages_used;     /* referenced by at least one sequence */
	uint64_t pages_peak;     /* high-water mark of pages_used */
	uint64_t n_seqs;         /* live sequences */
	uint64_t pages_shared;   /* pages with refcount > 1 */
	uint64_t epoch;
	int32_t pid;
};

/* Connects to kvd of the instance (run_dir), registers as `name`.  *ret owned
 * by the caller.  Errors: -ST_E_PEERGONE, -ST_E_VERSION. */
int kv_client_open(const char *run_dir, const char *instance, const char *name,
		   int timeout_ms, struct kv_client **ret, struct st_diag *diag);

/* Frees the client's sequences, says BYE, detaches.  NULL is fine. */
void kv_client_close(struct kv_client *c);

/*
 * Declares the streams: n_streams row sizes in bytes and rows per page.
 * The first declaration creates the page pool; a later identical one
 * attaches to it; a different one gets -ST_E_CONFIG (another model is using
 * this kvd).  Errors also: -ST_E_BUDGET when the budget holds fewer pages
 * than one page per stream (message names the minimum budget).
 */
int kv_client_declare(struct kv_client *c, int n_streams,
		      const uint32_t *row_bytes, uint32_t page_rows,
		      struct st_diag *diag);

/* Creates an empty sequence; *ret_seq is its id. */
int kv_client_seq_create(struct kv_client *c, uint32_t *ret_seq,
			 struct st_diag *diag);

/*
 * Batched: makes sequence seqs[i] hold at least n_rows[i] rows in every
 * stream (allocating pages as needed), all in one request.
 * Errors: -ST_E_BUDGET (pool exhausted: nothing of this request stays
 * allocated; diag names the budget to raise), -ST_E_LIMIT (more rows than a
 * sequence may hold), -ST_E_NOTFOUND.
 */
int kv_client_seq_reserve(struct kv_client *c, int n, const uint32_t *seqs,
			  const uint32_t *n_rows, struct st_diag *diag);

/*
 * Forks `src` whose first n_rows rows are written: the child shares the
 * full pages (copy-on-write: reference counts) and gets a copy of the
 * partial last page.  *ret_dst is the child.
 */
int kv_client_seq_fork(struct kv_client *c, uint32_t src, uint32_t n_rows,
		       uint32_t *ret_dst, struct st_diag *diag);

/* Frees a sequence and drops its page references. */
int kv_client_seq_free(struct kv_client *c, uint32_t seq);

/*
 * Pointer to row `row` of `stream` of `seq` in the pool (row_bytes bytes),
 * or NULL when that row has no page.  Valid until the sequence is freed.
 * Writing is allowed only into pages this sequence does not share.
 */
uint8_t *kv_client_row(struct kv_client *c, uint32_t seq, int stream,
		       uint32_t row);

int kv_client_stats(struct kv_client *c, struct kv_stats *ret);
int kv_client_shutdown(struct kv_client *c);

#endif
