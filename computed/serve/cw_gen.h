/*
 * cw_gen.h — one generation: a prompt encoded with the model's tokenizer,
 * prefilled into a fresh KV sequence, then decoded one token per step with
 * the sampler, streaming valid UTF-8 text, until an EOS id, max_tokens or a
 * stop string.
 *
 * Stop strings may span tokens: text that could be the start of a stop
 * string is held back until it is known not to be one (PITFALLS P13), and
 * text from the stop string on is never emitted.
 */
#ifndef CW_GEN_H
#define CW_GEN_H

#include <stdint.h>

#include "cw_draft_ngram.h"
#include "cw_draft_price.h"
#include "cw_model.h"
#include "cw_sampler.h"
#include "st_tokenizer.h"

#define CW_GEN_MAX_STOP 4
#define CW_PREFILL_CHUNK 256 /* prompt tokens per forward call */
#define CW_GEN_MAX_TOP 5     /* top_logprobs at most */
#define CW_DRAFT_DEFAULT (-1) /* cw_gen_params.draft_max: the server's */

enum cw_finish {
	CW_FINISH_NONE = 0,
	CW_FINISH_EOS = 1,
	CW_FINISH_LENGTH = 2,
	CW_FINISH_STOP = 3,
	CW_FINISH_ERROR = 4,
	CW_FINISH_CONTEXT = 5, /* the model's context is full */
};

struct cw_gen_params {
	int max_tokens;                   /* new tokens at most */
	int max_tokens_auto;              /* max_tokens was not asked for
					   * (a chat's "the rest of the
					   * context"): the scheduler cuts it to
					   * what kvd's pool holds when
					   * spilling is off (cw_sched) */
	struct cw_sampler_params sampler;
	int n_stop;
	const char *stop[CW_GEN_MAX_STOP]; /* copied by cw_gen_start */
	int add_special;                  /* BOS etc. as tokenizer_config says */
	int parse_special;                /* special tokens spelled in the prompt */
	int ignore_eos;
	int prefix_cache;                 /* map cached prompt pages from kvd
					   * and publish this prompt's */
	int kv_private;                   /* a private prompt: its pages stay
					   * out of kvd's remote KV tier
					   * (KV_PUBLISH_F_PRIVATE) */
	int logprobs;                     /* compute the sampled token's
					   * log-probability (a pass over the
					   * vocabulary per token) */
	int top_logprobs;                 /* 0..CW_GEN_MAX_TOP alternatives
					   * kept per sampled token */
	int draft_max;                    /* speculative decoding: up to this
					   * many prompt-lookup draft tokens
					   * verified per step (the limit
					   * follows the acceptance: + 2 after
					   * all accepted, - 1 after a
					   * rejection, 1..draft_max; 0: off;
					   * 0..CW_DRAFT_MAX; CW_DRAFT_DEFAULT:
					   * the scheduler's default, off for
					   * cw_gen itself); ignored (off)
					   * for DeepSeek-V4/V4.1 stores */
	int draft_mtp;                    /* 1: drafts from the model's MTP
					   * block (cw_model_has_mtp; refused
					   * without one) instead of prompt
					   * lookup */
	int draft_price;                  /* 1: the draft length is priced
					   * instead (cw_draft_price.h:
					   * 0..draft_max, 0 off with probes);
					   * 0: the schedule above */
	/* saved sessions (cw_session.h; names as kv_session_name_ok, ""
	 * = none): the scheduler loads session_load into kvd's prefix
	 * cache before the generation starts and saves the conversation
	 * (prompt and generated rows) as session_save after it ends
	 * (the outcome in cw_sched_req_save; a failed save does not fail
	 * the generation) */
	char session_load[65];
	char session_save[65];
};

/* Speculative decoding figures of a generation (issue 22). */
struct cw_gen_spec_stats {
	uint64_t steps;          /* decode steps (with or without drafts) */
	uint64_t spec_steps;     /* decode steps that verified drafts */
	uint64_t drafted;        /* draft tokens verified */
	uint64_t accepted;       /* of them accepted */
	uint64_t rollbacks;      /* steps whose rejected rows were cut back
				  * in kvd */
	/* priced in bytes (issue 22 §3): expert bytes read by the decode
	 * steps with drafts and by those without (cw_gen_note_step_bytes),
	 * the tokens the former produced (the latter produce one each),
	 * and the draft limit chosen per decode step (0: none) */
	uint64_t bytes_verify, bytes_plain;
	uint64_t tokens_verify;
	uint64_t limit_sum;                   /* sum of the limits */
	uint64_t limit_hist[CW_DRAFT_MAX + 1]; /* decode steps per limit */
};

/* Log-probabilities of the last sampled token under the model's
 * distribution (log-softmax of the raw logits, before temperature and
 * truncation), and the top alternatives by descending probability. */
struct cw_gen_logprob {
	float logprob;
	int n_top;
	int32_t top_id[CW_GEN_MAX_TOP];
	float top_logprob[CW_GEN_MAX_TOP];
};

struct cw_gen;

/*
 * Encodes the prompt and creates the KV sequence.  model, tok and kv are
 * borrowed.  *ret owned by the caller (cw_gen_free).  Errors: -EINVAL
 * (empty prompt after encoding), -ST_E_LIMIT (prompt + max_tokens beyond
 * the context: the prompt alone is refused; max_tokens is cut to fit),
 * kvd errors.
 */
int cw_gen_start(struct cw_model *model, const struct st_tokenizer *tok,
		 struct kv_client *kv, const char *prompt, size_t prompt_len,
		 const struct cw_gen_params *p, struct cw_gen **ret,
		 struct st_diag *diag);

/*
 * As cw_gen_start with the prompt already encoded (n_ids token ids, copied;
 * chat templates encode scaffolding and content separately, PITFALLS P3).
 */
int cw_gen_start_ids(struct cw_model *model, const struct st_tokenizer *tok,
		     struct kv_client *kv, const int32_t *ids, size_t n_ids,
		     const struct cw_gen_params *p, struct cw_gen **ret,
		     struct st_diag *diag);

/*
 * Stepping by a scheduler (continuous batching, cw_sched.h): the scheduler
 * asks each generation for the tokens of its next forward step, evaluates
 * them in one cw_model_eval_batch with other sequences' tokens, then calls
 * cw_gen_advance.
 *
 * cw_gen_next_input: at most max_n tokens still to run: prompt rows not
 * yet computed (prefill, in chunks) or the last sampled token (decode, 1),
 * followed, with speculation on (draft_max > 0), by up to
 * min(draft_max, max_n - 1) draft tokens to verify in the same step.
 * *ret_pos is the position of the first, *ret_ids the ids (borrowed).
 * *ret_want_logits is 1 when logits are needed (the last token completes
 * the prompt, or a decode step: logits at every position); the buffer of
 * token i of the input is cw_gen_input_logits(g, i, n, want).  Returns the
 * count, 0 once finished (or while accepted tokens are still pending:
 * cw_gen_n_pending).
 */
int cw_gen_next_input(const struct cw_gen *g, int max_n, uint32_t *ret_pos,
		      const int32_t **ret_ids, int *ret_want_logits);
/* The vocab_size logits buffer (owned by g) for token i of an input of n
 * tokens from cw_gen_next_input (want its *ret_want_logits), or NULL when
 * that token's logits are not needed. */
float *cw_gen_input_logits(struct cw_gen *g, int i, int n, int want);
/* The KV sequence, and whether it must be pinned while computing (kvd may
 * spill idle sequences). */
uint32_t cw_gen_seq(const struct cw_gen *g);
int cw_gen_pin_steps(const struct cw_gen *g);
/* The vocab_size logits buffer of the next sample (owned by g); after a
 * step, the logits that step sampled from (tests compare them bit for bit;
 * a step that verified drafts: those of its first position), valid until
 * the next step or cw_gen_free. */
float *cw_gen_logits(struct cw_gen *g);

/*
 * After the n tokens of cw_gen_next_input were evaluated (logits in
 * cw_gen_input_logits when wanted): while the prompt is not complete,
 * records them and returns 0 with *ret_token -1; else samples, publishes
 * the prompt's pages to the prefix cache (after the prefill), and returns
 * the released text as cw_gen_step does.  step_ns (the step's wall time) is
 * added to the prefill or decode time.
 * A decode step with drafts (n > 1) is verified: greedy keeps the longest
 * prefix of drafts equal to the argmax at each position, sampling runs
 * cw_sampler_verify on each in turn (the speculative sampling rule); the
 * first rejected position's token (or, all accepted, the next one) ends
 * the step.  The KV rows of rejected drafts are cut back in kvd
 * (cw_model_seq_truncate).  The first token is returned here, the others
 * are pending: take them with cw_gen_emit_pending before the next input.
 * Errors as cw_gen_step.
 */
int cw_gen_advance(struct cw_gen *g, int n, uint64_t step_ns, char *out,
		   size_t cap, int32_t *ret_token, enum cw_finish *ret_finish,
		   struct st_diag *diag);

/* Tokens a verified step accepted that were not returned yet. */
int cw_gen_n_pending(const struct cw_gen *g);
/* Returns the next pending token as cw_gen_advance returns one (text in
 * out, *ret_token, *ret_finish); a finish (EOS, stop, length) drops the
 * rest.  0 bytes and *ret_token -1 when none is pending.  Errors as
 * cw_gen_step. */
int cw_gen_emit_pending(struct cw_gen *g, char *out, size_t cap,
			int32_t *ret_token, enum cw_finish *ret_finish,
			struct st_diag *diag);
/* The draft length in use (draft_max, or 0 where the model family cannot
 * verify drafts) and the speculation figures so far. */
int cw_gen_draft_max(const struct cw_gen *g);
void cw_gen_spec_stats(const struct cw_gen *g, struct cw_gen_spec_stats *ret);

/* The expert bytes the coming cw_gen_advance's step read
 * (cw_read_stats.expert_bytes after - before; a batched step's whole
 * count): the speculation figures and the priced draft length use it.
 * Not called: 0. */
void cw_gen_note_step_bytes(struct cw_gen *g, uint64_t expert_bytes);

/* Ends the generation with CW_FINISH_ERROR (a failed batch step). */
void cw_gen_fail(struct cw_gen *g);

/* Log-probabilities of the last sampled token (valid after a sample). */
const struct cw_gen_logprob *cw_gen_last_logprob(const struct cw_gen *g);

/*
 * Produces the next token by itself (one sequence, no scheduler).  The
 * first call runs the prefill; with speculation a step may accept several
 * tokens, which the next calls return without evaluating.  Writes the
 * text that became final into out (cap bytes, NUL-terminated; cap >= 1024
 * recommended) and returns its length, with *ret_token the id sampled (-1
 * if none) and *ret_finish the finish reason (CW_FINISH_NONE while going on).
 * After a finish, further calls return 0 bytes.  Errors: negative code with
 * diag (the generation is then finished with CW_FINISH_ERROR).
 */
int cw_gen_step(struct cw_gen *g, char *out, size_t cap, int32_t *ret_token,
		enum cw_finish *ret_finish, struct st_diag *diag);

/* Frees the KV sequence and everything else. NULL is fine. */
void cw_gen_free(struct cw_gen *g);

int cw_gen_n_prompt(const struct cw_gen *g);
/* Prompt tokens whose KV rows came from the prefix cache. */
int cw_gen_n_cached(const struct cw_gen *g);
/* New tokens this generation may produce: max_tokens, cut to the context. */
int cw_gen_max_tokens(const struct cw_gen *g);
int cw_gen_n_generated(const struct cw_gen *g);
/* The prompt's token ids (borrowed). */
const int32_t *cw_gen_prompt_ids(const struct cw_gen *g);
/* Nanoseconds of the prefill (first step) and of all later steps. */
uint64_t cw_gen_prefill_ns(const struct cw_gen *g);
uint64_t cw_gen_decode_ns(const struct cw_gen *g);

#endif
