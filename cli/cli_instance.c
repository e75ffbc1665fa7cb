/* cli_instance.c — see cli_instance.h. */
#include "cli_instance.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cw_client.h"
#include "st_daemon.h"
#include "st_shm.h"
#include "st_util.h"

static const char *const k_daemons[3] = { "expertd", "kvd", "computed" };

int cli_find_daemon(const char *name, char *buf, size_t len,
		    struct st_diag *diag)
{
	char exe[4096], dir[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	const char *path;

	if (n > 0) {
		char *slash;

		exe[n] = 0;
		snprintf(dir, sizeof(dir), "%s", exe);
		slash = strrchr(dir, '/');
		if (slash)
			*slash = 0;
		snprintf(buf, len, "%s/%s", dir, name);
		if (access(buf, X_OK) == 0)
			return 0;
		snprintf(buf, len, "%s/../%s/%s", dir, name, name);
		if (access(buf, X_OK) == 0)
			return 0;
	}
	path = getenv("PATH");
	while (path && *path) {
		const char *end = strchr(path, ':');
		size_t l = end ? (size_t)(end - path) : strlen(path);

		snprintf(buf, len, "%.*s/%s", (int)l, path, name);
		if (l && access(buf, X_OK) == 0)
			return 0;
		path = end ? end + 1 : NULL;
	}
	return st_diag_set(diag, -ENOENT,
			   "cannot find the %s executable next to strata, in "
			   "the build tree or on PATH; build with 'ninja -C "
			   "build' first", name);
}

static void log_tail(const char *run_dir, const char *daemon, char *out,
		     size_t cap)
{
	char path[4200], *txt = NULL;
	size_t n = 0, start;
	int lines = 0;

	out[0] = 0;
	st_run_path(run_dir, daemon, "log", path, sizeof(path));
	if (st_read_file(path, &txt, &n) < 0)
		return;
	start = n;
	while (start > 0 && lines < 6) {
		start--;
		if (txt[start] == '\n' && start + 1 < n)
			lines++;
	}
	snprintf(out, cap, "%s", txt + start + (txt[start] == '\n'));
	free(txt);
}

static int spawn(const struct cli_instance *inst, const char *daemon,
		 char *const argv[], int *ret_pid, struct st_diag *diag)
{
	char exe[4096], logp[4200];
	pid_t pid;
	int fd, r;

	r = cli_find_daemon(daemon, exe, sizeof(exe), diag);
	if (r < 0)
		return r;
	st_run_path(inst->run_dir, daemon, "log", logp, sizeof(logp));
	fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return st_diag_set(diag, -errno, "cannot create %s: %s", logp,
				   strerror(errno));
	pid = fork();
	if (pid < 0) {
		close(fd);
		return st_diag_set(diag, -errno, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		dup2(fd, 1);
		dup2(fd, 2);
		/* own process group: a ^C on the terminal reaches strata,
		 * which then stops the daemons in order */
		setpgid(0, 0);
		execv(exe, argv);
		fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(fd);
	*ret_pid = pid;
	return 0;
}

/* Waits until the daemon's REP socket answers PING, or it exits. */
static int wait_ready(const struct cli_instance *inst, const char *daemon,
		      int pid, int timeout_s, struct st_diag *diag)
{
	uint64_t deadline = st_now_ns() + (uint64_t)timeout_s * 1000000000ull;
	char ctl[4200], tail[2048];

	st_run_path(inst->run_dir, daemon, "ctl", ctl, sizeof(ctl));
	while (st_now_ns() < deadline) {
		int status;

		if (waitpid(pid, &status, WNOHANG) == pid) {
			log_tail(inst->run_dir, daemon, tail, sizeof(tail));
			return st_diag_set(diag, -ST_E_PEERGONE,
					   "%s exited during start-up (status "
					   "%d); its log says:\n%s", daemon,
					   WIFEXITED(status) ?
						   WEXITSTATUS(status) : -1,
					   tail);
		}
		if (st_path_exists(ctl) && st_daemon_ping(ctl, 500, NULL) == 0)
			return 0;
		st_sleep_ns(50000000ull);
	}
	log_tail(inst->run_dir, daemon, tail, sizeof(tail));
	return st_diag_set(diag, -ST_E_TIMEOUT,
			   "%s did not become ready in %d s; its log says:\n%s",
			   daemon, timeout_s, tail);
}

/* Starts one daemon with --instance/--run-dir, the store when it takes
 * one, and an optional extra option, then waits until it answers. */
static int start_one(struct cli_instance *inst, const char *daemon,
		     int with_store, const char *opt, const char *val,
		     const char *opt2, const char *val2,
		     int *ret_pid, int timeout_s, struct st_diag *diag)
{
	char *argv[14];
	int a = 0, r;

	argv[a++] = (char *)daemon;
	if (with_store) {
		argv[a++] = "--store";
		argv[a++] = inst->store_dir;
	}
	argv[a++] = "--instance";
	argv[a++] = inst->name;
	argv[a++] = "--run-dir";
	argv[a++] = inst->run_dir;
	if (val && val[0]) {
		argv[a++] = (char *)opt;
		argv[a++] = (char *)val;
	}
	if (val2 && val2[0]) {
		argv[a++] = (char *)opt2;
		argv[a++] = (char *)val2;
	}
	argv[a] = NULL;
	r = spawn(inst, daemon, argv, ret_pid, diag);
	return r ? r : wait_ready(inst, daemon, *ret_pid, timeout_s, diag);
}

int cli_instance_up(struct cli_instance *inst, int timeout_s,
		    struct st_diag *diag)
{
	int r = st_run_dir_prepare(inst->run_dir, diag);

	if (r < 0)
		return r;
	/* expertd, then kvd, then computed, which connects to both */
	r = start_one(inst, "expertd", 1, "--host-budget", inst->host_budget,
		      NULL, NULL, &inst->pid_expertd, timeout_s, diag);
	if (!r)
		r = start_one(inst, "kvd", 0, "--budget", inst->kv_budget,
			      "--spill-budget", inst->kv_spill, &inst->pid_kvd,
			      timeout_s, diag);
	if (!r && !inst->tiers_only)
		r = start_one(inst, "computed", 1, "--kv-dtype", inst->kv_dtype,
			      "--http-port", inst->http_port,
			      &inst->pid_computed, timeout_s, diag);
	inst->started_by_us = 1;
	if (r < 0)
		cli_instance_down(inst);
	return r;
}

void cli_instance_read_pids(struct cli_instance *inst)
{
	inst->pid_expertd = st_pidfile_read(inst->run_dir, "expertd");
	inst->pid_kvd = st_pidfile_read(inst->run_dir, "kvd");
	inst->pid_computed = st_pidfile_read(inst->run_dir, "computed");
}

int cli_instance_state(const struct cli_instance *inst)
{
	int up = 0;

	for (int i = 0; i < 3; i++) {
		char ctl[4200];

		st_run_path(inst->run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
		if (st_path_exists(ctl) && st_daemon_ping(ctl, 1000, NULL) == 0)
			up++;
	}
	return up;
}

int cli_instance_running(const struct cli_instance *inst)
{
	char ctl[4200];

	st_run_path(inst->run_dir, "computed", "ctl", ctl, sizeof(ctl));
	return st_path_exists(ctl) && st_daemon_ping(ctl, 1000, NULL) == 0;
}

/* Waits for pid to exit (reaping it when it is our child). */
static int wait_exit(int pid, int timeout_ms)
{
	uint64_t deadline = st_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	while (st_now_ns() < deadline) {
		int status;

		if (waitpid(pid, &status, WNOHANG) == pid)
			return 0;
		if (!st_pid_alive(pid))
			return 0;
		st_sleep_ns(20000000ull);
	}
	return -ST_E_TIMEOUT;
}

static void remove_dead_segments(const char *instance)
{
	char prefix[128];
	struct dirent *de;
	DIR *d = opendir("/dev/shm");
	size_t pl;

	if (!d)
		return;
	pl = (size_t)snprintf(prefix, sizeof(prefix), "strata.%s.", instance);
	while ((de = readdir(d))) {
		char name[300];
		struct st_shm_header h;
		int fd;

		if (strncmp(de->d_name, prefix, pl))
			continue;
		snprintf(name, sizeof(name), "/%s", de->d_name);
		fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
		if (fd < 0)
			continue;
		if (pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
		    st_pid_alive(atomic_load(&h.owner_pid))) {
			close(fd); /* a live owner's segment is never removed */
			continue;
		}
		close(fd);
		shm_unlink(name);
	}
	closedir(d);
}

int cli_instance_down(struct cli_instance *inst)
{
	int *pids[3] = { &inst->pid_expertd, &inst->pid_kvd,
			 &inst->pid_computed };
	int killed = 0;

	/* stop in reverse start order: computed first, so it releases its
	 * pins and pages while the tier daemons still run */
	for (int i = 2; i >= 0; i--) {
		char ctl[4200];
		int pid = *pids[i];

		if (!pid)
			pid = st_pidfile_read(inst->run_dir, k_daemons[i]);
		st_run_path(inst->run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
		if (pid && st_pid_alive(pid)) {
			st_daemon_shutdown(ctl, 2000);
			if (wait_exit(pid, 5000) < 0) {
				kill(pid, SIGTERM);
				if (wait_exit(pid, 5000) < 0) {
					kill(pid, SIGKILL);
					wait_exit(pid, 5000);
					killed++;
				}
			}
		} else if (pid) {
			waitpid(pid, NULL, WNOHANG);
		}
		unlink(ctl);
		st_run_path(inst->run_dir, k_daemons[i], "evt", ctl, sizeof(ctl));
		unlink(ctl);
		st_pidfile_remove(inst->run_dir, k_daemons[i]);
		*pids[i] = 0;
	}
	remove_dead_segments(inst->name);
	return killed;
}
