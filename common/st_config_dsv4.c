/*
 * st_config_dsv4.c — DeepSeek-V4 config.json (see st_config_dsv4.h).
 */
#include "st_config_dsv4.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv.h"
#include "st_util.h"

/* Keys of the official config.json that the forward pass does not need. */
static const char *const ignored_keys[] = {
	"architectures", "attention_bias", "attention_dropout",
	"initializer_range", "torch_dtype", "transformers_version",
	"use_cache", "model_type", "hidden_act", "num_key_value_heads",
	"scoring_func", "topk_method", "tie_word_embeddings", "rope_scaling",
	"quantization_config", "compress_ratios",
};

/* The shared readers (st_config_dsv.h), naming V4 in their messages. */
#define FAMILY "DeepSeek-V4"

static int want_int(const json_t *o, const char *key, int min, int *ret,
		    const char *src, struct st_diag *diag)
{
	return st_dsvcfg_want_int(o, key, min, ret, src, FAMILY, diag);
}

static int want_num(const json_t *o, const char *key, double *ret,
		    const char *src, struct st_diag *diag)
{
	return st_dsvcfg_want_num(o, key, ret, src, FAMILY, diag);
}

/* A required string key that must be `value`. */
static int want_str(const json_t *o, const char *key, const char *value,
		    const char *src, struct st_diag *diag)
{
	const char *const values[] = { value, NULL };

	return st_dsvcfg_want_str(o, key, 1, values, src, FAMILY, diag);
}

static int parse_root(const json_t *root, const char *src,
		      struct st_dsv_config *c, struct st_diag *diag)
{
	const struct st_dsvcfg_ikey ik[] = {
		{ "hidden_size", &c->hidden_size, 1 },
		{ "num_hidden_layers", &c->n_layers, 1 },
		{ "num_nextn_predict_layers", &c->n_nextn, 0 },
		{ "vocab_size", &c->vocab_size, 1 },
		{ "num_attention_heads", &c->n_heads, 1 },
		{ "head_dim", &c->head_dim, 2 },
		{ "qk_rope_head_dim", &c->rope_dim, 0 },
		{ "q_lora_rank", &c->q_lora_rank, 1 },
		{ "o_groups", &c->o_groups, 1 },
		{ "o_lora_rank", &c->o_lora_rank, 1 },
		{ "sliding_window", &c->sliding_window, 1 },
		{ "index_n_heads", &c->index_n_heads, 1 },
		{ "index_head_dim", &c->index_head_dim, 2 },
		{ "index_topk", &c->index_topk, 1 },
		{ "n_routed_experts", &c->n_experts, 1 },
		{ "num_experts_per_tok", &c->top_k, 1 },
		{ "n_shared_experts", &c->n_shared, 0 },
		{ "moe_intermediate_size", &c->moe_inter, 1 },
		{ "num_hash_layers", &c->n_hash_layers, 0 },
		{ "hc_mult", &c->hc_mult, 1 },
		{ "hc_sinkhorn_iters", &c->hc_sinkhorn_iters, 1 },
		{ "max_position_embeddings", &c->max_position_embeddings, 1 },
		{ "bos_token_id", &c->bos_token_id, 0 },
		{ "eos_token_id", &c->eos_token_id, 0 },
	};
	const struct st_dsvcfg_dkey dk[] = {
		{ "routed_scaling_factor", &c->routed_scaling_factor },
		{ "swiglu_limit", &c->swiglu_limit },
		{ "hc_eps", &c->hc_eps },
		{ "rms_norm_eps", &c->rms_norm_eps },
		{ "rope_theta", &c->rope_theta },
		{ "compress_rope_theta", &c->compress_rope_theta },
	};
	const json_t *v, *rs, *qc, *cr;
	const char *key;
	int r, kv_heads = 0, tie = 1;

	memset(c, 0, sizeof(*c));
	c->revision = ST_DSV_REV_V4;
	c->candidate_source = -1; /* V4 has no CSA2 roles */
	if (!json_is_object(root))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not a JSON object", src);
	json_object_foreach((json_t *)root, key, v) {
		int known = 0;

		for (size_t i = 0; i < ST_ARRAY_SIZE(ik) && !known; i++)
			known = strcmp(key, ik[i].key) == 0;
		for (size_t i = 0; i < ST_ARRAY_SIZE(dk) && !known; i++)
			known = strcmp(key, dk[i].key) == 0;
		for (size_t i = 0; i < ST_ARRAY_SIZE(ignored_keys) && !known;
		     i++)
			known = strcmp(key, ignored_keys[i]) == 0;
		known = known || strcmp(key, "norm_topk_prob") == 0;
		if (!known)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown key \"%s\" (not in the DeepSeek-V4-Flash key set strata implements; a newer model variant?)",
					   src, key);
	}
	if ((r = want_str(root, "model_type", "deepseek_v4", src, diag)) < 0 ||
	    (r = want_str(root, "scoring_func", "sqrtsoftplus", src, diag)) < 0 ||
	    (r = want_str(root, "topk_method", "noaux_tc", src, diag)) < 0 ||
	    (r = want_str(root, "hidden_act", "silu", src, diag)) < 0)
		return r;
	if ((r = st_dsvcfg_want_ints(root, ik, ST_ARRAY_SIZE(ik), src, FAMILY,
				     diag)) < 0 ||
	    (r = st_dsvcfg_want_nums(root, dk, ST_ARRAY_SIZE(dk), src, FAMILY,
				     diag)) < 0)
		return r;
	if ((r = st_dsvcfg_want_bool(root, "norm_topk_prob", &c->norm_topk_prob,
				     src, diag)) < 0 ||
	    (r = st_dsvcfg_want_bool(root, "tie_word_embeddings", &tie, src,
				     diag)) < 0 ||
	    (r = want_int(root, "num_key_value_heads", 1, &kv_heads, src,
			  diag)) < 0)
		return r;
	if (tie)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: tie_word_embeddings true: DeepSeek-V4 stores a separate head.weight",
				   src);
	if (kv_heads != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: num_key_value_heads %d: DeepSeek-V4 has one shared K=V latent (1)",
				   src, kv_heads);
	if (c->n_shared != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: n_shared_experts %d: only 1 is implemented",
				   src, c->n_shared);
	/* rope_scaling: YaRN of the compress rope */
	rs = json_object_get(root, "rope_scaling");
	if (!json_is_object(rs))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"rope_scaling\" missing or not an object",
				   src);
	v = json_object_get(rs, "type");
	if (!v)
		v = json_object_get(rs, "rope_type");
	if (!json_is_string(v) || strcmp(json_string_value(v), "yarn") != 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: rope_scaling type is not \"yarn\"", src);
	if ((r = want_num(rs, "factor", &c->yarn_factor, src, diag)) < 0 ||
	    (r = want_num(rs, "beta_fast", &c->yarn_beta_fast, src, diag)) < 0 ||
	    (r = want_num(rs, "beta_slow", &c->yarn_beta_slow, src, diag)) < 0 ||
	    (r = want_int(rs, "original_max_position_embeddings", 1,
			  &c->yarn_orig_max_pos, src, diag)) < 0)
		return r;
	json_object_foreach((json_t *)rs, key, v) {
		if (strcmp(key, "type") && strcmp(key, "rope_type") &&
		    strcmp(key, "factor") && strcmp(key, "beta_fast") &&
		    strcmp(key, "beta_slow") &&
		    strcmp(key, "original_max_position_embeddings"))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown rope_scaling key \"%s\"",
					   src, key);
	}
	if (c->yarn_factor < 1.0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: rope_scaling factor %g < 1", src,
				   c->yarn_factor);
	/* quantization_config.weight_block_size */
	qc = json_object_get(root, "quantization_config");
	if (!json_is_object(qc))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"quantization_config\" missing", src);
	if ((r = want_str(qc, "fmt", "e4m3", src, diag)) < 0 ||
	    (r = want_str(qc, "scale_fmt", "ue8m0", src, diag)) < 0)
		return r;
	v = json_object_get(qc, "weight_block_size");
	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !json_is_integer(json_array_get(v, 0)) ||
	    !json_is_integer(json_array_get(v, 1)) ||
	    json_integer_value(json_array_get(v, 0)) < 1 ||
	    json_integer_value(json_array_get(v, 1)) < 1)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: quantization_config.weight_block_size must be [rows, cols] of positive integers",
				   src);
	c->fp8_block[0] = (int)json_integer_value(json_array_get(v, 0));
	c->fp8_block[1] = (int)json_integer_value(json_array_get(v, 1));
	/* compress_ratios: one per layer, then one per MTP layer */
	cr = json_object_get(root, "compress_ratios");
	if (c->n_layers > ST_DSV_MAX_LAYERS)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "%s: %d layers (at most %d)", src,
				   c->n_layers, ST_DSV_MAX_LAYERS);
	if (!json_is_array(cr) ||
	    json_array_size(cr) != (size_t)(c->n_layers + c->n_nextn))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: compress_ratios must list %d ratios (num_hidden_layers + num_nextn_predict_layers)",
				   src, c->n_layers + c->n_nextn);
	for (int l = 0; l < c->n_layers; l++) {
		const json_t *e = json_array_get(cr, l);
		long long m = json_is_integer(e) ? json_integer_value(e) : -1;

		if (m < 0 || (m != 0 && (m < 4 || m % 4 != 0)) || m > 65536)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: compress_ratios[%d] must be 0, 4 or a multiple of 4",
					   src, l);
		c->compress_ratio[l] = (int)m;
	}
	/* shapes */
	if (c->n_heads % c->o_groups)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_attention_heads %d not a multiple of o_groups %d",
				   src, c->n_heads, c->o_groups);
	if (c->rope_dim % 2 || c->rope_dim > c->head_dim ||
	    c->rope_dim > c->index_head_dim)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: qk_rope_head_dim %d must be even and at most head_dim and index_head_dim",
				   src, c->rope_dim);
	if (c->top_k > c->n_experts || c->n_hash_layers > c->n_layers)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok > n_routed_experts or num_hash_layers > num_hidden_layers",
				   src);
	return 0;
}

int st_dsv4_config_parse(const char *text, const char *source,
			 struct st_dsv_config *ret, struct st_diag *diag)
{
	json_t *root;
	int r = st_dsvcfg_loads(text, source, &root, diag);

	if (r < 0)
		return r;
	r = parse_root(root, source, ret, diag);
	json_decref(root);
	return r;
}

int st_dsv4_config_load(const char *dir, struct st_dsv_config *ret,
			struct st_diag *diag)
{
	char path[4096];
	char *buf;
	int r = st_dsvcfg_read(dir, &buf, path, sizeof(path), diag);

	if (r < 0)
		return r;
	r = st_dsv4_config_parse(buf, path, ret, diag);
	free(buf);
	return r;
}

int st_dsv4_config_detect(const char *text)
{
	static const char *const types[] = { "deepseek_v4", NULL };

	return st_dsvcfg_detect(text, types);
}

void st_dsv4_expert_config(const struct st_dsv_config *c,
			   struct st_model_config *ret)
{
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->model_type, sizeof(ret->model_type), "deepseek_v4");
	ret->hidden_size = c->hidden_size;
	ret->n_layers = c->n_layers;
	ret->n_heads = c->n_heads;
	ret->n_kv_heads = 1;
	ret->head_dim = c->head_dim;
	ret->vocab_size = c->vocab_size;
	ret->n_experts = c->n_experts;
	ret->top_k = c->top_k;
	ret->expert_inter = c->moe_inter;
	ret->norm_topk_prob = c->norm_topk_prob;
	ret->rms_norm_eps = (float)c->rms_norm_eps;
	ret->rope_theta = c->rope_theta;
	ret->max_position_embeddings = c->max_position_embeddings;
	ret->bos_token_id = c->bos_token_id;
	ret->n_eos = 1;
	ret->eos_token_ids[0] = c->eos_token_id;
}
