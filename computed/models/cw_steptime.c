/*
 * cw_steptime.c — the phase clock of a decode step (cw_steptime.h).
 */
#include <string.h>

#include "cw_steptime.h"
#include "es_client.h"
#include "st_util.h"

/* Client time that belongs to columns of its own: every round trip and
 * every wait for an expert (the ACQUIRE round trips are in both sums). */
static uint64_t es_time(const struct es_client *es)
{
	struct es_client_timing tm;

	if (!es)
		return 0;
	es_client_timing(es, &tm);
	return tm.rpc_ns - tm.acquire_rpc_ns + tm.wait_demand_ns +
	       tm.wait_inflight_ns;
}

void cw_steptime_init(struct cw_steptime *t, const struct es_client *es)
{
	memset(t, 0, sizeof(*t));
	t->es = es;
	t->cur = CW_PHASE_NONE;
}

void cw_steptime_phase(struct cw_steptime *t, int phase)
{
	uint64_t now, es_now;

	if (!t || phase == t->cur)
		return;
	now = st_now_ns();
	es_now = es_time(t->es);
	if (t->cur >= 0 && t->cur < CW_PHASE_N) {
		uint64_t d = now - t->mark_ns, e = es_now - t->es_mark_ns;

		t->ns[t->cur] += d > e ? d - e : 0;
	}
	t->cur = phase >= 0 && phase < CW_PHASE_N ? phase : CW_PHASE_NONE;
	t->mark_ns = now;
	t->es_mark_ns = es_now;
}
