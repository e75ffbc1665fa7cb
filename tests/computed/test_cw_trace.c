/*
 * test_cw_trace.c — routing traces in computed: a trace is read (weights
 * optional, other keys ignored, positions sparse), forcing replaces a
 * choice only where the trace has one and wraps past its end, the recorder
 * writes lines the reader reads back identically, and every malformed line
 * is refused with its line number.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cw_trace.h"

static char path[64];

static void write_file(const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_force_and_wrap(void **state)
{
	struct cw_trace *t;
	struct st_diag d = { "" };
	int e[2] = { 7, 8 };
	float w[2] = { 0.9f, 0.1f };

	write_file("{\"pos\": 0, \"layer\": 0, \"id\": 5, \"experts\": [3, 9], "
		   "\"weights\": [0.6, 0.4], \"gap\": 0.1}\n"
		   "{\"pos\": 0, \"layer\": 1, \"experts\": [2, 0]}\n"
		   "\n"
		   "{\"pos\": 2, \"layer\": 1, \"experts\": [15, 14], "
		   "\"weights\": [0.5, 0.5]}\n");
	assert_int_equal(cw_trace_load(path, 2, 16, 2, &t, &d), 0);
	assert_int_equal(cw_trace_positions(t), 3);
	assert_int_equal(cw_trace_force(t, 0, 0, e, w, 2), 1);
	assert_int_equal(e[0], 3);
	assert_int_equal(e[1], 9);
	assert_true(fabsf(w[0] - 0.6f) < 1e-6f);
	/* no weights: 1/k each */
	assert_int_equal(cw_trace_force(t, 1, 0, e, w, 2), 1);
	assert_int_equal(e[0], 2);
	assert_true(fabsf(w[1] - 0.5f) < 1e-6f);
	/* no entry for (1, layer 0): untouched */
	e[0] = 7;
	assert_int_equal(cw_trace_force(t, 0, 1, e, w, 2), 0);
	assert_int_equal(e[0], 7);
	/* position 5 wraps to 5 mod 3 = 2 */
	assert_int_equal(cw_trace_force(t, 1, 5, e, w, 2), 1);
	assert_int_equal(e[0], 15);
	/* another top-k: never forced */
	assert_int_equal(cw_trace_force(t, 1, 2, e, w, 3), 0);
	cw_trace_free(t);
}

static void test_record_round_trip(void **state)
{
	struct cw_trace *t;
	struct st_diag d = { "" };
	const int ex[3] = { 4, 1, 7 };
	const float wt[3] = { 0.5f, 0.3f, 0.2f };
	int e[3];
	float w[3];
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	cw_trace_record(f, 3, 41, ex, wt, 3);
	fclose(f);
	assert_int_equal(cw_trace_load(path, 4, 8, 3, &t, &d), 0);
	assert_int_equal(cw_trace_force(t, 3, 41, e, w, 3), 1);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(e[i], ex[i]);
		assert_true(fabsf(w[i] - wt[i]) < 1e-6f);
	}
	cw_trace_free(t);
}

static void expect_bad(const char *text, const char *what)
{
	struct cw_trace *t = NULL;
	struct st_diag d = { "" };

	write_file(text);
	assert_int_equal(cw_trace_load(path, 2, 16, 2, &t, &d), -ST_E_FORMAT);
	assert_null(t);
	if (!strstr(d.msg, what))
		fprintf(stderr, "message '%s' lacks '%s'\n", d.msg, what);
	assert_non_null(strstr(d.msg, what));
}

static void test_malformed(void **state)
{
	struct cw_trace *t = NULL;
	struct st_diag d = { "" };

	expect_bad("{\"pos\": 0, \"layer\": 0, \"experts\": [1, 2]}\nnot json\n",
		   ":2:");
	expect_bad("{\"pos\": 0, \"layer\": 2, \"experts\": [1, 2]}\n", ":1:");
	expect_bad("{\"pos\": 0, \"layer\": 0, \"experts\": [1, 2, 3]}\n",
		   "[2 ids]");
	expect_bad("{\"pos\": 0, \"layer\": 0, \"experts\": [1, 16]}\n",
		   "out of [0, 16)");
	expect_bad("{\"pos\": 0, \"layer\": 0, \"experts\": [4, 4]}\n",
		   "twice");
	expect_bad("{\"pos\": -1, \"layer\": 0, \"experts\": [1, 2]}\n", ":1:");
	expect_bad("{\"pos\": 0, \"layer\": 0, \"experts\": [1, 2], "
		   "\"weights\": [1]}\n", ":1:");
	expect_bad("\n", "no entries");
	assert_true(cw_trace_load("/nonexistent/trace.jsonl", 2, 16, 2, &t,
				  &d) < 0);
	assert_non_null(strstr(d.msg, "/nonexistent/trace.jsonl"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_force_and_wrap),
		cmocka_unit_test(test_record_round_trip),
		cmocka_unit_test(test_malformed),
	};
	int fd, r;

	snprintf(path, sizeof(path), "/tmp/cw-trace-XXXXXX");
	fd = mkstemp(path);
	if (fd < 0)
		return 1;
	close(fd);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	unlink(path);
	return r;
}
