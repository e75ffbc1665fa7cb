/*
 * kv_daemon.h — kvd's internals: the page pool logic (kv_pool.c), the
 * registry of clients (kv_clients.c) and the request server (kv_server.c).
 * kv_main.c parses options and runs the loop.
 *
 * The pool logic works on any memory laid out by kv_layout_compute (the
 * shared segment in kvd, a plain buffer in unit tests).  kvd is the only
 * writer of the pool's metadata and page tables (single-threaded loop); the
 * page reference functions are also safe under threads.
 */
#ifndef KV_DAEMON_H
#define KV_DAEMON_H

#include <pthread.h>
#include <stdint.h>

#include "kv_pool.h"
#include "kv_proto.h"
#include "kv_remote.h"
#include "st_error.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_numa.h"

struct st_ledger;

/* ---- the page pool (kv_pool.c) ----------------------------------------- */

/* Where a cached group is (kv_cache.c). */
enum kv_cg_where {
	KV_CG_FREE = 0,      /* group id unused */
	KV_CG_USED = 1,      /* resident, some page referenced by a sequence */
	KV_CG_IDLE = 2,      /* resident, unreferenced: on the resident LRU */
	KV_CG_SPILLED = 3,   /* in spill slots: on the spilled LRU */
	KV_CG_BUSY = 4,      /* being spilled or restored: not findable */
};

/*
 * The prefix-cache index, kvd's private memory (kv_cache.c): key -> group
 * of n_streams entries (page ids, or KV_PAGE_SPILLED | slot), two LRU lists
 * (idle resident groups, spilled groups; head = least recently used).
 * Guarded by kv_pool.lock, like the free page list.
 */
struct kv_cache {
	uint32_t n_max;          /* group ids */
	uint64_t *key;           /* [n_max] */
	uint32_t *ent;           /* [n_max * n_streams] */
	uint32_t *prev, *next;   /* LRU links */
	uint32_t *hnext;         /* hash chains */
	uint32_t *n_idle;        /* resident pages with refcount 0 */
	uint8_t *where;          /* enum kv_cg_where */
	uint32_t *buckets;
	uint32_t bucket_mask;
	uint32_t *free_ids;
	uint32_t n_free_ids;
	uint32_t *page_group;    /* [n_pages]: group of a keyed page */
	uint32_t lru_head[2], lru_tail[2]; /* [0] idle resident, [1] spilled */
	uint64_t n_groups;       /* in the index */
	uint64_t idle_pages;     /* pages of KV_CG_IDLE groups */
	uint64_t spilled_groups;
};

/* The spill file (kv_spill.c): kvd's private state; slot records are in
 * the segment. */
struct kv_spill {
	int fd;                  /* -1: spilling off */
	int direct;              /* O_DIRECT in use */
	char path[4200];
	struct kv_spill_slot *slots;
	uint32_t *free_slots;    /* stack, lowest slot on top */
	uint64_t n_free_slots;
	uint8_t *bounce;         /* KV_SPILL_IO_BYTES, 4 KiB aligned */
	/* the instance's I/O queue (st_ioq.h), NULL: none; owned (closed
	 * by kv_spill_close).  Writes are ST_IOQ_KV_SPILL, reads
	 * ST_IOQ_KV_RESTORE (a pin's and a restore ahead alike).  A write
	 * made while `background` is 0 (for a request: a client waits for
	 * the room) is as urgent as a restore; 1 (kvd's loop restoring ahead
	 * or prefetching between requests) the least urgent class. */
	struct st_ioq *ioq;
	int background;
};

/*
 * The prefix-cache groups of requests a client will admit soon
 * (KV_MSG_PREFIX_AHEAD, kv_cache_ahead.c): one entry per key, in chain
 * order; a group resident (found so, or restored ahead) is held: kvd keeps
 * one reference on each of its pages (pages[entry * n_streams ..]), so
 * that neither a restore ahead nor a step spills or evicts it before the
 * request's lookup maps it.  kvd's private memory: a restarted kvd has no
 * plan and no holds (adoption recounts references from the tables).
 */
struct kv_pfx_entry {
	uint64_t key;
	uint32_t client;
	uint8_t first;           /* first key of its chain */
	uint8_t state;           /* enum kv_pfx_state */
};

enum kv_pfx_state {
	KV_PFX_PENDING = 0,      /* spilled when named: to restore */
	KV_PFX_HELD = 1,         /* resident, referenced by the plan */
	KV_PFX_SKIPPED = 2,      /* not cached, given up or released */
};

struct kv_pfx_plan {
	struct kv_pfx_entry *v;
	uint32_t *pages;         /* [cap * n_streams] of HELD entries */
	uint32_t n, cap, n_pending;
	uint64_t held_pages;
};

/* Largest single read or write of the spill file. */
#define KV_SPILL_IO_BYTES (8u << 20)

/* Counters since kvd started (not kept across a restart). */
struct kv_pool_stats {
	_Atomic uint64_t prefix_lookups;
	_Atomic uint64_t prefix_pages_hit;   /* groups */
	_Atomic uint64_t prefix_rows_reused;
	_Atomic uint64_t prefix_published;   /* groups */
	_Atomic uint64_t cache_evictions;    /* groups dropped */
	uint64_t spill_pages_total;
	uint64_t spill_bytes_total;
	uint64_t spill_ns_total;
	uint64_t restore_pages_total;
	uint64_t restore_bytes_total;
	uint64_t restore_ns_total;
	uint64_t restore_failures;
	/* queued requests' prefixes (kv_cache_ahead.c) */
	uint64_t pfx_ahead_groups;       /* restored ahead */
	uint64_t pfx_lookup_restores;    /* restored by a lookup itself */
	uint64_t pfx_lookup_restore_ns;
	uint64_t pfx_released;           /* holds dropped for room */
};

struct kv_pool {
	uint8_t *base;                   /* mapping (borrowed) */
	size_t size;
	struct kv_layout lay;            /* validated private copy */
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	struct kv_pool_info *info;
	struct kv_page_meta *pages;
	struct kv_seq_entry *seqs;
	uint32_t *table;
	uint8_t *data;

	pthread_mutex_t lock;            /* free page list and cache index */
	uint32_t *free_pages;            /* stack of free page ids */
	uint64_t n_free;
	uint32_t *free_seqs;             /* stack of free sequence indices */
	uint32_t n_free_seqs;
	uint32_t *mark;                  /* per-seq scratch for batches */
	uint32_t mark_stamp;

	struct kv_cache cache;
	struct kv_pfx_plan pfx;          /* PREFIX_AHEAD (kv_cache_ahead.c) */
	struct kv_spill spill;
	struct kv_pool_stats stats;

	/* Called before kvd itself reads a page's bytes (spill, copy-on-write,
	 * prefix publish) so a newer copy elsewhere (device rows computed
	 * wrote, kv_devpool.h) reaches the host page first.  NULL: none. */
	void (*page_sync)(void *ctx, uint32_t page);
	void *page_sync_ctx;

	/* The remote KV tier (kv_remote.h), borrowed from kvd's server;
	 * NULL: off. */
	struct kv_remote *remote;

	/* Tests only (NULL in kvd): where a kill -9 may cut a spill's or a
	 * restore's bookkeeping.  Called with restore 0 (kv_pool_make_room)
	 * or 1 (kv_seq_restore_some) and step = 3 x entries done + 0 before
	 * the next entry, + 1 after its slot record (spill) or its table
	 * entry (restore), + 2 after its table entry (spill) or its slot's
	 * release (restore); nonzero stops right there with -ECANCELED,
	 * leaving segment and file as a killed kvd would. */
	int (*test_cut)(void *ctx, int restore, uint32_t step);
	void *test_cut_ctx;

	/* The memory target (kv_budget.c, --memory-budget): pages beyond
	 * allowed_pages + over_pages are never handed out (kv_page_alloc
	 * and kv_pool_make_room see them as taken).  allowed_pages is
	 * n_pages without a shared budget; over_pages are pages granted
	 * beyond it because a pinned sequence's step would have failed
	 * otherwise.  Written by kvd's thread under p->lock. */
	uint64_t allowed_pages;
	uint64_t over_pages;
	/* [n_pages]: 1 for a free page whose memory was given back to the
	 * OS (MADV_REMOVE); cleared when the page is allocated. */
	uint8_t *released;
	uint64_t n_released;
	uint64_t reserves;               /* kv_seq_reserve calls (steps) */
};

/* Pages held beyond which no page is handed out (p->lock held). */
static inline uint64_t kv_pool_limit_locked(const struct kv_pool *p)
{
	uint64_t lim = p->allowed_pages + p->over_pages;

	return lim < p->lay.n_pages ? lim : p->lay.n_pages;
}

/* Free pages an allocation may take now under the memory target
 * (p->lock held): the free list less the pages past the limit. */
static inline uint64_t kv_pool_free_locked(const struct kv_pool *p)
{
	uint64_t hidden = p->lay.n_pages - kv_pool_limit_locked(p);

	return p->n_free > hidden ? p->n_free - hidden : 0;
}

/* kv_pool.page_sync of page, when set. */
static inline void kv_pool_page_sync(struct kv_pool *p, uint32_t page)
{
	if (p->page_sync)
		p->page_sync(p->page_sync_ctx, page);
}

/* What kv_pool_adopt found and repaired. */
struct kv_adopt_report {
	uint32_t seqs_kept;
	uint32_t seqs_dropped;   /* half-built or invalid entries */
	uint32_t seqs_truncated; /* missing pages: rows cut back */
	uint32_t seqs_failed;    /* a spilled page's record was inconsistent */
	uint64_t entries_dropped;/* table entries past a sequence's rows */
	uint64_t refcounts_fixed;/* pages whose count disagreed with tables */
	uint64_t cache_groups;   /* prefix-cache groups rebuilt */
	uint64_t slots_kept;     /* spill slots still named by a table/group */
	uint64_t slots_freed;    /* spill slots no table or group names */
};

/*
 * Initialises a new pool in `base` (size bytes, zero-filled or not):
 * writes the layout, the declaration, empty metadata and tables (every
 * entry KV_PAGE_NONE), and builds the free lists.  Private memory of p is
 * owned by p (kv_pool_fini).  No spill file yet (kv_spill_open).
 * 0, -ENOMEM, -EINVAL (size too small).
 */
int kv_pool_format(struct kv_pool *p, void *base, size_t size,
		   const struct kv_layout *lay,
		   const struct kv_stream_decl *streams);

/*
 * Takes over a pool left by a killed kvd (PITFALLS P17) whose layout was
 * validated (kv_layout_read): keeps every LIVE sequence whose entry and
 * page table are consistent, drops half-built ones (KV_SEQ_BUILDING) and
 * invalid ones, cuts back sequences whose table misses pages, drops table
 * entries past a sequence's rows, recomputes every page's reference count
 * from the tables (they are the truth), rebuilds the prefix-cache index from
 * the page keys and the spill slot records, marks KV_SEQ_F_FAILED (entry
 * KV_PAGE_LOST) a sequence whose spilled entry names a slot whose record
 * does not match it, frees slots nothing names, and rebuilds the free lists
 * and counters.  0 or -ENOMEM.
 */
int kv_pool_adopt(struct kv_pool *p, void *base, size_t size,
		  const struct kv_layout *lay,
		  const struct kv_stream_decl *streams,
		  struct kv_adopt_report *ret);

/* Closes the spill file (kv_spill_close, keeping it) and frees p's private
 * memory (not the mapping).  Safe on a zeroed struct. */
void kv_pool_fini(struct kv_pool *p);

/*
 * Pages.  kv_page_alloc takes a free page for `stream` (evicting the least
 * recently used idle cached group when none is free): refcount 1, state
 * USED, generation bumped, key cleared; -ST_E_BUDGET when none is free.
 * kv_page_ref adds a reference to a used page and returns the new count;
 * -ST_E_STALE if the page has no reference (never resurrects one: only a
 * cache lookup revives a cached page).  kv_page_unref drops one and returns
 * the new count; at 0 the page goes back on the free list, or, when it
 * belongs to a cached group, stays as KV_PAGE_CACHED; -ST_E_STALE when it
 * is already 0 (the count never goes to -1).  Both -EINVAL for an id out of
 * range.  Thread-safe.
 */
int kv_page_alloc(struct kv_pool *p, uint32_t stream, uint32_t *ret_page);
int kv_page_ref(struct kv_pool *p, uint32_t page);
int kv_page_unref(struct kv_pool *p, uint32_t page);
/* Free pages now (not counting idle cached pages). */
uint64_t kv_pool_free_pages(struct kv_pool *p);
/* Pages an allocation can get without spilling: free + idle cached. */
uint64_t kv_pool_avail_pages(struct kv_pool *p);
/* First byte of a page (no check; page < n_pages). */
uint8_t *kv_page_data(const struct kv_pool *p, uint32_t page);

/*
 * Sequences (single writer).  `client` is the caller's client id and `pid`
 * its pid (recorded so that a restarted kvd can still release a dead
 * client's sequences).  `request_id` is recorded in the new sequence; with
 * `dedupe` set, a LIVE sequence of the same client made by the same
 * request id is returned again instead of a new one (a request re-sent to
 * a restarted kvd; the scan costs O(max_seqs), so kvd asks for it only for
 * clients it adopted from a killed kvd's pool).
 *
 * kv_seq_create: an empty sequence.  -ST_E_LIMIT when max_seqs are live.
 *
 * kv_seq_reserve: makes each seqs[i] hold at least n_rows[i] rows in every
 * stream, resident: spilled pages of these sequences are restored first,
 * and a partial last page that is shared or published (the sequence would
 * write into it) is copied first (copy-on-write).  Room is made by evicting
 * idle cached groups and spilling pages of idle sequences (not pinned, not
 * in this batch).  All or nothing for the allocation (on any error no page
 * of this call stays allocated and no sequence changes size).
 * -ST_E_NOTFOUND (stale or unknown handle), -EPERM (another client's
 * sequence), -ST_E_LIMIT (over max_rows_per_seq), -ST_E_BUDGET (not enough
 * pages even after spilling: diag names --budget / --spill-budget and how
 * far to raise it), -ST_E_CHECKSUM (a sequence failed: one of its spilled
 * pages was lost; diag names it).  Duplicated sequences in a batch take the
 * largest n_rows.
 *
 * kv_seq_fork: a new sequence with the first n_rows rows of src (any
 * client's; restored first when spilled): full pages shared (refcount + 1),
 * the partial last page copied (its first kv_last_page_rows rows).
 * -ST_E_NOTFOUND, -ST_E_LIMIT (n_rows more than src holds, or max_seqs
 * live), -ST_E_BUDGET (no free page for the copies), -ST_E_CHECKSUM.
 *
 * kv_seq_free: drops a sequence's references and spill slots.
 * -ST_E_NOTFOUND, -EPERM.
 * kv_seq_free_client: frees every sequence of a client; returns how many.
 *
 * kv_seq_truncate (kv_truncate.c): cuts a sequence back to n_rows rows
 * (at most what it holds; equal: nothing happens), giving back every page
 * past its last row (restored first when spilled).  Rolls back the rows
 * of rejected draft tokens (speculative decoding).  -ST_E_NOTFOUND,
 * -EPERM (another client's sequence, or a page at or past row n_rows
 * is published: a prefix-cache entry cannot be rolled back),
 * -ST_E_LIMIT (n_rows more than it holds), -ST_E_UNSUPPORTED (a windowed
 * stream: pages before the window are gone), -ST_E_CHECKSUM (failed
 * sequence), restore errors.
 */
int kv_seq_create(struct kv_pool *p, uint32_t client, int32_t pid,
		  uint64_t request_id, int dedupe, uint32_t *ret_seq,
		  struct st_diag *diag);
int kv_seq_reserve(struct kv_pool *p, uint32_t client, uint32_t n,
		   const struct kv_reserve_entry *e, struct st_diag *diag);
int kv_seq_fork(struct kv_pool *p, uint32_t client, int32_t pid,
		uint64_t request_id, int dedupe, uint32_t src, uint32_t n_rows,
		uint32_t *ret_seq, struct st_diag *diag);
int kv_seq_free(struct kv_pool *p, uint32_t client, uint32_t seq,
		struct st_diag *diag);
int kv_seq_free_client(struct kv_pool *p, uint32_t client);
int kv_seq_truncate(struct kv_pool *p, uint32_t client, uint32_t seq,
		    uint32_t n_rows, struct st_diag *diag);

/* Index of a valid LIVE handle, or -ST_E_NOTFOUND. */
int kv_seq_lookup(const struct kv_pool *p, uint32_t seq);
/*
 * The index of sequence seq for a residency request of client (restore,
 * pin, prefetch, restore ahead): >= 0, or -ST_E_NOTFOUND (unknown or
 * freed), -EPERM (another client's) or, with check_failed, -ST_E_CHECKSUM
 * (a spilled page of it was lost: the client must free it), each with a
 * message naming the sequence in diag (NULL: no message).
 */
int kv_seq_check_owned(const struct kv_pool *p, uint32_t seq,
		       uint32_t client, int check_failed,
		       struct st_diag *diag);
/* Table entry of (seq index, stream, page index): a page id, KV_PAGE_NONE,
 * KV_PAGE_LOST or KV_PAGE_SPILLED | slot. */
uint32_t kv_seq_page(const struct kv_pool *p, uint32_t idx, uint32_t stream,
		     uint32_t page_index);

/* Internal to kv_pool.c / kv_cache.c / kv_spill.c. */
uint32_t kv_table_get(const struct kv_pool *p, uint32_t idx, uint32_t stream,
		      uint32_t page_index);
void kv_table_set(struct kv_pool *p, uint32_t idx, uint32_t stream,
		  uint32_t page_index, uint32_t entry);
int kv_seq_take(struct kv_pool *p, uint32_t client, int32_t pid,
		uint64_t request_id, uint32_t parent, uint32_t state,
		struct st_diag *diag);
void kv_seq_release(struct kv_pool *p, uint32_t idx);
int kv_seq_find_request(const struct kv_pool *p, uint32_t client,
			uint64_t request_id);
void kv_seq_touch(struct kv_pool *p, uint32_t idx);
/* A new mark stamp: p->mark[2 * idx] == stamp marks idx as in the batch. */
uint32_t kv_mark_begin(struct kv_pool *p);
/* -ST_E_BUDGET with diag: `what` needs `need` more pages, `avail` are free
 * or can be made free; the advice names --spill-budget only when spilling
 * is off or the spill file has fewer free slots than are missing. */
int kv_budget_error(const struct kv_pool *p, uint64_t need, uint64_t avail,
		    const char *what, struct st_diag *diag);
/* -ST_E_BUDGET with diag: one sequence of `rows` rows needs `want` pages
 * per stream, more than the max_pages_per_seq one sequence may hold; says
 * how much the sequence needs and the option that raises the cap
 * (kvd --budget, or --max-rows-per-seq where that caps it).  A running
 * sequence is pinned, so the spill budget is never the remedy here. */
int kv_seq_cap_error(const struct kv_pool *p, uint32_t rows, uint32_t want,
		     struct st_diag *diag);

/* ---- prefix cache (kv_cache.c) ----------------------------------------- */

/* Private index for p's geometry (called by format / adopt). 0, -ENOMEM. */
int kv_cache_init(struct kv_pool *p);
void kv_cache_fini(struct kv_pool *p);

/*
 * A cached group's pages, referenced: when `key` names a resident group,
 * adds one reference to each of its pages (reviving idle ones), copies the
 * page ids to ret_pages[n_streams] and returns 1.  0 when the key is not
 * cached, 2 when it is cached but spilled (nothing referenced: see
 * kv_cache_restore_group).  Thread-safe.
 */
int kv_cache_acquire(struct kv_pool *p, uint64_t key, uint32_t *ret_pages);
/* kv_cache_acquire that brings a spilled group back first (batch stamp
 * `stamp`, room made as for a restore): 1 with the pages referenced, 0
 * when the key is not cached (or busy), or the restore's negative code
 * (the group is then dropped from the cache).  kvd's thread only. */
int kv_cache_acquire_resident(struct kv_pool *p, uint64_t key,
			      uint32_t stamp, uint32_t *ret_pages,
			      struct st_diag *diag);

/*
 * Publishes a group: pages[n_streams] (referenced, full, one per stream)
 * become findable under `key`.  1 when published, 0 when the key is
 * already cached (nothing changes: the other group stays), -EEXIST when a
 * page already belongs to a group under another key.  Thread-safe.
 */
int kv_cache_publish(struct kv_pool *p, uint64_t key, const uint32_t *pages);
/* kv_cache_publish without counting a publish (a group restored from the
 * remote tier, kv_remote.c).  Same returns. */
int kv_cache_insert(struct kv_pool *p, uint64_t key, const uint32_t *pages);

/* Drops the least recently used idle resident group (its pages go back on
 * the free list, their keys cleared: the key finds nothing any more).
 * 1 when one was dropped, 0 when there is none.  Thread-safe. */
int kv_cache_evict_lru(struct kv_pool *p);

/* Removes the group of `page` (if any) from the index: its pages keep their
 * references but lose the key; idle ones are freed.  Thread-safe. */
void kv_cache_forget_page(struct kv_pool *p, uint32_t page);

/* Internal (kv_pool.c, kv_spill.c): the locked eviction used by
 * kv_page_alloc; dropping the least recently used spilled group (returns
 * the slots it freed, 0 when there is none); taking the least recently
 * used idle group for a spill (KV_CG_BUSY, its pages in ret_pages;
 * UINT32_MAX when none); after its bytes reached slots[] (records written):
 * kv_cache_spilled frees its pages; kv_cache_unbusy puts a BUSY group back
 * where it was; kv_cache_restored makes a BUSY spilled group resident in
 * pages[] (each referenced once, by the caller); kv_cache_drop_busy drops
 * a BUSY group. */
int kv_cache_evict_lru_locked(struct kv_pool *p);
int kv_cache_drop_spilled_lru(struct kv_pool *p);
uint32_t kv_cache_take_idle_lru(struct kv_pool *p, uint32_t *ret_pages);
void kv_cache_spilled(struct kv_pool *p, uint32_t g, const uint32_t *slots);
void kv_cache_unbusy(struct kv_pool *p, uint32_t g);
void kv_cache_restored(struct kv_pool *p, uint32_t g, const uint32_t *pages);
void kv_cache_drop_busy(struct kv_pool *p, uint32_t g);

/* Called by kv_page_unref with p->lock held when a page of group g
 * reached refcount 0. */
void kv_cache_page_idle_locked(struct kv_pool *p, uint32_t page, uint32_t g);

/* Group of a key (p->lock held), or UINT32_MAX. */
uint32_t kv_cache_find_locked(const struct kv_pool *p, uint64_t key);

/* Adoption: rebuilds the index from page keys (pages whose refcount the
 * caller already set) and unclaimed slot records (claimed[slot] != 0 for
 * slots a sequence names); marks the slots groups use in claimed[] and sets
 * idle grouped pages to KV_PAGE_CACHED.  Returns the groups rebuilt. */
uint64_t kv_cache_rebuild(struct kv_pool *p, uint8_t *claimed);

/*
 * A new sequence for a prompt of n_ids token ids of model `model_id`: maps
 * the longest chain of cached groups whose keys (kv_prefix_keys) match the
 * prompt's full pages, at most (n_ids - 1) / page_rows of them so that at
 * least the last token is computed again (PITFALLS P10); spilled groups on
 * the chain are restored (verified).  *ret_n_cached = rows mapped (a
 * multiple of page_rows, the new sequence's n_rows).  Errors as
 * kv_seq_create; -EINVAL when model_id is 0.  A restore that fails ends the
 * chain there (a miss, not an error).
 */
int kv_seq_create_prefix(struct kv_pool *p, uint32_t client, int32_t pid,
			 uint64_t request_id, int dedupe, uint64_t model_id,
			 const int32_t *ids, uint32_t n_ids, uint32_t *ret_seq,
			 uint32_t *ret_n_cached, struct st_diag *diag);

/*
 * After the client wrote rows [0, n_ids) of seq from these ids: each full
 * page group [0, n_ids / page_rows) not yet cached is published under its
 * key and becomes read-only.  Stops at the first group that is not
 * resident.  Returns the groups newly published (0 or more).
 * -ST_E_NOTFOUND, -EPERM, -EINVAL (model_id 0), -ST_E_LIMIT (n_ids more
 * than the sequence holds), -ST_E_CHECKSUM (failed sequence).
 */
int kv_seq_publish(struct kv_pool *p, uint32_t client, uint32_t seq,
		   uint64_t model_id, const int32_t *ids, uint32_t n_ids,
		   struct st_diag *diag);
/* The same with KV_PUBLISH_F_* flags (kv_proto.h): the groups newly
 * published locally also go to the remote tier (p->remote) unless
 * KV_PUBLISH_F_PRIVATE is set and the tier does not share private
 * sequences (--remote-kv-share-private). */
int kv_seq_publish_flags(struct kv_pool *p, uint32_t client, uint32_t seq,
			 uint64_t model_id, const int32_t *ids, uint32_t n_ids,
			 uint32_t flags, struct st_diag *diag);

/* ---- queued requests' prefixes (kv_cache_ahead.c) ----------------------- */

/*
 * Replaces client's prefix plan with the chains of keys given
 * (chain_len[0..n_chains), keys in chain order): a key still held by the
 * client's earlier plan keeps its hold, the earlier plan's other holds are
 * dropped; along each chain, a resident group is held at once, a spilled
 * one queued for kv_pfx_ahead_step, and the chain ends at the first key
 * not cached (a lookup stops there too).  *ret_spilled / *ret_held get the
 * counts.  0 or -ENOMEM (the earlier plan is then dropped: nothing held).
 */
int kv_pfx_ahead_set(struct kv_pool *p, uint32_t client, uint32_t n_chains,
		     const uint32_t *chain_len, const uint64_t *keys,
		     uint32_t *ret_spilled, uint32_t *ret_held);

/*
 * Restores the first pending group of the plans (p->pfx.n_pending > 0),
 * into free pages and pages of idle cached groups only (spilled or
 * dropped, least recently used first; never a sequence's page), keeping
 * `head` pages of them available afterwards: when the pool has no such
 * room the group is given up, with the rest of its chain (the lookup
 * restores it).  A restored group is held.  Counted in
 * p->stats.pfx_ahead_groups.
 */
void kv_pfx_ahead_step(struct kv_pool *p, uint64_t head);

/* Drops client's plan and its holds (BYE, a dead client). */
void kv_pfx_ahead_drop_client(struct kv_pool *p, uint32_t client);

/* Drops every hold (entries become SKIPPED): what kv_pool_make_room does
 * before it would fail for lack of room, so that a plan never costs a
 * request its pages.  Returns the pages released (counted in
 * p->stats.pfx_released as groups). */
uint64_t kv_pfx_ahead_release_all(struct kv_pool *p);

/* Frees the plan's memory without touching references (pool going). */
void kv_pfx_ahead_fini(struct kv_pool *p);

/* ---- spill (kv_spill.c) ------------------------------------------------- */

/*
 * Opens the spill file of a pool with n_slots > 0 (no-op otherwise).  A
 * new pool (adopted 0) creates or truncates `path` and reserves
 * n_slots * slot_bytes; an adopted pool opens the existing file.  When
 * that file is gone (removed while no kvd held it: a cleaned /tmp or run
 * directory), the pages it held are lost: a new one is made, every
 * spilled entry becomes KV_PAGE_LOST (its sequence FAILED), spilled cached
 * groups are dropped, every slot is freed, and a warning says so, rather
 * than a checksum mismatch at each restore.  A file cut short keeps what
 * it holds; the pages past its end fail their checks when restored.
 * O_DIRECT when the filesystem allows it.  Builds the free slot list from
 * the slot records.  0, or a negative code with diag naming the file.
 */
int kv_spill_open(struct kv_pool *p, const char *path, int adopted,
		  struct st_diag *diag);
/* Closes the file; removes it when `remove_file`. */
void kv_spill_close(struct kv_pool *p, int remove_file);

/* Slots in use / free now. */
uint64_t kv_spill_used_slots(const struct kv_pool *p);

/*
 * Makes `need` pages free: evicts idle cached groups (spilling them when
 * they alone cover the need and slots are free), then spills pages of idle
 * sequences, least recently used first, never of pinned or failed ones or
 * of sequences marked in the current batch (p->mark stamp `stamp`, 0 =
 * none).  0, -ST_E_BUDGET (with diag naming --budget and --spill-budget) or
 * an I/O error of the spill file.
 */
int kv_pool_make_room(struct kv_pool *p, uint64_t need, uint32_t stamp,
		      const char *what, struct st_diag *diag);

/* Brings back every spilled page of sequence idx (room made as above,
 * batch marked with `stamp`), verifying each against its slot record.  A
 * page that fails marks the sequence KV_SEQ_F_FAILED (entry KV_PAGE_LOST)
 * and returns -ST_E_CHECKSUM naming the sequence, page and stream; the
 * other pages of the sequence stay restored.  0 when nothing was spilled.
 * -ST_E_BUDGET when no room can be made. */
int kv_seq_restore_idx(struct kv_pool *p, uint32_t idx, uint32_t stamp,
		       struct st_diag *diag);
/* The same for at most max_pages of its spilled pages (the first ones in
 * stream-major order). */
int kv_seq_restore_some(struct kv_pool *p, uint32_t idx, uint32_t stamp,
			uint32_t max_pages, struct st_diag *diag);

/*
 * SEQ_RESIDENCY for n sequences of `client`: KV_RESIDENCY_RESTORE brings
 * their pages back, PIN does the same and counts them running (never
 * spilled while the count is above 0), UNPIN drops one count.
 * ret_status[i] is 0 or the code of sequence i (-ST_E_NOTFOUND, -EPERM, -ST_E_CHECKSUM, -ST_E_BUDGET).
 * Returns 0 when all succeeded, else the first failure's code (its message
 * in diag).  Room for all restores is made first (all or nothing on
 * -ST_E_BUDGET).
 */
int kv_seq_residency(struct kv_pool *p, uint32_t client, uint32_t op,
		     uint32_t n, const uint32_t *seqs, int32_t *ret_status,
		     struct st_diag *diag);

/* Frees a slot named by a table entry or group (single writer). */
void kv_spill_slot_free(struct kv_pool *p, uint32_t slot);

/*
 * Restores one spilled cached group g (p->lock not held, group state
 * KV_CG_BUSY, taken off the spilled list by the caller) into fresh pages,
 * verifying every slot (key, stream, length, checksum); on success the
 * group is resident with every page referenced once (the caller's) and the
 * page ids are in ret_pages; on failure the group is dropped and a negative
 * code returned.
 */
int kv_cache_restore_group(struct kv_pool *p, uint32_t g, uint32_t stamp,
			   uint32_t *ret_pages, struct st_diag *diag);

/* ---- the memory target (kv_budget.c) ------------------------------------ */

/*
 * Under --memory-budget kvd's pages share host memory with expertd's
 * slots (st_ledger.h).  kv_pool_set_allowed sets the pages the pool may
 * hold (target bytes / page_bytes, at most n_pages) and trims over_pages
 * to what is still held beyond it and what pinned_pages (pinned now,
 * kv_budget_gauges) still need beyond it.  kv_pool_held_pages: pages not free
 * (sequences' and idle cached ones).
 *
 * kv_pool_shrink: frees pages until those held are at most the limit
 * (allowed + over): idle cached groups go to the spill file while it has
 * free slots, then pages of sequences neither pinned nor failed are
 * spilled (least recently used first, kv_pool_make_room), then idle
 * cached groups left are dropped.  Never a pinned page, never a spilled
 * page lost.  0, -ST_E_BUDGET (pinned or referenced pages alone exceed
 * the limit; nothing is spilled then) with diag, or a spill I/O error.
 *
 * kv_pool_make_room_pinned: kv_pool_make_room for a step of pinned
 * (running) sequences: when the room cannot be made within the limit but
 * can within the whole pool (the cap), the shortfall is granted as
 * over_pages (reported to the ledger as `over`) instead of failing.
 * kv_seq_reserve uses it for pinned sequences and, without a spill file,
 * for every sequence (none can leave the pool).
 *
 * kv_pool_release_free: when the pages not released are more than the
 * limit, gives the memory of every free page not yet released back to
 * the OS (madvise MADV_REMOVE of the whole 4 KiB pages of each run of free
 * pages; the segment is a tmpfs mapping), so that the pool's data holds
 * at most about the limit in RAM.  Returns the bytes released.  Pages
 * allocated again read zeros until written.
 */
void kv_pool_set_allowed(struct kv_pool *p, uint64_t pages,
			 uint64_t pinned_pages);
uint64_t kv_pool_held_pages(struct kv_pool *p);
int kv_pool_shrink(struct kv_pool *p, struct st_diag *diag);
int kv_pool_make_room_pinned(struct kv_pool *p, uint64_t need, uint32_t stamp,
			     const char *what, struct st_diag *diag);
uint64_t kv_pool_release_free(struct kv_pool *p);

/* What the pool holds, in pages (kv_budget_gauges). */
struct kv_budget_gauges {
	uint64_t held;     /* not free */
	uint64_t pinned;   /* resident pages of pinned sequences (of every
			    * sequence without a spill file) */
	uint64_t working;  /* all pages (resident or spilled) of sequences
			    * pinned, queued or used within recent_ns */
	uint64_t spilled;  /* spill slots in use (sequences' and cached) */
	uint64_t over;     /* over_pages */
};

/*
 * Fills *g at now_ns; queued[0..n_queued) are handles of sequences the
 * next steps will pin (kvd's restore-ahead queue).  Pages of a sequence =
 * pages_for_rows(n_rows) x n_streams (a windowed stream's dropped pages
 * counted too: an upper bound); pinned is clamped to held.  kvd's thread.
 */
void kv_budget_gauges(struct kv_pool *p, uint64_t now_ns, uint64_t recent_ns,
		      const uint32_t *queued, uint32_t n_queued,
		      struct kv_budget_gauges *g);

/*
 * The marginal value of KV memory (st_ledger_report's gain and loss, in ns
 * of stall per second of wall time per GiB, for `step` bytes):
 *
 *   R = restore ns per second of wall time, decayed: each update at dt ns
 *       after the last, R += (1 - exp(-dt / KV_BUDGET_DECAY_NS)) x
 *       (restore ns since the last update x 1e9 / dt - R); kvd's own
 *       restore timing (kv_pool_stats.restore_ns_total: sequences and
 *       spilled prefix groups, on demand and ahead).  The step rate
 *       (kv_seq_reserve calls per second) is decayed the same way.
 *   gain = R x min(1, step / S) / (step / GiB), S = spilled bytes (spill
 *       slots in use x page bytes): each GiB more keeps that share of the
 *       spilled working set resident; 0 when nothing is spilled.
 *   loss = 0 while target - step >= W (W = working pages x page bytes:
 *       running, queued and recently used sequences' pages: slack);
 *       else D x c x steps/s / (step / GiB), D = min(step, W - (target -
 *       step)) the bytes that would have to be spilled and restored every
 *       step, c = measured restore ns per byte (spill ns per byte before
 *       any restore); KV_BUDGET_LOSS_NO_SPILL when spilling is off or
 *       nothing was timed yet (W cannot be given up).
 *
 * Prefix-cache hits are counted (STATS prefix_pages_hit) but the
 * recompute time a hit saves is computed's, not measured by kvd: idle
 * cached pages add no value here (they go first when kvd shrinks).
 */
#define KV_BUDGET_DECAY_NS 5000000000ull  /* 5 s */
#define KV_BUDGET_MIN_DT_NS 1000000ull    /* updates closer are skipped */
#define KV_BUDGET_RECENT_NS 1000000000ull /* "recently used": 1 s */
#define KV_BUDGET_GIB 1073741824.0
#define KV_BUDGET_LOSS_NO_SPILL 1e15
/* a request waiting in a client's queue for KV pages (KV_MSG_DEMAND)
 * stalls the whole time: 1e9 ns per second each; KV_DEMAND_STALE_NS: a
 * client's demand not said again within it is forgotten (the client gone
 * or stuck) */
#define KV_BUDGET_WAIT_NS_PER_S 1e9
#define KV_DEMAND_STALE_NS 2000000000ull

struct kv_budget_obs {
	uint64_t now_ns;
	uint64_t restore_ns, restore_bytes; /* cumulative */
	uint64_t spill_ns, spill_bytes;     /* cumulative */
	uint64_t steps;                     /* cumulative reservations */
	uint64_t spilled_bytes;             /* S */
	uint64_t working_bytes;             /* W */
	uint64_t target;                    /* bytes */
	int can_spill;
};

struct kv_budget_rates {
	int primed;            /* the first update only records */
	uint64_t last_ns, restore_ns, steps;
	double restore_rate;   /* R, ns per s */
	double step_rate;      /* steps per s */
};

void kv_budget_rates_update(struct kv_budget_rates *r,
			    const struct kv_budget_obs *o);
double kv_budget_gain(const struct kv_budget_rates *r,
		      const struct kv_budget_obs *o, uint64_t step);
double kv_budget_loss(const struct kv_budget_rates *r,
		      const struct kv_budget_obs *o, uint64_t step);

/*
 * The gain of `step` bytes more for n_reqs requests waiting in clients'
 * queues for wait_bytes (D) of KV pages (spilling off: they wait rather
 * than fail, and kv_budget_gain is 0 as nothing is spilled), in the units
 * and the form of kv_budget_gain:
 *   gain = n_reqs x KV_BUDGET_WAIT_NS_PER_S x min(1, step / D)
 *          / (step / GiB)
 * the stall of the waiting requests, the share of it the step admits
 * (their pages in proportion), per GiB.  0 when nothing waits or step is
 * 0.  kv_ledger_tick reports kv_budget_gain + this.
 */
double kv_budget_wait_gain(uint64_t wait_bytes, uint32_t n_reqs,
			   uint64_t step);

/* ---- clients (kv_clients.c) -------------------------------------------- */

struct kv_client_entry {
	uint32_t id;
	int32_t pid;
	uint64_t start_ticks;            /* of pid (st_peer_check); 0 unknown */
	int pidfd;                       /* -1 when pidfd_open is unavailable
					  * or pid is no longer this client */
	char name[KV_PROTO_NAME_BYTES + 1];
	/* the last reply, re-sent for a repeated request (idempotence) */
	uint64_t last_request_id;
	uint16_t last_type;
	uint8_t *last_reply;
	size_t last_reply_len;
	int adopted;                     /* rebuilt from a killed kvd's pool */
	/* KV pages its queued requests wait for, how many requests, the
	 * pages its running requests may still take (KV_MSG_DEMAND), and
	 * when it said so (st_now_ns) */
	uint64_t demand_pages, demand_grow, demand_ns;
	uint32_t demand_reqs;
};

struct kv_clients {
	struct kv_client_entry *v;
	uint32_t n, cap;
	uint32_t next_id;
};

#define KV_MAX_CLIENTS 1024

/* Pages the registered clients' queued requests wait for, and in
 * *ret_reqs how many requests, in *ret_grow the pages their running
 * requests may still take (their KV_MSG_DEMAND said within
 * KV_DEMAND_STALE_NS of now). */
uint64_t kv_clients_demand(const struct kv_clients *cl, uint64_t now_ns,
			   uint32_t *ret_reqs, uint64_t *ret_grow);

/* Empty registry; ids start at a random value so that a client of an
 * earlier kvd is not mistaken for a new one. */
void kv_clients_init(struct kv_clients *cl);
/* Closes pidfds and frees everything. */
void kv_clients_fini(struct kv_clients *cl);

/*
 * Registers a client (pid and its start time, which together name one
 * process: st_peer_check; name).  resume_id != 0 asks for that id again
 * (a client re-registering after a kvd restart): granted when it is free
 * or already belongs to the same process.  *ret_id is the id.  0,
 * -ST_E_LIMIT (KV_MAX_CLIENTS registered), -ENOMEM.
 */
int kv_clients_add(struct kv_clients *cl, int32_t pid, uint64_t start_ticks,
		   const char *name, uint32_t resume_id, uint32_t *ret_id);
struct kv_client_entry *kv_clients_find(struct kv_clients *cl, uint32_t id);
void kv_clients_remove(struct kv_clients *cl, uint32_t id);
/* Ids are never handed out below this one again (kept in the pool). */
void kv_clients_bump_next(struct kv_clients *cl, uint32_t next_id);
/* True when the client's process has exited (pidfd or /proc), or its pid
 * now names a process of another start time. */
int kv_clients_dead(const struct kv_client_entry *e);
/* Keeps a copy of the reply to (request_id, type) of client e. */
void kv_clients_cache_reply(struct kv_client_entry *e, uint64_t request_id,
			    uint16_t type, const void *reply, size_t len);

/* ---- server (kv_server.c) ---------------------------------------------- */

struct kv_config {
	char instance[64];
	char run_dir[4096];
	uint64_t budget_bytes;
	int budget_given;                /* --budget on the command line */
	uint64_t memory_budget_bytes;    /* --memory-budget; 0: none */
	uint32_t max_seqs;
	uint32_t max_rows_per_seq;
	uint32_t test_proto_version;     /* tests: refuse HELLO as this one */
	uint64_t spill_budget_bytes;     /* 0: no spilling */
	char spill_file[4096];           /* "" = <run_dir>/kvd.spill */
	char session_dir[4096];          /* "" = sessions/ beside it */
	char numa[16];                   /* --numa text, "" = no binding */
	struct st_numa_policy numa_policy; /* resolved by main */
	struct kv_remote_config remote;  /* --remote-kv*: url "" = off */
};

struct kv_server {
	struct kv_config cfg;
	struct st_sock rep, pub;
	char ctl_path[4200], evt_path[4200];
	struct st_shm shm;
	int have_pool;
	struct kv_pool pool;
	uint64_t layout_hash;
	struct kv_clients clients;
	uint64_t last_reap_ns;
	int stop;                       /* SHUTDOWN received */
	int keep_pool;                  /* SHUTDOWN KEEP_POOL: leave it */
	/* sequences to restore in the background (KV_RESIDENCY_PREFETCH),
	 * a little between requests */
	uint32_t *prefetch;
	uint32_t n_prefetch, cap_prefetch;
	/* sequences to restore ahead of the step (KV_RESIDENCY_AHEAD,
	 * kv_ahead.c), a little between requests */
	struct kv_ahead_entry *ahead;
	uint32_t n_ahead, cap_ahead;
	uint32_t n_ahead_pending;       /* entries not yet done */
	int recv_timeout_ms;            /* current one of rep */
	struct kv_devpool *dev;         /* device KV pool (kv_devpool.h),
					 * NULL until computed exports one */
	struct kv_remote remote;        /* the remote KV tier; pool.remote
					 * points here when cfg.remote.url */
	int have_remote;
	/* --memory-budget (kv_budget_ledger.c); NULL: none */
	struct st_ledger *ledger;
	struct kv_budget_rates ledger_rates;
	uint64_t ledger_ns;             /* last tick */
	uint64_t ledger_warn_ns;        /* last "target not reached" */
};

/*
 * The shared memory budget (kv_budget_ledger.c).  kv_ledger_pool_budget:
 * the page data bytes the pool is made for (--memory-budget M, the cap,
 * when given, else --budget).  kv_ledger_join (the pool made or adopted):
 * joins the instance's ledger as ST_LEDGER_KV with floor = --budget when
 * given, else one sequence's pages (max_pages_per_seq in every stream);
 * cap = min(n_pages x page_bytes, M); unit = page_bytes; sets the pool's
 * allowed pages from the target.  0 (nothing without --memory-budget),
 * -ST_E_CONFIG (floor above cap) or st_ledger_open's codes, with diag.
 * kv_ledger_tick (each loop turn; acts every 20 ms): the arbiter when due,
 * then the target obeyed (kv_pool_set_allowed, kv_pool_shrink,
 * kv_pool_release_free) and the gauges and values reported.
 * kv_ledger_leave: closes the ledger (its target kept for a successor).
 */
struct kv_config;
uint64_t kv_ledger_pool_budget(const struct kv_config *cfg);
int kv_ledger_join(struct kv_server *s, struct st_diag *diag);
void kv_ledger_tick(struct kv_server *s, uint64_t now_ns);
void kv_ledger_leave(struct kv_server *s);

/* Pages restored in the background per loop turn (at most). */
#define KV_PREFETCH_STEP_BYTES (32u << 20)

/*
 * Restores ahead of the step (kv_ahead.c; KV_RESIDENCY_AHEAD): the queue
 * of sequences a client's next step will pin.  kv_ahead_queue replaces
 * `client`'s queued sequences with seqs[0..n) (those with no spilled page
 * are queued done: kept from being spilled for the others); status[i]
 * gets 0 or the code of sequence i (-ST_E_NOTFOUND, -EPERM,
 * -ST_E_CHECKSUM); returns the first failure's code (message in diag) or
 * 0.  kv_ahead_step restores up to 4 MiB of the first pending sequence
 * (s->n_ahead_pending > 0), spilling pages of sequences neither pinned nor
 * queued to make room and keeping a headroom of the pool free; a sequence
 * is done when whole, gone, failed, or when no room can be made (its pin
 * restores it), and stays queued (protected) until the client's next
 * request.  kv_ahead_fini frees the queue.
 */
struct kv_ahead_entry {
	uint32_t seq;
	uint32_t client;
	int done;       /* restored (or given up); kept as part of the plan */
};

int kv_ahead_queue(struct kv_server *s, uint32_t client, uint32_t n,
		   const uint32_t *seqs, int32_t *status, struct st_diag *diag);
void kv_ahead_step(struct kv_server *s);

/* Pages a restore ahead leaves free for the current step
 * (kv_ahead_headroom_pages) of the pages the pool may hold now: its
 * target's under a shared memory budget.  Takes p->lock. */
uint64_t kv_ahead_headroom(struct kv_pool *p);
void kv_ahead_fini(struct kv_server *s);

/*
 * Starts kvd: adopts the pool segment of a killed kvd if one is there
 * (refusing to start, -EBUSY, when its owner lives), binds the sockets.
 * 0 or negative with diag.
 */
int kv_server_start(struct kv_server *s, const struct kv_config *cfg,
		    struct st_diag *diag);

/* Serves at most one request (waiting up to 100 ms for it), then, every
 * ~100 ms, releases the sequences of clients that died.  Returns 1 once a
 * SHUTDOWN was served, else 0. */
int kv_server_poll(struct kv_server *s);

/* Clean stop: event, sockets and their files, the segment. */
void kv_server_stop(struct kv_server *s);

#endif
