/* cw_model_dsv.c — see cw_model_dsv.h. */
#include "cw_model_dsv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_dsv.h"
#include "cw_seqtab.h"
#include "es_client.h"
#include "kv_client.h"
#include "st_util.h"

/*
 * What differs between the revisions in serving: names in messages, the
 * KV bytes a token adds, and fast mode's matvec threads.  The state, its
 * eval and the kvd sequence are the family's one (cw_dsv.h).
 */
struct dsv_rev {
	const char *name;          /* in messages: "V4", "V4.1" */
	enum st_dsv_revision rev;  /* what cw_dsv_load_store must find */
	const char *kv_why;        /* why the KV dtype must be F32 */
	/* fast mode's matvec threads; NULL: the revision has none */
	int (*set_threads)(struct cw_dsv_model *dm, int n_threads);
	uint64_t (*kv_bytes_per_token)(const struct cw_dsv_model *dm);
};

static uint64_t v4_kv_bytes_per_token(const struct cw_dsv_model *dm)
{
	/* the growing streams of F32 rows */
	return (uint64_t)cw_dsv4_kv_bytes_per_token(cw_dsv_config(dm), 4);
}

static uint64_t v41_kv_bytes_per_token(const struct cw_dsv_model *dm)
{
	/* the V4.1 storage formats' growing KV (st_kvfmt_v41.h) */
	return (uint64_t)cw_dsv41_kv_bytes_per_token(cw_dsv_config(dm));
}

static const struct dsv_rev k_revs[] = {
	[CW_DSV_REV_V4] = { "V4", ST_DSV_REV_V4, "F32 rows", NULL,
			    v4_kv_bytes_per_token },
	[CW_DSV_REV_V41] = { "V4.1", ST_DSV_REV_V41,
			     "its own formats (F32 activations)",
			     cw_dsv41_set_threads, v41_kv_bytes_per_token },
};

/* The state table's (cw_seqtab.h) view of a state, opaque there. */
static int state_len(const void *st)
{
	return cw_dsv_state_len(st);
}

static uint32_t state_seq(const void *st)
{
	return cw_dsv_state_seq(st);
}

static void state_free(void *st)
{
	cw_dsv_state_free(st);
}

static uint64_t state_acquire_ns(const void *st)
{
	struct cw_dsv_run_stats s;

	cw_dsv_state_stats(st, &s);
	return s.acquire_ns;
}

struct cw_dsvserve {
	const struct dsv_rev *rev;
	struct cw_dsv_model *dm;    /* owned */
	const struct st_dsv_config *cfg; /* dm's */
	struct es_client *es;       /* borrowed */
	struct kv_client *kv;       /* borrowed, may be NULL */
	struct cw_seqtab tab;       /* per-sequence states */
	struct cw_read_stats rs;
	/* weight bytes an eval reads (set at open): the LM head, and the
	 * rest but the routed experts per position */
	uint64_t head_bytes, dense_bytes;
};

/* The state table's (cw_seqtab.h) new_local and eval; its model is the
 * adapter (cw_seqtab_init below). */
static int tab_new_local(const void *model, int max_tokens, void **ret)
{
	const struct cw_dsvserve *v = model;

	*ret = NULL;
	return cw_dsv_state_new(v->dm, max_tokens,
				(struct cw_dsv_state **)ret);
}

/* The MTP block's reads on st since the last count into v's read
 * figures: top_k expert records per block evaluation, the LM head per
 * draft made (its dense weights, a decoder block's share, not counted). */
static void mtp_count(struct cw_dsvserve *v, struct cw_dsv_state *st)
{
	uint64_t evals, heads;

	cw_dsv_mtp_take_counts(st, &evals, &heads);
	v->rs.expert_bytes += evals * (uint64_t)v->cfg->top_k *
			      (v->es ? es_client_record_bytes(v->es) : 0);
	v->rs.lm_head_bytes += heads * v->head_bytes;
}

static int tab_eval(const void *model, void *st, const int32_t *ids, int n,
		    int all_positions, float *logits, struct st_diag *diag)
{
	/* the table's model is the adapter, not const: its read counters
	 * grow here, from the one thread that steps the sequences
	 * (cw_seqtab.h) */
	struct cw_dsvserve *v = (struct cw_dsvserve *)model;
	uint64_t a = state_acquire_ns(st);
	int r = cw_dsv_eval(v->dm, st, ids, n, all_positions, logits, diag);
	uint64_t b = state_acquire_ns(st);

	/* the stall: time in es_client_acquire (the state's counter) */
	cw_seqtab_count_eval(&v->rs, b - a, r >= 0, n, all_positions,
			     v->dense_bytes, v->head_bytes);
	mtp_count(v, st);
	return r;
}

/* cw_seqtab's ops take the state alone for len, seq and free; the
 * revision's name for its messages. */
static int tab_truncate(void *st, int len, struct st_diag *diag)
{
	return cw_dsv_state_truncate(st, len, diag);
}

static int tab_publish_lag(void *st, int lag)
{
	return cw_dsv_state_set_publish_lag(st, lag);
}

/* both revisions' states can be cut back (rejected drafts) */
static const struct cw_seqtab_ops k_tab_ops[] = {
	[CW_DSV_REV_V4] = { "V4", state_len, state_seq, state_free,
			    tab_new_local, tab_eval, tab_truncate,
			    tab_publish_lag },
	[CW_DSV_REV_V41] = { "V4.1", state_len, state_seq, state_free,
			     tab_new_local, tab_eval, tab_truncate,
			     tab_publish_lag },
};

int cw_dsvserve_open(enum cw_dsv_rev rev, const char *store_dir,
		     struct es_client *es, struct kv_client *kv,
		     const struct cw_model_opts *opts,
		     struct cw_dsvserve **ret, struct st_diag *diag)
{
	struct cw_dsvserve *v;
	const struct dsv_rev *rv;
	int r;

	if ((unsigned)rev >= sizeof(k_revs) / sizeof(k_revs[0]))
		return st_diag_set(diag, -EINVAL, "DeepSeek revision %d unknown",
				   (int)rev);
	rv = &k_revs[rev];
	if (opts->kv_dtype != ST_DTYPE_F32)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "store %s: DeepSeek-%s's state is kept in "
				   "%s; use --kv-dtype f32", store_dir,
				   rv->name, rv->kv_why);
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->rev = rv;
	v->es = es;
	v->kv = kv;
	/* fast mode: FP8 dense as E4M3 codes (V4.1: BF16 compressor, index
	 * keys and head), experts straight from the slot bytes on the fast
	 * kernels */
	r = cw_dsv_load_store(store_dir, es, rv->rev, opts->compute, &v->dm,
			      diag);
	/* fast mode: the matvecs over opts->n_threads (--threads) */
	if (!r && rv->set_threads && opts->compute == CW_COMPUTE_FAST &&
	    opts->n_threads > 1 &&
	    (r = rv->set_threads(v->dm, opts->n_threads)) < 0)
		st_diag_set(diag, r, "cannot start %d threads",
			    opts->n_threads);
	/* --exact-math: no round trip (before the KV declaration: the V4.1
	 * row formats and the prefix-cache identity follow the flags) */
	if (!r && opts->exact_math && (r = cw_dsv_set_qat(v->dm, 0)) < 0)
		st_diag_set(diag, r, "cannot select the exact math");
	if (!r) {
		v->cfg = cw_dsv_config(v->dm);
		cw_seqtab_init(&v->tab, &k_tab_ops[rev], v, v->cfg->vocab_size,
			       ST_MIN(CW_DSV_LAZY_TOKENS,
				      v->cfg->max_position_embeddings));
		v->head_bytes = cw_dsv_lm_head_bytes(v->dm);
		v->dense_bytes = cw_dsv_dense_bytes(v->dm) - v->head_bytes;
	}
	if (!r && kv) {
		/* the revision's streams; the prefix-cache id also names the
		 * expert store (its experts made the rows) and the page size */
		struct {
			uint64_t model, es_store;
			uint32_t page_rows, pad;
		} id = { cw_dsv_model_id(v->dm),
			 es ? es_client_store_id(es) : 0,
			 opts->page_rows ? opts->page_rows : 16, 0 };

		/* V4: F32 rows; V4.1: its formats, with the store's QAT
		 * flags */
		r = cw_dsv_kv_declare(v->dm, kv, id.page_rows,
				      st_xxh3(&id, sizeof(id)) | 1, diag);
	}
	if (r < 0) {
		cw_dsvserve_close(v);
		return r;
	}
	*ret = v;
	return 0;
}

const char *cw_dsvserve_math(const struct cw_dsvserve *v)
{
	return cw_dsv_math_name(v->dm);
}

void cw_dsvserve_close(struct cw_dsvserve *v)
{
	if (!v)
		return;
	if (v->dm) {
		cw_seqtab_fini(&v->tab);
		cw_dsv_free(v->dm);
	}
	free(v);
}

uint64_t cw_dsvserve_kv_bytes_per_token(const struct cw_dsvserve *v)
{
	return v->rev->kv_bytes_per_token(v->dm);
}

int cw_dsvserve_seq_create(struct cw_dsvserve *v, const int32_t *prompt,
			   int n_prompt, int prefix_cache,
			   uint32_t publish_flags, uint32_t *ret_seq,
			   uint32_t *ret_cached, struct st_diag *diag)
{
	struct cw_dsv_state *st = NULL;
	uint32_t seq;
	int r;

	if (!v->kv)
		return st_diag_set(diag, -EINVAL, "%s sequence: no kvd client "
				   "(the model was opened without kvd)",
				   v->rev->name);
	/* swa_replay 0: a prefix hit maps the window rows the entry
	 * carries (exact, bit-identical to evaluating the prompt cold); a
	 * V4.1 state fills the Engram token history of the mapped prefix
	 * from the prompt */
	r = cw_dsv_state_new_kv(v->dm, v->kv, prefix_cache ? prompt : NULL,
				prefix_cache ? n_prompt : 0, 0,
				&st, diag);
	if (r < 0)
		return r;
	if (cw_dsv_state_set_publish_flags(st, publish_flags) < 0) {
		cw_dsv_state_free(st);
		return st_diag_set(diag, -EINVAL, "unknown publish flags 0x%x",
				   publish_flags);
	}
	seq = state_seq(st);
	*ret_cached = (uint32_t)state_len(st);
	r = cw_seqtab_put(&v->tab, seq, st, diag);
	if (r < 0)
		return r; /* st (and its kvd sequence) freed */
	*ret_seq = seq;
	return 0;
}

int cw_dsvserve_seq_begin(struct cw_dsvserve *v, uint32_t seq,
			  int max_tokens, struct st_diag *diag)
{
	return cw_seqtab_begin(&v->tab, seq, max_tokens, diag);
}

int cw_dsvserve_seq_end(struct cw_dsvserve *v, uint32_t seq)
{
	return cw_seqtab_end(&v->tab, seq);
}

int cw_dsvserve_can_truncate(const struct cw_dsvserve *v)
{
	return v->tab.ops->truncate != NULL;
}

int cw_dsvserve_seq_truncate(struct cw_dsvserve *v, uint32_t seq, int len,
			     struct st_diag *diag)
{
	return cw_seqtab_truncate(&v->tab, seq, len, diag);
}

int cw_dsvserve_seq_publish_lag(struct cw_dsvserve *v, uint32_t seq,
				int lag, struct st_diag *diag)
{
	return cw_seqtab_publish_lag(&v->tab, seq, lag, diag);
}

int cw_dsvserve_has_mtp(const struct cw_dsvserve *v)
{
	return cw_dsv_has_mtp(v->dm);
}

/* seq's state for the MTP calls: -ST_E_NOTFOUND with diag when none */
static int mtp_state(struct cw_dsvserve *v, uint32_t seq,
		     struct cw_dsv_state **ret, struct st_diag *diag)
{
	*ret = cw_seqtab_get(&v->tab, seq);
	return *ret ? 0 :
		      st_diag_set(diag, -ST_E_NOTFOUND,
				  "MTP drafts: sequence 0x%x has no state", seq);
}

int cw_dsvserve_seq_mtp_follow(struct cw_dsvserve *v, uint32_t seq,
			       struct st_diag *diag)
{
	struct cw_dsv_state *st;
	int r = mtp_state(v, seq, &st, diag);

	if (r == 0 && (r = cw_dsv_mtp_follow(v->dm, st)) < 0)
		st_diag_set(diag, r, "MTP drafts: %s",
			    r == -ENOMEM ? "out of memory" :
					   "the store has no MTP block");
	return r;
}

int cw_dsvserve_seq_mtp_draft(struct cw_dsvserve *v, uint32_t seq,
			      int32_t next, int k, int32_t *out,
			      struct st_diag *diag)
{
	struct cw_dsv_state *st;
	int r = mtp_state(v, seq, &st, diag);

	if (r < 0)
		return r;
	r = cw_dsv_mtp_draft(v->dm, st, next, k, out, diag);
	mtp_count(v, st);
	return r;
}

int cw_dsvserve_eval_batch(struct cw_dsvserve *v,
			   const struct cw_batch_tok *toks, int n,
			   struct st_diag *diag)
{
	const uint64_t rec = v->es ? es_client_record_bytes(v->es) : 0;
	uint64_t done = 0;
	int r = cw_seqtab_eval_batch(&v->tab, toks, n, &done, diag);

	v->rs.tokens += done;
	v->rs.expert_bytes += done * (uint64_t)v->cfg->n_layers *
			      (uint64_t)v->cfg->top_k * rec;
	return r;
}

int cw_dsvserve_set_prefetch_depth(struct cw_dsvserve *v, int depth)
{
	return cw_dsv_set_prefetch_depth(v->dm, depth);
}

void cw_dsvserve_set_expert_overlap(struct cw_dsvserve *v, int on)
{
	cw_dsv_set_expert_overlap(v->dm, on);
}

void cw_dsvserve_read_stats(const struct cw_dsvserve *v,
			    struct cw_read_stats *ret)
{
	*ret = v->rs;
}

uint64_t cw_dsvserve_expert_bytes(const struct cw_dsvserve *v)
{
	return v->es ? es_client_record_bytes(v->es) : 0;
}
