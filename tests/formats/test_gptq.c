/*
 * test_gptq.c — st_gptq_quantize (common/st_gptq.h) on kjv-moe's expert
 * weights, for MXFP4, NVFP4, E2M1 g32 and g128:
 *
 *  - with H = I there is nothing to compensate (the inverse's Cholesky
 *    factor is diagonal), so GPTQ must write exactly the bytes of the
 *    unweighted MSE search, row by row;
 *  - with a correlated H (H = B B^T / k + 0.1 I from a random B, computed
 *    here), the output error sum over rows of (w - q)^T H (w - q), with q
 *    decoded by the library's dequantizers, is below that of plain
 *    rounding and of the weighted search by at least 10 % (GPTQ's point:
 *    it uses the off-diagonal terms the other two ignore);
 *  - bad arguments (FP8 format, odd width, NaN weight) are refused.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_formats.h"
#include "st_gptq.h"
#include "store_testlib.h"
#include "test_util.h"

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);   \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
			n_fail++;                                              \
		}                                                              \
	} while (0)

static uint64_t rng = 0x243f6a8885a308d3ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) / 9007199254740992.0;
}

/* One row of format f: plain (mode 0), weighted search with weights wd
 * (1), into codes/scales at row r of the matrix buffers. */
static int row_quant(const struct st_wformat *f, int mode, const float *x,
		     const float *wd, size_t n, float global, uint8_t *codes,
		     void *scales)
{
	switch (f->dtype) {
	case ST_DTYPE_MXFP4:
		return mode ? st_mxfp4_quantize_row_wmse(x, wd, n, codes, scales) :
			      st_mxfp4_quantize_row(x, n, codes, scales);
	case ST_DTYPE_NVFP4:
		return mode ? st_nvfp4_quantize_row_wmse(x, wd, n, global, codes,
							 scales) :
			      st_nvfp4_quantize_row(x, n, global, codes, scales);
	default:
		return mode ? st_e2m1f16_quantize_row_wmse(x, wd, n, f->group,
							   codes, scales) :
			      st_e2m1f16_quantize_row(x, n, f->group, codes,
						      scales);
	}
}

static int row_dequant(const struct st_wformat *f, const uint8_t *codes,
		       const void *scales, size_t n, float global, float *out)
{
	switch (f->dtype) {
	case ST_DTYPE_MXFP4:
		return st_mxfp4_dequantize_row(codes, scales, n,
					       ST_FP4_LAYOUT_OCP, out);
	case ST_DTYPE_NVFP4:
		return st_nvfp4_dequantize_row(codes, scales, n, global, out);
	default:
		return st_e2m1f16_dequantize_row(codes, scales, n, f->group, out);
	}
}

/* sum over rows of (w - q)^T H (w - q) for a quantized matrix. */
static double out_err(const struct st_wformat *f, const float *w, size_t rows,
		      size_t cols, const double *H, float global,
		      const uint8_t *codes, const uint8_t *scales, size_t sbytes)
{
	float *q = malloc(sizeof(float) * cols);
	double *d = malloc(sizeof(double) * cols), e = 0;

	for (size_t r = 0; r < rows; r++) {
		CHECK(row_dequant(f, codes + r * cols / 2, scales + r * sbytes,
				  cols, global, q) == 0, "dequantize");
		for (size_t j = 0; j < cols; j++)
			d[j] = (double)w[r * cols + j] - q[j];
		for (size_t i = 0; i < cols; i++)
			for (size_t j = 0; j < cols; j++)
				e += d[i] * H[i * cols + j] * d[j];
	}
	free(q);
	free(d);
	return e;
}

static void one(const char *fname, const float *w, size_t rows, size_t cols)
{
	struct st_wformat f;
	size_t ng, sb, n = rows * cols;
	uint8_t *c0, *c1, *c2, *s0, *s1, *s2;
	double *H = malloc(sizeof(double) * cols * cols), e0, e1, e2;
	double *B = malloc(sizeof(double) * cols * 16);
	float *wd = malloc(sizeof(float) * cols), amax = 0, global;

	CHECK(st_wformat_parse(fname, &f) == 0, "%s", fname);
	ng = (cols + f.group - 1) / f.group;
	sb = ng * (f.dtype == ST_DTYPE_E2M1_F16 ? 2 : 1);
	c0 = calloc(n, 1), c1 = calloc(n, 1), c2 = calloc(n, 1);
	s0 = calloc(rows * sb, 1), s1 = calloc(rows * sb, 1);
	s2 = calloc(rows * sb, 1);
	for (size_t i = 0; i < n; i++)
		amax = fmaxf(amax, fabsf(w[i]));
	global = st_nvfp4_global_scale(amax);

	/* H = I: GPTQ = the unweighted search, byte for byte */
	for (size_t i = 0; i < cols * cols; i++)
		H[i] = i % (cols + 1) == 0 ? 1.0 : 0.0;
	for (size_t i = 0; i < cols; i++)
		wd[i] = 1.0f;
	CHECK(st_gptq_quantize(&f, w, rows, cols, H, global, c2, s2) == 0,
	      "%s gptq", fname);
	for (size_t r = 0; r < rows; r++)
		CHECK(row_quant(&f, 1, w + r * cols, wd, cols, global,
				c1 + r * cols / 2, s1 + r * sb) == 0, "wmse");
	CHECK(!memcmp(c1, c2, n / 2) && !memcmp(s1, s2, rows * sb),
	      "%s: GPTQ with H = I differs from the MSE search", fname);

	/* correlated H: 16 random directions plus a small ridge */
	for (size_t i = 0; i < cols * 16; i++)
		B[i] = urand() * 2 - 1 + (i % 16 == 0 ? 1.5 : 0.0);
	for (size_t i = 0; i < cols; i++)
		for (size_t j = 0; j < cols; j++) {
			double s = i == j ? 0.1 : 0.0;

			for (int k = 0; k < 16; k++)
				s += B[i * 16 + k] * B[j * 16 + k] / 16.0;
			H[i * cols + j] = s;
		}
	for (size_t i = 0; i < cols; i++)
		wd[i] = (float)H[i * cols + i];
	memset(c0, 0, n), memset(c1, 0, n), memset(c2, 0, n);
	for (size_t r = 0; r < rows; r++) {
		CHECK(row_quant(&f, 0, w + r * cols, wd, cols, global,
				c0 + r * cols / 2, s0 + r * sb) == 0, "plain");
		CHECK(row_quant(&f, 1, w + r * cols, wd, cols, global,
				c1 + r * cols / 2, s1 + r * sb) == 0, "wmse");
	}
	CHECK(st_gptq_quantize(&f, w, rows, cols, H, global, c2, s2) == 0,
	      "%s gptq", fname);
	e0 = out_err(&f, w, rows, cols, H, global, c0, s0, sb);
	e1 = out_err(&f, w, rows, cols, H, global, c1, s1, sb);
	e2 = out_err(&f, w, rows, cols, H, global, c2, s2, sb);
	printf("  %-10s %zux%zu  output error: plain %.4g, weighted search "
	       "%.4g, GPTQ %.4g\n", fname, rows, cols, e0, e1, e2);
	CHECK(e2 < 0.9 * e0 && e2 < 0.9 * e1, "%s: GPTQ error %.6g not 10 %% "
	      "below plain %.6g / weighted %.6g", fname, e2, e0, e1);
	free(c0), free(c1), free(c2), free(s0), free(s1), free(s2);
	free(H), free(B), free(wd);
}

int main(void)
{
	static const char *const fmts[] = { "mxfp4", "nvfp4", "e2m1-g32",
					     "e2m1-g128" };
	char path[4200];
	struct tst_sft ck;
	struct st_wformat f8 = { ST_DTYPE_F8_E4M3, 128 }, g32 = { ST_DTYPE_E2M1_F16, 32 };
	double h[4] = { 1, 0, 0, 1 };
	float bad[4] = { 1, NAN, 0, 0 };
	uint8_t c[4], s[8];

	snprintf(path, sizeof(path), "%s/models/kjv-moe/model.safetensors",
		 st_test_source_dir());
	tst_sft_load(path, &ck);
	printf("GPTQ on kjv-moe layer 2 expert 5 (w1 192x128, w2 128x192):\n");
	for (int m = 0; m < 2; m++) {
		const struct tst_tensor *t = tst_sft_find(&ck, m ?
			"model.layers.2.block_sparse_moe.experts.5.w2.weight" :
			"model.layers.2.block_sparse_moe.experts.5.w1.weight");
		size_t rows, cols;
		float *w;

		if (!t) {
			CHECK(0, "tensor missing");
			continue;
		}
		rows = (size_t)t->shape[0];
		cols = (size_t)t->shape[1];
		w = malloc(sizeof(float) * rows * cols);
		for (size_t i = 0; i < rows * cols; i++) {
			uint16_t v;

			memcpy(&v, tst_sft_data(&ck, t) + 2 * i, 2);
			w[i] = tst_bf16(v);
		}
		for (int k = 0; k < 4; k++)
			one(fmts[k], w, rows, cols);
		free(w);
	}
	tst_sft_free(&ck);
	CHECK(st_gptq_quantize(&f8, bad, 1, 2, h, 1, c, s) == -EINVAL, "fp8");
	CHECK(st_gptq_quantize(&g32, bad, 1, 2, h, 1, c, s) == -EINVAL, "NaN");
	bad[1] = 1;
	CHECK(st_gptq_quantize(&g32, bad, 1, 2, h, 1, c, s) == 0, "2 wide");
	if (n_fail)
		fprintf(stderr, "%d check(s) failed\n", n_fail);
	return n_fail ? 1 : 0;
}
