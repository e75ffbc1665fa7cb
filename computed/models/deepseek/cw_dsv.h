/*
 * cw_dsv.h — the DeepSeek-V4 family's model: one loader and one model
 * object for every revision (V4: model_type "deepseek_v4"; V4.1-Flash
 * text model: "deepseek_v41"), chosen by the checkpoint's or the store's
 * config (st_config_dsv_family.h: cfg.revision), and one sequence state
 * and forward pass (cw_dsv_eval) in which a revision's differences are
 * switches: V4's QAT flags and hash routing; V4.1's single-pass mHC,
 * CSA2, FP4 main KV formats, Engram, the CED shortcut and SWA replay
 * (functions named cw_dsv4_* / cw_dsv41_* are the revision's own).
 *
 * Semantics: ../shared/MODEL_FAMILY_DEEPSEEK_V4.md sections 2 (V4) and 3
 * (V4.1).  Reference mode: F32 activations (dot products accumulated in
 * double), every weight dequantised exactly to F32 at load (V4.1's Engram
 * tables stay FP8 and are read row by row through a provider).
 */
#ifndef CW_DSV_H
#define CW_DSV_H

#include <stdint.h>

#include "cw_backend.h"
#include "st_config_dsv_family.h"
#include "st_error.h"

struct cw_dsv_model;
struct es_client;

/*
 * Loads config.json (V4.1: and engram_hash.json when the config has
 * Engram layers) and model.safetensors (or shards) of `dir`, checking
 * every tensor's name, dtype and shape against the config: FP8 E4M3 with
 * an F8_E8M0 ".scale" [ceil(out/b0), ceil(in/b1)] (b from
 * quantization_config.weight_block_size), routed experts as I8 packed
 * E2M1 (low nibble = even element) with an F8_E8M0 ".scale" per 32 inputs
 * (V4.1 also accepts FP8 experts, detected from the dtype), BF16/F32
 * tensors; V4: I64 tid2eid in hash layers (ids checked < n_experts),
 * the MTP block mtp.0.* (cw_dsv_mtp_eval) where the config has one;
 * V4.1: Engram tables F8_E4M3 [rows, head_dim] with F8_E8M0
 * [rows, head_dim/32]; the vision tower, aligner, DSpark draft
 * layers (mtp.*), image_* and ffn.gate.bias_vl skipped by name
 * (text-only), any other tensor not used refused (-ST_E_FORMAT naming
 * it).  A scale byte 255 (E8M0 NaN) is refused as corrupt.
 * want: the revision the caller expects (the config must be one; its
 * reader's errors otherwise), or 0 for whichever the config names.
 * mode (DESIGN 6a): CW_COMPUTE_REFERENCE, or CW_COMPUTE_FAST: the matvecs
 * on the fast CPU backend's kernels (cw_backend_cpu_fast,
 * computed/kernels/cw_kern.h), FP8 dense weights kept E4M3 codes (1 byte
 * per weight) with one float scale per (row, fp8_block[1] inputs), the
 * BF16 compressors, index key projection and LM head kept BF16, other
 * matrices on the F32 kernel; the router, the indexer's head weights,
 * mHC, norms, Engram gates, attention, pooling and the QAT round trips
 * stay reference code.  Not bit-identical to reference mode:
 * tests/computed/test_dsv_fast.c states the tolerance per revision.  Both revisions start in the official math
 * (cw_dsv_qat_official: every round trip the official inference code
 * applies; docs/DESIGN.md "DeepSeek-V4 math vs the official code");
 * cw_dsv_set_qat(m, 0) is the exact math of the fixtures' strict
 * references.  Owned by the caller (cw_dsv_free).
 * Errors: -ST_E_CONFIG / -ST_E_FORMAT / -ST_E_NOTFOUND naming the tensor,
 * -EINVAL (unknown mode), -ENOMEM, and those of st_checkpoint_open, the
 * config reader (st_dsv_config_load with the revision) and
 * st_engram_hash_load_json.
 */
int cw_dsv_load(const char *dir, enum st_dsv_revision want,
		enum cw_compute mode, struct cw_dsv_model **ret,
		struct st_diag *diag);

/*
 * Loads a model from a strata store (strata convert of a V4 or V4.1
 * checkpoint): the config from the store's manifest, the dense weights
 * from dense.bin (dequantised exactly as cw_dsv_load does from the
 * checkpoint, so logits are bit-identical), at eval time the routed
 * experts from expertd's host pool (es_client_acquire of each token's
 * top-k per layer; reference mode dequantises the MXFP4 record, fast mode
 * runs straight from the slot bytes: activations int8 per 32, one
 * quantization shared by the top-k experts' w1 and w3), so expertd's
 * --host-budget bounds the expert memory; V4.1: the Engram hash from
 * engram_hash.bin and the Engram rows from expertd's Engram tier
 * (cw_engram_es_get_rows, installed as the provider).  `es` (borrowed,
 * must outlive the model; one eval at a time) must serve this store.
 * want and mode as cw_dsv_load.
 * Errors: st_store_open's; -ST_E_UNSUPPORTED (not a store of revision
 * want: "not a DeepSeek-V4 store", "not a DeepSeek-V4.1 store"; want 0:
 * not of the family); -ST_E_FORMAT (expert records not MXFP4, V4.1
 * without engram_hash.bin); -ST_E_CONFIG (es missing or serving another
 * store or other Engram tables); -ST_E_LIMIT (the pool holds fewer than
 * top_k experts); the config parser's and loader's codes; -ENOMEM.
 */
int cw_dsv_load_store(const char *store_dir, struct es_client *es,
		      enum st_dsv_revision want, enum cw_compute mode,
		      struct cw_dsv_model **ret, struct st_diag *diag);

/* Frees the model (NULL is fine). */
void cw_dsv_free(struct cw_dsv_model *m);
/* The model's parsed config (borrowed, lives as long as the model);
 * ->revision says which release it is. */
const struct st_dsv_config *cw_dsv_config(const struct cw_dsv_model *m);
/* The compute mode the model was loaded in. */
enum cw_compute cw_dsv_compute(const struct cw_dsv_model *m);

/*
 * Fast mode's data layout (FP8 codes with expanded scales, expert views
 * of the slot bytes) on another backend than cw_backend_cpu_fast: with
 * cw_backend_cpu (exact dequantization on the fly, float activations) the
 * logits equal reference mode's but for the float summation order, which
 * separates the layout from the kernels' int8 approximation (tests).
 * 0, or -EINVAL unless m is a fast-mode model and be is not NULL.
 */
int cw_dsv_set_backend(struct cw_dsv_model *m,
		       const struct cw_backend_ops *be);

/*
 * The revision's QAT round trips (V4: CW_DSV4_QAT_*; V4.1:
 * CW_DSV41_QAT_*; what each does: below).  A model starts with
 * cw_dsv_qat_official(m); 0 is the exact math (no round trip: the
 * fixtures' strict references, `--exact-math` of computed and strata
 * run).  Set before evaluating; a state must not mix settings.
 * Returns 0, -EINVAL (a flag the revision does not have),
 * -ST_E_UNSUPPORTED (V4's INDEX_FP4 with an index_head_dim that is not a
 * power of two: the Hadamard transform needs one).
 */
int cw_dsv_set_qat(struct cw_dsv_model *m, unsigned flags);
/* The QAT flags m computes with now. */
unsigned cw_dsv_qat(const struct cw_dsv_model *m);
/*
 * The flags of the official inference code for m's revision and config
 * (V4: CW_DSV4_QAT_OFFICIAL, less INDEX_FP4 where index_head_dim is not
 * a power of two; V4.1: CW_DSV41_QAT_OFFICIAL), the default at load.
 */
unsigned cw_dsv_qat_official(const struct cw_dsv_model *m);
/* The name of m's math for summaries: "official" (the flags of
 * cw_dsv_qat_official), "exact" (none) or "custom" (any other set). */
const char *cw_dsv_math_name(const struct cw_dsv_model *m);

/*
 * Store mode: whether each layer's routing is reported to expertd
 * (ES_MSG_ROUTE: activation statistics and hot set), with, in V4, the
 * experts of every later hash-routed layer as prefetch hints (known
 * exactly from the token id: tid2eid; V4.1 has no hash-routed layers).
 * On by default; off only for measurements (the results are the same
 * either way).
 */
void cw_dsv_set_route_reports(struct cw_dsv_model *m, int on);

/*
 * Store mode, both on by default (off only to measure what they bring;
 * the results are the same either way):
 *  step_hints: at the start of each eval the experts the token about to
 *    be evaluated is expected to use go to expertd as a step-named hint
 *    (es_client_hint_step), so their reads start before layer 0 (V4: the
 *    hash-routed layers' experts, exact; V4.1: the first prefetch_depth
 *    layers' routers (at least layer 0's) on the token's embedding under
 *    the layer's ffn_norm, a guess); needs route reports on;
 *  expert_overlap: each routed expert is computed as soon as its slot is
 *    ready and the shared expert while the misses load
 *    (es_client_acquire_each), summed in the fixed top-k order, instead of
 *    after all top-k are ready.
 */
/* The expert_overlap switch of cw_dsv_set_decode_overlap alone. */
void cw_dsv_set_expert_overlap(struct cw_dsv_model *m, int on);
void cw_dsv_set_decode_overlap(struct cw_dsv_model *m, int step_hints,
			       int expert_overlap);

/*
 * Store mode, on by default (off only to measure what it brings; results
 * are the same either way): layer-start hints.  In a one-token eval
 * (decode), at the start of each score-routed layer (V4.1: each layer
 * l > 0, before its Engram and attention), the layer's router runs on the
 * streams as they enter the layer (collapsed, under the layer's ffn_norm:
 * a guess, the FFN input adds the attention output) and its top-k go to
 * expertd as a step-named hint for this position (es_client_hint_step),
 * so their reads start an attention's time before the router names the
 * misses.  On the V4.1-shaped benchmark model this guess names 58 % of the
 * routed experts (the gate look-ahead from the previous layer: 54 %), and
 * tokens/s rose 10 % at 50 and 25 % host budgets (docs/BENCHMARKS.md,
 * "Layer-start hints").  Needs routing reports on.
 */
void cw_dsv_set_layer_hints(struct cw_dsv_model *m, int on);

/*
 * Store mode, with routing reports on: also hint expertd the experts the
 * routers of the next `depth` score-routed layers pick on the current
 * layer's FFN input (gate look-ahead, an approximation; V4's hash-routed
 * layers are always hinted exactly), so their loads overlap this layer's
 * compute.  0 (the default) hints no score-routed layer ahead.  Results
 * are the same either way.  0, or -EINVAL for depth outside [0, 8].
 */
int cw_dsv_set_prefetch_depth(struct cw_dsv_model *m, int depth);

/* Counters of a state's evals since it was made (store mode; all zero
 * otherwise): routed experts acquired from expertd, the time spent
 * waiting for them (es_client_acquire, less the experts' compute done
 * inside es_client_acquire_each) in ns, and the bytes of the expert
 * records used.  The revision's state_stats reads them. */
struct cw_dsv_run_stats {
	uint64_t experts_acquired;
	uint64_t acquire_ns;
	uint64_t expert_bytes;
};

/* Bytes of dense weights one token reads at their in-memory size (1 per
 * FP8 weight in fast mode, 2 per kept BF16, 4 per F32): every layer's
 * matrices but the routed experts, the mHC mixers and V4.1's Engram
 * tables, plus the LM head. */
uint64_t cw_dsv_dense_bytes(const struct cw_dsv_model *m);
/* Bytes of the LM head alone at its in-memory size (part of
 * cw_dsv_dense_bytes), read once per position whose logits are made. */
uint64_t cw_dsv_lm_head_bytes(const struct cw_dsv_model *m);

/* ---- the sequence state and the forward pass (cw_dsv_state.c,
 * cw_dsv_eval.c; the revisions' layers: cw_dsv4.c, cw_dsv41.c) ---- */

/*
 * A sequence state: per layer the revision's streams (DESIGN 3a).  V4: a
 * ring of the last sliding_window K=V rows, the compressors' partial
 * windows (raw per-token inputs: 2m tokens for CSA, m for HCA), and the
 * compressed and indexer rows (growing).  V4.1: the window ring, and per
 * KV source its open group's inputs, compressed rows and index keys; the
 * token ids (Engram's hash).  Process-local arrays (cw_dsv_state_new) or
 * kvd pages (cw_dsv_state_new_kv).  Tokens are evaluated one after the
 * other within each layer, so full prefill, any chunking and
 * token-by-token decode give bit-identical logits.
 */
struct cw_dsv_state;

/* A process-local sequence state for at most max_tokens positions.
 * -EINVAL (max_tokens < 1), -ENOMEM. */
int cw_dsv_state_new(const struct cw_dsv_model *m, int max_tokens,
		     struct cw_dsv_state **ret);
/* Frees a state (NULL is fine); a kvd state's sequence too. */
void cw_dsv_state_free(struct cw_dsv_state *s);

/* Positions a process-local state (and the MTP block's window) may be
 * cut back behind the highest it evaluated: its fixed rings (window,
 * compressor inputs) hold this many rows more than the math needs, so
 * the rows a rejected draft overwrote are never ones a shorter sequence
 * still reads. */
#define CW_DSV_ROLLBACK_MAX 16

/*
 * Cuts a V4 state back to its first len positions, as if the later ones
 * had never been evaluated (the rejected tokens of a verified draft): the
 * next eval continues at len, and its logits are bit-identical to those
 * of a state that never saw the cut tokens.  The compressed and index
 * rows the cut tokens emitted are rewritten when the same windows close
 * again (rows are read by position only).  A process-local state: len
 * must be at least the highest position it evaluated + 1 -
 * CW_DSV_ROLLBACK_MAX (its rings' slack).  A kvd state (rows by position,
 * no ring) is cut in kvd too (kv_client_seq_truncate): kvd refuses a cut
 * whose window rows it freed as the sequence grew (a cut to at least the
 * length before the last eval never is) or one that would roll back a
 * published row (cw_dsv_state_set_publish_lag keeps drafts unpublished).
 * Errors: -EINVAL (len out of range, with the reason), -ST_E_UNSUPPORTED
 * (a V4.1 state: its rings keep no slack), -ST_E_STALE (a kvd state whose
 * earlier eval failed part way), kv_client_seq_truncate's.
 */
int cw_dsv_state_truncate(struct cw_dsv_state *s, int len,
			  struct st_diag *diag);

/*
 * A kvd state in prefix mode that verifies drafts: the positions past
 * the prompt within `lag` of its length are not published (kvd refuses to
 * cut a published row back); 0 (the default): every evaluated position
 * is.  0, or -EINVAL for lag outside [0, CW_DSV_ROLLBACK_MAX].
 */
int cw_dsv_state_set_publish_lag(struct cw_dsv_state *s, int lag);

/* Positions already evaluated. */
int cw_dsv_state_len(const struct cw_dsv_state *s);
/* The FFN counters of a state's evals since it was made. */
void cw_dsv_state_stats(const struct cw_dsv_state *s,
			struct cw_dsv_run_stats *ret);

/*
 * Evaluates tokens ids[0..n) at the state's next positions and appends
 * them to it.  logits: if all_positions, n rows of vocab_size floats, else
 * one row (the last token's).  NULL skips the head.
 * Errors: -ST_E_LIMIT (past max_tokens), -EINVAL (token id out of range;
 * V4.1: all_positions with the CED shortcut on); the state is unchanged
 * on these.  V4.1's Engram provider's code (the state is then
 * undefined).  Errors past the checks (expertd's, kvd's for a kvd state:
 * -ST_E_PEERGONE, -ST_E_BUDGET, -ST_E_STALE) may leave rows of the chunk
 * written: the state is then unusable.
 */
int cw_dsv_eval(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		const int32_t *ids, int n, int all_positions, float *logits,
		struct st_diag *diag);

/*
 * Debug record of the evals while set (NULL to skip), indexed by the
 * token's place t in the eval's chunk (t < max_tokens); arrays owned by
 * the caller, any may be NULL:
 *  experts, weights  [t][n_layers][top_k] routed ids and weights;
 *  selected     [t][n_layers][index_topk] the compressed rows / entries
 *               chosen (V4: CSA layers; V4.1: index sources), sorted, -1
 *               after the last;
 *  stream_rms   [t][n_layers]: RMS over the hc_mult x D stream values
 *               after the layer;
 *  V4.1 only:
 *  engram_rows  [t][n_engram][rows per position] table-local row ids;
 *  engram_gates [t][n_engram][hc_mult];
 *  cand_blocks  [t][candidate_topk_blocks] (the candidate source's
 *               blocks, sorted, -1 after the last).
 */
struct cw_dsv_debug {
	int max_tokens;
	int32_t *experts;
	float *weights;
	int32_t *selected;
	float *stream_rms;
	int64_t *engram_rows;
	float *engram_gates;
	int32_t *cand_blocks;
};
void cw_dsv_set_debug(struct cw_dsv_state *s, struct cw_dsv_debug *dbg);

/*
 * The streams after the last decoder layer (before hc_head: [hc_mult][D]
 * floats per token) of the tokens of every later eval, token t of the
 * eval's chunk into buf + t * hc_mult * D for t < rows (buf owned by the
 * caller, must outlive its use; NULL or rows 0: off).  What V4's MTP block
 * reads (cw_dsv_mtp_eval).
 */
void cw_dsv_set_streams_out(struct cw_dsv_state *s, float *buf, int rows);

/* ---- V4's multi-token prediction block (cw_dsv_mtp.c) ---- */

/* Whether m carries V4's MTP draft block: a V4 checkpoint with
 * num_nextn_predict_layers > 0 and its mtp.0.* tensors (cw_dsv_load), or
 * a store converted from one (cw_dsv_load_store; expertd serves the
 * block's experts as its last expert layer).  1 or 0. */
int cw_dsv_has_mtp(const struct cw_dsv_model *m);


/*
 * V4's MTP block (official inference/model.py MTPBlock; cw_dsv_mtp.c) at
 * position p of state s: input x [hc_mult][D], the main model's streams
 * at p (cw_dsv_set_streams_out) or, chaining drafts, the block's own
 * x_out of position p - 1; token: the token at p + 1.  logits [vocab]
 * (NULL: skipped) predict the token at p + 2; x_out [hc_mult][D] (NULL:
 * skipped) is what a further step at p + 1 takes as x.  Both NULL: only
 * p's window row is made (it depends on p's input alone; no attention, no
 * experts), all a later position needs of p.  The block keeps a
 * window of its own per state, so p must be at most the number of
 * positions it evaluated (each position reads the rows of the earlier
 * ones) and at least the highest it evaluated + 1 - CW_DSV_ROLLBACK_MAX;
 * re-evaluating a position replaces its row (a draft chain rolled back,
 * then re-run on the main model's accepted streams).  Independent of the
 * main model's positions in s (its decoder-layer rows are never read or
 * written).  Errors: -ST_E_UNSUPPORTED (no MTP block), -EINVAL (p or
 * token out of range, with the reason), -ENOMEM, the MoE's.
 */
int cw_dsv_mtp_eval(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    int64_t p, const float *x, int32_t token, float *logits,
		    float *x_out, struct st_diag *diag);

/*
 * Drafting with the MTP block on state s (issue 22): from now on, after
 * each eval the block is run teacher-forced on the evaluated positions but
 * the last (their streams and next tokens; a prefix-cache hit's mapped
 * positions it never saw: it starts after them), and the streams of the
 * last CW_DSV_ROLLBACK_MAX + 1 positions are kept, so cw_dsv_mtp_draft
 * can propose the next tokens.  Call before the first eval for the block
 * to see the whole prompt.  0; -ST_E_UNSUPPORTED (no MTP block), -ENOMEM.
 */
int cw_dsv_mtp_follow(const struct cw_dsv_model *m, struct cw_dsv_state *s);

/*
 * Up to k (1..CW_DSV_ROLLBACK_MAX) draft tokens into out[k] after the
 * state's last evaluated position P = len - 1, given `next`, the token
 * sampled at P + 1 (not yet evaluated): the block at P on the main
 * model's streams there and next, its argmax the first draft; then at
 * P + i on its own output streams and the previous draft (greedy: the
 * proposal is a point mass, as prompt-lookup's).  Needs
 * cw_dsv_mtp_follow, and P among the positions whose streams the last
 * eval kept (after a cut of at most CW_DSV_ROLLBACK_MAX it is).  Returns
 * the drafts made (k), or -EINVAL (not following, P not kept, k or next
 * out of range), -ENOMEM, the block's errors.
 */
int cw_dsv_mtp_draft(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		     int32_t next, int k, int32_t *out, struct st_diag *diag);

/* The MTP block's evaluations on s (each reads top_k routed experts of
 * its layer) and LM-head rows it made (drafts) since the last call; the
 * counts restart at 0.  What a server adds to its read figures. */
void cw_dsv_mtp_take_counts(struct cw_dsv_state *s, uint64_t *ret_evals,
			    uint64_t *ret_heads);

/* Times s's evals by phase on tl (cw_steptime.h: dense, experts, head;
 * borrowed, must outlive its use; NULL: off). */
struct cw_steptime;
void cw_dsv_set_steptime(struct cw_dsv_state *s, struct cw_steptime *tl);

/* ---- KV streams (DESIGN 3a; cw_dsv_streams.c, cw_dsv_kv.c) ---- */

enum cw_dsv_stream_kind {
	CW_DSV_WINDOW = 0,    /* K=V rows, only the last sliding_window kept */
	CW_DSV_COMP_ROWS,     /* compressed rows, all kept */
	CW_DSV_INDEX_ROWS,    /* indexer key rows, all kept */
	CW_DSV_COMP_STATE,    /* compressor partial window (fixed, overwritten) */
	CW_DSV_INDEX_STATE,   /* V4 CSA: indexer compressor partial window */
};

/* One stream of a layer.  Growing streams (rows_den > 0) get one row per
 * rows_den tokens; fixed ones (window, state) hold fixed_rows rows per
 * sequence.  A row is row_elems elements. */
struct cw_dsv_stream {
	enum cw_dsv_stream_kind kind;
	int row_elems;
	int rows_den;    /* 1: a row per token; 2, 4, 128: compressed; 0: fixed */
	int fixed_rows;  /* window: W; state: tokens of raw inputs kept */
};

#define CW_DSV_MAX_STREAMS 5

/*
 * The streams of layer `layer` (at most CW_DSV_MAX_STREAMS) into out, in
 * the order of the kvd declaration; returns their count.  Every layer has
 * its window (a fixed stream of W rows; a sequence shorter than W uses
 * fewer).  V4 (MODEL_FAMILY_DEEPSEEK_V4.md 2.6), a layer of ratio m > 0:
 * compressed rows (one per m tokens), the compressor's state (raw inputs c
 * then z of 2m tokens for CSA, m = 4, whose two series make a row 4
 * head_dim; m tokens of 2 head_dim for HCA), and for CSA the indexer's
 * rows and state.  V4.1 (3.7), a KV source of ratio m: at m > 1 the open
 * group's raw inputs (m tokens of 2 head_dim), then its compressed rows
 * and index keys (one per m tokens).  Errors: -EINVAL (a layer out of
 * range, a V4.1 KV source of ratio 0).
 */
int cw_dsv_streams(const struct st_dsv_config *c, int layer,
		   struct cw_dsv_stream *out);

/*
 * Bytes of one row of stream s in kvd.  V4: row_elems x elem_bytes (4:
 * the F32 rows of the reference state; 2: BF16, for planning).  V4.1: its
 * storage formats by the QAT flags qat (CW_DSV41_QAT_*; st_kvfmt_v41.h):
 * window FP8 E4M3/32 + ue8m0 (head_dim + head_dim/32 B), compressed rows
 * E2M1/16 + E4M3 (head_dim/2 + head_dim/16 B), index keys E2M1/32 + ue8m0
 * (index_head_dim/2 + index_head_dim/32 B); a flag off, and the group
 * state always: F32 rows.
 */
uint32_t cw_dsv_stream_row_bytes(const struct st_dsv_config *c,
				 const struct cw_dsv_stream *s, unsigned qat,
				 int elem_bytes);

struct kv_client;
struct kv_stream_decl;

/*
 * kvd's declaration of the model's streams: every layer's cw_dsv_streams
 * in layer order, rows of cw_dsv_stream_row_bytes(qat, elem_bytes).  A
 * growing stream of one row per rows_den tokens is {tokens_per_row =
 * rows_den, window_rows 0}; a fixed one (the window ring W, a compressor's
 * partial window) is a per-token stream that needs only its last
 * fixed_rows rows {tokens_per_row 1, window_rows fixed_rows}: the ring's
 * rows, unrolled by position.  V4.1 with CW_DSV41_QAT_ALL: the growing
 * streams sum to cw_dsv41_kv_bytes_per_token (890 B per token for
 * V4.1-Flash; model doc 3.8); the Engram token history is not a stream
 * (the state keeps its ids).  Returns the number of streams (out needs
 * that many; max is its capacity), -ST_E_LIMIT, or cw_dsv_streams' -EINVAL.
 */
int cw_dsv_kv_decl(const struct st_dsv_config *c, unsigned qat,
		   int elem_bytes, struct kv_stream_decl *out, int max);

/*
 * A prefix-cache model id for m (never 0): XXH3 of the revision, the
 * config numbers, the compute mode, the QAT flags (so the row formats)
 * and samples of the embedding, head and final norm, so two models (or
 * QAT settings) never share cached rows.
 */
uint64_t cw_dsv_model_id(const struct cw_dsv_model *m);

/*
 * Declares m's streams (cw_dsv_kv_decl: V4 F32 rows; V4.1 the formats of
 * m's QAT flags, set them before) to kvd through kv with page_rows tokens
 * per page, and the model id for the prefix cache (model_id 0:
 * cw_dsv_model_id(m)).  Once per client before the revision's
 * state_new_kv.  Errors: kv_client_declare_model's (-ST_E_CONFIG: kvd
 * holds another declaration, -ST_E_BUDGET, ...), -ST_E_LIMIT, -EINVAL.
 */
int cw_dsv_kv_declare(const struct cw_dsv_model *m, struct kv_client *kv,
		      uint32_t page_rows, uint64_t model_id,
		      struct st_diag *diag);

/* ---- sequence states in kvd (cw_dsv_kv.c; docs/DESIGN.md 3a, 9) ---- */

/*
 * A sequence state whose streams live in kvd pages (kv declared with
 * cw_dsv_kv_declare with m's current QAT flags; borrowed, must outlive
 * the state).  prompt NULL (or n_prompt 0): an empty sequence, no prefix
 * cache.  Otherwise (prefix mode) the prefix cache is asked for the
 * prompt: the longest chain of published full pages of the same leading
 * ids is mapped and the state starts at that length (cw_dsv_state_len: a
 * multiple of page_rows, at most n_prompt - 1; the caller evaluates
 * prompt[len..n_prompt), in any chunks), and after every eval the full
 * pages reached so far are published (before the next eval could free
 * their window pages): the prompt's while the evaluated ids are the
 * prompt's (an id that differs ends publishing there), then those of
 * every token fed after the prompt (generated tokens, decode crossing a
 * page boundary), the first KV_PROTO_MAX_IDS ids at most; a refused
 * publish is warned about and ends publishing for the state, the logits
 * are unaffected.  Each cw_dsv_eval pins the sequence (restoring spilled
 * pages), reserves its new tokens, computes and unpins it, so an idle
 * state may be spilled by kvd (and, as kvd's windowed streams do, frees
 * the window and compressor-state pages that fell out of the window
 * unless published: publish each chunk's full pages before the next eval
 * to keep the whole chain cacheable; an eval that fails after its
 * reservation leaves the state unusable: free it, -ST_E_STALE after);
 * after a kvd restart the client re-registers and the state goes on (set
 * kv_client_set_restart_wait).  The length is limited by kvd's
 * --max-rows-per-seq (-ST_E_LIMIT from the eval).  cw_dsv_state_free
 * frees the kvd sequence.  With the same QAT flags the logits are
 * bit-identical to cw_dsv_state_new's.
 * swa_replay (V4.1, model doc 3.6; V4: must be 0): 0, the exact default:
 * a prefix hit maps the window rows the prefix entry carries; n > 0, the
 * model's way: after a prefix hit the window is dropped and rebuilt by
 * replaying the hit's last min(n, len) tokens (cw_dsv41_replay;
 * approximate unless n >= len; the model uses n = sliding_window).  A
 * replayed state, or one with the CED shortcut on, publishes nothing
 * (its pages lack window rows).
 * Errors: -EINVAL (no kv, bad prompt, swa_replay < 0 or > 0 for V4),
 * -ST_E_CONFIG (V4.1: kv holds no declaration of m with its current QAT
 * flags; checked after the sequence is created, which attaches a client
 * whose kvd restarted with a new pool again), kv_client_seq_create
 * (_prefix)'s, the replay's, -ENOMEM.
 */
int cw_dsv_state_new_kv(const struct cw_dsv_model *m, struct kv_client *kv,
			const int32_t *prompt, int n_prompt, int swa_replay,
			struct cw_dsv_state **ret, struct st_diag *diag);

/*
 * Publishes the full pages of a kvd state's first n tokens (ids[0..n),
 * the tokens it was evaluated on; n <= cw_dsv_state_len) in the prefix
 * cache (what prefix mode does by itself for the prompt; for a state made
 * without a prompt, call it after each eval: the next eval frees the
 * window pages of unpublished groups).  Every page of every stream of a
 * group covers the same tokens, and the window and compressor-state
 * streams are per-token, so a group chain ending at token kB carries
 * exactly the window rows and partial compressor inputs a sequence needs
 * to go on from kB.  Returns the page groups newly published (>= 0);
 * -EINVAL (a process-local state, n out of [1, len], a V4.1 state rebuilt
 * by SWA replay or with the CED shortcut on); kv_client_seq_publish's
 * errors.
 */
int cw_dsv_state_publish(struct cw_dsv_state *s, const int32_t *ids, int n,
			 struct st_diag *diag);

/* KV_PUBLISH_F_* flags (kv_proto.h) of every publish prefix mode does
 * from now on: KV_PUBLISH_F_PRIVATE keeps the pages out of kvd's remote KV
 * tier (a private request).  0, or -EINVAL for an unknown flag. */
int cw_dsv_state_set_publish_flags(struct cw_dsv_state *s, uint32_t flags);

/* kvd sequence handle of a kvd state (0 for a process-local one). */
uint32_t cw_dsv_state_seq(const struct cw_dsv_state *s);

/* ---- DeepSeek-V4's own (cw_dsv4.c, cw_dsv_streams.c,
 * cw_dsv_load_attn.c) ---- */

/*
 * The official inference code's quantisation round trips (not in HF, not
 * in the fixture's strict reference; MODEL_FAMILY_DEEPSEEK_V4.md 2.4 "QAT
 * round trips"; the official V4-Flash inference/model.py at 60d8d70,
 * index file id 70831076062), all on by default (CW_DSV4_QAT_OFFICIAL),
 * off in exact math:
 *  KV_FP8     the nope dims of every window K=V row (after rope) and every
 *             compressed row (after norm and rope) through FP8 E4M3 in
 *             blocks of 64 with a power-of-two scale (ds4
 *             dsv4_fp8_kv_quantize_row_inplace_cpu);
 *  INDEX_FP4  indexer queries and keys (after rope) through a
 *             Walsh-Hadamard transform (1/sqrt(n)) then E2M1 in blocks of
 *             32 with a power-of-two scale (ds4
 *             dsv4_indexer_qat_row_inplace_cpu);
 *  ACT_FP8    the input of every FP8/FP4 matmul through E4M3 in blocks of
 *             weight_block_size[1] elements (official linear() ->
 *             act_quant; the block for the real model is 128): wq_a,
 *             wq_b, wkv, wo_b, the indexer's wq_b, the shared and routed
 *             experts; not wo_a (official Attention.forward: a BF16
 *             einsum on the unquantized heads), not the BF16/F32 router,
 *             compressors and weights_proj.  A routed expert's SwiGLU
 *             output is multiplied by its routing weight before the trip
 *             of w2's input (official Expert.forward).
 * Set with cw_dsv_set_qat (cw_dsv.h) before evaluating; a state must not
 * mix settings.
 */
enum {
	CW_DSV4_QAT_KV_FP8 = 1,
	CW_DSV4_QAT_INDEX_FP4 = 2,
	CW_DSV4_QAT_ACT_FP8 = 4,
	CW_DSV4_QAT_OFFICIAL = 7,
};

/*
 * The experts a hash-routed layer (layer < num_hash_layers) uses for
 * `token`, known before the token is evaluated (exact prefetch, issue 9
 * item 4): top_k ids from tid2eid into ids.  Returns top_k, 0 for a
 * score-routed layer, -EINVAL for a layer or token out of range.
 */
int cw_dsv4_hash_experts(const struct cw_dsv_model *m, int layer,
			 int32_t token, int32_t *ids);

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

/* ---- DeepSeek-V4.1's own (cw_dsv41*.c, cw_dsv_load*.c, cw_dsv_eval.c) ---- */

/*
 * Store mode, on by default, off only for measurements (the results are
 * the same either way): the Engram prefetch of every evaluated position's
 * rows (exact: the hash depends on token ids only) sent before the eval
 * runs its layers.
 */
void cw_dsv41_set_engram_prefetch(struct cw_dsv_model *m, int on);

/*
 * Which index keys a V4.1 index source of ratio > 1 (the tiny fixture's
 * and the release's layers 2, 8, 14) scores at a one-token decode step
 * (an eval of one token at p > 0) whose token pair is incomplete
 * ((p + 1) % ratio != 0):
 *  CW_DSV41_DECODE_IKEYS_OWN          its own KV source's keys, as at
 *                                     prefill (the default; docs/DESIGN.md
 *                                     "DeepSeek-V4 math vs the official
 *                                     code", item 3: why);
 *  CW_DSV41_DECODE_IKEYS_LAST_SOURCE  the first (p + 1) / ratio keys of
 *                                     the last KV source layer (the
 *                                     release's layer 20), what the
 *                                     issue-28 transcription reads in the
 *                                     shipped official decode path (its
 *                                     shared index keys last written by
 *                                     that layer).
 * Prefill and chunked evals are unchanged.  Set before evaluating.
 * 0, -EINVAL (a V4 model, an unknown mode).
 */
enum {
	CW_DSV41_DECODE_IKEYS_OWN = 0,
	CW_DSV41_DECODE_IKEYS_LAST_SOURCE = 1,
};
int cw_dsv41_set_decode_index_keys(struct cw_dsv_model *m, int mode);

/*
 * Fast mode: the dense matvecs and the routed experts' matvecs split by
 * output rows over a pool of n_threads threads (cw_threads.h; the caller
 * is one of them), each output row still one kernel reduction, so the
 * logits do not depend on n_threads.  1 (the default): on the calling
 * thread.  Not during an eval.  0; -EINVAL (n_threads < 1, or > 1 for a
 * reference-mode model); the pool's errors (-ENOMEM, -errno).
 */
int cw_dsv41_set_threads(struct cw_dsv_model *m, int n_threads);

/*
 * QAT round trips (MODEL_FAMILY_DEEPSEEK_V4.md 3.7), all on by default
 * (CW_DSV41_QAT_OFFICIAL: they are the model's semantics; 0 is the exact
 * math of the strict checks against reference_noqat.json):
 *  WINDOW_FP8  every K=V row after rope: FP8 E4M3 / 32, ue8m0 scale;
 *  CROW_FP4    every compressed row after rope: E2M1 / 16, E4M3 scale;
 *  INDEX_FP4   index keys and indexer queries after rope: E2M1 / 32, ue8m0;
 *  ACT_FP8     the input of every FP8/FP4 matmul through E4M3 in blocks of
 *              weight_block_size[1] (32), where V4's ACT_FP8 applies it
 *              (not wo_a; the routing weight before w2's trip).  From the
 *              issue-28 transcription of the official V4.1 code and ATOM's
 *              V4.1 model (V4's MoE stack and Linear with a 32 block,
 *              index file id 66772560054); the official V4.1 model.py was
 *              not read here, so this flag alone can be turned off.
 * CW_DSV41_QAT_ALL is the three KV round trips, the set the fixture's
 * reference.json was generated with (no activation trip).
 * Set with cw_dsv_set_qat (cw_dsv.h) before evaluating; a state must not
 * mix settings.
 */
enum {
	CW_DSV41_QAT_WINDOW_FP8 = 1,
	CW_DSV41_QAT_CROW_FP4 = 2,
	CW_DSV41_QAT_INDEX_FP4 = 4,
	CW_DSV41_QAT_ALL = 7,
	CW_DSV41_QAT_ACT_FP8 = 8,
	CW_DSV41_QAT_OFFICIAL = 15,
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
 * -EINVAL for an unknown mode or a mode other than OFF on a V4 state.
 */
enum {
	CW_DSV41_CED_OFF = 0,
	CW_DSV41_CED_EXACT = 1,
	CW_DSV41_CED_WINDOW = 2,
};
int cw_dsv41_set_ced_shortcut(struct cw_dsv_state *s, int mode);

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
 * (n = len) is exact.  Errors: -EINVAL (a V4 state, n out of [1, len], a
 * token id that differs from the state's history); provider errors.
 * drop_window on a V4 state has no effect.
 */
void cw_dsv41_state_drop_window(struct cw_dsv_state *s);
int cw_dsv41_replay(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    const int32_t *ids, int n, struct st_diag *diag);

#endif
