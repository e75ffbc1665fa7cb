/* cli_session.c — see cli_session.h. */
#include "cli_session.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "cli_registry.h"
#include "st_daemon.h"
#include "st_util.h"

/* Resolves the store of the session's model, converting when needed.
 * 0 or an exit code. */
static int prepare_store(const struct cli_session_opts *o, int sigfd,
			 struct cli_instance *inst)
{
	char model_dir[4096];
	int r;

	if (o->model)
		snprintf(model_dir, sizeof(model_dir), "%s", o->model);
	else if (!o->store &&
		 cli_default_model_dir(model_dir, sizeof(model_dir)) < 0) {
		fprintf(stderr, "%s: no --model given and the embedded "
			"models/kjv-moe is not found\n", o->who);
		return 1;
	}
	if (o->store)
		snprintf(inst->store_dir, sizeof(inst->store_dir), "%s",
			 o->store);
	else if ((r = cli_default_store_dir(model_dir, o->experts,
					    inst->store_dir,
					    sizeof(inst->store_dir))) < 0) {
		if (!st_path_exists(model_dir) || r == -ENAMETOOLONG)
			fprintf(stderr, "%s: model %s: %s\n", o->who,
				model_dir, st_strerror(r));
		else	/* the model is there: the store cache is not */
			fprintf(stderr, "%s: cannot create the store cache "
				"directory of %s: %s; set STRATA_CACHE_DIR to "
				"a writable directory, or give --store DIR\n",
				o->who, inst->store_dir, st_strerror(r));
		return 1;
	}
	inst->store_is_cache = !o->store;
	if (!o->store) /* the API names the model, not its cached store */
		cli_model_name_of(model_dir, inst->model_name,
				  sizeof(inst->model_name));
	if (o->store && o->model && !o->force && st_path_exists(o->store) &&
	    cli_store_refuse_other(o->store, model_dir, o->who))
		return 1;
	if (st_path_exists(inst->store_dir) && o->model &&
	    cli_store_stale(inst->store_dir, model_dir)) {
		fprintf(stderr, "%s: %s is out of date (the checkpoint in %s "
			"changed, or the store format did); converting again\n",
			o->who, inst->store_dir, model_dir);
		return cli_convert(model_dir, inst->store_dir, o->experts, 0, 1,
				   sigfd);
	}
	if (!st_path_exists(inst->store_dir)) {
		if (!o->model && o->store) {
			fprintf(stderr, "%s: store %s does not exist; give "
				"--model to convert one\n", o->who, o->store);
			return 1;
		}
		return cli_convert(model_dir, inst->store_dir, o->experts, 0, 0,
				   sigfd);
	}
	return 0;
}

int cli_session_start(const struct cli_session_opts *o, int sigfd,
		      struct cli_instance *inst)
{
	struct st_diag diag = { "" };
	int running = 0, made_dir, r;

	if (o->instance)
		snprintf(inst->name, sizeof(inst->name), "%s", o->instance);
	else
		snprintf(inst->name, sizeof(inst->name), "run-%d", (int)getpid());
	/* a named instance is where strata up recorded it (the registry,
	 * as strata status finds it), whatever run directory it got */
	if (o->run_dir)
		snprintf(inst->run_dir, sizeof(inst->run_dir), "%s", o->run_dir);
	else if (!o->instance ||
		 cli_registry_lookup(inst->name, inst->run_dir,
				     sizeof(inst->run_dir)) < 0)
		st_run_dir_default(inst->name, inst->run_dir,
				   sizeof(inst->run_dir));
	if (o->instance) {
		running = cli_instance_state(inst);
		if (running > 0 && running < 3) {
			fprintf(stderr, "%s: instance '%s' is only partly "
				"running (%d of 3 daemons answer); stop it with "
				"'strata down --instance %s' and start it "
				"again\n", o->who, inst->name, running,
				inst->name);
			return 1;
		}
	}
	if (running == 3) {
		cli_instance_read_pids(inst);
		if (o->model || o->store || o->host_budget || o->kv_budget ||
		    o->memory_budget ||
		    o->kv_spill || o->kv_remote ||
		    o->kv_dtype || o->compute || o->device_budget ||
		    o->device_kv_budget || strcmp(o->experts, "mxfp4") ||
		    (o->tier && (o->tier->n_es || o->tier->n_cw)))
			fprintf(stderr, "%s: instance '%s' is running with its "
				"own model and settings; --model, --store, "
				"--experts, --kv-dtype, --compute, the budget "
				"and the expert-tier options (--evict, --admit, "
				"--hot-experts ...) are ignored\n", o->who,
				inst->name);
		fprintf(stderr, "%s: using running instance '%s'\n", o->who,
			inst->name);
		return 0;
	}
	r = prepare_store(o, sigfd, inst);
	if (r)
		return r;
	snprintf(inst->host_budget, sizeof(inst->host_budget), "%s",
		 o->host_budget ? o->host_budget : "");
	snprintf(inst->kv_budget, sizeof(inst->kv_budget), "%s",
		 o->kv_budget ? o->kv_budget : "");
	/* checked by cli_check_memory (a size above 0) */
	snprintf(inst->memory_budget, sizeof(inst->memory_budget), "%s",
		 o->memory_budget ? o->memory_budget : "");
	snprintf(inst->kv_spill, sizeof(inst->kv_spill), "%s",
		 o->kv_spill ? o->kv_spill : "");
	snprintf(inst->kv_remote, sizeof(inst->kv_remote), "%s",
		 o->kv_remote ? o->kv_remote : "");
	snprintf(inst->kv_dtype, sizeof(inst->kv_dtype), "%s",
		 o->kv_dtype ? o->kv_dtype : "");
	inst->tier = o->tier;
	snprintf(inst->compute, sizeof(inst->compute), "%s",
		 o->compute ? o->compute : "");
	snprintf(inst->device_budget, sizeof(inst->device_budget), "%s",
		 o->device_budget ? o->device_budget : "");
	snprintf(inst->device_kv_budget, sizeof(inst->device_kv_budget), "%s",
		 o->device_kv_budget ? o->device_kv_budget : "");
	fprintf(stderr, "%s: starting expertd, kvd, computed (instance %s, "
		"run dir %s)\n", o->who, inst->name, inst->run_dir);
	made_dir = !st_path_exists(inst->run_dir);
	r = cli_instance_up(inst, o->timeout_s, &diag);
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", o->who, diag.msg);
		cli_cache_hint(inst, o->who, diag.msg);
		/* what this start made goes (cli_instance_up stopped what it
		 * started): its message above says why */
		if (made_dir && st_rm_rf(inst->run_dir) == 0)
			fprintf(stderr, "%s: removed the run directory %s it "
				"made\n", o->who, inst->run_dir);
		inst->started_by_us = 0;
		return 1;
	}
	return 0;
}

void cli_session_stop(struct cli_instance *inst, int rc, int keep,
		      int keep_dir, const char *who)
{
	if (inst->started_by_us && !keep) {
		int r = cli_instance_down(inst);

		if (r > 0)
			fprintf(stderr, "%s: %d daemon(s) had to be killed\n",
				who, r);
		/* a private instance's run dir goes too, unless its logs
		 * explain a failure */
		if (rc == 0 && !keep_dir)
			st_rm_rf(inst->run_dir);
		else if (rc != 0)
			fprintf(stderr, "%s: daemon logs are in %s\n", who,
				inst->run_dir);
	} else if (inst->started_by_us) {
		fprintf(stderr, "%s: daemons left running (instance %s); stop "
			"them with: strata down --instance %s --run-dir %s\n",
			who, inst->name, inst->name, inst->run_dir);
	}
}
