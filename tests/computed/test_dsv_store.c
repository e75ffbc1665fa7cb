/*
 * test_dsv_store.c — a DeepSeek-V4-family forward pass from a strata
 * store (cw_dsv_load_store: dense weights from dense.bin, routed experts
 * from a real expertd's host pool; V4.1: Engram rows from its Engram tier
 * with the rows prefetched as soon as the tokens are known) against the
 * in-memory path that reads model.safetensors (cw_dsv_load), on
 * ../shared's fixture of the revision named by the argument: v4
 * (tiny-deepseek-v4) or v41 (tiny-deepseek-v41).
 *
 * For every case of reference.json, its prompt followed by its greedy
 * continuation is evaluated by both models in chunks of 16 positions with
 * the logits of every position: the two must be bit-identical (the same
 * bytes dequantised by the same functions; DESIGN 6a).  Run at
 * --host-budget 100 % and 25 % of the experts; at 25 % the pool must hold
 * fewer experts than the model has and must have evicted (so the records
 * really came and went through the pool).  Every token reports every
 * layer's top-k.
 *  v4   run a third time at 25 % without routing reports; V4's hash
 *       layers hint each later hash layer's experts (counted exactly).
 *  v41  expertd runs with an Engram cache of 500 rows, smaller than the
 *       1524 rows of the two tables, QAT on at both budgets and off at a
 *       third run at 25 %: every token looks up its rows in every Engram
 *       layer (prefetch and fetch), the cache evicts rows and misses, and
 *       the prefetches give hits; a V4 store is refused as a V4.1 one.
 * A store without expertd is refused with a clear message.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "st_config_dsv41.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "es_convert.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define CHUNK 16
#define ENGRAM_CACHE "49000" /* 500 rows of 66 + 32 bytes: < 1524 rows */

/* A revision's state and eval, over an opaque state. */
struct rev {
	enum st_dsv_revision rev;
	const char *fixture, *inst;
	int (*state_new)(const struct cw_dsv_model *m, int max_tokens,
			 void **ret);
	int (*eval)(const struct cw_dsv_model *m, void *s, const int32_t *ids,
		    int n, float *logits, struct st_diag *diag);
	void (*state_free)(void *s);
};

static int v4_state_new(const struct cw_dsv_model *m, int max_tokens,
			void **ret)
{
	return cw_dsv_state_new(m, max_tokens, (struct cw_dsv_state **)ret);
}

static int v4_eval(const struct cw_dsv_model *m, void *s, const int32_t *ids,
		   int n, float *logits, struct st_diag *diag)
{
	return cw_dsv_eval(m, s, ids, n, 1, logits, diag);
}

static void v4_state_free(void *s)
{
	cw_dsv_state_free(s);
}

static int v41_state_new(const struct cw_dsv_model *m, int max_tokens,
			 void **ret)
{
	return cw_dsv_state_new(m, max_tokens,
				  (struct cw_dsv_state **)ret);
}

static int v41_eval(const struct cw_dsv_model *m, void *s,
		    const int32_t *ids, int n, float *logits,
		    struct st_diag *diag)
{
	return cw_dsv_eval(m, s, ids, n, 1, logits, diag);
}

static void v41_state_free(void *s)
{
	cw_dsv_state_free(s);
}

static const struct rev k_v4 = { ST_DSV_REV_V4, "tiny-deepseek-v4", "dsv4s",
				 v4_state_new, v4_eval, v4_state_free };
static const struct rev k_v41 = { ST_DSV_REV_V41, "tiny-deepseek-v41",
				  "dsv41s", v41_state_new, v41_eval,
				  v41_state_free };

/* Every case: both models, chunk by chunk, all positions bit-identical.
 * Returns the number of positions compared. */
static long compare_cases(const struct rev *rv, const struct cw_dsv_model *ref,
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
		void *sa = NULL, *sb = NULL;
		int diff_pos = -1;

		if (!ids) {
			CHECK(0, "out of memory");
			break;
		}
		ng -= n;
		CHECK(rv->state_new(ref, n + ng, &sa) == 0 &&
		      rv->state_new(sm, n + ng, &sb) == 0, "state");
		for (int p = 0; sa && sb && p < n + ng; p += CHUNK) {
			int k = n + ng - p < CHUNK ? n + ng - p : CHUNK;
			int r = rv->eval(ref, sa, ids + p, k, a, &diag);

			CHECK(r == 0, "%s: in-memory eval: %s", name, diag.msg);
			r = rv->eval(sm, sb, ids + p, k, b, &diag);
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
		rv->state_free(sa);
		rv->state_free(sb);
		free(ids);
	}
out:
	free(a);
	free(b);
	return compared;
}

/* V4: every token reports every layer's top-k; the hash-routed layers
 * hint each later hash layer's experts. */
static void check_v4(const struct st_dsv_config *c, const char *budget,
		     int reports, long n, const struct es_stats *st,
		     const struct es_tier_stats *ts)
{
	int hint_layers = 0;

	/* sum over hash layers l of the hash layers after it */
	for (int l = 0; l < c->n_hash_layers; l++)
		hint_layers += c->n_hash_layers - 1 - l;
	printf("budget %s, reports %s: routed %llu, hints %llu (dropped %llu), prefetch "
	       "loads %llu, used %llu, wasted %llu\n", budget,
	       reports ? "on" : "off",
	       (unsigned long long)ts->routed, (unsigned long long)ts->hints,
	       (unsigned long long)ts->hints_dropped,
	       (unsigned long long)ts->prefetch_loads,
	       (unsigned long long)ts->prefetch_used,
	       (unsigned long long)ts->prefetch_wasted);
	if (!reports) {
		hint_layers = 0;
		n = 0;
	}
	CHECK(ts->routed == (uint64_t)n * c->n_layers * c->top_k,
	      "routed %llu, expected %ld x %d x %d",
	      (unsigned long long)ts->routed, n, c->n_layers, c->top_k);
	CHECK(ts->hints == (uint64_t)n * c->top_k * hint_layers,
	      "hints %llu, expected %ld x %d x %d",
	      (unsigned long long)ts->hints, n, c->top_k, hint_layers);
	CHECK(n > 0 || !reports, "no positions compared");
	CHECK(st->hits + st->misses > 0, "no expert acquired through expertd");
}

/* V4.1: the experts acquired and reported, and the Engram tier's
 * counters. */
static void check_v41(const struct st_dsv_config *c, struct es_client *es,
		      const char *budget, unsigned qat, long n,
		      const struct es_stats *st,
		      const struct es_tier_stats *ts)
{
	struct es_engram_stats en = { 0 };
	struct st_diag diag = { { 0 } };
	int rpp = (c->engram_max_ngram - 1) * c->engram_n_heads;

	CHECK(es_client_engram_stats(es, &en, &diag) == 0, "engram stats: %s",
	      diag.msg);
	printf("budget %s, QAT %s: Engram: %llu lookups (%llu prefetched), "
	       "%llu hits, %llu merged, %llu misses, %llu evictions, %llu "
	       "block reads, %llu bytes, read p50 %llu ns p99 %llu ns\n",
	       budget, qat ? "on" : "off", (unsigned long long)en.lookups,
	       (unsigned long long)en.prefetch_rows,
	       (unsigned long long)en.hits, (unsigned long long)en.merged,
	       (unsigned long long)en.misses,
	       (unsigned long long)en.evictions, (unsigned long long)en.reads,
	       (unsigned long long)en.read_bytes,
	       (unsigned long long)en.lat_p50_ns,
	       (unsigned long long)en.lat_p99_ns);
	CHECK(n > 0, "no positions compared");
	CHECK(ts->routed == (uint64_t)n * c->n_layers * c->top_k,
	      "routed %llu, expected %ld x %d x %d",
	      (unsigned long long)ts->routed, n, c->n_layers, c->top_k);
	/* an acquire that finds a prefetched slot still loading counts as
	 * neither hit nor miss (es_server.c): at most once per prefetch load
	 * used (the step-named next-token hints prefetch) */
	CHECK(st->hits + st->misses + ts->prefetch_used >=
		      (uint64_t)n * c->n_layers * c->top_k,
	      "%llu acquires for %ld tokens x %d layers x top %d",
	      (unsigned long long)(st->hits + st->misses + ts->prefetch_used),
	      n, c->n_layers, c->top_k);
	/* each token: its rows looked up by the prefetch and by the fetch,
	 * in every Engram layer */
	CHECK(en.lookups == (uint64_t)2 * n * c->n_engram * rpp,
	      "Engram lookups %llu, expected 2 x %ld x %d x %d",
	      (unsigned long long)en.lookups, n, c->n_engram, rpp);
	CHECK(en.prefetch_rows == (uint64_t)n * c->n_engram * rpp,
	      "Engram prefetched rows %llu, expected %ld x %d x %d",
	      (unsigned long long)en.prefetch_rows, n, c->n_engram, rpp);
	CHECK(en.misses > 0 && en.evictions > 0,
	      "a cache smaller than the tables must miss and evict");
	CHECK(en.hits + en.merged > 0, "prefetched rows never found");
}

/* One expertd at `budget` serving the store; V4: routing reports on or
 * off (reports); V4.1: the QAT flags of both models (qat). */
static void run_budget(const struct rev *rv, const char *store,
		       struct cw_dsv_model *ref, json_t *cases,
		       const char *budget, int reports, unsigned qat)
{
	const int v41 = rv->rev == ST_DSV_REV_V41;
	const char *args[] = { "--store", store, "--host-budget", budget,
			       NULL, NULL, NULL };
	const struct st_dsv_config *c = cw_dsv_config(ref);
	struct st_test_inst inst;
	struct st_diag diag = { { 0 } };
	struct es_client *es = NULL;
	char msg[1024];
	struct cw_dsv_model *sm = NULL;
	struct es_stats st = { 0 };
	struct es_tier_stats ts = { 0 };
	int total, r, fails0 = n_fail;
	long n;

	if (v41) { /* a cache smaller than the tables */
		args[4] = "--engram-cache";
		args[5] = ENGRAM_CACHE;
	}
	st_test_inst_init(&inst, rv->inst);
	if (dsvt_expertd_open(&inst, args, &es, msg, sizeof(msg)) < 0) {
		CHECK(0, "%s (budget %s)", msg, budget);
		goto out;
	}
	r = cw_dsv_load_store(store, es, rv->rev, CW_COMPUTE_REFERENCE, &sm,
			      &diag);
	CHECK(r == 0, "cw_dsv_load_store: %s", diag.msg);
	if (r)
		goto out;
	if (v41)
		CHECK(cw_dsv_set_qat(ref, qat) == 0 &&
		      cw_dsv_set_qat(sm, qat) == 0, "set_qat");
	else
		cw_dsv_set_route_reports(sm, reports);
	n = compare_cases(rv, ref, sm, cases);
	total = es_client_n_layers(es) * es_client_n_experts(es);
	CHECK(es_client_stats(es, &st) == 0, "stats");
	es_client_tier_stats(es, &ts);
	printf("budget %s: %ld positions compared (%d failures); experts: "
	       "pool %llu of %d, %llu hits, %llu misses, %llu evictions, %llu "
	       "loads, %llu routed\n", budget, n, n_fail - fails0,
	       (unsigned long long)st.n_slots, total,
	       (unsigned long long)st.hits, (unsigned long long)st.misses,
	       (unsigned long long)st.evictions, (unsigned long long)st.loads,
	       (unsigned long long)ts.routed);
	if (v41)
		check_v41(c, es, budget, qat, n, &st, &ts);
	else
		check_v4(c, budget, reports, n, &st, &ts);
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

int main(int argc, char **argv)
{
	const struct rev *rv = argc == 2 && !strcmp(argv[1], "v4") ? &k_v4 :
			       argc == 2 && !strcmp(argv[1], "v41") ? &k_v41 :
								      NULL;
	char dir[4096], tmp[4096], store[4200];
	struct st_diag diag = { { 0 } };
	struct cw_dsv_model *ref = NULL;
	json_t *refj, *cases;

	if (!rv) {
		fprintf(stderr, "usage: %s v4|v41\n", argv[0]);
		return 2;
	}
	st_test_fixture_model(rv->fixture, dir, sizeof(dir));
	if (dsvt_convert_tmp(dir, tmp, sizeof(tmp), store, sizeof(store)))
		return 1;
	if (cw_dsv_load(dir, rv->rev, CW_COMPUTE_REFERENCE, &ref, &diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	refj = dsvt_load_json(dir, "reference.json");
	dsvt_cases(refj, "reference.json");
	cases = json_object_get(refj, "cases");
	/* a store without expertd is refused with a clear message */
	{
		struct cw_dsv_model *x = NULL;

		CHECK(cw_dsv_load_store(store, NULL, rv->rev,
					CW_COMPUTE_REFERENCE, &x, &diag) ==
			      -ST_E_CONFIG && strstr(diag.msg, "expertd"),
		      "load_store without expertd: %s", diag.msg);
	}
	if (rv->rev == ST_DSV_REV_V41) {
		/* a V4 store is not taken for a V4.1 one */
		char v4dir[4096], v4store[4200];
		struct es_convert_opts o;
		struct cw_dsv_model *x = NULL;

		st_test_fixture_model("tiny-deepseek-v4", v4dir, sizeof(v4dir));
		snprintf(v4store, sizeof(v4store), "%s/store-v4", tmp);
		es_convert_opts_init(&o);
		CHECK(es_convert(v4dir, v4store, &o, &diag) == 0,
		      "convert V4: %s", diag.msg);
		CHECK(cw_dsv_load_store(v4store, NULL, ST_DSV_REV_V41,
					CW_COMPUTE_REFERENCE, &x, &diag) ==
			      -ST_E_UNSUPPORTED &&
			      strstr(diag.msg, "not a DeepSeek-V4.1 store"),
		      "load_store of a V4 store: %s", diag.msg);
		run_budget(rv, store, ref, cases, "100%", 1, CW_DSV41_QAT_ALL);
		run_budget(rv, store, ref, cases, "25%", 1, CW_DSV41_QAT_ALL);
		run_budget(rv, store, ref, cases, "25%", 1, 0);
	} else {
		run_budget(rv, store, ref, cases, "100%", 1, 0);
		run_budget(rv, store, ref, cases, "25%", 1, 0);
		/* the same without routing reports and hints (figures to
		 * compare) */
		run_budget(rv, store, ref, cases, "25%", 0, 0);
	}
	json_decref(refj);
	cw_dsv_free(ref);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}
