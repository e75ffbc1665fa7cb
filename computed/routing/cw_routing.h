/*
 * cw_routing.h — computed's routing extras, set up from its command line:
 * routing reports and gate look-ahead prefetch hints to expertd
 * (cw_lookahead.h), forced routing from a trace and the routing recorder
 * (cw_trace.h), and their figures for the STATS reply.
 */
#ifndef CW_ROUTING_H
#define CW_ROUTING_H

#include "cw_lookahead.h"
#include "cw_model.h"
#include "cw_proto.h"
#include "cw_trace.h"
#include "es_client.h"

struct cw_routing_opts {
	int prefetch_depth;        /* --prefetch-depth (default 2, 0 = off) */
	int measure;               /* --lookahead-measure */
	const char *trace_path;    /* --route-trace FILE */
	const char *record_path;   /* --route-record FILE */
	int oracle;                /* --lookahead-oracle: hints from the trace */
};

#define CW_DEFAULT_PREFETCH_DEPTH 2

struct cw_routing;

/* Applies opts to model m (hooks set), reporting to es.  *ret owned by the
 * caller (cw_routing_close, which clears the hooks).  0 or negative with
 * diag (trace unreadable, record file not writable). */
int cw_routing_open(struct cw_model *m, struct es_client *es,
		    const struct cw_routing_opts *opts,
		    struct cw_routing **ret, struct st_diag *diag);
void cw_routing_close(struct cw_routing *r);

/* Fills the look-ahead and expertd tier fields of a STATS reply. */
void cw_routing_stats(const struct cw_routing *r, struct es_client *es,
		      struct cw_stats_wire *s);

#endif
