/*
 * test_dsv_fast.c — the DeepSeek-V4 family's forward pass in fast mode
 * (cw_dsv_load_store CW_COMPUTE_FAST: FP8 dense weights as E4M3 codes on
 * the fast backend's kernel, routed experts straight from a real
 * expertd's slot bytes with int8 activations; V4.1 also Engram wkv and
 * indexer wq_b as E4M3 codes, BF16 compressor, index key projection and
 * LM head on the BF16 kernel) against reference mode (cw_dsv_load: exact
 * F32 weights, double accumulation), which the reference tests hold to
 * the fixtures' logits.  One test for every revision:
 *
 * Usage: test_dsv_fast v4 [MODEL_DIR]
 *          no MODEL_DIR: ../shared tiny-deepseek-v4, every case of
 *          reference.json (prompt + greedy continuation); MODEL_DIR: a V4
 *          checkpoint (e.g. scripts/gen-dsv4-model.py --small), one fixed
 *          96-token sequence;
 *        test_dsv_fast v41
 *          ../shared tiny-deepseek-v41, every case of reference.json;
 *        test_dsv_fast v41 greedy STORE N ID...
 *          for tests/serve/test_dsv_serve.py: fast mode's direct
 *          evaluation of a V4.1 store through its own expertd, QAT on: the
 *          prompt ID... in one eval, then N greedy tokens one at a time;
 *          prints them as a JSON array on one line.
 * Skips with 77 without ../shared.  expertd runs at --host-budget 25 %
 * (V4.1: with an Engram cache smaller than the tables); sequences are
 * evaluated in chunks of 16 with every position's logits compared.
 *
 * Both revisions:
 *  - an unknown compute mode is refused; fast mode keeps FP8 weights as
 *    1-byte codes (V4: dense bytes below reference's; V4.1: at most half,
 *    BF16 kept and the LM head [129280, 32] dominating the tiny model);
 *  - fast mode's data layout (FP8 codes with expanded E8M0 scales, MXFP4
 *    views of the slot bytes) on the exact backend (cw_backend_cpu, float
 *    activations), QAT off: top-1 equal everywhere and max |delta logit|
 *    <= 1e-3 x the spread (std) of the reference logits (only float vs
 *    double summation differs; measured ~1e-6), so a wrong offset, scale
 *    or nibble order fails here;
 *  - store passes: every routed expert came through expertd (acquired =
 *    positions x layers x top_k, bytes = acquired x record bytes); with
 *    the gate look-ahead at depth 2 (cw_dsv_set_prefetch_depth) expertd
 *    counts the hash layers' exact hints plus top_k for each score-routed
 *    layer among the next two of every layer, per position (V4.1 has no
 *    hash layers; it also counts top_k x max(1, depth) step-named hint
 *    entries per eval);
 *  - layer-start hints off, then on, decoding a token per eval: logits
 *    bit-identical, expertd receives top_k more step-named hint entries
 *    per token and hinted layer (V4: the score-routed layers, 24 fixed
 *    tokens; V4.1: layers 1.., the first case);
 *  - fast mode from the checkpoint (cw_dsv_load, no expertd: experts
 *    dequantized at load on the F32 kernel, FP8 codes with float
 *    activations), QAT off: top-1 equal everywhere, max |delta logit|
 *    <= 1e-3 x std;
 *  - the pool evicted at 25 %.
 * V4 runs every pass in the exact math (cw_dsv_set_qat 0, the strict
 * references' mode): the official round trips' rounding flips amplify
 * float summation order differences beyond these tolerances.
 * V4, the fast kernels (int8 activations per 32 for the experts): the
 * fixture is tiny (hidden 32, SwiGLU clamp 2) and chaotic (its README:
 * any mutation moves logits by ~1), so the rule is statistical, in the
 * spirit of the fixtures' mxfp4_approx: top-1 agreement >= 0.85, median
 * |delta log p(reference top-1)| <= 0.1, 90th percentile of max |delta
 * logit| / std <= 0.6 (measured: 0.90, 0.038, 0.41), and not
 * bit-identical to reference (the fast path really ran).
 * V4.1 (the V4.1-only checks):
 *  2. The fast kernels against reference mode, QAT on (with the gate
 *     look-ahead at depth 2) and off.  The kernels' one approximation is
 *     the int8 quantization (per 32, relative error up to 1/254 per
 *     element) of the routed experts' activations; the fixture is tiny
 *     (hidden 32, SwiGLU clamp 2, rms eps 1e-20) and chaotic: its README
 *     measures float32 vs float64 rounding alone (relative 6e-8) growing
 *     to max |dlogit| 1.5 with QAT on.  An error ~6e4 x larger moves the
 *     logits by ~0.4 (QAT off) to ~1.2 (QAT on) and changes the argmax at
 *     a third (QAT off) to over half (QAT on) of the positions.  So the
 *     rule is checked in two steps:
 *      a. the fast kernels against an independent model of exactly that
 *         approximation (sim_ops below: int8 round trip of the 4-bit
 *         matvecs' input, exact weights, double sums; every other
 *         format exact), QAT off: top-1 >= 0.98, 90th percentile of max
 *         |dlogit| / std <= 0.01, max <= 0.1 (float summation order
 *         only; measured 1.000, 0.0012, 0.024): the kernels compute
 *         what they should;
 *         With QAT on the same two comparisons see QAT rounding flips
 *         amplify float summation order: the layout on the exact backend
 *         vs reference top-1 >= 0.95, median |delta log p| <= 1e-3
 *         (measured 0.989, 0.0; max |dlogit| / std 1.09), the kernels vs
 *         the int8 model top-1 >= 0.85, median <= 0.05 (0.917, 0.009);
 *      b. fast kernels vs reference and the int8 model vs reference:
 *         top-1 agreement equal within 0.03 (measured 0.672 both), and
 *         the measured statistics with margin: QAT off top-1 >= 0.55,
 *         median |delta log p(ref top-1)| <= 0.3, 90th percentile of max
 *         |dlogit| / std <= 2.0 (measured 0.672, 0.155, 1.47); QAT on
 *         0.3, 0.7, 3.0 (measured 0.402, 0.460, 2.34); and not
 *         bit-identical (the fast path ran).
 *  3. Fast kernels against the fixture's references directly (top10
 *     logits by id and the lse, prompt positions and teacher-forced
 *     continuation steps): QAT off against reference_noqat.json, QAT on
 *     against reference.json.  Reference mode meets 3e-4 (QAT off) and
 *     the README's median 1e-3 rule (QAT on); fast mode, by point 2's
 *     int8 step: median max|dlogit| <= 0.6 (QAT off; measured 0.386) /
 *     1.8 (QAT on; 1.19), lse within 0.1 at >= 90 % / 70 % of the
 *     positions (98 % / 82.5 %), greedy tokens equal at >= 60 % / 25 %
 *     of the steps compared up to the first with top1_minus_top2 < 0.1
 *     (7 / 9 and 7 / 20).
 *  4. Per-expert overlap off gives bit-identical logits to overlap on
 *     (outputs are summed in the fixed top-k order), and 3 threads to 1
 *     (rows split, each row one kernel reduction); bad thread counts are
 *     refused.
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
#include "es_client.h"
#include "es_convert.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define CHUNK 16
#define GEN_TOKENS 96  /* the fixed sequence for a MODEL_DIR (v4) */
#define MAX_POS DSVT_CMP_MAX /* fixture-pass positions kept */
#define ENGRAM_CACHE "49000" /* 500 rows of 66 + 32 bytes: < 1524 rows */
/* V4.1 tolerances (the header says why; measured values in brackets) */
#define TOP1 0.55      /* QAT off, vs reference [0.672] */
#define DLP 0.3        /* [0.155] */
#define REL90 2.0      /* [1.47] */
#define TOP1_QAT 0.3   /* QAT on [0.402] */
#define DLP_QAT 0.7    /* [0.460] */
#define REL90_QAT 3.0  /* [2.34] */
#define TOP1_SIM 0.98  /* fast kernels vs the int8 model [1.000] */
#define REL90_SIM 0.01 /* [0.0012] */
#define MAX_SIM 0.1    /* [0.024] */

/* What one run works on (main sets it up, the passes use it). */
struct fast_ctx {
	int v41;                    /* revision: 0 V4, 1 V4.1 */
	const char *dir;            /* the checkpoint */
	const json_t *cases;        /* reference.json's cases; NULL: gen */
	struct cw_dsv_model *ref;   /* reference mode from the checkpoint */
	struct cw_dsv_model *fm;    /* fast mode from the store */
	struct es_client *es;
	struct dsvt_cmp *c;
};

/* One sequence through both models in chunks, all positions compared;
 * the fast model's expert figures added to *rs. */
static void run_seq(const struct cw_dsv_model *ref,
		    const struct cw_dsv_model *fm, const int32_t *ids, int n,
		    struct dsvt_cmp *c, struct cw_dsv_run_stats *rs)
{
	const int V = cw_dsv_config(ref)->vocab_size;
	float *a = malloc((size_t)CHUNK * V * sizeof(float));
	float *b = malloc((size_t)CHUNK * V * sizeof(float));
	struct cw_dsv_state *sa = NULL, *sb = NULL;
	struct st_diag diag = { { 0 } };

	CHECK(a && b && cw_dsv_state_new(ref, n, &sa) == 0 &&
	      cw_dsv_state_new(fm, n, &sb) == 0, "state");
	for (int p = 0; sa && sb && p < n; p += CHUNK) {
		int k = n - p < CHUNK ? n - p : CHUNK;
		int r = cw_dsv_eval(ref, sa, ids + p, k, 1, a, &diag);

		CHECK(r == 0, "reference eval: %s", diag.msg);
		r = r ? r : cw_dsv_eval(fm, sb, ids + p, k, 1, b, &diag);
		CHECK(r == 0, "fast eval: %s", diag.msg);
		if (r)
			break;
		c->evals++;
		for (int t = 0; t < k; t++)
			dsvt_compare_pos(c, a + (size_t)t * V, b + (size_t)t * V, V);
	}
	if (sb) {
		struct cw_dsv_run_stats x;

		cw_dsv_state_stats(sb, &x);
		rs->experts_acquired += x.experts_acquired;
		rs->expert_bytes += x.expert_bytes;
		rs->acquire_ns += x.acquire_ns;
	}
	cw_dsv_state_free(sa);
	cw_dsv_state_free(sb);
	free(a);
	free(b);
}

/* The sequences: every case of cases (prompt + greedy continuation), or
 * with cases NULL one fixed GEN_TOKENS-token sequence (another model). */
static void run_all(const struct cw_dsv_model *ref,
		    const struct cw_dsv_model *fm, const json_t *cases,
		    struct dsvt_cmp *c, struct cw_dsv_run_stats *rs)
{
	const json_t *cs;
	size_t ci;

	if (!cases) {
		const int V = cw_dsv_config(ref)->vocab_size;
		int32_t ids[GEN_TOKENS];

		for (int i = 0; i < GEN_TOKENS; i++)
			ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)V);
		ids[0] = 0;
		run_seq(ref, fm, ids, GEN_TOKENS, c, rs);
		return;
	}
	json_array_foreach(cases, ci, cs) {
		int n;
		int32_t *ids = dsvt_case_ids(cs, 1, &n, NULL);

		CHECK(ids != NULL, "out of memory");
		if (ids)
			run_seq(ref, fm, ids, n, c, rs);
		free(ids);
	}
}

/* Every routed expert of a store pass came through expertd. */
static void check_acquired(const struct fast_ctx *x,
			   const struct cw_dsv_run_stats *rs)
{
	const struct st_dsv_config *cf = cw_dsv_config(x->ref);

	CHECK(rs->experts_acquired ==
		      (uint64_t)x->c->n_pos * cf->n_layers * cf->top_k,
	      "acquired %llu, expected %ld x %d x %d",
	      (unsigned long long)rs->experts_acquired, x->c->n_pos,
	      cf->n_layers, cf->top_k);
	CHECK(rs->expert_bytes == rs->experts_acquired *
					  es_client_record_bytes(x->es),
	      "expert bytes %llu", (unsigned long long)rs->expert_bytes);
}

/* The hints expertd counted in a store pass at look-ahead `depth`: hash
 * layers hint each later hash layer exactly; depth adds top_k per
 * score-routed layer among the next `depth` of every layer, per
 * position.  With step (V4.1): also top_k x max(1, depth) step-named
 * entries per eval.  Prints the pass's prefetch figures. */
static void check_hints(const struct fast_ctx *x, int pass, int depth,
			int step, const struct es_tier_stats *t0,
			const struct es_tier_stats *t1,
			const struct cw_dsv_run_stats *rs)
{
	const struct st_dsv_config *cf = cw_dsv_config(x->ref);
	const struct dsvt_cmp *c = x->c;
	uint64_t hash = 0, la = 0;
	int nl = depth > 1 ? depth : 1;

	for (int l = 0; l < cf->n_layers; l++) {
		if (l < cf->n_hash_layers)
			hash += cf->n_hash_layers - 1 - l;
		for (int j = l + 1; j <= l + depth && j < cf->n_layers; j++)
			la += j >= cf->n_hash_layers;
	}
	CHECK(t1->hints - t0->hints ==
		      (uint64_t)c->n_pos * cf->top_k * (hash + la),
	      "pass %d: hints %llu, expected %ld x %d x (%llu + %llu)", pass,
	      (unsigned long long)(t1->hints - t0->hints), c->n_pos,
	      cf->top_k, (unsigned long long)hash, (unsigned long long)la);
	if (step)
		CHECK(t1->step_hints - t0->step_hints ==
			      (uint64_t)c->evals * cf->top_k * nl,
		      "pass %d: step hints %llu, expected %ld x %d x %d", pass,
		      (unsigned long long)(t1->step_hints - t0->step_hints),
		      c->evals, cf->top_k, nl);
	printf("pass %d: prefetch loads %llu, used %llu, wasted %llu; stall "
	       "%.1f ms\n", pass,
	       (unsigned long long)(t1->prefetch_loads - t0->prefetch_loads),
	       (unsigned long long)(t1->prefetch_used - t0->prefetch_used),
	       (unsigned long long)(t1->prefetch_wasted - t0->prefetch_wasted),
	       rs->acquire_ns / 1e6);
}

/* Fast mode from the checkpoint (no expertd), QAT off: FP8 codes on the
 * fast kernel with float activations, experts dequantized at load on the
 * F32 kernel: no int8 step, so as close as the exact backend. */
static void checkpoint_pass(const struct fast_ctx *x,
			    enum st_dsv_revision rev)
{
	struct cw_dsv_model *cm = NULL;
	struct cw_dsv_run_stats crs = { 0 };
	struct st_diag diag = { { 0 } };
	struct dsvt_cmp *c = x->c;

	memset(c, 0, sizeof(*c));
	CHECK(cw_dsv_set_qat(x->ref, 0) == 0, "qat");
	if (cw_dsv_load(x->dir, rev, CW_COMPUTE_FAST, &cm, &diag) ||
	    cw_dsv_set_qat(cm, 0)) {
		CHECK(0, "cw_dsv_load fast: %s", diag.msg);
		cw_dsv_free(cm);
		return;
	}
	run_all(x->ref, cm, x->cases, c, &crs);
	printf("fast mode from the checkpoint vs reference, QAT off, over %ld "
	       "positions: top-1 %.4f, max |dlogit|/std %.2e\n", c->n_pos,
	       (double)c->top1_same / (c->n_pos ? c->n_pos : 1),
	       c->worst_rel);
	CHECK(c->n_pos > 0 && c->top1_same == c->n_pos && c->worst_rel <= 1e-3,
	      "checkpoint fast mode: top-1 %ld/%ld, max |dlogit|/std %.2e > "
	      "1e-3", c->top1_same, c->n_pos, c->worst_rel);
	CHECK(crs.experts_acquired == 0, "checkpoint mode used expertd");
	cw_dsv_free(cm);
}

static double quantile(const double *v, long n, double q)
{
	double *c;
	double r;

	if (n <= 0)
		return INFINITY;
	c = malloc((size_t)n * sizeof(double));
	memcpy(c, v, (size_t)n * sizeof(double));
	qsort(c, (size_t)n, sizeof(double), dsvt_cmp_double);
	r = c[(long)(q * (n - 1) + 0.5)];
	free(c);
	return r;
}

/* ---- an independent model of the fast kernels' one approximation ----
 * cw_kern.h: FP8, BF16 and F32 weights take float activations; 4-bit
 * weights take the activations quantized to int8 per block of 32 (d =
 * amax / 127, q = nearbyint(x * 127 / amax)).  This backend computes
 * exactly that approximation with exact weights and double sums: MXFP4
 * matvecs on the int8 round trip of x (dequantized as q * d), every other
 * format exactly (cw_backend_cpu).  The fast kernels must match it to
 * float summation order; its own distance to reference mode is then the
 * int8 step's, not a bug's. */
static void q8_roundtrip(const float *x, int64_t n, float *out)
{
	for (int64_t c0 = 0; c0 < n; c0 += 32) {
		int64_t c1 = c0 + 32 < n ? c0 + 32 : n;
		float amax = 0.0f, d, inv;

		for (int64_t c = c0; c < c1; c++)
			if (fabsf(x[c]) > amax)
				amax = fabsf(x[c]);
		d = amax / 127.0f;
		inv = amax > 0.0f ? 127.0f / amax : 0.0f;
		for (int64_t c = c0; c < c1; c++) {
			float v = nearbyintf(x[c] * inv);

			v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
			out[c] = d > 0.0f ? v * d : 0.0f;
		}
	}
}

static void sim_matvec(const struct cw_wview *w, const float *x, float *y,
		       int64_t r0, int64_t r1)
{
	float xq[w->cols], row[w->cols];

	if (w->dtype != ST_DTYPE_MXFP4) {
		cw_backend_cpu()->matvec(w, x, y, r0, r1);
		return;
	}
	q8_roundtrip(x, w->cols, xq);
	for (int64_t r = r0; r < r1; r++) {
		double acc = 0.0;

		st_mxfp4_dequantize_row((const uint8_t *)w->data +
						r * w->cols / 2,
					w->scales + r * w->cols / 32,
					(int)w->cols, ST_FP4_LAYOUT_OCP, row);
		for (int64_t c = 0; c < w->cols; c++)
			acc += (double)row[c] * xq[c];
		y[r] = (float)acc;
	}
}

static size_t sim_act_bytes(int64_t n)
{
	(void)n;
	return 0;
}

static void sim_act_prepare(const float *x, int64_t n, enum st_dtype dt,
			    void *buf, struct cw_act *ret)
{
	(void)dt;
	(void)buf;
	memset(ret, 0, sizeof(*ret));
	ret->x = x;
	ret->n = n;
}

static void sim_matvec_act(const struct cw_wview *w, const struct cw_act *a,
			   float *y, int64_t r0, int64_t r1)
{
	sim_matvec(w, a->x, y, r0, r1);
}

static const struct cw_backend_ops sim_ops = {
	.name = "int8-activation model",
	.matvec = sim_matvec,
	.act_bytes = sim_act_bytes,
	.act_prepare = sim_act_prepare,
	.matvec_act = sim_matvec_act,
};

/* Prints and returns the 90th percentile of rel, with median dlp in
 * *med. */
static double summary(const char *what, const struct dsvt_cmp *c, double *med)
{
	long m = c->n_pos < DSVT_CMP_MAX ? c->n_pos : DSVT_CMP_MAX;
	double p90 = quantile(c->rel, m, 0.9);

	*med = quantile(c->dlp, m, 0.5);
	printf("%s over %ld positions: top-1 %.4f, median |dlogp| %.5f, max "
	       "|dlogit|/std median %.4f, 90%% %.4f, max %.4f; bit-identical "
	       "positions %ld\n", what, c->n_pos,
	       (double)c->top1_same / (c->n_pos ? c->n_pos : 1), *med,
	       quantile(c->rel, m, 0.5), p90, c->worst_rel, c->identical);
	return p90;
}

/* ---- against the fixture's references (top10 + lse per position) ---- */

struct fstats {
	int n, g_same, g_total;
	double dl[MAX_POS], ds[MAX_POS];
};

static void fx_err(const json_t *rec, const float *lg, int V,
		   struct fstats *f)
{
	if (f->n < MAX_POS) {
		dsvt_dist_err(rec, lg, V, &f->dl[f->n], &f->ds[f->n]);
		f->n++;
	}
}

/* One case: one-shot prefill with every position's logits, then the
 * continuation decoded token by token, teacher-forced. */
static void fx_case(const struct cw_dsv_model *m, const json_t *cs,
		    struct fstats *f)
{
	const int V = cw_dsv_config(m)->vocab_size;
	const json_t *pp = json_object_get(cs, "prompt_positions");
	const json_t *steps = json_object_get(cs, "continuation_steps");
	const json_t *greedy = json_object_get(cs, "greedy_continuation");
	const json_t *jids = json_object_get(cs, "ids");
	int n = (int)json_array_size(jids), ns = (int)json_array_size(steps);
	int32_t ids[n];
	float *lg = malloc((size_t)n * V * sizeof(float));
	struct cw_dsv_state *s = NULL;
	struct st_diag d = { { 0 } };
	int gap_ok = 1, r;

	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
	r = cw_dsv_state_new(m, n + ns + 1, &s);
	r = r ? r : cw_dsv_eval(m, s, ids, n, 1, lg, &d);
	CHECK(r == 0, "fixture case eval: %s", d.msg);
	for (int p = 0; r == 0 && p < n; p++)
		fx_err(json_array_get(pp, p), lg + (size_t)p * V, V, f);
	for (int i = 0; r == 0 && i < ns; i++) {
		const json_t *stp = json_array_get(steps, i);
		const float *row = i == 0 ? lg + (size_t)(n - 1) * V : lg;
		int32_t want = (int32_t)json_integer_value(json_array_get(greedy, i));

		if (i > 0) {
			int32_t prev = (int32_t)json_integer_value(
				json_array_get(greedy, i - 1));

			r = cw_dsv_eval(m, s, &prev, 1, 0, lg, &d);
			CHECK(r == 0, "fixture decode: %s", d.msg);
			if (r)
				break;
			fx_err(stp, lg, V, f);
		}
		if (gap_ok) {
			f->g_total++;
			f->g_same += dsvt_argmax(row, V) == want;
			if (json_number_value(json_object_get(stp, "top1_minus_top2")) < 0.1)
				gap_ok = 0;
		}
	}
	cw_dsv_state_free(s);
	free(lg);
}

/* The fixture rule for fast mode (header, point 3): median max|dlogit|
 * <= med_max, lse within 0.1 at >= lse_share of the positions, greedy
 * equal at >= g_share of the decided steps. */
static void fixture_pass(const struct cw_dsv_model *fm, const char *dir,
			 int qat, double med_max, double lse_share,
			 double g_share)
{
	char path[4300];
	json_t *j;
	const json_t *cs;
	size_t ci;
	struct fstats *f = calloc(1, sizeof(*f));
	double ml, ms, wl, ws;

	snprintf(path, sizeof(path), "%s/%s", dir,
		 qat ? "reference.json" : "reference_noqat.json");
	j = json_load_file(path, 0, NULL);
	CHECK(j && f, "%s unreadable", path);
	if (!j || !f) {
		free(f);
		return;
	}
	json_array_foreach(json_object_get(j, "cases"), ci, cs)
		fx_case(fm, cs, f);
	ml = quantile(f->dl, f->n, 0.5);
	ms = quantile(f->ds, f->n, 0.5);
	wl = dsvt_share_within(f->dl, f->n, 0.1);
	ws = dsvt_share_within(f->ds, f->n, 0.1);
	printf("fast kernels vs %s: %d positions; max|dlogit| median %.4g, "
	       "within 0.1 %.1f %%; |dlse| median %.4g, within 0.1 %.1f %%; "
	       "greedy %d / %d\n", qat ? "reference.json (QAT on)" :
	       "reference_noqat.json (QAT off)", f->n, ml, 100 * wl, ms,
	       100 * ws, f->g_same, f->g_total);
	CHECK(f->n > 0, "no positions");
	CHECK(ml <= med_max, "median max|dlogit| %.4g > %g", ml, med_max);
	CHECK(ws >= lse_share, "lse within 0.1: %.3f < %g", ws, lse_share);
	CHECK(f->g_total > 0 && f->g_same >= g_share * f->g_total,
	      "greedy %d / %d < %g", f->g_same, f->g_total, g_share);
	json_decref(j);
	free(f);
}

/* One case evaluated with expert overlap on and off (threads 0), and
 * with 1 and 3 threads (threads 1): bit-identical. */
static void overlap_pass(struct cw_dsv_model *fm, const json_t *cs,
			 int threads)
{
	const int V = cw_dsv_config(fm)->vocab_size;
	int n;
	int32_t *ids = dsvt_case_ids(cs, 1, &n, NULL);
	float *a = malloc((size_t)n * V * sizeof(float));
	float *b = malloc((size_t)n * V * sizeof(float));
	struct st_diag d = { { 0 } };

	for (int pass = 0; pass < 2; pass++) {
		struct cw_dsv_state *s = NULL;
		int r;

		if (threads)
			r = cw_dsv41_set_threads(fm, pass ? 3 : 1);
		else
			cw_dsv_set_decode_overlap(fm, 1, !pass), r = 0;
		r = r ? r : cw_dsv_state_new(fm, n, &s);
		r = r ? r : cw_dsv_eval(fm, s, ids, n, 1, pass ? b : a, &d);
		CHECK(r == 0, "overlap pass %d: %s", pass, d.msg);
		cw_dsv_state_free(s);
	}
	cw_dsv_set_decode_overlap(fm, 1, 1);
	CHECK(cw_dsv41_set_threads(fm, 1) == 0, "threads 1");
	CHECK(!memcmp(a, b, (size_t)n * V * sizeof(float)),
	      "logits with %s differ", threads ? "3 threads and 1" :
	      "per-expert overlap off and on");
	printf("%s: %d positions bit-identical: %s\n", threads ?
	       "3 threads vs 1" : "per-expert overlap off vs on", n,
	       memcmp(a, b, (size_t)n * V * sizeof(float)) ? "no" : "yes");
	free(ids);
	free(a);
	free(b);
}

/* V4: pass 0, fast mode's layout on the exact backend; pass 1, the fast
 * kernels with the gate look-ahead at depth 2 (results do not depend on
 * it); the tolerances of the header. */
static void v4_passes(struct fast_ctx *x)
{
	struct dsvt_cmp *cp = x->c;

	for (int pass = 0; pass < 2; pass++) {
		struct cw_dsv_run_stats rs = { 0 };
		struct es_tier_stats ts0, ts1;
		long m;
		double med, p90;

		memset(cp, 0, sizeof(*cp));
		CHECK(cw_dsv_set_backend(x->fm, pass ? cw_backend_cpu_fast() :
							cw_backend_cpu()) == 0,
		      "set_backend");
		CHECK(cw_dsv_set_prefetch_depth(x->fm, pass ? 2 : 0) == 0,
		      "set_prefetch_depth");
		es_client_tier_stats(x->es, &ts0);
		run_all(x->ref, x->fm, x->cases, cp, &rs);
		es_client_tier_stats(x->es, &ts1);
		m = cp->n_pos < DSVT_CMP_MAX ? cp->n_pos : DSVT_CMP_MAX;
		qsort(cp->dlp, m, sizeof(double), dsvt_cmp_double);
		qsort(cp->rel, m, sizeof(double), dsvt_cmp_double);
		med = m ? cp->dlp[m / 2] : INFINITY;
		p90 = m ? cp->rel[m * 9 / 10] : INFINITY;
		printf("%s vs reference over %ld positions: top-1 %.4f, median "
		       "|dlogp| %.5f, max |dlogit|/std median %.4f, 90%% %.4f, "
		       "max %.4f; bit-identical positions %ld\n",
		       pass ? "fast kernels" : "fast layout, exact backend",
		       cp->n_pos,
		       (double)cp->top1_same / (cp->n_pos ? cp->n_pos : 1),
		       med, m ? cp->rel[m / 2] : 0.0, p90, cp->worst_rel,
		       cp->identical);
		CHECK(cp->n_pos > 0, "no positions");
		if (!pass) {
			CHECK(cp->top1_same == cp->n_pos, "exact backend: top-1 "
			      "%ld/%ld", cp->top1_same, cp->n_pos);
			CHECK(cp->worst_rel <= 1e-3, "exact backend: max "
			      "|dlogit|/std %.2e > 1e-3", cp->worst_rel);
		} else {
			CHECK(cp->top1_same >= 0.85 * cp->n_pos, "top-1 %ld/%ld "
			      "< 0.85", cp->top1_same, cp->n_pos);
			CHECK(med <= 0.1, "median |dlogp| %.5f > 0.1", med);
			CHECK(p90 <= 0.6, "90th percentile |dlogit|/std %.4f > "
			      "0.6", p90);
			CHECK(cp->identical < cp->n_pos, "fast kernels "
			      "bit-identical to reference at every position: not "
			      "taken?");
		}
		check_acquired(x, &rs);
		check_hints(x, pass, pass ? 2 : 0, 0, &ts0, &ts1, &rs);
	}
}

/* V4's layer-start hint pass: 24 fixed tokens, the score-routed layers
 * hinted. */
static void v4_layer_hints(struct fast_ctx *x)
{
	const struct st_dsv_config *c = cw_dsv_config(x->fm);
	const int V = c->vocab_size, n = 24;
	const int scored = c->n_layers - (c->n_hash_layers < c->n_layers ?
					  c->n_hash_layers : c->n_layers);
	int32_t ids[24];

	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)((i * 7919u + 13u) % (unsigned)V);
	CHECK(scored > 0, "the fixture has no score-routed layer");
	dsvt_layer_hint_pass(&n_fail, x->fm, x->es, ids, n, scored);
}

/* V4.1, points 2 to 4 of the header and its layer-start hint pass (the
 * first case, layers 1.. hinted). */
static void v41_passes(struct fast_ctx *x, const char *store)
{
	const struct st_dsv_config *cf = cw_dsv_config(x->ref);
	struct cw_dsv_model *fm = x->fm, *sm = NULL;
	struct dsvt_cmp *c = x->c;
	struct st_diag diag = { { 0 } };
	double top1[2] = { 0 };
	int n;
	int32_t *ids;

	/* the int8-activation model of the fast kernels (sim_ops) */
	if (cw_dsv_load_store(store, x->es, ST_DSV_REV_V41, CW_COMPUTE_FAST,
			      &sm, &diag) ||
	    cw_dsv_set_backend(sm, &sim_ops)) {
		CHECK(0, "second fast model: %s", diag.msg);
		cw_dsv_free(sm);
		return;
	}
	/* 0: the layout on the exact backend (QAT off); 1, 2: the fast
	 * kernels against reference mode, QAT on with look-ahead 2, then
	 * QAT off; 3, 4: the int8-activation model against the fast kernels
	 * and against reference mode (QAT off); 5: the layout on the exact
	 * backend, 6: the fast kernels against the int8 model, QAT on */
	for (int pass = 0; pass < 7; pass++) {
		unsigned qat = pass == 1 || pass >= 5 ? CW_DSV41_QAT_ALL : 0;
		int depth = pass == 1 ? 2 : 0;
		const struct cw_dsv_model *ma = pass == 3 || pass == 6 ? sm :
									 x->ref;
		const struct cw_dsv_model *mb = pass == 4 ? sm : fm;
		struct cw_dsv_run_stats rs = { 0 };
		struct es_tier_stats ts0, ts1;
		double med, p90;
		static const char *const what[] = {
			"fast layout on the exact backend vs reference, QAT off",
			"fast kernels vs reference, QAT on",
			"fast kernels vs reference, QAT off",
			"fast kernels vs the int8-activation model, QAT off",
			"int8-activation model vs reference, QAT off",
			"fast layout on the exact backend vs reference, QAT on",
			"fast kernels vs the int8-activation model, QAT on",
		};

		memset(c, 0, sizeof(*c));
		CHECK(cw_dsv_set_backend(fm, pass && pass != 5 ?
						      cw_backend_cpu_fast() :
						      cw_backend_cpu()) == 0,
		      "set_backend");
		CHECK(cw_dsv_set_qat(x->ref, qat) == 0 &&
		      cw_dsv_set_qat(fm, qat) == 0 &&
		      cw_dsv_set_qat(sm, qat) == 0, "set_qat");
		CHECK(cw_dsv_set_prefetch_depth(fm, depth) == 0, "depth");
		es_client_tier_stats(x->es, &ts0);
		run_all(ma, mb, x->cases, c, &rs);
		es_client_tier_stats(x->es, &ts1);
		p90 = summary(what[pass], c, &med);
		CHECK(c->n_pos > 0, "no positions");
		switch (pass) {
		case 0:
			CHECK(c->top1_same == c->n_pos, "exact backend: top-1 "
			      "%ld/%ld", c->top1_same, c->n_pos);
			CHECK(c->worst_rel <= 1e-3, "exact backend: max "
			      "|dlogit|/std %.2e > 1e-3", c->worst_rel);
			break;
		case 1: /* QAT on: rounding flips amplify the int8 step */
			CHECK(c->top1_same >= TOP1_QAT * c->n_pos, "%s: top-1 "
			      "%ld/%ld", what[pass], c->top1_same, c->n_pos);
			CHECK(med <= DLP_QAT, "%s: median |dlogp| %.4f",
			      what[pass], med);
			CHECK(p90 <= REL90_QAT, "%s: 90%% |dlogit|/std %.4f",
			      what[pass], p90);
			break;
		case 2:
		case 4:
			CHECK(c->top1_same >= TOP1 * c->n_pos, "%s: top-1 "
			      "%ld/%ld", what[pass], c->top1_same, c->n_pos);
			CHECK(med <= DLP, "%s: median |dlogp| %.4f", what[pass],
			      med);
			CHECK(p90 <= REL90, "%s: 90%% |dlogit|/std %.4f",
			      what[pass], p90);
			break;
		case 3:
			CHECK(c->top1_same >= TOP1_SIM * c->n_pos, "%s: top-1 "
			      "%ld/%ld", what[pass], c->top1_same, c->n_pos);
			CHECK(p90 <= REL90_SIM && c->worst_rel <= MAX_SIM,
			      "%s: |dlogit|/std 90%% %.4f, max %.4f", what[pass],
			      p90, c->worst_rel);
			break;
		case 5: /* QAT flips amplify float summation order */
			CHECK(c->top1_same >= 0.95 * c->n_pos && med <= 1e-3,
			      "%s: top-1 %ld/%ld, median |dlogp| %.4f",
			      what[pass], c->top1_same, c->n_pos, med);
			break;
		case 6:
			CHECK(c->top1_same >= 0.85 * c->n_pos && med <= 0.05,
			      "%s: top-1 %ld/%ld, median |dlogp| %.4f",
			      what[pass], c->top1_same, c->n_pos, med);
			break;
		}
		/* the int8 model is as far from reference as the kernels */
		if (pass == 2 || pass == 4)
			top1[pass / 4] = (double)c->top1_same / c->n_pos;
		if (pass == 4)
			CHECK(fabs(top1[0] - top1[1]) <= 0.03, "top-1 agreement "
			      "with reference: fast kernels %.3f, int8 model "
			      "%.3f", top1[0], top1[1]);
		if (pass && pass < 3)
			CHECK(c->identical < c->n_pos, "fast kernels "
			      "bit-identical to reference everywhere: not taken?");
		check_acquired(x, &rs);
		if (pass < 3)
			check_hints(x, pass, depth, 1, &ts0, &ts1, &rs);
	}
	cw_dsv_free(sm);
	/* 3: the fast kernels against the fixture's references */
	CHECK(cw_dsv_set_backend(fm, cw_backend_cpu_fast()) == 0, "backend");
	CHECK(cw_dsv_set_prefetch_depth(fm, 0) == 0, "depth");
	CHECK(cw_dsv_set_qat(fm, 0) == 0, "qat");
	fixture_pass(fm, x->dir, 0, 0.6, 0.9, 0.6);   /* [0.386, 0.980, 7/9] */
	CHECK(cw_dsv_set_qat(fm, CW_DSV41_QAT_ALL) == 0, "qat");
	fixture_pass(fm, x->dir, 1, 1.8, 0.7, 0.25);  /* [1.19, 0.825, 7/20] */
	/* 4: overlap on/off, 3 threads vs 1 */
	overlap_pass(fm, json_array_get(x->cases,
					json_array_size(x->cases) - 1), 0);
	overlap_pass(fm, json_array_get(x->cases,
					json_array_size(x->cases) - 1), 1);
	ids = dsvt_case_ids(json_array_get(x->cases, 0), 1, &n, NULL);
	CHECK(ids != NULL, "case ids");
	if (ids)
		dsvt_layer_hint_pass(&n_fail, fm, x->es, ids, n,
				     cf->n_layers - 1);
	free(ids);
	CHECK(cw_dsv41_set_threads(x->ref, 2) == -EINVAL &&
	      cw_dsv41_set_threads(fm, 0) == -EINVAL, "bad thread counts");
}

/* The greedy mode (header). */
static int greedy_main(int argc, char **argv)
{
	const char *store = argv[2];
	const char *args[] = { "--store", store, "--host-budget", "25%", NULL };
	int n_tok = atoi(argv[3]), n = argc - 4, r;
	int32_t *ids = calloc((size_t)n + 1, sizeof(int32_t));
	struct st_diag diag = { { 0 } };
	struct st_test_inst inst;
	struct es_client *es = NULL;
	char msg[1024];
	struct cw_dsv_model *m = NULL;
	struct cw_dsv_state *s = NULL;
	float *lg = NULL;

	if (n < 1 || n_tok < 1 || !ids)
		return 2;
	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)atoi(argv[4 + i]);
	st_test_inst_init(&inst, "dsv41g");
	r = dsvt_expertd_open(&inst, args, &es, msg, sizeof(msg));
	if (r < 0)
		fprintf(stderr, "%s\n", msg);
	r = r < 0 ? r : cw_dsv_load_store(store, es, ST_DSV_REV_V41,
					  CW_COMPUTE_FAST, &m, &diag);
	r = r < 0 ? r : cw_dsv_state_new(m, n + n_tok + 1, &s);
	if (r == 0) {
		const int V = cw_dsv_config(m)->vocab_size;

		lg = malloc((size_t)V * sizeof(float));
		r = lg ? cw_dsv_eval(m, s, ids, n, 0, lg, &diag) : -ENOMEM;
		printf("[");
		for (int i = 0; r == 0 && i < n_tok; i++) {
			int32_t t = dsvt_argmax(lg, V);

			printf("%s%d", i ? ", " : "", t);
			if (i + 1 < n_tok)
				r = cw_dsv_eval(m, s, &t, 1, 0, lg, &diag);
		}
		printf("]\n");
	}
	if (r < 0)
		fprintf(stderr, "greedy: %s\n", diag.msg);
	free(lg);
	cw_dsv_state_free(s);
	cw_dsv_free(m);
	es_client_close(es);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
	free(ids);
	return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	char dir[4096], tmp[4096], store[4200];
	const char *args[] = { "--store", store, "--host-budget", "25%",
			       "--engram-cache", ENGRAM_CACHE, NULL };
	struct st_diag diag = { { 0 } };
	struct fast_ctx x = { 0 };
	struct st_test_inst inst;
	char msg[1024];
	struct es_stats st = { 0 };
	enum st_dsv_revision rev;
	json_t *refj = NULL;
	int gen;

	if (argc < 2 || (strcmp(argv[1], "v4") && strcmp(argv[1], "v41"))) {
		fprintf(stderr, "usage: %s v4 [MODEL_DIR] | v41 [greedy STORE "
			"N ID...]\n", argv[0]);
		return 2;
	}
	x.v41 = !strcmp(argv[1], "v41");
	rev = x.v41 ? ST_DSV_REV_V41 : ST_DSV_REV_V4;
	if (x.v41 && argc > 4 && !strcmp(argv[2], "greedy"))
		return greedy_main(argc - 1, argv + 1);
	if (!x.v41)
		args[4] = NULL; /* V4 has no Engram tier */
	gen = !x.v41 && argc > 2;
	if (gen)
		snprintf(dir, sizeof(dir), "%s", argv[2]);
	else
		st_test_fixture_model(x.v41 ? "tiny-deepseek-v41" :
				      "tiny-deepseek-v4", dir, sizeof(dir));
	x.dir = dir;
	/* not before the greedy branch: it returns without freeing */
	x.c = calloc(1, sizeof(*x.c));
	if (!gen) {
		refj = dsvt_load_json(dir, "reference.json");
		x.cases = refj ? dsvt_cases(refj, "reference.json") : NULL;
		if (!json_is_array(x.cases))
			return 1;
	}
	if (!x.c || dsvt_convert_tmp(dir, tmp, sizeof(tmp), store,
				     sizeof(store)))
		return 1;
	if (cw_dsv_load(dir, rev, CW_COMPUTE_REFERENCE, &x.ref, &diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	st_test_inst_init(&inst, x.v41 ? "dsv41f" : "dsv4f");
	if (dsvt_expertd_open(&inst, args, &x.es, msg, sizeof(msg)) < 0) {
		CHECK(0, "%s", msg);
		goto out;
	}
	/* an unknown mode is refused */
	CHECK(cw_dsv_load_store(store, x.es, rev, (enum cw_compute)7, &x.fm,
				&diag) == -EINVAL, "mode 7 accepted");
	if (cw_dsv_load_store(store, x.es, rev, CW_COMPUTE_FAST, &x.fm,
			      &diag)) {
		CHECK(0, "cw_dsv_load_store fast: %s", diag.msg);
		goto out;
	}
	CHECK(cw_dsv_compute(x.fm) == CW_COMPUTE_FAST &&
	      cw_dsv_compute(x.ref) == CW_COMPUTE_REFERENCE, "compute mode");
	CHECK(cw_dsv_set_backend(x.ref, cw_backend_cpu()) == -EINVAL,
	      "set_backend on a reference model accepted");
	/* fast mode keeps FP8 weights as 1-byte codes (a quarter of F32);
	 * V4.1 keeps BF16 (half), its LM head dominating the tiny model */
	printf("dense bytes per token: fast %llu, reference %llu\n",
	       (unsigned long long)cw_dsv_dense_bytes(x.fm),
	       (unsigned long long)cw_dsv_dense_bytes(x.ref));
	if (x.v41)
		CHECK(2 * cw_dsv_dense_bytes(x.fm) <= cw_dsv_dense_bytes(x.ref),
		      "fast dense bytes not at most half of reference's");
	else
		CHECK(cw_dsv_dense_bytes(x.fm) < cw_dsv_dense_bytes(x.ref),
		      "fast dense bytes not below reference's");
	if (x.v41) {
		v41_passes(&x, store);
	} else {
		/* the exact math (issue 28's --exact-math): the official
		 * round trips' rounding flips amplify float summation order
		 * differences beyond the header's tolerances */
		CHECK(cw_dsv_set_qat(x.ref, 0) == 0 &&
		      cw_dsv_set_qat(x.fm, 0) == 0, "exact math");
		v4_passes(&x);
		v4_layer_hints(&x);
	}
	checkpoint_pass(&x, rev);
	CHECK(es_client_stats(x.es, &st) == 0, "stats");
	printf("expertd at 25%%: %llu hits, %llu misses, %llu evictions\n",
	       (unsigned long long)st.hits, (unsigned long long)st.misses,
	       (unsigned long long)st.evictions);
	CHECK(st.evictions > 0, "no eviction at 25%%");
out:
	cw_dsv_free(x.fm);
	es_client_close(x.es);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
	cw_dsv_free(x.ref);
	st_rm_rf(tmp);
	json_decref(refj);
	free(x.c);
	return dsvt_finish(n_fail);
}
