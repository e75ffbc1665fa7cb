/*
 * cw_seqtab.h — the per-sequence states of a model that keeps one state
 * object per KV sequence and evaluates each sequence in order (the
 * DeepSeek-V4-family serving adapter, cw_model_dsv.c: one table per
 * revision's state type), and the step loop.
 *
 * The table maps kvd sequence ids to states (owned), made by the adapter
 * (a kvd-backed state: cw_seqtab_put) or here (a process-local one:
 * cw_seqtab_begin, or lazily when a sequence's first run arrives at
 * position 0).  cw_seqtab_eval_batch groups a step's tokens into runs of
 * one sequence at consecutive positions and evaluates each run by itself;
 * the last run of each sequence is remembered, so a scheduler that
 * retries a failed step one request at a time gets the runs that
 * succeeded back as replays (skipped: their logits buffers hold the
 * results; such a state cannot evaluate a position twice).
 *
 * Thread safety: the table is guarded by its own lock; evaluation of one
 * sequence is serialised by the caller (the scheduler steps a sequence
 * from one thread).
 */
#ifndef CW_SEQTAB_H
#define CW_SEQTAB_H

#include <pthread.h>
#include <stdint.h>

#include "cw_model.h"
#include "st_error.h"

/* What the table needs of a state type.  All take the adapter's model
 * and state pointers as void *. */
struct cw_seqtab_ops {
	const char *name;  /* "V4", "V4.1": in messages */
	/* positions evaluated so far */
	int (*len)(const void *st);
	/* the kvd sequence a kvd-backed state owns, 0 for a process-local
	 * one */
	uint32_t (*kv_seq)(const void *st);
	/* frees a state (and a kvd-backed state's sequence) */
	void (*free)(void *st);
	/* a process-local state for max_tokens positions: 0 or a negative
	 * code */
	int (*new_local)(const void *model, int max_tokens, void **ret);
	/* evaluates ids[0..n) at the state's next positions: logits of the
	 * last position (all_positions 0) or of every one (n x vocab) */
	int (*eval)(const void *model, void *st, const int32_t *ids, int n,
		    int all_positions, float *logits, struct st_diag *diag);
	/* cuts the state back to len positions (rejected drafts), or NULL:
	 * the family cannot */
	int (*truncate)(void *st, int len, struct st_diag *diag);
	/* holds the last lag positions past the prompt back from the
	 * prefix cache (drafts not verified yet), or NULL */
	int (*publish_lag)(void *st, int lag);
};

struct cw_seqtab_ent;

struct cw_seqtab {
	const struct cw_seqtab_ops *ops;  /* borrowed (static) */
	const void *model;                /* borrowed */
	int vocab;                        /* logits per position */
	int lazy_tokens;                  /* positions of a lazy state */
	pthread_mutex_t lock;             /* the table */
	struct cw_seqtab_ent *ents;       /* owned [cap] */
	int n, cap;
	float *rows;                      /* all-position logits of a run */
	int cap_rows;
	int32_t *ids;                     /* one run's ids */
	int cap_ids;
};

/* Initialises an empty table for states of `ops` on `model`; vocab:
 * logits per position; lazy_tokens: positions of a state made lazily. */
void cw_seqtab_init(struct cw_seqtab *t, const struct cw_seqtab_ops *ops,
		    const void *model, int vocab, int lazy_tokens);

/* Frees every state in the table and the table's buffers. */
void cw_seqtab_fini(struct cw_seqtab *t);

/* Makes st (owned from here on, also on error) the state of seq,
 * freeing the state the id had.  -ENOMEM (st freed). */
int cw_seqtab_put(struct cw_seqtab *t, uint32_t seq, void *st,
		  struct st_diag *diag);

/* A process-local state of max_tokens positions for seq, unless seq
 * already has a kvd-backed one (then nothing).  -EINVAL (max_tokens < 1),
 * the state constructor's code, -ENOMEM. */
int cw_seqtab_begin(struct cw_seqtab *t, uint32_t seq, int max_tokens,
		    struct st_diag *diag);

/* Drops seq's state.  Returns 1 when that state was kvd-backed (freeing
 * it freed the kvd sequence), else 0. */
int cw_seqtab_end(struct cw_seqtab *t, uint32_t seq);

/* Cuts seq's state back to len positions (ops->truncate; the last run is
 * forgotten, so it is no replay).  -ST_E_UNSUPPORTED (the family cannot),
 * -ST_E_NOTFOUND (no state), the op's errors. */
int cw_seqtab_truncate(struct cw_seqtab *t, uint32_t seq, int len,
		       struct st_diag *diag);

/* seq's state (borrowed: only the one thread that steps the sequences
 * may use it, not while it is evaluated), or NULL. */
void *cw_seqtab_get(struct cw_seqtab *t, uint32_t seq);

/* ops->publish_lag on seq's state: 0, -ST_E_UNSUPPORTED, -ST_E_NOTFOUND,
 * the op's -EINVAL. */
int cw_seqtab_publish_lag(struct cw_seqtab *t, uint32_t seq, int lag,
			  struct st_diag *diag);

/*
 * Evaluates a step (cw_model_eval_batch's contract): runs of one sequence
 * at consecutive positions, each in order; a run equal to the sequence's
 * last one (positions, ids, logits buffers) is a replay and skipped.
 * *tokens_done grows by the tokens of each run evaluated (also when a
 * later run fails).  A run whose state advanced although the eval
 * returned an error (only its kvd unpin failed) counts as evaluated: its
 * logits are copied and it is remembered, then the error is returned.
 * Errors: -EINVAL (a position out of order), -ENOMEM, the eval's.
 */
int cw_seqtab_eval_batch(struct cw_seqtab *t, const struct cw_batch_tok *toks,
			 int n, uint64_t *tokens_done, struct st_diag *diag);

/*
 * Adds one eval of n positions to an adapter's read counters: stall_ns
 * (time the eval waited in es_client_acquire, ns) always; when the eval
 * succeeded (ok), dense_bytes (every layer's matrices but the routed
 * experts and the LM head, bytes per position) per position and
 * head_bytes (the LM head) per position whose logits were made (all n,
 * or the last one).  The adapter's one stepping thread calls it.
 */
void cw_seqtab_count_eval(struct cw_read_stats *rs, uint64_t stall_ns,
			  int ok, int n, int all_positions,
			  uint64_t dense_bytes, uint64_t head_bytes);

#endif
