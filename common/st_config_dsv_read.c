/*
 * st_config_dsv_read.c — the one config.json reader of the DeepSeek-V4
 * family (st_config_dsv_family.h; key sets: MODEL_FAMILY_DEEPSEEK_V4.md
 * 2.1 for V4, 3.1 for V4.1).  A revision is a row of k_revs: its
 * model_type names, the keys its model object has beyond the family's,
 * the keys it knows but does not use.  The model object is the root of
 * V4's flat file and the "text_config" of V4.1's composite one; what
 * only V4.1 has (the composite top level, CSA2 layer roles, Engram) is
 * read by st_config_dsv41.c, the rest here with switches on the revision
 * where the two differ (V4 requires keys V4.1 may omit; the ratio rules;
 * the block size bounds).  Every key of a model object is used or known
 * to be irrelevant; any other is refused, so a changed release does not
 * load silently wrong.
 */
#include "st_config_dsv_family.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv.h"
#include "st_util.h"

/* Keys of V4's config.json that the forward pass does not need. */
static const char *const v4_ignored[] = {
	"architectures", "attention_bias", "attention_dropout",
	"initializer_range", "torch_dtype", "transformers_version",
	"use_cache", "model_type", "hidden_act", "num_key_value_heads",
	"scoring_func", "topk_method", "tie_word_embeddings", "rope_scaling",
	"quantization_config", "compress_ratios", "norm_topk_prob",
};

/* text_config keys the V4.1 text forward pass does not need (checked
 * elsewhere or irrelevant: dropout, init range, DSpark draft heads,
 * ids the top level repeats, ...). */
static const char *const v41_ignored[] = {
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
	"pad_token_id", "image_token_id", "bos_token_id", "eos_token_id",
};

static const char *const v4_types[] = { "deepseek_v4", NULL };
static const char *const v41_types[] = { "deepseek_v41", "deepseek_v4.1",
					 NULL };

/* A revision of the family. */
struct rev {
	const char *family;             /* in messages */
	const char *obj;                /* the model object, in messages */
	const char *const *types;       /* model_type values */
	const char *const *ignored;     /* known, unused model-object keys */
	size_t n_ignored;
};

static const struct rev k_revs[] = {
	[ST_DSV_REV_V4] = { "DeepSeek-V4", "", v4_types, v4_ignored,
			    ST_ARRAY_SIZE(v4_ignored) },
	[ST_DSV_REV_V41] = { "DeepSeek-V4.1", "text_config ", v41_types,
			     v41_ignored, ST_ARRAY_SIZE(v41_ignored) },
};

#define MAX_IKEYS 40
#define MAX_DKEYS 10

/* A key of a revision's own, read after the family's key `after` (the
 * order of the release's key set, so the first missing key named is the
 * same as a revision's own table would name). */
struct own_ikey { const char *after; struct st_dsvcfg_ikey k; };
struct own_dkey { const char *after; struct st_dsvcfg_dkey k; };

/* The integer and number keys of the model object: the family's, with
 * the revision's own among them. */
static void model_keys(struct st_dsv_config *c, struct st_dsvcfg_ikey *ik,
		       size_t *ret_nik, struct st_dsvcfg_dkey *dk,
		       size_t *ret_ndk)
{
	const struct st_dsvcfg_ikey family_ik[] = {
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
		{ "hc_mult", &c->hc_mult, 1 },
		{ "hc_sinkhorn_iters", &c->hc_sinkhorn_iters, 1 },
		{ "max_position_embeddings", &c->max_position_embeddings, 1 },
	};
	const struct own_ikey v4_ik[] = {
		{ "moe_intermediate_size",
		  { "num_hash_layers", &c->n_hash_layers, 0 } },
		{ "max_position_embeddings",
		  { "bos_token_id", &c->bos_token_id, 0 } },
		{ "max_position_embeddings",
		  { "eos_token_id", &c->eos_token_id, 0 } },
	};
	const struct own_ikey v41_ik[] = {
		{ "sliding_window",
		  { "candidate_topk_blocks", &c->candidate_topk_blocks, 1 } },
		{ "sliding_window",
		  { "candidate_block_size", &c->candidate_block_size, 1 } },
		{ "max_position_embeddings",
		  { "engram_vocab_size", &c->engram_vocab_size, 1 } },
		{ "max_position_embeddings",
		  { "engram_n_heads", &c->engram_n_heads, 1 } },
		{ "max_position_embeddings",
		  { "engram_head_dim", &c->engram_head_dim, 1 } },
		{ "max_position_embeddings",
		  { "engram_max_ngram_size", &c->engram_max_ngram, 2 } },
		{ "max_position_embeddings",
		  { "engram_compressed_vocab_size",
		    &c->engram_compressed_vocab, 1 } },
	};
	const struct st_dsvcfg_dkey family_dk[] = {
		{ "routed_scaling_factor", &c->routed_scaling_factor },
		{ "swiglu_limit", &c->swiglu_limit },
		{ "hc_eps", &c->hc_eps },
		{ "rms_norm_eps", &c->rms_norm_eps },
		{ "rope_theta", &c->rope_theta },
		{ "compress_rope_theta", &c->compress_rope_theta },
	};
	const struct own_dkey v41_dk[] = {
		{ "routed_scaling_factor", { "gate_temp", &c->gate_temp } },
	};
	const int v41 = c->revision == ST_DSV_REV_V41;
	const struct own_ikey *oi = v41 ? v41_ik : v4_ik;
	size_t n_oi = v41 ? ST_ARRAY_SIZE(v41_ik) : ST_ARRAY_SIZE(v4_ik);
	size_t n_od = v41 ? ST_ARRAY_SIZE(v41_dk) : 0;
	size_t nik = 0, ndk = 0;

	for (size_t i = 0; i < ST_ARRAY_SIZE(family_ik); i++) {
		ik[nik++] = family_ik[i];
		for (size_t j = 0; j < n_oi; j++)
			if (!strcmp(oi[j].after, family_ik[i].key))
				ik[nik++] = oi[j].k;
	}
	for (size_t i = 0; i < ST_ARRAY_SIZE(family_dk); i++) {
		dk[ndk++] = family_dk[i];
		for (size_t j = 0; j < n_od; j++)
			if (!strcmp(v41_dk[j].after, family_dk[i].key))
				dk[ndk++] = v41_dk[j].k;
	}
	*ret_nik = nik;
	*ret_ndk = ndk;
}

/* Every key of the model object t is one of ik, dk or the revision's
 * ignored ones.  Errors: -ST_E_CONFIG naming the first other. */
static int known_keys(const json_t *t, const struct rev *rv,
		      const struct st_dsvcfg_ikey *ik, size_t nik,
		      const struct st_dsvcfg_dkey *dk, size_t ndk,
		      const char *src, struct st_diag *diag)
{
	const char *key;
	const json_t *v;

	json_object_foreach((json_t *)t, key, v) {
		int known = 0;

		for (size_t i = 0; i < nik && !known; i++)
			known = !strcmp(key, ik[i].key);
		for (size_t i = 0; i < ndk && !known; i++)
			known = !strcmp(key, dk[i].key);
		for (size_t i = 0; i < rv->n_ignored && !known; i++)
			known = !strcmp(key, rv->ignored[i]);
		if (!known)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown %skey \"%s\" (not in the %s-Flash key set strata implements; a newer model variant?)",
					   src, rv->obj, key, rv->family);
	}
	return 0;
}

/* The routing and activation choices (V4 states them, V4.1 may omit
 * them: the only values implemented). */
static int model_strings(const json_t *t, const struct rev *rv, int v41,
			 const char *src, struct st_diag *diag)
{
	static const char *const silu[] = { "silu", NULL };
	static const char *const ssp[] = { "sqrtsoftplus", NULL };
	static const char *const noaux[] = { "noaux_tc", NULL };
	int r;

	if ((r = st_dsvcfg_want_str(t, "scoring_func", !v41, ssp, src,
				    rv->family, diag)) < 0 ||
	    (r = st_dsvcfg_want_str(t, "topk_method", !v41, noaux, src,
				    rv->family, diag)) < 0)
		return r;
	return st_dsvcfg_want_str(t, "hidden_act", !v41, silu, src,
				  rv->family, diag);
}

/* norm_topk_prob and untied embeddings: V4 states them, V4.1 may omit
 * them (norm_topk_prob true, untied). */
static int model_choices(const json_t *t, int v41, const char *src,
			 struct st_dsv_config *c, struct st_diag *diag)
{
	const json_t *v;
	int r, tie = 1;

	if (!v41) {
		if ((r = st_dsvcfg_want_bool(t, "norm_topk_prob",
					     &c->norm_topk_prob, src,
					     diag)) < 0 ||
		    (r = st_dsvcfg_want_bool(t, "tie_word_embeddings", &tie,
					     src, diag)) < 0)
			return r;
		if (tie)
			return st_diag_set(diag, -ST_E_UNSUPPORTED,
					   "%s: tie_word_embeddings true: DeepSeek-V4 stores a separate head.weight",
					   src);
		return 0;
	}
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
	return 0;
}

/* The official ModelArgs defaults of the rope_scaling keys (V4-Flash
 * inference/model.py at 60d8d70, index file id 70831076062: rope_factor
 * 40, original_seq_len 0, beta_fast 32, beta_slow 1; no mscale field,
 * precompute_freqs_cis applies no mscale). */
#define DSV_YARN_FACTOR 40.0
#define DSV_YARN_BETA_FAST 32.0
#define DSV_YARN_BETA_SLOW 1.0
#define DSV_YARN_ORIG_MAX_POS 0 /* 0: no YaRN (official: seq_len 0) */

/* An optional number of rs: *ret keeps its default when key is absent. */
static int opt_num(const json_t *rs, const char *key, double *ret,
		   const char *src, const struct rev *rv, struct st_diag *diag)
{
	if (!json_object_get(rs, key))
		return 0;
	return st_dsvcfg_want_num(rs, key, ret, src, rv->family, diag);
}

/* rope_scaling: YaRN of the compress rope.  Every key may be omitted, the
 * object too: an absent key takes the official ModelArgs default above
 * (no YaRN without original_max_position_embeddings, as the official
 * code); "type"/"rope_type", when given, must be "yarn"; "mscale" and
 * "mscale_all_dim" are accepted and unused (the official code has no
 * mscale: MODEL_FAMILY_DEEPSEEK_V4.md 2.4).  Other keys are refused. */
static int rope_scaling(const json_t *t, const struct rev *rv, int v41,
			const char *src, struct st_dsv_config *c,
			struct st_diag *diag)
{
	const json_t *rs = json_object_get(t, "rope_scaling"), *v;
	const char *key;
	int r;

	(void)v41;
	c->yarn_factor = DSV_YARN_FACTOR;
	c->yarn_beta_fast = DSV_YARN_BETA_FAST;
	c->yarn_beta_slow = DSV_YARN_BETA_SLOW;
	c->yarn_orig_max_pos = DSV_YARN_ORIG_MAX_POS;
	if (!rs || json_is_null(rs))
		return 0;
	if (!json_is_object(rs))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"rope_scaling\" is not an object", src);
	v = json_object_get(rs, "type");
	if (!v)
		v = json_object_get(rs, "rope_type");
	if (v && (!json_is_string(v) ||
		  strcmp(json_string_value(v), "yarn") != 0))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: rope_scaling type is not \"yarn\"",
				   src);
	if ((r = opt_num(rs, "factor", &c->yarn_factor, src, rv, diag)) < 0 ||
	    (r = opt_num(rs, "beta_fast", &c->yarn_beta_fast, src, rv,
			 diag)) < 0 ||
	    (r = opt_num(rs, "beta_slow", &c->yarn_beta_slow, src, rv,
			 diag)) < 0 ||
	    (json_object_get(rs, "original_max_position_embeddings") &&
	     (r = st_dsvcfg_want_int(rs, "original_max_position_embeddings",
				     1, &c->yarn_orig_max_pos, src,
				     rv->family, diag)) < 0))
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
	if (!(c->yarn_beta_fast > 0) || !(c->yarn_beta_slow > 0))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: rope_scaling beta_fast %g / beta_slow %g not > 0",
				   src, c->yarn_beta_fast, c->yarn_beta_slow);
	return 0;
}

/* compress_ratios: one per layer, then one per MTP / DSpark layer.  V4:
 * 0, 4 (CSA) or a multiple of 4 (HCA); V4.1: 0, 1 (CED decoder) or a
 * pooling ratio > 1. */
static int ratios(const json_t *t, int v41, const char *src,
		  struct st_dsv_config *c, struct st_diag *diag)
{
	const json_t *cr = json_object_get(t, "compress_ratios");

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

		if (m < 0 || m > 65536 ||
		    (!v41 && m != 0 && (m < 4 || m % 4 != 0)))
			return st_diag_set(diag, -ST_E_CONFIG,
					   v41 ? "%s: compress_ratios[%d] must be 0 (window only), 1 (CED decoder) or a pooling ratio > 1" :
						 "%s: compress_ratios[%d] must be 0, 4 or a multiple of 4",
					   src, l);
		c->compress_ratio[l] = (int)m;
	}
	if (c->n_nextn > 0) {
		const json_t *e = json_array_get(cr, c->n_layers);

		c->nextn_ratio = json_is_integer(e) ?
					 (int)json_integer_value(e) : -1;
	}
	return 0;
}

/* The shapes the forward pass relies on. */
static int shapes(const struct st_dsv_config *c, int v41, const char *src,
		  struct st_diag *diag)
{
	if (c->n_heads % c->o_groups)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_attention_heads %d not a multiple of o_groups %d",
				   src, c->n_heads, c->o_groups);
	if (c->rope_dim % 2 || c->rope_dim > c->head_dim ||
	    c->rope_dim > c->index_head_dim)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: qk_rope_head_dim %d must be even and at most head_dim and index_head_dim",
				   src, c->rope_dim);
	if (v41 && c->top_k > c->n_experts)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok > n_routed_experts",
				   src);
	if (!v41 && (c->top_k > c->n_experts || c->n_hash_layers > c->n_layers))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok > n_routed_experts or num_hash_layers > num_hidden_layers",
				   src);
	return 0;
}

/* quantization_config of the top level: the FP8 format (V4 states it,
 * V4.1 may omit it) and weight_block_size (V4.1: at most 4096). */
static int quant_config(const json_t *root, int v41, const char *src,
			struct st_dsv_config *c, struct st_diag *diag)
{
	static const char *const e4m3[] = { "e4m3", NULL };
	static const char *const ue8m0[] = { "ue8m0", NULL };
	static const char *const fp8[] = { "fp8", NULL };
	const char *family = k_revs[c->revision].family;
	const json_t *qc = json_object_get(root, "quantization_config"), *v;
	long long b0, b1;
	int r;

	if (!json_is_object(qc))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"quantization_config\" missing", src);
	if ((v41 && (r = st_dsvcfg_want_str(qc, "quant_method", 0, fp8, src,
					    family, diag)) < 0) ||
	    (r = st_dsvcfg_want_str(qc, "fmt", !v41, e4m3, src, family,
				    diag)) < 0 ||
	    (r = st_dsvcfg_want_str(qc, "scale_fmt", !v41, ue8m0, src, family,
				    diag)) < 0)
		return r;
	v = json_object_get(qc, "weight_block_size");
	if (!json_is_array(v) || json_array_size(v) != 2 ||
	    !json_is_integer(json_array_get(v, 0)) ||
	    !json_is_integer(json_array_get(v, 1)))
		b0 = b1 = 0;
	else {
		b0 = json_integer_value(json_array_get(v, 0));
		b1 = json_integer_value(json_array_get(v, 1));
	}
	if (b0 < 1 || b1 < 1 || (v41 && (b0 > 4096 || b1 > 4096)))
		return st_diag_set(diag, -ST_E_CONFIG,
				   v41 ? "%s: quantization_config.weight_block_size must be [rows, cols] of positive integers (V4.1: [32, 32])" :
					 "%s: quantization_config.weight_block_size must be [rows, cols] of positive integers",
				   src);
	c->fp8_block[0] = (int)b0;
	c->fp8_block[1] = (int)b1;
	return 0;
}

/* The model object t of revision c->revision into c. */
static int read_model(const json_t *t, const char *src,
		      struct st_dsv_config *c, struct st_diag *diag)
{
	const struct rev *rv = &k_revs[c->revision];
	const int v41 = c->revision == ST_DSV_REV_V41;
	struct st_dsvcfg_ikey ik[MAX_IKEYS];
	struct st_dsvcfg_dkey dk[MAX_DKEYS];
	size_t nik, ndk;
	int r, kv_heads = 0;

	model_keys(c, ik, &nik, dk, &ndk);
	if ((r = known_keys(t, rv, ik, nik, dk, ndk, src, diag)) < 0 ||
	    /* V4: the flat file's model_type (V4.1: the top level's) */
	    (!v41 && (r = st_dsvcfg_want_str(t, "model_type", 1, rv->types,
					     src, rv->family, diag)) < 0) ||
	    (r = model_strings(t, rv, v41, src, diag)) < 0 ||
	    (r = st_dsvcfg_want_ints(t, ik, nik, src, rv->family, diag)) < 0 ||
	    (r = st_dsvcfg_want_nums(t, dk, ndk, src, rv->family, diag)) < 0 ||
	    (r = model_choices(t, v41, src, c, diag)) < 0 ||
	    (r = st_dsvcfg_want_int(t, "num_key_value_heads", 1, &kv_heads,
				    src, rv->family, diag)) < 0)
		return r;
	if (kv_heads != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: num_key_value_heads %d: %s has one shared K=V latent (1)",
				   src, kv_heads, rv->family);
	if (c->n_shared != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: n_shared_experts %d: only 1 is implemented",
				   src, c->n_shared);
	if ((v41 && (r = st_dsvcfg_v41_routing(t, src, c, diag)) < 0) ||
	    (r = rope_scaling(t, rv, v41, src, c, diag)) < 0 ||
	    /* V4: the flat file's quantization_config (V4.1: the top
	     * level's, after the text model) */
	    (!v41 && (r = quant_config(t, 0, src, c, diag)) < 0) ||
	    (r = ratios(t, v41, src, c, diag)) < 0 ||
	    (v41 && (r = st_dsvcfg_v41_layers(t, src, c, diag)) < 0))
		return r;
	return shapes(c, v41, src, diag);
}

static int parse_root(const json_t *root, const char *src,
		      enum st_dsv_revision rev, struct st_dsv_config *c,
		      struct st_diag *diag)
{
	const json_t *t = root;
	int r;

	memset(c, 0, sizeof(*c));
	c->revision = rev;
	c->candidate_source = -1;
	if (!json_is_object(root))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: not a JSON object", src);
	if (rev == ST_DSV_REV_V41 &&
	    (r = st_dsvcfg_v41_top(root, src, &t, diag)) < 0)
		return r;
	if ((r = read_model(t, src, c, diag)) < 0 ||
	    (rev == ST_DSV_REV_V41 &&
	     ((r = st_dsvcfg_v41_ids(root, t, src, c, diag)) < 0 ||
	      (r = quant_config(root, 1, src, c, diag)) < 0)))
		return r;
	return 0;
}

enum st_dsv_revision st_dsv_config_detect(const char *text)
{
	if (st_dsvcfg_detect(text, v41_types))
		return ST_DSV_REV_V41;
	if (st_dsvcfg_detect(text, v4_types))
		return ST_DSV_REV_V4;
	return 0;
}

int st_dsv_config_parse(const char *text, const char *source,
			enum st_dsv_revision want, struct st_dsv_config *ret,
			struct st_diag *diag)
{
	json_t *root;
	int r;

	if (!want)
		want = st_dsv_config_detect(text) == ST_DSV_REV_V41 ?
			       ST_DSV_REV_V41 : ST_DSV_REV_V4;
	if (want != ST_DSV_REV_V4 && want != ST_DSV_REV_V41)
		return st_diag_set(diag, -EINVAL,
				   "%s: DeepSeek revision %d unknown", source,
				   (int)want);
	if ((r = st_dsvcfg_loads(text, source, &root, diag)) < 0)
		return r;
	r = parse_root(root, source, want, ret, diag);
	json_decref(root);
	return r;
}

int st_dsv_config_load(const char *dir, enum st_dsv_revision want,
		       struct st_dsv_config *ret, struct st_diag *diag)
{
	char path[4096];
	char *buf;
	int r = st_dsvcfg_read(dir, &buf, path, sizeof(path), diag);

	if (r < 0)
		return r;
	r = st_dsv_config_parse(buf, path, want, ret, diag);
	free(buf);
	return r;
}

void st_dsv_expert_config(const struct st_dsv_config *c,
			  struct st_model_config *ret)
{
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->model_type, sizeof(ret->model_type), "%s",
		 k_revs[c->revision].types[0]);
	ret->hidden_size = c->hidden_size;
	ret->n_layers = c->n_layers;
	ret->n_heads = c->n_heads;
	ret->n_kv_heads = 1;
	ret->head_dim = c->head_dim;
	ret->vocab_size = c->vocab_size;
	ret->n_experts = c->n_experts;
	ret->top_k = c->top_k;
	ret->expert_inter = c->moe_inter;
	ret->max_position_embeddings = c->max_position_embeddings;
	ret->bos_token_id = c->bos_token_id;
	ret->n_eos = 1;
	ret->eos_token_ids[0] = c->eos_token_id;
	if (c->revision == ST_DSV_REV_V4) {
		/* what V4's store manifests have always carried */
		ret->norm_topk_prob = c->norm_topk_prob;
		ret->rms_norm_eps = (float)c->rms_norm_eps;
		ret->rope_theta = c->rope_theta;
	}
}
