/*
 * bench_dsv4.c — DeepSeek-V4 decode through the expert tiers: tokens/s at
 * host expert budgets (default 100 / 50 / 25 % of the experts), bytes per
 * token (experts read from NVMe, expert bytes computed, dense weights),
 * stall fraction, and the I/O-bound limit against the store's raw
 * O_DIRECT read bandwidth measured in the same run.
 *
 * For each budget: the store's expert files are made cold (fsync +
 * POSIX_FADV_DONTNEED; with --drop-caches also /proc/sys/vm/drop_caches,
 * root only, whole machine; expertd reads with O_DIRECT anyway), the raw
 * read bandwidth of those files is measured (as many O_DIRECT streams as
 * expertd has loader threads, one expert record per request, up to
 * --raw-bytes), expertd (and kvd, unused) start on a private instance
 * with --host-budget B, and the model runs in this process
 * (cw_dsv_load_store, --compute fast by default: FP8 dense codes
 * and MXFP4 slot bytes on the fast kernels): a prompt of --prompt-tokens,
 * then --tokens greedy decode steps, timed.  At the first budget, a second
 * decode of the same tokens on the warm pool (no reads when the budget
 * holds every expert touched) gives the compute-bound rate.
 *
 * Printed per budget (decode steps only):
 *   tok/s          decode tokens per second (wall clock)
 *   NVMe B/tok     bytes expertd read from the store per decoded token
 *   expert B/tok   expert record bytes the routed experts used per token
 *   dense B/tok    dense weight bytes per token (cw_dsv_dense_bytes)
 *   stall          time in es_client_acquire / decode wall time
 *   hit rate       pool hits / (hits + misses)
 *   raw GB/s       the mean of two raw probes, before the daemons start
 *                  and right after the decode (the disk's bandwidth drifts)
 *   I/O limit      raw GB/s / NVMe B/tok, tokens/s the drive allows
 *   limit          min(compute tok/s, I/O limit); % = tok/s / limit
 * Prints figures, asserts nothing (STYLE.md).  Figures measured on a
 * shared, loaded machine say so in docs/BENCHMARKS.md.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_raw.h"
#include "cli_instance.h"
#include "cw_dsv.h"
#include "es_client.h"
#include "st_daemon.h"
#include "st_store.h"
#include "st_util.h"

#define MAX_BUDGETS 8

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata-bench-dsv4 --store STORE [--budgets 100,50,25]\n"
"                         [--tokens N] [--prompt-tokens N]\n"
"                         [--loader-threads N] [--compute fast|reference]\n"
"                         [--raw-bytes B] [--drop-caches] [--no-hints]\n"
"                         [--evict lru|lfru] [--prefetch-depth D]\n"
"                         [--no-step-hints] [--no-layer-hints] [--no-overlap]\n"
"\n"
"DeepSeek-V4 decode through expertd at each host expert budget (%% of all\n"
"experts): decode tokens/s, NVMe / expert / dense bytes per token, stall\n"
"fraction, and the I/O-bound limit from the store's raw O_DIRECT read\n"
"bandwidth measured in the same run.  STORE: `strata convert` of a V4\n"
"checkpoint (e.g. scripts/gen-dsv4-model.py --layers 8 --experts 48).\n"
"Defaults: --tokens 16, --prompt-tokens 8, --loader-threads 4,\n"
"--compute fast, --raw-bytes 2GiB, --evict lfru, --prefetch-depth 2 (gate\n"
"look-ahead hints for the next D layers; hash layers are hinted exactly).\n"
"--no-step-hints: do not hint the next token's hash-routed layers' experts\n"
"before its layer 0; --no-layer-hints: no hint of each score-routed layer's\n"
"experts at the layer's start (cw_dsv_set_layer_hints); --no-overlap: wait\n"
"for all top-k experts of a layer\n"
"before computing any (all on by default; off to measure their effect).\n");
}

/* --- raw O_DIRECT read bandwidth ---------------------------------------- */

/* --- one run ------------------------------------------------------------- */

struct run_result {
	int budget_pct;
	uint64_t n_slots;
	double tok_s, warm_tok_s;
	double nvme_bpt, expert_bpt, dense_bpt;
	double stall, hit_rate;
	double raw_before, raw_after; /* GB/s around the cold decode */
	double raw_gbps;              /* their mean: the I/O limit's */
	uint64_t misses, hits, pf_loads, pf_used, pf_wasted;
	uint64_t hints, step_hints, dropped;
};

static int argmax(const float *x, int n)
{
	int b = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* Decodes n_tok greedy tokens after prompt[0..n_prompt) on a new state;
 * ids[] gets the decoded tokens (when warm_ids is NULL) or is forced from
 * warm_ids.  The model's and expertd's counters are taken after the
 * prompt (rs0, t0s) and after the last step (rs1, t1s).  Returns wall ns
 * of the decode steps, or negative. */
static int64_t decode(const struct cw_dsv_model *m, struct es_client *es,
		      const int32_t *prompt, int n_prompt, int n_tok,
		      int32_t *ids, const int32_t *warm_ids,
		      struct cw_dsv_run_stats *rs0,
		      struct cw_dsv_run_stats *rs1, struct es_tier_stats *t0s,
		      struct es_tier_stats *t1s, struct st_diag *diag)
{
	const int V = cw_dsv_config(m)->vocab_size;
	float *logits = malloc((size_t)V * sizeof(float));
	struct cw_dsv_state *s = NULL;
	int64_t r;
	uint64_t t0;
	int32_t tok;

	if (!logits || cw_dsv_state_new(m, n_prompt + n_tok + 1, &s) < 0) {
		free(logits);
		return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	r = cw_dsv_eval(m, s, prompt, n_prompt, 0, logits, diag);
	if (r < 0)
		goto out;
	cw_dsv_state_stats(s, rs0);
	es_client_tier_stats(es, t0s);
	t0 = st_now_ns();
	tok = argmax(logits, V);
	for (int i = 0; i < n_tok; i++) {
		if (warm_ids)
			tok = warm_ids[i];
		else
			ids[i] = tok;
		r = cw_dsv_eval(m, s, &tok, 1, 0, logits, diag);
		if (r < 0)
			goto out;
		tok = argmax(logits, V);
	}
	r = (int64_t)(st_now_ns() - t0);
	cw_dsv_state_stats(s, rs1);
	es_client_tier_stats(es, t1s);
out:
	cw_dsv_state_free(s);
	free(logits);
	return r;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "store", required_argument, NULL, 's' },
		{ "budgets", required_argument, NULL, 'b' },
		{ "tokens", required_argument, NULL, 'n' },
		{ "prompt-tokens", required_argument, NULL, 'p' },
		{ "loader-threads", required_argument, NULL, 'l' },
		{ "compute", required_argument, NULL, 'c' },
		{ "raw-bytes", required_argument, NULL, 'r' },
		{ "drop-caches", no_argument, NULL, 'd' },
		{ "no-hints", no_argument, NULL, 'H' },
		{ "evict", required_argument, NULL, 'e' },
		{ "prefetch-depth", required_argument, NULL, 'D' },
		{ "no-step-hints", no_argument, NULL, 'S' },
		{ "no-layer-hints", no_argument, NULL, 'L' },
		{ "no-overlap", no_argument, NULL, 'O' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int budgets[MAX_BUDGETS] = { 100, 50, 25 }, n_budgets = 3;
	int n_tok = 16, n_prompt = 8, loaders = 4, drop = 0, hints = 1, c;
	int depth = 2, step_hints = 1, overlap = 1, layer_hints = 1;
	const char *store_dir = NULL, *evict = "lfru";
	uint64_t raw_bytes = 2ull << 30;
	enum cw_compute mode = CW_COMPUTE_FAST;
	struct run_result res[MAX_BUDGETS];
	struct st_store *st = NULL;
	struct st_diag diag = { "" };
	double compute_tok_s = 0;
	int32_t *ids = NULL;
	int32_t prompt[4096];

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': store_dir = optarg; break;
		case 'b': {
			char *p = optarg, *end;

			n_budgets = 0;
			while (*p && n_budgets < MAX_BUDGETS) {
				long v = strtol(p, &end, 10);

				if (end == p || v < 1 || v > 100) {
					fprintf(stderr, "bench: --budgets wants "
						"percentages like 100,50,25\n");
					return 2;
				}
				budgets[n_budgets++] = (int)v;
				p = *end == ',' ? end + 1 : end;
				if (*end && *end != ',')
					break;
			}
			break;
		}
		case 'n': n_tok = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'l': loaders = atoi(optarg); break;
		case 'c':
			if (cw_compute_parse(optarg, &mode) < 0) {
				fprintf(stderr, "bench: --compute fast|reference\n");
				return 2;
			}
			break;
		case 'r':
			if (st_parse_size(optarg, &raw_bytes) < 0) {
				fprintf(stderr, "bench: bad --raw-bytes\n");
				return 2;
			}
			break;
		case 'd': drop = 1; break;
		case 'H': hints = 0; break;
		case 'e': evict = optarg; break;
		case 'D': depth = atoi(optarg); break;
		case 'S': step_hints = 0; break;
		case 'L': layer_hints = 0; break;
		case 'O': overlap = 0; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!store_dir || n_tok < 1 || n_prompt < 1 || n_prompt > 4096 ||
	    loaders < 1 || loaders > 64 || n_budgets < 1) {
		usage(stderr);
		return 2;
	}
	if (st_store_open(store_dir, &st, &diag) < 0) {
		fprintf(stderr, "bench: %s\n", diag.msg);
		return 1;
	}
	if (!st->is_dsv4) {
		fprintf(stderr, "bench: %s is not a DeepSeek-V4 store\n",
			store_dir);
		return 1;
	}
	printf("store %s: %d layers x %d experts, record %llu B (%.2f MiB), "
	       "experts %.2f GiB; decode %d tokens after a %d-token prompt; "
	       "compute %s; expertd --evict %s, %d loader threads, routing "
	       "reports and hints %s, look-ahead depth %d, step hints %s, "
	       "layer-start hints %s, per-expert overlap %s\n", store_dir,
	       st->n_layers,
	       st->n_experts, (unsigned long long)st->record_bytes,
	       st->record_bytes / 1048576.0,
	       (double)st->record_bytes * st->n_layers * st->n_experts /
		       (1ull << 30), n_tok, n_prompt, cw_compute_name(mode),
	       evict, loaders, hints ? "on" : "off", depth,
	       step_hints ? "on" : "off", layer_hints ? "on" : "off",
	       overlap ? "on" : "off");
	fflush(stdout);
	/* a fixed prompt: token ids spread over the vocabulary */
	for (int i = 0; i < n_prompt; i++)
		prompt[i] = (int32_t)((1000003u * (unsigned)(i + 1)) %
				      (unsigned)st->dsv4.vocab_size);
	ids = calloc((size_t)n_tok, sizeof(*ids));
	for (int bi = 0; bi < n_budgets; bi++) {
		struct run_result *rr = &res[bi];
		struct cli_instance inst;
		struct cli_tier_args tier = { 0 };
		struct es_client *es = NULL;
		struct cw_dsv_model *m = NULL;
		struct es_tier_stats a, b;
		struct es_stats est;
		struct cw_dsv_run_stats r0, r1;
		int64_t ns;
		int r;

		memset(rr, 0, sizeof(*rr));
		rr->budget_pct = budgets[bi];
		bench_make_cold(st, 0, drop);
		rr->raw_before = bench_raw_bandwidth(st, loaders, raw_bytes);
		rr->raw_gbps = rr->raw_before;
		bench_make_cold(st, 0, 0);
		memset(&inst, 0, sizeof(inst));
		snprintf(inst.name, sizeof(inst.name), "bdsv4-%d-%d",
			 (int)getpid(), bi);
		st_run_dir_default(inst.name, inst.run_dir, sizeof(inst.run_dir));
		snprintf(inst.store_dir, sizeof(inst.store_dir), "%s", store_dir);
		snprintf(inst.host_budget, sizeof(inst.host_budget), "%d%%",
			 budgets[bi]);
		snprintf(inst.loader_threads, sizeof(inst.loader_threads), "%d",
			 loaders);
		snprintf(inst.kv_budget, sizeof(inst.kv_budget), "64MiB");
		inst.tiers_only = 1;
		tier.es[tier.n_es++] = "--evict";
		tier.es[tier.n_es++] = evict;
		inst.tier = &tier;
		if (cli_instance_up(&inst, 300, &diag) < 0) {
			fprintf(stderr, "bench: %s\n", diag.msg);
			return 1;
		}
		r = es_client_open(inst.run_dir, inst.name, "bench", 120000, &es,
				   &diag);
		if (!r)
			r = cw_dsv_load_store(store_dir, es, ST_DSV_REV_V4,
					      mode, &m, &diag);
		if (!r) {
			cw_dsv_set_route_reports(m, hints);
			cw_dsv_set_decode_overlap(m, step_hints, overlap);
			cw_dsv_set_layer_hints(m, layer_hints);
		}
		if (!r && cw_dsv_set_prefetch_depth(m, depth) < 0)
			r = st_diag_set(&diag, -EINVAL, "--prefetch-depth "
					"must be 0..8");
		if (!r) {
			ns = decode(m, es, prompt, n_prompt, n_tok, ids, NULL,
				    &r0, &r1, &a, &b, &diag);
			r = ns < 0 ? (int)ns : 0;
		}
		if (!r) {
			/* decode steps only (counters after the prompt) */
			uint64_t dl = b.load_bytes - a.load_bytes;

			rr->tok_s = n_tok / (ns / 1e9);
			rr->expert_bpt = (double)(r1.expert_bytes -
						  r0.expert_bytes) / n_tok;
			rr->dense_bpt = (double)cw_dsv_dense_bytes(m);
			rr->stall = (double)(r1.acquire_ns - r0.acquire_ns) /
				    (double)ns;
			rr->nvme_bpt = (double)dl / n_tok;
			rr->hits = b.hits - a.hits;
			rr->misses = b.misses - a.misses;
			rr->pf_loads = b.prefetch_loads - a.prefetch_loads;
			rr->pf_used = b.prefetch_used - a.prefetch_used;
			rr->pf_wasted = b.prefetch_wasted - a.prefetch_wasted;
			rr->hints = b.hints - a.hints;
			rr->step_hints = b.step_hints - a.step_hints;
			rr->dropped = b.hints_dropped - a.hints_dropped;
			rr->hit_rate = rr->hits + rr->misses ?
				(double)rr->hits / (rr->hits + rr->misses) : 0;
			es_client_stats(es, &est);
			rr->n_slots = est.n_slots;
			/* the disk again, right after: its bandwidth drifts,
			 * so the limit takes the mean of the two probes (as
			 * bench-dsv41) */
			rr->raw_after = bench_raw_bandwidth(st, loaders,
							    raw_bytes);
			if (rr->raw_after > 0)
				rr->raw_gbps = (rr->raw_before +
						rr->raw_after) / 2;
		}
		if (!r) {
			struct es_tier_stats w0, w1;
			struct cw_dsv_run_stats q0, q1;
			int64_t wns;

			/* warm pass: the same tokens again on the pool as the
			 * first pass left it */
			wns = decode(m, es, prompt, n_prompt, n_tok, ids, ids,
				     &q0, &q1, &w0, &w1, &diag);
			if (wns > 0) {
				rr->warm_tok_s = n_tok / (wns / 1e9);
				if (bi == 0 && w1.misses == w0.misses)
					compute_tok_s = rr->warm_tok_s;
			}
		}
		if (r)
			fprintf(stderr, "bench: budget %d%%: %s\n", budgets[bi],
				diag.msg);
		cw_dsv_free(m);
		es_client_close(es);
		cli_instance_down(&inst);
		if (r)
			return 1;
		printf("budget %3d%%: pool %llu slots, decode %.3f tok/s (warm "
		       "repeat %.3f), hit rate %.3f (%llu misses), stall %.1f %%, "
		       "raw %.2f GB/s before, %.2f after; prefetch loads %llu, "
		       "used %llu, wasted "
		       "%llu: precision %.2f, recall %.2f; hints %llu + step-"
		       "named %llu, dropped %llu\n",
		       rr->budget_pct, (unsigned long long)rr->n_slots,
		       rr->tok_s, rr->warm_tok_s, rr->hit_rate,
		       (unsigned long long)rr->misses, 100 * rr->stall,
		       rr->raw_before, rr->raw_after,
		       (unsigned long long)rr->pf_loads,
		       (unsigned long long)rr->pf_used,
		       (unsigned long long)rr->pf_wasted,
		       rr->pf_loads ? (double)rr->pf_used / rr->pf_loads : 0.0,
		       rr->pf_used + rr->misses ?
			       (double)rr->pf_used / (rr->pf_used + rr->misses) :
			       0.0,
		       (unsigned long long)rr->hints,
		       (unsigned long long)rr->step_hints,
		       (unsigned long long)rr->dropped);
		fflush(stdout);
	}
	printf("\n%6s %8s %9s %12s %12s %11s %7s %6s %8s %9s %8s %6s\n",
	       "budget", "slots", "tok/s", "NVMe MB/tok", "expert MB/t",
	       "dense MB/t", "stall", "hits", "raw GB/s", "I/O lim", "limit",
	       "%lim");
	for (int bi = 0; bi < n_budgets; bi++) {
		struct run_result *rr = &res[bi];
		double io_lim = rr->nvme_bpt > 0 ?
			rr->raw_gbps * 1e9 / rr->nvme_bpt : 1e30;
		double lim = compute_tok_s > 0 && compute_tok_s < io_lim ?
			compute_tok_s : io_lim;

		printf("%5d%% %8llu %9.3f %12.1f %12.1f %11.1f %6.1f%% %6.3f "
		       "%8.2f %9.3f %8.3f %5.0f%%\n", rr->budget_pct,
		       (unsigned long long)rr->n_slots, rr->tok_s,
		       rr->nvme_bpt / 1e6, rr->expert_bpt / 1e6,
		       rr->dense_bpt / 1e6, 100 * rr->stall, rr->hit_rate,
		       rr->raw_gbps, io_lim >= 1e29 ? 0.0 : io_lim, lim,
		       lim > 0 && lim < 1e29 ? 100 * rr->tok_s / lim : 0.0);
	}
	printf("compute-bound rate (warm repeat at %d%%, no misses): %.3f "
	       "tok/s%s\n", budgets[0], compute_tok_s,
	       compute_tok_s > 0 ? "" : " (not measured: the repeat missed)");
	printf("NVMe MB/tok: store bytes expertd read per decoded token "
	       "(demand and prefetch); raw GB/s: the mean of the probes before "
	       "and after the decode; I/O lim = raw GB/s / that; limit = min("
	       "compute-bound, I/O lim); target: tok/s >= 80 %% of the limit "
	       "at 25 %%\n");
	printf("peak RSS of this process (model in fast mode, one sequence): "
	       "%.2f GiB\n", st_peak_rss_bytes() / (double)(1ull << 30));
	free(ids);
	st_store_close(st);
	return 0;
}
