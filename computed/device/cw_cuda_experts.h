/*
 * cw_cuda_experts.h — the CUDA entry of computed's forward pass (issue
 * 10): routed experts computed on the GPU straight from the device expert
 * slots expertd filled (cw_devpool.h), the rest of the step (attention,
 * dense layers, router) on the CPU backend for now.  It plugs into the
 * model as its cw_expert_fn and cw_expert_sync_fn (cw_device_ops.h): for each
 * routed expert of a step that is READY in a device slot, fn pins the
 * slot, makes the compute stream wait for that slot's copy event only (a
 * miss waits for its own expert only), and queues the expert's tokens
 * (staged in pinned memory); an expert of 8 tokens or more (prefill) runs
 * at once as grouped BF16 GEMMs (cw_cu_gemm_grouped_bf16), the decode
 * experts of the group start together when the model says the group is
 * complete (fn with expert -1): one copy of their tokens, one batched GEMV
 * launch (cw_cu_matvec_batch) for every gate and up, one SwiGLU, one for
 * every down; outputs gathered into one device buffer; nothing waits.
 * The model computes the experts not on the device on the CPU meanwhile
 * (from the host pool, as before), then calls sync once for the layer
 * (which starts anything not yet started): one copy of the gathered
 * outputs to the host, one stream sync, the outputs scattered to the
 * model's rows, and only then the batch's slots unpinned (the stream has
 * passed their reads).  A batch past 1024 (token, expert) pairs is synced
 * early by fn.  Built only with the CUDA feature.
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
#include "cw_device_ops.h"
#include "cw_devpool.h"
#include "st_error.h"

struct cw_cuda_experts;
struct cw_cuda_attn;


/* What computed lends the module: its device pool's pin and unpin
 * (cw_devpool.h), called with the pool given to create. */
struct cw_cuda_pool_ops {
	int (*pin)(struct cw_devpool *p, uint32_t layer, uint32_t expert,
		   void *stream, const void **ret_ptr, uint32_t *ret_slot);
	void (*unpin)(struct cw_devpool *p, uint32_t slot);
};

/*
 * The module's functions.  The CUDA path lives in a shared module
 * (libstrata_cw_cuda.so, the kernels with cudart and cuBLAS) that computed
 * dlopens only when a device pool is in use: a CPU-only run of a CUDA
 * build never maps cuBLAS (~200 MB of resident memory when loaded).
 *   create:  sets up the device path for hidden_size and expert_inter
 *            (floats), reading experts through dev via pool (both
 *            borrowed); 0, -ENOMEM, -ST_E_CUDA / -ST_E_CUBLAS.
 *   fn:      the cw_expert_fn (arg: the struct cw_cuda_experts): queues.
 *   sync:    its cw_expert_sync_fn: completes what fn queued; 0, or
 *            -ST_E_CUDA (the first failure warns once; from then on every
 *            expert is left to the CPU and the failed batch is recomputed
 *            there by the model).
 *   counts:  experts run on the device and left to the CPU so far (a
 *            failed batch counts as CPU).
 */
struct cw_cuda_module_ops {
	int (*create)(struct cw_cuda_experts **ret, struct cw_devpool *dev,
		      const struct cw_cuda_pool_ops *pool, int hidden_size,
		      int expert_inter, struct st_diag *diag);
	void (*destroy)(struct cw_cuda_experts *c);
	cw_expert_fn fn;
	cw_expert_sync_fn sync;
	void (*counts)(const struct cw_cuda_experts *c, uint64_t *ret_device,
		       uint64_t *ret_cpu);
	/*
	 * Attention over device KV pages (cw_cuda_attn.c; cw_device_ops.h
	 * cw_attn_fn, cw_model_set_kvdev):
	 *   attn_create: for KV rows of kv_dtype (cw_kvrow.h) with n_heads
	 *                query heads over n_kv_heads of head_dim floats;
	 *                creates its own stream; 0, -EINVAL, -ENOMEM,
	 *                -ST_E_CUDA.
	 *   attn:        the cw_attn_fn (arg: the struct cw_cuda_attn).
	 *   attn_stream: its cudaStream_t (cw_kvdev_acquire makes it wait
	 *                on the device pages' copies).
	 *   attn_counts: layers run on the device, and refused (failures).
	 */
	int (*attn_create)(struct cw_cuda_attn **ret, enum st_dtype kv_dtype,
			   int n_heads, int n_kv_heads, int head_dim,
			   struct st_diag *diag);
	void (*attn_destroy)(struct cw_cuda_attn *a);
	cw_attn_fn attn;
	void *(*attn_stream)(struct cw_cuda_attn *a);
	void (*attn_counts)(const struct cw_cuda_attn *a, uint64_t *ret_layers,
			    uint64_t *ret_failed);
};

/* The attention half of the module (cw_cuda_attn.c), for its ops. */
int cw_cuda_attn_create(struct cw_cuda_attn **ret, enum st_dtype kv_dtype,
			int n_heads, int n_kv_heads, int head_dim,
			struct st_diag *diag);
void cw_cuda_attn_destroy(struct cw_cuda_attn *a);
int cw_cuda_attn_fn(void *arg, int layer, int n,
		    const struct cw_attn_tok *toks);
void *cw_cuda_attn_stream(struct cw_cuda_attn *a);
void cw_cuda_attn_counts(const struct cw_cuda_attn *a, uint64_t *ret_layers,
			 uint64_t *ret_failed);

/* The module's one exported symbol. */
const struct cw_cuda_module_ops *cw_cuda_module(void);

/* computed's side (cw_cuda_load.c): the loaded module. */
struct cw_cuda_module_handle {
	void *dl;
	const struct cw_cuda_module_ops *ops;
	struct cw_cuda_pool_ops pool;  /* cw_devpool_pin / _unpin */
};

/*
 * Loads the module: $STRATA_CUDA_MODULE, else the build tree's, else the
 * installed one (LIBDIR/strata).  0, or -ST_E_UNSUPPORTED with the reason
 * (a build without CUDA, the module missing or not loadable).
 */
int cw_cuda_module_open(struct cw_cuda_module_handle *h,
			struct st_diag *diag);
void cw_cuda_module_close(struct cw_cuda_module_handle *h);

#endif
