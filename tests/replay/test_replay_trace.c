/*
 * test_replay_trace.c — the trace readers on every real trace format in
 * ../shared/fixtures/traces (counts of tokens, layers, experts and top-k as
 * SOURCES.md states them, which were computed independently of this code)
 * and on the kjv-moe fixture's routing trace (its README), the strata JSONL
 * format written here, and the errors for bad input (file and line named).
 * Skips (77) when ../shared is absent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_replay_trace.h"
#include "st_util.h"
#include "test_util.h"

static char traces[4096];

static void read_ok(const char *const *paths, int n, struct es_trace *t)
{
	struct st_diag diag = { "" };
	int e = es_trace_read(paths, n, t, &diag);

	if (e < 0)
		fail_msg("%s: %s", paths[0], diag.msg);
}

static uint64_t accesses(const struct es_trace *t)
{
	uint64_t n = 0;

	for (size_t i = 0; i < t->n_steps; i++)
		n += t->steps[i].n;
	return n;
}

/* Steps of one token come in increasing layer order, tokens in order. */
static void check_order(const struct es_trace *t)
{
	for (size_t i = 1; i < t->n_steps; i++) {
		const struct es_trace_step *a = &t->steps[i - 1],
					   *b = &t->steps[i];

		if (!t->batched)
			assert_true(b->token > a->token ||
				    (b->token == a->token && b->layer > a->layer));
		assert_true(b->layer < t->n_layers);
		for (int j = 0; j < b->n; j++)
			assert_true(t->ids[b->first + j] < t->n_experts);
	}
}

/* D: 200 moe-beyond CSVs, 14,911 tokens x 26 layers (ids 1-26), E 64, k 6. */
static void test_moe_beyond(void **state)
{
	char pat[4200];
	glob_t g;
	struct es_trace t;

	snprintf(pat, sizeof(pat), "%s/ngavhane__moe-beyond/prompt_*_data.csv",
		 traces);
	assert_int_equal(glob(pat, 0, NULL, &g), 0);
	assert_int_equal(g.gl_pathc, 200);
	read_ok((const char *const *)g.gl_pathv, (int)g.gl_pathc, &t);
	assert_int_equal(t.n_tokens, 14911);
	assert_int_equal(t.n_layers, 26);
	assert_int_equal(t.layer_ids[0], 1);
	assert_int_equal(t.layer_ids[25], 26);
	assert_int_equal(t.n_experts, 64);
	assert_int_equal(t.top_k, 6);
	assert_int_equal(t.n_steps, 14911 * 26);
	assert_string_equal(t.formats, "D");
	check_order(&t);
	es_trace_fini(&t);
	globfree(&g);
}

/* C: routing_raw.jsonl: 218 tokens (135 prefill + 83 decode), 32 layers,
 * 2.9 % of the 218 x 32 cells missing (199 dropped ties). */
static void test_mario_raw(void **state)
{
	char p[4200];
	const char *pp = p;
	struct es_trace t;

	snprintf(p, sizeof(p), "%s/Mario928__speculative-moe/routing_raw.jsonl",
		 traces);
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 218);
	assert_int_equal(t.n_layers, 32);
	assert_int_equal(t.n_experts, 8);
	assert_int_equal(t.top_k, 2);
	assert_int_equal(t.n_steps, 218 * 32 - 199);
	assert_string_equal(t.formats, "C");
	check_order(&t);
	es_trace_fini(&t);
}

/* B: gsm8k_2 (247 decode tokens) then humaneval_2 (338): one stream. */
static void test_mario_processed(void **state)
{
	char p[2][4200];
	const char *pp[2] = { p[0], p[1] };
	struct es_trace t;

	snprintf(p[0], sizeof(p[0]),
		 "%s/Mario928__speculative-moe/gsm8k_2_routing.jsonl", traces);
	snprintf(p[1], sizeof(p[1]),
		 "%s/Mario928__speculative-moe/humaneval_2_routing.jsonl",
		 traces);
	read_ok(pp, 1, &t);
	assert_int_equal(t.n_tokens, 247);
	assert_int_equal(t.n_layers, 32);
	assert_int_equal(t.top_k, 2);
	es_trace_fini(&t);
	read_ok(pp, 2, &t);
	assert_int_equal(t.n_tokens, 247 + 338);
	assert_string_equal(t.formats, "B");
	check_order(&t);
	es_trace_fini(&t);
}

/* A: the five weiran logs merge into one 5-layer trace of 4,357 rows
 * (profiling forwards of 8,192 + 256 rows dropped); E 60, k 4. */
static void test_vllm_merged(void **state)
{
	static const int layers[5] = { 0, 8, 12, 18, 23 };
	char p[5][4200];
	const char *pp[5];
	struct es_trace t;

	for (int i = 0; i < 5; i++) {
		snprintf(p[i], sizeof(p[i]),
			 "%s/weiran0129__vLLM-MoE-Logger/moe_layer%d.jsonl",
			 traces, layers[i]);
		pp[i] = p[i];
	}
	read_ok(pp, 1, &t);
	assert_int_equal(t.n_tokens, 4357);
	assert_int_equal(t.n_layers, 1);
	assert_int_equal(t.layer_ids[0], 0);
	es_trace_fini(&t);
	read_ok(pp, 5, &t);
	assert_int_equal(t.n_tokens, 4357);
	assert_int_equal(t.n_layers, 5);
	for (int i = 0; i < 5; i++)
		assert_int_equal(t.layer_ids[i], layers[i]);
	assert_int_equal(t.n_steps, 5 * 4357);
	assert_int_equal(t.n_experts, 60);
	assert_int_equal(t.top_k, 4);
	assert_true(t.batched);
	/* first real forward: 65 prefill rows of layer 0, then layer 8 */
	assert_int_equal(t.steps[64].layer, 0);
	assert_int_equal(t.steps[65].layer, 1);
	assert_int_equal(t.steps[65].token, 0);
	check_order(&t);
	es_trace_fini(&t);
}

/* A (Kenneth, 8,192 + 8,192 + 256 dummy rows) and A' (OLMoE, 2,048 dummy
 * rows, token_idx never resets, E 64 in the meta line, k 8). */
static void test_vllm_single(void **state)
{
	char p[4200];
	const char *pp = p;
	struct es_trace t;

	snprintf(p, sizeof(p), "%s/KennethWang1221__vllm-expert-profiler/"
		 "moe_routes.jsonl", traces);
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 4384);
	assert_int_equal(t.top_k, 4);
	es_trace_fini(&t);
	snprintf(p, sizeof(p), "%s/KaxitPandya__cerebras-assesment2/"
		 "moe_routes.jsonl", traces);
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 4471);
	assert_int_equal(t.n_experts, 64);
	assert_int_equal(t.top_k, 8);
	assert_int_equal(accesses(&t), 4471 * 8);
	es_trace_fini(&t);
}

/* strata JSONL: kjv-moe's routing-valid-small.jsonl, 2,932 tokens x 6
 * layers of top-2 of 16 (its README). */
static void test_kjv_routing(void **state)
{
	char p[4200], m[4096];
	const char *pp = p;
	struct es_trace t;

	snprintf(p, sizeof(p), "%s/routing-valid-small.jsonl",
		 st_test_fixture_model("kjv-moe", m, sizeof(m)));
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 2932);
	assert_int_equal(t.n_layers, 6);
	assert_int_equal(t.n_experts, 16);
	assert_int_equal(t.top_k, 2);
	assert_int_equal(t.n_steps, 2932 * 6);
	assert_string_equal(t.formats, "strata");
	check_order(&t);
	es_trace_fini(&t);
}

static void write_tmp(const char *dir, const char *name, const char *text,
		      char *path, size_t len)
{
	snprintf(path, len, "%s/%s", dir, name);
	assert_int_equal(st_write_file(path, text, strlen(text)), 0);
}

/* The strata format by hand, and the error messages for bad input. */
static void test_strata_format_and_errors(void **state)
{
	char dir[4096], p[4200];
	const char *pp = p;
	struct es_trace t;
	struct st_diag diag = { "" };

	st_test_tmpdir(dir, sizeof(dir));
	write_tmp(dir, "ok.jsonl",
		  "{\"pos\":0,\"layer\":0,\"experts\":[3,1],\"weights\":[0.6,0.4]}\n"
		  "{\"pos\":0,\"layer\":2,\"experts\":[0,2]}\n"
		  "\n"
		  "{\"pos\":1,\"layer\":0,\"experts\":[1,0]}\n"
		  "{\"pos\":1,\"layer\":2,\"experts\":[5,4]}\n", p, sizeof(p));
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 2);
	assert_int_equal(t.n_layers, 2);
	assert_int_equal(t.layer_ids[1], 2);
	assert_int_equal(t.n_experts, 6);
	assert_int_equal(t.steps[3].token, 1);
	assert_int_equal(t.steps[3].layer, 1);
	assert_int_equal(t.ids[t.steps[3].first + 1], 4);
	es_trace_fini(&t);

	/* a prefill recorded layer by layer (pos 0-1 of layer 0, then of
	 * layer 1), a decode token, then a second sequence from pos 0 */
	write_tmp(dir, "lm.jsonl",
		  "{\"pos\":0,\"layer\":0,\"experts\":[1]}\n"
		  "{\"pos\":1,\"layer\":0,\"experts\":[2]}\n"
		  "{\"pos\":0,\"layer\":1,\"experts\":[3]}\n"
		  "{\"pos\":1,\"layer\":1,\"experts\":[4]}\n"
		  "{\"pos\":2,\"layer\":0,\"experts\":[5]}\n"
		  "{\"pos\":2,\"layer\":1,\"experts\":[6]}\n"
		  "{\"pos\":0,\"layer\":0,\"experts\":[7]}\n"
		  "{\"pos\":0,\"layer\":1,\"experts\":[0]}\n", p, sizeof(p));
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 4);
	assert_int_equal(t.n_steps, 8);
	{
		/* token order: (pos 0: 1, 3), (pos 1: 2, 4), (pos 2: 5, 6),
		 * (second sequence: 7, 0) */
		static const int want[8] = { 1, 3, 2, 4, 5, 6, 7, 0 };

		for (int i = 0; i < 8; i++) {
			assert_int_equal(t.ids[t.steps[i].first], want[i]);
			assert_int_equal(t.steps[i].token, i / 2);
			assert_int_equal(t.steps[i].layer, i % 2);
		}
	}
	es_trace_fini(&t);

	/* two sequences, each one token at pos 0: "seq" tells them apart */
	write_tmp(dir, "seq.jsonl",
		  "{\"seq\":0,\"pos\":0,\"layer\":0,\"experts\":[1]}\n"
		  "{\"seq\":1,\"pos\":0,\"layer\":0,\"experts\":[2]}\n",
		  p, sizeof(p));
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 2);
	es_trace_fini(&t);

	write_tmp(dir, "unknown.txt", "hello\n", p, sizeof(p));
	assert_int_equal(es_trace_read(&pp, 1, &t, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "unknown.txt:1: unknown trace format"));

	write_tmp(dir, "keys.jsonl", "{\"foo\":1}\n", p, sizeof(p));
	assert_int_equal(es_trace_read(&pp, 1, &t, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "keys.jsonl:1: unknown trace format"));

	write_tmp(dir, "line3.jsonl",
		  "{\"pos\":0,\"layer\":0,\"experts\":[1]}\n"
		  "{\"pos\":1,\"layer\":0,\"experts\":[2]}\n"
		  "{\"pos\":2,\"layer\":0,\"experts\":[2,2]}\n", p, sizeof(p));
	assert_int_equal(es_trace_read(&pp, 1, &t, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "line3.jsonl:3: expert 2 listed twice"));

	write_tmp(dir, "trunc.jsonl",
		  "{\"pos\":0,\"layer\":0,\"experts\":[1]}\n{\"pos\":1,\"lay",
		  p, sizeof(p));
	assert_int_equal(es_trace_read(&pp, 1, &t, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "trunc.jsonl:2: not a JSON object"));

	write_tmp(dir, "bad.csv",
		  "Layer ID,Batch Number,Token,Activated Expert IDs\n"
		  "1,0,a,\"[1, 2]\"\n"
		  "1,0,\",\",\"[1, x]\"\n", p, sizeof(p));
	assert_int_equal(es_trace_read(&pp, 1, &t, &diag), -ST_E_FORMAT);
	assert_non_null(strstr(diag.msg, "bad.csv:3: not a moe-beyond row"));

	/* a quoted comma inside the token column is not a field separator */
	write_tmp(dir, "comma.csv",
		  "Layer ID,Batch Number,Token,Activated Expert IDs\n"
		  "1,0,\",\",\"[1, 2]\"\n"
		  "1,0,\"\"\"\",\"[3, 2]\"\n"
		  "2,0,\",\",\"[0, 5]\"\n"
		  "2,0,b,\"[4, 1]\"\n", p, sizeof(p));
	read_ok(&pp, 1, &t);
	assert_int_equal(t.n_tokens, 2);
	assert_int_equal(t.n_layers, 2);
	/* token-major: token 1 layer 1 (model layer 2) holds [4, 1] */
	assert_int_equal(t.steps[3].token, 1);
	assert_int_equal(t.ids[t.steps[3].first], 4);
	es_trace_fini(&t);

	snprintf(p, sizeof(p), "%s/missing.jsonl", dir);
	assert_true(es_trace_read(&pp, 1, &t, &diag) < 0);
	assert_non_null(strstr(diag.msg, "missing.jsonl"));
	st_rm_rf(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_strata_format_and_errors),
		cmocka_unit_test(test_kjv_routing),
		cmocka_unit_test(test_moe_beyond),
		cmocka_unit_test(test_mario_raw),
		cmocka_unit_test(test_mario_processed),
		cmocka_unit_test(test_vllm_merged),
		cmocka_unit_test(test_vllm_single),
	};

	snprintf(traces, sizeof(traces), "%s/fixtures/traces",
		 st_test_shared_dir());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
