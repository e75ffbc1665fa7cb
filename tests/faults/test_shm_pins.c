/*
 * test_shm_pins.c — smaller faults of the expert pool protocol (issue 26
 * item 5), on the pool layout and expertd's own functions in one process:
 *
 *   - a missed fast-path pin is undone without wrapping a pin that an
 *     adopting expertd zeroed meanwhile (es_pool_try_pin / es_pin_drop);
 *   - a seqlock snapshot of a slot whose writer died mid-change (version
 *     left odd) returns instead of spinning for ever;
 *   - activation statistics are saved through a unique temporary file
 *     (a leftover or foreign "<path>.tmp" does not stop a save).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "es_actstats.h"
#include "es_pool.h"
#include "st_util.h"
#include "test_util.h"

/* One pool of 1 layer x 4 experts, 2 slots, in ordinary memory. */
struct pool {
	void *base;
	struct es_pool_view v;
};

static void pool_make(struct pool *p)
{
	struct es_pool_geom g = { 1, 4, 2, 1, 4096, 1 };
	struct es_pool_layout l;

	assert_int_equal(es_pool_layout_compute(&g, &l), 0);
	p->base = aligned_alloc(4096, l.total_bytes);
	assert_non_null(p->base);
	memset(p->base, 0, l.total_bytes);
	assert_int_equal(es_pool_format(p->base, l.total_bytes, &g, &l), 0);
	assert_int_equal(es_pool_view_init(p->base, l.total_bytes, 1, &p->v,
					   NULL), 0);
}

struct pinner {
	struct es_pool_view *v;
	_Atomic int stop;
};

static void *pin_loop(void *arg)
{
	struct pinner *pn = arg;
	uint32_t gen;

	while (!atomic_load(&pn->stop))
		(void)es_pool_try_pin(pn->v, 0, 0, 0, &gen);
	return NULL;
}

/*
 * Client 0 try_pins a LOADING slot (every try is a miss: +1 then -1)
 * while "recovery" stores 0 into that pin now and then.  A blind -1 after
 * a store of 0 leaves 0xffffffff: a pin nobody will ever drop.  One second
 * of this (the race window is a few instructions; thousands of stores).
 */
static void test_try_pin_never_wraps(void **state)
{
	struct pool p;
	struct pinner pn;
	pthread_t th;
	uint64_t t0 = st_now_ns();
	long stores = 0, wrapped = 0;

	(void)state;
	pool_make(&p);
	atomic_store(&p.v.slots[0].key, es_key(0, 0));
	atomic_store(&p.v.slots[0].state, ES_SLOT_LOADING);
	atomic_store(&p.v.slot_of[0], 0);
	pn.v = &p.v;
	atomic_store(&pn.stop, 0);
	assert_int_equal(pthread_create(&th, NULL, pin_loop, &pn), 0);
	while (st_now_ns() - t0 < 1000000000ull && !wrapped) {
		atomic_store(&p.v.slots[0].pins[0], 0); /* pool_recover */
		stores++;
		for (volatile int i = 0; i < 200; i++)
			;
		wrapped += atomic_load(&p.v.slots[0].pins[0]) > 0x7fffffffu;
	}
	atomic_store(&pn.stop, 1);
	pthread_join(th, NULL);
	print_message("%ld stores of 0, %ld wrapped pins\n", stores, wrapped);
	assert_int_equal(wrapped, 0);
	assert_int_equal(es_slot_pin_sum(&p.v.slots[0]), 0);
	/* and the drop itself: never below 0, one pin per call above */
	atomic_store(&p.v.slots[1].pins[3], 0);
	assert_int_equal(es_pin_drop(&p.v.slots[1].pins[3]), 0);
	assert_int_equal(atomic_load(&p.v.slots[1].pins[3]), 0);
	atomic_store(&p.v.slots[1].pins[3], 2);
	assert_int_equal(es_pin_drop(&p.v.slots[1].pins[3]), 1);
	assert_int_equal(atomic_load(&p.v.slots[1].pins[3]), 1);
	free(p.base);
}

static void on_alarm(int sig)
{
	(void)sig;
	/* the snapshot spun for seconds: the fault this test is about */
	_exit(3);
}

/* A version left odd (writer killed mid-change): the snapshot gives up. */
static void test_snapshot_bounded(void **state)
{
	struct pool p;
	uint64_t key = 0;
	uint32_t st = 0, gen = 0;

	(void)state;
	pool_make(&p);
	atomic_store(&p.v.slots[1].key, es_key(0, 2));
	atomic_store(&p.v.slots[1].state, ES_SLOT_READY);
	atomic_store(&p.v.slots[1].gen, 5);
	assert_int_equal(es_slot_snapshot(&p.v.slots[1], &key, &st, &gen), 0);
	assert_true(key == es_key(0, 2) && st == ES_SLOT_READY && gen == 5);
	atomic_fetch_add(&p.v.slots[1].version, 1); /* odd for good */
	signal(SIGALRM, on_alarm);
	alarm(10);
	assert_int_equal(es_slot_snapshot(&p.v.slots[1], &key, &st, &gen),
			 -EAGAIN);
	alarm(0);
	free(p.base);
}

/* Saves go through a temporary file of their own. */
static void test_actstats_save_unique_tmp(void **state)
{
	struct es_actstats s, t;
	char dir[4096], path[4200], blocker[4300];
	struct st_diag d = { "" };
	struct stat sb;

	(void)state;
	st_test_tmpdir(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/actstats.bin", dir);
	/* what a fixed temporary name would collide with: another saver's
	 * file (here: a directory, which no open(O_TRUNC) can replace) */
	snprintf(blocker, sizeof(blocker), "%s.tmp", path);
	assert_int_equal(mkdir(blocker, 0700), 0);
	assert_int_equal(es_actstats_init(&s, 2, 4, 100.0, 0x5707e), 0);
	es_actstats_add(&s, 1, 3);
	es_actstats_tokens(&s, 1);
	assert_int_equal(es_actstats_save(&s, path, &d), 0);
	assert_int_equal(stat(blocker, &sb), 0);
	assert_true(S_ISDIR(sb.st_mode));        /* untouched */
	assert_int_equal(es_actstats_init(&t, 2, 4, 100.0, 0x5707e), 0);
	assert_int_equal(es_actstats_load(&t, path, 1, &d), 0);
	assert_int_equal(t.tokens, 1);
	/* nothing else left in the directory: the file, the blocker */
	{
		char cmd[4400];
		FILE *f;
		int n = 0;

		snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", dir);
		f = popen(cmd, "r");
		assert_non_null(f);
		assert_int_equal(fscanf(f, "%d", &n), 1);
		pclose(f);
		assert_int_equal(n, 2);
	}
	es_actstats_fini(&s);
	es_actstats_fini(&t);
	st_rm_rf(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_try_pin_never_wraps),
		cmocka_unit_test(test_snapshot_bounded),
		cmocka_unit_test(test_actstats_save_unique_tmp),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
