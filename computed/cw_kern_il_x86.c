/*
 * cw_kern_il_x86.c — row-interleaved MXFP4 (st_mxfp4il.h) on x86-64: the
 * AVX2 kernel (maddubs + madd) and the AVX-512 VNNI kernel (vpdpbusd), each
 * a matvec and a small-batch GEMM, all giving cw_kern_il_c's results bit
 * for bit (cw_kern_il.c fixes the arithmetic).
 *
 * A group of 8 rows streams as one run of bytes: per block of 32 columns,
 * 128 code bytes (8 rows x 16) and 8 E8M0 bytes.  A 128-bit lane holds one
 * row's block, so 8 rows are 4 ymm (AVX2) or 2 zmm (AVX-512) registers and
 * each int32 lane is one word j of cw_kern_il.c; the per-lane float
 * accumulators are reduced once per row group, never per block.
 *  - Weights: the nibbles looked up (pshufb) as 2 e2m1 + 12 in 0..24, an
 *    unsigned byte, so one vpdpbusd (or maddubs + madd) multiplies them
 *    with the signed int8 activations; 12 * (sum of the lane's 8 q) is
 *    taken off (the same integer: exact).  The activations are quantized
 *    once per token and matrix (cw_kern_quantize_act, runs of 32).
 *  - Scales: 8 E8M0 bytes widened at once to 0.5 * 2^(e - 127) (bits
 *    (e - 1) << 23; e = 0, 1: the subnormals 2^-128, 2^-127; e = 255:
 *    NaN), times d[b]: the float cw_kern_il_c computes.
 * Rows of a partial group (rows % 8, or a row range that cuts a group) run
 * through cw_kern_il_c (bit-identical by construction).
 */
#include "cw_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "st_mxfp4il.h"
#include "st_util.h"

#define IL2_TARGET "avx2,fma,f16c"
#define IL5_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define IL2I __attribute__((target(IL2_TARGET), always_inline)) static inline
#define IL5I __attribute__((target(IL5_TARGET), always_inline)) static inline
#define IL_UNROLL _Pragma("GCC unroll 8")
#define IL_MAX_NT 4 /* tokens per pass of the GEMM */

/* A full group of 8 rows starting at g0 for NT tokens, into ys[t][g0..]. */
typedef void (*il_group_fn)(const struct cw_wview *w, const struct cw_act *a,
			    int nt, float *const *ys, int64_t g0);

/* 0.5 * E8M0 of 8 scale bytes (cw_kern_il.c's exact float). */
IL2I __m256 il_half_scales(const uint8_t *s)
{
	const __m256i e = _mm256_cvtepu8_epi32(
		_mm_loadl_epi64((const __m128i *)(const void *)s));
	const __m256i norm = _mm256_slli_epi32(
		_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
	const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
	__m256i v = _mm256_blendv_epi8(
		norm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e));

	v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7fc00000),
			       _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255)));
	return _mm256_castsi256_ps(v);
}

/* y[g0 + i] for the 8 rows from the 32 lane accumulators (row i at
 * 4i..4i+3): cw_kern_il_c's (acc0 + acc1) + (acc2 + acc3). */
static inline void il_store8(const float *acc, float *y)
{
	for (int i = 0; i < 8; i++)
		y[i] = (acc[4 * i] + acc[4 * i + 1]) +
		       (acc[4 * i + 2] + acc[4 * i + 3]);
}

/* Runs `group` over the full 8-row groups inside [r0, r1) and
 * cw_kern_il_c over the rest, tokens IL_MAX_NT at a time. */
static void il_run(il_group_fn group, const struct cw_wview *w,
		   const struct cw_act *a, int n, float *const *ys,
		   int64_t r0, int64_t r1)
{
	for (int64_t g = r0 / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS; g < r1;
	     g += ST_MXFP4IL_ROWS) {
		const int64_t gr = st_mxfp4il_group_rows(w->rows, g);

		if (gr == ST_MXFP4IL_ROWS && g >= r0 && g + gr <= r1) {
			for (int t = 0; t < n; t += IL_MAX_NT)
				group(w, a + t, ST_MIN(IL_MAX_NT, n - t),
				      ys + t, g);
			continue;
		}
		for (int t = 0; t < n; t++)
			cw_kern_il_c(w, &a[t], ys[t], ST_MAX(g, r0),
				     ST_MIN(g + gr, r1));
	}
}

/* --- AVX2 ---------------------------------------------------------------- */

/* The int32 word sums of one register of 2 rows' codes c with activations
 * ql (even elements) / qh (odd), corr = 12 * the lanes' q sums. */
IL2I __m256i il_dot2(__m256i c, __m256i lut, __m256i ql, __m256i qh,
		     __m256i corr)
{
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
	const __m256i wl = _mm256_shuffle_epi8(lut, _mm256_and_si256(c, m4));
	const __m256i wh = _mm256_shuffle_epi8(
		lut, _mm256_and_si256(_mm256_srli_epi16(c, 4), m4));
	const __m256i s = _mm256_add_epi32(
		_mm256_madd_epi16(_mm256_maddubs_epi16(wl, ql), one),
		_mm256_madd_epi16(_mm256_maddubs_epi16(wh, qh), one));

	return _mm256_sub_epi32(s, corr);
}

IL2I void il_group2_t(const struct cw_wview *w, const struct cw_act *a,
		      const int NT, float *const *ys, int64_t g0)
{
	const int64_t C = w->cols, nb = C / 32;
	const uint8_t *gc = (const uint8_t *)w->data + g0 * (C / 2);
	const uint8_t *gs = w->scales + g0 * nb;
	const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(
		12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
	const __m256i twelve = _mm256_set1_epi8(12),
		      one = _mm256_set1_epi16(1);
	__m256 acc[IL_MAX_NT][4];

	IL_UNROLL
	for (int t = 0; t < NT; t++)
		IL_UNROLL
		for (int p = 0; p < 4; p++)
			acc[t][p] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *bc = gc + 128 * b;
		const __m256 h = il_half_scales(gs + 8 * b);
		__m256i c[4];

		IL_UNROLL
		for (int p = 0; p < 4; p++)
			c[p] = _mm256_loadu_si256(
				(const __m256i *)(const void *)(bc + 32 * p));
		IL_UNROLL
		for (int t = 0; t < NT; t++) {
			const int8_t *q = a[t].q + 32 * b;
			const __m256i ql = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *)(const void *)q));
			const __m256i qh = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *)(const void *)(q + 16)));
			const __m256i corr = _mm256_add_epi32(
				_mm256_madd_epi16(_mm256_maddubs_epi16(twelve, ql), one),
				_mm256_madd_epi16(_mm256_maddubs_epi16(twelve, qh), one));
			const __m256 f = _mm256_mul_ps(h, _mm256_set1_ps(a[t].d[b]));

			IL_UNROLL
			for (int p = 0; p < 4; p++) {
				const __m256i idx = _mm256_setr_epi32(
					2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1,
					2 * p + 1, 2 * p + 1, 2 * p + 1);

				acc[t][p] = _mm256_fmadd_ps(
					_mm256_cvtepi32_ps(il_dot2(c[p], lut, ql,
								   qh, corr)),
					_mm256_permutevar8x32_ps(f, idx),
					acc[t][p]);
			}
		}
	}
	IL_UNROLL
	for (int t = 0; t < NT; t++) {
		float v[32];

		IL_UNROLL
		for (int p = 0; p < 4; p++)
			_mm256_storeu_ps(v + 8 * p, acc[t][p]);
		il_store8(v, ys[t] + g0);
	}
}

__attribute__((target(IL2_TARGET))) static void
il_group2(const struct cw_wview *w, const struct cw_act *a, int nt,
	  float *const *ys, int64_t g0)
{
	switch (nt) {
	case 1: il_group2_t(w, a, 1, ys, g0); break;
	case 2: il_group2_t(w, a, 2, ys, g0); break;
	case 3: il_group2_t(w, a, 3, ys, g0); break;
	default: il_group2_t(w, a, 4, ys, g0); break;
	}
}

void cw_kern_il_avx2(const struct cw_wview *w, const struct cw_act *a,
		     float *y, int64_t r0, int64_t r1)
{
	float *const ys[1] = { y };

	il_run(il_group2, w, a, 1, ys, r0, r1);
}

int cw_kern_il_mm_avx2(const struct cw_wview *w, const struct cw_act *a,
		       int n, float *const *ys, int64_t r0, int64_t r1)
{
	for (int t = 0; t < n; t++)
		if (!a[t].q || a[t].qgroup != 32)
			return 0;
	il_run(il_group2, w, a, n, ys, r0, r1);
	return 1;
}

/* --- AVX-512 VNNI -------------------------------------------------------- */

IL5I __m512i il_dot5(__m512i wl, __m512i wh, __m512i ql, __m512i qh,
		     __m512i corr)
{
	return _mm512_sub_epi32(
		_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(),
							wl, ql), wh, qh),
		corr);
}

IL5I void il_group5_t(const struct cw_wview *w, const struct cw_act *a,
		      const int NT, float *const *ys, int64_t g0)
{
	const int64_t C = w->cols, nb = C / 32;
	const uint8_t *gc = (const uint8_t *)w->data + g0 * (C / 2);
	const uint8_t *gs = w->scales + g0 * nb;
	const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(
		12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
	const __m512i m4 = _mm512_set1_epi8(0x0f),
		      twelve = _mm512_set1_epi8(12);
	const __m512i idx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2,
					       2, 2, 3, 3, 3, 3);
	const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(4));
	__m512 acc[IL_MAX_NT][2];

	IL_UNROLL
	for (int t = 0; t < NT; t++)
		acc[t][0] = acc[t][1] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *bc = gc + 128 * b;
		const __m512i c0 = _mm512_loadu_si512((const void *)bc);
		const __m512i c1 = _mm512_loadu_si512((const void *)(bc + 64));
		const __m512i wl0 = _mm512_shuffle_epi8(lut, _mm512_and_si512(c0, m4));
		const __m512i wh0 = _mm512_shuffle_epi8(
			lut, _mm512_and_si512(_mm512_srli_epi16(c0, 4), m4));
		const __m512i wl1 = _mm512_shuffle_epi8(lut, _mm512_and_si512(c1, m4));
		const __m512i wh1 = _mm512_shuffle_epi8(
			lut, _mm512_and_si512(_mm512_srli_epi16(c1, 4), m4));
		const __m512 h = _mm512_castps256_ps512(il_half_scales(gs + 8 * b));

		IL_UNROLL
		for (int t = 0; t < NT; t++) {
			const int8_t *q = a[t].q + 32 * b;
			const __m512i ql = _mm512_broadcast_i32x4(
				_mm_loadu_si128((const __m128i *)(const void *)q));
			const __m512i qh = _mm512_broadcast_i32x4(
				_mm_loadu_si128((const __m128i *)(const void *)(q + 16)));
			const __m512i corr = _mm512_dpbusd_epi32(
				_mm512_dpbusd_epi32(_mm512_setzero_si512(),
						    twelve, ql), twelve, qh);
			const __m512 f = _mm512_mul_ps(h, _mm512_set1_ps(a[t].d[b]));

			acc[t][0] = _mm512_fmadd_ps(
				_mm512_cvtepi32_ps(il_dot5(wl0, wh0, ql, qh, corr)),
				_mm512_permutexvar_ps(idx0, f), acc[t][0]);
			acc[t][1] = _mm512_fmadd_ps(
				_mm512_cvtepi32_ps(il_dot5(wl1, wh1, ql, qh, corr)),
				_mm512_permutexvar_ps(idx1, f), acc[t][1]);
		}
	}
	IL_UNROLL
	for (int t = 0; t < NT; t++) {
		float v[32];

		_mm512_storeu_ps(v, acc[t][0]);
		_mm512_storeu_ps(v + 16, acc[t][1]);
		il_store8(v, ys[t] + g0);
	}
}

__attribute__((target(IL5_TARGET))) static void
il_group5(const struct cw_wview *w, const struct cw_act *a, int nt,
	  float *const *ys, int64_t g0)
{
	switch (nt) {
	case 1: il_group5_t(w, a, 1, ys, g0); break;
	case 2: il_group5_t(w, a, 2, ys, g0); break;
	case 3: il_group5_t(w, a, 3, ys, g0); break;
	default: il_group5_t(w, a, 4, ys, g0); break;
	}
}

void cw_kern_il_avx512(const struct cw_wview *w, const struct cw_act *a,
		       float *y, int64_t r0, int64_t r1)
{
	float *const ys[1] = { y };

	il_run(il_group5, w, a, 1, ys, r0, r1);
}

int cw_kern_il_mm_avx512(const struct cw_wview *w, const struct cw_act *a,
			 int n, float *const *ys, int64_t r0, int64_t r1)
{
	for (int t = 0; t < n; t++)
		if (!a[t].q || a[t].qgroup != 32)
			return 0;
	il_run(il_group5, w, a, n, ys, r0, r1);
	return 1;
}

#endif
