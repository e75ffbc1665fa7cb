/*
 * cw_model.c — forward pass of the Mixtral / Qwen3-MoE decoder on the CPU
 * backend, with experts from expertd's host pool and K/V rows in kvd pages.
 *
 * Per layer (MODEL_FAMILIES.md 0.2): h = x + Attn(RMSNorm_in(x)),
 * out = h + MoE(RMSNorm_post(h)); then RMSNorm_final and lm_head.
 */
#include "cw_model.h"
#include "cw_steptime.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cw_kvdev.h"
#include "cw_kvrow.h"
#include "cw_model_dsv.h"
#include "cw_router.h"
#include "cw_threads.h"
#include "st_formats.h"
#include "st_hugemem.h"
#include "st_log.h"
#include "st_store_id.h"
#include "st_util.h"

struct cw_layer_w {
	struct cw_wview q, k, v, o, router;
	const void *attn_norm, *ffn_norm, *q_norm, *k_norm;
	enum st_dtype attn_norm_dt, ffn_norm_dt, q_norm_dt, k_norm_dt;
	/* qwen2_moe: q/k/v biases (NULL: none) and the shared expert
	 * (sh[ST_EXPERT_GATE..DOWN]; sh_score: its sigmoid gate [1, H],
	 * rows 0 when ungated) */
	const void *q_bias, *k_bias, *v_bias;
	enum st_dtype q_bias_dt, k_bias_dt, v_bias_dt;
	struct cw_wview sh[3], sh_score;
};

/* Scratch of the shared-expert step (shexp_layer), grown on demand. */
struct cw_shexp_scratch {
	int cap;                    /* tokens */
	float *g, *u, *a, *out;     /* n x S, n x S, n x S, n x H */
	float score[1];
};

/* Scratch of matvec() and moe_layer(): prepared activations (cw_act) and
 * the per-(token, expert) intermediate vectors, grown on demand. */
struct cw_kscratch {
	size_t act_stride;          /* bytes of one prepared vector (>= 64) */
	unsigned char *act_dense;   /* one, for matvec() */
	struct cw_wview *views;     /* n_experts x 3, one group's experts */
	int cap;                    /* pairs (token, k) the rest holds */
	unsigned char *act_tok;     /* per token: its prepared xn */
	unsigned char *act_pair;    /* per pair: the prepared SwiGLU output */
	struct cw_act *tact, *pact; /* their descriptors */
	float *g, *u, *a;           /* per pair: gate, up, SwiGLU (I floats) */
	int *pairs;                 /* pair ids grouped by expert */
	unsigned char *act_mm;      /* matvec_multi: per token, prepared */
	struct cw_act *mact;        /* their descriptors */
	int mm_cap;                 /* tokens act_mm holds */
};

struct cw_model {
	struct st_store *store;            /* owned */
	struct st_model_config cfg;
	const struct cw_backend_ops *be;
	struct es_client *es;              /* borrowed */
	struct kv_client *kv;              /* borrowed */
	struct cw_model_opts opts;
	uint8_t *dense_map;                /* owned: dense.bin (st_hugemem) */
	size_t dense_len;
	struct cw_wview embed, lm_head;
	const void *final_norm;
	enum st_dtype final_norm_dt;
	struct cw_layer_w *layers;         /* owned [n_layers] */
	uint32_t kv_row_bytes;
	uint64_t kv_model_id;              /* prefix-cache key part */
	struct cw_kvrow_fmt kvf;           /* K/V row layout (cw_kvrow.h) */
	cw_route_fn route_fn;
	void *route_arg;
	struct cw_route_hooks hooks;
	struct cw_steptime *tl;          /* borrowed: step timeline, or NULL */
	float *probe_xn, *probe_logits;    /* look-ahead scratch */
	float probe_w[CW_MAX_EXPERTS];
	cw_act_fn act_fn;
	void *act_arg;
	cw_expert_fn expert_fn;   /* device path of routed experts, or NULL */
	cw_expert_sync_fn expert_sync; /* its completion, or NULL */
	int no_expert_overlap;    /* cw_model_set_expert_overlap(m, 0) */
	void *expert_arg;
	/* device KV pages (cw_model_set_kvdev), NULL: host rows only */
	struct cw_kvdev *kvdev;            /* borrowed */
	void *kvdev_stream;
	cw_attn_fn attn_fn;                /* NULL: CPU reads device rows */
	void *attn_arg;
	struct kv_stream_decl kvdecl;      /* the layers' stream */
	int kvdev_failing;                 /* last acquire failed (warned) */
	struct cw_read_stats rs;
	struct cw_threads *pool;           /* owned; NULL = single thread */
	/* scratch, grown on demand for n tokens */
	int cap_tokens;
	float *x, *xn, *q, *kbuf, *vbuf, *att, *scores, *tmp;
	float *att_kv;                     /* [att_tasks][head_dim] */
	int att_tasks;                     /* attention's tasks per token */
	const uint8_t **rowp;              /* KV row of each position */
	float *rlogits, *rweights, *moe_out, *eg, *eu, *ea, *ey;
	int *rexperts;
	struct cw_kscratch ks;             /* matvec / moe_layer scratch */
	const float **mx_in;               /* [n] batched matvec inputs */
	float **mx_out;                    /* [n] and outputs */
	struct cw_shexp_scratch shx;       /* shared-expert step scratch */
	struct cw_dsvserve *dsv;           /* owned: a DeepSeek-V4 or V4.1
					    * store (cw_model_dsv.h), else NULL */
};

static void matvec(struct cw_model *m, const struct cw_wview *w,
		   const float *x, float *y);

/* Bytes a matvec reads from a weight view: elements or codes, scales and
 * the NVFP4 tensor scale (st_wformat_matrix_bytes). */
static uint64_t view_bytes(const struct cw_wview *w)
{
	struct st_wformat f = { w->dtype, w->group };
	uint64_t d = 0, sc = 0, ts = 0;

	if (w->dtype == ST_DTYPE_MXFP4)
		f.group = ST_MXFP4_BLOCK;
	else if (w->dtype == ST_DTYPE_NVFP4)
		f.group = ST_NVFP4_BLOCK;
	else if (w->dtype == ST_DTYPE_F32 || w->dtype == ST_DTYPE_BF16)
		f.group = 0;
	if (st_wformat_matrix_bytes(&f, w->rows, w->cols, &d, &sc, &ts))
		return 0;
	return d + sc + ts;
}

/* A dense matrix stored as FP8 E4M3 (convert --dense fp8): the codes
 * tensor t and NAME.scale, F32 [rows, ceil(cols / 128)]. */
static int bind_dense_fp8(struct cw_model *m, const struct st_store_tensor *t,
			  const char *name, int64_t rows, int64_t cols,
			  struct cw_wview *ret_view, struct st_diag *diag)
{
	const int64_t nblk = (cols + ST_FP8_DEFAULT_BLOCK - 1) /
			     ST_FP8_DEFAULT_BLOCK;
	const struct st_store_tensor *s;
	char sname[300];

	snprintf(sname, sizeof(sname), "%s.scale", name);
	s = st_store_find_dense(m->store, sname);
	if ((uint64_t)(rows * cols) != t->n_bytes ||
	    t->offset + t->n_bytes > m->dense_len)
		return st_diag_set(diag, -ST_E_FORMAT, "tensor %s: %llu bytes "
				   "of FP8 do not match the config (%lld x "
				   "%lld)", name, (unsigned long long)t->n_bytes,
				   (long long)rows, (long long)cols);
	if (!s || s->dtype != ST_DTYPE_F32 ||
	    s->n_bytes != (uint64_t)(rows * nblk) * 4 ||
	    s->offset + s->n_bytes > m->dense_len)
		return st_diag_set(diag, -ST_E_FORMAT, "store %s: FP8 tensor %s "
				   "has no %s of %lld x %lld floats; re-run "
				   "strata convert", m->store->dir, name, sname,
				   (long long)rows, (long long)nblk);
	memset(ret_view, 0, sizeof(*ret_view));
	ret_view->dtype = ST_DTYPE_F8_E4M3;
	ret_view->data = m->dense_map + t->offset;
	ret_view->scales = m->dense_map + s->offset;
	ret_view->rows = rows;
	ret_view->cols = cols;
	ret_view->group = ST_FP8_DEFAULT_BLOCK;
	ret_view->scale_type = st_wformat_scale_type(ST_DTYPE_F8_E4M3);
	ret_view->global_scale = 1.0f;
	return 0;
}

static int bind_dense(struct cw_model *m, enum st_dense_role role, int layer,
		      int64_t rows, int64_t cols, struct cw_wview *ret_view,
		      const void **ret_vec, enum st_dtype *ret_dt,
		      struct st_diag *diag)
{
	const struct st_store_tensor *t;
	char name[256];
	int r = st_dense_tensor_name(&m->cfg, role, layer, name, sizeof(name));
	int64_t n = rows * (cols ? cols : 1);

	if (r < 0)
		return st_diag_set(diag, r, "no tensor name for role %d", role);
	t = st_store_find_dense(m->store, name);
	if (!t)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "store %s: dense tensor %s is missing; "
				   "re-run strata convert", m->store->dir, name);
	if (t->dtype == ST_DTYPE_F8_E4M3 && ret_view && cols)
		return bind_dense_fp8(m, t, name, rows, cols, ret_view, diag);
	if (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16)
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "tensor %s: dtype not F32/BF16", name);
	if ((uint64_t)n * (t->dtype == ST_DTYPE_F32 ? 4 : 2) != t->n_bytes ||
	    t->offset + t->n_bytes > m->dense_len)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "tensor %s: size %llu bytes does not match "
				   "the config (%lld x %lld)", name,
				   (unsigned long long)t->n_bytes,
				   (long long)rows, (long long)cols);
	if (ret_view) {
		ret_view->dtype = t->dtype;
		ret_view->data = m->dense_map + t->offset;
		ret_view->scales = NULL;
		ret_view->rows = rows;
		ret_view->cols = cols;
	}
	if (ret_vec)
		*ret_vec = m->dense_map + t->offset;
	if (ret_dt)
		*ret_dt = t->dtype;
	return 0;
}

/* Reads dense.bin into huge-page advised memory (st_hugemem.h: the
 * kernels stream it every token, and a page-cache mapping is in 4 KiB
 * pages, which the hardware prefetchers stop at). */
static int map_dense(struct cw_model *m, struct st_diag *diag)
{
	char path[4096];
	void *buf;
	int r;

	st_store_path(m->store, m->store->dense_file, path, sizeof(path));
	if (m->store->dense_bytes == 0)
		return st_diag_set(diag, -ST_E_FORMAT, "%s: empty; re-run "
				   "strata convert", path);
	r = st_hugemem_read_file(path, (size_t)m->store->dense_bytes, &buf,
				 diag);
	if (r < 0)
		return r;
	m->dense_map = buf;
	m->dense_len = (size_t)m->store->dense_bytes;
	return 0;
}

/* Every dense tensor's XXH3 against the manifest: a flipped bit in
 * dense.bin is refused at start instead of computing nonsense. */
static int verify_dense(struct cw_model *m, struct st_diag *diag)
{
	for (int i = 0; i < m->store->n_dense; i++) {
		const struct st_store_tensor *t = &m->store->dense[i];

		if (t->offset + t->n_bytes > m->dense_len)
			return st_diag_set(diag, -ST_E_FORMAT,
					   "store %s: tensor %s lies outside "
					   "dense.bin", m->store->dir, t->name);
		if (st_xxh3(m->dense_map + t->offset, t->n_bytes) != t->xxh3)
			return st_diag_set(diag, -ST_E_CHECKSUM,
					   "store %s: dense.bin tensor %s: "
					   "checksum mismatch; re-run strata "
					   "convert --force", m->store->dir,
					   t->name);
	}
	return 0;
}

static int bind_all(struct cw_model *m, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int64_t H = c->hidden_size, qd = (int64_t)c->n_heads * c->head_dim,
		      kvd = (int64_t)c->n_kv_heads * c->head_dim;
	int r;

	r = bind_dense(m, ST_T_EMBED, 0, c->vocab_size, H, &m->embed, NULL,
		       NULL, diag);
	if (!r)
		r = bind_dense(m, ST_T_LM_HEAD, 0, c->vocab_size, H, &m->lm_head,
			       NULL, NULL, diag);
	if (!r)
		r = bind_dense(m, ST_T_FINAL_NORM, 0, H, 0, NULL, &m->final_norm,
			       &m->final_norm_dt, diag);
	m->layers = calloc((size_t)c->n_layers, sizeof(*m->layers));
	if (!m->layers)
		return -ENOMEM;
	for (int l = 0; !r && l < c->n_layers; l++) {
		struct cw_layer_w *L = &m->layers[l];

		r = bind_dense(m, ST_T_ATTN_NORM, l, H, 0, NULL, &L->attn_norm,
			       &L->attn_norm_dt, diag);
		if (!r)
			r = bind_dense(m, ST_T_FFN_NORM, l, H, 0, NULL,
				       &L->ffn_norm, &L->ffn_norm_dt, diag);
		if (!r)
			r = bind_dense(m, ST_T_Q, l, qd, H, &L->q, NULL, NULL,
				       diag);
		if (!r)
			r = bind_dense(m, ST_T_K, l, kvd, H, &L->k, NULL, NULL,
				       diag);
		if (!r)
			r = bind_dense(m, ST_T_V, l, kvd, H, &L->v, NULL, NULL,
				       diag);
		if (!r)
			r = bind_dense(m, ST_T_O, l, H, qd, &L->o, NULL, NULL,
				       diag);
		if (!r)
			r = bind_dense(m, ST_T_ROUTER, l, c->n_experts, H,
				       &L->router, NULL, NULL, diag);
		if (!r && c->qkv_bias) {
			r = bind_dense(m, ST_T_Q_BIAS, l, qd, 0, NULL,
				       &L->q_bias, &L->q_bias_dt, diag);
			if (!r)
				r = bind_dense(m, ST_T_K_BIAS, l, kvd, 0, NULL,
					       &L->k_bias, &L->k_bias_dt, diag);
			if (!r)
				r = bind_dense(m, ST_T_V_BIAS, l, kvd, 0, NULL,
					       &L->v_bias, &L->v_bias_dt, diag);
		}
		if (!r && c->shared_inter) {
			const int64_t S = c->shared_inter;

			r = bind_dense(m, ST_T_SHEXP_GATE, l, S, H,
				       &L->sh[ST_EXPERT_GATE], NULL, NULL, diag);
			if (!r)
				r = bind_dense(m, ST_T_SHEXP_UP, l, S, H,
					       &L->sh[ST_EXPERT_UP], NULL, NULL,
					       diag);
			if (!r)
				r = bind_dense(m, ST_T_SHEXP_DOWN, l, H, S,
					       &L->sh[ST_EXPERT_DOWN], NULL,
					       NULL, diag);
			if (!r && c->shared_gate)
				r = bind_dense(m, ST_T_SHEXP_SCORE, l, 1, H,
					       &L->sh_score, NULL, NULL, diag);
		}
		if (!r && c->qk_norm) {
			r = bind_dense(m, ST_T_Q_NORM, l, c->head_dim, 0, NULL,
				       &L->q_norm, &L->q_norm_dt, diag);
			if (!r)
				r = bind_dense(m, ST_T_K_NORM, l, c->head_dim,
					       0, NULL, &L->k_norm,
					       &L->k_norm_dt, diag);
		}
	}
	return r;
}

static void kscratch_free(struct cw_kscratch *k)
{
	free(k->act_dense); free(k->views); free(k->act_tok);
	free(k->act_pair); free(k->tact); free(k->pact); free(k->g);
	free(k->u); free(k->a); free(k->pairs);
	free(k->act_mm); free(k->mact);
	memset(k, 0, sizeof(*k));
}

/* The scratch that does not depend on the token count. */
static int kscratch_init(struct cw_model *m)
{
	const struct st_model_config *c = &m->cfg;
	int64_t maxdim = ST_MAX(ST_MAX((int64_t)c->hidden_size,
				       (int64_t)c->n_heads * c->head_dim),
				ST_MAX((int64_t)c->expert_inter,
				       (int64_t)c->shared_inter));
	struct cw_kscratch *k = &m->ks;

	k->act_stride = (ST_MAX(m->be->act_bytes(maxdim), (size_t)1) + 63) &
			~(size_t)63;
	k->act_dense = aligned_alloc(64, k->act_stride);
	k->views = calloc((size_t)c->n_experts * 3, sizeof(*k->views));
	return k->act_dense && k->views ? 0 : -ENOMEM;
}

/* Grows the per-pair scratch to n tokens (n * top_k pairs). */
static int kscratch_grow(struct cw_model *m, int n)
{
	const struct st_model_config *c = &m->cfg;
	struct cw_kscratch *k = &m->ks;
	const size_t P = (size_t)n * (size_t)c->top_k,
		     I = (size_t)c->expert_inter;

	if ((int)P <= k->cap)
		return 0;
	free(k->act_tok); free(k->act_pair); free(k->tact); free(k->pact);
	free(k->g); free(k->u); free(k->a); free(k->pairs);
	k->act_tok = aligned_alloc(64, k->act_stride * (size_t)n);
	k->act_pair = aligned_alloc(64, k->act_stride * P);
	k->tact = calloc((size_t)n, sizeof(*k->tact));
	k->pact = calloc(P, sizeof(*k->pact));
	k->g = malloc(sizeof(float) * P * I);
	k->u = malloc(sizeof(float) * P * I);
	k->a = malloc(sizeof(float) * P * I);
	k->pairs = malloc(sizeof(int) * P);
	if (!k->act_tok || !k->act_pair || !k->tact || !k->pact || !k->g ||
	    !k->u || !k->a || !k->pairs) {
		k->cap = 0;
		return -ENOMEM;
	}
	k->cap = (int)P;
	return 0;
}

int cw_model_open(const char *store_dir, struct es_client *es,
		  struct kv_client *kv, const struct cw_model_opts *opts,
		  struct cw_model **ret, struct st_diag *diag)
{
	struct cw_model *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	m->be = cw_backend_for(opts->compute);
	m->es = es;
	m->kv = kv;
	m->opts = *opts;
	if (!m->opts.page_rows)
		m->opts.page_rows = 16;
	if (m->opts.kv_dtype != ST_DTYPE_F32 && m->opts.kv_dtype != ST_DTYPE_F16 &&
	    m->opts.kv_dtype != ST_DTYPE_BF16 &&
	    m->opts.kv_dtype != ST_DTYPE_F8_E4M3) {
		free(m);
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "KV dtype must be f32, f16, bf16 or fp8");
	}
	r = st_store_open(store_dir, &m->store, diag);
	if (r < 0) {
		free(m);
		return r;
	}
	m->cfg = m->store->cfg;
	if (m->store->is_dsv4 || m->store->is_dsv41) {
		/* V4, V4.1: their own forward passes behind this interface */
		r = cw_dsvserve_open(m->store->is_dsv41 ? CW_DSV_REV_V41 :
							  CW_DSV_REV_V4,
				     store_dir, es, kv, &m->opts, &m->dsv, diag);
		if (r < 0) {
			cw_model_close(m);
			return r;
		}
		*ret = m;
		return 0;
	}
	if (m->cfg.n_experts > CW_MAX_EXPERTS ||
		 m->cfg.top_k > m->cfg.n_experts)
		r = st_diag_set(diag, -ST_E_UNSUPPORTED,
				"%d experts: computed supports at most %d",
				m->cfg.n_experts, CW_MAX_EXPERTS);
	else if (m->opts.n_threads > 1 &&
		 (r = cw_threads_create(m->opts.n_threads, &m->pool)) < 0)
		st_diag_set(diag, r, "cannot start %d threads",
			    m->opts.n_threads);
	if (!r)
		r = map_dense(m, diag);
	if (!r) {
		uint64_t db = 0;
		long long huge = 0;
		int adv = cw_model_dense_pages(m, &db, &huge);
		const char *why = adv == 0 ? st_hugemem_why_not(db) : NULL;

		st_info("dense weights: %.1f MiB, %s%s%s (%.1f MiB in huge "
			"pages)", (double)db / 1048576.0,
			adv == 1 ? "huge pages advised" :
			adv == 0 ? "4 KiB pages" : "page size unknown",
			why ? ": " : "", why ? why : "",
			(double)huge / 1048576.0);
		r = verify_dense(m, diag);
	}
	if (!r)
		r = bind_all(m, diag);
	if (!r && kscratch_init(m) < 0)
		r = st_diag_set(diag, -ENOMEM, "out of memory for kernels' "
				"scratch");
	if (!r && es) {
		if (es_client_n_layers(es) != m->cfg.n_layers ||
		    es_client_n_experts(es) != m->cfg.n_experts ||
		    es_client_record_bytes(es) != m->store->record_bytes)
			r = st_diag_set(diag, -ST_E_CONFIG,
					"expertd serves a different store "
					"(geometry differs from %s)", store_dir);
		else if (es_client_n_slots(es) < m->cfg.top_k)
			r = st_diag_set(diag, -ST_E_BUDGET,
					"expertd's host pool holds %d experts, "
					"fewer than one layer's top-k (%d)",
					es_client_n_slots(es), m->cfg.top_k);
	}
	if (!r && cw_kvrow_init(&m->kvf, m->opts.kv_dtype, m->cfg.n_kv_heads,
				m->cfg.head_dim) < 0)
		r = st_diag_set(diag, -ST_E_CONFIG, "bad KV row geometry");
	m->kv_row_bytes = (uint32_t)cw_kvrow_bytes(&m->kvf);
	if (!r && kv) {
		struct kv_stream_decl *decl =
			calloc((size_t)m->cfg.n_layers, sizeof(*decl));
		struct {
			uint64_t store;
			uint32_t kv_dtype, page_rows;
		} id = { 0 };

		/* the prefix-cache model id: the same pages are reusable
		 * only for the same weights (the store's manifest lists the
		 * xxh3 of each, with or without expertd), row format and
		 * page size */
		uint64_t weights = 0;

		r = st_store_id(m->store, &weights, diag);
		id.store = st_xxh3(m->store->config_json,
				   strlen(m->store->config_json)) ^ weights;
		id.kv_dtype = (uint32_t)m->opts.kv_dtype;
		id.page_rows = m->opts.page_rows;
		m->kv_model_id = st_xxh3(&id, sizeof(id)) | 1;
		if (r < 0) {
			free(decl);
		} else if (!decl) {
			r = -ENOMEM;
		} else {
			for (int l = 0; l < m->cfg.n_layers; l++) {
				decl[l].row_bytes = m->kv_row_bytes;
				decl[l].tokens_per_row = 1;
			}
			r = kv_client_declare_model(kv, m->cfg.n_layers, decl,
						    m->opts.page_rows,
						    m->kv_model_id, diag);
			free(decl);
		}
	}
	if (r < 0) {
		cw_model_close(m);
		return r;
	}
	*ret = m;
	return 0;
}

static void free_scratch(struct cw_model *m)
{
	free(m->x); free(m->xn); free(m->q); free(m->kbuf); free(m->vbuf);
	free(m->att); free(m->scores); free(m->att_kv); free(m->tmp);
	free(m->rlogits);
	m->att_kv = NULL;
	free(m->rowp);
	m->rowp = NULL;
	free(m->rweights); free(m->moe_out); free(m->eg); free(m->eu);
	free(m->ea); free(m->ey); free(m->rexperts);
	free(m->probe_xn); free(m->probe_logits);
	m->probe_xn = m->probe_logits = NULL;
	free(m->mx_in); free(m->mx_out);
	m->mx_in = NULL;
	m->mx_out = NULL;
	m->x = m->xn = m->q = m->kbuf = m->vbuf = m->att = m->scores = NULL;
	m->tmp = m->rlogits = m->rweights = m->moe_out = NULL;
	m->eg = m->eu = m->ea = m->ey = NULL;
	m->rexperts = NULL;
	m->cap_tokens = 0;
	free(m->shx.g); free(m->shx.u); free(m->shx.a); free(m->shx.out);
	memset(&m->shx, 0, sizeof(m->shx));
}

void cw_model_close(struct cw_model *m)
{
	if (!m)
		return;
	cw_dsvserve_close(m->dsv);
	free_scratch(m);
	kscratch_free(&m->ks);
	cw_threads_destroy(m->pool);
	free(m->layers);
	st_hugemem_free(m->dense_map, m->dense_len);
	st_store_close(m->store);
	free(m);
}

const struct st_model_config *cw_model_config(const struct cw_model *m)
{
	return &m->cfg;
}

const struct st_store *cw_model_store(const struct cw_model *m)
{
	return m->store;
}

void cw_model_set_route_fn(struct cw_model *m, cw_route_fn fn, void *arg)
{
	m->route_fn = fn;
	m->route_arg = arg;
}

void cw_model_set_route_hooks(struct cw_model *m,
			      const struct cw_route_hooks *hooks)
{
	if (hooks)
		m->hooks = *hooks;
	else
		memset(&m->hooks, 0, sizeof(m->hooks));
}

int cw_model_route_probe(struct cw_model *m, int layer, const float *h,
			 int *ret_experts)
{
	const struct st_model_config *c = &m->cfg;
	const struct cw_layer_w *L;

	if (layer < 0 || layer >= c->n_layers || m->dsv)
		return -EINVAL;
	L = &m->layers[layer];
	if (!m->probe_xn) {
		m->probe_xn = malloc(sizeof(float) * (size_t)c->hidden_size);
		m->probe_logits = malloc(sizeof(float) * (size_t)c->n_experts);
		if (!m->probe_xn || !m->probe_logits)
			return -ENOMEM;
	}
	m->be->rmsnorm(h, L->ffn_norm, L->ffn_norm_dt, c->hidden_size,
		       c->rms_norm_eps, m->probe_xn);
	matvec(m, &L->router, m->probe_xn, m->probe_logits);
	return cw_route_topk(m->probe_logits, c->n_experts, c->top_k,
			     c->norm_topk_prob, ret_experts, m->probe_w);
}

void cw_model_set_expert_fn(struct cw_model *m, cw_expert_fn fn,
			    cw_expert_sync_fn sync, void *arg)
{
	m->expert_fn = fn;
	m->expert_sync = fn ? sync : NULL;
	m->expert_arg = arg;
}

void cw_model_set_expert_overlap(struct cw_model *m, int on)
{
	m->no_expert_overlap = !on;
	if (m->dsv)
		cw_dsvserve_set_expert_overlap(m->dsv, on);
}

void cw_model_set_kvdev(struct cw_model *m, struct cw_kvdev *kvdev,
			void *stream, cw_attn_fn attn, void *arg)
{
	m->kvdev = kvdev;
	m->kvdev_stream = kvdev ? stream : NULL;
	m->attn_fn = kvdev ? attn : NULL;
	m->attn_arg = kvdev ? arg : NULL;
	m->kvdev_failing = 0;
	m->kvdecl.row_bytes = m->kv_row_bytes;
	m->kvdecl.tokens_per_row = 1;
}

void cw_model_set_act_fn(struct cw_model *m, cw_act_fn fn, void *arg)
{
	m->act_fn = fn;
	m->act_arg = arg;
}

void cw_model_read_stats(const struct cw_model *m, struct cw_read_stats *ret)
{
	if (m->dsv)
		cw_dsvserve_read_stats(m->dsv, ret);
	else
		*ret = m->rs;
}

int cw_model_is_dsv4(const struct cw_model *m)
{
	return m->dsv != NULL;
}

int cw_model_is_dsv41(const struct cw_model *m)
{
	return m->dsv != NULL && m->store->is_dsv41;
}

const char *cw_model_dsv_math(const struct cw_model *m)
{
	return m->dsv ? cw_dsvserve_math(m->dsv) : NULL;
}

int cw_model_set_dsv_prefetch_depth(struct cw_model *m, int depth)
{
	if (m->dsv)
		return cw_dsvserve_set_prefetch_depth(m->dsv, depth);
	return -ST_E_UNSUPPORTED;
}

int cw_model_seq_begin(struct cw_model *m, uint32_t seq, int max_tokens,
		       struct st_diag *diag)
{
	return m->dsv ? cw_dsvserve_seq_begin(m->dsv, seq, max_tokens, diag) :
			0;
}

void cw_model_seq_end(struct cw_model *m, uint32_t seq)
{
	if (m->dsv)
		cw_dsvserve_seq_end(m->dsv, seq);
}

int cw_model_seq_create(struct cw_model *m, struct kv_client *kv,
			const int32_t *prompt, int n_prompt, int prefix_cache,
			uint32_t publish_flags, int max_tokens,
			uint32_t *ret_seq, uint32_t *ret_cached,
			struct st_diag *diag)
{
	int r;

	*ret_cached = 0;
	if (m->dsv)
		return cw_dsvserve_seq_create(m->dsv, prompt, n_prompt,
					      prefix_cache, publish_flags,
					      ret_seq, ret_cached, diag);
	if (prefix_cache && n_prompt > 0)
		r = kv_client_seq_create_prefix(kv, prompt, (uint32_t)n_prompt,
						ret_seq, ret_cached, diag);
	else
		r = kv_client_seq_create(kv, ret_seq, diag);
	if (r < 0)
		return r;
	r = cw_model_seq_begin(m, *ret_seq, max_tokens, diag);
	if (r < 0)
		kv_client_seq_free(kv, *ret_seq);
	return r;
}

int cw_model_can_verify_drafts(const struct cw_model *m)
{
	return !m->dsv || cw_dsvserve_can_truncate(m->dsv);
}

int cw_model_seq_truncate(struct cw_model *m, struct kv_client *kv,
			  uint32_t seq, uint32_t n_rows, struct st_diag *diag)
{
	/* a V4 kvd state cuts its kvd sequence itself; a process-local one
	 * has no rows in kvd */
	if (m->dsv)
		return cw_dsvserve_seq_truncate(m->dsv, seq, (int)n_rows, diag);
	return kv_client_seq_truncate(kv, seq, n_rows, diag);
}

int cw_model_has_mtp(const struct cw_model *m)
{
	return m->dsv && cw_dsvserve_has_mtp(m->dsv);
}

int cw_model_seq_mtp_follow(struct cw_model *m, uint32_t seq,
			    struct st_diag *diag)
{
	if (!cw_model_has_mtp(m))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "--speculate mtp: the store has no MTP block to draft with (a DeepSeek-V4 checkpoint's mtp.0.*, kept by strata convert, has one); use ngram or auto");
	return cw_dsvserve_seq_mtp_follow(m->dsv, seq, diag);
}

int cw_model_seq_mtp_draft(struct cw_model *m, uint32_t seq, int32_t next,
			   int k, int32_t *out, struct st_diag *diag)
{
	if (!cw_model_has_mtp(m))
		return st_diag_set(diag, -ST_E_UNSUPPORTED,
				   "the store has no MTP block to draft with");
	return cw_dsvserve_seq_mtp_draft(m->dsv, seq, next, k, out, diag);
}

int cw_model_seq_publish_lag(struct cw_model *m, uint32_t seq, int lag,
			     struct st_diag *diag)
{
	return m->dsv ? cw_dsvserve_seq_publish_lag(m->dsv, seq, lag, diag) :
			0;
}

void cw_model_seq_destroy(struct cw_model *m, struct kv_client *kv,
			  uint32_t seq)
{
	if (m->dsv && cw_dsvserve_seq_end(m->dsv, seq))
		return; /* its state freed the kvd sequence */
	kv_client_seq_free(kv, seq);
}

void cw_model_kv_bytes_per_token(const struct cw_model *m, uint64_t *ret_layout,
				 uint64_t *ret_formula)
{
	const uint64_t elt = m->opts.kv_dtype == ST_DTYPE_F32 ? 4 :
			     m->opts.kv_dtype == ST_DTYPE_F8_E4M3 ? 1 : 2;

	if (m->dsv) {
		/* the revision's growing KV (V4: F32 streams; V4.1: its
		 * storage formats); no textbook K/V formula (0 says so) */
		*ret_layout = cw_dsvserve_kv_bytes_per_token(m->dsv);
		*ret_formula = 0;
		return;
	}
	*ret_layout = (uint64_t)m->kv_row_bytes * (uint64_t)m->cfg.n_layers;
	*ret_formula = 2ull * (uint64_t)m->cfg.n_layers *
		       (uint64_t)m->cfg.n_kv_heads * (uint64_t)m->cfg.head_dim *
		       elt;
}

uint64_t cw_model_expert_bytes_layer(const struct cw_model *m, int layer)
{
	uint64_t b = 0;

	if (layer < 0 || layer >= m->store->n_layers)
		return 0;
	if (m->dsv)
		return cw_dsvserve_expert_bytes(m->dsv);
	for (int i = 0; i < 3; i++) {
		const struct st_store_matrix *mm = &m->store->layers[layer].mat[i];

		b += mm->data_bytes + mm->scale_bytes + mm->tscale_bytes;
	}
	return b;
}

uint64_t cw_model_expert_bytes(const struct cw_model *m)
{
	uint64_t b = 0;

	for (int l = 0; l < m->store->n_layers; l++)
		b += cw_model_expert_bytes_layer(m, l);
	return m->store->n_layers ? b / (uint64_t)m->store->n_layers : 0;
}

int cw_model_dense_pages(const struct cw_model *m, uint64_t *ret_bytes,
			 long long *ret_huge)
{
	long long huge;
	int adv, r;

	if (m->dsv || !m->dense_map)
		return -ENOTSUP;
	r = st_hugemem_state(m->dense_map, &adv, &huge);
	if (r < 0)
		return r;
	*ret_bytes = m->dense_len;
	*ret_huge = huge;
	return adv;
}

/* The attention of one token runs as this many tasks over the pool, each
 * a fixed range of heads (attend): a few per thread, so a thread the
 * scheduler delays does not hold the step up; 1 without a pool. */
static int attn_tasks(const struct cw_model *m)
{
	const int nt = cw_threads_count(m->pool);

	return nt > 1 ? ST_MIN(m->cfg.n_heads, 2 * nt) : 1;
}

static int grow_scratch(struct cw_model *m, int n)
{
	const struct st_model_config *c = &m->cfg;
	const size_t H = (size_t)c->hidden_size,
		     qd = (size_t)c->n_heads * c->head_dim,
		     kvd = (size_t)c->n_kv_heads * c->head_dim,
		     E = (size_t)c->n_experts, K = (size_t)c->top_k,
		     I = (size_t)c->expert_inter;
	size_t maxdim;

	if (n <= m->cap_tokens)
		return 0;
	free_scratch(m);
	maxdim = ST_MAX(H, qd);
	m->x = malloc(sizeof(float) * n * H);
	m->xn = malloc(sizeof(float) * n * H);
	m->q = malloc(sizeof(float) * n * qd);
	m->kbuf = malloc(sizeof(float) * n * kvd);
	m->vbuf = malloc(sizeof(float) * n * kvd);
	m->att = malloc(sizeof(float) * n * qd);
	/* one score row and one K/V head row per attention task */
	m->att_tasks = attn_tasks(m);
	m->scores = malloc(sizeof(float) * (size_t)m->att_tasks *
			   ((size_t)c->max_position_embeddings + 1));
	m->att_kv = malloc(sizeof(float) * (size_t)m->att_tasks *
			   (size_t)c->head_dim);
	m->rowp = malloc(sizeof(*m->rowp) * ((size_t)c->max_position_embeddings + 1));
	m->tmp = malloc(sizeof(float) * maxdim);
	m->rlogits = malloc(sizeof(float) * E);
	m->rweights = malloc(sizeof(float) * n * K);
	m->rexperts = malloc(sizeof(int) * n * K);
	m->moe_out = malloc(sizeof(float) * n * K * H);
	m->eg = malloc(sizeof(float) * I);
	m->eu = malloc(sizeof(float) * I);
	m->ea = malloc(sizeof(float) * I);
	m->ey = malloc(sizeof(float) * H);
	m->mx_in = malloc(sizeof(*m->mx_in) * n);
	m->mx_out = malloc(sizeof(*m->mx_out) * n);
	if (!m->mx_in || !m->mx_out) {
		free_scratch(m);
		return -ENOMEM;
	}
	if (!m->x || !m->xn || !m->q || !m->kbuf || !m->vbuf || !m->att ||
	    !m->scores || !m->att_kv || !m->rowp || !m->tmp || !m->rlogits ||
	    !m->rweights ||
	    !m->rexperts || !m->moe_out || !m->eg || !m->eu || !m->ea || !m->ey) {
		free_scratch(m);
		return -ENOMEM;
	}
	m->cap_tokens = n;
	return 0;
}

/* Row of a dense matrix (embedding) widened to float32. */
static void embed_row(const struct cw_wview *w, int64_t row, float *out)
{
	if (w->dtype == ST_DTYPE_F32)
		memcpy(out, (const float *)w->data + row * w->cols,
		       sizeof(float) * (size_t)w->cols);
	else
		st_convert_to_f32(ST_DTYPE_BF16,
				  (const uint16_t *)w->data + row * w->cols,
				  (size_t)w->cols, out);
}

struct matvec_job {
	const struct cw_backend_ops *be;
	const struct cw_wview *w;
	const struct cw_act *a;
	float *y;
};

/* Rows [r0, r1) of task `task` of n_tasks: equal shares, boundaries on
 * multiples of 16 rows (64 bytes of y: no two threads write one cache
 * line). */
static void task_rows(int64_t rows, int task, int n_tasks, int64_t *r0,
		      int64_t *r1)
{
	const int64_t units = (rows + 15) / 16;

	*r0 = ST_MIN(rows, units * task / n_tasks * 16);
	*r1 = ST_MIN(rows, units * (task + 1) / n_tasks * 16);
}

static void matvec_task(void *arg, int task, int n_tasks)
{
	const struct matvec_job *j = arg;
	int64_t r0, r1;

	task_rows(j->w->rows, task, n_tasks, &r0, &r1);
	if (r0 < r1)
		j->be->matvec_act(j->w, j->a, j->y, r0, r1);
}

/* y = W x, split by output rows over the thread pool when the matrix is
 * large enough to pay for it (each row is still one fixed reduction).  The
 * activations are prepared (fast mode: quantized) once for all tasks. */
static void matvec(struct cw_model *m, const struct cw_wview *w,
		   const float *x, float *y)
{
	struct cw_act a;
	struct matvec_job j = { m->be, w, &a, y };
	int n = cw_threads_count(m->pool);

	m->be->act_prepare(x, w->cols, w->dtype, m->ks.act_dense, &a);
	if (n > 1 && w->rows >= 64 && w->rows * w->cols >= (1 << 16))
		cw_threads_run(m->pool, matvec_task, &j, n * 4);
	else
		m->be->matvec_act(w, &a, y, 0, w->rows);
}

struct matvec_multi_job {
	const struct cw_backend_ops *be;
	const struct cw_wview *w;
	int n;                 /* tokens */
	const float *const *xs;
	float *const *ys;
	int64_t tile_rows;
	const struct cw_act *a; /* the n prepared vectors (backends with
				 * matmul_act), or NULL */
};

/* Prepares the n vectors xs (w->cols floats each) once for every tile of
 * matvec_multi into ks.act_mm; -ENOMEM, or -ERANGE where w is wider than
 * the scratch's vectors (the caller then uses the per-token path). */
static int mm_prepare(struct cw_model *m, const struct cw_wview *w, int n,
		      const float *const *xs)
{
	struct cw_kscratch *k = &m->ks;

	if (m->be->act_bytes(w->cols) > k->act_stride)
		return -ERANGE;
	if (n > k->mm_cap) {
		free(k->act_mm);
		free(k->mact);
		k->mm_cap = 0;
		k->act_mm = aligned_alloc(64, k->act_stride * (size_t)n);
		k->mact = calloc((size_t)n, sizeof(*k->mact));
		if (!k->act_mm || !k->mact)
			return -ENOMEM;
		k->mm_cap = n;
	}
	for (int t = 0; t < n; t++)
		m->be->act_prepare(xs[t], w->cols, w->dtype,
				   k->act_mm + (size_t)t * k->act_stride,
				   &k->mact[t]);
	return 0;
}

static void matvec_multi_task(void *arg, int task, int n_tasks)
{
	const struct matvec_multi_job *j = arg;
	int64_t r0 = j->tile_rows * task;
	int64_t r1 = ST_MIN(j->w->rows, r0 + j->tile_rows);

	(void)n_tasks;
	if (j->a) { /* one pass over the tile for every token */
		j->be->matmul_act(j->w, j->a, j->n, j->ys, r0, r1);
		return;
	}
	for (int t = 0; t < j->n; t++)
		j->be->matvec(j->w, j->xs[t], j->ys[t], r0, r1);
}

/* ys[t] = W xs[t] for the n tokens of a batched step, reading W once per
 * step: the rows go in tiles small enough to stay in cache while every
 * token's rows of that tile are computed (the decode-batching gain on the
 * dense weights and the LM head).  Each output element is the same
 * backend reduction as matvec(), so results are bit-identical to it. */
static void matvec_multi(struct cw_model *m, const struct cw_wview *w, int n,
			 const float *const *xs, float *const *ys)
{
	struct matvec_multi_job j = { m->be, w, n, xs, ys, 0, NULL };
	const int64_t row_bytes = (int64_t)(view_bytes(w) / (uint64_t)
					    ST_MAX(w->rows, 1));
	int64_t n_tiles;

	if (n == 1) {
		matvec(m, w, xs[0], ys[0]);
		return;
	}
	/* fast mode: each token's activations prepared once, not per tile
	 * (an allocation failure falls back to the per-token path) */
	if (m->be->matmul_act && mm_prepare(m, w, n, xs) == 0)
		j.a = m->ks.mact;
	/* about 128 KiB of weights per tile (L2), at least 16 rows */
	j.tile_rows = ST_MAX(16, (128 << 10) / ST_MAX(row_bytes, 1));
	n_tiles = (w->rows + j.tile_rows - 1) / j.tile_rows;
	if (cw_threads_count(m->pool) > 1 && n_tiles > 1)
		cw_threads_run(m->pool, matvec_multi_task, &j, (int)n_tiles);
	else
		for (int64_t i = 0; i < n_tiles; i++)
			matvec_multi_task(&j, (int)i, (int)n_tiles);
}

/* The step's device pages (cw_kvdev_acquire) for attention: entry
 * ent of the step, whose rows [0, n_dev) were asked for. */
struct kvdev_view {
	const struct cw_kvdev_step *st;
	uint32_t ent, n_dev;
};

/*
 * The addresses of rows 0..pos of the layer's stream of seq into rows[]:
 * a device page's (dev set, row below dev->n_dev, the page on the device;
 * on_dev[j] = 1 when on_dev is given) else the host row of kvd's pool.
 * Counts both kinds.  -ST_E_NOTFOUND when a host row has no page.
 */
static int attn_rows(struct cw_model *m, uint32_t seq, int layer,
		     uint32_t pos, const struct kvdev_view *dev,
		     const uint8_t **rows, uint8_t *on_dev,
		     struct st_diag *diag)
{
	uint32_t n_dev = 0;

	for (uint32_t j = 0; j <= pos; j++) {
		if (dev && j < dev->n_dev &&
		    cw_kvdev_rows(dev->st, dev->ent, (uint32_t)layer,
				  &m->kvdecl, j, 1, &rows[j]) == 0) {
			n_dev++;
			if (on_dev)
				on_dev[j] = 1;
			continue;
		}
		if (on_dev)
			on_dev[j] = 0;
		rows[j] = kv_client_row(m->kv, seq, layer, j);
		if (!rows[j])
			return st_diag_set(diag, -ST_E_NOTFOUND,
					   "KV row %u of layer %d has no page",
					   j, layer);
	}
	m->rs.attn_rows_device += n_dev;
	m->rs.attn_rows_host += pos + 1 - n_dev;
	return 0;
}

struct attn_job {
	struct cw_model *m;
	uint32_t pos;
	const float *q;
	float *out;
};

/* Heads [n_heads * task / n_tasks, n_heads * (task + 1) / n_tasks) of one
 * token's attention, with the task's own score and K/V rows.  Each head's
 * arithmetic (dot products in element order, softmax with a double sum,
 * weighted V sum in row order) does not depend on which task or thread
 * runs it, so the output is bit-identical for any thread count. */
static void attend_task(void *arg, int task, int n_tasks)
{
	const struct attn_job *j = arg;
	struct cw_model *m = j->m;
	const struct st_model_config *c = &m->cfg;
	const int hd = c->head_dim;
	const int group = c->n_heads / c->n_kv_heads;
	const float scale = 1.0f / sqrtf((float)hd);
	const uint32_t pos = j->pos;
	float *sc = m->scores +
		    (size_t)task * ((size_t)c->max_position_embeddings + 1);
	float *kv = m->att_kv + (size_t)task * hd; /* one head's K or V row */
	const int h0 = c->n_heads * task / n_tasks,
		  h1 = c->n_heads * (task + 1) / n_tasks;

	for (int h = h0; h < h1; h++) {
		const int kvh = h / group; /* GQA: MODEL_FAMILIES.md 0.7 */
		const float *qh = j->q + (size_t)h * hd;
		float *oh = j->out + (size_t)h * hd;
		float mx = -INFINITY;
		double sum = 0.0;

		for (uint32_t r = 0; r <= pos; r++) {
			float d = 0.0f;

			cw_kvrow_read_head(&m->kvf, m->rowp[r], 0, kvh, kv);
			for (int i = 0; i < hd; i++)
				d += qh[i] * kv[i];
			sc[r] = d * scale;
			if (sc[r] > mx)
				mx = sc[r];
		}
		for (uint32_t r = 0; r <= pos; r++) {
			sc[r] = expf(sc[r] - mx);
			sum += sc[r];
		}
		for (int i = 0; i < hd; i++)
			oh[i] = 0.0f;
		for (uint32_t r = 0; r <= pos; r++) {
			const float p = (float)(sc[r] / sum);

			cw_kvrow_read_head(&m->kvf, m->rowp[r], 1, kvh, kv);
			for (int i = 0; i < hd; i++)
				oh[i] += p * kv[i];
		}
	}
}

/*
 * Attention of one query position over rows 0..pos of the layer's stream;
 * with dev set (the fake device: device addresses readable by the CPU)
 * the rows of device pages are read there, the same bytes as the host's.
 * The heads are split over the pool (attend_task) from
 * CW_ATTN_SPLIT_ROWS rows on (below, a job costs more than it saves).
 */
#define CW_ATTN_SPLIT_ROWS 32

static int attend(struct cw_model *m, uint32_t seq, int layer, uint32_t pos,
		  const struct kvdev_view *dev, const float *q, float *out,
		  struct st_diag *diag)
{
	struct attn_job j = { m, pos, q, out };
	int r;

	/* the rows' addresses once for every head (page-table lookups) */
	r = attn_rows(m, seq, layer, pos, dev, m->rowp, NULL, diag);
	if (r < 0)
		return r;
	if (m->att_tasks > 1 && pos + 1 >= CW_ATTN_SPLIT_ROWS)
		cw_threads_run(m->pool, attend_task, &j, m->att_tasks);
	else
		for (int t = 0; t < m->att_tasks; t++)
			attend_task(&j, t, m->att_tasks);
	return 0;
}

/* Views of the three matrices of an expert record of layer `layer`, in
 * that layer's formats (st_store_layer; layers may differ).  The NVFP4
 * tensor scale is read from the record (float32, multiplying form). */
static void expert_views(const struct cw_model *m, int layer,
			 const uint8_t *rec, struct cw_wview ret[3])
{
	for (int i = 0; i < 3; i++) {
		const struct st_store_matrix *mm =
			&m->store->layers[layer].mat[i];

		memset(&ret[i], 0, sizeof(ret[i]));
		ret[i].dtype = mm->fmt.dtype;
		ret[i].data = rec + mm->data_offset;
		ret[i].scales = mm->scale_bytes ? rec + mm->scale_offset : NULL;
		ret[i].rows = mm->rows;
		ret[i].cols = mm->cols;
		ret[i].group = mm->fmt.group;
		ret[i].scale_type = st_wformat_scale_type(mm->fmt.dtype);
		ret[i].global_scale = 1.0f;
		ret[i].il_rows = mm->il_rows;
		if (mm->tscale_bytes)
			memcpy(&ret[i].global_scale, rec + mm->tscale_offset,
			       sizeof(float));
	}
}

/* One group of experts of a MoE layer, run as three pool jobs: gate and up
 * projections split by (expert, row block); SwiGLU and the activation
 * preparation per (token, k) pair; the down projection split by (expert,
 * row block).  Each task reads its row block of the expert's weights once
 * for all the tokens routed to that expert (a small-batch GEMM; the block
 * stays in cache between tokens), and each output element is still the
 * backend's one fixed reduction: results equal separate matvecs bit for bit
 * in reference mode, whatever the batch or the thread count.  In fast mode
 * the tokens of an expert go through the backend's small-batch GEMM
 * (matmul_act), which gives each token the matvec kernel's result bit for
 * bit: fast mode is batch-invariant too. */
#define MOE_GU_ROWS 32   /* gate/up rows per task */
#define MOE_DOWN_ROWS 64 /* down rows per task */
#define MOE_MM 16        /* tokens per GEMM call (fast mode) */

struct moe_job {
	struct cw_model *m;
	const struct cw_wview *w;  /* gn x 3 views */
	const int *p0;             /* pairs of expert gi: ks.pairs[p0[gi] ..
				    * p0[gi + 1]) */
	int gn, tpe;               /* experts, tasks per expert */
	int K;
	int pb;                    /* the job's first pair: ks.pairs[pb] */
};

static void moe_gate_up_task(void *arg, int task, int n_tasks)
{
	const struct moe_job *j = arg;
	struct cw_model *m = j->m;
	const int gi = task / j->tpe, blk = task % j->tpe;
	const struct cw_wview *w = j->w + 3 * gi;
	const int64_t I = w[ST_EXPERT_GATE].rows;
	const int64_t r0 = (int64_t)blk * MOE_GU_ROWS,
		      r1 = ST_MIN(I, r0 + MOE_GU_ROWS);

	(void)n_tasks;
	if (m->be->matmul_act) {
		/* the expert's tokens MOE_MM at a time through the GEMM */
		for (int p1 = j->p0[gi]; p1 < j->p0[gi + 1]; p1 += MOE_MM) {
			struct cw_act a[MOE_MM];
			float *yg[MOE_MM], *yu[MOE_MM];
			const int nt = ST_MIN(MOE_MM, j->p0[gi + 1] - p1);

			for (int t = 0; t < nt; t++) {
				const int p = m->ks.pairs[p1 + t];

				a[t] = m->ks.tact[p / j->K];
				yg[t] = m->ks.g + (size_t)p * I;
				yu[t] = m->ks.u + (size_t)p * I;
			}
			m->be->matmul_act(&w[ST_EXPERT_GATE], a, nt, yg, r0, r1);
			m->be->matmul_act(&w[ST_EXPERT_UP], a, nt, yu, r0, r1);
		}
		return;
	}
	for (int pi = j->p0[gi]; pi < j->p0[gi + 1]; pi++) {
		const int p = m->ks.pairs[pi];
		const struct cw_act *a = &m->ks.tact[p / j->K];

		m->be->matvec_act(&w[ST_EXPERT_GATE], a,
				  m->ks.g + (size_t)p * I, r0, r1);
	}
	for (int pi = j->p0[gi]; pi < j->p0[gi + 1]; pi++) {
		const int p = m->ks.pairs[pi];
		const struct cw_act *a = &m->ks.tact[p / j->K];

		m->be->matvec_act(&w[ST_EXPERT_UP], a,
				  m->ks.u + (size_t)p * I, r0, r1);
	}
}

static void moe_act_task(void *arg, int task, int n_tasks)
{
	const struct moe_job *j = arg;
	struct cw_model *m = j->m;
	const int p = m->ks.pairs[j->pb + task];
	const size_t I = (size_t)m->cfg.expert_inter;

	(void)n_tasks;
	cw_swiglu(m->ks.g + p * I, m->ks.u + p * I, (int)I, m->ks.a + p * I);
	m->be->act_prepare(m->ks.a + p * I, (int64_t)I,
			   j->w[ST_EXPERT_DOWN].dtype, m->ks.act_pair + (size_t)p * m->ks.act_stride,
			   &m->ks.pact[p]);
}

static void moe_down_task(void *arg, int task, int n_tasks)
{
	const struct moe_job *j = arg;
	struct cw_model *m = j->m;
	const int gi = task / j->tpe, blk = task % j->tpe;
	const struct cw_wview *w = &j->w[3 * gi + ST_EXPERT_DOWN];
	const int64_t r0 = (int64_t)blk * MOE_DOWN_ROWS,
		      r1 = ST_MIN(w->rows, r0 + MOE_DOWN_ROWS);

	(void)n_tasks;
	if (m->be->matmul_act) {
		for (int p1 = j->p0[gi]; p1 < j->p0[gi + 1]; p1 += MOE_MM) {
			struct cw_act a[MOE_MM];
			float *y[MOE_MM];
			const int nt = ST_MIN(MOE_MM, j->p0[gi + 1] - p1);

			for (int t = 0; t < nt; t++) {
				const int p = m->ks.pairs[p1 + t];

				a[t] = m->ks.pact[p];
				y[t] = m->moe_out + (size_t)p * m->cfg.hidden_size;
			}
			m->be->matmul_act(w, a, nt, y, r0, r1);
		}
		return;
	}
	for (int pi = j->p0[gi]; pi < j->p0[gi + 1]; pi++) {
		const int p = m->ks.pairs[pi];

		m->be->matvec_act(w, &m->ks.pact[p],
				  m->moe_out + (size_t)p * m->cfg.hidden_size,
				  r0, r1);
	}
}

/* The device path of expert e (cw_expert_fn) for pairs ks.pairs[pb ..
 * pe): 1 when it computed their moe_out rows. */
static int dev_expert(struct cw_model *m, int layer, int e,
		      const uint8_t *rec, const struct cw_wview w[3], int pb,
		      int pe)
{
	const float *x[1024];
	float *out[1024];
	const int H = m->cfg.hidden_size, K = m->cfg.top_k;
	int n = pe - pb;

	if (n <= 0 || n > (int)(sizeof(x) / sizeof(x[0])))
		return 0;
	for (int i = 0; i < n; i++) {
		const int p = m->ks.pairs[pb + i];

		x[i] = m->xn + (size_t)(p / K) * H;
		out[i] = m->moe_out + (size_t)p * H;
	}
	return m->expert_fn(m->expert_arg, layer, e, rec, w, n, x, out) == 1;
}

/* The CPU passes (gate/up, SwiGLU, down) over the np pairs of job j:
 * ks.pairs[j->p0[gi] .. j->p0[gi + 1]) for each expert gi of the group,
 * ks.pairs[j->pb .. j->pb + np) in all. */
static void moe_cpu(struct cw_model *m, int layer, struct moe_job *j, int np)
{
	const int K = m->cfg.top_k, H = m->cfg.hidden_size;

	j->tpe = (int)((j->w[ST_EXPERT_GATE].rows + MOE_GU_ROWS - 1) /
		       MOE_GU_ROWS);
	cw_threads_run(m->pool, moe_gate_up_task, j, j->gn * j->tpe);
	/* tasks index ks.pairs[pb .. pb + np) */
	cw_threads_run(m->pool, moe_act_task, j, np);
	if (m->act_fn) /* calibration observer, one caller thread */
		for (int pi = j->pb; pi < j->pb + np; pi++) {
			const int p = m->ks.pairs[pi];

			m->act_fn(m->act_arg, layer, m->rexperts[p],
				  m->xn + (size_t)(p / K) * H, H,
				  m->ks.a + (size_t)p * m->cfg.expert_inter,
				  m->cfg.expert_inter);
		}
	j->tpe = (int)((j->w[ST_EXPERT_DOWN].rows + MOE_DOWN_ROWS - 1) /
		       MOE_DOWN_ROWS);
	cw_threads_run(m->pool, moe_down_task, j, j->gn * j->tpe);
}

/* Lists in ks.pairs the pairs of expert e (pair order) from *np on. */
static void expert_pairs(struct cw_model *m, int n, int e, int *np)
{
	for (int i = 0; i < n * m->cfg.top_k; i++)
		if (m->rexperts[i] == e)
			m->ks.pairs[(*np)++] = i;
}

/* One layer's experts computed one at a time as expertd hands each over
 * (es_client_acquire_each): the resident ones at once, the shared expert
 * while the misses load, each miss when its read completes.  Each expert
 * writes only its own pairs' moe_out rows, which the caller sums in top-k
 * order, so the result does not depend on the order of arrival. */
struct moe_each {
	struct cw_model *m;
	int layer, n;
	const int *p0;        /* [gn + 1]: expert gi's pairs ks.pairs[p0[gi] ..
			       * p0[gi + 1]) */
	int shared;           /* compute the shared expert at the misses */
	int shared_r;         /* its result: 0, 1 once done, or negative */
	struct st_diag *diag; /* shexp_layer's error */
	uint64_t fn_ns;       /* time computing in the calls */
	int n_done;           /* experts handed over so far */
	int n_before_idle;    /* of them when the misses' wait began */
};

static int shexp_layer(struct cw_model *m, int layer, int n,
		       struct st_diag *diag);

static void moe_each_fn(void *arg, int gi, const uint8_t *rec)
{
	struct moe_each *e = arg;
	struct cw_model *m = e->m;
	uint64_t t0 = st_now_ns();

	if (gi < 0) {
		e->n_before_idle = e->n_done;
		if (e->shared && e->shared_r == 0) {
			int r = shexp_layer(m, e->layer, e->n, e->diag);

			e->shared_r = r < 0 ? r : 1;
		}
	} else {
		struct cw_wview *w = m->ks.views + 3 * gi;
		struct moe_job j = { .m = m, .w = w, .p0 = e->p0 + gi,
				     .gn = 1, .K = m->cfg.top_k,
				     .pb = e->p0[gi] };

		expert_views(m, e->layer, rec, w);
		m->rs.expert_bytes += view_bytes(&w[0]) + view_bytes(&w[1]) +
				      view_bytes(&w[2]);
		moe_cpu(m, e->layer, &j, e->p0[gi + 1] - e->p0[gi]);
		e->n_done++;
	}
	e->fn_ns += st_now_ns() - t0;
}

/* Computes every (token, k) expert output of one layer into m->moe_out,
 * acquiring experts from expertd in groups that fit its pool.  Experts on
 * the device are queued there first (cw_expert_fn), the others computed
 * on the CPU meanwhile, then one cw_expert_sync_fn completes the group's
 * device experts (issue 10 overlap); if that fails they are computed on
 * the CPU as well. */
/* The n experts ids of layer from expertd: es_client_acquire into recs,
 * or with e es_client_acquire_each computing each through moe_each_fn;
 * retried every 1 ms, up to 2 s, while another client holds the pool's
 * pins (-ST_E_BUSY).  es_client_acquire(_each)'s result. */
static int acquire_retry(struct cw_model *m, int layer, int n,
			 const int *ids, const uint8_t **recs,
			 struct moe_each *e, struct st_diag *diag)
{
	int r;

	for (int tries = 0;; tries++) {
		if (e) {
			e->n_done = 0;
			r = es_client_acquire_each(m->es, layer, n, ids,
						   moe_each_fn, e, diag);
		} else {
			r = es_client_acquire(m->es, layer, n, ids, recs, diag);
		}
		if (r != -ST_E_BUSY || tries >= 2000)
			return r;
		st_sleep_ns(1000000); /* another client holds pins */
	}
}

static int moe_layer(struct cw_model *m, int layer, int n,
		     int *ret_shared_done, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int E = c->n_experts, K = c->top_k, H = c->hidden_size;
	int needed[CW_MAX_EXPERTS], n_needed = 0, group_max;
	int p0[CW_MAX_EXPERTS + 1];
	const uint8_t *recs[CW_MAX_EXPERTS];
	char used[CW_MAX_EXPERTS] = { 0 };
	char on_dev[CW_MAX_EXPERTS];
	int r = 0;

	r = kscratch_grow(m, n);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for %d tokens", n);
	for (int i = 0; i < n * K; i++)
		used[m->rexperts[i]] = 1;
	for (int e = 0; e < E; e++)
		if (used[e])
			needed[n_needed++] = e;
	for (int t = 0; t < n; t++)
		m->be->act_prepare(m->xn + (size_t)t * H, H,
				   m->store->layers[layer].mat[ST_EXPERT_GATE].fmt.dtype,
				   m->ks.act_tok + (size_t)t * m->ks.act_stride,
				   &m->ks.tact[t]);
	group_max = es_client_n_slots(m->es);
	if (group_max > n_needed)
		group_max = n_needed;
	*ret_shared_done = 0;
	if (!m->no_expert_overlap && !m->expert_fn && !m->act_fn &&
	    group_max == n_needed) {
		/* one group on the CPU: each expert as it comes */
		struct moe_each e = { .m = m, .layer = layer, .n = n,
				      .p0 = p0, .shared = m->cfg.shared_inter > 0,
				      .diag = diag };
		int np = 0;
		uint64_t t0;

		for (int gi = 0; gi < n_needed; gi++) {
			p0[gi] = np;
			expert_pairs(m, n, needed[gi], &np);
		}
		p0[n_needed] = np;
		t0 = st_now_ns();
		r = acquire_retry(m, layer, n_needed, needed, NULL, &e, diag);
		m->rs.expert_stall_ns += st_now_ns() - t0 - e.fn_ns;
		if (r < 0)
			return r;
		/* misses came after the wait began: all but the last expert
		 * were computed while one was still being read */
		if (e.n_before_idle < n_needed)
			m->rs.experts_early += (uint64_t)n_needed - 1;
		es_client_release(m->es, layer, n_needed, needed);
		if (e.shared_r < 0)
			return e.shared_r;
		*ret_shared_done = e.shared_r == 1;
		return 0;
	}
	for (int g0 = 0; g0 < n_needed; g0 += group_max) {
		int gn = ST_MIN(group_max, n_needed - g0), np = 0, n_dev = 0;
		uint64_t t0 = st_now_ns();
		struct moe_job j;

		r = acquire_retry(m, layer, gn, needed + g0, recs, NULL, diag);
		m->rs.expert_stall_ns += st_now_ns() - t0;
		if (r < 0)
			return r;
		/* the pairs routed to each expert of the group, in pair
		 * order; each expert's weights read once; device experts
		 * queued as they come */
		for (int gi = 0; gi < gn; gi++) {
			const int e = needed[g0 + gi];
			const int pb = np;

			expert_views(m, layer, recs[gi], m->ks.views + 3 * gi);
			p0[gi] = np;
			expert_pairs(m, n, e, &np);
			on_dev[gi] = m->expert_fn && !m->act_fn &&
				dev_expert(m, layer, e, recs[gi],
					   m->ks.views + 3 * gi, pb, np);
			if (on_dev[gi]) {
				np = pb; /* on the device: no CPU pairs */
				n_dev++;
				continue;
			}
			m->rs.expert_bytes += view_bytes(&m->ks.views[3 * gi]) +
				view_bytes(&m->ks.views[3 * gi + 1]) +
				view_bytes(&m->ks.views[3 * gi + 2]);
		}
		p0[gn] = np;
		if (n_dev) /* the group is complete: the device may start */
			m->expert_fn(m->expert_arg, layer, -1, NULL, NULL, 0,
				     NULL, NULL);
		j.m = m;
		j.w = m->ks.views;
		j.p0 = p0;
		j.gn = gn;
		j.K = K;
		j.pb = 0;
		moe_cpu(m, layer, &j, np);
		if (n_dev && m->expert_sync &&
		    m->expert_sync(m->expert_arg) < 0) {
			/* the device failed them: all of them on the CPU */
			np = 0;
			for (int gi = 0; gi < gn; gi++) {
				p0[gi] = np;
				if (!on_dev[gi])
					continue;
				expert_pairs(m, n, needed[g0 + gi], &np);
				m->rs.expert_bytes +=
					view_bytes(&m->ks.views[3 * gi]) +
					view_bytes(&m->ks.views[3 * gi + 1]) +
					view_bytes(&m->ks.views[3 * gi + 2]);
			}
			p0[gn] = np;
			moe_cpu(m, layer, &j, np);
		}
		es_client_release(m->es, layer, gn, needed + g0);
	}
	return 0;
}

/* y += b for a bias vector of n elements stored F32 or BF16 (widened
 * through m->tmp, which holds max(H, n_heads * head_dim) floats). */
static void add_bias(struct cw_model *m, const void *b, enum st_dtype dt,
		     int64_t n, float *y)
{
	const float *bf = b;

	if (dt != ST_DTYPE_F32) {
		st_convert_to_f32(dt, b, (size_t)n, m->tmp);
		bf = m->tmp;
	}
	for (int64_t i = 0; i < n; i++)
		y[i] += bf[i];
}

/*
 * The shared expert of layer `layer` for the n tokens of the step, after
 * moe_layer (MODEL_FAMILIES.md 3.3, Qwen2MoeSparseMoeBlock): from the
 * post-attention-normed xn of each token, s = down(silu(gate xn) * up xn),
 * scaled by sigmoid(w_sg . xn) when the family gates it; result in
 * m->shx.out [n x H], which the caller adds to the routed mixture.  The
 * weights are dense tensors (dense.bin), each read once per step.
 * Returns 0 or -ENOMEM with diag.
 */
static int shexp_layer(struct cw_model *m, int layer, int n,
		       struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const struct cw_layer_w *L = &m->layers[layer];
	const size_t H = (size_t)c->hidden_size, S = (size_t)c->shared_inter;
	struct cw_shexp_scratch *x = &m->shx;
	const float **xs = m->mx_in;
	float **ys = m->mx_out;

	if (n > x->cap) {
		free(x->g); free(x->u); free(x->a); free(x->out);
		x->g = malloc(sizeof(float) * (size_t)n * S);
		x->u = malloc(sizeof(float) * (size_t)n * S);
		x->a = malloc(sizeof(float) * (size_t)n * S);
		x->out = malloc(sizeof(float) * (size_t)n * H);
		x->cap = n;
		if (!x->g || !x->u || !x->a || !x->out) {
			x->cap = 0;
			return st_diag_set(diag, -ENOMEM, "out of memory for "
					   "the shared expert of %d tokens", n);
		}
	}
	for (int t = 0; t < n; t++) {
		xs[t] = m->xn + (size_t)t * H;
		ys[t] = x->g + (size_t)t * S;
	}
	matvec_multi(m, &L->sh[ST_EXPERT_GATE], n, xs, ys);
	for (int t = 0; t < n; t++)
		ys[t] = x->u + (size_t)t * S;
	matvec_multi(m, &L->sh[ST_EXPERT_UP], n, xs, ys);
	for (int t = 0; t < n; t++) {
		cw_swiglu(x->g + (size_t)t * S, x->u + (size_t)t * S, (int)S,
			  x->a + (size_t)t * S);
		xs[t] = x->a + (size_t)t * S;
		ys[t] = x->out + (size_t)t * H;
	}
	matvec_multi(m, &L->sh[ST_EXPERT_DOWN], n, xs, ys);
	m->rs.dense_bytes += view_bytes(&L->sh[0]) + view_bytes(&L->sh[1]) +
			     view_bytes(&L->sh[2]);
	if (!c->shared_gate)
		return 0;
	for (int t = 0; t < n; t++) {
		float *o = x->out + (size_t)t * H;
		float g;

		matvec(m, &L->sh_score, m->xn + (size_t)t * H, x->score);
		g = 1.0f / (1.0f + expf(-x->score[0]));
		for (size_t i = 0; i < H; i++)
			o[i] *= g;
	}
	m->rs.dense_bytes += (uint64_t)n * view_bytes(&L->sh_score);
	return 0;
}

/* The device KV pages of one step of cw_model_eval_batch. */
struct kvdev_stepctx {
	struct cw_kvdev_step st;
	int active;                      /* st acquired */
	struct kv_reserve_entry *ent;    /* [n] the step's sequences */
	uint32_t *tok_ent;               /* [n] each token's entry */
	/* the attention hook's arrays (attn_fn set) */
	const uint8_t **rows;            /* every token's rows, in order */
	uint8_t *on_dev;
	struct cw_attn_tok *at;          /* [n] */
};

static void kvdev_view_of(const struct kvdev_stepctx *k, int t,
			  struct kvdev_view *v)
{
	v->st = &k->st;
	v->ent = k->tok_ent[t];
	v->n_dev = k->ent[v->ent].n_rows;
}

/*
 * Before layer 0 of a step: device residency of rows [0, first position
 * of the step) of each sequence, every layer's stream, in one
 * cw_kvdev_acquire.  Any failure (out of memory, kvd restarting or not
 * holding the pool yet, another epoch, too many pages) leaves k inactive:
 * the step reads host rows (counted, warned once until it works again).
 */
static void kvdev_step_begin(struct cw_model *m,
			     const struct cw_batch_tok *toks, int n,
			     struct kvdev_stepctx *k)
{
	struct st_diag dg = { "" };
	uint64_t total = 0;
	int n_ent = 0, any = 0, r;

	memset(k, 0, sizeof(*k));
	k->ent = malloc(sizeof(*k->ent) * (size_t)n);
	k->tok_ent = malloc(sizeof(*k->tok_ent) * (size_t)n);
	if (!k->ent || !k->tok_ent)
		goto fail_nomem;
	for (int t = 0; t < n; t++) {
		int i = 0;

		while (i < n_ent && k->ent[i].seq != toks[t].seq)
			i++;
		if (i == n_ent) {
			k->ent[n_ent].seq = toks[t].seq;
			k->ent[n_ent++].n_rows = toks[t].pos;
		}
		k->ent[i].n_rows = ST_MIN(k->ent[i].n_rows, toks[t].pos);
		k->tok_ent[t] = (uint32_t)i;
		total += toks[t].pos + 1;
	}
	for (int i = 0; i < n_ent; i++)
		any |= k->ent[i].n_rows > 0;
	if (!any)
		return; /* nothing older than the step: host rows */
	if (m->attn_fn) {
		k->rows = malloc(sizeof(*k->rows) * total);
		k->on_dev = malloc(total);
		k->at = malloc(sizeof(*k->at) * (size_t)n);
		if (!k->rows || !k->on_dev || !k->at)
			goto fail_nomem;
	}
	r = cw_kvdev_acquire(m->kvdev, n_ent, k->ent, m->kvdev_stream, &k->st,
			     &dg);
	if (r < 0) {
		m->rs.kvdev_fails++;
		if (!m->kvdev_failing)
			st_warn("device KV pages not used: %s (attention "
				"reads the host rows until kvd places them "
				"again)", dg.msg);
		m->kvdev_failing = 1;
		return;
	}
	if (m->kvdev_failing)
		st_info("device KV pages in use again");
	m->kvdev_failing = 0;
	m->rs.kvdev_steps++;
	k->active = 1;
	return;
fail_nomem:
	m->rs.kvdev_fails++;
}

/* After the last layer: unpins the step's pages once the stream passed
 * the reads (cw_kvdev_release syncs it), frees the arrays. */
static void kvdev_step_end(struct cw_model *m, struct kvdev_stepctx *k)
{
	if (k->active)
		cw_kvdev_release(m->kvdev, &k->st, m->kvdev_stream);
	free(k->ent);
	free(k->tok_ent);
	free(k->rows);
	free(k->on_dev);
	free(k->at);
	memset(k, 0, sizeof(*k));
}

/*
 * The attention of every token of layer l through the device hook
 * (attn_fn), out[t] = m->att + t * qd.  0 done; 1 when the hook refused
 * (counted; the caller computes on the CPU from host rows); or the error
 * of a row without a page.
 */
static int attend_layer_dev(struct cw_model *m,
			    const struct cw_batch_tok *toks, int n, int l,
			    struct kvdev_stepctx *k, struct st_diag *diag)
{
	const size_t qd = (size_t)m->cfg.n_heads * m->cfg.head_dim;
	const uint64_t dev0 = m->rs.attn_rows_device,
		       host0 = m->rs.attn_rows_host;
	size_t off = 0;
	int r;

	for (int t = 0; t < n; t++) {
		struct kvdev_view v;

		kvdev_view_of(k, t, &v);
		r = attn_rows(m, toks[t].seq, l, toks[t].pos, &v,
			      k->rows + off, k->on_dev + off, diag);
		if (r < 0)
			return r;
		k->at[t].q = m->q + (size_t)t * qd;
		k->at[t].out = m->att + (size_t)t * qd;
		k->at[t].rows = k->rows + off;
		k->at[t].on_dev = k->on_dev + off;
		k->at[t].n_rows = toks[t].pos + 1;
		off += toks[t].pos + 1;
	}
	if (m->attn_fn(m->attn_arg, l, n, k->at) == 0)
		return 0;
	m->rs.attn_fn_fails++;
	m->rs.attn_rows_device = dev0;
	m->rs.attn_rows_host = host0;
	return 1;
}

int cw_model_eval_batch(struct cw_model *m, const struct cw_batch_tok *toks,
			int n, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int H = c->hidden_size, hd = c->head_dim;
	const size_t qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd;
	const int K = c->top_k;
	uint32_t *seqs, *want;
	const float **xs;
	float **ys;
	struct kvdev_stepctx kd;
	int n_seqs = 0;
	int r;

	if (n <= 0)
		return st_diag_set(diag, -EINVAL, "no tokens to evaluate");
	for (int t = 0; t < n; t++) {
		if ((uint64_t)toks[t].pos >= (uint64_t)c->max_position_embeddings)
			return st_diag_set(diag, -ST_E_LIMIT,
					   "sequence of %u tokens exceeds the "
					   "model's context of %d tokens",
					   toks[t].pos + 1,
					   c->max_position_embeddings);
		if (toks[t].id < 0 || toks[t].id >= c->vocab_size)
			return st_diag_set(diag, -EINVAL,
					   "token id %d outside the vocabulary "
					   "(%d rows)", toks[t].id, c->vocab_size);
	}
	if (m->dsv)
		return cw_dsvserve_eval_batch(m->dsv, toks, n, diag);
	r = grow_scratch(m, n);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for %d tokens", n);
	xs = m->mx_in;
	ys = m->mx_out;
	/* every sequence's rows up to its last position, in one request */
	seqs = malloc(sizeof(*seqs) * (size_t)n * 2);
	if (!seqs)
		return st_diag_set(diag, -ENOMEM, "out of memory for %d tokens",
				   n);
	want = seqs + n;
	for (int t = 0; t < n; t++) {
		int i = 0;

		while (i < n_seqs && seqs[i] != toks[t].seq)
			i++;
		if (i == n_seqs) {
			seqs[n_seqs] = toks[t].seq;
			want[n_seqs++] = 0;
		}
		want[i] = ST_MAX(want[i], toks[t].pos + 1);
	}
	cw_steptime_phase(m->tl, CW_PHASE_KV);
	r = kv_client_seq_reserve(m->kv, n_seqs, seqs, want, diag);
	cw_steptime_phase(m->tl, CW_PHASE_DENSE);
	free(seqs);
	if (r < 0) {
		cw_steptime_phase(m->tl, CW_PHASE_NONE);
		return r;
	}
	if (m->kvdev)
		kvdev_step_begin(m, toks, n, &kd);
	else
		memset(&kd, 0, sizeof(kd));

	for (int t = 0; t < n; t++) {
		embed_row(&m->embed, toks[t].id, m->x + (size_t)t * H);
		m->rs.dense_bytes += (uint64_t)H * (m->embed.dtype == ST_DTYPE_F32 ? 4 : 2);
	}
	for (int l = 0; l < c->n_layers; l++) {
		const struct cw_layer_w *L = &m->layers[l];
		int shared_done = 0; /* moe_layer computed the shared expert */

		cw_steptime_phase(m->tl, CW_PHASE_DENSE);
		/* attention: q, k, v for every token (each weight read
		 * once for the step), K/V rows into kvd */
		for (int t = 0; t < n; t++) {
			m->be->rmsnorm(m->x + (size_t)t * H, L->attn_norm,
				       L->attn_norm_dt, H, c->rms_norm_eps,
				       m->xn + (size_t)t * H);
			xs[t] = m->xn + (size_t)t * H;
			ys[t] = m->q + (size_t)t * qd;
		}
		matvec_multi(m, &L->q, n, xs, ys);
		for (int t = 0; t < n; t++)
			ys[t] = m->kbuf + (size_t)t * kvd;
		matvec_multi(m, &L->k, n, xs, ys);
		for (int t = 0; t < n; t++)
			ys[t] = m->vbuf + (size_t)t * kvd;
		matvec_multi(m, &L->v, n, xs, ys);
		if (L->q_bias)
			for (int t = 0; t < n; t++) {
				add_bias(m, L->q_bias, L->q_bias_dt, (int64_t)qd,
					 m->q + (size_t)t * qd);
				add_bias(m, L->k_bias, L->k_bias_dt, (int64_t)kvd,
					 m->kbuf + (size_t)t * kvd);
				add_bias(m, L->v_bias, L->v_bias_dt, (int64_t)kvd,
					 m->vbuf + (size_t)t * kvd);
			}
		for (int t = 0; t < n; t++) {
			float *q = m->q + (size_t)t * qd;
			float *k = m->kbuf + (size_t)t * kvd;
			float *v = m->vbuf + (size_t)t * kvd;
			uint8_t *row;

			if (c->qk_norm) {
				for (int h = 0; h < c->n_heads; h++)
					m->be->rmsnorm(q + (size_t)h * hd,
						       L->q_norm, L->q_norm_dt,
						       hd, c->rms_norm_eps,
						       q + (size_t)h * hd);
				for (int h = 0; h < c->n_kv_heads; h++)
					m->be->rmsnorm(k + (size_t)h * hd,
						       L->k_norm, L->k_norm_dt,
						       hd, c->rms_norm_eps,
						       k + (size_t)h * hd);
			}
			m->be->rope(q, c->n_heads, hd, (int)toks[t].pos,
				    c->rope_theta);
			m->be->rope(k, c->n_kv_heads, hd, (int)toks[t].pos,
				    c->rope_theta);
			row = kv_client_row_writable(m->kv, toks[t].seq, l,
						     toks[t].pos);
			if (!row) {
				r = st_diag_set(diag, -ST_E_NOTFOUND,
						"KV row %u of layer %d has "
						"no writable page (spilled, "
						"shared or missing)",
						toks[t].pos, l);
				goto out;
			}
			cw_kvrow_write(&m->kvf, row, k, v);
		}
		/* attention: rows older than the step from the device pages
		 * when the step has them (kd.active), the rest from host
		 * rows; through the device hook, or on the CPU */
		r = kd.active && m->attn_fn ?
			attend_layer_dev(m, toks, n, l, &kd, diag) : 1;
		if (r < 0)
			goto out;
		for (int t = 0; t < n; t++) {
			float *att = m->att + (size_t)t * qd;
			struct kvdev_view v;

			if (r == 1) {
				/* a hook's refusal reads host rows */
				if (kd.active && !m->attn_fn)
					kvdev_view_of(&kd, t, &v);
				r = attend(m, toks[t].seq, l, toks[t].pos,
					   kd.active && !m->attn_fn ? &v : NULL,
					   m->q + (size_t)t * qd, att, diag);
				if (r < 0)
					goto out;
				r = 1;
			}
			xs[t] = att;
			ys[t] = m->moe_out + (size_t)t * H; /* free until MoE */
		}
		matvec_multi(m, &L->o, n, xs, ys);
		for (int t = 0; t < n; t++)
			for (int i = 0; i < H; i++)
				m->x[(size_t)t * H + i] += ys[t][i];
		/* projections read once per step, the router per token */
		m->rs.dense_bytes += view_bytes(&L->q) + view_bytes(&L->k) +
			view_bytes(&L->v) + view_bytes(&L->o) +
			(uint64_t)n * view_bytes(&L->router);

		/* MoE: route every token, then the experts in pool-sized
		 * groups, then the weighted sum in top-k order */
		cw_steptime_phase(m->tl, CW_PHASE_EXPERTS);
		for (int t = 0; t < n; t++) {
			float *xn = m->xn + (size_t)t * H;

			m->be->rmsnorm(m->x + (size_t)t * H, L->ffn_norm,
				       L->ffn_norm_dt, H, c->rms_norm_eps, xn);
			matvec(m, &L->router, xn, m->rlogits);
			cw_route_topk(m->rlogits, c->n_experts, K,
				      c->norm_topk_prob,
				      m->rexperts + (size_t)t * K,
				      m->rweights + (size_t)t * K);
			if (m->hooks.force)
				m->hooks.force(m->hooks.arg, l, toks[t].pos,
					       m->rexperts + (size_t)t * K,
					       m->rweights + (size_t)t * K, K);
			if (m->route_fn)
				m->route_fn(m->route_arg, l, toks[t].pos,
					    m->rexperts + (size_t)t * K,
					    m->rweights + (size_t)t * K, K);
		}
		/* the look-ahead keys a step by its first position and
		 * numbers its tokens from there (exact for one sequence;
		 * for a multi-sequence step the hints still name the
		 * right experts, the oracle and the statistics' positions
		 * are approximate) */
		if (m->hooks.layer_routed)
			m->hooks.layer_routed(m->hooks.arg, m, l, toks[0].pos, n,
					      m->x, m->rexperts, K);
		r = moe_layer(m, l, n, &shared_done, diag);
		if (r < 0)
			goto out;
		if (c->shared_inter && !shared_done) {
			r = shexp_layer(m, l, n, diag);
			if (r < 0)
				goto out;
		}
		for (int t = 0; t < n; t++) {
			float *xt = m->x + (size_t)t * H;

			for (int i = 0; i < H; i++) {
				float acc = 0.0f;

				for (int k = 0; k < K; k++)
					acc += m->rweights[(size_t)t * K + k] *
					       m->moe_out[((size_t)t * K + k) * H + i];
				if (c->shared_inter) /* routed + g s */
					acc += m->shx.out[(size_t)t * H + i];
				xt[i] += acc;
			}
		}
	}
	cw_steptime_phase(m->tl, CW_PHASE_HEAD);
	{
		int n_out = 0;

		for (int t = 0; t < n; t++) {
			if (!toks[t].logits)
				continue;
			m->be->rmsnorm(m->x + (size_t)t * H, m->final_norm,
				       m->final_norm_dt, H, c->rms_norm_eps,
				       m->xn + (size_t)n_out * H);
			xs[n_out] = m->xn + (size_t)n_out * H;
			ys[n_out++] = toks[t].logits;
		}
		/* the LM head read once for every token that wants logits */
		if (n_out) {
			matvec_multi(m, &m->lm_head, n_out, xs, ys);
			m->rs.lm_head_bytes += view_bytes(&m->lm_head);
		}
	}
	m->rs.tokens += (uint64_t)n;
	r = 0;
out:
	kvdev_step_end(m, &kd);
	cw_steptime_phase(m->tl, CW_PHASE_NONE);
	return r;
}

void cw_model_set_steptime(struct cw_model *m, struct cw_steptime *tl)
{
	m->tl = tl;
}

int cw_model_eval(struct cw_model *m, uint32_t seq, uint32_t pos0,
		  const int32_t *ids, int n, float *ret_logits_all,
		  float *ret_logits_last, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	struct cw_batch_tok *toks;
	int r;

	if (n <= 0)
		return st_diag_set(diag, -EINVAL, "no tokens to evaluate");
	if ((uint64_t)pos0 + (uint64_t)n > (uint64_t)c->max_position_embeddings)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "sequence of %u tokens exceeds the model's "
				   "context of %d tokens", pos0 + (uint32_t)n,
				   c->max_position_embeddings);
	toks = malloc(sizeof(*toks) * (size_t)n);
	if (!toks)
		return st_diag_set(diag, -ENOMEM, "out of memory for %d tokens",
				   n);
	for (int t = 0; t < n; t++) {
		toks[t].seq = seq;
		toks[t].pos = pos0 + (uint32_t)t;
		toks[t].id = ids[t];
		toks[t].logits = ret_logits_all ?
			ret_logits_all + (size_t)t * c->vocab_size :
			t == n - 1 ? ret_logits_last : NULL;
	}
	r = cw_model_eval_batch(m, toks, n, diag);
	free(toks);
	return r;
}
