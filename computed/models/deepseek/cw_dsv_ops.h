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

/* ---- V4's indexer (cw_dsv4.c), exposed for the unit tests ---- */

/*
 * Lightning-indexer selection for one query: score of visible row w is
 * sum_h omega[h] * ReLU(q[h] . key[w] / sqrt(dim)) (omega already scaled
 * by n_heads^-1/2); keeps the top_k rows (all when n_vis <= top_k), ties
 * to the lower row index.  sel gets the chosen rows in ascending order;
 * returns their count.
 */
int cw_dsv4_index_select(const float *q, const float *omega, int n_heads,
			 int dim, const float *keys, int n_vis, int top_k,
			 int *sel);

/* ---- pieces (cw_dsv41_ops.c), exposed for the unit tests ---- */

/* Index entries visible to the query at position p of a layer of
 * compress ratio m: floor((p + 1) / m) (an entry covers tokens
 * [e m, e m + m), visible once complete; at m = 1 the current token's
 * own entry included). */
int cw_dsv41_n_visible(int64_t p, int m);

/*
 * Candidate blocks (two-level top-k) from the index scores sc[0..n_vis)
 * of the candidate-source layer: a block is block_size consecutive
 * entries, its score the max of its entries; the block holding the newest
 * entry (n_vis - 1) is always kept (pinned); the others by score,
 * ties to the lower block.  blocks gets the chosen ids, sorted; returns
 * their count (min(topk_blocks, number of blocks)).
 */
int cw_dsv41_candidate_blocks(const double *sc, int n_vis, int block_size,
			      int topk_blocks, int *blocks);

/*
 * Top-k selection from index scores sc[0..n_vis) (V4.1's index sources
 * and V4's indexer): the top min(top_k, n_vis) entries, ties to the lower
 * entry, picks with score -inf dropped; sel gets them sorted; returns
 * their count.
 */
int cw_dsv41_select(const double *sc, int n_vis, int top_k, int *sel);

/*
 * Engram gate of one stream (MODEL_FAMILY_DEEPSEEK_V4.md 3.5):
 * dot = sum_j x[j] qk[j] key[j] * rsqrt(mean(x^2) + eps) *
 * rsqrt(mean(key^2) + eps) / sqrt(D), gate = sigmoid(sign(dot) *
 * sqrt(max(|dot|, 1e-6))); qk = q_weight * k_weight of the stream.
 */
double cw_dsv41_engram_gate(const float *x, const float *qk, const float *key,
			    int D, double eps);

/*
 * One mHC site of V4.1's single pass (MODEL_FAMILY_DEEPSEEK_V4.md 3.3.1):
 * this site's mixes of the streams X [n][D] (pre [n], post [n], comb
 * [n][n], row = source stream; V4's formulas, cw_dsv_hc_pre) and its
 * sublayer input u [D] = sum_k lag_pre[k] X[k], collapsed with the
 * *previous* site's pre (one-hot on stream 0 before layer 0; the
 * attention site's pre at the FFN site), not its own.
 */
void cw_dsv41_hc_site(const float *X, int n, int D, const float *lag_pre,
		      const float *fn, const float *base, const float *scale,
		      int iters, double eps, double rms_eps, float *u,
		      float *pre, float *post, float *comb);

#endif
