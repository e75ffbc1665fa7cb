/*
 * st_daemon.h — what every strata daemon and client shares about an
 * instance: its run directory, socket paths, pid files, and clean stop on
 * SIGTERM/SIGINT (through a signalfd, so no handler touches global state).
 *
 * Instance layout (DESIGN.md section 4):
 *   <run_dir>/                 0700
 *   <run_dir>/<daemon>.ctl     REP socket (ipc)
 *   <run_dir>/<daemon>.evt     PUB socket (ipc)
 *   <run_dir>/<daemon>.pid     pid file, removed on clean exit
 *   <run_dir>/<daemon>.args    the daemon's argv, for restarts (strata up)
 *   <run_dir>/<daemon>.lock    held while the daemon is restarted
 *   <run_dir>/supervisor.*     pid, log, state (st_superv.h) and url of
 *                              the supervisor of `strata up`
 * Default run_dir: $STRATA_RUN_DIR, else /run/strata/<instance> when
 * writable (root), else $XDG_RUNTIME_DIR/strata/<instance>, else
 * /tmp/strata-<uid>/<instance>.
 */
#ifndef ST_DAEMON_H
#define ST_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

/* Default instance name when none is given. */
#define ST_DEFAULT_INSTANCE "default"

/* Writes the default run directory of `instance` into buf. 0 or negative. */
int st_run_dir_default(const char *instance, char *buf, size_t len);

/* Creates run_dir (and parents) with mode 0700 and checks it is a directory
 * owned by us with no group/other access.  0 or negative with diag. */
int st_run_dir_prepare(const char *run_dir, struct st_diag *diag);

/* "<run_dir>/<daemon>.<suffix>" into buf.  0 or -ENAMETOOLONG. */
int st_run_path(const char *run_dir, const char *daemon, const char *suffix,
		char *buf, size_t len);

/* Writes our pid into <run_dir>/<daemon>.pid.  0 or -errno (ENOSPC on a
 * full file system, ...); on failure no pid file is left.  A daemon that
 * cannot write it must not serve: nothing could find it to stop it. */
int st_pidfile_write(const char *run_dir, const char *daemon);
/* Reads the pid of a daemon from its pid file; 0 if absent/unreadable. */
int st_pidfile_read(const char *run_dir, const char *daemon);
/* Removes the pid file. */
void st_pidfile_remove(const char *run_dir, const char *daemon);
/*
 * Whether `daemon` of the instance at run_dir is known to be down, cheaply
 * (no socket round trip while it runs): 1 when its pid file names a
 * process that no longer exists or is a zombie (killed, crashed), or when
 * there is no pid file (stopped cleanly) and its ctl socket does not
 * answer a PING within ping_ms; 0 otherwise (running, perhaps hung: only
 * a PING tells that).  For computed's HTTP front to refuse a new request
 * at once instead of waiting out its restart wait.
 */
int st_daemon_down(const char *run_dir, const char *daemon, int ping_ms);

/*
 * Blocks SIGTERM, SIGINT and SIGHUP and returns a non-blocking signalfd for
 * them (>= 0), or -errno.  Also ignores SIGPIPE.  Call before starting
 * threads so they inherit the mask.
 */
int st_stop_signals_open(void);
/* Non-zero if a stop signal is pending on fd (reads it). */
int st_stop_signals_pending(int fd);

/*
 * Sends PING (or SHUTDOWN) with an empty payload to the REP socket at
 * ctl_path (a daemon's <run_dir>/<daemon>.ctl) and returns the reply status
 * (0 = the daemon answered and is ready), or -ST_E_TIMEOUT / -ST_E_NOMSG.
 * *ret_pid is set from a PING reply when non-NULL.
 */
int st_daemon_ping(const char *ctl_path, int timeout_ms, int32_t *ret_pid);
int st_daemon_shutdown(const char *ctl_path, int timeout_ms);

/* SHUTDOWN with ST_SHUTDOWN_F_KEEP_POOL: expertd or kvd exits cleanly and
 * leaves its pool segment for the next one to adopt (a restart that keeps
 * the experts and KV pages computed is using).  Errors as above. */
int st_daemon_shutdown_keep_pool(const char *ctl_path, int timeout_ms);

#endif
