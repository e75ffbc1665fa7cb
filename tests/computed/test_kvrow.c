/*
 * test_kvrow.c — computed's KV row codec (cw_kvrow.h): F32 exact, F16/BF16
 * rounding, FP8 E4M3 with one scale per (row, KV head) against hand-computed
 * values (OFP8 spec: bias 7, max 448, saturating, never NaN; PITFALLS P9).
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cw_kvrow.h"

static void test_sizes(void **state)
{
	struct cw_kvrow_fmt f;

	(void)state;
	assert_int_equal(cw_kvrow_init(&f, ST_DTYPE_F32, 2, 16), 0);
	assert_int_equal(cw_kvrow_bytes(&f), 2 * 2 * 16 * 4);
	assert_int_equal(cw_kvrow_init(&f, ST_DTYPE_BF16, 2, 16), 0);
	assert_int_equal(cw_kvrow_bytes(&f), 2 * 2 * 16 * 2);
	/* FP8: 1 byte per value plus one float32 scale per head, K and V */
	assert_int_equal(cw_kvrow_init(&f, ST_DTYPE_F8_E4M3, 2, 16), 0);
	assert_int_equal(cw_kvrow_bytes(&f), 2 * 2 * 16 + 2 * 2 * 4);
	assert_int_equal(cw_kvrow_init(&f, ST_DTYPE_MXFP4, 2, 16), -EINVAL);
}

static void test_f32_f16_bf16(void **state)
{
	struct cw_kvrow_fmt f;
	float k[8] = { 1.0f, -2.5f, 3.140625f, 0, 1e-3f, 65504.0f, -7, 0.1f };
	float v[8], out[4];
	uint8_t row[128];

	(void)state;
	for (int i = 0; i < 8; i++)
		v[i] = -k[i];
	cw_kvrow_init(&f, ST_DTYPE_F32, 2, 4);
	cw_kvrow_write(&f, row, k, v);
	cw_kvrow_read_head(&f, row, 0, 1, out);
	assert_memory_equal(out, k + 4, 16);
	cw_kvrow_read_head(&f, row, 1, 0, out);
	assert_memory_equal(out, v, 16);
	/* F16: 1e-3 is not representable; nearest F16 is 0.0010004043... */
	cw_kvrow_init(&f, ST_DTYPE_F16, 2, 4);
	cw_kvrow_write(&f, row, k, v);
	cw_kvrow_read_head(&f, row, 0, 1, out);
	assert_true(fabsf(out[0] - 1e-3f) < 1e-6f && out[0] != 1e-3f);
	assert_true(out[1] == 65504.0f);
	/* BF16: 3.140625 is exact; 0.1 rounds to 0.10009765625 */
	cw_kvrow_init(&f, ST_DTYPE_BF16, 2, 4);
	cw_kvrow_write(&f, row, k, v);
	cw_kvrow_read_head(&f, row, 0, 0, out);
	assert_true(out[2] == 3.140625f);
	cw_kvrow_read_head(&f, row, 0, 1, out);
	assert_true(out[3] == 0.10009765625f);
}

static void test_fp8(void **state)
{
	struct cw_kvrow_fmt f;
	/* head 0: amax 4 -> scale 4/448; values / scale = 112, -224, 56, 448,
	 * all exact E4M3 numbers (1.75*2^6, -1.75*2^7, 1.75*2^5, 1.75*2^8),
	 * so they come back exactly.  head 1 all zero: scale 1, zeros. */
	float k[8] = { 1.0f, -2.0f, 0.5f, 4.0f, 0, 0, 0, 0 };
	float v[8] = { 0.3f, -0.7f, 1e-9f, 100.0f, 0, 0, 0, 0 };
	float out[4];
	uint8_t row[64];

	(void)state;
	cw_kvrow_init(&f, ST_DTYPE_F8_E4M3, 2, 4);
	cw_kvrow_write(&f, row, k, v);
	cw_kvrow_read_head(&f, row, 0, 0, out);
	for (int i = 0; i < 4; i++)
		assert_true(fabsf(out[i] - k[i]) <= 1e-6f * fabsf(k[i]));
	assert_int_equal(row[3], 0x7E); /* 448: the largest finite code */
	cw_kvrow_read_head(&f, row, 0, 1, out);
	for (int i = 0; i < 4; i++)
		assert_true(out[i] == 0.0f);
	/* V head 0: amax 100 -> 100 is exact; 0.3 and -0.7 within half an
	 * E4M3 step (relative 2^-4); 1e-9 flushes to 0 (below the smallest
	 * subnormal 2^-9 * scale) */
	cw_kvrow_read_head(&f, row, 1, 0, out);
	assert_true(fabsf(out[3] - 100.0f) < 1e-4f);
	assert_true(fabsf(out[0] - 0.3f) <= 0.3f / 16);
	assert_true(fabsf(out[1] + 0.7f) <= 0.7f / 16);
	assert_true(out[2] == 0.0f);
	/* no code is ever NaN (0x7F / 0xFF) */
	for (int i = 0; i < 16; i++)
		assert_true((row[i] & 0x7F) != 0x7F);
}

static void test_fp8_random_error(void **state)
{
	enum { H = 4, D = 64 };
	struct cw_kvrow_fmt f;
	static float k[H * D], v[H * D], out[D];
	static uint8_t row[2 * H * D + 2 * H * 4];
	uint32_t seed = 7;

	(void)state;
	cw_kvrow_init(&f, ST_DTYPE_F8_E4M3, H, D);
	for (int i = 0; i < H * D; i++) {
		seed = seed * 1664525u + 1013904223u;
		/* heads of very different magnitudes */
		k[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) *
		       powf(10.0f, (float)(i / D) - 2);
		v[i] = -k[i];
	}
	cw_kvrow_write(&f, row, k, v);
	for (int h = 0; h < H; h++) {
		float amax = 0, s;

		for (int i = 0; i < D; i++)
			amax = fmaxf(amax, fabsf(k[h * D + i]));
		s = amax / 448;
		cw_kvrow_read_head(&f, row, 0, h, out);
		/* E4M3 normal numbers: 3 mantissa bits, relative error at most
		 * 2^-4; subnormals: absolute error at most 2^-10 * scale */
		for (int i = 0; i < D; i++)
			assert_true(fabsf(out[i] - k[h * D + i]) <=
				    fmaxf(fabsf(k[h * D + i]) / 16, s * 0.0009766f));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sizes),
		cmocka_unit_test(test_f32_f16_bf16),
		cmocka_unit_test(test_fp8),
		cmocka_unit_test(test_fp8_random_error),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
