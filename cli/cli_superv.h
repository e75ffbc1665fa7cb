/*
 * cli_superv.h — the supervisor of an instance started by `strata up`: a
 * small process that starts the three daemons as its children and starts
 * again, with the options `strata up` gave it, any daemon that dies
 * (crashed, killed), with back-off and a crash-loop limit.  Restarts are
 * logged in <run_dir>/supervisor.log and counted in
 * <run_dir>/supervisor.state (st_superv.h), which `strata status` and
 * computed's /metrics show.  `strata down` stops it first.
 */
#ifndef CLI_SUPERV_H
#define CLI_SUPERV_H

#include "cli_instance.h"

/* Default crash-loop limit: a daemon is restarted at most this many times
 * in a row when each time it died within CLI_SUPERV_QUICK_S seconds of its
 * start (as systemd's StartLimitBurst); the next such death ends it. */
#define CLI_SUPERV_LIMIT 5
#define CLI_SUPERV_QUICK_S 10

/*
 * Starts the supervisor of inst (a child process in its own session),
 * which starts the daemons (cli_instance_up, timeout_s each) and from then
 * on keeps them running; restart_limit: the crash-loop limit (0: never
 * restart, only watch).  In this process: waits for the start's outcome
 * and returns 0 with inst's pids filled, or negative with diag (nothing
 * left running).  The daemons' start-up warnings reach our stderr.
 */
int cli_superv_start(struct cli_instance *inst, int timeout_s,
		     int restart_limit, struct st_diag *diag);

/*
 * Stops the supervisor of the instance at run_dir (SIGTERM, then SIGKILL
 * after timeout_ms), leaving the daemons to the caller, and removes its
 * pid file.  0 when none ran or it stopped, 1 when it had to be killed.
 */
int cli_superv_stop(const char *run_dir, int timeout_ms);

/* Pid of the live supervisor of the instance at run_dir, else 0. */
int cli_superv_pid(const char *run_dir);

/*
 * The pid that <run_dir>/supervisor.pid names when that process is gone
 * (killed: a kill -9 leaves its pid file, a clean stop removes it), else 0
 * (no supervisor was started there, or it lives).  A dead supervisor
 * takes the instance's public HTTP port with it (it is the front,
 * cli_proxy.h) and restarts nothing; a new one cannot adopt the daemons
 * (they are not its children), so the way back is strata down + up.
 */
int cli_superv_dead_pid(const char *run_dir);

/* Writes to f what to do about the dead supervisor dead_pid of instance
 * `name` ("supervisor dead (pid N): ...", three lines, the second and
 * third indented by `indent`; the caller writes the first's prefix). */
void cli_superv_dead_hint(FILE *f, const char *indent, const char *name,
			  int dead_pid);

#endif
