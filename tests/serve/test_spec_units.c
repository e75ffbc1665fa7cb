/*
 * test_spec_units.c — the pieces of speculative decoding that need no
 * daemons (issue 22): prompt-lookup drafts (cw_draft_ngram) on hand-made
 * sequences, and speculative sampling (cw_sampler_verify) keeping the
 * target distribution: a chi-square goodness-of-fit test of the tokens it
 * returns against p, for drafts of high, low and zero probability.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cw_draft_ngram.h"
#include "cw_sampler.h"

static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); \
	printf("\n"); } } while (0)

static void test_ngram(void)
{
	/* ... 7 8 9 | 1 2 3 4 5 | 7 8 9 6 | 1 2 3 */
	const int32_t a[] = { 7, 8, 9, 1, 2, 3, 4, 5, 7, 8, 9, 6, 1, 2, 3 };
	const int na = (int)(sizeof(a) / sizeof(a[0]));
	int32_t d[CW_DRAFT_MAX];
	int k;

	/* the trigram 1 2 3 occurs at 3: its continuation 4 5 7 8 */
	k = cw_draft_ngram(a, na, 1, 3, 4, d);
	CHECK(k == 4 && d[0] == 4 && d[1] == 5 && d[2] == 7 && d[3] == 8,
	      "trigram draft: k %d (%d %d %d %d), want 4 (4 5 7 8)", k, d[0],
	      d[1], d[2], d[3]);
	/* cut to max_draft */
	k = cw_draft_ngram(a, na, 1, 3, 2, d);
	CHECK(k == 2 && d[0] == 4 && d[1] == 5, "max_draft 2: k %d", k);
	/* the most recent occurrence wins: "7 8 9" at 8 is followed by 6 */
	k = cw_draft_ngram(a, 11, 1, 3, 3, d);
	CHECK(k == 3 && d[0] == 1 && d[1] == 2 && d[2] == 3,
	      "7 8 9 at the end of a[0..11): k %d d0 %d, want 1 2 3 (the "
	      "match at 0)", k, d[0]);
	{
		const int32_t b[] = { 5, 1, 9, 9, 2, 5, 1, 4, 7, 1 };

		/* no trigram or bigram "4 7 1"/"7 1" earlier; unigram "1"
		 * last seen at 6: draft 4 7 1 (continuation up to the end) */
		k = cw_draft_ngram(b, 10, 1, 3, 8, d);
		CHECK(k == 3 && d[0] == 4 && d[1] == 7 && d[2] == 1,
		      "unigram fallback: k %d d %d %d %d", k, d[0], d[1],
		      d[2]);
		/* with min_ngram 2 the unigram does not count */
		k = cw_draft_ngram(b, 10, 2, 3, 8, d);
		CHECK(k == 0, "min_ngram 2: k %d, want 0", k);
		/* b[0..7) ends in "2 5 1" (no earlier occurrence) and
		 * "5 1" (also at 0): draft 9 9 2 */
		k = cw_draft_ngram(b, 7, 1, 3, 3, d);
		CHECK(k == 3 && d[0] == 9 && d[1] == 9 && d[2] == 2,
		      "bigram: k %d d %d %d %d", k, d[0], d[1], d[2]);
	}
	{
		/* a run: the trigram "3 3 3" of 3 3 3 3 matches at 0 (the
		 * only start with a token after it): draft one 3 */
		const int32_t c[] = { 3, 3, 3, 3 };

		k = cw_draft_ngram(c, 4, 1, 3, 4, d);
		CHECK(k == 1 && d[0] == 3, "run: k %d, want 1", k);
	}
	k = cw_draft_ngram(a, 1, 1, 3, 4, d);
	CHECK(k == 0, "one token: k %d, want 0", k);
	CHECK(cw_draft_ngram(a, na, 0, 3, 4, d) == -EINVAL &&
	      cw_draft_ngram(a, na, 3, 2, 4, d) == -EINVAL &&
	      cw_draft_ngram(a, na, 1, 3, -1, d) == -EINVAL,
	      "bad arguments not refused");
	CHECK(cw_draft_ngram(a, na, 1, 3, 0, d) == 0, "max_draft 0");
	printf("ngram drafts: checked\n");
}

#define NV 8
#define DRAWS 200000
/* chi-square critical value for 7 degrees of freedom at p = 0.001
 * (tables; scipy.stats.chi2.ppf(0.999, 7) = 24.32): a correct sampler
 * fails one seed in a thousand, the seed is fixed */
#define CHI2_CRIT_7 24.32

/* A wrong rule, to show the test has power: on a rejection, draw from
 * the whole of p (the draft included) instead of p without the draft. */
static int naive_verify(struct cw_sampler *s, const float *logits, int n,
			int draft, double p_draft)
{
	if (cw_sampler_uniform(s) < p_draft)
		return draft;
	return cw_sampler_sample(s, logits, n);
}

/* Draws DRAWS tokens with cw_sampler_verify(draft) (naive: naive_verify)
 * and tests them against the distribution p that sampler params sp give
 * for logits; returns the chi-square statistic. */
static double chi2_run(const float *logits, const struct cw_sampler_params *sp,
		       int draft, int naive, const char *what)
{
	struct cw_sampler s;
	double p[NV], mx = -INFINITY, z = 0.0, chi2 = 0.0, acc_rate;
	long cnt[NV] = { 0 }, accepted = 0;
	int order[NV], m = NV, df = -1;

	/* p independently: softmax(logits / T), then top-k by hand */
	for (int i = 0; i < NV; i++)
		mx = fmax(mx, logits[i]);
	for (int i = 0; i < NV; i++)
		p[i] = exp((logits[i] - mx) / sp->temperature);
	for (int i = 0; i < NV; i++)
		order[i] = i;
	for (int i = 0; i < NV; i++)
		for (int j = i + 1; j < NV; j++)
			if (p[order[j]] > p[order[i]]) {
				int t = order[i];

				order[i] = order[j];
				order[j] = t;
			}
	if (sp->top_k > 0 && sp->top_k < NV)
		m = sp->top_k;
	for (int i = m; i < NV; i++)
		p[order[i]] = 0.0;
	for (int i = 0; i < NV; i++)
		z += p[i];
	for (int i = 0; i < NV; i++)
		p[i] /= z;

	cw_sampler_init(&s, sp);
	for (int i = 0; i < DRAWS; i++) {
		int t = naive ? naive_verify(&s, logits, NV, draft, p[draft]) :
				cw_sampler_verify(&s, logits, NV, draft);

		if (t < 0 || t >= NV) {
			CHECK(0, "%s: verify returned %d", what, t);
			cw_sampler_fini(&s);
			return 0.0;
		}
		cnt[t]++;
		accepted += t == draft;
	}
	cw_sampler_fini(&s);
	for (int i = 0; i < NV; i++) {
		double e = p[i] * DRAWS;

		if (e == 0.0) {
			CHECK(cnt[i] == 0, "%s: token %d of probability 0 "
			      "drawn %ld times", what, i, cnt[i]);
			continue;
		}
		chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
		df++;
	}
	/* the cases below have 8 categories (df 7) or top-k 5 (df 4:
	 * chi2.ppf(0.999, 4) = 18.47) */
	{
		double crit = df == 7 ? CHI2_CRIT_7 : df == 4 ? 18.47 : 0.0;

		CHECK(crit > 0 && (naive || chi2 < crit), "%s: chi-square "
		      "%.2f over %.2f (df %d)", what, chi2, crit, df);
		acc_rate = (double)accepted / DRAWS;
		printf("%s: chi2 %.2f (df %d, critical %.2f at p=0.001), "
		       "accepted %.4f of drafts (p(draft) %.4f)\n", what,
		       chi2, df, crit, acc_rate, p[draft]);
	}
	return chi2;
}

static void chi2_case(const float *logits, const struct cw_sampler_params *sp,
		      int draft, const char *what)
{
	chi2_run(logits, sp, draft, 0, what);
}

static void test_verify(void)
{
	const float lg[NV] = { 2.0f, 1.5f, 0.3f, -0.4f, 1.1f, -2.0f, 0.0f,
			       0.7f };
	struct cw_sampler_params t1 = { .temperature = 1.0f, .seed = 1234 };
	struct cw_sampler_params t07k5 = { .temperature = 0.7f, .top_k = 5,
					   .seed = 99 };
	struct cw_sampler_params greedy = { .temperature = 0.0f };
	struct cw_sampler s;

	chi2_case(lg, &t1, 0, "T=1, draft the top token");
	chi2_case(lg, &t1, 5, "T=1, draft an unlikely token");
	chi2_case(lg, &t07k5, 3, "T=0.7 top-k 5, draft outside top-k");
	chi2_case(lg, &t07k5, 4, "T=0.7 top-k 5, draft inside top-k");
	/* the wrong residual (p itself) over-draws the draft: 0.37 + 0.63 x
	 * 0.37 = 0.60 instead of 0.37, far past the critical value */
	CHECK(chi2_run(lg, &t1, 0, 1, "naive rule (must fail)") >
		      10 * CHI2_CRIT_7,
	      "the chi-square test does not tell the naive rule apart");
	cw_sampler_init(&s, &greedy);
	CHECK(cw_sampler_verify(&s, lg, NV, 0) == 0 &&
	      cw_sampler_verify(&s, lg, NV, 4) == 0,
	      "greedy verify is not the argmax");
	CHECK(cw_sampler_verify(&s, lg, NV, NV) == -EINVAL,
	      "draft out of range not refused");
	cw_sampler_fini(&s);
}

int main(void)
{
	test_ngram();
	test_verify();
	if (fails) {
		printf("%d failure(s)\n", fails);
		return 1;
	}
	printf("OK\n");
	return 0;
}
