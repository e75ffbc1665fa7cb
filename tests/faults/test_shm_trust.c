/*
 * test_shm_trust.c — shared-memory identity, ownership and client liveness
 * (issue 26), against the real kvd on private instances:
 *
 *   1. a kv client whose pool was removed (kvd stopped cleanly) while
 *      another client made the next one, with the same epoch 1, maps the
 *      new pool (pool_id differs), not the unlinked old one;
 *   2. a segment not owned by us, or with group/other access, is neither
 *      adopted nor removed, and kvd says what to do; st_shm_attach
 *      refuses it too;
 *   3. HELLO from a pid kvd cannot see, or whose start time differs from
 *      the client's claim (another pid namespace), is refused, and a
 *      reused pid reads as dead;
 *   4. a second kvd of an instance is refused while the first lives,
 *      whatever its run directory (st_shm_lock), and the lock passes on
 *      once the holder is gone;
 *   5. a RESIDENCY pin is a count: a sequence pinned twice stays pinned
 *      (never spilled) until unpinned twice.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "kv_test_util.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_util.h"
#include "test_util.h"

static const uint32_t k_row_bytes[1] = { 64 };

/* A client that declared one 64-byte stream, 4 rows per page. */
static struct kv_client *client(struct kvd_inst *k, const char *name)
{
	struct kv_client *c = NULL;
	struct st_diag d = { "" };

	assert_int_equal(kv_client_open(k->run_dir, k->name, name, 3000, &c,
					&d), 0);
	assert_int_equal(kv_client_declare(c, 1, k_row_bytes, 4, &d), 0);
	return c;
}

/* A sequence of 4 rows; row 0 of stream 0 in *ret_row. */
static uint32_t seq_of_4(struct kv_client *c, uint8_t **ret_row)
{
	struct st_diag d = { "" };
	uint32_t seq = 0, rows = 4;

	assert_int_equal(kv_client_seq_create(c, &seq, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &rows, &d), 0);
	*ret_row = kv_client_row(c, seq, 0, 0);
	assert_non_null(*ret_row);
	return seq;
}

/* 1. Same epoch, new pool: the first client follows the new pool. */
static void test_new_pool_same_epoch(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *a, *b;
	struct kv_stats st;
	uint8_t *old_row, *ra, *rb;
	uint64_t old_id;
	uint32_t seq;

	assert_int_equal(kvd_start(k, NULL), 0);
	a = client(k, "A");
	(void)seq_of_4(a, &old_row);
	memset(old_row, 0xAA, 64);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.epoch, 1);
	old_id = st.pool_id;
	assert_true(old_id != 0);

	/* clean stop: the pool is unlinked; B makes the next one first */
	kvd_kill(k, SIGTERM);
	assert_int_equal(kvd_start(k, NULL), 0);
	b = client(k, "B");
	assert_int_equal(kv_client_stats(b, &st), 0);
	assert_int_equal(st.epoch, 1);           /* the same epoch ... */
	assert_true(st.pool_id != old_id);       /* ... another pool */

	/* A's next requests land in the new pool, where B sees its rows */
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_true(st.pool_id != old_id);
	seq = seq_of_4(a, &ra);
	rb = kv_client_row(b, seq, 0, 0);
	assert_non_null(rb);
	memset(ra, 0x55, 64);
	assert_int_equal(rb[0], 0x55);
	assert_int_equal(rb[63], 0x55);
	kv_client_close(b);
	kv_client_close(a);
}

/* Runs kvd of k (not started) until it exits; its exit code. */
static int kvd_exit_code(struct kvd_inst *k)
{
	return kvd_run_expect_exit(k, k->run_dir, 5000);
}

/* 2. Another owner's (or a group/other accessible) segment is refused. */
static void test_foreign_segment_refused(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *a;
	struct st_shm shm;
	struct st_diag d = { "" };
	struct stat sb;
	char path[256];
	uint8_t *row;

	if (geteuid() != 0)
		skip(); /* chown to another uid needs root */
	assert_int_equal(kvd_start(k, NULL), 0);
	a = client(k, "A");
	(void)seq_of_4(a, &row);
	memset(row, 0x5A, 64);
	kvd_segment_path(k->name, path, sizeof(path));
	kvd_kill(k, SIGKILL);                    /* the pool stays */
	kv_client_close(a);

	/* group/other access on our own segment: not adopted, not removed */
	assert_int_equal(chmod(path, 0660), 0);
	assert_int_equal(st_shm_attach(&shm, k->name, KV_POOL_KIND,
				       KV_POOL_LAYOUT_VERSION, 0, &d), -EPERM);
	assert_non_null(strstr(d.msg, "mode 0660"));
	assert_int_equal(kvd_exit_code(k), 1);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0660);

	/* another user's, 0666 (the case): the same */
	assert_int_equal(chown(path, 65534, 65534), 0);
	assert_int_equal(chmod(path, 0666), 0);
	assert_int_equal(kvd_exit_code(k), 1);
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_uid, 65534);
	assert_int_equal(sb.st_mode & 0777, 0666);

	/* another user's junk file of that name: refused at once, left */
	assert_int_equal(unlink(path), 0);
	{
		int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);

		assert_true(fd >= 0);
		assert_int_equal(write(fd, "junk", 4), 4);
		close(fd);
	}
	assert_int_equal(chown(path, 65534, 65534), 0);
	assert_int_equal(kvd_exit_code(k), 1);
	assert_int_equal(stat(path, &sb), 0);

	/* our own junk: removed, and kvd serves */
	assert_int_equal(chown(path, 0, 0), 0);
	assert_int_equal(kvd_start(k, NULL), 0);
	assert_int_equal(stat(path, &sb), -1);
	a = client(k, "A2");
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_uid, geteuid());
	assert_int_equal(sb.st_mode & 0777, 0600);
	kv_client_close(a);
}

/* HELLO over a fresh socket with (pid, start_ticks): kvd's status, and its
 * text in *d. */
static int raw_hello(const struct kvd_inst *k, uint32_t pid,
		     uint64_t start_ticks, struct st_diag *d)
{
	struct kv_msg_hello m;
	struct st_wbuf w;
	struct st_sock s;
	char path[4200];
	const uint8_t *p = NULL;
	void *buf = NULL;
	size_t len = 0;
	int r;

	memset(&m, 0, sizeof(m));
	m.pid = pid;
	m.proto_version = ST_PROTO_VERSION;
	m.start_ticks = start_ticks;
	snprintf(m.name, sizeof(m.name), "raw");
	snprintf(path, sizeof(path), "%s/kvd.ctl", k->run_dir);
	assert_int_equal(st_sock_open(&s, ST_SOCK_REQ, path, 3000, 3000), 0);
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &m);
	r = st_rpc_call(&s, ST_MSG_HELLO, 1, 0, w.data, w.len, &buf, &p, &len);
	d->msg[0] = 0;
	if (r < 0 && buf)
		kv_proto_decode_text(p, len, d);
	free(buf);
	st_wbuf_fini(&w);
	st_sock_close(&s);
	return r;
}

/* 3. Client liveness: the pid a client sends must name it here. */
static void test_hello_pid_checked(void **state)
{
	struct kvd_inst *k = *state;
	struct st_diag d = { "" };
	uint64_t me = 0, ticks = 0;
	pid_t gone, child;
	int status;

	assert_int_equal(st_pid_start_ticks((int)getpid(), &me), 0);
	assert_true(me > 0);
	assert_int_equal(kvd_start(k, NULL), 0);

	/* a pid that exists nowhere kvd can see (a client in another pid
	 * namespace): refused, not registered and reaped 100 ms later */
	gone = fork();
	if (gone == 0)
		_exit(0);
	assert_int_equal(waitpid(gone, &status, 0), gone);
	assert_int_equal(raw_hello(k, (uint32_t)gone, 0, &d), -ESRCH);
	assert_non_null(strstr(d.msg, "pid namespace"));

	/* a pid that names another process here (start time differs) */
	assert_int_equal(raw_hello(k, (uint32_t)getpid(), me + 1, &d), -ESRCH);
	assert_non_null(strstr(d.msg, "another process"));

	/* the right claim, or none (0), registers */
	assert_int_equal(raw_hello(k, (uint32_t)getpid(), me, &d), 0);
	assert_int_equal(raw_hello(k, (uint32_t)getpid(), 0, &d), 0);

	/* (pid, start) names one process: a reused pid is another one */
	child = fork();
	if (child == 0) {
		pause();
		_exit(0);
	}
	assert_int_equal(st_pid_start_ticks(child, &ticks), 0);
	assert_true(st_pid_alive_since(child, ticks));
	assert_false(st_pid_alive_since(child, ticks - 1));
	kill(child, SIGKILL);
	waitpid(child, &status, 0);
	assert_false(st_pid_alive_since(child, ticks));
}

/* 4. One kvd per instance, whatever the run directory. */
static void test_one_kvd_per_instance(void **state)
{
	struct kvd_inst *k = *state;
	struct st_diag d = { "" };
	char other[4096];
	int fd = -1, fd2 = -1;

	st_test_tmpdir(other, sizeof(other));
	assert_int_equal(kvd_start(k, NULL), 0);  /* no pool yet */
	assert_int_equal(kvd_run_expect_exit(k, other, 5000), 1);
	assert_int_equal(st_shm_lock(k->name, "kvd", &fd, &d), -EBUSY);
	assert_non_null(strstr(d.msg, "another kvd is serving instance"));
	assert_int_equal(fd, -1);

	/* a holder killed with SIGKILL leaves the file, not the lock */
	kvd_kill(k, SIGKILL);
	assert_int_equal(st_shm_lock(k->name, "kvd", &fd, &d), 0);
	assert_true(fd >= 0);
	/* held by this process now: kvd is refused */
	assert_int_equal(kvd_run_expect_exit(k, other, 5000), 1);
	/* released (file removed): a waiter that opened the old file takes
	 * the lock of the new one */
	st_shm_unlock(k->name, "kvd", fd);
	assert_int_equal(st_shm_lock(k->name, "kvd", &fd2, &d), 0);
	st_shm_unlock(k->name, "kvd", fd2);
	assert_int_equal(kvd_start(k, NULL), 0);
	st_rm_rf(other);
}

/* flags and pins of sequence seq in the pool segment of k (read-only). */
static void seq_pin_state(const struct kvd_inst *k, uint32_t seq,
			  uint32_t *ret_flags, uint32_t *ret_pins)
{
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	struct kv_layout lay;
	struct st_shm shm;
	struct st_diag d = { "" };
	const struct kv_seq_entry *e;

	assert_int_equal(st_shm_attach(&shm, k->name, KV_POOL_KIND,
				       KV_POOL_LAYOUT_VERSION, 0, &d), 0);
	assert_int_equal(kv_layout_read(shm.base, shm.size,
					st_shm_hdr(&shm)->layout_hash, &lay,
					streams, &d), 0);
	e = (const struct kv_seq_entry *)((uint8_t *)shm.base +
					  lay.seqs_off) + kv_seq_index(seq);
	*ret_flags = atomic_load(&e->flags);
	*ret_pins = atomic_load(&e->pins);
	st_shm_detach(&shm);
}

/* 5. Pinned twice, unpinned once: still pinned. */
static void test_pin_is_a_count(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *a;
	struct st_diag d = { "" };
	uint32_t seq, flags, pins;
	uint8_t *row;

	assert_int_equal(kvd_start(k, NULL), 0);
	a = client(k, "A");
	seq = seq_of_4(a, &row);
	assert_int_equal(kv_client_seq_pin(a, 1, &seq, NULL, &d), 0);
	assert_int_equal(kv_client_seq_pin(a, 1, &seq, NULL, &d), 0);
	seq_pin_state(k, seq, &flags, &pins);
	assert_true(flags & KV_SEQ_F_PINNED);
	assert_int_equal(pins, 2);
	assert_int_equal(kv_client_seq_unpin(a, 1, &seq, &d), 0);
	seq_pin_state(k, seq, &flags, &pins);
	assert_true(flags & KV_SEQ_F_PINNED);    /* one user left */
	assert_int_equal(pins, 1);
	assert_int_equal(kv_client_seq_unpin(a, 1, &seq, &d), 0);
	seq_pin_state(k, seq, &flags, &pins);
	assert_false(flags & KV_SEQ_F_PINNED);
	assert_int_equal(pins, 0);
	/* an extra unpin changes nothing (no wrap) */
	assert_int_equal(kv_client_seq_unpin(a, 1, &seq, &d), 0);
	seq_pin_state(k, seq, &flags, &pins);
	assert_int_equal(pins, 0);
	kv_client_close(a);
}

static int setup(void **state)
{
	static int n;

	*state = kvd_fixture_new("trust", n++);
	return *state ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_new_pool_same_epoch,
						setup, kvd_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_foreign_segment_refused,
						setup, kvd_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_hello_pid_checked,
						setup, kvd_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_one_kvd_per_instance,
						setup, kvd_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_pin_is_a_count,
						setup, kvd_fixture_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
