/*
 * cw_dsv_state.c — the DeepSeek-V4 family's sequence state, every
 * revision (cw_dsv_state.h): making, freeing and the accessors; the
 * revision's per-layer streams are allocated by its state_init.
 */
#include "cw_dsv_state.h"

#include <errno.h>
#include <stdlib.h>

#include "kv_client.h"

int cw_dsv_state_init(const struct cw_dsv_model *m, int max_tokens,
		      struct kv_client *kv, struct cw_dsv_state **ret)
{
	const struct st_dsv_config *c = &m->cfg;
	struct cw_dsv_state *s;

	if (max_tokens < 1)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->rev = c->revision == ST_DSV_REV_V41 ? &cw_dsv41_rev : &cw_dsv4_rev;
	s->cap = max_tokens;
	s->n_layers = c->n_layers;
	s->n_ls = c->n_layers + (m->has_mtp ? 1 : 0);
	s->q.kv = kv;
	s->qat = m->qat;
	/* a kvd state's history grows with it (cw_dsv_eval) */
	s->tok_cap = kv ? 256 : max_tokens;
	s->tokens = malloc((size_t)s->tok_cap * sizeof(int32_t));
	s->ls = calloc(s->n_ls, sizeof(*s->ls));
	if (!s->tokens || !s->ls || cw_dsv_run_init(m, &s->run) < 0)
		goto nomem;
	for (int l = 0; l < s->n_ls; l++)
		for (int k = 0; k < CW_DSV_MAX_STREAMS; k++)
			s->ls[l].kvs[k] = -1;
	if (s->rev->state_init(m, s, max_tokens) < 0 ||
	    (m->has_mtp && cw_dsv_mtp_state_init(m, s) < 0))
		goto nomem;
	*ret = s;
	return 0;
nomem:
	s->q.kv = NULL; /* no sequence yet */
	cw_dsv_state_free(s);
	return -ENOMEM;
}

int cw_dsv_state_new(const struct cw_dsv_model *m, int max_tokens,
		     struct cw_dsv_state **ret)
{
	return cw_dsv_state_init(m, max_tokens, NULL, ret);
}

void cw_dsv_state_free(struct cw_dsv_state *s)
{
	if (!s)
		return;
	if (s->q.kv && s->q.seq)
		kv_client_seq_free(s->q.kv, s->q.seq);
	cw_dsv_run_fini(&s->run);
	for (int l = 0; s->ls && l < s->n_ls; l++) {
		struct cw_dsv_lstate *ls = &s->ls[l];

		for (int k = 0; k < CW_DSV_MAX_STREAMS; k++)
			free(ls->buf[k]);
		free(ls->kv);
		free(ls->grp);
		free(ls->crow);
		free(ls->ikey);
	}
	free(s->ls);
	free(s->tokens);
	free(s->dec);
	free(s->zero_row);
	free(s->pr.ids);
	free(s->keep);
	free(s);
}

int cw_dsv_state_truncate(struct cw_dsv_state *s, int len,
			  struct st_diag *diag)
{
	int r;

	if (s->ced || s->ov_hi > 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "cutting a sequence back: not with V4.1's CED shortcut or SWA replay");
	if (len < 0 || len > s->len)
		return st_diag_set(diag, -EINVAL,
				   "cut to %d positions: the state holds %d",
				   len, s->len);
	if (!s->q.kv && len + CW_DSV_ROLLBACK_MAX < s->hi)
		return st_diag_set(diag, -EINVAL,
				   "cut to %d positions: more than %d behind the highest evaluated (%d)",
				   len, CW_DSV_ROLLBACK_MAX, s->hi);
	if (s->q.kv) {
		/* rows by position in kvd: kvd checks that the new window's
		 * pages are still there and that no cut row was published */
		if (s->q.failed)
			return st_diag_set(diag, -ST_E_STALE,
					   "cutting a sequence back: an earlier eval of it failed part way");
		r = kv_client_seq_truncate(s->q.kv, s->q.seq, (uint32_t)len,
					   diag);
		if (r < 0)
			return r;
		if (s->pr.n > len)
			s->pr.n = len;
	}
	s->len = len;
	/* the block's rows past len - 2 used a cut token */
	if (s->mtp_true > len - 1)
		s->mtp_true = len > 0 ? len - 1 : 0;
	return 0;
}

int cw_dsv_state_len(const struct cw_dsv_state *s)
{
	return s->len;
}

void cw_dsv_state_stats(const struct cw_dsv_state *s,
			struct cw_dsv_run_stats *ret)
{
	*ret = s->run.st;
}

void cw_dsv_set_debug(struct cw_dsv_state *s, struct cw_dsv_debug *dbg)
{
	s->dbg = dbg;
}

int cw_dsv_state_set_publish_lag(struct cw_dsv_state *s, int lag)
{
	if (lag < 0 || lag > CW_DSV_ROLLBACK_MAX)
		return -EINVAL;
	s->pr.lag = lag;
	return 0;
}

void cw_dsv_set_streams_out(struct cw_dsv_state *s, float *buf, int rows)
{
	s->xout = rows > 0 ? buf : NULL;
	s->xout_rows = rows > 0 ? rows : 0;
}

void cw_dsv_set_steptime(struct cw_dsv_state *s, struct cw_steptime *tl)
{
	s->tl = tl;
}
