/* cmd_plan.c — `strata plan`: where a model's bytes go per tier for a
 * workload and budgets, whether it fits, and what to set (st_plan.h). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_memory.h"
#include "cw_dsv.h"
#include "cw_dsv_plan.h"
#include "cw_kvrow.h"
#include "st_iconf.h"
#include "st_ledger.h"
#include "st_plan.h"
#include "st_util.h"

/* Share of each memory a plan may use by default (vLLM's
 * gpu_memory_utilization default): the rest is the OS's and other
 * processes' headroom. */
#define PLAN_MEM_UTIL 0.9

static void plan_usage(FILE *f)
{
	fprintf(f,
"Usage: strata plan (--model DIR | --store DIR | --expert-params N ...)\n"
"                   [--config FILE] [--gpu B] [--ram B] [--batch N]\n"
"                   [--context N] [--kv-dtype f32|f16|bf16|fp8]\n"
"                   [--experts FMT] [--dense-format bf16|f16|f32|fp8]\n"
"                   [--hot-experts N] [--host-budget B] [--kv-budget B]\n"
"                   [--memory-budget B]\n"
"                   [--activations B] [--page-rows N] [--mem-util F]\n"
"                   [--json]\n"
"\n"
"Prints, per tier (T0 GPU when --gpu is given, T1 host RAM, T2 NVMe), the\n"
"dense weights, hot and warm experts, KV cache (the sum over the model's\n"
"KV streams: 2 x batch x tokens x layers x kv_heads x head_dim x bytes for\n"
"GQA, the latent row for MLA), activations and buffers; a verdict and\n"
"recommendations (hot experts per layer, KV budget, max batch x context).\n"
"For models strata runs, it also predicts each daemon's peak RSS (CPU\n"
"build), which `strata run` reports.\n"
"\n"
"A model without a config.json is described by parameter counts:\n"
"  --expert-params N     all routed experts of all layers (100B, 1.5T, 7e9)\n"
"  --dense-params N      everything else (attention, embeddings, shared)\n"
"  --attention-params N  the attention part (default: --dense-params)\n"
"  --experts-count N --top-k K --layers L --kv-heads H --head-dim D\n"
"  [--hidden H]          (for the activation estimate; or --activations)\n"
"Sizes take KiB/MiB/GiB (powers of 1024) or kB/MB/GB (powers of 1000).\n"
"Defaults as strata run/up: --batch 1, --context 4096 (capped to the\n"
"model's max_position_embeddings), --kv-dtype f32, --experts mxfp4.\n"
"--memory-budget B (bytes, not a share): one host budget shared by the\n"
"expert pool and the KV pages (strata up --memory-budget); the plan shows\n"
"each side's floor (--host-budget / --kv-budget, else the least it runs\n"
"with) and cap, the starting split, and what each side holds at the\n"
"extremes (experts: %% of all experts; KV: tokens of context).\n"
"--config FILE reads an instance config (docs/strata.conf.example); flags\n"
"win over it.\n"
"--mem-util F (default 0.9, as vLLM's gpu_memory_utilization): the share\n"
"of --ram (default: the machine's memory) and --gpu the plan may use; the\n"
"rest is kept for the OS and other processes, and the output says how much.\n"
"\n"
"Example (a 100B-parameter MoE on a 48 GB GPU):\n"
"  strata plan --expert-params 100B --dense-params 10B --experts-count 64 \\\n"
"    --top-k 2 --layers 60 --kv-heads 16 --head-dim 128 --gpu 48GB \\\n"
"    --batch 4 --context 4096 --kv-dtype fp8 --experts e2m1-g128 \\\n"
"    --hot-experts 16 --activations 5GB\n");
}

/* "100B", "1.5T", "7e9", "350M" (decimal counts) into *ret. */
static int parse_count(const char *s, uint64_t *ret)
{
	char *end;
	double v = strtod(s, &end), mult = 1;

	if (end == s || v < 0)
		return -EINVAL;
	switch (*end) {
	case 0: break;
	case 'k': case 'K': mult = 1e3; end++; break;
	case 'm': case 'M': mult = 1e6; end++; break;
	case 'b': case 'B': case 'g': case 'G': mult = 1e9; end++; break;
	case 't': case 'T': mult = 1e12; end++; break;
	default: return -EINVAL;
	}
	if (*end)
		return -EINVAL;
	*ret = (uint64_t)(v * mult + 0.5);
	return 0;
}

static int bad(const char *opt, const char *v, const char *what)
{
	fprintf(stderr, "strata plan: %s '%s': %s\n", opt, v, what);
	return 2;
}

/* A whole-number option (--batch 4, not "4k" read as 4): 0, or 2 with the
 * message. */
static int int_arg(const char *opt, const char *v, int *ret)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (end == v || *end || errno || x < INT_MIN || x > INT_MAX)
		return bad(opt, v, "not a whole number");
	*ret = (int)x;
	return 0;
}

static int dense_dtype(const char *s, enum st_dtype *ret)
{
	if (!strcmp(s, "bf16")) *ret = ST_DTYPE_BF16;
	else if (!strcmp(s, "f16")) *ret = ST_DTYPE_F16;
	else if (!strcmp(s, "f32")) *ret = ST_DTYPE_F32;
	else if (!strcmp(s, "fp8")) *ret = ST_DTYPE_F8_E4M3;
	else return -EINVAL;
	return 0;
}

/* Applies an instance config's knobs to the plan's options. */
static int apply_config(const struct st_iconf *c, struct st_plan_opts *o,
			const char **model)
{
	uint64_t v;
	double pct;
	const char *s;

	if (st_iconf_is_set(c, "model.store"))
		*model = st_iconf_get(c, "model.store");
	else if (st_iconf_is_set(c, "model.path"))
		*model = st_iconf_get(c, "model.path");
	o->batch = atoi(st_iconf_get(c, "plan.batch"));
	o->context = atoi(st_iconf_get(c, "plan.context"));
	cw_kvrow_parse_dtype(st_iconf_get(c, "kv.dtype"), &o->kv_dtype);
	st_wformat_parse(st_iconf_get(c, "experts.format"), &o->experts);
	dense_dtype(st_iconf_get(c, "formats.attention"), &o->dense_dtype);
	o->page_rows = (uint32_t)atoi(st_iconf_get(c, "kv.page_rows"));
	st_parse_size(st_iconf_get(c, "device.gpu_budget"), &o->gpu_bytes);
	if (st_iconf_is_set(c, "experts.host_budget"))
		st_parse_budget(st_iconf_get(c, "experts.host_budget"),
				&o->host_budget, &o->host_budget_pct);
	/* checked as strata up checks it (0 and shares refused) */
	if (st_iconf_is_set(c, "memory.budget") &&
	    cli_check_memory(st_iconf_get(c, "memory.budget"), NULL, NULL,
			     "strata plan", &o->memory_budget))
		return -EINVAL;
	if (st_iconf_is_set(c, "kv.budget") &&
	    st_parse_budget(st_iconf_get(c, "kv.budget"), &v, &pct) == 0 && v)
		o->kv_budget = v;
	s = st_iconf_get(c, "experts.hot_experts");
	if (strcmp(s, "auto"))
		o->hot_experts = atoi(s);
	return 0;
}

/* DeepSeek-V4: the KV streams exactly as the forward pass declares them
 * to kvd (cw_dsv_streams: window, pooled rows, index keys, compressor
 * states), and their bytes per token and per sequence. */
static void plan_dsv4_streams(const char *dir, struct st_plan_model *m,
			      const struct st_plan_opts *o)
{
	struct st_dsv_config c;
	int eb = o->kv_dtype == ST_DTYPE_F32 ? 4 :
		 o->kv_dtype == ST_DTYPE_F8_E4M3 ? 1 : 2;

	if (st_dsv_config_load(dir, ST_DSV_REV_V4, &c, NULL) < 0 ||
	    cw_dsv4_plan_streams(&c, m) < 0)
		return;
	fprintf(stderr, "strata plan: DeepSeek-V4 KV streams as declared to "
		"kvd: %.1f B per token (pooled rows and index keys) + %.0f B "
		"per sequence (window of %d rows, compressor states), %s rows\n",
		cw_dsv4_kv_bytes_per_token(&c, eb), cw_dsv4_fixed_bytes(&c, eb),
		c.sliding_window, eb == 4 ? "F32" : eb == 1 ? "FP8" : "16-bit");
}

/* DeepSeek-V4 / V4.1 (model_type deepseek_v4, deepseek_v41): their exact
 * stored sizes and KV streams (cw_dsv_plan.h) replace the generic
 * description; other models are left as they are. */
static int plan_dsv4(const char *model, struct st_plan_model *m,
		     struct st_diag *diag)
{
	struct st_plan_model v;
	char path[4200], *text = NULL;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/config.json", model);
	if (!st_path_exists(path))
		snprintf(path, sizeof(path), "%s", model);
	if (st_read_file(path, &text, &len) < 0)
		return 0; /* st_plan_model_load read it; nothing to add */
	r = cw_dsv_plan_model(text, path, &v, diag);
	free(text);
	if (r == -ST_E_UNSUPPORTED)
		return 0;
	if (r < 0)
		return r;
	v.dense_file_bytes = m->dense_file_bytes;
	*m = v;
	return 0;
}

/*
 * A --context beyond the model's max_position_embeddings: warned about
 * (as llama.cpp warns when n_ctx exceeds the training context) and capped
 * to it, since computed refuses a sequence that long (cw_sched): the KV
 * figures are for the tokens a sequence can reach.  A model without the
 * field (max_context 0) keeps the asked context.  The default context
 * (4096, not asked for: given = 0) is capped without a warning.
 */
static void cap_context(const struct st_plan_model *m, struct st_plan_opts *o,
			int given)
{
	if (m->max_context <= 0 || o->context <= m->max_context)
		return;
	if (given)
		fprintf(stderr, "strata plan: warning: --context %d is beyond "
			"the model's context of %d tokens "
			"(max_position_embeddings); no sequence gets that "
			"long, so KV is planned for %d tokens per sequence\n",
			o->context, m->max_context, m->max_context);
	o->context = m->max_context;
}

int cli_cmd_plan(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "store", required_argument, NULL, 's' },
		{ "config", required_argument, NULL, 'C' },
		{ "gpu", required_argument, NULL, 'g' },
		{ "ram", required_argument, NULL, 'R' },
		{ "batch", required_argument, NULL, 'b' },
		{ "context", required_argument, NULL, 'c' },
		{ "kv-dtype", required_argument, NULL, 'K' },
		{ "experts", required_argument, NULL, 'e' },
		{ "dense-format", required_argument, NULL, 'D' },
		{ "hot-experts", required_argument, NULL, 'H' },
		{ "host-budget", required_argument, NULL, 'B' },
		{ "kv-budget", required_argument, NULL, 'V' },
		{ "activations", required_argument, NULL, 'A' },
		{ "page-rows", required_argument, NULL, 'P' },
		{ "expert-params", required_argument, NULL, 1 },
		{ "dense-params", required_argument, NULL, 2 },
		{ "attention-params", required_argument, NULL, 3 },
		{ "experts-count", required_argument, NULL, 4 },
		{ "top-k", required_argument, NULL, 5 },
		{ "layers", required_argument, NULL, 6 },
		{ "kv-heads", required_argument, NULL, 7 },
		{ "head-dim", required_argument, NULL, 8 },
		{ "hidden", required_argument, NULL, 9 },
		{ "json", no_argument, NULL, 'j' },
		{ "mem-util", required_argument, NULL, 'U' },
		{ "memory-budget", required_argument, NULL, 'M' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct st_plan_opts o;
	struct st_plan_model m;
	struct st_plan_result r;
	struct st_diag diag = { "" };
	struct st_iconf *conf = NULL;
	const char *model = NULL, *config = NULL;
	uint64_t ep = 0, dp = 0, ap = 0, tmp;
	int n_exp = 0, top_k = 0, layers = 0, kvh = 0, hd = 0, hidden = 0;
	int json = 0, c, rc = 0, tmpi, ctx_given = 0;
	double mem_util = PLAN_MEM_UTIL;
	uint64_t ram_total = 0, gpu_total = 0;
	char *const *args = argv;

	st_plan_opts_default(&o);
	/* --config first, so flags win whatever their order */
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "--config"))
			config = argv[i + 1];
	if (config) {
		conf = malloc(sizeof(*conf));
		if (!conf)
			return 1;
		st_iconf_init(conf);
		if (st_iconf_load(conf, config, &diag) < 0) {
			fprintf(stderr, "strata plan: %s\n", diag.msg);
			free(conf);
			return 2;
		}
		if (apply_config(conf, &o, &model) < 0) {
			free(conf);
			return 2;
		}
		ctx_given = st_iconf_is_set(conf, "plan.context");
	}
	optind = 1;
	while ((c = getopt_long(argc, args, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': case 's': model = optarg; break;
		case 'C': break;
		case 'g':
			if (st_parse_size(optarg, &o.gpu_bytes) < 0)
				rc = bad("--gpu", optarg, "not a size (24GiB)");
			break;
		case 'R':
			if (st_parse_size(optarg, &o.ram_bytes) < 0)
				rc = bad("--ram", optarg, "not a size (64GiB)");
			break;
		case 'b': rc |= int_arg("--batch", optarg, &o.batch); break;
		case 'c':
			rc |= int_arg("--context", optarg, &o.context);
			ctx_given = 1;
			break;
		case 'K':
			if (cw_kvrow_parse_dtype(optarg, &o.kv_dtype) < 0)
				rc = bad("--kv-dtype", optarg,
					 "use f32, f16, bf16 or fp8");
			break;
		case 'e':
			if (st_wformat_parse(optarg, &o.experts) < 0)
				rc = bad("--experts", optarg, "not a weight "
					 "format (mxfp4, nvfp4, e2m1-g128, "
					 "fp8, bf16, f32)");
			break;
		case 'D':
			if (dense_dtype(optarg, &o.dense_dtype) < 0)
				rc = bad("--dense-format", optarg,
					 "use bf16, f16, f32 or fp8");
			break;
		case 'H': rc |= int_arg("--hot-experts", optarg, &o.hot_experts); break;
		case 'B':
			if (st_parse_budget(optarg, &o.host_budget,
					    &o.host_budget_pct) < 0 ||
			    o.host_budget_pct > 100)
				rc = bad("--host-budget", optarg, "give bytes "
					 "(8GiB) or a share of all experts "
					 "(25%)");
			break;
		case 'V':
			if (st_parse_size(optarg, &o.kv_budget) < 0)
				rc = bad("--kv-budget", optarg, "not a size");
			break;
		case 'M':
			/* strata up's and run's checks and messages */
			if (cli_check_memory(optarg, NULL, NULL, "strata plan",
					     &o.memory_budget))
				rc = 2;
			break;
		case 'A':
			if (st_parse_size(optarg, &o.activations) < 0)
				rc = bad("--activations", optarg, "not a size");
			break;
		case 'P':
			if (!(rc |= int_arg("--page-rows", optarg, &tmpi)))
				o.page_rows = tmpi < 0 ? 0 : (uint32_t)tmpi;
			break;
		case 1: case 2: case 3:
			if (parse_count(optarg, &tmp) < 0) {
				rc = bad(opts[c + 14].name, optarg,
					 "not a count (100B, 350M, 7e9)");
				break;
			}
			*(c == 1 ? &ep : c == 2 ? &dp : &ap) = tmp;
			break;
		case 4: rc |= int_arg(opts[c + 14].name, optarg, &n_exp); break;
		case 5: rc |= int_arg(opts[c + 14].name, optarg, &top_k); break;
		case 6: rc |= int_arg(opts[c + 14].name, optarg, &layers); break;
		case 7: rc |= int_arg(opts[c + 14].name, optarg, &kvh); break;
		case 8: rc |= int_arg(opts[c + 14].name, optarg, &hd); break;
		case 9: rc |= int_arg(opts[c + 14].name, optarg, &hidden); break;
		case 'j': json = 1; break;
		case 'U': {
			char *end;

			mem_util = strtod(optarg, &end);
			if (end == optarg || *end || !(mem_util > 0.0) ||
			    mem_util > 1.0)
				rc = bad("--mem-util", optarg,
					 "a share of memory above 0, at most 1 "
					 "(0.9)");
			break;
		}
		case 'h': plan_usage(stdout); free(conf); return 0;
		default: plan_usage(stderr); free(conf); return 2;
		}
	}
	if (!rc && optind < argc)
		rc = bad("argument", argv[optind], "unexpected (see --help)");
	if (!rc && o.page_rows < 1)
		rc = bad("--page-rows", "0", "must be 1..4096");
	if (!rc && (o.batch < 1 || o.context < 1)) {
		char v[24];

		snprintf(v, sizeof(v), "%d", o.batch < 1 ? o.batch : o.context);
		rc = bad(o.batch < 1 ? "--batch" : "--context", v,
			 "must be at least 1");
	}
	if (!rc && o.memory_budget &&
	    st_ledger_check_total(o.memory_budget, &diag) < 0) {
		fprintf(stderr, "strata plan: %s\n", diag.msg);
		rc = 2;
	}
	if (rc) {
		free(conf);
		return rc;
	}
	if (model) {
		rc = st_plan_model_load(model, &m, &diag);
		if (rc == 0)
			rc = plan_dsv4(model, &m, &diag);
		if (rc == 0)
			cap_context(&m, &o, ctx_given);
		if (rc == 0 && st_plan_measure_store(model, &m, &diag) < 0)
			fprintf(stderr, "strata plan: note: %s; per-daemon "
				"figures leave the store and tokenizer out\n",
				diag.msg);
		if (rc == 0)
			plan_dsv4_streams(model, &m, &o);
	}
	else if (layers)
		rc = st_plan_model_from_params(ep, dp, ap ? ap : dp, n_exp,
					       top_k, layers, kvh, hd, hidden,
					       &m, &diag);
	else {
		fprintf(stderr, "strata plan: give --model DIR, --store DIR or "
			"a parameter description (--layers ... ; see --help)\n");
		free(conf);
		return 2;
	}
	if (rc == 0)
		cap_context(&m, &o, ctx_given);
	/* headroom: the plan sizes to mem_util of each memory, never to
	 * the last byte the OS and other processes need too */
	ram_total = o.ram_bytes;
	if (!ram_total) {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

		ram_total = pages > 0 && psz > 0 ?
			    (uint64_t)pages * (uint64_t)psz : 0;
	}
	gpu_total = o.gpu_bytes;
	o.ram_bytes = (uint64_t)((double)ram_total * mem_util);
	o.gpu_bytes = (uint64_t)((double)gpu_total * mem_util);
	if (rc == 0)
		rc = st_plan_compute(&m, &o, &r, &diag);
	if (rc < 0) {
		fprintf(stderr, "strata plan: %s\n", diag.msg);
		free(conf);
		return 1;
	}
	if (json)
		st_plan_print_json(&m, &o, &r, stdout);
	else {
		printf("memory kept for the OS and other processes: %.0f %% "
		       "(--mem-util %.2f): %.2f of %.2f GB RAM%s",
		       100.0 * (1.0 - mem_util), mem_util,
		       (double)(ram_total - o.ram_bytes) / 1e9,
		       (double)ram_total / 1e9, gpu_total ? "," : "\n");
		if (gpu_total)
			printf(" %.2f of %.2f GB GPU\n",
			       (double)(gpu_total - o.gpu_bytes) / 1e9,
			       (double)gpu_total / 1e9);
		st_plan_print(&m, &o, &r, stdout);
		cw_dsv_plan_print_doc(&m, &o, &r, stdout);
	}
	free(conf);
	return r.fits ? 0 : 3;
}
