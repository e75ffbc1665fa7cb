/*
 * test_kv_pool.c — kvd's page pool logic in one process (suite unit):
 * page bookkeeping (PITFALLS P11), reference counts under threads,
 * all-or-nothing batched reservation, fork with shared full pages, adoption
 * of a pool left by a killed kvd, and the layout rules; the prefix cache
 * (hash-chain lookups, P10 page boundaries, copy-on-write, LRU eviction and
 * P11 recycling, reference counts under threads with the cache).  Spilling
 * is in test_kv_spill.c.  The pool lives in plain memory here; kvd puts the
 * same bytes in a shared segment.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "st_util.h"

struct tpool {
	struct kv_pool p;
	struct kv_layout lay;
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	void *mem;
};

/* A pool of n_streams streams of the given row sizes holding n_pages pages
 * (the budget is n_pages whole pages). */
static struct tpool *tpool_new(uint32_t n_streams, const uint32_t *row_bytes,
			       uint32_t page_rows, uint64_t n_pages,
			       uint32_t max_seqs, uint32_t max_rows)
{
	struct tpool *t = calloc(1, sizeof(*t));
	struct st_diag d;
	uint32_t max_row = 0;

	assert_non_null(t);
	for (uint32_t i = 0; i < n_streams; i++) {
		t->streams[i].row_bytes = row_bytes[i];
		t->streams[i].tokens_per_row = 1;
		max_row = ST_MAX(max_row, row_bytes[i]);
	}
	assert_int_equal(kv_layout_compute(t->streams, n_streams, page_rows,
					   n_pages * ST_ALIGN_UP(max_row *
								 page_rows,
								 64u),
					   max_seqs, max_rows, &t->lay, &d),
			 0);
	assert_int_equal(t->lay.n_pages, n_pages);
	t->mem = aligned_alloc(ST_SHM_PAGE, t->lay.total_bytes);
	assert_non_null(t->mem);
	memset(t->mem, 0, t->lay.total_bytes); /* as a new shm segment */
	assert_int_equal(kv_pool_format(&t->p, t->mem, t->lay.total_bytes,
					&t->lay, t->streams),
			 0);
	return t;
}

static void tpool_free(struct tpool *t)
{
	kv_pool_fini(&t->p);
	free(t->mem);
	free(t);
}

static uint64_t used(struct tpool *t)
{
	return atomic_load(&t->p.info->counters.pages_used);
}

static uint64_t shared(struct tpool *t)
{
	return atomic_load(&t->p.info->counters.pages_shared);
}

static uint32_t refcount(struct tpool *t, uint32_t page)
{
	return atomic_load(&t->p.pages[page].refcount);
}

/* Pages of stream s of seq that are not KV_PAGE_NONE (from the table). */
static uint32_t seq_pages(struct tpool *t, uint32_t seq, uint32_t s)
{
	int idx = kv_seq_lookup(&t->p, seq);
	uint32_t n = 0;

	assert_true(idx >= 0);
	for (uint32_t pi = 0; pi < t->lay.max_pages_per_seq; pi++)
		n += kv_seq_page(&t->p, (uint32_t)idx, s, pi) != KV_PAGE_NONE;
	return n;
}

static int reserve1(struct tpool *t, uint32_t client, uint32_t seq,
		    uint32_t rows, struct st_diag *d)
{
	struct kv_reserve_entry e = { seq, rows };

	return kv_seq_reserve(&t->p, client, 1, &e, d);
}

/* ---- P11: pages per row count ------------------------------------------ */

/* Pooled rows (tokens_per_row T): walking the tokens one by one, a row
 * completes at every T-th token, in the page of that token; its slot is
 * the rows already completed in that page.  The helpers must agree, every
 * page must hold at most kv_stream_page_capacity rows, and the bytes used
 * of a page after n tokens are the rows completed in it so far. */
static void test_pooled_rows(void **state)
{
	(void)state;
	for (uint32_t T = 1; T <= 20; T++)
		for (uint32_t B = 1; B <= 9; B++) {
			struct kv_stream_decl s = { 12, T, 0, 0 };
			uint32_t row = 0, in_page[64] = { 0 }, most = 0;

			for (uint32_t t = 0; t < 64 * B / 2 && t < 300; t++) {
				uint32_t pg = t / B;

				for (uint32_t p = 0; p <= pg; p++)
					assert_int_equal(
						kv_stream_page_used(&s, B, p, t),
						(uint64_t)in_page[p] * 12);
				if ((t + 1) % T)
					continue;
				assert_int_equal(kv_stream_row_page(&s, B, row),
						 pg);
				assert_int_equal(kv_stream_row_slot(&s, B, row),
						 in_page[pg]);
				in_page[pg]++;
				most = in_page[pg] > most ? in_page[pg] : most;
				row++;
			}
			assert_true(most <= kv_stream_page_capacity(&s, B));
			if (T <= B)
				assert_int_equal(most,
						 kv_stream_page_capacity(&s, B));
		}
	/* 8 tokens in pages of 4 with a row per 4 tokens: row 0 in page 0,
	 * row 1 in page 1; with 16 per row, row 0 waits for page 3 */
	{
		struct kv_stream_decl s4 = { 8, 4, 0, 0 }, s16 = { 8, 16, 0, 0 };

		assert_int_equal(kv_stream_row_page(&s4, 4, 1), 1);
		assert_int_equal(kv_stream_row_page(&s16, 4, 0), 3);
		assert_int_equal(kv_stream_page_used(&s16, 4, 3, 15), 0);
		assert_int_equal(kv_stream_page_used(&s16, 4, 3, 16), 8);
	}
}

static void test_page_arithmetic(void **state)
{
	(void)state;
	/* independent count: the distinct values of r / B for r < n, and
	 * the rows of the last one */
	for (uint32_t B = 1; B <= 9; B++)
		for (uint32_t n = 0; n <= 40; n++) {
			uint32_t pages = 0, last = 0, prev = UINT32_MAX;

			for (uint32_t r = 0; r < n; r++) {
				if (r / B != prev) {
					pages++;
					last = 0;
					prev = r / B;
				}
				last++;
			}
			assert_int_equal(kv_pages_for_rows(n, B), pages);
			assert_int_equal(kv_last_page_rows(n, B), last);
		}
	/* the pitfall's own numbers */
	assert_int_equal(kv_pages_for_rows(8, 4), 2);
	assert_int_equal(kv_last_page_rows(8, 4), 4);
	assert_int_equal(kv_pages_for_rows(9, 4), 3);
	assert_int_equal(kv_last_page_rows(9, 4), 1);
	assert_int_equal(kv_pages_for_rows(0, 4), 0);
	assert_int_equal(kv_last_page_rows(0, 4), 0);
	assert_int_equal(kv_pages_for_rows(UINT32_MAX, 1), UINT32_MAX);
}

static void test_p11_bookkeeping(void **state)
{
	const uint32_t rb[2] = { 16, 8 };
	struct tpool *t = tpool_new(2, rb, 4, 32, 8, 64);
	uint32_t a, b, c, pa[2][2];
	struct st_diag d;
	int idx;

	(void)state;
	assert_int_equal(kv_seq_create(&t->p, 1, 100, 0, 0, &a, &d), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 100, 0, 0, &b, &d), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 100, 0, 0, &c, &d), 0);
	assert_int_not_equal(a, 0);
	assert_int_equal(atomic_load(&t->p.info->counters.n_seqs), 3);

	assert_int_equal(reserve1(t, 1, a, 8, &d), 0);
	assert_int_equal(reserve1(t, 1, b, 9, &d), 0);
	assert_int_equal(reserve1(t, 1, c, 0, &d), 0);
	for (uint32_t s = 0; s < 2; s++) {
		assert_int_equal(seq_pages(t, a, s), 2);
		assert_int_equal(seq_pages(t, b, s), 3);
		assert_int_equal(seq_pages(t, c, s), 0);
	}
	assert_int_equal(used(t), 2 * 2 + 3 * 2);
	assert_int_equal(kv_pool_free_pages(&t->p), 32 - 10);

	/* reserving what is already there takes nothing */
	assert_int_equal(reserve1(t, 1, a, 5, &d), 0);
	assert_int_equal(reserve1(t, 1, a, 8, &d), 0);
	assert_int_equal(used(t), 10);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(a)].n_rows), 8);

	/* alloc then free: refcount back to 0, pages back on the free list */
	idx = kv_seq_lookup(&t->p, a);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t pi = 0; pi < 2; pi++) {
			pa[s][pi] = kv_seq_page(&t->p, (uint32_t)idx, s, pi);
			assert_int_equal(refcount(t, pa[s][pi]), 1);
			assert_int_equal(t->p.pages[pa[s][pi]].stream, s);
		}
	assert_int_equal(kv_seq_free(&t->p, 1, a, &d), 0);
	assert_int_equal(kv_seq_lookup(&t->p, a), -ST_E_NOTFOUND);
	assert_int_equal(kv_seq_free(&t->p, 1, a, &d), -ST_E_NOTFOUND);
	assert_int_equal(used(t), 6);
	assert_int_equal(kv_pool_free_pages(&t->p), 32 - 6);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t pi = 0; pi < 2; pi++) {
			uint32_t pg = pa[s][pi];
			int on_list = 0;

			assert_int_equal(refcount(t, pg), 0);
			assert_int_equal(atomic_load(&t->p.pages[pg].state),
					 KV_PAGE_FREE);
			for (uint64_t i = 0; i < t->p.n_free; i++)
				on_list += t->p.free_pages[i] == pg;
			assert_int_equal(on_list, 1);
			/* a second release never takes it to -1 */
			assert_int_equal(kv_page_unref(&t->p, pg),
					 -ST_E_STALE);
			assert_int_equal(refcount(t, pg), 0);
			assert_int_equal(kv_page_ref(&t->p, pg), -ST_E_STALE);
		}
	assert_int_equal(kv_pool_free_pages(&t->p), 32 - 6);
	assert_int_equal(kv_page_unref(&t->p, 32), -EINVAL);

	/* handles: stale after free, another client's -> EPERM */
	assert_int_equal(kv_seq_create(&t->p, 1, 100, 0, 0, &a, &d), 0);
	assert_int_equal(reserve1(t, 2, a, 4, &d), -EPERM);
	assert_int_equal(kv_seq_free(&t->p, 2, a, &d), -EPERM);
	assert_int_equal(reserve1(t, 1, a, 65, &d), -ST_E_LIMIT);
	assert_int_equal(kv_seq_free_client(&t->p, 1), 3);
	assert_int_equal(used(t), 0);
	assert_int_equal(kv_pool_free_pages(&t->p), 32);
	assert_int_equal(atomic_load(&t->p.info->counters.n_seqs), 0);
	assert_int_equal(atomic_load(&t->p.info->counters.pages_peak), 10);
	tpool_free(t);
}

/* A handle's generation changes on reuse, never to 0. */
static void test_seq_generations(void **state)
{
	const uint32_t rb[1] = { 64 };
	struct tpool *t = tpool_new(1, rb, 4, 4, 1, 16);
	uint32_t prev = 0, s;
	struct st_diag d;

	(void)state;
	for (int i = 0; i < 5000; i++) {
		assert_int_equal(kv_seq_create(&t->p, 1, 1, 0, 0, &s, &d), 0);
		assert_int_not_equal(s, 0);
		assert_int_not_equal(kv_seq_gen(s), 0);
		assert_int_not_equal(s, prev);
		if (prev)
			assert_int_equal(kv_seq_lookup(&t->p, prev),
					 -ST_E_NOTFOUND);
		prev = s;
		assert_int_equal(kv_seq_free(&t->p, 1, s, &d), 0);
	}
	/* max_seqs 1: a second live sequence is refused */
	assert_int_equal(kv_seq_create(&t->p, 1, 1, 0, 0, &s, &d), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 1, 0, 0, &prev, &d),
			 -ST_E_LIMIT);
	assert_non_null(strstr(d.msg, "--max-seqs"));
	/* the same request id with dedupe gives the same sequence */
	assert_int_equal(kv_seq_free(&t->p, 1, s, &d), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 1, 77, 0, &s, &d), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 1, 77, 1, &prev, &d), 0);
	assert_int_equal(prev, s);
	tpool_free(t);
}

/* ---- reference counts under threads ------------------------------------ */

struct ref_arg {
	struct tpool *t;
	const uint32_t *pages;
	uint32_t n_pages;
	uint32_t seed;
	int iters;
	int errors;
	int freed_to_zero; /* unref calls that returned 0 */
	int stale;         /* unref calls refused at 0 */
};

static uint32_t lcg(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

/* ref + unref pairs on pages the main thread holds one reference to. */
static void *ref_worker(void *v)
{
	struct ref_arg *a = v;

	for (int i = 0; i < a->iters; i++) {
		uint32_t pg = a->pages[lcg(&a->seed) % a->n_pages];

		if (kv_page_ref(&a->t->p, pg) < 2)
			a->errors++;
		if (kv_page_unref(&a->t->p, pg) < 1)
			a->errors++;
	}
	return NULL;
}

/* alloc, ref, unref, unref: each page of each round ends free. */
static void *churn_worker(void *v)
{
	struct ref_arg *a = v;

	for (int i = 0; i < a->iters; i++) {
		uint32_t pg;
		int r = kv_page_alloc(&a->t->p, 0, &pg);

		if (r == -ST_E_BUDGET)
			continue;
		if (r < 0 || kv_page_ref(&a->t->p, pg) != 2 ||
		    kv_page_unref(&a->t->p, pg) != 1 ||
		    kv_page_unref(&a->t->p, pg) != 0)
			a->errors++;
	}
	return NULL;
}

/* everyone drops "the last" reference of the same page at once */
static void *race_unref_worker(void *v)
{
	struct ref_arg *a = v;
	int r = kv_page_unref(&a->t->p, a->pages[0]);

	if (r == 0)
		a->freed_to_zero++;
	else if (r == -ST_E_STALE)
		a->stale++;
	else
		a->errors++;
	return NULL;
}

static void test_refcount_threads(void **state)
{
	enum { T = 8 };
	const uint32_t rb[1] = { 64 };
	struct tpool *t = tpool_new(1, rb, 4, 64, 4, 64);
	struct ref_arg args[T];
	pthread_t th[T];
	uint32_t held[16];

	(void)state;
	for (int i = 0; i < 16; i++)
		assert_int_equal(kv_page_alloc(&t->p, 0, &held[i]), 0);
	/* 1: concurrent ref/unref pairs on 16 held pages */
	for (int i = 0; i < T; i++) {
		args[i] = (struct ref_arg){ .t = t, .pages = held,
					    .n_pages = 16, .seed = 7u + i,
					    .iters = 50000 };
		pthread_create(&th[i], NULL, ref_worker, &args[i]);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(args[i].errors, 0);
	}
	for (int i = 0; i < 16; i++)
		assert_int_equal(refcount(t, held[i]), 1);
	assert_int_equal(shared(t), 0);
	assert_int_equal(used(t), 16);

	/* 2: allocation churn on the other 48 pages */
	for (int i = 0; i < T; i++) {
		args[i] = (struct ref_arg){ .t = t, .iters = 20000 };
		pthread_create(&th[i], NULL, churn_worker, &args[i]);
	}
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(args[i].errors, 0);
	}
	assert_int_equal(used(t), 16);
	assert_int_equal(kv_pool_free_pages(&t->p), 48);
	assert_int_equal(shared(t), 0);

	/* 3: T threads drop the single reference of one page: exactly one
	 * takes it to 0, the others are refused; it never goes to -1 */
	for (int round = 0; round < 16; round++) {
		uint32_t pg = held[round];

		for (int i = 0; i < T; i++) {
			args[i] = (struct ref_arg){ .t = t, .pages = &held[round] };
			pthread_create(&th[i], NULL, race_unref_worker,
				       &args[i]);
		}
		int zero = 0, stale = 0;

		for (int i = 0; i < T; i++) {
			pthread_join(th[i], NULL);
			assert_int_equal(args[i].errors, 0);
			zero += args[i].freed_to_zero;
			stale += args[i].stale;
		}
		assert_int_equal(zero, 1);
		assert_int_equal(stale, T - 1);
		assert_int_equal(refcount(t, pg), 0);
	}
	assert_int_equal(used(t), 0);
	assert_int_equal(kv_pool_free_pages(&t->p), 64);
	/* no page appears twice on the free list */
	for (uint64_t i = 0; i < t->p.n_free; i++)
		for (uint64_t j = i + 1; j < t->p.n_free; j++)
			assert_int_not_equal(t->p.free_pages[i],
					     t->p.free_pages[j]);
	tpool_free(t);
}

/* ---- reservation: all or nothing --------------------------------------- */

static void test_reserve_all_or_nothing(void **state)
{
	const uint32_t rb[2] = { 32, 32 };
	struct tpool *t = tpool_new(2, rb, 4, 10, 8, 64);
	struct kv_reserve_entry e[3];
	uint32_t s1, s2, s3;
	struct st_diag d;

	(void)state;
	kv_seq_create(&t->p, 1, 1, 0, 0, &s1, &d);
	kv_seq_create(&t->p, 1, 1, 0, 0, &s2, &d);
	kv_seq_create(&t->p, 1, 1, 0, 0, &s3, &d);
	assert_int_equal(reserve1(t, 1, s1, 8, &d), 0); /* 4 pages */
	assert_int_equal(kv_pool_free_pages(&t->p), 6);
	/* 8 pages asked, 6 free: nothing of the batch stays */
	e[0] = (struct kv_reserve_entry){ s2, 8 };
	e[1] = (struct kv_reserve_entry){ s3, 5 };
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_seq_reserve(&t->p, 1, 2, e, &d), -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "--budget"));
	assert_non_null(strstr(d.msg, "8 more pages"));
	assert_int_equal(kv_pool_free_pages(&t->p), 6);
	assert_int_equal(seq_pages(t, s2, 0), 0);
	assert_int_equal(seq_pages(t, s3, 1), 0);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(s2)].n_rows), 0);
	assert_int_equal(seq_pages(t, s1, 0), 2);
	/* a bad entry after a good one: nothing changes either */
	e[0] = (struct kv_reserve_entry){ s2, 4 };
	e[1] = (struct kv_reserve_entry){ s3 ^ (1u << 25), 4 };
	assert_int_equal(kv_seq_reserve(&t->p, 1, 2, e, &d), -ST_E_NOTFOUND);
	assert_int_equal(kv_pool_free_pages(&t->p), 6);
	assert_int_equal(seq_pages(t, s2, 0), 0);
	/* duplicates take the largest: 3 pages per stream */
	e[0] = (struct kv_reserve_entry){ s2, 4 };
	e[1] = (struct kv_reserve_entry){ s2, 12 };
	e[2] = (struct kv_reserve_entry){ s2, 7 };
	assert_int_equal(kv_seq_reserve(&t->p, 1, 3, e, &d), 0);
	assert_int_equal(seq_pages(t, s2, 1), 3);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(s2)].n_rows), 12);
	assert_int_equal(kv_pool_free_pages(&t->p), 0);
	/* freeing makes room again */
	assert_int_equal(reserve1(t, 1, s3, 1, &d), -ST_E_BUDGET);
	assert_int_equal(kv_seq_free(&t->p, 1, s1, &d), 0);
	assert_int_equal(reserve1(t, 1, s3, 8, &d), 0);
	assert_int_equal(kv_pool_free_pages(&t->p), 0);
	tpool_free(t);
}

/* ---- fork -------------------------------------------------------------- */

static uint8_t pattern(uint32_t seq_tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(seq_tag * 131 + s * 17 + row * 7 + i);
}

static uint8_t *row_ptr(struct tpool *t, uint32_t seq, uint32_t s,
			uint32_t row)
{
	int idx = kv_seq_lookup(&t->p, seq);
	uint32_t pg = kv_seq_page(&t->p, (uint32_t)idx, s,
				  row / t->lay.page_rows);

	assert_int_not_equal(pg, KV_PAGE_NONE);
	return kv_page_data(&t->p, pg) +
	       (row % t->lay.page_rows) * t->streams[s].row_bytes;
}

static void test_fork(void **state)
{
	const uint32_t rb[2] = { 24, 40 };
	struct tpool *t = tpool_new(2, rb, 4, 40, 8, 64);
	uint32_t par, ch, ch8, ch0;
	struct st_diag d;
	int pi_, ci;

	(void)state;
	kv_seq_create(&t->p, 1, 1, 0, 0, &par, &d);
	assert_int_equal(reserve1(t, 1, par, 12, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 12; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				row_ptr(t, par, s, r)[i] = pattern(1, s, r, i);
	/* fork at 9 rows: pages 0, 1 shared, page 2 copied (row 8 only) */
	assert_int_equal(kv_seq_fork(&t->p, 2, 2, 0, 0, par, 9, &ch, &d), 0);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(ch)].n_rows), 9);
	assert_int_equal(t->p.seqs[kv_seq_index(ch)].owner_client, 2);
	pi_ = kv_seq_lookup(&t->p, par);
	ci = kv_seq_lookup(&t->p, ch);
	for (uint32_t s = 0; s < 2; s++) {
		for (uint32_t pi = 0; pi < 2; pi++) {
			uint32_t pg = kv_seq_page(&t->p, (uint32_t)ci, s, pi);

			assert_int_equal(pg, kv_seq_page(&t->p, (uint32_t)pi_,
							 s, pi));
			assert_int_equal(refcount(t, pg), 2);
		}
		assert_int_not_equal(kv_seq_page(&t->p, (uint32_t)ci, s, 2),
				     kv_seq_page(&t->p, (uint32_t)pi_, s, 2));
		assert_int_equal(kv_seq_page(&t->p, (uint32_t)ci, s, 3),
				 KV_PAGE_NONE);
		assert_memory_equal(row_ptr(t, ch, s, 8), row_ptr(t, par, s, 8),
				    rb[s]);
		/* rows 9..11 of the copy were not copied (the page is
		 * fresh: zero) */
		assert_int_equal(row_ptr(t, ch, s, 9)[0], 0);
	}
	assert_int_equal(shared(t), 4);
	assert_int_equal(used(t), 6 + 2);
	/* the child writes its row 9: the parent's row 9 is unchanged */
	memset(row_ptr(t, ch, 0, 9), 0xee, rb[0]);
	assert_int_equal(row_ptr(t, par, 0, 9)[0], pattern(1, 0, 9, 0));
	/* fork at a page boundary copies nothing; at 0 is empty */
	assert_int_equal(kv_seq_fork(&t->p, 1, 1, 0, 0, par, 8, &ch8, &d), 0);
	assert_int_equal(used(t), 8);
	assert_int_equal(refcount(t, kv_seq_page(&t->p, (uint32_t)pi_, 1, 1)),
			 3);
	assert_int_equal(kv_seq_fork(&t->p, 1, 1, 0, 0, par, 0, &ch0, &d), 0);
	assert_int_equal(seq_pages(t, ch0, 0), 0);
	assert_int_equal(kv_seq_fork(&t->p, 1, 1, 0, 0, par, 13, &ch0, &d),
			 -ST_E_LIMIT);
	assert_int_equal(kv_seq_fork(&t->p, 1, 1, 0, 0, 0x100007, 1, &ch0, &d),
			 -ST_E_NOTFOUND);
	/* the parent goes: the child keeps its rows */
	assert_int_equal(kv_seq_free(&t->p, 1, par, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 9; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(row_ptr(t, ch, s, r)[i],
						 pattern(1, s, r, i));
	assert_int_equal(kv_seq_free(&t->p, 1, ch8, &d), 0);
	assert_int_equal(kv_seq_free(&t->p, 2, ch, &d), 0);
	assert_int_equal(used(t), 0);
	assert_int_equal(shared(t), 0);
	assert_int_equal(kv_pool_free_pages(&t->p), 40);
	tpool_free(t);
}

/* ---- windowed streams ------------------------------------------------ */

/* t formatted again with stream s keeping a window of w rows (a window
 * changes no size: the same layout). */
static void tpool_window(struct tpool *t, uint32_t s, uint32_t w)
{
	kv_pool_fini(&t->p);
	t->streams[s].window_rows = w;
	memset(t->mem, 0, t->lay.total_bytes);
	assert_int_equal(kv_pool_format(&t->p, t->mem, t->lay.total_bytes,
					&t->lay, t->streams),
			 0);
}

/* Stream 0 keeps every row, stream 1 a window of 6 rows; pages of 4 rows.
 * A reservation that grows a sequence from n rows frees stream 1's pages
 * whose rows all lie before n - 6, unless shared; a fork that would need
 * freed rows is refused; adoption keeps the freed head; free gives every
 * page back. */
static void test_window(void **state)
{
	const uint32_t rb[2] = { 16, 16 };
	struct tpool *t = tpool_new(2, rb, 4, 40, 8, 64);
	struct kv_adopt_report rep;
	struct kv_pool q;
	uint32_t a, b, c, f;
	struct st_diag d;
	void *copy;

	(void)state;
	tpool_window(t, 1, 6);
	assert_int_equal(kv_window_dead_pages(&t->streams[1], 4, 6), 0);
	assert_int_equal(kv_window_dead_pages(&t->streams[1], 4, 10), 1);
	assert_int_equal(kv_window_dead_pages(&t->streams[0], 4, 60), 0);
	assert_int_equal(kv_seq_create(&t->p, 1, 11, 0, 0, &a, &d), 0);
	/* grown from 0, 4, 8, 12: rows before 12 - 6 = 6 are dead, so page
	 * 0 (rows 0..3) goes at the growth from 12, page 1 at the one from
	 * 16 */
	for (uint32_t n = 4; n <= 16; n += 4)
		assert_int_equal(reserve1(t, 1, a, n, &d), 0);
	assert_int_equal(seq_pages(t, a, 0), 4);
	assert_int_equal(seq_pages(t, a, 1), 3);
	assert_int_equal(used(t), 7);
	assert_int_equal(reserve1(t, 1, a, 24, &d), 0);
	assert_int_equal(seq_pages(t, a, 0), 6);
	assert_int_equal(seq_pages(t, a, 1), 4);
	assert_int_equal(used(t), 10);
	/* not growing frees nothing */
	assert_int_equal(reserve1(t, 1, a, 20, &d), 0);
	assert_int_equal(used(t), 10);
	/* a fork at 20 rows needs rows 14.. (pages 3..): fine, stream 1's
	 * freed head stays freed in the child; at 8 rows it would need
	 * page 0, freed */
	assert_int_equal(kv_seq_fork(&t->p, 1, 11, 0, 0, a, 20, &f, &d), 0);
	assert_int_equal(seq_pages(t, f, 1), 3);
	assert_int_equal(kv_seq_fork(&t->p, 1, 11, 0, 0, a, 8, &c, &d),
			 -ST_E_LIMIT);
	assert_non_null(strstr(d.msg, "window"));
	assert_int_equal(kv_seq_free(&t->p, 1, f, &d), 0);
	assert_int_equal(used(t), 10);
	/* a shared page out of the window stays with its other holder */
	assert_int_equal(kv_seq_create(&t->p, 1, 11, 0, 0, &b, &d), 0);
	assert_int_equal(reserve1(t, 1, b, 8, &d), 0);
	assert_int_equal(kv_seq_fork(&t->p, 1, 11, 0, 0, b, 8, &c, &d), 0);
	assert_int_equal(reserve1(t, 1, b, 16, &d), 0);
	assert_int_equal(reserve1(t, 1, b, 24, &d), 0);
	assert_int_equal(seq_pages(t, b, 1), 6);
	assert_int_equal(shared(t), 4);
	assert_int_equal(kv_seq_free(&t->p, 1, c, &d), 0);
	/* only b holds them now: freed at its next growth (from 24: rows
	 * before 18, pages 0..3) */
	assert_int_equal(reserve1(t, 1, b, 28, &d), 0);
	assert_int_equal(seq_pages(t, b, 1), 7 - 4);
	/* adoption after a kill: the freed heads are no truncation */
	copy = aligned_alloc(ST_SHM_PAGE, t->lay.total_bytes);
	assert_non_null(copy);
	memcpy(copy, t->mem, t->lay.total_bytes);
	assert_int_equal(kv_pool_adopt(&q, copy, t->lay.total_bytes, &t->lay,
				       t->streams, &rep),
			 0);
	assert_int_equal(rep.seqs_kept, 2);
	assert_int_equal(rep.seqs_truncated, 0);
	assert_int_equal(rep.entries_dropped, 0);
	assert_int_equal(atomic_load(&q.info->counters.pages_used), used(t));
	assert_int_equal(kv_seq_free(&q, 1, a, &d), 0);
	assert_int_equal(kv_seq_free(&q, 1, b, &d), 0);
	assert_int_equal(atomic_load(&q.info->counters.pages_used), 0);
	assert_int_equal(kv_pool_free_pages(&q), 40);
	kv_pool_fini(&q);
	free(copy);
	tpool_free(t);
}

/* ---- adoption ---------------------------------------------------------- */

static void test_adopt(void **state)
{
	const uint32_t rb[2] = { 16, 16 };
	struct tpool *t = tpool_new(2, rb, 4, 40, 8, 64);
	struct kv_adopt_report rep;
	struct kv_pool q;
	uint32_t a, b, c, f, stray;
	struct st_diag d;
	void *copy;
	int ia, ic, iff;

	(void)state;
	kv_seq_create(&t->p, 1, 11, 0, 0, &a, &d);
	kv_seq_create(&t->p, 2, 22, 0, 0, &b, &d);
	kv_seq_create(&t->p, 1, 11, 0, 0, &c, &d);
	reserve1(t, 1, a, 10, &d);
	reserve1(t, 2, b, 4, &d);
	reserve1(t, 1, c, 8, &d);
	for (uint32_t r = 0; r < 10; r++)
		memset(row_ptr(t, a, 1, r), (int)r + 1, 16);
	kv_seq_fork(&t->p, 2, 22, 0, 0, a, 6, &f, &d);
	/* what a kill -9 leaves: the memory (the private lists are gone) */
	copy = aligned_alloc(ST_SHM_PAGE, t->lay.total_bytes);
	memcpy(copy, t->mem, t->lay.total_bytes);
	{
		struct kv_pool_info *info =
			(void *)((uint8_t *)copy + KV_POOL_INFO_OFF);
		struct kv_seq_entry *seqs =
			(void *)((uint8_t *)copy + t->lay.seqs_off);
		struct kv_page_meta *pages =
			(void *)((uint8_t *)copy + t->lay.pages_off);
		uint32_t *table = (void *)((uint8_t *)copy + t->lay.table_off);

		/* c was being forked when kvd died */
		atomic_store(&seqs[kv_seq_index(c)].state, KV_SEQ_BUILDING);
		/* a reservation was cut after writing one table entry of b */
		stray = table[kv_table_index(&t->lay, 0, 0, 0)];
		table[kv_table_index(&t->lay, kv_seq_index(b), 0, 1)] = stray;
		/* a wrong count and a wrong counter */
		atomic_store(&pages[stray].refcount, 7);
		atomic_store(&info->counters.pages_used, 999);
	}
	assert_int_equal(kv_pool_adopt(&q, copy, t->lay.total_bytes, &t->lay,
				       t->streams, &rep),
			 0);
	assert_int_equal(rep.seqs_kept, 3);
	assert_int_equal(rep.seqs_dropped, 1);
	assert_int_equal(rep.seqs_truncated, 0);
	assert_int_equal(rep.entries_dropped, 1 + 2 * 2);
	assert_true(rep.refcounts_fixed >= 1);
	/* a: 3 pages x 2, b: 1 x 2, f: 2 x 2 of which 1 x 2 shared with a */
	assert_int_equal(atomic_load(&q.info->counters.pages_used), 6 + 2 + 2);
	assert_int_equal(atomic_load(&q.info->counters.pages_shared), 2);
	assert_int_equal(atomic_load(&q.info->counters.n_seqs), 3);
	assert_int_equal(kv_pool_free_pages(&q), 40 - 10);
	assert_int_equal(kv_seq_lookup(&q, c), -ST_E_NOTFOUND);
	ia = kv_seq_lookup(&q, a);
	iff = kv_seq_lookup(&q, f);
	ic = kv_seq_lookup(&q, b);
	assert_true(ia >= 0 && iff >= 0 && ic >= 0);
	assert_int_equal(kv_seq_page(&q, (uint32_t)ic, 0, 1), KV_PAGE_NONE);
	for (uint32_t pg = 0; pg < 40; pg++) {
		uint32_t n = 0;

		for (uint32_t i = 0; i < 8; i++)
			for (uint32_t s = 0; s < 2; s++)
				for (uint32_t pi = 0; pi < q.lay.max_pages_per_seq; pi++)
					n += kv_seq_page(&q, i, s, pi) == pg;
		assert_int_equal(atomic_load(&q.pages[pg].refcount), n);
	}
	/* the data is still there, and the pool works on */
	for (uint32_t r = 0; r < 10; r++) {
		uint32_t pg = kv_seq_page(&q, (uint32_t)ia, 1, r / 4);

		assert_int_equal(kv_page_data(&q, pg)[(r % 4) * 16], r + 1);
	}
	assert_int_equal(kv_seq_free(&q, 1, a, &d), 0);
	assert_int_equal(kv_seq_free_client(&q, 2), 2);
	assert_int_equal(kv_pool_free_pages(&q), 40);
	assert_int_equal(atomic_load(&q.info->counters.pages_used), 0);
	kv_pool_fini(&q);
	free(copy);
	tpool_free(t);
}

/* ---- layout ------------------------------------------------------------ */

static void test_layout(void **state)
{
	struct kv_stream_decl s[3] = { { 64, 1, 0, 0 }, { 100, 1, 0, 0 },
				       { 8, 1, 0, 0 } };
	struct kv_stream_decl rs[KV_MAX_STREAMS];
	struct kv_layout l, r;
	struct st_diag d;
	void *mem;

	(void)state;
	/* page_bytes = 16 rows x 100 bytes = 1600 (a multiple of 64) */
	assert_int_equal(kv_layout_compute(s, 3, 16, 1600 * 10 + 5, 4, 100, &l,
					   &d),
			 0);
	assert_int_equal(l.page_bytes, 1600);
	assert_int_equal(l.n_pages, 10);
	assert_int_equal(l.max_pages_per_seq, 3); /* min(7, 10 / 3) */
	/* 16000 bytes of pages: page-aligned (2 MiB only from 64 MiB on) */
	assert_int_equal(l.data_off % ST_SHM_PAGE, 0);
	assert_int_equal(l.total_bytes % ST_SHM_PAGE, 0);
	assert_int_equal(l.total_bytes, l.data_off + ST_ALIGN_UP(16000, ST_SHM_PAGE));
	assert_true(l.table_off >= l.seqs_off + 4 * 64);
	assert_true(l.data_off >= l.table_off + 4 * 3 * 3 * 4);
	/* rounded up to 64 bytes: 3 rows x 100 = 300 -> 320 */
	assert_int_equal(kv_layout_compute(s, 3, 3, 1 << 20, 4, 100, &r, &d), 0);
	assert_int_equal(r.page_bytes, 320);
	/* budget for 2 pages, 3 streams: names the minimum (4800 bytes) */
	assert_int_equal(kv_layout_compute(s, 3, 16, 3200, 4, 100, &r, &d),
			 -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "4800 bytes"));
	assert_non_null(strstr(d.msg, "--budget"));
	/* pooled rows: 16 tokens of 4 per row = 4 rows of 100 bytes, so
	 * the widest page is stream 0's 16 x 64 = 1024; 0 tokens per row is
	 * refused; a window is recorded (not a size change) */
	s[1].tokens_per_row = 4;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 0);
	assert_int_equal(r.page_bytes, 1024);
	s[1].tokens_per_row = 0;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "tokens per row"));
	s[1].tokens_per_row = 1;
	s[2].window_rows = 128;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 0);
	assert_int_equal(r.page_bytes, 1600);
	s[1].window_rows = 8;
	s[1].tokens_per_row = 4;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 -ST_E_UNSUPPORTED); /* a window of pooled rows */
	s[1].window_rows = 0;
	s[1].tokens_per_row = 1;
	s[2].window_rows = 0;
	s[0].flags = KV_STREAM_STATE;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 -ST_E_UNSUPPORTED);
	s[0].flags = 0;
	s[0].row_bytes = 0;
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 100, &r, &d),
			 -ST_E_CONFIG);
	s[0].row_bytes = 64;
	assert_int_equal(kv_layout_compute(s, 3, 0, 1 << 20, 4, 100, &r, &d),
			 -ST_E_CONFIG);
	assert_int_equal(kv_layout_compute(s, 0, 16, 1 << 20, 4, 100, &r, &d),
			 -ST_E_CONFIG);
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 0, 100, &r, &d),
			 -ST_E_CONFIG);
	assert_int_equal(kv_layout_compute(s, 3, 16, 1 << 20, 4, 0, &r, &d),
			 -ST_E_CONFIG);
	assert_int_equal(kv_layout_compute(s, 3, 65537, 1ull << 40, 4, 100, &r,
					   &d),
			 -ST_E_CONFIG);
	/* a page over 64 MiB: 65 rows of 1 MiB */
	s[2].row_bytes = 1u << 20;
	assert_int_equal(kv_layout_compute(s, 3, 65, 1ull << 40, 4, 100, &r,
					   &d),
			 -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "fewer rows per page"));
	s[2].row_bytes = 8;
	/* a pool's recorded layout reads back; a changed one does not */
	{
		struct kv_pool p;

		mem = aligned_alloc(ST_SHM_PAGE, l.total_bytes);
		assert_int_equal(kv_pool_format(&p, mem, l.total_bytes, &l, s),
				 0);
		kv_pool_fini(&p);
	}
	assert_int_equal(kv_layout_read(mem, l.total_bytes,
					kv_layout_hash(&l, s), &r, rs, &d),
			 0);
	assert_memory_equal(&r, &l, sizeof(l));
	assert_int_equal(rs[1].row_bytes, 100);
	assert_int_equal(kv_layout_read(mem, l.total_bytes, 12345, &r, rs, &d),
			 -ST_E_FORMAT);
	assert_int_equal(kv_layout_read(mem, l.total_bytes - ST_SHM_PAGE, 0,
					&r, rs, &d),
			 -ST_E_FORMAT);
	((struct kv_pool_info *)((uint8_t *)mem + KV_POOL_INFO_OFF))
		->layout.n_pages++;
	assert_int_equal(kv_layout_read(mem, l.total_bytes, 0, &r, rs, &d),
			 -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "does not match"));
	((struct kv_pool_info *)((uint8_t *)mem + KV_POOL_INFO_OFF))
		->layout.n_streams = 300;
	assert_int_equal(kv_layout_read(mem, l.total_bytes, 0, &r, rs, &d),
			 -ST_E_FORMAT);
	free(mem);
}

/* ---- prefix cache ------------------------------------------------------ */

#define MODEL 0x5eed0001ull

/* Token ids of prompt `tag`: distinct per (tag, position). */
static void prompt(int32_t *ids, uint32_t n, uint32_t tag)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)(tag * 100000u + i * 7u + 3u);
}

static void write_rows(struct tpool *t, uint32_t seq, uint32_t from,
		       uint32_t to, uint32_t tag)
{
	for (uint32_t s = 0; s < t->lay.n_streams; s++)
		for (uint32_t r = from; r < to; r++)
			for (uint32_t i = 0; i < t->streams[s].row_bytes; i++)
				row_ptr(t, seq, s, r)[i] = pattern(tag, s, r, i);
}

static void check_rows(struct tpool *t, uint32_t seq, uint32_t from,
		       uint32_t to, uint32_t tag)
{
	for (uint32_t s = 0; s < t->lay.n_streams; s++)
		for (uint32_t r = from; r < to; r++)
			for (uint32_t i = 0; i < t->streams[s].row_bytes; i++)
				assert_int_equal(row_ptr(t, seq, s, r)[i],
						 pattern(tag, s, r, i));
}

/* A sequence computed from n ids of prompt `tag`: created through the
 * cache, rows written (all of them, as computed would after a miss),
 * published.  Returns the sequence; *ret_cached = rows found cached. */
static uint32_t computed_seq(struct tpool *t, uint32_t n, uint32_t tag,
			     uint64_t model, uint32_t *ret_cached)
{
	int32_t ids[256];
	uint32_t seq, cached;
	struct st_diag d;

	assert_true(n <= 256);
	prompt(ids, n, tag);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, model, ids,
					      n, &seq, &cached, &d),
			 0);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(seq)].n_rows),
			 cached);
	assert_int_equal(reserve1(t, 1, seq, n, &d), 0);
	write_rows(t, seq, cached, n, tag);
	assert_true(kv_seq_publish(&t->p, 1, seq, model, ids, n, &d) >= 0);
	if (ret_cached)
		*ret_cached = cached;
	return seq;
}

static uint32_t page_of(struct tpool *t, uint32_t seq, uint32_t s,
			uint32_t pi)
{
	return kv_seq_page(&t->p, (uint32_t)kv_seq_lookup(&t->p, seq), s, pi);
}

static void test_prefix_cache(void **state)
{
	const uint32_t rb[2] = { 16, 24 }, B = 4;
	struct tpool *t = tpool_new(2, rb, B, 40, 16, 64);
	uint32_t a, b, c, cached, x;
	int32_t ids[64];
	struct st_diag d;

	(void)state;
	/* a cold cache: nothing found; 10 ids publish 2 full groups */
	a = computed_seq(t, 10, 1, MODEL, &cached);
	assert_int_equal(cached, 0);
	assert_int_equal(atomic_load(&t->p.stats.prefix_published), 2);
	assert_int_equal(t->p.cache.n_groups, 2);
	for (uint32_t s = 0; s < 2; s++) {
		assert_true(atomic_load(&t->p.pages[page_of(t, a, s, 0)].key) != 0);
		assert_int_equal(atomic_load(&t->p.pages[page_of(t, a, s, 2)].key), 0);
	}
	/* the page's key is the chain key of its ids */
	{
		uint64_t k[2];

		prompt(ids, 10, 1);
		assert_int_equal(kv_prefix_keys(ids, B, MODEL, 2, k), 0);
		assert_true(atomic_load(&t->p.pages[page_of(t, a, 1, 1)].key) ==
			    k[1]);
	}
	/* publishing again changes nothing */
	assert_int_equal(kv_seq_publish(&t->p, 1, a, MODEL, ids, 10, &d), 0);
	/* the same prompt: 2 groups mapped, the same pages, read-only */
	b = computed_seq(t, 10, 1, MODEL, &cached);
	assert_int_equal(cached, 8);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t pi = 0; pi < 2; pi++) {
			assert_int_equal(page_of(t, b, s, pi), page_of(t, a, s, pi));
			assert_int_equal(refcount(t, page_of(t, a, s, pi)), 2);
		}
	assert_int_not_equal(page_of(t, b, 0, 2), page_of(t, a, 0, 2));
	check_rows(t, b, 0, 10, 1);
	assert_int_equal(atomic_load(&t->p.stats.prefix_lookups), 2);
	assert_int_equal(atomic_load(&t->p.stats.prefix_pages_hit), 2);
	assert_int_equal(atomic_load(&t->p.stats.prefix_rows_reused), 8);

	/* P10: B-1, B, B+1, 2B, 2B+1 ids of a cached prompt */
	{
		const uint32_t n[5] = { B - 1, B, B + 1, 2 * B, 2 * B + 1 };
		const uint32_t want[5] = { 0, 0, B, B, 2 * B };

		prompt(ids, 64, 1);
		for (int i = 0; i < 5; i++) {
			assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0,
							      MODEL, ids, n[i],
							      &x, &cached, &d),
					 0);
			assert_int_equal(cached, want[i]);
			assert_int_equal(kv_seq_free(&t->p, 1, x, &d), 0);
		}
	}
	/* another model: nothing; a token changed in page 1: only page 0 */
	prompt(ids, 10, 1);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL + 1,
					      ids, 10, &x, &cached, &d),
			 0);
	assert_int_equal(cached, 0);
	kv_seq_free(&t->p, 1, x, &d);
	ids[5]++;
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL, ids,
					      10, &x, &cached, &d),
			 0);
	assert_int_equal(cached, B);
	kv_seq_free(&t->p, 1, x, &d);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, 0, ids, 10,
					      &x, &cached, &d),
			 -EINVAL);
	/* publishing other ids over mapped pages is refused page by page:
	 * nothing of b is keyed twice */
	ids[5]--;
	ids[1]++;
	assert_int_equal(kv_seq_publish(&t->p, 1, b, MODEL, ids, 10, &d), 0);
	assert_int_equal(kv_seq_publish(&t->p, 1, b, MODEL, ids, 11, &d),
			 -ST_E_LIMIT);
	assert_int_equal(kv_seq_publish(&t->p, 2, b, MODEL, ids, 10, &d),
			 -EPERM);

	/* both users go: the groups stay (idle, refcount 0, CACHED) */
	assert_int_equal(kv_seq_free(&t->p, 1, a, &d), 0);
	assert_int_equal(kv_seq_free(&t->p, 1, b, &d), 0);
	assert_int_equal(used(t), 0);
	assert_int_equal(t->p.cache.idle_pages, 4);
	assert_int_equal(kv_pool_free_pages(&t->p), 40 - 4);
	assert_int_equal(kv_pool_avail_pages(&t->p), 40);
	for (uint32_t g = 0; g < t->p.cache.n_max; g++)
		if (t->p.cache.where[g] != KV_CG_FREE)
			for (uint32_t s = 0; s < 2; s++) {
				uint32_t pg = t->p.cache.ent[g * 2 + s];

				assert_int_equal(refcount(t, pg), 0);
				assert_int_equal(atomic_load(&t->p.pages[pg].state),
						 KV_PAGE_CACHED);
			}
	/* and are found again with their rows */
	c = computed_seq(t, 9, 1, MODEL, &cached);
	assert_int_equal(cached, 8);
	check_rows(t, c, 0, 9, 1);
	assert_int_equal(t->p.cache.idle_pages, 0);
	assert_int_equal(used(t), 3 * 2);
	kv_seq_free(&t->p, 1, c, &d);
	tpool_free(t);
}

/* LRU eviction, and PITFALLS P11: a recycled cached page is not found by
 * its old key any more. */
static void test_cache_evict(void **state)
{
	const uint32_t rb[1] = { 32 }, B = 4;
	struct tpool *t = tpool_new(1, rb, B, 8, 8, 64);
	uint32_t p1, p2, p3, cached, big, old_pages[2];
	int32_t ids[16];
	struct st_diag d;

	(void)state;
	/* three prompts of 2 full pages + 1 row; freed: 6 idle pages */
	p1 = computed_seq(t, 9, 1, MODEL, NULL);
	old_pages[0] = page_of(t, p1, 0, 0);
	old_pages[1] = page_of(t, p1, 0, 1);
	kv_seq_free(&t->p, 1, p1, &d);
	p2 = computed_seq(t, 9, 2, MODEL, NULL);
	kv_seq_free(&t->p, 1, p2, &d);
	p3 = computed_seq(t, 9, 3, MODEL, NULL);
	kv_seq_free(&t->p, 1, p3, &d);
	assert_int_equal(t->p.cache.idle_pages, 6);
	assert_int_equal(kv_pool_free_pages(&t->p), 2);
	/* prompt 1 used again: now the most recently used */
	prompt(ids, 9, 1);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL, ids, 9,
					      &p1, &cached, &d),
			 0);
	assert_int_equal(cached, 8);
	kv_seq_free(&t->p, 1, p1, &d);
	/* 4 pages needed, 2 free: prompt 2's group of page 0 goes first,
	 * then its page 1 */
	kv_seq_create(&t->p, 1, 1, 0, 0, &big, &d);
	assert_int_equal(reserve1(t, 1, big, 16, &d), 0);
	assert_int_equal(atomic_load(&t->p.stats.cache_evictions), 2);
	prompt(ids, 9, 2);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL, ids, 9,
					      &p2, &cached, &d),
			 0);
	assert_int_equal(cached, 0);
	kv_seq_free(&t->p, 1, p2, &d);
	prompt(ids, 9, 3);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL, ids, 9,
					      &p3, &cached, &d),
			 0);
	assert_int_equal(cached, 8);
	kv_seq_free(&t->p, 1, p3, &d);
	/* more: prompt 3 then prompt 1 are recycled; their old pages now
	 * hold the big sequence's rows, no key, and the old prompt finds
	 * nothing */
	assert_int_equal(reserve1(t, 1, big, 32, &d), 0);
	assert_int_equal(t->p.cache.n_groups, 0);
	assert_int_equal(t->p.cache.idle_pages, 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(atomic_load(&t->p.pages[old_pages[i]].key), 0);
		assert_int_equal(t->p.cache.page_group[old_pages[i]], UINT32_MAX);
		assert_int_equal(refcount(t, old_pages[i]), 1);
	}
	write_rows(t, big, 0, 32, 9);
	prompt(ids, 9, 1);
	kv_seq_free(&t->p, 1, big, &d);
	assert_int_equal(kv_seq_create_prefix(&t->p, 1, 1, 0, 0, MODEL, ids, 9,
					      &p1, &cached, &d),
			 0);
	assert_int_equal(cached, 0);
	kv_seq_free(&t->p, 1, p1, &d);
	assert_int_equal(kv_pool_free_pages(&t->p), 8);
	tpool_free(t);
}

/* Copy-on-write: a partial last page that is shared is copied before a
 * reservation lets its sequence write into it; full shared pages are never
 * copied; the other holder keeps its bytes. */
static void test_cow(void **state)
{
	const uint32_t rb[2] = { 16, 8 }, B = 4;
	struct tpool *t = tpool_new(2, rb, B, 32, 8, 64);
	uint32_t a, x, cached, shared_pg[2], full_pg[2];
	int ia, ix;
	struct st_diag d;

	(void)state;
	kv_seq_create(&t->p, 1, 1, 0, 0, &a, &d);
	assert_int_equal(reserve1(t, 1, a, 6, &d), 0);
	write_rows(t, a, 0, 6, 4);
	/* x shares a's pages (as a fork that did not copy would): the
	 * partial page 1 is now shared */
	kv_seq_create(&t->p, 1, 1, 0, 0, &x, &d);
	ia = kv_seq_lookup(&t->p, a);
	ix = kv_seq_lookup(&t->p, x);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t pi = 0; pi < 2; pi++) {
			uint32_t pg = kv_seq_page(&t->p, (uint32_t)ia, s, pi);

			assert_true(kv_page_ref(&t->p, pg) == 2);
			kv_table_set(&t->p, (uint32_t)ix, s, pi, pg);
		}
	atomic_store(&t->p.seqs[ix].n_rows, 6);
	for (uint32_t s = 0; s < 2; s++) {
		shared_pg[s] = page_of(t, a, s, 1);
		full_pg[s] = page_of(t, a, s, 0);
	}
	/* reserving what a has already: nothing is copied */
	assert_int_equal(reserve1(t, 1, a, 6, &d), 0);
	assert_int_equal(page_of(t, a, 0, 1), shared_pg[0]);
	/* a grows into its partial page: it gets its own copy of rows 4, 5 */
	assert_int_equal(reserve1(t, 1, a, 7, &d), 0);
	for (uint32_t s = 0; s < 2; s++) {
		assert_int_not_equal(page_of(t, a, s, 1), shared_pg[s]);
		assert_int_equal(page_of(t, x, s, 1), shared_pg[s]);
		assert_int_equal(refcount(t, shared_pg[s]), 1);
		assert_int_equal(refcount(t, page_of(t, a, s, 1)), 1);
		/* the full page stays shared */
		assert_int_equal(page_of(t, a, s, 0), full_pg[s]);
		assert_int_equal(refcount(t, full_pg[s]), 2);
	}
	check_rows(t, a, 0, 6, 4);
	write_rows(t, a, 6, 7, 5);
	memset(row_ptr(t, a, 0, 5), 0xab, rb[0]);
	check_rows(t, x, 0, 6, 4); /* x never sees a's writes */
	kv_seq_free(&t->p, 1, a, &d);
	kv_seq_free(&t->p, 1, x, &d);
	assert_int_equal(used(t), 0);

	/* a sequence mapped from the cache writes after the mapped pages;
	 * the mapped ones keep their ids and bytes */
	a = computed_seq(t, 9, 6, MODEL, NULL);
	x = computed_seq(t, 9, 6, MODEL, &cached);
	assert_int_equal(cached, 8);
	for (uint32_t s = 0; s < 2; s++)
		full_pg[s] = page_of(t, x, s, 1);
	assert_int_equal(reserve1(t, 1, x, 12, &d), 0);
	write_rows(t, x, 9, 12, 7);
	for (uint32_t s = 0; s < 2; s++) {
		assert_int_equal(page_of(t, x, s, 1), full_pg[s]);
		assert_int_equal(refcount(t, full_pg[s]), 2);
	}
	check_rows(t, a, 0, 9, 6);
	kv_seq_free(&t->p, 1, a, &d);
	kv_seq_free(&t->p, 1, x, &d);
	tpool_free(t);
}

/* ---- reference counts under threads, with the cache --------------------- */

#define NKEYS 6

struct cache_arg {
	struct tpool *t;
	uint32_t seed;
	int iters;
	int errors;
	int hits;
	_Atomic int *stop;   /* users: run until set (and iters done) */
};

static uint64_t tkey(uint32_t i)
{
	return 0x1000 + i;
}

/* Looks keys up and drops what it got: pages always carry the key. */
static void *cache_user(void *v)
{
	struct cache_arg *a = v;
	struct kv_pool *p = &a->t->p;

	for (int i = 0; i < a->iters || !atomic_load(a->stop); i++) {
		uint64_t key = tkey(lcg(&a->seed) % NKEYS);
		uint32_t pages[2];
		int r = kv_cache_acquire(p, key, pages);

		if (r == 0)
			continue;
		if (r != 1) {
			a->errors++;
			continue;
		}
		a->hits++;
		for (int s = 0; s < 2; s++) {
			if (atomic_load(&p->pages[pages[s]].key) != key ||
			    atomic_load(&p->pages[pages[s]].refcount) == 0)
				a->errors++;
			if (kv_page_unref(p, pages[s]) < 0)
				a->errors++;
		}
	}
	return NULL;
}

/* Publishes groups under the keys (when absent) and lets them go idle. */
static void *cache_publisher(void *v)
{
	struct cache_arg *a = v;
	struct kv_pool *p = &a->t->p;

	for (int i = 0; i < a->iters || !atomic_load(a->stop); i++) {
		uint32_t pages[2];
		int r;

		if (kv_page_alloc(p, 0, &pages[0]) < 0)
			continue;
		if (kv_page_alloc(p, 1, &pages[1]) < 0) {
			kv_page_unref(p, pages[0]);
			continue;
		}
		r = kv_cache_publish(p, tkey(lcg(&a->seed) % NKEYS), pages);
		if (r < 0)
			a->errors++;
		/* a user may hold the group already: >= 0, never refused */
		for (int s = 0; s < 2; s++)
			if (kv_page_unref(p, pages[s]) < 0)
				a->errors++;
	}
	return NULL;
}

/* Allocation pressure: recycles idle groups (eviction). */
static void *cache_evictor(void *v)
{
	struct cache_arg *a = v;
	struct kv_pool *p = &a->t->p;

	for (int i = 0; i < a->iters || !atomic_load(a->stop); i++) {
		uint32_t held[8];
		int n = 0;

		while (n < 4 && kv_page_alloc(p, 0, &held[n]) == 0)
			n++;
		if (lcg(&a->seed) % 16 == 0)
			kv_cache_evict_lru(p);
		while (n > 0)
			if (kv_page_unref(p, held[--n]) != 0)
				a->errors++;
	}
	return NULL;
}

static void test_cache_refcount_threads(void **state)
{
	enum { T = 6 };
	const uint32_t rb[2] = { 64, 64 };
	struct tpool *t = tpool_new(2, rb, 4, 20, 4, 64);
	struct cache_arg args[T];
	pthread_t th[T];
	_Atomic int stop = 0;
	int hits = 0;

	(void)state;
	/* threads 0..2 use the cache, 3..4 publish, 5 recycles pages; all
	 * at once for 300 ms at least */
	for (int i = T; i-- > 0;) {
		args[i] = (struct cache_arg){ .t = t, .seed = 11u + 3u * i,
					      .iters = 2000, .stop = &stop };
		pthread_create(&th[i], NULL,
			       i < 3 ? cache_user :
			       i < 5 ? cache_publisher : cache_evictor,
			       &args[i]);
	}
	st_sleep_ns(300ull * 1000 * 1000);
	atomic_store(&stop, 1);
	for (int i = 0; i < T; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(args[i].errors, 0);
		hits += args[i].hits;
	}
	assert_true(hits > 0);
	assert_true(atomic_load(&t->p.stats.cache_evictions) > 0);
	/* everything let go: no reference left, none below 0, every page
	 * either free (once) or an idle page of a cached group */
	assert_int_equal(used(t), 0);
	assert_int_equal(shared(t), 0);
	assert_int_equal(t->p.n_free + t->p.cache.idle_pages, 20);
	for (uint32_t pg = 0; pg < 20; pg++) {
		uint32_t st = atomic_load(&t->p.pages[pg].state);
		int on_list = 0;

		assert_int_equal(refcount(t, pg), 0);
		for (uint64_t i = 0; i < t->p.n_free; i++)
			on_list += t->p.free_pages[i] == pg;
		if (st == KV_PAGE_FREE) {
			assert_int_equal(on_list, 1);
			assert_int_equal(t->p.cache.page_group[pg], UINT32_MAX);
		} else {
			uint32_t g = t->p.cache.page_group[pg];

			assert_int_equal(st, KV_PAGE_CACHED);
			assert_int_equal(on_list, 0);
			assert_int_not_equal(g, UINT32_MAX);
			assert_int_equal(t->p.cache.where[g], KV_CG_IDLE);
			assert_true(atomic_load(&t->p.pages[pg].key) ==
				    t->p.cache.key[g]);
		}
	}
	assert_true(t->p.cache.n_groups <= NKEYS);
	assert_int_equal(t->p.cache.idle_pages, t->p.cache.n_groups * 2);
	tpool_free(t);
}


/* ---- truncation (speculative decoding's roll-back) -------------------- */

/* A sequence of 10 rows (pages of 4) cut back to 5: pages 2 of each stream
 * freed, rows 0..4 kept, n_rows 5; a reservation grows it again with fresh
 * pages; cutting to its length is a no-op, past it -ST_E_LIMIT; another
 * client's sequence -EPERM; a cut into published rows is refused (-EPERM)
 * and one after them works, the published groups staying cached. */
static void test_truncate(void **state)
{
	const uint32_t rb[2] = { 16, 24 }, B = 4;
	struct tpool *t = tpool_new(2, rb, B, 40, 8, 64);
	uint32_t a, pub, cached;
	struct st_diag d;

	(void)state;
	kv_seq_create(&t->p, 1, 1, 0, 0, &a, &d);
	assert_int_equal(reserve1(t, 1, a, 10, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 10; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				row_ptr(t, a, s, r)[i] = pattern(3, s, r, i);
	assert_int_equal(used(t), 6);
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 5, &d), 0);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(a)].n_rows), 5);
	assert_int_equal(used(t), 4);
	for (uint32_t s = 0; s < 2; s++) {
		assert_int_equal(seq_pages(t, a, s), 2);
		for (uint32_t r = 0; r < 5; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(row_ptr(t, a, s, r)[i],
						 pattern(3, s, r, i));
	}
	/* to a page boundary: page 1 goes too */
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 4, &d), 0);
	assert_int_equal(used(t), 2);
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 4, &d), 0);
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 5, &d), -ST_E_LIMIT);
	assert_int_equal(kv_seq_truncate(&t->p, 2, a, 2, &d), -EPERM);
	assert_int_equal(kv_seq_truncate(&t->p, 1, 0x100007, 2, &d),
			 -ST_E_NOTFOUND);
	assert_int_equal(reserve1(t, 1, a, 9, &d), 0);
	assert_int_equal(used(t), 6);
	assert_int_equal(kv_seq_free(&t->p, 1, a, &d), 0);
	assert_int_equal(used(t), 0);

	/* 10 rows published as 2 groups (rows 0..7): cutting to 7 would
	 * roll back a published row; to 8 or 9 leaves the cache whole */
	pub = computed_seq(t, 10, 1, MODEL, &cached);
	assert_int_equal(t->p.cache.n_groups, 2);
	assert_int_equal(kv_seq_truncate(&t->p, 1, pub, 7, &d), -EPERM);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(pub)].n_rows),
			 10);
	assert_int_equal(kv_seq_truncate(&t->p, 1, pub, 8, &d), 0);
	assert_int_equal(seq_pages(t, pub, 0), 2);
	assert_int_equal(t->p.cache.n_groups, 2);
	assert_int_equal(kv_seq_free(&t->p, 1, pub, &d), 0);
	tpool_free(t);
}

/* A windowed stream (W 6, pages of 4) grown 4, 8, 12, 16, 24 rows: the
 * growth from 16 freed its pages 0-1 (rows before 10).  A cut to 20
 * (after the length before the last growth) keeps its window (pages 3-4)
 * and gives back page 5 of both streams; a cut to 12 would need page 1
 * (rows 6..11 of the window): refused, nothing changed. */
static void test_truncate_window(void **state)
{
	const uint32_t rb[2] = { 16, 16 };
	struct tpool *t = tpool_new(2, rb, 4, 40, 8, 64);
	uint32_t a;
	struct st_diag d;

	(void)state;
	tpool_window(t, 1, 6);
	assert_int_equal(kv_seq_create(&t->p, 1, 11, 0, 0, &a, &d), 0);
	for (uint32_t n = 4; n <= 16; n += 4)
		assert_int_equal(reserve1(t, 1, a, n, &d), 0);
	assert_int_equal(reserve1(t, 1, a, 24, &d), 0);
	assert_int_equal(seq_pages(t, a, 1), 4);
	assert_int_equal(used(t), 10);
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 12, &d), -ST_E_LIMIT);
	assert_non_null(strstr(d.msg, "window"));
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(a)].n_rows), 24);
	assert_int_equal(used(t), 10);
	assert_int_equal(kv_seq_truncate(&t->p, 1, a, 20, &d), 0);
	assert_int_equal(atomic_load(&t->p.seqs[kv_seq_index(a)].n_rows), 20);
	assert_int_equal(seq_pages(t, a, 0), 5);
	assert_int_equal(seq_pages(t, a, 1), 3);
	assert_int_equal(used(t), 8);
	/* grown again: the fresh page 5, and the window trim goes on */
	assert_int_equal(reserve1(t, 1, a, 24, &d), 0);
	assert_int_equal(seq_pages(t, a, 0), 6);
	assert_int_equal(kv_seq_free(&t->p, 1, a, &d), 0);
	assert_int_equal(used(t), 0);
	tpool_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_page_arithmetic),
		cmocka_unit_test(test_pooled_rows),
		cmocka_unit_test(test_p11_bookkeeping),
		cmocka_unit_test(test_seq_generations),
		cmocka_unit_test(test_refcount_threads),
		cmocka_unit_test(test_reserve_all_or_nothing),
		cmocka_unit_test(test_fork),
		cmocka_unit_test(test_adopt),
		cmocka_unit_test(test_window),
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_prefix_cache),
		cmocka_unit_test(test_cache_evict),
		cmocka_unit_test(test_cow),
		cmocka_unit_test(test_cache_refcount_threads),
		cmocka_unit_test(test_truncate),
		cmocka_unit_test(test_truncate_window),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
