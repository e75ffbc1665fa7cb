/*
 * st_devpool.c — device pool messages, leases, importer epoch handling and
 * the device slot table (st_devpool.h).  Plain C: no CUDA here, so every
 * rule is tested without a GPU.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "st_devpool.h"
#include "st_util.h"

uint64_t st_devpool_epoch_new(void)
{
	return st_random_id();
}

const char *st_devpool_kind_name(uint32_t kind)
{
	switch (kind) {
	case ST_DEVPOOL_EXPERTS: return "experts";
	case ST_DEVPOOL_KV: return "kv";
	default: return "?";
	}
}

static int kind_ok(uint32_t kind)
{
	return kind == ST_DEVPOOL_EXPERTS || kind == ST_DEVPOOL_KV;
}

void st_devpool_export_encode(struct st_wbuf *w,
			      const struct st_devpool_export *e)
{
	char bus[ST_DEVPOOL_BUSID_BYTES] = { 0 };

	memcpy(bus, e->bus_id, strnlen(e->bus_id, sizeof(bus)));
	st_wbuf_u32(w, e->pid);
	st_wbuf_u32(w, e->kind);
	st_wbuf_u64(w, e->epoch);
	st_wbuf_bytes(w, bus, sizeof(bus));
	st_wbuf_u64(w, e->pool_bytes);
	st_wbuf_u64(w, e->slot_bytes);
	st_wbuf_u32(w, e->n_slots);
	st_wbuf_u32(w, e->n_events);
	st_wbuf_bytes(w, e->mem_handle, ST_DEVPOOL_HANDLE_BYTES);
	st_wbuf_bytes(w, e->events,
		      (size_t)e->n_events * ST_DEVPOOL_HANDLE_BYTES);
}

void st_devpool_revoke_encode(struct st_wbuf *w,
			      const struct st_devpool_revoke *r)
{
	st_wbuf_u32(w, r->pid);
	st_wbuf_u32(w, r->kind);
	st_wbuf_u64(w, r->epoch);
}

void st_devpool_rep_encode(struct st_wbuf *w, const struct st_devpool_rep *r)
{
	st_wbuf_u64(w, r->epoch);
	st_wbuf_u32(w, r->importer_pid);
	st_wbuf_u32(w, r->handles_open);
	st_wbuf_u64(w, r->opened_total);
	st_wbuf_u64(w, r->closed_total);
}

/* NUL-padded printable ASCII, at least one character. */
static int bus_ok(const char *s, size_t n)
{
	size_t i = 0;

	while (i < n && s[i]) {
		if (s[i] < 0x20 || s[i] > 0x7e)
			return 0;
		i++;
	}
	if (i == 0)
		return 0;
	for (; i < n; i++)
		if (s[i])
			return 0;
	return 1;
}

int st_devpool_export_decode(const uint8_t *p, size_t len,
			     struct st_devpool_export *e, struct st_diag *diag)
{
	struct st_rbuf r;
	uint64_t want, need;
	size_t i;

	memset(e, 0, sizeof(*e));
	if (len < ST_DEVPOOL_EXPORT_FIXED_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT payload is %zu bytes, shorter "
				   "than its fixed part (%d)", len,
				   ST_DEVPOOL_EXPORT_FIXED_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &e->pid);
	st_rbuf_u32(&r, &e->kind);
	st_rbuf_u64(&r, &e->epoch);
	st_rbuf_bytes(&r, e->bus_id, ST_DEVPOOL_BUSID_BYTES);
	st_rbuf_u64(&r, &e->pool_bytes);
	st_rbuf_u64(&r, &e->slot_bytes);
	st_rbuf_u32(&r, &e->n_slots);
	st_rbuf_u32(&r, &e->n_events);
	st_rbuf_bytes(&r, e->mem_handle, ST_DEVPOOL_HANDLE_BYTES);
	want = ST_DEVPOOL_EXPORT_FIXED_BYTES +
	       (uint64_t)e->n_events * ST_DEVPOOL_HANDLE_BYTES;
	if (len != want)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT payload is %zu bytes, %u event "
				   "handles make %llu", len, e->n_events,
				   (unsigned long long)want);
	e->events = p + ST_DEVPOOL_EXPORT_FIXED_BYTES;
	if (e->pid == 0 || e->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "DEV_EXPORT: bad pid %u",
				   e->pid);
	if (!kind_ok(e->kind))
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: unknown pool kind %u", e->kind);
	if (e->epoch == 0)
		return st_diag_set(diag, -ST_E_PROTO, "DEV_EXPORT: epoch 0");
	if (!bus_ok(e->bus_id, ST_DEVPOOL_BUSID_BYTES))
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: device bus id must be printable "
				   "ASCII, NUL-padded");
	if (e->slot_bytes == 0 || e->slot_bytes % ST_DEVPOOL_SLOT_ALIGN)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: slot size %llu bytes is not a "
				   "positive multiple of %d",
				   (unsigned long long)e->slot_bytes,
				   ST_DEVPOOL_SLOT_ALIGN);
	if (e->n_slots == 0)
		return st_diag_set(diag, -ST_E_PROTO, "DEV_EXPORT: 0 slots");
	if (__builtin_mul_overflow((uint64_t)e->n_slots, e->slot_bytes,
				   &need) || need > e->pool_bytes)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: %u slots of %llu bytes do not "
				   "fit the pool of %llu bytes", e->n_slots,
				   (unsigned long long)e->slot_bytes,
				   (unsigned long long)e->pool_bytes);
	if (e->n_events == 0 || e->n_events > e->n_slots ||
	    e->n_events > ST_DEVPOOL_MAX_EVENTS)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: %u events (want 1 .. min(%u "
				   "slots, %d))", e->n_events, e->n_slots,
				   ST_DEVPOOL_MAX_EVENTS);
	for (i = 0; i < ST_DEVPOOL_HANDLE_BYTES; i++)
		if (e->mem_handle[i])
			break;
	if (i == ST_DEVPOOL_HANDLE_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_EXPORT: memory handle is all zero");
	return 0;
}

int st_devpool_revoke_decode(const uint8_t *p, size_t len,
			     struct st_devpool_revoke *ret,
			     struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	if (len != ST_DEVPOOL_REVOKE_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_REVOKE payload is %zu bytes, expected "
				   "%d", len, ST_DEVPOOL_REVOKE_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u32(&r, &ret->pid);
	st_rbuf_u32(&r, &ret->kind);
	st_rbuf_u64(&r, &ret->epoch);
	if (ret->pid == 0 || ret->pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "DEV_REVOKE: bad pid %u",
				   ret->pid);
	if (!kind_ok(ret->kind))
		return st_diag_set(diag, -ST_E_PROTO,
				   "DEV_REVOKE: unknown pool kind %u",
				   ret->kind);
	if (ret->epoch == 0)
		return st_diag_set(diag, -ST_E_PROTO, "DEV_REVOKE: epoch 0");
	return 0;
}

int st_devpool_rep_decode(const uint8_t *p, size_t len,
			  struct st_devpool_rep *ret, struct st_diag *diag)
{
	struct st_rbuf r;

	memset(ret, 0, sizeof(*ret));
	if (len != ST_DEVPOOL_REP_BYTES)
		return st_diag_set(diag, -ST_E_PROTO,
				   "device pool reply is %zu bytes, expected "
				   "%d", len, ST_DEVPOOL_REP_BYTES);
	st_rbuf_init(&r, p, len);
	st_rbuf_u64(&r, &ret->epoch);
	st_rbuf_u32(&r, &ret->importer_pid);
	st_rbuf_u32(&r, &ret->handles_open);
	st_rbuf_u64(&r, &ret->opened_total);
	st_rbuf_u64(&r, &ret->closed_total);
	if (ret->importer_pid == 0 || ret->importer_pid > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO,
				   "device pool reply: bad pid %u",
				   ret->importer_pid);
	if (ret->closed_total > ret->opened_total)
		return st_diag_set(diag, -ST_E_PROTO,
				   "device pool reply: %llu handles closed but "
				   "only %llu opened",
				   (unsigned long long)ret->closed_total,
				   (unsigned long long)ret->opened_total);
	return 0;
}

/* ---- exporter leases ---- */

int st_devlease_offer(struct st_devlease_table *t, uint32_t kind,
		      uint64_t epoch)
{
	int i;

	for (i = 0; i < ST_DEVLEASE_MAX; i++)
		if (t->e[i].state == ST_DEVLEASE_FREE)
			break;
	if (i == ST_DEVLEASE_MAX)
		return -ST_E_LIMIT;
	t->e[i].state = ST_DEVLEASE_OFFERED;
	t->e[i].pid = 0;
	t->e[i].kind = kind;
	t->e[i].epoch = epoch;
	return i;
}

int st_devlease_held(struct st_devlease_table *t, int idx, int32_t pid,
		     uint64_t epoch)
{
	if (idx < 0 || idx >= ST_DEVLEASE_MAX || pid <= 0 ||
	    t->e[idx].state != ST_DEVLEASE_OFFERED ||
	    t->e[idx].epoch != epoch)
		return -EINVAL;
	t->e[idx].state = ST_DEVLEASE_HELD;
	t->e[idx].pid = pid;
	return 0;
}

int st_devlease_released(struct st_devlease_table *t, uint32_t kind,
			 uint64_t epoch, int32_t pid)
{
	int i, n = 0;

	for (i = 0; i < ST_DEVLEASE_MAX; i++) {
		struct st_devlease *l = &t->e[i];

		if (l->kind != kind || l->epoch != epoch ||
		    (l->state != ST_DEVLEASE_OFFERED &&
		     l->state != ST_DEVLEASE_HELD))
			continue;
		/* an OFFERED entry's importer is unknown: the revoke reply of
		 * the same importer settles it too */
		if (l->state == ST_DEVLEASE_HELD && l->pid != pid)
			continue;
		l->state = ST_DEVLEASE_RELEASED;
		l->pid = pid;
		n++;
	}
	return n;
}

static int default_alive(int32_t pid, void *ctx)
{
	(void)ctx;
	return st_pid_alive(pid);
}

int st_devlease_may_free(struct st_devlease_table *t, uint32_t kind,
			 uint64_t epoch, int forget_unanswered,
			 int (*alive)(int32_t pid, void *ctx), void *ctx)
{
	int i, blocked = 0;

	if (!alive)
		alive = default_alive;
	for (i = 0; i < ST_DEVLEASE_MAX; i++) {
		struct st_devlease *l = &t->e[i];

		if (l->state == ST_DEVLEASE_FREE || l->kind != kind ||
		    l->epoch != epoch)
			continue;
		switch (l->state) {
		case ST_DEVLEASE_RELEASED:
			break;
		case ST_DEVLEASE_HELD:
			if (alive(l->pid, ctx))
				blocked = 1;
			break;
		case ST_DEVLEASE_OFFERED:
			if (!forget_unanswered)
				blocked = 1;
			break;
		}
	}
	if (blocked)
		return 0;
	for (i = 0; i < ST_DEVLEASE_MAX; i++)
		if (t->e[i].kind == kind && t->e[i].epoch == epoch)
			memset(&t->e[i], 0, sizeof(t->e[i]));
	return 1;
}

int st_devlease_count_held(const struct st_devlease_table *t, uint32_t kind,
			   uint64_t epoch)
{
	int i, n = 0;

	for (i = 0; i < ST_DEVLEASE_MAX; i++)
		if (t->e[i].kind == kind && t->e[i].epoch == epoch &&
		    (t->e[i].state == ST_DEVLEASE_OFFERED ||
		     t->e[i].state == ST_DEVLEASE_HELD))
			n++;
	return n;
}

/* ---- importer epoch handling ---- */

void st_devimport_init(struct st_devimport *s, uint32_t kind)
{
	memset(s, 0, sizeof(*s));
	s->kind = kind;
}

int st_devimport_plan_export(const struct st_devimport *s,
			     const struct st_devpool_export *e)
{
	if (e->kind != s->kind)
		return -EINVAL;
	if (s->epoch == 0)
		return ST_DEVIMPORT_OPEN;
	if (s->epoch == e->epoch && s->exporter_pid == (int32_t)e->pid)
		return ST_DEVIMPORT_KEEP;
	return ST_DEVIMPORT_CLOSE_OPEN;
}

int st_devimport_plan_revoke(const struct st_devimport *s,
			     const struct st_devpool_revoke *r)
{
	if (r->kind != s->kind || s->epoch == 0 || r->epoch != s->epoch)
		return ST_DEVIMPORT_KEEP;
	return ST_DEVIMPORT_CLOSE;
}

int st_devimport_plan_peer(const struct st_devimport *s,
			   int (*alive)(int32_t pid, void *ctx), void *ctx)
{
	if (!alive)
		alive = default_alive;
	if (s->epoch == 0 || alive(s->exporter_pid, ctx))
		return ST_DEVIMPORT_KEEP;
	return ST_DEVIMPORT_CLOSE;
}

void st_devimport_opened(struct st_devimport *s, int32_t pid, uint64_t epoch,
			 uint32_t n)
{
	if (s->last_epoch && s->last_epoch != epoch)
		s->epoch_changes++;
	s->last_epoch = epoch;
	s->exporter_pid = pid;
	s->epoch = epoch;
	s->handles_open += n;
	s->opened_total += n;
	s->imports++;
}

void st_devimport_closed(struct st_devimport *s)
{
	s->closed_total += s->handles_open;
	s->handles_open = 0;
	s->exporter_pid = 0;
	s->epoch = 0;
}

void st_devimport_rep(const struct st_devimport *s, uint32_t importer_pid,
		      struct st_devpool_rep *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->epoch = s->epoch;
	ret->importer_pid = importer_pid;
	ret->handles_open = s->handles_open;
	ret->opened_total = s->opened_total;
	ret->closed_total = s->closed_total;
}

/* ---- device slot table ---- */

size_t st_devslot_table_bytes(uint32_t n_slots)
{
	return sizeof(struct st_devslot_table) +
	       (size_t)n_slots * sizeof(struct st_devslot);
}

void st_devslot_table_reset(struct st_devslot_table *t, uint64_t epoch,
			    uint32_t n_slots, uint32_t n_events,
			    uint64_t slot_bytes, int keep_pins)
{
	uint32_t i, old = t->magic == ST_DEVSLOT_TABLE_MAGIC ? t->n_slots : 0;

	/* readers compare the epoch after pinning: zero it first so no pin
	 * taken during the reset can succeed */
	atomic_store(&t->epoch, 0);
	t->version = ST_DEVSLOT_TABLE_VERSION;
	t->n_slots = n_slots;
	t->n_events = n_events;
	t->slot_bytes = slot_bytes;
	for (i = 0; i < n_slots; i++) {
		struct st_devslot *s = &t->slot[i];
		uint32_t g = i < old ? atomic_load(&s->gen) + 1 : 1;

		if (!keep_pins || i >= old)
			atomic_store(&s->pins, 0);
		atomic_store(&s->state, atomic_load(&s->pins) ?
				ST_DEVSLOT_EVICTING : ST_DEVSLOT_EMPTY);
		atomic_store(&s->key, 0);
		atomic_store(&s->gen, g);
		atomic_store(&s->bytes, 0);
		atomic_store(&s->dirty, 0);
		s->event = 0;
	}
	atomic_store(&t->want_head, 0);
	atomic_store(&t->want_tail, 0);
	t->magic = ST_DEVSLOT_TABLE_MAGIC;
	atomic_store(&t->epoch, epoch);
}

int st_devslot_table_check(const struct st_devslot_table *t, size_t bytes,
			   struct st_diag *diag)
{
	if (bytes < sizeof(*t) || t->magic != ST_DEVSLOT_TABLE_MAGIC)
		return st_diag_set(diag, -ST_E_BADMAGIC,
				   "device slot table: bad magic");
	if (t->version != ST_DEVSLOT_TABLE_VERSION)
		return st_diag_set(diag, -ST_E_VERSION,
				   "device slot table version %u, this build "
				   "reads %d", t->version,
				   ST_DEVSLOT_TABLE_VERSION);
	if (t->n_slots == 0 || st_devslot_table_bytes(t->n_slots) > bytes ||
	    t->n_events == 0 || t->n_events > t->n_slots)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "device slot table: %u slots, %u events do "
				   "not fit %zu bytes", t->n_slots,
				   t->n_events, bytes);
	return 0;
}

int st_devslot_pin(struct st_devslot_table *t, uint32_t s, uint64_t key,
		   uint64_t epoch, uint32_t *ret_event)
{
	struct st_devslot *d;

	if (s >= t->n_slots)
		return 0;
	d = &t->slot[s];
	atomic_fetch_add(&d->pins, 1);
	if (atomic_load(&d->state) == ST_DEVSLOT_READY &&
	    atomic_load(&d->key) == key && atomic_load(&t->epoch) == epoch) {
		*ret_event = d->event;
		return 1;
	}
	atomic_fetch_sub(&d->pins, 1);
	return 0;
}

void st_devslot_unpin(struct st_devslot_table *t, uint32_t s)
{
	if (s < t->n_slots)
		atomic_fetch_sub(&t->slot[s].pins, 1);
}

int st_devslot_claim(struct st_devslot_table *t, uint32_t s, uint64_t key)
{
	struct st_devslot *d;
	uint32_t st;

	if (s >= t->n_slots)
		return 0;
	d = &t->slot[s];
	st = ST_DEVSLOT_EMPTY;
	if (!atomic_compare_exchange_strong(&d->state, &st,
					    ST_DEVSLOT_COPYING)) {
		st = ST_DEVSLOT_READY;
		if (atomic_compare_exchange_strong(&d->state, &st,
						   ST_DEVSLOT_EVICTING)) {
			if (atomic_load(&d->pins) != 0) {
				atomic_store(&d->state, ST_DEVSLOT_READY);
				return 0;
			}
		} else if (st != ST_DEVSLOT_EVICTING ||
			   atomic_load(&d->pins) != 0) {
			/* COPYING, or left EVICTING by a reset that kept a
			 * live reader's pins: not until they drop */
			return 0;
		}
		atomic_store(&d->state, ST_DEVSLOT_COPYING);
	}
	/* COPYING: no reader pins it (state is not READY), key order free */
	atomic_store(&d->key, key);
	atomic_fetch_add(&d->gen, 1);
	return 1;
}

void st_devslot_publish(struct st_devslot_table *t, uint32_t s,
			uint32_t event)
{
	t->slot[s].event = event;
	atomic_store(&t->slot[s].state, ST_DEVSLOT_READY);
}

void st_devslot_abort(struct st_devslot_table *t, uint32_t s)
{
	atomic_store(&t->slot[s].key, 0);
	atomic_store(&t->slot[s].state, ST_DEVSLOT_EMPTY);
}

int st_devslot_want_push(struct st_devslot_table *t, uint64_t key)
{
	uint32_t h = atomic_load_explicit(&t->want_head, memory_order_relaxed);
	uint32_t tl = atomic_load_explicit(&t->want_tail, memory_order_acquire);

	if (h - tl >= ST_DEVSLOT_WANT_RING)
		return 0;
	atomic_store_explicit(&t->want_key[h % ST_DEVSLOT_WANT_RING], key,
			      memory_order_relaxed);
	atomic_store_explicit(&t->want_head, h + 1, memory_order_release);
	return 1;
}

int st_devslot_want_pop(struct st_devslot_table *t, uint64_t *ret_key)
{
	uint32_t tl = atomic_load_explicit(&t->want_tail, memory_order_relaxed);
	uint32_t h = atomic_load_explicit(&t->want_head, memory_order_acquire);

	/* a head more than a ring ahead is garbage from a broken writer:
	 * skip to it rather than read stale entries */
	if (h - tl > ST_DEVSLOT_WANT_RING) {
		atomic_store_explicit(&t->want_tail, h, memory_order_release);
		return 0;
	}
	if (tl == h)
		return 0;
	*ret_key = atomic_load_explicit(&t->want_key[tl % ST_DEVSLOT_WANT_RING],
					memory_order_relaxed);
	atomic_store_explicit(&t->want_tail, tl + 1, memory_order_release);
	return 1;
}

int st_devslot_dirty_mark(struct st_devslot_table *t, uint32_t s,
			  uint64_t lo, uint64_t hi)
{
	struct st_devslot *d;
	uint64_t cur, nw, b;

	if (s >= t->n_slots || lo >= hi || hi > UINT32_MAX)
		return -EINVAL;
	d = &t->slot[s];
	cur = atomic_load(&d->dirty);
	do {
		uint64_t l = lo, h = hi;

		if (cur) {
			if ((cur >> 32) < l)
				l = cur >> 32;
			if ((cur & 0xffffffffu) > h)
				h = cur & 0xffffffffu;
		}
		nw = l << 32 | h;
	} while (!atomic_compare_exchange_weak(&d->dirty, &cur, nw));
	/* the importer writes bytes only while COPYING (no pins): the pinned
	 * exporter is its only writer now */
	b = atomic_load(&d->bytes);
	if (b < hi)
		atomic_store(&d->bytes, hi);
	return 0;
}

int st_devslot_dirty_take(struct st_devslot_table *t, uint32_t s,
			  uint64_t *ret_lo, uint64_t *ret_hi)
{
	uint64_t v;

	if (s >= t->n_slots)
		return 0;
	/* taken whole: a mark that lands after this sees a clean slot and
	 * makes it dirty again, so nothing marked is ever lost */
	v = atomic_exchange(&t->slot[s].dirty, 0);
	if (!v)
		return 0;
	*ret_lo = v >> 32;
	*ret_hi = v & 0xffffffffu;
	return 1;
}
