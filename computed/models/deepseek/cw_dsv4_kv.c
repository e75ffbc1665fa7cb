/*
 * cw_dsv4_kv.c — DeepSeek-V4 sequence state in kvd pages (cw_dsv4.h "KV
 * streams in kvd"; design: docs/DESIGN.md section 9).
 *
 * The declaration is cw_dsv4_streams unrolled over the layers
 * (cw_dsv4_kv_decl); cw_dsv4.c reads and writes the rows through
 * kv_client_row, so the forward pass is the same code for both states and
 * the logits are bit-identical.
 */
#include "cw_dsv4_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "st_log.h"
#include "st_util.h"

uint64_t cw_dsv4_model_id(const struct cw_dsv4_model *m)
{
	const struct st_dsv4_config *c = &m->cfg;
	const int D = c->hidden_size;
	const int rows = c->vocab_size < 64 ? c->vocab_size : 64;
	size_t n = (size_t)(2 * rows + 1) * D * sizeof(float) + 1024;
	uint8_t *buf = malloc(n);
	size_t o = 0;
	uint64_t h;

	if (!buf)
		return 1; /* never reached in practice; still non-zero */
	o += (size_t)snprintf((char *)buf, 1024,
			      "dsv4 f32 %s qat=%u D=%d L=%d V=%d H=%d hd=%d "
			      "W=%d E=%d k=%d ratios", m->be ? "fast" : "ref",
			      m->qat, D,
			      c->n_layers, c->vocab_size, c->n_heads,
			      c->head_dim, c->sliding_window, c->n_experts,
			      c->top_k);
	for (int l = 0; l < c->n_layers && o < 1000; l++)
		o += (size_t)snprintf((char *)buf + o, 1024 - o, " %d",
				      c->compress_ratio[l]);
	memcpy(buf + o, m->embed, (size_t)rows * D * sizeof(float));
	o += (size_t)rows * D * sizeof(float);
	if (m->head.w) {
		memcpy(buf + o, m->head.w, (size_t)rows * D * sizeof(float));
		o += (size_t)rows * D * sizeof(float);
	} else if (m->head.codes) {
		/* fast mode: the LM head kept as BF16 codes */
		memcpy(buf + o, m->head.codes, (size_t)rows * D * 2);
		o += (size_t)rows * D * 2;
	}
	memcpy(buf + o, m->norm, (size_t)D * sizeof(float));
	o += (size_t)D * sizeof(float);
	h = st_xxh3(buf, o);
	free(buf);
	return h ? h : 1;
}

int cw_dsv4_kv_declare(const struct cw_dsv4_model *m, struct kv_client *kv,
		       uint32_t page_rows, uint64_t model_id,
		       struct st_diag *diag)
{
	struct kv_stream_decl *d = calloc(KV_MAX_STREAMS, sizeof(*d));
	int n, r;

	if (!d)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	n = cw_dsv4_kv_decl(&m->cfg, (int)sizeof(float), d, KV_MAX_STREAMS);
	if (n < 0) {
		free(d);
		return st_diag_set(diag, n, "the model declares more than "
				   "%d KV streams (kvd's limit)",
				   KV_MAX_STREAMS);
	}
	r = kv_client_declare_model(kv, n, d, page_rows,
				    model_id ? model_id : cw_dsv4_model_id(m),
				    diag);
	free(d);
	return r;
}

int cw_dsv4_state_new_kv(const struct cw_dsv4_model *m, struct kv_client *kv,
			 const int32_t *prompt, int n_prompt,
			 struct cw_dsv4_state **ret, struct st_diag *diag)
{
	struct cw_dsv4_state *s = NULL;
	uint32_t seq = 0, cached = 0;
	int r;

	if (!kv)
		return st_diag_set(diag, -EINVAL, "no kvd client");
	if (n_prompt < 0 || (n_prompt > 0 && !prompt))
		return st_diag_set(diag, -EINVAL, "bad prompt (%d ids)",
				   n_prompt);
	r = cw_dsv4_state_init(m, INT_MAX, kv, &s);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory");
	if (n_prompt > 0)
		r = kv_client_seq_create_prefix(kv, prompt, (uint32_t)n_prompt,
						&seq, &cached, diag);
	else
		r = kv_client_seq_create(kv, &seq, diag);
	if (r < 0) {
		cw_dsv4_state_free(s);
		return r;
	}
	s->seq = seq;
	s->len = (int)cached;
	if (n_prompt > 0) {
		/* ids past KV_PROTO_MAX_IDS are not sent: not published */
		s->n_prompt = n_prompt < (int)KV_PROTO_MAX_IDS ?
				      n_prompt : (int)KV_PROTO_MAX_IDS;
		s->prompt = malloc(sizeof(int32_t) * (size_t)s->n_prompt);
		if (!s->prompt) {
			cw_dsv4_state_free(s);
			return st_diag_set(diag, -ENOMEM, "out of memory");
		}
		memcpy(s->prompt, prompt, sizeof(int32_t) * (size_t)s->n_prompt);
		s->groups_published = (int)(cached / kv_client_page_rows(kv));
	}
	*ret = s;
	return 0;
}

void cw_dsv4_kv_after_eval(struct cw_dsv4_state *s, const int32_t *ids, int n)
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
	if (kv_client_seq_publish(s->kv, s->seq, s->prompt, (uint32_t)upto,
				  &d) < 0) {
		/* the logits stand; only the cache misses these pages */
		st_warn("prefix cache: publishing %d tokens of kvd sequence "
			"0x%x failed: %s (no more publishing for it)", upto,
			s->seq, d.msg);
		s->n_prompt = 0;
		return;
	}
	s->groups_published = upto / B;
}

int cw_dsv4_state_publish(struct cw_dsv4_state *s, const int32_t *ids, int n,
			  struct st_diag *diag)
{
	if (!s->kv)
		return st_diag_set(diag, -EINVAL, "publish: the state is "
				   "process-local, not in kvd");
	if (n < 1 || n > s->len)
		return st_diag_set(diag, -EINVAL, "publish: %d tokens, the "
				   "state holds %d", n, s->len);
	return kv_client_seq_publish(s->kv, s->seq, ids, (uint32_t)n, diag);
}

uint32_t cw_dsv4_state_seq(const struct cw_dsv4_state *s)
{
	return s->kv ? s->seq : 0;
}
