/*
 * cw_dsv41_csa2.c — DeepSeek-V4.1's CSA2 sources (cw_dsv41_int.h; model
 * doc 3.4): a KV source's compressed rows and index keys, an index
 * source's selection with the candidate blocks.
 */
#include "cw_dsv41_int.h"

#include <math.h>
#include <string.h>

#include "st_kvfmt_v41.h"

/* KV source: stores the token's group inputs and, when it closes group
 * g, appends the group's compressed row and index key (pooled, normed;
 * index key k_norm(wk latent), both roped at g m, with their QAT). */
int cw_dsv41_kv_source(const struct cw_dsv_model *m,
		     struct cw_dsv_state *s, int l, const float *a,
		     int64_t p)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int hd = c->head_dim, Id = c->index_head_dim, mr = L->ratio;
	float lat[hd], *slot = cw_dsv41_grp_slot(m, s, l, p, 1), sk[Id], sr[hd];
	int64_t g;
	int r = 0;

	cw_dsv_lin(m, &L->cwkv, a, slot);
	if (mr > 1)
		cw_dsv_lin(m, &L->cwgate, a, slot + hd);
	if ((p + 1) % mr)
		return 0;
	g = (p + 1) / mr - 1;
	if (mr > 1) {
		const float *cs[mr], *zs[mr];

		for (int i = 0; i < mr; i++) {
			cs[i] = cw_dsv41_grp_slot(m, s, l, g * mr + i, 0);
			zs[i] = cs[i] + hd;
		}
		cw_dsv_pool(cs, zs, mr, hd, lat);
	} else {
		memcpy(lat, slot, sizeof(lat));
	}
	cw_dsv_rmsnorm(lat, L->cnorm, hd, c->rms_norm_eps, lat);
	{
		float *k = cw_dsv41_row_begin(m, s, l, CW_DSV41_S_IKEY, g, sk);

		/* from the pre-rope latent */
		cw_dsv_lin(m, &L->iwk, lat, k);
		cw_dsv_rmsnorm(k, L->iknorm, Id, c->rms_norm_eps, k);
		cw_dsv_rope(k, Id, c->rope_dim / 2, m->freq_comp, g * mr, 0);
		r = cw_dsv41_row_end(m, s, l, CW_DSV41_S_IKEY, g, k);
	}
	{
		float *row = cw_dsv41_row_begin(m, s, l, CW_DSV41_S_CROW, g, sr);

		memcpy(row, lat, sizeof(lat));
		cw_dsv_rope(row, hd, c->rope_dim / 2, m->freq_comp, g * mr, 0);
		if (r == 0)
			r = cw_dsv41_row_end(m, s, l, CW_DSV41_S_CROW, g, row);
	}
	return r;
}

/* Index source at layer l for token t (position p): scores of the
 * visible entries of its KV source's keys, the candidate blocks (the
 * candidate source) or the candidate mask (later index sources), and
 * the top-k, into ck->sel / nsel. */
int cw_dsv41_index_source(const struct cw_dsv_model *m,
			struct cw_dsv_state *s, int l,
			const float *a, const float *qr, int64_t p, int t,
			struct cw_dsv_chunk *ck)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int IH = c->index_n_heads, Id = c->index_head_dim;
	const int nv = cw_dsv41_n_visible(p, L->ratio);
	/* the keys scored: its KV source's; with the LAST_SOURCE switch, at
	 * a one-token decode step with an open group, the last KV source's
	 * (cw_dsv41_set_decode_index_keys) */
	const int ksrc = m->v41_decode_ikey_layer >= 0 && ck->n == 1 &&
			 p > 0 && L->ratio > 1 && (p + 1) % L->ratio ?
			 m->v41_decode_ikey_layer : L->kv_src;
	float iq[IH * Id], om[IH], kb[Id];
	double *sc = ck->sc;
	int r = 0, *sel = ck->sel + ((size_t)ck->isx[l] * ck->n + t) *
					   c->index_topk;

	cw_dsv_lin(m, &L->iwq_b, qr, iq);
	for (int h = 0; h < IH && r == 0; h++) {
		cw_dsv_rope(iq + h * Id, Id, c->rope_dim / 2, m->freq_comp, p,
			     0);
		if (m->qat & CW_DSV41_QAT_INDEX_FP4)
			r = st_kv41_idx_roundtrip(iq + h * Id, Id);
	}
	if (r < 0)
		return r;
	/* reference code in both modes (selections as reference mode's
	 * but near ties) */
	cw_dsv_mat_mv(NULL, &L->iweights, a, om);
	for (int e = 0; e < nv; e++) {
		const float *k = cw_dsv41_row_get(m, s, ksrc, CW_DSV41_S_IKEY,
						  e, kb);
		double acc = 0.0;

		for (int h = 0; h < IH; h++) {
			double d = 0.0;

			for (int i = 0; i < Id; i++)
				d += (double)iq[h * Id + i] * k[i];
			d /= sqrt((double)Id);
			acc += om[h] / sqrt((double)IH) * (d > 0 ? d : 0.0);
		}
		sc[e] = acc;
	}
	if (l == c->candidate_source) {
		ck->ncand[t] = cw_dsv41_candidate_blocks(
			sc, nv, c->candidate_block_size,
			c->candidate_topk_blocks,
			ck->cand + (size_t)t * c->candidate_topk_blocks);
	} else if (c->candidate_source >= 0 && l > c->candidate_source &&
		   L->kv_src == m->layers[c->candidate_source].kv_src) {
		const int *cb = ck->cand + (size_t)t * c->candidate_topk_blocks;
		const int B = c->candidate_block_size;

		for (int e = 0; e < nv; e++) {
			int in = 0;

			for (int j = 0; j < ck->ncand[t] && !in; j++)
				in = e / B == cb[j];
			if (!in)
				sc[e] = -INFINITY;
		}
	}
	ck->nsel[(size_t)ck->isx[l] * ck->n + t] =
		cw_dsv41_select(sc, nv, c->index_topk, sel);
	return 0;
}

