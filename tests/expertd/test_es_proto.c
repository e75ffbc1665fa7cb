/*
 * test_es_proto.c — expertd's wire payloads and pool layout without any
 * daemon: every decoder accepts what the encoder writes and refuses each
 * malformed field; the layout arithmetic is checked against hand-computed
 * offsets; and the pin protocol of es_pool.h is run by racing client
 * threads against an evictor thread (the daemon's own slot functions) that
 * rewrites the slot whenever it wins it — a pinned record must never change
 * under its reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_daemon.h"
#include "es_pool.h"
#include "es_proto.h"
#include "st_util.h"

/* kjv-moe's geometry with MXFP4 records: 6 layers x 16 experts. */
static const struct es_pool_geom KJV = { 6, 16, 24, 2, 40960, 0x1234 };

static void test_layout(void **state)
{
	struct es_pool_layout l, l2;
	struct es_pool_geom g = KJV;

	assert_int_equal(es_pool_layout_compute(&g, &l), 0);
	/* 256 shm header + 768 pool header; 32 x 64-byte client entries;
	 * 96 x 4-byte index entries (384, 64-aligned); 24 x 192-byte slots
	 * end at 3456 + 4608 = 8064; the data (960 KiB, under 64 MiB) starts
	 * at the next 4 KiB page, and the total is page-rounded. */
	assert_int_equal(l.clients_offset, 1024);
	assert_int_equal(l.index_offset, 1024 + 32 * 64);
	assert_int_equal(l.slots_offset, 3072 + 384);
	assert_int_equal(l.data_offset, 8192);
	assert_int_equal(l.data_bytes, 24 * 40960);
	assert_int_equal(l.total_bytes, 8192 + 24 * 40960);
	/* a pool of 64 MiB or more gets 2 MiB alignment (huge pages) */
	{
		struct es_pool_geom big = KJV;
		struct es_pool_layout lb;

		big.n_slots = 96;
		big.record_bytes = 1u << 20; /* 96 MiB of data */
		assert_int_equal(es_pool_layout_compute(&big, &lb), 0);
		assert_int_equal(lb.data_offset, 2u << 20);
		assert_int_equal(lb.total_bytes, (2u << 20) + 96ull * (1u << 20));
	}
	assert_true(l.layout_hash != 0);
	/* the hash covers the geometry and the store */
	g.store_id++;
	assert_int_equal(es_pool_layout_compute(&g, &l2), 0);
	assert_true(l2.layout_hash != l.layout_hash);
	g = KJV;
	g.n_slots = 25;
	assert_int_equal(es_pool_layout_compute(&g, &l2), 0);
	assert_true(l2.layout_hash != l.layout_hash);
	/* impossible geometries */
	g = KJV;
	g.record_bytes = 40961;
	assert_int_equal(es_pool_layout_compute(&g, &l2), -EINVAL);
	g = KJV;
	g.n_slots = 97;
	assert_int_equal(es_pool_layout_compute(&g, &l2), -EINVAL);
	g = KJV;
	g.top_k = 17;
	assert_int_equal(es_pool_layout_compute(&g, &l2), -EINVAL);
	g = KJV;
	g.n_slots = 0;
	assert_int_equal(es_pool_layout_compute(&g, &l2), -EINVAL);
	g = KJV;
	g.record_bytes = 1ull << 60; /* n_slots * record_bytes overflows */
	assert_int_equal(es_pool_layout_compute(&g, &l2), -EINVAL);
}

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

static void test_view(void **state)
{
	struct es_pool_layout l;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	void *base = alloc_pool(&KJV, &l);
	struct es_pool_header *h;

	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0x1234, &v,
					   &diag), 0);
	assert_ptr_equal(v.data, (uint8_t *)base + l.data_offset);
	assert_int_equal(v.n_slots, 24);
	assert_int_equal(v.hdr->budget_bytes, 24 * 40960);
	for (int i = 0; i < 96; i++)
		assert_int_equal(atomic_load(&v.slot_of[i]), -1);
	for (int s = 0; s < 24; s++) {
		assert_true(atomic_load(&v.slots[s].key) == ES_KEY_NONE);
		assert_int_equal(atomic_load(&v.slots[s].state), ES_SLOT_EMPTY);
	}
	assert_ptr_equal(es_pool_record(&v, 3),
			 (uint8_t *)base + l.data_offset + 3 * 40960);
	/* wrong segment size, store, magic, geometry */
	assert_int_equal(es_pool_view_init(base, l.total_bytes - 4096, 0, &v,
					   &diag), -ST_E_FORMAT);
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0x9999, &v,
					   &diag), -ST_E_STALE);
	assert_non_null(strstr(diag.msg, "store"));
	h = (struct es_pool_header *)((uint8_t *)base + ES_POOL_HEADER_OFFSET);
	h->magic ^= 1;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0, &v, &diag),
			 -ST_E_BADMAGIC);
	h->magic ^= 1;
	h->slots_offset += 64;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0, &v, &diag),
			 -ST_E_FORMAT);
	h->slots_offset -= 64;
	h->n_layers = 0;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0, &v, &diag),
			 -ST_E_FORMAT);
	h->n_layers = 6;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 0, &v, &diag),
			 0);
	assert_int_equal(es_pool_view_init(base, 100, 0, &v, &diag),
			 -ST_E_FORMAT);
	free(base);
}

static void test_hello(void **state)
{
	struct st_wbuf w;
	struct es_hello_req q;
	struct es_hello_rep r = { es_client_id_make(3, 7), 5, 0x5eed, 4242, 1,
				  0xabc, 0xdef, 6, 16, 24, 2, 40960 }, r2;
	struct st_diag diag = { "" };

	st_wbuf_init(&w);
	es_hello_req_encode(&w, 99, ES_PROTO_VERSION, "computed", 0);
	assert_int_equal(w.len, ES_HELLO_REQ_BYTES);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag), 0);
	assert_int_equal(q.pid, 99);
	assert_string_equal(q.name, "computed");
	assert_int_equal(es_hello_req_decode(w.data, w.len - 1, &q, &diag),
			 -ST_E_PROTO);
	w.data[8 + 20] = 'x'; /* non-NUL after the name's NUL */
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 99, ES_PROTO_VERSION + 1, "x", 0);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag),
			 -ST_E_VERSION);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 0, ES_PROTO_VERSION, "x", 0);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 1, ES_PROTO_VERSION, "tab\there", 0);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	/* a name longer than 32 bytes is cut, not overflowing */
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 1, ES_PROTO_VERSION,
			    "0123456789012345678901234567890123456789", 0);
	assert_int_equal(w.len, ES_HELLO_REQ_BYTES);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag), 0);
	assert_int_equal(strlen(q.name), 32);
	st_wbuf_fini(&w);
	/* the resume form (a client back to a restarted expertd): 4 more
	 * bytes, the old id; any other length is refused */
	st_wbuf_init(&w);
	es_hello_req_encode_resume(&w, 99, ES_PROTO_VERSION, "computed", 77,
				   es_client_id_make(5, 9));
	assert_int_equal(w.len, ES_HELLO_REQ_RESUME_BYTES);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag), 0);
	assert_int_equal(q.resume_client_id, es_client_id_make(5, 9));
	assert_string_equal(q.name, "computed");
	assert_int_equal(es_hello_req_decode(w.data, w.len - 1, &q, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	es_hello_req_encode(&w, 99, ES_PROTO_VERSION, "computed", 0);
	assert_int_equal(es_hello_req_decode(w.data, w.len, &q, &diag), 0);
	assert_int_equal(q.resume_client_id, 0);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	es_hello_rep_encode(&w, &r);
	assert_int_equal(w.len, ES_HELLO_REP_BYTES);
	assert_int_equal(es_hello_rep_decode(w.data, w.len, &r2, &diag), 0);
	assert_int_equal(r2.client_id, r.client_id);
	assert_true(r2.epoch == 5 && r2.pool_id == 0x5eed &&
		    r2.store_id == 0xabc && r2.layout_hash == 0xdef &&
		    r2.record_bytes == 40960);
	assert_int_equal(r2.pid, 4242);
	assert_int_equal(r2.pool_layout, 1);
	assert_int_equal(r2.n_layers, 6);
	assert_int_equal(r2.n_experts, 16);
	assert_int_equal(r2.n_slots, 24);
	assert_int_equal(r2.top_k, 2);
	assert_int_equal(es_client_id_index(r2.client_id), 3);
	assert_int_equal(es_client_id_gen(r2.client_id), 7);
	st_wbuf_fini(&w);
	r.n_slots = 97; /* more slots than experts */
	st_wbuf_init(&w);
	es_hello_rep_encode(&w, &r);
	assert_int_equal(es_hello_rep_decode(w.data, w.len, &r2, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
}

static int acq_decode(const int *ids, int n_enc, uint32_t n_field,
		      uint32_t layer, uint32_t pid,
		      const struct es_acquire_limits *lim,
		      struct es_acquire_req *req, struct st_diag *diag)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, pid);
	st_wbuf_u32(&w, layer);
	st_wbuf_u32(&w, n_field);
	for (int i = 0; i < n_enc; i++)
		st_wbuf_u32(&w, (uint32_t)ids[i]);
	r = es_acquire_req_decode(w.data, w.len, lim, req, diag);
	st_wbuf_fini(&w);
	return r;
}

static void test_acquire(void **state)
{
	struct es_acquire_limits lim = { 6, 16, 4 };
	struct es_acquire_req req;
	struct st_diag diag = { "" };
	int ids[5] = { 15, 0, 7, 3, 7 };
	struct st_wbuf w;

	st_wbuf_init(&w);
	es_acquire_req_encode(&w, 5, 2, 4, ids);
	assert_int_equal(es_acquire_req_decode(w.data, w.len, &lim, &req,
					       &diag), 0);
	assert_int_equal(req.layer, 2);
	assert_int_equal(req.n, 4);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(es_acquire_req_expert(&req, i), ids[i]);
	st_wbuf_fini(&w);
	/* each field out of range */
	assert_int_equal(acq_decode(ids, 1, 1, 6, 5, &lim, &req, &diag),
			 -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "layer 6"));
	ids[0] = 16;
	assert_int_equal(acq_decode(ids, 1, 1, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "expert 16"));
	ids[0] = 15;
	assert_int_equal(acq_decode(ids, 5, 5, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO); /* n > n_slots */
	lim.n_slots = 8;
	assert_int_equal(acq_decode(ids, 5, 5, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO); /* 7 twice */
	assert_non_null(strstr(diag.msg, "twice"));
	assert_int_equal(acq_decode(ids, 4, 4, 0, 5, &lim, &req, &diag), 0);
	assert_int_equal(acq_decode(ids, 0, 0, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO); /* n = 0 */
	assert_int_equal(acq_decode(ids, 3, 4, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO); /* length lies */
	assert_int_equal(acq_decode(ids, 4, 3, 0, 5, &lim, &req, &diag),
			 -ST_E_PROTO);
	assert_int_equal(acq_decode(ids, 1, 0x40000001u, 0, 5, &lim, &req,
				    &diag), -ST_E_PROTO); /* 4n overflow */
	assert_int_equal(acq_decode(ids, 1, 1, 0, 0, &lim, &req, &diag),
			 -ST_E_PROTO); /* pid 0 */
	assert_int_equal(es_acquire_req_decode((const uint8_t *)"abc", 3, &lim,
					       &req, &diag), -ST_E_PROTO);
	/* many experts: the duplicate check beyond its stack table */
	{
		struct es_acquire_limits big = { 1, 5000, 5000 };
		int *many = malloc(sizeof(int) * 3000);

		for (int i = 0; i < 3000; i++)
			many[i] = 4999 - i;
		assert_int_equal(acq_decode(many, 3000, 3000, 0, 1, &big, &req,
					    &diag), 0);
		many[2999] = 4999;
		assert_int_equal(acq_decode(many, 3000, 3000, 0, 1, &big, &req,
					    &diag), -ST_E_PROTO);
		free(many);
	}
}

static void test_acquire_reply(void **state)
{
	struct es_acquire_ent in[3] = { { ES_ACQ_READY, 1, 9 },
					{ ES_ACQ_PENDING, 0, 2 },
					{ ES_ACQ_READY, 23, 1 } }, out[3];
	struct st_diag diag = { "" };
	struct st_wbuf w;

	st_wbuf_init(&w);
	es_acquire_rep_encode(&w, 3, in);
	assert_int_equal(es_acquire_rep_decode(w.data, w.len, 3, 24, out,
					       &diag), 0);
	assert_memory_equal(in, out, sizeof(in));
	assert_int_equal(es_acquire_rep_decode(w.data, w.len, 2, 24, out,
					       &diag), -ST_E_PROTO);
	assert_int_equal(es_acquire_rep_decode(w.data, w.len, 3, 23, out,
					       &diag), -ST_E_PROTO);
	w.data[4] = 7; /* status 7 */
	assert_int_equal(es_acquire_rep_decode(w.data, w.len, 3, 24, out,
					       &diag), -ST_E_PROTO);
	st_wbuf_fini(&w);
}

static void test_small_payloads(void **state)
{
	struct st_wbuf w;
	struct es_ping_rep p = { 10, 3, 1 }, p2;
	struct es_stats_rep s, s2;
	char msg[16];
	uint32_t pid;
	uint64_t epoch;

	st_wbuf_init(&w);
	es_ping_rep_encode(&w, &p);
	assert_int_equal(es_ping_rep_decode(w.data, w.len, &p2, NULL), 0);
	assert_int_equal(p2.pid, 10);
	assert_true(p2.epoch == 3);
	assert_int_equal(p2.ready, 1);
	assert_int_equal(es_ping_rep_decode(w.data, w.len - 1, &p2, NULL),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	memset(&s, 0, sizeof(s));
	s.n_slots = 1;
	s.hits = 2;
	s.checksum_failures = 3;
	s.epoch = 4;
	s.pid = 5;
	s.n_clients = 6;
	st_wbuf_init(&w);
	es_stats_rep_encode(&w, &s);
	assert_int_equal(w.len, ES_STATS_REP_BYTES);
	memset(&s2, 0xff, sizeof(s2));
	assert_int_equal(es_stats_rep_decode(w.data, w.len, &s2, NULL), 0);
	assert_true(s2.n_slots == 1 && s2.slots_used == 0 && s2.hits == 2);
	assert_true(s2.checksum_failures == 3 && s2.epoch == 4);
	assert_true(s2.load_ns == 0 && s2.budget_bytes == 0);
	assert_int_equal(s2.pid, 5);
	assert_int_equal(s2.n_clients, 6);
	assert_int_equal(es_stats_rep_decode(w.data, w.len + 0 - 4, &s2, NULL),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	es_error_encode(&w, "bad\x01thing, long message");
	assert_int_equal(es_error_decode(w.data, w.len, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "bad?thing, long"); /* cut, made printable */
	assert_int_equal(es_error_decode(w.data, w.len - 1, msg, sizeof(msg)),
			 -ST_E_PROTO);
	assert_int_equal(es_error_decode(w.data, 0, msg, sizeof(msg)), 0);
	assert_string_equal(msg, "");
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	es_event_encode(&w, 77, 9);
	assert_int_equal(es_event_decode(w.data, w.len, &pid, &epoch), 0);
	assert_int_equal(pid, 77);
	assert_true(epoch == 9);
	assert_int_equal(es_event_decode(w.data, 11, &pid, &epoch),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	assert_string_equal(es_proto_type_name(ES_MSG_ACQUIRE | ST_MSG_REPLY),
			    "ACQUIRE");
	assert_string_equal(es_proto_type_name(ST_MSG_HELLO), "HELLO");
}

/* ---- the pin protocol under a race ---- */

enum { RACE_RB = 4096 };

struct race {
	struct es_pool pool;
	_Atomic int stop;
	_Atomic uint64_t hits[2], evictions, restored;
	_Atomic uint64_t bad;
};

/* Pattern of expert e's record: every byte e + 1. */
static void *race_client(void *arg)
{
	struct race *R = arg;
	struct es_pool_view *v = &R->pool.v;
	unsigned seed = (unsigned)(uintptr_t)&seed;
	int c = (int)(rand_r(&seed) % ES_MAX_CLIENTS);

	while (!atomic_load(&R->stop)) {
		uint32_t e = (uint32_t)(rand_r(&seed) & 1), gen;
		int32_t s = es_pool_try_pin(v, c, 0, e, &gen);
		const uint8_t *rec;
		int bad = 0;

		if (s < 0)
			continue;
		rec = es_pool_record(v, (uint32_t)s);
		if (rand_r(&seed) % 4 == 0)
			sched_yield(); /* hold the pin while others run */
		for (int k = 0; k < 3; k++) /* read it a few times */
			for (int i = 0; i < RACE_RB; i += 64)
				bad |= rec[i] != e + 1;
		if (atomic_load(&v->slots[s].gen) != gen)
			bad = 1;
		atomic_fetch_add(&R->bad, (uint64_t)bad);
		atomic_fetch_add(&R->hits[e], 1);
		atomic_fetch_sub(&v->slots[s].pins[c], 1);
		/* leave the evictor a window now and then (liveness only;
		 * the safety check above does not depend on it) */
		if (rand_r(&seed) % 8 == 0)
			sched_yield();
	}
	return NULL;
}

/* The daemon's evictor: whenever it wins the slot it loads the other
 * expert into it (writing the record while LOADING), then publishes. */
static void *race_evictor(void *arg)
{
	struct race *R = arg;
	struct es_pool *p = &R->pool;

	while (!atomic_load(&R->stop)) {
		uint64_t key = atomic_load(&p->v.slots[0].key);
		uint32_t next = es_key_expert(key) ^ 1;

		uint64_t h0, t0;

		if (es_pool_slot_try_evict(p, 0) < 0) {
			atomic_fetch_add(&R->restored, 1);
			sched_yield();
			continue;
		}
		es_pool_slot_clear(p, 0);
		es_pool_slot_assign(p, 0, es_key(0, next));
		memset(es_pool_record(&p->v, 0), 0xee, RACE_RB); /* torn */
		memset(es_pool_record(&p->v, 0), (int)next + 1, RACE_RB);
		h0 = atomic_load(&R->hits[next]);
		es_pool_slot_publish(p, 0, 0);
		atomic_fetch_add(&R->evictions, 1);
		/* let the clients use the new record before taking it away
		 * again (at most 1 ms; on a machine with few cores the
		 * threads would otherwise rarely meet) */
		t0 = st_now_ns();
		while (!atomic_load(&R->stop) &&
		       atomic_load(&R->hits[next]) == h0 &&
		       st_now_ns() - t0 < 1000000)
			sched_yield();
	}
	return NULL;
}

static void test_pin_race(void **state)
{
	const struct es_pool_geom g = { 1, 2, 1, 1, RACE_RB, 1 };
	struct es_pool_layout l;
	struct race *R = calloc(1, sizeof(*R));
	void *base = alloc_pool(&g, &l);
	pthread_t th[4];

	assert_non_null(R);
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		R->pool.pidfd[c] = -1;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 1, &R->pool.v,
					   NULL), 0);
	es_pool_slot_assign(&R->pool, 0, es_key(0, 0));
	memset(es_pool_record(&R->pool.v, 0), 1, RACE_RB);
	es_pool_slot_publish(&R->pool, 0, 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&th[i], NULL, race_client, R),
				 0);
	assert_int_equal(pthread_create(&th[3], NULL, race_evictor, R), 0);
	/* Run until both experts were hit often and the slot changed hands
	 * often, or 3 s (a loaded machine). */
	for (uint64_t t0 = st_now_ns(); st_now_ns() - t0 < 3000000000ull;) {
		st_sleep_ns(20000000);
		if (atomic_load(&R->evictions) >= 2000 &&
		    atomic_load(&R->restored) >= 20 &&
		    atomic_load(&R->hits[0]) >= 1000 &&
		    atomic_load(&R->hits[1]) >= 1000)
			break;
	}
	atomic_store(&R->stop, 1);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	fprintf(stderr, "# pin race: hits %llu/%llu, evictions %llu, "
		"evictions given up %llu\n",
		(unsigned long long)R->hits[0], (unsigned long long)R->hits[1],
		(unsigned long long)R->evictions,
		(unsigned long long)R->restored);
	assert_true(R->bad == 0);
	assert_true(R->hits[0] > 10 && R->hits[1] > 10);
	assert_true(R->evictions > 20);
	assert_true(R->restored > 0); /* pins did block evictions */
	assert_true(es_slot_pin_sum(&R->pool.v.slots[0]) == 0);
	/* the seqlock version is even (stable) after all those changes */
	assert_int_equal(atomic_load(&R->pool.v.slots[0].version) & 1, 0);
	free(base);
	free(R);
}

/* The allocator's order: EMPTY, then FAILED, then the LRU unpinned READY
 * slot; pinned and LOADING slots never. */
static void test_alloc_order(void **state)
{
	const struct es_pool_geom g = { 1, 8, 4, 2, 4096, 1 };
	struct es_pool_layout l;
	struct es_pool p;
	void *base = alloc_pool(&g, &l);
	int ev, s;

	memset(&p, 0, sizeof(p));
	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		p.pidfd[c] = -1;
	assert_int_equal(es_pool_view_init(base, l.total_bytes, 1, &p.v, NULL),
			 0);
	for (uint32_t i = 0; i < 4; i++) {
		s = es_pool_alloc_slot(&p, 1, &ev);
		assert_int_equal(s, (int)i);
		assert_int_equal(ev, 0);
		es_pool_slot_assign(&p, (uint32_t)s, es_key(0, i));
	}
	/* all LOADING: nothing to give */
	assert_int_equal(es_pool_alloc_slot(&p, 1, &ev), -ST_E_BUSY);
	es_pool_slot_publish(&p, 0, 0);
	es_pool_slot_publish(&p, 1, 0);
	es_pool_slot_publish(&p, 2, -ST_E_CHECKSUM);
	es_pool_slot_publish(&p, 3, 0);
	atomic_store(&p.v.slots[0].last_use_ns, 300);
	atomic_store(&p.v.slots[1].last_use_ns, 100);
	atomic_store(&p.v.slots[3].last_use_ns, 200);
	atomic_store(&p.v.slots[1].pins[5], 1); /* LRU but pinned */
	/* FAILED first (reclaimed, unindexed) */
	s = es_pool_alloc_slot(&p, 1, &ev);
	assert_int_equal(s, 2);
	assert_int_equal(ev, 0);
	assert_int_equal(atomic_load(&p.v.slot_of[2]), -1);
	es_pool_slot_assign(&p, 2, es_key(0, 6));
	/* then the least recently used unpinned READY: 3 (1 is pinned) */
	s = es_pool_alloc_slot(&p, 1, &ev);
	assert_int_equal(s, 3);
	assert_int_equal(ev, 1);
	assert_int_equal(atomic_load(&p.v.slots[3].state), ES_SLOT_EVICTING);
	es_pool_slot_clear(&p, 3);
	assert_int_equal(atomic_load(&p.v.slot_of[3]), -1);
	es_pool_slot_assign(&p, 3, es_key(0, 7));
	s = es_pool_alloc_slot(&p, 1, &ev);
	assert_int_equal(s, 0);
	es_pool_slot_publish(&p, 0, 0); /* EVICTING back for the test */
	atomic_store(&p.v.slots[0].state, ES_SLOT_READY);
	atomic_store(&p.v.slots[0].pins[0], 2);
	/* 0 and 1 pinned, 2 and 3 loading */
	assert_int_equal(es_pool_alloc_slot(&p, 1, &ev), -ST_E_BUSY);
	assert_int_equal(atomic_load(&p.v.slots[0].state), ES_SLOT_READY);
	free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_view),
		cmocka_unit_test(test_hello),
		cmocka_unit_test(test_acquire),
		cmocka_unit_test(test_acquire_reply),
		cmocka_unit_test(test_small_payloads),
		cmocka_unit_test(test_pin_race),
		cmocka_unit_test(test_alloc_order),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
