/*
 * test_p16_sockets.c — PITFALLS P16 (message size limits) over every
 * request socket of an instance, not one daemon's: expertd.ctl, kvd.ctl
 * and computed.ctl, each a real daemon.
 *
 * For each socket:
 *   - 1 MiB + 1 bytes: refused at the sender with an error naming the limit
 *     (st_sock_send), and the 16-byte message after it arrives and is
 *     answered;
 *   - a message of exactly the limit (ST_MSG_MAX_BYTES) arrives: answered
 *     (an error reply for its unknown type, echoing the request id);
 *   - a raw nanomsg message above the receive limit, sent around
 *     st_sock_send as a foreign or broken client would: the daemon may
 *     drop it, but must not stall: a PING after it is answered;
 *   - after all that the daemon still answers PING;
 *   - (expertd, kvd) SHUTDOWN with an unknown flag is refused, and the
 *     daemon goes on serving.
 * And on the daemons' event sockets (PUB; SUB side): the receive limit is
 * explicit there too, so an event of the limit's size would arrive (events
 * are small; checked through st_sock_open, which sets it on every kind).
 */
#include <errno.h>
#include <nanomsg/nn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault_util.h"
#include "st_daemon.h"
#include "st_error.h"
#include "st_msg.h"
#include "st_proto.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL: " __VA_ARGS__);                 \
			fputc('\n', stderr);                                   \
			n_fail++;                                              \
		}                                                              \
	} while (0)

/* Waits for the reply to request `rid` (up to the socket's time-out);
 * returns its status, or a transport error (-ST_E_TIMEOUT: none came). */
static int await_reply(struct st_sock *s, uint64_t rid)
{
	for (;;) {
		struct st_msg_header h;
		void *buf = NULL;
		size_t len = 0;
		int r = st_sock_recv(s, &buf, &len);

		if (r == -EINTR)
			continue;
		if (r < 0)
			return r;
		r = st_proto_decode_header(buf, len, &h);
		free(buf);
		if (r < 0)
			return -100000; /* a reply we cannot read */
		if (h.request_id == rid)
			return h.status;
	}
}

/* A framed message of `total` bytes (header + zero payload). */
static uint8_t *framed(uint16_t type, uint64_t rid, size_t total)
{
	uint8_t *m = calloc(1, total);
	uint32_t magic = ST_PROTO_MAGIC, plen = (uint32_t)(total - 32);
	uint16_t ver = ST_PROTO_VERSION;

	if (!m)
		return NULL;
	memcpy(m, &magic, 4);
	memcpy(m + 4, &ver, 2);
	memcpy(m + 6, &type, 2);
	memcpy(m + 8, &rid, 8);
	memcpy(m + 24, &plen, 4);
	return m;
}

static int ping(struct st_sock *s, uint64_t rid)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	r = st_proto_encode(&w, ST_MSG_PING, rid, 0, 0, NULL, 0);
	if (r == 0)
		r = st_sock_send(s, w.data, w.len);
	st_wbuf_fini(&w);
	return r < 0 ? r : await_reply(s, rid);
}

static void check_socket(struct st_test_inst *t, const char *daemon)
{
	struct st_sock s;
	char ctl[4200];
	uint8_t small[16], *m;
	int r;

	st_run_path(t->run_dir, daemon, "ctl", ctl, sizeof(ctl));
	if (st_sock_open(&s, ST_SOCK_REQ, ctl, 3000, 3000) < 0) {
		CHECK(0, "%s: cannot connect to %s", daemon, ctl);
		return;
	}
	/* 1 MiB + 1: refused at the sender, naming the limit */
	m = framed(0x00ff, 1, ST_MSG_MAX_BYTES + 1);
	r = st_sock_send(&s, m, ST_MSG_MAX_BYTES + 1);
	free(m);
	CHECK(r == -ST_E_LIMIT, "%s: a message of 1 MiB + 1 was not refused "
	      "at the sender (%d)", daemon, r);
	CHECK(strstr(st_strerror(-ST_E_LIMIT), "limit") != NULL,
	      "the error does not name the limit: %s",
	      st_strerror(-ST_E_LIMIT));
	/* ... and 16 bytes after it arrive (a malformed header: answered
	 * with an error) */
	memset(small, 0, sizeof(small));
	r = st_sock_send(&s, small, sizeof(small));
	CHECK(r == 0, "%s: 16-byte send: %d", daemon, r);
	r = await_reply(&s, 0);
	CHECK(r < 0 && r != -ST_E_TIMEOUT && r != -ST_E_NOMSG,
	      "%s: the 16-byte message after the refused one was not answered "
	      "(%s)", daemon, st_strerror(r));
	/* exactly the limit arrives */
	m = framed(0x00ff, 2, ST_MSG_MAX_BYTES);
	r = st_sock_send(&s, m, ST_MSG_MAX_BYTES);
	free(m);
	CHECK(r == 0, "%s: send of exactly the limit: %d", daemon, r);
	r = await_reply(&s, 2);
	/* (kvd refuses an unregistered client first, the others the
	 * unknown type: any error reply to this request id shows it came) */
	CHECK(r < 0 && r != -ST_E_TIMEOUT && r != -ST_E_NOMSG && r != -100000,
	      "%s: a message of exactly %d bytes got %s, want an error reply",
	      daemon, ST_MSG_MAX_BYTES, st_strerror(r));
	/* a raw message over the receive limit: dropped maybe, no stall */
	m = framed(0x00ff, 3, 2 * ST_MSG_MAX_BYTES);
	r = nn_send(s.fd, m, 2 * ST_MSG_MAX_BYTES, 0);
	free(m);
	CHECK(r == 2 * ST_MSG_MAX_BYTES, "%s: raw send failed", daemon);
	r = ping(&s, 4);
	CHECK(r == 0, "%s: PING after an oversized raw message: %s (the "
	      "socket stalled)", daemon, st_strerror(r));
	CHECK(ping(&s, 5) == 0, "%s: PING at the end", daemon);
	/* SHUTDOWN takes an optional u32 of known flags (KEEP_POOL); a stray
	 * value is refused and the daemon goes on */
	if (strcmp(daemon, "computed")) {
		struct st_wbuf w;
		uint32_t bad = 1;

		st_wbuf_init(&w);
		r = st_proto_encode(&w, ST_MSG_SHUTDOWN, 6, 0, 0, &bad, 4);
		if (r == 0)
			r = st_sock_send(&s, w.data, w.len);
		st_wbuf_fini(&w);
		CHECK(r == 0 && await_reply(&s, 6) == -ST_E_PROTO,
		      "%s: SHUTDOWN with unknown flags was not refused", daemon);
		CHECK(ping(&s, 7) == 0, "%s: stopped by a refused SHUTDOWN",
		      daemon);
	}
	st_sock_close(&s);
}

int main(void)
{
	struct st_test_inst t;
	char tmp[4096], store[4200];
	const char *es_args[] = { "--store", store, NULL };
	const char *kv_args[] = { "--budget", "16MiB", NULL };
	const char *cw_args[] = { "--store", store, "--threads", "1", NULL };
	const char *ds[3] = { "expertd", "kvd", "computed" };

	st_test_shared_dir();
	st_test_tmpdir(tmp, sizeof(tmp));
	if (flt_convert("tiny-mixtral", tmp, store, sizeof(store)) < 0)
		return 1;
	st_test_inst_init(&t, "p16");
	if (st_test_daemon_start(&t, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&t, "kvd", kv_args, 30) < 0 ||
	    st_test_daemon_start(&t, "computed", cw_args, 60) < 0) {
		st_test_inst_stop(&t);
		return 1;
	}
	for (int i = 0; i < 3; i++)
		check_socket(&t, ds[i]);
	st_test_inst_stop(&t);
	CHECK(st_test_count_segments(t.name) == 0, "segments left");
	if (!n_fail) {
		st_rm_rf(tmp);
		st_rm_rf(t.run_dir);
	}
	printf("%s: %d failures\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
