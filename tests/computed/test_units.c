/*
 * test_units.c — computed's pure parts: router (PITFALLS P4), sampler,
 * stop strings (PITFALLS P13), and the CPU kernels against independent
 * computations.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cw_backend.h"
#include "cw_router.h"
#include "cw_sampler.h"
#include "cw_stopbuf.h"
#include "st_formats.h"

/* P4: logits [2, 1, 0.5, -1], top-2 softmax: full softmax
 * [0.6095, 0.2242, 0.1360, 0.0303]; without renormalisation the weights are
 * [0.6095, 0.2242], with it [0.7311, 0.2689].  Tolerance 1e-4 (the figures
 * are rounded to 4 decimals). */
static void test_router_p4(void **state)
{
	const float lg[4] = { 2.0f, 1.0f, 0.5f, -1.0f };
	int ex[2];
	float w[2];

	(void)state;
	assert_int_equal(cw_route_topk(lg, 4, 2, 0, ex, w), 0);
	assert_int_equal(ex[0], 0);
	assert_int_equal(ex[1], 1);
	assert_true(fabsf(w[0] - 0.6095f) < 1e-4f);
	assert_true(fabsf(w[1] - 0.2242f) < 1e-4f);
	assert_int_equal(cw_route_topk(lg, 4, 2, 1, ex, w), 0);
	assert_true(fabsf(w[0] - 0.7311f) < 1e-4f);
	assert_true(fabsf(w[1] - 0.2689f) < 1e-4f);
	assert_true(fabsf(w[0] + w[1] - 1.0f) < 1e-6f);
}

static void test_router_ties_and_order(void **state)
{
	const float lg[6] = { 0.5f, 3.0f, 3.0f, -2.0f, 1.0f, 3.0f };
	int ex[3];
	float w[3];

	(void)state;
	/* equal logits: lower id first */
	assert_int_equal(cw_route_topk(lg, 6, 3, 1, ex, w), 0);
	assert_int_equal(ex[0], 1);
	assert_int_equal(ex[1], 2);
	assert_int_equal(ex[2], 5);
	assert_true(fabsf(w[0] - 1.0f / 3) < 1e-6f);
	assert_int_equal(cw_route_topk(lg, 6, 7, 1, ex, w), -EINVAL);
	assert_int_equal(cw_route_topk(lg, 0, 1, 1, ex, w), -EINVAL);
}

static void test_sampler(void **state)
{
	float lg[5] = { 1.0f, 3.0f, 3.0f, 0.0f, -1.0f };
	struct cw_sampler s;
	struct cw_sampler_params p = { 0 };
	int counts[5] = { 0 }, a[64], b[64];

	(void)state;
	assert_int_equal(cw_argmax(lg, 5), 1); /* tie -> lower id */
	assert_int_equal(cw_sampler_init(&s, &p), 0);
	assert_int_equal(cw_sampler_sample(&s, lg, 5), 1); /* greedy */
	cw_sampler_fini(&s);

	/* top-k 1 is greedy whatever the temperature */
	p.temperature = 5.0f;
	p.top_k = 1;
	p.seed = 7;
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 20; i++)
		assert_int_equal(cw_sampler_sample(&s, lg, 5), 1);
	cw_sampler_fini(&s);

	/* top-p 0.5 keeps only the most likely token (p = 0.455 < 0.5, so it
	 * keeps two: ids 1 and 2, never others) */
	p.top_k = 0;
	p.top_p = 0.5f;
	p.temperature = 1.0f;
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 200; i++) {
		int t = cw_sampler_sample(&s, lg, 5);

		assert_true(t == 1 || t == 2);
	}
	cw_sampler_fini(&s);

	/* temperature 1, no filters: frequencies follow the softmax
	 * (p = [0.0550, 0.4065, 0.4065, 0.0202, 0.0074... ] computed here);
	 * 20000 draws: standard error < 0.004, tolerance 0.02 */
	p.top_p = 1.0f;
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 20000; i++)
		counts[cw_sampler_sample(&s, lg, 5)]++;
	{
		double z = 0, pr[5];

		for (int i = 0; i < 5; i++)
			z += exp(lg[i]);
		for (int i = 0; i < 5; i++) {
			pr[i] = exp(lg[i]) / z;
			assert_true(fabs(counts[i] / 20000.0 - pr[i]) < 0.02);
		}
	}
	cw_sampler_fini(&s);

	/* the same seed gives the same stream; another seed another one */
	p.seed = 42;
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 64; i++)
		a[i] = cw_sampler_sample(&s, lg, 5);
	cw_sampler_fini(&s);
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 64; i++)
		b[i] = cw_sampler_sample(&s, lg, 5);
	cw_sampler_fini(&s);
	assert_memory_equal(a, b, sizeof(a));
	p.seed = 43;
	cw_sampler_init(&s, &p);
	for (int i = 0; i < 64; i++)
		b[i] = cw_sampler_sample(&s, lg, 5);
	cw_sampler_fini(&s);
	assert_true(memcmp(a, b, sizeof(a)) != 0);
}

/* pushes pieces through a stop buffer; returns the concatenated output */
static void run_stops(const char *const *pieces, int n, const char *stop,
		      char *out, int *ret_stopped)
{
	struct cw_stopbuf b;
	char chunk[256];

	out[0] = 0;
	assert_int_equal(cw_stopbuf_init(&b, 1, &stop), 0);
	for (int i = 0; i < n; i++) {
		int r = cw_stopbuf_push(&b, pieces[i], strlen(pieces[i]),
					i == n - 1, chunk, sizeof(chunk));

		assert_true(r >= 0);
		strcat(out, chunk);
	}
	*ret_stopped = b.stopped;
	cw_stopbuf_fini(&b);
}

static void test_stop_strings_p13(void **state)
{
	const char *pieces[5] = { "DEF", "G", "HI", "J", "KL" };
	char out[256];
	int stopped;

	(void)state;
	run_stops(pieces, 5, "DEFGHIJ", out, &stopped);
	assert_string_equal(out, "");
	assert_true(stopped);
	run_stops(pieces, 5, "HIJ", out, &stopped);
	assert_string_equal(out, "DEFG");
	assert_true(stopped);
	/* no stop: everything comes out, the held tail at the end */
	run_stops(pieces, 5, "XYZ", out, &stopped);
	assert_string_equal(out, "DEFGHIJKL");
	assert_false(stopped);
	/* a partial match at the very end is released by the final push */
	run_stops(pieces, 5, "KLM", out, &stopped);
	assert_string_equal(out, "DEFGHIJKL");
	assert_false(stopped);
}

static void test_stop_holdback(void **state)
{
	struct cw_stopbuf b;
	const char *stop = "\n\n";
	char chunk[64];

	(void)state;
	cw_stopbuf_init(&b, 1, &stop);
	/* "abc\n" must hold back the newline: it may start the stop */
	assert_int_equal(cw_stopbuf_push(&b, "abc\n", 4, 0, chunk, sizeof(chunk)), 3);
	assert_string_equal(chunk, "abc");
	/* "x" proves it was not a stop: the newline is released with it */
	assert_int_equal(cw_stopbuf_push(&b, "x", 1, 0, chunk, sizeof(chunk)), 2);
	assert_string_equal(chunk, "\nx");
	assert_int_equal(cw_stopbuf_push(&b, "\n\nyz", 4, 0, chunk, sizeof(chunk)), 0);
	assert_true(b.stopped);
	assert_int_equal(cw_stopbuf_push(&b, "more", 4, 0, chunk, sizeof(chunk)), 0);
	cw_stopbuf_fini(&b);
	assert_int_equal(cw_stopbuf_init(&b, 1, (const char *const[]){ "" }), -EINVAL);
}

/* MXFP4 matvec equals a float64 dot product of the dequantized weights,
 * within float32 accumulation error (relative 1e-5 of sum |w x|). */
static void test_matvec_mxfp4(void **state)
{
	enum { R = 7, C = 96 };
	const struct cw_backend_ops *be = cw_backend_cpu();
	float w[R * C], deq[R * C], x[C], y[R];
	uint8_t codes[R * C / 2], scales[R * C / 32];
	struct cw_wview v = { .dtype = ST_DTYPE_MXFP4, .data = codes,
			      .scales = scales, .rows = R, .cols = C };
	uint32_t seed = 12345;

	(void)state;
	for (int i = 0; i < R * C; i++) {
		seed = seed * 1664525u + 1013904223u;
		w[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * (i % 5 + 1);
	}
	for (int i = 0; i < C; i++)
		x[i] = sinf((float)i);
	for (int r = 0; r < R; r++) {
		assert_int_equal(st_mxfp4_quantize_row(w + r * C, C, codes + r * C / 2,
						       scales + r * C / 32), 0);
		assert_int_equal(st_mxfp4_dequantize_row(codes + r * C / 2,
							 scales + r * C / 32, C,
							 ST_FP4_LAYOUT_OCP,
							 deq + r * C), 0);
	}
	be->matvec(&v, x, y, 0, R);
	for (int r = 0; r < R; r++) {
		double ref = 0, mag = 0;

		for (int c = 0; c < C; c++) {
			ref += (double)deq[r * C + c] * x[c];
			mag += fabs((double)deq[r * C + c] * x[c]);
		}
		assert_true(fabs(y[r] - ref) <= 1e-5 * mag + 1e-7);
	}
}

static void test_matvec_bf16_and_norms(void **state)
{
	const struct cw_backend_ops *be = cw_backend_cpu();
	uint16_t wb[3 * 4];
	float wf[3 * 4], x[4] = { 1.0f, -2.0f, 0.5f, 3.0f }, y[3];
	struct cw_wview v = { .dtype = ST_DTYPE_BF16, .data = wb, .rows = 3,
			      .cols = 4 };
	float nx[4], nw[4] = { 1.0f, 2.0f, 0.5f, 1.0f }, tiny[2] = { 1e-4f, -1e-4f };

	(void)state;
	for (int i = 0; i < 12; i++) {
		wf[i] = (float)(i - 5) * 0.25f; /* exact in BF16 */
		wb[i] = st_f32_to_bf16(wf[i]);
	}
	be->matvec(&v, x, y, 0, 3);
	for (int r = 0; r < 3; r++) {
		float ref = 0;

		for (int c = 0; c < 4; c++)
			ref += wf[r * 4 + c] * x[c];
		assert_true(fabsf(y[r] - ref) < 1e-6f);
	}
	/* RMSNorm: eps inside the square root (MODEL_FAMILIES.md 0.4) */
	be->rmsnorm(x, nw, ST_DTYPE_F32, 4, 1e-5f, nx);
	{
		double ms = (1 + 4 + 0.25 + 9) / 4.0, inv = 1 / sqrt(ms + 1e-5);

		for (int i = 0; i < 4; i++)
			assert_true(fabs(nx[i] - nw[i] * x[i] * inv) < 1e-6);
	}
	/* where mean(x^2) << eps, eps dominates: 1e-4 / sqrt(1e-8 + 1e-5) */
	be->rmsnorm(tiny, nw, ST_DTYPE_F32, 2, 1e-5f, nx);
	assert_true(fabs(nx[0] - 1e-4 / sqrt(1e-8 + 1e-5)) < 1e-6);
}

/*
 * The documented reduction order, written out in scalar code: 8 lanes
 * (element c goes to lane c % 8), lanes added as
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail in order.
 * Whatever kernel clone the CPU dispatches to must give exactly these bits.
 */
static float lane_dot(const float *w, const float *x, int n)
{
	float l[8] = { 0 }, s;
	int n8 = n & ~7;

	for (int c = 0; c < n8; c++)
		l[c % 8] += w[c] * x[c];
	s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
	for (int c = n8; c < n; c++)
		s += w[c] * x[c];
	return s;
}

static void test_matvec_exact_order(void **state)
{
	enum { R = 5, C = 160 };
	const struct cw_backend_ops *be = cw_backend_cpu();
	static float wf[R * C], deq[R * C], x[C], y[R];
	static uint16_t wb[R * C];
	uint8_t codes[R * C / 2], scales[R * C / 32];
	uint32_t seed = 99;

	(void)state;
	for (int i = 0; i < R * C; i++) {
		seed = seed * 1664525u + 1013904223u;
		wf[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 3.0f;
		wb[i] = st_f32_to_bf16(wf[i]);
	}
	for (int i = 0; i < C; i++)
		x[i] = cosf((float)i * 0.37f) * 1.7f;
	{
		struct cw_wview v = { .dtype = ST_DTYPE_F32, .data = wf,
				      .rows = R, .cols = C - 3 };
		float xx[C];

		/* C - 3 columns: a tail after the 8-lane part; rows of
		 * C - 3 elements taken contiguously */
		memcpy(xx, x, sizeof(xx));
		be->matvec(&v, xx, y, 0, R);
		for (int r = 0; r < R; r++) {
			float ref = lane_dot(wf + r * (C - 3), xx, C - 3);

			assert_memory_equal(&y[r], &ref, sizeof(float));
		}
	}
	{
		struct cw_wview v = { .dtype = ST_DTYPE_BF16, .data = wb,
				      .rows = R, .cols = C };

		be->matvec(&v, x, y, 0, R);
		for (int r = 0; r < R; r++) {
			float row[C], ref;

			st_convert_to_f32(ST_DTYPE_BF16, wb + r * C, C, row);
			ref = lane_dot(row, x, C);
			assert_memory_equal(&y[r], &ref, sizeof(float));
		}
	}
	{
		struct cw_wview v = { .dtype = ST_DTYPE_MXFP4, .data = codes,
				      .scales = scales, .rows = R, .cols = C };
		float yg[R];

		for (int r = 0; r < R; r++) {
			st_mxfp4_quantize_row(wf + r * C, C, codes + r * C / 2,
					      scales + r * C / 32);
			st_mxfp4_dequantize_row(codes + r * C / 2,
						scales + r * C / 32, C,
						ST_FP4_LAYOUT_OCP, deq + r * C);
		}
		be->matvec(&v, x, y, 0, R);
		/* the portable kernel too (the dispatched one may be AVX2) */
		cw_backend_cpu_generic()->matvec(&v, x, yg, 0, R);
		for (int r = 0; r < R; r++) {
			float ref = lane_dot(deq + r * C, x, C);

			assert_memory_equal(&y[r], &ref, sizeof(float));
			assert_memory_equal(&yg[r], &ref, sizeof(float));
		}
	}
}

/*
 * Every expert format against dequantize-then-dense: the matvec of a
 * quantized matrix must equal lane_dot (the documented reduction order)
 * over the rows st_formats' *_dequantize_row gives, bit for bit, for the
 * dispatched and the portable backend.  Widths cross the kernels' 256-
 * element dequantization chunks, end in partial groups (E2M1 g128 on 520
 * = 4 x 128 + 8, FP8 blocks of 128 on 523) and in a tail after the 8 lanes
 * (523 = 65 x 8 + 3); row ranges start and end inside the matrix.
 */
static void check_format(enum st_dtype dt, uint32_t group, int64_t R,
			 int64_t C)
{
	const struct cw_backend_ops *be = cw_backend_cpu();
	const struct cw_backend_ops *bg = cw_backend_cpu_generic();
	const int64_t ng = (C + group - 1) / group;
	float *wf = malloc(sizeof(float) * (size_t)(R * C));
	float *deq = malloc(sizeof(float) * (size_t)(R * C));
	float *x = malloc(sizeof(float) * (size_t)C);
	float y[8], yg[8], amax = 0.0f;
	uint8_t *codes = malloc((size_t)(R * C));
	void *scales = malloc((size_t)(R * ng) * 4);
	struct cw_wview v = { dt, codes, scales, R, C, group,
			      st_wformat_scale_type(dt), 1.0f, 0 };
	uint32_t seed = 4242 + (uint32_t)dt * 7 + group;

	assert_true(R <= 8);
	assert_true(be->supports(CW_OP_MATVEC, dt));
	for (int64_t i = 0; i < R * C; i++) {
		seed = seed * 1664525u + 1013904223u;
		/* magnitudes spread over 2^-6 .. 2^2 */
		wf[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) *
			ldexpf(1.0f, (int)(seed % 9) - 5);
		amax = fmaxf(amax, fabsf(wf[i]));
	}
	for (int64_t i = 0; i < C; i++)
		x[i] = cosf((float)i * 0.61f) * 1.3f;
	if (dt == ST_DTYPE_NVFP4)
		v.global_scale = st_nvfp4_global_scale(amax);
	for (int64_t r = 0; r < R; r++) {
		const float *row = wf + r * C;
		float *dq = deq + r * C;
		int rc = -1;

		switch (dt) {
		case ST_DTYPE_NVFP4:
			rc = st_nvfp4_quantize_row(row, (size_t)C, v.global_scale,
						   codes + r * C / 2,
						   (uint8_t *)scales + r * ng);
			if (!rc)
				rc = st_nvfp4_dequantize_row(codes + r * C / 2,
							     (uint8_t *)scales + r * ng,
							     (size_t)C,
							     v.global_scale, dq);
			break;
		case ST_DTYPE_E2M1_F16:
			rc = st_e2m1f16_quantize_row(row, (size_t)C, group,
						     codes + r * C / 2,
						     (uint16_t *)scales + r * ng);
			if (!rc)
				rc = st_e2m1f16_dequantize_row(codes + r * C / 2,
							       (uint16_t *)scales + r * ng,
							       (size_t)C, group, dq);
			break;
		default: /* ST_DTYPE_F8_E4M3 */
			rc = st_fp8_quantize_row(row, (size_t)C, group,
						 codes + r * C,
						 (float *)scales + r * ng);
			if (!rc)
				rc = st_fp8_dequantize_row(codes + r * C,
							   (float *)scales + r * ng,
							   (size_t)C, group, dq);
			break;
		}
		assert_int_equal(rc, 0);
	}
	for (int64_t r0 = 0; r0 < R; r0 += 3) {
		int64_t r1 = r0 + 3 < R ? r0 + 3 : R;

		for (int i = 0; i < 8; i++)
			y[i] = yg[i] = -7.0f; /* untouched outside [r0, r1) */
		be->matvec(&v, x, y, r0, r1);
		bg->matvec(&v, x, yg, r0, r1);
		for (int64_t r = 0; r < 8; r++) {
			float ref = r >= r0 && r < r1 ?
					    lane_dot(deq + r * C, x, (int)C) : -7.0f;

			assert_memory_equal(&y[r], &ref, sizeof(float));
			assert_memory_equal(&yg[r], &ref, sizeof(float));
		}
	}
	/* the quantization is not the identity: the check means something
	 * (tiny groups of 1 or 2 elements can reproduce most inputs) */
	if (group >= 16) {
		int differ = 0;

		for (int64_t i = 0; i < R * C; i++)
			differ += deq[i] != wf[i];
		assert_true(differ > R * C / 4);
	}
	free(wf);
	free(deq);
	free(x);
	free(codes);
	free(scales);
}

static void test_matvec_expert_formats(void **state)
{
	(void)state;
	check_format(ST_DTYPE_NVFP4, 16, 7, 528);
	check_format(ST_DTYPE_NVFP4, 16, 5, 16);
	check_format(ST_DTYPE_E2M1_F16, 32, 7, 520);
	check_format(ST_DTYPE_E2M1_F16, 128, 7, 520);
	check_format(ST_DTYPE_E2M1_F16, 128, 4, 192); /* kjv-moe's w2 rows */
	check_format(ST_DTYPE_E2M1_F16, 2, 3, 6);     /* narrower than 8 */
	check_format(ST_DTYPE_F8_E4M3, 128, 7, 523);
	check_format(ST_DTYPE_F8_E4M3, 24, 6, 77);
	check_format(ST_DTYPE_F8_E4M3, 1, 2, 5);
	assert_false(cw_backend_cpu()->supports(CW_OP_MATVEC, ST_DTYPE_I8));
}

/* RoPE half-split: pair (i, i + d/2) rotated by pos * theta^(-2i/d). */
static void test_rope(void **state)
{
	const struct cw_backend_ops *be = cw_backend_cpu();
	float v[2 * 8], orig[2 * 8];

	(void)state;
	for (int i = 0; i < 16; i++)
		orig[i] = v[i] = (float)(i + 1) * 0.1f;
	be->rope(v, 2, 8, 5, 10000.0);
	for (int h = 0; h < 2; h++)
		for (int i = 0; i < 4; i++) {
			double ang = 5.0 * pow(10000.0, -2.0 * i / 8);
			double a = orig[h * 8 + i], b = orig[h * 8 + i + 4];

			assert_true(fabs(v[h * 8 + i] - (a * cos(ang) - b * sin(ang))) < 1e-5);
			assert_true(fabs(v[h * 8 + i + 4] - (b * cos(ang) + a * sin(ang))) < 1e-5);
		}
	/* position 0 is the identity */
	memcpy(v, orig, sizeof(v));
	be->rope(v, 2, 8, 0, 10000.0);
	assert_memory_equal(v, orig, sizeof(v));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_router_p4),
		cmocka_unit_test(test_router_ties_and_order),
		cmocka_unit_test(test_sampler),
		cmocka_unit_test(test_stop_strings_p13),
		cmocka_unit_test(test_stop_holdback),
		cmocka_unit_test(test_matvec_mxfp4),
		cmocka_unit_test(test_matvec_bf16_and_norms),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_matvec_exact_order),
		cmocka_unit_test(test_matvec_expert_formats),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
