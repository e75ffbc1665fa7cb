/*
 * cw_backend.h — the compute backend interface of computed: a table of
 * functions (ggml-style) so a CUDA backend can slot in beside the CPU one.
 *
 * Every op works on float32 activations.  Weights are described by a
 * struct cw_wview: a matrix [rows, cols] row-major ([out, in] as in the
 * checkpoint), in F32, BF16, or one of the expert formats of st_formats.h
 * with scales per group of elements along each row: MXFP4 (E8M0 per 32),
 * NVFP4 (E4M3 per 16 and an FP32 tensor scale), E2M1_F16 (FP16 per
 * `group`), F8_E4M3 (FP32 per `group`); 4-bit codes in OCP nibble order.
 * Quantized weights are dequantized on the fly to exactly the floats
 * st_formats' *_dequantize_row gives.  Reference mode (DESIGN.md section 6a):
 * each output element is one sequential dot product in input order, so the
 * result does not depend on batch composition, chunking or thread count.
 */
#ifndef CW_BACKEND_H
#define CW_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "st_formats.h"

/* A read-only view of a weight matrix (borrowed memory).  The fields after
 * cols matter only for the formats that use them (a view initialised with
 * the first five fields is a valid F32, BF16 or MXFP4 view). */
struct cw_wview {
	enum st_dtype dtype;   /* F32, BF16, MXFP4, NVFP4, E2M1_F16, F8_E4M3 */
	const void *data;      /* elements, or codes (E2M1 two per byte, E4M3) */
	const uint8_t *scales; /* scales, row-major by (row, group): rows *
				* ceil(cols / group) of them (E8M0 / E4M3
				* bytes, binary16, float32 by dtype; 2- and
				* 4-byte ones aligned), NULL for F32/BF16 */
	int64_t rows, cols;
	uint32_t group;        /* elements per scale along a row: E2M1_F16
				* (even) and F8_E4M3 (>= 1); MXFP4 and NVFP4
				* have their fixed 32 and 16 */
	enum st_scale_type scale_type; /* informative: st_wformat_scale_type */
	float global_scale;    /* NVFP4 per-tensor scale, multiplying form */
	int il_rows;           /* MXFP4: ST_MXFP4IL_ROWS when the rows are
				* interleaved (st_mxfp4il.h: stores of
				* version 3), 0 row-major (every other view) */
};

/*
 * An activation vector as the kernels take it: the floats, and in fast mode
 * (cw_backend_cpu_fast) their int8 quantization by blocks of 32 (cw_kern.h):
 * q holds ceil(n / 32) * 32 codes, the tail zero, and inside each run of
 * qgroup elements the even elements first, then the odd ones (the order in
 * which the two nibbles of code bytes come out of a lookup); d holds one scale
 * per block of 32 (x ~= q * d); qabs the magnitudes of q.  q, d and qabs
 * are NULL in reference mode.
 * Borrowed memory.
 */
struct cw_act {
	const float *x;
	const int8_t *q;
	const float *d;
	int64_t n;
	const uint8_t *qabs; /* |q|, same layout (fast mode; or NULL) */
	const int32_t *qsum; /* per block of 32: the sum of its q (fast
			      * mode; or NULL) */
	int qgroup;          /* 16 or 32: q holds each run of qgroup
			      * elements as its even elements, then its odd
			      * ones (32 for MXFP4, 16 otherwise) */
	const float *xp;     /* fast mode, FP8 weights: x in the lane order of
			      * the AVX-512 VBMI kernel, per 64 columns
			      * (cw_kern_bf16.c; cw_kern_fp8_act_prepare),
			      * or NULL */
};

enum cw_op {
	CW_OP_MATVEC = 0,  /* y[rows] = W x[cols] */
	CW_OP_RMSNORM,
	CW_OP_ROPE,
	CW_OP_ATTENTION,
	CW_OP_COUNT
};

struct cw_backend_ops {
	const char *name;
	/* 1 if the backend implements op for weights of dtype (or any dtype
	 * when the op takes no weights). */
	int (*supports)(enum cw_op op, enum st_dtype dtype);
	/*
	 * y[r] = sum_c W[r][c] * x[c] for r in [row_begin, row_end).
	 * x has W->cols floats, y has W->rows floats (only the range written).
	 */
	void (*matvec)(const struct cw_wview *w, const float *x, float *y,
		       int64_t row_begin, int64_t row_end);
	/*
	 * y = w * x / sqrt(mean(x^2) + eps) over n elements (eps inside the
	 * square root; MODEL_FAMILIES.md 0.4).  weight is F32 or BF16 (wdtype).
	 * x and y may alias.
	 */
	void (*rmsnorm)(const float *x, const void *weight, enum st_dtype wdtype,
			int n, float eps, float *y);
	/*
	 * Half-split (rotate_half / NeoX) RoPE in place on n_heads heads of
	 * head_dim floats at position pos, theta base (MODEL_FAMILIES.md 0.5):
	 * pairs (i, i + d/2) rotated by pos * theta^(-2i/d).
	 */
	void (*rope)(float *x, int n_heads, int head_dim, int pos, double theta);
	/*
	 * Activations prepared once for several matvecs (a matrix's row
	 * ranges split over threads, or the experts sharing a token):
	 * act_bytes(n) bytes of scratch for n floats (0: none needed),
	 * act_prepare fills *ret from x (borrowed) into buf for weights of
	 * dtype `for_dtype` (a hint: activations prepared for one dtype work
	 * with every dtype, the fast backend quantizes only for 4-bit
	 * weights and otherwise on demand), and matvec_act is matvec on
	 * prepared activations (the same results as matvec).
	 */
	size_t (*act_bytes)(int64_t n);
	void (*act_prepare)(const float *x, int64_t n, enum st_dtype for_dtype,
			    void *buf, struct cw_act *ret);
	void (*matvec_act)(const struct cw_wview *w, const struct cw_act *a,
			   float *y, int64_t row_begin, int64_t row_end);
	/*
	 * Small-batch GEMM on prepared activations (optional: NULL in
	 * reference mode, whose callers then run matvec_act per token):
	 * ys[t][r] = W[r] . a[t] for the n tokens t (n >= 1, a[] the n
	 * prepared vectors) and r in [row_begin, row_end), each weight row
	 * read once for all n.  Every output element equals matvec_act's
	 * for that token bit for bit (batch-invariant).
	 */
	void (*matmul_act)(const struct cw_wview *w, const struct cw_act *a,
			   int n, float *const *ys, int64_t row_begin,
			   int64_t row_end);
};

/* The CPU backend (reference mode): plain C, with an AVX2 MXFP4 kernel
 * chosen at run time where the CPU has AVX2; bit-identical either way. */
const struct cw_backend_ops *cw_backend_cpu(void);
/* The same backend forced onto the portable kernels (for tests). */
const struct cw_backend_ops *cw_backend_cpu_generic(void);

/*
 * The CPU backend in fast mode (not bit-exact; DESIGN.md 6a): activations
 * quantized to int8 per block of 32 for 4-bit weights, fused multiply-add,
 * SIMD kernels chosen at run time (cw_kern.h).  Results depend on neither
 * the thread split nor the batch (each output element is still one fixed
 * reduction), but differ from reference mode within the fixtures'
 * mxfp4_approx rule.
 */
const struct cw_backend_ops *cw_backend_cpu_fast(void);
/* The same forced onto one kernel set (enum cw_kern_path, cw_kern.h: 1 =
 * portable C, 2 = AVX2); NULL where this CPU cannot run it (tests). */
const struct cw_backend_ops *cw_backend_cpu_fast_path(int path);

/* The compute mode of the model (cw_model_opts.compute). */
enum cw_compute {
	CW_COMPUTE_REFERENCE = 0, /* cw_backend_cpu: exact, the default */
	CW_COMPUTE_FAST = 1,      /* cw_backend_cpu_fast */
};

/* Parses "reference" or "fast" into *ret: 0 or -EINVAL. */
int cw_compute_parse(const char *s, enum cw_compute *ret);
/* "reference" / "fast" ("?" out of range). */
const char *cw_compute_name(enum cw_compute c);
/* The backend of a compute mode. */
const struct cw_backend_ops *cw_backend_for(enum cw_compute c);

/* SiLU(g) * u elementwise into out (n floats): silu(z) = z / (1 + e^-z). */
void cw_swiglu(const float *gate, const float *up, int n, float *out);

#endif
