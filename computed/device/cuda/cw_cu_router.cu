/*
 * cw_cu_router.cu — MoE router on the device (cw_cu.h): per token, softmax
 * over the expert logits and the top-k by descending probability, ties to
 * the lower expert id, the same steps as cw_route_topk (cw_router.c).
 */
#include "cw_cu_int.h"

#define ROUTER_THREADS 256
#define ROUTER_MAX_EXPERTS 1024
#define ROUTER_MAX_K 64

/* a beats b: higher probability, or equal and lower id */
__device__ __forceinline__ int beats(float pa, int a, float pb, int b)
{
	if (b < 0)
		return a >= 0;
	if (a < 0)
		return 0;
	return pa > pb || (pa == pb && a < b);
}

__global__ void __launch_bounds__(ROUTER_THREADS)
router_kernel(const float *logits, int n_experts, int k, int renorm,
	      int *ret_e, float *ret_w)
{
	__shared__ float p[ROUTER_MAX_EXPERTS];
	__shared__ unsigned char used[ROUTER_MAX_EXPERTS];
	__shared__ float red_f[ROUTER_THREADS / 32];
	__shared__ int red_i[ROUTER_THREADS / 32];
	__shared__ double red_d[ROUTER_THREADS / 32];
	__shared__ float s_mx;
	__shared__ double s_sum;
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const float *l = logits + (size_t)blockIdx.x * n_experts;
	float mx = -INFINITY;
	double sum = 0.0;

	for (int e = tid; e < n_experts; e += ROUTER_THREADS) {
		mx = fmaxf(mx, l[e]);
		used[e] = 0;
	}
	for (int o = 16; o > 0; o >>= 1)
		mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, o));
	if (!lane)
		red_f[wid] = mx;
	__syncthreads();
	if (!tid) {
		for (int i = 1; i < ROUTER_THREADS / 32; i++)
			red_f[0] = fmaxf(red_f[0], red_f[i]);
		s_mx = red_f[0];
	}
	__syncthreads();
	for (int e = tid; e < n_experts; e += ROUTER_THREADS) {
		p[e] = expf(__fsub_rn(l[e], s_mx));
		sum += p[e];
	}
	for (int o = 16; o > 0; o >>= 1)
		sum += __shfl_down_sync(0xffffffffu, sum, o);
	if (!lane)
		red_d[wid] = sum;
	__syncthreads();
	if (!tid) {
		double t = 0.0;

		for (int i = 0; i < ROUTER_THREADS / 32; i++)
			t += red_d[i];
		s_sum = t;
	}
	__syncthreads();
	for (int e = tid; e < n_experts; e += ROUTER_THREADS)
		p[e] = (float)(p[e] / s_sum);
	__syncthreads();
	double wsum = 0.0;

	for (int j = 0; j < k; j++) {
		float bp = 0.0f;
		int be = -1;

		for (int e = tid; e < n_experts; e += ROUTER_THREADS)
			if (!used[e] && beats(p[e], e, bp, be)) {
				bp = p[e];
				be = e;
			}
		for (int o = 16; o > 0; o >>= 1) {
			const float op = __shfl_down_sync(0xffffffffu, bp, o);
			const int oe = __shfl_down_sync(0xffffffffu, be, o);

			if (beats(op, oe, bp, be)) {
				bp = op;
				be = oe;
			}
		}
		if (!lane) {
			red_f[wid] = bp;
			red_i[wid] = be;
		}
		__syncthreads();
		if (!tid) {
			for (int i = 1; i < ROUTER_THREADS / 32; i++)
				if (beats(red_f[i], red_i[i], bp, be)) {
					bp = red_f[i];
					be = red_i[i];
				}
			used[be] = 1;
			ret_e[(size_t)blockIdx.x * k + j] = be;
			ret_w[(size_t)blockIdx.x * k + j] = bp;
			wsum += bp;
		}
		__syncthreads();
	}
	if (!tid && renorm)
		for (int j = 0; j < k; j++) {
			float *w = ret_w + (size_t)blockIdx.x * k + j;

			*w = (float)(*w / wsum);
		}
}

int cw_cu_route_topk(const float *logits_d, int n_tok, int n_experts, int k,
		     int renormalise, int *ret_experts_d,
		     float *ret_weights_d, void *stream,
		     struct st_diag *diag)
{
	if (n_tok < 0 || n_experts < 1 || n_experts > ROUTER_MAX_EXPERTS ||
	    k < 1 || k > n_experts || k > ROUTER_MAX_K)
		return st_diag_set(diag, -EINVAL, "cw_cu_route_topk: %d experts"
				   " (1..%d), top-%d (1..%d)", n_experts,
				   ROUTER_MAX_EXPERTS, k, ROUTER_MAX_K);
	if (!n_tok)
		return 0;
	router_kernel<<<(unsigned)n_tok, ROUTER_THREADS, 0,
			(cudaStream_t)stream>>>(logits_d, n_experts, k,
					       renormalise, ret_experts_d,
					       ret_weights_d);
	return cw_cu_launched(diag, "cw_cu_route_topk launch");
}
