/*
 * test_es_prefetch.c — a real expertd serving kjv-moe (MXFP4 store) to
 * clients that send routing reports and prefetch hints (ES_MSG_ROUTE):
 *  - hinted experts load without any ACQUIRE and then hit; a hint for a
 *    layer the client has already reached is dropped as stale;
 *  - a slot being filled by a prefetch is LOADING and never read: an
 *    ACQUIRE of it waits and gets the verified record (double buffering);
 *  - kill -9 while prefetches are in flight (PITFALLS P12/P17): the
 *    restarted expertd adopts the one segment, discards the half-filled
 *    slots, and serves correct records;
 *  - a corrupted record reached through a hint is re-read once, then
 *    refused with a message naming it, and the daemon keeps serving;
 *  - activation statistics survive a restart (SIGTERM, and kill -9 with a
 *    periodic save) and the restarted expertd warms the hot set from them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "es_client.h"
#include "es_harness.h"
#include "es_proto.h"
#include "st_util.h"
#include "test_util.h"

static struct es_h H;

static int group_setup(void **state)
{
	return es_h_init(&H, "kjv-moe", "espf") < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	es_h_fini(&H);
	return 0;
}

static int test_teardown(void **state)
{
	es_h_reset(&H);
	return 0;
}

static struct es_client *open_client(const char *name)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;
	int r = es_client_open(H.run_dir, H.inst, name, ES_H_TIMEOUT_MS, &c,
			       &diag);

	if (r < 0)
		fprintf(stderr, "es_client_open: %s\n", diag.msg);
	assert_int_equal(r, 0);
	return c;
}

static void acquire_check(struct es_client *c, int layer, int n,
			  const int *ids)
{
	const uint8_t *rec[16];
	struct st_diag diag = { "" };
	int r = es_client_acquire(c, layer, n, ids, rec, &diag);

	if (r)
		fprintf(stderr, "acquire: %s\n", diag.msg);
	assert_int_equal(r, 0);
	for (int i = 0; i < n; i++)
		assert_memory_equal(rec[i], es_h_ref(&H, layer, ids[i]),
				    H.record_bytes);
	es_client_release(c, layer, n, ids);
}

/* Routing report of `layer` (two tokens' worth) plus hints. */
static void route(struct es_client *c, int layer, uint32_t pos, int n_hint,
		  const int *hl, const int *he)
{
	const int ex[4] = { 0, 1, 0, 1 };
	struct st_diag diag = { "" };

	assert_int_equal(es_client_route(c, layer, pos, 2, 2, ex, n_hint, hl,
					 he, &diag), 0);
}

/* Slot state of (layer, expert), -1 when not resident. */
static int state_of(const struct es_pool_view *v, int layer, int expert)
{
	int32_t s = atomic_load(&v->slot_of[es_pool_index(v, (uint32_t)layer,
							   (uint32_t)expert)]);

	return s < 0 ? -1 : (int)atomic_load(&v->slots[s].state);
}

/* Waits up to ms for (layer, expert) to reach state want. */
static int wait_state(const struct es_pool_view *v, int layer, int expert,
		      int want, int ms)
{
	for (int i = 0; i < ms; i++) {
		if (state_of(v, layer, expert) == want)
			return 1;
		st_sleep_ns(1000000);
	}
	return state_of(v, layer, expert) == want;
}

static void test_hint_loads_and_stale(void **state)
{
	struct es_client *c;
	struct es_tier_stats t0, t1;
	struct st_shm shm;
	struct es_pool_view v;
	const int hl[2] = { 1, 1 }, he[2] = { 4, 5 }, stale_l = 1,
		  stale_e = 9, ids[2] = { 4, 5 };
	struct es_stats s;

	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	c = open_client("hints");
	es_client_tier_stats(c, &t0);
	route(c, 0, 0, 2, hl, he);
	/* loaded without any ACQUIRE (the server starts them as it goes) */
	assert_true(wait_state(&v, 1, 4, ES_SLOT_READY, 3000));
	assert_true(wait_state(&v, 1, 5, ES_SLOT_READY, 3000));
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.misses == 0);
	/* computed reports layer 1's routing, then acquires (fast path:
	 * expertd learns of the use from the report) */
	{
		struct st_diag diag = { "" };

		assert_int_equal(es_client_route(c, 1, 0, 1, 2, ids, 0, NULL,
						 NULL, &diag), 0);
	}
	acquire_check(c, 1, 2, ids);
	/* the counters live in the pool header and expertd bumps
	 * prefetch_used when it handles the ROUTE report, which may come
	 * after the fast-path pins: wait for it (bounded) */
	for (int i = 0; i < 2000; i++) {
		es_client_tier_stats(c, &t1);
		if (t1.prefetch_used - t0.prefetch_used >= 2)
			break;
		st_sleep_ns(1000000);
	}
	assert_true(t1.prefetch_loads - t0.prefetch_loads == 2);
	fprintf(stderr, "# loads %llu used %llu wasted %llu hints %llu dropped %llu\n", (unsigned long long)t1.prefetch_loads, (unsigned long long)t1.prefetch_used, (unsigned long long)t1.prefetch_wasted, (unsigned long long)t1.hints, (unsigned long long)t1.hints_dropped);
	assert_true(t1.prefetch_used - t0.prefetch_used == 2);
	assert_true(t1.direct_io <= 1);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.misses == 0); /* both were hits */
	/* the client is at layer 2 now: a hint for layer 1 is stale */
	route(c, 2, 1, 1, &stale_l, &stale_e);
	assert_int_equal(es_client_stats(c, &s), 0); /* a round trip */
	es_client_tier_stats(c, &t1);
	assert_true(t1.hints_dropped - t0.hints_dropped == 1);
	assert_int_equal(state_of(&v, 1, 9), -1);
	/* the reports counted the routing choices: 4 + 2 + 4 */
	assert_true(t1.routed - t0.routed == 10);
	es_client_close(c);
	st_shm_detach(&shm);
}

/* Starts expertd with a pool of n_slots records, --evict evict and, when
 * admit is not NULL, --admit admit; attaches its pool. */
static void start_slots(int n_slots, const char *evict, const char *admit,
			struct st_shm *shm, struct es_pool_view *v)
{
	char budget[32];

	snprintf(budget, sizeof(budget), "%llu",
		 (unsigned long long)n_slots * H.record_bytes);
	assert_int_equal(es_h_start(&H, "--host-budget", budget, "--evict",
				    evict, admit ? "--admit" : NULL, admit,
				    NULL), 0);
	assert_int_equal(es_h_attach(&H, shm, v), 0);
}

/* A wrong hint: layer 1's experts 4 and 5 are prefetched, layer 1's
 * report routes 4 and 6.  Expert 5 counts as wasted at once (not when it is
 * evicted) and loses its protection: a later prefetch may take its slot
 * under strict eviction, where a still-protected slot would be skipped. */
static void test_wrong_hint_expires(void **state)
{
	struct es_client *c;
	struct es_tier_stats t0, t1;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const int hl[2] = { 1, 1 }, he[2] = { 4, 5 }, ids[2] = { 4, 6 };
	const int nl = 2, ne = 7;

	assert_true(H.n_layers >= 3 && H.n_experts >= 8);
	start_slots(3, "lru", NULL, &shm, &v);
	c = open_client("expire");
	es_client_tier_stats(c, &t0);
	route(c, 0, 0, 2, hl, he);
	assert_true(wait_state(&v, 1, 4, ES_SLOT_READY, 3000));
	assert_true(wait_state(&v, 1, 5, ES_SLOT_READY, 3000));
	assert_int_equal(es_client_route(c, 1, 0, 1, 2, ids, 0, NULL, NULL,
					 &diag), 0);
	acquire_check(c, 1, 2, ids);  /* 6 takes the third slot */
	es_client_tier_stats(c, &t1);
	assert_true(t1.prefetch_used - t0.prefetch_used == 1);
	assert_true(t1.prefetch_wasted - t0.prefetch_wasted == 1);
	assert_int_equal(state_of(&v, 1, 5), ES_SLOT_READY);
	/* a hint for layer 2 while 4 and 6 were just used (newer): LRU's
	 * victim is 5, which is no longer protected, so the hint loads */
	assert_int_equal(es_client_route(c, 1, 0, 1, 2, ids, 1, &nl, &ne,
					 &diag), 0);
	assert_true(wait_state(&v, 2, 7, ES_SLOT_READY, 3000));
	assert_int_equal(state_of(&v, 1, 5), -1);
	assert_int_equal(state_of(&v, 1, 4), ES_SLOT_READY);
	assert_int_equal(state_of(&v, 1, 6), ES_SLOT_READY);
	es_client_tier_stats(c, &t1);
	assert_true(t1.prefetch_wasted - t0.prefetch_wasted == 1);
	es_client_close(c);
	st_shm_detach(&shm);
}

/* Step-named hints (es_client_hint_step): after the last layer's report of
 * position 5, the next token's experts for layers 0 and 1 (position 6)
 * are kept and loaded, while a plain look-ahead hint for layer 0 and a
 * step-named hint for position 5 itself (already past its layer) are
 * dropped as stale. */
static void test_step_hint_kept(void **state)
{
	struct es_client *c;
	struct es_tier_stats t0, t1;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const int last = H.n_layers - 1;
	const int hl[2] = { 0, 1 }, he[2] = { 6, 7 };
	const int old_l = 0, old_e = 3, st_l = 1, st_e = 2;
	struct es_stats s;

	assert_true(H.n_layers >= 3 && H.n_experts >= 8);
	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	c = open_client("stephint");
	es_client_tier_stats(c, &t0);
	/* the client finished position 5 (its last layer's report) */
	route(c, last, 5, 0, NULL, NULL);
	/* the old rule: a look-ahead hint for layer 0 is stale now */
	route(c, last, 5, 1, &old_l, &old_e);
	assert_int_equal(es_client_stats(c, &s), 0); /* a round trip */
	es_client_tier_stats(c, &t1);
	assert_true(t1.hints_dropped - t0.hints_dropped == 1);
	assert_int_equal(state_of(&v, 0, 3), -1);
	/* the next token (position 6) is known: its layers 0 and 1 */
	assert_int_equal(es_client_hint_step(c, 6, 2, hl, he, &diag), 0);
	assert_true(wait_state(&v, 0, 6, ES_SLOT_READY, 3000));
	assert_true(wait_state(&v, 1, 7, ES_SLOT_READY, 3000));
	es_client_tier_stats(c, &t1);
	assert_true(t1.prefetch_loads - t0.prefetch_loads == 2);
	assert_true(t1.hints_dropped - t0.hints_dropped == 1);
	assert_true(t1.step_hints - t0.step_hints == 2);
	assert_true(t1.hints - t0.hints == 1); /* the look-ahead one */
	/* a step-named hint is still judged by its position: position 5 at
	 * layer 1 is behind the client (position 5, last layer) */
	assert_int_equal(es_client_hint_step(c, 5, 1, &st_l, &st_e, &diag), 0);
	assert_int_equal(es_client_stats(c, &s), 0);
	es_client_tier_stats(c, &t1);
	assert_true(t1.hints_dropped - t0.hints_dropped == 2);
	assert_int_equal(state_of(&v, 1, 2), -1);
	/* the hint-only message reported no progress: a look-ahead hint for
	 * a layer after the last is impossible, but one for position 6
	 * (step-named) at layer 2 still loads */
	{
		const int l2 = 2, e2 = 4;

		assert_int_equal(es_client_hint_step(c, 6, 1, &l2, &e2, &diag),
				 0);
		assert_true(wait_state(&v, 2, 4, ES_SLOT_READY, 3000));
	}
	/* position 6 reported at layer 2: a step-named hint for its layer 1
	 * is stale, and so is one for the previous position */
	route(c, 2, 6, 0, NULL, NULL);
	assert_int_equal(es_client_hint_step(c, 6, 1, &st_l, &st_e, &diag), 0);
	assert_int_equal(es_client_stats(c, &s), 0);
	es_client_tier_stats(c, &t1);
	assert_true(t1.hints_dropped - t0.hints_dropped == 3);
	assert_int_equal(state_of(&v, 1, 2), -1);
	/* the hinted experts are hits */
	{
		const int a[1] = { 6 };
		uint64_t m0;

		assert_int_equal(es_client_stats(c, &s), 0);
		m0 = s.misses;
		acquire_check(c, 0, 1, a);
		assert_int_equal(es_client_stats(c, &s), 0);
		assert_true(s.misses == m0);
	}
	es_client_close(c);
	st_shm_detach(&shm);
}

/* LFRU's admission test refuses a look-ahead hint for an expert less
 * activated than the victim; a step-named hint (an expert that will be
 * acquired) skips it and loads, evicting. */
static void test_step_hint_admitted(void **state)
{
	struct es_client *c;
	struct es_tier_stats t0, t1;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const int ids[2] = { 0, 1 }, gl = 2, ge = 5, sl = 2, se = 6;
	struct es_stats s;

	assert_true(H.n_layers >= 3 && H.n_experts >= 8);
	start_slots(4, "lfru", NULL, &shm, &v);
	c = open_client("admit");
	/* 4 slots, all used by reported experts (counts 2 each) */
	route(c, 0, 0, 0, NULL, NULL);
	acquire_check(c, 0, 2, ids);
	route(c, 1, 0, 0, NULL, NULL);
	acquire_check(c, 1, 2, ids);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.slots_used == 4 && s.n_slots == 4);
	es_client_tier_stats(c, &t0);
	/* a guess for an expert never routed: refused by admission */
	route(c, 1, 0, 1, &gl, &ge);
	assert_int_equal(es_client_stats(c, &s), 0); /* a round trip */
	es_client_tier_stats(c, &t1);
	assert_true(t1.hints_dropped - t0.hints_dropped == 1);
	assert_int_equal(state_of(&v, 2, 5), -1);
	/* the next token's known expert: loaded */
	assert_int_equal(es_client_hint_step(c, 1, 1, &sl, &se, &diag), 0);
	assert_true(wait_state(&v, 2, 6, ES_SLOT_READY, 3000));
	es_client_tier_stats(c, &t1);
	assert_true(t1.prefetch_loads - t0.prefetch_loads == 1);
	assert_true(t1.evictions - t0.evictions == 1);
	es_client_close(c);
	st_shm_detach(&shm);
}

/* Admission by precision (the default) against by frequency, on one
 * pool: 6 slots hold layer 0's experts 0-3 (each routed by 1 of 4 tokens:
 * 0.25 per token) and layer 1's 0-1 (the layer being computed).  A
 * look-ahead hint for an expert never routed (count 0) is refused by
 * frequency (every victim has count 1); by precision the least activated
 * victim's 0.25 per token is below the hints' prior precision 1/2, so it
 * loads, evicting a layer-0 expert and never one of layer 1. */
static void admit_case(const char *admit, int want_loaded)
{
	struct es_client *c;
	struct es_tier_stats t0, t1;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const int l0[4] = { 0, 1, 2, 3 }, l1[4] = { 0, 0, 1, 1 };
	const int ids[2] = { 0, 1 }, gl = 2, ge = 5;
	struct es_stats s;
	int resident0 = 0;

	start_slots(6, "lfru", admit, &shm, &v);
	c = open_client("admit2");
	assert_int_equal(es_client_route(c, 0, 0, 4, 1, l0, 0, NULL, NULL,
					 &diag), 0);
	acquire_check(c, 0, 4, l0);
	assert_int_equal(es_client_route(c, 1, 0, 4, 1, l1, 0, NULL, NULL,
					 &diag), 0);
	acquire_check(c, 1, 2, ids);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.slots_used == 6 && s.n_slots == 6);
	es_client_tier_stats(c, &t0);
	/* layer 1 again (a second pass of the same layer), with the hint */
	assert_int_equal(es_client_route(c, 1, 0, 4, 1, l1, 1, &gl, &ge,
					 &diag), 0);
	assert_int_equal(es_client_stats(c, &s), 0); /* a round trip */
	if (want_loaded) {
		assert_true(wait_state(&v, 2, 5, ES_SLOT_READY, 3000));
		es_client_tier_stats(c, &t1);
		assert_true(t1.prefetch_loads - t0.prefetch_loads == 1);
		assert_true(t1.evictions - t0.evictions == 1);
	} else {
		es_client_tier_stats(c, &t1);
		assert_true(t1.hints_dropped - t0.hints_dropped == 1);
		assert_true(t1.prefetch_loads == t0.prefetch_loads);
		assert_int_equal(state_of(&v, 2, 5), -1);
	}
	/* layer 1's experts are never the victim */
	assert_int_equal(state_of(&v, 1, 0), ES_SLOT_READY);
	assert_int_equal(state_of(&v, 1, 1), ES_SLOT_READY);
	for (int e = 0; e < 4; e++)
		resident0 += state_of(&v, 0, e) == ES_SLOT_READY;
	assert_int_equal(resident0, want_loaded ? 3 : 4);
	es_client_close(c);
	st_shm_detach(&shm);
}

static void test_admit_precision(void **state)
{
	assert_true(H.n_layers >= 3 && H.n_experts >= 8);
	admit_case("precision", 1);
}

static void test_admit_frequency(void **state)
{
	assert_true(H.n_layers >= 3 && H.n_experts >= 8);
	admit_case("frequency", 0);
}

static void test_loading_never_read(void **state)
{
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	const int hl = 3, he = 7;
	uint64_t t0;

	assert_int_equal(es_h_start(&H, "--test-load-delay-ms", "400", NULL),
			 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	c = open_client("double-buffer");
	route(c, 0, 0, 1, &hl, &he);
	assert_true(wait_state(&v, 3, 7, ES_SLOT_LOADING, 2000));
	/* acquiring it waits for READY: never the half-filled record */
	t0 = st_now_ns();
	acquire_check(c, 3, 1, &he);
	assert_true(st_now_ns() - t0 > 100000000ull);
	es_client_close(c);
	st_shm_detach(&shm);
}

static void test_kill9_prefetch(void **state)
{
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	const int hl[3] = { 2, 2, 2 }, he[3] = { 1, 2, 3 }, ids[3] = { 1, 2, 3 };

	for (int cycle = 0; cycle < 3; cycle++) {
		assert_int_equal(es_h_start(&H, "--test-load-delay-ms", "2000",
					    NULL), 0);
		assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
		c = open_client("pf-kill");
		route(c, 0, 0, 3, hl, he);
		assert_int_equal(es_h_attach(&H, &shm, &v), 0);
		assert_true(wait_state(&v, 2, 1, ES_SLOT_LOADING, 2000));
		es_h_kill9(&H);
		es_client_close(c);
		st_shm_detach(&shm);
	}
	/* the next owner adopts the one segment and drops the half loads */
	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	assert_int_equal(atomic_load(&v.shm->owner_pid), H.pid);
	for (uint32_t i = 0; i < v.n_slots; i++)
		assert_true(atomic_load(&v.slots[i].state) != ES_SLOT_LOADING);
	c = open_client("after");
	acquire_check(c, 2, 3, ids);
	es_client_close(c);
	st_shm_detach(&shm);
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_count_segments(&H), 0);
}

static void test_corrupt_hinted(void **state)
{
	char path[1024];
	struct es_client *c;
	struct es_tier_stats t;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const uint8_t *rec;
	const int hl = 1, he = 3, e4 = 4;
	uint64_t off = 3 * H.record_bytes + 100;
	uint8_t byte, flipped;
	int fd;

	st_store_path(H.st, H.st->expert_files[1], path, sizeof(path));
	chmod(path, 0644);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
	flipped = byte ^ 0x10;
	assert_int_equal(pwrite(fd, &flipped, 1, (off_t)off), 1);
	fsync(fd);

	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	c = open_client("corrupt-hint");
	route(c, 0, 0, 1, &hl, &he);
	assert_true(wait_state(&v, 1, 3, ES_SLOT_FAILED, 3000));
	es_client_tier_stats(c, &t);
	assert_true(t.rereads == 1);          /* read twice */
	assert_true(t.checksum_failures == 1); /* then refused */
	assert_int_equal(es_client_acquire(c, 1, 1, &he, &rec, &diag),
			 -ST_E_CHECKSUM);
	assert_non_null(strstr(diag.msg, "experts-001.bin"));
	acquire_check(c, 1, 1, &e4); /* still serving */
	es_client_close(c);
	st_shm_detach(&shm);
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)off), 1);
	close(fd);
}

/* Reports routing that makes expert (2 l + 1) % 16 the hottest of layer
 * l, for tokens tokens. */
static void report_skewed(struct es_client *c, int tokens)
{
	struct st_diag diag = { "" };

	for (int t = 0; t < tokens; t++)
		for (int l = 0; l < H.n_layers; l++) {
			int ex[2] = { (2 * l + 1) % H.n_experts,
				      (t + l) % H.n_experts == (2 * l + 1) %
							      H.n_experts ?
				      0 : (t + l) % H.n_experts };

			if (ex[1] == ex[0])
				ex[1] = (ex[0] + 1) % H.n_experts;
			assert_int_equal(es_client_route(c, l, (uint32_t)t, 1,
							 2, ex, 0, NULL, NULL,
							 &diag), 0);
		}
}

static void test_stats_restart(void **state)
{
	struct es_client *c;
	struct es_tier_stats t;
	struct st_shm shm;
	struct es_pool_view v;
	char sdir[700], file[800];
	struct stat st;

	snprintf(sdir, sizeof(sdir), "%s/state", H.tmp);
	snprintf(file, sizeof(file), "%s/activations.bin", sdir);
	unlink(file);
	assert_int_equal(es_h_start(&H, "--state-dir", sdir, NULL), 0);
	c = open_client("stats");
	report_skewed(c, 40);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0); /* saves on SIGTERM */
	assert_int_equal(stat(file, &st), 0);
	es_h_reset(&H);

	/* restarted on a fresh segment: the hot set comes from the file and
	 * is loaded without any request */
	assert_int_equal(es_h_start(&H, "--state-dir", sdir, "--hot-experts",
				    "1", "--stats-save-interval", "1", NULL),
			 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	for (int l = 0; l < H.n_layers; l++)
		assert_true(wait_state(&v, l, (2 * l + 1) % H.n_experts,
				       ES_SLOT_READY, 3000));
	c = open_client("stats2");
	es_client_tier_stats(c, &t);
	assert_true(t.hot_slots == (uint64_t)H.n_layers);
	/* kill -9 after a periodic save: the statistics are still there */
	report_skewed(c, 10);
	st_sleep_ns(1500000000ull);
	es_h_kill9(&H);
	es_client_close(c);
	st_shm_detach(&shm);
	{
		char *buf;
		size_t len;
		uint64_t tokens = 0;

		assert_int_equal(st_read_file(file, &buf, &len), 0);
		memcpy(&tokens, buf + 32, 8); /* little-endian host */
		free(buf);
		assert_true(tokens == 50);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_hint_loads_and_stale,
					  test_teardown),
		cmocka_unit_test_teardown(test_step_hint_kept, test_teardown),
		cmocka_unit_test_teardown(test_wrong_hint_expires,
					  test_teardown),
		cmocka_unit_test_teardown(test_step_hint_admitted,
					  test_teardown),
		cmocka_unit_test_teardown(test_admit_precision,
					  test_teardown),
		cmocka_unit_test_teardown(test_admit_frequency,
					  test_teardown),
		cmocka_unit_test_teardown(test_loading_never_read,
					  test_teardown),
		cmocka_unit_test_teardown(test_kill9_prefetch, test_teardown),
		cmocka_unit_test_teardown(test_corrupt_hinted, test_teardown),
		cmocka_unit_test_teardown(test_stats_restart, test_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
