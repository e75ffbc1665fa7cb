/*
 * test_config.c — config.json parsing against the fixtures' documented
 * values (fixture READMEs and MODEL_FAMILIES.md 2.1 / 4.1), the refusals
 * (unknown architecture, missing keys, RoPE scaling, sliding window, dense
 * layers), family defaults (PITFALLS P4), EOS merging with
 * generation_config.json, and the tensor names and shapes checked against
 * the fixtures' real checkpoints (every tensor accounted for).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "st_config.h"
#include "st_error.h"
#include "st_safetensors.h"
#include "st_util.h"
#include "test_util.h"

static char tmp_root[256];

static const char *fixture(const char *name, char *buf, size_t len)
{
	return st_test_fixture_model(name, buf, len);
}

static void load_fixture(const char *name, struct st_model_config *cfg)
{
	char dir[1024];
	struct st_diag diag = { { 0 } };

	if (st_config_load(fixture(name, dir, sizeof(dir)), cfg, &diag) != 0)
		fail_msg("%s: %s", name, diag.msg);
}

/* The fixture's config.json as a jansson object, to edit. */
static json_t *fixture_json(const char *name)
{
	char dir[1024], path[1100];
	json_error_t err;
	json_t *j;

	snprintf(path, sizeof(path), "%s/config.json",
		 fixture(name, dir, sizeof(dir)));
	j = json_load_file(path, 0, &err);
	assert_non_null(j);
	return j;
}

/* Parses an edited config; returns the code, message into diag. */
static int parse_json(json_t *j, struct st_model_config *cfg,
		      struct st_diag *diag)
{
	char *text = json_dumps(j, 0);
	int r;

	assert_non_null(text);
	r = st_config_parse(text, "edited.json", cfg, diag);
	free(text);
	return r;
}

static void expect_parse(json_t *j, int code, const char *s1, const char *s2)
{
	struct st_model_config cfg;
	struct st_diag diag = { { 0 } };
	int r = parse_json(j, &cfg, &diag);

	if (r != code)
		fprintf(stderr, "got %d (%s), want %d\n", r, diag.msg, code);
	assert_int_equal(r, code);
	if (s1 && !strstr(diag.msg, s1))
		fail_msg("message \"%s\" lacks \"%s\"", diag.msg, s1);
	if (s2 && !strstr(diag.msg, s2))
		fail_msg("message \"%s\" lacks \"%s\"", diag.msg, s2);
}

/* kjv-moe README "Model" table. */
static void test_kjv_moe(void **state)
{
	struct st_model_config c;

	load_fixture("kjv-moe", &c);
	assert_int_equal(c.arch, ST_ARCH_MIXTRAL);
	assert_string_equal(c.model_type, "mixtral");
	assert_string_equal(st_arch_name(c.arch), "MixtralForCausalLM");
	assert_int_equal(c.n_layers, 6);
	assert_int_equal(c.hidden_size, 128);
	assert_int_equal(c.vocab_size, 2048);
	assert_int_equal(c.max_position_embeddings, 256);
	assert_int_equal(c.n_heads, 4);
	assert_int_equal(c.n_kv_heads, 2);
	assert_int_equal(c.head_dim, 32);
	assert_int_equal(c.n_experts, 16);
	assert_int_equal(c.top_k, 2);
	assert_int_equal(c.expert_inter, 192);
	assert_int_equal(c.norm_topk_prob, 1);
	assert_int_equal(c.qk_norm, 0);
	assert_int_equal(c.tie_word_embeddings, 0);
	assert_true(c.rms_norm_eps == 1e-5f);
	assert_true(c.rope_theta == 10000.0);
	assert_int_equal(c.bos_token_id, 1);
	assert_int_equal(c.n_eos, 1);
	assert_int_equal(c.eos_token_ids[0], 2);
}

/* tiny-mixtral README / config.json (head_dim from hidden / heads). */
static void test_tiny_mixtral(void **state)
{
	struct st_model_config c;

	load_fixture("tiny-mixtral", &c);
	assert_int_equal(c.arch, ST_ARCH_MIXTRAL);
	assert_int_equal(c.hidden_size, 64);
	assert_int_equal(c.n_layers, 4);
	assert_int_equal(c.n_heads, 4);
	assert_int_equal(c.n_kv_heads, 2);
	assert_int_equal(c.head_dim, 16); /* no head_dim key: 64 / 4 */
	assert_int_equal(c.vocab_size, 32000);
	assert_int_equal(c.n_experts, 8);
	assert_int_equal(c.top_k, 2);
	assert_int_equal(c.expert_inter, 128);
	assert_int_equal(c.norm_topk_prob, 1);
	assert_true(c.rope_theta == 1e6);
	assert_true(c.rms_norm_eps == 1e-5f);
	assert_int_equal(c.max_position_embeddings, 32768);
	assert_int_equal(c.tie_word_embeddings, 0);
	assert_int_equal(c.bos_token_id, 1);
	/* config and generation_config both say 2: merged once */
	assert_int_equal(c.n_eos, 1);
	assert_int_equal(c.eos_token_ids[0], 2);
}

/* tiny-qwen3moe README "The model" table. */
static void test_tiny_qwen3moe(void **state)
{
	struct st_model_config c;

	load_fixture("tiny-qwen3moe", &c);
	assert_int_equal(c.arch, ST_ARCH_QWEN3_MOE);
	assert_string_equal(c.model_type, "qwen3_moe");
	assert_string_equal(st_arch_name(c.arch), "Qwen3MoeForCausalLM");
	assert_int_equal(c.hidden_size, 32);
	assert_int_equal(c.n_layers, 4);
	assert_int_equal(c.n_heads, 4);
	/* head_dim key 16, not hidden 32 / 4 heads = 8 */
	assert_int_equal(c.head_dim, 16);
	assert_int_equal(c.n_kv_heads, 2);
	assert_int_equal(c.n_experts, 16);
	assert_int_equal(c.top_k, 4);
	assert_int_equal(c.expert_inter, 96); /* moe_intermediate_size */
	assert_int_equal(c.norm_topk_prob, 1);
	assert_int_equal(c.qk_norm, 1);
	assert_int_equal(c.tie_word_embeddings, 1);
	assert_true(c.rms_norm_eps == 1e-6f);
	assert_true(c.rope_theta == 1e6);
	assert_int_equal(c.vocab_size, 151936);
	assert_int_equal(c.max_position_embeddings, 40960);
	/* config 151645, generation_config [151645, 151643] */
	assert_int_equal(c.n_eos, 2);
	assert_int_equal(c.eos_token_ids[0], 151645);
	assert_int_equal(c.eos_token_ids[1], 151643);
}

/* Qwen2-MoE (MODEL_FAMILIES.md 3): the Qwen1.5-MoE-A2.7B shape, built on
 * the tiny-qwen3moe config with the family's keys; its q/k/v biases and
 * gated shared expert, tensor names and shapes, and refusals. */
static void test_qwen2moe(void **state)
{
	json_t *j = fixture_json("tiny-qwen3moe");
	struct st_model_config c;
	struct st_diag d = { { 0 } };
	int64_t rows, cols;
	char tn[256];

	(void)state;
	json_object_set_new(j, "architectures",
			    json_pack("[s]", "Qwen2MoeForCausalLM"));
	json_object_set_new(j, "model_type", json_string("qwen2_moe"));
	json_object_del(j, "head_dim");
	json_object_del(j, "norm_topk_prob");
	/* the shared expert's width is a shape key: required */
	expect_parse(j, -ST_E_CONFIG, "shared_expert_intermediate_size", NULL);
	json_object_set_new(j, "shared_expert_intermediate_size",
			    json_integer(80));
	assert_int_equal(parse_json(j, &c, &d), 0);
	assert_int_equal(c.arch, ST_ARCH_QWEN2_MOE);
	assert_string_equal(st_arch_name(c.arch), "Qwen2MoeForCausalLM");
	assert_int_equal(c.head_dim, 8);       /* hidden 32 / 4 heads */
	assert_int_equal(c.qk_norm, 0);
	assert_int_equal(c.qkv_bias, 1);       /* "qkv_bias" absent: true */
	assert_int_equal(c.shared_inter, 80);
	assert_int_equal(c.shared_gate, 1);
	assert_int_equal(c.norm_topk_prob, 0); /* family default false */
	assert_int_equal(st_dense_tensor_name(&c, ST_T_K_BIAS, 2, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.2.self_attn.k_proj.bias");
	st_dense_tensor_shape(&c, ST_T_K_BIAS, &rows, &cols);
	assert_true(rows == 2 * 8 && cols == 0);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_SHEXP_DOWN, 1, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.1.mlp.shared_expert.down_proj.weight");
	st_dense_tensor_shape(&c, ST_T_SHEXP_DOWN, &rows, &cols);
	assert_true(rows == 32 && cols == 80);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_SHEXP_SCORE, 0, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.mlp.shared_expert_gate.weight");
	st_dense_tensor_shape(&c, ST_T_SHEXP_SCORE, &rows, &cols);
	assert_true(rows == 1 && cols == 32);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_Q_NORM, 0, tn,
					      sizeof(tn)), -ST_E_NOTFOUND);
	assert_int_equal(st_expert_tensor_name(&c, 0, 3, ST_EXPERT_UP, tn,
					       sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.mlp.experts.3.up_proj.weight");
	/* v5's qkv_bias false: no bias tensors */
	json_object_set_new(j, "qkv_bias", json_false());
	assert_int_equal(parse_json(j, &c, &d), 0);
	assert_int_equal(c.qkv_bias, 0);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_Q_BIAS, 0, tn,
					      sizeof(tn)), -ST_E_NOTFOUND);
	/* dense MLP layers are refused as for Qwen3-MoE */
	json_object_set_new(j, "decoder_sparse_step", json_integer(2));
	expect_parse(j, -ST_E_UNSUPPORTED, "decoder_sparse_step", NULL);
	json_decref(j);

	/* the other families have no shared expert or biases */
	load_fixture("tiny-qwen3moe", &c);
	assert_int_equal(c.shared_inter, 0);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_SHEXP_GATE, 0, tn,
					      sizeof(tn)), -ST_E_NOTFOUND);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_V_BIAS, 0, tn,
					      sizeof(tn)), -ST_E_NOTFOUND);
}

static void test_unknown_arch(void **state)
{
	json_t *j = fixture_json("tiny-mixtral");

	json_object_set_new(j, "architectures",
			    json_pack("[s]", "DeepseekV4ForCausalLM"));
	json_object_set_new(j, "model_type", json_string("deepseek_v4"));
	expect_parse(j, -ST_E_UNSUPPORTED, "DeepseekV4ForCausalLM",
		     "supported: MixtralForCausalLM (mixtral), Qwen3MoeForCausalLM (qwen3_moe)");
	/* the families strata convert handles elsewhere are named too */
	expect_parse(j, -ST_E_UNSUPPORTED, "DeepseekV4ForCausalLM",
		     "DeepSeek-V4 (model_type deepseek_v4) and V4.1 (deepseek_v41)");
	/* model_type alone selects the family */
	json_object_del(j, "architectures");
	json_object_set_new(j, "model_type", json_string("mixtral"));
	expect_parse(j, 0, NULL, NULL);
	json_object_set_new(j, "model_type", json_string("olmoe"));
	expect_parse(j, -ST_E_UNSUPPORTED, "olmoe", NULL);
	/* disagreeing architectures / model_type */
	json_object_set_new(j, "architectures",
			    json_pack("[s]", "MixtralForCausalLM"));
	json_object_set_new(j, "model_type", json_string("qwen3_moe"));
	expect_parse(j, -ST_E_CONFIG, "qwen3_moe", NULL);
	json_decref(j);
}

static void test_missing_keys(void **state)
{
	static const char *const required[] = {
		"hidden_size", "num_hidden_layers", "num_attention_heads",
		"num_key_value_heads", "vocab_size", "num_experts_per_tok",
		"moe_intermediate_size", "num_experts",
	};

	for (size_t i = 0; i < ST_ARRAY_SIZE(required); i++) {
		json_t *j = fixture_json("tiny-qwen3moe");

		json_object_del(j, required[i]);
		expect_parse(j, -ST_E_CONFIG, "missing required key",
			     required[i]);
		json_decref(j);
	}
	/* mixtral's expert width is intermediate_size */
	json_t *j = fixture_json("kjv-moe");

	json_object_del(j, "intermediate_size");
	expect_parse(j, -ST_E_CONFIG, "intermediate_size", NULL);
	json_decref(j);
	/* wrong types and values */
	j = fixture_json("kjv-moe");
	json_object_set_new(j, "hidden_size", json_string("128"));
	expect_parse(j, -ST_E_CONFIG, "hidden_size", "integer");
	json_object_set_new(j, "hidden_size", json_integer(0));
	expect_parse(j, -ST_E_CONFIG, "hidden_size", NULL);
	json_object_set_new(j, "hidden_size", json_integer(128));
	json_object_set_new(j, "num_key_value_heads", json_integer(3));
	expect_parse(j, -ST_E_CONFIG, "num_key_value_heads", NULL);
	json_object_set_new(j, "num_key_value_heads", json_integer(2));
	json_object_set_new(j, "num_experts_per_tok", json_integer(17));
	expect_parse(j, -ST_E_CONFIG, "num_experts_per_tok 17", NULL);
	json_object_set_new(j, "num_experts_per_tok", json_integer(2));
	json_object_set_new(j, "eos_token_id", json_integer(2048));
	expect_parse(j, -ST_E_CONFIG, "eos_token_id", "vocabulary");
	json_object_set_new(j, "eos_token_id", json_integer(2));
	json_object_set_new(j, "tie_word_embeddings", json_integer(1));
	expect_parse(j, -ST_E_CONFIG, "tie_word_embeddings", NULL);
	json_object_set_new(j, "tie_word_embeddings", json_false());
	json_object_set_new(j, "hidden_act", json_string("gelu"));
	expect_parse(j, -ST_E_UNSUPPORTED, "hidden_act", NULL);
	json_object_set_new(j, "hidden_act", json_string("silu"));
	expect_parse(j, 0, NULL, NULL);
	json_decref(j);

	struct st_model_config c;
	struct st_diag diag = { { 0 } };

	assert_int_equal(st_config_parse("{\"hidden_size\": ", "x.json", &c,
					 &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "x.json"));
	assert_int_equal(st_config_parse("[1]", "x.json", &c, &diag),
			 -ST_E_FORMAT);
}

/* PITFALLS P4: a missing norm_topk_prob takes the family's default. */
static void test_norm_topk_default(void **state)
{
	struct st_model_config c;
	struct st_diag diag = { { 0 } };
	json_t *j = fixture_json("tiny-qwen3moe");

	json_object_del(j, "norm_topk_prob");
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.norm_topk_prob, 0); /* HF Qwen3MoeConfig: False */
	json_object_set_new(j, "norm_topk_prob", json_false());
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.norm_topk_prob, 0);
	json_object_set_new(j, "norm_topk_prob", json_true());
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.norm_topk_prob, 1);
	json_decref(j);

	/* Mixtral always renormalises, whatever a stray key says */
	j = fixture_json("tiny-mixtral");
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.norm_topk_prob, 1);
	json_object_set_new(j, "norm_topk_prob", json_false());
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.norm_topk_prob, 1);
	json_decref(j);
}

static void test_defaults_and_aliases(void **state)
{
	struct st_model_config c;
	struct st_diag diag = { { 0 } };
	json_t *j = fixture_json("tiny-qwen3moe");

	/* family defaults when keys are missing */
	json_object_del(j, "rms_norm_eps");
	json_object_del(j, "rope_theta");
	json_object_del(j, "tie_word_embeddings");
	json_object_del(j, "eos_token_id");
	json_object_del(j, "bos_token_id");
	json_object_del(j, "max_position_embeddings");
	json_object_del(j, "head_dim");
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_true(c.rms_norm_eps == 1e-6f);
	assert_true(c.rope_theta == 10000.0);
	assert_int_equal(c.tie_word_embeddings, 0);
	assert_int_equal(c.n_eos, 0);
	assert_int_equal(c.bos_token_id, -1);
	assert_int_equal(c.max_position_embeddings, 32768);
	assert_int_equal(c.head_dim, 8); /* 32 / 4 */
	/* expert-count aliases */
	json_object_del(j, "num_experts");
	json_object_set_new(j, "num_local_experts", json_integer(16));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.n_experts, 16);
	json_object_set_new(j, "n_routed_experts", json_integer(16));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	json_object_set_new(j, "n_routed_experts", json_integer(8));
	expect_parse(j, -ST_E_CONFIG, "disagrees", NULL);
	json_decref(j);

	j = fixture_json("tiny-mixtral");
	json_object_del(j, "rms_norm_eps");
	json_object_del(j, "rope_theta");
	json_object_del(j, "eos_token_id");
	json_object_del(j, "bos_token_id");
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_true(c.rms_norm_eps == 1e-5f);
	assert_true(c.rope_theta == 1e6);
	assert_int_equal(c.bos_token_id, 1);
	assert_int_equal(c.n_eos, 1);
	assert_int_equal(c.eos_token_ids[0], 2);
	/* eos as a list, with a duplicate */
	json_object_set_new(j, "eos_token_id", json_pack("[i,i,i]", 2, 7, 2));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.n_eos, 2);
	assert_int_equal(c.eos_token_ids[0], 2);
	assert_int_equal(c.eos_token_ids[1], 7);
	json_object_set_new(j, "eos_token_id",
			    json_pack("[i,i,i,i,i,i,i,i,i]", 1, 2, 3, 4, 5, 6,
				      7, 8, 9));
	expect_parse(j, -ST_E_LIMIT, "EOS", NULL);
	json_object_set_new(j, "eos_token_id", json_pack("[s]", "2"));
	expect_parse(j, -ST_E_CONFIG, "eos_token_id", NULL);
	json_decref(j);
}

static void test_refusals(void **state)
{
	struct st_model_config c;
	struct st_diag diag = { { 0 } };
	json_t *j = fixture_json("tiny-qwen3moe");

	/* RoPE scaling, in every spelling */
	json_object_set_new(j, "rope_scaling",
			    json_pack("{s:s,s:f}", "type", "yarn", "factor",
				      4.0));
	expect_parse(j, -ST_E_UNSUPPORTED, "rope_scaling", "yarn");
	json_object_set_new(j, "rope_scaling",
			    json_pack("{s:s,s:f}", "rope_type", "linear",
				      "factor", 2.0));
	expect_parse(j, -ST_E_UNSUPPORTED, "linear", NULL);
	json_object_set_new(j, "rope_scaling", json_pack("{s:f}", "factor",
							 2.0));
	expect_parse(j, -ST_E_UNSUPPORTED, "rope_scaling", NULL);
	json_object_set_new(j, "rope_scaling", json_null());
	json_object_set_new(j, "rope_parameters",
			    json_pack("{s:s,s:f}", "rope_type", "dynamic",
				      "factor", 2.0));
	expect_parse(j, -ST_E_UNSUPPORTED, "rope_parameters", "dynamic");
	/* v5 style: rope_parameters carrying only the default and theta */
	json_object_set_new(j, "rope_parameters",
			    json_pack("{s:s,s:f}", "rope_type", "default",
				      "rope_theta", 500000.0));
	json_object_del(j, "rope_theta");
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_true(c.rope_theta == 500000.0);
	json_object_del(j, "rope_parameters");

	/* sliding window: qwen3_moe only with use_sliding_window */
	json_object_set_new(j, "sliding_window", json_integer(4096));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	json_object_set_new(j, "use_sliding_window", json_true());
	expect_parse(j, -ST_E_UNSUPPORTED, "sliding_window 4096", NULL);
	json_object_set_new(j, "use_sliding_window", json_false());

	/* dense MLP layers */
	json_object_set_new(j, "mlp_only_layers", json_pack("[i]", 1));
	expect_parse(j, -ST_E_UNSUPPORTED, "mlp_only_layers", NULL);
	json_object_set_new(j, "mlp_only_layers", json_array());
	json_object_set_new(j, "decoder_sparse_step", json_integer(2));
	expect_parse(j, -ST_E_UNSUPPORTED, "decoder_sparse_step", NULL);
	json_object_set_new(j, "decoder_sparse_step", json_integer(1));
	json_object_set_new(j, "attention_bias", json_true());
	expect_parse(j, -ST_E_UNSUPPORTED, "attention_bias", NULL);
	json_object_set_new(j, "attention_bias", json_false());
	assert_int_equal(parse_json(j, &c, &diag), 0);
	json_decref(j);

	/* absurd structural counts are refused naming their key (they once
	 * passed, and a convert then failed with "out of memory") */
	j = fixture_json("tiny-qwen3moe");
	json_object_set_new(j, "num_hidden_layers", json_integer(1000000000));
	expect_parse(j, -ST_E_CONFIG, "\"num_hidden_layers\" = 1000000000",
		     "[1, 1024]");
	json_object_set_new(j, "num_hidden_layers", json_integer(1024));
	json_object_set_new(j, "num_experts", json_integer(1 << 20));
	expect_parse(j, -ST_E_CONFIG, "\"num_experts\" = 1048576", "4096");
	json_object_set_new(j, "num_experts", json_integer(4096));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	assert_int_equal(c.n_layers, 1024);
	assert_int_equal(c.n_experts, 4096);
	json_decref(j);

	/* mixtral: a window shorter than the context is refused, one as long
	 * as the context is full attention */
	j = fixture_json("tiny-mixtral");
	json_object_set_new(j, "sliding_window", json_integer(4096));
	expect_parse(j, -ST_E_UNSUPPORTED, "sliding", NULL);
	json_object_set_new(j, "sliding_window", json_integer(32768));
	assert_int_equal(parse_json(j, &c, &diag), 0);
	json_decref(j);
}

static void test_generation_config(void **state)
{
	char dir[512], path[600], src[1024], spath[1100];
	struct st_model_config c;
	struct st_diag diag = { { 0 } };
	char *text;
	size_t len;

	snprintf(dir, sizeof(dir), "%s/gen", tmp_root);
	assert_int_equal(st_mkdir_p(dir, 0700), 0);
	snprintf(spath, sizeof(spath), "%s/config.json",
		 fixture("kjv-moe", src, sizeof(src)));
	assert_int_equal(st_read_file(spath, &text, &len), 0);
	snprintf(path, sizeof(path), "%s/config.json", dir);
	assert_int_equal(st_write_file(path, text, len), 0);
	free(text);

	/* no generation_config.json: config's eos alone */
	assert_int_equal(st_config_load(dir, &c, &diag), 0);
	assert_int_equal(c.n_eos, 1);

	snprintf(path, sizeof(path), "%s/generation_config.json", dir);
	assert_int_equal(st_write_file(path, "{\"eos_token_id\": [5, 2, 9]}",
				       27), 0);
	assert_int_equal(st_config_load(dir, &c, &diag), 0);
	assert_int_equal(c.n_eos, 3);
	assert_int_equal(c.eos_token_ids[0], 2);
	assert_int_equal(c.eos_token_ids[1], 5);
	assert_int_equal(c.eos_token_ids[2], 9);

	assert_int_equal(st_write_file(path, "{\"eos_token_id\": 4}", 19), 0);
	assert_int_equal(st_config_load(dir, &c, &diag), 0);
	assert_int_equal(c.n_eos, 2);
	assert_int_equal(c.eos_token_ids[1], 4);

	assert_int_equal(st_write_file(path, "{\"eos_token_id\": 99999}", 23),
			 0);
	assert_int_equal(st_config_load(dir, &c, &diag), -ST_E_CONFIG);
	assert_non_null(strstr(diag.msg, "generation_config.json"));

	assert_int_equal(st_write_file(path, "{oops", 5), 0);
	assert_int_equal(st_config_load(dir, &c, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "generation_config.json"));

	snprintf(path, sizeof(path), "%s/nothing", tmp_root);
	assert_int_equal(st_config_load(path, &c, &diag), -ENOENT);
	assert_non_null(strstr(diag.msg, "config.json"));
}

/*
 * Every tensor name and shape the config predicts exists in the fixture's
 * checkpoint with that shape, and nothing else is there.
 */
static void check_names_against_checkpoint(const char *name)
{
	char dir[1024], tn[256];
	struct st_model_config c;
	struct st_checkpoint *ck = NULL;
	struct st_diag diag = { { 0 } };
	const struct st_tensor_info *t;
	int64_t rows, cols;
	int n_found = 0;

	load_fixture(name, &c);
	if (st_checkpoint_open(fixture(name, dir, sizeof(dir)), &ck, &diag))
		fail_msg("%s", diag.msg);
	for (int role = 0; role < ST_T_ROLE_COUNT; role++) {
		int global = role == ST_T_EMBED || role == ST_T_FINAL_NORM ||
			     role == ST_T_LM_HEAD;

		for (int l = 0; l < (global ? 1 : c.n_layers); l++) {
			int r = st_dense_tensor_name(&c, role, l, tn,
						     sizeof(tn));

			if (r == -ST_E_NOTFOUND) {
				/* roles the family lacks: q/k norm, q/k/v
				 * biases, shared expert */
				if (role == ST_T_Q_NORM || role == ST_T_K_NORM)
					assert_false(c.qk_norm);
				else
					assert_true(role >= ST_T_Q_BIAS &&
						    !c.qkv_bias &&
						    !c.shared_inter);
				continue;
			}
			assert_int_equal(r, 0);
			t = st_checkpoint_find(ck, tn);
			if (!t)
				fail_msg("%s: %s not in the checkpoint", name,
					 tn);
			st_dense_tensor_shape(&c, role, &rows, &cols);
			assert_int_equal(t->n_dims, cols ? 2 : 1);
			assert_int_equal(t->shape[0], rows);
			if (cols)
				assert_int_equal(t->shape[1], cols);
			/* the tied head is the embedding, counted once */
			if (!(role == ST_T_LM_HEAD && c.tie_word_embeddings))
				n_found++;
		}
	}
	for (int l = 0; l < c.n_layers; l++)
		for (int e = 0; e < c.n_experts; e++)
			for (int m = 0; m < 3; m++) {
				assert_int_equal(st_expert_tensor_name(&c, l, e,
								       m, tn,
								       sizeof(tn)),
						 0);
				t = st_checkpoint_find(ck, tn);
				if (!t)
					fail_msg("%s: %s not in the checkpoint",
						 name, tn);
				st_expert_tensor_shape(&c, m, &rows, &cols);
				assert_int_equal(t->n_dims, 2);
				assert_int_equal(t->shape[0], rows);
				assert_int_equal(t->shape[1], cols);
				n_found++;
			}
	assert_int_equal(n_found, ck->n_tensors);
	st_checkpoint_close(ck);
}

static void test_tensor_names(void **state)
{
	struct st_model_config c;
	char tn[256];

	check_names_against_checkpoint("kjv-moe");      /* 333 tensors */
	check_names_against_checkpoint("tiny-mixtral");
	check_names_against_checkpoint("tiny-qwen3moe"); /* tied, q/k norm */

	load_fixture("tiny-qwen3moe", &c);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_ROUTER, 3, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.3.mlp.gate.weight");
	assert_int_equal(st_dense_tensor_name(&c, ST_T_K_NORM, 0, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.self_attn.k_norm.weight");
	assert_int_equal(st_dense_tensor_name(&c, ST_T_LM_HEAD, 0, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.embed_tokens.weight");
	assert_int_equal(st_expert_tensor_name(&c, 2, 15, ST_EXPERT_DOWN, tn,
					       sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.2.mlp.experts.15.down_proj.weight");
	/* out of range, too small a buffer */
	assert_int_equal(st_expert_tensor_name(&c, 4, 0, ST_EXPERT_UP, tn,
					       sizeof(tn)), -EINVAL);
	assert_int_equal(st_expert_tensor_name(&c, 0, 16, ST_EXPERT_UP, tn,
					       sizeof(tn)), -EINVAL);
	assert_int_equal(st_expert_tensor_name(&c, 0, 0, ST_EXPERT_UP, tn, 10),
			 -ENAMETOOLONG);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_Q, -1, tn, sizeof(tn)),
			 -EINVAL);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_EMBED, 0, tn, 5),
			 -ENAMETOOLONG);

	load_fixture("kjv-moe", &c);
	assert_int_equal(st_dense_tensor_name(&c, ST_T_ROUTER, 5, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.5.block_sparse_moe.gate.weight");
	assert_int_equal(st_dense_tensor_name(&c, ST_T_LM_HEAD, 0, tn,
					      sizeof(tn)), 0);
	assert_string_equal(tn, "lm_head.weight");
	assert_int_equal(st_dense_tensor_name(&c, ST_T_Q_NORM, 0, tn,
					      sizeof(tn)), -ST_E_NOTFOUND);
	assert_int_equal(st_expert_tensor_name(&c, 0, 1, ST_EXPERT_GATE, tn,
					       sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.block_sparse_moe.experts.1.w1.weight");
	assert_int_equal(st_expert_tensor_name(&c, 0, 1, ST_EXPERT_UP, tn,
					       sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.block_sparse_moe.experts.1.w3.weight");
	assert_int_equal(st_expert_tensor_name(&c, 0, 1, ST_EXPERT_DOWN, tn,
					       sizeof(tn)), 0);
	assert_string_equal(tn, "model.layers.0.block_sparse_moe.experts.1.w2.weight");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_kjv_moe),
		cmocka_unit_test(test_tiny_mixtral),
		cmocka_unit_test(test_tiny_qwen3moe),
		cmocka_unit_test(test_unknown_arch),
		cmocka_unit_test(test_missing_keys),
		cmocka_unit_test(test_norm_topk_default),
		cmocka_unit_test(test_defaults_and_aliases),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_generation_config),
		cmocka_unit_test(test_tensor_names),
		cmocka_unit_test(test_qwen2moe),
	};
	int r;

	st_test_shared_dir(); /* every case reads fixtures: skip (77) if absent */
	st_test_tmpdir(tmp_root, sizeof(tmp_root));
	r = cmocka_run_group_tests(tests, NULL, NULL);
	st_rm_rf(tmp_root);
	return r;
}
