/*
 * st_formats.c — number formats: dtype traits, F16/BF16, E2M1, E8M0, MXFP4,
 * FP8 E4M3 (see st_formats.h for the sources of every format).
 *
 * Every conversion here works on the IEEE bit patterns with integer
 * arithmetic, so results do not depend on the FPU rounding mode, on FMA
 * contraction or on libm; rounding is always to nearest, ties to even.
 */
#include "st_formats.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "st_error.h"
#include "st_util.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "strata reads little-endian tensor data in place: little-endian hosts only"
#endif

_Static_assert(sizeof(float) == 4, "float must be IEEE binary32");
_Static_assert(sizeof(uint32_t) == sizeof(float), "float/uint32 punning");

/* MXFP4 block: 32 E2M1 codes packed two per byte, plus one E8M0 scale. */
#define MXFP4_CODE_BYTES (ST_MXFP4_BLOCK / 2)
#define MXFP4_BLOCK_BYTES (MXFP4_CODE_BYTES + 1)
_Static_assert(ST_MXFP4_BLOCK % 2 == 0, "two E2M1 codes per byte");
_Static_assert(MXFP4_BLOCK_BYTES == 17, "OCP MX: 32 x 4 bits + 8-bit scale");
/* NVFP4 block: 16 E2M1 codes plus one E4M3 scale. */
#define NVFP4_CODE_BYTES (ST_NVFP4_BLOCK / 2)
#define NVFP4_BLOCK_BYTES (NVFP4_CODE_BYTES + 1)
_Static_assert(NVFP4_BLOCK_BYTES == 9, "NVFP4: 16 x 4 bits + 8-bit scale");

static const struct st_dtype_traits dtype_traits[] = {
	[ST_DTYPE_F32]     = { "F32",     1, 4 },
	[ST_DTYPE_F16]     = { "F16",     1, 2 },
	[ST_DTYPE_BF16]    = { "BF16",    1, 2 },
	[ST_DTYPE_F8_E4M3] = { "F8_E4M3", 1, 1 },
	[ST_DTYPE_U8]      = { "U8",      1, 1 },
	[ST_DTYPE_I8]      = { "I8",      1, 1 },
	[ST_DTYPE_I32]     = { "I32",     1, 4 },
	[ST_DTYPE_I64]     = { "I64",     1, 8 },
	[ST_DTYPE_MXFP4]   = { "MXFP4",   ST_MXFP4_BLOCK, MXFP4_BLOCK_BYTES },
	[ST_DTYPE_NVFP4]   = { "NVFP4",   ST_NVFP4_BLOCK, NVFP4_BLOCK_BYTES },
	[ST_DTYPE_E2M1_F16] = { "E2M1_F16", 0, 0 }, /* group is a parameter */
	[ST_DTYPE_F8_E8M0] = { "F8_E8M0", 1, 1 },
};
_Static_assert(ST_ARRAY_SIZE(dtype_traits) == ST_DTYPE_COUNT,
	       "one traits row per dtype");
_Static_assert(ST_DTYPE_F32 == 0, "traits table is indexed from 0");

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_f32(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

const struct st_dtype_traits *st_dtype_traits(enum st_dtype dt)
{
	if ((unsigned)dt >= ST_DTYPE_COUNT)
		return NULL;
	return &dtype_traits[dt];
}

int st_dtype_from_name(const char *name, enum st_dtype *ret)
{
	if (!name)
		return -ST_E_UNSUPPORTED;
	for (int i = 0; i < ST_DTYPE_COUNT; i++) {
		if (strcmp(dtype_traits[i].name, name) == 0) {
			if (ret)
				*ret = (enum st_dtype)i;
			return 0;
		}
	}
	return -ST_E_UNSUPPORTED;
}

uint64_t st_dtype_bytes(enum st_dtype dt, uint64_t n_elems)
{
	const struct st_dtype_traits *t = st_dtype_traits(dt);
	uint64_t n_blocks;

	if (!t || !t->block_elems || n_elems % t->block_elems)
		return 0;
	n_blocks = n_elems / t->block_elems;
	if (n_blocks > UINT64_MAX / t->block_bytes)
		return 0;
	return n_blocks * t->block_bytes;
}

/* --- BF16 / F16 --- */

float st_bf16_to_f32(uint16_t h)
{
	return bits_f32((uint32_t)h << 16);
}

uint16_t st_f32_to_bf16(float f)
{
	uint32_t u = f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign, force quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* RNE on the 16 dropped bits; a carry into the exponent is correct
	 * (up to infinity for values above the largest BF16). */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float st_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t mant = h & 0x3ffu;

	if (exp == 0x1f) /* inf / NaN (payload kept) */
		return bits_f32(sign | 0x7f800000u | (mant << 13));
	if (exp == 0) {
		if (mant == 0)
			return bits_f32(sign);
		/* subnormal: mant * 2^-24, exact in binary32 */
		float v = (float)mant * 0x1p-24f;
		return sign ? -v : v;
	}
	return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* Rounds m >> shift to nearest, ties to even (shift in 1..31). */
static uint32_t shift_rne(uint32_t m, unsigned shift)
{
	uint32_t q = m >> shift;
	uint32_t rem = m & ((1u << shift) - 1u);
	uint32_t half = 1u << (shift - 1);

	if (rem > half || (rem == half && (q & 1u)))
		q++;
	return q;
}

uint16_t st_f32_to_f16(float f)
{
	uint32_t u = f32_bits(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	uint32_t a = u & 0x7fffffffu;

	if (a > 0x7f800000u) /* NaN: quiet, keep top payload bits */
		return sign | 0x7e00u | (uint16_t)((a >> 13) & 0x1ffu);
	/* 65520 = halfway between 65504 (max, odd mantissa) and 2^16: RNE
	 * goes up, to infinity. */
	if (a >= 0x477ff000u)
		return sign | 0x7c00u;
	if (a < 0x38800000u) { /* below 2^-14: F16 subnormal or zero */
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;
		/* value = m * 2^(e-150); in units of 2^-24: m >> (126 - e) */
		if (e < 102) /* < 2^-25: rounds to 0 (2^-25 is a tie to 0) */
			return sign;
		return sign | (uint16_t)shift_rne(m, 126 - e);
	}
	/* normal: rebias exponent 127 -> 15 and round 23 -> 10 bits */
	return sign | (uint16_t)shift_rne(a - 0x38000000u, 13);
}

/* --- E2M1 --- */

static const float e2m1_values[8] = { 0.0f, 0.5f, 1.0f, 1.5f,
				      2.0f, 3.0f, 4.0f, 6.0f };

float st_e2m1_to_f32(uint8_t code)
{
	float v = e2m1_values[code & 7u];

	return (code & 8u) ? -v : v;
}

uint8_t st_f32_to_e2m1(float x)
{
	uint8_t sign;
	float a;
	uint8_t c;

	if (isnan(x))
		return 0;
	sign = signbit(x) ? 8u : 0u;
	a = fabsf(x);
	/* Midpoints between neighbours; at a midpoint the even code wins
	 * (codes 0, 2, 4, 6 have mantissa bit 0), so <= where the lower
	 * neighbour is even and < where it is odd. */
	if (a <= 0.25f)
		c = 0;
	else if (a < 0.75f)
		c = 1;
	else if (a <= 1.25f)
		c = 2;
	else if (a < 1.75f)
		c = 3;
	else if (a <= 2.5f)
		c = 4;
	else if (a < 3.5f)
		c = 5;
	else if (a <= 5.0f)
		c = 6;
	else
		c = 7; /* saturate, inf included */
	return sign | c;
}

/* --- E8M0 --- */

float st_e8m0_to_f32(uint8_t b)
{
	if (b == 255)
		return NAN;
	if (b == 0)
		return bits_f32(0x00400000u); /* 2^-127: binary32 subnormal */
	return bits_f32((uint32_t)b << 23);
}

/* floor(log2(a)) of a finite a > 0, exactly from the bits. */
static int f32_floor_log2(float a)
{
	uint32_t u = f32_bits(a) & 0x7fffffffu;
	uint32_t e = u >> 23;

	if (e != 0)
		return (int)e - 127;
	/* subnormal: m * 2^-149 */
	return (31 - __builtin_clz(u)) - 149;
}

uint8_t st_mxfp4_scale_for_amax(float amax)
{
	int b;

	if (isnan(amax))
		return 255;
	amax = fabsf(amax);
	if (amax == 0.0f)
		return 0;
	if (isinf(amax))
		return 254;
	b = f32_floor_log2(amax) - 2 + 127;
	if (b < 0)
		b = 0;
	if (b > 254)
		b = 254;
	return (uint8_t)b;
}

/* --- MXFP4 --- */

int st_mxfp4_quantize_row(const float *x, size_t n, uint8_t *ret_codes,
			  uint8_t *ret_scales)
{
	if (n % ST_MXFP4_BLOCK)
		return -EINVAL;
	for (size_t blk = 0; blk < n / ST_MXFP4_BLOCK; blk++) {
		const float *xb = x + blk * ST_MXFP4_BLOCK;
		uint8_t *cb = ret_codes + blk * MXFP4_CODE_BYTES;
		float amax = 0.0f;
		int has_nan = 0;
		uint8_t s;

		for (int i = 0; i < ST_MXFP4_BLOCK; i++) {
			if (isnan(xb[i]))
				has_nan = 1;
			else if (fabsf(xb[i]) > amax)
				amax = fabsf(xb[i]);
		}
		s = has_nan ? 255 : st_mxfp4_scale_for_amax(amax);
		ret_scales[blk] = s;
		if (s == 255) { /* NaN scale: the whole block reads as NaN */
			memset(cb, 0, MXFP4_CODE_BYTES);
			continue;
		}
		/* x / 2^(s-127) == x * 2^(127-s) exactly: a power-of-two
		 * scaling by ldexpf, never a division by a subnormal scale.
		 * Results are >= 2^-149 * 2^(127-s) or they underflow only
		 * when far below 0.25, where E2M1 gives 0 anyway. */
		for (int j = 0; j < MXFP4_CODE_BYTES; j++) {
			uint8_t lo = st_f32_to_e2m1(ldexpf(xb[2 * j], 127 - s));
			uint8_t hi = st_f32_to_e2m1(ldexpf(xb[2 * j + 1],
							   127 - s));
			cb[j] = (uint8_t)(lo | (hi << 4));
		}
	}
	return 0;
}

int st_mxfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			    size_t n, enum st_fp4_layout layout, float *out)
{
	if (n % ST_MXFP4_BLOCK)
		return -EINVAL;
	if (layout != ST_FP4_LAYOUT_OCP && layout != ST_FP4_LAYOUT_GGUF)
		return -EINVAL;
	for (size_t blk = 0; blk < n / ST_MXFP4_BLOCK; blk++) {
		const uint8_t *cb = codes + blk * MXFP4_CODE_BYTES;
		float *ob = out + blk * ST_MXFP4_BLOCK;
		float s = st_e8m0_to_f32(scales[blk]);

		for (int j = 0; j < MXFP4_CODE_BYTES; j++) {
			float lo = st_e2m1_to_f32(cb[j] & 0x0f) * s;
			float hi = st_e2m1_to_f32(cb[j] >> 4) * s;

			if (layout == ST_FP4_LAYOUT_OCP) {
				ob[2 * j] = lo;
				ob[2 * j + 1] = hi;
			} else {
				ob[j] = lo;
				ob[j + MXFP4_CODE_BYTES] = hi;
			}
		}
	}
	return 0;
}

/* --- FP8 E4M3 (OFP8) --- */

float st_e4m3_to_f32(uint8_t b)
{
	uint32_t e = (b >> 3) & 0xfu;
	uint32_t m = b & 7u;
	float v;

	if (e == 15 && m == 7)
		return (b & 0x80u) ? -NAN : NAN;
	if (e == 0)
		v = (float)m * 0x1p-9f; /* m/8 * 2^-6 */
	else
		v = bits_f32(((e + 120u) << 23) | (m << 20));
	return (b & 0x80u) ? -v : v;
}

uint8_t st_f32_to_e4m3_sat(float x)
{
	uint32_t u = f32_bits(x);
	uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
	uint32_t a = u & 0x7fffffffu;
	uint32_t code;

	if (a > 0x7f800000u)
		return 0x7f;
	if (a >= 0x43e00000u) /* >= 448 (inf too): saturate */
		return sign | 0x7e;
	if (a < 0x3c800000u) { /* below 2^-6: subnormal, units of 2^-9 */
		uint32_t e = a >> 23;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;

		/* value = m * 2^(e-150); in units of 2^-9: m >> (141 - e) */
		if (e < 116) /* < 2^-11 = a quarter unit: rounds to 0 */
			return sign;
		return sign | (uint8_t)shift_rne(m, 141 - e);
	}
	/* normal: rebias 127 -> 7, keep 3 mantissa bits */
	code = shift_rne(a - (120u << 23), 20);
	if (code > 0x7e) /* cannot happen below 448; kept as a guard */
		code = 0x7e;
	return sign | (uint8_t)code;
}

int st_convert_to_f32(enum st_dtype dt, const void *src, size_t n, float *out)
{
	const uint8_t *p = src;

	switch (dt) {
	case ST_DTYPE_F32:
		memcpy(out, src, n * sizeof(float));
		return 0;
	case ST_DTYPE_F16:
		for (size_t i = 0; i < n; i++)
			out[i] = st_f16_to_f32((uint16_t)(p[2 * i] |
							 (p[2 * i + 1] << 8)));
		return 0;
	case ST_DTYPE_BF16:
		for (size_t i = 0; i < n; i++)
			out[i] = st_bf16_to_f32((uint16_t)(p[2 * i] |
							  (p[2 * i + 1] << 8)));
		return 0;
	case ST_DTYPE_F8_E4M3:
		for (size_t i = 0; i < n; i++)
			out[i] = st_e4m3_to_f32(p[i]);
		return 0;
	default:
		return -ST_E_UNSUPPORTED;
	}
}

/* --- NVFP4 --- */

float st_nvfp4_global_scale(float amax_tensor)
{
	if (!(amax_tensor > 0.0f) || isinf(amax_tensor))
		return 1.0f;
	/* 6 * 448 = 2688 is exact; one float32 division */
	return amax_tensor / 2688.0f;
}

/* Largest magnitude of n floats; sets *ret_nan when one is NaN. */
static float block_amax(const float *x, size_t n, int *ret_nan)
{
	float amax = 0.0f;

	*ret_nan = 0;
	for (size_t i = 0; i < n; i++) {
		if (isnan(x[i]))
			*ret_nan = 1;
		else if (fabsf(x[i]) > amax)
			amax = fabsf(x[i]);
	}
	return amax;
}

int st_nvfp4_quantize_row(const float *x, size_t n, float global,
			  uint8_t *ret_codes, uint8_t *ret_scales)
{
	if (n % ST_NVFP4_BLOCK || !(global > 0.0f) || isinf(global))
		return -EINVAL;
	for (size_t blk = 0; blk < n / ST_NVFP4_BLOCK; blk++) {
		const float *xb = x + blk * ST_NVFP4_BLOCK;
		uint8_t *cb = ret_codes + blk * NVFP4_CODE_BYTES;
		int has_nan;
		float amax = block_amax(xb, ST_NVFP4_BLOCK, &has_nan);
		uint8_t s;
		float d;

		if (has_nan) {
			ret_scales[blk] = 0x7f;
			memset(cb, 0, NVFP4_CODE_BYTES);
			continue;
		}
		s = st_f32_to_e4m3_sat((amax / 6.0f) / global);
		ret_scales[blk] = s;
		d = st_e4m3_to_f32(s) * global;
		if (d == 0.0f) { /* scale 0 (or underflow): the block reads 0 */
			memset(cb, 0, NVFP4_CODE_BYTES);
			continue;
		}
		for (int j = 0; j < NVFP4_CODE_BYTES; j++) {
			uint8_t lo = st_f32_to_e2m1(xb[2 * j] / d);
			uint8_t hi = st_f32_to_e2m1(xb[2 * j + 1] / d);

			cb[j] = (uint8_t)(lo | (hi << 4));
		}
	}
	return 0;
}

int st_nvfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			    size_t n, float global, float *out)
{
	if (n % ST_NVFP4_BLOCK)
		return -EINVAL;
	for (size_t blk = 0; blk < n / ST_NVFP4_BLOCK; blk++) {
		const uint8_t *cb = codes + blk * NVFP4_CODE_BYTES;
		float *ob = out + blk * ST_NVFP4_BLOCK;
		float s = st_e4m3_to_f32(scales[blk]);

		for (int j = 0; j < NVFP4_CODE_BYTES; j++) {
			ob[2 * j] = (st_e2m1_to_f32(cb[j] & 0x0f) * s) * global;
			ob[2 * j + 1] = (st_e2m1_to_f32(cb[j] >> 4) * s) * global;
		}
	}
	return 0;
}

int st_nvfp4_dequantize_row_inv(const uint8_t *codes, const uint8_t *scales,
				size_t n, float global_inv, float *out)
{
	if (n % ST_NVFP4_BLOCK || global_inv == 0.0f || !isfinite(global_inv))
		return -EINVAL;
	for (size_t blk = 0; blk < n / ST_NVFP4_BLOCK; blk++) {
		const uint8_t *cb = codes + blk * NVFP4_CODE_BYTES;
		float *ob = out + blk * ST_NVFP4_BLOCK;
		float s = st_e4m3_to_f32(scales[blk]);

		for (int j = 0; j < NVFP4_CODE_BYTES; j++) {
			ob[2 * j] = (st_e2m1_to_f32(cb[j] & 0x0f) * s) /
				    global_inv;
			ob[2 * j + 1] = (st_e2m1_to_f32(cb[j] >> 4) * s) /
					global_inv;
		}
	}
	return 0;
}

/* --- E2M1 with FP16 group scales --- */

int st_e2m1f16_quantize_row(const float *x, size_t n, size_t group,
			    uint8_t *ret_codes, uint16_t *ret_scales)
{
	if (n % 2 || group == 0)
		return -EINVAL;
	memset(ret_codes, 0, n / 2);
	for (size_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
		size_t gn = ST_MIN(group, n - g0);
		int has_nan;
		float amax = block_amax(x + g0, gn, &has_nan), s;
		uint16_t h;

		if (has_nan) {
			ret_scales[gi] = 0x7e00;
			continue;
		}
		h = st_f32_to_f16(amax / 6.0f);
		if ((h & 0x7fffu) > 0x7bffu) /* overflow: largest finite */
			h = 0x7bff;
		ret_scales[gi] = h;
		s = st_f16_to_f32(h);
		if (s == 0.0f)
			continue; /* zero group: zero codes */
		for (size_t i = g0; i < g0 + gn; i++)
			ret_codes[i / 2] |= (uint8_t)(st_f32_to_e2m1(x[i] / s)
						      << (4 * (i & 1)));
	}
	return 0;
}

int st_e2m1f16_dequantize_row(const uint8_t *codes, const uint16_t *scales,
			      size_t n, size_t group, float *out)
{
	if (n % 2 || group == 0)
		return -EINVAL;
	for (size_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
		size_t gn = ST_MIN(group, n - g0);
		float s = st_f16_to_f32(scales[gi]);

		for (size_t i = g0; i < g0 + gn; i++)
			out[i] = st_e2m1_to_f32((uint8_t)(codes[i / 2] >>
							  (4 * (i & 1)))) * s;
	}
	return 0;
}

/* --- FP8 E4M3 with FP32 block scales --- */

int st_fp8_quantize_row(const float *x, size_t n, size_t block,
			uint8_t *ret_codes, float *ret_scales)
{
	if (block == 0)
		return -EINVAL;
	for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
		size_t bn = ST_MIN(block, n - b0);
		int has_nan;
		float amax = block_amax(x + b0, bn, &has_nan), s;

		memset(ret_codes + b0, 0, bn);
		if (has_nan) {
			ret_scales[bi] = NAN;
			continue;
		}
		if (isinf(amax))
			amax = FLT_MAX;
		s = amax / 448.0f;
		ret_scales[bi] = s;
		if (s == 0.0f)
			continue;
		for (size_t i = b0; i < b0 + bn; i++)
			ret_codes[i] = st_f32_to_e4m3_sat(x[i] / s);
	}
	return 0;
}

int st_fp8_dequantize_row(const uint8_t *codes, const float *scales, size_t n,
			  size_t block, float *out)
{
	if (block == 0)
		return -EINVAL;
	for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
		size_t bn = ST_MIN(block, n - b0);

		for (size_t i = b0; i < b0 + bn; i++)
			out[i] = st_e4m3_to_f32(codes[i]) * scales[bi];
	}
	return 0;
}

/* --- expert weight formats ----------------------------------------------- */

enum st_scale_type st_wformat_scale_type(enum st_dtype dt)
{
	switch (dt) {
	case ST_DTYPE_MXFP4: return ST_SCALE_E8M0;
	case ST_DTYPE_NVFP4: return ST_SCALE_E4M3;
	case ST_DTYPE_E2M1_F16: return ST_SCALE_F16;
	case ST_DTYPE_F8_E4M3: return ST_SCALE_F32;
	default: return ST_SCALE_NONE;
	}
}

const char *st_scale_type_name(enum st_scale_type t)
{
	switch (t) {
	case ST_SCALE_E8M0: return "e8m0";
	case ST_SCALE_E4M3: return "e4m3";
	case ST_SCALE_F16: return "f16";
	case ST_SCALE_F32: return "f32";
	default: return NULL;
	}
}

const char *st_wformat_base_name(enum st_dtype dt)
{
	switch (dt) {
	case ST_DTYPE_F32: return "f32";
	case ST_DTYPE_BF16: return "bf16";
	case ST_DTYPE_MXFP4: return "mxfp4";
	case ST_DTYPE_NVFP4: return "nvfp4";
	case ST_DTYPE_E2M1_F16: return "e2m1";
	case ST_DTYPE_F8_E4M3: return "fp8";
	default: return NULL;
	}
}

int st_wformat_check(const struct st_wformat *f)
{
	if (!f)
		return -EINVAL;
	switch (f->dtype) {
	case ST_DTYPE_F32:
	case ST_DTYPE_BF16:
		return f->group == 0 ? 0 : -EINVAL;
	case ST_DTYPE_MXFP4:
		return f->group == ST_MXFP4_BLOCK ? 0 : -EINVAL;
	case ST_DTYPE_NVFP4:
		return f->group == ST_NVFP4_BLOCK ? 0 : -EINVAL;
	case ST_DTYPE_E2M1_F16:
		return f->group >= 2 && f->group <= ST_WFORMAT_MAX_GROUP &&
			       f->group % 2 == 0 ? 0 : -EINVAL;
	case ST_DTYPE_F8_E4M3:
		return f->group >= 1 && f->group <= ST_WFORMAT_MAX_GROUP ? 0 :
									 -EINVAL;
	default:
		return -EINVAL;
	}
}

/* Parses the decimal number after `prefix` in s ("e2m1-g" "32"): the
 * whole rest must be digits, no sign, no leading zero, <= 65536. */
static int parse_suffix_num(const char *s, const char *prefix, uint32_t *ret)
{
	size_t pl = strlen(prefix);
	uint32_t v = 0;

	if (strncmp(s, prefix, pl))
		return -1;
	s += pl;
	if (*s < '1' || *s > '9')
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (uint32_t)(*s - '0');
		if (v > ST_WFORMAT_MAX_GROUP)
			return -1;
	}
	*ret = v;
	return 0;
}

int st_wformat_parse(const char *s, struct st_wformat *ret)
{
	struct st_wformat f = { ST_DTYPE_F32, 0 };

	if (!s)
		return -EINVAL;
	if (!strcmp(s, "f32"))
		f.dtype = ST_DTYPE_F32;
	else if (!strcmp(s, "bf16"))
		f.dtype = ST_DTYPE_BF16;
	else if (!strcmp(s, "mxfp4"))
		f = (struct st_wformat){ ST_DTYPE_MXFP4, ST_MXFP4_BLOCK };
	else if (!strcmp(s, "nvfp4"))
		f = (struct st_wformat){ ST_DTYPE_NVFP4, ST_NVFP4_BLOCK };
	else if (!strcmp(s, "fp8"))
		f = (struct st_wformat){ ST_DTYPE_F8_E4M3, ST_FP8_DEFAULT_BLOCK };
	else if (!parse_suffix_num(s, "fp8-b", &f.group))
		f.dtype = ST_DTYPE_F8_E4M3;
	else if (!parse_suffix_num(s, "e2m1-g", &f.group))
		f.dtype = ST_DTYPE_E2M1_F16;
	else
		return -EINVAL;
	if (st_wformat_check(&f))
		return -EINVAL;
	*ret = f;
	return 0;
}

int st_wformat_name(const struct st_wformat *f, char *buf, size_t len)
{
	int n;

	if (st_wformat_check(f))
		return -EINVAL;
	if (f->dtype == ST_DTYPE_E2M1_F16)
		n = snprintf(buf, len, "e2m1-g%u", f->group);
	else if (f->dtype == ST_DTYPE_F8_E4M3 &&
		 f->group != ST_FP8_DEFAULT_BLOCK)
		n = snprintf(buf, len, "fp8-b%u", f->group);
	else
		n = snprintf(buf, len, "%s", st_wformat_base_name(f->dtype));
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int st_wformat_matrix_bytes(const struct st_wformat *f, int64_t rows,
			    int64_t cols, uint64_t *ret_data_bytes,
			    uint64_t *ret_scale_bytes,
			    uint64_t *ret_tensor_scale_bytes)
{
	const uint64_t limit = UINT64_C(1) << 62;
	uint64_t n, data, n_scales = 0, scale_bytes = 0, tensor = 0;

	if (st_wformat_check(f) || rows < 1 || cols < 1)
		return -EINVAL;
	/* rows, cols < 2^31 each keeps every product below 2^62 + a bit */
	if (rows > INT32_MAX || cols > INT32_MAX)
		return -ST_E_LIMIT;
	n = (uint64_t)rows * (uint64_t)cols;
	if (f->group)
		n_scales = (uint64_t)rows *
			   (((uint64_t)cols + f->group - 1) / f->group);
	switch (f->dtype) {
	case ST_DTYPE_F32:
		data = n * 4;
		break;
	case ST_DTYPE_BF16:
		data = n * 2;
		break;
	case ST_DTYPE_MXFP4:
	case ST_DTYPE_NVFP4:
		if (cols % f->group)
			return -ST_E_UNSUPPORTED;
		data = n / 2;
		scale_bytes = n_scales;
		tensor = f->dtype == ST_DTYPE_NVFP4 ? 4 : 0;
		break;
	case ST_DTYPE_E2M1_F16:
		if (cols % 2)
			return -ST_E_UNSUPPORTED;
		data = n / 2;
		scale_bytes = n_scales * 2;
		break;
	default: /* ST_DTYPE_F8_E4M3 */
		data = n;
		scale_bytes = n_scales * 4;
		break;
	}
	if (data > limit || scale_bytes > limit)
		return -ST_E_LIMIT;
	if (ret_data_bytes)
		*ret_data_bytes = data;
	if (ret_scale_bytes)
		*ret_scale_bytes = scale_bytes;
	if (ret_tensor_scale_bytes)
		*ret_tensor_scale_bytes = tensor;
	return 0;
}

/* --- scale search (MSE) -------------------------------------------------- */

/*
 * Every candidate scale of a block is scored by the squared error of the
 * block as the dequantizer reads it back: sum over i of (x_i - deq_i)^2,
 * deq_i the float32 value st_*_dequantize_row gives for the code the
 * quantizer writes under that scale, differences and sum in double in
 * element order (deterministic).  The lowest sum wins; ties keep the plain
 * scale, then the smaller scale.  Blocks holding a NaN or an infinity are
 * left to the plain quantizer.
 */

int st_scale_search_parse(const char *s, enum st_scale_search *ret)
{
	if (!s)
		return -EINVAL;
	if (!strcmp(s, "none"))
		*ret = ST_SCALE_SEARCH_NONE;
	else if (!strcmp(s, "mse"))
		*ret = ST_SCALE_SEARCH_MSE;
	else if (!strcmp(s, "cal") || !strcmp(s, "calibrated"))
		*ret = ST_SCALE_SEARCH_CALIBRATED;
	else if (!strcmp(s, "gptq"))
		*ret = ST_SCALE_SEARCH_GPTQ;
	else
		return -EINVAL;
	return 0;
}

const char *st_scale_search_name(enum st_scale_search s)
{
	switch (s) {
	case ST_SCALE_SEARCH_NONE: return "none";
	case ST_SCALE_SEARCH_MSE: return "mse";
	case ST_SCALE_SEARCH_CALIBRATED: return "calibrated";
	case ST_SCALE_SEARCH_GPTQ: return "gptq";
	default: return NULL;
	}
}

/* Grid factor k of ST_SCALE_GRID_N: (80 + k) / 100 in float32. */
static float grid_factor(int k)
{
	return (float)(ST_SCALE_GRID_LO + k) / 100.0f;
}

/* Whether candidate (sse, scale) beats the best so far (best_sse,
 * best_scale): lower error; on equal error the plain scale stays, and
 * between two non-plain candidates the smaller scale wins. */
static int better(double sse, double scale, double best_sse,
		  double best_scale, int best_is_plain)
{
	if (sse < best_sse)
		return 1;
	if (sse > best_sse || best_is_plain)
		return 0;
	return scale < best_scale;
}

static int all_finite(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return 0;
	return 1;
}

/*
 * A block scale format for the grid search: encode() rounds a wanted scale
 * value to the format's code (as the plain quantizer would), decode() gives
 * a code's value, sse() the block's squared error under a code (`extra`:
 * NVFP4's tensor scale).  Codes are held in uint32_t (E4M3 bytes, FP16
 * halves, FP32 bits).
 */
struct scale_codec {
	uint32_t (*encode)(float v);
	float (*decode)(uint32_t code);
	double (*sse)(const float *x, const float *w, size_t n, uint32_t code,
		      float extra);
	int (*usable)(uint32_t code); /* may be NULL: every code */
};

/* Tries the plain code and base * grid_factor(k) for every k; returns the
 * code with the least squared error (ties: plain, then the smaller scale).
 * The one search loop of the FP16, E4M3 and FP32 scale formats. */
static uint32_t grid_search(const struct scale_codec *c, const float *x,
			    const float *w, size_t n, float base,
			    uint32_t plain, float extra)
{
	uint32_t best = plain;
	double best_sse = c->sse(x, w, n, plain, extra);

	for (int k = 0; k < ST_SCALE_GRID_N; k++) {
		uint32_t code = c->encode(base * grid_factor(k));
		double sse;

		if (code == best || code == plain ||
		    (c->usable && !c->usable(code)))
			continue;
		sse = c->sse(x, w, n, code, extra);
		if (better(sse, c->decode(code), best_sse, c->decode(best),
			   best == plain)) {
			best_sse = sse;
			best = code;
		}
	}
	return best;
}

static double nvfp4_sse(const float *xb, const float *wb, size_t n, uint32_t s,
			float global);
static double e2m1f16_sse(const float *xg, const float *wg, size_t gn,
			  uint32_t h, float unused);

/* Weight of element i: w[i], or 1 without weights (then the sums are
 * exactly the unweighted ones: d * d * 1.0 == d * d). */
static double wt(const float *w, size_t i)
{
	return w ? (double)w[i] : 1.0;
}

/* 0 when w is NULL or every w[i] is finite and >= 0, else -EINVAL. */
static int weights_ok(const float *w, size_t n)
{
	for (size_t i = 0; w && i < n; i++)
		if (!(w[i] >= 0.0f) || isinf(w[i]))
			return -EINVAL;
	return 0;
}

/* The FP16 group scale for a target value v > 0 as the plain quantizer
 * rounds it (nearest-even, clamped to 65504). */
static uint32_t f16_scale(float v)
{
	uint16_t h = st_f32_to_f16(v);

	return (h & 0x7fffu) > 0x7bffu ? 0x7bff : h;
}

static float f16_value(uint32_t h)
{
	return st_f16_to_f32((uint16_t)h);
}

static uint32_t e4m3_code(float v)
{
	return st_f32_to_e4m3_sat(v);
}

static float e4m3_value(uint32_t b)
{
	return st_e4m3_to_f32((uint8_t)b);
}

static const struct scale_codec k_f16_codec = {
	f16_scale, f16_value, e2m1f16_sse, NULL
};
static const struct scale_codec k_e4m3_codec = {
	e4m3_code, e4m3_value, nvfp4_sse, NULL
};

/* Squared error of an MXFP4 block under scale byte s (0..254). */
static double mxfp4_sse(const float *xb, const float *wb, uint8_t s)
{
	float sc = st_e8m0_to_f32(s);
	double sse = 0.0;

	for (int i = 0; i < ST_MXFP4_BLOCK; i++) {
		float q = st_e2m1_to_f32(st_f32_to_e2m1(ldexpf(xb[i], 127 - s)));
		double d = (double)xb[i] - (double)(q * sc);

		sse += wt(wb, (size_t)i) * (d * d);
	}
	return sse;
}

int st_mxfp4_quantize_row_mse(const float *x, size_t n, uint8_t *ret_codes,
			      uint8_t *ret_scales)
{
	return st_mxfp4_quantize_row_wmse(x, NULL, n, ret_codes, ret_scales);
}

int st_mxfp4_quantize_row_wmse(const float *x, const float *w, size_t n,
			       uint8_t *ret_codes, uint8_t *ret_scales)
{
	int r = weights_ok(w, n);

	if (!r)
		r = st_mxfp4_quantize_row(x, n, ret_codes, ret_scales);
	if (r)
		return r;
	for (size_t blk = 0; blk < n / ST_MXFP4_BLOCK; blk++) {
		const float *xb = x + blk * ST_MXFP4_BLOCK;
		const float *wb = w ? w + blk * ST_MXFP4_BLOCK : NULL;
		uint8_t *cb = ret_codes + blk * MXFP4_CODE_BYTES;
		uint8_t plain = ret_scales[blk], best = plain;
		double best_sse;

		if (plain == 255 || plain == 0 ||
		    !all_finite(xb, ST_MXFP4_BLOCK))
			continue; /* NaN/inf or zero/tiny block: plain */
		best_sse = mxfp4_sse(xb, wb, plain);
		for (int dlt = -1; dlt <= 1; dlt += 2) {
			int s = (int)plain + dlt;
			double sse;

			if (s < 0 || s > 254)
				continue;
			sse = mxfp4_sse(xb, wb, (uint8_t)s);
			if (better(sse, s, best_sse, best, best == plain)) {
				best_sse = sse;
				best = (uint8_t)s;
			}
		}
		if (best == plain)
			continue;
		ret_scales[blk] = best;
		for (int j = 0; j < MXFP4_CODE_BYTES; j++) {
			uint8_t lo = st_f32_to_e2m1(ldexpf(xb[2 * j], 127 - best));
			uint8_t hi = st_f32_to_e2m1(ldexpf(xb[2 * j + 1],
							   127 - best));
			cb[j] = (uint8_t)(lo | (hi << 4));
		}
	}
	return 0;
}

/* Weighted squared error of n elements coded as E2M1 with the scale
 * sb * global (dequantized as (q * sb) * global; global = 1 for a single
 * scale level). */
static double e2m1_scaled_sse(const float *xb, const float *wb, size_t n,
			      float sb, float global)
{
	float d = sb * global;
	double sse = 0.0;

	for (size_t i = 0; i < n; i++) {
		float q = d == 0.0f ? 0.0f :
				      st_e2m1_to_f32(st_f32_to_e2m1(xb[i] / d));
		double e = (double)xb[i] - (double)((q * sb) * global);

		sse += wt(wb, i) * (e * e);
	}
	return sse;
}

/* Squared error of an NVFP4 block (n = 16) under E4M3 scale byte s. */
static double nvfp4_sse(const float *xb, const float *wb, size_t n, uint32_t s,
			float global)
{
	return e2m1_scaled_sse(xb, wb, n, st_e4m3_to_f32((uint8_t)s), global);
}

int st_nvfp4_quantize_row_mse(const float *x, size_t n, float global,
			      uint8_t *ret_codes, uint8_t *ret_scales)
{
	return st_nvfp4_quantize_row_wmse(x, NULL, n, global, ret_codes,
					  ret_scales);
}

int st_nvfp4_quantize_row_wmse(const float *x, const float *w, size_t n,
			       float global, uint8_t *ret_codes,
			       uint8_t *ret_scales)
{
	int r = weights_ok(w, n);

	if (!r)
		r = st_nvfp4_quantize_row(x, n, global, ret_codes, ret_scales);
	if (r)
		return r;
	for (size_t blk = 0; blk < n / ST_NVFP4_BLOCK; blk++) {
		const float *xb = x + blk * ST_NVFP4_BLOCK;
		uint8_t *cb = ret_codes + blk * NVFP4_CODE_BYTES;
		uint8_t plain = ret_scales[blk], best;
		float base, d;
		int dummy;

		if (!all_finite(xb, ST_NVFP4_BLOCK))
			continue;
		base = (block_amax(xb, ST_NVFP4_BLOCK, &dummy) / 6.0f) / global;
		if (base == 0.0f)
			continue;
		best = (uint8_t)grid_search(&k_e4m3_codec, xb,
					    w ? w + blk * ST_NVFP4_BLOCK : NULL,
					    ST_NVFP4_BLOCK, base, plain, global);
		if (best == plain)
			continue;
		ret_scales[blk] = best;
		d = st_e4m3_to_f32(best) * global;
		for (int j = 0; j < NVFP4_CODE_BYTES; j++) {
			uint8_t lo = d == 0.0f ? 0 : st_f32_to_e2m1(xb[2 * j] / d);
			uint8_t hi = d == 0.0f ? 0 :
					 st_f32_to_e2m1(xb[2 * j + 1] / d);

			cb[j] = (uint8_t)(lo | (hi << 4));
		}
	}
	return 0;
}

/* Squared error of an E2M1 group of gn elements under FP16 scale h. */
static double e2m1f16_sse(const float *xg, const float *wg, size_t gn,
			  uint32_t h, float unused)
{
	(void)unused;
	return e2m1_scaled_sse(xg, wg, gn, st_f16_to_f32((uint16_t)h), 1.0f);
}

int st_e2m1f16_quantize_row_mse(const float *x, size_t n, size_t group,
				uint8_t *ret_codes, uint16_t *ret_scales)
{
	return st_e2m1f16_quantize_row_wmse(x, NULL, n, group, ret_codes,
					    ret_scales);
}

int st_e2m1f16_quantize_row_wmse(const float *x, const float *w, size_t n,
				 size_t group, uint8_t *ret_codes,
				 uint16_t *ret_scales)
{
	int r = weights_ok(w, n);

	if (!r)
		r = st_e2m1f16_quantize_row(x, n, group, ret_codes, ret_scales);
	if (r)
		return r;
	for (size_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
		size_t gn = ST_MIN(group, n - g0);
		const float *xg = x + g0;
		uint16_t plain = ret_scales[gi], best;
		float base, s;
		int dummy;

		if (!all_finite(xg, gn))
			continue;
		base = block_amax(xg, gn, &dummy) / 6.0f;
		if (base == 0.0f)
			continue;
		best = (uint16_t)grid_search(&k_f16_codec, xg,
					     w ? w + g0 : NULL, gn, base,
					     plain, 0.0f);
		if (best == plain)
			continue;
		ret_scales[gi] = best;
		s = st_f16_to_f32(best);
		for (size_t i = g0; i < g0 + gn; i++) {
			uint8_t c = s == 0.0f ? 0 : st_f32_to_e2m1(x[i] / s);

			ret_codes[i / 2] = (uint8_t)((ret_codes[i / 2] &
						      ~(0x0fu << (4 * (i & 1)))) |
						     (c << (4 * (i & 1))));
		}
	}
	return 0;
}

/* FP32 scales as codes: their bits. */
static uint32_t f32_code(float v)
{
	uint32_t u;

	memcpy(&u, &v, 4);
	return u;
}

static float f32_value(uint32_t u)
{
	float v;

	memcpy(&v, &u, 4);
	return v;
}

static int f32_usable(uint32_t u)
{
	float s = f32_value(u);

	return s > 0.0f && !isinf(s);
}

/* Squared error of an FP8 block of bn elements under FP32 scale s > 0. */
static double fp8_sse(const float *xb, const float *wb, size_t bn,
		      uint32_t bits, float unused)
{
	const float s = f32_value(bits);
	double sse = 0.0;

	for (size_t i = 0; i < bn; i++) {
		float q = st_e4m3_to_f32(st_f32_to_e4m3_sat(xb[i] / s));
		double e = (double)xb[i] - (double)(q * s);

		sse += wt(wb, i) * (e * e);
	}
	return sse;
}

int st_fp8_quantize_row_mse(const float *x, size_t n, size_t block,
			    uint8_t *ret_codes, float *ret_scales)
{
	int r = st_fp8_quantize_row(x, n, block, ret_codes, ret_scales);

	if (r)
		return r;
	for (size_t b0 = 0, bi = 0; b0 < n; b0 += block, bi++) {
		size_t bn = ST_MIN(block, n - b0);
		const float *xb = x + b0;
		static const struct scale_codec f32_codec = {
			f32_code, f32_value, fp8_sse, f32_usable
		};
		float plain = ret_scales[bi], best;

		if (!all_finite(xb, bn) || !(plain > 0.0f))
			continue;
		best = f32_value(grid_search(&f32_codec, xb, NULL, bn, plain,
					     f32_code(plain), 0.0f));
		if (best == plain)
			continue;
		ret_scales[bi] = best;
		for (size_t i = b0; i < b0 + bn; i++)
			ret_codes[i] = st_f32_to_e4m3_sat(x[i] / best);
	}
	return 0;
}
