/*
 * st_mxfp4il.h — the row-interleaved MXFP4 layout of version-3 stores
 * ("layout": "ocp-r16" in the manifest; ST_STORE_VERSION 3).
 *
 * A row-major MXFP4 matrix [rows, cols] (cols a multiple of 32, OCP nibble
 * order: code byte k of a block holds element 2k low, 2k+1 high) is stored
 * with its rows in groups of ST_MXFP4IL_ROWS = 16, the last group holding
 * rows % 16 rows when that is not 0.  Group g0 (its first row) with gr
 * rows:
 *   codes  at byte g0 * cols / 2 of the data section: for each block b of
 *          32 columns in order, gr * 16 bytes: the block's 16 code bytes
 *          of each row cut into 4 words of 4 bytes, word j of row i at
 *          (j * gr + i) * 4 (word 0 of every row, then word 1, ...);
 *   scales at byte g0 * (cols / 32) of the scale section: for each block b,
 *          the gr E8M0 bytes of its rows (block b at b * gr, row i at + i).
 * So a 512-bit register loaded from a block holds one word of 16 rows, one
 * row per 32-bit lane: a VNNI dot product against the broadcast word of
 * activations leaves each row's sum in its own lane, and the 16 scales
 * widen straight into the matching lanes (cw_kern_il_x86.c).  The sections
 * keep their row-major sizes (same record layout, same expertd residency
 * bytes); only the order of their bytes changes.
 */
#ifndef ST_MXFP4IL_H
#define ST_MXFP4IL_H

#include <stddef.h>
#include <stdint.h>

#define ST_MXFP4IL_ROWS 16 /* rows per interleaved group */

/* Rows of the group holding row r of a matrix of `rows` rows. */
static inline int64_t st_mxfp4il_group_rows(int64_t rows, int64_t r)
{
	const int64_t g0 = r / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS;

	return rows - g0 < ST_MXFP4IL_ROWS ? rows - g0 : ST_MXFP4IL_ROWS;
}

/* Byte offset in the data section of word j (code bytes 4j..4j+3) of
 * block b of row r (cols a multiple of 32). */
static inline size_t st_mxfp4il_word_offset(int64_t rows, int64_t cols,
					    int64_t r, int64_t b, int j)
{
	const int64_t g0 = r / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS;
	const int64_t gr = st_mxfp4il_group_rows(rows, r);

	return (size_t)(g0 * (cols / 2) + b * gr * 16 +
			((int64_t)j * gr + (r - g0)) * 4);
}

/* Byte offset in the scale section of the E8M0 scale of block b of row r. */
static inline size_t st_mxfp4il_scale_offset(int64_t rows, int64_t cols,
					     int64_t r, int64_t b)
{
	const int64_t g0 = r / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS;
	const int64_t gr = st_mxfp4il_group_rows(rows, r);

	return (size_t)(g0 * (cols / 32) + b * gr + (r - g0));
}

/*
 * Repacks a row-major MXFP4 matrix (codes: rows * cols / 2 bytes, scales:
 * rows * cols / 32 bytes; borrowed) into the interleaved layout at
 * ret_codes / ret_scales (caller's buffers of the same sizes, not
 * overlapping the inputs).  Returns 0, or -EINVAL when cols is not a
 * positive multiple of 32 or rows < 1.
 */
int st_mxfp4il_pack(const uint8_t *codes, const uint8_t *scales,
		    int64_t rows, int64_t cols, uint8_t *ret_codes,
		    uint8_t *ret_scales);

/*
 * Copies row r of an interleaved MXFP4 matrix (codes and scales: the
 * sections, borrowed) out in row-major OCP form: cols / 2 code bytes into
 * ret_codes and cols / 32 scale bytes into ret_scales (what
 * st_mxfp4_dequantize_row takes).  cols a multiple of 32, 0 <= r < rows.
 */
void st_mxfp4il_unpack_row(const uint8_t *codes, const uint8_t *scales,
			   int64_t rows, int64_t cols, int64_t r,
			   uint8_t *ret_codes, uint8_t *ret_scales);

/*
 * Dequantizes row r of an interleaved MXFP4 matrix into out[cols]: the same
 * floats st_mxfp4_dequantize_row gives for the row-major original.
 * Returns 0 or -EINVAL (cols not a positive multiple of 32, r out of
 * range).
 */
int st_mxfp4il_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			      int64_t rows, int64_t cols, int64_t r,
			      float *out);

#endif
