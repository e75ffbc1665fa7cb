/*
 * cw_kern_il_x86.c — row-interleaved MXFP4 (st_mxfp4il.h) on x86-64: the
 * AVX2 kernel (maddubs + madd) and the AVX-512 VNNI kernel (vpdpbusd), each
 * a matvec and a small-batch GEMM, all giving cw_kern_il_c's results bit
 * for bit (cw_kern_il.c fixes the arithmetic).
 *
 * A group of 16 rows streams as one run of bytes: per block of 32 columns,
 * 256 code bytes and 16 E8M0 bytes.  The codes are stored word-interleaved
 * (word j of each of the 16 rows, then word j + 1), so one 512-bit load is
 * one word of 16 rows, a row per 32-bit lane, and the dot product against
 * the broadcast 4-byte word of activations leaves each row's sum in its
 * lane: 8 vpdpbusd per block give 16 rows' int32 sums, one convert and one
 * FMA accumulate them, and the final register is the 16 outputs (no
 * horizontal sum).  AVX2 does the same with two 256-bit halves of 8 rows.
 *  - Weights: the nibbles looked up (pshufb) as 2 e2m1 + 12 in 0..24, an
 *    unsigned byte, multiplied with the signed int8 activations;
 *    12 * (the block's sum of q, cw_act.qsum) is taken off (the same
 *    integer: exact).  Activations are quantized once per token and matrix
 *    (cw_kern_quantize_act, runs of 32).
 *  - Scales: f = d * 2^(e - 128) (AVX-512: vscalefps; AVX2: the bits of
 *    2^(e - 128), subnormals for e = 0, 1, then a multiply), NaN for
 *    e = 255: the float cw_kern_il_c computes as (0.5 * E8M0) * d.
 * Rows of a partial group (rows % 16) run through cw_kern_il_c; a full
 * group that a row range cuts is computed whole into a buffer and copied.
 */
#include "cw_kern.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <string.h>

#include "st_mxfp4il.h"
#include "st_util.h"

#define IL2_TARGET "avx2,fma,f16c"
#define ILV_TARGET "avx2,fma,f16c,avxvnni"
#define IL5_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c"
#define IL2I __attribute__((target(IL2_TARGET), always_inline)) static inline
#define IL5I __attribute__((target(IL5_TARGET), always_inline)) static inline
#define IL_UNROLL _Pragma("GCC unroll 8")
#define IL_MAX_NT 4 /* tokens per pass of the GEMM */
#define IL_R ST_MXFP4IL_ROWS

/* How far ahead of the block being decoded the codes are prefetched
 * (bytes; the scales 1/16 of that).  The group streams are contiguous
 * (group after group), so this runs across group boundaries. */
#define CW_KERN_IL_PREFETCH 2048

/* A full group of 16 rows starting at g0 for nt <= IL_MAX_NT tokens, row
 * g0 + i of token t into ys[t][i]. */
typedef void (*il_group_fn)(const struct cw_wview *w, const struct cw_act *a,
			    int nt, float *const *ys, int64_t g0);

IL2I void il_prefetch(const uint8_t *bc, const uint8_t *bs)
{
	_mm_prefetch((const char *)bc + CW_KERN_IL_PREFETCH, _MM_HINT_T0);
	_mm_prefetch((const char *)bc + CW_KERN_IL_PREFETCH + 64, _MM_HINT_T0);
	_mm_prefetch((const char *)bc + CW_KERN_IL_PREFETCH + 128, _MM_HINT_T0);
	_mm_prefetch((const char *)bc + CW_KERN_IL_PREFETCH + 192, _MM_HINT_T0);
	_mm_prefetch((const char *)bs + CW_KERN_IL_PREFETCH / 16, _MM_HINT_T0);
}

/* The 4-byte word j of the block's activations (q[4j..4j+3] for j < 4:
 * even elements; j >= 4: odd ones), in every 32-bit lane. */
static inline int32_t il_qword(const int8_t *q, int j)
{
	int32_t v;

	memcpy(&v, q + 4 * j, 4);
	return v;
}

/* Runs `group` over the full groups meeting [r0, r1) (a cut one into a
 * buffer) and cw_kern_il_c over a partial last group, tokens IL_MAX_NT at
 * a time. */
static void il_run(il_group_fn group, const struct cw_wview *w,
		   const struct cw_act *a, int n, float *const *ys,
		   int64_t r0, int64_t r1)
{
	for (int64_t g = r0 / IL_R * IL_R; g < r1; g += IL_R) {
		const int64_t gr = st_mxfp4il_group_rows(w->rows, g);
		const int64_t lo = ST_MAX(g, r0), hi = ST_MIN(g + gr, r1);

		if (gr < IL_R) {
			for (int t = 0; t < n; t++)
				cw_kern_il_c(w, &a[t], ys[t], lo, hi);
			continue;
		}
		for (int t = 0; t < n; t += IL_MAX_NT) {
			const int nt = ST_MIN(IL_MAX_NT, n - t);
			float buf[IL_MAX_NT][IL_R], *yt[IL_MAX_NT];

			if (lo == g && hi == g + IL_R) {
				for (int k = 0; k < nt; k++)
					yt[k] = ys[t + k] + g;
				group(w, a + t, nt, yt, g);
				continue;
			}
			for (int k = 0; k < nt; k++)
				yt[k] = buf[k];
			group(w, a + t, nt, yt, g);
			for (int k = 0; k < nt; k++)
				memcpy(ys[t + k] + lo, buf[k] + (lo - g),
				       sizeof(float) * (size_t)(hi - lo));
		}
	}
}

/* --- AVX2 and AVX-VNNI ------------------------------------------------------ */

/* acc + the 4-byte dot products of the unsigned weight bytes w with the
 * activation word qw in every lane (AVX-VNNI vpdpbusd, 256-bit).  Not
 * always_inline: il_group2_t's plain-AVX2 copy holds the call in a branch
 * that is dead there, the AVX-VNNI copy inlines it. */
__attribute__((target(ILV_TARGET))) static inline __m256i
il_dpbusd(__m256i acc, __m256i w, int32_t qw)
{
	return _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(qw));
}

/* 2^(e - 128) for 8 E8M0 bytes: 0.5 * E8M0 exactly (e = 0, 1: the
 * subnormals 2^-128, 2^-127; e = 255: NaN). */
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

/* VNNI: AVX-VNNI's 256-bit vpdpbusd for the int32 sums (the caller's
 * target must include avxvnni), else maddubs + madd; the same integers. */
IL2I void il_group2_t(const struct cw_wview *w, const struct cw_act *a,
		      const int NT, const int VNNI, float *const *ys,
		      int64_t g0)
{
	const int64_t C = w->cols, nb = C / 32;
	const uint8_t *gc = (const uint8_t *)w->data + g0 * (C / 2);
	const uint8_t *gs = w->scales + g0 * nb;
	const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(
		12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
	const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);
	__m256 acc[IL_MAX_NT][2];

	IL_UNROLL
	for (int t = 0; t < NT; t++)
		acc[t][0] = acc[t][1] = _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *bc = gc + 256 * b;

		il_prefetch(bc, gs + 16 * b);
		IL_UNROLL
		for (int h = 0; h < 2; h++) {
			const __m256 hs = il_half_scales(gs + 16 * b + 8 * h);
			__m256i wl[4], wh[4];

			IL_UNROLL
			for (int j = 0; j < 4; j++) {
				const __m256i c = _mm256_loadu_si256(
					(const __m256i *)(const void *)(bc + 64 * j + 32 * h));

				wl[j] = _mm256_shuffle_epi8(lut, _mm256_and_si256(c, m4));
				wh[j] = _mm256_shuffle_epi8(lut, _mm256_and_si256(
					_mm256_srli_epi16(c, 4), m4));
			}
			IL_UNROLL
			for (int t = 0; t < NT; t++) {
				const int8_t *q = a[t].q + 32 * b;
				__m256i s[4], is;

				if (VNNI) {
					__m256i s0 = _mm256_set1_epi32(-12 * a[t].qsum[b]);
					__m256i s1 = _mm256_setzero_si256();

					IL_UNROLL
					for (int j = 0; j < 4; j += 2) {
						s0 = il_dpbusd(s0, wl[j], il_qword(q, j));
						s0 = il_dpbusd(s0, wh[j], il_qword(q, 4 + j));
						s1 = il_dpbusd(s1, wl[j + 1], il_qword(q, j + 1));
						s1 = il_dpbusd(s1, wh[j + 1], il_qword(q, 5 + j));
					}
					is = _mm256_add_epi32(s0, s1);
				} else {
					/* int16: two words' pair sums,
					 * |.| <= 4 * 3048 */
					IL_UNROLL
					for (int j = 0; j < 4; j++)
						s[j] = _mm256_add_epi16(
							_mm256_maddubs_epi16(wl[j],
								_mm256_set1_epi32(il_qword(q, j))),
							_mm256_maddubs_epi16(wh[j],
								_mm256_set1_epi32(il_qword(q, 4 + j))));
					is = _mm256_add_epi32(
						_mm256_add_epi32(
							_mm256_madd_epi16(_mm256_add_epi16(s[0], s[1]), one),
							_mm256_madd_epi16(_mm256_add_epi16(s[2], s[3]), one)),
						_mm256_set1_epi32(-12 * a[t].qsum[b]));
				}

				acc[t][h] = _mm256_fmadd_ps(
					_mm256_cvtepi32_ps(is),
					_mm256_mul_ps(hs, _mm256_set1_ps(a[t].d[b])),
					acc[t][h]);
			}
		}
	}
	IL_UNROLL
	for (int t = 0; t < NT; t++) {
		_mm256_storeu_ps(ys[t], acc[t][0]);
		_mm256_storeu_ps(ys[t] + 8, acc[t][1]);
	}
}

__attribute__((target(IL2_TARGET))) static void
il_group2(const struct cw_wview *w, const struct cw_act *a, int nt,
	  float *const *ys, int64_t g0)
{
	switch (nt) {
	case 1: il_group2_t(w, a, 1, 0, ys, g0); break;
	case 2: il_group2_t(w, a, 2, 0, ys, g0); break;
	case 3: il_group2_t(w, a, 3, 0, ys, g0); break;
	default: il_group2_t(w, a, 4, 0, ys, g0); break;
	}
}

__attribute__((target(ILV_TARGET))) static void
il_group2v(const struct cw_wview *w, const struct cw_act *a, int nt,
	   float *const *ys, int64_t g0)
{
	switch (nt) {
	case 1: il_group2_t(w, a, 1, 1, ys, g0); break;
	case 2: il_group2_t(w, a, 2, 1, ys, g0); break;
	case 3: il_group2_t(w, a, 3, 1, ys, g0); break;
	default: il_group2_t(w, a, 4, 1, ys, g0); break;
	}
}

/* Activations the kernels take: quantized in runs of 32, with block sums. */
static int il_acts_ok(const struct cw_act *a, int n)
{
	for (int t = 0; t < n; t++)
		if (!a[t].q || !a[t].qsum || a[t].qgroup != 32)
			return 0;
	return 1;
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
	if (!il_acts_ok(a, n))
		return 0;
	il_run(il_group2, w, a, n, ys, r0, r1);
	return 1;
}

int cw_kern_il_has_avxvnni(void)
{
	return __builtin_cpu_supports("avx2") &&
	       __builtin_cpu_supports("fma") &&
	       __builtin_cpu_supports("f16c") &&
	       __builtin_cpu_supports("avxvnni");
}

void cw_kern_il_avxvnni(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1)
{
	float *const ys[1] = { y };

	il_run(il_group2v, w, a, 1, ys, r0, r1);
}

int cw_kern_il_mm_avxvnni(const struct cw_wview *w, const struct cw_act *a,
			  int n, float *const *ys, int64_t r0, int64_t r1)
{
	if (!il_acts_ok(a, n))
		return 0;
	il_run(il_group2v, w, a, n, ys, r0, r1);
	return 1;
}

/* --- AVX-512 VNNI -------------------------------------------------------- */

IL5I void il_group5_t(const struct cw_wview *w, const struct cw_act *a,
		      const int NT, float *const *ys, int64_t g0)
{
	const int64_t C = w->cols, nb = C / 32;
	const uint8_t *gc = (const uint8_t *)w->data + g0 * (C / 2);
	const uint8_t *gs = w->scales + g0 * nb;
	const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(
		12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
	const __m512i m4 = _mm512_set1_epi8(0x0f);
	const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
	__m512 acc[IL_MAX_NT];

	IL_UNROLL
	for (int t = 0; t < NT; t++)
		acc[t] = _mm512_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *bc = gc + 256 * b;
		const __m512i e = _mm512_cvtepu8_epi32(
			_mm_loadu_si128((const __m128i *)(const void *)(gs + 16 * b)));
		const __m512 ef = _mm512_cvtepi32_ps(
			_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
		const __mmask16 bad = _mm512_cmpeq_epi32_mask(
			e, _mm512_set1_epi32(255));
		__m512i wl[4], wh[4];

		il_prefetch(bc, gs + 16 * b);
		IL_UNROLL
		for (int j = 0; j < 4; j++) {
			const __m512i c = _mm512_loadu_si512(
				(const void *)(bc + 64 * j));

			wl[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(c, m4));
			wh[j] = _mm512_shuffle_epi8(
				lut, _mm512_and_si512(_mm512_srli_epi16(c, 4), m4));
		}
		IL_UNROLL
		for (int t = 0; t < NT; t++) {
			const int8_t *q = a[t].q + 32 * b;
			/* two dependency chains of 4 vpdpbusd */
			__m512i s0 = _mm512_set1_epi32(-12 * a[t].qsum[b]);
			__m512i s1 = _mm512_setzero_si512();
			__m512 f;

			IL_UNROLL
			for (int j = 0; j < 4; j += 2) {
				s0 = _mm512_dpbusd_epi32(s0, wl[j],
					_mm512_set1_epi32(il_qword(q, j)));
				s0 = _mm512_dpbusd_epi32(s0, wh[j],
					_mm512_set1_epi32(il_qword(q, 4 + j)));
				s1 = _mm512_dpbusd_epi32(s1, wl[j + 1],
					_mm512_set1_epi32(il_qword(q, j + 1)));
				s1 = _mm512_dpbusd_epi32(s1, wh[j + 1],
					_mm512_set1_epi32(il_qword(q, 5 + j)));
			}
			f = _mm512_mask_mov_ps(
				_mm512_scalef_ps(_mm512_set1_ps(a[t].d[b]), ef),
				bad, nan);
			acc[t] = _mm512_fmadd_ps(
				_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), f,
				acc[t]);
		}
	}
	IL_UNROLL
	for (int t = 0; t < NT; t++)
		_mm512_storeu_ps(ys[t], acc[t]);
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
	if (!il_acts_ok(a, n))
		return 0;
	il_run(il_group5, w, a, n, ys, r0, r1);
	return 1;
}

#endif
