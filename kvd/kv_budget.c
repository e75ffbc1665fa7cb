/*
 * kv_budget.c — the KV pool under a memory target (issue 24 items 2 and 4;
 * DESIGN.md "One memory budget", kvd's side): the pages the pool may hold,
 * shrinking to them, giving freed pages' memory back to the OS, the room a
 * pinned sequence's step takes beyond them, and the marginal value of KV
 * memory that kvd reports to the shared ledger (st_ledger.h).  Pool logic
 * only: kv_budget_ledger.c joins the ledger and drives this from kvd's loop.
 *
 * Limit: kv_pool.allowed_pages (target / page_bytes) + over_pages.  Pages
 * held = n_pages - free pages (sequences' pages and idle cached pages
 * alike).  kv_page_alloc and kv_pool_make_room treat free pages past the
 * limit as taken (kv_pool_free_locked), so every allocation path (reserve,
 * restore, fork, prefix restore, session load) makes room within it the way
 * it does when the pool is full: idle cached groups first, then pages of
 * sequences neither pinned nor in the batch go to the spill file.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "kv_daemon.h"
#include "st_util.h"

#define KV_BUDGET_HOST_PAGE 4096u

void kv_pool_set_allowed(struct kv_pool *p, uint64_t pages,
			 uint64_t pinned_pages)
{
	uint64_t held, a;

	pthread_mutex_lock(&p->lock);
	a = p->allowed_pages = ST_MIN(pages, p->lay.n_pages);
	/* pages granted over the target last while pinned pages need them
	 * and are held */
	held = p->lay.n_pages - p->n_free;
	p->over_pages = ST_MIN(p->over_pages, held > a ? held - a : 0);
	p->over_pages = ST_MIN(p->over_pages,
			       pinned_pages > a ? pinned_pages - a : 0);
	pthread_mutex_unlock(&p->lock);
}

uint64_t kv_pool_held_pages(struct kv_pool *p)
{
	uint64_t held;

	pthread_mutex_lock(&p->lock);
	held = p->lay.n_pages - p->n_free;
	pthread_mutex_unlock(&p->lock);
	return held;
}

int kv_pool_make_room_pinned(struct kv_pool *p, uint64_t need, uint32_t stamp,
			     const char *what, struct st_diag *diag)
{
	uint64_t saved, eff, held;
	int r = kv_pool_make_room(p, need, stamp, what, diag);

	pthread_mutex_lock(&p->lock);
	saved = p->over_pages;
	if (r != -ST_E_BUDGET ||
	    p->allowed_pages + saved >= p->lay.n_pages) {
		pthread_mutex_unlock(&p->lock);
		return r;
	}
	/* the whole pool (its cap) for the room, then only the shortfall
	 * stays granted */
	p->over_pages = p->lay.n_pages;
	pthread_mutex_unlock(&p->lock);
	r = kv_pool_make_room(p, need, stamp, what, diag);
	pthread_mutex_lock(&p->lock);
	p->over_pages = saved;
	if (r == 0) {
		/* the limit must cover what is held and the room: held may
		 * already be past it (a target that went down while the
		 * pages could not go), when the free pages under it are 0
		 * and a shortfall counted from them alone is too short */
		held = p->lay.n_pages - p->n_free;
		eff = kv_pool_free_locked(p);
		if (eff < need)
			p->over_pages = ST_MAX(
				p->over_pages + need - eff,
				held + need > p->allowed_pages ?
					held + need - p->allowed_pages : 0);
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

int kv_pool_shrink(struct kv_pool *p, struct st_diag *diag)
{
	uint64_t held, lim;
	int r;

	pthread_mutex_lock(&p->lock);
	held = p->lay.n_pages - p->n_free;
	lim = kv_pool_limit_locked(p);
	pthread_mutex_unlock(&p->lock);
	if (held <= lim)
		return 0;
	/* need 0: make_room wants the pages past the limit free; it spills
	 * idle cached groups while slots are free, or pages of sequences
	 * neither pinned nor failed (least recently used first) */
	r = kv_pool_make_room(p, 0, 0, "giving memory back to the shared "
			      "budget", diag);
	if (r < 0)
		return r;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		held = p->lay.n_pages - p->n_free;
		lim = kv_pool_limit_locked(p);
		pthread_mutex_unlock(&p->lock);
		if (held <= lim || !kv_cache_evict_lru(p))
			break;
	}
	if (held > lim)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "kv pool holds %llu pages, %llu over its "
				   "memory target of %llu pages: the rest "
				   "are pinned or in use",
				   (unsigned long long)held,
				   (unsigned long long)(held - lim),
				   (unsigned long long)lim);
	return 0;
}

/* MADV_REMOVE of the whole host pages inside [a, b). */
static uint64_t remove_range(uint8_t *a, uint8_t *b)
{
	uintptr_t lo = ((uintptr_t)a + KV_BUDGET_HOST_PAGE - 1) &
		       ~(uintptr_t)(KV_BUDGET_HOST_PAGE - 1);
	uintptr_t hi = (uintptr_t)b & ~(uintptr_t)(KV_BUDGET_HOST_PAGE - 1);

	if (hi <= lo || madvise((void *)lo, hi - lo, MADV_REMOVE) < 0)
		return 0;
	return hi - lo;
}

uint64_t kv_pool_release_free(struct kv_pool *p)
{
	const uint64_t pb = p->lay.page_bytes, n = p->lay.n_pages;
	uint64_t bytes = 0, i = 0;

	pthread_mutex_lock(&p->lock);
	/* only while the pages that may hold memory (all but the released
	 * ones) are more than the limit: a page freed under it keeps its
	 * memory for the next allocation */
	if (p->n_released >= p->n_free ||
	    n - p->n_released <= kv_pool_limit_locked(p)) {
		pthread_mutex_unlock(&p->lock);
		return 0;
	}
	while (i < n) {
		uint64_t j;

		if (p->released[i] ||
		    atomic_load(&p->pages[i].state) != KV_PAGE_FREE) {
			i++;
			continue;
		}
		for (j = i; j < n && !p->released[j] &&
			    atomic_load(&p->pages[j].state) == KV_PAGE_FREE;
		     j++) {
			p->released[j] = 1;
			p->n_released++;
		}
		bytes += remove_range(p->data + i * pb, p->data + j * pb);
		i = j;
	}
	pthread_mutex_unlock(&p->lock);
	return bytes;
}

void kv_budget_gauges(struct kv_pool *p, uint64_t now_ns, uint64_t recent_ns,
		      const uint32_t *queued, uint32_t n_queued,
		      struct kv_budget_gauges *g)
{
	const uint32_t ns = p->lay.n_streams, B = p->lay.page_rows;
	uint32_t stamp = kv_mark_begin(p);

	memset(g, 0, sizeof(*g));
	for (uint32_t q = 0; q < n_queued; q++) {
		int idx = kv_seq_lookup(p, queued[q]);

		if (idx >= 0)
			p->mark[2 * (uint32_t)idx] = stamp;
	}
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		const struct kv_seq_entry *e = &p->seqs[i];
		uint64_t all, spilled;
		uint32_t flags;

		if (atomic_load(&e->state) != KV_SEQ_LIVE)
			continue;
		flags = atomic_load(&e->flags);
		all = (uint64_t)kv_pages_for_rows(atomic_load(&e->n_rows), B) *
		      ns;
		spilled = __atomic_load_n(&e->n_spilled, __ATOMIC_ACQUIRE);
		/* without a spill file no page of a sequence can leave */
		if ((flags & KV_SEQ_F_PINNED) || !p->lay.n_slots)
			g->pinned += all > spilled ? all - spilled : 0;
		if ((flags & KV_SEQ_F_PINNED) || p->mark[2 * i] == stamp ||
		    now_ns - atomic_load(&e->last_use_ns) <= recent_ns)
			g->working += all;
	}
	pthread_mutex_lock(&p->lock);
	g->held = p->lay.n_pages - p->n_free;
	g->over = p->over_pages;
	pthread_mutex_unlock(&p->lock);
	/* shared pages count once per sequence above */
	g->pinned = ST_MIN(g->pinned, g->held);
	g->spilled = kv_spill_used_slots(p);
}

/* ---- marginal value ---------------------------------------------------- */

void kv_budget_rates_update(struct kv_budget_rates *r,
			    const struct kv_budget_obs *o)
{
	double dt, a;

	if (!r->primed || o->now_ns < r->last_ns ||
	    o->restore_ns < r->restore_ns || o->steps < r->steps) {
		r->primed = 1;
		r->last_ns = o->now_ns;
		r->restore_ns = o->restore_ns;
		r->steps = o->steps;
		return;
	}
	if (o->now_ns - r->last_ns < KV_BUDGET_MIN_DT_NS)
		return;
	dt = (double)(o->now_ns - r->last_ns);
	a = 1.0 - exp(-dt / (double)KV_BUDGET_DECAY_NS);
	r->restore_rate += a * ((double)(o->restore_ns - r->restore_ns) *
				1e9 / dt - r->restore_rate);
	r->step_rate += a * ((double)(o->steps - r->steps) * 1e9 / dt -
			     r->step_rate);
	r->last_ns = o->now_ns;
	r->restore_ns = o->restore_ns;
	r->steps = o->steps;
}

double kv_budget_gain(const struct kv_budget_rates *r,
		      const struct kv_budget_obs *o, uint64_t step)
{
	double share;

	if (step == 0 || o->spilled_bytes == 0 || r->restore_rate <= 0)
		return 0;
	share = ST_MIN(1.0, (double)step / (double)o->spilled_bytes);
	return r->restore_rate * share / ((double)step / KV_BUDGET_GIB);
}

double kv_budget_loss(const struct kv_budget_rates *r,
		      const struct kv_budget_obs *o, uint64_t step)
{
	double per_byte, deficit;
	uint64_t keep;

	if (step == 0)
		return 0;
	keep = o->target > step ? o->target - step : 0;
	if (keep >= o->working_bytes)
		return 0; /* slack: the working set still fits */
	if (!o->can_spill)
		return KV_BUDGET_LOSS_NO_SPILL;
	if (o->restore_bytes)
		per_byte = (double)o->restore_ns / (double)o->restore_bytes;
	else if (o->spill_bytes)
		per_byte = (double)o->spill_ns / (double)o->spill_bytes;
	else
		return KV_BUDGET_LOSS_NO_SPILL; /* nothing timed yet */
	deficit = (double)ST_MIN(step, o->working_bytes - keep);
	return deficit * per_byte * r->step_rate /
	       ((double)step / KV_BUDGET_GIB);
}

double kv_budget_wait_gain(uint64_t wait_bytes, uint32_t n_reqs,
			   uint64_t step)
{
	double share;

	if (step == 0 || wait_bytes == 0 || n_reqs == 0)
		return 0;
	share = ST_MIN(1.0, (double)step / (double)wait_bytes);
	return (double)n_reqs * KV_BUDGET_WAIT_NS_PER_S * share /
	       ((double)step / KV_BUDGET_GIB);
}
