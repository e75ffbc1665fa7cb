/*
 * kv_budget_ledger.c — kvd's side of the shared memory budget
 * (--memory-budget; st_ledger.h, DESIGN.md "One memory budget"): joins the
 * instance's ledger as ST_LEDGER_KV once the pool exists (its page size is
 * the ledger's unit), and each loop turn (every KV_LEDGER_TICK_NS) runs
 * the arbiter when due, obeys the target (kv_budget.c: allowed pages,
 * shrink, memory given back) and reports used, pinned, over, gain and
 * loss.  Without --memory-budget nothing here does anything.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "kv_devpool.h"
#include "st_ledger.h"
#include "st_log.h"
#include "st_util.h"

#define KV_LEDGER_TICK_NS (20ull * 1000 * 1000)
#define KV_LEDGER_WARN_NS (5ull * 1000 * 1000 * 1000)

uint64_t kv_ledger_pool_budget(const struct kv_config *cfg)
{
	return cfg->memory_budget_bytes ? cfg->memory_budget_bytes :
					  cfg->budget_bytes;
}

/* The floor: --budget when given, else one sequence of
 * --max-rows-per-seq rows in every stream (kv_layout_seq_bytes: not
 * clamped to the pool made for M, so that the least --memory-budget named
 * does not depend on the M asked for); whole pages. */
static uint64_t kv_floor(const struct kv_server *s)
{
	const struct kv_layout *l = &s->pool.lay;

	if (!s->cfg.budget_given)
		return kv_layout_seq_bytes(l);
	return ST_ALIGN_UP(s->cfg.budget_bytes, l->page_bytes);
}

int kv_ledger_join(struct kv_server *s, struct st_diag *diag)
{
	const struct kv_layout *l = &s->pool.lay;
	uint64_t m = s->cfg.memory_budget_bytes, cap, floor, target;
	char b1[32], b2[32], b3[32], b4[32];
	int r;

	if (!m || s->ledger)
		return 0;
	cap = ST_MIN(l->n_pages * l->page_bytes, m);
	floor = kv_floor(s);
	/* a floor above M: st_ledger_open names the least M (both floors) */
	if (floor > cap && floor <= m)
		return st_diag_set(diag, -ST_E_CONFIG,
				   "kvd --budget %s (the KV floor under "
				   "--memory-budget) is more than the %s of "
				   "pages the pool can hold (--memory-budget "
				   "%s): lower --budget or raise "
				   "--memory-budget",
				   st_format_bytes(floor, b1, sizeof(b1)),
				   st_format_bytes(cap, b2, sizeof(b2)),
				   st_format_bytes(m, b3, sizeof(b3)));
	r = st_ledger_open(&s->ledger, s->cfg.instance, ST_LEDGER_KV, m,
			   floor, cap, l->page_bytes, diag);
	if (r < 0)
		return r;
	target = st_ledger_target(s->ledger);
	kv_pool_set_allowed(&s->pool, target / l->page_bytes, 0);
	memset(&s->ledger_rates, 0, sizeof(s->ledger_rates));
	s->ledger_ns = 0;
	st_info("memory budget %s shared with expertd: kv pages of %llu "
		"bytes, floor %s, cap %s, target %s",
		st_format_bytes(m, b1, sizeof(b1)),
		(unsigned long long)l->page_bytes,
		st_format_bytes(floor, b2, sizeof(b2)),
		st_format_bytes(cap, b3, sizeof(b3)),
		st_format_bytes(target, b4, sizeof(b4)));
	return 0;
}

void kv_ledger_leave(struct kv_server *s)
{
	st_ledger_close(s->ledger);
	s->ledger = NULL;
}

/* Handles of the sequences the next steps will pin: the restore-ahead
 * queue's and the prefetch list's.  malloc'ed (NULL when none). */
static uint32_t *queued_seqs(const struct kv_server *s, uint32_t *ret_n)
{
	uint32_t *q, n = 0;

	*ret_n = 0;
	if (!s->n_ahead && !s->n_prefetch)
		return NULL;
	q = malloc(sizeof(uint32_t) * (s->n_ahead + s->n_prefetch));
	if (!q)
		return NULL;
	for (uint32_t i = 0; i < s->n_ahead; i++)
		q[n++] = s->ahead[i].seq;
	for (uint32_t i = 0; i < s->n_prefetch; i++)
		q[n++] = s->prefetch[i];
	*ret_n = n;
	return q;
}

void kv_ledger_tick(struct kv_server *s, uint64_t now)
{
	struct kv_pool *p = &s->pool;
	const uint64_t pb = p->lay.page_bytes;
	struct st_ledger_report rep;
	struct kv_budget_gauges g;
	struct kv_budget_obs o;
	struct st_diag d = { "" };
	uint64_t target, step, released, wait, grow;
	uint32_t *q, nq, n_wait;

	if (!s->ledger || !s->have_pool ||
	    now - s->ledger_ns < KV_LEDGER_TICK_NS)
		return;
	s->ledger_ns = now;
	st_ledger_tick(s->ledger, now, NULL); /* the ledger logs moves */
	target = st_ledger_target(s->ledger);
	q = queued_seqs(s, &nq);
	kv_budget_gauges(p, now, KV_BUDGET_RECENT_NS, q, nq, &g);
	kv_pool_set_allowed(p, target / pb, g.pinned);
	if (g.held > p->allowed_pages + p->over_pages) {
		/* device-written rows reach their pages before a spill;
		 * no client waits on these spills */
		kv_devpool_quiesce(s);
		p->spill.background = 1;
		if (kv_pool_shrink(p, &d) < 0 &&
		    now - s->ledger_warn_ns >= KV_LEDGER_WARN_NS) {
			st_warn("memory target %llu bytes not reached yet: %s",
				(unsigned long long)target, d.msg);
			s->ledger_warn_ns = now;
		}
		p->spill.background = 0;
		kv_budget_gauges(p, now, KV_BUDGET_RECENT_NS, q, nq, &g);
	}
	free(q);
	released = kv_pool_release_free(p);
	if (released)
		st_debug("memory target %llu bytes: %llu bytes of free pages "
			 "given back", (unsigned long long)target,
			 (unsigned long long)released);
	step = st_ledger_step(s->ledger);
	memset(&o, 0, sizeof(o));
	o.now_ns = now;
	o.restore_ns = p->stats.restore_ns_total;
	o.restore_bytes = p->stats.restore_bytes_total;
	o.spill_ns = p->stats.spill_ns_total;
	o.spill_bytes = p->stats.spill_bytes_total;
	o.steps = p->reserves;
	o.spilled_bytes = g.spilled * pb;
	/* pages running requests of clients without spilling will still
	 * take (KV_MSG_DEMAND) are working set too: they cannot wait */
	wait = kv_clients_demand(&s->clients, now, &n_wait, &grow);
	o.working_bytes = (g.working + grow) * pb;
	o.target = target;
	o.can_spill = p->spill.fd >= 0;
	kv_budget_rates_update(&s->ledger_rates, &o);
	rep.used = g.held * pb;
	rep.pinned = g.pinned * pb;
	rep.over = p->over_pages * pb; /* as kv_pool_set_allowed left it */
	/* restores of spilled pages saved, and requests waiting in
	 * clients' queues for pages (spilling off: they wait, not fail) */
	rep.gain = kv_budget_gain(&s->ledger_rates, &o, step) +
		   kv_budget_wait_gain(wait * pb, n_wait, step);
	rep.loss = kv_budget_loss(&s->ledger_rates, &o, step);
	st_ledger_report(s->ledger, &rep);
}
