/*
 * cw_cu_gemv.cu — dequant-GEMV for decode (cw_cu.h): one thread block of
 * CW_CU_GEMV_THREADS per output row reads the row's 4-bit (or 8-bit, BF16,
 * F32) weights and their scales straight from device memory, dequantizes
 * them to exactly the floats of st_formats' *_dequantize_row, and sums
 * their products with x in float32 (fused multiply-add): each thread in
 * order over its chunks, then a warp-shuffle and shared-memory tree.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cw_cu_int.h"

#define T CW_CU_GEMV_THREADS

/* The formats the kernels are instantiated for. */
enum { F_MXFP4, F_NVFP4, F_E2M1F16, F_FP8, F_BF16, F_F32 };

struct gemv_args {
	const uint8_t *data;   /* codes / elements, row-major */
	const uint8_t *scales; /* row-major by (row, group), or NULL */
	const float *x;
	float *y;
	int64_t cols;
	int64_t row_bytes;     /* bytes of data per row */
	int64_t ngroups;       /* scales per row */
	int group;             /* elements per scale */
	float gscale;          /* NVFP4 tensor scale */
	int vec;               /* 1: the 16-bytes-per-step path */
};

/* Scale of element c of row r (any format with scales). */
template <int F>
__device__ __forceinline__ float scale_at(const gemv_args &a, int64_t r,
					  int64_t c)
{
	const int64_t i = r * a.ngroups + c / a.group;

	if (F == F_MXFP4)
		return cw_cu_e8m0(a.scales[i]);
	if (F == F_NVFP4)
		return cw_cu_e4m3(a.scales[i]);
	if (F == F_E2M1F16)
		return __half2float(__ushort_as_half(
			((const unsigned short *)a.scales)[i]));
	/* F_FP8 */
	return a.scales ? ((const float *)a.scales)[i] : 1.0f;
}

/* One dequantized FP4 value: code value v times scale s (times the NVFP4
 * tensor scale, in the order st_nvfp4_dequantize_row multiplies). */
template <int F>
__device__ __forceinline__ float fp4_val(const gemv_args &a, float v, float s)
{
	if (F == F_NVFP4)
		return (v * s) * a.gscale;
	return v * s;
}

/* Vectorised step of a 4-bit format: 32 elements from 16 bytes of codes,
 * starting at column c (c % 32 == 0); every group size is a multiple of
 * 16, so elements [c, c+16) share one scale and [c+16, c+32) one. */
template <int F>
__device__ __forceinline__ float step_fp4(const gemv_args &a, int64_t r,
					  int64_t c, const float *lut,
					  float acc)
{
	const uint4 q = *(const uint4 *)(a.data + r * a.row_bytes + c / 2);
	const float s0 = scale_at<F>(a, r, c), s1 = scale_at<F>(a, r, c + 16);
	const unsigned w[4] = { q.x, q.y, q.z, q.w };
	const float4 *x4 = (const float4 *)(a.x + c);

#pragma unroll
	for (int k = 0; k < 4; k++) {
		const float s = k < 2 ? s0 : s1;
		const float4 xa = x4[2 * k], xb = x4[2 * k + 1];
		const unsigned b = w[k];

		acc = fmaf(fp4_val<F>(a, lut[b & 15], s), xa.x, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 4) & 15], s), xa.y, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 8) & 15], s), xa.z, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 12) & 15], s), xa.w, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 16) & 15], s), xb.x, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 20) & 15], s), xb.y, acc);
		acc = fmaf(fp4_val<F>(a, lut[(b >> 24) & 15], s), xb.z, acc);
		acc = fmaf(fp4_val<F>(a, lut[b >> 28], s), xb.w, acc);
	}
	return acc;
}

/* Vectorised step of FP8 (16 elements, one scale: group % 16 == 0), BF16
 * (8 elements) or F32 (4 elements) from 16 bytes. */
template <int F>
__device__ __forceinline__ float step_wide(const gemv_args &a, int64_t r,
					   int64_t c, float acc)
{
	const uint4 q = *(const uint4 *)(a.data + r * a.row_bytes +
					 c * (F == F_FP8 ? 1 : F == F_BF16 ? 2 : 4));
	const unsigned w[4] = { q.x, q.y, q.z, q.w };

	if (F == F_FP8) {
		const float s = scale_at<F>(a, r, c);

#pragma unroll
		for (int k = 0; k < 4; k++)
#pragma unroll
			for (int b = 0; b < 4; b++)
				acc = fmaf(cw_cu_e4m3((w[k] >> (8 * b)) & 255u) * s,
					   a.x[c + 4 * k + b], acc);
	} else if (F == F_BF16) {
#pragma unroll
		for (int k = 0; k < 4; k++) {
			acc = fmaf(__uint_as_float(w[k] << 16), a.x[c + 2 * k], acc);
			acc = fmaf(__uint_as_float(w[k] & 0xffff0000u),
				   a.x[c + 2 * k + 1], acc);
		}
	} else {
#pragma unroll
		for (int k = 0; k < 4; k++)
			acc = fmaf(__uint_as_float(w[k]), a.x[c + k], acc);
	}
	return acc;
}

/* One element of any format (the path for odd sizes and alignments). */
template <int F>
__device__ __forceinline__ float elem(const gemv_args &a, int64_t r,
				      int64_t c, const float *lut)
{
	const uint8_t *row = a.data + r * a.row_bytes;

	if (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16) {
		const unsigned b = row[c / 2];

		return fp4_val<F>(a, lut[(c & 1) ? b >> 4 : b & 15],
				  scale_at<F>(a, r, c));
	}
	if (F == F_FP8)
		return cw_cu_e4m3(row[c]) * scale_at<F>(a, r, c);
	if (F == F_BF16)
		return __uint_as_float((unsigned)((const unsigned short *)row)[c]
				       << 16);
	return ((const float *)row)[c];
}

template <int F>
__global__ void __launch_bounds__(T) gemv_kernel(gemv_args a)
{
	__shared__ float lut[16];
	__shared__ float part[T / 32];
	const int64_t r = blockIdx.x;
	const int tid = threadIdx.x;
	float acc = 0.0f;

	if (tid < 16)
		lut[tid] = cw_cu_e2m1_const(tid);
	__syncthreads();
	if (a.vec) {
		const int per = (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16) ?
					32 : F == F_FP8 ? 16 : F == F_BF16 ? 8 : 4;

		for (int64_t c = (int64_t)tid * per; c < a.cols; c += T * per) {
			if (F == F_MXFP4 || F == F_NVFP4 || F == F_E2M1F16)
				acc = step_fp4<F>(a, r, c, lut, acc);
			else
				acc = step_wide<F>(a, r, c, acc);
		}
	} else {
		for (int64_t c = tid; c < a.cols; c += T)
			acc = fmaf(elem<F>(a, r, c, lut), a.x[c], acc);
	}
	for (int o = 16; o > 0; o >>= 1)
		acc += __shfl_down_sync(0xffffffffu, acc, o);
	if ((tid & 31) == 0)
		part[tid >> 5] = acc;
	__syncthreads();
	if (tid == 0) {
		float s = part[0];

		for (int i = 1; i < T / 32; i++)
			s += part[i];
		a.y[r] = s;
	}
}

static int is_aligned(const void *p, size_t n)
{
	return ((uintptr_t)p % n) == 0;
}

uint64_t cw_cu_matvec_weight_bytes(const struct cw_wview *w)
{
	const uint64_t R = (uint64_t)w->rows, C = (uint64_t)w->cols;

	switch (w->dtype) {
	case ST_DTYPE_F32: return R * C * 4;
	case ST_DTYPE_BF16: return R * C * 2;
	case ST_DTYPE_MXFP4: return R * C / 2 + R * (C / 32);
	case ST_DTYPE_NVFP4: return R * C / 2 + R * (C / 16);
	case ST_DTYPE_E2M1_F16:
		return R * C / 2 + R * ((C + w->group - 1) / w->group) * 2;
	case ST_DTYPE_F8_E4M3: {
		const uint64_t g = w->group ? w->group : C;

		return R * C + (w->scales ? R * ((C + g - 1) / g) * 4 : 0);
	}
	default: return 0;
	}
}

int cw_cu_matvec(const struct cw_wview *w, const float *x_d, float *y_d,
		 void *stream, struct st_diag *diag)
{
	cudaStream_t st = (cudaStream_t)stream;
	gemv_args a;
	const int64_t C = w->cols;
	int f;

	if (w->rows < 0 || C < 0 || w->rows > 0x7fffffff)
		return st_diag_set(diag, -EINVAL, "cw_cu_matvec: bad shape "
				   "%lld x %lld", (long long)w->rows,
				   (long long)C);
	if (!w->rows)
		return 0;
	a.data = (const uint8_t *)w->data;
	a.scales = w->scales;
	a.x = x_d;
	a.y = y_d;
	a.cols = C;
	a.gscale = w->global_scale;
	a.group = 1;
	a.ngroups = 0;
	switch (w->dtype) {
	case ST_DTYPE_MXFP4:
	case ST_DTYPE_NVFP4:
	case ST_DTYPE_E2M1_F16:
		f = w->dtype == ST_DTYPE_MXFP4 ? F_MXFP4 :
		    w->dtype == ST_DTYPE_NVFP4 ? F_NVFP4 : F_E2M1F16;
		a.group = f == F_MXFP4 ? 32 : f == F_NVFP4 ? 16 : (int)w->group;
		if (a.group < 2 || a.group % 2 || C % 2 ||
		    (C % a.group && f != F_E2M1F16))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: dtype %d "
					   "needs an even group dividing the "
					   "columns (cols %lld, group %d)",
					   (int)w->dtype,
					   (long long)C, a.group);
		if (!w->scales || (f == F_E2M1F16 && !is_aligned(w->scales, 2)))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: missing "
					   "or misaligned scales");
		a.row_bytes = C / 2;
		a.ngroups = (C + a.group - 1) / a.group;
		a.vec = C % 32 == 0 && a.group % 16 == 0 &&
			is_aligned(a.data, 16) && is_aligned(x_d, 16);
		break;
	case ST_DTYPE_F8_E4M3:
		f = F_FP8;
		a.group = w->group ? (int)w->group : (int)(C ? C : 1);
		if (w->scales && !is_aligned(w->scales, 4))
			return st_diag_set(diag, -EINVAL, "cw_cu_matvec: "
					   "misaligned FP8 scales");
		a.row_bytes = C;
		a.ngroups = (C + a.group - 1) / a.group;
		a.vec = C % 16 == 0 && (a.group % 16 == 0 || !w->scales) &&
			is_aligned(a.data, 16);
		break;
	case ST_DTYPE_BF16:
		f = F_BF16;
		a.row_bytes = C * 2;
		a.vec = C % 8 == 0 && is_aligned(a.data, 16);
		break;
	case ST_DTYPE_F32:
		f = F_F32;
		a.row_bytes = C * 4;
		a.vec = C % 4 == 0 && is_aligned(a.data, 16);
		break;
	default:
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "cw_cu_matvec: "
				   "dtype %d not supported", (int)w->dtype);
	}
	switch (f) {
	case F_MXFP4: gemv_kernel<F_MXFP4><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	case F_NVFP4: gemv_kernel<F_NVFP4><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	case F_E2M1F16: gemv_kernel<F_E2M1F16><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	case F_FP8: gemv_kernel<F_FP8><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	case F_BF16: gemv_kernel<F_BF16><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	default: gemv_kernel<F_F32><<<(unsigned)w->rows, T, 0, st>>>(a); break;
	}
	return cw_cu_launched(diag, "cw_cu_matvec launch");
}
