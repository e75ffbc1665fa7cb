/* fault_util.c — see fault_util.h. */
#include "fault_util.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "es_convert.h"
#include "st_util.h"
#include "test_util.h"

int flt_convert(const char *fixture, const char *dir, char *store_dir,
		size_t len)
{
	struct es_convert_opts o;
	struct st_diag diag = { "" };
	char model[4400];
	int r;

	st_test_fixture_model(fixture, model, sizeof(model));
	snprintf(store_dir, len, "%s/store", dir);
	es_convert_opts_init(&o);
	o.expert_dtype = ST_DTYPE_BF16;
	r = es_convert(model, store_dir, &o, &diag);
	if (r < 0) {
		fprintf(stderr, "convert %s failed: %s\n", fixture, diag.msg);
		return -1;
	}
	return 0;
}

uint64_t flt_seed(void)
{
	const char *e = getenv("STRATA_FAULT_SEED");
	uint64_t seed = e && *e ? strtoull(e, NULL, 0) : st_now_ns();

	if (!seed)
		seed = 1;
	printf("seed %" PRIu64 " (replay with STRATA_FAULT_SEED=%" PRIu64
	       ")\n", seed, seed);
	fflush(stdout);
	return seed;
}

uint64_t flt_rand(uint64_t *s, uint64_t n)
{
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return n ? (x * 0x2545f4914f6cdd1dull) % n : 0;
}

int flt_count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory stream itself */
}

int flt_count_run_files(const char *run_dir)
{
	DIR *d = opendir(run_dir);
	struct dirent *de;
	int n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);

		if (l > 4 && (!strcmp(de->d_name + l - 4, ".ctl") ||
			      !strcmp(de->d_name + l - 4, ".evt") ||
			      !strcmp(de->d_name + l - 4, ".pid")))
			n++;
	}
	closedir(d);
	return n;
}
