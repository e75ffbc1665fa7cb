/*
 * st_superv.h — the state file of an instance's supervisor (the process
 * `strata up` leaves behind to restart a daemon that dies): how often each
 * daemon was restarted and why, read by `strata status` and by computed's
 * /metrics.  The supervisor itself lives in cli/cli_superv.c.
 *
 * <run_dir>/supervisor.state, text, one line per daemon:
 *   <daemon> <pid> <restarts> <state> <last-exit>
 * state: running | restarting | stopped (exited cleanly, not restarted) |
 * gave-up (crash-loop limit reached); last-exit: "-", "exit-N",
 * "signal-N", "gone" (a daemon not started by the supervisor) or
 * "strata-restart" (stopped by `strata restart`, which starts the next
 * one; not counted in restarts).  The file
 * is replaced whole (rename), so a reader never sees half of it.
 */
#ifndef ST_SUPERV_H
#define ST_SUPERV_H

#include <stdint.h>

#define ST_SUPERV_DAEMONS 3
/* last-exit of a daemon `strata restart` stopped (a deliberate restart) */
#define ST_SUPERV_EXIT_RESTART "strata-restart"

struct st_superv_daemon {
	char name[16];       /* expertd, kvd, computed */
	int pid;             /* the daemon's pid, 0 when none runs */
	uint32_t restarts;   /* restarts after a crash, since strata up */
	char state[16];      /* running, restarting, stopped, gave-up */
	char last_exit[32];  /* how the last one ended: "-" when none did */
};

struct st_superv_state {
	struct st_superv_daemon d[ST_SUPERV_DAEMONS];
};

/* Writes s as <run_dir>/supervisor.state (a temporary file renamed over
 * it).  0 or a negative errno-style code (a full file system included). */
int st_superv_state_write(const char *run_dir, const struct st_superv_state *s);

/* Reads <run_dir>/supervisor.state into *ret (zeroed first).  0,
 * -ENOENT when there is none (no supervisor ever ran there), or
 * -ST_E_FORMAT when a line does not parse. */
int st_superv_state_read(const char *run_dir, struct st_superv_state *ret);

#endif
