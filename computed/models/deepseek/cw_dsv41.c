/*
 * cw_dsv41.c — DeepSeek-V4.1's layer (cw_dsv_state.h: struct cw_dsv_rev;
 * the loop over layers and tokens, the CED shortcut and SWA replay:
 * cw_dsv_eval.c).  Formulas: MODEL_FAMILY_DEEPSEEK_V4.md 3.3-3.6 (HF
 * modeling_deepseek_v41.py, cache path); the tiny-deepseek-v41 README.
 *
 * One token through one layer: Engram (its layers; cw_dsv41_engram.c),
 * the attention mixer, the collapse with the previous site's pre
 * (single-pass mHC), projections, the K=V row into the window ring (its
 * format: cw_dsv41_rows.c), the KV source's group inputs and the group it
 * closes (before its own attention: a ratio-1 source's token sees its own
 * entry), the index source's selection (published for the layers up to
 * the next source; CSA2: cw_dsv41_csa2.c), attention, mHC post, the FFN
 * mixer, the collapse with the attention site's pre, MoE, mHC post.  Each
 * token reads only its own values and what earlier positions left in the
 * state, in a fixed order, so any split of a sequence into chunks gives
 * bit-identical values.
 */
#include "cw_dsv41_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_steptime.h"
#include "es_client.h"
#include "st_log.h"

/* V4.1's per-layer state and kvd scratch (cw_dsv_rev.state_init); kvd
 * stream indices in the order of cw_dsv_kv_decl. */
static int v41_state_init(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s, int max_tokens)
{
	const struct st_dsv_config *c = &m->cfg;
	const int hd = c->head_dim, W = c->sliding_window;
	int kvs = 0;

	if (s->q.kv) {
		size_t w = (size_t)(hd > c->index_head_dim ? hd :
			    c->index_head_dim);

		s->dec = malloc(((size_t)W + c->index_topk + 1) * w *
				sizeof(float));
		s->zero_row = calloc(2 * w, sizeof(float));
		if (!s->dec || !s->zero_row)
			return -ENOMEM;
	}
	for (int l = 0; l < c->n_layers; l++) {
		struct cw_dsv_lstate *ls = &s->ls[l];
		int mr = c->compress_ratio[l];

		ls->kvs[CW_DSV41_S_WINDOW] = kvs++;
		if (c->kv_source[l]) {
			if (mr > 1)
				ls->kvs[CW_DSV41_S_GROUP] = kvs++;
			ls->kvs[CW_DSV41_S_CROW] = kvs++;
			ls->kvs[CW_DSV41_S_IKEY] = kvs++;
		}
		if (s->q.kv) {
			/* scratch for a ratio-1 source's group input */
			if (c->kv_source[l] &&
			    !(ls->grp = malloc((size_t)2 * hd * sizeof(float))))
				return -ENOMEM;
			continue;
		}
		/* rings with CW_DSV_ROLLBACK_MAX rows of slack
		 * (cw_dsv_state_truncate) */
		ls->kv = malloc(((size_t)W + CW_DSV_ROLLBACK_MAX) * hd *
				sizeof(float));
		if (!ls->kv)
			return -ENOMEM;
		if (!c->kv_source[l])
			continue;
		ls->grp = malloc(((size_t)mr + CW_DSV_ROLLBACK_MAX) * 2 * hd *
				 sizeof(float));
		ls->crow = malloc(((size_t)max_tokens / mr + 1) * hd *
				  sizeof(float));
		ls->ikey = malloc(((size_t)max_tokens / mr + 1) *
				  c->index_head_dim * sizeof(float));
		if (!ls->grp || !ls->crow || !ls->ikey)
			return -ENOMEM;
	}
	return 0;
}

/* Attention sublayer of layer l for token t at position p (a =
 * attn_norm(u)); writes the K=V row and the KV source's entries into the
 * state; out [D]. */
static int attention(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		     int l, const float *a, int64_t p, int t,
		     struct cw_dsv_chunk *ck, float *out)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	struct cw_dsv_lstate *ls = &s->ls[l];
	const int H = c->n_heads, hd = c->head_dim, W = c->sliding_window;
	int64_t lo = p - W + 1 > ls->win_lo ? p - W + 1 : ls->win_lo;
	float qr[c->q_lora_rank], q[H * hd];
	int r = 0, n_sel = 0;
	const int *sel = NULL;

	cw_dsv_attn_query(m, L, p, a, qr, q);
	{
		float kb[hd];
		float *kv = cw_dsv41_row_begin(m, s, l, CW_DSV41_S_WINDOW, p, kb);

		cw_dsv_attn_kv(m, L, p, a, kv);
		r = cw_dsv41_row_end(m, s, l, CW_DSV41_S_WINDOW, p, kv);
	}
	if (r == 0 && c->kv_source[l] && !ck->replay)
		r = cw_dsv41_kv_source(m, s, l, a, p);
	if (r == 0 && c->index_source[l])
		r = cw_dsv41_index_source(m, s, l, a, qr, p, t, ck);
	if (r < 0)
		return r;
	if (L->ratio) {
		int x = ck->isx[L->idx_src];

		sel = ck->sel + ((size_t)x * ck->n + t) * c->index_topk;
		n_sel = ck->nsel[(size_t)x * ck->n + t];
	}
	{
		const float *rows[W + n_sel + 1];
		int nr = 0;

		/* decoded (kvd) rows go to s->dec, one slot each */
		for (int64_t j = lo; j <= p; j++, nr++)
			rows[nr] = cw_dsv41_row_get(m, s, l, CW_DSV41_S_WINDOW, j,
					   s->dec ? s->dec + (size_t)nr * hd :
						    NULL);
		for (int j = 0; j < n_sel; j++, nr++)
			rows[nr] = cw_dsv41_row_get(m, s, L->kv_src, CW_DSV41_S_CROW,
					   sel[j], s->dec ? s->dec +
						   (size_t)nr * hd : NULL);
		cw_dsv_attn_out(m, L, p, q, rows, nr, out);
	}
	return 0;
}

/* Store mode, at the start of an eval: the token at position s->len is
 * known (sampled, or the next prompt token) before its layer 0 runs.  The
 * experts the first max(1, prefetch_depth) layers' routers pick on its
 * embedding under each layer's ffn_norm (a guess: the FFN input also
 * carries the attention output and, past layer 0, the earlier layers'
 * work) go to expertd at once as a step-named hint (es_client_hint_step)
 * so their reads start before layer 0 and are not dropped as stale after
 * the previous token's last layer.  A refused hint changes no result:
 * warned once, counted. */
static void step_hint(const struct cw_dsv_model *m,
		      struct cw_dsv_state *s, int32_t token)
{
	const struct st_dsv_config *c = &m->cfg;
	const int K = c->top_k, D = c->hidden_size;
	int nl = m->prefetch_depth > 1 ? m->prefetch_depth : 1;
	int cap, nh = 0;
	struct st_diag d = { { 0 } };

	if (nl > c->n_layers)
		nl = c->n_layers;
	cap = nl * K;
	{
		int hl[cap], he[cap];
		float b[D];

		for (int j = 0; j < nl; j++) {
			int32_t e[K];
			float w[K];

			cw_dsv_rmsnorm(m->embed + (size_t)token * D,
					m->layers[j].ffn_norm, D,
					c->rms_norm_eps, b);
			cw_dsv_route(m, j, b, NULL, e, w);
			for (int k = 0; k < K; k++) {
				hl[nh] = j;
				he[nh++] = e[k];
			}
		}
		if (es_client_hint_step(m->es, (uint32_t)s->len, nh, hl, he,
					&d) < 0 &&
		    s->run.route_failed++ == 0)
			st_warn("prefetch hint to expertd failed: %s (prefetch "
				"degrades; results are unaffected)", d.msg);
	}
}

/* One layer for one token: Engram, attention site, FFN site. */
static int layer_token(const struct cw_dsv_model *m,
		       struct cw_dsv_state *s, int l, int t,
		       struct cw_dsv_chunk *ck, struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int D = c->hidden_size, hc = c->hc_mult;
	const int64_t p = ck->p0 + t;
	float *X = ck->X + (size_t)t * hc * D, *P = ck->P + (size_t)t * hc;
	float pre_a[hc], post_a[hc], comb_a[hc * hc];
	float pre_f[hc], post_f[hc], comb_f[hc * hc];
	float u[D], a[D], y[D];
	struct cw_dsv_debug *dbg = s->dbg && t < s->dbg->max_tokens ?
					     s->dbg : NULL;
	size_t dl = (size_t)t * c->n_layers + l;
	int r;

	cw_steptime_phase(s->tl, CW_PHASE_DENSE);
	if (m->es && !m->no_route_reports && !m->no_layer_hints &&
	    ck->n == 1 && l > 0) {
		/* the streams as they enter the layer, collapsed with the
		 * lagged pre P (a guess: the FFN input adds the layer's
		 * Engram and attention output) */
		cw_dsv_collapse(X, P, hc, D, u);
		cw_dsv_layer_hint(m, &s->run, l, p, u);
	}
	if (L->ei >= 0 && (r = cw_dsv41_engram(m, s, L, p, X, t, diag)) < 0)
		return r;
	/* collapsed with the previous site's pre (the lag) */
	cw_dsv41_hc_site(X, hc, D, P, L->hc_attn_fn, L->hc_attn_base,
			 L->hc_attn_scale, c->hc_sinkhorn_iters, c->hc_eps,
			 c->rms_norm_eps, u, pre_a, post_a, comb_a);
	cw_dsv_rmsnorm(u, L->attn_norm, D, c->rms_norm_eps, a);
	r = attention(m, s, l, a, p, t, ck, y);
	if (r < 0)
		return st_diag_set(diag, r, "layer %d position %lld: QAT row width not a multiple of its block",
				   l, (long long)p);
	cw_dsv_hc_post(X, hc, D, y, post_a, comb_a);
	cw_dsv41_hc_site(X, hc, D, pre_a, L->hc_ffn_fn, L->hc_ffn_base,
			 L->hc_ffn_scale, c->hc_sinkhorn_iters, c->hc_eps,
			 c->rms_norm_eps, u, pre_f, post_f, comb_f);
	cw_dsv_rmsnorm(u, L->ffn_norm, D, c->rms_norm_eps, a);
	cw_steptime_phase(s->tl, CW_PHASE_EXPERTS);
	/* token 0: V4.1 routes no layer by token id */
	r = cw_dsv_moe(m, &s->run, l, p, 0, a, y,
		       dbg && dbg->experts ? dbg->experts + dl * c->top_k :
					     NULL,
		       dbg && dbg->weights ? dbg->weights + dl * c->top_k :
					     NULL,
		       diag);
	cw_steptime_phase(s->tl, CW_PHASE_DENSE);
	if (r < 0)
		return r;
	cw_dsv_hc_post(X, hc, D, y, post_f, comb_f);
	memcpy(P, pre_f, sizeof(pre_f));
	if (dbg && dbg->selected && c->index_source[l]) {
		const int *sel = ck->sel + ((size_t)ck->isx[l] * ck->n + t) *
						   c->index_topk;
		int ns = ck->nsel[(size_t)ck->isx[l] * ck->n + t];

		for (int j = 0; j < c->index_topk; j++)
			dbg->selected[dl * c->index_topk + j] =
				j < ns ? sel[j] : -1;
	}
	if (dbg && dbg->cand_blocks && l == c->candidate_source)
		for (int j = 0; j < c->candidate_topk_blocks; j++)
			dbg->cand_blocks[(size_t)t * c->candidate_topk_blocks + j] =
				j < ck->ncand[t] ?
					ck->cand[(size_t)t * c->candidate_topk_blocks + j] :
					-1;
	return 0;
}

static void head(const struct cw_dsv_model *m, const float *X,
		 const float *P, float *logits)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size;
	float h[D];

	/* no hc_head: the last FFN site's pre collapses the streams */
	cw_dsv_collapse(X, P, c->hc_mult, D, h);
	cw_dsv_rmsnorm(h, m->norm, D, c->rms_norm_eps, h);
	cw_dsv_lin(m, &m->head, h, logits);
}

/* Store mode, before the layers run (cw_dsv_rev.before_eval): the Engram
 * prefetch of the chunk's positions, then the step hint of its first
 * token. */
static void v41_before_eval(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, const int32_t *ids, int n)
{
	cw_dsv41_engram_prefetch(m, s, s->len, n);
	if (m->es && !m->no_route_reports && !m->no_step_hints)
		step_hint(m, s, ids[0]);
}

const struct cw_dsv_rev cw_dsv41_rev = {
	.state_init = v41_state_init,
	.before_eval = v41_before_eval,
	.layer_token = layer_token,
	.head = head,
};

