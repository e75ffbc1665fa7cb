/*
 * bench_kern.c — matvec kernel throughput per weight format and kernel
 * path, on matrices far larger than the last-level cache: the reference
 * kernels (dequantize to float, fixed order), the fast portable C kernels
 * and the fast SIMD ones (int8 activations for 4-bit weights), in GB/s of
 * weights read, next to the machine's read bandwidth (st_membw) with the
 * same thread count.  With --batch N (N > 1) also the fast backends'
 * small-batch GEMM (matmul_act) for N tokens: GB/s of weights (each read
 * once for the N tokens) and the equivalent matvec GB/s (N times that).
 * With --pool N only the thread pool's cost: N empty jobs of
 * 4 tasks per thread (as a decode step's matvecs split), wall ns per job
 * (median of 5 runs): the wake-up, claim and completion-barrier cost a
 * decode step pays once per matvec.
 * Prints figures, asserts nothing.
 *
 * With --format S only the formats whose name starts with S (e.g. FP8).
 * The matrices live in huge-page advised memory as computed's dense
 * weights do (st_hugemem.h); STRATA_HUGE_PAGES=0 gives 4 KiB pages.
 *
 * Usage: strata-bench-kern [--mib N] [--threads N] [--reps N] [--batch N]
 *                          [--cols N] [--pool N] [--format S]
 */
#include <getopt.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_backend.h"
#include "cw_kern.h"
#include "cw_threads.h"
#include "st_formats.h"
#include "st_hugemem.h"
#include "st_membw.h"
#include "st_mxfp4il.h"
#include "st_util.h"

/* CPU time of this thread in ns (time the scheduler gave it). */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct job {
	const struct cw_backend_ops *be;
	const struct cw_wview *w;
	const struct cw_act *a;
	float *y;
	int n;            /* tokens: > 1 runs matmul_act */
	float *const *ys; /* their outputs */
};

static void task(void *arg, int t, int n)
{
	const struct job *j = arg;
	int64_t r0 = j->w->rows * t / n, r1 = j->w->rows * (t + 1) / n;

	if (j->n > 1)
		j->be->matmul_act(j->w, j->a, j->n, j->ys, r0, r1);
	else
		j->be->matvec_act(j->w, j->a, j->y, r0, r1);
}

static void empty_task(void *arg, int t, int n)
{
	(void)arg;
	(void)t;
	(void)n;
}

static int cmp_u64(const void *a, const void *b)
{
	const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* --pool: wall ns per empty job of 4 tasks per thread, median of 5. */
static void bench_pool(struct cw_threads *pool, int n_threads, int n_jobs)
{
	uint64_t ns[5];

	for (int r = 0; r < 5; r++) {
		const uint64_t t0 = st_now_ns();

		for (int i = 0; i < n_jobs; i++)
			cw_threads_run(pool, empty_task, NULL, 4 * n_threads);
		ns[r] = st_now_ns() - t0;
	}
	qsort(ns, 5, sizeof(ns[0]), cmp_u64);
	printf("thread pool, %d thread(s): %.0f ns per job (%d empty jobs of "
	       "%d tasks, median of 5 runs; min %.0f, max %.0f)\n", n_threads,
	       (double)ns[2] / n_jobs, n_jobs, 4 * n_threads,
	       (double)ns[0] / n_jobs, (double)ns[4] / n_jobs);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "mib", required_argument, NULL, 'm' },
		{ "threads", required_argument, NULL, 't' },
		{ "reps", required_argument, NULL, 'r' },
		{ "batch", required_argument, NULL, 'b' },
		{ "cols", required_argument, NULL, 'c' },
		{ "pool", required_argument, NULL, 'p' },
		{ "format", required_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const struct { enum st_dtype dt; uint32_t group; const char *name; int il; } fmts[] = {
		{ ST_DTYPE_MXFP4, 0, "MXFP4", 0 },
		{ ST_DTYPE_MXFP4, 0, "MXFP4 ocp-r16", ST_MXFP4IL_ROWS },
		{ ST_DTYPE_NVFP4, 0, "NVFP4", 0 },
		{ ST_DTYPE_E2M1_F16, 32, "E2M1-F16 g32", 0 },
		{ ST_DTYPE_F8_E4M3, 128, "FP8 E4M3 g128", 0 },
		{ ST_DTYPE_BF16, 0, "BF16", 0 },
	};
	int64_t C = 1024;
	int mib = 256, n_threads = 1, reps = 3, batch = 1, pool_jobs = 0, c;
	const char *only = "";
	struct cw_threads *pool = NULL;
	double bw = 0;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': mib = atoi(optarg); break;
		case 't': n_threads = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'b': batch = atoi(optarg); break;
		case 'c': C = atoll(optarg); break;
		case 'p': pool_jobs = atoi(optarg); break;
		case 'f': only = optarg; break;
		case 'h':
			printf("Usage: strata-bench-kern [--mib N] [--threads N] "
			       "[--reps N] [--batch N] [--cols N] [--pool N] [--format S]\nmatvec GB/s per format and kernel "
			       "path (matrices of N MiB, default 256; 1 for in-cache speed);\n"
			       "--batch N: also the fast GEMM for N tokens (1..64);\n"
			       "--cols N: columns per row (a multiple of 128, default 1024;\n"
			       "5120 or 2304 for DeepSeek-V4.1's hidden and expert widths);\n"
			       "--pool N: only the thread pool's cost per job (N empty jobs);\n"
			       "--format S: only the formats whose name starts with S (FP8, MXFP4, ...)\n");
			return 0;
		default: return 2;
		}
	}
	if (mib < 1 || n_threads < 1 || n_threads > 256 || reps < 1 ||
	    batch < 1 || batch > 64 || C < 128 || C % 128 || C > 65536 ||
	    pool_jobs < 0) {
		fprintf(stderr, "strata-bench-kern: a count is out of range "
			"(--cols: a multiple of 128 up to 65536); see --help\n");
		return 2;
	}
	if (cw_threads_create(n_threads, &pool) < 0)
		return 1;
	if (pool_jobs) {
		bench_pool(pool, n_threads, pool_jobs);
		cw_threads_destroy(pool);
		return 0;
	}
	st_membw_measure(n_threads, 1ull << 30, 5, &bw);
	printf("read bandwidth, %d thread(s): %.1f GB/s (1 GiB, best of 5)\n",
	       n_threads, bw);
	printf("%-14s %-22s %8s%s\n", "format", "kernel", "GB/s",
	       n_threads == 1 ? " GB/s per CPU-second (load-independent)" : "");
	for (size_t f = 0; f < sizeof(fmts) / sizeof(fmts[0]); f++) {
		struct st_wformat wf = { fmts[f].dt, fmts[f].group };
		uint64_t db = 0, sb = 0, tb = 0, per_row;
		int64_t rows;
		struct cw_wview w = { 0 };
		unsigned char *data, *scales;
		float *x = malloc(sizeof(float) * C), *y;
		const struct cw_backend_ops *bes[CW_KERN_PATH_MAX + 1] = {
			cw_backend_cpu() };
		int nbe = 1;

		if (strncmp(fmts[f].name, only, strlen(only)) != 0) {
			free(x);
			continue;
		}
		for (int p = CW_KERN_C; p < CW_KERN_PATH_MAX; p++)
			if (cw_backend_cpu_fast_path(p))
				bes[nbe++] = cw_backend_cpu_fast_path(p);

		if (wf.dtype == ST_DTYPE_MXFP4) wf.group = 32;
		if (wf.dtype == ST_DTYPE_NVFP4) wf.group = 16;
		if (wf.dtype == ST_DTYPE_BF16) wf.group = 0;
		st_wformat_matrix_bytes(&wf, 1, C, &db, &sb, &tb);
		per_row = db + sb;
		rows = (int64_t)((uint64_t)mib << 20) / (int64_t)per_row;
		/* as computed keeps weights: huge-page advised memory
		 * (STRATA_HUGE_PAGES=0: 4 KiB pages, for comparison) */
		if (st_hugemem_alloc((size_t)(db * rows), (void **)&data) < 0)
			data = NULL;
		scales = sb ? malloc((size_t)(sb * rows)) : NULL;
		y = malloc(sizeof(float) * rows);
		if (!data || !x || !y || (sb && !scales)) {
			fprintf(stderr, "strata-bench-kern: out of memory\n");
			return 1;
		}
		/* random codes; scales in a harmless range */
		for (uint64_t i = 0; i < db * rows; i++)
			data[i] = (unsigned char)((i * 2654435761u) >> 13) & 0x77;
		for (uint64_t i = 0; scales && i < sb * rows; i++)
			scales[i] = wf.dtype == ST_DTYPE_MXFP4 ? 120 :
				    wf.dtype == ST_DTYPE_NVFP4 ? 0x30 : 0;
		if (wf.dtype == ST_DTYPE_E2M1_F16)
			for (uint64_t i = 0; i < sb * rows / 2; i++)
				((uint16_t *)(void *)scales)[i] = 0x2000;
		if (wf.dtype == ST_DTYPE_F8_E4M3)
			for (uint64_t i = 0; i < sb * rows / 4; i++)
				((float *)(void *)scales)[i] = 0.01f;
		for (int64_t i = 0; i < C; i++)
			x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
		w.dtype = wf.dtype;
		w.data = data;
		w.scales = scales;
		w.rows = rows;
		w.cols = C;
		w.group = fmts[f].group;
		w.il_rows = fmts[f].il; /* random codes: any layout reads them */
		w.scale_type = st_wformat_scale_type(wf.dtype);
		w.global_scale = 1.0f;
		for (int b = 0; bes[b]; b++)
		for (int nb = 1; nb <= batch; nb += batch > 1 ? batch - 1 : 1) {
			const size_t ab = (bes[b]->act_bytes(C) + 63) & ~(size_t)63;
			unsigned char *abuf = malloc(ab * (size_t)nb + 64);
			struct cw_act a[64];
			float *ys[64];
			float *yb = nb > 1 ? malloc(sizeof(float) * rows * nb) : NULL;
			struct job j = { bes[b], &w, a, y, nb, ys };
			uint64_t best = UINT64_MAX, best_cpu = UINT64_MAX;
			char name[64];

			if (nb > 1 && !bes[b]->matmul_act) {
				free(abuf);
				free(yb);
				continue;
			}
			for (int t = 0; t < nb; t++) {
				bes[b]->act_prepare(x, C, wf.dtype, abuf + ab * t, &a[t]);
				ys[t] = nb > 1 ? yb + rows * t : y;
			}
			for (int r = 0; r < reps; r++) {
				uint64_t t0 = st_now_ns(), c0 = cpu_ns();

				cw_threads_run(pool, task, &j, n_threads * 8);
				best = ST_MIN(best, st_now_ns() - t0);
				best_cpu = ST_MIN(best_cpu, cpu_ns() - c0);
			}
			snprintf(name, sizeof(name), nb > 1 ? "%s GEMM x%d" : "%s",
				 bes[b]->name, nb);
			printf("%-14s %-22s %8.2f", fmts[f].name, name,
			       (double)(per_row * rows) / (double)best);
			if (n_threads == 1)
				printf(" %12.2f", (double)(per_row * rows) /
				       (double)best_cpu);
			if (nb > 1)
				printf("   (x%d tokens: %.2f matvec-equivalent GB/s%s)",
				       nb, (double)(per_row * rows) * nb /
				       (double)(n_threads == 1 ? best_cpu : best),
				       n_threads == 1 ? " per CPU-second" : "");
			printf("\n");
			fflush(stdout);
			free(abuf);
			free(yb);
		}
		st_hugemem_free(data, (size_t)(db * rows));
		free(scales);
		free(x);
		free(y);
	}
	cw_threads_destroy(pool);
	return 0;
}
