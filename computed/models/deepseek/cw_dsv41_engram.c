/*
 * cw_dsv41_engram.c — DeepSeek-V4.1's Engram before a layer's mixer, and
 * its store-mode prefetch (cw_dsv41_int.h; model doc 3.5).
 */
#include "cw_dsv41_int.h"

#include <math.h>
#include <string.h>

#include "cw_engram_es.h"
#include "st_engram_hash.h"
#include "st_log.h"

/* Engram before layer L's mixer: X (one token's hc x D streams) += gate
 * per stream times the value read from the table rows of the n-grams
 * ending at p. */
int cw_dsv41_engram(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		  const struct cw_dsv_layer *L, int64_t p, float *X, int t,
		  struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult;
	const int rpp = m->engram_rows_per_pos, hd = c->engram_head_dim;
	int64_t rows[rpp];
	float E[rpp * hd], kv[(hc + 1) * D];
	int r;

	r = st_engram_hash_rows(m->hash, L->ei, s->tokens, (int)p, rows);
	if (r < 0)
		return st_diag_set(diag, r,
				   "engram layer %d: hashing position %lld failed",
				   c->engram_layer[L->ei], (long long)p);
	r = m->prov.get_rows(m->prov.ctx, L->ei, rows, rpp, E, diag);
	if (r < 0)
		return r;
	cw_dsv_lin(m, &L->ewkv, E, kv);
	for (int k = 0; k < hc; k++) {
		double g = cw_dsv41_engram_gate(X + k * D, L->eqk + k * D,
						kv + k * D, D, c->rms_norm_eps);

		for (int d = 0; d < D; d++)
			X[k * D + d] = (float)(X[k * D + d] +
					       g * kv[hc * D + d]);
		if (s->dbg && s->dbg->engram_gates && t < s->dbg->max_tokens)
			s->dbg->engram_gates[((size_t)t * c->n_engram + L->ei) *
						     hc + k] = (float)g;
	}
	if (s->dbg && s->dbg->engram_rows && t < s->dbg->max_tokens)
		memcpy(s->dbg->engram_rows +
			       ((size_t)t * c->n_engram + L->ei) * rpp,
		       rows, sizeof(rows));
	return 0;
}

/* Store mode: asks expertd for the Engram rows of positions p0 ..
 * p0 + n - 1 of every Engram layer as soon as their tokens are known (the
 * hash reads token ids only), so that the layers' fetches find them
 * cached or in flight.  A hint: a refusal is warned once and counted. */
void cw_dsv41_engram_prefetch(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, int p0, int n)
{
	if (!m->es || !m->hash || m->no_engram_prefetch)
		return;
	for (int t = 0; t < n; t++) {
		struct st_diag d = { { 0 } };

		if (cw_engram_es_prefetch_token(m->es, m->hash, s->tokens,
						p0 + t, 0, &d) < 0 &&
		    s->prefetch_failed++ == 0)
			st_warn("Engram prefetch to expertd failed: %s "
				"(lookups may wait for reads; results are "
				"unaffected)", d.msg);
	}
}

