/*
 * cw_cuda_experts.c — routed experts on the GPU from device slots
 * (cw_cuda_experts.h); built into the shared module libstrata_cw_cuda.so
 * that computed dlopens.
 *
 * Overlap within a layer: fn only queues an expert on the module's stream
 * (its pin made the stream wait on that slot's event alone), its tokens
 * staged into a pinned buffer, its outputs gathered into one device
 * buffer; sync then copies the gathered outputs down once, waits once,
 * scatters them to the callers' rows and unpins every slot of the batch.
 * Meanwhile the model computes the experts left to the CPU.
 *
 * Launches (issue 27): an expert with 8 tokens or more runs at once as
 * grouped GEMMs; the decode experts (fewer tokens) wait until the model
 * says the group is complete (fn with expert -1) or sync, then all their
 * (expert, token) pairs go up in one copy and run as one batched GEMV
 * launch for gate and up, one SwiGLU and one batched GEMV for down, per
 * CW_CUDA_MAX_TOKENS pairs of one weight format: about 6 stream
 * operations per layer instead of 4 launches per (expert, token).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_cu.h"
#include "cw_cuda_experts.h"
#include "st_cuda.h"
#include "st_log.h"

/* Tokens of one expert from which the grouped GEMM replaces GEMVs. */
#define CW_CUDA_GEMM_MIN_TOKENS 8
/* Tokens of one expert per device call (g/u/a scratch sized for it). */
#define CW_CUDA_MAX_TOKENS 256
/* (token, expert) pairs queued before a sync (x and y gather buffers:
 * 2 * 1024 * (H + 64) floats each side, 59 MB at H = 7168); a batch
 * that would pass it is synced first. */
#define CW_CUDA_MAX_PAIRS 1024
/* Each expert's rows start on a 256-byte boundary (vector loads). */
#define CW_CUDA_ALIGN_FLOATS 64
/* Batched-GEMV jobs until a sync: gate, up and down of every pair. */
#define CW_CUDA_JOBS (3 * CW_CUDA_MAX_PAIRS)

/* An expert queued since the last sync. */
struct cw_cuda_queued {
	uint32_t slot;   /* pinned device slot */
	size_t off;      /* its rows at x_d/y_d + off (floats) */
	int n, pair0;    /* tokens; its outputs out[pair0 .. pair0 + n) */
	struct cw_wview dv[3]; /* gate, up, down in the device slot */
};

struct cw_cuda_experts {
	struct cw_devpool *dev;
	struct cw_cuda_pool_ops pool;
	void *stream;
	struct cw_cu_blas *blas;
	int H, I;
	float *g_d, *u_d, *a_d;   /* [CW_CUDA_MAX_TOKENS * I] (stream order) */
	/* batched-GEMV job tables: 3 per pair until the sync (pinned host,
	 * rewritten only after the sync) and their device copies */
	struct cw_cu_gemv_job *jobs_h, *jobs_d;
	int n_jobs;
	float *x_d, *y_d;         /* [CW_CUDA_MAX_PAIRS * (H + 64)] gathers */
	float *x_h, *y_h;         /* the same, pinned host staging */
	size_t gather_floats;
	void *scratch_d;
	size_t scratch_bytes;
	/* the batch queued since the last sync */
	struct cw_cuda_queued q[CW_CUDA_MAX_PAIRS];
	float *out[CW_CUDA_MAX_PAIRS];
	int n_q, n_pairs;
	int n_launched;           /* q[0 .. n_launched) are on the stream */
	size_t used;              /* floats of x_d / y_d taken */
	size_t up;                /* floats of x_h [0, up) copied to x_d */
	int failed;               /* this batch had an error: sync says so */
	int hung;                 /* the stream never finished: its slots
				   * stay pinned, its buffers allocated */
	uint64_t n_device, n_cpu, n_syncs;
	int warned;
};

static void host_free(float *p)
{
	if (p) {
		st_cuda_host_unregister(p);
		free(p);
	}
}

static int host_alloc(float **ret, size_t bytes, struct st_diag *diag)
{
	void *p = NULL;
	int r;

	*ret = NULL;
	bytes = (bytes + 4095) / 4096 * 4096;
	if (posix_memalign(&p, 4096, bytes) != 0)
		return st_diag_set(diag, -ENOMEM, "out of memory for %zu "
				   "bytes of staging", bytes);
	r = st_cuda_host_register(p, bytes, diag);
	if (r < 0) {
		free(p);
		return r;
	}
	*ret = p;
	return 0;
}

static void cw_cuda_experts_destroy(struct cw_cuda_experts *c)
{
	if (!c)
		return;
	if (c->hung || (c->stream &&
			st_cuda_stream_wait(c->stream, ST_CUDA_STREAM_TIMEOUT_MS,
					    NULL) < 0)) {
		/* work may still run on the stream: nothing it reads or
		 * writes is unpinned or freed */
		free(c);
		return;
	}
	for (int i = 0; i < c->n_q; i++) /* a batch never synced */
		c->pool.unpin(c->dev, c->q[i].slot);
	host_free(c->x_h);
	host_free(c->y_h);
	host_free((float *)c->jobs_h);
	cw_cu_free(c->jobs_d);
	cw_cu_free(c->x_d);
	cw_cu_free(c->g_d);
	cw_cu_free(c->u_d);
	cw_cu_free(c->a_d);
	cw_cu_free(c->y_d);
	cw_cu_free(c->scratch_d);
	cw_cu_blas_free(c->blas);
	st_cuda_stream_destroy(c->stream);
	free(c);
}

static int cw_cuda_experts_create(struct cw_cuda_experts **ret,
				  struct cw_devpool *dev,
				  const struct cw_cuda_pool_ops *pool,
				  int hidden_size, int expert_inter,
				  struct st_diag *diag)
{
	struct cw_cuda_experts *c = calloc(1, sizeof(*c));
	size_t ni = (size_t)CW_CUDA_MAX_TOKENS * expert_inter;
	int r;

	*ret = NULL;
	if (!c)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	c->dev = dev;
	c->pool = *pool;
	c->H = hidden_size;
	c->I = expert_inter;
	c->gather_floats = (size_t)CW_CUDA_MAX_PAIRS *
			   ((size_t)hidden_size + CW_CUDA_ALIGN_FLOATS);
	/* the largest tile: down [H, I] or gate/up [I, H], and the tokens
	 * (cw_cu_gemm_grouped_scratch for CW_CUDA_MAX_TOKENS) */
	c->scratch_bytes = ((size_t)hidden_size * expert_inter +
			    (size_t)CW_CUDA_MAX_TOKENS *
			    (hidden_size > expert_inter ? hidden_size :
							  expert_inter)) * 2 +
			   256;
	r = st_cuda_stream_create(&c->stream, diag);
	if (r == 0)
		r = cw_cu_blas_new(&c->blas, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->x_d, c->gather_floats * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->y_d, c->gather_floats * 4, diag);
	if (r == 0)
		r = host_alloc(&c->x_h, c->gather_floats * 4, diag);
	if (r == 0)
		r = host_alloc(&c->y_h, c->gather_floats * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->g_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->u_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->a_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc(&c->scratch_d, c->scratch_bytes, diag);
	if (r == 0)
		r = host_alloc((float **)&c->jobs_h, CW_CUDA_JOBS *
			       sizeof(struct cw_cu_gemv_job), diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->jobs_d, CW_CUDA_JOBS *
				sizeof(struct cw_cu_gemv_job), diag);
	if (r < 0) {
		cw_cuda_experts_destroy(c);
		return r;
	}
	*ret = c;
	return 0;
}

/* The host views rebased onto the device copy of the record. */
static void device_views(const uint8_t *rec, const void *dev,
			 const struct cw_wview w[3], struct cw_wview dv[3])
{
	for (int i = 0; i < 3; i++) {
		dv[i] = w[i];
		dv[i].data = (const uint8_t *)dev +
			     ((const uint8_t *)w[i].data - rec);
		dv[i].scales = w[i].scales ?
			(const uint8_t *)dev + (w[i].scales - rec) : NULL;
	}
}

/* The expert FFN of n >= CW_CUDA_GEMM_MIN_TOKENS tokens already at x_d
 * (device, [n, H]) as grouped GEMMs, output at y_d ([n, H]); g_d/u_d/a_d
 * are scratch reused in stream order. */
static int ffn_gemm(struct cw_cuda_experts *c, const struct cw_wview dv[3],
		    int n, const float *x_d, float *y_d, struct st_diag *diag)
{
	const size_t I = (size_t)c->I;
	struct cw_cu_group g[2] = {
		{ &dv[0], x_d, c->g_d, n },
		{ &dv[1], x_d, c->u_d, n },
	};
	struct cw_cu_group d = { &dv[2], c->a_d, y_d, n };
	int r;

	r = cw_cu_gemm_grouped_bf16(c->blas, g, 2, c->scratch_d,
				    c->scratch_bytes, c->stream, diag);
	if (r == 0)
		r = cw_cu_swiglu(c->g_d, c->u_d, (int)(n * I), c->a_d,
				 c->stream, diag);
	if (r == 0)
		r = cw_cu_gemm_grouped_bf16(c->blas, &d, 1, c->scratch_d,
					    c->scratch_bytes, c->stream, diag);
	return r;
}

/* Same weight format (what one batched launch needs; the shapes were
 * checked by fn). */
static int same_format(const struct cw_wview *a, const struct cw_wview *b)
{
	return a->dtype == b->dtype && a->group == b->group &&
	       !a->scales == !b->scales;
}

/* One batched launch chunk: pairs [0, m) of the decode experts listed in
 * e[0 .. m) (expert entry) and t[0 .. m) (its token): gate and up of all
 * in one launch, SwiGLU over all, down of all in one launch. */
static int gemv_chunk(struct cw_cuda_experts *c,
		      const struct cw_cuda_queued *const *e, const int *t,
		      int m, struct st_diag *diag)
{
	const struct cw_wview *w[2 * CW_CUDA_MAX_TOKENS];
	const float *x[2 * CW_CUDA_MAX_TOKENS];
	float *y[2 * CW_CUDA_MAX_TOKENS];
	const size_t H = (size_t)c->H, I = (size_t)c->I;
	int r;

	if (c->n_jobs + 3 * m > CW_CUDA_JOBS)
		return st_diag_set(diag, -ENOSPC, "device expert batch: job "
				   "table full (%d of %d)", c->n_jobs,
				   CW_CUDA_JOBS);
	for (int k = 0; k < m; k++) {
		const float *xk = c->x_d + e[k]->off + (size_t)t[k] * H;

		w[k] = &e[k]->dv[0];
		x[k] = xk;
		y[k] = c->g_d + (size_t)k * I;
		w[m + k] = &e[k]->dv[1];
		x[m + k] = xk;
		y[m + k] = c->u_d + (size_t)k * I;
	}
	r = cw_cu_matvec_batch(w, x, y, 2 * m, c->jobs_h + c->n_jobs,
			       c->jobs_d + c->n_jobs, c->stream, diag);
	c->n_jobs += 2 * m;
	if (r == 0)
		r = cw_cu_swiglu(c->g_d, c->u_d, (int)((size_t)m * I), c->a_d,
				 c->stream, diag);
	for (int k = 0; k < m && r == 0; k++) {
		w[k] = &e[k]->dv[2];
		x[k] = c->a_d + (size_t)k * I;
		y[k] = c->y_d + e[k]->off + (size_t)t[k] * H;
	}
	if (r == 0)
		r = cw_cu_matvec_batch(w, x, y, m, c->jobs_h + c->n_jobs,
				       c->jobs_d + c->n_jobs, c->stream, diag);
	c->n_jobs += m;
	return r;
}

/* Starts everything queued but not yet on the stream: one copy of the
 * staged tokens not yet up, then the decode experts' pairs in chunks of
 * at most CW_CUDA_MAX_TOKENS pairs of one weight format. */
static int flush(struct cw_cuda_experts *c, struct st_diag *diag)
{
	const struct cw_cuda_queued *e[CW_CUDA_MAX_TOKENS];
	int t[CW_CUDA_MAX_TOKENS], m = 0, r = 0;

	if (c->used > c->up)
		r = st_cuda_memcpy_async(c->x_d + c->up, c->x_h + c->up,
					 (c->used - c->up) * 4, c->stream,
					 diag);
	c->up = c->used;
	for (int i = c->n_launched; i < c->n_q && r == 0; i++) {
		const struct cw_cuda_queued *q = &c->q[i];

		if (q->n >= CW_CUDA_GEMM_MIN_TOKENS) {
			r = ffn_gemm(c, q->dv, q->n, c->x_d + q->off,
				     c->y_d + q->off, diag);
			continue;
		}
		for (int k = 0; k < q->n && r == 0; k++) {
			if (m && (m == CW_CUDA_MAX_TOKENS ||
				  !same_format(&e[0]->dv[0], &q->dv[0]) ||
				  !same_format(&e[0]->dv[2], &q->dv[2]))) {
				r = gemv_chunk(c, e, t, m, diag);
				m = 0;
			}
			e[m] = q;
			t[m++] = k;
		}
	}
	if (m && r == 0)
		r = gemv_chunk(c, e, t, m, diag);
	c->n_launched = c->n_q;
	return r;
}

static void fail_once(struct cw_cuda_experts *c, const char *msg)
{
	if (!c->warned++)
		st_warn("device expert path failed (%s); computing experts "
			"on the CPU from now on", msg);
}

/*
 * The cw_expert_sync_fn: one device-to-host copy of the gathered outputs,
 * one wait, the outputs scattered to their rows, every slot of the batch
 * unpinned (the stream has passed its reads).  0, or -ST_E_CUDA when the
 * batch (or an earlier part of it, synced early) failed.
 */
static int cw_cuda_experts_sync(void *arg)
{
	struct cw_cuda_experts *c = arg;
	struct st_diag diag = { "" };
	const size_t H = (size_t)c->H;
	int r = 0;

	if (c->n_launched < c->n_q && flush(c, &diag) < 0) {
		fail_once(c, diag.msg);
		c->failed = 1;
	}
	if (c->n_q && c->used)
		r = st_cuda_memcpy_async(c->y_h, c->y_d, c->used * 4,
					 c->stream, &diag);
	if (c->n_q) {
		const int w = st_cuda_stream_wait(c->stream,
						  ST_CUDA_STREAM_TIMEOUT_MS,
						  r ? NULL : &diag);

		if (w == -ST_E_TIMEOUT)
			c->hung = 1; /* fail_once below turns the path off */
		if (w < 0 && r == 0)
			r = -ST_E_CUDA;
	}
	for (int i = 0; i < c->n_q; i++) {
		const struct cw_cuda_queued *e = &c->q[i];

		for (int t = 0; t < e->n && r == 0 && !c->failed; t++)
			memcpy(c->out[e->pair0 + t], c->y_h + e->off + t * H,
			       H * 4);
		/* a hung stream may still read the slot: the pin stays */
		if (!c->hung)
			c->pool.unpin(c->dev, e->slot);
	}
	if (r < 0)
		fail_once(c, diag.msg);
	else if (!c->failed)
		c->n_device += (uint64_t)c->n_q;
	c->n_syncs += c->n_q > 0;
	if (r < 0 || c->failed) {
		c->n_cpu += (uint64_t)c->n_q; /* the model recomputes them */
		r = -ST_E_CUDA;
	}
	c->failed = 0;
	c->n_q = c->n_pairs = c->n_launched = c->n_jobs = 0;
	c->used = c->up = 0;
	return r;
}

/* The cw_expert_fn: queues the expert (1) or leaves it to the CPU (0);
 * expert -1 with n 0: the group is complete, start what is queued. */
static int cw_cuda_experts_fn(void *arg, int layer, int expert,
			      const uint8_t *rec, const struct cw_wview w[3],
			      int n, const float *const *x,
			      float *const *out)
{
	struct cw_cuda_experts *c = arg;
	struct st_diag diag = { "" };
	struct cw_cuda_queued *e;
	const void *dev = NULL;
	const size_t H = (size_t)c->H;
	size_t off;
	uint32_t slot;
	int r;

	if (expert < 0 && n == 0) {
		if (c->n_launched < c->n_q && flush(c, &diag) < 0) {
			fail_once(c, diag.msg);
			c->failed = 1;
		}
		return 0;
	}
	/* row-interleaved MXFP4 (version-3 stores of strata convert) stays
	 * on the CPU: the device kernels read row-major codes (the lossless
	 * DeepSeek-V4 records, which the hybrid path serves, are row-major) */
	if (c->warned || n < 1 || n > CW_CUDA_MAX_TOKENS || w[0].rows != c->I ||
	    w[0].cols != c->H || w[2].rows != c->H || w[0].il_rows ||
	    w[1].il_rows || w[2].il_rows) {
		c->n_cpu++;
		return 0;
	}
	/* a full batch is completed first (a second sync in this layer) */
	if (c->n_pairs + n > CW_CUDA_MAX_PAIRS && c->n_q &&
	    cw_cuda_experts_sync(c) < 0)
		c->failed = 1; /* the model's sync will say so */
	if (c->warned || !c->pool.pin(c->dev, (uint32_t)layer,
				      (uint32_t)expert, c->stream, &dev,
				      &slot)) {
		c->n_cpu++;
		return 0;
	}
	off = (c->used + CW_CUDA_ALIGN_FLOATS - 1) / CW_CUDA_ALIGN_FLOATS *
	      CW_CUDA_ALIGN_FLOATS;
	e = &c->q[c->n_q++];
	e->slot = slot;
	e->off = off;
	e->n = n;
	e->pair0 = c->n_pairs;
	for (int t = 0; t < n; t++) {
		memcpy(c->x_h + off + t * H, x[t], H * 4);
		c->out[c->n_pairs++] = out[t];
	}
	c->used = off + (size_t)n * H;
	device_views(rec, dev, w, e->dv);
	r = 0;
	/* prefill-sized experts start at once (a few large GEMMs); decode
	 * ones wait for the group (flush) */
	if (n >= CW_CUDA_GEMM_MIN_TOKENS)
		r = flush(c, &diag);
	if (r < 0) {
		/* queued all the same: sync unpins it and reports */
		fail_once(c, diag.msg);
		c->failed = 1;
	}
	return 1;
}

static void cw_cuda_experts_counts(const struct cw_cuda_experts *c,
				   uint64_t *ret_device, uint64_t *ret_cpu)
{
	*ret_device = c->n_device;
	*ret_cpu = c->n_cpu;
}

__attribute__((visibility("default")))
const struct cw_cuda_module_ops *cw_cuda_module(void)
{
	static const struct cw_cuda_module_ops ops = {
		cw_cuda_experts_create, cw_cuda_experts_destroy,
		cw_cuda_experts_fn, cw_cuda_experts_sync,
		cw_cuda_experts_counts,
		cw_cuda_attn_create, cw_cuda_attn_destroy, cw_cuda_attn_fn,
		cw_cuda_attn_stream, cw_cuda_attn_counts,
	};

	return &ops;
}
