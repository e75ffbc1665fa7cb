/*
 * st_dsv41_geom.h — what the store needs from a DeepSeek-V4.1 config.json
 * (model_type "deepseek_v41", DeepseekV41ForCausalLM; composite file with
 * text_config, ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 3.1): the
 * routed-expert geometry, the FP8 block, and the Engram tables.
 *
 * Only the store writer and reader use this; the forward pass has its own,
 * complete V4.1 config parser.  Keys the store does not need are ignored
 * here (the full parser judges them).
 */
#ifndef ST_DSV41_GEOM_H
#define ST_DSV41_GEOM_H

#include <stdint.h>

#include "st_config.h"
#include "st_error.h"

#define ST_DSV41_MAX_ENGRAM 16

struct st_dsv41_geom {
	int hidden_size;
	int n_layers;             /* num_hidden_layers (DSpark layers not counted) */
	int n_nextn;              /* num_nextn_predict_layers (DSpark, skipped) */
	int vocab_size;
	int n_heads, head_dim;    /* num_attention_heads, head_dim */
	int n_experts, top_k, moe_inter, n_shared;
	int fp8_block[2];         /* quantization_config.weight_block_size */
	int bos_token_id, eos_token_id;
	int max_position_embeddings; /* 0 when absent */
	/* Engram */
	int n_engram;                             /* len(engram_layer_ids) */
	int engram_layer[ST_DSV41_MAX_ENGRAM];    /* model layer ids, increasing */
	int64_t engram_rows[ST_DSV41_MAX_ENGRAM]; /* engram_num_embeddings */
	int engram_dim;           /* engram_head_dim: columns of one table row */
	int engram_heads;         /* engram_n_heads */
	int engram_max_ngram;     /* engram_max_ngram_size */
};

/* 1 if config.json text (NUL-terminated) names a DeepSeek-V4.1 model
 * (top-level model_type "deepseek_v41" or "deepseek_v4.1"), else 0. */
int st_dsv41_geom_detect(const char *text);

/*
 * Parses the keys above from V4.1 config.json text; `source` names it in
 * messages.  Validates positive sizes, moe_intermediate_size and
 * hidden_size multiples of 32 (MXFP4 experts), engram_head_dim a multiple
 * of 32 (one E8M0 scale per 32 columns of a row), engram_layer_ids
 * increasing and below num_hidden_layers, one engram_num_embeddings entry
 * per Engram layer.  Returns 0, -ST_E_FORMAT (not JSON / no text_config),
 * -ST_E_CONFIG naming the key.
 */
int st_dsv41_geom_parse(const char *text, const char *source,
			struct st_dsv41_geom *ret, struct st_diag *diag);

/* The routed-expert geometry in the form the store's record layout and
 * expertd read: hidden_size, n_layers, n_experts, top_k, expert_inter,
 * vocab_size, model_type "deepseek_v41". */
void st_dsv41_geom_expert_config(const struct st_dsv41_geom *g,
				 struct st_model_config *ret);

/* Index of model layer `layer` among the Engram layers, or -1. */
int st_dsv41_geom_engram_index(const struct st_dsv41_geom *g, int layer);

#endif
