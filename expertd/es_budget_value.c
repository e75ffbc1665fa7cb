/*
 * es_budget_value.c — what expert memory is worth (issue 24 item 2; the
 * arbiter of st_ledger.h compares it with kvd's): the marginal value of
 * `step` bytes of expert slots more or less, from the activation
 * statistics and the measured cost of a demand miss, and the decayed
 * token rate those need.  Pure functions of their inputs: es_budget.c
 * feeds them from the daemon, test_es_budget.c from a synthetic table.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "es_daemon.h"

void es_budget_rate_update(struct es_budget_rate *r, uint64_t tokens,
			   uint64_t now_ns)
{
	double dt, a;

	if (!r->last_ns || tokens < r->last_tokens || now_ns < r->last_ns) {
		/* first sample, or the statistics were reset */
		r->last_ns = now_ns;
		r->last_tokens = tokens;
		return;
	}
	dt = (double)(now_ns - r->last_ns) * 1e-9;
	a = exp(-dt / ES_BUDGET_RATE_TAU_S);
	r->tok_w = r->tok_w * a + (double)(tokens - r->last_tokens);
	r->time_w = r->time_w * a + dt;
	r->last_ns = now_ns;
	r->last_tokens = tokens;
}

double es_budget_rate_tps(const struct es_budget_rate *r)
{
	return r->time_w > 0 ? r->tok_w / r->time_w : 0.0;
}

uint32_t es_budget_slots(uint64_t target, uint64_t record_bytes,
			 uint32_t top_k, uint32_t n_slots)
{
	uint64_t n = record_bytes ? target / record_bytes : n_slots;

	if (n < top_k)
		n = top_k;
	return n > n_slots ? n_slots : (uint32_t)n;
}

void es_budget_rates(const struct es_actstats *st, double tps, double *rate)
{
	for (uint32_t l = 0; l < st->n_layers; l++)
		for (uint32_t e = 0; e < st->n_experts; e++)
			rate[(size_t)l * st->n_experts + e] =
				es_actstats_rate(st, l, e) * tps;
}

static int cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x < y) - (x > y);
}

int es_budget_value(const double *rate, const uint8_t *resident, size_t n,
		    uint64_t n_free, uint64_t s, double miss_ns,
		    uint64_t step_bytes, double *ret_gain, double *ret_loss)
{
	double *out, *in, gain = 0, loss = 0, per_gib;
	size_t n_out = 0, n_in = 0;
	uint64_t take;

	*ret_gain = *ret_loss = 0;
	if (!n || !s || !step_bytes)
		return 0;
	out = malloc(n * sizeof(double));
	in = malloc(n * sizeof(double));
	if (!out || !in) {
		free(out);
		free(in);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		if (resident[i])
			in[n_in++] = rate[i];
		else
			out[n_out++] = rate[i];
	}
	qsort(out, n_out, sizeof(double), cmp_desc);
	qsort(in, n_in, sizeof(double), cmp_desc);
	/* more: the free slots already take the n_free most active experts
	 * outside; step bytes more take the next s */
	for (uint64_t i = n_free; i < n_free + s && i < n_out; i++)
		gain += out[i];
	/* less: the free slots go first, then the least active residents */
	take = s > n_free ? s - n_free : 0;
	for (uint64_t i = 0; i < take && i < n_in; i++)
		loss += in[n_in - 1 - i];
	per_gib = miss_ns / ((double)step_bytes / (double)(1ull << 30));
	*ret_gain = gain * per_gib;
	*ret_loss = loss * per_gib;
	free(out);
	free(in);
	return 0;
}
