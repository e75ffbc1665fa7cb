/*
 * test_batch_eval.c — continuous batching is exact in reference mode
 * (DESIGN.md 6a): 16 sequences of different prompt lengths, evaluated
 * alone with cw_model_eval (whole prompt, then one greedy token per call)
 * and then together with cw_model_eval_batch as the scheduler does it
 * (staggered admission, prefill in chunks of a per-step token budget mixed
 * with other sequences' decode tokens, tokens of a step in either order):
 * every logits vector must be bit-identical (memcmp), so the greedy tokens
 * are too.  Real expertd and kvd daemons; F32 KV.
 *
 * Usage: test_batch_eval FIXTURE EXPERTS [KV [COMPUTE [THREADS]]]  (tiny-qwen3moe|
 * tiny-mixtral, bf16|mxfp4, f32|f16|bf16|fp8, reference|fast).  With a fast
 * KV dtype (not reference mode) the same exactness holds: batching changes
 * no per-token operation; so does fast compute mode (its small-batch GEMM
 * gives each token the matvec kernel's result bit for bit).  With THREADS
 * (> 1) the model is reopened with a pool of that many threads after the
 * single-thread alone pass: its alone logits must equal the single-thread
 * ones bit for bit (matvecs split by rows, attention by heads: fixed
 * reductions), and the batched passes then run on the pool.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_kvrow.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "es_convert.h"
#include "kv_client.h"
#include "st_hugemem.h"
#include "serve_setup.h"
#include "st_util.h"
#include "test_util.h"

#define N_SEQ 16
#define N_DEC 6        /* greedy tokens after the prompt */
#define STEP_BUDGET 24 /* tokens per batched step */

static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); \
	printf("\n"); } } while (0)

struct seqst {
	int32_t ids[64 + N_DEC];
	int n_prompt, n_done, n_gen, start_step;
	uint32_t seq;
	float *ref;    /* [N_DEC][vocab]: alone */
};

int main(int argc, char **argv)
{
	const char *fixture = argc > 1 ? argv[1] : "tiny-qwen3moe";
	const char *experts = argc > 2 ? argv[2] : "bf16";
	const char *kv_args[4] = { "--budget", "256MiB", NULL };
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct st_test_serve t;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *m;
	static struct seqst s[N_SEQ];
	struct cw_batch_tok toks[STEP_BUDGET + N_SEQ];
	float *lg;
	int vocab, r;

	es_convert_opts_init(&o);
	o.expert_dtype = !strcmp(experts, "mxfp4") ? ST_DTYPE_MXFP4 :
						      ST_DTYPE_BF16;
	if (argc > 3 && cw_kvrow_parse_dtype(argv[3], &mo.kv_dtype) < 0) {
		printf("FAIL: bad KV dtype %s\n", argv[3]);
		return 1;
	}
	if (argc > 4 && cw_compute_parse(argv[4], &mo.compute) < 0) {
		printf("FAIL: bad compute mode %s\n", argv[4]);
		return 1;
	}
	if (st_test_serve_open(&t, fixture, &o, "bat", NULL, kv_args, &mo) < 0)
		return 1;
	es = t.es;
	kv = t.kv;
	m = t.m;
	/* dense.bin in its own huge-page advised mapping from ST_HUGEMEM_MIN
	 * bytes on (st_hugemem.h), in malloc's heap below */
	{
		uint64_t db = 0;
		long long huge = -1;
		int adv = cw_model_dense_pages(m, &db, &huge);

		if (adv != (db >= ST_HUGEMEM_MIN) || db == 0 || huge < 0) {
			printf("FAIL: dense weights %llu bytes: advised %d, "
			       "%lld bytes in huge pages\n",
			       (unsigned long long)db, adv, huge);
			st_test_serve_close(&t);
			return 1;
		}
	}
	vocab = cw_model_config(m)->vocab_size;
	lg = malloc(sizeof(float) * (size_t)vocab);

	/* alone: whole prompt, then one token per call */
	for (int i = 0; i < N_SEQ; i++) {
		struct seqst *q = &s[i];

		q->n_prompt = 3 + (i * 37) % 60;
		for (int j = 0; j < q->n_prompt; j++)
			q->ids[j] = (int32_t)((i * 7919 + j * 104729 + 17) %
					      (vocab - 10) + 5);
		q->ref = malloc(sizeof(float) * (size_t)vocab * N_DEC);
		q->start_step = i / 3;
		r = kv_client_seq_create(kv, &q->seq, &diag);
		for (int d = 0; !r && d < N_DEC; d++) {
			int pos = d ? q->n_prompt + d - 1 : 0;
			int n = d ? 1 : q->n_prompt;
			float *out = q->ref + (size_t)d * vocab;

			r = cw_model_eval(m, q->seq, (uint32_t)pos, q->ids + pos,
					  n, NULL, out, &diag);
			q->ids[q->n_prompt + d] = cw_argmax(out, vocab);
		}
		if (r < 0) {
			printf("FAIL: alone eval: %s\n", diag.msg);
			return 1;
		}
		kv_client_seq_free(kv, q->seq);
	}

	/* the same alone, on a pool: bit-identical */
	if (argc > 5 && atoi(argv[5]) > 1) {
		int diffs = 0;

		cw_model_close(m);
		m = t.m = NULL;
		mo.n_threads = atoi(argv[5]);
		r = cw_model_open(t.store, es, kv, &mo, &m, &diag);
		t.m = m;
		if (r < 0) {
			printf("FAIL: reopen with %d threads: %s\n",
			       mo.n_threads, diag.msg);
			st_test_serve_close(&t);
			return 1;
		}
		for (int i = 0; i < N_SEQ; i++) {
			struct seqst *q = &s[i];

			r = kv_client_seq_create(kv, &q->seq, &diag);
			for (int d = 0; !r && d < N_DEC; d++) {
				int pos = d ? q->n_prompt + d - 1 : 0;
				int n = d ? 1 : q->n_prompt;

				r = cw_model_eval(m, q->seq, (uint32_t)pos,
						  q->ids + pos, n, NULL, lg,
						  &diag);
				if (!r && memcmp(lg, q->ref + (size_t)d * vocab,
						 sizeof(float) * (size_t)vocab))
					diffs++;
			}
			if (r < 0) {
				printf("FAIL: %d-thread eval: %s\n",
				       mo.n_threads, diag.msg);
				return 1;
			}
			kv_client_seq_free(kv, q->seq);
		}
		CHECK(diffs == 0, "%d of %d logits vectors differ between 1 "
		      "and %d threads", diffs, N_SEQ * N_DEC, mo.n_threads);
		printf("%d threads: %d logits vectors bit-identical to 1 "
		       "thread\n", mo.n_threads, N_SEQ * N_DEC - diffs);
	}

	/* together: two passes, the step's tokens in forward and reverse
	 * order */
	for (int pass = 0; pass < 2; pass++) {
		int done = 0, step = 0, steps_mixed = 0, max_n = 0;

		for (int i = 0; i < N_SEQ; i++) {
			s[i].n_done = 0;
			s[i].n_gen = 0;
			if (kv_client_seq_create(kv, &s[i].seq, &diag) < 0) {
				printf("FAIL: seq create: %s\n", diag.msg);
				return 1;
			}
		}
		while (done < N_SEQ) {
			int n = 0, budget = STEP_BUDGET, n_dec = 0, n_pre = 0;
			int owner[STEP_BUDGET + N_SEQ];
			float *outs[N_SEQ];

			/* decode tokens of running sequences first */
			for (int i = 0; i < N_SEQ; i++) {
				struct seqst *q = &s[i];

				outs[i] = NULL;
				if (q->n_done < q->n_prompt || q->n_gen >= N_DEC ||
				    q->n_gen == 0)
					continue;
				toks[n].seq = q->seq;
				toks[n].pos = (uint32_t)(q->n_prompt + q->n_gen - 1);
				toks[n].id = q->ids[toks[n].pos];
				outs[i] = malloc(sizeof(float) * (size_t)vocab);
				toks[n].logits = outs[i];
				owner[n++] = i;
				budget--;
				n_dec++;
			}
			/* then prefill chunks of admitted ones */
			for (int i = 0; i < N_SEQ && budget > 0; i++) {
				struct seqst *q = &s[i];
				int k;

				if (step < q->start_step || q->n_done >= q->n_prompt)
					continue;
				k = ST_MIN(budget, q->n_prompt - q->n_done);
				for (int j = 0; j < k; j++) {
					toks[n].seq = q->seq;
					toks[n].pos = (uint32_t)(q->n_done + j);
					toks[n].id = q->ids[q->n_done + j];
					toks[n].logits = NULL;
					if (q->n_done + j == q->n_prompt - 1) {
						outs[i] = malloc(sizeof(float) *
								 (size_t)vocab);
						toks[n].logits = outs[i];
					}
					owner[n++] = i;
				}
				q->n_done += k;
				budget -= k;
				n_pre++;
			}
			step++;
			if (!n)
				continue;
			if (n_dec && n_pre)
				steps_mixed++;
			max_n = ST_MAX(max_n, n);
			if (pass == 1) {
				for (int a = 0, b = n - 1; a < b; a++, b--) {
					struct cw_batch_tok t = toks[a];

					toks[a] = toks[b];
					toks[b] = t;
				}
			}
			r = cw_model_eval_batch(m, toks, n, &diag);
			if (r < 0) {
				printf("FAIL: batch eval: %s\n", diag.msg);
				return 1;
			}
			(void)owner;
			for (int i = 0; i < N_SEQ; i++) {
				struct seqst *q = &s[i];
				const float *ref;

				if (!outs[i])
					continue;
				ref = q->ref + (size_t)q->n_gen * vocab;
				CHECK(!memcmp(outs[i], ref, sizeof(float) *
					      (size_t)vocab),
				      "pass %d seq %d step %d: batched logits "
				      "differ from alone", pass, i, q->n_gen);
				CHECK(cw_argmax(outs[i], vocab) ==
				      q->ids[q->n_prompt + q->n_gen],
				      "pass %d seq %d: greedy token differs",
				      pass, i);
				free(outs[i]);
				q->n_gen++;
				if (q->n_gen == N_DEC)
					done++;
			}
		}
		for (int i = 0; i < N_SEQ; i++)
			kv_client_seq_free(kv, s[i].seq);
		printf("pass %d: %d steps, %d mixed prefill+decode, up to %d "
		       "tokens per step from %d sequences\n", pass, step,
		       steps_mixed, max_n, N_SEQ);
		CHECK(steps_mixed > 0 && max_n >= N_SEQ / 2,
		      "the schedule really mixed sequences");
	}
	{
		struct kv_stats ks;

		CHECK(kv_client_stats(kv, &ks) == 0 && ks.pages_used == 0,
		      "every KV page freed");
	}
	for (int i = 0; i < N_SEQ; i++)
		free(s[i].ref);
	free(lg);
	st_test_serve_close(&t);
	printf("%s: %d failures\n", fixture, fails);
	return fails ? 1 : 0;
}
