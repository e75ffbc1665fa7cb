/*
 * cmd_replay.c — `strata replay TRACE...`: replays a routing trace through
 * expert-residency policies without running the model and prints, per pool
 * split, budget and policy, hits, loads, bytes moved and a stall estimate,
 * with each policy's loads as a ratio of Belady's optimum (offline MIN) for
 * the same pool.  Model and formats: expertd/es_replay.h, docs/REPLAY.md.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_cmds.h"
#include "es_replay.h"
#include "st_store.h"
#include "st_util.h"

#define DEFAULT_READ_GBPS 6.0 /* one PCIe 4.0 x4 NVMe drive, sequential */
#define MAX_BUDGETS 16
#define MAX_POLICIES 160

static void usage(FILE *f)
{
	fprintf(f,
"Usage: strata replay TRACE... [options]\n"
"\n"
"Replays a routing trace (the experts each token chose at each MoE layer)\n"
"through expert-residency policies of a pool of expert slots, without\n"
"running the model, and prints hits, loads (experts read into the pool),\n"
"bytes moved and a stall estimate per policy and budget, next to Belady's\n"
"optimum (offline MIN: evict the expert used farthest in the future) for the\n"
"same pool.  Several TRACE files are replayed one after the other as one\n"
"token stream (vLLM logs of one run, one layer each, merge row by row).\n"
"Formats: strata/kjv-moe JSONL, vLLM route logs, speculative-moe JSONL,\n"
"moe-beyond CSV (docs/REPLAY.md).\n"
"\n"
"  --budget LIST      pool sizes as shares of all experts of all layers in\n"
"                     the trace, e.g. 25%%,50%% (default)\n"
"  --slots LIST       pool sizes in experts instead, e.g. 64,128\n"
"  --split MODE       global (one pool over all layers), per-layer (the\n"
"                     slots split evenly over the layers) or both (default)\n"
"  --policy LIST      lru, lru2, lfu, lfud, lrfu, hist, 2q, lstale,\n"
"                     la-POLICY (the look-ahead variant), or all (default:\n"
"                     every policy and its look-ahead variant); belady is\n"
"                     always shown\n"
"  --future LIST      also rows future-N (not online: Belady within the next\n"
"                     N tokens, hist beyond): how much foresight a target\n"
"                     needs, e.g. --future 0,1,4\n"
"  --draft LIST       also rows draft-POLICY-LEN@ACCEPT: the policy told what\n"
"                     speculative drafts of LEN tokens would reveal, each\n"
"                     draft token accepted with probability ACCEPT (default\n"
"                     %.2f, DeepSeek-V3's MTP); e.g. --draft 1,2:0.7\n"
"  --draft-policy L   base policies of the draft rows (default hist)\n"
"  --draft-schedule S token (a new draft at every token), step (one per\n"
"                     verify step: the next after the accepted prefix) or\n"
"                     both (default)\n"
"  --draft-no-wrong   rejected draft positions reveal nothing (default: the\n"
"                     routing of a random other token, as a wrong draft)\n"
"  --draft-prefetch   also load the next token's drafted experts ahead\n"
"  --draft-seed N     seed of the acceptance draws (default fixed)\n"
"  --lookahead D      layers the la-* policies see ahead of the current one,\n"
"                     the same token's next D layers (default 1)\n"
"  --no-prefetch      la-* policies only protect what they see; they do not\n"
"                     load it ahead\n"
"  --expert-bytes N   bytes of one expert (e.g. 4MiB), for bytes moved and\n"
"                     the stall estimate\n"
"  --store DIR        take the expert size from a strata store instead\n"
"  --read-gbps G      read bandwidth for the stall estimate, GB/s (10^9\n"
"                     bytes/s; default %.1f)\n"
"  --json             print the results as JSON instead of tables\n"
"  -h, --help         this help\n"
"\n"
"loads = demand misses + prefetch loads; x Belady = loads / Belady's loads;\n"
"stall = demand misses x expert bytes / read bandwidth (prefetch loads are\n"
"assumed to overlap compute).\n"
"\n"
"Example:\n"
"  strata replay ../shared/fixtures/traces/ngavhane__moe-beyond/*.csv\n",
		ES_REPLAY_DRAFT_ACCEPT_DEFAULT, DEFAULT_READ_GBPS);
}

struct pol {
	int base;     /* enum es_replay_policy */
	int la;       /* look-ahead variant */
	int window;   /* future: tokens seen ahead */
	int draft_len; /* draft rows: tokens per draft (0: not a draft row) */
	double draft_accept;
	int draft_per_step;
	char name[48];
	char sees[32];
};

struct replay_opts {
	double pct[MAX_BUDGETS];
	uint32_t slots[MAX_BUDGETS];
	int n_budgets, by_slots;
	int split_global, split_layer;
	struct pol pols[MAX_POLICIES];
	int n_pols;
	int lookahead, prefetch, json;
	int draft_no_wrong, draft_prefetch;
	int name_w, sees_w;     /* text table: column widths */
	uint64_t draft_seed;
	uint64_t expert_bytes;
	double read_gbps;
};

static int add_pol(struct replay_opts *o, int base, int la)
{
	struct pol *p;

	for (int i = 0; i < o->n_pols; i++)
		if (o->pols[i].base == base && o->pols[i].la == la)
			return 0;
	if (o->n_pols == MAX_POLICIES)
		return -1;
	p = &o->pols[o->n_pols++];
	p->base = base;
	p->la = la;
	snprintf(p->name, sizeof(p->name), "%s%s", la ? "la-" : "",
		 es_replay_policy_name(base));
	return 0;
}

static int parse_policies(struct replay_opts *o, const char *text)
{
	char buf[512], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", text);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		int la = 0, b;

		if (!strcmp(tok, "all")) {
			for (int i = 0; i < ES_RP_N_BASE; i++)
				if (i != ES_RP_BELADY && i != ES_RP_FUTURE)
					add_pol(o, i, 0);
			for (int i = 0; i < ES_RP_N_BASE; i++)
				if (i != ES_RP_BELADY && i != ES_RP_FUTURE)
					add_pol(o, i, 1);
			continue;
		}
		if (!strncmp(tok, "la-", 3)) {
			la = 1;
			tok += 3;
		}
		b = es_replay_policy_parse(tok);
		if (b == ES_RP_FUTURE) {
			fprintf(stderr, "strata replay: the future-N rows come "
				"from --future LIST\n");
			return -1;
		}
		if (b < 0 || (la && b == ES_RP_BELADY)) {
			fprintf(stderr, "strata replay: unknown policy '%s%s' "
				"(lru, lru2, lfu, lfud, lrfu, hist, 2q, lstale, "
				"belady, la-POLICY or all)\n", la ? "la-" : "", tok);
			return -1;
		}
		if (b != ES_RP_BELADY && add_pol(o, b, la) < 0) {
			fprintf(stderr, "strata replay: too many policies\n");
			return -1;
		}
	}
	return 0;
}

static int parse_future(struct replay_opts *o, const char *text)
{
	char buf[256], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", text);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *end;
		long w = strtol(tok, &end, 10);
		struct pol *p;

		if (*end || w < 0 || w > 100000 || o->n_pols == MAX_POLICIES) {
			fprintf(stderr, "strata replay: --future '%s' is not a "
				"list of token counts (e.g. 0,1,4)\n", text);
			return -1;
		}
		p = &o->pols[o->n_pols++];
		p->base = ES_RP_FUTURE;
		p->window = (int)w;
		snprintf(p->name, sizeof(p->name), "future-%ld", w);
	}
	return 0;
}

/* --draft LIST x --draft-policy LIST x the schedules: one row each. */
static int parse_draft(struct replay_opts *o, const char *text,
		       const char *policies, const char *schedule)
{
	char buf[512], pbuf[256], *save = NULL, *tok;
	int sched_token = !strcmp(schedule, "token") ||
			  !strcmp(schedule, "both");
	int sched_step = !strcmp(schedule, "step") || !strcmp(schedule, "both");

	if (!sched_token && !sched_step) {
		fprintf(stderr, "strata replay: --draft-schedule '%s': use "
			"token, step or both\n", schedule);
		return -1;
	}
	snprintf(buf, sizeof(buf), "%s", text);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *end, *psave = NULL, *pt;
		long len = strtol(tok, &end, 10);
		double acc = ES_REPLAY_DRAFT_ACCEPT_DEFAULT;

		if (*end == ':')
			acc = strtod(end + 1, &end);
		if (*end || len < 1 || len > ES_REPLAY_MAX_DRAFT ||
		    !(acc >= 0.0 && acc <= 1.0)) {
			fprintf(stderr, "strata replay: --draft '%s': a list of "
				"LEN[:ACCEPT], LEN 1 to %d, ACCEPT in [0, 1] "
				"(e.g. 1,2:0.7)\n", text, ES_REPLAY_MAX_DRAFT);
			return -1;
		}
		snprintf(pbuf, sizeof(pbuf), "%s", policies);
		for (pt = strtok_r(pbuf, ",", &psave); pt;
		     pt = strtok_r(NULL, ",", &psave)) {
			int b = es_replay_policy_parse(pt);

			if (b < 0 || b == ES_RP_BELADY || b == ES_RP_FUTURE) {
				fprintf(stderr, "strata replay: --draft-policy "
					"'%s': an online policy (lru, lru2, "
					"lfu, lfud, lrfu, hist, 2q, lstale)\n",
					pt);
				return -1;
			}
			for (int step = 0; step <= 1; step++) {
				struct pol *p;

				if (step ? !sched_step : !sched_token)
					continue;
				if (o->n_pols == MAX_POLICIES) {
					fprintf(stderr, "strata replay: too "
						"many policies\n");
					return -1;
				}
				p = &o->pols[o->n_pols++];
				p->base = b;
				p->draft_len = (int)len;
				p->draft_accept = acc;
				p->draft_per_step = step;
				snprintf(p->name, sizeof(p->name),
					 "draft-%s-%ld@%.2f%s%s%s", pt, len,
					 acc, step ? "/step" : "",
					 o->draft_prefetch ? "+pf" : "",
					 o->draft_no_wrong ? "-nw" : "");
				snprintf(p->sees, sizeof(p->sees),
					 "drafts %ld@%.2f%s", len, acc,
					 step ? " step" : "");
			}
		}
	}
	return 0;
}

static int parse_budgets(struct replay_opts *o, const char *text, int slots)
{
	char buf[512], *save = NULL, *tok;

	snprintf(buf, sizeof(buf), "%s", text);
	o->n_budgets = 0;
	o->by_slots = slots;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		char *end;

		if (o->n_budgets == MAX_BUDGETS)
			goto bad;
		if (slots) {
			unsigned long v = strtoul(tok, &end, 10);

			if (*end || !v || v > UINT32_MAX)
				goto bad;
			o->slots[o->n_budgets++] = (uint32_t)v;
		} else {
			double v = strtod(tok, &end);

			if (end == tok || strcmp(end, "%") || !(v > 0) ||
			    v > 100)
				goto bad;
			o->pct[o->n_budgets++] = v;
		}
	}
	if (o->n_budgets)
		return 0;
bad:
	fprintf(stderr, "strata replay: %s '%s' is not a comma-separated list "
		"of %s\n", slots ? "--slots" : "--budget", text,
		slots ? "slot counts (e.g. 64,128)" :
		"shares above 0% and at most 100% (e.g. 25%,50%)");
	return -1;
}

struct result {
	const struct pol *pol;   /* NULL: belady */
	const char *policy;
	const char *online;
	int split_layer;
	double pct;
	uint32_t slots;
	struct es_replay_stats st;
	double ratio;
};

static void print_header(const struct es_trace *t, int n_paths,
			 const char *first, const struct replay_opts *o)
{
	uint64_t acc = 0;

	for (size_t i = 0; i < t->n_steps; i++)
		acc += t->steps[i].n;
	printf("trace      %s%s (%d file%s, format %s)\n", first,
	       n_paths > 1 ? " ..." : "", n_paths, n_paths > 1 ? "s" : "",
	       t->formats);
	printf("           %u tokens, %d MoE layers, %d experts, top-%d, "
	       "%zu steps, %llu expert accesses%s\n", t->n_tokens,
	       t->n_layers, t->n_experts, t->top_k, t->n_steps,
	       (unsigned long long)acc, t->batched ? " (batched order)" : "");
	if (o->expert_bytes) {
		char b[32];

		printf("           expert %s, read %.1f GB/s\n",
		       st_format_bytes(o->expert_bytes, b, sizeof(b)),
		       o->read_gbps);
	} else {
		printf("           bytes moved and stall need --expert-bytes "
		       "or --store\n");
	}
}

static void print_row(const struct result *r, const struct replay_opts *o)
{
	const struct es_replay_stats *s = &r->st;
	uint64_t loads = s->misses + s->prefetch_loads;
	char b[32];

	printf("  %-*s %-*s %8.4f %10llu %10llu %10llu %7.3f", o->name_w,
	       r->policy, o->sees_w, r->online, s->accesses ? (double)s->hits / (double)s->accesses :
	       0.0, (unsigned long long)loads, (unsigned long long)s->misses,
	       (unsigned long long)s->prefetch_loads, r->ratio);
	if (o->expert_bytes)
		printf(" %11s %9.3f\n",
		       st_format_bytes(loads * o->expert_bytes, b, sizeof(b)),
		       (double)s->misses * (double)o->expert_bytes /
		       (o->read_gbps * 1e9));
	else
		printf(" %11s %9s\n", "-", "-");
}

static json_t *result_json(const struct result *r,
			   const struct replay_opts *o)
{
	const struct es_replay_stats *s = &r->st;
	uint64_t loads = s->misses + s->prefetch_loads;
	json_t *j = json_pack(
		"{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f}",
		"policy", r->policy, "online", r->online,
		"split", r->split_layer ? "per-layer" : "global",
		"slots", (json_int_t)r->slots,
		"accesses", (json_int_t)s->accesses,
		"hits", (json_int_t)s->hits,
		"misses", (json_int_t)s->misses,
		"prefetch_loads", (json_int_t)s->prefetch_loads,
		"prefetch_used", (json_int_t)s->prefetch_used,
		"loads", (json_int_t)loads,
		"hit_rate", s->accesses ? (double)s->hits /
			(double)s->accesses : 0.0,
		"ratio_to_belady", r->ratio);

	if (j && !o->by_slots)
		json_object_set_new(j, "budget_percent", json_real(r->pct));
	if (j)
		json_object_set_new(j, "prefetch_wasted",
				    json_integer((json_int_t)s->prefetch_wasted));
	if (j && r->pol && r->pol->draft_len) {
		json_object_set_new(j, "draft_len",
				    json_integer(r->pol->draft_len));
		json_object_set_new(j, "draft_accept",
				    json_real(r->pol->draft_accept));
		json_object_set_new(j, "draft_schedule", json_string(
			r->pol->draft_per_step ? "step" : "token"));
		json_object_set_new(j, "draft_events",
				    json_integer((json_int_t)s->draft_events));
		json_object_set_new(j, "draft_accepted", json_integer(
			(json_int_t)s->draft_accepted));
	}
	if (j && o->expert_bytes) {
		json_object_set_new(j, "bytes_moved",
				    json_integer((json_int_t)(loads *
							      o->expert_bytes)));
		json_object_set_new(j, "stall_s", json_real(
			(double)s->misses * (double)o->expert_bytes /
			(o->read_gbps * 1e9)));
	}
	return j;
}

static int run_all(const struct es_trace *t, const struct replay_opts *o,
		   int n_paths, const char *first)
{
	json_t *arr = o->json ? json_array() : NULL;
	int splits[2], n_splits = 0, rc = 0;
	char la_tag[32];

	snprintf(la_tag, sizeof(la_tag), "lookahead %d", o->lookahead);
	if (o->split_global)
		splits[n_splits++] = 0;
	if (o->split_layer)
		splits[n_splits++] = 1;
	if (!o->json)
		print_header(t, n_paths, first, o);

	for (int si = 0; si < n_splits && !rc; si++)
		for (int b = 0; b < o->n_budgets && !rc; b++) {
			struct es_replay_opts ro = {
				.per_layer = splits[si],
				.lookahead = o->lookahead,
				.prefetch = o->prefetch };
			struct result bel = { .policy = "belady",
					      .online = "offline" };
			struct st_diag diag = { "" };
			uint64_t bel_loads;
			int e;

			ro.n_slots = o->by_slots ? o->slots[b] :
				(uint32_t)((double)t->n_layers * t->n_experts *
					   o->pct[b] / 100.0 + 1e-9);
			bel.split_layer = splits[si];
			bel.pct = o->pct[b];
			bel.slots = ro.n_slots;
			e = es_replay_run(t, ES_RP_BELADY, &ro, &bel.st, &diag);
			if (e < 0) {
				fprintf(stderr, "strata replay: %s\n",
					diag.msg[0] ? diag.msg : st_strerror(e));
				rc = 1;
				break;
			}
			bel_loads = bel.st.misses;
			bel.ratio = 1.0;
			if (!o->json) {
				printf("\n%s pool, ", splits[si] ? "per-layer" :
				       "global");
				if (o->by_slots)
					printf("%u slots", ro.n_slots);
				else
					printf("budget %g%% = %u slots",
					       o->pct[b], ro.n_slots);
				if (splits[si])
					printf(" (%u per layer)",
					       ro.n_slots / (uint32_t)t->n_layers);
				printf(":\n  %-*s %-*s %8s %10s %10s %10s %7s "
				       "%11s %9s\n", o->name_w, "policy",
				       o->sees_w, "online",
				       "hit rate", "loads", "demand", "prefetch",
				       "xBelady", "bytes moved", "stall s");
				print_row(&bel, o);
			} else {
				json_array_append_new(arr, result_json(&bel, o));
			}
			for (int pi = 0; pi < o->n_pols; pi++) {
				struct result r = {
					.pol = &o->pols[pi],
					.policy = o->pols[pi].name,
					.online = o->pols[pi].la ? la_tag :
						  "past only",
					.split_layer = splits[si],
					.pct = o->pct[b], .slots = ro.n_slots };
				struct es_replay_opts po = ro;
				char seen[32];

				if (!o->pols[pi].la)
					po.lookahead = 0;
				if (o->pols[pi].base == ES_RP_FUTURE) {
					po.window_tokens = o->pols[pi].window;
					snprintf(seen, sizeof(seen), "sees %d tok",
						 o->pols[pi].window);
					r.online = seen;
				}
				if (o->pols[pi].draft_len) {
					po.draft_len = o->pols[pi].draft_len;
					po.draft_accept =
						o->pols[pi].draft_accept;
					po.draft_per_step =
						o->pols[pi].draft_per_step;
					po.draft_no_wrong = o->draft_no_wrong;
					po.draft_prefetch = o->draft_prefetch;
					po.draft_seed = o->draft_seed;
					r.online = o->pols[pi].sees;
				}
				if (isatty(2) && !o->json)
					fprintf(stderr, "  replaying %s...\r",
						r.policy);
				e = es_replay_run(t, o->pols[pi].base, &po,
						  &r.st, &diag);
				if (e < 0) {
					fprintf(stderr, "strata replay: %s: "
						"%s\n", r.policy, diag.msg[0] ?
						diag.msg : st_strerror(e));
					rc = 1;
					break;
				}
				r.ratio = bel_loads ? (double)(r.st.misses +
					r.st.prefetch_loads) /
					(double)bel_loads : 1.0;
				if (o->json)
					json_array_append_new(arr,
							      result_json(&r, o));
				else
					print_row(&r, o);
			}
			if (isatty(2) && !o->json)
				fprintf(stderr, "%40s\r", "");
		}
	if (o->json && !rc) {
		json_t *top = json_pack(
			"{s:s, s:i, s:i, s:i, s:i, s:I, s:i, s:o}",
			"formats", t->formats, "tokens", (int)t->n_tokens,
			"layers", t->n_layers, "experts", t->n_experts,
			"top_k", t->top_k, "steps", (json_int_t)t->n_steps,
			"lookahead", o->lookahead, "results", arr);

		arr = NULL;
		json_dumpf(top, stdout, JSON_INDENT(2));
		printf("\n");
		json_decref(top);
	}
	json_decref(arr);
	return rc;
}

int cli_cmd_replay(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "budget", required_argument, NULL, 'b' },
		{ "slots", required_argument, NULL, 'n' },
		{ "split", required_argument, NULL, 's' },
		{ "policy", required_argument, NULL, 'p' },
		{ "lookahead", required_argument, NULL, 'd' },
		{ "no-prefetch", no_argument, NULL, 'P' },
		{ "expert-bytes", required_argument, NULL, 'e' },
		{ "store", required_argument, NULL, 'S' },
		{ "read-gbps", required_argument, NULL, 'g' },
		{ "future", required_argument, NULL, 'f' },
		{ "draft", required_argument, NULL, 'D' },
		{ "draft-policy", required_argument, NULL, 'Q' },
		{ "draft-schedule", required_argument, NULL, 'C' },
		{ "draft-no-wrong", no_argument, NULL, 'W' },
		{ "draft-prefetch", no_argument, NULL, 'F' },
		{ "draft-seed", required_argument, NULL, 'R' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct replay_opts o = { .split_global = 1, .split_layer = 1,
				 .lookahead = 1, .prefetch = 1,
				 .read_gbps = DEFAULT_READ_GBPS };
	const char *store = NULL, *policies = "all", *future = NULL;
	const char *draft = NULL, *draft_pols = "hist", *draft_sched = "both";
	struct es_trace t;
	struct st_diag diag = { "" };
	int c, e, store_layers = 0, store_experts = 0;

	o.pct[0] = 25;
	o.pct[1] = 50;
	o.n_budgets = 2;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		char *end;

		switch (c) {
		case 'b':
		case 'n':
			if (parse_budgets(&o, optarg, c == 'n') < 0)
				return 2;
			break;
		case 's':
			o.split_global = !strcmp(optarg, "global") ||
					 !strcmp(optarg, "both");
			o.split_layer = !strcmp(optarg, "per-layer") ||
					!strcmp(optarg, "both");
			if (!o.split_global && !o.split_layer) {
				fprintf(stderr, "strata replay: --split '%s': "
					"use global, per-layer or both\n",
					optarg);
				return 2;
			}
			break;
		case 'p':
			policies = optarg;
			break;
		case 'd':
			o.lookahead = (int)strtol(optarg, &end, 10);
			if (*end || o.lookahead < 1 || o.lookahead > 8) {
				fprintf(stderr, "strata replay: --lookahead "
					"'%s': a number of layers from 1 to 8\n",
					optarg);
				return 2;
			}
			break;
		case 'P':
			o.prefetch = 0;
			break;
		case 'e':
			if (st_parse_size(optarg, &o.expert_bytes) < 0 ||
			    !o.expert_bytes) {
				fprintf(stderr, "strata replay: --expert-bytes "
					"'%s' is not a size (e.g. 4MiB, "
					"4194304)\n", optarg);
				return 2;
			}
			break;
		case 'S':
			store = optarg;
			break;
		case 'g':
			o.read_gbps = strtod(optarg, &end);
			if (*end || !(o.read_gbps > 0)) {
				fprintf(stderr, "strata replay: --read-gbps "
					"'%s' is not a positive number of "
					"GB/s\n", optarg);
				return 2;
			}
			break;
		case 'f':
			future = optarg;
			break;
		case 'D':
			draft = optarg;
			break;
		case 'Q':
			draft_pols = optarg;
			break;
		case 'C':
			draft_sched = optarg;
			break;
		case 'W':
			o.draft_no_wrong = 1;
			break;
		case 'F':
			o.draft_prefetch = 1;
			break;
		case 'R':
			o.draft_seed = strtoull(optarg, &end, 0);
			if (*end || !o.draft_seed) {
				fprintf(stderr, "strata replay: --draft-seed "
					"'%s' is not a positive integer\n",
					optarg);
				return 2;
			}
			break;
		case 'j':
			o.json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		fprintf(stderr, "strata replay: no trace file given\n\n");
		usage(stderr);
		return 2;
	}
	if (parse_policies(&o, policies) < 0 ||
	    (future && parse_future(&o, future) < 0) ||
	    (draft && parse_draft(&o, draft, draft_pols, draft_sched) < 0))
		return 2;
	if (store) {
		struct st_store *s = NULL;

		e = st_store_open(store, &s, &diag);
		if (e < 0) {
			fprintf(stderr, "strata replay: %s\n", diag.msg[0] ?
				diag.msg : st_strerror(e));
			return 1;
		}
		o.expert_bytes = s->record_bytes;
		store_layers = s->n_layers;
		store_experts = s->n_experts;
		st_store_close(s);
	}
	e = es_trace_read((const char *const *)argv + optind, argc - optind,
			  &t, &diag);
	if (e < 0) {
		fprintf(stderr, "strata replay: %s\n", diag.msg[0] ? diag.msg :
			st_strerror(e));
		return 1;
	}
	if (store && (store_layers != t.n_layers ||
		      store_experts != t.n_experts))
		fprintf(stderr, "strata replay: note: the store has %d MoE "
			"layers x %d experts, the trace %d x %d; only its expert "
			"size is used\n", store_layers, store_experts,
			t.n_layers, t.n_experts);
	o.name_w = 10;
	o.sees_w = 12;
	for (int pi = 0; pi < o.n_pols; pi++) {
		int n = (int)strlen(o.pols[pi].name),
		    m = (int)strlen(o.pols[pi].sees);

		if (n > o.name_w)
			o.name_w = n;
		if (m > o.sees_w)
			o.sees_w = m;
	}
	e = run_all(&t, &o, argc - optind, argv[optind]);
	es_trace_fini(&t);
	return e;
}
