/*
 * cw_model_dsv4.h — serving a DeepSeek-V4 store behind the cw_model
 * interface (issue 9), so that generation (cw_gen), the scheduler, the
 * request API, SCORE and HTTP run V4 unchanged.
 *
 * The forward pass is cw_dsv4_eval (reference mode: F32 activations and
 * state, exact dequantisation; DESIGN 6a) with the dense weights from the
 * store's dense.bin and the routed experts acquired from expertd's host
 * pool, each layer's routing reported to expertd with the exact experts
 * of every later hash-routed layer as prefetch hints (cw_dsv4.h).
 *
 * Per-sequence state: one cw_dsv4_state per KV sequence id, created in
 * ONE place per kind.  Served sequences (cw_v4serve_seq_create: cw_gen,
 * SCORE) keep their state in kvd pages (cw_dsv4_state_new_kv on the V4
 * streams declared at open, cw_dsv4_kv_declare): the prompt's full pages
 * go to kvd's prefix cache as they are evaluated and a later prompt with
 * the same leading ids maps them (the state starts at the cached length),
 * kvd may spill an idle sequence (each eval pins it), and a kvd restart
 * (kill -9 included) is ridden through by the kv_client (re-registration
 * under the same client id; the new kvd adopts the pool with its
 * sequences and pages).  A sequence made elsewhere (kv_client_seq_create
 * + cw_v4serve_seq_begin, or lazily at position 0) gets a process-local
 * state instead (its kvd sequence holds no rows).
 *
 * Batching: a step's tokens are grouped into runs of one sequence at
 * consecutive positions and each run is evaluated by itself (sequences
 * one after the other within a step, experts acquired per token); the
 * logits are the same as evaluating each sequence alone, bit for bit.
 */
#ifndef CW_MODEL_DSV4_H
#define CW_MODEL_DSV4_H

#include <stdint.h>

#include "cw_dsv4.h"
#include "cw_model.h"

/* Positions of a state made lazily (no cw_v4serve_seq_begin), capped
 * by the model's context. */
#define CW_V4_LAZY_TOKENS 4096

struct cw_v4serve;

/*
 * Loads the V4 store at store_dir (cw_dsv4_load_store with es, borrowed)
 * and declares its KV streams to kv (cw_dsv4_kv_declare, opts->page_rows
 * tokens per page, prefix-cache id from the weights, the expert store and
 * the page size; kv borrowed; may be NULL: no kvd states, tests).  opts:
 * kv_dtype must be F32 and compute reference (V4 serving is reference
 * mode only).  *ret owned by the caller (cw_v4serve_close).
 * Errors: -ST_E_UNSUPPORTED (another KV dtype or compute mode), those of
 * cw_dsv4_load_store and cw_dsv4_kv_declare, -ENOMEM.
 */
int cw_v4serve_open(const char *store_dir, struct es_client *es,
		    struct kv_client *kv, const struct cw_model_opts *opts,
		    struct cw_v4serve **ret, struct st_diag *diag);
void cw_v4serve_close(struct cw_v4serve *v);

const struct st_dsv4_config *cw_v4serve_config(const struct cw_v4serve *v);

/*
 * Creates a kvd sequence with its V4 state in kvd pages
 * (cw_dsv4_state_new_kv) for a prompt of n_prompt ids.  prefix_cache:
 * the prompt's cached pages are mapped (*ret_cached: the positions
 * already evaluated, a multiple of the page size, < n_prompt; the caller
 * evaluates from there) and its full pages are published as they are
 * evaluated; else *ret_cached = 0 and nothing is published.  *ret_seq:
 * the kvd sequence id, freed with the state by cw_v4serve_seq_end.
 * Thread-safe.  Errors: -EINVAL (opened without kvd),
 * cw_dsv4_state_new_kv's (kvd: -ST_E_BUDGET, -ST_E_PEERGONE ...), -ENOMEM.
 */
int cw_v4serve_seq_create(struct cw_v4serve *v, const int32_t *prompt,
			  int n_prompt, int prefix_cache, uint32_t *ret_seq,
			  uint32_t *ret_cached, struct st_diag *diag);

/*
 * Creates a process-local state for the kvd sequence `seq` (made by the
 * caller) for at most max_tokens positions, replacing a process-local
 * state the id had; a no-op (0) for a sequence of cw_v4serve_seq_create.
 * Thread-safe with itself and cw_v4serve_seq_end.  Errors: -EINVAL
 * (max_tokens < 1), -ENOMEM.
 */
int cw_v4serve_seq_begin(struct cw_v4serve *v, uint32_t seq, int max_tokens,
			 struct st_diag *diag);
/* Frees the state of `seq` (none: nothing).  Not while it is evaluated.
 * Returns 1 when the kvd sequence was freed with it (a state of
 * cw_v4serve_seq_create), else 0 (the caller frees its kvd sequence). */
int cw_v4serve_seq_end(struct cw_v4serve *v, uint32_t seq);

/*
 * cw_model_eval_batch for V4 (toks validated by the caller: ids in the
 * vocabulary, positions in the context).  Each sequence's tokens must
 * continue its state (position == tokens already evaluated); a sequence
 * without a state gets one lazily at position 0 (CW_V4_LAZY_TOKENS).
 * The run a sequence evaluated last, given again with the same ids and
 * logits buffers and nothing evaluated since, is a replay: skipped (the
 * buffers hold its logits; the scheduler retries a failed step's requests
 * one at a time, and a V4 state cannot evaluate a position twice).
 * Errors: -EINVAL (a position that does not continue the sequence),
 * -ST_E_LIMIT (past the state's max_tokens), cw_dsv4_eval's (expertd),
 * -ENOMEM.  Runs before a failing one stay evaluated.
 */
int cw_v4serve_eval_batch(struct cw_v4serve *v,
			  const struct cw_batch_tok *toks, int n,
			  struct st_diag *diag);

/* Read statistics: tokens evaluated and expert bytes read (top_k records
 * of every layer per token). */
/* The model's gate look-ahead depth (cw_dsv4_set_prefetch_depth): 0, or
 * -EINVAL for depth outside [0, 8]. */
int cw_v4serve_set_prefetch_depth(struct cw_v4serve *v, int depth);
void cw_v4serve_read_stats(const struct cw_v4serve *v,
			   struct cw_read_stats *ret);

/* Bytes of one expert record (the three MXFP4 matrices and scales). */
uint64_t cw_v4serve_expert_bytes(const struct cw_v4serve *v);

#endif
