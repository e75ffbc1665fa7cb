/*
 * test_reference.c — computed's forward pass against the fixtures'
 * reference outputs, through real expertd and kvd daemons (experts come
 * from expertd's host pool, K/V rows live in kvd pages).
 *
 * Usage: test_reference FIXTURE VARIANT [HOST_BUDGET]
 *   FIXTURE  tiny-qwen3moe | tiny-mixtral | kjv-moe, or /ABSOLUTE/DIR: a
 *            generated checkpoint with DIR/reference.json in the tiny
 *            fixtures' layout (scripts/moe-reference.py), checked as they are
 *   VARIANT  f32    experts kept BF16 (exact), reference mode; checks the
 *                   `f32` tolerance (tiny fixtures: top-10 logits and LSE
 *                   within tolerances.f32.logit_abs, argmax, routed expert
 *                   sets per layer, 32 greedy ids; kjv-moe: README float32
 *                   tolerance 1e-3, 48 greedy ids, valid-small perplexity
 *                   25.5894 within 1e-4 relative)
 *            mxfp4  experts MXFP4 (OCP); tiny fixtures: `mxfp4_ocp`
 *                   tolerance against top10_mxfp4_ocp / lse_mxfp4_ocp /
 *                   greedy_mxfp4_ocp; kjv-moe: valid-small perplexity equals
 *                   the README's MXFP4 figure 25.9751 within 1e-4 relative.
 *            f32-sharded  as f32, on a copy of the checkpoint that this test
 *                   splits into 3 shards plus model.safetensors.index.json
 *   HOST_BUDGET  optional expertd --host-budget (e.g. 25%): results must not
 *                change with the budget.  Or "threads": the logits of every
 *                prompt computed with a 2-thread pool are bit-identical to
 *                the 1-thread ones (DESIGN.md 6a).  Or "kv=f16|bf16|fp8": the
 *                KV rows in that dtype (not reference mode): kjv-moe's
 *                valid-small perplexity must stay within 0.5 % of the
 *                F32-KV figure (issue 4's FP8 target); for the random tiny
 *                fixtures the first greedy step that differs from the
 *                reference is printed (no tolerance applies there).
 *            fast   experts MXFP4, fast compute mode (issue 6: int8
 *                   activations, FMA, SIMD kernels); tiny fixtures: the
 *                   README's `mxfp4_approx` rule against the OCP reference;
 *                   kjv-moe: valid-small perplexity within 0.5 % of the
 *                   README's reference-mode MXFP4 figure.  Both: logits
 *                   do not depend on batching (one batch vs one token at
 *                   a time, bit for bit).  "threads" works with it too.
 *            shexp-fp8  generated Qwen2-MoE dir only (issue 3): the shared
 *                   experts converted --shared-experts fp8, checked as f32
 *                   against DIR/reference-shexp-fp8.json (moe-reference.py
 *                   --shared-experts fp8: the same FP8 rounding in float64)
 *   Expert-format variants (issue 5, kjv-moe only): the store converted
 *   with another expert format, valid-small perplexity with the README's
 *   windowing rule:
 *            e2m1-g32, e2m1-g128  E2M1 + FP16 absmax scale per group of 32 /
 *                   128: the README's 25.7960 / 25.7009 within 1e-4 relative
 *            mxfp4-keep-bf16  MXFP4 with layers 0 and 5 kept BF16 (--keep
 *                   first,last=bf16): 25.7229 within 1e-4 relative
 *            nvfp4  no reference figure: printed, and held to a sanity bound
 *                   (below the MXFP4 figure + 2 %: NVFP4's finer E4M3 block
 *                   scales should not do worse than MXFP4)
 *            fp8    no reference figure: printed, and held to a sanity bound
 *                   (within 0.5 % of the BF16 figure: 8-bit weights with
 *                   per-128 scales should cost next to nothing)
 * Greedy continuations are decoded one token at a time through the KV
 * cache (the references recomputed the whole sequence; equal in exact
 * arithmetic).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_kvrow.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "st_tokenizer.h"
#include "st_util.h"
#include "store_testlib.h"
#include "test_daemons.h"
#include "test_util.h"

struct route_rec {
	int n_layers, k, cap_pos;
	int *experts; /* [pos][layer][k] */
};

static void on_route(void *arg, int layer, uint32_t pos, const int *experts,
		     const float *weights, int k)
{
	struct route_rec *rr = arg;

	(void)weights;
	if ((int)pos >= rr->cap_pos)
		return;
	memcpy(rr->experts + ((size_t)pos * rr->n_layers + layer) * rr->k,
	       experts, sizeof(int) * (size_t)k);
}

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			if (n_fail < 30) {                                     \
				fprintf(stderr, "FAIL: " __VA_ARGS__);         \
				fputc('\n', stderr);                           \
			}                                                      \
			n_fail++;                                              \
		}                                                              \
	} while (0)

static double lse_of(const float *l, int n)
{
	double mx = -INFINITY, s = 0;

	for (int i = 0; i < n; i++)
		if (l[i] > mx)
			mx = l[i];
	for (int i = 0; i < n; i++)
		s += exp((double)l[i] - mx);
	return mx + log(s);
}

/* Checks one position's logits against [[id, logit] x 10] and lse. */
static void check_position(const char *what, int pi, int pos, const float *lg,
			   int vocab, json_t *top10, double ref_lse, double tol)
{
	double lse = lse_of(lg, vocab);
	int am = cw_argmax(lg, vocab);
	int ref0 = (int)json_integer_value(json_array_get(json_array_get(top10, 0), 0));
	double l0 = json_number_value(json_array_get(json_array_get(top10, 0), 1));
	int ref1 = (int)json_integer_value(json_array_get(json_array_get(top10, 1), 0));
	double l1 = json_number_value(json_array_get(json_array_get(top10, 1), 1));

	for (size_t i = 0; i < json_array_size(top10); i++) {
		json_t *e = json_array_get(top10, i);
		int id = (int)json_integer_value(json_array_get(e, 0));
		double ref = json_number_value(json_array_get(e, 1));

		CHECK(fabs(lg[id] - ref) <= tol,
		      "%s prompt %d pos %d: logit[%d] %.6f vs reference %.6f "
		      "(tolerance %g)", what, pi, pos, id, lg[id], ref, tol);
	}
	CHECK(fabs(lse - ref_lse) <= tol,
	      "%s prompt %d pos %d: LSE %.6f vs reference %.6f", what, pi, pos,
	      lse, ref_lse);
	CHECK(am == ref0 || (l0 - l1 < 2 * tol && am == ref1),
	      "%s prompt %d pos %d: argmax %d vs reference %d", what, pi, pos,
	      am, ref0);
}

struct ctx {
	const char *fixture, *variant;
	enum st_dtype kv_dtype;
	enum cw_compute compute;
	char model_dir[4400], store_dir[4200], tmp[4096];
	struct st_test_inst inst;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *model;
	int vocab;
};

/* Shard k of 3 by layer number (global tensors in shard 0). */
static int in_shard(const char *name, void *arg)
{
	int k = *(int *)arg, layer = -1;

	if (sscanf(name, "model.layers.%d.", &layer) != 1)
		return k == 0;
	return layer % 3 == k;
}

/* Writes a sharded copy of src into dst (3 shards + index); returns 0. */
static int make_sharded(const char *src, const char *dst)
{
	char path[8400], name[64];
	struct tst_sft ck;
	json_t *idx = json_object(), *map = json_object();

	st_mkdir_p(dst, 0755);
	tst_model_links(src, dst, "model.safetensors");
	snprintf(path, sizeof(path), "%s/model.safetensors", src);
	tst_sft_load(path, &ck);
	for (int k = 0; k < 3; k++) {
		snprintf(name, sizeof(name), "model-%05d-of-00003.safetensors",
			 k + 1);
		snprintf(path, sizeof(path), "%s/%s", dst, name);
		if (tst_sft_write_subset(path, &ck, in_shard, &k) < 0)
			return -1;
		for (int i = 0; i < ck.n; i++)
			if (in_shard(ck.t[i].name, &k))
				json_object_set_new(map, ck.t[i].name,
						    json_string(name));
	}
	json_object_set_new(idx, "metadata", json_object());
	json_object_set_new(idx, "weight_map", map);
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dst);
	json_dump_file(idx, path, JSON_INDENT(1));
	json_decref(idx);
	tst_sft_free(&ck);
	return 0;
}

/* Expert-format variants (see the top): convert options and the
 * reference.json perplexity key (NULL: no reference figure). */
struct fmt_variant {
	const char *variant, *experts, *keep, *ref_key;
};

static const struct fmt_variant fmt_variants[] = {
	{ "e2m1-g32", "e2m1-g32", NULL, "e2m1_fp16scale_g32" },
	{ "e2m1-g128", "e2m1-g128", NULL, "e2m1_fp16scale_g128" },
	{ "mxfp4-keep-bf16", "mxfp4", "first,last=bf16", "mxfp4_first_last_bf16" },
	{ "nvfp4", "nvfp4", NULL, NULL },
	{ "fp8", "fp8", NULL, NULL },
	{ "dense-fp8", "mxfp4", NULL, NULL },
	{ "fast-dense-fp8", "mxfp4", NULL, NULL },
};

static const struct fmt_variant *fmt_variant_of(const char *variant)
{
	for (size_t i = 0; i < sizeof(fmt_variants) / sizeof(fmt_variants[0]); i++)
		if (!strcmp(variant, fmt_variants[i].variant))
			return &fmt_variants[i];
	return NULL;
}

/* Sets the expert format (and keep rules) of a format variant. */
static int setup_fmt_variant(const struct fmt_variant *fv,
			     struct es_convert_opts *o)
{
	struct st_diag diag = { "" };

	if (es_convert_parse_experts(fv->experts, o, &diag) < 0 ||
	    (fv->keep && es_convert_parse_keep(fv->keep, o, &diag) < 0)) {
		fprintf(stderr, "variant %s: %s\n", fv->variant, diag.msg);
		return -1;
	}
	printf("experts %s%s%s\n", fv->experts, fv->keep ? ", keep " : "",
	       fv->keep ? fv->keep : "");
	return 0;
}

static int setup(struct ctx *c, const char *host_budget)
{
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct cw_model_opts mo = { c->kv_dtype, 16, 1, c->compute, 0 };
	const char *es_args[6] = { "--store", c->store_dir, NULL, NULL, NULL };
	const char *kv_args[4] = { "--budget", "256MiB", NULL };
	int r;

	if (!strcmp(c->fixture, "kjv-moe"))
		snprintf(c->model_dir, sizeof(c->model_dir), "%s/models/kjv-moe",
			 st_test_source_dir());
	else if (c->fixture[0] == '/')
		snprintf(c->model_dir, sizeof(c->model_dir), "%s", c->fixture);
	else
		st_test_fixture_model(c->fixture, c->model_dir,
				      sizeof(c->model_dir));
	st_test_tmpdir(c->tmp, sizeof(c->tmp));
	snprintf(c->store_dir, sizeof(c->store_dir), "%s/store", c->tmp);
	if (!strcmp(c->variant, "f32-sharded")) {
		char sharded[4200];

		snprintf(sharded, sizeof(sharded), "%s/sharded", c->tmp);
		if (make_sharded(c->model_dir, sharded) < 0) {
			fprintf(stderr, "cannot write the sharded copy\n");
			return -1;
		}
		snprintf(c->model_dir, sizeof(c->model_dir), "%s", sharded);
		c->variant = "f32";
		printf("checkpoint split into 3 shards + index in %s\n", sharded);
	}
	es_convert_opts_init(&o);
	o.expert_dtype = !strcmp(c->variant, "mxfp4") ||
			 !strcmp(c->variant, "fast") ? ST_DTYPE_MXFP4 :
						       ST_DTYPE_BF16;
	if (fmt_variant_of(c->variant)) {
		if (strcmp(c->fixture, "kjv-moe")) {
			fprintf(stderr, "variant %s: kjv-moe only\n", c->variant);
			return -1;
		}
		if (setup_fmt_variant(fmt_variant_of(c->variant), &o) < 0)
			return -1;
		o.dense_fp8 = strstr(c->variant, "dense-fp8") != NULL;
	}
	if (!strcmp(c->variant, "shexp-fp8") &&
	    es_convert_parse_shared_experts("fp8", &o, &diag) < 0) {
		fprintf(stderr, "%s\n", diag.msg);
		return -1;
	}
	r = es_convert(c->model_dir, c->store_dir, &o, &diag);
	if (r < 0) {
		fprintf(stderr, "convert failed: %s\n", diag.msg);
		return r;
	}
	if (host_budget) {
		es_args[2] = "--host-budget";
		es_args[3] = host_budget;
	}
	st_test_inst_init(&c->inst, "ref");
	if (st_test_daemon_start(&c->inst, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&c->inst, "kvd", kv_args, 30) < 0)
		return -1;
	r = es_client_open(c->inst.run_dir, c->inst.name, "test", 10000, &c->es,
			   &diag);
	if (!r)
		r = kv_client_open(c->inst.run_dir, c->inst.name, "test", 10000,
				   &c->kv, &diag);
	if (!r)
		r = cw_model_open(c->store_dir, c->es, c->kv, &mo, &c->model,
				  &diag);
	if (r < 0) {
		fprintf(stderr, "setup failed: %s (%s)\n", diag.msg,
			st_strerror(r));
		return r;
	}
	c->vocab = cw_model_config(c->model)->vocab_size;
	return 0;
}

static void teardown(struct ctx *c)
{
	cw_model_close(c->model);
	kv_client_close(c->kv);
	es_client_close(c->es);
	st_test_inst_stop(&c->inst);
	CHECK(st_test_count_segments(c->inst.name) == 0,
	      "shm segments left behind for instance %s", c->inst.name);
	st_rm_rf(c->tmp);
	st_rm_rf(c->inst.run_dir);
}

/* Runs ids through a fresh sequence, all logits, then n_greedy greedy
 * steps; returns the logits (n * vocab, caller frees) and the greedy ids. */
static float *run_prompt(struct ctx *c, const int32_t *ids, int n,
			 int n_greedy, int32_t *ret_greedy)
{
	struct st_diag diag = { "" };
	float *all = malloc(sizeof(float) * (size_t)n * c->vocab);
	float *last = malloc(sizeof(float) * (size_t)c->vocab);
	uint32_t seq;
	int r;

	if (!all || !last || kv_client_seq_create(c->kv, &seq, &diag) < 0) {
		fprintf(stderr, "seq create: %s\n", diag.msg);
		exit(1);
	}
	r = cw_model_eval(c->model, seq, 0, ids, n, all, NULL, &diag);
	if (r < 0) {
		fprintf(stderr, "eval failed: %s\n", diag.msg);
		exit(1);
	}
	memcpy(last, all + (size_t)(n - 1) * c->vocab, sizeof(float) * c->vocab);
	for (int g = 0; g < n_greedy; g++) {
		int32_t t = cw_argmax(last, c->vocab);

		ret_greedy[g] = t;
		if (g + 1 == n_greedy)
			break;
		r = cw_model_eval(c->model, seq, (uint32_t)(n + g), &t, 1, NULL,
				  last, &diag);
		if (r < 0) {
			fprintf(stderr, "decode failed: %s\n", diag.msg);
			exit(1);
		}
	}
	kv_client_seq_free(c->kv, seq);
	free(last);
	return all;
}

/* The fixtures' `mxfp4_approx` rule (README): over all positions of the 6
 * prompts against top10_mxfp4_ocp / lse_mxfp4_ocp / greedy_mxfp4_ocp:
 * top-1 agreement >= 0.75, argmax within the reference top-10 >= 0.9,
 * median |delta log p| of the reference top-1 <= 0.3, first greedy token
 * equal in >= 4 prompts. */
static void test_tiny_approx(struct ctx *c, json_t *ref)
{
	json_t *prompts = json_object_get(ref, "prompts");
	double *dlp = NULL;
	int n_pos = 0, top1 = 0, in10 = 0, greedy0 = 0;

	for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
		json_t *p = json_array_get(prompts, pi);
		json_t *jids = json_object_get(p, "ids");
		int n = (int)json_array_size(jids);
		int32_t *ids = malloc(sizeof(int32_t) * n), g0;
		float *all;

		for (int i = 0; i < n; i++)
			ids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
		all = run_prompt(c, ids, n, 1, &g0);
		dlp = realloc(dlp, sizeof(double) * (size_t)(n_pos + n));
		for (int pos = 0; pos < n; pos++) {
			json_t *t10 = json_array_get(json_object_get(p, "top10_mxfp4_ocp"), pos);
			double rlse = json_number_value(json_array_get(json_object_get(p, "lse_mxfp4_ocp"), pos));
			const float *lg = all + (size_t)pos * c->vocab;
			int am = cw_argmax(lg, c->vocab);
			int r0 = (int)json_integer_value(json_array_get(json_array_get(t10, 0), 0));
			double rl0 = json_number_value(json_array_get(json_array_get(t10, 0), 1));

			top1 += am == r0;
			for (size_t i = 0; i < json_array_size(t10); i++)
				if (am == (int)json_integer_value(json_array_get(json_array_get(t10, i), 0))) {
					in10++;
					break;
				}
			dlp[n_pos++] = fabs((lg[r0] - lse_of(lg, c->vocab)) - (rl0 - rlse));
		}
		greedy0 += g0 == (int32_t)json_integer_value(json_array_get(
				json_object_get(p, "greedy_mxfp4_ocp"), 0));
		free(all);
		free(ids);
	}
	for (int i = 1; i < n_pos; i++) /* insertion sort for the median */
		for (int j = i; j > 0 && dlp[j - 1] > dlp[j]; j--) {
			double t = dlp[j];

			dlp[j] = dlp[j - 1];
			dlp[j - 1] = t;
		}
	printf("fast mode, mxfp4_approx: top-1 %.3f (>= 0.75), within top-10 "
	       "%.3f (>= 0.9), median |dlogp| %.4f (<= 0.3), first greedy "
	       "token %d/6 (>= 4) over %d positions\n",
	       (double)top1 / n_pos, (double)in10 / n_pos, dlp[n_pos / 2],
	       greedy0, n_pos);
	CHECK(n_pos > 0 && top1 >= 0.75 * n_pos, "top-1 agreement %d/%d < 0.75",
	      top1, n_pos);
	CHECK(in10 >= 0.9 * n_pos, "within top-10 %d/%d < 0.9", in10, n_pos);
	CHECK(dlp[n_pos / 2] <= 0.3, "median |dlogp| %.4f > 0.3", dlp[n_pos / 2]);
	CHECK(greedy0 >= 4, "first greedy token equal in %d of 6 prompts",
	      greedy0);
	free(dlp);
}

/* Logits do not depend on batching: every position of a prompt evaluated
 * as one batch equals, bit for bit, the same prompt fed one token at a
 * time (reference and fast mode alike: every output element is one fixed
 * reduction whatever the batch). */
static void check_batching(struct ctx *c, json_t *ids_json)
{
	struct st_diag diag = { "" };
	const int n = (int)ST_MIN(json_array_size(ids_json), (size_t)24);
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	float *all = malloc(sizeof(float) * (size_t)n * c->vocab);
	float *one = malloc(sizeof(float) * (size_t)c->vocab);
	uint32_t s1, s2;
	int same = 1;

	for (int i = 0; i < n; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(ids_json, i));
	kv_client_seq_create(c->kv, &s1, &diag);
	kv_client_seq_create(c->kv, &s2, &diag);
	CHECK(cw_model_eval(c->model, s1, 0, ids, n, all, NULL, &diag) == 0,
	      "batch eval: %s", diag.msg);
	for (int t = 0; t < n; t++) {
		CHECK(cw_model_eval(c->model, s2, (uint32_t)t, ids + t, 1, NULL,
				    one, &diag) == 0, "eval: %s", diag.msg);
		same &= !memcmp(one, all + (size_t)t * c->vocab,
				sizeof(float) * (size_t)c->vocab);
	}
	CHECK(same, "%s mode: logits of a %d-token batch differ from one "
	      "token at a time", cw_compute_name(c->compute), n);
	printf("%s mode: %d-token batch == one token at a time, bit for bit\n",
	       cw_compute_name(c->compute), n);
	kv_client_seq_free(c->kv, s1);
	kv_client_seq_free(c->kv, s2);
	free(ids);
	free(all);
	free(one);
}

static void test_tiny(struct ctx *c, json_t *ref)
{
	const int mx = !strcmp(c->variant, "mxfp4");
	const struct st_model_config *cfg = cw_model_config(c->model);
	json_t *tol = json_object_get(json_object_get(ref, "tolerances"),
				      mx ? "mxfp4_ocp" : "f32");
	double t = json_number_value(json_object_get(tol, "logit_abs"));
	json_t *prompts = json_object_get(ref, "prompts");
	struct route_rec rr = { cfg->n_layers, cfg->top_k, 4096, NULL };

	rr.experts = calloc((size_t)rr.cap_pos * rr.n_layers * rr.k, sizeof(int));
	cw_model_set_route_fn(c->model, on_route, &rr);
	CHECK(t > 0 && t < 0.01, "tolerance missing in reference.json");
	for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
		json_t *p = json_array_get(prompts, pi);
		json_t *jids = json_object_get(p, "ids");
		json_t *greedy = json_object_get(p, mx ? "greedy_mxfp4_ocp" :
							 "greedy_f32");
		int n = (int)json_array_size(jids), ng = (int)json_array_size(greedy);
		int32_t *ids = malloc(sizeof(int32_t) * n), gout[64];
		float *all;

		for (int i = 0; i < n; i++)
			ids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
		all = run_prompt(c, ids, n, ng, gout);
		if (c->kv_dtype != ST_DTYPE_F32) {
			int first = ng;

			for (int g = 0; g < ng; g++)
				if (gout[g] != (int32_t)json_integer_value(json_array_get(greedy, g))) {
					first = g;
					break;
				}
			printf("prompt %zu: %s KV greedy output first differs from "
			       "the reference at step %d of %d%s\n", pi,
			       cw_kvrow_dtype_name(c->kv_dtype), first, ng,
			       first == ng ? " (never)" : "");
			free(all);
			free(ids);
			continue;
		}
		for (int pos = 0; pos < n; pos++) {
			json_t *top10, *lse;

			if (mx) {
				top10 = json_array_get(json_object_get(p, "top10_mxfp4_ocp"), pos);
				lse = json_array_get(json_object_get(p, "lse_mxfp4_ocp"), pos);
			} else {
				json_t *pp = json_array_get(json_object_get(p, "positions"), pos);

				top10 = json_object_get(pp, "top10");
				lse = json_object_get(pp, "lse");
				/* routed expert sets per layer (f32 only) */
				json_t *ex = json_object_get(pp, "experts");

				for (int l = 0; l < cfg->n_layers; l++) {
					json_t *want = json_array_get(ex, l);

					for (int k = 0; k < cfg->top_k; k++) {
						int e = (int)json_integer_value(json_array_get(want, k));
						int found = 0;

						for (int k2 = 0; k2 < cfg->top_k; k2++)
							found |= rr.experts[((size_t)pos * rr.n_layers + l) * rr.k + k2] == e;
						CHECK(found, "prompt %zu pos %d layer %d: "
						      "expert %d not routed", pi, pos, l, e);
					}
				}
			}
			check_position(c->variant, (int)pi, pos,
				       all + (size_t)pos * c->vocab, c->vocab,
				       top10, json_number_value(lse), t);
		}
		for (int g = 0; g < ng; g++)
			CHECK(gout[g] == (int32_t)json_integer_value(json_array_get(greedy, g)),
			      "prompt %zu greedy step %d: %d vs reference %lld",
			      pi, g, gout[g],
			      (long long)json_integer_value(json_array_get(greedy, g)));
		printf("prompt %zu: %d positions, %d greedy tokens checked\n",
		       pi, n, ng);
		free(all);
		free(ids);
	}
	cw_model_set_route_fn(c->model, NULL, NULL);
	free(rr.experts);
}

/* kjv-moe perplexity of valid-small.txt with the README's windowing rule. */
static double kjv_ppl(struct ctx *c, int *ret_scored)
{
	char path[4600], *text;
	struct st_tokenizer *tok;
	struct st_diag diag = { "" };
	int32_t *ids;
	size_t n, len;
	double nll = 0;
	int scored = 0;
	float *all = malloc(sizeof(float) * 256 * (size_t)c->vocab);

	snprintf(path, sizeof(path), "%s/valid-small.txt", c->model_dir);
	if (st_read_file(path, &text, &len) < 0 ||
	    st_tokenizer_load(c->store_dir, &tok, &diag) < 0 ||
	    st_tokenizer_encode(tok, text, len, 0, 0, &ids, &n) < 0) {
		fprintf(stderr, "cannot tokenize %s: %s\n", path, diag.msg);
		exit(1);
	}
	CHECK(n == 2932, "valid-small.txt: %zu tokens, README says 2932", n);
	for (size_t w0 = 0; w0 < n; w0 += 256) {
		int wn = (int)ST_MIN((size_t)256, n - w0);
		uint32_t seq;

		if (wn < 2)
			break;
		kv_client_seq_create(c->kv, &seq, &diag);
		if (cw_model_eval(c->model, seq, 0, ids + w0, wn, all, NULL,
				  &diag) < 0) {
			fprintf(stderr, "eval: %s\n", diag.msg);
			exit(1);
		}
		kv_client_seq_free(c->kv, seq);
		for (int i = 1; i < wn; i++) {
			const float *lg = all + (size_t)(i - 1) * c->vocab;

			nll += lse_of(lg, c->vocab) - lg[ids[w0 + i]];
			scored++;
		}
	}
	st_tokenizer_free(tok);
	free(text);
	free(ids);
	free(all);
	*ret_scored = scored;
	return exp(nll / scored);
}

/* kjv-moe with another expert format: valid-small perplexity against the
 * README's figure, or the sanity bounds of the top comment. */
static void test_kjv_format(struct ctx *c, json_t *ref,
			    const struct fmt_variant *fv)
{
	json_t *vs = json_object_get(json_object_get(ref, "perplexity"),
				     "valid-small.txt");
	double bf16 = json_number_value(json_object_get(json_object_get(vs,
				"bf16"), "ppl"));
	double mx = json_number_value(json_object_get(json_object_get(vs,
				"mxfp4"), "ppl"));
	const struct st_model_config *cfg = cw_model_config(c->model);
	double params = 3.0 * cfg->hidden_size * cfg->expert_inter;
	int scored;
	double ppl = kjv_ppl(c, &scored);

	CHECK(bf16 > 20 && mx > bf16, "reference.json perplexities missing");
	CHECK(scored == 2920, "scored %d tokens, README says 2920", scored);
	printf("%s: valid-small.txt perplexity %.4f over %d scored tokens, "
	       "%+.2f %% vs BF16 (%.4f); expert bytes per parameter %.4f\n",
	       fv->variant, ppl, scored, 100 * (ppl - bf16) / bf16, bf16,
	       (double)cw_model_expert_bytes(c->model) / params);
	if (fv->ref_key) {
		double want = json_number_value(json_object_get(json_object_get(vs,
					fv->ref_key), "ppl"));

		printf("README (%s): %.4f\n", fv->ref_key, want);
		CHECK(want > 20 && fabs(ppl - want) / want <= 1e-4,
		      "%s perplexity %.5f vs README %.4f (relative %.2e > 1e-4)",
		      fv->variant, ppl, want, fabs(ppl - want) / want);
	} else if (strstr(fv->variant, "dense-fp8")) {
		const struct st_store *st = cw_model_store(c->model);
		int n8 = 0, nsc = 0;

		for (int i = 0; i < st->n_dense; i++) {
			n8 += st->dense[i].dtype == ST_DTYPE_F8_E4M3;
			nsc += strstr(st->dense[i].name, ".scale") != NULL;
		}
		/* q, k, v, o of every layer and the LM head */
		CHECK(n8 == 4 * cfg->n_layers + 1 && nsc == n8,
		      "store holds %d FP8 dense tensors and %d scale tensors, "
		      "want %d", n8, nsc, 4 * cfg->n_layers + 1);
		/* issue 6: attention and LM head in FP8 (per-128 scales)
		 * next to MXFP4 experts: within 0.5 % of MXFP4 with BF16
		 * dense weights (reference mode's README figure) */
		printf("attention and LM head FP8, %s mode: %+.3f %% vs MXFP4 "
		       "with BF16 dense %.4f (limit 0.5 %%)\n",
		       cw_compute_name(c->compute), 100 * (ppl - mx) / mx, mx);
		CHECK(fabs(ppl - mx) / mx <= 5e-3, "dense FP8 perplexity %.4f "
		      "is %.2f %% from %.4f", ppl, 100 * (ppl - mx) / mx, mx);
	} else if (!strcmp(fv->variant, "nvfp4")) {
		/* sanity bound, not a reference: below MXFP4's figure + 2 % */
		printf("sanity bound: < %.4f (MXFP4 %.4f + 2 %%)\n", mx * 1.02,
		       mx);
		CHECK(ppl < mx * 1.02, "nvfp4 perplexity %.4f >= MXFP4's %.4f "
		      "+ 2 %%", ppl, mx);
	} else {
		/* sanity bound, not a reference: within 0.5 % of BF16 */
		printf("sanity bound: within 0.5 %% of BF16 %.4f\n", bf16);
		CHECK(fabs(ppl - bf16) / bf16 <= 5e-3, "%s perplexity %.4f is "
		      "%.2f %% from BF16's %.4f", fv->variant, ppl,
		      100 * (ppl - bf16) / bf16, bf16);
	}
}

static void test_kjv(struct ctx *c, json_t *ref)
{
	const int mx = !strcmp(c->variant, "mxfp4");
	json_t *prompts = json_object_get(ref, "prompts");
	json_t *ppl_ref = json_object_get(json_object_get(json_object_get(ref,
				"perplexity"), "valid-small.txt"), mx ? "mxfp4" : "bf16");
	double want = json_number_value(json_object_get(ppl_ref, "ppl"));
	int scored;
	double ppl;

	if (fmt_variant_of(c->variant)) {
		test_kjv_format(c, ref, fmt_variant_of(c->variant));
		return;
	}
	if (c->compute == CW_COMPUTE_FAST) {
		/* issue 6: fast mode within 0.5 % of reference mode's MXFP4
		 * perplexity (the README figure, which reference mode
		 * reproduces within 1e-4: test reference-kjv-moe-mxfp4) */
		json_t *mxr = json_object_get(json_object_get(json_object_get(ref,
				"perplexity"), "valid-small.txt"), "mxfp4");
		double mxw = json_number_value(json_object_get(mxr, "ppl"));

		ppl = kjv_ppl(c, &scored);
		printf("fast mode: valid-small.txt perplexity %.4f over %d "
		       "scored tokens, %+.3f %% vs reference mode MXFP4 %.4f\n",
		       ppl, scored, 100 * (ppl - mxw) / mxw, mxw);
		CHECK(mxw > 20 && fabs(ppl - mxw) / mxw <= 5e-3,
		      "fast mode perplexity %.4f is %.3f %% from reference "
		      "mode's %.4f (limit 0.5 %%)", ppl,
		      100 * (ppl - mxw) / mxw, mxw);
		return;
	}
	if (!mx && c->kv_dtype == ST_DTYPE_F32) {
		/* README: float32 compute within 1e-3 of every logit and LSE,
		 * identical greedy continuations */
		for (size_t pi = 0; pi < json_array_size(prompts); pi++) {
			json_t *p = json_array_get(prompts, pi);
			json_t *jids = json_object_get(p, "ids");
			json_t *greedy = json_object_get(p, "greedy_ids");
			int n = (int)json_array_size(jids);
			int ng = (int)json_array_size(greedy);
			int32_t *ids = malloc(sizeof(int32_t) * n), gout[64];
			float *all;

			for (int i = 0; i < n; i++)
				ids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
			all = run_prompt(c, ids, n, ng, gout);
			for (int pos = 0; pos < n; pos++)
				check_position("kjv f32", (int)pi, pos,
					       all + (size_t)pos * c->vocab,
					       c->vocab,
					       json_array_get(json_object_get(p, "top10"), pos),
					       json_number_value(json_array_get(json_object_get(p, "lse"), pos)),
					       1e-3);
			for (int g = 0; g < ng; g++)
				CHECK(gout[g] == (int32_t)json_integer_value(json_array_get(greedy, g)),
				      "kjv prompt %zu greedy step %d differs", pi, g);
			printf("prompt %zu: %d positions, %d greedy tokens checked\n",
			       pi, n, ng);
			free(all);
			free(ids);
		}
	}
	ppl = kjv_ppl(c, &scored);
	printf("valid-small.txt perplexity %.4f over %d scored tokens "
	       "(README: %.4f)\n", ppl, scored, want);
	CHECK(scored == 2920, "scored %d tokens, README says 2920", scored);
	if (c->kv_dtype == ST_DTYPE_F32) {
		CHECK(fabs(ppl - want) / want <= 1e-4,
		      "perplexity %.5f vs README %.4f (relative %.2e > 1e-4)",
		      ppl, want, fabs(ppl - want) / want);
	} else {
		/* issue 4: FP8 KV within 0.5 % of the F32-KV perplexity */
		printf("%s KV: perplexity %+.3f %% vs F32 KV\n",
		       cw_kvrow_dtype_name(c->kv_dtype),
		       100 * (ppl - want) / want);
		CHECK(fabs(ppl - want) / want <= 5e-3,
		      "%s KV perplexity %.4f is %.2f %% from F32 KV's %.4f",
		      cw_kvrow_dtype_name(c->kv_dtype), ppl,
		      100 * (ppl - want) / want, want);
	}
}

int main(int argc, char **argv)
{
	struct ctx c = { 0 };
	json_t *ref;
	json_error_t jerr;
	char path[4200];

	if (argc < 3) {
		fprintf(stderr, "usage: %s FIXTURE f32|mxfp4 [HOST_BUDGET]\n",
			argv[0]);
		return 2;
	}
	c.fixture = argv[1];
	c.variant = argv[2];
	c.kv_dtype = ST_DTYPE_F32;
	c.compute = !strncmp(c.variant, "fast", 4) ? CW_COMPUTE_FAST :
						     CW_COMPUTE_REFERENCE;
	if (argc > 3 && !strncmp(argv[3], "kv=", 3)) {
		if (cw_kvrow_parse_dtype(argv[3] + 3, &c.kv_dtype) < 0) {
			fprintf(stderr, "bad %s\n", argv[3]);
			return 2;
		}
	}
	if (setup(&c, argc > 3 && strcmp(argv[3], "threads") &&
			      strncmp(argv[3], "kv=", 3) ? argv[3] : NULL) < 0) {
		st_test_inst_stop(&c.inst);
		return 1;
	}
	if (!strcmp(c.fixture, "kjv-moe"))
		snprintf(path, sizeof(path), "%s/models/kjv-moe/reference.json",
			 st_test_source_dir());
	else if (c.fixture[0] == '/')
		snprintf(path, sizeof(path), "%s/reference%s.json", c.fixture,
			 strcmp(c.variant, "shexp-fp8") ? "" : "-shexp-fp8");
	else
		snprintf(path, sizeof(path), "%s/fixtures/models/%s/reference.json",
			 st_test_shared_dir(), c.fixture);
	ref = json_load_file(path, 0, &jerr);
	if (!ref) {
		fprintf(stderr, "%s: %s\n", path, jerr.text);
		teardown(&c);
		return 1;
	}
	if (!strcmp(c.fixture, "kjv-moe"))
		test_kjv(&c, ref);
	else if (c.compute == CW_COMPUTE_FAST)
		test_tiny_approx(&c, ref);
	else
		test_tiny(&c, ref);
	if (c.compute == CW_COMPUTE_FAST || (argc > 3 && !strcmp(argv[3], "threads")))
		check_batching(&c, json_object_get(json_array_get(
			json_object_get(ref, "prompts"), 0), "ids"));
	if (argc > 3 && !strcmp(argv[3], "threads")) {
		struct cw_model_opts mo2 = { ST_DTYPE_F32, 16, 2, c.compute, 0 };
		struct cw_model *m1 = c.model, *m2 = NULL;
		struct st_diag diag = { "" };
		json_t *prompts = json_object_get(ref, "prompts");

		if (cw_model_open(c.store_dir, c.es, c.kv, &mo2, &m2, &diag) < 0) {
			fprintf(stderr, "2-thread model: %s\n", diag.msg);
			n_fail++;
		}
		for (size_t pi = 0; m2 && pi < json_array_size(prompts); pi++) {
			json_t *jids = json_object_get(json_array_get(prompts, pi), "ids");
			int n = (int)json_array_size(jids);
			int32_t *ids = malloc(sizeof(int32_t) * n), g1[4], g2[4];
			float *a, *b;

			for (int i = 0; i < n; i++)
				ids[i] = (int32_t)json_integer_value(json_array_get(jids, i));
			c.model = m1;
			a = run_prompt(&c, ids, n, 4, g1);
			c.model = m2;
			b = run_prompt(&c, ids, n, 4, g2);
			CHECK(!memcmp(a, b, sizeof(float) * (size_t)n * c.vocab) &&
			      !memcmp(g1, g2, sizeof(g1)),
			      "prompt %zu: 2-thread logits differ from 1-thread", pi);
			free(a);
			free(b);
			free(ids);
		}
		printf("2-thread logits compared bit for bit with 1-thread\n");
		c.model = m1;
		cw_model_close(m2);
	} else if (argc > 3 && strncmp(argv[3], "kv=", 3)) {
		struct es_stats s;

		if (es_client_stats(c.es, &s) == 0) {
			printf("host budget %s: %llu slots, %llu evictions\n",
			       argv[3], (unsigned long long)s.n_slots,
			       (unsigned long long)s.evictions);
			CHECK(s.evictions > 0, "a reduced budget gave no evictions");
		}
	}
	json_decref(ref);
	teardown(&c);
	if (n_fail)
		fprintf(stderr, "%d check(s) failed\n", n_fail);
	else
		printf("all checks passed\n");
	return n_fail ? 1 : 0;
}
