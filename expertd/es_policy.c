/*
 * es_policy.c — residency policy of the host tier: which READY expert to
 * evict when a new one needs a slot.  This slice uses least-recently-used
 * (last_use_ns is stamped by expertd on every ACQUIRE and by clients on
 * every fast-path hit).  The NVMe-tier policy, decayed activation counts and
 * prefetch come later behind the same interface (es_daemon.h).
 */
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
