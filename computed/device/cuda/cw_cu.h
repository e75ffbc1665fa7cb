/*
 * cw_cu.h — the CUDA kernels of computed (issue 10, first slice): a small
 * C-callable API over one .cu file per op family (cw_cu_dev.cu: device
 * probe and memory; cw_cu_gemv.cu: dequant-GEMV; cw_cu_norm.cu: RMSNorm,
 * RoPE, SwiGLU; cw_cu_router.cu: router softmax top-k; cw_cu_gemm.cu:
 * dequantization and cuBLAS GEMM for prefill; cw_cu_attn.cu: decode
 * attention over paged KV rows).
 *
 * Every pointer named *_d is device memory (cudaMalloc); the kernels run on
 * the given stream (NULL: the legacy default stream) and return without
 * waiting, except where a function says it synchronises.  Each one is the
 * GPU twin of a CPU reference (cw_backend_cpu.c reference mode,
 * cw_router.c, cw_model.c attend) and accumulates in float32; the
 * tolerances each one meets against its reference are stated at its
 * declaration and checked by tests/cuda/test_cuda_kernels.c.
 *
 * Errors: 0, or -ST_E_CUDA / -EINVAL / -ST_E_UNSUPPORTED with a message in
 * diag (which may be NULL).  A kernel's own faults surface at the next
 * synchronising call (cw_cu_sync).
 */
#ifndef CW_CU_H
#define CW_CU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "cw_backend.h"
#include "st_error.h"

/* --- device and memory (cw_cu_dev.cu) --- */

/*
 * Number of usable CUDA devices (> 0), or 0 with a one-line reason in
 * reason[n] ("cudaGetDeviceCount: no CUDA-capable device is detected",
 * "no devices") when there is none or the runtime cannot start.  Never
 * fails otherwise; tests skip (77) on 0.
 */
int cw_cu_device_count(char *reason, size_t n);

/* "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB" for device 0 into buf[n].
 * Returns 0 or -ST_E_CUDA. */
int cw_cu_device_describe(char *buf, size_t n, struct st_diag *diag);

/* cudaMalloc of bytes into *ret (NULL for 0 bytes).  0 or -ST_E_CUDA. */
int cw_cu_alloc(void **ret, size_t bytes, struct st_diag *diag);
/* cudaFree (NULL is a no-op). */
void cw_cu_free(void *p_d);
/* Synchronous copies host->device, device->host, device->device, and a
 * memset of device memory; bytes in bytes.  0 or -ST_E_CUDA. */
int cw_cu_h2d(void *dst_d, const void *src, size_t bytes,
	      struct st_diag *diag);
int cw_cu_d2h(void *dst, const void *src_d, size_t bytes,
	      struct st_diag *diag);
int cw_cu_d2d(void *dst_d, const void *src_d, size_t bytes,
	      struct st_diag *diag);
int cw_cu_memset(void *dst_d, int byte, size_t bytes, struct st_diag *diag);
/* cudaDeviceSynchronize plus cudaGetLastError: reports a kernel's launch or
 * execution error.  0 or -ST_E_CUDA. */
int cw_cu_sync(struct st_diag *diag);

/* A timer of device work (CUDA events around work issued on the default
 * stream). */
struct cw_cu_timer;
int cw_cu_timer_new(struct cw_cu_timer **ret, struct st_diag *diag);
void cw_cu_timer_free(struct cw_cu_timer *t);
void cw_cu_timer_start(struct cw_cu_timer *t);
/* Stops, waits for the work, returns the elapsed milliseconds (< 0 on a
 * CUDA error). */
double cw_cu_timer_stop_ms(struct cw_cu_timer *t);

/* --- dequant-GEMV for decode (cw_cu_gemv.cu) --- */


/*
 * y_d[r] = sum_c W[r][c] * x_d[c] for r in [0, w->rows), x_d w->cols
 * floats, y_d w->rows floats.  w is a cw_wview whose data and scales are
 * device pointers (global_scale and group taken from the view): F32, BF16,
 * MXFP4 (E8M0 per 32), NVFP4 (E4M3 per 16, times the FP32 tensor scale),
 * E2M1_F16 (FP16 per even group), F8_E4M3 (FP32 per group, or none).  The
 * weights are dequantized to exactly the floats st_formats'
 * *_dequantize_row gives (NaN scale bytes make NaN, overflowing products
 * +-inf, as on the CPU) and multiplied in float32 with fused multiply-add.
 * 16-byte aligned weights with cols % 32 == 0 (FP4; and a group that is a
 * multiple of 16), cols % 16 (FP8; group a multiple of 16), cols % 8 (BF16)
 * or cols % 4 (F32), with x 16-byte aligned, take the vectorised path (16
 * bytes of weights per lane per step, x staged in shared memory); others
 * a per-element path.  A warp computes a row; wants rows < 2^31.
 *
 * Tolerance vs exact (double) products of the same dequantized weights,
 * S = sum_c |W[r][c] x[c]|: |y - exact| <= (ceil(cols / 128) + 64) *
 * 2^-24 * S (each of a lane's 4 accumulators sums at most ceil(cols /
 * 128) products in order, then 2 + 5 levels of a tree), plus (cols + 64)
 * * 2^-149 where products are subnormal.
 * Against the CPU reference (8 lanes of cols/8 sequential sums) add that
 * one's (cols / 8 + 8) * 2^-24 * S.
 * Returns 0, -EINVAL (sizes, group, alignment of scales), or
 * -ST_E_UNSUPPORTED for another dtype.
 */
int cw_cu_matvec(const struct cw_wview *w, const float *x_d, float *y_d,
		 void *stream, struct st_diag *diag);

/* One matrix of a batched GEMV launch, every pointer device memory:
 * y[0 .. rows) = W x, W the codes at data with its scales (the layout of
 * cw_wview) and NVFP4 tensor scale gscale. */
struct cw_cu_gemv_job {
	const uint8_t *data;
	const uint8_t *scales;
	const float *x;
	float *y;
	float gscale;
};

/*
 * n GEMVs in one launch (issue 27: a layer's experts and tokens):
 * y_d[i] = w[i] x_d[i] for i in [0, n), each exactly as cw_cu_matvec
 * computes it (same bits, same tolerance).  Every w[i] (device pointers)
 * must have job 0's dtype, rows, cols and group, and scales present in
 * all or none; the 16-byte path is taken only when every job allows it.
 * The job table is written to jobs_h (n entries, host memory: pinned for
 * an asynchronous copy) and copied to jobs_d (device, n entries) on
 * stream before the launch: the caller leaves jobs_h untouched until
 * that copy has run (a stream sync) and jobs_d until the kernel has.
 * n <= 65535.  0, -EINVAL (shapes differ, n), -ST_E_UNSUPPORTED or
 * -ST_E_CUDA.
 */
int cw_cu_matvec_batch(const struct cw_wview *const *w,
		       const float *const *x_d, float *const *y_d, int n,
		       struct cw_cu_gemv_job *jobs_h,
		       struct cw_cu_gemv_job *jobs_d, void *stream,
		       struct st_diag *diag);

/*
 * Bytes the GEMV of w reads from weights and scales per call (the
 * bandwidth benchmark's numerator): codes plus scales, without x and y.
 */
uint64_t cw_cu_matvec_weight_bytes(const struct cw_wview *w);

/* --- prefill: dequantization and cuBLAS GEMM (cw_cu_gemm.cu) --- */

/*
 * Dequantizes all of w (device pointers, the formats of cw_cu_matvec) into
 * out_d[rows * cols] float32, row-major: bit-identical to st_formats'
 * *_dequantize_row (NaN stays NaN).  0, -EINVAL or -ST_E_UNSUPPORTED.
 */
int cw_cu_dequant_f32(const struct cw_wview *w, float *out_d, void *stream,
		      struct st_diag *diag);

/* cuBLAS handles: pedantic float32 math (no TF32) for cw_cu_gemm_f32,
 * default math (tensor cores) for the BF16 grouped GEMM. */
struct cw_cu_blas;
/* 0, -ENOMEM or -ST_E_CUBLAS. */
int cw_cu_blas_new(struct cw_cu_blas **ret, struct st_diag *diag);
void cw_cu_blas_free(struct cw_cu_blas *b);

/*
 * Y = X W^T for a batch of n_tok tokens: w_d [rows, cols] float32 row-major
 * (a dequantized weight), x_d [n_tok, cols], y_d [n_tok, rows], all device
 * memory, on stream.  cuBLAS chooses the summation order, so the bound is
 * the order-free one: |y - exact| <= (cols + 64) * 2^-24 * S, S = sum
 * |w x|.  0, -EINVAL or -ST_E_CUBLAS.
 */
int cw_cu_gemm_f32(struct cw_cu_blas *b, const float *w_d, const float *x_d,
		   float *y_d, int rows, int cols, int n_tok, void *stream,
		   struct st_diag *diag);

/*
 * Grouped prefill GEMM (the routed experts of a prefill chunk, one group
 * per expert): for each group i, y_d[t][r] = sum_c W_i[r][c] x_d[t][c] for
 * its n_tok tokens, W_i any format of cw_cu_matvec (device views).  Each
 * weight is dequantized to a BF16 tile (exact for MXFP4: E2M1 x E8M0 needs
 * 2 mantissa bits; NVFP4, E2M1_F16, FP8 and F32 weights round to 8 bits),
 * activations are rounded to BF16, and cuBLAS multiplies with float32
 * accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F, default math: tensor
 * cores).  Tolerance vs the exact product of the dequantized weights and
 * float32 x, S = sum_c |W x|: |y - exact| <= (2^-8 + (cols + 64) * 2^-22)
 * * S for MXFP4 and BF16 weights (x rounding, then an order-free float32
 * sum whose tensor-core additions may truncate rather than round: up to
 * 4x the round-to-nearest float32 bound), 2^-7 * S + the same for the
 * other formats (weight rounding too).
 */
struct cw_cu_group {
	const struct cw_wview *w;  /* [rows, cols], device pointers */
	const float *x_d;          /* [n_tok, cols] */
	float *y_d;                /* [n_tok, rows] */
	int n_tok;
};
/* Scratch bytes cw_cu_gemm_grouped_bf16 needs for these groups (the
 * largest group's BF16 weight and activation tiles). */
size_t cw_cu_gemm_grouped_scratch(const struct cw_cu_group *g, int n_groups);
/* Runs the groups in order on stream, reusing scratch_d (device,
 * scratch_bytes).  0, -EINVAL, -ST_E_UNSUPPORTED, -ST_E_CUDA, -ST_E_CUBLAS. */
int cw_cu_gemm_grouped_bf16(struct cw_cu_blas *b, const struct cw_cu_group *g,
			    int n_groups, void *scratch_d,
			    size_t scratch_bytes, void *stream,
			    struct st_diag *diag);

/* --- elementwise and norms (cw_cu_norm.cu) --- */

/*
 * RMSNorm: y_d = weight * (x_d / sqrt(mean(x^2) + eps)) over n floats,
 * weight_d F32 or BF16 (wdtype) on the device; x and y may alias.  The sum
 * of squares is in float32 (the CPU's in double): relative error of each
 * output <= (n / 256 + 16) * 2^-24 + 2^-23.
 */
int cw_cu_rmsnorm(const float *x_d, const void *weight_d,
		  enum st_dtype wdtype, int n, float eps, float *y_d,
		  void *stream, struct st_diag *diag);

/*
 * Half-split (NeoX) RoPE in place on n_heads heads of head_dim floats at
 * position pos, like cw_cpu_rope: inverse frequency, angle, cos and sin in
 * double, rounded to float.  |diff| vs the CPU <= 2^-22 * (|a| + |b|) per
 * element of a rotated pair (a, b) (the device's double pow/cos/sin may
 * round the last double bit differently).
 */
int cw_cu_rope(float *x_d, int n_heads, int head_dim, int pos, double theta,
	       void *stream, struct st_diag *diag);

/*
 * out_d = silu(gate_d) * up_d over n floats (silu(z) = z / (1 + e^-z)),
 * like cw_swiglu; relative error <= 2^-20 vs the CPU (expf differs by up
 * to 2 ulp).
 */
int cw_cu_swiglu(const float *gate_d, const float *up_d, int n, float *out_d,
		 void *stream, struct st_diag *diag);

/* --- attention (cw_cu_attn.cu) --- */

/*
 * Decode attention of one query position: for each of n_heads heads (GQA:
 * head h reads KV head h / (n_heads / n_kv_heads)), scores q.k /
 * sqrt(head_dim) over the n_rows KV rows rows_d[0 .. n_rows) (a device
 * array of device pointers to rows in cw_kvrow.h's layout of kv_dtype: F32,
 * F16, BF16, F8_E4M3), softmax (float32 exps, double sum), and out_d[h *
 * head_dim + i] = sum_j p_j V_j[i].  q_d holds n_heads * head_dim floats;
 * scores_d is scratch of n_heads * n_rows floats.
 * Tolerance vs the exact (double) attention over the same decoded rows:
 * with s_j the scores, E = max_j ((head_dim + 8) * sum_i |q_i k_ji| /
 * sqrt(head_dim) + 4 |s_j|) * 2^-24 the largest error of a score, and
 * p_j the exact probabilities, |out[i] - exact[i]| <= 2 * sum_j p_j
 * |V_j[i]| * (2 E + (|s_j - max s| + n_rows + 16) * 2^-24) (the CPU's
 * attention meets the same bound).  0 or -EINVAL.
 */
int cw_cu_attend(const float *q_d, const uint8_t *const *rows_d, int n_rows,
		 enum st_dtype kv_dtype, int n_heads, int n_kv_heads,
		 int head_dim, float *scores_d, float *out_d, void *stream,
		 struct st_diag *diag);

/* --- router (cw_cu_router.cu) --- */

/*
 * For each of n_tok tokens: softmax over logits_d[t * n_experts ...]
 * (float32 exps, double sum), the top-k experts by descending probability,
 * ties to the lower expert id, optionally renormalised, like
 * cw_route_topk: ret_experts_d[t * k + j] and ret_weights_d[t * k + j].
 * n_experts in [1, 1024], k in [1, min(n_experts, 64)].  Weights agree with
 * the CPU within 2^-20 relative; expert ids are equal except that two
 * experts whose CPU probabilities are within 4 ulp may swap.
 */
int cw_cu_route_topk(const float *logits_d, int n_tok, int n_experts, int k,
		     int renormalise, int *ret_experts_d,
		     float *ret_weights_d, void *stream,
		     struct st_diag *diag);

#ifdef __cplusplus
}
#endif

#endif
