/*
 * st_ledger_arb.c — the arbiter's decision of the shared memory budget
 * (st_ledger.h): a pure function of a view, and its settings.
 */
#include "st_ledger.h"

#include "st_log.h"

static const char *const k_side[ST_LEDGER_SIDES] = { "experts", "kv" };

const char *st_ledger_side_name(int side)
{
	return side >= 0 && side < ST_LEDGER_SIDES ? k_side[side] : NULL;
}

/* A millisecond setting from the environment into *ns (st_env_u64: a
 * bad value is a warning and the default stays). */
static void env_ms(const char *name, uint64_t *ns)
{
	uint64_t ms = *ns / 1000000ull;

	if (st_env_u64(name, 1, 3600000ull, &ms))
		*ns = ms * 1000000ull;
}

void st_ledger_params_default(struct st_ledger_params *p)
{
	p->dwell_ns = ST_LEDGER_DWELL_NS;
	p->timeout_ns = ST_LEDGER_MOVE_TIMEOUT_NS;
	p->stale_ns = ST_LEDGER_STALE_NS;
	p->flip_ns = 0;
	p->hysteresis = ST_LEDGER_HYSTERESIS;
	p->min_gain = ST_LEDGER_MIN_GAIN;
	env_ms("STRATA_LEDGER_DWELL_MS", &p->dwell_ns);
	env_ms("STRATA_LEDGER_FLIP_MS", &p->flip_ns);
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Bytes side `from` can give `to` now, at most `want`: the donor stays at
 * or above its floor, the receiver at or below its cap; 0 when that is
 * less than one unit of either side. */
static uint64_t room(const struct st_ledger_view *v, int from, int to,
		     uint64_t want)
{
	uint64_t give, take, unit;

	give = v->side[from].target > v->side[from].floor ?
		       v->side[from].target - v->side[from].floor : 0;
	take = v->side[to].cap > v->side[to].target ?
		       v->side[to].cap - v->side[to].target : 0;
	want = min_u64(want, min_u64(give, take));
	unit = v->side[from].unit > v->side[to].unit ? v->side[from].unit :
						       v->side[to].unit;
	return want >= (unit ? unit : 1) ? want : 0;
}

static void start(struct st_ledger_action *a, int from, uint32_t why,
		  uint64_t bytes, double gain, double loss)
{
	a->act = ST_LEDGER_ACT_START;
	a->from = (uint32_t)from;
	a->to = (uint32_t)!from;
	a->why = why;
	a->bytes = bytes;
	a->gain = gain;
	a->loss = loss;
}

void st_ledger_decide(const struct st_ledger_view *v,
		      const struct st_ledger_params *p, uint64_t now_ns,
		      struct st_ledger_action *a)
{
	uint64_t sum = v->side[0].target + v->side[1].target;
	/* a step below a unit of either side could never move anything */
	uint64_t step = v->step;

	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		if (step < v->side[s].unit)
			step = v->side[s].unit;
	if (!step)
		step = 1;

	*a = (struct st_ledger_action){ .act = ST_LEDGER_ACT_NONE };
	/* 1. a move under way: complete it once the donor shrank */
	if (v->pending) {
		int from = (int)v->pend_from & 1;

		a->from = (uint32_t)from;
		a->to = (uint32_t)!from;
		a->bytes = v->pending;
		if (v->side[from].used <= v->side[from].target)
			a->act = ST_LEDGER_ACT_COMPLETE;
		else if (now_ns > v->pend_ns + p->timeout_ns)
			a->act = ST_LEDGER_ACT_CANCEL;
		return;
	}
	/* 2. bytes no side holds (once both sides joined): to the live side
	 * that values them most */
	if (sum < v->total && v->side[0].cap && v->side[1].cap) {
		int best = -1;

		for (int s = 0; s < ST_LEDGER_SIDES; s++) {
			if (!v->side[s].live ||
			    v->side[s].target >= v->side[s].cap)
				continue;
			if (best < 0 || v->side[s].gain > v->side[best].gain)
				best = s;
		}
		if (best >= 0) {
			a->act = ST_LEDGER_ACT_GRANT;
			a->to = (uint32_t)best;
			a->from = (uint32_t)!best;
			a->why = ST_LEDGER_WHY_UNASSIGNED;
			a->bytes = min_u64(v->total - sum,
					   v->side[best].cap -
						   v->side[best].target);
			a->gain = v->side[best].gain;
			return;
		}
	}
	/* 3. a side over its target (a step would have failed): at once */
	for (int to = 0; to < ST_LEDGER_SIDES; to++) {
		uint64_t want, b;

		if (!v->side[to].over || !v->side[to].live)
			continue;
		want = (v->side[to].over + step - 1) / step * step;
		b = room(v, !to, to, want);
		if (b) {
			start(a, !to, ST_LEDGER_WHY_OVER, b, v->side[to].gain,
			      v->side[!to].loss);
			return;
		}
	}
	/* 4. test oscillation: back and forth every flip_ns */
	if (p->flip_ns) {
		int from = (int)(v->n_moves & 1);
		uint64_t b;

		if (now_ns < v->last_move_ns + p->flip_ns)
			return;
		b = room(v, from, !from, step);
		if (!b) {
			from = !from;
			b = room(v, from, !from, step);
		}
		if (b)
			start(a, from, ST_LEDGER_WHY_FLIP, b, 0, 0);
		return;
	}
	/* 5. by value, after the dwell */
	if (now_ns < v->last_move_ns + p->dwell_ns)
		return;
	for (int s = 0; s < ST_LEDGER_SIDES; s++)
		if (!v->side[s].live ||
		    v->side[s].value_ns + p->stale_ns < now_ns)
			return;
	{
		double best = 0;
		int best_from = -1;
		uint64_t best_b = 0;

		for (int from = 0; from < ST_LEDGER_SIDES; from++) {
			double gain = v->side[!from].gain;
			double loss = v->side[from].loss;
			double bar = loss * (1.0 + p->hysteresis) + p->min_gain;
			uint64_t b, k;

			if (!(gain > bar))
				continue;
			/* a gain far above the bar moves up to
			 * ST_LEDGER_MAX_STEPS steps at once: k = gain / bar */
			k = gain >= bar * ST_LEDGER_MAX_STEPS ?
				    ST_LEDGER_MAX_STEPS :
				    (uint64_t)(gain / bar);
			b = room(v, from, !from, step * (k ? k : 1));
			if (b && gain - loss > best) {
				best = gain - loss;
				best_from = from;
				best_b = b;
			}
		}
		if (best_from >= 0)
			start(a, best_from, ST_LEDGER_WHY_VALUE, best_b,
			      v->side[!best_from].gain,
			      v->side[best_from].loss);
	}
}
