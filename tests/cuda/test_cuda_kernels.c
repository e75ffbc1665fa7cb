/*
 * test_cuda_kernels.c — every CUDA kernel of computed/device/cuda (cw_cu.h)
 * against its CPU reference (cw_backend_cpu reference mode, cw_swiglu,
 * cw_route_topk) within the tolerance cw_cu.h states, on random and
 * adversarial inputs (all-zero blocks, the largest and NaN scales,
 * subnormal scales, odd sizes that take the per-element path), with guard
 * bytes around every device output buffer checked after each kernel.
 *
 * Without a CUDA device it prints "SKIP: no CUDA device: <reason>" and exits
 * 77 (here and in CI, which have nvcc but no GPU).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_backend.h"
#include "cuda_test_util.h"
#include "cw_cu.h"
#include "cw_kvrow.h"
#include "cw_router.h"
#include "st_error.h"
#include "st_formats.h"

#define GUARD 256         /* guard bytes each side of an output buffer */
#define GUARD_BYTE 0xa5

static int failures;
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	if (++failures > 50)
		return;
	va_start(ap, fmt);
	fputs("FAIL: ", stdout);
	vprintf(fmt, ap);
	fputc('\n', stdout);
	va_end(ap);
}

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* uniform in [-1, 1) */
static float frand(void)
{
	return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0);
}

static void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	return p;
}

static void check(int rc, const struct st_diag *d, const char *what)
{
	if (rc) {
		printf("FAIL: %s: %s (%s)\n", what, d->msg, st_strerror(rc));
		exit(1);
	}
}

/* --- device buffers --- */

/* An input buffer: a device copy of host bytes. */
static void *dev_in(const void *src, size_t bytes)
{
	struct st_diag d = { { 0 } };
	void *p;

	check(cw_cu_alloc(&p, bytes + 16, &d), &d, "cudaMalloc");
	check(cw_cu_h2d(p, src, bytes, &d), &d, "h2d");
	return p;
}

/* An output buffer of bytes with GUARD guard bytes each side; returns the
 * usable pointer (base + GUARD). */
static void *dev_out(size_t bytes)
{
	struct st_diag d = { { 0 } };
	uint8_t *p;

	check(cw_cu_alloc((void **)&p, bytes + 2 * GUARD, &d), &d, "cudaMalloc");
	check(cw_cu_memset(p, GUARD_BYTE, bytes + 2 * GUARD, &d), &d, "memset");
	return p + GUARD;
}

/* Waits for the kernel, copies the output back into host[bytes] and checks
 * both guards. */
static void dev_out_fetch(void *out_d, void *host, size_t bytes,
			  const char *what)
{
	struct st_diag d = { { 0 } };
	uint8_t *all = xmalloc(bytes + 2 * GUARD);

	check(cw_cu_sync(&d), &d, what);
	check(cw_cu_d2h(all, (uint8_t *)out_d - GUARD, bytes + 2 * GUARD, &d),
	      &d, "d2h");
	for (size_t i = 0; i < GUARD; i++)
		if (all[i] != GUARD_BYTE || all[GUARD + bytes + i] != GUARD_BYTE) {
			fail("%s: guard byte %s the output overwritten (offset "
			     "%zu)", what, all[i] != GUARD_BYTE ? "before" :
			     "after", i);
			break;
		}
	memcpy(host, all + GUARD, bytes);
	free(all);
}

static void dev_out_free(void *out_d)
{
	cw_cu_free((uint8_t *)out_d - GUARD);
}

/* --- GEMV --- */

/* The adversarial case of a GEMV test. */
enum gcase { G_RANDOM, G_ZERO_BLOCKS, G_MAX_SCALES, G_NAN_SCALE,
	     G_SUBNORMAL };
static const char *const gcase_name[] = { "random", "zero-blocks",
					  "max-scales", "nan-scale",
					  "subnormal-scales" };

/* Dequantized row r of w into out[cols] (st_formats, the reference). */
static void dq_row(const struct cw_wview *w, int64_t r, float *out)
{
	const int64_t C = w->cols;
	const uint8_t *d = w->data;

	switch (w->dtype) {
	case ST_DTYPE_F32:
		memcpy(out, (const float *)w->data + r * C, C * 4);
		break;
	case ST_DTYPE_BF16:
		for (int64_t c = 0; c < C; c++)
			out[c] = st_bf16_to_f32(((const uint16_t *)d)[r * C + c]);
		break;
	case ST_DTYPE_MXFP4:
		st_mxfp4_dequantize_row(d + r * C / 2, w->scales + r * (C / 32),
					C, ST_FP4_LAYOUT_OCP, out);
		break;
	case ST_DTYPE_NVFP4:
		st_nvfp4_dequantize_row(d + r * C / 2, w->scales + r * (C / 16),
					C, w->global_scale, out);
		break;
	case ST_DTYPE_E2M1_F16: {
		const int64_t ng = (C + w->group - 1) / w->group;

		st_e2m1f16_dequantize_row(d + r * C / 2,
			(const uint16_t *)(const void *)w->scales + r * ng, C,
			w->group, out);
		break;
	}
	case ST_DTYPE_F8_E4M3: {
		const int64_t nb = (C + w->group - 1) / w->group;

		st_fp8_dequantize_row(d + r * C,
			(const float *)(const void *)w->scales + r * nb, C,
			w->group, out);
		break;
	}
	default:
		abort();
	}
}

/* A random scale of the format, per case. */
static void fill_scales(struct cw_wview *w, uint8_t *sc, int64_t nsc,
			enum gcase gc)
{
	for (int64_t i = 0; i < nsc; i++) {
		switch (w->dtype) {
		case ST_DTYPE_MXFP4:
			sc[i] = gc == G_MAX_SCALES ? 254 - (rnd() & 3) :
				gc == G_SUBNORMAL ? (rnd() & 1) :
				(uint8_t)(120 + rnd() % 14);
			if (gc == G_NAN_SCALE && i == nsc / 2)
				sc[i] = 255;
			break;
		case ST_DTYPE_NVFP4:
			sc[i] = gc == G_MAX_SCALES ? 0x7e :
				gc == G_SUBNORMAL ? (uint8_t)(rnd() & 7) :
				(uint8_t)(0x20 + rnd() % 0x40);
			if (gc == G_NAN_SCALE && i == nsc / 2)
				sc[i] = 0x7f;
			break;
		case ST_DTYPE_E2M1_F16:
			((uint16_t *)sc)[i] =
				gc == G_MAX_SCALES ? 0x7bff :
				gc == G_SUBNORMAL ? (uint16_t)(rnd() & 0x3ff) :
				st_f32_to_f16(frand() * 0.1f);
			if (gc == G_NAN_SCALE && i == nsc / 2)
				((uint16_t *)sc)[i] = 0x7e00;
			break;
		case ST_DTYPE_F8_E4M3:
			((float *)sc)[i] = gc == G_MAX_SCALES ? 0x1p100f :
					   gc == G_SUBNORMAL ? 0x1p-140f :
					   frand() * 0.01f;
			if (gc == G_NAN_SCALE && i == nsc / 2)
				((float *)sc)[i] = NAN;
			break;
		default:
			break;
		}
	}
}

/* Same class of value: both NaN, or both the same infinity, or both
 * finite. */
static int same_class(double a, double b)
{
	if (isnan(a) || isnan(b))
		return isnan(a) && isnan(b);
	if (isinf(a) || isinf(b))
		return a == b;
	return 1;
}

/* The device dequantization of w (device twin wd) must give st_formats'
 * floats bit for bit (any NaN for NaN). */
static void check_dequant(const struct cw_wview *w, const struct cw_wview *wd,
			  const char *what)
{
	const int64_t R = w->rows, C = w->cols;
	float *gpu = xmalloc(R * C * 4), *row = xmalloc(C * 4);
	struct st_diag d = { { 0 } };
	float *out_d = dev_out(R * C * 4);
	char w2[200];

	snprintf(w2, sizeof(w2), "dequant of %s", what);
	if (cw_cu_dequant_f32(wd, out_d, NULL, &d)) {
		fail("%s: %s", w2, d.msg);
		goto out;
	}
	dev_out_fetch(out_d, gpu, R * C * 4, w2);
	for (int64_t r = 0; r < R; r++) {
		dq_row(w, r, row);
		for (int64_t c = 0; c < C; c++) {
			const float a = gpu[r * C + c], b = row[c];

			if (isnan(a) ? !isnan(b) :
			    memcmp(&a, &b, 4) != 0) {
				fail("%s: [%lld][%lld] gpu %.9g, st_formats "
				     "%.9g", w2, (long long)r, (long long)c,
				     a, b);
				r = R;
				break;
			}
		}
	}
out:
	dev_out_free(out_d);
	free(gpu);
	free(row);
}

static void test_gemv(enum st_dtype dt, int64_t R, int64_t C, uint32_t group,
		      enum gcase gc)
{
	struct cw_wview w = { .dtype = dt, .rows = R, .cols = C,
			      .group = group, .global_scale = 1.0f };
	int64_t data_bytes, nsc = 0, sc_size = 0;
	uint8_t *data, *sc = NULL;
	float *x = xmalloc(C * 4), *y_cpu = xmalloc(R * 4),
	      *y_gpu = xmalloc(R * 4), *row = xmalloc(C * 4);
	char what[160];
	struct st_diag d = { { 0 } };
	void *data_d, *sc_d = NULL, *x_d, *y_d;
	struct cw_wview wd;
	int rc;

	snprintf(what, sizeof(what), "gemv dtype %d %lldx%lld group %u %s",
		 (int)dt, (long long)R, (long long)C, group, gcase_name[gc]);
	switch (dt) {
	case ST_DTYPE_F32: data_bytes = R * C * 4; break;
	case ST_DTYPE_BF16: data_bytes = R * C * 2; break;
	case ST_DTYPE_F8_E4M3: data_bytes = R * C; sc_size = 4; break;
	case ST_DTYPE_E2M1_F16: data_bytes = R * C / 2; sc_size = 2; break;
	default: data_bytes = R * C / 2; sc_size = 1; break;
	}
	if (dt == ST_DTYPE_MXFP4)
		w.group = group = 32;
	if (dt == ST_DTYPE_NVFP4) {
		w.group = group = 16;
		w.global_scale = gc == G_MAX_SCALES ? 0x1p90f : 0.37f;
	}
	if (sc_size)
		nsc = R * ((C + group - 1) / group);
	data = xmalloc(data_bytes);
	for (int64_t i = 0; i < data_bytes; i++)
		data[i] = (uint8_t)rnd();
	if (dt == ST_DTYPE_F32)
		for (int64_t i = 0; i < R * C; i++)
			((float *)data)[i] = frand();
	if (dt == ST_DTYPE_BF16)
		for (int64_t i = 0; i < R * C; i++)
			((uint16_t *)data)[i] = st_f32_to_bf16(frand());
	if (dt == ST_DTYPE_F8_E4M3 && gc != G_NAN_SCALE)
		for (int64_t i = 0; i < data_bytes; i++)
			if ((data[i] & 0x7f) == 0x7f)
				data[i] = 0x7e; /* E4M3 NaN codes only there */
	if (sc_size) {
		sc = xmalloc(nsc * sc_size);
		fill_scales(&w, sc, nsc, gc);
	}
	if (gc == G_ZERO_BLOCKS) {
		/* rows alternate: all-zero codes with zero scales, and
		 * random codes under scales of zero */
		for (int64_t r = 0; r < R; r++) {
			const int64_t rb = data_bytes / R;

			if (r % 2 == 0)
				memset(data + r * rb, 0, rb);
			if (sc)
				memset(sc + r * (nsc / R) * sc_size, 0,
				       (nsc / R) * sc_size);
		}
	}
	for (int64_t c = 0; c < C; c++)
		x[c] = gc == G_MAX_SCALES ? frand() * 0x1p-60f : frand();
	w.data = data;
	w.scales = sc;
	/* CPU reference */
	cw_backend_cpu()->matvec(&w, x, y_cpu, 0, R);
	/* GPU */
	data_d = dev_in(data, data_bytes);
	if (sc)
		sc_d = dev_in(sc, nsc * sc_size);
	x_d = dev_in(x, C * 4);
	y_d = dev_out(R * 4);
	wd = w;
	wd.data = data_d;
	wd.scales = sc_d;
	rc = cw_cu_matvec(&wd, x_d, y_d, NULL, &d);
	if (rc) {
		fail("%s: %s", what, d.msg);
		goto out;
	}
	dev_out_fetch(y_d, y_gpu, R * 4, what);
	check_dequant(&w, &wd, what);
	for (int64_t r = 0; r < R; r++) {
		double exact = 0.0, S = 0.0, tol, tol_cpu;

		dq_row(&w, r, row);
		for (int64_t c = 0; c < C; c++) {
			exact += (double)row[c] * x[c];
			S += fabs((double)row[c] * x[c]);
		}
		tol = ((C + 127) / 128 + 64) * 0x1p-24 * S + (C + 64) * 0x1p-149;
		tol_cpu = tol + (C / 8 + 8) * 0x1p-24 * S;
		if (!same_class(y_gpu[r], exact) ||
		    !same_class(y_gpu[r], y_cpu[r])) {
			fail("%s: row %lld: gpu %g, exact %g, cpu %g", what,
			     (long long)r, y_gpu[r], exact, y_cpu[r]);
			continue;
		}
		if (!isfinite(exact))
			continue;
		if (fabs(y_gpu[r] - exact) > tol)
			fail("%s: row %lld: gpu %.9g vs exact %.9g (tol %.3g)",
			     what, (long long)r, y_gpu[r], exact, tol);
		if (fabs((double)y_gpu[r] - y_cpu[r]) > tol_cpu)
			fail("%s: row %lld: gpu %.9g vs cpu %.9g (tol %.3g)",
			     what, (long long)r, y_gpu[r], y_cpu[r], tol_cpu);
	}
	if (gc == G_NAN_SCALE) {
		/* the NaN scale sits in row (nsc / 2) / (nsc / R) */
		int64_t r = (nsc / 2) / (nsc / R);

		if (!isnan(y_gpu[r]))
			fail("%s: row %lld under a NaN scale gave %g", what,
			     (long long)r, y_gpu[r]);
	}
out:
	cw_cu_free(data_d);
	cw_cu_free(sc_d);
	cw_cu_free(x_d);
	dev_out_free(y_d);
	free(data);
	free(sc);
	free(x);
	free(y_cpu);
	free(y_gpu);
	free(row);
}

/* PITFALLS P7 (nibble order) on the device: one MXFP4 block, scale byte
 * 128 (x2), first byte 0x72, the rest zero, OCP layout: element 0 is 2.0
 * and element 1 is 12.0 (the GGUF layout would put 12.0 at element 16);
 * the GEMV against unit vectors picks them out.  And P9's decode side:
 * every E4M3 byte (0x7e = 448, 0xfe = -448, 0x7f / 0xff NaN) dequantizes
 * like st_e4m3_to_f32. */
static void test_pitfalls(void)
{
	uint8_t codes[16] = { 0x72 }, sc = 128, fp8[256];
	float out[32], x[32], y, fsc = 1.0f;
	struct cw_wview w = { .dtype = ST_DTYPE_MXFP4, .rows = 1, .cols = 32,
			      .group = 32, .global_scale = 1.0f };
	struct st_diag d = { { 0 } };
	void *c_d = dev_in(codes, 16), *s_d = dev_in(&sc, 1), *x_d, *y_d;
	float *o_d = dev_out(32 * 4);

	w.data = c_d;
	w.scales = s_d;
	if (cw_cu_dequant_f32(&w, o_d, NULL, &d))
		fail("P7: %s", d.msg);
	dev_out_fetch(o_d, out, sizeof(out), "P7 dequant");
	for (int i = 0; i < 32; i++)
		if (out[i] != (i == 0 ? 2.0f : i == 1 ? 12.0f : 0.0f))
			fail("P7: element %d is %g (want [0]=2, [1]=12, rest 0)",
			     i, out[i]);
	y_d = dev_out(4);
	for (int e = 0; e < 2; e++) {
		memset(x, 0, sizeof(x));
		x[e] = 1.0f;
		x_d = dev_in(x, sizeof(x));
		if (cw_cu_matvec(&w, x_d, y_d, NULL, &d))
			fail("P7 gemv: %s", d.msg);
		dev_out_fetch(y_d, &y, 4, "P7 gemv");
		if (y != (e ? 12.0f : 2.0f))
			fail("P7 gemv: x = e_%d gives %g, want %g", e, y,
			     e ? 12.0 : 2.0);
		cw_cu_free(x_d);
	}
	dev_out_free(o_d);
	dev_out_free(y_d);
	cw_cu_free(c_d);
	cw_cu_free(s_d);

	for (int i = 0; i < 256; i++)
		fp8[i] = (uint8_t)i;
	w.dtype = ST_DTYPE_F8_E4M3;
	w.cols = 256;
	w.group = 256;
	c_d = dev_in(fp8, 256);
	s_d = dev_in(&fsc, 4);
	o_d = dev_out(256 * 4);
	w.data = c_d;
	w.scales = s_d;
	if (cw_cu_dequant_f32(&w, o_d, NULL, &d))
		fail("P9: %s", d.msg);
	else {
		float got[256];

		dev_out_fetch(o_d, got, sizeof(got), "P9 dequant");
		for (int i = 0; i < 256; i++) {
			const float want = st_e4m3_to_f32((uint8_t)i);

			if (isnan(want) ? !isnan(got[i]) : got[i] != want)
				fail("P9: E4M3 byte 0x%02x gives %g, want %g",
				     i, got[i], want);
		}
		if (got[0x7e] != 448.0f || got[0xfe] != -448.0f ||
		    !isnan(got[0x7f]) || !isnan(got[0xff]))
			fail("P9: 0x7e/0xfe/0x7f/0xff decode to %g %g %g %g",
			     got[0x7e], got[0xfe], got[0x7f], got[0xff]);
	}
	dev_out_free(o_d);
	cw_cu_free(c_d);
	cw_cu_free(s_d);
}

/* A GEMV whose arguments are wrong must be refused, not run. */
static void test_gemv_refuses(void)
{
	struct cw_wview w = { .dtype = ST_DTYPE_E2M1_F16, .rows = 4,
			      .cols = 33, .group = 32 };
	struct st_diag d = { { 0 } };
	int rc;

	w.data = w.scales = (const void *)(uintptr_t)4096;
	rc = cw_cu_matvec(&w, NULL, NULL, NULL, &d);
	if (rc != -EINVAL)
		fail("gemv with odd cols for E2M1: rc %d, want -EINVAL", rc);
	w.dtype = ST_DTYPE_I32;
	w.cols = 32;
	rc = cw_cu_matvec(&w, NULL, NULL, NULL, &d);
	if (rc != -ST_E_UNSUPPORTED)
		fail("gemv of I32: rc %d, want -ST_E_UNSUPPORTED", rc);
}

/* The batched GEMV (one launch for n matrices of one shape, issue 27)
 * gives each job the same bits as cw_cu_matvec of that job alone, NVFP4
 * tensor scales per job included, and refuses jobs of different shapes;
 * in a second launch the jobs read x at an unaligned offset (the
 * per-element path of every job). */
static void test_gemv_batch(enum st_dtype dt, int n, int64_t R, int64_t C)
{
	const int64_t cb = C / 2, nsc = C / (dt == ST_DTYPE_MXFP4 ? 32 : 16);
	struct cw_wview w[8], *wp[8];
	const float *xp[8];
	float *yp[8], *y1_d = dev_out(R * 4);
	struct cw_cu_gemv_job jobs_h[8], *jobs_d;
	struct st_diag d = { { 0 } };
	void *data_d[8], *sc_d[8], *x_d[8], *y_d[8];
	float *xh = xmalloc((C + 1) * 4), *yb = xmalloc(R * 4),
	      *y1 = xmalloc(R * 4);
	uint8_t *buf = xmalloc(R * cb);
	char what[96];
	int rc;

	check(cw_cu_alloc((void **)&jobs_d, sizeof(jobs_h), &d), &d,
	      "cudaMalloc");
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < n; i++) {
			w[i] = (struct cw_wview){ .dtype = dt, .rows = R,
				.cols = C, .group = dt == ST_DTYPE_MXFP4 ?
				32 : 16, .global_scale = 0.25f + 0.5f * i };
			for (int64_t k = 0; k < R * cb; k++)
				buf[k] = (uint8_t)rnd();
			data_d[i] = dev_in(buf, R * cb);
			for (int64_t k = 0; k < R * nsc; k++)
				buf[k] = dt == ST_DTYPE_MXFP4 ?
					 (uint8_t)(118 + rnd() % 16) :
					 (uint8_t)(0x20 + rnd() % 0x40);
			sc_d[i] = dev_in(buf, R * nsc);
			for (int64_t c = 0; c <= C; c++)
				xh[c] = frand();
			x_d[i] = dev_in(xh, (C + 1) * 4);
			y_d[i] = dev_out(R * 4);
			w[i].data = data_d[i];
			w[i].scales = sc_d[i];
			wp[i] = &w[i];
			xp[i] = (const float *)x_d[i] + pass;
			yp[i] = y_d[i];
		}
		rc = cw_cu_matvec_batch((const struct cw_wview *const *)wp, xp,
					yp, n, jobs_h, jobs_d, NULL, &d);
		if (rc)
			fail("gemv batch dtype %d: %s", (int)dt, d.msg);
		for (int i = 0; i < n && !rc; i++) {
			snprintf(what, sizeof(what), "gemv batch dtype %d job "
				 "%d pass %d", (int)dt, i, pass);
			dev_out_fetch(y_d[i], yb, R * 4, what);
			check(cw_cu_matvec(&w[i], xp[i], y1_d, NULL, &d), &d,
			      what);
			dev_out_fetch(y1_d, y1, R * 4, what);
			if (memcmp(yb, y1, R * 4))
				fail("%s: differs from cw_cu_matvec alone",
				     what);
		}
		for (int i = 0; i < n; i++) {
			cw_cu_free(data_d[i]);
			cw_cu_free(sc_d[i]);
			cw_cu_free(x_d[i]);
			dev_out_free(y_d[i]);
		}
	}
	w[1] = w[0];
	w[1].rows = R + 1;
	rc = cw_cu_matvec_batch((const struct cw_wview *const *)wp, xp, yp, 2,
				jobs_h, jobs_d, NULL, &d);
	if (rc != -EINVAL)
		fail("gemv batch of two shapes: rc %d, want -EINVAL", rc);
	cw_cu_free(jobs_d);
	dev_out_free(y1_d);
	free(xh);
	free(yb);
	free(y1);
	free(buf);
}

/* Prefill: cuBLAS float32 GEMM of n tokens against the CPU matvec of each
 * token, on a random F32 matrix. */
static void test_gemm(int R, int C, int n)
{
	float *w = xmalloc((size_t)R * C * 4), *x = xmalloc((size_t)n * C * 4),
	      *y_gpu = xmalloc((size_t)n * R * 4), *y_cpu = xmalloc(R * 4);
	struct cw_wview wv = { .dtype = ST_DTYPE_F32, .rows = R, .cols = C };
	struct st_diag d = { { 0 } };
	struct cw_cu_blas *b = NULL;
	void *w_d, *x_d, *y_d;
	char what[64];

	snprintf(what, sizeof(what), "gemm %dx%d, %d tokens", R, C, n);
	for (size_t i = 0; i < (size_t)R * C; i++)
		w[i] = frand();
	for (size_t i = 0; i < (size_t)n * C; i++)
		x[i] = frand();
	wv.data = w;
	w_d = dev_in(w, (size_t)R * C * 4);
	x_d = dev_in(x, (size_t)n * C * 4);
	y_d = dev_out((size_t)n * R * 4);
	if (cw_cu_blas_new(&b, &d) ||
	    cw_cu_gemm_f32(b, w_d, x_d, y_d, R, C, n, NULL, &d)) {
		fail("%s: %s", what, d.msg);
		goto out;
	}
	dev_out_fetch(y_d, y_gpu, (size_t)n * R * 4, what);
	for (int t = 0; t < n; t++) {
		cw_backend_cpu()->matvec(&wv, x + (size_t)t * C, y_cpu, 0, R);
		for (int r = 0; r < R; r++) {
			double S = 0.0, tol;

			for (int c = 0; c < C; c++)
				S += fabs((double)w[(size_t)r * C + c] *
					  x[(size_t)t * C + c]);
			tol = ((C + 64) + (C / 8 + 8)) * 0x1p-24 * S;
			if (!(fabs((double)y_gpu[(size_t)t * R + r] - y_cpu[r]) <=
			      tol)) {
				fail("%s: token %d row %d: gpu %.9g cpu %.9g",
				     what, t, r, y_gpu[(size_t)t * R + r],
				     y_cpu[r]);
				t = n;
				break;
			}
		}
	}
out:
	cw_cu_blas_free(b);
	cw_cu_free(w_d);
	cw_cu_free(x_d);
	dev_out_free(y_d);
	free(w);
	free(x);
	free(y_gpu);
	free(y_cpu);
}

/* --- grouped prefill GEMM (BF16 tiles + cuBLAS) --- */

/*
 * n_groups experts of format dt (random codes and scales), each with its
 * own token count, against the exact (double) product of the st_formats
 * dequantization and float32 x, within cw_cu.h's bound: (2^-8 + (C + 64)
 * 2^-22) S for MXFP4 (exact BF16 weights, x rounded, tensor-core sums),
 * 2^-7 S + the same for NVFP4 (weights rounded too).  Guard bytes around
 * every output.
 */
static void test_grouped(enum st_dtype dt, int n_groups, int R, int C)
{
	struct cw_cu_group g[8];
	struct cw_wview wv[8], wd[8];
	float *x[8], *y[8];
	void *w_d[8], *s_d[8], *x_d[8], *y_d[8], *scr = NULL;
	struct st_diag d = { { 0 } };
	struct cw_cu_blas *b = NULL;
	const int gs = dt == ST_DTYPE_MXFP4 ? 32 : 16;
	const double rel = dt == ST_DTYPE_MXFP4 ? 0x1p-8 : 0x1p-7;
	size_t scr_bytes;
	char what[80];
	float *row = xmalloc((size_t)C * 4);

	snprintf(what, sizeof(what), "grouped bf16 dtype %d, %d x %dx%d",
		 (int)dt, n_groups, R, C);
	for (int i = 0; i < n_groups; i++) {
		const size_t nc = (size_t)R * C / 2, ns = (size_t)R * C / gs;
		uint8_t *codes = xmalloc(nc), *sc = xmalloc(ns);
		const int nt = 8 + i * 5;

		for (size_t k = 0; k < nc; k++)
			codes[k] = (uint8_t)rnd();
		memset(&wv[i], 0, sizeof(wv[i]));
		wv[i].dtype = dt;
		wv[i].rows = R;
		wv[i].cols = C;
		wv[i].data = codes;
		wv[i].scales = sc;
		wv[i].global_scale = dt == ST_DTYPE_NVFP4 ? 0.37f : 1.0f;
		fill_scales(&wv[i], sc, (int64_t)ns, G_RANDOM);
		x[i] = xmalloc((size_t)nt * C * 4);
		y[i] = xmalloc((size_t)nt * R * 4);
		for (size_t k = 0; k < (size_t)nt * C; k++)
			x[i][k] = frand();
		w_d[i] = dev_in(codes, nc);
		s_d[i] = dev_in(sc, ns);
		x_d[i] = dev_in(x[i], (size_t)nt * C * 4);
		y_d[i] = dev_out((size_t)nt * R * 4);
		wd[i] = wv[i];
		wd[i].data = w_d[i];
		wd[i].scales = s_d[i];
		g[i].w = &wd[i];
		g[i].x_d = x_d[i];
		g[i].y_d = y_d[i];
		g[i].n_tok = nt;
	}
	scr_bytes = cw_cu_gemm_grouped_scratch(g, n_groups);
	scr = dev_out(scr_bytes);
	if (cw_cu_blas_new(&b, &d) ||
	    cw_cu_gemm_grouped_bf16(b, g, n_groups, scr, scr_bytes, NULL, &d)) {
		fail("%s: %s", what, d.msg);
		goto out;
	}
	/* too little scratch is refused, not overrun */
	if (cw_cu_gemm_grouped_bf16(b, g, n_groups, scr, scr_bytes - 1, NULL,
				    &d) != -EINVAL)
		fail("%s: a short scratch was accepted", what);
	for (int i = 0; i < n_groups; i++) {
		const int nt = g[i].n_tok;

		dev_out_fetch(y_d[i], y[i], (size_t)nt * R * 4, what);
		for (int r = 0; r < R; r++) {
			dq_row(&wv[i], r, row);
			for (int t = 0; t < nt; t++) {
				double S = 0.0, e = 0.0, tol;

				for (int c = 0; c < C; c++) {
					double p = (double)row[c] *
						   x[i][(size_t)t * C + c];

					e += p;
					S += fabs(p);
				}
				tol = (rel + (C + 64) * 0x1p-22) * S;
				if (!(fabs(y[i][(size_t)t * R + r] - e) <=
				      tol)) {
					fail("%s: group %d token %d row %d: "
					     "gpu %.9g exact %.9g (tol %.3g)",
					     what, i, t, r,
					     y[i][(size_t)t * R + r], e, tol);
					r = R;
					break;
				}
			}
		}
	}
	dev_out_free(scr);
out:
	cw_cu_blas_free(b);
	for (int i = 0; i < n_groups; i++) {
		cw_cu_free(w_d[i]);
		cw_cu_free(s_d[i]);
		cw_cu_free(x_d[i]);
		dev_out_free(y_d[i]);
		free((void *)wv[i].data);
		free((void *)wv[i].scales);
		free(x[i]);
		free(y[i]);
	}
	free(row);
}

/* --- RMSNorm, RoPE, SwiGLU --- */

static void test_rmsnorm(int n, enum st_dtype wdt, float xscale)
{
	float *x = xmalloc(n * 4), *y_cpu = xmalloc(n * 4),
	      *y_gpu = xmalloc(n * 4);
	void *wt = xmalloc(n * 4), *x_d, *w_d, *y_d;
	struct st_diag d = { { 0 } };
	char what[96];

	snprintf(what, sizeof(what), "rmsnorm n %d %s x*%g", n,
		 wdt == ST_DTYPE_BF16 ? "bf16" : "f32", xscale);
	for (int i = 0; i < n; i++) {
		x[i] = frand() * xscale;
		if (wdt == ST_DTYPE_BF16)
			((uint16_t *)wt)[i] = st_f32_to_bf16(1.0f + frand());
		else
			((float *)wt)[i] = 1.0f + frand();
	}
	cw_backend_cpu()->rmsnorm(x, wt, wdt, n, 1e-6f, y_cpu);
	x_d = dev_in(x, n * 4);
	w_d = dev_in(wt, n * 4);
	y_d = dev_out(n * 4);
	if (cw_cu_rmsnorm(x_d, w_d, wdt, n, 1e-6f, y_d, NULL, &d))
		fail("%s: %s", what, d.msg);
	else
		dev_out_fetch(y_d, y_gpu, n * 4, what);
	for (int i = 0; i < n; i++)
		if (!(fabsf(y_gpu[i] - y_cpu[i]) <=
		      0x1p-21f * fabsf(y_cpu[i]))) {
			fail("%s: [%d] gpu %.9g cpu %.9g", what, i, y_gpu[i],
			     y_cpu[i]);
			break;
		}
	cw_cu_free(x_d);
	cw_cu_free(w_d);
	dev_out_free(y_d);
	free(x);
	free(wt);
	free(y_cpu);
	free(y_gpu);
}

static void test_rope(int n_heads, int head_dim, int pos, double theta)
{
	const int n = n_heads * head_dim, half = head_dim / 2;
	float *x = xmalloc(n * 4), *y_cpu = xmalloc(n * 4),
	      *y_gpu = xmalloc(n * 4);
	struct st_diag d = { { 0 } };
	float *x_d;
	char what[96];

	snprintf(what, sizeof(what), "rope %d heads x %d pos %d theta %g",
		 n_heads, head_dim, pos, theta);
	for (int i = 0; i < n; i++)
		x[i] = frand() * 4.0f;
	memcpy(y_cpu, x, n * 4);
	cw_backend_cpu()->rope(y_cpu, n_heads, head_dim, pos, theta);
	x_d = dev_out(n * 4);
	check(cw_cu_h2d(x_d, x, n * 4, &d), &d, "h2d");
	if (cw_cu_rope(x_d, n_heads, head_dim, pos, theta, NULL, &d))
		fail("%s: %s", what, d.msg);
	else
		dev_out_fetch(x_d, y_gpu, n * 4, what);
	for (int h = 0; h < n_heads; h++)
		for (int i = 0; i < head_dim; i++) {
			const int k = h * head_dim + i,
				  p = h * head_dim + (i + half) % head_dim;
			const float tol = 0x1p-22f * (fabsf(x[k]) + fabsf(x[p]));

			if (!(fabsf(y_gpu[k] - y_cpu[k]) <= tol) ||
			    (pos == 0 && y_gpu[k] != x[k])) {
				fail("%s: [%d] gpu %.9g cpu %.9g", what, k,
				     y_gpu[k], y_cpu[k]);
				h = n_heads;
				break;
			}
		}
	dev_out_free(x_d);
	free(x);
	free(y_cpu);
	free(y_gpu);
}

static void test_swiglu(int n, int adversarial)
{
	static const float edge[] = { 0.0f, -0.0f, 88.0f, -88.0f, 100.0f,
				      -100.0f, 1e-30f, -1e-30f, INFINITY,
				      -INFINITY, 20.0f, -20.0f };
	float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *y_cpu = xmalloc(n * 4),
	      *y_gpu = xmalloc(n * 4);
	void *g_d, *u_d, *y_d;
	struct st_diag d = { { 0 } };
	char what[64];

	snprintf(what, sizeof(what), "swiglu n %d%s", n,
		 adversarial ? " edges" : "");
	for (int i = 0; i < n; i++) {
		g[i] = adversarial ? edge[i % 12] : frand() * 12.0f;
		u[i] = frand() * 3.0f;
	}
	cw_swiglu(g, u, n, y_cpu);
	g_d = dev_in(g, n * 4);
	u_d = dev_in(u, n * 4);
	y_d = dev_out(n * 4);
	if (cw_cu_swiglu(g_d, u_d, n, y_d, NULL, &d))
		fail("%s: %s", what, d.msg);
	else
		dev_out_fetch(y_d, y_gpu, n * 4, what);
	for (int i = 0; i < n; i++)
		if (!same_class(y_gpu[i], y_cpu[i]) ||
		    (isfinite(y_cpu[i]) && !(fabsf(y_gpu[i] - y_cpu[i]) <=
		     0x1p-20f * fabsf(y_cpu[i]) + 0x1p-140f))) {
			fail("%s: [%d] g %g: gpu %.9g cpu %.9g", what, i, g[i],
			     y_gpu[i], y_cpu[i]);
			break;
		}
	cw_cu_free(g_d);
	cw_cu_free(u_d);
	dev_out_free(y_d);
	free(g);
	free(u);
	free(y_cpu);
	free(y_gpu);
}

/* --- attention --- */

enum acase { A_RANDOM, A_PEAKED, A_EQUAL_KEYS };

static void test_attend(enum st_dtype dt, int n_heads, int nkv, int hd,
			int n_rows, enum acase ac)
{
	struct cw_kvrow_fmt f;
	struct st_diag d = { { 0 } };
	size_t rb, n = (size_t)n_heads * hd;
	uint8_t *pool, **rows, **rows_dev;
	float *q = xmalloc(n * 4), *o_gpu = xmalloc(n * 4),
	      *o_cpu = xmalloc(n * 4), *sc = xmalloc(n_rows * 4),
	      *k = xmalloc((size_t)nkv * hd * 4), *v = xmalloc((size_t)nkv * hd * 4);
	void *pool_d, *rows_d, *q_d, *sc_d, *o_d;
	char what[96];

	snprintf(what, sizeof(what), "attention %s %d heads / %d KV x %d, %d "
		 "rows, case %d", cw_kvrow_dtype_name(dt), n_heads, nkv, hd,
		 n_rows, (int)ac);
	if (cw_kvrow_init(&f, dt, nkv, hd)) {
		fail("%s: cw_kvrow_init", what);
		return;
	}
	rb = (cw_kvrow_bytes(&f) + 15) & ~(size_t)15;
	pool = xmalloc(rb * n_rows);
	rows = xmalloc(n_rows * sizeof(*rows));
	rows_dev = xmalloc(n_rows * sizeof(*rows_dev));
	for (size_t i = 0; i < n; i++)
		q[i] = frand() * (ac == A_PEAKED ? 40.0f : 1.0f);
	for (int j = 0; j < n_rows; j++) {
		for (int i = 0; i < nkv * hd; i++) {
			k[i] = ac == A_EQUAL_KEYS ? 0.25f : frand();
			v[i] = frand() * 3.0f;
		}
		/* rows in the pool in reverse order: the table is followed */
		rows[j] = pool + rb * (n_rows - 1 - j);
		cw_kvrow_write(&f, rows[j], k, v);
	}
	pool_d = dev_in(pool, rb * n_rows);
	for (int j = 0; j < n_rows; j++)
		rows_dev[j] = (uint8_t *)pool_d + (rows[j] - pool);
	rows_d = dev_in(rows_dev, n_rows * sizeof(*rows_dev));
	q_d = dev_in(q, n * 4);
	sc_d = dev_out((size_t)n_heads * n_rows * 4);
	o_d = dev_out(n * 4);
	if (cw_cu_attend(q_d, (const uint8_t *const *)rows_d, n_rows, dt,
			 n_heads, nkv, hd, sc_d, o_d, NULL, &d)) {
		fail("%s: %s", what, d.msg);
		goto out;
	}
	dev_out_fetch(o_d, o_gpu, n * 4, what);
	for (int h = 0; h < n_heads; h++) {
		const int kvh = h / (n_heads / nkv);
		const float *qh = q + (size_t)h * hd;
		char msg[200];

		cudat_attend_head(&f, (const uint8_t *const *)rows, n_rows, qh,
				  kvh, sc, o_cpu + (size_t)h * hd);
		if (cudat_check_head(&f, (const uint8_t *const *)rows, n_rows,
				     qh, kvh, o_gpu + (size_t)h * hd,
				     o_cpu + (size_t)h * hd, msg,
				     sizeof(msg)) < 0) {
			fail("%s: head %d %s", what, h, msg);
			break;
		}
	}
out:
	cw_cu_free(pool_d);
	cw_cu_free(rows_d);
	cw_cu_free(q_d);
	dev_out_free(sc_d);
	dev_out_free(o_d);
	free(pool);
	free(rows);
	free(rows_dev);
	free(q);
	free(o_gpu);
	free(o_cpu);
	free(sc);
	free(k);
	free(v);
}

/* --- router --- */

enum rcase { R_RANDOM, R_TIES, R_UNDERFLOW };

static void test_router(int n_tok, int ne, int k, int renorm, enum rcase rc)
{
	float *l = xmalloc((size_t)n_tok * ne * 4),
	      *w_gpu = xmalloc((size_t)n_tok * k * 4);
	int *e_gpu = xmalloc((size_t)n_tok * k * 4);
	void *l_d, *e_d, *w_d;
	struct st_diag d = { { 0 } };
	char what[96];

	snprintf(what, sizeof(what), "router %d tokens %d experts top-%d%s "
		 "case %d", n_tok, ne, k, renorm ? " renorm" : "", (int)rc);
	for (int i = 0; i < n_tok * ne; i++)
		l[i] = rc == R_TIES ? 0.5f :
		       rc == R_UNDERFLOW ? (i % 7 == 0 ? 0.0f : -1e4f) :
		       frand() * 8.0f;
	l_d = dev_in(l, (size_t)n_tok * ne * 4);
	e_d = dev_out((size_t)n_tok * k * 4);
	w_d = dev_out((size_t)n_tok * k * 4);
	if (cw_cu_route_topk(l_d, n_tok, ne, k, renorm, e_d, w_d, NULL, &d)) {
		fail("%s: %s", what, d.msg);
		goto out;
	}
	dev_out_fetch(e_d, e_gpu, (size_t)n_tok * k * 4, what);
	dev_out_fetch(w_d, w_gpu, (size_t)n_tok * k * 4, what);
	for (int t = 0; t < n_tok; t++) {
		int e_cpu[64];
		float w_cpu[64], p[CW_MAX_EXPERTS];

		cw_route_topk(l + (size_t)t * ne, ne, k, renorm, e_cpu, w_cpu);
		/* each expert's probability as cw_router.c computes it,
		 * to tell a near-tie swap from a wrong pick */
		{
			float mx = -INFINITY;
			double sum = 0.0;

			for (int e = 0; e < ne; e++)
				mx = fmaxf(mx, l[(size_t)t * ne + e]);
			for (int e = 0; e < ne; e++) {
				p[e] = expf(l[(size_t)t * ne + e] - mx);
				sum += p[e];
			}
			for (int e = 0; e < ne; e++)
				p[e] = (float)(p[e] / sum);
		}
		for (int j = 0; j < k; j++) {
			const int a = e_gpu[t * k + j], b = e_cpu[j];

			if (a < 0 || a >= ne) {
				fail("%s: token %d slot %d: expert %d", what, t,
				     j, a);
				break;
			}
			if (a != b && !(fabsf(p[a] - p[b]) <=
					4 * 0x1p-24f * fmaxf(p[a], p[b]))) {
				fail("%s: token %d slot %d: gpu expert %d (p %g)"
				     ", cpu %d (p %g)", what, t, j, a, p[a], b,
				     p[b]);
				break;
			}
			if (!(fabsf(w_gpu[t * k + j] - w_cpu[j]) <=
			      0x1p-20f * fabsf(w_cpu[j]))) {
				fail("%s: token %d slot %d: weight gpu %.9g cpu "
				     "%.9g", what, t, j, w_gpu[t * k + j],
				     w_cpu[j]);
				break;
			}
		}
	}
out:
	cw_cu_free(l_d);
	dev_out_free(e_d);
	dev_out_free(w_d);
	free(l);
	free(e_gpu);
	free(w_gpu);
}

int main(void)
{
	char reason[256], desc[256];
	struct st_diag d = { { 0 } };
	static const struct { enum st_dtype dt; uint32_t group; } fmt[] = {
		{ ST_DTYPE_MXFP4, 32 }, { ST_DTYPE_NVFP4, 16 },
		{ ST_DTYPE_E2M1_F16, 32 }, { ST_DTYPE_E2M1_F16, 128 },
		{ ST_DTYPE_F8_E4M3, 128 }, { ST_DTYPE_F8_E4M3, 64 },
		{ ST_DTYPE_BF16, 0 },
		{ ST_DTYPE_F32, 0 },
	};
	/* shapes: vectorised ones (cols % 32 == 0, up to 14336), and odd
	 * ones that take the per-element path where the format allows */
	static const int64_t shape[][2] = { { 1, 32 }, { 3, 64 }, { 37, 4096 },
					    { 19, 14336 }, { 5, 160 } };

	if (cw_cu_device_count(reason, sizeof(reason)) <= 0) {
		printf("SKIP: no CUDA device: %s\n", reason);
		return 77;
	}
	check(cw_cu_device_describe(desc, sizeof(desc), &d), &d, "describe");
	printf("device: %s\n", desc);
	for (size_t f = 0; f < sizeof(fmt) / sizeof(fmt[0]); f++) {
		for (size_t s = 0; s < sizeof(shape) / sizeof(shape[0]); s++)
			test_gemv(fmt[f].dt, shape[s][0], shape[s][1],
				  fmt[f].group, G_RANDOM);
		if (fmt[f].dt == ST_DTYPE_BF16 || fmt[f].dt == ST_DTYPE_F32)
			continue;
		for (int gc = G_ZERO_BLOCKS; gc <= G_SUBNORMAL; gc++)
			test_gemv(fmt[f].dt, 9, 4096, fmt[f].group, gc);
	}
	/* odd sizes: the per-element path */
	test_gemv(ST_DTYPE_NVFP4, 7, 48, 16, G_RANDOM);
	test_gemv(ST_DTYPE_NVFP4, 7, 48, 16, G_NAN_SCALE);
	test_gemv(ST_DTYPE_E2M1_F16, 7, 66, 32, G_RANDOM);
	test_gemv(ST_DTYPE_E2M1_F16, 7, 200, 10, G_RANDOM);
	test_gemv(ST_DTYPE_F8_E4M3, 7, 100, 128, G_RANDOM);
	test_gemv(ST_DTYPE_F8_E4M3, 7, 300, 128, G_MAX_SCALES);
	test_gemv(ST_DTYPE_F8_E4M3, 5, 77, 7, G_RANDOM);
	test_gemv(ST_DTYPE_BF16, 7, 13, 0, G_RANDOM);
	test_gemv(ST_DTYPE_F32, 7, 7, 0, G_RANDOM);
	test_gemv_refuses();
	test_gemv_batch(ST_DTYPE_MXFP4, 5, 37, 4096);
	test_gemv_batch(ST_DTYPE_NVFP4, 3, 2048, 7168);
	test_pitfalls();
	test_gemm(1, 1, 1);
	test_gemm(96, 256, 7);
	test_gemm(257, 1000, 33);
	test_grouped(ST_DTYPE_MXFP4, 3, 64, 256);
	test_grouped(ST_DTYPE_MXFP4, 8, 96, 1024);
	test_grouped(ST_DTYPE_NVFP4, 4, 48, 512);

	for (int i = 0; i < 2; i++) {
		enum st_dtype wdt = i ? ST_DTYPE_BF16 : ST_DTYPE_F32;

		test_rmsnorm(1, wdt, 1.0f);
		test_rmsnorm(7, wdt, 1.0f);
		test_rmsnorm(4096, wdt, 1.0f);
		test_rmsnorm(5120, wdt, 1e20f); /* x^2 overflows float */
		test_rmsnorm(4096, wdt, 0.0f);  /* all zero */
		test_rmsnorm(4096, wdt, 1e-30f);
	}
	test_rope(32, 128, 7, 1e6);
	test_rope(8, 64, 131071, 10000.0);
	test_rope(3, 6, 5, 10000.0);
	test_rope(4, 128, 0, 1e6);
	test_swiglu(14336, 0);
	test_swiglu(1001, 1);
	test_swiglu(1, 0);

	{
		static const enum st_dtype kvt[] = { ST_DTYPE_F32, ST_DTYPE_F16,
						     ST_DTYPE_BF16,
						     ST_DTYPE_F8_E4M3 };

		for (int i = 0; i < 4; i++) {
			test_attend(kvt[i], 8, 2, 128, 1, A_RANDOM);
			test_attend(kvt[i], 8, 2, 128, 300, A_RANDOM);
			test_attend(kvt[i], 4, 4, 64, 1000, A_PEAKED);
			test_attend(kvt[i], 6, 1, 80, 37, A_EQUAL_KEYS);
		}
		test_attend(ST_DTYPE_F16, 2, 1, 7, 5, A_RANDOM);
	}
	test_router(16, 8, 2, 1, R_RANDOM);
	test_router(16, 64, 8, 0, R_RANDOM);
	test_router(16, 60, 4, 1, R_RANDOM);
	test_router(4, 1024, 64, 1, R_RANDOM);
	test_router(3, 256, 6, 0, R_RANDOM);
	test_router(2, 128, 8, 1, R_TIES);
	test_router(2, 100, 16, 0, R_UNDERFLOW);
	test_router(1, 1, 1, 1, R_RANDOM);

	if (failures) {
		printf("%d failures\n", failures);
		return 1;
	}
	printf("all CUDA kernels within tolerance of the CPU reference\n");
	return 0;
}
