/*
 * test_replay_cli.c — `strata replay` end to end on the kjv-moe fixture's
 * routing trace: the JSON it prints holds Belady and every policy for each
 * split and pool size, accesses = tokens x layers x top-k from the
 * fixture's README, Belady's loads the fewest; and a file in no known
 * format fails with exit 1 and a message naming the file and line; the
 * --draft rows (ACCEPT 1 equals future-LEN per layer).
 * Skips (77) when ../shared is absent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "st_util.h"
#include "test_util.h"

static char model_dir[4096], tmp[4096];

static int run(const char *args, const char *out, const char *err)
{
	char cmd[32768];
	int st;

	snprintf(cmd, sizeof(cmd), "'%s/cli/strata' replay %s >'%s' 2>'%s'",
		 st_test_build_dir(), args, out, err);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_json(void **state)
{
	char args[8192], out[4200], err[4200];
	json_error_t je;
	json_t *root, *res, *r;
	size_t i;
	int n_belady = 0, n_rows = 0;
	long long bel_loads[4] = { 0 };

	snprintf(out, sizeof(out), "%s/out.json", tmp);
	snprintf(err, sizeof(err), "%s/err.txt", tmp);
	snprintf(args, sizeof(args), "'%s/routing-valid-small.jsonl' "
		 "--slots 12,24 --policy lru,hist,la-lru --json", model_dir);
	assert_int_equal(run(args, out, err), 0);
	root = json_load_file(out, 0, &je);
	assert_non_null(root);
	assert_int_equal(json_integer_value(json_object_get(root, "tokens")),
			 2932);
	res = json_object_get(root, "results");
	/* 2 splits x 2 sizes x (belady + 3 policies) */
	assert_int_equal(json_array_size(res), 16);
	json_array_foreach(res, i, r) {
		const char *pol = json_string_value(json_object_get(r, "policy"));
		long long loads = json_integer_value(json_object_get(r, "loads"));
		int cell = (int)(i / 4);

		assert_int_equal(json_integer_value(json_object_get(r,
				 "accesses")), 2932 * 6 * 2);
		if (!strcmp(pol, "belady")) {
			n_belady++;
			bel_loads[cell] = loads;
			assert_true(json_real_value(json_object_get(r,
				    "ratio_to_belady")) == 1.0);
		} else {
			n_rows++;
			assert_true(loads >= bel_loads[cell]);
			assert_true(json_real_value(json_object_get(r,
				    "ratio_to_belady")) >= 1.0);
		}
	}
	assert_int_equal(n_belady, 4);
	assert_int_equal(n_rows, 12);
	/* a larger pool never makes Belady load more */
	assert_true(bel_loads[1] <= bel_loads[0]);
	assert_true(bel_loads[3] <= bel_loads[2]);
	json_decref(root);
}

/* --draft rows: per layer, drafts of 1 token all accepted, one at every
 * token, load exactly as future-1; the JSON carries the draft's figures;
 * a bad --draft is refused with exit 2. */
static void test_draft(void **state)
{
	char args[8192], out[4200], err[4200];
	json_error_t je;
	json_t *root, *res;
	long long fut = -1, drf = -1, events = -1, accepted = -1;

	snprintf(out, sizeof(out), "%s/draft.json", tmp);
	snprintf(err, sizeof(err), "%s/err.txt", tmp);
	snprintf(args, sizeof(args), "'%s/routing-valid-small.jsonl' "
		 "--slots 24 --split per-layer --policy hist --future 1 "
		 "--draft 1:1 --draft-schedule token --json", model_dir);
	assert_int_equal(run(args, out, err), 0);
	root = json_load_file(out, 0, &je);
	assert_non_null(root);
	res = json_object_get(root, "results");
	for (size_t i = 0; i < json_array_size(res); i++) {
		json_t *r = json_array_get(res, i);
		const char *p = json_string_value(json_object_get(r, "policy"));
		long long loads = json_integer_value(json_object_get(r,
								     "loads"));

		if (!strcmp(p, "future-1"))
			fut = loads;
		if (!strcmp(p, "draft-hist-1@1.00")) {
			drf = loads;
			events = json_integer_value(json_object_get(r,
				"draft_events"));
			accepted = json_integer_value(json_object_get(r,
				"draft_accepted"));
		}
	}
	assert_true(fut > 0);
	assert_int_equal(drf, fut);
	/* a draft at every token of the stream, all accepted but where the
	 * next token is past the trace's end */
	assert_int_equal(events, json_integer_value(json_object_get(root,
								    "tokens")));
	assert_int_equal(accepted, events - 1);
	json_decref(root);
	snprintf(args, sizeof(args), "'%s/routing-valid-small.jsonl' "
		 "--draft 2:1.5", model_dir);
	assert_int_equal(run(args, out, err), 2);
}

static void test_errors(void **state)
{
	char args[8192], out[4200], err[4200], bad[4200], *text = NULL;
	size_t len;

	snprintf(out, sizeof(out), "%s/out.txt", tmp);
	snprintf(err, sizeof(err), "%s/err.txt", tmp);
	snprintf(bad, sizeof(bad), "%s/notes.txt", tmp);
	assert_int_equal(st_write_file(bad, "not a trace\n", 12), 0);
	snprintf(args, sizeof(args), "'%s'", bad);
	assert_int_equal(run(args, out, err), 1);
	assert_int_equal(st_read_file(err, &text, &len), 0);
	assert_non_null(strstr(text, "notes.txt:1: unknown trace format"));
	free(text);
	/* a pool smaller than the top-k: the smallest size that works */
	snprintf(args, sizeof(args), "'%s/routing-valid-small.jsonl' "
		 "--slots 6 --split per-layer --policy lru", model_dir);
	assert_int_equal(run(args, out, err), 1);
	assert_int_equal(st_read_file(err, &text, &len), 0);
	assert_non_null(strstr(text, "use at least 12 slots"));
	free(text);
	assert_int_equal(run("--policy nope x", out, err), 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_draft),
		cmocka_unit_test(test_errors),
	};
	int r;

	st_test_fixture_model("kjv-moe", model_dir, sizeof(model_dir));
	st_test_tmpdir(tmp, sizeof(tmp));
	r = cmocka_run_group_tests(tests, NULL, NULL);
	st_rm_rf(tmp);
	return r;
}
