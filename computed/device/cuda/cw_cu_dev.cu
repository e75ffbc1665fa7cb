/*
 * cw_cu_dev.cu — device probe, memory and timing wrappers of the CUDA
 * backend (cw_cu.h), so C code (computed, tests) needs no CUDA headers.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cw_cu_int.h"

int cw_cu_device_count(char *reason, size_t n)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e != cudaSuccess) {
		if (reason && n)
			snprintf(reason, n, "cudaGetDeviceCount: %s (%s)",
				 cudaGetErrorString(e), cudaGetErrorName(e));
		return 0;
	}
	if (count <= 0) {
		if (reason && n)
			snprintf(reason, n, "cudaGetDeviceCount found 0 devices");
		return 0;
	}
	return count;
}

int cw_cu_device_describe(char *buf, size_t n, struct st_diag *diag)
{
	cudaDeviceProp p;
	cudaError_t e = cudaGetDeviceProperties(&p, 0);

	if (e != cudaSuccess)
		return cw_cu_err(diag, e, "cudaGetDeviceProperties");
	snprintf(buf, n, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major,
		 p.minor, p.multiProcessorCount,
		 (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
	return 0;
}

int cw_cu_alloc(void **ret, size_t bytes, struct st_diag *diag)
{
	cudaError_t e;

	*ret = NULL;
	if (!bytes)
		return 0;
	e = cudaMalloc(ret, bytes);
	if (e != cudaSuccess) {
		*ret = NULL;
		return cw_cu_err(diag, e, "cudaMalloc");
	}
	return 0;
}

void cw_cu_free(void *p_d)
{
	if (p_d)
		cudaFree(p_d);
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
		struct st_diag *diag)
{
	cudaError_t e;

	if (!bytes)
		return 0;
	e = cudaMemcpy(dst, src, bytes, k);
	return e == cudaSuccess ? 0 : cw_cu_err(diag, e, "cudaMemcpy");
}

int cw_cu_h2d(void *dst_d, const void *src, size_t bytes,
	      struct st_diag *diag)
{
	return copy(dst_d, src, bytes, cudaMemcpyHostToDevice, diag);
}

int cw_cu_d2h(void *dst, const void *src_d, size_t bytes,
	      struct st_diag *diag)
{
	return copy(dst, src_d, bytes, cudaMemcpyDeviceToHost, diag);
}

int cw_cu_d2d(void *dst_d, const void *src_d, size_t bytes,
	      struct st_diag *diag)
{
	return copy(dst_d, src_d, bytes, cudaMemcpyDeviceToDevice, diag);
}

int cw_cu_memset(void *dst_d, int byte, size_t bytes, struct st_diag *diag)
{
	cudaError_t e = cudaMemset(dst_d, byte, bytes);

	return e == cudaSuccess ? 0 : cw_cu_err(diag, e, "cudaMemset");
}

int cw_cu_sync(struct st_diag *diag)
{
	cudaError_t e = cudaDeviceSynchronize();

	if (e == cudaSuccess)
		e = cudaGetLastError();
	return e == cudaSuccess ? 0 : cw_cu_err(diag, e, "kernel");
}

struct cw_cu_timer {
	cudaEvent_t a, b;
};

int cw_cu_timer_new(struct cw_cu_timer **ret, struct st_diag *diag)
{
	struct cw_cu_timer *t = (struct cw_cu_timer *)calloc(1, sizeof(*t));
	cudaError_t e;

	if (!t)
		return st_diag_set(diag, -ENOMEM, "cw_cu_timer_new: out of memory");
	e = cudaEventCreate(&t->a);

	if (e == cudaSuccess) {
		e = cudaEventCreate(&t->b);
		if (e != cudaSuccess)
			cudaEventDestroy(t->a);
	}
	if (e != cudaSuccess) {
		free(t);
		*ret = NULL;
		return cw_cu_err(diag, e, "cudaEventCreate");
	}
	*ret = t;
	return 0;
}

void cw_cu_timer_free(struct cw_cu_timer *t)
{
	if (!t)
		return;
	cudaEventDestroy(t->a);
	cudaEventDestroy(t->b);
	free(t);
}

void cw_cu_timer_start(struct cw_cu_timer *t)
{
	cudaEventRecord(t->a, 0);
}

double cw_cu_timer_stop_ms(struct cw_cu_timer *t)
{
	float ms = 0.0f;

	if (cudaEventRecord(t->b, 0) != cudaSuccess ||
	    cudaEventSynchronize(t->b) != cudaSuccess ||
	    cudaEventElapsedTime(&ms, t->a, t->b) != cudaSuccess)
		return -1.0;
	return ms;
}
