/*
 * test_iconf.c — the instance config file (common/st_iconf.c): the shipped
 * example docs/strata.conf.example sets every key of the table and parses;
 * each key takes its own value (not a neighbour's); invalid values and
 * unknown keys give an error naming the file, line, key and allowed range;
 * flags set after the file win.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "st_iconf.h"
#include "st_util.h"
#include "test_util.h"

static struct st_iconf *conf_new(void)
{
	struct st_iconf *c = malloc(sizeof(*c));

	assert_non_null(c);
	st_iconf_init(c);
	return c;
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* 1 if the file at path has a line starting with line_start inside the
 * section whose header line is section (before the next header). */
static int example_comments_key(const char *path, const char *section,
				const char *line_start)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int in = 0, found = 0;

	assert_non_null(f);
	while (!found && fgets(line, sizeof(line), f)) {
		if (line[0] == '[')
			in = !strncmp(line, section, strlen(section));
		else if (in && !strncmp(line, line_start, strlen(line_start)))
			found = 1;
	}
	fclose(f);
	return found;
}

static void test_example_sets_every_key(void **state)
{
	struct st_iconf *c = conf_new();
	struct st_diag d = { "" };
	char path[4200];
	int n;
	const struct st_iconf_knob *k = st_iconf_knobs(&n);
	FILE *null = fopen("/dev/null", "w");

	(void)state;
	assert_non_null(null);
	snprintf(path, sizeof(path), "%s/docs/strata.conf.example",
		 st_test_source_dir());
	if (st_iconf_load(c, path, &d) != 0)
		fail_msg("%s", d.msg);
	for (int i = 0; i < n; i++) {
		char name[96];

		snprintf(name, sizeof(name), "%s.%s", k[i].section, k[i].key);
		/* memory.budget has no value meaning none (0 is refused):
		 * the example shows it commented out, its default */
		if (!strcmp(name, "memory.budget")) {
			assert_false(st_iconf_is_set(c, name));
			assert_true(example_comments_key(path, "[memory]",
							 "# budget = "));
			continue;
		}
		if (!st_iconf_is_set(c, name))
			fail_msg("docs/strata.conf.example does not set %s",
				 name);
	}
	/* values land in their own keys */
	assert_string_equal(st_iconf_get(c, "instance.numa"), "auto");
	assert_string_equal(st_iconf_get(c, "experts.keep_layers"),
			    "first,last=fp8");
	assert_string_equal(st_iconf_get(c, "kv.page_rows"), "16");
	assert_string_equal(st_iconf_get(c, "model.store"),
			    "/tmp/strata-example/kjv-moe-mxfp4.strata");
	assert_string_equal(st_iconf_get(c, "plan.context"), "4096");
	/* the example names the knobs not honoured yet in its comments, and
	 * the table agrees on which they are */
	for (int i = 0; i < n; i++)
		if (!k[i].honoured)
			assert_non_null(k[i].help);
	/* the example sets them to their defaults: nothing to warn about;
	 * other values are read and not acted on: one note each */
	assert_int_equal(st_iconf_warn_unhonoured(c, null, "test"), 0);
	assert_int_equal(st_iconf_set(c, "formats.shared_experts", "fp8", &d),
			 0);
	assert_int_equal(st_iconf_set(c, "kv.max_pages", "100", &d), 0);
	assert_int_equal(st_iconf_set(c, "device.gpu_budget", "24GiB", &d), 0);
	assert_int_equal(st_iconf_warn_unhonoured(c, null, "test"), 3);
	fclose(null);
	free(c);
}

static void test_errors(void **state)
{
	struct st_iconf *c = conf_new();
	struct st_diag d = { "" };
	char dir[4096], path[4200];

	(void)state;
	st_test_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/bad.conf", dir);

	write_file(path, "[kv]\ndtype = f16\n\npage_rows = 0\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":4:"));
	assert_non_null(strstr(d.msg, "kv.page_rows"));
	assert_non_null(strstr(d.msg, "[1, 4096]"));

	write_file(path, "[kv]\ndtype = fp9\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "kv.dtype"));
	assert_non_null(strstr(d.msg, "f32|f16|bf16|fp8"));

	write_file(path, "[experts]\nhost_budget = 150%\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "experts.host_budget"));

	write_file(path, "[experts]\nformat = mxfp5\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "experts.format"));

	write_file(path, "[instance]\nnuma = nearest\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "instance.numa"));

	write_file(path, "[instance]\nname = a.b\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "instance.name"));

	/* a malformed header: its own line is named as a syntax error,
	 * not the key after it as "unknown in section []" */
	write_file(path, "[instance\nname = x\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":1: syntax error"));
	/* a syntax error after an entry's error: the entry's line and words */
	write_file(path, "[kv]\n\ndtype = fp9\ngarbage\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":3: "));
	assert_non_null(strstr(d.msg, "kv.dtype"));
	/* a syntax error before an entry's error: the syntax error's line */
	write_file(path, "[kv]\ngarbage\ndtype = fp9\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":2: syntax error"));
	/* a key before any section */
	write_file(path, "name = x\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":1: key 'name' before any [section]"));

	write_file(path, "[kv]\nbudgett = 1GiB\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, "budgett"));

	write_file(path, "[kv]\nthis line has no equals sign\n");
	assert_int_equal(st_iconf_load(c, path, &d), -EINVAL);
	assert_non_null(strstr(d.msg, ":2:"));

	snprintf(path, sizeof(path), "%s/missing.conf", dir);
	assert_int_equal(st_iconf_load(c, path, &d), -ENOENT);
	free(c);
}

static void test_flags_win(void **state)
{
	struct st_iconf *c = conf_new();
	struct st_diag d = { "" };
	char dir[4096], path[4200];

	(void)state;
	/* defaults before anything is read */
	assert_string_equal(st_iconf_get(c, "kv.budget"), "1GiB");
	assert_false(st_iconf_is_set(c, "kv.budget"));
	assert_null(st_iconf_get(c, "kv.nonsense"));
	st_test_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/a.conf", dir);
	write_file(path, "; comment\n[kv]\nbudget = 8GiB\ndtype = fp8\n");
	assert_int_equal(st_iconf_load(c, path, &d), 0);
	assert_string_equal(st_iconf_get(c, "kv.budget"), "8GiB");
	assert_int_equal(st_iconf_set(c, "kv.budget", "2GiB", &d), 0);
	assert_string_equal(st_iconf_get(c, "kv.budget"), "2GiB");
	assert_string_equal(st_iconf_get(c, "kv.dtype"), "fp8");
	assert_int_equal(st_iconf_set(c, "kv.budget", "lots", &d), -EINVAL);
	assert_string_equal(st_iconf_get(c, "kv.budget"), "2GiB");
	assert_int_equal(st_iconf_set(c, "kv.nope", "1", &d), -ST_E_NOTFOUND);
	free(c);
}

/* Booleans: one parser (st_parse_bool) for the file, the flags and
 * computed; its refusal lists every word it takes. */
static void test_bools(void **state)
{
	struct st_iconf *c = conf_new();
	struct st_diag d = { "" };
	static const char *const yes[] = { "on", "true", "yes", "1" };
	static const char *const no[] = { "off", "false", "no", "0" };

	(void)state;
	for (int i = 0; i < 4; i++) {
		assert_int_equal(st_parse_bool(yes[i]), 1);
		assert_int_equal(st_parse_bool(no[i]), 0);
		assert_int_equal(st_iconf_set(c, "kv.restore_ahead", no[i],
					      &d), 0);
		assert_false(st_iconf_get_bool(c, "kv.restore_ahead"));
		assert_int_equal(st_iconf_set(c, "kv.restore_ahead", yes[i],
					      &d), 0);
		assert_true(st_iconf_get_bool(c, "kv.restore_ahead"));
	}
	assert_int_equal(st_parse_bool("ON"), -EINVAL);
	assert_int_equal(st_parse_bool("bogus"), -EINVAL);
	assert_int_equal(st_parse_bool(""), -EINVAL);
	assert_int_equal(st_parse_bool(NULL), -EINVAL);
	assert_int_equal(st_iconf_set(c, "kv.restore_ahead", "ON", &d),
			 -EINVAL);
	assert_non_null(strstr(d.msg, "'ON'"));
	assert_non_null(strstr(d.msg, "true/false, yes/no, 1/0"));
	/* refused: the value before stays */
	assert_true(st_iconf_get_bool(c, "kv.restore_ahead"));
	free(c);
}

/* every --speculate value strata up forwards to computed is a valid
 * serve.speculate, mtp[:K] included (strata up --speculate mtp was refused) */
static void test_speculate_values(void **state)
{
	static const char *ok[] = { "off", "ngram", "ngram:4", "auto",
				    "auto:16", "mtp", "mtp:1", "mtp:3",
				    "mtp:16" };
	static const char *bad[] = { "mtp:0", "mtp:", "mtp:17", "mtpx" };
	struct st_iconf *c = conf_new();
	struct st_diag d = { "" };

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		assert_int_equal(st_iconf_set(c, "serve.speculate", ok[i], &d),
				 0);
		assert_string_equal(st_iconf_get(c, "serve.speculate"), ok[i]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(st_iconf_set(c, "serve.speculate", bad[i],
					      &d), -EINVAL);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_example_sets_every_key),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_flags_win),
		cmocka_unit_test(test_bools),
		cmocka_unit_test(test_speculate_values),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
