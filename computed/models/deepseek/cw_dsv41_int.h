/*
 * cw_dsv41_int.h — the DeepSeek-V4.1 model's in-memory weights (private
 * to cw_dsv41*.c).  Matrices are row-major [rows][cols] (struct
 * cw_dsv4_mat): dequantised F32 in reference mode; in fast mode the FP8
 * ones stay E4M3 codes with expanded scales and the BF16 ones the fast
 * kernels multiply (compressor, index key projection, LM head) BF16.
 * Engram tables stay FP8 (row bytes + scales).
 */
#ifndef CW_DSV41_INT_H
#define CW_DSV41_INT_H

#include <stdint.h>

#include "cw_dsv41.h"
#include "cw_dsv4_int.h"
#include "st_engram_hash.h"
#include "st_store.h"

struct cw_dsv41_layer {
	int ratio;                  /* 0 window only, 1, or r > 1 pooled */
	int kv_src, idx_src;        /* layers whose KV / top-k it uses, -1 */
	float *attn_norm, *ffn_norm;
	float *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
	float *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
	struct cw_dsv4_mat wq_a, wq_b, wkv, wo_a, wo_b;
	float *q_norm, *kv_norm, *sink;
	/* KV source: compressor (wgate only at ratio > 1) and index keys */
	struct cw_dsv4_mat cwkv, cwgate, iwk;
	float *cnorm, *iknorm;
	/* index source */
	struct cw_dsv4_mat iwq_b, iweights;
	struct cw_dsv4_mat gate;
	float *gate_bias;
	struct cw_dsv4_mat sh_w1, sh_w2, sh_w3;
	struct cw_dsv4_mat *ew1, *ew2, *ew3; /* [n_experts] */
	/* Engram (ei >= 0): table FP8 [rows][head_dim] + E8M0
	 * [rows][head_dim / 32], wkv [(hc+1) D][rows_per_pos * head_dim],
	 * qk = q_weight * k_weight [hc][D] */
	int ei;
	uint8_t *etab, *escale;
	int64_t erows;
	struct cw_dsv4_mat ewkv;
	float *eqk;
};

struct cw_dsv41_model {
	struct st_dsv41_config cfg;
	float *embed, *norm;           /* [vocab][D], [D] */
	struct cw_dsv4_mat head;       /* [vocab][D] (fast mode: BF16) */
	struct cw_dsv41_layer *layers;
	double *freq_main, *freq_comp; /* [rope_dim/2] */
	unsigned qat;                  /* CW_DSV41_QAT_* */
	struct st_engram_hash *hash;   /* NULL without Engram layers */
	int engram_rows_per_pos;
	struct cw_dsv41_engram_provider prov;
	/* store mode (cw_dsv41_load_store): the routed experts come from
	 * expertd's pool, Engram rows from its Engram tier */
	struct es_client *es;          /* borrowed; NULL: in memory */
	struct st_store_layer *rec;    /* [n_layers] expert record layouts */
	int no_route_reports;          /* measurements only */
	int no_engram_prefetch;        /* measurements only */
	int no_step_hints;             /* cw_dsv41_set_decode_overlap */
	int no_expert_overlap;         /* cw_dsv41_set_decode_overlap */
	int no_layer_hints;            /* cw_dsv41_set_layer_hints */
	int prefetch_depth;            /* cw_dsv41_set_prefetch_depth */
	/* CW_COMPUTE_FAST (cw_dsv41_load_mode / _store_mode): matvecs on
	 * the backend be (NULL in reference mode) */
	enum cw_compute compute;
	const struct cw_backend_ops *be;
	struct cw_threads *pool;       /* fast mode: cw_dsv41_set_threads */
};

#endif
