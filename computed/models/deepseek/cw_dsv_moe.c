/*
 * cw_dsv_moe.c — the FFN site of the DeepSeek-V4 family, one for every
 * revision (cw_dsv_int.h): the router (sqrt-softplus, bias, top-k; V4's
 * hash layers by token id, V4.1's logits over gate_temp), the shared and
 * routed experts with clipped SwiGLU (MODEL_FAMILY_DEEPSEEK_V4.md 2.5.4,
 * 3.3), from memory or from expertd's pool (store mode: routing reports
 * with look-ahead hints, each expert computed as its slot becomes ready),
 * in reference or fast mode; and the byte counts of the dense weights.
 * What a revision does differently is a switch on cfg.revision: the FP8
 * activation round trip's flag (CW_DSV4_QAT_ACT_FP8, CW_DSV41_QAT_ACT_FP8),
 * V4.1's threads and the quantized SwiGLU output of its fast experts.
 */
#include "cw_dsv_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "es_client.h"
#include "st_log.h"
#include "st_util.h"

void cw_dsv_route(const struct cw_dsv_model *m, int l, const float *b,
		  const int32_t *hash_ids, int32_t *ids, float *wts)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	float logits[c->n_experts];

	/* the reference loop in both modes: routing as reference mode's
	 * but near ties */
	cw_dsv_mat_mv(NULL, &L->gate, b, logits);
	if (c->revision == ST_DSV_REV_V41)
		for (int e = 0; e < c->n_experts; e++)
			logits[e] = (float)(logits[e] / c->gate_temp);
	cw_dsv_route_topk(logits, c->n_experts, c->top_k, hash_ids, L->gate_bias,
		      c->norm_topk_prob, c->routed_scaling_factor, ids, wts);
}

/* With the activation trip on (cw_dsv_act_fp8), a routed expert's
 * SwiGLU output is multiplied by its routing weight w *before* w2's input
 * trip, as the official Expert.forward does (x = weights * x, then
 * self.w2(x): inference/model.py, index file id 70831076062), and the
 * caller adds the output unweighted; in exact math the caller weights
 * the output (the order of the strict references). */
static void pre_weight(const struct cw_dsv_model *m, float *g, int n, float w)
{
	if (!cw_dsv_act_fp8(m))
		return;
	for (int i = 0; i < n; i++)
		g[i] *= w;
}

/* The weight the caller multiplies expert k's output by. */
static float post_weight(const struct cw_dsv_model *m, float w)
{
	return cw_dsv_act_fp8(m) ? 1.0f : w;
}

/* y = E(x) of one expert (w: its routing weight, 1 for the shared
 * expert; applied before w2 with the activation trip, see pre_weight). */
static void expert_ffn(const struct cw_dsv_model *m,
		       const struct cw_dsv_mat *w1,
		       const struct cw_dsv_mat *w2,
		       const struct cw_dsv_mat *w3, float w, const float *x,
		       float *y)
{
	float g[w1->rows], u[w3->rows];

	cw_dsv_lin(m, w1, x, g);
	cw_dsv_lin(m, w3, x, u);
	cw_dsv_swiglu_clip(g, u, w1->rows, m->cfg.swiglu_limit);
	pre_weight(m, g, w1->rows, w);
	cw_dsv_lin(m, w2, g, y);
}

/* One routed expert in fast mode, straight from its slot bytes: out =
 * E(b) (act: b quantized once, int8 per 32, shared by every expert's w1
 * and w3; w its routing weight, see pre_weight).  With the activation
 * trip the SwiGLU output is weighted and takes the FP8 trip; then V4: the
 * float output times w2; V4.1: quantized in gbuf, the rows split over
 * the model's threads. */
static void expert_fast(const struct cw_dsv_model *m,
			const struct st_store_layer *ly, const uint8_t *rec,
			const struct cw_act *act, float w, void *gbuf,
			float *out)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_backend_ops *be = m->be;
	const int D = c->hidden_size, I = c->moe_inter;
	struct cw_wview w1 = cw_dsv_rec_view(&ly->mat[ST_EXPERT_GATE], rec);
	struct cw_wview w3 = cw_dsv_rec_view(&ly->mat[ST_EXPERT_UP], rec);
	struct cw_wview w2 = cw_dsv_rec_view(&ly->mat[ST_EXPERT_DOWN], rec);
	float g[I], u[I];
	struct cw_act ga;

	if (c->revision == ST_DSV_REV_V41) {
		cw_dsv_view_mv(be, m->pool, &w1, act, g);
		cw_dsv_view_mv(be, m->pool, &w3, act, u);
		cw_dsv_swiglu_clip(g, u, I, c->swiglu_limit);
		if (cw_dsv_act_fp8(m)) {
			pre_weight(m, g, I, w);
			cw_dsv_fp8_roundtrip(g, I, c->fp8_block[1]);
		}
		be->act_prepare(g, I, ST_DTYPE_MXFP4, gbuf, &ga);
		cw_dsv_view_mv(be, m->pool, &w2, &ga, out);
		return;
	}
	be->matvec_act(&w1, act, g, 0, I);
	be->matvec_act(&w3, act, u, 0, I);
	cw_dsv_swiglu_clip(g, u, I, c->swiglu_limit);
	if (cw_dsv_act_fp8(m)) {
		pre_weight(m, g, I, w);
		cw_dsv_fp8_roundtrip(g, I, c->fp8_block[1]);
	}
	be->matvec(&w2, g, out, 0, D);
}

/* The MoE step of one token in store mode, computed per expert as its
 * slot becomes ready (es_client_acquire_each): the shared expert while
 * the misses load, each routed expert k into its own row out[k][D]; the
 * caller sums the rows in the fixed order k = 0..K-1, so the result does
 * not depend on the order of arrival. */
struct moe_each {
	const struct cw_dsv_model *m;
	struct cw_dsv_run *run;
	const struct cw_dsv_layer *L;
	const struct st_store_layer *ly;
	const float *b;
	const float *wts;           /* [K] routing weights */
	const struct cw_act *act;   /* fast mode: b quantized */
	float *y;                   /* shared expert's output */
	float *out;                 /* [K][D] routed experts' outputs */
	uint64_t fn_ns;             /* time spent computing in the calls */
};

static void moe_each_fn(void *arg, int k, const uint8_t *rec)
{
	struct moe_each *e = arg;
	const struct cw_dsv_model *m = e->m;
	const int D = m->cfg.hidden_size;
	const size_t mw = (size_t)m->cfg.moe_inter * D;
	float *xw = e->run->xw;
	uint64_t t0 = st_now_ns();

	if (k < 0) {
		expert_ffn(m, &e->L->sh_w1, &e->L->sh_w2, &e->L->sh_w3, 1.0f,
			   e->b, e->y);
	} else if (m->be) {
		expert_fast(m, e->ly, rec, e->act, e->wts[k], e->run->xw2,
			    e->out + (size_t)k * D);
	} else {
		struct cw_dsv_mat w1, w2, w3;

		cw_dsv_record_mat(&e->ly->mat[ST_EXPERT_GATE], rec, xw, &w1);
		cw_dsv_record_mat(&e->ly->mat[ST_EXPERT_UP], rec, xw + mw,
				   &w3);
		cw_dsv_record_mat(&e->ly->mat[ST_EXPERT_DOWN], rec,
				   xw + 2 * mw, &w2);
		expert_ffn(m, &w1, &w2, &w3, e->wts[k], e->b,
			   e->out + (size_t)k * D);
	}
	e->fn_ns += st_now_ns() - t0;
}

/* Store mode: reports layer l's routing of the token at position p to
 * expertd (activation statistics, hot set) with, as hints, the experts
 * of every later V4 hash layer (exact, from the token id) and those the
 * routers of the next prefetch_depth score-routed layers pick on this
 * layer's FFN input b (gate look-ahead: an approximation, the next layers
 * see a changed residual).  A refused report changes no result: warned
 * once, counted. */
static void route_report(const struct cw_dsv_model *m, struct cw_dsv_run *run,
			 int l, int64_t p, int32_t token, const int *eids,
			 const float *b)
{
	const struct st_dsv_config *c = &m->cfg;
	const int K = c->top_k;
	int n_later = c->n_hash_layers > l + 1 ? c->n_hash_layers - l - 1 : 0;
	int cap = (n_later + m->prefetch_depth) * K + 1;
	int hl[cap], he[cap], nh = 0;
	struct st_diag d = { { 0 } };

	for (int j = l + 1; j < c->n_hash_layers; j++) {
		int32_t e[K];
		int n = cw_dsv4_hash_experts(m, j, token, e);

		for (int k = 0; k < n; k++) {
			hl[nh] = j;
			he[nh++] = e[k];
		}
	}
	for (int j = l + 1; j <= l + m->prefetch_depth && j < c->n_layers;
	     j++) {
		int32_t e[K];
		float w[K];

		if (m->layers[j].tid2eid)
			continue; /* hash layer: hinted exactly above */
		cw_dsv_route(m, j, b, NULL, e, w);
		for (int k = 0; k < K; k++) {
			hl[nh] = j;
			he[nh++] = e[k];
		}
	}
	if (es_client_route(m->es, l, (uint32_t)p, 1, K, eids, nh, hl, he,
			    &d) < 0 && run->route_failed++ == 0)
		st_warn("routing report to expertd failed: %s (statistics and "
			"prefetch degrade; results are unaffected)", d.msg);
}

/* Store mode: the shared expert into y and the routed experts ids[0..K)
 * of layer l through expertd's pool (reported; each computed as soon as
 * its slot is ready, or all acquired first with expert overlap off;
 * released after use), weighted into y in the order k = 0..K-1. */
static int moe_pool(const struct cw_dsv_model *m, struct cw_dsv_run *run,
		    int l, int64_t p, int32_t token, const int32_t *ids,
		    const float *wts, const float *b, float *y,
		    struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const int K = c->top_k, D = c->hidden_size;
	const struct st_store_layer *ly = &m->rec[l];
	struct moe_each e = { m, run, &m->layers[l], ly, b, wts, NULL, y, NULL,
			      0 };
	struct cw_act act;
	float bq[D];
	int eids[K], r;
	uint64_t t0;

	for (int k = 0; k < K; k++)
		eids[k] = ids[k];
	if (!m->no_route_reports)
		route_report(m, run, l, p, token, eids, b);
	e.out = malloc((size_t)K * D * sizeof(float));
	if (!e.out)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	if (m->be) {
		const float *x = b;

		if (cw_dsv_act_fp8(m)) {
			memcpy(bq, b, sizeof(bq));
			cw_dsv_fp8_roundtrip(bq, D, c->fp8_block[1]);
			x = bq;
		}
		m->be->act_prepare(x, D, ST_DTYPE_MXFP4,
				   (unsigned char *)run->xw, &act);
		e.act = &act;
	}
	if (m->no_expert_overlap) {
		/* all top-k first, then compute (the shared expert before) */
		const uint8_t *recs[K];

		moe_each_fn(&e, -1, NULL);
		t0 = st_now_ns();
		r = es_client_acquire(m->es, l, K, eids, recs, diag);
		run->st.acquire_ns += st_now_ns() - t0;
		for (int k = 0; r == 0 && k < K; k++)
			moe_each_fn(&e, k, recs[k]);
	} else {
		t0 = st_now_ns();
		r = es_client_acquire_each(m->es, l, K, eids, moe_each_fn, &e,
					   diag);
		run->st.acquire_ns += st_now_ns() - t0 - e.fn_ns;
	}
	if (r < 0) {
		free(e.out);
		return r;
	}
	run->st.experts_acquired += K;
	run->st.expert_bytes += (uint64_t)K * ly->record_bytes;
	es_client_release(m->es, l, K, eids);
	for (int k = 0; k < K; k++) {
		const float *o = e.out + (size_t)k * D;
		const float wk = post_weight(m, wts[k]);

		for (int d = 0; d < D; d++)
			y[d] += wk * o[d];
	}
	free(e.out);
	return 0;
}

int cw_dsv_moe(const struct cw_dsv_model *m, struct cw_dsv_run *run, int l,
	       int64_t p, int32_t token, const float *b, float *y,
	       int32_t *ids_out, float *w_out, struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L = &m->layers[l];
	const int D = c->hidden_size, K = c->top_k;
	float wts[K], tmp[D];
	int32_t ids[K];

	cw_dsv_route(m, l, b,
		     L->tid2eid ? L->tid2eid + (size_t)token * K : NULL, ids,
		     wts);
	if (m->es) { /* the shared expert while the misses load */
		int r;

		for (int k = 0; k < K; k++)
			if (ids[k] < 0 || ids[k] >= c->n_experts)
				return st_diag_set(diag, -EINVAL,
						   "expert id %d", ids[k]);
		r = moe_pool(m, run, l, p, token, ids, wts, b, y, diag);
		if (r < 0)
			return r;
	} else {
		expert_ffn(m, &L->sh_w1, &L->sh_w2, &L->sh_w3, 1.0f, b, y);
	}
	for (int k = 0; !m->es && k < K; k++) {
		const float wk = post_weight(m, wts[k]);

		expert_ffn(m, &L->ew1[ids[k]], &L->ew2[ids[k]],
			   &L->ew3[ids[k]], wts[k], b, tmp);
		for (int d = 0; d < D; d++)
			y[d] += wk * tmp[d];
	}
	if (ids_out)
		memcpy(ids_out, ids, sizeof(ids));
	if (w_out)
		memcpy(w_out, wts, sizeof(wts));
	return 0;
}

void cw_dsv_layer_hint(const struct cw_dsv_model *m, struct cw_dsv_run *run,
		       int l, int64_t p, const float *u)
{
	const struct st_dsv_config *c = &m->cfg;
	const int K = c->top_k, D = c->hidden_size;
	float b[D], w[K];
	int hl[K], he[K];
	int32_t e[K];
	struct st_diag d = { { 0 } };

	cw_dsv_rmsnorm(u, m->layers[l].ffn_norm, D, c->rms_norm_eps, b);
	cw_dsv_route(m, l, b, NULL, e, w);
	for (int k = 0; k < K; k++) {
		hl[k] = l;
		he[k] = e[k];
	}
	if (es_client_hint_step(m->es, (uint32_t)p, K, hl, he, &d) < 0 &&
	    run->route_failed++ == 0)
		st_warn("prefetch hint to expertd failed: %s (prefetch "
			"degrades; results are unaffected)", d.msg);
}

/* The largest act_bytes(n) of the backends a fast model may run on
 * (cw_dsv_set_backend may change it after a state is made). */
static size_t act_need(const struct cw_dsv_model *m, int n)
{
	size_t need = cw_backend_cpu_fast()->act_bytes(n);

	if (m->be->act_bytes(n) > need)
		need = m->be->act_bytes(n);
	return need ? need : 1;
}

int cw_dsv_run_init(const struct cw_dsv_model *m, struct cw_dsv_run *run)
{
	const struct st_dsv_config *c = &m->cfg;

	memset(run, 0, sizeof(*run));
	if (!m->es)
		return 0;
	if (!m->be) {
		run->xw = malloc((size_t)3 * c->moe_inter * c->hidden_size *
				 sizeof(float));
		return run->xw ? 0 : -ENOMEM;
	}
	run->xw = malloc(act_need(m, c->hidden_size));
	if (c->revision == ST_DSV_REV_V41)
		run->xw2 = malloc(act_need(m, c->moe_inter));
	if (!run->xw || (c->revision == ST_DSV_REV_V41 && !run->xw2))
		return -ENOMEM;
	return 0;
}

void cw_dsv_run_fini(struct cw_dsv_run *run)
{
	free(run->xw);
	free(run->xw2);
	run->xw = NULL;
	run->xw2 = NULL;
}

uint64_t cw_dsv_lm_head_bytes(const struct cw_dsv_model *m)
{
	return cw_dsv_mat_bytes(&m->head);
}

uint64_t cw_dsv_dense_bytes(const struct cw_dsv_model *m)
{
	uint64_t n = cw_dsv_mat_bytes(&m->head);

	for (int l = 0; l < m->cfg.n_layers; l++) {
		const struct cw_dsv_layer *L = &m->layers[l];
		const struct cw_dsv_mat *x[] = {
			&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
			&L->sh_w1, &L->sh_w2, &L->sh_w3, &L->gate,
			&L->iwq_b, &L->iweights,
			/* V4 */
			&L->comp.wkv, &L->comp.wgate, &L->icomp.wkv,
			&L->icomp.wgate,
			/* V4.1 */
			&L->cwkv, &L->cwgate, &L->iwk, &L->ewkv,
		};

		for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
			n += cw_dsv_mat_bytes(x[i]);
	}
	return n;
}
