/*
 * test_kv_budget.c — the marginal value kvd reports to the memory ledger
 * (kv_budget.c; suite unit): on small synthetic cases whose figures are
 * worked out by hand below, the decayed restore rate, the gain of `step`
 * bytes more and the loss of `step` bytes less; the gain of requests
 * waiting for pages (KV_MSG_DEMAND) and the clients' demand it sums.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kv_daemon.h"

#define GIB (1ull << 30)
#define S_NS 1000000000ull

static void test_rates(void **state)
{
	struct kv_budget_rates r;
	struct kv_budget_obs o;

	(void)state;
	memset(&r, 0, sizeof(r));
	memset(&o, 0, sizeof(o));
	o.now_ns = 10 * S_NS;
	o.restore_ns = 7 * S_NS; /* history before the first look */
	o.steps = 1000;
	kv_budget_rates_update(&r, &o);
	/* the first update only records */
	assert_true(r.restore_rate == 0 && r.step_rate == 0);
	/* 1 s later: 200 ms of restores and 50 steps.  Instant rates 2e8
	 * ns/s and 50/s, weight 1 - e^-0.2 = 0.18126924692201818 */
	o.now_ns += S_NS;
	o.restore_ns += 200000000ull;
	o.steps += 50;
	kv_budget_rates_update(&r, &o);
	assert_true(fabs(r.restore_rate - 36253849.384403636) < 1e-3);
	assert_true(fabs(r.step_rate - 9.063462346100909) < 1e-9);
	/* 4 s more of nothing: e^-0.8 = 0.44932896411722156 of it left */
	o.now_ns += 4 * S_NS;
	kv_budget_rates_update(&r, &o);
	assert_true(fabs(r.restore_rate - 36253849.384403636 *
						  0.44932896411722156) < 1e-3);
	/* counters that went back (a restarted kvd): re-primed, kept */
	o.restore_ns = 0;
	kv_budget_rates_update(&r, &o);
	assert_true(fabs(r.restore_rate - 36253849.384403636 *
						  0.44932896411722156) < 1e-3);
}

static void test_gain(void **state)
{
	struct kv_budget_rates r = { .primed = 1, .restore_rate = 2e8 };
	struct kv_budget_obs o;

	(void)state;
	memset(&o, 0, sizeof(o));
	/* nothing spilled: more memory saves nothing */
	assert_true(kv_budget_gain(&r, &o, GIB) == 0);
	/* 4 GiB spilled, 200 ms/s restoring: 1 GiB more keeps a quarter
	 * of it resident: 5e7 ns/s per GiB */
	o.spilled_bytes = 4 * GIB;
	assert_true(fabs(kv_budget_gain(&r, &o, GIB) - 5e7) < 1e-6);
	/* a step of 512 MiB: an eighth, per half GiB: the same 5e7 */
	assert_true(fabs(kv_budget_gain(&r, &o, GIB / 2) - 5e7) < 1e-6);
	/* a step larger than what is spilled saves all of it: 2e8 over
	 * 8 GiB = 2.5e7 per GiB */
	assert_true(fabs(kv_budget_gain(&r, &o, 8 * GIB) - 2.5e7) < 1e-6);
}

static void test_loss(void **state)
{
	struct kv_budget_rates r = { .primed = 1, .step_rate = 20 };
	struct kv_budget_obs o;

	(void)state;
	memset(&o, 0, sizeof(o));
	o.target = 6 * GIB;
	o.working_bytes = 4 * GIB;
	o.can_spill = 1;
	o.restore_ns = 3 * S_NS;
	o.restore_bytes = 3 * S_NS; /* 1 ns per byte */
	/* slack: 6 - 1 GiB still holds the 4 GiB working set */
	assert_true(kv_budget_loss(&r, &o, GIB) == 0);
	/* 6 - 2.5 = 3.5 GiB left for 4: 0.5 GiB restored each step at 20
	 * steps/s = 2^29 x 20 ns/s, per 2.5 GiB: 4294967296 ns/s per GiB */
	assert_true(fabs(kv_budget_loss(&r, &o, 5 * GIB / 2) - 4294967296.0) <
		    1e-3);
	/* the target at the working set: all of the step, 1 GiB x 20 per
	 * GiB */
	o.target = 4 * GIB;
	assert_true(fabs(kv_budget_loss(&r, &o, GIB) - 21474836480.0) < 1e-3);
	/* no restore timed yet: the spill's cost (2 ns per byte) */
	o.restore_ns = o.restore_bytes = 0;
	o.spill_ns = 2 * S_NS;
	o.spill_bytes = S_NS;
	assert_true(fabs(kv_budget_loss(&r, &o, GIB) - 42949672960.0) < 1e-3);
	/* nothing timed, or no spill file: the working set cannot go */
	o.spill_ns = o.spill_bytes = 0;
	assert_true(kv_budget_loss(&r, &o, GIB) == KV_BUDGET_LOSS_NO_SPILL);
	o.spill_ns = o.spill_bytes = 1;
	o.can_spill = 0;
	assert_true(kv_budget_loss(&r, &o, GIB) == KV_BUDGET_LOSS_NO_SPILL);
	/* idle (no steps): nothing lost */
	o.can_spill = 1;
	r.step_rate = 0;
	assert_true(kv_budget_loss(&r, &o, GIB) == 0);
}

static void test_wait_gain(void **state)
{
	(void)state;
	/* nothing waits, or no step: no gain */
	assert_true(kv_budget_wait_gain(0, 0, GIB) == 0);
	assert_true(kv_budget_wait_gain(GIB, 3, 0) == 0);
	/* 2 requests wait for 4 GiB, a step of 1 GiB admits a quarter of
	 * their 2e9 ns/s stall: 5e8 ns/s per GiB */
	assert_true(fabs(kv_budget_wait_gain(4 * GIB, 2, GIB) - 5e8) < 1e-6);
	/* a step of 512 MiB: an eighth, per half GiB: the same 5e8 */
	assert_true(fabs(kv_budget_wait_gain(4 * GIB, 2, GIB / 2) - 5e8) <
		    1e-6);
	/* 3 requests wait for 64 MiB, a step of 1 GiB admits them all:
	 * 3e9 ns/s per GiB */
	assert_true(fabs(kv_budget_wait_gain(64 << 20, 3, GIB) - 3e9) < 1e-6);
	/* a step of 1 MiB of those 64 MiB: 3e9 / 64 per 1/1024 GiB = 4.8e10
	 * (small models: few bytes admit a request, worth much per GiB) */
	assert_true(fabs(kv_budget_wait_gain(64 << 20, 3, 1 << 20) - 4.8e10) <
		    1e-3);
}

static void test_clients_demand(void **state)
{
	struct kv_client_entry e[3];
	struct kv_clients cl = { .v = e, .n = 3, .cap = 3 };
	const uint64_t now = 100 * S_NS;
	uint32_t reqs = 99;
	uint64_t grow = 99;

	(void)state;
	memset(e, 0, sizeof(e));
	assert_true(kv_clients_demand(&cl, now, &reqs, &grow) == 0 &&
		    reqs == 0 && grow == 0);
	e[0].demand_pages = 40;
	e[0].demand_reqs = 4;
	e[0].demand_ns = now - S_NS;
	e[1].demand_pages = 2;
	e[1].demand_reqs = 1;
	e[1].demand_grow = 30;
	e[1].demand_ns = now;
	/* said too long ago: forgotten */
	e[2].demand_pages = 1000;
	e[2].demand_reqs = 10;
	e[2].demand_grow = 7;
	e[2].demand_ns = now - KV_DEMAND_STALE_NS - 1;
	assert_true(kv_clients_demand(&cl, now, &reqs, &grow) == 42 &&
		    reqs == 5 && grow == 30);
	/* just within the time */
	e[2].demand_ns = now - KV_DEMAND_STALE_NS;
	assert_true(kv_clients_demand(&cl, now, &reqs, &grow) == 1042 &&
		    reqs == 15 && grow == 37);
	/* a stamp from the future (clock read before now) is not counted */
	e[1].demand_ns = now + 1;
	assert_true(kv_clients_demand(&cl, now, &reqs, &grow) == 1040 &&
		    reqs == 14 && grow == 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rates),
		cmocka_unit_test(test_gain),
		cmocka_unit_test(test_loss),
		cmocka_unit_test(test_wait_gain),
		cmocka_unit_test(test_clients_demand),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
