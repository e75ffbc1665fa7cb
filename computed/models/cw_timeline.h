/*
 * cw_timeline.h — the step timeline of issue 25: per decoded token, where
 * the wall time went and what the tiers cost meanwhile, as one TSV row.
 *
 * A row is the difference of two snapshots taken around one step (before
 * and after the model's eval of the token):
 *   time columns (ms), which add up to wall:
 *     dense        the model's dense phase (cw_steptime: attention, mHC,
 *                  norms, routers, Engram math)
 *     experts      the experts' phase less the waits and round trips
 *     head         final norm and LM head
 *     stall_demand waiting for experts that had no slot when asked
 *     stall_inflight waiting for experts whose load was in flight (a
 *                  prefetch not ready yet)
 *     ipc          expertd round trips outside the waits (routing reports,
 *                  hints, Engram fetches)
 *     kv           kvd round trips the model marks (CW_PHASE_KV)
 *     other        wall less all of the above (embedding, kvd, the
 *                  caller's own work): should be small
 *   counters of the step (not time columns):
 *     minflt, majflt            this process's page faults (/proc)
 *     es_minflt, es_majflt      expertd's page faults (/proc/PID/stat)
 *     es_cpu_ms                 expertd's CPU time (all its threads)
 *     loader_cpu_ms             of which its loader threads in loads
 *     checksum_ms               loader wall time verifying records (XXH3)
 *     loader_minflt             faults the loader threads took in loads
 *     loads, load_mb            expert records read, MB
 *     rpcs                      expertd round trips (all kinds)
 */
#ifndef CW_TIMELINE_H
#define CW_TIMELINE_H

#include <stdint.h>
#include <stdio.h>

#include "cw_steptime.h"
#include "es_client.h"
#include "st_procstat.h"

struct cw_tl_snap {
	uint64_t t_ns;                 /* CLOCK_MONOTONIC */
	uint64_t phase_ns[CW_PHASE_N]; /* the step clock's sums */
	struct es_client_timing ct;    /* zero without a client */
	struct es_tier_stats ts;       /* zero without a client */
	struct st_procstat self, es;   /* es: zero without a client */
};

struct cw_tl_row {
	double wall_ms, dense_ms, experts_ms, head_ms;
	double stall_demand_ms, stall_inflight_ms, ipc_ms, kv_ms, other_ms;
	uint64_t minflt, majflt, es_minflt, es_majflt;
	double es_cpu_ms, loader_cpu_ms, checksum_ms;
	uint64_t loader_minflt, loads;
	double load_mb;
	uint64_t rpcs;
};

/*
 * Takes a snapshot: now, tl's phase sums (tl may be NULL: zeros), es's
 * timing and tier counters and expertd's /proc counters (es may be NULL),
 * this process's /proc counters.  Never fails: a counter that cannot be
 * read is zero (so its column reads 0).
 */
void cw_tl_snap_take(struct cw_tl_snap *ret, const struct cw_steptime *tl,
		     struct es_client *es);

/* The row of the step between snapshots a and b (b taken later). */
void cw_tl_row_make(const struct cw_tl_snap *a, const struct cw_tl_snap *b,
		    struct cw_tl_row *ret);

/* The sum of a row's time columns but wall (the others add up to it). */
double cw_tl_row_sum_ms(const struct cw_tl_row *r);

/*
 * Writes the TSV header line (column names, see above; the first three
 * columns are the caller's labels: run, pass, token) or one row.  0 or
 * -EIO.
 */
int cw_tl_write_header(FILE *f);
int cw_tl_write_row(FILE *f, const char *run, const char *pass, int token,
		    const struct cw_tl_row *r);

#endif
