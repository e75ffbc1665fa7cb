/* st_iconf.c — see st_iconf.h.  All of strata's libinih calls are here. */
#include "st_iconf.h"

#include <errno.h>
#include <ini.h>
#include <stdlib.h>
#include <string.h>

#include "st_formats.h"
#include "st_numa.h"
#include "st_shm.h"
#include "st_util.h"

static const struct st_iconf_knob knobs[] = {
	{ "instance", "name", ST_ICONF_NAME, 0, 0, NULL, "default",
	  "--instance", 1, "instance name; segments /dev/shm/strata.NAME.*" },
	{ "instance", "run_dir", ST_ICONF_STR, 0, 0, NULL, NULL, "--run-dir",
	  1, "run directory (0700): sockets, pid files, logs" },
	{ "instance", "numa", ST_ICONF_NUMA, 0, 0, NULL, "auto", "--numa", 1,
	  "NUMA node of the daemons' threads and segments: auto, "
	  "interleave, off or a node number (strata topo)" },
	{ "model", "path", ST_ICONF_STR, 0, 0, NULL, NULL, "--model", 1,
	  "Hugging Face checkpoint directory (converted when needed)" },
	{ "model", "store", ST_ICONF_STR, 0, 0, NULL, NULL, "--store", 1,
	  "strata store directory (default: the cache)" },
	{ "experts", "offload", ST_ICONF_BOOL, 0, 0, NULL, "on",
	  "--expert-offload", 1,
	  "on: experts stream from the store under host_budget; off: every "
	  "expert stays in host memory (host_budget = 100%)" },
	{ "experts", "format", ST_ICONF_WFORMAT, 0, 0, NULL, "mxfp4",
	  "--experts", 1, "routed experts' format: mxfp4, nvfp4, e2m1-g32, "
	  "e2m1-g128, fp8, bf16, f32" },
	{ "experts", "keep_layers", ST_ICONF_STR, 0, 0, NULL, "",
	  "--keep-layers", 1, "other formats for some layers' experts, e.g. "
	  "first,last=fp8 (the first/last layers)" },
	{ "experts", "scale_search", ST_ICONF_ENUM, 0, 0, "none|mse", "none",
	  "--scale-search", 1, "scale choice when quantizing experts" },
	{ "experts", "host_budget", ST_ICONF_BUDGET, 0, 0, NULL, "100%",
	  "--host-budget", 1, "host memory for experts (T1): bytes or a "
	  "share of all experts" },
	{ "experts", "hot_experts", ST_ICONF_HOT, 0, 0, NULL, "auto",
	  "--hot-experts", 1, "experts per layer pinned in the host pool, "
	  "ranked by activation statistics: a count, bytes, or auto (none "
	  "pinned; eviction by --evict)" },
	{ "experts", "prefetch_depth", ST_ICONF_INT, 0, 8, NULL, "2",
	  "--prefetch-depth", 1, "layers of router look-ahead for expert "
	  "prefetch (0: off)" },
	{ "experts", "loader_threads", ST_ICONF_INT, 1, 64, NULL, "4",
	  "--loader-threads", 1, "expertd threads reading the store" },
	{ "formats", "attention", ST_ICONF_ENUM, 0, 0, "bf16|f32", "bf16",
	  "--dense-format", 1, "dense weights (attention, embeddings, "
	  "router) in the store" },
	{ "formats", "shared_experts", ST_ICONF_ENUM, 0, 0, "bf16|f32|fp8",
	  "bf16", "--shared-experts-format", 0, "shared experts' format "
	  "(Qwen2-MoE's gated shared expert, kept in dense.bin and run "
	  "by computed; set it with strata convert --shared-experts)" },
	{ "memory", "budget", ST_ICONF_SIZE, 0, 0, NULL, "0",
	  "--memory-budget", 1, "one host memory budget shared by expertd's "
	  "expert slots and kvd's KV pages, moved between them by measured "
	  "value (unset: none, each has its own; 0 is refused); "
	  "experts.host_budget and "
	  "kv.budget, when set, become each side's floor" },
	{ "kv", "dtype", ST_ICONF_ENUM, 0, 0, "f32|f16|bf16|fp8", "f32",
	  "--kv-dtype", 1, "KV rows: f32 (reference), f16, bf16, fp8 (E4M3)" },
	{ "kv", "budget", ST_ICONF_BUDGET, 0, 0, NULL, "1GiB", "--kv-budget",
	  1, "bytes of KV pages in host memory (kvd)" },
	{ "kv", "max_pages", ST_ICONF_INT, 0, 1ll << 31, NULL, "0",
	  "--kv-max-pages", 0, "cap on KV pages (0: what the budget holds)" },
	{ "kv", "page_rows", ST_ICONF_INT, 1, 4096, NULL, "16", "--page-rows",
	  1, "KV rows (tokens) per page" },
	{ "kv", "spill_budget", ST_ICONF_SIZE, 0, 0, NULL, "0",
	  "--kv-spill-budget", 1, "bytes of the KV spill file (0: no "
	  "spilling)" },
	{ "kv", "restore_ahead", ST_ICONF_BOOL, 0, 0, NULL, "on",
	  "--kv-restore-ahead", 1, "with a spill file: computed names the "
	  "next step's sequences and kvd restores their spilled pages while "
	  "the current step runs (off: each step's pin restores them)" },
	{ "kv", "remote", ST_ICONF_STR, 0, 0, NULL, "", "--kv-remote", 1,
	  "redis://HOST:PORT/DB: kvd shares full prefix-cache pages with "
	  "other nodes through this Redis (empty: off)" },
	{ "kv", "session_dir", ST_ICONF_STR, 0, 0, NULL, "",
	  "--kv-session-dir", 1, "where kvd keeps saved sessions (empty: "
	  "RUN_DIR/sessions)" },
	{ "kv", "max_seqs", ST_ICONF_INT, 1, 1024, NULL, "64", "--max-seqs",
	  1, "sequences live at once" },
	{ "compute", "threads", ST_ICONF_INT, 0, 256, NULL, "0", "--threads",
	  1, "computed's compute threads (0: online CPUs)" },
	{ "compute", "mode", ST_ICONF_ENUM, 0, 0, "reference|fast",
	  "reference", "--compute", 1, "reference (F32 activations, exact, "
	  "bit-identical across batching) or fast (int8 activations for "
	  "4-bit experts, SIMD, FMA)" },
	{ "serve", "http_port", ST_ICONF_INT, 0, 65535, NULL, "0",
	  "--http-port", 1, "port of the OpenAI-compatible HTTP API (0: no "
	  "HTTP listener); the API key comes from $STRATA_API_KEY, never "
	  "from this file" },
	{ "serve", "http_bind", ST_ICONF_STR, 0, 0, NULL, "127.0.0.1",
	  "--http-bind", 1, "IPv4 address the HTTP API binds" },
	{ "serve", "max_running", ST_ICONF_INT, 1, 4096, NULL, "32",
	  "--max-running", 1, "sequences decoding at once (continuous "
	  "batching)" },
	{ "serve", "max_queued", ST_ICONF_INT, 1, 100000, NULL, "256",
	  "--max-queued", 1, "requests waiting beyond those (more get HTTP "
	  "429)" },
	{ "serve", "max_step_tokens", ST_ICONF_INT, 1, 4096, NULL, "128",
	  "--max-step-tokens", 1, "tokens per forward step: decode tokens, "
	  "then prefill chunks" },
	{ "serve", "speculate", ST_ICONF_ENUM, 0, 0,
	  "off|ngram|ngram:1|ngram:2|ngram:3|ngram:4|ngram:6|ngram:8|ngram:12|"
	  "ngram:16|auto|auto:1|auto:2|auto:3|auto:4|auto:6|auto:8|auto:12|"
	  "auto:16|mtp|mtp:1|mtp:2|mtp:3|mtp:4|mtp:6|mtp:8|mtp:12|mtp:16",
	  "off", "--speculate", 1,
	  "speculative decoding of requests that do not choose: ngram:K "
	  "verifies up to K prompt-lookup draft tokens per step (ngram = "
	  "ngram:4); auto:K prices the length (0..K) per request in step "
	  "time and expert bytes; mtp:K drafts with a DeepSeek-V4 store's "
	  "MTP block; greedy output unchanged; DeepSeek-V4.1: off" },
	{ "serve", "chat_template", ST_ICONF_ENUM, 0, 0,
	  "auto|chatml|mixtral|deepseek|plain|none", "auto", "--chat-template", 1,
	  "chat template of /v1/chat/completions (auto: from the store's "
	  "tokenizer_config.json, else plain User:/Assistant: text)" },
	{ "serve", "model_name", ST_ICONF_STR, 0, 0, NULL, "", "--model-name",
	  1, "model id of the HTTP API (requests' \"model\", GET /v1/models; "
	  "empty: the model directory's name, else the store's)" },
	{ "serve", "metrics_auth", ST_ICONF_BOOL, 0, 0, NULL, "off",
	  "--metrics-auth", 1, "/metrics wants the API key too (off: only "
	  "the /v1 endpoints do, as vLLM)" },
	{ "serve", "http_request_timeout", ST_ICONF_INT, 1, 86400, NULL, "30",
	  "--http-request-timeout", 1, "seconds a client has to send its "
	  "whole request after connecting or after its last response" },
	{ "serve", "http_idle_timeout", ST_ICONF_INT, 1, 86400, NULL, "60",
	  "--http-idle-timeout", 1, "seconds without a byte either way "
	  "before a connection is closed" },
	{ "serve", "http_max_client_conns", ST_ICONF_INT, 1, 256, NULL, "64",
	  "--http-max-client-conns", 1, "HTTP connections at once per client "
	  "address (more are closed at once)" },
	{ "supervisor", "enabled", ST_ICONF_BOOL, 0, 0, NULL, "on",
	  "--no-supervise", 1, "a supervisor restarts a daemon that dies "
	  "and answers requests computed dropped with a retryable 503 "
	  "(off: nothing restarts)" },
	{ "supervisor", "restart_limit", ST_ICONF_INT, 0, 1000, NULL, "5",
	  "--restart-limit", 1, "restarts in a row of a daemon that dies "
	  "within 10 s of its start before the supervisor gives up (0: "
	  "never restart)" },
	{ "device", "gpu_budget", ST_ICONF_SIZE, 0, 0, NULL, "0", "--gpu", 0,
	  "device memory (T0); the planner uses it, the CPU build has no "
	  "device" },
	{ "device", "budget", ST_ICONF_STR, 0, 0, NULL, "auto",
	  "--device-budget", 1, "computed's device expert slots (CUDA "
	  "builds): a share of all experts (25%), bytes (40GiB), 0 for the "
	  "CPU, or auto (every expert within 80% of free device memory when "
	  "a device is present, else the CPU)" },
	{ "device", "kv_budget", ST_ICONF_SIZE, 0, 0, NULL, "256MiB",
	  "--device-kv-budget", 1, "computed's device KV page pool in bytes "
	  "(0: none)" },
	{ "plan", "batch", ST_ICONF_INT, 1, 65536, NULL, "1", "--batch", 1,
	  "sequences at once the planner sizes for" },
	{ "plan", "context", ST_ICONF_INT, 1, 16777216, NULL, "4096",
	  "--context", 1, "tokens per sequence the planner sizes for" },
};

_Static_assert(sizeof(knobs) / sizeof(knobs[0]) <= ST_ICONF_MAX_KNOBS,
	       "raise ST_ICONF_MAX_KNOBS");

const struct st_iconf_knob *st_iconf_knobs(int *ret_n)
{
	*ret_n = (int)ST_ARRAY_SIZE(knobs);
	return knobs;
}

static int find(const char *section, const char *key)
{
	/* keys renamed since: the old name still reads */
	if (!strcmp(section, "experts") && !strcmp(key, "prefetch_distance"))
		key = "prefetch_depth";
	for (size_t i = 0; i < ST_ARRAY_SIZE(knobs); i++)
		if (!strcmp(knobs[i].section, section) &&
		    !strcmp(knobs[i].key, key))
			return (int)i;
	return -1;
}

static int find_dotted(const char *name)
{
	const char *dot = strchr(name, '.');
	char sec[64];

	if (!dot || (size_t)(dot - name) >= sizeof(sec))
		return -1;
	memcpy(sec, name, (size_t)(dot - name));
	sec[dot - name] = 0;
	return find(sec, dot + 1);
}

void st_iconf_init(struct st_iconf *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < ST_ARRAY_SIZE(knobs); i++)
		if (knobs[i].def)
			snprintf(c->val[i], sizeof(c->val[i]), "%s",
				 knobs[i].def);
}

static int in_choices(const char *choices, const char *v)
{
	size_t n = strlen(v);

	for (const char *p = choices; p && *p;) {
		const char *bar = strchr(p, '|');
		size_t l = bar ? (size_t)(bar - p) : strlen(p);

		if (l == n && !strncmp(p, v, n))
			return 1;
		p = bar ? bar + 1 : NULL;
	}
	return 0;
}

/* Validates v for knob k; 0 or -EINVAL with "key S.K: ..." in diag. */
static int check(const struct st_iconf_knob *k, const char *v,
		 struct st_diag *diag)
{
	uint64_t bytes;
	double pct;
	char *end;
	long long n;

	switch (k->type) {
	case ST_ICONF_STR:
		return 0;
	case ST_ICONF_NAME: {
		char buf[128];

		if (st_shm_name(v, "x", buf, sizeof(buf)) == 0)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' must be 1 "
				   "to 48 characters of [A-Za-z0-9_-]",
				   k->section, k->key, v);
	}
	case ST_ICONF_SIZE:
		if (st_parse_size(v, &bytes) == 0)
			return 0;
		if (strchr(v, '%'))
			return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' is a "
					   "share; this key takes bytes (e.g. "
					   "64GiB, 512MiB, 1048576)",
					   k->section, k->key, v);
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' is not a "
				   "size: give %s", k->section, k->key, v,
				   ST_SIZE_WORDS);
	case ST_ICONF_BUDGET:
		if (st_parse_budget(v, &bytes, &pct) == 0 && pct <= 100.0 &&
		    (bytes || pct > 0))
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' is neither "
				   "a size above 0 (64GiB) nor a share in "
				   "(0%%, 100%%]", k->section, k->key, v);
	case ST_ICONF_INT:
		errno = 0;
		n = strtoll(v, &end, 10);
		if (!errno && end != v && !*end && n >= k->min && n <= k->max)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' must be an "
				   "integer in [%lld, %lld]", k->section, k->key,
				   v, (long long)k->min, (long long)k->max);
	case ST_ICONF_BOOL:
		if (st_parse_bool(v) >= 0)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' must be "
				   ST_BOOL_WORDS, k->section, k->key, v);
	case ST_ICONF_ENUM:
		if (in_choices(k->choices, v))
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' is not one "
				   "of %s", k->section, k->key, v, k->choices);
	case ST_ICONF_WFORMAT: {
		struct st_wformat f;

		if (st_wformat_parse(v, &f) == 0)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' is not a "
				   "weight format (mxfp4, nvfp4, e2m1-g32, "
				   "e2m1-g128, fp8, fp8-bN, bf16, f32)",
				   k->section, k->key, v);
	}
	case ST_ICONF_NUMA: {
		struct st_numa_policy p;

		if (st_numa_policy_parse(v, &p, NULL) == 0)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' must be "
				   "auto, interleave, off or a node number "
				   "0..%d", k->section, k->key, v,
				   ST_NUMA_MAX_NODES - 1);
	}
	case ST_ICONF_HOT:
		if (!strcmp(v, "auto") || st_parse_size(v, &bytes) == 0)
			return 0;
		return st_diag_set(diag, -EINVAL, "key %s.%s: '%s' must be "
				   "auto, a count of experts per layer (16) or "
				   "bytes (12GiB)", k->section, k->key, v);
	}
	return -EINVAL;
}

int st_iconf_set(struct st_iconf *c, const char *name, const char *value,
		 struct st_diag *diag)
{
	int i = find_dotted(name), r;

	if (i < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND, "no configuration key "
				   "'%s'", name);
	if (strlen(value) >= ST_ICONF_VAL_MAX)
		return st_diag_set(diag, -EINVAL, "key %s: value too long",
				   name);
	r = check(&knobs[i], value, diag);
	if (r < 0)
		return r;
	snprintf(c->val[i], sizeof(c->val[i]), "%s", value);
	c->set[i] = 1;
	return 0;
}

const char *st_iconf_get(const struct st_iconf *c, const char *name)
{
	int i = find_dotted(name);

	return i < 0 ? NULL : c->val[i];
}

int st_iconf_get_bool(const struct st_iconf *c, const char *name)
{
	const char *v = st_iconf_get(c, name);

	return v && st_parse_bool(v) == 1;
}

int st_iconf_is_set(const struct st_iconf *c, const char *name)
{
	int i = find_dotted(name);

	return i >= 0 && c->set[i];
}

struct load_ctx {
	struct st_iconf *c;
	struct st_diag *diag;
	int err;
	FILE *f;
	int line;      /* lines read so far: the entry being handled */
	int err_line;  /* the line of x->err */
};

/* inih's reader: fgets, counting lines, so an entry's error carries its
 * own line (inih reports the first error's line, which may be a syntax
 * error before it). */
static char *read_line(char *str, int num, void *stream)
{
	struct load_ctx *x = stream;
	char *r = fgets(str, num, x->f);

	if (r && strchr(r, '\n'))
		x->line++;
	else if (r && feof(x->f))
		x->line++;
	return r;
}

static int on_entry(void *user, const char *section, const char *key,
		    const char *value)
{
	struct load_ctx *x = user;
	int i;

	if (!key) /* a section header alone (inih with INI_CALL_HANDLER_ON_NEW_SECTION) */
		return 1;
	if (x->err < 0)
		return 0; /* the first error stands */
	x->err_line = x->line;
	i = find(section, key);
	if (i < 0 && !section[0]) {
		x->err = st_diag_set(x->diag, -EINVAL, "key '%s' before any "
				     "[section] header", key);
		return 0;
	}
	if (i < 0) {
		x->err = st_diag_set(x->diag, -EINVAL, "unknown key '%s' in "
				     "section [%s] (strata up --help-config "
				     "lists the keys)", key, section);
		return 0;
	}
	x->err = check(&knobs[i], value, x->diag);
	if (x->err < 0)
		return 0;
	snprintf(x->c->val[i], sizeof(x->c->val[i]), "%s", value);
	x->c->set[i] = 1;
	return 1;
}

int st_iconf_load(struct st_iconf *c, const char *path, struct st_diag *diag)
{
	struct st_diag inner = { "" };
	struct load_ctx x = { c, &inner, 0, NULL, 0, 0 };
	int line;

	x.f = fopen(path, "re");
	if (!x.f)
		return st_diag_set(diag, -ENOENT, "%s: cannot open the "
				   "configuration file", path);
	line = ini_parse_stream(read_line, &x, on_entry, &x);
	fclose(x.f);
	if (line == -2)
		return st_diag_set(diag, -ENOMEM, "%s: out of memory", path);
	/* inih gives the first error's line: an entry's own error, or a
	 * syntax error (no handler call) on an earlier line */
	if (line > 0 && x.err < 0 && x.err_line == line)
		return st_diag_set(diag, x.err, "%s:%d: %s", path, line,
				   inner.msg);
	if (line > 0)
		return st_diag_set(diag, -EINVAL, "%s:%d: syntax error (want "
				   "[section] or key = value)", path, line);
	return 0;
}

int st_iconf_warn_unhonoured(const struct st_iconf *c, FILE *f,
			     const char *who)
{
	int n = 0;

	for (size_t i = 0; i < ST_ARRAY_SIZE(knobs); i++)
		if (c->set[i] && !knobs[i].honoured &&
		    !(knobs[i].def && !strcmp(c->val[i], knobs[i].def))) {
			fprintf(f, "%s: note: %s.%s = %s is read but not "
				"honoured yet by this build\n", who,
				knobs[i].section, knobs[i].key, c->val[i]);
			n++;
		}
	return n;
}

void st_iconf_print_help(FILE *f)
{
	const char *sec = "";

	fprintf(f, "Configuration keys (INI; flags given on the command line "
		"win over the file):\n");
	for (size_t i = 0; i < ST_ARRAY_SIZE(knobs); i++) {
		const struct st_iconf_knob *k = &knobs[i];

		if (strcmp(sec, k->section)) {
			sec = k->section;
			fprintf(f, "[%s]\n", sec);
		}
		fprintf(f, "  %-18s %-24s default %s%s\n      %s\n", k->key,
			k->flag, k->def ? (k->def[0] ? k->def : "\"\"") : "-",
			k->honoured ? "" : "  (not honoured yet)", k->help);
	}
}
