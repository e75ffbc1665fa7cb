/* cw_sampler.c — see cw_sampler.h.  xoshiro256** (Blackman & Vigna, 2018)
 * seeded with splitmix64; the stream is part of strata, so a seed gives the
 * same tokens on every machine. */
#include "cw_sampler.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(uint64_t s[4])
{
	const uint64_t result = rotl(s[1] * 5, 7) * 9;
	const uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

int cw_sampler_init(struct cw_sampler *s, const struct cw_sampler_params *p)
{
	uint64_t x;

	memset(s, 0, sizeof(*s));
	if (isnan(p->temperature) || isnan(p->top_p))
		return -EINVAL;
	s->p = *p;
	x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	return 0;
}

void cw_sampler_fini(struct cw_sampler *s)
{
	free(s->idx);
	free(s->prob);
	s->idx = NULL;
	s->prob = NULL;
}

double cw_sampler_uniform(struct cw_sampler *s)
{
	return (double)(xoshiro_next(s->rng) >> 11) * (1.0 / 9007199254740992.0);
}

int cw_argmax(const float *logits, int n)
{
	int best = 0;

	for (int i = 1; i < n; i++)
		if (logits[i] > logits[best])
			best = i;
	return best;
}


static int cmp_desc(const void *a, const void *b, void *arg)
{
	const float *pr = arg;
	int ia = *(const int *)a, ib = *(const int *)b;

	if (pr[ia] > pr[ib])
		return -1;
	if (pr[ia] < pr[ib])
		return 1;
	return ia - ib;
}

/* The distribution cw_sampler_sample draws from: s->prob[s->idx[i]] for
 * i < *ret_m, unnormalised, *ret_sum their total.  0 or -ENOMEM. */
static int sampler_dist(struct cw_sampler *s, const float *logits, int n,
			int *ret_m, double *ret_sum)
{
	float mx = -INFINITY;
	double sum = 0.0;
	int m = n;

	if (s->cap < n) {
		free(s->idx);
		free(s->prob);
		s->idx = malloc(sizeof(int) * (size_t)n);
		s->prob = malloc(sizeof(float) * (size_t)n);
		if (!s->idx || !s->prob) {
			s->cap = 0;
			return -ENOMEM;
		}
		s->cap = n;
	}
	for (int i = 0; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	for (int i = 0; i < n; i++) {
		s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
		sum += s->prob[i];
	}
	for (int i = 0; i < n; i++) {
		s->prob[i] = (float)(s->prob[i] / sum);
		s->idx[i] = i;
	}
	qsort_r(s->idx, (size_t)n, sizeof(int), cmp_desc, s->prob);
	if (s->p.top_k > 0 && s->p.top_k < m)
		m = s->p.top_k;
	if (s->p.top_p > 0.0f && s->p.top_p < 1.0f) {
		double c = 0.0;

		for (int i = 0; i < m; i++) {
			c += s->prob[s->idx[i]];
			if (c >= s->p.top_p) {
				m = i + 1;
				break;
			}
		}
	}
	sum = 0.0;
	for (int i = 0; i < m; i++)
		sum += s->prob[s->idx[i]];
	*ret_m = m;
	*ret_sum = sum;
	return 0;
}

int cw_sampler_sample(struct cw_sampler *s, const float *logits, int n)
{
	double sum, acc = 0.0, u;
	int m, r;

	if (s->p.temperature <= 0.0f)
		return cw_argmax(logits, n);
	r = sampler_dist(s, logits, n, &m, &sum);
	if (r < 0)
		return r;
	u = cw_sampler_uniform(s) * sum;
	for (int i = 0; i < m; i++) {
		acc += s->prob[s->idx[i]];
		if (u < acc)
			return s->idx[i];
	}
	return s->idx[m - 1];
}

int cw_sampler_verify(struct cw_sampler *s, const float *logits, int n,
		      int32_t draft)
{
	double sum, px = 0.0, acc = 0.0, u;
	int m, r, last = -1;

	if (draft < 0 || draft >= n)
		return -EINVAL;
	if (s->p.temperature <= 0.0f)
		return cw_argmax(logits, n);
	r = sampler_dist(s, logits, n, &m, &sum);
	if (r < 0)
		return r;
	for (int i = 0; i < m; i++)
		if (s->idx[i] == draft)
			px = s->prob[draft];
	/* accept with probability p(draft) = px / sum */
	if (cw_sampler_uniform(s) * sum < px)
		return draft;
	/* rejected: the residual p - q is p without the draft (px < sum
	 * here, or the draw above could not have failed) */
	u = cw_sampler_uniform(s) * (sum - px);
	for (int i = 0; i < m; i++) {
		if (s->idx[i] == draft)
			continue;
		last = s->idx[i];
		acc += s->prob[last];
		if (u < acc)
			return last;
	}
	return last >= 0 ? last : draft;
}
