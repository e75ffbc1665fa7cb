/*
 * test_es_ipc.c — expertd and its client library as separate processes:
 * a real expertd from the build directory on a private instance serves a
 * store converted from the kjv-moe fixture.
 *
 *  - acquired records are byte-identical to st_store_read_record's;
 *  - a 25% budget evicts while cycling through every expert and still gives
 *    the right bytes; the pool segment is sized from the budget;
 *  - PITFALLS P12: with two slots, one pinned and one loading, a third
 *    expert is refused (-ST_E_BUSY), never steals either; then, after a
 *    release, it evicts the released one and never the pinned one;
 *  - threads acquiring and releasing at random under a tight budget always
 *    see the right bytes;
 *  - malformed messages of every kind get error replies and the daemon
 *    keeps serving; PITFALLS P16 message limits;
 *  - a corrupted segment header is refused by the client with a clear
 *    error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "es_client.h"
#include "es_harness.h"
#include "es_proto.h"
#include "st_msg.h"
#include "st_util.h"
#include "test_util.h"

static struct es_h H;

static int group_setup(void **state)
{
	return es_h_init(&H, "kjv-moe", "esipc") < 0 ? -1 : 0;
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
		fprintf(stderr, "es_client_open: %s (%s)\n", diag.msg,
			st_strerror(r));
	assert_int_equal(r, 0);
	return c;
}

static char *budget_slots(int n, char *buf, size_t len)
{
	snprintf(buf, len, "%llu",
		 (unsigned long long)((uint64_t)n * H.record_bytes));
	return buf;
}

/* 1. Records byte-identical to the store's, hits without reload. */
static void test_acquire_bytes(void **state)
{
	struct es_client *c;
	struct es_stats s0, s1;
	const uint8_t *rec[64];
	int ids[64];
	struct st_diag diag = { "" };

	assert_int_equal(es_h_start(&H, "--host-budget", "100%", NULL), 0);
	c = open_client("bytes");
	assert_int_equal(es_client_n_layers(c), H.n_layers);
	assert_int_equal(es_client_n_experts(c), H.n_experts);
	assert_int_equal(es_client_n_slots(c), H.n_layers * H.n_experts);
	assert_int_equal(es_client_top_k(c), H.top_k);
	assert_true(es_client_record_bytes(c) == H.record_bytes);
	assert_true(es_client_store_id(c) != 0);
	for (int e = 0; e < H.n_experts; e++)
		ids[e] = H.n_experts - 1 - e; /* any order */
	for (int l = 0; l < H.n_layers; l++) {
		int r = es_client_acquire(c, l, H.n_experts, ids, rec, &diag);

		if (r)
			fprintf(stderr, "%s\n", diag.msg);
		assert_int_equal(r, 0);
		for (int i = 0; i < H.n_experts; i++)
			assert_memory_equal(rec[i], es_h_ref(&H, l, ids[i]),
					    H.record_bytes);
		es_client_release(c, l, H.n_experts, ids);
	}
	assert_int_equal(es_client_stats(c, &s0), 0);
	assert_true(s0.loads == (uint64_t)H.n_layers * H.n_experts);
	assert_true(s0.misses == s0.loads);
	assert_true(s0.load_bytes == s0.loads * H.record_bytes);
	assert_true(s0.checksum_failures == 0);
	assert_true(s0.evictions == 0);
	assert_true(s0.slots_used == s0.n_slots);
	assert_true(s0.epoch == 1);
	assert_int_equal(s0.pid, H.pid);
	assert_int_equal(s0.n_clients, 1);
	/* Again: every expert is a fast-path hit, nothing is read. */
	for (int l = 0; l < H.n_layers; l++) {
		assert_int_equal(es_client_acquire(c, l, 3, ids, rec, &diag), 0);
		for (int i = 0; i < 3; i++)
			assert_memory_equal(rec[i], es_h_ref(&H, l, ids[i]),
					    H.record_bytes);
		es_client_release(c, l, 3, ids);
	}
	assert_int_equal(es_client_stats(c, &s1), 0);
	assert_true(s1.loads == s0.loads);
	assert_true(s1.hits == s0.hits + 3 * (uint64_t)H.n_layers);
	/* Two pins of one expert need two releases; a third is harmless. */
	{
		struct st_shm shm;
		struct es_pool_view v;
		int32_t s;
		int c_idx = (int)es_client_id_index(es_client_id(c));

		assert_int_equal(es_h_attach(&H, &shm, &v), 0);
		assert_int_equal(es_client_acquire(c, 2, 1, ids, rec, &diag), 0);
		assert_int_equal(es_client_acquire(c, 2, 1, ids, rec, &diag), 0);
		s = atomic_load(&v.slot_of[es_pool_index(&v, 2, ids[0])]);
		assert_true(s >= 0);
		assert_int_equal(atomic_load(&v.slots[s].pins[c_idx]), 2);
		es_client_release(c, 2, 1, ids);
		assert_int_equal(atomic_load(&v.slots[s].pins[c_idx]), 1);
		es_client_release(c, 2, 1, ids);
		es_client_release(c, 2, 1, ids);
		assert_int_equal(atomic_load(&v.slots[s].pins[c_idx]), 0);
		st_shm_detach(&shm);
	}
	/* Bad arguments are refused without a message to expertd. */
	ids[0] = 1;
	ids[1] = 1;
	assert_int_equal(es_client_acquire(c, 0, 2, ids, rec, &diag), -EINVAL);
	assert_int_equal(es_client_acquire(c, H.n_layers, 1, ids, rec, &diag),
			 -EINVAL);
	ids[0] = H.n_experts;
	assert_int_equal(es_client_acquire(c, 0, 1, ids, rec, &diag), -EINVAL);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

/* 2. A quarter of the experts: evictions, right bytes, pool sized from the
 * budget. */
static void test_eviction_cycle(void **state)
{
	const int n_keys = H.n_layers * H.n_experts;
	struct es_client *c;
	struct es_stats s;
	struct es_pool_layout lay;
	struct es_pool_geom g;
	const uint8_t *rec[4];
	struct st_diag diag = { "" };
	struct stat st;
	char path[256];

	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	c = open_client("cycle");
	assert_int_equal(es_client_n_slots(c), n_keys / 4);
	for (int pass = 0; pass < 2; pass++)
		for (int l = 0; l < H.n_layers; l++)
			for (int e = 0; e + 1 < H.n_experts; e += 2) {
				int ids[2] = { e, e + 1 };

				assert_int_equal(es_client_acquire(c, l, 2, ids,
								   rec, &diag),
						 0);
				assert_memory_equal(rec[0], es_h_ref(&H, l, e),
						    H.record_bytes);
				assert_memory_equal(rec[1],
						    es_h_ref(&H, l, e + 1),
						    H.record_bytes);
				es_client_release(c, l, 2, ids);
			}
	assert_int_equal(es_client_stats(c, &s), 0);
	/* Cycling through 4x the pool: every acquire of the second pass
	 * misses again (LRU), so 2 * n_keys loads and n_keys + (n_keys -
	 * n_slots) evictions. */
	assert_true(s.loads == 2 * (uint64_t)n_keys);
	assert_true(s.evictions == 2 * (uint64_t)n_keys - s.n_slots);
	assert_true(s.slots_used == s.n_slots);
	assert_true(s.budget_bytes == s.n_slots * H.record_bytes);
	/* The segment: the budget plus its tables, page-rounded (2 MiB
	 * alignment only for pools of 64 MiB or more). */
	g = (struct es_pool_geom){ (uint32_t)H.n_layers, (uint32_t)H.n_experts,
				   (uint32_t)s.n_slots, (uint32_t)H.top_k,
				   H.record_bytes, es_client_store_id(c) };
	assert_int_equal(es_pool_layout_compute(&g, &lay), 0);
	assert_true(s.pool_bytes == lay.total_bytes);
	assert_true(s.pool_bytes >= s.budget_bytes);
	assert_true(s.pool_bytes <= s.budget_bytes + lay.data_offset +
					    st_shm_region_align(s.budget_bytes));
	assert_true(lay.data_offset <= 64 * 1024); /* tables: a few KiB */
	snprintf(path, sizeof(path), "/dev/shm/strata.%s.experts", H.inst);
	assert_int_equal(stat(path, &st), 0);
	assert_true((uint64_t)st.st_size == s.pool_bytes);
	assert_int_equal(st.st_mode & 0777, 0600);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

/* 3. PITFALLS P12 with two slots. */
struct bg_acquire {
	struct es_client *c;
	int layer, expert;
	const uint8_t *rec;
	int r;
};

static void *bg_acquire_main(void *arg)
{
	struct bg_acquire *b = arg;
	struct st_diag diag = { "" };

	b->r = es_client_acquire(b->c, b->layer, 1, &b->expert, &b->rec,
				 &diag);
	return NULL;
}

static void test_p12_two_slots(void **state)
{
	char budget[32];
	struct es_client *a, *b, *cc;
	struct st_shm shm;
	struct es_pool_view v;
	struct bg_acquire bg;
	pthread_t th;
	const uint8_t *rec9, *rec12;
	int e5 = 5, e9 = 9, e12 = 12;
	int32_t s9, s5;
	uint32_t gen9, gen5;
	struct st_diag diag = { "" };
	uint64_t t0;
	int r;

	assert_int_equal(es_h_start(&H, "--host-budget",
				    budget_slots(2, budget, sizeof(budget)),
				    "--test-load-delay-ms", "400", NULL), 0);
	a = open_client("p12-a");
	b = open_client("p12-b");
	cc = open_client("p12-c");
	assert_int_equal(es_client_n_slots(a), 2);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);

	/* Expert 9 pinned by a. */
	assert_int_equal(es_client_acquire(a, 0, 1, &e9, &rec9, &diag), 0);
	assert_memory_equal(rec9, es_h_ref(&H, 0, 9), H.record_bytes);
	s9 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 9)]);
	assert_true(s9 >= 0);
	gen9 = atomic_load(&v.slots[s9].gen);

	/* Expert 5 loading for b (the load takes 400 ms). */
	bg = (struct bg_acquire){ b, 0, 5, NULL, 1 };
	assert_int_equal(pthread_create(&th, NULL, bg_acquire_main, &bg), 0);
	for (int i = 0; i < 1000; i++) {
		s5 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 5)]);
		if (s5 >= 0)
			break;
		st_sleep_ns(1000000);
	}
	assert_true(s5 >= 0 && s5 != s9);
	assert_int_equal(atomic_load(&v.slots[s5].state), ES_SLOT_LOADING);
	gen5 = atomic_load(&v.slots[s5].gen);

	/* A third expert: refused at once, neither slot touched. */
	t0 = st_now_ns();
	r = es_client_acquire(cc, 0, 1, &e12, &rec12, &diag);
	assert_int_equal(r, -ST_E_BUSY);
	assert_non_null(strstr(diag.msg, "expert 12"));
	assert_true(st_now_ns() - t0 < 300000000ull);
	assert_int_equal(atomic_load(&v.slots[s5].state), ES_SLOT_LOADING);
	assert_int_equal(atomic_load(&v.slots[s5].gen), gen5);
	assert_int_equal(atomic_load(&v.slots[s9].gen), gen9);
	assert_int_equal(atomic_load(&v.slot_of[es_pool_index(&v, 0, 12)]), -1);
	/* nothing of the refused call stays pinned */
	assert_int_equal(es_slot_pin_sum(&v.slots[s5]), 1);
	assert_int_equal(es_slot_pin_sum(&v.slots[s9]), 1);

	pthread_join(th, NULL);
	assert_int_equal(bg.r, 0);
	assert_memory_equal(bg.rec, es_h_ref(&H, 0, 5), H.record_bytes);
	assert_memory_equal(rec9, es_h_ref(&H, 0, 9), H.record_bytes);

	/* Both pinned and READY: still refused. */
	assert_int_equal(es_client_acquire(cc, 0, 1, &e12, &rec12, &diag),
			 -ST_E_BUSY);

	/* b releases 5: 12 takes 5's slot, never 9's. */
	es_client_release(b, 0, 1, &e5);
	assert_int_equal(es_client_acquire(cc, 0, 1, &e12, &rec12, &diag), 0);
	assert_memory_equal(rec12, es_h_ref(&H, 0, 12), H.record_bytes);
	assert_int_equal(atomic_load(&v.slot_of[es_pool_index(&v, 0, 12)]), s5);
	assert_int_equal(atomic_load(&v.slot_of[es_pool_index(&v, 0, 5)]), -1);
	assert_int_equal(atomic_load(&v.slot_of[es_pool_index(&v, 0, 9)]), s9);
	assert_int_equal(atomic_load(&v.slots[s9].gen), gen9);
	assert_int_equal(atomic_load(&v.slots[s9].state), ES_SLOT_READY);
	/* The pinned record never changed (outputs equal an all-resident
	 * run: the bytes are the store's). */
	assert_memory_equal(rec9, es_h_ref(&H, 0, 9), H.record_bytes);
	es_client_release(a, 0, 1, &e9);
	es_client_release(cc, 0, 1, &e12);
	st_shm_detach(&shm);
	es_client_close(a);
	es_client_close(b);
	es_client_close(cc);
	assert_int_equal(es_h_stop(&H), 0);
}

/* 4. Threads acquiring and releasing at random under a tight budget. */
struct stress_arg {
	struct es_client *c;
	unsigned seed;
	uint64_t until_ns;
	int ok, busy, bad, errors;
};

static void *stress_main(void *arg)
{
	struct stress_arg *a = arg;
	struct st_diag diag = { "" };

	while (st_now_ns() < a->until_ns) {
		int layer = rand_r(&a->seed) % H.n_layers;
		int n = 1 + rand_r(&a->seed) % 2;
		int ids[2];
		const uint8_t *rec[2];
		int r;

		ids[0] = rand_r(&a->seed) % H.n_experts;
		ids[1] = (ids[0] + 1 + rand_r(&a->seed) % (H.n_experts - 1)) %
			 H.n_experts;
		r = es_client_acquire(a->c, layer, n, ids, rec, &diag);
		if (r == -ST_E_BUSY) {
			a->busy++;
			continue;
		}
		if (r < 0) {
			fprintf(stderr, "stress: %s\n", diag.msg);
			a->errors++;
			continue;
		}
		for (int i = 0; i < n; i++)
			a->bad += memcmp(rec[i], es_h_ref(&H, layer, ids[i]),
					 H.record_bytes) != 0;
		if (rand_r(&a->seed) % 2)
			st_sleep_ns(rand_r(&a->seed) % 200000);
		/* still ours: nobody evicted or reloaded it meanwhile */
		for (int i = 0; i < n; i++)
			a->bad += memcmp(rec[i], es_h_ref(&H, layer, ids[i]),
					 H.record_bytes) != 0;
		es_client_release(a->c, layer, n, ids);
		a->ok++;
	}
	return NULL;
}

static void test_stress_threads(void **state)
{
	enum { N_THREADS = 5 };
	struct stress_arg args[N_THREADS];
	pthread_t th[N_THREADS];
	struct es_client *cl[4];
	struct es_stats s;
	char budget[32];
	int ok = 0, bad = 0, errors = 0, busy = 0;
	uint64_t until = st_now_ns() + 1500000000ull;

	assert_int_equal(es_h_start(&H, "--host-budget",
				    budget_slots(8, budget, sizeof(budget)),
				    "--loader-threads", "3", NULL), 0);
	/* Four clients; the last two threads share one handle. */
	for (int i = 0; i < 4; i++)
		cl[i] = open_client("stress");
	for (int i = 0; i < N_THREADS; i++) {
		args[i] = (struct stress_arg){ cl[i < 4 ? i : 3],
					       1234u + (unsigned)i, until,
					       0, 0, 0, 0 };
		assert_int_equal(pthread_create(&th[i], NULL, stress_main,
						&args[i]), 0);
	}
	for (int i = 0; i < N_THREADS; i++) {
		pthread_join(th[i], NULL);
		ok += args[i].ok;
		bad += args[i].bad;
		errors += args[i].errors;
		busy += args[i].busy;
	}
	assert_int_equal(es_client_stats(cl[0], &s), 0);
	fprintf(stderr, "# stress: %d acquires, %d busy, %llu loads, %llu "
		"evictions, %llu hits\n", ok, busy,
		(unsigned long long)s.loads, (unsigned long long)s.evictions,
		(unsigned long long)s.hits);
	assert_int_equal(bad, 0);
	assert_int_equal(errors, 0);
	assert_true(ok > 200);
	assert_true(s.evictions > 50);
	assert_true(s.checksum_failures == 0);
	/* Every pin was given back. */
	{
		struct st_shm shm;
		struct es_pool_view v;

		assert_int_equal(es_h_attach(&H, &shm, &v), 0);
		for (uint32_t i = 0; i < v.n_slots; i++)
			assert_int_equal(es_slot_pin_sum(&v.slots[i]), 0);
		st_shm_detach(&shm);
	}
	for (int i = 0; i < 4; i++)
		es_client_close(cl[i]);
	assert_int_equal(es_h_stop(&H), 0);
}

/* ---- raw messages ---- */

/* Sends raw bytes on a REQ socket and returns the reply's status (and its
 * message in msg); fails the test if no well-formed reply comes. */
static int raw_call(struct st_sock *s, const void *buf, size_t len,
		    uint16_t expect_type, uint64_t expect_req, char *msg,
		    size_t msg_len)
{
	struct st_msg_header h;
	void *rep = NULL;
	size_t rlen = 0;

	assert_int_equal(st_sock_send(s, buf, len), 0);
	assert_int_equal(st_sock_recv(s, &rep, &rlen), 0);
	assert_int_equal(st_proto_decode_header(rep, rlen, &h), 0);
	assert_int_equal(h.type, expect_type | ST_MSG_REPLY);
	assert_true(h.request_id == expect_req);
	if (msg) {
		msg[0] = 0;
		if (h.status < 0)
			assert_int_equal(es_error_decode(
						 (uint8_t *)rep + 32,
						 h.payload_len, msg, msg_len),
					 0);
	}
	free(rep);
	return h.status;
}

/* Builds header + payload with every header field chosen by the test. */
static size_t build_msg(uint8_t *out, uint32_t magic, uint16_t version,
			uint16_t type, uint64_t req, uint32_t client,
			uint32_t payload_len_field, uint32_t reserved,
			const void *payload, size_t payload_len)
{
	struct st_wbuf w;
	size_t n;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, magic);
	st_wbuf_u16(&w, version);
	st_wbuf_u16(&w, type);
	st_wbuf_u64(&w, req);
	st_wbuf_u32(&w, client);
	st_wbuf_i32(&w, 0);
	st_wbuf_u32(&w, payload_len_field);
	st_wbuf_u32(&w, reserved);
	st_wbuf_bytes(&w, payload, payload_len);
	n = w.len;
	memcpy(out, w.data, n);
	st_wbuf_fini(&w);
	return n;
}

static int call_typed(struct st_sock *s, uint16_t type, uint64_t req,
		      uint32_t client, const struct st_wbuf *pl, char *msg,
		      size_t mlen)
{
	uint8_t buf[4096];
	size_t n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, type, req,
			     client, pl ? (uint32_t)pl->len : 0, 0,
			     pl ? pl->data : NULL, pl ? pl->len : 0);

	return raw_call(s, buf, n, type, req, msg, mlen);
}

static void ping_ok(struct st_sock *s, uint64_t req)
{
	assert_int_equal(call_typed(s, ST_MSG_PING, req, 0, NULL, NULL, 0), 0);
}

static int acquire_raw(struct st_sock *s, uint64_t req, uint32_t client,
		       uint32_t pid, uint32_t layer, uint32_t n,
		       const int *ids, int n_ids, char *msg, size_t mlen)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, pid);
	st_wbuf_u32(&w, layer);
	st_wbuf_u32(&w, n);
	for (int i = 0; i < n_ids; i++)
		st_wbuf_u32(&w, (uint32_t)ids[i]);
	r = call_typed(s, ES_MSG_ACQUIRE, req, client, &w, msg, mlen);
	st_wbuf_fini(&w);
	return r;
}

/* HELLO of (pid, start_ticks) as "raw": the client id (asserts 0). */
static uint32_t hello_raw(struct st_sock *s, uint64_t req, uint32_t pid,
			  uint64_t start_ticks)
{
	struct st_msg_header h;
	struct es_hello_rep hr;
	struct st_wbuf w;
	uint8_t buf[4096];
	void *rep;
	size_t n, rl;

	st_wbuf_init(&w);
	es_hello_req_encode(&w, pid, ES_PROTO_VERSION, "raw", start_ticks);
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, ST_MSG_HELLO, req,
		      0, (uint32_t)w.len, 0, w.data, w.len);
	st_wbuf_fini(&w);
	assert_int_equal(st_sock_send(s, buf, n), 0);
	assert_int_equal(st_sock_recv(s, &rep, &rl), 0);
	assert_int_equal(st_proto_decode_header(rep, rl, &h), 0);
	assert_int_equal(h.status, 0);
	assert_int_equal(es_hello_rep_decode((uint8_t *)rep + 32,
					     h.payload_len, &hr, NULL), 0);
	free(rep);
	return hr.client_id;
}

/* 5. Malformed messages of every type. */
static void test_malformed(void **state)
{
	struct st_sock s;
	char ctl[700], msg[1100];
	uint8_t buf[4096];
	uint64_t req = 100;
	struct st_wbuf w;
	uint32_t id, pid = (uint32_t)getpid();
	size_t n;
	int ids[4] = { 1, 2, 3, 1 };

	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	assert_int_equal(st_sock_open(&s, ST_SOCK_REQ,
				      es_h_path(&H, "ctl", ctl, sizeof(ctl)),
				      2000, 2000), 0);
	ping_ok(&s, req++);

	/* truncated header */
	memset(buf, 0, sizeof(buf));
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, ST_MSG_PING, 7, 0,
		      0, 0, NULL, 0);
	assert_int_equal(raw_call(&s, buf, 16, 0, 0, msg, sizeof(msg)),
			 -ST_E_PROTO);
	assert_non_null(strstr(msg, "shorter than"));
	ping_ok(&s, req++);
	/* bad magic */
	n = build_msg(buf, 0x12345678, ST_PROTO_VERSION, ST_MSG_PING, req, 0,
		      0, 0, NULL, 0);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_BADMAGIC);
	req++;
	ping_ok(&s, req++);
	/* wrong wire version */
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION + 1, ST_MSG_PING,
		      req, 0, 0, 0, NULL, 0);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_VERSION);
	assert_non_null(strstr(msg, "version"));
	req++;
	ping_ok(&s, req++);
	/* payload length lies (both ways) and reserved field set */
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, ST_MSG_PING, req,
		      0, 100, 0, "12345678", 8);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_PROTO);
	req++;
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, ST_MSG_PING, req,
		      0, 2, 0, "12345678", 8);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_PROTO);
	req++;
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION, ST_MSG_PING, req,
		      0, 0, 1, NULL, 0);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_PROTO);
	req++;
	ping_ok(&s, req++);
	/* unknown type; a reply type sent as a request */
	assert_int_equal(call_typed(&s, 0x0177, req, 0, NULL, msg,
				    sizeof(msg)), -ST_E_PROTO);
	assert_non_null(strstr(msg, "unknown message type"));
	req++;
	n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION,
		      ST_MSG_PING | ST_MSG_REPLY, req, 0, 0, 0, NULL, 0);
	assert_int_equal(raw_call(&s, buf, n, ST_MSG_PING, req, msg,
				  sizeof(msg)), -ST_E_PROTO);
	req++;
	ping_ok(&s, req++);
	/* payload on messages that take none */
	st_wbuf_init(&w);
	st_wbuf_u32(&w, 1);
	assert_int_equal(call_typed(&s, ST_MSG_PING, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	assert_int_equal(call_typed(&s, ST_MSG_STATS, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	assert_int_equal(call_typed(&s, ST_MSG_SHUTDOWN, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	assert_int_equal(call_typed(&s, ST_MSG_BYE, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	st_wbuf_fini(&w);
	ping_ok(&s, req++);
	/* HELLO: truncated, wrong protocol version, bad pid, bad name */
	st_wbuf_init(&w);
	st_wbuf_u32(&w, pid);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, pid, ES_PROTO_VERSION + 1, "x", 0);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_VERSION);
	assert_non_null(strstr(msg, "protocol"));
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 0, ES_PROTO_VERSION, "x", 0);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, pid, ES_PROTO_VERSION, "bad\nname", 0);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ST_E_PROTO);
	st_wbuf_fini(&w);
	ping_ok(&s, req++);

	/* A valid HELLO to get a client id. */
	id = hello_raw(&s, req++, pid, 0);
	/* ACQUIRE: every field out of range */
	assert_int_equal(acquire_raw(&s, req++, id, pid, (uint32_t)H.n_layers,
				     1, ids, 1, msg, sizeof(msg)), -ST_E_PROTO);
	assert_non_null(strstr(msg, "layer"));
	{
		int big[1] = { H.n_experts };

		assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 1, big, 1,
					     msg, sizeof(msg)), -ST_E_PROTO);
		assert_non_null(strstr(msg, "expert"));
	}
	{
		int many[64];
		uint32_t n_slots = (uint32_t)(H.n_layers * H.n_experts / 4);

		for (int i = 0; i < 64; i++)
			many[i] = i % H.n_experts;
		assert_int_equal(acquire_raw(&s, req++, id, pid, 0,
					     n_slots + 1, many,
					     (int)n_slots + 1, msg,
					     sizeof(msg)), -ST_E_PROTO);
		assert_non_null(strstr(msg, "slots"));
	}
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 0, ids, 0, msg,
				     sizeof(msg)), -ST_E_PROTO);
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 4, ids, 4, msg,
				     sizeof(msg)), -ST_E_PROTO);
	assert_non_null(strstr(msg, "twice"));
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 3, ids, 2, msg,
				     sizeof(msg)), -ST_E_PROTO); /* n lies */
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 0xffffffffu, ids,
				     2, msg, sizeof(msg)), -ST_E_PROTO);
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 1, ids, 0, msg,
				     sizeof(msg)), -ST_E_PROTO); /* no ids */
	/* unknown client ids, wrong pid */
	assert_int_equal(acquire_raw(&s, req++, 0, pid, 0, 1, ids, 1, msg,
				     sizeof(msg)), -ST_E_NOTFOUND);
	assert_int_equal(acquire_raw(&s, req++, id + 256, pid, 0, 1, ids, 1,
				     msg, sizeof(msg)), -ST_E_NOTFOUND);
	assert_int_equal(acquire_raw(&s, req++, es_client_id_make(31, 1), pid,
				     0, 1, ids, 1, msg, sizeof(msg)),
			 -ST_E_NOTFOUND);
	assert_int_equal(acquire_raw(&s, req++, 200, pid, 0, 1, ids, 1, msg,
				     sizeof(msg)), -ST_E_NOTFOUND);
	assert_int_equal(acquire_raw(&s, req++, id, pid + 1, 0, 1, ids, 1, msg,
				     sizeof(msg)), -EPERM);
	/* RELEASE malformed the same way */
	{
		st_wbuf_init(&w);
		st_wbuf_u32(&w, pid);
		st_wbuf_u32(&w, 0);
		st_wbuf_u32(&w, 2);
		st_wbuf_u32(&w, 1);
		assert_int_equal(call_typed(&s, ES_MSG_RELEASE, req++, id, &w,
					    msg, sizeof(msg)), -ST_E_PROTO);
		st_wbuf_fini(&w);
	}
	ping_ok(&s, req++);

	/* A valid ACQUIRE, then RELEASE by message, then BYE; the id is
	 * stale afterwards. */
	{
		struct st_msg_header h;
		struct es_acquire_ent ent;
		void *rep;
		size_t rl;

		st_wbuf_init(&w);
		es_acquire_req_encode(&w, pid, 1, 1, ids);
		n = build_msg(buf, ST_PROTO_MAGIC, ST_PROTO_VERSION,
			      ES_MSG_ACQUIRE, req, id, (uint32_t)w.len, 0,
			      w.data, w.len);
		assert_int_equal(st_sock_send(&s, buf, n), 0);
		assert_int_equal(st_sock_recv(&s, &rep, &rl), 0);
		assert_int_equal(st_proto_decode_header(rep, rl, &h), 0);
		assert_int_equal(h.status, 0);
		assert_int_equal(es_acquire_rep_decode((uint8_t *)rep + 32,
						       h.payload_len, 1,
						       1u << 20, &ent, NULL),
				 0);
		free(rep);
		/* the same request again (a re-send): the same answer, and
		 * the expert is pinned once, not twice */
		{
			struct es_acquire_ent ent2;
			struct st_shm shm;
			struct es_pool_view v;

			assert_int_equal(st_sock_send(&s, buf, n), 0);
			assert_int_equal(st_sock_recv(&s, &rep, &rl), 0);
			assert_int_equal(st_proto_decode_header(rep, rl, &h), 0);
			assert_int_equal(h.status, 0);
			assert_int_equal(es_acquire_rep_decode(
						 (uint8_t *)rep + 32,
						 h.payload_len, 1, 1u << 20,
						 &ent2, NULL), 0);
			free(rep);
			assert_int_equal(ent2.slot, ent.slot);
			assert_int_equal(ent2.gen, ent.gen);
			assert_int_equal(es_h_attach(&H, &shm, &v), 0);
			assert_int_equal(es_slot_pin_sum(&v.slots[ent.slot]),
					 1);
			st_shm_detach(&shm);
		}
		req++;
		assert_int_equal(call_typed(&s, ES_MSG_RELEASE, req++, id, &w,
					    NULL, 0), 0);
		st_wbuf_fini(&w);
		{
			struct st_shm shm;
			struct es_pool_view v;

			assert_int_equal(es_h_attach(&H, &shm, &v), 0);
			assert_int_equal(es_slot_pin_sum(&v.slots[ent.slot]),
					 0);
			st_shm_detach(&shm);
		}
	}
	assert_int_equal(call_typed(&s, ST_MSG_BYE, req++, id, NULL, NULL, 0),
			 0);
	assert_int_equal(call_typed(&s, ST_MSG_BYE, req++, id, NULL, msg,
				    sizeof(msg)), -ST_E_NOTFOUND);
	assert_int_equal(acquire_raw(&s, req++, id, pid, 0, 1, ids, 1, msg,
				     sizeof(msg)), -ST_E_NOTFOUND);
	ping_ok(&s, req++);
	/* The client table is bounded: HELLO beyond ES_MAX_CLIENTS is refused
	 * with a message (and registered clients are not disturbed). */
	{
		int n_ok = 0, r;

		for (int i = 0; i < ES_MAX_CLIENTS + 1; i++) {
			st_wbuf_init(&w);
			es_hello_req_encode(&w, pid, ES_PROTO_VERSION, "many", 0);
			r = call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				       sizeof(msg));
			st_wbuf_fini(&w);
			if (r == 0)
				n_ok++;
			else
				break;
		}
		assert_int_equal(n_ok, ES_MAX_CLIENTS);
		assert_int_equal(call_typed(&s, ST_MSG_HELLO, req - 1, 0, NULL,
					    msg, sizeof(msg)), -ST_E_PROTO);
	}
	{
		int r;

		st_wbuf_init(&w);
		es_hello_req_encode(&w, pid, ES_PROTO_VERSION, "one-more", 0);
		r = call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg, sizeof(msg));
		st_wbuf_fini(&w);
		assert_int_equal(r, -ST_E_LIMIT);
		assert_non_null(strstr(msg, "at most 32 clients"));
	}
	ping_ok(&s, req++);
	st_sock_close(&s);
	/* Those 32 registrations belong to this (live) process; restart
	 * expertd so the library test below gets a table entry. */
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);

	/* And the client library still works. */
	{
		struct es_client *c = open_client("after");
		const uint8_t *rec;
		struct st_diag diag = { "" };

		assert_int_equal(es_client_acquire(c, 2, 1, ids, &rec, &diag),
				 0);
		assert_memory_equal(rec, es_h_ref(&H, 2, ids[0]),
				    H.record_bytes);
		es_client_release(c, 2, 1, ids);
		es_client_close(c);
	}
	assert_int_equal(es_h_stop(&H), 0);
}

/* 6. PITFALLS P16: message size limits. */
static void test_p16_limits(void **state)
{
	struct st_sock s;
	char ctl[700], msg[1100];
	uint8_t *big;
	uint8_t small[16];

	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	assert_int_equal(st_sock_open(&s, ST_SOCK_REQ,
				      es_h_path(&H, "ctl", ctl, sizeof(ctl)),
				      2000, 2000), 0);
	big = calloc(1, ST_MSG_MAX_BYTES + 1);
	assert_non_null(big);
	/* 1 MiB + 1: refused at the sender, naming the limit */
	assert_int_equal(st_sock_send(&s, big, ST_MSG_MAX_BYTES + 1),
			 -ST_E_LIMIT);
	assert_non_null(strstr(st_strerror(-ST_E_LIMIT), "limit"));
	/* the following 16-byte message arrives (and is answered) */
	memset(small, 0, sizeof(small));
	assert_int_equal(raw_call(&s, small, sizeof(small), 0, 0, msg,
				  sizeof(msg)), -ST_E_PROTO);
	/* a large valid-framed message well under the limit arrives (an
	 * unknown type with a correct length) */
	build_msg(big, ST_PROTO_MAGIC, ST_PROTO_VERSION, 0x01ff, 77, 0,
		  ST_MSG_MAX_BYTES - 64 - 32, 0, NULL, 0);
	assert_int_equal(raw_call(&s, big, ST_MSG_MAX_BYTES - 64, 0x01ff, 77,
				  msg, sizeof(msg)), -ST_E_PROTO);
	/* st_proto_encode refuses a payload that would exceed it */
	{
		struct st_wbuf w;

		st_wbuf_init(&w);
		assert_int_equal(st_proto_encode(&w, ST_MSG_PING, 1, 0, 0, big,
						 ST_MSG_MAX_BYTES - 31),
				 -ST_E_LIMIT);
		st_wbuf_fini(&w);
	}
	ping_ok(&s, 78);
	free(big);
	st_sock_close(&s);
	assert_int_equal(es_h_stop(&H), 0);
}

/* 6b. A message of exactly ST_MSG_MAX_BYTES: st_sock_send accepts it, so
 * it must arrive.  nanomsg's REQ adds a 4-byte request id before the REP's
 * NN_RCVMAXSIZE check, so with the receive limit set to exactly
 * ST_MSG_MAX_BYTES it is silently dropped (the P16 fault itself).  That is
 * in common/st_msg.c, not expertd: reported, and skipped here while it
 * stands so the suite stays usable. */
static void test_p16_exact_limit(void **state)
{
	struct st_sock s;
	struct st_msg_header h;
	char ctl[700];
	uint8_t *big;
	void *rep = NULL;
	size_t rlen = 0;
	int r;

	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	assert_int_equal(st_sock_open(&s, ST_SOCK_REQ,
				      es_h_path(&H, "ctl", ctl, sizeof(ctl)),
				      2000, 1000), 0);
	big = calloc(1, ST_MSG_MAX_BYTES);
	assert_non_null(big);
	build_msg(big, ST_PROTO_MAGIC, ST_PROTO_VERSION, 0x01ff, 5, 0,
		  ST_MSG_MAX_BYTES - 32, 0, NULL, 0);
	assert_int_equal(st_sock_send(&s, big, ST_MSG_MAX_BYTES), 0);
	r = st_sock_recv(&s, &rep, &rlen);
	free(big);
	/* st_msg.c gives the receive limit ST_MSG_PROTO_HEADROOM bytes for
	 * the REQ header, so a message of exactly the limit arrives */
	assert_int_equal(r, 0);
	assert_int_equal(st_proto_decode_header(rep, rlen, &h), 0);
	assert_int_equal(h.status, -ST_E_PROTO);
	free(rep);
	st_sock_close(&s);
	assert_int_equal(es_h_stop(&H), 0);
}

/* 7. A corrupted segment header: the client refuses to attach. */
/* 9. (issue 26) An ACQUIRE's request id is recorded before its pins: a
 * re-sent ACQUIRE (expertd was killed half-way, the client resends)
 * pins exactly the slots where the client holds none, never one twice.
 * And HELLO names a process expertd can see, with the start time it
 * claims. */
static void test_acquire_replay(void **state)
{
	struct st_sock s;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_wbuf w;
	char ctl[700], msg[1100];
	uint32_t id, pid = (uint32_t)getpid();
	uint64_t req = 10, rid, me = 0;
	int ids[2] = { 1, 2 }, c, s1, s2;
	pid_t gone;

	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(st_sock_open(&s, ST_SOCK_REQ,
				      es_h_path(&H, "ctl", ctl, sizeof(ctl)),
				      2000, 2000), 0);
	assert_int_equal(st_pid_start_ticks((int)pid, &me), 0);
	id = hello_raw(&s, req++, pid, me);
	c = (int)es_client_id_index(id);
	rid = req++;
	assert_int_equal(acquire_raw(&s, rid, id, pid, 0, 2, ids, 2, msg,
				     sizeof(msg)), 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	s1 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 1)]);
	s2 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 2)]);
	assert_true(s1 >= 0 && s2 >= 0);
	assert_int_equal(atomic_load(&v.slots[s1].pins[c]), 1);
	assert_int_equal(atomic_load(&v.slots[s2].pins[c]), 1);
	/* as if expertd died after recording the request and pinning
	 * expert 1 only: the re-sent request pins expert 2, not 1 again */
	atomic_store(&v.slots[s2].pins[c], 0);
	assert_int_equal(acquire_raw(&s, rid, id, pid, 0, 2, ids, 2, msg,
				     sizeof(msg)), 0);
	assert_int_equal(atomic_load(&v.slots[s1].pins[c]), 1);
	assert_int_equal(atomic_load(&v.slots[s2].pins[c]), 1);
	assert_int_equal(acquire_raw(&s, rid, id, pid, 0, 2, ids, 2, msg,
				     sizeof(msg)), 0);
	assert_int_equal(atomic_load(&v.slots[s1].pins[c]), 1);
	assert_int_equal(atomic_load(&v.slots[s2].pins[c]), 1);
	st_shm_detach(&shm);

	/* HELLO from a pid expertd cannot see (another pid namespace) */
	gone = fork();
	if (gone == 0)
		_exit(0);
	assert_int_equal(waitpid(gone, NULL, 0), gone);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, (uint32_t)gone, ES_PROTO_VERSION, "ns", 0);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ESRCH);
	assert_non_null(strstr(msg, "pid namespace"));
	st_wbuf_fini(&w);
	/* ... or whose start time is not the one the client has */
	st_wbuf_init(&w);
	es_hello_req_encode(&w, pid, ES_PROTO_VERSION, "ns", me + 1);
	assert_int_equal(call_typed(&s, ST_MSG_HELLO, req++, 0, &w, msg,
				    sizeof(msg)), -ESRCH);
	assert_non_null(strstr(msg, "another process"));
	st_wbuf_fini(&w);
	st_sock_close(&s);
	assert_int_equal(es_h_stop(&H), 0);
}

static void test_bad_shm_header(void **state)
{
	struct st_shm shm;
	struct es_pool_view v;
	struct es_client *c = NULL;
	struct st_diag diag = { "" };
	struct es_stats s;
	uint64_t magic, pmagic;
	uint32_t ver;
	int r;

	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	/* st_shm magic */
	magic = atomic_load(&v.shm->magic);
	atomic_store(&v.shm->magic, 0x1122334455667788ull);
	r = es_client_open(H.run_dir, H.inst, "bad", ES_H_TIMEOUT_MS, &c, &diag);
	assert_int_equal(r, -ST_E_BADMAGIC);
	assert_null(c);
	assert_non_null(strstr(diag.msg, "bad magic"));
	atomic_store(&v.shm->magic, magic);
	/* layout version */
	ver = v.shm->layout_version;
	v.shm->layout_version = ES_POOL_LAYOUT_VERSION + 7;
	r = es_client_open(H.run_dir, H.inst, "bad", ES_H_TIMEOUT_MS, &c, &diag);
	assert_int_equal(r, -ST_E_VERSION);
	assert_non_null(strstr(diag.msg, "layout version"));
	v.shm->layout_version = ver;
	/* the pool's own magic */
	pmagic = v.hdr->magic;
	v.hdr->magic = 0;
	r = es_client_open(H.run_dir, H.inst, "bad", ES_H_TIMEOUT_MS, &c, &diag);
	assert_int_equal(r, -ST_E_BADMAGIC);
	assert_non_null(strstr(diag.msg, "pool magic"));
	v.hdr->magic = pmagic;
	/* geometry that contradicts the segment size */
	v.hdr->n_slots += 1;
	r = es_client_open(H.run_dir, H.inst, "bad", ES_H_TIMEOUT_MS, &c, &diag);
	assert_int_equal(r, -ST_E_FORMAT);
	v.hdr->n_slots -= 1;
	/* restored: attaches; the refused opens left no client behind */
	c = NULL;
	r = es_client_open(H.run_dir, H.inst, "good", ES_H_TIMEOUT_MS, &c,
			   &diag);
	assert_int_equal(r, 0);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_int_equal(s.n_clients, 1);
	es_client_close(c);
	st_shm_detach(&shm);
	/* no expertd at all: a clear PEERGONE */
	assert_int_equal(es_h_stop(&H), 0);
	r = es_client_open(H.run_dir, H.inst, "none", 500, &c, &diag);
	assert_int_equal(r, -ST_E_PEERGONE);
	assert_non_null(strstr(diag.msg, "expertd"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_acquire_bytes, test_teardown),
		cmocka_unit_test_teardown(test_eviction_cycle, test_teardown),
		cmocka_unit_test_teardown(test_p12_two_slots, test_teardown),
		cmocka_unit_test_teardown(test_stress_threads, test_teardown),
		cmocka_unit_test_teardown(test_malformed, test_teardown),
		cmocka_unit_test_teardown(test_p16_limits, test_teardown),
		cmocka_unit_test_teardown(test_p16_exact_limit, test_teardown),
		cmocka_unit_test_teardown(test_bad_shm_header, test_teardown),
		cmocka_unit_test_teardown(test_acquire_replay, test_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
