/* cli_superv.c — see cli_superv.h.
 *
 * One loop, every SV_POLL_MS: a daemon that was our child is reaped with
 * waitpid (its exit status says how it ended); one that another process
 * started (`strata restart`, adopted through its pid file) is watched
 * through its pid.  A dead daemon is started again under its restart lock
 * (cli_instance_lock_daemon), which `strata restart` also holds: when the
 * lock is free and the pid file names a live process, someone else
 * restarted it and we adopt that one instead.  A daemon that exited
 * cleanly (status 0: someone stopped it on purpose) is not restarted, as
 * systemd's Restart=on-failure. */
#include "cli_superv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_proxy.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_superv.h"
#include "st_util.h"

#define SV_POLL_MS 50
#define SV_BACKOFF_MAX_MS 8000

static const char *const k_names[3] = { "expertd", "kvd", "computed" };

struct sv_daemon {
	int pid;             /* 0: none runs (dead, stopped, gave up) */
	int child;           /* our child: waitpid tells how it ended */
	int pending;         /* dead, to be started again at retry_ns */
	int quick;           /* deaths in a row within QUICK_S of a start */
	uint64_t started_ns; /* when it was (re)started or adopted */
	uint64_t retry_ns;
};

struct sv {
	struct cli_instance *inst;
	int timeout_s, limit, sigfd;
	struct sv_daemon d[3];
	struct st_superv_state st;
	struct cli_proxy *proxy; /* the HTTP front, NULL without HTTP API */
	char url[160];           /* its public URL */
};

/* The address the instance's HTTP API binds (computed's default). */
static const char *bind_of(const struct cli_instance *inst)
{
	return inst->http_bind[0] ? inst->http_bind : "127.0.0.1";
}

/* What the supervisor tells `strata up` once the daemons answer. */
struct sv_report {
	int r;
	int pids[3];
	char msg[sizeof(((struct st_diag *)0)->msg)];
};

static int *inst_pid(struct cli_instance *inst, int i)
{
	return i == 0 ? &inst->pid_expertd : i == 1 ? &inst->pid_kvd :
			&inst->pid_computed;
}

static void save_state(struct sv *s)
{
	int r = st_superv_state_write(s->inst->run_dir, &s->st);

	if (r < 0) /* status and /metrics go stale; restarts still work */
		st_warn("cannot write %s/supervisor.state: %s",
			s->inst->run_dir, st_strerror(r));
}

static void set_state(struct sv *s, int i, const char *state)
{
	snprintf(s->st.d[i].state, sizeof(s->st.d[i].state), "%s", state);
	s->st.d[i].pid = s->d[i].pid;
}

/* Has daemon i died?  1 with *ret_clean (exited with status 0, or -- not
 * our child -- removed its pid file as a clean exit does) and how in
 * ret_how; else 0. */
static int died(struct sv *s, int i, int *ret_clean, char *ret_how,
		size_t cap)
{
	struct sv_daemon *d = &s->d[i];
	int status;

	if (d->child) {
		pid_t w = waitpid(d->pid, &status, WNOHANG);

		if (w == d->pid) {
			if (WIFSIGNALED(status))
				snprintf(ret_how, cap, "signal-%d",
					 WTERMSIG(status));
			else
				snprintf(ret_how, cap, "exit-%d",
					 WEXITSTATUS(status));
			*ret_clean = WIFEXITED(status) &&
				     WEXITSTATUS(status) == 0;
			return 1;
		}
		if (w == 0 || errno != ECHILD)
			return 0;
	}
	if (st_pid_alive(d->pid))
		return 0;
	snprintf(ret_how, cap, "gone");
	*ret_clean = st_pidfile_read(s->inst->run_dir, k_names[i]) != d->pid;
	return 1;
}

/* Delay before the next start after q quick deaths in a row: none for
 * the first two (back within a second), then 250 ms doubling to 8 s. */
static uint64_t backoff_ns(int q)
{
	uint64_t ms = q <= 2 ? 0 : 250ull << (q - 3 < 6 ? q - 3 : 6);

	return (ms > SV_BACKOFF_MAX_MS ? SV_BACKOFF_MAX_MS : ms) * 1000000ull;
}

/* One look at daemon i; -ECANCELED when a stop signal came meanwhile. */
static int watch_one(struct sv *s, int i)
{
	struct sv_daemon *d = &s->d[i];
	struct st_diag diag = { "" };
	const char *name = k_names[i];
	uint64_t now = st_now_ns();
	char how[32];
	int clean = 0, lock, p, r;

	if (d->pid > 0) {
		if (!died(s, i, &clean, how, sizeof(how)))
			return 0;
		snprintf(s->st.d[i].last_exit, sizeof(s->st.d[i].last_exit),
			 "%s", how);
		lock = cli_instance_lock_daemon(s->inst, name, 0);
		if (lock == -EBUSY) {
			/* a deliberate stop, not a crash: said as such */
			snprintf(s->st.d[i].last_exit,
				 sizeof(s->st.d[i].last_exit), "%s",
				 ST_SUPERV_EXIT_RESTART);
			/* `strata restart` stopped it and starts another,
			 * which we adopt once it holds the lock no more */
			st_info("%s (pid %d) stopped by strata restart", name,
				d->pid);
			d->pid = 0;
			/* started again here should that restart fail */
			d->pending = 1;
			d->retry_ns = now;
			set_state(s, i, "restarting");
			save_state(s);
			return 0;
		}
		if (lock >= 0)
			close(lock);
		if (now - d->started_ns < CLI_SUPERV_QUICK_S * 1000000000ull)
			d->quick++;
		else
			d->quick = 1;
		if (clean) {
			st_warn("%s (pid %d) exited cleanly; not restarting it "
				"(strata restart %s starts it)", name, d->pid,
				name);
			d->pid = 0;
			set_state(s, i, "stopped");
		} else if (d->quick > s->limit) {
			st_err("%s (pid %d) died (%s) %d times in a row, each "
			       "within %d s of its start: crash loop, not "
			       "restarting it; see %s/%s.log, then strata "
			       "restart %s", name, d->pid, how, d->quick,
			       CLI_SUPERV_QUICK_S, s->inst->run_dir, name,
			       name);
			d->pid = 0;
			set_state(s, i, "gave-up");
		} else {
			d->retry_ns = now + backoff_ns(d->quick);
			st_warn("%s (pid %d) died (%s); restarting it%s", name,
				d->pid, how, d->retry_ns > now ?
				" after a back-off" : "");
			d->pid = 0;
			d->pending = 1;
			set_state(s, i, "restarting");
		}
		save_state(s);
	}
	/* dead, stopped or given up: adopt a daemon someone else started
	 * (under the lock, so not one that is still starting) */
	lock = cli_instance_lock_daemon(s->inst, name, 0);
	if (lock < 0)
		return 0; /* being restarted by `strata restart`: next look */
	p = st_pidfile_read(s->inst->run_dir, name);
	if (p > 0 && st_pid_alive(p)) {
		if (!d->pending)
			st_info("%s pid %d started by another strata process: "
				"watching it", name, p);
		d->pid = p;
		d->child = 0;
		d->pending = 0;
		d->started_ns = now;
		*inst_pid(s->inst, i) = p;
		set_state(s, i, "running");
		save_state(s);
		close(lock);
		return 0;
	}
	if (!d->pending || now < d->retry_ns) {
		close(lock);
		return 0;
	}
	r = cli_instance_restart_locked(s->inst, name, s->timeout_s, &diag);
	close(lock);
	if (r == -ECANCELED)
		return r;
	if (r < 0) {
		st_err("restarting %s: %s", name, diag.msg);
		d->quick++;
		if (d->quick > s->limit) {
			st_err("%s failed to start %d times in a row: not "
			       "restarting it; fix the cause, then strata "
			       "restart %s", name, d->quick, name);
			d->pending = 0;
			set_state(s, i, "gave-up");
		} else {
			d->retry_ns = st_now_ns() + backoff_ns(d->quick);
		}
		save_state(s);
		return 0;
	}
	d->pid = *inst_pid(s->inst, i);
	d->child = 1;
	d->pending = 0;
	d->started_ns = st_now_ns();
	s->st.d[i].restarts++;
	st_warn("%s restarted: pid %d (restart %u)", name, d->pid,
		s->st.d[i].restarts);
	set_state(s, i, "running");
	save_state(s);
	return 0;
}

/* 1 while this process is still the instance's supervisor (its run
 * directory and our pid file are there): a run directory removed without
 * `strata down` must not leave us running for ever. */
static int still_ours(const struct sv *s)
{
	return st_path_exists(s->inst->run_dir) &&
	       st_pidfile_read(s->inst->run_dir, "supervisor") == (int)getpid();
}

static void supervise(struct sv *s)
{
	for (;;) {
		struct pollfd pfd = { .fd = s->sigfd, .events = POLLIN };

		if (poll(&pfd, 1, SV_POLL_MS) > 0 &&
		    st_stop_signals_pending(s->sigfd))
			break;
		if (!still_ours(s)) {
			st_warn("run directory %s or our pid file is gone: "
				"stopping supervision", s->inst->run_dir);
			return;
		}
		for (int i = 0; i < 3; i++) {
			if (i == 2 && s->inst->tiers_only)
				continue;
			if (watch_one(s, i) == -ECANCELED)
				goto stop;
		}
	}
stop:
	st_info("stop signal: supervision ends, the daemons keep running");
	st_pidfile_remove(s->inst->run_dir, "supervisor");
}

/* In the child: starts the daemons, reports to `strata up` through fd,
 * then supervises.  Never returns. */
static void run_child(struct cli_instance *inst, int timeout_s, int limit,
		      int fd)
{
	struct sv *s = calloc(1, sizeof(*s));
	struct sv_report rep = { 0 };
	struct st_diag diag = { "" };
	char logp[4200];
	int null, logfd;

	setsid();
	null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		close(null);
	}
	inst->stop_fd = st_stop_signals_open();
	inst->has_stop_fd = inst->stop_fd >= 0;
	rep.r = !s ? -ENOMEM : inst->stop_fd < 0 ? inst->stop_fd : 0;
	if (rep.r == 0 && inst->http_port[0] && strcmp(inst->http_port, "0")) {
		/* the HTTP front owns the public port; computed serves a
		 * private one behind it (cli_proxy.h) */
		int priv = 0;

		snprintf(s->url, sizeof(s->url), "http://%s%s%s:%s",
			 strchr(bind_of(inst), ':') ? "[" : "", bind_of(inst),
			 strchr(bind_of(inst), ':') ? "]" : "", inst->http_port);
		rep.r = cli_proxy_create(bind_of(inst), atoi(inst->http_port),
					 inst->run_dir,
					 inst->http_max_client_conns[0] ?
					 atoi(inst->http_max_client_conns) : 64,
					 &s->proxy, &priv, &diag);
		if (rep.r == 0) {
			/* every client is 127.0.0.1 to computed now: the
			 * per-client limit is the front's */
			snprintf(inst->http_max_client_conns,
				 sizeof(inst->http_max_client_conns), "0");
			snprintf(inst->http_port, sizeof(inst->http_port),
				 "%d", priv);
			snprintf(inst->http_bind, sizeof(inst->http_bind),
				 "127.0.0.1");
		}
	}
	if (rep.r == 0)
		rep.r = cli_instance_up(inst, timeout_s, &diag);
	if (rep.r == 0 && s->proxy) {
		char path[4200];

		st_run_path(inst->run_dir, "supervisor", "url", path,
			    sizeof(path));
		rep.r = st_write_file(path, s->url, strlen(s->url));
		if (rep.r == 0)
			rep.r = cli_proxy_start(s->proxy);
		if (rep.r < 0) {
			st_diag_set(&diag, rep.r, "HTTP front: %s: %s", path,
				    st_strerror(rep.r));
			cli_instance_down(inst);
		}
	}
	if (rep.r == 0 &&
	    (rep.r = st_pidfile_write(inst->run_dir, "supervisor")) < 0) {
		st_diag_set(&diag, rep.r, "cannot write %s/supervisor.pid: %s "
			    "(free space in the run directory's file system)",
			    inst->run_dir, st_strerror(rep.r));
		cli_instance_down(inst);
	}
	if (rep.r == 0) {
		s->inst = inst;
		s->timeout_s = timeout_s;
		s->limit = limit;
		s->sigfd = inst->stop_fd;
		for (int i = 0; i < 3; i++) {
			s->d[i].pid = *inst_pid(inst, i);
			s->d[i].child = s->d[i].pid > 0;
			s->d[i].started_ns = st_now_ns();
			snprintf(s->st.d[i].name, sizeof(s->st.d[i].name), "%s",
				 k_names[i]);
			set_state(s, i, s->d[i].pid > 0 ? "running" : "stopped");
		}
		rep.r = st_superv_state_write(inst->run_dir, &s->st);
		if (rep.r < 0) {
			st_diag_set(&diag, rep.r, "cannot write "
				    "%s/supervisor.state: %s", inst->run_dir,
				    st_strerror(rep.r));
			st_pidfile_remove(inst->run_dir, "supervisor");
			cli_instance_down(inst);
		}
	}
	if (rep.r == 0) {
		/* from here on our output goes to the log: `strata up`'s
		 * caller (a shell's $(...), a test) waits for its stdout
		 * and stderr to close */
		st_run_path(inst->run_dir, "supervisor", "log", logp,
			    sizeof(logp));
		logfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
			     0600);
		if (logfd < 0)
			logfd = open("/dev/null", O_WRONLY | O_CLOEXEC);
		if (logfd >= 0) {
			dup2(logfd, 1);
			dup2(logfd, 2);
			close(logfd);
		}
	}
	for (int i = 0; i < 3; i++)
		rep.pids[i] = *inst_pid(inst, i);
	snprintf(rep.msg, sizeof(rep.msg), "%s", diag.msg);
	if (write(fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep) && rep.r == 0) {
		/* `strata up` is gone (^C): it cannot tell anyone, go on */
	}
	close(fd);
	if (rep.r < 0)
		_exit(1);
	st_log_set_name("supervisor");
	st_info("supervising instance %s: expertd %d, kvd %d, computed %d "
		"(crash-loop limit %d)", inst->name, rep.pids[0], rep.pids[1],
		rep.pids[2], limit);
	supervise(s);
	if (s->proxy)
		st_info("HTTP front: %llu requests answered 503 "
			"computed_restarting, %llu streams ended with an "
			"error event (computed died or stopped)",
			(unsigned long long)cli_proxy_n_retry_errors(s->proxy),
			(unsigned long long)cli_proxy_n_cut_streams(s->proxy));
	cli_proxy_destroy(s->proxy);
	free(s);
	_exit(0);
}

int cli_superv_start(struct cli_instance *inst, int timeout_s,
		     int restart_limit, struct st_diag *diag)
{
	struct sv_report rep;
	size_t got = 0;
	int fds[2];
	pid_t pid;

	if (pipe2(fds, O_CLOEXEC) < 0)
		return st_diag_set(diag, -errno, "pipe: %s", strerror(errno));
	/* nothing buffered may be written twice (by the child too) */
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		close(fds[0]);
		close(fds[1]);
		return st_diag_set(diag, -errno, "fork: %s", strerror(errno));
	}
	if (pid == 0) {
		close(fds[0]);
		run_child(inst, timeout_s, restart_limit, fds[1]);
	}
	close(fds[1]);
	while (got < sizeof(rep)) {
		ssize_t n = read(fds[0], (char *)&rep + got, sizeof(rep) - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fds[0]);
	if (got != sizeof(rep)) {
		waitpid(pid, NULL, 0);
		return st_diag_set(diag, -ST_E_PEERGONE, "the supervisor of "
				   "instance %s died while starting it; see "
				   "the logs in %s", inst->name, inst->run_dir);
	}
	if (rep.r < 0) {
		waitpid(pid, NULL, 0);
		return st_diag_set(diag, rep.r, "%s", rep.msg);
	}
	inst->pid_expertd = rep.pids[0];
	inst->pid_kvd = rep.pids[1];
	inst->pid_computed = rep.pids[2];
	return 0;
}

int cli_superv_pid(const char *run_dir)
{
	int pid = st_pidfile_read(run_dir, "supervisor");

	return pid > 0 && st_pid_alive(pid) ? pid : 0;
}

int cli_superv_dead_pid(const char *run_dir)
{
	int pid = st_pidfile_read(run_dir, "supervisor");

	return pid > 0 && !st_pid_alive(pid) ? pid : 0;
}

void cli_superv_dead_hint(FILE *f, const char *indent, const char *name,
			  int dead_pid)
{
	fprintf(f, "supervisor dead (pid %d): its HTTP port is closed and "
		"nothing restarts a\n%sdaemon that dies; run `strata down "
		"--instance %s && strata up --instance %s ...`\n%s(the options "
		"it was started with)\n", dead_pid, indent, name, name, indent);
}

int cli_superv_stop(const char *run_dir, int timeout_ms)
{
	int pid = cli_superv_pid(run_dir), killed = 0;

	if (pid) {
		uint64_t deadline = st_now_ns() +
				    (uint64_t)timeout_ms * 1000000ull;

		kill(pid, SIGTERM);
		while (st_pid_alive(pid) && st_now_ns() < deadline)
			st_sleep_ns(20000000ull);
		if (st_pid_alive(pid)) {
			kill(pid, SIGKILL);
			while (st_pid_alive(pid))
				st_sleep_ns(20000000ull);
			killed = 1;
		}
	}
	st_pidfile_remove(run_dir, "supervisor");
	return killed;
}
