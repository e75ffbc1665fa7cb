/*
 * test_scale_search.c — the MSE scale search of the expert formats
 * (st_*_quantize_row_mse, st_formats.h), checked against computations of
 * this file that use only the format definitions (store_testlib's E2M1 and
 * E4M3 roundings, the compiler's _Float16, ldexp):
 *
 *  - hand-built blocks where the searched scale is provably better than the
 *    plain amax scale (an outlier that saturates, or elements sitting on the
 *    grid of a slightly smaller / larger scale): the squared error of the
 *    searched block, decoded here, is strictly below the plain one's;
 *  - blocks where the plain scale is exact (zero error) or all zero: the
 *    searched quantizer writes the plain quantizer's bytes;
 *  - random blocks (heavy tails, NaN/inf-free): the searched error equals
 *    the minimum over the candidate scales enumerated here (brute force,
 *    relative tolerance 1e-12 for the order of the double sums), never
 *    above the plain error, and the existing dequantizers read the searched
 *    blocks back exactly as decoded here (bit for bit);
 *  - blocks holding a NaN or an infinity: identical to the plain quantizer;
 *  - the parsers of "none" / "mse";
 *  - the expert weights of the kjv-moe fixture (models/kjv-moe in the
 *    source tree): relative RMS error with and without search for MXFP4,
 *    NVFP4, E2M1 g32 / g128 and FP8 (printed); search never above plain,
 *    per tensor.  Experts 0-1 of each layer by default (suite 'unit'),
 *    all 288 tensors with --all (suite 'slow'; then the plain errors
 *    also equal the README's).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_formats.h"
#include "store_testlib.h"
#include "test_util.h"

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			if (n_fail < 30) {                                     \
				fprintf(stderr, "FAIL %s:%d: ", __FILE__,      \
					__LINE__);                             \
				fprintf(stderr, __VA_ARGS__);                  \
				fputc('\n', stderr);                           \
			}                                                      \
			n_fail++;                                              \
		}                                                              \
	} while (0)

enum { F_MXFP4, F_NVFP4, F_E2M1_G32, F_E2M1_G128, F_FP8, F_COUNT };
static const char *const fnames[F_COUNT] = { "mxfp4", "nvfp4", "e2m1-g32",
					     "e2m1-g128", "fp8" };
static const int fgroup[F_COUNT] = { 32, 16, 32, 128, 128 };

#define MAXN 512

static float h2f(uint16_t bits)
{
	_Float16 h;

	memcpy(&h, &bits, 2);
	return (float)h;
}

static uint16_t f2h_clamped(float v)
{
	_Float16 h = (_Float16)v;
	uint16_t b;

	memcpy(&b, &h, 2);
	if ((b & 0x7fffu) > 0x7bffu)
		b = (uint16_t)((b & 0x8000u) | 0x7bffu);
	return b;
}

static uint8_t nib(const uint8_t *codes, int i)
{
	return (codes[i / 2] >> (4 * (i & 1))) & 15;
}

/* A quantized row of any format. */
struct qrow {
	uint8_t codes[MAXN];
	uint8_t s8[MAXN];
	uint16_t s16[MAXN];
	float s32[MAXN];
};

static int quantize(int f, int mse, const float *x, int n, float global,
		    struct qrow *q)
{
	size_t g = (size_t)fgroup[f];

	memset(q, 0, sizeof(*q));
	switch (f) {
	case F_MXFP4:
		return (mse ? st_mxfp4_quantize_row_mse :
			      st_mxfp4_quantize_row)(x, (size_t)n, q->codes, q->s8);
	case F_NVFP4:
		return (mse ? st_nvfp4_quantize_row_mse :
			      st_nvfp4_quantize_row)(x, (size_t)n, global,
						     q->codes, q->s8);
	case F_E2M1_G32:
	case F_E2M1_G128:
		return (mse ? st_e2m1f16_quantize_row_mse :
			      st_e2m1f16_quantize_row)(x, (size_t)n, g, q->codes,
						       q->s16);
	default:
		return (mse ? st_fp8_quantize_row_mse :
			      st_fp8_quantize_row)(x, (size_t)n, g, q->codes,
						   q->s32);
	}
}

/* Decodes a quantized row here, from the format definitions. */
static void decode_here(int f, const struct qrow *q, int n, float global,
			float *out)
{
	int g = fgroup[f];

	for (int i = 0; i < n; i++) {
		switch (f) {
		case F_MXFP4:
			out[i] = (float)ldexp(tst_e2m1_value(nib(q->codes, i)),
					      q->s8[i / g] - 127);
			break;
		case F_NVFP4:
			out[i] = (float)(tst_e2m1_value(nib(q->codes, i)) *
					 tst_e4m3_value(q->s8[i / g])) * global;
			break;
		case F_E2M1_G32:
		case F_E2M1_G128:
			out[i] = (float)tst_e2m1_value(nib(q->codes, i)) *
				 h2f(q->s16[i / g]);
			break;
		default:
			out[i] = (float)tst_e4m3_value(q->codes[i]) * q->s32[i / g];
			break;
		}
	}
}

/* The library's dequantizer. */
static void decode_lib(int f, const struct qrow *q, int n, float global,
		       float *out)
{
	size_t g = (size_t)fgroup[f];
	int r;

	switch (f) {
	case F_MXFP4:
		r = st_mxfp4_dequantize_row(q->codes, q->s8, (size_t)n,
					    ST_FP4_LAYOUT_OCP, out);
		break;
	case F_NVFP4:
		r = st_nvfp4_dequantize_row(q->codes, q->s8, (size_t)n, global,
					    out);
		break;
	case F_E2M1_G32:
	case F_E2M1_G128:
		r = st_e2m1f16_dequantize_row(q->codes, q->s16, (size_t)n, g, out);
		break;
	default:
		r = st_fp8_dequantize_row(q->codes, q->s32, (size_t)n, g, out);
		break;
	}
	CHECK(r == 0, "%s: dequantize returned %d", fnames[f], r);
}

static double sse_of(const float *x, const float *y, int n)
{
	double s = 0;

	for (int i = 0; i < n; i++) {
		double d = (double)x[i] - y[i];

		s += d * d;
	}
	return s;
}

/* Squared error, here, of a block quantized with the given scale (as a
 * float multiplier; for MXFP4 the scale byte). */
static double cand_sse(int f, const float *x, int n, float global,
		       uint32_t cand_bits)
{
	double s = 0;

	for (int i = 0; i < n; i++) {
		float deq;

		switch (f) {
		case F_MXFP4: {
			int b = (int)cand_bits;

			deq = (float)ldexp(tst_e2m1_value(tst_ref_e2m1(
						   ldexp(x[i], 127 - b))),
					   b - 127);
			break;
		}
		case F_NVFP4: {
			float sb = (float)tst_e4m3_value((uint8_t)cand_bits);
			float d = sb * global;
			double c = d == 0.0f ? 0.0 :
				   tst_e2m1_value(tst_ref_e2m1(x[i] / d));

			deq = (float)(c * sb) * global;
			break;
		}
		case F_E2M1_G32:
		case F_E2M1_G128: {
			float sc = h2f((uint16_t)cand_bits);
			double c = sc == 0.0f ? 0.0 :
				   tst_e2m1_value(tst_ref_e2m1(x[i] / sc));

			deq = (float)c * sc;
			break;
		}
		default: {
			float sc;

			memcpy(&sc, &cand_bits, 4);
			deq = (float)tst_e4m3_value(tst_ref_e4m3(x[i] / sc)) * sc;
			break;
		}
		}
		s += ((double)x[i] - deq) * ((double)x[i] - deq);
	}
	return s;
}

/* Brute force: the least squared error over the candidate scales of one
 * block (plain included), enumerated from the documented rule. */
static double brute_min(int f, const float *x, int n, float global)
{
	float amax = 0;
	double best;

	for (int i = 0; i < n; i++)
		amax = fmaxf(amax, fabsf(x[i]));
	if (amax == 0.0f)
		return 0.0;
	if (f == F_MXFP4) {
		int e = (int)floor(log2(amax)) - 2 + 127;

		e = e < 0 ? 0 : e > 254 ? 254 : e;
		best = cand_sse(f, x, n, global, (uint32_t)e);
		for (int d = -1; d <= 1; d += 2)
			if (e + d >= 0 && e + d <= 254 && e != 0)
				best = fmin(best, cand_sse(f, x, n, global,
							   (uint32_t)(e + d)));
		return best;
	}
	best = INFINITY;
	for (int k = 80; k <= 110; k++) {
		float fac = (float)k / 100.0f;
		uint32_t bits;

		if (f == F_NVFP4) {
			bits = tst_ref_e4m3(((amax / 6.0f) / global) * fac);
		} else if (f == F_FP8) {
			float s = (amax / 448.0f) * fac;

			memcpy(&bits, &s, 4);
		} else {
			bits = f2h_clamped((amax / 6.0f) * fac);
		}
		best = fmin(best, cand_sse(f, x, n, global, bits));
	}
	return best;
}

/* Quantizes one block both ways and checks the search against the brute
 * force; returns plain and searched errors (decoded here). */
static void check_block(int f, const float *x, int n, float global,
			double *ret_plain, double *ret_mse, const char *what)
{
	static struct qrow qp, qm;
	float dp[MAXN], dm[MAXN], dl[MAXN];
	double sp, sm, bm;

	CHECK(quantize(f, 0, x, n, global, &qp) == 0, "%s", what);
	CHECK(quantize(f, 1, x, n, global, &qm) == 0, "%s", what);
	decode_here(f, &qp, n, global, dp);
	decode_here(f, &qm, n, global, dm);
	decode_lib(f, &qm, n, global, dl);
	CHECK(memcmp(dm, dl, sizeof(float) * (size_t)n) == 0,
	      "%s %s: library dequantizer differs from the decoding here",
	      fnames[f], what);
	sp = sse_of(x, dp, n);
	sm = sse_of(x, dm, n);
	CHECK(sm <= sp, "%s %s: searched SSE %.9g above plain %.9g", fnames[f],
	      what, sm, sp);
	if (n == fgroup[f]) { /* one block: brute force over its candidates */
		bm = brute_min(f, x, n, global);
		CHECK(fabs(sm - bm) <= 1e-12 * fmax(bm, 1e-30),
		      "%s %s: searched SSE %.12g, brute-force minimum %.12g",
		      fnames[f], what, sm, bm);
	}
	*ret_plain = sp;
	*ret_mse = sm;
}

static void test_crafted(void)
{
	float x[MAXN];
	double sp, sm;
	static const float grid[6] = { 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f };

	/* MXFP4: amax 7.9 saturates to 6 under the plain scale 1 (error
	 * 1.9^2); scale 2 gives 8 (0.1^2) and keeps 1, 2, 3, 4 exact. */
	for (int i = 0; i < 32; i++)
		x[i] = (float)(1 + i % 4);
	x[0] = 7.9f;
	check_block(F_MXFP4, x, 32, 1.0f, &sp, &sm, "outlier 7.9");
	CHECK(fabs(sp - 1.9 * 1.9) < 1e-5, "mxfp4 plain SSE %.9g, 3.61", sp);
	CHECK(sm < sp && fabs(sm - 0.01) < 1e-5, "mxfp4 searched SSE %.9g, "
	      "expected 0.01", sm);

	/* MXFP4: e-1 wins: 31 elements 0.75 and one 4.0.  Plain scale 1:
	 * 0.75 ties to 1.0 (error 0.0625 each, 1.9375 in all), 4 exact;
	 * scale 0.5: 0.75 = 1.5 * 0.5 exact, 4 = 8 * 0.5 saturates to 3
	 * (error 1); scale 2: 0.75 -> 0.375 -> 0.5 * 2 = 1 (as plain). */
	for (int i = 0; i < 32; i++)
		x[i] = 0.75f;
	x[5] = 4.0f;
	check_block(F_MXFP4, x, 32, 1.0f, &sp, &sm, "e-1 block");
	CHECK(fabs(sp - 31 * 0.0625) < 1e-6, "mxfp4 plain SSE %.9g", sp);
	CHECK(fabs(sm - 1.0) < 1e-6, "mxfp4 e-1 SSE %.9g, expected 1", sm);

	/* E2M1 g32 (FP16 scale): amax 6 (plain scale 1), the rest on the
	 * grid of scale 0.9: plain rounds each of them off, scale ~0.9
	 * (f16 0.89990234) clips 6 to 5.4 but keeps the rest nearly exact. */
	for (int i = 0; i < 32; i++)
		x[i] = 0.9f * grid[i % 6];
	x[0] = 6.0f;
	check_block(F_E2M1_G32, x, 32, 1.0f, &sp, &sm, "grid 0.9");
	CHECK(sm < 0.5 * sp, "e2m1-g32 searched %.9g not below half of plain "
	      "%.9g", sm, sp);

	/* NVFP4 (E4M3 block scale, tensor scale 1): amax 6 (plain block
	 * scale 1.0), the rest on the grid of scale 0.875 (an E4M3 value). */
	for (int i = 0; i < 16; i++)
		x[i] = 0.875f * grid[i % 6];
	x[0] = 6.0f;
	check_block(F_NVFP4, x, 16, 1.0f, &sp, &sm, "grid 0.875");
	CHECK(sm <= 0.5625 + 1e-9 && sm < sp,
	      "nvfp4 searched SSE %.9g (scale 0.875 gives 0.5625), plain %.9g", sm, sp);

	/* FP8 (FP32 block scale), block 16: amax 448 (plain scale 1) and 15
	 * elements 1.1 * 240 = 264, which the plain scale rounds to 256
	 * (error 64 each); scale 1.1 keeps them exact and rounds 448 to
	 * 416 * 1.1 = 457.6 (error 92.16). */
	for (int i = 0; i < 16; i++)
		x[i] = 1.1f * 240.0f;
	x[0] = 448.0f;
	{
		static struct qrow qp, qm;
		float dp[16], dm[16];

		CHECK(st_fp8_quantize_row(x, 16, 16, qp.codes, qp.s32) == 0,
		      "fp8 plain");
		CHECK(st_fp8_quantize_row_mse(x, 16, 16, qm.codes, qm.s32) == 0,
		      "fp8 mse");
		for (int i = 0; i < 16; i++) {
			dp[i] = (float)tst_e4m3_value(qp.codes[i]) * qp.s32[0];
			dm[i] = (float)tst_e4m3_value(qm.codes[i]) * qm.s32[0];
		}
		sp = sse_of(x, dp, 16);
		sm = sse_of(x, dm, 16);
		CHECK(fabs(sp - 15 * 64.0) < 1e-2, "fp8 plain SSE %.9g", sp);
		CHECK(sm <= 92.17 && sm < sp, "fp8 searched SSE %.9g, plain "
		      "%.9g", sm, sp);
	}

	/* Plain optimal: every element exact under the plain scale — the
	 * searched bytes are the plain bytes. */
	for (int f = 0; f < F_COUNT; f++) {
		static struct qrow qp, qm;
		int n = fgroup[f] * 2;

		for (int i = 0; i < n; i++) {
			static const float ex[8] = { 6, 4, -3, 2, 1.5f, -1,
						     0.5f, 0 };

			/* MXFP4/NVFP4/E2M1: E2M1 values times 2^-3; FP8:
			 * 448 and smaller E4M3 values (plain scale 1) */
			x[i] = f == F_FP8 ? (i % 8 == 0 ? 448.0f : ex[i % 8] * 8)
					  : ex[i % 8] * 0.125f;
		}
		/* NVFP4 with tensor scale 2^-10: block scale exactly 128 */
		quantize(f, 0, x, n, f == F_NVFP4 ? 0x1p-10f : 1.0f, &qp);
		quantize(f, 1, x, n, f == F_NVFP4 ? 0x1p-10f : 1.0f, &qm);
		CHECK(!memcmp(&qp, &qm, sizeof(qp)), "%s: exact block changed "
		      "by the search", fnames[f]);
		/* all zero */
		memset(x, 0, sizeof(float) * (size_t)n);
		quantize(f, 0, x, n, 1.0f, &qp);
		quantize(f, 1, x, n, 1.0f, &qm);
		CHECK(!memcmp(&qp, &qm, sizeof(qp)), "%s: zero block changed",
		      fnames[f]);
		/* NaN and inf blocks: as the plain quantizer */
		for (int i = 0; i < n; i++)
			x[i] = 0.3f * (float)(i % 7) - 0.9f;
		x[1] = NAN;
		x[fgroup[f] + 2] = -INFINITY;
		quantize(f, 0, x, n, 1.0f, &qp);
		quantize(f, 1, x, n, 1.0f, &qm);
		CHECK(!memcmp(&qp, &qm, sizeof(qp)), "%s: NaN/inf blocks "
		      "changed by the search", fnames[f]);
	}
}

/* xorshift, fixed seed: reproducible blocks */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1p-53;
}

static void test_random(void)
{
	float x[MAXN];
	int strictly[F_COUNT] = { 0 };

	for (int t = 0; t < 400; t++) {
		for (int f = 0; f < F_COUNT; f++) {
			int n = fgroup[f];
			double sp, sm, scale = ldexp(1.0, (int)(urand() * 40) - 20);
			char what[32];

			for (int i = 0; i < n; i++) {
				/* Gaussian-ish body with an occasional outlier */
				double u = urand() + urand() + urand() - 1.5;

				if (urand() < 0.03)
					u *= 6;
				x[i] = (float)(u * scale);
			}
			snprintf(what, sizeof(what), "random %d", t);
			check_block(f, x, n, f == F_NVFP4 ? (float)(scale / 400) :
							       1.0f,
				    &sp, &sm, what);
			strictly[f] += sm < sp;
		}
	}
	for (int f = 0; f < F_COUNT; f++) {
		printf("random blocks where the search is strictly better: %-10s "
		       "%d of 400\n", fnames[f], strictly[f]);
		CHECK(strictly[f] > 20, "%s: search rarely helps (%d of 400)",
		      fnames[f], strictly[f]);
	}
}

static void test_parse(void)
{
	enum st_scale_search s = ST_SCALE_SEARCH_MSE;

	CHECK(st_scale_search_parse("none", &s) == 0 &&
	      s == ST_SCALE_SEARCH_NONE, "parse none");
	CHECK(st_scale_search_parse("mse", &s) == 0 && s == ST_SCALE_SEARCH_MSE,
	      "parse mse");
	CHECK(st_scale_search_parse("MSE", &s) == -EINVAL &&
	      s == ST_SCALE_SEARCH_MSE, "MSE refused, untouched");
	CHECK(st_scale_search_parse("", &s) == -EINVAL, "empty refused");
	CHECK(st_scale_search_parse(NULL, &s) == -EINVAL, "NULL refused");
	CHECK(!strcmp(st_scale_search_name(ST_SCALE_SEARCH_NONE), "none") &&
	      !strcmp(st_scale_search_name(ST_SCALE_SEARCH_MSE), "mse") &&
	      !strcmp(st_scale_search_name(ST_SCALE_SEARCH_CALIBRATED),
		      "calibrated") &&
	      !strcmp(st_scale_search_name(ST_SCALE_SEARCH_GPTQ), "gptq") &&
	      st_scale_search_name((enum st_scale_search)4) == NULL, "names");
	CHECK(st_scale_search_parse("cal", &s) == 0 &&
	      s == ST_SCALE_SEARCH_CALIBRATED, "parse cal");
	s = ST_SCALE_SEARCH_NONE;
	CHECK(st_scale_search_parse("calibrated", &s) == 0 &&
	      s == ST_SCALE_SEARCH_CALIBRATED, "parse calibrated");
}

/* kjv-moe's expert weights: relative RMS error with and without search,
 * over experts 0..n_experts-1 of every layer (16: all of them). */
static void test_kjv(int n_experts)
{
	static const char *const mat[3] = { "w1", "w3", "w2" };
	char path[4200];
	struct tst_sft ck;
	double sum[2][F_COUNT] = { { 0 } };
	int n_t = 0;

	snprintf(path, sizeof(path), "%s/models/kjv-moe/model.safetensors",
		 st_test_source_dir());
	tst_sft_load(path, &ck);
	for (int l = 0; l < 6; l++)
		for (int e = 0; e < n_experts; e++)
			for (int m = 0; m < 3; m++) {
				const struct tst_tensor *t;
				char name[128];
				int rows, cols;
				float *w, *d, amax = 0, global;
				double ss = 0;

				snprintf(name, sizeof(name), "model.layers.%d."
					 "block_sparse_moe.experts.%d.%s.weight",
					 l, e, mat[m]);
				t = tst_sft_find(&ck, name);
				if (!t || strcmp(t->dtype, "BF16") || t->n_dims != 2) {
					CHECK(0, "%s: missing or not BF16", name);
					continue;
				}
				rows = (int)t->shape[0];
				cols = (int)t->shape[1];
				w = malloc(sizeof(float) * (size_t)cols * rows);
				d = malloc(sizeof(float) * (size_t)cols);
				for (int i = 0; i < rows * cols; i++) {
					uint16_t h;

					memcpy(&h, tst_sft_data(&ck, t) + 2 * (size_t)i,
					       2);
					w[i] = tst_bf16(h);
					ss += (double)w[i] * w[i];
					amax = fmaxf(amax, fabsf(w[i]));
				}
				global = st_nvfp4_global_scale(amax);
				for (int f = 0; f < F_COUNT; f++) {
					double se[2] = { 0, 0 };

					for (int mse = 0; mse < 2; mse++)
						for (int r = 0; r < rows; r++) {
							static struct qrow q;
							const float *x = w + (size_t)r * cols;

							CHECK(quantize(f, mse, x, cols,
								       global, &q) == 0,
							      "%s", name);
							decode_here(f, &q, cols, global, d);
							se[mse] += sse_of(x, d, cols);
						}
					CHECK(se[1] <= se[0], "%s %s: search %.9g above "
					      "plain %.9g", name, fnames[f], se[1],
					      se[0]);
					sum[0][f] += sqrt(se[0] / ss);
					sum[1][f] += sqrt(se[1] / ss);
				}
				n_t++;
				free(w);
				free(d);
			}
	tst_sft_free(&ck);
	printf("relative RMS error of kjv-moe's expert weights (%d tensors):\n"
	       "  format      plain     searched  change\n", n_t);
	for (int f = 0; f < F_COUNT; f++) {
		printf("  %-10s  %.5f   %.5f   %+.2f %%\n", fnames[f],
		       sum[0][f] / n_t, sum[1][f] / n_t,
		       100.0 * (sum[1][f] / sum[0][f] - 1.0));
		CHECK(sum[1][f] <= sum[0][f], "%s: searched error above plain",
		      fnames[f]);
	}
	/* the plain figures are the README's (test_quant_error checks them) */
	if (n_experts == 16)
		CHECK(fabs(sum[0][F_MXFP4] / n_t - 0.1163) <= 0.5e-4, "mxfp4 plain");
	if (n_experts == 16)
		CHECK(fabs(sum[0][F_E2M1_G32] / n_t - 0.10111) <= 0.5e-5,
		      "g32 plain");
}

/* --- activation-weighted search (st_*_quantize_row_wmse) --- */

static int wquantize(int f, const float *x, const float *w, int n,
		     float global, struct qrow *q)
{
	memset(q, 0, sizeof(*q));
	switch (f) {
	case F_MXFP4:
		return st_mxfp4_quantize_row_wmse(x, w, (size_t)n, q->codes,
						  q->s8);
	case F_NVFP4:
		return st_nvfp4_quantize_row_wmse(x, w, (size_t)n, global,
						  q->codes, q->s8);
	default:
		return st_e2m1f16_quantize_row_wmse(x, w, (size_t)n,
						    (size_t)fgroup[f], q->codes,
						    q->s16);
	}
}

/* sum_i w_i (x_i - y_i)^2 in double, element order. */
static double wsse_of(const float *x, const float *y, const float *w, int n)
{
	double s = 0;

	for (int i = 0; i < n; i++) {
		double d = (double)x[i] - (double)y[i];

		s += (double)w[i] * (d * d);
	}
	return s;
}

/* Per-column weights of matrix m (0 gate, 1 up, 2 down) of (layer,
 * expert) from a statistics file written by strata calibrate (format:
 * common/st_calib.h, read here independently); 0 if absent / too few
 * tokens. */
static int stats_weights(const uint8_t *b, size_t len, int layer, int expert,
			 int m, int cols, float *w)
{
	uint32_t L, E, H, I;
	uint64_t cnt;
	size_t le, off;

	if (!b || len < 72 || memcmp(b, "STCALIB1", 8))
		return 0;
	memcpy(&L, b + 12, 4);
	memcpy(&E, b + 16, 4);
	memcpy(&H, b + 20, 4);
	memcpy(&I, b + 24, 4);
	if ((uint32_t)layer >= L || (uint32_t)expert >= E ||
	    (uint32_t)cols != (m == 2 ? I : H))
		return 0;
	le = (size_t)layer * E + (size_t)expert;
	memcpy(&cnt, b + 64 + le * 8, 8);
	if (cnt < 32)
		return 0;
	off = 64 + (size_t)L * E * 8 + le * (H + I) * 8 + (m == 2 ? H * 8 : 0);
	if (off + (size_t)cols * 8 > len)
		return 0;
	for (int i = 0; i < cols; i++) {
		double v;

		memcpy(&v, b + off + (size_t)i * 8, 8);
		w[i] = (float)(v / (double)cnt);
	}
	return 1;
}

/*
 * kjv-moe's expert weights with per-column weights: synthetic ones (a
 * heavy-tailed random weight per input channel, as activation second
 * moments are: exp(4u), u uniform in [0,1)) or, with stats, the real
 * ones of a calibration run.  Per row and 4-bit format: the weighted
 * error of the weighted search is never above that of plain rounding nor
 * of the unweighted search (both are among its candidates); all-ones
 * weights give the unweighted search's bytes; a negative weight is
 * refused.  Prints the weighted relative RMS errors.
 */
static void test_kjv_weighted(int n_experts, const uint8_t *stats,
			      size_t stats_len)
{
	static const char *const mat[3] = { "w1", "w3", "w2" };
	char path[4200];
	struct tst_sft ck;
	double sum[3][F_COUNT] = { { 0 } };
	int n_t = 0, better = 0, n_rows = 0, n_skip = 0;

	snprintf(path, sizeof(path), "%s/models/kjv-moe/model.safetensors",
		 st_test_source_dir());
	tst_sft_load(path, &ck);
	for (int l = 0; l < 6; l++)
		for (int e = 0; e < n_experts; e++)
			for (int m = 0; m < 3; m++) {
				const struct tst_tensor *t;
				char name[128];
				int rows, cols;
				float *x, *d, *w, amax = 0, global;
				double wss = 0;

				snprintf(name, sizeof(name), "model.layers.%d."
					 "block_sparse_moe.experts.%d.%s.weight",
					 l, e, mat[m]);
				t = tst_sft_find(&ck, name);
				if (!t || strcmp(t->dtype, "BF16") || t->n_dims != 2) {
					CHECK(0, "%s: missing or not BF16", name);
					continue;
				}
				rows = (int)t->shape[0];
				cols = (int)t->shape[1];
				x = malloc(sizeof(float) * (size_t)cols * rows);
				d = malloc(sizeof(float) * (size_t)cols);
				w = malloc(sizeof(float) * (size_t)cols);
				if (stats) {
					if (!stats_weights(stats, stats_len, l, e, m,
							   cols, w)) {
						/* too few tokens: the convert
						 * falls back to plain mse */
						n_skip++;
						free(x), free(d), free(w);
						continue;
					}
				} else {
					for (int i = 0; i < cols; i++)
						w[i] = (float)exp(4.0 * urand());
				}
				for (int i = 0; i < rows * cols; i++) {
					uint16_t h;

					memcpy(&h, tst_sft_data(&ck, t) + 2 * (size_t)i,
					       2);
					x[i] = tst_bf16(h);
					amax = fmaxf(amax, fabsf(x[i]));
					wss += (double)w[i % cols] * x[i] * x[i];
				}
				global = st_nvfp4_global_scale(amax);
				for (int f = 0; f < F_FP8; f++) {
					double se[3] = { 0, 0, 0 };

					for (int r = 0; r < rows; r++) {
						static struct qrow q, qm, qw;
						const float *xr = x + (size_t)r * cols;
						double e0, e1, e2;

						CHECK(quantize(f, 0, xr, cols, global,
							       &q) == 0, "%s", name);
						decode_here(f, &q, cols, global, d);
						e0 = wsse_of(xr, d, w, cols);
						CHECK(quantize(f, 1, xr, cols, global,
							       &qm) == 0, "%s", name);
						decode_here(f, &qm, cols, global, d);
						e1 = wsse_of(xr, d, w, cols);
						CHECK(wquantize(f, xr, w, cols, global,
								&qw) == 0, "%s", name);
						decode_here(f, &qw, cols, global, d);
						e2 = wsse_of(xr, d, w, cols);
						CHECK(e2 <= e0 * (1 + 1e-12) &&
						      e2 <= e1 * (1 + 1e-12),
						      "%s %s row %d: weighted %.9g, "
						      "plain %.9g, mse %.9g", name,
						      fnames[f], r, e2, e0, e1);
						better += e2 < e1 * (1 - 1e-9);
						n_rows++;
						se[0] += e0;
						se[1] += e1;
						se[2] += e2;
					}
					for (int k = 0; k < 3; k++)
						sum[k][f] += sqrt(se[k] / wss);
				}
				n_t++;
				free(x);
				free(d);
				free(w);
			}
	tst_sft_free(&ck);
	CHECK(n_t > 0 && n_skip <= n_t, "statistics for only %d tensors (%d "
	      "without)", n_t, n_skip);
	printf("weighted relative RMS error of kjv-moe's expert weights (%d "
	       "tensors, %s weights):\n  format      plain     mse       "
	       "weighted\n", n_t, stats ? "calibration" : "synthetic");
	for (int f = 0; f < F_FP8; f++)
		printf("  %-10s  %.5f   %.5f   %.5f\n", fnames[f],
		       sum[0][f] / n_t, sum[1][f] / n_t, sum[2][f] / n_t);
	/* the weights must matter: the weighted search beats the plain one
	 * on a good share of rows */
	CHECK(better * 10 > n_rows, "weighted search better than mse on only "
	      "%d of %d rows", better, n_rows);
}

/* Weighted search: NULL / all-ones weights are the MSE search byte for
 * byte; bad weights are refused. */
static void test_weighted_basics(void)
{
	float x[128], ones[128], bad[128];

	for (int i = 0; i < 128; i++) {
		x[i] = (float)(urand() * 2 - 1) * (i % 7 == 0 ? 4.0f : 1.0f);
		ones[i] = 1.0f;
		bad[i] = 1.0f;
	}
	bad[77] = -1.0f;
	for (int f = 0; f < F_FP8; f++) {
		static struct qrow a, b, c;

		CHECK(quantize(f, 1, x, 128, 0.01f, &a) == 0 &&
		      wquantize(f, x, NULL, 128, 0.01f, &b) == 0 &&
		      wquantize(f, x, ones, 128, 0.01f, &c) == 0, "%s",
		      fnames[f]);
		CHECK(!memcmp(&a, &b, sizeof(a)) && !memcmp(&a, &c, sizeof(a)),
		      "%s: weights NULL / 1 differ from the mse search",
		      fnames[f]);
		CHECK(wquantize(f, x, bad, 128, 0.01f, &b) == -EINVAL,
		      "%s: negative weight accepted", fnames[f]);
		bad[77] = NAN;
		CHECK(wquantize(f, x, bad, 128, 0.01f, &b) == -EINVAL,
		      "%s: NaN weight accepted", fnames[f]);
		bad[77] = -1.0f;
	}
}

/* No argument: experts 0 and 1 of every layer (fast, suite 'unit');
 * "--all": every expert (suite 'slow'); "--stats FILE": the weighted
 * search with the real statistics of FILE (strata calibrate). */
int main(int argc, char **argv)
{
	int all = argc > 1 && !strcmp(argv[1], "--all");

	if (argc == 3 && !strcmp(argv[1], "--stats")) {
		size_t len = 0;
		uint8_t *b = tst_read(argv[2], &len);

		test_kjv_weighted(16, b, len);
		free(b);
		if (n_fail)
			fprintf(stderr, "%d check(s) failed\n", n_fail);
		return n_fail ? 1 : 0;
	}
	test_parse();
	test_crafted();
	test_random();
	test_weighted_basics();
	test_kjv(all ? 16 : 2);
	test_kjv_weighted(all ? 16 : 2, NULL, 0);
	if (n_fail)
		fprintf(stderr, "%d check(s) failed\n", n_fail);
	return n_fail ? 1 : 0;
}
