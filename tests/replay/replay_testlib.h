/* replay_testlib.h — helpers of the replay tests: build a trace by hand
 * from a compact description, and replay it with the invariants every run
 * must keep checked. */
#ifndef REPLAY_TESTLIB_H
#define REPLAY_TESTLIB_H

#include "es_replay.h"

/* Builds a batch-1 trace of n_tokens tokens x n_layers layers with k ids
 * per step from ids[] (token-major, then layer, then the k ids), with
 * n_experts experts; aborts the test on failure. */
void rt_build(struct es_trace *t, int n_tokens, int n_layers, int n_experts,
	      int k, const uint16_t *ids);

/* Replays t through policy p with options o and returns the counts,
 * failing the (cmocka) test when the run fails or breaks an invariant:
 * hits + misses = accesses, never more resident than slots, never a
 * pinned expert evicted. */
struct es_replay_stats rt_run(const struct es_trace *t,
			      enum es_replay_policy p,
			      const struct es_replay_opts *o);

#endif
