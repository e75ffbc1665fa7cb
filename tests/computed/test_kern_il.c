/*
 * test_kern_il.c — row-interleaved MXFP4 (st_mxfp4il.h, version-3 stores)
 * and its fast-mode kernels (cw_kern_il.c, cw_kern_il_x86.c):
 *  - the layout: packing then unpacking gives every row back byte for
 *    byte; the offsets of a hand-placed byte; dequantizing a row gives
 *    st_mxfp4_dequantize_row's floats of the row-major original;
 *  - the C reference equals the exact float dot product of the dequantized
 *    weights within the activation rounding bound (test_kern.c's)
 *      |y - y_exact| <= sum_c |w_c| d_c / 2 * (1 + 1e-4) + 1e-5 * L1,
 *    and the row-major C kernel within 1e-5 * sum_c |w_c| (|x_c| + d_c / 2)
 *    (the same exact integer sums, another float summation order);
 *  - every SIMD path (AVX2, AVX-VNNI, AVX-512 VNNI) equals the C reference bit for
 *    bit (NaN where it is NaN), matvec and GEMM (1..9 tokens), on row
 *    ranges that cut groups, ragged shapes (rows not a multiple of 16, K not
 *    a multiple of 256), all 256 scale bytes, all-zero, tiny and huge
 *    activations;
 *  - the backends: the reference backend gives the row-major view's result
 *    bit for bit; each fast path's matvec / matvec_act / matmul_act on the
 *    interleaved view agree bit for bit.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cw_backend.h"
#include "cw_kern.h"
#include "st_formats.h"
#include "st_mxfp4il.h"
#include "st_util.h"
#include "test_util.h"

static uint64_t g_rng = 0x2545f4914f6cdd1dull;

static float rndf(void) /* roughly normal, mean 0, sd 1 */
{
	return st_test_rndf(&g_rng);
}

/* Random floats; adversarial: all-zero, tiny and huge blocks. */
static void fill(float *x, int64_t n, int adversarial)
{
	for (int64_t c = 0; c < n; c++) {
		x[c] = rndf();
		if (adversarial && (c / 32) % 5 == 1)
			x[c] = 0.0f;
		else if (adversarial && (c / 32) % 5 == 3)
			x[c] *= 1e-20f;
		else if (adversarial && (c / 32) % 5 == 4 && c % 7 == 0)
			x[c] *= 1e4f;
	}
}

/* An MXFP4 matrix, row-major (rm) and interleaved (il), with the
 * dequantized floats of the row-major one. */
struct ilmat {
	int64_t R, C;
	uint8_t *codes, *scales, *icodes, *iscales;
	float *deq;
	struct cw_wview rm, il;
};

/* scales: 0 quantized from the floats, 1 also some scale bytes set to
 * 0 / 254, 2 every byte 0..255 in turn (255: NaN). */
static void ilmat_make(struct ilmat *m, int64_t R, int64_t C, int scales)
{
	float *w = malloc(sizeof(float) * (size_t)(R * C));
	const int64_t nb = C / 32;

	m->R = R;
	m->C = C;
	m->codes = malloc((size_t)(R * C / 2));
	m->scales = malloc((size_t)(R * nb));
	m->icodes = malloc((size_t)(R * C / 2));
	m->iscales = malloc((size_t)(R * nb));
	m->deq = malloc(sizeof(float) * (size_t)(R * C));
	fill(w, R * C, 0);
	for (int64_t r = 0; r < R; r++)
		assert_int_equal(st_mxfp4_quantize_row(w + r * C, (size_t)C,
						       m->codes + r * C / 2,
						       m->scales + r * nb), 0);
	for (int64_t i = 0; i < R * nb; i++)
		if (scales == 1 && i % 7 == 0)
			m->scales[i] = i % 2 ? 254 : 0;
		else if (scales == 2)
			m->scales[i] = (uint8_t)i;
	for (int64_t r = 0; r < R; r++)
		assert_int_equal(st_mxfp4_dequantize_row(m->codes + r * C / 2,
							 m->scales + r * nb,
							 (size_t)C,
							 ST_FP4_LAYOUT_OCP,
							 m->deq + r * C), 0);
	assert_int_equal(st_mxfp4il_pack(m->codes, m->scales, R, C, m->icodes,
					 m->iscales), 0);
	memset(&m->rm, 0, sizeof(m->rm));
	m->rm.dtype = ST_DTYPE_MXFP4;
	m->rm.data = m->codes;
	m->rm.scales = m->scales;
	m->rm.rows = R;
	m->rm.cols = C;
	m->rm.group = 32;
	m->rm.scale_type = ST_SCALE_E8M0;
	m->rm.global_scale = 1.0f;
	m->il = m->rm;
	m->il.data = m->icodes;
	m->il.scales = m->iscales;
	m->il.il_rows = ST_MXFP4IL_ROWS;
	free(w);
}

static void ilmat_free(struct ilmat *m)
{
	free(m->codes);
	free(m->scales);
	free(m->icodes);
	free(m->iscales);
	free(m->deq);
}

static int same_bits(float a, float b)
{
	return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof(a));
}

static const int64_t k_rows[] = { 1, 3, 15, 16, 17, 32, 37, 64 };
static const int64_t k_cols[] = { 32, 96, 160, 352, 1024, 5120 };

/* Pack, unpack, offsets, dequantize. */
static void test_layout(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++)
		for (size_t j = 0; j < sizeof(k_cols) / sizeof(k_cols[0]); j++) {
			struct ilmat m;
			const int64_t R = k_rows[i], C = k_cols[j], nb = C / 32;
			uint8_t *rc = malloc((size_t)C / 2), *rs = malloc((size_t)nb);
			float *out = malloc(sizeof(float) * (size_t)C);

			ilmat_make(&m, R, C, 2);
			for (int64_t r = 0; r < R; r++) {
				st_mxfp4il_unpack_row(m.icodes, m.iscales, R, C, r,
						      rc, rs);
				assert_memory_equal(rc, m.codes + r * C / 2,
						    (size_t)C / 2);
				assert_memory_equal(rs, m.scales + r * nb,
						    (size_t)nb);
				assert_int_equal(st_mxfp4il_dequantize_row(
					m.icodes, m.iscales, R, C, r, out), 0);
				for (int64_t c = 0; c < C; c++)
					assert_true(same_bits(out[c],
							      m.deq[r * C + c]));
			}
			free(rc);
			free(rs);
			free(out);
			ilmat_free(&m);
		}
	/* 20 rows of 64 columns: groups of 16 and 4 rows.  Row 18, block 1,
	 * word 2: group 16 at byte 16 * 32 = 512, block 1 of a 4-row group
	 * at 1 * 4 * 16 = 64, word 2 of its row 2 at (2 * 4 + 2) * 4 = 40:
	 * byte 616; its scale at 16 * 2 + 1 * 4 + 2 = 38.  Row 3, block 1:
	 * word 0 at 1 * 16 * 16 + 3 * 4, word 3 at 256 + (3 * 16 + 3) * 4,
	 * scale at 16 + 3. */
	assert_int_equal(st_mxfp4il_word_offset(20, 64, 18, 1, 2), 616);
	assert_int_equal(st_mxfp4il_scale_offset(20, 64, 18, 1), 38);
	assert_int_equal(st_mxfp4il_word_offset(20, 64, 3, 1, 0), 268);
	assert_int_equal(st_mxfp4il_word_offset(20, 64, 3, 1, 3), 460);
	assert_int_equal(st_mxfp4il_scale_offset(20, 64, 3, 1), 19);
	{
		uint8_t a[320], b[320], s[20], t[20];

		assert_int_equal(st_mxfp4il_pack(a, s, 10, 48, b, t), -EINVAL);
		assert_int_equal(st_mxfp4il_pack(a, s, 0, 64, b, t), -EINVAL);
		assert_int_equal(st_mxfp4il_dequantize_row(a, s, 10, 64, 10,
							   (float *)(void *)b),
				 -EINVAL);
	}
}

/* C reference against the exact product and the row-major C kernel. */
static void test_c_reference(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++)
		for (size_t j = 0; j < sizeof(k_cols) / sizeof(k_cols[0]); j++)
			for (int adv = 0; adv < 2; adv++) {
				const int64_t R = k_rows[i], C = k_cols[j];
				struct ilmat m;
				float *x = malloc(sizeof(float) * (size_t)C);
				void *buf = malloc(cw_kern_act_bytes(C));
				float *yil = malloc(sizeof(float) * (size_t)R);
				float *yrm = malloc(sizeof(float) * (size_t)R);
				struct cw_act a;

				ilmat_make(&m, R, C, adv);
				fill(x, C, adv);
				cw_kern_quantize_act(x, C, 32, buf, &a);
				/* the block sums the kernels take off */
				for (int64_t b = 0; b < C / 32; b++) {
					int32_t sq = 0;

					for (int k = 0; k < 32; k++)
						sq += a.q[32 * b + k];
					assert_int_equal(a.qsum[b], sq);
				}
				assert_ptr_equal(cw_kern_c(&m.il), cw_kern_il_c);
				cw_kern_il_c(&m.il, &a, yil, 0, R);
				cw_kern_c(&m.rm)(&m.rm, &a, yrm, 0, R);
				for (int64_t r = 0; r < R; r++) {
					double exact = 0, l1 = 0, bq = 0, bo = 0;

					for (int64_t c = 0; c < C; c++) {
						/* the weight in double: the
						 * largest scales times 6
						 * overflow float */
						const uint8_t cb = m.codes[(r * C + c) / 2];
						const double wv =
							st_e2m1_to_f32(c % 2 ? cb >> 4 : cb & 15) *
							ldexp(1.0, m.scales[r * (C / 32) + c / 32] - 127);
						const double dc = a.d[c / 32];

						exact += wv * x[c];
						l1 += fabs(wv * x[c]);
						bq += fabs(wv) * dc / 2;
						bo += fabs(wv) * (fabs(x[c]) + dc / 2);
					}
					if (!isfinite(yil[r]) || !isfinite(yrm[r])) {
						/* the largest scales overflow
						 * float (in either order of
						 * summation): only where the
						 * products are that large */
						assert_true(!(fabs(exact) + bq <= 1e37));
						continue;
					}
					if (!(fabs(yil[r] - exact) <=
					      bq * (1 + 1e-4) + 1e-5 * l1))
						fail_msg("%lldx%lld adv %d row %lld: "
							 "%.9g vs exact %.9g (bound %.3g)",
							 (long long)R, (long long)C, adv,
							 (long long)r, yil[r], exact,
							 bq * (1 + 1e-4) + 1e-5 * l1);
					if (!(fabs(yil[r] - yrm[r]) <= 1e-5 * bo))
						fail_msg("%lldx%lld adv %d row %lld: "
							 "%.9g vs row-major %.9g",
							 (long long)R, (long long)C, adv,
							 (long long)r, yil[r], yrm[r]);
				}
				free(x);
				free(buf);
				free(yil);
				free(yrm);
				ilmat_free(&m);
			}
}

/* One SIMD path's matvec and GEMM against the C reference, bit for bit. */
static void check_path(const char *name, cw_kern_fn mv, cw_kern_mm_fn mm,
		       const struct ilmat *m, const float *x, int nx)
{
	const int64_t R = m->R, C = m->C;
	const size_t ab = cw_kern_act_bytes(C);
	unsigned char *buf = malloc(ab * (size_t)nx);
	float *yc = malloc(sizeof(float) * (size_t)(R * nx));
	float *ys = malloc(sizeof(float) * (size_t)(R * nx));
	float *yp[9];
	struct cw_act a[9];
	/* row ranges: all, cut inside groups, single rows */
	const int64_t cuts[][2] = { { 0, R }, { 1, R }, { 0, R / 2 },
				    { R / 2, R }, { R - 1, R }, { 3, 13 },
				    { 16, 32 }, { 5, 35 } };

	for (int t = 0; t < nx; t++) {
		cw_kern_quantize_act(x + (size_t)t * C, C, 32, buf + t * ab,
				     &a[t]);
		cw_kern_il_c(&m->il, &a[t], yc + t * R, 0, R);
		yp[t] = ys + t * R;
	}
	for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
		const int64_t r0 = cuts[k][0], r1 = ST_MIN(cuts[k][1], R);

		if (r0 >= r1)
			continue;
		memset(ys, 0xff, sizeof(float) * (size_t)(R * nx));
		mv(&m->il, &a[0], ys, r0, r1);
		for (int64_t r = r0; r < r1; r++)
			if (!same_bits(ys[r], yc[r]))
				fail_msg("%s matvec %lldx%lld rows [%lld, %lld) row "
					 "%lld: %.9g vs C %.9g", name,
					 (long long)R, (long long)C,
					 (long long)r0, (long long)r1,
					 (long long)r, ys[r], yc[r]);
		for (int n = 1; n <= nx; n++) {
			memset(ys, 0xff, sizeof(float) * (size_t)(R * nx));
			assert_int_equal(mm(&m->il, a, n, yp, r0, r1), 1);
			for (int t = 0; t < n; t++)
				for (int64_t r = r0; r < r1; r++)
					if (!same_bits(yp[t][r], yc[t * R + r]))
						fail_msg("%s GEMM n=%d %lldx%lld "
							 "token %d row %lld: %.9g vs "
							 "C %.9g", name, n,
							 (long long)R, (long long)C,
							 t, (long long)r, yp[t][r],
							 yc[t * R + r]);
		}
	}
	/* activations in runs of 16: the GEMM declines */
	cw_kern_quantize_act(x, C, 16, buf, &a[0]);
	assert_int_equal(mm(&m->il, a, 1, yp, 0, R), 0);
	free(buf);
	free(yc);
	free(ys);
}

static void test_simd_paths(void **state)
{
	int ran = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++)
		for (size_t j = 0; j < sizeof(k_cols) / sizeof(k_cols[0]); j++)
			for (int sc = 0; sc < 3; sc++) {
				const int64_t R = k_rows[i], C = k_cols[j];
				float *x = malloc(sizeof(float) * (size_t)C * 9);
				struct ilmat m;

				ilmat_make(&m, R, C, sc);
				for (int t = 0; t < 9; t++)
					fill(x + (size_t)t * C, C, t % 3 == 2);
				memset(x + (size_t)4 * C, 0, sizeof(float) * (size_t)C);
#if defined(__x86_64__) && defined(__GNUC__)
				if (cw_kern_path_supported(CW_KERN_AVX2)) {
					const int v = cw_kern_il_has_avxvnni();

					assert_ptr_equal(cw_kern_avx2(&m.il),
							 v ? cw_kern_il_avxvnni :
							     cw_kern_il_avx2);
					assert_ptr_equal(cw_kern_avx2_mm(&m.il),
							 v ? cw_kern_il_mm_avxvnni :
							     cw_kern_il_mm_avx2);
					check_path("avx2", cw_kern_il_avx2,
						   cw_kern_il_mm_avx2, &m, x, 9);
					ran |= 1;
					if (v) {
						check_path("avx-vnni",
							   cw_kern_il_avxvnni,
							   cw_kern_il_mm_avxvnni,
							   &m, x, 9);
						ran |= 4;
					}
				}
				if (cw_kern_path_supported(CW_KERN_AVX512)) {
					assert_ptr_equal(cw_kern_avx512(&m.il),
							 cw_kern_il_avx512);
					assert_ptr_equal(cw_kern_avx512_mm(&m.il),
							 cw_kern_il_mm_avx512);
					check_path("avx512", cw_kern_il_avx512,
						   cw_kern_il_mm_avx512, &m, x, 9);
					ran |= 2;
				}
#endif
				free(x);
				ilmat_free(&m);
			}
	print_message("SIMD paths compared: %s%s%s\n", ran & 1 ? "avx2 " : "",
		      ran & 4 ? "avx-vnni " : "(no avx-vnni here) ",
		      ran & 2 ? "avx512-vnni" : "(no avx512-vnni here)");
}

/* The backends on an interleaved view: reference mode equals the
 * row-major view bit for bit; each fast path agrees with itself across
 * matvec, matvec_act and matmul_act, and with the C path's kernel. */
static void test_backends(void **state)
{
	const int64_t R = 37, C = 352;
	struct ilmat m;
	float x[352 * 3], yr[37], yi[37], yc[37], y2[37 * 3];
	void *buf = malloc(cw_backend_cpu_fast()->act_bytes(C) * 3);
	const size_t ab = cw_backend_cpu_fast()->act_bytes(C);

	(void)state;
	ilmat_make(&m, R, C, 1);
	for (int t = 0; t < 3; t++)
		fill(x + t * C, C, t == 1);
	cw_backend_cpu()->matvec(&m.rm, x, yr, 0, R);
	cw_backend_cpu()->matvec(&m.il, x, yi, 0, R);
	assert_memory_equal(yr, yi, sizeof(yr));
	cw_backend_cpu_generic()->matvec(&m.il, x, yi, 0, R);
	assert_memory_equal(yr, yi, sizeof(yr));
	cw_backend_cpu_fast_path(CW_KERN_C)->matvec(&m.il, x, yc, 0, R);
	for (int p = CW_KERN_AUTO; p < CW_KERN_PATH_MAX; p++) {
		const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);
		struct cw_act a[3];
		float *ys[3] = { y2, y2 + R, y2 + 2 * R };

		if (!be)
			continue;
		be->matvec(&m.il, x, yi, 0, R);
		for (int64_t r = 0; r < R; r++)
			assert_true(same_bits(yi[r], yc[r]));
		for (int t = 0; t < 3; t++)
			be->act_prepare(x + t * C, C, ST_DTYPE_MXFP4,
					(char *)buf + t * ab, &a[t]);
		be->matmul_act(&m.il, a, 3, ys, 0, R);
		for (int64_t r = 0; r < R; r++)
			assert_true(same_bits(y2[r], yc[r]));
		/* activations prepared for NVFP4 (runs of 16): requantized */
		be->act_prepare(x, C, ST_DTYPE_NVFP4, buf, &a[0]);
		be->matvec_act(&m.il, &a[0], yi, 0, R);
		for (int64_t r = 0; r < R; r++)
			assert_true(same_bits(yi[r], yc[r]));
	}
	free(buf);
	ilmat_free(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_c_reference),
		cmocka_unit_test(test_simd_paths),
		cmocka_unit_test(test_backends),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
