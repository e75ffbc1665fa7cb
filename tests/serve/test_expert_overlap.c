/*
 * test_expert_overlap.c — expert overlap (cw_model_set_expert_overlap,
 * issue 25): a layer's experts computed one by one as expertd hands each
 * over, the resident ones while the misses are read, gives the same
 * logits bit for bit as acquiring them all first, and really overlaps.
 *
 * Real expertd (host budget 25 %, every load slowed by
 * --test-load-delay-ms so that a miss is still being read when the
 * resident experts are done) and kvd; tiny-qwen3moe, reference mode, one
 * thread.  The same prompt and greedy tokens are evaluated with overlap on
 * (the default), then off, then on again:
 *  - every logits vector equal (memcmp) across the three passes;
 *  - the read statistics' experts_early (experts computed before their
 *    layer's last miss arrived) grew in the passes with overlap and not in
 *    the pass without, and expertd read records (misses happened) in each.
 *
 * Usage: test_expert_overlap [FIXTURE [EXPERTS]]  (default tiny-qwen3moe
 * bf16).  Exit 77 when ../shared's fixture is absent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_model.h"
#include "cw_sampler.h"
#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "serve_setup.h"
#include "test_util.h"

#define N_PROMPT 9
#define N_DEC 6 /* greedy tokens after the prompt */

static int fails;

#define CHECK(c, ...) do { if (!(c)) { fails++; printf("FAIL: " __VA_ARGS__); \
	printf("\n"); } } while (0)

/* The prompt, then N_DEC greedy tokens, into lg [(N_DEC + 1) x vocab]
 * (the prompt's last logits first).  0 or negative with diag. */
static int generate(struct cw_model *m, struct kv_client *kv, int vocab,
		    float *lg, struct st_diag *diag)
{
	int32_t ids[N_PROMPT + N_DEC + 1];
	uint32_t seq = 0;
	int r;

	for (int j = 0; j < N_PROMPT; j++)
		ids[j] = (int32_t)((j * 104729 + 17) % (vocab - 10) + 5);
	r = kv_client_seq_create(kv, &seq, diag);
	for (int d = 0; !r && d <= N_DEC; d++) {
		int pos = d ? N_PROMPT + d - 1 : 0, n = d ? 1 : N_PROMPT;
		float *out = lg + (size_t)d * vocab;

		r = cw_model_eval(m, seq, (uint32_t)pos, ids + pos, n, NULL, out,
				  diag);
		ids[N_PROMPT + d] = cw_argmax(out, vocab);
	}
	if (seq)
		kv_client_seq_free(kv, seq);
	return r;
}

int main(int argc, char **argv)
{
	const char *fixture = argc > 1 ? argv[1] : "tiny-qwen3moe";
	const char *experts = argc > 2 ? argv[2] : "bf16";
	const char *es_args[] = { "--host-budget", "25%",
				  "--test-load-delay-ms", "2", NULL };
	const char *kv_args[] = { "--budget", "64MiB", NULL };
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	struct st_test_serve t;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *m;
	float *lg[3] = { NULL, NULL, NULL };
	uint64_t early[3], loads[3];
	int vocab, r;

	es_convert_opts_init(&o);
	o.expert_dtype = !strcmp(experts, "mxfp4") ? ST_DTYPE_MXFP4 :
						      ST_DTYPE_BF16;
	if (st_test_serve_open(&t, fixture, &o, "ovl", es_args, kv_args,
			       &mo) < 0)
		return 1;
	es = t.es;
	kv = t.kv;
	m = t.m;
	vocab = cw_model_config(m)->vocab_size;
	for (int pass = 0; pass < 3 && !fails; pass++) {
		struct cw_read_stats s0, s1;
		struct es_stats e0, e1;

		lg[pass] = malloc(sizeof(float) * (size_t)vocab * (N_DEC + 1));
		if (!lg[pass]) {
			printf("FAIL: out of memory\n");
			return 1;
		}
		cw_model_set_expert_overlap(m, pass != 1);
		cw_model_read_stats(m, &s0);
		CHECK(es_client_stats(es, &e0) == 0, "expertd stats");
		r = generate(m, kv, vocab, lg[pass], &diag);
		CHECK(r == 0, "pass %d: %s", pass, diag.msg);
		cw_model_read_stats(m, &s1);
		CHECK(es_client_stats(es, &e1) == 0, "expertd stats");
		early[pass] = s1.experts_early - s0.experts_early;
		loads[pass] = e1.loads - e0.loads;
		printf("pass %d (overlap %s): %llu records read, %llu experts "
		       "computed before their layer's last miss arrived, "
		       "stall %.1f ms\n", pass, pass != 1 ? "on" : "off",
		       (unsigned long long)loads[pass],
		       (unsigned long long)early[pass],
		       (double)(s1.expert_stall_ns - s0.expert_stall_ns) / 1e6);
		CHECK(loads[pass] > 0, "pass %d: no record read (the budget "
		      "holds every expert: nothing to overlap)", pass);
		if (pass != 1)
			CHECK(early[pass] > 0, "pass %d: overlap on, but no "
			      "expert computed while a miss was read", pass);
		else
			CHECK(early[pass] == 0, "overlap off, yet %llu experts "
			      "counted early", (unsigned long long)early[pass]);
		if (pass && lg[pass] && !fails)
			for (int d = 0; d <= N_DEC; d++)
				CHECK(!memcmp(lg[0] + (size_t)d * vocab,
					      lg[pass] + (size_t)d * vocab,
					      sizeof(float) * (size_t)vocab),
				      "pass %d token %d: logits differ from "
				      "pass 0's", pass, d);
	}
	for (int i = 0; i < 3; i++)
		free(lg[i]);
	st_test_serve_close(&t);
	printf("%s %s: %d failures\n", fixture, experts, fails);
	return fails ? 1 : 0;
}
