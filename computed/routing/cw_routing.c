/*
 * cw_routing.c — wires the look-ahead, forced routing and the recorder
 * into the model (cw_routing.h).
 */
#include "cw_routing.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_log.h"

struct cw_routing {
	struct cw_model *m;          /* borrowed */
	struct cw_lookahead *la;
	struct cw_trace *trace;
	FILE *record;
};

static int force_hook(void *arg, int layer, uint32_t pos, int *experts,
		      float *weights, int k)
{
	struct cw_routing *r = arg;

	return cw_trace_force(r->trace, layer, pos, experts, weights, k);
}

static void routed_hook(void *arg, struct cw_model *m, int layer,
			uint32_t pos0, int n, const float *h,
			const int *experts, int k)
{
	struct cw_routing *r = arg;

	cw_lookahead_layer_routed(r->la, m, layer, pos0, n, h, experts, k);
}

int cw_routing_open(struct cw_model *m, struct es_client *es,
		    const struct cw_routing_opts *o, struct cw_routing **ret,
		    struct st_diag *diag)
{
	const struct st_model_config *c = cw_model_config(m);
	struct cw_route_hooks h = { 0 };
	struct cw_routing *r = calloc(1, sizeof(*r));
	int e;

	*ret = NULL;
	if (!r)
		return -ENOMEM;
	r->m = m;
	e = cw_lookahead_open(m, es, o->prefetch_depth, o->measure, &r->la);
	if (e < 0) {
		free(r);
		return st_diag_set(diag, e, "--prefetch-depth must be 0..%d",
				   CW_LOOKAHEAD_MAX_DEPTH);
	}
	if (o->trace_path) {
		e = cw_trace_load(o->trace_path, c->n_layers, c->n_experts,
				  c->top_k, &r->trace, diag);
		if (e < 0) {
			cw_routing_close(r);
			return e;
		}
		st_info("forced routing from %s (%u positions, wrapping)",
			o->trace_path, cw_trace_positions(r->trace));
		h.force = force_hook;
		if (o->oracle)
			cw_lookahead_set_oracle(r->la, cw_trace_lookup,
						r->trace);
	} else if (o->oracle) {
		cw_routing_close(r);
		return st_diag_set(diag, -EINVAL, "--lookahead-oracle needs "
				   "--route-trace (the oracle is the trace)");
	}
	if (o->record_path) {
		r->record = fopen(o->record_path, "w");
		if (!r->record) {
			e = -errno;
			cw_routing_close(r);
			return st_diag_set(diag, e, "cannot write the routing "
					   "record %s: %s", o->record_path,
					   strerror(-e));
		}
		cw_model_set_route_fn(m, cw_trace_record, r->record);
	}
	h.layer_routed = routed_hook;
	h.arg = r;
	cw_model_set_route_hooks(m, &h);
	*ret = r;
	return 0;
}

void cw_routing_close(struct cw_routing *r)
{
	if (!r)
		return;
	cw_model_set_route_hooks(r->m, NULL);
	if (r->record) {
		cw_model_set_route_fn(r->m, NULL, NULL);
		fclose(r->record);
	}
	cw_trace_free(r->trace);
	cw_lookahead_close(r->la);
	free(r);
}

void cw_routing_stats(const struct cw_routing *r, struct es_client *es,
		      struct cw_stats_wire *s)
{
	struct es_tier_stats t;

	if (r && r->record)
		fflush(r->record);
	if (r && r->la) {
		struct cw_lookahead_stats ls;

		cw_lookahead_stats(r->la, &ls);
		s->la_pred1 = ls.pred[0];
		s->la_hit1 = ls.hit[0];
		s->la_pred2 = ls.pred[1];
		s->la_hit2 = ls.hit[1];
		s->la_pred3 = ls.pred[2];
		s->la_hit3 = ls.hit[2];
	}
	if (!es)
		return;
	es_client_tier_stats(es, &t);
	s->es_load_ns = t.load_ns;
	s->es_prefetch_loads = t.prefetch_loads;
	s->es_prefetch_used = t.prefetch_used;
	s->es_prefetch_wasted = t.prefetch_wasted;
	/* look-ahead hints and step-named ones (V4 and V4.1 send the
	 * latter before each eval) */
	s->es_hints = t.hints + t.step_hints;
	s->es_hints_dropped = t.hints_dropped;
	s->es_hot_slots = t.hot_slots;
	s->es_direct_io = t.direct_io;
	s->es_io_busy_ns = t.io_busy_ns;
}
