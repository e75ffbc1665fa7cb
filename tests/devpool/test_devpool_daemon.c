/*
 * test_devpool_daemon.c — a real expertd answering the device pool
 * messages where there is no GPU (or no CUDA in the build): malformed
 * DEV_EXPORTs get -ST_E_PROTO with the field named, an export of the KV
 * pool is refused by expertd, slots smaller than one expert record are
 * refused with -ST_E_BUDGET before any CUDA call, a well-formed export
 * fails with a CUDA error (or "built without CUDA") instead of crashing,
 * a REVOKE of an epoch never imported is a no-op that names expertd's pid,
 * and expertd keeps serving (PING) and removes its device slot table at a
 * clean stop.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../expertd/es_harness.h"
#include "st_cuda.h"
#include "st_daemon.h"
#include "st_devpool.h"
#include "st_msg.h"
#include "st_proto.h"
#include "test_util.h"

static int failures;

#define CHECK(c) ST_TEST_CHECK(c)

static struct st_sock sock;
static uint64_t req_id;

/* Sends a payload, returns the status; text of an error reply in msg,
 * a decoded device pool reply in rep (when status is 0). */
static int call(uint16_t type, const void *p, size_t len, char *msg,
		size_t n, struct st_devpool_rep *rep)
{
	const uint8_t *pl = NULL;
	size_t plen = 0;
	void *buf = NULL;
	int r = st_rpc_call(&sock, type, ++req_id, 0, p, len, &buf, &pl,
			    &plen);

	msg[0] = 0;
	if (r < 0 && buf && plen >= 4)
		snprintf(msg, n, "%.*s", (int)(plen - 4), pl + 4);
	if (r == 0 && rep && st_devpool_rep_decode(pl, plen, rep, NULL) < 0)
		r = -ST_E_PROTO;
	free(buf);
	return r;
}

static int send_export(const struct st_devpool_export *e, char *msg,
		       size_t n)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	st_devpool_export_encode(&w, e);
	r = call(ST_MSG_DEV_EXPORT, w.data, w.len, msg, n, NULL);
	st_wbuf_fini(&w);
	return r;
}

int main(void)
{
	static uint8_t events[2 * ST_DEVPOOL_HANDLE_BYTES];
	struct st_devpool_export e;
	struct st_devpool_revoke rv;
	struct st_devpool_rep rep;
	struct es_h h;
	struct st_wbuf w;
	char path[1200], msg[1100];
	int r;

	if (es_h_init(&h, "kjv-moe", "devpool") < 0)
		return 1;
	if (es_h_start(&h, "--host-budget", "25%", NULL) != 0) {
		printf("FAIL: expertd did not start\n");
		es_h_fini(&h);
		return 1;
	}
	st_run_path(h.run_dir, "expertd", "ctl", path, sizeof(path));
	r = st_sock_open(&sock, ST_SOCK_REQ, path, 5000, 30000);
	CHECK(r == 0);

	/* malformed: too short */
	r = call(ST_MSG_DEV_EXPORT, "0123456789", 10, msg, sizeof(msg), NULL);
	CHECK(r == -ST_E_PROTO && strstr(msg, "DEV_EXPORT"));
	printf("short EXPORT: %s\n", msg);

	memset(&e, 0, sizeof(e));
	e.pid = (uint32_t)getpid();
	e.kind = ST_DEVPOOL_EXPERTS;
	e.epoch = st_devpool_epoch_new();
	strcpy(e.bus_id, "0000:00:00.0");
	e.slot_bytes = (h.record_bytes + 255) / 256 * 256;
	e.n_slots = 4;
	e.pool_bytes = 4 * e.slot_bytes;
	e.n_events = 2;
	e.events = events;
	memset(e.mem_handle, 0x5a, sizeof(e.mem_handle));
	/* malformed field: 0 slots */
	e.n_slots = 0;
	r = send_export(&e, msg, sizeof(msg));
	CHECK(r == -ST_E_PROTO && strstr(msg, "slots"));
	e.n_slots = 4;
	/* the KV pool is kvd's */
	e.kind = ST_DEVPOOL_KV;
	r = send_export(&e, msg, sizeof(msg));
	CHECK(r == -ST_E_PROTO && strstr(msg, "experts"));
	printf("KV export to expertd: %s\n", msg);
	e.kind = ST_DEVPOOL_EXPERTS;
	/* slots smaller than one record */
	e.slot_bytes = 256;
	e.pool_bytes = 4 * 256;
	r = send_export(&e, msg, sizeof(msg));
	if (st_cuda_built())
		CHECK(r == -ST_E_BUDGET && strstr(msg, "smaller"));
	else
		CHECK(r == -ST_E_UNSUPPORTED);
	printf("small slots: %s\n", msg);
	e.slot_bytes = (h.record_bytes + 255) / 256 * 256;
	e.pool_bytes = 4 * e.slot_bytes;
	/* well formed, but no device here: an error reply, not a crash */
	r = send_export(&e, msg, sizeof(msg));
	CHECK(r == -ST_E_CUDA || r == -ST_E_UNSUPPORTED);
	CHECK(msg[0] != 0);
	printf("export without a device: %s (%s)\n", msg, st_strerror(r));
	/* a revoke of an epoch never imported: idempotent no-op */
	rv.pid = (uint32_t)getpid();
	rv.kind = ST_DEVPOOL_EXPERTS;
	rv.epoch = e.epoch;
	st_wbuf_init(&w);
	st_devpool_revoke_encode(&w, &rv);
	r = call(ST_MSG_DEV_REVOKE, w.data, w.len, msg, sizeof(msg), &rep);
	st_wbuf_fini(&w);
	if (st_cuda_built()) {
		CHECK(r == 0);
		CHECK(rep.handles_open == 0 && rep.epoch == 0);
		CHECK((pid_t)rep.importer_pid == h.pid);
		CHECK(rep.opened_total == rep.closed_total);
	} else {
		CHECK(r == 0 || r == -ST_E_UNSUPPORTED);
	}
	/* still serving */
	r = call(ST_MSG_PING, NULL, 0, msg, sizeof(msg), NULL);
	CHECK(r == -ST_E_PROTO || r == 0); /* PING's reply is not a devpool rep */
	CHECK(kill(h.pid, 0) == 0);
	st_sock_close(&sock);
	CHECK(es_h_stop(&h) == 0);
	/* the clean stop removed every segment, the device table's too */
	CHECK(es_h_count_segments(&h) == 0);
	es_h_fini(&h);
	if (failures)
		printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
