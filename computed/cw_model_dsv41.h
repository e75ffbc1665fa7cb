/*
 * cw_model_dsv41.h — serving a DeepSeek-V4.1 store behind the cw_model
 * interface (issue 11), so that generation (cw_gen), the scheduler, the
 * request API, SCORE and HTTP run V4.1 unchanged (the V4 counterpart is
 * cw_model_dsv4.h; this file follows it).
 *
 * The forward pass is cw_dsv41_eval (reference mode: F32 activations and
 * state, exact dequantisation, the model's QAT round trips on) with the
 * dense weights from the store's dense.bin, the routed experts acquired
 * from expertd's host pool (each layer's routing reported), and the
 * Engram rows from expertd's Engram tier, every position's rows
 * prefetched as soon as its token is known (cw_dsv41.h).
 *
 * Per-sequence state: one cw_dsv41_state per KV sequence id, kept in
 * computed's memory (process-local; not in kvd pages yet), created in ONE
 * place (cw_v41serve_seq_begin, or lazily at position 0).  kvd hands out
 * the sequence ids: a placeholder stream is declared so sequences can be
 * created, no rows are reserved, and the prefix cache is off.
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
 * and declares the placeholder KV stream to kv (borrowed; may be NULL:
 * no sequence ids from kvd, tests).  opts: kv_dtype must be F32 and
 * compute reference (V4.1 serving is reference mode only).  *ret owned by
 * the caller (cw_v41serve_close).
 * Errors: -ST_E_UNSUPPORTED (another KV dtype or compute mode), those of
 * cw_dsv41_load_store and kv_client_declare_model, -ENOMEM.
 */
int cw_v41serve_open(const char *store_dir, struct es_client *es,
		    struct kv_client *kv, const struct cw_model_opts *opts,
		    struct cw_v41serve **ret, struct st_diag *diag);
void cw_v41serve_close(struct cw_v41serve *v);

const struct st_dsv41_config *cw_v41serve_config(const struct cw_v41serve *v);

/*
 * Creates the state of sequence `seq` for at most max_tokens positions
 * (replacing any state the id had).  Thread-safe with itself and
 * cw_v41serve_seq_end.  Errors: -EINVAL (max_tokens < 1), -ENOMEM.
 */
int cw_v41serve_seq_begin(struct cw_v41serve *v, uint32_t seq, int max_tokens,
			 struct st_diag *diag);
/* Frees the state of `seq` (none: nothing).  Not while it is evaluated. */
void cw_v41serve_seq_end(struct cw_v41serve *v, uint32_t seq);

/*
 * cw_model_eval_batch for V4.1 (toks validated by the caller: ids in the
 * vocabulary, positions in the context).  Each sequence's tokens must
 * continue its state (position == tokens already evaluated); a sequence
 * without a state gets one lazily at position 0 (CW_V41_LAZY_TOKENS).
 * Errors: -EINVAL (a position that does not continue the sequence),
 * -ST_E_LIMIT (past the state's max_tokens), cw_dsv41_eval's (expertd),
 * -ENOMEM.  Runs before a failing one stay evaluated.
 */
int cw_v41serve_eval_batch(struct cw_v41serve *v,
			  const struct cw_batch_tok *toks, int n,
			  struct st_diag *diag);

/* Read statistics: tokens evaluated and expert bytes read (top_k records
 * of every layer per token). */
void cw_v41serve_read_stats(const struct cw_v41serve *v,
			   struct cw_read_stats *ret);

/* Bytes of one expert record (the three MXFP4 matrices and scales). */
uint64_t cw_v41serve_expert_bytes(const struct cw_v41serve *v);

#endif
