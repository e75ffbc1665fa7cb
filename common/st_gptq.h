/*
 * st_gptq.h — GPTQ quantization of one weight matrix to a 4-bit expert
 * format (Frantar, Ashkboos, Hoefler, Alistarh, "GPTQ: Accurate
 * Post-Training Quantization for Generative Pre-trained Transformers",
 * arXiv:2210.17323, Algorithm 1, with groups: "static" scales chosen as
 * each group is reached).
 *
 * For a [rows, cols] matrix W whose input has second moment H = E[a a^T]
 * (cols x cols, from calibration: st_calib_second_moment), each row is
 * quantized column by column; the rounding error of column j, divided by
 * U[j][j], is subtracted times U[j][k] from every later column k of the row
 * (U the upper Cholesky factor of (H + damp I)^-1), so later columns
 * compensate for it and the row's output error (w - q)^T H (w - q) is far
 * below that of rounding every element on its own.  Each group's scale is
 * chosen when the group is reached, from the updated weights, by the
 * activation-weighted scale search (st_*_quantize_row_wmse with weights
 * diag(H)); elements round to the nearest code under it as the plain
 * quantizers do, so the existing dequantizers read the result.
 */
#ifndef ST_GPTQ_H
#define ST_GPTQ_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_formats.h"

/* Damping added to H's diagonal before the inverse, as a fraction of the
 * mean diagonal (GPTQ's percdamp, 0.01). */
#define ST_GPTQ_DAMP 0.01

/*
 * Quantizes w[rows * cols] (row-major float32) in format f (MXFP4, NVFP4 or
 * E2M1_F16; cols a multiple of the MXFP4 / NVFP4 block, even for E2M1)
 * with second moment H[cols * cols] (symmetric, positive semi-definite;
 * not modified).  global: NVFP4's per-tensor scale (st_nvfp4_global_scale
 * of the original weights), ignored otherwise.  Outputs, in the store's
 * layout (st_store.h): codes rows * cols / 2 bytes (OCP nibble order),
 * scales rows * ceil(cols / group) of the format's scale type (E8M0 /
 * E4M3 bytes, FP16 halves).  Deterministic (double arithmetic in a fixed
 * order).  Returns 0, -EINVAL (format, sizes, non-finite input), -ENOMEM,
 * or -ST_E_FORMAT when H + damping is not positive definite even after
 * raising the damping tenfold three times.
 */
int st_gptq_quantize(const struct st_wformat *f, const float *w, size_t rows,
		     size_t cols, const double *H, float global,
		     uint8_t *codes, void *scales);

#endif
