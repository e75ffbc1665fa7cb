/*
 * cw_main.c — the computed daemon: owns the dense weights, the compute
 * backend and the request APIs (nanomsg REP socket <run_dir>/computed.ctl,
 * and the OpenAI-compatible HTTP API when --http-port is given).  Both feed
 * one continuous-batching scheduler (cw_sched.h).  Reads top to bottom:
 * parse options, connect to expertd and kvd, open the model, start the
 * scheduler and the HTTP server, serve, tear down.
 */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cw_chat.h"
#include "cw_cuda_experts.h"
#include "cw_devpool.h"
#include "cw_gen.h"
#include "cw_http.h"
#include "cw_kvdev.h"
#include "cw_kvrow.h"
#include "cw_metrics.h"
#include "cw_model.h"
#include "cw_proto.h"
#include "cw_sampler.h"
#include "cw_routing.h"
#include "cw_sched.h"
#include "cw_session.h"
#include "cw_timeline.h"
#include "es_client.h"
#include "kv_client.h"
#include "st_build_config.h"
#include "st_cuda.h"
#include "st_daemon.h"
#include "st_ioq.h"
#include "st_log.h"
#include "st_msg.h"
#include "st_numa.h"
#include "st_sdnotify.h"
#include "st_store.h"
#include "st_tokenizer.h"
#include "st_util.h"

#define CW_MAX_GENS 64
#define CW_GEN_IDLE_NS (300ull * 1000000000ull) /* reclaim abandoned ones */

struct cw_gen_slot {
	struct cw_sched_req *gen; /* owned (cw_sched_release); NULL when free */
	uint32_t id;
	uint64_t last_use_ns;
	enum cw_finish finish;    /* once its last event was taken */
	int n_generated;
};

struct cw_daemon {
	char instance[64];
	char run_dir[4096];
	char store_dir[4096];
	struct cw_model_opts mopts;
	int restart_wait_ms;      /* wait for a restarted expertd / kvd */
	int timeout_ms;
	int connect_timeout_ms;
	const char *numa;         /* --numa text, NULL: no binding */
	int no_expert_overlap;    /* --no-expert-overlap */
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *model;
	struct st_tokenizer *tok;
	struct st_sock rep, pub;
	int sigfd;
	int stop;
	struct cw_gen_slot gens[CW_MAX_GENS];
	uint32_t next_gen_id;
	uint64_t prefill_ns, decode_ns;
	struct cw_routing_opts ropts;
	int prefetch_depth_given;      /* --prefetch-depth on the command line */
	struct cw_routing *routing;
	/* serving: scheduler, HTTP API, metrics */
	struct cw_sched_opts sopts;
	struct cw_http_opts hopts;
	char chat_name[32];
	char model_name[256];
	struct kv_session_ident session_ident; /* saved sessions */
	struct cw_metrics metrics;
	struct cw_sched *sched;
	struct cw_http *http;
	/* device pools (issue 10, cw_devpool.h): NULL on the CPU */
	const char *device_budget, *device_kv_budget;
	struct cw_devpool *dev;
	struct cw_cuda_module_handle cumod; /* the CUDA module, when used */
	struct cw_cuda_experts *cuexp;
	struct cw_kvdev *kvdev;       /* device KV pages for attention */
	struct cw_cuda_attn *cuattn;  /* the module's attention, real GPU */
	/* --timeline FILE: the step timeline (issue 25, cw_timeline.h) */
	const char *timeline_path;
	FILE *timeline;
	struct cw_steptime steptime;
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: computed --store DIR [options]\n"
"\n"
"The compute worker of a strata instance: dense weights, CPU kernels,\n"
"generation.  Needs expertd and kvd of the same instance running.\n"
"A DeepSeek-V4 store is served with --kv-dtype f32 (reference or fast\n"
"compute; no --route-* / --lookahead-*); its state is in kvd\n"
"pages (prefix cache, spill and kvd restarts as for the other families).\n"
"\n"
"Options:\n"
"  --store DIR            strata store (made by 'strata convert')\n"
"  --instance NAME        instance name (default: %s)\n"
"  --run-dir DIR          run directory (default: per instance, see docs)\n"
"  --kv-dtype TYPE        KV rows: f32 (reference mode, default), f16, bf16,\n"
"                         fp8 (E4M3, one scale per row and KV head)\n"
"  --compute MODE         reference (exact, default) or fast (int8\n"
"                         activations for FP4 experts, SIMD kernels, FMA)\n"
"  --exact-math           DeepSeek-V4/V4.1: none of the official code's\n"
"                         quantization round trips (the fixtures' strict\n"
"                         references); default: the official math\n"
"  --no-expert-overlap    acquire a layer's experts all at once, then\n"
"                         compute them (default: each as its slot is\n"
"                         ready, the shared expert while misses load;\n"
"                         the same results, for comparisons)\n"
"  --page-rows N          KV rows per page (default 16)\n"
"  --connect-timeout SEC  wait this long for expertd/kvd (default 30)\n"
"  --restart-wait SEC     when expertd or kvd dies, wait this long for it to\n"
"                         be restarted, then go on with the requests in\n"
"                         flight (default 60; 0 = fail them at once)\n"
"  --threads N            compute threads (default: online CPUs); results\n"
"                         do not depend on it\n"
"  --numa auto|N|interleave  bind the threads to a NUMA node's cores and\n"
"                         memory (default: no binding)\n"
"  --prefetch-depth D     gate look-ahead: hint expertd the experts of the\n"
"                         next D layers (default 2, 0 = off; DeepSeek-V4/\n"
"                         V4.1 stores: 0 unless given)\n"
"  --lookahead-measure    count look-ahead hits for 1..3 layers ahead\n"
"  --route-trace FILE     forced routing: each layer's experts from a JSONL\n"
"                         trace ({\"pos\",\"layer\",\"experts\",\"weights\"})\n"
"  --route-record FILE    write the routing applied as such a trace\n"
"  --lookahead-oracle     benchmarks: hint the trace's experts instead of\n"
"                         probing the routers (needs --route-trace)\n"
"\n"
"GPU (CUDA builds; without a device computed says so once and uses the CPU):\n"
"  --device-budget B      device expert slots: a share of all experts\n"
"                         (\"25%%\") or bytes (\"40GiB\"); default: 100%%,\n"
"                         capped at 80%% of free device memory; \"0\" = CPU\n"
"  --device-kv-budget B   device KV page pool bytes (default 256MiB, 0 = none):\n"
"                         attention reads the rows kvd places there\n"
"\n"
"Serving (continuous batching; both APIs share the scheduler):\n"
"  --http-port N          serve the OpenAI-compatible HTTP API on port N\n"
"                         (default: off; no HTTP listener)\n"
"  --http-bind ADDR       IPv4 address to bind (default 127.0.0.1)\n"
"  --api-key KEY          require 'Authorization: Bearer KEY' (default:\n"
"                         $STRATA_API_KEY; none when unset)\n"
"  --model-name NAME      model id in the API (default: the store's name)\n"
"  --chat-template T      chatml, mixtral, deepseek, plain or none (default:\n"
"                         tokenizer_config.json's chat_template, else plain:\n"
"                         'User: ..' / 'Assistant:' text); one whose special\n"
"                         tokens the vocabulary lacks is refused at start\n"
"  --max-running N        sequences decoding at once (default 32)\n"
"  --max-queued N         requests waiting beyond those (default 256;\n"
"                         more get HTTP 429)\n"
"  --max-step-tokens N    tokens per forward step: decode tokens, then\n"
"                         prefill chunks (default 128)\n"
"  --kv-restore-ahead on|off  with a kvd spill file, steps pin at most half\n"
"                         of kvd's pool and running sequences take turns;\n"
"                         on (default): kvd restores the next step's\n"
"                         spilled pages while this step computes; off:\n"
"                         each step's pin restores them, the step waiting\n"
"                         for them; on also restores the cached prompt\n"
"                         prefixes of requests about to be admitted\n"
"  --speculate S          speculative decoding: off (default), ngram or\n"
"                         ngram:K (up to K prompt-lookup draft tokens\n"
"                         verified per step, 1..16; ngram = ngram:4); greedy\n"
"                         output unchanged, sampling keeps its distribution;\n"
"                         auto or auto:K: the length (0..K) priced per\n"
"                         request in step time and expert bytes, off where\n"
"                         drafts do not pay, with periodic probes; mtp or\n"
"                         mtp:K:\n"
"                         drafts from the store's MTP block (DeepSeek-V4\n"
"                         converted with its mtp.0.*; refused without)\n"
"  --draft-max K          the same as --speculate ngram:K (0 = off)\n"
"  --max-body BYTES       largest HTTP request body (default 1048576;\n"
"                         larger get HTTP 413)\n"
"  --metrics-auth         /metrics wants the API key too (default: only\n"
"                         the /v1 endpoints do, as vLLM)\n"
"  --http-request-timeout SEC  a client must send its whole request within\n"
"                         SEC of connecting or of its last response, else\n"
"                         it is disconnected (default 30)\n"
"  --http-idle-timeout SEC  a connection without a byte either way for SEC\n"
"                         is closed (default 60)\n"
"  --http-max-client-conns N  connections at once per client address\n"
"                         (default 64; of 256 in all; 0: none, for a front\n"
"                         that limits, as strata up's)\n"
"  --timeline FILE        the step timeline: one TSV row per forward step\n"
"                         (cw_timeline.h: where its wall time went, page\n"
"                         faults, expertd's loader CPU; the phases of the\n"
"                         non-DeepSeek families), for `strata run\n"
"                         --timeline` and scripts/plot-timeline.gp\n"
"  --version              print the version and exit\n"
"  -h, --help             this text\n"
"\n"
"Stops cleanly on SIGTERM/SIGINT or a SHUTDOWN request.\n",
		ST_DEFAULT_INSTANCE);
}

static int parse_args(struct cw_daemon *d, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "store", required_argument, NULL, 's' },
		{ "instance", required_argument, NULL, 'i' },
		{ "run-dir", required_argument, NULL, 'r' },
		{ "kv-dtype", required_argument, NULL, 'k' },
		{ "compute", required_argument, NULL, 'C' },
		{ "page-rows", required_argument, NULL, 'p' },
		{ "restart-wait", required_argument, NULL, 'w' },
		{ "connect-timeout", required_argument, NULL, 'c' },
		{ "threads", required_argument, NULL, 't' },
		{ "numa", required_argument, NULL, 'N' },
		{ "prefetch-depth", required_argument, NULL, 0x301 },
		{ "lookahead-measure", no_argument, NULL, 0x302 },
		{ "route-trace", required_argument, NULL, 0x303 },
		{ "route-record", required_argument, NULL, 0x304 },
		{ "lookahead-oracle", no_argument, NULL, 0x305 },
		{ "http-port", required_argument, NULL, 'P' },
		{ "http-bind", required_argument, NULL, 'B' },
		{ "api-key", required_argument, NULL, 'A' },
		{ "model-name", required_argument, NULL, 'M' },
		{ "chat-template", required_argument, NULL, 'T' },
		{ "max-running", required_argument, NULL, 'R' },
		{ "max-queued", required_argument, NULL, 'Q' },
		{ "max-step-tokens", required_argument, NULL, 'S' },
		{ "max-body", required_argument, NULL, 'L' },
		{ "metrics-auth", no_argument, NULL, 0x308 },
		{ "http-request-timeout", required_argument, NULL, 0x309 },
		{ "http-idle-timeout", required_argument, NULL, 0x30a },
		{ "http-max-client-conns", required_argument, NULL, 0x30b },
		{ "device-budget", required_argument, NULL, 0x306 },
		{ "device-kv-budget", required_argument, NULL, 0x307 },
		{ "timeline", required_argument, NULL, 0x30c },
		{ "kv-restore-ahead", required_argument, NULL, 0x30d },
		{ "speculate", required_argument, NULL, 0x30e },
		{ "draft-max", required_argument, NULL, 0x30f },
		{ "exact-math", no_argument, NULL, 0x310 },
		{ "no-expert-overlap", no_argument, NULL, 0x311 },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	int c;

	snprintf(d->instance, sizeof(d->instance), "%s", ST_DEFAULT_INSTANCE);
	d->mopts.kv_dtype = ST_DTYPE_F32;
	d->mopts.page_rows = 16;
	d->mopts.n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (d->mopts.n_threads < 1)
		d->mopts.n_threads = 1;
	d->timeout_ms = 10000;
	d->connect_timeout_ms = 30000;
	d->ropts.prefetch_depth = CW_DEFAULT_PREFETCH_DEPTH;
	d->restart_wait_ms = 60000;
	d->sopts.max_running = 32;
	d->sopts.max_queued = 256;
	d->sopts.max_step_tokens = 128;
	d->sopts.kv_restore_ahead = 1;
	d->hopts.bind_addr = "127.0.0.1";
	d->hopts.instance = d->instance;
	d->hopts.api_key = getenv("STRATA_API_KEY");
	d->hopts.max_body_bytes = 1 << 20;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': snprintf(d->store_dir, sizeof(d->store_dir), "%s", optarg); break;
		case 'i': snprintf(d->instance, sizeof(d->instance), "%s", optarg); break;
		case 'r': snprintf(d->run_dir, sizeof(d->run_dir), "%s", optarg); break;
		case 'k':
			if (cw_kvrow_parse_dtype(optarg, &d->mopts.kv_dtype) < 0) {
				st_err("--kv-dtype must be f32, f16, bf16 or "
				       "fp8, not '%s'", optarg);
				return -EINVAL;
			}
			break;
		case 'p': {
			long v = strtol(optarg, NULL, 10);

			if (v < 1 || v > 4096) {
				st_err("--page-rows must be 1..4096");
				return -EINVAL;
			}
			d->mopts.page_rows = (uint32_t)v;
			break;
		}
		case 'c': {
			long v = strtol(optarg, NULL, 10);

			if (v < 1 || v > 3600) {
				st_err("--connect-timeout must be 1..3600 s");
				return -EINVAL;
			}
			d->connect_timeout_ms = (int)v * 1000;
			break;
		}
		case 'w': {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (end == optarg || *end || v < 0 || v > 3600) {
				st_err("--restart-wait must be 0..3600 s");
				return -EINVAL;
			}
			d->restart_wait_ms = (int)v * 1000;
			break;
		}
		case 'C':
			if (cw_compute_parse(optarg, &d->mopts.compute) < 0) {
				st_err("--compute must be reference or fast, "
				       "not '%s'", optarg);
				return -EINVAL;
			}
			break;
		case 't': {
			long v = strtol(optarg, NULL, 10);

			if (v < 1 || v > 256) {
				st_err("--threads must be 1..256");
				return -EINVAL;
			}
			d->mopts.n_threads = (int)v;
			break;
		}
		case 'N': d->numa = optarg; break;
		case 0x301: {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (end == optarg || *end || v < 0 ||
			    v > CW_LOOKAHEAD_MAX_DEPTH) {
				st_err("--prefetch-depth must be 0..%d",
				       CW_LOOKAHEAD_MAX_DEPTH);
				return -EINVAL;
			}
			d->ropts.prefetch_depth = (int)v;
			d->prefetch_depth_given = 1;
			break;
		}
		case 0x302: d->ropts.measure = 1; break;
		case 0x303: d->ropts.trace_path = optarg; break;
		case 0x304: d->ropts.record_path = optarg; break;
		case 0x305: d->ropts.oracle = 1; break;
		case 0x306: d->device_budget = optarg; break;
		case 0x307: d->device_kv_budget = optarg; break;
		case 0x308: d->hopts.metrics_auth = 1; break;
		case 0x30c: d->timeline_path = optarg; break;
		case 0x30d:
			if (st_parse_bool(optarg) < 0) {
				st_err("--kv-restore-ahead '%s': must be "
				       ST_BOOL_WORDS, optarg);
				return -EINVAL;
			}
			d->sopts.kv_restore_ahead = st_parse_bool(optarg);
			break;
		case 0x309: case 0x30a: case 0x30b: {
			char *end;
			long long v = strtoll(optarg, &end, 10);
			const char *name = c == 0x309 ? "http-request-timeout" :
					   c == 0x30a ? "http-idle-timeout" :
					   "http-max-client-conns";
			long long hi = c == 0x30b ? 256 : 86400;

			/* --http-max-client-conns 0: no per-client limit
			 * (behind strata up's HTTP front, which limits) */
			if (*end || end == optarg || v < (c == 0x30b ? 0 : 1) ||
			    v > hi) {
				st_err("--%s must be %d..%lld, not '%s'", name,
				       c == 0x30b ? 0 : 1, hi, optarg);
				return -EINVAL;
			}
			if (c == 0x309)
				d->hopts.request_timeout_s = (int)v;
			else if (c == 0x30a)
				d->hopts.idle_timeout_s = (int)v;
			else
				d->hopts.max_client_connections =
					v ? (int)v : -1;
			break;
		}
		case 'P': case 'R': case 'Q': case 'S': case 'L': {
			char *end;
			long long v = strtoll(optarg, &end, 10);
			long long hi = c == 'P' ? 65535 : c == 'L' ? (1ll << 30) :
				       c == 'Q' ? 100000 : 4096;

			if (*end || v < 1 || v > hi) {
				st_err("--%s must be 1..%lld, not '%s'",
				       c == 'P' ? "http-port" :
				       c == 'R' ? "max-running" :
				       c == 'Q' ? "max-queued" :
				       c == 'S' ? "max-step-tokens" : "max-body",
				       hi, optarg);
				return -EINVAL;
			}
			if (c == 'P')
				d->hopts.port = (int)v;
			else if (c == 'R')
				d->sopts.max_running = (int)v;
			else if (c == 'Q')
				d->sopts.max_queued = (int)v;
			else if (c == 'S')
				d->sopts.max_step_tokens = (int)v;
			else
				d->hopts.max_body_bytes = (size_t)v;
			break;
		}
		case 0x30e:
			if (cw_draft_parse_src(optarg, &d->sopts.draft_max,
					       &d->sopts.draft_price,
					       &d->sopts.draft_mtp) < 0) {
				st_err("--speculate must be off, ngram, "
				       "ngram:K, auto, auto:K, mtp or mtp:K "
				       "(K 1..%d), not '%s'",
				       CW_DRAFT_MAX, optarg);
				return -EINVAL;
			}
			break;
		case 0x30f: {
			char *end;
			long v = strtol(optarg, &end, 10);

			if (*end || end == optarg || v < 0 ||
			    v > CW_DRAFT_MAX) {
				st_err("--draft-max must be 0..%d, not '%s'",
				       CW_DRAFT_MAX, optarg);
				return -EINVAL;
			}
			d->sopts.draft_max = (int)v;
			d->sopts.draft_price = 0;
			d->sopts.draft_mtp = 0;
			break;
		}
		case 0x310: d->mopts.exact_math = 1; break;
		case 0x311: d->no_expert_overlap = 1; break;
		case 'B': d->hopts.bind_addr = optarg; break;
		case 'A': d->hopts.api_key = optarg; break;
		case 'M': snprintf(d->model_name, sizeof(d->model_name), "%s", optarg); break;
		case 'T': {
			enum cw_chat_template t;

			if (strcmp(optarg, "auto") &&
			    cw_chat_parse(optarg, &t) < 0) {
				st_err("--chat-template must be chatml, mixtral, "
				       "deepseek, plain or none, not '%s'", optarg);
				return -EINVAL;
			}
			snprintf(d->chat_name, sizeof(d->chat_name), "%s", optarg);
			break;
		}
		case 'h': usage(stdout); exit(0);
		case 'V': printf("computed %s\n", ST_VERSION); exit(0);
		default:
			fprintf(stderr, "see computed --help\n");
			return -EINVAL;
		}
	}
	if (optind < argc) {
		st_err("unexpected argument '%s' (see --help)", argv[optind]);
		return -EINVAL;
	}
	if (!d->store_dir[0]) {
		st_err("--store DIR is required (see --help)");
		return -EINVAL;
	}
	if (!d->run_dir[0] &&
	    st_run_dir_default(d->instance, d->run_dir, sizeof(d->run_dir)) < 0)
		return -ENAMETOOLONG;
	return 0;
}

/* Connects to expertd and kvd, waiting for them to come up. */
static int connect_tiers(struct cw_daemon *d)
{
	uint64_t deadline = st_now_ns() + (uint64_t)d->connect_timeout_ms * 1000000ull;
	struct st_diag diag = { "" };
	int r;

	for (;;) {
		if (!d->es)
			r = es_client_open(d->run_dir, d->instance, "computed",
					   d->timeout_ms, &d->es, &diag);
		else
			r = 0;
		if (r == 0 && !d->kv)
			r = kv_client_open(d->run_dir, d->instance, "computed",
					   d->timeout_ms, &d->kv, &diag);
		if (r == 0)
			return 0;
		if (st_now_ns() > deadline || st_stop_signals_pending(d->sigfd)) {
			st_err("cannot reach %s of instance '%s' in %s: %s (%s); "
			       "start it first (strata up)",
			       d->es ? "kvd" : "expertd", d->instance,
			       d->run_dir, diag.msg, st_strerror(r));
			return r;
		}
		st_sleep_ns(100000000ull);
	}
}

static struct cw_gen_slot *find_gen(struct cw_daemon *d, uint32_t id)
{
	for (int i = 0; i < CW_MAX_GENS; i++)
		if (d->gens[i].gen && d->gens[i].id == id)
			return &d->gens[i];
	return NULL;
}

static void end_gen(struct cw_daemon *d, struct cw_gen_slot *s)
{
	(void)d;
	cw_sched_release(s->gen); /* cancels it if still running */
	s->gen = NULL;
}

static int reply_error(struct cw_daemon *d, const struct st_msg_header *h,
		       int err, const char *msg)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	st_wbuf_str(&w, msg);
	r = st_rpc_reply(&d->rep, h, err, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}

static int handle_gen_start(struct cw_daemon *d, const struct st_msg_header *h,
			    const uint8_t *p)
{
	const struct st_model_config *c = cw_model_config(d->model);
	struct cw_gen_start_msg m;
	struct cw_gen_params gp = { 0 };
	struct st_diag diag = { "" };
	struct cw_gen_slot *slot = NULL;
	struct st_wbuf w;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int r, max_tokens;

	r = cw_gen_start_msg_decode(p, h->payload_len, &m);
	if (r < 0)
		return reply_error(d, h, r, "malformed GEN_START message");
	for (int i = 0; i < CW_MAX_GENS; i++)
		if (!d->gens[i].gen) {
			slot = &d->gens[i];
			break;
		}
	if (!slot) {
		cw_gen_start_msg_free(&m);
		return reply_error(d, h, -ST_E_BUSY,
				   "too many generations in flight");
	}
	gp.max_tokens = (int)m.max_tokens;
	gp.sampler.temperature = m.temperature;
	gp.sampler.top_k = m.top_k;
	gp.sampler.top_p = m.top_p;
	gp.sampler.seed = m.seed;
	gp.n_stop = (int)m.n_stop;
	for (uint32_t i = 0; i < m.n_stop; i++)
		gp.stop[i] = m.stop[i];
	gp.add_special = !!(m.flags & CW_GEN_F_ADD_SPECIAL);
	gp.parse_special = !!(m.flags & CW_GEN_F_PARSE_SPECIAL);
	gp.ignore_eos = !!(m.flags & CW_GEN_F_IGNORE_EOS);
	gp.prefix_cache = !(m.flags & CW_GEN_F_NO_PREFIX_CACHE);
	gp.draft_max = (int)((m.flags & CW_GEN_F_DRAFT_MASK) >>
			     CW_GEN_F_DRAFT_SHIFT) - 1; /* 0: default (-1) */
	gp.draft_price = !!(m.flags & CW_GEN_F_DRAFT_PRICE);
	gp.draft_mtp = !!(m.flags & CW_GEN_F_DRAFT_MTP);
	gp.kv_private = !!(m.flags & CW_GEN_F_KV_PRIVATE);
	r = st_tokenizer_encode(d->tok, m.prompt, strlen(m.prompt),
				gp.add_special, gp.parse_special, &ids, &n_ids);
	if (r < 0)
		st_diag_set(&diag, r, "cannot encode the prompt: %s",
			    st_strerror(r));
	else
		/* one event ahead at most: the client pulls tokens */
		r = cw_sched_submit(d->sched, ids, n_ids, &gp, 1, &slot->gen,
				    &diag);
	free(ids);
	cw_gen_start_msg_free(&m);
	cw_metrics_response(&d->metrics, CW_EP_REQREP, r < 0 ? 400 : 200);
	if (r < 0) {
		slot->gen = NULL;
		return reply_error(d, h, r, diag.msg);
	}
	/* as cw_gen_start will cut it: to the context left by the prompt */
	max_tokens = gp.max_tokens < 0 ? 0 : gp.max_tokens;
	if ((size_t)max_tokens > (size_t)c->max_position_embeddings - n_ids)
		max_tokens = c->max_position_embeddings - (int)n_ids;
	slot->id = ++d->next_gen_id;
	slot->last_use_ns = st_now_ns();
	slot->finish = CW_FINISH_NONE;
	slot->n_generated = 0;
	st_wbuf_init(&w);
	st_wbuf_u32(&w, slot->id);
	st_wbuf_u32(&w, (uint32_t)n_ids);
	st_wbuf_u32(&w, (uint32_t)max_tokens);
	r = st_rpc_reply(&d->rep, h, 0, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}

static int handle_gen_next(struct cw_daemon *d, const struct st_msg_header *h,
			   const uint8_t *p)
{
	struct cw_sched_event ev = { .token = -1 };
	struct cw_gen_slot *s;
	struct st_rbuf rb;
	struct st_wbuf w;
	uint32_t id;
	uint64_t t0;
	int r;

	st_rbuf_init(&rb, p, h->payload_len);
	if (st_rbuf_u32(&rb, &id) < 0 || st_rbuf_left(&rb))
		return reply_error(d, h, -ST_E_PROTO, "malformed GEN_NEXT");
	s = find_gen(d, id);
	if (!s)
		return reply_error(d, h, -ST_E_NOTFOUND,
				   "no such generation (finished, ended or "
				   "reclaimed)");
	t0 = st_now_ns();
	ev.finish = s->finish;
	ev.text = NULL;
	if (s->finish == CW_FINISH_NONE) {
		/* the scheduler steps it (batched with everything else);
		 * wait for its next event, still answering signals */
		while (!cw_sched_next_event(s->gen, 200, &ev)) {
			if (st_stop_signals_pending(d->sigfd)) {
				d->stop = 1;
				return reply_error(d, h, -ST_E_PEERGONE,
						   "computed is stopping");
			}
		}
		s->finish = ev.finish;
	}
	s->last_use_ns = st_now_ns();
	if (ev.finish == CW_FINISH_ERROR) {
		st_err("generation %u failed: %s", id, ev.err_msg);
		free(ev.text);
		return reply_error(d, h, ev.err ? ev.err : -EIO,
				   ev.err_msg[0] ? ev.err_msg :
				   "the generation failed");
	}
	if (ev.token >= 0)
		s->n_generated++;
	st_wbuf_init(&w);
	st_wbuf_i32(&w, ev.token);
	st_wbuf_u32(&w, (uint32_t)ev.finish);
	st_wbuf_u32(&w, (uint32_t)s->n_generated);
	st_wbuf_u64(&w, st_now_ns() - t0);
	st_wbuf_str(&w, ev.text ? ev.text : "");
	free(ev.text);
	r = st_rpc_reply(&d->rep, h, 0, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}

static int handle_gen_end(struct cw_daemon *d, const struct st_msg_header *h,
			  const uint8_t *p)
{
	struct cw_gen_slot *s;
	struct st_rbuf rb;
	uint32_t id;

	st_rbuf_init(&rb, p, h->payload_len);
	if (st_rbuf_u32(&rb, &id) < 0 || st_rbuf_left(&rb))
		return reply_error(d, h, -ST_E_PROTO, "malformed GEN_END");
	s = find_gen(d, id);
	if (s)
		end_gen(d, s);
	/* idempotent: ending an unknown id is not an error */
	return st_rpc_reply(&d->rep, h, 0, NULL, 0);
}

/* Log-softmax of one row of logits (lse accumulated in double). */
static double row_lse(const float *lg, int n)
{
	double mx = -INFINITY, sum = 0.0;

	for (int i = 0; i < n; i++)
		if (lg[i] > mx)
			mx = lg[i];
	for (int i = 0; i < n; i++)
		sum += exp((double)lg[i] - mx);
	return mx + log(sum);
}

/* Writes the log-softmax rows to <run_dir>/<name>.  0 or -errno. */
static int dump_logprobs(const struct cw_daemon *d, const char *name,
			 float *rows, int n_rows, int vocab)
{
	char path[4400];
	FILE *f;
	int r = 0;

	snprintf(path, sizeof(path), "%s/%s", d->run_dir, name);
	f = fopen(path, "we");
	if (!f)
		return -errno;
	for (int i = 0; i < n_rows && !r; i++) {
		float *row = rows + (size_t)i * vocab;
		float l = (float)row_lse(row, vocab);

		for (int v = 0; v < vocab; v++)
			row[v] -= l;
		if (fwrite(row, sizeof(float), (size_t)vocab, f) != (size_t)vocab)
			r = -EIO;
	}
	if (fclose(f) != 0 && !r)
		r = -errno;
	return r;
}

/* CW_MSG_SESSION (strata session): the JSON of /v1/sessions. */
static int handle_session(struct cw_daemon *d, const struct st_msg_header *h,
			  const uint8_t *p)
{
	struct st_diag diag = { "" };
	struct st_rbuf rb;
	struct st_wbuf w;
	uint32_t op, flags;
	char *name = NULL, *prompt = NULL, *txt;
	int32_t *ids = NULL;
	size_t n_ids = 0;
	int status = 500, r;
	json_t *j = NULL;

	st_rbuf_init(&rb, p, h->payload_len);
	if (st_rbuf_u32(&rb, &op) < 0 ||
	    st_rbuf_str(&rb, KV_SESSION_NAME_BYTES, &name) < 0 ||
	    st_rbuf_u32(&rb, &flags) < 0 ||
	    st_rbuf_str(&rb, CW_PROTO_MAX_PROMPT, &prompt) < 0 ||
	    st_rbuf_left(&rb) || op < KV_SESSION_SAVE ||
	    op > KV_SESSION_REMOVE) {
		free(name);
		free(prompt);
		return reply_error(d, h, -ST_E_PROTO,
				   "malformed SESSION message");
	}
	if (!d->kv || !d->sopts.session) {
		st_diag_set(&diag, -ST_E_UNSUPPORTED, "sessions need kvd");
		status = 503;
	} else if (op == KV_SESSION_SAVE) {
		r = st_tokenizer_encode(d->tok, prompt, strlen(prompt),
					!!(flags & CW_GEN_F_ADD_SPECIAL),
					!!(flags & CW_GEN_F_PARSE_SPECIAL),
					&ids, &n_ids);
		if (r < 0)
			st_diag_set(&diag, r, "cannot encode the prompt: %s",
				    st_strerror(r));
		else
			j = cw_session_save_ids(d->kv, d->sopts.session, name,
						ids, (int)n_ids, &status,
						&diag);
	} else {
		j = cw_session_http(d->kv, d->sopts.session,
				    op == KV_SESSION_LIST ? "GET" :
				    op == KV_SESSION_LOAD ? "POST" : "DELETE",
				    op == KV_SESSION_LIST ? NULL : name,
				    op == KV_SESSION_LOAD, &status, &diag);
	}
	free(name);
	free(prompt);
	free(ids);
	if (!j)
		return reply_error(d, h, status == 404 ? -ST_E_NOTFOUND :
				   status < 500 ? -EINVAL : -ST_E_PEERGONE,
				   diag.msg);
	txt = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!txt)
		return reply_error(d, h, -ENOMEM, "out of memory");
	st_wbuf_init(&w);
	st_wbuf_str(&w, txt);
	r = st_rpc_reply(&d->rep, h, 0, w.data, w.len);
	st_wbuf_fini(&w);
	free(txt);
	return r;
}

static int handle_score(struct cw_daemon *d, const struct st_msg_header *h,
			const uint8_t *p)
{
	const int vocab = cw_model_config(d->model)->vocab_size;
	struct st_diag diag = { "" };
	struct st_rbuf rb;
	struct st_wbuf w;
	uint32_t flags, n, seq, cached;
	char *name = NULL;
	int32_t *ids = NULL;
	float *all = NULL;
	double nll = 0.0;
	int r;

	st_rbuf_init(&rb, p, h->payload_len);
	if (st_rbuf_u32(&rb, &flags) < 0 || (flags & ~CW_SCORE_F_DUMP) ||
	    st_rbuf_str(&rb, 255, &name) < 0 || st_rbuf_u32(&rb, &n) < 0 ||
	    n < 2 || n > CW_PROTO_MAX_SCORE || st_rbuf_left(&rb) != 4ull * n ||
	    strchr(name, '/') || (flags & CW_SCORE_F_DUMP && (!name[0] ||
							   name[0] == '.'))) {
		free(name);
		return reply_error(d, h, -ST_E_PROTO, "malformed SCORE message");
	}
	ids = malloc(sizeof(int32_t) * n);
	all = malloc(sizeof(float) * (size_t)n * (size_t)vocab);
	if (!ids || !all) {
		r = reply_error(d, h, -ENOMEM, "out of memory for the window");
		goto out;
	}
	for (uint32_t i = 0; i < n; i++)
		st_rbuf_i32(&rb, &ids[i]);
	r = cw_model_seq_create(d->model, d->kv, ids, (int)n, 0, 0, (int)n,
				&seq, &cached, &diag);
	if (r == 0) {
		/* the scheduler's thread uses the model too */
		cw_sched_model_lock(d->sched);
		r = cw_model_eval(d->model, seq, 0, ids, (int)n, all, NULL,
				  &diag);
		cw_sched_model_unlock(d->sched);
		cw_model_seq_destroy(d->model, d->kv, seq);
	}
	if (r < 0) {
		r = reply_error(d, h, r, diag.msg);
		goto out;
	}
	st_wbuf_init(&w);
	for (uint32_t i = 1; i < n; i++) {
		const float *lg = all + (size_t)(i - 1) * vocab;

		nll += row_lse(lg, vocab) - lg[ids[i]];
	}
	st_wbuf_f64(&w, nll);
	st_wbuf_u32(&w, n - 1);
	for (uint32_t i = 1; i < n; i++)
		st_wbuf_u32(&w, (uint32_t)cw_argmax(all + (size_t)(i - 1) * vocab,
						    vocab));
	if (flags & CW_SCORE_F_DUMP) {
		r = dump_logprobs(d, name, all, (int)n - 1, vocab);
		if (r < 0) {
			st_wbuf_fini(&w);
			r = reply_error(d, h, r, "cannot write the log-probs");
			goto out;
		}
	}
	r = st_rpc_reply(&d->rep, h, 0, w.data, w.len);
	st_wbuf_fini(&w);
out:
	free(name);
	free(ids);
	free(all);
	return r;
}

static int handle_stats(struct cw_daemon *d, const struct st_msg_header *h)
{
	struct cw_stats_wire s = { 0 };
	struct cw_read_stats rs;
	struct es_stats es;
	struct kv_stats kv;
	struct st_wbuf w;
	int r;

	cw_model_read_stats(d->model, &rs);
	s.pid = (int32_t)getpid();
	s.peak_rss_bytes = st_peak_rss_bytes();
	pthread_mutex_lock(&d->metrics.lock);
	/* every generation the scheduler admitted: HTTP ones too */
	s.n_generations = d->metrics.gen_started;
	s.prompt_tokens = d->metrics.prompt_tokens;
	s.generated_tokens = d->metrics.generated_tokens;
	s.spec_steps = d->metrics.spec_steps;
	s.spec_verify_steps = d->metrics.spec_verify_steps;
	s.spec_drafted = d->metrics.spec_drafted;
	s.spec_accepted = d->metrics.spec_accepted;
	s.spec_bytes_verify = d->metrics.spec_bytes_verify;
	s.spec_bytes_plain = d->metrics.spec_bytes_plain;
	s.spec_tokens_verify = d->metrics.spec_tokens_verify;
	for (int k = 0; k <= CW_DRAFT_MAX; k++)
		s.spec_limit_sum += (uint64_t)k * d->metrics.spec_limit_hist[k];
	s.spec_limit_off = d->metrics.spec_limit_hist[0];
	s.prefill_ns = d->metrics.gen_prefill_ns;
	s.decode_ns = d->metrics.gen_decode_ns;
	pthread_mutex_unlock(&d->metrics.lock);
	s.expert_bytes = rs.expert_bytes;
	s.dense_bytes = rs.dense_bytes;
	s.lm_head_bytes = rs.lm_head_bytes;
	s.expert_stall_ns = rs.expert_stall_ns;
	cw_routing_stats(d->routing, d->es, &s);
	cw_model_kv_bytes_per_token(d->model, &s.kv_bytes_per_token,
				    &s.kv_formula_bytes_per_token);
	if (cw_model_dsv_math(d->model)) {
		const char *mn = cw_model_dsv_math(d->model);

		s.dsv_math = !strcmp(mn, "official") ? CW_STATS_MATH_OFFICIAL :
			     !strcmp(mn, "exact") ? CW_STATS_MATH_EXACT :
						     CW_STATS_MATH_CUSTOM;
	}
	if (es_client_stats(d->es, &es) == 0) {
		s.es_pid = es.pid;
		s.es_hits = es.hits;
		s.es_misses = es.misses;
		s.es_evictions = es.evictions;
		s.es_loads = es.loads;
		s.es_load_bytes = es.load_bytes;
		s.es_n_slots = es.n_slots;
		s.es_slots_used = es.slots_used;
		s.es_pool_bytes = es.pool_bytes;
		s.es_budget_bytes = es.budget_bytes;
	}
	if (cw_model_is_dsv41(d->model)) {
		struct es_engram_stats en;
		struct st_diag dg = { { 0 } };

		if (es_client_engram_stats(d->es, &en, &dg) == 0) {
			s.en_lookups = en.lookups;
			s.en_hits = en.hits;
			s.en_misses = en.misses;
			s.en_read_bytes = en.read_bytes;
			s.en_lat_p50_ns = en.lat_p50_ns;
			s.en_lat_p99_ns = en.lat_p99_ns;
		}
	}
	{
		/* the I/O queue of expertd and kvd (st_ioq.h): absent until
		 * one of them opened it */
		struct st_ioq_totals io;
		struct st_diag dg = { { 0 } };

		if (st_ioq_read_totals(d->instance, &io, &dg) == 0) {
			s.io_on = (uint64_t)st_ioq_mode(&io);
			s.io_bytes_demand = io.bytes[ST_IOQ_DEMAND];
			s.io_bytes_kv_restore = io.bytes[ST_IOQ_KV_RESTORE];
			s.io_bytes_prefetch = io.bytes[ST_IOQ_PREFETCH];
			s.io_bytes_kv_spill = io.bytes[ST_IOQ_KV_SPILL];
			s.io_wait_demand_ns = io.wait_ns[ST_IOQ_DEMAND];
			s.io_wait_kv_restore_ns = io.wait_ns[ST_IOQ_KV_RESTORE];
			s.io_wait_prefetch_ns = io.wait_ns[ST_IOQ_PREFETCH];
			s.io_wait_kv_spill_ns = io.wait_ns[ST_IOQ_KV_SPILL];
		}
	}
	if (kv_client_stats(d->kv, &kv) == 0) {
		s.kv_pid = kv.pid;
		s.kv_pages_used = kv.pages_used;
		s.kv_pages_peak = kv.pages_peak;
		s.kv_n_pages = kv.n_pages;
		s.kv_page_bytes = kv.page_bytes;
		s.kv_pool_bytes = kv.pool_bytes;
		s.kv_prefix_lookups = kv.prefix_lookups;
		s.kv_prefix_rows_reused = kv.prefix_rows_reused;
		s.kv_spill_pages_total = kv.spill_pages_total;
		s.kv_restore_pages_total = kv.restore_pages_total;
		s.kv_remote_on = kv.remote_on;
		s.kv_remote_hits = kv.remote_hits;
		s.kv_remote_misses = kv.remote_misses;
		s.kv_remote_bytes_in = kv.remote_bytes_in;
		s.kv_remote_bytes_out = kv.remote_bytes_out;
		s.kv_remote_errors = kv.remote_errors;
	}
	st_wbuf_init(&w);
	cw_stats_wire_encode(&w, &s);
	r = st_rpc_reply(&d->rep, h, 0, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}

static void handle_message(struct cw_daemon *d, const uint8_t *buf, size_t len)
{
	struct st_msg_header h;
	const uint8_t *p = buf + ST_PROTO_HEADER_BYTES;
	struct st_wbuf w;
	int r = st_proto_decode_header(buf, len, &h);

	if (r < 0) {
		/* answer even a malformed message, so the REQ side is not
		 * left waiting; echo what we could read */
		struct st_msg_header fake = { 0 };

		if (len >= 16)
			memcpy(&fake.type, buf + 6, 2), memcpy(&fake.request_id, buf + 8, 8);
		st_warn("malformed message (%zu bytes): %s", len, st_strerror(r));
		reply_error(d, &fake, r, "malformed message header");
		return;
	}
	switch (h.type) {
	case ST_MSG_PING:
		st_wbuf_init(&w);
		st_wbuf_u32(&w, (uint32_t)getpid());
		st_wbuf_u64(&w, 1);
		st_wbuf_u32(&w, 1);
		st_rpc_reply(&d->rep, &h, 0, w.data, w.len);
		st_wbuf_fini(&w);
		break;
	case ST_MSG_STATS:
		handle_stats(d, &h);
		break;
	case ST_MSG_SHUTDOWN:
		st_rpc_reply(&d->rep, &h, 0, NULL, 0);
		d->stop = 1;
		break;
	case CW_MSG_GEN_START:
		handle_gen_start(d, &h, p);
		break;
	case CW_MSG_GEN_NEXT:
		handle_gen_next(d, &h, p);
		break;
	case CW_MSG_GEN_END:
		handle_gen_end(d, &h, p);
		break;
	case CW_MSG_SCORE:
		handle_score(d, &h, p);
		break;
	case CW_MSG_SESSION:
		handle_session(d, &h, p);
		break;
	default:
		reply_error(d, &h, -ST_E_PROTO, "unknown message type");
		break;
	}
}

static void reap_idle(struct cw_daemon *d)
{
	uint64_t now = st_now_ns();
	struct st_diag diag = { "" };

	/* a restarted expertd / kvd imports the device pools again */
	if (d->dev && cw_devpool_check(d->dev, &diag) < 0)
		st_warn("device pools: %s (retrying)", diag.msg);

	for (int i = 0; i < CW_MAX_GENS; i++)
		if (d->gens[i].gen &&
		    now - d->gens[i].last_use_ns > CW_GEN_IDLE_NS) {
			st_warn("generation %u idle for too long; freeing it",
				d->gens[i].id);
			end_gen(d, &d->gens[i]);
		}
}

/*
 * Attention over device KV pages (issue 10): with a device KV pool
 * (--device-kv-budget, default 256MiB, whenever the device pools are in
 * use) every step asks kvd to place the sequences' older rows in it and
 * attention reads them there: through the module's cw_attn_fn on a GPU,
 * with the CPU attention from the (host-mapped) fake device memory under
 * STRATA_CUDA_FAKE=1.  Without the pool, or when the module cannot set
 * it up, attention reads host rows as before (said once).
 */
static void setup_kvdev(struct cw_daemon *d)
{
	const struct st_model_config *c = cw_model_config(d->model);
	struct cw_kvdev_pool kp;
	struct st_diag diag = { "" };
	cw_attn_fn fn = NULL;
	void *stream = NULL;
	int r;

	if (cw_model_is_dsv4(d->model))
		return; /* V4 keeps its own state; host rows */
	if (cw_devpool_kv(d->dev, &kp) < 0) {
		st_info("no device KV pool: attention reads the host rows");
		return;
	}
	if (!st_cuda_is_fake()) {
		if (!d->cumod.ops || !d->cumod.ops->attn_create) {
			st_warn("the CUDA module has no attention: attention "
				"reads the host rows");
			return;
		}
		r = d->cumod.ops->attn_create(&d->cuattn, d->mopts.kv_dtype,
					      c->n_heads, c->n_kv_heads,
					      c->head_dim, &diag);
		if (r < 0) {
			st_warn("device attention not used: %s", diag.msg);
			return;
		}
		fn = d->cumod.ops->attn;
		stream = d->cumod.ops->attn_stream(d->cuattn);
	}
	r = cw_kvdev_open(&d->kvdev, d->kv, &kp, d->instance, &diag);
	if (r < 0) {
		st_warn("device KV pages not used: %s", diag.msg);
		if (d->cuattn)
			d->cumod.ops->attn_destroy(d->cuattn);
		d->cuattn = NULL;
		return;
	}
	cw_model_set_kvdev(d->model, d->kvdev, stream, fn, d->cuattn);
	st_info("GPU: attention reads the KV rows kvd places in the %u "
		"device KV pages there%s", kp.n_slots,
		fn ? "" : " (fake device: with the CPU attention)");
}

/*
 * The GPU tier (issue 10): allocates and exports the device pools and
 * routes experts through the CUDA path.  Without CUDA or a device it says
 * so once and leaves everything on the CPU (0); a budget or export error
 * the user must fix is returned.
 */
static int setup_device(struct cw_daemon *d)
{
	const struct st_model_config *cfg = cw_model_config(d->model);
	struct cw_devpool_geom g = { 0 };
	struct cw_devpool_opts o = { 0 };
	struct st_diag diag = { "" };
	char budget[32];
	int r;

	if (d->device_budget && !strcmp(d->device_budget, "0"))
		return 0;
	if (!st_cuda_built()) {
		if (d->device_budget)
			st_warn("--device-budget %s ignored: this computed was "
				"built without CUDA; computing on the CPU",
				d->device_budget);
		return 0;
	}
	g.n_layers = (uint32_t)es_client_n_layers(d->es);
	g.n_experts = (uint32_t)es_client_n_experts(d->es);
	g.top_k = (uint32_t)es_client_top_k(d->es);
	g.record_bytes = es_client_record_bytes(d->es);
	{
		struct kv_stats ks;

		if (kv_client_stats(d->kv, &ks) == 0)
			g.kv_page_bytes = ks.page_bytes;
	}
	o.budget = d->device_budget;
	if (!o.budget) {
		/* default: every expert, within 80 % of free device memory */
		uint64_t fr = 0, tot = 0, all;

		if (st_cuda_mem_info(&fr, &tot, NULL) < 0) {
			char why[300];

			st_cuda_device_count(why, sizeof(why));
			st_info("no CUDA device (%s): computing on the CPU",
				why);
			return 0;
		}
		all = (uint64_t)g.n_layers * g.n_experts *
		      ((g.record_bytes + 255) / 256 * 256);
		snprintf(budget, sizeof(budget), "%llu",
			 (unsigned long long)(all < fr / 10 * 8 ? all :
					      fr / 10 * 8));
		o.budget = budget;
	}
	o.kv_budget = d->device_kv_budget;
	o.run_dir = d->run_dir;
	o.instance = d->instance;
	o.timeout_ms = d->timeout_ms > 0 ? d->timeout_ms : 10000;
	r = cw_devpool_open(&d->dev, &g, &o, &diag);
	if (r == -ST_E_UNSUPPORTED) {
		st_warn("%s: computing on the CPU", diag.msg);
		return 0;
	}
	if (r < 0) {
		st_err("device pools: %s", diag.msg);
		return r;
	}
	if (st_cuda_is_fake() && !getenv("STRATA_CUDA_MODULE")) {
		/* tests without a GPU: experts read from the (host) device
		 * slots by the CPU backend (a STRATA_CUDA_MODULE given with
		 * the fake device takes the module's path below: the test of
		 * its fallback) */
		cw_model_set_expert_fn(d->model, cw_devpool_fake_fn,
				       cw_devpool_fake_sync, d->dev);
		st_info("GPU: the fake device of STRATA_CUDA_FAKE=1");
	} else {
		r = cw_cuda_module_open(&d->cumod, &diag);
		if (r == 0)
			r = d->cumod.ops->create(&d->cuexp, d->dev,
						 &d->cumod.pool,
						 cfg->hidden_size,
						 cfg->expert_inter, &diag);
		if (r < 0) {
			/* the device is there but its code path is not
			 * (module, cuBLAS, staging): the CPU computes all, as
			 * without a device, and the pools go back (revoked)
			 * so expertd and kvd stop filling them */
			st_warn("CUDA expert path unavailable (%s): computing "
				"on the CPU", diag.msg);
			cw_cuda_module_close(&d->cumod);
			d->cuexp = NULL;
			cw_devpool_close(d->dev, o.timeout_ms);
			d->dev = NULL;
			return 0;
		}
		cw_model_set_expert_fn(d->model, d->cumod.ops->fn,
				       d->cumod.ops->sync, d->cuexp);
	}
	setup_kvdev(d);
	{
		struct cw_devpool_stats ds;

		cw_devpool_stats(d->dev, &ds);
		st_info("GPU: %u device expert slots of %llu bytes, %u KV "
			"pages; routed experts run on the device when "
			"expertd has them there", ds.n_slots,
			(unsigned long long)ds.slot_bytes, ds.kv_pages);
	}
	(void)cfg;
	return 0;
}

static int serve(struct cw_daemon *d)
{
	while (!d->stop) {
		void *buf;
		size_t len;
		int r;

		if (st_stop_signals_pending(d->sigfd))
			break;
		r = st_sock_recv(&d->rep, &buf, &len);
		if (r == -ST_E_TIMEOUT || r == -EINTR) {
			reap_idle(d);
			continue;
		}
		if (r < 0) {
			st_err("receive failed: %s", st_strerror(r));
			return r;
		}
		handle_message(d, buf, len);
		free(buf);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct cw_daemon *d = calloc(1, sizeof(*d));
	struct st_diag diag = { "" };
	char path[4200];
	int r;

	st_log_set_name("computed");
	if (!d)
		return 1;
	/* steady memory under request churn: per-request buffers of a
	 * vocabulary's size (logits, sampler scratch) always come from mmap
	 * and go back to the system when freed (no growing heap threshold),
	 * and connection threads share a few malloc arenas */
	mallopt(M_MMAP_THRESHOLD, 256 * 1024);
	mallopt(M_ARENA_MAX, 4);
	r = parse_args(d, argc, argv);
	if (r < 0) {
		free(d); /* parse_args keeps pointers into argv only */
		return 2;
	}
	{
		struct st_numa_policy np;
		char what[160];

		if (st_numa_daemon_setup(d->numa, &np, what, sizeof(what),
					 &diag) < 0) {
			st_err("%s", diag.msg);
			free(d);
			return 1;
		}
		if (what[0])
			st_info("NUMA placement: %s", what);
	}
	d->sigfd = st_stop_signals_open();
	if (d->sigfd < 0) {
		st_err("signalfd: %s", st_strerror(d->sigfd));
		free(d);
		return 1;
	}
	r = st_run_dir_prepare(d->run_dir, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		close(d->sigfd);
		free(d);
		return 1;
	}
	/* the tokenizer and the chat template first: a template the
	 * vocabulary cannot render is refused before anything starts, not
	 * on every chat request */
	r = st_tokenizer_load(d->store_dir, &d->tok, &diag);
	if (r < 0) {
		st_err("cannot load the tokenizer of %s: %s", d->store_dir,
		       diag.msg);
		goto out;
	}
	if (d->hopts.port) {
		char note[1400];

		r = cw_chat_resolve(d->store_dir, d->chat_name, d->tok,
				    &d->hopts.chat, note, sizeof(note), &diag);
		if (r < 0) {
			st_err("%s", diag.msg);
			goto out;
		}
		if (note[0])
			st_info("%s", note);
	}
	r = connect_tiers(d);
	if (r < 0)
		goto out;
	es_client_set_restart_wait(d->es, d->restart_wait_ms);
	kv_client_set_restart_wait(d->kv, d->restart_wait_ms);
	r = cw_model_open(d->store_dir, d->es, d->kv, &d->mopts, &d->model,
			  &diag);
	if (r < 0) {
		st_err("cannot open the model: %s", diag.msg);
		goto out;
	}
	if (d->no_expert_overlap)
		cw_model_set_expert_overlap(d->model, 0);
	if (cw_model_is_dsv4(d->model)) {
		int dsv_depth;

		/* V4: no router hooks; hash-routed layers hint expertd
		 * exactly from the token id (cw_model_dsv.h) */
		if (d->ropts.trace_path || d->ropts.record_path ||
		    d->ropts.oracle || d->ropts.measure) {
			st_err("--route-trace, --route-record, "
			       "--lookahead-oracle and --lookahead-measure are "
			       "not available for DeepSeek-V4 stores; drop them");
			r = -ST_E_UNSUPPORTED;
			goto out;
		}
		/* the model's own look-ahead (default 0): only when asked */
		if (d->prefetch_depth_given) {
			r = cw_model_set_dsv_prefetch_depth(
				d->model, d->ropts.prefetch_depth);
			if (r < 0) {
				st_err("--prefetch-depth %d: %s",
				       d->ropts.prefetch_depth, st_strerror(r));
				goto out;
			}
		}
		dsv_depth = d->prefetch_depth_given ?
			    d->ropts.prefetch_depth : 0;
		d->ropts.prefetch_depth = 0;
		if (cw_model_is_dsv41(d->model))
			st_info("DeepSeek-V4.1 store: %s mode, %s math, "
				"sequences stepped one after the other, Engram "
				"rows prefetched as tokens are known, step "
				"hints and gate look-ahead depth %d, state in "
				"kvd pages (prefix cache, spill, restarts)",
				cw_compute_name(d->mopts.compute),
				cw_model_dsv_math(d->model), dsv_depth);
		else
			st_info("DeepSeek-V4 store: %s math, sequences "
				"stepped one after the other, exact prefetch "
				"hints for the hash-routed layers, state in kvd "
				"pages (prefix cache, spill, restarts)",
				cw_model_dsv_math(d->model));
	}
	r = cw_routing_open(d->model, d->es, &d->ropts, &d->routing, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		goto out;
	}
	r = setup_device(d);
	if (r < 0)
		goto out;
	if (d->timeline_path) {
		d->timeline = fopen(d->timeline_path, "we");
		if (!d->timeline || cw_tl_write_header(d->timeline) < 0 ||
		    fflush(d->timeline) != 0) {
			r = -errno;
			st_err("--timeline %s: %s", d->timeline_path,
			       strerror(errno));
			goto out;
		}
		cw_steptime_init(&d->steptime, d->es);
		cw_model_set_steptime(d->model, &d->steptime);
		d->sopts.timeline = d->timeline;
		d->sopts.tl = &d->steptime;
		d->sopts.es = d->es;
	}
	cw_metrics_init(&d->metrics);
	d->metrics.run_dir = d->run_dir;
	if (d->sopts.draft_max && !cw_model_can_verify_drafts(d->model))
		st_info("speculative decoding is off for this store: its "
			"sequences cannot be cut back, so rejected drafts "
			"could not be rolled back");
	if (d->sopts.draft_max && d->sopts.draft_mtp &&
	    !cw_model_has_mtp(d->model)) {
		st_err("--speculate mtp: this store has no MTP block (a "
		       "DeepSeek-V4 checkpoint's mtp.0.*, kept by strata "
		       "convert, has one); use ngram or auto");
		r = -EINVAL;
		goto out;
	}
	if (!d->model_name[0]) {
		/* the store's name without ".strata" */
		const char *base = strrchr(d->store_dir, '/');
		char *dot;

		snprintf(d->model_name, sizeof(d->model_name), "%.200s",
			 base && base[1] ? base + 1 : d->store_dir);
		dot = strstr(d->model_name, ".strata");
		if (dot && dot != d->model_name && !dot[7])
			*dot = 0;
	}
	if (d->kv) {
		/* what a saved session must match (cw_session.h) */
		r = cw_session_ident(d->model, d->kv, d->model_name,
				     (uint32_t)d->mopts.kv_dtype,
				     &d->session_ident, &diag);
		if (r < 0) {
			st_err("%s", diag.msg);
			goto out;
		}
		d->sopts.session = &d->session_ident;
	}
	r = cw_sched_create(d->model, d->tok, d->kv, &d->sopts, &d->metrics,
			    &d->sched);
	if (r < 0) {
		st_err("cannot start the scheduler: %s", st_strerror(r));
		goto out;
	}
	if (d->hopts.port) {
		const enum cw_chat_template t = d->hopts.chat;
		d->hopts.model_name = d->model_name;
		d->hopts.run_dir = d->run_dir;
		d->hopts.sched = d->sopts;
		r = cw_http_start(&d->hopts, d->sched, d->model, d->tok, d->es,
				  d->kv, &d->metrics, &d->http, &diag);
		if (r < 0) {
			st_err("%s", diag.msg);
			goto out;
		}
		st_info("HTTP API on http://%s:%d/v1 (model '%s', chat "
			"template %s%s)", d->hopts.bind_addr, d->hopts.port,
			d->model_name, cw_chat_name(t),
			d->hopts.api_key && d->hopts.api_key[0] ?
			", API key required" : "");
	}
	st_run_path(d->run_dir, "computed", "ctl", path, sizeof(path));
	unlink(path); /* a stale socket file of a killed computed */
	r = st_sock_open(&d->rep, ST_SOCK_REP, path, 5000, 100);
	if (r < 0) {
		st_err("cannot bind %s: %s", path, st_strerror(r));
		goto out;
	}
	/* without its pid file nothing finds this computed to stop it
	 * (strata down, restart): refuse to serve rather than run unseen */
	r = st_pidfile_write(d->run_dir, "computed");
	if (r < 0) {
		st_err("cannot write the pid file %s/computed.pid: %s; free "
		       "space in the run directory's file system and start "
		       "again", d->run_dir, st_strerror(r));
		goto out;
	}
	st_info("ready: store %s, instance %s, KV %s, compute %s, run dir %s",
		d->store_dir, d->instance,
		d->mopts.kv_dtype == ST_DTYPE_F32 ? "f32 (reference mode)" :
		cw_kvrow_dtype_name(d->mopts.kv_dtype),
		cw_compute_name(d->mopts.compute), d->run_dir);
	st_sd_notify_ready("serving");
	r = serve(d);
	st_info("stopping");
	st_sd_notify_stopping();
	/* a step waiting for a lost expertd or kvd (--restart-wait) fails
	 * now instead of holding the stop up for the rest of the wait */
	es_client_abort_wait(d->es);
	kv_client_abort_wait(d->kv);
out:
	/* connections first (they hold scheduler requests), then the
	 * scheduler (it frees the running sequences' KV pages) */
	cw_http_stop(d->http);
	for (int i = 0; i < CW_MAX_GENS; i++)
		if (d->gens[i].gen)
			end_gen(d, &d->gens[i]);
	cw_sched_destroy(d->sched);
	if (d->sched)
		cw_metrics_fini(&d->metrics);
	if (d->timeline) {
		if (d->model)
			cw_model_set_steptime(d->model, NULL);
		if (fclose(d->timeline) != 0)
			st_err("--timeline %s: %s", d->timeline_path,
			       strerror(errno));
		d->timeline = NULL;
	}
	st_sock_close(&d->rep);
	st_run_path(d->run_dir, "computed", "ctl", path, sizeof(path));
	if (d->rep.url[0])
		unlink(path);
	st_pidfile_remove(d->run_dir, "computed");
	/* no step runs any more: the device path, then the pools (revoked
	 * from expertd and kvd before they are freed) */
	if (d->model)
		cw_model_set_expert_fn(d->model, NULL, NULL, NULL);
	if (d->model && d->kvdev) {
		struct cw_read_stats rs;
		struct cw_kvdev_stats ks;

		cw_model_set_kvdev(d->model, NULL, NULL, NULL, NULL);
		cw_model_read_stats(d->model, &rs);
		cw_kvdev_stats(d->kvdev, &ks);
		st_info("device KV attention: %llu rows read from device pages, "
			"%llu from host rows; %llu steps placed %llu pages "
			"(%llu on the device), %llu steps on host rows (kvd "
			"not ready), %llu layers the device attention refused",
			(unsigned long long)rs.attn_rows_device,
			(unsigned long long)rs.attn_rows_host,
			(unsigned long long)rs.kvdev_steps,
			(unsigned long long)ks.pages,
			(unsigned long long)ks.on_device,
			(unsigned long long)rs.kvdev_fails,
			(unsigned long long)rs.attn_fn_fails);
	}
	cw_kvdev_close(d->kvdev);
	d->kvdev = NULL;
	if (d->cuattn)
		d->cumod.ops->attn_destroy(d->cuattn);
	d->cuattn = NULL;
	if (d->cumod.ops)
		d->cumod.ops->destroy(d->cuexp);
	cw_cuda_module_close(&d->cumod);
	if (d->dev) {
		struct cw_devpool_stats ds;

		cw_devpool_stats(d->dev, &ds);
		st_info("device pools: %llu slot pins, %llu misses, %llu "
			"re-exports, %llu experts through the fake device "
			"(%llu failed syncs)",
			(unsigned long long)ds.pins,
			(unsigned long long)ds.misses,
			(unsigned long long)ds.reexports,
			(unsigned long long)ds.fake_experts,
			(unsigned long long)ds.fake_failed_syncs);
	}
	cw_devpool_close(d->dev, 5000);
	st_tokenizer_free(d->tok);
	cw_routing_close(d->routing);
	cw_model_close(d->model);
	kv_client_close(d->kv);
	es_client_close(d->es);
	free(d);
	return r < 0 ? 1 : 0;
}
