/*
 * test_store_calib.c — the calibrated scale search at convert time on the
 * tiny-mixtral fixture, and its statistics file (common/st_calib.h):
 *
 *  - statistics round-trip through st_calib_write / st_calib_read (every
 *    count and sum), the means st_calib_weights gives, its fallback below
 *    the token threshold; a flipped byte (checksum), a truncated file, a
 *    wrong magic or version, a negative sum are refused;
 *  - es_convert with scale_search = calibrated: byte-identical twice, the
 *    manifest records "calibrated" per 4-bit matrix and
 *    experts.policy.calibration {stats_xxh3 = XXH3 of the file, model_id,
 *    text_xxh3, tokens, min_tokens, fallback_experts (counted here)}, the
 *    experts differ from the unweighted search's (skewed weights);
 *    statistics of another model (other model id or other dimensions),
 *    corrupt statistics, no statistics, statistics with another search
 *    are refused before anything is written;
 *  - --attention f32 / --shared-experts (refused: no shared experts);
 *  - option errors: a layer named twice with different formats (one spec,
 *    or first= and 0= resolved against the model) is reported (the later
 *    rule wins), a scale search with
 *    only BF16 / FP8 experts, a keep rule beyond the model refused by
 *    es_convert_check.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "es_convert.h"
#include "st_calib.h"
#include "st_config.h"
#include "st_safetensors.h"
#include "st_util.h"
#include "store_testlib.h"
#include "test_util.h"

static char g_mixtral[4096];

/* tiny-mixtral: 4 layers, 8 experts, hidden 64, expert width 128 */
enum { TL = 4, TE = 8, TH = 64, TI = 128 };

static uint64_t model_id(void)
{
	struct st_checkpoint *ck = NULL;
	struct st_diag d = { { 0 } };
	char path[4200], *cfg = NULL;
	size_t len = 0;
	uint64_t id;

	snprintf(path, sizeof(path), "%s/config.json", g_mixtral);
	assert_int_equal(st_read_file(path, &cfg, &len), 0);
	assert_int_equal(st_checkpoint_open(g_mixtral, &ck, &d), 0);
	id = st_calib_model_id(ck, cfg, len);
	st_checkpoint_close(ck);
	free(cfg);
	return id;
}

/* Statistics with skewed channel weights: channel c of every expert gets
 * (1 + (c % 5 == 0) * 1000) scaled per (layer, expert); expert 3 of layer
 * 1 sees only `few` tokens. */
static void make_stats(struct st_calib *c, uint64_t id, uint64_t few)
{
	float x[TH], a[TI];

	assert_int_equal(st_calib_init(c, TL, TE, TH, TI), 0);
	c->model_id = id;
	c->text_xxh3 = 0x1234abcdULL;
	for (int l = 0; l < TL; l++)
		for (int e = 0; e < TE; e++) {
			uint64_t n = l == 1 && e == 3 ? few : 40;

			for (int i = 0; i < TH; i++)
				x[i] = (float)((i % 5 == 0 ? 30.0 : 1.0) *
					       (1 + l + e * 0.25));
			for (int i = 0; i < TI; i++)
				a[i] = (float)(i % 7 == 0 ? 20.0 : 0.5);
			for (uint64_t t = 0; t < n; t++)
				assert_int_equal(st_calib_add(c, l, e, x, a), 0);
			c->n_tokens += n;
		}
	c->n_windows = 3;
}

static void roundtrip(void **state)
{
	char tmp[4096], path[4200], bad[4200];
	struct st_calib c, r;
	struct st_diag d = { { 0 } };
	uint64_t h = 0;
	float w[TI];
	uint8_t *buf;
	size_t len;

	(void)state;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(path, sizeof(path), "%s/s.calib", tmp);
	snprintf(bad, sizeof(bad), "%s/bad.calib", tmp);
	make_stats(&c, 77, 5);
	assert_int_equal(st_calib_add(&c, TL, 0, w, w), -EINVAL);
	assert_int_equal(st_calib_write(&c, path, &d), 0);
	assert_int_equal(st_calib_read(path, &r, &h, &d), 0);
	buf = tst_read(path, &len);
	assert_true(h == st_xxh3(buf, len));
	assert_int_equal(r.n_layers, TL);
	assert_int_equal(r.n_experts, TE);
	assert_int_equal(r.hidden, TH);
	assert_int_equal(r.inter, TI);
	assert_true(r.model_id == 77 && r.text_xxh3 == 0x1234abcdULL &&
		    r.n_tokens == c.n_tokens && r.n_windows == 3);
	assert_memory_equal(r.count, c.count, sizeof(uint64_t) * TL * TE);
	assert_memory_equal(r.sum_x2, c.sum_x2, sizeof(double) * TL * TE * TH);
	assert_memory_equal(r.sum_a2, c.sum_a2, sizeof(double) * TL * TE * TI);
	/* means: x = 30 * (1 + 2 + 0.5) on channel 0 of (2, 2) */
	assert_int_equal(st_calib_weights(&r, 2, 2, 0, 32, w), 1);
	assert_float_equal(w[0], 30.0 * 3.5 * 30.0 * 3.5, 1e-2);
	assert_float_equal(w[1], 3.5 * 3.5, 1e-5);
	assert_int_equal(st_calib_weights(&r, 2, 2, 2, 32, w), 1);
	assert_float_equal(w[0], 400.0, 1e-4);
	assert_float_equal(w[1], 0.25, 1e-7);
	/* expert (1, 3) saw 5 tokens: below 32 it falls back */
	assert_int_equal(st_calib_weights(&r, 1, 3, 0, 32, w), 0);
	assert_int_equal(st_calib_weights(&r, 1, 3, 0, 5, w), 1);
	assert_int_equal(st_calib_weights(&r, 0, TE, 0, 1, w), -EINVAL);
	st_calib_free(&r);

	/* corruptions */
	tst_write(bad, buf, len);
	tst_flip_byte(bad, 64 + 8 * 5);
	assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ST_E_CHECKSUM);
	assert_non_null(strstr(d.msg, "checksum"));
	tst_write(bad, buf, len - 100);
	assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "truncated"));
	tst_write(bad, buf, len);
	tst_flip_byte(bad, 0);
	assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ST_E_FORMAT);
	assert_non_null(strstr(d.msg, "not a calibration statistics file"));
	{
		/* version 2, checksum made right: still refused */
		uint8_t *v = malloc(len);
		uint32_t two = 2;
		uint64_t sum;

		memcpy(v, buf, len);
		memcpy(v + 8, &two, 4);
		sum = st_xxh3(v, len - 8);
		memcpy(v + len - 8, &sum, 8);
		tst_write(bad, v, len);
		assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ST_E_FORMAT);
		assert_non_null(strstr(d.msg, "version 2"));
		free(v);
	}
	/* a negative sum (checksum right) */
	c.sum_a2[10] = -1.0;
	assert_int_equal(st_calib_write(&c, bad, &d), 0);
	assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ST_E_FORMAT);
	snprintf(bad, sizeof(bad), "%s/none.calib", tmp);
	assert_int_equal(st_calib_read(bad, &r, NULL, &d), -ENOENT);
	st_calib_free(&c);
	free(buf);
	st_rm_rf(tmp);
}

static int convert(const char *out, const char *fmt, const char *ss,
		   const char *stats, struct st_diag *d)
{
	struct es_convert_opts o;

	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts(fmt, &o, d), 0);
	if (ss)
		assert_int_equal(es_convert_parse_scale_search(ss, &o, d), 0);
	o.calib_path = stats;
	return es_convert(g_mixtral, out, &o, d);
}

static json_t *load_manifest(const char *dir)
{
	char path[4400];
	json_t *m;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	m = json_load_file(path, 0, NULL);
	assert_non_null(m);
	return m;
}

static void calibrated_store(void **state)
{
	char tmp[4096], stats[4200], a[4200], b[4200], mse[4200], x[4200];
	char other[4200], hex[17];
	struct st_calib c;
	struct st_diag d = { { 0 } };
	json_t *m, *pol, *cal, *layers;
	uint8_t *buf, *p, *q;
	size_t len, np, nq;
	uint64_t id = model_id();

	(void)state;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(stats, sizeof(stats), "%s/s.calib", tmp);
	snprintf(other, sizeof(other), "%s/other.calib", tmp);
	snprintf(a, sizeof(a), "%s/cal-a", tmp);
	snprintf(b, sizeof(b), "%s/cal-b", tmp);
	snprintf(mse, sizeof(mse), "%s/mse", tmp);
	snprintf(x, sizeof(x), "%s/x", tmp);
	make_stats(&c, id, 5);
	assert_int_equal(st_calib_write(&c, stats, &d), 0);

	assert_int_equal(convert(a, "nvfp4", "calibrated", stats, &d), 0);
	assert_int_equal(convert(b, "nvfp4", "calibrated", stats, &d), 0);
	assert_int_equal(convert(mse, "nvfp4", "mse", NULL, &d), 0);
	assert_int_equal(tst_dirs_differ(a, b), 0);
	m = load_manifest(a);
	pol = json_object_get(json_object_get(m, "experts"), "policy");
	assert_string_equal(json_string_value(json_object_get(pol,
		"scale_search")), "calibrated");
	cal = json_object_get(pol, "calibration");
	assert_non_null(cal);
	buf = tst_read(stats, &len);
	snprintf(hex, sizeof(hex), "%016llx",
		 (unsigned long long)st_xxh3(buf, len));
	free(buf);
	assert_string_equal(json_string_value(json_object_get(cal,
		"stats_xxh3")), hex);
	snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)id);
	assert_string_equal(json_string_value(json_object_get(cal,
		"model_id")), hex);
	assert_string_equal(json_string_value(json_object_get(cal,
		"text_xxh3")), "000000001234abcd");
	assert_int_equal(json_integer_value(json_object_get(cal, "tokens")),
			 c.n_tokens);
	assert_int_equal(json_integer_value(json_object_get(cal, "min_tokens")),
			 ST_CALIB_MIN_TOKENS);
	assert_int_equal(json_integer_value(json_object_get(cal,
		"fallback_experts")), 1);
	layers = json_object_get(json_object_get(m, "experts"), "layers");
	assert_int_equal(json_array_size(layers), TL);
	for (size_t l = 0; l < TL; l++)
		for (size_t k = 0; k < 3; k++) {
			json_t *mat = json_array_get(json_object_get(
				json_array_get(layers, l), "matrices"), k);

			assert_string_equal(json_string_value(json_object_get(
				mat, "scale_search")), "calibrated");
			assert_non_null(strstr(json_string_value(
				json_object_get(mat, "rounding")),
				"activation-weighted"));
		}
	json_decref(m);
	/* skewed weights move some scales away from the unweighted choice;
	 * the expert that fell back (layer 1, expert 3) equals the mse one */
	snprintf(a + strlen(a), sizeof(a) - strlen(a), "/experts-001.bin");
	snprintf(mse + strlen(mse), sizeof(mse) - strlen(mse),
		 "/experts-001.bin");
	p = tst_read(a, &np);
	q = tst_read(mse, &nq);
	assert_int_equal(np, nq);
	assert_true(memcmp(p, q, np) != 0);
	assert_memory_equal(p + 3 * (np / TE), q + 3 * (nq / TE), np / TE);
	assert_true(memcmp(p + 2 * (np / TE), q + 2 * (nq / TE), np / TE) != 0);
	free(p);
	free(q);

	/* refusals, nothing written */
	c.model_id = id + 1;
	assert_int_equal(st_calib_write(&c, other, &d), 0);
	assert_int_equal(convert(x, "nvfp4", "calibrated", other, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "another model"));
	st_calib_free(&c);
	assert_int_equal(st_calib_init(&c, TL, TE, TH, TI + 2), 0);
	c.model_id = id;
	assert_int_equal(st_calib_write(&c, other, &d), 0);
	assert_int_equal(convert(x, "nvfp4", "calibrated", other, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "run strata calibrate"));
	st_calib_free(&c);
	tst_flip_byte(stats, 100);
	assert_int_equal(convert(x, "nvfp4", "calibrated", stats, &d),
			 -ST_E_CHECKSUM);
	assert_int_equal(convert(x, "nvfp4", "calibrated", NULL, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "--calibrate"));
	assert_int_equal(convert(x, "nvfp4", "mse", stats, &d), -EINVAL);
	assert_int_equal(tst_count_prefix(tmp, "x"), 0);
	st_rm_rf(tmp);
}

static void option_errors(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char tmp[4096], out[4200];

	(void)state;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(out, sizeof(out), "%s/x", tmp);
	/* a layer named twice with different formats, in one spec or in
	 * two --keep-layers (appended): the later wins, and the override is
	 * reported (strata convert prints it) */
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("0-2=fp8;2=bf16", &o, &d), 2);
	assert_int_equal(es_convert_keep_overrides(&o, -1, &d), 1);
	assert_non_null(strstr(d.msg, "layer 2 is named twice, 0-2=fp8 and "
			       "then 2=bf16: the later rule wins (bf16)"));
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("last=fp8", &o, &d), 1);
	assert_int_equal(es_convert_parse_keep("last=bf16", &o, &d), 1);
	assert_int_equal(es_convert_keep_overrides(&o, -1, &d), 1);
	assert_non_null(strstr(d.msg, "the last layer is named twice"));
	/* the same format twice: nothing to report */
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("3=fp8", &o, &d), 1);
	assert_int_equal(es_convert_parse_keep("last=fp8;0-3=fp8", &o, &d), 2);
	assert_int_equal(es_convert_keep_overrides(&o, TL, &d), 0);
	assert_int_equal(es_convert_check(g_mixtral, &o, &d), 0);
	/* first and 0 are the same layer: known only against the model */
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("first=fp8;0=bf16", &o, &d), 2);
	assert_int_equal(es_convert_keep_overrides(&o, -1, &d), 0);
	assert_int_equal(es_convert_keep_overrides(&o, TL, &d), 1);
	assert_non_null(strstr(d.msg, "layer 0 is named twice"));
	/* a layer beyond the model: refused by the check */
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_keep("4=fp8", &o, &d), 1);
	assert_int_equal(es_convert_check(g_mixtral, &o, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "4 layers"));
	/* a scale search where no layer has a 4-bit format */
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts("fp8", &o, &d), 0);
	assert_int_equal(es_convert_parse_scale_search("mse", &o, &d), 0);
	assert_int_equal(es_convert_check(g_mixtral, &o, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "changes nothing"));
	assert_int_equal(es_convert_parse_experts("bf16", &o, &d), 0);
	assert_int_equal(es_convert_check(g_mixtral, &o, &d), -EINVAL);
	/* ... but one 4-bit layer is enough */
	assert_int_equal(es_convert_parse_keep("1=mxfp4", &o, &d), 1);
	assert_int_equal(es_convert_check(g_mixtral, &o, &d), 0);
	assert_int_equal(tst_count_prefix(tmp, "x"), 0);
	st_rm_rf(tmp);
}

/* --attention f32 writes q/k/v/o in F32 and the rest as before (BF16
 * for this BF16 checkpoint), recorded in the policy; fp8 and unknown
 * names are refused; --shared-experts is refused for a model without
 * shared experts; the default records "bf16" and "none". */
static void tensor_kinds(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };
	char tmp[4096], out[4200], def[4200];
	json_t *m, *tensors, *pol;
	int n_attn = 0, n_other = 0;

	(void)state;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(out, sizeof(out), "%s/att", tmp);
	snprintf(def, sizeof(def), "%s/def", tmp);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_attention("fp8-64", &o, &d),
			 -ST_E_UNSUPPORTED);
	assert_non_null(strstr(d.msg, "use fp8"));
	assert_int_equal(es_convert_parse_attention("fp8", &o, &d), 0);
	assert_int_equal(o.dense_fp8, ES_DENSE_FP8_ATTENTION);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_attention("f16", &o, &d), -EINVAL);
	assert_int_equal(o.attention_dtype, ST_DTYPE_COUNT);
	assert_int_equal(es_convert_parse_shared_experts("fp8", &o, &d), 0);
	assert_int_equal(es_convert(g_mixtral, out, &o, &d), -ST_E_UNSUPPORTED);
	assert_non_null(strstr(d.msg, "no shared experts"));
	assert_int_equal(tst_count_prefix(tmp, "att"), 0);
	es_convert_opts_init(&o);
	assert_int_equal(es_convert(g_mixtral, def, &o, &d), 0);
	assert_int_equal(es_convert_parse_attention("f32", &o, &d), 0);
	assert_int_equal(es_convert(g_mixtral, out, &o, &d), 0);
	m = load_manifest(out);
	pol = json_object_get(json_object_get(m, "experts"), "policy");
	assert_string_equal(json_string_value(json_object_get(pol,
		"attention")), "f32");
	assert_string_equal(json_string_value(json_object_get(pol,
		"shared_experts")), "none (the model has none)");
	tensors = json_object_get(json_object_get(m, "dense"), "tensors");
	for (size_t i = 0; i < json_array_size(tensors); i++) {
		json_t *t = json_array_get(tensors, i);
		const char *name = json_string_value(json_object_get(t, "name"));
		const char *dt = json_string_value(json_object_get(t, "dtype"));
		int attn = strstr(name, "self_attn.") &&
			   strstr(name, "_proj.weight");

		assert_string_equal(dt, attn ? "F32" : "BF16");
		if (attn)
			n_attn++;
		else
			n_other++;
	}
	assert_int_equal(n_attn, 4 * TL);
	assert_true(n_other > 0);
	json_decref(m);
	m = load_manifest(def);
	pol = json_object_get(json_object_get(m, "experts"), "policy");
	assert_string_equal(json_string_value(json_object_get(pol,
		"attention")), "bf16");
	json_decref(m);
	/* --attention fp8: q/k/v/o as E4M3 codes plus their .scale, the LM
	 * head and everything else as before, policy "fp8" */
	{
		char out8[4200];
		int n_fp8 = 0, n_scale = 0;

		snprintf(out8, sizeof(out8), "%s/att8", tmp);
		es_convert_opts_init(&o);
		assert_int_equal(es_convert_parse_attention("fp8", &o, &d), 0);
		assert_int_equal(es_convert(g_mixtral, out8, &o, &d), 0);
		m = load_manifest(out8);
		pol = json_object_get(json_object_get(m, "experts"), "policy");
		assert_string_equal(json_string_value(json_object_get(pol,
			"attention")), "fp8");
		tensors = json_object_get(json_object_get(m, "dense"),
					  "tensors");
		for (size_t i = 0; i < json_array_size(tensors); i++) {
			json_t *t = json_array_get(tensors, i);
			const char *name = json_string_value(
				json_object_get(t, "name"));
			const char *dt = json_string_value(
				json_object_get(t, "dtype"));
			int attn = strstr(name, "self_attn.") &&
				   strstr(name, "_proj.weight");

			if (attn && strstr(name, ".scale"))
				n_scale++;
			else if (attn)
				assert_string_equal(dt, "F8_E4M3");
			else
				assert_string_equal(dt, "BF16");
			n_fp8 += attn && !strstr(name, ".scale");
		}
		assert_int_equal(n_fp8, 4 * TL);
		assert_int_equal(n_scale, 4 * TL);
		json_decref(m);
	}
	/* the expert files are the same: only dense.bin changed */
	{
		char f1[4400], f2[4400];
		uint8_t *x, *y;
		size_t nx, ny;

		snprintf(f1, sizeof(f1), "%s/experts-000.bin", out);
		snprintf(f2, sizeof(f2), "%s/experts-000.bin", def);
		x = tst_read(f1, &nx);
		y = tst_read(f2, &ny);
		assert_true(nx == ny && !memcmp(x, y, nx));
		free(x);
		free(y);
	}
	st_rm_rf(tmp);
}

/* Full second moments (strata calibrate --covariance): round trip and
 * E[x x^T] computed here; GPTQ stores are reproducible, recorded, differ
 * from the calibrated search's; diagonal-only statistics are refused for
 * GPTQ. */
static void gptq_store(void **state)
{
	char tmp[4096], stats[4200], diag_only[4200], a[4200], b[4200];
	char cal[4200], x[4200];
	struct st_calib c, r;
	struct st_diag d = { { 0 } };
	float xv[TH], av[TI];
	double *m2 = malloc(sizeof(double) * TI * TI);
	uint64_t id = model_id();
	json_t *m, *pol;

	(void)state;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(stats, sizeof(stats), "%s/full.calib", tmp);
	snprintf(diag_only, sizeof(diag_only), "%s/diag.calib", tmp);
	snprintf(a, sizeof(a), "%s/g-a", tmp);
	snprintf(b, sizeof(b), "%s/g-b", tmp);
	snprintf(cal, sizeof(cal), "%s/cal", tmp);
	snprintf(x, sizeof(x), "%s/x", tmp);
	assert_int_equal(st_calib_init_full(&c, TL, TE, TH, TI, 1), 0);
	c.model_id = id;
	/* 40 tokens per expert: x_i = sin(i * t + e), a_i = cos(i + t) */
	for (int l = 0; l < TL; l++)
		for (int e = 0; e < TE; e++)
			for (int t = 0; t < 40; t++) {
				for (int i = 0; i < TH; i++)
					xv[i] = (float)sin(0.1 * i * t + e + l);
				for (int i = 0; i < TI; i++)
					av[i] = (float)cos(0.05 * i + t);
				assert_int_equal(st_calib_add(&c, l, e, xv, av), 0);
				c.n_tokens++;
			}
	assert_int_equal(st_calib_write(&c, stats, &d), 0);
	assert_int_equal(st_calib_read(stats, &r, NULL, &d), 0);
	assert_non_null(r.sum_xx);
	assert_int_equal(st_calib_second_moment(&r, 2, 5, 2, 32, m2), 1);
	{
		/* E[a_3 a_7] over t = 0..39, computed here */
		double s = 0;

		for (int t = 0; t < 40; t++)
			s += (double)(float)cos(0.05 * 3 + t) *
			     (double)(float)cos(0.05 * 7 + t);
		assert_float_equal(m2[3 * TI + 7], s / 40, 1e-12);
		assert_true(m2[3 * TI + 7] == m2[7 * TI + 3]);
	}
	assert_int_equal(st_calib_second_moment(&c, 2, 5, 2, 32, m2), 1);
	assert_float_equal(m2[7 * TI + 3], m2[3 * TI + 7], 1e-15);
	assert_int_equal(st_calib_second_moment(&r, 2, 5, 0, 41, m2), 0);
	st_calib_free(&r);
	/* GPTQ: reproducible, recorded, not the calibrated search's bytes */
	assert_int_equal(convert(a, "e2m1-g32", "gptq", stats, &d), 0);
	assert_int_equal(convert(b, "e2m1-g32", "gptq", stats, &d), 0);
	assert_int_equal(convert(cal, "e2m1-g32", "calibrated", stats, &d), 0);
	assert_int_equal(tst_dirs_differ(a, b), 0);
	assert_true(tst_dirs_differ(a, cal) != 0);
	m = load_manifest(a);
	pol = json_object_get(json_object_get(m, "experts"), "policy");
	assert_string_equal(json_string_value(json_object_get(pol,
		"scale_search")), "gptq");
	assert_non_null(json_object_get(pol, "calibration"));
	json_decref(m);
	/* statistics without the matrices: refused for GPTQ */
	st_calib_free(&c);
	make_stats(&c, id, 40);
	assert_int_equal(st_calib_write(&c, diag_only, &d), 0);
	assert_int_equal(convert(x, "e2m1-g32", "gptq", diag_only, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "--covariance"));
	assert_int_equal(tst_count_prefix(tmp, "x"), 0);
	st_calib_free(&c);
	free(m2);
	st_rm_rf(tmp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(roundtrip),
		cmocka_unit_test(calibrated_store),
		cmocka_unit_test(option_errors),
		cmocka_unit_test(tensor_kinds),
		cmocka_unit_test(gptq_store),
	};

	st_test_fixture_model("tiny-mixtral", g_mixtral, sizeof(g_mixtral));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
