/*
 * kv_cache.c — kvd's prefix cache (DESIGN.md 3a, issue 4): full page groups
 * (one page per stream covering the same rows) keyed by a chained hash of
 * the token ids they were computed from (kv_prefix_keys), found again by a
 * new sequence whose prompt starts the same way, shared read-only through
 * reference counts, kept when unused until evicted (LRU) or spilled.
 *
 * The index (key -> group) is private memory guarded by p->lock; the keys
 * themselves are in the segment (kv_page_meta.key, kv_spill_slot.key), so a
 * restarted kvd rebuilds the index from them (kv_cache_rebuild).
 *
 * Invariants (p->lock held):
 *  - a key is in the index at most once; every page of a resident group
 *    has page_group = the group and key = the group's key; a page is in at
 *    most one group;
 *  - where = IDLE exactly when every page of the group is CACHED (refcount
 *    0); such a group is on the resident LRU; n_idle counts its CACHED
 *    pages; idle_pages = n_streams x (number of IDLE groups);
 *  - a SPILLED group names slots (KV_PAGE_SPILLED | slot) that no table
 *    names, and is on the spilled LRU.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "st_util.h"

#define NONE UINT32_MAX

/* ---- index plumbing ---------------------------------------------------- */

static uint32_t bucket_of(const struct kv_cache *c, uint64_t key)
{
	return (uint32_t)((key ^ (key >> 29) ^ (key >> 47)) & c->bucket_mask);
}

int kv_cache_init(struct kv_pool *p)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams, nb = 16;
	uint64_t n = (p->lay.n_pages + p->lay.n_slots) / ns + 1;

	memset(c, 0, sizeof(*c));
	c->n_max = (uint32_t)ST_MIN(n, (uint64_t)UINT32_MAX - 1);
	while (nb < c->n_max && nb < (1u << 30))
		nb <<= 1;
	c->bucket_mask = nb - 1;
	c->key = calloc(c->n_max, sizeof(*c->key));
	c->ent = malloc(sizeof(uint32_t) * (size_t)c->n_max * ns);
	c->prev = malloc(sizeof(uint32_t) * c->n_max);
	c->next = malloc(sizeof(uint32_t) * c->n_max);
	c->hnext = malloc(sizeof(uint32_t) * c->n_max);
	c->n_idle = calloc(c->n_max, sizeof(uint32_t));
	c->where = calloc(c->n_max, 1);
	c->free_ids = malloc(sizeof(uint32_t) * c->n_max);
	c->buckets = malloc(sizeof(uint32_t) * nb);
	c->page_group = malloc(sizeof(uint32_t) *
			       (p->lay.n_pages ? p->lay.n_pages : 1));
	if (!c->key || !c->ent || !c->prev || !c->next || !c->hnext ||
	    !c->n_idle || !c->where || !c->free_ids || !c->buckets ||
	    !c->page_group)
		return -ENOMEM;
	memset(c->buckets, 0xff, sizeof(uint32_t) * nb);
	memset(c->page_group, 0xff, sizeof(uint32_t) * p->lay.n_pages);
	for (uint32_t i = 0; i < c->n_max; i++)
		c->free_ids[i] = c->n_max - 1 - i;
	c->n_free_ids = c->n_max;
	c->lru_head[0] = c->lru_head[1] = NONE;
	c->lru_tail[0] = c->lru_tail[1] = NONE;
	return 0;
}

void kv_cache_fini(struct kv_pool *p)
{
	struct kv_cache *c = &p->cache;

	free(c->key);
	free(c->ent);
	free(c->prev);
	free(c->next);
	free(c->hnext);
	free(c->n_idle);
	free(c->where);
	free(c->free_ids);
	free(c->buckets);
	free(c->page_group);
	memset(c, 0, sizeof(*c));
}

static void lru_push(struct kv_cache *c, int list, uint32_t g)
{
	c->next[g] = NONE;
	c->prev[g] = c->lru_tail[list];
	if (c->lru_tail[list] != NONE)
		c->next[c->lru_tail[list]] = g;
	else
		c->lru_head[list] = g;
	c->lru_tail[list] = g;
}

static void lru_remove(struct kv_cache *c, int list, uint32_t g)
{
	if (c->prev[g] != NONE)
		c->next[c->prev[g]] = c->next[g];
	else
		c->lru_head[list] = c->next[g];
	if (c->next[g] != NONE)
		c->prev[c->next[g]] = c->prev[g];
	else
		c->lru_tail[list] = c->prev[g];
	c->prev[g] = c->next[g] = NONE;
}

uint32_t kv_cache_find_locked(const struct kv_pool *p, uint64_t key)
{
	const struct kv_cache *c = &p->cache;

	if (!c->buckets || key == 0)
		return NONE;
	for (uint32_t g = c->buckets[bucket_of(c, key)]; g != NONE;
	     g = c->hnext[g])
		if (c->key[g] == key)
			return g;
	return NONE;
}

/* A new group under key (not in the index yet), where = `where`. */
static uint32_t group_new(struct kv_cache *c, uint64_t key, uint8_t where)
{
	uint32_t g, b;

	if (c->n_free_ids == 0)
		return NONE;
	g = c->free_ids[--c->n_free_ids];
	c->key[g] = key;
	c->where[g] = where;
	c->n_idle[g] = 0;
	c->prev[g] = c->next[g] = NONE;
	b = bucket_of(c, key);
	c->hnext[g] = c->buckets[b];
	c->buckets[b] = g;
	c->n_groups++;
	return g;
}

/* Takes g out of the index and frees its id (its entries already dealt
 * with, off any LRU). */
static void group_delete(struct kv_cache *c, uint32_t g)
{
	uint32_t *q = &c->buckets[bucket_of(c, c->key[g])];

	while (*q != NONE && *q != g)
		q = &c->hnext[*q];
	if (*q == g)
		*q = c->hnext[g];
	c->key[g] = 0;
	c->where[g] = KV_CG_FREE;
	c->free_ids[c->n_free_ids++] = g;
	c->n_groups--;
}

/* Unkeys a resident page of a group being dropped; an idle one is freed. */
static void page_unkey_locked(struct kv_pool *p, uint32_t page)
{
	struct kv_page_meta *m = &p->pages[page];

	p->cache.page_group[page] = NONE;
	atomic_store(&m->key, 0);
	if (atomic_load(&m->refcount) == 0 &&
	    atomic_load(&m->state) == KV_PAGE_CACHED) {
		atomic_store(&m->state, KV_PAGE_FREE);
		p->free_pages[p->n_free++] = page;
	}
}

/* Drops group g whatever its state but BUSY: resident pages lose the key
 * (idle ones go back on the free list), slots are freed; the key finds
 * nothing any more (PITFALLS P11). */
static void group_drop_locked(struct kv_pool *p, uint32_t g)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams;

	if (c->where[g] == KV_CG_IDLE) {
		lru_remove(c, 0, g);
		c->idle_pages -= ns;
	} else if (c->where[g] == KV_CG_SPILLED) {
		lru_remove(c, 1, g);
		c->spilled_groups--;
	}
	for (uint32_t s = 0; s < ns; s++) {
		uint32_t e = c->ent[(size_t)g * ns + s];

		if (kv_entry_is_spilled(e))
			kv_spill_slot_free(p, kv_entry_slot(e));
		else if (e < p->lay.n_pages && c->page_group[e] == g)
			page_unkey_locked(p, e);
		c->ent[(size_t)g * ns + s] = NONE;
	}
	group_delete(c, g);
}

/* ---- references -------------------------------------------------------- */

void kv_cache_page_idle_locked(struct kv_pool *p, uint32_t page, uint32_t g)
{
	struct kv_cache *c = &p->cache;

	(void)page;
	c->n_idle[g]++;
	if (c->where[g] == KV_CG_USED && c->n_idle[g] == p->lay.n_streams) {
		c->where[g] = KV_CG_IDLE;
		lru_push(c, 0, g);
		c->idle_pages += p->lay.n_streams;
	}
}

/* One more reference to a page of group g, reviving it from 0 (p->lock
 * held: only locked code takes a count from 0 to 1, so 0 is stable here). */
static void page_ref_locked(struct kv_pool *p, uint32_t page, uint32_t g)
{
	struct kv_page_meta *m = &p->pages[page];
	uint32_t c = atomic_load(&m->refcount);

	for (;;) {
		if (c == 0) {
			uint64_t used;

			if (atomic_load(&m->state) == KV_PAGE_CACHED)
				p->cache.n_idle[g]--;
			/* else: state USED, its 1 -> 0 holder has not run
			 * page_zero_locked yet and will find refcount 1 */
			atomic_store(&m->state, KV_PAGE_USED);
			atomic_store_explicit(&m->refcount, 1,
					      memory_order_release);
			used = atomic_fetch_add(&p->info->counters.pages_used,
						1) + 1;
			if (used > atomic_load(&p->info->counters.pages_peak))
				atomic_store(&p->info->counters.pages_peak,
					     used);
			return;
		}
		if (atomic_compare_exchange_weak(&m->refcount, &c, c + 1)) {
			if (c == 1)
				atomic_fetch_add(
					&p->info->counters.pages_shared, 1);
			return;
		}
	}
}

int kv_cache_acquire(struct kv_pool *p, uint64_t key, uint32_t *ret_pages)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams, g;
	int r = 1;

	pthread_mutex_lock(&p->lock);
	g = kv_cache_find_locked(p, key);
	if (g == NONE || c->where[g] == KV_CG_BUSY) {
		r = 0;
	} else if (c->where[g] == KV_CG_SPILLED) {
		r = 2;
	} else {
		if (c->where[g] == KV_CG_IDLE) {
			lru_remove(c, 0, g);
			c->idle_pages -= ns;
			c->where[g] = KV_CG_USED;
		}
		for (uint32_t s = 0; s < ns; s++) {
			uint32_t page = c->ent[(size_t)g * ns + s];

			page_ref_locked(p, page, g);
			ret_pages[s] = page;
		}
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kv_cache_publish(struct kv_pool *p, uint64_t key, const uint32_t *pages)
{
	int r = kv_cache_insert(p, key, pages);

	if (r > 0)
		atomic_fetch_add(&p->stats.prefix_published, 1);
	return r;
}

int kv_cache_insert(struct kv_pool *p, uint64_t key, const uint32_t *pages)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams, g;

	if (key == 0)
		return -EINVAL;
	pthread_mutex_lock(&p->lock);
	if (kv_cache_find_locked(p, key) != NONE) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	for (uint32_t s = 0; s < ns; s++)
		if (pages[s] >= p->lay.n_pages ||
		    c->page_group[pages[s]] != NONE ||
		    atomic_load(&p->pages[pages[s]].refcount) == 0) {
			pthread_mutex_unlock(&p->lock);
			return -EEXIST;
		}
	g = group_new(c, key, KV_CG_USED);
	if (g == NONE) {
		pthread_mutex_unlock(&p->lock);
		return 0; /* cannot happen: ids cover every page */
	}
	for (uint32_t s = 0; s < ns; s++) {
		c->ent[(size_t)g * ns + s] = pages[s];
		c->page_group[pages[s]] = g;
		atomic_store(&p->pages[pages[s]].key, key);
	}
	pthread_mutex_unlock(&p->lock);
	return 1;
}

int kv_cache_evict_lru_locked(struct kv_pool *p)
{
	uint32_t g = p->cache.lru_head[0];

	if (g == NONE)
		return 0;
	group_drop_locked(p, g);
	atomic_fetch_add(&p->stats.cache_evictions, 1);
	return 1;
}

int kv_cache_evict_lru(struct kv_pool *p)
{
	int r;

	pthread_mutex_lock(&p->lock);
	r = kv_cache_evict_lru_locked(p);
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kv_cache_drop_spilled_lru(struct kv_pool *p)
{
	uint32_t g;
	int r = 0;

	pthread_mutex_lock(&p->lock);
	g = p->cache.lru_head[1];
	if (g != NONE) {
		group_drop_locked(p, g);
		atomic_fetch_add(&p->stats.cache_evictions, 1);
		r = (int)p->lay.n_streams;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

void kv_cache_forget_page(struct kv_pool *p, uint32_t page)
{
	uint32_t g;

	if (page >= p->lay.n_pages)
		return;
	pthread_mutex_lock(&p->lock);
	g = p->cache.page_group[page];
	if (g != NONE && p->cache.where[g] != KV_CG_BUSY)
		group_drop_locked(p, g);
	pthread_mutex_unlock(&p->lock);
}

/* ---- spilling groups (the I/O is kv_spill.c's) ------------------------- */

uint32_t kv_cache_take_idle_lru(struct kv_pool *p, uint32_t *ret_pages)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams, g;

	pthread_mutex_lock(&p->lock);
	g = c->lru_head[0];
	if (g != NONE) {
		lru_remove(c, 0, g);
		c->idle_pages -= ns;
		c->where[g] = KV_CG_BUSY;
		memcpy(ret_pages, &c->ent[(size_t)g * ns], sizeof(uint32_t) * ns);
	}
	pthread_mutex_unlock(&p->lock);
	return g;
}

void kv_cache_spilled(struct kv_pool *p, uint32_t g, const uint32_t *slots)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams;

	pthread_mutex_lock(&p->lock);
	for (uint32_t s = 0; s < ns; s++) {
		uint32_t page = c->ent[(size_t)g * ns + s];
		struct kv_page_meta *m = &p->pages[page];

		c->page_group[page] = NONE;
		atomic_store(&m->key, 0);
		atomic_store(&m->state, KV_PAGE_FREE);
		p->free_pages[p->n_free++] = page;
		c->ent[(size_t)g * ns + s] = KV_PAGE_SPILLED | slots[s];
	}
	c->where[g] = KV_CG_SPILLED;
	lru_push(c, 1, g);
	c->spilled_groups++;
	pthread_mutex_unlock(&p->lock);
}

void kv_cache_unbusy(struct kv_pool *p, uint32_t g)
{
	struct kv_cache *c = &p->cache;

	pthread_mutex_lock(&p->lock);
	if (kv_entry_is_spilled(c->ent[(size_t)g * p->lay.n_streams])) {
		c->where[g] = KV_CG_SPILLED;
		lru_push(c, 1, g);
		c->spilled_groups++;
	} else {
		c->where[g] = KV_CG_IDLE;
		lru_push(c, 0, g);
		c->idle_pages += p->lay.n_streams;
	}
	pthread_mutex_unlock(&p->lock);
}

/* Takes spilled group g off its list for a restore (KV_CG_BUSY). */
static void take_spilled(struct kv_pool *p, uint32_t g)
{
	struct kv_cache *c = &p->cache;

	pthread_mutex_lock(&p->lock);
	lru_remove(c, 1, g);
	c->spilled_groups--;
	c->where[g] = KV_CG_BUSY;
	pthread_mutex_unlock(&p->lock);
}

void kv_cache_restored(struct kv_pool *p, uint32_t g, const uint32_t *pages)
{
	struct kv_cache *c = &p->cache;
	uint32_t ns = p->lay.n_streams;

	pthread_mutex_lock(&p->lock);
	for (uint32_t s = 0; s < ns; s++) {
		uint32_t e = c->ent[(size_t)g * ns + s];

		if (kv_entry_is_spilled(e))
			kv_spill_slot_free(p, kv_entry_slot(e));
		c->ent[(size_t)g * ns + s] = pages[s];
		c->page_group[pages[s]] = g;
		atomic_store(&p->pages[pages[s]].key, c->key[g]);
	}
	c->where[g] = KV_CG_USED;
	c->n_idle[g] = 0;
	pthread_mutex_unlock(&p->lock);
}

void kv_cache_drop_busy(struct kv_pool *p, uint32_t g)
{
	pthread_mutex_lock(&p->lock);
	p->cache.where[g] = KV_CG_USED; /* off every list: plain drop */
	group_drop_locked(p, g);
	pthread_mutex_unlock(&p->lock);
}

/* ---- sequences ---------------------------------------------------------- */

int kv_cache_acquire_resident(struct kv_pool *p, uint64_t key,
			      uint32_t stamp, uint32_t *ret_pages,
			      struct st_diag *diag)
{
	int r = kv_cache_acquire(p, key, ret_pages);

	if (r == 2) {
		uint32_t g;

		pthread_mutex_lock(&p->lock);
		g = kv_cache_find_locked(p, key);
		pthread_mutex_unlock(&p->lock);
		take_spilled(p, g);
		r = kv_cache_restore_group(p, g, stamp, ret_pages, diag);
		r = r < 0 ? r : 1;
	}
	return r;
}

int kv_seq_create_prefix(struct kv_pool *p, uint32_t client, int32_t pid,
			 uint64_t request_id, int dedupe, uint64_t model_id,
			 const int32_t *ids, uint32_t n_ids, uint32_t *ret_seq,
			 uint32_t *ret_n_cached, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows, ns = p->lay.n_streams;
	uint32_t max_groups, hit = 0, stamp, pages[KV_MAX_STREAMS];
	uint64_t *keys = NULL;
	int idx, r;

	*ret_n_cached = 0;
	if (model_id == 0)
		return st_diag_set(diag, -EINVAL,
				   "prefix cache: no model id declared (use "
				   "kv_client_declare_model)");
	idx = dedupe ? kv_seq_find_request(p, client, request_id) : -1;
	if (idx >= 0) {
		*ret_seq = kv_seq_handle((uint32_t)idx,
					 atomic_load(&p->seqs[idx].generation));
		*ret_n_cached = atomic_load(&p->seqs[idx].n_rows);
		return 0;
	}
	/* at least the last token is computed again (PITFALLS P10) */
	max_groups = n_ids ? (n_ids - 1) / B : 0;
	max_groups = ST_MIN(max_groups, p->lay.max_pages_per_seq);
	max_groups = ST_MIN(max_groups, p->lay.max_rows_per_seq / B);
	if (max_groups) {
		keys = malloc(sizeof(uint64_t) * max_groups);
		if (!keys)
			return -ENOMEM;
		r = kv_prefix_keys(ids, B, model_id, max_groups, keys);
		if (r < 0) {
			free(keys);
			return r;
		}
	}
	idx = kv_seq_take(p, client, pid, request_id, 0, KV_SEQ_BUILDING,
			  diag);
	if (idx < 0) {
		free(keys);
		return idx;
	}
	stamp = kv_mark_begin(p);
	for (hit = 0; hit < max_groups; hit++) {
		r = kv_cache_acquire(p, keys[hit], pages);
		if (r == 2) {
			/* the request waits for this read (what restoring
			 * queued requests' prefixes ahead avoids) */
			uint64_t t0 = st_now_ns();
			uint32_t g;

			pthread_mutex_lock(&p->lock);
			g = kv_cache_find_locked(p, keys[hit]);
			pthread_mutex_unlock(&p->lock);
			take_spilled(p, g);
			r = kv_cache_restore_group(p, g, stamp, pages, NULL)
				    == 0;
			p->stats.pfx_lookup_restores += (uint64_t)r;
			p->stats.pfx_lookup_restore_ns += st_now_ns() - t0;
		}
		if (r != 1)
			break;
		for (uint32_t s = 0; s < ns; s++)
			kv_table_set(p, (uint32_t)idx, s, hit, pages[s]);
	}
	/* the rest of the chain from the remote tier, when it has it */
	if (hit < max_groups && p->remote)
		hit += kv_remote_restore_chain(p, (uint32_t)idx, hit,
					       keys + hit, max_groups - hit,
					       stamp);
	free(keys);
	atomic_store(&p->seqs[idx].n_rows, hit * B);
	atomic_store_explicit(&p->seqs[idx].state, KV_SEQ_LIVE,
			      memory_order_release);
	atomic_fetch_add(&p->info->counters.n_seqs, 1);
	atomic_fetch_add(&p->stats.prefix_lookups, 1);
	atomic_fetch_add(&p->stats.prefix_pages_hit, hit);
	atomic_fetch_add(&p->stats.prefix_rows_reused, (uint64_t)hit * B);
	*ret_seq = kv_seq_handle((uint32_t)idx,
				 atomic_load(&p->seqs[idx].generation));
	*ret_n_cached = hit * B;
	return 0;
}

int kv_seq_publish(struct kv_pool *p, uint32_t client, uint32_t seq,
		   uint64_t model_id, const int32_t *ids, uint32_t n_ids,
		   struct st_diag *diag)
{
	return kv_seq_publish_flags(p, client, seq, model_id, ids, n_ids, 0,
				    diag);
}

int kv_seq_publish_flags(struct kv_pool *p, uint32_t client, uint32_t seq,
			 uint64_t model_id, const int32_t *ids, uint32_t n_ids,
			 uint32_t flags, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows, ns = p->lay.n_streams;
	uint32_t full = n_ids / B, pages[KV_MAX_STREAMS], rows;
	uint64_t *keys;
	uint32_t *rpages = NULL, n_remote = 0;
	int idx = kv_seq_lookup(p, seq), r, n = 0;
	int remote = p->remote && (!(flags & KV_PUBLISH_F_PRIVATE) ||
				   p->remote->cfg.share_private);

	if (idx < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "publish: sequence 0x%x is unknown or was "
				   "freed", seq);
	if (p->seqs[idx].owner_client != client)
		return st_diag_set(diag, -EPERM,
				   "publish: sequence 0x%x belongs to another "
				   "client", seq);
	if (model_id == 0)
		return st_diag_set(diag, -EINVAL,
				   "publish: no model id declared (use "
				   "kv_client_declare_model)");
	if (atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED)
		return st_diag_set(diag, -ST_E_CHECKSUM,
				   "publish: sequence 0x%x failed earlier (a "
				   "spilled page of it was lost)", seq);
	rows = atomic_load(&p->seqs[idx].n_rows);
	if (n_ids > rows)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "publish of sequence 0x%x: %u token ids, it "
				   "holds only %u rows", seq, n_ids, rows);
	if (full == 0)
		return 0;
	keys = malloc(sizeof(uint64_t) * full);
	if (!keys)
		return -ENOMEM;
	r = kv_prefix_keys(ids, B, model_id, full, keys);
	if (r < 0) {
		free(keys);
		return r;
	}
	/* the newly published groups' keys, in place, and pages, for the
	 * remote tier (no memory: local publish only) */
	if (remote)
		rpages = malloc(sizeof(uint32_t) * full * ns);
	kv_seq_touch(p, (uint32_t)idx);
	for (uint32_t i = 0; i < full; i++) {
		int resident = 1, same = 1;

		for (uint32_t s = 0; s < ns; s++) {
			pages[s] = kv_table_get(p, (uint32_t)idx, s, i);
			if (pages[s] >= p->lay.n_pages)
				resident = 0;
			else if (atomic_load(&p->pages[pages[s]].key) !=
				 keys[i])
				same = 0;
		}
		if (!resident)
			break;
		if (same)
			continue; /* mapped from the cache or published */
		/* shared from now on: rows written on the device first */
		for (uint32_t s = 0; s < ns; s++)
			kv_pool_page_sync(p, pages[s]);
		r = kv_cache_publish(p, keys[i], pages);
		if (r == -EEXIST)
			break; /* these pages hold other tokens' rows */
		n += r > 0;
		if (r > 0 && rpages) {
			keys[n_remote] = keys[i]; /* n_remote <= i */
			memcpy(rpages + (size_t)n_remote * ns, pages,
			       sizeof(uint32_t) * ns);
			n_remote++;
		}
	}
	if (n_remote)
		kv_remote_publish(p, n_remote, keys, rpages);
	free(rpages);
	free(keys);
	return n;
}

/* ---- adoption ----------------------------------------------------------- */

struct keyed {
	uint64_t key;
	uint32_t stream;
	uint32_t kind;  /* 0 resident page, 1 spill slot */
	uint32_t id;
};

static int keyed_cmp(const void *a, const void *b)
{
	const struct keyed *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	if (x->stream != y->stream)
		return x->stream < y->stream ? -1 : 1;
	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	return x->id < y->id ? -1 : x->id > y->id;
}

/* Forgets one keyed entry that no group keeps. */
static void keyed_drop(struct kv_pool *p, const struct keyed *k)
{
	if (k->kind == 0) {
		atomic_store(&p->pages[k->id].key, 0);
		if (atomic_load(&p->pages[k->id].refcount) == 0)
			atomic_store(&p->pages[k->id].state, KV_PAGE_FREE);
	}
	/* a slot: left unclaimed, freed by the caller */
}

uint64_t kv_cache_rebuild(struct kv_pool *p, uint8_t *claimed)
{
	struct kv_cache *c = &p->cache;
	const uint32_t ns = p->lay.n_streams;
	struct keyed *v;
	uint64_t n = 0, cap = p->lay.n_pages + p->lay.n_slots, built = 0;

	v = malloc(sizeof(*v) * (cap ? cap : 1));
	if (!v) {
		/* no memory for the index: forget every key (a cold cache,
		 * never a wrong one) */
		for (uint64_t i = 0; i < p->lay.n_pages; i++)
			atomic_store(&p->pages[i].key, 0);
		return 0;
	}
	for (uint64_t i = 0; i < p->lay.n_pages; i++) {
		uint64_t key = atomic_load(&p->pages[i].key);

		if (key)
			v[n++] = (struct keyed){ key, p->pages[i].stream, 0,
						 (uint32_t)i };
	}
	for (uint64_t i = 0; i < p->lay.n_slots; i++) {
		const struct kv_spill_slot *sl = &p->spill.slots[i];

		if (!claimed[i] && atomic_load(&sl->state) == KV_SLOT_USED &&
		    sl->owner_seq == 0 && sl->key && sl->stream < ns)
			v[n++] = (struct keyed){ sl->key, sl->stream, 1,
						 (uint32_t)i };
	}
	qsort(v, n, sizeof(*v), keyed_cmp);
	for (uint64_t a = 0; a < n;) {
		uint64_t b = a, pick[KV_MAX_STREAMS];
		uint32_t have = 0, kind = v[a].kind, ok = 1, g, refd = 0;

		while (b < n && v[b].key == v[a].key)
			b++;
		/* first entry of each stream; all of one kind */
		for (uint64_t i = a; i < b; i++) {
			if (i > a && v[i].stream == v[i - 1].stream)
				continue;
			if (v[i].stream != have || v[i].kind != kind)
				ok = 0;
			else
				pick[have++] = i;
		}
		ok = ok && have == ns;
		g = ok ? group_new(c, v[a].key, KV_CG_USED) : NONE;
		for (uint64_t i = a; i < b; i++) {
			int kept = 0;

			for (uint32_t s = 0; g != NONE && s < ns; s++)
				kept |= pick[s] == i;
			if (!kept) {
				keyed_drop(p, &v[i]);
				continue;
			}
			if (v[i].kind == 1) {
				claimed[v[i].id] = 1;
				c->ent[(size_t)g * ns + v[i].stream] =
					KV_PAGE_SPILLED | v[i].id;
			} else {
				uint32_t page = v[i].id;

				c->ent[(size_t)g * ns + v[i].stream] = page;
				c->page_group[page] = g;
				if (atomic_load(&p->pages[page].refcount)) {
					refd = 1;
				} else {
					atomic_store(&p->pages[page].state,
						     KV_PAGE_CACHED);
					c->n_idle[g]++;
				}
			}
		}
		if (g != NONE) {
			built++;
			if (kind == 1) {
				c->where[g] = KV_CG_SPILLED;
				lru_push(c, 1, g);
				c->spilled_groups++;
			} else if (!refd) {
				c->where[g] = KV_CG_IDLE;
				lru_push(c, 0, g);
				c->idle_pages += ns;
			}
		}
		a = b;
	}
	free(v);
	return built;
}
