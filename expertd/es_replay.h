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
 * Draft foresight (opts.draft_len > 0, any online base policy but la-*):
 * speculative decoding's drafts model what a runtime could know of the next
 * tokens (es_replay_draft.c).  At a draft, LEN tokens are proposed and an
 * accepted prefix of A of them is drawn (each accepted with probability
 * ACCEPT given all before it were; a fixed-seed hash, so every policy sees
 * the same draws).  The policy then knows the true routing of the accepted
 * positions and, for each rejected one, the routing of a different token of
 * the trace (what a wrong draft would show); the current token's later
 * layers are known when an earlier draft showed the token as accepted.
 * Known experts are evicted only
 * when nothing else can be, the one believed used farthest ahead first
 * (Belady within the known window, the base policy beyond it, as future-N);
 * with draft_prefetch the next token's believed experts at the current layer
 * are loaded at the end of the step (counted as loads, like la-*).
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
	ES_RP_LSTALE,  /* Least-Stale (SpecMD): farthest predicted next use,
			* last use + mean reuse interval (es_replay_policy.c) */
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
	int draft_len;          /* draft foresight: tokens per draft (0: off;
				 * at most ES_REPLAY_MAX_DRAFT) */
	double draft_accept;    /* P(a draft token is accepted | all before
				 * it were), in [0, 1] */
	int draft_per_step;     /* 0: a new draft at every token (sliding);
				 * 1: one draft per verify step, the next at
				 * the token after the accepted prefix */
	int draft_no_wrong;     /* 1: rejected positions reveal nothing (no
				 * wrong guesses); 0: a random other token's
				 * routing (the default) */
	int draft_prefetch;     /* 1: load the next token's believed experts
				 * at the current layer ahead */
	uint64_t draft_seed;    /* seed of the acceptance and wrong-token draws
				 * (0: ES_REPLAY_DRAFT_SEED) */
};

/* Longest draft the replay models, and the seed of its draws when
 * opts.draft_seed is 0. */
#define ES_REPLAY_MAX_DRAFT 16
#define ES_REPLAY_DRAFT_SEED 0x22d2af7ull

/* Default acceptance of one draft token: DeepSeek-V3 Technical Report
 * (arXiv 2412.19437, section 5.4.3, "Multi-Token Prediction Evaluation"):
 * the acceptance rate of the second-token prediction (one MTP draft token)
 * ranges between 85 % and 90 %; the lower end is taken. */
#define ES_REPLAY_DRAFT_ACCEPT_DEFAULT 0.85

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
	uint64_t draft_events;   /* drafts proposed (draft foresight) */
	uint64_t draft_accepted; /* of their tokens, accepted (sum of A) */
};

/* Name of a base policy ("lru", "belady", ...); NULL when out of range. */
const char *es_replay_policy_name(enum es_replay_policy p);

/* Base policy named `name` (without "la-"), or -ST_E_NOTFOUND. */
int es_replay_policy_parse(const char *name);

/*
 * Replays trace t through policy p with options o; fills *ret.
 * Belady ignores o->lookahead.  Errors: -ST_E_BUDGET when a pool has fewer
 * slots than the trace's top-k (message says the smallest budget that
 * works), -EINVAL (no slots, no steps; draft foresight with Belady,
 * future-N or look-ahead, out of range, or on a batched trace), -ENOMEM.
 */
int es_replay_run(const struct es_trace *t, enum es_replay_policy p,
		  const struct es_replay_opts *o, struct es_replay_stats *ret,
		  struct st_diag *diag);

#endif
