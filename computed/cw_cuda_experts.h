/*
 * cw_cuda_experts.h — the CUDA entry of computed's forward pass (issue
 * 10): routed experts computed on the GPU straight from the device expert
 * slots expertd filled (cw_devpool.h), the rest of the step (attention,
 * dense layers, router) on the CPU backend for now.  It plugs into the
 * model as its cw_expert_fn (cw_model.h): for each routed expert of a
 * step, when the expert is READY in a device slot, the compute stream
 * waits for that slot's copy event only, then runs gate and up GEMVs
 * (cw_cu_matvec), SwiGLU and the down GEMV per token for decode, or the
 * grouped BF16 GEMM (cw_cu_gemm_grouped_bf16) for 8 tokens or more
 * (prefill); an expert not on the device runs on the CPU from the host
 * pool, as before.  Built only with the CUDA feature.
 *
 * Numerics: float32 activations like reference mode, but the device's
 * summation order (cw_cu.h tolerances), so a run with device experts is
 * not bit-identical to reference mode; tests compare within cw_cu.h's
 * bounds.
 */
#ifndef CW_CUDA_EXPERTS_H
#define CW_CUDA_EXPERTS_H

#include <stdint.h>

#include "cw_backend.h"
#include "cw_devpool.h"
#include "st_error.h"

struct cw_cuda_experts;

/*
 * Sets up the device path for a model of hidden_size and expert_inter
 * (floats), reading experts through dev (borrowed).  *ret owned by the
 * caller.  0, -ENOMEM, -ST_E_CUDA / -ST_E_CUBLAS.
 */
int cw_cuda_experts_create(struct cw_cuda_experts **ret,
			   struct cw_devpool *dev, int hidden_size,
			   int expert_inter, struct st_diag *diag);
void cw_cuda_experts_destroy(struct cw_cuda_experts *c);

/* The cw_expert_fn (arg: the struct cw_cuda_experts). */
int cw_cuda_experts_fn(void *arg, int layer, int expert, const uint8_t *rec,
		       const struct cw_wview w[3], int n,
		       const float *const *x, float *const *out);

/* Experts run on the device and left to the CPU so far. */
void cw_cuda_experts_counts(const struct cw_cuda_experts *c,
			    uint64_t *ret_device, uint64_t *ret_cpu);

#endif
