/*
 * test_replay_belady.c — the replay's Belady figure equals the optimum
 * found by exhaustive search over every eviction choice, on many small
 * random traces (few experts, few slots, one or two layers, top-1 to top-3,
 * global and per-layer pools), as does future-N when N covers the whole
 * trace; and no online policy, with or without
 * look-ahead prefetch or draft foresight, ever loads fewer experts than
 * Belady.
 *
 * The exhaustive search follows the replay's rules (es_replay.h): a step's
 * experts are all pinned during the step, a miss loads one expert and, when
 * its pool is full, evicts any resident expert of that pool that the step
 * does not pin.  It is a depth-first search memoised on (access index,
 * resident set), which is exact: the number of loads from a state depends on
 * nothing else.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay_testlib.h"

#define MAX_KEYS 12
#define MAX_ACC 48

struct bf {
	int n_acc;
	int key[MAX_ACC];      /* accessed key */
	uint32_t pinned[MAX_ACC]; /* keys the access's step pins (mask) */
	int pool_of[MAX_KEYS];
	uint32_t pool_mask[MAX_KEYS];
	int cap[MAX_KEYS];
	short memo[MAX_ACC][1 << MAX_KEYS];
};

static int popc(uint32_t x)
{
	return __builtin_popcount(x);
}

static int bf_opt(struct bf *b, int i, uint32_t mask)
{
	int key, p, best = 1 << 14;
	uint32_t cand;

	if (i == b->n_acc)
		return 0;
	if (b->memo[i][mask] >= 0)
		return b->memo[i][mask];
	key = b->key[i];
	p = b->pool_of[key];
	if (mask & (1u << key)) {
		best = bf_opt(b, i + 1, mask);
	} else if (popc(mask & b->pool_mask[p]) < b->cap[p]) {
		best = 1 + bf_opt(b, i + 1, mask | (1u << key));
	} else {
		cand = mask & b->pool_mask[p] & ~b->pinned[i];
		for (int v = 0; v < MAX_KEYS; v++)
			if (cand & (1u << v)) {
				int r = 1 + bf_opt(b, i + 1, (mask & ~(1u << v)) |
						   (1u << key));
				if (r < best)
					best = r;
			}
	}
	b->memo[i][mask] = (short)best;
	return best;
}

/* Exhaustive optimum of trace t with n_slots (split like es_replay). */
static int brute_force(const struct es_trace *t, uint32_t n_slots,
		       int per_layer)
{
	static struct bf b;
	int n_pools = per_layer ? t->n_layers : 1;

	memset(&b, 0, sizeof(b));
	memset(b.memo, 0xff, sizeof(b.memo));
	for (int p = 0; p < n_pools; p++)
		b.cap[p] = (int)(n_slots / (uint32_t)n_pools) +
			   (p < (int)(n_slots % (uint32_t)n_pools) ? 1 : 0);
	for (int key = 0; key < t->n_layers * t->n_experts; key++) {
		b.pool_of[key] = per_layer ? key / t->n_experts : 0;
		b.pool_mask[b.pool_of[key]] |= 1u << key;
	}
	for (size_t s = 0; s < t->n_steps; s++) {
		const struct es_trace_step *st = &t->steps[s];
		uint32_t pins = 0;

		for (int j = 0; j < st->n; j++)
			pins |= 1u << (st->layer * t->n_experts +
				       t->ids[st->first + j]);
		for (int j = 0; j < st->n; j++) {
			assert_true(b.n_acc < MAX_ACC);
			b.key[b.n_acc] = st->layer * t->n_experts +
					 t->ids[st->first + j];
			b.pinned[b.n_acc++] = pins;
		}
	}
	return bf_opt(&b, 0, 0);
}

/* A random trace: ids drawn with a skew (experts 0 and 1 more often) so
 * that reuse is frequent and the choices matter. */
static void random_trace(struct es_trace *t, unsigned *seed, int *ret_k)
{
	int L = 1 + rand_r(seed) % 2;
	int E = 2 + rand_r(seed) % (L == 1 ? 7 : 5);  /* L * E <= 12 */
	int k = 1 + rand_r(seed) % (E < 3 ? E : 3);
	int max_tok = (MAX_ACC - 4) / (L * k);
	int T = 3 + rand_r(seed) % (max_tok - 2 < 12 ? max_tok - 2 : 12);
	uint16_t ids[MAX_ACC];
	int n = 0;

	for (int tok = 0; tok < T; tok++)
		for (int l = 0; l < L; l++)
			for (int j = 0; j < k; j++) {
				uint16_t id;
				int dup;

				do {
					id = (uint16_t)(rand_r(seed) % 3 == 0 ?
						rand_r(seed) % 2 :
						rand_r(seed) % E);
					dup = 0;
					for (int i = 0; i < j; i++)
						if (ids[n - j + i] == id)
							dup = 1;
				} while (dup);
				ids[n++] = id;
			}
	rt_build(t, T, L, E, k, ids);
	*ret_k = k;
}

static void test_belady_equals_brute_force(void **state)
{
	unsigned seed = 12345;
	int checked = 0, differs_from_lru = 0;

	for (int it = 0; it < 600; it++) {
		struct es_trace t;
		int k, per_layer = it % 2;

		random_trace(&t, &seed, &k);
		{
			uint32_t keys = (uint32_t)(t.n_layers * t.n_experts);
			uint32_t min = (uint32_t)k *
				(per_layer ? (uint32_t)t.n_layers : 1);
			uint32_t slots = min + (uint32_t)rand_r(&seed) %
				(keys - min + 1);
			struct es_replay_opts o = { .n_slots = slots,
						    .per_layer = per_layer };
			struct es_replay_stats bel, lru;
			int opt = brute_force(&t, slots, per_layer);

			assert_int_equal(es_replay_run(&t, ES_RP_BELADY, &o,
						       &bel, NULL), 0);
			if ((int)bel.misses != opt)
				fprintf(stderr, "iteration %d: %d layers x %d "
					"experts, top-%d, %zu steps, %u slots "
					"%s: belady %llu, optimum %d\n", it,
					t.n_layers, t.n_experts, k, t.n_steps,
					slots, per_layer ? "per layer" :
					"global",
					(unsigned long long)bel.misses, opt);
			assert_int_equal((int)bel.misses, opt);
			assert_int_equal(bel.prefetch_loads, 0);
			/* future-N with N past the end of the trace sees
			 * everything: it must be optimal too */
			{
				struct es_replay_opts fo = o;
				struct es_replay_stats fut;

				fo.window_tokens = 1000;
				assert_int_equal(es_replay_run(&t, ES_RP_FUTURE,
						&fo, &fut, NULL), 0);
				assert_int_equal((int)fut.misses, opt);
			}
			assert_int_equal(es_replay_run(&t, ES_RP_LRU, &o, &lru,
						       NULL), 0);
			if (lru.misses > bel.misses)
				differs_from_lru++;
			checked++;
		}
		es_trace_fini(&t);
	}
	/* the traces are not all trivial: LRU is worse on many of them */
	assert_true(differs_from_lru > checked / 10);
}

static void test_online_never_beats_belady(void **state)
{
	unsigned seed = 777;

	for (int it = 0; it < 300; it++) {
		struct es_trace t;
		int k, per_layer = it % 2;
		uint32_t keys, min, slots;
		struct es_replay_stats bel;

		random_trace(&t, &seed, &k);
		keys = (uint32_t)(t.n_layers * t.n_experts);
		min = (uint32_t)k * (per_layer ? (uint32_t)t.n_layers : 1);
		slots = min + (uint32_t)rand_r(&seed) % (keys - min + 1);
		{
			struct es_replay_opts o = { .n_slots = slots,
						    .per_layer = per_layer };

			assert_int_equal(es_replay_run(&t, ES_RP_BELADY, &o,
						       &bel, NULL), 0);
		}
		for (int p = 0; p < ES_RP_N_BASE; p++) {
			if (p == ES_RP_BELADY)
				continue;
			for (int la = 0; la <= 2; la++)
				for (int pf = 0; pf <= 1; pf++) {
					struct es_replay_opts o = {
						.n_slots = slots,
						.per_layer = per_layer,
						.lookahead = la,
						.prefetch = pf };
					struct es_replay_stats st;

					assert_int_equal(es_replay_run(&t, p,
						&o, &st, NULL), 0);
					assert_true(st.misses +
						    st.prefetch_loads >=
						    bel.misses);
					assert_false(st.over_capacity);
					assert_false(st.pinned_evicted);
					assert_int_equal(st.hits + st.misses,
							 st.accesses);
				}
			/* draft foresight (wrong guesses, prefetch) */
			for (int v = 0; v < 4 && p != ES_RP_FUTURE; v++) {
				struct es_replay_opts o = {
					.n_slots = slots,
					.per_layer = per_layer,
					.draft_len = 1 + v % 3,
					.draft_accept = v < 2 ? 0.9 : 0.5,
					.draft_per_step = v & 1,
					.draft_prefetch = v >= 2 };
				struct es_replay_stats st;

				assert_int_equal(es_replay_run(&t, p, &o, &st,
							       NULL), 0);
				assert_true(st.misses + st.prefetch_loads >=
					    bel.misses);
				assert_false(st.over_capacity);
				assert_false(st.pinned_evicted);
			}
		}
		es_trace_fini(&t);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_belady_equals_brute_force),
		cmocka_unit_test(test_online_never_beats_belady),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
