/*
 * st_dsv41_geom.c — the store's view of a DeepSeek-V4.1 config.json (see
 * st_dsv41_geom.h).
 */
#include "st_dsv41_geom.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

int st_dsv41_geom_detect(const char *text)
{
	json_t *root = json_loads(text, 0, NULL), *v;
	int yes = 0;

	if (!root)
		return 0;
	v = json_object_get(root, "model_type");
	if (json_is_string(v))
		yes = !strcmp(json_string_value(v), "deepseek_v41") ||
		      !strcmp(json_string_value(v), "deepseek_v4.1");
	json_decref(root);
	return yes;
}

static int gint(const json_t *o, const char *key, int min, int *ret,
		const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(o, key);

	if (!v)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: text_config.%s missing (a DeepSeek-V4.1 config.json has it)",
				   src, key);
	if (!json_is_integer(v) || json_integer_value(v) < min ||
	    json_integer_value(v) > (1 << 30))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: text_config.%s must be an integer >= %d",
				   src, key, min);
	*ret = (int)json_integer_value(v);
	return 0;
}

static int parse(const json_t *root, const char *src, struct st_dsv41_geom *g,
		 struct st_diag *diag)
{
	const json_t *tc = json_object_get(root, "text_config");
	const json_t *qc = json_object_get(root, "quantization_config");
	const json_t *ids, *ne, *bs;
	int r, i;

	if (!json_is_object(tc))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: no text_config object (a DeepSeek-V4.1 config.json is composite)",
				   src);
	if ((r = gint(tc, "hidden_size", 32, &g->hidden_size, src, diag)) ||
	    (r = gint(tc, "num_hidden_layers", 1, &g->n_layers, src, diag)) ||
	    (r = gint(tc, "vocab_size", 1, &g->vocab_size, src, diag)) ||
	    (r = gint(tc, "num_attention_heads", 1, &g->n_heads, src, diag)) ||
	    (r = gint(tc, "head_dim", 1, &g->head_dim, src, diag)) ||
	    (r = gint(tc, "n_routed_experts", 1, &g->n_experts, src, diag)) ||
	    (r = gint(tc, "num_experts_per_tok", 1, &g->top_k, src, diag)) ||
	    (r = gint(tc, "moe_intermediate_size", 32, &g->moe_inter, src,
		      diag)) ||
	    (r = gint(tc, "n_shared_experts", 0, &g->n_shared, src, diag)) ||
	    (r = gint(tc, "num_nextn_predict_layers", 0, &g->n_nextn, src,
		      diag)) ||
	    (r = gint(tc, "engram_head_dim", 32, &g->engram_dim, src, diag)) ||
	    (r = gint(tc, "engram_n_heads", 1, &g->engram_heads, src, diag)) ||
	    (r = gint(tc, "engram_max_ngram_size", 2, &g->engram_max_ngram,
		      src, diag)))
		return r;
	if (gint(tc, "bos_token_id", 0, &g->bos_token_id, src, NULL) &&
	    gint(root, "bos_token_id", 0, &g->bos_token_id, src, NULL))
		g->bos_token_id = 0;
	if (gint(tc, "eos_token_id", 0, &g->eos_token_id, src, NULL) &&
	    gint(root, "eos_token_id", 0, &g->eos_token_id, src, NULL))
		g->eos_token_id = 1;
	if (gint(tc, "max_position_embeddings", 1, &g->max_position_embeddings,
		 src, NULL))
		g->max_position_embeddings = 0;
	if (g->hidden_size % 32 || g->moe_inter % 32)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: hidden_size %d and moe_intermediate_size %d must be multiples of 32 (MXFP4 experts)",
				   src, g->hidden_size, g->moe_inter);
	if (g->top_k > g->n_experts)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok %d > n_routed_experts %d",
				   src, g->top_k, g->n_experts);
	if (g->engram_dim % 32)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: engram_head_dim %d is not a multiple of 32 (one E8M0 scale per 32 columns of a row)",
				   src, g->engram_dim);
	ids = json_object_get(tc, "engram_layer_ids");
	ne = json_object_get(tc, "engram_num_embeddings");
	if (!json_is_array(ids) || json_array_size(ids) > ST_DSV41_MAX_ENGRAM)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: text_config.engram_layer_ids missing or longer than %d",
				   src, ST_DSV41_MAX_ENGRAM);
	g->n_engram = (int)json_array_size(ids);
	if (!json_is_array(ne) || json_array_size(ne) != (size_t)g->n_engram)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: text_config.engram_num_embeddings needs one entry per Engram layer (%d)",
				   src, g->n_engram);
	for (i = 0; i < g->n_engram; i++) {
		const json_t *a = json_array_get(ids, (size_t)i);
		const json_t *b = json_array_get(ne, (size_t)i);

		if (!json_is_integer(a) || json_integer_value(a) < 0 ||
		    json_integer_value(a) >= g->n_layers ||
		    (i && json_integer_value(a) <= g->engram_layer[i - 1]))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_layer_ids[%d] must be increasing layer ids below num_hidden_layers %d",
					   src, i, g->n_layers);
		if (!json_is_integer(b) || json_integer_value(b) < 1 ||
		    json_integer_value(b) > (INT64_C(1) << 40))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: engram_num_embeddings[%d] must be a positive row count",
					   src, i);
		g->engram_layer[i] = (int)json_integer_value(a);
		g->engram_rows[i] = json_integer_value(b);
	}
	bs = json_object_get(qc, "weight_block_size");
	if (!json_is_object(qc) || !json_is_array(bs) ||
	    json_array_size(bs) != 2 ||
	    !json_is_integer(json_array_get(bs, 0)) ||
	    !json_is_integer(json_array_get(bs, 1)) ||
	    json_integer_value(json_array_get(bs, 0)) < 1 ||
	    json_integer_value(json_array_get(bs, 1)) < 1 ||
	    json_integer_value(json_array_get(bs, 0)) > 4096 ||
	    json_integer_value(json_array_get(bs, 1)) > 4096)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: quantization_config.weight_block_size must be [out, in] (V4.1: [32, 32])",
				   src);
	g->fp8_block[0] = (int)json_integer_value(json_array_get(bs, 0));
	g->fp8_block[1] = (int)json_integer_value(json_array_get(bs, 1));
	return 0;
}

int st_dsv41_geom_parse(const char *text, const char *source,
			struct st_dsv41_geom *ret, struct st_diag *diag)
{
	json_error_t jerr;
	json_t *root = json_loads(text, 0, &jerr);
	int r;

	memset(ret, 0, sizeof(*ret));
	if (!root)
		return st_diag_set(diag, -ST_E_FORMAT, "%s: not JSON (line %d: %s)",
				   source, jerr.line, jerr.text);
	r = parse(root, source, ret, diag);
	json_decref(root);
	return r;
}

void st_dsv41_geom_expert_config(const struct st_dsv41_geom *g,
				 struct st_model_config *ret)
{
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->model_type, sizeof(ret->model_type), "deepseek_v41");
	ret->hidden_size = g->hidden_size;
	ret->n_layers = g->n_layers;
	ret->vocab_size = g->vocab_size;
	ret->n_experts = g->n_experts;
	ret->top_k = g->top_k;
	ret->expert_inter = g->moe_inter;
	ret->max_position_embeddings = g->max_position_embeddings;
	ret->n_heads = g->n_heads;
	ret->head_dim = g->head_dim;
	ret->n_kv_heads = 1;
	ret->bos_token_id = g->bos_token_id;
	ret->n_eos = 1;
	ret->eos_token_ids[0] = g->eos_token_id;
}

int st_dsv41_geom_engram_index(const struct st_dsv41_geom *g, int layer)
{
	for (int i = 0; i < g->n_engram; i++)
		if (g->engram_layer[i] == layer)
			return i;
	return -1;
}
