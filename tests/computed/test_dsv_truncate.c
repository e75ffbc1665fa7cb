/*
 * test_dsv_truncate.c — cutting a DeepSeek-V4 process-local state back
 * (cw_dsv_state_truncate: the rejected tokens of a verified draft, issue
 * 22) on the tiny-deepseek-v4 fixture in reference mode, official math.
 *
 * For the fixture's longest cases: the sequence evaluated with, before
 * every real token, 1..CW_DSV_ROLLBACK_MAX pseudo-random "rejected draft"
 * tokens evaluated and cut back again (so they close compressor windows,
 * emit compressed and index rows, and overwrite ring slots); every real
 * position's logits must equal, bit for bit, those of the sequence
 * evaluated without them (one prefill).  The same with cuts of every
 * depth in one place (several evals, then one cut).  Refusals: a cut
 * longer than the slack (also after an earlier cut: the highest position
 * evaluated counts), a length past the state's, a V4.1 state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "st_error.h"
#include "test_util.h"

static int n_fail;

static void must(int r, const struct st_diag *d, const char *what)
{
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", what, d->msg);
		exit(1);
	}
}

/* ids[0..n) with garbage drafts cut back before each real token; every
 * position's logits against ref (n x V). */
static void drafts_cut(const struct cw_dsv_model *m, const int32_t *ids,
		       int n, const float *ref, const char *name)
{
	const int V = cw_dsv_config(m)->vocab_size;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	float *lg = malloc((size_t)(CW_DSV_ROLLBACK_MAX + 1) * V *
			   sizeof(float));
	int32_t junk[CW_DSV_ROLLBACK_MAX];
	unsigned seed = 7;
	int same = 0, cut = 0;

	if (!lg)
		abort();
	must(cw_dsv_state_new(m, n + CW_DSV_ROLLBACK_MAX, &s), &d, "state");
	for (int p = 0; p < n; p++) {
		int k = 1 + p % CW_DSV_ROLLBACK_MAX;

		if (p > 0) { /* a rejected draft after position p - 1 */
			for (int i = 0; i < k; i++)
				junk[i] = (int32_t)(((unsigned)(dsvt_prand(&seed) +
								1.0f) *
						     60000u) % (unsigned)V);
			must(cw_dsv_eval(m, s, junk, k, 1, lg, &d), &d, "draft");
			must(cw_dsv_state_truncate(s, p, &d), &d, "cut");
			cut += k;
		}
		must(cw_dsv_eval(m, s, ids + p, 1, 0, lg, &d), &d, name);
		same += !memcmp(lg, ref + (size_t)p * V, (size_t)V * sizeof(float));
	}
	printf("%s: %d positions, %d draft tokens cut back: %d positions bit-identical\n",
	       name, n, cut, same);
	CHECK(same == n, "%s: %d of %d positions differ after cuts", name,
	      n - same, n);
	cw_dsv_state_free(s);
	free(lg);
}

/* The refusals of cw_dsv_state_truncate. */
static void refusals(const struct cw_dsv_model *m, const int32_t *ids)
{
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	float *lg = NULL;
	int r;

	must(cw_dsv_state_new(m, 64, &s), &d, "state");
	must(cw_dsv_eval(m, s, ids, 4, 0, lg, &d), &d, "eval");
	r = cw_dsv_state_truncate(s, 5, &d);
	CHECK(r == -EINVAL && strstr(d.msg, "holds 4"), "cut past the length: %d (%s)",
	      r, d.msg);
	must(cw_dsv_eval(m, s, ids + 4, CW_DSV_ROLLBACK_MAX + 1, 0, lg, &d),
	     &d, "eval");
	r = cw_dsv_state_truncate(s, 4, &d);
	CHECK(r == -EINVAL && strstr(d.msg, "more than"),
	      "cut of %d: %d (%s)", CW_DSV_ROLLBACK_MAX + 1, r, d.msg);
	r = cw_dsv_state_truncate(s, 5, &d);
	CHECK(r == 0 && cw_dsv_state_len(s) == 5, "cut of %d: %d (%s)",
	      CW_DSV_ROLLBACK_MAX, r, d.msg);
	/* the highest position evaluated (21) still bounds the next cut */
	r = cw_dsv_state_truncate(s, 4, &d);
	CHECK(r == -EINVAL, "second cut below the slack: %d", r);
	cw_dsv_state_free(s);
}

int main(void)
{
	char dir[4096];
	struct cw_dsv_model *m, *m41;
	struct cw_dsv_state *s41;
	struct st_diag d = { { 0 } };
	json_t *ref;
	const json_t *cases;
	struct dsvt_case cs[8];
	int nc;
	int32_t one = 1;
	int r;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	must(cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &m, &d), &d,
	     dir);
	ref = dsvt_load_json(dir, "reference.json");
	cases = dsvt_cases(ref, "reference.json");
	nc = dsvt_cases_load(cases, 8, cs);
	CHECK(nc >= 2, "reference.json: %d cases", nc);
	/* the two longest (cases sorted shortest first) */
	for (int i = nc - 2; i >= 0 && i < nc; i++) {
		const int V = cw_dsv_config(m)->vocab_size;
		float *all = malloc((size_t)cs[i].n * V * sizeof(float));
		struct cw_dsv_state *s;

		if (!all)
			abort();
		must(cw_dsv_state_new(m, cs[i].n, &s), &d, "state");
		must(cw_dsv_eval(m, s, cs[i].ids, cs[i].n, 1, all, &d), &d,
		     cs[i].name);
		cw_dsv_state_free(s);
		drafts_cut(m, cs[i].ids, cs[i].n, all, cs[i].name);
		free(all);
	}
	refusals(m, cs[nc - 1].ids);
	dsvt_cases_free(cs, nc);
	json_decref(ref);
	cw_dsv_free(m);
	st_test_fixture_model("tiny-deepseek-v41", dir, sizeof(dir));
	must(cw_dsv_load(dir, ST_DSV_REV_V41, CW_COMPUTE_REFERENCE, &m41, &d),
	     &d, dir);
	must(cw_dsv_state_new(m41, 8, &s41), &d, "state");
	must(cw_dsv_eval(m41, s41, &one, 1, 0, NULL, &d), &d, "eval");
	r = cw_dsv_state_truncate(s41, 0, &d);
	CHECK(r == -ST_E_UNSUPPORTED, "V4.1 state cut: %d (%s)", r, d.msg);
	cw_dsv_state_free(s41);
	cw_dsv_free(m41);
	return dsvt_finish(n_fail);
}
