/*
 * cw_kern_bf16.c — the FP8 E4M3 dense kernels on AVX-512 BF16 (path
 * CW_KERN_AVX512BF16): weights exact, activations split exactly into three
 * BF16, dot products with vdpbf16ps, 64 weights per step.  Every other
 * view, and FP8 views this file does not take, go to the AVX-512 path.
 *
 * Weights: every E4M3 value is a BF16 value (3 mantissa bits, exponents
 * 2^-9 .. 2^8), so a 128-entry table of the BF16 bit patterns of the
 * magnitudes (subnormals included) widens them exactly: two vpermi2b
 * look up the low and the high byte of 64 codes at once (the instruction
 * reads the low 7 bits of each index: the sign bit is ignored and ORed back
 * into the high byte), two byte unpacks make 2 x 32 BF16 words.  The
 * unpacks interleave per 128-bit lane, so word vector A holds columns
 * 16 l + 0..7 of lane l, B columns 16 l + 8..15; the activations are
 * stored in that order (cw_kern_fp8_act_prepare).
 *
 * Activations: x is scaled by 2^k (exact; k puts max |x| in [0.5, 1), so
 * neither huge nor tiny vectors meet vdpbf16ps's flush of subnormals
 * to zero or an overflow the float dot product would not have) and split
 * x 2^k = hi + mid + lo, three BF16 rounded to nearest even, each from the
 * exact float residual of the ones before: 3 x 8 significand bits hold
 * all 24 of a float, so the split is exact (a two-BF16 split, 2^-18 per
 * element, flipped the discrete choices of the V4.1 fixture: top-1 505 of
 * 527 against the int8-activation model in dsv41-fast-tiny).  Each product
 * of two BF16 is exact in float, so per row only the float summation order
 * differs from the C kernel (and terms below 2^-100 max|x| |w| flush):
 * tests/computed/test_kern.c checks 1e-5 sum |w x|, the other SIMD paths'
 * bound.
 *
 * Scales: per 64 columns the six vdpbf16ps (lo, mid, hi; A and B each)
 * start from zero, then one FMA adds them times the scale of each 32-column
 * half (lanes 0-7: columns 0-31 of the step, lanes 8-15: 32-63), so any
 * scale group that is a multiple of 32 works (DeepSeek-V4's 128, V4.1's
 * 32 x 32 blocks).  y = lane sum * 2^-k.  The GEMM does the same
 * operations per (row, token), so it equals the matvec bit for bit.
 */
#include "cw_kern.h"

#include <math.h>
#include <string.h>

#include "st_util.h"

/* ---- the activation split (portable C: every path prepares it) ---- */

/* float to BF16 bits, round to nearest even (NaN kept quiet). */
static uint16_t bf16_rne(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float bf16_f(uint16_t h)
{
	const uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Word i of the A (B: + 8) half of a 64-column step: column 16 (i / 8) +
 * i % 8 (the lane order of the byte unpacks). */
static int64_t bf_col(int i, int half)
{
	return 16 * (i / 8) + (i % 8) + 8 * half;
}

size_t cw_kern_fp8_act_bytes(int64_t n)
{
	return (size_t)((n + 63) / 64) * 64 * 3 * sizeof(uint16_t);
}

void cw_kern_fp8_act_prepare(const float *x, int64_t n, void *buf,
			     struct cw_act *ret)
{
	const int64_t ns = (n + 63) / 64;
	uint16_t *bf = buf;
	float amax = 0.0f, s;
	int e = 0, k = 0;

	for (int64_t c = 0; c < n; c++)
		if (fabsf(x[c]) > amax && isfinite(x[c]))
			amax = fabsf(x[c]);
	if (amax > 0.0f) {
		(void)frexpf(amax, &e); /* amax = m 2^e, m in [0.5, 1) */
		k = ST_MAX(-125, ST_MIN(125, -e));
	}
	s = ldexpf(1.0f, k);
	for (int64_t st = 0; st < ns; st++) {
		uint16_t *p = bf + st * 192;

		for (int half = 0; half < 2; half++)
			for (int i = 0; i < 32; i++) {
				const int64_t c = st * 64 + bf_col(i, half);
				const float v = c < n ? x[c] * s : 0.0f;
				const uint16_t hi = bf16_rne(v);
				/* the residuals are exact in float */
				const float r1 = isfinite(v) ? v - bf16_f(hi) : 0.0f;
				const uint16_t mid = bf16_rne(r1);

				p[32 * half + i] = hi;
				p[64 + 32 * half + i] = mid;
				p[128 + 32 * half + i] = bf16_rne(r1 - bf16_f(mid));
			}
	}
	ret->bf = bf;
	ret->bf_unscale = ldexpf(1.0f, -k);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define K6_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512bf16"
#define K6 __attribute__((target(K6_TARGET)))
#define K6I __attribute__((target(K6_TARGET), always_inline)) static inline
#define MM_UNROLL _Pragma("GCC unroll 8")

/* The BF16 bit patterns of the E4M3 magnitudes 0..127, low bytes then high
 * bytes (e.g. code 1 = 2^-9: 0x3b00; 0x7e = 448: 0x43e0).  Code 0x7f, NaN
 * in E4M3 and never written by the store, reads as 480 (0x43f0) as on the
 * other SIMD paths. */
static const uint8_t k_lo[128] __attribute__((aligned(64))) = {
	0x00, 0x00, 0x80, 0xc0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xa0, 0xb0,
	0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70,
	0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30,
	0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0,
	0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70,
	0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30,
	0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
	0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xa0, 0xb0,
	0xc0, 0xd0, 0xe0, 0xf0, 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70,
	0x80, 0x90, 0xa0, 0xb0, 0xc0, 0xd0, 0xe0, 0xf0,
};
static const uint8_t k_hi[128] __attribute__((aligned(64))) = {
	0x00, 0x3b, 0x3b, 0x3b, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c, 0x3c,
	0x3c, 0x3c, 0x3c, 0x3c, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d,
	0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3d, 0x3e, 0x3e, 0x3e, 0x3e,
	0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e, 0x3e,
	0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f,
	0x3f, 0x3f, 0x3f, 0x3f, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
	0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41,
	0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
	0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
	0x42, 0x42, 0x42, 0x42, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43,
	0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43,
};

/* 64 E4M3 codes to BF16: *wa the A words (columns 16 l + 0..7 of each
 * 128-bit lane l), *wb the B words (16 l + 8..15). */
K6I void e4m3_bf16x64(const uint8_t *p, __m512i *wa, __m512i *wb)
{
	const __m512i b = _mm512_loadu_si512((const void *)p);
	const __m512i t0l = _mm512_load_si512((const void *)k_lo);
	const __m512i t1l = _mm512_load_si512((const void *)(k_lo + 64));
	const __m512i t0h = _mm512_load_si512((const void *)k_hi);
	const __m512i t1h = _mm512_load_si512((const void *)(k_hi + 64));
	const __m512i lo = _mm512_permutex2var_epi8(t0l, b, t1l);
	__m512i hi = _mm512_permutex2var_epi8(t0h, b, t1h);

	/* hi | (b & 0x80) */
	hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8((char)0x80),
				       0xf8);
	*wa = _mm512_unpacklo_epi8(lo, hi);
	*wb = _mm512_unpackhi_epi8(lo, hi);
}

K6I __m512 dp(__m512 acc, __m512i w, __m512i x)
{
	return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

/* Rows [r, r + NR) for one token or one row for NT tokens (one of NR, NT
 * is 1): NR rows share each activation load, NT tokens each weight
 * decode; every (row, token) sees the same operations. */
K6I void fp8b_blk(const uint8_t *codes, const float *sc, int64_t C,
		  int64_t G, int64_t ng, const struct cw_act *a, int64_t r,
		  const int NR, const int NT, float *const *ys)
{
	const int64_t hpg = G / 32; /* 32-column halves per scale group */
	int64_t gh = 0, left = hpg; /* group of the step's first half */
	__m512 acc[4];

	MM_UNROLL
	for (int i = 0; i < NR * NT; i++)
		acc[i] = _mm512_setzero_ps();
	for (int64_t c = 0; c < C; c += 64) {
		/* the groups of the two halves, without a division */
		const int64_t g0 = gh, g1 = left > 1 ? gh : gh + 1;
		__m512i xh0[4], xh1[4], xm0[4], xm1[4], xl0[4], xl1[4];

		for (left -= 2; left <= 0; left += hpg)
			gh++;

		MM_UNROLL
		for (int k = 0; k < NT; k++) {
			const uint16_t *p = a[k].bf + 3 * c;

			xh0[k] = _mm512_loadu_si512((const void *)p);
			xh1[k] = _mm512_loadu_si512((const void *)(p + 32));
			xm0[k] = _mm512_loadu_si512((const void *)(p + 64));
			xm1[k] = _mm512_loadu_si512((const void *)(p + 96));
			xl0[k] = _mm512_loadu_si512((const void *)(p + 128));
			xl1[k] = _mm512_loadu_si512((const void *)(p + 160));
		}
		MM_UNROLL
		for (int i = 0; i < NR; i++) {
			__m512i wa, wb;
			__m512 s = _mm512_set1_ps(1.0f);

			e4m3_bf16x64(codes + (r + i) * C + c, &wa, &wb);
			if (sc) {
				const float *rs = sc + (r + i) * ng;

				s = _mm512_mask_blend_ps(
					0xff00, _mm512_set1_ps(rs[g0]),
					_mm512_set1_ps(rs[g1]));
			}
			MM_UNROLL
			for (int k = 0; k < NT; k++) {
				__m512 g = dp(_mm512_setzero_ps(), wa, xl0[k]);

				g = dp(g, wb, xl1[k]);
				g = dp(g, wa, xm0[k]);
				g = dp(g, wb, xm1[k]);
				g = dp(g, wa, xh0[k]);
				g = dp(g, wb, xh1[k]);
				acc[i + k] = _mm512_fmadd_ps(g, s, acc[i + k]);
			}
		}
	}
	MM_UNROLL
	for (int i = 0; i < NR; i++)
		MM_UNROLL
		for (int k = 0; k < NT; k++)
			ys[k][r + i] = _mm512_reduce_add_ps(acc[i + k]) *
				       a[k].bf_unscale;
}

/* 1 if the kernels take w: columns a multiple of 64, scale groups a
 * multiple of 32 (or no scales). */
static int takes(const struct cw_wview *w)
{
	return w->dtype == ST_DTYPE_F8_E4M3 && w->cols % 64 == 0 &&
	       (!w->scales || !w->group || w->group % 32 == 0);
}

K6 static void fp8_bf16(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const float *sc = w->scales ? (const float *)(const void *)w->scales :
				      NULL;
	float *const ys[1] = { y };
	int64_t r = r0;

	if (!a->bf) { /* prepared for another dtype */
		cw_kern_avx512(w)(w, a, y, r0, r1);
		return;
	}
	for (; r + 4 <= r1; r += 4)
		fp8b_blk(w->data, sc, C, G, ng, a, r, 4, 1, ys);
	for (; r < r1; r++)
		fp8b_blk(w->data, sc, C, G, ng, a, r, 1, 1, ys);
}

K6 static int fp8_mm_bf16(const struct cw_wview *w, const struct cw_act *a,
			  int n, float *const *ys, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const float *sc = w->scales ? (const float *)(const void *)w->scales :
				      NULL;

	for (int t = 0; t < n; t++)
		if (!a[t].bf)
			return 0;
	for (int64_t r = r0; r < r1; r++)
		for (int t = 0; t < n; t += 4) {
			float *const *yt = ys + t;

			switch (ST_MIN(4, n - t)) {
			case 4: fp8b_blk(w->data, sc, C, G, ng, a + t, r, 1, 4, yt); break;
			case 3: fp8b_blk(w->data, sc, C, G, ng, a + t, r, 1, 3, yt); break;
			case 2: fp8b_blk(w->data, sc, C, G, ng, a + t, r, 1, 2, yt); break;
			default: fp8b_blk(w->data, sc, C, G, ng, a + t, r, 1, 1, yt); break;
			}
		}
	return 1;
}

cw_kern_fn cw_kern_avx512bf16(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512BF16))
		return NULL;
	return takes(w) ? fp8_bf16 : cw_kern_avx512(w);
}

cw_kern_mm_fn cw_kern_avx512bf16_mm(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512BF16))
		return NULL;
	return takes(w) ? fp8_mm_bf16 : cw_kern_avx512_mm(w);
}

#else /* not x86-64 GCC/Clang */

cw_kern_fn cw_kern_avx512bf16(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

cw_kern_mm_fn cw_kern_avx512bf16_mm(const struct cw_wview *w)
{
	(void)w;
	return NULL;
}

#endif
