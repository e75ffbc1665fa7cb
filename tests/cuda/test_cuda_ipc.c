/*
 * test_cuda_ipc.c — the device pools across real processes (issue 10):
 * an exporter process (computed's role: st_cuda_export_*, leases of
 * st_devpool.h) and an importer process (expertd's role: the very
 * st_devimporter expertd and kvd use) talk the DEV_EXPORT / DEV_REVOKE
 * messages over a SOCK_SEQPACKET socket pair (the bytes nanomsg carries
 * between the daemons; a socket pair keeps this test free of the daemons'
 * libraries, so scripts/gpu-check can build it with nvcc and cc alone).
 *
 * Scenarios (each a fresh pair of processes, started by fork + exec of
 * this program, so no process initialises CUDA before forking):
 *   basic   import, a copy by the importer on its stream with the event
 *           lane recorded, the exporter pinning the slot and waiting on
 *           that event before reading the bytes back; handle counts.
 *   p18     PITFALLS P18: the importer keeps reading slot 0 on its stream
 *           while holding the lease; the exporter may not free until the
 *           REVOKE is answered; after it, the exporter frees, allocates
 *           the same size and fills it with a canary: the importer must
 *           never have seen the canary.  Then an importer that stops
 *           answering holds its lease (no free) until it dies.
 *   restart the exporter is SIGKILLed mid-lease; the importer notices the
 *           dead pid and closes its handles; a new exporter exports a new
 *           epoch, and the importer imports it (opened/closed balanced),
 *           copies, and the new exporter reads the right bytes.
 *   bench   (argument "bench"): H2D copies of expert-sized records from
 *           the importer's pinned host pool into the imported pool (the
 *           expertd path: one async copy + event record per record) as a
 *           share of one pinned cudaMemcpy of the same bytes.
 *
 * With STRATA_CUDA_FAKE=1 (st_cuda.h) the scenarios run on the fake
 * device (host shared memory), which checks this program and the
 * importer's logic across processes on machines without a GPU (the meson
 * test cuda-ipc-fake); the P18 canary then lands in a new object, so only
 * a GPU run tests the reuse of the same addresses.
 * Without a CUDA device it prints the reason and exits 77.  Where CUDA IPC
 * between processes is not allowed (containers without a shared IPC
 * namespace, MIG), the open fails: reported and skipped (77), not failed.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "st_cuda.h"
#include "st_devimporter.h"
#include "st_devpool.h"
#include "st_proto.h"
#include "st_shm.h"
#include "st_util.h"

#define SLOTS 4
#define SLOT_BYTES (1u << 20)
#define SKIP_IPC 77
#define TEST_KEY(s) (1000 + (s))

/* test-only messages between the two roles */
enum {
	T_COPY = 0x7f01,  /* u32 slot, u32 byte: copy a pattern, publish */
	T_READ = 0x7f02,  /* start reading slot 0 (byte 0x11 expected) */
	T_STATS = 0x7f03, /* -> u64 reads, canary, opened, closed, u32 open */
	T_HANG = 0x7f04,  /* stop answering (holds the lease) */
	T_QUIT = 0x7f05,
};

static int failures;
static char instance[64];

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
	va_list ap;

	failures++;
	va_start(ap, fmt);
	fprintf(stdout, "FAIL [%d]: ", (int)getpid());
	vfprintf(stdout, fmt, ap);
	fputc('\n', stdout);
	fflush(stdout);
	va_end(ap);
}

/* ---- messages over the socket pair ---- */

static int msg_send(int fd, uint16_t type, int32_t status, const void *p,
		    size_t len)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	r = st_proto_encode(&w, type, 1, 0, status, p, len);
	if (r == 0 && send(fd, w.data, w.len, 0) != (ssize_t)w.len)
		r = -errno;
	st_wbuf_fini(&w);
	return r;
}

/* Receives one message into buf (static, 1 MiB); timeout_ms < 0 waits. */
static int msg_recv(int fd, int timeout_ms, struct st_msg_header *h,
		    const uint8_t **payload)
{
	static uint8_t buf[ST_MSG_MAX_BYTES + 64];
	struct pollfd pfd = { fd, POLLIN, 0 };
	ssize_t n;
	int r = poll(&pfd, 1, timeout_ms);

	if (r == 0)
		return -ST_E_TIMEOUT;
	if (r < 0)
		return -errno;
	n = recv(fd, buf, sizeof(buf), 0);
	if (n <= 0)
		return n == 0 ? -ST_E_PEERGONE : -errno;
	r = st_proto_decode_header(buf, (size_t)n, h);
	*payload = buf + ST_PROTO_HEADER_BYTES;
	return r;
}

/* A request and its reply payload (copied into out, at most cap). */
static int call(int fd, uint16_t type, const void *p, size_t len, void *out,
		size_t cap, size_t *ret_len)
{
	struct st_msg_header h;
	const uint8_t *pl;
	int r = msg_send(fd, type, 0, p, len);

	if (r < 0)
		return r;
	r = msg_recv(fd, 30000, &h, &pl);
	if (r < 0)
		return r;
	if (h.type != (type | ST_MSG_REPLY))
		return -ST_E_PROTO;
	if (out)
		memcpy(out, pl, h.payload_len < cap ? h.payload_len : cap);
	if (ret_len)
		*ret_len = h.payload_len;
	return h.status;
}

/* ---- importer role (expertd's part) ---- */

struct importer {
	struct st_devimporter imp;
	uint8_t *host;            /* pinned host pool (SLOTS * SLOT_BYTES) */
	pthread_t reader;
	volatile int reading, stop_reading;
	uint64_t reads, canary;
};

static void *reader_main(void *arg)
{
	struct importer *m = arg;
	uint8_t *buf = malloc(SLOT_BYTES);
	void *stream = NULL;
	struct st_diag d = { "" };

	if (!buf || st_cuda_stream_create(&stream, &d) < 0) {
		fail("reader: %s", d.msg);
		free(buf);
		return NULL;
	}
	while (!m->stop_reading) {
		size_t i;

		if (st_cuda_memcpy_async(buf, st_cuda_import_base(m->imp.cu),
					 SLOT_BYTES, stream, &d) < 0 ||
		    st_cuda_stream_sync(stream, &d) < 0) {
			fail("reader copy: %s", d.msg);
			break;
		}
		m->reads++;
		for (i = 0; i < SLOT_BYTES; i += 4093)
			if (buf[i] == 0xc5) {
				m->canary++;
				break;
			}
	}
	st_cuda_stream_destroy(stream);
	free(buf);
	return NULL;
}

static void stop_reader(struct importer *m)
{
	if (!m->reading)
		return;
	m->stop_reading = 1;
	pthread_join(m->reader, NULL);
	m->reading = 0;
}

static int importer_main(int fd)
{
	struct importer m;
	struct st_diag d = { "" };

	memset(&m, 0, sizeof(m));
	m.host = mmap(NULL, (size_t)SLOTS * SLOT_BYTES, PROT_READ | PROT_WRITE,
		      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m.host == MAP_FAILED)
		return 1;
	st_devimporter_init(&m.imp, ST_DEVPOOL_EXPERTS, instance, m.host,
			    (uint64_t)SLOTS * SLOT_BYTES);
	for (;;) {
		struct st_msg_header h;
		const uint8_t *p;
		struct st_wbuf w;
		int r = msg_recv(fd, 100, &h, &p), reset = 0;

		if (r == -ST_E_TIMEOUT) {
			if (st_devimporter_tick(&m.imp))
				printf("importer: exporter died, handles "
				       "closed\n");
			continue;
		}
		if (r < 0)
			break; /* the peer went away */
		st_wbuf_init(&w);
		switch (h.type) {
		case ST_MSG_DEV_EXPORT:
		case ST_MSG_DEV_REVOKE:
			if (h.type == ST_MSG_DEV_REVOKE)
				stop_reader(&m);
			r = st_devimporter_handle(&m.imp, h.type, p,
						  h.payload_len, &w, &reset, &d);
			if (r < 0) {
				st_wbuf_fini(&w);
				st_wbuf_init(&w);
				st_wbuf_str(&w, d.msg);
			}
			msg_send(fd, h.type | ST_MSG_REPLY, r, w.data, w.len);
			break;
		case T_COPY: {
			uint32_t s, byte, ev;

			memcpy(&s, p, 4);
			memcpy(&byte, p + 4, 4);
			r = -EINVAL;
			if (st_devimporter_active(&m.imp) && s < SLOTS &&
			    st_devslot_claim(m.imp.tab, s, TEST_KEY(s))) {
				memset(m.host + (size_t)s * SLOT_BYTES,
				       (int)byte, SLOT_BYTES);
				ev = s % m.imp.n_events;
				r = st_cuda_import_h2d(m.imp.cu,
					(uint64_t)s * m.imp.slot_bytes,
					m.host + (size_t)s * SLOT_BYTES,
					SLOT_BYTES, ev, &d);
				if (r == 0)
					st_devslot_publish(m.imp.tab, s, ev);
				else
					st_devslot_abort(m.imp.tab, s);
			}
			msg_send(fd, T_COPY | ST_MSG_REPLY, r, NULL, 0);
			break;
		}
		case T_READ:
			r = -EINVAL;
			if (st_devimporter_active(&m.imp) && !m.reading) {
				m.stop_reading = 0;
				r = pthread_create(&m.reader, NULL, reader_main,
						   &m) ? -EAGAIN : 0;
				m.reading = r == 0;
			}
			msg_send(fd, T_READ | ST_MSG_REPLY, r, NULL, 0);
			break;
		case T_STATS: {
			uint64_t o[4] = { m.reads, m.canary,
					  m.imp.st.opened_total,
					  m.imp.st.closed_total };

			msg_send(fd, T_STATS | ST_MSG_REPLY, 0, o, sizeof(o));
			break;
		}
		case T_HANG:
			msg_send(fd, T_HANG | ST_MSG_REPLY, 0, NULL, 0);
			for (;;)
				pause(); /* holds every handle until killed */
		case T_QUIT:
			stop_reader(&m);
			st_wbuf_fini(&w);
			st_devimporter_fini(&m.imp, 1);
			msg_send(fd, T_QUIT | ST_MSG_REPLY, 0, NULL, 0);
			return failures ? 1 : 0;
		default:
			msg_send(fd, h.type | ST_MSG_REPLY, -ST_E_PROTO, NULL,
				 0);
		}
		st_wbuf_fini(&w);
	}
	stop_reader(&m);
	st_devimporter_fini(&m.imp, 1);
	return failures ? 1 : 0;
}

/* ---- exporter role (computed's part) ---- */

struct exporter {
	int fd;
	struct st_cuda_export *x;
	struct st_devpool_export e;
	struct st_devlease_table leases;
	int lease;
	struct st_devpool_rep rep;
	void *stream;
};

/* Exports a fresh allocation; 0, SKIP_IPC when the importer cannot open
 * CUDA IPC handles here, or -1. */
static int do_export(struct exporter *x)
{
	struct st_diag d = { "" };
	struct st_wbuf w;
	uint8_t out[2048];
	size_t n = 0;
	int r;

	r = st_cuda_export_create(&x->x, (uint64_t)SLOTS * SLOT_BYTES, SLOTS,
				  &d);
	if (r < 0) {
		fail("export_create: %s", d.msg);
		return -1;
	}
	st_cuda_export_describe(x->x, &x->e, &d);
	x->e.pid = (uint32_t)getpid();
	x->e.kind = ST_DEVPOOL_EXPERTS;
	x->e.epoch = st_devpool_epoch_new();
	x->e.slot_bytes = SLOT_BYTES;
	x->e.n_slots = SLOTS;
	x->lease = st_devlease_offer(&x->leases, x->e.kind, x->e.epoch);
	st_wbuf_init(&w);
	st_devpool_export_encode(&w, &x->e);
	r = call(x->fd, ST_MSG_DEV_EXPORT, w.data, w.len, out, sizeof(out), &n);
	st_wbuf_fini(&w);
	if (r == -ST_E_CUDA) {
		printf("SKIP: the importer could not open the CUDA IPC handles "
		       "(%.*s)\n", n > 4 ? (int)(n - 4) : 0, out + 4);
		return SKIP_IPC;
	}
	if (r < 0 || st_devpool_rep_decode(out, n, &x->rep, &d) < 0) {
		fail("EXPORT: %s (%.*s)", st_strerror(r),
		     n > 4 ? (int)(n - 4) : 0, out + 4);
		return -1;
	}
	st_devlease_held(&x->leases, x->lease, (int32_t)x->rep.importer_pid,
			 x->e.epoch);
	if (x->rep.handles_open != 1 + SLOTS)
		fail("importer holds %u handles, want %d",
		     x->rep.handles_open, 1 + SLOTS);
	return 0;
}

/* T_COPY then pin, wait on the slot's event, read back. */
static void copy_and_check(struct exporter *x, uint32_t s, uint32_t byte)
{
	struct st_diag d = { "" };
	struct st_shm shm;
	struct st_devslot_table *t;
	uint32_t req[2] = { s, byte }, ev = 0;
	uint8_t *buf = malloc(SLOT_BYTES);
	size_t i;
	int r;

	r = call(x->fd, T_COPY, req, sizeof(req), NULL, 0, NULL);
	if (r < 0 || !buf) {
		fail("T_COPY slot %u: %s", s, st_strerror(r));
		free(buf);
		return;
	}
	memset(&shm, 0, sizeof(shm));
	r = st_shm_attach(&shm, instance, "devexperts", ST_DEVSLOT_SHM_VERSION,
			  0, &d);
	if (r < 0) {
		fail("attach the slot table: %s", d.msg);
		free(buf);
		return;
	}
	t = (struct st_devslot_table *)((uint8_t *)shm.base +
					ST_SHM_HEADER_BYTES);
	if (!st_devslot_pin(t, s, TEST_KEY(s), x->e.epoch, &ev)) {
		fail("slot %u not READY for epoch %llu", s,
		     (unsigned long long)x->e.epoch);
	} else {
		/* wait for exactly that copy, then read on our stream */
		if (st_cuda_export_wait(x->x, ev, x->stream, &d) < 0 ||
		    st_cuda_memcpy_async(buf, (uint8_t *)st_cuda_export_base(
				x->x) + (size_t)s * SLOT_BYTES, SLOT_BYTES,
				x->stream, &d) < 0 ||
		    st_cuda_stream_sync(x->stream, &d) < 0)
			fail("read back: %s", d.msg);
		for (i = 0; i < SLOT_BYTES; i++)
			if (buf[i] != (uint8_t)byte) {
				fail("slot %u byte %zu is 0x%02x, want 0x%02x",
				     s, i, buf[i], byte);
				break;
			}
		st_devslot_unpin(t, s);
	}
	st_shm_detach(&shm);
	free(buf);
}

static int get_stats(struct exporter *x, uint64_t o[4])
{
	size_t n = 0;
	int r = call(x->fd, T_STATS, NULL, 0, o, 4 * sizeof(uint64_t), &n);

	if (r < 0 || n != 4 * sizeof(uint64_t)) {
		fail("T_STATS: %s", st_strerror(r));
		return -1;
	}
	return 0;
}

static int do_revoke(struct exporter *x)
{
	struct st_devpool_revoke rv = { (uint32_t)getpid(), x->e.kind,
					x->e.epoch };
	struct st_devpool_rep rep;
	struct st_diag d = { "" };
	struct st_wbuf w;
	uint8_t out[256];
	size_t n = 0;
	int r;

	st_wbuf_init(&w);
	st_devpool_revoke_encode(&w, &rv);
	r = call(x->fd, ST_MSG_DEV_REVOKE, w.data, w.len, out, sizeof(out),
		 &n);
	st_wbuf_fini(&w);
	if (r < 0 || st_devpool_rep_decode(out, n, &rep, &d) < 0) {
		fail("REVOKE: %s", st_strerror(r));
		return -1;
	}
	if (rep.handles_open != 0)
		fail("after REVOKE the importer holds %u handles",
		     rep.handles_open);
	st_devlease_released(&x->leases, x->e.kind, x->e.epoch,
			     (int32_t)rep.importer_pid);
	return 0;
}

static int exporter_main(int fd, const char *scenario)
{
	struct exporter x;
	struct st_diag d = { "" };
	uint64_t o[4];
	int r;

	memset(&x, 0, sizeof(x));
	x.fd = fd;
	if (st_cuda_stream_create(&x.stream, &d) < 0) {
		fail("stream: %s", d.msg);
		return 1;
	}
	r = do_export(&x);
	if (r)
		return r == SKIP_IPC ? SKIP_IPC : 1;
	if (!strcmp(scenario, "basic")) {
		copy_and_check(&x, 2, 0x22);
		copy_and_check(&x, 2, 0x23); /* the slot rewritten */
		copy_and_check(&x, 3, 0x33);
		do_revoke(&x);
		if (st_devlease_may_free(&x.leases, x.e.kind, x.e.epoch, 0,
					 NULL, NULL) != 1)
			fail("lease not released after REVOKE");
		st_cuda_export_destroy(x.x);
		if (get_stats(&x, o) == 0 && (o[2] != 1 + SLOTS || o[3] != o[2]))
			fail("handles opened %llu closed %llu, want %d each",
			     (unsigned long long)o[2], (unsigned long long)o[3],
			     1 + SLOTS);
	} else if (!strcmp(scenario, "p18")) {
		uint8_t *fill = malloc(SLOT_BYTES);
		struct st_cuda_export *again = NULL;
		int i;

		memset(fill, 0x11, SLOT_BYTES);
		st_cuda_memcpy_async(st_cuda_export_base(x.x), fill,
				     SLOT_BYTES, x.stream, &d);
		st_cuda_stream_sync(x.stream, &d);
		call(fd, T_READ, NULL, 0, NULL, 0, NULL);
		usleep(200000);
		/* held by a live importer: never free */
		if (st_devlease_may_free(&x.leases, x.e.kind, x.e.epoch, 1,
					 NULL, NULL))
			fail("may_free while the importer holds the lease");
		do_revoke(&x);
		if (!st_devlease_may_free(&x.leases, x.e.kind, x.e.epoch, 0,
					  NULL, NULL))
			fail("lease not released after REVOKE");
		st_cuda_export_destroy(x.x);
		/* the same size again (cudaMalloc: on a GPU most likely the
		 * same addresses), filled with the canary */
		if (st_cuda_export_create(&again, (uint64_t)SLOTS * SLOT_BYTES,
					  1, &d) == 0) {
			uint8_t *c5 = malloc(SLOT_BYTES);

			memset(c5, 0xc5, SLOT_BYTES);
			for (i = 0; i < SLOTS; i++)
				st_cuda_memcpy_async((uint8_t *)
					st_cuda_export_base(again) +
					(size_t)i * SLOT_BYTES, c5, SLOT_BYTES,
					x.stream, &d);
			st_cuda_stream_sync(x.stream, &d);
			free(c5);
		}
		usleep(200000);
		if (get_stats(&x, o) == 0) {
			printf("p18: importer read slot 0 %llu times, canary "
			       "seen %llu times\n", (unsigned long long)o[0],
			       (unsigned long long)o[1]);
			if (o[0] == 0)
				fail("the importer never read");
			if (o[1] != 0)
				fail("the importer saw the exporter's reused "
				     "memory (P18)");
			if (o[2] != o[3])
				fail("handles opened %llu, closed %llu",
				     (unsigned long long)o[2],
				     (unsigned long long)o[3]);
		}
		st_cuda_export_destroy(again);
		free(fill);
		/* an importer that stops answering keeps its lease */
		memset(&x.leases, 0, sizeof(x.leases));
		if (do_export(&x) != 0)
			return 1;
		call(fd, T_HANG, NULL, 0, NULL, 0, NULL);
		for (i = 0; i < 10; i++) {
			if (st_devlease_may_free(&x.leases, x.e.kind,
						 x.e.epoch, 0, NULL, NULL))
				fail("may_free while a silent importer "
				     "lives");
			usleep(50000);
		}
		kill((pid_t)x.rep.importer_pid, SIGKILL);
		for (i = 0; i < 100 && !st_devlease_may_free(&x.leases,
				x.e.kind, x.e.epoch, 0, NULL, NULL); i++)
			usleep(50000);
		if (i == 100)
			fail("the dead importer's lease never ended");
		st_cuda_export_destroy(x.x);
		return failures ? 1 : 0;
	} else if (!strcmp(scenario, "restart-a")) {
		copy_and_check(&x, 1, 0x41);
		printf("exporter A: killing itself mid-lease\n");
		fflush(stdout);
		kill(getpid(), SIGKILL);
	} else if (!strcmp(scenario, "restart-b")) {
		/* A's 1 + SLOTS handles were closed, ours opened */
		if (x.rep.opened_total != 2 * (1 + SLOTS) ||
		    x.rep.closed_total != 1 + SLOTS)
			fail("after the restart: opened %llu closed %llu, "
			     "want %d and %d",
			     (unsigned long long)x.rep.opened_total,
			     (unsigned long long)x.rep.closed_total,
			     2 * (1 + SLOTS), 1 + SLOTS);
		copy_and_check(&x, 1, 0x42);
		do_revoke(&x);
		st_cuda_export_destroy(x.x);
	}
	call(fd, T_QUIT, NULL, 0, NULL, 0, NULL);
	st_cuda_stream_destroy(x.stream);
	return failures ? 1 : 0;
}

/* ---- bench: H2D copies of expert records vs pinned cudaMemcpy ---- */

static double now_s(void)
{
	return (double)st_now_ns() * 1e-9;
}

static int bench_main(int fd, const char *role)
{
	/* 64 records of 8 MiB (an expert of a large MoE: three 2048 x 4096
	 * FP4 matrices with scales is ~13 MiB) and of 1 MiB */
	const uint64_t total = 512ull << 20;
	struct st_diag d = { "" };

	if (!strcmp(role, "exporter")) {
		struct st_cuda_export *x;
		struct st_devpool_export e;
		struct st_wbuf w;
		uint8_t out[256];
		size_t n;
		int r;

		if (st_cuda_export_create(&x, total, 64, &d) < 0) {
			fail("%s", d.msg);
			return 1;
		}
		st_cuda_export_describe(x, &e, &d);
		e.pid = (uint32_t)getpid();
		e.kind = ST_DEVPOOL_EXPERTS;
		e.epoch = st_devpool_epoch_new();
		e.slot_bytes = 8u << 20;
		e.n_slots = 64;
		st_wbuf_init(&w);
		st_devpool_export_encode(&w, &e);
		r = call(fd, ST_MSG_DEV_EXPORT, w.data, w.len, out,
			 sizeof(out), &n);
		st_wbuf_fini(&w);
		if (r == 0) /* the importer measures, then QUITs */
			r = call(fd, T_QUIT, NULL, 0, NULL, 0, NULL);
		st_cuda_export_destroy(x);
		return r == -ST_E_CUDA ? SKIP_IPC : r < 0;
	}
	/* importer: open, then measure */
	{
		struct st_msg_header h;
		const uint8_t *p;
		struct st_devimporter m;
		struct st_wbuf w;
		uint8_t *host = mmap(NULL, total, PROT_READ | PROT_WRITE,
				     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		void *dst = NULL;
		double t, base_gbs, gbs[2];
		uint64_t rec[2] = { 8u << 20, 1u << 20 };
		int reset, r, k;

		if (host == MAP_FAILED)
			return 1;
		memset(host, 7, total);
		st_devimporter_init(&m, ST_DEVPOOL_EXPERTS, instance, host,
				    total);
		if (msg_recv(fd, 30000, &h, &p) < 0)
			return 1;
		st_wbuf_init(&w);
		r = st_devimporter_handle(&m, h.type, p, h.payload_len, &w,
					  &reset, &d);
		msg_send(fd, h.type | ST_MSG_REPLY, r, w.data, w.len);
		st_wbuf_fini(&w);
		if (r < 0) {
			printf("SKIP: import failed: %s\n", d.msg);
			return SKIP_IPC;
		}
		/* baseline: one pinned cudaMemcpy of the same bytes */
		if (cudaMalloc(&dst, total) != cudaSuccess)
			return 1;
		cudaMemcpy(dst, host, total, cudaMemcpyHostToDevice);
		t = now_s();
		for (k = 0; k < 3; k++)
			cudaMemcpy(dst, host, total, cudaMemcpyHostToDevice);
		base_gbs = 3.0 * (double)total / (now_s() - t) / 1e9;
		for (int v = 0; v < 2; v++) {
			uint64_t nrec = total / rec[v];

			t = now_s();
			for (k = 0; k < 3; k++) {
				for (uint64_t i = 0; i < nrec; i++)
					st_cuda_import_h2d(m.cu, i * rec[v],
						host + i * rec[v], rec[v],
						(uint32_t)(i % m.n_events), &d);
				st_cuda_import_drain(m.cu, &d);
			}
			gbs[v] = 3.0 * (double)total / (now_s() - t) / 1e9;
		}
		printf("H2D pinned cudaMemcpy: %.1f GB/s\n", base_gbs);
		printf("H2D expert copies (8 MiB records, event per record): "
		       "%.1f GB/s = %.0f %% of pinned cudaMemcpy (target >= "
		       "90 %%)\n", gbs[0], 100.0 * gbs[0] / base_gbs);
		printf("H2D expert copies (1 MiB records): %.1f GB/s = %.0f "
		       "%%\n", gbs[1], 100.0 * gbs[1] / base_gbs);
		cudaFree(dst);
		if (msg_recv(fd, 30000, &h, &p) == 0)
			msg_send(fd, h.type | ST_MSG_REPLY, 0, NULL, 0);
		st_devimporter_fini(&m, 1);
		return 0;
	}
}

/* ---- orchestration (no CUDA in this process) ---- */

static pid_t spawn(const char *self, const char *role, const char *arg,
		   int fd)
{
	char fds[16];
	pid_t p = fork();

	if (p == 0) {
		snprintf(fds, sizeof(fds), "%d", fd);
		execl(self, self, role, arg, fds, instance, (char *)NULL);
		_exit(127);
	}
	return p;
}

static int wait_rc(pid_t p)
{
	int st = 0;

	if (waitpid(p, &st, 0) < 0)
		return -1;
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return WEXITSTATUS(st);
}

/* Runs importer + exporter(s) of a scenario; 0, 77 or 1. */
static int scenario(const char *self, const char *name)
{
	int sv[2], rc_i, rc_e;
	pid_t imp, exp;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0)
		return 1;
	imp = spawn(self, "importer", name, sv[1]);
	if (!strcmp(name, "restart")) {
		exp = spawn(self, "exporter", "restart-a", sv[0]);
		rc_e = wait_rc(exp);
		if (rc_e == SKIP_IPC) {
			close(sv[0]);
			wait_rc(imp);
			return SKIP_IPC;
		}
		if (rc_e != 128 + SIGKILL)
			printf("FAIL: exporter A ended with %d, not SIGKILL\n",
			       rc_e);
		usleep(500000); /* the importer's tick notices the pid */
		exp = spawn(self, "exporter", "restart-b", sv[0]);
		rc_e = wait_rc(exp) == 0 && rc_e == 128 + SIGKILL ? 0 : 1;
	} else {
		exp = spawn(self, !strcmp(name, "bench") ? "bench" :
			    "exporter", !strcmp(name, "bench") ? "exporter" :
			    name, sv[0]);
		rc_e = wait_rc(exp);
	}
	close(sv[0]);
	rc_i = wait_rc(imp);
	close(sv[1]);
	if (rc_e == SKIP_IPC)
		return SKIP_IPC;
	/* p18 kills its importer on purpose */
	if (!strcmp(name, "p18") && rc_i == 128 + SIGKILL)
		rc_i = 0;
	printf("%s: exporter %d, importer %d\n", name, rc_e, rc_i);
	return rc_e == 0 && rc_i == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	char reason[300];
	int rc = 0, skipped = 0;
	const char *list[] = { "basic", "p18", "restart" };

	if (argc >= 5) { /* a role: ROLE ARG FD INSTANCE */
		int fd = atoi(argv[3]);

		snprintf(instance, sizeof(instance), "%s", argv[4]);
		if (!strcmp(argv[1], "probe"))
			return st_cuda_device_count(reason, sizeof(reason)) ?
				       0 : (printf("SKIP: no CUDA device: %s\n",
						   reason), 77);
		if (!strcmp(argv[1], "importer"))
			return !strcmp(argv[2], "bench") ?
				       bench_main(fd, "importer") :
				       importer_main(fd);
		if (!strcmp(argv[1], "bench"))
			return bench_main(fd, argv[2]);
		return exporter_main(fd, argv[2]);
	}
	snprintf(instance, sizeof(instance), "cudaipc-%d", (int)getpid());
	{
		pid_t p = spawn(argv[0], "probe", "-", -1);
		int r = wait_rc(p);

		if (r == 77)
			return 77; /* the probe said why, in one line */
		if (r != 0)
			return 1;
	}
	if (argc == 2 && !strcmp(argv[1], "bench")) {
		if (st_cuda_is_fake()) {
			printf("SKIP: no bandwidth on the fake device\n");
			return 77;
		}
		return scenario(argv[0], "bench");
	}
	for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) {
		int r = scenario(argv[0], list[i]);

		if (r == SKIP_IPC)
			skipped++;
		else if (r)
			rc = 1;
	}
	if (skipped == 3) {
		printf("SKIP: cross-process CUDA IPC is not available here\n");
		return 77;
	}
	return rc;
}
