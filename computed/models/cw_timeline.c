/*
 * cw_timeline.c — snapshots, rows and TSV of the step timeline
 * (cw_timeline.h).
 */
#include <errno.h>
#include <string.h>

#include "cw_timeline.h"
#include "st_util.h"

void cw_tl_snap_take(struct cw_tl_snap *ret, const struct cw_steptime *tl,
		     struct es_client *es)
{
	memset(ret, 0, sizeof(*ret));
	ret->t_ns = st_now_ns();
	if (tl)
		memcpy(ret->phase_ns, tl->ns, sizeof(ret->phase_ns));
	if (es) {
		int32_t pid = es_client_owner_pid(es);

		es_client_timing(es, &ret->ct);
		es_client_tier_stats(es, &ret->ts);
		/* unreadable (expertd gone): zeros, its columns read 0 */
		if (pid > 0)
			(void)st_procstat_read(pid, &ret->es);
	}
	(void)st_procstat_read(0, &ret->self);
}

/* b - a in ms, 0 when a counter went backwards (a restarted expertd). */
static double d_ms(uint64_t a, uint64_t b)
{
	return b > a ? (double)(b - a) / 1e6 : 0.0;
}

static uint64_t d_n(uint64_t a, uint64_t b)
{
	return b > a ? b - a : 0;
}

void cw_tl_row_make(const struct cw_tl_snap *a, const struct cw_tl_snap *b,
		    struct cw_tl_row *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->wall_ms = d_ms(a->t_ns, b->t_ns);
	ret->dense_ms = d_ms(a->phase_ns[CW_PHASE_DENSE],
			     b->phase_ns[CW_PHASE_DENSE]);
	ret->experts_ms = d_ms(a->phase_ns[CW_PHASE_EXPERTS],
			       b->phase_ns[CW_PHASE_EXPERTS]);
	ret->head_ms = d_ms(a->phase_ns[CW_PHASE_HEAD],
			    b->phase_ns[CW_PHASE_HEAD]);
	ret->stall_demand_ms = d_ms(a->ct.wait_demand_ns, b->ct.wait_demand_ns);
	ret->stall_inflight_ms = d_ms(a->ct.wait_inflight_ns,
				      b->ct.wait_inflight_ns);
	/* the ACQUIREs' round trips are inside the waits */
	ret->ipc_ms = d_ms(a->ct.rpc_ns - a->ct.acquire_rpc_ns,
			   b->ct.rpc_ns - b->ct.acquire_rpc_ns);
	ret->kv_ms = d_ms(a->phase_ns[CW_PHASE_KV], b->phase_ns[CW_PHASE_KV]);
	ret->other_ms = ret->wall_ms - cw_tl_row_sum_ms(ret);
	ret->minflt = d_n(a->self.minflt, b->self.minflt);
	ret->majflt = d_n(a->self.majflt, b->self.majflt);
	ret->es_minflt = d_n(a->es.minflt, b->es.minflt);
	ret->es_majflt = d_n(a->es.majflt, b->es.majflt);
	ret->es_cpu_ms = d_ms(a->es.cpu_ns, b->es.cpu_ns);
	ret->loader_cpu_ms = d_ms(a->ts.loader_cpu_ns, b->ts.loader_cpu_ns);
	ret->checksum_ms = d_ms(a->ts.checksum_ns, b->ts.checksum_ns);
	ret->loader_minflt = d_n(a->ts.loader_minflt, b->ts.loader_minflt);
	ret->loads = d_n(a->ts.loads, b->ts.loads);
	ret->load_mb = (double)d_n(a->ts.load_bytes, b->ts.load_bytes) / 1e6;
	ret->rpcs = d_n(a->ct.rpcs, b->ct.rpcs);
}

double cw_tl_row_sum_ms(const struct cw_tl_row *r)
{
	return r->dense_ms + r->experts_ms + r->head_ms + r->stall_demand_ms +
	       r->stall_inflight_ms + r->ipc_ms + r->kv_ms;
}

int cw_tl_write_header(FILE *f)
{
	if (fprintf(f, "run\tpass\ttoken\twall_ms\tdense_ms\texperts_ms\t"
		    "head_ms\tstall_demand_ms\tstall_inflight_ms\tipc_ms\t"
		    "kv_ms\tother_ms\tminflt\tmajflt\tes_minflt\tes_majflt\t"
		    "es_cpu_ms\tloader_cpu_ms\tchecksum_ms\tloader_minflt\t"
		    "loads\tload_mb\trpcs\n") < 0)
		return -EIO;
	return 0;
}

int cw_tl_write_row(FILE *f, const char *run, const char *pass, int token,
		    const struct cw_tl_row *r)
{
	if (fprintf(f, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t"
		    "%.3f\t%.3f\t%llu\t%llu\t%llu\t%llu\t%.1f\t%.3f\t%.3f\t%llu\t"
		    "%llu\t%.1f\t%llu\n", run, pass, token, r->wall_ms, r->dense_ms,
		    r->experts_ms, r->head_ms, r->stall_demand_ms,
		    r->stall_inflight_ms, r->ipc_ms, r->kv_ms, r->other_ms,
		    (unsigned long long)r->minflt,
		    (unsigned long long)r->majflt,
		    (unsigned long long)r->es_minflt,
		    (unsigned long long)r->es_majflt, r->es_cpu_ms,
		    r->loader_cpu_ms, r->checksum_ms,
		    (unsigned long long)r->loader_minflt,
		    (unsigned long long)r->loads, r->load_mb,
		    (unsigned long long)r->rpcs) < 0)
		return -EIO;
	return 0;
}
