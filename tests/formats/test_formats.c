/*
 * test_formats.c — number formats against their specs (OCP MX v1.0, OFP8
 * v1.0, IEEE 754) and PITFALLS P5-P7, P9.  Reference values are written out
 * by hand or computed here independently (double arithmetic, frexp/ldexp,
 * brute-force nearest value), never by calling the code under test.
 * Every comparison is exact: each format value is a binary32 number.
 */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "st_error.h"
#include "st_formats.h"

static uint32_t bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

static float from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* Exact float equality that also tells -0 from +0. */
#define assert_same_float(a, b) assert_int_equal(bits(a), bits(b))

/* Deterministic xorshift generator for the randomized checks. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

/* --- dtype traits --- */

static void test_dtype_traits(void **state)
{
	enum st_dtype dt;

	assert_int_equal(st_dtype_from_name("BF16", &dt), 0);
	assert_int_equal(dt, ST_DTYPE_BF16);
	assert_int_equal(st_dtype_from_name("F8_E4M3", &dt), 0);
	assert_int_equal(dt, ST_DTYPE_F8_E4M3);
	assert_int_equal(st_dtype_from_name("I64", &dt), 0);
	assert_int_equal(dt, ST_DTYPE_I64);
	assert_int_equal(st_dtype_from_name("F64", &dt), -ST_E_UNSUPPORTED);
	assert_int_equal(st_dtype_from_name("bf16", &dt), -ST_E_UNSUPPORTED);
	assert_int_equal(st_dtype_from_name(NULL, &dt), -ST_E_UNSUPPORTED);
	for (int i = 0; i < ST_DTYPE_COUNT; i++) {
		const struct st_dtype_traits *t = st_dtype_traits(i);

		assert_non_null(t);
		assert_int_equal(st_dtype_from_name(t->name, &dt), 0);
		assert_int_equal(dt, i);
	}
	assert_null(st_dtype_traits(ST_DTYPE_COUNT));
	assert_null(st_dtype_traits((enum st_dtype)-1));
	assert_int_equal(st_dtype_bytes(ST_DTYPE_F32, 10), 40);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_BF16, 3), 6);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_I64, 2), 16);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_F8_E4M3, 7), 7);
	/* MXFP4: 32 elements = 16 code bytes + 1 scale byte */
	assert_int_equal(st_dtype_bytes(ST_DTYPE_MXFP4, 64), 34);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_MXFP4, 33), 0);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_F32, UINT64_MAX / 2), 0);
}

/* --- E2M1 --- */

static const float e2m1_ref[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };

static void test_e2m1_decode(void **state)
{
	for (int c = 0; c < 16; c++) {
		float want = (c & 8) ? -e2m1_ref[c & 7] : e2m1_ref[c & 7];

		assert_same_float(st_e2m1_to_f32((uint8_t)c), want);
	}
	assert_true(signbit(st_e2m1_to_f32(8)));
	assert_same_float(st_e2m1_to_f32(7), 6.0f);
	assert_same_float(st_e2m1_to_f32(15), -6.0f);
}

/* Nearest E2M1 code by brute force; at a tie the code with mantissa bit 0
 * (even code); saturating beyond 6. */
static uint8_t e2m1_nearest(double x)
{
	double a = fabs(x);
	int best = 0;

	for (int c = 1; c < 8; c++) {
		double d = fabs(a - e2m1_ref[c]), db = fabs(a - e2m1_ref[best]);

		if (d < db || (d == db && (c & 1) == 0))
			best = c;
	}
	return (uint8_t)(best | (signbit(x) ? 8 : 0));
}

static void test_e2m1_encode(void **state)
{
	static const struct { float x; uint8_t code; } cases[] = {
		{ 0.25f, 0 }, { 0.75f, 2 }, { 1.25f, 2 }, { 1.75f, 4 },
		{ 2.5f, 4 },  { 3.5f, 6 },  { 5.0f, 6 },
		{ 0.2499f, 0 }, { 0.2501f, 1 }, { 0.7499f, 1 },
		{ 1.2501f, 3 }, { 1.7499f, 3 }, { 2.5001f, 5 }, { 3.4999f, 5 },
		{ 5.0001f, 7 }, { 6.0f, 7 }, { 7.0f, 7 }, { 100.0f, 7 },
		{ INFINITY, 7 }, { FLT_MAX, 7 }, { 0.0f, 0 }, { 1e-30f, 0 },
		{ 0.5f, 1 }, { 1.0f, 2 }, { 1.5f, 3 }, { 2.0f, 4 },
		{ 3.0f, 5 }, { 4.0f, 6 },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(st_f32_to_e2m1(cases[i].x), cases[i].code);
		assert_int_equal(st_f32_to_e2m1(-cases[i].x),
				 cases[i].code | 8);
	}
	/* ties land on the value 0, 1, 1, 2, 2, 4, 4 (README "Quality") */
	assert_same_float(st_e2m1_to_f32(st_f32_to_e2m1(0.75f)), 1.0f);
	assert_same_float(st_e2m1_to_f32(st_f32_to_e2m1(-3.5f)), -4.0f);
	assert_same_float(st_e2m1_to_f32(st_f32_to_e2m1(-5.0f)), -4.0f);
	assert_int_equal(st_f32_to_e2m1(-0.0f), 8);
	assert_int_equal(st_f32_to_e2m1(NAN), 0);
	/* every multiple of 1/64 in [-8, 8] (all midpoints included) and
	 * random floats against the brute-force nearest */
	for (int k = -512; k <= 512; k++)
		assert_int_equal(st_f32_to_e2m1((float)k / 64),
				 e2m1_nearest((double)k / 64));
	for (int i = 0; i < 100000; i++) {
		float x = ((float)(int32_t)rnd32() / 2147483648.0f) * 7.5f;

		assert_int_equal(st_f32_to_e2m1(x), e2m1_nearest(x));
	}
}

/* --- E8M0 --- */

static void test_e8m0_all(void **state)
{
	for (int b = 0; b < 255; b++) {
		/* ldexp in double, then to float: exact, 2^-127 included */
		float want = (float)ldexp(1.0, b - 127);

		assert_same_float(st_e8m0_to_f32((uint8_t)b), want);
		assert_true(st_e8m0_to_f32((uint8_t)b) > 0);
	}
	assert_true(isnan(st_e8m0_to_f32(255)));
	/* P5 */
	assert_same_float(st_e8m0_to_f32(124), 0.125f);
	assert_same_float(st_e8m0_to_f32(126), 0.5f);
	assert_same_float(st_e8m0_to_f32(127), 1.0f);
	assert_same_float(st_e8m0_to_f32(128), 2.0f);
	assert_int_equal(bits(st_e8m0_to_f32(0)), 0x00400000u); /* subnormal */
	assert_true(st_e8m0_to_f32(0) != 0.0f);
	assert_same_float(st_e2m1_to_f32(7) * st_e8m0_to_f32(124), 0.75f);
}

/* Independent: floor(log2(a)) = e - 1 for a = m 2^e, m in [0.5, 1). */
static uint8_t scale_ref(float amax)
{
	int e;
	long b;

	if (amax == 0)
		return 0;
	frexp(fabs((double)amax), &e);
	b = (long)(e - 1) - 2 + 127;
	return (uint8_t)(b < 0 ? 0 : b > 254 ? 254 : b);
}

static void test_mxfp4_scale(void **state)
{
	/* P6 */
	assert_int_equal(st_mxfp4_scale_for_amax(2.7f), 126);
	assert_int_equal(st_mxfp4_scale_for_amax(5.5f), 127);
	assert_int_equal(st_mxfp4_scale_for_amax(1.2f), 125);
	assert_int_equal(st_mxfp4_scale_for_amax(7.9f), 127);
	assert_int_equal(st_mxfp4_scale_for_amax(4.0f), 127);
	assert_int_equal(st_mxfp4_scale_for_amax(3.9999998f), 126);
	assert_int_equal(st_mxfp4_scale_for_amax(-2.7f), 126);
	/* edges: zero, subnormal, tiny normal, huge, inf, NaN */
	assert_int_equal(st_mxfp4_scale_for_amax(0.0f), 0);
	assert_int_equal(st_mxfp4_scale_for_amax(1e-39f), 0);
	assert_int_equal(st_mxfp4_scale_for_amax(from_bits(1)), 0);
	assert_int_equal(st_mxfp4_scale_for_amax(0x1p-125f), 0);
	assert_int_equal(st_mxfp4_scale_for_amax(0x1p-124f), 1);
	assert_int_equal(st_mxfp4_scale_for_amax(FLT_MAX), 252);
	assert_int_equal(st_mxfp4_scale_for_amax(INFINITY), 254);
	assert_int_equal(st_mxfp4_scale_for_amax(NAN), 255);
	for (int i = 0; i < 200000; i++) {
		float a = from_bits(rnd32() & 0x7f7fffffu); /* finite, >= 0 */

		assert_int_equal(st_mxfp4_scale_for_amax(a), scale_ref(a));
	}
}

/* --- MXFP4 blocks --- */

/* Reference quantizer: scale by frexp, x/scale in double (exact), nearest
 * E2M1 by brute force. */
static void quant_ref(const float *x, size_t n, uint8_t *codes,
		      uint8_t *scales)
{
	for (size_t b = 0; b < n / 32; b++) {
		float amax = 0;
		uint8_t s;

		for (int i = 0; i < 32; i++)
			amax = fmaxf(amax, fabsf(x[32 * b + i]));
		s = scale_ref(amax);
		scales[b] = s;
		for (int i = 0; i < 32; i += 2) {
			double sc = ldexp(1.0, s - 127);
			uint8_t lo = e2m1_nearest(x[32 * b + i] / sc);
			uint8_t hi = e2m1_nearest(x[32 * b + i + 1] / sc);

			codes[16 * b + i / 2] = (uint8_t)(lo | hi << 4);
		}
	}
}

static void test_mxfp4_zero_block(void **state)
{
	float x[32] = { 0 }, y[32];
	uint8_t codes[16], scale;

	memset(codes, 0xaa, sizeof(codes));
	assert_int_equal(st_mxfp4_quantize_row(x, 32, codes, &scale), 0);
	assert_int_equal(scale, 0);
	for (int i = 0; i < 16; i++)
		assert_int_equal(codes[i], 0);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	for (int i = 0; i < 32; i++)
		assert_same_float(y[i], 0.0f);
}

static void test_mxfp4_subnormal_scale(void **state)
{
	/* amax = 3 * 2^-128 ~ 8.8e-39 (a float32 subnormal): the scale
	 * 2^(-127-2) clamps to byte 0 = 2^-127, itself subnormal */
	float x[32] = { 0 }, y[32];
	uint8_t codes[16], scale;

	x[0] = 0x1p-128f;        /* 0.5 x scale -> code 1 */
	x[1] = 0x1p-127f;        /* 1.0 -> code 2 */
	x[2] = 0x1.8p-127f;      /* 1.5 -> code 3 */
	x[3] = -0x1p-128f;       /* -0.5 -> code 9 */
	x[4] = 1e-39f;           /* ~0.17 -> 0 */
	x[5] = 0x1.8p-128f;      /* 0.75: tie -> 1.0 (code 2) */
	x[31] = -0x1.8p-127f;    /* -1.5 -> code 11 */
	assert_true(fpclassify(x[2]) == FP_SUBNORMAL);
	assert_int_equal(st_mxfp4_quantize_row(x, 32, codes, &scale), 0);
	assert_int_equal(scale, 0);
	assert_int_equal(codes[0], 1 | 2 << 4);
	assert_int_equal(codes[1], 3 | 9 << 4);
	assert_int_equal(codes[2], 0 | 2 << 4);
	assert_int_equal(codes[15], 0 | 11 << 4);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	assert_same_float(y[0], 0x1p-128f);
	assert_same_float(y[1], 0x1p-127f);
	assert_same_float(y[2], 0x1.8p-127f);
	assert_same_float(y[3], -0x1p-128f);
	assert_same_float(y[4], 0.0f);
	assert_same_float(y[5], 0x1p-127f);
	assert_same_float(y[31], -0x1.8p-127f);
}

static void test_mxfp4_saturating_block(void **state)
{
	/* amax 7.9: scale 1.0 (P6), 7.9 clips to 6 */
	float x[32] = { 7.9f, -7.9f, 5.5f, 5.0f, 2.7f, 0.75f, -1.25f, 0.2f };
	float y[32];
	uint8_t codes[16], scale;
	static const float want[8] = { 6, -6, 6, 4, 3, 1, -1, 0 };

	assert_int_equal(st_mxfp4_quantize_row(x, 32, codes, &scale), 0);
	assert_int_equal(scale, 127);
	assert_int_equal(codes[0], 7 | 15 << 4);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	for (int i = 0; i < 8; i++)
		assert_same_float(y[i], want[i]);

	/* a scale of 2: the block max 12.5 is in [8, 16) */
	float z[32] = { 12.5f, 1.0f, 3.0f, 1.5f };

	assert_int_equal(st_mxfp4_quantize_row(z, 32, codes, &scale), 0);
	assert_int_equal(scale, 128);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	assert_same_float(y[0], 12.0f); /* 6.25 -> 6 */
	assert_same_float(y[1], 1.0f);  /* 0.5 */
	assert_same_float(y[2], 3.0f);  /* 1.5 is a code */
	assert_same_float(y[3], 2.0f);  /* 0.75 -> tie -> 1 */
}

static void test_mxfp4_nibble_order(void **state)
{
	/* P7: scale byte 128 (x2), first byte 0x72, the rest zero */
	uint8_t codes[16] = { 0x72 }, scale = 128;
	float y[32];

	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	assert_same_float(y[0], 2.0f);
	assert_same_float(y[1], 12.0f);
	for (int i = 2; i < 32; i++)
		assert_same_float(y[i], 0.0f);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_GGUF, y), 0);
	assert_same_float(y[0], 2.0f);
	assert_same_float(y[16], 12.0f);
	for (int i = 1; i < 32; i++)
		if (i != 16)
			assert_same_float(y[i], 0.0f);
	/* scale byte 255 is NaN for the whole block */
	scale = 255;
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	for (int i = 0; i < 32; i++)
		assert_true(isnan(y[i]));
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 16,
						 ST_FP4_LAYOUT_OCP, y),
			 -EINVAL);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 (enum st_fp4_layout)7, y),
			 -EINVAL);
}

static void test_mxfp4_random_rows(void **state)
{
	enum { N = 32 * 64 };
	static float x[N], y[N], y2[N];
	static uint8_t codes[N / 2], scales[N / 32];
	static uint8_t rcodes[N / 2], rscales[N / 32], gguf[N / 2];

	for (int rep = 0; rep < 20; rep++) {
		for (int i = 0; i < N; i++) {
			/* each block its own magnitude 2^-140 .. 2^100, and
			 * some values on E2M1 midpoints */
			int e = (int)((i / 32 * 37 + rep * 11) % 240) - 140;
			float m = (float)(int32_t)rnd32() / 2147483648.0f;

			if (rnd32() % 8 == 0)
				m = (float)((int)(rnd32() % 13) - 6) / 8;
			x[i] = ldexpf(m, e);
		}
		assert_int_equal(st_mxfp4_quantize_row(x, N, codes, scales),
				 0);
		quant_ref(x, N, rcodes, rscales);
		assert_memory_equal(scales, rscales, sizeof(scales));
		assert_memory_equal(codes, rcodes, sizeof(codes));
		assert_int_equal(st_mxfp4_dequantize_row(codes, scales, N,
							 ST_FP4_LAYOUT_OCP, y),
				 0);
		for (int i = 0; i < N; i++) {
			uint8_t c = (codes[i / 2] >> (4 * (i & 1))) & 15;
			double want = e2m1_ref[c & 7] *
				      ldexp(1.0, scales[i / 32] - 127);

			assert_same_float(y[i], (float)(c & 8 ? -want : want));
		}
		/* the same codes re-packed GGUF-style decode to the same */
		for (int b = 0; b < N / 32; b++)
			for (int j = 0; j < 16; j++) {
				uint8_t lo = (codes[16 * b + j / 2] >>
					      (4 * (j & 1))) & 15;
				uint8_t hi = (codes[16 * b + (j + 16) / 2] >>
					      (4 * (j & 1))) & 15;

				gguf[16 * b + j] = (uint8_t)(lo | hi << 4);
			}
		assert_int_equal(st_mxfp4_dequantize_row(gguf, scales, N,
							 ST_FP4_LAYOUT_GGUF,
							 y2),
				 0);
		assert_memory_equal(y, y2, sizeof(y));
	}
	assert_int_equal(st_mxfp4_quantize_row(x, 48, codes, scales), -EINVAL);
}

static void test_mxfp4_nan_block(void **state)
{
	float x[32] = { 1.0f, NAN }, y[32];
	uint8_t codes[16], scale;

	assert_int_equal(st_mxfp4_quantize_row(x, 32, codes, &scale), 0);
	assert_int_equal(scale, 255);
	assert_int_equal(st_mxfp4_dequantize_row(codes, &scale, 32,
						 ST_FP4_LAYOUT_OCP, y), 0);
	assert_true(isnan(y[0]));
}

/* --- FP8 E4M3 --- */

/* OFP8 E4M3 from the spec: bias 7, subnormal m/8 * 2^-6, S.1111.111 NaN. */
static double e4m3_ref(int b)
{
	int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
	double v;

	if (e == 15 && m == 7)
		return NAN;
	v = e == 0 ? (m / 8.0) * ldexp(1.0, -6) :
		     (1.0 + m / 8.0) * ldexp(1.0, e - 7);
	return s ? -v : v;
}

static void test_e4m3_decode_all(void **state)
{
	for (int b = 0; b < 256; b++) {
		double want = e4m3_ref(b);
		float got = st_e4m3_to_f32((uint8_t)b);

		if (isnan(want)) {
			assert_true(isnan(got));
			continue;
		}
		assert_same_float(got, (float)want);
	}
	assert_same_float(st_e4m3_to_f32(0x7e), 448.0f);
	assert_same_float(st_e4m3_to_f32(0xfe), -448.0f);
	assert_same_float(st_e4m3_to_f32(0x01), 0x1p-9f);
	assert_same_float(st_e4m3_to_f32(0x08), 0x1p-6f);
	assert_same_float(st_e4m3_to_f32(0x38), 1.0f);
	assert_true(signbit(st_e4m3_to_f32(0x80)));
}

static void test_e4m3_encode(void **state)
{
	/* P9 */
	static const float in[5] = { 1000, 448, 464, 465, -1000 };
	static const uint8_t want[5] = { 0x7e, 0x7e, 0x7e, 0x7e, 0xfe };

	for (int i = 0; i < 5; i++) {
		assert_int_equal(st_f32_to_e4m3_sat(in[i]), want[i]);
		assert_same_float(st_e4m3_to_f32(want[i]),
				  in[i] > 0 ? 448.0f : -448.0f);
	}
	assert_int_equal(st_f32_to_e4m3_sat(INFINITY), 0x7e);
	assert_int_equal(st_f32_to_e4m3_sat(-INFINITY), 0xfe);
	assert_int_equal(st_f32_to_e4m3_sat(FLT_MAX), 0x7e);
	assert_int_equal(st_f32_to_e4m3_sat(NAN), 0x7f);
	/* no finite input gives a NaN code: sweep float exponents */
	for (int i = 0; i < 200000; i++) {
		float x = from_bits(rnd32() & 0xff7fffffu);
		uint8_t c = st_f32_to_e4m3_sat(x);

		assert_true(c != 0x7f && c != 0xff);
	}
	/* round trip of every finite code (-0 keeps its sign) */
	for (int b = 0; b < 256; b++) {
		if ((b & 0x7f) == 0x7f)
			continue;
		assert_int_equal(st_f32_to_e4m3_sat(st_e4m3_to_f32((uint8_t)b)),
				 b);
	}
	/* between neighbours: midpoint -> even code, a hair off -> nearest */
	for (int b = 0; b < 0x7e; b++) {
		float lo = (float)e4m3_ref(b), hi = (float)e4m3_ref(b + 1);
		float mid = (lo + hi) / 2; /* exact: one more bit */
		int even = (b & 1) ? b + 1 : b;

		assert_int_equal(st_f32_to_e4m3_sat(mid), even);
		assert_int_equal(st_f32_to_e4m3_sat(-mid), even | 0x80);
		assert_int_equal(st_f32_to_e4m3_sat(nextafterf(mid, 0)), b);
		assert_int_equal(st_f32_to_e4m3_sat(nextafterf(mid, 1000)),
				 b + 1);
	}
	/* below half the smallest subnormal */
	assert_int_equal(st_f32_to_e4m3_sat(0x1p-10f), 0x00);
	assert_int_equal(st_f32_to_e4m3_sat(0x1.0002p-10f), 0x01);
	assert_int_equal(st_f32_to_e4m3_sat(1e-30f), 0x00);
	assert_int_equal(st_f32_to_e4m3_sat(-1e-30f), 0x80);
	assert_int_equal(st_f32_to_e4m3_sat(from_bits(1)), 0x00);
}

/* --- BF16 / F16 --- */

static void test_bf16(void **state)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = st_bf16_to_f32((uint16_t)h);

		assert_int_equal(bits(f), h << 16);
		if (isnan(f)) {
			assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(f))));
			continue;
		}
		assert_int_equal(st_f32_to_bf16(f), h);
	}
	/* RNE: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
	assert_int_equal(st_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	assert_int_equal(st_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	assert_int_equal(st_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);
	assert_int_equal(st_f32_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
	assert_int_equal(st_f32_to_bf16(FLT_MAX), 0x7f80);
	assert_int_equal(st_f32_to_bf16(-INFINITY), 0xff80);
	/* a signalling-NaN pattern whose payload sits in the dropped bits
	 * stays NaN */
	assert_true(isnan(st_bf16_to_f32(st_f32_to_bf16(from_bits(0x7f800001u)))));
	/* independent: nearest of the two bf16 neighbours, ties even */
	for (int i = 0; i < 200000; i++) {
		float f = from_bits(rnd32() & 0x7f7fffffu);
		uint32_t lo = bits(f) >> 16;
		double dlo = (double)f - st_bf16_to_f32((uint16_t)lo);
		/* past the largest finite value RNE rounds as if 2^128
		 * were the next value (then it is infinity) */
		double next = lo + 1 == 0x7f80 ? ldexp(1.0, 128) :
				st_bf16_to_f32((uint16_t)(lo + 1));
		double dhi = next - (double)f;
		uint32_t want = dlo < dhi ? lo : dhi < dlo ? lo + 1 :
			(lo & 1) ? lo + 1 : lo;

		assert_int_equal(st_f32_to_bf16(f), want);
	}
}

static double f16_ref(uint16_t h)
{
	int e = (h >> 10) & 31, m = h & 1023;
	double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);

	return (h & 0x8000) ? -v : v;
}

static void test_f16(void **state)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = st_f16_to_f32((uint16_t)h);

		if (((h >> 10) & 31) == 31) {
			assert_true((h & 1023) ? isnan(f) : isinf(f));
			if (h & 1023)
				assert_true(isnan(st_f16_to_f32(st_f32_to_f16(f))));
			else
				assert_int_equal(st_f32_to_f16(f), h);
			continue;
		}
		assert_same_float(f, (float)f16_ref((uint16_t)h));
		assert_int_equal(st_f32_to_f16(f), h);
	}
	assert_int_equal(st_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(st_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(st_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(st_f32_to_f16(65519.996f), 0x7bff);
	assert_int_equal(st_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(st_f32_to_f16(-1e10f), 0xfc00);
	/* subnormals: 2^-25 is a tie between 0 and 2^-24 -> 0; 3 x 2^-25 a
	 * tie between 1 and 2 units -> 2 */
	assert_int_equal(st_f32_to_f16(0x1p-25f), 0x0000);
	assert_int_equal(st_f32_to_f16(0x1.0002p-25f), 0x0001);
	assert_int_equal(st_f32_to_f16(3 * 0x1p-25f), 0x0002);
	assert_int_equal(st_f32_to_f16(-0x1p-24f), 0x8001);
	/* 1023.5 units: tie between 0x3ff and the smallest normal 0x400 */
	assert_int_equal(st_f32_to_f16(0x1.ffcp-15f), 0x0400);
	assert_int_equal(st_f32_to_f16(0x1.ff8p-15f), 0x03ff);
	assert_int_equal(st_f32_to_f16(1e-30f), 0x0000);
	/* independent: nearest finite f16 by searching the sorted positive
	 * codes, ties to the even code */
	for (int i = 0; i < 100000; i++) {
		float f = ldexpf((float)(rnd32() >> 8) / 16777216.0f,
				 (int)(rnd32() % 44) - 28);
		int lo = 0, hi = 0x7bff;
		uint16_t want;

		while (lo < hi) { /* largest code with value <= f */
			int mid = (lo + hi + 1) / 2;

			if (f16_ref((uint16_t)mid) <= f)
				lo = mid;
			else
				hi = mid - 1;
		}
		if (lo == 0x7bff) {
			want = (double)f >= 65520.0 ? 0x7c00 : 0x7bff;
		} else {
			double dl = f - f16_ref((uint16_t)lo);
			double dh = f16_ref((uint16_t)(lo + 1)) - f;

			want = (uint16_t)(dl < dh ? lo : dh < dl ? lo + 1 :
					  (lo & 1) ? lo + 1 : lo);
		}
		assert_int_equal(st_f32_to_f16(f), want);
	}
}

static void test_convert_to_f32(void **state)
{
	const uint8_t bf16[4] = { 0x80, 0x3f, 0x40, 0xc0 }; /* 1, -3 */
	const uint8_t f16[4] = { 0x00, 0x3c, 0x00, 0xc2 };  /* 1, -3 */
	const uint8_t e4m3[3] = { 0x38, 0xfe, 0x01 };
	const float f32[2] = { 1.5f, -2.25f };
	uint8_t unaligned[9];
	float out[3];

	assert_int_equal(st_convert_to_f32(ST_DTYPE_BF16, bf16, 2, out), 0);
	assert_same_float(out[0], 1.0f);
	assert_same_float(out[1], -3.0f);
	assert_int_equal(st_convert_to_f32(ST_DTYPE_F16, f16, 2, out), 0);
	assert_same_float(out[0], 1.0f);
	assert_same_float(out[1], -3.0f);
	assert_int_equal(st_convert_to_f32(ST_DTYPE_F8_E4M3, e4m3, 3, out), 0);
	assert_same_float(out[0], 1.0f);
	assert_same_float(out[1], -448.0f);
	assert_same_float(out[2], 0x1p-9f);
	memcpy(unaligned + 1, f32, 8);
	assert_int_equal(st_convert_to_f32(ST_DTYPE_F32, unaligned + 1, 2,
					   out), 0);
	assert_same_float(out[0], 1.5f);
	assert_same_float(out[1], -2.25f);
	assert_int_equal(st_convert_to_f32(ST_DTYPE_U8, e4m3, 3, out),
			 -ST_E_UNSUPPORTED);
	assert_int_equal(st_convert_to_f32(ST_DTYPE_MXFP4, e4m3, 3, out),
			 -ST_E_UNSUPPORTED);
}

/* --- NVFP4 (two-level scale) --- */

/* Packs element codes c[0..n) two per byte, OCP order. */
static void pack(const uint8_t *c, size_t n, uint8_t *out)
{
	for (size_t j = 0; j < n / 2; j++)
		out[j] = (uint8_t)(c[2 * j] | c[2 * j + 1] << 4);
}

static uint8_t nib(const uint8_t *codes, size_t i)
{
	return (codes[i / 2] >> (4 * (i & 1))) & 15;
}

static void test_nvfp4_global_scale(void **state)
{
	/* amax / (6 * 448): the largest block maps to E4M3 448, its largest
	 * element to E2M1 6 */
	assert_same_float(st_nvfp4_global_scale(2688.0f), 1.0f);
	assert_same_float(st_nvfp4_global_scale(168.0f), 0.0625f);
	assert_same_float(st_nvfp4_global_scale(1.0f), 1.0f / 2688.0f);
	/* nothing to scale: 1 (any scale dequantizes zeros to zero) */
	assert_same_float(st_nvfp4_global_scale(0.0f), 1.0f);
	assert_same_float(st_nvfp4_global_scale(NAN), 1.0f);
	assert_same_float(st_nvfp4_global_scale(INFINITY), 1.0f);
}

static void test_nvfp4_blocks(void **state)
{
	float x[32], y[32];
	uint8_t codes[16], sc[2], want[32];

	/* global 1/16 (tensor amax 168).  Block 0: amax 3 -> block scale
	 * e4m3((3 / 6) / (1/16)) = e4m3(8) = 0x50; step 8/16 = 0.5, so the
	 * elements x / 0.5 = 6, -3, 1.5, 0.25, 0.75, 1.25, 5, -2.5 become
	 * codes 7, 0xD, 3, 0 (tie to 0), 2 (tie to 1.0), 2 (tie to 1.0), 6
	 * (tie to 4), 0xC (tie to -2), the rest 0.  Block 1: amax 168 ->
	 * (168/6)*16 =
	 * 448 -> 0x7E; step 28: 168 -> 6 (code 7), -84 -> -3 (0xD),
	 * 14 -> 0.5 (1). */
	memset(x, 0, sizeof(x));
	x[0] = 3.0f; x[1] = -1.5f; x[2] = 0.75f; x[3] = 0.125f;
	x[4] = 0.375f; x[5] = 0.625f; x[6] = 2.5f; x[7] = -1.25f;
	x[16] = 168.0f; x[17] = -84.0f; x[18] = 14.0f;
	memset(want, 0, sizeof(want));
	want[0] = 7; want[1] = 0xd; want[2] = 3; want[3] = 0; want[4] = 2;
	want[5] = 2; want[6] = 6; want[7] = 0xc;
	want[16] = 7; want[17] = 0xd; want[18] = 1;
	assert_int_equal(st_nvfp4_quantize_row(x, 32, 0.0625f, codes, sc), 0);
	assert_int_equal(sc[0], 0x50);
	assert_int_equal(sc[1], 0x7e);
	for (int i = 0; i < 32; i++)
		assert_int_equal(nib(codes, i), want[i]);
	assert_int_equal(st_nvfp4_dequantize_row(codes, sc, 32, 0.0625f, y), 0);
	assert_same_float(y[0], 3.0f);
	assert_same_float(y[1], -1.5f);
	assert_same_float(y[3], 0.0f);
	assert_same_float(y[4], 0.5f);
	assert_same_float(y[6], 2.0f);
	assert_same_float(y[7], -1.0f);
	assert_same_float(y[16], 168.0f);
	assert_same_float(y[17], -84.0f);
	assert_same_float(y[18], 14.0f);

	/* block scale rounding: (57 / 6) / 1 = 9.5, between E4M3 9 (0x51, odd)
	 * and 10 (0x52, even): the even one; 57 / 10 = 5.7 -> 6 */
	memset(x, 0, sizeof(x));
	x[0] = 57.0f;
	x[16] = 6.0f * 500.0f; /* block scale 500 saturates to 448 */
	assert_int_equal(st_nvfp4_quantize_row(x, 32, 1.0f, codes, sc), 0);
	assert_int_equal(sc[0], 0x52);
	assert_int_equal(nib(codes, 0), 7);
	assert_int_equal(sc[1], 0x7e);
	assert_int_equal(nib(codes, 16), 7); /* 3000 / 448 = 6.7 saturates */
	st_nvfp4_dequantize_row(codes, sc, 32, 1.0f, y);
	assert_same_float(y[0], 60.0f);
	assert_same_float(y[16], 2688.0f);

	/* a subnormal block scale: amax 6 * 3 * 2^-9 -> code 0x03 exactly;
	 * a block far below the tensor's largest rounds its scale to 0 and
	 * reads zero; an all-zero block stays zero */
	memset(x, 0, sizeof(x));
	x[0] = 18.0f * 0x1p-9f;
	x[1] = -3.0f * 0x1p-9f;
	x[16] = 6.0f * 0x1p-12f;
	assert_int_equal(st_nvfp4_quantize_row(x, 32, 1.0f, codes, sc), 0);
	assert_int_equal(sc[0], 0x03);
	assert_int_equal(nib(codes, 0), 7);
	assert_int_equal(nib(codes, 1), 0xa); /* -1.0 */
	assert_int_equal(sc[1], 0x00);
	assert_int_equal(nib(codes, 16), 0);
	st_nvfp4_dequantize_row(codes, sc, 32, 1.0f, y);
	assert_same_float(y[0], 18.0f * 0x1p-9f);
	assert_same_float(y[1], -3.0f * 0x1p-9f);
	assert_same_float(y[16], 0.0f);
	memset(x, 0, sizeof(x));
	st_nvfp4_quantize_row(x, 32, 1.0f, codes, sc);
	assert_int_equal(sc[0] | sc[1], 0);
	for (int j = 0; j < 16; j++)
		assert_int_equal(codes[j], 0);

	/* NaN poisons its block only; infinity saturates */
	memset(x, 0, sizeof(x));
	x[3] = NAN;
	x[16] = INFINITY;
	x[17] = 1.0f;
	assert_int_equal(st_nvfp4_quantize_row(x, 32, 1.0f, codes, sc), 0);
	assert_int_equal(sc[0], 0x7f);
	assert_int_equal(sc[1], 0x7e);
	assert_int_equal(nib(codes, 16), 7);
	st_nvfp4_dequantize_row(codes, sc, 32, 1.0f, y);
	assert_true(isnan(y[0]) && isnan(y[15]));
	assert_same_float(y[16], 2688.0f);

	/* argument checks */
	assert_int_equal(st_nvfp4_quantize_row(x, 24, 1.0f, codes, sc), -EINVAL);
	assert_int_equal(st_nvfp4_quantize_row(x, 32, 0.0f, codes, sc), -EINVAL);
	assert_int_equal(st_nvfp4_quantize_row(x, 32, INFINITY, codes, sc),
			 -EINVAL);
	assert_int_equal(st_nvfp4_dequantize_row(codes, sc, 8, 1.0f, y), -EINVAL);
}

/* PITFALLS P8: a checkpoint that stores the inverse of the per-tensor
 * scale.  Code 7 (+6), block scale 0x38 (1.0), stored inverse 3584:
 * 6 / 3584 = 1.674e-3, not 6 * 3584 = 21504. */
static void test_nvfp4_inverse_p8(void **state)
{
	uint8_t c[16] = { 7 }, codes[8], sc[1] = { 0x38 };
	float y[16];

	pack(c, 16, codes);
	assert_int_equal(st_nvfp4_dequantize_row_inv(codes, sc, 16, 3584.0f, y),
			 0);
	assert_same_float(y[0], 6.0f / 3584.0f);
	assert_true(fabs(y[0] - 1.674e-3) < 5e-7);
	for (int i = 1; i < 16; i++)
		assert_same_float(y[i], 0.0f);
	/* the same bytes read as a multiplying scale give the wrong 21504 */
	st_nvfp4_dequantize_row(codes, sc, 16, 3584.0f, y);
	assert_same_float(y[0], 21504.0f);
	assert_int_equal(st_nvfp4_dequantize_row_inv(codes, sc, 16, 0.0f, y),
			 -EINVAL);
	assert_int_equal(st_nvfp4_dequantize_row_inv(codes, sc, 16, NAN, y),
			 -EINVAL);
}

/* Random rows: every dequantized element is the E2M1 value nearest to
 * x / step (brute force, ties to even) times the step, where the step is
 * the block's E4M3 scale (itself the nearest E4M3 to (amax/6)/global)
 * times global. */
static int e4m3_nearest(double v)
{
	int best = 0;

	if (v >= 448.0)
		return 0x7e;
	for (int b = 1; b <= 0x7e; b++) {
		double d = fabs(v - e4m3_ref(b)), db = fabs(v - e4m3_ref(best));

		if (d < db || (d == db && (b & 1) == 0))
			best = b;
	}
	return best;
}

static void test_nvfp4_random_rows(void **state)
{
	enum { N = 64 };
	float x[N], y[N], amax = 0.0f, g;
	uint8_t codes[N / 2], sc[N / 16];

	for (int rep = 0; rep < 200; rep++) {
		amax = 0.0f;
		for (int i = 0; i < N; i++) {
			x[i] = ((float)(int32_t)rnd32() / 2147483648.0f) *
			       ldexpf(1.0f, (int)(rnd32() % 12) - 8);
			amax = fmaxf(amax, fabsf(x[i]));
		}
		g = st_nvfp4_global_scale(amax * 1.7f); /* a wider tensor */
		assert_int_equal(st_nvfp4_quantize_row(x, N, g, codes, sc), 0);
		assert_int_equal(st_nvfp4_dequantize_row(codes, sc, N, g, y), 0);
		for (int b = 0; b < N / 16; b++) {
			float bm = 0.0f, step;
			int s;

			for (int i = 0; i < 16; i++)
				bm = fmaxf(bm, fabsf(x[b * 16 + i]));
			s = e4m3_nearest((double)((bm / 6.0f) / g));
			assert_int_equal(sc[b], s);
			step = (float)e4m3_ref(s) * g;
			for (int i = b * 16; i < b * 16 + 16; i++) {
				float want = step == 0.0f ? 0.0f :
					(float)(e2m1_ref[e2m1_nearest(x[i] / step) & 7] *
						e4m3_ref(s)) * g;

				if (signbit(x[i]) && step != 0.0f)
					want = -want;
				assert_true(fabsf(y[i]) == fabsf(want) &&
					    (y[i] == want || want == 0.0f));
			}
		}
	}
}

/* --- E2M1 with FP16 group scales --- */

static void test_e2m1f16_scale(void **state)
{
	float x[192], y[192];
	uint8_t codes[96];
	uint16_t sc[6];

	/* amax 6 -> scale 1.0 (0x3C00), elements exact */
	memset(x, 0, sizeof(x));
	x[0] = 6.0f; x[1] = -0.5f; x[2] = 2.5f; x[3] = 1.75f;
	assert_int_equal(st_e2m1f16_quantize_row(x, 32, 32, codes, sc), 0);
	assert_int_equal(sc[0], 0x3c00);
	assert_int_equal(nib(codes, 0), 7);
	assert_int_equal(nib(codes, 1), 9);
	assert_int_equal(nib(codes, 2), 4); /* tie 2.5 -> 2 */
	assert_int_equal(nib(codes, 3), 4); /* tie 1.75 -> 2 */

	/* amax 1: 1/6 rounds to binary16 0x3155 = 0.16662598 (a hair below
	 * 1/6), so 1 / scale = 6.0015 saturates to 6 -> 0.99975586 */
	memset(x, 0, sizeof(x));
	x[5] = 1.0f;
	st_e2m1f16_quantize_row(x, 32, 32, codes, sc);
	assert_int_equal(sc[0], 0x3155);
	assert_int_equal(nib(codes, 5), 7);
	st_e2m1f16_dequantize_row(codes, sc, 32, 32, y);
	assert_same_float(y[5], 6.0f * 0x1.554p-3f);
	assert_same_float(y[5], 0.99975586f);

	/* ties of the scale itself: amax / 6 = 1 + 2^-11 (halfway between
	 * 1 and 1 + 2^-10) -> 1.0; 1 + 3 * 2^-11 -> 1 + 2^-9 (even) */
	x[5] = 6.0f * (1.0f + 0x1p-11f);
	st_e2m1f16_quantize_row(x, 32, 32, codes, sc);
	assert_int_equal(sc[0], 0x3c00);
	x[5] = 6.0f * (1.0f + 3 * 0x1p-11f);
	st_e2m1f16_quantize_row(x, 32, 32, codes, sc);
	assert_int_equal(sc[0], 0x3c02);

	/* a binary16 subnormal scale: amax 6 * 2^-20 -> 0x0010 */
	x[5] = 6.0f * 0x1p-20f;
	x[6] = -3.0f * 0x1p-20f;
	st_e2m1f16_quantize_row(x, 32, 32, codes, sc);
	assert_int_equal(sc[0], 0x0010);
	st_e2m1f16_dequantize_row(codes, sc, 32, 32, y);
	assert_same_float(y[5], 6.0f * 0x1p-20f);
	assert_same_float(y[6], -3.0f * 0x1p-20f);

	/* too large for binary16: clamped to 65504, elements saturate */
	x[5] = 6.0e5f;
	x[6] = 0.0f;
	st_e2m1f16_quantize_row(x, 32, 32, codes, sc);
	assert_int_equal(sc[0], 0x7bff);
	st_e2m1f16_dequantize_row(codes, sc, 32, 32, y);
	assert_same_float(y[5], 6.0f * 65504.0f);

	/* all-zero group stays zero; a NaN group reads NaN */
	memset(x, 0, sizeof(x));
	x[40] = NAN;
	st_e2m1f16_quantize_row(x, 64, 32, codes, sc);
	assert_int_equal(sc[0], 0x0000);
	assert_int_equal(sc[1], 0x7e00);
	for (int j = 0; j < 32; j++)
		assert_int_equal(codes[j], 0);
	st_e2m1f16_dequantize_row(codes, sc, 64, 32, y);
	assert_same_float(y[0], 0.0f);
	assert_true(isnan(y[32]) && isnan(y[63]));

	/* a 192-wide row with groups of 128: [0, 128) and [128, 192), each
	 * with its own scale (kjv-moe README) */
	for (int i = 0; i < 192; i++)
		x[i] = i < 128 ? 0.01f * (float)(i % 7) : 3.0f * (float)(i % 3);
	assert_int_equal(st_e2m1f16_quantize_row(x, 192, 128, codes, sc), 0);
	assert_int_equal(sc[0], st_f32_to_f16((0.01f * 6.0f) / 6.0f));
	assert_int_equal(sc[1], 0x3c00); /* 6 / 6 */
	st_e2m1f16_dequantize_row(codes, sc, 192, 128, y);
	assert_same_float(y[130], 3.0f);
	assert_same_float(y[131], 6.0f);

	/* argument checks */
	assert_int_equal(st_e2m1f16_quantize_row(x, 31, 32, codes, sc), -EINVAL);
	assert_int_equal(st_e2m1f16_quantize_row(x, 32, 0, codes, sc), -EINVAL);
	assert_int_equal(st_e2m1f16_dequantize_row(codes, sc, 33, 32, y),
			 -EINVAL);
}

/* --- FP8 E4M3 with FP32 block scales --- */

static void test_fp8_blocks(void **state)
{
	float x[200], y[200], sc[2];
	uint8_t codes[200];

	/* amax 896 -> scale 2; x / 2: 896 -> 448 (0x7E), 3 -> 1.5 (0x3C),
	 * 34 -> 17, a tie between 16 (0x58) and 18 (0x59): 16; 38 -> 19, a
	 * tie between 18 and 20 (0x5A): 20; -2^-9 -> -2^-10, a tie between
	 * -0 and the smallest subnormal: -0 (0x80); -1.5 * 2^-9 -> -0.75 *
	 * 2^-9: -2^-9 (0x81) */
	memset(x, 0, sizeof(x));
	x[0] = 896.0f; x[1] = 3.0f; x[2] = 34.0f; x[3] = 38.0f;
	x[4] = -0x1p-9f; /* / 2 = -2^-10: half the smallest subnormal */
	x[5] = -0x1.8p-9f; /* / 2 = -0.75 * 2^-9: rounds to -2^-9 */
	assert_int_equal(st_fp8_quantize_row(x, 128, 128, codes, sc), 0);
	assert_same_float(sc[0], 2.0f);
	assert_int_equal(codes[0], 0x7e);
	assert_int_equal(codes[1], 0x3c);
	assert_int_equal(codes[2], 0x58);
	assert_int_equal(codes[3], 0x5a);
	assert_int_equal(codes[4], 0x80);
	assert_int_equal(codes[5], 0x81);
	st_fp8_dequantize_row(codes, sc, 128, 128, y);
	assert_same_float(y[0], 896.0f);
	assert_same_float(y[2], 32.0f);
	assert_same_float(y[3], 40.0f);
	assert_same_float(y[5], -0x1p-8f);

	/* P9 through the block: amax 1000 -> scale 1000/448; 1000 -> 448,
	 * never a NaN code */
	memset(x, 0, sizeof(x));
	x[0] = 1000.0f; x[1] = -1000.0f; x[2] = 464.0f;
	st_fp8_quantize_row(x, 3, 128, codes, sc);
	assert_same_float(sc[0], 1000.0f / 448.0f);
	assert_int_equal(codes[0], 0x7e);
	assert_int_equal(codes[1], 0xfe);

	/* 200 elements in blocks of 128: [0, 128) and [128, 200); an
	 * all-zero block has scale 0 and zero codes */
	memset(x, 0, sizeof(x));
	x[150] = -44.8f;
	assert_int_equal(st_fp8_quantize_row(x, 200, 128, codes, sc), 0);
	assert_same_float(sc[0], 0.0f);
	assert_same_float(sc[1], 44.8f / 448.0f);
	assert_int_equal(codes[150], 0xfe);
	for (int i = 0; i < 128; i++)
		assert_int_equal(codes[i], 0);
	st_fp8_dequantize_row(codes, sc, 200, 128, y);
	assert_same_float(y[150], -448.0f * (44.8f / 448.0f));
	assert_same_float(y[0], 0.0f);

	/* NaN: the block reads NaN; infinity: scale FLT_MAX / 448, the
	 * element saturates to 448 steps (finite) */
	x[0] = NAN;
	x[150] = -INFINITY;
	st_fp8_quantize_row(x, 200, 128, codes, sc);
	assert_true(isnan(sc[0]));
	assert_same_float(sc[1], FLT_MAX / 448.0f);
	assert_int_equal(codes[150], 0xfe);
	st_fp8_dequantize_row(codes, sc, 200, 128, y);
	assert_true(isnan(y[1]));
	assert_true(isfinite(y[150]) && y[150] < -3e38f);

	assert_int_equal(st_fp8_quantize_row(x, 200, 0, codes, sc), -EINVAL);
	assert_int_equal(st_fp8_dequantize_row(codes, sc, 200, 0, y), -EINVAL);
}

/* --- expert format descriptors --- */

static void test_wformat(void **state)
{
	static const char *ok[] = { "f32", "bf16", "mxfp4", "nvfp4", "e2m1-g32",
				    "e2m1-g128", "e2m1-g2", "fp8", "fp8-b64",
				    "fp8-b1", "e2m1-g65536" };
	static const char *bad[] = { "", "MXFP4", "nvfp4x", "e2m1", "e2m1-g",
				     "e2m1-g0", "e2m1-g3", "e2m1-g032",
				     "e2m1-g65538", "fp8-b0", "fp8-b65537",
				     "fp8-b128x", "fp8-b-1", "int4", "fp8-b" };
	struct st_wformat f;
	char name[ST_WFORMAT_NAME_MAX];
	uint64_t d, sc, ts;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		assert_int_equal(st_wformat_parse(ok[i], &f), 0);
		assert_int_equal(st_wformat_name(&f, name, sizeof(name)), 0);
		assert_string_equal(name, ok[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(st_wformat_parse(bad[i], &f), -EINVAL);
	assert_int_equal(st_wformat_parse(NULL, &f), -EINVAL);
	assert_int_equal(st_wformat_parse("fp8-b128", &f), 0);
	assert_int_equal(f.dtype, ST_DTYPE_F8_E4M3);
	assert_int_equal(f.group, 128);
	assert_int_equal(st_wformat_name(&f, name, sizeof(name)), 0);
	assert_string_equal(name, "fp8");
	assert_int_equal(st_wformat_name(&f, name, 3), -ENAMETOOLONG);
	f = (struct st_wformat){ ST_DTYPE_MXFP4, 16 };
	assert_int_equal(st_wformat_check(&f), -EINVAL);
	f = (struct st_wformat){ ST_DTYPE_BF16, 32 };
	assert_int_equal(st_wformat_check(&f), -EINVAL);
	f = (struct st_wformat){ ST_DTYPE_I8, 0 };
	assert_int_equal(st_wformat_check(&f), -EINVAL);

	assert_int_equal(st_wformat_scale_type(ST_DTYPE_MXFP4), ST_SCALE_E8M0);
	assert_int_equal(st_wformat_scale_type(ST_DTYPE_NVFP4), ST_SCALE_E4M3);
	assert_int_equal(st_wformat_scale_type(ST_DTYPE_E2M1_F16), ST_SCALE_F16);
	assert_int_equal(st_wformat_scale_type(ST_DTYPE_F8_E4M3), ST_SCALE_F32);
	assert_int_equal(st_wformat_scale_type(ST_DTYPE_BF16), ST_SCALE_NONE);
	assert_string_equal(st_scale_type_name(ST_SCALE_E4M3), "e4m3");
	assert_null(st_scale_type_name(ST_SCALE_NONE));

	/* sizes of kjv-moe's matrices: w1/w3 [192, 128], w2 [128, 192] */
	st_wformat_parse("nvfp4", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 192, 128, &d, &sc, &ts), 0);
	assert_int_equal(d, 192 * 64);
	assert_int_equal(sc, 192 * 8);
	assert_int_equal(ts, 4);
	st_wformat_parse("e2m1-g128", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 128, 192, &d, &sc, &ts), 0);
	assert_int_equal(d, 128 * 96);
	assert_int_equal(sc, 128 * 2 * 2); /* [0,128) and [128,192) */
	assert_int_equal(ts, 0);
	st_wformat_parse("fp8", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 128, 192, &d, &sc, NULL), 0);
	assert_int_equal(d, 128 * 192);
	assert_int_equal(sc, 128 * 2 * 4);
	assert_int_equal(st_wformat_matrix_bytes(&f, 3, 7, &d, &sc, NULL), 0);
	assert_int_equal(sc, 3 * 4);
	st_wformat_parse("mxfp4", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 128, 192, &d, &sc, &ts), 0);
	assert_int_equal(d + sc + ts, 128 * 96 + 128 * 6);
	assert_int_equal(st_wformat_matrix_bytes(&f, 128, 100, &d, NULL, NULL),
			 -ST_E_UNSUPPORTED);
	st_wformat_parse("nvfp4", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 2, 40, &d, NULL, NULL),
			 -ST_E_UNSUPPORTED);
	st_wformat_parse("e2m1-g32", &f);
	assert_int_equal(st_wformat_matrix_bytes(&f, 2, 33, &d, NULL, NULL),
			 -ST_E_UNSUPPORTED);
	assert_int_equal(st_wformat_matrix_bytes(&f, 0, 32, &d, NULL, NULL),
			 -EINVAL);
	assert_int_equal(st_wformat_matrix_bytes(&f, INT64_C(1) << 40, 32, &d,
						 NULL, NULL), -ST_E_LIMIT);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_NVFP4, 32), 18);
	assert_int_equal(st_dtype_bytes(ST_DTYPE_E2M1_F16, 32), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtype_traits),
		cmocka_unit_test(test_e2m1_decode),
		cmocka_unit_test(test_e2m1_encode),
		cmocka_unit_test(test_e8m0_all),
		cmocka_unit_test(test_mxfp4_scale),
		cmocka_unit_test(test_mxfp4_zero_block),
		cmocka_unit_test(test_mxfp4_subnormal_scale),
		cmocka_unit_test(test_mxfp4_saturating_block),
		cmocka_unit_test(test_mxfp4_nibble_order),
		cmocka_unit_test(test_mxfp4_random_rows),
		cmocka_unit_test(test_mxfp4_nan_block),
		cmocka_unit_test(test_e4m3_decode_all),
		cmocka_unit_test(test_e4m3_encode),
		cmocka_unit_test(test_bf16),
		cmocka_unit_test(test_f16),
		cmocka_unit_test(test_convert_to_f32),
		cmocka_unit_test(test_nvfp4_global_scale),
		cmocka_unit_test(test_nvfp4_blocks),
		cmocka_unit_test(test_nvfp4_inverse_p8),
		cmocka_unit_test(test_nvfp4_random_rows),
		cmocka_unit_test(test_e2m1f16_scale),
		cmocka_unit_test(test_fp8_blocks),
		cmocka_unit_test(test_wformat),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
