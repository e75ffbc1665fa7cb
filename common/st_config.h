/*
 * st_config.h — the model configuration strata needs, read from a Hugging
 * Face config.json (families and key spellings: MODEL_FAMILIES.md sections
 * 0.3, 2.1, 3.1, 4.1).  Supported in this slice: MixtralForCausalLM
 * (mixtral), Qwen3MoeForCausalLM (qwen3_moe) and Qwen2MoeForCausalLM
 * (qwen2_moe: q/k/v biases and one shared expert with a sigmoid gate).
 */
#ifndef ST_CONFIG_H
#define ST_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

enum st_arch { ST_ARCH_MIXTRAL = 1, ST_ARCH_QWEN3_MOE = 2, ST_ARCH_QWEN2_MOE = 3 };

#define ST_MAX_EOS 8

struct st_model_config {
	enum st_arch arch;
	char model_type[32];     /* "mixtral", "qwen3_moe" */
	int hidden_size;         /* H */
	int n_layers;
	int n_heads;             /* query heads */
	int n_kv_heads;
	int head_dim;            /* "head_dim" key, else H / n_heads */
	int vocab_size;          /* embedding rows (>= tokenizer vocabulary) */
	int n_experts;           /* num_local_experts / num_experts / n_routed_experts */
	int top_k;               /* num_experts_per_tok */
	int expert_inter;        /* per-expert FFN width: mixtral intermediate_size,
				  * qwen3_moe moe_intermediate_size */
	int norm_topk_prob;      /* renormalise top-k weights (mixtral: always 1;
				  * qwen3_moe: key, default per family: false in
				  * HF Qwen3MoeConfig) */
	int qk_norm;             /* per-head RMSNorm of q and k (qwen3_moe) */
	int tie_word_embeddings; /* lm_head = embed_tokens */
	int qkv_bias;            /* q/k/v projections have biases (qwen2_moe:
				  * "qkv_bias", default true; MODEL_FAMILIES.md
				  * 3.1) */
	int shared_inter;        /* width of the shared-expert SwiGLU MLP, 0 =
				  * none (qwen2_moe:
				  * shared_expert_intermediate_size) */
	int shared_gate;         /* the shared expert's output is scaled by
				  * sigmoid(w_sg . x) (qwen2_moe
				  * mlp.shared_expert_gate) */
	float rms_norm_eps;
	double rope_theta;
	int max_position_embeddings;
	int bos_token_id;        /* config value (family default: mixtral 1,
				  * qwen3_moe none); -1 if none.  Whether a
				  * BOS is prepended is the tokenizer's
				  * business, not this field's. */
	int n_eos;
	int eos_token_ids[ST_MAX_EOS]; /* from config.json and generation_config.json */
};

/*
 * Parses config.json text (NUL-terminated).  `source` names the file in
 * messages.  The family comes from architectures[0] (else model_type); both
 * must agree when present.
 * Required keys (-ST_E_CONFIG naming the key when missing): hidden_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size,
 * num_experts_per_tok, the expert count (any alias of MODEL_FAMILIES.md
 * 0.3; several must agree), the expert width (mixtral intermediate_size,
 * qwen3_moe moe_intermediate_size).  Other keys take the family's HF
 * default when missing: rms_norm_eps (1e-5 / 1e-6), rope_theta (1e6 /
 * 1e4), max_position_embeddings, norm_topk_prob (qwen3_moe false),
 * tie_word_embeddings (false), bos/eos (mixtral 1/2, qwen3_moe none).
 * Validates: known architecture (else -ST_E_UNSUPPORTED naming it and the
 * supported ones), sizes in [1, 2^30], even head_dim, n_heads % n_kv_heads
 * == 0, top_k <= n_experts, token ids inside the vocabulary, at most
 * ST_MAX_EOS distinct EOS ids (-ST_E_LIMIT), hidden_act silu, no attention
 * bias, every layer MoE (qwen3_moe: decoder_sparse_step 1 and
 * mlp_only_layers empty), no sliding window shorter than the context, no
 * RoPE scaling (rope_scaling / rope_parameters of a type other than
 * "default": -ST_E_UNSUPPORTED; rope_parameters.rope_theta is read).
 * Returns 0, -ST_E_FORMAT (not JSON), -ST_E_CONFIG, -ST_E_UNSUPPORTED or
 * -ST_E_LIMIT, with diag.
 */
int st_config_parse(const char *json_text, const char *source,
		    struct st_model_config *ret, struct st_diag *diag);

/* Reads DIR/config.json (and DIR/generation_config.json if present, whose
 * eos_token_id, int or list, is merged after config.json's without
 * duplicates) and parses it.  0 or negative code with diag (-errno of the
 * read of config.json, or st_config_parse's codes for either file). */
int st_config_load(const char *dir, struct st_model_config *ret,
		   struct st_diag *diag);

/* Which matrix of a SwiGLU expert: y = down(silu(gate x) * up x). */
enum st_expert_mat { ST_EXPERT_GATE = 0, ST_EXPERT_UP = 1, ST_EXPERT_DOWN = 2 };

/*
 * Checkpoint tensor name of one expert matrix, per family:
 *  mixtral   model.layers.L.block_sparse_moe.experts.E.{w1,w3,w2}.weight
 *  qwen3_moe model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
 * Writes into buf (len bytes).  Returns 0, -ENAMETOOLONG, or -EINVAL for a
 * layer / expert / matrix out of range.
 */
int st_expert_tensor_name(const struct st_model_config *cfg, int layer,
			  int expert, enum st_expert_mat m, char *buf,
			  size_t len);

/*
 * Name of a dense tensor by role, per family (MODEL_FAMILIES.md 2.2, 4.2):
 * model.embed_tokens.weight, model.norm.weight, lm_head.weight (when tied:
 * model.embed_tokens.weight), and under model.layers.L.: input_layernorm,
 * self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm (qwen3_moe),
 * post_attention_layernorm, router block_sparse_moe.gate (mixtral) or
 * mlp.gate (qwen3_moe), each + ".weight".  `layer` is ignored for global
 * roles.  Returns 0, -ENAMETOOLONG, -EINVAL (layer or role out of range),
 * or -ST_E_NOTFOUND when the family has no such tensor (q_norm/k_norm on
 * mixtral).
 */
enum st_dense_role {
	ST_T_EMBED = 0, ST_T_FINAL_NORM, ST_T_LM_HEAD,
	ST_T_ATTN_NORM, ST_T_Q, ST_T_K, ST_T_V, ST_T_O, ST_T_Q_NORM, ST_T_K_NORM,
	ST_T_FFN_NORM, ST_T_ROUTER,
	/* qwen2_moe only (-ST_E_NOTFOUND elsewhere): q/k/v biases [rows],
	 * the shared expert's SwiGLU matrices (gate/up [S, H], down [H, S],
	 * S = shared_inter) and its sigmoid gate [1, H]; names
	 * self_attn.{q,k,v}_proj.bias, mlp.shared_expert.{gate,up,down}_proj
	 * .weight, mlp.shared_expert_gate.weight (MODEL_FAMILIES.md 3.2) */
	ST_T_Q_BIAS, ST_T_K_BIAS, ST_T_V_BIAS,
	ST_T_SHEXP_GATE, ST_T_SHEXP_UP, ST_T_SHEXP_DOWN, ST_T_SHEXP_SCORE,
	ST_T_ROLE_COUNT
};
int st_dense_tensor_name(const struct st_model_config *cfg,
			 enum st_dense_role role, int layer, char *buf,
			 size_t len);

/*
 * Expected shape [rows, cols] (or [n] with cols = 0 for vectors) of a dense
 * role or expert matrix, from the config; used to validate checkpoints.
 * Roles the family lacks (q_norm on mixtral) give [0, 0].
 * Q [n_heads*head_dim, H], K/V [n_kv_heads*head_dim, H], O [H,
 * n_heads*head_dim], norms [H], q/k norms [head_dim], router [E, H],
 * embed/lm_head [V, H]; expert gate/up [I, H], down [H, I].
 */
void st_dense_tensor_shape(const struct st_model_config *cfg,
			   enum st_dense_role role, int64_t *ret_rows,
			   int64_t *ret_cols);
void st_expert_tensor_shape(const struct st_model_config *cfg,
			    enum st_expert_mat m, int64_t *ret_rows,
			    int64_t *ret_cols);

/* Name of an architecture ("MixtralForCausalLM", ...). */
const char *st_arch_name(enum st_arch a);

#endif
