/*
 * kv_pool.c — kvd's page pool: page allocation with reference counts,
 * per-sequence page tables, batched all-or-nothing reservation (with
 * copy-on-write of a shared partial last page), fork with shared full
 * pages, and adoption of a pool left by a killed kvd.  The prefix cache is
 * in kv_cache.c, spilling in kv_spill.c.  See kv_daemon.h for the contracts
 * and kv_pool.h for the layout.
 *
 * Invariants (checked and restored by kv_pool_adopt):
 *  - a LIVE sequence with n_rows rows has exactly kv_pages_for_rows(n_rows,
 *    page_rows) entries in every stream, at table positions [0, that), each
 *    a page, a spilled slot or KV_PAGE_LOST (then the sequence is FAILED),
 *    and KV_PAGE_NONE after them; except that the first
 *    kv_window_dead_pages(n_rows) positions of a windowed stream may be
 *    KV_PAGE_NONE (freed out of the window); a FREE sequence has no entry
 *    at all;
 *  - a page's refcount is the number of table entries naming it; a page
 *    with refcount 0 is on the free list, or KV_PAGE_CACHED in an idle
 *    cached group; n_spilled of a sequence counts its spilled entries;
 *  - a USED spill slot is named by exactly one table entry or one spilled
 *    cached group.
 *
 * Reference counts, thread-safe: 1 -> 0 and n -> n +/- 1 (n >= 1) are
 * lock-free compare-and-swaps; 0 -> 1 (allocation, a cache hit reviving a
 * page) and the state change after reaching 0 happen under p->lock, where
 * "refcount 0 and state USED" means "pending", so the transition runs
 * exactly once whoever takes the lock first.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "st_util.h"

uint32_t kv_table_get(const struct kv_pool *p, uint32_t idx, uint32_t stream,
		      uint32_t page_index)
{
	return __atomic_load_n(&p->table[kv_table_index(&p->lay, idx, stream,
							page_index)],
			       __ATOMIC_ACQUIRE);
}

void kv_table_set(struct kv_pool *p, uint32_t idx, uint32_t stream,
		  uint32_t page_index, uint32_t entry)
{
	__atomic_store_n(&p->table[kv_table_index(&p->lay, idx, stream,
						  page_index)],
			 entry, __ATOMIC_RELEASE);
}

static inline uint32_t *table_at(const struct kv_pool *p, uint32_t idx,
				 uint32_t stream, uint32_t page_index)
{
	return &p->table[kv_table_index(&p->lay, idx, stream, page_index)];
}

static inline uint32_t table_load(const struct kv_pool *p, uint32_t idx,
				  uint32_t stream, uint32_t page_index)
{
	return __atomic_load_n(table_at(p, idx, stream, page_index),
			       __ATOMIC_ACQUIRE);
}

static inline void table_store(struct kv_pool *p, uint32_t idx,
			       uint32_t stream, uint32_t page_index,
			       uint32_t page)
{
	__atomic_store_n(table_at(p, idx, stream, page_index), page,
			 __ATOMIC_RELEASE);
}

/* Points p at the regions of the segment and allocates the private lists. */
static int pool_bind(struct kv_pool *p, void *base, size_t size,
		     const struct kv_layout *lay,
		     const struct kv_stream_decl *streams)
{
	memset(p, 0, sizeof(*p));
	if (size < lay->total_bytes || lay->n_streams > KV_MAX_STREAMS)
		return -EINVAL;
	p->base = base;
	p->size = size;
	p->lay = *lay;
	memcpy(p->streams, streams, lay->n_streams * sizeof(*streams));
	p->info = (struct kv_pool_info *)(p->base + KV_POOL_INFO_OFF);
	p->pages = (struct kv_page_meta *)(p->base + lay->pages_off);
	p->seqs = (struct kv_seq_entry *)(p->base + lay->seqs_off);
	p->table = (uint32_t *)(p->base + lay->table_off);
	p->data = p->base + lay->data_off;
	p->spill.fd = -1;
	p->spill.slots = (struct kv_spill_slot *)(p->base + lay->slots_off);
	p->free_pages = malloc(sizeof(uint32_t) * (lay->n_pages ? lay->n_pages : 1));
	p->free_seqs = malloc(sizeof(uint32_t) * lay->max_seqs);
	p->mark = calloc(lay->max_seqs, sizeof(uint32_t) * 2);
	p->released = calloc(lay->n_pages ? lay->n_pages : 1, 1);
	p->allowed_pages = lay->n_pages;
	pthread_mutex_init(&p->lock, NULL);
	if (!p->free_pages || !p->free_seqs || !p->mark || !p->released ||
	    kv_cache_init(p) < 0) {
		kv_pool_fini(p);
		return -ENOMEM;
	}
	return 0;
}

void kv_pool_fini(struct kv_pool *p)
{
	if (!p)
		return;
	kv_spill_close(p, 0);
	kv_pfx_ahead_fini(p);
	kv_cache_fini(p);
	free(p->free_pages);
	free(p->free_seqs);
	free(p->mark);
	free(p->released);
	if (p->base)
		pthread_mutex_destroy(&p->lock);
	memset(p, 0, sizeof(*p));
	p->spill.fd = -1;
}

static void peak_update(struct kv_pool *p, uint64_t used)
{
	uint64_t peak = atomic_load(&p->info->counters.pages_peak);

	while (used > peak &&
	       !atomic_compare_exchange_weak(&p->info->counters.pages_peak,
					     &peak, used))
		;
}

int kv_pool_format(struct kv_pool *p, void *base, size_t size,
		   const struct kv_layout *lay,
		   const struct kv_stream_decl *streams)
{
	int r = pool_bind(p, base, size, lay, streams);

	if (r < 0)
		return r;
	memset(p->info, 0, sizeof(*p->info));
	memcpy(&p->info->layout, lay, sizeof(*lay));
	memcpy(p->base + lay->streams_off, streams,
	       lay->n_streams * sizeof(*streams));
	memset(p->pages, 0, lay->n_pages * sizeof(*p->pages));
	memset(p->seqs, 0, (size_t)lay->max_seqs * sizeof(*p->seqs));
	memset(p->table, 0xff, (size_t)lay->max_seqs * lay->n_streams *
				       lay->max_pages_per_seq * sizeof(uint32_t));
	memset(p->spill.slots, 0, lay->n_slots * sizeof(struct kv_spill_slot));
	/* Stacks: the lowest id on top, so pages are handed out in order. */
	for (uint64_t i = 0; i < lay->n_pages; i++)
		p->free_pages[i] = (uint32_t)(lay->n_pages - 1 - i);
	p->n_free = lay->n_pages;
	for (uint32_t i = 0; i < lay->max_seqs; i++)
		p->free_seqs[i] = lay->max_seqs - 1 - i;
	p->n_free_seqs = lay->max_seqs;
	return 0;
}

/* ---- pages ------------------------------------------------------------- */

int kv_page_alloc(struct kv_pool *p, uint32_t stream, uint32_t *ret_page)
{
	struct kv_page_meta *m;
	uint32_t id;
	uint64_t used;

	if (stream >= p->lay.n_streams)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	/* under a memory target one group may not be enough */
	while (kv_pool_free_locked(p) == 0 && kv_cache_evict_lru_locked(p))
		;
	if (kv_pool_free_locked(p) == 0) {
		pthread_mutex_unlock(&p->lock);
		return -ST_E_BUDGET;
	}
	id = p->free_pages[--p->n_free];
	if (p->released[id]) {
		p->released[id] = 0;
		p->n_released--;
	}
	m = &p->pages[id];
	m->stream = stream;
	atomic_store(&m->key, 0);
	atomic_fetch_add(&m->generation, 1);
	atomic_store(&m->state, KV_PAGE_USED);
	/* 0 -> 1 under the lock: a late "pending" check of an old
	 * reference holder (see the top of this file) sees 1 and leaves it */
	atomic_store_explicit(&m->refcount, 1, memory_order_release);
	pthread_mutex_unlock(&p->lock);
	used = atomic_fetch_add(&p->info->counters.pages_used, 1) + 1;
	peak_update(p, used);
	*ret_page = id;
	return 0;
}

int kv_page_ref(struct kv_pool *p, uint32_t page)
{
	struct kv_page_meta *m;
	uint32_t c;

	if (page >= p->lay.n_pages)
		return -EINVAL;
	m = &p->pages[page];
	c = atomic_load(&m->refcount);
	do {
		if (c == 0)
			return -ST_E_STALE;
		if (c == UINT32_MAX)
			return -ST_E_LIMIT;
	} while (!atomic_compare_exchange_weak(&m->refcount, &c, c + 1));
	if (c == 1)
		atomic_fetch_add(&p->info->counters.pages_shared, 1);
	return (int)(c + 1 > INT32_MAX ? INT32_MAX : c + 1);
}

/* The page reached refcount 0 (p->lock held): free it, or keep it as an
 * idle page of its cached group.  Runs once per "pending" state. */
static void page_zero_locked(struct kv_pool *p, uint32_t page)
{
	struct kv_page_meta *m = &p->pages[page];
	uint32_t g = p->cache.page_group[page];

	if (atomic_load(&m->refcount) != 0 ||
	    atomic_load(&m->state) != KV_PAGE_USED)
		return; /* revived, or another holder did it already */
	if (g != UINT32_MAX) {
		atomic_store(&m->state, KV_PAGE_CACHED);
		kv_cache_page_idle_locked(p, page, g);
		return;
	}
	atomic_store(&m->state, KV_PAGE_FREE);
	atomic_store(&m->key, 0);
	p->free_pages[p->n_free++] = page;
}

int kv_page_unref(struct kv_pool *p, uint32_t page)
{
	struct kv_page_meta *m;
	uint32_t c;

	if (page >= p->lay.n_pages)
		return -EINVAL;
	m = &p->pages[page];
	c = atomic_load(&m->refcount);
	do {
		if (c == 0)
			return -ST_E_STALE;
	} while (!atomic_compare_exchange_weak(&m->refcount, &c, c - 1));
	if (c == 2)
		atomic_fetch_sub(&p->info->counters.pages_shared, 1);
	if (c == 1) {
		atomic_fetch_sub(&p->info->counters.pages_used, 1);
		pthread_mutex_lock(&p->lock);
		page_zero_locked(p, page);
		pthread_mutex_unlock(&p->lock);
	}
	return (int)(c - 1 > INT32_MAX ? INT32_MAX : c - 1);
}

uint64_t kv_pool_free_pages(struct kv_pool *p)
{
	uint64_t n;

	pthread_mutex_lock(&p->lock);
	n = kv_pool_free_locked(p);
	pthread_mutex_unlock(&p->lock);
	return n;
}

uint64_t kv_pool_avail_pages(struct kv_pool *p)
{
	uint64_t n, held;

	pthread_mutex_lock(&p->lock);
	/* idle cached pages count once the pages over the limit went */
	n = kv_pool_limit_locked(p) + p->cache.idle_pages;
	held = p->lay.n_pages - p->n_free;
	n = n > held ? n - held : 0;
	pthread_mutex_unlock(&p->lock);
	return n;
}

uint8_t *kv_page_data(const struct kv_pool *p, uint32_t page)
{
	return p->data + (uint64_t)page * p->lay.page_bytes;
}

/* ---- sequences --------------------------------------------------------- */

int kv_seq_lookup(const struct kv_pool *p, uint32_t seq)
{
	uint32_t idx = kv_seq_index(seq), gen = kv_seq_gen(seq);
	const struct kv_seq_entry *e;

	if (idx >= p->lay.max_seqs || gen == 0)
		return -ST_E_NOTFOUND;
	e = &p->seqs[idx];
	if (atomic_load(&e->state) != KV_SEQ_LIVE ||
	    atomic_load(&e->generation) != gen)
		return -ST_E_NOTFOUND;
	return (int)idx;
}

int kv_seq_check_owned(const struct kv_pool *p, uint32_t seq,
		       uint32_t client, int check_failed,
		       struct st_diag *diag)
{
	int idx = kv_seq_lookup(p, seq);

	if (idx < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND, "sequence 0x%x is "
				   "unknown or was freed", seq);
	if (p->seqs[idx].owner_client != client)
		return st_diag_set(diag, -EPERM, "sequence 0x%x belongs to "
				   "another client", seq);
	if (check_failed &&
	    (atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED))
		return st_diag_set(diag, -ST_E_CHECKSUM, "sequence 0x%x "
				   "failed earlier (a spilled page of it was "
				   "lost); free it", seq);
	return idx;
}

uint32_t kv_seq_page(const struct kv_pool *p, uint32_t idx, uint32_t stream,
		     uint32_t page_index)
{
	if (idx >= p->lay.max_seqs || stream >= p->lay.n_streams ||
	    page_index >= p->lay.max_pages_per_seq)
		return KV_PAGE_NONE;
	return table_load(p, idx, stream, page_index);
}

static uint32_t seq_handle(const struct kv_pool *p, uint32_t idx)
{
	return kv_seq_handle(idx, atomic_load(&p->seqs[idx].generation));
}

void kv_seq_touch(struct kv_pool *p, uint32_t idx)
{
	atomic_store(&p->seqs[idx].last_use_ns, st_now_ns());
}

uint32_t kv_mark_begin(struct kv_pool *p)
{
	if (++p->mark_stamp == 0) {
		memset(p->mark, 0, sizeof(uint32_t) * 2 * p->lay.max_seqs);
		p->mark_stamp = 1;
	}
	return p->mark_stamp;
}

int kv_seq_find_request(const struct kv_pool *p, uint32_t client,
			uint64_t request_id)
{
	if (!request_id)
		return -1;
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		const struct kv_seq_entry *e = &p->seqs[i];

		if (atomic_load(&e->state) == KV_SEQ_LIVE &&
		    e->owner_client == client && e->request_id == request_id)
			return (int)i;
	}
	return -1;
}

int kv_seq_take(struct kv_pool *p, uint32_t client, int32_t pid,
		uint64_t request_id, uint32_t parent, uint32_t state,
		struct st_diag *diag)
{
	struct kv_seq_entry *e;
	uint32_t idx, gen;

	if (p->n_free_seqs == 0)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "all %u sequences are in use; raise "
				   "--max-seqs or free some", p->lay.max_seqs);
	idx = p->free_seqs[--p->n_free_seqs];
	e = &p->seqs[idx];
	gen = atomic_load(&e->generation) % KV_SEQ_GEN_MAX + 1;
	e->owner_client = client;
	e->owner_pid = pid;
	/* (pid, start) names the owner even after a kvd restart, when a
	 * reused pid would otherwise keep its sequences for good */
	if (st_pid_start_ticks(pid, &e->owner_start) < 0)
		e->owner_start = 0;
	e->parent = parent;
	e->request_id = request_id;
	e->n_spilled = 0;
	atomic_store(&e->pins, 0);
	atomic_store(&e->flags, 0);
	atomic_store(&e->last_use_ns, st_now_ns());
	atomic_store(&e->n_rows, 0);
	atomic_store(&e->generation, gen);
	atomic_store_explicit(&e->state, state, memory_order_release);
	return (int)idx;
}

void kv_seq_release(struct kv_pool *p, uint32_t idx)
{
	struct kv_seq_entry *e = &p->seqs[idx];
	uint32_t was = atomic_exchange(&e->state, KV_SEQ_FREE);

	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = 0; pi < p->lay.max_pages_per_seq; pi++) {
			uint32_t ent = table_load(p, idx, s, pi);

			if (ent == KV_PAGE_NONE)
				continue; /* also a windowed stream's head */
			table_store(p, idx, s, pi, KV_PAGE_NONE);
			if (kv_entry_is_spilled(ent))
				kv_spill_slot_free(p, kv_entry_slot(ent));
			else if (ent < p->lay.n_pages)
				kv_page_unref(p, ent);
		}
	atomic_store(&e->n_rows, 0);
	atomic_store(&e->flags, 0);
	e->n_spilled = 0;
	e->request_id = 0;
	if (was == KV_SEQ_LIVE)
		atomic_fetch_sub(&p->info->counters.n_seqs, 1);
	p->free_seqs[p->n_free_seqs++] = idx;
}

int kv_seq_create(struct kv_pool *p, uint32_t client, int32_t pid,
		  uint64_t request_id, int dedupe, uint32_t *ret_seq,
		  struct st_diag *diag)
{
	int idx = dedupe ? kv_seq_find_request(p, client, request_id) : -1;

	if (idx < 0) {
		idx = kv_seq_take(p, client, pid, request_id, 0, KV_SEQ_LIVE,
				  diag);
		if (idx < 0)
			return idx;
		atomic_fetch_add(&p->info->counters.n_seqs, 1);
	}
	*ret_seq = seq_handle(p, (uint32_t)idx);
	return 0;
}

int kv_budget_error(const struct kv_pool *p, uint64_t need, uint64_t avail,
		    const char *what, struct st_diag *diag)
{
	char b1[32], b2[32], b3[32], spill[320] = "";
	uint64_t missing = need > avail ? need - avail : 0;
	uint64_t more = missing * p->lay.page_bytes;
	uint64_t want = p->lay.budget_bytes + more;
	/* raising the spill budget helps only when spilling is off or the
	 * spill file is short of slots; with free slots the pages are held
	 * by pinned (running) sequences, which never spill */
	int spill_helps = !p->lay.n_slots || p->spill.n_free_slots < missing;

	if (p->lay.n_slots) {
		uint64_t pinned = 0;

		for (uint32_t i = 0; i < p->lay.max_seqs; i++)
			if (atomic_load(&p->seqs[i].state) == KV_SEQ_LIVE &&
			    (atomic_load(&p->seqs[i].flags) & KV_SEQ_F_PINNED))
				pinned++;
		snprintf(spill, sizeof(spill),
			 " (%llu sequences are pinned as running and never "
			 "spilled; the spill file has %llu of %llu slots "
			 "free: kvd --spill-budget %s)",
			 (unsigned long long)pinned,
			 (unsigned long long)p->spill.n_free_slots,
			 (unsigned long long)p->lay.n_slots,
			 st_format_bytes(p->lay.spill_budget_bytes, b3,
					 sizeof(b3)));
	} else {
		snprintf(spill, sizeof(spill),
			 " (spilling is off: kvd --spill-budget 0)");
	}
	if (kv_pool_limit_locked(p) < p->lay.n_pages)
		/* under a shared memory budget (kv_budget.c): only a
		 * pinned sequence's step goes over the target */
		return st_diag_set(diag, -ST_E_BUDGET,
				   "KV pool exhausted: %s needs %llu more "
				   "pages of %llu bytes, %llu are free or can "
				   "be made free%s; the shared memory budget "
				   "gives kv %llu of the pool's %llu pages now "
				   "(the rest is expertd's): raise "
				   "--memory-budget, or the KV floor (kvd "
				   "--budget, strata --kv-budget), %sor free "
				   "or unpin sequences", what,
				   (unsigned long long)need,
				   (unsigned long long)p->lay.page_bytes,
				   (unsigned long long)avail, spill,
				   (unsigned long long)kv_pool_limit_locked(p),
				   (unsigned long long)p->lay.n_pages,
				   spill_helps ? "raise kvd --spill-budget "
				   "(strata: --kv-spill-budget), " : "");
	return st_diag_set(diag, -ST_E_BUDGET,
			   "KV pool exhausted: %s needs %llu more pages of "
			   "%llu bytes, %llu are free or can be made free%s; "
			   "the KV budget of %s holds %llu pages: raise kvd "
			   "--budget (strata: --kv-budget) to at least %llu "
			   "bytes (%s), %sor free or unpin sequences", what,
			   (unsigned long long)need,
			   (unsigned long long)p->lay.page_bytes,
			   (unsigned long long)avail, spill,
			   st_format_bytes(p->lay.budget_bytes, b1, sizeof(b1)),
			   (unsigned long long)p->lay.n_pages,
			   (unsigned long long)want,
			   st_format_bytes(want, b2, sizeof(b2)),
			   spill_helps ? "raise kvd --spill-budget (strata: "
			   "--kv-spill-budget), " : "");
}

int kv_seq_cap_error(const struct kv_pool *p, uint32_t rows, uint32_t want,
		     struct st_diag *diag)
{
	const struct kv_layout *l = &p->lay;
	uint64_t pages = (uint64_t)want * l->n_streams;
	uint64_t bytes = pages * l->page_bytes;
	char b1[32], b2[32], b3[32];

	/* the cap is the smaller of --max-rows-per-seq's pages and the
	 * budget's pages per stream (kv_pool_layout in kv_proto.c) */
	if (kv_pages_for_rows(l->max_rows_per_seq, l->page_rows) <= want)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "a sequence of %u rows is longer than kvd "
				   "--max-rows-per-seq %u allows: raise it, "
				   "or ask for fewer tokens", rows,
				   l->max_rows_per_seq);
	return st_diag_set(diag, -ST_E_BUDGET,
			   "KV budget too small for one sequence: a sequence "
			   "of %u rows needs %u pages per stream, %llu pages "
			   "of %llu bytes in all (%s), but the KV budget of %s "
			   "(%llu pages, %u streams) lets one sequence hold %u "
			   "pages per stream.  A running sequence's pages are "
			   "pinned and never spilled, so the spill budget does "
			   "not help: raise kvd --budget (strata: --kv-budget) "
			   "to at least %llu bytes (each %u rows more need "
			   "%s more), or ask for fewer tokens",
			   rows, want, (unsigned long long)pages,
			   (unsigned long long)l->page_bytes,
			   st_format_bytes(bytes, b1, sizeof(b1)),
			   st_format_bytes(l->budget_bytes, b2, sizeof(b2)),
			   (unsigned long long)l->n_pages, l->n_streams,
			   l->max_pages_per_seq, (unsigned long long)bytes,
			   l->page_rows,
			   st_format_bytes((uint64_t)l->n_streams *
					   l->page_bytes, b3, sizeof(b3)));
}

/* Gives back the pages of sequence idx at positions [from, to) of every
 * stream (the undo of a partial reservation: only fresh pages there). */
static void seq_drop_pages(struct kv_pool *p, uint32_t idx, uint32_t from,
			   uint32_t to)
{
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = from; pi < to; pi++) {
			uint32_t page = table_load(p, idx, s, pi);

			if (page == KV_PAGE_NONE)
				continue;
			table_store(p, idx, s, pi, KV_PAGE_NONE);
			if (page < p->lay.n_pages)
				kv_page_unref(p, page);
		}
}

static int seq_failed_error(const struct kv_pool *p, uint32_t idx,
			    const char *what, struct st_diag *diag)
{
	return st_diag_set(diag, -ST_E_CHECKSUM,
			   "%s: sequence 0x%x failed earlier (a spilled page "
			   "of it was lost); only freeing it is possible", what,
			   seq_handle(p, idx));
}

/* True when the page a sequence would write next (its partial last page in
 * stream s) may not be written in place: shared or published. */
static int page_needs_copy(const struct kv_pool *p, uint32_t page)
{
	return page < p->lay.n_pages &&
	       (atomic_load(&p->pages[page].refcount) > 1 ||
		p->cache.page_group[page] != UINT32_MAX ||
		atomic_load(&p->pages[page].key) != 0);
}

/* Streams of sequence idx whose partial last page needs a copy before rows
 * up to `target` are written. */
static uint32_t cow_pages(const struct kv_pool *p, uint32_t idx,
			  uint32_t target)
{
	uint32_t rows = atomic_load(&p->seqs[idx].n_rows), n = 0;

	if (target <= rows || rows % p->lay.page_rows == 0)
		return 0;
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		n += page_needs_copy(p, table_load(p, idx, s,
						   rows / p->lay.page_rows));
	return n;
}

/* Copy-on-write of sequence idx's partial last page (see cow_pages). */
static int seq_cow(struct kv_pool *p, uint32_t idx, uint32_t target)
{
	uint32_t rows = atomic_load(&p->seqs[idx].n_rows);
	uint32_t pi = rows / p->lay.page_rows;
	uint32_t part = rows % p->lay.page_rows;

	if (target <= rows || part == 0)
		return 0;
	for (uint32_t s = 0; s < p->lay.n_streams; s++) {
		uint32_t old = table_load(p, idx, s, pi), page;
		int r;

		if (!page_needs_copy(p, old))
			continue;
		r = kv_page_alloc(p, s, &page);
		if (r < 0)
			return r;
		kv_pool_page_sync(p, old);
		memcpy(kv_page_data(p, page), kv_page_data(p, old),
		       (size_t)kv_stream_page_used(&p->streams[s],
						   p->lay.page_rows, pi,
						   rows));
		table_store(p, idx, s, pi, page);
		kv_page_unref(p, old);
	}
	return 0;
}

/*
 * Windowed streams (kv_pool.h): when sequence idx grows from its n_rows to
 * target, the rows before n_rows are written, so the pages whose rows all
 * lie before n_rows - W are no longer needed: freed when only this
 * sequence holds them and they are not published (a shared or published
 * page stays for its other holders and the prefix cache).  Called after
 * the restore of the sequence: every entry is resident.
 */
static void seq_window_trim(struct kv_pool *p, uint32_t idx, uint32_t target)
{
	uint32_t rows = atomic_load(&p->seqs[idx].n_rows);

	if (target <= rows)
		return;
	for (uint32_t s = 0; s < p->lay.n_streams; s++) {
		uint32_t dead = kv_window_dead_pages(&p->streams[s],
						     p->lay.page_rows, rows);

		for (uint32_t pi = 0; pi < dead; pi++) {
			uint32_t page = table_load(p, idx, s, pi);

			if (page >= p->lay.n_pages || page_needs_copy(p, page))
				continue;
			table_store(p, idx, s, pi, KV_PAGE_NONE);
			kv_page_unref(p, page);
		}
	}
}

int kv_seq_reserve(struct kv_pool *p, uint32_t client, uint32_t n,
		   const struct kv_reserve_entry *e, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows;
	uint32_t *uniq, *target, n_uniq = 0, done = 0, stamp;
	uint64_t need = 0, fresh = 0;
	int r = 0, pinned = 0;

	if (n == 0)
		return 0;
	p->reserves++;
	uniq = malloc(sizeof(uint32_t) * n * 2);
	if (!uniq)
		return -ENOMEM;
	target = uniq + n;
	stamp = kv_mark_begin(p);
	/* Pass 1: validate everything, merge duplicates, count pages. */
	for (uint32_t i = 0; i < n; i++) {
		int idx = kv_seq_lookup(p, e[i].seq);
		uint32_t *mk;

		if (idx < 0) {
			r = st_diag_set(diag, -ST_E_NOTFOUND,
					"reserve entry %u: sequence 0x%x is "
					"unknown or was freed", i, e[i].seq);
			goto out;
		}
		if (p->seqs[idx].owner_client != client) {
			r = st_diag_set(diag, -EPERM,
					"reserve entry %u: sequence 0x%x "
					"belongs to another client", i,
					e[i].seq);
			goto out;
		}
		if (atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED) {
			r = seq_failed_error(p, (uint32_t)idx, "reserve", diag);
			goto out;
		}
		if (e[i].n_rows > p->lay.max_rows_per_seq) {
			r = st_diag_set(diag, -ST_E_LIMIT,
					"reserve entry %u: %u rows, over the "
					"limit of %u rows per sequence "
					"(--max-rows-per-seq)", i, e[i].n_rows,
					p->lay.max_rows_per_seq);
			goto out;
		}
		mk = &p->mark[2 * (uint32_t)idx];
		if (mk[0] == stamp) {
			target[mk[1]] = ST_MAX(target[mk[1]], e[i].n_rows);
		} else {
			mk[0] = stamp;
			mk[1] = n_uniq;
			uniq[n_uniq] = (uint32_t)idx;
			target[n_uniq++] = ST_MAX(
				e[i].n_rows,
				atomic_load(&p->seqs[idx].n_rows));
		}
	}
	for (uint32_t u = 0; u < n_uniq; u++) {
		uint32_t have = kv_pages_for_rows(
			atomic_load(&p->seqs[uniq[u]].n_rows), B);
		uint32_t want = kv_pages_for_rows(target[u], B);

		if (want > p->lay.max_pages_per_seq) {
			r = kv_seq_cap_error(p, target[u], want, diag);
			goto out;
		}
		pinned |= !!(atomic_load(&p->seqs[uniq[u]].flags) &
			     KV_SEQ_F_PINNED);
		fresh += (uint64_t)(want - have) * p->lay.n_streams;
		need += (uint64_t)(want - have) * p->lay.n_streams +
			p->seqs[uniq[u]].n_spilled +
			cow_pages(p, uniq[u], target[u]);
	}
	if (need > kv_pool_free_pages(p)) {
		/* a running sequence's step goes over the memory target
		 * rather than fail (kv_budget.c); without a spill file every
		 * sequence is as good as pinned: its pages never leave, and
		 * its client admitted it within the target (issue 24) */
		pinned |= !p->lay.n_slots;
		r = pinned ? kv_pool_make_room_pinned(
				     p, need, stamp, "this reservation", diag) :
			     kv_pool_make_room(p, need, stamp,
					       "this reservation", diag);
		if (r < 0)
			goto out;
	}
	/* The sequences are about to be written: bring them back whole,
	 * then copy a shared partial last page. */
	for (uint32_t u = 0; u < n_uniq; u++) {
		kv_seq_touch(p, uniq[u]);
		if (p->seqs[uniq[u]].n_spilled) {
			r = kv_seq_restore_idx(p, uniq[u], stamp, diag);
			if (r < 0)
				goto out;
		}
		r = seq_cow(p, uniq[u], target[u]);
		if (r < 0) {
			r = kv_budget_error(p, need, kv_pool_avail_pages(p),
					    "this reservation", diag);
			goto out;
		}
	}
	/* Pass 2: allocate; undo everything on a failure (another thread
	 * may have taken pages since the count above). */
	for (done = 0; done < n_uniq; done++) {
		uint32_t idx = uniq[done];
		uint32_t have = kv_pages_for_rows(
			atomic_load(&p->seqs[idx].n_rows), B);
		uint32_t want = kv_pages_for_rows(target[done], B);

		for (uint32_t s = 0; s < p->lay.n_streams; s++)
			for (uint32_t pi = have; pi < want; pi++) {
				uint32_t page;

				r = kv_page_alloc(p, s, &page);
				if (r < 0)
					goto undo;
				table_store(p, idx, s, pi, page);
			}
	}
	for (uint32_t u = 0; u < n_uniq; u++) {
		seq_window_trim(p, uniq[u], target[u]);
		atomic_store_explicit(&p->seqs[uniq[u]].n_rows, target[u],
				      memory_order_release);
	}
	r = 0;
	goto out;
undo:
	for (uint32_t u = 0; u <= done && u < n_uniq; u++) {
		uint32_t idx = uniq[u];

		seq_drop_pages(p, idx,
			       kv_pages_for_rows(
				       atomic_load(&p->seqs[idx].n_rows), B),
			       p->lay.max_pages_per_seq);
	}
	if (r == -ST_E_BUDGET)
		r = kv_budget_error(p, fresh, kv_pool_avail_pages(p),
				    "this reservation", diag);
out:
	free(uniq);
	return r;
}

int kv_seq_fork(struct kv_pool *p, uint32_t client, int32_t pid,
		uint64_t request_id, int dedupe, uint32_t src, uint32_t n_rows,
		uint32_t *ret_seq, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows;
	uint32_t full = n_rows / B, part = kv_last_page_rows(n_rows, B);
	int sidx = kv_seq_lookup(p, src), didx, r;
	uint32_t src_rows, stamp;

	if (sidx < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "fork: sequence 0x%x is unknown or was "
				   "freed", src);
	didx = dedupe ? kv_seq_find_request(p, client, request_id) : -1;
	if (didx >= 0) {
		*ret_seq = seq_handle(p, (uint32_t)didx);
		return 0;
	}
	if (atomic_load(&p->seqs[sidx].flags) & KV_SEQ_F_FAILED)
		return seq_failed_error(p, (uint32_t)sidx, "fork", diag);
	src_rows = atomic_load(&p->seqs[sidx].n_rows);
	if (n_rows > src_rows)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "fork of sequence 0x%x at %u rows: it holds "
				   "only %u", src, n_rows, src_rows);
	if (part == B)
		part = 0; /* the last page is full: shared, not copied */
	/* a windowed stream's rows the child still needs must be there */
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = kv_window_dead_pages(&p->streams[s], B,
							n_rows);
		     pi < kv_window_dead_pages(&p->streams[s], B, src_rows) &&
		     pi < full + (part > 0); pi++)
			if (table_load(p, (uint32_t)sidx, s, pi) == KV_PAGE_NONE)
				return st_diag_set(
					diag, -ST_E_LIMIT,
					"fork of sequence 0x%x at %u rows: "
					"stream %u keeps a window of %u rows "
					"and its rows before %u were freed; "
					"fork at most %u rows back", src,
					n_rows, s, p->streams[s].window_rows,
					src_rows - p->streams[s].window_rows,
					p->streams[s].window_rows);
	stamp = kv_mark_begin(p);
	p->mark[2 * (uint32_t)sidx] = stamp;
	kv_seq_touch(p, (uint32_t)sidx);
	if (p->seqs[sidx].n_spilled) {
		r = kv_seq_restore_idx(p, (uint32_t)sidx, stamp, diag);
		if (r < 0)
			return r;
	}
	if (part && kv_pool_free_pages(p) < p->lay.n_streams) {
		r = kv_pool_make_room(p, p->lay.n_streams, stamp,
				      "copying the partial last page of a fork",
				      diag);
		if (r < 0)
			return r;
	}
	didx = kv_seq_take(p, client, pid, request_id, src, KV_SEQ_BUILDING,
			   diag);
	if (didx < 0)
		return didx;
	for (uint32_t s = 0; s < p->lay.n_streams; s++) {
		for (uint32_t pi = 0; pi < full; pi++) {
			uint32_t page = table_load(p, (uint32_t)sidx, s, pi);

			if (page == KV_PAGE_NONE &&
			    pi < kv_window_dead_pages(&p->streams[s], B,
						      n_rows))
				continue; /* out of the child's window too */
			/* src holds a reference, so this cannot fail */
			if (page >= p->lay.n_pages || kv_page_ref(p, page) < 0)
				goto fail;
			/* shared from now on: the host page is what both
			 * read (rows written on the device first) */
			kv_pool_page_sync(p, page);
			table_store(p, (uint32_t)didx, s, pi, page);
		}
		if (part) {
			uint32_t from = table_load(p, (uint32_t)sidx, s, full);
			uint32_t page;

			if (from >= p->lay.n_pages ||
			    kv_page_alloc(p, s, &page) < 0)
				goto fail;
			kv_pool_page_sync(p, from);
			memcpy(kv_page_data(p, page), kv_page_data(p, from),
			       (size_t)kv_stream_page_used(&p->streams[s], B,
							   full, n_rows));
			table_store(p, (uint32_t)didx, s, full, page);
		}
	}
	atomic_store(&p->seqs[didx].n_rows, n_rows);
	atomic_store_explicit(&p->seqs[didx].state, KV_SEQ_LIVE,
			      memory_order_release);
	atomic_fetch_add(&p->info->counters.n_seqs, 1);
	*ret_seq = seq_handle(p, (uint32_t)didx);
	return 0;
fail:
	kv_seq_release(p, (uint32_t)didx);
	return kv_budget_error(p, p->lay.n_streams, kv_pool_avail_pages(p),
			       "copying the partial last page of a fork", diag);
}

int kv_seq_free(struct kv_pool *p, uint32_t client, uint32_t seq,
		struct st_diag *diag)
{
	int idx = kv_seq_lookup(p, seq);

	if (idx < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "free: sequence 0x%x is unknown or was "
				   "already freed", seq);
	if (p->seqs[idx].owner_client != client)
		return st_diag_set(diag, -EPERM,
				   "free: sequence 0x%x belongs to another "
				   "client", seq);
	kv_seq_release(p, (uint32_t)idx);
	return 0;
}

int kv_seq_free_client(struct kv_pool *p, uint32_t client)
{
	int n = 0;

	kv_pfx_ahead_drop_client(p, client);
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		struct kv_seq_entry *e = &p->seqs[i];

		if (atomic_load(&e->state) != KV_SEQ_FREE &&
		    e->owner_client == client) {
			kv_seq_release(p, i);
			n++;
		}
	}
	return n;
}

/* ---- adoption ---------------------------------------------------------- */

/* Clears every table entry of sequence idx from position `from` on;
 * returns how many were set. */
static uint64_t seq_clear_from(struct kv_pool *p, uint32_t idx, uint32_t from)
{
	uint64_t n = 0;

	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = from; pi < p->lay.max_pages_per_seq; pi++)
			if (table_load(p, idx, s, pi) != KV_PAGE_NONE) {
				table_store(p, idx, s, pi, KV_PAGE_NONE);
				n++;
			}
	return n;
}

/* A table entry that may stand at a position of a live sequence. */
static int entry_present(const struct kv_pool *p, uint32_t ent, uint32_t s)
{
	if (ent == KV_PAGE_LOST || kv_entry_is_spilled(ent))
		return 1;
	return ent < p->lay.n_pages && p->pages[ent].stream == s;
}

/* Checks the spilled entries of a kept sequence against the slot records;
 * one that does not match (or names a slot twice) becomes KV_PAGE_LOST and
 * the sequence FAILED.  Returns 1 when the sequence failed here. */
static int adopt_spilled(struct kv_pool *p, uint32_t idx, uint32_t n_pos,
			 uint8_t *claimed)
{
	struct kv_seq_entry *e = &p->seqs[idx];
	uint32_t handle = seq_handle(p, idx), spilled = 0;
	int failed = 0;

	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = 0; pi < n_pos; pi++) {
			uint32_t ent = table_load(p, idx, s, pi), slot;
			const struct kv_spill_slot *r;

			if (ent == KV_PAGE_LOST) {
				failed = 1;
				continue;
			}
			if (!kv_entry_is_spilled(ent))
				continue;
			slot = kv_entry_slot(ent);
			r = slot < p->lay.n_slots ? &p->spill.slots[slot] :
						    NULL;
			if (!r || claimed[slot] ||
			    atomic_load(&r->state) != KV_SLOT_USED ||
			    r->owner_seq != handle || r->stream != s ||
			    r->page_index != pi) {
				table_store(p, idx, s, pi, KV_PAGE_LOST);
				failed = 1;
				continue;
			}
			claimed[slot] = 1;
			spilled++;
		}
	e->n_spilled = spilled;
	if (failed)
		atomic_fetch_or(&e->flags, KV_SEQ_F_FAILED);
	return failed;
}

int kv_pool_adopt(struct kv_pool *p, void *base, size_t size,
		  const struct kv_layout *lay,
		  const struct kv_stream_decl *streams,
		  struct kv_adopt_report *rep)
{
	const uint32_t B = lay->page_rows;
	uint32_t *counts;
	uint8_t *claimed;
	uint64_t used = 0, shared = 0, fixed = 0, n_live = 0;
	int r = pool_bind(p, base, size, lay, streams);

	memset(rep, 0, sizeof(*rep));
	if (r < 0)
		return r;
	counts = calloc(lay->n_pages ? lay->n_pages : 1, sizeof(uint32_t));
	claimed = calloc(lay->n_slots ? lay->n_slots : 1, 1);
	if (!counts || !claimed) {
		free(counts);
		free(claimed);
		kv_pool_fini(p);
		return -ENOMEM;
	}
	for (uint32_t idx = 0; idx < lay->max_seqs; idx++) {
		struct kv_seq_entry *e = &p->seqs[idx];
		uint32_t st = atomic_load(&e->state);
		uint32_t gen = atomic_load(&e->generation);
		uint32_t rows = atomic_load(&e->n_rows), want, ok;

		if (st == KV_SEQ_FREE) {
			rep->entries_dropped += seq_clear_from(p, idx, 0);
			continue;
		}
		if (st != KV_SEQ_LIVE || gen == 0 || gen > KV_SEQ_GEN_MAX ||
		    e->owner_client == 0 || rows > lay->max_rows_per_seq) {
			/* half-built (fork/create cut by the kill) or junk */
			rep->entries_dropped += seq_clear_from(p, idx, 0);
			atomic_store(&e->state, KV_SEQ_FREE);
			atomic_store(&e->n_rows, 0);
			atomic_store(&e->flags, 0);
			if (gen > KV_SEQ_GEN_MAX)
				atomic_store(&e->generation, 0);
			rep->seqs_dropped++;
			continue;
		}
		want = ST_MIN(kv_pages_for_rows(rows, B),
			      lay->max_pages_per_seq);
		ok = want;
		for (uint32_t s = 0; s < lay->n_streams; s++) {
			uint32_t dead = kv_window_dead_pages(&streams[s], B,
							     rows);

			for (uint32_t pi = 0; pi < ok; pi++) {
				uint32_t ent = table_load(p, idx, s, pi);

				if (ent == KV_PAGE_NONE && pi < dead)
					continue; /* freed out of the window */
				if (!entry_present(p, ent, s)) {
					ok = pi;
					break;
				}
			}
		}
		if (ok < want || kv_pages_for_rows(rows, B) > want) {
			rows = ST_MIN(rows, ok * B);
			atomic_store(&e->n_rows, rows);
			rep->seqs_truncated++;
		}
		rep->entries_dropped += seq_clear_from(p, idx, ok);
		rep->seqs_failed += (uint32_t)adopt_spilled(p, idx, ok,
							    claimed);
		for (uint32_t s = 0; s < lay->n_streams; s++)
			for (uint32_t pi = 0; pi < ok; pi++) {
				uint32_t ent = table_load(p, idx, s, pi);

				if (ent < lay->n_pages)
					counts[ent]++;
			}
		rep->seqs_kept++;
		n_live++;
	}
	for (uint64_t i = 0; i < lay->n_pages; i++) {
		struct kv_page_meta *m = &p->pages[i];
		uint32_t c = counts[i];

		if (atomic_load(&m->refcount) != c)
			fixed++;
		atomic_store(&m->refcount, c);
		atomic_store(&m->state, c ? KV_PAGE_USED : KV_PAGE_FREE);
		used += c > 0;
		shared += c > 1;
	}
	free(counts);
	/* the cache index from the keys: idle grouped pages become CACHED */
	rep->cache_groups = kv_cache_rebuild(p, claimed);
	p->n_free = 0;
	for (uint64_t i = lay->n_pages; i-- > 0;) {
		struct kv_page_meta *m = &p->pages[i];

		if (atomic_load(&m->refcount) == 0 &&
		    atomic_load(&m->state) == KV_PAGE_FREE) {
			atomic_store(&m->key, 0);
			p->free_pages[p->n_free++] = (uint32_t)i;
		}
	}
	for (uint64_t i = 0; i < lay->n_slots; i++) {
		struct kv_spill_slot *sl = &p->spill.slots[i];

		if (claimed[i]) {
			rep->slots_kept++;
		} else if (atomic_load(&sl->state) != KV_SLOT_FREE) {
			atomic_store(&sl->state, KV_SLOT_FREE);
			rep->slots_freed++;
		}
	}
	free(claimed);
	p->n_free_seqs = 0;
	for (uint32_t i = lay->max_seqs; i-- > 0;)
		if (atomic_load(&p->seqs[i].state) == KV_SEQ_FREE)
			p->free_seqs[p->n_free_seqs++] = i;
	atomic_store(&p->info->counters.pages_used, used);
	atomic_store(&p->info->counters.pages_shared, shared);
	atomic_store(&p->info->counters.n_seqs, n_live);
	peak_update(p, used);
	rep->refcounts_fixed = fixed;
	return 0;
}
