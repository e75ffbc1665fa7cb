/* cmd_instance.c — `strata up`, `down`, `status`, `restart`: the
 * launcher for a named instance, configured by flags and/or an instance
 * config file (st_iconf.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_cmds.h"
#include "cli_device.h"
#include "cli_instance.h"
#include "cli_memory.h"
#include "cli_registry.h"
#include "cli_superv.h"
#include "cw_client.h"
#include "st_daemon.h"
#include "st_iconf.h"
#include "st_ioq.h"
#include "st_numa.h"
#include "st_superv.h"
#include "st_util.h"

static void inst_usage(FILE *f, const char *cmd)
{
	int up = !strcmp(cmd, "up");

	fprintf(f,
"Usage: strata %s [--config FILE] [--instance NAME] [--run-dir DIR]%s\n"
"\n", cmd, up ?
	" (--model DIR | --store DIR)\n"
	"                 [--force] [--no-supervise] [--restart-limit N]\n"
	"                 [--experts FMT] [--keep-layers SPEC] [--scale-search S]\n"
	"                 [--expert-offload on|off] [--host-budget B]\n"
	"                 [--kv-budget B] [--memory-budget B]\n"
	"                 [--kv-spill-budget B] [--kv-dtype T]\n"
	"                 [--kv-restore-ahead on|off]\n"
	"                 [--kv-remote redis://HOST:PORT/DB]\n"
	"                 [--kv-session-dir DIR]\n"
	"                 [--numa auto|N|interleave|off] [--loader-threads N]\n"
	"                 [--max-seqs N] [--page-rows N] [--threads N]\n"
	"                 [--dense-format bf16|f32] [--compute reference|fast]\n"
	"                 [--http-port N] [--http-bind ADDR] [--max-running N]\n"
	"                 [--max-queued N] [--max-step-tokens N]\n"
	"                 [--speculate off|ngram|ngram:K|auto|auto:K|mtp|mtp:K]\n"
	"                 [--chat-template auto|chatml|mixtral|deepseek|none]\n"
	"                 [--model-name NAME] [--prefetch-depth D]\n"
	"                 [--metrics-auth] [--http-request-timeout SEC]\n"
	"                 [--http-idle-timeout SEC] [--http-max-client-conns N]\n"
	"                 [--device-budget B] [--exact-math]\n"
	"                 [--device-kv-budget B] [--timeout SEC] [--help-config]\n"
	"                 [expert-tier options: --evict, --hot-experts,\n"
	"                 --state-dir, --prefetch-depth, ... as for strata run]" :
	!strcmp(cmd, "restart") ? " DAEMON [--timeout SEC]" :
	!strcmp(cmd, "status") ? " [--json]" : "");
	if (up)
		fprintf(f, "Starts expertd, kvd and computed for the instance "
			"(converting the model first\nif it has no store) and "
			"returns once all three answer.  Logs go to\n"
			"<run-dir>/<daemon>.log.  --config FILE reads an "
			"instance config (INI; see\ndocs/strata.conf.example "
			"and --help-config); flags win over it.\n--numa "
			"(default auto) binds each daemon's threads to a NUMA "
			"node's cores and\nits shared memory to the node's "
			"memory (strata topo shows the choice).\n"
			"--http-port N serves the OpenAI-compatible HTTP API on "
			"127.0.0.1:N\n(API key: $STRATA_API_KEY, if set) "
			"under --model-name NAME (default: the --model\n"
			"directory's name) with --chat-template (default auto: "
			"from the store's\ntokenizer_config.json).\n"
			"A supervisor restarts a daemon that dies (back-off; at "
			"most --restart-limit N\ntimes in a row within 10 s of "
			"its start, default 5; --no-supervise: none) and\n"
			"answers a request computed dropped with 503 "
			"computed_restarting.\n--force: replace a --store that "
			"holds another model than --model.\n"
			"--device-budget (25%%, 40GiB; 0 = the CPU) and "
			"--device-kv-budget (bytes) size\ncomputed's device "
			"expert slots and KV pages (CUDA builds; refused "
			"without\nCUDA or a device; default: every expert "
			"within 80%% of free device memory\nwhen a device is "
			"present).\n--kv-restore-ahead on|off (default on): "
			"with a spill file, kvd restores the next\nstep's "
			"spilled KV pages while this step computes (off: each "
			"step waits for\nthem).\n--memory-budget B (bytes, "
			"e.g. 24GiB; not a share): one host budget\nshared by "
			"expertd's expert slots and kvd's KV pages, moved "
			"between them by\nmeasured value; --host-budget and "
			"--kv-budget, when given, are then each\nside's floor "
			"(strata status shows the split and its moves).\n\n%s",
			ST_IOQ_ENV_HELP);
	else if (!strcmp(cmd, "down"))
		fprintf(f, "Stops the instance's daemons (computed first), "
			"then removes its sockets,\npid files and shared-memory "
			"segments.  Segments of a live owner are never\n"
			"removed.  Logs stay in the run directory.\n");
	else if (!strcmp(cmd, "restart"))
		fprintf(f, "Stops one daemon (expertd, kvd or computed) of a "
			"running instance cleanly\nand starts it again with "
			"the options strata up gave it; its log is appended\n"
			"to.  The other daemons keep running.\n");
	else
		fprintf(f, "Says whether each daemon of the instance runs, "
			"prints computed's counters\nand where each shared-"
			"memory segment's pages are (NUMA node, move_pages);\n"
			"with --memory-budget, the split of the shared budget, "
			"its values and its\nlast moves.  --json: the same as "
			"one JSON object on stdout.\n");
	fprintf(f, "\nDefault instance: %s.  Default run dir: "
		"$STRATA_RUN_DIR, /run/strata/NAME (root)\nor "
		"$XDG_RUNTIME_DIR/strata/NAME.\n", ST_DEFAULT_INSTANCE);
}

/* Command-line flags of `up` and the config keys they set. */
static const struct {
	const char *flag, *key;
} k_flag_keys[] = {
	{ "instance", "instance.name" },       { "run-dir", "instance.run_dir" },
	{ "numa", "instance.numa" },           { "model", "model.path" },
	{ "store", "model.store" },            { "experts", "experts.format" },
	{ "keep-layers", "experts.keep_layers" },
	{ "scale-search", "experts.scale_search" },
	{ "expert-offload", "experts.offload" },
	{ "host-budget", "experts.host_budget" },
	{ "hot-experts", "experts.hot_experts" },
	{ "prefetch-depth", "experts.prefetch_depth" },
	{ "prefetch-distance", "experts.prefetch_depth" }, /* the old name */
	{ "loader-threads", "experts.loader_threads" },
	{ "dense-format", "formats.attention" },
	{ "kv-dtype", "kv.dtype" },            { "kv-budget", "kv.budget" },
	{ "memory-budget", "memory.budget" },
	{ "kv-spill-budget", "kv.spill_budget" },
	{ "kv-restore-ahead", "kv.restore_ahead" },
	{ "kv-remote", "kv.remote" },
	{ "kv-session-dir", "kv.session_dir" },
	{ "page-rows", "kv.page_rows" },       { "max-seqs", "kv.max_seqs" },
	{ "threads", "compute.threads" },      { "compute", "compute.mode" },
	{ "http-port", "serve.http_port" },    { "http-bind", "serve.http_bind" },
	{ "max-running", "serve.max_running" },
	{ "max-queued", "serve.max_queued" },
	{ "max-step-tokens", "serve.max_step_tokens" },
	{ "speculate", "serve.speculate" },
	{ "chat-template", "serve.chat_template" },
	{ "model-name", "serve.model_name" },
	{ "device-budget", "device.budget" },
	{ "device-kv-budget", "device.kv_budget" },
	{ "http-request-timeout", "serve.http_request_timeout" },
	{ "http-idle-timeout", "serve.http_idle_timeout" },
	{ "http-max-client-conns", "serve.http_max_client_conns" },
	{ "restart-limit", "supervisor.restart_limit" },
};

#define N_FLAGS (sizeof(k_flag_keys) / sizeof(k_flag_keys[0]))
/* getopt codes of those flags: FLAG_BASE + index, above the expert-tier
 * options' CLI_OPT_* codes (0x400...; with 1000 + index the 25th flag
 * onwards took the tier options' codes, so --evict set serve.max_queued) */
#define FLAG_BASE 0x1000
_Static_assert(CLI_OPT_ENGRAM_CACHE < FLAG_BASE, "tier option codes below the flags");

static void copy(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src ? src : "");
}

/* 1 when v (device.kv_budget) is the knob's default size (st_iconf's
 * table), 0 otherwise or when either does not parse. */
static int kv_budget_is_default(const char *v)
{
	struct st_iconf *d = malloc(sizeof(*d));
	uint64_t a, b;
	int same = 0;

	if (!d)
		return 0;
	st_iconf_init(d);
	same = st_parse_size(v, &a) == 0 &&
	       st_parse_size(st_iconf_get(d, "device.kv_budget"), &b) == 0 &&
	       a == b;
	free(d);
	return same;
}

/*
 * Parses the command line of up/down/status/restart into conf (after the
 * --config file) and fills inst from it.  *ret_arg: restart's DAEMON, or
 * up's expert-format spec (cli_experts_spec; static storage).  *ret_json
 * (status only; NULL for the others, which refuse --json): 1 with --json.
 * 0, 2 (usage error, printed), or exits 0 after --help.
 */
static int parse(int argc, char **argv, const char *cmd,
		 struct cli_instance *inst, struct st_iconf *conf,
		 const char **ret_arg, int *timeout_s, int *ret_json)
{
	static const struct option tier_opts[] = { CLI_TIER_LONGOPTS };
	static struct cli_tier_args tier; /* outlives parse(): inst->tier */
	struct option opts[N_FLAGS + 9 + sizeof(tier_opts) / sizeof(tier_opts[0])];
	struct st_diag diag = { "" };
	int c, is_up = !strcmp(cmd, "up"), n = 0, any_tier = 0;
	int force = 0;
	const char *config = NULL;

	for (size_t i = 0; i < N_FLAGS; i++)
		opts[n++] = (struct option){ k_flag_keys[i].flag,
					     required_argument, NULL,
					     FLAG_BASE + (int)i };
	/* the expert-tier options of strata run, except those that are
	 * config keys here (--hot-experts, --loader-threads) */
	for (size_t i = 0; i < sizeof(tier_opts) / sizeof(tier_opts[0]); i++) {
		int dup = 0;

		for (size_t j = 0; j < N_FLAGS; j++)
			dup |= !strcmp(tier_opts[i].name, k_flag_keys[j].flag);
		if (!dup)
			opts[n++] = tier_opts[i];
	}
	opts[n++] = (struct option){ "config", required_argument, NULL, 'C' };
	opts[n++] = (struct option){ "timeout", required_argument, NULL, 'T' };
	opts[n++] = (struct option){ "help-config", no_argument, NULL, 'G' };
	opts[n++] = (struct option){ "no-supervise", no_argument, NULL, 'S' };
	opts[n++] = (struct option){ "force", no_argument, NULL, 'F' };
	opts[n++] = (struct option){ "metrics-auth", no_argument, NULL, 'M' };
	opts[n++] = (struct option){ "json", no_argument, NULL, 'J' };
	opts[n++] = (struct option){ "help", no_argument, NULL, 'h' };
	opts[n] = (struct option){ 0 };

	st_iconf_init(conf);
	for (int i = 1; i + 1 < argc; i++)
		if (!strcmp(argv[i], "--config"))
			config = argv[i + 1];
	if (config && st_iconf_load(conf, config, &diag) < 0) {
		fprintf(stderr, "strata %s: %s\n", cmd, diag.msg);
		return 2;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c >= FLAG_BASE && c < FLAG_BASE + (int)N_FLAGS) {
			const char *key = k_flag_keys[c - FLAG_BASE].key;

			if (!is_up && strncmp(key, "instance.", 9)) {
				inst_usage(stderr, cmd);
				return 2;
			}
			if (st_iconf_set(conf, key, optarg, &diag) < 0) {
				fprintf(stderr, "strata %s: --%s: %s\n", cmd,
					k_flag_keys[c - FLAG_BASE].flag, diag.msg);
				return 2;
			}
			continue;
		}
		switch (c) {
		case 'C': break;
		case 'T': *timeout_s = atoi(optarg) > 0 ? atoi(optarg) : 120; break;
		case 'G': st_iconf_print_help(stdout); exit(0);
		case 'F':
			if (!is_up) {
				inst_usage(stderr, cmd);
				return 2;
			}
			force = 1;
			break;
		case 'S':
		case 'M':
			if (!is_up) {
				inst_usage(stderr, cmd);
				return 2;
			}
			/* switches without a value: the config's booleans */
			st_iconf_set(conf, c == 'S' ? "supervisor.enabled" :
				     "serve.metrics_auth",
				     c == 'S' ? "off" : "on", &diag);
			break;
		case 'J':
			if (!ret_json) {
				inst_usage(stderr, cmd);
				return 2;
			}
			*ret_json = 1;
			break;
		case 'h': inst_usage(stdout, cmd); exit(0);
		case CLI_OPT_EVICT ... CLI_OPT_ENGRAM_CACHE:
			if (!is_up) {
				inst_usage(stderr, cmd);
				return 2;
			}
			if (cli_tier_opt(&tier, c, optarg) < 0)
				return 2;
			any_tier = 1;
			break;
		default: inst_usage(stderr, cmd); return 2;
		}
	}
	if (!strcmp(cmd, "restart")) {
		if (optind + 1 != argc || cli_daemon_index(argv[optind]) < 0) {
			fprintf(stderr, "strata restart: name one daemon: "
				"expertd, kvd or computed\n");
			return 2;
		}
		*ret_arg = argv[optind++];
	}
	if (optind < argc) {
		inst_usage(stderr, cmd);
		return 2;
	}
	memset(inst, 0, sizeof(*inst));
	inst->no_supervise = !st_iconf_get_bool(conf, "supervisor.enabled");
	inst->force_store = force;
	inst->restart_limit = atoi(st_iconf_get(conf,
						"supervisor.restart_limit"));
	copy(inst->name, sizeof(inst->name), st_iconf_get(conf, "instance.name"));
	copy(inst->run_dir, sizeof(inst->run_dir),
	     st_iconf_get(conf, "instance.run_dir"));
	if (is_up) {
		static char spec[512]; /* the combined spec outlives parse() */
		const char *keep = st_iconf_get(conf, "experts.keep_layers");

		uint64_t shared = 0;

		/* a shared budget (memory.budget, a size st_iconf checked;
		 * unset is none, 0 given is refused by cli_check_memory
		 * below): the separate budgets become floors, so only those
		 * asked for are passed (their defaults, 100% and 1GiB,
		 * would be floors nobody chose) */
		st_parse_size(st_iconf_get(conf, "memory.budget"), &shared);

		copy(inst->store_dir, sizeof(inst->store_dir),
		     st_iconf_get(conf, "model.store"));
		if (st_iconf_is_set(conf, "memory.budget"))
			copy(inst->memory_budget, sizeof(inst->memory_budget),
			     st_iconf_get(conf, "memory.budget"));
		if (!st_iconf_get_bool(conf, "experts.offload"))
			copy(inst->host_budget, sizeof(inst->host_budget),
			     "100%");
		else if (!shared || st_iconf_is_set(conf, "experts.host_budget"))
			copy(inst->host_budget, sizeof(inst->host_budget),
			     st_iconf_get(conf, "experts.host_budget"));
		if (!shared || st_iconf_is_set(conf, "kv.budget"))
			copy(inst->kv_budget, sizeof(inst->kv_budget),
			     st_iconf_get(conf, "kv.budget"));
		if (strcmp(st_iconf_get(conf, "kv.spill_budget"), "0"))
			copy(inst->kv_spill, sizeof(inst->kv_spill),
			     st_iconf_get(conf, "kv.spill_budget"));
		copy(inst->kv_remote, sizeof(inst->kv_remote),
		     st_iconf_get(conf, "kv.remote"));
		copy(inst->kv_session_dir, sizeof(inst->kv_session_dir),
		     st_iconf_get(conf, "kv.session_dir"));
		copy(inst->kv_dtype, sizeof(inst->kv_dtype),
		     st_iconf_get(conf, "kv.dtype"));
		copy(inst->numa, sizeof(inst->numa),
		     st_iconf_get(conf, "instance.numa"));
		if (!strcmp(inst->numa, "auto")) {
			/* resolved here once, so the daemons get a node
			 * number and never load hwloc themselves */
			struct st_numa_policy np;

			if (st_numa_policy_parse("auto", &np, NULL) == 0 &&
			    st_numa_resolve(&np, NULL, &diag) == 0)
				snprintf(inst->numa, sizeof(inst->numa), "%d",
					 np.node);
			else
				fprintf(stderr, "strata up: --numa auto: %s; "
					"the daemons will choose\n", diag.msg);
		}
		copy(inst->loader_threads, sizeof(inst->loader_threads),
		     st_iconf_get(conf, "experts.loader_threads"));
		/* the hot set and the look-ahead go to expertd and computed
		 * as their tier options */
		if (st_iconf_is_set(conf, "experts.hot_experts") &&
		    strcmp(st_iconf_get(conf, "experts.hot_experts"), "auto")) {
			if (cli_tier_opt(&tier, CLI_OPT_HOT, st_iconf_get(
					 conf, "experts.hot_experts")) < 0)
				return 2;
			any_tier = 1;
		}
		if (st_iconf_is_set(conf, "experts.prefetch_depth")) {
			if (cli_tier_opt(&tier, CLI_OPT_PREFETCH_DEPTH,
					 st_iconf_get(conf,
					 "experts.prefetch_depth")) < 0)
				return 2;
			any_tier = 1;
		}
		if (any_tier)
			inst->tier = &tier;
		copy(inst->max_seqs, sizeof(inst->max_seqs),
		     st_iconf_get(conf, "kv.max_seqs"));
		copy(inst->page_rows, sizeof(inst->page_rows),
		     st_iconf_get(conf, "kv.page_rows"));
		copy(inst->compute, sizeof(inst->compute),
		     st_iconf_get(conf, "compute.mode"));
		/* serving: only what differs from computed's defaults is
		 * passed, so computed's --help stays the reference */
		if (strcmp(st_iconf_get(conf, "serve.http_port"), "0"))
			copy(inst->http_port, sizeof(inst->http_port),
			     st_iconf_get(conf, "serve.http_port"));
		if (st_iconf_is_set(conf, "serve.http_bind"))
			copy(inst->http_bind, sizeof(inst->http_bind),
			     st_iconf_get(conf, "serve.http_bind"));
		if (st_iconf_is_set(conf, "serve.max_running"))
			copy(inst->max_running, sizeof(inst->max_running),
			     st_iconf_get(conf, "serve.max_running"));
		if (st_iconf_is_set(conf, "serve.max_queued"))
			copy(inst->max_queued, sizeof(inst->max_queued),
			     st_iconf_get(conf, "serve.max_queued"));
		if (st_iconf_is_set(conf, "serve.max_step_tokens"))
			copy(inst->max_step_tokens,
			     sizeof(inst->max_step_tokens),
			     st_iconf_get(conf, "serve.max_step_tokens"));
		if (st_iconf_is_set(conf, "kv.restore_ahead"))
			/* computed takes on|off; the config also true, yes.. */
			copy(inst->kv_restore_ahead,
			     sizeof(inst->kv_restore_ahead),
			     st_iconf_get_bool(conf, "kv.restore_ahead") ?
				     "on" : "off");
		if (st_iconf_is_set(conf, "serve.speculate"))
			copy(inst->speculate, sizeof(inst->speculate),
			     st_iconf_get(conf, "serve.speculate"));
		if (st_iconf_get(conf, "serve.model_name")[0])
			copy(inst->model_name, sizeof(inst->model_name),
			     st_iconf_get(conf, "serve.model_name"));
		else if (st_iconf_is_set(conf, "model.path") &&
			 !st_iconf_is_set(conf, "model.store"))
			cli_model_name_of(st_iconf_get(conf, "model.path"),
					  inst->model_name,
					  sizeof(inst->model_name));
		if (st_iconf_get_bool(conf, "serve.metrics_auth"))
			inst->metrics_auth = 1;
		if (st_iconf_is_set(conf, "serve.http_request_timeout"))
			copy(inst->http_request_timeout,
			     sizeof(inst->http_request_timeout),
			     st_iconf_get(conf, "serve.http_request_timeout"));
		if (st_iconf_is_set(conf, "serve.http_idle_timeout"))
			copy(inst->http_idle_timeout,
			     sizeof(inst->http_idle_timeout),
			     st_iconf_get(conf, "serve.http_idle_timeout"));
		if (st_iconf_is_set(conf, "serve.http_max_client_conns"))
			copy(inst->http_max_client_conns,
			     sizeof(inst->http_max_client_conns),
			     st_iconf_get(conf, "serve.http_max_client_conns"));
		if (strcmp(st_iconf_get(conf, "serve.chat_template"), "auto"))
			copy(inst->chat_template, sizeof(inst->chat_template),
			     st_iconf_get(conf, "serve.chat_template"));
		if (strcmp(st_iconf_get(conf, "compute.threads"), "0"))
			copy(inst->threads, sizeof(inst->threads),
			     st_iconf_get(conf, "compute.threads"));
		if (cli_experts_spec(spec, sizeof(spec),
				     st_iconf_get(conf, "experts.format"),
				     keep[0] ? keep : NULL,
				     st_iconf_get(conf, "experts.scale_search")) < 0)
			return 2;
		if (strcmp(st_iconf_get(conf, "device.budget"), "auto"))
			copy(inst->device_budget, sizeof(inst->device_budget),
			     st_iconf_get(conf, "device.budget"));
		/* the default pool size (docs/strata.conf.example writes it
		 * out) is what computed uses anyway where a device is
		 * present: only another value is an explicit request that a
		 * machine without a device must refuse */
		if (st_iconf_is_set(conf, "device.kv_budget") &&
		    !kv_budget_is_default(st_iconf_get(conf,
						       "device.kv_budget")))
			copy(inst->device_kv_budget,
			     sizeof(inst->device_kv_budget),
			     st_iconf_get(conf, "device.kv_budget"));
		if (cli_check_common(inst->name, inst->host_budget[0] ?
				     inst->host_budget : NULL,
				     inst->kv_budget[0] ? inst->kv_budget : NULL,
				     inst->kv_dtype, spec, "strata up") ||
		    cli_check_device(inst->device_budget,
				     inst->device_kv_budget, "strata up") ||
		    cli_check_memory(inst->memory_budget, inst->host_budget,
				     inst->kv_budget, "strata up", NULL))
			return 2;
		st_iconf_warn_unhonoured(conf, stderr, "strata up");
		*ret_arg = spec;
	} else if (cli_check_common(inst->name, NULL, NULL, NULL, NULL,
				    "strata")) {
		return 2;
	}
	/* down, status, restart: where `strata up` recorded the instance,
	 * whatever run directory it was given */
	if (!inst->run_dir[0] && !is_up &&
	    cli_registry_lookup(inst->name, inst->run_dir,
				sizeof(inst->run_dir)) < 0)
		inst->run_dir[0] = 0;
	if (!inst->run_dir[0])
		st_run_dir_default(inst->name, inst->run_dir,
				   sizeof(inst->run_dir));
	return 0;
}

/* Makes sure inst->store_dir holds an up-to-date store: the default store
 * of the model when none is named, converted (or made again when stale)
 * from [model] path.  0, or the exit code after a message. */
static int prepare_store(const struct st_iconf *conf, struct cli_instance *inst,
			 const char *experts, const char *who)
{
	const char *model = st_iconf_is_set(conf, "model.path") ?
			    st_iconf_get(conf, "model.path") : NULL;
	int dense_f32 = !strcmp(st_iconf_get(conf, "formats.attention"), "f32");
	int r;

	if (!model && !inst->store_dir[0]) {
		fprintf(stderr, "%s: give --model DIR or --store DIR (or [model] "
			"path / store in --config)\n", who);
		return 2;
	}
	inst->store_is_cache = !inst->store_dir[0];
	if (model && inst->store_dir[0] && !inst->force_store &&
	    st_path_exists(inst->store_dir) &&
	    cli_store_refuse_other(inst->store_dir, model, who))
		return 1;
	if (!inst->store_dir[0] &&
	    (r = cli_default_store_dir(model, experts, inst->store_dir,
				       sizeof(inst->store_dir))) < 0) {
		fprintf(stderr, "%s: model %s: %s (give a Hugging Face "
			"checkpoint directory)\n", who, model, st_strerror(r));
		return 1;
	}
	if (!st_path_exists(inst->store_dir) ||
	    (model && cli_store_stale(inst->store_dir, model))) {
		int sigfd, force = st_path_exists(inst->store_dir);

		if (!model) {
			fprintf(stderr, "%s: store %s does not exist\n", who,
				inst->store_dir);
			return 1;
		}
		sigfd = st_stop_signals_open();
		r = cli_convert(model, inst->store_dir, experts, dense_f32,
				force, sigfd);
		if (sigfd >= 0)
			close(sigfd);
		if (r)
			return r;
	}
	return 0;
}

int cli_cmd_up(int argc, char **argv)
{
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct st_iconf *conf = malloc(sizeof(*conf));
	const char *experts = NULL;
	int timeout_s = 120, r;

	if (!conf)
		return 1;
	/* conf lives until the daemons are started: inst.tier points
	 * into it (experts.hot_experts, experts.prefetch_depth) */
	r = parse(argc, argv, "up", &inst, conf, &experts, &timeout_s, NULL);
	if (r == 0 && inst.kv_session_dir[0]) {
		struct stat st;

		/* kvd creates a missing one; a file there would fail every
		 * save and load later, so it is refused now */
		if (stat(inst.kv_session_dir, &st) == 0 &&
		    !S_ISDIR(st.st_mode)) {
			fprintf(stderr, "strata up: --kv-session-dir %s exists "
				"and is not a directory; name a directory (it "
				"is created when missing)\n",
				inst.kv_session_dir);
			r = 2;
		}
	}
	if (r == 0)
		r = prepare_store(conf, &inst, experts, "strata up");
	if (r)
		goto out;
	r = cli_instance_state(&inst);
	/* the daemons answering in the run dir may be another instance's:
	 * name it, not this one */
	if (cli_instance_check_owner(&inst, r, &diag) < 0) {
		fprintf(stderr, "strata up: %s\n", diag.msg);
		r = 1;
		goto out;
	}
	if (r == 3) {
		fprintf(stderr, "strata up: instance '%s' is already running\n",
			inst.name);
		r = 1;
		goto out;
	}
	if (r > 0) {
		fprintf(stderr, "strata up: instance '%s' is partly running (%d "
			"of 3 daemons answer); run 'strata down --instance %s' "
			"first\n", inst.name, r, inst.name);
		r = 1;
		goto out;
	}
	r = inst.no_supervise ? cli_instance_up(&inst, timeout_s, &diag) :
	    cli_superv_start(&inst, timeout_s, inst.restart_limit, &diag);
	if (r < 0) {
		fprintf(stderr, "strata up: %s\n", diag.msg);
		cli_cache_hint(&inst, "strata up", diag.msg);
		r = 1;
		goto out;
	}
	printf("instance %s up: expertd %d, kvd %d, computed %d; run dir %s%s\n",
	       inst.name, inst.pid_expertd, inst.pid_kvd, inst.pid_computed,
	       inst.run_dir, inst.no_supervise ? "" :
	       "; a supervisor restarts a daemon that dies");
	{
		char url[160];

		if (cli_instance_url(inst.run_dir, url, sizeof(url)) == 0)
			printf("listening on %s\n", url);
	}
	r = cli_registry_add(inst.name, inst.run_dir);
	if (r < 0) {
		char dir[4096] = "";

		cli_registry_dir(dir, sizeof(dir));
		fprintf(stderr, "strata up: cannot record the instance in %s: "
			"%s; strata ps will not list it, and down/status need "
			"--run-dir %s\n", dir, st_strerror(r), inst.run_dir);
	}
	r = 0;
out:
	free(conf);
	return r;
}

/* `strata exec DAEMON --config FILE`: what the systemd units run.  Takes
 * the options of `up`, prepares the store (expertd only: it starts
 * first), then becomes the daemon. */
int cli_cmd_exec(int argc, char **argv)
{
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct st_iconf *conf = malloc(sizeof(*conf));
	const char *experts = NULL, *daemon;
	int timeout_s = 0, r;

	if (!conf)
		return 1;
	if (argc < 2 || cli_daemon_index(argv[1]) < 0) {
		/* --help: the usage on stdout, as every other command */
		int help = argc >= 2 && (!strcmp(argv[1], "--help") ||
					 !strcmp(argv[1], "-h"));

		fprintf(help ? stdout : stderr, "Usage: strata exec expertd|kvd|computed "
			"[--config FILE] [options of strata up]\n"
			"Becomes the daemon, with the options strata up would "
			"give it (the systemd units\nstrata-<daemon>@.service "
			"run this).\n");
		free(conf);
		return help ? 0 : 2;
	}
	daemon = argv[1];
	argv[1] = argv[0];
	r = parse(argc - 1, argv + 1, "up", &inst, conf, &experts, &timeout_s,
		  NULL);
	if (r == 0 && !strcmp(daemon, "expertd")) {
		r = prepare_store(conf, &inst, experts, "strata exec");
	} else if (r == 0 && !strcmp(daemon, "computed") && !inst.store_dir[0]) {
		/* the store expertd prepared: named, or the model's default */
		if (!st_iconf_is_set(conf, "model.path") ||
		    cli_default_store_dir(st_iconf_get(conf, "model.path"),
					  experts, inst.store_dir,
					  sizeof(inst.store_dir)) < 0) {
			fprintf(stderr, "strata exec computed: give [model] "
				"store or path in the config\n");
			r = 2;
		}
	}
	if (r) {
		free(conf);
		return r;
	}
	/* conf outlives the exec's argv: inst.tier points into it */
	r = cli_instance_exec(&inst, daemon, &diag);
	fprintf(stderr, "strata exec: %s\n", diag.msg);
	free(conf);
	return 1;
}

int cli_cmd_down(int argc, char **argv)
{
	struct cli_instance inst;
	struct st_iconf *conf = malloc(sizeof(*conf));
	const char *unused = NULL;
	int timeout_s = 0, r, pids0[3], sv_pid;

	if (!conf)
		return 1;
	r = parse(argc, argv, "down", &inst, conf, &unused, &timeout_s, NULL);
	free(conf);
	if (r)
		return r;
	cli_instance_read_pids(&inst);
	pids0[0] = inst.pid_expertd;
	pids0[1] = inst.pid_kvd;
	pids0[2] = inst.pid_computed;
	if (!st_path_exists(inst.run_dir)) {
		printf("instance %s is not running (no run directory %s)\n",
		       inst.name, inst.run_dir);
		cli_registry_remove(inst.name, inst.run_dir);
		return 0;
	}
	/* the supervisor first: it would start again what we stop */
	sv_pid = cli_superv_pid(inst.run_dir);
	if (cli_superv_stop(inst.run_dir, 10000) > 0)
		fprintf(stderr, "strata down: the supervisor did not stop on "
			"SIGTERM and was killed\n");
	r = cli_instance_down(&inst);
	if (r < 0) {
		fprintf(stderr, "strata down: %s\n", st_strerror(r));
		return 1;
	}
	{
		char state[4200];

		st_run_path(inst.run_dir, "supervisor", "state", state,
			    sizeof(state));
		unlink(state);
	}
	cli_registry_remove(inst.name, inst.run_dir);
	{
		/* what we were to stop: still alive is a failure */
		int pids[4] = { pids0[0], pids0[1], pids0[2], sv_pid }, left = 0;
		char which[160] = "";

		for (int i = 0; i < 4; i++)
			if (pids[i] > 0 && st_pid_alive(pids[i])) {
				left++;
				snprintf(which + strlen(which),
					 sizeof(which) - strlen(which), " %s %d",
					 i == 3 ? "supervisor" :
					 i == 0 ? "expertd" : i == 1 ? "kvd" :
					 "computed", pids[i]);
			}
		if (left || cli_instance_state(&inst) > 0) {
			fprintf(stderr, "strata down: instance %s is still "
				"running (%s%s); see strata status --instance "
				"%s\n", inst.name, left ? "still alive:" :
				"a daemon answers on its socket", which,
				inst.name);
			return 1;
		}
	}
	printf("instance %s down%s; logs kept in %s\n", inst.name,
	       r > 0 ? " (some daemons had to be killed)" : "", inst.run_dir);
	return 0;
}

int cli_cmd_restart(int argc, char **argv)
{
	struct cli_instance inst;
	struct st_diag diag = { "" };
	struct st_iconf *conf = malloc(sizeof(*conf));
	const char *daemon = NULL;
	int timeout_s = 120, r;

	if (!conf)
		return 1;
	r = parse(argc, argv, "restart", &inst, conf, &daemon, &timeout_s,
		  NULL);
	free(conf);
	if (r)
		return r;
	r = cli_instance_restart(&inst, daemon, timeout_s, &diag);
	if (r < 0) {
		fprintf(stderr, "strata restart: %s\n", diag.msg);
		return 1;
	}
	cli_instance_read_pids(&inst);
	r = daemon[0] == 'e' ? inst.pid_expertd : daemon[0] == 'k' ?
	    inst.pid_kvd : inst.pid_computed;
	if (r <= 0) {
		/* a daemon that answers without a pid file: nothing could
		 * stop it later */
		fprintf(stderr, "strata restart: %s answers but left no pid "
			"file in %s; strata down --instance %s stops it\n",
			daemon, inst.run_dir, inst.name);
		return 1;
	}
	printf("%s of instance %s restarted: pid %d\n", daemon, inst.name, r);
	return 0;
}

/* Prints where the pages of each of the instance's segments are. */
static void print_placement(const char *instance)
{
	char prefix[128];
	struct dirent *de;
	DIR *d = opendir("/dev/shm");
	size_t pl;

	if (!d)
		return;
	pl = (size_t)snprintf(prefix, sizeof(prefix), "strata.%s.", instance);
	while ((de = readdir(d))) {
		uint64_t pages[ST_NUMA_MAX_NODES], absent;
		char name[300], a[32];
		struct stat st;
		void *base;
		int fd;

		if (strncmp(de->d_name, prefix, pl))
			continue;
		snprintf(name, sizeof(name), "/%s", de->d_name);
		fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
		if (fd < 0)
			continue;
		if (fstat(fd, &st) < 0 || st.st_size <= 0) {
			close(fd);
			continue;
		}
		base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd,
			    0);
		close(fd);
		if (base == MAP_FAILED)
			continue;
		if (st_numa_query_range(base, (size_t)st.st_size, pages,
					&absent) == 0) {
			printf("  segment %-22s %s:", de->d_name + pl,
			       st_format_bytes((uint64_t)st.st_size, a,
					       sizeof(a)));
			for (int n = 0; n < ST_NUMA_MAX_NODES; n++)
				if (pages[n])
					printf(" node%d %llu pages", n,
					       (unsigned long long)pages[n]);
			printf(", %llu not resident\n",
			       (unsigned long long)absent);
		}
		munmap(base, (size_t)st.st_size);
	}
	closedir(d);
}

/* What status says of a daemon from the supervisor's state into buf
 * ("" when nothing is worth saying: running, never restarted).  A
 * daemon `strata restart` stopped is said to be restarted by it, not
 * "0 restarts, restarting, last exit exit-0". */
static void describe_superv(const struct st_superv_daemon *d, char *buf,
			    size_t len)
{
	int cmd = !strcmp(d->last_exit, ST_SUPERV_EXIT_RESTART);

	buf[0] = 0;
	if (cmd && !strcmp(d->state, "restarting"))
		snprintf(buf, len, "; being restarted by strata restart (%u "
			 "restart%s after a crash)", d->restarts,
			 d->restarts == 1 ? "" : "s");
	else if (d->restarts || strcmp(d->state, "running"))
		snprintf(buf, len, "; %u restart%s, %s, last exit %s",
			 d->restarts, d->restarts == 1 ? "" : "s", d->state,
			 cmd ? "by strata restart" : d->last_exit);
}

/* The shared memory budget of the instance (st_ledger.h) for status:
 * v, the ledger read (NULL when it could not be: r and why say why,
 * -ENOENT when the instance shares no budget), printed, or put in j as
 * "memory" (j non-NULL).  Nothing without a budget; a ledger that cannot
 * be read is said so. */
static void status_memory(const struct st_ledger_view *v, int r,
			  const char *why, json_t *j)
{
	if (v && j)
		json_object_set_new(j, "memory", cli_memory_json(v,
								 st_now_ns()));
	else if (v)
		cli_memory_print(stdout, "", v, st_now_ns());
	else if (r != -ENOENT && !j)
		printf("memory             the shared budget's ledger cannot "
		       "be read: %s\n", why);
}

int cli_cmd_status(int argc, char **argv)
{
	static const char *names[3] = { "expertd", "kvd", "computed" };
	struct cli_instance inst;
	struct st_iconf *conf = malloc(sizeof(*conf));
	const char *unused = NULL;
	struct st_superv_state sv;
	char url[160];
	int timeout_s = 0, r, up = 0, have_sv, json = 0;
	json_t *j = NULL, *jd = NULL;
	struct st_ledger_view *lv;
	struct st_diag ldiag = { "" };
	int lr;

	if (!conf)
		return 1;
	r = parse(argc, argv, "status", &inst, conf, &unused, &timeout_s,
		  &json);
	free(conf);
	if (r)
		return r;
	/* the shared budget's ledger, if any: kvd's share of the KV pages
	 * and the section after the daemons' figures */
	lv = malloc(sizeof(*lv));
	lr = lv ? st_ledger_read(inst.name, lv, &ldiag) : -ENOMEM;
	if (lr < 0) {
		free(lv);
		lv = NULL;
	}
	if (json) {
		/* --json: the same facts as one object on stdout */
		j = json_pack("{s:s, s:s}", "instance", inst.name, "run_dir",
			      inst.run_dir);
		jd = json_object();
		if (!j || !jd) {
			json_decref(j);
			json_decref(jd);
			free(lv);
			return 1;
		}
		json_object_set_new(j, "daemons", jd);
	}
	have_sv = st_superv_state_read(inst.run_dir, &sv) == 0;
	if (!j)
		printf("instance %s (run dir %s)\n", inst.name, inst.run_dir);
	if (cli_instance_url(inst.run_dir, url, sizeof(url)) == 0) {
		/* the URL is a recorded fact; whether it answers is checked */
		int answers = cli_url_answers(url, 1000);

		if (j)
			json_object_set_new(j, "url", json_pack(
				"{s:s, s:b}", "url", url, "answers", answers));
		else if (answers)
			printf("  listening on %s\n", url);
		else
			printf("  not answering on %s (nothing accepts a "
			       "connection there)\n", url);
	}
	if (j)
		json_object_set_new(j, "supervisor_pid", json_integer(
			cli_superv_pid(inst.run_dir)));
	else if (cli_superv_pid(inst.run_dir))
		printf("  supervisor running, pid %d: restarts a daemon that "
		       "dies\n", cli_superv_pid(inst.run_dir));
	else if (cli_superv_dead_pid(inst.run_dir)) {
		printf("  ");
		cli_superv_dead_hint(stdout, "  ", inst.name,
				     cli_superv_dead_pid(inst.run_dir));
	}
	else
		printf("  supervisor not running: nothing restarts a daemon "
		       "that dies\n");
	for (int i = 0; i < 3; i++) {
		char ctl[4200], extra[128] = "";
		int32_t pid = 0;
		int running;

		if (have_sv && !strcmp(sv.d[i].name, names[i]))
			describe_superv(&sv.d[i], extra, sizeof(extra));
		st_run_path(inst.run_dir, names[i], "ctl", ctl, sizeof(ctl));
		running = st_path_exists(ctl) &&
			  st_daemon_ping(ctl, 1000, &pid) == 0;
		up += running;
		if (j) {
			json_object_set_new(jd, names[i], json_pack(
				"{s:b, s:i, s:I}", "running", running, "pid",
				running ? (int)pid : 0, "peak_rss_bytes",
				(json_int_t)(running ?
					st_pid_peak_rss_bytes(pid) : 0)));
		} else if (running) {
			char a[32];

			printf("  %-9s running, pid %d, peak RSS %s%s\n",
			       names[i], pid,
			       st_format_bytes(st_pid_peak_rss_bytes(pid), a,
					       sizeof(a)), extra);
		} else {
			printf("  %-9s not running%s\n", names[i], extra);
		}
	}
	if (!j)
		print_placement(inst.name);
	if (up == 3) {
		struct cw_client *cw;
		struct cw_stats_wire s = { 0 };
		struct st_diag diag;

		if (cw_client_open(inst.run_dir, 5000, &cw, &diag) == 0) {
			if (!j && cw_client_stats(cw, &s) == 0) {
				char kvp[160];

				cli_memory_kv_pages_text(lv, s.kv_pages_used,
							 s.kv_n_pages, kvp,
							 sizeof(kvp));
				printf("  generations %llu, prompt tokens %llu, "
				       "generated %llu; experts hits %llu misses "
				       "%llu evictions %llu; KV pages %s\n",
				       (unsigned long long)s.n_generations,
				       (unsigned long long)s.prompt_tokens,
				       (unsigned long long)s.generated_tokens,
				       (unsigned long long)s.es_hits,
				       (unsigned long long)s.es_misses,
				       (unsigned long long)s.es_evictions,
				       kvp);
				{
					/* tier figures since the daemons
					 * started */
					struct cw_stats_wire z = { 0 };
					struct cli_tier_figures tf;

					cli_tier_figures(&z, &s, &tf);
					cli_tier_print(stdout, &tf);
				}
				/* the NVMe queue's classes since its segment
				 * was made */
				if (s.io_on)
					cli_io_print(stdout, &s);
			} else if (j && cw_client_stats(cw, &s) == 0) {
				json_object_set_new(j, "stats", json_pack(
					"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
					"s:I}", "generations",
					(json_int_t)s.n_generations,
					"prompt_tokens",
					(json_int_t)s.prompt_tokens,
					"generated_tokens",
					(json_int_t)s.generated_tokens,
					"expert_hits", (json_int_t)s.es_hits,
					"expert_misses",
					(json_int_t)s.es_misses,
					"expert_evictions",
					(json_int_t)s.es_evictions,
					"kv_pages_used",
					(json_int_t)s.kv_pages_used,
					"kv_pages", (json_int_t)s.kv_n_pages));
				{
					/* kvd's share under a shared budget
					 * (the pool otherwise) */
					json_t *st = json_object_get(j,
								     "stats");

					json_object_set_new(st,
						"kv_pages_allowed",
						json_integer((json_int_t)
						cli_memory_kv_allowed(lv,
							s.kv_n_pages)));
					json_object_set_new(st,
						"kv_page_bytes",
						json_integer((json_int_t)
						s.kv_page_bytes));
				}
				if (s.io_on)
					json_object_set_new(j, "io",
							    cli_io_json(&s));
			}
			cw_client_close(cw);
		}
	}
	/* the shared budget next to the I/O queue: both are the two tier
	 * daemons' shared segments, readable with any daemon down */
	status_memory(lv, lr, ldiag.msg, j);
	free(lv);
	if (j) {
		json_object_set_new(j, "running", json_integer(up));
		json_dumpf(j, stdout, JSON_COMPACT | JSON_REAL_PRECISION(10));
		printf("\n");
		json_decref(j);
	}
	return up == 3 ? 0 : 3;
}
