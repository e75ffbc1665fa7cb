/* st_daemon.c — see st_daemon.h. */
#include "st_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st_msg.h"
#include "st_util.h"

int st_run_dir_default(const char *instance, char *buf, size_t len)
{
	const char *e = getenv("STRATA_RUN_DIR");
	int n;

	if (e && *e)
		n = snprintf(buf, len, "%s", e);
	else if (geteuid() == 0)
		n = snprintf(buf, len, "/run/strata/%s", instance);
	else if ((e = getenv("XDG_RUNTIME_DIR")) && *e)
		n = snprintf(buf, len, "%s/strata/%s", e, instance);
	else
		n = snprintf(buf, len, "/tmp/strata-%u/%s",
			     (unsigned)getuid(), instance);
	return n >= (int)len ? -ENAMETOOLONG : 0;
}

int st_run_dir_prepare(const char *run_dir, struct st_diag *diag)
{
	struct stat st;
	int r = st_mkdir_p(run_dir, 0700);

	if (r < 0)
		return st_diag_set(diag, r, "cannot create run directory %s: %s",
				   run_dir, st_strerror(r));
	if (stat(run_dir, &st) < 0)
		return st_diag_set(diag, -errno, "run directory %s: %s",
				   run_dir, strerror(errno));
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
		return st_diag_set(diag, -EPERM,
				   "run directory %s is not a directory owned "
				   "by us", run_dir);
	if (st.st_mode & 077) {
		if (chmod(run_dir, 0700) < 0)
			return st_diag_set(diag, -errno,
					   "run directory %s: cannot make it "
					   "0700", run_dir);
	}
	return 0;
}

int st_run_path(const char *run_dir, const char *daemon, const char *suffix,
		char *buf, size_t len)
{
	return snprintf(buf, len, "%s/%s.%s", run_dir, daemon, suffix) >=
			       (int)len ?
		       -ENAMETOOLONG :
		       0;
}

int st_pidfile_write(const char *run_dir, const char *daemon)
{
	char path[4096], txt[32];
	int n, r;

	if (st_run_path(run_dir, daemon, "pid", path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	n = snprintf(txt, sizeof(txt), "%d\n", (int)getpid());
	r = st_write_file(path, txt, (size_t)n);
	/* a full file system leaves an empty file behind: a pid file that
	 * names no process would make `strata down` miss this daemon */
	if (r < 0)
		unlink(path);
	return r;
}

int st_pidfile_read(const char *run_dir, const char *daemon)
{
	char path[4096], txt[32];
	ssize_t n;
	int fd, pid;

	if (st_run_path(run_dir, daemon, "pid", path, sizeof(path)) < 0)
		return 0;
	/* a bounded read: a pid file is a few digits, and what is there
	 * instead (a device, a huge file) must not hang or flood us */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return 0;
	n = read(fd, txt, sizeof(txt) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	txt[n] = 0;
	pid = atoi(txt);
	return pid > 0 ? pid : 0;
}

void st_pidfile_remove(const char *run_dir, const char *daemon)
{
	char path[4096];

	if (st_run_path(run_dir, daemon, "pid", path, sizeof(path)) == 0)
		unlink(path);
}

/* 1 if pid is gone or a zombie ("Z"/"X" in /proc/PID/stat), else 0. */
static int pid_gone(int pid)
{
	char path[64], *txt = NULL, *p;
	int gone = 0;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 1;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if (st_read_file(path, &txt, NULL) < 0)
		return 0; /* no /proc: kill said it exists */
	/* "pid (comm) S ...": comm may hold ')', the state follows the
	 * last one */
	p = strrchr(txt, ')');
	if (p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'))
		gone = 1;
	free(txt);
	return gone;
}

int st_daemon_down(const char *run_dir, const char *daemon, int ping_ms)
{
	char path[4096];
	int pid = st_pidfile_read(run_dir, daemon);

	if (pid > 0)
		return pid_gone(pid);
	if (st_run_path(run_dir, daemon, "ctl", path, sizeof(path)) < 0)
		return 0;
	return st_daemon_ping(path, ping_ms, NULL) != 0;
}

int st_stop_signals_open(void)
{
	sigset_t set;
	int fd;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	errno = pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (errno)
		return -errno;
	fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int st_stop_signals_pending(int fd)
{
	struct signalfd_siginfo si;

	return read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si);
}

static int simple_call(const char *ctl_path, int timeout_ms, uint16_t type,
		       const void *payload, size_t payload_len,
		       int32_t *ret_pid)
{
	struct st_sock s;
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = st_sock_open(&s, ST_SOCK_REQ, ctl_path, timeout_ms, timeout_ms);

	if (r < 0)
		return r;
	r = st_rpc_call(&s, type, ((uint64_t)getpid() << 32) | 7, 0, payload,
			payload_len, &buf, &p, &n);
	if (r == 0 && ret_pid && n >= 4)
		memcpy(ret_pid, p, 4);
	free(buf);
	st_sock_close(&s);
	return r;
}

int st_daemon_ping(const char *ctl_path, int timeout_ms, int32_t *ret_pid)
{
	return simple_call(ctl_path, timeout_ms, ST_MSG_PING, NULL, 0, ret_pid);
}

int st_daemon_shutdown(const char *ctl_path, int timeout_ms)
{
	return simple_call(ctl_path, timeout_ms, ST_MSG_SHUTDOWN, NULL, 0, NULL);
}

int st_daemon_shutdown_keep_pool(const char *ctl_path, int timeout_ms)
{
	uint8_t pl[4];
	uint32_t f = ST_SHUTDOWN_F_KEEP_POOL;

	/* little-endian u32 (st_proto.h) */
	pl[0] = (uint8_t)f;
	pl[1] = (uint8_t)(f >> 8);
	pl[2] = (uint8_t)(f >> 16);
	pl[3] = (uint8_t)(f >> 24);
	return simple_call(ctl_path, timeout_ms, ST_MSG_SHUTDOWN, pl, 4, NULL);
}
