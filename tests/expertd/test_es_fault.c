/*
 * test_es_fault.c — expertd under faults: a budget too small for one
 * layer, clients killed with pins held, expertd killed with SIGKILL and
 * restarted (PITFALLS P17: the segment is adopted, its experts kept, no
 * stale segments, a live owner's segment never removed), clean shutdown by
 * signal and by message, and a corrupt record in the store.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "es_client.h"
#include "es_harness.h"
#include "es_proto.h"
#include "st_msg.h"
#include "st_util.h"
#include "test_util.h"

static struct es_h H;
static const char *self_exe;

static int group_setup(void **state)
{
	return es_h_init(&H, "kjv-moe", "esfault") < 0 ? -1 : 0;
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

static struct es_client *open_client(const char *name, int timeout_ms)
{
	struct st_diag diag = { "" };
	struct es_client *c = NULL;
	int r = es_client_open(H.run_dir, H.inst, name, timeout_ms, &c, &diag);

	if (r < 0)
		fprintf(stderr, "es_client_open: %s (%s)\n", diag.msg,
			st_strerror(r));
	assert_int_equal(r, 0);
	return c;
}

static void acquire_check(struct es_client *c, int layer, int n,
			  const int *ids)
{
	const uint8_t *rec[16];
	struct st_diag diag = { "" };
	int r = es_client_acquire(c, layer, n, ids, rec, &diag);

	if (r)
		fprintf(stderr, "acquire: %s\n", diag.msg);
	assert_int_equal(r, 0);
	for (int i = 0; i < n; i++)
		assert_memory_equal(rec[i], es_h_ref(&H, layer, ids[i]),
				    H.record_bytes);
}

static uint64_t loads_of(struct es_client *c)
{
	struct es_stats s;

	assert_int_equal(es_client_stats(c, &s), 0);
	return s.loads;
}

static int file_exists(const char *suffix)
{
	char p[700];

	return st_path_exists(es_h_path(&H, suffix, p, sizeof(p)));
}

/* 1. A budget below one layer's top-k: a clear error, nothing left. */
static void test_budget_too_small(void **state)
{
	char err[4096], want[200], one[32];
	int code;

	snprintf(one, sizeof(one), "%llu",
		 (unsigned long long)H.record_bytes);
	snprintf(want, sizeof(want),
		 "--host-budget must hold at least %d experts = %llu bytes",
		 H.top_k, (unsigned long long)(H.top_k * H.record_bytes));
	code = es_h_run_fail(&H, err, sizeof(err), "--host-budget", one, NULL);
	assert_int_equal(code, 1);
	if (!strstr(err, want))
		fprintf(stderr, "stderr was: %s\nwanted: %s\n", err, want);
	assert_non_null(strstr(err, want));
	code = es_h_run_fail(&H, err, sizeof(err), "--host-budget", "1%", NULL);
	assert_int_equal(code, 1);
	assert_non_null(strstr(err, want));
	code = es_h_run_fail(&H, err, sizeof(err), "--host-budget", "lots",
			     NULL);
	assert_int_equal(code, 1);
	assert_non_null(strstr(err, "--host-budget 'lots'"));
	code = es_h_run_fail(&H, err, sizeof(err), "--host-budget", "150%",
			     NULL);
	assert_int_equal(code, 1);
	assert_int_equal(es_h_count_segments(&H), 0);
	assert_false(file_exists("pid"));
	assert_false(file_exists("ctl"));
	/* exactly top-k experts is enough */
	snprintf(one, sizeof(one), "%llu",
		 (unsigned long long)(H.top_k * H.record_bytes));
	assert_int_equal(es_h_start(&H, "--host-budget", one, NULL), 0);
	assert_int_equal(es_h_stop(&H), 0);
	/* command-line mistakes */
	code = es_h_run_fail(&H, err, sizeof(err), "--bogus", NULL);
	assert_int_equal(code, 2);
	assert_non_null(strstr(err, "expertd --help"));
	code = es_h_run_fail(&H, err, sizeof(err), "--loader-threads", "0",
			     NULL);
	assert_int_equal(code, 2);
	code = es_h_run_fail(&H, err, sizeof(err), "--instance", "bad/name",
			     NULL);
	assert_int_equal(code, 2);
	code = es_h_run_fail(&H, err, sizeof(err), "--help", NULL);
	assert_int_equal(code, 0);
	assert_non_null(strstr(err, "--host-budget"));
}

/* Child mode: open a client, pin experts of a layer, say so, wait. */
static int child_pin(int argc, char **argv)
{
	struct es_client *c = NULL;
	struct st_diag diag = { "" };
	const uint8_t *rec[8];
	int ids[8], n = argc - 5, layer = atoi(argv[4]);

	if (n < 1 || n > 8)
		return 2;
	for (int i = 0; i < n; i++)
		ids[i] = atoi(argv[5 + i]);
	if (es_client_open(argv[2], argv[3], "child", ES_H_TIMEOUT_MS, &c,
			   &diag) < 0 ||
	    es_client_acquire(c, layer, n, ids, rec, &diag) < 0) {
		fprintf(stderr, "child: %s\n", diag.msg);
		return 1;
	}
	printf("ok %u\n", es_client_id(c));
	fflush(stdout);
	for (;;)
		pause();
}

/* 2. A client killed with pins held: expertd releases them. */
static void test_killed_client(void **state)
{
	char budget[32], line[64] = "";
	int pipefd[2], e2 = 2;
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	const uint8_t *rec;
	struct st_diag diag = { "" };
	struct es_stats s;
	uint32_t child_id = 0;
	pid_t child;
	FILE *f;
	int r = -1;

	snprintf(budget, sizeof(budget), "%llu",
		 (unsigned long long)(2 * H.record_bytes));
	assert_int_equal(es_h_start(&H, "--host-budget", budget, NULL), 0);
	assert_int_equal(pipe(pipefd), 0);
	child = fork();
	if (child == 0) {
		const char *argv[] = { self_exe, "--child-pin", H.run_dir,
				       H.inst, "0", "0", "1", NULL };

		dup2(pipefd[1], 1);
		close(pipefd[0]);
		execv(self_exe, (char *const *)argv);
		_exit(127);
	}
	close(pipefd[1]);
	f = fdopen(pipefd[0], "r");
	assert_non_null(fgets(line, sizeof(line), f));
	fclose(f);
	assert_int_equal(sscanf(line, "ok %u", &child_id), 1);

	/* Both slots pinned by the child: nothing else fits. */
	c = open_client("parent", ES_H_TIMEOUT_MS);
	assert_int_equal(es_client_acquire(c, 0, 1, &e2, &rec, &diag),
			 -ST_E_BUSY);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	for (uint32_t i = 0; i < v.n_slots; i++)
		assert_int_equal(atomic_load(&v.slots[i].pins[es_client_id_index(
					 child_id)]), 1);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_int_equal(s.n_clients, 2);

	/* kill -9; do not reap yet: a zombie must count as dead too */
	kill(child, SIGKILL);
	for (int i = 0; i < 300 && r != 0; i++) {
		r = es_client_acquire(c, 0, 1, &e2, &rec, &diag);
		if (r)
			st_sleep_ns(10000000);
	}
	assert_int_equal(r, 0);
	assert_memory_equal(rec, es_h_ref(&H, 0, 2), H.record_bytes);
	for (uint32_t i = 0; i < v.n_slots; i++)
		assert_int_equal(atomic_load(&v.slots[i].pins[es_client_id_index(
					 child_id)]), 0);
	assert_int_equal(atomic_load(&v.clients[es_client_id_index(child_id)]
					      .pid), 0);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_int_equal(s.n_clients, 1);
	/* the dead client's id is stale now (a new generation reuses it) */
	{
		struct st_sock sk;
		char ctl[700];
		struct st_wbuf w;
		void *buf = NULL;
		const uint8_t *p;
		size_t len;
		int ids[1] = { 3 };

		assert_int_equal(st_sock_open(&sk, ST_SOCK_REQ,
					      es_h_path(&H, "ctl", ctl,
							sizeof(ctl)),
					      2000, 2000), 0);
		st_wbuf_init(&w);
		es_acquire_req_encode(&w, (uint32_t)child, 0, 1, ids);
		r = st_rpc_call(&sk, ES_MSG_ACQUIRE, 1, child_id, w.data,
				w.len, &buf, &p, &len);
		assert_int_equal(r, -ST_E_NOTFOUND);
		free(buf);
		st_wbuf_fini(&w);
		st_sock_close(&sk);
	}
	waitpid(child, NULL, 0);
	es_client_release(c, 0, 1, &e2);
	st_shm_detach(&shm);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

struct bg_acquire {
	struct es_client *c;
	int layer, expert;
	int r;
};

static void *bg_acquire_main(void *arg)
{
	struct bg_acquire *b = arg;
	struct st_diag diag = { "" };
	const uint8_t *rec;

	b->r = es_client_acquire(b->c, b->layer, 1, &b->expert, &rec, &diag);
	return NULL;
}

/* 3. PITFALLS P17: kill -9 with a populated pool, start again. */
static void test_restart_adopt(void **state)
{
	struct es_client *a, *b;
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };
	const uint8_t *rec0, *rec;
	int ids[4] = { 0, 1, 2, 3 }, e7 = 7, e9 = 9;
	uint64_t loads;
	int32_t s0, s9;
	int aidx;

	assert_int_equal(es_h_start(&H, NULL), 0);
	a = open_client("survivor", 1000);
	aidx = (int)es_client_id_index(es_client_id(a));
	acquire_check(a, 0, 4, ids);
	es_client_release(a, 0, 3, ids + 1); /* keeps expert 0 pinned */
	assert_int_equal(es_client_acquire(a, 0, 1, ids, &rec0, &diag), 0);
	es_client_release(a, 0, 1, ids);
	loads = loads_of(a);
	assert_true(loads == 4);

	es_h_kill9(&H);
	assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
	/* expertd is down: resident experts still hit on the fast path, a
	 * miss reports the dead peer */
	acquire_check(a, 0, 2, ids + 1);
	es_client_release(a, 0, 2, ids + 1);
	assert_int_equal(es_client_acquire(a, 0, 1, &e7, &rec, &diag),
			 -ST_E_PEERGONE);

	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	assert_int_equal(atomic_load(&v.shm->owner_pid), H.pid);
	assert_true(atomic_load(&v.shm->epoch) == 2);
	/* the survivor's pin and its record are intact */
	s0 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 0)]);
	assert_true(s0 >= 0);
	assert_int_equal(atomic_load(&v.slots[s0].pins[aidx]), 1);
	assert_memory_equal(rec0, es_h_ref(&H, 0, 0), H.record_bytes);

	/* a new client hits the kept experts without a reload */
	b = open_client("after", ES_H_TIMEOUT_MS);
	acquire_check(b, 0, 4, ids);
	es_client_release(b, 0, 4, ids);
	assert_true(loads_of(b) == loads);
	{
		struct es_stats s;

		assert_int_equal(es_client_stats(b, &s), 0);
		assert_true(s.epoch == 2);
		assert_int_equal(s.n_clients, 2); /* the survivor is kept */
	}
	/* the survivor keeps working through the restarted daemon */
	acquire_check(a, 0, 1, &e7);
	es_client_release(a, 0, 1, &e7);
	assert_true(loads_of(a) == loads + 1);
	es_client_release(a, 0, 1, ids);
	assert_int_equal(atomic_load(&v.slots[s0].pins[aidx]), 0);
	st_shm_detach(&shm);

	/* A load in flight when expertd dies is discarded on restart. */
	es_h_kill9(&H);
	assert_int_equal(es_h_start(&H, "--test-load-delay-ms", "3000", NULL),
			 0);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	{
		struct bg_acquire bg = { b, 0, 9, 1 };
		pthread_t th;

		assert_int_equal(pthread_create(&th, NULL, bg_acquire_main,
						&bg), 0);
		for (int i = 0; i < 2000; i++) {
			s9 = atomic_load(&v.slot_of[es_pool_index(&v, 0, 9)]);
			if (s9 >= 0)
				break;
			st_sleep_ns(1000000);
		}
		assert_true(s9 >= 0);
		assert_int_equal(atomic_load(&v.slots[s9].state),
				 ES_SLOT_LOADING);
		es_h_kill9(&H);
		pthread_join(th, NULL);
		assert_int_equal(bg.r, -ST_E_PEERGONE);
	}
	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_true(atomic_load(&v.shm->epoch) == 4);
	assert_int_equal(atomic_load(&v.slot_of[es_pool_index(&v, 0, 9)]), -1);
	assert_int_equal(atomic_load(&v.slots[s9].state), ES_SLOT_EMPTY);
	assert_int_equal(es_slot_pin_sum(&v.slots[s9]), 0);
	for (uint32_t i = 0; i < v.n_slots; i++)
		assert_true(atomic_load(&v.slots[i].state) == ES_SLOT_EMPTY ||
			    atomic_load(&v.slots[i].state) == ES_SLOT_READY);
	acquire_check(b, 0, 1, &e9);
	es_client_release(b, 0, 1, &e9);
	st_shm_detach(&shm);
	es_client_close(a);
	es_client_close(b);
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_count_segments(&H), 0);
}

/* 4. Ten kill/restart cycles: one segment, the new owner's, kept data. */
static void test_restart_cycles(void **state)
{
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	int ids[3] = { 4, 5, 6 };
	uint64_t loads;

	assert_int_equal(es_h_start(&H, "--host-budget", "50%", NULL), 0);
	c = open_client("cycles", ES_H_TIMEOUT_MS);
	acquire_check(c, 3, 3, ids);
	es_client_release(c, 3, 3, ids);
	loads = loads_of(c);
	es_client_close(c);
	for (int i = 0; i < 10; i++) {
		es_h_kill9(&H);
		assert_int_equal(es_h_start(&H, "--host-budget", "50%", NULL),
				 0);
		assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
		assert_int_equal(es_h_attach(&H, &shm, &v), 0);
		assert_int_equal(atomic_load(&v.shm->owner_pid), H.pid);
		assert_true(atomic_load(&v.shm->epoch) == (uint64_t)i + 2);
		st_shm_detach(&shm);
		c = open_client("cycles", ES_H_TIMEOUT_MS);
		acquire_check(c, 3, 3, ids);
		es_client_release(c, 3, 3, ids);
		assert_true(loads_of(c) == loads);
		es_client_close(c);
	}
	/* a different budget is a different geometry: the old segment is
	 * replaced, not adopted */
	es_h_kill9(&H);
	assert_int_equal(es_h_start(&H, "--host-budget", "25%", NULL), 0);
	assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	assert_true(atomic_load(&v.shm->epoch) == 1);
	assert_int_equal(atomic_load(&v.shm->owner_pid), H.pid);
	st_shm_detach(&shm);
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_count_segments(&H), 0);
}

/* 5. A live owner's segment is never taken or removed. */
static void test_live_owner_refused(void **state)
{
	char err[4096], other[700];
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	int ids[2] = { 0, 1 };
	pid_t first;
	int code;

	assert_int_equal(es_h_start(&H, NULL), 0);
	first = H.pid;
	c = open_client("first", ES_H_TIMEOUT_MS);
	acquire_check(c, 1, 2, ids);
	snprintf(other, sizeof(other), "%s/other-run", H.tmp);
	code = es_h_run_fail(&H, err, sizeof(err), "--run-dir", other, NULL);
	assert_int_equal(code, 1);
	assert_non_null(strstr(err, "another expertd is serving instance"));
	/* same run directory: refused by the pid file */
	code = es_h_run_fail(&H, err, sizeof(err), NULL);
	assert_int_equal(code, 1);
	assert_non_null(strstr(err, "already serving"));
	/* untouched: same owner, same epoch, still serving */
	assert_int_equal(es_h_count_segments(&H), ES_H_SEGMENTS);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	assert_int_equal(atomic_load(&v.shm->owner_pid), first);
	assert_true(atomic_load(&v.shm->epoch) == 1);
	st_shm_detach(&shm);
	acquire_check(c, 1, 2, ids); /* hits: no reload */
	es_client_release(c, 1, 2, ids);
	es_client_release(c, 1, 2, ids);
	ids[0] = 9;
	acquire_check(c, 1, 1, ids);
	es_client_release(c, 1, 1, ids);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
	st_rm_rf(other);
}

/* 6. SIGTERM and SHUTDOWN remove the segment, sockets and pid file, and
 * subscribers hear it. */
static void test_clean_shutdown(void **state)
{
	struct es_client *c;
	struct st_sock sub;
	char evt[700];
	int ids[2] = { 3, 4 };
	int st = 0, got_shutdown = 0;

	assert_int_equal(es_h_start(&H, NULL), 0);
	c = open_client("term", ES_H_TIMEOUT_MS);
	acquire_check(c, 2, 2, ids);
	assert_true(file_exists("ctl") && file_exists("evt") &&
		    file_exists("pid"));
	assert_int_equal(es_h_stop(&H), 0);
	assert_int_equal(es_h_count_segments(&H), 0);
	assert_false(file_exists("ctl"));
	assert_false(file_exists("evt"));
	assert_false(file_exists("pid"));
	es_client_release(c, 2, 2, ids);
	es_client_close(c); /* peer gone: must not hang */

	assert_int_equal(es_h_start(&H, NULL), 0);
	assert_int_equal(st_sock_open(&sub, ST_SOCK_SUB,
				      es_h_path(&H, "evt", evt, sizeof(evt)),
				      1000, 2000), 0);
	assert_int_equal(st_sock_subscribe_all(&sub), 0);
	st_sleep_ns(200000000); /* let the subscription reach the PUB */
	c = open_client("shutdown", ES_H_TIMEOUT_MS);
	assert_int_equal(es_client_shutdown(c), 0);
	for (int i = 0; i < 5 && !got_shutdown; i++) {
		struct st_msg_header h;
		void *buf;
		size_t len;
		uint32_t pid;
		uint64_t epoch;

		if (st_sock_recv(&sub, &buf, &len) < 0)
			break;
		if (st_proto_decode_header(buf, len, &h) == 0 &&
		    h.type == ES_EVT_SHUTDOWN &&
		    es_event_decode((uint8_t *)buf + 32, h.payload_len, &pid,
				    &epoch) == 0) {
			got_shutdown = 1;
			assert_int_equal(pid, H.pid);
			assert_true(epoch == 1);
		}
		free(buf);
	}
	assert_true(got_shutdown);
	st_sock_close(&sub);
	assert_int_equal(waitpid(H.pid, &st, 0), H.pid);
	H.pid = 0;
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	assert_int_equal(es_h_count_segments(&H), 0);
	assert_false(file_exists("ctl"));
	assert_false(file_exists("pid"));
	es_client_close(c);
}

/* 7. A corrupt record: -ST_E_CHECKSUM naming it, logged once, the daemon
 * keeps serving. */
static void test_checksum_failure(void **state)
{
	char path[1024];
	struct es_client *c;
	struct es_stats s;
	struct st_diag diag = { "" };
	const uint8_t *rec[2];
	int ids[2] = { 2, 3 }, e4 = 4, e3 = 3, fd;
	uint64_t off = 3 * H.record_bytes + 100, loads;
	uint8_t byte, flipped;
	char *log = NULL, *p;
	int n_logged = 0;

	st_store_path(H.st, H.st->expert_files[1], path, sizeof(path));
	chmod(path, 0644);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &byte, 1, (off_t)off), 1);
	flipped = byte ^ 0x40;
	assert_int_equal(pwrite(fd, &flipped, 1, (off_t)off), 1);

	assert_int_equal(es_h_start(&H, NULL), 0);
	c = open_client("corrupt", ES_H_TIMEOUT_MS);
	assert_int_equal(es_client_acquire(c, 1, 2, ids, rec, &diag),
			 -ST_E_CHECKSUM);
	assert_non_null(strstr(diag.msg, "expert 3"));
	assert_non_null(strstr(diag.msg, "experts-001.bin"));
	assert_non_null(strstr(diag.msg, "strata convert"));
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.checksum_failures == 1);
	/* still serving */
	acquire_check(c, 1, 1, &e4);
	es_client_release(c, 1, 1, &e4);
	/* nothing of the failed call stays pinned: 2 is evictable */
	{
		struct st_shm shm;
		struct es_pool_view v;
		int32_t s2;

		assert_int_equal(es_h_attach(&H, &shm, &v), 0);
		s2 = atomic_load(&v.slot_of[es_pool_index(&v, 1, 2)]);
		assert_true(s2 >= 0);
		assert_int_equal(es_slot_pin_sum(&v.slots[s2]), 0);
		st_shm_detach(&shm);
	}
	/* asked again: refused at once with the file named, not re-read */
	loads = loads_of(c);
	assert_int_equal(es_client_acquire(c, 1, 1, &e3, rec, &diag),
			 -ST_E_CHECKSUM);
	assert_non_null(strstr(diag.msg, "experts-001.bin"));
	assert_non_null(strstr(diag.msg, "checksum"));
	assert_true(loads_of(c) == loads);
	assert_int_equal(es_client_stats(c, &s), 0);
	assert_true(s.checksum_failures == 1);
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
	/* logged exactly once */
	assert_int_equal(st_read_file(H.log, &log, NULL), 0);
	for (p = strtok(log, "\n"); p; p = strtok(NULL, "\n"))
		n_logged += strstr(p, " error: ") &&
			    strstr(p, "record 3 (layer 1, expert 3)");
	free(log);
	assert_int_equal(n_logged, 1);
	assert_int_equal(pwrite(fd, &byte, 1, (off_t)off), 1);
	close(fd);
}

/* 8. slot_of lies in a segment clients map writable: a value outside the
 * slots (a buggy or hostile client wrote it) is not resident, never an
 * index into the slot table (issue 26). */
static void test_bad_slot_of(void **state)
{
	struct es_client *c;
	struct st_shm shm;
	struct es_pool_view v;
	int ids[2] = { 1, 2 };
	int32_t s;

	assert_int_equal(es_h_start(&H, NULL), 0);
	c = open_client("bad-index", ES_H_TIMEOUT_MS);
	assert_int_equal(es_h_attach(&H, &shm, &v), 0);
	atomic_store(&v.slot_of[es_pool_index(&v, 0, 1)], 1 << 29);
	atomic_store(&v.slot_of[es_pool_index(&v, 0, 2)],
		     (int32_t)v.n_slots);
	acquire_check(c, 0, 2, ids);             /* loaded, right bytes */
	for (int i = 0; i < 2; i++) {
		s = atomic_load(&v.slot_of[es_pool_index(&v, 0, ids[i])]);
		assert_true(s >= 0 && (uint32_t)s < v.n_slots);
	}
	es_client_release(c, 0, 2, ids);
	st_shm_detach(&shm);
	assert_true(st_pid_alive(H.pid));        /* expertd survived */
	es_client_close(c);
	assert_int_equal(es_h_stop(&H), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_budget_too_small, test_teardown),
		cmocka_unit_test_teardown(test_killed_client, test_teardown),
		cmocka_unit_test_teardown(test_restart_adopt, test_teardown),
		cmocka_unit_test_teardown(test_restart_cycles, test_teardown),
		cmocka_unit_test_teardown(test_live_owner_refused,
					  test_teardown),
		cmocka_unit_test_teardown(test_clean_shutdown, test_teardown),
		cmocka_unit_test_teardown(test_checksum_failure, test_teardown),
		cmocka_unit_test_teardown(test_bad_slot_of, test_teardown),
	};

	if (argc > 1 && !strcmp(argv[1], "--child-pin"))
		return child_pin(argc, argv);
	self_exe = "/proc/self/exe";
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
