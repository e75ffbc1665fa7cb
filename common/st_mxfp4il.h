/*
 * st_mxfp4il.h — the row-interleaved MXFP4 layout of version-3 stores
 * ("layout": "ocp-r8" in the manifest; ST_STORE_VERSION 3).
 *
 * A row-major MXFP4 matrix [rows, cols] (cols a multiple of 32, OCP nibble
 * order: code byte j of a block holds element 2j low, 2j+1 high) is stored
 * with its rows in groups of ST_MXFP4IL_ROWS = 8, the last group holding
 * rows % 8 rows when that is not 0.  Group g0 (its first row) with gr rows:
 *   codes  at byte g0 * cols / 2 of the data section: for each block b of
 *          32 columns in order, the 16 code bytes of block b of each of its
 *          gr rows in row order (block b at b * gr * 16, row i at + i * 16);
 *   scales at byte g0 * (cols / 32) of the scale section: for each block b,
 *          the gr E8M0 bytes of its rows (block b at b * gr, row i at + i).
 * The sections keep their row-major sizes (same record layout, same
 * expertd residency bytes); only the order of their bytes changes.  A
 * decode kernel then reads one contiguous stream per row group, 8 rows'
 * blocks at once (cw_kern_il.c), instead of one row at a time.
 */
#ifndef ST_MXFP4IL_H
#define ST_MXFP4IL_H

#include <stddef.h>
#include <stdint.h>

#define ST_MXFP4IL_ROWS 8 /* rows per interleaved group */

/* Rows of the group holding row r of a matrix of `rows` rows. */
static inline int64_t st_mxfp4il_group_rows(int64_t rows, int64_t r)
{
	const int64_t g0 = r / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS;

	return rows - g0 < ST_MXFP4IL_ROWS ? rows - g0 : ST_MXFP4IL_ROWS;
}

/* Byte offset in the data section of the 16 codes of block b of row r
 * (cols a multiple of 32). */
static inline size_t st_mxfp4il_code_offset(int64_t rows, int64_t cols,
					    int64_t r, int64_t b)
{
	const int64_t g0 = r / ST_MXFP4IL_ROWS * ST_MXFP4IL_ROWS;
	const int64_t gr = st_mxfp4il_group_rows(rows, r);

	return (size_t)(g0 * (cols / 2) + b * gr * 16 + (r - g0) * 16);
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
