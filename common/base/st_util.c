/* st_util.c — see st_util.h. */
#include "st_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
/* XXH3_64bits_dispatch (see st_xxh3) where libxxhash is linked; a build
 * with header-only xxhash (XXH_INLINE_ALL: scripts/gpu-check's standalone
 * way) uses the inlined XXH3 instead. */
#if defined(__x86_64__) && !defined(XXH_INLINE_ALL) && \
	__has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define ST_XXH3_64 XXH3_64bits_dispatch
#else
#define ST_XXH3_64 XXH3_64bits
#endif

uint64_t st_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void st_sleep_ns(uint64_t ns)
{
	struct timespec ts = { (time_t)(ns / 1000000000ull),
			       (long)(ns % 1000000000ull) };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int st_parse_size(const char *text, uint64_t *ret_bytes)
{
	char *end;
	double v;
	double mult = 1;

	if (!text || !*text)
		return -EINVAL;
	errno = 0;
	v = strtod(text, &end);
	if (errno || end == text || v < 0)
		return -EINVAL;
	while (*end == ' ')
		end++;
	if (*end) {
		static const struct {
			const char *suffix;
			double mult;
		} units[] = {
			{ "b", 1 },
			{ "k", 1024.0 }, { "kib", 1024.0 }, { "kb", 1e3 },
			{ "m", 1048576.0 }, { "mib", 1048576.0 }, { "mb", 1e6 },
			{ "g", 1073741824.0 }, { "gib", 1073741824.0 }, { "gb", 1e9 },
			{ "t", 1099511627776.0 }, { "tib", 1099511627776.0 },
			{ "tb", 1e12 },
			{ "p", 1125899906842624.0 },
			{ "pib", 1125899906842624.0 }, { "pb", 1e15 },
		};
		size_t i;

		for (i = 0; i < ST_ARRAY_SIZE(units); i++)
			if (!strcasecmp(end, units[i].suffix))
				break;
		if (i == ST_ARRAY_SIZE(units))
			return -EINVAL;
		mult = units[i].mult;
		/* "kB" (decimal) vs "k"/"KiB" (binary): strcasecmp folds
		 * case, so "KB" means 1000 as well. */
	}
	v *= mult;
	if (v > 1.8e19)
		return -EINVAL;
	*ret_bytes = (uint64_t)(v + 0.5);
	return 0;
}

int st_parse_bool(const char *text)
{
	static const char *const on[] = { "on", "true", "yes", "1" };
	static const char *const off[] = { "off", "false", "no", "0" };

	for (size_t i = 0; text && i < ST_ARRAY_SIZE(on); i++) {
		if (!strcmp(text, on[i]))
			return 1;
		if (!strcmp(text, off[i]))
			return 0;
	}
	return -EINVAL;
}

int st_parse_budget(const char *text, uint64_t *ret_bytes, double *ret_percent)
{
	size_t n;

	*ret_bytes = 0;
	*ret_percent = 0;
	if (!text)
		return -EINVAL;
	n = strlen(text);
	if (n > 1 && text[n - 1] == '%') {
		char *end;
		double p = strtod(text, &end);

		if (end != text + n - 1 || !(p > 0) || p > 100)
			return -EINVAL;
		*ret_percent = p;
		return 0;
	}
	if (st_parse_size(text, ret_bytes) < 0 || *ret_bytes == 0)
		return -EINVAL;
	return 0;
}

char *st_format_bytes(uint64_t bytes, char *buf, size_t len)
{
	static const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)bytes;
	int i = 0;

	while (v >= 1024 && i < 5) {
		v /= 1024;
		i++;
	}
	if (i == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.2f %s", v, u[i]);
	return buf;
}

int st_read_file(const char *path, char **ret_buf, size_t *ret_len)
{
	size_t cap = 4096, got = 0;
	struct stat st;
	char *buf;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	/* /proc files report size 0: read until EOF, sized from st_size
	 * when there is one */
	if (fstat(fd, &st) == 0 && st.st_size > 0)
		cap = (size_t)st.st_size + 1;
	buf = malloc(cap);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	for (;;) {
		ssize_t r;

		if (got + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);

			if (!nb) {
				free(buf);
				close(fd);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		r = read(fd, buf + got, cap - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = -errno;

			free(buf);
			close(fd);
			return e;
		}
		if (r == 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	buf[got] = 0;
	*ret_buf = buf;
	if (ret_len)
		*ret_len = got;
	return 0;
}

int st_write_file(const char *path, const void *buf, size_t len)
{
	const char *p = buf;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		return -errno;
	while (len) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			int e = -errno;
			close(fd);
			return e;
		}
		p += w;
		len -= (size_t)w;
	}
	if (close(fd) < 0)
		return -errno;
	return 0;
}

int st_write_file_durable(const char *path, const void *buf, size_t len,
			  unsigned mode)
{
	const char *p = buf;
	char tmp[4200], dir[4200], *slash;
	int fd, dfd, r = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp-XXXXXX", path) >=
	    (int)sizeof(tmp))
		return -ENAMETOOLONG;
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0)
		r = -errno;
	while (len && !r) {
		ssize_t w = write(fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			r = w < 0 ? -errno : -EIO;
			break;
		}
		p += w;
		len -= (size_t)w;
	}
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (close(fd) < 0 && !r)
		r = -errno;
	if (!r && rename(tmp, path) < 0)
		r = -errno;
	if (r) {
		unlink(tmp);
		return r;
	}
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash == dir)
		slash[1] = 0;
	else if (slash)
		*slash = 0;
	else
		snprintf(dir, sizeof(dir), ".");
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	if (fsync(dfd) < 0)
		r = -errno;
	close(dfd);
	return r;
}

int st_mkdir_p(const char *path, unsigned mode)
{
	char tmp[4096];
	size_t n = strlen(path);

	if (n == 0 || n >= sizeof(tmp))
		return -ENAMETOOLONG;
	memcpy(tmp, path, n + 1);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, mode) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag,
		  struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path) < 0 ? -errno : 0;
}

int st_rm_rf(const char *path)
{
	int r;

	if (!st_path_exists(path))
		return 0;
	r = nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return r < 0 ? -errno : r;
}

int st_path_exists(const char *path)
{
	struct stat st;

	return lstat(path, &st) == 0;
}

/* On x86-64 the dispatching entry point of libxxhash (AVX2 / AVX-512 when
 * the CPU has them): XXH3_64bits of the distribution's library is built for
 * SSE2 and ran at 8-11 GB/s on an 18 MB expert record on the 2-vCPU test VM
 * against 16-26 GB/s dispatched (issue 25: expertd checks every record it
 * reads with this, on the cores that compute).  Same function, same hash. */
uint64_t st_xxh3(const void *buf, size_t len)
{
	return (uint64_t)ST_XXH3_64(buf, len);
}

static uint64_t proc_status_kib(int pid, const char *key)
{
	char path[64], line[256];
	uint64_t kib = 0;
	size_t klen = strlen(key);
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/status", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	f = fopen(path, "re");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, klen)) {
			kib = strtoull(line + klen, NULL, 10);
			break;
		}
	fclose(f);
	return kib * 1024;
}

uint64_t st_peak_rss_bytes(void)
{
	return proc_status_kib(0, "VmHWM:");
}

uint64_t st_pid_peak_rss_bytes(int pid)
{
	return proc_status_kib(pid, "VmHWM:");
}

uint64_t st_pid_rss_bytes(int pid)
{
	return proc_status_kib(pid, "VmRSS:");
}

/* PF_EXITING of include/linux/sched.h: the task is in do_exit() */
#define ST_PF_EXITING 0x4u

int st_pid_alive(int pid)
{
	char path[64], stat_line[512];
	FILE *f;
	int alive;

	if (pid <= 0)
		return 0;
	alive = kill(pid, 0) == 0 || errno == EPERM;
	if (!alive)
		return 0;
	/* a zombie (killed, not yet reaped) owns nothing any more, nor does
	 * a process already in its exit path: the kernel sets PF_EXITING
	 * (0x4 in field 9, "flags", of /proc/PID/stat; proc(5)) before it
	 * closes the process's files, so a peer that reads EOF from a killed
	 * process's socket finds it dead here, never "alive" */
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "re");
	if (f) {
		if (fgets(stat_line, sizeof(stat_line), f)) {
			char *rp = strrchr(stat_line, ')');
			unsigned int flags = 0;
			char state = 0;

			if (rp && rp[1] == ' ') {
				state = rp[2];
				if (sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %u",
					   &flags) != 1)
					flags = 0;
				if (state == 'Z' || state == 'X' ||
				    (flags & ST_PF_EXITING))
					alive = 0;
			}
		}
		fclose(f);
	}
	return alive;
}

int st_pid_start_ticks(int pid, uint64_t *ret_ticks)
{
	char path[64], line[1024], *p;
	unsigned long long ticks;
	FILE *f;
	int field;

	if (pid <= 0)
		return -ESRCH;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return errno == ENOENT ? -ESRCH : -errno;
	p = fgets(line, sizeof(line), f);
	fclose(f);
	if (!p)
		return -ESRCH; /* reaped between open and read */
	/* the name (field 2) may hold spaces and parentheses: fields are
	 * counted from the last ')', which ends it; field 3 follows */
	p = strrchr(line, ')');
	if (!p)
		return -EIO;
	p++;
	for (field = 2; field < 21 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &ticks) != 1)
		return -EIO;
	*ret_ticks = ticks;
	return 0;
}

int st_pid_alive_since(int pid, uint64_t start_ticks)
{
	uint64_t now;

	if (!st_pid_alive(pid))
		return 0;
	if (start_ticks == 0)
		return 1;
	return st_pid_start_ticks(pid, &now) == 0 && now == start_ticks;
}

uint64_t st_random_id(void)
{
	uint64_t id = 0;

	if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != sizeof(id))
		id = st_xxh3(&(uint64_t[2]){ st_now_ns(), (uint64_t)getpid() },
			     16);
	id &= INT64_MAX;
	return id ? id : 1;
}

int st_peer_check(int32_t pid, uint64_t claimed_ticks, const char *daemon,
		  uint64_t *ret_ticks, struct st_diag *diag)
{
	uint64_t ticks = 0;

	*ret_ticks = 0;
	if (st_pid_start_ticks(pid, &ticks) < 0 || !st_pid_alive(pid))
		return st_diag_set(diag, -ESRCH,
				   "HELLO from pid %d, which %s cannot see: "
				   "the client runs in another pid namespace "
				   "(a container?) or has exited; run it in "
				   "%s's pid namespace (docker: --pid=host, "
				   "or --pid=container:<%s's container>)",
				   (int)pid, daemon, daemon, daemon);
	if (claimed_ticks && claimed_ticks != ticks)
		return st_diag_set(diag, -ESRCH,
				   "HELLO from pid %d, but pid %d here is "
				   "another process (start time %llu, the "
				   "client says %llu): the client runs in "
				   "another pid namespace (a container?); run "
				   "it in %s's pid namespace (docker: "
				   "--pid=host, or --pid=container:<%s's "
				   "container>)", (int)pid,
				   (int)pid, (unsigned long long)ticks,
				   (unsigned long long)claimed_ticks, daemon,
				   daemon);
	*ret_ticks = ticks;
	return 0;
}
