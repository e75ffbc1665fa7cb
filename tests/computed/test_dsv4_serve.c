/*
 * test_dsv4_serve.c — computed's V4 serving path (cw_model over a V4
 * store, cw_model_dsv.c) against the in-process forward pass that reads
 * model.safetensors (cw_dsv_load), on ../shared tiny-deepseek-v4, with
 * a real expertd at a 25 % host budget and a real kvd holding the V4
 * states (cw_model_seq_create).
 *
 *  - three sequences (prompt + greedy continuation of three reference
 *    cases) stepped together through cw_model_eval_batch, in prefill
 *    chunks of 5 then one token per step, in a varying order: the logits
 *    of every position asked for are bit-identical to the in-process
 *    forward's (reference mode; DESIGN 6a), both for runs that want every
 *    position and for runs that want only the last;
 *  - the third prompt again with the prefix cache: its full pages but the
 *    last token's are mapped from kvd (count asserted, kvd's counter too)
 *    and the rest of its logits are bit-identical; the same run given
 *    again is a replay (skipped, 0), with other buffers it is refused;
 *  - cw_model_eval on a sequence without cw_model_seq_begin (lazy,
 *    process-local state)
 *    gives the same logits; a position that does not continue a sequence
 *    is refused (-EINVAL), as are other KV dtypes and the fast mode;
 *  - the read statistics count every token; expertd saw hash-routed
 *    prefetch hints, and at 25 % it evicted.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "cw_model.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define N_SEQ 3
#define CHUNK 5

struct seqst {
	const char *name;
	int32_t ids[256];
	int n;          /* prompt + continuation */
	int n_prompt;
	int done;       /* positions evaluated */
	uint32_t seq;
	float *ref;     /* [n][V] in-process logits */
	int diff_pos;   /* first position that differs, -1 */
	int compared;
};

/* ids of case `ci`: its prompt then its greedy continuation */
static int load_case(json_t *cases, int ci, struct seqst *q)
{
	json_t *cs = json_array_get(cases, (size_t)ci);
	int32_t *ids = cs ? dsvt_case_ids(cs, 1, &q->n, &q->n_prompt) : NULL;

	if (!ids || q->n > 256 || q->n_prompt < 1) {
		free(ids);
		return -1;
	}
	q->name = json_string_value(json_object_get(cs, "name"));
	memcpy(q->ids, ids, sizeof(int32_t) * (size_t)q->n);
	free(ids);
	q->diff_pos = -1;
	return 0;
}

static void compare_row(struct seqst *q, int pos, const float *row, int V)
{
	q->compared++;
	if (q->diff_pos < 0 &&
	    memcmp(row, q->ref + (size_t)pos * V, sizeof(float) * (size_t)V))
		q->diff_pos = pos;
}

int main(void)
{
	const char *es_args[] = { "--store", NULL, "--host-budget", "25%",
				  NULL };
	const char *kv_args[] = { NULL };
	char dir[4096], tmp[4096], store[4200];
	struct st_diag diag = { { 0 } };
	struct cw_dsv_model *ref = NULL;
	struct cw_model_opts mo = { 0 };
	struct st_test_inst inst;
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct cw_model *m = NULL;
	struct seqst s[N_SEQ] = { 0 };
	static const int cases_used[N_SEQ] = { 1, 0, 2 };
	struct cw_batch_tok toks[N_SEQ * CHUNK];
	float *rows = NULL;
	uint64_t total_tokens = 0;
	json_t *refj;
	int V, r;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	if (dsvt_convert_tmp(dir, tmp, sizeof(tmp), store, sizeof(store)))
		return 1;
	if (cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &ref,
			&diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	V = cw_dsv_config(ref)->vocab_size;
	refj = dsvt_load_json(dir, "reference.json");
	dsvt_cases(refj, "reference.json");
	/* the in-process forward: every position of every sequence */
	for (int i = 0; i < N_SEQ; i++) {
		struct cw_dsv_state *st = NULL;

		if (load_case(json_object_get(refj, "cases"), cases_used[i],
			      &s[i]) < 0) {
			fprintf(stderr, "reference.json: case %d unusable\n",
				cases_used[i]);
			return 1;
		}
		s[i].ref = malloc(sizeof(float) * (size_t)s[i].n * V);
		if (!s[i].ref || cw_dsv_state_new(ref, s[i].n, &st) ||
		    cw_dsv_eval(ref, st, s[i].ids, s[i].n, 1, s[i].ref,
				 &diag)) {
			fprintf(stderr, "in-process forward: %s\n", diag.msg);
			return 1;
		}
		cw_dsv_state_free(st);
	}
	rows = malloc(sizeof(float) * (size_t)N_SEQ * CHUNK * V);

	es_args[1] = store;
	st_test_inst_init(&inst, "v4srv");
	if (st_test_daemon_start(&inst, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&inst, "kvd", kv_args, 30) < 0) {
		st_test_inst_stop(&inst);
		return 1;
	}
	r = es_client_open(inst.run_dir, inst.name, "test", 10000, &es, &diag);
	if (!r)
		r = kv_client_open(inst.run_dir, inst.name, "test", 10000, &kv,
				   &diag);
	/* F32 state only; fast compute loads (cw_dsv_load_store) */
	if (!r) {
		struct cw_model_opts bad = { .kv_dtype = ST_DTYPE_BF16 };
		struct cw_model *x = NULL;

		CHECK(cw_model_open(store, es, kv, &bad, &x, &diag) ==
			      -ST_E_UNSUPPORTED && strstr(diag.msg, "f32"),
		      "V4 with BF16 KV: %s", diag.msg);
		bad.kv_dtype = ST_DTYPE_F32;
		bad.compute = CW_COMPUTE_FAST;
		CHECK(cw_model_open(store, es, kv, &bad, &x, &diag) == 0 &&
			      cw_model_is_dsv4(x),
		      "V4 in fast mode: %s", diag.msg);
		cw_model_close(x);
	}
	mo.kv_dtype = ST_DTYPE_F32;
	if (!r)
		r = cw_model_open(store, es, kv, &mo, &m, &diag);
	if (r < 0) {
		fprintf(stderr, "FAIL: setup: %s\n", diag.msg);
		st_test_inst_stop(&inst);
		return 1;
	}
	CHECK(cw_model_is_dsv4(m), "a V4 store is not served as V4");
	CHECK(cw_model_config(m)->vocab_size == V, "vocab");
	/* their states in kvd pages (cw_model_seq_create); the third one
	 * with the prefix cache on: nothing cached yet, its prompt's full
	 * pages are published as they are evaluated */
	for (int i = 0; i < N_SEQ; i++) {
		uint32_t cached = 99;

		r = cw_model_seq_create(m, kv, s[i].ids, s[i].n_prompt, i == 2,
					0, s[i].n, &s[i].seq, &cached, &diag);
		CHECK(r == 0 && cached == 0, "sequence %d: %s (%u cached)", i,
		      diag.msg, cached);
	}

	/* stepped together: chunks of CHUNK through the prompt, then one
	 * token a step; sequence 1 wants only the last logits of a run */
	for (int step = 0; n_fail == 0; step++) {
		int n = 0;
		float *row = rows;

		for (int k = 0; k < N_SEQ; k++) {
			struct seqst *q = &s[(k + step) % N_SEQ];
			int i = (int)(q - s);
			int run = q->done < q->n_prompt ?
					  ST_MIN(CHUNK, q->n_prompt - q->done) :
					  ST_MIN(1, q->n - q->done);

			for (int t = 0; t < run; t++) {
				toks[n].seq = q->seq;
				toks[n].pos = (uint32_t)(q->done + t);
				toks[n].id = q->ids[q->done + t];
				toks[n].logits = i != 1 || t == run - 1 ? row :
									   NULL;
				if (toks[n].logits)
					row += V;
				n++;
			}
		}
		if (!n)
			break;
		r = cw_model_eval_batch(m, toks, n, &diag);
		CHECK(r == 0, "step %d: %s", step, diag.msg);
		if (r)
			break;
		total_tokens += (uint64_t)n;
		for (int t = 0; t < n; t++) {
			struct seqst *q = NULL;

			for (int i = 0; i < N_SEQ; i++)
				if (s[i].seq == toks[t].seq)
					q = &s[i];
			if (toks[t].logits)
				compare_row(q, (int)toks[t].pos, toks[t].logits,
					    V);
			q->done++;
		}
	}
	for (int i = 0; i < N_SEQ; i++) {
		printf("%s: %d positions, %d logit rows compared, first "
		       "difference at %d\n", s[i].name, s[i].n, s[i].compared,
		       s[i].diff_pos);
		CHECK(s[i].done == s[i].n, "%s: %d of %d positions evaluated",
		      s[i].name, s[i].done, s[i].n);
		CHECK(s[i].diff_pos < 0, "%s: batched logits differ from the "
		      "in-process forward at position %d", s[i].name,
		      s[i].diff_pos);
		CHECK(s[i].compared >= (i == 1 ? s[i].n - s[i].n_prompt : s[i].n),
		      "%s: only %d rows compared", s[i].name, s[i].compared);
	}
	/* a position that does not continue the sequence */
	r = cw_model_eval(m, s[0].seq, (uint32_t)s[0].n + 3, s[0].ids, 1, NULL,
			  rows, &diag);
	CHECK(r == -EINVAL && strstr(diag.msg, "position"),
	      "gap in a V4 sequence: %d %s", r, diag.msg);
	for (int i = 0; i < N_SEQ; i++)
		cw_model_seq_destroy(m, kv, s[i].seq);
	/* the third prompt again: its whole pages but the last token's come
	 * from the prefix cache, the rest is bit-identical; the same run
	 * given again (same ids and buffers) is a replay, not an error */
	{
		struct seqst *q = &s[2];
		const uint32_t want = (uint32_t)(q->n_prompt - 1) / 16 * 16;
		struct kv_stats k0 = { 0 }, k1 = { 0 };
		float *all = malloc(sizeof(float) * (size_t)q->n * V);
		uint32_t seq = 0, cached = 0;
		int n;

		kv_client_stats(kv, &k0);
		r = cw_model_seq_create(m, kv, q->ids, q->n_prompt, 1, 0,
					q->n, &seq, &cached, &diag);
		kv_client_stats(kv, &k1);
		CHECK(r == 0 && cached == want && want > 0 &&
			      k1.prefix_rows_reused - k0.prefix_rows_reused ==
				      want,
		      "%s again: %u rows cached (want %u), kvd reused %llu: %s",
		      q->name, cached, want,
		      (unsigned long long)(k1.prefix_rows_reused -
					   k0.prefix_rows_reused), diag.msg);
		n = q->n - (int)cached;
		if (!r && all && n > 0) {
			r = cw_model_eval(m, seq, cached, q->ids + cached, n, all,
					  NULL, &diag);
			CHECK(r == 0 && !memcmp(all, q->ref + (size_t)cached * V,
						sizeof(float) * (size_t)n * V),
			      "%s from the prefix cache: logits differ from "
			      "the in-process forward (%s)", q->name, diag.msg);
			all[0] = -1.0f;
			r = cw_model_eval(m, seq, cached, q->ids + cached, n, all,
					  NULL, &diag);
			CHECK(r == 0 && all[0] == -1.0f,
			      "a replayed run: %d %s", r, diag.msg);
			r = cw_model_eval(m, seq, cached, q->ids + cached, n,
					  q->ref, NULL, &diag);
			CHECK(r == -EINVAL, "the same positions with other "
			      "buffers are not a replay: %d", r);
			total_tokens += (uint64_t)n;
		}
		if (seq)
			cw_model_seq_destroy(m, kv, seq);
		free(all);
	}
	/* no cw_model_seq_begin: a state is made lazily at position 0 */
	{
		uint32_t seq;
		struct seqst *q = &s[2];
		float *all = malloc(sizeof(float) * (size_t)q->n * V);

		r = kv_client_seq_create(kv, &seq, &diag);
		if (!r && all)
			r = cw_model_eval(m, seq, 0, q->ids, q->n, all, NULL,
					  &diag);
		CHECK(r == 0 && all, "lazy eval: %s", diag.msg);
		if (!r && all)
			CHECK(!memcmp(all, q->ref, sizeof(float) * (size_t)q->n * V),
			      "lazy state: logits differ from the in-process "
			      "forward");
		total_tokens += (uint64_t)q->n;
		cw_model_seq_end(m, seq);
		kv_client_seq_free(kv, seq);
		free(all);
	}
	{
		struct cw_read_stats rs;
		struct es_stats st = { 0 };
		struct es_tier_stats ts = { 0 };
		int total = es_client_n_layers(es) * es_client_n_experts(es);

		cw_model_read_stats(m, &rs);
		CHECK(rs.tokens == total_tokens, "read stats: %llu tokens, "
		      "expected %llu", (unsigned long long)rs.tokens,
		      (unsigned long long)total_tokens);
		/* every decoder layer's top-k; the MTP block, the store's
		 * last expert layer, only when drafting */
		CHECK(es_client_n_layers(es) == cw_dsv_config(ref)->n_layers + 1,
		      "expertd: %d expert layers, the store keeps the MTP block",
		      es_client_n_layers(es));
		CHECK(rs.expert_bytes == total_tokens *
				cw_dsv_config(ref)->n_layers *
				cw_dsv_config(ref)->top_k *
				es_client_record_bytes(es),
		      "expert bytes %llu", (unsigned long long)rs.expert_bytes);
		CHECK(es_client_stats(es, &st) == 0, "expertd stats");
		es_client_tier_stats(es, &ts);
		printf("expertd: pool %llu of %d experts, %llu hits, %llu "
		       "misses, %llu evictions; %llu hints, %llu prefetch "
		       "loads\n", (unsigned long long)st.n_slots, total,
		       (unsigned long long)st.hits,
		       (unsigned long long)st.misses,
		       (unsigned long long)st.evictions,
		       (unsigned long long)ts.hints,
		       (unsigned long long)ts.prefetch_loads);
		CHECK(st.n_slots < (uint64_t)total && st.evictions > 0,
		      "25%% budget: %llu slots, %llu evictions",
		      (unsigned long long)st.n_slots,
		      (unsigned long long)st.evictions);
		CHECK(ts.hints > 0, "no hash-routed prefetch hints");
	}
	cw_model_close(m);
	kv_client_close(kv);
	es_client_close(es);
	st_test_inst_stop(&inst);
	st_rm_rf(inst.run_dir);
	for (int i = 0; i < N_SEQ; i++)
		free(s[i].ref);
	free(rows);
	json_decref(refj);
	cw_dsv_free(ref);
	st_rm_rf(tmp);
	return dsvt_finish(n_fail);
}
