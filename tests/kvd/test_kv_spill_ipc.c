/*
 * test_kv_spill_ipc.c — spilling through the real kvd (suite ipc): with a
 * host budget of a quarter of what 8 interleaved sequences need, a client
 * that pins what it computes and unpins it after each step reads back
 * exactly the rows it wrote; rows of a spilled sequence read NULL until it
 * is restored; a flipped byte in the spill file fails only the sequence
 * that owned it (the others restore intact); when every page is pinned a
 * request gets -ST_E_BUDGET naming the budgets; STATS reports the spill
 * figures; a clean stop removes the spill file; a prefetch restores in
 * the background, without a further request, and never spills; a restore
 * ahead (issue 24) spills idle sequences to make room but never a pinned
 * one, gives up when only pinned pages could make room, loses no spilled
 * page, and never spills a sequence of its plan for another; a queued
 * request's spilled prefix named ahead (PREFIX_AHEAD) is back before its
 * lookup, which then reads nothing from the spill file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "kv_test_util.h"
#include "st_util.h"

#define TIMEOUT_MS 5000
#define NSEQ 8
#define ROWS 32

/* 2 streams, pages of 4 rows: 4 KiB + 2 KiB of rows in 4 KiB pages */
static const uint32_t rb[2] = { 1024, 512 };

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

static int setup(void **state)
{
	static int n;
	struct kvd_inst *k = kvd_fixture_new("sp", n++);

	if (!k)
		return -1;
	/* 32 pages of 4 KiB on the host; 8 x 32 rows need 128 */
	snprintf(k->budget, sizeof(k->budget), "128KiB");
	snprintf(k->spill_budget, sizeof(k->spill_budget), "1MiB");
	snprintf(k->max_rows, sizeof(k->max_rows), "64");
	*state = k;
	return 0;
}

static int teardown(void **state)
{
	return kvd_fixture_teardown(state);
}

static struct kv_client *open_declared(struct kvd_inst *k)
{
	struct kv_stream_decl sd[2] = { { rb[0], 1, 0, 0 }, { rb[1], 1, 0, 0 } };
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };

	if (kv_client_open(k->run_dir, k->name, "spill-test", TIMEOUT_MS, &c,
			   &d) < 0)
		fail_msg("open: %s", d.msg);
	if (kv_client_declare_model(c, 2, sd, 4, 0x51, &d) < 0)
		fail_msg("declare: %s", d.msg);
	return c;
}

static void write_row(struct kv_client *c, uint32_t seq, uint32_t r,
		      uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++) {
		uint8_t *p = kv_client_row_writable(c, seq, (int)s, r);

		assert_non_null(p);
		for (uint32_t i = 0; i < rb[s]; i++)
			p[i] = pattern(tag, s, r, i);
	}
}

static int rows_differ(struct kv_client *c, uint32_t seq, uint32_t rows,
		       uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < rows; r++) {
			const uint8_t *p = kv_client_row(c, seq, (int)s, r);

			if (!p)
				return -1;
			for (uint32_t i = 0; i < rb[s]; i++)
				if (p[i] != pattern(tag, s, r, i))
					return 1;
		}
	return 0;
}

/* The decode loop of a scheduler running one sequence at a time: pin
 * (restores it), reserve one more row, write it, unpin. */
static void interleave(struct kv_client *c, uint32_t *seqs)
{
	struct st_diag d;

	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_client_seq_create(c, &seqs[i], &d), 0);
	for (uint32_t r = 0; r < ROWS; r++)
		for (int i = 0; i < NSEQ; i++) {
			uint32_t n = r + 1;

			if (kv_client_seq_pin(c, 1, &seqs[i], NULL, &d) < 0 ||
			    kv_client_seq_reserve(c, 1, &seqs[i], &n, &d) < 0)
				fail_msg("step %u seq %d: %s", r, i, d.msg);
			write_row(c, seqs[i], r, (uint32_t)i + 1);
			assert_int_equal(kv_client_seq_unpin(c, 1, &seqs[i],
							     &d),
					 0);
		}
}

static void test_interleaved(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t seqs[NSEQ];
	struct kv_stats st;
	struct st_diag d;
	int32_t status[NSEQ];
	int n_null = 0;
	char spill[4200];

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.n_pages, 32);
	assert_int_equal(st.n_slots, 256);
	assert_int_equal(st.slot_bytes, 4096);
	assert_int_equal(st.spill_budget_bytes, 1u << 20);
	interleave(c, seqs);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_true(st.spill_pages_total >= 128 - 32);
	assert_true(st.restore_pages_total > 0);
	assert_int_equal(st.spill_bytes_total, st.spill_pages_total * 4096);
	assert_int_equal(st.restore_bytes_total,
			 st.restore_pages_total * 4096);
	assert_true(st.spill_ns_total > 0 && st.restore_ns_total > 0);
	assert_int_equal(st.restore_failures, 0);
	assert_int_equal(st.pages_spilled, 128 - st.pages_used);
	assert_int_equal(st.n_pinned, 0);
	printf("spill %s: %llu pages written, %llu read back\n",
	       st.spill_direct ? "O_DIRECT" : "buffered",
	       (unsigned long long)st.spill_pages_total,
	       (unsigned long long)st.restore_pages_total);
	/* spilled rows read NULL until restored */
	for (int i = 0; i < NSEQ; i++)
		n_null += kv_client_row(c, seqs[i], 0, 0) == NULL;
	assert_true(n_null >= NSEQ / 2);
	/* every sequence back (one at a time: each evicts others) */
	for (int i = 0; i < NSEQ; i++) {
		assert_int_equal(kv_client_seq_restore(c, 1, &seqs[i], status,
						       &d),
				 0);
		assert_int_equal(status[0], 0);
		assert_int_equal(rows_differ(c, seqs[i], ROWS, (uint32_t)i + 1),
				 0);
	}
	/* all at once does not fit: refused as a whole, names the budgets */
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_client_seq_restore(c, NSEQ, seqs, status, &d),
			 -ST_E_BUDGET);
	for (int i = 0; i < NSEQ; i++)
		assert_true(status[i] == -ST_E_BUDGET || status[i] == 0);
	assert_non_null(strstr(d.msg, "--spill-budget"));
	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_client_seq_free(c, seqs[i]), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_spilled, 0);
	assert_int_equal(st.pages_used, 0);
	/* a clean stop removes the spill file */
	snprintf(spill, sizeof(spill), "%s/kvd.spill", k->run_dir);
	assert_true(st_path_exists(spill));
	kv_client_close(c);
	assert_true(WIFEXITED(kvd_kill(k, SIGTERM)));
	assert_false(st_path_exists(spill));
}

static void test_corrupt(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t seqs[NSEQ], victim = NSEQ, e = 0;
	uint64_t slot_bytes = 0;
	struct kv_stats st;
	struct st_diag d;
	char spill[4200], want[64];
	int32_t status[NSEQ];

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	interleave(c, seqs);
	/* a spilled page of stream 0, page 3 of some sequence */
	for (int i = 0; i < NSEQ && victim == NSEQ; i++) {
		e = kvd_table_entry(k->name, seqs[i], 0, 3, &slot_bytes);
		if (kv_entry_is_spilled(e))
			victim = (uint32_t)i;
	}
	assert_int_not_equal(victim, NSEQ);
	assert_int_equal(slot_bytes, 4096);
	snprintf(spill, sizeof(spill), "%s/kvd.spill", k->run_dir);
	assert_int_equal(kvd_flip_byte(spill, kv_entry_slot(e) * slot_bytes +
						      1000),
			 0);
	/* the batch: the victim fails, each other one on its own is fine */
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_client_seq_pin(c, 1, &seqs[victim], status, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(status[0], -ST_E_CHECKSUM);
	snprintf(want, sizeof(want), "sequence 0x%x", seqs[victim]);
	assert_non_null(strstr(d.msg, want));
	assert_non_null(strstr(d.msg, "page 3 of stream 0"));
	assert_non_null(strstr(d.msg, "checksum mismatch"));
	assert_int_equal(kvd_table_entry(k->name, seqs[victim], 0, 3, NULL),
			 KV_PAGE_LOST);
	{
		uint32_t n = ROWS + 1;

		assert_int_equal(kv_client_seq_reserve(c, 1, &seqs[victim], &n,
						       &d),
				 -ST_E_CHECKSUM);
	}
	for (int i = 0; i < NSEQ; i++) {
		if ((uint32_t)i == victim)
			continue;
		assert_int_equal(kv_client_seq_restore(c, 1, &seqs[i], status,
						       &d),
				 0);
		assert_int_equal(rows_differ(c, seqs[i], ROWS, (uint32_t)i + 1),
				 0);
	}
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.restore_failures, 1);
	/* the failed one is freed like any other; kvd serves on */
	assert_int_equal(kv_client_seq_free(c, seqs[victim]), 0);
	assert_int_equal(kvd_ping(k->run_dir, 1000, NULL, NULL), 0);
	kv_client_close(c);
}

static void test_pinned_budget(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t a, b, x, n32 = 32, n65 = 65, n4 = 4;
	struct st_diag d;

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	/* two running sequences of 8 pages per stream: 32 pages, all */
	assert_int_equal(kv_client_seq_create(c, &a, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &b, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &x, &d), 0);
	assert_int_equal(kv_client_seq_pin(c, 1, &a, NULL, &d), 0);
	assert_int_equal(kv_client_seq_pin(c, 1, &b, NULL, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &a, &n32, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &b, &n32, &d), 0);
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_client_seq_reserve(c, 1, &x, &n4, &d),
			 -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "--kv-budget"));
	assert_non_null(strstr(d.msg, "--spill-budget"));
	assert_non_null(strstr(d.msg, "2 sequences are pinned"));
	/* longer than the limit (--max-rows-per-seq 64) */
	assert_int_equal(kv_client_seq_reserve(c, 1, &a, &n65, &d),
			 -ST_E_LIMIT);
	assert_int_equal(kv_client_seq_rows(c, a), 32);
	/* unpinned, b may go to the file */
	assert_int_equal(kv_client_seq_unpin(c, 1, &b, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &x, &n4, &d), 0);
	assert_null(kv_client_row(c, b, 0, 0));
	assert_non_null(kv_client_row(c, a, 0, 0));
	kv_client_close(c);
}

static void test_prefetch(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t seqs[NSEQ];
	struct kv_stats st0, st;
	struct st_diag d;
	int32_t status[2];
	uint64_t t0;

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	interleave(c, seqs);
	/* all but 2 go: the pool has room for exactly what those 2 have
	 * in the spill file */
	for (int i = 2; i < NSEQ; i++)
		assert_int_equal(kv_client_seq_free(c, seqs[i]), 0);
	assert_int_equal(kv_client_seq_resident(c, seqs[0]), 0);
	assert_int_equal(kv_client_seq_resident(c, seqs[1]), 0);
	assert_int_equal(kv_client_stats(c, &st0), 0);
	assert_int_equal(kv_client_seq_prefetch(c, 2, seqs, status, &d), 0);
	assert_int_equal(status[0], 0);
	assert_int_equal(status[1], 0);
	/* no more requests: kvd restores between them all the same */
	t0 = st_now_ns();
	while (kv_client_seq_resident(c, seqs[0]) != 1 ||
	       kv_client_seq_resident(c, seqs[1]) != 1) {
		assert_true(st_now_ns() - t0 < 5000000000ull);
		st_sleep_ns(1000000);
	}
	for (int i = 0; i < 2; i++)
		assert_int_equal(rows_differ(c, seqs[i], ROWS, (uint32_t)i + 1),
				 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.spill_pages_total, st0.spill_pages_total);
	assert_true(st.restore_pages_total > st0.restore_pages_total);
	/* no room: a prefetch restores nothing (the pin will) */
	{
		uint32_t x, n4 = 4, spilled = NSEQ;

		assert_int_equal(kv_client_seq_create(c, &x, &d), 0);
		assert_int_equal(kv_client_seq_pin(c, 1, &x, NULL, &d), 0);
		assert_int_equal(kv_client_seq_reserve(c, 1, &x, &n4, &d), 0);
		for (int i = 0; i < 2; i++)
			if (kv_client_seq_resident(c, seqs[i]) == 0)
				spilled = (uint32_t)i;
		assert_int_not_equal(spilled, NSEQ);
		assert_int_equal(kv_client_seq_prefetch(c, 1, &seqs[spilled],
							status, &d),
				 0);
		st_sleep_ns(200 * 1000 * 1000);
		assert_int_equal(kv_client_seq_resident(c, seqs[spilled]), 0);
		assert_int_equal(kv_client_seq_pin(c, 1, &seqs[spilled], status,
						   &d),
				 0);
		assert_int_equal(kv_client_seq_resident(c, seqs[spilled]), 1);
		assert_int_equal(rows_differ(c, seqs[spilled], ROWS,
					     spilled + 1),
				 0);
	}
	/* errors are per sequence */
	{
		uint32_t two[2] = { seqs[1], seqs[5] };

		assert_int_equal(kv_client_seq_prefetch(c, 2, two, status, &d),
				 -ST_E_NOTFOUND);
		assert_int_equal(status[0], 0);
		assert_int_equal(status[1], -ST_E_NOTFOUND);
	}
	assert_int_equal(kv_client_seq_resident(c, seqs[5]), -ST_E_NOTFOUND);
	kv_client_close(c);
}

/* Rows [0, rows) of x hold tag's pattern and x has no spilled page. */
static void assert_intact(struct kv_client *c, uint32_t x, uint32_t rows,
			  uint32_t tag)
{
	assert_int_equal(kv_client_seq_resident(c, x), 1);
	assert_int_equal(rows_differ(c, x, rows, tag), 0);
}

/* Waits up to 5 s for seq to be whole in the pool; 1 when it is. */
static int wait_resident(struct kv_client *c, uint32_t seq)
{
	uint64_t t0 = st_now_ns();

	while (kv_client_seq_resident(c, seq) != 1) {
		if (st_now_ns() - t0 > 5000000000ull)
			return 0;
		st_sleep_ns(1000000);
	}
	return 1;
}

static void test_restore_ahead(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t seqs[NSEQ], x, n8 = 8;
	struct kv_stats st0, st;
	struct st_diag d;
	int32_t status[2];

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	/* 8 sequences of 16 pages in a pool of 32: 6 or more spilled */
	interleave(c, seqs);
	assert_int_equal(kv_client_seq_resident(c, seqs[0]), 0);
	/* the step now running: x, 4 pages, pinned */
	assert_int_equal(kv_client_seq_create(c, &x, &d), 0);
	assert_int_equal(kv_client_seq_pin(c, 1, &x, NULL, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &x, &n8, &d), 0);
	for (uint32_t r = 0; r < 8; r++)
		write_row(c, x, r, 99);
	assert_int_equal(kv_client_stats(c, &st0), 0);
	/* seqs[0] needs 16 pages + the headroom (32 / 8 + 2): only by
	 * spilling an idle sequence, never x */
	assert_int_equal(kv_client_seq_restore_ahead(c, 1, &seqs[0], status,
						     &d),
			 0);
	assert_int_equal(status[0], 0);
	assert_true(wait_resident(c, seqs[0]));
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_true(st.spill_pages_total > st0.spill_pages_total);
	assert_true(st.restore_pages_total >= st0.restore_pages_total + 16);
	assert_intact(c, x, 8, 99);
	assert_int_equal(rows_differ(c, seqs[0], ROWS, 1), 0);
	/* pinned now: x (4 pages) and seqs[0] (16), 12 pages left, fewer
	 * than seqs[1]'s 16 and the headroom: given up, nothing pinned
	 * moves, seqs[1] stays in the file */
	assert_int_equal(kv_client_seq_pin(c, 1, &seqs[0], NULL, &d), 0);
	assert_int_equal(kv_client_seq_resident(c, seqs[1]), 0);
	assert_int_equal(kv_client_seq_restore_ahead(c, 1, &seqs[1], status,
						     &d),
			 0);
	st_sleep_ns(200 * 1000 * 1000);
	assert_int_equal(kv_client_seq_resident(c, seqs[1]), 0);
	assert_intact(c, x, 8, 99);
	assert_intact(c, seqs[0], ROWS, 1);
	/* a request for an unknown sequence: its status, the others go on */
	{
		uint32_t two[2] = { seqs[1], 0x7fff1234u };

		assert_int_equal(kv_client_seq_restore_ahead(c, 2, two, status,
							     &d),
				 -ST_E_NOTFOUND);
		assert_int_equal(status[0], 0);
		assert_int_equal(status[1], -ST_E_NOTFOUND);
	}
	/* unpinned: every sequence comes back whole, one at a time */
	assert_int_equal(kv_client_seq_unpin(c, 1, &seqs[0], &d), 0);
	assert_int_equal(kv_client_seq_unpin(c, 1, &x, &d), 0);
	for (int i = 0; i < NSEQ; i++) {
		assert_int_equal(kv_client_seq_restore(c, 1, &seqs[i], status,
						       &d),
				 0);
		assert_int_equal(rows_differ(c, seqs[i], ROWS, (uint32_t)i + 1),
				 0);
	}
	assert_int_equal(kv_client_seq_restore(c, 1, &x, status, &d), 0);
	assert_int_equal(rows_differ(c, x, 8, 99), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.restore_failures, 0);
	kv_client_close(c);
}

/* A plan's sequences already back are kept from being spilled for the
 * plan's others: with room for one sequence and the headroom, a plan of
 * two restores the first and gives the second up (a restore that spilled
 * the first to bring back the second would gain nothing). */
static void test_restore_ahead_plan(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	uint32_t seqs[NSEQ];
	struct st_diag d;
	int32_t status[2];

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	interleave(c, seqs);
	assert_int_equal(kv_client_seq_resident(c, seqs[0]), 0);
	assert_int_equal(kv_client_seq_resident(c, seqs[1]), 0);
	assert_int_equal(kv_client_seq_restore_ahead(c, 2, seqs, status, &d),
			 0);
	assert_true(wait_resident(c, seqs[0]));
	st_sleep_ns(200 * 1000 * 1000);
	assert_int_equal(kv_client_seq_resident(c, seqs[0]), 1);
	assert_int_equal(kv_client_seq_resident(c, seqs[1]), 0);
	assert_int_equal(rows_differ(c, seqs[0], ROWS, 1), 0);
	/* a new plan replaces it: seqs[0] is fair game now */
	assert_int_equal(kv_client_seq_restore_ahead(c, 1, &seqs[1], status,
						     &d),
			 0);
	assert_true(wait_resident(c, seqs[1]));
	assert_int_equal(kv_client_seq_resident(c, seqs[0]), 0);
	assert_int_equal(rows_differ(c, seqs[1], ROWS, 2), 0);
	kv_client_close(c);
}

/* Restore ahead of admission: a published prefix spilled by a sequence
 * that took the whole pool comes back once named (kv_client_prefix_keys:
 * the keys the lookup computes), so the lookup maps it without a restore
 * of its own; an empty plan drops the holds. */
static void test_prefix_ahead(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	int32_t ids[13];
	uint32_t a, y, n13 = 13, n64 = 64, cached, n3 = 3, spilled = 99;
	uint64_t keys[16], t0;
	struct kv_stats st;
	struct st_diag d;

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	for (int i = 0; i < 13; i++)
		ids[i] = 1000 + i;
	/* 3 groups (12 rows) published, then idle */
	assert_int_equal(kv_client_seq_create_prefix(c, ids, 13, &a, &cached,
						     &d),
			 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &a, &n13, &d), 0);
	for (uint32_t r = 0; r < 13; r++)
		write_row(c, a, r, 7);
	assert_int_equal(kv_client_seq_publish(c, a, ids, 13, &d), 3);
	assert_int_equal(kv_client_seq_free(c, a), 0);
	/* a sequence of the whole pool (32 pages): the idle groups spill */
	assert_int_equal(kv_client_seq_create(c, &y, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &y, &n64, &d), 0);
	assert_int_equal(kv_client_seq_free(c, y), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_true(st.spill_pages_total >= 6);
	/* the keys of a lookup: (n - 1) / page_rows full pages, at most cap */
	assert_int_equal(kv_client_prefix_keys(c, ids, 12, keys, 16), 2);
	assert_int_equal(kv_client_prefix_keys(c, ids, 13, keys, 1), 1);
	assert_int_equal(kv_client_prefix_keys(c, ids, 13, keys, 16), 3);
	assert_int_equal(kv_client_prefix_ahead(c, 1, &n3, keys, &spilled, &d),
			 0);
	assert_int_equal(spilled, 3);
	t0 = st_now_ns();
	do {
		assert_int_equal(kv_client_stats(c, &st), 0);
		if (st.prefix_ahead_groups == 3)
			break;
		st_sleep_ns(1000000);
	} while (st_now_ns() - t0 < 5000000000ull);
	assert_int_equal(st.prefix_ahead_groups, 3);
	assert_int_equal(st.prefix_ahead_bytes, 3 * 2 * st.slot_bytes);
	/* the same plan again: all three held, none to restore */
	assert_int_equal(kv_client_prefix_ahead(c, 1, &n3, keys, &spilled, &d),
			 3);
	assert_int_equal(spilled, 0);
	/* the lookup maps them without reading the file, rows intact */
	assert_int_equal(kv_client_seq_create_prefix(c, ids, 13, &a, &cached,
						     &d),
			 0);
	assert_int_equal(cached, 12);
	assert_int_equal(rows_differ(c, a, 12, 7), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.prefix_lookup_restores, 0);
	assert_int_equal(st.restore_failures, 0);
	/* no plan: nothing held */
	assert_int_equal(kv_client_prefix_ahead(c, 0, &n3, keys, &spilled, &d),
			 0);
	assert_int_equal(spilled, 0);
	assert_int_equal(rows_differ(c, a, 12, 7), 0);
	kv_client_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_interleaved, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_corrupt, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pinned_budget, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_prefetch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_restore_ahead, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_restore_ahead_plan, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_prefix_ahead, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
