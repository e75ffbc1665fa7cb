/* kv_test_util.c — see kv_test_util.h. */
#include "kv_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_proto.h"
#include "st_msg.h"
#include "st_redis.h"
#include "st_util.h"
#include "test_util.h"

void kvd_inst_init(struct kvd_inst *k, const char *tag)
{
	memset(k, 0, sizeof(*k));
	st_test_instance(tag, k->name, sizeof(k->name));
	st_test_tmpdir(k->run_dir, sizeof(k->run_dir));
	snprintf(k->budget, sizeof(k->budget), "4MiB");
	snprintf(k->max_seqs, sizeof(k->max_seqs), "16");
	snprintf(k->max_rows, sizeof(k->max_rows), "1024");
	snprintf(k->spill_budget, sizeof(k->spill_budget), "0");
}

static pid_t spawn(const struct kvd_inst *k, const char *run_dir)
{
	char path[4096];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/kvd/kvd", st_test_build_dir());
	pid = fork();
	if (pid == 0) {
		const char *argv[32] = {
			"kvd", "--instance", k->name, "--run-dir", run_dir,
			"--max-seqs", k->max_seqs,
			"--max-rows-per-seq", k->max_rows, "--spill-budget",
			k->spill_budget[0] ? k->spill_budget : "0" };
		int a = 11;

		if (k->budget[0]) { /* "": kvd's default */
			argv[a++] = "--budget";
			argv[a++] = k->budget;
		}

		for (int i = 0; i < 8 && k->extra[i]; i++)
			argv[a++] = k->extra[i];
		argv[a] = NULL;
		execv(path, (char *const *)argv);
		fprintf(stderr, "exec %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	return pid;
}

int kvd_ping(const char *run_dir, int timeout_ms, int32_t *ret_pid,
	     uint64_t *ret_epoch)
{
	struct kv_msg_ping_reply out;
	struct st_sock s;
	char path[4200];
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	snprintf(path, sizeof(path), "%s/kvd.ctl", run_dir);
	r = st_sock_open(&s, ST_SOCK_REQ, path, timeout_ms, timeout_ms);
	if (r < 0)
		return r;
	r = st_rpc_call(&s, ST_MSG_PING, 1, 0, NULL, 0, &buf, &p, &len);
	if (r == 0)
		r = kv_proto_decode_ping_reply(p, len, &out);
	free(buf);
	st_sock_close(&s);
	if (r == 0) {
		if (ret_pid)
			*ret_pid = (int32_t)out.pid;
		if (ret_epoch)
			*ret_epoch = out.epoch;
	}
	return r;
}

int kvd_start(struct kvd_inst *k, int *ret_status)
{
	uint64_t t0 = st_now_ns();
	int status;

	k->pid = spawn(k, k->run_dir);
	if (k->pid < 0) {
		k->pid = 0;
		return -1;
	}
	while (st_now_ns() - t0 < 5000000000ull) {
		int32_t pid = 0;

		if (waitpid(k->pid, &status, WNOHANG) == k->pid) {
			k->pid = 0;
			if (ret_status)
				*ret_status = status;
			return -1;
		}
		if (kvd_ping(k->run_dir, 200, &pid, NULL) == 0 &&
		    pid == k->pid)
			return 0;
		st_sleep_ns(10 * 1000 * 1000);
	}
	kvd_kill(k, SIGKILL);
	return -1;
}

int kvd_run_expect_exit(const struct kvd_inst *k, const char *run_dir,
			int timeout_ms)
{
	uint64_t t0 = st_now_ns();
	pid_t pid = spawn(k, run_dir);
	int status;

	if (pid < 0)
		return -1;
	while (st_now_ns() - t0 < (uint64_t)timeout_ms * 1000000ull) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
		st_sleep_ns(5 * 1000 * 1000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return -1;
}

int kvd_kill(struct kvd_inst *k, int sig)
{
	int status = 0;

	if (k->pid <= 0)
		return -1;
	kill(k->pid, sig);
	waitpid(k->pid, &status, 0);
	k->pid = 0;
	return status;
}

const char *kvd_segment_path(const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "/dev/shm/strata.%s.kv", name);
	return buf;
}

void kvd_cleanup(struct kvd_inst *k)
{
	if (k->pid > 0)
		kvd_kill(k, SIGKILL);
	if (k->name[0]) {
		/* every segment of the instance: the pool, and the device KV
		 * slot table ("devkv") a killed kvd leaves as well */
		char prefix[128], shm[400];
		struct dirent *d;
		DIR *dir = opendir("/dev/shm");

		snprintf(prefix, sizeof(prefix), "strata.%s.", k->name);
		while (dir && (d = readdir(dir)))
			if (!strncmp(d->d_name, prefix, strlen(prefix))) {
				snprintf(shm, sizeof(shm), "/%s", d->d_name);
				shm_unlink(shm);
			}
		if (dir)
			closedir(dir);
		/* and the lock a killed kvd leaves (st_shm_lock) */
		snprintf(shm, sizeof(shm), "/strata-lock.%s.kvd", k->name);
		shm_unlink(shm);
	}
	if (k->run_dir[0])
		st_rm_rf(k->run_dir);
}

int kvd_count_segments(const char *name)
{
	char prefix[128];
	struct dirent *d;
	DIR *dir = opendir("/dev/shm");
	int n = 0;

	if (!dir)
		return -1;
	snprintf(prefix, sizeof(prefix), "strata.%s.", name);
	while ((d = readdir(dir)))
		if (!strncmp(d->d_name, prefix, strlen(prefix)))
			n++;
	closedir(dir);
	return n;
}

uint32_t kvd_table_entry(const char *name, uint32_t seq, uint32_t stream,
			 uint32_t page_index, uint64_t *ret_slot_bytes)
{
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	struct kv_layout lay;
	struct stat st;
	char path[128];
	uint32_t e = UINT32_MAX - 2;
	void *base;
	int fd;

	kvd_segment_path(name, path, sizeof(path));
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return e;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return e;
	}
	base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return e;
	if (kv_layout_read((uint8_t *)base + 0, (size_t)st.st_size, 0, &lay,
			   streams, NULL) == 0 &&
	    kv_seq_index(seq) < lay.max_seqs && stream < lay.n_streams &&
	    page_index < lay.max_pages_per_seq) {
		const uint32_t *table =
			(const uint32_t *)((const uint8_t *)base + lay.table_off);

		e = __atomic_load_n(&table[kv_table_index(&lay,
							  kv_seq_index(seq),
							  stream, page_index)],
				    __ATOMIC_ACQUIRE);
		if (ret_slot_bytes)
			*ret_slot_bytes = lay.slot_bytes;
	}
	munmap(base, (size_t)st.st_size);
	return e;
}

int kvd_flip_byte(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;
	int ok;

	if (fd < 0)
		return -1;
	ok = pread(fd, &b, 1, (off_t)off) == 1;
	b ^= 0x20;
	ok = ok && pwrite(fd, &b, 1, (off_t)off) == 1 && fsync(fd) == 0;
	close(fd);
	return ok ? 0 : -1;
}

struct kvd_inst *kvd_fixture_new(const char *prefix, int n)
{
	struct kvd_inst *k = calloc(1, sizeof(*k));
	char tag[16];

	if (!k)
		return NULL;
	snprintf(tag, sizeof(tag), "%s%d", prefix, n);
	kvd_inst_init(k, tag);
	return k;
}

int kvd_fixture_teardown(void **state)
{
	struct kvd_inst *k = *state;

	if (k->pid > 0)
		kvd_kill(k, SIGTERM);
	kvd_cleanup(k);
	free(k);
	return 0;
}

/* A loopback TCP port free now (0: none found). */
static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t n = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &n) == 0)
		port = ntohs(a.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

int kvt_redis_start(struct kvt_redis *r)
{
	struct st_redis_url u;
	struct st_redis *c = NULL;
	char port[16];

	memset(r, 0, sizeof(*r));
	r->port = free_port();
	if (!r->port)
		return -1;
	snprintf(port, sizeof(port), "%u", r->port);
	snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%u/0", r->port);
	r->pid = fork();
	if (r->pid == 0) {
		execlp("redis-server", "redis-server", "--port", port, "--bind",
		       "127.0.0.1", "--save", "", "--appendonly", "no",
		       "--loglevel", "warning", (char *)NULL);
		_exit(127);
	}
	if (r->pid < 0 || st_redis_url_parse(r->url, &u, NULL) < 0) {
		kvt_redis_stop(r);
		return -1;
	}
	for (int i = 0; i < 200 && !c; i++)
		if (st_redis_open(&u, 200, &c, NULL) < 0)
			st_sleep_ns(20 * 1000 * 1000);
	if (!c) {
		kvt_redis_stop(r);
		return -1;
	}
	st_redis_close(c);
	return 0;
}

void kvt_redis_stop(struct kvt_redis *r)
{
	if (r->pid > 0) {
		kill(r->pid, SIGTERM);
		waitpid(r->pid, NULL, 0);
	}
	r->pid = 0;
}
