/* test_daemons.c — see test_daemons.h. */
#include "test_daemons.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "st_daemon.h"
#include "st_daemon.h"
#include "st_util.h"
#include "test_util.h"

void st_test_inst_init(struct st_test_inst *t, const char *tag)
{
	memset(t, 0, sizeof(*t));
	st_test_instance(tag, t->name, sizeof(t->name));
	st_test_tmpdir(t->run_dir, sizeof(t->run_dir));
}

static pid_t spawn(struct st_test_inst *t, const char *daemon,
		   const char *const *args)
{
	char exe[4200], logp[4200];
	const char *argv[64];
	int a = 0, fd;
	pid_t pid;

	snprintf(exe, sizeof(exe), "%s/%s/%s", st_test_build_dir(), daemon,
		 daemon);
	st_run_path(t->run_dir, daemon, "log", logp, sizeof(logp));
	argv[a++] = daemon;
	for (int i = 0; args && args[i] && a < 58; i++)
		argv[a++] = args[i];
	argv[a++] = "--instance";
	argv[a++] = t->name;
	argv[a++] = "--run-dir";
	argv[a++] = t->run_dir;
	argv[a] = NULL;
	fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	pid = fork();
	if (pid == 0) {
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(exe, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	if (fd >= 0)
		close(fd);
	return pid;
}

static void print_log(struct st_test_inst *t, const char *daemon)
{
	char logp[4200], *txt;

	st_run_path(t->run_dir, daemon, "log", logp, sizeof(logp));
	if (st_read_file(logp, &txt, NULL) == 0) {
		fprintf(stderr, "--- %s log ---\n%s--- end ---\n", daemon, txt);
		free(txt);
	}
}

int st_test_daemon_start(struct st_test_inst *t, const char *daemon,
			 const char *const *args, int timeout_s)
{
	uint64_t deadline = st_now_ns() + (uint64_t)timeout_s *
					  st_test_timeout_scale() * 1000000000ull;
	char ctl[4200];
	pid_t pid = spawn(t, daemon, args);

	if (pid < 0)
		return -1;
	st_run_path(t->run_dir, daemon, "ctl", ctl, sizeof(ctl));
	while (st_now_ns() < deadline) {
		int status;

		if (waitpid(pid, &status, WNOHANG) == pid) {
			fprintf(stderr, "%s exited during start-up\n", daemon);
			print_log(t, daemon);
			return -1;
		}
		if (st_path_exists(ctl) && st_daemon_ping(ctl, 500, NULL) == 0) {
			if (!strcmp(daemon, "expertd"))
				t->pid_expertd = pid;
			else if (!strcmp(daemon, "kvd"))
				t->pid_kvd = pid;
			else
				t->pid_computed = pid;
			return pid;
		}
		st_sleep_ns(20000000ull);
	}
	fprintf(stderr, "%s not ready in %d s\n", daemon,
		timeout_s * st_test_timeout_scale());
	print_log(t, daemon);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

int st_test_daemon_run(struct st_test_inst *t, const char *daemon,
		       const char *const *args, char **out_log)
{
	int status = -1;
	pid_t pid = spawn(t, daemon, args);

	if (pid < 0)
		return -1;
	waitpid(pid, &status, 0);
	if (out_log) {
		char logp[4200];

		st_run_path(t->run_dir, daemon, "log", logp, sizeof(logp));
		if (st_read_file(logp, out_log, NULL) < 0)
			*out_log = NULL;
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void stop_one(int *pid)
{
	uint64_t deadline;

	if (*pid <= 0)
		return;
	kill(*pid, SIGTERM);
	deadline = st_now_ns() + 10000000000ull * st_test_timeout_scale();
	while (st_now_ns() < deadline) {
		if (waitpid(*pid, NULL, WNOHANG) == *pid) {
			*pid = 0;
			return;
		}
		st_sleep_ns(10000000ull);
	}
	kill(*pid, SIGKILL);
	waitpid(*pid, NULL, 0);
	*pid = 0;
}

void st_test_inst_stop(struct st_test_inst *t)
{
	stop_one(&t->pid_computed);
	stop_one(&t->pid_kvd);
	stop_one(&t->pid_expertd);
}

int st_test_count_segments(const char *instance)
{
	char prefix[128];
	struct dirent *de;
	DIR *d = opendir("/dev/shm");
	int n = 0;
	size_t pl = (size_t)snprintf(prefix, sizeof(prefix), "strata.%s.",
				     instance);

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (!strncmp(de->d_name, prefix, pl))
			n++;
	closedir(d);
	return n;
}
