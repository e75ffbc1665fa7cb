/*
 * cw_dsv4_load.c — DeepSeek-V4 weights from the official safetensors
 * layout (tensor names and formats: MODEL_FAMILY_DEEPSEEK_V4.md 2.3),
 * dequantised exactly to F32 (reference mode).
 */
#include "cw_dsv4_int.h"
#include "cw_dsv_tensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_client.h"
#include "st_formats.h"
#include "st_safetensors.h"
#include "st_store.h"

/* The loader: its tensor source (cw_dsv_tensors.h) and the config the
 * shapes come from. */
struct loader {
	struct cw_dsv_src s;
	const struct st_dsv4_config *c;
};

static int find(struct loader *ld, const char *name, enum st_dtype dt,
		int64_t d0, int64_t d1, const struct st_tensor_info **ret,
		const void **data)
{
	return cw_dsv_src_find(&ld->s, name, dt, d0, d1, ret, data);
}

static int load_plain(struct loader *ld, const char *name, int64_t d0,
		      int64_t d1, float **ret)
{
	return cw_dsv_src_plain(&ld->s, name, d0, d1, ret);
}

static int load_fmt(struct loader *ld, const char *fmt, int a, int b,
		    int64_t d0, int64_t d1, float **ret)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, a, b);
	return load_plain(ld, name, d0, d1, ret);
}

/* FP8 in the config's blocks (cw_dsv_src_fp8). */
static int load_fp8(struct loader *ld, const char *prefix, int rows, int cols,
		    struct cw_dsv4_mat *m)
{
	return cw_dsv_src_fp8(&ld->s, prefix, rows, cols, ld->c->fp8_block[0],
			      ld->c->fp8_block[1], m);
}

static int load_fp4(struct loader *ld, const char *prefix, int rows, int cols,
		    struct cw_dsv4_mat *m)
{
	return cw_dsv_src_mxfp4(&ld->s, prefix, rows, cols, m);
}

static int load_mat_plain(struct loader *ld, const char *name, int rows,
			  int cols, struct cw_dsv4_mat *m)
{
	return cw_dsv_src_mat_plain(&ld->s, name, rows, cols, m);
}

static int load_mat_fast16(struct loader *ld, const char *name, int rows,
			   int cols, struct cw_dsv4_mat *m)
{
	return cw_dsv_src_mat16(&ld->s, name, rows, cols, m);
}

static int load_comp(struct loader *ld, int l, const char *pfx, int ratio,
		     int width, struct cw_dsv4_comp *cp)
{
	const int D = ld->c->hidden_size;
	int cols = ratio == 4 ? 2 * width : width;
	char name[256];
	int r;

	cp->ratio = ratio;
	cp->overlap = ratio == 4;
	cp->width = width;
	snprintf(name, sizeof(name), "layers.%d.%s.wkv.weight", l, pfx);
	if ((r = load_mat_fast16(ld, name, cols, D, &cp->wkv)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%d.%s.wgate.weight", l, pfx);
	if ((r = load_mat_fast16(ld, name, cols, D, &cp->wgate)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%d.%s.ape", l, pfx);
	if ((r = load_plain(ld, name, ratio, cols, &cp->ape)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%d.%s.norm.weight", l, pfx);
	return load_plain(ld, name, width, -1, &cp->norm);
}

static int load_tid2eid(struct loader *ld, int l, struct cw_dsv4_layer *L)
{
	const struct st_dsv4_config *c = ld->c;
	const struct st_tensor_info *t;
	const uint8_t *d;
	char name[128];
	size_t n = (size_t)c->vocab_size * c->top_k;
	int r;

	snprintf(name, sizeof(name), "layers.%d.ffn.gate.tid2eid", l);
	if ((r = find(ld, name, ST_DTYPE_I64, c->vocab_size, c->top_k, &t,
		      (const void **)&d)) < 0)
		return r;
	L->tid2eid = malloc(n * sizeof(int32_t));
	if (!L->tid2eid)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		int64_t v;

		memcpy(&v, d + 8 * i, 8);
		if (v < 0 || v >= c->n_experts)
			return st_diag_set(ld->s.diag, -ST_E_FORMAT,
					   "%s: entry [%zu][%zu] = %lld is not an expert id in [0, %d)",
					   name, i / c->top_k, i % c->top_k,
					   (long long)v, c->n_experts);
		L->tid2eid[i] = (int32_t)v;
	}
	return 0;
}

static int load_layer(struct loader *ld, int l, struct cw_dsv4_layer *L)
{
	const struct st_dsv4_config *c = ld->c;
	const int D = c->hidden_size, hc = c->hc_mult, E = c->n_experts;
	const int nmu = (2 + hc) * hc, H = c->n_heads, hd = c->head_dim;
	const int G = c->o_groups;
	char p[256];
	int r;

	L->ratio = c->compress_ratio[l];
	if ((r = load_fmt(ld, "layers.%d.attn_norm.weight", l, 0, D, -1,
			  &L->attn_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.ffn_norm.weight", l, 0, D, -1,
			  &L->ffn_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_fn", l, 0, nmu, hc * D,
			  &L->hc_attn_fn)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_base", l, 0, nmu, -1,
			  &L->hc_attn_base)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_scale", l, 0, 3, -1,
			  &L->hc_attn_scale)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_fn", l, 0, nmu, hc * D,
			  &L->hc_ffn_fn)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_base", l, 0, nmu, -1,
			  &L->hc_ffn_base)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_scale", l, 0, 3, -1,
			  &L->hc_ffn_scale)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.q_norm.weight", l, 0,
			  c->q_lora_rank, -1, &L->q_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.kv_norm.weight", l, 0, hd, -1,
			  &L->kv_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.attn_sink", l, 0, H, -1,
			  &L->sink)) < 0)
		return r;
#define FP8(field, name, rows, cols)                                       \
	do {                                                               \
		snprintf(p, sizeof(p), "layers.%d.%s", l, name);           \
		if ((r = load_fp8(ld, p, rows, cols, &L->field)) < 0)      \
			return r;                                          \
	} while (0)
	FP8(wq_a, "attn.wq_a", c->q_lora_rank, D);
	FP8(wq_b, "attn.wq_b", H * hd, c->q_lora_rank);
	FP8(wkv, "attn.wkv", hd, D);
	FP8(wo_a, "attn.wo_a", G * c->o_lora_rank, H / G * hd);
	FP8(wo_b, "attn.wo_b", D, G * c->o_lora_rank);
	FP8(sh_w1, "ffn.shared_experts.w1", c->moe_inter, D);
	FP8(sh_w2, "ffn.shared_experts.w2", D, c->moe_inter);
	FP8(sh_w3, "ffn.shared_experts.w3", c->moe_inter, D);
	if (L->ratio) {
		if ((r = load_comp(ld, l, "attn.compressor", L->ratio, hd,
				   &L->comp)) < 0)
			return r;
	}
	L->has_indexer = L->ratio == 4;
	if (L->has_indexer) {
		if ((r = load_comp(ld, l, "attn.indexer.compressor", 4,
				   c->index_head_dim, &L->icomp)) < 0)
			return r;
		FP8(iwq_b, "attn.indexer.wq_b",
		    c->index_n_heads * c->index_head_dim, c->q_lora_rank);
		snprintf(p, sizeof(p),
			 "layers.%d.attn.indexer.weights_proj.weight", l);
		if ((r = load_mat_plain(ld, p, c->index_n_heads, D,
					&L->iweights)) < 0)
			return r;
	}
#undef FP8
	snprintf(p, sizeof(p), "layers.%d.ffn.gate.weight", l);
	if ((r = load_mat_plain(ld, p, E, D, &L->gate)) < 0)
		return r;
	if (l < c->n_hash_layers)
		r = load_tid2eid(ld, l, L);
	else
		r = load_fmt(ld, "layers.%d.ffn.gate.bias", l, 0, E, -1,
			     &L->gate_bias);
	if (r < 0)
		return r;
	if (ld->s.st) /* routed experts: from expertd's pool at eval time */
		return 0;
	L->ew1 = calloc(E, sizeof(*L->ew1));
	L->ew2 = calloc(E, sizeof(*L->ew2));
	L->ew3 = calloc(E, sizeof(*L->ew3));
	if (!L->ew1 || !L->ew2 || !L->ew3)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory");
	for (int e = 0; e < E; e++) {
		snprintf(p, sizeof(p), "layers.%d.ffn.experts.%d.w1", l, e);
		if ((r = load_fp4(ld, p, c->moe_inter, D, &L->ew1[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "layers.%d.ffn.experts.%d.w2", l, e);
		if ((r = load_fp4(ld, p, D, c->moe_inter, &L->ew2[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "layers.%d.ffn.experts.%d.w3", l, e);
		if ((r = load_fp4(ld, p, c->moe_inter, D, &L->ew3[e])) < 0)
			return r;
	}
	return 0;
}

/* Everything but the routed experts when loading from a store (m->cfg
 * set): global tensors and every layer. */
static int load_model(struct loader *ld, struct cw_dsv4_model *m)
{
	const struct st_dsv4_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult;
	int r;

	ld->c = c;
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	m->freq_main = calloc(c->rope_dim / 2 + 1, sizeof(double));
	m->freq_comp = calloc(c->rope_dim / 2 + 1, sizeof(double));
	if (!m->layers || !m->freq_main || !m->freq_comp)
		return -ENOMEM;
	cw_dsv4_rope_freqs(c, 0, m->freq_main);
	cw_dsv4_rope_freqs(c, 1, m->freq_comp);
	if ((r = load_plain(ld, "embed.weight", c->vocab_size, D,
			    &m->embed)) < 0 ||
	    (r = load_mat_fast16(ld, "head.weight", c->vocab_size, D,
				 &m->head)) < 0 ||
	    (r = load_plain(ld, "norm.weight", D, -1, &m->norm)) < 0 ||
	    (r = load_plain(ld, "hc_head_fn", hc, hc * D,
			    &m->hc_head_fn)) < 0 ||
	    (r = load_plain(ld, "hc_head_base", hc, -1,
			    &m->hc_head_base)) < 0 ||
	    (r = load_plain(ld, "hc_head_scale", 1, -1,
			    &m->hc_head_scale)) < 0)
		return r;
	for (int l = 0; l < c->n_layers; l++)
		if ((r = load_layer(ld, l, &m->layers[l])) < 0)
			return r;
	return 0;
}

/* The model's compute mode and backend; -EINVAL for an unknown mode. */
static int set_mode(struct cw_dsv4_model *m, struct loader *ld,
		    enum cw_compute mode, struct st_diag *diag)
{
	if (mode != CW_COMPUTE_REFERENCE && mode != CW_COMPUTE_FAST)
		return st_diag_set(diag, -EINVAL, "unknown compute mode %d",
				   (int)mode);
	m->compute = mode;
	m->be = mode == CW_COMPUTE_FAST ? cw_backend_cpu_fast() : NULL;
	ld->s.fast = mode == CW_COMPUTE_FAST;
	return 0;
}

int cw_dsv4_load_store(const char *store_dir, struct es_client *es,
		       struct cw_dsv4_model **ret, struct st_diag *diag)
{
	return cw_dsv4_load_store_mode(store_dir, es, CW_COMPUTE_REFERENCE,
				       ret, diag);
}

int cw_dsv4_load_store_mode(const char *store_dir, struct es_client *es,
			    enum cw_compute mode, struct cw_dsv4_model **ret,
			    struct st_diag *diag)
{
	struct cw_dsv4_model *m = calloc(1, sizeof(*m));
	struct st_store *s = NULL;
	struct loader ld = { 0 };
	int r;

	if (!m)
		return -ENOMEM;
	if ((r = set_mode(m, &ld, mode, diag)) < 0)
		goto out;
	if ((r = st_store_open(store_dir, &s, diag)) < 0)
		goto out;
	if (!s->is_dsv4) {
		r = st_diag_set(diag, -ST_E_UNSUPPORTED,
				"store %s: not a DeepSeek-V4 store", store_dir);
		goto out;
	}
	m->cfg = s->dsv4;
	/* the record layout of every layer must be V4's MXFP4 experts */
	if ((r = cw_dsv_check_store_experts(s, m->cfg.hidden_size,
					    m->cfg.moe_inter, diag)) < 0 ||
	    (r = cw_dsv_check_expertd(s, es, m->cfg.top_k, store_dir,
				      diag)) < 0 ||
	    (r = cw_dsv_src_map_store(&ld.s, s, diag)) < 0)
		goto out;
	ld.s.diag = diag;
	ld.s.family = "DeepSeek-V4";
	m->rec = calloc((size_t)s->n_layers, sizeof(*m->rec));
	if (!m->rec) {
		r = -ENOMEM;
		goto out;
	}
	memcpy(m->rec, s->layers, (size_t)s->n_layers * sizeof(*m->rec));
	if ((r = load_model(&ld, m)) < 0)
		goto out;
	m->es = es;
out:
	cw_dsv_src_unmap(&ld.s);
	st_store_close(s);
	if (r < 0) {
		if (r == -ENOMEM)
			st_diag_set(diag, r, "out of memory");
		cw_dsv4_free(m);
		return r;
	}
	*ret = m;
	return 0;
}

int cw_dsv4_load(const char *dir, struct cw_dsv4_model **ret,
		 struct st_diag *diag)
{
	return cw_dsv4_load_mode(dir, CW_COMPUTE_REFERENCE, ret, diag);
}

int cw_dsv4_load_mode(const char *dir, enum cw_compute mode,
		      struct cw_dsv4_model **ret, struct st_diag *diag)
{
	struct cw_dsv4_model *m = calloc(1, sizeof(*m));
	struct st_checkpoint *ck = NULL;
	struct loader ld = { 0 };
	int r;

	if (!m)
		return -ENOMEM;
	if ((r = set_mode(m, &ld, mode, diag)) < 0 ||
	    (r = st_dsv4_config_load(dir, &m->cfg, diag)) < 0 ||
	    (r = st_checkpoint_open(dir, &ck, diag)) < 0)
		goto fail;
	ld.s.ck = ck;
	ld.s.diag = diag;
	ld.s.family = "DeepSeek-V4";
	if ((r = load_model(&ld, m)) < 0)
		goto fail;
	/* mtp.* (num_nextn_predict_layers) is not read: MTP speculation is
	 * not implemented. */
	st_checkpoint_close(ck);
	*ret = m;
	return 0;
fail:
	st_checkpoint_close(ck);
	cw_dsv4_free(m);
	return r;
}

static void free_comp(struct cw_dsv4_comp *cp)
{
	free(cp->wkv.w);
	free(cp->wgate.w);
	free(cp->wkv.codes);
	free(cp->wgate.codes);
	free(cp->ape);
	free(cp->norm);
}

void cw_dsv4_free(struct cw_dsv4_model *m)
{
	if (!m)
		return;
	for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
		struct cw_dsv4_layer *L = &m->layers[l];
		float *plain[] = {
			L->attn_norm, L->ffn_norm, L->hc_attn_fn,
			L->hc_attn_base, L->hc_attn_scale, L->hc_ffn_fn,
			L->hc_ffn_base, L->hc_ffn_scale, L->q_norm,
			L->kv_norm, L->sink, L->gate_bias, L->wq_a.w,
			L->wq_b.w, L->wkv.w, L->wo_a.w, L->wo_b.w,
			L->iwq_b.w, L->iweights.w, L->gate.w, L->sh_w1.w,
			L->sh_w2.w, L->sh_w3.w,
		};

		struct cw_dsv4_mat *fp8[] = {
			&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
			&L->iwq_b, &L->sh_w1, &L->sh_w2, &L->sh_w3,
		};

		for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
			free(plain[i]);
		for (size_t i = 0; i < sizeof(fp8) / sizeof(fp8[0]); i++) {
			free(fp8[i]->codes);
			free(fp8[i]->fscale);
		}
		free_comp(&L->comp);
		free_comp(&L->icomp);
		free(L->tid2eid);
		for (int e = 0; e < m->cfg.n_experts; e++) {
			if (L->ew1)
				free(L->ew1[e].w);
			if (L->ew2)
				free(L->ew2[e].w);
			if (L->ew3)
				free(L->ew3[e].w);
		}
		free(L->ew1);
		free(L->ew2);
		free(L->ew3);
	}
	free(m->layers);
	free(m->embed);
	free(m->head.w);
	free(m->head.codes);
	free(m->norm);
	free(m->hc_head_fn);
	free(m->hc_head_base);
	free(m->hc_head_scale);
	free(m->freq_main);
	free(m->freq_comp);
	free(m->rec);
	free(m);
}

int cw_dsv4_set_qat(struct cw_dsv4_model *m, unsigned flags)
{
	int d = m->cfg.index_head_dim;

	if (flags & ~(unsigned)(CW_DSV4_QAT_KV_FP8 | CW_DSV4_QAT_INDEX_FP4 |
				CW_DSV4_QAT_ACT_FP8))
		return -EINVAL;
	if ((flags & CW_DSV4_QAT_INDEX_FP4) && (d & (d - 1)))
		return -ST_E_UNSUPPORTED; /* Hadamard needs a power of two */
	m->qat = flags;
	return 0;
}

int cw_dsv4_hash_experts(const struct cw_dsv4_model *m, int layer,
			 int32_t token, int32_t *ids)
{
	const struct st_dsv4_config *c = &m->cfg;
	const struct cw_dsv4_layer *L;

	if (layer < 0 || layer >= c->n_layers || token < 0 ||
	    token >= c->vocab_size)
		return -EINVAL;
	L = &m->layers[layer];
	if (!L->tid2eid)
		return 0;
	memcpy(ids, L->tid2eid + (size_t)token * c->top_k,
	       (size_t)c->top_k * sizeof(*ids));
	return c->top_k;
}

const struct st_dsv4_config *cw_dsv4_config(const struct cw_dsv4_model *m)
{
	return &m->cfg;
}

int cw_dsv4_set_backend(struct cw_dsv4_model *m,
			const struct cw_backend_ops *be)
{
	if (m->compute != CW_COMPUTE_FAST || !be)
		return -EINVAL;
	m->be = be;
	return 0;
}

int cw_dsv4_set_prefetch_depth(struct cw_dsv4_model *m, int depth)
{
	if (depth < 0 || depth > 8)
		return -EINVAL;
	m->prefetch_depth = depth;
	return 0;
}

void cw_dsv4_set_route_reports(struct cw_dsv4_model *m, int on)
{
	m->no_route_reports = !on;
}

void cw_dsv4_set_layer_hints(struct cw_dsv4_model *m, int on)
{
	m->no_layer_hints = !on;
}

void cw_dsv4_set_decode_overlap(struct cw_dsv4_model *m, int step_hints,
				int expert_overlap)
{
	m->no_step_hints = !step_hints;
	m->no_expert_overlap = !expert_overlap;
}
