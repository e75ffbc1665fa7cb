/*
 * st_formats.h — number formats and their codecs: F32/F16/BF16 conversion,
 * FP4 E2M1 elements, E8M0 scales, the MXFP4 block format, FP8 E4M3, and the
 * expert weight formats built from them: NVFP4, E2M1 with FP16 group
 * scales, FP8 E4M3 with FP32 block scales.
 *
 * Sources:
 *  - OCP Microscaling Formats (MX) Specification v1.0 (E2M1, E8M0, MXFP4:
 *    32-element blocks sharing one E8M0 scale).
 *  - OCP 8-bit Floating Point Specification (OFP8) v1.0 (E4M3: bias 7, max
 *    448, no infinities, S.1111.111 is NaN).
 *  - IEEE 754 binary16; bfloat16 = upper 16 bits of binary32.
 *  - NVFP4: NVIDIA Blackwell FP4 (PTX ISA "e2m1x2" with "ue4m3" block
 *    scales, block size 16) and the two-level scaling of NVIDIA's
 *    TensorRT Model Optimizer (per-tensor FP32 "weight_scale_2" =
 *    amax / (6 * 448), per-block E4M3 "weight_scale"); PITFALLS P8.
 *  - E2M1 + FP16 group scale and FP8 + FP32 block scale: absmax scaling as
 *    described in models/kjv-moe/README.md (quality table) and issue 5.
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
	ST_DTYPE_NVFP4, /* blocks of 16 E2M1 codes + one E4M3 scale, plus one
			 * FP32 scale per tensor */
	ST_DTYPE_E2M1_F16, /* E2M1 codes + one FP16 scale per group (group
			    * size is a parameter: struct st_wformat) */
	ST_DTYPE_F8_E8M0, /* E8M0 scale bytes 2^(b-127) as stored by
			   * DeepSeek-V4 (".scale" tensors) */
	ST_DTYPE_COUNT
};

/* Traits of a dtype (table checked at compile time in st_formats.c).
 * MXFP4: 32 elements per 17-byte block (16 code bytes + 1 E8M0 scale).
 * NVFP4: 16 elements per 9-byte block (8 code bytes + 1 E4M3 scale; the
 * per-tensor FP32 scale is not counted).  E2M1_F16: block_elems and
 * block_bytes 0 (the group size is a parameter; st_wformat_matrix_bytes
 * gives the sizes). */
struct st_dtype_traits {
	const char *name;        /* safetensors spelling: "F32", "BF16", ... */
	uint32_t block_elems;    /* elements per block (1 for scalar types) */
	uint32_t block_bytes;    /* bytes per block (element bytes for scalars) */
};

/* Traits of `dt`, or NULL if out of range. */
const struct st_dtype_traits *st_dtype_traits(enum st_dtype dt);

/* Parses a dtype name: the safetensors spellings "F32", "F16", "BF16",
 * "F8_E4M3", "U8", "I8", "I32", "I64", and strata's own "MXFP4", "NVFP4",
 * "E2M1_F16" (never valid in a safetensors file: st_safetensors_parse
 * refuses MXFP4; a checkpoint tensor claiming NVFP4 or E2M1_F16 is refused
 * by strata convert, which takes F32, F16 and BF16 weights only).
 * Returns 0 and *ret, or -ST_E_UNSUPPORTED. */
int st_dtype_from_name(const char *name, enum st_dtype *ret);

/* Bytes occupied by n_elems elements of dt (n_elems must be a whole number
 * of blocks; returns 0 otherwise, and for E2M1_F16, whose size depends on
 * the group). */
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

/* --- NVFP4 ---
 * A tensor of NVFP4 holds E2M1 codes (OCP nibble order: low nibble =
 * even element), one E4M3 scale per 16 consecutive elements of a row, and
 * one FP32 scale for the whole tensor ("global").  Value of element i:
 *   e2m1(code_i) * e4m3(block_scale) * global
 * computed in that order in float32: the first product is exact (at most
 * 2 + 4 significant bits), so the only rounding is the multiply by global.
 */
#define ST_NVFP4_BLOCK 16

/*
 * The per-tensor scale for a tensor whose largest finite magnitude is
 * amax_tensor: amax_tensor / (6 * 448) in float32 (one division by 2688),
 * so that block scales use the whole E4M3 range (the largest block maps
 * to 448 and its largest element to 6).  amax 0 (or not finite / not
 * positive) gives 1.0: an all-zero tensor, any scale dequantizes to 0.
 */
float st_nvfp4_global_scale(float amax_tensor);

/*
 * Quantizes one row of n elements (n a multiple of 16) with the tensor's
 * global scale `global` (st_nvfp4_global_scale; finite, > 0): codes (n/2
 * bytes, OCP nibble order) and block scales (n/16 E4M3 bytes).  Per block:
 *   block_scale = st_f32_to_e4m3_sat((amax_block / 6) / global)
 *   code_i      = st_f32_to_e2m1(x_i / (e4m3(block_scale) * global))
 * (float32 operations in that order; E2M1 nearest-even, saturating at
 * +-6).  A block whose scale rounds to 0 (all zero, or far below the
 * tensor's largest block) gets zero codes; a block holding a NaN gets the
 * NaN scale 0x7F and zero codes (it reads back as NaN).  +-inf elements
 * make the block scale 448 and saturate to +-6.
 * Returns 0 or -EINVAL (n % 16, global not finite and > 0).
 */
int st_nvfp4_quantize_row(const float *x, size_t n, float global,
			  uint8_t *ret_codes, uint8_t *ret_scales);

/*
 * Dequantizes n elements (a multiple of 16) of NVFP4 with the per-tensor
 * scale in its multiplying form `global`: out[i] = (e2m1(code_i) *
 * e4m3(block_scale)) * global.  Returns 0 or -EINVAL (n % 16).
 */
int st_nvfp4_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			    size_t n, float global, float *out);

/*
 * The same for checkpoints that store the inverse of the per-tensor scale
 * (PITFALLS P8: e.g. 3584 meaning 1/3584): out[i] = (e2m1(code_i) *
 * e4m3(block_scale)) / global_inv, one correctly rounded division (not a
 * multiply by a rounded reciprocal).  Code 7 (+6), block scale 0x38 (1.0),
 * inverse 3584 gives 6 / 3584 = 1.674e-3.  Returns 0 or -EINVAL (n % 16,
 * global_inv zero or not finite).
 */
int st_nvfp4_dequantize_row_inv(const uint8_t *codes, const uint8_t *scales,
				size_t n, float global_inv, float *out);

/* --- E2M1 with an FP16 scale per group ---
 * Groups of `group` consecutive elements along a row, the last one shorter
 * when group does not divide n (a 192-wide row with group 128 has groups
 * [0, 128) and [128, 192)); n even (two codes per byte, OCP order).
 * Value: e2m1(code) * f16(scale), exact in float32.
 */

/*
 * Quantizes one row of n elements: per group, scale = st_f32_to_f16(amax /
 * 6) (float32 division, then binary16 nearest-even; clamped to the largest
 * finite binary16, 65504, instead of overflowing), code_i =
 * st_f32_to_e2m1(x_i / f16_to_f32(scale)) (nearest-even, saturating at +-6:
 * the rounded scale can be a hair below amax/6).  An all-zero group (or
 * one whose scale underflows to 0) stays zero (scale 0, codes 0); a group
 * holding a NaN gets scale 0x7E00 (NaN) and zero codes.
 * ret_codes: n/2 bytes; ret_scales: ceil(n/group) binary16 values.
 * Returns 0 or -EINVAL (n odd, group 0).
 */
int st_e2m1f16_quantize_row(const float *x, size_t n, size_t group,
			    uint8_t *ret_codes, uint16_t *ret_scales);

/* Dequantizes n elements: out[i] = e2m1(code_i) * f16(scale[i / group]).
 * Returns 0 or -EINVAL (n odd, group 0). */
int st_e2m1f16_dequantize_row(const uint8_t *codes, const uint16_t *scales,
			      size_t n, size_t group, float *out);

/* --- FP8 E4M3 with an FP32 scale per block ---
 * Blocks of `block` consecutive elements along a row (the last one shorter
 * when block does not divide n).  Value: e4m3(code) * scale, one float32
 * multiply (rounded to nearest even).
 */
#define ST_FP8_DEFAULT_BLOCK 128

/*
 * Quantizes one row of n elements: per block, scale = amax / 448 (float32
 * division), code_i = st_f32_to_e4m3_sat(x_i / scale) (nearest-even,
 * saturating at +-448, never a NaN code for finite input: PITFALLS P9).
 * An all-zero block (or one whose scale underflows to 0) gets scale 0 and
 * zero codes; a block holding a NaN gets a NaN scale and zero codes; +-inf
 * elements make the scale the largest finite float / 448 and saturate.
 * ret_codes: n bytes; ret_scales: ceil(n/block) floats.
 * Returns 0 or -EINVAL (block 0).
 */
int st_fp8_quantize_row(const float *x, size_t n, size_t block,
			uint8_t *ret_codes, float *ret_scales);

/* Dequantizes n elements: out[i] = e4m3(code_i) * scale[i / block].
 * Returns 0 or -EINVAL (block 0). */
int st_fp8_dequantize_row(const uint8_t *codes, const float *scales, size_t n,
			  size_t block, float *out);

/* --- scale search (MSE-optimal clipping) ---
 * Variants of the block/group quantizers above that, instead of the plain
 * amax scale, search each block's scale for the one minimising the squared
 * reconstruction error of the block:
 *   SSE(scale) = sum_i (x_i - deq_i)^2
 * where deq_i is exactly the float32 value the format's existing
 * dequantizer gives for the element's code under that scale (so a searched
 * block decodes with st_*_dequantize_row unchanged), computed in double in
 * element order.  Elements are rounded as in the plain quantizers (nearest
 * even, saturating).  Candidates:
 *   MXFP4 (E8M0)   the plain exponent byte e and its neighbours e-1, e+1
 *                  (within 0..254);
 *   NVFP4 (E4M3), E2M1 (FP16), FP8 (FP32)
 *                  the plain scale and the target (amax/6, per block
 *                  divided by the tensor scale for NVFP4; amax/448 for
 *                  FP8) times each factor f = k/100, k = 80..110
 *                  (ST_SCALE_GRID_LO .. ST_SCALE_GRID_LO +
 *                  ST_SCALE_GRID_N - 1), each rounded to the scale's own
 *                  format as the plain quantizer rounds it (E4M3
 *                  saturating, FP16 nearest-even clamped to 65504, FP32).
 * The lowest SSE wins; on a tie the plain scale stays, then the smaller
 * scale wins, so a block where the plain scale is optimal is quantized
 * byte for byte as by the plain quantizer.  Factors below 1 clip the
 * block's largest elements (saturation) to give the rest a finer grid;
 * factors above 1 let the largest element round up instead of saturating.
 * This is the usual MSE-optimal clipping / scale search of weight-only
 * post-training quantization (as in the clipping search of AWQ and the
 * grid search of GPTQ-style quantizers), here without activation
 * statistics (every element weighs the same).
 * Blocks holding a NaN or an infinity, all-zero blocks and blocks whose
 * plain scale is 0 are quantized as by the plain quantizer.
 * Arguments, outputs and errors are those of the plain quantizer; the
 * result is deterministic (no dependence on FPU mode or FMA).
 */
enum st_scale_search {
	ST_SCALE_SEARCH_NONE = 0, /* plain amax scale */
	ST_SCALE_SEARCH_MSE = 1,  /* per-block search for the lowest SSE */
	ST_SCALE_SEARCH_CALIBRATED = 2, /* the same search, each element's
					 * error weighted by its input
					 * channel's activation second
					 * moment (the _wmse functions) */
	ST_SCALE_SEARCH_GPTQ = 3, /* GPTQ with the calibration's second
				   * moments, each group's scale by the
				   * weighted search (st_gptq.h) */
};

#define ST_SCALE_GRID_LO 80 /* first grid factor, in hundredths */
#define ST_SCALE_GRID_N 31  /* factors 0.80, 0.81, ..., 1.10 */

/* Parses "none", "mse", "cal" / "calibrated" or "gptq" (`strata convert
 * --scale-search`).  0 or -EINVAL (*ret untouched). */
int st_scale_search_parse(const char *s, enum st_scale_search *ret);

/* "none", "mse", "calibrated", "gptq"; NULL out of range. */
const char *st_scale_search_name(enum st_scale_search s);

int st_mxfp4_quantize_row_mse(const float *x, size_t n, uint8_t *ret_codes,
			      uint8_t *ret_scales);
int st_nvfp4_quantize_row_mse(const float *x, size_t n, float global,
			      uint8_t *ret_codes, uint8_t *ret_scales);
int st_e2m1f16_quantize_row_mse(const float *x, size_t n, size_t group,
				uint8_t *ret_codes, uint16_t *ret_scales);
int st_fp8_quantize_row_mse(const float *x, size_t n, size_t block,
			    uint8_t *ret_codes, float *ret_scales);

/*
 * Activation-weighted scale search: the same candidates, rounding and tie
 * rules as the _mse functions, but each block's error is
 *   WSSE(scale) = sum_i w_i (x_i - deq_i)^2
 * with w[n] one non-negative finite weight per element of the row (NULL:
 * every weight 1, exactly the _mse result).  With w_c = E[a_c^2], the
 * second moment of input channel c of the matrix over calibration tokens,
 * WSSE is the expected squared error that the block adds to the matrix's
 * output, E[(sum_c (w_c - q(w_c)) a_c)^2], without the cross terms between
 * channels (the diagonal of the input's second-moment matrix, which GPTQ
 * uses in full as its Hessian: Frantar et al., "GPTQ", arXiv:2210.17323;
 * weighting the weight error by activation magnitude is the observation
 * of AWQ, Lin et al., arXiv:2306.00978, section 3).  A block whose weights
 * are all 0 keeps the plain scale (every candidate ties).  Per element the
 * nearest code is still the best (the weighted error is a sum of
 * per-element terms), so only the block scale changes.
 * Returns the errors of the plain quantizer, or -EINVAL when a weight is
 * negative, NaN or infinite.
 */
int st_mxfp4_quantize_row_wmse(const float *x, const float *w, size_t n,
			       uint8_t *ret_codes, uint8_t *ret_scales);
int st_nvfp4_quantize_row_wmse(const float *x, const float *w, size_t n,
			       float global, uint8_t *ret_codes,
			       uint8_t *ret_scales);
int st_e2m1f16_quantize_row_wmse(const float *x, const float *w, size_t n,
				 size_t group, uint8_t *ret_codes,
				 uint16_t *ret_scales);

/* --- expert weight formats ---
 * What the store records per expert matrix: a dtype and the number of
 * elements that share one scale along a row.
 *   F32, BF16   group 0 (no scales)
 *   MXFP4       group 32, E8M0 scales
 *   NVFP4       group 16, E4M3 scales, one FP32 per-tensor scale
 *   E2M1_F16    group = any even size from 2 to 65536, FP16 scales
 *   F8_E4M3     group = block, 1 to 65536, FP32 scales
 * Spellings (CLI and manifest): "f32", "bf16", "mxfp4", "nvfp4",
 * "e2m1-g<N>" (e.g. "e2m1-g32", "e2m1-g128"), "fp8" (block 128) or
 * "fp8-b<N>".
 */
enum st_scale_type {
	ST_SCALE_NONE = 0,
	ST_SCALE_E8M0,
	ST_SCALE_E4M3,
	ST_SCALE_F16,
	ST_SCALE_F32,
};

struct st_wformat {
	enum st_dtype dtype;
	uint32_t group;      /* elements per scale along a row; 0: none */
};

#define ST_WFORMAT_MAX_GROUP 65536
#define ST_WFORMAT_NAME_MAX 32 /* buffer size for st_wformat_name */

/* The scale type of an expert format's dtype (NONE for F32/BF16 and for
 * dtypes that are not expert formats). */
enum st_scale_type st_wformat_scale_type(enum st_dtype dt);

/* "e8m0", "e4m3", "f16", "f32"; NULL for NONE or out of range. */
const char *st_scale_type_name(enum st_scale_type t);

/* Manifest spelling of the dtype of an expert format: "f32", "bf16",
 * "mxfp4", "nvfp4", "e2m1", "fp8"; NULL for other dtypes. */
const char *st_wformat_base_name(enum st_dtype dt);

/* 0 if f is a valid expert format (dtype and group as in the table
 * above), else -EINVAL. */
int st_wformat_check(const struct st_wformat *f);

/* Parses a format spelling (table above) into *ret.  0 or -EINVAL. */
int st_wformat_parse(const char *s, struct st_wformat *ret);

/* Canonical spelling of a valid format into buf (ST_WFORMAT_NAME_MAX
 * bytes are enough).  0, -EINVAL (invalid format) or -ENAMETOOLONG. */
int st_wformat_name(const struct st_wformat *f, char *buf, size_t len);

/*
 * Sizes of a [rows, cols] matrix in format f, rows stored one after the
 * other: *ret_data_bytes the elements or codes (row-major), *ret_scale_bytes
 * the scales (row-major by (row, group): rows * ceil(cols / group) of
 * them), *ret_tensor_scale_bytes the per-tensor scale (4 for NVFP4, else
 * 0).  Any output may be NULL.  Returns 0, -EINVAL (invalid format, rows or
 * cols < 1), -ST_E_UNSUPPORTED (cols not a multiple of the MXFP4 / NVFP4
 * block, or odd for E2M1_F16) or -ST_E_LIMIT (sizes overflow 2^62).
 */
int st_wformat_matrix_bytes(const struct st_wformat *f, int64_t rows,
			    int64_t cols, uint64_t *ret_data_bytes,
			    uint64_t *ret_scale_bytes,
			    uint64_t *ret_tensor_scale_bytes);

#endif
