/* cw_draft_price.c — see cw_draft_price.h. */
#include "cw_draft_price.h"

#include <errno.h>
#include <string.h>

int cw_draft_price_init(struct cw_draft_price *pr, int k_max)
{
	if (k_max < 1 || k_max > CW_DRAFT_MAX)
		return -EINVAL;
	memset(pr, 0, sizeof(*pr));
	pr->k_max = k_max;
	pr->acc = 1.0; /* prior: one success, one failure (p = 1/2) */
	pr->fail = 1.0;
	pr->k_best = k_max;
	return 0;
}

int cw_draft_price_note(struct cw_draft_price *pr, int k, int accepted,
			uint64_t step_ns, uint64_t expert_bytes)
{
	if (k < 0 || k > pr->k_max || accepted < 0 || accepted > k)
		return -EINVAL;
	if (pr->n[k] == 0) {
		pr->t_ns[k] = (double)step_ns;
		pr->bytes[k] = (double)expert_bytes;
	} else {
		pr->t_ns[k] += CW_PRICE_EWMA * ((double)step_ns - pr->t_ns[k]);
		pr->bytes[k] += CW_PRICE_EWMA *
				((double)expert_bytes - pr->bytes[k]);
	}
	if (pr->n[k] < UINT32_MAX)
		pr->n[k]++;
	if (k == 0) {
		pr->since_plain = 0;
		return 0;
	}
	pr->since_plain++;
	/* a accepted then (a < k) one rejected: the truncated geometric's
	 * successes and failures */
	pr->acc = pr->acc * CW_PRICE_DECAY + accepted;
	pr->fail = pr->fail * CW_PRICE_DECAY + (accepted < k);
	return 0;
}

double cw_draft_price_p(const struct cw_draft_price *pr)
{
	return pr->acc / (pr->acc + pr->fail);
}

double cw_draft_price_expected(int k, double p)
{
	double e = 0.0, pi = 1.0;

	for (int i = 1; i <= k; i++) {
		pi *= p;
		e += pi;
	}
	return e;
}

double cw_draft_price_time(const struct cw_draft_price *pr, int k)
{
	double sw = 0, sk = 0, st = 0, skk = 0, skt = 0, a, b, den, t;
	int n_k = 0;

	if (k >= 0 && k <= pr->k_max && pr->n[k])
		return pr->t_ns[k];
	for (int j = 0; j <= pr->k_max; j++) {
		double w = pr->n[j] < 8 ? pr->n[j] : 8;

		if (!pr->n[j])
			continue;
		n_k++;
		sw += w;
		sk += w * j;
		st += w * pr->t_ns[j];
		skk += w * j * j;
		skt += w * j * pr->t_ns[j];
	}
	if (n_k == 0)
		return -1.0;
	den = sw * skk - sk * sk;
	if (n_k == 1 || den <= 0.0)
		return st / sw;
	b = (sw * skt - sk * st) / den;
	a = (st - b * sk) / sw;
	t = a + b * k;
	/* a line through noisy points may dip: never cheaper than the
	 * cheapest step seen */
	for (int j = 0; j <= pr->k_max; j++)
		if (pr->n[j] && t < pr->t_ns[j] && j < k)
			t = pr->t_ns[j];
	return t > 1.0 ? t : 1.0;
}

int cw_draft_price_argmax(int k_max, double p, const double *t_ns)
{
	int best = 0;
	double best_rate = 1.0 / t_ns[0];

	for (int k = 1; k <= k_max; k++) {
		double rate = (1.0 + cw_draft_price_expected(k, p)) / t_ns[k];

		if (rate > best_rate) {
			best_rate = rate;
			best = k;
		}
	}
	return best;
}

int cw_draft_price_next(struct cw_draft_price *pr)
{
	double t[CW_DRAFT_MAX + 1];
	int seen_k = 0;

	for (int k = 1; k <= pr->k_max; k++)
		seen_k |= pr->n[k] > 0;
	/* measure both sides first: drafts (a step without a match is a
	 * plain one anyway), then one plain step if none came by itself */
	if (!seen_k)
		return pr->k_max;
	if (!pr->n[0] || pr->since_plain >= CW_PRICE_PROBE0_STEPS) {
		pr->since_plain = 0;
		return 0;
	}
	for (int k = 0; k <= pr->k_max; k++)
		t[k] = cw_draft_price_time(pr, k);
	pr->k_best = cw_draft_price_argmax(pr->k_max, cw_draft_price_p(pr), t);
	if (pr->k_best > 0) {
		pr->since_probe = 0;
		return pr->k_best;
	}
	if (++pr->since_probe >= CW_PRICE_PROBE_STEPS) {
		pr->since_probe = 0;
		return pr->k_max < CW_PRICE_PROBE_K ? pr->k_max :
						      CW_PRICE_PROBE_K;
	}
	return 0;
}
