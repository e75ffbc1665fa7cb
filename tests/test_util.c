/* test_util.c — see test_util.h. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_util.h"

static int in_ci(void)
{
	const char *ci = getenv("CI");

	return ci && *ci && strcmp(ci, "0") && strcmp(ci, "false");
}

static void missing(const char *what)
{
	if (in_ci()) {
		fprintf(stderr, "FAIL: fixture %s is missing (required under CI)\n",
			what);
		exit(1);
	}
	fprintf(stderr, "SKIP: %s not found; the fixture tests need the shared "
		"folder beside the repository (../shared)\n", what);
	exit(ST_TEST_SKIP);
}

const char *st_test_shared_dir(void)
{
	const char *d = getenv("STRATA_SHARED_DIR");

	if (!d || !*d)
		d = "../shared";
	if (!st_path_exists(d))
		missing(d);
	return d;
}

const char *st_test_fixture_model(const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "%s/fixtures/models/%s", st_test_shared_dir(), name);
	if (!st_path_exists(buf))
		missing(buf);
	return buf;
}

const char *st_test_source_dir(void)
{
	const char *d = getenv("STRATA_SOURCE_DIR");

	return d && *d ? d : ".";
}

const char *st_test_build_dir(void)
{
	const char *d = getenv("STRATA_BUILD_DIR");

	return d && *d ? d : ".";
}

int st_test_timeout_scale(void)
{
	const char *v = getenv("STRATA_TIMEOUT_SCALE");
	char *end;
	long k;

	if (!v || !*v)
		return 1;
	k = strtol(v, &end, 10);
	return *end == '\0' && k >= 1 && k <= 20 ? (int)k : 1;
}

const char *st_test_tmpdir(char *buf, size_t len)
{
	const char *t = getenv("TMPDIR");

	snprintf(buf, len, "%s/strata-test-XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(buf)) {
		perror("mkdtemp");
		abort();
	}
	return buf;
}

const char *st_test_instance(const char *tag, char *buf, size_t len)
{
	snprintf(buf, len, "t%d_%s", (int)getpid(), tag);
	return buf;
}

uint32_t st_test_rnd(uint64_t *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return (uint32_t)(*state >> 16);
}

float st_test_rndf(uint64_t *state)
{
	float s = 0;

	for (int i = 0; i < 4; i++)
		s += (float)(st_test_rnd(state) % 20001) / 10000.0f - 1.0f;
	return s * 0.866f;
}
