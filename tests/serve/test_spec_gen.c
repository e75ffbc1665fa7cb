/*
 * test_spec_gen.c — speculative decoding against real daemons (issue 22
 * §2-§3), one fixture model per run:
 *
 *  1. greedy with prompt-lookup drafts (draft_max 4) gives token for token
 *     the greedy output without, in reference mode, and every token's
 *     log-probability and top-5 alternatives bit for bit (the verifying
 *     forward is one cw_model_eval of 1 + K tokens: logits at every
 *     position, each bit-identical to a one-token step, DESIGN.md 6a);
 *  2. after every step the sequence holds exactly the rows of the tokens
 *     kept (prompt + generated - 1: rejected rows were cut back in kvd)
 *     and kvd holds no page beyond them; with the prefix cache on (the
 *     runs after the first map the prompt's full pages the first one
 *     published, and roll back past them);
 *  3. sampling (T 0.8, fixed seed) runs with drafts verified, and
 *     cw_sampler_verify's tokens on this model's next-token distribution
 *     (the logits after the prompt) pass a chi-square goodness-of-fit test
 *     against softmax(logits / T): drafts = the argmax and the 5th token
 *     (fixtures with a vocabulary of at most 4096: kjv-moe);
 *  3b. through the scheduler (cw_sched: continuous batching, one
 *     event per token), four requests at once with draft lengths 0, 1, 3
 *     and 4 and a step budget of 7 tokens (drafts are cut so that every
 *     decoding sequence keeps its token in each step): each one's greedy
 *     ids are those of 1;
 *  4. DeepSeek-V4 and V4.1 stores verify them as the others do: their
 *     state in kvd pages is cut back with kvd's sequence
 *     (cw_dsv_state_truncate: windowed streams, prefix-cache publishing
 *     held back over the drafts).
 *
 * Usage: test_spec_gen FIXTURE [COMPUTE [mtp]] (kjv-moe, tiny-mixtral,
 * tiny-qwen3moe, tiny-deepseek-v4, tiny-deepseek-v41; reference (default)
 * or fast: its batched steps are bit-identical to one-token steps too,
 * DESIGN.md 6a; mtp: the drafts from the store's MTP block instead of
 * prompt lookup, tiny-deepseek-v4).  Prints the acceptance figures.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_gen.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "cw_sched.h"
#include "kv_client.h"
#include "st_tokenizer.h"
#include "serve_setup.h"
#include "test_util.h"

#define MAX_NEW 48
#define DRAFT 4
#define DRAWS 20000

static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); \
	printf("\n"); } } while (0)

/* A prompt that quotes itself: prompt lookup finds the continuation. */
static const char *PROMPT =
	"In the beginning God created the heaven and the earth. And the "
	"earth was without form, and void; and darkness was upon the face "
	"of the deep. In the beginning God created the heaven and the "
	"earth. And the earth was without form, and void; and darkness was "
	"upon the face of the deep. In the beginning God created the";

struct run {
	int32_t ids[MAX_NEW];
	struct cw_gen_logprob lp[MAX_NEW];
	int n;
	struct cw_gen_spec_stats st;
	int draft_max;
	int n_cached;    /* prompt rows mapped from the prefix cache */
};

struct env {
	struct cw_model *m;
	struct st_tokenizer *tok;
	struct kv_client *kv;
	int n_streams;
	int mtp;  /* drafts from the store's MTP block (argv[3] "mtp") */
};

/* Pages kvd uses now (the test's only client: the generation's). */
static uint64_t pages_used(struct env *e)
{
	struct kv_stats ks;

	return kv_client_stats(e->kv, &ks) < 0 ? UINT64_MAX : ks.pages_used;
}

static int generate(struct env *e, const struct cw_sampler_params *sp,
		    int draft_max, struct run *out, float *first_logits,
		    int vocab)
{
	struct cw_gen_params p = { .max_tokens = MAX_NEW, .sampler = *sp,
				   .add_special = 1, .ignore_eos = 1,
				   .logprobs = 1, .top_logprobs = 5,
				   .draft_max = draft_max,
				   .draft_mtp = e->mtp && draft_max > 0,
				   .prefix_cache = 1 };
	struct st_diag diag = { "" };
	struct cw_gen *g = NULL;
	uint32_t B = kv_client_page_rows(e->kv);
	char text[2048];
	int r;

	r = cw_gen_start(e->m, e->tok, e->kv, PROMPT, strlen(PROMPT), &p, &g,
			 &diag);
	if (r < 0) {
		printf("FAIL: start: %s\n", diag.msg);
		fails++;
		return r;
	}
	out->draft_max = cw_gen_draft_max(g);
	out->n_cached = cw_gen_n_cached(g);
	out->n = 0;
	for (;;) {
		enum cw_finish fin;
		int32_t t;

		r = cw_gen_step(g, text, sizeof(text), &t, &fin, &diag);
		if (r < 0) {
			printf("FAIL: step: %s\n", diag.msg);
			fails++;
			break;
		}
		if (t >= 0 && out->n < MAX_NEW) {
			if (out->n == 0 && first_logits)
				memcpy(first_logits, cw_gen_logits(g),
				       sizeof(float) * (size_t)vocab);
			out->lp[out->n] = *cw_gen_last_logprob(g);
			out->ids[out->n++] = t;
		}
		/* between steps: exactly the kept tokens' rows, no more
		 * pages (a V4 state keeps its own rows: not checked) */
		if (fin == CW_FINISH_NONE && !cw_gen_n_pending(g) &&
		    !cw_model_is_dsv4(e->m)) {
			int64_t rows = kv_client_seq_rows(e->kv, cw_gen_seq(g));
			int64_t want = cw_gen_n_prompt(g) +
				       cw_gen_n_generated(g) - 1;
			uint64_t pages = (uint64_t)((want + B - 1) / B) *
					 (uint64_t)e->n_streams;

			CHECK(rows == want, "after token %d: %lld rows, want "
			      "%lld", out->n, (long long)rows,
			      (long long)want);
			CHECK(pages_used(e) == pages, "after token %d: %llu "
			      "pages used, want %llu", out->n,
			      (unsigned long long)pages_used(e),
			      (unsigned long long)pages);
		}
		if (fin != CW_FINISH_NONE)
			break;
	}
	cw_gen_spec_stats(g, &out->st);
	cw_gen_free(g);
	return r < 0 ? r : 0;
}

/* 3b: four greedy requests at once through the scheduler; each must
 * give ref's ids. */
static void sched_case(struct env *e, const struct run *ref)
{
	const int drafts[4] = { 0, 1, 3, 4 };
	struct cw_sched_opts so = { .max_running = 4, .max_queued = 8,
				    .max_step_tokens = 7 };
	struct cw_sched_req *req[4] = { 0 };
	struct st_diag diag = { "" };
	struct cw_sched *s = NULL;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int r;

	r = st_tokenizer_encode(e->tok, PROMPT, strlen(PROMPT), 1, 0, &ids,
				&n_ids);
	if (!r)
		r = cw_sched_create(e->m, e->tok, e->kv, &so, NULL, &s);
	for (int i = 0; !r && i < 4; i++) {
		struct cw_gen_params p = { .max_tokens = MAX_NEW,
					   .add_special = 1, .ignore_eos = 1,
					   .draft_max = drafts[i],
					   .draft_mtp = e->mtp && drafts[i] > 0 };

		r = cw_sched_submit(s, ids, n_ids, &p, 4, &req[i], &diag);
	}
	if (r < 0) {
		CHECK(0, "scheduler setup: %s (%d)", diag.msg, r);
		goto out;
	}
	for (int i = 0; i < 4; i++) {
		struct cw_sched_event ev;
		int n = 0, diff = -1;

		while (cw_sched_next_event(req[i], 60000, &ev) == 1) {
			if (ev.token >= 0) {
				if (n >= MAX_NEW || ev.token != ref->ids[n])
					diff = diff < 0 ? n : diff;
				n++;
			}
			free(ev.text);
			if (ev.finish != CW_FINISH_NONE) {
				CHECK(ev.finish == CW_FINISH_LENGTH,
				      "request %d ended with %d: %s", i,
				      ev.finish, ev.err_msg);
				break;
			}
		}
		CHECK(n == MAX_NEW && diff < 0, "scheduler, draft_max %d: %d "
		      "tokens, first difference at %d", drafts[i], n, diff);
	}
	printf("scheduler: 4 requests (draft_max 0, 1, 3, 4; steps of 7 "
	       "tokens) gave the greedy ids\n");
out:
	for (int i = 0; i < 4; i++)
		if (req[i])
			cw_sched_release(req[i]);
	cw_sched_destroy(s);
	free(ids);
}

/* chi-square critical value at p = 0.001 for df degrees of freedom, by
 * the Wilson-Hilferty approximation (z = 3.0902; within 1 % of the
 * tables for df >= 3, e.g. df 10: 29.6 vs 29.59) */
static double chi2_crit(int df)
{
	double a = 2.0 / (9.0 * df);

	return df * pow(1.0 - a + 3.0902 * sqrt(a), 3);
}

/* Tokens of cw_sampler_verify(draft) against softmax(logits / T):
 * categories with an expected count >= 5, the others pooled. */
static void chi2_model(const float *lg, int vocab, float temp, int draft,
		       const char *what)
{
	struct cw_sampler_params sp = { .temperature = temp, .seed = 42 };
	struct cw_sampler s;
	double *p = calloc((size_t)vocab, sizeof(double));
	long *cnt = calloc((size_t)vocab, sizeof(long));
	double mx = -INFINITY, z = 0.0, chi2 = 0.0, e_rest = 0.0;
	long c_rest = 0, acc = 0;
	int df = -1;

	for (int i = 0; i < vocab; i++)
		mx = fmax(mx, lg[i]);
	for (int i = 0; i < vocab; i++)
		z += p[i] = exp((lg[i] - mx) / temp);
	cw_sampler_init(&s, &sp);
	for (int i = 0; i < DRAWS; i++) {
		int t = cw_sampler_verify(&s, lg, vocab, draft);

		if (t < 0 || t >= vocab) {
			CHECK(0, "%s: verify returned %d", what, t);
			break;
		}
		cnt[t]++;
		acc += t == draft;
	}
	cw_sampler_fini(&s);
	for (int i = 0; i < vocab; i++) {
		double ex = p[i] / z * DRAWS;

		if (ex < 5.0) {
			e_rest += ex;
			c_rest += cnt[i];
			continue;
		}
		chi2 += (cnt[i] - ex) * (cnt[i] - ex) / ex;
		df++;
	}
	if (e_rest >= 5.0) {
		chi2 += (c_rest - e_rest) * (c_rest - e_rest) / e_rest;
		df++;
	}
	CHECK(df >= 3 && chi2 < chi2_crit(df), "%s: chi-square %.1f over "
	      "%.1f (df %d)", what, chi2, chi2_crit(df), df);
	printf("%s: chi2 %.1f, df %d, critical %.1f (p=0.001); draft "
	       "accepted %.4f, p(draft) %.4f\n", what, chi2, df,
	       chi2_crit(df), (double)acc / DRAWS, p[draft] / z);
	free(p);
	free(cnt);
}

int main(int argc, char **argv)
{
	const char *fixture = argc > 1 ? argv[1] : "kjv-moe";
	const char *kv_args[4] = { "--budget", "64MiB", NULL };
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	struct cw_sampler_params greedy = { .temperature = 0.0f };
	struct cw_sampler_params t08 = { .temperature = 0.8f, .seed = 7 };
	struct st_diag diag = { "" };
	struct st_test_serve t;
	struct env e = { 0 };
	static struct run a, b, c;
	float *lg0;
	int vocab, r, same = 0;

	e.mtp = argc > 3 && !strcmp(argv[3], "mtp");
	if (argc > 2 && cw_compute_parse(argv[2], &mo.compute) < 0) {
		printf("FAIL: bad compute mode %s\n", argv[2]);
		return 1;
	}
	if (st_test_serve_open(&t, fixture, NULL, "spg", NULL, kv_args,
			       &mo) < 0)
		return 1;
	e.kv = t.kv;
	e.m = t.m;
	r = st_tokenizer_load(t.store, &e.tok, &diag);
	if (r < 0) {
		printf("FAIL: setup: %s\n", diag.msg);
		st_test_serve_close(&t);
		return 1;
	}
	e.n_streams = cw_model_config(e.m)->n_layers;
	vocab = cw_model_config(e.m)->vocab_size;
	lg0 = malloc(sizeof(float) * (size_t)vocab);

	/* MTP drafts asked of a store without the block: refused, V4.1
	 * (whose drafts go off) included, not silently run without drafts */
	if (!cw_model_has_mtp(e.m)) {
		struct cw_gen_params p = { .max_tokens = 4, .sampler = greedy,
					   .add_special = 1, .draft_max = 3,
					   .draft_mtp = 1 };
		struct cw_gen *g = NULL;
		struct st_diag d2 = { "" };

		r = cw_gen_start(e.m, e.tok, e.kv, PROMPT, strlen(PROMPT), &p,
				 &g, &d2);
		CHECK(r == -ST_E_UNSUPPORTED && !g &&
		      strstr(d2.msg, "no MTP block"),
		      "--speculate mtp on a store without an MTP block: %d "
		      "(%s), want -ST_E_UNSUPPORTED", r, d2.msg);
		if (g)
			cw_gen_free(g);
		printf("%s: --speculate mtp refused (%s)\n", fixture, d2.msg);
	}

	/* 1, 2: greedy without and with drafts */
	if (generate(&e, &greedy, 0, &a, lg0, vocab) < 0 ||
	    generate(&e, &greedy, DRAFT, &b, NULL, vocab) < 0)
		goto out;
	CHECK(a.n == MAX_NEW && b.n == MAX_NEW, "%d and %d tokens, want %d",
	      a.n, b.n, MAX_NEW);
	for (int i = 0; i < a.n && i < b.n; i++) {
		if (a.ids[i] != b.ids[i]) {
			CHECK(0, "token %d: %d without drafts, %d with", i,
			      a.ids[i], b.ids[i]);
			break;
		}
		same += !memcmp(&a.lp[i], &b.lp[i], sizeof(a.lp[i]));
	}
	CHECK(same == a.n, "%d of %d tokens' log-probabilities differ "
	      "bitwise with drafts", a.n - same, a.n);
	printf("%s greedy: %d tokens identical with and without drafts "
	       "(draft_max %d in use); %llu decode steps, %llu verified "
	       "drafts: %llu of %llu draft tokens accepted, %llu "
	       "roll-backs; %.2f tokens per step\n", fixture, same,
	       b.draft_max, (unsigned long long)b.st.steps,
	       (unsigned long long)b.st.spec_steps,
	       (unsigned long long)b.st.accepted,
	       (unsigned long long)b.st.drafted,
	       (unsigned long long)b.st.rollbacks,
	       b.st.steps ? (double)(b.n - 1) / (double)b.st.steps : 0.0);
	CHECK(b.n_cached > 0, "the run with drafts mapped no prompt page "
	      "from the prefix cache");
	CHECK(b.draft_max == DRAFT && b.st.spec_steps > 0 && b.st.drafted > 0,
	      "no drafts were verified (draft_max %d, %llu steps)",
	      b.draft_max, (unsigned long long)b.st.spec_steps);
	CHECK(b.st.steps < a.st.steps || b.st.accepted == 0,
	      "%llu accepted drafts but %llu steps (without: %llu)",
	      (unsigned long long)b.st.accepted,
	      (unsigned long long)b.st.steps,
	      (unsigned long long)a.st.steps);
	if (!strcmp(fixture, "kjv-moe"))
		CHECK(b.st.accepted > 0, "kjv-moe quoting its prompt "
		      "accepted no draft token");
	sched_case(&e, &a);

	/* 3: sampling with drafts, and the distribution it keeps */
	if (generate(&e, &t08, DRAFT, &c, NULL, vocab) < 0)
		goto out;
	CHECK(c.n == MAX_NEW, "sampling: %d tokens", c.n);
	printf("%s T=0.8: %llu of %llu draft tokens accepted\n", fixture,
	       (unsigned long long)c.st.accepted,
	       (unsigned long long)c.st.drafted);
	/* the chi-square on the trained model (a vocabulary of 2048: each
	 * draw sorts it, so the 32k-vocabulary fixtures would take minutes) */
	if (vocab <= 4096) {
		int order1 = cw_argmax(lg0, vocab), fifth = 0;
		float *tmp_lg = malloc(sizeof(float) * (size_t)vocab);

		/* the 5th most likely token: mask the top 4 */
		memcpy(tmp_lg, lg0, sizeof(float) * (size_t)vocab);
		for (int k = 0; k < 5; k++) {
			fifth = cw_argmax(tmp_lg, vocab);
			tmp_lg[fifth] = -INFINITY;
		}
		free(tmp_lg);
		chi2_model(lg0, vocab, 0.8f, order1, "draft = argmax");
		chi2_model(lg0, vocab, 0.8f, fifth, "draft = 5th token");
	}
out:
	free(lg0);
	st_tokenizer_free(e.tok);
	st_test_serve_close(&t);
	if (fails) {
		printf("%d failure(s)\n", fails);
		return 1;
	}
	printf("OK\n");
	return 0;
}
