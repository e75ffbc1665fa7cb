/*
 * cw_cu_attn.cu — decode attention over paged KV rows on the device
 * (cw_cu.h): one query position, every head, over rows in the layout of
 * cw_kvrow.h (F32, F16, BF16, or FP8 E4M3 with a float32 scale per row and
 * KV head), reached through a table of row pointers (the page table).  The
 * steps of computed's CPU attention (cw_model.c attend): scores q.k /
 * sqrt(head_dim), softmax with float32 exps and a double sum, then the
 * probability-weighted sum of V.
 */
#include <cuda_fp16.h>
#include <string.h>

#include "cw_cu_int.h"

#define ATTN_THREADS 128

/* Element i of KV head `head` of K (which 0) or V (1) of a row. */
__device__ __forceinline__ float kv_at(const uint8_t *row, int dt, int nkv,
				       int hd, int which, int head, int i)
{
	const size_t n = (size_t)nkv * hd;
	const size_t off = (size_t)which * n + (size_t)head * hd + i;

	if (dt == ST_DTYPE_F32)
		return ((const float *)row)[off];
	if (dt == ST_DTYPE_F16)
		return __half2float(((const __half *)row)[off]);
	if (dt == ST_DTYPE_BF16)
		return __uint_as_float(
			(unsigned)((const unsigned short *)row)[off] << 16);
	float s;

	memcpy(&s, row + 2 * n + ((size_t)which * nkv + head) * 4, 4);
	return cw_cu_e4m3(row[off]) * s;
}

__global__ void __launch_bounds__(ATTN_THREADS)
attn_kernel(const float *q, const uint8_t *const *rows, int n_rows, int dt,
	    int n_heads, int nkv, int hd, float *scores, float *out)
{
	__shared__ float red_f[ATTN_THREADS / 32];
	__shared__ double red_d[ATTN_THREADS / 32];
	__shared__ float s_mx;
	__shared__ double s_sum;
	const int h = blockIdx.x, kvh = h / (n_heads / nkv);
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const float *qh = q + (size_t)h * hd;
	float *sc = scores + (size_t)h * n_rows;
	const float scale = 1.0f / sqrtf((float)hd);
	float mx = -INFINITY;
	double sum = 0.0;

	/* scores: a warp per row, lanes over the head's elements */
	for (int j = wid; j < n_rows; j += ATTN_THREADS / 32) {
		const uint8_t *row = rows[j];
		float d = 0.0f;

		for (int i = lane; i < hd; i += 32)
			d = fmaf(qh[i], kv_at(row, dt, nkv, hd, 0, kvh, i), d);
		for (int o = 16; o > 0; o >>= 1)
			d += __shfl_down_sync(0xffffffffu, d, o);
		if (!lane) {
			d *= scale;
			sc[j] = d;
			mx = fmaxf(mx, d);
		}
	}
	if (!lane)
		red_f[wid] = mx;
	__syncthreads();
	if (!tid) {
		for (int i = 1; i < ATTN_THREADS / 32; i++)
			red_f[0] = fmaxf(red_f[0], red_f[i]);
		s_mx = red_f[0];
	}
	__syncthreads();
	for (int j = tid; j < n_rows; j += ATTN_THREADS) {
		const float e = expf(__fsub_rn(sc[j], s_mx));

		sc[j] = e;
		sum += e;
	}
	for (int o = 16; o > 0; o >>= 1)
		sum += __shfl_down_sync(0xffffffffu, sum, o);
	if (!lane)
		red_d[wid] = sum;
	__syncthreads();
	if (!tid) {
		double t = 0.0;

		for (int i = 0; i < ATTN_THREADS / 32; i++)
			t += red_d[i];
		s_sum = t;
	}
	__syncthreads();
	/* output: a thread per element, rows in order */
	for (int i = tid; i < hd; i += ATTN_THREADS) {
		float o = 0.0f;

		for (int j = 0; j < n_rows; j++)
			o = fmaf((float)(sc[j] / s_sum),
				 kv_at(rows[j], dt, nkv, hd, 1, kvh, i), o);
		out[(size_t)h * hd + i] = o;
	}
}

int cw_cu_attend(const float *q_d, const uint8_t *const *rows_d, int n_rows,
		 enum st_dtype kv_dtype, int n_heads, int n_kv_heads,
		 int head_dim, float *scores_d, float *out_d, void *stream,
		 struct st_diag *diag)
{
	if (n_rows < 1 || n_heads < 1 || n_kv_heads < 1 ||
	    n_heads % n_kv_heads || head_dim < 1 ||
	    (kv_dtype != ST_DTYPE_F32 && kv_dtype != ST_DTYPE_F16 &&
	     kv_dtype != ST_DTYPE_BF16 && kv_dtype != ST_DTYPE_F8_E4M3))
		return st_diag_set(diag, -EINVAL, "cw_cu_attend: %d rows, %d "
				   "heads over %d KV heads of %d, KV dtype %d",
				   n_rows, n_heads, n_kv_heads, head_dim,
				   (int)kv_dtype);
	attn_kernel<<<(unsigned)n_heads, ATTN_THREADS, 0,
		      (cudaStream_t)stream>>>(q_d, rows_d, n_rows,
					     (int)kv_dtype, n_heads, n_kv_heads,
					     head_dim, scores_d, out_d);
	return cw_cu_launched(diag, "cw_cu_attend launch");
}
