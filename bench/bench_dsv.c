/*
 * bench_dsv.c — DeepSeek-V4 family decode through expertd's tiers, one
 * benchmark for every revision (the store's config says which; --model
 * v4|v41 insists on one): tokens/s at host expert budgets (default 100 /
 * 50 / 25 % of the experts), bytes read from the store per decoded token
 * (V4.1: split into experts and Engram rows, with an Engram cache smaller
 * than the tables), stall fraction, hit rates, and the I/O-bound limit
 * against the store's raw O_DIRECT read bandwidth measured in the same
 * run.
 *
 * For each budget: the store's expert (and Engram) files are made cold
 * (fsync + POSIX_FADV_DONTNEED; with --drop-caches also
 * /proc/sys/vm/drop_caches, root only, whole machine; expertd reads with
 * O_DIRECT anyway), the raw read bandwidth of the expert files is
 * measured (bench_raw.c: --loader-threads O_DIRECT streams, one expert
 * record per request, up to --raw-bytes; again right after the decode),
 * expertd (and kvd, unused) start on a private instance with
 * --host-budget B (V4.1: and --engram-cache C), and the model runs in this
 * process (cw_dsv_load_store, --compute fast by default: FP8 dense codes,
 * V4.1's BF16 compressor / index keys / head and the experts' MXFP4 slot
 * bytes on the fast kernels, per-expert overlap and next-token step hints
 * on): a prompt of --prompt-tokens, then --tokens greedy decode steps,
 * timed, with the step timeline of every token.  At the first budget a
 * second decode of the same tokens on the warm pool gives the
 * compute-bound rate (when it misses nothing).
 *
 * Printed per budget (decode steps only), V4:
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
 * V4.1:
 *   tok/s          decode tokens per second (wall clock)
 *   exp MB/tok     expert bytes expertd read from the store per token
 *                  (demand and prefetch loads)
 *   eng KB/tok     Engram bytes expertd read (4 KiB blocks) per token
 *   used MB/tok    expert record bytes the routed experts used per token
 *   stall          time waiting for experts (cw_dsv_run_stats) / wall
 *   hits           expert pool hit rate; Engram cache hit rate
 *   raw GB/s       as V4's
 *   I/O lim        raw GB/s / (expert + Engram bytes read per token)
 *   %I/O           tok/s / I/O lim (the target: >= 80 %)
 *   limit, %lim    min(compute-bound rate, I/O lim), tok/s / that
 * Prints figures, asserts nothing (STYLE.md).  Figures measured on a
 * shared, loaded machine say so in docs/BENCHMARKS.md.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_raw.h"
#include "cli_instance.h"
#include "cw_dsv.h"
#include "cw_steptime.h"
#include "cw_timeline.h"
#include "es_client.h"
#include "st_daemon.h"
#include "st_store.h"
#include "st_util.h"

#define MAX_BUDGETS 8

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata-bench-dsv --store STORE [--model v4|v41]\n"
"                        [--budgets 100,50,25] [--engram-cache BYTES]\n"
"                        [--tokens N] [--prompt-tokens N]\n"
"                        [--loader-threads N] [--raw-bytes B]\n"
"                        [--drop-caches] [--no-prefetch | --no-hints]\n"
"                        [--compute fast|reference] [--prefetch-depth D]\n"
"                        [--no-step-hints] [--no-layer-hints]\n"
"                        [--no-overlap] [--threads N]\n"
"                        [--evict lru|lfru] [--admit precision|frequency]\n"
"                        [--timeline FILE] [--loader-nice N]\n"
"\n"
"DeepSeek-V4 / V4.1 decode through expertd at each host expert budget (%%\n"
"of all experts): decode tokens/s, bytes read from the store per token\n"
"(V4.1: experts and Engram rows, with an Engram row cache of\n"
"--engram-cache bytes), hit rates, stall fraction, and the I/O-bound\n"
"limit from the store's raw O_DIRECT read bandwidth measured in the same\n"
"run.  STORE: `strata convert` of a V4 checkpoint (e.g.\n"
"scripts/gen-dsv4-model.py --layers 8 --experts 48) or of a V4.1 one\n"
"(scripts/gen-v41-engram-model.py --flash-layers 4); its config says\n"
"which (--model: refuse another).\n"
"Defaults: V4: --tokens 16, --raw-bytes 2GiB, --evict lfru,\n"
"--prefetch-depth 2; V4.1: --tokens 8, --raw-bytes 1GiB, --engram-cache\n"
"64MiB, --prefetch-depth 1 (gate look-ahead hints for the next D layers;\n"
"V4's hash layers are hinted exactly); both: --prompt-tokens 8,\n"
"--loader-threads 4, --compute fast.\n"
"--no-prefetch (--no-hints): no routing reports and so no expert hints,\n"
"and no Engram prefetch; --no-step-hints: no step-named hint of the next\n"
"token's experts before its layer 0 (V4: its hash-routed layers'; V4.1:\n"
"its first layers'); --no-layer-hints: no hint of each layer's experts at\n"
"the layer's start (cw_dsv_set_layer_hints); --no-overlap: wait for all\n"
"top-k experts of a layer before computing any (all on by default; off\n"
"to measure their effect); --threads N: V4.1 fast mode's matvecs split\n"
"over N threads (default 1); --evict: expertd's eviction policy; --admit:\n"
"expertd's admission of look-ahead prefetches under lfru (default its\n"
"own, frequency); --timeline FILE: the step timeline of every decoded\n"
"token (cw_timeline.h: where its wall time went, page faults, expertd's\n"
"loader CPU and checksum time) as TSV, first and warm pass of each\n"
"budget; scripts/plot-timeline.gp draws it.  The per-pass means are\n"
"printed either way; --loader-nice N: expertd's loader threads N lower\n"
"in priority than the daemon (default: its own default).\n");
}

/* --- one run ------------------------------------------------------------- */

struct counters {
	struct es_tier_stats t;
	struct es_engram_stats e;
	struct cw_dsv_run_stats r;
};

/* What the command line sets for every budget (-1: the revision's
 * default, set in main). */
struct bench_opts {
	int v41;             /* the store's revision: V4.1, else V4 */
	const char *cache;   /* V4.1: expertd --engram-cache */
	const char *evict;   /* expertd --evict (NULL: its default, lfru) */
	const char *admit;   /* expertd --admit (NULL: its default) */
	int loaders, prefetch, step_hints, overlap, depth, threads;
	int layer_hints, drop;
	enum cw_compute mode;
	uint64_t raw_bytes;
	FILE *timeline;      /* --timeline: per-token TSV, or NULL */
	const char *loader_nice; /* expertd --loader-nice (NULL: its own) */
};

static void snap(struct es_client *es, const struct cw_dsv_state *s,
		 struct counters *c)
{
	struct st_diag d = { { 0 } };

	cw_dsv_state_stats(s, &c->r);
	es_client_tier_stats(es, &c->t);
	if (es_client_engram_stats(es, &c->e, &d) < 0)
		memset(&c->e, 0, sizeof(c->e));
}

struct run_result {
	int budget_pct;
	uint64_t n_slots;
	double tok_s, warm_tok_s;
	double raw_before, raw_after; /* GB/s around the cold decode */
	double raw_gbps;              /* their mean: the I/O limit's */
	double exp_bpt, eng_bpt, used_bpt, dense_bpt;
	double hit, eng_hit, stall;
	uint64_t hits, misses, eng_misses, pf_loads, pf_used, pf_wasted;
	uint64_t hints, step_hints, dropped;
	int warm_missed;
};

static int argmax(const float *x, int n)
{
	int b = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

/* The step timeline of one decode (--timeline): rows to f (or none),
 * their sums for the summary. */
struct tl_pass {
	FILE *f;             /* NULL: no TSV */
	const char *run, *pass;
	struct cw_tl_row sum; /* column sums over the pass's tokens */
	int n;
};

static void tl_add(struct cw_tl_row *s, const struct cw_tl_row *r)
{
	s->wall_ms += r->wall_ms;
	s->dense_ms += r->dense_ms;
	s->experts_ms += r->experts_ms;
	s->head_ms += r->head_ms;
	s->stall_demand_ms += r->stall_demand_ms;
	s->stall_inflight_ms += r->stall_inflight_ms;
	s->ipc_ms += r->ipc_ms;
	s->kv_ms += r->kv_ms;
	s->other_ms += r->other_ms;
	s->minflt += r->minflt;
	s->majflt += r->majflt;
	s->es_minflt += r->es_minflt;
	s->es_majflt += r->es_majflt;
	s->es_cpu_ms += r->es_cpu_ms;
	s->loader_cpu_ms += r->loader_cpu_ms;
	s->checksum_ms += r->checksum_ms;
	s->loader_minflt += r->loader_minflt;
	s->loads += r->loads;
	s->load_mb += r->load_mb;
	s->rpcs += r->rpcs;
}

/* One summary line: the pass's mean per token. */
static void tl_print(const struct tl_pass *tp)
{
	const struct cw_tl_row *s = &tp->sum;
	double n = tp->n > 0 ? tp->n : 1;

	printf("timeline %s %s, ms per token (mean of %d): wall %.1f = dense "
	       "%.1f + experts %.1f + head %.1f + stall demand %.1f + stall "
	       "in flight %.1f + ipc %.1f + kvd %.1f + other %.1f; "
	       "faults/token: this process %.0f minor %.1f major, expertd "
	       "%.0f minor %.1f major; expertd CPU %.1f ms (loaders %.1f, "
	       "checksums %.1f); loads %.1f (%.1f MB); expertd round trips "
	       "%.1f\n", tp->run, tp->pass, tp->n, s->wall_ms / n,
	       s->dense_ms / n, s->experts_ms / n, s->head_ms / n,
	       s->stall_demand_ms / n, s->stall_inflight_ms / n,
	       s->ipc_ms / n, s->kv_ms / n, s->other_ms / n, s->minflt / n,
	       s->majflt / n, s->es_minflt / n, s->es_majflt / n,
	       s->es_cpu_ms / n, s->loader_cpu_ms / n, s->checksum_ms / n,
	       s->loads / n, s->load_mb / n, s->rpcs / n);
}

/* Decodes n_tok greedy tokens after prompt[0..n_prompt) on a new state
 * (ids[] gets them, or they are forced from warm_ids); counters taken
 * after the prompt (c0) and after the last step (c1).  Returns the wall
 * ns of the decode steps, or negative. */
static int64_t decode(const struct cw_dsv_model *m, struct es_client *es,
		      const int32_t *prompt, int n_prompt, int n_tok,
		      int32_t *ids, const int32_t *warm_ids,
		      struct counters *c0, struct counters *c1,
		      struct tl_pass *tp, struct st_diag *diag)
{
	const int V = cw_dsv_config(m)->vocab_size;
	float *logits = malloc((size_t)V * sizeof(float));
	struct cw_dsv_state *s = NULL;
	struct cw_steptime tl;
	struct cw_tl_snap sa, sb;
	struct cw_tl_row row;
	int64_t r;
	uint64_t t0;
	int32_t tok;

	if (!logits || cw_dsv_state_new(m, n_prompt + n_tok + 1, &s) < 0) {
		free(logits);
		return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	cw_steptime_init(&tl, es);
	cw_dsv_set_steptime(s, &tl);
	r = cw_dsv_eval(m, s, prompt, n_prompt, 0, logits, diag);
	if (r < 0)
		goto out;
	snap(es, s, c0);
	t0 = st_now_ns();
	tok = argmax(logits, V);
	for (int i = 0; i < n_tok; i++) {
		if (warm_ids)
			tok = warm_ids[i];
		else
			ids[i] = tok;
		cw_tl_snap_take(&sa, &tl, es);
		r = cw_dsv_eval(m, s, &tok, 1, 0, logits, diag);
		if (r < 0)
			goto out;
		cw_tl_snap_take(&sb, &tl, es);
		cw_tl_row_make(&sa, &sb, &row);
		tl_add(&tp->sum, &row);
		tp->n++;
		if (tp->f)
			cw_tl_write_row(tp->f, tp->run, tp->pass, i, &row);
		tok = argmax(logits, V);
		fprintf(stderr, "\rbench-dsv: token %d/%d", i + 1, n_tok);
	}
	fprintf(stderr, "\n");
	r = (int64_t)(st_now_ns() - t0);
	snap(es, s, c1);
out:
	cw_dsv_state_free(s);
	free(logits);
	return r;
}

static int parse_budgets(const char *arg, int *b, int *n)
{
	const char *p = arg;
	char *end;

	*n = 0;
	while (*p && *n < MAX_BUDGETS) {
		long v = strtol(p, &end, 10);

		if (end == p || v < 1 || v > 100 || (*end && *end != ','))
			return -1;
		b[(*n)++] = (int)v;
		p = *end == ',' ? end + 1 : end;
	}
	return *n ? 0 : -1;
}

/* The model's switches from the command line.  0 or -EINVAL with diag. */
static int model_opts(struct cw_dsv_model *m, const struct bench_opts *bo,
		      struct st_diag *diag)
{
	if (cw_dsv_set_prefetch_depth(m, bo->depth) < 0)
		return st_diag_set(diag, -EINVAL,
				   "--prefetch-depth must be 0..8");
	if (bo->v41 && cw_dsv41_set_threads(m, bo->threads) < 0)
		return st_diag_set(diag, -EINVAL,
				   "--threads %d (fast mode only)",
				   bo->threads);
	cw_dsv_set_route_reports(m, bo->prefetch);
	if (bo->v41)
		cw_dsv41_set_engram_prefetch(m, bo->prefetch);
	cw_dsv_set_decode_overlap(m, bo->step_hints, bo->overlap);
	cw_dsv_set_layer_hints(m, bo->layer_hints);
	return 0;
}

/* The figures of a cold decode of n_tok tokens (ns wall) between the
 * counters a and b. */
static void cold_figures(const struct st_store *st,
			 const struct cw_dsv_model *m,
			 const struct bench_opts *bo, int n_tok, int64_t ns,
			 const struct counters *a, const struct counters *b,
			 struct run_result *rr)
{
	const struct st_dsv_config *c = cw_dsv_config(m);

	rr->tok_s = n_tok / (ns / 1e9);
	rr->exp_bpt = (double)(b->t.load_bytes - a->t.load_bytes) / n_tok;
	rr->eng_bpt = (double)(b->e.read_bytes - a->e.read_bytes) / n_tok;
	/* V4: the record bytes the state counted; V4.1: every layer's
	 * top-k records */
	rr->used_bpt = bo->v41 ? (double)c->n_layers * c->top_k *
					 (double)st->record_bytes :
				 (double)(b->r.expert_bytes -
					  a->r.expert_bytes) / n_tok;
	rr->dense_bpt = (double)cw_dsv_dense_bytes(m);
	rr->stall = (double)(b->r.acquire_ns - a->r.acquire_ns) / (double)ns;
	rr->hits = b->t.hits - a->t.hits;
	rr->misses = b->t.misses - a->t.misses;
	rr->hit = rr->hits + rr->misses ?
			  (double)rr->hits / (double)(rr->hits + rr->misses) :
			  0;
	rr->pf_loads = b->t.prefetch_loads - a->t.prefetch_loads;
	rr->pf_used = b->t.prefetch_used - a->t.prefetch_used;
	rr->pf_wasted = b->t.prefetch_wasted - a->t.prefetch_wasted;
	rr->hints = b->t.hints - a->t.hints;
	rr->step_hints = b->t.step_hints - a->t.step_hints;
	rr->dropped = b->t.hints_dropped - a->t.hints_dropped;
	rr->eng_misses = b->e.misses - a->e.misses;
	rr->eng_hit = b->e.lookups > a->e.lookups ?
			      (double)(b->e.hits - a->e.hits) /
				      (double)(b->e.lookups - a->e.lookups) :
			      0;
}

/* One budget: cold files, raw bandwidth, daemons up, cold then warm
 * decode.  0 or negative with diag. */
static int run_budget(const struct st_store *st, const char *store_dir,
		      int bi, int pct, const struct bench_opts *bo,
		      const int32_t *prompt, int n_prompt, int n_tok,
		      int32_t *ids, struct run_result *rr,
		      struct st_diag *diag)
{
	struct cli_instance inst;
	struct cli_tier_args tier = { 0 };
	struct es_client *es = NULL;
	struct cw_dsv_model *m = NULL;
	struct counters a, b, w0, w1;
	struct es_stats est;
	char run[16];
	struct tl_pass tp_cold = { .f = bo->timeline, .run = run,
				  .pass = "first" };
	struct tl_pass tp_warm = { .f = bo->timeline, .run = run,
				  .pass = "warm" };
	int64_t ns;
	int r;

	memset(rr, 0, sizeof(*rr));
	rr->budget_pct = pct;
	snprintf(run, sizeof(run), "%d%%", pct);
	bench_make_cold(st, bo->v41, bo->drop);
	rr->raw_before = bench_raw_bandwidth(st, bo->loaders, bo->raw_bytes);
	rr->raw_gbps = rr->raw_before;
	bench_make_cold(st, bo->v41, 0);
	memset(&inst, 0, sizeof(inst));
	snprintf(inst.name, sizeof(inst.name), "bdsv-%d-%d", (int)getpid(),
		 bi);
	st_run_dir_default(inst.name, inst.run_dir, sizeof(inst.run_dir));
	snprintf(inst.store_dir, sizeof(inst.store_dir), "%s", store_dir);
	snprintf(inst.host_budget, sizeof(inst.host_budget), "%d%%", pct);
	snprintf(inst.loader_threads, sizeof(inst.loader_threads), "%d",
		 bo->loaders);
	snprintf(inst.kv_budget, sizeof(inst.kv_budget), "64MiB");
	inst.tiers_only = 1;
	if (bo->v41) {
		tier.es[tier.n_es++] = "--engram-cache";
		tier.es[tier.n_es++] = bo->cache;
	}
	if (bo->evict) {
		tier.es[tier.n_es++] = "--evict";
		tier.es[tier.n_es++] = bo->evict;
	}
	if (bo->admit) {
		tier.es[tier.n_es++] = "--admit";
		tier.es[tier.n_es++] = bo->admit;
	}
	if (bo->loader_nice) {
		tier.es[tier.n_es++] = "--loader-nice";
		tier.es[tier.n_es++] = bo->loader_nice;
	}
	inst.tier = &tier;
	if ((r = cli_instance_up(&inst, 300, diag)) < 0)
		return r;
	r = es_client_open(inst.run_dir, inst.name, "bench", 120000, &es,
			   diag);
	if (!r)
		r = cw_dsv_load_store(store_dir, es, bo->v41 ? ST_DSV_REV_V41 :
					      ST_DSV_REV_V4, bo->mode, &m, diag);
	if (!r)
		r = model_opts(m, bo, diag);
	if (!r) {
		ns = decode(m, es, prompt, n_prompt, n_tok, ids, NULL, &a, &b,
			    &tp_cold, diag);
		r = ns < 0 ? (int)ns : 0;
	}
	if (!r) {
		cold_figures(st, m, bo, n_tok, ns, &a, &b, rr);
		/* the disk again, right after: its bandwidth drifts (0.9-2.3
		 * GB/s within a day on the VM, and from one probe to the
		 * next), so the limit takes the mean of the two probes */
		rr->raw_after = bench_raw_bandwidth(st, bo->loaders,
						    bo->raw_bytes);
		if (rr->raw_after > 0)
			rr->raw_gbps = (rr->raw_before + rr->raw_after) / 2;
		es_client_stats(es, &est);
		rr->n_slots = est.n_slots;
		/* warm: the same tokens on the pool as left */
		ns = decode(m, es, prompt, n_prompt, n_tok, ids, ids, &w0, &w1,
			    &tp_warm, diag);
		if (ns > 0) {
			rr->warm_tok_s = n_tok / (ns / 1e9);
			rr->warm_missed = w1.t.misses != w0.t.misses ||
					  w1.e.misses != w0.e.misses;
		}
		tl_print(&tp_cold);
		tl_print(&tp_warm);
	}
	cw_dsv_free(m);
	es_client_close(es);
	cli_instance_down(&inst);
	return r;
}

/* --- printing: each revision's lines and table --------------------------- */

static void print_budget(const struct bench_opts *bo,
			 const struct run_result *rr)
{
	if (bo->v41) {
		printf("budget %3d%%: pool %llu slots, decode %.3f tok/s (warm "
		       "repeat %.3f%s), expert hit rate %.3f (%llu misses), "
		       "Engram hit rate %.3f (%llu misses), raw %.2f GB/s "
		       "before, %.2f after, stall %.1f %%, prefetch loads %llu "
		       "used %llu, step-named hint entries %llu\n",
		       rr->budget_pct, (unsigned long long)rr->n_slots,
		       rr->tok_s, rr->warm_tok_s,
		       rr->warm_missed ? ", missed" : "", rr->hit,
		       (unsigned long long)rr->misses, rr->eng_hit,
		       (unsigned long long)rr->eng_misses, rr->raw_before,
		       rr->raw_after, 100 * rr->stall,
		       (unsigned long long)rr->pf_loads,
		       (unsigned long long)rr->pf_used,
		       (unsigned long long)rr->step_hints);
		return;
	}
	printf("budget %3d%%: pool %llu slots, decode %.3f tok/s (warm "
	       "repeat %.3f), hit rate %.3f (%llu misses), stall %.1f %%, "
	       "raw %.2f GB/s before, %.2f after; prefetch loads %llu, "
	       "used %llu, wasted %llu: precision %.2f, recall %.2f; hints "
	       "%llu + step-named %llu, dropped %llu\n",
	       rr->budget_pct, (unsigned long long)rr->n_slots, rr->tok_s,
	       rr->warm_tok_s, rr->hit, (unsigned long long)rr->misses,
	       100 * rr->stall, rr->raw_before, rr->raw_after,
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
}

static void print_table_v4(const struct run_result *res, int n,
			   double compute_tok_s)
{
	printf("\n%6s %8s %9s %12s %12s %11s %7s %6s %8s %9s %8s %6s\n",
	       "budget", "slots", "tok/s", "NVMe MB/tok", "expert MB/t",
	       "dense MB/t", "stall", "hits", "raw GB/s", "I/O lim", "limit",
	       "%lim");
	for (int bi = 0; bi < n; bi++) {
		const struct run_result *rr = &res[bi];
		double io_lim = rr->exp_bpt > 0 ?
			rr->raw_gbps * 1e9 / rr->exp_bpt : 1e30;
		double lim = compute_tok_s > 0 && compute_tok_s < io_lim ?
			compute_tok_s : io_lim;

		printf("%5d%% %8llu %9.3f %12.1f %12.1f %11.1f %6.1f%% %6.3f "
		       "%8.2f %9.3f %8.3f %5.0f%%\n", rr->budget_pct,
		       (unsigned long long)rr->n_slots, rr->tok_s,
		       rr->exp_bpt / 1e6, rr->used_bpt / 1e6,
		       rr->dense_bpt / 1e6, 100 * rr->stall, rr->hit,
		       rr->raw_gbps, io_lim >= 1e29 ? 0.0 : io_lim, lim,
		       lim > 0 && lim < 1e29 ? 100 * rr->tok_s / lim : 0.0);
	}
}

static void print_table_v41(const struct run_result *res, int n,
			    double compute_tok_s)
{
	printf("\n%6s %6s %9s %11s %11s %12s %6s %6s %6s %8s %9s %6s %9s "
	       "%6s\n", "budget", "slots", "tok/s", "exp MB/tok", "eng KB/tok",
	       "used MB/tok", "hits", "eng h", "stall", "raw GB/s", "I/O lim",
	       "%I/O", "limit", "%lim");
	for (int bi = 0; bi < n; bi++) {
		const struct run_result *rr = &res[bi];
		double rd = rr->exp_bpt + rr->eng_bpt;
		double io_lim = rd > 0 ? rr->raw_gbps * 1e9 / rd : 0;
		double lim = io_lim > 0 ? io_lim : compute_tok_s;

		if (compute_tok_s > 0 && compute_tok_s < lim)
			lim = compute_tok_s;
		printf("%5d%% %6llu %9.3f %11.1f %11.1f %12.1f %6.3f %6.3f "
		       "%5.1f%% %8.2f %9.3f %5.0f%% %9.3f %5.0f%%\n",
		       rr->budget_pct, (unsigned long long)rr->n_slots,
		       rr->tok_s, rr->exp_bpt / 1e6, rr->eng_bpt / 1e3,
		       rr->used_bpt / 1e6, rr->hit, rr->eng_hit,
		       100 * rr->stall, rr->raw_gbps,
		       io_lim, io_lim > 0 ? 100 * rr->tok_s / io_lim : 0.0,
		       lim, lim > 0 ? 100 * rr->tok_s / lim : 0.0);
	}
}

/* What the columns mean, and the whole run's figures. */
static void print_summary(const struct bench_opts *bo,
			  const struct run_result *res)
{
	if (bo->v41) {
		printf("exp MB/tok, eng KB/tok: store bytes expertd read per "
		       "decoded token (experts and Engram 4 KiB blocks: demand "
		       "and prefetch reads); raw GB/s: the mean of the probes "
		       "before and after the decode; I/O lim = raw GB/s / "
		       "their sum; %%I/O = tok/s / I/O lim (target >= 80 %%); "
		       "limit = min(compute-bound, I/O lim)\n");
		printf("dense bytes per token (in-memory size, %s mode): %.1f "
		       "MB\n", cw_compute_name(bo->mode),
		       res[0].dense_bpt / 1e6);
	} else {
		printf("NVMe MB/tok: store bytes expertd read per decoded "
		       "token (demand and prefetch); raw GB/s: the mean of "
		       "the probes before and after the decode; I/O lim = raw "
		       "GB/s / that; limit = min(compute-bound, I/O lim); "
		       "target: tok/s >= 80 %% of the limit at 25 %%\n");
	}
	printf("peak RSS of this process (model in %s mode, one sequence): "
	       "%.2f GiB\n", cw_compute_name(bo->mode),
	       st_peak_rss_bytes() / (double)(1ull << 30));
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "store", required_argument, NULL, 's' },
		{ "model", required_argument, NULL, 'M' },
		{ "budgets", required_argument, NULL, 'b' },
		{ "engram-cache", required_argument, NULL, 'E' },
		{ "tokens", required_argument, NULL, 'n' },
		{ "prompt-tokens", required_argument, NULL, 'p' },
		{ "loader-threads", required_argument, NULL, 'l' },
		{ "raw-bytes", required_argument, NULL, 'r' },
		{ "drop-caches", no_argument, NULL, 'd' },
		{ "no-prefetch", no_argument, NULL, 'P' },
		{ "no-hints", no_argument, NULL, 'P' },
		{ "compute", required_argument, NULL, 'c' },
		{ "prefetch-depth", required_argument, NULL, 'D' },
		{ "no-step-hints", no_argument, NULL, 'S' },
		{ "no-layer-hints", no_argument, NULL, 'L' },
		{ "no-overlap", no_argument, NULL, 'O' },
		{ "threads", required_argument, NULL, 'T' },
		{ "evict", required_argument, NULL, 'V' },
		{ "admit", required_argument, NULL, 'A' },
		{ "timeline", required_argument, NULL, 't' },
		{ "loader-nice", required_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int budgets[MAX_BUDGETS] = { 100, 50, 25 }, n_budgets = 3;
	int n_tok = -1, n_prompt = 8, c, want = -1; /* want: 0 V4, 1 V4.1 */
	const char *store_dir = NULL;
	struct bench_opts bo = { 0, "64MiB", NULL, NULL, 4, 1, 1, 1, -1, 1,
				 1, 0, CW_COMPUTE_FAST, 0, NULL, NULL };
	const char *timeline = NULL;
	uint64_t cache_b;
	struct run_result res[MAX_BUDGETS];
	struct st_store *st = NULL;
	struct st_diag diag = { { 0 } };
	double compute_tok_s = 0;
	int32_t *ids, prompt[4096];

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': store_dir = optarg; break;
		case 'M':
			if (strcmp(optarg, "v4") && strcmp(optarg, "v41")) {
				fprintf(stderr, "bench-dsv: --model v4|v41\n");
				return 2;
			}
			want = !strcmp(optarg, "v41");
			break;
		case 'b':
			if (parse_budgets(optarg, budgets, &n_budgets) < 0) {
				fprintf(stderr, "bench-dsv: --budgets wants "
					"percentages like 100,50,25\n");
				return 2;
			}
			break;
		case 'E': bo.cache = optarg; break;
		case 'n': n_tok = atoi(optarg); break;
		case 'p': n_prompt = atoi(optarg); break;
		case 'l': bo.loaders = atoi(optarg); break;
		case 'r':
			if (st_parse_size(optarg, &bo.raw_bytes) < 0) {
				fprintf(stderr, "bench-dsv: bad --raw-bytes\n");
				return 2;
			}
			break;
		case 'd': bo.drop = 1; break;
		case 'P': bo.prefetch = 0; break;
		case 'c':
			if (cw_compute_parse(optarg, &bo.mode) < 0) {
				fprintf(stderr, "bench-dsv: --compute "
					"fast|reference\n");
				return 2;
			}
			break;
		case 'D': bo.depth = atoi(optarg); break;
		case 'S': bo.step_hints = 0; break;
		case 'L': bo.layer_hints = 0; break;
		case 'O': bo.overlap = 0; break;
		case 'T': bo.threads = atoi(optarg); break;
		case 'V':
			if (strcmp(optarg, "lru") && strcmp(optarg, "lfru")) {
				fprintf(stderr, "bench-dsv: --evict lru|lfru\n");
				return 2;
			}
			bo.evict = optarg;
			break;
		case 'A':
			if (strcmp(optarg, "precision") &&
			    strcmp(optarg, "frequency")) {
				fprintf(stderr, "bench-dsv: --admit "
					"precision|frequency\n");
				return 2;
			}
			bo.admit = optarg;
			break;
		case 't': timeline = optarg; break;
		case 'N': bo.loader_nice = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!store_dir || n_tok == 0 || n_tok < -1 || n_prompt < 1 ||
	    n_prompt > 4096 || bo.loaders < 1 || bo.loaders > 64 ||
	    st_parse_size(bo.cache, &cache_b) < 0) {
		usage(stderr);
		return 2;
	}
	if (st_store_open(store_dir, &st, &diag) < 0) {
		fprintf(stderr, "bench-dsv: %s\n", diag.msg);
		return 1;
	}
	if (!st->is_dsv4 && !st->is_dsv41) {
		fprintf(stderr, "bench-dsv: %s is not a DeepSeek-V4 family "
			"store\n", store_dir);
		return 1;
	}
	bo.v41 = st->is_dsv41;
	if (want >= 0 && want != bo.v41) {
		fprintf(stderr, "bench-dsv: %s is not a DeepSeek-%s store "
			"(make one with %s and strata convert)\n", store_dir,
			want ? "V4.1" : "V4", want ?
			"scripts/gen-v41-engram-model.py --flash-layers 4" :
			"scripts/gen-dsv4-model.py");
		return 1;
	}
	if (!bo.v41 && bo.threads != 1) {
		fprintf(stderr, "bench-dsv: --threads: V4.1 stores only\n");
		return 2;
	}
	/* the revision's defaults */
	if (n_tok < 0)
		n_tok = bo.v41 ? 8 : 16;
	if (!bo.raw_bytes)
		bo.raw_bytes = bo.v41 ? 1ull << 30 : 2ull << 30;
	if (bo.depth < 0)
		bo.depth = bo.v41 ? 1 : 2;
	if (!bo.v41 && !bo.evict)
		bo.evict = "lfru";
	if (timeline) {
		bo.timeline = fopen(timeline, "we");
		if (!bo.timeline || cw_tl_write_header(bo.timeline) < 0) {
			fprintf(stderr, "bench-dsv: cannot write %s: %s\n",
				timeline, strerror(errno));
			return 1;
		}
	}
	printf("store %s (DeepSeek-%s): %d layers x %d experts, record %llu B "
	       "(%.2f MiB), experts %.2f GiB", store_dir,
	       bo.v41 ? "V4.1" : "V4", st->n_layers, st->n_experts,
	       (unsigned long long)st->record_bytes,
	       st->record_bytes / 1048576.0,
	       (double)st->record_bytes * st->n_layers * st->n_experts /
		       (1ull << 30));
	if (bo.v41)
		printf(", Engram tables %.2f GiB, Engram cache %s",
		       (double)st->engram_bytes / (1ull << 30), bo.cache);
	printf("; decode %d tokens after a %d-token prompt; compute %s; "
	       "expertd --evict %s, %d loader threads; routing reports and "
	       "hints%s %s, look-ahead depth %d, step hints %s, layer-start "
	       "hints %s, per-expert overlap %s, %d compute thread(s)\n",
	       n_tok, n_prompt, cw_compute_name(bo.mode),
	       bo.evict ? bo.evict : "(default)", bo.loaders,
	       bo.v41 ? " and Engram prefetch" : "",
	       bo.prefetch ? "on" : "off", bo.depth,
	       bo.step_hints ? "on" : "off", bo.layer_hints ? "on" : "off",
	       bo.overlap ? "on" : "off", bo.threads);
	fflush(stdout);
	/* a fixed prompt: token ids spread over the vocabulary */
	for (int i = 0; i < n_prompt; i++)
		prompt[i] = (int32_t)((1000003u * (unsigned)(i + 1)) %
				      (unsigned)(bo.v41 ? st->dsv41.vocab_size :
							  st->dsv4.vocab_size));
	ids = calloc((size_t)n_tok, sizeof(*ids));
	if (!ids)
		return 1;
	for (int bi = 0; bi < n_budgets; bi++) {
		struct run_result *rr = &res[bi];

		if (run_budget(st, store_dir, bi, budgets[bi], &bo, prompt,
			       n_prompt, n_tok, ids, rr, &diag) < 0) {
			fprintf(stderr, "bench-dsv: budget %d%%: %s\n",
				budgets[bi], diag.msg);
			return 1;
		}
		if (bi == 0 && !rr->warm_missed)
			compute_tok_s = rr->warm_tok_s;
		print_budget(&bo, rr);
		fflush(stdout);
	}
	if (bo.v41)
		print_table_v41(res, n_budgets, compute_tok_s);
	else
		print_table_v4(res, n_budgets, compute_tok_s);
	printf("compute-bound rate (warm repeat at %d%%, no misses): %.3f "
	       "tok/s%s\n", budgets[0], compute_tok_s,
	       compute_tok_s > 0 ? "" : " (not measured: the repeat missed)");
	print_summary(&bo, res);
	free(ids);
	st_store_close(st);
	if (bo.timeline && fclose(bo.timeline) != 0) {
		fprintf(stderr, "bench-dsv: cannot write %s: %s\n", timeline,
			strerror(errno));
		return 1;
	}
	return 0;
}
