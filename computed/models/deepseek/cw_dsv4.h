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
#include "st_config_dsv_family.h"
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

#endif
