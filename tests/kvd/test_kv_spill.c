/*
 * test_kv_spill.c — kvd's spill tier in one process (suite unit): with a
 * host budget of a quarter of what 8 interleaved sequences need, rows
 * written survive spilling and come back identical (a geometry whose pages
 * move straight between pool and file, and one that goes through the
 * bounce buffer); a flipped byte in the spill file fails exactly the
 * sequence that owned it; slots are reused after a free; pinned sequences
 * are never spilled and a request that cannot be served names --budget and
 * --spill-budget; idle prefix-cache groups spill and come back verified;
 * a pool adopted after a kill -9 restores what it had spilled, or fails
 * the sequences whose spilled pages are gone, cleanly, at adoption when
 * the spill file was removed; a kill -9 at any point of a spill's or a
 * restore's bookkeeping (kv_pool.test_cut) loses no page.
 *
 * The spill file lives in a private temporary directory (O_DIRECT when the
 * filesystem takes it; the test runs either way).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_util.h"
#include "test_util.h"

#define MODEL 0x77ull
#define NSEQ 8

struct tpool {
	struct kv_pool p;
	struct kv_layout lay;
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	void *mem;
	char dir[4096];
	char path[4200];
};

/* A pool of n_pages pages and n_slots spill slots (file in a temporary
 * directory). */
static struct tpool *tpool_new(uint32_t n_streams, const uint32_t *row_bytes,
			       uint32_t page_rows, uint64_t n_pages,
			       uint64_t n_slots, uint32_t max_seqs,
			       uint32_t max_rows)
{
	struct tpool *t = calloc(1, sizeof(*t));
	struct st_diag d = { { 0 } };
	uint32_t max_row = 0;
	uint64_t pb, sb;

	assert_non_null(t);
	for (uint32_t i = 0; i < n_streams; i++) {
		t->streams[i].row_bytes = row_bytes[i];
		t->streams[i].tokens_per_row = 1;
		max_row = ST_MAX(max_row, row_bytes[i]);
	}
	pb = ST_ALIGN_UP((uint64_t)max_row * page_rows, 64u);
	sb = ST_ALIGN_UP(pb, 4096u);
	assert_int_equal(kv_layout_compute_spill(t->streams, n_streams,
						 page_rows, n_pages * pb,
						 n_slots * sb, max_seqs,
						 max_rows, &t->lay, &d),
			 0);
	assert_int_equal(t->lay.n_pages, n_pages);
	assert_int_equal(t->lay.n_slots, n_slots);
	assert_int_equal(t->lay.slot_bytes, sb);
	/* shared memory, as kvd's segment: MADV_REMOVE gives pages back */
	t->mem = mmap(NULL, t->lay.total_bytes, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(t->mem != MAP_FAILED);
	assert_int_equal(kv_pool_format(&t->p, t->mem, t->lay.total_bytes,
					&t->lay, t->streams),
			 0);
	st_test_tmpdir(t->dir, sizeof(t->dir));
	snprintf(t->path, sizeof(t->path), "%s/kvd.spill", t->dir);
	if (kv_spill_open(&t->p, t->path, 0, &d) < 0)
		fail_msg("spill open: %s", d.msg);
	return t;
}

static void tpool_free(struct tpool *t)
{
	kv_spill_close(&t->p, 1);
	kv_pool_fini(&t->p);
	munmap(t->mem, t->lay.total_bytes);
	st_rm_rf(t->dir);
	free(t);
}

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

static uint8_t *row_ptr(struct kv_pool *p, uint32_t seq, uint32_t s,
			uint32_t row)
{
	int idx = kv_seq_lookup(p, seq);
	uint32_t pg;

	assert_true(idx >= 0);
	pg = kv_seq_page(p, (uint32_t)idx, s, row / p->lay.page_rows);
	assert_true(pg < p->lay.n_pages); /* resident */
	return kv_page_data(p, pg) +
	       (row % p->lay.page_rows) * p->streams[s].row_bytes;
}

static void write_rows(struct kv_pool *p, uint32_t seq, uint32_t from,
		       uint32_t to, uint32_t tag)
{
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t r = from; r < to; r++) {
			uint8_t *q = row_ptr(p, seq, s, r);

			for (uint32_t i = 0; i < p->streams[s].row_bytes; i++)
				q[i] = pattern(tag, s, r, i);
		}
}

/* 0 when rows [0, to) hold their pattern. */
static int rows_differ(struct kv_pool *p, uint32_t seq, uint32_t to,
		       uint32_t tag)
{
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t r = 0; r < to; r++) {
			const uint8_t *q = row_ptr(p, seq, s, r);

			for (uint32_t i = 0; i < p->streams[s].row_bytes; i++)
				if (q[i] != pattern(tag, s, r, i))
					return 1;
		}
	return 0;
}

static int reserve1(struct kv_pool *p, uint32_t seq, uint32_t rows,
		    struct st_diag *d)
{
	struct kv_reserve_entry e = { seq, rows };

	return kv_seq_reserve(p, 1, 1, &e, d);
}

static int restore1(struct kv_pool *p, uint32_t op, uint32_t seq,
		    struct st_diag *d)
{
	int32_t status = 1;
	int r = kv_seq_residency(p, 1, op, 1, &seq, &status, d);

	assert_int_equal(r, status);
	return r;
}

static uint32_t spilled_entries(struct kv_pool *p, uint32_t seq)
{
	int idx = kv_seq_lookup(p, seq);
	uint32_t n = 0;

	assert_true(idx >= 0);
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = 0; pi < p->lay.max_pages_per_seq; pi++)
			n += kv_entry_is_spilled(
				kv_seq_page(p, (uint32_t)idx, s, pi));
	assert_int_equal(p->seqs[idx].n_spilled, n);
	return n;
}

/*
 * NSEQ sequences of `rows` rows each, written one row per step in turn
 * (as a decode batch would), in a pool of a quarter of what they need.
 */
static void interleave(struct tpool *t, uint32_t *seqs, uint32_t rows)
{
	struct kv_pool *p = &t->p;
	struct st_diag d;

	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_seq_create(p, 1, 1, 0, 0, &seqs[i], &d), 0);
	for (uint32_t r = 0; r < rows; r++)
		for (int i = 0; i < NSEQ; i++) {
			if (reserve1(p, seqs[i], r + 1, &d) < 0)
				fail_msg("reserve seq %d row %u: %s", i, r,
					 d.msg);
			write_rows(p, seqs[i], r, r + 1, (uint32_t)i + 1);
		}
}

/* What the slot records say agrees with the tables: every used slot is
 * named once, by the entry its record names. */
static void check_slots(struct kv_pool *p)
{
	uint64_t used = 0, named = 0;

	for (uint64_t i = 0; i < p->lay.n_slots; i++)
		used += atomic_load(&p->spill.slots[i].state) == KV_SLOT_USED;
	for (uint32_t idx = 0; idx < p->lay.max_seqs; idx++) {
		if (atomic_load(&p->seqs[idx].state) != KV_SEQ_LIVE)
			continue;
		for (uint32_t s = 0; s < p->lay.n_streams; s++)
			for (uint32_t pi = 0; pi < p->lay.max_pages_per_seq;
			     pi++) {
				uint32_t e = kv_seq_page(p, idx, s, pi);
				const struct kv_spill_slot *r;

				if (!kv_entry_is_spilled(e))
					continue;
				r = &p->spill.slots[kv_entry_slot(e)];
				assert_int_equal(atomic_load(&r->state),
						 KV_SLOT_USED);
				assert_int_equal(r->owner_seq,
						 kv_seq_handle(idx,
							       p->seqs[idx].generation));
				assert_int_equal(r->stream, s);
				assert_int_equal(r->page_index, pi);
				named++;
			}
	}
	assert_int_equal(used, named + p->cache.spilled_groups *
					       p->lay.n_streams);
	assert_int_equal(p->spill.n_free_slots, p->lay.n_slots - used);
}

/* ---- round trip -------------------------------------------------------- */

static void roundtrip(const uint32_t *rb, uint32_t rows)
{
	/* 8 x 2 streams x 8 pages = 128 pages needed, 32 on the host */
	struct tpool *t = tpool_new(2, rb, 4, 32, 128, NSEQ, 64);
	struct kv_pool *p = &t->p;
	uint32_t seqs[NSEQ];
	struct st_diag d;

	interleave(t, seqs, rows);
	assert_true(p->stats.spill_pages_total > 0);
	assert_true(p->stats.restore_pages_total > 0);
	assert_int_equal(p->stats.restore_failures, 0);
	check_slots(p);
	/* every sequence back, one at a time (each one evicts others),
	 * byte-identical */
	for (int round = 0; round < 2; round++)
		for (int i = 0; i < NSEQ; i++) {
			assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE,
						  seqs[i], &d),
					 0);
			assert_int_equal(spilled_entries(p, seqs[i]), 0);
			assert_int_equal(rows_differ(p, seqs[i], rows,
						     (uint32_t)i + 1),
					 0);
			check_slots(p);
		}
	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_seq_free(p, 1, seqs[i], &d), 0);
	assert_int_equal(p->spill.n_free_slots, 128);
	assert_int_equal(kv_pool_free_pages(p), 32);
	tpool_free(t);
}

static void test_roundtrip_direct(void **state)
{
	const uint32_t rb[2] = { 1024, 512 }; /* pages of 4 KiB */

	(void)state;
	roundtrip(rb, 32);
}

static void test_roundtrip_bounce(void **state)
{
	const uint32_t rb[2] = { 24, 40 };    /* pages of 192 B */

	(void)state;
	roundtrip(rb, 29); /* a partial last page too */
}

/* ---- corruption -------------------------------------------------------- */

static void flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	assert_int_equal(fsync(fd), 0);
	close(fd);
}

static void test_corrupt_slot(void **state)
{
	const uint32_t rb[2] = { 1024, 200 };
	struct tpool *t = tpool_new(2, rb, 4, 32, 128, NSEQ, 64);
	struct kv_pool *p = &t->p;
	uint32_t seqs[NSEQ], victim = NSEQ, slot = 0, pi_bad = 0;
	struct st_diag d;
	char want[64];

	(void)state;
	interleave(t, seqs, 16);
	/* the first sequence with a spilled page of stream 1 in page 2 */
	for (int i = 0; i < NSEQ && victim == NSEQ; i++) {
		uint32_t e = kv_seq_page(p, kv_seq_index(seqs[i]), 1, 2);

		if (kv_entry_is_spilled(e)) {
			victim = (uint32_t)i;
			slot = kv_entry_slot(e);
			pi_bad = 2;
		}
	}
	assert_int_not_equal(victim, NSEQ);
	/* a byte inside the stream's rows (200 x 4 bytes), past the start */
	flip_byte(t->path, slot * p->lay.slot_bytes + 517);
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(restore1(p, KV_RESIDENCY_PIN, seqs[victim], &d),
			 -ST_E_CHECKSUM);
	snprintf(want, sizeof(want), "sequence 0x%x", seqs[victim]);
	assert_non_null(strstr(d.msg, want));
	snprintf(want, sizeof(want), "page %u of stream 1", pi_bad);
	assert_non_null(strstr(d.msg, want));
	assert_non_null(strstr(d.msg, "checksum"));
	assert_int_equal(p->stats.restore_failures, 1);
	/* the failed sequence: not pinned, nothing but free works */
	assert_false(atomic_load(&p->seqs[kv_seq_index(seqs[victim])].flags) &
		     KV_SEQ_F_PINNED);
	assert_int_equal(kv_seq_page(p, kv_seq_index(seqs[victim]), 1, pi_bad),
			 KV_PAGE_LOST);
	assert_int_equal(reserve1(p, seqs[victim], 17, &d), -ST_E_CHECKSUM);
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, seqs[victim], &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(kv_seq_publish(p, 1, seqs[victim], MODEL,
					(int32_t[16]){ 0 }, 16, &d),
			 -ST_E_CHECKSUM);
	{
		uint32_t child;

		assert_int_equal(kv_seq_fork(p, 1, 1, 0, 0, seqs[victim], 4,
					     &child, &d),
				 -ST_E_CHECKSUM);
	}
	/* every other sequence is whole */
	for (int i = 0; i < NSEQ; i++) {
		if ((uint32_t)i == victim)
			continue;
		assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, seqs[i], &d),
				 0);
		assert_int_equal(rows_differ(p, seqs[i], 16, (uint32_t)i + 1),
				 0);
	}
	/* freeing it gives back its pages and slots */
	assert_int_equal(kv_seq_free(p, 1, seqs[victim], &d), 0);
	check_slots(p);
	for (int i = 0; i < NSEQ; i++)
		if ((uint32_t)i != victim)
			kv_seq_free(p, 1, seqs[i], &d);
	assert_int_equal(p->spill.n_free_slots, 128);
	assert_int_equal(kv_pool_free_pages(p), 32);
	tpool_free(t);
}

/* ---- slot reuse, pins, limits ----------------------------------------- */

static void test_slot_reuse(void **state)
{
	const uint32_t rb[1] = { 1024 };
	struct tpool *t = tpool_new(1, rb, 4, 8, 8, 4, 32);
	struct kv_pool *p = &t->p;
	uint32_t a, b, c, old[4], n_old = 0;
	struct st_diag d;

	(void)state;
	kv_seq_create(p, 1, 1, 0, 0, &a, &d);
	kv_seq_create(p, 1, 1, 0, 0, &b, &d);
	kv_seq_create(p, 1, 1, 0, 0, &c, &d);
	assert_int_equal(reserve1(p, a, 16, &d), 0); /* 4 pages */
	write_rows(p, a, 0, 16, 1);
	assert_int_equal(reserve1(p, b, 16, &d), 0); /* 4 more: pool full */
	write_rows(p, b, 0, 16, 2);
	assert_int_equal(reserve1(p, c, 8, &d), 0);  /* a (oldest) spills 2 */
	assert_int_equal(spilled_entries(p, a), 2);
	assert_int_equal(spilled_entries(p, b), 0);
	for (uint32_t pi = 0; pi < 4; pi++) {
		uint32_t e = kv_seq_page(p, kv_seq_index(a), 0, pi);

		if (kv_entry_is_spilled(e))
			old[n_old++] = kv_entry_slot(e);
	}
	assert_int_equal(n_old, 2);
	assert_int_equal(p->spill.n_free_slots, 6);
	/* a goes: its slots are free again (records too) */
	assert_int_equal(kv_seq_free(p, 1, a, &d), 0);
	assert_int_equal(p->spill.n_free_slots, 8);
	for (uint32_t i = 0; i < n_old; i++)
		assert_int_equal(atomic_load(&p->spill.slots[old[i]].state),
				 KV_SLOT_FREE);
	/* the next spill takes those slots */
	/* 8 pages: 2 free (a's resident ones), b spills all 4 */
	assert_int_equal(reserve1(p, c, 32, &d), 0);
	assert_int_equal(spilled_entries(p, b), 4);
	{
		int reused = 0;

		for (uint32_t pi = 0; pi < 4; pi++) {
			uint32_t e = kv_seq_page(p, kv_seq_index(b), 0, pi);

			for (uint32_t i = 0; i < n_old; i++)
				reused += kv_entry_slot(e) == old[i];
		}
		assert_int_equal(reused, 2);
	}
	write_rows(p, c, 0, 32, 3);
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, b, &d), 0);
	assert_int_equal(rows_differ(p, b, 16, 2), 0);
	assert_int_equal(spilled_entries(p, c), 4);
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, c, &d), 0);
	assert_int_equal(rows_differ(p, c, 32, 3), 0);
	check_slots(p);
	tpool_free(t);
}

static void test_pinned_and_limits(void **state)
{
	const uint32_t rb[1] = { 1024 };
	struct tpool *t = tpool_new(1, rb, 4, 8, 4, 4, 32);
	struct kv_pool *p = &t->p;
	uint32_t a, b, c, pair[2];
	int32_t st[2];
	struct st_diag d;

	(void)state;
	kv_seq_create(p, 1, 1, 0, 0, &a, &d);
	kv_seq_create(p, 1, 1, 0, 0, &b, &d);
	kv_seq_create(p, 1, 1, 0, 0, &c, &d);
	assert_int_equal(reserve1(p, a, 16, &d), 0);
	write_rows(p, a, 0, 16, 1);
	assert_int_equal(reserve1(p, b, 16, &d), 0);
	write_rows(p, b, 0, 16, 2);
	/* both running: c finds nothing to spill */
	pair[0] = a;
	pair[1] = b;
	assert_int_equal(kv_seq_residency(p, 1, KV_RESIDENCY_PIN, 2, pair, st,
					  &d),
			 0);
	assert_int_equal(st[0], 0);
	assert_int_equal(st[1], 0);
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(reserve1(p, c, 4, &d), -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "--budget"));
	assert_non_null(strstr(d.msg, "--kv-budget"));
	assert_non_null(strstr(d.msg, "--spill-budget"));
	assert_non_null(strstr(d.msg, "2 sequences are pinned"));
	/* the spill file has free slots: pinned pages are the cause, so no
	 * advice to raise the spill budget */
	assert_null(strstr(d.msg, "raise kvd --spill-budget"));
	assert_int_equal(p->stats.spill_pages_total, 0);
	assert_int_equal(rows_differ(p, a, 16, 1), 0);
	assert_int_equal(rows_differ(p, b, 16, 2), 0);
	/* b idle again: 1 page of it spills */
	assert_int_equal(kv_seq_residency(p, 1, KV_RESIDENCY_UNPIN, 1, &b, st,
					  &d),
			 0);
	assert_int_equal(reserve1(p, c, 4, &d), 0);
	assert_int_equal(spilled_entries(p, b), 1);
	assert_int_equal(spilled_entries(p, a), 0);
	/* c wants 7 more pages; only b's 3 other pages may spill: refused,
	 * nothing changes */
	assert_int_equal(reserve1(p, c, 32, &d), -ST_E_BUDGET);
	assert_int_equal(atomic_load(&p->seqs[kv_seq_index(c)].n_rows), 4);
	assert_int_equal(spilled_entries(p, b), 1);
	/* a sequence longer than the limit: -ST_E_LIMIT, nothing changes */
	assert_int_equal(reserve1(p, a, 33, &d), -ST_E_LIMIT);
	assert_non_null(strstr(d.msg, "--max-rows-per-seq"));
	assert_int_equal(atomic_load(&p->seqs[kv_seq_index(a)].n_rows), 16);
	assert_int_equal(rows_differ(p, a, 16, 1), 0);
	/* pinning b brings it back (a is pinned: c's page spills) */
	assert_int_equal(restore1(p, KV_RESIDENCY_PIN, b, &d), 0);
	assert_int_equal(spilled_entries(p, b), 0);
	assert_int_equal(spilled_entries(p, c), 1);
	assert_int_equal(rows_differ(p, b, 16, 2), 0);
	/* restoring c needs a page: everything else is pinned */
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, c, &d),
			 -ST_E_BUDGET);
	assert_int_equal(spilled_entries(p, c), 1);
	assert_int_equal(restore1(p, KV_RESIDENCY_UNPIN, a, &d), 0);
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, c, &d), 0);
	/* unknown and foreign sequences: their own status */
	{
		uint32_t three[3] = { a, c ^ (1u << 22), b };
		int32_t s3[3];

		assert_int_equal(kv_seq_residency(p, 2, KV_RESIDENCY_RESTORE, 1,
						  three, s3, &d),
				 -EPERM);
		assert_int_equal(kv_seq_residency(p, 1, KV_RESIDENCY_RESTORE, 3,
						  three, s3, &d),
				 -ST_E_NOTFOUND);
		assert_int_equal(s3[0], 0);
		assert_int_equal(s3[1], -ST_E_NOTFOUND);
		assert_int_equal(s3[2], 0);
	}
	tpool_free(t);
}

/* ---- the memory target (kv_budget.c) ------------------------------------ */

/* Resident host pages of [a, a + len) (mincore of the shared mapping). */
static uint64_t resident_bytes(const uint8_t *a, uint64_t len)
{
	unsigned char v[64];

	assert_true(len / 4096 <= sizeof(v));
	assert_int_equal(mincore((void *)a, len, v), 0);
	for (uint64_t i = 0, n = 0;; i++) {
		if (i == len / 4096)
			return n * 4096;
		n += v[i] & 1;
	}
}

static uint64_t pinned_now(struct kv_pool *p)
{
	struct kv_budget_gauges g;

	kv_budget_gauges(p, st_now_ns(), 0, NULL, 0, &g);
	return g.pinned;
}

/*
 * Pages held follow the target: a shrink spills idle sequences' pages
 * (least recently used first) but never a pinned one; freed pages'
 * memory goes back to the OS; allocations stay within the target; a
 * pinned sequence's step goes over it (over_pages) rather than fail, and
 * the grant ends once the pins go; every row comes back as written.
 */
static void test_memory_target(void **state)
{
	const uint32_t rb[1] = { 1024 };
	/* pages of 4 rows x 1024 bytes = 4 KiB: one host page each */
	struct tpool *t = tpool_new(1, rb, 4, 32, 128, NSEQ, 64);
	struct kv_pool *p = &t->p;
	uint32_t seq[4];
	struct st_diag d;
	uint64_t held;

	(void)state;
	for (uint32_t i = 0; i < 4; i++) {
		assert_int_equal(kv_seq_create(p, 1, 1, 0, 0, &seq[i], &d), 0);
		assert_int_equal(reserve1(p, seq[i], 16, &d), 0);
		write_rows(p, seq[i], 0, 16, i + 1);
	}
	assert_int_equal(kv_pool_held_pages(p), 16);
	assert_int_equal(resident_bytes(p->data, 32 * 4096), 16 * 4096);
	/* seq[0] runs; the target drops to 8 pages */
	assert_int_equal(restore1(p, KV_RESIDENCY_PIN, seq[0], &d), 0);
	assert_int_equal(pinned_now(p), 4);
	kv_pool_set_allowed(p, 8, 4);
	assert_int_equal(kv_pool_free_pages(p), 0);
	if (kv_pool_shrink(p, &d) < 0)
		fail_msg("shrink: %s", d.msg);
	held = kv_pool_held_pages(p);
	assert_true(held <= 8);
	assert_int_equal(held, 8); /* no more spilled than needed */
	assert_int_equal(spilled_entries(p, seq[0]), 0);
	assert_int_equal(rows_differ(p, seq[0], 16, 1), 0);
	/* seq[1] was the least recently used: it went first */
	assert_int_equal(spilled_entries(p, seq[1]), 4);
	assert_int_equal(spilled_entries(p, seq[2]), 4);
	check_slots(p);
	/* the gauges: seq[0] pinned, seq[3] queued (its 4 pages count as
	 * wanted), seq[1] and seq[2] in the spill file */
	{
		struct kv_budget_gauges g;

		kv_budget_gauges(p, st_now_ns(), 0, &seq[3], 1, &g);
		assert_int_equal(g.held, 8);
		assert_int_equal(g.pinned, 4);
		assert_int_equal(g.spilled, 8);
		assert_int_equal(g.working, 8);
		assert_int_equal(g.over, 0);
		/* everything used within the hour is working set */
		kv_budget_gauges(p, st_now_ns(), 3600000000000ull, NULL, 0,
				 &g);
		assert_int_equal(g.working, 16);
	}
	/* the freed pages' memory is back with the OS */
	assert_int_equal(kv_pool_release_free(p), 24 * 4096);
	assert_int_equal(resident_bytes(p->data, 32 * 4096), 8 * 4096);
	assert_int_equal(kv_pool_release_free(p), 0); /* nothing new */
	/* a target of 12: an idle sequence grows within it, others spill */
	kv_pool_set_allowed(p, 12, 4);
	assert_int_equal(reserve1(p, seq[3], 32, &d), 0);
	write_rows(p, seq[3], 16, 32, 4);
	assert_int_equal(kv_pool_held_pages(p), 12);
	assert_int_equal(p->over_pages, 0);
	/* a pinned sequence that cannot fit goes over instead of failing:
	 * seq[0] (4) + seq[3] (8) pinned with a target of 6 pages */
	kv_pool_set_allowed(p, 6, pinned_now(p));
	if (kv_pool_shrink(p, &d) < 0)
		fail_msg("shrink to 6: %s", d.msg);
	assert_true(kv_pool_held_pages(p) <= 6);
	assert_int_equal(spilled_entries(p, seq[0]), 0);
	assert_int_equal(restore1(p, KV_RESIDENCY_RESTORE, seq[3], &d),
			 -ST_E_BUDGET); /* not running: no grant */
	assert_non_null(strstr(d.msg, "gives kv 6 of the pool's 32 pages"));
	assert_non_null(strstr(d.msg, "--memory-budget"));
	assert_int_equal(restore1(p, KV_RESIDENCY_PIN, seq[3], &d), 0);
	assert_int_equal(p->over_pages, 6);
	assert_int_equal(kv_pool_held_pages(p), 12);
	assert_int_equal(rows_differ(p, seq[3], 32, 4), 0);
	assert_int_equal(reserve1(p, seq[0], 20, &d), 0); /* + 1 page */
	write_rows(p, seq[0], 16, 20, 1);
	assert_int_equal(p->over_pages, 7);
	/* a shrink keeps what is granted while the pins hold */
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(kv_pool_shrink(p, &d), 0);
	assert_int_equal(kv_pool_held_pages(p), 13);
	assert_int_equal(spilled_entries(p, seq[0]), 0);
	assert_int_equal(spilled_entries(p, seq[3]), 0);
	/* unpinned, the grant ends and the pages over the target spill */
	assert_int_equal(restore1(p, KV_RESIDENCY_UNPIN, seq[3], &d), 0);
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(p->over_pages, 0);
	if (kv_pool_shrink(p, &d) < 0)
		fail_msg("shrink after unpin: %s", d.msg);
	assert_true(kv_pool_held_pages(p) <= 6);
	assert_int_equal(spilled_entries(p, seq[0]), 0);
	check_slots(p);
	/* every pinned page in the way: the shrink fails, nothing moves */
	kv_pool_set_allowed(p, 2, pinned_now(p));
	assert_int_equal(kv_pool_shrink(p, &d), -ST_E_BUDGET);
	assert_int_equal(spilled_entries(p, seq[0]), 0);
	assert_int_equal(restore1(p, KV_RESIDENCY_UNPIN, seq[0], &d), 0);
	/* every row back as written, one sequence at a time (pinned: over
	 * the 6-page target for the 8-page one) */
	kv_pool_set_allowed(p, 6, 0);
	for (uint32_t i = 0; i < 4; i++) {
		uint32_t rows = i == 0 ? 20 : i == 3 ? 32 : 16;

		assert_int_equal(restore1(p, KV_RESIDENCY_PIN, seq[i], &d), 0);
		assert_int_equal(rows_differ(p, seq[i], rows, i + 1), 0);
		assert_int_equal(restore1(p, KV_RESIDENCY_UNPIN, seq[i], &d),
				 0);
		kv_pool_set_allowed(p, 6, 0);
		assert_int_equal(kv_pool_shrink(p, &d), 0);
		assert_true(kv_pool_held_pages(p) <= 6);
	}
	assert_int_equal(p->stats.restore_failures, 0);
	check_slots(p);
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(kv_seq_free(p, 1, seq[i], &d), 0);
	assert_int_equal(p->spill.n_free_slots, 128);
	tpool_free(t);
}

/*
 * Without a spill file (issue 24) no page of a sequence can leave: every
 * sequence's pages count as pinned, and a reservation goes over a target
 * that went down under the pages held (over_pages covers them all: a
 * grant of the room alone left the allocation short), then the grant
 * follows the pages as sequences go.
 */
static void test_memory_target_no_spill(void **state)
{
	const uint32_t rb[1] = { 1024 };
	struct tpool *t = tpool_new(1, rb, 4, 32, 0, NSEQ, 64);
	struct kv_pool *p = &t->p;
	uint32_t seq[3];
	struct st_diag d;

	(void)state;
	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(kv_seq_create(p, 1, 1, 0, 0, &seq[i], &d), 0);
		assert_int_equal(reserve1(p, seq[i], 16, &d), 0);
		write_rows(p, seq[i], 0, 16, i + 1);
	}
	assert_int_equal(pinned_now(p), 12);
	/* the target drops to 6 pages under the 12 held: nothing can go */
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(kv_pool_shrink(p, &d), -ST_E_BUDGET);
	assert_int_equal(kv_pool_held_pages(p), 12);
	/* seq[0] grows by a page: over the target by all it holds */
	if (reserve1(p, seq[0], 20, &d) < 0)
		fail_msg("reserve over the target: %s", d.msg);
	write_rows(p, seq[0], 16, 20, 1);
	assert_int_equal(kv_pool_held_pages(p), 13);
	assert_int_equal(p->over_pages, 7);
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(p->over_pages, 7);
	/* seq[1] goes: the grant shrinks to what the others hold */
	assert_int_equal(kv_seq_free(p, 1, seq[1], &d), 0);
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(p->over_pages, 3);
	assert_int_equal(rows_differ(p, seq[0], 20, 1), 0);
	assert_int_equal(rows_differ(p, seq[2], 16, 3), 0);
	for (uint32_t i = 0; i < 3; i += 2)
		assert_int_equal(kv_seq_free(p, 1, seq[i], &d), 0);
	kv_pool_set_allowed(p, 6, pinned_now(p));
	assert_int_equal(p->over_pages, 0);
	tpool_free(t);
}

/* ---- prefix-cache groups ----------------------------------------------- */

static void prompt(int32_t *ids, uint32_t n, uint32_t tag)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)(tag * 10000u + i);
}

static void test_cache_groups(void **state)
{
	const uint32_t rb[2] = { 1024, 256 };
	struct tpool *t = tpool_new(2, rb, 4, 12, 16, 4, 64);
	struct kv_pool *p = &t->p;
	uint32_t a, b, big, cached;
	int32_t ids[32];
	struct st_diag d;

	(void)state;
	/* prompt 1: 9 rows, 2 groups published; the sequence goes */
	prompt(ids, 32, 1);
	assert_int_equal(kv_seq_create_prefix(p, 1, 1, 0, 0, MODEL, ids, 9, &a,
					      &cached, &d),
			 0);
	assert_int_equal(reserve1(p, a, 9, &d), 0);
	write_rows(p, a, 0, 9, 5);
	assert_int_equal(kv_seq_publish(p, 1, a, MODEL, ids, 9, &d), 2);
	assert_int_equal(kv_seq_free(p, 1, a, &d), 0);
	assert_int_equal(p->cache.idle_pages, 4);
	/* 10 pages wanted, 8 free, 4 idle cached: one group spills (only
	 * what is needed), the other stays */
	kv_seq_create(p, 1, 1, 0, 0, &big, &d);
	assert_int_equal(reserve1(p, big, 20, &d), 0);
	assert_int_equal(p->cache.spilled_groups, 1);
	assert_int_equal(p->cache.idle_pages, 2);
	assert_int_equal(p->stats.spill_pages_total, 2);
	/* 12 pages: the other one too */
	assert_int_equal(reserve1(p, big, 24, &d), 0);
	write_rows(p, big, 0, 24, 6);
	assert_int_equal(p->cache.spilled_groups, 2);
	assert_int_equal(p->cache.idle_pages, 0);
	assert_int_equal(p->stats.spill_pages_total, 4);
	check_slots(p);
	/* found again: restored from the file, verified, same rows */
	assert_int_equal(kv_seq_free(p, 1, big, &d), 0);
	assert_int_equal(kv_seq_create_prefix(p, 1, 1, 0, 0, MODEL, ids, 12,
					      &b, &cached, &d),
			 0);
	assert_int_equal(cached, 8);
	assert_int_equal(p->cache.spilled_groups, 0);
	assert_int_equal(rows_differ(p, b, 8, 5), 0);
	assert_int_equal(p->stats.restore_pages_total, 4);
	assert_int_equal(kv_seq_free(p, 1, b, &d), 0);
	check_slots(p);
	/* spilled again, then a byte of group 1's slot flips: the lookup
	 * stops there (a miss, not an error) and the group is dropped */
	kv_seq_create(p, 1, 1, 0, 0, &big, &d);
	assert_int_equal(reserve1(p, big, 24, &d), 0);
	assert_int_equal(p->cache.spilled_groups, 2);
	{
		uint64_t k[2];
		uint32_t g;

		assert_int_equal(kv_prefix_keys(ids, 4, MODEL, 2, k), 0);
		g = kv_cache_find_locked(p, k[1]);
		assert_int_not_equal(g, UINT32_MAX);
		flip_byte(t->path, kv_entry_slot(p->cache.ent[g * 2]) *
					   p->lay.slot_bytes + 9);
	}
	assert_int_equal(kv_seq_free(p, 1, big, &d), 0);
	assert_int_equal(kv_seq_create_prefix(p, 1, 1, 0, 0, MODEL, ids, 12,
					      &b, &cached, &d),
			 0);
	assert_int_equal(cached, 4);
	assert_int_equal(p->stats.restore_failures, 1);
	assert_int_equal(p->cache.n_groups, 1);
	assert_int_equal(rows_differ(p, b, 4, 5), 0);
	kv_seq_free(p, 1, b, &d);
	check_slots(p);
	tpool_free(t);
}

/* ---- queued requests' prefixes (kv_cache_ahead.c) ----------------------- */

/* Pages of the pool referenced by the held entries of the plan. */
static uint64_t held_refs(struct kv_pool *p)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < p->pfx.n; i++) {
		const uint32_t *pg = p->pfx.pages + i * p->lay.n_streams;

		if (p->pfx.v[i].state != KV_PFX_HELD)
			continue;
		for (uint32_t s = 0; s < p->lay.n_streams; s++)
			n += atomic_load(&p->pages[pg[s]].refcount) > 0;
	}
	return n;
}

static void test_prefix_ahead(void **state)
{
	const uint32_t rb[2] = { 1024, 256 };
	struct tpool *t = tpool_new(2, rb, 4, 12, 16, 4, 64);
	struct kv_pool *p = &t->p;
	uint32_t a, b, big, cached, sp, held, chains[2] = { 2, 1 };
	uint64_t keys[3], restored;
	int32_t ids[32], other[8];
	struct st_diag d;

	(void)state;
	/* prompt 1's two groups published, then spilled by a sequence of
	 * client 1 that takes the whole pool */
	prompt(ids, 32, 1);
	prompt(other, 8, 2);
	assert_int_equal(kv_seq_create_prefix(p, 1, 1, 0, 0, MODEL, ids, 9, &a,
					      &cached, &d),
			 0);
	assert_int_equal(reserve1(p, a, 9, &d), 0);
	write_rows(p, a, 0, 9, 5);
	assert_int_equal(kv_seq_publish(p, 1, a, MODEL, ids, 9, &d), 2);
	assert_int_equal(kv_seq_free(p, 1, a, &d), 0);
	kv_seq_create(p, 1, 1, 0, 0, &big, &d);
	assert_int_equal(reserve1(p, big, 24, &d), 0);
	assert_int_equal(p->cache.spilled_groups, 2);
	assert_int_equal(kv_prefix_keys(ids, 4, MODEL, 2, keys), 0);
	assert_int_equal(kv_prefix_keys(other, 4, MODEL, 1, keys + 2), 0);

	/* client 2's plan: prompt 1's chain (spilled) and a chain never
	 * cached (ends at once) */
	assert_int_equal(kv_pfx_ahead_set(p, 2, 2, chains, keys, &sp, &held),
			 0);
	assert_int_equal(sp, 2);
	assert_int_equal(held, 0);
	assert_int_equal(p->pfx.n, 3);
	assert_int_equal(p->pfx.n_pending, 2);
	/* no room but a sequence's pages: given up, nothing spilled for it,
	 * the rest of the chain too */
	kv_pfx_ahead_step(p, 0);
	assert_int_equal(p->pfx.n_pending, 0);
	assert_int_equal(spilled_entries(p, big), 0);
	assert_int_equal(p->cache.spilled_groups, 2);
	assert_int_equal(p->stats.pfx_ahead_groups, 0);

	/* room now: the same plan again restores both, within the headroom
	 * (12 free pages, 4 kept), and holds them */
	assert_int_equal(kv_seq_free(p, 1, big, &d), 0);
	assert_int_equal(kv_pfx_ahead_set(p, 2, 2, chains, keys, &sp, &held),
			 0);
	assert_int_equal(sp, 2);
	restored = p->stats.restore_pages_total;
	kv_pfx_ahead_step(p, 4);
	kv_pfx_ahead_step(p, 4);
	assert_int_equal(p->pfx.n_pending, 0);
	assert_int_equal(p->stats.pfx_ahead_groups, 2);
	assert_int_equal(p->stats.restore_pages_total, restored + 4);
	assert_int_equal(p->cache.spilled_groups, 0);
	assert_int_equal(p->pfx.held_pages, 4);
	assert_int_equal(held_refs(p), 4);
	assert_int_equal(p->cache.idle_pages, 0); /* held: not idle */

	/* the lookup of the admitted request maps them without a read,
	 * rows intact */
	restored = p->stats.restore_pages_total;
	assert_int_equal(kv_seq_create_prefix(p, 2, 1, 0, 0, MODEL, ids, 12,
					      &b, &cached, &d),
			 0);
	assert_int_equal(cached, 8);
	assert_int_equal(p->stats.pfx_lookup_restores, 0);
	assert_int_equal(p->stats.restore_pages_total, restored);
	assert_int_equal(rows_differ(p, b, 8, 5), 0);
	/* the plan dropped: the holds go, the sequence keeps its pages */
	assert_int_equal(kv_pfx_ahead_set(p, 2, 0, chains, keys, &sp, &held),
			 0);
	assert_int_equal(p->pfx.n, 0);
	assert_int_equal(p->pfx.held_pages, 0);
	assert_int_equal(rows_differ(p, b, 8, 5), 0);
	assert_int_equal(kv_seq_free(p, 2, b, &d), 0);
	assert_int_equal(p->cache.idle_pages, 4);

	/* resident groups are held at once; a reservation with no other
	 * room releases the holds rather than fail */
	assert_int_equal(kv_pfx_ahead_set(p, 2, 1, chains, keys, &sp, &held),
			 0);
	assert_int_equal(sp, 0);
	assert_int_equal(held, 2);
	assert_int_equal(p->cache.idle_pages, 0);
	kv_seq_create(p, 1, 1, 0, 0, &big, &d);
	assert_int_equal(reserve1(p, big, 20, &d), 0); /* 10 of 12 pages */
	assert_int_equal(p->stats.pfx_released, 2);
	assert_int_equal(p->pfx.held_pages, 0);
	assert_int_equal(p->pfx.v[0].state, KV_PFX_SKIPPED);
	write_rows(p, big, 0, 20, 6);
	assert_int_equal(kv_seq_free(p, 1, big, &d), 0);

	/* a client that goes takes its plan and holds with it */
	assert_int_equal(kv_pfx_ahead_set(p, 3, 1, chains, keys, &sp, &held),
			 0);
	assert_int_equal(sp + held, 2);
	kv_pfx_ahead_step(p, 4);
	assert_true(p->pfx.held_pages > 0);
	kv_seq_free_client(p, 3);
	assert_int_equal(p->pfx.n, 2); /* client 2's entries stay */
	assert_int_equal(p->pfx.held_pages, 0);
	kv_seq_free_client(p, 2);
	assert_int_equal(p->pfx.n, 0);
	check_slots(p);
	tpool_free(t);
}

/* ---- adoption ----------------------------------------------------------- */

/* What a kill -9 leaves: the segment's bytes and the spill file, copied
 * (to ret_path) so that each adoption below starts from the same state. */
static void *crash_copy(struct tpool *t, int n, char *ret_path, size_t len)
{
	void *copy = aligned_alloc(ST_SHM_PAGE, t->lay.total_bytes);
	char *data;
	size_t size;

	assert_non_null(copy);
	memcpy(copy, t->mem, t->lay.total_bytes);
	snprintf(ret_path, len, "%s/crash%d.spill", t->dir, n);
	assert_int_equal(st_read_file(t->path, &data, &size), 0);
	assert_int_equal(st_write_file(ret_path, data, size), 0);
	free(data);
	return copy;
}

/*
 * A crash copy of t adopted with its spill file removed, as a cleaned /tmp
 * or run directory leaves it: at kv_spill_open every sequence that had
 * spilled pages is FAILED, its spilled entries KV_PAGE_LOST, every slot
 * free (not only at a restore, as a checksum mismatch); the others restore
 * whole and what is spilled to make room for them comes back.
 */
static void lost_file_adopt(struct tpool *t, const uint32_t *seqs, int n)
{
	struct kv_adopt_report rep;
	struct kv_pool q;
	struct st_diag d;
	char path[4300];
	void *copy = crash_copy(t, n, path, sizeof(path));
	int had[NSEQ], failed = 0, fine = 0;

	assert_int_equal(unlink(path), 0);
	assert_int_equal(kv_pool_adopt(&q, copy, t->lay.total_bytes, &t->lay,
				       t->streams, &rep),
			 0);
	assert_int_equal(rep.seqs_failed, 0); /* the records match */
	for (int i = 0; i < NSEQ; i++)
		had[i] = q.seqs[kv_seq_index(seqs[i])].n_spilled > 0;
	assert_int_equal(kv_spill_open(&q, path, 1, &d), 0);
	assert_int_equal(q.spill.n_free_slots, t->lay.n_slots);
	for (int i = 0; i < NSEQ; i++) {
		uint32_t idx = kv_seq_index(seqs[i]);
		int lost = 0;

		for (uint32_t s = 0; s < t->lay.n_streams; s++)
			for (uint32_t pi = 0; pi < 4; pi++) {
				uint32_t e = kv_seq_page(&q, idx, s, pi);

				assert_false(kv_entry_is_spilled(e));
				lost += e == KV_PAGE_LOST;
			}
		assert_int_equal(!!(atomic_load(&q.seqs[idx].flags) &
				    KV_SEQ_F_FAILED),
				 had[i]);
		assert_int_equal(lost > 0, had[i]);
		assert_int_equal(q.seqs[idx].n_spilled, 0);
	}
	check_slots(&q);
	for (int i = 0; i < NSEQ; i++) {
		int r = restore1(&q, KV_RESIDENCY_RESTORE, seqs[i], &d);

		if (had[i]) {
			assert_int_equal(r, -ST_E_CHECKSUM);
			assert_non_null(strstr(d.msg, "failed earlier"));
			failed++;
		} else {
			assert_int_equal(r, 0);
			assert_int_equal(rows_differ(&q, seqs[i], 16,
						     (uint32_t)i + 1),
					 0);
			fine++;
		}
	}
	assert_true(failed > 0);
	assert_true(fine > 0);
	check_slots(&q);
	kv_spill_close(&q, 1);
	kv_pool_fini(&q);
	free(copy);
}

static void test_adopt(void **state)
{
	const uint32_t rb[2] = { 1024, 128 };
	struct tpool *t = tpool_new(2, rb, 4, 32, 128, NSEQ, 64);
	struct kv_adopt_report rep;
	struct kv_pool q;
	uint32_t seqs[NSEQ], bad = NSEQ;
	struct st_diag d;
	char path[4300];
	void *copy;

	(void)state;
	interleave(t, seqs, 16);
	assert_true(t->p.spill.n_free_slots < 128);

	/* 1: everything kept, spilled pages restorable from the same file */
	copy = crash_copy(t, 1, path, sizeof(path));
	assert_int_equal(kv_pool_adopt(&q, copy, t->lay.total_bytes, &t->lay,
				       t->streams, &rep),
			 0);
	assert_int_equal(rep.seqs_kept, NSEQ);
	assert_int_equal(rep.seqs_failed, 0);
	assert_int_equal(rep.slots_kept, 128 - t->p.spill.n_free_slots);
	assert_int_equal(rep.slots_freed, 0);
	assert_int_equal(kv_spill_open(&q, path, 1, &d), 0);
	check_slots(&q);
	for (int i = 0; i < NSEQ; i++) {
		if (restore1(&q, KV_RESIDENCY_RESTORE, seqs[i], &d) < 0)
			fail_msg("restore after adoption: %s", d.msg);
		assert_int_equal(rows_differ(&q, seqs[i], 16, (uint32_t)i + 1),
				 0);
	}
	kv_spill_close(&q, 0);
	kv_pool_fini(&q);
	free(copy);

	/* 2: one slot record no longer matches its table entry (a record
	 * half written when kvd died): that sequence fails, others not; a
	 * record nothing names is freed */
	copy = crash_copy(t, 2, path, sizeof(path));
	{
		struct kv_spill_slot *slots =
			(void *)((uint8_t *)copy + t->lay.slots_off);
		uint32_t *table = (void *)((uint8_t *)copy + t->lay.table_off);

		for (int i = 0; i < NSEQ && bad == NSEQ; i++) {
			uint32_t e = table[kv_table_index(
				&t->lay, kv_seq_index(seqs[i]), 0, 0)];

			if (kv_entry_is_spilled(e)) {
				bad = (uint32_t)i;
				slots[kv_entry_slot(e)].page_index = 3;
			}
		}
		assert_int_not_equal(bad, NSEQ);
		for (uint64_t i = 0; i < t->lay.n_slots; i++)
			if (atomic_load(&slots[i].state) == KV_SLOT_FREE) {
				atomic_store(&slots[i].state, KV_SLOT_USED);
				slots[i].owner_seq = 0x123456;
				break;
			}
	}
	assert_int_equal(kv_pool_adopt(&q, copy, t->lay.total_bytes, &t->lay,
				       t->streams, &rep),
			 0);
	assert_int_equal(rep.seqs_kept, NSEQ);
	assert_int_equal(rep.seqs_failed, 1);
	assert_int_equal(rep.slots_freed, 2); /* the junk and the bad one */
	assert_int_equal(kv_spill_open(&q, path, 1, &d), 0);
	assert_true(atomic_load(&q.seqs[kv_seq_index(seqs[bad])].flags) &
		    KV_SEQ_F_FAILED);
	assert_int_equal(kv_seq_page(&q, kv_seq_index(seqs[bad]), 0, 0),
			 KV_PAGE_LOST);
	for (int i = 0; i < NSEQ; i++)
		if ((uint32_t)i != bad) {
			assert_int_equal(restore1(&q, KV_RESIDENCY_RESTORE,
						  seqs[i], &d),
					 0);
			assert_int_equal(rows_differ(&q, seqs[i], 16,
						     (uint32_t)i + 1),
					 0);
		}
	assert_int_equal(restore1(&q, KV_RESIDENCY_RESTORE, seqs[bad], &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(kv_seq_free(&q, 1, seqs[bad], &d), 0);
	check_slots(&q);
	kv_spill_close(&q, 0);
	kv_pool_fini(&q);
	free(copy);

	/* 3: the spill file is gone (another disk, a cleaned /tmp or run
	 * directory) */
	lost_file_adopt(t, seqs, 3);
	tpool_free(t);
}

/* ---- kill -9 mid-move ---------------------------------------------------- */

struct cut {
	int restore;  /* which bookkeeping (kv_pool.test_cut) */
	uint32_t at;  /* the step to stop at */
	int hit;
};

static int cut_at(void *ctx, int restore, uint32_t step)
{
	struct cut *c = ctx;

	if (restore != c->restore || step != c->at)
		return 0;
	c->hit = 1;
	return 1;
}

/*
 * A kill -9 at every point of a spill's bookkeeping (before an entry's
 * slot record, between it and the table entry, before the page is freed)
 * and of a restore's (before an entry's table entry, before its slot is
 * freed, before the count), in a restore of a spilled sequence that has
 * to spill others first: the pool adopted from what the kill left (the
 * segment's bytes and the spill file) has consistent slots, fails no
 * sequence, and every row of every sequence reads back as written.
 */
static void test_adopt_cut(void **state)
{
	const uint32_t rb[2] = { 1024, 128 };
	uint32_t cuts[2] = { 0, 0 };

	(void)state;
	for (int restore = 0; restore <= 1; restore++)
		for (uint32_t at = 0;; at++) {
			struct tpool *t = tpool_new(2, rb, 4, 32, 128, NSEQ,
						    64);
			struct cut c = { restore, at, 0 };
			struct kv_adopt_report rep;
			struct kv_pool q;
			struct st_diag d;
			uint32_t seqs[NSEQ], victim = NSEQ;
			char path[4300];
			void *copy;
			int r;

			interleave(t, seqs, 16);
			for (uint32_t i = 0; i < NSEQ && victim == NSEQ; i++)
				if (spilled_entries(&t->p, seqs[i]) ==
				    2 * 4)
					victim = i;
			assert_int_not_equal(victim, NSEQ);
			assert_int_equal(kv_pool_free_pages(&t->p), 0);
			t->p.test_cut = cut_at;
			t->p.test_cut_ctx = &c;
			r = restore1(&t->p, KV_RESIDENCY_RESTORE,
				     seqs[victim], &d);
			t->p.test_cut = NULL;
			if (!c.hit) { /* past the last step: done */
				assert_int_equal(r, 0);
				tpool_free(t);
				break;
			}
			assert_int_equal(r, -ECANCELED);
			cuts[restore]++;
			copy = crash_copy(t, 1, path, sizeof(path));
			assert_int_equal(kv_pool_adopt(&q, copy,
						       t->lay.total_bytes,
						       &t->lay, t->streams,
						       &rep),
					 0);
			assert_int_equal(rep.seqs_kept, NSEQ);
			assert_int_equal(rep.seqs_failed, 0);
			assert_int_equal(kv_spill_open(&q, path, 1, &d), 0);
			check_slots(&q);
			for (int i = 0; i < NSEQ; i++) {
				if (restore1(&q, KV_RESIDENCY_RESTORE, seqs[i],
					     &d) < 0)
					fail_msg("cut %d at %u: restore %d: %s",
						 restore, at, i, d.msg);
				assert_int_equal(rows_differ(&q, seqs[i], 16,
							     (uint32_t)i + 1),
						 0);
			}
			check_slots(&q);
			kv_spill_close(&q, 0);
			kv_pool_fini(&q);
			free(copy);
			tpool_free(t);
		}
	/* 8 pages spilled to make room, 8 restored: 3 steps each */
	assert_int_equal(cuts[0], 3 * 8);
	assert_int_equal(cuts[1], 3 * 8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_direct),
		cmocka_unit_test(test_roundtrip_bounce),
		cmocka_unit_test(test_corrupt_slot),
		cmocka_unit_test(test_slot_reuse),
		cmocka_unit_test(test_pinned_and_limits),
		cmocka_unit_test(test_memory_target),
		cmocka_unit_test(test_memory_target_no_spill),
		cmocka_unit_test(test_cache_groups),
		cmocka_unit_test(test_prefix_ahead),
		cmocka_unit_test(test_adopt),
		cmocka_unit_test(test_adopt_cut),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
