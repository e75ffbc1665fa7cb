/*
 * es_budget.c — expertd under one host memory budget (--memory-budget,
 * issue 24 items 2 and 4; st_ledger.h is the contract, DESIGN.md "One
 * memory budget", "expertd's side").
 *
 * The pool is sized for the side's cap, min(M, every expert's record),
 * and made sparse (es_pool_open): a slot costs memory only while it holds
 * a record.  The ledger gives the experts a target in bytes; the slots in
 * use (not EMPTY) are kept at or below target / record_bytes (at least
 * top-k) by three rules:
 *  - es_pool_alloc_slot takes an EMPTY slot only below that count, else
 *    evicts a victim of the policy; only a demand load that finds every
 *    other slot pinned or loading goes beyond it (reported as `over`);
 *  - warm-up of the hot set and prefetches never go beyond it;
 *  - each tick, while more slots are in use than the target allows,
 *    unpinned READY (and FAILED) slots are evicted by the policy under
 *    the pin protocol (es_pool_slot_try_evict) and their pages given back
 *    (MADV_REMOVE); pinned, LOADING and EVICTING slots are never touched.
 * Everything runs on the server thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "es_daemon.h"
#include "st_ioq.h"
#include "st_ledger.h"
#include "st_log.h"
#include "st_util.h"

int es_budget_geom(const struct st_store *s, uint64_t store_id,
		   const char *mem_text, const char *host_text,
		   struct es_pool_geom *ret, uint64_t *ret_floor,
		   uint64_t *ret_cap, struct st_diag *diag)
{
	uint64_t m = 0, n_keys, cap_slots, floor_slots, rb;
	char b1[32], b2[32];
	int r;

	/* the store's geometry checks and the floor's slots */
	r = es_pool_geom_from_budget(s, store_id, host_text ? host_text :
				     "100%", ret, diag);
	if (r < 0)
		return r;
	if (st_parse_size(mem_text, &m) < 0)
		return st_diag_set(diag, -EINVAL, "--memory-budget '%s' is not "
				   "a size: give %s", mem_text, ST_SIZE_WORDS);
	if (!m)
		return st_diag_set(diag, -EINVAL, "--memory-budget %s: give a "
				   "size, or leave the option out to keep the "
				   "fixed --host-budget", mem_text);
	n_keys = (uint64_t)ret->n_layers * ret->n_experts;
	rb = ret->record_bytes;
	floor_slots = host_text ? ret->n_slots : ret->top_k;
	cap_slots = ST_MIN(m / ret->record_bytes, n_keys);
	if (cap_slots > INT32_MAX)
		cap_slots = INT32_MAX;
	if (cap_slots < ret->top_k)
		return st_diag_set(
			diag, -ST_E_BUDGET,
			"--memory-budget %s cannot hold one layer's top-k of "
			"%u experts (%s); give at least that plus kvd's floor",
			mem_text, ret->top_k,
			st_format_bytes((uint64_t)ret->top_k * rb, b1,
					sizeof(b1)));
	if (floor_slots > cap_slots)
		return st_diag_set(
			diag, -ST_E_CONFIG,
			"--host-budget %s (the experts' floor, %s) is above "
			"what --memory-budget %s lets them hold (%s); lower "
			"--host-budget or raise --memory-budget", host_text,
			st_format_bytes(floor_slots * rb, b1, sizeof(b1)),
			mem_text,
			st_format_bytes(cap_slots * rb, b2, sizeof(b2)));
	ret->n_slots = (uint32_t)cap_slots;
	*ret_floor = floor_slots * rb;
	*ret_cap = cap_slots * rb;
	return 0;
}

/* Gives slot s's pages back, warning once when the kernel refuses. */
static void release(struct es_daemon *d, uint32_t s)
{
	int r = es_pool_release_record(&d->pool, s);

	if (r < 0 && !d->budget.release_warned) {
		d->budget.release_warned = 1;
		st_warn("cannot give an evicted expert's memory back "
			"(madvise MADV_REMOVE: %s); the pool's RSS will not "
			"follow the memory target", st_strerror(r));
	}
}

static void apply_target(struct es_daemon *d)
{
	struct es_budget *b = &d->budget;
	const struct es_pool_geom *g = &d->pool.geom;
	uint64_t t = st_ledger_target(b->l);
	uint32_t allowed = es_budget_slots(t, g->record_bytes, g->top_k,
					   g->n_slots);
	char b1[32];

	if (t == b->target && allowed == d->pool.allowed)
		return;
	st_info("expert memory target %s: %u of %u slots", st_format_bytes(
			t, b1, sizeof(b1)), allowed, g->n_slots);
	b->target = t;
	d->pool.allowed = allowed;
}

/* Evicts unpinned experts until at most d->pool.allowed slots are in use
 * (*used: slots not EMPTY, updated).  Returns how many were freed. */
static uint32_t shrink(struct es_daemon *d, uint64_t *used)
{
	struct es_pool *p = &d->pool;
	struct es_pool_view *v = &p->v;
	int32_t *order = NULL;
	int n_order = 0;
	uint32_t n = 0;

	for (uint32_t s = 0; s < v->n_slots && *used > p->allowed; s++) {
		struct es_slot *sl = &v->slots[s];

		/* FAILED: only the server thread leaves it (es_pool.c) */
		if (atomic_load(&sl->state) == ES_SLOT_FAILED &&
		    es_slot_pin_sum(sl) == 0) {
			es_pool_slot_clear(p, s);
			release(d, s);
			(*used)--;
			n++;
		}
	}
	if (*used > p->allowed) {
		/* candidates in the policy's order, one scan of the pool */
		order = malloc(sizeof(int32_t) * v->n_slots);
		n_order = order ? es_policy_rank(p->ev, v, order, v->n_slots) :
				  0;
	}
	for (int i = 0; i < n_order && *used > p->allowed; i++) {
		uint32_t s = (uint32_t)order[i];

		if (es_pool_slot_try_evict(p, s) < 0)
			continue; /* pinned since the ranking */
		atomic_fetch_add(&v->hdr->c.evictions, 1);
		es_tiers_evicting(d, s);
		/* won unpinned (pin protocol): EMPTY first, then its pages
		 * go; a kill between the two leaves an EMPTY slot with data,
		 * which the successor gives back (es_budget_open), never a
		 * kept record with holes (adoption keeps EVICTING slots) */
		es_pool_slot_clear(p, s);
		if (d->opt.test_shrink_delay_ms > 0) /* tests: kills land */
			st_sleep_ns((uint64_t)d->opt.test_shrink_delay_ms *
				    1000000ull);
		release(d, s);
		(*used)--;
		n++;
	}
	free(order);
	d->budget.shrink_evictions += n;
	return n;
}

/*
 * Gives back the pages of EMPTY slots when the segment holds more than
 * the tables and the slots in use (two records of slack): a client that
 * mapped a record (es_client.c, MADV_POPULATE_READ at open) just as it was
 * given back faults its pages in again.  One stat per call; a sweep is a
 * madvise per EMPTY slot (cheap on holes).  Server thread: no EMPTY slot
 * is assigned meanwhile.
 */
static void sweep(struct es_daemon *d, uint64_t used)
{
	struct es_pool_view *v = &d->pool.v;
	uint64_t head = (uint64_t)(v->data - (uint8_t *)d->pool.shm.base);
	char path[160];
	struct stat st;

	if (snprintf(path, sizeof(path), "/dev/shm%s", d->pool.shm.name) >=
		    (int)sizeof(path) ||
	    stat(path, &st) < 0 ||
	    (uint64_t)st.st_blocks * 512 <=
		    head + (used + 2) * d->pool.geom.record_bytes)
		return;
	for (uint32_t s = 0; s < v->n_slots; s++)
		if (atomic_load(&v->slots[s].state) == ES_SLOT_EMPTY)
			release(d, s);
}

/* Cost of one demand miss (ns): the I/O queue's demand reads, io_ns per
 * op (instance-wide, expert records and Engram rows), else a record read
 * at 1 GB/s (1 byte per ns). */
static double miss_cost_ns(const struct es_daemon *d)
{
	struct st_ioq_totals t;

	if (d->ioq) {
		st_ioq_totals(d->ioq, &t);
		if (t.ops[ST_IOQ_DEMAND] > 0 && t.io_ns[ST_IOQ_DEMAND] > 0)
			return (double)t.io_ns[ST_IOQ_DEMAND] /
			       (double)t.ops[ST_IOQ_DEMAND];
	}
	return (double)d->pool.geom.record_bytes;
}

/* gain and loss (es_budget_value) from the statistics and the pool now. */
static void compute_values(struct es_daemon *d, uint64_t used)
{
	struct es_budget *b = &d->budget;
	struct es_pool_view *v = &d->pool.v;
	size_t n = (size_t)v->n_layers * v->n_experts;
	uint64_t step = st_ledger_step(b->l);
	uint64_t s = step / d->pool.geom.record_bytes;
	uint64_t n_free = used < d->pool.allowed ? d->pool.allowed - used : 0;
	double tps = es_budget_rate_tps(&b->tps);

	if (!b->rate) {
		b->rate = calloc(n, sizeof(double));
		b->resident = calloc(n, 1);
		if (!b->rate || !b->resident)
			return; /* values stay 0; retried next time */
	}
	es_budget_rates(&d->stats, tps, b->rate);
	memset(b->resident, 0, n);
	for (uint32_t i = 0; i < v->n_slots; i++) {
		uint32_t st = atomic_load(&v->slots[i].state);
		uint64_t key = atomic_load(&v->slots[i].key);

		if (st != ES_SLOT_EMPTY && st != ES_SLOT_FAILED &&
		    key != ES_KEY_NONE && es_key_layer(key) < v->n_layers &&
		    es_key_expert(key) < v->n_experts)
			b->resident[es_pool_index(v, es_key_layer(key),
						  es_key_expert(key))] = 1;
	}
	b->miss_ns = miss_cost_ns(d);
	if (es_budget_value(b->rate, b->resident, n, n_free, s ? s : 1,
			    b->miss_ns, step, &b->gain, &b->loss) < 0)
		b->gain = b->loss = 0;
}

int es_budget_open(struct es_daemon *d, uint64_t total, uint64_t floor,
		   uint64_t cap, struct st_diag *diag)
{
	struct es_budget *b = &d->budget;
	struct es_pool_view *v = &d->pool.v;
	char b1[32], b2[32], b3[32];
	int r;

	memset(b, 0, sizeof(*b));
	if (!d->opt.memory_budget_text)
		return 0;
	r = st_ledger_open(&b->l, d->opt.instance, ST_LEDGER_EXPERTS, total,
			   floor, cap, d->pool.geom.record_bytes, diag);
	if (r < 0) {
		b->l = NULL;
		return r;
	}
	b->total = total;
	b->floor = floor;
	b->cap = cap;
	b->target = UINT64_MAX; /* logged at once */
	apply_target(d);
	/* an adopted pool's discarded slots, a killed shrink's half-done
	 * ones: EMPTY slots hold no memory (no loader runs yet) */
	for (uint32_t s = 0; s < v->n_slots; s++)
		if (atomic_load(&v->slots[s].state) == ES_SLOT_EMPTY)
			release(d, s);
	st_info("memory budget %s shared with kvd: experts between %s and %s",
		st_format_bytes(total, b1, sizeof(b1)),
		st_format_bytes(floor, b2, sizeof(b2)),
		st_format_bytes(cap, b3, sizeof(b3)));
	return 0;
}

int es_budget_tick(struct es_daemon *d)
{
	struct es_budget *b = &d->budget;
	struct es_pool_view *v = &d->pool.v;
	struct st_ledger_report rep;
	struct st_ledger_move mv;
	uint64_t now = st_now_ns(), used = 0, pinned = 0, rb;

	if (!b->l)
		return INT32_MAX;
	if (now < b->next_tick_ns)
		return (int)((b->next_tick_ns - now) / 1000000) + 1;
	b->next_tick_ns = now + ES_BUDGET_TICK_MS * 1000000ull;
	(void)st_ledger_tick(b->l, now, &mv); /* it logs its moves */
	apply_target(d);
	rb = d->pool.geom.record_bytes;
	used = es_pool_slots_used(&d->pool);
	if (used > d->pool.allowed) {
		uint32_t n = shrink(d, &used);

		st_debug("memory target: %u experts evicted, %" PRIu64
			 " slots in use of %u allowed", n, used,
			 d->pool.allowed);
	}
	if (used <= d->pool.allowed)
		d->pool.went_over = 0;
	for (uint32_t s = 0; s < v->n_slots; s++)
		if (atomic_load(&v->slots[s].state) != ES_SLOT_EMPTY &&
		    es_slot_pin_sum(&v->slots[s]) != 0)
			pinned++;
	es_budget_rate_update(&b->tps, d->stats.tokens, now);
	if (now >= b->next_value_ns) {
		sweep(d, used);
		compute_values(d, used);
		b->next_value_ns = now + ES_BUDGET_VALUE_MS * 1000000ull;
	}
	memset(&rep, 0, sizeof(rep));
	rep.used = used * rb;
	rep.pinned = pinned * rb;
	/* beyond the target only because a demand load needed it; a shrink
	 * waiting for pins to go is not `over` (the arbiter cancels it) */
	rep.over = d->pool.went_over && rep.used > b->target ?
			   rep.used - b->target : 0;
	rep.gain = b->gain;
	rep.loss = b->loss;
	st_ledger_report(b->l, &rep);
	return ES_BUDGET_TICK_MS;
}

void es_budget_close(struct es_daemon *d)
{
	struct es_budget *b = &d->budget;

	st_ledger_close(b->l);
	b->l = NULL;
	free(b->rate);
	free(b->resident);
	b->rate = NULL;
	b->resident = NULL;
}
