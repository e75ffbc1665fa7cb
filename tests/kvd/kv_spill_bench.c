/*
 * kv_spill_bench.c — kv-spill-bench: how fast kvd's spill tier moves pages
 * compared with what the disk under the spill file can do (issue 4: spill
 * and restore GB/s next to raw file bandwidth, target >= 80 %).
 *
 * In one process, on the pool logic kvd runs (kv_pool.c, kv_spill.c):
 *  1. a sequence fills a pool of SIZE bytes with known rows;
 *  2. a second sequence asks for as much: the first one's pages all spill
 *     (spill GB/s = bytes written / time in the spill path: checksums,
 *     writes, bookkeeping);
 *  3. the second one goes, the first is restored (restore GB/s = bytes read
 *     / time reading and verifying) and its rows are checked;
 *  4. raw: the same file written, then read, sequentially with O_DIRECT in
 *     KV_SPILL_IO_BYTES requests from one aligned buffer (cold: O_DIRECT
 *     bypasses the page cache).
 * Each repetition (--reps) does both, one after the other, so that a disk
 * whose speed drifts (shared or virtual disks do) weighs on both alike; the
 * best of each is printed with the ratio.  Prints figures only, never
 * fails on time (it fails only when a restored page differs).
 *
 * usage: kv-spill-bench [--mib N] [--page-kib K] [--reps R] [--dir DIR]
 * (defaults: 256 MiB, 128 KiB pages, 5 reps, $KV_SPILL_BENCH_DIR or the
 * build directory; the file is removed at the end)
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_util.h"

struct opts {
	uint64_t mib;
	uint32_t page_kib;
	int reps;
	const char *dir;
};

static double gbps(uint64_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0.0;
}

/* Raw sequential O_DIRECT write then read of `bytes` of path; best of
 * reps each (GB/s).  0 or -errno. */
static int raw_bw(const char *path, uint64_t bytes, int reps,
		  double *ret_w, double *ret_r, int *ret_direct)
{
	const size_t chunk = KV_SPILL_IO_BYTES;
	uint8_t *buf = aligned_alloc(KV_SLOT_ALIGN, chunk);
	int fd, direct = 1;

	*ret_w = *ret_r = 0;
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < chunk; i++)
		buf[i] = (uint8_t)(i * 31u + 7u);
	fd = open(path, O_RDWR | O_DIRECT);
	if (fd < 0 && errno == EINVAL) {
		direct = 0;
		fd = open(path, O_RDWR);
	}
	if (fd < 0) {
		free(buf);
		return -errno;
	}
	for (int rep = 0; rep < reps; rep++) {
		uint64_t t0 = st_now_ns(), t1;

		for (uint64_t off = 0; off < bytes; off += chunk)
			if (pwrite(fd, buf, ST_MIN(chunk, bytes - off),
				   (off_t)off) < 0)
				goto fail;
		t1 = st_now_ns();
		*ret_w = ST_MAX(*ret_w, gbps(bytes, t1 - t0));
		if (!direct)
			posix_fadvise(fd, 0, (off_t)bytes, POSIX_FADV_DONTNEED);
		t0 = st_now_ns();
		for (uint64_t off = 0; off < bytes; off += chunk)
			if (pread(fd, buf, ST_MIN(chunk, bytes - off),
				  (off_t)off) < 0)
				goto fail;
		t1 = st_now_ns();
		*ret_r = ST_MAX(*ret_r, gbps(bytes, t1 - t0));
	}
	close(fd);
	free(buf);
	*ret_direct = direct;
	return 0;
fail:
	{
		int e = -errno;

		close(fd);
		free(buf);
		return e;
	}
}

static int parse(int argc, char **argv, struct opts *o)
{
	o->mib = 256;
	o->page_kib = 128;
	o->reps = 5;
	o->dir = getenv("KV_SPILL_BENCH_DIR");
	if (!o->dir)
		o->dir = getenv("STRATA_BUILD_DIR");
	if (!o->dir)
		o->dir = ".";
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			return -1;
		if (!strcmp(argv[i], "--mib"))
			o->mib = strtoull(v, NULL, 10);
		else if (!strcmp(argv[i], "--page-kib"))
			o->page_kib = (uint32_t)strtoul(v, NULL, 10);
		else if (!strcmp(argv[i], "--reps"))
			o->reps = atoi(v);
		else if (!strcmp(argv[i], "--dir"))
			o->dir = v;
		else
			return -1;
		i++;
	}
	if (o->mib == 0 || o->page_kib == 0 || o->page_kib > 16384 ||
	    o->reps <= 0)
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct kv_stream_decl sd = { 0, 1, 0, 0 };
	struct kv_layout lay;
	struct kv_pool p;
	struct st_diag d = { { 0 } };
	char dir[4096], path[4200];
	uint64_t n_pages, bytes;
	double best_s = 0, best_r = 0, raw_w = 0, raw_r = 0;
	uint32_t a, b, rows;
	int raw_direct = 0, bad = 0, r;
	void *mem;

	if (parse(argc, argv, &o) < 0) {
		fprintf(stderr, "usage: kv-spill-bench [--mib N] [--page-kib K] "
			"[--reps R] [--dir DIR]\n");
		return 2;
	}
	/* one stream, rows of 4 KiB: page = page_kib KiB */
	sd.row_bytes = 4096;
	rows = o.page_kib / 4 ? o.page_kib / 4 : 1;
	n_pages = (o.mib << 20) / ((uint64_t)rows * 4096);
	bytes = n_pages * rows * 4096ull;
	r = kv_layout_compute_spill(&sd, 1, rows, bytes, bytes, 4,
				    (uint32_t)ST_MIN(n_pages * rows,
						     (uint64_t)KV_MAX_ROWS_PER_SEQ),
				    &lay, &d);
	if (r < 0) {
		fprintf(stderr, "kv-spill-bench: %s\n", d.msg);
		return 1;
	}
	if (posix_memalign(&mem, 2u << 20, lay.total_bytes) != 0)
		mem = NULL;
	if (!mem || kv_pool_format(&p, mem, lay.total_bytes, &lay, &sd) < 0) {
		fprintf(stderr, "kv-spill-bench: no memory for %llu bytes\n",
			(unsigned long long)lay.total_bytes);
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s/kv-spill-bench.XXXXXX", o.dir);
	if (!mkdtemp(dir)) {
		fprintf(stderr, "kv-spill-bench: mkdtemp in %s: %s\n", o.dir,
			strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "%s/kvd.spill", dir);
	if (kv_spill_open(&p, path, 0, &d) < 0) {
		fprintf(stderr, "kv-spill-bench: %s\n", d.msg);
		return 1;
	}
	printf("kv-spill-bench: %llu pages of %llu KiB (%.0f MiB), spill file "
	       "%s (%s)\n", (unsigned long long)n_pages,
	       (unsigned long long)(lay.page_bytes >> 10),
	       (double)bytes / (1 << 20), path,
	       p.spill.direct ? "O_DIRECT" : "buffered: no O_DIRECT here");
	for (int rep = 0; rep < o.reps; rep++) {
		struct kv_reserve_entry e;
		uint64_t s0 = p.stats.spill_ns_total,
			 sb0 = p.stats.spill_bytes_total,
			 r0 = p.stats.restore_ns_total,
			 rb0 = p.stats.restore_bytes_total;
		int32_t st;

		kv_seq_create(&p, 1, 1, 0, 0, &a, &d);
		kv_seq_create(&p, 1, 1, 0, 0, &b, &d);
		e = (struct kv_reserve_entry){ a, (uint32_t)(n_pages * rows) };
		if (kv_seq_reserve(&p, 1, 1, &e, &d) < 0)
			goto fail;
		for (uint64_t pi = 0; pi < n_pages; pi++) {
			uint8_t *pg = kv_page_data(&p, kv_seq_page(&p,
				kv_seq_index(a), 0, (uint32_t)pi));

			memset(pg, (int)(pi * 13 + rep), lay.page_bytes);
			memcpy(pg, &pi, sizeof(pi));
		}
		/* b takes the whole pool: all of a spills */
		e = (struct kv_reserve_entry){ b, (uint32_t)(n_pages * rows) };
		if (kv_seq_reserve(&p, 1, 1, &e, &d) < 0)
			goto fail;
		kv_seq_free(&p, 1, b, &d);
		if (kv_seq_residency(&p, 1, KV_RESIDENCY_RESTORE, 1, &a, &st,
				     &d) < 0)
			goto fail;
		for (uint64_t pi = 0; pi < n_pages; pi++) {
			const uint8_t *pg = kv_page_data(&p, kv_seq_page(&p,
				kv_seq_index(a), 0, (uint32_t)pi));
			uint64_t tag;

			memcpy(&tag, pg, sizeof(tag));
			bad += tag != pi ||
			       pg[lay.page_bytes - 1] != (uint8_t)(pi * 13 + rep);
		}
		kv_seq_free(&p, 1, a, &d);
		best_s = ST_MAX(best_s, gbps(p.stats.spill_bytes_total - sb0,
					     p.stats.spill_ns_total - s0));
		best_r = ST_MAX(best_r, gbps(p.stats.restore_bytes_total - rb0,
					     p.stats.restore_ns_total - r0));
		{
			double w, rd;

			r = raw_bw(path, bytes, 1, &w, &rd, &raw_direct);
			if (r < 0) {
				fprintf(stderr, "kv-spill-bench: raw I/O on "
					"%s: %s\n", path, st_strerror(r));
				kv_spill_close(&p, 1);
				rmdir(dir);
				return 1;
			}
			raw_w = ST_MAX(raw_w, w);
			raw_r = ST_MAX(raw_r, rd);
			printf("  rep %d: spill %.2f, raw write %.2f, restore "
			       "%.2f, raw read %.2f GB/s\n", rep + 1,
			       gbps(p.stats.spill_bytes_total - sb0,
				    p.stats.spill_ns_total - s0), w,
			       gbps(p.stats.restore_bytes_total - rb0,
				    p.stats.restore_ns_total - r0), rd);
		}
	}
	kv_spill_close(&p, 0);
	printf("spill   %6.2f GB/s   raw write %6.2f GB/s%s   ratio %5.1f %%\n",
	       best_s, raw_w, raw_direct ? " (O_DIRECT)" : " (buffered)",
	       raw_w > 0 ? 100.0 * best_s / raw_w : 0.0);
	printf("restore %6.2f GB/s   raw read  %6.2f GB/s%s   ratio %5.1f %%\n",
	       best_r, raw_r, raw_direct ? " (O_DIRECT)" : " (buffered)",
	       raw_r > 0 ? 100.0 * best_r / raw_r : 0.0);
	printf("best of %d; pages verified after each restore: %s\n", o.reps,
	       bad ? "MISMATCH" : "all identical");
	unlink(path);
	rmdir(dir);
	kv_pool_fini(&p);
	free(mem);
	return bad ? 1 : 0;
fail:
	fprintf(stderr, "kv-spill-bench: %s\n", d.msg);
	kv_spill_close(&p, 1);
	rmdir(dir);
	return 1;
}
