/*
 * st_config_dsv41.c — DeepSeek-V4.1 composite config.json (see
 * st_config_dsv41.h).
 */
#include "st_config_dsv41.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv.h"
#include "st_util.h"

/* text_config keys the text forward pass does not need (checked elsewhere
 * or irrelevant: dropout, init range, DSpark draft heads, ...). */
static const char *const text_ignored[] = {
	"model_type", "attention_bias", "attention_dropout",
	"initializer_range", "torch_dtype", "transformers_version",
	"use_cache", "hidden_act", "num_key_value_heads", "scoring_func",
	"topk_method", "tie_word_embeddings", "rope_scaling",
	"compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
	"candidate_source_layer_id", "engram_layer_ids",
	"engram_num_embeddings", "engram_pad_id", "engram_pad_token_id",
	"norm_topk_prob", "num_hash_layers", "partial_rotary_factor",
	"dspark_block_size", "dspark_noise_token_id",
	"dspark_target_layer_ids", "dspark_markov_rank",
	"dspark_n_routed_experts", "dspark_num_experts_per_tok",
	"pad_token_id", "image_token_id",
};

/* Top-level keys of the composite file. */
static const char *const top_keys[] = {
	"architectures", "model_type", "bos_token_id", "eos_token_id",
	"pad_token_id", "image_token_id", "tie_word_embeddings",
	"torch_dtype", "transformers_version", "quantization_config",
	"text_config", "vision_config", "expert_dtype",
};

/* The shared readers (st_config_dsv.h), naming V4.1 in their messages. */
#define FAMILY "DeepSeek-V4.1"

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

/* A string key that must hold one of the values (NULL-terminated list);
 * absent is an error only when `required`. */
static int want_str(const json_t *o, const char *key, int required,
		    const char *const *values, const char *src,
		    struct st_diag *diag)
{
	return st_dsvcfg_want_str(o, key, required, values, src, FAMILY, diag);
}

/* An array of layer ids (each in [0, n_layers)) into flags[]; returns
 * the count or a negative error. */
static int want_layers(const json_t *o, const char *key, int n_layers,
		       unsigned char *flags, int *list, int max_list,
		       const char *src, struct st_diag *diag)
{
	const json_t *a = json_object_get(o, key), *e;
	size_t i;

	if (!json_is_array(a))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" missing or not a list of layer ids",
				   src, key);
	if (list && json_array_size(a) > (size_t)max_list)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "%s: \"%s\" lists %zu layers (at most %d)",
				   src, key, json_array_size(a), max_list);
	json_array_foreach(a, i, e) {
		long long l = json_is_integer(e) ? json_integer_value(e) : -1;

		if (l < 0 || l >= n_layers)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"%s\"[%zu] is not a layer id in [0, %d)",
					   src, key, i, n_layers);
		if (flags)
			flags[l] = 1;
		if (list)
			list[i] = (int)l;
	}
	return (int)json_array_size(a);
}

static int parse_text(const json_t *t, const char *src,
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
		{ "candidate_topk_blocks", &c->candidate_topk_blocks, 1 },
		{ "candidate_block_size", &c->candidate_block_size, 1 },
		{ "index_n_heads", &c->index_n_heads, 1 },
		{ "index_head_dim", &c->index_head_dim, 2 },
		{ "index_topk", &c->index_topk, 1 },
		{ "n_routed_experts", &c->n_experts, 1 },
		{ "num_experts_per_tok", &c->top_k, 1 },
		{ "n_shared_experts", &c->n_shared, 0 },
		{ "moe_intermediate_size", &c->moe_inter, 1 },
		{ "hc_mult", &c->hc_mult, 1 },
		{ "hc_sinkhorn_iters", &c->hc_sinkhorn_iters, 1 },
		{ "max_position_embeddings", &c->max_position_embeddings, 1 },
		{ "engram_vocab_size", &c->engram_vocab_size, 1 },
		{ "engram_n_heads", &c->engram_n_heads, 1 },
		{ "engram_head_dim", &c->engram_head_dim, 1 },
		{ "engram_max_ngram_size", &c->engram_max_ngram, 2 },
		{ "engram_compressed_vocab_size", &c->engram_compressed_vocab, 1 },
	};
	const struct st_dsvcfg_dkey dk[] = {
		{ "routed_scaling_factor", &c->routed_scaling_factor },
		{ "gate_temp", &c->gate_temp },
		{ "swiglu_limit", &c->swiglu_limit },
		{ "hc_eps", &c->hc_eps },
		{ "rms_norm_eps", &c->rms_norm_eps },
		{ "rope_theta", &c->rope_theta },
		{ "compress_rope_theta", &c->compress_rope_theta },
	};
	static const char *const silu[] = { "silu", NULL };
	static const char *const ssp[] = { "sqrtsoftplus", NULL };
	static const char *const noaux[] = { "noaux_tc", NULL };
	static const char *const yarn[] = { "yarn", NULL };
	const json_t *v, *rs, *cr, *ne;
	const char *key;
	int r, kv_heads = 0, n;

	if (!json_is_object(t))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"text_config\" missing or not an object (a DeepSeek-V4.1 config.json is composite)",
				   src);
	json_object_foreach((json_t *)t, key, v) {
		int known = 0;

		for (size_t i = 0; i < ST_ARRAY_SIZE(ik) && !known; i++)
			known = !strcmp(key, ik[i].key);
		for (size_t i = 0; i < ST_ARRAY_SIZE(dk) && !known; i++)
			known = !strcmp(key, dk[i].key);
		for (size_t i = 0; i < ST_ARRAY_SIZE(text_ignored) && !known;
		     i++)
			known = !strcmp(key, text_ignored[i]);
		known = known || !strcmp(key, "bos_token_id") ||
			!strcmp(key, "eos_token_id");
		if (!known)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown text_config key \"%s\" (not in the DeepSeek-V4.1-Flash key set strata implements; a newer model variant?)",
					   src, key);
	}
	if ((r = want_str(t, "hidden_act", 0, silu, src, diag)) < 0 ||
	    (r = want_str(t, "scoring_func", 0, ssp, src, diag)) < 0 ||
	    (r = want_str(t, "topk_method", 0, noaux, src, diag)) < 0)
		return r;
	if ((r = st_dsvcfg_want_ints(t, ik, ST_ARRAY_SIZE(ik), src, FAMILY,
				     diag)) < 0)
		return r;
	if ((r = st_dsvcfg_want_nums(t, dk, ST_ARRAY_SIZE(dk), src, FAMILY,
				     diag)) < 0)
		return r;
	v = json_object_get(t, "norm_topk_prob");
	c->norm_topk_prob = !v || json_is_true(v);
	if (v && !json_is_boolean(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"norm_topk_prob\" must be true or false",
				   src);
	v = json_object_get(t, "tie_word_embeddings");
	if (v && !json_is_false(v))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: text_config tie_word_embeddings is not false: DeepSeek-V4.1 stores a separate head.weight",
				   src);
	if ((r = want_int(t, "num_key_value_heads", 1, &kv_heads, src,
			  diag)) < 0)
		return r;
	if (kv_heads != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: num_key_value_heads %d: DeepSeek-V4.1 has one shared K=V latent (1)",
				   src, kv_heads);
	if (c->n_shared != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: n_shared_experts %d: only 1 is implemented",
				   src, c->n_shared);
	v = json_object_get(t, "num_hash_layers");
	if (v && (!json_is_integer(v) || json_integer_value(v) != 0))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: num_hash_layers must be 0 (DeepSeek-V4.1 has no hash-routed layers)",
				   src);
	if (c->gate_temp <= 0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: gate_temp %g must be > 0", src,
				   c->gate_temp);
	/* rope_scaling: YaRN of the compress rope; beta_fast / beta_slow
	 * are absent in the release (defaults 32 and 1, HF) */
	rs = json_object_get(t, "rope_scaling");
	if (!json_is_object(rs))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"rope_scaling\" missing or not an object",
				   src);
	if ((r = want_str(rs, json_object_get(rs, "type") ? "type" :
				  "rope_type", 1, yarn, src, diag)) < 0 ||
	    (r = want_num(rs, "factor", &c->yarn_factor, src, diag)) < 0 ||
	    (r = want_int(rs, "original_max_position_embeddings", 1,
			  &c->yarn_orig_max_pos, src, diag)) < 0)
		return r;
	c->yarn_beta_fast = 32;
	c->yarn_beta_slow = 1;
	if (json_object_get(rs, "beta_fast") &&
	    (r = want_num(rs, "beta_fast", &c->yarn_beta_fast, src, diag)) < 0)
		return r;
	if (json_object_get(rs, "beta_slow") &&
	    (r = want_num(rs, "beta_slow", &c->yarn_beta_slow, src, diag)) < 0)
		return r;
	json_object_foreach((json_t *)rs, key, v) {
		if (strcmp(key, "type") && strcmp(key, "rope_type") &&
		    strcmp(key, "factor") && strcmp(key, "beta_fast") &&
		    strcmp(key, "beta_slow") && strcmp(key, "mscale") &&
		    strcmp(key, "mscale_all_dim") &&
		    strcmp(key, "original_max_position_embeddings"))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown rope_scaling key \"%s\"",
					   src, key);
	}
	if (c->yarn_factor < 1.0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: rope_scaling factor %g < 1", src,
				   c->yarn_factor);
	/* layers */
	if (c->n_layers > ST_DSV_MAX_LAYERS)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "%s: %d layers (at most %d)", src,
				   c->n_layers, ST_DSV_MAX_LAYERS);
	cr = json_object_get(t, "compress_ratios");
	if (!json_is_array(cr) ||
	    json_array_size(cr) != (size_t)(c->n_layers + c->n_nextn))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: compress_ratios must list %d ratios (num_hidden_layers + num_nextn_predict_layers)",
				   src, c->n_layers + c->n_nextn);
	for (int l = 0; l < c->n_layers; l++) {
		const json_t *e = json_array_get(cr, l);
		long long m = json_is_integer(e) ? json_integer_value(e) : -1;

		if (m < 0 || m > 65536)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: compress_ratios[%d] must be 0 (window only), 1 (CED decoder) or a pooling ratio > 1",
					   src, l);
		c->compress_ratio[l] = (int)m;
	}
	if ((r = want_layers(t, "kv_source_layer_ids", c->n_layers,
			     c->kv_source, NULL, 0, src, diag)) < 0 ||
	    (r = want_layers(t, "index_source_layer_ids", c->n_layers,
			     c->index_source, NULL, 0, src, diag)) < 0)
		return r;
	v = json_object_get(t, "candidate_source_layer_id");
	c->candidate_source = -1;
	if (v && !json_is_null(v) &&
	    (r = want_int(t, "candidate_source_layer_id", 0,
			  &c->candidate_source, src, diag)) < 0)
		return r;
	for (int l = 0; l < c->n_layers; l++) {
		int m = c->compress_ratio[l], ks = st_dsv41_kv_source_of(c, l);

		if (!m && (c->kv_source[l] || c->index_source[l]))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: layer %d is a KV or index source but its compress ratio is 0",
					   src, l);
		if (c->kv_source[l] && !c->index_source[l])
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: KV source layer %d is not an index source (its index keys need a first selection)",
					   src, l);
		if (m && (ks < 0 || c->compress_ratio[ks] != m))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: layer %d (ratio %d) has no preceding KV source of the same ratio in kv_source_layer_ids",
					   src, l, m);
		if (m && st_dsv41_index_source_of(c, l) < 0)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: layer %d (ratio %d) has no preceding index source",
					   src, l, m);
	}
	if (c->candidate_source >= 0 &&
	    (c->candidate_source >= c->n_layers ||
	     !c->index_source[c->candidate_source] ||
	     c->compress_ratio[c->candidate_source] != 1))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: candidate_source_layer_id %d must be an index source of ratio 1",
				   src, c->candidate_source);
	/* Engram */
	n = want_layers(t, "engram_layer_ids", c->n_layers, NULL,
			c->engram_layer, ST_DSV_MAX_ENGRAM, src, diag);
	if (n < 0)
		return n;
	c->n_engram = n;
	ne = json_object_get(t, "engram_num_embeddings");
	if (!json_is_array(ne) || json_array_size(ne) != (size_t)n)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: engram_num_embeddings must list one table size per engram layer (%d)",
				   src, n);
	for (int i = 0; i < n; i++) {
		const json_t *e = json_array_get(ne, i);

		if (!json_is_integer(e) || json_integer_value(e) < 1)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_num_embeddings[%d] must be a positive integer",
					   src, i);
		c->engram_rows[i] = json_integer_value(e);
	}
	{
		int a = -1, b = -1;

		if (json_object_get(t, "engram_pad_id") &&
		    (r = want_int(t, "engram_pad_id", 0, &a, src, diag)) < 0)
			return r;
		if (json_object_get(t, "engram_pad_token_id") &&
		    (r = want_int(t, "engram_pad_token_id", 0, &b, src,
				  diag)) < 0)
			return r;
		if (a >= 0 && b >= 0 && a != b)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_pad_id %d and engram_pad_token_id %d disagree",
					   src, a, b);
		if (a < 0 && b < 0 && n > 0)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_pad_id (or engram_pad_token_id) missing",
					   src);
		c->engram_pad_id = a >= 0 ? a : b;
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
	if (c->top_k > c->n_experts)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok > n_routed_experts",
				   src);
	return 0;
}

static int parse_root(const json_t *root, const char *src,
		      struct st_dsv_config *c, struct st_diag *diag)
{
	static const char *const mt[] = { "deepseek_v41", "deepseek_v4.1",
					  NULL };
	static const char *const e4m3[] = { "e4m3", NULL };
	static const char *const ue8m0[] = { "ue8m0", NULL };
	static const char *const fp8[] = { "fp8", NULL };
	static const char *const fp4[] = { "fp4", NULL };
	const json_t *v, *qc, *t;
	const char *key;
	int r;

	memset(c, 0, sizeof(*c));
	c->revision = ST_DSV_REV_V41;
	if (!json_is_object(root))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not a JSON object", src);
	json_object_foreach((json_t *)root, key, v) {
		int known = 0;

		for (size_t i = 0; i < ST_ARRAY_SIZE(top_keys) && !known; i++)
			known = !strcmp(key, top_keys[i]);
		if (!known)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown top-level key \"%s\" (a DeepSeek-V4.1 config.json has architectures, model_type, ids, quantization_config, text_config, vision_config)",
					   src, key);
	}
	if ((r = want_str(root, "model_type", 1, mt, src, diag)) < 0 ||
	    (r = want_str(root, "expert_dtype", 0, fp4, src, diag)) < 0)
		return r;
	t = json_object_get(root, "text_config");
	if ((r = parse_text(t, src, c, diag)) < 0)
		return r;
	c->bos_token_id = 0;
	c->eos_token_id = 1;
	c->pad_token_id = 2;
	c->image_token_id = -1;
	/* the top level is authoritative for ids; text_config repeats them */
	{
		const struct st_dsvcfg_ikey ids[] = {
			{ "bos_token_id", &c->bos_token_id, 0 },
			{ "eos_token_id", &c->eos_token_id, 0 },
			{ "pad_token_id", &c->pad_token_id, 0 },
			{ "image_token_id", &c->image_token_id, 0 },
		};

		for (size_t i = 0; i < ST_ARRAY_SIZE(ids); i++) {
			const json_t *o = json_object_get(root, ids[i].key) ?
						  root : t;

			if (json_object_get(o, ids[i].key) &&
			    (r = want_int(o, ids[i].key, 0, ids[i].dst, src,
					  diag)) < 0)
				return r;
		}
	}
	v = json_object_get(root, "tie_word_embeddings");
	if (v && !json_is_false(v))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: tie_word_embeddings is not false: DeepSeek-V4.1 stores a separate head.weight",
				   src);
	qc = json_object_get(root, "quantization_config");
	if (!json_is_object(qc))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"quantization_config\" missing", src);
	if ((r = want_str(qc, "quant_method", 0, fp8, src, diag)) < 0 ||
	    (r = want_str(qc, "fmt", 0, e4m3, src, diag)) < 0 ||
	    (r = want_str(qc, "scale_fmt", 0, ue8m0, src, diag)) < 0)
		return r;
	v = json_object_get(qc, "weight_block_size");
	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !json_is_integer(json_array_get(v, 0)) ||
	    !json_is_integer(json_array_get(v, 1)) ||
	    json_integer_value(json_array_get(v, 0)) < 1 ||
	    json_integer_value(json_array_get(v, 1)) < 1 ||
	    json_integer_value(json_array_get(v, 0)) > 4096 ||
	    json_integer_value(json_array_get(v, 1)) > 4096)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: quantization_config.weight_block_size must be [rows, cols] of positive integers (V4.1: [32, 32])",
				   src);
	c->fp8_block[0] = (int)json_integer_value(json_array_get(v, 0));
	c->fp8_block[1] = (int)json_integer_value(json_array_get(v, 1));
	return 0;
}

int st_dsv41_config_parse(const char *text, const char *source,
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

int st_dsv41_config_load(const char *dir, struct st_dsv_config *ret,
			 struct st_diag *diag)
{
	char path[4096];
	char *buf;
	int r = st_dsvcfg_read(dir, &buf, path, sizeof(path), diag);

	if (r < 0)
		return r;
	r = st_dsv41_config_parse(buf, path, ret, diag);
	free(buf);
	return r;
}

int st_dsv41_config_detect(const char *text)
{
	static const char *const types[] = { "deepseek_v41", "deepseek_v4.1",
					      NULL };

	return st_dsvcfg_detect(text, types);
}

int st_dsv41_kv_source_of(const struct st_dsv_config *c, int l)
{
	if (l < 0 || l >= c->n_layers || !c->compress_ratio[l])
		return -1;
	for (int j = l; j >= 0; j--)
		if (c->kv_source[j])
			return j;
	return -1;
}

int st_dsv41_index_source_of(const struct st_dsv_config *c, int l)
{
	if (l < 0 || l >= c->n_layers || !c->compress_ratio[l])
		return -1;
	for (int j = l; j >= 0; j--)
		if (c->index_source[j])
			return j;
	return -1;
}

int st_dsv41_last_kv_source(const struct st_dsv_config *c)
{
	for (int j = c->n_layers - 1; j >= 0; j--)
		if (c->kv_source[j])
			return j;
	return -1;
}

int st_dsv41_config_check_store(const struct st_dsv_config *c,
				const char *src, struct st_diag *diag)
{
	if (c->hidden_size % 32 || c->moe_inter % 32)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: hidden_size %d and moe_intermediate_size %d must be multiples of 32 (MXFP4 experts)",
				   src, c->hidden_size, c->moe_inter);
	if (c->engram_head_dim % 32)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: engram_head_dim %d is not a multiple of 32 (one E8M0 scale per 32 columns of a row)",
				   src, c->engram_head_dim);
	for (int i = 0; i < c->n_engram; i++) {
		if (i && c->engram_layer[i] <= c->engram_layer[i - 1])
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_layer_ids[%d] = %d: the Engram layer ids must be increasing",
					   src, i, c->engram_layer[i]);
		if (c->engram_rows[i] > (INT64_C(1) << 40))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_num_embeddings[%d] = %lld rows (at most 2^40)",
					   src, i, (long long)c->engram_rows[i]);
	}
	return 0;
}

void st_dsv41_expert_config(const struct st_dsv_config *c,
			    struct st_model_config *ret)
{
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->model_type, sizeof(ret->model_type), "deepseek_v41");
	ret->hidden_size = c->hidden_size;
	ret->n_layers = c->n_layers;
	ret->vocab_size = c->vocab_size;
	ret->n_experts = c->n_experts;
	ret->top_k = c->top_k;
	ret->expert_inter = c->moe_inter;
	ret->max_position_embeddings = c->max_position_embeddings;
	ret->n_heads = c->n_heads;
	ret->head_dim = c->head_dim;
	ret->n_kv_heads = 1;
	ret->bos_token_id = c->bos_token_id;
	ret->n_eos = 1;
	ret->eos_token_ids[0] = c->eos_token_id;
}

int st_dsv41_engram_index(const struct st_dsv_config *c, int layer)
{
	for (int i = 0; i < c->n_engram; i++)
		if (c->engram_layer[i] == layer)
			return i;
	return -1;
}
