/*
 * st_config_dsv41.h — the DeepSeek-V4.1-Flash text configuration
 * (DeepseekV41ForCausalLM, model_type "deepseek_v41"), read from its
 * composite config.json: top-level ids and quantization_config, the text
 * model in "text_config" (key set: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md
 * section 3.1).  vision_config is accepted and ignored (text-only).
 *
 * Kept apart from st_dsv4_config: V4.1's CSA2 layer roles (KV / index /
 * candidate sources), Engram and gate_temp have no V4 counterpart.
 *
 * The one reader of a V4.1 config.json: the forward pass, the store writer
 * (expertd/convert/), the store reader (st_store.c, which keeps the
 * parsed config in struct st_store.dsv41) and the CLI all parse it here.
 */
#ifndef ST_CONFIG_DSV41_H
#define ST_CONFIG_DSV41_H

#include <stdint.h>

#include "st_config.h"
#include "st_error.h"

#define ST_DSV41_MAX_LAYERS 128
#define ST_DSV41_CONFIG_MAX_ENGRAM 16

struct st_dsv41_config {
	int hidden_size;          /* D */
	int n_layers;             /* num_hidden_layers (DSpark layers not counted) */
	int n_nextn;              /* num_nextn_predict_layers (DSpark, skipped) */
	int vocab_size;
	int n_heads, head_dim, rope_dim;  /* rope on the last rope_dim dims */
	int q_lora_rank, o_groups, o_lora_rank;
	int sliding_window;       /* rows visible: the current one and W-1 before */
	/* per layer: 0 window only, 1 full-resolution (CED decoder), r > 1
	 * r tokens pooled (CED encoder) */
	int compress_ratio[ST_DSV41_MAX_LAYERS];
	/* per layer roles (1/0), from kv_source_layer_ids,
	 * index_source_layer_ids, candidate_source_layer_id */
	unsigned char kv_source[ST_DSV41_MAX_LAYERS];
	unsigned char index_source[ST_DSV41_MAX_LAYERS];
	int candidate_source;     /* layer id, -1 when none */
	int candidate_topk_blocks, candidate_block_size; /* entries per block */
	int index_n_heads, index_head_dim, index_topk;
	int n_experts, top_k, n_shared, moe_inter;
	int norm_topk_prob;
	double routed_scaling_factor, gate_temp, swiglu_limit;
	int hc_mult, hc_sinkhorn_iters;
	double hc_eps, rms_norm_eps;
	double rope_theta, compress_rope_theta;
	double yarn_factor, yarn_beta_fast, yarn_beta_slow; /* compress rope */
	int yarn_orig_max_pos;
	int max_position_embeddings;
	/* Engram */
	int n_engram;                        /* entries of engram_layer_ids */
	int engram_layer[ST_DSV41_CONFIG_MAX_ENGRAM];
	int64_t engram_rows[ST_DSV41_CONFIG_MAX_ENGRAM]; /* engram_num_embeddings */
	int engram_vocab_size, engram_n_heads, engram_head_dim;
	int engram_max_ngram;                /* engram_max_ngram_size */
	int engram_pad_id;
	int engram_compressed_vocab;
	int fp8_block[2];         /* quantization_config.weight_block_size */
	int bos_token_id, eos_token_id, pad_token_id, image_token_id;
};

/*
 * Parses V4.1 config.json text (NUL-terminated); `source` names it in
 * messages.  Top level: architectures, model_type "deepseek_v41", ids,
 * quantization_config (fmt e4m3 / scale_fmt ue8m0 when present, block
 * size), text_config (required), vision_config (ignored).  Every
 * text_config key is used or known to be irrelevant; an unknown key is
 * refused with -ST_E_CONFIG naming it, so a changed release does not load
 * silently wrong.  Validates the layer roles: every non-zero-ratio layer
 * has a preceding (or own) KV source of the same ratio and a preceding
 * index source; KV sources are index sources; the candidate source is an
 * index source of ratio 1; engram layers in range; engram_pad_id and
 * engram_pad_token_id (both spellings accepted) agree.
 * Returns 0, -ST_E_FORMAT (not JSON), -ST_E_CONFIG, -ST_E_UNSUPPORTED,
 * -ST_E_LIMIT (more than ST_DSV41_MAX_LAYERS layers).
 */
int st_dsv41_config_parse(const char *text, const char *source,
			  struct st_dsv41_config *ret, struct st_diag *diag);

/* Reads <dir>/config.json and parses it.  Errors as there, plus -errno
 * reading the file. */
int st_dsv41_config_load(const char *dir, struct st_dsv41_config *ret,
			 struct st_diag *diag);

/* 1 if config.json text names a DeepSeek-V4.1 model (model_type
 * "deepseek_v41" or "deepseek_v4.1"), else 0. */
int st_dsv41_config_detect(const char *text);

/* The layer whose compressed KV layer l attends to (the nearest KV source
 * at or before l), -1 for a window-only layer. */
int st_dsv41_kv_source_of(const struct st_dsv41_config *c, int l);

/* The layer whose indexer top-k layer l uses (nearest index source at or
 * before l), -1 for a window-only layer. */
int st_dsv41_index_source_of(const struct st_dsv41_config *c, int l);

/* The last KV-source layer (-1 if none): layers after it own only window
 * KV (the CED decoder, model doc 3.4). */
int st_dsv41_last_kv_source(const struct st_dsv41_config *c);

/*
 * What a strata store of this model needs on top of st_dsv41_config_parse
 * (the store writer and reader call it; the forward pass does not need
 * it): hidden_size and moe_intermediate_size multiples of 32 (MXFP4
 * experts: one E8M0 scale per 32 inputs), engram_head_dim a multiple of 32
 * (one E8M0 scale per 32 columns of a table row), engram_layer_ids
 * strictly increasing (the order of the tables in engram.bin) and each
 * engram_num_embeddings at most 2^40 rows.  `source` names the config in
 * messages.  Returns 0 or -ST_E_CONFIG naming the key.
 */
int st_dsv41_config_check_store(const struct st_dsv41_config *c,
				const char *source, struct st_diag *diag);

/*
 * The routed-expert geometry in the form the store's record layout and
 * expertd read (struct st_model_config, zeroed first): model_type
 * "deepseek_v41", hidden_size, n_layers, vocab_size, n_experts, top_k,
 * expert_inter (moe_intermediate_size), max_position_embeddings, heads
 * (n_kv_heads 1: one shared K=V latent), BOS and the one EOS id.  arch 0:
 * no Mixtral / Qwen3 dense tensor roles.
 */
void st_dsv41_expert_config(const struct st_dsv41_config *c,
			    struct st_model_config *ret);

/* Index of model layer `layer` among the Engram layers
 * (c->engram_layer[]), or -1 if it has no Engram. */
int st_dsv41_engram_index(const struct st_dsv41_config *c, int layer);

#endif
