/* cw_model_dsv41.c — see cw_model_dsv41.h. */
#include "cw_model_dsv41.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_seqtab.h"
#include "es_client.h"
#include "kv_client.h"
#include "st_util.h"

struct cw_v41serve {
	struct cw_dsv41_model *dm;   /* owned */
	struct es_client *es;       /* borrowed */
	struct kv_client *kv;       /* borrowed, may be NULL */
	struct cw_seqtab tab;        /* per-sequence states */
	struct cw_read_stats rs;
	/* weight bytes an eval reads (set at open): the LM head, and the
	 * rest but the routed experts per position */
	uint64_t head_bytes, dense_bytes;
};

/* The table's view of a cw_dsv41_state (cw_seqtab.h). */
static int st_len(const void *st)
{
	return cw_dsv41_state_len(st);
}

static uint32_t st_kv_seq(const void *st)
{
	return cw_dsv41_state_seq(st);
}

static void st_free(void *st)
{
	cw_dsv41_state_free(st);
}

static int st_new_local(const void *model, int max_tokens, void **ret)
{
	const struct cw_v41serve *v = model;
	struct cw_dsv41_state *st = NULL;
	int r = cw_dsv41_state_new(v->dm, max_tokens, &st);

	*ret = st;
	return r;
}

static int st_eval(const void *model, void *st, const int32_t *ids, int n,
		   int all_positions, float *logits, struct st_diag *diag)
{
	/* the table's model is the adapter (cw_seqtab_init below), not
	 * const: its read counters grow here, from the one thread that
	 * steps the sequences (cw_seqtab.h) */
	struct cw_v41serve *v = (struct cw_v41serve *)model;
	struct cw_dsv41_run_stats a, b;
	int r;

	cw_dsv41_state_stats(st, &a);
	r = cw_dsv41_eval(v->dm, st, ids, n, all_positions, logits, diag);
	cw_dsv41_state_stats(st, &b);
	/* the stall: time in es_client_acquire (the state's counter) */
	cw_seqtab_count_eval(&v->rs, b.acquire_ns - a.acquire_ns, r >= 0, n,
			     all_positions, v->dense_bytes, v->head_bytes);
	return r;
}

static const struct cw_seqtab_ops k_state_ops = {
	"V4.1", st_len, st_kv_seq, st_free, st_new_local, st_eval,
};

int cw_v41serve_open(const char *store_dir, struct es_client *es,
		    struct kv_client *kv, const struct cw_model_opts *opts,
		    struct cw_v41serve **ret, struct st_diag *diag)
{
	struct cw_v41serve *v;
	int r;

	if (opts->kv_dtype != ST_DTYPE_F32)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "store %s: DeepSeek-V4.1's state is kept in "
				   "its own formats (F32 activations); use "
				   "--kv-dtype f32", store_dir);
	v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	v->es = es;
	v->kv = kv;
	/* fast mode: FP8 dense as E4M3 codes, BF16 compressor / index
	 * keys / head, experts straight from the slot bytes on the fast
	 * kernels (cw_dsv41_load_store_mode) */
	r = cw_dsv41_load_store_mode(store_dir, es, opts->compute, &v->dm,
				     diag);
	/* fast mode: the matvecs over opts->n_threads (--threads) */
	if (!r && opts->compute == CW_COMPUTE_FAST && opts->n_threads > 1 &&
	    (r = cw_dsv41_set_threads(v->dm, opts->n_threads)) < 0)
		st_diag_set(diag, r, "cannot start %d threads",
			    opts->n_threads);
	if (!r) {
		const struct st_dsv41_config *c = cw_dsv41_config(v->dm);

		cw_seqtab_init(&v->tab, &k_state_ops, v, c->vocab_size,
			       ST_MIN(CW_V41_LAZY_TOKENS, c->max_position_embeddings));
		v->head_bytes = cw_dsv41_lm_head_bytes(v->dm);
		v->dense_bytes = cw_dsv41_dense_bytes(v->dm) - v->head_bytes;
	}
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
	if (v->dm)
		cw_seqtab_fini(&v->tab);
	cw_dsv41_free(v->dm);
	free(v);
}

const struct st_dsv41_config *cw_v41serve_config(const struct cw_v41serve *v)
{
	return cw_dsv41_config(v->dm);
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
	r = cw_seqtab_put(&v->tab, seq, st, diag);
	if (r < 0)
		return r; /* st (and its kvd sequence) freed */
	*ret_seq = seq;
	return 0;
}

int cw_v41serve_seq_begin(struct cw_v41serve *v, uint32_t seq, int max_tokens,
			  struct st_diag *diag)
{
	return cw_seqtab_begin(&v->tab, seq, max_tokens, diag);
}

int cw_v41serve_seq_end(struct cw_v41serve *v, uint32_t seq)
{
	return cw_seqtab_end(&v->tab, seq);
}

int cw_v41serve_eval_batch(struct cw_v41serve *v,
			   const struct cw_batch_tok *toks, int n,
			   struct st_diag *diag)
{
	const struct st_dsv41_config *c = cw_dsv41_config(v->dm);
	const uint64_t rec = v->es ? es_client_record_bytes(v->es) : 0;
	uint64_t done = 0;
	int r = cw_seqtab_eval_batch(&v->tab, toks, n, &done, diag);

	v->rs.tokens += done;
	v->rs.expert_bytes += done * (uint64_t)c->n_layers *
			      (uint64_t)c->top_k * rec;
	return r;
}

int cw_v41serve_set_prefetch_depth(struct cw_v41serve *v, int depth)
{
	return cw_dsv41_set_prefetch_depth(v->dm, depth);
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
