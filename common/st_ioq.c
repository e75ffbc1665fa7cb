/* st_ioq.c — see st_ioq.h. */
#include "st_ioq.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "st_log.h"
#include "st_util.h"

/* What this process last found about a peer slot (racy by design: at
 * worst a thread checks again). */
struct ioq_live {
	_Atomic int32_t pid;
	_Atomic int32_t alive;
	_Atomic uint64_t at_ns;
};

struct st_ioq {
	struct st_shm shm;
	struct st_ioq_seg *seg;
	char instance[64];
	int slot;
	int32_t pid;
	int enabled;
	uint64_t bound_ns;
	uint64_t depth;
	struct ioq_live live[ST_IOQ_SLOTS];
};

_Static_assert(sizeof(struct st_ioq_ctr) == 64, "one class, 64 bytes");
_Static_assert(sizeof(struct st_ioq_slot) % 64 == 0, "slots 64-aligned");

static const char *const k_names[ST_IOQ_N] = {
	"demand", "kv-restore", "prefetch", "kv-spill",
};

const char *st_ioq_class_name(int cls)
{
	return cls >= 0 && cls < ST_IOQ_N ? k_names[cls] : NULL;
}

/* ---- options ------------------------------------------------------------ */

static void read_env(struct st_ioq *q)
{
	const char *e = getenv("STRATA_IOQ");
	uint64_t us = ST_IOQ_DEFAULT_BOUND_NS / 1000;

	q->enabled = 1;
	if (e && *e) {
		if (!strcmp(e, "off") || !strcmp(e, "0"))
			q->enabled = 0;
		else if (strcmp(e, "on") && strcmp(e, "1"))
			st_warn("STRATA_IOQ=%s is not on or off; using the "
				"default on (off: I/O classes are counted, not "
				"ordered)", e);
	}
	st_env_u64("STRATA_IOQ_BOUND_US", 0, ST_IOQ_MAX_BOUND_NS / 1000, &us);
	q->bound_ns = us * 1000;
	q->depth = 0;
	st_env_u64("STRATA_IOQ_DEPTH", 0, 1024, &q->depth);
}

/* ---- the segment -------------------------------------------------------- */

/* Moves slot s's totals into retired and zeroes its gauges. */
static void slot_retire(struct st_ioq_seg *g, struct st_ioq_slot *s)
{
	for (int k = 0; k < ST_IOQ_N; k++) {
		struct st_ioq_ctr *c = &s->c[k], *r = &g->retired[k];

		atomic_fetch_add(&r->ops, atomic_exchange(&c->ops, 0));
		atomic_fetch_add(&r->bytes, atomic_exchange(&c->bytes, 0));
		atomic_fetch_add(&r->wait_ns, atomic_exchange(&c->wait_ns, 0));
		atomic_fetch_add(&r->io_ns, atomic_exchange(&c->io_ns, 0));
		atomic_fetch_add(&r->deferred,
				 atomic_exchange(&c->deferred, 0));
		atomic_fetch_add(&r->bound_hits,
				 atomic_exchange(&c->bound_hits, 0));
		atomic_store(&c->waiting, 0);
		atomic_store(&c->inflight, 0);
	}
}

/* Takes a free slot, or one of a dead process; -ENOSPC if none. */
static int slot_take(struct st_ioq *q, const char *who)
{
	struct st_ioq_seg *g = q->seg;
	uint64_t ticks = 0;

	(void)st_pid_start_ticks(q->pid, &ticks);
	/* the first free slot or one of a dead process (whose gauges a
	 * kill left up: cleared now, its totals kept in retired) */
	for (int i = 0; i < ST_IOQ_SLOTS; i++) {
		struct st_ioq_slot *s = &g->slot[i];
		int32_t pid = atomic_load(&s->pid);

		if (pid != 0 &&
		    (pid == q->pid ||
		     st_pid_alive_since(pid, atomic_load(&s->start_ticks))))
			continue;
		if (!atomic_compare_exchange_strong(&s->pid, &pid, q->pid))
			continue;
		slot_retire(g, s);
		atomic_store(&s->flags, q->enabled ? 0u : ST_IOQ_SLOT_UNORDERED);
		atomic_store(&s->start_ticks, ticks);
		memset(s->name, 0, sizeof(s->name));
		snprintf(s->name, sizeof(s->name), "%s", who);
		q->slot = i;
		return 0;
	}
	return -ENOSPC;
}

int st_ioq_open(struct st_ioq **ret, const char *instance, const char *who,
		struct st_diag *diag)
{
	struct st_ioq *q = calloc(1, sizeof(*q));
	int r;

	*ret = NULL;
	if (!q)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	read_env(q);
	q->pid = (int32_t)getpid();
	snprintf(q->instance, sizeof(q->instance), "%s", instance);
	for (int tries = 0;; tries++) {
		int fd;

		r = st_shm_attach_or_make(&q->shm, instance, ST_IOQ_KIND,
					  ST_IOQ_LAYOUT,
					  sizeof(struct st_ioq_seg),
					  "I/O queue", diag);
		if (r < 0)
			break;
		q->seg = q->shm.base;
		fd = st_shm_name_lock(&q->shm, 0);
		if (fd == -ENOENT && tries < 20) {
			/* removed by a last close meanwhile: again */
			st_shm_detach(&q->shm);
			continue;
		}
		if (fd < 0) {
			r = st_diag_set(diag, fd, "cannot lock %s: %s",
					q->shm.name, st_strerror(fd));
			break;
		}
		r = slot_take(q, who);
		if (r == 0 &&
		    !st_pid_alive(atomic_load(&q->seg->h.owner_pid)))
			atomic_store(&q->seg->h.owner_pid, q->pid);
		st_shm_name_unlock(fd);
		if (r < 0)
			r = st_diag_set(diag, r, "%s: all %d slots are held by "
					"live processes; stop some (strata ps)",
					q->shm.name, ST_IOQ_SLOTS);
		break;
	}
	if (r < 0) {
		st_shm_detach(&q->shm);
		free(q);
		return r;
	}
	*ret = q;
	return 0;
}

void st_ioq_close(struct st_ioq *q)
{
	struct st_ioq_seg *g;
	int fd, others = 0;

	if (!q)
		return;
	g = q->seg;
	fd = st_shm_name_lock(&q->shm, 0);
	slot_retire(g, &g->slot[q->slot]);
	atomic_store(&g->slot[q->slot].pid, 0);
	for (int i = 0; i < ST_IOQ_SLOTS; i++) {
		int32_t pid = atomic_load(&g->slot[i].pid);

		if (pid && st_pid_alive_since(pid, atomic_load(
						   &g->slot[i].start_ticks))) {
			others = 1;
			if (atomic_load(&g->h.owner_pid) == q->pid)
				atomic_store(&g->h.owner_pid, pid);
		}
	}
	/* the last one out removes it (under the lock: no opener is between
	 * its attach and its slot) */
	if (fd >= 0 && !others)
		shm_unlink(q->shm.name);
	if (fd >= 0)
		st_shm_name_unlock(fd);
	st_shm_detach(&q->shm);
	free(q);
}

int st_ioq_enabled(const struct st_ioq *q)
{
	return q ? q->enabled : 0;
}

uint64_t st_ioq_bound_ns(const struct st_ioq *q)
{
	return q ? q->bound_ns : 0;
}

struct st_ioq_seg *st_ioq_seg(const struct st_ioq *q)
{
	return q ? q->seg : NULL;
}

int st_ioq_slot_index(const struct st_ioq *q)
{
	return q ? q->slot : -1;
}

/* ---- the arbiter -------------------------------------------------------- */

/* Whether slot i (held by pid) is a live process; cached per slot for
 * ST_IOQ_LIVE_CHECK_NS.  A dead owner of the header is replaced by us, so
 * that strata down never takes the segment for an abandoned one. */
static int slot_live(struct st_ioq *q, int i, int32_t pid, uint64_t now)
{
	struct ioq_live *l = &q->live[i];
	int alive;

	if (pid == q->pid)
		return 1;
	if (atomic_load_explicit(&l->pid, memory_order_relaxed) == pid &&
	    now - atomic_load_explicit(&l->at_ns, memory_order_relaxed) <
		    ST_IOQ_LIVE_CHECK_NS)
		return atomic_load_explicit(&l->alive, memory_order_relaxed);
	alive = st_pid_alive_since(pid, atomic_load(
					       &q->seg->slot[i].start_ticks));
	atomic_store_explicit(&l->alive, alive, memory_order_relaxed);
	atomic_store_explicit(&l->at_ns, now, memory_order_relaxed);
	atomic_store_explicit(&l->pid, pid, memory_order_relaxed);
	if (!alive) {
		int32_t owner = pid;

		atomic_compare_exchange_strong(&q->seg->h.owner_pid, &owner,
					       q->pid);
	}
	return alive;
}

/* I/Os of the classes above cls waiting or in flight, in live processes. */
static uint64_t pressure(struct st_ioq *q, int cls, uint64_t now)
{
	uint64_t n = 0;

	for (int i = 0; i < ST_IOQ_SLOTS; i++) {
		struct st_ioq_slot *s = &q->seg->slot[i];
		int32_t pid = atomic_load_explicit(&s->pid,
						   memory_order_relaxed);
		uint64_t m = 0;

		if (!pid)
			continue;
		for (int k = 0; k < cls; k++)
			m += atomic_load(&s->c[k].waiting) +
			     atomic_load(&s->c[k].inflight);
		if (m && slot_live(q, i, pid, now))
			n += m;
	}
	return n;
}

int st_ioq_pressure(struct st_ioq *q, int cls)
{
	if (!q || cls <= 0 || cls >= ST_IOQ_N)
		return 0;
	return pressure(q, cls, st_now_ns()) > q->depth;
}

static struct st_ioq_ctr *ctr(struct st_ioq *q, int cls)
{
	return &q->seg->slot[q->slot].c[cls];
}

static int valid_class(int cls)
{
	return cls >= 0 && cls < ST_IOQ_N ? cls : ST_IOQ_DEMAND;
}

/* st_ioq_try_begin with the urgency prio (gauges, deferral); totals go
 * to cls. */
static int try_begin(struct st_ioq *q, int cls, int prio,
		     struct st_ioq_op *op)
{
	uint64_t now = st_now_ns();

	if (op->state == 0) {
		memset(op, 0, sizeof(*op));
		op->cls = valid_class(cls);
		op->prio = valid_class(prio);
		op->state = 1;
		op->t_queued = now;
		if (q)
			atomic_fetch_add(&ctr(q, op->prio)->waiting, 1);
	}
	prio = op->prio;
	if (q && q->enabled && prio > ST_IOQ_DEMAND &&
	    pressure(q, prio, now) > q->depth) {
		if (now - op->t_queued < q->bound_ns) {
			op->deferred = 1;
			return -EAGAIN;
		}
		op->deferred = 1;
		atomic_fetch_add(&ctr(q, op->cls)->bound_hits, 1);
	}
	if (q) {
		struct st_ioq_ctr *g = ctr(q, prio);

		/* in flight before it leaves waiting: a peer never sees the
		 * class idle in between */
		atomic_fetch_add(&g->inflight, 1);
		atomic_fetch_sub(&g->waiting, 1);
		if (op->deferred)
			atomic_fetch_add(&ctr(q, op->cls)->deferred, 1);
	}
	op->state = 2;
	op->t_start = now;
	return 0;
}

int st_ioq_try_begin(struct st_ioq *q, int cls, struct st_ioq_op *op)
{
	return try_begin(q, cls, cls, op);
}

void st_ioq_begin(struct st_ioq *q, int cls, struct st_ioq_op *op)
{
	st_ioq_begin_prio(q, cls, cls, op);
}

void st_ioq_begin_prio(struct st_ioq *q, int cls, int prio,
		       struct st_ioq_op *op)
{
	op->state = 0;
	while (try_begin(q, cls, prio, op) == -EAGAIN) {
		uint64_t left = op->t_queued + q->bound_ns - st_now_ns();

		/* left wraps past the bound: the next try goes */
		st_sleep_ns(left < ST_IOQ_POLL_NS ? left : ST_IOQ_POLL_NS);
	}
}

void st_ioq_cancel(struct st_ioq *q, struct st_ioq_op *op)
{
	if (op->state == 1 && q)
		atomic_fetch_sub(&ctr(q, op->prio)->waiting, 1);
	if (op->state == 2 && q)
		atomic_fetch_sub(&ctr(q, op->prio)->inflight, 1);
	op->state = 0;
}

void st_ioq_end(struct st_ioq *q, struct st_ioq_op *op, uint64_t bytes)
{
	uint64_t now = st_now_ns();
	struct st_ioq_ctr *c;

	if (op->state != 2) {
		st_ioq_cancel(q, op);
		return;
	}
	op->state = 0;
	if (!q)
		return;
	c = ctr(q, op->cls);
	atomic_fetch_add(&c->ops, 1);
	atomic_fetch_add(&c->bytes, bytes);
	atomic_fetch_add(&c->wait_ns, op->t_start - op->t_queued);
	atomic_fetch_add(&c->io_ns, now - op->t_start);
	atomic_fetch_sub(&ctr(q, op->prio)->inflight, 1);
}

/* ---- totals ------------------------------------------------------------- */

static void add_ctr(struct st_ioq_totals *t, int k, struct st_ioq_ctr *c)
{
	t->ops[k] += atomic_load(&c->ops);
	t->bytes[k] += atomic_load(&c->bytes);
	t->wait_ns[k] += atomic_load(&c->wait_ns);
	t->io_ns[k] += atomic_load(&c->io_ns);
	t->deferred[k] += atomic_load(&c->deferred);
	t->bound_hits[k] += atomic_load(&c->bound_hits);
}

static void seg_totals(struct st_ioq_seg *g, struct st_ioq_totals *t)
{
	memset(t, 0, sizeof(*t));
	for (int k = 0; k < ST_IOQ_N; k++) {
		add_ctr(t, k, &g->retired[k]);
		for (int i = 0; i < ST_IOQ_SLOTS; i++)
			add_ctr(t, k, &g->slot[i].c[k]);
	}
	for (int i = 0; i < ST_IOQ_SLOTS; i++) {
		struct st_ioq_slot *s = &g->slot[i];
		int32_t pid = atomic_load(&s->pid);

		if (!pid || !st_pid_alive_since(pid,
						atomic_load(&s->start_ticks)))
			continue;
		if (atomic_load(&s->flags) & ST_IOQ_SLOT_UNORDERED)
			t->unordered++;
		else
			t->ordered++;
	}
}

int st_ioq_mode(const struct st_ioq_totals *t)
{
	if (t->unordered && t->ordered)
		return ST_IOQ_MODE_MIXED;
	return t->unordered ? ST_IOQ_MODE_UNORDERED : ST_IOQ_MODE_ORDERED;
}

void st_ioq_totals(const struct st_ioq *q, struct st_ioq_totals *t)
{
	if (!q) {
		memset(t, 0, sizeof(*t));
		return;
	}
	seg_totals(q->seg, t);
}

int st_ioq_read_totals(const char *instance, struct st_ioq_totals *t,
		       struct st_diag *diag)
{
	struct st_shm shm;
	int r;

	memset(t, 0, sizeof(*t));
	r = st_shm_attach(&shm, instance, ST_IOQ_KIND, ST_IOQ_LAYOUT, 0, diag);
	if (r < 0)
		return r;
	if (shm.size < sizeof(struct st_ioq_seg)) {
		st_shm_detach(&shm);
		return st_diag_set(diag, -ST_E_FORMAT, "%s: too small",
				   shm.name);
	}
	seg_totals(shm.base, t);
	st_shm_detach(&shm);
	return 0;
}
