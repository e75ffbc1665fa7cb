/*
 * cw_model.c — forward pass of the Mixtral / Qwen3-MoE decoder on the CPU
 * backend, with experts from expertd's host pool and K/V rows in kvd pages.
 *
 * Per layer (MODEL_FAMILIES.md 0.2): h = x + Attn(RMSNorm_in(x)),
 * out = h + MoE(RMSNorm_post(h)); then RMSNorm_final and lm_head.
 */
#include "cw_model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cw_kvrow.h"
#include "cw_router.h"
#include "cw_threads.h"
#include "st_formats.h"
#include "st_util.h"

struct cw_layer_w {
	struct cw_wview q, k, v, o, router;
	const void *attn_norm, *ffn_norm, *q_norm, *k_norm;
	enum st_dtype attn_norm_dt, ffn_norm_dt, q_norm_dt, k_norm_dt;
};

struct cw_model {
	struct st_store *store;            /* owned */
	struct st_model_config cfg;
	const struct cw_backend_ops *be;
	struct es_client *es;              /* borrowed */
	struct kv_client *kv;              /* borrowed */
	struct cw_model_opts opts;
	uint8_t *dense_map;                /* owned mapping */
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
	cw_act_fn act_fn;
	void *act_arg;
	struct cw_read_stats rs;
	struct cw_threads *pool;           /* owned; NULL = single thread */
	/* scratch, grown on demand for n tokens */
	int cap_tokens;
	float *x, *xn, *q, *kbuf, *vbuf, *att, *scores, *tmp;
	const uint8_t **rowp;              /* KV row of each position */
	float *rlogits, *rweights, *moe_out, *eg, *eu, *ea, *ey;
	int *rexperts;
};

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

static int map_dense(struct cw_model *m, struct st_diag *diag)
{
	char path[4096];
	struct stat st;
	int fd;

	st_store_path(m->store, m->store->dense_file, path, sizeof(path));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return st_diag_set(diag, -errno, "%s: %s", path,
				   strerror(errno));
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != m->store->dense_bytes) {
		close(fd);
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: size differs from the manifest; re-run "
				   "strata convert", path);
	}
	m->dense_len = (size_t)st.st_size;
	m->dense_map = mmap(NULL, m->dense_len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m->dense_map == MAP_FAILED) {
		m->dense_map = NULL;
		return st_diag_set(diag, -errno, "mmap %s: %s", path,
				   strerror(errno));
	}
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

int cw_model_open(const char *store_dir, struct es_client *es,
		  struct kv_client *kv, const struct cw_model_opts *opts,
		  struct cw_model **ret, struct st_diag *diag)
{
	struct cw_model *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return -ENOMEM;
	m->be = cw_backend_cpu();
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
	if (m->cfg.n_experts > CW_MAX_EXPERTS || m->cfg.top_k > m->cfg.n_experts)
		r = st_diag_set(diag, -ST_E_UNSUPPORTED,
				"%d experts: computed supports at most %d",
				m->cfg.n_experts, CW_MAX_EXPERTS);
	else if (m->opts.n_threads > 1 &&
		 (r = cw_threads_create(m->opts.n_threads, &m->pool)) < 0)
		st_diag_set(diag, r, "cannot start %d threads",
			    m->opts.n_threads);
	if (!r)
		r = map_dense(m, diag);
	if (!r)
		r = verify_dense(m, diag);
	if (!r)
		r = bind_all(m, diag);
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
		 * only for the same weights, row format and page size */
		id.store = st_xxh3(m->store->config_json,
				   strlen(m->store->config_json)) ^
			   (es ? es_client_store_id(es) : 0);
		id.kv_dtype = (uint32_t)m->opts.kv_dtype;
		id.page_rows = m->opts.page_rows;
		m->kv_model_id = st_xxh3(&id, sizeof(id)) | 1;
		if (!decl) {
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
	free(m->att); free(m->scores); free(m->tmp); free(m->rlogits);
	free(m->rowp);
	m->rowp = NULL;
	free(m->rweights); free(m->moe_out); free(m->eg); free(m->eu);
	free(m->ea); free(m->ey); free(m->rexperts);
	m->x = m->xn = m->q = m->kbuf = m->vbuf = m->att = m->scores = NULL;
	m->tmp = m->rlogits = m->rweights = m->moe_out = NULL;
	m->eg = m->eu = m->ea = m->ey = NULL;
	m->rexperts = NULL;
	m->cap_tokens = 0;
}

void cw_model_close(struct cw_model *m)
{
	if (!m)
		return;
	free_scratch(m);
	cw_threads_destroy(m->pool);
	free(m->layers);
	if (m->dense_map)
		munmap(m->dense_map, m->dense_len);
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

void cw_model_set_act_fn(struct cw_model *m, cw_act_fn fn, void *arg)
{
	m->act_fn = fn;
	m->act_arg = arg;
}

void cw_model_read_stats(const struct cw_model *m, struct cw_read_stats *ret)
{
	*ret = m->rs;
}

void cw_model_kv_bytes_per_token(const struct cw_model *m, uint64_t *ret_layout,
				 uint64_t *ret_formula)
{
	const uint64_t elt = m->opts.kv_dtype == ST_DTYPE_F32 ? 4 :
			     m->opts.kv_dtype == ST_DTYPE_F8_E4M3 ? 1 : 2;

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
	m->scores = malloc(sizeof(float) * ((size_t)c->max_position_embeddings + 1));
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
	if (!m->x || !m->xn || !m->q || !m->kbuf || !m->vbuf || !m->att ||
	    !m->scores || !m->rowp || !m->tmp || !m->rlogits || !m->rweights ||
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
	const float *x;
	float *y;
};

static void matvec_task(void *arg, int task, int n_tasks)
{
	const struct matvec_job *j = arg;
	int64_t r0 = j->w->rows * task / n_tasks;
	int64_t r1 = j->w->rows * (task + 1) / n_tasks;

	j->be->matvec(j->w, j->x, j->y, r0, r1);
}

/* y = W x, split by output rows over the thread pool when the matrix is
 * large enough to pay for it (each row is still one fixed reduction). */
static void matvec(struct cw_model *m, const struct cw_wview *w,
		   const float *x, float *y)
{
	struct matvec_job j = { m->be, w, x, y };
	int n = cw_threads_count(m->pool);

	if (n > 1 && w->rows >= 64 && w->rows * w->cols >= (1 << 16))
		cw_threads_run(m->pool, matvec_task, &j, n * 4);
	else
		m->be->matvec(w, x, y, 0, w->rows);
}

/* Attention of one query position over rows 0..pos of the layer's stream. */
static int attend(struct cw_model *m, uint32_t seq, int layer, uint32_t pos,
		  const float *q, float *out, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int hd = c->head_dim;
	const int group = c->n_heads / c->n_kv_heads;
	const float scale = 1.0f / sqrtf((float)hd);
	float *sc = m->scores, *kv = m->tmp; /* one head's K or V row */

	/* the rows' addresses once for every head (page-table lookups) */
	for (uint32_t j = 0; j <= pos; j++) {
		m->rowp[j] = kv_client_row(m->kv, seq, layer, j);
		if (!m->rowp[j])
			return st_diag_set(diag, -ST_E_NOTFOUND,
					   "KV row %u of layer %d has no page",
					   j, layer);
	}
	for (int h = 0; h < c->n_heads; h++) {
		const int kvh = h / group; /* GQA: MODEL_FAMILIES.md 0.7 */
		const float *qh = q + (size_t)h * hd;
		float *oh = out + (size_t)h * hd;
		float mx = -INFINITY;
		double sum = 0.0;

		for (uint32_t j = 0; j <= pos; j++) {
			float d = 0.0f;

			cw_kvrow_read_head(&m->kvf, m->rowp[j], 0, kvh, kv);
			for (int i = 0; i < hd; i++)
				d += qh[i] * kv[i];
			sc[j] = d * scale;
			if (sc[j] > mx)
				mx = sc[j];
		}
		for (uint32_t j = 0; j <= pos; j++) {
			sc[j] = expf(sc[j] - mx);
			sum += sc[j];
		}
		for (int i = 0; i < hd; i++)
			oh[i] = 0.0f;
		for (uint32_t j = 0; j <= pos; j++) {
			const float p = (float)(sc[j] / sum);

			cw_kvrow_read_head(&m->kvf, m->rowp[j], 1, kvh, kv);
			for (int i = 0; i < hd; i++)
				oh[i] += p * kv[i];
		}
	}
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
		if (mm->tscale_bytes)
			memcpy(&ret[i].global_scale, rec + mm->tscale_offset,
			       sizeof(float));
	}
}

/* Computes every (token, k) expert output of one layer into m->moe_out,
 * acquiring experts from expertd in groups that fit its pool. */
static int moe_layer(struct cw_model *m, int layer, int n,
		     struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int E = c->n_experts, K = c->top_k, H = c->hidden_size;
	int needed[CW_MAX_EXPERTS], n_needed = 0, group_max;
	const uint8_t *recs[CW_MAX_EXPERTS];
	char used[CW_MAX_EXPERTS] = { 0 };
	int r = 0;

	for (int i = 0; i < n * K; i++)
		used[m->rexperts[i]] = 1;
	for (int e = 0; e < E; e++)
		if (used[e])
			needed[n_needed++] = e;
	group_max = es_client_n_slots(m->es);
	if (group_max > n_needed)
		group_max = n_needed;
	for (int g0 = 0; g0 < n_needed; g0 += group_max) {
		int gn = ST_MIN(group_max, n_needed - g0);
		uint64_t t0 = st_now_ns();
		int tries = 0;

		for (;;) {
			r = es_client_acquire(m->es, layer, gn, needed + g0,
					      recs, diag);
			if (r != -ST_E_BUSY || ++tries > 2000)
				break;
			st_sleep_ns(1000000); /* another client holds pins */
		}
		m->rs.expert_stall_ns += st_now_ns() - t0;
		if (r < 0)
			return r;
		for (int gi = 0; gi < gn; gi++) {
			const int e = needed[g0 + gi];
			struct cw_wview w[3];

			expert_views(m, layer, recs[gi], w);
			for (int i = 0; i < n * K; i++) {
				const int t = i / K;
				const float *xin = m->xn + (size_t)t * H;

				if (m->rexperts[i] != e)
					continue;
				matvec(m, &w[ST_EXPERT_GATE], xin, m->eg);
				matvec(m, &w[ST_EXPERT_UP], xin, m->eu);
				cw_swiglu(m->eg, m->eu, c->expert_inter, m->ea);
				if (m->act_fn)
					m->act_fn(m->act_arg, layer, e, xin, H,
						  m->ea, c->expert_inter);
				matvec(m, &w[ST_EXPERT_DOWN], m->ea,
				       m->moe_out + (size_t)i * H);
				m->rs.expert_bytes += view_bytes(&w[0]) +
						      view_bytes(&w[1]) +
						      view_bytes(&w[2]);
			}
		}
		es_client_release(m->es, layer, gn, needed + g0);
	}
	return 0;
}

int cw_model_eval(struct cw_model *m, uint32_t seq, uint32_t pos0,
		  const int32_t *ids, int n, float *ret_logits_all,
		  float *ret_logits_last, struct st_diag *diag)
{
	const struct st_model_config *c = &m->cfg;
	const int H = c->hidden_size, hd = c->head_dim;
	const size_t qd = (size_t)c->n_heads * hd, kvd = (size_t)c->n_kv_heads * hd;
	const int K = c->top_k;
	uint32_t want;
	int r;

	if (n <= 0)
		return st_diag_set(diag, -EINVAL, "no tokens to evaluate");
	if ((uint64_t)pos0 + (uint64_t)n > (uint64_t)c->max_position_embeddings)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "sequence of %u tokens exceeds the model's "
				   "context of %d tokens", pos0 + (uint32_t)n,
				   c->max_position_embeddings);
	for (int t = 0; t < n; t++)
		if (ids[t] < 0 || ids[t] >= c->vocab_size)
			return st_diag_set(diag, -EINVAL,
					   "token id %d outside the vocabulary "
					   "(%d rows)", ids[t], c->vocab_size);
	r = grow_scratch(m, n);
	if (r < 0)
		return st_diag_set(diag, r, "out of memory for %d tokens", n);
	want = pos0 + (uint32_t)n;
	r = kv_client_seq_reserve(m->kv, 1, &seq, &want, diag);
	if (r < 0)
		return r;

	for (int t = 0; t < n; t++) {
		embed_row(&m->embed, ids[t], m->x + (size_t)t * H);
		m->rs.dense_bytes += (uint64_t)H * (m->embed.dtype == ST_DTYPE_F32 ? 4 : 2);
	}
	for (int l = 0; l < c->n_layers; l++) {
		const struct cw_layer_w *L = &m->layers[l];

		/* attention: q, k, v for every token, K/V rows into kvd */
		for (int t = 0; t < n; t++) {
			float *xt = m->x + (size_t)t * H;
			float *xn = m->xn + (size_t)t * H;
			float *q = m->q + (size_t)t * qd;
			float *k = m->kbuf + (size_t)t * kvd;
			float *v = m->vbuf + (size_t)t * kvd;
			uint8_t *row;

			m->be->rmsnorm(xt, L->attn_norm, L->attn_norm_dt, H,
				       c->rms_norm_eps, xn);
			matvec(m, &L->q, xn, q);
			matvec(m, &L->k, xn, k);
			matvec(m, &L->v, xn, v);
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
			m->be->rope(q, c->n_heads, hd, (int)(pos0 + t),
				    c->rope_theta);
			m->be->rope(k, c->n_kv_heads, hd, (int)(pos0 + t),
				    c->rope_theta);
			row = kv_client_row_writable(m->kv, seq, l,
						     pos0 + (uint32_t)t);
			if (!row)
				return st_diag_set(diag, -ST_E_NOTFOUND,
						   "KV row %u of layer %d has "
						   "no writable page (spilled, "
						   "shared or missing)", pos0 + t,
						   l);
			cw_kvrow_write(&m->kvf, row, k, v);
		}
		for (int t = 0; t < n; t++) {
			float *att = m->att + (size_t)t * qd;

			r = attend(m, seq, l, pos0 + (uint32_t)t,
				   m->q + (size_t)t * qd, att, diag);
			if (r < 0)
				return r;
			matvec(m, &L->o, att, m->tmp);
			for (int i = 0; i < H; i++)
				m->x[(size_t)t * H + i] += m->tmp[i];
		}
		m->rs.dense_bytes += (uint64_t)(n) * (view_bytes(&L->q) +
			view_bytes(&L->k) + view_bytes(&L->v) + view_bytes(&L->o) +
			view_bytes(&L->router));

		/* MoE: route every token, then the experts in pool-sized
		 * groups, then the weighted sum in top-k order */
		for (int t = 0; t < n; t++) {
			float *xn = m->xn + (size_t)t * H;

			m->be->rmsnorm(m->x + (size_t)t * H, L->ffn_norm,
				       L->ffn_norm_dt, H, c->rms_norm_eps, xn);
			matvec(m, &L->router, xn, m->rlogits);
			cw_route_topk(m->rlogits, c->n_experts, K,
				      c->norm_topk_prob,
				      m->rexperts + (size_t)t * K,
				      m->rweights + (size_t)t * K);
			if (m->route_fn)
				m->route_fn(m->route_arg, l, pos0 + (uint32_t)t,
					    m->rexperts + (size_t)t * K,
					    m->rweights + (size_t)t * K, K);
		}
		r = moe_layer(m, l, n, diag);
		if (r < 0)
			return r;
		for (int t = 0; t < n; t++) {
			float *xt = m->x + (size_t)t * H;

			for (int i = 0; i < H; i++) {
				float acc = 0.0f;

				for (int k = 0; k < K; k++)
					acc += m->rweights[(size_t)t * K + k] *
					       m->moe_out[((size_t)t * K + k) * H + i];
				xt[i] += acc;
			}
		}
	}
	for (int t = 0; t < n; t++) {
		float *xt = m->x + (size_t)t * H;
		float *out;

		if (ret_logits_all)
			out = ret_logits_all + (size_t)t * c->vocab_size;
		else if (ret_logits_last && t == n - 1)
			out = ret_logits_last;
		else
			continue;
		m->be->rmsnorm(xt, m->final_norm, m->final_norm_dt, H,
			       c->rms_norm_eps, m->xn);
		matvec(m, &m->lm_head, m->xn, out);
		m->rs.lm_head_bytes += view_bytes(&m->lm_head);
	}
	m->rs.tokens += (uint64_t)n;
	return 0;
}
