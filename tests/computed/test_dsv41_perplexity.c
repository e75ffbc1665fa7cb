/*
 * test_dsv41_perplexity.c — `strata perplexity` on a DeepSeek-V4.1 store
 * (../shared tiny-deepseek-v41 converted here), through the CLI and its
 * private expertd, kvd and computed, against an independent in-process
 * computation: the fixture's checkpoint loaded by cw_dsv_load (no store,
 * no daemons), the text tokenized here with the fixture's tokenizer, each
 * window evaluated from position 0 in a fresh state with the logits of
 * every position, log-softmax and NLL summed in double.
 *
 * The text is the fixture's case p4_harbour (its ids without the BOS, as
 * perplexity tokenizes: no BOS, no special tokens; checked against
 * reference.json) and --window 40, so the windows are 40, 40 and a
 * remainder of 10 tokens (87 scored), each long past the fixture's
 * sliding window of 16 (compressed ratio-2 and ratio-1 KV, the indexer
 * top-k and the candidate blocks all in play).
 *
 * Asserted: scored tokens and windows equal the windowing rule computed
 * here; ppl and mean NLL within 1e-8 relative of the in-process values;
 * every scored position's log-probabilities (--save-kl-base) within 2e-5
 * nats of the in-process log-softmax over the whole vocabulary (F32
 * logits, bit-identical per dsv41-store-expertd; the slack covers
 * computed's F32 log-softmax against the double one here).  Skips (77)
 * without ../shared.
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
#include "es_convert.h"
#include "st_tokenizer.h"
#include "st_util.h"
#include "test_util.h"

#define WINDOW 40
#define PPL_TOL 1e-8   /* relative, ppl and mean NLL (JSON: 10 digits) */
#define LOGP_TOL 2e-5  /* nats, each log-probability */

static int n_fail;

/* The case's text and its ids (BOS dropped) from reference.json. */
static int case_text(const char *model, const char *name, char **text,
		     int32_t **ids, size_t *n)
{
	json_t *r = dsvt_load_json(model, "reference.json"), *c;
	size_t i;
	int rc = -1;

	json_array_foreach(dsvt_cases(r, "reference.json"), i, c) {
		int k;
		int32_t *all;

		if (strcmp(json_string_value(json_object_get(c, "name")), name))
			continue;
		all = dsvt_case_ids(c, 0, &k, NULL);
		*text = strdup(json_string_value(json_object_get(c, "text")));
		*ids = all && k > 1 ? calloc((size_t)k - 1, sizeof(**ids)) :
				      NULL;
		if (*ids && *text) {
			*n = (size_t)k - 1;
			memcpy(*ids, all + 1, *n * sizeof(**ids));
			rc = 0;
		}
		free(all);
		break;
	}
	json_decref(r);
	return rc;
}

/* In-process NLL of the windows (the perplexity rule); each scored
 * position's log-probabilities into logp (rows of V, in order). */
static int reference_nll(const char *model, const int32_t *ids, size_t n,
			 double *nll, long *scored, int *windows,
			 float *logp)
{
	struct cw_dsv_model *m = NULL;
	struct st_diag d = { { 0 } };
	float *lg = NULL;
	int V, r;

	if ((r = cw_dsv_load(model, ST_DSV_REV_V41, CW_COMPUTE_REFERENCE, &m,
			     &d))) {
		fprintf(stderr, "cw_dsv_load: %s\n", d.msg);
		return r;
	}
	V = cw_dsv_config(m)->vocab_size;
	lg = malloc(sizeof(float) * (size_t)V * WINDOW);
	*nll = 0;
	*scored = 0;
	*windows = 0;
	for (size_t w0 = 0; lg && w0 < n; w0 += WINDOW) {
		int k = (int)(n - w0 < WINDOW ? n - w0 : WINDOW);
		struct cw_dsv_state *s = NULL;

		if (k < 2)
			break;
		if ((r = cw_dsv_state_new(m, k, &s)) ||
		    (r = cw_dsv_eval(m, s, ids + w0, k, 1, lg, &d))) {
			fprintf(stderr, "eval: %s\n", d.msg);
			cw_dsv_state_free(s);
			break;
		}
		cw_dsv_state_free(s);
		for (int p = 0; p + 1 < k; p++) {
			const float *row = lg + (size_t)p * V;
			double mx = row[0], sum = 0, lse;

			for (int v = 1; v < V; v++)
				mx = row[v] > mx ? row[v] : mx;
			for (int v = 0; v < V; v++)
				sum += exp((double)row[v] - mx);
			lse = mx + log(sum);
			for (int v = 0; v < V; v++)
				logp[(size_t)*scored * V + v] =
					(float)(row[v] - lse);
			*nll -= row[ids[w0 + p + 1]] - lse;
			(*scored)++;
		}
		(*windows)++;
	}
	if (!lg)
		r = -ENOMEM;
	free(lg);
	cw_dsv_free(m);
	return r;
}

int main(void)
{
	char model[4096], tmp[4096], store[4200], text_path[4200];
	char base[4200], out[4200], cmd[32768], inst[64];
	struct st_diag d = { { 0 } };
	struct es_convert_opts o;
	struct st_tokenizer *tok = NULL;
	char *text = NULL, *json_text = NULL;
	int32_t *want = NULL, *ids = NULL;
	size_t n_want = 0, n = 0, len;
	double nll = 0;
	float *logp = NULL;
	long scored = 0;
	int windows = 0, V;
	json_t *j = NULL;

	st_test_fixture_model("tiny-deepseek-v41", model, sizeof(model));
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	snprintf(text_path, sizeof(text_path), "%s/text.txt", tmp);
	snprintf(base, sizeof(base), "%s/base.bin", tmp);
	snprintf(out, sizeof(out), "%s/ppl.json", tmp);
	es_convert_opts_init(&o);
	if (es_convert(model, store, &o, &d)) {
		fprintf(stderr, "convert: %s\n", d.msg);
		return 1;
	}
	/* the text and its tokens, as perplexity encodes them */
	if (case_text(model, "p4_harbour", &text, &want, &n_want) ||
	    st_write_file(text_path, text, strlen(text)) ||
	    st_tokenizer_load(model, &tok, &d) ||
	    st_tokenizer_encode(tok, text, strlen(text), 0, 0, &ids, &n)) {
		fprintf(stderr, "fixture text / tokenizer: %s\n", d.msg);
		return 1;
	}
	CHECK(n == n_want && !memcmp(ids, want, n * sizeof(*ids)),
	      "tokens of p4_harbour (%zu) differ from reference.json's ids "
	      "without BOS (%zu)", n, n_want);
	{
		struct st_dsv_config *c = calloc(1, sizeof(*c));

		if (!c || st_dsv_config_load(model, ST_DSV_REV_V41, c, &d)) {
			fprintf(stderr, "config: %s\n", d.msg);
			return 1;
		}
		V = c->vocab_size;
		free(c);
	}
	logp = malloc(sizeof(float) * (size_t)V * n);
	if (!logp || reference_nll(model, ids, n, &nll, &scored, &windows,
				   logp)) {
		fprintf(stderr, "in-process reference failed\n");
		return 1;
	}
	/* the windowing rule: 90 tokens in windows of 40 -> 40, 40, 10 */
	CHECK(n == 90 && scored == 87 && windows == 3,
	      "%zu tokens, %ld scored, %d windows (expected 90, 87, 3)", n,
	      scored, windows);

	/* the CLI, through its own daemons */
	snprintf(cmd, sizeof(cmd),
		 "'%s/cli/strata' perplexity --store '%s' --file '%s' "
		 "--window %d --json --save-kl-base '%s' --instance %s "
		 "--run-dir '%s/run' --timeout 120 >'%s' 2>'%s/ppl.err'",
		 st_test_build_dir(), store, text_path, WINDOW, base,
		 st_test_instance("v41ppl", inst, sizeof(inst)), tmp, out,
		 tmp);
	if (system(cmd) != 0) {
		snprintf(cmd, sizeof(cmd), "cat '%s/ppl.err' >&2", tmp);
		(void)!system(cmd);
		CHECK(0, "strata perplexity failed");
		goto out;
	}
	if (st_read_file(out, &json_text, &len) == 0)
		j = json_loads(json_text, 0, NULL);
	CHECK(j != NULL, "no JSON line from strata perplexity");
	if (!j)
		goto out;
	{
		double ppl = json_number_value(json_object_get(j, "ppl"));
		double mnll = json_number_value(json_object_get(j, "nll"));
		double want_nll = nll / (double)scored;
		double want_ppl = exp(want_nll);

		printf("p4_harbour, windows of %d: strata perplexity %.6f "
		       "(mean NLL %.8f), in-process %.6f (%.8f)\n", WINDOW, ppl,
		       mnll, want_ppl, want_nll);
		CHECK(json_integer_value(json_object_get(j, "scored_tokens")) ==
			      scored &&
			      json_integer_value(json_object_get(j, "windows")) ==
			      windows &&
			      json_integer_value(json_object_get(j, "window")) ==
			      WINDOW,
		      "scored / windows / window differ from %ld / %d / %d",
		      scored, windows, WINDOW);
		CHECK(fabs(ppl - want_ppl) <= PPL_TOL * want_ppl,
		      "ppl %.6f vs in-process %.6f", ppl, want_ppl);
		CHECK(fabs(mnll - want_nll) <= PPL_TOL * want_nll,
		      "mean NLL %.8f vs in-process %.8f", mnll, want_nll);
	}
	/* every scored position's log-probabilities */
	{
		FILE *f = fopen(base, "re");
		char magic[8];
		uint32_t ver = 0, vocab = 0;
		uint64_t rows = 0;
		float *row = malloc(sizeof(float) * (size_t)V);
		double worst = 0;
		long worst_at = -1;

		CHECK(f && row && fread(magic, 1, 8, f) == 8 &&
		      !memcmp(magic, "STKLBASE", 8) && fread(&ver, 4, 1, f) == 1 &&
		      fread(&vocab, 4, 1, f) == 1 && fread(&rows, 8, 1, f) == 1 &&
		      ver == 1 && vocab == (uint32_t)V && rows == (uint64_t)scored,
		      "KL base header (vocab %u, %llu rows)", vocab,
		      (unsigned long long)rows);
		for (long p = 0; f && row && p < scored && rows == (uint64_t)scored;
		     p++) {
			if (fread(row, sizeof(float), (size_t)V, f) != (size_t)V) {
				CHECK(0, "KL base short at row %ld", p);
				break;
			}
			for (int v = 0; v < V; v++) {
				double e = fabs((double)row[v] -
						 logp[(size_t)p * V + v]);

				if (e > worst) {
					worst = e;
					worst_at = p;
				}
			}
		}
		printf("log-probabilities of %ld positions x %d: max |diff| "
		       "%.3g nats (row %ld)\n", scored, V, worst, worst_at);
		CHECK(worst <= LOGP_TOL, "log-probability off by %.3g at row %ld",
		      worst, worst_at);
		if (f)
			fclose(f);
		free(row);
	}
out:
	json_decref(j);
	free(json_text);
	free(logp);
	free(ids);
	free(want);
	free(text);
	st_tokenizer_free(tok);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}
