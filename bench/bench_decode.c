/*
 * bench_decode.c — decode speed and the bytes of weights read per token, next
 * to this machine's memory read bandwidth measured in the same run.
 *
 * Converts the checkpoint if needed (MXFP4 experts), starts expertd and kvd
 * on a private instance, runs the model in this process (the same code as
 * computed, reference mode), prefills a prompt, decodes N tokens greedily,
 * and prints:
 *   decode tokens/s (median of the runs), bytes read per token split into
 *   experts / other dense weights / LM head (counted by the model from the
 *   routing actually taken), achieved GB/s, and the read bandwidth of a
 *   vectorized sum over >= 1 GiB (st_membw) with 1 and 2 threads.
 * Prints figures, asserts nothing (STYLE.md: benchmarks never assert time).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "es_convert.h"
#include "st_daemon.h"
#include "st_membw.h"
#include "st_util.h"

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata-bench-decode --model DIR [--store DIR] [--tokens N]\n"
"                           [--prompt-tokens N] [--runs N] [--host-budget B]\n"
"                           [--experts mxfp4|bf16] [--membw-bytes B]\n"
"                           [--threads N]\n"
"\n"
"Decode benchmark (reference-mode CPU backend, 1 thread).  Make the large\n"
"model with: scripts/gen-moe-model.py --out bench-models/qwen3moe-large\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "store", required_argument, NULL, 's' },
		{ "tokens", required_argument, NULL, 'n' },
		{ "prompt-tokens", required_argument, NULL, 'p' },
		{ "runs", required_argument, NULL, 'r' },
		{ "host-budget", required_argument, NULL, 'b' },
		{ "experts", required_argument, NULL, 'e' },
		{ "membw-bytes", required_argument, NULL, 'w' },
		{ "threads", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *model = NULL, *experts = "mxfp4";
	int n_tokens = 32, n_prompt = 16, runs = 3, c, r;
	uint64_t membw_bytes = 1ull << 30;
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct cw_model *m = NULL;
	struct cw_model_opts mo = { ST_DTYPE_F32, 16, 1 };
	double tps[16], bw1 = 0, bw2 = 0;
	struct cw_read_stats before, after;
	uint64_t decode_ns_total = 0, decoded = 0;
	float *logits;

	memset(&inst, 0, sizeof(inst));
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 's': snprintf(inst.store_dir, sizeof(inst.store_dir), "%s", optarg); break;
		case 'n': n_tokens = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'r': runs = atoi(optarg); break;
		case 'b': snprintf(inst.host_budget, sizeof(inst.host_budget), "%s", optarg); break;
		case 'e': experts = optarg; break;
		case 'w': st_parse_size(optarg, &membw_bytes); break;
		case 't': mo.n_threads = atoi(optarg) > 0 ? atoi(optarg) : 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!model || n_tokens < 2 || n_prompt < 1 || runs < 1 || runs > 16) {
		usage(stderr);
		return 2;
	}
	if (!inst.store_dir[0])
		cli_default_store_dir(model, experts, inst.store_dir,
				      sizeof(inst.store_dir));
	if (!st_path_exists(inst.store_dir) &&
	    cli_convert(model, inst.store_dir, experts, 0, 0, -1))
		return 1;

	printf("memory read bandwidth (st_membw, %llu MiB, best of 5):\n",
	       (unsigned long long)(membw_bytes >> 20));
	st_membw_measure(1, membw_bytes, 5, &bw1);
	st_membw_measure(2, membw_bytes, 5, &bw2);
	printf("  1 thread  %.1f GB/s\n  2 threads %.1f GB/s\n", bw1, bw2);

	snprintf(inst.name, sizeof(inst.name), "bench-%d", (int)getpid());
	st_run_dir_default(inst.name, inst.run_dir, sizeof(inst.run_dir));
	inst.tiers_only = 1;
	snprintf(inst.kv_budget, sizeof(inst.kv_budget), "1GiB");
	r = cli_instance_up(&inst, 300, &diag);
	if (r < 0) {
		fprintf(stderr, "bench: %s\n", diag.msg);
		return 1;
	}
	r = es_client_open(inst.run_dir, inst.name, "bench", 60000, &es, &diag);
	if (!r)
		r = kv_client_open(inst.run_dir, inst.name, "bench", 60000, &kv, &diag);
	if (!r)
		r = cw_model_open(inst.store_dir, es, kv, &mo, &m, &diag);
	if (r < 0) {
		fprintf(stderr, "bench: %s\n", diag.msg);
		goto out;
	}
	logits = malloc(sizeof(float) * (size_t)cw_model_config(m)->vocab_size);
	for (int run = 0; run < runs; run++) {
		int32_t ids[4096];
		uint32_t seq;
		uint64_t t0;

		for (int i = 0; i < n_prompt; i++)
			ids[i] = (int32_t)(1000 + 37 * i + run);
		kv_client_seq_create(kv, &seq, &diag);
		r = cw_model_eval(m, seq, 0, ids, n_prompt, NULL, logits, &diag);
		if (r < 0)
			break;
		cw_model_read_stats(m, &before);
		t0 = st_now_ns();
		for (int t = 0; t < n_tokens && r == 0; t++) {
			int32_t tok = cw_argmax(logits, cw_model_config(m)->vocab_size);

			r = cw_model_eval(m, seq, (uint32_t)(n_prompt + t), &tok,
					  1, NULL, logits, &diag);
		}
		decode_ns_total += st_now_ns() - t0;
		decoded += (uint64_t)n_tokens;
		tps[run] = n_tokens / ((double)(st_now_ns() - t0) / 1e9);
		cw_model_read_stats(m, &after);
		kv_client_seq_free(kv, seq);
		printf("run %d: %.2f tokens/s\n", run, tps[run]);
	}
	if (r < 0) {
		fprintf(stderr, "bench: %s\n", diag.msg);
		goto out;
	}
	{
		double exp_b = (double)(after.expert_bytes - before.expert_bytes) / n_tokens;
		double den_b = (double)(after.dense_bytes - before.dense_bytes) / n_tokens;
		double lm_b = (double)(after.lm_head_bytes - before.lm_head_bytes) / n_tokens;
		double tot = exp_b + den_b + lm_b;
		double med;
		struct es_stats s;

		qsort(tps, (size_t)runs, sizeof(double), cmp_d);
		med = tps[runs / 2];
		printf("\ndecode: %.2f tokens/s (median of %d runs of %d tokens, "
		       "%d thread(s), reference mode)\n", med, runs, n_tokens, mo.n_threads);
		printf("bytes read per token: %.1f MB total = experts %.1f MB "
		       "(%.0f%%) + dense %.1f MB (%.0f%%) + LM head %.1f MB (%.0f%%)\n",
		       tot / 1e6, exp_b / 1e6, 100 * exp_b / tot, den_b / 1e6,
		       100 * den_b / tot, lm_b / 1e6, 100 * lm_b / tot);
		printf("achieved bytes/s: experts %.2f GB/s, dense %.2f GB/s, "
		       "LM head %.2f GB/s\n", exp_b * med / 1e9,
		       den_b * med / 1e9, lm_b * med / 1e9);
		printf("achieved: %.2f GB/s = %.0f%% of 1-thread read bandwidth "
		       "(%.1f GB/s), %.0f%% of 2-thread (%.1f GB/s)\n",
		       tot * med / 1e9, 100 * tot * med / 1e9 / bw1, bw1,
		       100 * tot * med / 1e9 / bw2, bw2);
		if (es_client_stats(es, &s) == 0)
			printf("expert pool: %llu slots, hits %llu, misses %llu, "
			       "evictions %llu\n", (unsigned long long)s.n_slots,
			       (unsigned long long)s.hits,
			       (unsigned long long)s.misses,
			       (unsigned long long)s.evictions);
	}
	free(logits);
out:
	cw_model_close(m);
	kv_client_close(kv);
	es_client_close(es);
	cli_instance_down(&inst);
	st_rm_rf(inst.run_dir);
	return r < 0 ? 1 : 0;
}
