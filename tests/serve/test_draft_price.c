/*
 * test_draft_price.c — the priced draft length of speculative decoding
 * (cw_draft_price.h, issue 22 §3): E[a|k,p], the argmax of expected
 * tokens per second for given p and step costs (0 included), the
 * acceptance estimate, the time model's line through the steps seen, the
 * probes while off and on, --speculate auto[:K] parsing, and the
 * figures /metrics renders (cw_metrics_spec_price).  The
 * expected values are worked out by hand in the comments.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_draft_price.h"
#include "cw_metrics.h"

static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); \
	printf("\n"); } } while (0)

static void test_expected(void)
{
	/* 0.5 + 0.25 + 0.125 */
	CHECK(fabs(cw_draft_price_expected(3, 0.5) - 0.875) < 1e-12,
	      "E[a|3,0.5] %g, want 0.875", cw_draft_price_expected(3, 0.5));
	CHECK(cw_draft_price_expected(0, 0.9) == 0.0, "E[a|0,p] not 0");
	/* p = 1: every draft accepted */
	CHECK(fabs(cw_draft_price_expected(4, 1.0) - 4.0) < 1e-12,
	      "E[a|4,1] %g, want 4", cw_draft_price_expected(4, 1.0));
}

static void test_argmax(void)
{
	double t[CW_DRAFT_MAX + 1];
	int k;

	/* T(k) = 100 + 20 k, p = 0.8: rates (1 + E) / T are
	 * k0 .01000, k1 1.8/120 = .01500, k2 2.44/140 = .01743,
	 * k3 2.952/160 = .01845, k4 3.3616/180 = .01868,
	 * k5 3.68928/200 = .01845: k = 4 of up to 8 */
	for (int i = 0; i <= 8; i++)
		t[i] = 100.0 + 20.0 * i;
	k = cw_draft_price_argmax(8, 0.8, t);
	CHECK(k == 4, "p 0.8, T 100 + 20k: k %d, want 4", k);
	/* the same with K = 2: the largest allowed */
	k = cw_draft_price_argmax(2, 0.8, t);
	CHECK(k == 2, "K 2: k %d, want 2", k);
	/* T(k) = 100 + 60 k, p = 0.5: k1 1.5/160 = .009375 < .01, and
	 * further k only worse (k2 1.75/220): off */
	for (int i = 0; i <= 8; i++)
		t[i] = 100.0 + 60.0 * i;
	k = cw_draft_price_argmax(8, 0.5, t);
	CHECK(k == 0, "p 0.5, T 100 + 60k: k %d, want 0 (off)", k);
	/* free drafts, nothing accepted: a tie at rate 1/100, the smaller
	 * k (off) wins */
	for (int i = 0; i <= 8; i++)
		t[i] = 100.0;
	k = cw_draft_price_argmax(8, 0.0, t);
	CHECK(k == 0, "p 0, free drafts: k %d, want 0", k);
	/* free drafts, any acceptance: the longest */
	k = cw_draft_price_argmax(8, 0.3, t);
	CHECK(k == 8, "p 0.3, free drafts: k %d, want 8", k);
}

static void test_estimate(void)
{
	struct cw_draft_price pr;
	double want;

	CHECK(cw_draft_price_init(&pr, 0) == -EINVAL, "init K 0 accepted");
	CHECK(cw_draft_price_init(&pr, CW_DRAFT_MAX + 1) == -EINVAL,
	      "init K %d accepted", CW_DRAFT_MAX + 1);
	CHECK(cw_draft_price_init(&pr, 4) == 0, "init K 4 failed");
	CHECK(fabs(cw_draft_price_p(&pr) - 0.5) < 1e-12, "prior p %g",
	      cw_draft_price_p(&pr));
	CHECK(cw_draft_price_note(&pr, 5, 0, 1, 1) == -EINVAL, "k 5 > K");
	CHECK(cw_draft_price_note(&pr, 2, 3, 1, 1) == -EINVAL,
	      "3 accepted of 2");
	CHECK(cw_draft_price_time(&pr, 0) < 0, "time without steps");
	/* all 4 accepted: successes 1 D + 4, failures 1 D */
	cw_draft_price_note(&pr, 4, 4, 200, 4000);
	want = (CW_PRICE_DECAY + 4) / (CW_PRICE_DECAY + 4 + CW_PRICE_DECAY);
	CHECK(fabs(cw_draft_price_p(&pr) - want) < 1e-12, "p %g, want %g",
	      cw_draft_price_p(&pr), want);
	/* 1 of 3 accepted, then one rejected */
	cw_draft_price_note(&pr, 3, 1, 180, 3000);
	want = ((CW_PRICE_DECAY + 4) * CW_PRICE_DECAY + 1) /
	       ((CW_PRICE_DECAY + 4) * CW_PRICE_DECAY + 1 +
		CW_PRICE_DECAY * CW_PRICE_DECAY + 1);
	CHECK(fabs(cw_draft_price_p(&pr) - want) < 1e-12, "p %g, want %g",
	      cw_draft_price_p(&pr), want);
	/* a plain step leaves p alone */
	cw_draft_price_note(&pr, 0, 0, 100, 1000);
	CHECK(fabs(cw_draft_price_p(&pr) - want) < 1e-12,
	      "p moved by a plain step");
	/* EWMA: the second step at k 4 moves the first by 1/8 */
	cw_draft_price_note(&pr, 4, 4, 280, 4000);
	CHECK(fabs(cw_draft_price_time(&pr, 4) -
		   (200 + CW_PRICE_EWMA * 80)) < 1e-9, "EWMA T(4) %g",
	      cw_draft_price_time(&pr, 4));
}

static void test_line(void)
{
	struct cw_draft_price pr;

	cw_draft_price_init(&pr, 6);
	/* one k seen: flat */
	cw_draft_price_note(&pr, 0, 0, 100, 1000);
	CHECK(fabs(cw_draft_price_time(&pr, 3) - 100) < 1e-9,
	      "one point: T(3) %g, want 100", cw_draft_price_time(&pr, 3));
	/* points (0, 100) and (2, 140), one step each: the line 100 + 20 k */
	cw_draft_price_note(&pr, 2, 1, 140, 2000);
	CHECK(fabs(cw_draft_price_time(&pr, 1) - 120) < 1e-9,
	      "T(1) %g, want 120", cw_draft_price_time(&pr, 1));
	CHECK(fabs(cw_draft_price_time(&pr, 5) - 200) < 1e-9,
	      "T(5) %g, want 200", cw_draft_price_time(&pr, 5));
	/* a measured k keeps its own EWMA */
	CHECK(fabs(cw_draft_price_time(&pr, 2) - 140) < 1e-9,
	      "T(2) %g, want 140", cw_draft_price_time(&pr, 2));
}

static void test_next(void)
{
	struct cw_draft_price pr;
	int k, probe_at = -1;

	cw_draft_price_init(&pr, 4);
	/* nothing seen: try drafts */
	k = cw_draft_price_next(&pr);
	CHECK(k == 4, "fresh: k %d, want 4", k);
	/* drafts seen, no plain step: probe one */
	cw_draft_price_note(&pr, 4, 0, 1000, 40000);
	k = cw_draft_price_next(&pr);
	CHECK(k == 0, "no plain step yet: k %d, want 0", k);
	/* a plain step costs 100, 4 drafts 1000 and none accepted
	 * (p = D / (D + 1 + D), about 0.33): the line through (0, 100) and
	 * (4, 1000) makes every k > 0 a loss: off, then a probe of
	 * CW_PRICE_PROBE_K drafts on the CW_PRICE_PROBE_STEPS-th call */
	cw_draft_price_note(&pr, 0, 0, 100, 10000);
	for (int i = 1; i <= CW_PRICE_PROBE_STEPS; i++) {
		k = cw_draft_price_next(&pr);
		if (k != 0 && probe_at < 0)
			probe_at = i;
		if (k == 0)
			cw_draft_price_note(&pr, 0, 0, 100, 10000);
	}
	CHECK(probe_at == CW_PRICE_PROBE_STEPS,
	      "probe while off at call %d, want %d", probe_at,
	      CW_PRICE_PROBE_STEPS);
	CHECK(k == CW_PRICE_PROBE_K, "probe of %d drafts, want %d", k,
	      CW_PRICE_PROBE_K);
	/* the probe finds drafts cheap and accepted: on again.  After
	 * 20 steps of 2 accepted at 110 ns p is about 0.95, T(2) 110, the
	 * line through (0, 100), (2, 110), (4, 1000) weighted 8, 8, 1
	 * gives T(1) < 110 <= ... : some k > 0 */
	for (int i = 0; i < 20; i++)
		cw_draft_price_note(&pr, 2, 2, 110, 12000);
	k = cw_draft_price_next(&pr);
	CHECK(k > 0, "cheap accepted drafts: k %d, want > 0", k);
	/* on, a plain step once CW_PRICE_PROBE0_STEPS steps with drafts
	 * followed the last plain one: 20 so far, so at call
	 * CW_PRICE_PROBE0_STEPS - 20 + 1 */
	probe_at = -1;
	for (int i = 1; i <= CW_PRICE_PROBE0_STEPS + 1; i++) {
		k = cw_draft_price_next(&pr);
		if (k == 0) {
			probe_at = i;
			break;
		}
		cw_draft_price_note(&pr, 2, 2, 110, 12000);
	}
	CHECK(probe_at == CW_PRICE_PROBE0_STEPS - 20 + 1,
	      "plain probe while on at call %d, want %d", probe_at,
	      CW_PRICE_PROBE0_STEPS - 20 + 1);
}

static void test_parse(void)
{
	int k = -1, pr = -1;

	CHECK(cw_draft_parse_mode("auto", &k, &pr) == 0 &&
		      k == CW_DRAFT_DEFAULT_K && pr == 1,
	      "auto: k %d priced %d", k, pr);
	CHECK(cw_draft_parse_mode("auto:2", &k, &pr) == 0 && k == 2 &&
		      pr == 1, "auto:2: k %d priced %d", k, pr);
	CHECK(cw_draft_parse_mode("ngram:3", &k, &pr) == 0 && k == 3 &&
		      pr == 0, "ngram:3: k %d priced %d", k, pr);
	CHECK(cw_draft_parse_mode("off", &k, &pr) == 0 && k == 0 && pr == 0,
	      "off: k %d priced %d", k, pr);
	CHECK(cw_draft_parse_mode("auto:0", &k, &pr) == -EINVAL,
	      "auto:0 accepted");
	CHECK(cw_draft_parse_mode("autox", &k, &pr) == -EINVAL,
	      "autox accepted");
	CHECK(cw_draft_parse_mode("auto:17", &k, &pr) == -EINVAL,
	      "auto:17 accepted");
	{
		int mtp = -1;

		CHECK(cw_draft_parse_src("mtp", &k, &pr, &mtp) == 0 &&
			      k == CW_DRAFT_DEFAULT_K && pr == 0 && mtp == 1,
		      "mtp: k %d priced %d mtp %d", k, pr, mtp);
		CHECK(cw_draft_parse_src("mtp:2", &k, &pr, &mtp) == 0 &&
			      k == 2 && mtp == 1, "mtp:2: k %d mtp %d", k, mtp);
		CHECK(cw_draft_parse_src("auto:3", &k, &pr, &mtp) == 0 &&
			      k == 3 && pr == 1 && mtp == 0,
		      "auto:3: k %d priced %d mtp %d", k, pr, mtp);
		CHECK(cw_draft_parse_src("mtp:0", &k, &pr, &mtp) == -EINVAL &&
			      cw_draft_parse_src("mtp:17", &k, &pr, &mtp) ==
				      -EINVAL &&
			      cw_draft_parse_src("mtpx", &k, &pr, &mtp) ==
				      -EINVAL,
		      "mtp:0, mtp:17 or mtpx accepted");
	}
}

/* /metrics: two ended generations' figures add up */
static void test_metrics(void)
{
	struct cw_metrics m;
	struct cw_metrics_ext x = { 0 };
	uint64_t h1[CW_DRAFT_MAX + 1] = { 0 }, h2[CW_DRAFT_MAX + 1] = { 0 };
	char *txt = NULL;

	h1[0] = 3;
	h1[2] = 5;
	h2[2] = 1;
	h2[4] = 7;
	cw_metrics_init(&m);
	cw_metrics_spec_price(&m, 1000, 300, 11, h1);
	cw_metrics_spec_price(&m, 20, 4, 2, h2);
	CHECK(cw_metrics_render(&m, &x, &txt) == 0 && txt, "render failed");
	if (txt) {
		CHECK(strstr(txt, "strata_spec_expert_bytes_total{steps="
				  "\"verify\"} 1020\n") != NULL,
		      "verify bytes 1000 + 20 not rendered");
		CHECK(strstr(txt, "strata_spec_expert_bytes_total{steps="
				  "\"plain\"} 304\n") != NULL,
		      "plain bytes 300 + 4 not rendered");
		CHECK(strstr(txt, "strata_spec_verify_step_tokens_total "
				  "13\n") != NULL,
		      "verify step tokens 11 + 2 not rendered");
		CHECK(strstr(txt, "strata_spec_draft_limit_steps_total{limit="
				  "\"0\"} 3\n") != NULL, "limit 0: 3");
		CHECK(strstr(txt, "strata_spec_draft_limit_steps_total{limit="
				  "\"2\"} 6\n") != NULL, "limit 2: 5 + 1");
		CHECK(strstr(txt, "strata_spec_draft_limit_steps_total{limit="
				  "\"4\"} 7\n") != NULL, "limit 4: 7");
	}
	free(txt);
	cw_metrics_fini(&m);
}

int main(void)
{
	test_expected();
	test_argmax();
	test_estimate();
	test_line();
	test_next();
	test_parse();
	test_metrics();
	if (fails) {
		printf("%d failure(s)\n", fails);
		return 1;
	}
	printf("OK\n");
	return 0;
}
