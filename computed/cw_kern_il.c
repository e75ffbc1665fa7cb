/*
 * cw_kern_il.c — the portable fast-mode kernel for row-interleaved MXFP4
 * (w->il_rows, st_mxfp4il.h): the reference the AVX2 and AVX-512 VNNI
 * kernels of cw_kern_il_x86.c reproduce bit for bit.
 *
 * The arithmetic is fixed by what a SIMD register holds: a 128-bit lane
 * takes one row's 16 code bytes of a block, split into 4 words of 4 bytes;
 * word j (j = 0..3) holds the even elements 8j, 8j+2, 8j+4, 8j+6 in its low
 * nibbles and the odd ones 8j+1 .. 8j+7 in its high nibbles.  Per row and
 * block b:
 *   is_j = sum over those 8 elements of (2 e2m1 code) * q      (exact int32)
 *   f    = (0.5 * E8M0 scale of (row, b)) * d[b]              (float)
 *   acc_j = fma((float)is_j, f, acc_j)                         (blocks in order)
 * and y = (acc_0 + acc_1) + (acc_2 + acc_3).  Products and the int32 sums
 * are exact (|is_j| <= 8 * 12 * 127); a block's weights and activations
 * are those of the row-major kernel (cw_kern_c.c), only the float
 * summation order differs from it (tests/computed/test_kern.c bounds the
 * difference).
 */
#include "cw_kern.h"

#include <math.h>

#include "st_formats.h"
#include "st_mxfp4il.h"
#include "st_util.h"

void cw_kern_il_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1)
{
	const int64_t C = w->cols, R = w->rows, nb = C / 32;
	const uint8_t *codes = w->data;

	for (int64_t r = r0; r < r1; r++) {
		float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };

		for (int64_t b = 0; b < nb; b++) {
			const uint8_t *bc =
				codes + st_mxfp4il_code_offset(R, C, r, b);
			const uint8_t s =
				w->scales[st_mxfp4il_scale_offset(R, C, r, b)];
			const int8_t *q = a->q + 32 * b;
			const float f = (0.5f * st_e8m0_to_f32(s)) * a->d[b];

			for (int j = 0; j < 4; j++) {
				int32_t is = 0;

				for (int k = 4 * j; k < 4 * j + 4; k++)
					is += cw_kern_e2m1x2[bc[k] & 15] * q[k] +
					      cw_kern_e2m1x2[bc[k] >> 4] *
						      q[16 + k];
				acc[j] = fmaf((float)is, f, acc[j]);
			}
		}
		y[r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
	}
}
