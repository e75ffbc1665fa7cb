/*
 * test_ioq.c — the I/O queue's arbiter (common/st_ioq.h): a lower class is
 * deferred while a higher one waits or is in flight, never beyond the
 * bound; the most urgent class never waits; STRATA_IOQ=off only counts;
 * a slot left by a process killed mid-I/O does not block and is taken
 * over with its totals kept; totals are the bytes ended; the last close
 * removes the segment.  Times have generous margins (a loaded 2-core
 * machine): each check is one-sided where the other side is scheduling.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "st_ioq.h"
#include "st_util.h"
#include "test_util.h"

static int failures;
static char inst[64];

#define MS 1000000ull

/* A thread holding one I/O of class cls in flight for hold_ns. */
struct holder {
	struct st_ioq *q;
	int cls;
	uint64_t hold_ns;
	volatile int started;
	uint64_t t_release; /* st_now_ns() right before its st_ioq_end */
};

static void *hold_main(void *arg)
{
	struct holder *h = arg;
	struct st_ioq_op op;

	st_ioq_begin(h->q, h->cls, &op);
	h->started = 1;
	st_sleep_ns(h->hold_ns);
	h->t_release = st_now_ns();
	st_ioq_end(h->q, &op, 4096);
	return NULL;
}

static void start_holder(pthread_t *th, struct holder *h)
{
	h->started = 0;
	pthread_create(th, NULL, hold_main, h);
	while (!h->started)
		st_sleep_ns(100000);
}

/* Wait of one I/O of class cls begun now (ns); *deferred its flag, and
 * *t_start (unless NULL) when it was let go. */
static uint64_t timed_io_at(struct st_ioq *q, int cls, int *deferred,
			    uint64_t *t_start)
{
	struct st_ioq_op op;
	uint64_t w;

	st_ioq_begin(q, cls, &op);
	w = op.t_start - op.t_queued;
	if (deferred)
		*deferred = op.deferred;
	if (t_start)
		*t_start = op.t_start;
	st_ioq_end(q, &op, 8192);
	return w;
}

static uint64_t timed_io(struct st_ioq *q, int cls, int *deferred)
{
	return timed_io_at(q, cls, deferred, NULL);
}

static int open_q(struct st_ioq **q, const char *who)
{
	struct st_diag d = { "" };
	int r = st_ioq_open(q, inst, who, &d);

	if (r < 0)
		printf("st_ioq_open: %s\n", d.msg);
	return r;
}

/* Scheduling slack of a time check: 40 ms, times STRATA_TIMEOUT_SCALE
 * (sanitizer builds). */
static uint64_t slack;

static void test_order(void)
{
	struct st_ioq *a, *b;
	struct holder h;
	pthread_t th;
	uint64_t w, t_go;
	int def;

	setenv("STRATA_IOQ_BOUND_US", "20000", 1);
	ST_TEST_CHECK(open_q(&a, "expertd") == 0);
	ST_TEST_CHECK(open_q(&b, "kvd") == 0);
	if (!a || !b)
		exit(1);
	ST_TEST_CHECK(st_ioq_slot_index(a) != st_ioq_slot_index(b));
	ST_TEST_CHECK(st_ioq_bound_ns(a) == 20 * MS);
	ST_TEST_CHECK(st_ioq_enabled(a));

	/* nothing above: no wait */
	w = timed_io(b, ST_IOQ_KV_SPILL, &def);
	ST_TEST_CHECK(!def);

	/* demand in flight in a (expertd) for 6 ms: b's prefetch-class and
	 * spill-class I/Os wait until it ends, well below the bound */
	h = (struct holder){ .q = a, .cls = ST_IOQ_DEMAND, .hold_ns = 6 * MS };
	start_holder(&th, &h);
	ST_TEST_CHECK(st_ioq_pressure(b, ST_IOQ_KV_SPILL));
	ST_TEST_CHECK(st_ioq_pressure(b, ST_IOQ_KV_RESTORE));
	w = timed_io_at(b, ST_IOQ_KV_RESTORE, &def, &t_go);
	pthread_join(th, NULL);
	printf("kv-restore behind 6 ms of demand waited %.2f ms\n",
	       (double)w / MS);
	ST_TEST_CHECK(def);
	/* until the demand ended (let go no earlier than the holder's
	 * release: how long that took from here depends on when the holder
	 * began, which a loaded machine delays, so no lower bound on w), and
	 * never beyond the bound (plus a poll and the scheduling of a loaded
	 * machine) */
	ST_TEST_CHECK(t_go >= h.t_release && w < 20 * MS + slack);

	/* the most urgent class never waits, whatever is in flight */
	h = (struct holder){ .q = b, .cls = ST_IOQ_KV_SPILL, .hold_ns = 10 * MS };
	start_holder(&th, &h);
	w = timed_io(a, ST_IOQ_DEMAND, &def);
	ST_TEST_CHECK(!def && w < 2 * MS);
	/* nor does a class above what is in flight */
	w = timed_io(a, ST_IOQ_PREFETCH, &def);
	ST_TEST_CHECK(!def);
	pthread_join(th, NULL);

	/* demand held 200 ms: a spill waits the bound (20 ms) and goes */
	h = (struct holder){ .q = a, .cls = ST_IOQ_DEMAND, .hold_ns = 200 * MS };
	start_holder(&th, &h);
	w = timed_io(b, ST_IOQ_KV_SPILL, &def);
	printf("kv-spill behind 200 ms of demand waited %.2f ms (bound 20)\n",
	       (double)w / MS);
	ST_TEST_CHECK(def);
	ST_TEST_CHECK(w >= 20 * MS && w < 20 * MS + slack);
	/* and the non-sleeping form says -EAGAIN meanwhile */
	{
		struct st_ioq_op op = { 0 };

		ST_TEST_CHECK(st_ioq_try_begin(b, ST_IOQ_PREFETCH, &op) ==
			      -EAGAIN);
		ST_TEST_CHECK(atomic_load(&st_ioq_seg(b)->slot[
			st_ioq_slot_index(b)].c[ST_IOQ_PREFETCH].waiting) == 1);
		st_ioq_cancel(b, &op);
		ST_TEST_CHECK(atomic_load(&st_ioq_seg(b)->slot[
			st_ioq_slot_index(b)].c[ST_IOQ_PREFETCH].waiting) == 0);
	}
	pthread_join(th, NULL);

	/* a restore waiting counts against prefetch: the chain of classes */
	{
		struct st_ioq_op op = { 0 };

		h = (struct holder){ .q = a, .cls = ST_IOQ_DEMAND,
				     .hold_ns = 30 * MS };
		start_holder(&th, &h);
		ST_TEST_CHECK(st_ioq_try_begin(b, ST_IOQ_KV_RESTORE, &op) ==
			      -EAGAIN);
		pthread_join(th, NULL);
		/* demand over, the restore still waiting: prefetch defers */
		ST_TEST_CHECK(st_ioq_pressure(a, ST_IOQ_PREFETCH));
		ST_TEST_CHECK(st_ioq_try_begin(b, ST_IOQ_KV_RESTORE, &op) == 0);
		ST_TEST_CHECK(st_ioq_pressure(a, ST_IOQ_PREFETCH));
		st_ioq_end(b, &op, 0);
		ST_TEST_CHECK(!st_ioq_pressure(a, ST_IOQ_PREFETCH));
	}

	/* a spill a request waits for (urgency of a restore): a prefetch in
	 * flight does not hold it back, it holds a prefetch back, and its
	 * totals are a spill's */
	{
		struct st_ioq_op op;

		h = (struct holder){ .q = a, .cls = ST_IOQ_PREFETCH,
				     .hold_ns = 30 * MS };
		start_holder(&th, &h);
		st_ioq_begin_prio(b, ST_IOQ_KV_SPILL, ST_IOQ_KV_RESTORE, &op);
		ST_TEST_CHECK(!op.deferred);
		pthread_join(th, NULL);
		ST_TEST_CHECK(st_ioq_pressure(a, ST_IOQ_PREFETCH));
		ST_TEST_CHECK(!st_ioq_pressure(a, ST_IOQ_KV_RESTORE));
		st_ioq_end(b, &op, 100);
		ST_TEST_CHECK(!st_ioq_pressure(a, ST_IOQ_PREFETCH));
	}

	/* totals: what the ends said, by class */
	{
		struct st_ioq_totals t, u;
		struct st_diag d = { "" };

		st_ioq_totals(a, &t);
		ST_TEST_CHECK(st_ioq_read_totals(inst, &u, &d) == 0);
		ST_TEST_CHECK(!memcmp(&t, &u, sizeof(t)));
		/* demand: 3 holders of 4096 + 1 timed of 8192 */
		ST_TEST_CHECK(t.ops[ST_IOQ_DEMAND] == 4);
		ST_TEST_CHECK(t.bytes[ST_IOQ_DEMAND] == 3 * 4096 + 8192);
		ST_TEST_CHECK(t.bytes[ST_IOQ_KV_SPILL] == 4096 + 2 * 8192 + 100);
		ST_TEST_CHECK(t.bytes[ST_IOQ_PREFETCH] == 8192 + 4096);
		ST_TEST_CHECK(t.bytes[ST_IOQ_KV_RESTORE] == 8192);
		ST_TEST_CHECK(t.ops[ST_IOQ_KV_RESTORE] == 2);
		ST_TEST_CHECK(t.bound_hits[ST_IOQ_KV_SPILL] == 1);
		ST_TEST_CHECK(t.wait_ns[ST_IOQ_KV_SPILL] >= 20 * MS);
		ST_TEST_CHECK(t.wait_ns[ST_IOQ_DEMAND] < 2 * MS);
	}
	st_ioq_close(b);
	st_ioq_close(a);
	unsetenv("STRATA_IOQ_BOUND_US");
}

static void test_off(void)
{
	struct st_ioq *a, *b;
	struct holder h;
	pthread_t th;
	struct st_diag d = { "" };
	int def;
	uint64_t w;

	(void)d;
	ST_TEST_CHECK(open_q(&a, "expertd") == 0);
	setenv("STRATA_IOQ", "off", 1);
	ST_TEST_CHECK(open_q(&b, "kvd") == 0);
	unsetenv("STRATA_IOQ");
	ST_TEST_CHECK(!st_ioq_enabled(b));
	{
		/* what strata status reads: one process orders, one not */
		struct st_ioq_totals t;

		ST_TEST_CHECK(st_ioq_read_totals(inst, &t, &d) == 0);
		ST_TEST_CHECK(t.ordered == 1 && t.unordered == 1);
		ST_TEST_CHECK(st_ioq_mode(&t) == ST_IOQ_MODE_MIXED);
	}
	h = (struct holder){ .q = a, .cls = ST_IOQ_DEMAND, .hold_ns = 50 * MS };
	start_holder(&th, &h);
	w = timed_io(b, ST_IOQ_KV_SPILL, &def);
	ST_TEST_CHECK(!def && w < 2 * MS);
	pthread_join(th, NULL);
	{
		struct st_ioq_totals t;

		st_ioq_totals(b, &t);
		ST_TEST_CHECK(t.bytes[ST_IOQ_KV_SPILL] == 8192);
		ST_TEST_CHECK(t.bytes[ST_IOQ_DEMAND] == 4096);
	}
	st_ioq_close(b);
	st_ioq_close(a);
}

/* st_ioq_open with one bad setting: still a queue (never "no queue"),
 * with the default, and a warning on stderr naming the variable, its
 * value and the default. */
static void check_bad_env(const char *name, const char *val, int enabled,
			  uint64_t bound_ns, const char *dflt)
{
	struct st_ioq *q = NULL;
	char path[] = "/tmp/test_ioq_errXXXXXX", buf[1024] = "", want[128];
	int fd = mkstemp(path), saved = dup(2);
	ssize_t n;

	setenv(name, val, 1);
	fflush(stderr);
	dup2(fd, 2);
	ST_TEST_CHECK(open_q(&q, "expertd") == 0);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	unsetenv(name);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	close(fd);
	unlink(path);
	snprintf(want, sizeof(want), "%s=%s", name, val);
	ST_TEST_CHECK(q != NULL);
	if (!q)
		return;
	ST_TEST_CHECK(strstr(buf, want) != NULL);
	ST_TEST_CHECK(strstr(buf, dflt) != NULL);
	ST_TEST_CHECK(st_ioq_enabled(q) == enabled);
	ST_TEST_CHECK(st_ioq_bound_ns(q) == bound_ns);
	{
		struct st_ioq_totals t;
		struct st_diag d = { "" };

		ST_TEST_CHECK(st_ioq_read_totals(inst, &t, &d) == 0);
		ST_TEST_CHECK(st_ioq_mode(&t) == (enabled ?
			ST_IOQ_MODE_ORDERED : ST_IOQ_MODE_UNORDERED));
	}
	st_ioq_close(q);
}

static void test_bad_env(void)
{
	check_bad_env("STRATA_IOQ", "bogus", 1, 2 * MS, "default on");
	check_bad_env("STRATA_IOQ_BOUND_US", "abc", 1, 2 * MS,
		      "default 2000");
	check_bad_env("STRATA_IOQ_BOUND_US", "-5", 1, 2 * MS, "default 2000");
	check_bad_env("STRATA_IOQ_BOUND_US", "99999999999999999999", 1,
		      2 * MS, "default 2000");
	check_bad_env("STRATA_IOQ_BOUND_US", "20001", 1, 2 * MS,
		      "default 2000");
	check_bad_env("STRATA_IOQ_DEPTH", "x", 1, 2 * MS, "default 0");
	/* a bad bound with STRATA_IOQ=off: off stays off */
	setenv("STRATA_IOQ", "off", 1);
	check_bad_env("STRATA_IOQ_BOUND_US", "abc", 0, 2 * MS,
		      "default 2000");
	unsetenv("STRATA_IOQ");
}

static void test_dead(void)
{
	struct st_ioq *a, *c;
	struct st_ioq_totals t0, t1;
	int pfd[2], def, st;
	pid_t pid;
	uint64_t w;
	char ch;

	setenv("STRATA_IOQ_BOUND_US", "20000", 1);
	ST_TEST_CHECK(open_q(&a, "kvd") == 0);
	ST_TEST_CHECK(pipe(pfd) == 0);
	pid = fork();
	if (pid == 0) {
		struct st_ioq *q;
		struct st_ioq_op op;

		if (open_q(&q, "expertd") < 0)
			_exit(1);
		st_ioq_begin(q, ST_IOQ_DEMAND, &op);
		st_ioq_end(q, &op, 12345);
		st_ioq_begin(q, ST_IOQ_DEMAND, &op); /* never ended */
		if (write(pfd[1], "r", 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(pfd[1]);
	ST_TEST_CHECK(read(pfd[0], &ch, 1) == 1);
	close(pfd[0]);
	/* alive: its demand in flight defers a spill to the bound */
	w = timed_io(a, ST_IOQ_KV_SPILL, &def);
	ST_TEST_CHECK(def && w >= 20 * MS);
	st_ioq_totals(a, &t0);
	kill(pid, SIGKILL);
	/* killed, not yet reaped (a zombie): no longer blocks.  The
	 * liveness of a peer is cached up to ST_IOQ_LIVE_CHECK_NS: the
	 * first I/O after the kill may still wait (at most the bound) */
	st_sleep_ns(ST_IOQ_LIVE_CHECK_NS + 20 * MS);
	w = timed_io(a, ST_IOQ_KV_SPILL, &def);
	printf("kv-spill after its peer's kill -9 mid-demand waited %.2f ms\n",
	       (double)w / MS);
	ST_TEST_CHECK(!def && w < 5 * MS);
	ST_TEST_CHECK(waitpid(pid, &st, 0) == pid);
	w = timed_io(a, ST_IOQ_PREFETCH, &def);
	ST_TEST_CHECK(!def && w < 5 * MS);
	/* a new process's open takes the dead slot over: gauges cleared,
	 * totals kept (moved into retired) */
	ST_TEST_CHECK(open_q(&c, "expertd") == 0);
	st_ioq_totals(c, &t1);
	ST_TEST_CHECK(t0.bytes[ST_IOQ_DEMAND] == 12345);
	ST_TEST_CHECK(t1.bytes[ST_IOQ_DEMAND] == 12345);
	ST_TEST_CHECK(t1.ops[ST_IOQ_DEMAND] == 1);
	ST_TEST_CHECK(t1.bytes[ST_IOQ_KV_SPILL] == 2 * 8192);
	for (int i = 0; i < ST_IOQ_SLOTS; i++)
		for (int k = 0; k < ST_IOQ_N; k++)
			ST_TEST_CHECK(atomic_load(&st_ioq_seg(c)->slot[i].c[k]
							   .inflight) == 0);
	st_ioq_close(c);
	/* the last close removes the segment */
	{
		char name[128];
		int fd;

		snprintf(name, sizeof(name), "/strata.%s.ioq", inst);
		st_ioq_close(a);
		fd = shm_open(name, O_RDONLY, 0);
		ST_TEST_CHECK(fd < 0 && errno == ENOENT);
		if (fd >= 0) {
			close(fd);
			shm_unlink(name);
		}
	}
	unsetenv("STRATA_IOQ_BOUND_US");
}

int main(void)
{
	st_test_instance("ioq", inst, sizeof(inst));
	slack = 40 * MS * (uint64_t)st_test_timeout_scale();
	test_order();
	test_off();
	test_bad_env();
	test_dead();
	if (failures)
		printf("%d check(s) failed\n", failures);
	else
		printf("ok\n");
	return failures ? 1 : 0;
}
