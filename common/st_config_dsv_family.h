/*
 * st_config_dsv_family.h — the one configuration struct of the
 * DeepSeek-V4 family (../shared/MODEL_FAMILY_DEEPSEEK_V4.md sections 2.1
 * and 3.1): the fields every revision has, then each revision's own,
 * with `revision` saying which reader filled it.  V4's flat config.json
 * is read by st_dsv4_config_parse (st_config_dsv4.h), V4.1's composite
 * one (text_config) by st_dsv41_config_parse (st_config_dsv41.h); both
 * fill this struct, so the loader, forward pass and store code of the
 * family take one type and switch on the revision where a revision
 * differs.  A field a revision does not have is zero (candidate_source:
 * -1).
 */
#ifndef ST_CONFIG_DSV_FAMILY_H
#define ST_CONFIG_DSV_FAMILY_H

#include <stdint.h>

#define ST_DSV_MAX_LAYERS 128
#define ST_DSV_MAX_ENGRAM 16

/* Which release of the family a config describes (its model_type). */
enum st_dsv_revision {
	ST_DSV_REV_V4 = 1,   /* "deepseek_v4" */
	ST_DSV_REV_V41 = 2,  /* "deepseek_v41", "deepseek_v4.1" */
};

struct st_dsv_config {
	enum st_dsv_revision revision;
	/* ---- every revision ---- */
	int hidden_size;          /* D */
	int n_layers;             /* num_hidden_layers (MTP / DSpark not counted) */
	int n_nextn;              /* num_nextn_predict_layers (skipped) */
	int vocab_size;
	int n_heads;              /* num_attention_heads */
	int head_dim;             /* width of the single K=V latent and of a q head */
	int rope_dim;             /* qk_rope_head_dim: the last rope_dim dims are roped */
	int q_lora_rank;
	int o_groups, o_lora_rank;
	int sliding_window;       /* rows visible: the current one and W-1 before */
	/* per layer.  V4: 0 window only, 4 CSA, else HCA.  V4.1: 0 window
	 * only, 1 full-resolution (CED decoder), r > 1 r tokens pooled (CED
	 * encoder) */
	int compress_ratio[ST_DSV_MAX_LAYERS];
	int index_n_heads, index_head_dim, index_topk;
	int n_experts, top_k, n_shared, moe_inter;
	int norm_topk_prob;
	double routed_scaling_factor;
	double swiglu_limit;
	int hc_mult, hc_sinkhorn_iters;
	double hc_eps, rms_norm_eps;
	double rope_theta, compress_rope_theta;
	/* YaRN of the compress rope (rope_scaling) */
	double yarn_factor, yarn_beta_fast, yarn_beta_slow;
	int yarn_orig_max_pos;
	int max_position_embeddings;
	int fp8_block[2];         /* quantization_config.weight_block_size [out, in] */
	int bos_token_id, eos_token_id;
	/* ---- V4 ---- */
	int n_hash_layers;        /* layers [0, n) route by tid2eid */
	/* ---- V4.1 ---- */
	/* per layer roles (1/0), from kv_source_layer_ids,
	 * index_source_layer_ids, candidate_source_layer_id */
	unsigned char kv_source[ST_DSV_MAX_LAYERS];
	unsigned char index_source[ST_DSV_MAX_LAYERS];
	int candidate_source;     /* layer id, -1 when none */
	int candidate_topk_blocks, candidate_block_size; /* entries per block */
	double gate_temp;
	/* Engram */
	int n_engram;                        /* entries of engram_layer_ids */
	int engram_layer[ST_DSV_MAX_ENGRAM];
	int64_t engram_rows[ST_DSV_MAX_ENGRAM]; /* engram_num_embeddings */
	int engram_vocab_size, engram_n_heads, engram_head_dim;
	int engram_max_ngram;                /* engram_max_ngram_size */
	int engram_pad_id;
	int engram_compressed_vocab;
	int pad_token_id, image_token_id;
};

#endif
