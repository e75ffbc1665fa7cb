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

#include "cw_model.h"
#include "cw_sampler.h"
#include "st_tokenizer.h"

#define CW_GEN_MAX_STOP 4
#define CW_PREFILL_CHUNK 256 /* prompt tokens per forward call */

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
	struct cw_sampler_params sampler;
	int n_stop;
	const char *stop[CW_GEN_MAX_STOP]; /* copied by cw_gen_start */
	int add_special;                  /* BOS etc. as tokenizer_config says */
	int parse_special;                /* special tokens spelled in the prompt */
	int ignore_eos;
	int prefix_cache;                 /* map cached prompt pages from kvd
					   * and publish this prompt's */
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
 * Produces the next token.  The first call runs the prefill.  Writes the
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
/* Logits (vocab_size floats) the last step sampled from; valid until the
 * next step or cw_gen_free.  Tests compare them bit for bit. */
const float *cw_gen_logits(const struct cw_gen *g);

#endif
