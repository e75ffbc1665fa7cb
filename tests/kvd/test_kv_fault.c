/*
 * test_kv_fault.c — kvd under faults (suite fault): a client killed with
 * SIGKILL has its sequences released; kvd killed with SIGKILL and started
 * again adopts its pool (PITFALLS P17: one segment, epoch bumped, sequences
 * and rows kept, ten cycles leave nothing stale, a live owner is never
 * displaced, SIGTERM removes everything); segments with a wrong magic or
 * layout version give clear errors and are never used; spilled pages and
 * the prefix cache survive a kill -9 of kvd (the spill file is kept and
 * its slot records are in the segment), and when the spill file is lost
 * only the sequences that had pages in it fail, cleanly, as soon as the
 * restarted kvd adopts the pool (every slot freed, the failure named).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "kv_test_util.h"
#include "test_util.h"
#include "st_shm.h"
#include "st_util.h"

#define TIMEOUT_MS 3000

static const uint32_t rb1[1] = { 64 };
static const uint32_t rb2[2] = { 32, 96 };

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

static int setup(void **state)
{
	static int n;
	struct kvd_inst *k = kvd_fixture_new("flt", n++);

	if (!k)
		return -1;
	*state = k;
	return 0;
}

static int teardown(void **state)
{
	return kvd_fixture_teardown(state);
}

static struct kv_client *open_client(struct kvd_inst *k, const char *name,
				     int timeout_ms)
{
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };
	int r = kv_client_open(k->run_dir, k->name, name, timeout_ms, &c, &d);

	if (r < 0)
		fprintf(stderr, "kv_client_open: %s\n", d.msg);
	assert_int_equal(r, 0);
	return c;
}

/* Maps the first page of the instance's kv segment (NULL if none). */
static struct st_shm_header *map_header(const char *inst)
{
	char name[128];
	void *p;
	int fd;

	snprintf(name, sizeof(name), "/strata.%s.kv", inst);
	fd = shm_open(name, O_RDWR, 0);
	if (fd < 0)
		return NULL;
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

/* ---- a killed client --------------------------------------------------- */

/* The client to be killed: 3 sequences of 9 rows, then "R" on stdout. */
static int child_hold(const char *run_dir, const char *inst)
{
	struct kv_client *c;
	struct st_diag d;
	uint32_t seqs[3], rows[3] = { 9, 9, 9 };

	if (kv_client_open(run_dir, inst, "doomed", TIMEOUT_MS, &c, &d) < 0 ||
	    kv_client_declare(c, 1, rb1, 4, &d) < 0)
		return 10;
	for (int i = 0; i < 3; i++)
		if (kv_client_seq_create(c, &seqs[i], &d) < 0)
			return 11;
	if (kv_client_seq_reserve(c, 3, seqs, rows, &d) < 0)
		return 12;
	if (write(1, "R", 1) != 1)
		return 13;
	for (;;)
		pause();
}

static pid_t spawn_holder(struct kvd_inst *k)
{
	int fds[2];
	pid_t pid;
	char b = 0;
	struct pollfd pfd;

	assert_int_equal(pipe(fds), 0);
	pid = fork();
	if (pid == 0) {
		char *argv[] = { "test_kv_fault", "--child-hold", k->run_dir,
				 k->name, NULL };

		dup2(fds[1], 1);
		close(fds[0]);
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(fds[1]);
	pfd = (struct pollfd){ .fd = fds[0], .events = POLLIN };
	assert_int_equal(poll(&pfd, 1, 5000), 1);
	assert_int_equal(read(fds[0], &b, 1), 1);
	assert_int_equal(b, 'R');
	close(fds[0]);
	return pid;
}

/* Waits (up to 3 s) until kvd reports n_seqs sequences and pages_used. */
static int wait_for(struct kv_client *c, uint64_t n_seqs, uint64_t pages,
		    uint32_t n_clients)
{
	uint64_t t0 = st_now_ns();
	struct kv_stats st;

	while (st_now_ns() - t0 < 3000000000ull) {
		if (kv_client_stats(c, &st) == 0 && st.n_seqs == n_seqs &&
		    st.pages_used == pages && st.n_clients == n_clients)
			return 0;
		st_sleep_ns(20 * 1000 * 1000);
	}
	return -1;
}

static void test_killed_client(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	struct kv_stats st;
	struct st_diag d;
	uint32_t mine, n5 = 5;
	pid_t holder;
	uint64_t t0;

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_client(k, "survivor", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(c, 1, rb1, 4, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &mine, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &mine, &n5, &d), 0);
	for (int round = 0; round < 2; round++) {
		holder = spawn_holder(k);
		assert_int_equal(kv_client_stats(c, &st), 0);
		assert_int_equal(st.n_seqs, 1 + 3);
		assert_int_equal(st.pages_used, 2 + 3 * 3);
		assert_int_equal(st.n_clients, 2);
		kill(holder, SIGKILL);
		t0 = st_now_ns();
		/* round 0: left a zombie (nobody reaped it yet); round 1:
		 * reaped at once */
		if (round == 1)
			waitpid(holder, NULL, 0);
		assert_int_equal(wait_for(c, 1, 2, 1), 0);
		/* pid watch every ~100 ms: well under a second */
		assert_true(st_now_ns() - t0 < 1000000000ull);
		if (round == 0)
			waitpid(holder, NULL, 0);
	}
	assert_int_equal(kv_client_seq_rows(c, mine), 5);
	/* the client dies while kvd is down: the restarted kvd, which only
	 * knows it from the pool's sequence entries, releases its pages */
	holder = spawn_holder(k);
	kvd_kill(k, SIGKILL);
	kill(holder, SIGKILL);
	waitpid(holder, NULL, 0);
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(wait_for(c, 1, 2, 1), 0);
	assert_int_equal(kv_client_seq_rows(c, mine), 5);
	kv_client_close(c);
}

/* ---- P17: kill -9 kvd, start it again ---------------------------------- */

static void check_rows(struct kv_client *c, uint32_t seq, uint32_t rows,
		       uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < rows; r++) {
			const uint8_t *p = kv_client_row(c, seq, (int)s, r);

			assert_non_null(p);
			for (uint32_t i = 0; i < rb2[s]; i++)
				assert_int_equal(p[i], pattern(tag, s, r, i));
		}
}

static void write_rows(struct kv_client *c, uint32_t seq, uint32_t from,
		       uint32_t to, uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = from; r < to; r++) {
			uint8_t *p = kv_client_row(c, seq, (int)s, r);

			assert_non_null(p);
			for (uint32_t i = 0; i < rb2[s]; i++)
				p[i] = pattern(tag, s, r, i);
		}
}

/* Files in the run directory other than kvd's three. */
static int stray_files(const char *run_dir, int *ret_kvd)
{
	DIR *dir = opendir(run_dir);
	struct dirent *e;
	int stray = 0, kvd = 0;

	assert_non_null(dir);
	while ((e = readdir(dir))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!strcmp(e->d_name, "kvd.ctl") ||
		    !strcmp(e->d_name, "kvd.evt") ||
		    !strcmp(e->d_name, "kvd.pid"))
			kvd++;
		else
			stray++;
	}
	closedir(dir);
	*ret_kvd = kvd;
	return stray;
}

static void test_restart(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c, *idle, *fresh;
	struct st_shm_header *h;
	struct kv_stats st;
	struct st_diag d;
	uint32_t seq, child, n9 = 9, rows = 9;
	uint64_t epoch;
	char other_dir[4096];
	int32_t pid;
	int n_kvd, status;

	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_client(k, "worker", TIMEOUT_MS);
	idle = open_client(k, "idle", TIMEOUT_MS); /* owns no sequence */
	assert_int_equal(kv_client_declare(c, 2, rb2, 4, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &seq, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &n9, &d), 0);
	write_rows(c, seq, 0, 9, 1);
	assert_int_equal(kv_client_seq_fork(c, seq, 6, &child, &d), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	epoch = st.epoch;
	assert_int_equal(epoch, 1);

	for (int cycle = 1; cycle <= 10; cycle++) {
		int32_t old = k->pid;

		kvd_kill(k, SIGKILL);
		assert_int_equal(kvd_count_segments(k->name), 1);
		assert_int_equal(kvd_start(k, NULL), 0);
		assert_int_not_equal(k->pid, old);
		/* exactly one segment, owned by the new kvd, epoch bumped */
		assert_int_equal(kvd_count_segments(k->name), 1);
		h = map_header(k->name);
		assert_non_null(h);
		assert_int_equal(atomic_load(&h->owner_pid), k->pid);
		assert_int_equal(atomic_load(&h->epoch), epoch + 1);
		munmap(h, 4096);
		assert_int_equal(kvd_ping(k->run_dir, 1000, &pid, &epoch), 0);
		assert_int_equal(pid, k->pid);
		assert_int_equal(epoch, 1 + (uint64_t)cycle);
		/* sequences and rows kept; the old client carries on */
		assert_int_equal(kv_client_stats(c, &st), 0);
		assert_int_equal(st.n_seqs, 2);
		assert_int_equal(st.pages_shared, 1 * 2);
		/* seq's pages in 2 streams + the child's copied page */
		assert_int_equal(st.pages_used,
				 kv_pages_for_rows(rows, 4) * 2 + 1 * 2);
		check_rows(c, seq, rows, 1);
		check_rows(c, child, 6, 1);
		/* a reservation and new rows across each restart */
		rows += 4;
		assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &rows, &d),
				 0);
		write_rows(c, seq, rows - 4, rows, 1);
	}
	/* a client kvd did not know after the restart registers again under
	 * its id, transparently */
	{
		uint32_t id = kv_client_id(idle), s;

		assert_int_equal(kv_client_stats(idle, &st), 0);
		assert_int_equal(kv_client_id(idle), id);
		assert_int_equal(kv_client_declare(idle, 2, rb2, 4, &d), 0);
		assert_int_equal(kv_client_seq_create(idle, &s, &d), 0);
		assert_int_equal(kv_client_seq_free(idle, s), 0);
	}
	/* a new client reads the same rows */
	fresh = open_client(k, "fresh", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(fresh, 2, rb2, 4, &d), 0);
	check_rows(fresh, seq, rows, 1);
	kv_client_close(fresh);
	assert_int_equal(stray_files(k->run_dir, &n_kvd), 0);
	assert_int_equal(n_kvd, 3);

	/* a live owner is never displaced: not from the same run directory
	 * (pid file), not from another one (segment owner) */
	assert_int_equal(kvd_run_expect_exit(k, k->run_dir, 3000), 1);
	st_test_tmpdir(other_dir, sizeof(other_dir));
	assert_int_equal(kvd_run_expect_exit(k, other_dir, 3000), 1);
	st_rm_rf(other_dir);
	assert_int_equal(kvd_count_segments(k->name), 1);
	assert_int_equal(kvd_ping(k->run_dir, 1000, &pid, &epoch), 0);
	assert_int_equal(pid, k->pid);
	assert_int_equal(epoch, 11);
	check_rows(c, seq, rows, 1);

	/* SIGTERM: segment, sockets and pid file removed */
	status = kvd_kill(k, SIGTERM);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(kvd_count_segments(k->name), 0);
	assert_int_equal(stray_files(k->run_dir, &n_kvd), 0);
	assert_int_equal(n_kvd, 0);
	/* a fresh start after that makes a new pool (epoch 1) */
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(kvd_count_segments(k->name), 0);
	fresh = open_client(k, "fresh", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(fresh, 2, rb2, 4, &d), 0);
	assert_int_equal(kv_client_stats(fresh, &st), 0);
	assert_int_equal(st.epoch, 1);
	assert_int_equal(st.n_seqs, 0);
	kv_client_close(fresh);
	/* the old client notices the new pool (another epoch), maps it and
	 * goes on; its old sequences are gone with the old pool */
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.epoch, 1);
	assert_null(kv_client_row(c, seq, 0, 0));
	assert_int_equal(kv_client_seq_create(c, &seq, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &n9, &d), 0);
	write_rows(c, seq, 0, 9, 3);
	fresh = open_client(k, "fresh", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(fresh, 2, rb2, 4, &d), 0);
	check_rows(fresh, seq, 9, 3);
	kv_client_close(fresh);
	kv_client_close(c);
	kv_client_close(idle);
}

/* ---- wrong magic / version --------------------------------------------- */

static void test_bad_segments(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c, *b;
	struct st_shm_header *h;
	struct st_diag d;
	struct st_shm own;
	uint64_t magic;
	pid_t pid;
	int status;

	/* a client attaching to a pool whose header went bad */
	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_client(k, "first", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(c, 1, rb1, 4, &d), 0);
	h = map_header(k->name);
	assert_non_null(h);
	magic = atomic_load(&h->magic);
	atomic_store(&h->magic, 0x4141414141414141ull);
	b = open_client(k, "second", TIMEOUT_MS);
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_client_declare(b, 1, rb1, 4, &d), -ST_E_BADMAGIC);
	assert_non_null(strstr(d.msg, "bad magic"));
	assert_non_null(strstr(d.msg, k->name));
	atomic_store(&h->magic, magic);
	h->layout_version = 99;
	assert_int_equal(kv_client_declare(b, 1, rb1, 4, &d), -ST_E_VERSION);
	assert_non_null(strstr(d.msg, "layout version 99"));
	h->layout_version = KV_POOL_LAYOUT_VERSION;
	h->total_bytes += 1;
	assert_int_equal(kv_client_declare(b, 1, rb1, 4, &d), -ST_E_FORMAT);
	h->total_bytes -= 1;
	assert_int_equal(kv_client_declare(b, 1, rb1, 4, &d), 0);
	munmap(h, 4096);
	kv_client_close(b);
	kv_client_close(c);
	kvd_kill(k, SIGTERM);
	assert_int_equal(kvd_count_segments(k->name), 0);

	/* a segment of another layout version whose owner is dead: kvd
	 * discards it and makes its own */
	pid = fork();
	if (pid == 0)
		_exit(st_shm_create(&own, k->name, KV_POOL_KIND, 99, 0,
				    1 << 20) == 0 ? 0 : 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(kvd_count_segments(k->name), 1);
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(kvd_count_segments(k->name), 0);
	c = open_client(k, "after", TIMEOUT_MS);
	assert_int_equal(kv_client_declare(c, 1, rb1, 4, &d), 0);
	h = map_header(k->name);
	assert_non_null(h);
	assert_int_equal(h->layout_version, KV_POOL_LAYOUT_VERSION);
	assert_int_equal(atomic_load(&h->owner_pid), k->pid);
	munmap(h, 4096);
	kv_client_close(c);
	kvd_kill(k, SIGTERM);

	/* not a strata segment at all (garbage): discarded too */
	{
		char name[128], junk[8192];
		int fd;

		snprintf(name, sizeof(name), "/strata.%s.kv", k->name);
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
		assert_true(fd >= 0);
		memset(junk, 0x5a, sizeof(junk));
		assert_int_equal(write(fd, junk, sizeof(junk)), sizeof(junk));
		close(fd);
	}
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(kvd_count_segments(k->name), 0);
	kvd_kill(k, SIGTERM);

	/* another layout version whose owner lives (this process): kvd
	 * refuses to start and leaves it alone */
	assert_int_equal(st_shm_create(&own, k->name, KV_POOL_KIND, 99, 0,
				       1 << 20),
			 0);
	assert_int_equal(kvd_run_expect_exit(k, k->run_dir, 3000), 1);
	assert_int_equal(kvd_count_segments(k->name), 1);
	assert_int_equal(st_shm_hdr(&own)->layout_version, 99);
	st_shm_destroy(&own);
}

/* ---- kill -9 with spilled pages --------------------------------------- */

#define SP_N 6
#define SP_ROWS 16

static const uint32_t rbs[2] = { 1024, 256 };

static void sp_write(struct kv_client *c, uint32_t seq, uint32_t r,
		     uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++) {
		uint8_t *p = kv_client_row_writable(c, seq, (int)s, r);

		assert_non_null(p);
		for (uint32_t i = 0; i < rbs[s]; i++)
			p[i] = pattern(tag, s, r, i);
	}
}

static int sp_differ(struct kv_client *c, uint32_t seq, uint32_t rows,
		     uint32_t tag)
{
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < rows; r++) {
			const uint8_t *p = kv_client_row(c, seq, (int)s, r);

			if (!p)
				return -1;
			for (uint32_t i = 0; i < rbs[s]; i++)
				if (p[i] != pattern(tag, s, r, i))
					return 1;
		}
	return 0;
}

static int sp_spilled(struct kvd_inst *k, uint32_t seq)
{
	int n = 0;

	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t pi = 0; pi < SP_ROWS / 4; pi++)
			n += kv_entry_is_spilled(
				kvd_table_entry(k->name, seq, s, pi, NULL));
	return n;
}

static void test_restart_spill(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_stream_decl sd[2] = { { rbs[0], 1, 0, 0 },
					{ rbs[1], 1, 0, 0 } };
	struct kv_client *c;
	uint32_t seqs[SP_N], pub, found, cached;
	int had[SP_N], n_had = 0;
	int32_t ids[12], status;
	struct kv_stats st, st2;
	struct st_diag d;
	char spill[4200];

	/* 16 host pages of 4 KiB; 6 sequences of 8 pages need 48 */
	snprintf(k->budget, sizeof(k->budget), "64KiB");
	snprintf(k->spill_budget, sizeof(k->spill_budget), "1MiB");
	assert_int_equal(kvd_start(k, NULL), 0);
	c = open_client(k, "worker", TIMEOUT_MS);
	assert_int_equal(kv_client_declare_model(c, 2, sd, 4, 0x99, &d), 0);
	/* a published prefix (2 groups) */
	for (int i = 0; i < 12; i++)
		ids[i] = 500 + i;
	assert_int_equal(kv_client_seq_create_prefix(c, ids, 9, &pub, &cached,
						     &d),
			 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &pub,
					       (uint32_t[]){ 9 }, &d), 0);
	for (uint32_t r = 0; r < 9; r++)
		sp_write(c, pub, r, 40);
	assert_int_equal(kv_client_seq_publish(c, pub, ids, 9, &d), 2);
	/* running: its published pages stay in the cache (a published page
	 * that spills leaves the cache) */
	assert_int_equal(kv_client_seq_pin(c, 1, &pub, NULL, &d), 0);
	/* interleaved writes, one sequence pinned at a time */
	for (int i = 0; i < SP_N; i++)
		assert_int_equal(kv_client_seq_create(c, &seqs[i], &d), 0);
	for (uint32_t r = 0; r < SP_ROWS; r++)
		for (int i = 0; i < SP_N; i++) {
			uint32_t n = r + 1;

			if (kv_client_seq_pin(c, 1, &seqs[i], NULL, &d) < 0 ||
			    kv_client_seq_reserve(c, 1, &seqs[i], &n, &d) < 0)
				fail_msg("row %u seq %d: %s", r, i, d.msg);
			sp_write(c, seqs[i], r, (uint32_t)i + 1);
			if (i != SP_N - 1 || r != SP_ROWS - 1)
				kv_client_seq_unpin(c, 1, &seqs[i], &d);
		}
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_true(st.pages_spilled > 0);
	assert_int_equal(st.n_pinned, 2);
	assert_int_equal(st.cache_groups, 2);
	for (int i = 0; i < SP_N; i++) {
		had[i] = sp_spilled(k, seqs[i]) > 0;
		n_had += had[i];
	}
	assert_true(n_had > 0 && n_had < SP_N);

	/* kill -9, start again: same tables, slots and pins; the spill file
	 * is read back */
	kvd_kill(k, SIGKILL);
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(kv_client_stats(c, &st2), 0);
	assert_int_equal(st2.n_seqs, SP_N + 1);
	assert_int_equal(st2.pages_spilled, st.pages_spilled);
	assert_int_equal(st2.n_pinned, 2);
	/* the pin of a sequence is kept; the client lets it go now */
	assert_int_equal(kv_client_seq_unpin(c, 1, &seqs[SP_N - 1], &d), 0);
	assert_int_equal(st2.cache_groups, st.cache_groups);
	for (int i = 0; i < SP_N; i++) {
		if (kv_client_seq_restore(c, 1, &seqs[i], &status, &d) < 0)
			fail_msg("restore %d after restart: %s", i, d.msg);
		assert_int_equal(sp_differ(c, seqs[i], SP_ROWS,
					   (uint32_t)i + 1),
				 0);
	}
	/* the prefix cache came back too (rebuilt from the keys) */
	assert_int_equal(kv_client_seq_create_prefix(c, ids, 12, &found,
						     &cached, &d),
			 0);
	assert_int_equal(cached, 8);
	assert_int_equal(sp_differ(c, found, 8, 40), 0);
	assert_int_equal(kv_client_seq_free(c, found), 0);

	/* again, and this time the spill file is lost with the crash */
	n_had = 0;
	for (int i = 0; i < SP_N; i++) {
		had[i] = sp_spilled(k, seqs[i]) > 0;
		n_had += had[i];
	}
	assert_true(n_had > 0 && n_had < SP_N);
	kvd_kill(k, SIGKILL);
	snprintf(spill, sizeof(spill), "%s/kvd.spill", k->run_dir);
	assert_int_equal(unlink(spill), 0);
	assert_int_equal(kvd_start(k, NULL), 0);
	/* adoption found the file gone: nothing is left in it */
	assert_int_equal(kv_client_stats(c, &st2), 0);
	assert_int_equal(st2.pages_spilled, 0);
	assert_int_equal(st2.n_seqs, SP_N + 1);
	for (int i = 0; i < SP_N; i++) {
		int r = kv_client_seq_restore(c, 1, &seqs[i], &status, &d);

		if (had[i]) {
			assert_int_equal(r, -ST_E_CHECKSUM);
			assert_non_null(strstr(d.msg, "a spilled page of it "
						      "was lost"));
		} else {
			assert_int_equal(r, 0);
			assert_int_equal(sp_differ(c, seqs[i], SP_ROWS,
						   (uint32_t)i + 1),
					 0);
		}
	}
	/* the failed ones free like any other; nothing is left behind */
	for (int i = 0; i < SP_N; i++)
		assert_int_equal(kv_client_seq_free(c, seqs[i]), 0);
	assert_int_equal(kv_client_seq_free(c, pub), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.n_seqs, 0);
	assert_int_equal(st.pages_used, 0);
	assert_int_equal(st.pages_spilled, 0);
	kv_client_close(c);
	assert_true(WIFEXITED(kvd_kill(k, SIGTERM)));
	assert_false(st_path_exists(spill));
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_killed_client, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_segments, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_restart_spill, setup,
						teardown),
	};

	if (argc == 4 && !strcmp(argv[1], "--child-hold"))
		return child_hold(argv[2], argv[3]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
