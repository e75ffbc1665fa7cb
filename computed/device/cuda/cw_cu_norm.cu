/*
 * cw_cu_norm.cu — RMSNorm, half-split RoPE and SwiGLU on the device
 * (cw_cu.h), twins of cw_cpu_rmsnorm, cw_cpu_rope and cw_swiglu.
 */
#include "cw_cu_int.h"

#define NORM_THREADS 256

__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *x, const void *w, int bf16, int n, float eps,
	       float *y)
{
	__shared__ double part[NORM_THREADS / 32];
	__shared__ float inv;
	const int tid = threadIdx.x;
	double ss = 0.0; /* double, as the CPU: no overflow for |x| ~ 1e20 */

	for (int i = tid; i < n; i += NORM_THREADS)
		ss += (double)x[i] * x[i];
	for (int o = 16; o > 0; o >>= 1)
		ss += __shfl_down_sync(0xffffffffu, ss, o);
	if ((tid & 31) == 0)
		part[tid >> 5] = ss;
	__syncthreads();
	if (tid == 0) {
		double t = 0.0;

		for (int i = 0; i < NORM_THREADS / 32; i++)
			t += part[i];
		/* the CPU's formula: eps inside the square root, in double */
		inv = (float)(1.0 / sqrt(t / n + (double)eps));
	}
	__syncthreads();
	for (int i = tid; i < n; i += NORM_THREADS) {
		const float wv = bf16 ? __uint_as_float(
			(unsigned)((const unsigned short *)w)[i] << 16) :
			((const float *)w)[i];

		y[i] = wv * (x[i] * inv);
	}
}

int cw_cu_rmsnorm(const float *x_d, const void *weight_d,
		  enum st_dtype wdtype, int n, float eps, float *y_d,
		  void *stream, struct st_diag *diag)
{
	if (n < 1 || (wdtype != ST_DTYPE_F32 && wdtype != ST_DTYPE_BF16))
		return st_diag_set(diag, -EINVAL, "cw_cu_rmsnorm: n %d, weight "
				   "dtype %d (F32 or BF16)", n, (int)wdtype);
	rmsnorm_kernel<<<1, NORM_THREADS, 0, (cudaStream_t)stream>>>(
		x_d, weight_d, wdtype == ST_DTYPE_BF16, n, eps, y_d);
	return cw_cu_launched(diag, "cw_cu_rmsnorm launch");
}

/* One thread per (head, i < half): rotates the pair (i, i + half). */
__global__ void rope_kernel(float *x, int n_heads, int head_dim, int pos,
			    double theta)
{
	const int half = head_dim / 2;
	const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (t >= (int64_t)n_heads * half)
		return;
	const int h = (int)(t / half), i = (int)(t % half);
	const double inv_freq = pow(theta, -2.0 * i / head_dim);
	const double ang = (double)pos * inv_freq;
	const float c = (float)cos(ang), s = (float)sin(ang);
	float *v = x + (size_t)h * head_dim;
	const float a = v[i], b = v[i + half];

	v[i] = a * c - b * s;
	v[i + half] = b * c + a * s;
}

int cw_cu_rope(float *x_d, int n_heads, int head_dim, int pos, double theta,
	       void *stream, struct st_diag *diag)
{
	const int64_t n = (int64_t)n_heads * (head_dim / 2);

	if (n_heads < 1 || head_dim < 2 || head_dim % 2)
		return st_diag_set(diag, -EINVAL, "cw_cu_rope: %d heads of %d "
				   "(even head_dim)", n_heads, head_dim);
	rope_kernel<<<(unsigned)((n + 255) / 256), 256, 0,
		      (cudaStream_t)stream>>>(x_d, n_heads, head_dim, pos, theta);
	return cw_cu_launched(diag, "cw_cu_rope launch");
}

__global__ void swiglu_kernel(const float *g, const float *u, int n,
			      float *out)
{
	const int i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n) {
		const float z = g[i];

		/* no fused multiply-add: the CPU rounds each step */
		out[i] = __fmul_rn(__fdiv_rn(z, __fadd_rn(1.0f, expf(-z))), u[i]);
	}
}

int cw_cu_swiglu(const float *gate_d, const float *up_d, int n, float *out_d,
		 void *stream, struct st_diag *diag)
{
	if (n < 0)
		return st_diag_set(diag, -EINVAL, "cw_cu_swiglu: n %d", n);
	if (!n)
		return 0;
	swiglu_kernel<<<(unsigned)((n + 255) / 256), 256, 0,
			(cudaStream_t)stream>>>(gate_d, up_d, n, out_d);
	return cw_cu_launched(diag, "cw_cu_swiglu launch");
}
