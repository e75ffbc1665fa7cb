/*
 * bench_raw.c — raw O_DIRECT read bandwidth of a store's expert files and
 * page-cache eviction for the tier benchmarks (bench_raw.h).
 */
#include "bench_raw.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_util.h"

struct raw_job {
	char path[4300];
	uint64_t off, len, req, done;
	int err;
};

static void *raw_thread(void *arg)
{
	struct raw_job *j = arg;
	void *buf = NULL;
	int fd = open(j->path, O_RDONLY | O_DIRECT | O_CLOEXEC);

	if (fd < 0 || posix_memalign(&buf, 4096, j->req)) {
		j->err = fd < 0 ? errno : ENOMEM;
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (uint64_t o = 0; o + j->req <= j->len; o += j->req) {
		ssize_t n = pread(fd, buf, j->req, (off_t)(j->off + o));

		if (n <= 0) {
			j->err = n < 0 ? errno : EIO;
			break;
		}
		j->done += (uint64_t)n;
	}
	free(buf);
	close(fd);
	return NULL;
}

double bench_raw_bandwidth(const struct st_store *s, int streams,
			   uint64_t max_bytes)
{
	struct raw_job jobs[64];
	pthread_t th[64];
	uint64_t per, done = 0, t0, t1;
	int n = streams < 1 ? 1 : streams < 64 ? streams : 64, started = 0;
	const uint64_t rb = (s->record_bytes + 4095) / 4096 * 4096;

	per = max_bytes / (uint64_t)n / rb * rb;
	for (int i = 0; i < n; i++) {
		const int l = i % s->n_layers;
		const uint64_t fsize = (uint64_t)s->n_experts * s->record_bytes;
		const uint64_t slices =
			(uint64_t)(n + s->n_layers - 1) / (uint64_t)s->n_layers;
		const uint64_t slice = fsize / slices / rb * rb;

		memset(&jobs[i], 0, sizeof(jobs[i]));
		st_store_path(s, s->expert_files[l], jobs[i].path,
			      sizeof(jobs[i].path));
		jobs[i].off = (uint64_t)(i / s->n_layers) * slice;
		jobs[i].len = per < slice ? per : slice;
		jobs[i].req = rb;
	}
	t0 = st_now_ns();
	for (; started < n; started++)
		if (pthread_create(&th[started], NULL, raw_thread,
				   &jobs[started]))
			break;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	t1 = st_now_ns();
	if (started < n)
		return -EAGAIN;
	for (int i = 0; i < n; i++) {
		if (jobs[i].err)
			return -jobs[i].err;
		done += jobs[i].done;
	}
	return (double)done / (double)(t1 - t0);
}

static void cold_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return;
	fdatasync(fd);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
}

void bench_make_cold(const struct st_store *s, int engram, int drop)
{
	char path[4300];

	for (int l = 0; l < s->n_layers; l++) {
		st_store_path(s, s->expert_files[l], path, sizeof(path));
		cold_file(path);
	}
	if (engram) {
		st_store_path(s, "engram.bin", path, sizeof(path));
		cold_file(path);
	}
	if (drop) {
		FILE *f = fopen("/proc/sys/vm/drop_caches", "we");

		sync();
		if (!f || fputs("3\n", f) < 0)
			fprintf(stderr, "bench: cannot drop the page cache "
				"(root only); continuing with fadvise\n");
		if (f)
			fclose(f);
	}
}
