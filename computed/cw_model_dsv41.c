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
	/* the last run evaluated (positions [last_pos, last_pos + last_n),
	 * ids and logits buffers hashed in last_key): the same run again is
	 * a replay (cw_v41serve_eval_batch) */
	uint32_t last_pos, last_n;
	uint64_t last_key;
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
		/* the V4.1 streams in the V4.1 formats (cw_dsv41_kv_decl,
		 * with the store's QAT flags); the prefix-cache id also names
		 * the expert store (its experts made the rows) and the page
		 * size */
		struct {
			uint64_t model, es_store;
			uint32_t page_rows, pad;
		} id = { cw_dsv41_model_id(v->dm),
			 es ? es_client_store_id(es) : 0,
			 opts->page_rows ? opts->page_rows : 16, 0 };

		r = cw_dsv41_kv_declare(v->dm, kv, id.page_rows,
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

/* Puts st (owned) as seq's state, replacing (and freeing) any state the
 * id had.  -ENOMEM (st freed). */
static int put_state(struct cw_v41serve *v, uint32_t seq,
		     struct cw_dsv41_state *st, struct st_diag *diag)
{
	struct cw_dsv41_state *old = NULL;
	int i;

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
	v->seqs[i].last_n = 0;
	pthread_mutex_unlock(&v->lock);
	cw_dsv41_state_free(old);
	return 0;
}

int cw_v41serve_seq_create(struct cw_v41serve *v, const int32_t *prompt,
			   int n_prompt, int prefix_cache, uint32_t *ret_seq,
			   uint32_t *ret_cached, struct st_diag *diag)
{
	struct cw_dsv41_state *st = NULL;
	uint32_t seq;
	int r;

	if (!v->kv)
		return st_diag_set(diag, -EINVAL, "V4.1 sequence: no kvd "
				   "client (the model was opened without kvd)");
	/* swa_replay 0: a prefix hit maps the window rows the entry carries
	 * (exact, bit-identical to evaluating the prompt cold); the state
	 * fills the Engram token history of the mapped prefix from the
	 * prompt */
	r = cw_dsv41_state_new_kv(v->dm, v->kv, prefix_cache ? prompt : NULL,
				  prefix_cache ? n_prompt : 0, 0, &st, diag);
	if (r < 0)
		return r;
	seq = cw_dsv41_state_seq(st);
	*ret_cached = (uint32_t)cw_dsv41_state_len(st);
	r = put_state(v, seq, st, diag);
	if (r < 0)
		return r; /* st (and its kvd sequence) freed */
	*ret_seq = seq;
	return 0;
}

int cw_v41serve_seq_begin(struct cw_v41serve *v, uint32_t seq, int max_tokens,
			  struct st_diag *diag)
{
	struct cw_dsv41_state *st = NULL;
	int r, i, kvd = 0;

	if (max_tokens < 1)
		return st_diag_set(diag, -EINVAL, "a V4.1 sequence needs room "
				   "for at least one token");
	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i >= 0)
		kvd = cw_dsv41_state_seq(v->seqs[i].st) != 0;
	pthread_mutex_unlock(&v->lock);
	if (kvd)
		return 0; /* made by cw_v41serve_seq_create: its rows are in kvd */
	r = cw_dsv41_state_new(v->dm, max_tokens, &st);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for the V4.1 state of "
				   "%d tokens", max_tokens);
	return put_state(v, seq, st, diag);
}

int cw_v41serve_seq_end(struct cw_v41serve *v, uint32_t seq)
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
	i = st && cw_dsv41_state_seq(st) != 0;
	cw_dsv41_state_free(st); /* frees a kvd state's sequence */
	return i;
}

/* The state of seq ready for a run starting at pos: a process-local one
 * made lazily at position 0 (also when the id was reused without
 * cw_v41serve_seq_end; never in place of a kvd state, whose sequence it
 * is). */
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
	if (pos == 0 && (!st || (cw_dsv41_state_len(st) > 0 &&
				 !cw_dsv41_state_seq(st)))) {
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

/* A run's identity: its positions, ids and logits buffers. */
static uint64_t run_key(const struct cw_batch_tok *t, int n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull;

	for (int i = 0; i < n; i++) {
		h = (h ^ ((uint64_t)t[i].pos << 32 | (uint32_t)t[i].id)) *
		    0x100000001b3ull;
		h = (h ^ (uint64_t)(uintptr_t)t[i].logits) * 0x100000001b3ull;
	}
	return h;
}

/* Is [pos, pos + n) with key the run seq evaluated last, and nothing
 * after it?  (A scheduler retrying a failed step one request at a time
 * gives the runs that succeeded again: a V4.1 state cannot evaluate a
 * position twice, and their logits buffers hold the results already.) */
static int is_replay(struct cw_v41serve *v, uint32_t seq, uint32_t pos,
		     uint32_t n, uint64_t key)
{
	int i, yes = 0;

	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i >= 0) {
		const struct cw_v41_seq *e = &v->seqs[i];

		yes = e->last_n == n && e->last_pos == pos &&
		      e->last_key == key &&
		      (uint32_t)cw_dsv41_state_len(e->st) == pos + n;
	}
	pthread_mutex_unlock(&v->lock);
	return yes;
}

static void note_run(struct cw_v41serve *v, uint32_t seq, uint32_t pos,
		     uint32_t n, uint64_t key)
{
	int i;

	pthread_mutex_lock(&v->lock);
	i = find_locked(v, seq);
	if (i >= 0) {
		v->seqs[i].last_pos = pos;
		v->seqs[i].last_n = n;
		v->seqs[i].last_key = key;
	}
	pthread_mutex_unlock(&v->lock);
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
		uint64_t key;

		for (j = i + 1; j < n && toks[j].seq == toks[i].seq &&
				toks[j].pos == toks[j - 1].pos + 1; j++)
			;
		run = j - i;
		for (int t = i; t < j - 1; t++)
			mid |= toks[t].logits != NULL;
		key = run_key(toks + i, run);
		if (is_replay(v, toks[i].seq, toks[i].pos, (uint32_t)run, key))
			continue; /* its logits are in its buffers already */
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
		r = cw_dsv41_eval(v->dm, st, v->ids, run, mid,
				  mid ? v->rows : toks[j - 1].logits, diag);
		/* evaluated (the state moved on) even when only the unpin
		 * failed: its logits stand and a retry of the run replays it;
		 * any other failure leaves the state where it was */
		if (cw_dsv41_state_len(st) != (int)toks[i].pos + run)
			return r < 0 ? r : st_diag_set(diag, -EFAULT, "V4.1 "
						       "state did not advance");
		for (int t = 0; mid && t < run; t++)
			if (toks[i + t].logits)
				memcpy(toks[i + t].logits,
				       v->rows + (size_t)t * V,
				       V * sizeof(float));
		note_run(v, toks[i].seq, toks[i].pos, (uint32_t)run, key);
		v->rs.tokens += (uint64_t)run;
		v->rs.expert_bytes += (uint64_t)run * (uint64_t)c->n_layers *
				      (uint64_t)c->top_k * rec;
		if (r < 0)
			return r;
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
