/*
 * kv_devpool.c — kvd's device KV page pool: import, H2D page copies for
 * computed's steps, D2H of device-written rows (kv_devpool.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "kv_devpage.h"
#include "kv_devpool.h"
#include "st_devimporter.h"
#include "st_log.h"

struct kv_devpool {
	struct st_devimporter imp;
	int32_t *dev_of;        /* [n_pages]: slot last given to the page, -1 */
	uint64_t n_pages;       /* of dev_of (the host pool's) */
	uint32_t *stamp;        /* [n_slots]: request that last used a slot */
	uint32_t n_stamp;
	uint32_t cur_stamp;     /* this SEQ_DEVICE request's */
	uint32_t hand;          /* clock over device slots */
	int inflight;           /* copies enqueued since the last drain */
	struct kv_devpool_stats st;
};

static void before_reset(void *ctx, struct st_devimporter *m);

/*
 * The host KV pool (the whole segment) is what page copies read and
 * write: pinned at the first import (or the first request after the pool
 * appeared).  Not a sparse pool (--memory-budget): pinning would fault in
 * every page, and a page whose memory is given back (MADV_REMOVE,
 * kv_budget.c) would stay pinned in the driver, which would then copy
 * the stale page; its copies go through pageable memory (correct,
 * slower).
 */
static void host_pool_set(struct kv_server *s, struct kv_devpool *d)
{
	if (d->imp.host_base || !s->have_pool || s->cfg.memory_budget_bytes)
		return;
	d->imp.host_base = s->shm.base;
	d->imp.host_bytes = s->shm.size;
}

static struct kv_devpool *dev_get(struct kv_server *s, struct st_diag *diag)
{
	struct kv_devpool *d = s->dev;

	if (d)
		return d;
	d = calloc(1, sizeof(*d));
	if (!d) {
		st_diag_set(diag, -ENOMEM, "out of memory");
		return NULL;
	}
	st_devimporter_init(&d->imp, ST_DEVPOOL_KV, s->cfg.instance, NULL, 0);
	host_pool_set(s, d);
	d->imp.before_reset = before_reset;
	d->imp.cb_ctx = s;
	s->dev = d;
	return d;
}

/* Forgets which slot holds which page (a new or reset table). */
static void map_reset(struct kv_devpool *d)
{
	for (uint64_t i = 0; i < d->n_pages; i++)
		d->dev_of[i] = -1;
	if (d->stamp)
		memset(d->stamp, 0, d->n_stamp * sizeof(*d->stamp));
	d->hand = 0;
}

/* Sizes the maps to the host pool and the imported table. */
static int map_fit(struct kv_server *s, struct st_diag *diag)
{
	struct kv_devpool *d = s->dev;
	uint64_t np = s->pool.lay.n_pages;
	uint32_t ns = d->imp.tab->n_slots;

	if (d->n_pages != np) {
		int32_t *v = realloc(d->dev_of, np * sizeof(*v));

		if (!v)
			return st_diag_set(diag, -ENOMEM, "out of memory");
		d->dev_of = v;
		d->n_pages = np;
		for (uint64_t i = 0; i < np; i++)
			v[i] = -1;
	}
	if (d->n_stamp != ns) {
		uint32_t *v = calloc(ns, sizeof(*v));

		if (!v)
			return st_diag_set(diag, -ENOMEM, "out of memory");
		free(d->stamp);
		d->stamp = v;
		d->n_stamp = ns;
		d->hand = 0;
	}
	return 0;
}

void kv_devpool_quiesce(struct kv_server *s)
{
	struct kv_devpool *d = s->dev;
	struct st_diag diag = { "" };

	if (!d || !d->inflight || !d->imp.cu)
		return;
	if (st_cuda_import_drain(d->imp.cu, &diag) < 0) {
		d->st.copy_errors++;
		st_warn("device KV copies: %s", diag.msg);
	}
	d->inflight = 0;
}

/* The host page of key when it is still the page the key names (same
 * allocation, in use): its id, else UINT32_MAX. */
static uint32_t live_page(struct kv_server *s, uint64_t key)
{
	uint32_t page, gen;

	if (!key || !s->have_pool)
		return UINT32_MAX;
	st_devkv_key_split(key, &page, &gen);
	if (page >= s->pool.lay.n_pages ||
	    atomic_load(&s->pool.pages[page].generation) != gen ||
	    atomic_load(&s->pool.pages[page].state) == KV_PAGE_FREE)
		return UINT32_MAX;
	return page;
}

/*
 * Copies the dirty range of slot ds (holding key) back to the host page
 * and waits for it; drops it when the page is gone.  The exporter may
 * mark more while this runs: then again (a few times; what is left stays
 * marked for the next sync).
 */
static void flush_slot(struct kv_server *s, uint32_t ds, uint64_t key)
{
	struct kv_devpool *d = s->dev;
	struct st_devslot_table *t = d->imp.tab;
	uint64_t lo, hi;

	for (int tries = 0; tries < 4; tries++) {
		struct st_diag diag = { "" };
		uint32_t page;
		int r;

		if (!st_devslot_dirty_take(t, ds, &lo, &hi))
			return;
		page = live_page(s, key);
		if (page == UINT32_MAX || hi > s->pool.lay.page_bytes ||
		    hi > d->imp.slot_bytes || !d->imp.cu) {
			d->st.dropped_dirty++;
			continue;
		}
		r = st_cuda_import_d2h(d->imp.cu,
				       kv_page_data(&s->pool, page) + lo,
				       (uint64_t)ds * d->imp.slot_bytes + lo,
				       hi - lo, ds % d->imp.n_events, &diag);
		if (r == 0)
			r = st_cuda_import_drain(d->imp.cu, &diag);
		d->inflight = 0;
		if (r < 0) {
			/* still only on the device: marked again */
			(void)st_devslot_dirty_mark(t, ds, lo, hi);
			d->st.copy_errors++;
			st_warn("device KV page %u: copy back: %s", page,
				diag.msg);
			return;
		}
		d->st.d2h_copies++;
		d->st.d2h_bytes += hi - lo;
	}
}

void kv_devpool_page_sync(void *ctx, uint32_t page)
{
	struct kv_server *s = ctx;
	struct kv_devpool *d = s->dev;
	int32_t ds;
	uint64_t key;

	if (!d || !st_devimporter_active(&d->imp) || page >= d->n_pages)
		return;
	ds = d->dev_of[page];
	if (ds < 0 || (uint32_t)ds >= d->imp.tab->n_slots)
		return;
	key = atomic_load(&d->imp.tab->slot[ds].key);
	if (key != st_devkv_key(page, atomic_load(
				  &s->pool.pages[page].generation)))
		return;
	flush_slot(s, (uint32_t)ds, key);
}

/* A restarted kvd receiving the epoch its table holds: what computed
 * wrote on the device and the dead kvd had not copied back yet. */
static void before_reset(void *ctx, struct st_devimporter *m)
{
	struct kv_server *s = ctx;
	struct st_devslot_table *t = m->tab;
	uint32_t n = 0;

	if (!s->have_pool)
		return;
	for (uint32_t i = 0; i < t->n_slots; i++) {
		uint64_t key = atomic_load(&t->slot[i].key);

		if (key && atomic_load(&t->slot[i].dirty)) {
			flush_slot(s, i, key);
			n++;
		}
	}
	if (n)
		st_info("device KV pool: %u dirty pages of the previous kvd "
			"copied back before the table was reset", n);
}

/* Every dirty slot back to the host (a REVOKE: the exporter is alive). */
static void flush_all(struct kv_server *s)
{
	struct st_devslot_table *t = s->dev->imp.tab;

	for (uint32_t i = 0; t && i < t->n_slots; i++) {
		uint64_t key = atomic_load(&t->slot[i].key);

		if (key && atomic_load(&t->slot[i].dirty))
			flush_slot(s, i, key);
	}
}

int kv_devpool_handle(struct kv_server *s, uint16_t type, const uint8_t *p,
		      size_t len, struct st_wbuf *rep, struct st_diag *diag)
{
	struct kv_devpool *d = dev_get(s, diag);
	int r, reset = 0;

	if (!d)
		return -ENOMEM;
	kv_devpool_quiesce(s);
	host_pool_set(s, d);
	/* a slot must hold a whole page */
	d->imp.min_slot_bytes = s->have_pool ? s->pool.lay.page_bytes : 0;
	if (type == ST_MSG_DEV_REVOKE && st_devimporter_active(&d->imp) &&
	    s->have_pool)
		flush_all(s);
	r = st_devimporter_handle(&d->imp, type, p, len, rep, &reset, diag);
	if (reset)
		map_reset(d);
	return r;
}

/* Claims a slot for key by the clock, never one this request already
 * uses; the slot's dirty rows (of its old page) go back to the host
 * first.  -1 when every slot is pinned, busy or taken by this request. */
static int32_t claim_slot(struct kv_server *s, uint64_t key)
{
	struct kv_devpool *d = s->dev;
	struct st_devslot_table *t = d->imp.tab;
	uint32_t n = t->n_slots, i;

	for (i = 0; i < n; i++) {
		uint32_t ds = (d->hand + i) % n;
		uint64_t old = atomic_load(&t->slot[ds].key);
		uint32_t op, og;

		if (d->stamp[ds] == d->cur_stamp)
			continue;
		if (!st_devslot_claim(t, ds, key))
			continue;
		/* COPYING: no pin can be taken, the dirty range is final */
		if (old)
			flush_slot(s, ds, old);
		if (old != key) {
			uint64_t l, h;

			/* marks without a live page behind them (a pin kept
			 * across a table reset): nothing to copy back */
			while (st_devslot_dirty_take(t, ds, &l, &h))
				d->st.dropped_dirty++;
			atomic_store(&t->slot[ds].bytes, 0);
			st_devkv_key_split(old, &op, &og);
			if (old && op < d->n_pages &&
			    d->dev_of[op] == (int32_t)ds)
				d->dev_of[op] = -1;
		}
		d->hand = (ds + 1) % n;
		return (int32_t)ds;
	}
	return -1;
}

/* Enqueues the copy of bytes [from, to) of page into claimed slot ds and
 * publishes it READY holding `to` bytes.  0 or negative (slot emptied). */
static int copy_in(struct kv_server *s, uint32_t ds, uint32_t page,
		   uint64_t from, uint64_t to, struct st_diag *diag)
{
	struct kv_devpool *d = s->dev;
	struct st_devslot_table *t = d->imp.tab;
	uint32_t ev = ds % d->imp.n_events;
	int r = 0;

	if (to > from) {
		r = st_cuda_import_h2d(d->imp.cu,
				       (uint64_t)ds * d->imp.slot_bytes + from,
				       kv_page_data(&s->pool, page) + from,
				       to - from, ev, diag);
		if (r < 0) {
			st_devslot_abort(t, ds);
			atomic_store(&t->slot[ds].bytes, 0);
			if (d->dev_of[page] == (int32_t)ds)
				d->dev_of[page] = -1;
			d->st.copy_errors++;
			return r;
		}
		d->inflight = 1;
		d->st.h2d_copies++;
		d->st.h2d_bytes += to - from;
	}
	atomic_store(&t->slot[ds].bytes, to);
	st_devslot_publish(t, ds, ev);
	d->stamp[ds] = d->cur_stamp;
	d->dev_of[page] = (int32_t)ds;
	return 0;
}

/*
 * The slot holding the first `need` bytes of page (generation gen), copying
 * what is missing; -1 when no slot can be had, or a negative code < -1 on
 * a copy error.
 */
static int64_t ensure(struct kv_server *s, uint32_t page, uint32_t gen,
		      uint64_t need, struct st_diag *diag)
{
	struct kv_devpool *d = s->dev;
	struct st_devslot_table *t = d->imp.tab;
	uint64_t key = st_devkv_key(page, gen);
	int32_t ds = d->dev_of[page];
	int r;

	if (ds >= 0 && (uint32_t)ds < t->n_slots &&
	    atomic_load(&t->slot[ds].key) == key &&
	    atomic_load(&t->slot[ds].state) == ST_DEVSLOT_READY) {
		uint64_t have = atomic_load(&t->slot[ds].bytes);

		if (have >= need) {
			d->stamp[ds] = d->cur_stamp;
			d->st.hits++;
			return ds;
		}
		/* rows appended on the host since: copy the new bytes,
		 * in place when computed holds no pin on the slot */
		if (st_devslot_claim(t, (uint32_t)ds, key)) {
			flush_slot(s, (uint32_t)ds, key);
			have = atomic_load(&t->slot[ds].bytes);
			r = copy_in(s, (uint32_t)ds, page, have < need ? have :
				    need, need, diag);
			if (r < 0)
				return r < -1 ? r : -ST_E_CUDA;
			d->st.refreshes++;
			return ds;
		}
		/* pinned: never rewritten; the host must have its dirty
		 * rows before a fresh copy is made from it */
		flush_slot(s, (uint32_t)ds, key);
	}
	ds = claim_slot(s, key);
	if (ds < 0) {
		d->st.no_slot++;
		return -1;
	}
	r = copy_in(s, (uint32_t)ds, page, 0, need, diag);
	if (r < 0)
		return r < -1 ? r : -ST_E_CUDA;
	return ds;
}

/* Checks the request's sequences and restores spilled pages of them. */
static int seqs_ready(struct kv_server *s, uint32_t client, uint32_t n,
		      const struct kv_reserve_entry *e, uint64_t *ret_pages,
		      struct st_diag *diag)
{
	struct kv_pool *p = &s->pool;
	uint32_t stamp = kv_mark_begin(p);
	uint64_t total = 0;
	int r;

	for (uint32_t i = 0; i < n; i++) {
		int idx = kv_seq_lookup(p, e[i].seq);

		if (idx < 0)
			return st_diag_set(diag, -ST_E_NOTFOUND, "SEQ_DEVICE: "
					   "no sequence 0x%x", e[i].seq);
		if (p->seqs[idx].owner_client != client)
			return st_diag_set(diag, -EPERM, "SEQ_DEVICE: sequence "
					   "0x%x is another client's",
					   e[i].seq);
		if (e[i].n_rows > atomic_load(&p->seqs[idx].n_rows))
			return st_diag_set(diag, -ST_E_LIMIT, "SEQ_DEVICE: "
					   "sequence 0x%x holds %u rows, %u "
					   "asked for", e[i].seq,
					   atomic_load(&p->seqs[idx].n_rows),
					   e[i].n_rows);
		p->mark[2 * (uint32_t)idx] = stamp;
		total += (uint64_t)p->lay.n_streams *
			 kv_pages_for_rows(e[i].n_rows, p->lay.page_rows);
	}
	if (total > KV_DEVPAGE_MAX_PAGES)
		return st_diag_set(diag, -ST_E_LIMIT, "SEQ_DEVICE: %llu pages, "
				   "at most %d per request",
				   (unsigned long long)total,
				   (int)KV_DEVPAGE_MAX_PAGES);
	for (uint32_t i = 0; i < n; i++) {
		int idx = kv_seq_lookup(p, e[i].seq);

		if (atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED)
			return st_diag_set(diag, -ST_E_CHECKSUM, "SEQ_DEVICE: "
					   "sequence 0x%x failed (a spilled "
					   "page was lost)", e[i].seq);
		if (p->seqs[idx].n_spilled) {
			r = kv_seq_restore_idx(p, (uint32_t)idx, stamp, diag);
			if (r < 0)
				return r;
		}
	}
	*ret_pages = total;
	return 0;
}

int kv_devpool_seq_device(struct kv_server *s, uint32_t client,
			  const uint8_t *p, size_t len, struct st_wbuf *rep,
			  struct st_diag *diag)
{
	struct kv_devpool *d = s->dev;
	struct kv_pool *pool = &s->pool;
	struct kv_reserve_entry *e = NULL;
	struct kv_devpage *out = NULL;
	uint64_t total = 0, k = 0;
	uint32_t n;
	int r;

	r = kv_devpage_decode_req(p, len, &n, &e, diag);
	if (r < 0)
		return r;
	if (!d || !st_devimporter_active(&d->imp)) {
		free(e);
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "kvd has no device "
				   "KV pool imported (computed exports one "
				   "with --device-kv-budget in CUDA builds)");
	}
	host_pool_set(s, d); /* the pool may have appeared after the import */
	if (!st_devimporter_host_ready(&d->imp)) {
		/* no copy from or to the host pool while it is being
		 * pinned: this step reads the host rows */
		free(e);
		return st_diag_set(diag, -ST_E_BUSY, "kvd is still pinning "
				   "its host KV pool for the device");
	}
	r = map_fit(s, diag);
	if (r == 0)
		r = seqs_ready(s, client, n, e, &total, diag);
	if (r == 0 && total && !(out = calloc(total, sizeof(*out))))
		r = st_diag_set(diag, -ENOMEM, "out of memory");
	if (++d->cur_stamp == 0)
		d->cur_stamp = 1;
	for (uint32_t i = 0; r == 0 && i < n; i++) {
		int idx = kv_seq_lookup(pool, e[i].seq);
		uint32_t np = kv_pages_for_rows(e[i].n_rows,
						pool->lay.page_rows);

		for (uint32_t st = 0; r == 0 && st < pool->lay.n_streams;
		     st++)
			for (uint32_t pi = 0; r == 0 && pi < np; pi++, k++) {
				uint32_t pg = kv_table_get(pool, (uint32_t)idx,
							   st, pi);
				uint64_t need;
				int64_t ds;

				out[k].page = KV_PAGE_NONE;
				out[k].slot = KV_DEVPAGE_NO_SLOT;
				if (pg >= pool->lay.n_pages)
					continue;
				out[k].page = pg;
				need = kv_stream_page_used(&pool->streams[st],
							   pool->lay.page_rows,
							   pi, e[i].n_rows);
				ds = ensure(s, pg, atomic_load(
					&pool->pages[pg].generation), need,
					diag);
				if (ds < -1)
					r = (int)ds;
				else if (ds >= 0) {
					out[k].slot = (uint32_t)ds;
					out[k].key = atomic_load(
						&d->imp.tab->slot[ds].key);
				}
			}
	}
	if (r == 0)
		kv_devpage_encode_rep(rep, d->imp.st.epoch, (uint32_t)total,
				      out);
	free(out);
	free(e);
	return r;
}

void kv_devpool_tick(struct kv_server *s)
{
	struct kv_devpool *d = s->dev;

	if (d && st_devimporter_tick(&d->imp)) {
		d->inflight = 0; /* the close drained the stream */
		map_reset(d);
	}
}

void kv_devpool_stats(const struct kv_server *s, struct kv_devpool_stats *ret)
{
	memset(ret, 0, sizeof(*ret));
	if (s->dev)
		*ret = s->dev->st;
}

void kv_devpool_fini(struct kv_server *s, int destroy_table)
{
	struct kv_devpool *d = s->dev;

	if (!d)
		return;
	kv_devpool_quiesce(s);
	/* a pool kept for the next kvd (SHUTDOWN KEEP_POOL) keeps the rows
	 * computed wrote on the device */
	if (st_devimporter_active(&d->imp) && s->have_pool)
		flush_all(s);
	if (d->st.h2d_copies || d->st.d2h_copies)
		st_info("device KV pool: %llu page copies in (%llu bytes), "
			"%llu dirty ranges back (%llu bytes), %llu hits, %llu "
			"refreshes, %llu without a slot",
			(unsigned long long)d->st.h2d_copies,
			(unsigned long long)d->st.h2d_bytes,
			(unsigned long long)d->st.d2h_copies,
			(unsigned long long)d->st.d2h_bytes,
			(unsigned long long)d->st.hits,
			(unsigned long long)d->st.refreshes,
			(unsigned long long)d->st.no_slot);
	st_devimporter_fini(&d->imp, destroy_table);
	free(d->dev_of);
	free(d->stamp);
	free(d);
	s->dev = NULL;
}
