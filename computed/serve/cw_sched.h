/*
 * cw_sched.h — continuous batching in computed.
 *
 * Requests (from the HTTP API or the nanomsg REQ/REP API) are submitted to
 * a queue.  One scheduler thread owns the forward pass: between two steps
 * it admits queued requests (up to max_running sequences), drops cancelled
 * ones (freeing their KV pages at once), and builds one step of at most
 * max_step_tokens tokens: one decode token of every running sequence first
 * (with speculative decoding also its draft tokens, cut so that every
 * decoding sequence keeps its own), then prefill chunks of admitted
 * prompts in admission order with what is left, so a long prompt never
 * stalls running decodes for more than one step.  When kvd has a spill
 * file, a step also holds at most half of kvd's pool in KV pages, and
 * running sequences that do not fit take turns in windows of a few steps,
 * the next window restored by kvd while the current one computes
 * (cw_kvahead.h, --kv-restore-ahead).  The step is one
 * cw_model_eval_batch: each expert's weights are read once for all tokens
 * routed to it.  Each request gets its output as a queue of events (one
 * per sampled token, the last one carrying the finish reason) that its
 * consumer pops from another thread.
 *
 * In reference mode a request's logits and tokens do not depend on what
 * else runs with it (cw_model_eval_batch is per-token exact).
 *
 * Threads: cw_sched_submit / _next_event / _cancel / _release may be called
 * from any thread; the scheduler thread is the only one that runs the
 * model, except callers holding cw_sched_model_lock (e.g. SCORE).
 */
#ifndef CW_SCHED_H
#define CW_SCHED_H

#include <stdint.h>
#include <stdio.h>

#include "cw_gen.h"
#include "cw_metrics.h"
#include "kv_session_proto.h"

struct cw_sched_opts {
	int max_running;      /* sequences decoding at once (default 32) */
	int max_queued;       /* requests waiting for admission (default 256) */
	int max_step_tokens;  /* tokens per forward step (default 128) */
	/* kvd may spill (issue 24, cw_kvahead.h): a step pins at most half
	 * of what kvd's pool leaves to steps, running sequences take turns;
	 * 1: kvd restores the next step's sequences while this one computes
	 * (--kv-restore-ahead on, cw_main's default), 0: each step's pin
	 * restores its own */
	int kv_restore_ahead;
	int draft_max;        /* draft tokens of requests that ask for
			       * CW_DRAFT_DEFAULT (0: no speculation) */
	int draft_price;      /* their draft length priced in step time and
			       * expert bytes (cw_draft_price.h) */
	int draft_mtp;        /* their drafts from the model's MTP block */
	/* step timeline (issue 25; all borrowed, NULL: off): one TSV row
	 * per step to `timeline` (cw_timeline.h), phases from `tl` (which
	 * the caller also set on the model), expertd's counters from es */
	FILE *timeline;
	struct cw_steptime *tl;
	struct es_client *es;
	/* saved sessions (cw_session.h; borrowed, NULL: requests naming a
	 * session are refused) */
	const struct kv_session_ident *session;
};

/* One output event of a request. */
struct cw_sched_event {
	int32_t token;              /* sampled id, -1 for none */
	enum cw_finish finish;      /* CW_FINISH_NONE while going on */
	char *text;                 /* released text (malloc'd, NUL-terminated) */
	struct cw_gen_logprob lp;   /* of token, when token >= 0 */
	int err;                    /* finish ERROR: the code */
	char err_msg[1024];         /*   and its message (an st_diag's) */
};

struct cw_sched;
struct cw_sched_req;

/*
 * Creates the scheduler over model, tok and kv (borrowed; they must outlive
 * it) and starts its thread.  metrics (borrowed, may be NULL) gets request
 * and step figures.  *ret owned by the caller (cw_sched_destroy).
 */
int cw_sched_create(struct cw_model *model, const struct st_tokenizer *tok,
		    struct kv_client *kv, const struct cw_sched_opts *opts,
		    struct cw_metrics *metrics, struct cw_sched **ret);

/* Stops the thread: running and queued requests end with finish ERROR
 * (-ST_E_PEERGONE "shutting down"); their consumers still own them. */
void cw_sched_destroy(struct cw_sched *s);

/*
 * Queues a generation of the prompt ids[0..n_ids) (copied) with params p
 * (stop strings copied).  max_pending bounds the events not yet popped:
 * the sequence is not stepped while that many wait (1 for a pull API,
 * larger for streaming).  *ret is shared by the consumer and the scheduler
 * until cw_sched_release.  Errors: -ST_E_BUSY (queue full: max_queued),
 * -ST_E_LIMIT (the prompt does not fit the context; diag says so), -EINVAL
 * (empty prompt, bad parameters), -ENOMEM, -ST_E_PEERGONE (shutting down).
 */
int cw_sched_submit(struct cw_sched *s, const int32_t *ids, size_t n_ids,
		    const struct cw_gen_params *p, int max_pending,
		    struct cw_sched_req **ret, struct st_diag *diag);

/*
 * Pops the next event of req into *ev (ev->text owned by the caller: free
 * it), waiting up to timeout_ms (-1: forever).  Returns 1 with an event, 0
 * on time-out.  After the event with a finish reason no more come (0).
 */
int cw_sched_next_event(struct cw_sched_req *req, int timeout_ms,
			struct cw_sched_event *ev);

/* Counts of req (valid once finished; n_prompt from the start).
 * n_cached: the prompt rows its generation mapped from kvd's prefix cache
 * (what /metrics' prefix-cache rows-reused counter adds for it). */
int cw_sched_req_n_prompt(const struct cw_sched_req *req);
int cw_sched_req_n_generated(const struct cw_sched_req *req);
int cw_sched_req_n_cached(const struct cw_sched_req *req);

/* What became of a request's session save (cw_gen_params.session_save):
 * a failed save does not fail the finished generation, it is reported
 * here beside it. */
struct cw_sched_save {
	int state;          /* 0: none asked, or the generation failed;
			     * 1 saved; -1 not saved */
	uint32_t rows;      /* saved: the rows the session holds */
	int32_t replaced;   /* saved: -1, or the rows of the old session of
			     * that name it replaced (0: a corrupt file) */
	int err;            /* not saved: the error code */
	char msg[512];      /*   and its message */
};

/* Copies req's save outcome into *ret (valid once its last event was
 * popped). */
void cw_sched_req_save(const struct cw_sched_req *req,
		       struct cw_sched_save *ret);
int cw_sched_req_max_tokens(const struct cw_sched_req *req);

/* Cancels req: the scheduler drops it before its next step and frees its
 * KV sequence (client disconnect).  Idempotent. */
void cw_sched_cancel(struct cw_sched_req *req);

/* The consumer is done with req (cancels it if still running). */
void cw_sched_release(struct cw_sched_req *req);

/* Sequences running and requests queued now. */
void cw_sched_counts(struct cw_sched *s, int *ret_running, int *ret_queued);

/* Excludes the scheduler from the model while held (other users of the
 * model: SCORE). */
void cw_sched_model_lock(struct cw_sched *s);
void cw_sched_model_unlock(struct cw_sched *s);

#endif
