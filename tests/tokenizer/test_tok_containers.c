/*
 * test_tok_containers.c — the tokenizer's private containers: the merge
 * candidate heap (st_tokenizer_heap.h) and byte buffers that start in the
 * caller's storage (stk_buf_init_local).
 *
 * The heap is checked against an independent reference: the same entries
 * kept in a plain array whose minimum is found by a linear scan, through
 * random appends, heapify, pushes, pops and replace-tops, with many equal
 * keys (a word's pairs often share a rank) and storage that starts on the
 * stack and moves to the heap.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "st_tokenizer_heap.h"
#include "st_tokenizer_int.h"

/* xorshift64*: a fixed pseudo-random sequence */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* The reference: an unordered array, minimum by linear scan. */
struct ref {
	uint64_t key[4096];
	int32_t id[4096];
	size_t n;
};

static void ref_add(struct ref *r, uint64_t key, int32_t id)
{
	assert_true(r->n < 4096);
	r->key[r->n] = key;
	r->id[r->n] = id;
	r->n++;
}

/* Removes the smallest key; returns it with its id in *id (the first one
 * found among equal keys: equal keys carry equal ids here). */
static uint64_t ref_pop(struct ref *r, int32_t *id)
{
	size_t m = 0;
	uint64_t k;

	assert_true(r->n > 0);
	for (size_t i = 1; i < r->n; i++)
		if (r->key[i] < r->key[m])
			m = i;
	k = r->key[m];
	*id = r->id[m];
	r->key[m] = r->key[r->n - 1];
	r->id[m] = r->id[r->n - 1];
	r->n--;
	return k;
}

/* A key with few distinct ranks (many ties) and its id (a function of the
 * key, as the merge's new id is a function of the rank). */
static uint64_t some_key(uint64_t *s, int32_t *id)
{
	uint64_t rank = rnd(s) % 23, pos = rnd(s) % 300;

	*id = (int32_t)(rank * 1000 + pos % 7);
	return rank << 32 | pos;
}

static void check_pop(struct stk_heap *h, struct ref *r)
{
	int32_t want_id;
	uint64_t want = ref_pop(r, &want_id);
	struct stk_cand got = stk_heap_pop(h);

	assert_int_equal(got.key, want);
	assert_int_equal(got.new_id, want_id);
	assert_int_equal(h->n, r->n);
}

static void test_heap_vs_reference(void **state)
{
	static struct ref r;
	struct stk_cand local[8];
	struct stk_heap h;
	uint64_t seed = 0x2545F4914F6CDD1Dull;

	(void)state;
	for (int round = 0; round < 50; round++) {
		size_t n0 = rnd(&seed) % 700;
		int32_t id;

		r.n = 0;
		stk_heap_init_local(&h, local, 8);
		/* a batch appended, then heapified (the word's first pairs) */
		for (size_t i = 0; i < n0; i++) {
			uint64_t k = some_key(&seed, &id);

			assert_int_equal(stk_heap_append(&h, k, id), 0);
			ref_add(&r, k, id);
		}
		stk_heap_make(&h);
		assert_int_equal(h.n, n0);
		/* storage moved to the heap only once outgrown */
		assert_true(n0 > 8 ? h.p != local : h.p == local);
		/* then the merge loop's mix of pops, pushes and replace-tops */
		for (int step = 0; step < 1500; step++) {
			uint64_t op = rnd(&seed) % 4, k;

			if (op == 0 || (op == 1 && r.n == 0)) {
				k = some_key(&seed, &id);
				assert_int_equal(stk_heap_push(&h, k, id), 0);
				ref_add(&r, k, id);
			} else if (op == 1) {
				/* replace-top: the smallest goes, k comes */
				int32_t want_id;
				uint64_t want = ref_pop(&r, &want_id);

				assert_int_equal(h.p[0].key, want);
				assert_int_equal(h.p[0].new_id, want_id);
				k = some_key(&seed, &id);
				stk_heap_replace_top(&h, k, id);
				ref_add(&r, k, id);
			} else if (r.n) {
				check_pop(&h, &r);
			}
			assert_int_equal(h.n, r.n);
		}
		while (r.n)
			check_pop(&h, &r);
		assert_int_equal(h.n, 0);
		stk_heap_free(&h);
		assert_null(h.p);
	}
}

/* Keys that are all equal, and keys pushed in decreasing order (each push
 * sifts to the root): the pops still come out in order. */
static void test_heap_edges(void **state)
{
	struct stk_heap h;
	uint64_t last = 0;

	(void)state;
	stk_heap_init_local(&h, NULL, 0);
	for (int i = 0; i < 100; i++)
		assert_int_equal(stk_heap_push(&h, 5ull << 32, 9), 0);
	for (int i = 0; i < 100; i++) {
		struct stk_cand c = stk_heap_pop(&h);

		assert_int_equal(c.key, 5ull << 32);
		assert_int_equal(c.new_id, 9);
	}
	for (uint64_t k = 1000; k-- > 0;)
		assert_int_equal(stk_heap_push(&h, k << 32 | (k % 3), (int32_t)k),
				 0);
	for (int i = 0; i < 1000; i++) {
		struct stk_cand c = stk_heap_pop(&h);

		assert_int_equal(c.key >> 32, (uint64_t)i);
		assert_int_equal(c.new_id, i);
		assert_true(i == 0 || c.key > last);
		last = c.key;
	}
	assert_int_equal(h.n, 0);
	stk_heap_free(&h);
}

static void test_buf_local(void **state)
{
	char storage[8];
	struct stk_buf b, z = { 0 };
	char want[64];

	(void)state;
	stk_buf_init_local(&b, storage, sizeof(storage));
	assert_ptr_equal(b.p, storage);
	/* 5 bytes + the NUL fit in 8: still the caller's storage */
	assert_int_equal(stk_buf_put(&b, "hello", 5), 0);
	assert_ptr_equal(b.p, storage);
	assert_int_equal(b.len, 5);
	assert_string_equal(b.p, "hello");
	/* 2 more need 8 with the NUL: still fits */
	assert_int_equal(stk_buf_put(&b, ", ", 2), 0);
	assert_ptr_equal(b.p, storage);
	/* outgrown: moved to the heap with what it held */
	assert_int_equal(stk_buf_put(&b, "world", 5), 0);
	assert_ptr_not_equal(b.p, storage);
	assert_int_equal(b.len, 12);
	assert_string_equal(b.p, "hello, world");
	for (int i = 0; i < 40; i++)
		assert_int_equal(stk_buf_putc(&b, (char)('a' + i % 26)), 0);
	memcpy(want, "hello, world", 12);
	for (int i = 0; i < 40; i++)
		want[12 + i] = (char)('a' + i % 26);
	assert_int_equal(b.len, 52);
	assert_memory_equal(b.p, want, 52);
	assert_int_equal(b.p[52], '\0');
	/* the storage itself was left alone after the move */
	assert_memory_equal(storage, "hello, ", 7);
	stk_buf_free(&b);
	assert_null(b.p);
	/* a zeroed buffer grows on the heap as before */
	assert_int_equal(stk_buf_put(&z, "x", 1), 0);
	assert_non_null(z.p);
	assert_null(z.local);
	assert_string_equal(z.p, "x");
	stk_buf_free(&z);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_heap_vs_reference),
		cmocka_unit_test(test_heap_edges),
		cmocka_unit_test(test_buf_local),
	};

	return cmocka_run_group_tests_name("tokenizer_containers", tests,
					   NULL, NULL);
}
