/*
 * cli_session.h — what `strata run` and `strata perplexity` share: find or
 * make the store, then use a running instance or start a private one, and
 * afterwards stop what was started.
 */
#ifndef CLI_SESSION_H
#define CLI_SESSION_H

#include "cli_instance.h"

struct cli_session_opts {
	const char *model, *store, *experts;     /* experts: "mxfp4" default */
	int force;          /* a named store of another model is replaced */
	const char *instance, *run_dir;          /* NULL: private instance */
	const char *host_budget, *kv_budget, *kv_spill, *kv_dtype;
	const char *memory_budget; /* shared by expertd and kvd (their
				    * budgets then floors), NULL: none */
	const char *kv_remote;   /* kvd --remote-kv URL, NULL: off */
	const char *compute;                     /* NULL: reference mode */
	const char *device_budget, *device_kv_budget; /* NULL: computed's */
	int timeout_s;
	const char *who;                         /* "strata run", for messages */
	const struct cli_tier_args *tier;        /* expert-tier options or NULL */
};

/*
 * Fills inst: a running instance named o->instance (its model and budget
 * options are then ignored, with a warning), or a private or named one
 * started here after converting the model when it has no (up-to-date)
 * store.  A stop signal on sigfd cancels a conversion.  Returns 0, or the
 * exit code to use (1, or 130 when interrupted), having printed why.
 */
int cli_session_start(const struct cli_session_opts *o, int sigfd,
		      struct cli_instance *inst);

/*
 * Stops the daemons if this process started them and keep is 0; removes
 * a private instance's run directory after success (named: keep_dir), and
 * says where the logs are after a failure (rc != 0).
 */
void cli_session_stop(struct cli_instance *inst, int rc, int keep,
		      int keep_dir, const char *who);

#endif
