/*
 * test_step_timeline.c — the step timeline of issue 25 (cw_steptime.h,
 * cw_timeline.h, the counters es_client and expertd's loaders keep) on a
 * tiny fixture run: ../shared tiny-deepseek-v41 converted to a store, a
 * real expertd at --host-budget 25 % (so experts miss, load and are
 * evicted), 12 greedy decode steps with a snapshot around each.
 *
 * Checked per token: every time column is non-negative, the columns add
 * up to the wall time within 5 % (the "other" column, what no counter
 * explains, is small: over the whole run it must stay under 5 % of the
 * wall time), dense, experts and head each took time.  Over the run:
 * expertd loaded records, its loaders' CPU and checksum time are
 * positive and no larger than the loads' wall time, load_mb is loads x
 * the record size, the waits are split into demand / in flight as the
 * counts say, and expertd's /proc counters were read (CPU > 0).  The phase
 * clock alone: time spun in a phase is counted there (a lower bound from
 * the same clock), and the phases never add up to more than the wall
 * time.  The TSV has as many fields per row as its header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv41.h"
#include "cw_dsv.h"
#include "cw_timeline.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "es_convert.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define N_TOK 12

static void spin_ns(uint64_t ns)
{
	uint64_t t0 = st_now_ns();

	while (st_now_ns() - t0 < ns)
		;
}

/* The phase clock without a client. */
static void test_phase_clock(void)
{
	struct cw_steptime t;
	uint64_t t0, wall;

	cw_steptime_init(&t, NULL);
	cw_steptime_phase(NULL, CW_PHASE_DENSE); /* a no-op */
	t0 = st_now_ns();
	cw_steptime_phase(&t, CW_PHASE_DENSE);
	spin_ns(3000000);
	cw_steptime_phase(&t, CW_PHASE_EXPERTS);
	spin_ns(2000000);
	cw_steptime_phase(&t, CW_PHASE_HEAD);
	spin_ns(1000000);
	cw_steptime_phase(&t, CW_PHASE_NONE);
	spin_ns(1000000); /* not counted */
	wall = st_now_ns() - t0;
	CHECK(t.ns[CW_PHASE_DENSE] >= 3000000 &&
	      t.ns[CW_PHASE_EXPERTS] >= 2000000 &&
	      t.ns[CW_PHASE_HEAD] >= 1000000, "phases %llu %llu %llu ns",
	      (unsigned long long)t.ns[0], (unsigned long long)t.ns[1],
	      (unsigned long long)t.ns[2]);
	CHECK(t.ns[0] + t.ns[1] + t.ns[2] + 1000000 <= wall,
	      "phases add up to more than the wall time less the uncounted "
	      "1 ms");
}

static int count_fields(const char *line)
{
	int n = 1;

	for (; *line && *line != '\n'; line++)
		n += *line == '\t';
	return n;
}

/* Header and a row have the same number of fields. */
static void test_tsv(const struct cw_tl_row *row)
{
	char *buf = NULL, *nl;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	CHECK(f && cw_tl_write_header(f) == 0 &&
	      cw_tl_write_row(f, "25%", "first", 0, row) == 0, "write TSV");
	if (f)
		fclose(f);
	nl = buf ? strchr(buf, '\n') : NULL;
	CHECK(nl && count_fields(buf) == 23 && count_fields(nl + 1) == 23,
	      "TSV: %d header fields, %d row fields (want 23)",
	      buf ? count_fields(buf) : 0, nl ? count_fields(nl + 1) : 0);
	free(buf);
}

static void test_run(const char *store)
{
	const char *args[] = { "--store", store, "--host-budget", "25%",
			       "--engram-cache", "49000", NULL };
	struct st_test_inst inst;
	struct st_diag diag = { { 0 } };
	struct es_client *es = NULL;
	struct cw_dsv_model *m = NULL;
	struct cw_dsv_state *s = NULL;
	struct cw_steptime tl;
	struct cw_tl_snap a, b, first;
	struct cw_tl_row row, sum = { 0 };
	struct es_client_timing t0, t1;
	char msg[1024];
	float *logits = NULL;
	int32_t tok = 7;
	int V;

	st_test_inst_init(&inst, "steptl");
	if (dsvt_expertd_open(&inst, args, &es, msg, sizeof(msg)) < 0) {
		CHECK(0, "%s", msg);
		goto out;
	}
	if (cw_dsv_load_store(store, es, ST_DSV_REV_V41, CW_COMPUTE_REFERENCE,
			      &m, &diag) < 0) {
		CHECK(0, "cw_dsv_load_store: %s", diag.msg);
		goto out;
	}
	V = cw_dsv_config(m)->vocab_size;
	logits = malloc((size_t)V * sizeof(float));
	CHECK(logits && cw_dsv_state_new(m, N_TOK + 1, &s) == 0, "state");
	if (!logits || !s)
		goto out;
	cw_steptime_init(&tl, es);
	cw_dsv_set_steptime(s, &tl);
	es_client_timing(es, &t0);
	cw_tl_snap_take(&first, &tl, es);
	for (int i = 0; i < N_TOK; i++) {
		double sum_ms;

		cw_tl_snap_take(&a, &tl, es);
		if (cw_dsv_eval(m, s, &tok, 1, 0, logits, &diag) < 0) {
			CHECK(0, "eval %d: %s", i, diag.msg);
			goto out;
		}
		cw_tl_snap_take(&b, &tl, es);
		tok = dsvt_argmax(logits, V);
		cw_tl_row_make(&a, &b, &row);
		sum_ms = cw_tl_row_sum_ms(&row);
		printf("token %2d: wall %.3f ms = dense %.3f + experts %.3f + "
		       "head %.3f + stall %.3f / %.3f + ipc %.3f + other %.3f; "
		       "faults %llu, loads %llu\n", i, row.wall_ms,
		       row.dense_ms, row.experts_ms, row.head_ms,
		       row.stall_demand_ms, row.stall_inflight_ms, row.ipc_ms,
		       row.other_ms, (unsigned long long)row.minflt,
		       (unsigned long long)row.loads);
		CHECK(row.dense_ms >= 0 && row.experts_ms >= 0 &&
		      row.head_ms >= 0 && row.stall_demand_ms >= 0 &&
		      row.stall_inflight_ms >= 0 && row.ipc_ms >= 0 &&
		      row.kv_ms >= 0,
		      "token %d: a negative column", i);
		/* the columns are parts of the wall time: their sum may not
		 * exceed it (clock reads: a few us of slack) */
		CHECK(sum_ms <= row.wall_ms + 0.01 && row.other_ms >= -0.01,
		      "token %d: columns %.3f ms > wall %.3f ms", i, sum_ms,
		      row.wall_ms);
		CHECK(row.dense_ms > 0 && row.experts_ms > 0 &&
		      row.head_ms > 0, "token %d: dense %.3f experts %.3f "
		      "head %.3f ms", i, row.dense_ms, row.experts_ms,
		      row.head_ms);
		sum.wall_ms += row.wall_ms;
		sum.other_ms += row.other_ms;
	}
	cw_tl_row_make(&first, &b, &row);
	es_client_timing(es, &t1);
	printf("run: wall %.3f ms, other %.3f ms (%.2f %%); loads %llu (%.3f "
	       "MB), loader CPU %.3f ms, checksums %.3f ms, expertd CPU %.1f "
	       "ms, waits demand %llu in flight %llu\n", sum.wall_ms,
	       sum.other_ms, 100 * sum.other_ms / sum.wall_ms,
	       (unsigned long long)row.loads, row.load_mb, row.loader_cpu_ms,
	       row.checksum_ms, row.es_cpu_ms,
	       (unsigned long long)(t1.waits_demand - t0.waits_demand),
	       (unsigned long long)(t1.waits_inflight - t0.waits_inflight));
	CHECK(sum.other_ms <= 0.05 * sum.wall_ms, "other %.3f ms of %.3f ms: "
	      "the columns miss more than 5 %% of the wall time",
	      sum.other_ms, sum.wall_ms);
	/* 25 %: the pool misses, so expertd loads, on the loaders' CPU */
	CHECK(row.loads > 0, "no expert loaded at 25 %%");
	CHECK(row.load_mb > 0 &&
	      row.load_mb * 1e6 <= (double)row.loads *
			es_client_record_bytes(es),
	      "%.3f MB for %llu loads of %llu bytes", row.load_mb,
	      (unsigned long long)row.loads,
	      (unsigned long long)es_client_record_bytes(es));
	CHECK(row.loader_cpu_ms > 0 && row.checksum_ms > 0 &&
	      row.checksum_ms * 1e6 <= (double)(b.ts.load_ns -
						first.ts.load_ns) + 1e3,
	      "loader CPU %.3f ms, checksums %.3f ms, loads' wall %.3f ms",
	      row.loader_cpu_ms, row.checksum_ms,
	      (double)(b.ts.load_ns - first.ts.load_ns) / 1e6);
	CHECK(t1.waits_demand > t0.waits_demand &&
	      (t1.wait_demand_ns > t0.wait_demand_ns),
	      "a cold pool at 25 %% must wait on demand loads");
	CHECK((t1.waits_inflight == t0.waits_inflight) ==
		      (t1.wait_inflight_ns == t0.wait_inflight_ns),
	      "in-flight waits and their time disagree");
	CHECK(b.es.cpu_ns > 0 && b.self.cpu_ns > 0,
	      "/proc counters not read (expertd %llu, self %llu ns)",
	      (unsigned long long)b.es.cpu_ns,
	      (unsigned long long)b.self.cpu_ns);
	test_tsv(&row);
out:
	cw_dsv_state_free(s);
	free(logits);
	cw_dsv_free(m);
	es_client_close(es);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
}

int main(void)
{
	char dir[4096], tmp[4096], store[4200];

	test_phase_clock();
	st_test_fixture_model("tiny-deepseek-v41", dir, sizeof(dir));
	if (dsvt_convert_tmp(dir, tmp, sizeof(tmp), store, sizeof(store)))
		return 1;
	test_run(store);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}
