/*
 * bench_cuda_gemv.c — the decode GEMV bandwidth benchmark of the CUDA
 * kernels (issue 10): for each expert format, bytes of weights and scales
 * read per cw_cu_matvec call divided by its time, on matrices of 4096 x
 * 14336 and 14336 x 4096, as a share of the device-to-device cudaMemcpy
 * bandwidth measured in the same run.
 *
 * The copy bandwidth is counted as bandwidthTest does: 2 x bytes per copy
 * (read and write) / time.  Each GEMV cycles over enough copies of its
 * matrix (>= 1 GiB in all) that the weights come from DRAM, not L2.
 *
 * usage: bench_cuda_gemv [iterations (default 50)]
 * Exits 77 "no CUDA device: <reason>" without a device, 1 on a CUDA error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_backend.h"
#include "cw_cu.h"
#include "st_error.h"
#include "st_formats.h"

#define ROTATE_BYTES (1ull << 30)

static void die(int rc, const struct st_diag *d, const char *what)
{
	if (rc) {
		fprintf(stderr, "bench_cuda_gemv: %s: %s (%s)\n", what, d->msg,
			st_strerror(rc));
		exit(1);
	}
}

/* Fills n device bytes with a pseudo-random pattern (via one host buffer),
 * keeping E4M3 and scale bytes away from NaN. */
static void fill(void *p_d, size_t n, uint8_t mask, uint8_t add)
{
	struct st_diag d = { { 0 } };
	uint8_t *h = malloc(n);
	uint64_t s = 0x2545f4914f6cdd1dull;

	if (!h) {
		fprintf(stderr, "bench_cuda_gemv: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < n; i++) {
		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		h[i] = (uint8_t)((s & mask) + add);
	}
	die(cw_cu_h2d(p_d, h, n, &d), &d, "h2d");
	free(h);
}

/* d2d copy bandwidth in GB/s (2 x bytes / time), over iters copies of
 * 512 MiB. */
static double copy_gbps(int iters)
{
	const size_t n = 512ull << 20;
	struct st_diag d = { { 0 } };
	struct cw_cu_timer *t;
	void *a, *b;
	double ms;

	die(cw_cu_alloc(&a, n, &d), &d, "cudaMalloc");
	die(cw_cu_alloc(&b, n, &d), &d, "cudaMalloc");
	die(cw_cu_memset(a, 1, n, &d), &d, "memset");
	die(cw_cu_timer_new(&t, &d), &d, "timer");
	die(cw_cu_d2d(b, a, n, &d), &d, "d2d"); /* warm up */
	cw_cu_timer_start(t);
	for (int i = 0; i < iters; i++)
		die(cw_cu_d2d(i & 1 ? a : b, i & 1 ? b : a, n, &d), &d, "d2d");
	ms = cw_cu_timer_stop_ms(t);
	cw_cu_timer_free(t);
	cw_cu_free(a);
	cw_cu_free(b);
	if (ms <= 0)
		return 0;
	return 2.0 * n * iters / (ms * 1e-3) / 1e9;
}

struct fmt {
	const char *name;
	enum st_dtype dt;
	uint32_t group;
	int code_bits;   /* per element */
	int scale_bytes; /* per group */
	uint8_t scale_mask, scale_add;
};

static const struct fmt fmts[] = {
	{ "mxfp4", ST_DTYPE_MXFP4, 32, 4, 1, 0x07, 124 },
	{ "nvfp4", ST_DTYPE_NVFP4, 16, 4, 1, 0x1f, 0x20 },
	{ "e2m1-g32", ST_DTYPE_E2M1_F16, 32, 4, 2, 0x1f, 0x20 },
	{ "e2m1-g128", ST_DTYPE_E2M1_F16, 128, 4, 2, 0x1f, 0x20 },
	{ "fp8-128", ST_DTYPE_F8_E4M3, 128, 8, 4, 0x1f, 0x20 },
	{ "bf16", ST_DTYPE_BF16, 0, 16, 0, 0, 0 },
};

static void bench(const struct fmt *f, int64_t R, int64_t C, int iters,
		  double copy)
{
	struct st_diag d = { { 0 } };
	struct cw_wview w = { .dtype = f->dt, .rows = R, .cols = C,
			      .group = f->group, .global_scale = 0.5f };
	const size_t code_bytes = (size_t)R * C * f->code_bits / 8;
	const size_t sc_bytes = f->scale_bytes ?
		(size_t)R * ((C + f->group - 1) / f->group) * f->scale_bytes : 0;
	const size_t one = code_bytes + sc_bytes;
	int copies = (int)((ROTATE_BYTES + one - 1) / one);
	void **code_d, **sc_d, *x_d, *y_d;
	struct cw_cu_timer *t;
	uint64_t wbytes;
	double ms;

	if (copies < 2)
		copies = 2;
	code_d = calloc(copies, sizeof(*code_d));
	sc_d = calloc(copies, sizeof(*sc_d));
	for (int i = 0; i < copies; i++) {
		die(cw_cu_alloc(&code_d[i], code_bytes, &d), &d, "cudaMalloc");
		if (sc_bytes)
			die(cw_cu_alloc(&sc_d[i], sc_bytes, &d), &d,
			    "cudaMalloc");
		if (i) { /* the copies: the same bytes at other addresses */
			die(cw_cu_d2d(code_d[i], code_d[0], code_bytes, &d), &d,
			    "d2d");
			if (sc_bytes)
				die(cw_cu_d2d(sc_d[i], sc_d[0], sc_bytes, &d),
				    &d, "d2d");
			continue;
		}
		/* FP8 codes: keep clear of the NaN code 0x7f; BF16 small */
		fill(code_d[i], code_bytes, f->dt == ST_DTYPE_F8_E4M3 ? 0x77 :
		     f->dt == ST_DTYPE_BF16 ? 0x3f : 0xff, 0);
		if (sc_bytes)
			fill(sc_d[i], sc_bytes, f->scale_mask, f->scale_add);
	}
	die(cw_cu_alloc(&x_d, C * 4, &d), &d, "cudaMalloc");
	die(cw_cu_alloc(&y_d, R * 4, &d), &d, "cudaMalloc");
	die(cw_cu_memset(x_d, 0, C * 4, &d), &d, "memset");
	die(cw_cu_timer_new(&t, &d), &d, "timer");
	for (int i = 0; i < copies; i++) { /* warm up */
		w.data = code_d[i];
		w.scales = sc_d[i];
		die(cw_cu_matvec(&w, x_d, y_d, NULL, &d), &d, "matvec");
	}
	die(cw_cu_sync(&d), &d, "matvec");
	cw_cu_timer_start(t);
	for (int i = 0; i < iters; i++) {
		w.data = code_d[i % copies];
		w.scales = sc_d[i % copies];
		die(cw_cu_matvec(&w, x_d, y_d, NULL, &d), &d, "matvec");
	}
	ms = cw_cu_timer_stop_ms(t);
	die(cw_cu_sync(&d), &d, "matvec");
	wbytes = cw_cu_matvec_weight_bytes(&w);
	if (ms > 0) {
		const double us = ms * 1e3 / iters,
			     gbps = (double)wbytes / (us * 1e-6) / 1e9;

		printf("gemv %-10s %5lld x %-5lld %8.2f MB/call %8.2f us "
		       "%7.1f GB/s %5.1f %% of d2d copy\n", f->name,
		       (long long)R, (long long)C, wbytes / 1e6, us, gbps,
		       copy > 0 ? 100.0 * gbps / copy : 0.0);
	}
	cw_cu_timer_free(t);
	for (int i = 0; i < copies; i++) {
		cw_cu_free(code_d[i]);
		cw_cu_free(sc_d[i]);
	}
	free(code_d);
	free(sc_d);
	cw_cu_free(x_d);
	cw_cu_free(y_d);
}

int main(int argc, char **argv)
{
	char reason[256], desc[256];
	struct st_diag d = { { 0 } };
	int iters = argc > 1 ? atoi(argv[1]) : 50;
	double copy;

	if (iters < 1) {
		fprintf(stderr, "usage: bench_cuda_gemv [iterations >= 1]\n");
		return 2;
	}
	if (cw_cu_device_count(reason, sizeof(reason)) <= 0) {
		printf("SKIP: no CUDA device: %s\n", reason);
		return 77;
	}
	die(cw_cu_device_describe(desc, sizeof(desc), &d), &d, "describe");
	printf("device: %s\n", desc);
	copy = copy_gbps(20);
	printf("d2d cudaMemcpy: %.1f GB/s (2 x bytes / time)\n", copy);
	for (size_t i = 0; i < sizeof(fmts) / sizeof(fmts[0]); i++) {
		bench(&fmts[i], 4096, 14336, iters, copy);
		bench(&fmts[i], 14336, 4096, iters, copy);
	}
	return 0;
}
