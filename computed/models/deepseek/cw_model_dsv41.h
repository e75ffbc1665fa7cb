/*
 * cw_model_dsv41.h — serving a DeepSeek-V4.1 store behind the cw_model
 * interface (issue 11), so that generation (cw_gen), the scheduler, the
 * request API, SCORE and HTTP run V4.1 unchanged (the V4 counterpart is
 * cw_model_dsv4.h; this file follows it).
 *
 * The forward pass is cw_dsv41_eval in the model options' compute mode
 * (reference: F32 activations and state, exact dequantisation; fast: the
 * fast CPU kernels on FP8 codes and the experts' slot bytes,
 * cw_dsv41_load_store_mode; the model's QAT round trips on in both) with the
 * dense weights from the store's dense.bin, the routed experts acquired
 * from expertd's host pool (each layer's routing reported), and the
 * Engram rows from expertd's Engram tier, every position's rows
 * prefetched as soon as its token is known (cw_dsv41.h).
 *
 * Per-sequence state: one cw_dsv41_state per KV sequence id, created in
 * ONE place per kind.  Served sequences (cw_v41serve_seq_create: cw_gen,
 * SCORE) keep their state in kvd pages in the V4.1 formats
 * (cw_dsv41_state_new_kv on the V4.1 streams declared at open,
 * cw_dsv41_kv_declare): the prompt's full pages go to kvd's prefix cache
 * as they are evaluated and a later prompt with the same leading ids maps
 * them (the state starts at the cached length, its Engram token history
 * filled from the prompt; the window rows the entry carries are mapped,
 * no SWA replay: exact), kvd may spill an idle sequence (each eval pins
 * it), and a kvd restart (kill -9 included) is ridden through by the
 * kv_client.  A sequence made elsewhere (kv_client_seq_create +
 * cw_v41serve_seq_begin, or lazily at position 0) gets a process-local
 * state instead (its kvd sequence holds no rows).
 *
 * Batching: a step's tokens are grouped into runs of one sequence at
 * consecutive positions and each run is evaluated by itself (sequences
 * one after the other within a step, experts acquired per token); the
 * logits are the same as evaluating each sequence alone, bit for bit.
 */
#ifndef CW_MODEL_DSV41_H
#define CW_MODEL_DSV41_H

#include <stdint.h>

#include "cw_dsv41.h"
#include "cw_model.h"

/* Positions of a state made lazily (no cw_v41serve_seq_begin), capped
 * by the model's context. */
#define CW_V41_LAZY_TOKENS 4096

struct cw_v41serve;

/*
 * Loads the V4.1 store at store_dir (cw_dsv41_load_store with es, borrowed)
 * and declares its KV streams to kv (cw_dsv41_kv_declare with the store's
 * QAT flags, opts->page_rows tokens per page (0: 16), prefix-cache id
 * from cw_dsv41_model_id, the expert store and the page size; kv
 * borrowed; may be NULL: no kvd states, tests).  opts: kv_dtype must be
 * F32 (the state keeps its own V4.1 formats); opts->compute picks the
 * mode (cw_dsv41_load_store_mode) and, in fast mode, opts->n_threads the
 * matvec threads (cw_dsv41_set_threads).  *ret owned by the caller
 * (cw_v41serve_close).
 * Errors: -ST_E_UNSUPPORTED (another KV dtype), those of
 * cw_dsv41_load_store_mode, cw_dsv41_set_threads and cw_dsv41_kv_declare,
 * -ENOMEM.
 */
int cw_v41serve_open(const char *store_dir, struct es_client *es,
		    struct kv_client *kv, const struct cw_model_opts *opts,
		    struct cw_v41serve **ret, struct st_diag *diag);
void cw_v41serve_close(struct cw_v41serve *v);

const struct st_dsv41_config *cw_v41serve_config(const struct cw_v41serve *v);

/*
 * Creates a kvd sequence with its V4.1 state in kvd pages
 * (cw_dsv41_state_new_kv, no SWA replay) for a prompt of n_prompt ids.
 * prefix_cache: the prompt's cached pages are mapped (*ret_cached: the
 * positions already evaluated, a multiple of the page size, < n_prompt;
 * the caller evaluates from there) and its full pages are published as
 * they are evaluated; else *ret_cached = 0 and nothing is published.
 * *ret_seq: the kvd sequence id, freed with the state by
 * cw_v41serve_seq_end.  Thread-safe.  Errors: -EINVAL (opened without
 * kvd), cw_dsv41_state_new_kv's (kvd: -ST_E_BUDGET, -ST_E_PEERGONE ...),
 * -ENOMEM.
 */
int cw_v41serve_seq_create(struct cw_v41serve *v, const int32_t *prompt,
			   int n_prompt, int prefix_cache, uint32_t *ret_seq,
			   uint32_t *ret_cached, struct st_diag *diag);

/*
 * Creates a process-local state for the kvd sequence `seq` (made by the
 * caller) for at most max_tokens positions, replacing a process-local
 * state the id had; a no-op (0) for a sequence of cw_v41serve_seq_create.
 * Thread-safe with itself and cw_v41serve_seq_end.  Errors: -EINVAL
 * (max_tokens < 1), -ENOMEM.
 */
int cw_v41serve_seq_begin(struct cw_v41serve *v, uint32_t seq, int max_tokens,
			  struct st_diag *diag);
/* Frees the state of `seq` (none: nothing).  Not while it is evaluated.
 * Returns 1 when the kvd sequence was freed with it (a state of
 * cw_v41serve_seq_create), else 0 (the caller frees its kvd sequence). */
int cw_v41serve_seq_end(struct cw_v41serve *v, uint32_t seq);

/*
 * cw_model_eval_batch for V4.1 (toks validated by the caller: ids in the
 * vocabulary, positions in the context).  Each sequence's tokens must
 * continue its state (position == tokens already evaluated); a sequence
 * without a state gets one lazily at position 0 (CW_V41_LAZY_TOKENS).
 * The run a sequence evaluated last, given again with the same ids and
 * logits buffers and nothing evaluated since, is a replay: skipped (the
 * buffers hold its logits; the scheduler retries a failed step's requests
 * one at a time, and a V4.1 state cannot evaluate a position twice).
 * Errors: -EINVAL (a position that does not continue the sequence),
 * -ST_E_LIMIT (past the state's max_tokens), cw_dsv41_eval's (expertd),
 * -ENOMEM.  Runs before a failing one stay evaluated.
 */
int cw_v41serve_eval_batch(struct cw_v41serve *v,
			  const struct cw_batch_tok *toks, int n,
			  struct st_diag *diag);

/* Read statistics: tokens evaluated and expert bytes read (top_k records
 * of every layer per token). */
/* The model's gate look-ahead depth (cw_dsv41_set_prefetch_depth): 0, or
 * -EINVAL for depth outside [0, 8]. */
int cw_v41serve_set_prefetch_depth(struct cw_v41serve *v, int depth);
void cw_v41serve_read_stats(const struct cw_v41serve *v,
			   struct cw_read_stats *ret);

/* Bytes of one expert record (the three MXFP4 matrices and scales). */
uint64_t cw_v41serve_expert_bytes(const struct cw_v41serve *v);

#endif
