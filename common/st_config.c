/*
 * st_config.c — reads a Hugging Face config.json (and generation_config.json)
 * into struct st_model_config, and names the checkpoint tensors of each
 * supported family.
 *
 * Key spellings and family defaults follow MODEL_FAMILIES.md sections 0.3,
 * 2.1 and 4.1 and the HF configuration classes (configuration_mixtral.py,
 * configuration_qwen3_moe.py).  Keys that fix the shape of the model
 * (sizes, head and expert counts) are required: guessing them from a
 * library default would load the wrong tensors.  Keys with a well-known
 * family default (eps, rope_theta, norm_topk_prob, ...) fall back to it
 * (PITFALLS P4: a missing key takes the family's own default).
 */
#include "st_config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "st_util.h"

/* Upper bound for every size read from a config: keeps products such as
 * vocab x hidden far inside int64 and rejects absurd values early. */
#define CFG_MAX_DIM (1 << 30)
/* Structural counts: far above any released model (about 130 layers,
 * 512 experts), low enough that the per-layer and per-expert tables a
 * convert or a daemon allocates stay small; an absurd value is refused
 * naming its key instead of failing later as "out of memory". */
#define CFG_MAX_LAYERS 1024
#define CFG_MAX_EXPERTS 4096

struct family {
	enum st_arch arch;
	const char *arch_name;    /* "architectures" entry */
	const char *model_type;
	const char *inter_key;    /* per-expert FFN width key */
	int norm_topk_default;    /* -1: not configurable (always renormalise) */
	int qk_norm;
	int shared;               /* one gated shared expert (qwen2_moe) */
	float rms_norm_eps_default;
	double rope_theta_default;
	int max_pos_default;
	int bos_default;          /* -1: none */
	int eos_default;          /* -1: none */
};

static const struct family families[] = {
	{
		/* configuration_mixtral.py: rms_norm_eps 1e-5, rope_theta
		 * 1e6, max_position_embeddings 4096 * 32, bos 1, eos 2;
		 * the router always renormalises the top-k weights. */
		.arch = ST_ARCH_MIXTRAL,
		.arch_name = "MixtralForCausalLM",
		.model_type = "mixtral",
		.inter_key = "intermediate_size",
		.norm_topk_default = -1,
		.qk_norm = 0,
		.rms_norm_eps_default = 1e-5f,
		.rope_theta_default = 1e6,
		.max_pos_default = 4096 * 32,
		.bos_default = 1,
		.eos_default = 2,
	},
	{
		/* configuration_qwen3_moe.py: norm_topk_prob False,
		 * rms_norm_eps 1e-6, rope_theta 10000 (v4 signature),
		 * max_position_embeddings 32768, no bos/eos. */
		.arch = ST_ARCH_QWEN3_MOE,
		.arch_name = "Qwen3MoeForCausalLM",
		.model_type = "qwen3_moe",
		.inter_key = "moe_intermediate_size",
		.norm_topk_default = 0,
		.qk_norm = 1,
		.rms_norm_eps_default = 1e-6f,
		.rope_theta_default = 10000.0,
		.max_pos_default = 32768,
		.bos_default = -1,
		.eos_default = -1,
	},
	{
		/* configuration_qwen2_moe.py (MODEL_FAMILIES.md 3):
		 * norm_topk_prob False, rms_norm_eps 1e-6, rope_theta
		 * 10000, max_position_embeddings 32768, no bos/eos; q/k/v
		 * with bias, no q/k norm; one shared expert of
		 * shared_expert_intermediate_size with a sigmoid gate. */
		.arch = ST_ARCH_QWEN2_MOE,
		.arch_name = "Qwen2MoeForCausalLM",
		.model_type = "qwen2_moe",
		.inter_key = "moe_intermediate_size",
		.norm_topk_default = 0,
		.qk_norm = 0,
		.shared = 1,
		.rms_norm_eps_default = 1e-6f,
		.rope_theta_default = 10000.0,
		.max_pos_default = 32768,
		.bos_default = -1,
		.eos_default = -1,
	},
};

#define SUPPORTED_LIST \
	"MixtralForCausalLM (mixtral), Qwen3MoeForCausalLM (qwen3_moe), " \
	"Qwen2MoeForCausalLM (qwen2_moe); strata convert also stores " \
	"DeepSeek-V4 (model_type deepseek_v4) and V4.1 (deepseek_v41) " \
	"checkpoints in their official layout"

const char *st_arch_name(enum st_arch a)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(families); i++)
		if (families[i].arch == a)
			return families[i].arch_name;
	return "unknown";
}

static const struct family *family_of(enum st_arch a)
{
	for (size_t i = 0; i < ST_ARRAY_SIZE(families); i++)
		if (families[i].arch == a)
			return &families[i];
	return NULL;
}

/* --- typed getters: each names the file and key in its message --- */

static int absent(const json_t *v)
{
	return !v || json_is_null(v);
}

static int get_int(const json_t *root, const char *key, int required,
		   long long lo, long long hi, int def, int *ret,
		   const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(root, key);
	long long x;

	if (absent(v)) {
		if (required)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: missing required key \"%s\"",
					   src, key);
		*ret = def;
		return 0;
	}
	if (!json_is_integer(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be an integer", src, key);
	x = json_integer_value(v);
	if (x < lo || x > hi)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" = %lld outside [%lld, %lld]",
				   src, key, x, lo, hi);
	*ret = (int)x;
	return 0;
}

static int get_bool(const json_t *root, const char *key, int def, int *ret,
		    const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(root, key);

	if (absent(v)) {
		*ret = def;
		return 0;
	}
	if (!json_is_boolean(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be true or false", src,
				   key);
	*ret = json_is_true(v);
	return 0;
}

static int get_number(const json_t *root, const char *key, double def,
		      double *ret, const char *src, struct st_diag *diag)
{
	const json_t *v = json_object_get(root, key);

	if (absent(v)) {
		*ret = def;
		return 0;
	}
	if (!json_is_number(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be a number", src, key);
	*ret = json_number_value(v);
	return 0;
}

/*
 * The expert count under any of its three spellings (MODEL_FAMILIES.md
 * 0.3); when several are present they must agree.
 */
static int get_n_experts(const json_t *root, int *ret, const char *src,
			 struct st_diag *diag)
{
	static const char *const keys[] = { "num_local_experts", "num_experts",
					     "n_routed_experts" };
	const char *found = NULL;
	int n = 0;

	for (size_t i = 0; i < ST_ARRAY_SIZE(keys); i++) {
		int v, r;

		if (absent(json_object_get(root, keys[i])))
			continue;
		r = get_int(root, keys[i], 1, 1, CFG_MAX_EXPERTS, 0, &v, src,
			    diag);
		if (r < 0)
			return r;
		if (found && v != n)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"%s\" = %d disagrees with \"%s\" = %d",
					   src, keys[i], v, found, n);
		found = keys[i];
		n = v;
	}
	if (!found)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: missing required key \"num_local_experts\" (or \"num_experts\" / \"n_routed_experts\")",
				   src);
	*ret = n;
	return 0;
}

/*
 * Adds token ids from an int, a list of ints, or null into cfg's EOS list,
 * skipping duplicates.  `key` and `src` are for messages.
 */
static int add_eos(struct st_model_config *cfg, const json_t *v,
		   const char *key, const char *src, struct st_diag *diag)
{
	size_t n = 1;

	if (absent(v))
		return 0;
	if (json_is_array(v))
		n = json_array_size(v);
	else if (!json_is_integer(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be an integer or a list of integers",
				   src, key);
	for (size_t i = 0; i < n; i++) {
		const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
		long long id;
		int dup = 0;

		if (!json_is_integer(e))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"%s\" must be an integer or a list of integers",
					   src, key);
		id = json_integer_value(e);
		if (id < 0 || id >= cfg->vocab_size)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"%s\" id %lld outside the vocabulary [0, %d)",
					   src, key, id, cfg->vocab_size);
		for (int j = 0; j < cfg->n_eos; j++)
			dup |= cfg->eos_token_ids[j] == id;
		if (dup)
			continue;
		if (cfg->n_eos >= ST_MAX_EOS)
			return st_diag_set(diag, -ST_E_LIMIT,
					   "%s: more than %d distinct EOS ids",
					   src, ST_MAX_EOS);
		cfg->eos_token_ids[cfg->n_eos++] = (int)id;
	}
	return 0;
}

/*
 * rope_scaling (v4) or rope_parameters (v5): null, absent, or an object
 * whose type ("rope_type", older "type") is absent or "default" means plain
 * RoPE.  rope_parameters may also carry rope_theta, which wins over a
 * top-level key.  Any real scaling (linear, dynamic, yarn, ...) is refused
 * in this slice.
 */
static int parse_rope(const json_t *root, const char *key,
		      struct st_model_config *cfg, const char *src,
		      struct st_diag *diag)
{
	const json_t *v = json_object_get(root, key);
	const json_t *t;
	const char *type = NULL;
	double theta;
	int r;

	if (absent(v))
		return 0;
	if (!json_is_object(v))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: \"%s\" must be an object or null", src,
				   key);
	t = json_object_get(v, "rope_type");
	if (absent(t))
		t = json_object_get(v, "type");
	if (!absent(t)) {
		if (!json_is_string(t))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"%s\".rope_type must be a string",
					   src, key);
		type = json_string_value(t);
	}
	if (type && strcmp(type, "default") != 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: \"%s\" of type \"%s\": RoPE scaling is not supported in this version",
				   src, key, type);
	if (!type && json_object_size(v) > 0 &&
	    absent(json_object_get(v, "rope_theta")))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: \"%s\" without a rope_type: RoPE scaling is not supported in this version",
				   src, key);
	r = get_number(v, "rope_theta", cfg->rope_theta, &theta, src, diag);
	if (r < 0)
		return r;
	cfg->rope_theta = theta;
	return 0;
}

/* Picks the family from "architectures" and "model_type" (they must agree
 * when both are present). */
static int find_family(const json_t *root, const struct family **ret,
		       const char *src, struct st_diag *diag)
{
	const json_t *archs = json_object_get(root, "architectures");
	const json_t *mt = json_object_get(root, "model_type");
	const char *arch = NULL, *type = NULL;
	const struct family *f = NULL;

	if (!absent(archs)) {
		if (!json_is_array(archs) || json_array_size(archs) < 1 ||
		    !json_is_string(json_array_get(archs, 0)))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"architectures\" must be a list of strings",
					   src);
		arch = json_string_value(json_array_get(archs, 0));
	}
	if (!absent(mt)) {
		if (!json_is_string(mt))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"model_type\" must be a string",
					   src);
		type = json_string_value(mt);
	}
	if (!arch && !type)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: neither \"architectures\" nor \"model_type\" is given",
				   src);
	for (size_t i = 0; i < ST_ARRAY_SIZE(families); i++) {
		const struct family *c = &families[i];

		if ((arch && strcmp(arch, c->arch_name) == 0) ||
		    (!arch && strcmp(type, c->model_type) == 0)) {
			f = c;
			break;
		}
	}
	if (!f)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: architecture \"%s\" (model_type \"%s\") is not supported; supported: "
				   SUPPORTED_LIST,
				   src, arch ? arch : "-", type ? type : "-");
	if (type && strcmp(type, f->model_type) != 0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: architecture \"%s\" with model_type \"%s\" (expected \"%s\")",
				   src, f->arch_name, type, f->model_type);
	*ret = f;
	return 0;
}

/* Qwen3-MoE: every layer must be an MoE layer (MODEL_FAMILIES.md 3.1). */
static int check_all_moe(const json_t *root, const char *src,
			 struct st_diag *diag)
{
	const json_t *mlp_only = json_object_get(root, "mlp_only_layers");
	int step, r;

	r = get_int(root, "decoder_sparse_step", 0, 1, CFG_MAX_DIM, 1, &step,
		    src, diag);
	if (r < 0)
		return r;
	if (step != 1)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: decoder_sparse_step %d: dense MLP layers are not supported in this version",
				   src, step);
	if (!absent(mlp_only)) {
		if (!json_is_array(mlp_only))
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: \"mlp_only_layers\" must be a list",
					   src);
		if (json_array_size(mlp_only) > 0)
			return st_diag_set(diag, -ST_E_UNSUPPORTED,
					   "%s: mlp_only_layers is not empty: dense MLP layers are not supported in this version",
					   src);
	}
	return 0;
}

/*
 * Sliding-window attention is refused.  Mixtral applies sliding_window in
 * every layer when it is set; a window at least as long as the context is
 * the same as full attention and is accepted.  Qwen3-MoE applies it only
 * when use_sliding_window is true (its config class drops it otherwise).
 */
static int check_no_sliding(const json_t *root, const struct family *f,
			    int max_pos, const char *src,
			    struct st_diag *diag)
{
	int use = 1, win, r;

	if (f->arch == ST_ARCH_QWEN3_MOE || f->arch == ST_ARCH_QWEN2_MOE) {
		r = get_bool(root, "use_sliding_window", 0, &use, src, diag);
		if (r < 0)
			return r;
	}
	if (!use || absent(json_object_get(root, "sliding_window")))
		return 0;
	r = get_int(root, "sliding_window", 1, 1, INT_MAX, 0, &win, src, diag);
	if (r < 0)
		return r;
	if (win >= max_pos)
		return 0;
	return st_diag_set(diag, -ST_E_UNSUPPORTED,
			   "%s: sliding_window %d < max_position_embeddings %d: sliding-window attention is not supported in this version",
			   src, win, max_pos);
}

static int parse_root(const json_t *root, const char *src,
		      struct st_model_config *cfg, struct st_diag *diag)
{
	const struct family *f = NULL;
	const json_t *act;
	double eps;
	int r, has_head_dim, attn_bias;

	if (!json_is_object(root))
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: top level is not a JSON object", src);
	memset(cfg, 0, sizeof(*cfg));
	r = find_family(root, &f, src, diag);
	if (r < 0)
		return r;
	cfg->arch = f->arch;
	snprintf(cfg->model_type, sizeof(cfg->model_type), "%s",
		 f->model_type);
	cfg->qk_norm = f->qk_norm;

#define INT_KEY(key, req, lo, def, field)                                    \
	do {                                                                 \
		r = get_int(root, key, req, lo, CFG_MAX_DIM, def, &cfg->field, \
			    src, diag);                                      \
		if (r < 0)                                                   \
			return r;                                            \
	} while (0)

	INT_KEY("hidden_size", 1, 1, 0, hidden_size);
	r = get_int(root, "num_hidden_layers", 1, 1, CFG_MAX_LAYERS, 0,
		    &cfg->n_layers, src, diag);
	if (r < 0)
		return r;
	INT_KEY("num_attention_heads", 1, 1, 0, n_heads);
	INT_KEY("num_key_value_heads", 1, 1, 0, n_kv_heads);
	INT_KEY("vocab_size", 1, 1, 0, vocab_size);
	INT_KEY("num_experts_per_tok", 1, 1, 0, top_k);
	INT_KEY(f->inter_key, 1, 1, 0, expert_inter);
	INT_KEY("max_position_embeddings", 0, 1, f->max_pos_default,
		max_position_embeddings);
	INT_KEY("bos_token_id", 0, 0, f->bos_default, bos_token_id);
#undef INT_KEY
	r = get_n_experts(root, &cfg->n_experts, src, diag);
	if (r < 0)
		return r;

	has_head_dim = !absent(json_object_get(root, "head_dim"));
	if (has_head_dim) {
		r = get_int(root, "head_dim", 1, 1, CFG_MAX_DIM, 0,
			    &cfg->head_dim, src, diag);
		if (r < 0)
			return r;
	} else {
		if (cfg->hidden_size % cfg->n_heads)
			return st_diag_set(diag, -ST_E_CONFIG,
					   "%s: no head_dim and hidden_size %d is not a multiple of num_attention_heads %d",
					   src, cfg->hidden_size, cfg->n_heads);
		cfg->head_dim = cfg->hidden_size / cfg->n_heads;
	}
	if (cfg->head_dim % 2)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: head_dim %d is odd (half-split RoPE pairs i, i + head_dim/2)",
				   src, cfg->head_dim);
	if (cfg->n_heads % cfg->n_kv_heads)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
				   src, cfg->n_heads, cfg->n_kv_heads);
	if ((int64_t)cfg->n_heads * cfg->head_dim > CFG_MAX_DIM)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_attention_heads x head_dim too large",
				   src);
	if (cfg->top_k > cfg->n_experts)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: num_experts_per_tok %d > number of experts %d",
				   src, cfg->top_k, cfg->n_experts);
	if (cfg->bos_token_id >= cfg->vocab_size)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: bos_token_id %d outside the vocabulary [0, %d)",
				   src, cfg->bos_token_id, cfg->vocab_size);

	if (f->norm_topk_default < 0) {
		cfg->norm_topk_prob = 1;
	} else {
		r = get_bool(root, "norm_topk_prob", f->norm_topk_default,
			     &cfg->norm_topk_prob, src, diag);
		if (r < 0)
			return r;
	}
	r = get_bool(root, "tie_word_embeddings", 0,
		     &cfg->tie_word_embeddings, src, diag);
	if (r < 0)
		return r;
	r = get_bool(root, "attention_bias", 0, &attn_bias, src, diag);
	if (r < 0)
		return r;
	if (attn_bias)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: attention_bias true is not supported for %s",
				   src, f->arch_name);
	act = json_object_get(root, "hidden_act");
	if (!absent(act) && (!json_is_string(act) ||
			     strcmp(json_string_value(act), "silu") != 0))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "%s: hidden_act must be \"silu\"", src);

	r = get_number(root, "rms_norm_eps", f->rms_norm_eps_default, &eps,
		       src, diag);
	if (r < 0)
		return r;
	if (!(eps > 0.0 && eps < 1.0))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: rms_norm_eps %g outside (0, 1)", src,
				   eps);
	cfg->rms_norm_eps = (float)eps;
	r = get_number(root, "rope_theta", f->rope_theta_default,
		       &cfg->rope_theta, src, diag);
	if (r < 0)
		return r;
	r = parse_rope(root, "rope_scaling", cfg, src, diag);
	if (r < 0)
		return r;
	r = parse_rope(root, "rope_parameters", cfg, src, diag);
	if (r < 0)
		return r;
	if (!(cfg->rope_theta > 1.0 && cfg->rope_theta < 1e12))
		return st_diag_set(diag, -ST_E_CONFIG,
				   "%s: rope_theta %g outside (1, 1e12)", src,
				   cfg->rope_theta);

	if (f->shared) {
		/* qwen2_moe: the shared expert is always there (HF builds it
		 * unconditionally), its width a shape key, so required */
		r = get_int(root, "shared_expert_intermediate_size", 1, 1,
			    CFG_MAX_DIM, 0, &cfg->shared_inter, src, diag);
		if (r < 0)
			return r;
		cfg->shared_gate = 1;
		/* "qkv_bias" is v5-only; absent means biased q/k/v (3.1) */
		r = get_bool(root, "qkv_bias", 1, &cfg->qkv_bias, src, diag);
		if (r < 0)
			return r;
	}
	if (f->arch == ST_ARCH_QWEN3_MOE || f->arch == ST_ARCH_QWEN2_MOE) {
		r = check_all_moe(root, src, diag);
		if (r < 0)
			return r;
	}
	r = check_no_sliding(root, f, cfg->max_position_embeddings, src,
			     diag);
	if (r < 0)
		return r;

	if (absent(json_object_get(root, "eos_token_id"))) {
		if (f->eos_default >= 0 && f->eos_default < cfg->vocab_size)
			cfg->eos_token_ids[cfg->n_eos++] = f->eos_default;
		return 0;
	}
	return add_eos(cfg, json_object_get(root, "eos_token_id"),
		       "eos_token_id", src, diag);
}

static json_t *parse_json(const char *text, const char *src, int *ret_err,
			  struct st_diag *diag)
{
	json_error_t jerr;
	json_t *root;

	if (!text) {
		*ret_err = st_diag_set(diag, -EINVAL, "%s: no text", src);
		return NULL;
	}
	root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		*ret_err = st_diag_set(diag, -ST_E_FORMAT,
				       "%s: line %d column %d: %s", src,
				       jerr.line, jerr.column, jerr.text);
	return root;
}

int st_config_parse(const char *json_text, const char *source,
		    struct st_model_config *ret, struct st_diag *diag)
{
	const char *src = source ? source : "config.json";
	json_t *root;
	int r = 0;

	root = parse_json(json_text, src, &r, diag);
	if (!root)
		return r;
	r = parse_root(root, src, ret, diag);
	json_decref(root);
	return r;
}

/* Merges generation_config.json's eos_token_id (int or list) into cfg. */
static int merge_generation_config(const char *path,
				   struct st_model_config *cfg,
				   struct st_diag *diag)
{
	char *text = NULL;
	size_t len;
	json_t *root;
	int r;

	r = st_read_file(path, &text, &len);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	root = parse_json(text, path, &r, diag);
	free(text);
	if (!root)
		return r;
	if (!json_is_object(root))
		r = st_diag_set(diag, -ST_E_FORMAT,
				"%s: top level is not a JSON object", path);
	else
		r = add_eos(cfg, json_object_get(root, "eos_token_id"),
			    "eos_token_id", path, diag);
	json_decref(root);
	return r;
}

int st_config_load(const char *dir, struct st_model_config *ret,
		   struct st_diag *diag)
{
	char path[4096];
	char *text = NULL;
	size_t len;
	int r;

	if (snprintf(path, sizeof(path), "%s/config.json", dir) >=
	    (int)sizeof(path))
		return st_diag_set(diag, -ENAMETOOLONG, "%s: path too long",
				   dir);
	r = st_read_file(path, &text, &len);
	if (r < 0)
		return st_diag_set(diag, r, "%s: %s", path, st_strerror(r));
	if (strlen(text) != len) {
		free(text);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: contains a NUL byte", path);
	}
	r = st_config_parse(text, path, ret, diag);
	free(text);
	if (r < 0)
		return r;
	if (snprintf(path, sizeof(path), "%s/generation_config.json", dir) >=
	    (int)sizeof(path))
		return st_diag_set(diag, -ENAMETOOLONG, "%s: path too long",
				   dir);
	return merge_generation_config(path, ret, diag);
}

/* --- tensor names and shapes --- */

/* snprintf's result as this file's return code. */
static int name_result(int n, size_t len)
{
	return (n < 0 || (size_t)n >= len) ? -ENAMETOOLONG : 0;
}

int st_expert_tensor_name(const struct st_model_config *cfg, int layer,
			  int expert, enum st_expert_mat m, char *buf,
			  size_t len)
{
	static const char *const mixtral[] = { "w1", "w3", "w2" };
	static const char *const qwen[] = { "gate_proj", "up_proj",
					    "down_proj" };

	if (!cfg || layer < 0 || layer >= cfg->n_layers || expert < 0 ||
	    expert >= cfg->n_experts || (unsigned)m > ST_EXPERT_DOWN)
		return -EINVAL;
	if (!buf)
		return -ENAMETOOLONG;
	switch (cfg->arch) {
	case ST_ARCH_MIXTRAL:
		return name_result(snprintf(buf, len,
			"model.layers.%d.block_sparse_moe.experts.%d.%s.weight",
			layer, expert, mixtral[m]), len);
	case ST_ARCH_QWEN3_MOE:
	case ST_ARCH_QWEN2_MOE:
		return name_result(snprintf(buf, len,
			"model.layers.%d.mlp.experts.%d.%s.weight",
			layer, expert, qwen[m]), len);
	}
	return -EINVAL;
}

int st_dense_tensor_name(const struct st_model_config *cfg,
			 enum st_dense_role role, int layer, char *buf,
			 size_t len)
{
	const char *sub;

	if (!cfg || !family_of(cfg->arch))
		return -EINVAL;
	if (!buf)
		return -ENAMETOOLONG;
	switch (role) {
	case ST_T_EMBED:
		sub = "model.embed_tokens.weight";
		return name_result(snprintf(buf, len, "%s", sub), len);
	case ST_T_FINAL_NORM:
		sub = "model.norm.weight";
		return name_result(snprintf(buf, len, "%s", sub), len);
	case ST_T_LM_HEAD:
		sub = cfg->tie_word_embeddings ? "model.embed_tokens.weight" :
						 "lm_head.weight";
		return name_result(snprintf(buf, len, "%s", sub), len);
	default:
		break;
	}
	if (layer < 0 || layer >= cfg->n_layers)
		return -EINVAL;
	switch (role) {
	case ST_T_ATTN_NORM: sub = "input_layernorm"; break;
	case ST_T_Q: sub = "self_attn.q_proj"; break;
	case ST_T_K: sub = "self_attn.k_proj"; break;
	case ST_T_V: sub = "self_attn.v_proj"; break;
	case ST_T_O: sub = "self_attn.o_proj"; break;
	case ST_T_Q_NORM:
	case ST_T_K_NORM:
		if (!cfg->qk_norm)
			return -ST_E_NOTFOUND;
		sub = role == ST_T_Q_NORM ? "self_attn.q_norm" :
					    "self_attn.k_norm";
		break;
	case ST_T_FFN_NORM: sub = "post_attention_layernorm"; break;
	case ST_T_ROUTER:
		sub = cfg->arch == ST_ARCH_MIXTRAL ? "block_sparse_moe.gate" :
						     "mlp.gate";
		break;
	case ST_T_Q_BIAS:
	case ST_T_K_BIAS:
	case ST_T_V_BIAS:
		if (!cfg->qkv_bias)
			return -ST_E_NOTFOUND;
		sub = role == ST_T_Q_BIAS ? "q_proj" :
		      role == ST_T_K_BIAS ? "k_proj" : "v_proj";
		return name_result(snprintf(buf, len,
			"model.layers.%d.self_attn.%s.bias", layer, sub), len);
	case ST_T_SHEXP_GATE: sub = "mlp.shared_expert.gate_proj"; break;
	case ST_T_SHEXP_UP: sub = "mlp.shared_expert.up_proj"; break;
	case ST_T_SHEXP_DOWN: sub = "mlp.shared_expert.down_proj"; break;
	case ST_T_SHEXP_SCORE:
		if (!cfg->shared_gate)
			return -ST_E_NOTFOUND;
		sub = "mlp.shared_expert_gate";
		break;
	default:
		return -EINVAL;
	}
	if ((role == ST_T_SHEXP_GATE || role == ST_T_SHEXP_UP ||
	     role == ST_T_SHEXP_DOWN) && !cfg->shared_inter)
		return -ST_E_NOTFOUND;
	return name_result(snprintf(buf, len, "model.layers.%d.%s.weight",
				    layer, sub), len);
}

void st_dense_tensor_shape(const struct st_model_config *cfg,
			   enum st_dense_role role, int64_t *ret_rows,
			   int64_t *ret_cols)
{
	int64_t h = cfg->hidden_size, q = (int64_t)cfg->n_heads * cfg->head_dim;
	int64_t kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
	int64_t rows = 0, cols = 0;

	switch (role) {
	case ST_T_EMBED:
	case ST_T_LM_HEAD:
		rows = cfg->vocab_size;
		cols = h;
		break;
	case ST_T_FINAL_NORM:
	case ST_T_ATTN_NORM:
	case ST_T_FFN_NORM:
		rows = h;
		break;
	case ST_T_Q:
		rows = q;
		cols = h;
		break;
	case ST_T_K:
	case ST_T_V:
		rows = kv;
		cols = h;
		break;
	case ST_T_O:
		rows = h;
		cols = q;
		break;
	case ST_T_Q_NORM:
	case ST_T_K_NORM:
		rows = cfg->qk_norm ? cfg->head_dim : 0;
		break;
	case ST_T_ROUTER:
		rows = cfg->n_experts;
		cols = h;
		break;
	case ST_T_Q_BIAS:
		rows = cfg->qkv_bias ? q : 0;
		break;
	case ST_T_K_BIAS:
	case ST_T_V_BIAS:
		rows = cfg->qkv_bias ? kv : 0;
		break;
	case ST_T_SHEXP_GATE:
	case ST_T_SHEXP_UP:
		rows = cfg->shared_inter;
		cols = cfg->shared_inter ? h : 0;
		break;
	case ST_T_SHEXP_DOWN:
		rows = cfg->shared_inter ? h : 0;
		cols = cfg->shared_inter;
		break;
	case ST_T_SHEXP_SCORE:
		rows = cfg->shared_gate ? 1 : 0;
		cols = cfg->shared_gate ? h : 0;
		break;
	default:
		break;
	}
	*ret_rows = rows;
	*ret_cols = cols;
}

void st_expert_tensor_shape(const struct st_model_config *cfg,
			    enum st_expert_mat m, int64_t *ret_rows,
			    int64_t *ret_cols)
{
	int64_t h = cfg->hidden_size, i = cfg->expert_inter;

	*ret_rows = 0;
	*ret_cols = 0;
	if (m == ST_EXPERT_GATE || m == ST_EXPERT_UP) {
		*ret_rows = i;
		*ret_cols = h;
	} else if (m == ST_EXPERT_DOWN) {
		*ret_rows = h;
		*ret_cols = i;
	}
}
