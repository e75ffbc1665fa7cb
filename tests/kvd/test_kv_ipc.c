/*
 * test_kv_ipc.c — kvd and its clients in several processes (suite ipc):
 * declarations, rows written by one process read back by another, fork
 * with shared full pages, budget exhaustion, malformed messages of every
 * type, idempotent re-sends.  Every test starts the real kvd binary on a
 * private instance and temporary run directory and removes everything after.
 *
 * The "other process" is this binary run again (--child-rows), because
 * nanomsg cannot be used in a forked child of a process that used it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv_client.h"
#include "kv_proto.h"
#include "kv_test_util.h"
#include "st_msg.h"
#include "st_util.h"

#define TIMEOUT_MS 3000

static uint8_t pattern(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

static uint32_t lcg_next(uint32_t *s)
{
	*s = *s * 1664525u + 1013904223u;
	return *s >> 8;
}

static int setup(void **state)
{
	static int n;
	struct kvd_inst *k = kvd_fixture_new("ipc", n++);

	if (!k)
		return -1;
	*state = k;
	return 0;
}

static int teardown(void **state)
{
	return kvd_fixture_teardown(state);
}

static struct kv_client *open_client(struct kvd_inst *k, const char *name)
{
	struct kv_client *c = NULL;
	struct st_diag d = { { 0 } };
	int r = kv_client_open(k->run_dir, k->name, name, TIMEOUT_MS, &c, &d);

	if (r < 0)
		fprintf(stderr, "kv_client_open: %s\n", d.msg);
	assert_int_equal(r, 0);
	return c;
}

static void start(struct kvd_inst *k)
{
	assert_int_equal(kvd_start(k, NULL), 0);
}

/* ---- declarations ------------------------------------------------------ */

static void test_declare(void **state)
{
	struct kvd_inst *k = *state, k2;
	const uint32_t rb[2] = { 64, 32 }, rb1[1] = { 64 };
	struct kv_client *a, *b;
	struct kv_stream_decl sd[2] = { { 64, 1, 0, 0 }, { 32, 0, 0, 0 } };
	struct kv_stats st;
	struct st_diag d;

	start(k);
	a = open_client(k, "a");
	b = open_client(k, "b");
	assert_int_not_equal(kv_client_id(a), kv_client_id(b));
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.epoch, 0);           /* no pool yet */
	assert_int_equal(kvd_count_segments(k->name), 0);
	assert_int_equal(kv_client_declare(a, 2, rb, 4, &d), 0);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.n_streams, 2);
	assert_int_equal(st.page_rows, 4);
	assert_int_equal(st.page_bytes, 256);     /* 4 rows x 64 bytes */
	assert_int_equal(st.n_pages, (4u << 20) / 256);
	assert_int_equal(st.budget_bytes, 4u << 20);
	assert_int_equal(st.epoch, 1);
	assert_int_equal(st.pid, k->pid);
	assert_int_equal(st.n_clients, 2);
	assert_true(st.pool_bytes > st.n_pages * st.page_bytes);
	assert_int_equal(kvd_count_segments(k->name), 1);
	assert_int_equal(kv_client_page_rows(a), 4);
	assert_int_equal(kv_client_row_bytes(a, 1), 32);
	assert_int_equal(kv_client_row_bytes(a, 2), 0);
	/* identical: attaches; different: refused */
	assert_int_equal(kv_client_declare(b, 2, rb, 4, &d), 0);
	assert_int_equal(kv_client_declare(b, 1, rb1, 4, &d), -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "another declaration"));
	assert_int_equal(kv_client_declare(b, 2, rb, 8, &d), -ST_E_CONFIG);
	assert_int_equal(kv_client_declare(b, 2, rb, 4, &d), 0);
	kv_client_close(b);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.n_clients, 1);
	kv_client_close(a);

	/* a tiny budget: the first declaration names the minimum; an
	 * unsupported stream is refused; neither makes a pool */
	kvd_inst_init(&k2, "ipcsmall");
	snprintf(k2.budget, sizeof(k2.budget), "300");
	if (kvd_start(&k2, NULL) < 0) {
		kvd_cleanup(&k2);
		fail_msg("kvd did not start");
	}
	a = open_client(&k2, "a");
	assert_int_equal(kv_client_declare(a, 2, rb, 4, &d), -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "at least 512 bytes"));
	assert_non_null(strstr(d.msg, "--budget"));
	assert_int_equal(kv_client_declare_streams(a, 2, sd, 1, &d),
			 -ST_E_CONFIG);
	assert_non_null(strstr(d.msg, "tokens per row"));
	assert_int_equal(kvd_count_segments(k2.name), 0);
	/* a declaration that fits (one stream of 64 x 4 = 256 bytes) */
	assert_int_equal(kv_client_declare(a, 1, rb1, 4, &d), 0);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.n_pages, 1);
	kv_client_close(a);
	kvd_kill(&k2, SIGTERM);
	kvd_cleanup(&k2);
}

/* ---- rows across processes --------------------------------------------- */

static const uint32_t rows_rb[2] = { 48, 80 };

/* The other process: reads rows [0, 9) of seq, checks them, writes rows
 * 9..11 with tag 2.  Exit status says which check failed. */
static int child_rows(const char *run_dir, const char *inst, uint32_t seq)
{
	struct kv_client *c;
	struct st_diag d;

	if (kv_client_open(run_dir, inst, "reader", TIMEOUT_MS, &c, &d) < 0)
		return 10;
	if (kv_client_declare(c, 2, rows_rb, 4, &d) < 0)
		return 11;
	if (kv_client_seq_rows(c, seq) != 9)
		return 12;
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 9; r++) {
			const uint8_t *p = kv_client_row(c, seq, (int)s, r);

			if (!p)
				return 13;
			for (uint32_t i = 0; i < rows_rb[s]; i++)
				if (p[i] != pattern(1, s, r, i))
					return 14;
		}
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 9; r < 12; r++) {
			uint8_t *p = kv_client_row(c, seq, (int)s, r);

			if (!p)
				return 15;
			for (uint32_t i = 0; i < rows_rb[s]; i++)
				p[i] = pattern(2, s, r, i);
		}
	kv_client_close(c);
	return 0;
}

static int run_self(char *const argv[])
{
	pid_t pid = fork();
	int status;

	if (pid == 0) {
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_rows_cross_process(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	struct st_diag d;
	uint32_t seq, n9 = 9;
	char seqtxt[32];

	start(k);
	c = open_client(k, "writer");
	assert_int_equal(kv_client_declare(c, 2, rows_rb, 4, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &seq, &d), 0);
	assert_null(kv_client_row(c, seq, 0, 0)); /* no page yet */
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq, &n9, &d), 0);
	assert_int_equal(kv_client_seq_rows(c, seq), 9);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 9; r++) {
			uint8_t *p = kv_client_row(c, seq, (int)s, r);

			assert_non_null(p);
			for (uint32_t i = 0; i < rows_rb[s]; i++)
				p[i] = pattern(1, s, r, i);
		}
	/* rows of one page are adjacent; no page past the reservation */
	assert_ptr_equal(kv_client_row(c, seq, 1, 5),
			 kv_client_row(c, seq, 1, 4) + 80);
	assert_null(kv_client_row(c, seq, 0, 12));
	assert_null(kv_client_row(c, seq, 2, 0));
	assert_null(kv_client_row(c, seq, -1, 0));
	assert_null(kv_client_row(c, seq ^ (1u << 24), 0, 0));
	snprintf(seqtxt, sizeof(seqtxt), "%u", seq);
	{
		char *argv[] = { "test_kv_ipc", "--child-rows", k->run_dir,
				 k->name, seqtxt, NULL };

		assert_int_equal(run_self(argv), 0);
	}
	/* what the other process wrote */
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 9; r < 12; r++)
			for (uint32_t i = 0; i < rows_rb[s]; i++)
				assert_int_equal(kv_client_row(c, seq, (int)s,
							       r)[i],
						 pattern(2, s, r, i));
	assert_int_equal(kv_client_seq_free(c, seq), 0);
	assert_null(kv_client_row(c, seq, 0, 0));
	assert_int_equal(kv_client_seq_free(c, seq), -ST_E_NOTFOUND);
	kv_client_close(c);
}

/* ---- fork -------------------------------------------------------------- */

static void test_fork(void **state)
{
	struct kvd_inst *k = *state;
	const uint32_t rb[2] = { 32, 64 };
	struct kv_client *c, *o;
	struct kv_stats st;
	struct st_diag d;
	uint32_t par, ch, n = 10, n16 = 16;

	start(k);
	c = open_client(k, "forker");
	assert_int_equal(kv_client_declare(c, 2, rb, 4, &d), 0);
	assert_int_equal(kv_client_seq_create(c, &par, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &par, &n, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 10; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				kv_client_row(c, par, (int)s, r)[i] =
					pattern(1, s, r, i);
	assert_int_equal(kv_client_seq_fork(c, par, 9, &ch, &d), 0);
	assert_int_not_equal(ch, par);
	assert_int_equal(kv_client_seq_rows(c, ch), 9);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_shared, 2 * 2);     /* 2 full pages x 2 */
	assert_int_equal(st.pages_used, 3 * 2 + 1 * 2);
	assert_int_equal(st.n_seqs, 2);
	for (uint32_t s = 0; s < 2; s++) {
		for (uint32_t r = 0; r < 8; r++)
			assert_ptr_equal(kv_client_row(c, ch, (int)s, r),
					 kv_client_row(c, par, (int)s, r));
		/* the partial page is a copy: same bytes, other memory */
		assert_ptr_not_equal(kv_client_row(c, ch, (int)s, 8),
				     kv_client_row(c, par, (int)s, 8));
		assert_memory_equal(kv_client_row(c, ch, (int)s, 8),
				    kv_client_row(c, par, (int)s, 8), rb[s]);
	}
	/* the child's new rows do not reach the parent */
	assert_int_equal(kv_client_seq_reserve(c, 1, &ch, &n16, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 9; r < 16; r++)
			memset(kv_client_row(c, ch, (int)s, r), 0xa5, rb[s]);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 10; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(
					kv_client_row(c, par, (int)s, r)[i],
					pattern(1, s, r, i));
	/* another client sees the same pages, and may fork but not free */
	o = open_client(k, "other");
	assert_int_equal(kv_client_declare(o, 2, rb, 4, &d), 0);
	assert_memory_equal(kv_client_row(o, ch, 1, 3),
			    kv_client_row(c, par, 1, 3), rb[1]);
	assert_int_equal(kv_client_seq_free(o, par), -EPERM);
	assert_int_equal(kv_client_seq_fork(c, par, 11, &n, &d), -ST_E_LIMIT);
	kv_client_close(o);
	/* the parent goes: the child keeps its rows */
	assert_int_equal(kv_client_seq_free(c, par), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_shared, 0);
	assert_int_equal(st.pages_used, 4 * 2);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 9; r++)
			for (uint32_t i = 0; i < rb[s]; i++)
				assert_int_equal(
					kv_client_row(c, ch, (int)s, r)[i],
					pattern(1, s, r, i));
	assert_int_equal(kv_client_seq_free(c, ch), 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_used, 0);
	assert_int_equal(st.pages_peak, 10);
	kv_client_close(c);
}

/* ---- budget ------------------------------------------------------------ */

static void test_budget(void **state)
{
	struct kvd_inst *k = *state;
	const uint32_t rb[1] = { 64 };
	struct kv_client *c;
	struct kv_stats st;
	struct st_diag d;
	uint32_t s1, s2, s3, seqs[2], rows[2], n40 = 40, n28 = 28;

	snprintf(k->budget, sizeof(k->budget), "4096"); /* 16 pages */
	start(k);
	c = open_client(k, "budget");
	assert_int_equal(kv_client_declare(c, 1, rb, 4, &d), 0);
	kv_client_seq_create(c, &s1, &d);
	kv_client_seq_create(c, &s2, &d);
	kv_client_seq_create(c, &s3, &d);
	assert_int_equal(kv_client_seq_reserve(c, 1, &s1, &n40, &d), 0);
	for (uint32_t r = 0; r < 40; r++)
		memset(kv_client_row(c, s1, 0, r), (int)r + 1, 64);
	memset(d.msg, 0, sizeof(d.msg));
	assert_int_equal(kv_client_seq_reserve(c, 1, &s2, &n28, &d),
			 -ST_E_BUDGET);
	assert_non_null(strstr(d.msg, "--budget"));
	assert_non_null(strstr(d.msg, "at least 4352 bytes")); /* +1 page */
	assert_non_null(strstr(d.msg, "4.00 KiB"));
	/* a batch that does not fit leaves nothing behind */
	seqs[0] = s2, rows[0] = 24;
	seqs[1] = s3, rows[1] = 4;
	assert_int_equal(kv_client_seq_reserve(c, 2, seqs, rows, &d),
			 -ST_E_BUDGET);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_used, 10);
	assert_int_equal(kv_client_seq_rows(c, s2), 0);
	assert_int_equal(kv_client_seq_rows(c, s3), 0);
	assert_null(kv_client_row(c, s2, 0, 0));
	for (uint32_t r = 0; r < 40; r++) {
		uint8_t *p = kv_client_row(c, s1, 0, r);

		assert_int_equal(p[0], r + 1);
		assert_int_equal(p[63], r + 1);
	}
	/* over the rows limit of a sequence (kvd --max-rows-per-seq 1024) */
	rows[0] = 1025;
	assert_int_equal(kv_client_seq_reserve(c, 1, seqs, rows, &d),
			 -ST_E_LIMIT);
	/* freeing makes room again */
	assert_int_equal(kv_client_seq_free(c, s1), 0);
	assert_int_equal(kv_client_seq_reserve(c, 2, seqs, (uint32_t[]){ 28, 4 },
					       &d),
			 0);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.pages_used, 8);
	assert_int_equal(st.pages_peak, 10);
	kv_client_close(c);
}

/* ---- malformed messages ------------------------------------------------ */

struct raw {
	struct st_sock s;
	uint32_t client;
	uint64_t rid;
};

/* Sends a message built field by field; returns the reply's status (and
 * checks the reply is well-formed and, for errors, carries a text). */
static int raw_send(struct raw *r, uint32_t magic, uint16_t version,
		    uint16_t type, uint32_t client, int32_t status,
		    int plen_delta, uint32_t reserved, const void *payload,
		    size_t len, struct st_wbuf *ret_reply)
{
	struct st_wbuf w;
	struct st_msg_header h;
	struct st_diag d;
	void *buf;
	size_t n;
	int rc;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, magic);
	st_wbuf_u16(&w, version);
	st_wbuf_u16(&w, type);
	st_wbuf_u64(&w, ++r->rid);
	st_wbuf_u32(&w, client);
	st_wbuf_i32(&w, status);
	st_wbuf_u32(&w, (uint32_t)((int)len + plen_delta));
	st_wbuf_u32(&w, reserved);
	st_wbuf_bytes(&w, payload, len);
	assert_int_equal(st_sock_send(&r->s, w.data, w.len), 0);
	st_wbuf_fini(&w);
	assert_int_equal(st_sock_recv(&r->s, &buf, &n), 0);
	assert_int_equal(st_proto_decode_header(buf, n, &h), 0);
	assert_true(h.type & ST_MSG_REPLY);
	if (h.status < 0) {
		assert_int_equal(kv_proto_decode_text(
					 (uint8_t *)buf + ST_PROTO_HEADER_BYTES,
					 h.payload_len, &d),
				 0);
		assert_true(strlen(d.msg) > 0);
	}
	if (ret_reply) {
		st_wbuf_init(ret_reply);
		st_wbuf_bytes(ret_reply, (uint8_t *)buf + ST_PROTO_HEADER_BYTES,
			      h.payload_len);
	}
	rc = h.status;
	free(buf);
	return rc;
}

/* A well-formed header with this payload. */
static int raw(struct raw *r, uint16_t type, const void *p, size_t len)
{
	return raw_send(r, ST_PROTO_MAGIC, ST_PROTO_VERSION, type, r->client, 0,
			0, 0, p, len, NULL);
}

/* Payload of u32 values. */
static int raw32(struct raw *r, uint16_t type, int n, ...)
{
	uint32_t v[64];
	va_list ap;

	va_start(ap, n);
	for (int i = 0; i < n; i++)
		v[i] = va_arg(ap, uint32_t);
	va_end(ap);
	return raw(r, type, v, (size_t)n * 4);
}

static void test_malformed(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_client *c;
	struct raw r = { .rid = 1000 };
	struct st_wbuf w, rep;
	struct kv_msg_hello hello = { 0 };
	struct kv_msg_hello_reply hr;
	char path[4200];
	uint8_t junk[300];
	uint32_t seq, seq_other, n8 = 8;
	struct st_diag d;
	uint32_t state_ = 12345;

	start(k);
	snprintf(path, sizeof(path), "%s/kvd.ctl", k->run_dir);
	assert_int_equal(st_sock_open(&r.s, ST_SOCK_REQ, path, TIMEOUT_MS,
				      TIMEOUT_MS),
			 0);
	/* headers */
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING, 0, 0, 0,
				  0, NULL, 0, NULL), 0);
	assert_int_equal(raw_send(&r, 0x12345678, ST_PROTO_VERSION, ST_MSG_PING,
				  0, 0, 0, 0,
				  NULL, 0, NULL), -ST_E_BADMAGIC);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION + 1,
				  ST_MSG_PING, 0, 0, 0, 0, NULL, 0, NULL),
			 -ST_E_VERSION);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING, 0, 0, 1,
				  0, NULL, 0, NULL), -ST_E_PROTO);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING, 0, 0, -1,
				  0, "x", 1, NULL), -ST_E_PROTO);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING, 0, 0, 0,
				  7, NULL, 0, NULL), -ST_E_PROTO);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING, 0, -5, 0,
				  0, NULL, 0, NULL), -ST_E_PROTO);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_PING | ST_MSG_REPLY, 0, 0, 0, 0, NULL,
				  0, NULL), -ST_E_PROTO);
	for (size_t n = 0; n < ST_PROTO_HEADER_BYTES; n += 5) {
		struct st_msg_header h;
		void *buf;
		size_t len;

		memset(junk, 0xab, sizeof(junk));
		assert_int_equal(st_sock_send(&r.s, junk, n), 0);
		assert_int_equal(st_sock_recv(&r.s, &buf, &len), 0);
		assert_int_equal(st_proto_decode_header(buf, len, &h), 0);
		assert_int_equal(h.status, -ST_E_PROTO);
		free(buf);
	}
	/* common messages with payloads where none belongs */
	assert_int_equal(raw(&r, ST_MSG_PING, "x", 1), -ST_E_PROTO);
	assert_int_equal(raw(&r, ST_MSG_STATS, "xy", 2), -ST_E_PROTO);
	assert_int_equal(raw(&r, ST_MSG_SHUTDOWN, "x", 1), -ST_E_PROTO);
	/* not registered yet */
	assert_int_equal(raw(&r, KV_MSG_SEQ_CREATE, NULL, 0), -ST_E_STALE);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 64, 1, 0, 0),
			 -ST_E_STALE);
	assert_int_equal(raw(&r, ST_MSG_BYE, NULL, 0), -ST_E_STALE);
	assert_int_equal(raw(&r, 0x0299, NULL, 0), -ST_E_STALE);
	/* HELLO: every field */
	hello.pid = (uint32_t)getpid();
	hello.proto_version = ST_PROTO_VERSION;
	strcpy(hello.name, "raw");
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	for (size_t n = 0; n < w.len; n += 3)
		assert_int_equal(raw(&r, ST_MSG_HELLO, w.data, n), -ST_E_PROTO);
	st_wbuf_bytes(&w, "abcdef", 6);
	assert_int_equal(raw(&r, ST_MSG_HELLO, w.data, w.len), -ST_E_PROTO);
	st_wbuf_fini(&w);
	hello.proto_version = 9;
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	assert_int_equal(raw(&r, ST_MSG_HELLO, w.data, w.len), -ST_E_VERSION);
	st_wbuf_fini(&w);
	hello.proto_version = ST_PROTO_VERSION;
	hello.pid = 0;
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	assert_int_equal(raw(&r, ST_MSG_HELLO, w.data, w.len), -ST_E_PROTO);
	st_wbuf_fini(&w);
	hello.pid = (uint32_t)getpid();
	hello.name[1] = '\n';
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	assert_int_equal(raw(&r, ST_MSG_HELLO, w.data, w.len), -ST_E_PROTO);
	st_wbuf_fini(&w);
	hello.name[1] = 'a';
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_HELLO, 0, 0, 0,
				  0, w.data, w.len, &rep), 0);
	assert_int_equal(kv_proto_decode_hello_reply(rep.data, rep.len, &hr), 0);
	st_wbuf_fini(&rep);
	st_wbuf_fini(&w);
	r.client = hr.client_id;
	/* sequences before a declaration */
	assert_int_equal(raw(&r, KV_MSG_SEQ_CREATE, NULL, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, 0x100000), -ST_E_PROTO);
	/* DECLARE */
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 1, 1), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 2, 1, 4), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 0, 4, 64, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 257, 4, 64, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 0, 64, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 70000, 64, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 0, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 1u << 21, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 7, 1, 4, 64, 1, 0, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 2, 4, 64, 1, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 64, 0, 0, 0),
			 -ST_E_CONFIG);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 64, 70000, 0, 0),
			 -ST_E_CONFIG);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 64, 1, 0, 1),
			 -ST_E_UNSUPPORTED);
	assert_int_equal(raw32(&r, KV_MSG_DECLARE, 6, 1, 4, 64, 1, 0, 0), 0);
	/* SEQ_CREATE */
	assert_int_equal(raw(&r, KV_MSG_SEQ_CREATE, "x", 1), -ST_E_PROTO);
	st_wbuf_init(&rep);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  KV_MSG_SEQ_CREATE,
				  r.client, 0, 0, 0, NULL, 0, &rep), 0);
	assert_int_equal(kv_proto_decode_seq(rep.data, rep.len, &seq, NULL), 0);
	st_wbuf_fini(&rep);
	/* SEQ_RESERVE */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 1, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 1, 20000), -ST_E_LIMIT);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 2, 1, seq), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 4, 1, seq, 4, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 2, seq, 4),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, 0, 4), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, seq ^ 0x200000, 4),
			 -ST_E_NOTFOUND);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, 0xfffff, 4),
			 -ST_E_NOTFOUND);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, seq, 1025),
			 -ST_E_LIMIT);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, seq, UINT32_MAX),
			 -ST_E_LIMIT);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, seq, 9), 0);
	/* SEQ_FORK */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FORK, 1, seq), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FORK, 3, seq, 1, 1), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FORK, 2, 0, 1), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FORK, 2, seq + 1, 1),
			 -ST_E_NOTFOUND);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FORK, 2, seq, 10), -ST_E_LIMIT);
	/* SEQ_FREE */
	assert_int_equal(raw(&r, KV_MSG_SEQ_FREE, NULL, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 2, seq, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, seq ^ 0x300000),
			 -ST_E_NOTFOUND);
	/* SEQ_CREATE_PREFIX: u64 model, u32 n, n ids */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_CREATE_PREFIX, 2, 7, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_CREATE_PREFIX, 3, 7, 0, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_CREATE_PREFIX, 3, 7, 0, 300000),
			 -ST_E_LIMIT);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_CREATE_PREFIX, 4, 7, 0, 2, 5),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_CREATE_PREFIX, 4, 0, 0, 1, 5),
			 -EINVAL);
	/* SEQ_PUBLISH: u32 seq, u64 model, u32 n, n ids */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 5, 0, 7, 0, 1, 5),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 4, seq, 7, 0, 1),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 5, seq ^ 0x300000, 7, 0,
			       1, 5),
			 -ST_E_NOTFOUND);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 5, seq, 0, 0, 1, 5),
			 -EINVAL);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 14, seq, 7, 0, 10, 1, 2,
			       3, 4, 5, 6, 7, 8, 9, 10),
			 -ST_E_LIMIT); /* seq holds 9 rows */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 5, seq, 7, 0, 1, 5), 0);
	/* SEQ_RESIDENCY: u32 op, u32 n, n seqs */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 1, 1), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 3, 0, 1, seq),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 3,
			       KV_RESIDENCY_AHEAD + 1, 1, seq),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 2, 1, 0), -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 3, 1, 1, 0),
			 -ST_E_PROTO);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 2, 1, 20000),
			 -ST_E_LIMIT);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 4, 1, 2, seq, seq),
			 0); /* a sequence twice is fine */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 3, 2, 1, seq), 0);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESIDENCY, 3, 3, 1, seq), 0);
	/* unknown types, a BYE with a payload (the client stays) */
	assert_int_equal(raw(&r, 0x0299, NULL, 0), -ST_E_PROTO);
	assert_int_equal(raw(&r, 0x7fff, NULL, 0), -ST_E_PROTO);
	assert_int_equal(raw(&r, 0x0000, NULL, 0), -ST_E_PROTO);
	assert_int_equal(raw(&r, ST_MSG_BYE, "x", 1), -ST_E_PROTO);
	/* another client's sequence */
	c = open_client(k, "owner");
	{
		const uint32_t rb[1] = { 64 };

		assert_int_equal(kv_client_declare(c, 1, rb, 4, &d), 0);
	}
	assert_int_equal(kv_client_seq_create(c, &seq_other, &d), 0);
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq_other, &n8, &d), 0);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_RESERVE, 3, 1, seq_other, 12),
			 -EPERM);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, seq_other), -EPERM);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_PUBLISH, 5, seq_other, 7, 0, 1,
			       5),
			 -EPERM);
	{
		/* the reply carries each sequence's status */
		uint32_t v[4] = { KV_RESIDENCY_PIN, 2, seq_other, seq };
		int32_t so[2];
		struct st_diag dd = { { 0 } };

		st_wbuf_init(&rep);
		assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
					  KV_MSG_SEQ_RESIDENCY, r.client, 0, 0,
					  0, v, sizeof(v), &rep),
				 0);
		assert_int_equal(kv_proto_decode_status_list(rep.data, rep.len,
							     2, so, &dd),
				 0);
		assert_int_equal(so[0], -EPERM);
		assert_int_equal(so[1], 0);
		assert_non_null(strstr(dd.msg, "another client"));
		st_wbuf_fini(&rep);
	}
	/* random bytes after a valid header, every type */
	for (int i = 0; i < 400; i++) {
		static const uint16_t types[] = {
			ST_MSG_HELLO, ST_MSG_PING, ST_MSG_STATS, KV_MSG_DECLARE,
			KV_MSG_SEQ_CREATE, KV_MSG_SEQ_RESERVE, KV_MSG_SEQ_FORK,
			KV_MSG_SEQ_FREE, KV_MSG_SEQ_CREATE_PREFIX,
			KV_MSG_SEQ_PUBLISH, KV_MSG_SEQ_RESIDENCY, 0x0209,
			0x0100
		};
		size_t len = lcg_next(&state_) % 64;

		for (size_t j = 0; j < len; j++)
			junk[j] = (uint8_t)lcg_next(&state_);
		if (lcg_next(&state_) % 2 && len >= 8) /* plausible counts */
			junk[0] = 1, junk[1] = junk[2] = junk[3] = 0;
		(void)raw(&r, types[lcg_next(&state_) % ST_ARRAY_SIZE(types)],
			  junk, len);
	}
	/* still serving, nothing leaked, the other client's rows untouched */
	assert_int_equal(kvd_ping(k->run_dir, 1000, NULL, NULL), 0);
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, seq), 0);
	assert_int_equal(raw(&r, ST_MSG_BYE, NULL, 0), 0);
	{
		struct kv_stats st;

		assert_int_equal(kv_client_stats(c, &st), 0);
		assert_int_equal(st.n_seqs, 1);
		assert_int_equal(st.pages_used, 2);
		assert_int_equal(st.n_clients, 1);
		assert_int_equal(st.pid, k->pid);
	}
	assert_int_equal(kv_client_seq_reserve(c, 1, &seq_other,
					       (uint32_t[]){ 12 }, &d), 0);
	assert_non_null(kv_client_row(c, seq_other, 0, 11));
	kv_client_close(c);
	st_sock_close(&r.s);
	assert_int_equal(waitpid(k->pid, NULL, WNOHANG), 0);
}

/* ---- prefix cache across clients ---------------------------------------- */

static void prompt_ids(int32_t *ids, uint32_t n, uint32_t tag)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = (int32_t)(tag * 1000u + i);
}

static void test_prefix_cache(void **state)
{
	struct kvd_inst *k = *state;
	struct kv_stream_decl sd[2] = { { 48, 1, 0, 0 }, { 16, 1, 0, 0 } };
	struct kv_client *a, *b, *other, *plain;
	uint32_t sa, sb, sx, cached, n = 10, n12 = 12;
	int32_t ids[16];
	struct kv_stats st;
	struct st_diag d;

	start(k);
	a = open_client(k, "a");
	b = open_client(k, "b");
	other = open_client(k, "other-model");
	plain = open_client(k, "plain");
	assert_int_equal(kv_client_declare_model(a, 2, sd, 4, 0xabc, &d), 0);
	assert_int_equal(kv_client_declare_model(b, 2, sd, 4, 0xabc, &d), 0);
	assert_int_equal(kv_client_declare_model(other, 2, sd, 4, 0xdef, &d), 0);
	assert_int_equal(kv_client_declare_model(plain, 2, sd, 4, 0, &d),
			 -EINVAL);
	assert_int_equal(kv_client_declare_streams(plain, 2, sd, 4, &d), 0);
	prompt_ids(ids, 16, 3);
	assert_int_equal(kv_client_seq_create_prefix(plain, ids, 10, &sx,
						     &cached, &d),
			 -EINVAL);
	assert_non_null(strstr(d.msg, "model id"));
	/* a computes 10 rows and publishes 2 full pages */
	assert_int_equal(kv_client_seq_create_prefix(a, ids, 10, &sa, &cached,
						     &d),
			 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_seq_reserve(a, 1, &sa, &n, &d), 0);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 10; r++) {
			uint8_t *p = kv_client_row_writable(a, sa, (int)s, r);

			assert_non_null(p);
			for (uint32_t i = 0; i < sd[s].row_bytes; i++)
				p[i] = pattern(5, s, r, i);
		}
	assert_int_equal(kv_client_seq_publish(a, sa, ids, 10, &d), 2);
	/* published: readable, no longer writable */
	assert_non_null(kv_client_row(a, sa, 0, 7));
	assert_null(kv_client_row_writable(a, sa, 0, 7));
	assert_non_null(kv_client_row_writable(a, sa, 0, 8));
	/* b (another client, same model) finds them: 8 rows, same bytes */
	assert_int_equal(kv_client_seq_create_prefix(b, ids, 12, &sb, &cached,
						     &d),
			 0);
	assert_int_equal(cached, 8);
	assert_int_equal(kv_client_seq_rows(b, sb), 8);
	for (uint32_t s = 0; s < 2; s++)
		for (uint32_t r = 0; r < 8; r++) {
			const uint8_t *p = kv_client_row(b, sb, (int)s, r);

			assert_non_null(p);
			assert_null(kv_client_row_writable(b, sb, (int)s, r));
			for (uint32_t i = 0; i < sd[s].row_bytes; i++)
				assert_int_equal(p[i], pattern(5, s, r, i));
		}
	/* b writes after the mapped pages only */
	assert_int_equal(kv_client_seq_reserve(b, 1, &sb, &n12, &d), 0);
	assert_non_null(kv_client_row_writable(b, sb, 1, 8));
	memset(kv_client_row_writable(b, sb, 1, 8), 0x5a, 16);
	assert_int_equal(kv_client_row(a, sa, 1, 8)[0], pattern(5, 1, 8, 0));
	/* another model finds nothing */
	assert_int_equal(kv_client_seq_create_prefix(other, ids, 10, &sx,
						     &cached, &d),
			 0);
	assert_int_equal(cached, 0);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.prefix_lookups, 3);
	assert_int_equal(st.prefix_pages_hit, 2);
	assert_int_equal(st.prefix_rows_reused, 8);
	assert_int_equal(st.prefix_published, 2);
	assert_int_equal(st.cache_groups, 2);
	assert_int_equal(st.pages_shared, 2 * 2);
	/* everyone lets go: the pages stay cached, unreferenced */
	assert_int_equal(kv_client_seq_free(a, sa), 0);
	assert_int_equal(kv_client_seq_free(b, sb), 0);
	assert_int_equal(kv_client_seq_free(other, sx), 0);
	assert_int_equal(kv_client_stats(a, &st), 0);
	assert_int_equal(st.pages_used, 0);
	assert_int_equal(st.pages_cached, 2 * 2);
	/* P10 over the wire: B-1, B, B+1, 2B, 2B+1 ids */
	{
		const uint32_t len[5] = { 3, 4, 5, 8, 9 };
		const uint32_t want[5] = { 0, 0, 4, 4, 8 };

		for (int i = 0; i < 5; i++) {
			assert_int_equal(kv_client_seq_create_prefix(
						 b, ids, len[i], &sx, &cached,
						 &d),
					 0);
			assert_int_equal(cached, want[i]);
			assert_int_equal(kv_client_seq_free(b, sx), 0);
		}
	}
	kv_client_close(plain);
	kv_client_close(other);
	kv_client_close(b);
	kv_client_close(a);
}

/* ---- idempotence ------------------------------------------------------- */

static void test_idempotent(void **state)
{
	struct kvd_inst *k = *state;
	struct raw r = { .rid = 0 };
	struct kv_msg_hello hello = { 0 };
	struct kv_msg_hello_reply hr;
	struct st_wbuf w, rep;
	uint32_t s1, s2, v[6] = { 1, 4, 64, 1, 0, 0 };
	char path[4200];
	struct kv_client *c;
	struct kv_stats st;

	start(k);
	snprintf(path, sizeof(path), "%s/kvd.ctl", k->run_dir);
	assert_int_equal(st_sock_open(&r.s, ST_SOCK_REQ, path, TIMEOUT_MS,
				      TIMEOUT_MS),
			 0);
	hello.pid = (uint32_t)getpid();
	hello.proto_version = ST_PROTO_VERSION;
	strcpy(hello.name, "idem");
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &hello);
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  ST_MSG_HELLO, 0, 0, 0,
				  0, w.data, w.len, &rep), 0);
	assert_int_equal(kv_proto_decode_hello_reply(rep.data, rep.len, &hr), 0);
	st_wbuf_fini(&rep);
	st_wbuf_fini(&w);
	r.client = hr.client_id;
	assert_int_equal(raw(&r, KV_MSG_DECLARE, v, sizeof(v)), 0);
	/* the same SEQ_CREATE twice (same request id): one sequence */
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  KV_MSG_SEQ_CREATE,
				  r.client, 0, 0, 0, NULL, 0, &rep), 0);
	kv_proto_decode_seq(rep.data, rep.len, &s1, NULL);
	st_wbuf_fini(&rep);
	r.rid--;
	assert_int_equal(raw_send(&r, ST_PROTO_MAGIC, ST_PROTO_VERSION,
				  KV_MSG_SEQ_CREATE,
				  r.client, 0, 0, 0, NULL, 0, &rep), 0);
	kv_proto_decode_seq(rep.data, rep.len, &s2, NULL);
	st_wbuf_fini(&rep);
	assert_int_equal(s1, s2);
	c = open_client(k, "watch");
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.n_seqs, 1);
	/* the same SEQ_FREE twice: the second gets the first's answer */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, s1), 0);
	r.rid--;
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, s1), 0);
	/* a new request id: the sequence is gone */
	assert_int_equal(raw32(&r, KV_MSG_SEQ_FREE, 1, s1), -ST_E_NOTFOUND);
	assert_int_equal(kv_client_stats(c, &st), 0);
	assert_int_equal(st.n_seqs, 0);
	kv_client_close(c);
	st_sock_close(&r.s);
}

/* ---- SHUTDOWN ---------------------------------------------------------- */

static void test_shutdown(void **state)
{
	struct kvd_inst *k = *state;
	const uint32_t rb[1] = { 64 };
	struct kv_client *c;
	struct st_diag d;
	struct st_sock sub;
	struct st_msg_header h;
	char path[4200];
	void *ev;
	size_t len;
	int status;

	start(k);
	/* events: the pool's epoch, then the shutdown */
	snprintf(path, sizeof(path), "%s/kvd.evt", k->run_dir);
	assert_int_equal(st_sock_open(&sub, ST_SOCK_SUB, path, 1000, 2000), 0);
	assert_int_equal(st_sock_subscribe_all(&sub), 0);
	st_sleep_ns(200 * 1000 * 1000); /* let the subscription arrive */
	assert_int_equal(kv_client_open(k->run_dir, k->name, "admin", 300, &c,
					&d),
			 0);
	assert_int_equal(kv_client_declare(c, 1, rb, 4, &d), 0);
	assert_int_equal(kvd_count_segments(k->name), 1);
	assert_int_equal(st_sock_recv(&sub, &ev, &len), 0);
	assert_int_equal(st_proto_decode_header(ev, len, &h), 0);
	assert_int_equal(h.type, KV_EVT_EPOCH);
	assert_int_equal(h.payload_len, 8);
	assert_int_equal(((uint8_t *)ev)[ST_PROTO_HEADER_BYTES], 1);
	free(ev);
	assert_int_equal(kv_client_shutdown(c), 0);
	assert_int_equal(st_sock_recv(&sub, &ev, &len), 0);
	assert_int_equal(st_proto_decode_header(ev, len, &h), 0);
	assert_int_equal(h.type, KV_EVT_SHUTDOWN);
	free(ev);
	st_sock_close(&sub);
	assert_int_equal(waitpid(k->pid, &status, 0), k->pid);
	k->pid = 0;
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(kvd_count_segments(k->name), 0);
	snprintf(path, sizeof(path), "%s/kvd.ctl", k->run_dir);
	assert_false(st_path_exists(path));
	snprintf(path, sizeof(path), "%s/kvd.pid", k->run_dir);
	assert_false(st_path_exists(path));
	/* the client's mapping outlives the segment's name; a request now
	 * finds nobody */
	assert_int_equal(kv_client_stats(c, &(struct kv_stats){ 0 }),
			 -ST_E_PEERGONE);
	kv_client_close(c);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_declare, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rows_cross_process, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
		cmocka_unit_test_setup_teardown(test_budget, setup, teardown),
		cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prefix_cache, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_idempotent, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_shutdown, setup, teardown),
	};

	if (argc == 5 && !strcmp(argv[1], "--child-rows"))
		return child_rows(argv[2], argv[3],
				  (uint32_t)strtoul(argv[4], NULL, 10));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
