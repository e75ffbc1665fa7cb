/*
 * test_dsv_mtp.c — DeepSeek-V4's MTP block (cw_dsv_mtp_eval, issue 22
 * §1b) on the tiny-deepseek-v4 fixture, whose checkpoint carries an
 * mtp.0.* block, against the independent oracle's output
 * tests/data/dsv-oracle-v4-mtp.json (scripts/dsv-oracle.py --mtp 4: numpy
 * float64 of the official inference/model.py MTPBlock; the fixture's own
 * reference never reads the block).
 *
 * Per case, in order of position:
 *  - teacher-forced: the prompt through the main model (its streams kept,
 *    cw_dsv_set_streams_out), then the block at each position i < n - 1
 *    on the streams at i and token ids[i + 1];
 *  - a draft chain after the prompt: the block at n - 1 on the main
 *    model's last streams and its greedy token, then at n, n + 1, ... on
 *    its own output streams and the oracle's chain tokens;
 * each position's top-10 logits and log-sum-exp within DSVT_ORACLE_TIGHT, the
 * chain's argmax the oracle's draft token, with the same allowance as the
 * main model's oracle mode (test_dsv_reference.c, mode oracle): a first
 * divergence only at or shortly after a rounding knife edge the oracle
 * lists, loose bounds after it.  Also, independent of the oracle:
 *  - roll-back: the block re-run at n - 1 after the chain gives the chain's
 *    first logits bit for bit (its window ring keeps the earlier rows);
 *  - refusals: a position past those evaluated, a roll-back beyond the
 *    ring's slack, an out-of-range token, a model without the block
 *    (tiny-deepseek-v41: its checkpoint has no MTP block).
 *
 * Mode "fast": the block in fast mode's data layout (FP8 e_proj / h_proj
 * and block weights as E4M3 codes with expanded scales, the LM head
 * BF16) on the exact backend (cw_backend_cpu), exact math on both sides
 * (QAT off, as test_dsv_fast's layout check: the round trips' flips would
 * amplify summation-order differences): at every teacher-forced position
 * of every case, top-1 equal to reference mode's and max |delta logit| <=
 * 1e-3 x the std of the reference logits (only float vs double summation
 * differs), so a wrong offset, scale or layout fails.
 *
 * Mode "draft": drafting with the block (cw_dsv_mtp_follow,
 * cw_dsv_mtp_draft) on every case: the prompt evaluated in two chunks
 * while the block follows (making each position's window row alone)
 * gives the drafts of the oracle-checked chain (the block by hand, each
 * position evaluated in full: teacher-forced, then chained on its own
 * streams), token for token; then a verify step (the greedy token and the drafts
 * evaluated, all but one cut back) and the next drafts equal those of a
 * state that evaluated only the kept tokens (the block's window is rebuilt
 * on the accepted streams, nothing of a cut token remains).
 *
 * Mode "store" (argv[1]): the fixture converted by strata convert (which
 * keeps the block: its experts the store's last expert layer, served by a
 * real expertd; its other tensors in dense.bin) gives the checkpoint's
 * MTP logits and output streams bit for bit, teacher-forced and chained.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_backend.h"
#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "st_error.h"
#include "st_store.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

static void must(int r, const struct st_diag *d, const char *what)
{
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", what, d->msg);
		exit(1);
	}
}

/* Figures over all positions compared. */
struct figs {
	int n, diverged, top1_same, top1_total;
	double max_tight; /* max |dlogit| before any divergence */
};

/* One position's logits lg[V] against record rec (position p of case cs);
 * *div: the case's first divergent position so far (-1: none). */
static void check_pos(const json_t *cs, const json_t *rec, const float *lg,
		      int V, int p, const char *what, struct figs *f,
		      int *div)
{
	const char *name = json_string_value(json_object_get(cs, "name"));
	double dl, ds;
	int am, ok;

	CHECK(rec != NULL, "%s %s pos %d: no oracle record", name, what, p);
	if (!rec)
		return;
	ok = dsvt_top1_ok(rec, lg, V, 2 * DSVT_ORACLE_TIGHT, &am);
	dsvt_dist_err(rec, lg, V, &dl, &ds);
	f->n++;
	f->top1_total++;
	f->top1_same += ok;
	CHECK(isfinite(dl) && isfinite(ds), "%s %s pos %d: not finite", name,
	      what, p);
	if (*div < 0 &&
	    (dl > DSVT_ORACLE_TIGHT || ds > DSVT_ORACLE_TIGHT || !ok)) {
		*div = p;
		f->diverged++;
		printf("%s: %s leaves the oracle at position %d (max|dlogit| %.3g, |dlse| %.3g, argmax %s)\n",
		       name, what, p, dl, ds, ok ? "equal" : "differs");
		CHECK(dsvt_fragile_before(cs, p, DSVT_ORACLE_REACH,
					  DSVT_ORACLE_FRAGILE) >= 0,
		      "%s %s pos %d: max|dlogit| %.3g, |dlse| %.3g, argmax %d, with no rounding knife edge at or up to %d positions before",
		      name, what, p, dl, ds, am, DSVT_ORACLE_REACH);
	} else if (*div >= 0) {
		CHECK(dl <= DSVT_ORACLE_AFTER_LOGIT &&
		      ds <= DSVT_ORACLE_AFTER_LSE,
		      "%s %s pos %d (after the divergence at %d): max|dlogit| %.3g, |dlse| %.3g",
		      name, what, p, *div, dl, ds);
	} else if (dl > f->max_tight) {
		f->max_tight = dl;
	}
}

/* One oracle case: teacher-forced positions, the chain, the roll-back. */
static void mtp_case(const struct cw_dsv_model *m, const json_t *cs,
		     struct figs *f)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int V = c->vocab_size, nx = c->hc_mult * c->hidden_size;
	const char *name = json_string_value(json_object_get(cs, "name"));
	const json_t *rows = json_object_get(cs, "mtp_positions");
	const json_t *toks = json_object_get(cs, "chain_tokens");
	const json_t *steps = json_object_get(cs, "chain_steps");
	int n, K = (int)json_array_size(steps), div = -1;
	int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);
	float *X = malloc((size_t)n * nx * sizeof(float));
	float *xa = malloc((size_t)nx * sizeof(float));
	float *xb = malloc((size_t)nx * sizeof(float));
	float *lg = malloc((size_t)V * sizeof(float));
	float *first = malloc((size_t)V * sizeof(float));
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };

	if (!ids || !X || !xa || !xb || !lg || !first)
		abort();
	CHECK((int)json_array_size(rows) == n - 1 &&
	      (int)json_array_size(toks) == K + 1 && K > 0,
	      "%s: malformed oracle case", name);
	must(cw_dsv_state_new(m, n + 1, &s), &d, "state");
	cw_dsv_set_streams_out(s, X, n);
	must(cw_dsv_eval(m, s, ids, n, 0, lg, &d), &d, name);
	cw_dsv_set_streams_out(s, NULL, 0);
	/* the chain starts from the main model's greedy token */
	{
		int32_t g0 = (int32_t)json_integer_value(json_array_get(toks, 0));

		CHECK(dsvt_argmax(lg, V) == g0,
		      "%s: main model's greedy token %d, oracle %d", name,
		      dsvt_argmax(lg, V), g0);
	}
	for (int i = 0; i + 1 < n; i++) {
		must(cw_dsv_mtp_eval(m, s, i, X + (size_t)i * nx, ids[i + 1],
				     lg, NULL, &d), &d, name);
		check_pos(cs, json_array_get(rows, i), lg, V, i,
			  "teacher-forced", f, &div);
	}
	memcpy(xa, X + (size_t)(n - 1) * nx, (size_t)nx * sizeof(float));
	for (int j = 0; j < K; j++) {
		const json_t *st = json_array_get(steps, j);
		int32_t tok = (int32_t)json_integer_value(json_array_get(toks, j));
		int32_t next = (int32_t)json_integer_value(
			json_array_get(toks, j + 1));
		int p = n - 1 + j;

		must(cw_dsv_mtp_eval(m, s, p, xa, tok, lg, xb, &d), &d, name);
		if (j == 0)
			memcpy(first, lg, (size_t)V * sizeof(float));
		check_pos(cs, st, lg, V, p, "chain", f, &div);
		if (div < 0 &&
		    json_number_value(json_object_get(st, "top1_minus_top2")) >=
			    DSVT_ORACLE_GAP)
			CHECK(dsvt_argmax(lg, V) == next,
			      "%s chain step %d: draft %d, oracle %d", name, j,
			      dsvt_argmax(lg, V), next);
		memcpy(xa, xb, (size_t)nx * sizeof(float));
	}
	/* roll back to n - 1: the rows the chain wrote past it are not read */
	must(cw_dsv_mtp_eval(m, s, n - 1, X + (size_t)(n - 1) * nx,
			     (int32_t)json_integer_value(json_array_get(toks, 0)),
			     lg, NULL, &d), &d, name);
	CHECK(!memcmp(lg, first, (size_t)V * sizeof(float)),
	      "%s: the block re-run at %d after a %d-step chain differs (max %.3g)",
	      name, n - 1, K, dsvt_max_abs_diff(lg, first, V, NULL));
	cw_dsv_state_free(s);
	free(first);
	free(lg);
	free(xb);
	free(xa);
	free(X);
	free(ids);
}

/* The refusals cw_dsv_mtp_eval documents. */
static void refusals(const struct cw_dsv_model *m)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int nx = c->hc_mult * c->hidden_size;
	float *x = calloc((size_t)nx, sizeof(float));
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	int r;

	if (!x)
		abort();
	for (int i = 0; i < nx; i++)
		x[i] = (float)((i % 7) - 3) * 0.25f;
	must(cw_dsv_state_new(m, 8, &s), &d, "state");
	r = cw_dsv_mtp_eval(m, s, 1, x, 5, NULL, NULL, &d);
	CHECK(r == -EINVAL && strstr(d.msg, "[0, 0)"),
	      "position 1 before 0: %d (%s)", r, d.msg);
	r = cw_dsv_mtp_eval(m, s, 0, x, c->vocab_size, NULL, NULL, &d);
	CHECK(r == -EINVAL && strstr(d.msg, "out of range"),
	      "token = vocab: %d (%s)", r, d.msg);
	for (int p = 0; p <= CW_DSV_ROLLBACK_MAX + 1; p++)
		must(cw_dsv_mtp_eval(m, s, p, x, 5 + p, NULL, NULL, &d), &d,
		     "chain");
	/* highest evaluated: SLACK + 1; position 1 rolls back SLACK + 1 */
	r = cw_dsv_mtp_eval(m, s, 1, x, 5, NULL, NULL, &d);
	CHECK(r == -EINVAL && strstr(d.msg, "roll-back"),
	      "roll-back past the slack: %d (%s)", r, d.msg);
	r = cw_dsv_mtp_eval(m, s, 2, x, 5, NULL, NULL, &d);
	CHECK(r == 0, "roll-back within the slack: %d (%s)", r, d.msg);
	cw_dsv_state_free(s);
	free(x);
}

/* The MTP block of ck (checkpoint) and sm (store) on ids[0..n):
 * teacher-forced at every position, then a chain of 3 on each model's own
 * argmax; logits and output streams bit-identical. */
static void same_mtp(const struct cw_dsv_model *ck,
		     const struct cw_dsv_model *sm, const int32_t *ids, int n,
		     const char *name)
{
	const struct st_dsv_config *c = cw_dsv_config(ck);
	const int V = c->vocab_size, nx = c->hc_mult * c->hidden_size;
	const struct cw_dsv_model *mm[2] = { ck, sm };
	struct cw_dsv_state *s[2];
	float *X[2], *lg[2], *xo[2];
	struct st_diag d = { { 0 } };
	int cmp = 0;

	for (int k = 0; k < 2; k++) {
		X[k] = malloc((size_t)n * nx * sizeof(float));
		lg[k] = malloc((size_t)V * sizeof(float));
		xo[k] = malloc((size_t)nx * sizeof(float));
		if (!X[k] || !lg[k] || !xo[k])
			abort();
		must(cw_dsv_state_new(mm[k], n + 4, &s[k]), &d, "state");
		cw_dsv_set_streams_out(s[k], X[k], n);
		must(cw_dsv_eval(mm[k], s[k], ids, n, 0, lg[k], &d), &d, name);
	}
	CHECK(!memcmp(X[0], X[1], (size_t)n * nx * sizeof(float)),
	      "%s: main model streams differ", name);
	for (int p = 0; p < n + 2; p++) {
		int32_t tok = p + 1 < n ? ids[p + 1] : dsvt_argmax(lg[0], V);

		for (int k = 0; k < 2; k++)
			must(cw_dsv_mtp_eval(mm[k], s[k], p,
					     p < n ? X[k] + (size_t)p * nx : xo[k],
					     tok, lg[k], xo[k], &d), &d, name);
		CHECK(!memcmp(lg[0], lg[1], (size_t)V * sizeof(float)) &&
		      !memcmp(xo[0], xo[1], (size_t)nx * sizeof(float)),
		      "%s MTP position %d: store %s differ (max|dlogit| %.3g)",
		      name, p, "model's logits or streams",
		      dsvt_max_abs_diff(lg[0], lg[1], V, NULL));
		cmp++;
		if (p == n - 1) /* the chain goes on from the block's streams */
			memcpy(X[0] + (size_t)(n - 1) * nx, xo[0],
			       (size_t)nx * sizeof(float));
	}
	printf("%s: MTP block from the store = from the checkpoint at %d positions (bit for bit)\n",
	       name, cmp);
	for (int k = 0; k < 2; k++) {
		cw_dsv_state_free(s[k]);
		free(X[k]);
		free(lg[k]);
		free(xo[k]);
	}
}

/* The block by hand after evaluating ids[0..n) on a fresh state: k
 * drafts after `next`. */
static void hand_drafts(const struct cw_dsv_model *m, const int32_t *ids,
			int n, int32_t next, int k, int32_t *out)
{
	const struct st_dsv_config *c = cw_dsv_config(m);
	const int V = c->vocab_size, nx = c->hc_mult * c->hidden_size;
	float *X = malloc((size_t)n * nx * sizeof(float));
	float *xa = malloc((size_t)nx * sizeof(float));
	float *lg = malloc((size_t)V * sizeof(float));
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };

	if (!X || !xa || !lg)
		abort();
	must(cw_dsv_state_new(m, n + k + 1, &s), &d, "state");
	cw_dsv_set_streams_out(s, X, n);
	must(cw_dsv_eval(m, s, ids, n, 0, NULL, &d), &d, "eval");
	/* every position in full (x_out asked: attention and experts run),
	 * where following makes the window rows alone */
	for (int p = 0; p + 1 < n; p++)
		must(cw_dsv_mtp_eval(m, s, p, X + (size_t)p * nx, ids[p + 1],
				     NULL, xa, &d), &d, "MTP");
	memcpy(xa, X + (size_t)(n - 1) * nx, (size_t)nx * sizeof(float));
	for (int i = 0; i < k; i++) {
		must(cw_dsv_mtp_eval(m, s, n - 1 + i, xa, i ? out[i - 1] : next,
				     lg, xa, &d), &d, "chain");
		out[i] = dsvt_argmax(lg, V);
	}
	cw_dsv_state_free(s);
	free(X);
	free(xa);
	free(lg);
}

/* Mode draft (the header). */
static int mode_draft(const struct cw_dsv_model *m, const char *dir)
{
	enum { K = 4 };
	json_t *refj = dsvt_load_json(dir, "reference.json");
	const json_t *cases = dsvt_cases(refj, "reference.json"), *cs;
	struct st_diag d = { { 0 } };
	int checked = 0;
	size_t ci;

	json_array_foreach(cases, ci, cs) {
		int n, h;
		int32_t *ids = dsvt_case_ids(cs, 1, &n, NULL);
		int32_t got[K], want[K], seq[512];
		struct cw_dsv_state *s;

		if (!ids || n > 500)
			abort();
		/* after the prompt + 2 tokens, in two chunks */
		h = n / 2;
		must(cw_dsv_state_new(m, n + K + 2, &s), &d, "state");
		CHECK(cw_dsv_mtp_draft(m, s, 1, K, got, &d) == -EINVAL,
		      "drafts before following");
		must(cw_dsv_mtp_follow(m, s), &d, "follow");
		must(cw_dsv_eval(m, s, ids, h, 0, NULL, &d), &d, "eval");
		must(cw_dsv_eval(m, s, ids + h, n - 1 - h, 0, NULL, &d), &d,
		     "eval");
		CHECK(cw_dsv_mtp_draft(m, s, ids[n - 1], K, got, &d) == K,
		      "drafts: %s", d.msg);
		hand_drafts(m, ids, n - 1, ids[n - 1], K, want);
		CHECK(!memcmp(got, want, sizeof(got)),
		      "case %zu: drafts %d %d %d %d, by hand %d %d %d %d", ci,
		      got[0], got[1], got[2], got[3], want[0], want[1],
		      want[2], want[3]);
		/* a verify step: ids[n-1] and the drafts, one draft kept */
		memcpy(seq, ids, (size_t)n * sizeof(int32_t));
		memcpy(seq + n, got, sizeof(got));
		must(cw_dsv_eval(m, s, seq + n - 1, 1 + K, 0, NULL, &d), &d,
		     "verify");
		must(cw_dsv_state_truncate(s, n + 1, &d), &d, "cut");
		CHECK(cw_dsv_mtp_draft(m, s, 7, K, got, &d) == K, "drafts: %s",
		      d.msg);
		hand_drafts(m, seq, n + 1, 7, K, want);
		CHECK(!memcmp(got, want, sizeof(got)),
		      "case %zu after a cut: drafts %d %d %d %d, by hand %d %d %d %d",
		      ci, got[0], got[1], got[2], got[3], want[0], want[1],
		      want[2], want[3]);
		cw_dsv_state_free(s);
		free(ids);
		checked++;
	}
	printf("MTP drafts: %d cases, drafts after the prompt and after a verify step's cut equal the block by hand\n",
	       checked);
	json_decref(refj);
	return dsvt_finish(n_fail);
}

/* Mode fast (the header). */
static int mode_fast(struct cw_dsv_model *ref, const char *dir)
{
	const struct st_dsv_config *c = cw_dsv_config(ref);
	const int V = c->vocab_size, nx = c->hc_mult * c->hidden_size;
	struct cw_dsv_model *fm = NULL;
	struct cw_dsv_model *mm[2];
	struct dsvt_cmp *cmp = calloc(1, sizeof(*cmp));
	struct st_diag d = { { 0 } };
	json_t *refj;
	const json_t *cases, *cs;
	size_t ci;

	if (!cmp)
		abort();
	must(cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_FAST, &fm, &d), &d,
	     "fast load");
	CHECK(cw_dsv_has_mtp(fm), "fast mode: no MTP block");
	CHECK(cw_dsv_set_backend(fm, cw_backend_cpu()) == 0 &&
	      cw_dsv_set_qat(fm, 0) == 0 && cw_dsv_set_qat(ref, 0) == 0,
	      "backend / QAT");
	mm[0] = ref;
	mm[1] = fm;
	refj = dsvt_load_json(dir, "reference.json");
	cases = dsvt_cases(refj, "reference.json");
	json_array_foreach(cases, ci, cs) {
		int n;
		int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);
		struct cw_dsv_state *s[2];
		float *X[2], *lg[2];

		if (!ids)
			abort();
		for (int k = 0; k < 2; k++) {
			X[k] = malloc((size_t)n * nx * sizeof(float));
			lg[k] = malloc((size_t)V * sizeof(float));
			if (!X[k] || !lg[k])
				abort();
			must(cw_dsv_state_new(mm[k], n, &s[k]), &d, "state");
			cw_dsv_set_streams_out(s[k], X[k], n);
			must(cw_dsv_eval(mm[k], s[k], ids, n, 0, NULL, &d), &d,
			     "eval");
		}
		for (int i = 0; i + 1 < n; i++) {
			for (int k = 0; k < 2; k++)
				must(cw_dsv_mtp_eval(mm[k], s[k], i,
						     X[k] + (size_t)i * nx,
						     ids[i + 1], lg[k], NULL,
						     &d), &d, "MTP");
			dsvt_compare_pos(cmp, lg[0], lg[1], V);
		}
		for (int k = 0; k < 2; k++) {
			cw_dsv_state_free(s[k]);
			free(X[k]);
			free(lg[k]);
		}
		free(ids);
	}
	printf("MTP block, fast layout on the exact backend vs reference (exact math): %ld positions, top-1 equal %ld, worst max|dlogit| / std %.3g\n",
	       cmp->n_pos, cmp->top1_same, cmp->worst_rel);
	CHECK(cmp->n_pos > 0 && cmp->top1_same == cmp->n_pos,
	      "top-1 equal at %ld of %ld positions", cmp->top1_same,
	      cmp->n_pos);
	CHECK(cmp->worst_rel <= 1e-3, "max|dlogit| / std %.3g > 1e-3",
	      cmp->worst_rel);
	json_decref(refj);
	cw_dsv_free(fm);
	free(cmp);
	return dsvt_finish(n_fail);
}

/* Mode store: convert, serve through expertd, compare (same_mtp). */
static int mode_store(const struct cw_dsv_model *ck, const char *dir)
{
	char tmp[4096], store[4200], msg[1024];
	const char *args[] = { "--store", store, "--host-budget", "100%",
			       NULL };
	struct st_store *st = NULL;
	struct st_test_inst inst;
	struct es_client *es = NULL;
	struct cw_dsv_model *sm = NULL;
	struct st_diag d = { { 0 } };
	json_t *ref;
	const json_t *cases;
	int r;

	if (dsvt_convert_tmp(dir, tmp, sizeof(tmp), store, sizeof(store)))
		return 1;
	r = st_store_open(store, &st, &d);
	CHECK(r == 0, "st_store_open: %s", d.msg);
	if (r == 0) {
		CHECK(st->n_mtp == 1 && st->n_layers == st->dsv4.n_layers + 1 &&
		      st_store_find_dense(st, "mtp.0.e_proj.weight"),
		      "store: MTP block not kept (n_mtp %d, %d expert layers)",
		      st->n_mtp, st->n_layers);
		st_store_close(st);
	}
	st_test_inst_init(&inst, "dsv4-mtp");
	if (dsvt_expertd_open(&inst, args, &es, msg, sizeof(msg)) < 0) {
		CHECK(0, "%s", msg);
		goto out;
	}
	r = cw_dsv_load_store(store, es, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE,
			      &sm, &d);
	CHECK(r == 0, "cw_dsv_load_store: %s", d.msg);
	if (r == 0) {
		CHECK(cw_dsv_has_mtp(sm), "store model: no MTP block");
		ref = dsvt_load_json(dir, "reference.json");
		cases = dsvt_cases(ref, "reference.json");
		for (size_t i = 0; cw_dsv_has_mtp(sm) && i < json_array_size(cases);
		     i += 2) {
			const json_t *cs = json_array_get(cases, i);
			int n;
			int32_t *ids = dsvt_case_ids(cs, 0, &n, NULL);

			if (!ids)
				abort();
			same_mtp(ck, sm, ids, n, json_string_value(
				json_object_get(cs, "name")));
			free(ids);
		}
		json_decref(ref);
	}
	cw_dsv_free(sm);
out:
	es_client_close(es);
	st_test_inst_stop(&inst);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}

int main(int argc, char **argv)
{
	char dir[4096], data[4200];
	struct cw_dsv_model *m, *m41;
	struct st_diag d = { { 0 } };
	struct figs f = { 0 };
	json_t *ref;
	const json_t *cases, *cs;
	const char *model;
	size_t i;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	must(cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &m, &d), &d,
	     dir);
	CHECK(cw_dsv_has_mtp(m) == 1, "tiny-deepseek-v4: MTP block not loaded");
	if (!cw_dsv_has_mtp(m))
		return dsvt_finish(n_fail);
	if (argc > 1 && (!strcmp(argv[1], "store") ||
			 !strcmp(argv[1], "fast") || !strcmp(argv[1], "draft"))) {
		int r = !strcmp(argv[1], "store") ? mode_store(m, dir) :
			!strcmp(argv[1], "fast") ? mode_fast(m, dir) :
						     mode_draft(m, dir);

		cw_dsv_free(m);
		return r;
	}
	snprintf(data, sizeof(data), "%s/tests/data", st_test_source_dir());
	ref = dsvt_load_json(data, "dsv-oracle-v4-mtp.json");
	cases = dsvt_cases(ref, "MTP oracle file");
	model = json_string_value(json_object_get(ref, "model"));
	CHECK(model && !strcmp(model, "tiny-deepseek-v4"),
	      "oracle file is for %s", model ? model : "(none)");
	CHECK(!json_object_get(ref, "check"), "oracle file made for a check");
	printf("oracle: %s\n",
	       json_string_value(json_object_get(ref, "generator")));
	json_array_foreach(cases, i, cs)
		mtp_case(m, cs, &f);
	printf("MTP block vs the oracle: %d positions, max|dlogit| %.3g before any divergence, %d case(s) diverged (each must follow a knife edge), argmax equal at %d of %d\n",
	       f.n, f.max_tight, f.diverged, f.top1_same, f.top1_total);
	CHECK(f.n > 0 && f.top1_same * 10 >= f.top1_total * 9,
	      "argmax equal at only %d of %d positions", f.top1_same,
	      f.top1_total);
	refusals(m);
	json_decref(ref);
	cw_dsv_free(m);
	/* a model without the block */
	st_test_fixture_model("tiny-deepseek-v41", dir, sizeof(dir));
	must(cw_dsv_load(dir, ST_DSV_REV_V41, CW_COMPUTE_REFERENCE, &m41, &d),
	     &d, dir);
	CHECK(!cw_dsv_has_mtp(m41), "tiny-deepseek-v41: an MTP block?");
	{
		struct cw_dsv_state *s;
		float x[1] = { 0 };
		int r;

		must(cw_dsv_state_new(m41, 4, &s), &d, "state");
		r = cw_dsv_mtp_eval(m41, s, 0, x, 1, NULL, NULL, &d);
		CHECK(r == -ST_E_UNSUPPORTED, "V4.1 model: %d (%s)", r, d.msg);
		cw_dsv_state_free(s);
	}
	cw_dsv_free(m41);
	return dsvt_finish(n_fail);
}
