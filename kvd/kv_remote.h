/*
 * kv_remote.h — kvd's remote KV tier (issue 23): full prefix-cache page
 * groups published to a Redis (or anything speaking its protocol) under
 * their content-hash key, and looked up there when the local prefix cache
 * misses, so that several strata nodes share one cache.
 *
 * Keys:   "strata:kv:<format>:<decl hash>:<prefix key>" (hex): the prefix
 *         key (kv_prefix_keys) covers the parent chain, the token ids and
 *         the model id (weights, expert store, KV dtype, page size as
 *         computed hashes them); the declaration hash (page_rows and every
 *         stream's row_bytes, tokens_per_row, window_rows, flags) and the
 *         format number keep pools of another shape or another strata
 *         value format out of each other's keys.
 * Values: a header (magic, format, key, declaration hash, page_rows,
 *         n_streams, per stream the byte length and XXH3-64 checksum) then
 *         each stream's page bytes.  A value is used only when every field
 *         equals what this pool expects and every checksum matches (the
 *         spill file's checks: key, length, checksum); anything else is a
 *         miss, counted as an error, logged, and the key deleted so the
 *         next publish replaces it.
 *
 * Synchronous, in kvd's request loop, not a worker thread: a lookup's
 * answer is needed before kvd can reply to the CREATE_PREFIX that asked
 * (a thread would not shorten that request), kvd's pool has one writer by
 * design (kv_daemon.h), and a publish reads shared read-only pages that a
 * thread would have to pin against spill and eviction.  Instead every call
 * is bounded: connect and each command (send and receive) time out after
 * timeout_ms; after any failure the tier is skipped (local only) for a
 * back-off of 1 s, doubling to 30 s, so a dead or paused Redis costs at
 * most one timeout per back-off period; a publish sends at most two
 * pipelined round trips (EXPIRE to find what is there, SET of the rest).
 *
 * Failure is never wrong tokens: every failure (Redis down, slow, full,
 * flushed, a corrupted or foreign value) is a miss or a skipped publish,
 * and computed recomputes the rows.
 */
#ifndef KV_REMOTE_H
#define KV_REMOTE_H

#include <stdint.h>

#include "st_error.h"
#include "st_redis.h"

struct kv_pool;

/* Value format number (in keys and values). */
#define KV_REMOTE_FORMAT 1u

struct kv_remote_config {
	char url[512];           /* redis://HOST[:PORT][/DB]; "" = off */
	uint32_t ttl_s;          /* time to live of a published value */
	uint64_t budget_bytes;   /* bytes published per ttl_s window */
	uint32_t timeout_ms;     /* connect and per-command bound */
	uint32_t share_private;  /* publish private sequences' pages too */
};

/* Counters since kvd started. */
struct kv_remote_stats {
	uint64_t hits;           /* groups restored from the tier */
	uint64_t misses;         /* lookups that found no group there */
	uint64_t bytes_in;       /* value bytes read */
	uint64_t bytes_out;      /* value bytes written */
	uint64_t errors;         /* failed calls and rejected values */
	uint64_t published;      /* groups written */
	uint64_t rejected;       /* values that failed their checks */
	uint64_t over_budget;    /* groups not published: budget spent */
};

struct kv_remote {
	struct kv_remote_config cfg;
	struct st_redis_url url;
	struct st_redis *conn;   /* NULL: not connected */
	uint64_t retry_ns;       /* no attempt before this (st_now_ns) */
	uint64_t backoff_ns;     /* next back-off after a failure */
	uint64_t window_ns;      /* start of the current budget window */
	uint64_t window_bytes;   /* published in it */
	struct kv_remote_stats stats;
};

/*
 * Sets up the tier from cfg (copied) without connecting (the first use
 * connects).  0, or -EINVAL (bad URL, ttl_s or timeout_ms 0) with diag.
 */
int kv_remote_init(struct kv_remote *rm, const struct kv_remote_config *cfg,
		   struct st_diag *diag);

/* Closes the connection.  Safe on a zeroed struct. */
void kv_remote_fini(struct kv_remote *rm);

/*
 * Publishes n page groups of pool p: keys[n], pages[n * n_streams] (group
 * i's page of stream s at i * n_streams + s; published, so read-only and
 * synced).  Groups already in the tier get their time to live refreshed
 * and are not sent again; the rest are sent while the budget allows.
 * Failures are counted and logged, never returned (the local cache is
 * unaffected).  Returns the groups written.
 */
uint32_t kv_remote_publish(struct kv_pool *p, uint32_t n,
			   const uint64_t *keys, const uint32_t *pages);

/*
 * Looks up keys[0..n) (a prefix chain's groups first..first+n of sequence
 * index idx, absent from the local cache) in the tier, in order: each
 * value found and verified is copied into fresh pages (room made as for a
 * restore, batch stamp `stamp`), the group enters the local prefix cache
 * under its key, and its pages go into the sequence's table at page index
 * first + i (one reference each, the sequence's).  Stops at the first key
 * absent, invalid, or when no room can be made.  Returns the groups
 * restored (0 or more); failures are counted and logged.
 */
uint32_t kv_remote_restore_chain(struct kv_pool *p, uint32_t idx,
				 uint32_t first, const uint64_t *keys,
				 uint32_t n, uint32_t stamp);

/*
 * The tier's key of prefix key `key` for pool p (for tests and tools):
 * writes at most cap bytes (64 is enough) to buf.  Returns the length.
 */
int kv_remote_key(const struct kv_pool *p, uint64_t key, char *buf,
		  size_t cap);

/*
 * The tier's value format, also the group record of a saved session
 * (kv_session.h): kv_group_value_len is a value's size in bytes for pool
 * p; kv_group_value_encode writes group (key, pages[n_streams]) into v
 * (that many bytes; the pages resident and synced); kv_group_value_check
 * says why value v (len bytes) may not be used as group `key` of p (a
 * static string), or returns NULL when every field and checksum holds.
 * kv_pool_decl_hash: XXH3 of page_rows and the stream declarations.
 */
size_t kv_group_value_len(const struct kv_pool *p);
void kv_group_value_encode(const struct kv_pool *p, uint64_t key,
			   const uint32_t *pages, uint8_t *v);
const char *kv_group_value_check(const struct kv_pool *p, uint64_t key,
				 const uint8_t *v, size_t len);
uint64_t kv_pool_decl_hash(const struct kv_pool *p);

/*
 * Whole values under a key of their own (saved sessions, kv_session.h),
 * with the tier's bounds and back-off (a failure is counted, logged and
 * drops the connection).  put: SET key EX ttl_s; 0 or negative.  get: 1
 * with *ret (malloc'd, the caller's) and *ret_len, 0 when the key is
 * absent, negative on failure.  del: 1 when the key existed (it is gone),
 * 0 when it did not, negative on failure.  -ST_E_PEERGONE while backing
 * off or unconnected.
 */
int kv_remote_blob_put(struct kv_remote *rm, const char *key,
		       const uint8_t *buf, size_t len, uint32_t ttl_s);
int kv_remote_blob_get(struct kv_remote *rm, const char *key, uint8_t **ret,
		       size_t *ret_len);
int kv_remote_blob_del(struct kv_remote *rm, const char *key);

#endif
