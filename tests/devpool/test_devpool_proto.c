/*
 * test_devpool_proto.c — the CPU-side rules of the device pools shared by
 * CUDA IPC (proto/st_devpool.h), without a GPU: every decoder accepts what
 * its encoder writes and refuses each malformed field; a mutation fuzzer
 * never gets a non-canonical or out-of-range EXPORT accepted; the
 * exporter's leases block a free while an importer may still map the
 * memory (PITFALLS P18) and release it when the importer answered or died;
 * the importer's epoch handling drops old handles before opening new ones
 * and keeps its opened/closed counts balanced; and the device slot pin
 * protocol is raced by a reader thread against a writer that rewrites any
 * slot it can claim: a pinned slot's bytes must never change.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_devpool.h"
#include "st_proto.h"
#include "st_util.h"

static uint8_t ev_bytes[4 * ST_DEVPOOL_HANDLE_BYTES];

static void sample_export(struct st_devpool_export *e)
{
	int i;

	memset(e, 0, sizeof(*e));
	e->pid = 4242;
	e->kind = ST_DEVPOOL_EXPERTS;
	e->epoch = 0x1122334455667788ull;
	strcpy(e->bus_id, "0000:19:00.0");
	e->slot_bytes = 40960;
	e->n_slots = 24;
	e->pool_bytes = 24 * 40960;
	e->n_events = 4;
	for (i = 0; i < ST_DEVPOOL_HANDLE_BYTES; i++)
		e->mem_handle[i] = (uint8_t)(i * 7 + 1);
	for (i = 0; i < (int)sizeof(ev_bytes); i++)
		ev_bytes[i] = (uint8_t)(i * 13 + 5);
	e->events = ev_bytes;
}

static void encode_export(const struct st_devpool_export *e,
			  struct st_wbuf *w)
{
	st_wbuf_init(w);
	st_devpool_export_encode(w, e);
	assert_int_equal(w->err, 0);
}

static void test_export_roundtrip(void **state)
{
	struct st_devpool_export e, d;
	struct st_wbuf w, msg;
	struct st_msg_header h;
	struct st_diag diag = { 0 };

	(void)state;
	sample_export(&e);
	encode_export(&e, &w);
	assert_int_equal(w.len, ST_DEVPOOL_EXPORT_FIXED_BYTES +
				    4 * ST_DEVPOOL_HANDLE_BYTES);
	/* through a whole message, as the daemons see it */
	st_wbuf_init(&msg);
	assert_int_equal(st_proto_encode(&msg, ST_MSG_DEV_EXPORT, 9, 3, 0,
					 w.data, w.len), 0);
	assert_int_equal(st_proto_decode_header(msg.data, msg.len, &h), 0);
	assert_int_equal(h.type, ST_MSG_DEV_EXPORT);
	assert_string_equal(st_proto_type_name(h.type), "DEV_EXPORT");
	assert_int_equal(st_devpool_export_decode(msg.data + 32,
						  h.payload_len, &d, &diag), 0);
	assert_int_equal(d.pid, 4242);
	assert_int_equal(d.kind, ST_DEVPOOL_EXPERTS);
	assert_true(d.epoch == e.epoch);
	assert_string_equal(d.bus_id, "0000:19:00.0");
	assert_true(d.pool_bytes == 24 * 40960);
	assert_true(d.slot_bytes == 40960);
	assert_int_equal(d.n_slots, 24);
	assert_int_equal(d.n_events, 4);
	assert_memory_equal(d.mem_handle, e.mem_handle,
			    ST_DEVPOOL_HANDLE_BYTES);
	assert_memory_equal(d.events, ev_bytes, sizeof(ev_bytes));
	st_wbuf_fini(&w);
	st_wbuf_fini(&msg);
}

/* Mutates one field of a valid export, expects the decoder to refuse it
 * with -ST_E_PROTO and a message naming `word`. */
static void expect_refused(void (*mut)(struct st_devpool_export *),
			   const char *word)
{
	struct st_devpool_export e, d;
	struct st_wbuf w;
	struct st_diag diag = { 0 };

	sample_export(&e);
	mut(&e);
	encode_export(&e, &w);
	assert_int_equal(st_devpool_export_decode(w.data, w.len, &d, &diag),
			 -ST_E_PROTO);
	if (!strstr(diag.msg, word))
		fail_msg("diag '%s' does not name '%s'", diag.msg, word);
	st_wbuf_fini(&w);
}

static void m_pid(struct st_devpool_export *e) { e->pid = 0; }
static void m_pid_big(struct st_devpool_export *e) { e->pid = 0x80000000u; }
static void m_kind(struct st_devpool_export *e) { e->kind = 3; }
static void m_epoch(struct st_devpool_export *e) { e->epoch = 0; }
static void m_bus(struct st_devpool_export *e) { e->bus_id[0] = 0; }
static void m_bus_ctl(struct st_devpool_export *e) { e->bus_id[2] = '\n'; }
static void m_slot0(struct st_devpool_export *e) { e->slot_bytes = 0; }
static void m_slot_align(struct st_devpool_export *e) { e->slot_bytes = 40961; }
static void m_nslots(struct st_devpool_export *e) { e->n_slots = 0; }
static void m_fit(struct st_devpool_export *e) { e->pool_bytes -= 1; }
static void m_overflow(struct st_devpool_export *e)
{
	/* 2^40 slots of 2^24 bytes wrap to 0 in 64 bits */
	e->n_slots = 0xffffffffu;
	e->slot_bytes = 1ull << 40;
	e->pool_bytes = ~0ull;
}
static void m_events0(struct st_devpool_export *e) { e->n_events = 0; e->events = NULL; }
static void m_events_gt(struct st_devpool_export *e)
{
	static uint8_t many[25 * ST_DEVPOOL_HANDLE_BYTES];

	e->n_events = 25;
	e->events = many;
}
static void m_memh(struct st_devpool_export *e)
{
	memset(e->mem_handle, 0, sizeof(e->mem_handle));
}

static void test_export_refusals(void **state)
{
	struct st_devpool_export e, d;
	struct st_wbuf w;
	struct st_diag diag = { 0 };

	(void)state;
	expect_refused(m_pid, "pid");
	expect_refused(m_pid_big, "pid");
	expect_refused(m_kind, "kind");
	expect_refused(m_epoch, "epoch");
	expect_refused(m_bus, "bus id");
	expect_refused(m_bus_ctl, "bus id");
	expect_refused(m_slot0, "slot size");
	expect_refused(m_slot_align, "slot size");
	expect_refused(m_nslots, "0 slots");
	expect_refused(m_fit, "do not fit");
	expect_refused(m_overflow, "do not fit");
	expect_refused(m_events0, "events");
	expect_refused(m_events_gt, "events");
	expect_refused(m_memh, "memory handle");
	/* length: one byte short and one byte long */
	sample_export(&e);
	encode_export(&e, &w);
	assert_int_equal(st_devpool_export_decode(w.data, w.len - 1, &d,
						  &diag), -ST_E_PROTO);
	st_wbuf_u8(&w, 0);
	assert_int_equal(st_devpool_export_decode(w.data, w.len, &d, &diag),
			 -ST_E_PROTO);
	assert_int_equal(st_devpool_export_decode(w.data, 10, &d, &diag),
			 -ST_E_PROTO);
	/* a bus id with a character after its NUL padding */
	w.data[8 + 8 + 20] = 'x';
	assert_int_equal(st_devpool_export_decode(w.data, w.len - 1, &d,
						  &diag), -ST_E_PROTO);
	st_wbuf_fini(&w);
}

static void test_revoke_and_reply(void **state)
{
	struct st_devpool_revoke r = { 77, ST_DEVPOOL_KV, 5 }, rd;
	struct st_devpool_rep p = { 5, 99, 3, 10, 7 }, pd;
	struct st_wbuf w;
	struct st_diag diag = { 0 };

	(void)state;
	st_wbuf_init(&w);
	st_devpool_revoke_encode(&w, &r);
	assert_int_equal(w.len, ST_DEVPOOL_REVOKE_BYTES);
	assert_int_equal(st_devpool_revoke_decode(w.data, w.len, &rd, &diag),
			 0);
	assert_int_equal(rd.pid, 77);
	assert_int_equal(rd.kind, ST_DEVPOOL_KV);
	assert_true(rd.epoch == 5);
	assert_int_equal(st_devpool_revoke_decode(w.data, w.len + 0 - 1, &rd,
						  &diag), -ST_E_PROTO);
	w.data[4] = 9; /* kind */
	assert_int_equal(st_devpool_revoke_decode(w.data, w.len, &rd, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);

	st_wbuf_init(&w);
	st_devpool_rep_encode(&w, &p);
	assert_int_equal(w.len, ST_DEVPOOL_REP_BYTES);
	assert_int_equal(st_devpool_rep_decode(w.data, w.len, &pd, &diag), 0);
	assert_true(pd.epoch == 5 && pd.importer_pid == 99 &&
		    pd.handles_open == 3 && pd.opened_total == 10 &&
		    pd.closed_total == 7);
	st_wbuf_fini(&w);
	p.closed_total = 11; /* more closed than opened */
	st_wbuf_init(&w);
	st_devpool_rep_encode(&w, &p);
	assert_int_equal(st_devpool_rep_decode(w.data, w.len, &pd, &diag),
			 -ST_E_PROTO);
	st_wbuf_fini(&w);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Mutations of a valid EXPORT (byte changes, truncation, extension):
 * whatever the decoder accepts re-encodes to the same bytes and satisfies
 * every documented range. */
static void test_export_fuzz(void **state)
{
	struct st_devpool_export e, d;
	struct st_wbuf w, re;
	uint8_t buf[ST_DEVPOOL_EXPORT_FIXED_BYTES + 8 * ST_DEVPOOL_HANDLE_BYTES];
	struct st_diag diag = { 0 };
	int it, accepted = 0, refused = 0;

	(void)state;
	sample_export(&e);
	encode_export(&e, &w);
	for (it = 0; it < 200000; it++) {
		size_t len = w.len, k, nm = 1 + rnd() % 4;

		memcpy(buf, w.data, w.len);
		for (k = 0; k < nm; k++) {
			size_t at = rnd() % len;

			switch (rnd() % 4) {
			case 0: buf[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
			case 1: buf[at] = (uint8_t)rnd(); break;
			case 2: len = rnd() % (w.len + 1); if (!len) len = 1; break;
			default:
				if (len + 64 <= sizeof(buf)) {
					memset(buf + len, (int)rnd(), 64);
					len += 64;
				}
			}
		}
		if (st_devpool_export_decode(buf, len, &d, &diag)) {
			refused++;
			continue;
		}
		accepted++;
		assert_true(d.pid > 0 && d.pid <= INT32_MAX);
		assert_true(d.kind == ST_DEVPOOL_EXPERTS ||
			    d.kind == ST_DEVPOOL_KV);
		assert_true(d.epoch != 0 && d.n_slots >= 1);
		assert_true(d.slot_bytes % ST_DEVPOOL_SLOT_ALIGN == 0 &&
			    d.slot_bytes > 0);
		assert_true(d.slot_bytes <= d.pool_bytes / d.n_slots);
		assert_true(d.n_events >= 1 && d.n_events <= d.n_slots);
		assert_true(len == ST_DEVPOOL_EXPORT_FIXED_BYTES +
				   (size_t)d.n_events * ST_DEVPOOL_HANDLE_BYTES);
		encode_export(&d, &re);
		assert_int_equal(re.len, len);
		assert_memory_equal(re.data, buf, len);
		st_wbuf_fini(&re);
	}
	/* both outcomes happen: the fuzzer reaches past the first check */
	assert_true(accepted > 100 && refused > 100000);
	st_wbuf_fini(&w);
}

/* alive() stub: pids in the set are alive */
struct pids { int32_t alive[4]; int n; };
static int stub_alive(int32_t pid, void *ctx)
{
	const struct pids *p = ctx;
	int i;

	for (i = 0; i < p->n; i++)
		if (p->alive[i] == pid)
			return 1;
	return 0;
}

static void test_leases(void **state)
{
	struct st_devlease_table t;
	struct pids alive = { { 100, 200 }, 2 };
	int a, b, i;

	(void)state;
	memset(&t, 0, sizeof(t));
	/* epoch 7 offered to expertd and kvd */
	a = st_devlease_offer(&t, ST_DEVPOOL_EXPERTS, 7);
	b = st_devlease_offer(&t, ST_DEVPOOL_KV, 7);
	assert_true(a >= 0 && b >= 0 && a != b);
	/* unanswered offer: may not free */
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 7, 0,
					      stub_alive, &alive), 0);
	assert_int_equal(st_devlease_held(&t, a, 100, 8), -EINVAL);
	assert_int_equal(st_devlease_held(&t, a, 100, 7), 0);
	assert_int_equal(st_devlease_held(&t, a, 100, 7), -EINVAL);
	assert_int_equal(st_devlease_count_held(&t, ST_DEVPOOL_EXPERTS, 7), 1);
	/* held by a live importer: blocked even when forgetting offers */
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 7, 1,
					      stub_alive, &alive), 0);
	/* a release from another pid changes nothing */
	assert_int_equal(st_devlease_released(&t, ST_DEVPOOL_EXPERTS, 7, 300),
			 0);
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 7, 0,
					      stub_alive, &alive), 0);
	assert_int_equal(st_devlease_released(&t, ST_DEVPOOL_EXPERTS, 7, 100),
			 1);
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 7, 0,
					      stub_alive, &alive), 1);
	assert_int_equal(st_devlease_count_held(&t, ST_DEVPOOL_EXPERTS, 7), 0);
	/* kv: held by 200, which dies: may free */
	assert_int_equal(st_devlease_held(&t, b, 200, 7), 0);
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_KV, 7, 0,
					      stub_alive, &alive), 0);
	alive.n = 1;
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_KV, 7, 0,
					      stub_alive, &alive), 1);
	/* an unanswered offer is forgotten only when asked */
	a = st_devlease_offer(&t, ST_DEVPOOL_EXPERTS, 9);
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 9, 0,
					      stub_alive, &alive), 0);
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_EXPERTS, 9, 1,
					      stub_alive, &alive), 1);
	/* the table is empty again: ST_DEVLEASE_MAX offers fit, one more not */
	for (i = 0; i < ST_DEVLEASE_MAX; i++)
		assert_true(st_devlease_offer(&t, ST_DEVPOOL_KV, 10 + i) >= 0);
	assert_int_equal(st_devlease_offer(&t, ST_DEVPOOL_KV, 99),
			 -ST_E_LIMIT);
	/* freeing one epoch leaves the others */
	assert_int_equal(st_devlease_may_free(&t, ST_DEVPOOL_KV, 10, 1,
					      stub_alive, &alive), 1);
	assert_int_equal(st_devlease_count_held(&t, ST_DEVPOOL_KV, 11), 1);
	assert_true(st_devlease_offer(&t, ST_DEVPOOL_KV, 99) >= 0);
}

static void test_import_epochs(void **state)
{
	struct st_devimport s;
	struct st_devpool_export e;
	struct st_devpool_revoke r;
	struct st_devpool_rep rep;
	struct pids alive = { { 4242 }, 1 };

	(void)state;
	st_devimport_init(&s, ST_DEVPOOL_EXPERTS);
	sample_export(&e);
	assert_int_equal(st_devimport_plan_export(&s, &e), ST_DEVIMPORT_OPEN);
	st_devimport_opened(&s, 4242, e.epoch, 1 + e.n_events);
	assert_int_equal(st_devimport_plan_export(&s, &e), ST_DEVIMPORT_KEEP);
	assert_int_equal(st_devimport_plan_peer(&s, stub_alive, &alive),
			 ST_DEVIMPORT_KEEP);
	/* a kv export to the experts importer is a caller bug */
	e.kind = ST_DEVPOOL_KV;
	assert_int_equal(st_devimport_plan_export(&s, &e), -EINVAL);
	e.kind = ST_DEVPOOL_EXPERTS;
	/* an old epoch's revoke is idempotent */
	r.pid = 4242; r.kind = ST_DEVPOOL_EXPERTS; r.epoch = e.epoch - 1;
	assert_int_equal(st_devimport_plan_revoke(&s, &r), ST_DEVIMPORT_KEEP);
	/* computed restarts: new pid, new epoch -> close then open */
	e.pid = 5000;
	e.epoch += 1000;
	assert_int_equal(st_devimport_plan_export(&s, &e),
			 ST_DEVIMPORT_CLOSE_OPEN);
	st_devimport_closed(&s);
	st_devimport_opened(&s, 5000, e.epoch, 1 + e.n_events);
	st_devimport_rep(&s, 321, &rep);
	assert_true(rep.epoch == e.epoch);
	assert_int_equal(rep.handles_open, 5);
	assert_true(rep.opened_total == 10 && rep.closed_total == 5);
	assert_true(s.epoch_changes == 1 && s.imports == 2);
	/* the same pid with a new epoch (a re-export) also re-imports */
	e.epoch += 1;
	assert_int_equal(st_devimport_plan_export(&s, &e),
			 ST_DEVIMPORT_CLOSE_OPEN);
	e.epoch -= 1;
	/* the exporter dies: close */
	assert_int_equal(st_devimport_plan_peer(&s, stub_alive, &alive),
			 ST_DEVIMPORT_CLOSE);
	r.epoch = e.epoch;
	assert_int_equal(st_devimport_plan_revoke(&s, &r), ST_DEVIMPORT_CLOSE);
	st_devimport_closed(&s);
	st_devimport_rep(&s, 321, &rep);
	assert_true(rep.handles_open == 0 && rep.epoch == 0);
	assert_true(rep.opened_total == rep.closed_total);
	/* nothing imported: a revoke does nothing, a dead peer too */
	assert_int_equal(st_devimport_plan_revoke(&s, &r), ST_DEVIMPORT_KEEP);
	assert_int_equal(st_devimport_plan_peer(&s, stub_alive, &alive),
			 ST_DEVIMPORT_KEEP);
}

static struct st_devslot_table *table_new(uint32_t n)
{
	struct st_devslot_table *t = calloc(1, st_devslot_table_bytes(n));

	assert_non_null(t);
	return t;
}

static void test_slot_table(void **state)
{
	struct st_devslot_table *t = table_new(4);
	struct st_diag diag = { 0 };
	uint32_t ev = 99, g;

	(void)state;
	st_devslot_table_reset(t, 11, 4, 2, 4096, 0);
	assert_int_equal(st_devslot_table_check(t, st_devslot_table_bytes(4),
						&diag), 0);
	assert_int_equal(st_devslot_table_check(t, st_devslot_table_bytes(3),
						&diag), -ST_E_FORMAT);
	/* an EMPTY slot is not pinnable */
	assert_int_equal(st_devslot_pin(t, 0, 5, 11, &ev), 0);
	assert_int_equal(atomic_load(&t->slot[0].pins), 0);
	g = atomic_load(&t->slot[0].gen);
	assert_int_equal(st_devslot_claim(t, 0, 5), 1);
	assert_int_equal(atomic_load(&t->slot[0].gen), g + 1);
	/* COPYING: not pinnable, not claimable */
	assert_int_equal(st_devslot_pin(t, 0, 5, 11, &ev), 0);
	assert_int_equal(st_devslot_claim(t, 0, 6), 0);
	st_devslot_publish(t, 0, 1);
	assert_int_equal(st_devslot_pin(t, 0, 6, 11, &ev), 0);  /* key */
	assert_int_equal(st_devslot_pin(t, 0, 5, 12, &ev), 0);  /* epoch */
	assert_int_equal(st_devslot_pin(t, 9, 5, 11, &ev), 0);  /* range */
	assert_int_equal(st_devslot_pin(t, 0, 5, 11, &ev), 1);
	assert_int_equal(ev, 1);
	/* pinned: the writer may not take it */
	assert_int_equal(st_devslot_claim(t, 0, 6), 0);
	assert_int_equal(atomic_load(&t->slot[0].state), ST_DEVSLOT_READY);
	st_devslot_unpin(t, 0);
	assert_int_equal(st_devslot_claim(t, 0, 6), 1);
	st_devslot_abort(t, 0);
	assert_int_equal(atomic_load(&t->slot[0].state), ST_DEVSLOT_EMPTY);
	/* a new epoch (computed restarted): all EMPTY, generations bumped */
	assert_int_equal(st_devslot_claim(t, 1, 7), 1);
	st_devslot_publish(t, 1, 0);
	g = atomic_load(&t->slot[1].gen);
	st_devslot_table_reset(t, 12, 4, 2, 4096, 0);
	assert_int_equal(atomic_load(&t->slot[1].gen), g + 1);
	assert_int_equal(st_devslot_pin(t, 1, 7, 12, &ev), 0);
	assert_int_equal(st_devslot_pin(t, 1, 7, 11, &ev), 0);
	/* the importer restarts under a live reader (same epoch, pins kept):
	 * the pinned slot is not claimable until its reader unpins */
	assert_int_equal(st_devslot_claim(t, 2, 8), 1);
	st_devslot_publish(t, 2, 0);
	assert_int_equal(st_devslot_pin(t, 2, 8, 12, &ev), 1);
	st_devslot_table_reset(t, 12, 4, 2, 4096, 1);
	assert_int_equal(atomic_load(&t->slot[2].state), ST_DEVSLOT_EVICTING);
	assert_int_equal(st_devslot_claim(t, 2, 9), 0);
	assert_int_equal(st_devslot_claim(t, 3, 9), 1); /* unpinned: free */
	st_devslot_unpin(t, 2);
	assert_int_equal(st_devslot_claim(t, 2, 10), 1);
	assert_int_equal(atomic_load(&t->slot[2].key), 10);
	/* the want ring: FIFO, bounded, emptied by a reset */
	{
		uint64_t k = 0;
		int i;

		assert_int_equal(st_devslot_want_pop(t, &k), 0);
		for (i = 0; i < ST_DEVSLOT_WANT_RING; i++)
			assert_int_equal(st_devslot_want_push(t, 100 + i), 1);
		assert_int_equal(st_devslot_want_push(t, 7), 0); /* full */
		assert_int_equal(st_devslot_want_pop(t, &k), 1);
		assert_true(k == 100);
		assert_int_equal(st_devslot_want_push(t, 7), 1);
		for (i = 1; i < ST_DEVSLOT_WANT_RING; i++) {
			assert_int_equal(st_devslot_want_pop(t, &k), 1);
			assert_true(k == (uint64_t)(100 + i));
		}
		assert_int_equal(st_devslot_want_pop(t, &k), 1);
		assert_true(k == 7);
		assert_int_equal(st_devslot_want_pop(t, &k), 0);
		/* a corrupt head (another process) is skipped, not read */
		atomic_store(&t->want_head, atomic_load(&t->want_tail) + 5000);
		assert_int_equal(st_devslot_want_pop(t, &k), 0);
		assert_int_equal(st_devslot_want_pop(t, &k), 0);
		st_devslot_want_push(t, 9);
		st_devslot_table_reset(t, 12, 4, 2, 4096, 1);
		assert_int_equal(st_devslot_want_pop(t, &k), 0);
	}
	t->version = ST_DEVSLOT_TABLE_VERSION + 1;
	assert_int_equal(st_devslot_table_check(t, st_devslot_table_bytes(4),
						&diag), -ST_E_VERSION);
	t->magic = 0;
	assert_int_equal(st_devslot_table_check(t, st_devslot_table_bytes(4),
						&diag), -ST_E_BADMAGIC);
	free(t);
}

/* --- the pin race: a reader pins and checks a slot's bytes; a writer
 * claims whatever it can and rewrites the bytes with the new key --- */
#define RS 4
#define RBYTES 256
struct race {
	struct st_devslot_table *t;
	uint8_t data[RS][RBYTES];  /* stands for the device slots */
	_Atomic int stop;
	long torn, pinned;
	_Atomic long rewrites;
};

static void *race_writer(void *arg)
{
	struct race *r = arg;
	uint64_t key = 1, x = 0x2545f4914f6cdd1dull;

	while (!atomic_load(&r->stop)) {
		uint32_t s;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		s = (uint32_t)(x % RS);

		if (!st_devslot_claim(r->t, s, key))
			continue;
		memset((void *)r->data[s], (int)(key & 0xff), RBYTES);
		st_devslot_publish(r->t, s, s % 2);
		key++;
		atomic_fetch_add(&r->rewrites, 1);
	}
	return NULL;
}

static void test_pin_race(void **state)
{
	struct race r;
	pthread_t th;
	long it;

	(void)state;
	memset(&r, 0, sizeof(r));
	r.t = table_new(RS);
	st_devslot_table_reset(r.t, 3, RS, 2, RBYTES, 0);
	assert_int_equal(pthread_create(&th, NULL, race_writer, &r), 0);
	/* until both sides did enough, however the 2 shared cores schedule
	 * the threads (bounded: 20 s) */
	uint64_t end = st_now_ns() + 20000000000ull;

	for (it = 0; (r.pinned < 20000 || atomic_load(&r.rewrites) < 2000) &&
		     (it % 1024 || st_now_ns() < end);
	     it++) {
		uint32_t s = (uint32_t)(it % RS), ev;
		uint64_t key = atomic_load(&r.t->slot[s].key);
		volatile uint8_t *b = r.data[s];
		int i;

		if (!key || !st_devslot_pin(r.t, s, key, 3, &ev))
			continue;
		r.pinned++;
		/* the bytes are the key's and stay so while pinned */
		for (i = 0; i < 64; i++)
			if (b[(i * 37) % RBYTES] != (uint8_t)(key & 0xff))
				r.torn++;
		st_devslot_unpin(r.t, s);
	}
	atomic_store(&r.stop, 1);
	pthread_join(th, NULL);
	printf("pin race: %ld pinned reads, %ld rewrites, %ld torn\n",
	       r.pinned, atomic_load(&r.rewrites), r.torn);
	assert_int_equal(r.torn, 0);
	assert_true(r.pinned > 1000 && atomic_load(&r.rewrites) > 1000);
	free(r.t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_export_roundtrip),
		cmocka_unit_test(test_export_refusals),
		cmocka_unit_test(test_revoke_and_reply),
		cmocka_unit_test(test_export_fuzz),
		cmocka_unit_test(test_leases),
		cmocka_unit_test(test_import_epochs),
		cmocka_unit_test(test_slot_table),
		cmocka_unit_test(test_pin_race),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
