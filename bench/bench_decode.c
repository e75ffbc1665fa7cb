/*
 * bench_decode.c — prompt and decode speed on a generated model, the bytes
 * of weights read per decoded token, and this machine's memory read
 * bandwidth measured in the same run with the same thread count.
 *
 * Converts the checkpoint if needed (MXFP4 experts), starts expertd and kvd
 * on a private instance, runs the model in this process (the same code as
 * computed) for every compute mode and thread count asked for, and prints
 * per configuration (medians of the runs):
 *   prompt tokens/s (one batch of --prompt-tokens), decode tokens/s
 *   (--tokens greedy steps), bytes of weights read per decoded token split
 *   into experts / other dense weights / LM head (counted by the model from
 *   the routing actually taken), achieved GB/s, the read bandwidth of a
 *   vectorized read-only sum over >= 1 GiB with the same number of pinned
 *   threads (st_membw, best of 5 passes, measured at the start and again
 *   before each configuration; the best figure is used), the ratio, and the
 *   time per token spent acquiring experts from expertd.
 * Also per CPU-second of the process (load-independent on a shared
 * machine): prompt and decode tokens; with --batch N, N sequences decoding
 * together (cw_model_eval_batch, one token of each per step, as the
 * serving scheduler runs them): aggregate tokens/s and tokens per
 * CPU-second, and the gain over one sequence.
 * Prints figures, asserts nothing (STYLE.md: benchmarks never assert time).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cw_cuda_experts.h"
#include "cw_devpool.h"
#include "st_cuda.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "es_convert.h"
#include "st_daemon.h"
#include "st_membw.h"
#include "st_build_config.h"
#include "st_util.h"

#define MAX_RUNS 16
#define MAX_CONF 8

/* CPU time of the whole process in ns (every thread; time the scheduler
 * gave it, so a loaded machine does not inflate it). */
static uint64_t proc_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_d);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata-bench-decode --model DIR [--store DIR] [--experts FMT]\n"
"          [--compute reference|fast|both] [--threads LIST]\n"
"          [--prompt-tokens N] [--tokens N] [--runs N] [--host-budget B]\n"
"          [--membw-bytes B] [--dense bf16|fp8] [--batch N]\n"
"          [--device-budget LIST]\n"
"\n"
"Prompt and decode speed against this machine's read bandwidth.\n"
"  --experts FMT       expert format of the store made when --store is\n"
"                      absent (default mxfp4)\n"
"  --dense fp8         that store with attention and LM head in FP8\n"
"                      (convert --dense fp8; default bf16)\n"
"  --compute MODE      reference, fast or both (default both)\n"
"  --threads LIST      thread counts, e.g. 1,2 (default 1,2)\n"
"  --prompt-tokens N   prompt length, one batch (default 128)\n"
"  --tokens N          decoded tokens per run (default 64)\n"
"  --runs N            runs per configuration, median printed (default 3)\n"
"  --membw-bytes B     bandwidth probe buffer (default 1GiB)\n"
"  --batch N           also decode N sequences together (continuous\n"
"                      batching, cw_model_eval_batch); default off\n"
"  --device-budget LIST  CUDA builds: one configuration per device expert\n"
"                      budget, e.g. 100%%,25%% (routed experts on the GPU\n"
"                      from device slots expertd fills; reference mode,\n"
"                      first thread count); default: CPU only\n"
"Make the large model with: scripts/gen-moe-model.py --out\n"
"bench-models/qwen3moe-large (see docs/BENCHMARKS.md).\n");
}

struct conf_result {
	enum cw_compute mode;
	int threads;
	double prompt_tps, decode_tps, bw;
	double decode_cpu_tps;  /* tokens per CPU-second of the process */
	double prompt_cpu_tps;
	double batch_tps, batch_cpu_tps; /* --batch: aggregate decode */
	double exp_b, den_b, lm_b, stall_ms;
};

/* Batched decode: n_seq sequences with 8-token prompts, then n_tokens
 * steps of one greedy token of each through cw_model_eval_batch; the
 * aggregate tokens/s and tokens per CPU-second into res. */
static int run_batch(struct cw_model *m, struct kv_client *kv, int n_seq,
		     int n_tokens, struct conf_result *res, struct st_diag *diag)
{
	const int vocab = cw_model_config(m)->vocab_size;
	struct cw_batch_tok *toks = calloc((size_t)n_seq, sizeof(*toks));
	float *lg = malloc(sizeof(float) * (size_t)vocab * (size_t)n_seq);
	int32_t ids[8];
	uint64_t t0, c0;
	int r = 0, made = 0;

	if (!toks || !lg) {
		r = st_diag_set(diag, -ENOMEM, "out of memory for --batch %d",
				n_seq);
		goto out;
	}
	for (int i = 0; i < n_seq && r == 0; i++) {
		for (int k = 0; k < 8; k++)
			ids[k] = (int32_t)((2000 + 53 * k + 7907 * i) % vocab);
		r = kv_client_seq_create(kv, &toks[i].seq, diag);
		if (r < 0)
			break;
		made++;
		r = cw_model_eval(m, toks[i].seq, 0, ids, 8, NULL,
				  lg + (size_t)i * vocab, diag);
		toks[i].pos = 8;
		toks[i].logits = lg + (size_t)i * vocab;
	}
	c0 = proc_cpu_ns();
	t0 = st_now_ns();
	for (int t = 0; t < n_tokens && r == 0; t++) {
		for (int i = 0; i < n_seq; i++)
			toks[i].id = cw_argmax(toks[i].logits, vocab);
		r = cw_model_eval_batch(m, toks, n_seq, diag);
		for (int i = 0; i < n_seq; i++)
			toks[i].pos++;
	}
	res->batch_tps = (double)n_seq * n_tokens /
			 ((double)(st_now_ns() - t0) / 1e9);
	res->batch_cpu_tps = (double)n_seq * n_tokens /
			     ((double)(proc_cpu_ns() - c0) / 1e9);
out:
	for (int i = 0; i < made; i++)
		kv_client_seq_free(kv, toks[i].seq);
	free(toks);
	free(lg);
	return r;
}

/* Runs one configuration: `runs` times a fresh sequence, a prompt batch,
 * then n_tokens greedy steps; then, with batch > 1, run_batch. */
/* The GPU expert path for one device budget (NULL: none). */
struct dev_conf {
	struct cw_devpool *dev;
	struct cw_cuda_module_handle mod;
	struct cw_cuda_experts *cx;
};

static int dev_conf_open(struct cli_instance *inst, struct es_client *es,
			 struct cw_model *m, const char *budget,
			 struct dev_conf *dc, struct st_diag *diag)
{
	const struct st_model_config *c = cw_model_config(m);
	struct cw_devpool_geom g = {
		(uint32_t)es_client_n_layers(es),
		(uint32_t)es_client_n_experts(es),
		(uint32_t)es_client_top_k(es), es_client_record_bytes(es), 0 };
	struct cw_devpool_opts o = { budget, "0", inst->run_dir, inst->name,
				     60000 };
	int r = cw_devpool_open(&dc->dev, &g, &o, diag);

	if (r == 0 && st_cuda_is_fake()) {
		/* STRATA_CUDA_FAKE=1: the protocol without a GPU, experts
		 * from device slots on the CPU (a dry run of this bench) */
		cw_model_set_expert_fn(m, cw_devpool_fake_fn,
				       cw_devpool_fake_sync, dc->dev);
		return 0;
	}
	if (r == 0)
		r = cw_cuda_module_open(&dc->mod, diag);
	if (r == 0)
		r = dc->mod.ops->create(&dc->cx, dc->dev, &dc->mod.pool,
					c->hidden_size, c->expert_inter, diag);
	if (r == 0)
		cw_model_set_expert_fn(m, dc->mod.ops->fn,
				       dc->mod.ops->sync, dc->cx);
	return r;
}

static void dev_conf_close(struct cw_model *m, struct dev_conf *dc)
{
	if (dc->dev) {
		struct cw_devpool_stats ds;

		cw_devpool_stats(dc->dev, &ds);
		printf("  device slots: %u; pins %llu, misses %llu\n",
		       ds.n_slots, (unsigned long long)ds.pins,
		       (unsigned long long)ds.misses);
	}
	if (dc->cx) {
		uint64_t nd = 0, nc = 0;

		dc->mod.ops->counts(dc->cx, &nd, &nc);
		printf("  routed experts computed on the device %llu times, on "
		       "the CPU %llu times\n", (unsigned long long)nd,
		       (unsigned long long)nc);
		dc->mod.ops->destroy(dc->cx);
	}
	if (m)
		cw_model_set_expert_fn(m, NULL, NULL, NULL);
	cw_cuda_module_close(&dc->mod);
	cw_devpool_close(dc->dev, 5000);
	memset(dc, 0, sizeof(*dc));
}

static int run_conf(struct cli_instance *inst, struct es_client *es,
		    struct kv_client *kv, struct cw_model_opts *mo, int runs,
		    int n_prompt, int n_tokens, int batch,
		    const char *device_budget,
		    struct conf_result *res, struct st_diag *diag)
{
	struct dev_conf dc = { 0 };
	double ptps[MAX_RUNS], dtps[MAX_RUNS], ctps[MAX_RUNS], pctps[MAX_RUNS];
	struct cw_read_stats before, after;
	uint64_t exp_b = 0, den_b = 0, lm_b = 0, stall = 0, decoded = 0;
	struct cw_model *m = NULL;
	float *logits = NULL;
	int32_t *ids = NULL;
	int r;

	r = cw_model_open(inst->store_dir, es, kv, mo, &m, diag);
	if (r < 0)
		return r;
	if (device_budget) {
		r = dev_conf_open(inst, es, m, device_budget, &dc, diag);
		if (r < 0)
			goto out;
	}
	logits = malloc(sizeof(float) * (size_t)cw_model_config(m)->vocab_size);
	ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
	if (!logits || !ids) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	for (int run = 0; run < runs && r == 0; run++) {
		const int vocab = cw_model_config(m)->vocab_size;
		uint32_t seq;
		uint64_t t0, c0;

		for (int i = 0; i < n_prompt; i++)
			ids[i] = (int32_t)((1000 + 37 * i + 7919 * run) % vocab);
		r = kv_client_seq_create(kv, &seq, diag);
		if (r < 0)
			break;
		t0 = st_now_ns();
		c0 = proc_cpu_ns();
		r = cw_model_eval(m, seq, 0, ids, n_prompt, NULL, logits, diag);
		ptps[run] = n_prompt / ((double)(st_now_ns() - t0) / 1e9);
		pctps[run] = n_prompt / ((double)(proc_cpu_ns() - c0) / 1e9);
		cw_model_read_stats(m, &before);
		c0 = proc_cpu_ns();
		t0 = st_now_ns();
		for (int t = 0; t < n_tokens && r == 0; t++) {
			int32_t tok = cw_argmax(logits, vocab);

			r = cw_model_eval(m, seq, (uint32_t)(n_prompt + t), &tok,
					  1, NULL, logits, diag);
		}
		dtps[run] = n_tokens / ((double)(st_now_ns() - t0) / 1e9);
		ctps[run] = n_tokens / ((double)(proc_cpu_ns() - c0) / 1e9);
		cw_model_read_stats(m, &after);
		exp_b += after.expert_bytes - before.expert_bytes;
		den_b += after.dense_bytes - before.dense_bytes;
		lm_b += after.lm_head_bytes - before.lm_head_bytes;
		stall += after.expert_stall_ns - before.expert_stall_ns;
		decoded += (uint64_t)n_tokens;
		kv_client_seq_free(kv, seq);
		printf("  run %d: prompt %.1f tokens/s, decode %.2f tokens/s\n",
		       run, ptps[run], dtps[run]);
		fflush(stdout);
	}
	if (r == 0) {
		res->prompt_tps = median(ptps, runs);
		res->decode_tps = median(dtps, runs);
		res->decode_cpu_tps = median(ctps, runs);
		res->prompt_cpu_tps = median(pctps, runs);
		res->exp_b = (double)exp_b / (double)decoded;
		res->den_b = (double)den_b / (double)decoded;
		res->lm_b = (double)lm_b / (double)decoded;
		res->stall_ms = (double)stall / (double)decoded / 1e6;
	}
	if (r == 0 && batch > 1)
		r = run_batch(m, kv, batch, n_tokens, res, diag);
out:
	if (device_budget)
		dev_conf_close(m, &dc);
	free(ids);
	free(logits);
	cw_model_close(m);
	return r;
}

/* Parses "1,2" into up to max thread counts; the count or -1. */
static int parse_threads(const char *s, int *ret, int max)
{
	int n = 0;

	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);

		if (end == s || v < 1 || v > 256)
			return -1;
		ret[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
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
		{ "compute", required_argument, NULL, 'c' },
		{ "dense", required_argument, NULL, 'd' },
		{ "batch", required_argument, NULL, 'B' },
		{ "device-budget", required_argument, NULL, 'D' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *model = NULL, *experts = "mxfp4", *compute = "both";
	int n_tokens = 64, n_prompt = 128, runs = 3, c, r = 0, dense_fp8 = 0;
	int batch = 0;
	int threads[MAX_CONF] = { 1, 2 }, n_threads = 2, n_res = 0;
	uint64_t membw_bytes = 1ull << 30;
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct es_client *es = NULL;
	struct kv_client *kv = NULL;
	struct conf_result res[2 * MAX_CONF];
	double bw[MAX_CONF];
	enum cw_compute modes[2];
	int n_modes;
	const char *device_budgets = NULL; /* --device-budget LIST */

	memset(&inst, 0, sizeof(inst));
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 's': snprintf(inst.store_dir, sizeof(inst.store_dir), "%s", optarg); break;
		case 'n': n_tokens = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'r': runs = atoi(optarg); break;
		case 'B': batch = atoi(optarg); break;
		case 'D': device_budgets = optarg; break;
		case 'b': snprintf(inst.host_budget, sizeof(inst.host_budget), "%s", optarg); break;
		case 'e': experts = optarg; break;
		case 'w':
			if (st_parse_size(optarg, &membw_bytes) < 0) {
				fprintf(stderr, "bench: bad --membw-bytes '%s'\n", optarg);
				return 2;
			}
			break;
		case 't':
			n_threads = parse_threads(optarg, threads, MAX_CONF);
			if (n_threads < 1) {
				fprintf(stderr, "bench: --threads wants a list "
					"like 1,2 (1..256 each)\n");
				return 2;
			}
			break;
		case 'c': compute = optarg; break;
		case 'd':
			if (strcmp(optarg, "fp8") && strcmp(optarg, "bf16")) {
				fprintf(stderr, "bench: --dense fp8|bf16\n");
				return 2;
			}
			dense_fp8 = !strcmp(optarg, "fp8");
			break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!strcmp(compute, "both")) {
		modes[0] = CW_COMPUTE_REFERENCE;
		modes[1] = CW_COMPUTE_FAST;
		n_modes = 2;
	} else if (cw_compute_parse(compute, &modes[0]) == 0) {
		n_modes = 1;
	} else {
		fprintf(stderr, "bench: --compute must be reference, fast or both\n");
		return 2;
	}
	if (!model || n_tokens < 2 || n_prompt < 1 || n_prompt > 4096 ||
	    runs < 1 || runs > MAX_RUNS || batch < 0 || batch > 256) {
		usage(stderr);
		return 2;
	}
	if (!inst.store_dir[0]) {
		char name[300];

		snprintf(name, sizeof(name), "%s%s", experts,
			 dense_fp8 ? "-dense-fp8" : "");
		cli_default_store_dir(model, name, inst.store_dir,
				      sizeof(inst.store_dir));
	}
	if (!st_path_exists(inst.store_dir) &&
	    cli_convert(model, inst.store_dir, experts,
			dense_fp8 ? CLI_DENSE_FP8 : CLI_DENSE_AUTO, 0, -1))
		return 1;

	printf("memory read bandwidth (st_membw %s kernel, %llu MiB, pinned "
	       "threads, best of 5 passes):\n",
	       st_membw_kernel_name(st_membw_kernel_best()),
	       (unsigned long long)(membw_bytes >> 20));
	for (int i = 0; i < n_threads; i++) {
		r = st_membw_measure(threads[i], membw_bytes, 5, &bw[i]);
		if (r < 0) {
			fprintf(stderr, "bench: bandwidth probe: %s\n", st_strerror(r));
			return 1;
		}
		printf("  %d thread(s): %.1f GB/s\n", threads[i], bw[i]);
	}
	fflush(stdout);

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
	for (int mi = 0; !r && mi < n_modes; mi++)
		for (int ti = 0; !r && ti < n_threads; ti++) {
			struct cw_model_opts mo = { ST_DTYPE_F32, 16, threads[ti],
						    modes[mi], 0 };
			struct conf_result *cr = &res[n_res];

			/* the bandwidth again right before this
			 * configuration (a shared machine's load moves):
			 * the better of the two probes */
			double bw_now = 0;

			if (st_membw_measure(threads[ti], membw_bytes, 5,
					     &bw_now) == 0 && bw_now > bw[ti])
				bw[ti] = bw_now;
			printf("%s mode, %d thread(s) (read bandwidth now %.1f "
			       "GB/s):\n", cw_compute_name(modes[mi]),
			       threads[ti], bw_now);
			cr->mode = modes[mi];
			cr->threads = threads[ti];
			cr->bw = bw[ti];
			r = run_conf(&inst, es, kv, &mo, runs, n_prompt, n_tokens, batch,
				     NULL, cr, &diag);
			if (!r)
				n_res++;
		}
	/* the GPU tier: one configuration per device budget */
	if (!r && device_budgets) {
		char list[256], *save = NULL;

		snprintf(list, sizeof(list), "%s", device_budgets);
		for (char *b = strtok_r(list, ",", &save); b && !r;
		     b = strtok_r(NULL, ",", &save)) {
			struct cw_model_opts mo = { ST_DTYPE_F32, 16,
						    threads[0],
						    CW_COMPUTE_REFERENCE, 0 };
			struct conf_result dr = { 0 };

			printf("device budget %s (routed experts on the GPU "
			       "from device slots):\n", b);
			r = run_conf(&inst, es, kv, &mo, runs, n_prompt,
				     n_tokens, 0, b, &dr, &diag);
			if (!r)
				printf("device budget %s: prompt %.1f tokens/s, "
				       "decode %.2f tokens/s, expert stall "
				       "%.3f ms/token\n", b, dr.prompt_tps,
				       dr.decode_tps, dr.stall_ms);
		}
	}
	if (r < 0) {
		fprintf(stderr, "bench: %s\n", diag.msg);
		goto out;
	}
	printf("\nstore %s (experts %s, dense %s); prompt %d tokens in one batch, "
	       "decode %d tokens; medians of %d runs\n", inst.store_dir, experts,
	       dense_fp8 ? "FP8 attention and LM head" : "as converted", n_prompt, n_tokens, runs);
	for (int i = 0; i < n_res; i++) {
		const struct conf_result *cr = &res[i];
		const double tot = cr->exp_b + cr->den_b + cr->lm_b;
		const double gbs = tot * cr->decode_tps / 1e9;

		printf("\n%s mode, %d thread(s):\n", cw_compute_name(cr->mode),
		       cr->threads);
		printf("  prompt: %.1f tokens/s\n", cr->prompt_tps);
		if (cr->threads == 1)
			printf("  prompt per CPU-second of this process: %.1f "
			       "tokens\n", cr->prompt_cpu_tps);
		printf("  decode: %.2f tokens/s\n", cr->decode_tps);
		if (cr->threads == 1)
			printf("  decode per CPU-second of this process: %.2f "
			       "tokens (%.2f GB/s): what one core gives when the "
			       "machine is not shared\n", cr->decode_cpu_tps,
			       (cr->exp_b + cr->den_b + cr->lm_b) *
			       cr->decode_cpu_tps / 1e9);
		printf("  weights read per decoded token: %.1f MB = experts "
		       "%.1f MB (%.0f%%) + other dense %.1f MB (%.0f%%) + LM head "
		       "%.1f MB (%.0f%%)\n", tot / 1e6, cr->exp_b / 1e6,
		       100 * cr->exp_b / tot, cr->den_b / 1e6,
		       100 * cr->den_b / tot, cr->lm_b / 1e6, 100 * cr->lm_b / tot);
		printf("  achieved: %.2f GB/s = %.0f%% of the measured read "
		       "bandwidth with %d thread(s) (%.1f GB/s)\n", gbs,
		       100 * gbs / cr->bw, cr->threads, cr->bw);
		printf("  expert acquire (expertd round trips): %.2f ms per "
		       "token of %.2f ms\n", cr->stall_ms, 1e3 / cr->decode_tps);
		if (batch > 1)
			printf("  batched decode, %d sequences (one token each "
			       "per step): %.2f tokens/s = %.2fx one sequence; "
			       "%.2f tokens per CPU-second = %.2fx\n", batch,
			       cr->batch_tps, cr->batch_tps / cr->decode_tps,
			       cr->batch_cpu_tps,
			       cr->batch_cpu_tps / cr->decode_cpu_tps);
	}
	printf("\n| mode | threads | prompt tok/s | decode tok/s | MB/token "
	       "(experts + dense + LM head) | achieved GB/s | read bandwidth "
	       "GB/s | ratio |\n|---|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < n_res; i++) {
		const struct conf_result *cr = &res[i];
		const double tot = cr->exp_b + cr->den_b + cr->lm_b;
		const double gbs = tot * cr->decode_tps / 1e9;

		printf("| %s | %d | %.1f | %.2f | %.1f (%.1f + %.1f + %.1f) | "
		       "%.2f | %.1f | %.0f %% |\n", cw_compute_name(cr->mode),
		       cr->threads, cr->prompt_tps, cr->decode_tps, tot / 1e6,
		       cr->exp_b / 1e6, cr->den_b / 1e6, cr->lm_b / 1e6, gbs,
		       cr->bw, 100 * gbs / cr->bw);
	}
	{
		struct es_stats s;

		if (es_client_stats(es, &s) == 0)
			printf("\nexpert pool: %llu slots, hits %llu, misses %llu, "
			       "evictions %llu\n", (unsigned long long)s.n_slots,
			       (unsigned long long)s.hits,
			       (unsigned long long)s.misses,
			       (unsigned long long)s.evictions);
	}
out:
	kv_client_close(kv);
	es_client_close(es);
	cli_instance_down(&inst);
	st_rm_rf(inst.run_dir);
	return r < 0 ? 1 : 0;
}
