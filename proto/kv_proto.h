/*
 * kv_proto.h — kvd's messages (type range 0x02xx, DESIGN.md section 4) and
 * the computation and validation of the page pool layout (kv_pool.h), both
 * shared by kvd and its clients.
 *
 * Payloads (after the 32-byte st_proto header), little-endian, no padding:
 *
 *   ST_MSG_HELLO       u32 pid, u32 proto_version, char name[32],
 *                      u64 start_ticks (the client's start time,
 *                      st_pid_start_ticks; 0 = unknown)
 *                      [, u32 resume_client_id]  (kvd: optional; a client
 *                      re-registering after a kvd restart asks for its id)
 *              reply   u32 client_id, u64 epoch (0 while there is no pool),
 *                      u64 pool_id (st_shm.h; 0 while there is no pool)
 *   ST_MSG_BYE         -                          reply -
 *   ST_MSG_PING        -                reply u32 pid, u64 epoch, u32 ready
 *   ST_MSG_STATS       -                reply struct kv_msg_stats (below)
 *   ST_MSG_SHUTDOWN    -                reply -   (kvd then exits cleanly)
 *   KV_MSG_DECLARE     u32 n_streams, u32 page_rows,
 *                      n_streams x {u32 row_bytes, u32 tokens_per_row,
 *                                   u32 window_rows, u32 flags}
 *              reply   u64 layout_hash, u64 epoch, u64 pool_bytes,
 *                      u64 pool_id
 *   KV_MSG_SEQ_CREATE  -                reply u32 seq
 *   KV_MSG_SEQ_RESERVE u32 n, n x {u32 seq, u32 n_rows}    reply -
 *   KV_MSG_SEQ_FORK    u32 src, u32 n_rows      reply u32 seq
 *   KV_MSG_SEQ_FREE    u32 seq                  reply -
 *   KV_MSG_SEQ_TRUNCATE u32 seq, u32 n_rows     reply -
 *   KV_MSG_SEQ_CREATE_PREFIX  u64 model_id, u32 n_ids, n_ids x i32 id
 *              reply   u32 seq, u32 n_cached (rows mapped from the cache)
 *   KV_MSG_SEQ_PUBLISH u32 seq, u64 model_id, u32 n_ids, n_ids x i32 id
 *                      [, u32 flags (KV_PUBLISH_F_*; absent = 0)]
 *              reply   u32 groups newly published
 *   KV_MSG_SEQ_RESIDENCY  u32 op (KV_RESIDENCY_*), u32 n, n x u32 seq
 *              reply   u32 n, n x i32 status (0 or a negative code each),
 *                      [u32 length + text of the first failure]
 *   KV_MSG_SESSION     save, load, list, remove a named session
 *                      (kv_session_proto.h)
 *   KV_MSG_PREFIX_AHEAD  u32 n_chains, n_chains x {u32 n_keys,
 *                      n_keys x u64 key}  (prefix-cache chains of queued
 *                      requests, kv_prefix_keys; n_chains 0 drops the plan)
 *              reply   u32 n_spilled (groups kvd will restore),
 *                      u32 n_held (groups resident and held now)
 *   KV_MSG_DEMAND      u64 pages, u32 n_reqs, u64 grow (KV pages the
 *                      client's queued requests wait for, how many
 *                      requests wait, and the pages its running requests
 *                      may still take; all 0: none)   reply -
 *   KV_MSG_SEQ_DEVICE  u32 n, n x {u32 seq, u32 n_rows}  (kv_devpage.h)
 *              reply   u64 epoch, u32 n_pages, n_pages x {u32 page,
 *                      u32 slot, u64 key}
 *
 * A reply whose status is negative may carry a text instead: u32 length +
 * bytes (at most KV_PROTO_MAX_TEXT), saying what was wrong (kv_proto_text).
 *
 * Events on kvd.evt (PUB), same framing, request_id 0:
 *   KV_EVT_EPOCH       u64 epoch (pool created or adopted)
 *   KV_EVT_SHUTDOWN    - (kvd is stopping)
 */
#ifndef KV_PROTO_H
#define KV_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "kv_pool.h"
#include "st_error.h"
#include "st_proto.h"

enum kv_msg_type {
	KV_MSG_DECLARE = ST_MSG_KV_FIRST + 1,
	KV_MSG_SEQ_CREATE,
	KV_MSG_SEQ_RESERVE,
	KV_MSG_SEQ_FORK,
	KV_MSG_SEQ_FREE,
	KV_MSG_SEQ_CREATE_PREFIX,
	KV_MSG_SEQ_PUBLISH,
	KV_MSG_SEQ_RESIDENCY,
	KV_MSG_SEQ_DEVICE,       /* device KV pages: kv_devpage.h */
	KV_MSG_SEQ_TRUNCATE,     /* roll back rows (speculative decoding) */
	KV_MSG_SESSION,          /* saved sessions: kv_session_proto.h */
	KV_MSG_PREFIX_AHEAD,     /* restore queued requests' cached prefixes
				  * ahead of their admission (issue 24); a
				  * kvd that predates it answers
				  * -ST_E_PROTO "unknown message type" */
	KV_MSG_DEMAND,           /* pages queued requests wait for (issue
				  * 24): weighed by kvd's share of a shared
				  * memory budget (kv_budget_wait_gain); an
				  * older kvd answers -ST_E_PROTO */

	KV_EVT_EPOCH = ST_MSG_KV_FIRST + 0x40,
	KV_EVT_SHUTDOWN,
};

#define KV_PROTO_NAME_BYTES 32
#define KV_PROTO_MAX_TEXT 512
/* Entries per SEQ_RESERVE request (8 bytes each: 128 KiB). */
#define KV_PROTO_MAX_RESERVE 16384
/* Token ids per CREATE_PREFIX / PUBLISH request (4 bytes each, within
 * ST_MSG_MAX_BYTES): longer prompts send their first KV_PROTO_MAX_IDS ids. */
#define KV_PROTO_MAX_IDS ((ST_MSG_MAX_BYTES - 4096) / 4)

/* Keys per PREFIX_AHEAD request (8 bytes each: 128 KiB). */
#define KV_PROTO_MAX_AHEAD_KEYS 16384

/* SEQ_PUBLISH flags. */
enum kv_publish_flag {
	/* a private sequence: its pages go to the local prefix cache only,
	 * never to kvd's remote KV tier (unless kvd runs with
	 * --remote-kv-share-private) */
	KV_PUBLISH_F_PRIVATE = 1u << 0,
};
#define KV_PUBLISH_F_ALL KV_PUBLISH_F_PRIVATE

/* SEQ_RESIDENCY operations. */
enum kv_residency_op {
	KV_RESIDENCY_RESTORE = 1, /* bring spilled pages back */
	KV_RESIDENCY_PIN = 2,     /* restore, then mark running */
	KV_RESIDENCY_UNPIN = 3,   /* no longer running (may be spilled) */
	KV_RESIDENCY_PREFETCH = 4,/* restore in the background, into free
				   * pages only; the reply does not wait */
	KV_RESIDENCY_AHEAD = 5,   /* restore in the background for the next
				   * step, spilling idle sequences (never
				   * pinned ones); replaces the client's
				   * earlier AHEAD; the reply does not wait */
};

/**
 * kv_ahead_headroom_pages - pages a restore ahead leaves free for the
 * current step: 1/8 of the pool plus one per stream (a sequence's partial
 * last page).  kvd's restore-ahead stops there (kvd/kv_ahead.c) and the
 * scheduler sizes its steps from the rest (computed/serve/cw_kvahead.c), so
 * both sides use this one rule.
 * @n_pages: pages in kvd's pool (all streams).
 * @n_streams: KV streams of the declared model.
 * Returns: a page count (may exceed n_pages for a pool of a few pages).
 */
static inline uint64_t kv_ahead_headroom_pages(uint64_t n_pages,
					       uint64_t n_streams)
{
	return n_pages / 8 + n_streams;
}

struct kv_msg_hello {
	uint32_t pid;
	uint32_t proto_version;
	char name[KV_PROTO_NAME_BYTES + 1];  /* NUL-terminated after decode */
	uint64_t start_ticks;                /* 0 = unknown */
	uint32_t resume_client_id;           /* 0 = none */
};

struct kv_msg_hello_reply {
	uint32_t client_id;
	uint64_t epoch;
	uint64_t pool_id;
};

struct kv_msg_ping_reply {
	uint32_t pid;
	uint64_t epoch;
	uint32_t ready;
};

struct kv_msg_declare {
	uint32_t n_streams;
	uint32_t page_rows;
	struct kv_stream_decl streams[KV_MAX_STREAMS];
};

struct kv_msg_declare_reply {
	uint64_t layout_hash;
	uint64_t epoch;
	uint64_t pool_bytes;
	uint64_t pool_id;
};

struct kv_reserve_entry {
	uint32_t seq;
	uint32_t n_rows;
};

struct kv_msg_fork {
	uint32_t src;
	uint32_t n_rows;
};

struct kv_msg_truncate {
	uint32_t seq;
	uint32_t n_rows;
};

/* CREATE_PREFIX (seq 0) and PUBLISH: ids owned by the struct after a
 * successful decode (kv_msg_prefix_fini). */
struct kv_msg_prefix {
	uint32_t seq;
	uint64_t model_id;
	uint32_t n_ids;
	int32_t *ids;
	uint32_t flags;          /* PUBLISH: KV_PUBLISH_F_* */
};

struct kv_msg_prefix_reply {
	uint32_t seq;
	uint32_t n_cached;
};

/* SEQ_RESIDENCY; seqs owned after a successful decode (free). */
struct kv_msg_residency {
	uint32_t op;
	uint32_t n;
	uint32_t *seqs;
};

/* PREFIX_AHEAD: chains of prefix-cache keys (each chain the keys of one
 * prompt's full pages, in order: kv_prefix_keys); owned after a
 * successful decode (kv_msg_prefix_ahead_fini). */
struct kv_msg_prefix_ahead {
	uint32_t n_chains;
	uint32_t *chain_len;     /* [n_chains], each >= 1 */
	uint32_t n_keys;         /* sum of chain_len */
	uint64_t *keys;          /* [n_keys], none 0 */
};

/* STATS reply: fixed fields in this order. */
struct kv_msg_stats {
	uint64_t budget_bytes;
	uint64_t pool_bytes;
	uint64_t page_bytes;
	uint32_t page_rows;
	uint32_t n_streams;
	uint64_t n_pages;
	uint64_t pages_used;
	uint64_t pages_peak;
	uint64_t n_seqs;
	uint64_t pages_shared;
	uint64_t epoch;
	uint64_t pool_id;
	int32_t pid;
	uint32_t n_clients;
	uint32_t max_seqs;
	uint32_t max_rows_per_seq;
	/* prefix cache */
	uint64_t pages_cached;       /* resident pages of unused cached groups */
	uint64_t cache_groups;       /* published groups (resident + spilled) */
	uint64_t prefix_lookups;     /* CREATE_PREFIX requests */
	uint64_t prefix_pages_hit;   /* groups mapped from the cache */
	uint64_t prefix_rows_reused; /* rows those groups held */
	uint64_t prefix_published;   /* groups published */
	uint64_t cache_evictions;    /* groups dropped to make room */
	/* spill */
	uint64_t spill_budget_bytes;
	uint64_t slot_bytes;
	uint64_t n_slots;
	uint64_t pages_spilled;      /* slots in use now */
	uint64_t spill_pages_total;  /* pages written since kvd started */
	uint64_t spill_bytes_total;
	uint64_t spill_ns_total;     /* time in spill writes */
	uint64_t restore_pages_total;
	uint64_t restore_bytes_total;
	uint64_t restore_ns_total;   /* time in restore reads + checks */
	uint64_t restore_failures;   /* pages that failed their checks */
	uint32_t spill_direct;       /* 1 when the spill file uses O_DIRECT */
	uint32_t n_pinned;           /* sequences pinned as running */
	/* remote KV tier (kvd --remote-kv, kv_remote.h) */
	uint32_t remote_on;          /* 1 when kvd runs with the tier */
	uint32_t reserved0;
	uint64_t remote_hits;        /* groups restored from it */
	uint64_t remote_misses;      /* lookups that found nothing there */
	uint64_t remote_bytes_in;
	uint64_t remote_bytes_out;
	uint64_t remote_errors;      /* failed calls, rejected values */
	uint64_t remote_published;   /* groups written to it */
	uint64_t remote_rejected;    /* values that failed their checks */
	/* queued requests' prefixes (PREFIX_AHEAD, kv_cache_ahead.c) */
	uint64_t prefix_ahead_groups;   /* groups restored ahead */
	uint64_t prefix_ahead_bytes;    /* their spill-file bytes */
	uint64_t prefix_lookup_restores;/* groups a lookup restored itself */
	uint64_t prefix_lookup_restore_ns; /* time those took */
};

/* Encoders append a payload to w (not reset; sticky w->err).  Decoders read
 * a whole payload, validate the length exactly and every field whose range
 * does not depend on kvd's state, and return 0 or -ST_E_PROTO (malformed),
 * -ST_E_LIMIT (a count over its maximum), with a message in diag. */
void kv_proto_encode_hello(struct st_wbuf *w, const struct kv_msg_hello *m);
int kv_proto_decode_hello(const uint8_t *p, size_t len,
			  struct kv_msg_hello *ret, struct st_diag *diag);
void kv_proto_encode_hello_reply(struct st_wbuf *w,
				 const struct kv_msg_hello_reply *m);
int kv_proto_decode_hello_reply(const uint8_t *p, size_t len,
				struct kv_msg_hello_reply *ret);
void kv_proto_encode_ping_reply(struct st_wbuf *w,
				const struct kv_msg_ping_reply *m);
int kv_proto_decode_ping_reply(const uint8_t *p, size_t len,
			       struct kv_msg_ping_reply *ret);

/* DECLARE: n_streams 1..KV_MAX_STREAMS, page_rows 1..KV_MAX_PAGE_ROWS and
 * row_bytes 1..KV_MAX_ROW_BYTES are checked here (-ST_E_PROTO); whether the
 * other stream fields are supported is kv_layout_compute's business. */
void kv_proto_encode_declare(struct st_wbuf *w, const struct kv_msg_declare *m);
int kv_proto_decode_declare(const uint8_t *p, size_t len,
			    struct kv_msg_declare *ret, struct st_diag *diag);
void kv_proto_encode_declare_reply(struct st_wbuf *w,
				   const struct kv_msg_declare_reply *m);
int kv_proto_decode_declare_reply(const uint8_t *p, size_t len,
				  struct kv_msg_declare_reply *ret);

/* SEQ_RESERVE: n 1..KV_PROTO_MAX_RESERVE entries, each seq non-zero.
 * The decoder fills a malloc'd array (*ret_entries, owned by the caller
 * on success) and *ret_n. */
void kv_proto_encode_reserve(struct st_wbuf *w, uint32_t n,
			     const struct kv_reserve_entry *e);
int kv_proto_decode_reserve(const uint8_t *p, size_t len, uint32_t *ret_n,
			    struct kv_reserve_entry **ret_entries,
			    struct st_diag *diag);
/* The (sequence, rows) list of SEQ_RESERVE, shared by every message that
 * carries one (SEQ_DEVICE, kv_devpage.h); `what` names the message in
 * diag (a static string).  Errors as kv_proto_decode_reserve. */
int kv_proto_decode_entries(const char *what, const uint8_t *p, size_t len,
			    uint32_t *ret_n,
			    struct kv_reserve_entry **ret_entries,
			    struct st_diag *diag);

void kv_proto_encode_fork(struct st_wbuf *w, const struct kv_msg_fork *m);
int kv_proto_decode_fork(const uint8_t *p, size_t len, struct kv_msg_fork *ret,
			 struct st_diag *diag);

/* DEMAND: the pages and requests waiting, the running ones' growth
 * (-ST_E_PROTO when the payload is short or long). */
struct kv_msg_demand {
	uint64_t pages;
	uint32_t n_reqs;
	uint64_t grow;
};
void kv_proto_encode_demand(struct st_wbuf *w, const struct kv_msg_demand *m);
int kv_proto_decode_demand(const uint8_t *p, size_t len,
			   struct kv_msg_demand *ret, struct st_diag *diag);

/* SEQ_TRUNCATE: seq non-zero (-ST_E_PROTO otherwise). */
void kv_proto_encode_truncate(struct st_wbuf *w,
			      const struct kv_msg_truncate *m);
int kv_proto_decode_truncate(const uint8_t *p, size_t len,
			     struct kv_msg_truncate *ret,
			     struct st_diag *diag);

/* One u32 sequence handle (SEQ_CREATE and SEQ_FORK replies, SEQ_FREE). */
void kv_proto_encode_seq(struct st_wbuf *w, uint32_t seq);
int kv_proto_decode_seq(const uint8_t *p, size_t len, uint32_t *ret_seq,
			struct st_diag *diag);

/* CREATE_PREFIX (has_seq 0) and PUBLISH (has_seq 1): n_ids
 * 1..KV_PROTO_MAX_IDS (-ST_E_LIMIT above), PUBLISH's seq non-zero;
 * PUBLISH's flags are sent only when non-zero, and unknown flag bits are
 * -ST_E_PROTO. */
void kv_proto_encode_prefix(struct st_wbuf *w, int has_seq,
			    const struct kv_msg_prefix *m);
int kv_proto_decode_prefix(const uint8_t *p, size_t len, int has_seq,
			   struct kv_msg_prefix *ret, struct st_diag *diag);
void kv_msg_prefix_fini(struct kv_msg_prefix *m);
void kv_proto_encode_prefix_reply(struct st_wbuf *w,
				  const struct kv_msg_prefix_reply *m);
int kv_proto_decode_prefix_reply(const uint8_t *p, size_t len,
				 struct kv_msg_prefix_reply *ret);

/* SEQ_RESIDENCY: op one of KV_RESIDENCY_*, n 1..KV_PROTO_MAX_RESERVE, every
 * seq non-zero.  Reply: n statuses (at most KV_PROTO_MAX_RESERVE; the
 * decoder requires exactly `n`). */
void kv_proto_encode_residency(struct st_wbuf *w,
			       const struct kv_msg_residency *m);
int kv_proto_decode_residency(const uint8_t *p, size_t len,
			      struct kv_msg_residency *ret,
			      struct st_diag *diag);
void kv_proto_encode_status_list(struct st_wbuf *w, uint32_t n,
				 const int32_t *status, const char *text);
int kv_proto_decode_status_list(const uint8_t *p, size_t len, uint32_t n,
				int32_t *ret_status, struct st_diag *diag);

/* PREFIX_AHEAD: n_chains 0..KV_PROTO_MAX_AHEAD_KEYS, every chain at least
 * one key, at most KV_PROTO_MAX_AHEAD_KEYS keys in all (-ST_E_LIMIT), no
 * key 0 (-ST_E_PROTO). */
void kv_proto_encode_prefix_ahead(struct st_wbuf *w,
				  const struct kv_msg_prefix_ahead *m);
int kv_proto_decode_prefix_ahead(const uint8_t *p, size_t len,
				 struct kv_msg_prefix_ahead *ret,
				 struct st_diag *diag);
void kv_msg_prefix_ahead_fini(struct kv_msg_prefix_ahead *m);

/* One u32 (PUBLISH reply). */
void kv_proto_encode_u32(struct st_wbuf *w, uint32_t v);
int kv_proto_decode_u32(const uint8_t *p, size_t len, uint32_t *ret);

void kv_proto_encode_stats(struct st_wbuf *w, const struct kv_msg_stats *m);
int kv_proto_decode_stats(const uint8_t *p, size_t len,
			  struct kv_msg_stats *ret);

/* Checks that a payload is empty (-ST_E_PROTO otherwise). */
int kv_proto_decode_empty(const uint8_t *p, size_t len, struct st_diag *diag);

/* Error text: u32 length + bytes, cut to KV_PROTO_MAX_TEXT. */
void kv_proto_encode_text(struct st_wbuf *w, const char *text);
/* Copies an error reply's text into diag (NUL-terminated, control
 * characters replaced); 0 if the payload was a valid text, else -ST_E_PROTO
 * and diag untouched. */
int kv_proto_decode_text(const uint8_t *p, size_t len, struct st_diag *diag);

/*
 * Reads as much of a message header as `len` bytes hold, without
 * validating: type and request_id when present (0 otherwise).  Used to
 * address an error reply to a message whose header is malformed.
 */
void kv_proto_salvage_header(const void *buf, size_t len,
			     struct st_msg_header *ret);

/*
 * Computes the layout of a pool for a declaration and kvd's options
 * (layout in kv_pool.h).  max_pages_per_seq = min(ceil(max_rows_per_seq /
 * page_rows), n_pages / n_streams): a sequence cannot hold more pages than
 * the budget gives one stream.  page_bytes: the largest ceil(page_rows /
 * tokens_per_row) x row_bytes (kv_pool.h).  Errors: -ST_E_CONFIG (n_streams,
 * page_rows, row_bytes or tokens_per_row out of range, max_seqs 0 or over
 * KV_MAX_SEQS, max_rows_per_seq 0 or over KV_MAX_ROWS_PER_SEQ),
 * -ST_E_UNSUPPORTED (flags != 0, or a window on a stream of more than one
 * token per row), -ST_E_BUDGET (the budget
 * holds fewer pages than n_streams; the message names the minimum budget),
 * -ST_E_LIMIT (sizes overflow).
 */
int kv_layout_compute(const struct kv_stream_decl *streams, uint32_t n_streams,
		      uint32_t page_rows, uint64_t budget_bytes,
		      uint32_t max_seqs, uint32_t max_rows_per_seq,
		      struct kv_layout *ret, struct st_diag *diag);

/* The same with a spill budget: n_slots = spill_budget_bytes / slot_bytes
 * (slot_bytes = page_bytes rounded up to KV_SLOT_ALIGN), at most
 * KV_MAX_SLOTS; a region of n_slots kv_spill_slot records.  A spill budget
 * above 0 that holds no slot is -ST_E_BUDGET (the message names the
 * minimum). */
int kv_layout_compute_spill(const struct kv_stream_decl *streams,
			    uint32_t n_streams, uint32_t page_rows,
			    uint64_t budget_bytes, uint64_t spill_budget_bytes,
			    uint32_t max_seqs, uint32_t max_rows_per_seq,
			    struct kv_layout *ret, struct st_diag *diag);

/*
 * Prefix-cache keys of the first n_pages full pages of a token sequence:
 * key[i] = XXH3-64 of the bytes (key[i-1] as u64 LE, ids[i*page_rows ..
 * (i+1)*page_rows) as i32 LE, model_id as u64 LE), with key[-1] = 0; a
 * result of 0 is replaced by 1 (0 means "no key").  n_pages * page_rows
 * must not exceed the ids given.  0 or -ENOMEM.
 */
int kv_prefix_keys(const int32_t *ids, uint32_t page_rows, uint64_t model_id,
		   uint32_t n_pages, uint64_t *ret_keys);

/* XXH3 of the layout followed by the stream declarations: the layout_hash
 * of the segment header. */
uint64_t kv_layout_hash(const struct kv_layout *l,
			const struct kv_stream_decl *streams);

/*
 * Validates the pool part of a mapped segment of `size` bytes: reads the
 * layout and the declaration, recomputes the layout from them and requires
 * every field to match, the total to fit in `size` and the hash to equal
 * `layout_hash` (0 = skip).  On success copies the layout to *ret and the
 * declaration to ret_streams[KV_MAX_STREAMS].  -ST_E_FORMAT with a message
 * naming the field otherwise.
 */
int kv_layout_read(const void *base, size_t size, uint64_t layout_hash,
		   struct kv_layout *ret, struct kv_stream_decl *ret_streams,
		   struct st_diag *diag);

/* True when two declarations are the same (streams and page_rows). */
int kv_decl_equal(uint32_t n_a, const struct kv_stream_decl *a,
		  uint32_t page_rows_a, uint32_t n_b,
		  const struct kv_stream_decl *b, uint32_t page_rows_b);

#endif
