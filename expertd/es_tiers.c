/*
 * es_tiers.c — what expertd does beyond loading on demand (DESIGN.md
 * sections 1 and 5): activation statistics from the clients' routing
 * reports, the pinned hot set ranked from them, and prefetching of the
 * experts the gate look-ahead hints, below demand misses.
 *
 * Everything here runs on the server thread (no locks); the loader threads
 * only see queued loads.
 *
 * Prefetch rules:
 *  - a ROUTE message replaces the look-ahead hints not yet started (they
 *    are older, hence less accurate): those count as dropped;
 *  - a hint for a layer the client has already reached (its latest ROUTE
 *    is at that layer or later) is stale and dropped;
 *  - step-named hints (ROUTE with hint_pos: exact experts of a known
 *    token, e.g. the next token's hash-routed layers) are kept by later
 *    ROUTEs, ahead of the new hints, until started; one is stale only
 *    when the client has reported a later position, or that position at
 *    the hint's layer or later.  A hint-only ROUTE with hint_pos reports
 *    no progress (the latest position and layer stay).  They skip LFRU's
 *    admission test (they name an expert that will be acquired, not a
 *    guess; measured: without this most next-token hints were refused at
 *    25 %, their experts' counts no higher than the victims');
 *  - at most --prefetch-inflight prefetch loads are queued or being read;
 *  - a prefetch never evicts a pinned, loading, hot or not-yet-used
 *    prefetched slot; it takes an empty slot or the policy's victim, and
 *    under LFRU only a victim admit() lets it take (not for step-named
 *    hints): by default one less activated than itself; with --admit
 *    precision one routed less often per token than the hints turn out
 *    right, never an expert of the layer being computed;
 *  - a prefetched slot is "protected" until a client uses it, the routing
 *    report of its layer passes it over (expire_unused()) or it is
 *    evicted: precision = used / loads; recall = used / (used + misses).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_daemon.h"
#include "es_devpool.h"
#include "st_log.h"
#include "st_util.h"

/* Re-rank the hot set after this many tokens or this long. */
#define RANK_TOKENS 64
#define RANK_INTERVAL_NS (2ull * 1000000000ull)

static uint64_t n_keys(const struct es_daemon *d)
{
	return (uint64_t)d->pool.v.n_layers * d->pool.v.n_experts;
}

/* Hot experts per layer that fit: the hot set leaves at least 2 * top-k
 * slots (two layers' worth for one token) to demand loads. */
static int hot_per_layer(const struct es_daemon *d)
{
	const struct es_pool_geom *g = &d->pool.geom;
	/* under --memory-budget: the slots the target allows now */
	uint32_t slots = d->pool.allowed ? d->pool.allowed : g->n_slots;
	int64_t room = (int64_t)slots - 2 * (int64_t)g->top_k;
	int n = d->opt.hot_experts;

	if (n <= 0 || room <= 0)
		return 0;
	if ((int64_t)n * g->n_layers > room)
		n = (int)(room / g->n_layers);
	if (n > (int)g->n_experts)
		n = (int)g->n_experts;
	return n;
}

/* Ranks the hot set from the statistics.  Returns how many keys changed. */
static int rank_hot(struct es_daemon *d)
{
	struct es_pool_view *v = &d->pool.v;
	int n = hot_per_layer(d), changed = 0;
	uint32_t *top;
	uint8_t *nk;

	if (n <= 0 || d->stats.tokens == 0)
		return 0;
	top = malloc(sizeof(uint32_t) * (size_t)n);
	nk = calloc(n_keys(d), 1);
	if (!top || !nk) {
		free(top);
		free(nk);
		return 0;
	}
	for (uint32_t l = 0; l < v->n_layers; l++) {
		es_actstats_top(&d->stats, l, (uint32_t)n, top);
		for (int i = 0; i < n; i++)
			nk[es_pool_index(v, l, top[i])] = 1;
	}
	for (uint64_t i = 0; i < n_keys(d); i++)
		changed += nk[i] != d->hot_key[i];
	memcpy(d->hot_key, nk, n_keys(d));
	atomic_store(&v->hdr->c.hot_slots, (uint64_t)n * v->n_layers);
	d->rank_tokens = d->stats.tokens;
	free(top);
	free(nk);
	return changed;
}

int es_tiers_init(struct es_daemon *d, struct st_diag *diag)
{
	struct es_pool_view *v = &d->pool.v;
	const char *dir = d->opt.state_dir ? d->opt.state_dir : d->opt.run_dir;
	struct st_diag ld = { "" };
	int r;

	r = es_actstats_init(&d->stats, v->n_layers, v->n_experts,
			     d->opt.half_life > 0 ? d->opt.half_life :
			     ES_ACTSTATS_DEFAULT_HALF_LIFE, d->store_id);
	if (r < 0)
		return st_diag_set(diag, r, "cannot allocate activation "
				   "statistics");
	d->hot_key = calloc(n_keys(d), 1);
	d->protect = calloc(v->n_slots, 1);
	d->pending = calloc(ES_ROUTE_MAX_HINT, sizeof(uint32_t));
	d->pending_step = calloc(ES_ROUTE_MAX_HINT, sizeof(uint64_t));
	if (!d->hot_key || !d->protect || !d->pending || !d->pending_step)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	if (snprintf(d->stats_path, sizeof(d->stats_path), "%s/%s", dir,
		     ES_ACTSTATS_FILE) >= (int)sizeof(d->stats_path))
		return st_diag_set(diag, -ENAMETOOLONG, "state directory path "
				   "too long: %s", dir);
	if (d->opt.state_dir) {
		r = st_mkdir_p(d->opt.state_dir, 0755);
		if (r < 0)
			return st_diag_set(diag, r, "cannot create state "
					   "directory %s: %s", d->opt.state_dir,
					   st_strerror(r));
	}
	r = es_actstats_load(&d->stats, d->stats_path, 1, &ld);
	if (r == 0)
		st_info("activation statistics of %" PRIu64 " tokens loaded "
			"from %s", d->stats.tokens, d->stats_path);
	else if (r != -ENOENT)
		st_warn("%s; starting with empty statistics", ld.msg);
	d->ev.policy = d->opt.evict;
	d->ev.stats = &d->stats;
	d->ev.hot_key = d->hot_key;
	d->ev.protect = d->protect;
	d->pool.ev = &d->ev;
	if (d->opt.hot_experts > 0 && hot_per_layer(d) < d->opt.hot_experts)
		st_warn("--hot-experts %d per layer does not fit %u slots "
			"(%u layers, top-k %u leaves room for %d per layer); "
			"pinning %d per layer (ranked from the activation "
			"statistics every 64 tokens or 2 s)", d->opt.hot_experts, v->n_slots,
			v->n_layers, d->pool.geom.top_k, hot_per_layer(d),
			hot_per_layer(d));
	rank_hot(d);
	d->next_save_ns = st_now_ns() +
			  (uint64_t)d->opt.stats_save_s * 1000000000ull;
	d->next_rank_ns = st_now_ns() + RANK_INTERVAL_NS;
	return 0;
}

/* A free slot exists: an unpinned FAILED one, or an unpinned EMPTY one
 * while fewer slots than the memory target allows are in use. */
static int have_free_slot(const struct es_daemon *d)
{
	const struct es_pool_view *v = &d->pool.v;
	uint32_t allowed = d->pool.allowed ? d->pool.allowed : v->n_slots;
	uint64_t used = 0;
	int empty = 0;

	for (uint32_t s = 0; s < v->n_slots; s++) {
		uint32_t st = atomic_load(&v->slots[s].state);

		if (st != ES_SLOT_EMPTY)
			used++;
		if ((st != ES_SLOT_EMPTY && st != ES_SLOT_FAILED) ||
		    es_slot_pin_sum(&v->slots[s]) != 0)
			continue;
		if (st == ES_SLOT_FAILED || !d->pool.allowed)
			return 1; /* no target: any free slot will do */
		empty = 1;
	}
	return empty && used < allowed;
}

/* Per-event decay of the prefetch precision counts (about the last 256
 * prefetches weigh). */
#define PF_DECAY (1.0 - 1.0 / 256)

/* Measured precision of the prefetches, used / (used + unused),
 * with one used and one wasted assumed before any (Laplace's rule: 1/2
 * until measured). */
static double pf_precision(const struct es_daemon *d)
{
	return (d->pf_used + 1.0) / (d->pf_used + d->pf_wasted + 2.0);
}

/* Eviction inputs for a prefetch: under admission by precision the
 * experts of the layer being computed (used since the latest routing
 * ROUTE, which stamped the ones it routed) are never victims. */
static void prefetch_ctx(struct es_daemon *d, int on)
{
	d->ev.strict = on;
	d->ev.fresh_ns = on && d->ev.policy == ES_EVICT_LFRU &&
				 d->opt.admit == ES_ADMIT_PRECISION ?
			 d->route_ns : 0;
}

/*
 * Admission of a look-ahead prefetch into a full pool (LFRU).
 *  - by frequency (default): the hinted expert must have a larger decayed
 *    activation count than the victim (the admission test of TinyLFU,
 *    Einziger et al., ACM ToS 2017).  It refuses about half of the
 *    look-ahead hints on the V4.1-shaped benchmark, whose reads then wait
 *    for the router.
 *  - by precision: the victim's per-token activation rate
 *    (es_actstats_rate(): the chance it is routed by the next token) must
 *    be below the hints' measured precision (the chance the hinted expert
 *    is used now).  A hint is a prediction for this token, not a history,
 *    so its own count says little; comparing the two probabilities of use
 *    admits it whenever it is the likelier use of the slot.  Measured on
 *    the V4.1-shaped benchmark (near-uniform routing): the hints start
 *    early, but they evict what later tokens would have hit, so a token
 *    reads about 16 % more and decodes about 4 % slower than by frequency
 *    (docs/BENCHMARKS.md, "Hint admission, honest hint precision").
 */
static int admit(struct es_daemon *d, size_t ix)
{
	struct es_pool_view *v = &d->pool.v;
	int hot, victim;
	uint64_t vk;
	uint32_t vl, ve;

	if (d->ev.policy != ES_EVICT_LFRU || have_free_slot(d))
		return 1;
	prefetch_ctx(d, 1);
	victim = es_policy_pick(&d->ev, v, NULL, &hot);
	prefetch_ctx(d, 0);
	if (victim < 0)
		return 0;
	vk = atomic_load(&v->slots[victim].key);
	if (vk == ES_KEY_NONE)
		return 1;
	vl = es_key_layer(vk);
	ve = es_key_expert(vk);
	if (d->opt.admit == ES_ADMIT_PRECISION)
		return es_actstats_rate(&d->stats, vl, ve) < pf_precision(d);
	return d->stats.count[ix] > d->stats.count[es_pool_index(v, vl, ve)];
}

/* Gives key ix a slot without evicting anything hot, protected, pinned or
 * loading, and queues its load (demand: 0, prefetch: 1).  Returns the slot
 * or a negative code (-ST_E_BUSY when nothing may be evicted). */
static int start_load(struct es_daemon *d, size_t ix, int prefetch)
{
	struct es_pool *p = &d->pool;
	struct es_pool_view *v = &p->v;
	uint64_t key = es_key((uint32_t)(ix / v->n_experts),
			      (uint32_t)(ix % v->n_experts));
	int s, evicted, r;

	if (prefetch)
		prefetch_ctx(d, 1);
	else
		d->ev.strict = 1;
	s = es_pool_alloc_slot(p, 0, &evicted);
	prefetch_ctx(d, 0);
	if (s < 0)
		return s;
	if (evicted) {
		atomic_fetch_add(&v->hdr->c.evictions, 1);
		es_tiers_evicting(d, (uint32_t)s);
		es_pool_slot_clear(p, (uint32_t)s);
	}
	es_pool_slot_assign(p, (uint32_t)s, key);
	atomic_store(&v->slots[s].last_use_ns, st_now_ns());
	d->protect[s] = (uint8_t)prefetch;
	r = prefetch ? es_loader_queue_prefetch(d->loader, (uint32_t)s, key) :
		       es_loader_queue(d->loader, (uint32_t)s, key);
	if (r < 0) {
		d->protect[s] = 0;
		es_pool_slot_publish(p, (uint32_t)s, r);
		return r;
	}
	return s;
}

void es_tiers_warm(struct es_daemon *d)
{
	struct es_pool_view *v = &d->pool.v;
	int n = 0;

	for (uint64_t ix = 0; ix < n_keys(d); ix++) {
		if (!d->hot_key[ix] || es_pool_slot_of(v, ix) >= 0 ||
		    es_loader_failure(d->loader,
				      es_key((uint32_t)(ix / v->n_experts),
					     (uint32_t)(ix % v->n_experts)),
				      NULL, 0))
			continue;
		if (start_load(d, (size_t)ix, 0) < 0)
			break;
		n++;
	}
	if (n)
		st_info("hot set: loading %d experts", n);
}

void es_tiers_used(struct es_daemon *d, uint32_t slot)
{
	if (d->protect && d->protect[slot]) {
		d->protect[slot] = 0;
		d->pf_used = d->pf_used * PF_DECAY + 1;
		d->pf_wasted *= PF_DECAY;
		atomic_fetch_add(&d->pool.v.hdr->c.prefetch_used, 1);
	}
}

/* Prefetched slots of layer l not used by the routing report of l that
 * just arrived: their hint was wrong, so they lose their protection (and
 * count as wasted) instead of holding a slot until evicted.  Without this
 * every wrong hint kept a slot out of the eviction order for the rest of
 * the run (measured on the V4.1-shaped benchmark at 25 %: about half the
 * pool by the end of 16 tokens when most hints were admitted). */
static void expire_unused(struct es_daemon *d, uint32_t l)
{
	struct es_pool_view *v = &d->pool.v;

	if (!d->protect || l >= v->n_layers)
		return;
	for (uint32_t e = 0; e < v->n_experts; e++) {
		int32_t s = es_pool_slot_of(v, es_pool_index(v, l, e));

		if (s >= 0)
			es_tiers_evicting(d, (uint32_t)s);
	}
}

void es_tiers_evicting(struct es_daemon *d, uint32_t slot)
{
	if (d->protect && d->protect[slot]) {
		d->protect[slot] = 0;
		d->pf_used *= PF_DECAY;
		d->pf_wasted = d->pf_wasted * PF_DECAY + 1;
		atomic_fetch_add(&d->pool.v.hdr->c.prefetch_wasted, 1);
	}
}

/* Whether pending hint i is stale: the client has reached its layer (of
 * its position, for a step-named hint). */
static int hint_stale(const struct es_daemon *d, uint32_t i)
{
	uint32_t layer = d->pending[i] / d->pool.v.n_experts;
	uint64_t step = d->pending_step[i];

	if (!step)
		return layer <= d->cur_layer;
	return step - 1 < d->cur_pos ||
	       (step - 1 == d->cur_pos && layer <= d->cur_layer);
}

/* Starts queued hints while fewer than the limit are in flight. */
static void pump(struct es_daemon *d)
{
	struct es_pool_view *v = &d->pool.v;
	int limit = d->opt.prefetch_inflight > 0 ? d->opt.prefetch_inflight :
						   ES_DEFAULT_PREFETCH_INFLIGHT;

	while (d->pending_next < d->n_pending &&
	       es_loader_prefetch_inflight(d->loader) < limit) {
		uint32_t ix = d->pending[d->pending_next];
		uint32_t layer = ix / v->n_experts;

		if (hint_stale(d, d->pending_next++)) {
			/* the client is already at or past that layer */
			atomic_fetch_add(&v->hdr->c.hints_dropped, 1);
			continue;
		}
		if (es_pool_slot_of(v, ix) >= 0 ||
		    es_loader_failure(d->loader,
				      es_key(layer, ix % v->n_experts), NULL,
				      0))
			continue;
		if (!d->pending_step[d->pending_next - 1] && !admit(d, ix)) {
			atomic_fetch_add(&v->hdr->c.hints_dropped, 1);
			continue;
		}
		if (start_load(d, ix, 1) < 0) {
			/* nothing evictable now: drop the rest */
			atomic_fetch_add(&v->hdr->c.hints_dropped,
					 d->n_pending - d->pending_next + 1);
			d->pending_next = d->n_pending;
			break;
		}
		atomic_fetch_add(&v->hdr->c.prefetch_loads, 1);
	}
}

void es_tiers_route(struct es_daemon *d, int client,
		    const struct es_route_req *req)
{
	struct es_pool_view *v = &d->pool.v;
	uint64_t n_sel = (uint64_t)req->n_tokens * req->k;
	uint64_t now = st_now_ns();
	uint32_t kept;

	if (req->layer == 0 && req->n_tokens)
		es_actstats_tokens(&d->stats, req->n_tokens);
	for (uint64_t i = 0; i < n_sel; i++) {
		uint32_t e = es_route_req_expert(req, (uint32_t)i);
		int32_t s = es_pool_slot_of(v, es_pool_index(v, req->layer, e));

		es_actstats_add(&d->stats, req->layer, e);
		/* routed now: wanted on the device (host hits take the
		 * client's fast path and send no ACQUIRE) */
		es_devpool_want(d, client, req->layer, e, 0);
		if (s >= 0) {
			/* about to be acquired: not a victim for the hints
			 * of this very message */
			atomic_store(&v->slots[s].last_use_ns, now);
			es_tiers_used(d, (uint32_t)s);
		}
	}
	atomic_fetch_add(&v->hdr->c.routed, n_sel);
	if (req->n_tokens) {
		d->route_ns = now;
		expire_unused(d, req->layer);
	}
	if (req->n_tokens || !req->has_hint_pos) {
		d->cur_pos = req->pos;
		d->cur_layer = req->layer;
	}
	if (d->opt.no_prefetch)
		return;
	/* newer hints replace the look-ahead ones not started yet; step-named
	 * ones not yet stale stay, first (room for the new ones permitting) */
	kept = 0;
	for (uint32_t i = d->pending_next; i < d->n_pending; i++) {
		if (d->pending_step[i] && !hint_stale(d, i) &&
		    kept + req->n_hint < ES_ROUTE_MAX_HINT) {
			d->pending[kept] = d->pending[i];
			d->pending_step[kept++] = d->pending_step[i];
		} else
			atomic_fetch_add(&v->hdr->c.hints_dropped, 1);
	}
	d->n_pending = kept;
	d->pending_next = 0;
	for (uint32_t i = 0; i < req->n_hint; i++) {
		uint32_t l, e;

		es_route_req_hint(req, i, &l, &e);
		if (l < v->n_layers && e < v->n_experts) {
			int32_t hs = es_pool_slot_of(v, es_pool_index(v, l, e));

			/* resident and named again: not a victim of the
			 * loads of its fellow hints (fresh_ns) */
			if (hs >= 0)
				atomic_store(&v->slots[hs].last_use_ns, now);
		}
		d->pending_step[d->n_pending] =
			req->has_hint_pos ? (uint64_t)req->hint_pos + 1 : 0;
		d->pending[d->n_pending++] = (uint32_t)es_pool_index(v, l, e);
		es_devpool_want(d, client, l, e, 1); /* device tier */
	}
	if (req->has_hint_pos)
		atomic_fetch_add(&v->hdr->c.step_hints, req->n_hint);
	else
		atomic_fetch_add(&v->hdr->c.hints, req->n_hint);
	pump(d);
}

int es_tiers_tick(struct es_daemon *d)
{
	uint64_t now = st_now_ns();

	pump(d);
	if (d->opt.hot_experts > 0 &&
	    (d->stats.tokens >= d->rank_tokens + RANK_TOKENS ||
	     now >= d->next_rank_ns)) {
		int changed = rank_hot(d);

		d->next_rank_ns = now + RANK_INTERVAL_NS;
		if (changed) {
			st_debug("hot set re-ranked: %d experts changed",
				 changed);
			es_tiers_warm(d);
		}
	}
	if (d->opt.stats_save_s > 0 && now >= d->next_save_ns) {
		struct st_diag diag = { "" };

		if (d->stats.tokens &&
		    es_actstats_save(&d->stats, d->stats_path, &diag) < 0)
			st_warn("%s", diag.msg);
		d->next_save_ns = now + (uint64_t)d->opt.stats_save_s *
					      1000000000ull;
	}
	return d->pending_next < d->n_pending ? 1 : ES_REAP_INTERVAL_MS;
}

void es_tiers_fini(struct es_daemon *d)
{
	struct st_diag diag = { "" };

	if (d->stats.count && d->stats.tokens) {
		if (es_actstats_save(&d->stats, d->stats_path, &diag) < 0)
			st_warn("%s", diag.msg);
		else
			st_info("activation statistics of %" PRIu64 " tokens "
				"saved to %s", d->stats.tokens, d->stats_path);
	}
	es_actstats_fini(&d->stats);
	free(d->hot_key);
	free(d->protect);
	free(d->pending);
	free(d->pending_step);
	d->pending_step = NULL;
	d->hot_key = d->protect = NULL;
	d->pending = NULL;
	d->pool.ev = NULL;
}
