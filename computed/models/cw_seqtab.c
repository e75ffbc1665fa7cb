/* cw_seqtab.c — see cw_seqtab.h. */
#include "cw_seqtab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct cw_seqtab_ent {
	uint32_t seq;
	void *st;  /* owned */
	/* the last run evaluated (positions [last_pos, last_pos + last_n),
	 * ids and logits buffers hashed in last_key) */
	uint32_t last_pos, last_n;
	uint64_t last_key;
};

void cw_seqtab_init(struct cw_seqtab *t, const struct cw_seqtab_ops *ops,
		    const void *model, int vocab, int lazy_tokens)
{
	memset(t, 0, sizeof(*t));
	t->ops = ops;
	t->model = model;
	t->vocab = vocab;
	t->lazy_tokens = lazy_tokens;
	pthread_mutex_init(&t->lock, NULL);
}

void cw_seqtab_count_eval(struct cw_read_stats *rs, uint64_t stall_ns,
			  int ok, int n, int all_positions,
			  uint64_t dense_bytes, uint64_t head_bytes)
{
	rs->expert_stall_ns += stall_ns;
	if (!ok)
		return;
	rs->dense_bytes += (uint64_t)n * dense_bytes;
	rs->lm_head_bytes += (uint64_t)(all_positions ? n : 1) * head_bytes;
}

void cw_seqtab_fini(struct cw_seqtab *t)
{
	for (int i = 0; i < t->n; i++)
		t->ops->free(t->ents[i].st);
	free(t->ents);
	free(t->rows);
	free(t->ids);
	pthread_mutex_destroy(&t->lock);
	t->ents = NULL;
	t->n = t->cap = 0;
}

/* Index of seq in the table, or -1 (under t->lock). */
static int find_locked(const struct cw_seqtab *t, uint32_t seq)
{
	for (int i = 0; i < t->n; i++)
		if (t->ents[i].seq == seq)
			return i;
	return -1;
}

int cw_seqtab_put(struct cw_seqtab *t, uint32_t seq, void *st,
		  struct st_diag *diag)
{
	void *old = NULL;
	int i;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i < 0 && t->n == t->cap) {
		int cap = t->cap ? 2 * t->cap : 16;
		struct cw_seqtab_ent *p = realloc(t->ents,
						  sizeof(*p) * (size_t)cap);

		if (!p) {
			pthread_mutex_unlock(&t->lock);
			t->ops->free(st);
			return st_diag_set(diag, -ENOMEM, "out of memory");
		}
		t->ents = p;
		t->cap = cap;
	}
	if (i < 0) {
		i = t->n++;
		t->ents[i].seq = seq;
	} else {
		old = t->ents[i].st;
	}
	t->ents[i].st = st;
	t->ents[i].last_n = 0;
	pthread_mutex_unlock(&t->lock);
	if (old)
		t->ops->free(old);
	return 0;
}

int cw_seqtab_begin(struct cw_seqtab *t, uint32_t seq, int max_tokens,
		    struct st_diag *diag)
{
	void *st = NULL;
	int r, i, kvd = 0;

	if (max_tokens < 1)
		return st_diag_set(diag, -EINVAL, "a %s sequence needs room "
				   "for at least one token", t->ops->name);
	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0)
		kvd = t->ops->kv_seq(t->ents[i].st) != 0;
	pthread_mutex_unlock(&t->lock);
	if (kvd)
		return 0; /* made by the adapter: its rows are in kvd */
	r = t->ops->new_local(t->model, max_tokens, &st);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for the %s state "
				   "of %d tokens", t->ops->name, max_tokens);
	return cw_seqtab_put(t, seq, st, diag);
}

int cw_seqtab_end(struct cw_seqtab *t, uint32_t seq)
{
	void *st = NULL;
	int i;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0) {
		st = t->ents[i].st;
		t->ents[i] = t->ents[--t->n];
	}
	pthread_mutex_unlock(&t->lock);
	if (!st)
		return 0;
	i = t->ops->kv_seq(st) != 0;
	t->ops->free(st); /* frees a kvd state's sequence */
	return i;
}

/* seq's state (borrowed; the one stepping thread uses it), NULL when it
 * has none; forget: its last run is forgotten (no replay after it). */
static void *lookup(struct cw_seqtab *t, uint32_t seq, int forget)
{
	void *st = NULL;
	int i;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0) {
		st = t->ents[i].st;
		if (forget)
			t->ents[i].last_n = 0;
	}
	pthread_mutex_unlock(&t->lock);
	return st;
}

void *cw_seqtab_get(struct cw_seqtab *t, uint32_t seq)
{
	return lookup(t, seq, 0);
}

/* seq's state for an optional op (has: the op exists; what: for the
 * message), its last run forgotten: 0, -ST_E_UNSUPPORTED or
 * -ST_E_NOTFOUND with diag. */
static int state_for_op(struct cw_seqtab *t, uint32_t seq, int has,
			const char *what, void **ret, struct st_diag *diag)
{
	if (!has)
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "%s state: %s",
				   t->ops->name, what);
	*ret = lookup(t, seq, 1);
	if (!*ret)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "%s state of sequence 0x%x: none", t->ops->name,
				   seq);
	return 0;
}

int cw_seqtab_truncate(struct cw_seqtab *t, uint32_t seq, int len,
		       struct st_diag *diag)
{
	void *st = NULL;
	int r = state_for_op(t, seq, t->ops->truncate != NULL,
			     "cannot be cut back", &st, diag);

	return r < 0 ? r : t->ops->truncate(st, len, diag);
}

int cw_seqtab_publish_lag(struct cw_seqtab *t, uint32_t seq, int lag,
			  struct st_diag *diag)
{
	void *st = NULL;
	int r = state_for_op(t, seq, t->ops->publish_lag != NULL,
			     "no publish lag", &st, diag);

	if (r < 0)
		return r;
	return t->ops->publish_lag(st, lag) < 0 ?
		       st_diag_set(diag, -EINVAL, "publish lag %d out of range",
				   lag) :
		       0;
}

/* The state of seq ready for a run starting at pos: a process-local one
 * made lazily at position 0 (also when the id was reused without
 * cw_seqtab_end; never in place of a kvd state, whose sequence it is). */
static int state_for(struct cw_seqtab *t, uint32_t seq, uint32_t pos,
		     void **ret, struct st_diag *diag)
{
	void *st = NULL;
	int i, r;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0)
		st = t->ents[i].st;
	pthread_mutex_unlock(&t->lock);
	if (pos == 0 && (!st || (t->ops->len(st) > 0 &&
				 !t->ops->kv_seq(st)))) {
		r = cw_seqtab_begin(t, seq, t->lazy_tokens, diag);
		if (r < 0)
			return r;
		return state_for(t, seq, pos, ret, diag);
	}
	if (!st || (uint32_t)t->ops->len(st) != pos)
		return st_diag_set(diag, -EINVAL, "%s sequence %u: a token at "
				   "position %u, but %d positions are "
				   "evaluated (%s runs each sequence in order)",
				   t->ops->name, seq, pos,
				   st ? t->ops->len(st) : 0, t->ops->name);
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
static uint64_t run_key(const struct cw_batch_tok *k, int n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull;

	for (int i = 0; i < n; i++) {
		h = (h ^ ((uint64_t)k[i].pos << 32 | (uint32_t)k[i].id)) *
		    0x100000001b3ull;
		h = (h ^ (uint64_t)(uintptr_t)k[i].logits) * 0x100000001b3ull;
	}
	return h;
}

/* Is [pos, pos + n) with key the run seq evaluated last, and nothing
 * after it? */
static int is_replay(struct cw_seqtab *t, uint32_t seq, uint32_t pos,
		     uint32_t n, uint64_t key)
{
	int i, yes = 0;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0) {
		const struct cw_seqtab_ent *e = &t->ents[i];

		yes = e->last_n == n && e->last_pos == pos &&
		      e->last_key == key &&
		      (uint32_t)t->ops->len(e->st) == pos + n;
	}
	pthread_mutex_unlock(&t->lock);
	return yes;
}

static void note_run(struct cw_seqtab *t, uint32_t seq, uint32_t pos,
		     uint32_t n, uint64_t key)
{
	int i;

	pthread_mutex_lock(&t->lock);
	i = find_locked(t, seq);
	if (i >= 0) {
		t->ents[i].last_pos = pos;
		t->ents[i].last_n = n;
		t->ents[i].last_key = key;
	}
	pthread_mutex_unlock(&t->lock);
}

int cw_seqtab_eval_batch(struct cw_seqtab *t, const struct cw_batch_tok *toks,
			 int n, uint64_t *tokens_done, struct st_diag *diag)
{
	const size_t V = (size_t)t->vocab;

	for (int i = 0, j; i < n; i = j) {
		void *st = NULL;
		int run, mid = 0, r;
		uint64_t key;

		for (j = i + 1; j < n && toks[j].seq == toks[i].seq &&
				toks[j].pos == toks[j - 1].pos + 1; j++)
			;
		run = j - i;
		for (int k = i; k < j - 1; k++)
			mid |= toks[k].logits != NULL;
		key = run_key(toks + i, run);
		if (is_replay(t, toks[i].seq, toks[i].pos, (uint32_t)run, key))
			continue; /* its logits are in its buffers already */
		r = state_for(t, toks[i].seq, toks[i].pos, &st, diag);
		if (r < 0)
			return r;
		if (grow((void **)&t->ids, &t->cap_ids, run, sizeof(int32_t)) ||
		    (mid && grow((void **)&t->rows, &t->cap_rows, run,
				 V * sizeof(float))))
			return st_diag_set(diag, -ENOMEM, "out of memory for "
					   "%d tokens", run);
		for (int k = 0; k < run; k++)
			t->ids[k] = toks[i + k].id;
		r = t->ops->eval(t->model, st, t->ids, run, mid,
				 mid ? t->rows : toks[j - 1].logits, diag);
		/* evaluated (the state moved on) even when only a later step
		 * of the eval failed (the unpin): its logits stand and a
		 * retry of the run replays it */
		if (t->ops->len(st) != (int)toks[i].pos + run)
			return r < 0 ? r : st_diag_set(diag, -EFAULT, "%s "
						       "state did not advance",
						       t->ops->name);
		for (int k = 0; mid && k < run; k++)
			if (toks[i + k].logits)
				memcpy(toks[i + k].logits,
				       t->rows + (size_t)k * V,
				       V * sizeof(float));
		note_run(t, toks[i].seq, toks[i].pos, (uint32_t)run, key);
		*tokens_done += (uint64_t)run;
		if (r < 0)
			return r;
	}
	return 0;
}
