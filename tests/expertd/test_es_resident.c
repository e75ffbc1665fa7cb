/*
 * test_es_resident.c — the expert pool is in memory and mapped before the
 * first token needs it (issue 25: the first pass after start-up must not
 * pay page faults in the middle of the expert kernels).  Not timed: it
 * checks the mechanism.
 *
 *  - expertd allocates every page of the pool's slots when it makes the
 *    pool: its mapping of the segment is resident (Rss in
 *    /proc/PID/smaps covers the slots' bytes);
 *  - es_client_open maps every page into the client: the client's own
 *    mapping is resident at once, and reading every page of every record
 *    of a full pool afterwards takes (almost) no page fault in the client
 *    (without the mapping: about one per 8-16 pages);
 *  - the loader threads are there under their name, es-loader, one per
 *    --loader-threads, and with --loader-nice N they run N lower in
 *    priority than the daemon's other threads (/proc/PID/task/TID/stat).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "es_client.h"
#include "es_harness.h"
#include "st_util.h"
#include "test_util.h"

static struct es_h H;

static int group_setup(void **state)
{
	return es_h_init(&H, "kjv-moe", "esres") < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	es_h_fini(&H);
	return 0;
}

static int test_teardown(void **state)
{
	es_h_reset(&H);
	return 0;
}

/* Rss in bytes of the mapping of /dev/shm/<name> in process pid (0:
 * self), from /proc/PID/smaps; -1 if no such mapping. */
static long long shm_rss_bytes(int pid, const char *name)
{
	char path[64], line[1024];
	long long rss = -1;
	int in = 0;
	FILE *f;

	if (pid)
		snprintf(path, sizeof(path), "/proc/%d/smaps", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/smaps");
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		long long kb;
		unsigned long long lo, hi;

		if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2) {
			/* a mapping's first line: is it our segment? */
			in = strstr(line, name) != NULL;
			continue;
		}
		if (in && sscanf(line, "Rss: %lld kB", &kb) == 1)
			rss = (rss < 0 ? 0 : rss) + kb * 1024;
	}
	fclose(f);
	return rss;
}

static long long segment_bytes(void)
{
	char path[300];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm/strata.%s.experts", H.inst);
	assert_int_equal(stat(path, &st), 0);
	return (long long)st.st_size;
}

static long minflt_self(void)
{
	struct rusage ru;

	assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
	return ru.ru_minflt;
}

static void test_pool_resident(void **state)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;
	uint64_t slots_bytes;
	long long seg, rss_es, rss_cl;
	char name[300];
	const uint8_t *rec[64];
	int ids[64];
	long f0, f1, pages = 0;
	volatile uint8_t sink = 0;

	assert_int_equal(es_h_start(&H, "--host-budget", "100%", NULL), 0);
	snprintf(name, sizeof(name), "/dev/shm/strata.%s.experts", H.inst);
	seg = segment_bytes();
	slots_bytes = (uint64_t)H.n_layers * H.n_experts * H.record_bytes;
	assert_true((uint64_t)seg >= slots_bytes);
	/* expertd: every slot's page allocated at start */
	rss_es = shm_rss_bytes(H.pid, name);
	printf("segment %lld bytes, slots %llu bytes; expertd's Rss of it "
	       "%lld\n", seg, (unsigned long long)slots_bytes, rss_es);
	assert_true(rss_es >= (long long)slots_bytes);
	/* the client: mapped at open */
	assert_int_equal(es_client_open(H.run_dir, H.inst, "resident",
					ES_H_TIMEOUT_MS, &c, &diag), 0);
	rss_cl = shm_rss_bytes(0, name);
	printf("client's Rss of it after es_client_open: %lld\n", rss_cl);
	assert_true(rss_cl >= (long long)slots_bytes);
	/* every page of every record: no fault in the client */
	assert_true(H.n_experts <= 64);
	for (int e = 0; e < H.n_experts; e++)
		ids[e] = e;
	for (int l = 0; l < H.n_layers; l++) {
		int r = es_client_acquire(c, l, H.n_experts, ids, rec, &diag);

		if (r)
			fprintf(stderr, "%s\n", diag.msg);
		assert_int_equal(r, 0);
		f0 = minflt_self();
		for (int e = 0; e < H.n_experts; e++)
			for (uint64_t o = 0; o < H.record_bytes; o += 4096) {
				sink ^= rec[e][o];
				pages++;
			}
		f1 = minflt_self();
		/* a few for this test's own stack and stdio, none per page */
		assert_true(f1 - f0 <= 4);
		es_client_release(c, l, H.n_experts, ids);
	}
	printf("%ld record pages read after open (sink %u)\n", pages,
	       (unsigned)sink);
	assert_true(pages >= (long)H.n_layers * H.n_experts);
	es_client_close(c);
}

/* Field 19 (nice) of /proc/PID/task/TID/stat. */
static int task_nice(const char *task_dir)
{
	char path[400], line[1024], *p;
	int nice = -100;
	FILE *f;

	snprintf(path, sizeof(path), "%s/stat", task_dir);
	f = fopen(path, "re");
	assert_non_null(f);
	p = fgets(line, sizeof(line), f);
	fclose(f);
	assert_non_null(p);
	p = strrchr(line, ')');
	assert_non_null(p);
	/* fields 3..18 then 19 */
	assert_int_equal(sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u "
				"%*u %*u %*u %*u %*d %*d %*d %d", &nice), 1);
	return nice;
}

static void test_loader_threads(void **state)
{
	char path[64], comm[64];
	struct dirent *d;
	DIR *dir;
	int n = 0, n_other = 0, base, want;

	assert_int_equal(es_h_start(&H, "--host-budget", "25%",
				    "--loader-threads", "3",
				    "--loader-nice", "7", NULL), 0);
	/* relative to the daemon's main thread (the tests may run niced) */
	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)H.pid,
		 (int)H.pid);
	base = task_nice(path);
	want = base + 7 > 19 ? 19 : base + 7;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)H.pid);
	dir = opendir(path);
	assert_non_null(dir);
	while ((d = readdir(dir))) {
		char p2[400];
		FILE *f;

		if (d->d_name[0] == '.')
			continue;
		snprintf(p2, sizeof(p2), "%s/%s/comm", path, d->d_name);
		f = fopen(p2, "re");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) &&
		    !strcmp(comm, "es-loader\n")) {
			n++;
			p2[strlen(p2) - 5] = 0; /* the task directory */
			assert_int_equal(task_nice(p2), want);
		} else {
			n_other++;
			p2[strlen(p2) - 5] = 0;
			assert_int_equal(task_nice(p2), base);
		}
		fclose(f);
	}
	closedir(dir);
	assert_int_equal(n, 3);
	assert_true(n_other >= 1); /* the server thread */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_pool_resident, test_teardown),
		cmocka_unit_test_teardown(test_loader_threads, test_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
