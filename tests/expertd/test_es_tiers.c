/*
 * test_es_tiers.c — expertd's tier logic without a daemon: decayed
 * activation statistics (the decay arithmetic, ranking, the file and each
 * way it can be damaged), the eviction policies (LFRU order; pinned,
 * loading, hot and protected slots), the ROUTE payload, and a stress run
 * in which many client threads pin and read experts while an evictor
 * thread allocates slots through the LFRU policy and rewrites their
 * records: a pinned or loading slot must never be given away or read.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "es_actstats.h"
#include "es_daemon.h"
#include "es_pool.h"
#include "es_proto.h"
#include "st_util.h"

static void *alloc_pool(const struct es_pool_geom *g,
			struct es_pool_layout *l)
{
	void *base;

	assert_int_equal(es_pool_layout_compute(g, l), 0);
	base = aligned_alloc(4096, l->total_bytes);
	assert_non_null(base);
	memset(base, 0, l->total_bytes);
	assert_int_equal(es_pool_format(base, l->total_bytes, g, l), 0);
	return base;
}

static void open_pool(struct es_pool *p, void *base,
		      const struct es_pool_layout *l)
{
	memset(p, 0, sizeof(*p));
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		p->pidfd[c] = -1;
	assert_int_equal(es_pool_view_init(base, l->total_bytes, 0, &p->v,
					   NULL), 0);
}

/* ---- statistics ---- */

static void test_decay(void **state)
{
	struct es_actstats s;

	assert_int_equal(es_actstats_init(&s, 2, 4, 10.0, 7), 0);
	es_actstats_add(&s, 1, 2);
	assert_true(fabs(es_actstats_value(&s, 1, 2) - 1.0) < 1e-12);
	es_actstats_tokens(&s, 10); /* one half-life */
	assert_true(fabs(es_actstats_value(&s, 1, 2) - 0.5) < 1e-12);
	es_actstats_add(&s, 1, 2);
	es_actstats_tokens(&s, 20);
	/* (0.5 + 1) / 4 */
	assert_true(fabs(es_actstats_value(&s, 1, 2) - 0.375) < 1e-12);
	assert_true(es_actstats_value(&s, 0, 2) == 0);
	assert_int_equal(s.tokens, 30);
	es_actstats_fini(&s);

	/* a short half-life over many tokens: the lazy scale is rescaled
	 * (2^(3000) overflows a double) and values stay right */
	assert_int_equal(es_actstats_init(&s, 1, 2, 1.0, 7), 0);
	for (int t = 0; t < 3000; t++) {
		es_actstats_add(&s, 0, t % 2);
		es_actstats_tokens(&s, 1);
	}
	/* expert 1 last chosen 1 token ago: 1/2 + 1/8 + ... -> 2/3;
	 * expert 0: 1/4 + 1/16 + ... -> 1/3 */
	assert_true(fabs(es_actstats_value(&s, 0, 1) - 2.0 / 3) < 1e-9);
	assert_true(fabs(es_actstats_value(&s, 0, 0) - 1.0 / 3) < 1e-9);
	assert_true(isfinite(s.inc) && s.inc < 1e151);
	es_actstats_fini(&s);
	assert_int_equal(es_actstats_init(&s, 1, 2, 0.0, 7), -EINVAL);
}

/* es_actstats_rate: decayed count over decayed tokens, in the daemon's
 * order (a token counted at layer 0, then its routing choices); the
 * expected values are sums written out here, not the closed form. */
static void test_rate(void **state)
{
	struct es_actstats s;
	double num = 0, mass = 0;

	assert_int_equal(es_actstats_init(&s, 1, 3, 16.0, 7), 0);
	assert_true(es_actstats_rate(&s, 0, 0) == 0); /* no token yet */
	for (int t = 0; t < 100; t++) {
		es_actstats_tokens(&s, 1);
		es_actstats_add(&s, 0, 0);
		if (t % 4 == 0)
			es_actstats_add(&s, 0, 1);
	}
	for (int age = 0; age < 100; age++) {
		double w = pow(2.0, -age / 16.0);

		mass += w;
		if ((99 - age) % 4 == 0)
			num += w;
	}
	/* routed by every token: 1; every 4th (the newest 3 tokens ago): a
	 * weighted share a bit under 1/4 */
	assert_true(fabs(es_actstats_rate(&s, 0, 0) - 1.0) < 1e-12);
	assert_true(fabs(es_actstats_rate(&s, 0, 1) - num / mass) < 1e-12);
	assert_true(es_actstats_rate(&s, 0, 1) > 0.2 &&
		    es_actstats_rate(&s, 0, 1) < 0.25);
	assert_true(es_actstats_rate(&s, 0, 2) == 0);
	es_actstats_fini(&s);
}

static void test_top(void **state)
{
	struct es_actstats s;
	uint32_t top[3];
	const int uses[6] = { 2, 5, 0, 5, 1, 3 };

	assert_int_equal(es_actstats_init(&s, 2, 6, 100.0, 1), 0);
	for (int e = 0; e < 6; e++)
		for (int i = 0; i < uses[e]; i++)
			es_actstats_add(&s, 1, (uint32_t)e);
	es_actstats_top(&s, 1, 3, top);
	/* 1 and 3 tie at 5: the lower id first; then 5 */
	assert_int_equal(top[0], 1);
	assert_int_equal(top[1], 3);
	assert_int_equal(top[2], 5);
	es_actstats_top(&s, 0, 2, top); /* all zero: ids 0, 1 */
	assert_int_equal(top[0], 0);
	assert_int_equal(top[1], 1);
	es_actstats_fini(&s);
}

static void test_file(void **state)
{
	char dir[] = "/tmp/es-tiers-XXXXXX", path[128], cmd[256];
	struct es_actstats s, t;
	struct st_diag d = { "" };
	char *buf;
	size_t len;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/%s", dir, ES_ACTSTATS_FILE);
	assert_int_equal(es_actstats_init(&s, 3, 5, 64.0, 0xabc), 0);
	assert_int_equal(es_actstats_init(&t, 3, 5, 64.0, 0xabc), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), -ENOENT);
	for (int i = 0; i < 40; i++) {
		es_actstats_add(&s, (uint32_t)(i % 3), (uint32_t)(i * 7 % 5));
		es_actstats_tokens(&s, 3);
	}
	assert_int_equal(es_actstats_save(&s, path, &d), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), 0);
	assert_int_equal(t.tokens, s.tokens);
	for (uint32_t l = 0; l < 3; l++)
		for (uint32_t e = 0; e < 5; e++)
			assert_true(fabs(es_actstats_value(&t, l, e) -
					 es_actstats_value(&s, l, e)) < 1e-12);
	/* another model's file is refused when the geometry is expected */
	t.store_id = 0xabd;
	assert_int_equal(es_actstats_load(&t, path, 1, &d), -ST_E_STALE);
	assert_non_null(strstr(d.msg, "another model"));
	t.store_id = 0xabc;
	/* one flipped bit: checksum */
	assert_int_equal(st_read_file(path, &buf, &len), 0);
	buf[60] ^= 1;
	assert_int_equal(st_write_file(path, buf, len), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), -ST_E_CHECKSUM);
	/* truncated */
	assert_int_equal(st_write_file(path, buf, len - 9), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), -ST_E_FORMAT);
	/* not ours */
	memcpy(buf, "NOTSTATS", 8);
	assert_int_equal(st_write_file(path, buf, len), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), -ST_E_BADMAGIC);
	free(buf);
	/* without expected geometry the file's own is taken */
	assert_int_equal(es_actstats_save(&s, path, &d), 0);
	es_actstats_fini(&t);
	memset(&t, 0, sizeof(t));
	assert_int_equal(es_actstats_load(&t, path, 0, &d), 0);
	assert_int_equal(t.n_layers, 3);
	assert_int_equal(t.n_experts, 5);
	es_actstats_fini(&t);
	es_actstats_fini(&s);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

/* ---- eviction policies ---- */

static void test_policy(void **state)
{
	const struct es_pool_geom g = { 1, 8, 6, 1, 4096, 1 };
	struct es_pool_layout l;
	struct es_pool p;
	struct es_actstats st;
	uint8_t hot[8] = { 0 }, protect[6] = { 0 };
	struct es_evict_ctx ev = { ES_EVICT_LFRU, &st, hot, protect, 0, 0 };
	void *base = alloc_pool(&g, &l);
	/* activation counts of experts 0..5 in slots 0..5 */
	const int uses[6] = { 5, 1, 3, 0, 2, 4 };
	enum es_evict_policy pol;
	int hotf, s;

	open_pool(&p, base, &l);
	assert_int_equal(es_actstats_init(&st, 1, 8, 1000.0, 1), 0);
	for (uint32_t i = 0; i < 6; i++) {
		es_pool_slot_assign(&p, i, es_key(0, i));
		es_pool_slot_publish(&p, i, 0);
		/* LRU order is the reverse of the LFRU order for 3 and 1 */
		atomic_store(&p.v.slots[i].last_use_ns, 1000 - 100 * i);
		for (int k = 0; k < uses[i]; k++)
			es_actstats_add(&st, 0, i);
	}
	assert_int_equal(es_policy_parse("lfru", &pol), 0);
	assert_int_equal(pol, ES_EVICT_LFRU);
	assert_int_equal(es_policy_parse("mru", &pol), -EINVAL);
	/* LFRU: the least activated, expert 3 */
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 3);
	assert_int_equal(hotf, 0);
	/* pinned: the next, expert 1 */
	atomic_store(&p.v.slots[3].pins[7], 1);
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 1);
	/* loading: never */
	es_pool_slot_clear(&p, 1);
	es_pool_slot_assign(&p, 1, es_key(0, 6));
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 4);
	/* a strict pick with fresh_ns skips the slots used since then: slot 4
	 * (used at 600) is the layer being computed, slot 5 (500) is older;
	 * a non-strict pick ignores fresh_ns */
	ev.strict = 1;
	ev.fresh_ns = 550;
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 5);
	ev.fresh_ns = 1;  /* everything fresh: nothing for a prefetch */
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), -1);
	ev.strict = 0;
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 4);
	ev.fresh_ns = 0;
	/* hot and protected are kept while others exist */
	hot[4] = 1;
	protect[2] = 1;
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 5);
	/* LRU ignores counts: the oldest unpinned READY is slot 5 */
	ev.policy = ES_EVICT_LRU;
	hot[4] = 0;
	protect[2] = 0;
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), 5);
	/* only hot ones left: returned with the flag, unless strict */
	ev.policy = ES_EVICT_LFRU;
	for (int i = 0; i < 8; i++)
		hot[i] = 1;
	s = es_policy_pick(&ev, &p.v, NULL, &hotf);
	assert_int_equal(s, 4);
	assert_int_equal(hotf, 1);
	ev.strict = 1;
	assert_int_equal(es_policy_pick(&ev, &p.v, NULL, &hotf), -1);
	/* through the allocator, with the pool using the context */
	p.ev = &ev;
	assert_int_equal(es_pool_alloc_slot(&p, 1, &hotf), -ST_E_BUSY);
	ev.strict = 0;
	s = es_pool_alloc_slot(&p, 1, &hotf);
	assert_int_equal(s, 4);
	assert_int_equal(hotf, 1); /* evicted */
	assert_int_equal(atomic_load(&p.v.slots[4].state), ES_SLOT_EVICTING);
	es_actstats_fini(&st);
	free(base);
}

/* ---- ROUTE payload ---- */

static void test_route_payload(void **state)
{
	struct es_acquire_limits lim = { 6, 16, 24 };
	const int ex[4] = { 3, 9, 1, 2 }, hl[2] = { 2, 3 }, he[2] = { 15, 0 };
	struct es_route_req r;
	struct st_diag d = { "" };
	struct st_wbuf w;
	uint32_t l, e;

	st_wbuf_init(&w);
	es_route_req_encode(&w, 42, 1, 100, 2, 2, ex, 2, hl, he);
	assert_int_equal(w.len, 24 + 16 + 16);
	assert_int_equal(es_route_req_decode(w.data, w.len, &lim, &r, &d), 0);
	assert_int_equal(r.layer, 1);
	assert_int_equal(r.pos, 100);
	assert_int_equal(es_route_req_expert(&r, 1), 9);
	es_route_req_hint(&r, 1, &l, &e);
	assert_int_equal(l, 3);
	assert_int_equal(e, 0);
	/* one byte short, and an expert out of range */
	assert_int_equal(es_route_req_decode(w.data, w.len - 1, &lim, &r, &d),
			 -ST_E_PROTO);
	lim.n_experts = 15;
	assert_int_equal(es_route_req_decode(w.data, w.len, &lim, &r, &d),
			 -ST_E_PROTO);
	lim.n_experts = 16;
	lim.n_layers = 3; /* hint layer 3 out of range */
	assert_int_equal(es_route_req_decode(w.data, w.len, &lim, &r, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "hint"));
	st_wbuf_fini(&w);
	assert_int_equal(r.has_hint_pos, 0);
}

/* The optional hint_pos (step-named hints): decoded when present, absent
 * otherwise; a position before the report's, or a stray extra byte, is
 * refused. */
static void test_route_hint_pos(void **state)
{
	struct es_acquire_limits lim = { 6, 16, 24 };
	const int hl[2] = { 0, 2 }, he[2] = { 5, 7 };
	struct es_route_req r;
	struct st_diag d = { "" };
	struct st_wbuf w;
	uint32_t l, e;

	(void)state;
	st_wbuf_init(&w);
	es_route_req_encode(&w, 42, 0, 17, 0, 0, NULL, 2, hl, he);
	es_route_req_encode_hint_pos(&w, 18);
	assert_int_equal(w.len, 24 + 16 + 4);
	assert_int_equal(es_route_req_decode(w.data, w.len, &lim, &r, &d), 0);
	assert_int_equal(r.has_hint_pos, 1);
	assert_int_equal(r.hint_pos, 18);
	assert_int_equal(r.n_hint, 2);
	es_route_req_hint(&r, 1, &l, &e);
	assert_int_equal(l, 2);
	assert_int_equal(e, 7);
	/* without the trailing field: no hint_pos */
	assert_int_equal(es_route_req_decode(w.data, w.len - 4, &lim, &r, &d),
			 0);
	assert_int_equal(r.has_hint_pos, 0);
	/* 2 bytes of a field: neither length */
	assert_int_equal(es_route_req_decode(w.data, w.len - 2, &lim, &r, &d),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	/* hints for a position before the report's */
	st_wbuf_init(&w);
	es_route_req_encode(&w, 42, 0, 17, 0, 0, NULL, 2, hl, he);
	es_route_req_encode_hint_pos(&w, 16);
	assert_int_equal(es_route_req_decode(w.data, w.len, &lim, &r, &d),
			 -ST_E_PROTO);
	assert_non_null(strstr(d.msg, "position 16"));
	st_wbuf_fini(&w);
}

/* ---- stress: many clients against the LFRU evictor ---- */

enum { ST_RB = 4096, ST_KEYS = 12, ST_SLOTS = 4, ST_CLIENTS = 8 };

struct stress {
	struct es_pool pool;
	struct es_actstats st;
	struct es_evict_ctx ev;
	_Atomic int stop;
	_Atomic uint64_t hits, evictions, busy, bad;
	_Atomic uint64_t evicting_seen; /* failed evictions seen under a pin */
};

static void *stress_client(void *arg)
{
	struct stress *S = arg;
	struct es_pool_view *v = &S->pool.v;
	static _Atomic int next_c;
	int c = atomic_fetch_add(&next_c, 1) % ES_MAX_CLIENTS;
	unsigned seed = (unsigned)c * 7919u + 1;

	while (!atomic_load(&S->stop)) {
		uint32_t e = (uint32_t)(rand_r(&seed) % ST_KEYS), gen;
		int32_t s = es_pool_try_pin(v, c, 0, e, &gen);
		const uint8_t *rec;
		uint32_t st;
		int bad = 0;

		if (s < 0) {
			sched_yield();
			continue;
		}
		rec = es_pool_record(v, (uint32_t)s);
		if (rand_r(&seed) % 4 == 0)
			sched_yield();
		for (int i = 0; i < ST_RB; i += 64)
			bad |= rec[i] != e + 1;
		bad |= atomic_load(&v->slots[s].gen) != gen;
		/* Under a pin the state is READY or, transiently, EVICTING:
		 * the evictor's CAS READY -> EVICTING does not look at pins
		 * (PIN PROTOCOL, es_pool.h), so it may CAS a slot pinned after
		 * the policy chose it; it then sees the pin and restores
		 * READY without touching key, gen or record (checked above
		 * and again below).  LOADING, EMPTY or FAILED would mean the
		 * slot was given away. */
		st = atomic_load(&v->slots[s].state);
		if (st == ES_SLOT_EVICTING)
			atomic_fetch_add(&S->evicting_seen, 1);
		else
			bad |= st != ES_SLOT_READY;
		bad |= atomic_load(&v->slots[s].key) != es_key(0, e);
		bad |= atomic_load(&v->slots[s].gen) != gen;
		bad |= rec[ST_RB - 1] != e + 1;
		atomic_fetch_add(&S->bad, (uint64_t)bad);
		atomic_fetch_add(&S->hits, 1);
		atomic_fetch_sub(&v->slots[s].pins[c], 1);
	}
	return NULL;
}

/* The server thread: loads a random missing expert through the policy,
 * writing garbage first while the slot is LOADING. */
static void *stress_evictor(void *arg)
{
	struct stress *S = arg;
	struct es_pool *p = &S->pool;
	unsigned seed = 12345;

	while (!atomic_load(&S->stop)) {
		uint32_t e = (uint32_t)(rand_r(&seed) % ST_KEYS);
		int s, ev;

		es_actstats_add(&S->st, 0, e);
		es_actstats_tokens(&S->st, 1);
		if (atomic_load(&p->v.slot_of[e]) >= 0)
			continue;
		s = es_pool_alloc_slot(p, 1, &ev);
		if (s < 0) {
			atomic_fetch_add(&S->busy, 1);
			sched_yield();
			continue;
		}
		if (ev) {
			es_pool_slot_clear(p, (uint32_t)s);
			atomic_fetch_add(&S->evictions, 1);
		}
		es_pool_slot_assign(p, (uint32_t)s, es_key(0, e));
		memset(es_pool_record(&p->v, (uint32_t)s), 0xee, ST_RB);
		sched_yield(); /* clients run while it is LOADING */
		memset(es_pool_record(&p->v, (uint32_t)s), (int)e + 1, ST_RB);
		es_pool_slot_publish(p, (uint32_t)s, 0);
	}
	return NULL;
}

static void test_stress(void **state)
{
	const struct es_pool_geom g = { 1, ST_KEYS, ST_SLOTS, 1, ST_RB, 1 };
	struct es_pool_layout l;
	struct stress *S = calloc(1, sizeof(*S));
	void *base = alloc_pool(&g, &l);
	pthread_t th[ST_CLIENTS + 1];
	uint8_t hot[ST_KEYS] = { 0 };

	assert_non_null(S);
	open_pool(&S->pool, base, &l);
	assert_int_equal(es_actstats_init(&S->st, 1, ST_KEYS, 16.0, 1), 0);
	hot[0] = 1;
	S->ev = (struct es_evict_ctx){ ES_EVICT_LFRU, &S->st, hot, NULL, 0, 0 };
	S->pool.ev = &S->ev;
	for (int i = 0; i < ST_CLIENTS; i++)
		assert_int_equal(pthread_create(&th[i], NULL, stress_client,
						S), 0);
	assert_int_equal(pthread_create(&th[ST_CLIENTS], NULL, stress_evictor,
					S), 0);
	for (uint64_t t0 = st_now_ns(); st_now_ns() - t0 < 3000000000ull;) {
		st_sleep_ns(20000000);
		if (atomic_load(&S->evictions) >= 3000 &&
		    atomic_load(&S->hits) >= 20000)
			break;
	}
	atomic_store(&S->stop, 1);
	for (int i = 0; i <= ST_CLIENTS; i++)
		pthread_join(th[i], NULL);
	fprintf(stderr, "# LFRU stress: %llu hits, %llu evictions, %llu "
		"times every slot was pinned or loading, %llu pinned slots "
		"seen EVICTING (eviction given up), %llu bad\n",
		(unsigned long long)S->hits,
		(unsigned long long)S->evictions,
		(unsigned long long)S->busy,
		(unsigned long long)S->evicting_seen,
		(unsigned long long)S->bad);
	assert_true(S->bad == 0);
	assert_true(S->hits > 100);
	assert_true(S->evictions > 50);
	for (int s = 0; s < ST_SLOTS; s++)
		assert_true(es_slot_pin_sum(&S->pool.v.slots[s]) == 0);
	es_actstats_fini(&S->st);
	free(base);
	free(S);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decay),
		cmocka_unit_test(test_rate),
		cmocka_unit_test(test_top),
		cmocka_unit_test(test_file),
		cmocka_unit_test(test_policy),
		cmocka_unit_test(test_route_payload),
		cmocka_unit_test(test_route_hint_pos),
		cmocka_unit_test(test_stress),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
