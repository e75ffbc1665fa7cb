/*
 * test_ledger.c — the shared memory budget (common/st_ledger.h): the
 * arbiter's decision on hand-made views (each expected value worked out
 * here from the rules in st_ledger.h), and the segment: the starting
 * split, floors, a live peer's other total, a side held by a live
 * process, a move in two phases (the receiver gains only once the donor
 * shrank), a random walk that keeps every invariant (targets within floors
 * and caps, their sum within the total), the log and counters read back
 * by st_ledger_read, and the last close removing the segment.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "st_ledger.h"
#include "st_util.h"
#include "test_util.h"

static int failures;
static char inst[64];

#define MS 1000000ull
#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

#define CHECK(c) ST_TEST_CHECK(c)

/* A view of two live sides, 8 GiB split 4 + 4, step 512 MiB, units
 * 16 MiB (experts) and 1 MiB (kv), values fresh at now. */
static void base_view(struct st_ledger_view *v, uint64_t now)
{
	memset(v, 0, sizeof(*v));
	v->total = 8 * GiB;
	v->step = 512 * MiB;
	v->last_move_ns = now - 10ull * 1000 * MS;
	for (int s = 0; s < 2; s++) {
		v->side[s].live = 1;
		v->side[s].floor = 1 * GiB;
		v->side[s].cap = 8 * GiB;
		v->side[s].target = 4 * GiB;
		v->side[s].used = 4 * GiB;
		v->side[s].value_ns = now - 10 * MS;
	}
	v->side[0].unit = 16 * MiB;
	v->side[1].unit = 1 * MiB;
}

static void test_decide(void)
{
	struct st_ledger_params p;
	struct st_ledger_view v;
	struct st_ledger_action a;
	uint64_t now = 100ull * 1000 * MS;

	memset(&p, 0, sizeof(p));
	p.dwell_ns = 500 * MS;
	p.timeout_ns = 5000 * MS;
	p.stale_ns = 3000 * MS;
	p.hysteresis = 0.25;
	p.min_gain = 1e5;

	/* by value: kv's gain 2e6 beats experts' loss 1e6 x 1.25 + 1e5 =
	 * 1.35e6 (less than twice: one step) */
	base_view(&v, now);
	v.side[1].gain = 2e6;
	v.side[0].loss = 1e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 0 && a.to == 1 &&
	      a.bytes == 512 * MiB && a.why == ST_LEDGER_WHY_VALUE &&
	      a.gain == 2e6 && a.loss == 1e6);
	/* 2.7e6 = twice the bar: two steps; 6e6 (4.4x): at most four */
	v.side[1].gain = 2.7e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.bytes == 1024 * MiB);
	v.side[1].gain = 6e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START &&
	      a.bytes == ST_LEDGER_MAX_STEPS * 512 * MiB);
	/* within the hysteresis: 1.3e6 < 1e6 x 1.25 + 1e5 = 1.35e6 */
	v.side[1].gain = 1.3e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	/* just above it */
	v.side[1].gain = 1.36e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 0);
	/* the other way, when experts value bytes more */
	base_view(&v, now);
	v.side[0].gain = 5e6;
	v.side[1].loss = 0;
	v.side[1].gain = 2e6;
	v.side[0].loss = 4e6; /* 2e6 < 4e6: no kv move */
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 1 && a.to == 0 &&
	      a.bytes == 4 * 512 * MiB); /* 5e6 / (0 + 1e5): four steps */
	/* the dwell: the last move 400 ms ago */
	v.last_move_ns = now - 400 * MS;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	v.last_move_ns = now - 600 * MS;
	/* stale values (one side reported 4 s ago): no move by value */
	v.side[1].value_ns = now - 4000 * MS;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	v.side[1].value_ns = now;
	/* a dead side: no move by value */
	v.side[1].live = 0;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	v.side[1].live = 1;
	/* the donor's floor cuts the step: kv at 1.25 GiB gives 256 MiB */
	v.side[1].target = 1 * GiB + 256 * MiB;
	v.side[0].target = 6 * GiB + 768 * MiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 1 &&
	      a.bytes == 256 * MiB);
	/* at the floor: nothing */
	v.side[1].target = 1 * GiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE || a.act == ST_LEDGER_ACT_GRANT);
	/* the receiver's cap cuts it; less than the larger unit: nothing */
	base_view(&v, now);
	v.side[0].gain = 5e6;
	v.side[0].cap = 4 * GiB + 8 * MiB; /* 8 MiB < its 16 MiB unit */
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	v.side[0].cap = 4 * GiB + 100 * MiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.bytes == 100 * MiB);

	/* pending: completes once the donor's used is within its target */
	base_view(&v, now);
	v.pending = 512 * MiB;
	v.pend_from = 0;
	v.pend_ns = now - 100 * MS;
	v.side[0].target = 3 * GiB + 512 * MiB;
	v.side[0].used = 4 * GiB;
	v.side[1].gain = 1e9; /* no new move while one is pending */
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	v.side[0].used = 3 * GiB + 512 * MiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_COMPLETE && a.from == 0 && a.to == 1 &&
	      a.bytes == 512 * MiB);
	/* ... or is cancelled when the donor could not shrink in time */
	v.side[0].used = 4 * GiB;
	v.pend_ns = now - 5001 * MS;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_CANCEL && a.from == 0 &&
	      a.bytes == 512 * MiB);

	/* unassigned bytes go to the side with the larger gain, to its cap */
	base_view(&v, now);
	v.side[0].target = 3 * GiB;
	v.side[1].target = 3 * GiB;
	v.side[0].gain = 1e6;
	v.side[1].gain = 2e6;
	v.side[1].cap = 4 * GiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_GRANT && a.to == 1 && a.bytes == 1 * GiB);
	/* not before both sides joined (cap 0: never joined) */
	v.side[0].cap = 0;
	v.side[0].live = 0;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act != ST_LEDGER_ACT_GRANT);

	/* a side over its target gets it at once, rounded up to the step,
	 * even inside the dwell and with no value */
	base_view(&v, now);
	v.last_move_ns = now - 1 * MS;
	v.side[1].over = 600 * MiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 0 && a.to == 1 &&
	      a.bytes == 1 * GiB && a.why == ST_LEDGER_WHY_OVER);

	/* a step below a unit of either side moves a unit (1 B: no move
	 * could ever be made) */
	base_view(&v, now);
	v.step = 1;
	v.side[1].gain = 2e6;
	v.side[0].loss = 1e6;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.bytes == 16 * MiB);

	/* flip mode: back and forth every flip_ns, ignoring the values */
	p.flip_ns = 50 * MS;
	base_view(&v, now);
	v.last_move_ns = now - 60 * MS;
	v.n_moves = 0;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 0 &&
	      a.why == ST_LEDGER_WHY_FLIP);
	v.n_moves = 1;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 1);
	v.last_move_ns = now - 10 * MS;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_NONE);
	/* a donor at its floor: the other direction */
	v.last_move_ns = now - 60 * MS;
	v.n_moves = 0;
	v.side[0].target = 1 * GiB;
	v.side[1].target = 7 * GiB;
	st_ledger_decide(&v, &p, now, &a);
	CHECK(a.act == ST_LEDGER_ACT_START && a.from == 1);
}

static void report(struct st_ledger *l, uint64_t used, double gain,
		   double loss)
{
	struct st_ledger_report r = { .used = used, .gain = gain,
				      .loss = loss };

	st_ledger_report(l, &r);
}

static int seg_exists(void)
{
	char path[256];

	snprintf(path, sizeof(path), "/dev/shm/strata.%s.%s", inst,
		 ST_LEDGER_KIND);
	return access(path, F_OK) == 0;
}

static void test_segment(void)
{
	struct st_diag d = { "" };
	struct st_ledger *e = NULL, *k = NULL, *x = NULL;
	struct st_ledger_view v;
	struct st_ledger_move m;
	uint64_t now;
	int r;

	/* the first side gets half, the second what is left */
	r = st_ledger_open(&e, inst, ST_LEDGER_EXPERTS, 8 * GiB, 1 * GiB,
			   6 * GiB, 16 * MiB, &d);
	CHECK(r == 0);
	if (r)
		return;
	CHECK(st_ledger_target(e) == 4 * GiB);
	CHECK(st_ledger_step(e) == 512 * MiB); /* total / 16 */
	/* another total while the experts side lives: refused */
	r = st_ledger_open(&x, inst, ST_LEDGER_KV, 6 * GiB, 1 * GiB, 6 * GiB,
			   MiB, &d);
	CHECK(r == -ST_E_CONFIG && strstr(d.msg, "--memory-budget"));
	/* floors above the total: refused, naming the minimum */
	r = st_ledger_open(&x, inst, ST_LEDGER_KV, 8 * GiB, 7500 * MiB,
			   8 * GiB, MiB, &d);
	{
		char least[32], want[64];

		st_format_bytes(7500 * MiB + 1 * GiB, least, sizeof(least));
		snprintf(want, sizeof(want), "at least %s", least);
		CHECK(r == -ST_E_BUDGET && strstr(d.msg, want));
	}
	/* the kv floor needs more than experts leave: experts give it */
	r = st_ledger_open(&k, inst, ST_LEDGER_KV, 8 * GiB, 5 * GiB, 8 * GiB,
			   MiB, &d);
	CHECK(r == 0);
	if (r) {
		st_ledger_close(e);
		return;
	}
	CHECK(st_ledger_target(k) == 5 * GiB && st_ledger_target(e) == 3 * GiB);

	/* a move in two phases: kv values bytes, experts hold them idle */
	now = st_now_ns();
	report(e, 3 * GiB, 0, 2e6);
	report(k, 5 * GiB, 4e6, 0);
	/* the first tick: the arbiter is due, the dwell since the start
	 * passed, kv's gain beats experts' loss: the move starts (not yet
	 * logged: kind 0) */
	CHECK(st_ledger_tick(e, now, &m) == 1 && m.kind == 0);
	st_ledger_view(e, &v);
	CHECK(v.pending == 512 * MiB && v.pend_from == ST_LEDGER_EXPERTS);
	CHECK(v.side[0].target == 3 * GiB - 512 * MiB &&
	      v.side[1].target == 5 * GiB); /* not yet given */
	/* the donor has not shrunk: nothing changes */
	CHECK(st_ledger_tick(k, now + 400 * MS, &m) == 0);
	CHECK(st_ledger_target(k) == 5 * GiB);
	/* it shrank: the receiver gets the bytes, the move is logged */
	report(e, 3 * GiB - 512 * MiB, 0, 2e6);
	CHECK(st_ledger_tick(e, now + 600 * MS, &m) == 1);
	CHECK(m.kind == ST_LEDGER_MOVE_DONE && m.from == 0 && m.to == 1 &&
	      m.bytes == 512 * MiB && m.gain == 4e6 && m.loss == 2e6 &&
	      m.target[1] == 5 * GiB + 512 * MiB);
	CHECK(st_ledger_target(k) == 5 * GiB + 512 * MiB);
	/* what a reader sees */
	r = st_ledger_read(inst, &v, &d);
	CHECK(r == 0);
	if (r == 0) {
		CHECK(v.total == 8 * GiB && v.n_log == 1 &&
		      v.log[0].kind == ST_LEDGER_MOVE_DONE);
		CHECK(v.side[0].moves_out == 1 && v.side[1].moves_in == 1 &&
		      v.side[1].bytes_in == 512 * MiB &&
		      v.side[0].bytes_out == 512 * MiB);
		CHECK(v.side[0].live && v.side[1].live);
		CHECK(v.side[1].gain == 4e6 && v.side[0].loss == 2e6);
	}

	/* a random walk of values and shrinking: the invariants hold (the
	 * arbiter runs every 100 ms of the clock given to st_ledger_tick;
	 * values count as fresh for 3 s of it after st_ledger_report's real
	 * time: 28 ticks 101 ms apart stay within that) */
	{
		uint64_t t = st_now_ns(), seed = 12345;
		int moves = 0, bad = 0;

		for (int i = 0; i < 28; i++) {
			struct st_ledger *who = (i & 1) ? k : e;
			uint64_t te, tk;

			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			/* each side reports used = its target (it shrank at
			 * once) and random values */
			te = st_ledger_target(e);
			tk = st_ledger_target(k);
			report(e, te, (double)((seed >> 20) % 8) * 1e6,
			       (double)((seed >> 30) % 8) * 1e6);
			report(k, tk, (double)((seed >> 40) % 8) * 1e6,
			       (double)((seed >> 50) % 8) * 1e6);
			t += 101 * MS;
			moves += st_ledger_tick(who, t, &m);
			st_ledger_view(e, &v);
			if (v.side[0].target + v.side[1].target +
				    v.pending > 8 * GiB ||
			    v.side[0].target < 1 * GiB ||
			    v.side[1].target < 5 * GiB ||
			    v.side[0].target > 6 * GiB ||
			    v.side[1].target > 8 * GiB)
				bad++;
		}
		CHECK(bad == 0);
		CHECK(moves > 5); /* values that differ make moves */
	}

	/* a side held by a live process is refused; taken once it died */
	{
		pid_t pid = fork();

		if (pid == 0) {
			struct st_ledger *c2 = NULL;
			struct st_diag d2 = { "" };

			/* the side record names the parent, alive */
			_exit(st_ledger_open(&c2, inst, ST_LEDGER_KV, 8 * GiB,
					     5 * GiB, 8 * GiB, MiB, &d2) ==
				      -EBUSY ? 0 : 1);
		} else if (pid > 0) {
			int st = 0;

			waitpid(pid, &st, 0);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		}
	}

	/* a segment scribbled over: the target stays within what the side
	 * joined with, and the arbiter leaves it alone */
	{
		char path[256];
		int fd;
		struct st_ledger_seg *g = MAP_FAILED;

		snprintf(path, sizeof(path), "/dev/shm/strata.%s.%s", inst,
			 ST_LEDGER_KIND);
		fd = open(path, O_RDWR);
		if (fd >= 0)
			g = mmap(NULL, sizeof(*g), PROT_READ | PROT_WRITE,
				 MAP_SHARED, fd, 0);
		CHECK(g != MAP_FAILED);
		if (g != MAP_FAILED) {
			uint64_t n0 = atomic_load(&g->n_moves);

			atomic_store(&g->side[0].target, 1ull << 62);
			atomic_store(&g->side[1].target, 3);
			/* experts: cap 6 GiB; kv: floor 5 GiB */
			CHECK(st_ledger_target(e) == 6 * GiB);
			CHECK(st_ledger_target(k) == 5 * GiB);
			report(e, 1 * GiB, 0, 0);
			report(k, 1 * GiB, 9e9, 0);
			CHECK(st_ledger_tick(e, st_now_ns() + 10000 * MS,
					     &m) == 0);
			CHECK(atomic_load(&g->n_moves) == n0 &&
			      atomic_load(&g->side[1].target) == 3);
			munmap(g, sizeof(*g));
		}
		if (fd >= 0)
			close(fd);
	}

	/* more than this machine's RAM is refused, naming it */
	{
		long pages = sysconf(_SC_PHYS_PAGES);
		long psz = sysconf(_SC_PAGESIZE);
		struct st_diag d2 = { "" };

		if (pages > 0 && psz > 0) {
			uint64_t ram = (uint64_t)pages * (uint64_t)psz;

			CHECK(st_ledger_check_total(ram + 4096, &d2) ==
				      -ST_E_BUDGET &&
			      strstr(d2.msg, "more than this machine's memory"));
			CHECK(st_ledger_check_total(ram / 2, &d2) == 0);
		}
	}

	/* the last close removes the segment */
	st_ledger_close(k);
	CHECK(seg_exists());
	st_ledger_close(e);
	CHECK(!seg_exists());
}

int main(void)
{
	st_test_instance("ledger", inst, sizeof(inst));
	unsetenv("STRATA_LEDGER_FLIP_MS");
	/* the walk in test_segment: no dwell between moves */
	setenv("STRATA_LEDGER_DWELL_MS", "1", 1);
	unsetenv("STRATA_LEDGER_STEP");
	test_decide();
	test_segment();
	if (failures)
		printf("%d check(s) failed\n", failures);
	else
		printf("ok\n");
	return failures ? 1 : 0;
}
