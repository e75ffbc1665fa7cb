/*
 * cw_dsv_load.c — the DeepSeek-V4 family's one loader (cw_dsv.h): the
 * weights every revision has, from the official safetensors layout or a
 * strata store's dense.bin (MODEL_FAMILY_DEEPSEEK_V4.md 2.3, 3.2),
 * dequantised exactly to F32 (reference mode) or kept as stored for the
 * fast kernels; what a revision loads of its own is chosen by the
 * config's revision (cw_dsv_load_attn.c, cw_dsv_load_engram.c).  Also
 * the model's life: freeing and the switches every revision has.
 */
#include "cw_dsv_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "cw_dsv_ops.h"
#include "cw_engram_es.h"
#include "cw_threads.h"
#include "es_client.h"
#include "st_config_dsv_family.h"
#include "st_config_dsv41.h"
#include "st_engram_hash.h"
#include "st_log.h"
#include "st_safetensors.h"
#include "st_store.h"
#include "st_util.h"

int cw_dsv_ld_vec(struct cw_dsv_loader *ld, const char *fmt, int l,
		  int64_t d0, int64_t d1, float **ret)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return cw_dsv_src_plain(&ld->s, name, d0, d1, ret);
}

int cw_dsv_ld_fp8(struct cw_dsv_loader *ld, const char *prefix, int rows,
		  int cols, struct cw_dsv_mat *m)
{
	return cw_dsv_src_fp8(&ld->s, prefix, rows, cols, ld->c->fp8_block[0],
			      ld->c->fp8_block[1], m);
}

int cw_dsv_ld_mat16(struct cw_dsv_loader *ld, const char *fmt, int l,
		    int rows, int cols, struct cw_dsv_mat *m)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return cw_dsv_src_mat16(&ld->s, name, rows, cols, m);
}

int cw_dsv_ld_mat_plain(struct cw_dsv_loader *ld, const char *fmt, int l,
			int rows, int cols, struct cw_dsv_mat *m)
{
	char name[256];

	snprintf(name, sizeof(name), fmt, l);
	return cw_dsv_src_mat_plain(&ld->s, name, rows, cols, m);
}

static const char *family_name(enum st_dsv_revision rev)
{
	return rev == ST_DSV_REV_V41 ? "DeepSeek-V4.1" : "DeepSeek-V4";
}

/* A routed-expert matrix: MXFP4 (cw_dsv_src_mxfp4); V4.1 accepts an FP8
 * one (the dense format) too, detected from the stored dtype. */
static int load_expert(struct cw_dsv_loader *ld, const char *prefix,
		       int rows, int cols, struct cw_dsv_mat *m)
{
	const struct st_tensor_info *tw;
	char name[300];

	if (ld->c->revision == ST_DSV_REV_V41) {
		snprintf(name, sizeof(name), "%s.weight", prefix);
		tw = st_checkpoint_find(ld->s.ck, name);
		if (tw && tw->dtype == ST_DTYPE_F8_E4M3)
			return cw_dsv_ld_fp8(ld, prefix, rows, cols, m);
	}
	return cw_dsv_src_mxfp4(&ld->s, prefix, rows, cols, m);
}

/* Block pfx's ("layers.N" or "mtp.K") routed experts. */
static int load_experts(struct cw_dsv_loader *ld, const char *pfx,
			struct cw_dsv_layer *L)
{
	const struct st_dsv_config *c = ld->c;
	const int D = c->hidden_size, E = c->n_experts;
	char p[256];
	int r;

	L->ew1 = calloc(E, sizeof(*L->ew1));
	L->ew2 = calloc(E, sizeof(*L->ew2));
	L->ew3 = calloc(E, sizeof(*L->ew3));
	if (!L->ew1 || !L->ew2 || !L->ew3)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory");
	for (int e = 0; e < E; e++) {
		snprintf(p, sizeof(p), "%s.ffn.experts.%d.w1", pfx, e);
		if ((r = load_expert(ld, p, c->moe_inter, D, &L->ew1[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "%s.ffn.experts.%d.w2", pfx, e);
		if ((r = load_expert(ld, p, D, c->moe_inter, &L->ew2[e])) < 0)
			return r;
		snprintf(p, sizeof(p), "%s.ffn.experts.%d.w3", pfx, e);
		if ((r = load_expert(ld, p, c->moe_inter, D, &L->ew3[e])) < 0)
			return r;
	}
	return 0;
}

/* Tensor pfx.suffix (plain, cw_dsv_src_plain). */
static int pvec(struct cw_dsv_loader *ld, const char *pfx, const char *suffix,
		int64_t d0, int64_t d1, float **ret)
{
	char name[256];

	snprintf(name, sizeof(name), "%s.%s", pfx, suffix);
	return cw_dsv_src_plain(&ld->s, name, d0, d1, ret);
}

/* Block pfx ("layers.%d" of l, or V4's MTP block "mtp.0" as layer
 * l = n_layers, window only) into L. */
static int load_layer(struct cw_dsv_loader *ld, int l, const char *pfx,
		      struct cw_dsv_layer *L, int rows_per_pos)
{
	const struct st_dsv_config *c = ld->c;
	const int D = c->hidden_size, hc = c->hc_mult, E = c->n_experts;
	const int nmu = (2 + hc) * hc, H = c->n_heads, hd = c->head_dim;
	const int G = c->o_groups;
	char p[256];
	int r;

	L->ratio = l < c->n_layers ? c->compress_ratio[l] : c->nextn_ratio;
	L->ei = -1;
	L->kv_src = L->idx_src = -1;
	if (c->revision == ST_DSV_REV_V41) {
		L->kv_src = st_dsv41_kv_source_of(c, l);
		L->idx_src = st_dsv41_index_source_of(c, l);
	}
	if ((r = pvec(ld, pfx, "attn_norm.weight", D, -1, &L->attn_norm)) < 0 ||
	    (r = pvec(ld, pfx, "ffn_norm.weight", D, -1, &L->ffn_norm)) < 0 ||
	    (r = pvec(ld, pfx, "hc_attn_fn", nmu, hc * D, &L->hc_attn_fn)) < 0 ||
	    (r = pvec(ld, pfx, "hc_attn_base", nmu, -1, &L->hc_attn_base)) < 0 ||
	    (r = pvec(ld, pfx, "hc_attn_scale", 3, -1, &L->hc_attn_scale)) < 0 ||
	    (r = pvec(ld, pfx, "hc_ffn_fn", nmu, hc * D, &L->hc_ffn_fn)) < 0 ||
	    (r = pvec(ld, pfx, "hc_ffn_base", nmu, -1, &L->hc_ffn_base)) < 0 ||
	    (r = pvec(ld, pfx, "hc_ffn_scale", 3, -1, &L->hc_ffn_scale)) < 0 ||
	    (r = pvec(ld, pfx, "attn.q_norm.weight", c->q_lora_rank, -1,
		      &L->q_norm)) < 0 ||
	    (r = pvec(ld, pfx, "attn.kv_norm.weight", hd, -1, &L->kv_norm)) < 0 ||
	    (r = pvec(ld, pfx, "attn.attn_sink", H, -1, &L->sink)) < 0)
		return r;
#define FP8(field, name, rows, cols)                                       \
	do {                                                               \
		snprintf(p, sizeof(p), "%s.%s", pfx, name);                \
		if ((r = cw_dsv_ld_fp8(ld, p, rows, cols, &L->field)) < 0) \
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
#undef FP8
	if (c->revision == ST_DSV_REV_V41)
		r = cw_dsv_load_attn_v41(ld, l, L);
	else
		r = cw_dsv_load_attn_v4(ld, l, L);
	snprintf(p, sizeof(p), "%s.ffn.gate.weight", pfx);
	if (r < 0 ||
	    (r = cw_dsv_src_mat_plain(&ld->s, p, E, D, &L->gate)) < 0)
		return r;
	/* V4's first n_hash_layers route by token id (V4.1: none; the MTP
	 * block, layer n_layers, by score) */
	if (l < c->n_hash_layers)
		r = cw_dsv_load_tid2eid(ld, l, L);
	else
		r = pvec(ld, pfx, "ffn.gate.bias", E, -1, &L->gate_bias);
	if (r < 0)
		return r;
	for (int i = 0; i < c->n_engram; i++) /* V4: none */
		if (c->engram_layer[i] == l &&
		    (r = cw_dsv_load_engram(ld, l, i, L, rows_per_pos)) < 0)
			return r;
	if (ld->s.st) /* routed experts: from expertd's pool at eval time */
		return 0;
	return load_experts(ld, pfx, L);
}

/* V4's MTP block mtp.0 as layers[n_layers] plus its own weights (m->mtp),
 * from a checkpoint that has it (config num_nextn_predict_layers > 0 and
 * mtp.0.e_proj present) or a store that kept it (st_store.n_mtp: its
 * experts are the store's expert layer n_layers, served by expertd).
 * A block whose compress ratio is not 0 (none released) is not loaded
 * either: it would need a compressor state this code does not keep. */
static int load_mtp(struct cw_dsv_loader *ld, struct cw_dsv_model *m)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult;
	struct cw_dsv_mtp *t = &m->mtp;
	int r;

	if (c->revision != ST_DSV_REV_V4 || c->n_nextn < 1 ||
	    (ld->s.st ? ld->s.st->n_mtp < 1 :
			!st_checkpoint_find(ld->s.ck, "mtp.0.e_proj.weight")))
		return 0;
	if (c->nextn_ratio != 0) {
		st_warn("%s: MTP block mtp.0 has compress ratio %d (only 0, window-only attention, is implemented): not loaded",
			ld->s.family, c->nextn_ratio);
		return 0;
	}
	if ((r = load_layer(ld, c->n_layers, "mtp.0", &m->layers[c->n_layers],
			    0)) < 0 ||
	    (r = cw_dsv_ld_fp8(ld, "mtp.0.e_proj", D, D, &t->e_proj)) < 0 ||
	    (r = cw_dsv_ld_fp8(ld, "mtp.0.h_proj", D, D, &t->h_proj)) < 0 ||
	    (r = pvec(ld, "mtp.0", "enorm.weight", D, -1, &t->enorm)) < 0 ||
	    (r = pvec(ld, "mtp.0", "hnorm.weight", D, -1, &t->hnorm)) < 0 ||
	    (r = pvec(ld, "mtp.0", "norm.weight", D, -1, &t->norm)) < 0 ||
	    (r = pvec(ld, "mtp.0", "hc_head_fn", hc, hc * D,
		      &t->hc_head_fn)) < 0 ||
	    (r = pvec(ld, "mtp.0", "hc_head_base", hc, -1,
		      &t->hc_head_base)) < 0 ||
	    (r = pvec(ld, "mtp.0", "hc_head_scale", 1, -1,
		      &t->hc_head_scale)) < 0)
		return r;
	m->has_mtp = 1;
	return 0;
}

/* Tensors a V4.1 text-only model skips by name: the vision tower, the
 * aligner, the DSpark draft layers, the image markers, and the image-span
 * router bias (model doc 3.2 "Skip for text-only decode"). */
static int skipped_v41(const char *name)
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

/* Everything but the routed experts of a store (m->cfg set): global
 * tensors and every layer; a V4.1 checkpoint's tensors not used refused.
 * V4's MTP block from a checkpoint (load_mtp). */
static int load_model(struct cw_dsv_loader *ld, struct cw_dsv_model *m)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult;
	int r;

	ld->c = c;
	m->layers = calloc(c->n_layers + 1, sizeof(*m->layers));
	m->freq_main = calloc(c->rope_dim / 2 + 1, sizeof(double));
	m->freq_comp = calloc(c->rope_dim / 2 + 1, sizeof(double));
	if (!m->layers || !m->freq_main || !m->freq_comp)
		return st_diag_set(ld->s.diag, -ENOMEM, "out of memory");
	cw_dsv_rope_freqs(c, 0, m->freq_main);
	cw_dsv_rope_freqs(c, 1, m->freq_comp);
	if ((r = cw_dsv_src_plain(&ld->s, "embed.weight", c->vocab_size, D,
				  &m->embed)) < 0 ||
	    (r = cw_dsv_src_mat16(&ld->s, "head.weight", c->vocab_size, D,
				  &m->head)) < 0 ||
	    (r = cw_dsv_src_plain(&ld->s, "norm.weight", D, -1,
				  &m->norm)) < 0)
		return r;
	if (c->revision == ST_DSV_REV_V4 &&
	    ((r = cw_dsv_src_plain(&ld->s, "hc_head_fn", hc, hc * D,
				   &m->hc_head_fn)) < 0 ||
	     (r = cw_dsv_src_plain(&ld->s, "hc_head_base", hc, -1,
				   &m->hc_head_base)) < 0 ||
	     (r = cw_dsv_src_plain(&ld->s, "hc_head_scale", 1, -1,
				   &m->hc_head_scale)) < 0))
		return r;
	for (int l = 0; l < c->n_layers; l++) {
		char pfx[32];

		snprintf(pfx, sizeof(pfx), "layers.%d", l);
		if ((r = load_layer(ld, l, pfx, &m->layers[l],
				    m->engram_rows_per_pos)) < 0)
			return r;
	}
	if ((r = load_mtp(ld, m)) < 0)
		return r;
	for (int i = 0; ld->s.used && i < ld->s.ck->n_tensors; i++)
		if (!ld->s.used[i] && !skipped_v41(ld->s.ck->tensors[i].name))
			return st_diag_set(ld->s.diag, -ST_E_FORMAT,
					   "tensor %s is not part of the DeepSeek-V4.1 text model this config describes (a different config or a newer variant?)",
					   ld->s.ck->tensors[i].name);
	return 0;
}

/* A new model in compute mode `mode` (the loader's source set to match);
 * -EINVAL for an unknown mode, -ENOMEM. */
static int model_new(enum cw_compute mode, struct cw_dsv_loader *ld,
		     struct cw_dsv_model **ret, struct st_diag *diag)
{
	struct cw_dsv_model *m;

	if (mode != CW_COMPUTE_REFERENCE && mode != CW_COMPUTE_FAST)
		return st_diag_set(diag, -EINVAL, "unknown compute mode %d",
				   (int)mode);
	m = calloc(1, sizeof(*m));
	if (!m)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	m->compute = mode;
	m->be = mode == CW_COMPUTE_FAST ? cw_backend_cpu_fast() : NULL;
	ld->s.fast = mode == CW_COMPUTE_FAST;
	ld->s.diag = diag;
	*ret = m;
	return 0;
}

/* The revision dir/config.json names (V4.1 by its model_type, anything
 * else V4, whose reader then says what is wrong). */
static enum st_dsv_revision detect_dir(const char *dir)
{
	char path[4096], *text = NULL;
	size_t len;
	enum st_dsv_revision rev = ST_DSV_REV_V4;

	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (st_read_file(path, &text, &len) == 0 &&
	    (st_dsv_config_detect(text) == ST_DSV_REV_V41))
		rev = ST_DSV_REV_V41;
	free(text);
	return rev;
}

/* V4.1 from a checkpoint: the config, the Engram hash (when the config
 * has Engram layers) and their checks; QAT on, Engram rows from memory. */
static int open_v41(const char *dir, struct cw_dsv_model *m,
		    struct st_diag *diag)
{
	char path[4096];
	int r;

	m->prov.get_rows = cw_dsv41_engram_rows_mem;
	m->prov.ctx = m;
	if ((r = st_dsv_config_load(dir, ST_DSV_REV_V41, &m->cfg, diag)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/engram_hash.json", dir);
	if (m->cfg.n_engram &&
	    (r = st_engram_hash_load_json(path, &m->hash, diag)) < 0)
		return r;
	return cw_dsv_check_v41(m, m->cfg.n_engram ? path : dir, diag);
}

int cw_dsv_load(const char *dir, enum st_dsv_revision want,
		enum cw_compute mode, struct cw_dsv_model **ret,
		struct st_diag *diag)
{
	struct cw_dsv_model *m = NULL;
	struct st_checkpoint *ck = NULL;
	struct cw_dsv_loader ld = { 0 };
	enum st_dsv_revision rev = want ? want : detect_dir(dir);
	int r;

	if ((r = model_new(mode, &ld, &m, diag)) < 0)
		return r;
	if (rev == ST_DSV_REV_V41)
		r = open_v41(dir, m, diag);
	else
		r = st_dsv_config_load(dir, ST_DSV_REV_V4, &m->cfg, diag);
	if (r < 0 || (r = st_checkpoint_open(dir, &ck, diag)) < 0)
		goto fail;
	ld.s.ck = ck;
	ld.s.family = family_name(rev);
	if (rev == ST_DSV_REV_V41) { /* every tensor must be used */
		ld.s.used = calloc(ck->n_tensors + 1, 1);
		if (!ld.s.used) {
			r = st_diag_set(diag, -ENOMEM, "out of memory");
			goto fail;
		}
	}
	if ((r = load_model(&ld, m)) < 0)
		goto fail;
	m->qat = cw_dsv_qat_official(m);
	m->v41_decode_ikey_layer = -1;
	free(ld.s.used);
	st_checkpoint_close(ck);
	*ret = m;
	return 0;
fail:
	free(ld.s.used);
	st_checkpoint_close(ck);
	cw_dsv_free(m);
	return r;
}

/* The store's config as m's, for revision want (0: the store's). */
static int store_config(const struct st_store *s, const char *store_dir,
			enum st_dsv_revision want, struct cw_dsv_model *m,
			struct st_diag *diag)
{
	if (s->is_dsv41 && want != ST_DSV_REV_V4) {
		m->cfg = s->dsv41;
		return 0;
	}
	if (s->is_dsv4 && want != ST_DSV_REV_V41) {
		m->cfg = s->dsv4;
		return 0;
	}
	return st_diag_set(diag, -ST_E_UNSUPPORTED, "store %s: not a %s store",
			   store_dir,
			   want ? family_name(want) : "DeepSeek-V4-family");
}

int cw_dsv_load_store(const char *store_dir, struct es_client *es,
		      enum st_dsv_revision want, enum cw_compute mode,
		      struct cw_dsv_model **ret, struct st_diag *diag)
{
	struct cw_dsv_model *m = NULL;
	struct st_store *s = NULL;
	struct cw_dsv_loader ld = { 0 };
	int v41, r;

	if ((r = model_new(mode, &ld, &m, diag)) < 0)
		return r;
	if ((r = st_store_open(store_dir, &s, diag)) < 0 ||
	    (r = store_config(s, store_dir, want, m, diag)) < 0)
		goto out;
	v41 = m->cfg.revision == ST_DSV_REV_V41;
	if (v41) {
		if (m->cfg.n_engram && !s->engram_hash) {
			r = st_diag_set(diag, -ST_E_FORMAT,
					"store %s: no Engram hash (engram_hash.bin): re-run strata convert",
					store_dir);
			goto out;
		}
		m->hash = s->engram_hash; /* taken over from the store */
		s->engram_hash = NULL;
		if ((r = cw_dsv_check_v41(m, store_dir, diag)) < 0)
			goto out;
	}
	/* the record layout of every layer must be the family's MXFP4
	 * experts, and expertd must serve them (V4.1: its Engram tables) */
	if ((r = cw_dsv_check_store_experts(s, m->cfg.hidden_size,
					    m->cfg.moe_inter, diag)) < 0 ||
	    (r = cw_dsv_check_expertd(s, es, m->cfg.top_k, store_dir,
				      diag)) < 0 ||
	    (v41 && (r = cw_dsv_check_engram_es(m, es, store_dir, diag)) < 0) ||
	    (r = cw_dsv_src_map_store(&ld.s, s, diag)) < 0)
		goto out;
	ld.s.diag = diag;
	ld.s.family = family_name(m->cfg.revision);
	m->rec = calloc((size_t)s->n_layers, sizeof(*m->rec));
	if (!m->rec) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	memcpy(m->rec, s->layers, (size_t)s->n_layers * sizeof(*m->rec));
	if ((r = load_model(&ld, m)) < 0)
		goto out;
	m->qat = cw_dsv_qat_official(m);
	m->v41_decode_ikey_layer = -1;
	m->es = es;
	if (v41) {
		m->prov.get_rows = cw_engram_es_get_rows;
		m->prov.ctx = es;
	}
out:
	cw_dsv_src_unmap(&ld.s);
	st_store_close(s);
	if (r < 0) {
		cw_dsv_free(m);
		return r;
	}
	*ret = m;
	return 0;
}

static void free_comp(struct cw_dsv_comp *cp)
{
	cw_dsv_mat_free(&cp->wkv);
	cw_dsv_mat_free(&cp->wgate);
	free(cp->ape);
	free(cp->norm);
}

static void free_layer(struct cw_dsv_layer *L, int n_experts)
{
	struct cw_dsv_mat *mats[] = {
		&L->wq_a, &L->wq_b, &L->wkv, &L->wo_a, &L->wo_b, &L->cwkv,
		&L->cwgate, &L->iwk, &L->iwq_b, &L->iweights, &L->gate,
		&L->sh_w1, &L->sh_w2, &L->sh_w3, &L->ewkv,
	};
	float *vecs[] = {
		L->attn_norm, L->ffn_norm, L->hc_attn_fn, L->hc_attn_base,
		L->hc_attn_scale, L->hc_ffn_fn, L->hc_ffn_base,
		L->hc_ffn_scale, L->q_norm, L->kv_norm, L->sink, L->cnorm,
		L->iknorm, L->gate_bias, L->eqk,
	};

	for (size_t i = 0; i < sizeof(mats) / sizeof(mats[0]); i++)
		cw_dsv_mat_free(mats[i]);
	for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
		free(vecs[i]);
	free_comp(&L->comp);
	free_comp(&L->icomp);
	free(L->tid2eid);
	for (int e = 0; e < n_experts; e++) {
		if (L->ew1)
			cw_dsv_mat_free(&L->ew1[e]);
		if (L->ew2)
			cw_dsv_mat_free(&L->ew2[e]);
		if (L->ew3)
			cw_dsv_mat_free(&L->ew3[e]);
	}
	free(L->ew1);
	free(L->ew2);
	free(L->ew3);
	free(L->etab);
	free(L->escale);
}

void cw_dsv_free(struct cw_dsv_model *m)
{
	if (!m)
		return;
	for (int l = 0; m->layers && l <= m->cfg.n_layers; l++)
		free_layer(&m->layers[l], m->cfg.n_experts);
	free(m->layers);
	cw_dsv_mat_free(&m->mtp.e_proj);
	cw_dsv_mat_free(&m->mtp.h_proj);
	free(m->mtp.enorm);
	free(m->mtp.hnorm);
	free(m->mtp.norm);
	free(m->mtp.hc_head_fn);
	free(m->mtp.hc_head_base);
	free(m->mtp.hc_head_scale);
	free(m->embed);
	cw_dsv_mat_free(&m->head);
	free(m->norm);
	free(m->hc_head_fn);
	free(m->hc_head_base);
	free(m->hc_head_scale);
	free(m->freq_main);
	free(m->freq_comp);
	st_engram_hash_free(m->hash);
	cw_threads_destroy(m->pool);
	free(m->rec);
	free(m);
}

const struct st_dsv_config *cw_dsv_config(const struct cw_dsv_model *m)
{
	return &m->cfg;
}

enum cw_compute cw_dsv_compute(const struct cw_dsv_model *m)
{
	return m->compute;
}

int cw_dsv_set_qat(struct cw_dsv_model *m, unsigned flags)
{
	int d = m->cfg.index_head_dim;

	if (m->cfg.revision == ST_DSV_REV_V41) {
		if (flags & ~(unsigned)CW_DSV41_QAT_OFFICIAL)
			return -EINVAL;
		m->qat = flags;
		return 0;
	}
	if (flags & ~(unsigned)CW_DSV4_QAT_OFFICIAL)
		return -EINVAL;
	if ((flags & CW_DSV4_QAT_INDEX_FP4) && (d & (d - 1)))
		return -ST_E_UNSUPPORTED; /* Hadamard needs a power of two */
	m->qat = flags;
	return 0;
}

int cw_dsv41_set_decode_index_keys(struct cw_dsv_model *m, int mode)
{
	int last = -1;

	if (m->cfg.revision != ST_DSV_REV_V41 ||
	    (mode != CW_DSV41_DECODE_IKEYS_OWN &&
	     mode != CW_DSV41_DECODE_IKEYS_LAST_SOURCE))
		return -EINVAL;
	for (int l = 0; l < m->cfg.n_layers; l++)
		if (m->cfg.kv_source[l])
			last = l;
	m->v41_decode_ikey_layer =
		mode == CW_DSV41_DECODE_IKEYS_LAST_SOURCE ? last : -1;
	return 0;
}

unsigned cw_dsv_qat(const struct cw_dsv_model *m)
{
	return m->qat;
}

unsigned cw_dsv_qat_official(const struct cw_dsv_model *m)
{
	int d = m->cfg.index_head_dim;

	if (m->cfg.revision == ST_DSV_REV_V41)
		return CW_DSV41_QAT_OFFICIAL;
	/* the official rotate_activation needs a power of two; a config
	 * without one (none released) keeps the other trips */
	if (d & (d - 1))
		return CW_DSV4_QAT_OFFICIAL & ~(unsigned)CW_DSV4_QAT_INDEX_FP4;
	return CW_DSV4_QAT_OFFICIAL;
}

const char *cw_dsv_math_name(const struct cw_dsv_model *m)
{
	if (!m->qat)
		return "exact";
	return m->qat == cw_dsv_qat_official(m) ? "official" : "custom";
}

int cw_dsv_set_backend(struct cw_dsv_model *m,
		       const struct cw_backend_ops *be)
{
	if (m->compute != CW_COMPUTE_FAST || !be)
		return -EINVAL;
	m->be = be;
	return 0;
}

int cw_dsv_set_prefetch_depth(struct cw_dsv_model *m, int depth)
{
	if (depth < 0 || depth > 8)
		return -EINVAL;
	m->prefetch_depth = depth;
	return 0;
}

void cw_dsv_set_route_reports(struct cw_dsv_model *m, int on)
{
	m->no_route_reports = !on;
}

void cw_dsv_set_layer_hints(struct cw_dsv_model *m, int on)
{
	m->no_layer_hints = !on;
}

void cw_dsv_set_expert_overlap(struct cw_dsv_model *m, int on)
{
	m->no_expert_overlap = !on;
}

void cw_dsv_set_decode_overlap(struct cw_dsv_model *m, int step_hints,
			       int expert_overlap)
{
	m->no_step_hints = !step_hints;
	m->no_expert_overlap = !expert_overlap;
}

int cw_dsv41_set_threads(struct cw_dsv_model *m, int n_threads)
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
