/*
 * cw_kern_c.c — the portable fast-mode kernels (cw_kern.h): plain loops, the
 * reference every SIMD kernel is tested against.  Integer sums per run of
 * elements sharing one weight scale and one activation block are exact; the
 * runs are added in column order in float.
 */
#include "cw_kern.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "st_formats.h"
#include "st_util.h"

const int8_t cw_kern_e2m1x2[16] = { 0, 1, 2, 3, 4, 6, 8, 12,
				    0, -1, -2, -3, -4, -6, -8, -12 };

size_t cw_kern_act_bytes(int64_t n)
{
	const int64_t nb = (n + CW_QBLOCK - 1) / CW_QBLOCK;

	return 2 * (size_t)nb * CW_QBLOCK + (size_t)nb * sizeof(float) +
	       (size_t)nb * sizeof(int32_t);
}

void cw_kern_quantize_act(const float *x, int64_t n, int qgroup, void *buf,
			  struct cw_act *ret)
{
	const int64_t nb = (n + CW_QBLOCK - 1) / CW_QBLOCK;
	int8_t *q = buf;
	uint8_t *qa = (uint8_t *)(q + nb * CW_QBLOCK);
	float *d = (float *)(void *)(qa + nb * CW_QBLOCK);
	int32_t *qsum = (int32_t *)(void *)(d + nb);

	for (int64_t b = 0; b < nb; b++) {
		const int64_t c0 = b * CW_QBLOCK,
			      c1 = ST_MIN(c0 + CW_QBLOCK, n);
		float amax = 0.0f, inv;
		int nan = 0;

		for (int64_t c = c0; c < c1; c++) {
			const float a = fabsf(x[c]);

			if (!(a <= 3.0e38f))
				nan = 1; /* NaN or inf */
			else if (a > amax)
				amax = a;
		}
		memset(q + c0, 0, CW_QBLOCK);
		if (nan) {
			d[b] = NAN;
			continue;
		}
		d[b] = amax / 127.0f;
		if (amax == 0.0f || d[b] == 0.0f) {
			d[b] = 0.0f;
			continue;
		}
		inv = 127.0f / amax;
		for (int64_t c = c0; c < c1; c++) {
			float v = nearbyintf(x[c] * inv);

			v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
			q[cw_kern_qpos(c, qgroup)] = (int8_t)v;
		}
	}
	for (int64_t i = 0; i < nb * CW_QBLOCK; i++)
		qa[i] = (uint8_t)abs(q[i]);
	for (int64_t b = 0; b < nb; b++) {
		int32_t s = 0;

		for (int i = 0; i < CW_QBLOCK; i++)
			s += q[b * CW_QBLOCK + i];
		qsum[b] = s;
	}
	ret->x = x;
	ret->q = q;
	ret->d = d;
	ret->n = n;
	ret->qabs = qa;
	ret->qsum = qsum;
	ret->qgroup = qgroup;
	ret->xp = NULL;
}

/* Elements per weight scale of a 4-bit view. */
static int64_t fp4_group(const struct cw_wview *w)
{
	if (w->dtype == ST_DTYPE_MXFP4)
		return ST_MXFP4_BLOCK;
	if (w->dtype == ST_DTYPE_NVFP4)
		return ST_NVFP4_BLOCK;
	return w->group;
}

/* The weight scale of group g of row r (NVFP4: block scale times the
 * tensor scale). */
static float fp4_scale(const struct cw_wview *w, int64_t r, int64_t g)
{
	const int64_t ng = (w->cols + fp4_group(w) - 1) / fp4_group(w);

	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		return st_e8m0_to_f32(w->scales[r * ng + g]);
	case ST_DTYPE_NVFP4:
		return st_e4m3_to_f32(w->scales[r * ng + g]) * w->global_scale;
	default: {
		uint16_t h;

		memcpy(&h, w->scales + 2 * (r * ng + g), 2);
		return st_f16_to_f32(h);
	}
	}
}

static void fp4_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = fp4_group(w);
	const uint8_t *codes = w->data;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * (C / 2);
		float acc = 0.0f;
		int64_t c = 0;

		while (c < C) {
			/* a run: one weight group inside one half block */
			const int64_t end = ST_MIN(ST_MIN((c / G + 1) * G,
							  (c / 16 + 1) * 16), C);
			const float f = (0.5f * fp4_scale(w, r, c / G)) *
					a->d[c / CW_QBLOCK];
			int32_t is = 0;

			for (; c < end; c++) {
				const uint8_t b = rc[c / 2];
				const int code = (c & 1) ? b >> 4 : b & 15;

				is += cw_kern_e2m1x2[code] *
				      a->q[cw_kern_qpos(c, a->qgroup)];
			}
			acc += (float)is * f;
		}
		y[r] = acc;
	}
}

static void fp8_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const uint8_t *codes = w->data;
	const float *sc = (const float *)(const void *)w->scales;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * C;
		float acc = 0.0f;

		for (int64_t g = 0; g < ng; g++) {
			const int64_t c1 = ST_MIN((g + 1) * G, C);
			float gs = 0.0f;

			for (int64_t c = g * G; c < c1; c++)
				gs += st_e4m3_to_f32(rc[c]) * a->x[c];
			acc += gs * (sc ? sc[r * ng + g] : 1.0f);
		}
		y[r] = acc;
	}
}

static void bf16_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		   int64_t r0, int64_t r1)
{
	const uint16_t *W = w->data;

	for (int64_t r = r0; r < r1; r++) {
		const uint16_t *row = W + r * w->cols;
		float acc = 0.0f;

		for (int64_t c = 0; c < w->cols; c++)
			acc += st_bf16_to_f32(row[c]) * a->x[c];
		y[r] = acc;
	}
}

static void f32_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1)
{
	const float *W = w->data;

	for (int64_t r = r0; r < r1; r++) {
		const float *row = W + r * w->cols;
		float acc = 0.0f;

		for (int64_t c = 0; c < w->cols; c++)
			acc += row[c] * a->x[c];
		y[r] = acc;
	}
}

cw_kern_fn cw_kern_c(const struct cw_wview *w)
{
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		return w->il_rows ? cw_kern_il_c : fp4_c;
	case ST_DTYPE_NVFP4:
		return fp4_c;
	case ST_DTYPE_E2M1_F16:
		return w->group >= 2 && w->group % 2 == 0 ? fp4_c : NULL;
	case ST_DTYPE_F8_E4M3: return fp8_c;
	case ST_DTYPE_BF16: return bf16_c;
	case ST_DTYPE_F32: return f32_c;
	default: return NULL;
	}
}
