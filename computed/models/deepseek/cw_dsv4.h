/*
 * cw_dsv4.h — DeepSeek-V4 (deepseek_v4) forward pass, reference mode.
 *
 * Semantics: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 2.4-2.5 (HF
 * transformers modeling_deepseek_v4.py), as the tiny-deepseek-v4 fixture's
 * README restates them.  Reference mode: F32 activations (dot products
 * accumulated in double), every weight dequantised exactly to F32 at load,
 * none of the official FP8/FP4 round trips (FP8 KV, Hadamard+FP4 indexer,
 * FP8 activations).
 *
 * The model (loading, compute mode, store-mode switches) is the
 * family's one (cw_dsv.h: cw_dsv_load, cw_dsv_load_store).  The sequence
 * state holds, per layer, the streams
 * of DESIGN 3a: a ring of the last sliding_window K=V rows, the
 * compressors' partial windows (raw per-token inputs: 2m tokens for CSA,
 * m for HCA), and the compressed and indexer rows (growing); it is a
 * process-local array, not kvd pages yet.  Tokens are evaluated one after
 * the other within each layer, so full prefill, any chunking and
 * token-by-token decode give bit-identical logits.
 */
#ifndef CW_DSV4_H
#define CW_DSV4_H

#include <stddef.h>
#include <stdint.h>

#include "cw_backend.h"
#include "cw_dsv.h"
#include "st_config_dsv4.h"
#include "st_error.h"

struct cw_dsv4_state;

/* The FFN counters of a state's evals since cw_dsv4_state_new
 * (cw_dsv.h). */
void cw_dsv4_state_stats(const struct cw_dsv4_state *s,
			 struct cw_dsv_run_stats *ret);

/*
 * The official inference code's quantisation round trips (not in HF, not
 * in the fixture's reference; MODEL_FAMILY_DEEPSEEK_V4.md 2.4 "QAT round
 * trips"), off by default (reference mode):
 *  KV_FP8     the nope dims of every window K=V row (after rope) and every
 *             compressed row (after norm and rope) through FP8 E4M3 in
 *             blocks of 64 with a power-of-two scale (ds4
 *             dsv4_fp8_kv_quantize_row_inplace_cpu);
 *  INDEX_FP4  indexer queries and keys (after rope) through a
 *             Walsh-Hadamard transform (1/sqrt(n)) then E2M1 in blocks of
 *             32 with a power-of-two scale (ds4
 *             dsv4_indexer_qat_row_inplace_cpu);
 *  ACT_FP8    the input of every FP8/FP4 matmul through E4M3 in blocks of
 *             weight_block_size[1] elements (official act_quant; the block
 *             for the real model is 128 [unconfirmed for other configs]).
 * Set with cw_dsv_set_qat (cw_dsv.h) before evaluating; a state must not
 * mix settings.
 */
enum {
	CW_DSV4_QAT_KV_FP8 = 1,
	CW_DSV4_QAT_INDEX_FP4 = 2,
	CW_DSV4_QAT_ACT_FP8 = 4,
};

/*
 * The experts a hash-routed layer (layer < num_hash_layers) uses for
 * `token`, known before the token is evaluated (exact prefetch, issue 9
 * item 4): top_k ids from tid2eid into ids.  Returns top_k, 0 for a
 * score-routed layer, -EINVAL for a layer or token out of range.
 */
int cw_dsv4_hash_experts(const struct cw_dsv_model *m, int layer,
			 int32_t token, int32_t *ids);

/* A sequence state for at most max_tokens positions.  -ENOMEM. */
int cw_dsv4_state_new(const struct cw_dsv_model *m, int max_tokens,
		      struct cw_dsv4_state **ret);
void cw_dsv4_state_free(struct cw_dsv4_state *s);
/* Positions already evaluated. */
int cw_dsv4_state_len(const struct cw_dsv4_state *s);

/*
 * Evaluates tokens ids[0..n) at the state's next positions and appends
 * them to it.  logits: if all_positions, n rows of vocab_size floats, else
 * one row (the last token's).  NULL skips the head.
 * Errors: -ST_E_LIMIT (past max_tokens), -EINVAL (token id out of range);
 * the state is unchanged on these.  Errors past the checks (expertd's,
 * kvd's for a kvd state: -ST_E_PEERGONE, -ST_E_BUDGET, -ST_E_STALE) may
 * leave rows of the chunk written: the state is then unusable.
 */
int cw_dsv4_eval(const struct cw_dsv_model *m, struct cw_dsv4_state *s,
		 const int32_t *ids, int n, int all_positions, float *logits,
		 struct st_diag *diag);

/* Debug record of the evals while set (NULL to skip), indexed by the
 * token's place in the eval's chunk (t < max_tokens): per layer the routed
 * expert ids and weights, the compressed rows the indexer selected (CSA
 * layers; sorted, -1 after the last), and the RMS over the hc_mult x D
 * stream values after the layer.  Arrays owned by the caller; any may be
 * NULL. */
struct cw_dsv4_debug {
	int max_tokens;
	int32_t *experts;   /* [max_tokens][n_layers][top_k] */
	float *weights;     /* [max_tokens][n_layers][top_k] */
	int32_t *selected;  /* [max_tokens][n_layers][index_topk] */
	float *stream_rms;  /* [max_tokens][n_layers] */
};
void cw_dsv4_set_debug(struct cw_dsv4_state *s, struct cw_dsv4_debug *dbg);

/* ---- KV streams (DESIGN 3a; the declaration: cw_dsv.h) ---- */

/* KV bytes per token of the growing streams of all layers, with rows of
 * elem_bytes per element (2 for BF16 rows, 4 for the F32 reference). */
double cw_dsv4_kv_bytes_per_token(const struct st_dsv_config *c,
				  int elem_bytes);

/* Fixed bytes per sequence (windows and compressor states, all layers). */
double cw_dsv4_fixed_bytes(const struct st_dsv_config *c, int elem_bytes);

/*
 * The planner's view of the same declaration (st_plan.h): m's KV streams
 * replaced by the layers' cw_dsv_streams grouped by kind and ratio
 * ("window", "pooled/4", "index", "comp-state/4", "index-state",
 * "pooled/128", "comp-state/128": a fixed stream as a window of per-token
 * rows), so st_plan_kv_bytes sums exactly what the state holds.  0, or
 * -ST_E_LIMIT (more groups than ST_PLAN_MAX_STREAMS; m unchanged).
 */
struct st_plan_model;
int cw_dsv4_plan_streams(const struct st_dsv_config *c,
			 struct st_plan_model *m);

/* ---- KV streams in kvd (cw_dsv_kv.c, DESIGN 3a, docs/DESIGN.md 9) ---- */

struct kv_client;

/*
 * A sequence state whose streams live in kvd pages (kv declared with
 * cw_dsv_kv_declare; borrowed, must outlive the state).  prompt NULL (or
 * n_prompt 0): an empty sequence, no prefix cache.  Otherwise (prefix
 * mode) the prefix cache is asked for the prompt: the longest chain of
 * published full pages of the same leading ids is mapped and the state
 * starts at that length (cw_dsv4_state_len: a multiple of page_rows, at
 * most n_prompt - 1; the caller evaluates prompt[len..n_prompt), in any
 * chunks), and after every eval the prompt's full pages reached so far
 * are published (before the next eval could free their window pages;
 * only while the evaluated ids are the prompt's; generated tokens are not
 * published; a refused publish is warned about and ends publishing for
 * the state, the logits are unaffected).  Each cw_dsv4_eval pins the
 * sequence (restoring spilled pages), reserves its new tokens, computes
 * and unpins it, so an idle state may be spilled by kvd (and, as
 * kvd's windowed streams do, frees the window and compressor-state pages
 * that fell out of the window unless published: publish each chunk's full
 * pages before the next eval to keep the whole chain cacheable; an eval
 * that fails after its reservation leaves the state unusable: free it,
 * -ST_E_STALE after); after a kvd
 * restart the client re-registers and the state goes on (set
 * kv_client_set_restart_wait).  The length is limited by kvd's
 * --max-rows-per-seq (-ST_E_LIMIT from the eval).  cw_dsv4_state_free
 * frees the kvd sequence.
 * Errors: kv_client_seq_create(_prefix)'s, -ENOMEM.
 */
int cw_dsv4_state_new_kv(const struct cw_dsv_model *m, struct kv_client *kv,
			 const int32_t *prompt, int n_prompt,
			 struct cw_dsv4_state **ret, struct st_diag *diag);

/*
 * Publishes the full pages of a kvd state's first n tokens (ids[0..n),
 * the tokens it was evaluated on; n <= cw_dsv4_state_len) in the prefix
 * cache (what prefix mode does by itself for the prompt; for a state made
 * without a prompt, call it after each eval: the next eval frees the
 * window pages of unpublished groups).  Every page of every stream of a group covers the same tokens,
 * and the window and compressor-state streams are per-token, so a group
 * chain ending at token kB carries exactly the window rows and partial
 * compressor inputs a sequence needs to go on from kB.  Returns the page
 * groups newly published (>= 0); -EINVAL for a process-local state;
 * kv_client_seq_publish's errors.
 */
int cw_dsv4_state_publish(struct cw_dsv4_state *s, const int32_t *ids, int n,
			  struct st_diag *diag);

/* kvd sequence handle of a kvd state (0 for a process-local one). */
uint32_t cw_dsv4_state_seq(const struct cw_dsv4_state *s);

/* ---- pieces (cw_dsv_ops.c), exposed for the unit tests ---- */

/* Weighted RMSNorm y = w * x / sqrt(mean(x^2) + eps); w NULL: unweighted.
 * In place allowed. */
void cw_dsv4_rmsnorm(const float *x, const float *w, int n, double eps,
		     float *y);

/* Per-pair inverse frequencies (rope_dim/2 of them) of the main rope
 * (theta^(-2i/d)) or, yarn != 0, of the compress rope: HF
 * _compute_yarn_parameters with truncation and no mscale (config fields
 * compress_rope_theta, rope_scaling). */
void cw_dsv4_rope_freqs(const struct st_dsv_config *c, int compress,
			double *inv_freq);

/* Interleaved RoPE on the last 2*n_pairs dims of x[dim]: pairs
 * (x[k], x[k+1]) rotated by pos * inv_freq[i]; inverse rotates by -angle. */
void cw_dsv4_rope(float *x, int dim, int n_pairs, const double *inv_freq,
		  int64_t pos, int inverse);

/*
 * mHC pre at one site: from the streams X [n][D] (flattened stream-major)
 * and fn [(2+n)*n][n*D], base [(2+n)*n], scale [3]: pre [n], post [n] and
 * the Sinkhorn-normalised combine matrix comb [n][n] (row = source stream).
 * Formulas: MODEL_FAMILY_DEEPSEEK_V4.md 2.5.2.
 */
void cw_dsv4_hc_pre(const float *X, int n, int D, const float *fn,
		    const float *base, const float *scale, int iters,
		    double eps, double rms_eps, float *pre, float *post,
		    float *comb);

/* mHC collapse of the streams X [n][D] with pre weights pre [n]: u [D] =
 * sum_k pre_k X_k, accumulated in double in stream order (V4's sites
 * with their own pre, V4.1's with the lagged one). */
void cw_dsv4_collapse(const float *X, const float *pre, int n, int D,
		      float *u);

/* mHC post: X'[j] = post[j] * y + sum_i comb[i][j] * X[i]; X updated in
 * place (n*D scratch inside). */
void cw_dsv4_hc_post(float *X, int n, int D, const float *y,
		     const float *post, const float *comb);

/* Router: scores s_e = sqrt(softplus(logits_e)); ids given (hash layer,
 * hash_ids != NULL) or the top_k of s + bias (bias may be NULL; ties go to
 * the lower id); weights w_k = s[id_k] / (sum + 1e-20) * scale when
 * normalise, else s[id_k] * scale. */
void cw_dsv4_route(const float *logits, int n_experts, int top_k,
		   const int32_t *hash_ids, const float *bias, int normalise,
		   double scale, int32_t *ids, float *weights);

/* Clipped SwiGLU in place: g[i] = silu(min(g[i], limit)) *
 * clamp(u[i], -limit, limit). */
void cw_dsv4_swiglu_clip(float *g, const float *u, int n, double limit);

/* Softmax-pooling of one compressed row, per channel j of width:
 * sum over slots s of softmax_s(z[s][j]) * c[s][j], slots given as row
 * pointers (c and z rows of the same slot).  n_slots >= 1. */
void cw_dsv4_pool(const float *const *c, const float *const *z, int n_slots,
		  int width, float *out);

/* Attention of one head over rows k[r] (K = V), scale 1/sqrt(dim), with a
 * sink logit in the denominator only.  out[dim]. */
void cw_dsv4_sink_attn(const float *q, const float *const *rows, int n_rows,
		       int dim, float sink, float *out);

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

/* FP8 E4M3 round trip in place, per block of `block` elements (the last
 * one shorter): s = 2^ceil(log2(max(amax, 1e-4) / 448)), x =
 * e4m3(clamp(x / s, +-448)) * s, rounding to nearest even. */
void cw_dsv4_fp8_roundtrip(float *x, int n, int block);

/* E2M1 round trip in place, per block: s = 2^ceil(log2(max(amax,
 * 6 * 2^-126) / 6)), x = e2m1(clamp(x / s, +-6)) * s (nearest even). */
void cw_dsv4_fp4_roundtrip(float *x, int n, int block);

/* Walsh-Hadamard transform of x[n] (n a power of two) scaled by
 * 1/sqrt(n): orthogonal, its own inverse. */
void cw_dsv4_hadamard(float *x, int n);

/* Dequantises an FP8 E4M3 [rows][cols] matrix with E8M0 block scales
 * [ceil(rows/b0)][ceil(cols/b1)] into out (F32, exact). */
void cw_dsv4_fp8_dequant(const uint8_t *w, const uint8_t *scale, int rows,
			 int cols, int b0, int b1, float *out);

#endif
