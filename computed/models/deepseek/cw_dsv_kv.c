/*
 * cw_dsv_kv.c — the DeepSeek-V4 family's sequence state in kvd pages
 * (cw_dsv.h "sequence states in kvd"; design:
 * docs/DESIGN.md 3a and 9; V4.1's formats: st_kvfmt_v41.h, model doc
 * 3.7-3.8): the declaration of every revision's streams
 * (cw_dsv_streams.c), the prefix-cache model id, the kvd sequence with
 * its prefix mode, the pin/reserve/unpin bracket every revision's eval
 * runs in (cw_dsv_kv_begin / _end), and the state in kvd (cw_dsv_state_new_kv).
 *
 * The forward passes read and write every row through one accessor, so
 * each is the same code for the process-local and the kvd state; V4.1
 * with QAT on keeps the encoded bytes in a page row and decode(encode(x))
 * is the forward's own QAT round trip, so the logits are bit-identical to
 * the process-local state's.
 */
#include "cw_dsv_int.h"
#include "cw_dsv_state.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_client.h"
#include "kv_pool.h"
#include "kv_proto.h"
#include "st_log.h"
#include "st_util.h"

/* The revision's words of the model id: what the rows are and each
 * layer's ratio (V4.1: and its KV-source role) into buf[cap]; the bytes
 * written. */
static size_t id_words(const struct cw_dsv_model *m, char *buf, size_t cap)
{
	const struct st_dsv_config *c = &m->cfg;
	const int v41 = c->revision == ST_DSV_REV_V41;
	size_t o;

	if (v41)
		o = (size_t)snprintf(buf, cap,
				     "dsv41 kvfmt compute=%d qat=%u D=%d L=%d V=%d H=%d hd=%d "
				     "W=%d E=%d k=%d ratios",
				     (int)m->compute, m->qat, c->hidden_size,
				     c->n_layers, c->vocab_size, c->n_heads,
				     c->head_dim, c->sliding_window,
				     c->n_experts, c->top_k);
	else
		o = (size_t)snprintf(buf, cap,
				     "dsv4 f32 %s qat=%u D=%d L=%d V=%d H=%d hd=%d "
				     "W=%d E=%d k=%d ratios",
				     m->be ? "fast" : "ref", m->qat,
				     c->hidden_size, c->n_layers,
				     c->vocab_size, c->n_heads, c->head_dim,
				     c->sliding_window, c->n_experts,
				     c->top_k);
	for (int l = 0; l < c->n_layers && o < 1000; l++)
		o += (size_t)(v41 ? snprintf(buf + o, cap - o, " %d/%d",
					     c->compress_ratio[l],
					     c->kv_source[l]) :
				    snprintf(buf + o, cap - o, " %d",
					     c->compress_ratio[l]));
	return o;
}

uint64_t cw_dsv_model_id(const struct cw_dsv_model *m)
{
	const int D = m->cfg.hidden_size;
	const int rows = m->cfg.vocab_size < 64 ? m->cfg.vocab_size : 64;
	size_t n = (size_t)(2 * rows + 1) * D * sizeof(float) + 1024;
	uint8_t *buf = malloc(n);
	size_t o;
	uint64_t h;

	if (!buf)
		return 1; /* never reached in practice; still non-zero */
	o = id_words(m, (char *)buf, 1024);
	memcpy(buf + o, m->embed, (size_t)rows * D * sizeof(float));
	o += (size_t)rows * D * sizeof(float);
	if (m->head.w) {
		memcpy(buf + o, m->head.w, (size_t)rows * D * sizeof(float));
		o += (size_t)rows * D * sizeof(float);
	} else if (m->head.codes) {
		/* fast mode: the LM head kept as BF16 codes (other logits,
		 * so another id than reference mode's) */
		memcpy(buf + o, m->head.codes, (size_t)rows * D * 2);
		o += (size_t)rows * D * 2;
	}
	memcpy(buf + o, m->norm, (size_t)D * sizeof(float));
	o += (size_t)D * sizeof(float);
	h = st_xxh3(buf, o);
	free(buf);
	return h ? h : 1;
}

int cw_dsv_kv_declare(const struct cw_dsv_model *m, struct kv_client *kv,
		      uint32_t page_rows, uint64_t model_id,
		      struct st_diag *diag)
{
	struct kv_stream_decl *d = calloc(KV_MAX_STREAMS, sizeof(*d));
	int n, r;

	if (!d)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	n = cw_dsv_kv_decl(&m->cfg, m->qat, (int)sizeof(float), d,
			   KV_MAX_STREAMS);
	if (n < 0) {
		free(d);
		return st_diag_set(diag, n, n == -ST_E_LIMIT ?
				   "the model declares more than %d KV streams (kvd's limit)" :
				   "a KV source layer has compress ratio 0 (config error; %d)",
				   KV_MAX_STREAMS);
	}
	r = kv_client_declare_model(kv, n, d, page_rows,
				    model_id ? model_id : cw_dsv_model_id(m),
				    diag);
	free(d);
	return r;
}

int cw_dsv_kv_seq_create(struct kv_client *kv, const int32_t *prompt,
			 int n_prompt, uint32_t *ret_seq, uint32_t *ret_cached,
			 struct cw_dsv_prompt *p, struct st_diag *diag)
{
	int r;

	*ret_cached = 0;
	if (n_prompt > 0)
		r = kv_client_seq_create_prefix(kv, prompt, (uint32_t)n_prompt,
						ret_seq, ret_cached, diag);
	else
		r = kv_client_seq_create(kv, ret_seq, diag);
	if (r < 0 || n_prompt <= 0)
		return r;
	/* ids past KV_PROTO_MAX_IDS are not sent: not published */
	p->n_prompt = n_prompt < (int)KV_PROTO_MAX_IDS ? n_prompt :
							 (int)KV_PROTO_MAX_IDS;
	p->ids = malloc(sizeof(int32_t) * (size_t)p->n_prompt);
	if (!p->ids)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	memcpy(p->ids, prompt, sizeof(int32_t) * (size_t)p->n_prompt);
	/* the mapped prefix: the prompt's ids, published already */
	p->n = (int)*ret_cached;
	p->groups_published = (int)(*ret_cached / kv_client_page_rows(kv));
	return 0;
}

int cw_dsv_kv_begin(struct cw_dsv_kvseq *q, uint32_t rows,
		    struct st_diag *diag)
{
	int r;

	if (q->failed)
		return st_diag_set(diag, -ST_E_STALE,
				   "kvd sequence 0x%x: an earlier eval failed part way (rows written, window pages possibly freed); free the state and start again",
				   q->seq);
	r = kv_client_seq_pin(q->kv, 1, &q->seq, NULL, diag);
	if (r < 0)
		return r;
	if (rows) {
		r = kv_client_seq_reserve(q->kv, 1, &q->seq, &rows, diag);
		if (r < 0) {
			struct st_diag d2 = { { 0 } };

			kv_client_seq_unpin(q->kv, 1, &q->seq, &d2);
			return r;
		}
	}
	q->row_missing = 0;
	return 0;
}

int cw_dsv_kv_end(struct cw_dsv_kvseq *q, int r, int from, int n,
		  struct st_diag *diag)
{
	struct st_diag d2 = { { 0 } };
	int r2;

	if (r == 0 && q->row_missing)
		r = st_diag_set(diag, -ST_E_STALE,
				"kvd sequence 0x%x: a row of positions %d..%d was not mapped writable/resident in its pages (kvd state inconsistent; free the sequence and start it again)",
				q->seq, from, from + n - 1);
	if (r < 0)
		q->failed = 1;
	r2 = kv_client_seq_unpin(q->kv, 1, &q->seq, &d2);
	if (r2 < 0 && r == 0)
		r = st_diag_set(diag, r2, "%s", d2.msg);
	return r;
}

void cw_dsv_kv_after_eval(struct kv_client *kv, uint32_t seq,
			  struct cw_dsv_prompt *p, const int32_t *tokens,
			  int len, int publishable)
{
	const int B = (int)kv_client_page_rows(kv);
	const int max = (int)KV_PROTO_MAX_IDS;
	/* past the prompt, the last `lag` positions may be drafts a
	 * verification cuts back: not published yet (kvd refuses to cut a
	 * published row) */
	const int lim = len - p->lag > p->n_prompt ? len - p->lag :
			len < p->n_prompt ? len : p->n_prompt;
	struct st_diag d = { { 0 } };

	/* only rows computed from the prompt's own ids are published under
	 * its keys (a different token ends the publishable prefix there);
	 * past the prompt, every token the state was fed and kept */
	while (!p->ended && p->n < lim && p->n < max) {
		if (p->n < p->n_prompt && tokens[p->n] != p->ids[p->n]) {
			p->ended = 1;
			break;
		}
		p->n++;
	}
	if (B < 1 || p->n / B <= p->groups_published || !publishable)
		return;
	if (kv_client_seq_publish_flags(kv, seq, tokens, (uint32_t)p->n,
					p->flags, &d) < 0) {
		/* the logits stand; only the cache misses these pages */
		st_warn("prefix cache: publishing %d tokens of kvd sequence "
			"0x%x failed: %s (no more publishing for it)", p->n,
			seq, d.msg);
		p->ended = 1;
		p->groups_published = INT_MAX;
		return;
	}
	p->groups_published = p->n / B;
}

int cw_dsv_kv_publish(struct kv_client *kv, uint32_t seq, int len,
		      const int32_t *ids, int n, const char *why_not,
		      struct st_diag *diag)
{
	if (!kv)
		return st_diag_set(diag, -EINVAL, "publish: the state is "
				   "process-local, not in kvd");
	if (n < 1 || n > len)
		return st_diag_set(diag, -EINVAL, "publish: %d tokens, the "
				   "state holds %d", n, len);
	if (why_not)
		return st_diag_set(diag, -EINVAL, "publish: %s", why_not);
	return kv_client_seq_publish(kv, seq, ids, (uint32_t)n, diag);
}

/* ---- the state in kvd, every revision ---- */

/* kv holds m's declaration with m's current QAT flags (the rows are
 * written in those formats; a mismatch would overrun page rows). */
static int check_decl(const struct cw_dsv_model *m, struct kv_client *kv,
		      struct st_diag *diag)
{
	struct kv_stream_decl *d = calloc(KV_MAX_STREAMS, sizeof(*d));
	int n, bad = -1;

	if (!d)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	n = cw_dsv_kv_decl(&m->cfg, m->qat, (int)sizeof(float), d,
			   KV_MAX_STREAMS);
	for (int i = 0; i < n && bad < 0; i++)
		if (kv_client_row_bytes(kv, i) != d[i].row_bytes)
			bad = i;
	if (n > 0 && kv_client_row_bytes(kv, n) != 0)
		bad = n;
	free(d);
	if (n < 0 || bad >= 0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "kvd's declaration is not this model's with QAT flags 0x%x (stream %d differs): declare with cw_dsv_kv_declare after setting the QAT flags, and do not change them while states exist",
				   m->qat, bad);
	return 0;
}

int cw_dsv_state_new_kv(const struct cw_dsv_model *m, struct kv_client *kv,
			const int32_t *prompt, int n_prompt, int swa_replay,
			struct cw_dsv_state **ret, struct st_diag *diag)
{
	const int v41 = m->cfg.revision == ST_DSV_REV_V41;
	struct cw_dsv_state *s = NULL;
	uint32_t cached = 0;
	int r;

	if (!kv)
		return st_diag_set(diag, -EINVAL, "no kvd client");
	if (n_prompt < 0 || (n_prompt > 0 && !prompt) || swa_replay < 0 ||
	    (swa_replay > 0 && !v41))
		return st_diag_set(diag, -EINVAL,
				   "bad prompt (%d ids) or SWA replay (%d; V4.1 only)",
				   n_prompt, swa_replay);
	if (v41) {
		/* the Engram history is the prompt's ids */
		for (int i = 0; i < n_prompt; i++)
			if (prompt[i] < 0 || prompt[i] >= m->cfg.vocab_size)
				return st_diag_set(diag, -EINVAL,
						   "prompt token %d: id %d out of range [0, %d)",
						   i, prompt[i],
						   m->cfg.vocab_size);
	}
	r = cw_dsv_state_init(m, INT_MAX, kv, &s);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory");
	r = cw_dsv_kv_seq_create(kv, prompt, n_prompt, &s->q.seq, &cached,
				 &s->pr, diag);
	/* V4.1: the rows are written in the declared QAT formats.  Checked
	 * after the create: a kvd restarted with a new pool is attached
	 * again (the client re-declares) by the first request, not before */
	if (r == 0 && v41)
		r = check_decl(m, kv, diag);
	if (r == 0 && (int)cached > s->tok_cap) {
		int32_t *t = realloc(s->tokens, sizeof(int32_t) * cached);

		if (t) {
			s->tokens = t;
			s->tok_cap = (int)cached;
		} else {
			r = st_diag_set(diag, -ENOMEM, "out of memory");
		}
	}
	if (r < 0) {
		cw_dsv_state_free(s);
		return r;
	}
	/* the token history of the mapped prefix: its ids */
	if (cached)
		memcpy(s->tokens, prompt, sizeof(int32_t) * cached);
	s->len = (int)cached;
	if (s->len > 0 && swa_replay > 0) {
		/* the model's way (model doc 3.6): forget the window the
		 * prefix entry carries and rebuild it from the last
		 * swa_replay tokens (approximate unless it covers the
		 * whole prefix) */
		int n = swa_replay < s->len ? swa_replay : s->len;

		cw_dsv41_state_drop_window(s);
		r = cw_dsv41_replay(m, s, s->tokens + s->len - n, n, diag);
		if (r < 0) {
			cw_dsv_state_free(s);
			return r;
		}
	}
	*ret = s;
	return 0;
}

int cw_dsv_state_publish(struct cw_dsv_state *s, const int32_t *ids, int n,
			 struct st_diag *diag)
{
	return cw_dsv_kv_publish(s->q.kv, s->q.seq, s->len, ids, n,
				 s->ov_hi > 0 || s->ced ?
				 "the state's window was rebuilt by SWA replay "
				 "or skipped by the CED shortcut (rows not in "
				 "its pages); only states of the full "
				 "computation publish" : NULL,
				 diag);
}

int cw_dsv_state_set_publish_flags(struct cw_dsv_state *s, uint32_t flags)
{
	if (flags & ~(uint32_t)KV_PUBLISH_F_ALL)
		return -EINVAL;
	s->pr.flags = flags;
	return 0;
}

uint32_t cw_dsv_state_seq(const struct cw_dsv_state *s)
{
	return s->q.kv ? s->q.seq : 0;
}
