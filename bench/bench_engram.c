/*
 * bench_engram.c — expertd's Engram tier against the raw device: random
 * Engram row lookups per second through expertd (es_client_engram_fetch),
 * bytes read per lookup, block read latency (median / p99), and the ratio
 * to raw O_DIRECT 4 KiB random-read IOPS of the same engram.bin measured
 * in the same run.  Prints figures, asserts nothing (STYLE.md).
 *
 * Needs an expertd serving a V4.1 store (scripts/bench-engram.sh makes a
 * V4.1-shaped store with a 2 GiB table, starts expertd with a smaller
 * --engram-cache, runs this and stops it).
 *
 *   strata-bench-engram --store DIR --instance NAME --run-dir DIR
 *                       [--seconds S] [--rows-per-token N] [--qd N]
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ST_HAVE_LIBURING
#include <liburing.h>
#endif

#include "es_client.h"
#include "es_engram_proto.h"
#include "st_engram_file.h"
#include "st_store.h"
#include "st_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

struct raw_result {
	uint64_t reads;
	double secs;
	uint64_t hist[ES_ENGRAM_LAT_BUCKETS];
	const char *engine;
	int qd;
};

/* Random aligned 4 KiB O_DIRECT reads of the table's blocks for `secs`. */
static int raw_reads(const char *path, const struct st_engram_layout *l,
		     int qd, double secs, struct raw_result *res)
{
	int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	uint64_t t_end, t0 = st_now_ns();
	uint8_t *buf;

	memset(res, 0, sizeof(*res));
	if (fd < 0) {
		fprintf(stderr, "bench-engram: %s: O_DIRECT open: %s\n", path,
			strerror(errno));
		return -errno;
	}
	if (posix_memalign((void **)&buf, 4096, (size_t)qd * 4096)) {
		close(fd);
		return -ENOMEM;
	}
	t_end = t0 + (uint64_t)(secs * 1e9);
#ifdef ST_HAVE_LIBURING
	{
		struct io_uring ring;
		uint64_t *ts = calloc((size_t)qd, sizeof(uint64_t));
		int inflight = 0;

		if (io_uring_queue_init((unsigned)qd, &ring, 0) == 0 && ts) {
			res->engine = "io_uring";
			res->qd = qd;
			for (;;) {
				struct io_uring_cqe *cqe;
				uint64_t now = st_now_ns();

				for (int k = 0; k < qd && now < t_end; k++) {
					struct io_uring_sqe *sqe;

					if (ts[k])
						continue;
					sqe = io_uring_get_sqe(&ring);
					if (!sqe)
						break;
					io_uring_prep_read(sqe, fd, buf + (size_t)k * 4096,
							   4096, (l->first_block +
							   next_rand() % l->n_blocks) * 4096);
					io_uring_sqe_set_data64(sqe, (uint64_t)k);
					ts[k] = now;
					inflight++;
				}
				if (!inflight)
					break;
				io_uring_submit(&ring);
				if (io_uring_wait_cqe(&ring, &cqe))
					break;
				do {
					int k = (int)io_uring_cqe_get_data64(cqe);

					res->hist[es_engram_lat_bucket(st_now_ns() -
								       ts[k])]++;
					res->reads += cqe->res == 4096;
					ts[k] = 0;
					inflight--;
					io_uring_cqe_seen(&ring, cqe);
				} while (io_uring_peek_cqe(&ring, &cqe) == 0);
			}
			io_uring_queue_exit(&ring);
			free(ts);
			goto done;
		}
		free(ts);
	}
#endif
	res->engine = "pread";
	res->qd = 1;
	while (st_now_ns() < t_end) {
		uint64_t t = st_now_ns();

		if (pread(fd, buf, 4096, (off_t)((l->first_block + next_rand() %
						   l->n_blocks) * 4096)) == 4096)
			res->reads++;
		res->hist[es_engram_lat_bucket(st_now_ns() - t)]++;
	}
#ifdef ST_HAVE_LIBURING
done:
#endif
	res->secs = (double)(st_now_ns() - t0) / 1e9;
	free(buf);
	close(fd);
	return 0;
}

static void stats_delta(const struct es_engram_stats *a,
			const struct es_engram_stats *b,
			struct es_engram_stats *d)
{
	memset(d, 0, sizeof(*d));
	d->lookups = b->lookups - a->lookups;
	d->hits = b->hits - a->hits;
	d->merged = b->merged - a->merged;
	d->misses = b->misses - a->misses;
	d->reads = b->reads - a->reads;
	d->read_bytes = b->read_bytes - a->read_bytes;
	for (int i = 0; i < ES_ENGRAM_LAT_BUCKETS; i++)
		d->lat_hist[i] = b->lat_hist[i] - a->lat_hist[i];
	d->lat_p50_ns = es_engram_lat_quantile(d->lat_hist, 0.5);
	d->lat_p99_ns = es_engram_lat_quantile(d->lat_hist, 0.99);
}

/* Lookups through expertd for `secs`: n rows per token, uniformly random
 * over layer li; with ahead, the next token's rows are prefetched before
 * the current token's are fetched. */
static int tier_run(struct es_client *c, int li, int64_t rows, int n,
		    double secs, int ahead, double raw_iops)
{
	struct st_diag diag = { "" };
	struct es_engram_stats s0, s1, d;
	int64_t *cur = malloc(sizeof(int64_t) * n);
	int64_t *nxt = malloc(sizeof(int64_t) * n);
	float *out = malloc(sizeof(float) * n * 256);
	uint64_t tokens = 0, t0, t_end;
	double el;
	int r = 0;

	for (int i = 0; i < n; i++)
		nxt[i] = (int64_t)(next_rand() % (uint64_t)rows);
	es_client_engram_stats(c, &s0, &diag);
	t0 = st_now_ns();
	t_end = t0 + (uint64_t)(secs * 1e9);
	while (st_now_ns() < t_end && !r) {
		int64_t *t = cur;

		cur = nxt;
		nxt = t;
		for (int i = 0; i < n; i++)
			nxt[i] = (int64_t)(next_rand() % (uint64_t)rows);
		if (ahead)
			r = es_client_engram_prefetch(c, li, n, nxt, &diag);
		if (!r)
			r = es_client_engram_fetch(c, li, n, cur, out, &diag);
		tokens++;
	}
	el = (double)(st_now_ns() - t0) / 1e9;
	es_client_engram_stats(c, &s1, &diag);
	if (r) {
		fprintf(stderr, "bench-engram: %s\n", diag.msg);
		goto out;
	}
	stats_delta(&s0, &s1, &d);
	printf("tier %-9s tokens %.0f/s (%d rows each), rows asked %.0f/s "
	       "(fetch%s), "
	       "hit rate %.1f %% (+%.1f %% joined in flight), reads %.0f/s "
	       "= %.2f x raw IOPS, %.0f bytes read per row asked, block read "
	       "latency p50 %.1f us p99 %.1f us, fetch latency %.1f us/token\n",
	       ahead ? "prefetch" : "demand", (double)tokens / el, n,
	       (double)d.lookups / el, ahead ? " + prefetch" : "",
	       d.lookups ? 100.0 * (double)d.hits / (double)d.lookups : 0.0,
	       d.lookups ? 100.0 * (double)d.merged / (double)d.lookups : 0.0,
	       (double)d.reads / el,
	       raw_iops > 0 ? (double)d.reads / el / raw_iops : 0.0,
	       d.lookups ? (double)d.read_bytes / (double)d.lookups : 0.0,
	       d.lat_p50_ns / 1e3, d.lat_p99_ns / 1e3,
	       tokens ? el * 1e6 / (double)tokens : 0.0);
out:
	free(cur);
	free(nxt);
	free(out);
	return r;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "store", required_argument, NULL, 's' },
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 't' },
		{ "rows-per-token", required_argument, NULL, 'n' },
		{ "qd", required_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *store_dir = NULL, *inst = NULL, *run_dir = NULL;
	double secs = 5;
	int n = 48, qd = 128, ch;
	struct st_diag diag = { "" };
	struct st_store *s = NULL;
	struct es_client *c = NULL;
	struct es_engram_info info;
	struct raw_result raw;
	char path[4200];
	double iops;

	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (ch) {
		case 's': store_dir = optarg; break;
		case 'i': inst = optarg; break;
		case 'r': run_dir = optarg; break;
		case 't': secs = atof(optarg); break;
		case 'n': n = atoi(optarg); break;
		case 'q': qd = atoi(optarg); break;
		default:
			printf("usage: strata-bench-engram --store DIR --instance "
			       "NAME --run-dir DIR [--seconds S (5)] "
			       "[--rows-per-token N (48)] [--qd N (128)]\n"
			       "An expertd must serve the V4.1 store DIR on that "
			       "instance (see scripts/bench-engram.sh).\n");
			return ch == 'h' ? 0 : 2;
		}
	}
	if (!store_dir || !inst || !run_dir || secs <= 0 || n < 1 ||
	    n > ES_ENGRAM_MAX_ROWS || qd < 1 || qd > 4096) {
		fprintf(stderr, "bench-engram: --store, --instance and --run-dir "
			"are required; seconds > 0, rows-per-token 1..%d, qd "
			"1..4096 (see --help)\n", ES_ENGRAM_MAX_ROWS);
		return 2;
	}
	if (st_store_open(store_dir, &s, &diag) || !s->is_dsv41) {
		fprintf(stderr, "bench-engram: %s\n", diag.msg[0] ? diag.msg :
			"not a DeepSeek-V4.1 store");
		st_store_close(s);
		return 1;
	}
	if (es_client_open(run_dir, inst, "bench-engram", 10000, &c, &diag) ||
	    es_client_engram_info(c, &info, &diag)) {
		fprintf(stderr, "bench-engram: %s\n", diag.msg);
		es_client_close(c);
		st_store_close(s);
		return 1;
	}
	printf("table      layer %d: %" PRId64 " rows x %u B = %.2f GiB on "
	       "disk; expertd cache %" PRIu64 " rows (%.1f %% of the table), "
	       "reads %s%s\n", info.layer_id[0], info.rows[0],
	       info.row_bytes[0],
	       (double)s->engram[0].n_blocks * 4096 / (1 << 30),
	       info.cache_rows, 100.0 * (double)info.cache_rows /
	       (double)info.rows[0], info.io_uring ? "io_uring" : "pread",
	       info.direct ? " O_DIRECT" : " buffered");
	snprintf(path, sizeof(path), "%s/%s", store_dir, ST_ENGRAM_FILE);
	if (raw_reads(path, &s->engram[0], qd, secs, &raw) == 0) {
		iops = (double)raw.reads / raw.secs;
		printf("raw        O_DIRECT 4 KiB random reads, %s QD %d: %.0f "
		       "IOPS (%.1f MB/s), latency p50 %.1f us p99 %.1f us\n",
		       raw.engine, raw.qd, iops, iops * 4096 / 1e6,
		       es_engram_lat_quantile(raw.hist, 0.5) / 1e3,
		       es_engram_lat_quantile(raw.hist, 0.99) / 1e3);
	} else {
		iops = 0;
	}
	tier_run(c, 0, info.rows[0], n, secs, 0, iops);
	tier_run(c, 0, info.rows[0], n, secs, 1, iops);
	es_client_close(c);
	st_store_close(s);
	return 0;
}
