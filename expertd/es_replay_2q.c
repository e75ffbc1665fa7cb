/*
 * es_replay_2q.c — "2q", the full 2Q policy (Johnson and Shasha, VLDB 1994)
 * per pool: a new expert enters A1in (FIFO, a quarter of the pool); an
 * expert loaded again while its id is still in A1out (the ghost list of the
 * last half-pool of ids evicted from A1in) enters Am (LRU).  The victim is
 * the oldest A1in entry while A1in holds more than its quarter, else Am's
 * least recently used (falling back to the other list when one has no
 * evictable entry).  Hits in A1in do not move the entry (correlated
 * references).  The ghost list is a counter window: an id is in A1out while
 * fewer than half a pool of evictions from A1in followed its own.
 */
#include <stdlib.h>

#include "es_replay_int.h"

int es_r2q_init(struct es_rsim *m, uint32_t n_pools, const uint32_t *cap)
{
	m->q_in_a1 = calloc(m->n_keys, 1);
	m->q_ghost = calloc(m->n_keys, sizeof(*m->q_ghost));
	m->q_ins = calloc(m->n_keys, sizeof(*m->q_ins));
	m->q_a1 = calloc(n_pools, sizeof(*m->q_a1));
	m->q_pushes = calloc(n_pools, sizeof(*m->q_pushes));
	m->q_cap = cap;
	if (!m->q_in_a1 || !m->q_ghost || !m->q_ins || !m->q_a1 ||
	    !m->q_pushes)
		return -1;
	return 0;
}

void es_r2q_fini(struct es_rsim *m)
{
	free(m->q_in_a1);
	free(m->q_ghost);
	free(m->q_ins);
	free(m->q_a1);
	free(m->q_pushes);
}

static uint32_t kout(const struct es_rsim *m, uint32_t pool)
{
	return m->q_cap[pool] / 2 ? m->q_cap[pool] / 2 : 1;
}

void es_r2q_insert(struct es_rsim *m, uint32_t key, uint32_t pool)
{
	uint64_t g = m->q_ghost[key];

	m->q_ins[key] = (double)m->clock;
	if (g && m->q_pushes[pool] - g < kout(m, pool)) {
		m->q_in_a1[key] = 0; /* seen recently: Am */
		m->q_ghost[key] = 0;
	} else {
		m->q_in_a1[key] = 1;
		m->q_a1[pool]++;
	}
}

void es_r2q_evict(struct es_rsim *m, uint32_t key, uint32_t pool)
{
	if (!m->q_in_a1[key])
		return;
	m->q_in_a1[key] = 0;
	m->q_a1[pool]--;
	m->q_ghost[key] = ++m->q_pushes[pool];
}

double es_r2q_score(const struct es_rsim *m, uint32_t key, uint32_t pool)
{
	uint32_t kin = m->q_cap[pool] / 4 ? m->q_cap[pool] / 4 : 1;
	int prefer_a1 = m->q_a1[pool] > kin;
	double t = m->q_in_a1[key] ? m->q_ins[key] : m->k[key].last;

	/* the preferred list's entries first, oldest first */
	return (m->q_in_a1[key] == prefer_a1 ? 0.0 : 1e18) + t;
}
