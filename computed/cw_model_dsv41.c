/* cw_model_dsv41.c — see cw_model_dsv41.h. */
#include "cw_model_dsv41.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "es_client.h"
#include "kv_client.h"
#include "st_util.h"

struct cw_v41_seq {
	uint32_t seq;
	struct cw_dsv41_state *st;   /* owned */
};

struct cw_v41serve {
	struct cw_dsv41_model *dm;   /* owned */
	struct es_client *es;       /* borrowed */
	struct kv_client *kv;       /* borrowed, may be NULL */
	pthread_mutex_t lock;       /* the sequence table */
	struct cw_v41_seq *seqs;     /* owned [cap_seqs] */
	int n_seqs, cap_seqs;
	float *rows;                /* all-position logits of one run */
	int cap_rows;
	int32_t *ids;               /* one run's ids */
	int cap_ids;
	struct cw_read_stats rs;
};

/* The placeholder kvd stream: sequence ids only, no rows reserved. */
#define V41_KV_ROW_BYTES 4096u

int cw_v41serve_open(const char *store_dir, struct es_client *es,
		    struct kv_client *kv, const struct cw_model_opts *opts,
		    struct cw_v41serve **ret, struct st_diag *diag)
{
	struct cw_v41serve *v;
	int r;

	if (opts->kv_dtype != ST_DTYPE_F32 ||
	    opts->compute != CW_COMPUTE_REFERENCE)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "store %s: DeepSeek-V4.1 is served in reference "
				   "mode only (F32 state); use --kv-dtype f32 "
				   "and --compute reference", store_dir);
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	pthread_mutex_init(&v->lock, NULL);
	v->es = es;
	v->kv = kv;
	r = cw_dsv41_load_store(store_dir, es, &v->dm, diag);
	if (!r && kv) {
		const struct st_dsv41_config *c = cw_dsv41_config(v->dm);
		struct kv_stream_decl decl = { 0 };
		struct {
			uint64_t es_store;
			uint32_t layers, vocab;
		} id = { es_client_store_id(es), (uint32_t)c->n_layers,
			 (uint32_t)c->vocab_size };

		decl.row_bytes = V41_KV_ROW_BYTES;
		decl.tokens_per_row = 1;
		r = kv_client_declare_model(kv, 1, &decl,
					    opts->page_rows ? opts->page_rows :
							      16,
					    st_xxh3(&id, sizeof(id)) | 1, diag);
	}
	if (r < 0) {
		cw_v41serve_close(v);
		return r;
	}
	*ret = v;
	return 0;
}

void cw_v41serve_close(struct cw_v41serve *v)
{
	if (!v)
		return;
	for (int i = 0; i < v->n_seqs; i++)
		cw_dsv41_state_free(v->seqs[i].st);
	free(v->seqs);
	free(v->rows);
	free(v->ids);
	cw_dsv41_free(v->dm);
	pthread_mutex_destroy(&v->lock);
	free(v);
}

const struct st_dsv41_config *cw_v41serve_config(const struct cw_v41serve *v)
{
	return cw_dsv41_config(v->dm);
}

/* Index of seq in the table, or -1 (under v->lock). */
static int find_locked(const struct cw_v41serve *v, uint32_t seq)
{
	for (int i = 0; i < v->n_seqs; i++)
		if (v->seqs[i].seq == seq)
			return i;
	return -1;
}

int cw_v41serve_seq_begin(struct cw_v41serve *v, uint32_t seq, int max_tokens,
			 struct st_diag *diag)
{
	struct cw_dsv41_state *st = NULL, *old = NULL;
	int r, i;

	if (max_tokens < 1)
		return st_diag_set(diag, -EINVAL, "a V4.1 sequence needs room "
				   "for at least one token");
	/* the one place a V4.1 sequence state is made (kvd-backed states
	 * will be constructed here) */
	r = cw_dsv41_state_new(v->dm, max_tokens, &st);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for the V4.1 state of "
				   "%d tokens", max_tokens);
	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i < 0 && v->n_seqs == v->cap_seqs) {
		int cap = v->cap_seqs ? 2 * v->cap_seqs : 16;
		struct cw_v41_seq *p = realloc(v->seqs, sizeof(*p) * (size_t)cap);

		if (!p) {
			pthread_mutex_unlock(&v->lock);
			cw_dsv41_state_free(st);
			return st_diag_set(diag, -ENOMEM, "out of memory");
		}
		v->seqs = p;
		v->cap_seqs = cap;
	}
	if (i < 0) {
		i = v->n_seqs++;
		v->seqs[i].seq = seq;
	} else {
		old = v->seqs[i].st;
	}
	v->seqs[i].st = st;
	pthread_mutex_unlock(&v->lock);
	cw_dsv41_state_free(old);
	return 0;
}

void cw_v41serve_seq_end(struct cw_v41serve *v, uint32_t seq)
{
	struct cw_dsv41_state *st = NULL;
	int i;

	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i >= 0) {
		st = v->seqs[i].st;
		v->seqs[i] = v->seqs[--v->n_seqs];
	}
	pthread_mutex_unlock(&v->lock);
	cw_dsv41_state_free(st);
}

/* The state of seq ready for a run starting at pos: made lazily at
 * position 0 (also when the id was reused without cw_v41serve_seq_end). */
static int state_for(struct cw_v41serve *v, uint32_t seq, uint32_t pos,
		     struct cw_dsv41_state **ret, struct st_diag *diag)
{
	const struct st_dsv41_config *c = cw_dsv41_config(v->dm);
	struct cw_dsv41_state *st = NULL;
	int i, r;

	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i >= 0)
		st = v->seqs[i].st;
	pthread_mutex_unlock(&v->lock);
	if (pos == 0 && (!st || cw_dsv41_state_len(st) > 0)) {
		r = cw_v41serve_seq_begin(v, seq,
					 ST_MIN(CW_V41_LAZY_TOKENS,
						c->max_position_embeddings),
					 diag);
		if (r < 0)
			return r;
		return state_for(v, seq, pos, ret, diag);
	}
	if (!st || (uint32_t)cw_dsv41_state_len(st) != pos)
		return st_diag_set(diag, -EINVAL, "V4.1 sequence %u: a token at "
				   "position %u, but %d positions are "
				   "evaluated (V4.1 runs each sequence in order)",
				   seq, pos, st ? cw_dsv41_state_len(st) : 0);
	*ret = st;
	return 0;
}

/* Grows a buffer of elem-sized items to hold n. */
static int grow(void **buf, int *cap, int n, size_t elem)
{
	void *p;

	if (n <= *cap)
		return 0;
	p = realloc(*buf, elem * (size_t)n);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

int cw_v41serve_eval_batch(struct cw_v41serve *v,
			  const struct cw_batch_tok *toks, int n,
			  struct st_diag *diag)
{
	const struct st_dsv41_config *c = cw_dsv41_config(v->dm);
	const size_t V = (size_t)c->vocab_size;
	const uint64_t rec = v->es ? es_client_record_bytes(v->es) : 0;

	for (int i = 0, j; i < n; i = j) {
		struct cw_dsv41_state *st = NULL;
		int run, mid = 0, r;

		for (j = i + 1; j < n && toks[j].seq == toks[i].seq &&
				toks[j].pos == toks[j - 1].pos + 1; j++)
			;
		run = j - i;
		for (int t = i; t < j - 1; t++)
			mid |= toks[t].logits != NULL;
		r = state_for(v, toks[i].seq, toks[i].pos, &st, diag);
		if (r < 0)
			return r;
		if (grow((void **)&v->ids, &v->cap_ids, run, sizeof(int32_t)) ||
		    (mid && grow((void **)&v->rows, &v->cap_rows, run,
				 V * sizeof(float))))
			return st_diag_set(diag, -ENOMEM, "out of memory for "
					   "%d tokens", run);
		for (int t = 0; t < run; t++)
			v->ids[t] = toks[i + t].id;
		if (!mid) {
			r = cw_dsv41_eval(v->dm, st, v->ids, run, 0,
					 toks[j - 1].logits, diag);
		} else {
			r = cw_dsv41_eval(v->dm, st, v->ids, run, 1, v->rows,
					 diag);
			for (int t = 0; !r && t < run; t++)
				if (toks[i + t].logits)
					memcpy(toks[i + t].logits,
					       v->rows + (size_t)t * V,
					       V * sizeof(float));
		}
		if (r < 0)
			return r;
		v->rs.tokens += (uint64_t)run;
		v->rs.expert_bytes += (uint64_t)run * (uint64_t)c->n_layers *
				      (uint64_t)c->top_k * rec;
	}
	return 0;
}

void cw_v41serve_read_stats(const struct cw_v41serve *v,
			   struct cw_read_stats *ret)
{
	*ret = v->rs;
}

uint64_t cw_v41serve_expert_bytes(const struct cw_v41serve *v)
{
	return v->es ? es_client_record_bytes(v->es) : 0;
}
