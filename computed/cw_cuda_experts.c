/*
 * cw_cuda_experts.c — routed experts on the GPU from device slots
 * (cw_cuda_experts.h); built into the shared module libstrata_cw_cuda.so
 * that computed dlopens.
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
/* Tokens per device batch (scratch sized for it). */
#define CW_CUDA_MAX_TOKENS 256

struct cw_cuda_experts {
	struct cw_devpool *dev;
	struct cw_cuda_pool_ops pool;
	void *stream;
	struct cw_cu_blas *blas;
	int H, I;
	float *x_d, *g_d, *u_d, *a_d, *y_d; /* [CW_CUDA_MAX_TOKENS * H or I] */
	void *scratch_d;
	size_t scratch_bytes;
	uint64_t n_device, n_cpu;
	int warned;
};

static void cw_cuda_experts_destroy(struct cw_cuda_experts *c)
{
	if (!c)
		return;
	if (c->stream)
		st_cuda_stream_sync(c->stream, NULL);
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
	size_t nh = (size_t)CW_CUDA_MAX_TOKENS * hidden_size;
	size_t ni = (size_t)CW_CUDA_MAX_TOKENS * expert_inter;
	int r;

	*ret = NULL;
	if (!c)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	c->dev = dev;
	c->pool = *pool;
	c->H = hidden_size;
	c->I = expert_inter;
	/* the largest tile: down [H, I] or gate/up [I, H], and the tokens */
	c->scratch_bytes = ((size_t)hidden_size * expert_inter +
			    (size_t)CW_CUDA_MAX_TOKENS *
			    (hidden_size > expert_inter ? hidden_size :
							  expert_inter)) * 2 +
			   256;
	r = st_cuda_stream_create(&c->stream, diag);
	if (r == 0)
		r = cw_cu_blas_new(&c->blas, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->x_d, nh * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->y_d, nh * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->g_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->u_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc((void **)&c->a_d, ni * 4, diag);
	if (r == 0)
		r = cw_cu_alloc(&c->scratch_d, c->scratch_bytes, diag);
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

/* The expert FFN of n tokens already in x_d, output in y_d. */
static int ffn(struct cw_cuda_experts *c, const struct cw_wview dv[3], int n,
	       struct st_diag *diag)
{
	const size_t H = (size_t)c->H, I = (size_t)c->I;
	int r = 0;

	if (n >= CW_CUDA_GEMM_MIN_TOKENS) {
		struct cw_cu_group g[2] = {
			{ &dv[0], c->x_d, c->g_d, n },
			{ &dv[1], c->x_d, c->u_d, n },
		};
		struct cw_cu_group d = { &dv[2], c->a_d, c->y_d, n };

		r = cw_cu_gemm_grouped_bf16(c->blas, g, 2, c->scratch_d,
					    c->scratch_bytes, c->stream, diag);
		if (r == 0)
			r = cw_cu_swiglu(c->g_d, c->u_d, (int)(n * I), c->a_d,
					 c->stream, diag);
		if (r == 0)
			r = cw_cu_gemm_grouped_bf16(c->blas, &d, 1,
						    c->scratch_d,
						    c->scratch_bytes,
						    c->stream, diag);
		return r;
	}
	for (int t = 0; t < n && r == 0; t++) {
		r = cw_cu_matvec(&dv[0], c->x_d + t * H, c->g_d + t * I,
				 c->stream, diag);
		if (r == 0)
			r = cw_cu_matvec(&dv[1], c->x_d + t * H,
					 c->u_d + t * I, c->stream, diag);
		if (r == 0)
			r = cw_cu_swiglu(c->g_d + t * I, c->u_d + t * I,
					 (int)I, c->a_d + t * I, c->stream,
					 diag);
		if (r == 0)
			r = cw_cu_matvec(&dv[2], c->a_d + t * I,
					 c->y_d + t * H, c->stream, diag);
	}
	return r;
}

static int cw_cuda_experts_fn(void *arg, int layer, int expert,
			      const uint8_t *rec, const struct cw_wview w[3],
			      int n, const float *const *x,
			      float *const *out)
{
	struct cw_cuda_experts *c = arg;
	struct st_diag diag = { "" };
	struct cw_wview dv[3];
	const void *dev = NULL;
	const size_t H = (size_t)c->H;
	uint32_t slot;
	int r = 0;

	if (c->warned || n < 1 || n > CW_CUDA_MAX_TOKENS || w[0].rows != c->I ||
	    w[0].cols != c->H || w[2].rows != c->H ||
	    !c->pool.pin(c->dev, (uint32_t)layer, (uint32_t)expert,
			 c->stream, &dev, &slot)) {
		c->n_cpu++;
		return 0;
	}
	device_views(rec, dev, w, dv);
	for (int t = 0; t < n && r == 0; t++)
		r = st_cuda_memcpy_async(c->x_d + t * H, x[t], H * 4,
					 c->stream, &diag);
	if (r == 0)
		r = ffn(c, dv, n, &diag);
	for (int t = 0; t < n && r == 0; t++)
		r = st_cuda_memcpy_async(out[t], c->y_d + t * H, H * 4,
					 c->stream, &diag);
	/* the slot stays pinned until the stream has read it */
	if (st_cuda_stream_sync(c->stream, r ? NULL : &diag) < 0 && r == 0)
		r = -ST_E_CUDA;
	c->pool.unpin(c->dev, slot);
	if (r < 0) {
		if (!c->warned++)
			st_warn("device expert path failed (%s); computing "
				"experts on the CPU from now on", diag.msg);
		c->n_cpu++;
		return 0;
	}
	c->n_device++;
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
		cw_cuda_experts_fn, cw_cuda_experts_counts,
	};

	return &ops;
}
