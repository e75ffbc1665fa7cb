/*
 * cw_kern_avx512.c — the fast-mode kernels for AVX-512 (F, BW, VL, DQ and
 * VNNI) for the two formats decode time is spent in: FP8 E4M3 (the dense
 * projections of DeepSeek-V4/V4.1) and MXFP4 (their experts).  Every other
 * view goes to the AVX2 kernels (cw_kern_avx2), so the path covers all
 * formats.
 *
 * Bit-identical to the AVX2 kernels by construction, so the path choice
 * never changes a result: a 512-bit register holds the AVX2 kernel's two
 * 256-bit accumulators side by side and every lane sees the same
 * operations in the same order.
 *  - FP8: the AVX2 kernel keeps g0 (columns c..c+7 of each run of 16) and
 *    g1 (c+8..c+15); here one register [g0 | g1] takes all 16 columns with
 *    one FMA, 32 E4M3 bytes are widened at once (the same binary16 trick,
 *    e4m3 / 256 exactly), and the group tail, the fold into the row
 *    accumulator and the lane sum are the AVX2 code on the two halves.
 *  - MXFP4: the AVX2 kernel accumulates even blocks in acc0 and odd blocks
 *    in acc1; here blocks 2p and 2p+1 are decoded into one register (two
 *    128-bit lanes each, the AVX2 layout per block) and [acc0 | acc1] takes
 *    both with one FMA.  The int8 dot product per 4 elements is VNNI's
 *    vpdpbusd(|q|, w * sign(q)): the same exact int32 as AVX2's
 *    maddubs + madd (|q| <= 127, |2 e2m1| <= 12: no int16 saturation
 *    there), the sign applied by a masked subtraction (AVX-512 has no
 *    vpsignb; for q = 0 both products are 0).
 */
#include "cw_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "cw_kern_x86.h"

#include "st_formats.h"
#include "st_util.h"

#define K5_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define K5 __attribute__((target(K5_TARGET)))
#define K5I __attribute__((target(K5_TARGET), always_inline)) static inline

/* 32 E4M3 bytes to two vectors of 16 floats / 256 (e4m3x16's operations
 * on 32 lanes: byte to the high half of a 16-bit lane, arithmetic shift
 * right by one, bit 14 cleared: binary16 of e4m3 / 256). */
K5I void e4m3x32(const uint8_t *p, __m512 *lo, __m512 *hi)
{
	__m512i v = _mm512_cvtepu8_epi16(
		_mm256_loadu_si256((const __m256i *)(const void *)p));

	v = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1),
			     _mm512_set1_epi16((short)0xbfff));
	*lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v));
	*hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
}

/* 16 E4M3 bytes to 16 floats / 256. */
K5I __m512 e4m3x16z(const uint8_t *p)
{
	__m256i v = _mm256_cvtepu8_epi16(
		_mm_loadu_si128((const __m128i *)(const void *)p));

	v = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(v, 8), 1),
			     _mm256_set1_epi16((short)0xbfff));
	return _mm512_cvtph_ps(v);
}

/* FP8 rows [r, r + NR) of an NT = 1 matvec or one row for NT tokens: the
 * AVX2 kernel's fp8_rows / fp8_mm_row (see cw_kern_avx2.c), G[i] = [g0 |
 * g1].  NR rows share each activation load; NT tokens share each weight
 * decode (one of NR, NT is 1). */
K5I void fp8_blk5(const uint8_t *codes, const float *sc, const float *const *xs,
		  int64_t C, int64_t G, int64_t ng, int64_t r, const int NR,
		  const int NT, float *const *ys)
{
	__m256 acc[4];
	float t[4];

	MM_UNROLL
	for (int i = 0; i < NR * NT; i++) {
		acc[i] = _mm256_setzero_ps();
		t[i] = 0.0f;
	}
	for (int64_t g = 0; g < ng; g++) {
		const int64_t c0 = g * G, c1 = ST_MIN(c0 + G, C);
		const int64_t c8 = c0 + ((c1 - c0) & ~(int64_t)7);
		__m512 gz[4];
		__m256 g0[4], g1[4];
		float gt[4];
		int64_t c = c0;

		MM_UNROLL
		for (int i = 0; i < NR * NT; i++) {
			gz[i] = _mm512_setzero_ps();
			gt[i] = 0.0f;
		}
		for (; c + 32 <= c8; c += 32) {
			__m512 xa[4], xb[4];

			MM_UNROLL
			for (int k = 0; k < NT; k++) {
				xa[k] = _mm512_loadu_ps(xs[k] + c);
				xb[k] = _mm512_loadu_ps(xs[k] + c + 16);
			}
			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				__m512 w0, w1;

				e4m3x32(codes + (r + i) * C + c, &w0, &w1);
				MM_UNROLL
				for (int k = 0; k < NT; k++) {
					gz[i + k] = _mm512_fmadd_ps(w0, xa[k], gz[i + k]);
					gz[i + k] = _mm512_fmadd_ps(w1, xb[k], gz[i + k]);
				}
			}
		}
		if (c + 16 <= c8) {
			__m512 xa[4];

			MM_UNROLL
			for (int k = 0; k < NT; k++)
				xa[k] = _mm512_loadu_ps(xs[k] + c);
			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				const __m512 w0 = e4m3x16z(codes + (r + i) * C + c);

				MM_UNROLL
				for (int k = 0; k < NT; k++)
					gz[i + k] = _mm512_fmadd_ps(w0, xa[k], gz[i + k]);
			}
			c += 16;
		}
		MM_UNROLL
		for (int i = 0; i < NR * NT; i++) {
			g0[i] = _mm512_castps512_ps256(gz[i]);
			g1[i] = _mm512_extractf32x8_ps(gz[i], 1);
		}
		if (c < c8) {
			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				const __m256 w0 = e4m3x8(codes + (r + i) * C + c);

				MM_UNROLL
				for (int k = 0; k < NT; k++)
					g0[i + k] = _mm256_fmadd_ps(
						w0, _mm256_loadu_ps(xs[k] + c),
						g0[i + k]);
			}
			c += 8;
		}
		for (; c < c1; c++)
			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				const float wf = e4m3f(codes[(r + i) * C + c]);

				MM_UNROLL
				for (int k = 0; k < NT; k++)
					gt[i + k] += wf * xs[k][c];
			}
		MM_UNROLL
		for (int i = 0; i < NR; i++) {
			const float s = sc ? sc[(r + i) * ng + g] : 1.0f;

			MM_UNROLL
			for (int k = 0; k < NT; k++) {
				acc[i + k] = _mm256_fmadd_ps(
					_mm256_add_ps(g0[i + k], g1[i + k]),
					_mm256_set1_ps(s * 256.0f), acc[i + k]);
				t[i + k] += gt[i + k] * s;
			}
		}
	}
	MM_UNROLL
	for (int i = 0; i < NR; i++)
		MM_UNROLL
		for (int k = 0; k < NT; k++)
			ys[k][r + i] = hsum256(acc[i + k]) + t[i + k];
}

K5 static void fp8_avx512(const struct cw_wview *w, const struct cw_act *a,
			  float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const float *sc = (const float *)(const void *)w->scales;
	const float *const xs[1] = { a->x };
	float *const ys[1] = { y };
	int64_t r = r0;

	for (; r + 4 <= r1; r += 4)
		fp8_blk5(w->data, sc, xs, C, G, ng, r, 4, 1, ys);
	for (; r < r1; r++)
		fp8_blk5(w->data, sc, xs, C, G, ng, r, 1, 1, ys);
}

K5 static int fp8_mm_avx512(const struct cw_wview *w, const struct cw_act *a,
			    int n, float *const *ys, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const uint8_t *codes = w->data;
	const float *sc = (const float *)(const void *)w->scales;

	for (int64_t r = r0; r < r1; r++) {
		/* one row: the codes and scales of row r at row 0 */
		const uint8_t *rc = codes + r * C;
		const float *rsc = sc ? sc + r * ng : NULL;

		for (int t = 0; t < n; t += 4) {
			const float *xs[4];
			float *yr[4];
			const int k = ST_MIN(4, n - t);

			for (int j = 0; j < k; j++) {
				xs[j] = a[t + j].x;
				yr[j] = ys[t + j] + r; /* row 0 of the view */
			}
			switch (k) {
			case 4: fp8_blk5(rc, rsc, xs, C, G, ng, 0, 1, 4, yr); break;
			case 3: fp8_blk5(rc, rsc, xs, C, G, ng, 0, 1, 3, yr); break;
			case 2: fp8_blk5(rc, rsc, xs, C, G, ng, 0, 1, 2, yr); break;
			default: fp8_blk5(rc, rsc, xs, C, G, ng, 0, 1, 1, yr); break;
			}
		}
	}
	return 1;
}

/* Blocks 2p and 2p+1 of a row (32 code bytes) as int8 weights in cw_act
 * order: lanes 0-1 block 2p, lanes 2-3 block 2p+1, each as fp4_decode32
 * lays out one block (even elements, then odd). */
K5I __m512i fp4_decode64(const uint8_t *p)
{
	const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(
		0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
	const __m512i c2 = _mm512_castsi256_si512(
		_mm256_loadu_si256((const __m256i *)(const void *)p));
	__m512i c = _mm512_shuffle_i64x2(c2, c2, 0x50); /* lanes 0,0,1,1 */

	c = _mm512_srlv_epi64(c, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
	return _mm512_shuffle_epi8(lut, _mm512_and_si512(c, _mm512_set1_epi8(15)));
}

/* Sixteen int32 partial dot products (4 elements each) of two blocks. */
K5I __m512 mx_dot64(__m512i wv, const uint8_t *qa, const int8_t *q)
{
	const __m512i qv = _mm512_loadu_si512((const void *)q);
	const __m512i sw = _mm512_mask_sub_epi8(wv, _mm512_movepi8_mask(qv),
						_mm512_setzero_si512(), wv);

	return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(
		_mm512_setzero_si512(), _mm512_loadu_si512((const void *)qa),
		sw));
}

/* The AVX2 kernel's mx_mm_row with [acc0 | acc1] in one register. */
K5I void mx_row5(const uint8_t *rc, const uint8_t *rs, int64_t nb,
		 const struct cw_act *a, float *const *ys, int64_t r,
		 const int NT)
{
	const int64_t nb8 = nb & ~(int64_t)7;
	__m512 acc[4];
	__m256 acc0[4], acc1[4];
	int64_t b = 0;

	MM_UNROLL
	for (int t = 0; t < NT; t++)
		acc[t] = _mm512_setzero_ps();
	for (; b < nb8; b += 8) {
		const __m256 wf = mx_wscale8(rs + b);
		__m512 f[4];

		mx_prefetch(rc, rs, b);
		MM_UNROLL
		for (int t = 0; t < NT; t++)
			f[t] = _mm512_castps256_ps512(
				_mm256_mul_ps(wf, _mm256_loadu_ps(a[t].d + b)));
		MM_UNROLL
		for (int p = 0; p < 4; p++) {
			const __m512i wv = fp4_decode64(rc + 16 * (b + 2 * p));
			const __m512i fi = _mm512_setr_epi32(
				2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
				2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
				2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);

			MM_UNROLL
			for (int t = 0; t < NT; t++) {
				const __m512 d = mx_dot64(
					wv, a[t].qabs + 32 * (b + 2 * p),
					a[t].q + 32 * (b + 2 * p));

				acc[t] = _mm512_fmadd_ps(
					d, _mm512_permutexvar_ps(fi, f[t]),
					acc[t]);
			}
		}
	}
	MM_UNROLL
	for (int t = 0; t < NT; t++) {
		acc0[t] = _mm512_castps512_ps256(acc[t]);
		acc1[t] = _mm512_extractf32x8_ps(acc[t], 1);
	}
	mx_row_tail(rc, rs, b, nb, a, acc0, acc1, ys, r, NT);
}

/* MXFP4 with activations in runs of 32; other layouts to the AVX2 path. */
K5 static void mxfp4_avx512(const struct cw_wview *w, const struct cw_act *a,
			    float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, nb = C / 32;
	float *const ys[1] = { y };

	if (!a->qabs || C % 32 || a->qgroup != 32) {
		cw_kern_avx2(w)(w, a, y, r0, r1);
		return;
	}
	for (int64_t r = r0; r < r1; r++)
		mx_row5((const uint8_t *)w->data + r * (C / 2),
			w->scales + r * nb, nb, a, ys, r, 1);
}

K5 static int mxfp4_mm_avx512(const struct cw_wview *w, const struct cw_act *a,
			      int n, float *const *ys, int64_t r0, int64_t r1)
{
	CW_MX_MM_BODY(mx_row5);
}

cw_kern_mm_fn cw_kern_avx512_mm(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512))
		return NULL;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		return w->il_rows ? cw_kern_il_mm_avx512 : mxfp4_mm_avx512;
	case ST_DTYPE_F8_E4M3:
		return !w->scales || !w->group || w->group % 8 == 0 ?
			       fp8_mm_avx512 : NULL;
	default: return cw_kern_avx2_mm(w);
	}
}

cw_kern_fn cw_kern_avx512(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512))
		return NULL;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
		return w->il_rows ? cw_kern_il_avx512 : mxfp4_avx512;
	case ST_DTYPE_F8_E4M3:
		return !w->scales || !w->group || w->group % 8 == 0 ?
			       fp8_avx512 : NULL;
	default: return cw_kern_avx2(w);
	}
}

#else /* not x86-64 GCC/Clang: no AVX-512 path */

cw_kern_mm_fn cw_kern_avx512_mm(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

cw_kern_fn cw_kern_avx512(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

#endif
