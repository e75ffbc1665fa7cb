/*
 * test_memory_cli.c — the shared memory budget (`--memory-budget`,
 * common/st_ledger.h) outside the daemons:
 *   - cli_check_memory: bytes only (PiB too), 0 refused, floors given
 *     in bytes must fit (the message names the least budget);
 *   - kvd's share of the KV pages as strata status writes it;
 *   - cli_instance_argv: expertd and kvd get --memory-budget, the
 *     separate budgets only when given (floors), computed nothing;
 *   - the plan's shared section (st_plan_compute): floors, caps, the
 *     starting split and the extremes, each worked out here from the
 *     rules in st_plan.h and st_ledger.h;
 *   - a ledger written with the ledger's own API (both sides joined from
 *     this process, reports, a forced move in two phases) rendered by
 *     `strata status --json` (the strata binary, another process), its
 *     text, and computed's /metrics text (cw_metrics_render): each
 *     number asserted, and nothing of it once the ledger is gone.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_instance.h"
#include "cli_memory.h"
#include "cw_metrics.h"
#include "kv_pool.h"
#include "st_ledger.h"
#include "st_plan.h"
#include "st_util.h"
#include "test_util.h"

static int failures;
static char inst[64];

#define CHECK(c) ST_TEST_CHECK(c)
#define MS 1000000ull
#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

/* Runs cli_check_memory with stderr captured into msg (cap bytes). */
static int check_mem(const char *m, const char *host, const char *kv,
		     uint64_t *ret, char *msg, size_t cap)
{
	FILE *f = tmpfile();
	int saved = dup(2), r;
	size_t n;

	fflush(stderr);
	dup2(fileno(f), 2);
	r = cli_check_memory(m, host, kv, "test", ret);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(f);
	n = fread(msg, 1, cap - 1, f);
	msg[n] = 0;
	fclose(f);
	return r;
}

static void test_check(void)
{
	char msg[1024];
	uint64_t b = 1;

	CHECK(check_mem(NULL, NULL, NULL, &b, msg, sizeof(msg)) == 0 && !b);
	/* 0 in any spelling: refused (leaving the option out is "none") */
	CHECK(check_mem("0", "1GiB", "1GiB", &b, msg, sizeof(msg)) == 2 &&
	      !b && strstr(msg, "test: --memory-budget 0: give a size, or "
			   "leave the option out to keep fixed budgets") &&
	      strstr(msg, "delete or comment the [memory] budget line"));
	CHECK(check_mem("0GiB", NULL, NULL, &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "--memory-budget 0GiB: give a size"));
	/* PiB and PB are sizes (then above this machine's memory); a
	 * suffix that is none names those accepted */
	CHECK(st_parse_size("1PiB", &b) == 0 && b == 1ull << 50);
	CHECK(st_parse_size("2PB", &b) == 0 && b == 2000000000000000ull);
	CHECK(st_parse_size("1.5p", &b) == 0 && b == 3ull << 49);
	CHECK(check_mem("1PiB", NULL, NULL, &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "--memory-budget 1.00 PiB is more than this "
			  "machine's memory"));
	CHECK(check_mem("1XiB", NULL, NULL, &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "'1XiB': not a size: give a number of bytes") &&
	      strstr(msg, "PiB") && strstr(msg, "PB"));
	CHECK(check_mem("2GiB", NULL, NULL, &b, msg, sizeof(msg)) == 0 &&
	      b == 2 * GiB);
	/* a share: refused, saying so */
	CHECK(check_mem("50%", NULL, NULL, &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "--memory-budget '50%': a share is not accepted"));
	CHECK(check_mem("lots", NULL, NULL, &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "'lots': not a size"));
	/* floors of 800 + 512 MiB in 1 GiB: the least is their sum */
	CHECK(check_mem("1GiB", "800MiB", "512MiB", &b, msg, sizeof(msg)) ==
		      2 &&
	      strstr(msg, "give at least 1.28 GiB (1375731712 bytes)"));
	CHECK(check_mem("1GiB", NULL, "2GiB", &b, msg, sizeof(msg)) == 2 &&
	      strstr(msg, "(--kv-budget 2.00 GiB); give at least 2.00 GiB"));
	/* exactly the floors: accepted; a share of the experts is
	 * expertd's to resolve */
	CHECK(check_mem("1GiB", "512MiB", "512MiB", &b, msg, sizeof(msg)) ==
	      0);
	CHECK(check_mem("1GiB", "90%", "512MiB", &b, msg, sizeof(msg)) == 0);
}

/* The value after `opt` in argv, or NULL when opt is absent. */
static const char *arg_of(char **argv, const char *opt)
{
	for (int i = 0; argv[i]; i++)
		if (!strcmp(argv[i], opt))
			return argv[i + 1] ? argv[i + 1] : "";
	return NULL;
}

static void test_argv(void)
{
	static struct cli_instance in; /* large: not on the stack */
	char *argv[CLI_DAEMON_ARGV_MAX];
	const char *v;

	memset(&in, 0, sizeof(in));
	snprintf(in.name, sizeof(in.name), "x");
	snprintf(in.run_dir, sizeof(in.run_dir), "/tmp/x");
	snprintf(in.store_dir, sizeof(in.store_dir), "/tmp/store");
	snprintf(in.memory_budget, sizeof(in.memory_budget), "6GiB");
	snprintf(in.host_budget, sizeof(in.host_budget), "1GiB");
	cli_instance_argv(&in, "expertd", argv);
	v = arg_of(argv, "--memory-budget");
	CHECK(v && !strcmp(v, "6GiB"));
	v = arg_of(argv, "--host-budget");
	CHECK(v && !strcmp(v, "1GiB"));
	cli_instance_argv(&in, "kvd", argv);
	v = arg_of(argv, "--memory-budget");
	CHECK(v && !strcmp(v, "6GiB"));
	CHECK(!arg_of(argv, "--budget")); /* no floor asked for */
	cli_instance_argv(&in, "computed", argv);
	CHECK(!arg_of(argv, "--memory-budget"));
	/* without a shared budget: nothing */
	in.memory_budget[0] = 0;
	snprintf(in.kv_budget, sizeof(in.kv_budget), "1GiB");
	cli_instance_argv(&in, "kvd", argv);
	CHECK(!arg_of(argv, "--memory-budget"));
	v = arg_of(argv, "--budget");
	CHECK(v && !strcmp(v, "1GiB"));
	cli_instance_argv(&in, "expertd", argv);
	CHECK(!arg_of(argv, "--memory-budget"));
	/* kvd's rows per sequence: the model's context when known
	 * (cli_instance_kv_rows), else kvd's default (no option) */
	CHECK(!arg_of(argv, "--max-rows-per-seq"));
	cli_instance_argv(&in, "kvd", argv);
	CHECK(!arg_of(argv, "--max-rows-per-seq"));
	snprintf(in.max_rows_per_seq, sizeof(in.max_rows_per_seq), "256");
	cli_instance_argv(&in, "kvd", argv);
	v = arg_of(argv, "--max-rows-per-seq");
	CHECK(v && !strcmp(v, "256"));
	cli_instance_argv(&in, "computed", argv);
	CHECK(!arg_of(argv, "--max-rows-per-seq"));
	CHECK(kv_rows_per_seq_for_context(256) == 256);
	CHECK(kv_rows_per_seq_for_context(0) == KV_DEFAULT_ROWS_PER_SEQ);
	CHECK(kv_rows_per_seq_for_context(1 << 20) == KV_DEFAULT_ROWS_PER_SEQ);
}

static void test_plan(void)
{
	struct st_plan_model m;
	struct st_plan_opts o;
	struct st_plan_result r;
	struct st_diag d = { "" };
	/* GQA, 8 layers x 4 KV heads x 64 x f16, K and V: 8192 B a token */
	const uint64_t kv_tok = 2ull * 8 * 4 * 64 * 2, M = 1 * GiB;
	uint64_t rec, e, fl;
	int rc;

	rc = st_plan_model_from_params(2000000000ull, 100000000ull,
				       50000000ull, 16, 2, 8, 4, 64, 1024, &m,
				       &d);
	CHECK(rc == 0);
	if (rc)
		return;
	st_plan_opts_default(&o);
	o.kv_dtype = ST_DTYPE_F16;
	o.context = 4096;
	o.ram_bytes = 64 * GiB;
	o.memory_budget = M;
	rc = st_plan_compute(&m, &o, &r, &d);
	CHECK(rc == 0);
	if (rc)
		return;
	rec = r.record_bytes;
	CHECK(r.kv_per_token == kv_tok);
	CHECK(r.experts_all > M / 2); /* the case this test wants */
	/* no floors given: top-k records; kvd's one sequence of its
	 * default 32768 rows (a 1 GiB pool of 16 KiB pages holds 8192 per
	 * stream, more than the 2048 such a sequence needs) */
	CHECK(r.shared.total == M);
	CHECK(r.shared.floor[0] == 2 * rec);
	CHECK(r.shared.floor[1] == 32768 * kv_tok);
	CHECK(r.shared.cap[0] == (r.experts_all < M ? r.experts_all : M));
	CHECK(r.shared.cap[1] == M);
	/* half each */
	CHECK(r.shared.start[0] == M / 2 && r.shared.start[1] == M / 2);
	CHECK(r.shared.kv_tokens[0] == (M / 2) / kv_tok);
	e = M - 32768 * kv_tok;
	CHECK(r.shared.max[0] == (e < r.experts_all ? e : r.experts_all));
	CHECK(r.shared.min[1] == 32768 * kv_tok &&
	      r.shared.kv_tokens[1] == 32768);
	CHECK(r.shared.max[1] == M - 2 * rec &&
	      r.shared.kv_tokens[2] == (M - 2 * rec) / kv_tok);
	/* percentages of all experts, within rounding of a double */
	CHECK(r.shared.experts_pct[1] > 0 &&
	      fabs(r.shared.experts_pct[1] -
		   100.0 * (double)(2 * rec) / (double)r.experts_all) < 1e-9);

	/* a 600 MiB experts floor (whole records) wins over the half */
	o.host_budget = 600 * MiB;
	rc = st_plan_compute(&m, &o, &r, &d);
	fl = 600 * MiB / rec * rec;
	CHECK(rc == 0 && r.shared.floor[0] == fl &&
	      r.shared.start[0] == fl && r.shared.start[1] == M - fl);
	/* a 700 MiB KV floor (whole pages of 16 KiB already) takes from
	 * the experts' half */
	o.host_budget = 0;
	o.kv_budget = 700 * MiB;
	rc = st_plan_compute(&m, &o, &r, &d);
	CHECK(rc == 0 && r.shared.start[1] == 700 * MiB &&
	      r.shared.start[0] == M - 700 * MiB &&
	      r.shared.kv_tokens[0] == 700 * MiB / kv_tok);
	/* floors above the budget: refused with the least budget */
	o.host_budget = 900 * MiB;
	o.kv_budget = 200 * MiB;
	rc = st_plan_compute(&m, &o, &r, &d);
	CHECK(rc == -ST_E_BUDGET && strstr(d.msg, "give at least"));

	/* the KV floor is one sequence of the context whatever M: the
	 * least named is the same for every M below it, and enough */
	o.host_budget = 0;
	o.kv_budget = 0;
	{
		const uint64_t least = 2 * rec + 32768 * kv_tok;
		const uint64_t asks[3] = { 64 * MiB, least - 1 * MiB,
					   least - 1 };
		char want[64];

		snprintf(want, sizeof(want), "(%llu bytes)",
			 (unsigned long long)least);
		for (int i = 0; i < 3; i++) {
			o.memory_budget = asks[i];
			rc = st_plan_compute(&m, &o, &r, &d);
			CHECK(rc == -ST_E_BUDGET && strstr(d.msg, want));
		}
		o.memory_budget = least;
		rc = st_plan_compute(&m, &o, &r, &d);
		CHECK(rc == 0 && r.shared.floor[1] == 32768 * kv_tok &&
		      r.shared.start[1] == 32768 * kv_tok);
		/* a model of 256 tokens of context: kvd gets 256 rows a
		 * sequence (strata up/run), the floor 256 tokens' rows */
		m.max_context = 256;
		o.memory_budget = 64 * MiB;
		rc = st_plan_compute(&m, &o, &r, &d);
		CHECK(rc == 0 && r.shared.floor[1] == 256 * kv_tok);
		o.memory_budget = 2 * rec + 256 * kv_tok - 1;
		rc = st_plan_compute(&m, &o, &r, &d);
		snprintf(want, sizeof(want), "(%llu bytes)",
			 (unsigned long long)(2 * rec + 256 * kv_tok));
		CHECK(rc == -ST_E_BUDGET && strstr(d.msg, want));
		m.max_context = 0;
		o.memory_budget = M;
	}
}

/* kvd's share of the KV pages as strata status shows it */
static void test_kv_pages_text(void)
{
	static struct st_ledger_view v; /* large: not on the stack */
	char t[256];

	cli_memory_kv_pages_text(NULL, 3, 25600, t, sizeof(t));
	CHECK(!strcmp(t, "3/25600"));
	CHECK(cli_memory_kv_allowed(NULL, 25600) == 25600);
	memset(&v, 0, sizeof(v));
	v.total = 100 * MiB;
	/* no kv side joined yet (unit 0): the pool */
	cli_memory_kv_pages_text(&v, 0, 25600, t, sizeof(t));
	CHECK(!strcmp(t, "0/25600"));
	/* pages of 4 KiB, a share of 2 MiB + 100 bytes: 512 whole pages */
	v.side[ST_LEDGER_KV].unit = 4096;
	v.side[ST_LEDGER_KV].target = 2 * MiB + 100;
	CHECK(cli_memory_kv_allowed(&v, 25600) == 512);
	cli_memory_kv_pages_text(&v, 7, 25600, t, sizeof(t));
	CHECK(!strcmp(t, "7/512 (share 2.00 MiB of a pool of 25600 pages "
		      "made for 100.00 MiB)"));
	/* a target beyond the pool (another geometry): the pool */
	CHECK(cli_memory_kv_allowed(&v, 100) == 100);
}

/* Moves of each kind as text (hand-made: the arbiter makes these only
 * under timing the test cannot force cheaply). */
static void test_move_text(void)
{
	struct st_ledger_move m = { 0 };
	char t[256];
	uint64_t now = 100ull * 1000 * MS;

	m.t_ns = now - 12 * 1000 * MS;
	m.kind = ST_LEDGER_MOVE_DONE;
	m.why = ST_LEDGER_WHY_VALUE;
	m.from = ST_LEDGER_KV;
	m.to = ST_LEDGER_EXPERTS;
	m.bytes = 512 * MiB;
	m.gain = 3.1e6;
	m.loss = 0;
	cli_memory_move_text(&m, now, t, sizeof(t));
	CHECK(!strcmp(t, "12 s ago: 512.00 MiB kv -> experts, gain 3.1e+06 > "
		      "loss 0 (value)"));
	m.why = ST_LEDGER_WHY_FLIP;
	cli_memory_move_text(&m, now, t, sizeof(t));
	CHECK(!strcmp(t, "12 s ago: 512.00 MiB kv -> experts, gain 3.1e+06, "
		      "loss 0 (flip)"));
	m.kind = ST_LEDGER_MOVE_CANCELLED;
	m.why = ST_LEDGER_WHY_VALUE;
	cli_memory_move_text(&m, now, t, sizeof(t));
	CHECK(!strcmp(t, "12 s ago: 512.00 MiB kv -> experts cancelled (the "
		      "donor could not free it in time; value)"));
	m.kind = ST_LEDGER_MOVE_GRANT;
	m.why = ST_LEDGER_WHY_UNASSIGNED;
	cli_memory_move_text(&m, now, t, sizeof(t));
	CHECK(!strcmp(t, "12 s ago: 512.00 MiB unassigned -> experts "
		      "(unassigned)"));
	/* a side out of range (shared memory another process writes) */
	m.to = 7;
	cli_memory_move_text(&m, now, t, sizeof(t));
	CHECK(strstr(t, "-> ?"));
}

static void report(struct st_ledger *l, uint64_t used, uint64_t pinned,
		   double gain, double loss)
{
	struct st_ledger_report rp = { .used = used, .pinned = pinned,
				       .gain = gain, .loss = loss };

	st_ledger_report(l, &rp);
}

/* The sample line "name value\n" is in text. */
static int has_sample(const char *text, const char *name, const char *val)
{
	char line[256];

	snprintf(line, sizeof(line), "\n%s %s\n", name, val);
	return strstr(text, line) != NULL;
}

/* Runs `strata status ARGS` for the test's instance; its stdout into
 * *ret (malloc'd); returns its exit status or -1. */
static int run_status(const char *run_dir, const char *extra, char **ret)
{
	const char *b = getenv("STRATA_BUILD_DIR");
	char cmd[8192], buf[4096];
	size_t n, len = 0;
	char *out = NULL;
	FILE *p;
	int st;

	*ret = NULL;
	snprintf(cmd, sizeof(cmd), "'%s/cli/strata' status --instance %s "
		 "--run-dir '%s' %s", b ? b : ".", inst, run_dir, extra);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	while ((n = fread(buf, 1, sizeof(buf), p)) > 0) {
		char *o = realloc(out, len + n + 1);

		if (!o)
			break;
		out = o;
		memcpy(out + len, buf, n);
		len += n;
		out[len] = 0;
	}
	st = pclose(p);
	*ret = out;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_int_t jint(json_t *j, const char *path)
{
	char p[256], *save = NULL;

	snprintf(p, sizeof(p), "%s", path);
	for (char *k = strtok_r(p, ".", &save); k && j;
	     k = strtok_r(NULL, ".", &save))
		j = json_object_get(j, k);
	return j ? json_integer_value(j) : -1;
}

/* The status JSON of the ledger below, each number checked. */
static void check_status_json(const char *out)
{
	json_error_t err;
	json_t *j = out ? json_loads(out, 0, &err) : NULL, *mem, *log, *last;

	CHECK(j != NULL);
	if (!j) {
		printf("status --json said: %s\n", out ? out : "(nothing)");
		return;
	}
	mem = json_object_get(j, "memory");
	CHECK(mem != NULL);
	CHECK(jint(j, "running") == 0);
	CHECK(jint(mem, "budget_bytes") == (json_int_t)(64 * MiB));
	CHECK(jint(mem, "step_bytes") == (json_int_t)(4 * MiB));
	CHECK(jint(mem, "sides.experts.target_bytes") == (json_int_t)(28 * MiB));
	CHECK(jint(mem, "sides.kv.target_bytes") == (json_int_t)(36 * MiB));
	CHECK(jint(mem, "sides.experts.used_bytes") == (json_int_t)(27 * MiB));
	CHECK(jint(mem, "sides.kv.used_bytes") == (json_int_t)(20 * MiB));
	CHECK(jint(mem, "sides.experts.pinned_bytes") == (json_int_t)(2 * MiB));
	CHECK(jint(mem, "sides.experts.floor_bytes") == (json_int_t)(4 * MiB));
	CHECK(jint(mem, "sides.kv.floor_bytes") == (json_int_t)(8 * MiB));
	CHECK(jint(mem, "sides.experts.cap_bytes") == (json_int_t)(48 * MiB));
	CHECK(jint(mem, "sides.kv.cap_bytes") == (json_int_t)(64 * MiB));
	CHECK(jint(mem, "sides.experts.moves_out") == 1);
	CHECK(jint(mem, "sides.kv.moves_in") == 1);
	CHECK(jint(mem, "sides.kv.bytes_in") == (json_int_t)(4 * MiB));
	CHECK(json_real_value(json_object_get(json_object_get(json_object_get(
		mem, "sides"), "kv"), "gain")) == 5e6);
	CHECK(json_real_value(json_object_get(json_object_get(json_object_get(
		mem, "sides"), "experts"), "loss")) == 2e6);
	CHECK(json_is_true(json_object_get(json_object_get(json_object_get(
		mem, "sides"), "experts"), "live")));
	log = json_object_get(mem, "log");
	CHECK(json_array_size(log) == 1);
	last = json_array_get(log, json_array_size(log) - 1);
	CHECK(last && !strcmp(json_string_value(json_object_get(last, "kind")),
			      "move") &&
	      !strcmp(json_string_value(json_object_get(last, "from")),
		      "experts") &&
	      !strcmp(json_string_value(json_object_get(last, "to")), "kv") &&
	      !strcmp(json_string_value(json_object_get(last, "why")),
		      "value"));
	CHECK(jint(last, "bytes") == (json_int_t)(4 * MiB));
	CHECK(jint(last, "target.kv") == (json_int_t)(36 * MiB));
	CHECK(json_real_value(json_object_get(last, "gain")) == 5e6 &&
	      json_real_value(json_object_get(last, "loss")) == 2e6);
	json_decref(j);
}

/* computed's /metrics text of the ledger below. */
static void check_metrics(const struct st_ledger_view *v)
{
	static struct cw_metrics_ext x; /* large: not on the stack */
	struct cw_metrics mt;
	char *txt = NULL;

	cw_metrics_init(&mt);
	memset(&x, 0, sizeof(x));
	x.mem_on = 1;
	x.mem = *v;
	CHECK(cw_metrics_render(&mt, &x, &txt) == 0 && txt);
	if (txt) {
		CHECK(strstr(txt, "# TYPE strata_memory_budget_bytes gauge\n"));
		CHECK(has_sample(txt, "strata_memory_budget_bytes", "67108864"));
		CHECK(has_sample(txt, "strata_memory_target_bytes{side=\"experts\"}",
				 "29360128"));
		CHECK(has_sample(txt, "strata_memory_target_bytes{side=\"kv\"}",
				 "37748736"));
		CHECK(has_sample(txt, "strata_memory_used_bytes{side=\"experts\"}",
				 "28311552"));
		CHECK(has_sample(txt, "strata_memory_used_bytes{side=\"kv\"}",
				 "20971520"));
		CHECK(has_sample(txt, "strata_memory_pinned_bytes{side=\"experts\"}",
				 "2097152"));
		CHECK(has_sample(txt, "strata_memory_pinned_bytes{side=\"kv\"}",
				 "1048576"));
		CHECK(has_sample(txt, "strata_memory_value{side=\"experts\",kind=\"gain\"}",
				 "1000"));
		CHECK(has_sample(txt, "strata_memory_value{side=\"experts\",kind=\"loss\"}",
				 "2000000"));
		CHECK(has_sample(txt, "strata_memory_value{side=\"kv\",kind=\"gain\"}",
				 "5000000"));
		CHECK(has_sample(txt, "strata_memory_value{side=\"kv\",kind=\"loss\"}",
				 "100000"));
		CHECK(strstr(txt, "# TYPE strata_memory_moves_total counter\n"));
		CHECK(has_sample(txt, "strata_memory_moves_total{from=\"experts\",to=\"kv\"}",
				 "1"));
		CHECK(has_sample(txt, "strata_memory_moves_total{from=\"kv\",to=\"experts\"}",
				 "0"));
		CHECK(has_sample(txt, "strata_memory_moved_bytes_total{from=\"experts\",to=\"kv\"}",
				 "4194304"));
		CHECK(has_sample(txt, "strata_memory_moved_bytes_total{from=\"kv\",to=\"experts\"}",
				 "0"));
		CHECK(has_sample(txt, "strata_memory_moves_cancelled_total{side=\"experts\"}",
				 "0"));
		CHECK(has_sample(txt, "strata_memory_moves_cancelled_total{side=\"kv\"}",
				 "0"));
	}
	free(txt);
	/* an instance without a shared budget: no family */
	x.mem_on = 0;
	txt = NULL;
	CHECK(cw_metrics_render(&mt, &x, &txt) == 0 && txt &&
	      !strstr(txt, "strata_memory_"));
	free(txt);
	cw_metrics_fini(&mt);
}

static void test_ledger_render(void)
{
	static struct st_ledger_view v;
	struct st_diag d = { "" };
	struct st_ledger *e = NULL, *k = NULL;
	struct st_ledger_move m;
	char tmpl[] = "/tmp/strata-memcli-XXXXXX", *out = NULL, *txt = NULL;
	size_t tlen = 0;
	FILE *f;
	uint64_t now;
	int r;

	if (!mkdtemp(tmpl)) {
		CHECK(0);
		return;
	}
	/* 64 MiB: experts floor 4, cap 48; kv floor 8, cap 64; step 4 */
	r = st_ledger_open(&e, inst, ST_LEDGER_EXPERTS, 64 * MiB, 4 * MiB,
			   48 * MiB, 1 * MiB, &d);
	CHECK(r == 0);
	if (r == 0)
		r = st_ledger_open(&k, inst, ST_LEDGER_KV, 64 * MiB, 8 * MiB,
				   64 * MiB, 64 * 1024, &d);
	CHECK(r == 0);
	if (r) {
		printf("ledger: %s\n", d.msg);
		st_ledger_close(e);
		rmdir(tmpl);
		return;
	}
	CHECK(st_ledger_target(e) == 32 * MiB && st_ledger_target(k) == 32 * MiB);
	/* kv's gain 5e6 beats experts' loss 2e6 x 1.25 + 1e5 = 2.6e6 (less
	 * than twice: one step, 64 MiB / 16): a move starts, and completes once experts used
	 * no more than its new target */
	report(e, 30 * MiB, 2 * MiB, 1e3, 2e6);
	report(k, 20 * MiB, 1 * MiB, 5e6, 1e5);
	now = st_now_ns();
	CHECK(st_ledger_tick(e, now, &m) == 1);
	CHECK(st_ledger_target(e) == 28 * MiB);
	report(e, 27 * MiB, 2 * MiB, 1e3, 2e6);
	CHECK(st_ledger_tick(k, now + 200 * MS, &m) == 1 &&
	      m.kind == ST_LEDGER_MOVE_DONE);
	CHECK(st_ledger_target(k) == 36 * MiB);

	r = st_ledger_read(inst, &v, &d);
	CHECK(r == 0);
	if (r == 0) {
		/* the text of status and the run summary */
		f = open_memstream(&txt, &tlen);
		cli_memory_print(f, "  ", &v, now + 200 * MS);
		fclose(f);
		CHECK(strstr(txt, "  memory             budget 64.00 MiB shared "
			     "by experts and kv, step 4.00 MiB; 1 moves "
			     "logged\n"));
		CHECK(strstr(txt, "    experts          target 28.00 MiB, used "
			     "27.00 MiB, pinned 2.00 MiB, floor 4.00 MiB, cap "
			     "48.00 MiB\n"));
		CHECK(strstr(txt, "    kv               target 36.00 MiB, used "
			     "20.00 MiB, pinned 1.00 MiB, floor 8.00 MiB, cap "
			     "64.00 MiB\n"));
		CHECK(strstr(txt, "gain 5e+06, loss 1e+05 (ns of stall per s "
			     "per GiB); in 1 (4.00 MiB), out 0 (0 B), 0 "
			     "cancelled\n"));
		CHECK(strstr(txt, "    moves            0 s ago: 4.00 MiB "
			     "experts -> kv, gain 5e+06 > loss 2e+06 "
			     "(value)\n"));
		if (failures)
			printf("text:\n%s", txt);
		free(txt);
		check_metrics(&v);
	}
	/* another process reads it: strata status --json and its text */
	r = run_status(tmpl, "--json", &out);
	CHECK(r == 3); /* no daemon runs */
	check_status_json(out);
	free(out);
	r = run_status(tmpl, "", &out);
	CHECK(r == 3 && out &&
	      strstr(out, "\nmemory             budget 64.00 MiB shared"));
	free(out);

	/* gone: no ledger, no "memory" */
	st_ledger_close(k);
	st_ledger_close(e);
	CHECK(st_ledger_read(inst, &v, &d) == -ENOENT);
	r = run_status(tmpl, "--json", &out);
	CHECK(r == 3 && out && strstr(out, "\"running\"") &&
	      !strstr(out, "\"memory\""));
	free(out);
	rmdir(tmpl);
}

int main(void)
{
	st_test_instance("memcli", inst, sizeof(inst));
	unsetenv("STRATA_LEDGER_FLIP_MS");
	unsetenv("STRATA_LEDGER_STEP");
	setenv("STRATA_LEDGER_DWELL_MS", "1", 1);
	test_check();
	test_argv();
	test_plan();
	test_move_text();
	test_kv_pages_text();
	test_ledger_render();
	if (failures)
		printf("%d check(s) failed\n", failures);
	else
		printf("ok\n");
	return failures ? 1 : 0;
}
