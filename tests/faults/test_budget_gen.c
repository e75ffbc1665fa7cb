/*
 * test_budget_gen.c — greedy output under an oscillating memory budget is
 * bit-identical to a run with fixed budgets (issue 24 item 4, expertd's
 * side).
 *
 * This process plays computed (cw_model, cw_gen) against real expertd and
 * kvd daemons, as test_restarts does, on kjv-moe converted with BF16
 * experts (reference mode, F32 KV):
 *   1. expertd --host-budget 25 %: the reference logits and tokens;
 *   2. a new instance, expertd --memory-budget M (M = every expert's
 *      record, so the experts' cap is the whole model and their floor one
 *      layer's top-k) with STRATA_LEDGER_FLIP_MS=50 and
 *      STRATA_LEDGER_STEP=50%: the experts' target swings between the
 *      floor and about half the model every ~100 ms while generations
 *      run (as many as it takes for 4 swings down to the floor, at most
 *      8).  A thread of this process holds the ledger's KV side (it
 *      obeys every target at once and runs the arbiter too; kvd keeps its
 *      fixed --budget).  Every step's logits must equal run 1's bit for
 *      bit, and the target must have gone down to the floor and back
 *      several times during the generation.
 *
 * Usage: test_budget_gen [MAX_TOKENS]
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_gen.h"
#include "cw_model.h"
#include "es_client.h"
#include "fault_util.h"
#include "kv_client.h"
#include "st_ledger.h"
#include "st_store.h"
#include "st_tokenizer.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

#define PROMPT "In the beginning God created the heaven and the earth. " \
	       "And the earth was without form, and void"

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			if (n_fail < 40) {                                     \
				fprintf(stderr, "FAIL: " __VA_ARGS__);         \
				fputc('\n', stderr);                           \
			}                                                      \
			n_fail++;                                              \
		}                                                              \
	} while (0)

/* One instance with this process as its computed. */
struct side {
	struct st_test_inst inst;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *model;
};

/* The KV side of the ledger, held by a thread. */
struct kvside {
	struct st_ledger *l;
	pthread_t th;
	_Atomic int stop;
	/* what the experts' target did while it ran */
	uint64_t floor, lo, hi;
	unsigned downs;           /* times it went down to the floor */
};

static int open_side(struct side *s, const char *tag, const char *store,
		     const char *const *es_args)
{
	static const char *const kv_args[] = { "--budget", "64MiB", NULL };
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	struct st_diag diag = { "" };
	int r;

	memset(s, 0, sizeof(*s));
	st_test_inst_init(&s->inst, tag);
	if (st_test_daemon_start(&s->inst, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&s->inst, "kvd", kv_args, 30) < 0)
		return -1;
	r = es_client_open(s->inst.run_dir, s->inst.name, "computed", 10000,
			   &s->es, &diag);
	if (!r)
		r = kv_client_open(s->inst.run_dir, s->inst.name, "computed",
				   10000, &s->kv, &diag);
	if (!r)
		r = cw_model_open(store, s->es, s->kv, &mo, &s->model, &diag);
	if (r < 0) {
		fprintf(stderr, "setup: %s (%s)\n", diag.msg, st_strerror(r));
		return -1;
	}
	return 0;
}

static void close_side(struct side *s)
{
	cw_model_close(s->model);
	kv_client_close(s->kv);
	es_client_close(s->es);
	st_test_inst_stop(&s->inst);
}

/* n greedy tokens; ref_logits [n][vocab] and ref_tokens are filled
 * (compare 0) or compared bit for bit (compare 1).  0 or the error. */
static int run_gen(struct side *s, struct st_tokenizer *tok, int n,
		   int vocab, float *ref_logits, int32_t *ref_tokens,
		   int compare)
{
	struct cw_gen_params gp;
	struct cw_gen *g = NULL;
	struct st_diag diag = { "" };
	enum cw_finish fin = CW_FINISH_NONE;
	char text[2048];
	int r, i = 0;

	memset(&gp, 0, sizeof(gp));
	gp.max_tokens = n;
	gp.sampler.temperature = 0.0f;
	gp.ignore_eos = 1;
	r = cw_gen_start(s->model, tok, s->kv, PROMPT, strlen(PROMPT), &gp,
			 &g, &diag);
	while (r == 0 && fin == CW_FINISH_NONE && i < n) {
		int32_t t;

		r = cw_gen_step(g, text, sizeof(text), &t, &fin, &diag);
		if (r < 0 || t < 0)
			break;
		r = 0;
		if (compare) {
			CHECK(!memcmp(cw_gen_logits(g),
				      ref_logits + (size_t)i * vocab,
				      sizeof(float) * (size_t)vocab),
			      "logits of step %d differ from the fixed-budget "
			      "run", i);
			CHECK(t == ref_tokens[i], "token %d is %d, with fixed "
			      "budgets %d", i, t, ref_tokens[i]);
		} else {
			memcpy(ref_logits + (size_t)i * vocab, cw_gen_logits(g),
			       sizeof(float) * (size_t)vocab);
			ref_tokens[i] = t;
		}
		i++;
	}
	if (r < 0)
		fprintf(stderr, "generation: %s (%s)\n", diag.msg,
			st_strerror(r));
	CHECK(r < 0 || i == n, "%d tokens of %d", i, n);
	cw_gen_free(g);
	return r < 0 ? r : 0;
}

static void *kv_main(void *arg)
{
	struct kvside *k = arg;
	struct st_ledger_view v;
	int at_floor = 0;

	while (!atomic_load(&k->stop)) {
		struct st_ledger_report r = { 0 };
		uint64_t t;

		r.used = st_ledger_target(k->l);
		st_ledger_report(k->l, &r);
		st_ledger_tick(k->l, st_now_ns(), NULL);
		st_ledger_view(k->l, &v);
		t = v.side[ST_LEDGER_EXPERTS].target;
		if (t < k->lo)
			k->lo = t;
		if (t > k->hi)
			k->hi = t;
		if (t <= k->floor && !at_floor)
			k->downs++;
		at_floor = t <= k->floor;
		st_sleep_ns(10000000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 32;
	struct st_diag diag = { "" };
	struct st_tokenizer *tok = NULL;
	struct st_store *st = NULL;
	struct side a, b;
	struct kvside k;
	char tmp[4096], store[4200], mtext[32];
	const char *es_fixed[] = { "--store", store, "--host-budget", "25%",
				   "--test-load-delay-ms", "1", NULL };
	const char *es_budget[] = { "--store", store, "--memory-budget", mtext,
				    "--test-load-delay-ms", "1", NULL };
	uint64_t m;
	float *logits;
	int32_t *tokens;
	int vocab, r;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (n < 4 || n > 512) {
		fprintf(stderr, "usage: test_budget_gen [MAX_TOKENS 4..512]\n");
		return 2;
	}
	st_test_tmpdir(tmp, sizeof(tmp));
	if (flt_convert("kjv-moe", tmp, store, sizeof(store)) < 0)
		return 1;
	if (st_store_open(store, &st, &diag) < 0 ||
	    st_tokenizer_load(store, &tok, &diag) < 0) {
		fprintf(stderr, "%s\n", diag.msg);
		return 1;
	}
	m = (uint64_t)st->n_layers * st->n_experts * st->record_bytes;
	snprintf(mtext, sizeof(mtext), "%" PRIu64, m);
	memset(&k, 0, sizeof(k));
	k.floor = (uint64_t)st->cfg.top_k * st->record_bytes;
	k.lo = UINT64_MAX;
	printf("kjv-moe: %d layers x %d experts of %" PRIu64 " bytes, top-k "
	       "%d; --memory-budget %s\n", st->n_layers, st->n_experts,
	       st->record_bytes, st->cfg.top_k, mtext);
	st_store_close(st);

	/* 1. fixed budgets */
	if (open_side(&a, "bgf", store, es_fixed) < 0)
		return 1;
	vocab = cw_model_config(a.model)->vocab_size;
	logits = malloc(sizeof(float) * (size_t)vocab * (size_t)n);
	tokens = malloc(sizeof(int32_t) * (size_t)n);
	if (!logits || !tokens)
		return 1;
	r = run_gen(&a, tok, n, vocab, logits, tokens, 0);
	close_side(&a);
	if (r < 0 || n_fail)
		return 1;

	/* 2. one oscillating budget */
	setenv("STRATA_LEDGER_FLIP_MS", "50", 1);
	setenv("STRATA_LEDGER_STEP", "50%", 1);
	if (open_side(&b, "bgo", store, es_budget) < 0)
		return 1;
	r = st_ledger_open(&k.l, b.inst.name, ST_LEDGER_KV, m, 0, m, 4096,
			   &diag);
	if (r < 0) {
		fprintf(stderr, "ledger: %s\n", diag.msg);
		close_side(&b);
		return 1;
	}
	pthread_create(&k.th, NULL, kv_main, &k);
	{
		uint64_t t0 = st_now_ns();
		int runs = 0;

		/* generations (each compared with run 1) until the target
		 * went down to the floor at least 4 times, at most 8 */
		do {
			r = run_gen(&b, tok, n, vocab, logits, tokens, 1);
			runs++;
		} while (r == 0 && !n_fail && k.downs < 4 && runs < 8);
		atomic_store(&k.stop, 1);
		pthread_join(k.th, NULL);
		printf("%d generations of %d tokens in %.2f s under the "
		       "oscillating budget: the experts' target went down to "
		       "their floor (%" PRIu64 " bytes) %u times, between %"
		       PRIu64 " and %" PRIu64 " bytes\n", runs, n,
		       (double)(st_now_ns() - t0) / 1e9, k.floor, k.downs,
		       k.lo, k.hi);
	}
	CHECK(r == 0, "the generation under the oscillating budget failed");
	CHECK(k.downs >= 4, "the experts' target went down to the floor only "
	      "%u times during 8 generations (want 4)", k.downs);
	CHECK(k.hi >= m / 2 - st_ledger_step(k.l) / 8, "the experts' target "
	      "never rose to about half the model (%" PRIu64 ")", k.hi);
	st_ledger_close(k.l);
	close_side(&b);
	st_tokenizer_free(tok);
	free(logits);
	free(tokens);
	st_rm_rf(tmp);
	if (n_fail) {
		fprintf(stderr, "%d failures\n", n_fail);
		return 1;
	}
	printf("greedy logits and tokens bit-identical to fixed budgets\n");
	return 0;
}
