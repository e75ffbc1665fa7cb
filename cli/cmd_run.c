/*
 * cmd_run.c — `strata run`: the main job end to end.  Converts the model
 * when it has no store yet, starts expertd, kvd and computed on a private
 * instance (or uses a running one), streams the generated text to stdout,
 * prints the metrics summary (TTFT, TPOT, tokens/s, peak RSS per daemon,
 * expert pool hits/misses/evictions, KV pages) and stops what it started.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cli_device.h"
#include "cli_memory.h"
#include "cli_session.h"
#include "cw_client.h"
#include "cw_gen.h"
#include "st_daemon.h"
#include "st_ioq.h"
#include "st_util.h"

struct run_opts {
	const char *model, *store, *prompt, *prompt_file, *experts;
	int force;                /* --force: --store may hold another model */
	const char *instance, *run_dir;
	const char *host_budget, *kv_budget, *kv_spill, *kv_dtype;
	const char *memory_budget;
	const char *kv_remote;
	const char *compute;
	const char *device_budget, *device_kv_budget;
	int max_tokens;
	float temperature, top_p;
	int top_k;
	uint64_t seed;
	int n_stop;
	const char *stop[CW_PROTO_MAX_NSTOP];
	int raw, ignore_eos, keep, json, quiet, no_prefix_cache, kv_private;
	const char *keep_spec, *scale_search;
	char experts_spec[512];
	int timeout_s;
	struct cli_tier_args tier;
	const char *timeline;     /* --timeline FILE, or NULL */
	int draft_max;            /* --speculate / --draft-max; -1: computed's
				   * default */
	int draft_price;          /* --speculate auto[:K] */
	int draft_mtp;            /* --speculate mtp[:K] */
	char timeline_abs[4096];  /* its absolute path, for computed */
};

static void run_usage(FILE *f)
{
	fprintf(f,
"Usage: strata run [--model DIR | --store DIR] [--prompt TEXT] [options]\n"
"\n"
"Runs the main job: converts the model to a store if it has none, starts\n"
"expertd, kvd and computed on a private instance (or uses the running\n"
"instance named with --instance), streams the generated text to stdout,\n"
"prints a metrics summary to stderr and stops the daemons it started.\n"
"\n"
"Model:\n"
"  --model DIR          Hugging Face checkpoint (default: the embedded\n"
"                       models/kjv-moe)\n"
"  --store DIR          use (or create) this store instead of the cached one\n"
"  --force              with --model: replace a --store that holds another\n"
"                       model (refused without it)\n"
"  --experts FMT        expert format when converting: mxfp4 (default),\n"
"                       nvfp4, e2m1-g32, e2m1-g128, fp8, bf16, f32\n"
"  --keep-layers SPEC   layers kept at another format, e.g. first,last=bf16\n"
"  --scale-search M     none (default), mse, calibrated or gptq, as strata\n"
"                       convert --scale-search (see strata convert --help)\n"
"Generation:\n"
"  --prompt TEXT        prompt (default: 'In the beginning')\n"
"  --prompt-file FILE   read the prompt from a file ('-' = stdin)\n"
"  --max-tokens N       new tokens at most (default 64)\n"
"  --temperature T      0 = greedy (default 0)\n"
"  --top-k K            sample from the K most likely tokens (0 = off)\n"
"  --top-p P            nucleus sampling (1 = off)\n"
"  --seed N             random seed for sampling (default 0)\n"
"  --stop TEXT          stop string (repeatable, up to %d)\n"
"  --ignore-eos         do not stop at the model's EOS ids\n"
"  --raw                no BOS, and special tokens in the prompt are text\n"
"  --no-prefix-cache    compute the whole prompt even when kvd holds pages\n"
"                       of the same prefix (the output is the same)\n"
"  --speculate S        speculative decoding: off, ngram or ngram:K (up to\n"
"                       K prompt-lookup draft tokens verified per step,\n"
"                       1..16; ngram = ngram:4); greedy output unchanged;\n"
"                       default: computed's (off);\n"
"                       auto or auto:K: the length (0..K) priced in step\n"
"                       time and expert bytes, off where drafts do not pay;\n"
"                       mtp or mtp:K: drafts from the model's MTP block\n"
"                       (a DeepSeek-V4 store converted with its mtp.0.*)\n"
"  --draft-max K        the same as --speculate ngram:K (0 = off)\n"
"Budgets and modes:\n"
"  --host-budget B      expertd host pool: bytes (8GiB) or percent of all\n"
"                       experts (25%%); default: all experts\n"
"  --kv-budget B        kvd page pool in bytes (default: kvd's)\n"
"  --memory-budget B    one host budget in bytes (24GiB; not a share) shared\n"
"                       by the expert pool and the KV pages, moved between\n"
"                       them by measured value; --host-budget and\n"
"                       --kv-budget, when given, are then each side's floor;\n"
"                       the summary shows the split and its moves\n"
"  --kv-spill-budget B  let kvd spill idle KV pages to a file of this size\n"
"  --kv-remote URL      share prefix-cache pages through a Redis,\n"
"                       redis://HOST:PORT/DB (kvd --remote-kv)\n"
"  --kv-private         a private prompt: its pages are never published to\n"
"                       the remote tier (kvd --remote-kv-share-private 0)\n"
"  --kv-dtype T         f32 (reference mode, default), f16, bf16, fp8\n"
CLI_TIER_HELP
"  --compute MODE       reference (exact, default) or fast (int8\n"
"                       activations for FP4 experts, SIMD, FMA)\n"
"GPU (CUDA builds with a device; without one these are refused):\n"
"  --device-budget B    computed's device expert slots: a share of all\n"
"                       experts (25%%) or bytes (40GiB); default: all\n"
"                       experts within 80%% of free device memory when a\n"
"                       device is present, else the CPU; 0 = the CPU\n"
"  --device-kv-budget B computed's device KV page pool in bytes (default\n"
"                       256MiB, 0 = none)\n"
"Instance:\n"
"  --instance NAME      use this running instance, or start it under this\n"
"                       name (default: a private one, run-<pid>)\n"
"  --run-dir DIR        run directory of the instance\n"
"  --keep               leave the daemons running afterwards\n"
"  --timeout SEC        start-up and per-step time limit (default 120)\n"
"Output:\n"
"  --json               print the summary as JSON on stdout after the text\n"
"  --quiet              no summary\n"
"  --timeline FILE      the step timeline: one TSV row per forward step\n"
"                       (wall time split into dense, experts, head, expert\n"
"                       waits, round trips; page faults; expertd's loader\n"
"                       CPU), written by computed; draw it with\n"
"                       gnuplot -e \"tl='FILE'\" scripts/plot-timeline.gp.\n"
"                       Only when strata run starts computed (a running\n"
"                       --instance keeps its options: computed --timeline)\n"
"  -h, --help           this text\n",
		CW_PROTO_MAX_NSTOP);
	fprintf(f, "\n%s", ST_IOQ_ENV_HELP);
}

/* --timeline FILE: computed writes it (its own working directory may
 * differ), so it gets the absolute path. */
static int timeline_arg(struct run_opts *o)
{
	const char *f = o->timeline;
	char cwd[2048];

	if (f[0] == '/')
		snprintf(o->timeline_abs, sizeof(o->timeline_abs), "%s", f);
	else if (getcwd(cwd, sizeof(cwd)))
		snprintf(o->timeline_abs, sizeof(o->timeline_abs), "%s/%s",
			 cwd, f);
	else
		return -1;
	if (o->tier.n_cw + 2 > CLI_MAX_EXTRA_ARGS) {
		fprintf(stderr, "strata run: too many computed options\n");
		return -1;
	}
	o->tier.cw[o->tier.n_cw++] = "--timeline";
	o->tier.cw[o->tier.n_cw++] = o->timeline_abs;
	/* never report an older run's file as this one's (a running
	 * instance keeps its computed's options and writes none) */
	if (unlink(o->timeline_abs) < 0 && errno != ENOENT) {
		fprintf(stderr, "strata run: --timeline %s: %s\n", f,
			strerror(errno));
		return -1;
	}
	return 0;
}

/* After the run: where the timeline is and how many steps it holds. */
static void timeline_note(const struct run_opts *o)
{
	FILE *f = fopen(o->timeline_abs, "re");
	char line[1024];
	int n = -1;

	if (!f) {
		fprintf(stderr, "strata run: no step timeline in %s: %s (see "
			"computed's log)\n", o->timeline_abs, strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f))
		n += strchr(line, '\n') != NULL;
	fclose(f);
	fprintf(stderr, "strata run: step timeline of %d steps in %s (draw: "
		"gnuplot -e \"tl='%s'\" scripts/plot-timeline.gp)\n", n,
		o->timeline, o->timeline);
}

static int parse(struct run_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "store", required_argument, NULL, 's' },
		{ "force", no_argument, NULL, 'F' },
		{ "experts", required_argument, NULL, 'e' },
		{ "prompt", required_argument, NULL, 'p' },
		{ "prompt-file", required_argument, NULL, 'P' },
		{ "max-tokens", required_argument, NULL, 'n' },
		{ "temperature", required_argument, NULL, 't' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "top-p", required_argument, NULL, 'q' },
		{ "seed", required_argument, NULL, 'S' },
		{ "stop", required_argument, NULL, 'x' },
		{ "ignore-eos", no_argument, NULL, 'E' },
		{ "no-prefix-cache", no_argument, NULL, 'N' },
		{ "speculate", required_argument, NULL, 0x501 },
		{ "draft-max", required_argument, NULL, 0x502 },
		{ "keep-layers", required_argument, NULL, 'L' },
		{ "scale-search", required_argument, NULL, 'Z' },
		{ "raw", no_argument, NULL, 'R' },
		{ "host-budget", required_argument, NULL, 'b' },
		{ "kv-budget", required_argument, NULL, 'B' },
		{ "memory-budget", required_argument, NULL, 0x100 + 'M' },
		{ "kv-spill-budget", required_argument, NULL, 'O' },
		{ "kv-remote", required_argument, NULL, 0x100 + 'r' },
		{ "kv-private", no_argument, NULL, 0x100 + 'p' },
		{ "kv-dtype", required_argument, NULL, 'K' },
		{ "compute", required_argument, NULL, 'C' },
		{ "device-budget", required_argument, NULL, 'D' },
		{ "device-kv-budget", required_argument, NULL, 'V' },
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "keep", no_argument, NULL, 'z' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "json", no_argument, NULL, 'j' },
		{ "quiet", no_argument, NULL, 'Q' },
		{ "timeline", required_argument, NULL, 'W' },
		CLI_TIER_LONGOPTS,
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	char *end;
	int c;

	memset(o, 0, sizeof(*o));
	o->experts = "mxfp4";
	o->prompt = "In the beginning";
	o->max_tokens = 64;
	o->draft_max = -1;
	o->top_p = 1.0f;
	o->timeout_s = 120;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 's': o->store = optarg; break;
		case 'F': o->force = 1; break;
		case 'e': o->experts = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'P': o->prompt_file = optarg; break;
		case 'n': {
			/* the GEN_START message carries at most 2^24 (the
			 * context cuts it further, with a warning) */
			long v;

			errno = 0;
			v = strtol(optarg, &end, 10);
			if (end == optarg || *end || errno || v < 0 ||
			    v > (1L << 24)) {
				fprintf(stderr, "strata run: --max-tokens wants "
					"a number from 0 to %ld (the model's "
					"context cuts it further)\n", 1L << 24);
				return 2;
			}
			o->max_tokens = (int)v;
			break;
		}
		case 't':
			o->temperature = strtof(optarg, &end);
			if (*end || !(o->temperature >= 0) || o->temperature > 100) {
				fprintf(stderr, "strata run: --temperature "
					"wants 0..100\n");
				return 2;
			}
			break;
		case 'k':
			o->top_k = (int)strtol(optarg, &end, 10);
			if (*end || o->top_k < 0) {
				fprintf(stderr, "strata run: --top-k wants a "
					"number >= 0\n");
				return 2;
			}
			break;
		case 'q':
			o->top_p = strtof(optarg, &end);
			if (*end || !(o->top_p > 0) || o->top_p > 1) {
				fprintf(stderr, "strata run: --top-p wants "
					"(0, 1]\n");
				return 2;
			}
			break;
		case 'S':
			errno = 0;
			o->seed = strtoull(optarg, &end, 10);
			if (end == optarg || *end || errno || optarg[0] == '-') {
				fprintf(stderr, "strata run: --seed wants a "
					"number from 0 to 2^64-1\n");
				return 2;
			}
			break;
		case 'x':
			if (o->n_stop == CW_PROTO_MAX_NSTOP || !*optarg) {
				fprintf(stderr, "strata run: at most %d "
					"non-empty --stop strings\n",
					CW_PROTO_MAX_NSTOP);
				return 2;
			}
			o->stop[o->n_stop++] = optarg;
			break;
		case 'E': o->ignore_eos = 1; break;
		case 'N': o->no_prefix_cache = 1; break;
		case 0x501: /* after cli_tiers.h's CLI_OPT_* */
			if (cw_draft_parse_src(optarg, &o->draft_max,
					       &o->draft_price,
					       &o->draft_mtp) < 0) {
				fprintf(stderr, "strata run: --speculate '%s': "
					"use off, ngram, ngram:K, auto, "
					"auto:K, mtp or mtp:K (K 1..%d)\n",
					optarg, CW_DRAFT_MAX);
				return 2;
			}
			break;
		case 0x502: {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (*end || end == optarg || v < 0 ||
			    v > CW_DRAFT_MAX) {
				fprintf(stderr, "strata run: --draft-max '%s': "
					"use 0..%d\n", optarg, CW_DRAFT_MAX);
				return 2;
			}
			o->draft_max = (int)v;
			o->draft_price = 0;
			o->draft_mtp = 0;
			break;
		}
		case 'L': o->keep_spec = optarg; break;
		case 'Z': o->scale_search = optarg; break;
		case 'R': o->raw = 1; break;
		case 'b': o->host_budget = optarg; break;
		case 'B': o->kv_budget = optarg; break;
		case 0x100 + 'M': o->memory_budget = optarg; break;
		case 'O': o->kv_spill = optarg; break;
		case 0x100 + 'r': o->kv_remote = optarg; break;
		case 0x100 + 'p': o->kv_private = 1; break;
		case 'K': o->kv_dtype = optarg; break;
		case 'C': o->compute = optarg; break;
		case 'D': o->device_budget = optarg; break;
		case 'V': o->device_kv_budget = optarg; break;
		case 'i': o->instance = optarg; break;
		case 'r': o->run_dir = optarg; break;
		case 'z': o->keep = 1; break;
		case 'T': o->timeout_s = atoi(optarg) > 0 ? atoi(optarg) : 120; break;
		case 'j': o->json = 1; break;
		case 'Q': o->quiet = 1; break;
		case 'W': o->timeline = optarg; break;
		case 'h': run_usage(stdout); exit(0);
		case CLI_OPT_EVICT ... CLI_OPT_ENGRAM_CACHE:
			if (cli_tier_opt(&o->tier, c, optarg) < 0)
				return 2;
			break;
		default: run_usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "strata run: unexpected argument '%s' (see "
			"--help)\n", argv[optind]);
		return 2;
	}
	if (cli_experts_spec(o->experts_spec, sizeof(o->experts_spec),
			     o->experts, o->keep_spec, o->scale_search) < 0)
		return 2;
	o->experts = o->experts_spec;
	if (o->compute && strcmp(o->compute, "reference") &&
	    strcmp(o->compute, "fast")) {
		fprintf(stderr, "strata run: --compute '%s': use reference or "
			"fast\n", o->compute);
		return 2;
	}
	if (cli_check_device(o->device_budget, o->device_kv_budget,
			     "strata run") ||
	    cli_check_memory(o->memory_budget, o->host_budget, o->kv_budget,
			     "strata run", NULL))
		return 2;
	if (o->timeline && timeline_arg(o) < 0)
		return 2;
	return cli_check_common(o->instance, o->host_budget, o->kv_budget,
				o->kv_dtype, o->experts, "strata run") ? 2 : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static const char *finish_name(uint32_t f)
{
	switch (f) {
	case CW_FINISH_EOS: return "eos";
	case CW_FINISH_LENGTH: return "max tokens";
	case CW_FINISH_STOP: return "stop string";
	case CW_FINISH_CONTEXT: return "context full";
	case CW_FINISH_ERROR: return "error";
	default: return "none";
	}
}

struct run_result {
	uint32_t n_prompt, n_gen, finish, max_tokens;
	uint64_t ttft_ns, decode_ns, tpot_median_ns;
	int32_t *ids;
	char *text;
	size_t text_len;
	int interrupted, computed_died;
	int store_damaged;    /* the failure's remedy is strata convert */
	const char *died;     /* the daemon that died (NULL: none) */
	int died_pid;
};

/* What the CLI watches while it waits for computed: a stop signal, or the
 * death of one of the instance's daemons.  Nothing restarts a daemon of
 * strata run's instance, so computed's wait for a lost expertd or kvd
 * (--restart-wait) would only delay the failure. */
struct run_watch {
	int sigfd;
	int pids[3];          /* expertd, kvd, computed */
	struct run_result *res;
};

static int run_watch_fn(void *arg)
{
	static const char *const names[3] = { "expertd", "kvd", "computed" };
	struct run_watch *w = arg;

	if (w->sigfd >= 0 && st_stop_signals_pending(w->sigfd)) {
		w->res->interrupted = 1;
		return -EINTR;
	}
	for (int i = 0; i < 3; i++)
		if (w->pids[i] > 0 && !st_pid_alive(w->pids[i])) {
			w->res->died = names[i];
			w->res->died_pid = w->pids[i];
			w->res->computed_died = i == 2;
			return -ST_E_PEERGONE;
		}
	return 0;
}

static int generate(struct cw_client *cw, const struct run_opts *o,
		    const char *prompt, struct run_result *res)
{
	struct cw_gen_start_msg m = { 0 };
	struct st_diag diag = { "" };
	uint64_t *steps = NULL, t0;
	uint32_t gen_id;
	int r;

	m.max_tokens = (uint32_t)o->max_tokens;
	m.temperature = o->temperature;
	m.top_k = o->top_k;
	m.top_p = o->top_p;
	m.seed = o->seed;
	m.flags = o->raw ? 0 : (CW_GEN_F_ADD_SPECIAL | CW_GEN_F_PARSE_SPECIAL);
	if (o->ignore_eos)
		m.flags |= CW_GEN_F_IGNORE_EOS;
	if (o->no_prefix_cache)
		m.flags |= CW_GEN_F_NO_PREFIX_CACHE;
	if (o->draft_max >= 0)
		m.flags |= (uint32_t)(o->draft_max + 1) << CW_GEN_F_DRAFT_SHIFT;
	if (o->draft_max > 0 && o->draft_price)
		m.flags |= CW_GEN_F_DRAFT_PRICE;
	if (o->draft_max > 0 && o->draft_mtp)
		m.flags |= CW_GEN_F_DRAFT_MTP;
	if (o->kv_private)
		m.flags |= CW_GEN_F_KV_PRIVATE;
	m.n_stop = (uint32_t)o->n_stop;
	for (int i = 0; i < o->n_stop; i++)
		m.stop[i] = (char *)o->stop[i];
	m.prompt = (char *)prompt;
	t0 = st_now_ns();
	r = cw_client_gen_start(cw, &m, &gen_id, &res->n_prompt,
				&res->max_tokens, &diag);
	if (r < 0) {
		fprintf(stderr, "strata run: %s\n", diag.msg);
		return r;
	}
	if ((int)res->max_tokens < o->max_tokens)
		fprintf(stderr, "strata run: warning: the model's context leaves "
			"room for %u new tokens after the %u-token prompt "
			"(--max-tokens %d)\n", res->max_tokens, res->n_prompt,
			o->max_tokens);
	steps = calloc((size_t)res->max_tokens + 1, sizeof(uint64_t));
	res->ids = calloc((size_t)res->max_tokens + 1, sizeof(int32_t));
	if (!steps || !res->ids) {
		free(steps);
		return -ENOMEM;
	}
	for (;;) {
		uint64_t ts = st_now_ns();
		int32_t tok;
		uint32_t fin;
		char *text;
		size_t tl;

		r = cw_client_gen_next(cw, gen_id, &tok, &fin, &text, &diag);
		if (r < 0)
			break;
		if (tok >= 0 && res->n_gen <= res->max_tokens) {
			if (res->n_gen == 0)
				res->ttft_ns = st_now_ns() - t0;
			else
				steps[res->n_gen - 1] = st_now_ns() - ts;
			res->ids[res->n_gen++] = tok;
		}
		tl = strlen(text);
		if (tl) {
			char *nt = realloc(res->text, res->text_len + tl + 1);

			if (nt) {
				memcpy(nt + res->text_len, text, tl + 1);
				res->text = nt;
				res->text_len += tl;
			}
			fwrite(text, 1, tl, stdout);
			fflush(stdout);
		}
		free(text);
		if (fin != CW_FINISH_NONE || tok < 0) {
			res->finish = fin;
			break;
		}
	}
	fputc('\n', stdout);
	fflush(stdout);
	if (r < 0) {
		if (res->interrupted)
			fprintf(stderr, "strata run: interrupted\n");
		else if (!res->died) {
			fprintf(stderr, "strata run: generation failed: %s\n",
				diag.msg);
			res->store_damaged =
				strstr(diag.msg, "strata convert") != NULL;
		}
	}
	if (!res->computed_died)
		cw_client_gen_end(cw, gen_id);
	if (res->n_gen > 1) {
		for (uint32_t i = 0; i + 1 < res->n_gen; i++)
			res->decode_ns += steps[i];
		qsort(steps, res->n_gen - 1, sizeof(uint64_t), cmp_u64);
		res->tpot_median_ns = steps[(res->n_gen - 1) / 2];
	}
	free(steps);
	return r;
}

/* The name of computed's DeepSeek math (CW_STATS_MATH_*; NULL: not a
 * DeepSeek-V4/V4.1 store). */
static const char *math_name(uint64_t m)
{
	return m == CW_STATS_MATH_OFFICIAL ? "official" :
	       m == CW_STATS_MATH_EXACT ? "exact" :
	       m == CW_STATS_MATH_CUSTOM ? "custom" : NULL;
}

/* Rounds to 3 decimals for the JSON summary. */
static double r3(double v)
{
	return round(v * 1000.0) / 1000.0;
}

/* Tokens per decode step of a run (1 + accepted drafts per step; the
 * prefill's sample not counted); 0 without decode steps. */
/* Expert bytes per token of decode steps (0 without tokens). */
static double spec_bytes_per_token(uint64_t bytes, uint64_t tokens)
{
	return tokens ? (double)bytes / (double)tokens : 0.0;
}

/* Decode steps that verified no draft (one token each). */
static uint64_t spec_plain_steps(const struct cw_stats_wire *d)
{
	return d->spec_steps - d->spec_verify_steps;
}

/* The mean draft limit chosen per decode step. */
static double spec_limit_mean(const struct cw_stats_wire *d)
{
	return d->spec_steps ? (double)d->spec_limit_sum /
				       (double)d->spec_steps : 0.0;
}

static double spec_tokens_per_step(const struct cw_stats_wire *d)
{
	return d->spec_steps ? 1.0 + (double)d->spec_accepted /
					     (double)d->spec_steps : 0.0;
}

/* The instance's shared memory budget at the end of the run (st_ledger.h;
 * malloc'd, the caller frees), or NULL when it shares none. */
static struct st_ledger_view *run_memory(const struct cli_instance *inst)
{
	struct st_ledger_view *v = malloc(sizeof(*v));
	struct st_diag diag = { "" };
	int r;

	if (!v)
		return NULL;
	r = st_ledger_read(inst->name, v, &diag);
	if (r < 0 && r != -ENOENT)
		fprintf(stderr, "strata run: the shared budget's ledger cannot "
			"be read: %s\n", diag.msg);
	if (r < 0) {
		free(v);
		return NULL;
	}
	return v;
}

static void print_summary(const struct run_opts *o,
			  const struct cli_instance *inst,
			  const struct run_result *res,
			  const struct cw_stats_wire *s0,
			  const struct cw_stats_wire *s1, int have_stats,
			  const struct st_ledger_view *mem)
{
	struct cw_stats_wire d = *s1; /* this run's share of the counters */
	uint64_t rss_es = st_pid_peak_rss_bytes(s1->es_pid ? s1->es_pid : inst->pid_expertd);
	uint64_t rss_kv = st_pid_peak_rss_bytes(s1->kv_pid ? s1->kv_pid : inst->pid_kvd);
	uint64_t rss_cw = st_pid_peak_rss_bytes(s1->pid ? s1->pid : inst->pid_computed);
	double ttft_ms = (double)res->ttft_ns / 1e6;
	double tpot_ms = res->n_gen > 1 ?
				 (double)res->decode_ns / 1e6 / (res->n_gen - 1) : 0;
	double tps = res->decode_ns ?
			     (double)(res->n_gen - 1) / ((double)res->decode_ns / 1e9) : 0;
	double hit;
	char a[32], b[32], c[32];
	struct cli_tier_figures tf;

	cli_tier_figures(s0, s1, &tf);

	d.es_hits -= s0->es_hits;
	d.es_misses -= s0->es_misses;
	d.es_evictions -= s0->es_evictions;
	d.es_loads -= s0->es_loads;
	d.expert_bytes -= s0->expert_bytes;
	d.dense_bytes -= s0->dense_bytes;
	d.lm_head_bytes -= s0->lm_head_bytes;
	d.kv_prefix_lookups -= s0->kv_prefix_lookups;
	d.kv_prefix_rows_reused -= s0->kv_prefix_rows_reused;
	d.kv_spill_pages_total -= s0->kv_spill_pages_total;
	d.kv_remote_hits -= s0->kv_remote_hits;
	d.kv_remote_misses -= s0->kv_remote_misses;
	d.kv_remote_bytes_in -= s0->kv_remote_bytes_in;
	d.kv_remote_bytes_out -= s0->kv_remote_bytes_out;
	d.kv_remote_errors -= s0->kv_remote_errors;
	d.kv_restore_pages_total -= s0->kv_restore_pages_total;
	d.en_lookups -= s0->en_lookups;
	d.en_hits -= s0->en_hits;
	d.en_misses -= s0->en_misses;
	d.en_read_bytes -= s0->en_read_bytes;
	d.spec_steps -= s0->spec_steps;
	d.spec_verify_steps -= s0->spec_verify_steps;
	d.spec_drafted -= s0->spec_drafted;
	d.spec_accepted -= s0->spec_accepted;
	d.spec_bytes_verify -= s0->spec_bytes_verify;
	d.spec_bytes_plain -= s0->spec_bytes_plain;
	d.spec_tokens_verify -= s0->spec_tokens_verify;
	d.spec_limit_sum -= s0->spec_limit_sum;
	d.spec_limit_off -= s0->spec_limit_off;
	/* the I/O queue's totals never go down (st_ioq.h), but a segment
	 * made again (every daemon of it stopped meanwhile) starts over:
	 * clamped, not wrapped */
#define IO_DELTA(f) d.f = s1->f >= s0->f ? s1->f - s0->f : s1->f
	IO_DELTA(io_bytes_demand);
	IO_DELTA(io_bytes_kv_restore);
	IO_DELTA(io_bytes_prefetch);
	IO_DELTA(io_bytes_kv_spill);
	IO_DELTA(io_wait_demand_ns);
	IO_DELTA(io_wait_kv_restore_ns);
	IO_DELTA(io_wait_prefetch_ns);
	IO_DELTA(io_wait_kv_spill_ns);
#undef IO_DELTA
	hit = d.es_hits + d.es_misses ?
		      (double)d.es_hits / (double)(d.es_hits + d.es_misses) : 0;
	if (o->json) {
		json_t *j = json_pack(
			"{s:i, s:i, s:s, s:f, s:f, s:f, s:f, s:{s:I, s:I, s:I},"
			" s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I},"
			" s:{s:I, s:I, s:I, s:I}, s:I, s:I, s:I}",
			"prompt_tokens", (int)res->n_prompt,
			"generated_tokens", (int)res->n_gen,
			"finish", finish_name(res->finish),
			"ttft_ms", r3(ttft_ms), "tpot_ms", r3(tpot_ms),
			"tpot_median_ms", r3((double)res->tpot_median_ns / 1e6),
			"decode_tokens_per_s", r3(tps),
			"peak_rss_bytes", "expertd", (json_int_t)rss_es, "kvd",
			(json_int_t)rss_kv, "computed", (json_int_t)rss_cw,
			"expert_pool", "hits", (json_int_t)d.es_hits, "misses",
			(json_int_t)d.es_misses, "evictions",
			(json_int_t)d.es_evictions, "loads",
			(json_int_t)d.es_loads, "slots", (json_int_t)d.es_n_slots,
			"pool_bytes", (json_int_t)d.es_pool_bytes,
			"budget_bytes", (json_int_t)d.es_budget_bytes,
			"kv", "pages_used", (json_int_t)d.kv_pages_used,
			"pages_peak", (json_int_t)d.kv_pages_peak, "pages",
			(json_int_t)d.kv_n_pages, "page_bytes",
			(json_int_t)d.kv_page_bytes,
			"expert_bytes_read", (json_int_t)d.expert_bytes,
			"dense_bytes_read", (json_int_t)d.dense_bytes,
			"lm_head_bytes_read", (json_int_t)d.lm_head_bytes);
		json_t *ids = json_array();

		for (uint32_t i = 0; i < res->n_gen; i++)
			json_array_append_new(ids, json_integer(res->ids[i]));
		json_object_set_new(j, "ids", ids);
		json_object_set_new(j, "text", json_stringn(res->text ? res->text : "",
							    res->text_len));
		json_object_set_new(j, "instance", json_string(inst->name));
		/* DeepSeek-V4/V4.1: which math computed ran (issue 28) */
		if (math_name(d.dsv_math))
			json_object_set_new(j, "math",
					    json_string(math_name(d.dsv_math)));
		cli_tier_json(j, &tf);
		if (d.io_on)
			json_object_set_new(j, "io", cli_io_json(&d));
		if (mem)
			json_object_set_new(j, "memory",
					    cli_memory_json(mem, st_now_ns()));
		json_object_set_new(j, "prefix_rows_reused",
				    json_integer((json_int_t)d.kv_prefix_rows_reused));
		json_object_set_new(j, "kv_pages_spilled",
				    json_integer((json_int_t)d.kv_spill_pages_total));
		json_object_set_new(j, "kv_pages_restored",
				    json_integer((json_int_t)d.kv_restore_pages_total));
		if (d.kv_remote_on)
			json_object_set_new(j, "kv_remote", json_pack(
				"{s:I, s:I, s:I, s:I, s:I}",
				"hits", (json_int_t)d.kv_remote_hits,
				"misses", (json_int_t)d.kv_remote_misses,
				"bytes_in", (json_int_t)d.kv_remote_bytes_in,
				"bytes_out", (json_int_t)d.kv_remote_bytes_out,
				"errors", (json_int_t)d.kv_remote_errors));
		/* rows: the layout's bytes per token; pages: kvd pages at the
		 * peak per token of this run (0 when the instance was not
		 * ours: its peak is not this run's) */
		json_object_set_new(j, "kv_bytes_per_token", json_pack(
			"{s:I, s:I}", "rows", (json_int_t)d.kv_bytes_per_token,
			"pages", (json_int_t)(inst->started_by_us &&
					      res->n_prompt + res->n_gen ?
				d.kv_pages_peak * d.kv_page_bytes /
					(res->n_prompt + res->n_gen) : 0)));
		/* speculative decoding (issue 22): expert bytes per
		 * generated token include the prompt's (prefill) reads */
		json_object_set_new(j, "speculation", json_pack(
			"{s:i, s:b, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, "
			"s:f, s:I}",
			"draft_max", o->draft_max,
			"priced", o->draft_price,
			"decode_steps", (json_int_t)d.spec_steps,
			"verify_steps", (json_int_t)d.spec_verify_steps,
			"draft_tokens", (json_int_t)d.spec_drafted,
			"accepted_tokens", (json_int_t)d.spec_accepted,
			"tokens_per_step", r3(spec_tokens_per_step(&d)),
			"expert_bytes_per_token", r3(res->n_gen ?
				(double)d.expert_bytes / res->n_gen : 0.0),
			"expert_bytes_per_token_verify",
			r3(spec_bytes_per_token(d.spec_bytes_verify,
						d.spec_tokens_verify)),
			"expert_bytes_per_token_plain",
			r3(spec_bytes_per_token(d.spec_bytes_plain,
						spec_plain_steps(&d))),
			"draft_limit_mean", r3(spec_limit_mean(&d)),
			"off_steps", (json_int_t)d.spec_limit_off));
		if (d.en_lookups)
			json_object_set_new(j, "engram", json_pack(
				"{s:I, s:I, s:I, s:f, s:I, s:f, s:f}",
				"lookups", (json_int_t)d.en_lookups,
				"hits", (json_int_t)d.en_hits,
				"misses", (json_int_t)d.en_misses,
				"hit_rate", r3((double)d.en_hits /
					       (double)d.en_lookups),
				"read_bytes", (json_int_t)d.en_read_bytes,
				"read_p50_us", r3((double)d.en_lat_p50_ns / 1e3),
				"read_p99_us", r3((double)d.en_lat_p99_ns / 1e3)));
		json_dumpf(j, stdout, JSON_COMPACT | JSON_REAL_PRECISION(10));
		printf("\n");
		json_decref(j);
	}
	if (o->quiet)
		return;
	fprintf(stderr, "\n--- strata run summary ---\n");
	fprintf(stderr, "prompt tokens      %u\n", res->n_prompt);
	fprintf(stderr, "generated tokens   %u (stopped: %s)\n", res->n_gen,
		finish_name(res->finish));
	fprintf(stderr, "TTFT               %.1f ms (prompt of %u tokens)\n",
		ttft_ms, res->n_prompt);
	fprintf(stderr, "TPOT               %.2f ms mean, %.2f ms median\n",
		tpot_ms, (double)res->tpot_median_ns / 1e6);
	fprintf(stderr, "decode tokens/s    %.1f\n", tps);
	fprintf(stderr, "peak RSS           expertd %s, kvd %s, computed %s\n",
		st_format_bytes(rss_es, a, sizeof(a)),
		st_format_bytes(rss_kv, b, sizeof(b)),
		st_format_bytes(rss_cw, c, sizeof(c)));
	if (!have_stats)
		return;
	fprintf(stderr, "expert pool        hits %llu, misses %llu (hit rate "
		"%.1f%%), evictions %llu\n",
		(unsigned long long)d.es_hits, (unsigned long long)d.es_misses,
		100 * hit, (unsigned long long)d.es_evictions);
	fprintf(stderr, "                   %llu slots for a budget of %s "
		"(shm segment with tables: %s)\n",
		(unsigned long long)d.es_n_slots,
		st_format_bytes(d.es_budget_bytes, a, sizeof(a)),
		st_format_bytes(d.es_pool_bytes, b, sizeof(b)));
	if (mem && mem->side[ST_LEDGER_KV].unit) {
		/* under a shared budget the pool is made for all of it:
		 * kvd's share is what the pages may use */
		char kvp[160];

		cli_memory_kv_pages_text(mem, d.kv_pages_used, d.kv_n_pages,
					 kvp, sizeof(kvp));
		fprintf(stderr, "KV pages           %llu peak (%s each); in "
			"use now %s\n", (unsigned long long)d.kv_pages_peak,
			st_format_bytes(d.kv_page_bytes, a, sizeof(a)), kvp);
	} else {
		fprintf(stderr, "KV pages           %llu peak of %llu (%s "
			"each), %llu in use now\n",
			(unsigned long long)d.kv_pages_peak,
			(unsigned long long)d.kv_n_pages,
			st_format_bytes(d.kv_page_bytes, a, sizeof(a)),
			(unsigned long long)d.kv_pages_used);
	}
	if (d.kv_bytes_per_token && !d.kv_formula_bytes_per_token) {
		/* DeepSeek-V4 and V4.1 (it looks up Engram rows): the state
		 * in kvd pages; rows vs pages (every stream's page is
		 * page_rows x the widest row) */
		uint64_t toks = res->n_prompt + res->n_gen;

		fprintf(stderr, "KV bytes/token     ");
		if (inst->started_by_us && toks)
			fprintf(stderr, "%llu in kvd pages at the peak (%llu "
				"pages for %llu tokens), ",
				(unsigned long long)(d.kv_pages_peak *
						     d.kv_page_bytes / toks),
				(unsigned long long)d.kv_pages_peak,
				(unsigned long long)toks);
		if (d.en_lookups)
			fprintf(stderr, "%llu in the V4.1 storage formats "
				"(compressed rows and index keys; plus the "
				"window and open groups of each sequence)\n",
				(unsigned long long)d.kv_bytes_per_token);
		else
			fprintf(stderr, "%llu in the V4 rows (compressed and indexer "
				"rows, F32; plus the window and compressor state of "
				"each sequence)\n",
				(unsigned long long)d.kv_bytes_per_token);
	} else if (d.kv_bytes_per_token) {
		uint64_t toks = res->n_prompt + res->n_gen;

		/* the page peak is the instance's: per token only when this
		 * run had the instance (and its cache) to itself */
		if (inst->started_by_us && toks)
			fprintf(stderr, "KV bytes/token     %llu in pages at the "
				"peak (%llu pages for %llu tokens), ",
				(unsigned long long)(d.kv_pages_peak *
						     d.kv_page_bytes / toks),
				(unsigned long long)d.kv_pages_peak,
				(unsigned long long)toks);
		else
			fprintf(stderr, "KV bytes/token     ");
		fprintf(stderr, "%llu in rows (K and V of all layers%s); "
			"formula 2 x layers x kv_heads x head_dim x bytes = "
			"%llu\n", (unsigned long long)d.kv_bytes_per_token,
			d.kv_bytes_per_token != d.kv_formula_bytes_per_token ?
				", FP8 scales included" : "",
			(unsigned long long)d.kv_formula_bytes_per_token);
	}
	if (math_name(d.dsv_math))
		fprintf(stderr, "math               %s (DeepSeek-V4/V4.1: %s)\n",
			math_name(d.dsv_math),
			d.dsv_math == CW_STATS_MATH_EXACT ?
			"no quantization round trip, --exact-math" :
			d.dsv_math == CW_STATS_MATH_OFFICIAL ?
			"the official code's quantization round trips" :
			"a custom set of round trips");
	fprintf(stderr, "prefix cache       %llu prompt rows reused; KV pages "
		"spilled %llu, restored %llu\n",
		(unsigned long long)d.kv_prefix_rows_reused,
		(unsigned long long)d.kv_spill_pages_total,
		(unsigned long long)d.kv_restore_pages_total);
	if (d.kv_remote_on)
		fprintf(stderr, "remote KV tier     %llu page groups restored, "
			"%llu misses, %s in, %s out, %llu errors\n",
			(unsigned long long)d.kv_remote_hits,
			(unsigned long long)d.kv_remote_misses,
			st_format_bytes(d.kv_remote_bytes_in, a, sizeof(a)),
			st_format_bytes(d.kv_remote_bytes_out, b, sizeof(b)),
			(unsigned long long)d.kv_remote_errors);
	if (d.io_on)
		cli_io_print(stderr, &d);
	if (mem)
		cli_memory_print(stderr, "", mem, st_now_ns());
	fprintf(stderr, "weights read       experts %s, dense %s, LM head %s\n",
		st_format_bytes(d.expert_bytes, a, sizeof(a)),
		st_format_bytes(d.dense_bytes, b, sizeof(b)),
		st_format_bytes(d.lm_head_bytes, c, sizeof(c)));
	if (d.spec_verify_steps)
		fprintf(stderr, "speculation        %llu of %llu draft tokens "
			"accepted (%.1f%%) in %llu of %llu decode steps: %.2f "
			"tokens per step; expert bytes %s per generated token "
			"(prompt included)\n",
			(unsigned long long)d.spec_accepted,
			(unsigned long long)d.spec_drafted,
			100.0 * (double)d.spec_accepted /
				(double)(d.spec_drafted ? d.spec_drafted : 1),
			(unsigned long long)d.spec_verify_steps,
			(unsigned long long)d.spec_steps,
			spec_tokens_per_step(&d),
			st_format_bytes(res->n_gen ?
						d.expert_bytes / res->n_gen : 0,
					a, sizeof(a)));
	/* the price line when drafts were asked for (a plain run's steps
	 * all count as draft length 0) */
	if (d.spec_verify_steps || (o->draft_max > 0 && o->draft_price))
		fprintf(stderr, "speculation price  expert bytes per token: "
			"%s in steps with drafts, %s without; draft length "
			"chosen %.2f on average, off in %llu of %llu decode "
			"steps\n",
			st_format_bytes((uint64_t)spec_bytes_per_token(
						d.spec_bytes_verify,
						d.spec_tokens_verify),
					a, sizeof(a)),
			st_format_bytes((uint64_t)spec_bytes_per_token(
						d.spec_bytes_plain,
						spec_plain_steps(&d)),
					b, sizeof(b)),
			spec_limit_mean(&d),
			(unsigned long long)d.spec_limit_off,
			(unsigned long long)d.spec_steps);
	if (d.en_lookups) /* DeepSeek-V4.1: expertd's Engram tier */
		fprintf(stderr, "Engram rows        %llu lookups, hits %llu, "
			"misses %llu (hit rate %.1f%%), %s read, block read "
			"p50 %.1f us, p99 %.1f us (since expertd started)\n",
			(unsigned long long)d.en_lookups,
			(unsigned long long)d.en_hits,
			(unsigned long long)d.en_misses,
			100.0 * (double)d.en_hits / (double)d.en_lookups,
			st_format_bytes(d.en_read_bytes, a, sizeof(a)),
			(double)d.en_lat_p50_ns / 1e3,
			(double)d.en_lat_p99_ns / 1e3);
	cli_tier_print(stderr, &tf);
}

/* A prompt is text: a NUL byte (a binary file, UTF-16 text) would cut it
 * short without a word, so it is refused naming where it is.  txt NULL
 * (out of memory) is refused too.  Returns txt, or NULL (txt freed). */
static char *prompt_text(char *txt, size_t n, const char *path)
{
	const char *nul = txt ? memchr(txt, 0, n) : NULL;

	if (!txt) {
		fprintf(stderr, "strata run: out of memory reading the prompt\n");
		return NULL;
	}
	if (nul) {
		fprintf(stderr, "strata run: the prompt in %s has a NUL byte at "
			"offset %zu: a prompt must be text (UTF-8), not a binary "
			"or UTF-16 file\n", strcmp(path, "-") ? path :
			"standard input", (size_t)(nul - txt));
		free(txt);
		return NULL;
	}
	return txt;
}

static char *read_prompt(const char *path)
{
	char *txt = NULL;
	size_t n = 0, cap = 0;

	if (strcmp(path, "-")) {
		int r = st_read_file(path, &txt, &n);

		if (r < 0) {
			fprintf(stderr, "strata run: cannot read the prompt from "
				"%s: %s\n", path, st_strerror(r));
			return NULL;
		}
		return prompt_text(txt, n, path);
	}
	for (;;) {
		size_t got;

		if (n + 4096 + 1 > cap) {
			char *t = realloc(txt, cap = (n + 4096 + 1) * 2);

			if (!t) {
				free(txt);
				return prompt_text(NULL, 0, path);
			}
			txt = t;
		}
		got = fread(txt + n, 1, 4096, stdin);
		n += got;
		if (got < 4096)
			break;
	}
	txt[n] = 0;
	return prompt_text(txt, n, path);
}

int cli_cmd_run(int argc, char **argv)
{
	struct run_opts o;
	struct cli_instance inst;
	struct cw_client *cw = NULL;
	struct cw_stats_wire s0 = { 0 }, s1 = { 0 };
	struct run_result res = { 0 };
	struct run_watch watch;
	struct st_diag diag = { "" };
	char *prompt_buf = NULL;
	const char *prompt;
	int r, rc = 1, have_stats = 0, sigfd = -1;

	r = parse(&o, argc, argv);
	if (r)
		return r;
	memset(&inst, 0, sizeof(inst));
	if (o.prompt_file) {
		prompt_buf = read_prompt(o.prompt_file);
		if (!prompt_buf)
			return 1;
		prompt = prompt_buf;
	} else {
		prompt = o.prompt;
	}
	/* ^C and SIGTERM arrive on a signalfd checked while converting and
	 * between and during steps, so the daemons we started are always
	 * stopped; they run in their own process groups */
	sigfd = st_stop_signals_open();

	{
		struct cli_session_opts so = {
			.model = o.model, .store = o.store, .experts = o.experts,
			.force = o.force,
			.instance = o.instance, .run_dir = o.run_dir,
			.host_budget = o.host_budget, .kv_budget = o.kv_budget,
			.memory_budget = o.memory_budget,
			.kv_spill = o.kv_spill, .kv_remote = o.kv_remote,
			.kv_dtype = o.kv_dtype, .timeout_s = o.timeout_s,
			.compute = o.compute, .who = "strata run", .tier = &o.tier,
			.device_budget = o.device_budget,
			.device_kv_budget = o.device_kv_budget,
		};

		r = cli_session_start(&so, sigfd, &inst);
		if (r) {
			rc = r;
			goto stop;
		}
	}
	r = cw_client_open(inst.run_dir, o.timeout_s * 1000, &cw, &diag);
	if (r < 0) {
		fprintf(stderr, "strata run: %s\n", diag.msg);
		goto stop;
	}
	watch.sigfd = sigfd;
	watch.pids[0] = inst.pid_expertd;
	watch.pids[1] = inst.pid_kvd;
	watch.pids[2] = inst.pid_computed;
	watch.res = &res;
	cw_client_set_watch(cw, run_watch_fn, &watch);
	if (cw_client_stats(cw, &s0) == 0)
		have_stats = 1;
	if (!o.quiet)
		fprintf(stderr, "strata run: prompt: %s\n---\n", prompt);
	fflush(stderr);
	r = generate(cw, &o, prompt, &res);
	if (res.died && !res.computed_died && inst.pid_computed > 0)
		/* computed may be waiting (--restart-wait) for the dead
		 * daemon, deaf to SHUTDOWN: SIGTERM ends the wait at once */
		kill(inst.pid_computed, SIGTERM);
	if (res.died)
		fprintf(stderr, "strata run: %s (pid %d) died; its log is "
			"%s/%s.log (nothing restarts the daemons of strata "
			"run: run it again, or serve with strata up and "
			"strata restart)\n", res.died, res.died_pid,
			inst.run_dir, res.died);
	if (res.store_damaged)
		cli_cache_hint(&inst, "strata run", "strata convert");
	if (!res.died && !res.interrupted &&
	    cw_client_stats(cw, &s1) < 0)
		have_stats = 0;
	if (r == 0) {
		/* before the daemons stop: the last one closing the ledger
		 * removes it */
		struct st_ledger_view *mem = run_memory(&inst);

		print_summary(&o, &inst, &res, &s0, &s1, have_stats, mem);
		free(mem);
		rc = 0;
	} else if (res.interrupted) {
		rc = 130;
	}
stop:
	cw_client_close(cw);
	cli_session_stop(&inst, rc, o.keep, o.instance || o.run_dir,
			 "strata run");
	if (o.timeline && rc == 0 && !o.quiet)
		timeline_note(&o);
	if (sigfd >= 0) {
		if (rc != 0 && st_stop_signals_pending(sigfd))
			rc = 130;
		close(sigfd);
	}
	free(prompt_buf);
	free(res.ids);
	free(res.text);
	return rc;
}
