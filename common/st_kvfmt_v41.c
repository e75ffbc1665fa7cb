/*
 * st_kvfmt_v41.c — DeepSeek-V4.1 KV formats and QAT round trips (see
 * st_kvfmt_v41.h).
 */
#include "st_kvfmt_v41.h"

#include <errno.h>
#include <math.h>

#include "st_formats.h"

size_t st_kv41_fp8_row_bytes(size_t n)
{
	return n + n / ST_KV41_FP8_BLOCK;
}

size_t st_kv41_crow_row_bytes(size_t n)
{
	return n / 2 + n / ST_KV41_CROW_BLOCK;
}

size_t st_kv41_idx_row_bytes(size_t n)
{
	return n / 2 + n / ST_KV41_IDX_BLOCK;
}

uint8_t st_kv41_ue8m0_ceil(double v)
{
	int e;
	double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
	int x = m == 0.5 ? e - 1 : e;

	x += 127;
	return (uint8_t)(x < 0 ? 0 : x > 254 ? 254 : x);
}

static double amax_of(const float *x, size_t n, double floor_v)
{
	double a = floor_v;

	for (size_t i = 0; i < n; i++)
		if (fabs(x[i]) > a)
			a = fabs(x[i]);
	return a;
}

int st_kv41_fp8_encode(const float *x, size_t n, uint8_t *ret_codes,
		       uint8_t *ret_scales)
{
	if (n % ST_KV41_FP8_BLOCK)
		return -EINVAL;
	for (size_t b = 0; b < n / ST_KV41_FP8_BLOCK; b++) {
		const float *xb = x + b * ST_KV41_FP8_BLOCK;
		uint8_t s = st_kv41_ue8m0_ceil(amax_of(xb, ST_KV41_FP8_BLOCK,
						       1e-4) / 448.0);

		ret_scales[b] = s;
		for (int i = 0; i < ST_KV41_FP8_BLOCK; i++) {
			double v = ldexp(xb[i], 127 - s);

			v = v > 448 ? 448 : v < -448 ? -448 : v;
			ret_codes[b * ST_KV41_FP8_BLOCK + i] =
				st_f32_to_e4m3_sat((float)v);
		}
	}
	return 0;
}

int st_kv41_fp8_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
		       float *out)
{
	if (n % ST_KV41_FP8_BLOCK)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		out[i] = ldexpf(st_e4m3_to_f32(codes[i]),
				scales[i / ST_KV41_FP8_BLOCK] - 127);
	return 0;
}

/* E2M1 code of v (already divided by the scale), clamped to +-6. */
static uint8_t e2m1(double v)
{
	v = v > 6 ? 6 : v < -6 ? -6 : v;
	return st_f32_to_e2m1((float)v);
}

static void put_nibble(uint8_t *codes, size_t i, uint8_t c)
{
	if (i % 2)
		codes[i / 2] = (uint8_t)((codes[i / 2] & 0x0f) | (c << 4));
	else
		codes[i / 2] = (uint8_t)((codes[i / 2] & 0xf0) | c);
}

static uint8_t get_nibble(const uint8_t *codes, size_t i)
{
	return i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 0x0f;
}

int st_kv41_crow_encode(const float *x, size_t n, uint8_t *ret_codes,
			uint8_t *ret_scales)
{
	const size_t B = ST_KV41_CROW_BLOCK;

	if (n % B)
		return -EINVAL;
	for (size_t b = 0; b < n / B; b++) {
		const float *xb = x + b * B;
		double a = amax_of(xb, B, 6.0 * ldexp(1.0, -9));
		uint8_t sc = st_f32_to_e4m3_sat((float)(a / 6.0));
		double s = st_e4m3_to_f32(sc);

		ret_scales[b] = sc;
		for (size_t i = 0; i < B; i++)
			put_nibble(ret_codes, b * B + i, e2m1(xb[i] / s));
	}
	return 0;
}

int st_kv41_crow_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
			float *out)
{
	if (n % ST_KV41_CROW_BLOCK)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		out[i] = st_e2m1_to_f32(get_nibble(codes, i)) *
			 st_e4m3_to_f32(scales[i / ST_KV41_CROW_BLOCK]);
	return 0;
}

int st_kv41_idx_encode(const float *x, size_t n, uint8_t *ret_codes,
		       uint8_t *ret_scales)
{
	const size_t B = ST_KV41_IDX_BLOCK;

	if (n % B)
		return -EINVAL;
	for (size_t b = 0; b < n / B; b++) {
		const float *xb = x + b * B;
		uint8_t s = st_kv41_ue8m0_ceil(
			amax_of(xb, B, 6.0 * ldexp(1.0, -126)) / 6.0);

		ret_scales[b] = s;
		for (size_t i = 0; i < B; i++)
			put_nibble(ret_codes, b * B + i,
				   e2m1(ldexp(xb[i], 127 - s)));
	}
	return 0;
}

int st_kv41_idx_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
		       float *out)
{
	if (n % ST_KV41_IDX_BLOCK)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		out[i] = ldexpf(st_e2m1_to_f32(get_nibble(codes, i)),
				scales[i / ST_KV41_IDX_BLOCK] - 127);
	return 0;
}

/* encode then decode through a buffer on the stack (rows are at most a
 * few thousand elements) */
int st_kv41_fp8_roundtrip(float *x, size_t n)
{
	uint8_t c[n + n / ST_KV41_FP8_BLOCK + 1];
	int r = st_kv41_fp8_encode(x, n, c, c + n);

	return r < 0 ? r : st_kv41_fp8_decode(c, c + n, n, x);
}

int st_kv41_crow_roundtrip(float *x, size_t n)
{
	uint8_t c[n / 2 + n / ST_KV41_CROW_BLOCK + 1];
	int r = st_kv41_crow_encode(x, n, c, c + n / 2);

	return r < 0 ? r : st_kv41_crow_decode(c, c + n / 2, n, x);
}

int st_kv41_idx_roundtrip(float *x, size_t n)
{
	uint8_t c[n / 2 + n / ST_KV41_IDX_BLOCK + 1];
	int r = st_kv41_idx_encode(x, n, c, c + n / 2);

	return r < 0 ? r : st_kv41_idx_decode(c, c + n / 2, n, x);
}
