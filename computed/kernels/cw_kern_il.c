/*
 * cw_kern_il.c — the portable fast-mode kernel for row-interleaved MXFP4
 * (w->il_rows, st_mxfp4il.h): the reference the AVX2 and AVX-512 VNNI
 * kernels of cw_kern_il_x86.c reproduce bit for bit.
 *
 * Per row and block b of 32 columns:
 *   is  = sum over the 32 elements of (2 e2m1 code) * q      (exact int32)
 *   f   = (0.5 * E8M0 scale of (row, b)) * d[b]             (one rounding)
 *   acc = fma((float)is, f, acc)                             (blocks in order)
 * and y = acc.  |is| <= 32 * 12 * 127, so (float)is is exact; a block's
 * weights and activations are those of the row-major kernel (cw_kern_c.c),
 * only the float summation differs from it (tests/computed/test_kern_il.c
 * bounds the difference).  In the SIMD kernels each row is one 32-bit lane,
 * so this is exactly their per-lane sequence: no horizontal sum at all.
 */
#include "cw_kern.h"

#include <math.h>
#include <string.h>

#include "st_formats.h"
#include "st_mxfp4il.h"

void cw_kern_il_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, R = w->rows, nb = C / 32;
	const uint8_t *codes = w->data;

	for (int64_t r = r0; r < r1; r++) {
		float acc = 0.0f;

		for (int64_t b = 0; b < nb; b++) {
			const uint8_t s =
				w->scales[st_mxfp4il_scale_offset(R, C, r, b)];
			const int8_t *q = a->q + 32 * b;
			const float f = (0.5f * st_e8m0_to_f32(s)) * a->d[b];
			uint8_t bc[16];
			int32_t is = 0;

			for (int j = 0; j < 4; j++)
				memcpy(bc + 4 * j, codes + st_mxfp4il_word_offset(
						       R, C, r, b, j), 4);
			for (int k = 0; k < 16; k++)
				is += cw_kern_e2m1x2[bc[k] & 15] * q[k] +
				      cw_kern_e2m1x2[bc[k] >> 4] * q[16 + k];
			acc = fmaf((float)is, f, acc);
		}
		y[r] = acc;
	}
}
