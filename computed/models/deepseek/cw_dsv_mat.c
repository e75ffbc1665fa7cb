/*
 * cw_dsv_mat.c — the weight matrices of the DeepSeek-V4 family (V4 and
 * V4.1; struct cw_dsv_mat, cw_dsv_int.h) in both compute modes: kept as
 * F32 (reference mode) or as stored (fast mode: FP8 E4M3 codes with
 * expanded scales, BF16), multiplied by the exact double-accumulating
 * loop or the fast backend's kernels, and the expert matrices of an
 * expertd slot (MXFP4 records) as views or dequantised.
 */
#include "cw_dsv_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_threads.h"
#include "st_formats.h"
#include "st_hugemem.h"
#include "st_mxfp4il.h"
#include "st_util.h"

int cw_dsv_mat_keep_fp8(struct cw_dsv_mat *m, const uint8_t *w,
			 const uint8_t *s, int b0, int b1)
{
	const int ng = (m->cols + b1 - 1) / b1;

	/* the codes in huge-page advised memory: streamed every token */
	if (st_hugemem_alloc((size_t)m->rows * m->cols, (void **)&m->codes) <
	    0)
		return -ENOMEM;
	m->fscale = malloc((size_t)m->rows * ng * sizeof(float));
	if (!m->fscale)
		return -ENOMEM;
	memcpy(m->codes, w, (size_t)m->rows * m->cols);
	for (int r = 0; r < m->rows; r++)
		for (int g = 0; g < ng; g++)
			m->fscale[(size_t)r * ng + g] =
				st_e8m0_to_f32(s[(size_t)(r / b0) * ng + g]);
	m->fv = (struct cw_wview){
		.dtype = ST_DTYPE_F8_E4M3,
		.data = m->codes,
		.scales = (const uint8_t *)m->fscale,
		.rows = m->rows,
		.cols = m->cols,
		.group = (uint32_t)b1,
		.scale_type = ST_SCALE_F32,
	};
	return 0;
}

int cw_dsv_mat_keep_bf16(struct cw_dsv_mat *m, const void *data)
{
	if (st_hugemem_alloc((size_t)m->rows * m->cols * 2,
			     (void **)&m->codes) < 0)
		return -ENOMEM;
	memcpy(m->codes, data, (size_t)m->rows * m->cols * 2);
	m->fv = (struct cw_wview){
		.dtype = ST_DTYPE_BF16,
		.data = m->codes,
		.rows = m->rows,
		.cols = m->cols,
	};
	return 0;
}

void cw_dsv_mat_mv(const struct cw_backend_ops *be,
		    const struct cw_dsv_mat *m, const float *x, float *y)
{
	if (be) {
		struct cw_wview v = { .dtype = ST_DTYPE_F32, .data = m->w,
				      .rows = m->rows, .cols = m->cols };

		be->matvec(m->codes ? &m->fv : &v, x, y, 0, m->rows);
		return;
	}
	for (int r = 0; r < m->rows; r++) {
		const float *w = m->w + (size_t)r * m->cols;
		double acc = 0.0;

		for (int i = 0; i < m->cols; i++)
			acc += (double)w[i] * x[i];
		y[r] = (float)acc;
	}
}

void cw_dsv_mat_rows(const struct cw_dsv_mat *m, int r0, int n,
		      struct cw_dsv_mat *sub)
{
	memset(sub, 0, sizeof(*sub));
	sub->rows = n;
	sub->cols = m->cols;
	sub->quantized = m->quantized;
	if (m->w)
		sub->w = m->w + (size_t)r0 * m->cols;
	if (m->codes && m->fv.dtype == ST_DTYPE_F8_E4M3) {
		size_t ng = (m->cols + m->fv.group - 1) / m->fv.group;

		sub->codes = m->codes;
		sub->fv = m->fv;
		sub->fv.data = m->codes + (size_t)r0 * m->cols;
		sub->fv.scales = (const uint8_t *)(m->fscale + (size_t)r0 * ng);
		sub->fv.rows = n;
	} else if (m->codes) { /* BF16 */
		sub->codes = m->codes;
		sub->fv = m->fv;
		sub->fv.data = m->codes + (size_t)r0 * m->cols * 2;
		sub->fv.rows = n;
	}
}

uint64_t cw_dsv_mat_bytes(const struct cw_dsv_mat *x)
{
	return (uint64_t)x->rows * x->cols *
	       (!x->codes ? sizeof(float) :
		x->fv.dtype == ST_DTYPE_BF16 ? 2 : 1);
}

void cw_dsv_mat_free(struct cw_dsv_mat *x)
{
	free(x->w);
	if (x->codes) /* kept by cw_dsv_mat_keep_* (st_hugemem) */
		st_hugemem_free(x->codes, (size_t)x->rows * x->cols *
					  (x->fv.dtype == ST_DTYPE_BF16 ? 2 : 1));
	free(x->fscale);
	x->w = NULL;
	x->codes = NULL;
	x->fscale = NULL;
}

struct cw_wview cw_dsv_rec_view(const struct st_store_matrix *x,
				 const uint8_t *rec)
{
	return (struct cw_wview){
		.dtype = ST_DTYPE_MXFP4,
		.data = rec + x->data_offset,
		.scales = rec + x->scale_offset,
		.rows = x->rows,
		.cols = x->cols,
		.group = ST_MXFP4_BLOCK,
		.scale_type = ST_SCALE_E8M0,
		.il_rows = x->il_rows,
	};
}

void cw_dsv_record_mat(const struct st_store_matrix *x, const uint8_t *rec,
			float *w, struct cw_dsv_mat *ret)
{
	const int rows = (int)x->rows, cols = (int)x->cols;

	for (int o = 0; o < rows; o++)
		if (x->il_rows)
			st_mxfp4il_dequantize_row(rec + x->data_offset,
						  rec + x->scale_offset, rows,
						  cols, o, w + (size_t)o * cols);
		else
			st_mxfp4_dequantize_row(rec + x->data_offset +
							(size_t)o * cols / 2,
						rec + x->scale_offset +
							(size_t)o * cols / ST_MXFP4_BLOCK,
						cols, ST_FP4_LAYOUT_OCP,
						w + (size_t)o * cols);
	memset(ret, 0, sizeof(*ret));
	ret->rows = rows;
	ret->cols = cols;
	ret->w = w;
	ret->quantized = 1;
}

struct mv_job {
	const struct cw_backend_ops *be;
	const struct cw_wview *w;
	const struct cw_act *a;
	float *y;
};

/* Task `task` of n_tasks: rows in equal shares, boundaries on multiples
 * of 16 rows (no two threads write one cache line of y). */
static void mv_task(void *arg, int task, int n_tasks)
{
	const struct mv_job *j = arg;
	const int64_t units = (j->w->rows + 15) / 16;
	int64_t r0 = ST_MIN(j->w->rows, units * task / n_tasks * 16);
	int64_t r1 = ST_MIN(j->w->rows, units * (task + 1) / n_tasks * 16);

	if (r0 < r1)
		j->be->matvec_act(j->w, j->a, j->y, r0, r1);
}

void cw_dsv_view_mv(const struct cw_backend_ops *be, struct cw_threads *pool,
		     const struct cw_wview *w, const struct cw_act *a,
		     float *y)
{
	struct mv_job j = { be, w, a, y };
	int n = pool ? cw_threads_count(pool) : 1;

	if (n > 1 && w->rows >= 64 && w->rows * w->cols >= (1 << 16))
		cw_threads_run(pool, mv_task, &j, 4 * n);
	else
		be->matvec_act(w, a, y, 0, w->rows);
}

void cw_dsv_mat_mv_pool(const struct cw_backend_ops *be,
			 struct cw_threads *pool, const struct cw_dsv_mat *m,
			 const float *x, float *y)
{
	struct cw_wview v = { .dtype = ST_DTYPE_F32, .data = m->w,
			      .rows = m->rows, .cols = m->cols };
	const struct cw_wview *w = m->codes ? &m->fv : &v;
	const size_t need = be ? be->act_bytes(w->cols) : 0;
	void *buf = NULL;
	struct cw_act a;

	if (!be || !pool || w->dtype == ST_DTYPE_MXFP4 ||
	    w->dtype == ST_DTYPE_NVFP4 || w->dtype == ST_DTYPE_E2M1_F16 ||
	    (need && !(buf = malloc(need)))) {
		cw_dsv_mat_mv(be, m, x, y);
		return;
	}
	/* float activations for these formats, and for FP8 in fast mode
	 * their copy in the BF16 kernel's lane order
	 * (cw_kern_fp8_act_prepare) in buf */
	be->act_prepare(x, w->cols, w->dtype, buf, &a);
	cw_dsv_view_mv(be, pool, w, &a, y);
	free(buf);
}

/* V4's CW_DSV4_QAT_ACT_FP8 or V4.1's CW_DSV41_QAT_ACT_FP8 (the values
 * differ: V4.1's 4 is its indexer trip). */
int cw_dsv_act_fp8(const struct cw_dsv_model *m)
{
	return (m->qat & (m->cfg.revision == ST_DSV_REV_V41 ?
			  CW_DSV41_QAT_ACT_FP8 : CW_DSV4_QAT_ACT_FP8)) != 0;
}

void cw_dsv_lin(const struct cw_dsv_model *m, const struct cw_dsv_mat *w,
		const float *x, float *y)
{
	if (cw_dsv_act_fp8(m) && w->quantized) {
		float xq[w->cols];

		memcpy(xq, x, sizeof(xq));
		cw_dsv_fp8_roundtrip(xq, w->cols, m->cfg.fp8_block[1]);
		cw_dsv_mat_mv_pool(m->be, m->pool, w, xq, y);
	} else {
		cw_dsv_mat_mv_pool(m->be, m->pool, w, x, y);
	}
}

void cw_dsv_lin_rows_noact(const struct cw_dsv_model *m,
			   const struct cw_dsv_mat *w, int r0, int n,
			   const float *x, float *y)
{
	struct cw_dsv_mat sub;

	cw_dsv_mat_rows(w, r0, n, &sub);
	cw_dsv_mat_mv_pool(m->be, m->pool, &sub, x, y);
}

void cw_dsv_lin_rows(const struct cw_dsv_model *m,
		     const struct cw_dsv_mat *w, int r0, int n,
		     const float *x, float *y)
{
	struct cw_dsv_mat sub;

	cw_dsv_mat_rows(w, r0, n, &sub);
	cw_dsv_lin(m, &sub, x, y);
}
