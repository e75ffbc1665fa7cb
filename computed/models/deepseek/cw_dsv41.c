/*
 * cw_dsv41.c — DeepSeek-V4.1's layer (cw_dsv_state.h: struct cw_dsv_rev;
 * the loop over layers and tokens, the CED shortcut and SWA replay:
 * cw_dsv_eval.c).  Formulas: MODEL_FAMILY_DEEPSEEK_V4.md 3.3-3.6 (HF
 * modeling_deepseek_v41.py, cache path); the tiny-deepseek-v41 README.
 *
 * One token through one layer: Engram (its layers), the attention mixer, the collapse
 * with the previous site's pre, projections, the K=V row into the window
 * ring, the KV source's group inputs and the group it closes (before its
 * own attention: a ratio-1 source's token sees its own entry), the index
 * source's selection (published for the layers up to the next source),
 * attention, mHC post, the FFN mixer, the collapse with the attention
 * site's pre, MoE, mHC post.  Each token reads only its own values and
 * what earlier positions left in the state, in a fixed order, so any
 * split of a sequence into chunks gives bit-identical values.
 */
#include "cw_dsv_state.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_client.h"
#include "cw_engram_es.h"
#include "cw_steptime.h"
#include "es_client.h"
#include "st_kvfmt_v41.h"
#include "st_log.h"

/* The reference loop: the router and the indexer's head weights stay
 * reference code in both modes (routing and selections as reference
 * mode's but near ties). */
static void matvec(const struct cw_dsv_mat *m, const float *x, float *y)
{
	cw_dsv_mat_mv(NULL, m, x, y);
}

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
		ls->kv = malloc((size_t)W * hd * sizeof(float));
		if (!ls->kv)
			return -ENOMEM;
		if (!c->kv_source[l])
			continue;
		ls->grp = malloc((size_t)mr * 2 * hd * sizeof(float));
		ls->crow = malloc(((size_t)max_tokens / mr + 1) * hd *
				  sizeof(float));
		ls->ikey = malloc(((size_t)max_tokens / mr + 1) *
				  c->index_head_dim * sizeof(float));
		if (!ls->grp || !ls->crow || !ls->ikey)
			return -ENOMEM;
	}
	return 0;
}

/*
 * Row access.  The forward reads and writes every row of the state through
 * these, so the process-local and the kvd state run the same code.  In
 * kvd, a row lives in the sequence's page row (row p of a per-token stream
 * is position p's; of a pooled one, group p), stored in the V4.1 format of
 * its stream when its QAT flag is on (st_kvfmt_v41.h: encoded bytes,
 * decoded on read; decode(encode(x)) is the QAT round trip the
 * process-local state applies, so both give the same bits) and as F32
 * otherwise.  A row kvd does not map sets row_missing and reads zeros: the
 * eval then fails.
 */
/* A kvd state's window row of position r is in the replay rings. */
static int in_ov(const struct cw_dsv_state *s, int64_t r)
{
	return r >= s->ov_lo && r < s->ov_hi;
}

static uint8_t *prow(struct cw_dsv_state *s, int l, int kind, int64_t r,
		     int write)
{
	int st = s->ls[l].kvs[kind];
	uint8_t *p = write ? kv_client_row_writable(s->q.kv, s->q.seq, st,
						    (uint32_t)r) :
			     kv_client_row(s->q.kv, s->q.seq, st, (uint32_t)r);

	if (!p)
		s->q.row_missing = 1;
	return p;
}

/* The QAT flag of a stream kind (0: stored as F32). */
static unsigned kind_qat(int kind)
{
	return kind == CW_DSV41_S_WINDOW ? CW_DSV41_QAT_WINDOW_FP8 :
	       kind == CW_DSV41_S_CROW   ? CW_DSV41_QAT_CROW_FP4 :
	       kind == CW_DSV41_S_IKEY   ? CW_DSV41_QAT_INDEX_FP4 : 0;
}

/* Encodes/rounds row x (n elements) of `kind` in its QAT format:
 * in place (process-local) or into the page bytes `out`. */
static int qat_store(int kind, float *x, size_t n, uint8_t *out)
{
	switch (kind) {
	case CW_DSV41_S_WINDOW:
		return out ? st_kv41_fp8_encode(x, n, out, out + n) :
			     st_kv41_fp8_roundtrip(x, n);
	case CW_DSV41_S_CROW:
		return out ? st_kv41_crow_encode(x, n, out, out + n / 2) :
			     st_kv41_crow_roundtrip(x, n);
	default:
		return out ? st_kv41_idx_encode(x, n, out, out + n / 2) :
			     st_kv41_idx_roundtrip(x, n);
	}
}

static int kind_elems(const struct st_dsv_config *c, int kind)
{
	return kind == CW_DSV41_S_IKEY ? c->index_head_dim : c->head_dim;
}

/* Where row r of `kind` of layer l is to be computed: the array row
 * (process-local; the window ring at r mod W), the replay ring (kvd,
 * window rows of a replayed prefix), or `scratch` (kvd). */
static float *row_begin(const struct cw_dsv_model *m,
			struct cw_dsv_state *s, int l, int kind, int64_t r,
			float *scratch)
{
	const struct st_dsv_config *c = &m->cfg;
	struct cw_dsv_lstate *ls = &s->ls[l];

	if (kind == CW_DSV41_S_WINDOW && (!s->q.kv || in_ov(s, r)))
		return ls->kv + (size_t)(r % c->sliding_window) * c->head_dim;
	if (s->q.kv)
		return scratch;
	return (kind == CW_DSV41_S_CROW ? ls->crow : ls->ikey) +
	       (size_t)r * kind_elems(c, kind);
}

/* Stores row r computed at x (from row_begin): applies the stream's QAT
 * (in place when process-local) or writes the page row in its format.
 * 0, or -EINVAL (width not a multiple of the format's block). */
static int row_end(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		   int l, int kind, int64_t r, float *x)
{
	const size_t n = (size_t)kind_elems(&m->cfg, kind);
	const int q = (s->q.kv ? s->qat : m->qat) & kind_qat(kind);
	uint8_t *p;

	if (!s->q.kv || (kind == CW_DSV41_S_WINDOW && in_ov(s, r)))
		return q ? qat_store(kind, x, n, NULL) : 0;
	p = prow(s, l, kind, r, 1);
	if (!p)
		return 0;
	if (q)
		return qat_store(kind, x, n, p);
	memcpy(p, x, n * sizeof(float));
	return 0;
}

/* Row r of `kind` of layer l for reading: the array row, or the page row
 * (F32 in place, or decoded into buf). */
static const float *row_get(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, int l, int kind,
			    int64_t r, float *buf)
{
	const struct st_dsv_config *c = &m->cfg;
	const size_t n = (size_t)kind_elems(c, kind);
	const uint8_t *p;
	int rc = 0;

	if (!s->q.kv || (kind == CW_DSV41_S_WINDOW && in_ov(s, r)))
		return row_begin(m, s, l, kind, r, NULL);
	p = prow(s, l, kind, r, 0);
	if (!p)
		return s->zero_row;
	if (!(s->qat & kind_qat(kind)))
		return (const float *)(const void *)p;
	switch (kind) {
	case CW_DSV41_S_WINDOW:
		rc = st_kv41_fp8_decode(p, p + n, n, buf);
		break;
	case CW_DSV41_S_CROW:
		rc = st_kv41_crow_decode(p, p + n / 2, n, buf);
		break;
	default:
		rc = st_kv41_idx_decode(p, p + n / 2, n, buf);
	}
	if (rc < 0) { /* widths were checked by the encode: a bug */
		s->q.row_missing = 1;
		return s->zero_row;
	}
	return buf;
}

/* The group-input slot of position p of KV source l (2 hd floats):
 * process-local ring, or the page row (ratio > 1) / scratch (ratio 1). */
static float *grp_slot(const struct cw_dsv_model *m,
		       struct cw_dsv_state *s, int l, int64_t p, int write)
{
	struct cw_dsv_lstate *ls = &s->ls[l];
	const int mr = m->layers[l].ratio;
	uint8_t *q;

	if (!s->q.kv)
		return ls->grp + (size_t)(p % mr) * 2 * m->cfg.head_dim;
	if (mr == 1)
		return ls->grp;
	q = prow(s, l, CW_DSV41_S_GROUP, p, write);
	return q ? (float *)(void *)q : s->zero_row;
}

/* Engram before layer L's mixer: X (one token's hc x D streams) += gate
 * per stream times the value read from the table rows of the n-grams
 * ending at p. */
static int engram(const struct cw_dsv_model *m, struct cw_dsv_state *s,
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

/* KV source: stores the token's group inputs and, when it closes group
 * g, appends the group's compressed row and index key (pooled, normed;
 * index key k_norm(wk latent), both roped at g m, with their QAT). */
static int kv_source(const struct cw_dsv_model *m,
		     struct cw_dsv_state *s, int l, const float *a,
		     int64_t p)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int hd = c->head_dim, Id = c->index_head_dim, mr = L->ratio;
	float lat[hd], *slot = grp_slot(m, s, l, p, 1), sk[Id], sr[hd];
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
			cs[i] = grp_slot(m, s, l, g * mr + i, 0);
			zs[i] = cs[i] + hd;
		}
		cw_dsv_pool(cs, zs, mr, hd, lat);
	} else {
		memcpy(lat, slot, sizeof(lat));
	}
	cw_dsv_rmsnorm(lat, L->cnorm, hd, c->rms_norm_eps, lat);
	{
		float *k = row_begin(m, s, l, CW_DSV41_S_IKEY, g, sk);

		/* from the pre-rope latent */
		cw_dsv_lin(m, &L->iwk, lat, k);
		cw_dsv_rmsnorm(k, L->iknorm, Id, c->rms_norm_eps, k);
		cw_dsv_rope(k, Id, c->rope_dim / 2, m->freq_comp, g * mr, 0);
		r = row_end(m, s, l, CW_DSV41_S_IKEY, g, k);
	}
	{
		float *row = row_begin(m, s, l, CW_DSV41_S_CROW, g, sr);

		memcpy(row, lat, sizeof(lat));
		cw_dsv_rope(row, hd, c->rope_dim / 2, m->freq_comp, g * mr, 0);
		if (r == 0)
			r = row_end(m, s, l, CW_DSV41_S_CROW, g, row);
	}
	return r;
}

/* Index source at layer l for token t (position p): scores of the
 * visible entries of its KV source's keys, the candidate blocks (the
 * candidate source) or the candidate mask (later index sources), and
 * the top-k, into ck->sel / nsel. */
static int index_source(const struct cw_dsv_model *m,
			struct cw_dsv_state *s, int l,
			const float *a, const float *qr, int64_t p, int t,
			struct cw_dsv_chunk *ck)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int IH = c->index_n_heads, Id = c->index_head_dim;
	const int nv = cw_dsv41_n_visible(p, L->ratio);
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
	matvec(&L->iweights, a, om);
	for (int e = 0; e < nv; e++) {
		const float *k = row_get(m, s, L->kv_src, CW_DSV41_S_IKEY, e,
					 kb);
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
		float *kv = row_begin(m, s, l, CW_DSV41_S_WINDOW, p, kb);

		cw_dsv_attn_kv(m, L, p, a, kv);
		r = row_end(m, s, l, CW_DSV41_S_WINDOW, p, kv);
	}
	if (r == 0 && c->kv_source[l] && !ck->replay)
		r = kv_source(m, s, l, a, p);
	if (r == 0 && c->index_source[l])
		r = index_source(m, s, l, a, qr, p, t, ck);
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
			rows[nr] = row_get(m, s, l, CW_DSV41_S_WINDOW, j,
					   s->dec ? s->dec + (size_t)nr * hd :
						    NULL);
		for (int j = 0; j < n_sel; j++, nr++)
			rows[nr] = row_get(m, s, L->kv_src, CW_DSV41_S_CROW,
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
	if (L->ei >= 0 && (r = engram(m, s, L, p, X, t, diag)) < 0)
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
	if (dbg && dbg->stream_rms) {
		double ss = 0.0;

		for (int i = 0; i < hc * D; i++)
			ss += (double)X[i] * X[i];
		dbg->stream_rms[dl] = (float)sqrt(ss / (hc * D));
	}
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

/* Store mode: asks expertd for the Engram rows of positions p0 ..
 * p0 + n - 1 of every Engram layer as soon as their tokens are known (the
 * hash reads token ids only), so that the layers' fetches find them
 * cached or in flight.  A hint: a refusal is warned once and counted. */
static void engram_prefetch(const struct cw_dsv_model *m,
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

/* Store mode, before the layers run (cw_dsv_rev.before_eval): the Engram
 * prefetch of the chunk's positions, then the step hint of its first
 * token. */
static void v41_before_eval(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, const int32_t *ids, int n)
{
	engram_prefetch(m, s, s->len, n);
	if (m->es && !m->no_route_reports && !m->no_step_hints)
		step_hint(m, s, ids[0]);
}

const struct cw_dsv_rev cw_dsv41_rev = {
	.state_init = v41_state_init,
	.before_eval = v41_before_eval,
	.layer_token = layer_token,
	.head = head,
};

