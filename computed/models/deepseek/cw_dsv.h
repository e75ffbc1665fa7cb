/*
 * cw_dsv.h — the DeepSeek-V4 family's model: one loader and one model
 * object for every revision (V4: model_type "deepseek_v4"; V4.1-Flash
 * text model: "deepseek_v41"), chosen by the checkpoint's or the store's
 * config (st_config_dsv_family.h: cfg.revision).  The forward pass of a
 * revision is in cw_dsv4.h / cw_dsv41.h; what they share of the model's
 * life (loading, compute mode, store-mode switches, freeing) is here.
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
 * mtp.* skipped; V4.1: Engram tables F8_E4M3 [rows, head_dim] with
 * F8_E8M0 [rows, head_dim/32]; the vision tower, aligner, DSpark draft
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
 * tests/computed/test_dsv4_fast.c and test_dsv41_fast.c state the
 * tolerance.  V4.1 starts with every QAT round trip on
 * (CW_DSV41_QAT_ALL), V4 with none.  Owned by the caller (cw_dsv_free).
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
 * The revision's QAT round trips (V4: CW_DSV4_QAT_*, off by default;
 * V4.1: CW_DSV41_QAT_*, all on by default; what each does: cw_dsv4.h,
 * cw_dsv41.h).  Set before evaluating; a state must not mix settings.
 * Returns 0, -EINVAL (a flag the revision does not have),
 * -ST_E_UNSUPPORTED (V4's INDEX_FP4 with an index_head_dim that is not a
 * power of two: the Hadamard transform needs one).
 */
int cw_dsv_set_qat(struct cw_dsv_model *m, unsigned flags);

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

#endif
