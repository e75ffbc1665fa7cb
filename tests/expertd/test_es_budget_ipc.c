/*
 * test_es_budget_ipc.c — a real expertd under one memory budget whose
 * split oscillates (issue 24 item 4), kjv-moe's MXFP4 store (96 records
 * of 40 KiB, 3.75 MiB):
 *
 *   expertd --memory-budget 4MiB, STRATA_LEDGER_FLIP_MS=50 and
 *   STRATA_LEDGER_STEP=50% (the experts' target swings between their
 *   floor, top-k = 2 slots, and about 53 slots); this process holds the
 *   KV side of the ledger (it obeys every target at once, reporting it as
 *   used, and runs the arbiter too) and is expertd's client: it keeps one
 *   expert pinned throughout and acquires and releases another of a
 *   random layer in a loop (two pinned at most: the experts' floor, one
 *   layer's top-k, holds them, so expertd never has to go over).
 *
 * Checks, from the pool segment itself (not from what expertd reports):
 *  - no pinned slot is ever evicted: every acquired record, and the held
 *    one at every turn, equal the store's record byte for byte;
 *  - the slots in use never stay above what the target allows for more
 *    than 250 ms while an unpinned READY slot could be evicted (a shrink
 *    settles), and shrinks are seen to settle;
 *  - the segment's allocated blocks follow the slots in use (never more
 *    than the tables plus the slots in use and two in flight), and drop
 *    by at least 16 records after a shrink from a full pool;
 *  - pages of EMPTY slots faulted in by a reader are given back again;
 *  - kill -9 of expertd in the middle of a shrink (--test-shrink-delay-ms
 *    20: the kill finds more slots in use than the target allows), and a
 *    restart with the same budget and --no-verify-adopted: the pool is
 *    adopted, every record it kept equals the store's (none with holes),
 *    the held pin and its record survive, the loop goes on, and the
 *    target is obeyed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "es_client.h"
#include "es_harness.h"
#include "st_ledger.h"
#include "st_util.h"
#include "test_util.h"

#define M_TEXT "4MiB"
#define M_BYTES (4ull << 20)
/* a shrink has this long to settle (expertd's tick is 50 ms) */
#define SETTLE_NS 250000000ull

static struct es_h H;

static int group_setup(void **state)
{
	/* expertd's log is checked (ES_BUDGET_DEBUG=1: debug) */
	setenv("STRATA_LOG", getenv("ES_BUDGET_DEBUG") ? "debug" : "info", 1);
	setenv("STRATA_LEDGER_FLIP_MS", "50", 1);
	setenv("STRATA_LEDGER_STEP", "50%", 1);
	return es_h_init(&H, "kjv-moe", "esbud") < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
	es_h_fini(&H);
	return 0;
}

/* What one run of the loop saw. */
struct obs {
	struct st_ledger *kv;     /* this process: the KV side */
	struct st_shm shm;        /* the pool, mapped for inspection */
	struct es_pool_view v;
	char seg_path[300];
	uint64_t head_bytes;      /* the segment's tables */
	/* settle tracking */
	uint64_t last_target, target_since, over_since;
	int want_settle;          /* the target dropped: a shrink is due */
	uint32_t settled, shrinks, acquires, max_used;
	long long max_blocks_used_high, min_blocks_after;
	int saw_drop;
};

static void obs_attach(struct obs *o)
{
	assert_int_equal(es_h_attach(&H, &o->shm, &o->v), 0);
	o->head_bytes = (uint64_t)(o->v.data - (uint8_t *)o->shm.base);
	snprintf(o->seg_path, sizeof(o->seg_path),
		 "/dev/shm/strata.%s.experts", H.inst);
}

static void obs_detach(struct obs *o)
{
	st_shm_detach(&o->shm);
}

/* The KV side's turn: it holds exactly its target, reports it, runs the
 * arbiter when due. */
static void kv_turn(struct obs *o)
{
	struct st_ledger_report r = { 0 };

	r.used = st_ledger_target(o->kv);
	st_ledger_report(o->kv, &r);
	st_ledger_tick(o->kv, st_now_ns(), NULL);
}

/* Slots not EMPTY, and of them unpinned READY ones. */
static uint32_t pool_used(const struct es_pool_view *v, uint32_t *evictable)
{
	uint32_t n = 0, e = 0;

	for (uint32_t s = 0; s < v->n_slots; s++) {
		uint32_t st = atomic_load(&v->slots[s].state);

		n += st != ES_SLOT_EMPTY;
		e += st == ES_SLOT_READY && es_slot_pin_sum(&v->slots[s]) == 0;
	}
	if (evictable)
		*evictable = e;
	return n;
}

static long long seg_blocks_bytes(const struct obs *o)
{
	struct stat st;

	assert_int_equal(stat(o->seg_path, &st), 0);
	return (long long)st.st_blocks * 512;
}

/* One look at the pool and the ledger (see the file's comment). */
static void observe(struct obs *o)
{
	struct st_ledger_view lv;
	uint64_t now = st_now_ns(), t;
	uint32_t allowed, used0, used1, evictable;
	long long blocks;

	st_ledger_view(o->kv, &lv);
	t = lv.side[ST_LEDGER_EXPERTS].target;
	allowed = (uint32_t)ST_MAX(t / H.record_bytes, (uint64_t)H.top_k);
	if (allowed > o->v.n_slots)
		allowed = o->v.n_slots;
	used0 = pool_used(&o->v, NULL);
	blocks = seg_blocks_bytes(o);
	used1 = pool_used(&o->v, &evictable);
	if (t != o->last_target) {
		o->want_settle = t < o->last_target;
		o->shrinks += t < o->last_target;
		o->last_target = t;
		o->target_since = now;
		o->over_since = 0;
	}
	if (used1 > o->max_used)
		o->max_used = used1;
	/* allocated pages: the tables, the slots in use and two in flight
	 * (a load assigned between the two counts) */
	if ((uint64_t)blocks >
	    o->head_bytes + (uint64_t)(ST_MAX(used0, used1) + 2) *
				    H.record_bytes) {
		fprintf(stderr, "segment holds %lld bytes, tables %llu + %u "
			"slots in use of %llu bytes\n", blocks,
			(unsigned long long)o->head_bytes, ST_MAX(used0, used1),
			(unsigned long long)H.record_bytes);
		fail();
	}
	if (used1 >= 20 && blocks > o->max_blocks_used_high)
		o->max_blocks_used_high = blocks;
	if (o->max_blocks_used_high && used1 <= 4 &&
	    o->max_blocks_used_high - blocks >=
		    (long long)(16 * H.record_bytes))
		o->saw_drop = 1;
	if (used1 <= allowed) {
		o->settled += o->want_settle;
		o->want_settle = 0;
		o->over_since = 0;
		return;
	}
	/* above the target: fine while it settles, or while everything
	 * in use is pinned or loading */
	if (!evictable) {
		o->over_since = 0;
		return;
	}
	if (!o->over_since)
		o->over_since = now;
	if (now - o->over_since > SETTLE_NS &&
	    now - o->target_since > SETTLE_NS) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		fprintf(stderr, "at %lld.%03ld: %u slots in use for %.0f ms, "
			"the target %llu allows %u, %u unpinned READY ones\n",
			(long long)ts.tv_sec, ts.tv_nsec / 1000000, used1,
			(double)(now - o->over_since) / 1e6,
			(unsigned long long)t, allowed, evictable);
		fail();
	}
}

static void check_record(const uint8_t *rec, int layer, int expert)
{
	if (memcmp(rec, es_h_ref(&H, layer, expert), H.record_bytes)) {
		fprintf(stderr, "layer %d expert %d: record differs from the "
			"store's\n", layer, expert);
		fail();
	}
}

/* The loop: random acquires of one expert of layers 1.. while layer 0's
 * expert 0 stays pinned; until deadline, or until `stop` returns true. */
static void churn(struct obs *o, struct es_client *c, const uint8_t *held,
		  uint64_t deadline, int (*stop)(struct obs *))
{
	struct st_diag diag = { "" };

	while (st_now_ns() < deadline) {
		int layer = 1 + rand() % (H.n_layers - 1);
		int id = rand() % H.n_experts, r;
		const uint8_t *rec;

		r = es_client_acquire(c, layer, 1, &id, &rec, &diag);
		if (r == -ST_E_BUSY) {
			kv_turn(o);
			continue;
		}
		if (r)
			fprintf(stderr, "acquire: %s\n", diag.msg);
		assert_int_equal(r, 0);
		check_record(rec, layer, id);
		es_client_release(c, layer, 1, &id);
		o->acquires++;
		check_record(held, 0, 0);
		kv_turn(o);
		observe(o);
		if (stop && stop(o))
			return;
	}
}

static void kv_open(struct obs *o)
{
	struct st_diag diag = { "" };
	int r = st_ledger_open(&o->kv, H.inst, ST_LEDGER_KV, M_BYTES, 0,
			       M_BYTES, 4096, &diag);

	if (r)
		fprintf(stderr, "%s\n", diag.msg);
	assert_int_equal(r, 0);
}

static void test_oscillate(void **state)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;
	struct st_ledger_view lv;
	struct obs o;
	const uint8_t *held;
	int id0 = 0;

	memset(&o, 0, sizeof(o));
	srand(1);
	assert_int_equal(es_h_start(&H, "--memory-budget", M_TEXT, NULL), 0);
	kv_open(&o);
	obs_attach(&o);
	assert_int_equal(o.v.n_slots, (uint32_t)(H.n_layers * H.n_experts));
	assert_int_equal(es_client_open(H.run_dir, H.inst, "budget",
					ES_H_TIMEOUT_MS, &c, &diag), 0);
	assert_int_equal(es_client_acquire(c, 0, 1, &id0, &held, &diag), 0);
	churn(&o, c, held, st_now_ns() + 4000000000ull, NULL);
	st_ledger_view(o.kv, &lv);
	printf("%u acquires, %u shrinks of the experts' target, %u settled, "
	       "most slots in use %u, %llu moves (%llu from experts, %llu "
	       "cancelled); segment held at most %lld bytes while full\n",
	       o.acquires, o.shrinks, o.settled, o.max_used,
	       (unsigned long long)lv.n_moves,
	       (unsigned long long)lv.side[ST_LEDGER_EXPERTS].moves_out,
	       (unsigned long long)lv.side[ST_LEDGER_EXPERTS].cancelled,
	       o.max_blocks_used_high);
	assert_true(o.acquires >= 50);
	assert_true(o.shrinks >= 5);
	assert_true(o.settled >= 3);
	assert_true(lv.side[ST_LEDGER_EXPERTS].moves_out >= 3);
	assert_true(o.max_used >= 20);
	assert_true(o.saw_drop);
	check_record(held, 0, 0);
	es_client_release(c, 0, 1, &id0);
	es_client_close(c);
	obs_detach(&o);
	st_ledger_close(o.kv);
	assert_int_equal(es_h_stop(&H), 0);
}

/* A move from the experts is under way. */
static int shrinking(struct obs *o)
{
	struct st_ledger_view lv;

	st_ledger_view(o->kv, &lv);
	return lv.pending && lv.pend_from == ST_LEDGER_EXPERTS &&
	       o->acquires >= 20;
}

/* Slots the experts' target allows now. */
static uint32_t allowed_now(struct obs *o)
{
	struct st_ledger_view lv;
	uint64_t n;

	st_ledger_view(o->kv, &lv);
	n = ST_MAX(lv.side[ST_LEDGER_EXPERTS].target / H.record_bytes,
		   (uint64_t)H.top_k);
	return (uint32_t)ST_MIN(n, (uint64_t)o->v.n_slots);
}

static void test_kill_mid_shrink(void **state)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;
	struct st_ledger_view lv;
	struct obs o;
	const uint8_t *held;
	int id0 = 0, killed = 0;
	uint32_t before, before_settled, used = 0, allowed = 0, kept = 0;
	char *log = NULL;

	memset(&o, 0, sizeof(o));
	srand(2);
	/* 20 ms in each eviction of a shrink: a shrink from ~50 slots to 2
	 * takes about a second, and the kill lands in it */
	assert_int_equal(es_h_start(&H, "--memory-budget", M_TEXT,
				    "--test-shrink-delay-ms", "20", NULL), 0);
	kv_open(&o);
	obs_attach(&o);
	assert_int_equal(es_client_open(H.run_dir, H.inst, "budget",
					ES_H_TIMEOUT_MS, &c, &diag), 0);
	es_client_set_restart_wait(c, 10000);
	assert_int_equal(es_client_acquire(c, 0, 1, &id0, &held, &diag), 0);
	for (int tries = 0; tries < 40 && !killed; tries++) {
		churn(&o, c, held, st_now_ns() + 2000000000ull, shrinking);
		if (!shrinking(&o))
			continue;
		/* expertd's next tick (50 ms) starts the slow shrink */
		for (int i = 0; i < 20; i++) {
			kv_turn(&o);
			st_sleep_ns(10000000);
		}
		used = pool_used(&o.v, NULL);
		allowed = allowed_now(&o);
		if (used > allowed + 4) {
			es_h_kill9(&H);
			killed = 1;
		}
	}
	assert_true(killed);
	printf("killed with %u slots in use, %u allowed: the shrink was cut "
	       "short\n", used, allowed);
	before = o.acquires;
	/* the KV side keeps the ledger going alone for a while */
	for (int i = 0; i < 10; i++) {
		kv_turn(&o);
		st_sleep_ns(20000000);
	}
	/* the successor keeps the pool's records without re-hashing them:
	 * any record with holes would be served as it is */
	assert_int_equal(es_h_start(&H, "--memory-budget", M_TEXT,
				    "--no-verify-adopted", NULL), 0);
	assert_int_equal(st_read_file(H.log, &log, NULL), 0);
	assert_non_null(strstr(log, "adopted pool"));
	free(log);
	for (uint32_t s = 0; s < o.v.n_slots; s++) {
		uint64_t key = atomic_load(&o.v.slots[s].key);

		if (atomic_load(&o.v.slots[s].state) != ES_SLOT_READY)
			continue;
		check_record(es_pool_record(&o.v, s), (int)es_key_layer(key),
			     (int)es_key_expert(key));
		kept++;
	}
	printf("%u records kept by the successor, each equal to the "
	       "store's\n", kept);
	assert_true(kept >= 1);
	/* the held record survived the kill and the adoption */
	check_record(held, 0, 0);
	before_settled = o.settled;
	/* the successor has SETTLE_NS from now to obey the target the
	 * killed one left */
	o.want_settle = 1;
	o.over_since = 0;
	o.target_since = st_now_ns();
	churn(&o, c, held, st_now_ns() + 2500000000ull, NULL);
	st_ledger_view(o.kv, &lv);
	printf("%u acquires after the restart, %u shrinks, %u settled; "
	       "experts' side pid %d live %d\n", o.acquires - before,
	       o.shrinks, o.settled, (int)lv.side[ST_LEDGER_EXPERTS].pid,
	       lv.side[ST_LEDGER_EXPERTS].live);
	assert_true(o.acquires - before >= 20);
	assert_int_equal(lv.side[ST_LEDGER_EXPERTS].pid, (int32_t)H.pid);
	assert_true(lv.side[ST_LEDGER_EXPERTS].live);
	assert_true(o.settled > before_settled);
	es_client_release(c, 0, 1, &id0);
	es_client_close(c);
	obs_detach(&o);
	st_ledger_close(o.kv);
	assert_int_equal(es_h_stop(&H), 0);
}

/* Pages of EMPTY slots that come back (a reader faulted them in) are
 * given back again by expertd's sweep. */
static void test_sweep(void **state)
{
	struct obs o;
	volatile uint8_t sink = 0;
	long long b0, b1, b2 = 0;
	uint32_t n = 0;
	uint64_t deadline;

	memset(&o, 0, sizeof(o));
	unsetenv("STRATA_LEDGER_FLIP_MS");
	assert_int_equal(es_h_start(&H, "--memory-budget", M_TEXT, NULL), 0);
	setenv("STRATA_LEDGER_FLIP_MS", "50", 1);
	obs_attach(&o);
	b0 = seg_blocks_bytes(&o);
	/* read every page of 8 EMPTY slots: tmpfs allocates them */
	for (uint32_t s = 0; s < o.v.n_slots && n < 8; s++) {
		const uint8_t *rec = es_pool_record(&o.v, s);

		if (atomic_load(&o.v.slots[s].state) != ES_SLOT_EMPTY)
			continue;
		for (uint64_t off = 0; off < H.record_bytes; off += 4096)
			sink ^= rec[off];
		n++;
	}
	b1 = seg_blocks_bytes(&o);
	printf("segment %lld bytes, %lld after reading 8 EMPTY slots "
	       "(sink %u)\n", b0, b1, (unsigned)sink);
	assert_int_equal(n, 8);
	assert_true(b1 - b0 >= (long long)(6 * H.record_bytes));
	deadline = st_now_ns() + 3000000000ull;
	while (st_now_ns() < deadline) {
		b2 = seg_blocks_bytes(&o);
		if (b2 <= b0)
			break;
		st_sleep_ns(20000000);
	}
	printf("given back: %lld bytes\n", b2);
	assert_true(b2 <= b0);
	obs_detach(&o);
	assert_int_equal(es_h_stop(&H), 0);
}

/* Bad budgets: refused at start with a message that says what to do. */
static void test_bad_budgets(void **state)
{
	struct st_diag diag = { "" };
	struct st_ledger *kv = NULL;
	char err[4096];

	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", "lots", NULL), 1);
	assert_non_null(strstr(err, "--memory-budget 'lots' is not a size: "
				    "give a number of bytes"));
	assert_non_null(strstr(err, "PiB"));
	/* 0: refused, not "off" */
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", "0", NULL), 1);
	assert_non_null(strstr(err, "--memory-budget 0: give a size, or "
				    "leave the option out"));
	/* more than the machine's RAM */
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", "100TiB", NULL), 1);
	assert_non_null(strstr(err, "more than this machine's memory"));
	/* 40 KiB records, top-k 2 */
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", "64KiB", NULL), 1);
	assert_non_null(strstr(err, "cannot hold one layer's top-k"));
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", "1MiB",
				       "--host-budget", "2MiB", NULL), 1);
	assert_non_null(strstr(err, "--host-budget 2MiB (the experts' floor"));
	assert_non_null(strstr(err, "lower --host-budget or raise "
				    "--memory-budget"));
	/* a live KV side with another budget */
	assert_int_equal(st_ledger_open(&kv, H.inst, ST_LEDGER_KV, 2 * M_BYTES,
					0, M_BYTES, 4096, &diag), 0);
	assert_int_equal(es_h_run_fail(&H, err, sizeof(err),
				       "--memory-budget", M_TEXT, NULL), 1);
	if (!strstr(err, "give this daemon the same --memory-budget"))
		fprintf(stderr, "stderr was: %s\n", err);
	assert_non_null(strstr(err, "cannot join the memory budget"));
	assert_non_null(strstr(err, "give this daemon the same "
				    "--memory-budget"));
	st_ledger_close(kv);
	/* what the refused ones made is gone: no pool segment, no pid file */
	{
		char path[300];
		struct stat st;

		snprintf(path, sizeof(path), "/dev/shm/strata.%s.experts",
			 H.inst);
		assert_int_not_equal(stat(path, &st), 0);
		es_h_path(&H, "pid", path, sizeof(path));
		assert_int_not_equal(stat(path, &st), 0);
	}
}

static int test_teardown(void **state)
{
	es_h_reset(&H);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_oscillate, test_teardown),
		cmocka_unit_test_teardown(test_kill_mid_shrink, test_teardown),
		cmocka_unit_test_teardown(test_sweep, test_teardown),
		cmocka_unit_test_teardown(test_bad_budgets, test_teardown),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
