/*
 * cw_model_dsv.h — serving a DeepSeek-V4-family store (V4, issue 9; V4.1,
 * issue 11) behind the cw_model interface, so that generation (cw_gen),
 * the scheduler, the request API, SCORE and HTTP run the family
 * unchanged.  One adapter for every revision: what differs between
 * revisions (names, V4.1's compute threads, its KV storage formats) is
 * one row of a small per-revision table in cw_model_dsv.c; a new
 * revision adds a row, not a copy.
 *
 * The forward pass is the family's one (cw_dsv_eval; the revision's
 * layer chosen by the store's config)
 * in the model options' compute mode (reference: F32 activations and
 * state, exact dequantisation, DESIGN 6a; fast: the fast CPU kernels on
 * FP8 codes and the experts' slot bytes) with the dense weights from the
 * store's dense.bin, the routed experts acquired from expertd's host pool
 * (each layer's routing reported, hash-routed layers' experts as prefetch
 * hints) and, for V4.1, the Engram rows from expertd's Engram tier.
 *
 * Per-sequence state: one revision state per KV sequence id, created in
 * ONE place per kind.  Served sequences (cw_dsvserve_seq_create: cw_gen,
 * SCORE) keep their state in kvd pages (the revision's state_new_kv on
 * the streams declared at open, V4.1 in its own storage formats): the
 * prompt's full pages go to kvd's prefix cache as they are evaluated and
 * a later prompt with the same leading ids maps them (the state starts at
 * the cached length; V4.1 fills its Engram token history from the prompt
 * and maps the window rows the entry carries, no SWA replay: exact), kvd
 * may spill an idle sequence (each eval pins it), and a kvd restart (kill
 * -9 included) is ridden through by the kv_client.  A sequence made
 * elsewhere (kv_client_seq_create + cw_dsvserve_seq_begin, or lazily at
 * position 0) gets a process-local state instead (its kvd sequence holds
 * no rows).
 *
 * Batching: a step's tokens are grouped into runs of one sequence at
 * consecutive positions and each run is evaluated by itself (sequences
 * one after the other within a step, experts acquired per token); the
 * logits are the same as evaluating each sequence alone, bit for bit.
 */
#ifndef CW_MODEL_DSV_H
#define CW_MODEL_DSV_H

#include <stdint.h>

#include "cw_model.h"

/* Positions of a state made lazily (no cw_dsvserve_seq_begin), capped
 * by the model's context. */
#define CW_DSV_LAZY_TOKENS 4096

/* The revisions served (the store's manifest says which). */
enum cw_dsv_rev {
	CW_DSV_REV_V4,
	CW_DSV_REV_V41,
};

struct cw_dsvserve;

/*
 * Loads the store at store_dir of revision rev (its load_store_mode with
 * es, borrowed, in opts->compute; V4.1 in fast mode with opts->n_threads
 * matvec threads) and declares its KV streams to kv (the revision's
 * kv_declare, opts->page_rows tokens per page (0: 16), prefix-cache id
 * from the weights (model_id), the expert store and the page size; kv
 * borrowed; may be NULL: no kvd states, tests).  opts->kv_dtype must be
 * F32 (V4 keeps F32 rows, V4.1 its own formats).  *ret owned by the
 * caller (cw_dsvserve_close).
 * Errors: -ST_E_UNSUPPORTED (another KV dtype), -EINVAL (unknown rev),
 * those of the revision's load_store_mode, set_threads and kv_declare,
 * -ENOMEM.
 */
int cw_dsvserve_open(enum cw_dsv_rev rev, const char *store_dir,
		     struct es_client *es, struct kv_client *kv,
		     const struct cw_model_opts *opts,
		     struct cw_dsvserve **ret, struct st_diag *diag);
/* Frees v and its model and states (NULL is fine). */
void cw_dsvserve_close(struct cw_dsvserve *v);
/* The math v's model computes: "official" (the default) or "exact"
 * (opts->exact_math at open), cw_dsv_math_name. */
const char *cw_dsvserve_math(const struct cw_dsvserve *v);

/* The growing KV bytes per token of the revision's layout (V4: its
 * streams of F32 rows, cw_dsv4_kv_bytes_per_token; V4.1: its storage
 * formats, cw_dsv41_kv_bytes_per_token). */
uint64_t cw_dsvserve_kv_bytes_per_token(const struct cw_dsvserve *v);

/*
 * Creates a kvd sequence with its state in kvd pages for a prompt of
 * n_prompt ids.  prefix_cache: the prompt's cached pages are mapped
 * (*ret_cached: the positions already evaluated, a multiple of the page
 * size, < n_prompt; the caller evaluates from there) and the full pages
 * of the prompt and of the tokens fed after it are published as they are
 * evaluated, with the KV_PUBLISH_F_* publish_flags; else *ret_cached = 0 and nothing
 * is published.  *ret_seq: the kvd sequence id, freed with the state by
 * cw_dsvserve_seq_end.  Thread-safe.  Errors: -EINVAL (opened without
 * kvd), the revision's state_new_kv's (kvd: -ST_E_BUDGET,
 * -ST_E_PEERGONE ...), -ENOMEM.
 */
int cw_dsvserve_seq_create(struct cw_dsvserve *v, const int32_t *prompt,
			   int n_prompt, int prefix_cache,
			   uint32_t publish_flags, uint32_t *ret_seq,
			   uint32_t *ret_cached, struct st_diag *diag);

/*
 * Creates a process-local state for the kvd sequence `seq` (made by the
 * caller) for at most max_tokens positions, replacing a process-local
 * state the id had; a no-op (0) for a sequence of cw_dsvserve_seq_create.
 * Thread-safe with itself and cw_dsvserve_seq_end.  Errors: -EINVAL
 * (max_tokens < 1), -ENOMEM.
 */
int cw_dsvserve_seq_begin(struct cw_dsvserve *v, uint32_t seq,
			  int max_tokens, struct st_diag *diag);
/* Frees the state of `seq` (none: nothing).  Not while it is evaluated.
 * Returns 1 when the kvd sequence was freed with it (a state of
 * cw_dsvserve_seq_create), else 0 (the caller frees its kvd sequence). */
int cw_dsvserve_seq_end(struct cw_dsvserve *v, uint32_t seq);

/* Whether the revision's states can be cut back (both: 1). */
int cw_dsvserve_can_truncate(const struct cw_dsvserve *v);
/* Cuts seq's state (and a kvd state's kvd sequence) back to len positions
 * (cw_dsv_state_truncate: a verified draft's rejected tokens).  Not while
 * it is evaluated.  -ST_E_NOTFOUND (no state), cw_dsv_state_truncate's. */
int cw_dsvserve_seq_truncate(struct cw_dsvserve *v, uint32_t seq, int len,
			     struct st_diag *diag);
/* Holds the last lag positions past seq's prompt back from the prefix
 * cache (cw_dsv_state_set_publish_lag).  0, -ST_E_NOTFOUND, -EINVAL (lag
 * outside [0, CW_DSV_ROLLBACK_MAX]). */
int cw_dsvserve_seq_publish_lag(struct cw_dsvserve *v, uint32_t seq,
				int lag, struct st_diag *diag);

/* Whether the store kept V4's MTP block (cw_dsv_has_mtp). */
int cw_dsvserve_has_mtp(const struct cw_dsvserve *v);
/* The MTP block follows seq's state (cw_dsv_mtp_follow; call before its
 * first eval).  0, -ST_E_NOTFOUND (no state), -ST_E_UNSUPPORTED (no
 * block), -ENOMEM. */
int cw_dsvserve_seq_mtp_follow(struct cw_dsvserve *v, uint32_t seq,
			       struct st_diag *diag);
/* k drafts after seq's last evaluated position and the sampled token next
 * (cw_dsv_mtp_draft): the count, or its errors, -ST_E_NOTFOUND.  The
 * stepping thread, not during an eval. */
int cw_dsvserve_seq_mtp_draft(struct cw_dsvserve *v, uint32_t seq,
			      int32_t next, int k, int32_t *out,
			      struct st_diag *diag);

/*
 * cw_model_eval_batch for the family (toks validated by the caller: ids
 * in the vocabulary, positions in the context).  Each sequence's tokens
 * must continue its state (position == tokens already evaluated); a
 * sequence without a state gets one lazily at position 0
 * (CW_DSV_LAZY_TOKENS).  The run a sequence evaluated last, given again
 * with the same ids and logits buffers and nothing evaluated since, is a
 * replay: skipped (the buffers hold its logits; the scheduler retries a
 * failed step's requests one at a time, and a state cannot evaluate a
 * position twice).  Errors: -EINVAL (a position that does not continue
 * the sequence), -ST_E_LIMIT (past the state's max_tokens), the
 * revision's eval's (expertd), -ENOMEM.  Runs before a failing one stay
 * evaluated.
 */
int cw_dsvserve_eval_batch(struct cw_dsvserve *v,
			   const struct cw_batch_tok *toks, int n,
			   struct st_diag *diag);

/* The model's gate look-ahead depth (the revision's set_prefetch_depth):
 * 0, or -EINVAL for depth outside [0, 8]. */
int cw_dsvserve_set_prefetch_depth(struct cw_dsvserve *v, int depth);
/* The model's expert overlap (cw_dsv_set_expert_overlap; on by default). */
void cw_dsvserve_set_expert_overlap(struct cw_dsvserve *v, int on);
/* Read statistics: tokens evaluated and expert bytes read (top_k records
 * of every layer per token), dense and head bytes, expertd stalls. */
void cw_dsvserve_read_stats(const struct cw_dsvserve *v,
			    struct cw_read_stats *ret);

/* Bytes of one expert record (the three MXFP4 matrices and scales). */
uint64_t cw_dsvserve_expert_bytes(const struct cw_dsvserve *v);

#endif
