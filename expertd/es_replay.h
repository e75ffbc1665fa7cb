/*
 * es_replay.h — offline replay of a routing trace (es_replay_trace.h)
 * through expert-residency policies, without running the model.
 *
 * Model of the pool (docs/REPLAY.md): N slots of one expert each, either
 * one global pool over all layers or N split evenly over the layers (layer
 * i gets N / L slots, the first N % L layers one more).  Steps are replayed
 * in trace order; a step needs its top-k experts resident at once, so they
 * are pinned for the whole step and never chosen as victims (PITFALLS P12:
 * a pinned slot is never evicted).  An access to a resident expert is a hit;
 * otherwise a miss loads it (one expert's bytes moved), evicting the
 * policy's victim when the pool is full.
 *
 * Look-ahead policies ("la-*", flagged online with look-ahead d) may also see
 * the experts the same token will choose at its next d layers — what
 * computed's gate look-ahead sends expertd.  They use that view in two ways:
 * an expert visible in the window is evicted only when nothing else can be,
 * and (unless prefetch is off) the window's experts are loaded at the end of
 * the step that saw them.  A prefetched expert not yet used counts as
 * loading: another prefetch never evicts it (that prefetch is dropped, as
 * a runtime drops a hint it has no room for); a demand miss evicts it only
 * when nothing else can go, and it is then counted as wasted.  A prefetch load is counted when it happens: it is
 * a load (bytes moved) like a miss, and the later access is then a hit, so
 * loads = demand misses + prefetch loads, never a free hit.
 *
 * Belady / MIN (offline, sees the whole future): evicts the expert whose next
 * use is farthest (never used again first).  With the pin rule above it is
 * optimal in loads among all policies, prefetching or not; tests check it
 * against an exhaustive search.
 */
#ifndef ES_REPLAY_H
#define ES_REPLAY_H

#include <stdint.h>

#include "es_replay_trace.h"
#include "st_error.h"

enum es_replay_policy {
	ES_RP_LRU = 0, /* least recently used */
	ES_RP_LRU2,    /* LRU-2: evicts the oldest second-last use */
	ES_RP_LFU,     /* most uses so far (ties: least recent) */
	ES_RP_LFUD,    /* uses with exponential decay, half-life 128 tokens */
	ES_RP_LRFU,    /* uses with decay, half-life 4 tokens (LRFU) */
	ES_RP_HIST,    /* learned online: P(use within 4 tokens | history) */
	ES_RP_2Q,      /* 2Q: FIFO for new experts, LRU for re-used ones */
	ES_RP_BELADY,  /* offline MIN */
	ES_RP_FUTURE,  /* not online: sees the next window_tokens tokens,
			* hist beyond them (how much foresight it takes) */
	ES_RP_N_BASE
};

/* Options of one replay run. */
struct es_replay_opts {
	uint32_t n_slots;       /* pool size in experts (all pools together) */
	int per_layer;          /* 1: split evenly over the layers */
	int lookahead;          /* d >= 1: "la-" variant sees d next layers;
				 * 0: plain online policy */
	int prefetch;           /* look-ahead variant: 1 loads the window's
				 * experts ahead (counted as loads) */
	int window_tokens;      /* future: tokens it sees ahead (0: only the
				 * current token's remaining layers) */
};

/* What one run measured.  loads = misses + prefetch_loads; every field
 * counts experts (not bytes). */
struct es_replay_stats {
	uint64_t accesses;       /* expert accesses (sum of top-k over steps) */
	uint64_t hits;           /* resident when accessed (prefetched incl.) */
	uint64_t misses;         /* demand misses: the step waits for them */
	uint64_t prefetch_loads; /* loaded ahead from the look-ahead window */
	uint64_t prefetch_used;  /* of those, accessed before eviction */
	uint64_t prefetch_wasted; /* of those, evicted before any use */
	uint64_t evictions;
	uint32_t max_resident;   /* most experts resident in any one pool */
	uint32_t min_capacity;   /* smallest pool */
	int over_capacity;       /* a pool ever held more than its slots */
	int pinned_evicted;      /* a pinned expert was ever evicted */
};

/* Name of a base policy ("lru", "belady", ...); NULL when out of range. */
const char *es_replay_policy_name(enum es_replay_policy p);

/* Base policy named `name` (without "la-"), or -ST_E_NOTFOUND. */
int es_replay_policy_parse(const char *name);

/*
 * Replays trace t through policy p with options o; fills *ret.
 * Belady ignores o->lookahead.  Errors: -ST_E_BUDGET when a pool has fewer
 * slots than the trace's top-k (message says the smallest budget that
 * works), -EINVAL (no slots, no steps), -ENOMEM.
 */
int es_replay_run(const struct es_trace *t, enum es_replay_policy p,
		  const struct es_replay_opts *o, struct es_replay_stats *ret,
		  struct st_diag *diag);

#endif
