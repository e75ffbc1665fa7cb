/*
 * cw_dsv41_kv.c — DeepSeek-V4.1 sequence state in kvd pages, in the V4.1
 * storage formats (cw_dsv41.h "KV streams in kvd"; design: docs/DESIGN.md
 * 3a "DeepSeek-V4.1 in kvd"; formats: st_kvfmt_v41.h, model doc 3.7-3.8).
 *
 * cw_dsv41.c reads and writes every row through one accessor, so the
 * forward pass is the same code for both states; with QAT on, a page row
 * holds the encoded bytes and decode(encode(x)) is the forward's own QAT
 * round trip, so the logits are bit-identical to the process-local state.
 */
#include "cw_dsv41_int.h"
#include "cw_dsv41_st.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_client.h"
#include "kv_pool.h"
#include "kv_proto.h"
#include "st_kvfmt_v41.h"
#include "st_log.h"
#include "st_util.h"

int cw_dsv41_kv_decl(const struct st_dsv41_config *c, unsigned qat,
		     struct kv_stream_decl *out, int max)
{
	const size_t hd = (size_t)c->head_dim, Id = (size_t)c->index_head_dim;
	int n = 0;

	for (int l = 0; l < c->n_layers; l++) {
		int mr = c->compress_ratio[l];
		struct kv_stream_decl d[4];
		int k = 0;

		/* window: every layer, the last W rows */
		d[k++] = (struct kv_stream_decl){
			.row_bytes = (uint32_t)(qat & CW_DSV41_QAT_WINDOW_FP8 ?
				     st_kv41_fp8_row_bytes(hd) : hd * 4),
			.tokens_per_row = 1,
			.window_rows = (uint32_t)c->sliding_window,
		};
		if (c->kv_source[l]) {
			if (mr < 1)
				return -EINVAL;
			/* the open group's raw c, z inputs (F32) */
			if (mr > 1)
				d[k++] = (struct kv_stream_decl){
					.row_bytes = (uint32_t)(2 * hd * 4),
					.tokens_per_row = 1,
					.window_rows = (uint32_t)mr,
				};
			d[k++] = (struct kv_stream_decl){
				.row_bytes = (uint32_t)(qat & CW_DSV41_QAT_CROW_FP4 ?
					     st_kv41_crow_row_bytes(hd) : hd * 4),
				.tokens_per_row = (uint32_t)mr,
			};
			d[k++] = (struct kv_stream_decl){
				.row_bytes = (uint32_t)(qat & CW_DSV41_QAT_INDEX_FP4 ?
					     st_kv41_idx_row_bytes(Id) : Id * 4),
				.tokens_per_row = (uint32_t)mr,
			};
		}
		for (int i = 0; i < k; i++) {
			if (n >= max)
				return -ST_E_LIMIT;
			out[n++] = d[i];
		}
	}
	return n;
}

uint64_t cw_dsv41_model_id(const struct cw_dsv41_model *m)
{
	const struct st_dsv41_config *c = &m->cfg;
	const int D = c->hidden_size;
	const int rows = c->vocab_size < 64 ? c->vocab_size : 64;
	size_t n = (size_t)(2 * rows + 1) * D * sizeof(float) + 1024;
	uint8_t *buf = malloc(n);
	size_t o = 0;
	uint64_t h;

	if (!buf)
		return 1;
	o += (size_t)snprintf((char *)buf, 1024,
			      "dsv41 kvfmt compute=%d qat=%u D=%d L=%d V=%d H=%d hd=%d "
			      "W=%d E=%d k=%d ratios", (int)m->compute, m->qat, D, c->n_layers,
			      c->vocab_size, c->n_heads, c->head_dim,
			      c->sliding_window, c->n_experts, c->top_k);
	for (int l = 0; l < c->n_layers && o < 1000; l++)
		o += (size_t)snprintf((char *)buf + o, 1024 - o, " %d/%d",
				      c->compress_ratio[l], c->kv_source[l]);
	memcpy(buf + o, m->embed, (size_t)rows * D * sizeof(float));
	o += (size_t)rows * D * sizeof(float);
	if (m->head.w) {
		memcpy(buf + o, m->head.w, (size_t)rows * D * sizeof(float));
		o += (size_t)rows * D * sizeof(float);
	} else if (m->head.codes) {
		/* fast mode: the LM head kept as BF16 (other logits, so
		 * another id than reference mode's) */
		memcpy(buf + o, m->head.codes, (size_t)rows * D * 2);
		o += (size_t)rows * D * 2;
	}
	memcpy(buf + o, m->norm, (size_t)D * sizeof(float));
	o += (size_t)D * sizeof(float);
	h = st_xxh3(buf, o);
	free(buf);
	return h ? h : 1;
}

int cw_dsv41_kv_declare(const struct cw_dsv41_model *m, struct kv_client *kv,
			uint32_t page_rows, uint64_t model_id,
			struct st_diag *diag)
{
	struct kv_stream_decl *d = calloc(KV_MAX_STREAMS, sizeof(*d));
	int n, r;

	if (!d)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	n = cw_dsv41_kv_decl(&m->cfg, m->qat, d, KV_MAX_STREAMS);
	if (n < 0) {
		free(d);
		return st_diag_set(diag, n, n == -ST_E_LIMIT ?
				   "the model declares more than %d KV streams (kvd's limit)" :
				   "a KV source layer has compress ratio 0 (config error; %d)",
				   KV_MAX_STREAMS);
	}
	r = kv_client_declare_model(kv, n, d, page_rows,
				    model_id ? model_id : cw_dsv41_model_id(m),
				    diag);
	free(d);
	return r;
}

/* kv holds m's declaration with m's current QAT flags (the rows are
 * written in those formats; a mismatch would overrun page rows). */
static int check_decl(const struct cw_dsv41_model *m, struct kv_client *kv,
		      struct st_diag *diag)
{
	struct kv_stream_decl *d = calloc(KV_MAX_STREAMS, sizeof(*d));
	int n, bad = -1;

	if (!d)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	n = cw_dsv41_kv_decl(&m->cfg, m->qat, d, KV_MAX_STREAMS);
	for (int i = 0; i < n && bad < 0; i++)
		if (kv_client_row_bytes(kv, i) != d[i].row_bytes)
			bad = i;
	if (n > 0 && kv_client_row_bytes(kv, n) != 0)
		bad = n;
	free(d);
	if (n < 0 || bad >= 0)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "kvd's declaration is not this model's with QAT flags 0x%x (stream %d differs): declare with cw_dsv41_kv_declare after setting the QAT flags, and do not change them while states exist",
				   m->qat, bad);
	return 0;
}

int cw_dsv41_state_new_kv(const struct cw_dsv41_model *m, struct kv_client *kv,
			  const int32_t *prompt, int n_prompt, int swa_replay,
			  struct cw_dsv41_state **ret, struct st_diag *diag)
{
	struct cw_dsv41_state *s = NULL;
	uint32_t seq = 0, cached = 0;
	int r;

	if (!kv)
		return st_diag_set(diag, -EINVAL, "no kvd client");
	if (n_prompt < 0 || (n_prompt > 0 && !prompt) || swa_replay < 0)
		return st_diag_set(diag, -EINVAL,
				   "bad prompt (%d ids) or SWA replay (%d)",
				   n_prompt, swa_replay);
	for (int i = 0; i < n_prompt; i++)
		if (prompt[i] < 0 || prompt[i] >= m->cfg.vocab_size)
			return st_diag_set(diag, -EINVAL,
					   "prompt token %d: id %d out of range [0, %d)",
					   i, prompt[i], m->cfg.vocab_size);
	r = check_decl(m, kv, diag);
	if (r < 0)
		return r;
	r = cw_dsv41_state_init(m, INT_MAX, kv, &s);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory");
	if (n_prompt > 0)
		r = kv_client_seq_create_prefix(kv, prompt, (uint32_t)n_prompt,
						&seq, &cached, diag);
	else
		r = kv_client_seq_create(kv, &seq, diag);
	if (r < 0) {
		cw_dsv41_state_free(s);
		return r;
	}
	s->seq = seq;
	if (n_prompt > 0) {
		/* ids past KV_PROTO_MAX_IDS are not sent: not published */
		s->n_prompt = n_prompt < (int)KV_PROTO_MAX_IDS ?
				      n_prompt : (int)KV_PROTO_MAX_IDS;
		s->prompt = malloc(sizeof(int32_t) * (size_t)s->n_prompt);
		if (s->prompt && (int)cached > s->tok_cap) {
			int32_t *t = realloc(s->tokens,
					     sizeof(int32_t) * cached);

			if (t) {
				s->tokens = t;
				s->tok_cap = (int)cached;
			}
		}
		if (!s->prompt || (int)cached > s->tok_cap) {
			cw_dsv41_state_free(s);
			return st_diag_set(diag, -ENOMEM, "out of memory");
		}
		memcpy(s->prompt, prompt, sizeof(int32_t) * (size_t)s->n_prompt);
		/* the Engram history of the mapped prefix: its ids */
		memcpy(s->tokens, prompt, sizeof(int32_t) * cached);
		s->len = (int)cached;
		s->groups_published = (int)(cached / kv_client_page_rows(kv));
	}
	if (s->len > 0 && swa_replay > 0) {
		/* the model's way (model doc 3.6): forget the window the
		 * prefix entry carries and rebuild it from the last
		 * swa_replay tokens (approximate unless it covers the
		 * whole prefix) */
		int n = swa_replay < s->len ? swa_replay : s->len;

		cw_dsv41_state_drop_window(s);
		r = cw_dsv41_replay(m, s, s->tokens + s->len - n, n, diag);
		if (r < 0) {
			cw_dsv41_state_free(s);
			return r;
		}
	}
	*ret = s;
	return 0;
}

void cw_dsv41_kv_after_eval(struct cw_dsv41_state *s, const int32_t *ids,
			    int n)
{
	const int B = (int)kv_client_page_rows(s->kv);
	int from = s->len - n, upto;
	struct st_diag d = { { 0 } };

	/* only rows computed from the prompt's own ids are published under
	 * its keys: a different token ends the publishable prefix there */
	for (int t = 0; t < n && from + t < s->n_prompt; t++)
		if (ids[t] != s->prompt[from + t]) {
			s->n_prompt = from + t;
			break;
		}
	upto = s->len < s->n_prompt ? s->len : s->n_prompt;
	if (B < 1 || upto / B <= s->groups_published)
		return;
	/* replayed window rows live outside the pages (the pages hold
	 * other rows for them), and the CED shortcut leaves window rows
	 * uncomputed: neither state's pages are published */
	if (s->ov_hi > 0 || s->ced)
		return;
	if (kv_client_seq_publish(s->kv, s->seq, s->prompt, (uint32_t)upto,
				  &d) < 0) {
		st_warn("prefix cache: publishing %d tokens of kvd sequence "
			"0x%x failed: %s (no more publishing for it)", upto,
			s->seq, d.msg);
		s->n_prompt = 0;
		return;
	}
	s->groups_published = upto / B;
}

int cw_dsv41_state_publish(struct cw_dsv41_state *s, const int32_t *ids,
			   int n, struct st_diag *diag)
{
	if (!s->kv)
		return st_diag_set(diag, -EINVAL, "publish: the state is "
				   "process-local, not in kvd");
	if (n < 1 || n > s->len)
		return st_diag_set(diag, -EINVAL, "publish: %d tokens, the "
				   "state holds %d", n, s->len);
	if (s->ov_hi > 0 || s->ced)
		return st_diag_set(diag, -EINVAL, "publish: the state's window "
				   "was rebuilt by SWA replay or skipped by the "
				   "CED shortcut (rows not in its pages); only "
				   "states of the full computation publish");
	return kv_client_seq_publish(s->kv, s->seq, ids, (uint32_t)n, diag);
}

uint32_t cw_dsv41_state_seq(const struct cw_dsv41_state *s)
{
	return s->kv ? s->seq : 0;
}
