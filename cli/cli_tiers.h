/*
 * cli_tiers.h — the expert-tier options `strata run` and `strata
 * perplexity` pass on to the expertd and computed they start: eviction
 * policy, hot set, statistics directory, prefetch, forced routing and the
 * routing recorder.
 */
#ifndef CLI_TIERS_H
#define CLI_TIERS_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "cw_proto.h"

#define CLI_MAX_EXTRA_ARGS 32

/* Extra arguments for the daemons (NULL-terminated; strings borrowed from
 * argv). */
struct cli_tier_args {
	const char *es[CLI_MAX_EXTRA_ARGS + 1];
	const char *cw[CLI_MAX_EXTRA_ARGS + 1];
	int n_es, n_cw;
};

enum {
	CLI_OPT_EVICT = 0x400, CLI_OPT_HOT, CLI_OPT_STATE_DIR,
	CLI_OPT_NO_PREFETCH, CLI_OPT_PREFETCH_DEPTH, CLI_OPT_ROUTE_TRACE,
	CLI_OPT_ROUTE_RECORD, CLI_OPT_LA_MEASURE, CLI_OPT_NO_DIRECT,
	CLI_OPT_LOADERS, CLI_OPT_ORACLE, CLI_OPT_HALF_LIFE, CLI_OPT_ADMIT,
	CLI_OPT_EXACT_MATH, CLI_OPT_NO_OVERLAP,
	CLI_OPT_ENGRAM_CACHE, /* last: callers take EVICT ... ENGRAM_CACHE */
};

#define CLI_TIER_LONGOPTS                                                    \
	{ "evict", required_argument, NULL, CLI_OPT_EVICT },                 \
	{ "admit", required_argument, NULL, CLI_OPT_ADMIT },                 \
	{ "hot-experts", required_argument, NULL, CLI_OPT_HOT },             \
	{ "state-dir", required_argument, NULL, CLI_OPT_STATE_DIR },         \
	{ "no-prefetch", no_argument, NULL, CLI_OPT_NO_PREFETCH },           \
	{ "prefetch-depth", required_argument, NULL, CLI_OPT_PREFETCH_DEPTH }, \
	{ "prefetch-distance", required_argument, NULL,                      \
	  CLI_OPT_PREFETCH_DEPTH }, /* the old name, still accepted */         \
	{ "route-trace", required_argument, NULL, CLI_OPT_ROUTE_TRACE },     \
	{ "route-record", required_argument, NULL, CLI_OPT_ROUTE_RECORD },   \
	{ "lookahead-measure", no_argument, NULL, CLI_OPT_LA_MEASURE },      \
	{ "no-direct-io", no_argument, NULL, CLI_OPT_NO_DIRECT },            \
	{ "loader-threads", required_argument, NULL, CLI_OPT_LOADERS },      \
	{ "lookahead-oracle", no_argument, NULL, CLI_OPT_ORACLE },           \
	{ "stats-half-life", required_argument, NULL, CLI_OPT_HALF_LIFE },  \
	{ "exact-math", no_argument, NULL, CLI_OPT_EXACT_MATH },             \
	{ "no-expert-overlap", no_argument, NULL, CLI_OPT_NO_OVERLAP },      \
	{ "engram-cache", required_argument, NULL, CLI_OPT_ENGRAM_CACHE }

#define CLI_TIER_HELP \
"Expert tiers (passed to the expertd and computed started here):\n" \
"  --evict lru|lfru     eviction policy of the host pool (default lfru)\n" \
"  --admit frequency|precision  when a look-ahead prefetch may evict under\n" \
"                       lfru (expertd --help; default frequency)\n" \
"  --hot-experts N|B    pin the N most activated experts per layer (or B\n" \
"                       bytes of them), ranked from activation statistics\n" \
"  --state-dir DIR      keep activation statistics here across restarts\n" \
"  --stats-half-life T  decay of the activation counts, tokens (1024)\n" \
"  --prefetch-depth D   gate look-ahead hints for the next D layers (2)\n" \
"  --no-prefetch        no prefetch hints (and expertd ignores them)\n" \
"  --lookahead-measure  count look-ahead hits for 1..3 layers ahead\n" \
"  --no-direct-io       read the store through the page cache\n" \
"  --no-expert-overlap  compute a layer's experts after all are loaded\n" \
"                       (default: each as it arrives; for comparisons)\n" \
"  --loader-threads N   expertd reads in flight (default 4)\n" \
"  --route-trace FILE   forced routing from a JSONL trace\n" \
"  --route-record FILE  write the routing applied as a JSONL trace\n" \
"  --lookahead-oracle   benchmarks: prefetch hints from the --route-trace\n" \
"  --engram-cache B     DeepSeek-V4.1: expertd's host cache of Engram rows,\n" \
"                       bytes (default: expertd's)\n" \
"  --exact-math         DeepSeek-V4/V4.1: computed without the official\n" \
"                       code's quantization round trips (the fixtures'\n" \
"                       strict references; default: the official math)\n"

/* Handles option `code` (CLI_OPT_*) with argument arg.  Returns 1 when it
 * was a tier option, 0 if not, -1 (message printed) when the lists are
 * full or a word-valued option (--evict, --admit) has another word. */
int cli_tier_opt(struct cli_tier_args *t, int code, const char *arg);

/* Tier figures of a run, from two STATS snapshots (before s0, after s1)
 * of computed.  Derived values as printed and put in JSON. */
struct cli_tier_figures {
	uint64_t hits, misses, evictions, loads, load_bytes, load_ns;
	uint64_t prefetch_loads, prefetch_used, prefetch_wasted;
	uint64_t hints, hints_dropped;
	double precision, recall;      /* prefetch, 0..1 */
	double stall_s, busy_s;        /* expert stall, prefill + decode */
	double stall_fraction;
	double stall_ms_per_token;
	double bytes_per_token;        /* store bytes read per token computed */
	double read_gbps;              /* load_bytes / load_ns (per reader) */
	double busy_gbps;              /* load_bytes / time with a read in
					* flight (the tier's bandwidth) */
	double la_recall[3];           /* look-ahead recall d = 1..3, -1 n/a */
	int direct_io, hot_slots;
};

void cli_tier_figures(const struct cw_stats_wire *s0,
		      const struct cw_stats_wire *s1,
		      struct cli_tier_figures *ret);

/* Recomputes t's per-token figures (bytes and stall per token, stall share
 * of busy_s seconds) for `tokens` tokens, where computed's counters do not
 * count them: SCORE requests (strata perplexity) add no prompt or
 * generated tokens and no prefill or decode time. */
void cli_tier_per_token(struct cli_tier_figures *t, uint64_t tokens,
			double busy_s);

/* Prints the tier lines of a run summary. */
void cli_tier_print(FILE *f, const struct cli_tier_figures *t);

/* Adds "tiers": {...} to a JSON summary object. */
void cli_tier_json(json_t *obj, const struct cli_tier_figures *t);

/* The NVMe I/O queue's line ("io  priorities on; demand 12.3 MiB wait
 * 4.1 ms; kv-restore ...; prefetch ...; kv-spill ... (wait: total over the
 * class's I/Os)") from d's io_* counters (deltas of a run, or totals) and
 * d->io_on (st_ioq_mode: "priorities off" with STRATA_IOQ=off), and the
 * same as {"priorities": "on", "demand": {"bytes", "wait_ms"}, ...} for
 * JSON.  Callers print it only when d->io_on. */
void cli_io_print(FILE *f, const struct cw_stats_wire *d);
json_t *cli_io_json(const struct cw_stats_wire *d);

#endif
