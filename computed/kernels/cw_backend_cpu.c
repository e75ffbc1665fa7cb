/*
 * cw_backend_cpu.c — the portable C backend: the reference every other
 * kernel is tested against.  Plain loops, float32 accumulation in input
 * order (a fixed reduction order, DESIGN.md 6a).
 */
#include "cw_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_kern.h"
#include "st_mxfp4il.h"
#include "st_util.h"

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/*
 * Every dot product below accumulates in 8 lanes (lane j takes the elements
 * c with c % 8 == j, in increasing c), then adds the lanes in the fixed tree
 * order of hsum8 and the tail (cols % 8 elements) in order.  That is one
 * fixed reduction order per output element, whatever the batch, chunking or
 * thread split, and it lets the compiler use SIMD registers (GCC vector
 * extensions, lowered to the target's vectors or to scalars).
 */
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

/*
 * The helpers below that take or return a 32-byte vector must be inlined
 * into each target_clones clone (CW_KERNEL) in every build type: an
 * out-of-line copy is compiled for the baseline, which passes v8f in memory
 * (hidden pointer), while the avx2 clone calls it expecting %ymm0; at -O0
 * (--buildtype=debug, the sanitizer build) that gave wrong values and a
 * segfault (-Wpsabi does not warn about this call).
 */
#define CW_VEC_INLINE static inline __attribute__((always_inline))

CW_VEC_INLINE v8f load8(const float *p)
{
	v8f v;

	memcpy(&v, p, sizeof(v));
	return v;
}

CW_VEC_INLINE v8f load8_bf16(const uint16_t *p)
{
	v8u16 h;
	v8u32 u;
	v8f f;

	memcpy(&h, p, sizeof(h));
	u = __builtin_convertvector(h, v8u32) << 16;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * The kernels are compiled twice (GCC target_clones, dispatched once at load
 * time through an ifunc): for AVX2 and for the baseline.  The file is built
 * with -ffp-contract=off, so neither clone fuses a multiply and an add: both
 * compute exactly the same float32 operations in the same order, and the
 * results are bit-identical on every machine.  Real SIMD kernels with their
 * own dispatch come with the fast mode.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CW_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define CW_KERNEL
#endif

CW_VEC_INLINE float hsum8(v8f a)
{
	return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

CW_KERNEL static void matvec_f32(const struct cw_wview *w, const float *x, float *y,
		       int64_t r0, int64_t r1)
{
	const float *W = w->data;
	const int64_t C = w->cols, C8 = C & ~(int64_t)7;

	for (int64_t r = r0; r < r1; r++) {
		const float *row = W + r * C;
		v8f acc = { 0 };
		float s;

		for (int64_t c = 0; c < C8; c += 8)
			acc += load8(row + c) * load8(x + c);
		s = hsum8(acc);
		for (int64_t c = C8; c < C; c++)
			s += row[c] * x[c];
		y[r] = s;
	}
}

CW_KERNEL static void matvec_bf16(const struct cw_wview *w, const float *x, float *y,
			int64_t r0, int64_t r1)
{
	const uint16_t *W = w->data;
	const int64_t C = w->cols, C8 = C & ~(int64_t)7;

	for (int64_t r = r0; r < r1; r++) {
		const uint16_t *row = W + r * C;
		v8f acc = { 0 };
		float s;

		for (int64_t c = 0; c < C8; c += 8)
			acc += load8_bf16(row + c) * load8(x + c);
		s = hsum8(acc);
		for (int64_t c = C8; c < C; c++)
			s += bf16_to_f32(row[c]) * x[c];
		y[r] = s;
	}
}


static inline float e8m0_to_f32(uint8_t b)
{
	/* 2^(b-127); b == 0 is the subnormal 2^-127; 255 is NaN. */
	uint32_t u;
	float f;

	if (b == 255)
		return NAN;
	u = b ? (uint32_t)b << 23 : 0x00400000u;
	memcpy(&f, &u, 4);
	return f;
}

/*
 * MXFP4 (OCP layout).  Each 32-element block is dequantized exactly and
 * multiplied into the same 8 lanes as a dense matvec of the dequantized
 * weights would be.  Twice an E2M1 value is a small integer (-12..12), so
 * w = (2 * e2m1) * (scale / 2) is the same float as e2m1 * scale (scale is a
 * power of two): both versions below compute identical bits.
 */
/* Both E2M1 values of a byte (low nibble = even element, OCP layout):
 * k_e2m1_pair[b] = { e2m1(b & 15), e2m1(b >> 4) }. */
static const float k_e2m1_pair[256][2] = {
	{ 0.0f, 0.0f },
	{ 0.5f, 0.0f },
	{ 1.0f, 0.0f },
	{ 1.5f, 0.0f },
	{ 2.0f, 0.0f },
	{ 3.0f, 0.0f },
	{ 4.0f, 0.0f },
	{ 6.0f, 0.0f },
	{ -0.0f, 0.0f },
	{ -0.5f, 0.0f },
	{ -1.0f, 0.0f },
	{ -1.5f, 0.0f },
	{ -2.0f, 0.0f },
	{ -3.0f, 0.0f },
	{ -4.0f, 0.0f },
	{ -6.0f, 0.0f },
	{ 0.0f, 0.5f },
	{ 0.5f, 0.5f },
	{ 1.0f, 0.5f },
	{ 1.5f, 0.5f },
	{ 2.0f, 0.5f },
	{ 3.0f, 0.5f },
	{ 4.0f, 0.5f },
	{ 6.0f, 0.5f },
	{ -0.0f, 0.5f },
	{ -0.5f, 0.5f },
	{ -1.0f, 0.5f },
	{ -1.5f, 0.5f },
	{ -2.0f, 0.5f },
	{ -3.0f, 0.5f },
	{ -4.0f, 0.5f },
	{ -6.0f, 0.5f },
	{ 0.0f, 1.0f },
	{ 0.5f, 1.0f },
	{ 1.0f, 1.0f },
	{ 1.5f, 1.0f },
	{ 2.0f, 1.0f },
	{ 3.0f, 1.0f },
	{ 4.0f, 1.0f },
	{ 6.0f, 1.0f },
	{ -0.0f, 1.0f },
	{ -0.5f, 1.0f },
	{ -1.0f, 1.0f },
	{ -1.5f, 1.0f },
	{ -2.0f, 1.0f },
	{ -3.0f, 1.0f },
	{ -4.0f, 1.0f },
	{ -6.0f, 1.0f },
	{ 0.0f, 1.5f },
	{ 0.5f, 1.5f },
	{ 1.0f, 1.5f },
	{ 1.5f, 1.5f },
	{ 2.0f, 1.5f },
	{ 3.0f, 1.5f },
	{ 4.0f, 1.5f },
	{ 6.0f, 1.5f },
	{ -0.0f, 1.5f },
	{ -0.5f, 1.5f },
	{ -1.0f, 1.5f },
	{ -1.5f, 1.5f },
	{ -2.0f, 1.5f },
	{ -3.0f, 1.5f },
	{ -4.0f, 1.5f },
	{ -6.0f, 1.5f },
	{ 0.0f, 2.0f },
	{ 0.5f, 2.0f },
	{ 1.0f, 2.0f },
	{ 1.5f, 2.0f },
	{ 2.0f, 2.0f },
	{ 3.0f, 2.0f },
	{ 4.0f, 2.0f },
	{ 6.0f, 2.0f },
	{ -0.0f, 2.0f },
	{ -0.5f, 2.0f },
	{ -1.0f, 2.0f },
	{ -1.5f, 2.0f },
	{ -2.0f, 2.0f },
	{ -3.0f, 2.0f },
	{ -4.0f, 2.0f },
	{ -6.0f, 2.0f },
	{ 0.0f, 3.0f },
	{ 0.5f, 3.0f },
	{ 1.0f, 3.0f },
	{ 1.5f, 3.0f },
	{ 2.0f, 3.0f },
	{ 3.0f, 3.0f },
	{ 4.0f, 3.0f },
	{ 6.0f, 3.0f },
	{ -0.0f, 3.0f },
	{ -0.5f, 3.0f },
	{ -1.0f, 3.0f },
	{ -1.5f, 3.0f },
	{ -2.0f, 3.0f },
	{ -3.0f, 3.0f },
	{ -4.0f, 3.0f },
	{ -6.0f, 3.0f },
	{ 0.0f, 4.0f },
	{ 0.5f, 4.0f },
	{ 1.0f, 4.0f },
	{ 1.5f, 4.0f },
	{ 2.0f, 4.0f },
	{ 3.0f, 4.0f },
	{ 4.0f, 4.0f },
	{ 6.0f, 4.0f },
	{ -0.0f, 4.0f },
	{ -0.5f, 4.0f },
	{ -1.0f, 4.0f },
	{ -1.5f, 4.0f },
	{ -2.0f, 4.0f },
	{ -3.0f, 4.0f },
	{ -4.0f, 4.0f },
	{ -6.0f, 4.0f },
	{ 0.0f, 6.0f },
	{ 0.5f, 6.0f },
	{ 1.0f, 6.0f },
	{ 1.5f, 6.0f },
	{ 2.0f, 6.0f },
	{ 3.0f, 6.0f },
	{ 4.0f, 6.0f },
	{ 6.0f, 6.0f },
	{ -0.0f, 6.0f },
	{ -0.5f, 6.0f },
	{ -1.0f, 6.0f },
	{ -1.5f, 6.0f },
	{ -2.0f, 6.0f },
	{ -3.0f, 6.0f },
	{ -4.0f, 6.0f },
	{ -6.0f, 6.0f },
	{ 0.0f, -0.0f },
	{ 0.5f, -0.0f },
	{ 1.0f, -0.0f },
	{ 1.5f, -0.0f },
	{ 2.0f, -0.0f },
	{ 3.0f, -0.0f },
	{ 4.0f, -0.0f },
	{ 6.0f, -0.0f },
	{ -0.0f, -0.0f },
	{ -0.5f, -0.0f },
	{ -1.0f, -0.0f },
	{ -1.5f, -0.0f },
	{ -2.0f, -0.0f },
	{ -3.0f, -0.0f },
	{ -4.0f, -0.0f },
	{ -6.0f, -0.0f },
	{ 0.0f, -0.5f },
	{ 0.5f, -0.5f },
	{ 1.0f, -0.5f },
	{ 1.5f, -0.5f },
	{ 2.0f, -0.5f },
	{ 3.0f, -0.5f },
	{ 4.0f, -0.5f },
	{ 6.0f, -0.5f },
	{ -0.0f, -0.5f },
	{ -0.5f, -0.5f },
	{ -1.0f, -0.5f },
	{ -1.5f, -0.5f },
	{ -2.0f, -0.5f },
	{ -3.0f, -0.5f },
	{ -4.0f, -0.5f },
	{ -6.0f, -0.5f },
	{ 0.0f, -1.0f },
	{ 0.5f, -1.0f },
	{ 1.0f, -1.0f },
	{ 1.5f, -1.0f },
	{ 2.0f, -1.0f },
	{ 3.0f, -1.0f },
	{ 4.0f, -1.0f },
	{ 6.0f, -1.0f },
	{ -0.0f, -1.0f },
	{ -0.5f, -1.0f },
	{ -1.0f, -1.0f },
	{ -1.5f, -1.0f },
	{ -2.0f, -1.0f },
	{ -3.0f, -1.0f },
	{ -4.0f, -1.0f },
	{ -6.0f, -1.0f },
	{ 0.0f, -1.5f },
	{ 0.5f, -1.5f },
	{ 1.0f, -1.5f },
	{ 1.5f, -1.5f },
	{ 2.0f, -1.5f },
	{ 3.0f, -1.5f },
	{ 4.0f, -1.5f },
	{ 6.0f, -1.5f },
	{ -0.0f, -1.5f },
	{ -0.5f, -1.5f },
	{ -1.0f, -1.5f },
	{ -1.5f, -1.5f },
	{ -2.0f, -1.5f },
	{ -3.0f, -1.5f },
	{ -4.0f, -1.5f },
	{ -6.0f, -1.5f },
	{ 0.0f, -2.0f },
	{ 0.5f, -2.0f },
	{ 1.0f, -2.0f },
	{ 1.5f, -2.0f },
	{ 2.0f, -2.0f },
	{ 3.0f, -2.0f },
	{ 4.0f, -2.0f },
	{ 6.0f, -2.0f },
	{ -0.0f, -2.0f },
	{ -0.5f, -2.0f },
	{ -1.0f, -2.0f },
	{ -1.5f, -2.0f },
	{ -2.0f, -2.0f },
	{ -3.0f, -2.0f },
	{ -4.0f, -2.0f },
	{ -6.0f, -2.0f },
	{ 0.0f, -3.0f },
	{ 0.5f, -3.0f },
	{ 1.0f, -3.0f },
	{ 1.5f, -3.0f },
	{ 2.0f, -3.0f },
	{ 3.0f, -3.0f },
	{ 4.0f, -3.0f },
	{ 6.0f, -3.0f },
	{ -0.0f, -3.0f },
	{ -0.5f, -3.0f },
	{ -1.0f, -3.0f },
	{ -1.5f, -3.0f },
	{ -2.0f, -3.0f },
	{ -3.0f, -3.0f },
	{ -4.0f, -3.0f },
	{ -6.0f, -3.0f },
	{ 0.0f, -4.0f },
	{ 0.5f, -4.0f },
	{ 1.0f, -4.0f },
	{ 1.5f, -4.0f },
	{ 2.0f, -4.0f },
	{ 3.0f, -4.0f },
	{ 4.0f, -4.0f },
	{ 6.0f, -4.0f },
	{ -0.0f, -4.0f },
	{ -0.5f, -4.0f },
	{ -1.0f, -4.0f },
	{ -1.5f, -4.0f },
	{ -2.0f, -4.0f },
	{ -3.0f, -4.0f },
	{ -4.0f, -4.0f },
	{ -6.0f, -4.0f },
	{ 0.0f, -6.0f },
	{ 0.5f, -6.0f },
	{ 1.0f, -6.0f },
	{ 1.5f, -6.0f },
	{ 2.0f, -6.0f },
	{ 3.0f, -6.0f },
	{ 4.0f, -6.0f },
	{ 6.0f, -6.0f },
	{ -0.0f, -6.0f },
	{ -0.5f, -6.0f },
	{ -1.0f, -6.0f },
	{ -1.5f, -6.0f },
	{ -2.0f, -6.0f },
	{ -3.0f, -6.0f },
	{ -4.0f, -6.0f },
	{ -6.0f, -6.0f },
};

static void matvec_mxfp4_generic(const struct cw_wview *w, const float *x,
				 float *y, int64_t r0, int64_t r1)
{
	const uint8_t *codes = w->data;
	const int64_t nb = w->cols / 32;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * (w->cols / 2);
		const uint8_t *rs = w->scales + r * nb;
		v8f acc = { 0 };

		for (int64_t b = 0; b < nb; b++) {
			const float s = e8m0_to_f32(rs[b]);
			const v8f sv = { s, s, s, s, s, s, s, s };
			const uint8_t *bc = rc + b * 16;
			const float *bx = x + b * 32;
			float dq[32];

			for (int j = 0; j < 16; j++)
				memcpy(dq + 2 * j, k_e2m1_pair[bc[j]], 8);
			acc += (load8(dq) * sv) * load8(bx);
			acc += (load8(dq + 8) * sv) * load8(bx + 8);
			acc += (load8(dq + 16) * sv) * load8(bx + 16);
			acc += (load8(dq + 24) * sv) * load8(bx + 24);
		}
		y[r] = hsum8(acc);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CW_HAVE_AVX2_MXFP4 1

/* AVX2: the 16 code bytes of a block are looked up with pshufb in a table
 * of 2 * e2m1, interleaved into element order (low nibble = even element)
 * and widened to float.  Multiply and add stay separate (no FMA), as in
 * the generic version, so the bits are the same. */
__attribute__((target("avx2"))) static void
matvec_mxfp4_avx2(const struct cw_wview *w, const float *x, float *y,
		  int64_t r0, int64_t r1)
{
	const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2,
					  -3, -4, -6, -8, -12);
	const __m128i m15 = _mm_set1_epi8(15);
	const uint8_t *codes = w->data;
	const int64_t nb = w->cols / 32;

	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *rc = codes + r * (w->cols / 2);
		const uint8_t *rs = w->scales + r * nb;
		__m256 acc = _mm256_setzero_ps();
		float l[8];

		for (int64_t b = 0; b < nb; b++) {
			const __m256 sv = _mm256_set1_ps(0.5f * e8m0_to_f32(rs[b]));
			const float *bx = x + b * 32;
			__m128i c = _mm_loadu_si128((const __m128i *)(rc + b * 16));
			__m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(c, m15));
			__m128i hi = _mm_shuffle_epi8(
				lut, _mm_and_si128(_mm_srli_epi16(c, 4), m15));
			__m128i e0 = _mm_unpacklo_epi8(lo, hi);
			__m128i e1 = _mm_unpackhi_epi8(lo, hi);
			__m256 w0 = _mm256_mul_ps(
				_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), sv);
			__m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(
				_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), sv);
			__m256 w2 = _mm256_mul_ps(
				_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), sv);
			__m256 w3 = _mm256_mul_ps(_mm256_cvtepi32_ps(
				_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), sv);

			acc = _mm256_add_ps(acc, _mm256_mul_ps(w0, _mm256_loadu_ps(bx)));
			acc = _mm256_add_ps(acc, _mm256_mul_ps(w1, _mm256_loadu_ps(bx + 8)));
			acc = _mm256_add_ps(acc, _mm256_mul_ps(w2, _mm256_loadu_ps(bx + 16)));
			acc = _mm256_add_ps(acc, _mm256_mul_ps(w3, _mm256_loadu_ps(bx + 24)));
		}
		_mm256_storeu_ps(l, acc);
		y[r] = ((l[0] + l[4]) + (l[2] + l[6])) +
		       ((l[1] + l[5]) + (l[3] + l[7]));
	}
}
#endif

static void matvec_mxfp4(const struct cw_wview *w, const float *x, float *y,
			 int64_t r0, int64_t r1)
{
#ifdef CW_HAVE_AVX2_MXFP4
	if (__builtin_cpu_supports("avx2")) {
		matvec_mxfp4_avx2(w, x, y, r0, r1);
		return;
	}
#endif
	matvec_mxfp4_generic(w, x, y, r0, r1);
}

/*
 * NVFP4, E2M1 with FP16 group scales, FP8 E4M3 with FP32 block scales: each
 * row is dequantized in chunks of DQ_CHUNK elements into a float buffer
 * (exactly the values st_formats' *_dequantize_row gives) and multiplied
 * into the same 8 lanes as matvec_f32, then the tail (cols % 8 elements)
 * in order.  So the result equals matvec_f32 on the dequantized matrix,
 * bit for bit.
 */
#define DQ_CHUNK 256 /* a multiple of 8 (lanes) and of 2 (code pairs) */

/* E4M3 (OFP8) value of every byte: bias 7, subnormals m/8 * 2^-6,
 * 0x7F / 0xFF NaN. */
static const float k_e4m3[256] = {
	/* 0x00 */ 0.0f, 0x1p-9f, 0x1p-8f, 0x1.8p-8f, 0x1p-7f, 0x1.4p-7f, 0x1.8p-7f, 0x1.cp-7f,
	/* 0x08 */ 0x1p-6f, 0x1.2p-6f, 0x1.4p-6f, 0x1.6p-6f, 0x1.8p-6f, 0x1.ap-6f, 0x1.cp-6f, 0x1.ep-6f,
	/* 0x10 */ 0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f, 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f,
	/* 0x18 */ 0x1p-4f, 0x1.2p-4f, 0x1.4p-4f, 0x1.6p-4f, 0x1.8p-4f, 0x1.ap-4f, 0x1.cp-4f, 0x1.ep-4f,
	/* 0x20 */ 0x1p-3f, 0x1.2p-3f, 0x1.4p-3f, 0x1.6p-3f, 0x1.8p-3f, 0x1.ap-3f, 0x1.cp-3f, 0x1.ep-3f,
	/* 0x28 */ 0x1p-2f, 0x1.2p-2f, 0x1.4p-2f, 0x1.6p-2f, 0x1.8p-2f, 0x1.ap-2f, 0x1.cp-2f, 0x1.ep-2f,
	/* 0x30 */ 0x1p-1f, 0x1.2p-1f, 0x1.4p-1f, 0x1.6p-1f, 0x1.8p-1f, 0x1.ap-1f, 0x1.cp-1f, 0x1.ep-1f,
	/* 0x38 */ 0x1p0f, 0x1.2p0f, 0x1.4p0f, 0x1.6p0f, 0x1.8p0f, 0x1.ap0f, 0x1.cp0f, 0x1.ep0f,
	/* 0x40 */ 0x1p1f, 0x1.2p1f, 0x1.4p1f, 0x1.6p1f, 0x1.8p1f, 0x1.ap1f, 0x1.cp1f, 0x1.ep1f,
	/* 0x48 */ 0x1p2f, 0x1.2p2f, 0x1.4p2f, 0x1.6p2f, 0x1.8p2f, 0x1.ap2f, 0x1.cp2f, 0x1.ep2f,
	/* 0x50 */ 0x1p3f, 0x1.2p3f, 0x1.4p3f, 0x1.6p3f, 0x1.8p3f, 0x1.ap3f, 0x1.cp3f, 0x1.ep3f,
	/* 0x58 */ 0x1p4f, 0x1.2p4f, 0x1.4p4f, 0x1.6p4f, 0x1.8p4f, 0x1.ap4f, 0x1.cp4f, 0x1.ep4f,
	/* 0x60 */ 0x1p5f, 0x1.2p5f, 0x1.4p5f, 0x1.6p5f, 0x1.8p5f, 0x1.ap5f, 0x1.cp5f, 0x1.ep5f,
	/* 0x68 */ 0x1p6f, 0x1.2p6f, 0x1.4p6f, 0x1.6p6f, 0x1.8p6f, 0x1.ap6f, 0x1.cp6f, 0x1.ep6f,
	/* 0x70 */ 0x1p7f, 0x1.2p7f, 0x1.4p7f, 0x1.6p7f, 0x1.8p7f, 0x1.ap7f, 0x1.cp7f, 0x1.ep7f,
	/* 0x78 */ 0x1p8f, 0x1.2p8f, 0x1.4p8f, 0x1.6p8f, 0x1.8p8f, 0x1.ap8f, 0x1.cp8f, NAN,
	/* 0x80 */ -0.0f, -0x1p-9f, -0x1p-8f, -0x1.8p-8f, -0x1p-7f, -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
	/* 0x88 */ -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
	/* 0x90 */ -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
	/* 0x98 */ -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
	/* 0xa0 */ -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
	/* 0xa8 */ -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
	/* 0xb0 */ -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
	/* 0xb8 */ -0x1p0f, -0x1.2p0f, -0x1.4p0f, -0x1.6p0f, -0x1.8p0f, -0x1.ap0f, -0x1.cp0f, -0x1.ep0f,
	/* 0xc0 */ -0x1p1f, -0x1.2p1f, -0x1.4p1f, -0x1.6p1f, -0x1.8p1f, -0x1.ap1f, -0x1.cp1f, -0x1.ep1f,
	/* 0xc8 */ -0x1p2f, -0x1.2p2f, -0x1.4p2f, -0x1.6p2f, -0x1.8p2f, -0x1.ap2f, -0x1.cp2f, -0x1.ep2f,
	/* 0xd0 */ -0x1p3f, -0x1.2p3f, -0x1.4p3f, -0x1.6p3f, -0x1.8p3f, -0x1.ap3f, -0x1.cp3f, -0x1.ep3f,
	/* 0xd8 */ -0x1p4f, -0x1.2p4f, -0x1.4p4f, -0x1.6p4f, -0x1.8p4f, -0x1.ap4f, -0x1.cp4f, -0x1.ep4f,
	/* 0xe0 */ -0x1p5f, -0x1.2p5f, -0x1.4p5f, -0x1.6p5f, -0x1.8p5f, -0x1.ap5f, -0x1.cp5f, -0x1.ep5f,
	/* 0xe8 */ -0x1p6f, -0x1.2p6f, -0x1.4p6f, -0x1.6p6f, -0x1.8p6f, -0x1.ap6f, -0x1.cp6f, -0x1.ep6f,
	/* 0xf0 */ -0x1p7f, -0x1.2p7f, -0x1.4p7f, -0x1.6p7f, -0x1.8p7f, -0x1.ap7f, -0x1.cp7f, -0x1.ep7f,
	/* 0xf8 */ -0x1p8f, -0x1.2p8f, -0x1.4p8f, -0x1.6p8f, -0x1.8p8f, -0x1.ap8f, -0x1.cp8f, -NAN,
};

/* Dequantizes elements [c0, c0 + n) of row r of w into out.  c0 is a
 * multiple of 8. */
typedef void (*dq_fn)(const struct cw_wview *w, int64_t r, int64_t c0,
		      int64_t n, float *out);

/* NVFP4: (e2m1 * e4m3(block scale)) * global, blocks of 16 (cols % 16 ==
 * 0, so pairs (c, c + 1) with c even share a block). */
static void dq_nvfp4(const struct cw_wview *w, int64_t r, int64_t c0,
		     int64_t n, float *out)
{
	const uint8_t *codes = (const uint8_t *)w->data + r * (w->cols / 2);
	const uint8_t *sc = w->scales + r * (w->cols / 16);
	const float g = w->global_scale;

	for (int64_t i = 0; i < n; i += 2) {
		const int64_t c = c0 + i;
		const float s = k_e4m3[sc[c / 16]];
		const float *v = k_e2m1_pair[codes[c / 2]];

		out[i] = (v[0] * s) * g;
		out[i + 1] = (v[1] * s) * g;
	}
}

/* E2M1 with an FP16 scale per group (even group size, even cols): e2m1 *
 * f16(scale), exact. */
static void dq_e2m1f16(const struct cw_wview *w, int64_t r, int64_t c0,
		       int64_t n, float *out)
{
	const int64_t g = w->group, ng = (w->cols + g - 1) / g;
	const uint8_t *codes = (const uint8_t *)w->data + r * (w->cols / 2);
	const uint16_t *sc = (const uint16_t *)(const void *)w->scales + r * ng;
	int64_t c = c0;

	while (c < c0 + n) {
		const int64_t end = ST_MIN((c / g + 1) * g, c0 + n);
		const float s = st_f16_to_f32(sc[c / g]);

		for (; c < end; c += 2) {
			const float *v = k_e2m1_pair[codes[c / 2]];

			out[c - c0] = v[0] * s;
			out[c - c0 + 1] = v[1] * s;
		}
	}
}

/* FP8 E4M3 with an FP32 scale per block of `group` (a view without scales
 * reads plain E4M3). */
static void dq_fp8(const struct cw_wview *w, int64_t r, int64_t c0,
		   int64_t n, float *out)
{
	const int64_t g = w->group ? w->group : w->cols;
	const int64_t nb = (w->cols + g - 1) / g;
	const uint8_t *codes = (const uint8_t *)w->data + r * w->cols;
	const float *sc = (const float *)(const void *)w->scales;
	int64_t c = c0;

	while (c < c0 + n) {
		const int64_t end = ST_MIN((c / g + 1) * g, c0 + n);
		const float s = sc ? sc[r * nb + c / g] : 1.0f;

		for (; c < end; c++)
			out[c - c0] = k_e4m3[codes[c]] * s;
	}
}

CW_KERNEL static void matvec_dq(const struct cw_wview *w, const float *x,
				float *y, int64_t r0, int64_t r1, dq_fn dq)
{
	const int64_t C = w->cols, C8 = C & ~(int64_t)7;
	float buf[DQ_CHUNK];

	for (int64_t r = r0; r < r1; r++) {
		v8f acc = { 0 };
		float s;

		for (int64_t c0 = 0; c0 < C8; c0 += DQ_CHUNK) {
			const int64_t n = ST_MIN((int64_t)DQ_CHUNK, C8 - c0);

			dq(w, r, c0, n, buf);
			for (int64_t i = 0; i < n; i += 8)
				acc += load8(buf + i) * load8(x + c0 + i);
		}
		s = hsum8(acc);
		if (C8 < C) {
			dq(w, r, C8, C - C8, buf);
			for (int64_t c = C8; c < C; c++)
				s += buf[c - C8] * x[c];
		}
		y[r] = s;
	}
}

/* A row-interleaved MXFP4 view (w->il_rows, st_mxfp4il.h): each row
 * copied out in row-major form and run through `fn` as a one-row view, so
 * the result is the row-major kernel's bit for bit.  Rows of up to 16384
 * columns on the stack, longer ones in a heap buffer (NaN if none). */
static void matvec_mxfp4_il(const struct cw_wview *w, const float *x,
			    float *y, int64_t r0, int64_t r1,
			    void (*fn)(const struct cw_wview *, const float *,
				       float *, int64_t, int64_t))
{
	_Alignas(64) uint8_t stack[16384 / 2 + 16384 / 32];
	const size_t need = (size_t)w->cols / 2 + (size_t)w->cols / 32;
	uint8_t *buf = need <= sizeof(stack) ? stack : malloc(need);
	struct cw_wview row = *w;

	if (!buf) {
		for (int64_t r = r0; r < r1; r++)
			y[r] = NAN;
		return;
	}
	row.rows = 1;
	row.il_rows = 0;
	row.data = buf;
	row.scales = buf + w->cols / 2;
	for (int64_t r = r0; r < r1; r++) {
		st_mxfp4il_unpack_row(w->data, w->scales, w->rows, w->cols, r,
				      buf, buf + w->cols / 2);
		fn(&row, x, y + r, 0, 1);
	}
	if (buf != stack)
		free(buf);
}

static void cpu_matvec(const struct cw_wview *w, const float *x, float *y,
		       int64_t r0, int64_t r1)
{
	if (w->dtype == ST_DTYPE_MXFP4 && w->il_rows) {
		matvec_mxfp4_il(w, x, y, r0, r1, matvec_mxfp4);
		return;
	}
	switch (w->dtype) {
	case ST_DTYPE_F32: matvec_f32(w, x, y, r0, r1); break;
	case ST_DTYPE_BF16: matvec_bf16(w, x, y, r0, r1); break;
	case ST_DTYPE_MXFP4: matvec_mxfp4(w, x, y, r0, r1); break;
	case ST_DTYPE_NVFP4: matvec_dq(w, x, y, r0, r1, dq_nvfp4); break;
	case ST_DTYPE_E2M1_F16: matvec_dq(w, x, y, r0, r1, dq_e2m1f16); break;
	case ST_DTYPE_F8_E4M3: matvec_dq(w, x, y, r0, r1, dq_fp8); break;
	default:
		for (int64_t r = r0; r < r1; r++)
			y[r] = NAN;
		break;
	}
}

/* The same with the portable MXFP4 kernel (tests compare the two). */
static void cpu_matvec_generic(const struct cw_wview *w, const float *x,
			       float *y, int64_t r0, int64_t r1)
{
	if (w->dtype == ST_DTYPE_MXFP4 && w->il_rows)
		matvec_mxfp4_il(w, x, y, r0, r1, matvec_mxfp4_generic);
	else if (w->dtype == ST_DTYPE_MXFP4)
		matvec_mxfp4_generic(w, x, y, r0, r1);
	else
		cpu_matvec(w, x, y, r0, r1);
}

void cw_cpu_rmsnorm(const float *x, const void *weight,
			enum st_dtype wdtype, int n, float eps, float *y)
{
	double ss = 0.0;
	float inv;

	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	inv = (float)(1.0 / sqrt(ss / n + (double)eps));
	for (int i = 0; i < n; i++) {
		float wv = wdtype == ST_DTYPE_BF16 ?
				   bf16_to_f32(((const uint16_t *)weight)[i]) :
				   ((const float *)weight)[i];

		y[i] = wv * (x[i] * inv);
	}
}

void cw_cpu_rope(float *x, int n_heads, int head_dim, int pos,
		     double theta)
{
	const int half = head_dim / 2;

	for (int i = 0; i < half; i++) {
		/* inv_freq in float32 as HF computes it, angle in double then
		 * rounded: keeps cos/sin within float32 rounding of HF's. */
		double inv_freq = pow(theta, -2.0 * i / head_dim);
		double ang = (double)pos * inv_freq;
		float c = (float)cos(ang), s = (float)sin(ang);

		for (int h = 0; h < n_heads; h++) {
			float *v = x + (size_t)h * head_dim;
			float a = v[i], b = v[i + half];

			v[i] = a * c - b * s;
			v[i + half] = b * c + a * s;
		}
	}
}

/* Reference mode takes the floats as they are. */
static size_t cpu_act_bytes(int64_t n)
{
	(void)n;
	return 0;
}

static void cpu_act_prepare(const float *x, int64_t n, enum st_dtype dt,
			    void *buf, struct cw_act *ret)
{
	(void)dt;
	(void)buf;
	ret->x = x;
	ret->q = NULL;
	ret->d = NULL;
	ret->n = n;
	ret->qabs = NULL;
	ret->qsum = NULL;
	ret->qgroup = 0;
	ret->xp = NULL;
}

static void cpu_matvec_act(const struct cw_wview *w, const struct cw_act *a,
			   float *y, int64_t r0, int64_t r1)
{
	cpu_matvec(w, a->x, y, r0, r1);
}

static void cpu_matvec_act_generic(const struct cw_wview *w,
				   const struct cw_act *a, float *y,
				   int64_t r0, int64_t r1)
{
	cpu_matvec_generic(w, a->x, y, r0, r1);
}

static int cpu_supports(enum cw_op op, enum st_dtype dt)
{
	if (op == CW_OP_MATVEC)
		return dt == ST_DTYPE_F32 || dt == ST_DTYPE_BF16 ||
		       dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
		       dt == ST_DTYPE_E2M1_F16 || dt == ST_DTYPE_F8_E4M3;
	return op < CW_OP_COUNT;
}

static const struct cw_backend_ops k_cpu_ops = {
	.name = "cpu",
	.supports = cpu_supports,
	.matvec = cpu_matvec,
	.rmsnorm = cw_cpu_rmsnorm,
	.rope = cw_cpu_rope,
	.act_bytes = cpu_act_bytes,
	.act_prepare = cpu_act_prepare,
	.matvec_act = cpu_matvec_act,
};

static const struct cw_backend_ops k_cpu_generic_ops = {
	.name = "cpu-generic",
	.supports = cpu_supports,
	.matvec = cpu_matvec_generic,
	.rmsnorm = cw_cpu_rmsnorm,
	.rope = cw_cpu_rope,
	.act_bytes = cpu_act_bytes,
	.act_prepare = cpu_act_prepare,
	.matvec_act = cpu_matvec_act_generic,
};

const struct cw_backend_ops *cw_backend_cpu(void)
{
	return &k_cpu_ops;
}

const struct cw_backend_ops *cw_backend_cpu_generic(void)
{
	return &k_cpu_generic_ops;
}

void cw_swiglu(const float *gate, const float *up, int n, float *out)
{
	for (int i = 0; i < n; i++) {
		float g = gate[i];

		out[i] = (g / (1.0f + expf(-g))) * up[i];
	}
}
