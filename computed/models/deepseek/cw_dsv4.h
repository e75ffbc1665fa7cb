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
 * Weights are read straight from the safetensors checkpoint (official
 * names, no store yet).  The sequence state holds, per layer, the streams
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
#include "st_config_dsv4.h"
#include "st_error.h"

struct cw_dsv4_model;
struct cw_dsv4_state;

/*
 * Loads config.json and model.safetensors (or shards) of `dir`, checking
 * every tensor's name, dtype and shape against the config: FP8 E4M3 with
 * an F8_E8M0 ".scale" [ceil(out/b0), ceil(in/b1)] (b from
 * quantization_config.weight_block_size), routed experts as I8 packed E2M1
 * (low nibble = even element) with an F8_E8M0 ".scale" per 32 inputs,
 * BF16/F32 tensors, I64 tid2eid in hash layers (ids checked < n_experts).
 * mtp.* is skipped.  A scale byte 255 (E8M0 NaN) is refused as corrupt.
 * Owned by the caller (cw_dsv4_free).
 * Errors: -ST_E_CONFIG / -ST_E_FORMAT / -ST_E_NOTFOUND naming the tensor,
 * -ENOMEM, and those of st_checkpoint_open / st_dsv4_config_load.
 */
int cw_dsv4_load(const char *dir, struct cw_dsv4_model **ret,
		 struct st_diag *diag);
/*
 * Loads a V4 model from a strata store (strata convert of a V4
 * checkpoint): the dense weights from dense.bin (dequantised to F32 at
 * load exactly as cw_dsv4_load does from the checkpoint, so logits are
 * bit-identical), the routed experts from expertd's host pool at eval
 * time (es_client_acquire of each token's top-k per layer, dequantised
 * from the MXFP4 record, released after the layer), so expertd's
 * --host-budget bounds the expert memory.  `es` (borrowed, must outlive
 * the model; one eval at a time) must serve this store.
 * Errors: st_store_open's; -ST_E_UNSUPPORTED (not a V4 store);
 * -ST_E_FORMAT (expert records not V4's MXFP4); -ST_E_CONFIG (es
 * missing or serving another store); -ST_E_LIMIT (the pool holds fewer
 * than top_k experts); the loader's codes; -ENOMEM.
 */
struct es_client;
int cw_dsv4_load_store(const char *store_dir, struct es_client *es,
		       struct cw_dsv4_model **ret, struct st_diag *diag);
/*
 * Store mode: whether each layer's routing is reported to expertd
 * (ES_MSG_ROUTE: activation statistics and hot set) together with, as
 * prefetch hints, the experts of every later hash-routed layer, known
 * exactly from the token id (tid2eid).  On by default; off only for
 * measurements (the results are the same either way).
 */
void cw_dsv4_set_route_reports(struct cw_dsv4_model *m, int on);

/*
 * Store mode, both on by default (off only to measure what they bring;
 * the results are the same either way):
 *  step_hints: at the start of each eval, the hash-routed layers'
 *    experts of the tokens being evaluated go to expertd as a step-named
 *    hint (es_client_hint_step), so their reads start before layer 0
 *    (needs route reports on);
 *  expert_overlap: each routed expert is computed as soon as its slot is
 *    ready and the shared expert while the misses load
 *    (es_client_acquire_each), instead of after all top-k are ready.
 */
void cw_dsv4_set_decode_overlap(struct cw_dsv4_model *m, int step_hints,
				int expert_overlap);

/*
 * Store mode, on by default (off only to measure what it brings; results
 * are the same either way): layer-start hints, as V4.1's
 * (cw_dsv41_set_layer_hints).  In a one-token eval (decode), at the start
 * of each score-routed layer (hash-routed ones are hinted exactly from
 * the token id), the layer's router runs on the attention site's
 * collapsed streams under the layer's ffn_norm (a guess: the FFN input
 * adds the attention output) and its top-k go to expertd as a step-named
 * hint for this position (es_client_hint_step), so their reads start an
 * attention's time before the router names the misses.  Needs routing
 * reports on.
 */
void cw_dsv4_set_layer_hints(struct cw_dsv4_model *m, int on);
/*
 * Store mode, with routing reports on: also hint expertd the experts the
 * routers of the next `depth` score-routed layers pick on the current
 * layer's FFN input (gate look-ahead; hash-routed layers are always hinted
 * exactly), so their loads overlap this layer's compute.  0 (the default)
 * hints only the hash layers.  Results are the same either way.  0, or
 * -EINVAL for depth outside [0, 8].
 */
int cw_dsv4_set_prefetch_depth(struct cw_dsv4_model *m, int depth);

/*
 * cw_dsv4_load / cw_dsv4_load_store with a compute mode (DESIGN 6a).
 * CW_COMPUTE_REFERENCE is what those two do (bit-identical).
 * CW_COMPUTE_FAST runs the matvecs on the fast CPU backend's kernels
 * (cw_backend_cpu_fast, computed/kernels/cw_kern.h): the FP8 dense weights stay
 * E4M3 codes (1 byte per weight instead of 4) with one float scale per
 * (row, fp8_block[1] inputs), multiplied by float activations; the routed
 * experts of a store run straight from expertd's slot bytes (MXFP4 codes
 * and E8M0 scales as stored, activations quantized to int8 per block of
 * 32, one quantization shared by the top-k experts' w1 and w3), nothing
 * dequantized per use; the BF16 compressors and LM head stay BF16 (the
 * BF16 kernel), other matrices run the F32 kernel.  The router
 * (gate.weight), the indexer's head weights, the mHC mixers, norms,
 * attention and the pooling stay reference code (routing decisions and
 * selections match reference mode except near ties).  Not bit-identical
 * to reference mode: tests/computed/test_dsv4_fast.c states the
 * tolerance.  Errors: as the functions without _mode, -EINVAL for an
 * unknown mode.
 */
int cw_dsv4_load_mode(const char *dir, enum cw_compute mode,
		      struct cw_dsv4_model **ret, struct st_diag *diag);
int cw_dsv4_load_store_mode(const char *store_dir, struct es_client *es,
			    enum cw_compute mode, struct cw_dsv4_model **ret,
			    struct st_diag *diag);

/*
 * Fast mode's data layout (FP8 codes with expanded scales, expert views
 * of the slot bytes) on another backend than cw_backend_cpu_fast: with
 * cw_backend_cpu (exact dequantization on the fly, float activations) the
 * logits equal reference mode's but for the float summation order, which
 * separates the layout from the kernels' int8 approximation (tests).
 * -EINVAL unless m is a fast-mode model and be is not NULL.
 */
int cw_dsv4_set_backend(struct cw_dsv4_model *m,
			const struct cw_backend_ops *be);

/* Counters of a state's evals since cw_dsv4_state_new (store mode; all
 * zero otherwise): routed experts acquired from expertd, the time spent in
 * es_client_acquire (waiting for misses to load: the stall) in ns, and
 * the bytes of the expert records used. */
struct cw_dsv4_run_stats {
	uint64_t experts_acquired;
	uint64_t acquire_ns;
	uint64_t expert_bytes;
};
/* Bytes of dense weights one token reads: every layer's matrices but the
 * routed experts and the mHC mixers, plus the LM head, at their in-memory
 * size (1 per FP8 weight in fast mode, 4 per F32 weight). */
uint64_t cw_dsv4_dense_bytes(const struct cw_dsv4_model *m);
/* Bytes of the LM head alone at its in-memory size (part of
 * cw_dsv4_dense_bytes), read once per position whose logits are made. */
uint64_t cw_dsv4_lm_head_bytes(const struct cw_dsv4_model *m);
void cw_dsv4_state_stats(const struct cw_dsv4_state *s,
			 struct cw_dsv4_run_stats *ret);
void cw_dsv4_free(struct cw_dsv4_model *m);
const struct st_dsv4_config *cw_dsv4_config(const struct cw_dsv4_model *m);

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
 * Set before evaluating; a state must not mix settings.  Returns 0,
 * -EINVAL (unknown flag), -ST_E_UNSUPPORTED (INDEX_FP4 with an
 * index_head_dim that is not a power of two).
 */
enum {
	CW_DSV4_QAT_KV_FP8 = 1,
	CW_DSV4_QAT_INDEX_FP4 = 2,
	CW_DSV4_QAT_ACT_FP8 = 4,
};
int cw_dsv4_set_qat(struct cw_dsv4_model *m, unsigned flags);

/*
 * The experts a hash-routed layer (layer < num_hash_layers) uses for
 * `token`, known before the token is evaluated (exact prefetch, issue 9
 * item 4): top_k ids from tid2eid into ids.  Returns top_k, 0 for a
 * score-routed layer, -EINVAL for a layer or token out of range.
 */
int cw_dsv4_hash_experts(const struct cw_dsv4_model *m, int layer,
			 int32_t token, int32_t *ids);

/* A sequence state for at most max_tokens positions.  -ENOMEM. */
int cw_dsv4_state_new(const struct cw_dsv4_model *m, int max_tokens,
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
int cw_dsv4_eval(const struct cw_dsv4_model *m, struct cw_dsv4_state *s,
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

/* ---- KV streams (DESIGN 3a) ---- */

enum cw_dsv4_stream_kind {
	CW_DSV4_WINDOW = 0,    /* K=V rows, only the last sliding_window kept */
	CW_DSV4_COMP_ROWS,     /* compressed rows (CSA or HCA), all kept */
	CW_DSV4_INDEX_ROWS,    /* indexer key rows (CSA), all kept */
	CW_DSV4_COMP_STATE,    /* compressor partial window (fixed, overwritten) */
	CW_DSV4_INDEX_STATE,   /* indexer compressor partial window */
};

/* One stream of a layer.  Growing streams (rows_den > 0) get one row per
 * rows_den tokens; fixed ones (window, state) hold fixed_rows rows per
 * sequence.  A row is row_elems elements. */
struct cw_dsv4_stream {
	enum cw_dsv4_stream_kind kind;
	int row_elems;
	int rows_den;    /* 1: a row per token; 4, 128: compressed; 0: fixed */
	int fixed_rows;  /* window: W; state: tokens of raw inputs kept */
};

#define CW_DSV4_MAX_STREAMS 5

/* The streams of layer `layer` (at most CW_DSV4_MAX_STREAMS) into out;
 * returns their count, or -EINVAL for a layer out of range.  The window
 * is listed as a fixed stream of W rows (a sequence shorter than W uses
 * fewer).  State rows hold a token's raw compressor inputs (c then z:
 * 2 x the compressor's output width). */
int cw_dsv4_streams(const struct st_dsv4_config *c, int layer,
		    struct cw_dsv4_stream *out);

/* KV bytes per token of the growing streams of all layers, with rows of
 * elem_bytes per element (2 for BF16 rows, 4 for the F32 reference). */
double cw_dsv4_kv_bytes_per_token(const struct st_dsv4_config *c,
				  int elem_bytes);

/* Fixed bytes per sequence (windows and compressor states, all layers). */
double cw_dsv4_fixed_bytes(const struct st_dsv4_config *c, int elem_bytes);

/*
 * The planner's view of the same declaration (st_plan.h): m's KV streams
 * replaced by the layers' cw_dsv4_streams grouped by kind and ratio
 * ("window", "pooled/4", "index", "comp-state/4", "index-state",
 * "pooled/128", "comp-state/128": a fixed stream as a window of per-token
 * rows), so st_plan_kv_bytes sums exactly what the state holds.  0, or
 * -ST_E_LIMIT (more groups than ST_PLAN_MAX_STREAMS; m unchanged).
 */
struct st_plan_model;
int cw_dsv4_plan_streams(const struct st_dsv4_config *c,
			 struct st_plan_model *m);

/* ---- KV streams in kvd (cw_dsv4_kv.c, DESIGN 3a, docs/DESIGN.md 9) ---- */

struct kv_client;
struct kv_stream_decl;

/*
 * kvd's declaration of the model's streams: every layer's
 * cw_dsv4_streams in layer order, rows of row_elems x elem_bytes bytes.
 * A growing stream of one row per rows_den tokens is {tokens_per_row =
 * rows_den, window_rows 0}; a fixed one (the window ring W, a compressor's
 * partial window of `ring` tokens of raw inputs) is a per-token stream
 * that needs only its last fixed_rows rows {tokens_per_row 1, window_rows
 * fixed_rows}: the ring's rows, unrolled by position.  Returns the number
 * of streams (out needs that many; max is its capacity) or -ST_E_LIMIT.
 */
int cw_dsv4_kv_decl(const struct st_dsv4_config *c, int elem_bytes,
		    struct kv_stream_decl *out, int max);

/*
 * A prefix-cache model id for m (never 0): XXH3 of the config numbers,
 * the QAT flags, the row dtype (F32) and samples of the embedding, head
 * and final norm, so two models (or QAT settings) never share cached rows.
 */
uint64_t cw_dsv4_model_id(const struct cw_dsv4_model *m);

/*
 * Declares m's streams (cw_dsv4_kv_decl, F32 rows: reference mode) to kvd
 * through kv with page_rows tokens per page, and the model id for the
 * prefix cache (model_id 0: cw_dsv4_model_id(m)).  Once per client before
 * cw_dsv4_state_new_kv.  Errors: kv_client_declare_model's (-ST_E_CONFIG:
 * kvd holds another declaration, -ST_E_BUDGET, ...), -ST_E_LIMIT.
 */
int cw_dsv4_kv_declare(const struct cw_dsv4_model *m, struct kv_client *kv,
		       uint32_t page_rows, uint64_t model_id,
		       struct st_diag *diag);

/*
 * A sequence state whose streams live in kvd pages (kv declared with
 * cw_dsv4_kv_declare; borrowed, must outlive the state).  prompt NULL (or
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
int cw_dsv4_state_new_kv(const struct cw_dsv4_model *m, struct kv_client *kv,
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

/* ---- pieces (cw_dsv4_ops.c), exposed for the unit tests ---- */

/* Weighted RMSNorm y = w * x / sqrt(mean(x^2) + eps); w NULL: unweighted.
 * In place allowed. */
void cw_dsv4_rmsnorm(const float *x, const float *w, int n, double eps,
		     float *y);

/* Per-pair inverse frequencies (rope_dim/2 of them) of the main rope
 * (theta^(-2i/d)) or, yarn != 0, of the compress rope: HF
 * _compute_yarn_parameters with truncation and no mscale (config fields
 * compress_rope_theta, rope_scaling). */
void cw_dsv4_rope_freqs(const struct st_dsv4_config *c, int compress,
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
