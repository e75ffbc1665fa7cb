/*
 * cw_dsv_load.h — the family loader's pieces (private to cw_dsv_load*.c):
 * the loader state, the formatted-name helpers over its tensor source
 * (cw_dsv_tensors.h), and what each revision loads of its own: V4's
 * compressors, indexer and hash-routing table, V4.1's CSA2 KV and index
 * sources (cw_dsv_load_attn.c), V4.1's Engram (cw_dsv_load_engram.c).
 * Tensor names and formats: MODEL_FAMILY_DEEPSEEK_V4.md 2.3 (V4) and 3.2
 * (V4.1).
 */
#ifndef CW_DSV_LOAD_H
#define CW_DSV_LOAD_H

#include <stdint.h>

#include "cw_dsv_int.h"
#include "cw_dsv_tensors.h"

/* The loader: its tensor source (with the used flags of the checkpoint's
 * tensors where the revision refuses unused ones) and the config the
 * shapes come from (borrowed). */
struct cw_dsv_loader {
	struct cw_dsv_src s;
	const struct st_dsv_config *c;
};

/* The F32 vector or matrix named fmt with the layer l put in ([d0] or
 * [d0][d1]; d1 -1 for a vector) into *ret (malloc'd, the caller's).
 * Errors: cw_dsv_src_plain's. */
int cw_dsv_ld_vec(struct cw_dsv_loader *ld, const char *fmt, int l,
		  int64_t d0, int64_t d1, float **ret);
/* FP8 matrix prefix (".weight" + ".scale") [rows][cols] in the config's
 * blocks (cw_dsv_src_fp8) into m. */
int cw_dsv_ld_fp8(struct cw_dsv_loader *ld, const char *prefix, int rows,
		  int cols, struct cw_dsv_mat *m);
/* BF16/F32 matrix fmt (layer l put in) [rows][cols], kept BF16 in fast
 * mode (cw_dsv_src_mat16). */
int cw_dsv_ld_mat16(struct cw_dsv_loader *ld, const char *fmt, int l,
		    int rows, int cols, struct cw_dsv_mat *m);
/* BF16/F32 matrix fmt (layer l put in) [rows][cols], always F32
 * (cw_dsv_src_mat_plain: routers, indexer head weights). */
int cw_dsv_ld_mat_plain(struct cw_dsv_loader *ld, const char *fmt, int l,
			int rows, int cols, struct cw_dsv_mat *m);

/* V4 layer l's compressor (ratio != 0) and, at ratio 4 (CSA), its
 * indexer: compressor, wq_b, weights_proj (cw_dsv_load_attn.c). */
int cw_dsv_load_attn_v4(struct cw_dsv_loader *ld, int l,
			struct cw_dsv_layer *L);
/* V4 hash layer l's tid2eid [vocab][top_k] (I64, each id checked <
 * n_experts) into L->tid2eid.  Errors: -ST_E_FORMAT naming the entry,
 * -ENOMEM, the source's. */
int cw_dsv_load_tid2eid(struct cw_dsv_loader *ld, int l,
			struct cw_dsv_layer *L);
/* V4.1 layer l's CSA2 roles: as a KV source its compressor (wgate only at
 * ratio > 1), norm and index key projection; as an index source the
 * indexer's wq_b and weights_proj. */
int cw_dsv_load_attn_v41(struct cw_dsv_loader *ld, int l,
			 struct cw_dsv_layer *L);

/* V4.1 Engram layer l (index ei): the FP8 table with per-row scales (not
 * from a store: expertd's Engram tier serves it), wkv [(hc+1) D]
 * [rows_per_pos * head_dim], q_weight * k_weight (cw_dsv_load_engram.c).
 * Errors: -ST_E_CONFIG (engram_head_dim not a multiple of 32), the
 * source's, -ENOMEM. */
int cw_dsv_load_engram(struct cw_dsv_loader *ld, int l, int ei,
		       struct cw_dsv_layer *L, int rows_per_pos);
/* V4.1: the Engram hash (m->hash, loaded from `source`) against the
 * config (sets m->engram_rows_per_pos), and the QAT blocks against the
 * head dims.  Errors: -ST_E_CONFIG naming source. */
int cw_dsv_check_v41(struct cw_dsv_model *m, const char *source,
		     struct st_diag *diag);
/* V4.1 store mode: expertd (es) must serve the store's Engram tables (the
 * model's layers, rows and head_dim).  Errors: es_client_engram_info's,
 * -ST_E_CONFIG naming store_dir. */
int cw_dsv_check_engram_es(const struct cw_dsv_model *m,
			   struct es_client *es, const char *store_dir,
			   struct st_diag *diag);

#endif
