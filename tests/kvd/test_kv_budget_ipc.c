/*
 * test_kv_budget_ipc.c — the real kvd under one memory budget (issue 24
 * items 2 and 4; suites ipc and fault).  kvd runs with --memory-budget
 * and STRATA_LEDGER_FLIP_MS=50, the test process holds the ledger's
 * experts side (st_ledger_open as ST_LEDGER_EXPERTS, using nothing), so
 * the arbiter moves a step back and forth every ~100 ms while a client
 * runs several sequences one step at a time (pin, reserve a row, write
 * it, unpin).  Checked: every row of a pinned sequence is resident and as
 * written at every step (no pinned page spilled), every row of every
 * sequence reads back as written at the end (no spilled page lost), kvd's
 * used bytes are within its target once a shrink settles, the segment's
 * allocated blocks go down after a shrink; then, three times, kvd is
 * killed with SIGKILL while a shrink is due, started again: it adopts
 * pool and spill file, keeps its target and gets within it, and every row
 * reads back as written.  The floor: --budget, or one sequence's pages
 * without it; a --budget above --memory-budget is refused; the least
 * --memory-budget kvd names is the same below it, and enough.
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "kv_test_util.h"
#include "st_ledger.h"
#include "st_util.h"

#define TIMEOUT_MS 5000
#define NSEQ 6
#define ROWS 32
#define KIB 1024ull
#define MS 1000000ull
#ifndef KILLS
#define KILLS 3
#endif

/* 2 streams, pages of 4 rows: 4 KiB (+ 2 KiB used of 4) per page */
static const uint32_t rb[2] = { 1024, 512 };

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

static int setup(void **state)
{
	static int n;
	static const char *extra[] = { "--memory-budget", "256KiB", NULL };
	struct kvd_inst *k = kvd_fixture_new("mb", n++);

	if (!k)
		return -1;
	/* M = 64 pages of 4 KiB; the KV floor 16 pages (one sequence of
	 * 32 rows in 2 streams); 6 sequences need 96 */
	snprintf(k->budget, sizeof(k->budget), "64KiB");
	snprintf(k->spill_budget, sizeof(k->spill_budget), "1MiB");
	snprintf(k->max_rows, sizeof(k->max_rows), "64");
	k->extra[0] = extra[0];
	k->extra[1] = extra[1];
	k->extra[2] = NULL;
	setenv("STRATA_LEDGER_FLIP_MS", "50", 1);
	setenv("STRATA_LEDGER_STEP", "64KiB", 1);
	*state = k;
	return 0;
}

static int teardown(void **state)
{
	struct kvd_inst *k = *state;
	char name[128];

	/* a test that failed midway left its side of the ledger */
	if (st_shm_name(k->name, ST_LEDGER_KIND, name, sizeof(name)) == 0)
		shm_unlink(name);
	return kvd_fixture_teardown(state);
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

/* Rows [0, rows) resident and as written (fails the test otherwise). */
static void check_rows(struct kv_client *c, uint32_t seq, uint32_t rows,
		       uint32_t tag, const char *when)
{
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < rows; r++) {
			const uint8_t *p = kv_client_row(c, seq, (int)s, r);

			if (!p)
				fail_msg("%s: row %u of stream %u of sequence "
					 "tag %u is not resident", when, r, s,
					 tag);
			for (uint32_t i = 0; i < rb[s]; i++)
				if (p[i] != pattern(tag, s, r, i))
					fail_msg("%s: row %u of stream %u of "
						 "sequence tag %u differs at "
						 "byte %u", when, r, s, tag, i);
		}
}

/* Bytes the kv segment holds in RAM (tmpfs blocks). */
static uint64_t seg_bytes(const char *name)
{
	char path[256];
	struct stat st;

	kvd_segment_path(name, path, sizeof(path));
	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_blocks * 512;
}

/* What the samples taken during the run saw. */
struct watch {
	uint64_t over_since;    /* kv above target + over since (0: no) */
	uint64_t hi_blocks;     /* segment bytes seen at the high target */
	uint64_t hi_target, lo_target;
	int saw_settled_shrink; /* used <= a target below an earlier one */
	int saw_rss_drop;       /* bytes down by half the step after one */
	uint64_t samples;
};

static void sample(struct st_ledger *l, const char *name, struct watch *w)
{
	struct st_ledger_view v;
	uint64_t now = st_now_ns(), t, used, over, blocks;

	st_ledger_view(l, &v);
	t = v.side[ST_LEDGER_KV].target;
	used = v.side[ST_LEDGER_KV].used;
	over = v.side[ST_LEDGER_KV].over;
	w->samples++;
	/* kvd's tick is every 20 ms: a shrink settles well within 1 s */
	if (used > t + over) {
		if (!w->over_since)
			w->over_since = now;
		else if (now - w->over_since > 1000 * MS)
			fail_msg("kv holds %llu bytes over its target of %llu "
				 "for more than 1 s", (unsigned long long)used,
				 (unsigned long long)t);
		return;
	}
	w->over_since = 0;
	blocks = seg_bytes(name);
	if (t > w->hi_target) {
		w->hi_target = t;
		w->hi_blocks = blocks;
	} else if (t == w->hi_target) {
		w->hi_blocks = ST_MAX(w->hi_blocks, blocks);
	} else if (v.pending == 0) {
		w->saw_settled_shrink = 1;
		w->lo_target = t;
		/* the pages above the lower target went back to the OS */
		if (blocks + (w->hi_target - t) / 2 <= w->hi_blocks)
			w->saw_rss_drop = 1;
	}
}

static struct kv_client *open_declared(struct kvd_inst *k)
{
	struct kv_stream_decl sd[2] = { { rb[0], 1, 0, 0 },
					{ rb[1], 1, 0, 0 } };
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };

	if (kv_client_open(k->run_dir, k->name, "budget-test", TIMEOUT_MS, &c,
			   &d) < 0)
		fail_msg("open: %s", d.msg);
	if (kv_client_declare_model(c, 2, sd, 4, 0x52, &d) < 0)
		fail_msg("declare: %s", d.msg);
	return c;
}

/* Pin, restore, compare and unpin each sequence in turn. */
static void read_back(struct kv_client *c, const uint32_t *seqs,
		      struct st_ledger *l, const char *name, struct watch *w,
		      const char *when)
{
	struct st_diag d;

	for (int i = 0; i < NSEQ; i++) {
		if (kv_client_seq_pin(c, 1, &seqs[i], NULL, &d) < 0)
			fail_msg("%s: pin seq %d: %s", when, i, d.msg);
		check_rows(c, seqs[i], ROWS, (uint32_t)i + 1, when);
		assert_int_equal(kv_client_seq_unpin(c, 1, &seqs[i], &d), 0);
		sample(l, name, w);
	}
}

static void test_flip(void **state)
{
	struct kvd_inst *k = *state;
	struct st_ledger *l = NULL;
	struct st_ledger_view v;
	struct kv_stats st;
	struct st_diag d = { { 0 } };
	struct watch w;
	struct kv_client *c;
	uint32_t seqs[NSEQ];
	uint64_t t0, moves0;

	memset(&w, 0, sizeof(w));
	/* the experts side: floor 64 KiB, cap 192 KiB, slots of 4 KiB */
	if (st_ledger_open(&l, k->name, ST_LEDGER_EXPERTS, 256 * KIB, 64 * KIB,
			   192 * KIB, 4 * KIB, &d) < 0)
		fail_msg("ledger: %s", d.msg);
	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k); /* the pool: kvd joins the ledger */
	st_ledger_view(l, &v);
	assert_true(v.side[ST_LEDGER_KV].live);
	assert_int_equal(v.side[ST_LEDGER_KV].floor, 64 * KIB);
	assert_int_equal(v.side[ST_LEDGER_KV].cap, 256 * KIB);
	assert_int_equal(v.side[ST_LEDGER_KV].unit, 4 * KIB);
	assert_int_equal(v.total, 256 * KIB);
	moves0 = v.n_moves;

	/* the decode loop, one sequence at a time, a little slower than
	 * the flips so that several land mid-run */
	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_client_seq_create(c, &seqs[i], &d), 0);
	for (uint32_t r = 0; r < ROWS; r++)
		for (int i = 0; i < NSEQ; i++) {
			uint32_t n = r + 1;

			if (kv_client_seq_pin(c, 1, &seqs[i], NULL, &d) < 0 ||
			    kv_client_seq_reserve(c, 1, &seqs[i], &n, &d) < 0)
				fail_msg("step %u seq %d: %s", r, i, d.msg);
			st_sleep_ns(3 * MS); /* a flip may shrink kvd now */
			/* pinned: every row resident and intact */
			check_rows(c, seqs[i], r, (uint32_t)i + 1, "pinned");
			write_row(c, seqs[i], r, (uint32_t)i + 1);
			assert_int_equal(kv_client_seq_unpin(c, 1, &seqs[i],
							     &d),
					 0);
			sample(l, k->name, &w);
		}
	read_back(c, seqs, l, k->name, &w, "after the run");
	/* idle a while: shrinks settle with nothing in flight */
	for (t0 = st_now_ns(); st_now_ns() - t0 < 1500 * MS;) {
		st_sleep_ns(5 * MS);
		sample(l, k->name, &w);
	}
	st_ledger_view(l, &v);
	print_message("%llu moves, %llu samples; kv target between %llu and "
		      "%llu bytes\n",
		      (unsigned long long)(v.n_moves - moves0),
		      (unsigned long long)w.samples,
		      (unsigned long long)w.lo_target,
		      (unsigned long long)w.hi_target);
	assert_true(v.n_moves - moves0 >= 6);
	assert_true(w.saw_settled_shrink);
	assert_true(w.saw_rss_drop);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_true(st.spill_pages_total > 0);
	assert_int_equal(st.restore_failures, 0);

	/* KILLS times: kill -9 while kvd has to shrink (a move from kv
	 * pending, its used bytes above its target), start again.  The test
	 * process runs the arbiter too (either side's tick may), so a move
	 * it starts leaves kvd up to one tick of its own with more than the
	 * target; a request wakes kvd and the kill comes 0 to 25 ms later.
	 * kvd acts at most every 20 ms and waits up to 100 ms for a request,
	 * so right after the loop's requests that kill nearly always finds
	 * it before its shrink; every other cycle the request comes 30 ms
	 * after the last one (kvd's tick due: it shrinks right after the
	 * reply) and the kill 0 to 3 ms later, during kvd's spill writes or
	 * just after.  Each cut point of the bookkeeping itself:
	 * test_kv_spill test_adopt_cut. */
	for (int cycle = 0; cycle < KILLS; cycle++) {
		int killed = 0;
		uint32_t j = 0;

		for (t0 = st_now_ns(); st_now_ns() - t0 < 5000 * MS; j++) {
			st_ledger_tick(l, st_now_ns(), NULL);
			st_ledger_view(l, &v);
			if (v.pending && v.pend_from == ST_LEDGER_KV &&
			    v.side[ST_LEDGER_KV].used >
				    v.side[ST_LEDGER_KV].target) {
				/* a request wakes kvd: its tick shrinks */
				if (cycle % 2)
					st_sleep_ns(30 * MS);
				assert_int_equal(kv_client_stats(c, &st), 0);
				st_sleep_ns((st_now_ns() / 1000) %
					    (cycle % 2 ? 3000 : 25000) * 1000);
				kvd_kill(k, SIGKILL);
				killed = 1;
				break;
			}
			/* restores fill whatever target kv has */
			if (kv_client_seq_pin(c, 1, &seqs[j % NSEQ], NULL,
					      &d) == 0)
				kv_client_seq_unpin(c, 1, &seqs[j % NSEQ], &d);
		}
		assert_true(killed);
		print_message("killed with kv at %llu bytes, target %llu\n",
			      (unsigned long long)v.side[ST_LEDGER_KV].used,
			      (unsigned long long)v.side[ST_LEDGER_KV].target);
		assert_int_equal(kvd_start(k, NULL), 0);
		/* the restarted kvd keeps its side's target, gets within it */
		for (t0 = st_now_ns();; st_sleep_ns(10 * MS)) {
			st_ledger_view(l, &v);
			if (v.side[ST_LEDGER_KV].live &&
			    v.side[ST_LEDGER_KV].used <=
				    v.side[ST_LEDGER_KV].target)
				break;
			if (st_now_ns() - t0 > 3000 * MS)
				fail_msg("restarted kvd: %llu bytes used, "
					 "target %llu",
					 (unsigned long long)
						 v.side[ST_LEDGER_KV].used,
					 (unsigned long long)
						 v.side[ST_LEDGER_KV].target);
		}
		memset(&w, 0, sizeof(w));
		read_back(c, seqs, l, k->name, &w, "after kill -9");
		assert_int_equal(kv_client_stats(c, &st), 0);
		assert_int_equal(st.restore_failures, 0);
	}
	for (int i = 0; i < NSEQ; i++)
		assert_int_equal(kv_client_seq_free(c, seqs[i]), 0);
	kv_client_close(c);
	/* a clean stop leaves the side; the last one out removes it */
	assert_int_equal(WEXITSTATUS(kvd_kill(k, SIGTERM)), 0);
	st_ledger_close(l);
	assert_int_equal(st_ledger_read(k->name, &v, &d), -ENOENT);
}

/* Without --budget the KV floor is one sequence of --max-rows-per-seq
 * (16 pages per stream x 2 streams x 4 KiB); a --budget above
 * --memory-budget, another --memory-budget than a live expertd's and
 * --memory-budget 0,
 * are refused before anything starts. */
static void test_floor(void **state)
{
	struct kvd_inst *k = *state;
	struct st_ledger *l = NULL;
	struct st_ledger_view v;
	struct st_diag d = { { 0 } };
	struct kv_client *c;

	k->budget[0] = 0;
	if (st_ledger_open(&l, k->name, ST_LEDGER_EXPERTS, 256 * KIB, 64 * KIB,
			   128 * KIB, 4 * KIB, &d) < 0)
		fail_msg("ledger: %s", d.msg);
	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_declared(k);
	st_ledger_view(l, &v);
	assert_int_equal(v.side[ST_LEDGER_KV].floor, 128 * KIB);
	assert_int_equal(v.side[ST_LEDGER_KV].target, 128 * KIB);
	/* STATS: the share the target allows, of a pool made for M */
	{
		struct kv_stats st;

		assert_int_equal(kv_client_stats(c, &st), 0);
		assert_int_equal(st.budget_bytes, 128 * KIB);
		assert_int_equal(st.n_pages, 64);
	}
	kv_client_close(c);
	assert_int_equal(WEXITSTATUS(kvd_kill(k, SIGTERM)), 0);
	st_ledger_close(l);
	snprintf(k->budget, sizeof(k->budget), "512KiB");
	assert_int_equal(kvd_run_expect_exit(k, k->run_dir, 5000), 2);
	/* a live experts side with another total: refused at start (it
	 * was only at the first DECLARE, when kvd joins the ledger) */
	k->budget[0] = 0;
	if (st_ledger_open(&l, k->name, ST_LEDGER_EXPERTS, 512 * KIB, 64 * KIB,
			   128 * KIB, 4 * KIB, &d) < 0)
		fail_msg("ledger: %s", d.msg);
	assert_int_equal(kvd_run_expect_exit(k, k->run_dir, 5000), 1);
	st_ledger_close(l);
	/* 0 is refused (leaving the option out is the fixed --budget) */
	k->extra[1] = "0";
	assert_int_equal(kvd_run_expect_exit(k, k->run_dir, 5000), 2);
}

/* The least --memory-budget kvd names is both floors, its own one
 * sequence of --max-rows-per-seq rows (64: 16 pages per stream x 2
 * streams x 4 KiB = 128 KiB) whatever the pool made for M holds (100 KiB:
 * 12 pages per stream, once named as 96 KiB + 64 KiB), plus the experts'
 * 64 KiB: 192 KiB for every budget below it, and that one is accepted. */
static void test_least(void **state)
{
	struct kvd_inst *k = *state;
	static const char *asks[] = { "100KiB", "196607", "196608" };
	struct st_ledger_view v;

	k->budget[0] = 0;
	for (int i = 0; i < 3; i++) {
		struct st_ledger *l = NULL;
		struct st_diag d = { { 0 } };
		struct kv_client *c = NULL;
		struct kv_stream_decl sd[2] = { { rb[0], 1, 0, 0 },
						{ rb[1], 1, 0, 0 } };
		uint64_t t = 0;
		int r;

		assert_int_equal(st_parse_size(asks[i], &t), 0);
		if (st_ledger_open(&l, k->name, ST_LEDGER_EXPERTS, t, 64 * KIB,
				   64 * KIB, 4 * KIB, &d) < 0)
			fail_msg("ledger: %s", d.msg);
		k->extra[1] = asks[i];
		assert_int_equal(kvd_start(k, NULL), 0);
		if (kv_client_open(k->run_dir, k->name, "budget-test",
				   TIMEOUT_MS, &c, &d) < 0)
			fail_msg("open: %s", d.msg);
		r = kv_client_declare_model(c, 2, sd, 4, 0x52, &d);
		if (i < 2) {
			if (r == 0 || !strstr(d.msg, "give at least 192.00 KiB "
					      "(196608 bytes)"))
				fail_msg("--memory-budget %s: %d, %s", asks[i],
					 r, d.msg);
		} else {
			if (r < 0)
				fail_msg("--memory-budget %s (the least): %s",
					 asks[i], d.msg);
			st_ledger_view(l, &v);
			assert_int_equal(v.side[ST_LEDGER_KV].floor, 128 * KIB);
			assert_int_equal(v.side[ST_LEDGER_KV].target,
					 128 * KIB);
		}
		kv_client_close(c);
		assert_int_equal(WEXITSTATUS(kvd_kill(k, SIGTERM)), 0);
		st_ledger_close(l);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_flip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_floor, setup, teardown),
		cmocka_unit_test_setup_teardown(test_least, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
