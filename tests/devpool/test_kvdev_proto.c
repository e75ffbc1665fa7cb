/*
 * test_kvdev_proto.c — the CPU-side rules of device KV pages (issue 10)
 * without a GPU: the devkv key of (page, generation) round-trips and
 * differs for every other generation; the dirty range of a slot merges
 * marks into their hull, raises the slot's byte count, refuses empty or
 * out-of-range spans, and is taken whole (clean until marked again); a
 * marker thread
 * racing an importer that copies back and clears never loses a marked
 * byte; KV_MSG_SEQ_DEVICE requests and replies decode what they encode,
 * refuse each malformed field, and a mutation fuzzer never gets a
 * non-canonical payload accepted.
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

#include "kv_devpage.h"
#include "st_devpool.h"
#include "st_proto.h"
#include "st_util.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static struct st_devslot_table *table_new(uint32_t n)
{
	struct st_devslot_table *t = calloc(1, st_devslot_table_bytes(n));

	assert_non_null(t);
	st_devslot_table_reset(t, 7, n, n, 4096, 0);
	return t;
}

static void test_key(void **state)
{
	uint32_t page, gen;

	(void)state;
	for (int i = 0; i < 1000; i++) {
		uint32_t p = (uint32_t)(rnd() % KV_MAX_PAGES);
		uint32_t g = (uint32_t)rnd();
		uint64_t k = st_devkv_key(p, g);

		assert_true(k != 0);
		st_devkv_key_split(k, &page, &gen);
		assert_int_equal(page, p);
		assert_int_equal(gen, g);
		/* a page allocated again never matches its old copy */
		assert_true(st_devkv_key(p, g + 1) != k);
		assert_true(st_devkv_key(p + 1, g) != k);
	}
	assert_true(st_devkv_key(0, 0) == 1);
}

static void test_dirty(void **state)
{
	struct st_devslot_table *t = table_new(4);
	uint64_t lo, hi;

	(void)state;
	assert_int_equal(st_devslot_dirty_take(t, 1, &lo, &hi), 0);
	assert_int_equal(st_devslot_dirty_mark(t, 1, 100, 200), 0);
	assert_int_equal(atomic_load(&t->slot[1].bytes), 200);
	/* merged into the hull, bytes raised to the highest end */
	assert_int_equal(st_devslot_dirty_mark(t, 1, 50, 60), 0);
	assert_int_equal(st_devslot_dirty_mark(t, 1, 300, 400), 0);
	assert_int_equal(atomic_load(&t->slot[1].bytes), 400);
	/* a lower mark does not lower the bytes */
	assert_int_equal(st_devslot_dirty_mark(t, 1, 120, 130), 0);
	assert_int_equal(atomic_load(&t->slot[1].bytes), 400);
	assert_int_equal(st_devslot_dirty_take(t, 1, &lo, &hi), 1);
	assert_int_equal(lo, 50);
	assert_int_equal(hi, 400);
	/* taken: clean until marked again */
	assert_int_equal(st_devslot_dirty_take(t, 1, &lo, &hi), 0);
	assert_int_equal(st_devslot_dirty_mark(t, 1, 0, 10), 0);
	assert_int_equal(st_devslot_dirty_take(t, 1, &lo, &hi), 1);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 10);
	/* refusals: empty, reversed, past 4 GiB, no such slot */
	assert_int_equal(st_devslot_dirty_mark(t, 1, 5, 5), -EINVAL);
	assert_int_equal(st_devslot_dirty_mark(t, 1, 6, 5), -EINVAL);
	assert_int_equal(st_devslot_dirty_mark(t, 1, 0, 1ull << 32), -EINVAL);
	assert_int_equal(st_devslot_dirty_mark(t, 4, 0, 1), -EINVAL);
	assert_int_equal(st_devslot_dirty_take(t, 4, &lo, &hi), 0);
	/* other slots untouched, a reset clears everything */
	assert_int_equal(atomic_load(&t->slot[0].dirty), 0);
	assert_int_equal(st_devslot_dirty_mark(t, 2, 1, 2), 0);
	st_devslot_table_reset(t, 8, 4, 4, 4096, 0);
	assert_int_equal(atomic_load(&t->slot[2].dirty), 0);
	assert_int_equal(atomic_load(&t->slot[1].bytes), 0);
	free(t);
}

/* --- the dirty race: a marker writes bytes into a "device" page and
 * marks them, an importer copies the marked range to a "host" page and
 * clears; at the end every byte the marker wrote is on the host --- */
#define DBYTES 4096
struct drace {
	struct st_devslot_table *t;
	uint8_t dev[DBYTES], host[DBYTES];
	_Atomic int stop;
	_Atomic long marks;
};

static void *marker(void *arg)
{
	struct drace *r = arg;
	uint64_t x = 0x9e3779b97f4a7c15ull;

	for (long i = 0; !atomic_load(&r->stop); i++) {
		uint32_t lo, n;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		lo = (uint32_t)(x % DBYTES);
		n = 1 + (uint32_t)((x >> 20) % 64);
		if (lo + n > DBYTES)
			n = DBYTES - lo;
		for (uint32_t k = 0; k < n; k++)
			__atomic_store_n(&r->dev[lo + k],
					 (uint8_t)(i * 7 + k + 1),
					 __ATOMIC_RELAXED);
		/* written, then marked (the stream finished the writes) */
		assert_int_equal(st_devslot_dirty_mark(r->t, 0, lo, lo + n), 0);
		atomic_fetch_add(&r->marks, 1);
		if (i % 256 == 0)
			sched_yield(); /* 2 shared cores: let the taker in */
	}
	return NULL;
}

static void copy_back(struct drace *r, long *copies)
{
	uint64_t lo, hi;

	while (st_devslot_dirty_take(r->t, 0, &lo, &hi)) {
		for (uint64_t k = lo; k < hi; k++)
			r->host[k] = __atomic_load_n(&r->dev[k],
						     __ATOMIC_RELAXED);
		(*copies)++;
	}
}

static void test_dirty_race(void **state)
{
	struct drace *r = calloc(1, sizeof(*r));
	pthread_t th;
	long copies = 0;

	(void)state;
	assert_non_null(r);
	r->t = table_new(1);
	assert_int_equal(pthread_create(&th, NULL, marker, r), 0);
	/* until both sides did enough (bounded: 20 s) */
	uint64_t end = st_now_ns() + 20000000000ull;

	while ((copies < 2000 || atomic_load(&r->marks) < 100000) &&
	       st_now_ns() < end)
		copy_back(r, &copies);
	atomic_store(&r->stop, 1);
	pthread_join(th, NULL);
	copy_back(r, &copies);
	printf("dirty race: %ld marks, %ld copies back\n",
	       atomic_load(&r->marks), copies);
	assert_memory_equal(r->host, r->dev, DBYTES);
	assert_true(copies >= 2000 && atomic_load(&r->marks) >= 100000);
	free(r->t);
	free(r);
}

/* --- KV_MSG_SEQ_DEVICE --- */

static void test_req_codec(void **state)
{
	struct kv_reserve_entry e[3] = { { 5, 40 }, { 0x100007, 0 },
					 { 9, 1u << 30 } }, *d;
	struct st_diag diag = { 0 };
	struct st_wbuf w;
	uint32_t n;

	(void)state;
	st_wbuf_init(&w);
	kv_devpage_encode_req(&w, 3, e);
	assert_int_equal(w.len, 4 + 3 * 8);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len, &n, &d, &diag),
			 0);
	assert_int_equal(n, 3);
	assert_memory_equal(d, e, sizeof(e));
	free(d);
	/* short, long, truncated entry, empty, sequence 0, too many */
	assert_int_equal(kv_devpage_decode_req(w.data, 3, &n, &d, &diag),
			 -ST_E_PROTO);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len - 1, &n, &d,
					       &diag), -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "SEQ_DEVICE"));
	st_wbuf_u32(&w, 1);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len, &n, &d, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	kv_devpage_encode_req(&w, 0, e);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len, &n, &d, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	e[1].seq = 0;
	st_wbuf_init(&w);
	kv_devpage_encode_req(&w, 3, e);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len, &n, &d, &diag),
			 -ST_E_PROTO);
	assert_non_null(strstr(diag.msg, "entry 1"));
	st_wbuf_fini(&w);
	st_wbuf_init(&w);
	st_wbuf_u32(&w, KV_PROTO_MAX_RESERVE + 1);
	assert_int_equal(kv_devpage_decode_req(w.data, w.len, &n, &d, &diag),
			 -ST_E_LIMIT);
	st_wbuf_fini(&w);
	assert_null(d);
}

static void test_rep_codec(void **state)
{
	struct kv_devpage v[3] = {
		{ 12, 3, st_devkv_key(12, 9) },
		{ KV_PAGE_NONE, KV_DEVPAGE_NO_SLOT, 0 },
		{ 40, KV_DEVPAGE_NO_SLOT, 0 },
	}, out[3];
	struct st_diag diag = { 0 };
	struct st_wbuf w;
	uint64_t ep;

	(void)state;
	st_wbuf_init(&w);
	kv_devpage_encode_rep(&w, 77, 3, v);
	assert_int_equal(w.len, 12 + 3 * 16);
	assert_int_equal(kv_devpage_decode_rep(w.data, w.len, 3, &ep, out,
					       &diag), 0);
	assert_int_equal(ep, 77);
	assert_memory_equal(out, v, sizeof(v));
	/* another count than asked for, a short payload */
	assert_int_equal(kv_devpage_decode_rep(w.data, w.len, 2, &ep, out,
					       &diag), -ST_E_PROTO);
	assert_int_equal(kv_devpage_decode_rep(w.data, w.len - 16, 3, &ep,
					       out, &diag), -ST_E_PROTO);
	assert_int_equal(kv_devpage_decode_rep(w.data, 5, 0, &ep, out, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
	/* epoch 0; a slot without a key; no slot with a key; a slot of a
	 * page that is no page */
	for (int m = 0; m < 4; m++) {
		struct kv_devpage b[3];
		uint64_t epoch = m == 0 ? 0 : 77;

		memcpy(b, v, sizeof(b));
		if (m == 1)
			b[0].key = 0;
		if (m == 2)
			b[1].key = 5;
		if (m == 3)
			b[0].page = KV_PAGE_NONE;
		st_wbuf_init(&w);
		kv_devpage_encode_rep(&w, epoch, 3, b);
		assert_int_equal(kv_devpage_decode_rep(w.data, w.len, 3, &ep,
						       out, &diag),
				 -ST_E_PROTO);
		st_wbuf_fini(&w);
	}
}

/* Mutations of a valid request and reply: what decodes re-encodes to the
 * same bytes and keeps every documented rule. */
static void test_fuzz(void **state)
{
	struct kv_reserve_entry e[4] = { { 1, 10 }, { 2, 20 }, { 3, 0 },
					 { 4, 99 } }, *d;
	struct kv_devpage v[4] = {
		{ 1, 0, st_devkv_key(1, 1) }, { 2, 1, st_devkv_key(2, 5) },
		{ KV_PAGE_NONE, KV_DEVPAGE_NO_SLOT, 0 },
		{ 9, 11, st_devkv_key(9, 2) } }, out[4];
	struct st_wbuf rq, rp, re;
	struct st_diag diag = { 0 };
	uint8_t buf[256];
	int acc[2] = { 0, 0 }, ref[2] = { 0, 0 };

	(void)state;
	st_wbuf_init(&rq);
	st_wbuf_init(&rp);
	kv_devpage_encode_req(&rq, 4, e);
	kv_devpage_encode_rep(&rp, 123, 4, v);
	for (int it = 0; it < 200000; it++) {
		int which = it & 1;
		const struct st_wbuf *w = which ? &rp : &rq;
		size_t len = w->len, nm = 1 + rnd() % 3;
		uint32_t n;
		uint64_t ep;

		memcpy(buf, w->data, w->len);
		for (size_t k = 0; k < nm; k++) {
			size_t at = rnd() % len;

			switch (rnd() % 4) {
			case 0: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
			case 1: buf[at] = (uint8_t)rnd(); break;
			case 2: len = 1 + rnd() % w->len; break;
			default:
				if (len + 16 <= sizeof(buf)) {
					memset(buf + len, (int)rnd(), 16);
					len += 16;
				}
			}
		}
		st_wbuf_init(&re);
		if (!which) {
			if (kv_devpage_decode_req(buf, len, &n, &d, &diag)) {
				ref[0]++;
				st_wbuf_fini(&re);
				continue;
			}
			acc[0]++;
			assert_true(n >= 1 && n <= KV_PROTO_MAX_RESERVE);
			for (uint32_t i = 0; i < n; i++)
				assert_true(d[i].seq != 0);
			kv_devpage_encode_req(&re, n, d);
			free(d);
		} else {
			if (kv_devpage_decode_rep(buf, len, 4, &ep, out,
						  &diag)) {
				ref[1]++;
				st_wbuf_fini(&re);
				continue;
			}
			acc[1]++;
			assert_true(ep != 0);
			for (int i = 0; i < 4; i++)
				assert_true(out[i].slot == KV_DEVPAGE_NO_SLOT ?
					    out[i].key == 0 :
					    out[i].key != 0 &&
					    out[i].page < KV_MAX_PAGES);
			kv_devpage_encode_rep(&re, ep, 4, out);
		}
		assert_int_equal(re.len, len);
		assert_memory_equal(re.data, buf, len);
		st_wbuf_fini(&re);
	}
	printf("fuzz: request %d accepted / %d refused, reply %d / %d\n",
	       acc[0], ref[0], acc[1], ref[1]);
	assert_true(acc[0] > 100 && ref[0] > 1000);
	assert_true(acc[1] > 100 && ref[1] > 1000);
	st_wbuf_fini(&rq);
	st_wbuf_fini(&rp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key),
		cmocka_unit_test(test_dirty),
		cmocka_unit_test(test_dirty_race),
		cmocka_unit_test(test_req_codec),
		cmocka_unit_test(test_rep_codec),
		cmocka_unit_test(test_fuzz),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
