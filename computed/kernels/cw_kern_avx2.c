/*
 * cw_kern_avx2.c — the fast-mode kernels for AVX2 + FMA + F16C (cw_kern.h),
 * compiled with per-function target attributes so the file builds for the
 * baseline and runs only where cw_kern_path_supported says so.
 *
 * 4-bit weights: the 16 code bytes of a 32-element block are broadcast to
 * both 128-bit lanes, one byte shuffle puts each 8-byte half (16 elements)
 * twice into its lane, a 64-bit variable shift moves the high nibbles down
 * in the second copy, and a 16-entry shuffle table gives twice the E2M1
 * values as int8, in the order cw_act.q is stored in (per run of 16: even
 * elements, then odd).  The int8 dot product uses the sign trick
 * (maddubs(|w|, sign(q, w))), then pairs of int16 are summed to int32
 * lanes: lanes 0-3 hold the first 16 elements, lanes 4-7 the second 16,
 * each multiplied by its own factor 0.5 * scale * d and accumulated with FMA.
 */
#include "cw_kern.h"

#include <math.h>
#include <string.h>

#include "st_formats.h"
#include "st_util.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "cw_kern_x86.h"

#define KT __attribute__((target("avx2,fma,f16c")))

KI float f16f(const uint8_t *p)
{
	unsigned short h;

	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

/* The weight scale of group g of row r of a 4-bit view (G elements per
 * group, ng groups per row). */
KI float fp4_scale(const struct cw_wview *w, enum st_dtype dt, int64_t r,
		   int64_t ng, int64_t g)
{
	if (dt == ST_DTYPE_MXFP4)
		return e8m0f(w->scales[r * ng + g]);
	if (dt == ST_DTYPE_NVFP4)
		return e4m3f(w->scales[r * ng + g]) * w->global_scale;
	return f16f(w->scales + 2 * (r * ng + g));
}

/* 32 weights of one block as int8 (2 * e2m1), in cw_act.q order. */
KI __m256i fp4_decode(const uint8_t *p)
{
	const __m256i dup = _mm256_setr_epi8(
		0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7,
		8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
	const __m256i lut = _mm256_setr_epi8(
		0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
		0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
	const __m256i sh = _mm256_setr_epi64x(0, 4, 0, 4);
	__m256i c = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)(const void *)p));

	c = _mm256_srlv_epi64(_mm256_shuffle_epi8(c, dup), sh);
	return _mm256_shuffle_epi8(lut, _mm256_and_si256(c, _mm256_set1_epi8(15)));
}

/* Eight int32 partial dot products of 32 int8 weights and activations. */
KI __m256 dot32(__m256i w, const int8_t *q)
{
	const __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)q);
	const __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(w),
						 _mm256_sign_epi8(qa, w));

	return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* Factor vector of block b: lanes 0-3 the first half's, 4-7 the second's. */
KI __m256 fp4_factors(const struct cw_wview *w, enum st_dtype dt,
		      const struct cw_act *a, int64_t r, int64_t G, int64_t ng,
		      int64_t b)
{
	const float d = a->d[b];

	if (dt == ST_DTYPE_MXFP4)
		return _mm256_set1_ps((0.5f * fp4_scale(w, dt, r, ng, b)) * d);
	return _mm256_setr_m128(
		_mm_set1_ps((0.5f * fp4_scale(w, dt, r, ng, (32 * b) / G)) * d),
		_mm_set1_ps((0.5f * fp4_scale(w, dt, r, ng, (32 * b + 16) / G)) * d));
}

KI void fp4_avx2_t(const struct cw_wview *w, const struct cw_act *a, float *y,
		   int64_t r0, int64_t r1, enum st_dtype dt)
{
	const int64_t C = w->cols;
	const int64_t G = dt == ST_DTYPE_MXFP4 ? ST_MXFP4_BLOCK :
			  dt == ST_DTYPE_NVFP4 ? ST_NVFP4_BLOCK : w->group;
	const int64_t ng = (C + G - 1) / G, nb = C / 32;
	const uint8_t *codes = w->data;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * (C / 2);
		__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
		int64_t b = 0, c;
		float t = 0.0f;

		for (; b + 2 <= nb; b += 2) {
			acc0 = _mm256_fmadd_ps(
				dot32(fp4_decode(rc + 16 * b), a->q + 32 * b),
				fp4_factors(w, dt, a, r, G, ng, b), acc0);
			acc1 = _mm256_fmadd_ps(
				dot32(fp4_decode(rc + 16 * b + 16), a->q + 32 * b + 32),
				fp4_factors(w, dt, a, r, G, ng, b + 1), acc1);
		}
		if (b < nb)
			acc0 = _mm256_fmadd_ps(
				dot32(fp4_decode(rc + 16 * b), a->q + 32 * b),
				fp4_factors(w, dt, a, r, G, ng, b), acc0);
		/* the last partial block, in runs as cw_kern_c does */
		c = nb * 32;
		while (c < C) {
			const int64_t end = ST_MIN(ST_MIN((c / G + 1) * G,
							  (c / 16 + 1) * 16), C);
			const float f = (0.5f * fp4_scale(w, dt, r, ng, c / G)) *
					a->d[c / CW_QBLOCK];
			int32_t is = 0;

			for (; c < end; c++) {
				const uint8_t by = rc[c / 2];
				const int code = (c & 1) ? by >> 4 : by & 15;

				is += cw_kern_e2m1x2[code] * a->q[cw_kern_qpos(c, 16)];
			}
			t += (float)is * f;
		}
		y[r] = hsum256(_mm256_add_ps(acc0, acc1)) + t;
	}
}

KT static void nvfp4_avx2(const struct cw_wview *w, const struct cw_act *a,
			  float *y, int64_t r0, int64_t r1)
{
	fp4_avx2_t(w, a, y, r0, r1, ST_DTYPE_NVFP4);
}

KT static void e2m1f16_avx2(const struct cw_wview *w, const struct cw_act *a,
			    float *y, int64_t r0, int64_t r1)
{
	fp4_avx2_t(w, a, y, r0, r1, ST_DTYPE_E2M1_F16);
}

/* 16 E4M3 bytes to two vectors of floats / 256: each byte moved to the
 * high half of a 16-bit lane, an arithmetic shift right by one puts the
 * sign at bit 15 (and a copy at bit 14, cleared) and exponent and mantissa
 * at bits 13..7: binary16 of e4m3 / 256. */
KI void e4m3x16(const uint8_t *p, __m256 *lo, __m256 *hi)
{
	__m256i v = _mm256_cvtepu8_epi16(
		_mm_loadu_si128((const __m128i *)(const void *)p));

	v = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1),
			     _mm256_set1_epi16((short)0xbfff));
	*lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
	*hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

/* FP8 rows [r, r + NR) times x: each row the same operations in the same
 * order as a single row (two FMA chains per 16 columns within a scale
 * group, the group folded into the row's accumulator with its scale, the
 * last c1 % 8 columns in float), so the result does not depend on NR;
 * NR rows at once share each activation load and overlap their
 * conversion and FMA chains (about 1.2 x one row at a time). */
KI void fp8_rows(const uint8_t *codes, const float *sc, const float *x,
		 int64_t C, int64_t G, int64_t ng, int64_t r, const int NR,
		 float *y)
{
	__m256 acc[4];
	float t[4];

	MM_UNROLL
	for (int i = 0; i < NR; i++) {
		acc[i] = _mm256_setzero_ps();
		t[i] = 0.0f;
	}
	for (int64_t g = 0; g < ng; g++) {
		const int64_t c0 = g * G, c1 = ST_MIN(c0 + G, C);
		const int64_t c8 = c0 + ((c1 - c0) & ~(int64_t)7);
		__m256 g0[4], g1[4];
		float gt[4];
		int64_t c = c0;

		MM_UNROLL
		for (int i = 0; i < NR; i++) {
			g0[i] = g1[i] = _mm256_setzero_ps();
			gt[i] = 0.0f;
		}
		for (; c + 16 <= c8; c += 16) {
			const __m256 x0 = _mm256_loadu_ps(x + c);
			const __m256 x1 = _mm256_loadu_ps(x + c + 8);

			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				__m256 w0, w1;

				e4m3x16(codes + (r + i) * C + c, &w0, &w1);
				g0[i] = _mm256_fmadd_ps(w0, x0, g0[i]);
				g1[i] = _mm256_fmadd_ps(w1, x1, g1[i]);
			}
		}
		if (c < c8) {
			const __m256 x0 = _mm256_loadu_ps(x + c);

			MM_UNROLL
			for (int i = 0; i < NR; i++)
				g0[i] = _mm256_fmadd_ps(
					e4m3x8(codes + (r + i) * C + c), x0,
					g0[i]);
			c += 8;
		}
		for (; c < c1; c++)
			MM_UNROLL
			for (int i = 0; i < NR; i++)
				gt[i] += e4m3f(codes[(r + i) * C + c]) * x[c];
		MM_UNROLL
		for (int i = 0; i < NR; i++) {
			const float s = sc ? sc[(r + i) * ng + g] : 1.0f;

			acc[i] = _mm256_fmadd_ps(_mm256_add_ps(g0[i], g1[i]),
						 _mm256_set1_ps(s * 256.0f),
						 acc[i]);
			t[i] += gt[i] * s;
		}
	}
	MM_UNROLL
	for (int i = 0; i < NR; i++)
		y[r + i] = hsum256(acc[i]) + t[i];
}

KT static void fp8_avx2(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const uint8_t *codes = w->data;
	const float *sc = (const float *)(const void *)w->scales;
	int64_t r = r0;

	for (; r + 4 <= r1; r += 4)
		fp8_rows(codes, sc, a->x, C, G, ng, r, 4, y);
	for (; r < r1; r++)
		fp8_rows(codes, sc, a->x, C, G, ng, r, 1, y);
}

KI __m256 bf16x8(const uint16_t *p)
{
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(
		_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}

/* BF16 rows [r, r + RB) times NT float vectors: one accumulator per (row,
 * token), 8 columns per step in column order, then the lane sum and the
 * last C % 8 columns in float: each output the same operations whatever RB
 * and NT (matvec and GEMM bit-identical), while RB * NT independent FMA
 * chains hide the FMA latency and each activation load serves RB rows. */
KI void bf16_blk(const uint16_t *W, int64_t C, int64_t r,
		 const struct cw_act *a, float *const *ys, const int RB,
		 const int NT)
{
	const int64_t C8 = C & ~(int64_t)7;
	__m256 acc[8][2];
	int64_t c = 0;

	MM_UNROLL
	for (int i = 0; i < RB; i++)
		MM_UNROLL
		for (int t = 0; t < NT; t++)
			acc[i][t] = _mm256_setzero_ps();
	for (; c < C8; c += 8) {
		__m256 xv[2];

		MM_UNROLL
		for (int t = 0; t < NT; t++)
			xv[t] = _mm256_loadu_ps(a[t].x + c);
		MM_UNROLL
		for (int i = 0; i < RB; i++) {
			const __m256 wv = bf16x8(W + (r + i) * C + c);

			MM_UNROLL
			for (int t = 0; t < NT; t++)
				acc[i][t] = _mm256_fmadd_ps(wv, xv[t], acc[i][t]);
		}
	}
	MM_UNROLL
	for (int i = 0; i < RB; i++)
		MM_UNROLL
		for (int t = 0; t < NT; t++) {
			float tl = 0.0f;

			for (int64_t k = C8; k < C; k++)
				tl += st_bf16_to_f32(W[(r + i) * C + k]) * a[t].x[k];
			ys[t][r + i] = hsum256(acc[i][t]) + tl;
		}
}

KT static void bf16_avx2(const struct cw_wview *w, const struct cw_act *a,
			 float *y, int64_t r0, int64_t r1)
{
	float *const ys[1] = { y };
	int64_t r = r0;

	for (; r + 8 <= r1; r += 8)
		bf16_blk(w->data, w->cols, r, a, ys, 8, 1);
	for (; r < r1; r++)
		bf16_blk(w->data, w->cols, r, a, ys, 1, 1);
}

KT static void f32_avx2(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, C32 = C & ~(int64_t)31, C8 = C & ~(int64_t)7;
	const float *W = w->data;
	const float *x = a->x;

	for (int64_t r = r0; r < r1; r++) {
		const float *row = W + r * C;
		__m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
		int64_t c = 0;
		float t = 0.0f;

		for (; c < C32; c += 32) {
			a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(x + c), a0);
			a1 = _mm256_fmadd_ps(_mm256_loadu_ps(row + c + 8), _mm256_loadu_ps(x + c + 8), a1);
			a2 = _mm256_fmadd_ps(_mm256_loadu_ps(row + c + 16), _mm256_loadu_ps(x + c + 16), a2);
			a3 = _mm256_fmadd_ps(_mm256_loadu_ps(row + c + 24), _mm256_loadu_ps(x + c + 24), a3);
		}
		for (; c < C8; c += 8)
			a0 = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), _mm256_loadu_ps(x + c), a0);
		for (; c < C; c++)
			t += row[c] * x[c];
		y[r] = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1),
					     _mm256_add_ps(a2, a3))) + t;
	}
}

/* ---- small-batch GEMM (cw_kern_mm_fn) ----
 * Each kernel handles one row for NT tokens at a time (NT a constant after
 * inlining, so the accumulators stay in registers): the row's weights are
 * decoded or widened once and used for every token, each token's output
 * the same vector operations in the same order as the matvec kernel above
 * (bit-identical).  Rows outer, token groups inner: a row (a few KiB) is
 * read from memory once and from L1 for the further groups. */

KI void mx_mm_row(const uint8_t *rc, const uint8_t *rs, int64_t nb,
		  const struct cw_act *a, float *const *ys, int64_t r,
		  const int NT)
{
	const int64_t nb8 = nb & ~(int64_t)7;
	__m256 acc0[8], acc1[8];
	int64_t b = 0;

	MM_UNROLL
	for (int t = 0; t < NT; t++)
		acc0[t] = acc1[t] = _mm256_setzero_ps();
	for (; b < nb8; b += 8) {
		const __m256 wf = mx_wscale8(rs + b);
		/* the factors stored and broadcast back from L1: a load
		 * each instead of a lane permute (a shuffle-port uop) */
		_Alignas(32) float f[8][8];

		mx_prefetch(rc, rs, b);

		MM_UNROLL
		for (int t = 0; t < NT; t++)
			_mm256_store_ps(f[t], _mm256_mul_ps(
				wf, _mm256_loadu_ps(a[t].d + b)));
		MM_UNROLL
		for (int i = 0; i < 8; i++) {
			const __m256i wv = fp4_decode32(rc + 16 * (b + i));

			MM_UNROLL
			for (int t = 0; t < NT; t++) {
				const __m256 d = mx_dot(wv, a[t].qabs + 32 * (b + i),
							a[t].q + 32 * (b + i));
				const __m256 fi = _mm256_broadcast_ss(&f[t][i]);

				if (i & 1)
					acc1[t] = _mm256_fmadd_ps(d, fi, acc1[t]);
				else
					acc0[t] = _mm256_fmadd_ps(d, fi, acc0[t]);
			}
		}
	}
	mx_row_tail(rc, rs, b, nb, a, acc0, acc1, ys, r, NT);
}

/* MXFP4 (activations in runs of 32): the GEMM's row kernel for one token
 * (mx_mm_row), so matvec and GEMM are the same code; other activation
 * layouts go to the generic 4-bit kernel. */
KT static void mxfp4_avx2(const struct cw_wview *w, const struct cw_act *a,
			  float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, nb = C / 32;
	const uint8_t *codes = w->data;
	float *const ys[1] = { y };

	if (!a->qabs || C % 32 || a->qgroup != 32) {
		if (a->qgroup == 16)
			fp4_avx2_t(w, a, y, r0, r1, ST_DTYPE_MXFP4);
		else
			cw_kern_c(w)(w, a, y, r0, r1);
		return;
	}
	for (int64_t r = r0; r < r1; r++)
		mx_mm_row(codes + r * (C / 2), w->scales + r * nb, nb, a, ys,
			  r, 1);
}

KT static int mxfp4_mm_avx2(const struct cw_wview *w, const struct cw_act *a,
			    int n, float *const *ys, int64_t r0, int64_t r1)
{
	CW_MX_MM_BODY(mx_mm_row);
}

/* BF16 GEMM: blocks of 4 rows times pairs of tokens (bf16_blk). */
KT static int bf16_mm_avx2(const struct cw_wview *w, const struct cw_act *a,
			   int n, float *const *ys, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols;
	int64_t r = r0;

	for (; r + 4 <= r1; r += 4) {
		int t = 0;

		for (; t + 2 <= n; t += 2)
			bf16_blk(w->data, C, r, a + t, ys + t, 4, 2);
		if (t < n)
			bf16_blk(w->data, C, r, a + t, ys + t, 4, 1);
	}
	for (; r < r1; r++) {
		int t = 0;

		for (; t + 2 <= n; t += 2)
			bf16_blk(w->data, C, r, a + t, ys + t, 1, 2);
		if (t < n)
			bf16_blk(w->data, C, r, a + t, ys + t, 1, 1);
	}
	return 1;
}

KI void fp8_mm_row(const uint8_t *rc, const float *rsc, int64_t C, int64_t G,
		   int64_t ng, const struct cw_act *a, float *const *ys,
		   int64_t r, const int NT)
{
	__m256 acc[4];
	float tl[4];

	MM_UNROLL
	for (int t = 0; t < NT; t++) {
		acc[t] = _mm256_setzero_ps();
		tl[t] = 0.0f;
	}
	for (int64_t g = 0; g < ng; g++) {
		const int64_t c0 = g * G, c1 = ST_MIN(c0 + G, C);
		const int64_t c8 = c0 + ((c1 - c0) & ~(int64_t)7);
		const float s = rsc ? rsc[g] : 1.0f;
		__m256 g0[4], g1[4];
		float gt[4];
		int64_t c = c0;

		MM_UNROLL
		for (int t = 0; t < NT; t++) {
			g0[t] = g1[t] = _mm256_setzero_ps();
			gt[t] = 0.0f;
		}
		for (; c + 16 <= c8; c += 16) {
			__m256 w0, w1;

			e4m3x16(rc + c, &w0, &w1);
			MM_UNROLL
			for (int t = 0; t < NT; t++) {
				g0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a[t].x + c), g0[t]);
				g1[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a[t].x + c + 8), g1[t]);
			}
		}
		if (c < c8) {
			const __m256 w0 = e4m3x8(rc + c);

			MM_UNROLL
			for (int t = 0; t < NT; t++)
				g0[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a[t].x + c), g0[t]);
			c += 8;
		}
		for (; c < c1; c++) {
			const float wf = e4m3f(rc[c]);

			MM_UNROLL
			for (int t = 0; t < NT; t++)
				gt[t] += wf * a[t].x[c];
		}
		MM_UNROLL
		for (int t = 0; t < NT; t++) {
			acc[t] = _mm256_fmadd_ps(_mm256_add_ps(g0[t], g1[t]),
						 _mm256_set1_ps(s * 256.0f), acc[t]);
			tl[t] += gt[t] * s;
		}
	}
	MM_UNROLL
	for (int t = 0; t < NT; t++)
		ys[t][r] = hsum256(acc[t]) + tl[t];
}

KT static int fp8_mm_avx2(const struct cw_wview *w, const struct cw_act *a,
			  int n, float *const *ys, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const uint8_t *codes = w->data;
	const float *sc = (const float *)(const void *)w->scales;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * C;
		const float *rsc = sc ? sc + r * ng : NULL;
		int t = 0;

		for (; t + 4 <= n; t += 4)
			fp8_mm_row(rc, rsc, C, G, ng, a + t, ys + t, r, 4);
		switch (n - t) {
		case 3: fp8_mm_row(rc, rsc, C, G, ng, a + t, ys + t, r, 3); break;
		case 2: fp8_mm_row(rc, rsc, C, G, ng, a + t, ys + t, r, 2); break;
		case 1: fp8_mm_row(rc, rsc, C, G, ng, a + t, ys + t, r, 1); break;
		default: break;
		}
	}
	return 1;
}

cw_kern_mm_fn cw_kern_avx2_mm(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX2))
		return NULL;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		if (w->il_rows)
			return cw_kern_il_has_avxvnni() ? cw_kern_il_mm_avxvnni :
							  cw_kern_il_mm_avx2;
		return mxfp4_mm_avx2;
	case ST_DTYPE_F8_E4M3:
		return !w->scales || !w->group || w->group % 8 == 0 ?
			       fp8_mm_avx2 : NULL;
	case ST_DTYPE_BF16: return bf16_mm_avx2;
	default: return NULL;
	}
}

cw_kern_fn cw_kern_avx2(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX2))
		return NULL;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		if (w->il_rows)
			return cw_kern_il_has_avxvnni() ? cw_kern_il_avxvnni :
							  cw_kern_il_avx2;
		return mxfp4_avx2;
	case ST_DTYPE_NVFP4: return nvfp4_avx2;
	case ST_DTYPE_E2M1_F16:
		return w->group >= 16 && w->group % 16 == 0 ? e2m1f16_avx2 : NULL;
	case ST_DTYPE_F8_E4M3:
		return !w->scales || !w->group || w->group % 8 == 0 ?
			       fp8_avx2 : NULL;
	case ST_DTYPE_BF16: return bf16_avx2;
	case ST_DTYPE_F32: return f32_avx2;
	default: return NULL;
	}
}

int cw_kern_path_supported(enum cw_kern_path path)
{
	switch (path) {
	case CW_KERN_AUTO:
	case CW_KERN_C:
		return 1;
	case CW_KERN_AVX2:
		return __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("fma") &&
		       __builtin_cpu_supports("f16c");
	case CW_KERN_AVX512:
		return cw_kern_path_supported(CW_KERN_AVX2) &&
		       __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") &&
		       __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("avx512vnni");
	case CW_KERN_AVX512BF16:
		return cw_kern_path_supported(CW_KERN_AVX512) &&
		       __builtin_cpu_supports("avx512vbmi") &&
		       __builtin_cpu_supports("avx512bf16");
	default:
		return 0;
	}
}

#else /* not x86-64 GCC: the portable kernels only */

cw_kern_mm_fn cw_kern_avx2_mm(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

cw_kern_fn cw_kern_avx2(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

int cw_kern_path_supported(enum cw_kern_path path)
{
	return path == CW_KERN_AUTO || path == CW_KERN_C;
}

#endif
