/*
 * cw_backend_fast.c — the CPU backend in fast mode (cw_backend.h): the
 * kernels of cw_kern.h behind the backend table, the best path this CPU
 * runs chosen per weight view, the portable C kernels where a SIMD path has
 * no kernel for a view.
 */
#include "cw_backend.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cw_kern.h"
#include "st_util.h"

/* The kernel for w on `path` (CW_KERN_AUTO: the best one). */
static cw_kern_fn pick(const struct cw_wview *w, enum cw_kern_path path)
{
	cw_kern_fn f = NULL;

	if (path == CW_KERN_AVX512BF16 || path == CW_KERN_AUTO)
		f = cw_kern_avx512bf16(w);
	if (!f && (path == CW_KERN_AVX512 || path == CW_KERN_AUTO))
		f = cw_kern_avx512(w);
	if (!f && (path == CW_KERN_AVX2 || path == CW_KERN_AUTO))
		f = cw_kern_avx2(w);
	return f ? f : cw_kern_c(w);
}

static int fast_supports(enum cw_op op, enum st_dtype dt)
{
	if (op == CW_OP_MATVEC)
		return dt == ST_DTYPE_F32 || dt == ST_DTYPE_BF16 ||
		       dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
		       dt == ST_DTYPE_E2M1_F16 || dt == ST_DTYPE_F8_E4M3;
	return op < CW_OP_COUNT;
}

static size_t fast_act_bytes(int64_t n)
{
	return ST_MAX(cw_kern_act_bytes(n), cw_kern_fp8_act_bytes(n));
}

static int is_fp4(enum st_dtype dt)
{
	return dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
	       dt == ST_DTYPE_E2M1_F16;
}

/* Quantizes only for 4-bit weights: the others take the floats, FP8 also
 * a copy in the AVX-512 VBMI kernel's lane order (every path prepares the
 * same; only CW_KERN_AVX512BF16 reads it). */
static void fast_act_prepare(const float *x, int64_t n, enum st_dtype dt,
			     void *buf, struct cw_act *ret)
{
	if (is_fp4(dt)) {
		cw_kern_quantize_act(x, n, dt == ST_DTYPE_MXFP4 ? 32 : 16, buf,
				     ret);
		return;
	}
	ret->x = x;
	ret->q = NULL;
	ret->d = NULL;
	ret->n = n;
	ret->qabs = NULL;
	ret->qsum = NULL;
	ret->qgroup = 0;
	ret->xp = NULL;
	if (dt == ST_DTYPE_F8_E4M3)
		cw_kern_fp8_act_prepare(x, n, buf, ret);
}

static void matvec_path(enum cw_kern_path path, const struct cw_wview *w,
			const float *x, float *y, int64_t r0, int64_t r1);

static void run(enum cw_kern_path path, const struct cw_wview *w,
		const struct cw_act *a, float *y, int64_t r0, int64_t r1)
{
	cw_kern_fn f = pick(w, path);

	if (is_fp4(w->dtype) &&
	    (!a->q || (w->dtype != ST_DTYPE_MXFP4 && a->qgroup != 16) ||
	     (w->dtype == ST_DTYPE_MXFP4 && w->il_rows &&
	      (a->qgroup != 32 || !a->qsum)))) {
		/* prepared for another dtype: quantize here */
		matvec_path(path, w, a->x, y, r0, r1);
		return;
	}
	if (!f) {
		for (int64_t r = r0; r < r1; r++)
			y[r] = NAN;
		return;
	}
	f(w, a, y, r0, r1);
}

/* matvec without prepared activations: quantizes x for this call (on the
 * stack up to 16384 columns). */
static void matvec_path(enum cw_kern_path path, const struct cw_wview *w,
			const float *x, float *y, int64_t r0, int64_t r1)
{
	_Alignas(64) unsigned char stack[4 * 16384];
	const size_t need = fast_act_bytes(w->cols);
	void *buf = need <= sizeof(stack) ? stack : malloc(need);
	struct cw_act a;

	if (!buf) {
		for (int64_t r = r0; r < r1; r++)
			y[r] = NAN;
		return;
	}
	fast_act_prepare(x, w->cols, w->dtype, buf, &a);
	run(path, w, &a, y, r0, r1);
	if (buf != stack)
		free(buf);
}

/* The GEMM on `path`: the path's kernel where it has one for w and these
 * activations, else the matvec per token (the same results either way). */
static void mm_path(enum cw_kern_path path, const struct cw_wview *w,
		    const struct cw_act *a, int n, float *const *ys,
		    int64_t r0, int64_t r1)
{
	cw_kern_mm_fn f = NULL;

	if (path == CW_KERN_AVX512BF16 || path == CW_KERN_AUTO)
		f = cw_kern_avx512bf16_mm(w);
	if (!f && (path == CW_KERN_AVX512 || path == CW_KERN_AUTO))
		f = cw_kern_avx512_mm(w);
	if (!f && (path == CW_KERN_AVX2 || path == CW_KERN_AUTO))
		f = cw_kern_avx2_mm(w);
	if (f && f(w, a, n, ys, r0, r1))
		return;
	for (int t = 0; t < n; t++)
		run(path, w, &a[t], ys[t], r0, r1);
}

#define FAST_PATH(P, p)                                                       \
	static void matvec_##p(const struct cw_wview *w, const float *x,     \
			       float *y, int64_t r0, int64_t r1)             \
	{                                                                     \
		matvec_path(P, w, x, y, r0, r1);                              \
	}                                                                     \
	static void matvec_act_##p(const struct cw_wview *w,                 \
				   const struct cw_act *a, float *y,         \
				   int64_t r0, int64_t r1)                   \
	{                                                                     \
		run(P, w, a, y, r0, r1);                                      \
	}                                                                     \
	static void matmul_act_##p(const struct cw_wview *w,                 \
				   const struct cw_act *a, int n,            \
				   float *const *ys, int64_t r0, int64_t r1) \
	{                                                                     \
		mm_path(P, w, a, n, ys, r0, r1);                              \
	}                                                                     \
	static const struct cw_backend_ops k_ops_##p = {                      \
		.name = "cpu-fast-" #p,                                       \
		.supports = fast_supports,                                    \
		.matvec = matvec_##p,                                         \
		.rmsnorm = cw_cpu_rmsnorm,                                    \
		.rope = cw_cpu_rope,                                          \
		.act_bytes = fast_act_bytes,                                  \
		.act_prepare = fast_act_prepare,                              \
		.matvec_act = matvec_act_##p,                                 \
		.matmul_act = matmul_act_##p,                                 \
	};

FAST_PATH(CW_KERN_AUTO, auto)
FAST_PATH(CW_KERN_C, c)
FAST_PATH(CW_KERN_AVX2, avx2)
FAST_PATH(CW_KERN_AVX512, avx512)
FAST_PATH(CW_KERN_AVX512BF16, avx512bf16)

const struct cw_backend_ops *cw_backend_cpu_fast(void)
{
	return &k_ops_auto;
}

const struct cw_backend_ops *cw_backend_cpu_fast_path(int path)
{
	if (!cw_kern_path_supported((enum cw_kern_path)path))
		return NULL;
	switch (path) {
	case CW_KERN_AUTO: return &k_ops_auto;
	case CW_KERN_C: return &k_ops_c;
	case CW_KERN_AVX2: return &k_ops_avx2;
	case CW_KERN_AVX512: return &k_ops_avx512;
	case CW_KERN_AVX512BF16: return &k_ops_avx512bf16;
	default: return NULL;
	}
}

int cw_compute_parse(const char *s, enum cw_compute *ret)
{
	if (!s)
		return -EINVAL;
	if (!strcmp(s, "reference"))
		*ret = CW_COMPUTE_REFERENCE;
	else if (!strcmp(s, "fast"))
		*ret = CW_COMPUTE_FAST;
	else
		return -EINVAL;
	return 0;
}

const char *cw_compute_name(enum cw_compute c)
{
	return c == CW_COMPUTE_REFERENCE ? "reference" :
	       c == CW_COMPUTE_FAST ? "fast" : "?";
}

const struct cw_backend_ops *cw_backend_for(enum cw_compute c)
{
	return c == CW_COMPUTE_FAST ? cw_backend_cpu_fast() : cw_backend_cpu();
}
