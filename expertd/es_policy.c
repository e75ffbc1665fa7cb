/*
 * es_policy.c — residency policy of the host tier: which READY expert to
 * evict when a new one needs a slot.  LRU uses last_use_ns (stamped by
 * expertd on every ACQUIRE and ROUTE and by clients on every fast-path
 * hit); LFRU uses the decayed activation count of the slot's expert
 * (es_actstats.h), which weighs recency and frequency in one value (LRFU),
 * with last use breaking ties.  Hot-set and not-yet-used prefetched slots
 * are passed over while any other candidate exists.  Pinned, LOADING and
 * EVICTING slots are never candidates (PITFALLS P12).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "es_daemon.h"

int es_policy_pick_victim(const struct es_pool_view *v, const uint8_t *skip)
{
	uint64_t best_t = UINT64_MAX;
	int best = -1;

	/* O(n_slots) per miss; fine for the pool sizes of this slice (a heap
	 * keyed by last use replaces it when pools reach 10^5 slots). */
	for (uint32_t s = 0; s < v->n_slots; s++) {
		struct es_slot *sl = &v->slots[s];
		uint64_t t;

		if ((skip && skip[s]) ||
		    atomic_load(&sl->state) != ES_SLOT_READY ||
		    es_slot_pin_sum(sl) != 0)
			continue;
		t = atomic_load_explicit(&sl->last_use_ns,
					 memory_order_relaxed);
		if (t < best_t) {
			best_t = t;
			best = (int)s;
		}
	}
	return best;
}

int es_policy_parse(const char *name, enum es_evict_policy *ret)
{
	if (!strcmp(name, "lru"))
		*ret = ES_EVICT_LRU;
	else if (!strcmp(name, "lfru"))
		*ret = ES_EVICT_LFRU;
	else
		return -EINVAL;
	return 0;
}

/* Victim score, lower evicts first: LRU the last use; LFRU the decayed
 * activation count of the slot's expert (recency and frequency in one
 * value), last use breaking ties. */
static void score_of(const struct es_evict_ctx *ev,
		     const struct es_pool_view *v, struct es_slot *sl,
		     double *ret_primary, uint64_t *ret_last)
{
	uint64_t key = atomic_load(&sl->key);

	*ret_last = atomic_load_explicit(&sl->last_use_ns,
					 memory_order_relaxed);
	*ret_primary = 0;
	if (ev->policy == ES_EVICT_LFRU && ev->stats && key != ES_KEY_NONE &&
	    es_key_layer(key) < v->n_layers &&
	    es_key_expert(key) < v->n_experts)
		*ret_primary = es_actstats_value(ev->stats, es_key_layer(key),
						 es_key_expert(key));
}

int es_policy_pick(const struct es_evict_ctx *ev,
		   const struct es_pool_view *v, const uint8_t *skip,
		   int *ret_hot)
{
	*ret_hot = 0;
	if (!ev)
		return es_policy_pick_victim(v, skip);
	/* pass 0: neither hot nor protected; pass 1: any */
	for (int pass = 0; pass < (ev->strict ? 1 : 2); pass++) {
		double best_p = 0;
		uint64_t best_t = UINT64_MAX;
		int best = -1;

		for (uint32_t s = 0; s < v->n_slots; s++) {
			struct es_slot *sl = &v->slots[s];
			uint64_t key, t;
			double p;

			if ((skip && skip[s]) ||
			    atomic_load(&sl->state) != ES_SLOT_READY ||
			    es_slot_pin_sum(sl) != 0)
				continue;
			if (pass == 0 && ev->strict && ev->fresh_ns &&
			    atomic_load_explicit(&sl->last_use_ns,
						 memory_order_relaxed) >=
				    ev->fresh_ns)
				continue;
			key = atomic_load(&sl->key);
			if (pass == 0 &&
			    ((ev->protect && ev->protect[s]) ||
			     (ev->hot_key && key != ES_KEY_NONE &&
			      ev->hot_key[es_pool_index(v, es_key_layer(key),
							es_key_expert(key))])))
				continue;
			score_of(ev, v, sl, &p, &t);
			if (best < 0 || p < best_p ||
			    (p == best_p && t < best_t)) {
				best = (int)s;
				best_p = p;
				best_t = t;
			}
		}
		if (best >= 0) {
			*ret_hot = pass;
			return best;
		}
	}
	return -1;
}

struct rank_ent {
	int pass;         /* 0: neither hot nor protected, 1: either */
	double primary;
	uint64_t last;
	int32_t slot;
};

static int rank_cmp(const void *a, const void *b)
{
	const struct rank_ent *x = a, *y = b;

	if (x->pass != y->pass)
		return x->pass - y->pass;
	if (x->primary != y->primary)
		return x->primary < y->primary ? -1 : 1;
	if (x->last != y->last)
		return x->last < y->last ? -1 : 1;
	return x->slot - y->slot;
}

int es_policy_rank(const struct es_evict_ctx *ev,
		   const struct es_pool_view *v, int32_t *ret, uint32_t max)
{
	static const struct es_evict_ctx lru = { .policy = ES_EVICT_LRU };
	struct rank_ent *e;
	uint32_t n = 0;

	if (!ev)
		ev = &lru;
	e = malloc(sizeof(*e) * (v->n_slots ? v->n_slots : 1));
	if (!e)
		return -ENOMEM;
	for (uint32_t s = 0; s < v->n_slots; s++) {
		struct es_slot *sl = &v->slots[s];
		uint64_t key;

		if (atomic_load(&sl->state) != ES_SLOT_READY ||
		    es_slot_pin_sum(sl) != 0)
			continue;
		key = atomic_load(&sl->key);
		e[n].pass = (ev->protect && ev->protect[s]) ||
			    (ev->hot_key && key != ES_KEY_NONE &&
			     es_key_layer(key) < v->n_layers &&
			     es_key_expert(key) < v->n_experts &&
			     ev->hot_key[es_pool_index(v, es_key_layer(key),
						       es_key_expert(key))]);
		if (ev->strict && e[n].pass)
			continue;
		score_of(ev, v, sl, &e[n].primary, &e[n].last);
		e[n].slot = (int32_t)s;
		n++;
	}
	qsort(e, n, sizeof(*e), rank_cmp);
	if (n > max)
		n = max;
	for (uint32_t i = 0; i < n; i++)
		ret[i] = e[i].slot;
	free(e);
	return (int)n;
}
