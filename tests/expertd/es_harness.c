/* es_harness.c — see es_harness.h. */
#include "es_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "es_convert.h"
#include "st_daemon.h"
#include "st_util.h"
#include "test_util.h"

#define MAX_ARGS 32

int es_h_init(struct es_h *h, const char *model, const char *tag)
{
	struct es_convert_opts opts;
	struct st_diag diag = { "" };
	char mdir[1024];
	uint64_t t0 = st_now_ns();
	int r;

	memset(h, 0, sizeof(*h));
	st_test_fixture_model(model, mdir, sizeof(mdir));
	st_test_tmpdir(h->tmp, sizeof(h->tmp));
	snprintf(h->store, sizeof(h->store), "%s/store", h->tmp);
	snprintf(h->run_dir, sizeof(h->run_dir), "%s/run", h->tmp);
	snprintf(h->log, sizeof(h->log), "%s/expertd.log", h->tmp);
	st_test_instance(tag, h->inst, sizeof(h->inst));
	es_convert_opts_init(&opts);
	r = es_convert(mdir, h->store, &opts, &diag);
	if (r < 0) {
		fprintf(stderr, "es_convert %s: %s (%s)\n", mdir, diag.msg,
			st_strerror(r));
		return r;
	}
	r = st_store_open(h->store, &h->st, &diag);
	if (r < 0) {
		fprintf(stderr, "st_store_open: %s\n", diag.msg);
		return r;
	}
	h->n_layers = h->st->n_layers;
	h->n_experts = h->st->n_experts;
	h->top_k = h->st->cfg.top_k;
	h->record_bytes = h->st->record_bytes;
	h->ref = malloc((size_t)h->n_layers * h->n_experts * h->record_bytes);
	if (!h->ref)
		return -ENOMEM;
	for (int l = 0; l < h->n_layers && r == 0; l++) {
		char path[2048];
		int fd;

		st_store_path(h->st, h->st->expert_files[l], path, sizeof(path));
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			return -errno;
		for (int e = 0; e < h->n_experts && r == 0; e++)
			r = st_store_read_record(
				h->st, fd, l, e,
				h->ref + ((size_t)l * h->n_experts + e) *
						 h->record_bytes,
				&diag);
		close(fd);
	}
	if (r < 0)
		fprintf(stderr, "reference read: %s\n", diag.msg);
	fprintf(stderr, "# store of %s: %d layers x %d experts, top-k %d, "
		"records of %llu bytes (convert + reference read %.0f ms)\n",
		model, h->n_layers, h->n_experts, h->top_k,
		(unsigned long long)h->record_bytes,
		(double)(st_now_ns() - t0) / 1e6);
	return r;
}

static void remove_segments(const struct es_h *h)
{
	char prefix[128];
	DIR *d = opendir("/dev/shm");
	struct dirent *de;

	if (!d)
		return;
	snprintf(prefix, sizeof(prefix), "strata.%s.", h->inst);
	while ((de = readdir(d))) {
		if (!strncmp(de->d_name, prefix, strlen(prefix))) {
			char name[300];

			snprintf(name, sizeof(name), "/%s", de->d_name);
			shm_unlink(name);
		}
	}
	closedir(d);
	/* and the lock a killed expertd leaves (st_shm_lock) */
	{
		char name[200];

		snprintf(name, sizeof(name), "/strata-lock.%s.expertd", h->inst);
		shm_unlink(name);
	}
}

void es_h_reset(struct es_h *h)
{
	if (h->pid > 0)
		es_h_kill9(h);
	remove_segments(h);
	st_rm_rf(h->run_dir);
}

void es_h_fini(struct es_h *h)
{
	if (h->pid > 0)
		es_h_kill9(h);
	remove_segments(h);
	st_store_close(h->st);
	h->st = NULL;
	free(h->ref);
	h->ref = NULL;
	if (h->tmp[0] && !getenv("ES_TEST_KEEP"))
		st_rm_rf(h->tmp);
}

const char *es_h_path(const struct es_h *h, const char *suffix, char *buf,
		      size_t len)
{
	snprintf(buf, len, "%s/expertd.%s", h->run_dir, suffix);
	return buf;
}

/* Builds argv: expertd --store --instance --run-dir, then the extras. */
static int build_argv(struct es_h *h, char *exe, size_t exe_len,
		      const char **argv, va_list ap)
{
	const char *a;
	int n = 0;

	snprintf(exe, exe_len, "%s/expertd/expertd", st_test_build_dir());
	argv[n++] = exe;
	argv[n++] = "--store";
	argv[n++] = h->store;
	argv[n++] = "--instance";
	argv[n++] = h->inst;
	argv[n++] = "--run-dir";
	argv[n++] = h->run_dir;
	while ((a = va_arg(ap, const char *)) && n < MAX_ARGS - 1)
		argv[n++] = a;
	argv[n] = NULL;
	return n;
}

static pid_t spawn(const char *exe, const char **argv, int err_fd)
{
	pid_t pid = fork();

	if (pid == 0) {
		if (err_fd >= 0) {
			dup2(err_fd, 2);
			dup2(err_fd, 1);
		}
		execv(exe, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	return pid;
}

static int status_code(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return 255;
}

int es_h_start(struct es_h *h, ...)
{
	const char *argv[MAX_ARGS];
	char exe[1024];
	va_list ap;
	uint64_t deadline;
	int fd, st;

	va_start(ap, h);
	build_argv(h, exe, sizeof(exe), argv, ap);
	va_end(ap);
	fd = open(h->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	h->pid = spawn(exe, argv, fd);
	if (fd >= 0)
		close(fd);
	if (h->pid < 0) {
		h->pid = 0;
		return -1;
	}
	deadline = st_now_ns() + 10000000000ull;
	while (st_now_ns() < deadline) {
		if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
			char *txt = NULL;

			h->pid = 0;
			if (st_read_file(h->log, &txt, NULL) == 0) {
				fprintf(stderr, "expertd exited early:\n%s\n",
					txt);
				free(txt);
			}
			return status_code(st) ? status_code(st) : 255;
		}
		if (st_pidfile_read(h->run_dir, "expertd") == h->pid)
			return 0;
		st_sleep_ns(2000000);
	}
	fprintf(stderr, "expertd did not come up within 10 s\n");
	es_h_kill9(h);
	return -1;
}

int es_h_run_fail(struct es_h *h, char *errbuf, size_t errlen, ...)
{
	const char *argv[MAX_ARGS];
	char exe[1024], path[700];
	char *txt = NULL;
	va_list ap;
	pid_t pid;
	int fd, st = 0;

	va_start(ap, errlen);
	build_argv(h, exe, sizeof(exe), argv, ap);
	va_end(ap);
	snprintf(path, sizeof(path), "%s/run_fail.log", h->tmp);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	pid = spawn(exe, argv, fd);
	if (fd >= 0)
		close(fd);
	if (pid < 0)
		return -1;
	/* A daemon that wrongly starts would serve forever: bound it. */
	for (int i = 0; i < 1000; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			break;
		if (i == 999) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
		}
		st_sleep_ns(10000000);
	}
	if (errlen) {
		errbuf[0] = 0;
		if (st_read_file(path, &txt, NULL) == 0) {
			snprintf(errbuf, errlen, "%s", txt);
			free(txt);
		}
	}
	return status_code(st);
}

int es_h_stop(struct es_h *h)
{
	int st = 0;

	if (h->pid <= 0)
		return -1;
	kill(h->pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
			h->pid = 0;
			return status_code(st);
		}
		st_sleep_ns(10000000);
	}
	kill(h->pid, SIGKILL);
	waitpid(h->pid, &st, 0);
	h->pid = 0;
	return status_code(st);
}

void es_h_kill9(struct es_h *h)
{
	if (h->pid <= 0)
		return;
	kill(h->pid, SIGKILL);
	waitpid(h->pid, NULL, 0);
	h->pid = 0;
}

const uint8_t *es_h_ref(const struct es_h *h, int layer, int expert)
{
	return h->ref + ((size_t)layer * h->n_experts + expert) * h->record_bytes;
}

int es_h_count_segments(const struct es_h *h)
{
	char prefix[128];
	DIR *d = opendir("/dev/shm");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	snprintf(prefix, sizeof(prefix), "strata.%s.", h->inst);
	while ((de = readdir(d)))
		n += !strncmp(de->d_name, prefix, strlen(prefix));
	closedir(d);
	return n;
}

int es_h_attach(const struct es_h *h, struct st_shm *shm,
		struct es_pool_view *v)
{
	struct st_diag diag = { "" };
	int r = st_shm_attach(shm, h->inst, ES_POOL_KIND,
			      ES_POOL_LAYOUT_VERSION, 0, &diag);

	if (r == 0)
		r = es_pool_view_init(shm->base, shm->size, 0, v, &diag);
	if (r < 0) {
		fprintf(stderr, "attach: %s (%s)\n", diag.msg, st_strerror(r));
		st_shm_detach(shm);
	}
	return r;
}
