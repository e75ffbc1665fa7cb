/* st_ledger.c — the shared memory budget's segment (st_ledger.h). */
#include "st_ledger.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "st_log.h"
#include "st_util.h"

struct st_ledger {
	struct st_shm shm;
	struct st_ledger_seg *seg;
	int side;
	int32_t pid;
	struct st_ledger_params prm;
	uint64_t total, floor, cap;   /* as joined */
	int warned;                   /* the inconsistent segment was said */
};

_Static_assert(sizeof(struct st_ledger_rec) % 64 == 0, "records 64-aligned");

static double d_of(uint64_t bits)
{
	double d;

	memcpy(&d, &bits, sizeof(d));
	return d;
}

static uint64_t bits_of(double d)
{
	uint64_t b;

	memcpy(&b, &d, sizeof(b));
	return b;
}

static int rec_live(const struct st_ledger_rec *r)
{
	int32_t pid = atomic_load(&r->pid);

	return pid > 0 && st_pid_alive_since(pid, atomic_load(&r->start_ticks));
}

/* Bytes per move: STRATA_LEDGER_STEP (bytes or a share of total), else
 * total / 16; a bad value is a warning and the default. */
static uint64_t step_of(uint64_t total)
{
	const char *e = getenv("STRATA_LEDGER_STEP");
	uint64_t bytes = 0, def = total / 16 ? total / 16 : 1;
	double pct = 0;

	if (!e || !*e)
		return def;
	if (st_parse_budget(e, &bytes, &pct) < 0 || pct > 100.0 ||
	    (!bytes && pct <= 0.0) || bytes > total) {
		st_warn("STRATA_LEDGER_STEP=%s is neither a byte size up to the "
			"memory budget nor a share of it (e.g. 256MiB, 5%%); "
			"using the default (1/16 of it)", e);
		return def;
	}
	return bytes ? bytes : (uint64_t)((double)total * pct / 100.0) + 1;
}

/* Clears everything after the header: a ledger for a new total. */
static void seg_reset(struct st_ledger_seg *g, uint64_t total)
{
	memset((char *)g + sizeof(g->h), 0, sizeof(*g) - sizeof(g->h));
	atomic_store(&g->total, total);
	atomic_store(&g->step, step_of(total));
}

/* The header's owner is what `strata down` checks before it removes a
 * dead instance's segments: a live side holds it (taken when the one named
 * is dead, handed on by a clean close). */
static void take_owner(struct st_ledger_seg *g, int32_t pid)
{
	int32_t o = atomic_load(&g->h.owner_pid);

	if (o != pid && !st_pid_alive(o))
		atomic_compare_exchange_strong(&g->h.owner_pid, &o, pid);
}

uint64_t st_ledger_join_target(uint64_t total, uint64_t floor, uint64_t cap,
			       uint64_t kept, uint64_t other_cap,
			       uint64_t other_target)
{
	uint64_t t = kept;

	if (!t) /* the side's first owner: half, or what the other leaves */
		t = other_cap ? (other_target < total ? total - other_target :
							0) :
				total / 2;
	if (t < floor)
		t = floor;
	if (t > cap)
		t = cap;
	return t;
}

/* Under the name lock: checks and takes `side` and gives it its target. */
static int join(struct st_ledger *l, const char *instance, uint64_t total,
		uint64_t floor, uint64_t cap, uint64_t unit,
		struct st_diag *diag)
{
	struct st_ledger_seg *g = l->seg;
	struct st_ledger_rec *me = &g->side[l->side];
	struct st_ledger_rec *other = &g->side[!l->side];
	int other_live = rec_live(other);
	uint64_t have = atomic_load(&g->total), t, to, ticks = 0;
	char b1[32], b2[32], b3[32], b4[32];

	if (atomic_load(&me->pid) != l->pid && rec_live(me))
		return st_diag_set(diag, -EBUSY,
				   "the %s side of instance '%s''s memory "
				   "budget is held by pid %d; stop it first",
				   st_ledger_side_name(l->side), instance,
				   (int)atomic_load(&me->pid));
	if (have != total) {
		if (have && other_live)
			return st_diag_set(
				diag, -ST_E_CONFIG,
				"instance '%s' shares %s between experts and KV "
				"(the running %s, pid %d, has --memory-budget "
				"%" PRIu64 "); give this daemon the same "
				"--memory-budget, not %s, or stop the instance "
				"first (strata down)", instance,
				st_format_bytes(have, b1, sizeof(b1)),
				l->side == ST_LEDGER_EXPERTS ? "kvd" :
							       "expertd",
				(int)atomic_load(&other->pid), have,
				st_format_bytes(total, b2, sizeof(b2)));
		seg_reset(g, total);
	}
	/* the budget first: a floor above the total (and so above a cap
	 * made for it) is a budget too small, whose least is named */
	to = atomic_load(&other->cap) ? atomic_load(&other->floor) : 0;
	if (floor > total || floor + to > total)
		return st_diag_set(
			diag, -ST_E_BUDGET,
			"--memory-budget %s is below what the two sides need "
			"at least: %s for %s plus %s for %s; give at least %s "
			"(%" PRIu64 " bytes)",
			st_format_bytes(total, b1, sizeof(b1)),
			st_format_bytes(floor, b2, sizeof(b2)),
			st_ledger_side_name(l->side),
			st_format_bytes(to, b3, sizeof(b3)),
			st_ledger_side_name(!l->side),
			st_format_bytes(floor + to, b4, sizeof(b4)),
			floor + to);
	if (floor > cap)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "the %s floor %s is above its cap %s",
				   st_ledger_side_name(l->side),
				   st_format_bytes(floor, b1, sizeof(b1)),
				   st_format_bytes(cap, b2, sizeof(b2)));
	atomic_store(&me->floor, floor);
	atomic_store(&me->cap, cap);
	atomic_store(&me->unit, unit);
	t = st_ledger_join_target(total, floor, cap, atomic_load(&me->target),
				  atomic_load(&other->cap),
				  atomic_load(&other->target));
	if (t + atomic_load(&other->target) > total) {
		/* our floor needs more than the other leaves: take it (the
		 * floors fit, checked above); the other side shrinks to it */
		atomic_store(&other->target, total - t);
	}
	atomic_store(&me->target, t);
	atomic_store(&me->over, 0);
	atomic_store(&me->value_ns, 0);
	(void)st_pid_start_ticks(l->pid, &ticks);
	atomic_store(&me->start_ticks, ticks);
	atomic_store(&me->pid, l->pid);
	take_owner(g, l->pid);
	return 0;
}

int st_ledger_open(struct st_ledger **ret, const char *instance, int side,
		   uint64_t total, uint64_t floor, uint64_t cap, uint64_t unit,
		   struct st_diag *diag)
{
	struct st_ledger *l;
	int r;

	*ret = NULL;
	if (side < 0 || side >= ST_LEDGER_SIDES || !total || !unit)
		return st_diag_set(diag, -EINVAL, "bad ledger side %d, total "
				   "%" PRIu64 " or unit %" PRIu64, side, total,
				   unit);
	l = calloc(1, sizeof(*l));
	if (!l)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	l->side = side;
	l->pid = (int32_t)getpid();
	st_ledger_params_default(&l->prm);
	for (int tries = 0;; tries++) {
		int fd;

		r = st_shm_attach_or_make(&l->shm, instance, ST_LEDGER_KIND,
					  ST_LEDGER_LAYOUT,
					  sizeof(struct st_ledger_seg),
					  "memory ledger", diag);
		if (r < 0)
			break;
		l->seg = l->shm.base;
		fd = st_shm_name_lock(&l->shm, 0);
		if (fd == -ENOENT && tries < 20) {
			/* removed by a last close meanwhile: again */
			st_shm_detach(&l->shm);
			continue;
		}
		if (fd < 0) {
			r = st_diag_set(diag, fd, "cannot lock %s: %s",
					l->shm.name, st_strerror(fd));
			break;
		}
		r = join(l, instance, total, floor, cap, unit, diag);
		l->total = total;
		l->floor = floor;
		l->cap = cap;
		st_shm_name_unlock(fd);
		break;
	}
	if (r < 0) {
		st_shm_detach(&l->shm);
		free(l);
		return r;
	}
	*ret = l;
	return 0;
}

void st_ledger_close(struct st_ledger *l)
{
	struct st_ledger_seg *g;
	int fd;

	if (!l)
		return;
	g = l->seg;
	fd = st_shm_name_lock(&l->shm, 0);
	if (atomic_load(&g->side[l->side].pid) == l->pid)
		atomic_store(&g->side[l->side].pid, 0);
	if (atomic_load(&g->h.owner_pid) == l->pid &&
	    rec_live(&g->side[!l->side]))
		atomic_store(&g->h.owner_pid,
			     atomic_load(&g->side[!l->side].pid));
	/* the last one out removes it (under the lock: no opener is between
	 * its attach and its join) */
	if (fd >= 0 && !rec_live(&g->side[!l->side]))
		shm_unlink(l->shm.name);
	st_shm_name_unlock(fd);
	st_shm_detach(&l->shm);
	free(l);
}

uint64_t st_ledger_target(const struct st_ledger *l)
{
	uint64_t t;

	if (!l)
		return UINT64_MAX;
	t = atomic_load(&l->seg->side[l->side].target);
	if (t > l->cap)
		t = l->cap;
	if (t > l->total)
		t = l->total;
	return t < l->floor ? l->floor : t;
}

int st_ledger_check_total(uint64_t total, struct st_diag *diag)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t ram;
	char a[32], b[32];

	if (pages <= 0 || psz <= 0)
		return 0; /* unknown: nothing to check against */
	ram = (uint64_t)pages * (uint64_t)psz;
	if (total <= ram)
		return 0;
	return st_diag_set(diag, -ST_E_BUDGET,
			   "--memory-budget %s is more than this machine's "
			   "memory (%s): expert slots and KV pages both live "
			   "in RAM; give at most %s, less what the dense "
			   "weights and the daemons need",
			   st_format_bytes(total, a, sizeof(a)),
			   st_format_bytes(ram, b, sizeof(b)), b);
}

/* Why view v (read from l's segment) cannot be acted on, or NULL. */
static const char *inconsistent(const struct st_ledger *l,
				const struct st_ledger_view *v)
{
	if (v->total != l->total)
		return "its total is not the one this daemon joined with";
	if (!v->step || v->step > v->total)
		return "its step is 0 or above its total";
	if (v->pend_from >= ST_LEDGER_SIDES || v->pending > v->total)
		return "its pending move is out of range";
	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		if (v->side[s].target > v->total ||
		    v->side[s].floor > v->side[s].cap)
			return "a side's target or floor is out of range";
	if (v->side[0].target + v->side[1].target + v->pending > v->total)
		return "its targets add up to more than its total";
	return NULL;
}

uint64_t st_ledger_total(const struct st_ledger *l)
{
	return l ? atomic_load(&l->seg->total) : 0;
}

uint64_t st_ledger_step(const struct st_ledger *l)
{
	return l ? atomic_load(&l->seg->step) : 0;
}

void st_ledger_report(struct st_ledger *l, const struct st_ledger_report *r)
{
	struct st_ledger_rec *me;

	if (!l)
		return;
	me = &l->seg->side[l->side];
	atomic_store(&me->used, r->used);
	atomic_store(&me->pinned, r->pinned);
	atomic_store(&me->over, r->over);
	atomic_store(&me->gain, bits_of(r->gain));
	atomic_store(&me->loss, bits_of(r->loss));
	atomic_store(&me->value_ns, st_now_ns());
}

/* A copy of g; with_log also the ring, oldest first. */
static void view_of(const struct st_ledger_seg *g, struct st_ledger_view *v,
		    int with_log)
{
	memset(v, 0, sizeof(*v));
	v->total = atomic_load(&g->total);
	v->step = atomic_load(&g->step);
	v->last_move_ns = atomic_load(&g->last_move_ns);
	v->pending = atomic_load(&g->pending);
	v->pend_ns = atomic_load(&g->pend_ns);
	v->pend_from = atomic_load(&g->pend_from);
	v->n_moves = atomic_load(&g->n_moves);
	for (int s = 0; s < ST_LEDGER_SIDES; s++) {
		const struct st_ledger_rec *r = &g->side[s];

		v->side[s].pid = atomic_load(&r->pid);
		v->side[s].live = rec_live(r);
		v->side[s].floor = atomic_load(&r->floor);
		v->side[s].cap = atomic_load(&r->cap);
		v->side[s].unit = atomic_load(&r->unit);
		v->side[s].target = atomic_load(&r->target);
		v->side[s].used = atomic_load(&r->used);
		v->side[s].pinned = atomic_load(&r->pinned);
		v->side[s].over = atomic_load(&r->over);
		v->side[s].gain = d_of(atomic_load(&r->gain));
		v->side[s].loss = d_of(atomic_load(&r->loss));
		v->side[s].value_ns = atomic_load(&r->value_ns);
		v->side[s].moves_in = atomic_load(&r->moves_in);
		v->side[s].moves_out = atomic_load(&r->moves_out);
		v->side[s].bytes_in = atomic_load(&r->bytes_in);
		v->side[s].bytes_out = atomic_load(&r->bytes_out);
		v->side[s].cancelled = atomic_load(&r->cancelled);
	}
	if (with_log) {
		uint64_t n = v->n_moves;
		uint64_t k = n < ST_LEDGER_LOG ? n : ST_LEDGER_LOG;

		for (uint64_t i = 0; i < k; i++)
			v->log[i] = g->log[(n - k + i) % ST_LEDGER_LOG];
		v->n_log = (unsigned)k;
	}
}

void st_ledger_view(const struct st_ledger *l, struct st_ledger_view *v)
{
	view_of(l->seg, v, 1);
}

int st_ledger_read(const char *instance, struct st_ledger_view *v,
		   struct st_diag *diag)
{
	struct st_shm shm;
	int r;

	memset(&shm, 0, sizeof(shm));
	r = st_shm_attach(&shm, instance, ST_LEDGER_KIND, ST_LEDGER_LAYOUT, 0,
			  diag);

	if (r < 0)
		return r;
	if (shm.size < sizeof(struct st_ledger_seg)) {
		st_shm_detach(&shm);
		return st_diag_set(diag, -ST_E_FORMAT, "%s is too small for "
				   "a memory ledger", shm.name);
	}
	view_of(shm.base, v, 1);
	st_shm_detach(&shm);
	return 0;
}

/* Appends a move to the ring (under the name lock). */
static void log_move(struct st_ledger_seg *g, struct st_ledger_move *m)
{
	uint64_t n = atomic_load(&g->n_moves);

	m->target[0] = atomic_load(&g->side[0].target);
	m->target[1] = atomic_load(&g->side[1].target);
	g->log[n % ST_LEDGER_LOG] = *m;
	atomic_store(&g->n_moves, n + 1);
}

static const char *why_text(uint32_t why)
{
	switch (why) {
	case ST_LEDGER_WHY_VALUE: return "gain above loss";
	case ST_LEDGER_WHY_OVER: return "over its target";
	case ST_LEDGER_WHY_FLIP: return "STRATA_LEDGER_FLIP_MS";
	case ST_LEDGER_WHY_UNASSIGNED: return "unassigned";
	}
	return "?";
}

/* The daemon log's line for a logged move (flip moves: debug only). */
static void say_move(const struct st_ledger_move *m)
{
	const char *f = st_ledger_side_name((int)m->from & 1);
	const char *t = st_ledger_side_name((int)m->to & 1);
	int lvl = m->why == ST_LEDGER_WHY_FLIP ? ST_LOG_DEBUG : ST_LOG_INFO;
	char b[32], e[32], k[32];

	st_format_bytes(m->bytes, b, sizeof(b));
	st_format_bytes(m->target[ST_LEDGER_EXPERTS], e, sizeof(e));
	st_format_bytes(m->target[ST_LEDGER_KV], k, sizeof(k));
	if (m->kind == ST_LEDGER_MOVE_DONE)
		st_log(lvl, "memory: moved %s %s -> %s (%s: gain %.3g > loss "
		       "%.3g ns/s per GiB); now experts %s, kv %s", b, f, t,
		       why_text(m->why), m->gain, m->loss, e, k);
	else if (m->kind == ST_LEDGER_MOVE_CANCELLED)
		st_log(lvl, "memory: move of %s %s -> %s cancelled: %s could "
		       "not free it in time (pinned); now experts %s, kv %s",
		       b, f, t, f, e, k);
	else
		st_log(lvl, "memory: gave %s that no side held to %s; now "
		       "experts %s, kv %s", b, t, e, k);
}

/* Applies a (under the name lock); 1 when a target changed. */
static int apply(struct st_ledger *l, const struct st_ledger_action *a,
		 uint64_t now, struct st_ledger_move *m)
{
	struct st_ledger_seg *g = l->seg;
	struct st_ledger_rec *from = &g->side[a->from & 1];
	struct st_ledger_rec *to = &g->side[a->to & 1];

	memset(m, 0, sizeof(*m));
	m->t_ns = now;
	m->from = a->from;
	m->to = a->to;
	m->bytes = a->bytes;
	switch (a->act) {
	case ST_LEDGER_ACT_NONE:
		return 0;
	case ST_LEDGER_ACT_START:
		atomic_fetch_sub(&from->target, a->bytes);
		atomic_store(&g->pend_from, a->from);
		atomic_store(&g->pend_why, a->why);
		atomic_store(&g->pend_ns, now);
		atomic_store(&g->pend_gain, bits_of(a->gain));
		atomic_store(&g->pend_loss, bits_of(a->loss));
		atomic_store(&g->last_move_ns, now);
		if (a->why == ST_LEDGER_WHY_FLIP)
			atomic_fetch_add(&g->n_flips, 1);
		atomic_store(&g->pending, a->bytes);
		return 1;
	case ST_LEDGER_ACT_COMPLETE:
	case ST_LEDGER_ACT_CANCEL:
		m->why = atomic_load(&g->pend_why);
		m->gain = d_of(atomic_load(&g->pend_gain));
		m->loss = d_of(atomic_load(&g->pend_loss));
		if (a->act == ST_LEDGER_ACT_COMPLETE) {
			m->kind = ST_LEDGER_MOVE_DONE;
			atomic_fetch_add(&to->target, a->bytes);
			atomic_fetch_add(&from->moves_out, 1);
			atomic_fetch_add(&from->bytes_out, a->bytes);
			atomic_fetch_add(&to->moves_in, 1);
			atomic_fetch_add(&to->bytes_in, a->bytes);
		} else {
			m->kind = ST_LEDGER_MOVE_CANCELLED;
			atomic_fetch_add(&from->target, a->bytes);
			atomic_fetch_add(&from->cancelled, 1);
		}
		atomic_store(&g->pending, 0);
		break;
	case ST_LEDGER_ACT_GRANT:
		m->kind = ST_LEDGER_MOVE_GRANT;
		m->why = a->why;
		m->gain = a->gain;
		atomic_fetch_add(&to->target, a->bytes);
		atomic_store(&g->last_move_ns, now);
		break;
	}
	log_move(g, m);
	say_move(m);
	return 1;
}

int st_ledger_tick(struct st_ledger *l, uint64_t now_ns,
		   struct st_ledger_move *ret_move)
{
	struct st_ledger_seg *g;
	struct st_ledger_view v;
	struct st_ledger_action a;
	struct st_ledger_move m;
	const char *why;
	uint64_t last;
	int fd, changed;

	if (ret_move)
		memset(ret_move, 0, sizeof(*ret_move));
	if (!l)
		return 0;
	g = l->seg;
	last = atomic_load(&g->arb_ns);
	if (now_ns - last < ST_LEDGER_INTERVAL_NS && last <= now_ns)
		return 0;
	if (!atomic_compare_exchange_strong(&g->arb_ns, &last, now_ns))
		return 0; /* the other daemon runs it now */
	fd = st_shm_name_lock(&l->shm, 1);
	if (fd < 0)
		return 0;
	take_owner(g, l->pid);
	view_of(g, &v, 0);
	why = inconsistent(l, &v);
	if (why) {
		if (!l->warned)
			st_warn("memory ledger %s is inconsistent (%s): the "
				"split stays as it is; restarting both expertd "
				"and kvd makes it anew", l->shm.name, why);
		l->warned = 1;
		st_shm_name_unlock(fd);
		return 0;
	}
	st_ledger_decide(&v, &l->prm, now_ns, &a);
	changed = apply(l, &a, now_ns, &m);
	st_shm_name_unlock(fd);
	if (changed && ret_move)
		*ret_move = m;
	return changed;
}
