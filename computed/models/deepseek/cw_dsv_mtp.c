/*
 * cw_dsv_mtp.c — DeepSeek-V4's multi-token prediction block (cw_dsv.h:
 * cw_dsv_mtp_eval).  Semantics: the official V4-Flash inference/model.py
 * MTPBlock (upstream 60d8d70, index file id 70831076062), as
 * scripts/dsv-oracle.py transcribes it:
 *
 *   X[k] = e_proj(enorm(embed(token))) + h_proj(hnorm(x[k]))  k < hc_mult
 *   X    = Block_{n_layers}(X)  (window-only attention, learned routing)
 *   logits = head(norm(hc_head(X)))  with the block's own hc_head_* and
 *                                    norm, the model's embed and head
 *
 * x are the main model's streams after its last layer (before hc_head)
 * at position p and token the token at p + 1, so the logits predict the
 * token at p + 2.  The block is the model's layers[n_layers]; its state is
 * a window ring of its own in the sequence state (ls[n_layers]),
 * process-local even when the decoder layers' rows live in kvd pages: a
 * draft's state, rebuilt from the main model's streams, never a result's.
 */
#include "cw_dsv_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_steptime.h"
#include "st_log.h"

int cw_dsv_has_mtp(const struct cw_dsv_model *m)
{
	return m->has_mtp;
}

int cw_dsv_mtp_state_init(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s)
{
	const struct st_dsv_config *c = &m->cfg;
	struct cw_dsv_lstate *ls = &s->ls[c->n_layers];
	int rows = c->sliding_window + CW_DSV_ROLLBACK_MAX;

	ls->local = 1;
	ls->elems[CW_DSV_WINDOW] = c->head_dim;
	ls->ring[CW_DSV_WINDOW] = rows;
	ls->buf[CW_DSV_WINDOW] =
		malloc((size_t)rows * c->head_dim * sizeof(float));
	return ls->buf[CW_DSV_WINDOW] ? 0 : -ENOMEM;
}

/* The block's input streams X [hc][D] from the main model's x and the
 * token's embedding. */
static void mtp_input(const struct cw_dsv_model *m, const float *x,
		      int32_t token, float *X)
{
	const struct st_dsv_config *c = &m->cfg;
	const int D = c->hidden_size;
	float e[D], ev[D], h[D];

	cw_dsv_rmsnorm(m->embed + (size_t)token * D, m->mtp.enorm, D,
		       c->rms_norm_eps, e);
	cw_dsv_lin(m, &m->mtp.e_proj, e, ev);
	for (int k = 0; k < c->hc_mult; k++) {
		float *Xk = X + (size_t)k * D;

		cw_dsv_rmsnorm(x + (size_t)k * D, m->mtp.hnorm, D,
			       c->rms_norm_eps, h);
		cw_dsv_lin(m, &m->mtp.h_proj, h, Xk);
		for (int i = 0; i < D; i++)
			Xk[i] += ev[i];
	}
}

/* The block at p (cw_dsv_mtp_eval's contract); gap: a p past the
 * positions it evaluated restarts its window there (rows before p
 * absent: a prefix-cache hit mapped positions it never saw). */
static int mtp_step(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    int64_t p, const float *x, int32_t token, float *logits,
		    float *x_out, int gap, struct st_diag *diag);

int cw_dsv_mtp_eval(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    int64_t p, const float *x, int32_t token, float *logits,
		    float *x_out, struct st_diag *diag)
{
	return mtp_step(m, s, p, x, token, logits, x_out, 0, diag);
}

static int mtp_step(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    int64_t p, const float *x, int32_t token, float *logits,
		    float *x_out, int gap, struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const size_t nx = (size_t)c->hc_mult * c->hidden_size;
	struct cw_dsv_chunk ck = { .n = 1, .p0 = p, .ids = &token };
	struct cw_dsv_debug *dbg = s->dbg;
	int r;

	if (!m->has_mtp)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "the model has no MTP block (a DeepSeek-V4 checkpoint with mtp.0.* tensors has one)");
	if (gap && p > s->mtp_len) {
		s->ls[c->n_layers].win_lo = p;
		s->mtp_len = s->mtp_hi = p;
	}
	if (p < 0 || p > s->mtp_len)
		return st_diag_set(diag, -EINVAL,
				   "MTP position %lld: the block has evaluated positions [0, %lld) only (each position needs every earlier one)",
				   (long long)p, (long long)s->mtp_len);
	if (p + CW_DSV_ROLLBACK_MAX < s->mtp_hi)
		return st_diag_set(diag, -EINVAL,
				   "MTP position %lld: a roll-back of more than %d positions from %lld (its window ring keeps %d rows of slack)",
				   (long long)p, CW_DSV_ROLLBACK_MAX,
				   (long long)s->mtp_hi, CW_DSV_ROLLBACK_MAX);
	if (token < 0 || token >= c->vocab_size)
		return st_diag_set(diag, -EINVAL,
				   "token id %d out of range [0, %d)", token,
				   c->vocab_size);
	ck.X = malloc(nx * sizeof(float));
	if (!ck.X)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	mtp_input(m, x, token, ck.X);
	if (!logits && !x_out) {
		/* nothing of p's output is wanted: its window row alone (it
		 * depends on p's input only), no attention, no experts */
		r = cw_dsv4_window_row(m, s, c->n_layers, p, ck.X);
		free(ck.X);
		if (r < 0)
			return st_diag_set(diag, r, "MTP window row %lld",
					   (long long)p);
		s->mtp_len = p + 1;
		if (s->mtp_hi < p + 1)
			s->mtp_hi = p + 1;
		return 0;
	}
	/* the debug record is indexed by decoder layer: not this block */
	s->dbg = NULL;
	r = s->rev->layer_token(m, s, c->n_layers, 0, &ck, diag);
	s->dbg = dbg;
	cw_steptime_phase(s->tl, CW_PHASE_NONE);
	if (r == 0) {
		s->mtp_evals++;
		s->mtp_heads += logits != NULL;
		s->mtp_len = p + 1;
		if (s->mtp_hi < p + 1)
			s->mtp_hi = p + 1;
		if (logits)
			cw_dsv4_head_with(m, m->mtp.hc_head_fn,
					  m->mtp.hc_head_base,
					  m->mtp.hc_head_scale, m->mtp.norm,
					  ck.X, logits);
		if (x_out)
			memcpy(x_out, ck.X, nx * sizeof(float));
	}
	free(ck.X);
	return r;
}

int cw_dsv_mtp_follow(const struct cw_dsv_model *m, struct cw_dsv_state *s)
{
	const size_t nx = (size_t)m->cfg.hc_mult * m->cfg.hidden_size;

	if (!m->has_mtp)
		return -ST_E_UNSUPPORTED;
	if (!s->keep) {
		s->keep = malloc((CW_DSV_ROLLBACK_MAX + 1) * nx * sizeof(float));
		if (!s->keep)
			return -ENOMEM;
	}
	s->mtp_follow = 1;
	return 0;
}

void cw_dsv_mtp_after_eval(const struct cw_dsv_model *m,
			   struct cw_dsv_state *s, const float *x, int p0,
			   int n)
{
	const size_t nx = (size_t)m->cfg.hc_mult * m->cfg.hidden_size;
	const int end = p0 + n;
	int from = end - (CW_DSV_ROLLBACK_MAX + 1) > p0 ?
			   end - (CW_DSV_ROLLBACK_MAX + 1) : p0;
	struct st_diag d = { { 0 } };

	/* positions before p0 it never saw (a prefix hit): it starts at p0 */
	if (s->mtp_true < p0)
		s->mtp_true = p0;
	for (int64_t q = s->mtp_true; q + 1 < end; q++) {
		if (mtp_step(m, s, q, x + (size_t)(q - p0) * nx,
			     s->tokens[q + 1], NULL, NULL, 1, &d) < 0) {
			st_warn("MTP block: %s (drafts stop for this sequence; results are unaffected)",
				d.msg);
			s->mtp_follow = 0;
			return;
		}
		s->mtp_true = q + 1;
	}
	memcpy(s->keep, x + (size_t)(from - p0) * nx,
	       (size_t)(end - from) * nx * sizeof(float));
	s->keep_from = from;
	s->keep_n = end - from;
}

int cw_dsv_mtp_draft(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		     int32_t next, int k, int32_t *out, struct st_diag *diag)
{
	const struct st_dsv_config *c = &m->cfg;
	const size_t nx = (size_t)c->hc_mult * c->hidden_size;
	const int64_t p = (int64_t)s->len - 1;
	float *lg = NULL, *xa = NULL, *xb = NULL;
	int r = 0, i = 0;

	if (!s->mtp_follow)
		return st_diag_set(diag, -EINVAL,
				   "MTP drafts: the block does not follow this sequence (cw_dsv_mtp_follow before its first eval)");
	if (k < 1 || k > CW_DSV_ROLLBACK_MAX || p < 0 ||
	    p < s->keep_from || p >= s->keep_from + s->keep_n)
		return st_diag_set(diag, -EINVAL,
				   "MTP drafts: %d tokens after position %lld (streams kept for [%lld, %lld))",
				   k, (long long)p, (long long)s->keep_from,
				   (long long)(s->keep_from + s->keep_n));
	if (next < 0 || next >= c->vocab_size)
		return st_diag_set(diag, -EINVAL,
				   "token id %d out of range [0, %d)", next,
				   c->vocab_size);
	lg = malloc((size_t)c->vocab_size * sizeof(float));
	xa = malloc(nx * sizeof(float));
	xb = malloc(nx * sizeof(float));
	if (!lg || !xa || !xb) {
		r = st_diag_set(diag, -ENOMEM, "out of memory");
		goto out;
	}
	memcpy(xa, s->keep + (size_t)(p - s->keep_from) * nx,
	       nx * sizeof(float));
	for (i = 0; i < k; i++) {
		int32_t tok = i ? out[i - 1] : next;
		int best = 0;

		r = mtp_step(m, s, p + i, xa, tok, lg, xb, 1, diag);
		if (r < 0)
			break;
		for (int v = 1; v < c->vocab_size; v++)
			if (lg[v] > lg[best])
				best = v;
		out[i] = best;
		memcpy(xa, xb, nx * sizeof(float));
	}
	if (i > 0 && s->mtp_true < p + 1)
		s->mtp_true = p + 1; /* p saw its true next token */
out:
	free(lg);
	free(xa);
	free(xb);
	return r < 0 ? r : i;
}

void cw_dsv_mtp_take_counts(struct cw_dsv_state *s, uint64_t *ret_evals,
			    uint64_t *ret_heads)
{
	*ret_evals = s->mtp_evals;
	*ret_heads = s->mtp_heads;
	s->mtp_evals = s->mtp_heads = 0;
}
