/*
 * test_kern.c — the fast-mode kernels (cw_kern.h) on every dispatch path
 * this CPU has, forced one at a time:
 *  - each SIMD path equals the portable C kernels within
 *      |y_simd - y_c| <= 1e-5 * sum_c |w_c| (|x_c| + d_c / 2)
 *    (both sum the same exact integer dot products; only the float
 *    summation order differs);
 *  - the C kernels equal the exact float dot product of the dequantized
 *    weights (st_formats) within the activation rounding bound
 *      |y_c - y_exact| <= sum_c |w_c| d_c / 2 * (1 + 1e-4) + 1e-5 * L1
 *    (d_c the int8 scale of x_c's block, 0 for float-activation formats);
 * on random and adversarial inputs: all-zero blocks, the largest scales,
 * tiny and huge activations, column counts that are not multiples of the
 * block; and the two pitfalls of PITFALLS.md as whole kinds of fault:
 *  - P5: every scale byte (all 256 E8M0 and E4M3 bytes, all 65536 binary16
 *    scales) decodes to the value of the format's spec on every path;
 *  - P7: every element of every row of every 4-bit geometry, read through a
 *    one-hot activation, is the element the store's dequantizer puts there
 *    (the nibble layout), on every path; and the P7 example itself.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cw_backend.h"
#include "cw_kern.h"
#include "cw_threads.h"
#include "st_formats.h"
#include "test_util.h"

/* ---- test matrices ---- */

struct mat {
	struct cw_wview v;
	uint8_t *codes, *scales;
	float *deq; /* rows x cols, st_formats' dequantized values */
};

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	return st_test_rnd(&g_rng);
}

static float rndf(void) /* roughly normal, mean 0, sd 1 */
{
	return st_test_rndf(&g_rng);
}

/* Fills a row of floats: random, with (adversarial) all-zero, tiny and
 * huge stretches. */
static void fill_row(float *x, int64_t n, int adversarial)
{
	for (int64_t c = 0; c < n; c++)
		x[c] = rndf();
	if (!adversarial)
		return;
	for (int64_t c = 0; c < n; c++) {
		const int64_t blk = c / 32;

		if (blk % 5 == 1)
			x[c] = 0.0f;
		else if (blk % 5 == 3)
			x[c] *= 1e-20f;
		else if (blk % 5 == 4 && c % 7 == 0)
			x[c] *= 1e4f;
	}
}

static int64_t n_groups(const struct cw_wview *v)
{
	const int64_t g = v->dtype == ST_DTYPE_MXFP4 ? 32 :
			  v->dtype == ST_DTYPE_NVFP4 ? 16 :
			  v->group ? v->group : v->cols;

	return (v->cols + g - 1) / g;
}

static size_t scale_size(enum st_dtype dt)
{
	return dt == ST_DTYPE_E2M1_F16 ? 2 : dt == ST_DTYPE_F8_E4M3 ? 4 : 1;
}

/* Dequantizes every row of m into m->deq with st_formats. */
static void dequant(struct mat *m)
{
	const struct cw_wview *v = &m->v;
	const int64_t R = v->rows, C = v->cols, ng = n_groups(v);

	for (int64_t r = 0; r < R; r++) {
		float *out = m->deq + r * C;
		const uint8_t *sc = m->scales ?
			m->scales + r * ng * scale_size(v->dtype) : NULL;

		switch (v->dtype) {
		case ST_DTYPE_MXFP4:
			assert_int_equal(st_mxfp4_dequantize_row(m->codes + r * C / 2,
				sc, C, ST_FP4_LAYOUT_OCP, out), 0);
			break;
		case ST_DTYPE_NVFP4:
			assert_int_equal(st_nvfp4_dequantize_row(m->codes + r * C / 2,
				sc, C, v->global_scale, out), 0);
			break;
		case ST_DTYPE_E2M1_F16:
			assert_int_equal(st_e2m1f16_dequantize_row(m->codes + r * C / 2,
				(const uint16_t *)(const void *)sc, C, v->group, out), 0);
			break;
		case ST_DTYPE_F8_E4M3:
			if (sc)
				assert_int_equal(st_fp8_dequantize_row(m->codes + r * C,
					(const float *)(const void *)sc, C, v->group, out), 0);
			else
				for (int64_t c = 0; c < C; c++)
					out[c] = st_e4m3_to_f32(m->codes[r * C + c]);
			break;
		case ST_DTYPE_BF16:
			st_convert_to_f32(ST_DTYPE_BF16, m->codes + r * C * 2, C, out);
			break;
		default:
			memcpy(out, m->codes + r * C * 4, sizeof(float) * C);
			break;
		}
	}
}

/* A matrix of format dt (group for E2M1_F16 / F8_E4M3, 0 = FP8 without
 * scales) quantized from random floats with st_formats; adversarial: some
 * scales set to the format's largest (or zero). */
static void make(struct mat *m, enum st_dtype dt, int64_t R, int64_t C,
		 uint32_t group, int adversarial)
{
	float *w = malloc(sizeof(float) * R * C);
	int64_t ng;
	float amax = 0;

	memset(m, 0, sizeof(*m));
	m->v.dtype = dt;
	m->v.rows = R;
	m->v.cols = C;
	m->v.group = group;
	m->v.global_scale = 1.0f;
	ng = n_groups(&m->v);
	for (int64_t r = 0; r < R; r++)
		fill_row(w + r * C, C, adversarial);
	for (int64_t i = 0; i < R * C; i++)
		amax = fmaxf(amax, fabsf(w[i]));
	m->codes = calloc(1, (size_t)(R * C * 4));
	if (dt != ST_DTYPE_BF16 && dt != ST_DTYPE_F32 &&
	    !(dt == ST_DTYPE_F8_E4M3 && !group))
		m->scales = calloc(1, (size_t)(R * ng) * scale_size(dt));
	if (dt == ST_DTYPE_NVFP4)
		m->v.global_scale = st_nvfp4_global_scale(amax);
	for (int64_t r = 0; r < R; r++) {
		const float *x = w + r * C;
		uint8_t *sc = m->scales ? m->scales + r * ng * scale_size(dt) : NULL;

		switch (dt) {
		case ST_DTYPE_MXFP4:
			st_mxfp4_quantize_row(x, C, m->codes + r * C / 2, sc);
			break;
		case ST_DTYPE_NVFP4:
			st_nvfp4_quantize_row(x, C, m->v.global_scale,
					      m->codes + r * C / 2, sc);
			break;
		case ST_DTYPE_E2M1_F16:
			st_e2m1f16_quantize_row(x, C, group, m->codes + r * C / 2,
						(uint16_t *)(void *)sc);
			break;
		case ST_DTYPE_F8_E4M3:
			if (sc)
				st_fp8_quantize_row(x, C, group, m->codes + r * C,
						    (float *)(void *)sc);
			else
				for (int64_t c = 0; c < C; c++)
					m->codes[r * C + c] = st_f32_to_e4m3_sat(x[c]);
			break;
		case ST_DTYPE_BF16:
			for (int64_t c = 0; c < C; c++) {
				uint16_t h = st_f32_to_bf16(x[c]);

				memcpy(m->codes + 2 * (r * C + c), &h, 2);
			}
			break;
		default:
			memcpy(m->codes + 4 * r * C, x, sizeof(float) * C);
			break;
		}
	}
	if (adversarial && m->scales) {
		/* the largest scale in some groups, zero in others */
		for (int64_t i = 0; i < R * ng; i += 7) {
			uint8_t *s = m->scales + i * scale_size(dt);

			if (dt == ST_DTYPE_MXFP4)
				*s = i % 2 ? 254 : 0;
			else if (dt == ST_DTYPE_NVFP4)
				*s = i % 2 ? 0x7e : 0;
			else if (dt == ST_DTYPE_E2M1_F16) {
				uint16_t h = i % 2 ? 0x7bff : 0;

				memcpy(s, &h, 2);
			} else {
				float f = i % 2 ? 3.0e30f : 0.0f;

				memcpy(s, &f, 4);
			}
		}
	}
	m->v.data = m->codes;
	m->v.scales = m->scales;
	m->v.scale_type = st_wformat_scale_type(dt);
	m->deq = malloc(sizeof(float) * R * C);
	dequant(m);
	free(w);
}

static void unmake(struct mat *m)
{
	free(m->codes);
	free(m->scales);
	free(m->deq);
}

static int is_fp4(enum st_dtype dt)
{
	return dt == ST_DTYPE_MXFP4 || dt == ST_DTYPE_NVFP4 ||
	       dt == ST_DTYPE_E2M1_F16;
}

/* ---- the comparisons ---- */

struct geom {
	enum st_dtype dt;
	int64_t rows, cols;
	uint32_t group;
};

static const struct geom k_geoms[] = {
	{ ST_DTYPE_MXFP4, 5, 32, 0 },
	{ ST_DTYPE_MXFP4, 9, 1024, 0 },
	{ ST_DTYPE_MXFP4, 3, 96, 0 },     /* odd number of blocks */
	{ ST_DTYPE_MXFP4, 3, 352, 0 },    /* 11 blocks: 8 at once + 3 */
	{ ST_DTYPE_MXFP4, 2, 5120, 0 },   /* V4.1's hidden width */
	{ ST_DTYPE_NVFP4, 5, 48, 0 },     /* half a block at the end */
	{ ST_DTYPE_NVFP4, 7, 1024, 0 },
	{ ST_DTYPE_NVFP4, 3, 16, 0 },
	{ ST_DTYPE_E2M1_F16, 4, 1024, 32 },
	{ ST_DTYPE_E2M1_F16, 4, 1000, 128 }, /* last group short */
	{ ST_DTYPE_E2M1_F16, 3, 50, 16 },    /* 50: not a multiple of 16 */
	{ ST_DTYPE_E2M1_F16, 3, 50, 10 },    /* groups across half blocks */
	{ ST_DTYPE_F8_E4M3, 4, 1000, 128 },
	{ ST_DTYPE_F8_E4M3, 3, 77, 8 },
	{ ST_DTYPE_F8_E4M3, 3, 77, 5 },
	{ ST_DTYPE_F8_E4M3, 3, 77, 0 },      /* no scales */
	{ ST_DTYPE_F8_E4M3, 6, 48, 48 },     /* 32 + 16 per group; 4 + 2 rows */
	{ ST_DTYPE_F8_E4M3, 5, 120, 40 },    /* 32 + 8 per group */
	{ ST_DTYPE_F8_E4M3, 5, 5120, 32 },   /* V4.1's 32 x 32 blocks */
	{ ST_DTYPE_F8_E4M3, 7, 1024, 128 },  /* the BF16 kernel: 4 + 3 rows */
	{ ST_DTYPE_F8_E4M3, 5, 192, 96 },    /* groups across its 64-steps */
	{ ST_DTYPE_F8_E4M3, 3, 320, 0 },     /* no scales */
	{ ST_DTYPE_F8_E4M3, 5, 64, 64 },     /* one 64-step per group */
	{ ST_DTYPE_F8_E4M3, 9, 640, 160 },   /* 5 halves per group: groups
					      * end mid-step; 4 + 4 + 1 rows */
	{ ST_DTYPE_F8_E4M3, 1, 128, 32 },    /* one row: no 4-row pass */
	{ ST_DTYPE_F8_E4M3, 6, 2048, 512 },  /* 8 steps per group */
	{ ST_DTYPE_BF16, 6, 1024, 0 },
	{ ST_DTYPE_BF16, 3, 77, 0 },
	{ ST_DTYPE_BF16, 21, 77, 0 },       /* row blocks of 8 and 4 + tail */
	{ ST_DTYPE_F32, 3, 77, 0 },
	{ ST_DTYPE_F32, 5, 1024, 0 },
};

static int same_nonfinite(float a, float b)
{
	return (isnan(a) && isnan(b)) || (isinf(a) && a == b);
}

/* Checks every path against C and C against the exact float product for
 * one matrix and one activation vector. */
static void check_one(const struct mat *m, const float *x, const char *what)
{
	const struct cw_wview *v = &m->v;
	const int64_t R = v->rows, C = v->cols;
	const struct cw_backend_ops *ref = cw_backend_cpu();
	const struct cw_backend_ops *fc = cw_backend_cpu_fast_path(CW_KERN_C);
	void *buf = malloc(cw_backend_cpu_fast()->act_bytes(C));
	float *yr = malloc(sizeof(float) * R), *yc = malloc(sizeof(float) * R);
	float *yp = malloc(sizeof(float) * R);
	struct cw_act a;

	assert_non_null(fc);
	fc->act_prepare(x, C, v->dtype, buf, &a);
	ref->matvec(v, x, yr, 0, R);
	fc->matvec_act(v, &a, yc, 0, R);
	if (is_fp4(v->dtype)) {
		/* activations prepared for a float format (no int8 codes):
		 * the kernel quantizes on demand, same result */
		struct cw_act a2;

		fc->act_prepare(x, C, ST_DTYPE_BF16, buf, &a2);
		assert_null(a2.q);
		fc->matvec_act(v, &a2, yp, 0, R);
		assert_memory_equal(yp, yc, sizeof(float) * (size_t)R);
		/* prepared in the other run order (32 for MXFP4, 16 for
		 * the others): same result on every path */
		for (int p = CW_KERN_C; p < CW_KERN_PATH_MAX; p++) {
			const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);
			float *y2 = malloc(sizeof(float) * R);

			if (be) {
				fc->act_prepare(x, C, v->dtype == ST_DTYPE_MXFP4 ?
						ST_DTYPE_NVFP4 : ST_DTYPE_MXFP4,
						buf, &a2);
				be->matvec_act(v, &a2, yp, 0, R);
				fc->act_prepare(x, C, v->dtype, buf, &a);
				be->matvec_act(v, &a, y2, 0, R);
				/* C: the same integer sums, bit for bit;
				 * SIMD: summed in other lanes, within the
				 * SIMD-vs-C tolerance */
				for (int64_t r = 0; r < R; r++) {
					double l1 = 0;

					for (int64_t c = 0; c < C; c++)
						l1 += fabs((double)m->deq[r * C + c]) *
						      (fabs((double)x[c]) +
						       a.d[c / CW_QBLOCK] / 2);
					if (p == CW_KERN_C ? memcmp(&yp[r], &y2[r], 4) != 0 :
					    isfinite(l1) && l1 < 1e37 &&
					    !(fabs((double)yp[r] - y2[r]) <= 1e-5 * l1 + 1e-30))
						fail_msg("%s %s row %lld: %.9g with "
							 "runs of 16/32 vs %.9g",
							 what, be->name, (long long)r,
							 yp[r], y2[r]);
				}
			}
			free(y2);
		}
	}
	for (int64_t r = 0; r < R; r++) {
		double l1 = 0, qb = 0;

		for (int64_t c = 0; c < C; c++) {
			const double aw = fabs((double)m->deq[r * C + c]);

			l1 += aw * fabs((double)x[c]);
			if (is_fp4(v->dtype))
				qb += aw * a.d[c / CW_QBLOCK] / 2;
		}
		if (!isfinite(l1) || !isfinite(yr[r]) || l1 > 1e37) {
			/* overflowing rows (largest scales): the exact
			 * product overflows where the fast path's factored
			 * one need not; SIMD vs C is still checked below */
			continue;
		}
		if (!(fabs((double)yc[r] - yr[r]) <= qb * (1 + 1e-4) + 1e-5 * l1 + 1e-30)) {
			fail_msg("%s row %lld: fast C %.9g vs exact %.9g "
				 "(bound %.3g)", what, (long long)r, yc[r],
				 yr[r], qb * (1 + 1e-4) + 1e-5 * l1);
		}
	}
	for (int p = CW_KERN_C + 1; p < CW_KERN_PATH_MAX; p++) {
		const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);

		if (!be) {
			printf("  (path %d not supported on this CPU: skipped)\n", p);
			continue;
		}
		/* prepared, and via matvec in two row ranges */
		be->matvec_act(v, &a, yp, 0, R);
		for (int pass = 0; pass < 2; pass++) {
			for (int64_t r = 0; r < R; r++) {
				double l1 = 0;

				for (int64_t c = 0; c < C; c++)
					l1 += fabs((double)m->deq[r * C + c]) *
					      (fabs((double)x[c]) +
					       (is_fp4(v->dtype) ? a.d[c / CW_QBLOCK] / 2 : 0));
				if (!isfinite(yc[r]) || !isfinite(l1) || l1 > 1e37) {
					assert_true(same_nonfinite(yp[r], yc[r]) ||
						    !isfinite(l1) || l1 > 1e37);
					continue;
				}
				if (!(fabs((double)yp[r] - yc[r]) <= 1e-5 * l1 + 1e-30))
					fail_msg("%s path %s row %lld: %.9g vs C %.9g "
						 "(L1 %.3g)", what, be->name,
						 (long long)r, yp[r], yc[r], l1);
			}
			be->matvec(v, x, yp, 0, R / 2);
			be->matvec(v, x, yp, R / 2, R);
		}
	}
	free(buf);
	free(yr);
	free(yc);
	free(yp);
}

static void test_paths_random(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(k_geoms) / sizeof(k_geoms[0]); i++) {
		const struct geom *g = &k_geoms[i];

		for (int adv = 0; adv < 2; adv++) {
			struct mat m;
			float *x = malloc(sizeof(float) * g->cols);
			char what[96];

			make(&m, g->dt, g->rows, g->cols, g->group, adv);
			snprintf(what, sizeof(what), "%s %lldx%lld g%u%s",
				 st_dtype_traits(g->dt)->name, (long long)g->rows,
				 (long long)g->cols, g->group, adv ? " adversarial" : "");
			for (int t = 0; t < 3; t++) {
				fill_row(x, g->cols, adv || t == 2);
				if (t == 1) /* an all-zero activation vector */
					memset(x, 0, sizeof(float) * g->cols);
				check_one(&m, x, what);
			}
			unmake(&m);
			free(x);
		}
	}
}

/* The small-batch GEMM (matmul_act) of every fast path equals one matvec
 * per token bit for bit, for 1..9 tokens (token groups of 4 and 3 plus
 * their remainders), every geometry, row sub-ranges, and activations with
 * all-zero vectors and adversarial values among them; on AVX2 the GEMM
 * kernel itself (not the per-token fallback) must take MXFP4, FP8, BF16,
 * and the AVX-512 BF16 path's own kernels FP8 with columns a multiple of
 * 64 and groups of 32. */
static void test_gemm(void **state)
{
	static const int k_ns[] = { 1, 2, 3, 4, 5, 7, 9 };

	(void)state;
	for (size_t i = 0; i < sizeof(k_geoms) / sizeof(k_geoms[0]); i++) {
		const struct geom *g = &k_geoms[i];
		const int64_t R = g->rows, C = g->cols;
		const size_t ab = cw_backend_cpu_fast()->act_bytes(C);
		struct mat m;
		float *x = malloc(sizeof(float) * (size_t)C * 9);
		unsigned char *buf = malloc(ab * 9);
		float *y1 = malloc(sizeof(float) * (size_t)R * 9);
		float *y2 = malloc(sizeof(float) * (size_t)R * 9);
		struct cw_act a[9];
		float *ys[9];

		make(&m, g->dt, R, C, g->group, (int)(i & 1));
		for (int t = 0; t < 9; t++) {
			fill_row(x + (size_t)t * C, C, t % 3 == 2);
			if (t == 4)
				memset(x + (size_t)t * C, 0, sizeof(float) * C);
			ys[t] = y2 + (size_t)t * R;
		}
		if (g->dt == ST_DTYPE_MXFP4 || g->dt == ST_DTYPE_BF16 ||
		    (g->dt == ST_DTYPE_F8_E4M3 && g->group % 8 == 0)) {
			if (cw_kern_path_supported(CW_KERN_AVX2)) {
				cw_kern_mm_fn f = cw_kern_avx2_mm(&m.v);

				assert_non_null(f);
				if (g->dt == ST_DTYPE_MXFP4) {
					cw_kern_quantize_act(x, C, 32, buf, &a[0]);
					assert_int_equal(f(&m.v, a, 1, ys, 0, R), 1);
				}
			}
		}
		if (g->dt == ST_DTYPE_F8_E4M3 && C % 64 == 0 && g->group % 32 == 0 &&
		    cw_kern_path_supported(CW_KERN_AVX512BF16)) {
			cw_kern_mm_fn f = cw_kern_avx512bf16_mm(&m.v);

			assert_ptr_not_equal(cw_kern_avx512bf16(&m.v),
					     cw_kern_avx512(&m.v));
			assert_ptr_not_equal(f, cw_kern_avx512_mm(&m.v));
			cw_backend_cpu_fast()->act_prepare(x, C, g->dt, buf, &a[0]);
			assert_int_equal(f(&m.v, a, 1, ys, 0, R), 1);
		}
		for (int p = CW_KERN_AUTO; p < CW_KERN_PATH_MAX; p++) {
			const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);

			if (!be)
				continue;
			assert_non_null(be->matmul_act);
			for (size_t ni = 0; ni < sizeof(k_ns) / sizeof(k_ns[0]); ni++) {
				const int n = k_ns[ni];
				/* rows in two ranges, the second from an odd row */
				const int64_t mid = R / 2;

				for (int t = 0; t < n; t++) {
					be->act_prepare(x + (size_t)t * C, C, g->dt,
							buf + (size_t)t * ab, &a[t]);
					be->matvec_act(&m.v, &a[t], y1 + (size_t)t * R,
						       0, R);
				}
				memset(y2, 0xff, sizeof(float) * (size_t)R * 9);
				be->matmul_act(&m.v, a, n, ys, 0, mid);
				be->matmul_act(&m.v, a, n, ys, mid, R);
				for (int t = 0; t < n; t++)
					for (int64_t r = 0; r < R; r++)
						if (memcmp(&y1[t * R + r], &y2[t * R + r], 4))
							fail_msg("%s %lldx%lld g%u %s n=%d "
								 "token %d row %lld: GEMM %.9g "
								 "vs matvec %.9g",
								 st_dtype_traits(g->dt)->name,
								 (long long)R, (long long)C,
								 g->group, be->name, n, t,
								 (long long)r, y2[t * R + r],
								 y1[t * R + r]);
			}
		}
		unmake(&m);
		free(x);
		free(buf);
		free(y1);
		free(y2);
	}
}

/* The AVX-512 path gives the AVX2 path's results bit for bit (its kernels
 * hold AVX2's two accumulators in one register: cw_kern_avx512.c), matvec
 * and GEMM, every geometry, random, adversarial and all-zero activations;
 * and it runs its own kernels (not AVX2's) for MXFP4 and FP8.  Skipped
 * where the CPU has no AVX-512 F/BW/VL/DQ/VNNI. */
static void test_avx512_equals_avx2(void **state)
{
	const struct cw_backend_ops *b2 = cw_backend_cpu_fast_path(CW_KERN_AVX2);
	const struct cw_backend_ops *b5 = cw_backend_cpu_fast_path(CW_KERN_AVX512);
	int compared = 0;

	(void)state;
	if (!b2 || !b5) {
		printf("  (no AVX-512 F/BW/VL/DQ/VNNI on this CPU: skipped)\n");
		skip();
	}
	for (size_t i = 0; i < sizeof(k_geoms) / sizeof(k_geoms[0]); i++) {
		const struct geom *g = &k_geoms[i];
		const int64_t R = g->rows, C = g->cols;
		const size_t ab = cw_backend_cpu_fast()->act_bytes(C);
		unsigned char *buf = malloc(ab * 9);
		float *x = malloc(sizeof(float) * (size_t)C * 9);
		float *y2 = malloc(sizeof(float) * (size_t)R * 9);
		float *y5 = malloc(sizeof(float) * (size_t)R * 9);
		float *ys2[9], *ys5[9];
		struct cw_act a[9];
		struct mat m;

		make(&m, g->dt, R, C, g->group, (int)(i & 1));
		if (g->dt == ST_DTYPE_MXFP4 ||
		    (g->dt == ST_DTYPE_F8_E4M3 && g->group % 8 == 0)) {
			assert_non_null(cw_kern_avx512(&m.v));
			assert_ptr_not_equal(cw_kern_avx512(&m.v),
					     cw_kern_avx2(&m.v));
			assert_ptr_not_equal(cw_kern_avx512_mm(&m.v),
					     cw_kern_avx2_mm(&m.v));
		}
		for (int t = 0; t < 9; t++) {
			fill_row(x + (size_t)t * C, C, t % 3 == 2);
			if (t == 4)
				memset(x + (size_t)t * C, 0, sizeof(float) * C);
			b5->act_prepare(x + (size_t)t * C, C, g->dt,
					buf + (size_t)t * ab, &a[t]);
			ys2[t] = y2 + (size_t)t * R;
			ys5[t] = y5 + (size_t)t * R;
		}
		for (int n = 1; n <= 9; n++) {
			memset(y2, 0xff, sizeof(float) * (size_t)R * 9);
			memset(y5, 0xff, sizeof(float) * (size_t)R * 9);
			if (n == 1) {
				b2->matvec_act(&m.v, a, y2, 0, R);
				b5->matvec_act(&m.v, a, y5, 0, R);
			} else {
				b2->matmul_act(&m.v, a, n, ys2, 0, R);
				b5->matmul_act(&m.v, a, n, ys5, 0, R / 2);
				b5->matmul_act(&m.v, a, n, ys5, R / 2, R);
			}
			for (int t = 0; t < n; t++)
				for (int64_t r = 0; r < R; r++, compared++)
					if (memcmp(&ys2[t][r], &ys5[t][r], 4))
						fail_msg("%s %lldx%lld g%u n=%d token %d "
							 "row %lld: AVX-512 %.9g vs "
							 "AVX2 %.9g",
							 st_dtype_traits(g->dt)->name,
							 (long long)R, (long long)C,
							 g->group, n, t, (long long)r,
							 ys5[t][r], ys2[t][r]);
		}
		unmake(&m);
		free(buf);
		free(x);
		free(y2);
		free(y5);
	}
	assert_true(compared > 1000);
}

/* Every backend under test: reference (auto, generic) and fast per path. */
static int backends(const struct cw_backend_ops **ret, int *ret_exact)
{
	int n = 0;

	ret[n] = cw_backend_cpu(); ret_exact[n++] = 1;
	ret[n] = cw_backend_cpu_generic(); ret_exact[n++] = 1;
	for (int p = CW_KERN_C; p < CW_KERN_PATH_MAX; p++)
		if (cw_backend_cpu_fast_path(p)) {
			ret[n] = cw_backend_cpu_fast_path(p);
			ret_exact[n++] = 0;
		}
	return n;
}

/* got vs want: exact for reference mode; fast mode within 2e-6 relative
 * (the int8 scale 1/127 of a one-hot activation is rounded) or, below
 * FLT_MIN, 2^-140 absolute (the factor goes subnormal). */
static void expect_val(float got, float want, int exact, const char *what,
		       int i)
{
	if (isnan(want)) {
		if (!isnan(got))
			fail_msg("%s %d: %.9g, want NaN", what, i, got);
		return;
	}
	if (exact ? got != want : got != want &&
		    !(fabsf(got - want) <= 2e-6f * fabsf(want) ||
		      fabsf(got - want) <= 0x1p-140f))
		fail_msg("%s %d: %.9g, want %.9g", what, i, got, want);
}

/* Every FP8 E4M3 weight code (the store never writes the NaN codes 0x7f,
 * 0xff) reads as st_e4m3_to_f32's value on every fast path, exactly: one
 * row of 256 codes and a one-hot activation per column, with no scales and
 * with a scale of 2 (the BF16 path's table, subnormals included); the hot
 * value 1 and 1 + 2^-12 + 2^-20 (its product with any E4M3 value is exact
 * in float; an activation rounded to fewer than 21 significant bits, as a
 * two-part BF16 split would be, fails it). */
static void test_fp8_every_code(void **state)
{
	uint8_t codes[256];
	float x[256], y[4], scales[2] = { 2.0f, 2.0f };
	unsigned char *buf = malloc(cw_backend_cpu_fast()->act_bytes(256));
	int checked = 0;

	(void)state;
	for (int c = 0; c < 256; c++)
		codes[c] = (c & 0x7f) == 0x7f ? 0 : (uint8_t)c;
	for (int p = CW_KERN_C; p < CW_KERN_PATH_MAX; p++) {
		const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);

		if (!be)
			continue;
		for (int sc = 0; sc < 4; sc++) {
			const float hot = sc & 2 ? 1.0f + 0x1p-12f + 0x1p-20f : 1.0f;

			const struct cw_wview w = {
				.dtype = ST_DTYPE_F8_E4M3, .data = codes,
				.scales = sc & 1 ? (const uint8_t *)scales : NULL,
				.rows = 1, .cols = 256, .group = sc & 1 ? 128 : 0,
				.global_scale = 1.0f,
			};
			struct cw_act a;

			for (int c = 0; c < 256; c++) {
				const float want = st_e4m3_to_f32(codes[c]) *
						   hot * (sc & 1 ? 2.0f : 1.0f);

				memset(x, 0, sizeof(x));
				x[c] = hot;
				be->act_prepare(x, 256, ST_DTYPE_F8_E4M3, buf, &a);
				be->matvec_act(&w, &a, y, 0, 1);
				if (y[0] != want)
					fail_msg("%s code 0x%02x x %.9g%s: %.9g, want %.9g",
						 be->name, codes[c], hot,
						 sc & 1 ? " scale 2" : "", y[0], want);
				checked++;
			}
		}
	}
	free(buf);
	assert_true(checked >= 2 * 256 * 4);
}

/* Every column of FP8 views the AVX-512 VBMI kernel takes (and those it
 * leaves to the AVX-512 path) lands on its own weight and its own group's
 * scale on every path, exactly: random codes, a different power-of-two
 * scale per (row, group), one-hot activations (one exact product, the
 * rest zeros), so y[r] must equal deq[r][c] * x_c exactly.  Catches a
 * wrong lane order of the reordered activations or a wrong group of a
 * 32-column half, which the L1-bound comparisons could hide in noise. */
static void test_fp8_columns_exact(void **state)
{
	static const struct geom k_g[] = {
		{ ST_DTYPE_F8_E4M3, 5, 192, 32 },  /* halves of different groups */
		{ ST_DTYPE_F8_E4M3, 5, 320, 160 }, /* groups end mid-step */
		{ ST_DTYPE_F8_E4M3, 4, 256, 64 },
		{ ST_DTYPE_F8_E4M3, 6, 384, 128 },
		{ ST_DTYPE_F8_E4M3, 3, 128, 0 },   /* no scales */
		{ ST_DTYPE_F8_E4M3, 3, 120, 40 },  /* the AVX-512 path's */
	};
	int checked = 0;

	(void)state;
	for (size_t i = 0; i < sizeof(k_g) / sizeof(k_g[0]); i++) {
		const struct geom *g = &k_g[i];
		const int64_t R = g->rows, C = g->cols;
		const int64_t ng = g->group ? (C + g->group - 1) / g->group : 1;
		uint8_t *codes = malloc((size_t)(R * C));
		float *sc = malloc(sizeof(float) * (size_t)(R * ng));
		float *x = calloc((size_t)C, sizeof(float)), y[8];
		unsigned char *buf = malloc(cw_backend_cpu_fast()->act_bytes(C));
		const struct cw_wview w = {
			.dtype = ST_DTYPE_F8_E4M3, .data = codes,
			.scales = g->group ? (const uint8_t *)sc : NULL,
			.rows = R, .cols = C, .group = g->group,
			.global_scale = 1.0f,
		};

		for (int64_t k = 0; k < R * C; k++) {
			codes[k] = (uint8_t)(rnd() & 0xff);
			if ((codes[k] & 0x7f) == 0x7f) /* NaN: never stored */
				codes[k] = 0x3a;
		}
		for (int64_t k = 0; k < R * ng; k++)
			sc[k] = ldexpf(1.0f, (int)(k % 11) - 5);
		for (int p = CW_KERN_C; p < CW_KERN_PATH_MAX; p++) {
			const struct cw_backend_ops *be = cw_backend_cpu_fast_path(p);

			if (!be)
				continue;
			for (int64_t c = 0; c < C; c++) {
				struct cw_act a;

				x[c] = 1.0f + 0x1p-9f;
				be->act_prepare(x, C, ST_DTYPE_F8_E4M3, buf, &a);
				be->matvec_act(&w, &a, y, 0, R);
				for (int64_t r = 0; r < R; r++) {
					const float want =
						st_e4m3_to_f32(codes[r * C + c]) * x[c] *
						(g->group ? sc[r * ng + c / g->group] : 1.0f);

					/* == : a -0 weight sums to +0 */
					if (y[r] != want)
						fail_msg("%s %lldx%lld g%u row %lld col %lld: "
							 "%.9g, want %.9g", be->name,
							 (long long)R, (long long)C, g->group,
							 (long long)r, (long long)c, y[r], want);
					checked++;
				}
				x[c] = 0.0f;
			}
		}
		free(codes);
		free(sc);
		free(x);
		free(buf);
	}
	assert_true(checked >= 2 * (5 * 192 + 5 * 320 + 4 * 256 + 6 * 384 +
				    3 * 128 + 3 * 120));
}

/* P5, the whole kind: every scale byte / value of each 4-bit format decodes
 * as the spec says on every path.  One block, element 0 = code 7 (+6), x =
 * e_0: y = 6 * scale. */
static void test_p5_every_scale(void **state)
{
	const struct cw_backend_ops *be[8];
	int exact[8], nb = backends(be, exact);
	uint8_t codes[16] = { 0x07 };
	float x[32] = { 1.0f }, y;

	(void)state;
	for (int k = 0; k < nb; k++) {
		for (int s = 0; s < 256; s++) {
			uint8_t sc[2] = { (uint8_t)s, (uint8_t)s };
			struct cw_wview mx = { ST_DTYPE_MXFP4, codes, sc, 1, 32, 0,
						ST_SCALE_E8M0, 1.0f, 0 };
			struct cw_wview nv = { ST_DTYPE_NVFP4, codes, sc, 1, 32, 0,
						ST_SCALE_E4M3, 1.0f, 0 };

			nv.global_scale = 1.0f;
			be[k]->matvec(&mx, x, &y, 0, 1);
			expect_val(y, 6.0f * st_e8m0_to_f32((uint8_t)s), exact[k],
				   be[k]->name, s);
			be[k]->matvec(&nv, x, &y, 0, 1);
			expect_val(y, 6.0f * st_e4m3_to_f32((uint8_t)s), exact[k],
				   be[k]->name, s);
		}
		for (uint32_t h = 0; h < 65536; h++) {
			uint16_t sc = (uint16_t)h;
			struct cw_wview e2 = { ST_DTYPE_E2M1_F16, codes,
					       (const uint8_t *)&sc, 1, 32, 32,
					       ST_SCALE_F16, 1.0f, 0 };
			const float want = 6.0f * st_f16_to_f32(sc);

			be[k]->matvec(&e2, x, &y, 0, 1);
			if (isinf(want)) {
				/* an infinite scale: the block's zeros make
				 * the exact product NaN (0 * inf), the
				 * factored fast one +-inf: not finite */
				if (isfinite(y))
					fail_msg("%s f16 scale %#x: %g, want %g",
						 be[k]->name, h, y, want);
			}
			else
				expect_val(y, want, exact[k], be[k]->name, (int)h);
		}
		/* the P5 example: code 7 with scale byte 124 is 0.75 */
		{
			uint8_t sc = 124;
			struct cw_wview mx = { ST_DTYPE_MXFP4, codes, &sc, 1, 32,
					       0, ST_SCALE_E8M0, 1.0f, 0 };

			be[k]->matvec(&mx, x, &y, 0, 1);
			expect_val(y, 0.75f, exact[k], be[k]->name, 124);
		}
	}
}

/* P7: scale byte 128 (x2), first byte 0x72: OCP elements [0] = 2, [1] = 12,
 * the rest 0 (not GGUF's [0] = 2, [16] = 12), on every path. */
static void test_p7_example(void **state)
{
	const struct cw_backend_ops *be[8];
	int exact[8], nb = backends(be, exact);
	uint8_t codes[16] = { 0x72 }, sc = 128;
	struct cw_wview v = { ST_DTYPE_MXFP4, codes, &sc, 1, 32, 0,
			      ST_SCALE_E8M0, 1.0f, 0 };

	(void)state;
	for (int k = 0; k < nb; k++)
		for (int j = 0; j < 32; j++) {
			float x[32] = { 0 }, y;

			x[j] = 1.0f;
			be[k]->matvec(&v, x, &y, 0, 1);
			expect_val(y, j == 0 ? 2.0f : j == 1 ? 12.0f : 0.0f,
				   exact[k], be[k]->name, j);
		}
}

/* P7, the whole kind: through a one-hot x every element of every row reads
 * back as st_formats' dequantizer puts it, every 4-bit geometry and path. */
static void test_p7_layout_every_element(void **state)
{
	const struct cw_backend_ops *be[8];
	int exact[8], nb = backends(be, exact);

	(void)state;
	for (size_t i = 0; i < sizeof(k_geoms) / sizeof(k_geoms[0]); i++) {
		const struct geom *g = &k_geoms[i];
		struct mat m;
		float *x, *y;

		if (!is_fp4(g->dt))
			continue;
		make(&m, g->dt, g->rows, g->cols, g->group, 0);
		x = calloc((size_t)g->cols, sizeof(float));
		y = malloc(sizeof(float) * g->rows);
		for (int k = 0; k < nb; k++)
			for (int64_t j = 0; j < g->cols; j++) {
				x[j] = 1.0f;
				be[k]->matvec(&m.v, x, y, 0, g->rows);
				x[j] = 0.0f;
				for (int64_t r = 0; r < g->rows; r++)
					expect_val(y[r], m.deq[r * g->cols + j],
						   exact[k], be[k]->name,
						   (int)(r * g->cols + j));
			}
		unmake(&m);
		free(x);
		free(y);
	}
}

/* The activation quantizer: per block d = amax / 127, |x - q d| <= d / 2,
 * q order (evens, odds per 16), zero blocks zero, tails zero. */
static void test_quantize_act(void **state)
{
	const int64_t n = 77;
	float x[77];
	unsigned char buf[1024];
	struct cw_act a;

	(void)state;
	fill_row(x, n, 1);
	x[5] = -3.0f;
	assert_true(cw_kern_act_bytes(n) == 2 * 96 + 3 * 4 + 3 * 4); /* + block sums */
	cw_kern_quantize_act(x, n, 16, buf, &a);
	assert_true(a.n == n && a.x == x);
	for (int64_t c = 0; c < n; c++) {
		const float d = a.d[c / 32];

		assert_true(fabsf(x[c] - a.q[cw_kern_qpos(c, 16)] * d) <= d / 2 * 1.0001f);
	}
	assert_true(a.d[1] == 0.0f); /* block 1 is all zero (fill_row) */
	for (int64_t p = 0; p < 96; p++)
		assert_int_equal(a.qabs[p], abs(a.q[p]));
	for (int64_t c = n; c < 96; c++)
		assert_int_equal(a.q[cw_kern_qpos(c, 16)], 0);
	assert_int_equal(cw_kern_qpos(1, 16), 8);
	assert_int_equal(cw_kern_qpos(2, 16), 1);
	assert_int_equal(cw_kern_qpos(17, 16), 24);
	assert_int_equal(cw_kern_qpos(1, 32), 16);
	assert_int_equal(cw_kern_qpos(17, 32), 24);
	assert_int_equal(cw_kern_qpos(30, 32), 15);
	assert_int_equal(cw_kern_qpos(33, 32), 48);
	/* the largest element maps to +-127 */
	{
		int found = 0;

		for (int64_t c = 0; c < 32; c++)
			found |= abs(a.q[cw_kern_qpos(c, 16)]) == 127;
		assert_true(found);
	}
}

/* The pool: every task of every job runs exactly once, and the job is
 * complete when cw_threads_run returns; many small jobs back to back (as
 * a decode step makes), with 2 threads (pinned) and 5 (more than this
 * machine's CPUs: unpinned, workers often late). */
struct tjob {
	int *hits;
	int n;
};

static void ttask(void *arg, int t, int n)
{
	struct tjob *j = arg;

	assert_int_equal(n, j->n);
	__atomic_fetch_add(&j->hits[t], 1, __ATOMIC_RELAXED);
}

static void test_threads(void **state)
{
	(void)state;
	for (int nt = 2; nt <= 5; nt += 3) {
		struct cw_threads *p = NULL;
		int hits[64];

		assert_int_equal(cw_threads_create(nt, &p), 0);
		assert_int_equal(cw_threads_count(p), nt);
		for (int it = 0; it < 20000; it++) {
			struct tjob j = { hits, 1 + (int)(rnd() % 64) };

			memset(hits, 0, sizeof(hits));
			cw_threads_run(p, ttask, &j, j.n);
			for (int t = 0; t < 64; t++)
				if (hits[t] != (t < j.n))
					fail_msg("%d threads, job %d: task %d "
						 "ran %d times", nt, it, t,
						 hits[t]);
		}
		cw_threads_destroy(p);
	}
	assert_int_equal(cw_threads_create(0, NULL), -EINVAL);
}

/* Two pools in a row on the same thread (the CPU-mask regression: the
 * first pool pinned its creator and never gave its mask back, so the
 * second saw one allowed CPU and ran every thread there).  Per pool of 2:
 * each of the 2 tasks waits until both run at once (so each thread runs
 * one) and records its thread's CPU mask: one CPU each, two different
 * CPUs; after cw_threads_destroy the caller's mask is the one it had. */
struct pinjob {
	int arrived;
	cpu_set_t mask[2];
	int timed_out;
};

static void pintask(void *arg, int t, int n)
{
	struct pinjob *j = arg;
	struct timespec t0, now;

	(void)n;
	__atomic_fetch_add(&j->arrived, 1, __ATOMIC_ACQ_REL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (__atomic_load_n(&j->arrived, __ATOMIC_ACQUIRE) < 2) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - t0.tv_sec > 20) {
			j->timed_out = 1;
			break;
		}
	}
	pthread_getaffinity_np(pthread_self(), sizeof(j->mask[t]),
			       &j->mask[t]);
}

static cpu_set_t g_start_mask; /* the main thread's at start (main) */

static void test_threads_two_pools(void **state)
{
	cpu_set_t before, after;

	(void)state;
	assert_int_equal(sched_getaffinity(0, sizeof(before), &before), 0);
	/* the earlier pool tests gave the mask back too */
	if (!CPU_EQUAL(&before, &g_start_mask))
		fail_msg("the CPU mask at start not restored by the pools "
			 "before (%d CPUs at start, %d now)",
			 CPU_COUNT(&g_start_mask), CPU_COUNT(&before));
	if (CPU_COUNT(&before) < 2)
		skip(); /* one CPU: pools do not pin */
	for (int pool = 0; pool < 2; pool++) {
		struct cw_threads *p = NULL;
		struct pinjob j;
		int c0 = -1, c1 = -1;

		memset(&j, 0, sizeof(j));
		assert_int_equal(cw_threads_create(2, &p), 0);
		cw_threads_run(p, pintask, &j, 2);
		cw_threads_destroy(p);
		assert_false(j.timed_out);
		assert_int_equal(CPU_COUNT(&j.mask[0]), 1);
		assert_int_equal(CPU_COUNT(&j.mask[1]), 1);
		for (int c = 0; c < CPU_SETSIZE; c++) {
			if (CPU_ISSET(c, &j.mask[0]))
				c0 = c;
			if (CPU_ISSET(c, &j.mask[1]))
				c1 = c;
		}
		if (c0 == c1)
			fail_msg("pool %d: both threads pinned to CPU %d",
				 pool, c0);
		assert_int_equal(sched_getaffinity(0, sizeof(after), &after),
				 0);
		if (!CPU_EQUAL(&before, &after))
			fail_msg("pool %d: the caller's CPU mask not restored "
				 "(%d CPUs before, %d after)", pool,
				 CPU_COUNT(&before), CPU_COUNT(&after));
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_quantize_act),
		cmocka_unit_test(test_paths_random),
		cmocka_unit_test(test_gemm),
		cmocka_unit_test(test_avx512_equals_avx2),
		cmocka_unit_test(test_p5_every_scale),
		cmocka_unit_test(test_fp8_every_code),
		cmocka_unit_test(test_fp8_columns_exact),
		cmocka_unit_test(test_p7_example),
		cmocka_unit_test(test_p7_layout_every_element),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_threads_two_pools),
	};

	if (sched_getaffinity(0, sizeof(g_start_mask), &g_start_mask) < 0) {
		perror("sched_getaffinity");
		return 1;
	}
	printf("fast kernel paths on this CPU: C%s%s%s\n",
	       cw_kern_path_supported(CW_KERN_AVX2) ? ", AVX2+FMA+F16C" : "",
	       cw_kern_path_supported(CW_KERN_AVX512) ?
		       ", AVX-512 (F/BW/VL/DQ/VNNI)" : "",
	       cw_kern_path_supported(CW_KERN_AVX512BF16) ?
		       ", AVX-512 VBMI+BF16 (FP8)" : "");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
