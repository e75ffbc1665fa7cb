/*
 * cw_dsv4.c — DeepSeek-V4's layer (cw_dsv_state.h: struct cw_dsv_rev; the
 * loop over layers and tokens: cw_dsv_eval.c).  Formulas:
 * MODEL_FAMILY_DEEPSEEK_V4.md 2.5 (HF modeling_deepseek_v4.py).
 *
 * One token through one layer: mHC pre, projections, the K=V row into the
 * window ring, the compressor inputs into their partial window, the
 * compressed rows the token closes (before its own attention: it sees
 * them), the attention over what is visible at its position, mHC post,
 * the MoE sublayer.  Each token reads only its own values and what
 * earlier positions left in the state, in a fixed order, so any split of
 * a sequence into chunks gives bit-identical values.
 */
#include "cw_dsv_state.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_steptime.h"
#include "es_client.h"
#include "es_proto.h"
#include "kv_client.h"
#include "st_log.h"

/* Row r of stream `kind` of layer l: process-local ring or array, or the
 * kvd page row (writable when `write`).  A row kvd does not map (spilled
 * despite the pin, shared where a write was due: a bug, not input) sets
 * row_missing and gives a scratch row, so the eval fails cleanly. */
static float *srow(struct cw_dsv_state *s, int l, int kind, int64_t r,
		   int write)
{
	struct cw_dsv_lstate *ls = &s->ls[l];
	uint8_t *p;

	if (!s->q.kv || ls->local)
		return ls->buf[kind] +
		       (size_t)(ls->ring[kind] ? r % ls->ring[kind] : r) *
			       ls->elems[kind];
	p = write ? kv_client_row_writable(s->q.kv, s->q.seq, ls->kvs[kind],
					   (uint32_t)r) :
		    kv_client_row(s->q.kv, s->q.seq, ls->kvs[kind], (uint32_t)r);
	if (!p) {
		s->q.row_missing = 1;
		return s->zero_row;
	}
	return (float *)(void *)p;
}

/* Tokens of compressor inputs a layer keeps: CSA rows pool the previous
 * window too. */
static int comp_ring(const struct cw_dsv_comp *cp)
{
	return cp->overlap ? 2 * cp->ratio : cp->ratio;
}

/* The reference loop (routers, indexer head weights: reference code in
 * both modes). */
static void matvec(const struct cw_dsv_mat *m, const float *x, float *y)
{
	cw_dsv_mat_mv(NULL, m, x, y);
}

/* The indexer's QAT: Hadamard then E2M1 per 32 (n a power of two). */
static void index_qat(float *x, int n)
{
	cw_dsv_hadamard(x, n);
	cw_dsv_fp4_roundtrip(x, n, 32);
}

/* V4's streams of every layer, allocated from the layer's stream
 * declarations, so the planner's figures (cw_dsv4_kv_bytes_per_token)
 * describe this very state; in kvd, stream i of the declaration
 * (cw_dsv_kv_decl) is the i-th stream of the layers in order. */
static int v4_state_init(const struct cw_dsv_model *m, struct cw_dsv_state *s,
			 int max_tokens)
{
	const struct st_dsv_config *c = &m->cfg;
	int kvs = 0, widest = 1;

	for (int l = 0; l < c->n_layers; l++) {
		const struct cw_dsv_layer *L = &m->layers[l];
		struct cw_dsv_lstate *ls = &s->ls[l];
		struct cw_dsv_stream st[CW_DSV_MAX_STREAMS];
		int ns = cw_dsv_streams(c, l, st);

		for (int i = 0; i < ns; i++) {
			/* process-local rings: CW_DSV_ROLLBACK_MAX rows of
			 * slack (cw_dsv_state_truncate) */
			int ring = st[i].fixed_rows + CW_DSV_ROLLBACK_MAX;
			size_t rows = st[i].rows_den ?
					      (size_t)max_tokens / st[i].rows_den + 1 :
					      (size_t)ring;
			int k = st[i].kind;

			ls->elems[k] = st[i].row_elems;
			ls->ring[k] = st[i].rows_den ? 0 : ring;
			ls->kvs[k] = kvs++;
			widest = st[i].row_elems > widest ? st[i].row_elems :
							    widest;
			if (s->q.kv)
				continue;
			ls->buf[k] = malloc(rows * st[i].row_elems *
					    sizeof(float));
			if (!ls->buf[k])
				return -ENOMEM;
		}
		/* the declarations agree with the code's own ring sizes
		 * (a mismatch is a bug, not bad input) */
		for (int i = 0; i < ns; i++) {
			const struct cw_dsv_comp *cp =
				st[i].kind == CW_DSV_COMP_STATE ? &L->comp :
				st[i].kind == CW_DSV_INDEX_STATE ? &L->icomp :
								    NULL;

			assert(!cp || (st[i].row_elems == 2 * cp->wkv.rows &&
				       st[i].fixed_rows == comp_ring(cp)));
		}
		assert(!L->ratio || (ls->kvs[CW_DSV_COMP_STATE] >= 0 &&
				     ls->kvs[CW_DSV_COMP_ROWS] >= 0));
		assert(!L->has_indexer ||
		       (ls->kvs[CW_DSV_INDEX_STATE] >= 0 &&
			ls->kvs[CW_DSV_INDEX_ROWS] >= 0));
	}
	if (s->q.kv) {
		s->zero_row = calloc((size_t)widest, sizeof(float));
		if (!s->zero_row)
			return -ENOMEM;
	}
	return 0;
}

/* Compressor inputs of one token: c = wkv a, z = wgate a + ape[p mod m]. */
static void comp_inputs(const struct cw_dsv_model *m,
			const struct cw_dsv_comp *cp, const float *a,
			int64_t p, float *cz)
{
	int cols = cp->wkv.rows;
	const float *ape = cp->ape + (size_t)(p % cp->ratio) * cols;

	cw_dsv_lin(m, &cp->wkv, a, cz);
	cw_dsv_lin(m, &cp->wgate, a, cz + cols);
	for (int j = 0; j < cols; j++)
		cz[cols + j] += ape[j];
}

/*
 * Compressed row w from the stored per-token inputs: HCA pools tokens
 * [m w, m w + m); CSA (overlap) pools the first halves of tokens
 * [4w - 4, 4w) and the second halves of [4w, 4w + 4).  Then the weighted
 * RMSNorm and the compress rope at position m w.
 */
static void comp_row(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		     int l, const struct cw_dsv_comp *cp, int kind, int w,
		     int indexer, float *out)
{
	const struct st_dsv_config *c = &m->cfg;
	int cols = cp->wkv.rows, W = cp->width, ns = 0;
	const float *cs[2 * cp->ratio], *zs[2 * cp->ratio];
	int64_t mr = cp->ratio;

#define SLOT(t) srow(s, l, kind, (t), 0)
	if (cp->overlap) {
		for (int64_t t = mr * w - mr; t < mr * w; t++) {
			if (t < 0)
				continue;
			cs[ns] = SLOT(t);
			zs[ns++] = SLOT(t) + cols;
		}
		for (int64_t t = mr * w; t < mr * w + mr; t++) {
			cs[ns] = SLOT(t) + W;
			zs[ns++] = SLOT(t) + cols + W;
		}
	} else {
		for (int64_t t = mr * w; t < mr * (w + 1); t++) {
			cs[ns] = SLOT(t);
			zs[ns++] = SLOT(t) + cols;
		}
	}
#undef SLOT
	cw_dsv_pool(cs, zs, ns, W, out);
	cw_dsv_rmsnorm(out, cp->norm, W, c->rms_norm_eps, out);
	cw_dsv_rope(out, W, c->rope_dim / 2, m->freq_comp,
		     (int64_t)cp->ratio * w, 0);
	if (indexer && (m->qat & CW_DSV4_QAT_INDEX_FP4))
		index_qat(out, W);
	else if (!indexer && (m->qat & CW_DSV4_QAT_KV_FP8))
		cw_dsv_fp8_roundtrip(out, W - c->rope_dim, 64);
}

/* cw_dsv4_index_select over key rows given as pointers (the same sums in
 * the same order). */
static int index_select_rows(const float *q, const float *omega, int n_heads,
			     int dim, const float *const *keys, int n_vis,
			     int top_k, int *sel)
{
	double sc[n_vis > 0 ? n_vis : 1];

	if (n_vis <= top_k) {
		for (int w = 0; w < n_vis; w++)
			sel[w] = w;
		return n_vis < 0 ? 0 : n_vis;
	}
	for (int w = 0; w < n_vis; w++) {
		const float *kw = keys[w];
		double s = 0.0;

		for (int h = 0; h < n_heads; h++) {
			double d = 0.0;

			for (int i = 0; i < dim; i++)
				d += (double)q[h * dim + i] * kw[i];
			d /= sqrt((double)dim);
			s += omega[h] * (d > 0 ? d : 0.0);
		}
		sc[w] = s;
	}
	/* the top_k, ties to the lower row, sorted (the scores are finite:
	 * the family's one top-k) */
	return cw_dsv41_select(sc, n_vis, top_k, sel);
}

int cw_dsv4_index_select(const float *q, const float *omega, int n_heads,
			 int dim, const float *keys, int n_vis, int top_k,
			 int *sel)
{
	const float *rows[n_vis > 0 ? n_vis : 1];

	for (int w = 0; w < n_vis; w++)
		rows[w] = keys + (size_t)w * dim;
	return index_select_rows(q, omega, n_heads, dim, rows, n_vis, top_k,
				 sel);
}

/* Attention sublayer for one token at position p (a = attn_norm(u));
 * q/qr/iq/omega precomputed; out [D]. */
static void attention(const struct cw_dsv_model *m,
		      const struct cw_dsv_layer *L,
		      struct cw_dsv_state *s, int l, int64_t p,
		      const float *q, const float *iq, const float *omega,
		      float *out, int32_t *sel_out)
{
	const struct st_dsv_config *c = &m->cfg;
	int W = c->sliding_window;
	int lo = p - W + 1 < 0 ? 0 : (int)(p - W + 1);
	int n_win, n_vis = 0, n_sel = 0;

	/* the MTP block restarted at win_lo (cw_dsv_mtp_draft after a
	 * prefix hit): no rows before it (0 for the decoder layers) */
	if (lo < s->ls[l].win_lo)
		lo = (int)s->ls[l].win_lo;
	n_win = (int)p - lo + 1;

	if (L->ratio)
		n_vis = (int)((p + 1) / L->ratio);
	{
		int sel[n_vis > 0 ? n_vis : 1];
		const float *rows[n_win + (n_vis > 0 ? n_vis : 0)];
		int nr = 0;

		for (int j = lo; j <= p; j++)
			rows[nr++] = srow(s, l, CW_DSV_WINDOW, j, 0);
		if (L->has_indexer) {
			const float *keys[n_vis > 0 ? n_vis : 1];

			for (int w = 0; w < n_vis; w++)
				keys[w] = srow(s, l, CW_DSV_INDEX_ROWS, w, 0);
			n_sel = index_select_rows(iq, omega, c->index_n_heads,
						  c->index_head_dim, keys,
						  n_vis, c->index_topk, sel);
		} else
			for (n_sel = 0; n_sel < n_vis; n_sel++)
				sel[n_sel] = n_sel;
		for (int j = 0; j < n_sel; j++)
			rows[nr++] = srow(s, l, CW_DSV_COMP_ROWS, sel[j], 0);
		for (int j = 0; sel_out && j < c->index_topk; j++)
			sel_out[j] = j < n_sel ? sel[j] : -1;
		cw_dsv_attn_out(m, L, p, q, rows, nr, out);
	}
}

/* Store mode, at the start of an eval: the tokens about to be evaluated
 * are known (sampled, or the next prompt tokens), and so are their hash-
 * routed layers' experts (tid2eid).  Sends them to expertd at once as a
 * step-named hint (es_client_hint_step) so their reads start before layer
 * 0 runs and are not dropped as stale after the previous token's last
 * layer: every hash layer of the first token (position s->len), layer 0
 * of the following ones (a prompt is evaluated layer by layer, so their
 * later hash layers are hinted by route_report as each layer is
 * reported).  A refused hint changes no result: warned once, counted. */
static void step_hint(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		      const int32_t *ids, int n)
{
	const struct st_dsv_config *c = &m->cfg;
	const int K = c->top_k;
	int nl = c->n_hash_layers < c->n_layers ? c->n_hash_layers :
						  c->n_layers;
	int cap = nl * K + (n - 1) * K, nh = 0;
	int *hl, *he;
	struct st_diag d = { { 0 } };

	if (nl <= 0 || cap > ES_ROUTE_MAX_HINT)
		cap = nl > 0 ? nl * K : 0;
	if (!cap)
		return;
	hl = malloc((size_t)cap * sizeof(int));
	he = malloc((size_t)cap * sizeof(int));
	if (!hl || !he)
		goto out;
	for (int t = 0; t < n; t++)
		for (int j = 0; j < (t ? 1 : nl) && nh + K <= cap; j++) {
			int32_t e[K];
			int ne = cw_dsv4_hash_experts(m, j, ids[t], e);

			for (int k = 0; k < ne; k++) {
				hl[nh] = j;
				he[nh++] = e[k];
			}
		}
	if (es_client_hint_step(m->es, (uint32_t)(s->len + n - 1), nh, hl, he,
				&d) < 0 &&
	    s->run.route_failed++ == 0)
		st_warn("prefetch hint to expertd failed: %s (prefetch "
			"degrades; results are unaffected)", d.msg);
out:
	free(hl);
	free(he);
}

void cw_dsv4_head_with(const struct cw_dsv_model *m, const float *fn,
		       const float *base, const float *scale,
		       const float *norm, const float *X, float *logits)
{
	const struct st_dsv_config *c = &m->cfg;
	int n = c->hc_mult, D = c->hidden_size, nd = n * D;
	float pre[n], h[D];
	double ss = 0.0, r;

	for (int i = 0; i < nd; i++)
		ss += (double)X[i] * X[i];
	r = 1.0 / sqrt(ss / nd + c->rms_norm_eps);
	for (int k = 0; k < n; k++) {
		double acc = 0.0;

		for (int i = 0; i < nd; i++)
			acc += (double)fn[(size_t)k * nd + i] * X[i];
		pre[k] = (float)(1.0 / (1.0 + exp(-(acc * r * scale[0] +
						     base[k]))) +
				 c->hc_eps);
	}
	cw_dsv_collapse(X, pre, n, D, h);
	cw_dsv_rmsnorm(h, norm, D, c->rms_norm_eps, h);
	cw_dsv_lin(m, &m->head, h, logits);
}

/* The logits of one token: hc_head collapses the streams (P, the lagged
 * pre, is V4.1's). */
static void head(const struct cw_dsv_model *m, const float *X,
		 const float *P, float *logits)
{
	(void)P;
	cw_dsv4_head_with(m, m->hc_head_fn, m->hc_head_base,
			  m->hc_head_scale, m->norm, X, logits);
}


/* Store mode, before the layers run (cw_dsv_rev.before_eval). */
static void v4_before_eval(const struct cw_dsv_model *m,
			   struct cw_dsv_state *s, const int32_t *ids, int n)
{
	if (m->es && !m->no_route_reports && !m->no_step_hints)
		step_hint(m, s, ids, n);
}

/* Layer l for token t of the chunk (cw_dsv_rev.layer_token). */
static int v4_layer_token(const struct cw_dsv_model *m, struct cw_dsv_state *s,
			  int l, int t, struct cw_dsv_chunk *ck,
			  struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int D = c->hidden_size, hc = c->hc_mult, H = c->n_heads;
	const int hd = c->head_dim, IH = c->index_n_heads;
	const int Id = c->index_head_dim, K = c->top_k;
	const int64_t p = ck->p0 + t;
	float *X = ck->X + (size_t)t * hc * D;
	float pp[2 * hc + hc * hc], u[D], qr[c->q_lora_rank], a[D];
	float q[H * hd], iq[IH * Id], om[IH];
	float y[D], b[D], pre[hc], post[hc], comb[hc * hc];
	int32_t *dbg_ids = NULL, *dbg_sel = NULL;
	float *dbg_w = NULL;
	int dbg = s->dbg && t < s->dbg->max_tokens;
	size_t dl = (size_t)t * c->n_layers + l;
	int r;

	cw_steptime_phase(s->tl, CW_PHASE_DENSE);
	cw_dsv_hc_pre(X, hc, D, L->hc_attn_fn, L->hc_attn_base,
		       L->hc_attn_scale, c->hc_sinkhorn_iters, c->hc_eps,
		       c->rms_norm_eps, pp, pp + hc, pp + 2 * hc);
	cw_dsv_collapse(X, pp, hc, D, u);
	if (ck->n == 1 && !L->tid2eid && m->es && !m->no_route_reports &&
	    !m->no_layer_hints)
		cw_dsv_layer_hint(m, &s->run, l, p, u);
	cw_dsv_rmsnorm(u, L->attn_norm, D, c->rms_norm_eps, a);
	cw_dsv_attn_query(m, L, p, a, qr, q);
	cw_dsv_attn_kv(m, L, p, a, srow(s, l, CW_DSV_WINDOW, p, 1));
	if (L->ratio)
		comp_inputs(m, &L->comp, a, p,
			    srow(s, l, CW_DSV_COMP_STATE, p, 1));
	if (L->has_indexer) {
		comp_inputs(m, &L->icomp, a, p,
			    srow(s, l, CW_DSV_INDEX_STATE, p, 1));
		cw_dsv_lin(m, &L->iwq_b, qr, iq);
		for (int h = 0; h < IH; h++) {
			cw_dsv_rope(iq + h * Id, Id, c->rope_dim / 2,
				     m->freq_comp, p, 0);
			if (m->qat & CW_DSV4_QAT_INDEX_FP4)
				index_qat(iq + h * Id, Id);
		}
		matvec(&L->iweights, a, om);
		for (int h = 0; h < IH; h++)
			om[h] = (float)(om[h] / sqrt((double)IH));
	}
	/* a token closing a window emits its row before its own attention
	 * (it sees that row) */
	if (L->ratio && (p + 1) % L->ratio == 0) {
		int w = (int)((p + 1) / L->ratio - 1);

		comp_row(m, s, l, &L->comp, CW_DSV_COMP_STATE, w, 0,
			 srow(s, l, CW_DSV_COMP_ROWS, w, 1));
		if (L->has_indexer)
			comp_row(m, s, l, &L->icomp, CW_DSV_INDEX_STATE, w, 1,
				 srow(s, l, CW_DSV_INDEX_ROWS, w, 1));
	}
	if (dbg && s->dbg->selected && L->has_indexer)
		dbg_sel = s->dbg->selected + dl * c->index_topk;
	attention(m, L, s, l, p, q, iq, om, y, dbg_sel);
	cw_dsv_hc_post(X, hc, D, y, pp + hc, pp + 2 * hc);
	cw_dsv_hc_pre(X, hc, D, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale,
		       c->hc_sinkhorn_iters, c->hc_eps, c->rms_norm_eps, pre,
		       post, comb);
	cw_dsv_collapse(X, pre, hc, D, u);
	cw_dsv_rmsnorm(u, L->ffn_norm, D, c->rms_norm_eps, b);
	if (dbg && s->dbg->experts && s->dbg->weights) {
		dbg_ids = s->dbg->experts + dl * K;
		dbg_w = s->dbg->weights + dl * K;
	}
	cw_steptime_phase(s->tl, CW_PHASE_EXPERTS);
	r = cw_dsv_moe(m, &s->run, l, p, ck->ids[t], b, y, dbg_ids, dbg_w,
		       diag);
	cw_steptime_phase(s->tl, CW_PHASE_DENSE);
	if (r < 0)
		return r;
	cw_dsv_hc_post(X, hc, D, y, post, comb);
	return 0;
}

int cw_dsv4_window_row(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		       int l, int64_t p, const float *X)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int D = c->hidden_size, hc = c->hc_mult;
	float pp[2 * hc + hc * hc], u[D], a[D];

	cw_dsv_hc_pre(X, hc, D, L->hc_attn_fn, L->hc_attn_base,
		       L->hc_attn_scale, c->hc_sinkhorn_iters, c->hc_eps,
		       c->rms_norm_eps, pp, pp + hc, pp + 2 * hc);
	cw_dsv_collapse(X, pp, hc, D, u);
	cw_dsv_rmsnorm(u, L->attn_norm, D, c->rms_norm_eps, a);
	cw_dsv_attn_kv(m, L, p, a, srow(s, l, CW_DSV_WINDOW, p, 1));
	return s->q.row_missing && !s->ls[l].local ? -ST_E_STALE : 0;
}

const struct cw_dsv_rev cw_dsv4_rev = {
	.state_init = v4_state_init,
	.before_eval = v4_before_eval,
	.layer_token = v4_layer_token,
	.head = head,
};
