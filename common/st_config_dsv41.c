/*
 * st_config_dsv41.c — what only DeepSeek-V4.1 has in its config.json
 * (st_config_dsv41.h; MODEL_FAMILY_DEEPSEEK_V4.md 3.1), read for the
 * family's one reader (st_config_dsv_read.c): the composite top level
 * (ids, the text model in "text_config"), gate_temp, the CSA2 layer
 * roles and Engram; and the queries on them.
 */
#include "st_config_dsv41.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_config_dsv.h"
#include "st_util.h"

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

int st_dsvcfg_v41_top(const json_t *root, const char *src,
		      const json_t **ret_text, struct st_diag *diag)
{
	static const char *const mt[] = { "deepseek_v41", "deepseek_v4.1",
					  NULL };
	static const char *const fp4[] = { "fp4", NULL };
	const json_t *v, *t;
	const char *key;
	int r;

	json_object_foreach((json_t *)root, key, v) {
		int known = 0;

		for (size_t i = 0; i < ST_ARRAY_SIZE(top_keys) && !known; i++)
			known = !strcmp(key, top_keys[i]);
		if (!known)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: unknown top-level key \"%s\" (a DeepSeek-V4.1 config.json has architectures, model_type, ids, quantization_config, text_config, vision_config)",
					   src, key);
	}
	if ((r = st_dsvcfg_want_str(root, "model_type", 1, mt, src, FAMILY,
				    diag)) < 0 ||
	    (r = st_dsvcfg_want_str(root, "expert_dtype", 0, fp4, src, FAMILY,
				    diag)) < 0)
		return r;
	t = json_object_get(root, "text_config");
	if (!json_is_object(t))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"text_config\" missing or not an object (a DeepSeek-V4.1 config.json is composite)",
				   src);
	*ret_text = t;
	return 0;
}

int st_dsvcfg_v41_routing(const json_t *t, const char *src,
			  struct st_dsv_config *c, struct st_diag *diag)
{
	const json_t *v = json_object_get(t, "num_hash_layers");

	if (v && (!json_is_integer(v) || json_integer_value(v) != 0))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: num_hash_layers must be 0 (DeepSeek-V4.1 has no hash-routed layers)",
				   src);
	if (c->gate_temp <= 0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: gate_temp %g must be > 0", src,
				   c->gate_temp);
	return 0;
}

int st_dsvcfg_v41_layers(const json_t *t, const char *src,
			 struct st_dsv_config *c, struct st_diag *diag)
{
	const json_t *v, *ne;
	int r, n;

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
	return 0;
}

int st_dsvcfg_v41_ids(const json_t *root, const json_t *t, const char *src,
		      struct st_dsv_config *c, struct st_diag *diag)
{
	const json_t *v;
	int r;

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
	return 0;
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

int st_dsv41_engram_index(const struct st_dsv_config *c, int layer)
{
	for (int i = 0; i < c->n_engram; i++)
		if (c->engram_layer[i] == layer)
			return i;
	return -1;
}
