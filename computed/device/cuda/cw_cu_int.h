/*
 * cw_cu_int.h — what the .cu files of computed/device/cuda share: error wrapping
 * and the exact decoders of the scale and code formats (device side twins
 * of st_formats.c, giving the same floats bit for bit).
 */
#ifndef CW_CU_INT_H
#define CW_CU_INT_H

#include <errno.h>
#include <cuda_runtime.h>

#include "cw_cu.h"

/* A CUDA runtime error as -ST_E_CUDA with "what: cuda message" in diag. */
static inline int cw_cu_err(struct st_diag *diag, cudaError_t e,
			    const char *what)
{
	return st_diag_set(diag, -ST_E_CUDA, "%s: %s (%s)", what,
			   cudaGetErrorString(e), cudaGetErrorName(e));
}

/* The launch error of the kernel just issued, if any. */
static inline int cw_cu_launched(struct st_diag *diag, const char *what)
{
	cudaError_t e = cudaGetLastError();

	return e == cudaSuccess ? 0 : cw_cu_err(diag, e, what);
}

/* E8M0: 2^(b-127); 0 is the subnormal 2^-127, 255 NaN (st_e8m0_to_f32). */
__device__ __forceinline__ float cw_cu_e8m0(unsigned b)
{
	if (b == 0)
		return __uint_as_float(0x00400000u);
	if (b == 255)
		return __uint_as_float(0x7fc00000u);
	return __uint_as_float(b << 23);
}

/* E4M3 (OCP FN): no inf, S.1111.111 NaN (st_e4m3_to_f32). */
__device__ __forceinline__ float cw_cu_e4m3(unsigned b)
{
	unsigned e = (b >> 3) & 0xfu, m = b & 7u;
	float v;

	if (e == 15 && m == 7)
		v = __uint_as_float(0x7fc00000u);
	else if (e == 0)
		v = (float)m * 0x1p-9f;
	else
		v = __uint_as_float(((e + 120u) << 23) | (m << 20));
	return (b & 0x80u) ? -v : v;
}

/* E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, by code
 * (a kernel copies it into shared memory: 16 floats in 16 banks, so any
 * two lanes reading different codes never conflict). */
__device__ __forceinline__ float cw_cu_e2m1_const(unsigned c)
{
	const float mag[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
	float v = mag[c & 7u];

	return (c & 8u) ? -v : v;
}

#endif
