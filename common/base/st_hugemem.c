/*
 * st_hugemem.c — huge-page advised buffers for streamed weights
 * (st_hugemem.h).
 */
#include "st_hugemem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The advice for new mappings: MADV_HUGEPAGE unless STRATA_HUGE_PAGES=0. */
static int advice(void)
{
	const char *e = getenv("STRATA_HUGE_PAGES");

	return e && strcmp(e, "0") == 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE;
}

static size_t page_up(size_t n)
{
	const size_t pg = 4096;

	return (n + pg - 1) / pg * pg;
}

int st_hugemem_alloc(size_t bytes, void **ret)
{
	uint8_t *m, *start;
	size_t len, head, tail;

	if (bytes == 0)
		return -EINVAL;
	if (bytes < ST_HUGEMEM_MIN) {
		*ret = calloc(1, bytes);
		return *ret ? 0 : -ENOMEM;
	}
	/* map one alignment more, then cut the unaligned head and the tail */
	len = page_up(bytes);
	if (len > SIZE_MAX - ST_HUGEMEM_ALIGN)
		return -ENOMEM;
	m = mmap(NULL, len + ST_HUGEMEM_ALIGN, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	start = (uint8_t *)(((uintptr_t)m + ST_HUGEMEM_ALIGN - 1) &
			    ~(uintptr_t)(ST_HUGEMEM_ALIGN - 1));
	head = (size_t)(start - m);
	tail = ST_HUGEMEM_ALIGN - head;
	if (head)
		munmap(m, head);
	if (tail)
		munmap(start + len, tail);
	/* advice only: a kernel without THP leaves 4 KiB pages */
	(void)madvise(start, len, advice());
	*ret = start;
	return 0;
}

void st_hugemem_free(void *p, size_t bytes)
{
	if (!p)
		return;
	if (bytes < ST_HUGEMEM_MIN)
		free(p);
	else
		munmap(p, page_up(bytes));
}

int st_hugemem_read_file(const char *path, size_t bytes, void **ret,
			 struct st_diag *diag)
{
	struct stat st;
	uint8_t *buf;
	size_t done = 0;
	int fd, r;

	if (bytes == 0)
		return st_diag_set(diag, -EINVAL, "%s: nothing to read", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_diag_set(diag, -errno, "%s: %s", path,
				   strerror(errno));
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != (uint64_t)bytes) {
		close(fd);
		return st_diag_set(diag, -EIO,
				   "%s: size differs from the manifest (%zu "
				   "bytes expected); re-run strata convert",
				   path, bytes);
	}
	if ((r = st_hugemem_alloc(bytes, (void **)&buf)) < 0) {
		close(fd);
		return st_diag_set(diag, r, "%s: cannot allocate %zu bytes for "
				   "it", path, bytes);
	}
	/* the file is read sequentially, once */
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	while (done < bytes) {
		const size_t chunk = bytes - done < (64u << 20) ?
					     bytes - done : (64u << 20);
		ssize_t n = pread(fd, buf + done, chunk, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			close(fd);
			st_hugemem_free(buf, bytes);
			return st_diag_set(diag, r, "%s: read at byte %zu: %s",
					   path, done,
					   n < 0 ? strerror(-r) :
						   "file ended early");
		}
		done += (size_t)n;
	}
	close(fd);
	*ret = buf;
	return 0;
}

int st_hugemem_state(const void *p, int *advised, long long *huge)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	char line[512];
	int in = 0, found = 0;

	if (!f)
		return -errno;
	*advised = 0;
	*huge = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		long long kb;

		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			if (in)
				break; /* past p's mapping */
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			found |= in;
			continue;
		}
		if (!in)
			continue;
		if (sscanf(line, "AnonHugePages: %lld kB", &kb) == 1)
			*huge = kb * 1024;
		else if (strncmp(line, "VmFlags:", 8) == 0)
			*advised = strstr(line + 8, " hg") != NULL;
	}
	fclose(f);
	return found ? 0 : -ENOENT;
}

const char *st_hugemem_why_not(size_t bytes)
{
	if (bytes < ST_HUGEMEM_MIN)
		return "under 2 MiB: heap memory";
	if (advice() != MADV_HUGEPAGE)
		return "STRATA_HUGE_PAGES=0";
	return NULL;
}

int st_hugemem_advised(const void *p)
{
	int advised, r;
	long long huge;

	r = st_hugemem_state(p, &advised, &huge);
	return r < 0 ? r : advised;
}

long long st_hugemem_huge_bytes(const void *p)
{
	int advised, r;
	long long huge;

	r = st_hugemem_state(p, &advised, &huge);
	return r < 0 ? r : huge;
}

int st_hugemem_shm_policy(const char *mounts)
{
	FILE *f = fopen(mounts ? mounts : "/proc/self/mounts", "re");
	char line[1024];
	int r = -ENOENT;

	if (!f)
		return -errno;
	/* "DEV MOUNTPOINT TYPE OPTIONS ..."; the last /dev/shm line is the
	 * mount on top */
	while (fgets(line, sizeof(line), f)) {
		char dev[256], mnt[256], type[64], opts[512];
		const char *h;

		if (sscanf(line, "%255s %255s %63s %511s", dev, mnt, type,
			   opts) != 4 || strcmp(mnt, "/dev/shm") != 0)
			continue;
		r = 0;
		for (h = opts; (h = strstr(h, "huge=")) != NULL; h += 5)
			if (h == opts || h[-1] == ',')
				r = strncmp(h + 5, "never", 5) != 0 &&
				    strncmp(h + 5, "deny", 4) != 0;
	}
	fclose(f);
	return r;
}
