/*
 * cw_dsv41.h — DeepSeek-V4.1-Flash (deepseek_v41, text model) forward
 * pass, reference mode.
 *
 * Semantics: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md section 3 (HF
 * transformers modeling_deepseek_v41.py, cache path), as the
 * tiny-deepseek-v41 fixture's README restates them: single-pass mHC with
 * the lagged pre, CSA2 (ratio-2 encoder groups and a ratio-1 decoder KV,
 * shared by the layers after their KV source; index sources, the
 * candidate-block source), Engram before its layers' mixers, the
 * sqrt-softplus router with gate_temp, clipped SwiGLU, and the three QAT
 * round trips (st_kvfmt_v41.h), on by default.
 *
 * F32 activations, dot products accumulated in double, every weight
 * dequantised exactly to F32 at load (Engram tables stay FP8 and are
 * read row by row through a provider).  Tokens are evaluated one after
 * the other within each layer, reading only their own values and what
 * earlier positions left in the state, so a one-shot prefill, any
 * chunking and token-by-token decode give bit-identical logits.
 */
#ifndef CW_DSV41_H
#define CW_DSV41_H

#include <stddef.h>
#include <stdint.h>

#include "cw_backend.h"
#include "cw_dsv.h"
#include "st_config_dsv41.h"
#include "st_error.h"

struct cw_dsv41_state;

/*
 * Store mode, on by default, off only for measurements (the results are
 * the same either way): the Engram prefetch of every evaluated position's
 * rows (exact: the hash depends on token ids only) sent before the eval
 * runs its layers.
 */
void cw_dsv41_set_engram_prefetch(struct cw_dsv_model *m, int on);

/*
 * Fast mode: the dense matvecs and the routed experts' matvecs split by
 * output rows over a pool of n_threads threads (cw_threads.h; the caller
 * is one of them), each output row still one kernel reduction, so the
 * logits do not depend on n_threads.  1 (the default): on the calling
 * thread.  Not during an eval.  0; -EINVAL (n_threads < 1, or > 1 for a
 * reference-mode model); the pool's errors (-ENOMEM, -errno).
 */
int cw_dsv41_set_threads(struct cw_dsv_model *m, int n_threads);

/* The FFN counters of a state's evals since cw_dsv41_state_new
 * (cw_dsv.h). */
void cw_dsv41_state_stats(const struct cw_dsv41_state *s,
			  struct cw_dsv_run_stats *ret);


/*
 * QAT round trips (MODEL_FAMILY_DEEPSEEK_V4.md 3.7), all on by default
 * (they are the model's semantics; off is a debug mode for strict checks
 * against reference_noqat.json):
 *  WINDOW_FP8  every K=V row after rope: FP8 E4M3 / 32, ue8m0 scale;
 *  CROW_FP4    every compressed row after rope: E2M1 / 16, E4M3 scale;
 *  INDEX_FP4   index keys and indexer queries after rope: E2M1 / 32, ue8m0.
 * Set with cw_dsv_set_qat (cw_dsv.h) before evaluating; a state must not
 * mix settings.
 */
enum {
	CW_DSV41_QAT_WINDOW_FP8 = 1,
	CW_DSV41_QAT_CROW_FP4 = 2,
	CW_DSV41_QAT_INDEX_FP4 = 4,
	CW_DSV41_QAT_ALL = 7,
};

/*
 * Where Engram embedding rows come from.  get_rows fills out[n][head_dim]
 * (engram_head_dim floats per row, dequantised: E4M3 x 2^(scale - 127)
 * per 32 columns) with rows row_ids[0..n) of the table of Engram layer
 * index `ei` (0..n_engram-1, config engram_layer[ei]); row ids are
 * table-local (the hash's offsets added).  Returns 0 or a negative code
 * with diag set; the eval then fails with it.  The default reads the
 * table loaded in memory; expertd's NVMe Engram tier plugs in here.
 */
struct cw_dsv41_engram_provider {
	int (*get_rows)(void *ctx, int ei, const int64_t *row_ids, int n,
			float *out, struct st_diag *diag);
	void *ctx;
};
/* The in-memory default's get_rows; ctx is the model (a provider may
 * fall back to it).  -EINVAL for a row outside the table. */
int cw_dsv41_engram_rows_mem(void *ctx, int ei, const int64_t *row_ids,
			     int n, float *out, struct st_diag *diag);
/* Installs p (copied; NULL: the default: the in-memory table, or for a
 * store model expertd's Engram tier).  Not during an eval. */
void cw_dsv41_set_engram_provider(struct cw_dsv_model *m,
				  const struct cw_dsv41_engram_provider *p);

/*
 * KV bytes in the V4.1 storage formats (st_kvfmt_v41.h; model doc 3.8):
 * per token, the growing global KV (every KV source's compressed row and
 * index key, divided by its ratio: 890 B for V4.1-Flash), and per
 * sequence, the fixed window rings (every layer's W FP8 rows).  The
 * reference state itself keeps F32 rows.
 */
double cw_dsv41_kv_bytes_per_token(const struct st_dsv_config *c);
double cw_dsv41_window_bytes(const struct st_dsv_config *c);

/* A sequence state for at most max_tokens positions.  -EINVAL, -ENOMEM. */
int cw_dsv41_state_new(const struct cw_dsv_model *m, int max_tokens,
		       struct cw_dsv41_state **ret);
/* Frees a state (NULL is fine). */
void cw_dsv41_state_free(struct cw_dsv41_state *s);
/* Positions already evaluated. */
int cw_dsv41_state_len(const struct cw_dsv41_state *s);

/*
 * Evaluates tokens ids[0..n) at the state's next positions and appends
 * them.  logits: if all_positions, n rows of vocab_size floats, else one
 * row (the last token's); NULL skips the head.
 * Errors: -ST_E_LIMIT (past max_tokens), -EINVAL (token id out of range;
 * all_positions with the CED shortcut on), the Engram provider's code;
 * the state is unchanged on the argument errors, undefined after a
 * provider error.
 */
int cw_dsv41_eval(const struct cw_dsv_model *m, struct cw_dsv41_state *s,
		  const int32_t *ids, int n, int all_positions, float *logits,
		  struct st_diag *diag);

/*
 * CED prefill shortcut (MODEL_FAMILY_DEEPSEEK_V4.md 3.4): the layers after
 * the last KV source own nothing but window KV, so a prefill need not run
 * them on every token.  Modes:
 *  CW_DSV41_CED_WINDOW  they run on the last sliding_window tokens of each
 *             eval only (vLLM decoder_replay_layers; "the last 128 rows"
 *             of the model doc).  Approximate: the first of those tokens
 *             see a window truncated to the rows computed, so the rings
 *             and logits differ from the full computation; decode steps
 *             keep seeing the truncated rows until they slide out;
 *  CW_DSV41_CED_EXACT   they run on the dependency cone of the last
 *             window instead: the k-th layer from the end on the last
 *             W + k (W - 1) tokens.  The window rings and the last
 *             position's logits are bit-identical to the full
 *             computation (V4.1-Flash: 19 decoder layers, W 128, so a
 *             prompt longer than 2414 tokens saves work).
 * With either, only the last position's logits exist, so an eval with
 * all_positions is refused (-EINVAL).  Off by default; returns 0 or
 * -EINVAL for an unknown mode.
 */
enum {
	CW_DSV41_CED_OFF = 0,
	CW_DSV41_CED_EXACT = 1,
	CW_DSV41_CED_WINDOW = 2,
};
int cw_dsv41_set_ced_shortcut(struct cw_dsv41_state *s, int mode);

/*
 * SWA bounded replay (MODEL_FAMILY_DEEPSEEK_V4.md 3.6).  After a prefix
 * hit the global KV (compressed rows, index keys, partial groups, token
 * history) is restored but not the window KV; cw_dsv41_state_drop_window
 * forgets every window row (as such a restore leaves the state), and
 * cw_dsv41_replay rebuilds the rings by re-evaluating the prefix's last
 * n tokens ids[0..n) (positions len-n .. len-1) without appending to the
 * global KV.  Approximate by the model's definition: a replayed token
 * attends only to the replayed rows before it, not to the dropped ones,
 * so the rebuilt rows differ from the exact ones (the report calls this
 * "a graceful, inexpensive degradation"); replaying the whole prefix
 * (n = len) is exact.  Errors: -EINVAL (n out of [1, len], a token id
 * that differs from the state's history); provider errors.
 */
void cw_dsv41_state_drop_window(struct cw_dsv41_state *s);
int cw_dsv41_replay(const struct cw_dsv_model *m, struct cw_dsv41_state *s,
		    const int32_t *ids, int n, struct st_diag *diag);

/*
 * Debug record of the evals while set (NULL to skip), indexed by the
 * token's place t in the eval's chunk (t < max_tokens); arrays owned by
 * the caller, any may be NULL:
 *  engram_rows  [t][n_engram][rows per position] table-local row ids;
 *  engram_gates [t][n_engram][hc_mult];
 *  experts, weights  [t][n_layers][top_k] routed ids and weights;
 *  selected     [t][n_layers][index_topk] (index sources: the entries
 *               chosen, sorted, -1 after the last);
 *  cand_blocks  [t][candidate_topk_blocks] (the candidate source's
 *               blocks, sorted, -1 after the last);
 *  stream_rms   [t][n_layers]: RMS over the hc_mult x D stream values
 *               after the layer.
 */
struct cw_dsv41_debug {
	int max_tokens;
	int64_t *engram_rows;
	float *engram_gates;
	int32_t *experts;
	float *weights;
	int32_t *selected;
	int32_t *cand_blocks;
	float *stream_rms;
};
void cw_dsv41_set_debug(struct cw_dsv41_state *s, struct cw_dsv41_debug *dbg);

/* Times s's evals by phase on tl (cw_steptime.h: dense, experts, head;
 * borrowed, must outlive its use; NULL: off). */
struct cw_steptime;
void cw_dsv41_set_steptime(struct cw_dsv41_state *s, struct cw_steptime *tl);

/* ---- KV streams in kvd (cw_dsv_kv.c; docs/DESIGN.md 3a) ---- */

struct kv_client;

/*
 * A sequence state in kvd pages (kv declared with cw_dsv_kv_declare;
 * borrowed, must outlive the state), as cw_dsv4_state_new_kv: prompt NULL
 * (n_prompt 0): an empty sequence; otherwise prefix mode: the longest
 * cached chain of the prompt's full pages is mapped, the state starts at
 * that length (a multiple of page_rows, at most n_prompt - 1) and the
 * prompt's full pages are published after every eval.  Each eval pins the
 * sequence (restoring spilled pages), reserves its tokens, unpins; after
 * a kvd restart the client re-registers and the state goes on.
 * swa_replay (model doc 3.6): 0, the exact default: a prefix hit maps the
 * window rows the prefix entry carries (bit-identical to the full
 * computation); n > 0, the model's way: after a prefix hit the window is
 * dropped and rebuilt by replaying the hit's last min(n, len) tokens
 * (cw_dsv41_replay; approximate unless n >= len; the model uses n =
 * sliding_window).  A replayed state, or one with the CED shortcut on,
 * publishes nothing (its pages lack window rows).  With the same QAT
 * flags the logits are bit-identical to cw_dsv41_state_new's.
 * Errors: -EINVAL (bad prompt, swa_replay < 0), -ST_E_CONFIG (kv holds
 * no declaration of m with its current QAT flags), kv_client_seq_create
 * (_prefix)'s, the replay's, -ENOMEM.
 */
int cw_dsv41_state_new_kv(const struct cw_dsv_model *m, struct kv_client *kv,
			  const int32_t *prompt, int n_prompt, int swa_replay,
			  struct cw_dsv41_state **ret, struct st_diag *diag);

/*
 * Publishes the full pages of a kvd state's first n tokens (ids[0..n), the
 * ids it was evaluated on) in the prefix cache.  Returns the page groups
 * newly published (>= 0); -EINVAL (process-local state, n out of [1, len],
 * a state rebuilt by SWA replay or with the CED shortcut on);
 * kv_client_seq_publish's errors.
 */
int cw_dsv41_state_publish(struct cw_dsv41_state *s, const int32_t *ids,
			   int n, struct st_diag *diag);

/* kvd sequence handle of a kvd state (0 for a process-local one). */
uint32_t cw_dsv41_state_seq(const struct cw_dsv41_state *s);

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
 * Top-k selection from index scores sc[0..n_vis): the top min(top_k,
 * n_vis) entries, ties to the lower entry, picks with score -inf dropped;
 * sel gets them sorted; returns their count.
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
