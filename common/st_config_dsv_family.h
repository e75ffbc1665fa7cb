/*
 * st_config_dsv_family.h — the one configuration of the DeepSeek-V4
 * family (../shared/MODEL_FAMILY_DEEPSEEK_V4.md sections 2.1 and 3.1):
 * the struct, with the fields every revision has, then each revision's
 * own, `revision` saying which release it describes; and its one reader
 * (st_config_dsv_read.c) of V4's flat config.json and V4.1's composite
 * one (text_config).  The loader, forward pass and store code of the
 * family take this one type and switch on the revision where a revision
 * differs.  A field a revision does not have is zero (candidate_source:
 * -1).  What only V4.1 has (its layer roles, store checks, Engram index)
 * is declared in st_config_dsv41.h.
 */
#ifndef ST_CONFIG_DSV_FAMILY_H
#define ST_CONFIG_DSV_FAMILY_H

#include <stdint.h>

#include "st_config.h"
#include "st_error.h"

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
	int n_nextn;              /* num_nextn_predict_layers: V4's MTP
				   * block(s) mtp.N.* (V4.1: DSpark, skipped) */
	int nextn_ratio;          /* compress_ratios[n_layers]: the first MTP
				   * block's (0: window only, as released) */
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

/*
 * Parses config.json text (NUL-terminated; `source` names it in
 * messages) of revision want, or (want 0) of the revision its model_type
 * names (anything but V4.1's is read as V4, whose checks then say what is
 * wrong).  Every key of the model object (V4: the file; V4.1:
 * text_config) is used or known to be irrelevant; any other is refused
 * (-ST_E_CONFIG naming it), so a changed release does not load silently
 * wrong; missing keys: -ST_E_CONFIG naming the key.  Validates, for every
 * revision: model_type; num_key_value_heads 1; n_shared_experts 1;
 * scoring_func "sqrtsoftplus", topk_method "noaux_tc", hidden_act "silu"
 * (V4.1: when present); rope_scaling YaRN; tie_word_embeddings false;
 * compress_ratios with num_hidden_layers + num_nextn_predict_layers
 * entries (V4: each 0, 4 or a multiple of 4; V4.1: 0, 1 or a pooling
 * ratio); heads divisible by o_groups; rope_dim even and <= head_dim and
 * index_head_dim; quantization_config's FP8 format and block size.  V4.1
 * also: the composite top level, gate_temp > 0, the CSA2 layer roles
 * (every non-zero-ratio layer has a preceding (or own) KV source of the
 * same ratio and a preceding index source; KV sources are index sources;
 * the candidate source an index source of ratio 1), Engram layers in
 * range, engram_pad_id and engram_pad_token_id agreeing.
 * Returns 0, -ST_E_FORMAT (not JSON), -ST_E_CONFIG, -ST_E_UNSUPPORTED,
 * -ST_E_LIMIT (more than ST_DSV_MAX_LAYERS layers), -EINVAL (want not a
 * revision).
 */
int st_dsv_config_parse(const char *text, const char *source,
			enum st_dsv_revision want, struct st_dsv_config *ret,
			struct st_diag *diag);

/* Reads <dir>/config.json and parses it (st_dsv_config_parse).  Errors
 * as there, plus -errno reading the file. */
int st_dsv_config_load(const char *dir, enum st_dsv_revision want,
		       struct st_dsv_config *ret, struct st_diag *diag);

/* The revision config.json text names by its model_type ("deepseek_v4";
 * "deepseek_v41" or "deepseek_v4.1"), or 0 (another model, or not JSON:
 * the parser then says what is wrong).  Lets the store writer and reader
 * pick the family's path before parsing. */
enum st_dsv_revision st_dsv_config_detect(const char *text);

/*
 * The routed-expert geometry in the form the store's record layout and
 * expertd read (struct st_model_config, zeroed first): model_type (the
 * revision's), hidden_size, n_layers, vocab_size, n_experts, top_k,
 * expert_inter (moe_intermediate_size), max_position_embeddings, heads
 * (n_kv_heads 1: one shared K=V latent), BOS and the one EOS id; V4 also
 * norm_topk_prob, rms_norm_eps, rope_theta.  arch 0: no Mixtral / Qwen3
 * dense tensor roles (st_dense_tensor_name is not for this family).
 */
void st_dsv_expert_config(const struct st_dsv_config *c,
			  struct st_model_config *ret);

#endif
