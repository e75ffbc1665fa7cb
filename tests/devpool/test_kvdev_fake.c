/*
 * test_kvdev_fake.c — kvd copying KV pages in and out of the device KV
 * page pool (issue 10) on the fake device (STRATA_CUDA_FAKE=1: device
 * memory is host shared memory, copies are memcpy; st_cuda.h), with the
 * real kvd binary and computed's client side (computed/device/cw_kvdev.c).  This
 * process plays computed: it exports the pool itself (as cw_devpool does)
 * and reads device pages through their fake device addresses.
 *
 *   1. a "computed" child exports epoch A, gets its pages on the device
 *      with the host bytes, and is killed -9: kvd drops the import;
 *   2. a request before any export is refused (-ST_E_UNSUPPORTED), and
 *      after it one for too many rows, an unknown or another client's
 *      sequence (-ST_E_LIMIT, -ST_E_NOTFOUND, -EPERM);
 *      a new export (epoch B, this process): the pages of a new sequence
 *      read on the device equal the host rows (every byte kv_stream_page_used
 *      covers), and kvd serves no slot of epoch A;
 *   3. rows appended on the host: the next step's device copy has them
 *      (not stale); the same rows again: no copy, the same slots;
 *   4. a pinned page is never rewritten: with step S1 still pinned, rows
 *      appended on the host go into another slot for S2, S1's bytes are
 *      unchanged; and raced: a thread pins whatever slot is READY and
 *      checks its bytes are its page's while kvd, driven by steps over 16
 *      pages through 12 slots, claims and rewrites every slot it can;
 *   5. rows written on the device and marked dirty reach the host when
 *      kvd spills the sequence (it is restored from the spill file with
 *      them: host rows == device-written rows);
 *      a fork's copy of the partial last page has them too;
 *   6. kvd kill -9 with dirty device rows not yet copied back: the
 *      restarted kvd, sent the same epoch again, copies them back before
 *      it resets its table (host rows == device rows), the table holds no
 *      READY slot, and the next step's pages equal the host bytes.
 * Without a CUDA build: exit 77.  STRATA_KVDEV_GPU=1 (test kvdev-gpu,
 * suite cuda, scripts/gpu-check) runs the same on a real device through
 * CUDA IPC (exit 77 without one): device bytes are read and written with
 * cudaMemcpy on the legacy stream acquire made wait on kvd's copies.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../kvd/kv_test_util.h"
#include "cw_kvdev.h"
#include "kv_client.h"
#include "kv_devpage.h"
#include "st_cuda.h"
#include "st_daemon.h"
#include "st_devimporter.h"
#include "st_devpool.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_util.h"
#include "test_util.h"

static int failures;

#define CHECK(c) ST_TEST_CHECK(c)

#define N_STREAMS 2
#define PAGE_ROWS 16
#define N_SLOTS 12
static const uint32_t rb[N_STREAMS] = { 64, 192 };
static struct kvd_inst kvd;

struct exporter {
	struct st_cuda_export *x;
	struct st_devpool_export e;
	struct cw_kvdev_pool pool;
};

static uint8_t pat(uint32_t tag, uint32_t s, uint32_t row, uint32_t i)
{
	return (uint8_t)(tag * 131u + s * 17u + row * 7u + i * 3u + 1u);
}

/* Device memory through the runtime (memcpy on the fake device), on the
 * legacy stream that acquire made wait on kvd's copies. */
static void dev_read(void *dst, const uint8_t *dev, size_t n)
{
	if (st_cuda_memcpy_async(dst, dev, n, NULL, NULL) < 0 ||
	    st_cuda_stream_sync(NULL, NULL) < 0) {
		printf("FAIL: device read\n");
		failures++;
	}
}

static void dev_write(uint8_t *dev, const void *src, size_t n)
{
	if (st_cuda_memcpy_async(dev, src, n, NULL, NULL) < 0 ||
	    st_cuda_stream_sync(NULL, NULL) < 0) {
		printf("FAIL: device write\n");
		failures++;
	}
}

/* Writes rows [r0, r1) of stream s (tag) into a device page holding rows
 * of page index r0 / PAGE_ROWS, and marks them written. */
static void dev_rows(struct cw_kvdev *k, const struct cw_kvdev_step *st,
		     uint32_t ix, uint32_t s, uint32_t r0, uint32_t r1,
		     uint32_t tag)
{
	uint8_t row[192];

	for (uint32_t r = r0; r < r1; r++) {
		for (uint32_t i = 0; i < rb[s]; i++)
			row[i] = pat(tag, s, r, i);
		dev_write(st->ptr[ix] + (r % PAGE_ROWS) * rb[s], row, rb[s]);
	}
	CHECK(cw_kvdev_mark_written(k, st, ix, (r0 % PAGE_ROWS) * rb[s],
				    ((r1 - 1) % PAGE_ROWS + 1) * rb[s]) == 0);
}

/* DEV_EXPORT (or REVOKE when revoke) of x's pool to kvd: 0 or the reply's
 * negative status. */
static int send_dev(struct exporter *x, int revoke, uint64_t *ret_epoch)
{
	struct st_sock sock;
	struct st_wbuf w;
	struct st_devpool_rep rep;
	char path[4300];
	const uint8_t *pl = NULL;
	size_t plen = 0;
	void *buf = NULL;
	int r;

	st_run_path(kvd.run_dir, "kvd", "ctl", path, sizeof(path));
	if (st_sock_open(&sock, ST_SOCK_REQ, path, 5000, 30000) < 0)
		return -ECONNREFUSED;
	st_wbuf_init(&w);
	if (revoke) {
		struct st_devpool_revoke rv = { x->e.pid, x->e.kind,
						x->e.epoch };

		st_devpool_revoke_encode(&w, &rv);
	} else {
		st_devpool_export_encode(&w, &x->e);
	}
	r = st_rpc_call(&sock, revoke ? ST_MSG_DEV_REVOKE : ST_MSG_DEV_EXPORT,
			1, 0, w.data, w.len, &buf, &pl, &plen);
	if (r < 0 && buf && plen > 4)
		printf("kvd: %.*s\n", (int)(plen - 4), pl + 4);
	if (r == 0 && st_devpool_rep_decode(pl, plen, &rep, NULL) < 0)
		r = -ST_E_PROTO;
	if (r == 0 && ret_epoch)
		*ret_epoch = rep.epoch;
	free(buf);
	st_wbuf_fini(&w);
	st_sock_close(&sock);
	return r;
}

static int export_new(struct exporter *x)
{
	struct st_diag d = { "" };
	uint64_t slot_bytes = (PAGE_ROWS * 192 + 255) / 256 * 256, ep = 0;
	int r;

	memset(x, 0, sizeof(*x));
	r = st_cuda_export_create(&x->x, N_SLOTS * slot_bytes, N_SLOTS, &d);
	if (r == 0)
		r = st_cuda_export_describe(x->x, &x->e, &d);
	if (r < 0) {
		printf("export: %s\n", d.msg);
		return r;
	}
	x->e.pid = (uint32_t)getpid();
	x->e.kind = ST_DEVPOOL_KV;
	x->e.epoch = st_devpool_epoch_new();
	x->e.slot_bytes = slot_bytes;
	x->e.n_slots = N_SLOTS;
	r = send_dev(x, 0, &ep);
	if (r == 0 && ep != x->e.epoch)
		r = -ST_E_PROTO;
	x->pool.x = x->x;
	x->pool.epoch = x->e.epoch;
	x->pool.n_slots = N_SLOTS;
	x->pool.n_events = x->e.n_events;
	x->pool.slot_bytes = slot_bytes;
	return r;
}

static struct kv_client *client_open(const char *name)
{
	struct kv_client *c = NULL;
	struct st_diag d = { "" };

	if (kv_client_open(kvd.run_dir, kvd.name, name, 5000, &c, &d) < 0 ||
	    kv_client_declare(c, N_STREAMS, rb, PAGE_ROWS, &d) < 0) {
		printf("kv client: %s\n", d.msg);
		kv_client_close(c);
		return NULL;
	}
	kv_client_set_restart_wait(c, 10000);
	return c;
}

/* Writes host rows [r0, r1) of seq with tag. */
static void host_write(struct kv_client *c, uint32_t seq, uint32_t r0,
		       uint32_t r1, uint32_t tag)
{
	for (uint32_t s = 0; s < N_STREAMS; s++)
		for (uint32_t r = r0; r < r1; r++) {
			uint8_t *p = kv_client_row_writable(c, seq, (int)s, r);

			CHECK(p != NULL);
			for (uint32_t i = 0; p && i < rb[s]; i++)
				p[i] = pat(tag, s, r, i);
		}
}

/* Every page of step entry 0 (rows [0, n_rows)) on the device and equal
 * to the host rows; returns the pages that were compared. */
static int check_step(struct kv_client *c, uint32_t seq, uint32_t n_rows,
		      const struct cw_kvdev_step *st)
{
	int n = 0;

	for (uint32_t s = 0; s < N_STREAMS; s++)
		for (uint32_t r = 0; r < n_rows; r++) {
			uint32_t ix = cw_kvdev_index(st, 0, s, r / PAGE_ROWS);
			const uint8_t *h = kv_client_row(c, seq, (int)s, r);
			uint8_t dv[192];

			if (!st->ptr[ix]) {
				printf("FAIL: seq %x stream %u page %u not on "
				       "the device\n", seq, s, r / PAGE_ROWS);
				failures++;
				return n;
			}
			dev_read(dv, st->ptr[ix] + (r % PAGE_ROWS) * rb[s],
				 rb[s]);
			if (!h || memcmp(h, dv, rb[s]) != 0) {
				printf("FAIL: seq %x stream %u row %u: device "
				       "bytes differ from the host row\n", seq,
				       s, r);
				failures++;
				return n;
			}
			n += r % PAGE_ROWS == 0;
		}
	return n;
}

static int acquire(struct cw_kvdev *k, uint32_t seq, uint32_t n_rows,
		   struct cw_kvdev_step *st)
{
	struct kv_reserve_entry e = { seq, n_rows };
	struct st_diag d = { "" };
	int r = cw_kvdev_acquire(k, 1, &e, NULL, st, &d);

	/* right after kvd's first import it may still be pinning its host
	 * pool in the background (-ST_E_BUSY: computed reads host rows) */
	for (int i = 0; r == -ST_E_BUSY && i < 500; i++) {
		st_sleep_ns(10ull * 1000 * 1000);
		r = cw_kvdev_acquire(k, 1, &e, NULL, st, &d);
	}
	if (r < 0)
		printf("acquire: %s (%s)\n", d.msg, st_strerror(r));
	return r;
}

static int reserve(struct kv_client *c, uint32_t seq, uint32_t n_rows)
{
	struct st_diag d = { "" };
	int r = kv_client_seq_reserve(c, 1, &seq, &n_rows, &d);

	if (r < 0)
		printf("reserve: %s\n", d.msg);
	return r;
}

/* The computed killed in phase 1. */
static void child_computed(int fd)
{
	struct exporter x;
	struct kv_client *c;
	struct cw_kvdev *k = NULL;
	struct cw_kvdev_step st;
	struct st_diag d = { "" };
	uint32_t seq;
	int ok = 0;

	if (export_new(&x) == 0 && (c = client_open("child")) &&
	    kv_client_seq_create(c, &seq, &d) == 0 &&
	    reserve(c, seq, 20) == 0 &&
	    cw_kvdev_open(&k, c, &x.pool, kvd.name, &d) == 0) {
		host_write(c, seq, 0, 20, 1);
		if (acquire(k, seq, 20, &st) == 0) {
			ok = check_step(c, seq, 20, &st) == 4 &&
			     failures == 0;
			/* pins kept: the kill must not leave them blocking
			 * the next epoch's slots */
		}
	}
	if (write(fd, ok ? "y" : "n", 1) != 1)
		_exit(2);
	pause();
	_exit(0);
}

/* Maps kvd's device KV table read-only (for the checks). */
static struct st_devslot_table *table_map(struct st_shm *shm)
{
	if (st_shm_attach(shm, kvd.name, "devkv", ST_DEVSLOT_SHM_VERSION, 0,
			  NULL) < 0)
		return NULL;
	return (struct st_devslot_table *)((uint8_t *)shm->base +
					   ST_SHM_HEADER_BYTES);
}

/* --- the pin race across processes: this thread pins whatever slot the
 * table shows READY and checks its bytes are its page's while kvd, driven
 * by the main thread's steps over more pages than slots, claims and
 * rewrites every slot it can --- */
#define RACE_SEQS 4
#define RACE_ROWS 32
struct race {
	struct st_devslot_table *t;
	const uint8_t *base;
	const struct st_cuda_export *x;
	uint64_t epoch, slot_bytes;
	uint32_t page_tag[64], page_stream[64], page_pi[64]; /* tag 0: ? */
	_Atomic int stop;
	long pinned, torn, unknown;
};

static void *race_reader(void *arg)
{
	struct race *r = arg;
	uint64_t x = 0x9e3779b97f4a7c15ull;

	while (!atomic_load(&r->stop)) {
		uint32_t s, ev, page, gen;
		uint64_t key;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		s = (uint32_t)(x % N_SLOTS);
		key = atomic_load(&r->t->slot[s].key);
		if (!key || !st_devslot_pin(r->t, s, key, r->epoch, &ev))
			continue;
		st_devkv_key_split(key, &page, &gen);
		if (page >= 64 || !r->page_tag[page]) {
			r->unknown++; /* a page of the other phases */
		} else {
			uint8_t b[PAGE_ROWS * 192];
			uint32_t st = r->page_stream[page];

			/* after the copy kvd recorded on the slot's lane */
			if (st_cuda_export_wait(r->x, ev, NULL, NULL) < 0)
				r->torn++;
			dev_read(b, r->base + (uint64_t)s * r->slot_bytes,
				 PAGE_ROWS * rb[st]);
			r->pinned++;
			for (uint32_t k = 0; k < 64; k++) {
				uint32_t row = (k * 7) % PAGE_ROWS;
				uint32_t i = (k * 37) % rb[st];

				if (b[row * rb[st] + i] !=
				    pat(r->page_tag[page], st,
					r->page_pi[page] * PAGE_ROWS + row, i))
					r->torn++;
			}
		}
		st_devslot_unpin(r->t, s);
	}
	return NULL;
}

static void pin_race(struct kv_client *c, struct cw_kvdev *k,
		     struct exporter *x, struct st_devslot_table *t)
{
	struct race *r = calloc(1, sizeof(*r));
	uint32_t seq[RACE_SEQS], last[RACE_SEQS][4] = { { 0 } };
	struct cw_kvdev_step st;
	struct st_diag d = { "" };
	long steps = 0, moved = 0;
	pthread_t th;
	uint64_t end = st_now_ns() + 20000000000ull;
	int f0 = failures;

	if (!r)
		return;
	r->t = t;
	r->base = st_cuda_export_base(x->x);
	r->x = x->x;
	r->epoch = x->e.epoch;
	r->slot_bytes = x->e.slot_bytes;
	for (int i = 0; i < RACE_SEQS; i++) {
		CHECK(kv_client_seq_create(c, &seq[i], &d) == 0);
		CHECK(reserve(c, seq[i], RACE_ROWS) == 0);
		host_write(c, seq[i], 0, RACE_ROWS, 10 + (uint32_t)i);
		CHECK(acquire(k, seq[i], RACE_ROWS, &st) == 0);
		for (uint32_t s = 0; s < N_STREAMS; s++)
			for (uint32_t p = 0; p < 2; p++) {
				uint32_t pg = st.pages[cw_kvdev_index(&st, 0,
								      s, p)]
						      .page;

				if (pg < 64) {
					r->page_tag[pg] = 10 + (uint32_t)i;
					r->page_stream[pg] = s;
					r->page_pi[pg] = p;
				}
			}
		cw_kvdev_release(k, &st, NULL);
	}
	CHECK(pthread_create(&th, NULL, race_reader, r) == 0);
	while ((steps < 400 || r->pinned < 2000) && st_now_ns() < end &&
	       failures == f0) {
		int i = (int)(steps % RACE_SEQS);

		if (acquire(k, seq[i], RACE_ROWS, &st) < 0) {
			failures++;
			break;
		}
		/* pages the reader holds pinned may be answered from the
		 * host; what is on the device is the page's */
		for (uint32_t j = 0; j < st.n_pages; j++) {
			if (st.ptr[j] && last[i][j] != st.pages[j].slot + 1)
				moved++;
			last[i][j] = st.ptr[j] ? st.pages[j].slot + 1 : 0;
		}
		for (uint32_t s = 0; s < N_STREAMS; s++)
			for (uint32_t row = 0; row < RACE_ROWS; row++) {
				uint32_t ix = cw_kvdev_index(&st, 0, s,
							     row / PAGE_ROWS);

				uint8_t dv[192];

				if (!st.ptr[ix])
					continue;
				dev_read(dv, st.ptr[ix] + (row % PAGE_ROWS) *
						     rb[s], rb[s]);
				if (memcmp(dv, kv_client_row(c, seq[i], (int)s,
							     row),
					   rb[s]) != 0) {
					printf("FAIL: race step %ld: stream %u "
					       "row %u differs\n", steps, s,
					       row);
					failures++;
				}
			}
		cw_kvdev_release(k, &st, NULL);
		steps++;
	}
	atomic_store(&r->stop, 1);
	pthread_join(th, NULL);
	printf("4b. pin race: %ld steps (%ld pages moved to another slot), "
	       "%ld pinned reads, %ld torn\n", steps, moved, r->pinned,
	       r->torn);
	CHECK(r->torn == 0);
	CHECK(steps >= 400 && r->pinned >= 2000 && moved >= 100);
	for (int i = 0; i < RACE_SEQS; i++)
		CHECK(kv_client_seq_free(c, seq[i]) == 0);
	free(r);
}

int main(void)
{
	struct exporter x;
	struct kv_client *c;
	struct cw_kvdev *k = NULL;
	struct cw_kvdev_step s1, s2;
	struct st_diag d = { "" };
	struct st_shm tshm = { 0 };
	struct st_devslot_table *t;
	uint32_t a, b, big, n;
	uint8_t snap[3072], snap2[3072];
	int fds[2], r, ready;
	pid_t child;
	char ch = 0;

	if (!st_cuda_built()) {
		printf("SKIP: built without CUDA (the fake device is in "
		       "st_cuda.c)\n");
		return 77;
	}
	if (getenv("STRATA_KVDEV_GPU") && !strcmp(getenv("STRATA_KVDEV_GPU"),
						  "1")) {
		/* a real device: probed in a child, so that this process
		 * starts CUDA only after the fork of phase 1 */
		int st = 0;

		unsetenv("STRATA_CUDA_FAKE");
		child = fork();
		if (child == 0) {
			char why[300] = "";

			if (st_cuda_device_count(why, sizeof(why)) > 0)
				_exit(0);
			printf("SKIP: no CUDA device: %s\n", why);
			fflush(stdout);
			_exit(77);
		}
		if (child < 0 || waitpid(child, &st, 0) < 0 ||
		    !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			return child > 0 && WIFEXITED(st) &&
			       WEXITSTATUS(st) == 77 ? 77 : 1;
		printf("on the GPU (STRATA_KVDEV_GPU=1)\n");
	} else {
		setenv("STRATA_CUDA_FAKE", "1", 1);
	}
	kvd_inst_init(&kvd, "kvdev");
	/* 64 pages of 3 KiB (2 streams x 16 rows x 192 bytes), spill room */
	snprintf(kvd.budget, sizeof(kvd.budget), "196608");
	snprintf(kvd.spill_budget, sizeof(kvd.spill_budget), "1MiB");
	if (kvd_start(&kvd, NULL) < 0) {
		printf("FAIL: kvd did not start\n");
		kvd_cleanup(&kvd);
		return 1;
	}

	/* 1. a computed that dies with pins held */
	if (pipe(fds) < 0)
		return 1;
	child = fork();
	if (child == 0)
		child_computed(fds[1]);
	CHECK(read(fds[0], &ch, 1) == 1 && ch == 'y');
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	/* kvd notices the dead exporter (its loop looks every ~100 ms) */
	t = NULL;
	for (int i = 0; i < 100; i++) {
		if (!t)
			t = table_map(&tshm);
		if (t && atomic_load(&t->epoch) == 0)
			break;
		st_sleep_ns(50ull * 1000 * 1000);
	}
	CHECK(t && atomic_load(&t->epoch) == 0);
	printf("1. computed killed: kvd dropped epoch A\n");

	/* 2. a new computed: epoch B (a request before the export: refused,
	 * nothing imported) */
	c = client_open("computed");
	CHECK(c != NULL);
	if (!c)
		goto out;
	CHECK(kv_client_seq_create(c, &a, &d) == 0);
	CHECK(reserve(c, a, 40) == 0);
	{
		struct kv_reserve_entry e1 = { a, 40 };
		struct kv_devpage pg[6];
		uint64_t ep;

		CHECK(kv_client_seq_device(c, 1, &e1, &ep, pg, 6, &d) ==
		      -ST_E_UNSUPPORTED);
		printf("before an export: %s\n", d.msg);
	}
	r = export_new(&x);
	CHECK(r == 0);
	if (r < 0)
		goto out;
	{
		struct kv_reserve_entry e1 = { a, 41 };
		struct kv_devpage pg[8];
		struct kv_client *c2 = client_open("other");
		uint64_t ep;

		/* more rows than the sequence holds, no such sequence, another
		 * client's sequence */
		CHECK(kv_client_seq_device(c, 1, &e1, &ep, pg, 8, &d) ==
		      -ST_E_LIMIT);
		e1.seq = a + 1;
		e1.n_rows = 1;
		CHECK(kv_client_seq_device(c, 1, &e1, &ep, pg, 8, &d) ==
		      -ST_E_NOTFOUND);
		e1.seq = a;
		CHECK(c2 && kv_client_seq_device(c2, 1, &e1, &ep, pg, 8, &d) ==
			    -EPERM);
		kv_client_close(c2);
	}
	CHECK(cw_kvdev_open(&k, c, NULL, kvd.name, &d) == -ENODEV);
	CHECK(k == NULL);
	r = cw_kvdev_open(&k, c, &x.pool, kvd.name, &d);
	CHECK(r == 0);
	host_write(c, a, 0, 40, 2);
	CHECK(acquire(k, a, 40, &s1) == 0);
	CHECK(s1.n_pages == 6 && s1.on_device == 6);
	CHECK(check_step(c, a, 40, &s1) == 6);
	/* every slot is of epoch B, none of the dead one's pins block it */
	CHECK(atomic_load(&t->epoch) == x.e.epoch);
	/* the reply names the host pages the sequence's table holds, and
	 * each slot's key is that page's */
	for (uint32_t st = 0; st < N_STREAMS; st++)
		for (uint32_t p = 0; p < 3; p++) {
			uint32_t ix = cw_kvdev_index(&s1, 0, st, p);

			CHECK(s1.pages[ix].page ==
			      kvd_table_entry(kvd.name, a, st, p, NULL));
			CHECK((uint32_t)(s1.pages[ix].key - 1) ==
			      s1.pages[ix].page);
			CHECK(atomic_load(&t->slot[s1.pages[ix].slot].key) ==
			      s1.pages[ix].key);
		}
	/* the row pointers cw_cu_attend would take: every row's bytes */
	for (uint32_t st = 0; st < N_STREAMS; st++) {
		struct kv_stream_decl dc = { rb[st], 1, 0, 0 };
		const uint8_t *rows[40];
		uint8_t dv[192];

		CHECK(cw_kvdev_rows(&s1, 0, st, &dc, 0, 40, rows) == 0);
		for (uint32_t r2 = 0; r2 < 40; r2++) {
			dev_read(dv, rows[r2], rb[st]);
			CHECK(memcmp(dv, kv_client_row(c, a, (int)st, r2),
				     rb[st]) == 0);
		}
		CHECK(cw_kvdev_rows(&s1, 0, st, &dc, 40, 9, rows) == -EINVAL);
		CHECK(cw_kvdev_rows(&s1, 1, st, &dc, 0, 1, rows) == -EINVAL);
	}
	cw_kvdev_release(k, &s1, NULL);
	printf("2. epoch B: 6 pages on the device equal the host rows "
	       "(also through cw_kvdev_rows)\n");

	/* 3. host appends rows: refreshed, not stale */
	CHECK(reserve(c, a, 45) == 0);
	host_write(c, a, 40, 45, 3);
	CHECK(acquire(k, a, 45, &s1) == 0);
	CHECK(s1.on_device == 6);
	CHECK(check_step(c, a, 45, &s1) == 6);
	n = s1.pages[cw_kvdev_index(&s1, 0, 1, 2)].slot;
	cw_kvdev_release(k, &s1, NULL);
	CHECK(acquire(k, a, 45, &s2) == 0);
	CHECK(s2.pages[cw_kvdev_index(&s2, 0, 1, 2)].slot == n);
	CHECK(check_step(c, a, 45, &s2) == 6);
	cw_kvdev_release(k, &s2, NULL);
	printf("3. rows appended on the host reach the device copy\n");

	/* 4. a pinned page is never rewritten */
	CHECK(acquire(k, a, 45, &s1) == 0);
	{
		uint32_t ix = cw_kvdev_index(&s1, 0, 1, 2);

		dev_read(snap, s1.ptr[ix], sizeof(snap));
		CHECK(reserve(c, a, 48) == 0);
		host_write(c, a, 45, 48, 4);
		CHECK(acquire(k, a, 48, &s2) == 0);
		CHECK(check_step(c, a, 48, &s2) == 6);
		CHECK(s2.pages[ix].slot != s1.pages[ix].slot);
		dev_read(snap2, s1.ptr[ix], sizeof(snap2));
		CHECK(memcmp(snap, snap2, sizeof(snap)) == 0);
		cw_kvdev_release(k, &s2, NULL);
		cw_kvdev_release(k, &s1, NULL);
	}
	printf("4. the pinned copy stayed; appended rows went to another "
	       "slot\n");
	pin_race(c, k, &x, t);

	/* 5. rows written on the device, spilled and restored */
	CHECK(reserve(c, a, 56) == 0);
	CHECK(acquire(k, a, 56, &s1) == 0);
	for (uint32_t s = 0; s < N_STREAMS; s++) {
		uint32_t ix = cw_kvdev_index(&s1, 0, s, 3);

		dev_rows(k, &s1, ix, s, 48, 56, 5);
	}
	cw_kvdev_release(k, &s1, NULL);
	/* the host rows are not written yet: kvd copies them back on spill */
	CHECK(kv_client_row(c, a, 0, 48)[0] != pat(5, 0, 48, 0));
	CHECK(kv_client_seq_create(c, &big, &d) == 0);
	/* 64 pages: a holds 8, big wants all 64 -> a is spilled whole */
	CHECK(reserve(c, big, 32 * PAGE_ROWS) == 0);
	CHECK(kv_client_seq_resident(c, a) == 0);
	CHECK(kv_client_seq_free(c, big) == 0);
	CHECK(kv_client_seq_restore(c, 1, &a, NULL, &d) == 0);
	CHECK(kv_client_seq_resident(c, a) == 1);
	for (uint32_t s = 0; s < N_STREAMS; s++)
		for (uint32_t r2 = 0; r2 < 56; r2++) {
			const uint8_t *h = kv_client_row(c, a, (int)s, r2);
			uint32_t tag = r2 < 40 ? 2 : r2 < 45 ? 3 :
				       r2 < 48 ? 4 : 5;
			int ok = h != NULL;

			for (uint32_t i = 0; ok && i < rb[s]; i++)
				ok = h[i] == pat(tag, s, r2, i);
			if (!ok) {
				printf("FAIL: after spill+restore stream %u "
				       "row %u differs\n", s, r2);
				failures++;
				break;
			}
		}
	/* restored into other pages: new keys, the device copy follows */
	CHECK(acquire(k, a, 56, &s1) == 0);
	CHECK(check_step(c, a, 56, &s1) == 8);
	cw_kvdev_release(k, &s1, NULL);
	printf("5. device-written rows survived spill and restore\n");

	/* 5b. a fork copies the partial last page: with the device's rows */
	CHECK(reserve(c, a, 60) == 0);
	CHECK(acquire(k, a, 60, &s1) == 0);
	for (uint32_t s = 0; s < N_STREAMS; s++) {
		uint32_t ix = cw_kvdev_index(&s1, 0, s, 3);

		dev_rows(k, &s1, ix, s, 56, 60, 7);
	}
	cw_kvdev_release(k, &s1, NULL);
	CHECK(kv_client_seq_fork(c, a, 60, &b, &d) == 0);
	for (uint32_t s = 0; s < N_STREAMS; s++)
		for (uint32_t r2 = 48; r2 < 60; r2++) {
			const uint8_t *h = kv_client_row(c, b, (int)s, r2);
			int ok = h != NULL;

			for (uint32_t i = 0; ok && i < rb[s]; i++)
				ok = h[i] == pat(r2 < 56 ? 5 : 7, s, r2, i);
			if (!ok) {
				printf("FAIL: fork: stream %u row %u is not "
				       "what the device wrote\n", s, r2);
				failures++;
				break;
			}
		}
	CHECK(kv_client_seq_free(c, b) == 0);
	printf("5b. a fork's copied page holds the device-written rows\n");

	/* 6. kvd kill -9 with dirty rows on the device */
	CHECK(kv_client_seq_create(c, &b, &d) == 0);
	CHECK(reserve(c, b, 24) == 0);
	host_write(c, b, 0, 16, 6);
	CHECK(acquire(k, b, 24, &s1) == 0);
	for (uint32_t s = 0; s < N_STREAMS; s++) {
		uint32_t ix = cw_kvdev_index(&s1, 0, s, 1);

		dev_rows(k, &s1, ix, s, 16, 24, 6);
	}
	cw_kvdev_release(k, &s1, NULL);
	CHECK(kvd_kill(&kvd, SIGKILL) >= 0);
	CHECK(kvd_start(&kvd, NULL) == 0);
	/* computed (cw_devpool_check) exports the same epoch again */
	CHECK(send_dev(&x, 0, NULL) == 0);
	st_shm_detach(&tshm);
	t = table_map(&tshm);
	CHECK(t != NULL);
	if (!t)
		goto out;
	ready = 0;
	for (uint32_t i = 0; i < t->n_slots; i++)
		ready += atomic_load(&t->slot[i].state) == ST_DEVSLOT_READY;
	CHECK(ready == 0);
	CHECK(atomic_load(&t->epoch) == x.e.epoch);
	for (uint32_t s = 0; s < N_STREAMS; s++)
		for (uint32_t r2 = 0; r2 < 24; r2++) {
			const uint8_t *h = kv_client_row(c, b, (int)s, r2);
			int ok = h != NULL;

			for (uint32_t i = 0; ok && i < rb[s]; i++)
				ok = h[i] == pat(6, s, r2, i);
			if (!ok) {
				printf("FAIL: after kvd kill -9 stream %u row "
				       "%u is not what the device wrote\n", s,
				       r2);
				failures++;
				break;
			}
		}
	CHECK(acquire(k, b, 24, &s1) == 0);
	CHECK(s1.on_device == 4);
	CHECK(check_step(c, b, 24, &s1) == 4);
	cw_kvdev_release(k, &s1, NULL);
	CHECK(kv_client_reconnects(c) >= 1);
	printf("6. kvd kill -9: dirty rows copied back, table rebuilt "
	       "empty, pages served again\n");

	CHECK(send_dev(&x, 1, NULL) == 0);
out:
	cw_kvdev_close(k);
	kv_client_close(c);
	if (tshm.base)
		st_shm_detach(&tshm);
	if (kvd.pid)
		kill(kvd.pid, SIGTERM);
	kvd_cleanup(&kvd);
	if (x.x)
		st_cuda_export_destroy(x.x);
	if (failures)
		printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
