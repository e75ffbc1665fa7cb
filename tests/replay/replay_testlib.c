/* replay_testlib.c — see replay_testlib.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay_testlib.h"

void rt_build(struct es_trace *t, int n_tokens, int n_layers, int n_experts,
	      int k, const uint16_t *ids)
{
	memset(t, 0, sizeof(*t));
	for (int tok = 0; tok < n_tokens; tok++)
		for (int l = 0; l < n_layers; l++)
			if (es_trace_push(t, (uint32_t)tok, l,
					  ids + ((size_t)tok * n_layers + l) * k,
					  k) < 0) {
				fprintf(stderr, "rt_build: push failed\n");
				abort();
			}
	t->n_layers = n_layers;
	for (int l = 0; l < n_layers; l++)
		t->layer_ids[l] = l;
	t->n_experts = n_experts;
	es_trace_seal(t);
}

struct es_replay_stats rt_run(const struct es_trace *t,
			      enum es_replay_policy p,
			      const struct es_replay_opts *o)
{
	struct es_replay_stats st;

	assert_int_equal(es_replay_run(t, p, o, &st, NULL), 0);
	assert_int_equal(st.hits + st.misses, st.accesses);
	assert_false(st.over_capacity);
	assert_false(st.pinned_evicted);
	return st;
}
