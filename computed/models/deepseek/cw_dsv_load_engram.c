/*
 * cw_dsv_load_engram.c — V4.1's Engram on the model side: its layers'
 * weights (cw_dsv_load.h), the checks of the hash and of expertd's tables
 * against the config, and where the rows come from (the in-memory table
 * or a provider; MODEL_FAMILY_DEEPSEEK_V4.md 3.5).
 */
#include "cw_dsv_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_engram_es.h"
#include "es_client.h"
#include "st_engram_hash.h"
#include "st_formats.h"

int cw_dsv_load_engram(struct cw_dsv_loader *ld, int l, int ei,
		       struct cw_dsv_layer *L, int rows_per_pos)
{
	const struct st_dsv_config *c = ld->c;
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
	if ((r = cw_dsv_src_find(&ld->s, name, ST_DTYPE_F8_E4M3, L->erows, hd,
				 &tw, &w)) < 0)
		return r;
	snprintf(name, sizeof(name), "layers.%d.engram.embed.scale", l);
	if ((r = cw_dsv_src_find(&ld->s, name, ST_DTYPE_F8_E8M0, L->erows,
				 hd / 32, &ts, &s)) < 0 ||
	    (r = cw_dsv_src_check_scales(&ld->s, name, s, ts->n_elems)) < 0)
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
	if ((r = cw_dsv_ld_fp8(ld, name, (hc + 1) * D, rows_per_pos * hd,
			       &L->ewkv)) < 0 ||
	    (r = cw_dsv_ld_vec(ld, "layers.%d.engram.q_weight", l, hc, D,
			       &qw)) < 0 ||
	    (r = cw_dsv_ld_vec(ld, "layers.%d.engram.k_weight", l, hc, D,
			       &kw)) < 0)
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

int cw_dsv_check_v41(struct cw_dsv_model *m, const char *source,
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

int cw_dsv_check_engram_es(const struct cw_dsv_model *m,
			   struct es_client *es, const char *store_dir,
			   struct st_diag *diag)
{
	struct es_engram_info ei;
	int r;

	if (!m->cfg.n_engram)
		return 0;
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

int cw_dsv41_engram_rows_mem(void *ctx, int ei, const int64_t *row_ids,
			     int n, float *out, struct st_diag *diag)
{
	const struct cw_dsv_model *m = ctx;
	const int hd = m->cfg.engram_head_dim;
	const struct cw_dsv_layer *L = &m->layers[m->cfg.engram_layer[ei]];

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

void cw_dsv41_set_engram_provider(struct cw_dsv_model *m,
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

void cw_dsv41_set_engram_prefetch(struct cw_dsv_model *m, int on)
{
	m->no_engram_prefetch = !on;
}
