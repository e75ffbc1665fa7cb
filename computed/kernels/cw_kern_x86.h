/*
 * cw_kern_x86.h — the AVX2 + FMA + F16C building blocks shared by the
 * x86-64 fast kernels (cw_kern_avx2.c, cw_kern_avx512.c): lane sums, scale
 * decoders, the E2M1 and E4M3 weight decoders and the int8 block dot
 * product.  Internal to computed; include only under
 * defined(__x86_64__) && defined(__GNUC__).  Each helper is always
 * inlined into its caller, whose target attribute must include
 * avx2,fma,f16c (GCC inlines a callee whose target is a subset of the
 * caller's).
 */
#ifndef CW_KERN_X86_H
#define CW_KERN_X86_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cw_kern.h"

#define KI __attribute__((target("avx2,fma,f16c"), always_inline)) static inline
#define MM_UNROLL _Pragma("GCC unroll 8") /* constant trip counts: registers */

/* How far ahead of the block being decoded the MXFP4 row kernels prefetch
 * codes (bytes; the scales 1/16 of that): measured with strata-bench-kern
 * --cols 5120 on a 2-core AVX-512 VM, 2048 lifted MXFP4 from 6.7-6.9 to
 * 8.3-8.7 GB/s on the AVX-512 path (single thread, matrices 128 MiB,
 * docs/BENCHMARKS.md); the hardware prefetcher alone falls behind on the
 * one codes stream per row.  FP8's four row streams gained nothing. */
#define CW_KERN_MX_PREFETCH 2048

/* Prefetches the codes and scales CW_KERN_MX_PREFETCH bytes ahead of
 * block b of a row (rc: the row's codes, rs: its E8M0 scales); may point
 * past the matrix (a prefetch never faults). */
KI void mx_prefetch(const uint8_t *rc, const uint8_t *rs, int64_t b)
{
	_mm_prefetch((const char *)rc + 16 * b + CW_KERN_MX_PREFETCH,
		     _MM_HINT_T0);
	_mm_prefetch((const char *)rc + 16 * b + CW_KERN_MX_PREFETCH + 64,
		     _MM_HINT_T0);
	_mm_prefetch((const char *)rs + b + CW_KERN_MX_PREFETCH / 16,
		     _MM_HINT_T0);
}

KI float hsum256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
			      _mm256_extractf128_ps(v, 1));

	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

KI float e8m0f(uint8_t b)
{
	uint32_t u = b == 0 ? 0x00400000u : b == 255 ? 0x7fc00000u :
		     (uint32_t)b << 23;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* E4M3 through binary16: the byte's exponent and mantissa fields moved into
 * a binary16's give e4m3 / 256 exactly (subnormals included).  Scalar (block
 * scales, tails): 0x7f/0xff are NaN.  The 8-wide weight decode (e4m3x8) reads
 * them as +-480: codes the store never writes (PITFALLS P9). */
KI float e4m3f(uint8_t b)
{
	const unsigned short h =
		(unsigned short)(((b & 0x80u) << 8) | ((b & 0x7fu) << 7));

	if ((b & 0x7f) == 0x7f)
		return NAN;
	return _cvtsh_ss(h) * 256.0f;
}

/* 32 weights of one block as int8 in cw_act order for runs of 32: the 16
 * code bytes in both lanes, the second lane shifted down a nibble, so lane 0
 * holds the even elements and lane 1 the odd ones. */
KI __m256i fp4_decode32(const uint8_t *p)
{
	const __m256i lut = _mm256_setr_epi8(
		0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
		0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
	__m256i c = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)(const void *)p));

	c = _mm256_srlv_epi64(c, _mm256_setr_epi64x(0, 0, 4, 4));
	return _mm256_shuffle_epi8(lut, _mm256_and_si256(c, _mm256_set1_epi8(15)));
}

/* 8 E4M3 bytes to floats / 256 (see e4m3f). */
KI __m256 e4m3x8(const uint8_t *p)
{
	const __m128i v = _mm_cvtepu8_epi16(
		_mm_loadl_epi64((const __m128i *)(const void *)p));
	const __m128i h = _mm_or_si128(
		_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7),
		_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8));

	return _mm256_cvtph_ps(h);
}

/* 0.5 * e8m0(s) of 8 consecutive MXFP4 blocks (byte 0: 2^-127, 255: NaN,
 * the same values as e8m0f). */
KI __m256 mx_wscale8(const uint8_t *s)
{
	const __m256i sb = _mm256_cvtepu8_epi32(
		_mm_loadl_epi64((const __m128i *)(const void *)s));
	__m256i bits = _mm256_slli_epi32(sb, 23);

	bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x00400000),
				  _mm256_cmpeq_epi32(sb, _mm256_setzero_si256()));
	bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000),
				  _mm256_cmpeq_epi32(sb, _mm256_set1_epi32(255)));
	return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(0.5f));
}

/* One MXFP4 block of decoded weights wv: |q| (precomputed with the
 * activations) times sign(w, q), so a block costs one sign instead of
 * abs + sign; eight int32 partial sums as floats. */
KI __m256 mx_dot(__m256i wv, const uint8_t *qa, const int8_t *q)
{
	const __m256i p16 = _mm256_maddubs_epi16(
		_mm256_loadu_si256((const __m256i *)(const void *)qa),
		_mm256_sign_epi8(wv, _mm256_loadu_si256(
			(const __m256i *)(const void *)q)));

	return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* The end of an MXFP4 row for NT tokens (the row kernels of both paths):
 * blocks b..nb-1 (the last nb % 8) into acc0[t], then ys[t][r] = the lane
 * sum of acc0[t] + acc1[t]. */
KI void mx_row_tail(const uint8_t *rc, const uint8_t *rs, int64_t b,
		    int64_t nb, const struct cw_act *a, __m256 *acc0,
		    const __m256 *acc1, float *const *ys, int64_t r,
		    const int NT)
{
	for (; b < nb; b++) {
		const __m256i wv = fp4_decode32(rc + 16 * b);
		const float ws = 0.5f * e8m0f(rs[b]);

		MM_UNROLL
		for (int t = 0; t < NT; t++)
			acc0[t] = _mm256_fmadd_ps(
				mx_dot(wv, a[t].qabs + 32 * b, a[t].q + 32 * b),
				_mm256_set1_ps(ws * a[t].d[b]), acc0[t]);
	}
	MM_UNROLL
	for (int t = 0; t < NT; t++)
		ys[t][r] = hsum256(_mm256_add_ps(acc0[t], acc1[t]));
}

/* The body of an MXFP4 GEMM kernel (cw_kern_mm_fn; w, a, n, ys, r0, r1 in
 * scope) over the row kernel ROW(rc, rs, nb, a, ys, r, NT), NT a constant
 * 1..4: per row, token groups of 4, then the remainder.  Returns 0 (the
 * caller falls back to matvecs) unless every token's activations are in
 * runs of 32 with magnitudes and the columns are whole blocks. */
#define CW_MX_MM_BODY(ROW)                                                    \
	const int64_t C = w->cols, nb = C / 32;                               \
	const uint8_t *codes = w->data;                                       \
                                                                              \
	if (C % 32)                                                           \
		return 0;                                                     \
	for (int t = 0; t < n; t++)                                           \
		if (!a[t].qabs || a[t].qgroup != 32)                          \
			return 0;                                             \
	for (int64_t r = r0; r < r1; r++) {                                   \
		const uint8_t *rc = codes + r * (C / 2);                      \
		const uint8_t *rs = w->scales + r * nb;                       \
		int t = 0;                                                    \
                                                                              \
		for (; t + 4 <= n; t += 4)                                    \
			ROW(rc, rs, nb, a + t, ys + t, r, 4);                 \
		switch (n - t) {                                              \
		case 3: ROW(rc, rs, nb, a + t, ys + t, r, 3); break;          \
		case 2: ROW(rc, rs, nb, a + t, ys + t, r, 2); break;          \
		case 1: ROW(rc, rs, nb, a + t, ys + t, r, 1); break;          \
		default: break;                                               \
		}                                                             \
	}                                                                     \
	return 1

#endif
