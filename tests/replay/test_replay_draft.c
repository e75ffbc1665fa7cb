/*
 * test_replay_draft.c — draft foresight (es_replay.h, es_replay_draft.c) on
 * hand-made traces with hand-computed counts: the sliding and per-step
 * schedules, the prefetch of drafted experts (a load, never a free hit);
 * the limits the issue sets: with every draft accepted the sliding window
 * is future-LEN (both splits), with none accepted and no wrong guesses it is the plain
 * online policy; the realised acceptance follows ACCEPT; and the invariants
 * on a long random trace (never more resident than slots, pinned never
 * evicted, hits + misses = accesses).  Never fewer loads than Belady:
 * test_replay_belady.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "replay_testlib.h"

static struct es_replay_stats run_draft(const struct es_trace *t,
					enum es_replay_policy p,
					uint32_t slots, int per_layer,
					int len, double acc, int per_step,
					int no_wrong, int prefetch)
{
	struct es_replay_opts o = { .n_slots = slots, .per_layer = per_layer,
				    .draft_len = len, .draft_accept = acc,
				    .draft_per_step = per_step,
				    .draft_no_wrong = no_wrong,
				    .draft_prefetch = prefetch };

	return rt_run(t, p, &o);
}

static struct es_replay_stats run_plain(const struct es_trace *t,
					enum es_replay_policy p,
					uint32_t slots, int per_layer,
					int future)
{
	struct es_replay_opts o = { .n_slots = slots, .per_layer = per_layer,
				    .window_tokens = future };
	struct es_replay_stats st;

	assert_int_equal(es_replay_run(t, p, &o, &st, NULL), 0);
	return st;
}

/* One layer, top-1, 2 slots, lru base, LEN 2, ACCEPT 1:
 * tokens 0..6 use experts 0 1 2 0 1 3 0.
 * Sliding (a draft at every token, window = the next 2 tokens):
 *   t0 miss 0; t1 miss 1; t2 miss 2: 0 (next at t3) and 1 (t4) are both
 *   known, the farther 1 goes; t3 hit 0; t4 miss 1: 0 known (t6), 2 not:
 *   2 goes; t5 miss 3: 0 known, 1 goes; t6 hit 0.  5 misses (= Belady);
 *   7 drafts, accepted 2+2+2+2+2+1+0 = 11 (none past the trace's end).
 * Per step (drafts at t0, t3, t6):
 *   t0 miss 0 (knows t1, t2); t1 miss 1 (knows t2); t2 miss 2 (knows
 *   nothing: 0 and 1 by LRU, 0 goes); t3 new draft (knows t4: 1, t5: 3),
 *   miss 0: 1 known, 2 goes; t4 hit 1; t5 miss 3 (knows nothing; LRU: 0
 *   goes); t6 miss 0 (draft of nothing; LRU: 1 goes).  6 misses; 3 drafts,
 *   2 + 2 + 0 accepted.  Plain LRU: 7. */
static void test_schedules_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 1, 2, 0, 1, 3, 0 };
	struct es_trace t;
	struct es_replay_stats st;

	rt_build(&t, 7, 1, 4, 1, ids);
	st = run_draft(&t, ES_RP_LRU, 2, 0, 2, 1.0, 0, 0, 0);
	assert_int_equal(st.misses, 5);
	assert_int_equal(st.draft_events, 7);
	assert_int_equal(st.draft_accepted, 11);
	st = run_draft(&t, ES_RP_LRU, 2, 0, 2, 1.0, 1, 0, 0);
	assert_int_equal(st.misses, 6);
	assert_int_equal(st.draft_events, 3);
	assert_int_equal(st.draft_accepted, 4);
	assert_int_equal(run_plain(&t, ES_RP_LRU, 2, 0, 0).misses, 7);
	assert_int_equal(run_plain(&t, ES_RP_BELADY, 2, 0, 0).misses, 5);
	es_trace_fini(&t);
}

/* Prefetch of drafted experts, one layer, top-1, 2 slots, LEN 1, ACCEPT 1,
 * lru: experts 0 1 0 2.  t0 miss 0, prefetches 1 (t1's expert); t1 hit;
 * t2 hit 0, prefetches 2 evicting 1 (0 is pinned); t3 hit.  1 miss + 2
 * prefetch loads = 3 loads, as many as plain LRU's 3 misses: a prefetch is
 * a load. */
static void test_prefetch_by_hand(void **state)
{
	static const uint16_t ids[] = { 0, 1, 0, 2 };
	struct es_trace t;
	struct es_replay_stats st;

	rt_build(&t, 4, 1, 3, 1, ids);
	st = run_draft(&t, ES_RP_LRU, 2, 0, 1, 1.0, 0, 0, 1);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.prefetch_loads, 2);
	assert_int_equal(st.prefetch_used, 2);
	assert_int_equal(st.prefetch_wasted, 0);
	assert_int_equal(st.hits, 3);
	assert_int_equal(st.misses + st.prefetch_loads,
			 run_plain(&t, ES_RP_LRU, 2, 0, 0).misses);
	es_trace_fini(&t);
}

/* A random trace with some locality (ids drawn from a few hot experts
 * three times in four). */
static void random_trace(struct es_trace *t, int n_tok, int n_lay, int n_exp,
			 int k, unsigned seed)
{
	uint16_t *ids = malloc((size_t)n_tok * n_lay * k * sizeof(*ids));

	assert_non_null(ids);
	for (int s = 0; s < n_tok * n_lay; s++)
		for (int j = 0; j < k; j++) {
			uint16_t id;
			int dup;

			do {
				id = (uint16_t)(rand_r(&seed) % 4 ?
						rand_r(&seed) % (n_exp / 2) :
						rand_r(&seed) % n_exp);
				dup = 0;
				for (int i = 0; i < j; i++)
					dup |= ids[s * k + i] == id;
			} while (dup);
			ids[s * k + j] = id;
		}
	rt_build(t, n_tok, n_lay, n_exp, k, ids);
	free(ids);
}

/* ACCEPT 1 with a new draft at every token knows the next LEN tokens and,
 * every token having been drafted and accepted, the current token's later
 * layers: exactly what future-LEN sees, hist beyond the window, in both
 * pool splits. */
static void test_accept_one_is_future(void **state)
{
	for (int it = 0; it < 6; it++) {
		struct es_trace t;
		int layers = it < 2 ? 1 : 3, per_layer = it % 2;

		random_trace(&t, 300, layers, 12, 2, 40u + (unsigned)it);
		for (int len = 1; len <= 3; len++) {
			uint32_t slots = per_layer ? 15 : 5;
			struct es_replay_stats d = run_draft(&t, ES_RP_HIST,
				slots, per_layer, len, 1.0, 0, 0, 0);
			struct es_replay_stats f = run_plain(&t, ES_RP_FUTURE,
				slots, per_layer, len);

			assert_int_equal(d.misses, f.misses);
			assert_int_equal(d.evictions, f.evictions);
		}
		es_trace_fini(&t);
	}
}

/* ACCEPT 0 without wrong guesses reveals nothing: every online base policy
 * gives exactly its plain counts.  With wrong guesses a draft still happens
 * at every token but accepts nothing. */
static void test_accept_zero_is_plain(void **state)
{
	static const int pols[] = { ES_RP_LRU, ES_RP_LRU2, ES_RP_LFU,
				    ES_RP_LFUD, ES_RP_LRFU, ES_RP_HIST,
				    ES_RP_2Q, ES_RP_LSTALE };
	struct es_trace t;

	random_trace(&t, 200, 2, 10, 2, 7);
	for (size_t i = 0; i < sizeof(pols) / sizeof(pols[0]); i++)
		for (int split = 0; split <= 1; split++) {
			struct es_replay_stats d = run_draft(&t, pols[i], 8,
				split, 2, 0.0, (int)i % 2, 1, 0);
			struct es_replay_stats p = run_plain(&t, pols[i], 8,
							     split, 0);

			assert_int_equal(d.misses, p.misses);
			assert_int_equal(d.evictions, p.evictions);
			assert_int_equal(d.draft_accepted, 0);
			d = run_draft(&t, pols[i], 8, split, 2, 0.0, 0, 0, 0);
			assert_int_equal(d.draft_events, 200);
			assert_int_equal(d.draft_accepted, 0);
		}
	es_trace_fini(&t);
}

/* The accepted prefix follows P(A >= j) = ACCEPT^j: over 20,000 sliding
 * drafts of 2 tokens at ACCEPT 0.7 the mean of A is 0.7 + 0.49 = 1.19;
 * A's standard deviation is 0.87, the mean's standard error 0.006, so
 * 0.03 is five of them. */
static void test_acceptance_rate(void **state)
{
	enum { N = 20000 };
	static uint16_t ids[N];
	struct es_trace t;
	struct es_replay_stats st;
	double mean;

	for (int i = 0; i < N; i++)
		ids[i] = (uint16_t)(i % 3);
	rt_build(&t, N, 1, 3, 1, ids);
	st = run_draft(&t, ES_RP_LRU, 2, 0, 2, 0.7, 0, 0, 0);
	assert_int_equal(st.draft_events, N);
	mean = (double)st.draft_accepted / (double)(N - 2);
	assert_true(mean > 1.19 - 0.03 && mean < 1.19 + 0.03);
	/* the draws depend on the seed only: the same again */
	assert_int_equal(run_draft(&t, ES_RP_LRU, 2, 0, 2, 0.7, 0, 0, 0)
			 .draft_accepted, st.draft_accepted);
	es_trace_fini(&t);
}

/* Every online base policy with drafts, both schedules, with and without
 * wrong guesses and prefetch, both splits: the invariants run_draft checks
 * and the prefetch accounting. */
static void test_invariants_random(void **state)
{
	struct es_trace t;

	random_trace(&t, 300, 4, 16, 3, 99);
	for (int p = 0; p < ES_RP_N_BASE; p++) {
		if (p == ES_RP_BELADY || p == ES_RP_FUTURE)
			continue;
		for (int v = 0; v < 16; v++) {
			int split = v & 1;
			struct es_replay_stats st = run_draft(&t, p, 16, split,
				1 + v % 4, 0.6, (v >> 1) & 1, (v >> 2) & 1,
				(v >> 3) & 1);

			assert_int_equal(st.accesses, 300 * 4 * 3);
			assert_true(st.max_resident <= (split ? 4u : 16u));
			assert_true(st.prefetch_used + st.prefetch_wasted <=
				    st.prefetch_loads);
			assert_true(st.evictions <=
				    st.misses + st.prefetch_loads);
			if (!((v >> 3) & 1))
				assert_int_equal(st.prefetch_loads, 0);
		}
	}
	es_trace_fini(&t);
}

/* Draft foresight is refused with Belady, future-N, look-ahead and on a
 * batched trace. */
static void test_refused(void **state)
{
	static const uint16_t ids[] = { 0, 1, 0, 1 };
	struct es_trace t;
	struct es_replay_opts o = { .n_slots = 2, .draft_len = 1,
				    .draft_accept = 0.5 };
	struct es_replay_stats st;
	struct st_diag diag = { "" };

	rt_build(&t, 4, 1, 2, 1, ids);
	assert_int_equal(es_replay_run(&t, ES_RP_BELADY, &o, &st, NULL),
			 -EINVAL);
	o.lookahead = 1;
	assert_int_equal(es_replay_run(&t, ES_RP_LRU, &o, &st, NULL),
			 -EINVAL);
	o.lookahead = 0;
	o.draft_len = ES_REPLAY_MAX_DRAFT + 1;
	assert_int_equal(es_replay_run(&t, ES_RP_LRU, &o, &st, NULL),
			 -EINVAL);
	o.draft_len = 1;
	t.batched = 1;
	assert_int_equal(es_replay_run(&t, ES_RP_LRU, &o, &st, &diag),
			 -EINVAL);
	assert_non_null(strstr(diag.msg, "batch-1"));
	es_trace_fini(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_schedules_by_hand),
		cmocka_unit_test(test_prefetch_by_hand),
		cmocka_unit_test(test_accept_one_is_future),
		cmocka_unit_test(test_accept_zero_is_plain),
		cmocka_unit_test(test_acceptance_rate),
		cmocka_unit_test(test_invariants_random),
		cmocka_unit_test(test_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
