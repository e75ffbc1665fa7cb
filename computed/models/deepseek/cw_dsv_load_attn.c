/*
 * cw_dsv_load_attn.c — what each revision's attention loads of its own
 * (see cw_dsv_load.h): V4's compressors (CSA ratio 4 with overlap, HCA)
 * and CSA indexer, V4's hash-routing table, V4.1's CSA2 KV and index
 * sources.  Names: MODEL_FAMILY_DEEPSEEK_V4.md 2.3 and 3.2.
 */
#include "cw_dsv_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One V4 compressor (main or indexer).  CSA (ratio 4, overlap): wkv and
 * wgate give 2*width values per token; HCA: width. */
static int load_comp(struct cw_dsv_loader *ld, int l, const char *pfx,
		     int ratio, int width, struct cw_dsv_comp *cp)
{
	const int D = ld->c->hidden_size;
	int cols = ratio == 4 ? 2 * width : width;
	char name[256];
	int r;

	cp->ratio = ratio;
	cp->overlap = ratio == 4;
	cp->width = width;
	snprintf(name, sizeof(name), "layers.%%d.%s.wkv.weight", pfx);
	if ((r = cw_dsv_ld_mat16(ld, name, l, cols, D, &cp->wkv)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%%d.%s.wgate.weight", pfx);
	if ((r = cw_dsv_ld_mat16(ld, name, l, cols, D, &cp->wgate)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%%d.%s.ape", pfx);
	if ((r = cw_dsv_ld_vec(ld, name, l, ratio, cols, &cp->ape)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%%d.%s.norm.weight", pfx);
	return cw_dsv_ld_vec(ld, name, l, width, -1, &cp->norm);
}

int cw_dsv_load_attn_v4(struct cw_dsv_loader *ld, int l,
			struct cw_dsv_layer *L)
{
	const struct st_dsv_config *c = ld->c;
	char p[256];
	int r;

	if (L->ratio &&
	    (r = load_comp(ld, l, "attn.compressor", L->ratio, c->head_dim,
			   &L->comp)) < 0)
		return r;
	L->has_indexer = L->ratio == 4;
	if (!L->has_indexer)
		return 0;
	if ((r = load_comp(ld, l, "attn.indexer.compressor", 4,
			   c->index_head_dim, &L->icomp)) < 0)
		return r;
	snprintf(p, sizeof(p), "layers.%d.attn.indexer.wq_b", l);
	if ((r = cw_dsv_ld_fp8(ld, p, c->index_n_heads * c->index_head_dim,
			       c->q_lora_rank, &L->iwq_b)) < 0)
		return r;
	return cw_dsv_ld_mat_plain(ld,
				   "layers.%d.attn.indexer.weights_proj.weight",
				   l, c->index_n_heads, c->hidden_size,
				   &L->iweights);
}

int cw_dsv_load_tid2eid(struct cw_dsv_loader *ld, int l,
			struct cw_dsv_layer *L)
{
	const struct st_dsv_config *c = ld->c;
	const struct st_tensor_info *t;
	const uint8_t *d;
	char name[128];
	size_t n = (size_t)c->vocab_size * c->top_k;
	int r;

	snprintf(name, sizeof(name), "layers.%d.ffn.gate.tid2eid", l);
	if ((r = cw_dsv_src_find(&ld->s, name, ST_DTYPE_I64, c->vocab_size,
				 c->top_k, &t, (const void **)&d)) < 0)
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

int cw_dsv_load_attn_v41(struct cw_dsv_loader *ld, int l,
			 struct cw_dsv_layer *L)
{
	const struct st_dsv_config *c = ld->c;
	const int D = c->hidden_size, hd = c->head_dim, Id = c->index_head_dim;
	char p[256];
	int r;

	if (c->kv_source[l]) {
		if ((r = cw_dsv_ld_mat16(ld, "layers.%d.attn.compressor.wkv.weight",
					 l, hd, D, &L->cwkv)) < 0 ||
		    (L->ratio > 1 &&
		     (r = cw_dsv_ld_mat16(ld, "layers.%d.attn.compressor.wgate.weight",
					  l, hd, D, &L->cwgate)) < 0) ||
		    (r = cw_dsv_ld_vec(ld, "layers.%d.attn.compressor.norm.weight",
				       l, hd, -1, &L->cnorm)) < 0 ||
		    (r = cw_dsv_ld_mat16(ld, "layers.%d.attn.indexer.wk.weight",
					 l, Id, hd, &L->iwk)) < 0 ||
		    (r = cw_dsv_ld_vec(ld, "layers.%d.attn.indexer.k_norm.weight",
				       l, Id, -1, &L->iknorm)) < 0)
			return r;
	}
	if (!c->index_source[l])
		return 0;
	snprintf(p, sizeof(p), "layers.%d.attn.indexer.wq_b", l);
	if ((r = cw_dsv_ld_fp8(ld, p, c->index_n_heads * Id, c->q_lora_rank,
			       &L->iwq_b)) < 0)
		return r;
	return cw_dsv_ld_mat_plain(ld,
				   "layers.%d.attn.indexer.weights_proj.weight",
				   l, c->index_n_heads, D, &L->iweights);
}

int cw_dsv4_hash_experts(const struct cw_dsv_model *m, int layer,
			 int32_t token, int32_t *ids)
{
	const struct st_dsv_config *c = &m->cfg;
	const struct cw_dsv_layer *L;

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
