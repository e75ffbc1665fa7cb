/*
 * test_dsv_truncate.c — cutting a DeepSeek-V4 or V4.1 process-local state
 * back (cw_dsv_state_truncate: the rejected tokens of a verified draft,
 * issue 22) on the tiny-deepseek-v4 / -v41 fixture in reference mode,
 * official math.
 *
 * For the fixture's longest cases: the sequence evaluated with, before
 * every real token, 1..CW_DSV_ROLLBACK_MAX pseudo-random "rejected draft"
 * tokens evaluated and cut back again (so they close compressor windows,
 * emit compressed and index rows, and overwrite ring slots); every real
 * position's logits must equal, bit for bit, those of the sequence
 * evaluated without them (one prefill).  The same with cuts of every
 * depth in one place (several evals, then one cut).  Refusals: a cut
 * longer than the slack (also after an earlier cut: the highest position
 * evaluated counts), a length past the state's; V4.1: a state with the
 * CED prefill shortcut on.  Both revisions (argv[1] v4 or v41; V4.1's
 * window and group rings keep the same slack).
 *
 * Also verify steps as a generation runs them: after the prompt, each
 * step evaluates the next real token with drafts whose first 0..3 are the
 * real continuation (kept) and the rest junk (cut): every real position's
 * logits bit for bit.
 *
 * Mode "kv": the same with the state in a real kvd's pages (rows by
 * position; windowed streams trimmed as the sequence grows; the cut goes
 * to kvd with kv_client_seq_truncate) in prefix mode with the publish lag
 * a drafting generation sets (no drafted row published, so no cut is
 * refused): bit-identical; then a second state with the same prompt maps
 * the first one's published pages and goes on bit-identical too (no
 * rejected token's row was cached); a cut whose window kvd freed is
 * refused.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "kv_client.h"
#include "st_error.h"
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

/* A pseudo-random token id below V (a junk draft). */
static int32_t junk_token(unsigned *seed, int V)
{
	return (int32_t)(((unsigned)(dsvt_prand(seed) + 1.0f) * 60000u) %
			 (unsigned)V);
}

/* A state for ids[0..n) that drafts: kv NULL, process-local (room for
 * n + CW_DSV_ROLLBACK_MAX + 1 positions); else in kvd pages, in prefix
 * mode for ids[0..n_prompt), with the publish lag of a drafting
 * generation. */
static struct cw_dsv_state *draft_state(const struct cw_dsv_model *m,
					struct kv_client *kv, int n_prompt,
					const int32_t *ids, int n)
{
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };

	if (kv) {
		must(cw_dsv_state_new_kv(m, kv, ids, n_prompt, 0, &s, &d), &d,
		     "kvd state");
		CHECK(cw_dsv_state_set_publish_lag(s, CW_DSV_ROLLBACK_MAX) == 0,
		      "lag");
	} else {
		must(cw_dsv_state_new(m, n + CW_DSV_ROLLBACK_MAX + 1, &s), &d,
		     "state");
	}
	return s;
}

/* ids[0..n) with garbage drafts cut back before each real token; every
 * position's logits against ref (n x V).  kv NULL: a process-local state;
 * else one in kvd pages, in prefix mode for the first n_prompt ids, with
 * the publish lag of a drafting generation. */
static void drafts_cut(const struct cw_dsv_model *m, struct kv_client *kv,
		       int n_prompt, const int32_t *ids, int n,
		       const float *ref, const char *name)
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
	s = draft_state(m, kv, n_prompt, ids, n);
	CHECK(cw_dsv_state_len(s) == 0,
	      "%s: a prefix hit (%d) before any publish", name,
	      cw_dsv_state_len(s));
	for (int p = 0; p < n; p++) {
		int k = 1 + p % CW_DSV_ROLLBACK_MAX;

		/* past the prompt: a rejected draft after position p - 1 */
		if (p > 0 && (!kv || p >= n_prompt)) {
			for (int i = 0; i < k; i++)
				junk[i] = junk_token(&seed, V);
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

/* Verify steps as cw_gen runs them after a prefill of the first n_prompt
 * ids: each step evaluates the next real token followed by k drafts whose
 * first a are the real continuation (accepted) and the rest junk
 * (rejected), every position's logits at once; the real positions'
 * logits must equal ref's, and the state is cut back to keep the accepted
 * ones (a = 0..3, k = a..a+2 within 1..CW_DSV_ROLLBACK_MAX).  kv as
 * drafts_cut. */
static void verify_steps(const struct cw_dsv_model *m, struct kv_client *kv,
			 int n_prompt, const int32_t *ids, int n,
			 const float *ref, const char *name)
{
	const int V = cw_dsv_config(m)->vocab_size;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	float *lg = malloc((size_t)(CW_DSV_ROLLBACK_MAX + 1) * V *
			   sizeof(float));
	int32_t in[CW_DSV_ROLLBACK_MAX + 1];
	unsigned seed = 11;
	int same = 0, compared = 0, accepted = 0, rejected = 0, steps = 0;

	if (!lg)
		abort();
	s = draft_state(m, kv, n_prompt, ids, n);
	/* the prefill: its positions from the state's length (a prefix hit
	 * maps some) */
	must(cw_dsv_eval(m, s, ids + cw_dsv_state_len(s),
			 n_prompt - 1 - cw_dsv_state_len(s), 0, NULL, &d), &d,
	     "prefill");
	for (int p = n_prompt - 1; p < n; steps++) {
		int a = steps % 4, k;

		if (a > n - 1 - p)
			a = n - 1 - p;
		k = a + steps % 3;
		if (k < 1)
			k = 1;
		in[0] = ids[p];
		for (int i = 1; i <= k; i++)
			in[i] = i <= a ? ids[p + i] : junk_token(&seed, V);
		/* a junk draft equal to the real token would be accepted */
		if (a < k && p + a + 1 < n && in[a + 1] == ids[p + a + 1])
			in[a + 1] = (in[a + 1] + 1) % V;
		must(cw_dsv_eval(m, s, in, 1 + k, 1, lg, &d), &d, "verify");
		for (int i = 0; i <= a; i++, compared++)
			same += !memcmp(lg + (size_t)i * V,
					ref + (size_t)(p + i) * V,
					(size_t)V * sizeof(float));
		must(cw_dsv_state_truncate(s, p + 1 + a, &d), &d, "cut");
		accepted += a;
		rejected += k - a;
		p += 1 + a;
	}
	printf("%s: %d verify steps, %d drafts accepted, %d cut back: %d of %d positions bit-identical\n",
	       name, steps, accepted, rejected, same, compared);
	CHECK(same == compared && compared == n - n_prompt + 1 && accepted > 0,
	      "%s: %d of %d positions equal (%d expected), %d accepted", name,
	      same, compared, n - n_prompt + 1, accepted);
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

/* Mode kv (the header): the longest case through kvd. */
static int mode_kv(const struct cw_dsv_model *m, const struct dsvt_case *c)
{
	const int V = cw_dsv_config(m)->vocab_size, B = 16;
	const char *args[] = { "--budget", "256MiB", NULL };
	struct st_test_inst inst;
	struct kv_client *kv = NULL;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	float *ref = malloc((size_t)c->n * V * sizeof(float));
	float *lg = malloc((size_t)V * sizeof(float));
	int same = 0, r, len;

	if (!ref || !lg)
		abort();
	must(cw_dsv_state_new(m, c->n, &s), &d, "state");
	must(cw_dsv_eval(m, s, c->ids, c->n, 1, ref, &d), &d, c->name);
	cw_dsv_state_free(s);
	st_test_inst_init(&inst, "dsvcut");
	if (st_test_daemon_start(&inst, "kvd", args, 30) < 0) {
		CHECK(0, "kvd did not start");
		goto out;
	}
	r = kv_client_open(inst.run_dir, inst.name, "dsv4", 20000, &kv, &d);
	if (r == 0)
		r = cw_dsv_kv_declare(m, kv, B, 0, &d);
	CHECK(r == 0, "open/declare: %s", d.msg);
	if (r)
		goto out;
	drafts_cut(m, kv, c->n_prompt, c->ids, c->n, ref, c->name);
	verify_steps(m, kv, c->n_prompt, c->ids, c->n, ref, c->name);
	/* the prompt's pages the first state published: mapped, and the
	 * rest evaluated from there gives the same logits */
	must(cw_dsv_state_new_kv(m, kv, c->ids, c->n_prompt, 0, &s, &d), &d,
	     "second state");
	len = cw_dsv_state_len(s);
	CHECK(len > 0 && len % B == 0, "%s: prefix hit of %d tokens", c->name,
	      len);
	for (int p = len; p < c->n; p++) {
		must(cw_dsv_eval(m, s, c->ids + p, 1, 0, lg, &d), &d, c->name);
		same += !memcmp(lg, ref + (size_t)p * V, (size_t)V * sizeof(float));
	}
	printf("%s: a second state mapped %d prompt tokens; %d of %d later positions bit-identical\n",
	       c->name, len, same, c->n - len);
	CHECK(same == c->n - len, "%s: second state differs", c->name);
	cw_dsv_state_free(s);
	/* far back: the window pages kvd trimmed are gone */
	must(cw_dsv_state_new_kv(m, kv, NULL, 0, 0, &s, &d), &d, "third state");
	must(cw_dsv_eval(m, s, c->ids, 40, 0, NULL, &d), &d, "eval");
	must(cw_dsv_eval(m, s, c->ids + 40, 40, 0, NULL, &d), &d, "eval");
	r = cw_dsv_state_truncate(s, 10, &d);
	CHECK(r == -ST_E_LIMIT && strstr(d.msg, "window"),
	      "cut 70 back through a trimmed window: %d (%s)", r, d.msg);
	CHECK(cw_dsv_state_len(s) == 80, "refused cut changed the length");
	r = cw_dsv_state_truncate(s, 70, &d);
	CHECK(r == 0 && cw_dsv_state_len(s) == 70,
	      "cut back to the length before the last eval: %d (%s)", r, d.msg);
	cw_dsv_state_free(s);
out:
	kv_client_close(kv);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
	free(ref);
	free(lg);
	return 0;
}

/* Usage: test_dsv_truncate [v4|v41] [kv] */
int main(int argc, char **argv)
{
	const int v41 = argc > 1 && !strcmp(argv[1], "v41");
	const char *mode = argc > 2 ? argv[2] : "";
	char dir[4096];
	struct cw_dsv_model *m;
	struct cw_dsv_state *s;
	struct st_diag d = { { 0 } };
	json_t *ref;
	const json_t *cases;
	struct dsvt_case cs[8];
	int nc, r;

	st_test_fixture_model(v41 ? "tiny-deepseek-v41" : "tiny-deepseek-v4",
			      dir, sizeof(dir));
	must(cw_dsv_load(dir, v41 ? ST_DSV_REV_V41 : ST_DSV_REV_V4,
			 CW_COMPUTE_REFERENCE, &m, &d), &d, dir);
	ref = dsvt_load_json(dir, "reference.json");
	cases = dsvt_cases(ref, "reference.json");
	nc = dsvt_cases_load(cases, 8, cs);
	CHECK(nc >= 2, "reference.json: %d cases", nc);
	if (!strcmp(mode, "kv")) {
		mode_kv(m, &cs[nc - 1]);
		dsvt_cases_free(cs, nc);
		json_decref(ref);
		cw_dsv_free(m);
		return dsvt_finish(n_fail);
	}
	/* the two longest (cases sorted shortest first) */
	for (int i = nc - 2; i >= 0 && i < nc; i++) {
		const int V = cw_dsv_config(m)->vocab_size;
		float *all = malloc((size_t)cs[i].n * V * sizeof(float));

		if (!all)
			abort();
		must(cw_dsv_state_new(m, cs[i].n, &s), &d, "state");
		must(cw_dsv_eval(m, s, cs[i].ids, cs[i].n, 1, all, &d), &d,
		     cs[i].name);
		cw_dsv_state_free(s);
		drafts_cut(m, NULL, 0, cs[i].ids, cs[i].n, all, cs[i].name);
		verify_steps(m, NULL, cs[i].n_prompt, cs[i].ids, cs[i].n, all,
			     cs[i].name);
		free(all);
	}
	refusals(m, cs[nc - 1].ids);
	if (v41) { /* the CED shortcut leaves rows uncomputed: no cut */
		must(cw_dsv_state_new(m, 64, &s), &d, "state");
		CHECK(cw_dsv41_set_ced_shortcut(s, CW_DSV41_CED_EXACT) == 0,
		      "CED on");
		must(cw_dsv_eval(m, s, cs[nc - 1].ids, 8, 0, NULL, &d), &d,
		     "eval");
		r = cw_dsv_state_truncate(s, 7, &d);
		CHECK(r == -ST_E_UNSUPPORTED, "cut with CED on: %d (%s)", r,
		      d.msg);
		cw_dsv_state_free(s);
	}
	dsvt_cases_free(cs, nc);
	json_decref(ref);
	cw_dsv_free(m);
	return dsvt_finish(n_fail);
}
