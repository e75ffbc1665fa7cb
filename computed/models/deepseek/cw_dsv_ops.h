/*
 * cw_dsv_ops.h — the numeric pieces every revision of the DeepSeek-V4
 * family's forward pass uses (cw_dsv_ops.c): RMSNorm, RoPE, the mHC
 * mixes, the router, clipped SwiGLU, compressor pooling, sink attention
 * and the FP8 / FP4 round trips.  Formulas: MODEL_FAMILY_DEEPSEEK_V4.md
 * 2.5 (V4.1 uses V4's, section 3).  Exposed for the unit tests.
 */
#ifndef CW_DSV_OPS_H
#define CW_DSV_OPS_H

#include <stdint.h>

#include "st_config_dsv_family.h"

/* Weighted RMSNorm y = w * x / sqrt(mean(x^2) + eps); w NULL: unweighted.
 * In place allowed. */
void cw_dsv_rmsnorm(const float *x, const float *w, int n, double eps,
		     float *y);

/* Per-pair inverse frequencies (rope_dim/2 of them) of the main rope
 * (theta^(-2i/d)) or, yarn != 0, of the compress rope: HF
 * _compute_yarn_parameters with truncation and no mscale (config fields
 * compress_rope_theta, rope_scaling). */
void cw_dsv_rope_freqs(const struct st_dsv_config *c, int compress,
			double *inv_freq);

/* Interleaved RoPE on the last 2*n_pairs dims of x[dim]: pairs
 * (x[k], x[k+1]) rotated by pos * inv_freq[i]; inverse rotates by -angle. */
void cw_dsv_rope(float *x, int dim, int n_pairs, const double *inv_freq,
		  int64_t pos, int inverse);

/*
 * mHC pre at one site: from the streams X [n][D] (flattened stream-major)
 * and fn [(2+n)*n][n*D], base [(2+n)*n], scale [3]: pre [n], post [n] and
 * the Sinkhorn-normalised combine matrix comb [n][n] (row = source stream).
 * Formulas: MODEL_FAMILY_DEEPSEEK_V4.md 2.5.2.
 */
void cw_dsv_hc_pre(const float *X, int n, int D, const float *fn,
		    const float *base, const float *scale, int iters,
		    double eps, double rms_eps, float *pre, float *post,
		    float *comb);

/* mHC collapse of the streams X [n][D] with pre weights pre [n]: u [D] =
 * sum_k pre_k X_k, accumulated in double in stream order (V4's sites
 * with their own pre, V4.1's with the lagged one). */
void cw_dsv_collapse(const float *X, const float *pre, int n, int D,
		      float *u);

/* mHC post: X'[j] = post[j] * y + sum_i comb[i][j] * X[i]; X updated in
 * place (n*D scratch inside). */
void cw_dsv_hc_post(float *X, int n, int D, const float *y,
		     const float *post, const float *comb);

/* Router: scores s_e = sqrt(softplus(logits_e)); ids given (hash layer,
 * hash_ids != NULL) or the top_k of s + bias (bias may be NULL; ties go to
 * the lower id); weights w_k = s[id_k] / (sum + 1e-20) * scale when
 * normalise, else s[id_k] * scale. */
void cw_dsv_route_topk(const float *logits, int n_experts, int top_k,
		   const int32_t *hash_ids, const float *bias, int normalise,
		   double scale, int32_t *ids, float *weights);

/* Clipped SwiGLU in place: g[i] = silu(min(g[i], limit)) *
 * clamp(u[i], -limit, limit). */
void cw_dsv_swiglu_clip(float *g, const float *u, int n, double limit);

/* Softmax-pooling of one compressed row, per channel j of width:
 * sum over slots s of softmax_s(z[s][j]) * c[s][j], slots given as row
 * pointers (c and z rows of the same slot).  n_slots >= 1. */
void cw_dsv_pool(const float *const *c, const float *const *z, int n_slots,
		  int width, float *out);

/* Attention of one head over rows k[r] (K = V), scale 1/sqrt(dim), with a
 * sink logit in the denominator only.  out[dim]. */
void cw_dsv_sink_attn(const float *q, const float *const *rows, int n_rows,
		       int dim, float sink, float *out);

/* FP8 E4M3 round trip in place, per block of `block` elements (the last
 * one shorter): s = 2^ceil(log2(max(amax, 1e-4) / 448)), x =
 * e4m3(clamp(x / s, +-448)) * s, rounding to nearest even. */
void cw_dsv_fp8_roundtrip(float *x, int n, int block);

/* E2M1 round trip in place, per block: s = 2^ceil(log2(max(amax,
 * 6 * 2^-126) / 6)), x = e2m1(clamp(x / s, +-6)) * s (nearest even). */
void cw_dsv_fp4_roundtrip(float *x, int n, int block);

/* Walsh-Hadamard transform of x[n] (n a power of two) scaled by
 * 1/sqrt(n): orthogonal, its own inverse. */
void cw_dsv_hadamard(float *x, int n);

/* Dequantises an FP8 E4M3 [rows][cols] matrix with E8M0 block scales
 * [ceil(rows/b0)][ceil(cols/b1)] into out (F32, exact). */
void cw_dsv_fp8_dequant(const uint8_t *w, const uint8_t *scale, int rows,
			 int cols, int b0, int b1, float *out);

#endif
