/*
 * cli_tiers.c — expert-tier options passed on to expertd and computed
 * (cli_tiers.h).
 */
#include "cli_tiers.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "st_ioq.h"
#include "st_util.h"

/* arg is one of the '|'-separated words of choices. */
static int one_of(const char *arg, const char *choices)
{
	size_t n = strlen(arg);

	for (const char *p = choices; *p;) {
		const char *end = strchr(p, '|');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		if (n && len == n && !strncmp(p, arg, n))
			return 1;
		p += len + (end ? 1 : 0);
	}
	return 0;
}

/* Checks a word-valued option before any daemon starts (expertd would
 * refuse it only after the start).  0 or -1 (message printed). */
static int check_word(const char *opt, const char *arg, const char *choices)
{
	if (one_of(arg, choices))
		return 0;
	fprintf(stderr, "strata: %s must be %s, not '%s'\n", opt, choices,
		arg);
	return -1;
}

static int add(const char **list, int *n, const char *opt, const char *arg)
{
	if (*n + (arg ? 2 : 1) > CLI_MAX_EXTRA_ARGS) {
		fprintf(stderr, "strata: too many expert-tier options\n");
		return -1;
	}
	list[(*n)++] = opt;
	if (arg)
		list[(*n)++] = arg;
	list[*n] = NULL;
	return 1;
}

int cli_tier_opt(struct cli_tier_args *t, int code, const char *arg)
{
	switch (code) {
	case CLI_OPT_EVICT:
		if (check_word("--evict", arg, "lru|lfru") < 0)
			return -1;
		return add(t->es, &t->n_es, "--evict", arg);
	case CLI_OPT_ADMIT:
		if (check_word("--admit", arg, "frequency|precision") < 0)
			return -1;
		return add(t->es, &t->n_es, "--admit", arg);
	case CLI_OPT_HOT: return add(t->es, &t->n_es, "--hot-experts", arg);
	case CLI_OPT_STATE_DIR:
		return add(t->es, &t->n_es, "--state-dir", arg);
	case CLI_OPT_HALF_LIFE:
		return add(t->es, &t->n_es, "--stats-half-life", arg);
	case CLI_OPT_NO_DIRECT:
		return add(t->es, &t->n_es, "--no-direct-io", NULL);
	case CLI_OPT_LOADERS:
		return add(t->es, &t->n_es, "--loader-threads", arg);
	case CLI_OPT_ENGRAM_CACHE:
		return add(t->es, &t->n_es, "--engram-cache", arg);
	case CLI_OPT_NO_PREFETCH:
		if (add(t->es, &t->n_es, "--no-prefetch", NULL) < 0)
			return -1;
		return add(t->cw, &t->n_cw, "--prefetch-depth", "0");
	case CLI_OPT_PREFETCH_DEPTH:
		return add(t->cw, &t->n_cw, "--prefetch-depth", arg);
	case CLI_OPT_ROUTE_TRACE:
		return add(t->cw, &t->n_cw, "--route-trace", arg);
	case CLI_OPT_ROUTE_RECORD:
		return add(t->cw, &t->n_cw, "--route-record", arg);
	case CLI_OPT_ORACLE:
		return add(t->cw, &t->n_cw, "--lookahead-oracle", NULL);
	case CLI_OPT_LA_MEASURE:
		return add(t->cw, &t->n_cw, "--lookahead-measure", NULL);
	case CLI_OPT_EXACT_MATH:
		return add(t->cw, &t->n_cw, "--exact-math", NULL);
	case CLI_OPT_NO_OVERLAP:
		return add(t->cw, &t->n_cw, "--no-expert-overlap", NULL);
	default:
		return 0;
	}
}

#define D(f) (s1->f - s0->f)

static double ratio(uint64_t a, uint64_t b)
{
	return b ? (double)a / (double)b : 0;
}

void cli_tier_figures(const struct cw_stats_wire *s0,
		      const struct cw_stats_wire *s1,
		      struct cli_tier_figures *t)
{
	uint64_t tokens = D(prompt_tokens) + D(generated_tokens);
	uint64_t pred[3] = { D(la_pred1), D(la_pred2), D(la_pred3) };
	uint64_t hit[3] = { D(la_hit1), D(la_hit2), D(la_hit3) };

	t->hits = D(es_hits);
	t->misses = D(es_misses);
	t->evictions = D(es_evictions);
	t->loads = D(es_loads);
	t->load_bytes = D(es_load_bytes);
	t->load_ns = D(es_load_ns);
	t->prefetch_loads = D(es_prefetch_loads);
	t->prefetch_used = D(es_prefetch_used);
	t->prefetch_wasted = D(es_prefetch_wasted);
	t->hints = D(es_hints);
	t->hints_dropped = D(es_hints_dropped);
	t->precision = ratio(t->prefetch_used, t->prefetch_loads);
	t->recall = ratio(t->prefetch_used, t->prefetch_used + t->misses);
	t->stall_s = (double)D(expert_stall_ns) / 1e9;
	t->busy_s = (double)(D(prefill_ns) + D(decode_ns)) / 1e9;
	t->stall_fraction = t->busy_s > 0 ? t->stall_s / t->busy_s : 0;
	t->stall_ms_per_token = tokens ? t->stall_s * 1e3 / (double)tokens : 0;
	t->bytes_per_token = tokens ? (double)t->load_bytes / (double)tokens : 0;
	t->read_gbps = t->load_ns ? (double)t->load_bytes / (double)t->load_ns :
				    0;
	t->busy_gbps = D(es_io_busy_ns) ? (double)t->load_bytes /
					      (double)D(es_io_busy_ns) : 0;
	for (int d = 0; d < 3; d++)
		t->la_recall[d] = pred[d] ? (double)hit[d] / (double)pred[d] :
					    -1;
	t->direct_io = (int)s1->es_direct_io;
	t->hot_slots = (int)s1->es_hot_slots;
}

void cli_tier_per_token(struct cli_tier_figures *t, uint64_t tokens,
			double busy_s)
{
	t->busy_s = busy_s;
	t->stall_fraction = busy_s > 0 ? t->stall_s / busy_s : 0;
	t->stall_ms_per_token = tokens ? t->stall_s * 1e3 / (double)tokens : 0;
	t->bytes_per_token = tokens ? (double)t->load_bytes / (double)tokens : 0;
}

void cli_tier_print(FILE *f, const struct cli_tier_figures *t)
{
	fprintf(f, "NVMe tier          %llu loads, %.1f MiB read (%s), "
		"%.0f KiB/token, %.2f GB/s while reading (%.2f per reader)\n",
		(unsigned long long)t->loads, (double)t->load_bytes / 1048576.0,
		t->direct_io ? "O_DIRECT" : "page cache",
		t->bytes_per_token / 1024.0, t->busy_gbps, t->read_gbps);
	fprintf(f, "prefetch           %llu loads from %llu hints (%llu "
		"dropped stale); precision %.1f%%, recall %.1f%%, %llu "
		"unused (wrong hints)\n",
		(unsigned long long)t->prefetch_loads,
		(unsigned long long)t->hints,
		(unsigned long long)t->hints_dropped, 100 * t->precision,
		100 * t->recall, (unsigned long long)t->prefetch_wasted);
	fprintf(f, "expert stall       %.1f%% of compute time, %.3f ms/token; "
		"hot set %d experts\n", 100 * t->stall_fraction,
		t->stall_ms_per_token, t->hot_slots);
	if (t->la_recall[0] >= 0)
		fprintf(f, "gate look-ahead    recall d=1 %.1f%%, d=2 %.1f%%, "
			"d=3 %.1f%%\n", 100 * t->la_recall[0],
			100 * (t->la_recall[1] > 0 ? t->la_recall[1] : 0),
			100 * (t->la_recall[2] > 0 ? t->la_recall[2] : 0));
}

void cli_tier_json(json_t *obj, const struct cli_tier_figures *t)
{
	json_t *j = json_object(), *la = json_array();

	json_object_set_new(j, "loads", json_integer((json_int_t)t->loads));
	json_object_set_new(j, "load_bytes",
			    json_integer((json_int_t)t->load_bytes));
	json_object_set_new(j, "load_ns", json_integer((json_int_t)t->load_ns));
	json_object_set_new(j, "misses", json_integer((json_int_t)t->misses));
	json_object_set_new(j, "hits", json_integer((json_int_t)t->hits));
	json_object_set_new(j, "evictions",
			    json_integer((json_int_t)t->evictions));
	json_object_set_new(j, "read_gbps_per_reader", json_real(t->read_gbps));
	json_object_set_new(j, "read_gbps", json_real(t->busy_gbps));
	json_object_set_new(j, "bytes_per_token", json_real(t->bytes_per_token));
	json_object_set_new(j, "direct_io", json_boolean(t->direct_io));
	json_object_set_new(j, "prefetch_loads",
			    json_integer((json_int_t)t->prefetch_loads));
	json_object_set_new(j, "prefetch_used",
			    json_integer((json_int_t)t->prefetch_used));
	json_object_set_new(j, "prefetch_wasted",
			    json_integer((json_int_t)t->prefetch_wasted));
	json_object_set_new(j, "hints", json_integer((json_int_t)t->hints));
	json_object_set_new(j, "hints_dropped",
			    json_integer((json_int_t)t->hints_dropped));
	json_object_set_new(j, "prefetch_precision", json_real(t->precision));
	json_object_set_new(j, "prefetch_recall", json_real(t->recall));
	json_object_set_new(j, "stall_s", json_real(t->stall_s));
	json_object_set_new(j, "busy_s", json_real(t->busy_s));
	json_object_set_new(j, "stall_fraction", json_real(t->stall_fraction));
	json_object_set_new(j, "stall_ms_per_token",
			    json_real(t->stall_ms_per_token));
	json_object_set_new(j, "hot_slots", json_integer(t->hot_slots));
	for (int d = 0; d < 3; d++)
		json_array_append_new(la, t->la_recall[d] >= 0 ?
					  json_real(t->la_recall[d]) :
					  json_null());
	json_object_set_new(j, "lookahead_recall", la);
	json_object_set_new(obj, "tiers", j);
}

/* ---- the I/O queue (st_ioq.h) ---- */

/* Class k's bytes and wait in d. */
static void io_class(const struct cw_stats_wire *d, int k, uint64_t *bytes,
		     uint64_t *wait_ns)
{
	const uint64_t b[ST_IOQ_N] = { d->io_bytes_demand,
		d->io_bytes_kv_restore, d->io_bytes_prefetch,
		d->io_bytes_kv_spill };
	const uint64_t w[ST_IOQ_N] = { d->io_wait_demand_ns,
		d->io_wait_kv_restore_ns, d->io_wait_prefetch_ns,
		d->io_wait_kv_spill_ns };

	*bytes = b[k];
	*wait_ns = w[k];
}

/* d->io_on (st_ioq_mode) as "on", "off" (STRATA_IOQ=off), "mixed". */
static const char *io_priorities(const struct cw_stats_wire *d)
{
	return d->io_on == ST_IOQ_MODE_UNORDERED ? "off" :
	       d->io_on == ST_IOQ_MODE_MIXED ? "mixed" : "on";
}

json_t *cli_io_json(const struct cw_stats_wire *d)
{
	json_t *j = json_object();

	json_object_set_new(j, "priorities", json_string(io_priorities(d)));
	for (int k = 0; k < ST_IOQ_N; k++) {
		uint64_t b, w;

		io_class(d, k, &b, &w);
		json_object_set_new(j, st_ioq_class_name(k), json_pack(
			"{s:I, s:f}", "bytes", (json_int_t)b, "wait_ms",
			round((double)w / 1e3) / 1e3));
	}
	return j;
}

void cli_io_print(FILE *f, const struct cw_stats_wire *d)
{
	static const char *const why[] = {
		[ST_IOQ_MODE_UNORDERED] = " (STRATA_IOQ=off: counted, not "
					  "ordered)",
		[ST_IOQ_MODE_MIXED] = " (a daemon runs with STRATA_IOQ=off)",
	};

	fprintf(f, "io                 priorities %s%s; ", io_priorities(d),
		d->io_on < ST_ARRAY_SIZE(why) && why[d->io_on] ?
			why[d->io_on] : "");
	for (int k = 0; k < ST_IOQ_N; k++) {
		uint64_t b, w;
		char a[32];

		io_class(d, k, &b, &w);
		fprintf(f, "%s%s %s wait %.1f ms", k ? "; " : "",
			st_ioq_class_name(k), st_format_bytes(b, a, sizeof(a)),
			(double)w / 1e6);
	}
	fprintf(f, " (wait: total over the class's I/Os)\n");
}
