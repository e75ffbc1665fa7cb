/*
 * cw_dsv_attn.c — the attention site of the DeepSeek-V4 family where the
 * revisions agree (cw_dsv_int.h; MODEL_FAMILY_DEEPSEEK_V4.md 2.5.3 and
 * 3.3): the low-rank query with its rope, the one K=V row of a token, and
 * the sink attention over the rows a revision gathers (its window, then
 * the compressed rows its indexer selected) with the inverse rope and the
 * grouped output projection.  Which compressed rows exist and which are
 * selected is each revision's own (cw_dsv4.c: CSA/HCA; cw_dsv41.c: CSA2).
 * Layers that compress rope with the compress rope's frequencies.
 */
#include "cw_dsv_int.h"

#include "cw_dsv.h"

/* The rope frequencies of layer L: the compress rope's where it
 * compresses. */
static const double *freqs(const struct cw_dsv_model *m,
			   const struct cw_dsv_layer *L)
{
	return L->ratio ? m->freq_comp : m->freq_main;
}

void cw_dsv_attn_query(const struct cw_dsv_model *m,
		       const struct cw_dsv_layer *L, int64_t p,
		       const float *a, float *qr, float *q)
{
	const struct st_dsv_config *c = &m->cfg;
	const int H = c->n_heads, hd = c->head_dim;
	const double *fr = freqs(m, L);

	cw_dsv_lin(m, &L->wq_a, a, qr);
	cw_dsv_rmsnorm(qr, L->q_norm, c->q_lora_rank, c->rms_norm_eps, qr);
	cw_dsv_lin(m, &L->wq_b, qr, q);
	for (int h = 0; h < H; h++) {
		/* V4 norms each head (unweighted); V4.1 does not */
		if (c->revision == ST_DSV_REV_V4)
			cw_dsv_rmsnorm(q + h * hd, NULL, hd, c->rms_norm_eps,
					q + h * hd);
		cw_dsv_rope(q + h * hd, hd, c->rope_dim / 2, fr, p, 0);
	}
}

void cw_dsv_attn_kv(const struct cw_dsv_model *m,
		    const struct cw_dsv_layer *L, int64_t p, const float *a,
		    float *kv)
{
	const struct st_dsv_config *c = &m->cfg;
	const int hd = c->head_dim;

	cw_dsv_lin(m, &L->wkv, a, kv);
	cw_dsv_rmsnorm(kv, L->kv_norm, hd, c->rms_norm_eps, kv);
	cw_dsv_rope(kv, hd, c->rope_dim / 2, freqs(m, L), p, 0);
	/* V4's KV_FP8 round trip of the nope dims (V4.1's window format is
	 * applied where the row is stored) */
	if (c->revision == ST_DSV_REV_V4 && (m->qat & CW_DSV4_QAT_KV_FP8))
		cw_dsv_fp8_roundtrip(kv, hd - c->rope_dim, 64);
}

void cw_dsv_attn_out(const struct cw_dsv_model *m,
		     const struct cw_dsv_layer *L, int64_t p, const float *q,
		     const float *const *rows, int n_rows, float *out)
{
	const struct st_dsv_config *c = &m->cfg;
	const int H = c->n_heads, hd = c->head_dim, G = c->o_groups;
	const int R = c->o_lora_rank;
	const double *fr = freqs(m, L);
	float o[H * hd], t[G * R];

	for (int h = 0; h < H; h++) {
		cw_dsv_sink_attn(q + h * hd, rows, n_rows, hd, L->sink[h],
				  o + h * hd);
		cw_dsv_rope(o + h * hd, hd, c->rope_dim / 2, fr, p, 1);
	}
	/* wo_a's input takes no activation trip: the official V4 code's
	 * BF16 einsum (inference/model.py Attention.forward, index file id
	 * 70831076062); wo_b's does (RowParallelLinear -> linear) */
	for (int g = 0; g < G; g++)
		cw_dsv_lin_rows_noact(m, &L->wo_a, g * R, R,
				      o + (size_t)g * (H / G) * hd,
				      t + g * R);
	cw_dsv_lin(m, &L->wo_b, t, out);
}
