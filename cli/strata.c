/*
 * strata.c — the strata command: the main job end to end (`strata run`),
 * the store writer (`convert`, `verify`) and the launcher (`up`, `down`,
 * `status`).  Each subcommand lives in its own cmd_*.c file; this file
 * dispatches and prints the overall help.
 */
#include <stdio.h>
#include <string.h>

#include "cli_cmds.h"
#include "st_build_config.h"
#include "st_log.h"

static void usage(FILE *f)
{
	fprintf(f,
"strata %s — node-local inference for mixture-of-experts models\n"
"\n"
"Usage: strata COMMAND [options]    (strata COMMAND --help for details)\n"
"\n"
"Commands:\n"
"  run       convert a model if needed, start the three daemons, generate\n"
"            text from a prompt, print metrics, stop the daemons\n"
"  convert   turn a Hugging Face checkpoint into a strata store\n"
"  verify    re-check every checksum of a store\n"
"  info      what a store holds: model, expert formats per layer, policy\n"
"  up        start expertd, kvd and computed for an instance\n"
"  down      stop an instance and remove its segments and sockets\n"
"  status    show whether an instance runs, with its counters\n"
"  ps        list the running instances: model, URL, pids, memory\n"
"  perplexity  perplexity of a text file (and KL divergence against a base)\n"
"  restart   stop one daemon of an instance and start it again\n"
"  topo      NUMA nodes, cores, caches, GPUs and NVMe; the node to use\n"
"  plan      memory per tier for a model, workload and budgets; verdict\n"
"  exec      become one daemon of an instance (what the systemd units run)\n"
"  activations  per-layer expert activation histogram (expertd statistics)\n"
"  replay    replay a routing trace through expert-residency policies\n"
"  calibrate activation statistics of a text for the calibrated FP4 scale\n"
"            search (strata convert --calibrate)\n"
"  session   saved conversations' KV of a running instance: save, load, ls,\n"
"            rm (resumed after restarts)\n"
"\n"
"Example:\n"
"  strata run --model models/kjv-moe --prompt 'In the beginning' --max-tokens 48\n",
		ST_VERSION);
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} cmds[] = {
		{ "run", cli_cmd_run },       { "convert", cli_cmd_convert },
		{ "verify", cli_cmd_verify }, { "up", cli_cmd_up },
		{ "down", cli_cmd_down },     { "status", cli_cmd_status },
		{ "ps", cli_cmd_ps },
		{ "perplexity", cli_cmd_perplexity },
		{ "info", cli_cmd_info },
		{ "restart", cli_cmd_restart }, { "topo", cli_cmd_topo },
		{ "plan", cli_cmd_plan },     { "exec", cli_cmd_exec },
		{ "activations", cli_cmd_activations },
		{ "replay", cli_cmd_replay },
		{ "calibrate", cli_cmd_calibrate },
		{ "session", cli_cmd_session },
	};

	st_log_set_name("strata");
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
	    !strcmp(argv[1], "help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("strata %s\n", ST_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[1], cmds[i].name))
			return cmds[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "strata: unknown command '%s' (see strata --help)\n",
		argv[1]);
	return 2;
}
