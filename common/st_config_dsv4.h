/*
 * st_config_dsv4.h — the DeepSeek-V4 (model_type "deepseek_v4",
 * DeepseekV4ForCausalLM) configuration, read from its config.json
 * (key set: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 2.1).
 *
 * Kept apart from st_model_config (st_config.h): V4's attention (one K=V
 * latent, compressed streams), mHC and hash routing share nothing with the
 * Mixtral/Qwen3-MoE fields.
 */
#ifndef ST_CONFIG_DSV4_H
#define ST_CONFIG_DSV4_H

#include "st_config.h"
#include "st_config_dsv_family.h"
#include "st_error.h"

/* The family's one config struct (st_config_dsv_family.h), revision
 * ST_DSV_REV_V4 when st_dsv4_config_parse fills it.  The V4 spelling
 * stays for the store writer (expertd/es_convert.c), which names it. */
#define ST_DSV4_MAX_LAYERS ST_DSV_MAX_LAYERS
#define st_dsv4_config st_dsv_config

/*
 * Parses V4 config.json text (NUL-terminated); `source` names it in
 * messages.  Every key of the official key set is either used or known to
 * be irrelevant (attention_dropout, initializer_range, torch_dtype, ...);
 * any other key is refused (-ST_E_CONFIG naming it), so a changed release
 * does not load silently wrong.  Missing keys: -ST_E_CONFIG naming the key.
 * Validates: model_type "deepseek_v4"; num_key_value_heads 1;
 * n_shared_experts 1; scoring_func "sqrtsoftplus"; topk_method "noaux_tc";
 * hidden_act "silu"; rope_scaling type "yarn"; tie_word_embeddings false;
 * compress_ratios with num_hidden_layers + num_nextn_predict_layers entries,
 * each 0, 4 or a multiple of 4 above 4; heads divisible by o_groups;
 * rope_dim even and <= head_dim and index_head_dim; positive sizes.
 * Returns 0, -ST_E_FORMAT (not JSON), -ST_E_CONFIG, -ST_E_UNSUPPORTED.
 */
int st_dsv4_config_parse(const char *text, const char *source,
			 struct st_dsv_config *ret, struct st_diag *diag);

/* Reads <dir>/config.json and parses it (st_dsv4_config_parse).
 * Errors as there, plus -errno reading the file. */
int st_dsv4_config_load(const char *dir, struct st_dsv_config *ret,
			struct st_diag *diag);

/*
 * 1 if config.json text (NUL-terminated) names a DeepSeek-V4 model
 * (model_type "deepseek_v4"), 0 if not (or not JSON: the family parsers
 * then say what is wrong).  Lets the store writer and reader pick the V4
 * path before parsing.
 */
int st_dsv4_config_detect(const char *text);

/*
 * The routed-expert geometry of a V4 model in the form the store's record
 * layout and expertd read (struct st_model_config): hidden_size,
 * n_layers, n_experts, top_k, expert_inter (moe_intermediate_size),
 * vocab_size, heads; arch 0 and model_type "deepseek_v4" (no Mixtral /
 * Qwen3 dense tensor roles: st_dense_tensor_name is not for V4).
 */
void st_dsv4_expert_config(const struct st_dsv_config *c,
			   struct st_model_config *ret);

#endif
