/* cmd_instance.c — `strata up`, `strata down`, `strata status`: the
 * launcher for a named instance. */
#include <getopt.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_cmds.h"
#include "cli_instance.h"
#include "cw_client.h"
#include "st_daemon.h"
#include "st_util.h"

static void inst_usage(FILE *f, const char *cmd)
{
	fprintf(f,
"Usage: strata %s [--instance NAME] [--run-dir DIR]%s\n"
"\n", cmd, !strcmp(cmd, "up") ?
	" (--model DIR | --store DIR)\n"
	"                 [--experts FMT] [--keep-layers SPEC] [--host-budget B]\n"
	"                 [--kv-budget B] [--kv-spill-budget B]\n"
	"                 [--kv-dtype T] [--http-port N] [--timeout SEC]" : "");
	if (!strcmp(cmd, "up"))
		fprintf(f, "Starts expertd, kvd and computed for the instance "
			"(converting the model first\nif it has no store) and "
			"returns once all three answer.  Logs go to\n"
			"<run-dir>/<daemon>.log.\n"
			"--http-port N serves the OpenAI-compatible HTTP API on "
			"127.0.0.1:N\n(API key: $STRATA_API_KEY, if set).\n");
	else if (!strcmp(cmd, "down"))
		fprintf(f, "Stops the instance's daemons (computed first), "
			"then removes its sockets,\npid files and shared-memory "
			"segments.  Segments of a live owner are never\n"
			"removed.\n");
	else
		fprintf(f, "Says whether each daemon of the instance runs and "
			"prints computed's counters.\n");
	fprintf(f, "\nDefault instance: %s.  Default run dir: "
		"$STRATA_RUN_DIR, /run/strata/NAME (root)\nor "
		"$XDG_RUNTIME_DIR/strata/NAME.\n", ST_DEFAULT_INSTANCE);
}

static int parse(int argc, char **argv, const char *cmd,
		 struct cli_instance *inst, const char **model,
		 const char **experts, int *timeout_s)
{
	static const struct option opts[] = {
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "model", required_argument, NULL, 'm' },
		{ "store", required_argument, NULL, 's' },
		{ "experts", required_argument, NULL, 'e' },
		{ "keep-layers", required_argument, NULL, 'L' },
		{ "scale-search", required_argument, NULL, 'Z' },
		{ "host-budget", required_argument, NULL, 'b' },
		{ "kv-budget", required_argument, NULL, 'B' },
		{ "kv-spill-budget", required_argument, NULL, 'O' },
		{ "kv-dtype", required_argument, NULL, 'K' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "http-port", required_argument, NULL, 'H' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static char spec[512]; /* the combined spec outlives parse() */
	const char *keep_spec = NULL, *scale_search = NULL;
	int c, is_up = !strcmp(cmd, "up");

	memset(inst, 0, sizeof(*inst));
	snprintf(inst->name, sizeof(inst->name), "%s", ST_DEFAULT_INSTANCE);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (!is_up && c != 'i' && c != 'r' && c != 'h') {
			inst_usage(stderr, cmd);
			return 2;
		}
		switch (c) {
		case 'i': snprintf(inst->name, sizeof(inst->name), "%s", optarg); break;
		case 'r': snprintf(inst->run_dir, sizeof(inst->run_dir), "%s", optarg); break;
		case 'm': *model = optarg; break;
		case 's': snprintf(inst->store_dir, sizeof(inst->store_dir), "%s", optarg); break;
		case 'e': *experts = optarg; break;
		case 'L': keep_spec = optarg; break;
		case 'Z': scale_search = optarg; break;
		case 'b': snprintf(inst->host_budget, sizeof(inst->host_budget), "%s", optarg); break;
		case 'B': snprintf(inst->kv_budget, sizeof(inst->kv_budget), "%s", optarg); break;
		case 'O': snprintf(inst->kv_spill, sizeof(inst->kv_spill), "%s", optarg); break;
		case 'K': snprintf(inst->kv_dtype, sizeof(inst->kv_dtype), "%s", optarg); break;
		case 'T': *timeout_s = atoi(optarg) > 0 ? atoi(optarg) : 120; break;
		case 'H':
			if (atoi(optarg) < 1 || atoi(optarg) > 65535) {
				fprintf(stderr, "strata: --http-port must be "
					"1..65535\n");
				return 2;
			}
			snprintf(inst->http_port, sizeof(inst->http_port),
				 "%d", atoi(optarg));
			break;
		case 'h': inst_usage(stdout, cmd); exit(0);
		default: inst_usage(stderr, cmd); return 2;
		}
	}
	if (optind < argc) {
		inst_usage(stderr, cmd);
		return 2;
	}
	if (is_up) {
		if (cli_experts_spec(spec, sizeof(spec), *experts, keep_spec,
				     scale_search) < 0)
			return 2;
		*experts = spec;
	}
	if (cli_check_common(inst->name, is_up && inst->host_budget[0] ?
			     inst->host_budget : NULL,
			     is_up && inst->kv_budget[0] ? inst->kv_budget : NULL,
			     is_up && inst->kv_dtype[0] ? inst->kv_dtype : NULL,
			     is_up ? *experts : NULL, "strata"))
		return 2;
	if (!inst->run_dir[0])
		st_run_dir_default(inst->name, inst->run_dir,
				   sizeof(inst->run_dir));
	return 0;
}

int cli_cmd_up(int argc, char **argv)
{
	struct cli_instance inst;
	struct st_diag diag = { "" };
	const char *model = NULL, *experts = "mxfp4";
	int timeout_s = 120, r;

	r = parse(argc, argv, "up", &inst, &model, &experts, &timeout_s);
	if (r)
		return r;
	if (!model && !inst.store_dir[0]) {
		fprintf(stderr, "strata up: give --model DIR or --store DIR\n");
		return 2;
	}
	if (!inst.store_dir[0] &&
	    cli_default_store_dir(model, experts, inst.store_dir,
				  sizeof(inst.store_dir)) < 0) {
		fprintf(stderr, "strata up: cannot use model %s\n", model);
		return 1;
	}
	if (!st_path_exists(inst.store_dir) ||
	    (model && cli_store_stale(inst.store_dir, model))) {
		int sigfd, force = st_path_exists(inst.store_dir);

		if (!model) {
			fprintf(stderr, "strata up: store %s does not exist\n",
				inst.store_dir);
			return 1;
		}
		sigfd = st_stop_signals_open();
		r = cli_convert(model, inst.store_dir, experts, 0, force, sigfd);
		if (sigfd >= 0)
			close(sigfd);
		if (r)
			return r;
	}
	r = cli_instance_state(&inst);
	if (r == 3) {
		fprintf(stderr, "strata up: instance '%s' is already running\n",
			inst.name);
		return 1;
	}
	if (r > 0) {
		fprintf(stderr, "strata up: instance '%s' is partly running (%d "
			"of 3 daemons answer); run 'strata down --instance %s' "
			"first\n", inst.name, r, inst.name);
		return 1;
	}
	r = cli_instance_up(&inst, timeout_s, &diag);
	if (r < 0) {
		fprintf(stderr, "strata up: %s\n", diag.msg);
		return 1;
	}
	printf("instance %s up: expertd %d, kvd %d, computed %d; run dir %s\n",
	       inst.name, inst.pid_expertd, inst.pid_kvd, inst.pid_computed,
	       inst.run_dir);
	return 0;
}

int cli_cmd_down(int argc, char **argv)
{
	struct cli_instance inst;
	const char *model = NULL, *experts = NULL;
	int timeout_s = 0, r;

	r = parse(argc, argv, "down", &inst, &model, &experts, &timeout_s);
	if (r)
		return r;
	cli_instance_read_pids(&inst);
	if (!st_path_exists(inst.run_dir)) {
		printf("instance %s is not running (no run directory %s)\n",
		       inst.name, inst.run_dir);
		return 0;
	}
	r = cli_instance_down(&inst);
	if (r < 0) {
		fprintf(stderr, "strata down: %s\n", st_strerror(r));
		return 1;
	}
	printf("instance %s down%s; logs kept in %s\n", inst.name,
	       r > 0 ? " (some daemons had to be killed)" : "", inst.run_dir);
	return 0;
}

int cli_cmd_status(int argc, char **argv)
{
	static const char *names[3] = { "expertd", "kvd", "computed" };
	struct cli_instance inst;
	const char *model = NULL, *experts = NULL;
	int timeout_s = 0, r, up = 0;

	r = parse(argc, argv, "status", &inst, &model, &experts, &timeout_s);
	if (r)
		return r;
	printf("instance %s (run dir %s)\n", inst.name, inst.run_dir);
	for (int i = 0; i < 3; i++) {
		char ctl[4200];
		int32_t pid = 0;

		st_run_path(inst.run_dir, names[i], "ctl", ctl, sizeof(ctl));
		if (st_path_exists(ctl) && st_daemon_ping(ctl, 1000, &pid) == 0) {
			char a[32];

			printf("  %-9s running, pid %d, peak RSS %s\n", names[i],
			       pid, st_format_bytes(st_pid_peak_rss_bytes(pid),
						    a, sizeof(a)));
			up++;
		} else {
			printf("  %-9s not running\n", names[i]);
		}
	}
	if (up == 3) {
		struct cw_client *cw;
		struct cw_stats_wire s;
		struct st_diag diag;

		if (cw_client_open(inst.run_dir, 5000, &cw, &diag) == 0) {
			if (cw_client_stats(cw, &s) == 0)
				printf("  generations %llu, prompt tokens %llu, "
				       "generated %llu; experts hits %llu misses "
				       "%llu evictions %llu; KV pages %llu/%llu\n",
				       (unsigned long long)s.n_generations,
				       (unsigned long long)s.prompt_tokens,
				       (unsigned long long)s.generated_tokens,
				       (unsigned long long)s.es_hits,
				       (unsigned long long)s.es_misses,
				       (unsigned long long)s.es_evictions,
				       (unsigned long long)s.kv_pages_used,
				       (unsigned long long)s.kv_n_pages);
			cw_client_close(cw);
		}
	}
	return up == 3 ? 0 : 3;
}
