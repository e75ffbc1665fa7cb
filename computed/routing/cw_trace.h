/*
 * cw_trace.h — routing traces in computed: forced routing (take each
 * layer's expert choice from a trace while computing everything else, for
 * benchmarks that need a real model's routing on a generated model) and
 * the recorder (write computed's own routing as a trace).
 *
 * Trace format (JSONL), one line per token per layer:
 *   {"pos": P, "layer": L, "experts": [e0, ...], "weights": [w0, ...]}
 * pos is the position in the sequence, experts by descending weight.
 * "weights" is optional when reading (then 1/k each); other keys are
 * ignored (the kjv-moe fixture's "id" and "gap").
 */
#ifndef CW_TRACE_H
#define CW_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "st_error.h"

struct cw_trace;

/*
 * Reads a trace for a model of n_layers layers, n_experts experts and
 * top-k k.  Every line must have k experts in range and a layer below
 * n_layers; positions need not start at 0 or be dense (missing (pos,
 * layer) entries are routed by the model's own router).  Positions past the
 * trace's last wrap around (pos mod (last + 1)), so a short trace drives a
 * long generation.  *ret owned by the caller.  Errors: -errno,
 * -ST_E_FORMAT naming the line.
 */
int cw_trace_load(const char *path, int n_layers, int n_experts, int k,
		  struct cw_trace **ret, struct st_diag *diag);
void cw_trace_free(struct cw_trace *t);

/* Number of positions the trace covers (last pos + 1). */
uint32_t cw_trace_positions(const struct cw_trace *t);

/* The cw_route_hooks.force hook (arg = the trace): replaces experts and
 * weights with the trace's at (pos, layer); returns 1 if it did. */
int cw_trace_force(void *arg, int layer, uint32_t pos, int *experts,
		   float *weights, int k);

/* The trace's experts of (layer, pos) into ret_experts[k] (a look-ahead
 * oracle, cw_lookahead_oracle_fn); 1, or 0 when it has none. */
int cw_trace_lookup(void *arg, int layer, uint32_t pos, int *ret_experts,
		    int k);

/* The recorder: the cw_route_fn observer (arg = a FILE * opened for
 * writing) that appends one line per call. */
void cw_trace_record(void *arg, int layer, uint32_t pos, const int *experts,
		     const float *weights, int k);

#endif
