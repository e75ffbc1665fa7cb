/*
 * cw_lookahead.h — gate look-ahead (DESIGN.md section 5, step 4): when
 * layer L has routed its tokens, apply the routers of L+1 .. L+d to the
 * current hidden state (cw_model_route_probe) and send expertd, in the same
 * ES_MSG_ROUTE as L's routing report, the experts they pick — nearest layer
 * first — so the loads run while computed works on L.
 *
 * It also measures the look-ahead: for d = 1..3 (whatever the prefetch
 * depth) the experts predicted for layer L+d and how many of them the
 * router of L+d then chose (recall = hits / choices; with one prediction
 * of k experts per actual choice of k, precision equals recall).
 */
#ifndef CW_LOOKAHEAD_H
#define CW_LOOKAHEAD_H

#include <stdint.h>

#include "cw_model.h"
#include "es_client.h"

#define CW_LOOKAHEAD_MAX_DEPTH 8
#define CW_LOOKAHEAD_MEASURE 3

struct cw_lookahead;

/* Counters: pred[d-1] experts predicted d layers ahead, hit[d-1] of them
 * chosen (d = 1..CW_LOOKAHEAD_MEASURE). */
struct cw_lookahead_stats {
	uint64_t pred[CW_LOOKAHEAD_MEASURE], hit[CW_LOOKAHEAD_MEASURE];
	uint64_t reports_failed;    /* ROUTE messages that failed */
};

/*
 * Makes a look-ahead for model m reporting to es (both borrowed), hinting
 * `depth` layers ahead (0..CW_LOOKAHEAD_MAX_DEPTH; 0 = no hints, routing
 * reports only) and measuring when `measure` is set.  *ret owned by the
 * caller.  0, -EINVAL or -ENOMEM.
 */
int cw_lookahead_open(struct cw_model *m, struct es_client *es, int depth,
		      int measure, struct cw_lookahead **ret);
void cw_lookahead_close(struct cw_lookahead *la);

/* An oracle in place of the gate probe (benchmarks with forced routing,
 * where the model's own routers cannot know the trace): fn fills
 * ret_experts[k] with the experts of (layer, pos) and returns 1, or 0 when
 * it has none (then the router is probed).  fn NULL: probe only. */
typedef int (*cw_lookahead_oracle_fn)(void *arg, int layer, uint32_t pos,
				      int *ret_experts, int k);
void cw_lookahead_set_oracle(struct cw_lookahead *la,
			     cw_lookahead_oracle_fn fn, void *arg);

/* The layer_routed hook (arg = the cw_lookahead). */
void cw_lookahead_layer_routed(void *arg, struct cw_model *m, int layer,
			       uint32_t pos0, int n, const float *h,
			       const int *experts, int k);

void cw_lookahead_stats(const struct cw_lookahead *la,
			struct cw_lookahead_stats *ret);

#endif
