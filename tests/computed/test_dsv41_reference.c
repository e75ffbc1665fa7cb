/*
 * test_dsv41_reference.c — the DeepSeek-V4.1 forward pass (cw_dsv41.c)
 * against ../shared/fixtures/models/tiny-deepseek-v41 (its README: how the
 * reference was made, and the tolerances used here).
 *
 * Modes (argv[1]):
 *  noqat    QAT round trips off, reference_noqat.json, every case: at
 *           every prompt position (one-shot prefill) and every
 *           continuation step (decode one token at a time, teacher-forced
 *           with the reference's greedy tokens) each top10 logit within
 *           3e-4 (by id) and the lse within 3e-5; greedy tokens equal up
 *           to the first step whose top1_minus_top2 is below 1e-3.
 *  qat      QAT on (the model), reference.json, every case, the README's
 *           statistical rule over all compared positions: median of
 *           max|dlogit| <= 1e-3, >= 90 % of positions within 0.1, the
 *           same for the lse; greedy tokens compared up to the first step
 *           with top1_minus_top2 < 0.1.  Then p4's debug data: Engram hash
 *           row ids (exact), Engram gates, routed experts (as sets) and
 *           weights, index selections, candidate blocks, stream RMS; the
 *           share of positions that agree is printed, and must be >= 90 %
 *           (QAT rounding flips move single positions, README).
 *  nodebug  qat on a copy of the fixture whose reference.json lacks the
 *           optional "debug" block: those checks skipped with a message,
 *           the others as in qat (never a crash).
 * In noqat, qat and nodebug, as the other families' reference tests do:
 * at every prompt position the argmax is the reference's top-1 (or its
 * top-2 where the two are closer than twice the logit tolerance; with
 * QAT on, at >= 90 % of positions), and a free-running greedy generation
 * (the model's own token fed back) equals the reference's greedy ids up
 * to the step the gap rule above stops at.
 *  chunked  one-shot prefill of the longest case (p5, 169 tokens) against chunkings that
 *           cut ratio-2 groups and the window (1s; 3s; 2s; 7, 13, then
 *           5s; 64, 1, 104) and a prefill + decode: every position's
 *           logits bit-identical (QAT on and off).
 *  ced      the CED prefill shortcut, one-shot and chunked (chunks of 40)
 *           prefill then 8 decode steps: EXACT bit-identical to the full
 *           computation at the last position and every step; WINDOW
 *           (approximate by definition) finite and printed.
 *  replay   SWA bounded replay after a simulated prefix hit (window
 *           dropped): replaying the whole prefix is bit-identical to the
 *           full computation; replaying the last window is approximate
 *           (model doc 3.6) and must be closer to the full computation
 *           than no replay at all; both deviations are printed.
 *  provider the Engram row provider: a plugged-in one (counting, then
 *           forwarding to the in-memory tables) gives bit-identical logits
 *           and is asked for exactly rows_per_pos rows per position and
 *           Engram layer; a failing one fails the eval with its error.
 * Prints the figures (max errors, pass rates, positions compared).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv41.h"
#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "st_util.h"
#include "test_util.h"

static int n_fail;

/* Per-position errors collected over a run, and the argmax and
 * free-running greedy agreements. */
struct stats {
	int n;
	double *dlogit, *dlse;
	double max_dlogit, max_dlse;
	int top1_same, top1_total, free_same, free_total;
};

static void stats_add(struct stats *st, double dl, double ds)
{
	st->dlogit = realloc(st->dlogit, (st->n + 1) * sizeof(double));
	st->dlse = realloc(st->dlse, (st->n + 1) * sizeof(double));
	if (!st->dlogit || !st->dlse)
		abort();
	st->dlogit[st->n] = dl;
	st->dlse[st->n++] = ds;
	if (dl > st->max_dlogit)
		st->max_dlogit = dl;
	if (ds > st->max_dlse)
		st->max_dlse = ds;
}

static void must(int r, const struct st_diag *d, const char *what)
{
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", what, d->msg);
		exit(1);
	}
}

/* Free-running greedy generation of case cs (prompt ids[0..n)): the
 * model's own argmax fed back; equal to the reference's greedy ids up to
 * the first step whose top1_minus_top2 is below gap_rule (included).
 * row: vocab_size floats of scratch. */
static void free_greedy(const struct cw_dsv_model *m, const json_t *cs,
			const int32_t *ids, int n, struct stats *st,
			double gap_rule, float *row)
{
	const char *name = json_string_value(json_object_get(cs, "name"));
	const json_t *greedy = json_object_get(cs, "greedy_continuation");
	struct st_diag d = { { 0 } };
	int32_t tok = -1;
	int same, diff;
	int nc = dsvt_free_greedy(m, ids, n, greedy,
				  json_object_get(cs, "continuation_steps"),
				  gap_rule, row, &same, &diff, &tok, &d);

	must(nc, &d, name);
	st->free_total += nc;
	st->free_same += same;
	CHECK(diff < 0, "%s free-running step %d: %d, reference %d", name,
	      diff, tok, diff < 0 ? -1 :
	      (int)json_integer_value(json_array_get(greedy, diff)));
}

/* One case: one-shot prefill with every position's logits, then the
 * continuation decoded token by token (teacher-forced).  strict: each
 * position within tol_l / tol_s; gap_rule: greedy compared up to the
 * first step with top1_minus_top2 below it.  Errors into st. */
static void run_case(const struct cw_dsv_model *m, const json_t *cs,
		     struct stats *st, int strict, double tol_l, double tol_s,
		     double gap_rule, int *g_same, int *g_total,
		     struct cw_dsv_debug *dbg)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int V = c->vocab_size;
	const char *name = json_string_value(json_object_get(cs, "name"));
	const json_t *pp = json_object_get(cs, "prompt_positions");
	const json_t *steps = json_object_get(cs, "continuation_steps");
	const json_t *greedy = json_object_get(cs, "greedy_continuation");
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	int n, ns = (int)json_array_size(steps), greedy_ok = 1;
	int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);
	float *lg = malloc((size_t)n * V * sizeof(float));

	must(cw_dsv_state_new(m, n + ns + 1, &s), &d, "state");
	cw_dsv_set_debug(s, dbg);
	must(cw_dsv_eval(m, s, ids, n, 1, lg, &d), &d, name);
	cw_dsv_set_debug(s, NULL);
	for (int p = 0; p < n; p++) {
		double dl, ds;
		int am, ok = dsvt_top1_ok(json_array_get(pp, p),
					  lg + (size_t)p * V, V, 2 * tol_l, &am);

		dsvt_dist_err(json_array_get(pp, p), lg + (size_t)p * V, V, &dl, &ds);
		stats_add(st, dl, ds);
		CHECK(!strict || (dl <= tol_l && ds <= tol_s),
		      "%s prompt pos %d: max|dlogit| %.3g, |dlse| %.3g", name,
		      p, dl, ds);
		st->top1_total++;
		st->top1_same += ok;
		CHECK(!strict || ok, "%s prompt pos %d: argmax %d, not the reference's top-1",
		      name, p, am);
	}
	for (int i = 0; i < ns; i++) {
		const json_t *stp = json_array_get(steps, i);
		const float *row = i == 0 ? lg + (size_t)(n - 1) * V : lg;
		double dl, ds;
		int32_t ref = (int32_t)json_integer_value(json_array_get(greedy, i));

		if (i > 0) {
			int32_t prev = (int32_t)json_integer_value(
				json_array_get(greedy, i - 1));

			must(cw_dsv_eval(m, s, &prev, 1, 0, lg, &d), &d,
			     name);
		}
		if (i > 0) {
			dsvt_dist_err(stp, lg, V, &dl, &ds);
			stats_add(st, dl, ds);
			CHECK(!strict || (dl <= tol_l && ds <= tol_s),
			      "%s continuation step %d: max|dlogit| %.3g, |dlse| %.3g",
			      name, i, dl, ds);
		}
		if (greedy_ok) {
			(*g_total)++;
			*g_same += dsvt_argmax(row, V) == ref;
			CHECK(dsvt_argmax(row, V) == ref,
			      "%s step %d: greedy token %d, reference %d", name,
			      i, dsvt_argmax(row, V), ref);
			if (json_number_value(json_object_get(stp, "top1_minus_top2")) <
			    gap_rule)
				greedy_ok = 0;
		}
	}
	cw_dsv_state_free(s);
	free_greedy(m, cs, ids, n, st, gap_rule, lg);
	free(lg);
	free(ids);
}

static void report(const char *what, struct stats *st)
{
	double ml = dsvt_median(st->dlogit, st->n), ms = dsvt_median(st->dlse, st->n);
	double wl = dsvt_share_within(st->dlogit, st->n, 0.1);
	double ws = dsvt_share_within(st->dlse, st->n, 0.1);

	printf("%s: %d positions; max|dlogit| max %.3g median %.3g, within 0.1: %.1f %%; |dlse| max %.3g median %.3g, within 0.1: %.1f %%\n",
	       what, st->n, st->max_dlogit, ml, 100 * wl, st->max_dlse, ms,
	       100 * ws);
}

static double agree(const char *what, int ok, int total)
{
	printf("  debug %-20s %d / %d positions agree (%.1f %%)\n", what, ok,
	       total, total ? 100.0 * ok / total : 0.0);
	return total ? (double)ok / total : 0.0;
}

static int cmp_i(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* p4's debug data against the reference's. */
static void check_debug(const struct st_dsv_config *c, const json_t *dj,
			const struct cw_dsv_debug *d, int n)
{
	const int L = c->n_layers, K = c->top_k, T = c->index_topk;
	const int rpp = (c->engram_max_ngram - 1) * c->engram_n_heads;
	const int hc = c->hc_mult, CB = c->candidate_topk_blocks;
	int ok, tot;
	char key[16];

	/* Engram rows depend on the tokens only: exact */
	ok = tot = 0;
	for (int p = 0; p < n; p++)
		for (int e = 0; e < c->n_engram; e++) {
			const json_t *ref = json_array_get(json_array_get(
				json_object_get(dj, "engram_hash_ids"), p), e);
			int same = 1;

			for (int j = 0; j < rpp; j++)
				same &= d->engram_rows[((size_t)p * c->n_engram + e) * rpp + j] ==
					json_integer_value(json_array_get(ref, j));
			ok += same;
			tot++;
		}
	CHECK(ok == tot, "engram hash rows: %d of %d differ", tot - ok, tot);
	agree("engram rows", ok, tot);
	ok = tot = 0;
	for (int e = 0; e < c->n_engram; e++) {
		snprintf(key, sizeof(key), "%d", c->engram_layer[e]);
		for (int p = 0; p < n; p++) {
			const json_t *ref = json_array_get(json_object_get(
				json_object_get(dj, "engram_gates"), key), p);
			int same = 1;

			for (int k = 0; k < hc; k++)
				same &= fabs(d->engram_gates[((size_t)p * c->n_engram + e) * hc + k] -
					     json_number_value(json_array_get(ref, k))) <= 1e-4;
			ok += same;
			tot++;
		}
	}
	CHECK(agree("engram gates 1e-4", ok, tot) >= 0.9, "engram gates");
	/* routed experts as sets, weights within 1e-4 */
	ok = tot = 0;
	for (int l = 0; l < L; l++)
		for (int p = 0; p < n; p++) {
			const json_t *ie = json_array_get(json_array_get(
				json_object_get(dj, "routed_experts"), l), p);
			const json_t *iw = json_array_get(json_array_get(
				json_object_get(dj, "routed_weights"), l), p);
			int same = 1;

			for (int k = 0; k < K; k++) {
				int id = (int)json_integer_value(json_array_get(ie, k));
				int f = -1;

				for (int j = 0; j < K; j++)
					if (d->experts[((size_t)p * L + l) * K + j] == id)
						f = j;
				same &= f >= 0 &&
					fabs(d->weights[((size_t)p * L + l) * K + f] -
					     json_number_value(json_array_get(iw, k))) <= 1e-4;
			}
			ok += same;
			tot++;
		}
	CHECK(agree("routed experts", ok, tot) >= 0.9, "routed experts");
	ok = tot = 0;
	for (int l = 0; l < L; l++) {
		if (!c->index_source[l])
			continue;
		snprintf(key, sizeof(key), "%d", l);
		for (int p = 0; p < n; p++) {
			const json_t *ref = json_array_get(json_object_get(
				json_object_get(dj, "indexer_selected"), key), p);
			const int32_t *sel = d->selected + ((size_t)p * L + l) * T;
			int ns = 0, same;

			while (ns < T && sel[ns] >= 0)
				ns++;
			same = (size_t)ns == json_array_size(ref);
			for (int j = 0; same && j < ns; j++)
				same = sel[j] == json_integer_value(json_array_get(ref, j));
			ok += same;
			tot++;
		}
	}
	CHECK(agree("index selections", ok, tot) >= 0.9, "index selections");
	ok = tot = 0;
	snprintf(key, sizeof(key), "%d", c->candidate_source);
	for (int p = 0; p < n; p++) {
		const json_t *ref = json_array_get(json_object_get(
			json_object_get(dj, "candidate_blocks"), key), p);
		int b[CB], nb = 0, same;

		for (int j = 0; j < CB && d->cand_blocks[(size_t)p * CB + j] >= 0; j++)
			b[nb++] = d->cand_blocks[(size_t)p * CB + j];
		qsort(b, nb, sizeof(int), cmp_i);
		same = (size_t)nb == json_array_size(ref);
		for (int j = 0; same && j < nb; j++)
			same = b[j] == json_integer_value(json_array_get(ref, j));
		ok += same;
		tot++;
	}
	CHECK(agree("candidate blocks", ok, tot) >= 0.9, "candidate blocks");
	ok = tot = 0;
	for (int l = 0; l < L; l++)
		for (int p = 0; p < n; p++) {
			double ref = json_number_value(json_array_get(json_array_get(
				json_object_get(dj, "stream_rms_after_layer"), l), p));

			ok += fabs(d->stream_rms[(size_t)p * L + l] - ref) <=
			      2e-5 * fabs(ref) + 1e-6;
			tot++;
		}
	CHECK(agree("stream rms 2e-5 rel", ok, tot) >= 0.9, "stream rms");
}

static int mode_reference(struct cw_dsv_model *m, const char *dir, int qat,
			  int nodebug)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	json_t *ref = dsvt_load_json(dir, qat ? "reference.json" : "reference_noqat.json");
	const json_t *cases = json_object_get(ref, "cases"), *cs;
	struct stats st = { 0 };
	int g_same = 0, g_total = 0;
	size_t i;

	const char *dbg_prompt = json_string_value(json_object_get(
		json_object_get(ref, "debug"), "prompt"));

	if (cw_dsv_set_qat(m, qat ? CW_DSV41_QAT_ALL : 0) < 0)
		return 1;
	if (qat && !dbg_prompt)
		printf("reference.json has no \"debug\" block (or no debug prompt): the debug checks are skipped\n");
	CHECK(!qat || nodebug || dbg_prompt, "reference.json has no debug block");
	CHECK(!nodebug || !json_object_get(ref, "debug"),
	      "the nodebug copy still has a debug block");
	json_array_foreach(cases, i, cs) {
		const char *name = json_string_value(json_object_get(cs, "name"));
		int dbg_case = qat && dbg_prompt && !strcmp(name, dbg_prompt);
		struct cw_dsv_debug dbg = { 0 };
		int n = (int)json_array_size(json_object_get(cs, "ids"));

		if (dbg_case) {
			dbg.max_tokens = n;
			dbg.engram_rows = calloc((size_t)n * c->n_engram *
						 c->engram_max_ngram * c->engram_n_heads,
						 sizeof(int64_t));
			dbg.engram_gates = calloc((size_t)n * c->n_engram * c->hc_mult,
						  sizeof(float));
			dbg.experts = calloc((size_t)n * c->n_layers * c->top_k, 4);
			dbg.weights = calloc((size_t)n * c->n_layers * c->top_k, 4);
			dbg.selected = calloc((size_t)n * c->n_layers * c->index_topk, 4);
			dbg.cand_blocks = calloc((size_t)n * c->candidate_topk_blocks, 4);
			dbg.stream_rms = calloc((size_t)n * c->n_layers, 4);
		}
		run_case(m, cs, &st, !qat, 3e-4, 3e-5, qat ? 0.1 : 1e-3,
			 &g_same, &g_total, dbg_case ? &dbg : NULL);
		if (dbg_case) {
			printf("debug data of %s (QAT on):\n", name);
			check_debug(c, json_object_get(ref, "debug"), &dbg, n);
			free(dbg.engram_rows);
			free(dbg.engram_gates);
			free(dbg.experts);
			free(dbg.weights);
			free(dbg.selected);
			free(dbg.cand_blocks);
			free(dbg.stream_rms);
		}
	}
	report(qat ? "QAT on, reference.json" : "QAT off, reference_noqat.json",
	       &st);
	printf("greedy tokens: %d / %d equal (compared up to the first step with top1-top2 < %g)\n",
	       g_same, g_total, qat ? 0.1 : 1e-3);
	printf("prompt positions: argmax equal to the reference's top-1 %d of %d; free-running greedy ids equal %d of %d (same rule)\n",
	       st.top1_same, st.top1_total, st.free_same, st.free_total);
	CHECK(st.top1_total > 0 && st.free_total > 0, "nothing compared");
	CHECK(!qat || st.top1_same >= 0.9 * st.top1_total,
	      "prompt argmax equal at fewer than 90 %% of positions");
	if (qat) {
		CHECK(dsvt_median(st.dlogit, st.n) <= 1e-3, "median max|dlogit| %.3g > 1e-3",
		      dsvt_median(st.dlogit, st.n));
		CHECK(dsvt_share_within(st.dlogit, st.n, 0.1) >= 0.9,
		      "fewer than 90 %% of positions within 0.1");
		CHECK(dsvt_median(st.dlse, st.n) <= 1e-3, "median |dlse| %.3g > 1e-3",
		      dsvt_median(st.dlse, st.n));
		CHECK(dsvt_share_within(st.dlse, st.n, 0.1) >= 0.9,
		      "fewer than 90 %% of lse within 0.1");
	}
	free(st.dlogit);
	free(st.dlse);
	json_decref(ref);
	return 0;
}

/* Evaluates ids[0..n) in chunks of the sizes cuts[] (the last size
 * repeating), all positions' logits into lg. */
static void eval_chunked(const struct cw_dsv_model *m, const int32_t *ids,
			 int n, const int *cuts, int n_cuts, float *lg)
{
	struct st_diag d = { { 0 } };

	must(dsvt_eval_chunked(m, ids, n, cuts, n_cuts, 1, lg, &d), &d,
	     "chunked eval");
}

/* The case with the most prompt tokens. */
static const json_t *longest_case(const json_t *ref)
{
	const json_t *cases = json_object_get(ref, "cases"), *cs, *best = NULL;
	size_t i;

	json_array_foreach(cases, i, cs)
		if (!best || json_array_size(json_object_get(cs, "ids")) >
				     json_array_size(json_object_get(best, "ids")))
			best = cs;
	if (!best) {
		fprintf(stderr, "reference.json has no cases\n");
		exit(1);
	}
	return best;
}

static int mode_chunked(struct cw_dsv_model *m, const char *dir)
{
	static const int c1[] = { 1 }, c3[] = { 3 }, c2[] = { 2 };
	static const int c7[] = { 7, 13, 5 }, c64[] = { 64, 1, 104 };
	static const int c90[] = { 90, 1 };
	const struct { const int *c; int n; const char *name; } sch[] = {
		{ c1, 1, "token by token" }, { c3, 1, "3s" }, { c2, 1, "2s" },
		{ c7, 3, "7, 13, 5s" }, { c64, 3, "64, 1, 104" },
		{ c90, 2, "prefill 90 + decode" },
	};
	const int V = cw_dsv_config(m)->vocab_size;
	json_t *ref = dsvt_load_json(dir, "reference.json");
	const json_t *cs = longest_case(ref);
	int n;
	int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);
	float *full = malloc((size_t)n * V * sizeof(float));
	float *lg = malloc((size_t)n * V * sizeof(float));
	int full_n = n;

	for (int qat = 0; qat < 2; qat++) {
		cw_dsv_set_qat(m, qat ? CW_DSV41_QAT_ALL : 0);
		eval_chunked(m, ids, n, &full_n, 1, full);
		for (size_t k = 0; k < sizeof(sch) / sizeof(sch[0]); k++) {
			size_t diff = 0;

			eval_chunked(m, ids, n, sch[k].c, sch[k].n, lg);
			for (size_t i = 0; i < (size_t)n * V; i++)
				diff += memcmp(&lg[i], &full[i], sizeof(float)) != 0;
			CHECK(diff == 0, "QAT %s, chunks %s: %zu of %zu logits differ from the one-shot prefill",
			      qat ? "on" : "off", sch[k].name, diff,
			      (size_t)n * V);
			printf("QAT %s, %s (%s, %d tokens): %zu logits differ (of %zu)\n",
			       qat ? "on" : "off", json_string_value(json_object_get(cs, "name")),
			       sch[k].name, n, diff, (size_t)n * V);
		}
	}
	free(full);
	free(lg);
	free(ids);
	json_decref(ref);
	return 0;
}

/* Last-position logits after prefill (chunk size, ced on/off) and then the
 * continuation decoded; all rows into out [1 + n_cont][V]. */
static void prefill_decode(const struct cw_dsv_model *m, const int32_t *ids,
			   int n, int chunk, int ced, const int32_t *cont,
			   int n_cont, float *out)
{
	const int V = cw_dsv_config(m)->vocab_size;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };

	must(cw_dsv_state_new(m, n + n_cont, &s), &d, "state");
	cw_dsv41_set_ced_shortcut(s, ced);
	for (int done = 0; done < n; done += chunk) {
		int k = n - done < chunk ? n - done : chunk;

		must(cw_dsv_eval(m, s, ids + done, k, 0, out, &d), &d,
		     "prefill");
	}
	for (int i = 0; i < n_cont; i++)
		must(cw_dsv_eval(m, s, cont + i, 1, 0,
				   out + (size_t)(i + 1) * V, &d), &d, "decode");
	cw_dsv_state_free(s);
}

static double max_abs_diff(const float *a, const float *b, size_t n,
			   size_t *n_diff)
{
	double mx = 0.0;

	*n_diff = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)a[i] - b[i]);

		*n_diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
		if (!(e <= mx))
			mx = e;
	}
	return mx;
}

static int mode_ced(struct cw_dsv_model *m, const char *dir)
{
	const int V = cw_dsv_config(m)->vocab_size, NC = 8;
	json_t *ref = dsvt_load_json(dir, "reference.json");
	const json_t *cases = json_object_get(ref, "cases"), *cs;
	size_t ci;

	json_array_foreach(cases, ci, cs) {
		const char *name = json_string_value(json_object_get(cs, "name"));
		int n, chunks[] = { 1 << 20, 40 };
		int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL), cont[NC];
		float *a = malloc((size_t)(NC + 1) * V * sizeof(float));
		float *b = malloc((size_t)(NC + 1) * V * sizeof(float));
		size_t nd;
		double dev;

		if (n < 20) { /* shorter than the window: nothing skipped */
			free(ids); free(a); free(b);
			continue;
		}
		for (int i = 0; i < NC; i++)
			cont[i] = (int32_t)json_integer_value(json_array_get(
				json_object_get(cs, "greedy_continuation"), i));
		for (int k = 0; k < 2; k++) {
			prefill_decode(m, ids, n, chunks[k], CW_DSV41_CED_OFF,
				       cont, NC, a);
			prefill_decode(m, ids, n, chunks[k], CW_DSV41_CED_EXACT,
				       cont, NC, b);
			dev = max_abs_diff(a, b, (size_t)(NC + 1) * V, &nd);
			CHECK(nd == 0, "CED exact, %s, chunk %d: %zu logits differ",
			      name, chunks[k], nd);
			printf("CED exact  %s (%d tokens, chunks of %d): last position + %d decode steps: %zu logits differ\n",
			       name, n, chunks[k] > n ? n : chunks[k], NC, nd);
			prefill_decode(m, ids, n, chunks[k], CW_DSV41_CED_WINDOW,
				       cont, NC, b);
			dev = max_abs_diff(a, b, (size_t)(NC + 1) * V, &nd);
			CHECK(isfinite(dev) && nd > 0,
			      "CED window, %s: deviation %.3g (approximate: must be finite and not exact here)",
			      name, dev);
			printf("CED window %s (%d tokens, chunks of %d): approximate, max|dlogit| %.3g over the last position + %d decode steps\n",
			       name, n, chunks[k] > n ? n : chunks[k], dev, NC);
		}
		free(ids);
		free(a);
		free(b);
	}
	{	/* all-position logits are refused with the shortcut on */
		struct cw_dsv_state *s;
		struct st_diag d = { { 0 } };
		int32_t id = 0;
		float *lg = malloc((size_t)V * sizeof(float));

		must(cw_dsv_state_new(m, 4, &s), &d, "state");
		CHECK(cw_dsv41_set_ced_shortcut(s, 3) == -EINVAL,
		      "unknown CED mode accepted");
		cw_dsv41_set_ced_shortcut(s, CW_DSV41_CED_EXACT);
		CHECK(cw_dsv_eval(m, s, &id, 1, 1, lg, &d) == -EINVAL,
		      "all-position logits accepted with the CED shortcut");
		cw_dsv_state_free(s);
		free(lg);
	}
	json_decref(ref);
	return 0;
}

/* max |dlogit| over decode steps after a prefix restored without its
 * window and rebuilt by replaying n_replay tokens (0: no rebuild). */
static double replay_dev(const struct cw_dsv_model *m, const int32_t *ids,
			 int n, int n_replay, const int32_t *cont, int n_cont,
			 const float *full)
{
	const int V = cw_dsv_config(m)->vocab_size;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	float *lg = malloc((size_t)V * sizeof(float));
	double dev = 0.0;

	must(cw_dsv_state_new(m, n + n_cont, &s), &d, "state");
	must(cw_dsv_eval(m, s, ids, n, 0, NULL, &d), &d, "prefill");
	cw_dsv41_state_drop_window(s);
	if (n_replay)
		must(cw_dsv41_replay(m, s, ids + n - n_replay, n_replay, &d),
		     &d, "replay");
	for (int i = 0; i < n_cont; i++) {
		must(cw_dsv_eval(m, s, cont + i, 1, 0, lg, &d), &d, "decode");
		for (int v = 0; v < V; v++) {
			double e = fabs(lg[v] - full[(size_t)(i + 1) * V + v]);

			if (!(e <= dev))
				dev = e;
		}
	}
	cw_dsv_state_free(s);
	free(lg);
	return dev;
}

static int mode_replay(struct cw_dsv_model *m, const char *dir)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int V = c->vocab_size, NC = 8, W = c->sliding_window;
	json_t *ref = dsvt_load_json(dir, "reference.json");
	const json_t *cases = json_object_get(ref, "cases"), *cs;
	size_t ci;

	json_array_foreach(cases, ci, cs) {
		int n;
		int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL), cont[NC];
		float *full = malloc((size_t)(NC + 1) * V * sizeof(float));
		double d_all, d_win, d_2win, d_none;

		if (n < 2 * W) {
			free(ids);
			free(full);
			continue;
		}
		for (int i = 0; i < NC; i++)
			cont[i] = (int32_t)json_integer_value(json_array_get(
				json_object_get(cs, "greedy_continuation"), i));
		prefill_decode(m, ids, n, n, 0, cont, NC, full);
		d_all = replay_dev(m, ids, n, n, cont, NC, full);
		d_win = replay_dev(m, ids, n, W, cont, NC, full);
		d_2win = replay_dev(m, ids, n, 2 * W, cont, NC, full);
		d_none = replay_dev(m, ids, n, 0, cont, NC, full);
		printf("SWA replay %s (%d tokens, %d decode steps): max|dlogit| replay all %.3g, last 2W %.3g, last W %.3g, no replay %.3g\n",
		       json_string_value(json_object_get(cs, "name")), n, NC,
		       d_all, d_2win, d_win, d_none);
		CHECK(d_all == 0.0, "replaying the whole prefix is not exact (%.3g)",
		      d_all);
		CHECK(d_win < d_none, "replaying the last window (%.3g) is not closer than no replay (%.3g)",
		      d_win, d_none);
		free(ids);
		free(full);
	}
	{	/* a replay with tokens that are not the prefix's is refused */
		struct cw_dsv_state *s;
		struct st_diag d = { { 0 } };
		int32_t ids[3] = { 0, 5, 7 }, bad = 6;

		must(cw_dsv_state_new(m, 8, &s), &d, "state");
		must(cw_dsv_eval(m, s, ids, 3, 0, NULL, &d), &d, "eval");
		CHECK(cw_dsv41_replay(m, s, &bad, 1, &d) == -EINVAL,
		      "replay of a foreign token accepted");
		CHECK(cw_dsv41_replay(m, s, ids, 4, &d) == -EINVAL,
		      "replay longer than the state accepted");
		cw_dsv_state_free(s);
	}
	json_decref(ref);
	return 0;
}

/* A provider that forwards to the in-memory one and counts, or fails. */
struct counting {
	struct cw_dsv_model *m;
	int calls, rows, fail;
};

static int counting_rows(void *ctx, int ei, const int64_t *row_ids, int n,
			 float *out, struct st_diag *diag)
{
	struct counting *cp = ctx;

	if (cp->fail)
		return st_diag_set(diag, -EIO, "engram tier: read of layer %d failed",
				   ei);
	cp->calls++;
	cp->rows += n;
	return cw_dsv41_engram_rows_mem(cp->m, ei, row_ids, n, out, diag);
}

/* The Engram row provider: a plugged-in one gives bit-identical logits
 * and is asked for rows_per_pos rows per position and Engram layer; its
 * error fails the eval with its code and message. */
static int mode_provider(struct cw_dsv_model *m, const char *dir)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int V = c->vocab_size;
	const int rpp = (c->engram_max_ngram - 1) * c->engram_n_heads;
	json_t *ref = dsvt_load_json(dir, "reference.json");
	const json_t *cs = longest_case(ref);
	struct counting cnt = { .m = m };
	struct cw_dsv41_engram_provider prov = { counting_rows, &cnt };
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	int n;
	int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);
	float *a = malloc((size_t)n * V * sizeof(float));
	float *b = malloc((size_t)n * V * sizeof(float));
	size_t nd;

	eval_chunked(m, ids, n, &n, 1, a);
	cw_dsv41_set_engram_provider(m, &prov);
	eval_chunked(m, ids, n, &n, 1, b);
	max_abs_diff(a, b, (size_t)n * V, &nd);
	CHECK(nd == 0, "plugged-in provider: %zu logits differ", nd);
	CHECK(cnt.calls == n * c->n_engram && cnt.rows == n * c->n_engram * rpp,
	      "provider asked %d times for %d rows; want %d and %d", cnt.calls,
	      cnt.rows, n * c->n_engram, n * c->n_engram * rpp);
	printf("engram provider: %d calls, %d rows for %d positions, %zu logits differ from the in-memory tables\n",
	       cnt.calls, cnt.rows, n, nd);
	cnt.fail = 1;
	must(cw_dsv_state_new(m, n, &s), &d, "state");
	CHECK(cw_dsv_eval(m, s, ids, n, 0, b, &d) == -EIO &&
	      strstr(d.msg, "engram tier"),
	      "a failing provider did not fail the eval with its error (%s)",
	      d.msg);
	cw_dsv_state_free(s);
	cw_dsv41_set_engram_provider(m, NULL);
	free(a);
	free(b);
	free(ids);
	json_decref(ref);
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "qat";
	char dir[4096];
	struct cw_dsv_model *m;
	struct st_diag d = { { 0 } };
	int r;
	char nodebug_dir[4096] = "";

	st_test_fixture_model("tiny-deepseek-v41", dir, sizeof(dir));
	if (!strcmp(mode, "nodebug")) {
		if (dsvt_copy_without(dir, "reference.json", "debug", nodebug_dir,
				      sizeof(nodebug_dir)) < 0)
			return 1;
		snprintf(dir, sizeof(dir), "%s", nodebug_dir);
		printf("fixture copy without the debug block: %s\n", dir);
	}
	must(cw_dsv_load(dir, ST_DSV_REV_V41, CW_COMPUTE_REFERENCE, &m,
			 &d), &d, dir);
	if (!strcmp(mode, "noqat"))
		r = mode_reference(m, dir, 0, 0);
	else if (!strcmp(mode, "qat") || !strcmp(mode, "nodebug"))
		r = mode_reference(m, dir, 1, nodebug_dir[0] != 0);
	else if (!strcmp(mode, "chunked"))
		r = mode_chunked(m, dir);
	else if (!strcmp(mode, "ced"))
		r = mode_ced(m, dir);
	else if (!strcmp(mode, "replay"))
		r = mode_replay(m, dir);
	else if (!strcmp(mode, "provider"))
		r = mode_provider(m, dir);
	else {
		fprintf(stderr, "usage: %s noqat|qat|nodebug|chunked|ced|replay|provider\n",
			argv[0]);
		r = 2;
	}
	cw_dsv_free(m);
	if (nodebug_dir[0])
		st_rm_rf(nodebug_dir);
	if (n_fail)
		fprintf(stderr, "%d checks failed\n", n_fail);
	return r ? r : n_fail ? 1 : 0;
}
