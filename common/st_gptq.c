/*
 * st_gptq.c — GPTQ for the 4-bit expert formats (see st_gptq.h).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "st_gptq.h"

/* Lower Cholesky factor of the n x n symmetric a (row-major) into l;
 * 0 or -1 when a is not positive definite. */
static int cholesky(const double *a, size_t n, double *l)
{
	memset(l, 0, sizeof(double) * n * n);
	for (size_t j = 0; j < n; j++) {
		double d = a[j * n + j];

		for (size_t k = 0; k < j; k++)
			d -= l[j * n + k] * l[j * n + k];
		if (!(d > 0.0))
			return -1;
		d = sqrt(d);
		l[j * n + j] = d;
		for (size_t i = j + 1; i < n; i++) {
			double s = a[i * n + j];

			for (size_t k = 0; k < j; k++)
				s -= l[i * n + k] * l[j * n + k];
			l[i * n + j] = s / d;
		}
	}
	return 0;
}

/* inv = (L L^T)^-1 from the lower factor l: Linv first, then
 * inv = Linv^T Linv.  t: n * n scratch. */
static void cholesky_inverse(const double *l, size_t n, double *inv,
			     double *t)
{
	memset(t, 0, sizeof(double) * n * n);
	for (size_t j = 0; j < n; j++) {
		t[j * n + j] = 1.0 / l[j * n + j];
		for (size_t i = j + 1; i < n; i++) {
			double s = 0.0;

			for (size_t k = j; k < i; k++)
				s += l[i * n + k] * t[k * n + j];
			t[i * n + j] = -s / l[i * n + i];
		}
	}
	for (size_t i = 0; i < n; i++)
		for (size_t j = i; j < n; j++) {
			double s = 0.0;

			for (size_t k = j; k < n; k++)
				s += t[k * n + i] * t[k * n + j];
			inv[i * n + j] = inv[j * n + i] = s;
		}
}

/*
 * U (upper, row-major) with U^T U = (H + damp I)^-1; damp = ST_GPTQ_DAMP *
 * mean(diag H), raised tenfold while the factorization fails (3 times).
 * Columns whose diagonal is 0 (channels never active) get 1 there.
 */
static int hinv_upper(const double *H, size_t n, double *u)
{
	double *a = malloc(sizeof(double) * n * n);
	double *l = malloc(sizeof(double) * n * n);
	double *t = malloc(sizeof(double) * n * n);
	double mean = 0.0, damp;
	int r = -ENOMEM;

	if (!a || !l || !t)
		goto out;
	for (size_t i = 0; i < n; i++)
		mean += H[i * n + i];
	mean /= (double)n;
	if (!(mean > 0.0) || !isfinite(mean))
		mean = 1.0;
	damp = ST_GPTQ_DAMP * mean;
	r = -ST_E_FORMAT;
	for (int tries = 0; tries < 4 && r; tries++, damp *= 10.0) {
		memcpy(a, H, sizeof(double) * n * n);
		for (size_t i = 0; i < n; i++) {
			if (a[i * n + i] == 0.0)
				a[i * n + i] = 1.0;
			a[i * n + i] += damp;
		}
		if (cholesky(a, n, l))
			continue;
		cholesky_inverse(l, n, a, t);
		if (cholesky(a, n, l))
			continue;
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < n; j++)
				u[i * n + j] = j >= i ? l[j * n + i] : 0.0;
		r = 0;
	}
out:
	free(a);
	free(l);
	free(t);
	return r;
}

/* The scale of one group of the updated row, by the weighted search. */
static int group_scale(const struct st_wformat *f, const float *x,
		       const float *wd, size_t gn, float global,
		       uint32_t *ret)
{
	uint8_t codes[ST_WFORMAT_MAX_GROUP / 2 + 1];
	uint8_t s8 = 0;
	uint16_t s16 = 0;
	int r;

	if (gn > ST_WFORMAT_MAX_GROUP)
		return -EINVAL;
	switch (f->dtype) {
	case ST_DTYPE_MXFP4:
		r = st_mxfp4_quantize_row_wmse(x, wd, gn, codes, &s8);
		*ret = s8;
		return r;
	case ST_DTYPE_NVFP4:
		r = st_nvfp4_quantize_row_wmse(x, wd, gn, global, codes, &s8);
		*ret = s8;
		return r;
	case ST_DTYPE_E2M1_F16:
		r = st_e2m1f16_quantize_row_wmse(x, wd, gn, gn, codes, &s16);
		*ret = s16;
		return r;
	default:
		return -EINVAL;
	}
}

/* Code of x under scale s (as the plain quantizers round) and its value
 * as the dequantizers read it. */
static uint8_t quant_one(const struct st_wformat *f, uint32_t s, float global,
			 float x, float *ret_val)
{
	uint8_t c;

	switch (f->dtype) {
	case ST_DTYPE_MXFP4:
		c = st_f32_to_e2m1(ldexpf(x, 127 - (int)s));
		*ret_val = st_e2m1_to_f32(c) * st_e8m0_to_f32((uint8_t)s);
		return c;
	case ST_DTYPE_NVFP4: {
		float sb = st_e4m3_to_f32((uint8_t)s), d = sb * global;

		c = d == 0.0f ? 0 : st_f32_to_e2m1(x / d);
		*ret_val = (st_e2m1_to_f32(c) * sb) * global;
		return c;
	}
	default: {
		float sc = st_f16_to_f32((uint16_t)s);

		c = sc == 0.0f ? 0 : st_f32_to_e2m1(x / sc);
		*ret_val = st_e2m1_to_f32(c) * sc;
		return c;
	}
	}
}

int st_gptq_quantize(const struct st_wformat *f, const float *w, size_t rows,
		     size_t cols, const double *H, float global,
		     uint8_t *codes, void *scales)
{
	const size_t g = f->group, ng = g ? (cols + g - 1) / g : 0;
	double *u = NULL, *wr = NULL;
	float *wd = NULL, *xg = NULL;
	int r;

	if (st_wformat_check(f) || !rows || !cols || cols % 2 ||
	    (f->dtype != ST_DTYPE_MXFP4 && f->dtype != ST_DTYPE_NVFP4 &&
	     f->dtype != ST_DTYPE_E2M1_F16) || cols % (f->dtype ==
	     ST_DTYPE_E2M1_F16 ? 2 : g))
		return -EINVAL;
	for (size_t i = 0; i < rows * cols; i++)
		if (!isfinite(w[i]))
			return -EINVAL;
	u = malloc(sizeof(double) * cols * cols);
	wr = malloc(sizeof(double) * cols);
	wd = malloc(sizeof(float) * cols);
	xg = malloc(sizeof(float) * cols);
	r = -ENOMEM;
	if (!u || !wr || !wd || !xg)
		goto out;
	for (size_t i = 0; i < cols; i++) {
		double d = H[i * cols + i];

		wd[i] = d > 0.0 && isfinite(d) ? (float)d : 0.0f;
	}
	r = hinv_upper(H, cols, u);
	if (r)
		goto out;
	memset(codes, 0, rows * cols / 2);
	for (size_t row = 0; row < rows; row++) {
		uint8_t *cr = codes + row * cols / 2;

		for (size_t j = 0; j < cols; j++)
			wr[j] = w[row * cols + j];
		for (size_t gi = 0, g0 = 0; g0 < cols; gi++, g0 += g) {
			const size_t gn = cols - g0 < g ? cols - g0 : g;
			uint32_t s = 0;

			for (size_t j = 0; j < gn; j++)
				xg[j] = (float)wr[g0 + j];
			r = group_scale(f, xg, wd + g0, gn, global, &s);
			if (r)
				goto out;
			if (f->dtype == ST_DTYPE_E2M1_F16)
				((uint16_t *)scales)[row * ng + gi] = (uint16_t)s;
			else
				((uint8_t *)scales)[row * ng + gi] = (uint8_t)s;
			for (size_t j = g0; j < g0 + gn; j++) {
				float q;
				uint8_t c = quant_one(f, s, global,
						      (float)wr[j], &q);
				double e = (wr[j] - (double)q) / u[j * cols + j];

				cr[j / 2] |= (uint8_t)(c << (4 * (j & 1)));
				for (size_t k = j + 1; k < cols; k++)
					wr[k] -= e * u[j * cols + k];
				if (!isfinite(wr[j + 1 < cols ? j + 1 : j])) {
					r = -ST_E_FORMAT;
					goto out;
				}
			}
		}
	}
	r = 0;
out:
	free(u);
	free(wr);
	free(wd);
	free(xg);
	return r;
}
