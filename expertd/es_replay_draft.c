/*
 * es_replay_draft.c — draft foresight for the replay (model: es_replay.h,
 * docs/REPLAY.md "Draft foresight"): what speculative decoding's drafts
 * would tell an expert cache about the next tokens.
 *
 * A draft made at token g proposes the tokens g+1 .. g+LEN.  Its accepted
 * prefix A follows the usual acceptance model of speculative decoding: draft
 * token j is accepted with probability ACCEPT given that tokens 1 .. j-1
 * were (so P(A >= j) = ACCEPT^j).  Position j <= A shows the true routing of
 * token g+j (the target model routes the accepted drafts in the verify
 * step); a rejected position shows the routing of a different token drawn
 * uniformly from the trace, as a wrong draft token would (its routing is the
 * target's routing of a token that is not the one that comes next).
 *
 * The current token's own routing at its later layers is known too when an
 * earlier draft showed it as accepted (sliding: the previous token's draft
 * accepted its first position; per step: every token of the accepted
 * prefix), never for a token no draft predicted.
 *
 * Schedules: sliding (a new draft at every token, the window always the
 * next LEN tokens) or per verify step (a draft at g, the next one at
 * g + A + 1, the token after the accepted prefix; within the step the
 * window is what is left of the draft, rejected positions included, since a
 * runtime learns which drafts failed only at the end of the verify pass).
 *
 * Draws are a hash of (seed, g, j), not a stream, so every policy and
 * every pool size sees the same drafts and the replay stays deterministic.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "es_replay_int.h"

#define NONE UINT32_MAX

/* splitmix64's output function (Steele, Lea and Flood, "Fast splittable
 * pseudorandom number generators", OOPSLA 2014; the constants of Vigna's
 * splitmix64.c): a bijection of 64-bit words that mixes every input bit. */
static uint64_t mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t draw(const struct es_rdraft *d, uint32_t g, uint32_t j,
		     uint32_t what)
{
	return mix64(d->seed ^ mix64(((uint64_t)g << 32) |
				     ((uint64_t)j << 8) | what));
}

/* Uniform in [0, 1) from the top 53 bits. */
static double uniform(const struct es_rdraft *d, uint32_t g, uint32_t j)
{
	return (double)(draw(d, g, j, 0) >> 11) * 0x1.0p-53;
}

int es_rdraft_init(struct es_rdraft *d, const struct es_trace *t,
		   const struct es_replay_opts *o, uint32_t n_keys,
		   struct st_diag *diag)
{
	memset(d, 0, sizeof(*d));
	if (o->draft_len < 1 || o->draft_len > ES_REPLAY_MAX_DRAFT)
		return st_diag_set(diag, -EINVAL, "a draft of %d tokens: use "
				   "1 to %d", o->draft_len,
				   ES_REPLAY_MAX_DRAFT);
	if (!(o->draft_accept >= 0.0 && o->draft_accept <= 1.0))
		return st_diag_set(diag, -EINVAL, "draft acceptance %g is not "
				   "in [0, 1]", o->draft_accept);
	if (t->batched)
		return st_diag_set(diag, -EINVAL, "draft foresight needs a "
				   "batch-1 trace (tokens in order); this one "
				   "is batched");
	d->t = t;
	d->len = o->draft_len;
	d->accept = o->draft_accept;
	d->per_step = o->draft_per_step;
	d->no_wrong = o->draft_no_wrong;
	d->seed = o->draft_seed ? o->draft_seed : ES_REPLAY_DRAFT_SEED;
	d->known = calloc(n_keys, sizeof(*d->known));
	d->pos = calloc(n_keys, sizeof(*d->pos));
	d->tok_first = calloc(t->n_tokens ? t->n_tokens : 1,
			      sizeof(*d->tok_first));
	d->tok_n = calloc(t->n_tokens ? t->n_tokens : 1, sizeof(*d->tok_n));
	d->cur_step = calloc((size_t)t->n_layers, sizeof(*d->cur_step));
	if (!d->known || !d->pos || !d->tok_first || !d->tok_n ||
	    !d->cur_step) {
		es_rdraft_fini(d);
		return -ENOMEM;
	}
	for (size_t s = 0; s < t->n_steps; s++) {
		uint32_t tk = t->steps[s].token;

		if (tk >= t->n_tokens || (d->tok_n[tk] &&
		    d->tok_first[tk] + d->tok_n[tk] != s)) {
			es_rdraft_fini(d);
			return st_diag_set(diag, -EINVAL, "draft foresight "
					   "needs each token's steps together "
					   "(token %u at step %zu)", tk, s);
		}
		if (!d->tok_n[tk]++)
			d->tok_first[tk] = (uint32_t)s;
	}
	return 0;
}

void es_rdraft_fini(struct es_rdraft *d)
{
	free(d->known);
	free(d->pos);
	free(d->tok_first);
	free(d->tok_n);
	free(d->cur_step);
	memset(d, 0, sizeof(*d));
}

/* A new draft at token g: the accepted prefix and each position's source. */
static void make_draft(struct es_rdraft *d, uint32_t g,
		       struct es_replay_stats *st)
{
	uint32_t n = d->t->n_tokens;

	d->g = g;
	d->a = 0;
	for (int j = 1; j <= d->len && uniform(d, g, (uint32_t)j) < d->accept;
	     j++)
		d->a = (uint32_t)j;
	for (uint32_t j = 1; j <= (uint32_t)d->len; j++) {
		uint32_t w;

		d->src[j] = NONE;
		if ((uint64_t)g + j >= n)
			continue; /* past the trace's end: nothing to know */
		if (j <= d->a) {
			d->src[j] = g + j;
			st->draft_accepted++;
			continue;
		}
		if (d->no_wrong || n < 2)
			continue;
		w = (uint32_t)(draw(d, g, j, 1) % n);
		if (w == g + j)
			w = (w + 1) % n; /* a different token */
		d->src[j] = w;
	}
	st->draft_events++;
	d->have = 1;
}

void es_rdraft_token(struct es_rdraft *d, uint32_t token,
		     struct es_replay_stats *st)
{
	const struct es_trace *t = d->t;
	uint32_t j0;

	/* This token was shown as accepted by the draft made before it:
	 * sliding, the previous token's draft accepted its first position;
	 * per step, the token lies in the accepted prefix (not the step's
	 * first token, which no draft predicted).  A rejected guess for it
	 * is known to be wrong by now. */
	d->cur = token;
	d->cur_known = d->have && token > d->g && token - d->g <= d->a &&
		(d->per_step || token == d->g + 1);
	for (int l = 0; l < t->n_layers; l++)
		d->cur_step[l] = -1;
	if (d->cur_known)
		for (uint32_t s = d->tok_first[token];
		     s < d->tok_first[token] + d->tok_n[token]; s++)
			d->cur_step[t->steps[s].layer] = (int32_t)s;
	if (!d->per_step || !d->have || token >= d->next_g) {
		make_draft(d, token, st);
		d->next_g = token + d->a + 1;
	}
	j0 = token - d->g + 1;
	if (++d->stamp == 0) { /* wrapped: forget every old stamp */
		memset(d->known, 0, (size_t)t->n_layers * t->n_experts *
		       sizeof(*d->known));
		d->stamp = 1;
	}
	for (uint32_t j = j0; j <= (uint32_t)d->len; j++) {
		uint32_t w = d->src[j];

		if (w == NONE)
			continue;
		for (uint32_t s = d->tok_first[w];
		     s < d->tok_first[w] + d->tok_n[w]; s++) {
			const struct es_trace_step *ts = &t->steps[s];
			uint32_t base = (uint32_t)ts->layer *
				(uint32_t)t->n_experts;
			uint64_t vpos = ((uint64_t)d->g + j) *
				(uint64_t)t->n_layers + ts->layer;

			for (int k = 0; k < ts->n; k++) {
				uint32_t key = base + t->ids[ts->first + k];

				/* nearest first: the first mark stays */
				if (d->known[key] != d->stamp) {
					d->known[key] = d->stamp;
					d->pos[key] = vpos;
				}
			}
		}
	}
}

int es_rdraft_lookup(const struct es_rdraft *d, uint32_t key, int layer,
		     uint64_t *ret_pos)
{
	const struct es_trace *t = d->t;
	uint32_t kl = key / (uint32_t)t->n_experts;

	if (d->cur_known && (int)kl > layer && d->cur_step[kl] >= 0) {
		const struct es_trace_step *ts = &t->steps[d->cur_step[kl]];
		uint16_t id = (uint16_t)(key % (uint32_t)t->n_experts);

		for (int k = 0; k < ts->n; k++)
			if (t->ids[ts->first + k] == id) {
				*ret_pos = (uint64_t)d->cur *
					(uint64_t)t->n_layers + kl;
				return 1;
			}
	}
	if (d->known[key] == d->stamp) {
		*ret_pos = d->pos[key];
		return 1;
	}
	return 0;
}

long es_rdraft_next_step(const struct es_rdraft *d, uint32_t token,
			 int layer)
{
	uint32_t j = token - d->g + 1, w;

	if (!d->have || token < d->g || j > (uint32_t)d->len)
		return -1;
	w = d->src[j];
	if (w == NONE)
		return -1;
	for (uint32_t s = d->tok_first[w]; s < d->tok_first[w] + d->tok_n[w];
	     s++)
		if (d->t->steps[s].layer == layer)
			return (long)s;
	return -1;
}
