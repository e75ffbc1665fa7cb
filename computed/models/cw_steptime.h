/*
 * cw_steptime.h — the phase clock of a model's decode step (issue 25's
 * step timeline): the model says which phase it enters (dense layers,
 * experts, LM head) and the clock adds the time since the last switch to
 * the phase it leaves, less what the expertd client spent meanwhile in
 * round trips and waiting for experts (es_client_timing: those are
 * columns of their own, so nothing is counted twice).
 *
 * Cheap: one clock_gettime(CLOCK_MONOTONIC) and a few relaxed atomic
 * loads per switch.  One clock per model or sequence state, switched by
 * the thread that steps it.  The client's counters are the handle's, all
 * threads together: a round trip another thread makes on the same handle
 * meanwhile (a stats request) is taken from the phase and shows as ipc.
 */
#ifndef CW_STEPTIME_H
#define CW_STEPTIME_H

#include <stdint.h>

struct es_client;

enum cw_phase {
	CW_PHASE_NONE = -1,  /* between steps: the time is not counted */
	CW_PHASE_DENSE = 0,  /* attention, mHC, norms, routers, Engram math */
	CW_PHASE_EXPERTS,    /* shared and routed experts (their kernels) */
	CW_PHASE_HEAD,       /* final norm and LM head */
	CW_PHASE_KV,         /* kvd round trips (page reservations, pins) */
	CW_PHASE_N
};

struct cw_steptime {
	const struct es_client *es; /* borrowed, may be NULL */
	int cur;                    /* enum cw_phase */
	uint64_t mark_ns;           /* when cur was entered */
	uint64_t es_mark_ns;        /* es client round trips + waits then */
	uint64_t ns[CW_PHASE_N];    /* time per phase, ns (monotonic sums) */
};

/* Zeroes *t and binds it to es (NULL: no client time is subtracted). */
void cw_steptime_init(struct cw_steptime *t, const struct es_client *es);

/*
 * Leaves the current phase (its time since it was entered, less the
 * client's round-trip and expert-wait time meanwhile, goes to ns[cur])
 * and enters `phase` (CW_PHASE_NONE: stop counting).  t may be NULL (a
 * no-op), so models call it unconditionally.
 */
void cw_steptime_phase(struct cw_steptime *t, int phase);

#endif
