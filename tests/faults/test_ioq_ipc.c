/*
 * test_ioq_ipc.c — the I/O queue (common/st_ioq.h) across the real expertd
 * and kvd of one instance (suites ipc, fault):
 *  - both account their NVMe I/O into the one segment, each in its own
 *    slot, with the right classes: expertd's demand (+ prefetch) bytes are
 *    the records it loaded (loads x the store's record bytes, and its own
 *    load_bytes), kvd's kv-spill and kv-restore bytes are its spill and
 *    restore bytes (pages x 4 KiB slots); neither has the other's classes;
 *  - expertd killed with SIGKILL while a demand read is in flight (a slow
 *    device: --test-load-delay-ms) leaves that read counted in its slot:
 *    meanwhile kvd's spill and restore wait the bound (STRATA_IOQ_BOUND_US
 *    = 5000 here) per I/O and no more; after the kill they no longer wait,
 *    and kvd serves on.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "es_client.h"
#include "es_harness.h"
#include "kv_client.h"
#include "kv_test_util.h"
#include "st_ioq.h"
#include "st_util.h"
#include "test_util.h"

#define TIMEOUT_MS 10000
#define NSEQ 8
#define ROWS 32
#define BOUND_NS 5000000ull

static int failures;
static struct es_h H;
static struct kvd_inst K;
static const uint32_t rb[2] = { 1024, 512 };

static struct st_ioq_slot *slot_of(struct st_ioq_seg *g, int pid)
{
	for (int i = 0; i < ST_IOQ_SLOTS; i++)
		if (atomic_load(&g->slot[i].pid) == pid)
			return &g->slot[i];
	return NULL;
}

static void write_row(struct kv_client *c, uint32_t seq, uint32_t r)
{
	for (uint32_t s = 0; s < 2; s++) {
		uint8_t *p = kv_client_row_writable(c, seq, (int)s, r);

		if (p)
			memset(p, (int)(seq + r + s), rb[s]);
	}
}

/* One step per sequence: pin (restores it, spilling others), reserve a
 * row, write it, unpin.  0 or -1. */
static int kv_round(struct kv_client *c, uint32_t *seqs, uint32_t row)
{
	struct st_diag d = { "" };

	for (int i = 0; i < NSEQ; i++) {
		uint32_t n = row + 1;

		if (kv_client_seq_pin(c, 1, &seqs[i], NULL, &d) < 0 ||
		    kv_client_seq_reserve(c, 1, &seqs[i], &n, &d) < 0) {
			printf("kv step %u seq %d: %s\n", row, i, d.msg);
			return -1;
		}
		write_row(c, seqs[i], row);
		if (kv_client_seq_unpin(c, 1, &seqs[i], &d) < 0)
			return -1;
	}
	return 0;
}

/* kvd's spill + restore I/Os and their wait so far. */
static void kv_io(struct st_ioq_slot *s, uint64_t *ops, uint64_t *wait)
{
	*ops = atomic_load(&s->c[ST_IOQ_KV_SPILL].ops) +
	       atomic_load(&s->c[ST_IOQ_KV_RESTORE].ops);
	*wait = atomic_load(&s->c[ST_IOQ_KV_SPILL].wait_ns) +
		atomic_load(&s->c[ST_IOQ_KV_RESTORE].wait_ns);
}

/* A demand miss of the last layer's expert 0, whose read the slow
 * expertd keeps in flight; the client gives up after 3 s (the read goes
 * on in expertd). */
static void *slow_acquire(void *arg)
{
	struct es_client *c;
	struct st_diag d = { "" };
	const uint8_t *rec;
	int e = 0;

	(void)arg;
	if (es_client_open(H.run_dir, H.inst, "ioq-slow", 3000, &c, &d) < 0)
		return NULL;
	es_client_acquire(c, H.n_layers - 1, 1, &e, &rec, &d);
	es_client_close(c);
	return NULL;
}

int main(void)
{
	struct kv_stream_decl sd[2] = { { rb[0], 1, 0, 0 }, { rb[1], 1, 0, 0 } };
	struct st_diag d = { "" };
	struct es_client *ec = NULL;
	struct kv_client *kc = NULL;
	struct es_stats es;
	struct kv_stats ks;
	struct st_shm shm = { 0 };
	struct st_ioq_seg *g;
	struct st_ioq_slot *se, *sk;
	uint32_t seqs[NSEQ], row = 0;
	uint64_t ops0, w0, ops1, w1, ops2, w2, t0;
	pthread_t slow;

	setenv("STRATA_IOQ_BOUND_US", "5000", 1);
	setenv("STRATA_IOQ", "on", 1);
	es_h_init(&H, "kjv-moe", "ioq");
	kvd_inst_init(&K, "ioqk");
	snprintf(K.name, sizeof(K.name), "%s", H.inst); /* one instance */
	snprintf(K.budget, sizeof(K.budget), "128KiB");
	snprintf(K.spill_budget, sizeof(K.spill_budget), "1MiB");
	snprintf(K.max_rows, sizeof(K.max_rows), "64");
	if (es_h_start(&H, NULL) != 0 || kvd_start(&K, NULL) != 0) {
		printf("FAIL: daemons did not start\n");
		goto out_fail;
	}

	/* expertd: every expert of every layer but the last once (demand
	 * misses; the last layer's stay on the store for the slow read) */
	if (es_client_open(H.run_dir, H.inst, "ioq-test", TIMEOUT_MS, &ec,
			   &d) < 0) {
		printf("FAIL: es_client_open: %s\n", d.msg);
		goto out_fail;
	}
	for (int l = 0; l < H.n_layers - 1; l++)
		for (int e = 0; e < H.n_experts; e++) {
			const uint8_t *rec;

			ST_TEST_CHECK(es_client_acquire(ec, l, 1, &e, &rec,
							&d) == 0);
			es_client_release(ec, l, 1, &e);
		}
	ST_TEST_CHECK(es_client_stats(ec, &es) == 0);
	es_client_close(ec);
	ec = NULL;

	/* kvd: 8 interleaved sequences on a quarter of their pages */
	if (kv_client_open(K.run_dir, K.name, "ioq-test", TIMEOUT_MS, &kc,
			   &d) < 0 ||
	    kv_client_declare_model(kc, 2, sd, 4, 0x51, &d) < 0) {
		printf("FAIL: kv client: %s\n", d.msg);
		goto out_fail;
	}
	for (int i = 0; i < NSEQ; i++)
		ST_TEST_CHECK(kv_client_seq_create(kc, &seqs[i], &d) == 0);
	for (; row < 16; row++)
		if (kv_round(kc, seqs, row) < 0)
			goto out_fail;
	ST_TEST_CHECK(kv_client_stats(kc, &ks) == 0);

	if (st_shm_attach(&shm, H.inst, ST_IOQ_KIND, ST_IOQ_LAYOUT, 0, &d) <
	    0) {
		printf("FAIL: no I/O queue segment for %s: %s\n", H.inst, d.msg);
		goto out_fail;
	}
	g = shm.base;
	se = slot_of(g, H.pid);
	sk = slot_of(g, K.pid);
	ST_TEST_CHECK(se && sk && se != sk);
	if (!se || !sk)
		goto out_fail;
	ST_TEST_CHECK(!strcmp(se->name, "expertd") && !strcmp(sk->name, "kvd"));
	printf("expertd: %llu loads of %llu bytes; queue: demand %llu, "
	       "prefetch %llu bytes\n", (unsigned long long)es.loads,
	       (unsigned long long)H.record_bytes,
	       (unsigned long long)se->c[ST_IOQ_DEMAND].bytes,
	       (unsigned long long)se->c[ST_IOQ_PREFETCH].bytes);
	ST_TEST_CHECK(es.loads >= (uint64_t)(H.n_layers - 1) * H.n_experts);
	ST_TEST_CHECK(atomic_load(&se->c[ST_IOQ_DEMAND].bytes) +
			      atomic_load(&se->c[ST_IOQ_PREFETCH].bytes) ==
		      es.loads * H.record_bytes);
	ST_TEST_CHECK(es.load_bytes == es.loads * H.record_bytes);
	ST_TEST_CHECK(atomic_load(&se->c[ST_IOQ_DEMAND].ops) +
			      atomic_load(&se->c[ST_IOQ_PREFETCH].ops) ==
		      es.loads);
	printf("kvd: %llu pages spilled, %llu restored; queue: kv-spill %llu, "
	       "kv-restore %llu bytes\n",
	       (unsigned long long)ks.spill_pages_total,
	       (unsigned long long)ks.restore_pages_total,
	       (unsigned long long)sk->c[ST_IOQ_KV_SPILL].bytes,
	       (unsigned long long)sk->c[ST_IOQ_KV_RESTORE].bytes);
	ST_TEST_CHECK(ks.spill_pages_total > 0 && ks.restore_pages_total > 0);
	ST_TEST_CHECK(atomic_load(&sk->c[ST_IOQ_KV_SPILL].bytes) ==
		      ks.spill_pages_total * 4096);
	ST_TEST_CHECK(atomic_load(&sk->c[ST_IOQ_KV_SPILL].bytes) ==
		      ks.spill_bytes_total);
	ST_TEST_CHECK(atomic_load(&sk->c[ST_IOQ_KV_RESTORE].bytes) ==
		      ks.restore_bytes_total);
	ST_TEST_CHECK(atomic_load(&se->c[ST_IOQ_KV_SPILL].ops) == 0 &&
		      atomic_load(&se->c[ST_IOQ_KV_RESTORE].ops) == 0);
	ST_TEST_CHECK(atomic_load(&sk->c[ST_IOQ_DEMAND].ops) == 0 &&
		      atomic_load(&sk->c[ST_IOQ_PREFETCH].ops) == 0);

	/* a slow demand read in flight, then expertd killed with it */
	es_h_stop(&H);
	if (es_h_start(&H, "--test-load-delay-ms", "30000", NULL) != 0) {
		printf("FAIL: expertd with a load delay did not start\n");
		goto out_fail;
	}
	/* from a thread: nanomsg's sockets do not survive a fork */
	pthread_create(&slow, NULL, slow_acquire, NULL);
	se = NULL;
	for (t0 = st_now_ns(); st_now_ns() - t0 < 10000000000ull;
	     st_sleep_ns(10000000)) {
		se = slot_of(g, H.pid);
		if (se && atomic_load(&se->c[ST_IOQ_DEMAND].inflight) > 0)
			break;
	}
	ST_TEST_CHECK(se && atomic_load(&se->c[ST_IOQ_DEMAND].inflight) == 1);
	kv_io(sk, &ops0, &w0);
	for (int n = 0; n < 2; n++, row++)
		ST_TEST_CHECK(kv_round(kc, seqs, row) == 0);
	kv_io(sk, &ops1, &w1);
	printf("kvd behind expertd's demand read: %llu I/Os waited %.1f ms "
	       "(bound %.0f ms each)\n", (unsigned long long)(ops1 - ops0),
	       (double)(w1 - w0) / 1e6, (double)BOUND_NS / 1e6);
	ST_TEST_CHECK(ops1 > ops0);
	ST_TEST_CHECK(w1 - w0 >= (ops1 - ops0) * (BOUND_NS * 4 / 5));
	/* never beyond the bound (plus a poll and scheduling) */
	ST_TEST_CHECK(w1 - w0 <= (ops1 - ops0) *
				   (BOUND_NS + 20000000ull *
				    (uint64_t)st_test_timeout_scale()));

	es_h_kill9(&H);
	st_sleep_ns(ST_IOQ_LIVE_CHECK_NS + 50000000ull);
	ST_TEST_CHECK(atomic_load(&se->c[ST_IOQ_DEMAND].inflight) == 1);
	for (int n = 0; n < 2; n++, row++)
		ST_TEST_CHECK(kv_round(kc, seqs, row) == 0);
	kv_io(sk, &ops2, &w2);
	printf("kvd after expertd's kill -9: %llu I/Os waited %.2f ms\n",
	       (unsigned long long)(ops2 - ops1), (double)(w2 - w1) / 1e6);
	ST_TEST_CHECK(ops2 > ops1);
	ST_TEST_CHECK(w2 - w1 < (ops2 - ops1) * 1000000ull);
	ST_TEST_CHECK(kvd_ping(K.run_dir, 2000, NULL, NULL) == 0);
	pthread_join(slow, NULL);

	/* a new expertd takes the dead slot over: its gauges cleared */
	if (es_h_start(&H, NULL) == 0) {
		struct st_ioq_slot *sn = slot_of(g, H.pid);

		ST_TEST_CHECK(sn != NULL);
		for (int i = 0; i < ST_IOQ_SLOTS; i++)
			ST_TEST_CHECK(atomic_load(&g->slot[i].c[ST_IOQ_DEMAND]
							   .inflight) == 0);
	} else {
		ST_TEST_CHECK(!"expertd restarted");
	}
	kv_client_close(kc);
	st_shm_detach(&shm);
	es_h_fini(&H);
	kvd_cleanup(&K);
	if (failures)
		printf("%d check(s) failed\n", failures);
	else
		printf("ok\n");
	return failures ? 1 : 0;
out_fail:
	kv_client_close(kc);
	es_client_close(ec);
	st_shm_detach(&shm);
	es_h_fini(&H);
	kvd_cleanup(&K);
	return 1;
}
