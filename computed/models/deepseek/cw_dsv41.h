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
#include "st_config_dsv41.h"
#include "st_error.h"

struct cw_dsv41_model;
struct cw_dsv41_state;

/*
 * Loads config.json, engram_hash.json (when the config has Engram layers)
 * and model.safetensors (or shards) of `dir`, checking every tensor's
 * name, dtype and shape against the config: FP8 E4M3 with an F8_E8M0
 * ".scale" [ceil(out/b0), ceil(in/b1)] (b = weight_block_size), routed
 * experts detected as MXFP4 from their dtype and shape (I8 [out, in/2]
 * packed E2M1, low nibble the even element, + F8_E8M0 [out, in/32]),
 * Engram tables F8_E4M3 [rows, head_dim] with F8_E8M0 [rows, head_dim/32]
 * (one scale per 32 columns of each row), BF16/F32 others.  Tensors of
 * the vision tower, aligner, DSpark draft layers (mtp.*), image_* and
 * ffn.gate.bias_vl are skipped by name (text-only); any other tensor not
 * used is refused (-ST_E_FORMAT naming it).  An E8M0 byte 255 (NaN) is
 * refused as corrupt.  Owned by the caller (cw_dsv41_free).
 * Errors: -ST_E_CONFIG / -ST_E_FORMAT / -ST_E_NOTFOUND naming the tensor,
 * -ENOMEM, and those of st_checkpoint_open, st_dsv41_config_load and
 * st_engram_hash_load_json.
 */
int cw_dsv41_load(const char *dir, struct cw_dsv41_model **ret,
		  struct st_diag *diag);
/*
 * Loads a V4.1 model from a strata store (strata convert of a V4.1
 * checkpoint): the config from the store's manifest, the dense weights
 * from dense.bin (dequantised to F32 exactly as cw_dsv41_load does from
 * the checkpoint, so logits are bit-identical), the Engram hash from
 * engram_hash.bin; at eval time the routed experts from expertd's host
 * pool (es_client_acquire of each token's top-k per layer, dequantised
 * from the MXFP4 record, released after the layer) and the Engram rows
 * from expertd's Engram tier (cw_engram_es_get_rows, installed as the
 * provider; the rows of every position are prefetched as soon as its
 * token is known).  `es` (borrowed, must outlive the model; one eval at a
 * time) must serve this store.  QAT on, as cw_dsv41_load.
 * Errors: st_store_open's; -ST_E_UNSUPPORTED (not a V4.1 store);
 * -ST_E_FORMAT (expert records not MXFP4, no engram_hash.bin);
 * -ST_E_CONFIG (es missing or serving another store or other Engram
 * tables); -ST_E_LIMIT (the pool holds fewer than top_k experts); the
 * config parser's and loader's codes; es_client_engram_info's; -ENOMEM.
 */
struct es_client;
int cw_dsv41_load_store(const char *store_dir, struct es_client *es,
			struct cw_dsv41_model **ret, struct st_diag *diag);
/*
 * Store mode switches, both on by default, off only for measurements (the
 * results are the same either way): routing reports to expertd
 * (ES_MSG_ROUTE per layer and token: activation statistics, hot set;
 * V4.1 has no hash-routed layers, so no exact expert hints), and the
 * Engram prefetch of every evaluated position's rows (exact: the hash
 * depends on token ids only) sent before the eval runs its layers.
 */
void cw_dsv41_set_route_reports(struct cw_dsv41_model *m, int on);
void cw_dsv41_set_engram_prefetch(struct cw_dsv41_model *m, int on);

/*
 * cw_dsv41_load / cw_dsv41_load_store with a compute mode (DESIGN 6a).
 * CW_COMPUTE_REFERENCE is what those two do (bit-identical).
 * CW_COMPUTE_FAST runs the matvecs on the fast CPU backend's kernels
 * (cw_backend_cpu_fast, computed/kernels/cw_kern.h), as V4's fast mode does: the
 * FP8 dense weights (attention, shared expert, indexer wq_b, Engram wkv)
 * stay E4M3 codes (1 byte per weight instead of 4) with one float scale
 * per (row, fp8_block[1] inputs), multiplied by float activations; the
 * BF16 compressor (wkv, wgate), index key projection (indexer.wk) and LM
 * head stay BF16 (the BF16 kernel); the routed experts of a store run
 * straight from expertd's slot bytes (MXFP4 codes and E8M0 scales as
 * stored, activations int8 per 32, one quantization shared by the top-k
 * experts' w1 and w3), nothing dequantized per use (from a checkpoint
 * they are dequantized at load and run on the F32 kernel).  The router,
 * the indexer's head weights (weights_proj), mHC, norms, Engram gates,
 * attention, pooling and the QAT round trips stay reference code, so
 * routing and index selections match reference mode except near ties.
 * Not bit-identical to reference mode: tests/computed/test_dsv41_fast.c
 * states the tolerance.  Errors: as the functions without _mode, -EINVAL
 * for an unknown mode.
 */
int cw_dsv41_load_mode(const char *dir, enum cw_compute mode,
		       struct cw_dsv41_model **ret, struct st_diag *diag);
int cw_dsv41_load_store_mode(const char *store_dir, struct es_client *es,
			     enum cw_compute mode,
			     struct cw_dsv41_model **ret,
			     struct st_diag *diag);
/* The compute mode the model was loaded in. */
enum cw_compute cw_dsv41_compute(const struct cw_dsv41_model *m);
/*
 * Fast mode's data layout on another backend than cw_backend_cpu_fast:
 * with cw_backend_cpu (exact dequantization on the fly, float
 * activations) the logits equal reference mode's but for the float
 * summation order (tests).  0, or -EINVAL unless m is a fast-mode model
 * and be is not NULL.
 */
int cw_dsv41_set_backend(struct cw_dsv41_model *m,
			 const struct cw_backend_ops *be);
/*
 * Fast mode: the dense matvecs and the routed experts' matvecs split by
 * output rows over a pool of n_threads threads (cw_threads.h; the caller
 * is one of them), each output row still one kernel reduction, so the
 * logits do not depend on n_threads.  1 (the default): on the calling
 * thread.  Not during an eval.  0; -EINVAL (n_threads < 1, or > 1 for a
 * reference-mode model); the pool's errors (-ENOMEM, -errno).
 */
int cw_dsv41_set_threads(struct cw_dsv41_model *m, int n_threads);

/*
 * Store mode, both on by default (off only to measure what they bring;
 * the results are the same either way):
 *  step_hints: at the start of each eval the experts the first
 *    prefetch_depth layers (at least layer 0) are expected to use for the
 *    token about to be evaluated go to expertd as a step-named hint
 *    (es_client_hint_step, named by the token's position, so expertd
 *    keeps it past the previous token's last layer): each layer's router
 *    on the token's embedding under that layer's ffn_norm (a guess: the
 *    real FFN input adds the attention output; V4.1 has no hash-routed
 *    layers to hint exactly); needs routing reports on;
 *  expert_overlap: each routed expert is computed as soon as its slot is
 *    ready and the shared expert while the misses load
 *    (es_client_acquire_each), summed in the fixed top-k order.
 */
void cw_dsv41_set_decode_overlap(struct cw_dsv41_model *m, int step_hints,
				 int expert_overlap);

/*
 * Store mode, on by default (off only to measure what it brings; results
 * are the same either way): layer-start hints.  In a one-token eval
 * (decode), at the start of each layer l > 0, before its Engram and
 * attention, layer l's router runs on the streams as they enter the layer
 * (collapsed with the lagged pre, under the layer's ffn_norm: a guess, the
 * FFN input adds the layer's Engram and attention output) and its top-k
 * go to expertd as a step-named hint for this position (es_client_hint_step),
 * so their reads start an attention's time before the router names the
 * misses.  On the V4.1-shaped benchmark model this guess names 58 % of
 * the routed experts (the gate look-ahead from the previous layer: 54 %),
 * and tokens/s rose 10 % at 50 and 25 % host budgets (docs/BENCHMARKS.md,
 * "Layer-start hints").  Needs routing reports on.
 */
void cw_dsv41_set_layer_hints(struct cw_dsv41_model *m, int on);
/*
 * Store mode, with routing reports on: each layer's report also hints the
 * experts the routers of the next `depth` layers pick on this layer's FFN
 * input (gate look-ahead, an approximation), so their loads overlap this
 * layer's compute.  0 (the default) hints nothing ahead.  Results are the
 * same either way.  0, or -EINVAL for depth outside [0, 8].
 */
int cw_dsv41_set_prefetch_depth(struct cw_dsv41_model *m, int depth);

/* Counters of a state's evals since cw_dsv41_state_new (store mode; all
 * zero otherwise): routed experts acquired from expertd, the time spent
 * waiting for them (es_client_acquire, less the experts' compute done
 * inside es_client_acquire_each) in ns, and the bytes of the expert
 * records used. */
struct cw_dsv41_run_stats {
	uint64_t experts_acquired;
	uint64_t acquire_ns;
	uint64_t expert_bytes;
};
void cw_dsv41_state_stats(const struct cw_dsv41_state *s,
			  struct cw_dsv41_run_stats *ret);
/* Bytes of dense weights one token reads at their in-memory size (1 per
 * FP8 weight in fast mode, 2 per kept BF16, 4 per F32): every layer's
 * matrices but the routed experts, the mHC mixers and the Engram tables,
 * plus the LM head. */
uint64_t cw_dsv41_dense_bytes(const struct cw_dsv41_model *m);
/* Bytes of the LM head alone at its in-memory size (part of
 * cw_dsv41_dense_bytes), read once per position whose logits are made. */
uint64_t cw_dsv41_lm_head_bytes(const struct cw_dsv41_model *m);

/* Frees the model and its hash (NULL is fine). */
void cw_dsv41_free(struct cw_dsv41_model *m);
/* The model's parsed config (borrowed, lives as long as the model). */
const struct st_dsv41_config *cw_dsv41_config(const struct cw_dsv41_model *m);

/*
 * QAT round trips (MODEL_FAMILY_DEEPSEEK_V4.md 3.7), all on by default
 * (they are the model's semantics; off is a debug mode for strict checks
 * against reference_noqat.json):
 *  WINDOW_FP8  every K=V row after rope: FP8 E4M3 / 32, ue8m0 scale;
 *  CROW_FP4    every compressed row after rope: E2M1 / 16, E4M3 scale;
 *  INDEX_FP4   index keys and indexer queries after rope: E2M1 / 32, ue8m0.
 * Set before evaluating; a state must not mix settings.
 * Returns 0 or -EINVAL (unknown flag).
 */
enum {
	CW_DSV41_QAT_WINDOW_FP8 = 1,
	CW_DSV41_QAT_CROW_FP4 = 2,
	CW_DSV41_QAT_INDEX_FP4 = 4,
	CW_DSV41_QAT_ALL = 7,
};
int cw_dsv41_set_qat(struct cw_dsv41_model *m, unsigned flags);

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
void cw_dsv41_set_engram_provider(struct cw_dsv41_model *m,
				  const struct cw_dsv41_engram_provider *p);

/*
 * KV bytes in the V4.1 storage formats (st_kvfmt_v41.h; model doc 3.8):
 * per token, the growing global KV (every KV source's compressed row and
 * index key, divided by its ratio: 890 B for V4.1-Flash), and per
 * sequence, the fixed window rings (every layer's W FP8 rows).  The
 * reference state itself keeps F32 rows.
 */
double cw_dsv41_kv_bytes_per_token(const struct st_dsv41_config *c);
double cw_dsv41_window_bytes(const struct st_dsv41_config *c);

/* A sequence state for at most max_tokens positions.  -EINVAL, -ENOMEM. */
int cw_dsv41_state_new(const struct cw_dsv41_model *m, int max_tokens,
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
int cw_dsv41_eval(const struct cw_dsv41_model *m, struct cw_dsv41_state *s,
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
int cw_dsv41_replay(const struct cw_dsv41_model *m, struct cw_dsv41_state *s,
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

/* ---- KV streams in kvd (cw_dsv41_kv.c; docs/DESIGN.md 3a) ---- */

struct kv_client;
struct kv_stream_decl;

/*
 * kvd's declaration of the V4.1 state, layer by layer: every layer's
 * window (one row per token, the last sliding_window kept); a KV source
 * at ratio > 1 its open group's raw inputs (c then z, 2 head_dim F32, one
 * row per token, the last ratio kept); a KV source its compressed rows
 * and its index keys (one row per ratio tokens, all kept).  Row formats by
 * the QAT flags `qat` (CW_DSV41_QAT_*; st_kvfmt_v41.h): window FP8 E4M3/32
 * + ue8m0 (head_dim + head_dim/32 B), compressed rows E2M1/16 + E4M3
 * (head_dim/2 + head_dim/16 B), index keys E2M1/32 + ue8m0
 * (index_head_dim/2 + index_head_dim/32 B); a flag off: F32 rows.  With
 * CW_DSV41_QAT_ALL the growing streams sum to cw_dsv41_kv_bytes_per_token
 * (890 B per token for V4.1-Flash; model doc 3.8).  The Engram token
 * history is not a stream: the state keeps its ids (a prefix hit's are
 * the prompt's).  Returns the number of streams (out needs that many; max
 * its capacity), -ST_E_LIMIT, or -EINVAL (a KV source of ratio 0).
 */
int cw_dsv41_kv_decl(const struct st_dsv41_config *c, unsigned qat,
		     struct kv_stream_decl *out, int max);

/* A prefix-cache model id for m (never 0): XXH3 of the config numbers,
 * the QAT flags (so the row formats) and samples of the embedding, head
 * and final norm. */
uint64_t cw_dsv41_model_id(const struct cw_dsv41_model *m);

/*
 * Declares m's streams (cw_dsv41_kv_decl with m's QAT flags: set them
 * before) to kvd through kv, page_rows tokens per page, and the model id
 * (0: cw_dsv41_model_id(m)).  Once per client before
 * cw_dsv41_state_new_kv.  Errors: kv_client_declare_model's
 * (-ST_E_CONFIG: kvd holds another declaration, -ST_E_BUDGET, ...),
 * -ST_E_LIMIT, -EINVAL.
 */
int cw_dsv41_kv_declare(const struct cw_dsv41_model *m, struct kv_client *kv,
			uint32_t page_rows, uint64_t model_id,
			struct st_diag *diag);

/*
 * A sequence state in kvd pages (kv declared with cw_dsv41_kv_declare;
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
int cw_dsv41_state_new_kv(const struct cw_dsv41_model *m, struct kv_client *kv,
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
 * [n][n], row = source stream; V4's formulas, cw_dsv4_hc_pre) and its
 * sublayer input u [D] = sum_k lag_pre[k] X[k], collapsed with the
 * *previous* site's pre (one-hot on stream 0 before layer 0; the
 * attention site's pre at the FFN site), not its own.
 */
void cw_dsv41_hc_site(const float *X, int n, int D, const float *lag_pre,
		      const float *fn, const float *base, const float *scale,
		      int iters, double eps, double rms_eps, float *u,
		      float *pre, float *post, float *comb);

#endif
