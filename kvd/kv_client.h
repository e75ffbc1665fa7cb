/*
 * kv_client.h — the client side of kvd, linked into computed (and tests).
 *
 * kvd is format-agnostic (DESIGN.md section 3a): the client declares the
 * model's KV streams (row size in bytes; in this slice one row per token and
 * every row retained) and the page size in rows; kvd sizes the page pool from
 * its byte budget.  A sequence has a page table per stream; the client asks
 * for capacity (rows) in batches, then reads and writes rows straight in the
 * pool segment (/strata.<instance>.kv) through kv_client_row().
 *
 * Every call but kv_client_row is one request to kvd (serialised by a lock,
 * so a client may be shared by threads); kv_client_row reads the page table
 * in shared memory and sends nothing.  If kvd is restarted (even after
 * kill -9) it adopts the pool, and the client goes on: it registers again
 * under its old id when kvd no longer knows it.  If the pool itself is gone
 * (kvd stopped cleanly, then started again), the client drops its mapping
 * when a reply shows another pool (epoch or creation id, st_shm.h) and
 * maps the new pool at its next sequence request; its old sequences are
 * gone and row pointers taken before must not be used (the caller of such
 * a request must not run kv_client_row in another thread at the same
 * time).
 *
 * Prefix cache: a client that declared a model id (kv_client_declare_model)
 * creates sequences with kv_client_seq_create_prefix, which maps the full
 * pages another sequence of the same model computed from the same leading
 * token ids, and publishes its own full pages with kv_client_seq_publish
 * once their rows are written.  Mapped and published pages are read-only.
 *
 * Spill: when kvd runs with --spill-budget, pages of sequences that are not
 * pinned may be written to the spill file by any kvd request (of any
 * client) that needs room; their rows read NULL until the sequence is
 * restored.  A client pins the sequences it is computing
 * (kv_client_seq_pin, which also restores them) and unpins them when they
 * go idle; row pointers of an unpinned sequence must not be kept across
 * kvd requests.
 */
#ifndef KV_CLIENT_H
#define KV_CLIENT_H

#include <stdint.h>

#include "kv_pool.h"
#include "kv_proto.h"
#include "kv_session_proto.h"
#include "st_error.h"

struct kv_client;
struct kv_devpage;

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
	uint64_t epoch;          /* of the pool segment; 0 before DECLARE */
	uint64_t pool_id;        /* creation id of the pool (st_shm.h); 0
				  * before DECLARE */
	int32_t pid;             /* kvd's pid */
	uint32_t n_clients;      /* registered clients */
	uint32_t max_seqs;
	uint32_t max_rows_per_seq;
	/* prefix cache (counters since kvd started) */
	uint64_t pages_cached;       /* pages of unused cached groups, on host */
	uint64_t cache_groups;       /* published groups (on host + spilled) */
	uint64_t prefix_lookups;     /* kv_client_seq_create_prefix calls */
	uint64_t prefix_pages_hit;   /* page groups mapped from the cache */
	uint64_t prefix_rows_reused; /* rows those groups held */
	uint64_t prefix_published;   /* groups published */
	uint64_t cache_evictions;    /* groups dropped to make room */
	/* spill (totals since kvd started; pages on host = pages_used +
	 * pages_cached, page_bytes each) */
	uint64_t spill_budget_bytes;
	uint64_t slot_bytes;         /* bytes of one spilled page in the file */
	uint64_t n_slots;
	uint64_t pages_spilled;      /* in the spill file now */
	uint64_t spill_pages_total;
	uint64_t spill_bytes_total;
	uint64_t spill_ns_total;     /* time writing (and checksumming) */
	uint64_t restore_pages_total;
	uint64_t restore_bytes_total;
	uint64_t restore_ns_total;   /* time reading and verifying */
	uint64_t restore_failures;   /* pages that failed their checks */
	uint32_t spill_direct;       /* 1: the spill file uses O_DIRECT */
	uint32_t n_pinned;           /* sequences pinned as running */
	/* remote KV tier (kvd --remote-kv; counters since kvd started) */
	uint32_t remote_on;          /* 1 when kvd runs with the tier */
	uint64_t remote_hits;        /* page groups restored from it */
	uint64_t remote_misses;      /* lookups that found nothing there */
	uint64_t remote_bytes_in;    /* value bytes read from it */
	uint64_t remote_bytes_out;   /* value bytes written to it */
	uint64_t remote_errors;      /* failed calls and rejected values */
	uint64_t remote_published;   /* page groups written to it */
	uint64_t remote_rejected;    /* values that failed their checks */
	/* queued requests' prefixes (kv_client_prefix_ahead; since kvd
	 * started) */
	uint64_t prefix_ahead_groups;      /* groups restored ahead */
	uint64_t prefix_ahead_bytes;       /* their spill-file bytes */
	uint64_t prefix_lookup_restores;   /* groups a prefix lookup had to
					    * restore itself (its request
					    * waited) */
	uint64_t prefix_lookup_restore_ns; /* time those took */
};

/* Connects to kvd of the instance (run_dir), registers as `name` (at most
 * 32 printable characters).  timeout_ms bounds every request.  *ret owned
 * by the caller (kv_client_close).  Errors: -ST_E_PEERGONE (no kvd
 * answering), -ST_E_VERSION, -EINVAL. */
int kv_client_open(const char *run_dir, const char *instance, const char *name,
		   int timeout_ms, struct kv_client **ret, struct st_diag *diag);

/* Frees the client's sequences, says BYE, detaches.  NULL is fine. */
void kv_client_close(struct kv_client *c);

/*
 * Declares the streams: n_streams row sizes in bytes and rows per page
 * (one row per token, all rows kept).  The first declaration creates the
 * page pool; a later identical one attaches to it; a different one gets
 * -ST_E_CONFIG (another model is using this kvd).  Errors also: -ST_E_BUDGET
 * when the budget holds fewer pages than one page per stream (message names
 * the minimum budget); attaching: -ST_E_BADMAGIC, -ST_E_VERSION,
 * -ST_E_FORMAT with a message naming the segment.
 */
int kv_client_declare(struct kv_client *c, int n_streams,
		      const uint32_t *row_bytes, uint32_t page_rows,
		      struct st_diag *diag);

/* The same with full stream declarations (kv_pool.h): tokens per row
 * (1..KV_MAX_TOKENS_PER_ROW, else -ST_E_CONFIG: pages are by token, a
 * stream of T tokens per row holds ceil(page_rows / T) rows per page) and
 * retention (window_rows W, streams of one row per token only: a
 * reservation that grows a sequence frees its pages of rows before the
 * old n_rows - W unless shared or published, so write every reserved row
 * before reserving more) travel to kvd, which refuses flags != 0 with
 * -ST_E_UNSUPPORTED.  A sequence's n_rows (reserve, fork, prefix) always
 * counts tokens. */
int kv_client_declare_streams(struct kv_client *c, int n_streams,
			      const struct kv_stream_decl *streams,
			      uint32_t page_rows, struct st_diag *diag);

/*
 * kv_client_declare_streams plus the model whose rows the pages hold:
 * model_id (non-zero; computed passes its store id) is part of every
 * prefix-cache key, so two models never share pages.  Kept by the client
 * and sent with each prefix request.  Errors as kv_client_declare_streams;
 * -EINVAL for model_id 0.
 */
int kv_client_declare_model(struct kv_client *c, int n_streams,
			    const struct kv_stream_decl *streams,
			    uint32_t page_rows, uint64_t model_id,
			    struct st_diag *diag);

/* Creates an empty sequence; *ret_seq is its id (never 0).
 * -ST_E_LIMIT when kvd's --max-seqs sequences are live. */
int kv_client_seq_create(struct kv_client *c, uint32_t *ret_seq,
			 struct st_diag *diag);

/*
 * Batched: makes sequence seqs[i] hold at least n_rows[i] rows in every
 * stream (allocating pages as needed), all in one request (n at most
 * KV_PROTO_MAX_RESERVE, 16384).  Growing a sequence takes its rows so far
 * as written: a windowed stream's pages before them minus the window are
 * freed (kv_client_declare_streams).
 * Errors: -ST_E_BUDGET (pool exhausted: nothing of this request stays
 * allocated; diag names the budget to raise), -ST_E_LIMIT (more rows than a
 * sequence may hold), -ST_E_NOTFOUND, -EPERM (another client's sequence).
 */
int kv_client_seq_reserve(struct kv_client *c, int n, const uint32_t *seqs,
			  const uint32_t *n_rows, struct st_diag *diag);

/*
 * Forks `src` whose first n_rows rows are written: the child shares the
 * full pages (copy-on-write: reference counts) and gets a copy of the
 * partial last page.  *ret_dst is the child, holding n_rows rows (reserve
 * more before writing past its last page).  Errors: -ST_E_NOTFOUND,
 * -ST_E_LIMIT (n_rows more than src holds, or a windowed stream of src
 * already freed rows the child's window needs), -ST_E_BUDGET.
 */
int kv_client_seq_fork(struct kv_client *c, uint32_t src, uint32_t n_rows,
		       uint32_t *ret_dst, struct st_diag *diag);

/*
 * Cuts seq back to its first n_rows rows (speculative decoding: the rows
 * of rejected draft tokens are rolled back): its length becomes n_rows
 * and every page past the last row is freed; reserve again before writing
 * past it.  Errors: -ST_E_NOTFOUND, -EPERM (another client's sequence, or
 * rows at or past n_rows were published to the prefix cache),
 * -ST_E_LIMIT (n_rows more than it holds), -ST_E_UNSUPPORTED (the
 * declaration has a windowed stream), -ST_E_CHECKSUM (failed sequence).
 */
int kv_client_seq_truncate(struct kv_client *c, uint32_t seq,
			   uint32_t n_rows, struct st_diag *diag);

/* Frees a sequence and drops its page references.  -ST_E_NOTFOUND,
 * -EPERM. */
int kv_client_seq_free(struct kv_client *c, uint32_t seq);

/*
 * Creates a sequence for a prompt of n_ids token ids (n_ids >= 1; ids past
 * KV_PROTO_MAX_IDS are not sent): its first pages are the longest chain of
 * cached full-page groups of this model whose keys match the prompt,
 * mapped read-only.  *ret_n_cached is the number of rows already there: a
 * multiple of page_rows, at most n_ids - 1 (the last token is always
 * computed again, PITFALLS P10), and the sequence holds exactly that many
 * rows: reserve more and write rows from *ret_n_cached on.
 * With page_rows B: n_ids B-1 and B give at most 0, B+1 and 2B at most B,
 * 2B+1 at most 2B.  Errors: -EINVAL (no model id declared, n_ids 0),
 * -ST_E_LIMIT (max_seqs live), -ST_E_PEERGONE.
 */
int kv_client_seq_create_prefix(struct kv_client *c, const int32_t *ids,
				uint32_t n_ids, uint32_t *ret_seq,
				uint32_t *ret_n_cached, struct st_diag *diag);

/*
 * After rows [0, n_ids) of seq were written from these token ids: every
 * full page group (n_ids / page_rows of them) not yet cached becomes
 * findable by kv_client_seq_create_prefix of any client of the same model.
 * The sequence keeps using them; they are read-only from now on (writes go
 * past them: kvd copies a shared partial page before a reservation that
 * would write into it).  Returns the groups newly published (>= 0).
 * Errors: -EINVAL (no model id), -ST_E_NOTFOUND, -EPERM, -ST_E_LIMIT
 * (n_ids more than the sequence holds), -ST_E_CHECKSUM (failed sequence).
 */
int kv_client_seq_publish(struct kv_client *c, uint32_t seq,
			  const int32_t *ids, uint32_t n_ids,
			  struct st_diag *diag);
/* The same with KV_PUBLISH_F_* flags (kv_proto.h): KV_PUBLISH_F_PRIVATE
 * keeps the pages out of kvd's remote KV tier (--remote-kv).  Errors as
 * kv_client_seq_publish, and -ST_E_PROTO from a kvd that predates flags. */
int kv_client_seq_publish_flags(struct kv_client *c, uint32_t seq,
				const int32_t *ids, uint32_t n_ids,
				uint32_t flags, struct st_diag *diag);

/*
 * The prefix-cache keys a kv_client_seq_create_prefix of ids[0..n_ids)
 * would look up (kv_prefix_keys over the ids sent, (n - 1) / page_rows
 * full pages within a sequence's limits), at most cap of them, into
 * ret_keys.  Returns their count (0 before a declaration with a model id)
 * or -ENOMEM.  Thread-safe.
 */
int kv_client_prefix_keys(struct kv_client *c, const int32_t *ids,
			  uint32_t n_ids, uint64_t *ret_keys, uint32_t cap);

/*
 * Restore ahead of admission (issue 24): the prefix-cache chains of the
 * requests the client will admit next (chain_len[0..n_chains), keys in
 * chain order, from kv_client_prefix_keys).  kvd restores the spilled
 * groups among them in the background, after the sequences of a
 * kv_client_seq_restore_ahead and only into free pages and pages of idle
 * cached groups (never spilling a sequence's page), keeping the same
 * headroom free, and holds every group of the plan that is resident (a
 * reference per page) until this client's next call leaves it out or the
 * pool has no other room; a chain ends at its first key not cached.  Each
 * call replaces the client's earlier plan (n_chains 0: none).  Replies at
 * once: returns the groups held now (>= 0), *ret_spilled (may be NULL)
 * those being restored.  Errors: -ST_E_LIMIT (more than
 * KV_PROTO_MAX_AHEAD_KEYS keys), -ST_E_PROTO (a kvd that predates the
 * message: "unknown message type"), -ST_E_PEERGONE.
 */
int kv_client_prefix_ahead(struct kv_client *c, uint32_t n_chains,
			   const uint32_t *chain_len, const uint64_t *keys,
			   uint32_t *ret_spilled, struct st_diag *diag);

/*
 * Saved sessions (kvd/kv_session.h, kv_session_proto.h).  save: the
 * cached page groups of ids[0..n_ids) (a conversation whose rows were
 * published: kv_client_seq_publish) go to kvd's session file `name`,
 * stamped with `id` (model, store, KV dtype, page size, model id);
 * *ret_groups gets the groups saved (rows = groups x page_rows);
 * *ret_replaced (may be NULL) -1, or the rows of the session of that name
 * it replaced (0: that file was corrupt).
 * load: checks the whole file, refuses another model, store, KV dtype,
 * page size or declaration by name (-ST_E_CONFIG) and a corrupt file
 * (-ST_E_CHECKSUM, -ST_E_FORMAT; nothing used), then puts its groups in
 * the prefix cache: a kv_client_seq_create_prefix of a prompt starting with
 * *ret_ids (malloc'd, the caller frees; *ret_n_ids of them) maps
 * *ret_rows rows.  list: at most cap entries into ret (a corrupt file
 * or link listed with kv_session_info.bad set).  remove: deletes
 * it.  Names: kv_session_name_ok (-EINVAL otherwise).  Other errors:
 * -ST_E_NOTFOUND (no such session, or nothing cached to save),
 * -ST_E_PEERGONE, -errno of kvd's file I/O; diag says what.
 */
int kv_client_session_save(struct kv_client *c, const char *name,
			   const struct kv_session_ident *id,
			   const int32_t *ids, uint32_t n_ids,
			   uint32_t *ret_groups, int32_t *ret_replaced,
			   struct st_diag *diag);
int kv_client_session_load(struct kv_client *c, const char *name,
			   const struct kv_session_ident *id,
			   uint32_t *ret_placed, uint32_t *ret_rows,
			   int32_t **ret_ids, uint32_t *ret_n_ids,
			   struct st_diag *diag);
int kv_client_session_list(struct kv_client *c, uint32_t cap,
			   struct kv_session_info *ret, uint32_t *ret_n,
			   struct st_diag *diag);
int kv_client_session_remove(struct kv_client *c, const char *name,
			     struct st_diag *diag);

/*
 * Batched (n at most KV_PROTO_MAX_RESERVE): brings every spilled page of
 * seqs[i] back into the pool, each checked (length, owner, XXH3) before it
 * is used.  kv_client_seq_pin does the same and marks the sequences
 * running: kvd never spills their pages until kv_client_seq_unpin has
 * undone every pin (a count: two pins need two unpins).
 * ret_status (n entries, may be NULL) gets 0 or the code of each sequence:
 * -ST_E_CHECKSUM (a page of it was corrupt or lost: the sequence failed,
 * only kv_client_seq_free works on it; other sequences are untouched),
 * -ST_E_BUDGET (no room even after spilling others: nothing restored; the
 * message names --budget and --spill-budget), -ST_E_NOTFOUND, -EPERM.
 * Returns 0 when every sequence succeeded, else the first failure's code
 * with its message in diag.
 */
int kv_client_seq_restore(struct kv_client *c, int n, const uint32_t *seqs,
			  int32_t *ret_status, struct st_diag *diag);
int kv_client_seq_pin(struct kv_client *c, int n, const uint32_t *seqs,
		      int32_t *ret_status, struct st_diag *diag);
int kv_client_seq_unpin(struct kv_client *c, int n, const uint32_t *seqs,
			struct st_diag *diag);

/*
 * The restores above are done before kvd replies (and kvd serves nobody
 * else meanwhile).  To overlap them with compute, ask ahead:
 * kv_client_seq_prefetch queues the spilled pages of seqs for restoring in
 * the background (kvd does it a few MiB at a time between requests, only
 * into pages that are free: it never spills anything for a prefetch) and
 * replies at once; kv_client_seq_resident tells, from shared memory and
 * without a message, whether a sequence has all its pages in the pool.
 * kv_client_seq_pin remains the way to make sure (it restores what is
 * still missing).  Statuses and errors as kv_client_seq_restore, without
 * -ST_E_BUDGET.
 */
int kv_client_seq_prefetch(struct kv_client *c, int n, const uint32_t *seqs,
			   int32_t *ret_status, struct st_diag *diag);

/*
 * Restore ahead of the step (issue 24): seqs are the sequences the
 * client's next step will pin; kvd restores their spilled pages in the
 * background while the current step computes, and, unlike a prefetch, may
 * spill pages of other sequences to make room: never of a pinned sequence
 * (the current step's) nor of one queued ahead, and it keeps about 1/8 of
 * the pool free for the current step's reservations.  A sequence it
 * cannot make room for without those is given up (kv_client_seq_pin
 * restores it).  Each call replaces this client's earlier list; sequences
 * of the list already whole (or restored since) are kept from being
 * spilled for the others until then.  Replies at once; statuses and
 * errors as kv_client_seq_prefetch.
 */
int kv_client_seq_restore_ahead(struct kv_client *c, int n,
				const uint32_t *seqs, int32_t *ret_status,
				struct st_diag *diag);

/* 1 when every page of seq is in the pool, 0 when some are spilled,
 * -ST_E_CHECKSUM when the sequence failed, -ST_E_NOTFOUND. */
int kv_client_seq_resident(struct kv_client *c, uint32_t seq);

/*
 * Pointer to row `row` of `stream` of `seq` in the pool (row_bytes bytes;
 * `row` counts the stream's own rows: row r of a stream of T tokens per row
 * covers tokens [rT, rT + T) and lives in the page of token rT + T - 1),
 * or NULL when that row has no page, its page is spilled (restore first)
 * or seq is not a live sequence.  Valid until the sequence is freed, or,
 * for an unpinned sequence while kvd spills, until the next kvd request.
 * Writing is allowed only into pages this sequence does not share: rows at
 * or past the n_rows a fork or a prefix mapping was made at, and not in a
 * published page.  No message; safe from any thread.
 */
uint8_t *kv_client_row(struct kv_client *c, uint32_t seq, int stream,
		       uint32_t row);

/* kv_client_row for writing: NULL also when the row's page is shared
 * (refcount > 1) or published in the prefix cache. */
uint8_t *kv_client_row_writable(struct kv_client *c, uint32_t seq, int stream,
				uint32_t row);

/*
 * KV_MSG_SEQ_DEVICE (kv_devpage.h; used by computed/device/cw_kvdev.c): asks kvd
 * to copy rows [0, e[i].n_rows) of every stream of e[i].seq into the
 * device KV page pool computed exported.  ret_pages (cap entries, the
 * caller's) gets kv_client_device_pages(c, n, e) entries, in the order
 * entry, stream, page index; *ret_epoch the export epoch they belong to.
 * Errors: -ST_E_UNSUPPORTED (kvd has no device pool imported),
 * -ST_E_NOTFOUND, -EPERM, -ST_E_LIMIT (n_rows more than the sequence
 * holds, or more pages than one reply holds), -ST_E_PEERGONE, -ST_E_PROTO
 * (more entries than cap).
 */
int kv_client_seq_device(struct kv_client *c, int n,
			 const struct kv_reserve_entry *e, uint64_t *ret_epoch,
			 struct kv_devpage *ret_pages, uint64_t cap,
			 struct st_diag *diag);
/* Entries a SEQ_DEVICE reply for these requests holds: sum of n_streams x
 * ceil(n_rows / page_rows); 0 before a declaration. */
uint64_t kv_client_device_pages(const struct kv_client *c, int n,
				const struct kv_reserve_entry *e);

/* Rows reserved for seq (read from the pool), or a negative code. */
int64_t kv_client_seq_rows(struct kv_client *c, uint32_t seq);

/* Geometry after a declaration: rows per page, and row bytes of a stream
 * (0 when not declared / out of range). */
uint32_t kv_client_page_rows(const struct kv_client *c);
/* The prefix-cache model id declared (kv_client_declare_model; 0: none). */
uint64_t kv_client_model_id(const struct kv_client *c);
uint32_t kv_client_row_bytes(const struct kv_client *c, int stream);

/*
 * wait_ms > 0: a request that finds kvd dead waits up to wait_ms for a
 * restarted kvd (which adopts the pool: sequences and pages stay), says
 * HELLO again under the same client id (protocol version checked again:
 * a mismatch gives -ST_E_VERSION) and re-sends the request with its
 * request id (kvd recognises one it already carried out).  Waiting longer
 * gives -ST_E_PEERGONE with "kvd did not come back within N s; restart it
 * with `strata restart kvd`".  0 (the default): -ST_E_PEERGONE at once.
 */
void kv_client_set_restart_wait(struct kv_client *c, int wait_ms);

/*
 * Ends the restart wait: a call waiting for a restarted kvd (and any later
 * one) fails with -ST_E_PEERGONE ("kvd is gone and this process is
 * stopping") at its next check (within 50 ms).  Safe from any thread while
 * another waits (no lock taken); for a process that is stopping.  c may be
 * NULL.
 */
void kv_client_abort_wait(struct kv_client *c);

/* Times this client re-connected to a restarted kvd. */
uint32_t kv_client_reconnects(struct kv_client *c);

/* The client id kvd gave this client. */
uint32_t kv_client_id(const struct kv_client *c);

/* PING: kvd's pid and pool epoch.  0 or a negative code. */
int kv_client_ping(struct kv_client *c, int32_t *ret_pid,
		   uint64_t *ret_epoch);

int kv_client_stats(struct kv_client *c, struct kv_stats *ret);

/*
 * Tells kvd how many KV pages n_reqs queued requests of this client wait
 * for (0, 0: none) and how many its running requests may still take
 * (grow; KV_MSG_DEMAND): under a shared memory budget kvd weighs the
 * first as a gain of KV memory (kv_budget_wait_gain) and counts grow as
 * working set (kv_budget_loss).  kvd forgets it after
 * KV_DEMAND_STALE_NS (kv_daemon.h): send it again while it lasts.
 * Errors: -ST_E_PROTO (a kvd that predates the message), rpc's.
 */
int kv_client_demand(struct kv_client *c, uint64_t pages, uint32_t n_reqs,
		     uint64_t grow, struct st_diag *diag);

/* Asks kvd to exit cleanly (it removes the pool). */
int kv_client_shutdown(struct kv_client *c);

#endif
