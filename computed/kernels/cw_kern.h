/*
 * cw_kern.h — the fast-mode matvec kernels of the CPU backend (internal to
 * computed; the backend table in cw_backend_fast.c dispatches to them).
 *
 * Fast mode (DESIGN.md 6a: a separate, selectable mode; reference mode stays
 * the default and exact):
 *  - 4-bit weights (MXFP4, NVFP4, E2M1 with FP16 group scales): activations
 *    quantized to int8 by blocks of CW_QBLOCK = 32 elements (one float scale
 *    d = amax / 127 per block, q = round(x / d)), E2M1 codes looked up as
 *    twice their value (small integers -12..12), integer dot products per
 *    run of elements that share one weight scale and one activation block,
 *    then isum * (0.5 * weight scale * d) accumulated in float;
 *  - FP8 E4M3, BF16 and F32 weights: float32 activations, weights widened to
 *    float, fused multiply-add; FP8 on AVX-512 VBMI + BF16 CPUs
 *    (CW_KERN_AVX512BF16): weights widened exactly through a table of
 *    their BF16 bit patterns, activations in the kernel's lane order
 *    (cw_kern_fp8_act_prepare; cw_kern_bf16.c).
 * Each kernel exists as portable C (the reference the SIMD kernels are
 * tested against) and, on x86-64, as AVX2 + FMA + F16C; FP8 and MXFP4
 * also as AVX-512 (bit-identical to AVX2).  Results of the two
 * paths differ only by float rounding order (the integer sums are exact):
 * tests/computed/test_kern.c states and checks the tolerance.
 */
#ifndef CW_KERN_H
#define CW_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "cw_backend.h"

#define CW_QBLOCK 32 /* activation elements per int8 scale */

/* The kernel sets the fast backend can run (tests force each one). */
enum cw_kern_path {
	CW_KERN_AUTO = 0, /* the best this CPU supports */
	CW_KERN_C,        /* portable C: the reference of the others */
	CW_KERN_AVX2,     /* AVX2 + FMA + F16C */
	CW_KERN_AVX512,   /* AVX-512 F/BW/VL/DQ/VNNI for FP8 and MXFP4 (the
			   * AVX2 kernels for the rest), bit-identical to
			   * CW_KERN_AVX2 */
	CW_KERN_AVX512BF16, /* CW_KERN_AVX512 plus, on CPUs with AVX-512
			     * VBMI + BF16, its own FP8 E4M3 kernel (exact
			     * weights by a BF16 table, float FMAs: exact
			     * products, only the summation order differs;
			     * cw_kern_bf16.c) */
	CW_KERN_PATH_MAX
};

/* Bytes cw_kern_quantize_act needs for n activations: the int8 codes
 * and their magnitudes (n rounded up to a block each, tail zero), one
 * float (scale) and one int32 (sum of the codes) per block. */
size_t cw_kern_act_bytes(int64_t n);

/*
 * Fills *ret for the n floats x (borrowed: must outlive *ret), the codes in
 * runs of qgroup (16 or 32; struct cw_act): the int8
 * quantization by blocks of 32 into buf (cw_kern_act_bytes(n) bytes, any
 * alignment of 4), d = amax / 127 per block (0 for an all-zero block, whose
 * codes are 0), q = round-to-nearest-even(x / d) clamped to [-127, 127].
 * Non-finite x give a NaN scale (the result of the dot products is then
 * NaN, as a float dot product would be).
 */
void cw_kern_quantize_act(const float *x, int64_t n, int qgroup, void *buf,
			  struct cw_act *ret);
/* (It also sets ret->qsum[b] = the sum of block b's 32 codes, which the
 * row-interleaved MXFP4 kernels take off their offset weights.) */

/* A fast matvec kernel: y[r] = W[r] . a for r in [r0, r1). */
typedef void (*cw_kern_fn)(const struct cw_wview *w, const struct cw_act *a,
			   float *y, int64_t r0, int64_t r1);

/*
 * The kernel for w's format on `path`, or NULL where the path has none for
 * this view (the caller then uses the C path, which covers every format
 * and geometry the store writes).  AVX2 covers 4-bit formats whose scale
 * groups are multiples of 16 elements, FP8 with groups that are multiples
 * of 8 (or no scales), BF16 and F32; odd column counts are handled inside.
 */
cw_kern_fn cw_kern_c(const struct cw_wview *w);
cw_kern_fn cw_kern_avx2(const struct cw_wview *w);
/* The AVX-512 path: its own kernels for FP8 E4M3 (scale groups that are
 * multiples of 8, or none) and MXFP4, giving the AVX2 kernels' results
 * bit for bit (cw_kern_avx512.c says how); cw_kern_avx2's kernel for any
 * other view.  NULL where the CPU lacks AVX-512 F/BW/VL/DQ/VNNI. */
cw_kern_fn cw_kern_avx512(const struct cw_wview *w);

/*
 * A small-batch GEMM kernel: ys[t][r] = W[r] . a[t] for the n tokens
 * (1 <= n, a[] n prepared vectors) and r in [r0, r1): each row's weights
 * decoded (widened) once and multiplied with every token, each output the
 * same operations in the same order as the path's matvec kernel, so the
 * results are bit-identical to n matvecs.  Returns 0 where it cannot take
 * these activations (4-bit weights whose activations are not quantized in
 * the kernel's run order); the caller then runs the matvec kernel per token.
 */
typedef int (*cw_kern_mm_fn)(const struct cw_wview *w, const struct cw_act *a,
			     int n, float *const *ys, int64_t r0, int64_t r1);

/* The GEMM kernel for w on the AVX2 path (MXFP4, FP8 E4M3, BF16), or NULL. */
cw_kern_mm_fn cw_kern_avx2_mm(const struct cw_wview *w);
/* The GEMM kernel for w on the AVX-512 path (its own for MXFP4 and FP8
 * E4M3, the AVX2 one for BF16), or NULL. */
cw_kern_mm_fn cw_kern_avx512_mm(const struct cw_wview *w);

/* FP8 E4M3 on AVX-512 VBMI (cw_kern_bf16.c) for views with columns a
 * multiple of 64 and scale groups a multiple of 32 (or none); the AVX-512
 * path's kernel for any other view; NULL where the CPU lacks AVX-512
 * F/BW/VL/DQ/VNNI/VBMI/BF16.  Activations must carry the reordered copy
 * (cw_kern_fp8_act_prepare; the matvec otherwise runs the AVX-512 FP8
 * kernel, the GEMM returns 0). */
cw_kern_fn cw_kern_avx512bf16(const struct cw_wview *w);
cw_kern_mm_fn cw_kern_avx512bf16_mm(const struct cw_wview *w);

/* Bytes cw_kern_fp8_act_prepare needs for n activations: one float per
 * element, n rounded up to 64. */
size_t cw_kern_fp8_act_bytes(int64_t n);
/* Sets ret->xp (in buf: cw_kern_fp8_act_bytes(n) bytes, 4-byte aligned)
 * to the n floats x (borrowed, read here only) reordered per 64 columns
 * into the lane order of cw_kern_bf16.c's kernel (the tail zero).
 * Touches no other field of *ret. */
void cw_kern_fp8_act_prepare(const float *x, int64_t n, void *buf,
			     struct cw_act *ret);

/*
 * Row-interleaved MXFP4 (w->il_rows set: st_mxfp4il.h, the expert layout of
 * version-3 stores), activations quantized in runs of 32 (a->qgroup 32):
 * cw_kern_il_c is the portable reference (cw_kern_il.c fixes the
 * arithmetic: per row and block one exact int32 sum, one FMA into the
 * row's float accumulator; no horizontal sum); the AVX2 (maddubs) and AVX-512 VNNI (vpdpbusd) kernels of
 * cw_kern_il_x86.c give its results bit for bit, 16 rows per pass.  The
 * GEMMs return 0 (nothing done) for activations not in runs of 32.  The
 * path dispatchers (cw_kern_c, cw_kern_avx2, cw_kern_avx512 and their _mm)
 * return these for interleaved views; x86-64 only for the SIMD ones.
 */
void cw_kern_il_c(const struct cw_wview *w, const struct cw_act *a, float *y,
		  int64_t r0, int64_t r1);
void cw_kern_il_avx2(const struct cw_wview *w, const struct cw_act *a,
		     float *y, int64_t r0, int64_t r1);
int cw_kern_il_mm_avx2(const struct cw_wview *w, const struct cw_act *a,
		       int n, float *const *ys, int64_t r0, int64_t r1);
/* The AVX2 kernels with AVX-VNNI's 256-bit vpdpbusd (same results; what
 * cw_kern_avx2 returns for interleaved views where the CPU has it). */
int cw_kern_il_has_avxvnni(void);
void cw_kern_il_avxvnni(const struct cw_wview *w, const struct cw_act *a,
			float *y, int64_t r0, int64_t r1);
int cw_kern_il_mm_avxvnni(const struct cw_wview *w, const struct cw_act *a,
			  int n, float *const *ys, int64_t r0, int64_t r1);
void cw_kern_il_avx512(const struct cw_wview *w, const struct cw_act *a,
		       float *y, int64_t r0, int64_t r1);
int cw_kern_il_mm_avx512(const struct cw_wview *w, const struct cw_act *a,
			 int n, float *const *ys, int64_t r0, int64_t r1);

/* 1 if `path` can run on this CPU (CW_KERN_AUTO and CW_KERN_C always). */
int cw_kern_path_supported(enum cw_kern_path path);

/* The reference backend's RMSNorm and RoPE (cw_backend_ops), shared by
 * both modes. */
void cw_cpu_rmsnorm(const float *x, const void *weight, enum st_dtype wdtype,
		    int n, float eps, float *y);
void cw_cpu_rope(float *x, int n_heads, int head_dim, int pos, double theta);

/* Position in cw_act.q of activation element c (evens then odds inside
 * each run of g = 16 or 32). */
static inline int64_t cw_kern_qpos(int64_t c, int g)
{
	return (c & ~(int64_t)(g - 1)) + (c & 1) * (g / 2) + ((c & (g - 1)) >> 1);
}

/* Twice the E2M1 value of a 4-bit code (exact small integers). */
extern const int8_t cw_kern_e2m1x2[16];

#endif
