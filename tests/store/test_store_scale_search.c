/*
 * test_store_scale_search.c — es_convert with scale_search = MSE on the
 * tiny fixtures: converting twice gives byte-identical stores, the manifest
 * records "scale_search" per matrix and in experts.policy ("none" by
 * default), the searched experts differ from the plain ones (the search
 * changes some blocks), dense.bin is unchanged, and the option parser
 * takes "none" / "mse" only.
 */
#include <errno.h>
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <jansson.h>

#include "es_convert.h"
#include "st_util.h"
#include "store_testlib.h"
#include "test_util.h"

static char g_mixtral[4096];

static void convert(const char *out, const char *fmt, const char *ss)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };

	es_convert_opts_init(&o);
	assert_int_equal(es_convert_parse_experts(fmt, &o, &d), 0);
	if (ss)
		assert_int_equal(es_convert_parse_scale_search(ss, &o, &d), 0);
	assert_int_equal(es_convert(g_mixtral, out, &o, &d), 0);
}

/* The policy says `want`; every matrix of every layer says `mat_want`
 * (FP8 matrices keep plain scales even when the policy asks for a search:
 * expertd/convert/es_convert_opts.c, es_cv_effective_search). */
static void check_manifest(const char *dir, const char *want,
			   const char *mat_want)
{
	char path[4200];
	json_t *root, *ex, *layers;
	json_error_t err;
	size_t i;

	snprintf(path, sizeof(path), "%s/manifest.json", dir);
	root = json_load_file(path, 0, &err);
	assert_non_null(root);
	ex = json_object_get(root, "experts");
	assert_string_equal(json_string_value(json_object_get(
		json_object_get(ex, "policy"), "scale_search")), want);
	layers = json_object_get(ex, "layers");
	assert_true(json_array_size(layers) > 0);
	for (i = 0; i < json_array_size(layers); i++) {
		json_t *mats = json_object_get(json_array_get(layers, i),
					       "matrices");

		assert_int_equal(json_array_size(mats), 3);
		for (size_t m = 0; m < 3; m++)
			assert_string_equal(json_string_value(json_object_get(
				json_array_get(mats, m), "scale_search")), mat_want);
	}
	json_decref(root);
}

static void one_format(const char *fmt)
{
	const int searched = strcmp(fmt, "fp8") != 0;
	char tmp[4096], a[4200], b[4200], p[4200], f1[4300], f2[4300];
	uint8_t *x, *y;
	size_t nx, ny;

	st_test_tmpdir(tmp, sizeof(tmp));
	if (!searched) {
		/* FP8 keeps its plain scales: asking for a search with only
		 * FP8 experts changes nothing and is refused */
		struct es_convert_opts o;
		struct st_diag d = { { 0 } };

		snprintf(a, sizeof(a), "%s/mse-a", tmp);
		es_convert_opts_init(&o);
		assert_int_equal(es_convert_parse_experts(fmt, &o, &d), 0);
		assert_int_equal(es_convert_parse_scale_search("mse", &o, &d), 0);
		assert_int_equal(es_convert(g_mixtral, a, &o, &d), -EINVAL);
		assert_non_null(strstr(d.msg, "changes nothing"));
		assert_int_equal(tst_count_prefix(tmp, "mse"), 0);
		st_rm_rf(tmp);
		return;
	}
	snprintf(a, sizeof(a), "%s/mse-a", tmp);
	snprintf(b, sizeof(b), "%s/mse-b", tmp);
	snprintf(p, sizeof(p), "%s/plain", tmp);
	convert(a, fmt, "mse");
	convert(b, fmt, "mse");
	convert(p, fmt, NULL);
	assert_int_equal(tst_dirs_differ(a, b), 0);
	check_manifest(a, "mse", searched ? "mse" : "none");
	check_manifest(p, "none", "none");
	/* dense tensors are not touched by the search */
	snprintf(f1, sizeof(f1), "%s/dense.bin", a);
	snprintf(f2, sizeof(f2), "%s/dense.bin", p);
	x = tst_read(f1, &nx);
	y = tst_read(f2, &ny);
	assert_true(nx == ny && !memcmp(x, y, nx));
	free(x);
	free(y);
	/* the experts of layer 0 differ (same size); FP8 ones do not */
	snprintf(f1, sizeof(f1), "%s/experts-000.bin", a);
	snprintf(f2, sizeof(f2), "%s/experts-000.bin", p);
	x = tst_read(f1, &nx);
	y = tst_read(f2, &ny);
	assert_int_equal(nx, ny);
	assert_true((memcmp(x, y, nx) != 0) == searched);
	free(x);
	free(y);
	st_rm_rf(tmp);
}

static void formats(void **state)
{
	(void)state;
	one_format("mxfp4");
	one_format("nvfp4");
	one_format("e2m1-g32");
	one_format("fp8");
}

static void parser(void **state)
{
	struct es_convert_opts o;
	struct st_diag d = { { 0 } };

	(void)state;
	es_convert_opts_init(&o);
	assert_int_equal(o.scale_search, ST_SCALE_SEARCH_NONE);
	assert_int_equal(es_convert_parse_scale_search("mse", &o, &d), 0);
	assert_int_equal(o.scale_search, ST_SCALE_SEARCH_MSE);
	assert_int_equal(es_convert_parse_scale_search("grid", &o, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "none, mse, calibrated or gptq"));
	assert_int_equal(o.scale_search, ST_SCALE_SEARCH_MSE);
	assert_int_equal(es_convert_parse_scale_search("none", &o, &d), 0);
	assert_int_equal(o.scale_search, ST_SCALE_SEARCH_NONE);
	/* an out-of-range value set directly is refused before writing */
	{
		char tmp[4096], out[4200];

		st_test_tmpdir(tmp, sizeof(tmp));
		snprintf(out, sizeof(out), "%s/bad", tmp);
		o.scale_search = (enum st_scale_search)7;
		assert_int_equal(es_convert(g_mixtral, out, &o, &d), -EINVAL);
		assert_int_equal(tst_count_prefix(tmp, "bad"), 0);
		st_rm_rf(tmp);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(parser),
		cmocka_unit_test(formats),
	};

	st_test_fixture_model("tiny-mixtral", g_mixtral, sizeof(g_mixtral));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
