/*
 * cw_kern_bf16.c — the FP8 E4M3 dense kernels of path CW_KERN_AVX512BF16
 * (CPUs with AVX-512 VBMI and BF16): weights widened exactly through a
 * table of their BF16 bit patterns, float32 fused multiply-adds against
 * the float32 activations, 64 weights per step, 4 rows per pass.  Every
 * other view, and FP8 views this file does not take, go to the AVX-512
 * path.
 *
 * Weights: every E4M3 value is a BF16 value (3 mantissa bits, exponents
 * 2^-9 .. 2^8), so a 128-entry table of the BF16 bit patterns of the
 * magnitudes (subnormals included) widens them exactly: two vpermi2b
 * look up the low and the high byte of 64 codes at once (the instruction
 * reads the low 7 bits of each index: the sign bit is ignored and ORed back
 * into the high byte), two byte unpacks make 2 x 32 BF16 words, and as
 * the upper half of a float32 each word is the weight as a float: per
 * 32-bit lane one shift left by 16 (the even word) and one mask (the odd
 * word) give four vectors of 16 exact float weights.  The unpacks
 * interleave per 128-bit lane, so vector v (0..3) lane j = 4 l + q holds
 * column 16 l + 2 q + (v & 1) + 8 (v >> 1) of the step; the activations
 * are stored in that order (cw_kern_fp8_act_prepare).
 *
 * Exactness: the weights are exact and each product is exact inside the
 * fused multiply-add, so per row only the float rounding of the sums
 * differs from the C kernel (which rounds each product, then adds in
 * column order): tests/computed/test_kern.c checks 1e-5 sum |w x|, the
 * other SIMD paths' bound, every E4M3 code times a 21-bit activation
 * exactly, and every column against its weight and group scale exactly.
 *
 * Why not vdpbf16ps (this file's first version: activations split exactly
 * into three BF16, six vdpbf16ps per 64 weights): on the 2-vCPU Intel
 * AVX-512 BF16 machine of issue 19 that kernel ran 11-13 GB/s in cache
 * whatever its dependency chains (one chain of six per row step or three
 * independent ones per row: the same), i.e. vdpbf16ps throughput bound,
 * below the AVX-512 fp16-widening FMA kernel (17-20); the same table
 * decode with four FMAs runs 21-27 (docs/BENCHMARKS.md, issue 19).  On
 * Zen 5 the FMA form needs 4 floating-point-pipe operations per row step
 * instead of 7.
 *
 * Scales: per row the FMAs of a scale period accumulate from zero, then
 * one FMA adds them times the scale: a period is one scale group where
 * the group is a multiple of 64 columns (DeepSeek-V4's 128), else one
 * 64-column step whose two 32-column halves (lanes 0-7: columns 0-31,
 * lanes 8-15: 32-63) each take their group's scale, so any group that is
 * a multiple of 32 works (V4.1's 32 x 32 blocks).  The GEMM does the same
 * operations per (row, token), so it equals the matvec bit for bit.
 *
 * Memory: the four rows of a pass are four streams 1 row apart, which the
 * hardware prefetchers followed at about a third of the read bandwidth
 * there (5.3 of 16 GB/s out of cache); each step prefetches the same
 * columns of the next pass's rows into L2 (8.1-8.9 GB/s; into L1: 7.9-8.1;
 * past the last row too: a prefetch never faults).
 */
#include "cw_kern.h"

#include "st_util.h"

/* ---- the activation order (portable C: every path prepares it) ---- */

/* Column (within its 64-column step) of lane j of vector v. */
static int fp8_col(int v, int j)
{
	return 16 * (j / 4) + 2 * (j % 4) + (v & 1) + 8 * (v >> 1);
}

size_t cw_kern_fp8_act_bytes(int64_t n)
{
	return (size_t)((n + 63) / 64) * 64 * sizeof(float);
}

void cw_kern_fp8_act_prepare(const float *x, int64_t n, void *buf,
			     struct cw_act *ret)
{
	float *xp = buf;

	for (int64_t st = 0; st * 64 < n; st++)
		for (int v = 0; v < 4; v++)
			for (int j = 0; j < 16; j++) {
				const int64_t c = st * 64 + fp8_col(v, j);

				xp[st * 64 + 16 * v + j] = c < n ? x[c] : 0.0f;
			}
	ret->xp = xp;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define K6_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi"
#define K6 __attribute__((target(K6_TARGET)))
#define K6I __attribute__((target(K6_TARGET), always_inline)) static inline
#define MM_UNROLL _Pragma("GCC unroll 8")

/* Rows a pass reads ahead of itself (prefetched into L2, see above):
 * 2-4 and 8-32 rows measured alike, 4 the best by a little. */
#define CW_FP8_PF_ROWS 4

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

/* Rows [r, r + NR) for one token or one row for NT tokens (one of NR, NT
 * is 1): NR rows share each activation load, NT tokens each weight
 * decode; every (row, token) sees the same operations. */
K6I void fp8f_blk(const uint8_t *codes, const float *sc, int64_t C,
		  int64_t G, int64_t ng, const struct cw_act *a, int64_t r,
		  const int NR, const int NT, float *const *ys)
{
	const int64_t hpg = G / 32; /* 32-column halves per scale group */
	const int64_t period = G % 64 == 0 ? G : 64;
	const __m512i hmask = _mm512_set1_epi32((int)0xffff0000u);
	int64_t gh = 0, left = hpg; /* group of the period's first half */
	__m512 acc[4];

	MM_UNROLL
	for (int i = 0; i < NR * NT; i++)
		acc[i] = _mm512_setzero_ps();
	for (int64_t c = 0; c < C;) {
		const int64_t ce = ST_MIN(c + period, C);
		int64_t g0 = gh, g1 = gh; /* the groups of the two halves */
		__m512 gs[4];

		if (G % 64 == 0) {
			gh++;
		} else { /* one step: advance two halves, no division */
			g1 = left > 1 ? gh : gh + 1;
			for (left -= 2; left <= 0; left += hpg)
				gh++;
		}
		MM_UNROLL
		for (int i = 0; i < NR * NT; i++)
			gs[i] = _mm512_setzero_ps();
		for (; c < ce; c += 64) {
			__m512 x0[4], x1[4], x2[4], x3[4];

			MM_UNROLL
			for (int k = 0; k < NT; k++) {
				const float *p = a[k].xp + c;

				x0[k] = _mm512_loadu_ps(p);
				x1[k] = _mm512_loadu_ps(p + 16);
				x2[k] = _mm512_loadu_ps(p + 32);
				x3[k] = _mm512_loadu_ps(p + 48);
			}
			MM_UNROLL
			for (int i = 0; i < NR; i++) {
				const uint8_t *rc = codes + (r + i) * C + c;
				__m512i wa, wb;
				__m512 f0, f1, f2, f3;

				_mm_prefetch((const char *)rc + CW_FP8_PF_ROWS * C,
					     _MM_HINT_T1);
				e4m3_bf16x64(rc, &wa, &wb);
				f0 = _mm512_castsi512_ps(_mm512_slli_epi32(wa, 16));
				f1 = _mm512_castsi512_ps(_mm512_and_si512(wa, hmask));
				f2 = _mm512_castsi512_ps(_mm512_slli_epi32(wb, 16));
				f3 = _mm512_castsi512_ps(_mm512_and_si512(wb, hmask));
				MM_UNROLL
				for (int k = 0; k < NT; k++) {
					__m512 g = gs[i + k];

					g = _mm512_fmadd_ps(f0, x0[k], g);
					g = _mm512_fmadd_ps(f1, x1[k], g);
					g = _mm512_fmadd_ps(f2, x2[k], g);
					gs[i + k] = _mm512_fmadd_ps(f3, x3[k], g);
				}
			}
		}
		MM_UNROLL
		for (int i = 0; i < NR; i++) {
			__m512 s = _mm512_set1_ps(1.0f);

			if (sc) {
				const float *rs = sc + (r + i) * ng;

				s = _mm512_mask_blend_ps(
					0xff00, _mm512_set1_ps(rs[g0]),
					_mm512_set1_ps(rs[g1]));
			}
			MM_UNROLL
			for (int k = 0; k < NT; k++)
				acc[i + k] = _mm512_fmadd_ps(gs[i + k], s,
							     acc[i + k]);
		}
	}
	MM_UNROLL
	for (int i = 0; i < NR; i++)
		MM_UNROLL
		for (int k = 0; k < NT; k++)
			ys[k][r + i] = _mm512_reduce_add_ps(acc[i + k]);
}

/* 1 if the kernels take w: columns a multiple of 64, scale groups a
 * multiple of 32 (or no scales). */
static int takes(const struct cw_wview *w)
{
	return w->dtype == ST_DTYPE_F8_E4M3 && w->cols % 64 == 0 &&
	       (!w->scales || !w->group || w->group % 32 == 0);
}

K6 static void fp8_vbmi(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const float *sc = w->scales ? (const float *)(const void *)w->scales :
				      NULL;
	float *const ys[1] = { y };
	int64_t r = r0;

	if (!a->xp) { /* prepared for another dtype */
		cw_kern_avx512(w)(w, a, y, r0, r1);
		return;
	}
	for (; r + 4 <= r1; r += 4)
		fp8f_blk(w->data, sc, C, G, ng, a, r, 4, 1, ys);
	for (; r < r1; r++)
		fp8f_blk(w->data, sc, C, G, ng, a, r, 1, 1, ys);
}

K6 static int fp8_mm_vbmi(const struct cw_wview *w, const struct cw_act *a,
			  int n, float *const *ys, int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, G = w->scales && w->group ? w->group : C;
	const int64_t ng = (C + G - 1) / G;
	const float *sc = w->scales ? (const float *)(const void *)w->scales :
				      NULL;

	for (int t = 0; t < n; t++)
		if (!a[t].xp)
			return 0;
	for (int64_t r = r0; r < r1; r++)
		for (int t = 0; t < n; t += 4) {
			float *const *yt = ys + t;

			switch (ST_MIN(4, n - t)) {
			case 4: fp8f_blk(w->data, sc, C, G, ng, a + t, r, 1, 4, yt); break;
			case 3: fp8f_blk(w->data, sc, C, G, ng, a + t, r, 1, 3, yt); break;
			case 2: fp8f_blk(w->data, sc, C, G, ng, a + t, r, 1, 2, yt); break;
			default: fp8f_blk(w->data, sc, C, G, ng, a + t, r, 1, 1, yt); break;
			}
		}
	return 1;
}

cw_kern_fn cw_kern_avx512bf16(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512BF16))
		return NULL;
	return takes(w) ? fp8_vbmi : cw_kern_avx512(w);
}

cw_kern_mm_fn cw_kern_avx512bf16_mm(const struct cw_wview *w)
{
	if (!cw_kern_path_supported(CW_KERN_AVX512BF16))
		return NULL;
	return takes(w) ? fp8_mm_vbmi : cw_kern_avx512_mm(w);
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
