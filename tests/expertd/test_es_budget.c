/*
 * test_es_budget.c — expertd's side of one memory budget, on the daemon's
 * own functions (no ledger, no process):
 *  - the marginal value of expert memory (es_budget_value) against an
 *    independent selection on a hand-made table and on random ones;
 *  - the activation rates per second (es_budget_rates and the decayed
 *    token rate) against their closed forms on a synthetic routing;
 *  - the allocator obeys the slots the target allows and goes over only
 *    for a demand load that finds everything else pinned or loading;
 *  - a released record's pages leave the segment (st_blocks) and read as
 *    zeros.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "es_daemon.h"
#include "es_pool.h"
#include "st_util.h"

/* Relative tolerance of the floating-point comparisons: the sums below
 * add at most a few hundred terms in another order. */
#define TOL 1e-12

static int near(double a, double b)
{
	return fabs(a - b) <= TOL * (fabs(a) + fabs(b)) + 1e-300;
}

/* ---- values ---- */

static void test_value_by_hand(void **state)
{
	/* non-resident: 1 (1), 3 (0.5), 4 (2), 7 (6); resident: 0 (5),
	 * 2 (3), 5 (4), 6 (0.25) */
	const double rate[8] = { 5, 1, 3, 0.5, 2, 4, 0.25, 6 };
	const uint8_t res[8] = { 1, 0, 1, 0, 0, 1, 1, 0 };
	const uint64_t step = 512ull << 20; /* 1/2 GiB */
	double g, l;

	/* no free slot, two slots per step, 1 ms per miss: per GiB x2 */
	assert_int_equal(es_budget_value(rate, res, 8, 0, 2, 1e6, step, &g,
					 &l), 0);
	assert_true(near(g, (6 + 2) * 1e6 * 2));
	assert_true(near(l, (0.25 + 3) * 1e6 * 2));
	/* one free slot: it takes expert 7 anyway; giving up two slots
	 * costs the free one and the least active resident */
	assert_int_equal(es_budget_value(rate, res, 8, 1, 2, 1e6, step, &g,
					 &l), 0);
	assert_true(near(g, (2 + 1) * 1e6 * 2));
	assert_true(near(l, 0.25 * 1e6 * 2));
	/* free slots cover the step: nothing lost */
	assert_int_equal(es_budget_value(rate, res, 8, 2, 2, 1e6, step, &g,
					 &l), 0);
	assert_true(l == 0);
	assert_true(near(g, (1 + 0.5) * 1e6 * 2));
	/* the whole model resident: nothing to gain */
	{
		const uint8_t all[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };

		assert_int_equal(es_budget_value(rate, all, 8, 0, 3, 1e6, step,
						 &g, &l), 0);
		assert_true(g == 0);
		assert_true(near(l, (0.25 + 0.5 + 1) * 1e6 * 2));
	}
}

/* Sum of the k-th .. (k+s-1)-th largest (want_max) or the s smallest
 * rates among those with res[i] == in, by repeated selection. */
static double select_sum(const double *rate, const uint8_t *res, size_t n,
			 int in, int want_max, uint64_t skip, uint64_t s)
{
	uint8_t *used = calloc(n, 1);
	double sum = 0;

	assert_non_null(used);
	for (uint64_t k = 0; k < skip + s; k++) {
		long best = -1;

		for (size_t i = 0; i < n; i++) {
			if (used[i] || res[i] != in)
				continue;
			if (best < 0 || (want_max ? rate[i] > rate[best] :
						    rate[i] < rate[best]))
				best = (long)i;
		}
		if (best < 0)
			break;
		used[best] = 1;
		if (k >= skip)
			sum += rate[best];
	}
	free(used);
	return sum;
}

static void test_value_random(void **state)
{
	srand(24);
	for (int t = 0; t < 200; t++) {
		size_t n = 1 + (size_t)(rand() % 60);
		double rate[60], g, l, eg, el, miss = 1e3 + rand() % 100000;
		uint8_t res[60];
		uint64_t n_free = (uint64_t)(rand() % 4);
		uint64_t s = 1 + (uint64_t)(rand() % 6);
		uint64_t step = (uint64_t)(1 + rand() % 4096) << 20;
		double per_gib = miss / ((double)step / (1ull << 30));

		for (size_t i = 0; i < n; i++) {
			rate[i] = (double)(rand() % 1000) / 7.0;
			res[i] = (uint8_t)(rand() % 2);
		}
		assert_int_equal(es_budget_value(rate, res, n, n_free, s, miss,
						 step, &g, &l), 0);
		eg = select_sum(rate, res, n, 0, 1, n_free, s) * per_gib;
		el = select_sum(rate, res, n, 1, 0, 0,
				s > n_free ? s - n_free : 0) * per_gib;
		assert_true(near(g, eg));
		assert_true(near(l, el));
	}
}

/* ---- rates ---- */

static void test_rates(void **state)
{
	const double h = 4.0, tau = ES_BUDGET_RATE_TAU_S;
	/* expert routed at each of 8 tokens, layer 0 and layer 1 (k = 1) */
	const uint32_t route0[8] = { 0, 1, 0, 2, 0, 0, 1, 2 };
	const uint32_t route1[8] = { 2, 2, 2, 1, 0, 2, 2, 1 };
	struct es_actstats st;
	struct es_budget_rate r = { 0 };
	double rate[6], mass = 0, tok_w = 0, time_w = 0, tps;
	uint64_t tokens = 0, t0 = 1000000000ull;

	assert_int_equal(es_actstats_init(&st, 2, 3, h, 1), 0);
	for (int t = 0; t < 8; t++) {
		es_actstats_tokens(&st, 1);
		es_actstats_add(&st, 0, route0[t]);
		es_actstats_add(&st, 1, route1[t]);
	}
	/* tokens per second: 50 tokens a second for 20 s, then 10 s idle,
	 * sampled each second */
	es_budget_rate_update(&r, 0, t0);
	assert_true(es_budget_rate_tps(&r) == 0);
	for (int k = 1; k <= 30; k++) {
		tokens += k <= 20 ? 50 : 0;
		es_budget_rate_update(&r, tokens,
				      t0 + (uint64_t)k * 1000000000ull);
	}
	/* closed form: each second's tokens and length weighted by
	 * exp(-age / tau), age = 30 - k */
	for (int k = 1; k <= 30; k++) {
		double w = exp(-(30.0 - k) / tau);

		tok_w += (k <= 20 ? 50.0 : 0.0) * w;
		time_w += w;
	}
	tps = es_budget_rate_tps(&r);
	assert_true(fabs(tps - tok_w / time_w) <= 1e-9 * tps);
	assert_true(tps > 10 && tps < 50); /* decaying after the idle time */
	es_budget_rates(&st, tps, rate);
	/* rate of (l, e) = sum over its tokens t of 2^(-(7 - t) / h) over
	 * sum over i < 8 of 2^(-i / h), times tps */
	for (int i = 0; i < 8; i++)
		mass += pow(2.0, -i / h);
	for (uint32_t l = 0; l < 2; l++)
		for (uint32_t e = 0; e < 3; e++) {
			double c = 0;

			for (int t = 0; t < 8; t++)
				if ((l ? route1 : route0)[t] == e)
					c += pow(2.0, -(7 - t) / h);
			assert_true(fabs(rate[l * 3 + e] - c / mass * tps) <=
				    1e-9 * tps);
		}
	/* a reset of the statistics restarts the rate without a jump */
	es_budget_rate_update(&r, 5, t0 + 31000000000ull);
	assert_true(fabs(es_budget_rate_tps(&r) - tps) <= 1e-12 * tps);
	es_actstats_fini(&st);
}

static void test_slots(void **state)
{
	/* target / record, at least top-k, at most the pool */
	assert_int_equal(es_budget_slots(10 * 4096 + 100, 4096, 2, 24), 10);
	assert_int_equal(es_budget_slots(4096, 4096, 2, 24), 2);
	assert_int_equal(es_budget_slots(UINT64_MAX, 4096, 2, 24), 24);
}

/* ---- the pool under a target ---- */

#define RB (2 * 4096)

struct mpool {
	int fd;
	void *base;
	struct es_pool_layout l;
	struct es_pool p;
};

/* A pool of 1 layer x 8 experts, 4 slots of RB in a memfd (a shared
 * tmpfs mapping, as /dev/shm). */
static void mpool_open(struct mpool *m)
{
	const struct es_pool_geom g = { 1, 8, 4, 2, RB, 1 };

	assert_int_equal(es_pool_layout_compute(&g, &m->l), 0);
	m->fd = memfd_create("es_budget", 0);
	assert_true(m->fd >= 0);
	assert_int_equal(ftruncate(m->fd, (off_t)m->l.total_bytes), 0);
	m->base = mmap(NULL, m->l.total_bytes, PROT_READ | PROT_WRITE,
		       MAP_SHARED, m->fd, 0);
	assert_true(m->base != MAP_FAILED);
	assert_int_equal(es_pool_format(m->base, m->l.total_bytes, &g, &m->l),
			 0);
	memset(&m->p, 0, sizeof(m->p));
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		m->p.pidfd[c] = -1;
	m->p.geom = g;
	assert_int_equal(es_pool_view_init(m->base, m->l.total_bytes, 1,
					   &m->p.v, NULL), 0);
}

static void mpool_close(struct mpool *m)
{
	munmap(m->base, m->l.total_bytes);
	close(m->fd);
}

/* Loads key e into slot s (READY, record filled with e + 1). */
static void load(struct mpool *m, int s, uint32_t e)
{
	es_pool_slot_assign(&m->p, (uint32_t)s, es_key(0, e));
	memset(es_pool_record(&m->p.v, (uint32_t)s), (int)e + 1, RB);
	es_pool_slot_publish(&m->p, (uint32_t)s, 0);
}

static void test_alloc_allowed(void **state)
{
	struct mpool m;
	int ev, s;

	mpool_open(&m);
	m.p.allowed = 2;
	for (int i = 0; i < 2; i++) {
		s = es_pool_alloc_slot(&m.p, 0, &ev);
		assert_int_equal(s, i);
		assert_int_equal(ev, 0);
		load(&m, s, (uint32_t)i);
	}
	atomic_store(&m.p.v.slots[0].last_use_ns, 100);
	atomic_store(&m.p.v.slots[1].last_use_ns, 200);
	/* two slots in use of two allowed: the LRU one is evicted, the two
	 * EMPTY slots stay untouched */
	s = es_pool_alloc_slot(&m.p, 0, &ev);
	assert_int_equal(s, 0);
	assert_int_equal(ev, 1);
	assert_int_equal(atomic_load(&m.p.v.slots[0].state), ES_SLOT_EVICTING);
	es_pool_slot_clear(&m.p, 0);
	load(&m, 0, 5);
	assert_int_equal(es_pool_slots_used(&m.p), 2);
	/* both pinned: a prefetch or warm-up (need 0) gets nothing, a
	 * demand load goes over into an EMPTY slot and says so */
	atomic_store(&m.p.v.slots[0].pins[3], 1);
	atomic_store(&m.p.v.slots[1].pins[4], 1);
	assert_int_equal(es_pool_alloc_slot(&m.p, 0, &ev), -ST_E_BUSY);
	assert_int_equal(m.p.went_over, 0);
	s = es_pool_alloc_slot(&m.p, 1, &ev);
	assert_true(s == 2 || s == 3);
	assert_int_equal(ev, 0);
	assert_int_equal(m.p.went_over, 1);
	/* the target rises: EMPTY slots are taken again */
	m.p.allowed = 4;
	m.p.went_over = 0;
	load(&m, s, 6);
	s = es_pool_alloc_slot(&m.p, 0, &ev);
	assert_true(s == 2 || s == 3);
	assert_int_equal(ev, 0);
	assert_int_equal(m.p.went_over, 0);
	/* pinned slots kept their records through all of it */
	assert_int_equal(es_pool_record(&m.p.v, 0)[RB - 1], 6);
	assert_int_equal(es_pool_record(&m.p.v, 1)[0], 2);
	mpool_close(&m);
}

static void test_release_record(void **state)
{
	struct mpool m;
	struct stat st0, st1;
	const uint8_t *rec;

	mpool_open(&m);
	load(&m, 1, 3);
	load(&m, 2, 4);
	assert_int_equal(fstat(m.fd, &st0), 0);
	assert_int_equal(es_pool_slot_try_evict(&m.p, 1), 0);
	es_pool_slot_clear(&m.p, 1);
	assert_int_equal(es_pool_release_record(&m.p, 1), 0);
	assert_int_equal(fstat(m.fd, &st1), 0);
	printf("segment blocks %lld -> %lld (record %d bytes)\n",
	       (long long)st0.st_blocks, (long long)st1.st_blocks, RB);
	/* its pages left the file (512-byte blocks) */
	assert_true((st0.st_blocks - st1.st_blocks) * 512 >= RB);
	rec = es_pool_record(&m.p.v, 1);
	for (int i = 0; i < RB; i++)
		assert_int_equal(rec[i], 0);
	/* the neighbour is intact */
	rec = es_pool_record(&m.p.v, 2);
	assert_int_equal(rec[0], 5);
	assert_int_equal(rec[RB - 1], 5);
	mpool_close(&m);
}

/* What decides a victim's place: hot or protected (returned), the LFRU
 * count (or 0), the last use. */
static int rank_key(const struct es_evict_ctx *ev,
		    const struct es_pool_view *v, int s, double *ret_primary,
		    uint64_t *ret_last)
{
	uint64_t key = atomic_load(&v->slots[s].key);
	uint32_t e = es_key_expert(key);

	*ret_primary = ev->policy == ES_EVICT_LFRU ?
			       es_actstats_value(ev->stats, 0, e) : 0;
	*ret_last = atomic_load(&v->slots[s].last_use_ns);
	return ev->hot_key[e] || ev->protect[s];
}

/* es_policy_rank gives the order of successive es_policy_pick calls
 * (each victim skipped for the next), LRU and LFRU with hot and protected
 * slots, pinned, LOADING and FAILED ones left out. */
static void test_rank(void **state)
{
	struct mpool m;
	struct es_actstats st;
	struct es_evict_ctx ev;
	uint8_t hot[8] = { 0 }, prot[4] = { 0 }, skip[4];
	int32_t order[4];

	srand(7);
	for (int t = 0; t < 200; t++) {
		int n, k = 0, hotf;

		mpool_open(&m);
		assert_int_equal(es_actstats_init(&st, 1, 8, 4.0, 1), 0);
		memset(&ev, 0, sizeof(ev));
		ev.policy = t % 2 ? ES_EVICT_LFRU : ES_EVICT_LRU;
		ev.stats = &st;
		ev.hot_key = hot;
		ev.protect = prot;
		ev.strict = t % 5 == 0;
		for (int e = 0; e < 8; e++) {
			hot[e] = (uint8_t)(rand() % 4 == 0);
			for (int j = rand() % 3; j > 0; j--)
				es_actstats_add(&st, 0, (uint32_t)e);
		}
		for (int s = 0; s < 4; s++) {
			int kind = rand() % 6;

			prot[s] = (uint8_t)(rand() % 4 == 0);
			if (kind == 0)
				continue; /* EMPTY */
			es_pool_slot_assign(&m.p, (uint32_t)s,
					    es_key(0, (uint32_t)(2 * s +
								 rand() % 2)));
			if (kind == 1)
				continue; /* LOADING */
			es_pool_slot_publish(&m.p, (uint32_t)s,
					     kind == 2 ? -ST_E_CHECKSUM : 0);
			atomic_store(&m.p.v.slots[s].last_use_ns,
				     (uint64_t)(rand() % 3));
			if (kind == 3)
				atomic_store(&m.p.v.slots[s].pins[1], 1);
		}
		n = es_policy_rank(&ev, &m.p.v, order, 4);
		memset(skip, 0, sizeof(skip));
		for (;;) {
			int s = es_policy_pick(&ev, &m.p.v, skip, &hotf);

			if (s < 0)
				break;
			assert_true(k < n);
			/* equal scores may come in either order: compare
			 * what decides, not the slot number */
			if (order[k] != s) {
				double pa, pb;
				uint64_t la, lb;
				int ha = rank_key(&ev, &m.p.v, order[k], &pa,
						  &la);
				int hb = rank_key(&ev, &m.p.v, s, &pb, &lb);

				assert_true(ha == hb && pa == pb && la == lb);
			}
			skip[order[k]] = 1;
			k++;
		}
		assert_int_equal(k, n);
		es_actstats_fini(&st);
		mpool_close(&m);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_value_by_hand),
		cmocka_unit_test(test_value_random),
		cmocka_unit_test(test_rates),
		cmocka_unit_test(test_slots),
		cmocka_unit_test(test_alloc_allowed),
		cmocka_unit_test(test_release_record),
		cmocka_unit_test(test_rank),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
