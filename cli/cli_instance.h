/*
 * cli_instance.h — starting, finding and stopping the three daemons of an
 * instance from the strata CLI (the launcher part of `strata run`, `up`,
 * `down`, `status`).
 */
#ifndef CLI_INSTANCE_H
#define CLI_INSTANCE_H

#include <stddef.h>
#include <stdint.h>

#include "cli_tiers.h"
#include "st_error.h"

struct cli_instance {
	char name[64];
	char run_dir[4096];
	char store_dir[4096];
	char host_budget[64];    /* expertd --host-budget, "" = its default */
	char kv_budget[64];      /* kvd --budget, "" = its default */
	char memory_budget[64];  /* expertd's and kvd's --memory-budget (one
				  * budget shared by both; host_budget and
				  * kv_budget are then floors), "" = none */
	char kv_spill[64];       /* kvd --spill-budget, "" = no spilling */
	char kv_remote[512];     /* kvd --remote-kv, "" = no remote tier */
	char kv_session_dir[4096]; /* kvd --session-dir, "" = its default */
	char kv_dtype[16];       /* computed --kv-dtype */
	char numa[16];           /* every daemon's --numa, "" = no binding */
	char loader_threads[16]; /* expertd --loader-threads, "" = default */
	char max_seqs[16];       /* kvd --max-seqs, "" = default */
	char max_rows_per_seq[16]; /* kvd --max-rows-per-seq, "" = the
				    * model's context (cli_instance_kv_rows) */
	char page_rows[16];      /* computed --page-rows, "" = default */
	char threads[16];        /* computed --threads, "" = default */
	char compute[16];        /* computed --compute (reference|fast) */
	char http_port[16];      /* computed --http-port, "" = no HTTP API */
	char http_bind[64];      /* computed --http-bind, "" = its default */
	char max_running[16];    /* computed --max-running, "" = default */
	char max_queued[16];     /* computed --max-queued, "" = default */
	char max_step_tokens[16]; /* computed --max-step-tokens, "" = default */
	char speculate[16];      /* computed --speculate, "" = default (off) */
	char kv_restore_ahead[8]; /* computed --kv-restore-ahead on|off, "" =
				   * its default (on) */
	char chat_template[16];  /* computed --chat-template, "" = auto */
	char model_name[256];    /* computed --model-name, "" = its default */
	int metrics_auth;        /* computed --metrics-auth */
	char http_request_timeout[16]; /* computed's, "" = its default */
	char http_idle_timeout[16];    /* computed's, "" = its default */
	char http_max_client_conns[16]; /* computed's (or the HTTP front's
					 * under a supervisor), "" = default */
	int store_is_cache;      /* store_dir is strata's cache of a --model
				  * checkpoint (made by convert, not named) */
	char device_budget[64];  /* computed --device-budget, "" = default */
	char device_kv_budget[64]; /* computed --device-kv-budget, "" = default */
	int pid_expertd, pid_kvd, pid_computed;
	int started_by_us;       /* 1 when this process spawned them */
	const struct cli_tier_args *tier; /* extra daemon options, or NULL */
	int tiers_only;          /* up: start expertd and kvd only (benchmarks
				  * and tests run the model in-process) */
	int no_supervise;        /* up: no supervisor (nothing restarts) */
	int force_store;         /* up --force: a named store of another
				  * model is replaced by --model's */
	int restart_limit;       /* up: the supervisor's crash-loop limit */
	int has_stop_fd, stop_fd; /* a signalfd (st_stop_signals_open) that
				   * cancels a start waiting for readiness */
};

/* After a failure whose message msg names "strata convert" as the remedy
 * (a damaged or outdated store): when inst's store is strata's cache of a
 * checkpoint, says on stderr which directory to remove so that the next
 * run converts it anew (the daemons cannot know the store is a cache). */
void cli_cache_hint(const struct cli_instance *inst, const char *who,
		    const char *msg);

/* The model id a checkpoint directory gives the HTTP API: its last path
 * component (trailing slashes ignored), e.g. "kjv-moe" for
 * models/kjv-moe/ (computed's own default, the store's name, would be the
 * cache's "kjv-moe-<hash>-mxfp4").  ret: cap bytes; "" when dir has no
 * name. */
void cli_model_name_of(const char *dir, char *ret, size_t cap);

/* Paths of the daemon executables: next to the strata binary, in the build
 * tree layout (../expertd/expertd), or on $PATH.  Returns 0 or -ENOENT with
 * diag naming the daemon. */
int cli_find_daemon(const char *name, char *buf, size_t len,
		    struct st_diag *diag);

/*
 * Sets inst->max_rows_per_seq, when empty, to the context of the model in
 * inst->store_dir (its config's max_position_embeddings, through
 * kv_rows_per_seq_for_context): kvd then sizes a sequence, and its KV
 * floor under --memory-budget, for what the model can use.  A config that
 * cannot be read leaves it empty (kvd's default); the store's own checks
 * say what is wrong with it when the daemons open it.
 */
void cli_instance_kv_rows(struct cli_instance *inst);

/*
 * Starts expertd, kvd, then computed for inst (logs in <run_dir>/<d>.log),
 * each waited for until it answers PING (timeout_s seconds each).  On
 * failure stops what was started and puts the daemon's last log lines in
 * diag.
 */
int cli_instance_up(struct cli_instance *inst, int timeout_s,
		    struct st_diag *diag);

/*
 * Stops the daemons of inst: SHUTDOWN request, then SIGTERM, then SIGKILL
 * after a grace period; removes leftover sockets, pid files and the
 * instance's shm segments whose owners are dead.  Returns 0 or the number
 * of daemons that had to be killed (> 0) or a negative code.
 */
int cli_instance_down(struct cli_instance *inst);

/* How many of the instance's three daemons answer PING (0..3): within
 * 1 s each, and where only some did, the others within 5 s more (a busy
 * daemon is not a dead one; a dead one refuses at once). */
int cli_instance_state(const struct cli_instance *inst);

/*
 * When the up (> 0) daemons that answer in inst's run dir are another
 * instance's (the --instance of the first answering daemon's command
 * line, /proc/<pid>/cmdline): -EEXIST with diag naming that instance and
 * what to do (another --run-dir, or stop it).  0 when they are inst's own
 * or their name cannot be read (the caller's "already running" holds).
 */
int cli_instance_check_owner(const struct cli_instance *inst, int up,
			     struct st_diag *diag);

/* 1 if computed of the instance answers PING (ready), else 0. */
int cli_instance_running(const struct cli_instance *inst);

/* Fills the pids from the pid files.  */
void cli_instance_read_pids(struct cli_instance *inst);

/*
 * Replaces this process with one daemon of inst, started with exactly the
 * options cli_instance_up gives it (for the systemd units: the daemon
 * keeps our pid, so its sd_notify readiness reaches systemd).  Only
 * returns on failure: negative with diag.
 */
int cli_instance_exec(struct cli_instance *inst, const char *daemon,
		      struct st_diag *diag);

/* Room for a daemon's argv (cli_instance_argv): its own options
 * (computed has the most: 45 with the program name), the tier options,
 * the NULL. */
#define CLI_DAEMON_ARGV_MAX (52 + CLI_MAX_EXTRA_ARGS)

/* The argv of a daemon ("expertd", "kvd", "computed") of inst: its name,
 * then the options inst gives it, NULL-terminated (at most
 * CLI_DAEMON_ARGV_MAX entries).  The strings are inst's (or static):
 * valid while inst is. */
void cli_instance_argv(struct cli_instance *inst, const char *daemon,
		       char **argv);

/* Index of a daemon name ("expertd", "kvd", "computed") or -1. */
int cli_daemon_index(const char *daemon);

/*
 * Stops one daemon of a running instance cleanly (SHUTDOWN request, then
 * SIGTERM, SIGKILL after a grace period) and starts it again with the
 * arguments `strata up` gave it (kept in <run_dir>/<daemon>.args), its
 * log appended to.  Waits until it answers PING (timeout_s).  The other
 * daemons keep running; whether a generation in flight survives a tier
 * daemon's restart is computed's business (DESIGN.md section 6), not the
 * launcher's.  0, or negative with diag.
 */
int cli_instance_restart(struct cli_instance *inst, const char *daemon,
			 int timeout_s, struct st_diag *diag);

/* As cli_instance_restart, with the daemon's restart lock
 * (cli_instance_lock_daemon) already held by the caller. */
int cli_instance_restart_locked(struct cli_instance *inst, const char *daemon,
				int timeout_s, struct st_diag *diag);

/*
 * Takes <run_dir>/<daemon>.lock (flock, exclusive): held by whoever
 * restarts the daemon (`strata restart`, the supervisor), so that the
 * supervisor never restarts a daemon that `strata restart` is replacing.
 * wait: block until free, else -EBUSY when held.  Returns the lock's fd
 * (close it to release) or a negative code.
 */
int cli_instance_lock_daemon(const struct cli_instance *inst,
			     const char *daemon, int wait);

/* The base URL of the instance's HTTP API ("http://127.0.0.1:8080"), from
 * the options computed was started with (<run_dir>/computed.args).  0,
 * or -ENOENT when computed serves no HTTP API (or was not started by
 * strata up); ret: cap bytes, "" on failure. */
int cli_instance_url(const char *run_dir, char *ret, size_t cap);

/* 1 when a TCP connection to url's host and port ("http://HOST:PORT",
 * "http://[V6]:PORT") is accepted within timeout_ms, else 0 (refused,
 * timed out, unparsable).  Opens and closes one connection: no request. */
int cli_url_answers(const char *url, int timeout_ms);

#endif
