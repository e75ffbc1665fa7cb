/*
 * cw_cuda_attn.c — attention over device KV pages (cw_cuda_experts.h
 * attn ops; cw_device_ops.h cw_attn_fn); built into the CUDA module.
 *
 * One call per layer for the step's tokens: the rows that are host rows
 * (pages kvd could not place on the device, and the rows the step itself
 * wrote on the host) are packed into a pinned staging buffer and copied
 * up in one copy; a row pointer table (device addresses of device pages,
 * and of the staged rows) and the queries go up in one copy each; one
 * cw_cu_attend per token on the module's attention stream (which
 * cw_kvdev_acquire made wait on the pages' copy events); the outputs come
 * down in one copy; one stream sync per layer (this slice: the layer's
 * output projection runs on the CPU right after).  Numerics: cw_cu.h's
 * cw_cu_attend bound, not bit-identical to the CPU attention.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_cu.h"
#include "cw_cuda_experts.h"
#include "cw_kvrow.h"
#include "st_cuda.h"
#include "st_log.h"

/* A pinned host buffer and its device twin, grown on demand. */
struct cw_cuda_buf {
	uint8_t *h, *d;
	size_t cap;
};

struct cw_cuda_attn {
	void *stream;
	struct cw_kvrow_fmt fmt;
	size_t row_bytes;      /* rounded up to 16 in the staging */
	int n_heads;
	struct cw_cuda_buf stage, tab, q, out, scores;
	uint64_t layers, failed;
	int off;               /* refused after a failure */
	int hung;              /* the stream never finished: its buffers
				* stay allocated (it may still use them) */
};

static void buf_free(struct cw_cuda_buf *b)
{
	if (b->h) {
		st_cuda_host_unregister(b->h);
		free(b->h);
	}
	cw_cu_free(b->d);
	memset(b, 0, sizeof(*b));
}

/* Makes b hold at least bytes (contents not kept).  0, -ENOMEM or the
 * error of the pin / cudaMalloc. */
static int buf_grow(struct cw_cuda_buf *b, size_t bytes, int host,
		    struct st_diag *diag)
{
	void *p = NULL;
	int r;

	if (bytes <= b->cap)
		return 0;
	buf_free(b);
	bytes = (bytes + 4095) / 4096 * 4096 * 2;
	if (host) {
		if (posix_memalign(&p, 4096, bytes) != 0)
			return st_diag_set(diag, -ENOMEM, "out of memory for "
					   "%zu bytes of staging", bytes);
		r = st_cuda_host_register(p, bytes, diag);
		if (r < 0) {
			free(p);
			return r;
		}
		b->h = p;
	}
	r = cw_cu_alloc((void **)&b->d, bytes, diag);
	if (r < 0) {
		buf_free(b);
		return r;
	}
	b->cap = bytes;
	return 0;
}

int cw_cuda_attn_create(struct cw_cuda_attn **ret, enum st_dtype kv_dtype,
			int n_heads, int n_kv_heads, int head_dim,
			struct st_diag *diag)
{
	struct cw_cuda_attn *a;
	int r;

	*ret = NULL;
	if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads)
		return st_diag_set(diag, -EINVAL, "device attention: %d heads "
				   "over %d KV heads", n_heads, n_kv_heads);
	a = calloc(1, sizeof(*a));
	if (!a)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	r = cw_kvrow_init(&a->fmt, kv_dtype, n_kv_heads, head_dim);
	if (r < 0) {
		free(a);
		return st_diag_set(diag, r, "device attention: KV dtype %d "
				   "of %d x %d", (int)kv_dtype, n_kv_heads,
				   head_dim);
	}
	a->row_bytes = (cw_kvrow_bytes(&a->fmt) + 15) & ~(size_t)15;
	a->n_heads = n_heads;
	r = st_cuda_stream_create(&a->stream, diag);
	if (r < 0) {
		free(a);
		return r;
	}
	*ret = a;
	return 0;
}

void cw_cuda_attn_destroy(struct cw_cuda_attn *a)
{
	if (!a)
		return;
	if (a->hung || st_cuda_stream_wait(a->stream, ST_CUDA_STREAM_TIMEOUT_MS,
					   NULL) < 0) {
		/* work may still run on the stream: leave its buffers */
		free(a);
		return;
	}
	buf_free(&a->stage);
	buf_free(&a->tab);
	buf_free(&a->q);
	buf_free(&a->out);
	buf_free(&a->scores);
	st_cuda_stream_destroy(a->stream);
	free(a);
}

void *cw_cuda_attn_stream(struct cw_cuda_attn *a)
{
	return a->stream;
}

void cw_cuda_attn_counts(const struct cw_cuda_attn *a, uint64_t *ret_layers,
			 uint64_t *ret_failed)
{
	*ret_layers = a->layers;
	*ret_failed = a->failed;
}

/* Queues the layer; 0 or the first error. */
static int attn_queue(struct cw_cuda_attn *a, int n,
		      const struct cw_attn_tok *toks, struct st_diag *diag)
{
	const size_t qd = (size_t)a->n_heads * a->fmt.head_dim;
	const size_t rb = cw_kvrow_bytes(&a->fmt);
	size_t rows = 0, host = 0, max_rows = 0, k = 0, s = 0;
	const uint8_t **tab;
	int r;

	for (int t = 0; t < n; t++) {
		if (toks[t].n_rows < 1)
			return st_diag_set(diag, -EINVAL, "device attention: "
					   "a token without rows");
		rows += toks[t].n_rows;
		if (toks[t].n_rows > max_rows)
			max_rows = toks[t].n_rows;
		for (uint32_t j = 0; j < toks[t].n_rows; j++)
			host += !toks[t].on_dev[j];
	}
	r = buf_grow(&a->stage, host * a->row_bytes + 16, 1, diag);
	if (r == 0)
		r = buf_grow(&a->tab, rows * sizeof(*tab), 1, diag);
	if (r == 0)
		r = buf_grow(&a->q, (size_t)n * qd * 4, 1, diag);
	if (r == 0)
		r = buf_grow(&a->out, (size_t)n * qd * 4, 1, diag);
	if (r == 0)
		r = buf_grow(&a->scores, (size_t)a->n_heads * max_rows * 4, 0,
			     diag);
	if (r < 0)
		return r;
	tab = (const uint8_t **)a->tab.h;
	for (int t = 0; t < n; t++) {
		memcpy(a->q.h + (size_t)t * qd * 4, toks[t].q, qd * 4);
		for (uint32_t j = 0; j < toks[t].n_rows; j++, k++) {
			if (toks[t].on_dev[j]) {
				tab[k] = toks[t].rows[j];
				continue;
			}
			memcpy(a->stage.h + s * a->row_bytes, toks[t].rows[j],
			       rb);
			tab[k] = a->stage.d + s * a->row_bytes;
			s++;
		}
	}
	if (s)
		r = st_cuda_memcpy_async(a->stage.d, a->stage.h,
					 s * a->row_bytes, a->stream, diag);
	if (r == 0)
		r = st_cuda_memcpy_async(a->tab.d, a->tab.h,
					 rows * sizeof(*tab), a->stream, diag);
	if (r == 0)
		r = st_cuda_memcpy_async(a->q.d, a->q.h, (size_t)n * qd * 4,
					 a->stream, diag);
	for (int t = 0, k0 = 0; r == 0 && t < n; t++) {
		r = cw_cu_attend((const float *)(a->q.d + (size_t)t * qd * 4),
				 (const uint8_t *const *)a->tab.d + k0,
				 (int)toks[t].n_rows, a->fmt.dtype, a->n_heads,
				 a->fmt.n_kv_heads, a->fmt.head_dim,
				 (float *)a->scores.d,
				 (float *)(a->out.d + (size_t)t * qd * 4),
				 a->stream, diag);
		k0 += (int)toks[t].n_rows;
	}
	if (r == 0)
		r = st_cuda_memcpy_async(a->out.h, a->out.d,
					 (size_t)n * qd * 4, a->stream, diag);
	return r;
}

int cw_cuda_attn_fn(void *arg, int layer, int n,
		    const struct cw_attn_tok *toks)
{
	struct cw_cuda_attn *a = arg;
	const size_t qd = (size_t)a->n_heads * a->fmt.head_dim;
	struct st_diag diag = { "" };
	int r, w;

	if (a->off)
		return -ST_E_CUDA;
	r = attn_queue(a, n, toks, &diag);
	/* the staging and the table are reused by the next layer: always
	 * wait for this one (also after an error: nothing left in flight) */
	w = st_cuda_stream_wait(a->stream, ST_CUDA_STREAM_TIMEOUT_MS,
				r == 0 ? &diag : NULL);
	if (w == -ST_E_TIMEOUT)
		a->hung = 1;
	if (w < 0 && r == 0)
		r = -ST_E_CUDA;
	if (r < 0) {
		a->failed++;
		a->off = 1;
		st_warn("device attention failed at layer %d: %s; attention "
			"runs on the CPU from now on", layer, diag.msg);
		return r;
	}
	for (int t = 0; t < n; t++)
		memcpy(toks[t].out, a->out.h + (size_t)t * qd * 4, qd * 4);
	a->layers++;
	return 0;
}
