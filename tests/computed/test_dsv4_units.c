/*
 * test_dsv4_units.c — the pieces of the DeepSeek-V4 forward pass
 * (cw_dsv_ops.c, st_config_dsv4.c) against values computed independently
 * here: the indexer's selection (ties), Sinkhorn mixing and the mHC combine orientation, the hash and score
 * routers, clipped SwiGLU, FP8 block-scaled dequantisation, softmax
 * pooling of a compressor window, interleaved partial RoPE and the YaRN
 * frequencies (the fixture README's check values), sink attention, and
 * config.json refusals, the KV stream declarations, and the optional QAT
 * round trips (FP8 E4M3 and E2M1 with power-of-two block scales,
 * Hadamard).
 * Not one test with test_dsv41_units.c: that file tests V4.1's own
 * functions (its KV formats, CSA2, single-pass mHC, Engram, its config
 * keys), this one the pieces V4 and V4.1 share and V4's own; no check is
 * run on both revisions, so there is nothing to parameterise.
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

#include "cw_dsv.h"
#include "cw_dsv_ops.h"
#include "dsv_test_util.h"
#include "st_config_dsv_family.h"
#include "st_util.h"
#include "test_util.h"

static double silu(double x)
{
	return x / (1.0 + exp(-x));
}

static double sig(double x)
{
	return 1.0 / (1.0 + exp(-x));
}

/*
 * mHC pre with n = 4 streams, D = 8: pre/post from the formulas, the
 * combine matrix by Sinkhorn written here column-first-then-alternating
 * with explicit sums; then the combine is doubly stochastic (within the
 * eps terms) and not symmetric, and hc_post reads it as comb[source][dest].
 */
static void test_sinkhorn_and_post(void **state)
{
	enum { n = 4, D = 8, NMU = (2 + n) * n };
	float X[n * D], fn[NMU * n * D], base[NMU], scale[3] = { 0.9f, 1.1f, 1.3f };
	float pre[n], post[n], comb[n * n];
	double mu[NMU], M[n][n], ss = 0, eps = 1e-6, rms = 1e-6;
	unsigned st = 7;
	int iters = 20;

	(void)state;
	for (int i = 0; i < n * D; i++)
		X[i] = 2.0f * dsvt_prand(&st);
	for (int i = 0; i < NMU * n * D; i++)
		fn[i] = 0.3f * dsvt_prand(&st);
	for (int i = 0; i < NMU; i++)
		base[i] = dsvt_prand(&st);
	cw_dsv_hc_pre(X, n, D, fn, base, scale, iters, eps, rms, pre, post,
		       comb);
	for (int i = 0; i < n * D; i++)
		ss += (double)X[i] * X[i];
	for (int k = 0; k < NMU; k++) {
		double a = 0;

		for (int i = 0; i < n * D; i++)
			a += (double)fn[k * n * D + i] * X[i];
		mu[k] = a / sqrt(ss / (n * D) + rms);
	}
	for (int k = 0; k < n; k++) {
		assert_true(fabs(pre[k] - (sig(mu[k] * scale[0] + base[k]) + eps)) < 1e-6);
		assert_true(fabs(post[k] - 2 * sig(mu[n + k] * scale[1] + base[n + k])) < 1e-6);
	}
	for (int i = 0; i < n; i++) {
		double s = 0;

		for (int j = 0; j < n; j++)
			s += exp(mu[2 * n + i * n + j] * scale[2] + base[2 * n + i * n + j]);
		for (int j = 0; j < n; j++)
			M[i][j] = exp(mu[2 * n + i * n + j] * scale[2] + base[2 * n + i * n + j]) / s + eps;
	}
	for (int it = 0; it < 2 * iters - 1; it++) {
		int cols = it % 2 == 0; /* col, row, col, ..., col */

		for (int a = 0; a < n; a++) {
			double s = 0;

			for (int b = 0; b < n; b++)
				s += cols ? M[b][a] : M[a][b];
			for (int b = 0; b < n; b++) {
				if (cols)
					M[b][a] /= s + eps;
				else
					M[a][b] /= s + eps;
			}
		}
	}
	for (int i = 0; i < n; i++) {
		double rs = 0, cs = 0;

		for (int j = 0; j < n; j++) {
			assert_true(fabs(comb[i * n + j] - M[i][j]) < 1e-6);
			rs += comb[i * n + j];
			cs += comb[j * n + i];
		}
		assert_true(fabs(rs - 1) < 1e-3);
		assert_true(fabs(cs - 1) < 1e-4);
	}
	assert_true(fabs(comb[1] - comb[n]) > 1e-3); /* not symmetric */
	{
		float Y[D], Xn[n * D];

		for (int d = 0; d < D; d++)
			Y[d] = dsvt_prand(&st);
		memcpy(Xn, X, sizeof(X));
		cw_dsv_hc_post(Xn, n, D, Y, post, comb);
		for (int j = 0; j < n; j++)
			for (int d = 0; d < D; d++) {
				double e = post[j] * Y[d];

				for (int i = 0; i < n; i++)
					e += comb[i * n + j] * X[i * D + d];
				assert_true(fabs(Xn[j * D + d] - e) < 1e-5);
			}
	}
}

/* Hash router: ids from the table, weights from the unbiased scores
 * sqrt(softplus), renormalised and scaled; score router: top-k of
 * score + bias (the bias changes the choice), weights without the bias. */
static void test_routers(void **state)
{
	const float lg[4] = { 1.0f, -0.5f, 2.0f, 0.25f };
	const float bias[4] = { 0.0f, 2.0f, 0.0f, -1.0f };
	const int32_t hash[2] = { 3, 1 };
	double s[4];
	int32_t ids[2];
	float w[2];

	(void)state;
	for (int e = 0; e < 4; e++)
		s[e] = sqrt(log(1.0 + exp((double)lg[e])));
	cw_dsv_route_topk(lg, 4, 2, hash, NULL, 1, 1.5, ids, w);
	assert_int_equal(ids[0], 3);
	assert_int_equal(ids[1], 1);
	assert_true(fabs(w[0] - s[3] / (s[3] + s[1]) * 1.5) < 1e-6);
	assert_true(fabs(w[1] - s[1] / (s[3] + s[1]) * 1.5) < 1e-6);
	/* without bias: experts 2 then 0; with it: 1 (s 0.69 + 2) then 2 */
	cw_dsv_route_topk(lg, 4, 2, NULL, NULL, 1, 1.5, ids, w);
	assert_int_equal(ids[0], 2);
	assert_int_equal(ids[1], 0);
	cw_dsv_route_topk(lg, 4, 2, NULL, bias, 1, 1.5, ids, w);
	assert_int_equal(ids[0], 1);
	assert_int_equal(ids[1], 2);
	assert_true(fabs(w[0] - s[1] / (s[1] + s[2]) * 1.5) < 1e-6);
	assert_true(fabs(w[1] - s[2] / (s[1] + s[2]) * 1.5) < 1e-6);
	/* not normalised: scaled scores */
	cw_dsv_route_topk(lg, 4, 2, NULL, bias, 0, 1.5, ids, w);
	assert_true(fabs(w[0] - s[1] * 1.5) < 1e-6);
}

/* gate clamped from above only, up from both sides */
static void test_swiglu_clip(void **state)
{
	float g[4] = { 3.0f, -5.0f, 1.0f, 2.0f };
	const float u[4] = { 3.0f, -3.0f, 0.5f, -1.5f };
	const double want[4] = { silu(2.0) * 2.0, silu(-5.0) * -2.0,
				 silu(1.0) * 0.5, silu(2.0) * -1.5 };

	(void)state;
	cw_dsv_swiglu_clip(g, u, 4, 2.0);
	for (int i = 0; i < 4; i++)
		assert_true(fabs(g[i] - want[i]) < 1e-6);
}

/* FP8 E4M3 [3][5] with E8M0 blocks of 2x2 (scale [2][3]): every element
 * is its code's value times 2^(byte - 127) of block (o/2, i/2). */
static void test_fp8_blocks(void **state)
{
	/* 0x38 = 1, 0x40 = 2, 0xB8 = -1, 0x01 = 2^-9, 0x7E = 448, 0x00 = 0 */
	const uint8_t codes[15] = { 0x38, 0x40, 0xB8, 0x01, 0x7E,
				    0x40, 0x38, 0x01, 0x00, 0xB8,
				    0x7E, 0xB8, 0x38, 0x40, 0x01 };
	const double val[15] = { 1, 2, -1, 1.0 / 512, 448,
				 2, 1, 1.0 / 512, 0, -1,
				 448, -1, 1, 2, 1.0 / 512 };
	const uint8_t sc[6] = { 127, 128, 126, 130, 120, 117 };
	float out[15];

	(void)state;
	cw_dsv_fp8_dequant(codes, sc, 3, 5, 2, 2, out);
	for (int o = 0; o < 3; o++)
		for (int i = 0; i < 5; i++)
			assert_true(out[o * 5 + i] ==
				    (float)(val[o * 5 + i] *
					    ldexp(1.0, sc[(o / 2) * 3 + i / 2] - 127)));
}

/* Softmax pooling per channel over 3 slots. */
static void test_pool(void **state)
{
	const float c0[2] = { 1, 10 }, c1[2] = { 2, 20 }, c2[2] = { 3, 30 };
	const float z0[2] = { 0, 5 }, z1[2] = { 1, 0 }, z2[2] = { 2, -5 };
	const float *c[3] = { c0, c1, c2 }, *z[3] = { z0, z1, z2 };
	float out[2];
	double e0 = exp(0), e1 = exp(1), e2 = exp(2);
	double f0 = exp(5), f1 = exp(0), f2 = exp(-5);

	(void)state;
	cw_dsv_pool(c, z, 3, 2, out);
	assert_true(fabs(out[0] - (e0 * 1 + e1 * 2 + e2 * 3) / (e0 + e1 + e2)) < 1e-5);
	assert_true(fabs(out[1] - (f0 * 10 + f1 * 20 + f2 * 30) / (f0 + f1 + f2)) < 1e-4);
}

/* Interleaved pairs on the last dims only; inverse undoes it. */
static void test_rope(void **state)
{
	float x[6] = { 5, 6, 1, 0, 0, 2 };
	const double f[2] = { 1.0, 0.5 };

	(void)state;
	cw_dsv_rope(x, 6, 2, f, 3, 0);
	assert_true(x[0] == 5 && x[1] == 6);
	assert_true(fabs(x[2] - cos(3.0)) < 1e-6 && fabs(x[3] - sin(3.0)) < 1e-6);
	assert_true(fabs(x[4] + 2 * sin(1.5)) < 1e-6 && fabs(x[5] - 2 * cos(1.5)) < 1e-6);
	cw_dsv_rope(x, 6, 2, f, 3, 1);
	assert_true(fabs(x[2] - 1) < 1e-6 && fabs(x[3]) < 1e-6);
	assert_true(fabs(x[4]) < 1e-6 && fabs(x[5] - 2) < 1e-6);
}

/* Sink in the denominator only. */
static void test_sink_attn(void **state)
{
	const float q[2] = { 1, 0 }, r0[2] = { 2, 1 }, r1[2] = { 0, 3 };
	const float *rows[2] = { r0, r1 };
	float o[2];
	double s0 = 2 / sqrt(2.0), s1 = 0, sk = 0.5;
	double den = exp(s0) + exp(s1) + exp(sk);

	(void)state;
	cw_dsv_sink_attn(q, rows, 2, 2, (float)sk, o);
	assert_true(fabs(o[0] - (exp(s0) * 2) / den) < 1e-6);
	assert_true(fabs(o[1] - (exp(s0) * 1 + exp(s1) * 3) / den) < 1e-6);
}

/* Indexer: ReLU per head, head weights, top-k with ties to the lower row,
 * all rows when no more than top_k are visible. */
static void test_index_select(void **state)
{
	/* head 0 looks at dim 0, head 1 at dim 1 (weight -1: penalises) */
	const float q[4] = { 1, 0, 0, 1 }, om[2] = { 1.0f, -1.0f };
	const float keys[12] = { 1, 0,  2, 0,  1, 0,  2, 1,  0, 5,  -1, 0 };
	int sel[6];

	(void)state;
	/* scores/sqrt(2): 1, 2, 1, 2 - 1 = 1, -5, 0 (ReLU of -1) */
	assert_int_equal(cw_dsv4_index_select(q, om, 2, 2, keys, 6, 1, sel), 1);
	assert_int_equal(sel[0], 1);
	/* 2nd place: rows 0, 2, 3 tie at 1: row 0 */
	assert_int_equal(cw_dsv4_index_select(q, om, 2, 2, keys, 6, 2, sel), 2);
	assert_int_equal(sel[0], 0);
	assert_int_equal(sel[1], 1);
	assert_int_equal(cw_dsv4_index_select(q, om, 2, 2, keys, 6, 4, sel), 4);
	assert_int_equal(sel[0], 0);
	assert_int_equal(sel[1], 1);
	assert_int_equal(sel[2], 2);
	assert_int_equal(sel[3], 3);
	/* 5 of 6: row 5 (0) beats row 4 (-5) */
	assert_int_equal(cw_dsv4_index_select(q, om, 2, 2, keys, 6, 5, sel), 5);
	assert_int_equal(sel[4], 5);
	/* 3 visible, top 4: all */
	assert_int_equal(cw_dsv4_index_select(q, om, 2, 2, keys, 3, 4, sel), 3);
	assert_int_equal(sel[2], 2);
}

/* The official QAT round trips (options, off in reference mode). */
static void test_qat_roundtrips(void **state)
{
	float a[6] = { 1000, 1, 0.3f, -2, 3, -0.5f };
	const float a_want[6] = { 1024, 1, 0.3125f, -2, 3, -0.5f };
	float z[3] = { 0, 0, 0 };
	float b[4] = { 3, 1.1f, 0.4f, -0.2f };
	const float b_want[4] = { 3, 1, 0.5f, -0.25f };
	float h[4] = { 1, 2, 3, 4 };
	const float h_want[4] = { 5, -1, -2, 0 };

	(void)state;
	/* block 4: scale 4 (250 -> 256, 0.075 -> 0.078125); block 2: 2^-7 */
	cw_dsv_fp8_roundtrip(a, 6, 4);
	for (int i = 0; i < 6; i++)
		assert_true(a[i] == a_want[i]);
	cw_dsv_fp8_roundtrip(z, 3, 64);
	assert_true(z[0] == 0 && z[2] == 0);
	/* scale 0.5: 6, 2.2 -> 2, 0.8 -> 1, -0.4 -> -0.5 */
	cw_dsv_fp4_roundtrip(b, 4, 4);
	for (int i = 0; i < 4; i++)
		assert_true(b[i] == b_want[i]);
	cw_dsv_hadamard(h, 4);
	for (int i = 0; i < 4; i++)
		assert_true(fabsf(h[i] - h_want[i]) < 1e-6f);
	cw_dsv_hadamard(h, 4); /* its own inverse */
	for (int i = 0; i < 4; i++)
		assert_true(fabsf(h[i] - (float)(i + 1)) < 1e-6f);
}

/* The fixture's config and the README's per-pair frequencies. */
static void test_config_and_freqs(void **state)
{
	const double main_f[8] = { 1, 0.3162278, 0.1, 0.03162278, 0.01,
				   3.162278e-3, 1e-3, 3.162278e-4 };
	const double comp_f[8] = { 1, 0.2236068, 0.05, 7.686484e-3, 9.375e-4,
				   3.493856e-5, 7.8125e-6, 1.746928e-6 };
	struct st_dsv_config c;
	struct st_diag diag = { 0 };
	char *text = dsvt_fixture_config("tiny-deepseek-v4");
	double f[8];

	(void)state;
	assert_int_equal(st_dsv_config_parse(text, "config.json",
					     ST_DSV_REV_V4, &c, &diag), 0);
	assert_int_equal(c.n_layers, 6);
	assert_int_equal(c.compress_ratio[2], 4);
	assert_int_equal(c.compress_ratio[3], 16);
	assert_int_equal(c.fp8_block[0], 16);
	assert_true(c.swiglu_limit == 2.0);
	assert_int_equal(c.rope_dim, 16);
	cw_dsv_rope_freqs(&c, 0, f);
	for (int i = 0; i < 8; i++)
		assert_true(fabs(f[i] - main_f[i]) <= 1e-6 * main_f[i] + 1e-12);
	cw_dsv_rope_freqs(&c, 1, f);
	for (int i = 0; i < 8; i++)
		assert_true(fabs(f[i] - comp_f[i]) <= 1e-6 * comp_f[i] + 1e-12);
	free(text);
}

/* KV streams: the tiny fixture's layers, and the real V4-Flash schedule
 * (MODEL_FAMILY_DEEPSEEK_V4.md 2.2: layers 0-1 window only, 2, 4, ..., 42
 * CSA, 3, 5, ..., 41 HCA 128) against the doc's 6,880 B/token with BF16
 * rows (2.6) and its 5.6 MB BF16 window per sequence. */
static void test_streams(void **state)
{
	struct st_dsv_config c;
	struct st_diag diag = { 0 };
	struct cw_dsv_stream s[CW_DSV_MAX_STREAMS];
	char *text = dsvt_fixture_config("tiny-deepseek-v4");

	(void)state;
	assert_int_equal(st_dsv_config_parse(text, "config.json",
					     ST_DSV_REV_V4, &c, &diag), 0);
	free(text);
	assert_int_equal(cw_dsv_streams(&c, 0, s), 1);
	assert_int_equal(s[0].kind, CW_DSV_WINDOW);
	assert_int_equal(s[0].fixed_rows, 16);
	assert_int_equal(cw_dsv_streams(&c, 2, s), 5);
	assert_int_equal(s[1].kind, CW_DSV_COMP_ROWS);
	assert_int_equal(s[1].rows_den, 4);
	assert_int_equal(s[3].kind, CW_DSV_INDEX_ROWS);
	assert_int_equal(s[3].row_elems, 32);
	assert_int_equal(cw_dsv_streams(&c, 3, s), 3);
	assert_int_equal(s[1].rows_den, 16);
	assert_int_equal(s[2].kind, CW_DSV_COMP_STATE);
	assert_int_equal(s[2].fixed_rows, 16);
	assert_int_equal(cw_dsv_streams(&c, 6, s), -EINVAL);
	/* F32: 2 CSA x (64 + 32) / 4 + 2 HCA x 64 / 16, times 4 bytes */
	assert_true(cw_dsv4_kv_bytes_per_token(&c, 4) == 4.0 * (2 * 24 + 2 * 4));
	/* V4-Flash */
	c.n_layers = 43;
	c.head_dim = 512;
	c.index_head_dim = 128;
	c.sliding_window = 128;
	for (int l = 0; l < 43; l++)
		c.compress_ratio[l] = l < 2 ? 0 : l % 2 == 0 ? 4 : 128;
	assert_true(cw_dsv4_kv_bytes_per_token(&c, 2) == 6880.0);
	{
		double win = 43.0 * 128 * 512 * 2;
		double fixed = cw_dsv4_fixed_bytes(&c, 2);

		assert_true(fabs(win / 1e6 - 5.6) < 0.05);
		/* plus raw compressor states: 21 CSA x 8 x (4 x 512 + 4 x 128)
		 * and 20 HCA x 128 x 2 x 512, BF16 */
		assert_true(fixed == win + 2.0 * (21 * 8 * (2048 + 512) +
						  20 * 128 * 1024));
	}
}

/* Replaces the first occurrence of `from` in text by `to` (new string). */
static char *edit(const char *text, const char *from, const char *to)
{
	const char *p = strstr(text, from);
	char *r;

	assert_non_null(p);
	r = malloc(strlen(text) + strlen(to) + 1);
	memcpy(r, text, p - text);
	strcpy(r + (p - text), to);
	strcat(r, p + strlen(from));
	return r;
}

static void refuse(const char *text, const char *from, const char *to,
		   int err, const char *word)
{
	struct st_dsv_config c;
	struct st_diag diag = { 0 };
	char *t = edit(text, from, to);

	assert_int_equal(st_dsv_config_parse(t, "config.json",
					     ST_DSV_REV_V4, &c, &diag), err);
	if (!strstr(diag.msg, word))
		fail_msg("message \"%s\" does not name \"%s\"", diag.msg, word);
	free(t);
}

static void test_config_refusals(void **state)
{
	char *text = dsvt_fixture_config("tiny-deepseek-v4");

	(void)state;
	refuse(text, "\"hc_eps\"", "\"hc_epsilon\"", -ST_E_CONFIG, "hc_epsilon");
	refuse(text, "\"swiglu_limit\": 2.0,", "", -ST_E_CONFIG, "swiglu_limit");
	refuse(text, "\"num_key_value_heads\": 1", "\"num_key_value_heads\": 2",
	       -ST_E_UNSUPPORTED, "num_key_value_heads");
	refuse(text, "\"sqrtsoftplus\"", "\"sigmoid\"", -ST_E_UNSUPPORTED,
	       "scoring_func");
	refuse(text, "\"num_nextn_predict_layers\": 1",
	       "\"num_nextn_predict_layers\": 0", -ST_E_CONFIG,
	       "compress_ratios");
	refuse(text, "      16\n    ]", "      16,\n      32\n    ]",
	       -ST_E_CONFIG, "weight_block_size");
	refuse(text, "\"factor\": 16,", "\"factor\": 16, \"scale\": 1,",
	       -ST_E_CONFIG, "scale");
	refuse(text, "\"type\": \"yarn\"", "\"type\": \"linear\"",
	       -ST_E_UNSUPPORTED, "yarn");
	refuse(text, "\"beta_slow\": 1,", "\"beta_slow\": 0,", -ST_E_CONFIG,
	       "beta_slow");
	free(text);
}

/* The fixture's config with `from` replaced by `to`, parsed (must load). */
static void parse_edited(const char *text, const char *from, const char *to,
			 struct st_dsv_config *c)
{
	struct st_diag diag = { 0 };
	char *t = edit(text, from, to);

	if (st_dsv_config_parse(t, "config.json", ST_DSV_REV_V4, c, &diag))
		fail_msg("%s -> %s: %s", from, to, diag.msg);
	free(t);
}

/* rope_scaling keys a release may omit take the official ModelArgs
 * defaults (inference/model.py: rope_factor 40, original_seq_len 0 = no
 * YaRN, beta_fast 32, beta_slow 1; no mscale), one key at a time; each
 * first set to another value so the default is seen to replace it. */
static void test_rope_scaling_defaults(void **state)
{
	char *text = dsvt_fixture_config("tiny-deepseek-v4");
	struct st_dsv_config c;
	double f[8], plain[8];

	(void)state;
	/* given values are read */
	parse_edited(text, "\"beta_fast\": 32,", "\"beta_fast\": 8,", &c);
	assert_true(c.yarn_beta_fast == 8);
	parse_edited(text, "\"beta_slow\": 1,", "\"beta_slow\": 2,", &c);
	assert_true(c.yarn_beta_slow == 2);
	/* beta_fast absent: 32 */
	parse_edited(text, "\"beta_fast\": 32,", "", &c);
	assert_true(c.yarn_beta_fast == 32 && c.yarn_factor == 16);
	/* beta_slow absent: 1 */
	parse_edited(text, "\"beta_slow\": 1,", "", &c);
	assert_true(c.yarn_beta_slow == 1 && c.yarn_beta_fast == 32);
	/* factor absent: 40 */
	parse_edited(text, "\"factor\": 16,", "", &c);
	assert_true(c.yarn_factor == 40);
	assert_int_equal(c.yarn_orig_max_pos, 4096);
	/* type absent: YaRN all the same */
	parse_edited(text, ",\n    \"type\": \"yarn\"", "", &c);
	assert_int_equal(c.yarn_orig_max_pos, 4096);
	assert_true(c.yarn_factor == 16);
	/* mscale, mscale_all_dim: accepted, unused (the frequencies are the
	 * fixture's) */
	parse_edited(text, "\"factor\": 16,",
		     "\"factor\": 16, \"mscale\": 0.707, "
		     "\"mscale_all_dim\": 0.707,", &c);
	assert_true(c.yarn_factor == 16);
	cw_dsv_rope_freqs(&c, 1, f);
	assert_true(fabs(f[4] - 9.375e-4) <= 1e-6 * 9.375e-4);
	/* original_max_position_embeddings absent: 0, no YaRN: the compress
	 * rope is plain compress_rope_theta powers */
	parse_edited(text, "\"original_max_position_embeddings\": 4096,", "",
		     &c);
	assert_int_equal(c.yarn_orig_max_pos, 0);
	cw_dsv_rope_freqs(&c, 1, f);
	for (int i = 0; i < 8; i++)
		plain[i] = 1.0 / pow(c.compress_rope_theta, 2.0 * i / 16);
	for (int i = 0; i < 8; i++)
		assert_true(fabs(f[i] - plain[i]) <= 1e-12 * plain[i]);
	assert_true(fabs(f[4] - 9.375e-4) > 1e-5); /* YaRN changed it */
	/* the whole object absent: all defaults, no YaRN */
	{
		const char *p = strstr(text, "\"rope_scaling\"");
		const char *e = p ? strstr(p, "},") : NULL;
		char from[512];

		assert_non_null(e);
		assert_true((size_t)(e + 2 - p) < sizeof(from));
		memcpy(from, p, (size_t)(e + 2 - p));
		from[e + 2 - p] = 0;
		parse_edited(text, from, "", &c);
		assert_int_equal(c.yarn_orig_max_pos, 0);
		assert_true(c.yarn_factor == 40 && c.yarn_beta_fast == 32 &&
			    c.yarn_beta_slow == 1);
	}
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sinkhorn_and_post),
		cmocka_unit_test(test_routers),
		cmocka_unit_test(test_swiglu_clip),
		cmocka_unit_test(test_fp8_blocks),
		cmocka_unit_test(test_pool),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_sink_attn),
		cmocka_unit_test(test_index_select),
		cmocka_unit_test(test_qat_roundtrips),
		cmocka_unit_test(test_config_and_freqs),
		cmocka_unit_test(test_config_refusals),
		cmocka_unit_test(test_rope_scaling_defaults),
		cmocka_unit_test(test_streams),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
