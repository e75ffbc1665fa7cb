/* cli_instance.c — see cli_instance.h. */
#include "cli_instance.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cw_client.h"
#include "kv_pool.h"
#include "st_daemon.h"
#include "st_plan.h"
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

static void log_tail(const char *run_dir, const char *daemon, off_t from,
		     char *out, size_t cap)
{
	char path[4200], *txt = NULL;
	size_t n = 0, start, first;
	int lines = 0;

	out[0] = 0;
	st_run_path(run_dir, daemon, "log", path, sizeof(path));
	if (st_read_file(path, &txt, &n) < 0)
		return;
	/* the lines of this start only: an appended log also holds the
	 * earlier starts' (whose errors would read as this one's) */
	first = from > 0 && (size_t)from <= n ? (size_t)from : 0;
	start = n;
	while (start > first && lines < 6) {
		start--;
		if (txt[start] == '\n' && start + 1 < n)
			lines++;
	}
	snprintf(out, cap, "%s",
		 txt + start + (start > first && txt[start] == '\n'));
	free(txt);
}

/* Size of the daemon's log now (0 when there is none): where the lines of
 * a start that appends to it begin. */
static off_t log_size(const struct cli_instance *inst, const char *daemon)
{
	char path[4200];
	struct stat sb;

	st_run_path(inst->run_dir, daemon, "log", path, sizeof(path));
	return stat(path, &sb) == 0 ? sb.st_size : 0;
}

/* Echoes to stderr the warnings the daemon logged since byte `from` of
 * its log (its start-up: a hot set that does not fit, a spill file on
 * tmpfs, a pool that kept an older geometry ...), which would otherwise
 * sit unread in <run_dir>/<daemon>.log. */
static void echo_warnings(const struct cli_instance *inst, const char *daemon,
			  off_t from)
{
	char path[4200], *txt = NULL, *line, *save = NULL;
	size_t n = 0;

	st_run_path(inst->run_dir, daemon, "log", path, sizeof(path));
	if (st_read_file(path, &txt, &n) < 0)
		return;
	if ((size_t)from < n) {
		for (line = strtok_r(txt + from, "\n", &save); line;
		     line = strtok_r(NULL, "\n", &save)) {
			const char *w = strstr(line, "] warn: ");

			if (w)
				fprintf(stderr, "strata: %s warns: %s\n",
					daemon, w + 8);
		}
	}
	free(txt);
}

/* Starts the daemon with argv (argv[0] its name) logging to
 * <run_dir>/<daemon>.log (appended to when append, else truncated). */
static int spawn(const struct cli_instance *inst, const char *daemon,
		 char *const argv[], int append, int *ret_pid,
		 struct st_diag *diag)
{
	char exe[4096], logp[4200];
	pid_t pid;
	int fd, r;

	r = cli_find_daemon(daemon, exe, sizeof(exe), diag);
	if (r < 0)
		return r;
	st_run_path(inst->run_dir, daemon, "log", logp, sizeof(logp));
	fd = open(logp, O_WRONLY | O_CREAT | O_CLOEXEC |
		  (append ? O_APPEND : O_TRUNC), 0600);
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

static int wait_exit(int pid, int timeout_ms);

/* Waits until the daemon's REP socket answers PING, or it exits; a failure
 * quotes the last lines its log got since byte `from` (this start's). */
static int wait_ready(const struct cli_instance *inst, const char *daemon,
		      int pid, off_t from, int timeout_s, struct st_diag *diag)
{
	uint64_t deadline = st_now_ns() + (uint64_t)timeout_s * 1000000000ull;
	char ctl[4200], tail[2048];

	st_run_path(inst->run_dir, daemon, "ctl", ctl, sizeof(ctl));
	while (st_now_ns() < deadline) {
		int status;

		if (inst->has_stop_fd && st_stop_signals_pending(inst->stop_fd)) {
			/* the supervisor is told to stop while it starts a
			 * daemon: nothing may be left half-started */
			kill(pid, SIGTERM);
			if (wait_exit(pid, 5000) < 0) {
				kill(pid, SIGKILL);
				wait_exit(pid, 5000);
			}
			return st_diag_set(diag, -ECANCELED, "stopped while "
					   "%s was starting", daemon);
		}
		if (waitpid(pid, &status, WNOHANG) == pid) {
			log_tail(inst->run_dir, daemon, from, tail, sizeof(tail));
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
	log_tail(inst->run_dir, daemon, from, tail, sizeof(tail));
	return st_diag_set(diag, -ST_E_TIMEOUT,
			   "%s did not become ready in %d s; its log says:\n%s",
			   daemon, timeout_s, tail);
}

/* Saves argv as <run_dir>/<daemon>.args (NUL-separated, 0600) so that
 * `strata restart` starts the daemon again exactly as `up` did. */
static int save_args(const struct cli_instance *inst, const char *daemon,
		     char *const argv[], struct st_diag *diag)
{
	char path[4200];
	FILE *f;

	st_run_path(inst->run_dir, daemon, "args", path, sizeof(path));
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	f = fd >= 0 ? fdopen(fd, "w") : NULL;
	if (!f) {
		if (fd >= 0)
			close(fd);
		return st_diag_set(diag, -errno, "cannot write %s: %s", path,
				   strerror(errno));
	}
	for (int i = 0; argv[i]; i++)
		fwrite(argv[i], 1, strlen(argv[i]) + 1, f);
	if (fclose(f) != 0)
		return st_diag_set(diag, -EIO, "cannot write %s", path);
	return 0;
}

void cli_cache_hint(const struct cli_instance *inst, const char *who,
		    const char *msg)
{
	if (inst->store_is_cache && msg && strstr(msg, "strata convert"))
		fprintf(stderr, "%s: %s is strata's cache of the model's store: "
			"remove it (rm -rf '%s') and run again to convert it "
			"anew\n", who, inst->store_dir, inst->store_dir);
}

void cli_model_name_of(const char *dir, char *ret, size_t cap)
{
	size_t end = strlen(dir), start;

	while (end > 1 && dir[end - 1] == '/')
		end--;
	start = end;
	while (start > 0 && dir[start - 1] != '/')
		start--;
	snprintf(ret, cap, "%.*s", (int)(end - start), dir + start);
	if (!strcmp(ret, "/") || !strcmp(ret, ".") || !strcmp(ret, ".."))
		ret[0] = 0;
}

/* Appends "--opt val" to argv when val is set. */
static void add_opt(char **argv, int *a, const char *opt, const char *val)
{
	if (val && val[0]) {
		argv[(*a)++] = (char *)opt;
		argv[(*a)++] = (char *)val;
	}
}

void cli_instance_argv(struct cli_instance *inst, const char *daemon,
		       char **argv)
{
	const char *const *extra = NULL;
	int a = 0;

	argv[a++] = (char *)daemon;
	if (strcmp(daemon, "kvd")) {
		argv[a++] = "--store";
		argv[a++] = inst->store_dir;
	}
	argv[a++] = "--instance";
	argv[a++] = inst->name;
	argv[a++] = "--run-dir";
	argv[a++] = inst->run_dir;
	add_opt(argv, &a, "--numa", inst->numa);
	if (!strcmp(daemon, "expertd")) {
		add_opt(argv, &a, "--host-budget", inst->host_budget);
		add_opt(argv, &a, "--memory-budget", inst->memory_budget);
		add_opt(argv, &a, "--loader-threads", inst->loader_threads);
	} else if (!strcmp(daemon, "kvd")) {
		add_opt(argv, &a, "--budget", inst->kv_budget);
		add_opt(argv, &a, "--memory-budget", inst->memory_budget);
		add_opt(argv, &a, "--spill-budget", inst->kv_spill);
		add_opt(argv, &a, "--remote-kv", inst->kv_remote);
		add_opt(argv, &a, "--session-dir", inst->kv_session_dir);
		add_opt(argv, &a, "--max-seqs", inst->max_seqs);
		add_opt(argv, &a, "--max-rows-per-seq",
			inst->max_rows_per_seq);
	} else {
		add_opt(argv, &a, "--kv-dtype", inst->kv_dtype);
		add_opt(argv, &a, "--page-rows", inst->page_rows);
		add_opt(argv, &a, "--threads", inst->threads);
		add_opt(argv, &a, "--compute", inst->compute);
		add_opt(argv, &a, "--http-port", inst->http_port);
		add_opt(argv, &a, "--http-bind", inst->http_bind);
		add_opt(argv, &a, "--max-running", inst->max_running);
		add_opt(argv, &a, "--max-queued", inst->max_queued);
		add_opt(argv, &a, "--max-step-tokens", inst->max_step_tokens);
		add_opt(argv, &a, "--speculate", inst->speculate);
		add_opt(argv, &a, "--kv-restore-ahead",
			inst->kv_restore_ahead);
		add_opt(argv, &a, "--chat-template", inst->chat_template);
		add_opt(argv, &a, "--model-name", inst->model_name);
		add_opt(argv, &a, "--http-request-timeout",
			inst->http_request_timeout);
		add_opt(argv, &a, "--http-idle-timeout",
			inst->http_idle_timeout);
		add_opt(argv, &a, "--http-max-client-conns",
			inst->http_max_client_conns);
		if (inst->metrics_auth)
			argv[a++] = "--metrics-auth";
		add_opt(argv, &a, "--device-budget", inst->device_budget);
		add_opt(argv, &a, "--device-kv-budget",
			inst->device_kv_budget);
	}
	if (inst->tier)
		extra = !strcmp(daemon, "expertd") ? inst->tier->es :
			!strcmp(daemon, "computed") ? inst->tier->cw : NULL;
	for (int i = 0; extra && extra[i]; i++)
		argv[a++] = (char *)extra[i];
	argv[a] = NULL;
}

/* <run_dir>/computed.apikey exists (empty, 0600) while computed runs with
 * an API key ($STRATA_API_KEY, which is never written down): restart
 * then wants the key again instead of opening the HTTP API. */
static int note_api_key(const struct cli_instance *inst,
			struct st_diag *diag)
{
	const char *key = getenv("STRATA_API_KEY");
	char path[4200];

	st_run_path(inst->run_dir, "computed", "apikey", path, sizeof(path));
	if (key && key[0]) {
		int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
			      0600);

		/* without the mark a later restart would open the API to
		 * anyone: no start without it */
		if (fd < 0)
			return st_diag_set(diag, -errno, "cannot create %s: "
					   "%s", path, strerror(errno));
		close(fd);
	} else {
		unlink(path);
	}
	return 0;
}

/* Starts one daemon with --instance/--run-dir, the store when it takes
 * one, and its options from inst, then waits until it answers. */
static int start_one(struct cli_instance *inst, const char *daemon,
		     int *ret_pid, int timeout_s, struct st_diag *diag)
{
	char *argv[CLI_DAEMON_ARGV_MAX];
	off_t from = log_size(inst, daemon);
	int r;

	cli_instance_argv(inst, daemon, argv);
	r = save_args(inst, daemon, argv, diag);
	if (r == 0 && !strcmp(daemon, "computed"))
		r = note_api_key(inst, diag);
	if (r == 0)
		r = spawn(inst, daemon, argv, 1, ret_pid, diag); /* keep the
							 * log of a crash */
	if (r == 0)
		r = wait_ready(inst, daemon, *ret_pid, from, timeout_s, diag);
	return r;
}

int cli_instance_exec(struct cli_instance *inst, const char *daemon,
		      struct st_diag *diag)
{
	char *argv[CLI_DAEMON_ARGV_MAX], exe[4096];
	int r;

	if (cli_daemon_index(daemon) < 0)
		return st_diag_set(diag, -EINVAL, "no daemon '%s' (expertd, kvd "
				   "or computed)", daemon);
	r = st_run_dir_prepare(inst->run_dir, diag);
	if (r == 0)
		r = cli_find_daemon(daemon, exe, sizeof(exe), diag);
	if (r < 0)
		return r;
	cli_instance_argv(inst, daemon, argv);
	r = save_args(inst, daemon, argv, diag);
	if (r < 0)
		return r;
	execv(exe, argv);
	return st_diag_set(diag, -errno, "exec %s: %s", exe, strerror(errno));
}

void cli_instance_kv_rows(struct cli_instance *inst)
{
	struct st_plan_model *m;
	struct st_diag d = { "" };

	if (inst->max_rows_per_seq[0] || !inst->store_dir[0])
		return;
	m = calloc(1, sizeof(*m));
	if (m && st_plan_model_load(inst->store_dir, m, &d) == 0)
		snprintf(inst->max_rows_per_seq, sizeof(inst->max_rows_per_seq),
			 "%u", kv_rows_per_seq_for_context(m->max_context));
	free(m);
}

int cli_instance_up(struct cli_instance *inst, int timeout_s,
		    struct st_diag *diag)
{
	char lockp[4200];
	int r = st_run_dir_prepare(inst->run_dir, diag), lock;
	off_t from[3];

	if (r < 0)
		return r;
	/* one start at a time per run directory: a second `strata up` of
	 * the instance must neither race the first nor, failing, stop the
	 * daemons the first started (flock ends with this process) */
	snprintf(lockp, sizeof(lockp), "%s/up.lock", inst->run_dir);
	lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock < 0)
		return st_diag_set(diag, -errno, "cannot create %s: %s", lockp,
				   strerror(errno));
	if (flock(lock, LOCK_EX | LOCK_NB) < 0) {
		close(lock);
		return st_diag_set(diag, -EBUSY, "instance '%s' is being "
				   "started by another strata process; wait "
				   "for it (strata status --instance %s)",
				   inst->name, inst->name);
	}
	r = cli_instance_state(inst);
	if (r > 0) {
		close(lock);
		if (cli_instance_check_owner(inst, r, diag) < 0)
			return -EEXIST;
		return st_diag_set(diag, -EEXIST, "instance '%s' is already "
				   "running (%d of 3 daemons answer); strata "
				   "down --instance %s stops it", inst->name,
				   r, inst->name);
	}
	cli_instance_kv_rows(inst);
	/* expertd, then kvd, then computed, which connects to both */
	from[0] = log_size(inst, "expertd");
	from[1] = log_size(inst, "kvd");
	from[2] = log_size(inst, "computed");
	r = start_one(inst, "expertd", &inst->pid_expertd, timeout_s, diag);
	if (!r)
		r = start_one(inst, "kvd", &inst->pid_kvd, timeout_s, diag);
	if (!r && !inst->tiers_only)
		r = start_one(inst, "computed", &inst->pid_computed, timeout_s,
			      diag);
	/* after all are up: kvd makes its pool (and spill file) for
	 * computed's geometry, so some start-up warnings come late */
	for (int i = 0; r == 0 && i < 3; i++)
		echo_warnings(inst, k_daemons[i], from[i]);
	inst->started_by_us = 1;
	if (r < 0)
		cli_instance_down(inst);
	close(lock);
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
	int up = 0, answered[3] = { 0 };

	for (int i = 0; i < 3; i++) {
		char ctl[4200];

		st_run_path(inst->run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
		answered[i] = st_path_exists(ctl) &&
			      st_daemon_ping(ctl, 1000, NULL) == 0;
		up += answered[i];
	}
	/* some answered, some not: a daemon busy beyond a second (many
	 * clients at once, a sanitizer build) is asked again for longer
	 * before the instance is called partly running; a dead one refuses
	 * the connection at once */
	for (int i = 0; up > 0 && up < 3 && i < 3; i++) {
		char ctl[4200];

		if (answered[i])
			continue;
		st_run_path(inst->run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
		if (st_path_exists(ctl) && st_daemon_ping(ctl, 5000, NULL) == 0)
			up++;
	}
	return up;
}

/* The --instance of the first daemon answering in run_dir into ret.
 * 0, or -ENOENT. */
static int instance_owner(const char *run_dir, char *ret, size_t cap)
{
	for (int i = 0; i < 3; i++) {
		char ctl[4200], path[64], cmd[8192];
		int32_t pid = 0;
		ssize_t n;
		int fd;

		st_run_path(run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
		if (!st_path_exists(ctl) ||
		    st_daemon_ping(ctl, 1000, &pid) != 0 || pid <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		if (n <= 0)
			continue;
		cmd[n] = 0;
		/* NUL-separated arguments: "--instance" then the name */
		for (char *a = cmd; a < cmd + n; a += strlen(a) + 1) {
			char *v = a + strlen(a) + 1;

			if (!strcmp(a, "--instance") && v < cmd + n && *v) {
				snprintf(ret, cap, "%s", v);
				return 0;
			}
		}
	}
	return -ENOENT;
}

int cli_instance_check_owner(const struct cli_instance *inst, int up,
			     struct st_diag *diag)
{
	char owner[64];

	if (up <= 0 ||
	    instance_owner(inst->run_dir, owner, sizeof(owner)) < 0 ||
	    !strcmp(owner, inst->name))
		return 0;
	return st_diag_set(diag, -EEXIST, "run dir %s is held by instance "
			   "'%s' (%d of 3 of its daemons answer there): give "
			   "'%s' another --run-dir, or stop '%s' first with "
			   "'strata down --instance %s'", inst->run_dir, owner,
			   up, inst->name, owner, owner);
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
	/* the lock files killed daemons left (st_shm_lock): taking and
	 * releasing a lock nobody holds removes its file; a held one (a
	 * live daemon) or another user's is left alone */
	for (int i = 0; i < 2; i++) {
		int lfd;

		if (st_shm_lock(instance, k_daemons[i], &lfd, NULL) == 0)
			st_shm_unlock(instance, k_daemons[i], lfd);
	}
}

int cli_daemon_index(const char *daemon)
{
	for (int i = 0; i < 3; i++)
		if (!strcmp(daemon, k_daemons[i]))
			return i;
	return -1;
}

static int *pid_of(struct cli_instance *inst, int i)
{
	return i == 0 ? &inst->pid_expertd : i == 1 ? &inst->pid_kvd :
			&inst->pid_computed;
}

/* Stops daemon i: SHUTDOWN, then SIGTERM, then SIGKILL; removes its
 * sockets and pid file.  1 when it had to be killed, else 0. */
static int stop_one(struct cli_instance *inst, int i)
{
	char ctl[4200];
	int pid = *pid_of(inst, i), killed = 0;

	if (!pid)
		pid = st_pidfile_read(inst->run_dir, k_daemons[i]);
	st_run_path(inst->run_dir, k_daemons[i], "ctl", ctl, sizeof(ctl));
	if (!pid) {
		/* no pid file (a failed write, a full file system): the
		 * daemon that answers on the socket still says who it is */
		int32_t p = 0;

		if (st_path_exists(ctl) && st_daemon_ping(ctl, 1000, &p) == 0 &&
		    p > 0)
			pid = p;
	}
	if (pid && st_pid_alive(pid)) {
		st_daemon_shutdown(ctl, 2000);
		if (wait_exit(pid, 5000) < 0) {
			kill(pid, SIGTERM);
			if (wait_exit(pid, 5000) < 0) {
				kill(pid, SIGKILL);
				wait_exit(pid, 5000);
				killed = 1;
			}
		}
	} else if (pid) {
		waitpid(pid, NULL, WNOHANG);
	}
	unlink(ctl);
	st_run_path(inst->run_dir, k_daemons[i], "evt", ctl, sizeof(ctl));
	unlink(ctl);
	st_pidfile_remove(inst->run_dir, k_daemons[i]);
	*pid_of(inst, i) = 0;
	return killed;
}

int cli_instance_down(struct cli_instance *inst)
{
	int killed = 0;

	/* stop in reverse start order: computed first, so it releases its
	 * pins and pages while the tier daemons still run */
	for (int i = 2; i >= 0; i--) {
		char args[4200];

		killed += stop_one(inst, i);
		st_run_path(inst->run_dir, k_daemons[i], "args", args,
			    sizeof(args));
		unlink(args);
		st_run_path(inst->run_dir, k_daemons[i], "lock", args,
			    sizeof(args));
		unlink(args);
		if (i == 2) {
			st_run_path(inst->run_dir, "supervisor", "url", args,
				    sizeof(args));
			unlink(args);
		}
	}
	{
		char key[4200];

		st_run_path(inst->run_dir, "computed", "apikey", key,
			    sizeof(key));
		unlink(key);
	}
	remove_dead_segments(inst->name);
	return killed;
}

/* Reads <run_dir>/<daemon>.args into argv (pointers into *ret_buf, which
 * the caller frees).  0 or negative with diag. */
static int load_args(const struct cli_instance *inst, const char *daemon,
		     char **argv, int max, char **ret_buf,
		     struct st_diag *diag)
{
	char path[4200];
	size_t n = 0;
	int r, a = 0;

	st_run_path(inst->run_dir, daemon, "args", path, sizeof(path));
	r = st_read_file(path, ret_buf, &n);
	if (r < 0)
		return st_diag_set(diag, r, "%s: %s; the instance is not "
				   "running (strata down removes it) or was "
				   "not started by strata up: start it with "
				   "strata up", path, st_strerror(r));
	for (size_t off = 0; off < n && a < max - 1;) {
		argv[a++] = *ret_buf + off;
		off += strnlen(*ret_buf + off, n - off) + 1;
	}
	argv[a] = NULL;
	if (!a || strcmp(argv[0], daemon)) {
		free(*ret_buf);
		*ret_buf = NULL;
		return st_diag_set(diag, -ST_E_FORMAT, "%s is damaged; restart "
				   "the whole instance (strata down, strata "
				   "up)", path);
	}
	return 0;
}

int cli_instance_lock_daemon(const struct cli_instance *inst,
			     const char *daemon, int wait)
{
	char path[4200];
	int fd, r;

	if (st_run_path(inst->run_dir, daemon, "lock", path, sizeof(path)) < 0)
		return -ENAMETOOLONG;
	/* O_CLOEXEC: a daemon spawned meanwhile must not inherit the lock */
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	r = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
	if (r < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		close(fd);
		return r;
	}
	return fd;
}

int cli_instance_restart(struct cli_instance *inst, const char *daemon,
			 int timeout_s, struct st_diag *diag)
{
	int lock, r;

	if (cli_daemon_index(daemon) < 0)
		return st_diag_set(diag, -EINVAL, "no daemon '%s' (expertd, kvd "
				   "or computed)", daemon);
	lock = cli_instance_lock_daemon(inst, daemon, 1);
	if (lock < 0)
		return st_diag_set(diag, lock, "cannot lock %s/%s.lock: %s",
				   inst->run_dir, daemon, st_strerror(lock));
	r = cli_instance_restart_locked(inst, daemon, timeout_s, diag);
	close(lock);
	return r;
}

int cli_instance_restart_locked(struct cli_instance *inst, const char *daemon,
				int timeout_s, struct st_diag *diag)
{
	char *argv[CLI_DAEMON_ARGV_MAX], *buf = NULL;
	int i = cli_daemon_index(daemon), r;
	off_t from;

	if (i < 0)
		return st_diag_set(diag, -EINVAL, "no daemon '%s' (expertd, kvd "
				   "or computed)", daemon);
	if (i == 2) {
		const char *key = getenv("STRATA_API_KEY");
		char path[4200];

		st_run_path(inst->run_dir, "computed", "apikey", path,
			    sizeof(path));
		if (st_path_exists(path) && !(key && key[0]))
			return st_diag_set(diag, -EPERM, "computed runs with "
					   "an API key ($STRATA_API_KEY), which "
					   "is not set here: set it to the same "
					   "key and restart again (without it "
					   "the HTTP API would answer anyone)");
	}
	r = load_args(inst, daemon, argv, CLI_DAEMON_ARGV_MAX, &buf, diag);
	if (r < 0)
		return r;
	cli_instance_read_pids(inst);
	/* a tier daemon leaves its pool for the new one to adopt, so
	 * computed's pins, sequences and the warm experts survive */
	if (i < 2 && *pid_of(inst, i) > 0 && st_pid_alive(*pid_of(inst, i))) {
		char ctl[4200];

		st_run_path(inst->run_dir, daemon, "ctl", ctl, sizeof(ctl));
		if (st_daemon_shutdown_keep_pool(ctl, 2000) == 0)
			wait_exit(*pid_of(inst, i), 5000);
	}
	stop_one(inst, i);
	r = i == 2 ? note_api_key(inst, diag) : 0;
	from = log_size(inst, daemon);
	if (r == 0)
		r = spawn(inst, daemon, argv, 1, pid_of(inst, i), diag);
	if (r == 0)
		r = wait_ready(inst, daemon, *pid_of(inst, i), from,
			       timeout_s, diag);
	if (r == 0)
		echo_warnings(inst, daemon, from);
	free(buf);
	return r;
}

int cli_instance_url(const char *run_dir, char *ret, size_t cap)
{
	char *argv[CLI_DAEMON_ARGV_MAX], *buf = NULL;
	const char *port = NULL, *bind = "127.0.0.1";
	struct cli_instance inst;
	struct st_diag diag;
	int r;

	ret[0] = 0;
	snprintf(inst.run_dir, sizeof(inst.run_dir), "%s", run_dir);
	/* behind the supervisor's HTTP front computed's own port is
	 * private: the front's URL is the instance's */
	{
		char path[4200], *txt = NULL;

		st_run_path(run_dir, "supervisor", "url", path, sizeof(path));
		if (st_read_file(path, &txt, NULL) == 0) {
			snprintf(ret, cap, "%s", txt);
			free(txt);
			return 0;
		}
	}
	r = load_args(&inst, "computed", argv, CLI_DAEMON_ARGV_MAX, &buf,
		      &diag);
	if (r < 0)
		return r;
	for (int a = 1; argv[a] && argv[a + 1]; a++) {
		if (!strcmp(argv[a], "--http-port"))
			port = argv[a + 1];
		else if (!strcmp(argv[a], "--http-bind"))
			bind = argv[a + 1];
	}
	r = port && strcmp(port, "0") ? 0 : -ENOENT;
	if (r == 0)
		snprintf(ret, cap, "http://%s%s%s:%s", strchr(bind, ':') ? "[" : "",
			 bind, strchr(bind, ':') ? "]" : "", port);
	free(buf);
	return r;
}

int cli_url_answers(const char *url, int timeout_ms)
{
	char host[128], port[16];
	const char *h = strstr(url, "://"), *end, *colon;
	struct addrinfo hints = { 0 }, *ai = NULL;
	int ok = 0;

	h = h ? h + 3 : url;
	if (*h == '[') {
		end = strchr(++h, ']');
		colon = end && end[1] == ':' ? end + 1 : NULL;
	} else {
		colon = strrchr(h, ':');
		end = colon;
	}
	if (!end || !colon || (size_t)(end - h) >= sizeof(host) ||
	    strlen(colon + 1) >= sizeof(port))
		return 0;
	memcpy(host, h, (size_t)(end - h));
	host[end - h] = 0;
	snprintf(port, sizeof(port), "%.*s", (int)strcspn(colon + 1, "/"),
		 colon + 1);
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, port, &hints, &ai) != 0)
		return 0;
	for (struct addrinfo *a = ai; a && !ok; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK |
				SOCK_CLOEXEC, a->ai_protocol);
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int err = 0;
		socklen_t el = sizeof(err);

		if (fd < 0)
			continue;
		if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
			ok = 1;
		else if (errno == EINPROGRESS && poll(&p, 1, timeout_ms) == 1 &&
			 getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 &&
			 err == 0)
			ok = 1;
		close(fd);
	}
	freeaddrinfo(ai);
	return ok;
}
