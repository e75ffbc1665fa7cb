/*
 * st_mxfp4il.c — repacking MXFP4 matrices into the row-interleaved layout
 * of version-3 stores and reading single rows back (st_mxfp4il.h).
 */
#include "st_mxfp4il.h"

#include <errno.h>
#include <string.h>

#include "st_formats.h"

int st_mxfp4il_pack(const uint8_t *codes, const uint8_t *scales,
		    int64_t rows, int64_t cols, uint8_t *ret_codes,
		    uint8_t *ret_scales)
{
	const int64_t nb = cols / 32;

	if (rows < 1 || cols < 32 || cols % 32)
		return -EINVAL;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t b = 0; b < nb; b++) {
			for (int j = 0; j < 4; j++)
				memcpy(ret_codes + st_mxfp4il_word_offset(
					       rows, cols, r, b, j),
				       codes + r * (cols / 2) + b * 16 + 4 * j, 4);
			ret_scales[st_mxfp4il_scale_offset(rows, cols, r, b)] =
				scales[r * nb + b];
		}
	return 0;
}

void st_mxfp4il_unpack_row(const uint8_t *codes, const uint8_t *scales,
			   int64_t rows, int64_t cols, int64_t r,
			   uint8_t *ret_codes, uint8_t *ret_scales)
{
	for (int64_t b = 0; b < cols / 32; b++) {
		for (int j = 0; j < 4; j++)
			memcpy(ret_codes + b * 16 + 4 * j,
			       codes + st_mxfp4il_word_offset(rows, cols, r, b, j),
			       4);
		ret_scales[b] = scales[st_mxfp4il_scale_offset(rows, cols, r, b)];
	}
}

int st_mxfp4il_dequantize_row(const uint8_t *codes, const uint8_t *scales,
			      int64_t rows, int64_t cols, int64_t r,
			      float *out)
{
	uint8_t c[16], s;

	if (cols < 32 || cols % 32 || r < 0 || r >= rows)
		return -EINVAL;
	for (int64_t b = 0; b < cols / 32; b++) {
		int e;

		for (int j = 0; j < 4; j++)
			memcpy(c + 4 * j,
			       codes + st_mxfp4il_word_offset(rows, cols, r, b, j),
			       4);
		s = scales[st_mxfp4il_scale_offset(rows, cols, r, b)];
		if ((e = st_mxfp4_dequantize_row(c, &s, 32, ST_FP4_LAYOUT_OCP,
						 out + b * 32)))
			return e;
	}
	return 0;
}
