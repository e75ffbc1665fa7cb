/* cw_gen.c — see cw_gen.h. */
#include "cw_gen.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_stopbuf.h"
#include "st_log.h"
#include "st_util.h"

struct cw_gen {
	struct cw_model *model;          /* borrowed */
	const struct st_tokenizer *tok;  /* borrowed */
	struct kv_client *kv;            /* borrowed */
	uint32_t seq;
	int have_seq;
	int32_t *ids;                    /* prompt then generated, owned */
	int n_prompt, n_gen, cap_ids, max_tokens;
	int n_done;                      /* prompt rows computed so far */
	struct cw_gen_logprob lp;        /* of the last sampled token */
	int context_cut;                 /* max_tokens was cut to the context */
	uint32_t n_cached;               /* prompt rows mapped from the prefix
					  * cache (not computed again) */
	int pin_steps;                   /* kvd may spill: pin while computing */
	struct cw_gen_params p;
	struct cw_stopbuf stops;         /* stop strings over the text */
	struct cw_sampler sampler;
	struct st_detok detok;
	float *logits;                   /* (1 + draft_max) x vocab_size:
					  * row i for token i of a decode
					  * input, owned */
	enum cw_finish finish;
	uint64_t prefill_ns, decode_ns;
	/* speculative decoding (issue 22) */
	int draft_max;                   /* 0: off */
	int draft_cur;                   /* this step's limit, 1..draft_max */
	int n_draft;                     /* drafts in ids after the last
					  * sampled token, for the next step */
	int32_t pend[CW_DRAFT_MAX + 1];  /* tokens a step accepted ... */
	int pend_row[CW_DRAFT_MAX + 1];  /* ... their logits rows */
	int n_pend, i_pend;              /* pend[i_pend..n_pend) not yet
					  * returned */
	struct cw_gen_spec_stats spec;
	/* priced draft length (cw_draft_price.h), and the step's figures */
	int price_on;
	struct cw_draft_price price;
	int mtp_failed;                  /* MTP drafts refused (warned once) */
	int step_limit;                  /* the limit of the coming step */
	uint64_t step_ns, step_bytes;    /* of the step being advanced */
};

int cw_gen_n_prompt(const struct cw_gen *g) { return g->n_prompt; }
int cw_gen_n_generated(const struct cw_gen *g) { return g->n_gen; }
int cw_gen_max_tokens(const struct cw_gen *g) { return g->max_tokens; }
int cw_gen_n_cached(const struct cw_gen *g) { return (int)g->n_cached; }
const int32_t *cw_gen_prompt_ids(const struct cw_gen *g) { return g->ids; }
uint64_t cw_gen_prefill_ns(const struct cw_gen *g) { return g->prefill_ns; }
uint64_t cw_gen_decode_ns(const struct cw_gen *g) { return g->decode_ns; }
int cw_gen_draft_max(const struct cw_gen *g) { return g->draft_max; }
int cw_gen_n_pending(const struct cw_gen *g) { return g->n_pend - g->i_pend; }

void cw_gen_spec_stats(const struct cw_gen *g, struct cw_gen_spec_stats *ret)
{
	*ret = g->spec;
}

void cw_gen_free(struct cw_gen *g)
{
	if (!g)
		return;
	if (g->have_seq)
		cw_model_seq_destroy(g->model, g->kv, g->seq);
	cw_stopbuf_fini(&g->stops);
	cw_sampler_fini(&g->sampler);
	free(g->ids);
	free(g->logits);
	free(g);
}

int cw_gen_start(struct cw_model *model, const struct st_tokenizer *tok,
		 struct kv_client *kv, const char *prompt, size_t prompt_len,
		 const struct cw_gen_params *p, struct cw_gen **ret,
		 struct st_diag *diag)
{
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int r;

	r = st_tokenizer_encode(tok, prompt, prompt_len, p->add_special,
				p->parse_special, &ids, &n_ids);
	if (r < 0)
		return st_diag_set(diag, r, "cannot encode the prompt: %s",
				   st_strerror(r));
	r = cw_gen_start_ids(model, tok, kv, ids, n_ids, p, ret, diag);
	free(ids);
	return r;
}

int cw_gen_start_ids(struct cw_model *model, const struct st_tokenizer *tok,
		     struct kv_client *kv, const int32_t *ids, size_t n_ids,
		     const struct cw_gen_params *p, struct cw_gen **ret,
		     struct st_diag *diag)
{
	const struct st_model_config *c = cw_model_config(model);
	struct cw_gen *g = calloc(1, sizeof(*g));
	int r;

	if (!g)
		return -ENOMEM;
	g->model = model;
	g->tok = tok;
	g->kv = kv;
	g->p = *p;
	r = cw_stopbuf_init(&g->stops, p->n_stop, p->stop);
	if (r < 0) {
		free(g);
		return st_diag_set(diag, r, "stop strings: at most %d, none "
				   "empty", CW_GEN_MAX_STOP);
	}
	for (int i = 0; i < p->n_stop; i++)
		g->p.stop[i] = NULL; /* copies live in g->stops */
	r = cw_sampler_init(&g->sampler, &p->sampler);
	if (r < 0) {
		cw_gen_free(g);
		return st_diag_set(diag, r, "invalid sampling parameters");
	}
	if (g->p.draft_max == CW_DRAFT_DEFAULT)
		g->p.draft_max = 0;
	if (g->p.draft_max < 0 || g->p.draft_max > CW_DRAFT_MAX) {
		cw_gen_free(g);
		return st_diag_set(diag, -EINVAL, "draft_max must be 0..%d",
				   CW_DRAFT_MAX);
	}
	/* MTP drafts asked of a store without the block: refused (also
	 * where drafts would go off below) */
	if (g->p.draft_max > 0 && g->p.draft_mtp && !cw_model_has_mtp(model)) {
		cw_gen_free(g);
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "--speculate mtp: the store has no MTP block to draft with (a DeepSeek-V4 checkpoint's mtp.0.*, kept by strata convert, has one); use ngram or auto");
	}
	/* drafts only where the model's sequences can be cut back */
	g->draft_max = cw_model_can_verify_drafts(model) ? g->p.draft_max : 0;
	g->draft_cur = g->draft_max;
	g->price_on = g->p.draft_price && g->draft_max > 0 &&
		      cw_draft_price_init(&g->price, g->draft_max) == 0;
	if (g->p.top_logprobs < 0 || g->p.top_logprobs > CW_GEN_MAX_TOP) {
		cw_gen_free(g);
		return st_diag_set(diag, -EINVAL, "top_logprobs must be 0..%d",
				   CW_GEN_MAX_TOP);
	}
	if (n_ids == 0) {
		cw_gen_free(g);
		return st_diag_set(diag, -EINVAL,
				   "the prompt encodes to no tokens; give some "
				   "text");
	}
	if (n_ids >= (size_t)c->max_position_embeddings) {
		cw_gen_free(g);
		return st_diag_set(diag, -ST_E_LIMIT,
				   "prompt of %zu tokens does not fit the "
				   "model's context of %d tokens", n_ids,
				   c->max_position_embeddings);
	}
	g->max_tokens = p->max_tokens;
	if (g->max_tokens < 0)
		g->max_tokens = 0;
	if ((size_t)g->max_tokens > (size_t)c->max_position_embeddings - n_ids) {
		g->max_tokens = c->max_position_embeddings - (int)n_ids;
		g->context_cut = 1;
	}
	g->cap_ids = (int)n_ids + g->max_tokens + 1;
	g->ids = malloc(sizeof(int32_t) * (size_t)g->cap_ids);
	g->logits = malloc(sizeof(float) * (size_t)c->vocab_size *
			   (size_t)(1 + g->draft_max));
	if (!g->ids || !g->logits) {
		cw_gen_free(g);
		return -ENOMEM;
	}
	memcpy(g->ids, ids, sizeof(int32_t) * n_ids);
	g->n_prompt = (int)n_ids;
	/* the positions it may evaluate: the prompt, then each sampled
	 * token but the last */
	r = cw_model_seq_create(model, kv, g->ids, g->n_prompt,
				g->p.prefix_cache,
				g->p.kv_private ? KV_PUBLISH_F_PRIVATE : 0,
				g->n_prompt + g->max_tokens,
				&g->seq, &g->n_cached, diag);
	if (r < 0) {
		cw_gen_free(g);
		return r;
	}
	g->have_seq = 1;
	g->n_done = (int)g->n_cached;
	/* a V4 state publishes its own pages: not those of drafts; MTP
	 * drafts: the block follows the sequence from its first eval */
	if (g->draft_max > 0 &&
	    ((r = cw_model_seq_publish_lag(model, g->seq, g->draft_max,
					   diag)) < 0 ||
	     (g->p.draft_mtp &&
	      (r = cw_model_seq_mtp_follow(model, g->seq, diag)) < 0))) {
		cw_gen_free(g);
		return r;
	}
	{
		/* without a spill budget nothing ever leaves the pool, so the
		 * two pin/unpin round trips per step are not needed */
		struct kv_stats ks;

		g->pin_steps = kv_client_stats(kv, &ks) < 0 ||
			       ks.spill_budget_bytes > 0;
		/* a V4 eval pins its sequence itself (cw_dsv_eval) */
		if (cw_model_is_dsv4(model))
			g->pin_steps = 0;
	}
	st_detok_init(&g->detok, tok, 1);
	*ret = g;
	return 0;
}

static int is_eos(const struct cw_gen *g, int32_t id)
{
	const struct st_model_config *c = cw_model_config(g->model);

	for (int i = 0; i < c->n_eos; i++)
		if (c->eos_token_ids[i] == id)
			return 1;
	return id == st_tokenizer_eos_id(g->tok);
}

uint32_t cw_gen_seq(const struct cw_gen *g) { return g->seq; }
int cw_gen_pin_steps(const struct cw_gen *g) { return g->pin_steps; }
float *cw_gen_logits(struct cw_gen *g) { return g->logits; }

const struct cw_gen_logprob *cw_gen_last_logprob(const struct cw_gen *g)
{
	return &g->lp;
}

void cw_gen_fail(struct cw_gen *g)
{
	g->finish = CW_FINISH_ERROR;
}

int cw_gen_next_input(const struct cw_gen *g, int max_n, uint32_t *ret_pos,
		      const int32_t **ret_ids, int *ret_want_logits)
{
	int n;

	if (g->finish != CW_FINISH_NONE || g->max_tokens == 0 || max_n <= 0 ||
	    cw_gen_n_pending(g) > 0)
		return 0;
	if (g->n_done < g->n_prompt) {
		n = ST_MIN(max_n, g->n_prompt - g->n_done);
		*ret_pos = (uint32_t)g->n_done;
		*ret_ids = g->ids + g->n_done;
		*ret_want_logits = g->n_done + n == g->n_prompt;
		return n;
	}
	/* the last sampled token, then the drafts proposed after it */
	*ret_pos = (uint32_t)(g->n_prompt + g->n_gen - 1);
	*ret_ids = g->ids + *ret_pos;
	*ret_want_logits = 1;
	return 1 + ST_MIN(g->n_draft, max_n - 1);
}

float *cw_gen_input_logits(struct cw_gen *g, int i, int n, int want)
{
	size_t vocab = (size_t)cw_model_config(g->model)->vocab_size;

	if (!want || i < 0 || i >= n)
		return NULL;
	if (g->n_done < g->n_prompt)
		return i == n - 1 ? g->logits : NULL;
	return i <= g->draft_max ? g->logits + (size_t)i * vocab : NULL;
}

/* Proposes the drafts of the next step after the last sampled token:
 * prompt-lookup over the sequence so far, at most draft_cur and the
 * tokens still to generate minus one (the step's own sample comes on
 * top). */
static void propose_drafts(struct cw_gen *g)
{
	int len = g->n_prompt + g->n_gen;
	int lim = ST_MIN(g->draft_cur, g->max_tokens - g->n_gen - 1);
	int k;

	g->n_draft = 0;
	if (g->finish != CW_FINISH_NONE)
		return;
	if (g->price_on) {
		g->draft_cur = cw_draft_price_next(&g->price);
		lim = ST_MIN(g->draft_cur, g->max_tokens - g->n_gen - 1);
	}
	g->step_limit = lim > 0 ? lim : 0;
	if (lim <= 0)
		return;
	if (g->p.draft_mtp) {
		/* the model's MTP block after the last evaluated position
		 * and the token just sampled (a failure: no drafts) */
		struct st_diag d = { { 0 } };

		k = cw_model_seq_mtp_draft(g->model, g->seq, g->ids[len - 1],
					   lim, g->ids + len, &d);
		if (k < 0 && !g->mtp_failed++)
			st_warn("MTP drafts: %s (this request goes on without)",
				d.msg);
	} else {
		k = cw_draft_ngram(g->ids, len, CW_DRAFT_NGRAM_MIN,
				   CW_DRAFT_NGRAM_MAX, lim, g->ids + len);
	}
	g->n_draft = k > 0 ? k : 0;
}

/* Log-probability of the sampled token and the top alternatives, from
 * the raw logits (log-sum-exp accumulated in double). */
static void note_logprob(struct cw_gen *g, const float *lg, int vocab,
			 int32_t tok)
{
	double mx = -INFINITY, sum = 0.0;
	float lse;
	int k = g->p.top_logprobs;

	for (int i = 0; i < vocab; i++)
		if (lg[i] > mx)
			mx = lg[i];
	for (int i = 0; i < vocab; i++)
		sum += exp((double)lg[i] - mx);
	lse = (float)(mx + log(sum));
	g->lp.logprob = lg[tok] - lse;
	g->lp.n_top = 0;
	for (int i = 0; i < vocab && k > 0; i++) {
		int j = g->lp.n_top;

		if (j == k && lg[i] <= lg[g->lp.top_id[k - 1]])
			continue;
		if (j < k)
			g->lp.n_top++;
		else
			j = k - 1;
		/* insertion: ties keep the lower id first */
		while (j > 0 && lg[g->lp.top_id[j - 1]] < lg[i]) {
			g->lp.top_id[j] = g->lp.top_id[j - 1];
			j--;
		}
		g->lp.top_id[j] = i;
	}
	for (int j = 0; j < g->lp.n_top; j++)
		g->lp.top_logprob[j] = lg[g->lp.top_id[j]] - lse;
}

void cw_gen_note_step_bytes(struct cw_gen *g, uint64_t expert_bytes)
{
	g->step_bytes = expert_bytes;
}

/* The figures of a decode step of n tokens that produced cnt (its drafts
 * are n - 1, cnt - 1 of them accepted), and the priced model's note. */
static void note_step_price(struct cw_gen *g, int n, int cnt)
{
	struct cw_gen_spec_stats *sp = &g->spec;

	sp->limit_sum += (uint64_t)g->step_limit;
	sp->limit_hist[g->step_limit]++;
	if (n > 1) {
		sp->spec_steps++;
		sp->drafted += (uint64_t)(n - 1);
		sp->accepted += (uint64_t)(cnt - 1);
		sp->bytes_verify += g->step_bytes;
		sp->tokens_verify += (uint64_t)cnt;
	} else {
		sp->bytes_plain += g->step_bytes;
	}
	/* n <= 1 + draft_max (checked by the caller): in range */
	if (g->price_on)
		(void)cw_draft_price_note(&g->price, n - 1, cnt - 1,
					  g->step_ns, g->step_bytes);
}

/*
 * Verifies a decode step of n tokens (the last sampled one and n - 1
 * drafts; n 1: plain sampling) from the logits rows 0..n-1: accepts drafts
 * while the sampler agrees (cw_sampler_verify: greedy argmax, or the
 * speculative sampling rule), then the token of the first disagreeing
 * position (or, all accepted, of the last row) ends the step.  The
 * accepted tokens go to pend[]; the KV rows of rejected drafts are cut
 * back in kvd.  0 or a negative code (sampler, kvd).
 */
static int verify_step(struct cw_gen *g, int n, struct st_diag *diag)
{
	const int vocab = cw_model_config(g->model)->vocab_size;
	const int base = g->n_prompt + g->n_gen; /* ids[base + i]: draft i */
	int cnt = 0, r;

	if (n < 1 || n > 1 + g->draft_max)
		return st_diag_set(diag, -EINVAL, "a decode step of %d tokens "
				   "(at most 1 + %d drafts)", n, g->draft_max);
	for (int i = 0; i < n; i++) {
		const float *lg = g->logits + (size_t)i * (size_t)vocab;
		int32_t d = i < n - 1 ? g->ids[base + i] : -1;

		r = d >= 0 ? cw_sampler_verify(&g->sampler, lg, vocab, d) :
			     cw_sampler_sample(&g->sampler, lg, vocab);
		if (r < 0)
			return st_diag_set(diag, r, "sampling failed: %s",
					   st_strerror(r));
		g->pend[cnt] = r;
		g->pend_row[cnt++] = i;
		if (r != d)
			break;
	}
	g->n_pend = cnt;
	g->i_pend = 0;
	g->n_draft = 0;
	if (n > 1 && !g->price_on) {
		/* the draft length follows the acceptance: + 2 after a step
		 * that accepted every draft, - 1 (not below 1) after one that
		 * rejected some (the "heuristic" schedule of Hugging Face
		 * transformers' assisted generation); it depends on the
		 * tokens only, so a seed still gives the same output */
		g->draft_cur = cnt == n ?
				       ST_MIN(g->draft_max, g->draft_cur + 2) :
				       ST_MAX(1, g->draft_cur - 1);
	}
	if (cnt < n) {
		/* rows base-1 .. base+cnt-2 hold the last sampled token and
		 * the accepted drafts: the sequence is base + cnt - 1 rows */
		r = cw_model_seq_truncate(g->model, g->kv, g->seq,
					  (uint32_t)(base + cnt - 1), diag);
		if (r < 0)
			return r;
		g->spec.rollbacks++;
	}
	return 0;
}

int cw_gen_advance(struct cw_gen *g, int n, uint64_t step_ns, char *out,
		   size_t cap, int32_t *ret_token, enum cw_finish *ret_finish,
		   struct st_diag *diag)
{
	int decode = g->n_done >= g->n_prompt;
	int r;

	*ret_token = -1;
	out[0] = 0;
	*ret_finish = g->finish;
	if (g->finish != CW_FINISH_NONE)
		return 0;
	if (g->max_tokens == 0) {
		g->finish = CW_FINISH_LENGTH;
		*ret_finish = g->finish;
		return 0;
	}
	g->step_ns = step_ns;
	if (g->n_gen == 0)
		g->prefill_ns += step_ns;
	else
		g->decode_ns += step_ns;
	if (decode)
		g->spec.steps++;
	if (g->n_done < g->n_prompt) {
		g->n_done += n;
		if (g->n_done < g->n_prompt)
			return 0;
		/* the prompt's full pages become findable for later
		 * requests with the same prefix (a V4 state published them
		 * as they were evaluated: its window pages go as it moves) */
		if (g->p.prefix_cache && !cw_model_is_dsv4(g->model)) {
			r = kv_client_seq_publish_flags(
				g->kv, g->seq, g->ids, (uint32_t)g->n_prompt,
				g->p.kv_private ? KV_PUBLISH_F_PRIVATE : 0,
				diag);
			if (r < 0)
				goto fail;
		}
	}
	r = verify_step(g, decode ? n : 1, diag);
	if (r < 0)
		goto fail;
	if (decode)
		note_step_price(g, n, g->n_pend);
	g->step_bytes = 0;
	return cw_gen_emit_pending(g, out, cap, ret_token, ret_finish, diag);
fail:
	g->finish = CW_FINISH_ERROR;
	*ret_finish = g->finish;
	return r;
}

/* Records token tok (sampled from logits lg) as generated and releases
 * its text: EOS, max_tokens and stop strings end the generation. */
static int emit_token(struct cw_gen *g, int32_t tok, const float *lg,
		      char *out, size_t cap, int32_t *ret_token,
		      enum cw_finish *ret_finish)
{
	const struct st_model_config *c = cw_model_config(g->model);
	char piece[512];
	int n, r;

	if (g->p.logprobs)
		note_logprob(g, lg, c->vocab_size, tok);
	g->ids[g->n_prompt + g->n_gen] = tok;
	g->n_gen++;
	*ret_token = tok;
	if (!g->p.ignore_eos && is_eos(g, tok)) {
		g->finish = CW_FINISH_EOS;
		n = st_detok_flush(&g->detok, piece, sizeof(piece));
	} else {
		n = st_detok_push(&g->detok, tok, piece, sizeof(piece));
		if (n >= 0 && g->n_gen >= g->max_tokens) {
			int m = st_detok_flush(&g->detok, piece + n,
					       sizeof(piece) - (size_t)n);
			if (m > 0)
				n += m;
			g->finish = g->context_cut ? CW_FINISH_CONTEXT :
						     CW_FINISH_LENGTH;
		}
	}
	if (n < 0)
		return n;
	r = cw_stopbuf_push(&g->stops, piece, (size_t)n,
			    g->finish != CW_FINISH_NONE, out, cap);
	if (r < 0)
		return r;
	if (g->stops.stopped)
		g->finish = CW_FINISH_STOP;
	*ret_finish = g->finish;
	return r;
}

int cw_gen_emit_pending(struct cw_gen *g, char *out, size_t cap,
			int32_t *ret_token, enum cw_finish *ret_finish,
			struct st_diag *diag)
{
	size_t vocab = (size_t)cw_model_config(g->model)->vocab_size;
	int i = g->i_pend, r;

	(void)diag;
	*ret_token = -1;
	out[0] = 0;
	*ret_finish = g->finish;
	if (g->finish != CW_FINISH_NONE || i >= g->n_pend)
		return 0;
	g->i_pend++;
	r = emit_token(g, g->pend[i],
		       g->logits + (size_t)g->pend_row[i] * vocab, out, cap,
		       ret_token, ret_finish);
	if (r < 0) {
		g->finish = CW_FINISH_ERROR;
		*ret_finish = g->finish;
		return r;
	}
	/* a finish drops what is left; else the next step's drafts come
	 * once every accepted token is out */
	if (g->finish != CW_FINISH_NONE || g->i_pend == g->n_pend) {
		g->n_pend = g->i_pend = 0;
		propose_drafts(g);
	}
	return r;
}

int cw_gen_step(struct cw_gen *g, char *out, size_t cap, int32_t *ret_token,
		enum cw_finish *ret_finish, struct st_diag *diag)
{
	uint64_t t0 = st_now_ns();
	struct cw_read_stats rs0, rs1;
	const int32_t *ids;
	uint32_t pos;
	int r = 0, n, want;

	*ret_token = -1;
	out[0] = 0;
	if (cw_gen_n_pending(g) > 0)
		return cw_gen_emit_pending(g, out, cap, ret_token, ret_finish,
					   diag);
	if (g->finish != CW_FINISH_NONE || g->max_tokens == 0)
		return cw_gen_advance(g, 0, 0, out, cap, ret_token, ret_finish,
				      diag);
	/* the sequence's pages must be on the host while we compute (kvd
	 * may have spilled them while the generation was idle) */
	r = g->pin_steps ? kv_client_seq_pin(g->kv, 1, &g->seq, NULL, diag) : 0;
	if (r < 0)
		goto fail;
	/* the whole prompt (in chunks) or a decode step (the last token
	 * and its drafts: logits at every position) */
	cw_model_read_stats(g->model, &rs0);
	do {
		int decode = g->n_done >= g->n_prompt;

		n = cw_gen_next_input(g, CW_PREFILL_CHUNK, &pos, &ids, &want);
		r = cw_model_eval(g->model, g->seq, pos, ids, n,
				  decode ? g->logits : NULL,
				  !decode && want ? g->logits : NULL, diag);
		if (r < 0)
			break;
		if (!want)
			g->n_done += n;
	} while (!want);
	/* idle between steps: kvd may spill it under memory pressure */
	if (g->pin_steps) {
		int u = kv_client_seq_unpin(g->kv, 1, &g->seq,
					    r < 0 ? NULL : diag);

		if (r == 0)
			r = u;
	}
	if (r < 0)
		goto fail;
	cw_model_read_stats(g->model, &rs1);
	cw_gen_note_step_bytes(g, rs1.expert_bytes - rs0.expert_bytes);
	return cw_gen_advance(g, n, st_now_ns() - t0, out, cap, ret_token,
			      ret_finish, diag);
fail:
	g->finish = CW_FINISH_ERROR;
	*ret_finish = g->finish;
	return r;
}
