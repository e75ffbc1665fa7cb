/*
 * st_kvfmt_v41.h — the three DeepSeek-V4.1 KV storage formats, which are
 * also its QAT round trips (../shared/MODEL_FAMILY_DEEPSEEK_V4.md 3.7; HF
 * modeling_deepseek_v41.py _fake_quant_*):
 *
 *   window rows      FP8 E4M3, blocks of 32, ue8m0 scale (power of two,
 *                    rounded up): s = 2^ceil(log2(max(amax, 1e-4) / 448))
 *   compressed rows  FP4 E2M1, blocks of 16, E4M3 scale:
 *                    s = e4m3(max(amax, 6 * 2^-9) / 6)
 *   index keys / q   FP4 E2M1, blocks of 32, ue8m0 scale:
 *                    s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6))
 *
 * The E4M3 scale saturates at 448, so a compressed-row block with amax
 * above 6 x 448 = 2688 is clipped (rows are RMS-normalised latents, far
 * below); the ue8m0 scales cover 2^-127 .. 2^127.
 * Element codes: x / s clamped to the format's range (+-448, +-6), rounded
 * to nearest with ties to even (E2M1: 0.25, 1.25, 2.5, 5 round down; 0.75,
 * 1.75, 3.5 round up).  FP4 codes are packed two per byte, the even
 * element in the low nibble (as MXFP4 experts), bit 3 the sign.  A ue8m0
 * scale byte b means 2^(b - 127).  Row lengths n are in elements and must
 * be a multiple of the block (else -EINVAL); buffers are the caller's.
 * Bytes per row: FP8 n + n/32; FP4/16 n/2 + n/16; FP4/32 n/2 + n/32
 * (a 512-wide compressed row: 288 B, a 128-wide index key: 68 B).
 */
#ifndef ST_KVFMT_V41_H
#define ST_KVFMT_V41_H

#include <stddef.h>
#include <stdint.h>

#define ST_KV41_FP8_BLOCK 32
#define ST_KV41_CROW_BLOCK 16
#define ST_KV41_IDX_BLOCK 32

/* Bytes of one stored row of n elements in each format (codes then
 * scales): FP8 window n + n/32, compressed n/2 + n/16, index n/2 + n/32. */
size_t st_kv41_fp8_row_bytes(size_t n);
size_t st_kv41_crow_row_bytes(size_t n);
size_t st_kv41_idx_row_bytes(size_t n);

/* The ue8m0 exponent byte of the power-of-two scale 2^ceil(log2(v)) for
 * v > 0 (exact: frexp, no log2 rounding), clamped to [0, 254]. */
uint8_t st_kv41_ue8m0_ceil(double v);

/* Window row -> FP8: codes[n] E4M3, scales[n/32] ue8m0 bytes. */
int st_kv41_fp8_encode(const float *x, size_t n, uint8_t *ret_codes,
		       uint8_t *ret_scales);
int st_kv41_fp8_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
		       float *out);

/* Compressed row -> FP4 with E4M3 scales per 16: codes[n/2] packed,
 * scales[n/16] E4M3 bytes. */
int st_kv41_crow_encode(const float *x, size_t n, uint8_t *ret_codes,
			uint8_t *ret_scales);
int st_kv41_crow_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
			float *out);

/* Index key or indexer query -> FP4 with ue8m0 scales per 32:
 * codes[n/2] packed, scales[n/32] ue8m0 bytes. */
int st_kv41_idx_encode(const float *x, size_t n, uint8_t *ret_codes,
		       uint8_t *ret_scales);
int st_kv41_idx_decode(const uint8_t *codes, const uint8_t *scales, size_t n,
		       float *out);

/* The QAT round trips in place (encode then decode; n as above). */
int st_kv41_fp8_roundtrip(float *x, size_t n);
int st_kv41_crow_roundtrip(float *x, size_t n);
int st_kv41_idx_roundtrip(float *x, size_t n);

#endif
