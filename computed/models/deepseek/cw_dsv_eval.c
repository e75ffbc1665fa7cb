/*
 * cw_dsv_eval.c — the DeepSeek-V4 family's forward loop, every revision
 * (cw_dsv.h: cw_dsv_eval; cw_dsv_state.h).  Formulas: the revision's
 * layer function (cw_dsv4.c: MODEL_FAMILY_DEEPSEEK_V4.md 2.5; cw_dsv41.c:
 * 3.3-3.6).
 *
 * A chunk of n tokens is evaluated layer by layer and, within a layer,
 * token by token.  Each token reads only its own values and what earlier
 * positions left in the state, in a fixed order, so any split of a
 * sequence into chunks (a one-shot prefill, any chunking, token-by-token
 * decode) gives bit-identical values.  The kvd bracket, the argument
 * checks, the token history and the prefix-cache publishing are the
 * same for every revision.
 */
#include "cw_dsv_state.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_steptime.h"
#include "st_config_dsv41.h"
#include "kv_client.h"

static void chunk_free(struct cw_dsv_chunk *ck)
{
	free(ck->X);
	free(ck->P);
	free(ck->sel);
	free(ck->nsel);
	free(ck->sc);
	free(ck->cand);
	free(ck->ncand);
}

/* The chunk's arrays, X with the token embeddings in every stream and P
 * one-hot on stream 0.  0 or -ENOMEM (ck freed by the caller). */
static int chunk_init(const struct cw_dsv_model *m, struct cw_dsv_chunk *ck)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult, n = ck->n;
	int n_isrc = 0;

	for (int l = 0; l < c->n_layers; l++)
		ck->isx[l] = c->index_source[l] ? n_isrc++ : -1;
	ck->X = malloc((size_t)n * hc * D * sizeof(float));
	ck->P = calloc((size_t)n * hc, sizeof(float));
	ck->sel = malloc(((size_t)n_isrc * n * c->index_topk + 1) *
			 sizeof(int));
	ck->nsel = calloc((size_t)n_isrc * n + 1, sizeof(int));
	ck->sc = malloc(((size_t)ck->p0 + n + 1) * sizeof(double));
	ck->cand = malloc(((size_t)n * c->candidate_topk_blocks + 1) *
			  sizeof(int));
	ck->ncand = calloc(n, sizeof(int));
	if (!ck->X || !ck->P || !ck->sel || !ck->nsel || !ck->sc ||
	    !ck->cand || !ck->ncand)
		return -ENOMEM;
	for (int t = 0; t < n; t++) {
		for (int k = 0; k < hc; k++)
			memcpy(ck->X + ((size_t)t * hc + k) * D,
			       m->embed + (size_t)ck->ids[t] * D,
			       D * sizeof(float));
		ck->P[(size_t)t * hc] = 1.0f;
	}
	return 0;
}

/* Debug: the RMS over the n stream values of one token after a layer. */
static float stream_rms(const float *X, int n)
{
	double ss = 0.0;

	for (int i = 0; i < n; i++)
		ss += (double)X[i] * X[i];
	return (float)sqrt(ss / n);
}

int cw_dsv_run(const struct cw_dsv_model *m, struct cw_dsv_state *s,
	       const int32_t *ids, int n, int64_t p0, int replay,
	       int all_positions, float *logits, struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size, hc = c->hc_mult;
	const int W = c->sliding_window;
	const int last_src = s->ced ? st_dsv41_last_kv_source(c) : -1;
	struct cw_dsv_chunk ck = { .n = n, .p0 = p0, .replay = replay,
				   .ids = ids };
	int r = 0;

	if (chunk_init(m, &ck) < 0) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	for (int l = 0; l < c->n_layers; l++) {
		int t0 = 0;

		/* V4.1's CED: past the last KV source a layer owns only
		 * window KV (model doc 3.4).  WINDOW: the last W tokens
		 * only; EXACT: the dependency cone of the last W rows of the
		 * last layer, W - 1 tokens more per layer before it. */
		if (s->ced && !replay && last_src >= 0 && l > last_src) {
			int64_t k = c->n_layers - 1 - l;
			int64_t need = s->ced == CW_DSV41_CED_WINDOW ?
					       W : W + k * (W - 1);

			t0 = n > need ? (int)(n - need) : 0;
		}
		if (t0 > 0) /* rows before t0 are not computed: unseen */
			s->ls[l].win_lo = p0 + t0;
		for (int t = t0; t < n; t++) {
			if ((r = s->rev->layer_token(m, s, l, t, &ck, diag)) < 0)
				goto out;
			if (s->dbg && s->dbg->stream_rms &&
			    t < s->dbg->max_tokens)
				s->dbg->stream_rms[(size_t)t * c->n_layers + l] =
					stream_rms(ck.X + (size_t)t * hc * D,
						   hc * D);
		}
	}
	for (int t = 0; s->xout && t < n && t < s->xout_rows; t++)
		memcpy(s->xout + (size_t)t * hc * D, ck.X + (size_t)t * hc * D,
		       (size_t)hc * D * sizeof(float));
	if (s->q.kv && s->q.row_missing)
		goto out; /* cw_dsv_kv_end fails the eval */
	cw_steptime_phase(s->tl, CW_PHASE_HEAD);
	if (logits)
		for (int t = all_positions ? 0 : n - 1; t < n; t++)
			s->rev->head(m, ck.X + (size_t)t * hc * D,
				     ck.P + (size_t)t * hc,
				     logits + (size_t)(all_positions ? t : 0) *
						      c->vocab_size);
out:
	cw_steptime_phase(s->tl, CW_PHASE_NONE);
	chunk_free(&ck);
	return r;
}

int cw_dsv_eval(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		const int32_t *ids, int n, int all_positions, float *logits,
		struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	float *mtp_x = NULL;
	int r;

	if (n < 1)
		return 0;
	if (s->len + n > s->cap)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "sequence of %d tokens exceeds the state's %d",
				   s->len + n, s->cap);
	if (s->ced && all_positions && logits)
		return st_diag_set(diag, -EINVAL,
				   "all-position logits with the CED prefill shortcut on (it computes the last position only)");
	for (int t = 0; t < n; t++)
		if (ids[t] < 0 || ids[t] >= c->vocab_size)
			return st_diag_set(diag, -EINVAL,
					   "token id %d out of range [0, %d)",
					   ids[t], c->vocab_size);
	if (s->len + n > s->tok_cap) { /* kvd state: the history grows */
		int nc = s->len + n > 2 * s->tok_cap ? s->len + n :
						       2 * s->tok_cap;
		int32_t *t = realloc(s->tokens, (size_t)nc * sizeof(int32_t));

		if (!t)
			return st_diag_set(diag, -ENOMEM, "out of memory");
		s->tokens = t;
		s->tok_cap = nc;
	}
	/* pinned while it computes, room for the n new tokens in every
	 * stream (pooled streams: their pages by token) */
	if (s->q.kv &&
	    (r = cw_dsv_kv_begin(&s->q, (uint32_t)(s->len + n), diag)) < 0)
		return r;
	memcpy(s->tokens + s->len, ids, (size_t)n * sizeof(int32_t));
	s->rev->before_eval(m, s, ids, n);
	{
		/* following, the MTP block (cw_dsv_mtp.c) takes every
		 * position's streams: the run writes them to mtp_x, and the
		 * caller's rows (cw_dsv_set_streams_out) are copied from it */
		float *user = s->xout;
		int user_rows = s->xout_rows;
		size_t nx = (size_t)c->hc_mult * c->hidden_size;

		if (s->mtp_follow &&
		    (mtp_x = malloc((size_t)n * nx * sizeof(float)))) {
			s->xout = mtp_x;
			s->xout_rows = n;
		}
		r = s->mtp_follow && !mtp_x ?
			    st_diag_set(diag, -ENOMEM, "out of memory") :
			    cw_dsv_run(m, s, ids, n, s->len, 0, all_positions,
				       logits, diag);
		s->xout = user;
		s->xout_rows = user_rows;
		for (int t = 0; r == 0 && mtp_x && user && t < n &&
				t < user_rows; t++)
			memcpy(user + (size_t)t * nx, mtp_x + (size_t)t * nx,
			       nx * sizeof(float));
	}
	if (s->q.kv) {
		int ok = r == 0 && !s->q.row_missing;

		/* kvd took rows [len, len + n) as reserved: a windowed
		 * stream's next reservation frees what lies before them, so
		 * a failure marks the state failed (cw_dsv_kv_end) */
		r = cw_dsv_kv_end(&s->q, r, s->len, n, diag);
		/* only the unpin failed: the rows are written and the logits
		 * stand, so the state moves on (a retry of the same run is
		 * then a replay for the caller, not a second evaluation) */
		if (ok && r < 0) {
			s->len += n;
			if (s->hi < s->len)
				s->hi = s->len;
			free(mtp_x);
			return r;
		}
	}
	if (r == 0) {
		s->len += n;
		if (s->hi < s->len)
			s->hi = s->len;
		/* the MTP block follows (its failure is a draft's, not the
		 * eval's: drafting stops for the state) */
		if (mtp_x)
			cw_dsv_mtp_after_eval(m, s, mtp_x, s->len - n, n);
		/* V4.1: replayed window rows live outside the pages (the
		 * pages hold other rows for them), and the CED shortcut
		 * leaves window rows uncomputed: neither state's pages are
		 * published */
		if (s->q.kv && s->pr.ids)
			cw_dsv_kv_after_eval(s->q.kv, s->q.seq, &s->pr,
					     s->tokens, s->len,
					     !(s->ov_hi > 0 || s->ced));
	}
	free(mtp_x);
	return r;
}

/* ---- V4.1's CED shortcut and SWA replay (model doc 3.4, 3.6) ---- */

int cw_dsv41_set_ced_shortcut(struct cw_dsv_state *s, int mode)
{
	if (mode < CW_DSV41_CED_OFF || mode > CW_DSV41_CED_WINDOW ||
	    (mode && s->rev != &cw_dsv41_rev))
		return -EINVAL;
	s->ced = mode;
	return 0;
}

void cw_dsv41_state_drop_window(struct cw_dsv_state *s)
{
	for (int l = 0; l < s->n_layers; l++)
		s->ls[l].win_lo = s->len;
}

int cw_dsv41_replay(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    const int32_t *ids, int n, struct st_diag *diag)
{
	if (s->rev != &cw_dsv41_rev)
		return st_diag_set(diag, -EINVAL,
				   "SWA replay: a V4.1 state only");
	if (n < 1 || n > s->len)
		return st_diag_set(diag, -EINVAL,
				   "replay of %d tokens: the state holds %d",
				   n, s->len);
	for (int t = 0; t < n; t++)
		if (ids[t] != s->tokens[s->len - n + t])
			return st_diag_set(diag, -EINVAL,
					   "replay token %d (id %d) is not the prefix's token at position %d (id %d)",
					   t, ids[t], s->len - n + t,
					   s->tokens[s->len - n + t]);
	if (s->q.kv) {
		/* the prefix's window rows may be in shared pages: the
		 * replayed ones go to per-state rings instead */
		const struct st_dsv_config *c = &m->cfg;
		int r;

		for (int l = 0; l < s->n_layers; l++)
			if (!s->ls[l].kv &&
			    !(s->ls[l].kv = malloc(((size_t)c->sliding_window +
						    CW_DSV_ROLLBACK_MAX) *
						   c->head_dim *
						   sizeof(float))))
				return st_diag_set(diag, -ENOMEM,
						   "out of memory");
		if (s->ov_hi != s->len || s->ov_lo > s->len - n)
			s->ov_lo = s->len - n;
		s->ov_hi = s->len;
		if ((r = cw_dsv_kv_begin(&s->q, 0, diag)) < 0)
			return r;
		for (int l = 0; l < s->n_layers; l++)
			if (s->ls[l].win_lo > s->len - n)
				s->ls[l].win_lo = s->len - n;
		r = cw_dsv_run(m, s, ids, n, s->len - n, 1, 0, NULL, diag);
		return cw_dsv_kv_end(&s->q, r, s->len - n, n, diag);
	}
	/* a replay rebuilds the rows from its first position on */
	for (int l = 0; l < s->n_layers; l++)
		if (s->ls[l].win_lo > s->len - n)
			s->ls[l].win_lo = s->len - n;
	return cw_dsv_run(m, s, ids, n, s->len - n, 1, 0, NULL, diag);
}
