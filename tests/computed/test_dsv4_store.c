/*
 * test_dsv4_store.c — the DeepSeek-V4 forward pass from a strata store
 * (cw_dsv_load_store: dense weights from dense.bin, routed experts from
 * a real expertd's host pool) against the in-process path that reads
 * model.safetensors (cw_dsv_load), on ../shared tiny-deepseek-v4.
 *
 * For every case of reference.json, its prompt followed by its greedy
 * continuation is evaluated by both models in chunks of 16 positions with
 * the logits of every position: the two must be bit-identical (the same
 * bytes dequantised by the same functions; DESIGN 6a).  Run once with
 * expertd at --host-budget 100% and once at 25% of the experts; at 25%
 * the pool must hold fewer experts than the model has and must have
 * evicted (so the records really came and went through the pool).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv4.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "es_convert.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define CHUNK 16

/* Every case: both models, chunk by chunk, all positions bit-identical.
 * Returns the number of positions compared. */
static long compare_cases(const struct cw_dsv_model *ref,
			  const struct cw_dsv_model *sm, json_t *cases)
{
	const int V = cw_dsv_config(ref)->vocab_size;
	float *a = malloc((size_t)CHUNK * V * sizeof(float));
	float *b = malloc((size_t)CHUNK * V * sizeof(float));
	struct st_diag diag = { { 0 } };
	long compared = 0;
	size_t ci;
	json_t *cs;

	if (!a || !b) {
		CHECK(0, "out of memory");
		goto out;
	}
	json_array_foreach(cases, ci, cs) {
		const char *name = json_string_value(json_object_get(cs, "name"));
		int n, ng;
		/* the prompt, then the greedy continuation */
		int32_t *ids = dsvt_case_ids(cs, 1, &ng, &n);
		struct cw_dsv4_state *sa = NULL, *sb = NULL;
		int diff_pos = -1;

		if (!ids) {
			CHECK(0, "out of memory");
			break;
		}
		ng -= n;
		CHECK(cw_dsv4_state_new(ref, n + ng, &sa) == 0 &&
		      cw_dsv4_state_new(sm, n + ng, &sb) == 0, "state");
		for (int p = 0; sa && sb && p < n + ng; p += CHUNK) {
			int k = n + ng - p < CHUNK ? n + ng - p : CHUNK;
			int r = cw_dsv4_eval(ref, sa, ids + p, k, 1, a, &diag);

			CHECK(r == 0, "%s: in-process eval: %s", name, diag.msg);
			r = cw_dsv4_eval(sm, sb, ids + p, k, 1, b, &diag);
			CHECK(r == 0, "%s: store eval: %s", name, diag.msg);
			if (r)
				break;
			for (int t = 0; t < k && diff_pos < 0; t++)
				if (memcmp(a + (size_t)t * V, b + (size_t)t * V,
					   (size_t)V * sizeof(float)))
					diff_pos = p + t;
			compared += k;
		}
		CHECK(diff_pos < 0, "%s: logits differ at position %d", name,
		      diff_pos);
		cw_dsv4_state_free(sa);
		cw_dsv4_state_free(sb);
		free(ids);
	}
out:
	free(a);
	free(b);
	return compared;
}

static void run_budget(const char *store, const struct cw_dsv_model *ref,
		       json_t *cases, const char *budget, int reports)
{
	const char *args[] = { "--store", store, "--host-budget", budget, NULL };
	struct st_test_inst inst;
	struct st_diag diag = { { 0 } };
	struct es_client *es = NULL;
	char msg[1024];
	struct cw_dsv_model *sm = NULL;
	struct es_stats st = { 0 };
	struct es_tier_stats ts = { 0 };
	const struct st_dsv_config *c = cw_dsv_config(ref);
	int total, r, fails0 = n_fail, hint_layers = 0;
	long n;

	/* sum over hash layers l of the hash layers after it */
	for (int l = 0; l < c->n_hash_layers; l++)
		hint_layers += c->n_hash_layers - 1 - l;
	st_test_inst_init(&inst, "dsv4s");
	if (dsvt_expertd_open(&inst, args, &es, msg, sizeof(msg)) < 0) {
		CHECK(0, "%s (budget %s)", msg, budget);
		goto out;
	}
	r = cw_dsv_load_store(store, es, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE,
			      &sm, &diag);
	CHECK(r == 0, "cw_dsv_load_store: %s", diag.msg);
	if (r)
		goto out;
	cw_dsv_set_route_reports(sm, reports);
	n = compare_cases(ref, sm, cases);
	total = es_client_n_layers(es) * es_client_n_experts(es);
	CHECK(es_client_stats(es, &st) == 0, "stats");
	printf("budget %s: %ld positions compared (%d differing cases); pool %llu of %d "
	       "experts, %llu hits, %llu misses, %llu evictions, %llu loads\n",
	       budget, n, n_fail - fails0, (unsigned long long)st.n_slots, total,
	       (unsigned long long)st.hits, (unsigned long long)st.misses,
	       (unsigned long long)st.evictions, (unsigned long long)st.loads);
	es_client_tier_stats(es, &ts);
	printf("budget %s, reports %s: routed %llu, hints %llu (dropped %llu), prefetch "
	       "loads %llu, used %llu, wasted %llu\n", budget,
	       reports ? "on" : "off",
	       (unsigned long long)ts.routed, (unsigned long long)ts.hints,
	       (unsigned long long)ts.hints_dropped,
	       (unsigned long long)ts.prefetch_loads,
	       (unsigned long long)ts.prefetch_used,
	       (unsigned long long)ts.prefetch_wasted);
	/* every token reports every layer's top-k; the hash-routed layers
	 * hint each later hash layer's experts */
	if (!reports) {
		hint_layers = 0;
		n = 0;
	}
	CHECK(ts.routed == (uint64_t)n * c->n_layers * c->top_k,
	      "routed %llu, expected %ld x %d x %d",
	      (unsigned long long)ts.routed, n, c->n_layers, c->top_k);
	CHECK(ts.hints == (uint64_t)n * c->top_k * hint_layers,
	      "hints %llu, expected %ld x %d x %d",
	      (unsigned long long)ts.hints, n, c->top_k, hint_layers);
	CHECK(n > 0 || !reports, "no positions compared");
	CHECK(st.hits + st.misses > 0, "no expert acquired through expertd");
	if (!strcmp(budget, "25%")) {
		CHECK(st.n_slots < (uint64_t)total, "pool holds all %d experts "
		      "at 25%%", total);
		CHECK(st.evictions > 0, "no eviction at 25%%");
	}
out:
	cw_dsv_free(sm);
	es_client_close(es);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
}

int main(void)
{
	char dir[4096], tmp[4096], store[4200];
	struct st_diag diag = { { 0 } };
	struct es_convert_opts o;
	struct cw_dsv_model *ref = NULL;
	json_t *refj;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	es_convert_opts_init(&o);
	if (es_convert(dir, store, &o, &diag)) {
		fprintf(stderr, "convert: %s\n", diag.msg);
		return 1;
	}
	if (cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &ref,
			&diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	refj = dsvt_load_json(dir, "reference.json");
	dsvt_cases(refj, "reference.json");
	/* a V4 store without expertd is refused with a clear message */
	{
		struct cw_dsv_model *x = NULL;

		CHECK(cw_dsv_load_store(store, NULL, ST_DSV_REV_V4,
					CW_COMPUTE_REFERENCE, &x, &diag) ==
			      -ST_E_CONFIG && strstr(diag.msg, "expertd"),
		      "load_store without expertd: %s", diag.msg);
	}
	run_budget(store, ref, json_object_get(refj, "cases"), "100%", 1);
	run_budget(store, ref, json_object_get(refj, "cases"), "25%", 1);
	/* the same without routing reports and hints (figures to compare) */
	run_budget(store, ref, json_object_get(refj, "cases"), "25%", 0);
	json_decref(refj);
	cw_dsv_free(ref);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}
