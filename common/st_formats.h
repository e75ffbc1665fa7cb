/*
 * st_formats.h — number formats and their codecs: F32/F16/BF16 conversion,
 * FP4 E2M1 elements, E8M0 scales, the MXFP4 block format, FP8 E4M3.
 *
 * Sources:
 *  - OCP Microscaling Formats (MX) Specification v1.0 (E2M1, E8M0, MXFP4:
 *    32-element blocks sharing one E8M0 scale).
 *  - OCP 8-bit Floating Point Specification (OFP8) v1.0 (E4M3: bias 7, max
 *    448, no infinities, S.1111.111 is NaN).
 *  - IEEE 754 binary16; bfloat16 = upper 16 bits of binary32.
 *
 * FP4 buffers are tagged with a nibble layout (PITFALLS P7):
 *  ST_FP4_LAYOUT_OCP   byte j holds element 2j in its low nibble and 2j+1 in
 *                      its high nibble (Hugging Face / OCP, gpt-oss *_blocks)
 *  ST_FP4_LAYOUT_GGUF  within a 32-element block, byte j holds element j in
 *                      its low nibble and element j+16 in its high nibble
 *                      (llama.cpp)
 * strata's store writes OCP layout; both decode through one function each.
 */
#ifndef ST_FORMATS_H
#define ST_FORMATS_H

#include <stddef.h>
#include <stdint.h>

/* Element dtypes of tensors (checkpoint and store). */
enum st_dtype {
	ST_DTYPE_F32 = 0,
	ST_DTYPE_F16,
	ST_DTYPE_BF16,
	ST_DTYPE_F8_E4M3,
	ST_DTYPE_U8,
	ST_DTYPE_I8,
	ST_DTYPE_I32,
	ST_DTYPE_I64,
	ST_DTYPE_MXFP4, /* packed: blocks of 32 E2M1 codes + one E8M0 scale */
	ST_DTYPE_COUNT
};

/* Traits of a dtype (table checked at compile time in st_formats.c).
 * MXFP4: 32 elements per 17-byte block (16 code bytes + 1 E8M0 scale). */
struct st_dtype_traits {
	const char *name;        /* safetensors spelling: "F32", "BF16", ... */
	uint32_t block_elems;    /* elements per block (1 for scalar types) */
	uint32_t block_bytes;    /* bytes per block (element bytes for scalars) */
};

/* Traits of `dt`, or NULL if out of range. */
const struct st_dtype_traits *st_dtype_traits(enum st_dtype dt);

/* Parses a dtype name: the safetensors spellings "F32", "F16", "BF16",
 * "F8_E4M3", "U8", "I8", "I32", "I64", and strata's own "MXFP4" (never valid
 * in a safetensors file; st_safetensors_parse refuses it).
 * Returns 0 and *ret, or -ST_E_UNSUPPORTED. */
int st_dtype_from_name(const char *name, enum st_dtype *ret);

/* Bytes occupied by n_elems elements of dt (n_elems must be a whole number
 * of blocks; returns 0 otherwise). */
uint64_t st_dtype_bytes(enum st_dtype dt, uint64_t n_elems);

/* --- scalar conversions --- */
float st_bf16_to_f32(uint16_t h);
/* Round to nearest even; NaN stays NaN (quiet). */
uint16_t st_f32_to_bf16(float f);
float st_f16_to_f32(uint16_t h);
/* Round to nearest even, overflow to inf, NaN stays NaN. */
uint16_t st_f32_to_f16(float f);

/* --- E2M1 (FP4) --- */
/* Value of a 4-bit E2M1 code (bit 3 sign, bits 2..1 exponent, bit 0
 * mantissa): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives (code 8 is -0). */
float st_e2m1_to_f32(uint8_t code);
/* Nearest E2M1 code to x, ties to the even code (by value: 0.25->0,
 * 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4), saturating at +-6
 * (inf included); NaN -> 0.  The sign is kept, so a negative x that rounds
 * to zero gives code 8 (-0). */
uint8_t st_f32_to_e2m1(float x);

/* --- E8M0 (MX block scale) --- */
/* 2^(byte-127); byte 0 is 2^-127 (a float32 subnormal), byte 255 is NaN
 * (PITFALLS P5). */
float st_e8m0_to_f32(uint8_t b);
/* The MXFP4 scale of a block with largest magnitude amax:
 * 2^(floor(log2(amax)) - 2) as E8M0 (PITFALLS P6), clamped to [0, 254];
 * amax == 0 (or subnormal-tiny) gives byte 0; NaN amax gives 255. */
uint8_t st_mxfp4_scale_for_amax(float amax);

/* --- MXFP4 --- */
#define ST_MXFP4_BLOCK 32
enum st_fp4_layout { ST_FP4_LAYOUT_OCP = 0, ST_FP4_LAYOUT_GGUF = 1 };

/*
 * Quantizes one row of n elements (n a multiple of 32) to MXFP4 in OCP
 * layout: codes (n/2 bytes) and scales (n/32 E8M0 bytes).  Per block of 32:
 * scale = st_mxfp4_scale_for_amax(max |x|), each element x / scale (computed
 * exactly as a power-of-two scaling, also for the subnormal scale 2^-127)
 * rounded by st_f32_to_e2m1 (ties to even, saturating at +-6).  A block
 * holding a NaN gets scale byte 255 and zero codes.
 * Returns 0 or -EINVAL if n % 32.
 */
int st_mxfp4_quantize_row(const float *x, size_t n, uint8_t *ret_codes,
			  uint8_t *ret_scales);

/*
 * Dequantizes n elements (multiple of 32) of MXFP4 in the given layout into
 * out[n] (float32).  codes holds n/2 bytes, scales n/32 E8M0 bytes.  Exact:
 * every product code*scale is a binary32 value (down to 0.5 * 2^-127),
 * except that codes +-4/+-6 with scale bytes 253/254 overflow to +-inf (the
 * quantizer never writes those bytes for finite input: at most 252).  A
 * scale byte 255 (NaN) makes the whole block NaN (OCP MX v1.0).
 * Returns 0 or -EINVAL (n % 32, unknown layout).
 */
int st_mxfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			    size_t n, enum st_fp4_layout layout, float *out);

/* --- FP8 E4M3 (OFP8) --- */
/* E4M3 value: bias 7, subnormals m/8 * 2^-6, 0x7F/0xFF NaN. */
float st_e4m3_to_f32(uint8_t b);
/* Round to nearest even, saturating to +-448 (0x7E / 0xFE; inf included);
 * never returns a NaN code (0x7F/0xFF) for a finite input (PITFALLS P9);
 * NaN -> 0x7F. */
uint8_t st_f32_to_e4m3_sat(float x);

/*
 * Converts n elements of a scalar dtype (F32, F16, BF16, F8_E4M3) at src
 * (little-endian, any alignment) to float32 out[n].  Returns 0 or
 * -ST_E_UNSUPPORTED for other dtypes.
 */
int st_convert_to_f32(enum st_dtype dt, const void *src, size_t n, float *out);

#endif
