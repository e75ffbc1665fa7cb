/*
 * cw_cu_gemm.cu — the first prefill path of the CUDA backend (cw_cu.h):
 * weights of any expert format dequantized on the device to float32
 * (bit-exact twins of st_formats' *_dequantize_row), and a float32 GEMM of
 * a batch of tokens by cuBLAS (cublasSgemm, no TF32), and the grouped
 * BF16 GEMM of the prefill experts (cublasGemmEx on tensor cores).
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>

#include "cw_cu_int.h"

struct cw_cu_blas {
	cublasHandle_t h;    /* pedantic float32 (cw_cu_gemm_f32) */
	cublasHandle_t h16;  /* default math: BF16 tensor cores (GemmEx) */
};

static int blas_err(struct st_diag *diag, cublasStatus_t s, const char *what)
{
	return st_diag_set(diag, -ST_E_CUBLAS, "%s: %s (%d)", what,
			   cublasGetStatusString(s), (int)s);
}

int cw_cu_blas_new(struct cw_cu_blas **ret, struct st_diag *diag)
{
	struct cw_cu_blas *b = (struct cw_cu_blas *)calloc(1, sizeof(*b));
	cublasStatus_t s;

	*ret = NULL;
	if (!b)
		return st_diag_set(diag, -ENOMEM, "cw_cu_blas_new: out of memory");
	s = cublasCreate(&b->h);
	if (s == CUBLAS_STATUS_SUCCESS)
		/* plain float32 arithmetic: no TF32 tensor-core rounding */
		s = cublasSetMathMode(b->h, CUBLAS_PEDANTIC_MATH);
	/* the BF16 GEMM under pedantic math would be kept off the tensor
	 * cores (issue 27); its inputs are BF16 already, so default math
	 * rounds nothing more, only the accumulation order and rounding
	 * differ (cw_cu.h's bound) */
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasCreate(&b->h16);
	if (s == CUBLAS_STATUS_SUCCESS)
		s = cublasSetMathMode(b->h16, CUBLAS_DEFAULT_MATH);
	if (s != CUBLAS_STATUS_SUCCESS) {
		if (b->h)
			cublasDestroy(b->h);
		if (b->h16)
			cublasDestroy(b->h16);
		free(b);
		return blas_err(diag, s, "cublasCreate");
	}
	*ret = b;
	return 0;
}

void cw_cu_blas_free(struct cw_cu_blas *b)
{
	if (!b)
		return;
	cublasDestroy(b->h);
	cublasDestroy(b->h16);
	free(b);
}

int cw_cu_gemm_f32(struct cw_cu_blas *b, const float *w_d, const float *x_d,
		   float *y_d, int rows, int cols, int n_tok, void *stream,
		   struct st_diag *diag)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t s;

	if (rows < 1 || cols < 1 || n_tok < 0)
		return st_diag_set(diag, -EINVAL, "cw_cu_gemm_f32: %d x %d, %d "
				   "tokens", rows, cols, n_tok);
	if (!n_tok)
		return 0;
	s = cublasSetStream(b->h, (cudaStream_t)stream);
	if (s != CUBLAS_STATUS_SUCCESS)
		return blas_err(diag, s, "cublasSetStream");
	/* column-major view: W row-major [rows, cols] is W^T with ld cols,
	 * X [n, cols] is X^T (cols x n), Y [n, rows] is Y^T (rows x n):
	 * Y^T = W X^T, i.e. op(A) = transpose of the stored W^T. */
	s = cublasSgemm(b->h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, cols,
			&one, w_d, cols, x_d, cols, &zero, y_d, rows);
	return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_err(diag, s, "cublasSgemm");
}

static __device__ __forceinline__ void store_out(float *o, float v)
{
	*o = v;
}

/* BF16 tiles of the grouped prefill GEMM: round to nearest even (exact
 * for E2M1 x E8M0, which needs 2 mantissa bits). */
static __device__ __forceinline__ void store_out(__nv_bfloat16 *o, float v)
{
	*o = __float2bfloat16_rn(v);
}

/* Element c of row r of a quantized matrix (the formats of cw_cu_matvec). */
template <typename T>
__global__ void dequant_kernel(int dt, const uint8_t *data,
			       const uint8_t *scales, int64_t rows,
			       int64_t cols, int64_t ngroups, int group,
			       float gscale, T *out)
{
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i >= rows * cols)
		return;
	const int64_t r = i / cols, c = i % cols;
	const int64_t si = r * ngroups + c / group;
	float v;

	switch (dt) {
	case ST_DTYPE_MXFP4:
	case ST_DTYPE_NVFP4:
	case ST_DTYPE_E2M1_F16: {
		const unsigned b = data[r * (cols / 2) + c / 2];
		const float q = cw_cu_e2m1_const((c & 1) ? b >> 4 : b & 15u);

		if (dt == ST_DTYPE_MXFP4)
			v = q * cw_cu_e8m0(scales[si]);
		else if (dt == ST_DTYPE_NVFP4)
			v = (q * cw_cu_e4m3(scales[si])) * gscale;
		else
			v = q * __half2float(__ushort_as_half(
				((const unsigned short *)scales)[si]));
		break;
	}
	case ST_DTYPE_F8_E4M3:
		v = cw_cu_e4m3(data[i]) *
		    (scales ? ((const float *)scales)[si] : 1.0f);
		break;
	case ST_DTYPE_BF16:
		v = __uint_as_float((unsigned)((const unsigned short *)data)[i]
				    << 16);
		break;
	default:
		v = ((const float *)data)[i];
		break;
	}
	store_out(&out[i], v);
}

/* Group size of a view's scales (> 0), or a negative code with diag for an unsupported or
 * inconsistent view (shared by the float32 and BF16 dequantizers). */
static int view_group(const struct cw_wview *w, const char *who,
		      struct st_diag *diag)
{
	const int64_t R = w->rows, C = w->cols;
	int group = 1;

	switch (w->dtype) {
	case ST_DTYPE_MXFP4: group = 32; break;
	case ST_DTYPE_NVFP4: group = 16; break;
	case ST_DTYPE_E2M1_F16: group = (int)w->group; break;
	case ST_DTYPE_F8_E4M3: group = w->group ? (int)w->group : (int)C; break;
	case ST_DTYPE_BF16:
	case ST_DTYPE_F32: break;
	default:
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "%s: dtype %d not "
				   "supported", who, (int)w->dtype);
	}
	if (R < 0 || C < 0 || group < 1 ||
	    ((w->dtype == ST_DTYPE_MXFP4 || w->dtype == ST_DTYPE_NVFP4) &&
	     C % group) ||
	    (w->dtype == ST_DTYPE_E2M1_F16 && (group % 2 || C % 2))) {
		return st_diag_set(diag, -EINVAL, "%s: %lld x %lld with group "
				   "%d", who, (long long)R, (long long)C, group);
	}
	return group;
}

int cw_cu_dequant_f32(const struct cw_wview *w, float *out_d, void *stream,
		      struct st_diag *diag)
{
	const int64_t R = w->rows, C = w->cols, n = R * C;
	int group = view_group(w, "cw_cu_dequant_f32", diag);

	if (group < 0)
		return group;
	if (!n)
		return 0;
	dequant_kernel<float><<<(unsigned)((n + 255) / 256), 256, 0,
			 (cudaStream_t)stream>>>((int)w->dtype,
			(const uint8_t *)w->data, w->scales, R, C,
			(C + group - 1) / group, group, w->global_scale, out_d);
	return cw_cu_launched(diag, "cw_cu_dequant_f32 launch");
}

/* --- grouped prefill GEMM: BF16 tiles + cuBLAS --- */

__global__ void f32_to_bf16_kernel(const float *x, __nv_bfloat16 *y, int64_t n)
{
	const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		y[i] = __float2bfloat16_rn(x[i]);
}

size_t cw_cu_gemm_grouped_scratch(const struct cw_cu_group *g, int n_groups)
{
	size_t most = 0;

	for (int i = 0; i < n_groups; i++) {
		size_t b = ((size_t)g[i].w->rows * g[i].w->cols +
			    (size_t)g[i].n_tok * g[i].w->cols) * 2 + 256;

		if (b > most)
			most = b;
	}
	return most;
}

int cw_cu_gemm_grouped_bf16(struct cw_cu_blas *b, const struct cw_cu_group *g,
			    int n_groups, void *scratch_d,
			    size_t scratch_bytes, void *stream,
			    struct st_diag *diag)
{
	const float one = 1.0f, zero = 0.0f;
	cublasStatus_t s;

	if (n_groups < 0 || (n_groups && !g))
		return st_diag_set(diag, -EINVAL, "cw_cu_gemm_grouped_bf16: %d "
				   "groups", n_groups);
	if (cw_cu_gemm_grouped_scratch(g, n_groups) > scratch_bytes)
		return st_diag_set(diag, -EINVAL, "cw_cu_gemm_grouped_bf16: "
				   "scratch of %zu bytes, %zu needed",
				   scratch_bytes,
				   cw_cu_gemm_grouped_scratch(g, n_groups));
	s = cublasSetStream(b->h16, (cudaStream_t)stream);
	if (s != CUBLAS_STATUS_SUCCESS)
		return blas_err(diag, s, "cublasSetStream");
	for (int i = 0; i < n_groups; i++) {
		const struct cw_wview *w = g[i].w;
		const int64_t R = w->rows, C = w->cols, nw = R * C;
		const int64_t nx = (int64_t)g[i].n_tok * C;
		__nv_bfloat16 *wt = (__nv_bfloat16 *)scratch_d;
		/* x tile after the weight tile, 256-byte aligned */
		__nv_bfloat16 *xt = (__nv_bfloat16 *)((uint8_t *)scratch_d +
			(((size_t)nw * 2 + 255) / 256 * 256));
		int group = view_group(w, "cw_cu_gemm_grouped_bf16", diag);
		int r;

		if (group < 0)
			return group;
		if (g[i].n_tok < 0 || R > INT32_MAX || C > INT32_MAX)
			return st_diag_set(diag, -EINVAL, "group %d: %lld x "
					   "%lld, %d tokens", i, (long long)R,
					   (long long)C, g[i].n_tok);
		if (!g[i].n_tok || !nw)
			continue;
		dequant_kernel<__nv_bfloat16><<<(unsigned)((nw + 255) / 256),
			256, 0, (cudaStream_t)stream>>>((int)w->dtype,
			(const uint8_t *)w->data, w->scales, R, C,
			(C + group - 1) / group, group, w->global_scale, wt);
		r = cw_cu_launched(diag, "grouped GEMM dequantize");
		if (r < 0)
			return r;
		f32_to_bf16_kernel<<<(unsigned)((nx + 255) / 256), 256, 0,
				     (cudaStream_t)stream>>>(g[i].x_d, xt, nx);
		r = cw_cu_launched(diag, "grouped GEMM activations");
		if (r < 0)
			return r;
		/* Y^T [R, n] = W [R, C] X^T [C, n] in column-major terms, as
		 * cw_cu_gemm_f32; BF16 inputs, float32 accumulation */
		s = cublasGemmEx(b->h16, CUBLAS_OP_T, CUBLAS_OP_N, (int)R,
				 g[i].n_tok, (int)C, &one, wt, CUDA_R_16BF,
				 (int)C, xt, CUDA_R_16BF, (int)C, &zero,
				 g[i].y_d, CUDA_R_32F, (int)R,
				 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (s != CUBLAS_STATUS_SUCCESS)
			return blas_err(diag, s, "cublasGemmEx (BF16)");
	}
	return 0;
}
