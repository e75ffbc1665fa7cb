/*
 * cw_dsv41_load.c — DeepSeek-V4.1 weights from the official safetensors
 * layout (names and formats: MODEL_FAMILY_DEEPSEEK_V4.md 3.2), dequantised
 * exactly to F32 (reference mode) or kept as stored for the fast kernels
 * (fast mode: FP8 codes, BF16); Engram tables kept FP8 either way.
 */
#include "cw_dsv41_int.h"
#include "cw_dsv_tensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_engram_es.h"
#include "cw_threads.h"
#include "es_client.h"
#include "st_formats.h"
#include "st_safetensors.h"
#include "st_store.h"

/* The loader: its tensor source (cw_dsv_tensors.h, with the used flags
 * of the checkpoint's tensors) and the config the shapes come from. */
struct loader {
	struct cw_dsv_src s;
	const struct st_dsv41_config *c;
};

static int load_plain(struct loader *ld, const char *name, int64_t d0,
		      int64_t d1, float **ret)
{
	return cw_dsv_src_plain(&ld->s, name, d0, d1, ret);
}

static int find(struct loader *ld, const char *name, enum st_dtype dt,
		int64_t d0, int64_t d1, const struct st_tensor_info **ret,
		const void **data)
{
	return cw_dsv_src_find(&ld->s, name, dt, d0, d1, ret, data);
}

static int load_fmt(struct loader *ld, const char *fmt, int l, int64_t d0,
		    int64_t d1, float **ret)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return load_plain(ld, name, d0, d1, ret);
}

static int load_mat_plain(struct loader *ld, const char *fmt, int l,
			  int rows, int cols, struct cw_dsv4_mat *m)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return cw_dsv_src_mat_plain(&ld->s, name, rows, cols, m);
}

static int load_mat16(struct loader *ld, const char *fmt, int l, int rows,
		      int cols, struct cw_dsv4_mat *m)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return cw_dsv_src_mat16(&ld->s, name, rows, cols, m);
}

static int check_scales(struct loader *ld, const char *name,
			const uint8_t *s, uint64_t n)
{
	return cw_dsv_src_check_scales(&ld->s, name, s, n);
}

/* FP8 in the config's blocks (cw_dsv_src_fp8). */
static int load_fp8(struct loader *ld, const char *prefix, int rows, int cols,
		    struct cw_dsv4_mat *m)
{
	return cw_dsv_src_fp8(&ld->s, prefix, rows, cols, ld->c->fp8_block[0],
			      ld->c->fp8_block[1], m);
}

/* A routed-expert matrix: MXFP4 (cw_dsv_src_mxfp4) detected from the
 * stored dtype; an FP8 one (the dense format) is accepted too. */
static int load_expert(struct loader *ld, const char *prefix, int rows,
		       int cols, struct cw_dsv4_mat *m)
{
	const struct st_tensor_info *tw;
	char name[300];

	snprintf(name, sizeof(name), "%s.weight", prefix);
	tw = st_checkpoint_find(ld->s.ck, name);
	if (tw && tw->dtype == ST_DTYPE_F8_E4M3)
		return load_fp8(ld, prefix, rows, cols, m);
	return cw_dsv_src_mxfp4(&ld->s, prefix, rows, cols, m);
}

/* Engram layer l (index ei): the FP8 table with per-row scales, wkv,
 * q_weight * k_weight. */
static int load_engram(struct loader *ld, int l, int ei,
		       struct cw_dsv41_layer *L, int rows_per_pos)
{
	const struct st_dsv41_config *c = ld->c;
	const int D = c->hidden_size, hc = c->hc_mult, hd = c->engram_head_dim;
	const struct st_tensor_info *tw, *ts;
	const void *w, *s;
	float *qw = NULL, *kw = NULL;
	char name[256];
	int r;

	if (hd % 32)
		return st_diag_set(ld->s.diag, -ST_E_CONFIG,
				   "engram_head_dim %d is not a multiple of 32 (one scale per 32 columns)",
				   hd);
	L->ei = ei;
	L->erows = c->engram_rows[ei];
	if (ld->s.st) /* the table: engram.bin, read by expertd's Engram tier */
		goto mats;
	snprintf(name, sizeof(name), "layers.%d.engram.embed.weight", l);
	if ((r = find(ld, name, ST_DTYPE_F8_E4M3, L->erows, hd, &tw, &w)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%d.engram.embed.scale", l);
	if ((r = find(ld, name, ST_DTYPE_F8_E8M0, L->erows, hd / 32, &ts,
		      &s)) < 0 ||
	    (r = check_scales(ld, name, s, ts->n_elems)) < 0)
		return r;
	L->etab = malloc(tw->n_bytes);
	L->escale = malloc(ts->n_bytes);
	if (!L->etab || !L->escale)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory (%s)",
				   name);
	memcpy(L->etab, w, tw->n_bytes);
	memcpy(L->escale, s, ts->n_bytes);
mats:
	snprintf(name, sizeof(name), "layers.%d.engram.wkv", l);
	if ((r = load_fp8(ld, name, (hc + 1) * D, rows_per_pos * hd,
			  &L->ewkv)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.engram.q_weight", l, hc, D, &qw)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.engram.k_weight", l, hc, D, &kw)) < 0)
		goto out;
	/* only their product is used (model doc 3.5) */
	for (int i = 0; i < hc * D; i++)
		qw[i] *= kw[i];
	L->eqk = qw;
	qw = NULL;
out:
	free(qw);
	free(kw);
	return r;
}

static int load_layer(struct loader *ld, int l, struct cw_dsv41_layer *L,
		      int rows_per_pos)
{
	const struct st_dsv41_config *c = ld->c;
	const int D = c->hidden_size, hc = c->hc_mult, E = c->n_experts;
	const int nmu = (2 + hc) * hc, H = c->n_heads, hd = c->head_dim;
	const int G = c->o_groups, Id = c->index_head_dim;
	char p[256];
	int r;

	L->ratio = c->compress_ratio[l];
	L->kv_src = st_dsv41_kv_source_of(c, l);
	L->idx_src = st_dsv41_index_source_of(c, l);
	L->ei = -1;
	if ((r = load_fmt(ld, "layers.%d.attn_norm.weight", l, D, -1,
			  &L->attn_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.ffn_norm.weight", l, D, -1,
			  &L->ffn_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_fn", l, nmu, hc * D,
			  &L->hc_attn_fn)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_base", l, nmu, -1,
			  &L->hc_attn_base)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_attn_scale", l, 3, -1,
			  &L->hc_attn_scale)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_fn", l, nmu, hc * D,
			  &L->hc_ffn_fn)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_base", l, nmu, -1,
			  &L->hc_ffn_base)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.hc_ffn_scale", l, 3, -1,
			  &L->hc_ffn_scale)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.q_norm.weight", l,
			  c->q_lora_rank, -1, &L->q_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.kv_norm.weight", l, hd, -1,
			  &L->kv_norm)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.attn.attn_sink", l, H, -1,
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
	if (c->kv_source[l]) {
		if ((r = load_mat16(ld, "layers.%d.attn.compressor.wkv.weight",
				    l, hd, D, &L->cwkv)) < 0 ||
		    (L->ratio > 1 &&
		     (r = load_mat16(ld, "layers.%d.attn.compressor.wgate.weight",
				     l, hd, D, &L->cwgate)) < 0) ||
		    (r = load_fmt(ld, "layers.%d.attn.compressor.norm.weight",
				  l, hd, -1, &L->cnorm)) < 0 ||
		    (r = load_mat16(ld, "layers.%d.attn.indexer.wk.weight",
				    l, Id, hd, &L->iwk)) < 0 ||
		    (r = load_fmt(ld, "layers.%d.attn.indexer.k_norm.weight",
				  l, Id, -1, &L->iknorm)) < 0)
			return r;
	}
	if (c->index_source[l]) {
		FP8(iwq_b, "attn.indexer.wq_b", c->index_n_heads * Id,
		    c->q_lora_rank);
		if ((r = load_mat_plain(ld, "layers.%d.attn.indexer.weights_proj.weight",
					l, c->index_n_heads, D,
					&L->iweights)) < 0)
			return r;
	}
#undef FP8
	if ((r = load_mat_plain(ld, "layers.%d.ffn.gate.weight", l, E, D,
				&L->gate)) < 0 ||
	    (r = load_fmt(ld, "layers.%d.ffn.gate.bias", l, E, -1,
			  &L->gate_bias)) < 0)
		return r;
	for (int i = 0; i < c->n_engram; i++)
		if (c->engram_layer[i] == l &&
		    (r = load_engram(ld, l, i, L, rows_per_pos)) < 0)
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
		if ((r = load_expert(ld, p, c->moe_inter, D, &L->ew1[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "layers.%d.ffn.experts.%d.w2", l, e);
		if ((r = load_expert(ld, p, D, c->moe_inter, &L->ew2[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "layers.%d.ffn.experts.%d.w3", l, e);
		if ((r = load_expert(ld, p, c->moe_inter, D, &L->ew3[e])) < 0)
			return r;
	}
	return 0;
}

/* Tensors a text-only model skips by name: the vision tower, the
 * aligner, the DSpark draft layers, the image markers, and the image-span
 * router bias (model doc 3.2 "Skip for text-only decode"). */
static int skipped(const char *name)
{
	static const char *const pfx[] = { "mtp.", "vision.", "aligner.",
					   "image_", "model.vision",
					   "vision_model." };
	const char *bv = strstr(name, ".ffn.gate.bias_vl");

	for (size_t i = 0; i < sizeof(pfx) / sizeof(pfx[0]); i++)
		if (!strncmp(name, pfx[i], strlen(pfx[i])))
			return 1;
	return bv && !strcmp(bv, ".ffn.gate.bias_vl");
}

static int load_model(struct loader *ld, struct cw_dsv41_model *m)
{
	const struct st_dsv41_config *c = &m->cfg;
	const int D = c->hidden_size;
	struct st_dsv4_config rc = { 0 };
	int r;

	ld->c = c;
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	m->freq_main = calloc(c->rope_dim / 2 + 1, sizeof(double));
	m->freq_comp = calloc(c->rope_dim / 2 + 1, sizeof(double));
	if (!m->layers || !m->freq_main || !m->freq_comp)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory");
	/* the rope is V4's (same keys, same YaRN) */
	rc.rope_dim = c->rope_dim;
	rc.rope_theta = c->rope_theta;
	rc.compress_rope_theta = c->compress_rope_theta;
	rc.yarn_factor = c->yarn_factor;
	rc.yarn_beta_fast = c->yarn_beta_fast;
	rc.yarn_beta_slow = c->yarn_beta_slow;
	rc.yarn_orig_max_pos = c->yarn_orig_max_pos;
	cw_dsv4_rope_freqs(&rc, 0, m->freq_main);
	cw_dsv4_rope_freqs(&rc, 1, m->freq_comp);
	if ((r = load_plain(ld, "embed.weight", c->vocab_size, D,
			    &m->embed)) < 0 ||
	    /* "%.0d" of 0 prints nothing: the name is head.weight */
	    (r = load_mat16(ld, "head.weight%.0d", 0, c->vocab_size, D,
			    &m->head)) < 0 ||
	    (r = load_plain(ld, "norm.weight", D, -1, &m->norm)) < 0)
		return r;
	for (int l = 0; l < c->n_layers; l++)
		if ((r = load_layer(ld, l, &m->layers[l],
				    m->engram_rows_per_pos)) < 0)
			return r;
	for (int i = 0; !ld->s.st && i < ld->s.ck->n_tensors; i++)
		if (!ld->s.used[i] && !skipped(ld->s.ck->tensors[i].name))
			return st_diag_set(ld->s.diag, -ST_E_FORMAT,
					   "tensor %s is not part of the DeepSeek-V4.1 text model this config describes (a different config or a newer variant?)",
					   ld->s.ck->tensors[i].name);
	return 0;
}

int cw_dsv41_engram_rows_mem(void *ctx, int ei, const int64_t *row_ids,
			     int n, float *out, struct st_diag *diag)
{
	const struct cw_dsv41_model *m = ctx;
	const int hd = m->cfg.engram_head_dim;
	const struct cw_dsv41_layer *L =
		&m->layers[m->cfg.engram_layer[ei]];

	if (!L->etab)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "engram layer %d: the table is not in memory (a store model reads it through expertd)",
				   m->cfg.engram_layer[ei]);
	for (int i = 0; i < n; i++) {
		int64_t r = row_ids[i];

		if (r < 0 || r >= L->erows)
			return st_diag_set(diag, -EINVAL,
					   "engram layer %d: row %lld outside the table's %lld rows",
					   m->cfg.engram_layer[ei], (long long)r,
					   (long long)L->erows);
		for (int j = 0; j < hd; j++)
			out[(size_t)i * hd + j] =
				st_e4m3_to_f32(L->etab[r * hd + j]) *
				st_e8m0_to_f32(L->escale[r * (hd / 32) +
							 j / 32]);
	}
	return 0;
}

/* The Engram hash (m->hash, loaded from `source`) against the config,
 * and the QAT blocks against the head dims. */
static int check_model(struct cw_dsv41_model *m, const char *source,
		       struct st_diag *diag)
{
	int r;

	if (m->cfg.n_engram) {
		m->engram_rows_per_pos = st_engram_hash_rows_per_pos(m->hash);
		if ((r = st_engram_hash_check_config(m->hash, m->cfg.n_engram,
						     m->cfg.engram_layer,
						     m->cfg.engram_rows,
						     diag)) < 0)
			return r;
		if (st_engram_hash_heads(m->hash) != m->cfg.engram_n_heads ||
		    m->engram_rows_per_pos != (m->cfg.engram_max_ngram - 1) *
							  m->cfg.engram_n_heads)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: %d heads, %d rows per position; config.json says engram_n_heads %d, engram_max_ngram_size %d",
					   source, st_engram_hash_heads(m->hash),
					   m->engram_rows_per_pos,
					   m->cfg.engram_n_heads,
					   m->cfg.engram_max_ngram);
	}
	/* the QAT formats' blocks (st_kvfmt_v41.h) must tile the rows */
	if (m->cfg.head_dim % 32 || m->cfg.index_head_dim % 32)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: head_dim %d and index_head_dim %d must be multiples of 32 (the V4.1 KV formats' blocks)",
				   source, m->cfg.head_dim,
				   m->cfg.index_head_dim);
	return 0;
}

/* The model's compute mode and backend; -EINVAL for an unknown mode. */
static int set_mode(struct cw_dsv41_model *m, struct loader *ld,
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

int cw_dsv41_load(const char *dir, struct cw_dsv41_model **ret,
		  struct st_diag *diag)
{
	return cw_dsv41_load_mode(dir, CW_COMPUTE_REFERENCE, ret, diag);
}

int cw_dsv41_load_mode(const char *dir, enum cw_compute mode,
		       struct cw_dsv41_model **ret, struct st_diag *diag)
{
	struct cw_dsv41_model *m = calloc(1, sizeof(*m));
	struct st_checkpoint *ck = NULL;
	struct loader ld = { 0 };
	char path[4096];
	int r;

	if (!m)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	m->qat = CW_DSV41_QAT_ALL;
	if ((r = set_mode(m, &ld, mode, diag)) < 0)
		goto fail;
	m->prov.get_rows = cw_dsv41_engram_rows_mem;
	m->prov.ctx = m;
	if ((r = st_dsv41_config_load(dir, &m->cfg, diag)) < 0)
		goto fail;
	snprintf(path, sizeof(path), "%s/engram_hash.json", dir);
	if (m->cfg.n_engram &&
	    (r = st_engram_hash_load_json(path, &m->hash, diag)) < 0)
		goto fail;
	if ((r = check_model(m, m->cfg.n_engram ? path : dir, diag)) < 0)
		goto fail;
	if ((r = st_checkpoint_open(dir, &ck, diag)) < 0)
		goto fail;
	ld.s.ck = ck;
	ld.s.diag = diag;
	ld.s.family = "DeepSeek-V4.1";
	ld.s.used = calloc(ck->n_tensors + 1, 1);
	if (!ld.s.used) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto fail;
	}
	if ((r = load_model(&ld, m)) < 0)
		goto fail;
	free(ld.s.used);
	st_checkpoint_close(ck);
	*ret = m;
	return 0;
fail:
	free(ld.s.used);
	st_checkpoint_close(ck);
	cw_dsv41_free(m);
	return r;
}

/* expertd must serve this store's experts (and its Engram tables). */
static int check_es(const struct st_store *s, const struct cw_dsv41_model *m,
		    struct es_client *es, const char *store_dir,
		    struct st_diag *diag)
{
	struct es_engram_info ei;
	int r = cw_dsv_check_expertd(s, es, m->cfg.top_k, store_dir, diag);

	if (r < 0 || !m->cfg.n_engram)
		return r;
	if ((r = es_client_engram_info(es, &ei, diag)) < 0)
		return r;
	if (ei.n_layers != m->cfg.n_engram)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "store %s: expertd serves %d Engram tables, the model has %d (start expertd with --store %s)",
				   store_dir, ei.n_layers, m->cfg.n_engram,
				   store_dir);
	for (int i = 0; i < ei.n_layers; i++)
		if (ei.layer_id[i] != m->cfg.engram_layer[i] ||
		    ei.rows[i] != m->cfg.engram_rows[i] ||
		    ei.dim[i] != m->cfg.engram_head_dim)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "store %s: expertd's Engram table %d (layer %d, %lld x %d) is not the model's (layer %d, %lld x %d)",
					   store_dir, i, ei.layer_id[i],
					   (long long)ei.rows[i], ei.dim[i],
					   m->cfg.engram_layer[i],
					   (long long)m->cfg.engram_rows[i],
					   m->cfg.engram_head_dim);
	return 0;
}

int cw_dsv41_load_store(const char *store_dir, struct es_client *es,
			struct cw_dsv41_model **ret, struct st_diag *diag)
{
	return cw_dsv41_load_store_mode(store_dir, es, CW_COMPUTE_REFERENCE,
					ret, diag);
}

int cw_dsv41_load_store_mode(const char *store_dir, struct es_client *es,
			     enum cw_compute mode,
			     struct cw_dsv41_model **ret,
			     struct st_diag *diag)
{
	struct cw_dsv41_model *m = calloc(1, sizeof(*m));
	struct st_store *s = NULL;
	struct loader ld = { 0 };
	int r;

	if (!m)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	m->qat = CW_DSV41_QAT_ALL;
	if ((r = set_mode(m, &ld, mode, diag)) < 0 ||
	    (r = st_store_open(store_dir, &s, diag)) < 0)
		goto out;
	if (!s->is_dsv41) {
		r = st_diag_set(diag, -ST_E_UNSUPPORTED,
				"store %s: not a DeepSeek-V4.1 store", store_dir);
		goto out;
	}
	if ((r = st_dsv41_config_parse(s->config_json, "store config.json",
				       &m->cfg, diag)) < 0)
		goto out;
	if (m->cfg.n_engram && !s->engram_hash) {
		r = st_diag_set(diag, -ST_E_FORMAT,
				"store %s: no Engram hash (engram_hash.bin): re-run strata convert",
				store_dir);
		goto out;
	}
	m->hash = s->engram_hash; /* taken over from the store */
	s->engram_hash = NULL;
	if ((r = check_model(m, store_dir, diag)) < 0 ||
	    (r = cw_dsv_check_store_experts(s, m->cfg.hidden_size,
					    m->cfg.moe_inter, diag)) < 0 ||
	    (r = check_es(s, m, es, store_dir, diag)) < 0 ||
	    (r = cw_dsv_src_map_store(&ld.s, s, diag)) < 0)
		goto out;
	ld.s.diag = diag;
	ld.s.family = "DeepSeek-V4.1";
	m->rec = calloc((size_t)s->n_layers, sizeof(*m->rec));
	if (!m->rec) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	memcpy(m->rec, s->layers, (size_t)s->n_layers * sizeof(*m->rec));
	if ((r = load_model(&ld, m)) < 0)
		goto out;
	m->es = es;
	m->prov.get_rows = cw_engram_es_get_rows;
	m->prov.ctx = es;
out:
	cw_dsv_src_unmap(&ld.s);
	st_store_close(s);
	if (r < 0) {
		cw_dsv41_free(m);
		return r;
	}
	*ret = m;
	return 0;
}

void cw_dsv41_free(struct cw_dsv41_model *m)
{
	if (!m)
		return;
	for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
		struct cw_dsv41_layer *L = &m->layers[l];
		struct cw_dsv4_mat *mats[] = {
			&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b,
			&L->cwkv, &L->cwgate, &L->iwk, &L->iwq_b,
			&L->iweights, &L->gate, &L->sh_w1, &L->sh_w2,
			&L->sh_w3, &L->ewkv,
		};
		float *vecs[] = {
			L->attn_norm, L->ffn_norm, L->hc_attn_fn,
			L->hc_attn_base, L->hc_attn_scale, L->hc_ffn_fn,
			L->hc_ffn_base, L->hc_ffn_scale, L->q_norm,
			L->kv_norm, L->sink, L->cnorm, L->iknorm,
			L->gate_bias, L->eqk,
		};

		for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
			cw_dsv4_mat_free(mats[i]);
		for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
			free(vecs[i]);
		for (int e = 0; L->ew1 && e < m->cfg.n_experts; e++) {
			cw_dsv4_mat_free(&L->ew1[e]);
			cw_dsv4_mat_free(&L->ew2[e]);
			cw_dsv4_mat_free(&L->ew3[e]);
		}
		free(L->ew1);
		free(L->ew2);
		free(L->ew3);
		free(L->etab);
		free(L->escale);
	}
	free(m->layers);
	free(m->embed);
	cw_dsv4_mat_free(&m->head);
	free(m->norm);
	free(m->freq_main);
	free(m->freq_comp);
	st_engram_hash_free(m->hash);
	cw_threads_destroy(m->pool);
	free(m->rec);
	free(m);
}

const struct st_dsv41_config *cw_dsv41_config(const struct cw_dsv41_model *m)
{
	return &m->cfg;
}

int cw_dsv41_set_qat(struct cw_dsv41_model *m, unsigned flags)
{
	if (flags & ~(unsigned)CW_DSV41_QAT_ALL)
		return -EINVAL;
	m->qat = flags;
	return 0;
}

void cw_dsv41_set_engram_provider(struct cw_dsv41_model *m,
				  const struct cw_dsv41_engram_provider *p)
{
	if (p) {
		m->prov = *p;
	} else {
		m->prov.get_rows = m->es ? cw_engram_es_get_rows :
					   cw_dsv41_engram_rows_mem;
		m->prov.ctx = m->es ? (void *)m->es : (void *)m;
	}
}

void cw_dsv41_set_route_reports(struct cw_dsv41_model *m, int on)
{
	m->no_route_reports = !on;
}

void cw_dsv41_set_engram_prefetch(struct cw_dsv41_model *m, int on)
{
	m->no_engram_prefetch = !on;
}

enum cw_compute cw_dsv41_compute(const struct cw_dsv41_model *m)
{
	return m->compute;
}

int cw_dsv41_set_backend(struct cw_dsv41_model *m,
			 const struct cw_backend_ops *be)
{
	if (m->compute != CW_COMPUTE_FAST || !be)
		return -EINVAL;
	m->be = be;
	return 0;
}

void cw_dsv41_set_layer_hints(struct cw_dsv41_model *m, int on)
{
	m->no_layer_hints = !on;
}

void cw_dsv41_set_decode_overlap(struct cw_dsv41_model *m, int step_hints,
				 int expert_overlap)
{
	m->no_step_hints = !step_hints;
	m->no_expert_overlap = !expert_overlap;
}

int cw_dsv41_set_prefetch_depth(struct cw_dsv41_model *m, int depth)
{
	if (depth < 0 || depth > 8)
		return -EINVAL;
	m->prefetch_depth = depth;
	return 0;
}

int cw_dsv41_set_threads(struct cw_dsv41_model *m, int n_threads)
{
	struct cw_threads *p = NULL;
	int r;

	if (n_threads < 1 || (n_threads > 1 && m->compute != CW_COMPUTE_FAST))
		return -EINVAL;
	if (n_threads > 1 && (r = cw_threads_create(n_threads, &p)) < 0)
		return r;
	cw_threads_destroy(m->pool);
	m->pool = p;
	return 0;
}
