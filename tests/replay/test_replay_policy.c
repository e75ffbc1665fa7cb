/*
 * test_replay_policy.c — the replay's policies on hand-made traces with
 * hand-computed results (LRU, LFU, 2Q, Least-Stale, Belady, the look-ahead prefetch
 * accounting), the pool split, and the invariants every policy keeps on a
 * long random trace: never more resident than slots, a step's experts are
 * never evicted during the step (PITFALLS P12 in the replay: a pinned slot is
 * never the victim), hits + misses = accesses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "replay_testlib.h"

static struct es_replay_stats run(const struct es_trace *t,
				  enum es_replay_policy p, uint32_t slots,
				  int per_layer, int d, int prefetch)
{
	struct es_replay_opts o = { .n_slots = slots, .per_layer = per_layer,
				    .lookahead = d, .prefetch = prefetch };

	return rt_run(t, p, &o);
}

/* One layer, top-1, 2 slots: 0 1 2 0 1 3 0.
 * LRU: every access misses (each evicts the one needed next): 7.
 * Belady: 0 1 2(evict 1, next at 4; 0 next at 3) 0h 1(evict 2: never)
 * 3(evict 1: never again) 0h: 5. */
static void test_lru_and_belady_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 1, 2, 0, 1, 3, 0 };
	struct es_trace t;
	struct es_replay_stats st;

	rt_build(&t, 7, 1, 4, 1, ids);
	st = run(&t, ES_RP_LRU, 2, 0, 0, 0);
	assert_int_equal(st.misses, 7);
	assert_int_equal(st.evictions, 5);
	st = run(&t, ES_RP_BELADY, 2, 0, 0, 0);
	assert_int_equal(st.misses, 5);
	assert_int_equal(st.hits, 2);
	es_trace_fini(&t);
}

/* 0 0 1 2 1 3, 2 slots.  LFU (counts kept across evictions, ties by
 * recency): 0m 0h 1m 2m(evict 1: count 1 < 2) 1m(evict 2: 1 vs 2)
 * 3m(0 and 1 both count 2; 0 is older) = 5 misses.
 * LRU: 0m 0h 1m 2m(evict 0) 1h 3m = 4. */
static void test_lfu_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 0, 1, 2, 1, 3 };
	struct es_trace t;

	rt_build(&t, 6, 1, 4, 1, ids);
	assert_int_equal(run(&t, ES_RP_LFU, 2, 0, 0, 0).misses, 5);
	assert_int_equal(run(&t, ES_RP_LRU, 2, 0, 0, 0).misses, 4);
	es_trace_fini(&t);
}

/* 2Q with 4 slots (A1in a quarter: 1, A1out half: 2), top-1:
 * 0 1 2 3 4 0 1 2 5 0 1.  0-3 fill A1in; 4 evicts 0 (oldest A1in, to
 * A1out); 0 evicts 1 and, found in A1out, enters Am; 1 evicts 2 -> Am;
 * 2 evicts 3 -> Am; 5: A1in holds 1 (not above its quarter), so Am's LRU 0
 * goes, 5 -> A1in; 0 evicts 4 (A1in over its quarter again), 0 -> A1in
 * (no longer in A1out); 1 hits.  10 misses; LRU: 9. */
static void test_2q_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 1, 2, 3, 4, 0, 1, 2, 5, 0, 1 };
	struct es_trace t;

	rt_build(&t, 11, 1, 6, 1, ids);
	assert_int_equal(run(&t, ES_RP_2Q, 4, 0, 0, 0).misses, 10);
	assert_int_equal(run(&t, ES_RP_LRU, 4, 0, 0, 0).misses, 9);
	es_trace_fini(&t);
}

/* Least-Stale (as implemented: predicted next use = last use + mean reuse
 * interval, at least 1; the farthest goes), one layer, top-1, 2 slots:
 * 0 1 0 1 2 0 2 0.  t0 0m (next 0+1); t1 1m (1+1); t2 0h (interval 2:
 * 2+2); t3 1h (3+2); t4 2m: 1's 5 is farther than 0's 4, 1 goes (2: 4+1);
 * t5 0h (interval 3/4 2 + 1/4 3 = 2.25: 7.25); t6 2h; t7 0h: 3 misses,
 * Belady's 3.  LRU evicts 0 at t4 and misses 4 times. */
static void test_lstale_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 1, 0, 1, 2, 0, 2, 0 };
	struct es_trace t;

	rt_build(&t, 8, 1, 3, 1, ids);
	assert_int_equal(run(&t, ES_RP_LSTALE, 2, 0, 0, 0).misses, 3);
	assert_int_equal(run(&t, ES_RP_LRU, 2, 0, 0, 0).misses, 4);
	assert_int_equal(run(&t, ES_RP_BELADY, 2, 0, 0, 0).misses, 3);
	es_trace_fini(&t);
}

/* top-2 with 2 slots: every step fills the pool with its own pinned pair,
 * so the victim must be the one expert the step does not use. */
static void test_pins_respected(void **state)
{
	static const uint16_t ids[] = { 0, 1, 1, 2, 0, 2, 2, 0 };
	struct es_trace t;

	rt_build(&t, 4, 1, 3, 2, ids);
	for (int p = 0; p < ES_RP_N_BASE; p++) {
		struct es_replay_stats st = run(&t, p, 2, 0, 0, 0);

		/* {0,1} 2 loads, {1,2} 1, {0,2} 1, {2,0} 0 */
		assert_int_equal(st.misses, 4);
		assert_int_equal(st.max_resident, 2);
	}
	/* one slot fewer than the top-k: refused, not run */
	{
		struct es_replay_opts o = { .n_slots = 1 };
		struct es_replay_stats st;
		struct st_diag diag = { "" };

		assert_int_equal(es_replay_run(&t, ES_RP_LRU, &o, &st, &diag),
				 -ST_E_BUDGET);
		assert_non_null(strstr(diag.msg, "at least 2 slots"));
	}
	es_trace_fini(&t);
}

/* Two layers, top-1, one global pool of 2 slots.
 * t0: L0 {0}, L1 {0}; t1: L0 {0}, L1 {1}.
 * la-lru (d = 1, prefetch): step 0 misses (0,0) and prefetches (1,0);
 * step 1 hits it; step 2 hits (0,0) and prefetches (1,1), evicting (1,0)
 * ((0,0) is pinned); step 3 hits.  loads 3 = 1 miss + 2 prefetch loads,
 * as many as plain LRU: a prefetch is a load, not a free hit. */
static void test_prefetch_counts_as_load(void **state)
{
	static const uint16_t ids[] = { 0, 0, 0, 1 };
	struct es_trace t;
	struct es_replay_stats la, lru;

	rt_build(&t, 2, 2, 2, 1, ids);
	la = run(&t, ES_RP_LRU, 2, 0, 1, 1);
	assert_int_equal(la.accesses, 4);
	assert_int_equal(la.misses, 1);
	assert_int_equal(la.prefetch_loads, 2);
	assert_int_equal(la.prefetch_used, 2);
	assert_int_equal(la.hits, 3);
	lru = run(&t, ES_RP_LRU, 2, 0, 0, 0);
	assert_int_equal(lru.misses, 3);
	assert_int_equal(la.misses + la.prefetch_loads, lru.misses);
	/* without prefetch the look-ahead only protects: plain misses */
	assert_int_equal(run(&t, ES_RP_LRU, 2, 0, 1, 0).prefetch_loads, 0);
	es_trace_fini(&t);
}

/* Batched order (rows of one forward layer by layer): t0 L0 {0}, t1 L0 {1},
 * t0 L1 {2}, t1 L1 {3}; one global pool of 2 slots; la-lru d = 1.
 * step 0: miss (0,0), prefetch (1,2).  step 1: miss (0,1) evicts (0,0), not
 * the prefetched (1,2) still awaiting use; the prefetch of (1,3) finds only
 * the pinned (0,1) and the awaiting (1,2): dropped, not evicting it.
 * step 2: hit (1,2).  step 3: miss (1,3) evicts (0,1) (older).
 * So 3 misses, 1 prefetch load, used, none wasted. */
static void test_prefetch_never_evicts_pending(void **state)
{
	static const uint16_t ids[4] = { 0, 1, 2, 3 };
	static const int tok[4] = { 0, 1, 0, 1 }, lay[4] = { 0, 0, 1, 1 };
	struct es_trace t;
	struct es_replay_stats st;

	memset(&t, 0, sizeof(t));
	for (int i = 0; i < 4; i++)
		assert_int_equal(es_trace_push(&t, (uint32_t)tok[i], lay[i],
					       &ids[i], 1), 0);
	t.n_experts = 4;
	t.batched = 1;
	es_trace_seal(&t);
	st = run(&t, ES_RP_LRU, 2, 0, 1, 1);
	assert_int_equal(st.misses, 3);
	assert_int_equal(st.prefetch_loads, 1);
	assert_int_equal(st.prefetch_used, 1);
	assert_int_equal(st.prefetch_wasted, 0);
	assert_int_equal(st.hits, 1);
	es_trace_fini(&t);
}

/* 5 slots over 2 layers: 3 + 2; the smaller pool bounds residency. */
static void test_split(void **state)
{
	uint16_t ids[2 * 40];
	struct es_trace t;
	struct es_replay_stats st;

	for (int i = 0; i < 80; i++)
		ids[i] = (uint16_t)((i * 7 + i / 3) % 6);
	rt_build(&t, 40, 2, 6, 1, ids);
	st = run(&t, ES_RP_LRU, 5, 1, 0, 0);
	assert_int_equal(st.min_capacity, 2);
	assert_int_equal(st.max_resident, 3);
	st = run(&t, ES_RP_LRU, 5, 0, 0, 0);
	assert_int_equal(st.max_resident, 5);
	es_trace_fini(&t);
}

/* Every policy on a longer random trace, both splits, with and without
 * look-ahead: invariants only (counts are checked by the tests above and
 * against the exhaustive optimum in test_replay_belady). */
static void test_invariants_random(void **state)
{
	enum { T = 400, L = 4, E = 16, K = 3 };
	static uint16_t ids[T * L * K];
	unsigned seed = 99;
	struct es_trace t;

	for (int s = 0; s < T * L; s++)
		for (int j = 0; j < K; j++) {
			uint16_t id;
			int dup;

			do {
				id = (uint16_t)(rand_r(&seed) % 4 ?
						rand_r(&seed) % 5 :
						rand_r(&seed) % E);
				dup = 0;
				for (int i = 0; i < j; i++)
					dup |= ids[s * K + i] == id;
			} while (dup);
			ids[s * K + j] = id;
		}
	rt_build(&t, T, L, E, K, ids);
	for (int p = 0; p < ES_RP_N_BASE; p++)
		for (int split = 0; split <= 1; split++)
			for (int d = 0; d <= 3; d++) {
				struct es_replay_stats st =
					run(&t, p, 16, split, d, 1);

				assert_int_equal(st.accesses, T * L * K);
				assert_true(st.max_resident <= 16);
				assert_true(st.max_resident <=
					    (split ? 4u : 16u));
				assert_true(st.prefetch_used +
					    st.prefetch_wasted <=
					    st.prefetch_loads);
				assert_true(st.evictions <=
					    st.misses + st.prefetch_loads);
			}
	es_trace_fini(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lru_and_belady_by_hand),
		cmocka_unit_test(test_lfu_by_hand),
		cmocka_unit_test(test_2q_by_hand),
		cmocka_unit_test(test_lstale_by_hand),
		cmocka_unit_test(test_pins_respected),
		cmocka_unit_test(test_prefetch_counts_as_load),
		cmocka_unit_test(test_prefetch_never_evicts_pending),
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_invariants_random),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
