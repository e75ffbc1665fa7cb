/*
 * kv_main.c — kvd, the KV page daemon: parse options, prepare the run
 * directory, start the server (adopting the pool of a killed kvd), serve
 * until SIGTERM/SIGINT or a SHUTDOWN request, then remove the segment, the
 * sockets and the pid file.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_ioq.h"
#include "st_ledger.h"
#include "st_build_config.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_sdnotify.h"
#include "st_util.h"

enum opt_type { OPT_STR, OPT_BUDGET, OPT_SIZE, OPT_U32 };

/* One row per option: name, type, where it goes, bounds, default, help. */
struct opt {
	const char *name;
	enum opt_type type;
	size_t off;       /* in struct kv_config */
	size_t size;      /* of a string field */
	uint64_t min, max;
	const char *def;  /* NULL: computed (run directory) */
	const char *help;
};

static const struct opt opts[] = {
	{ "instance", OPT_STR, offsetof(struct kv_config, instance),
	  sizeof(((struct kv_config *)0)->instance), 0, 0, ST_DEFAULT_INSTANCE,
	  "instance name, [A-Za-z0-9_-]{1,48}; the pool is /strata.NAME.kv" },
	{ "run-dir", OPT_STR, offsetof(struct kv_config, run_dir),
	  sizeof(((struct kv_config *)0)->run_dir), 0, 0, NULL,
	  "run directory (0700) for kvd.ctl, kvd.evt and kvd.pid; default "
	  "$STRATA_RUN_DIR, /run/strata/NAME, $XDG_RUNTIME_DIR/strata/NAME or "
	  "/tmp/strata-UID/NAME" },
	{ "budget", OPT_BUDGET, offsetof(struct kv_config, budget_bytes), 0, 1,
	  UINT64_MAX, "1GiB",
	  "bytes of KV page data (e.g. 8GiB, or 25% of physical memory); "
	  "pages = budget / (page_rows x largest row_bytes; pooled streams: "
	  "their rows per page); page tables and "
	  "metadata come on top.  With --memory-budget: the KV side's floor "
	  "(default then: one sequence of --max-rows-per-seq rows)" },
	{ "memory-budget", OPT_SIZE,
	  offsetof(struct kv_config, memory_budget_bytes), 0, 0, UINT64_MAX,
	  NULL,
	  "bytes of host memory shared with expertd's --memory-budget (the "
	  "same value on both, e.g. 48GiB): the pool is made for all of it "
	  "(sparse) and holds at most the share the instance's ledger gives "
	  "it, moved by measured value; left out: off (fixed --budget)" },
	{ "max-seqs", OPT_U32, offsetof(struct kv_config, max_seqs), 0, 1,
	  KV_MAX_SEQS, "64", "sequences that may be live at once" },
	{ "max-rows-per-seq", OPT_U32,
	  offsetof(struct kv_config, max_rows_per_seq), 0, 1,
	  KV_MAX_ROWS_PER_SEQ, "32768",
	  "rows (tokens) a sequence may hold in each stream (strata up/run "
	  "give the model's context, at most this default)" },
	{ "test-proto-version", OPT_U32,
	  offsetof(struct kv_config, test_proto_version), 0, 0, 65535, "0",
	  "testing only: refuse clients as a kvd of protocol version N "
	  "would (0 = off)" },
	{ "spill-budget", OPT_SIZE,
	  offsetof(struct kv_config, spill_budget_bytes), 0, 0, UINT64_MAX,
	  "0",
	  "bytes of the spill file on disk that takes pages of idle "
	  "sequences and unused cached prefixes when the pool is full "
	  "(e.g. 16GiB); 0 = no spilling" },
	{ "spill-file", OPT_STR, offsetof(struct kv_config, spill_file),
	  sizeof(((struct kv_config *)0)->spill_file), 0, 0, NULL,
	  "the spill file (put it on NVMe; removed when kvd stops cleanly, "
	  "kept for a restarted kvd); default RUN_DIR/kvd.spill" },
	{ "session-dir", OPT_STR, offsetof(struct kv_config, session_dir),
	  sizeof(((struct kv_config *)0)->session_dir), 0, 0, NULL,
	  "where saved sessions are kept (NAME.kvs, strata session); "
	  "default: a directory 'sessions' beside the spill file" },
	{ "remote-kv", OPT_STR, offsetof(struct kv_config, remote.url),
	  sizeof(((struct kv_config *)0)->remote.url), 0, 0, NULL,
	  "redis://HOST[:PORT][/DB]: share full prefix-cache pages with other "
	  "nodes through this Redis (or Valkey); a local miss looks there "
	  "before recomputing; any failure means local recompute (default: "
	  "off)" },
	{ "remote-kv-ttl", OPT_U32, offsetof(struct kv_config, remote.ttl_s),
	  0, 1, 30u * 24 * 3600, "3600",
	  "seconds a published page group lives in the remote tier (each "
	  "publish of it renews it)" },
	{ "remote-kv-budget", OPT_SIZE,
	  offsetof(struct kv_config, remote.budget_bytes), 0, 1, UINT64_MAX,
	  "1GiB",
	  "bytes this kvd may publish to the remote tier per TTL period "
	  "(bounds its footprint there)" },
	{ "remote-kv-timeout", OPT_U32,
	  offsetof(struct kv_config, remote.timeout_ms), 0, 1, 10000, "100",
	  "milliseconds that bound the remote tier's connect and each "
	  "command; after a failure it is skipped for 1 s, doubling to 30 s" },
	{ "remote-kv-share-private", OPT_U32,
	  offsetof(struct kv_config, remote.share_private), 0, 0, 1, "0",
	  "1: publish pages of private sequences to the remote tier too" },
	{ "numa", OPT_STR, offsetof(struct kv_config, numa),
	  sizeof(((struct kv_config *)0)->numa), 0, 0, NULL,
	  "auto, interleave or a node number: bind threads to the node's "
	  "cores and the KV pool to its memory (default: no binding)" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: kvd [options]\n"
		   "The strata KV page daemon (version %s): owns the KV page "
		   "pool of an instance.\n\n", ST_VERSION);
	for (size_t i = 0; i < ST_ARRAY_SIZE(opts); i++)
		fprintf(f, "  --%-24s %s%s%s%s\n", opts[i].name, opts[i].help,
			opts[i].def ? " (default " : "",
			opts[i].def ? opts[i].def : "",
			opts[i].def ? ")" : "");
	fprintf(f, "  --%-24s %s\n", "version", "print the version and exit");
	fprintf(f, "  -h, --%-20s %s\n", "help", "this text");
	fprintf(f, "\n%s", ST_IOQ_ENV_HELP);
}

static int set_opt(struct kv_config *cfg, const struct opt *o,
		   const char *val)
{
	char *field = (char *)cfg + o->off;
	uint64_t bytes = 0, v;
	double pct = 0;
	char *end;

	switch (o->type) {
	case OPT_STR:
		if (!*val || strlen(val) >= o->size)
			return -EINVAL;
		memcpy(field, val, strlen(val) + 1);
		return 0;
	case OPT_BUDGET:
		if (st_parse_budget(val, &bytes, &pct) < 0)
			return -EINVAL;
		if (pct > 0) {
			long pages = sysconf(_SC_PHYS_PAGES);
			long psz = sysconf(_SC_PAGESIZE);

			if (pages <= 0 || psz <= 0 || pct > 100)
				return -EINVAL;
			bytes = (uint64_t)((double)pages * (double)psz * pct /
					   100.0);
		}
		if (bytes < o->min)
			return -EINVAL;
		memcpy(field, &bytes, sizeof(bytes));
		return 0;
	case OPT_SIZE:
		if (st_parse_size(val, &bytes) < 0 || bytes < o->min)
			return -EINVAL;
		memcpy(field, &bytes, sizeof(bytes));
		return 0;
	case OPT_U32:
		errno = 0;
		v = strtoull(val, &end, 10);
		if (errno || end == val || *end || val[0] == '-' ||
		    v < o->min || v > o->max)
			return -EINVAL;
		{
			uint32_t u = (uint32_t)v;

			memcpy(field, &u, sizeof(u));
		}
		return 0;
	}
	return -EINVAL;
}

/* 0 to run, 1 when --help was printed, -EINVAL after a message. */
static int parse_args(int argc, char **argv, struct kv_config *cfg)
{
	char name[128];

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < ST_ARRAY_SIZE(opts); i++)
		if (opts[i].def && set_opt(cfg, &opts[i], opts[i].def) < 0)
			return -EINVAL; /* our own defaults: cannot happen */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val, *eq;
		const struct opt *o = NULL;
		size_t n;

		if (!strcmp(a, "--version")) {
			printf("kvd %s\n", ST_VERSION);
			return 1;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return 1;
		}
		if (strncmp(a, "--", 2)) {
			fprintf(stderr, "kvd: unexpected argument '%s'\n", a);
			return -EINVAL;
		}
		a += 2;
		eq = strchr(a, '=');
		n = eq ? (size_t)(eq - a) : strlen(a);
		for (size_t k = 0; k < ST_ARRAY_SIZE(opts); k++)
			if (strlen(opts[k].name) == n &&
			    !strncmp(opts[k].name, a, n))
				o = &opts[k];
		if (!o) {
			fprintf(stderr, "kvd: unknown option '--%.*s' (see "
				"--help)\n", (int)n, a);
			return -EINVAL;
		}
		if (eq) {
			val = eq + 1;
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			fprintf(stderr, "kvd: --%s needs a value\n", o->name);
			return -EINVAL;
		}
		if (!strcmp(o->name, "budget"))
			cfg->budget_given = 1;
		if (set_opt(cfg, o, val) < 0) {
			fprintf(stderr, "kvd: --%s: invalid value '%s'", o->name,
				val);
			if (o->type == OPT_U32)
				fprintf(stderr, " (%llu..%llu)",
					(unsigned long long)o->min,
					(unsigned long long)o->max);
			else if (o->type == OPT_SIZE)
				fprintf(stderr, ": give %s", ST_SIZE_WORDS);
			else if (o->type == OPT_BUDGET)
				fprintf(stderr, ": give %s, or a share of "
					"physical memory (25%%)",
					ST_SIZE_WORDS);
			fprintf(stderr, "\n");
			return -EINVAL;
		}
		if (!strcmp(o->name, "memory-budget") &&
		    !cfg->memory_budget_bytes) {
			fprintf(stderr, "kvd: --memory-budget %s: give a size, "
				"or leave the option out to keep the fixed "
				"--budget\n", val);
			return -EINVAL;
		}
	}
	if (cfg->memory_budget_bytes && cfg->budget_given &&
	    cfg->budget_bytes > cfg->memory_budget_bytes) {
		fprintf(stderr, "kvd: --budget %llu bytes (the KV floor) is "
			"more than --memory-budget %llu bytes: lower --budget "
			"or raise --memory-budget\n",
			(unsigned long long)cfg->budget_bytes,
			(unsigned long long)cfg->memory_budget_bytes);
		return -EINVAL;
	}
	if (st_shm_name(cfg->instance, KV_POOL_KIND, name, sizeof(name)) < 0) {
		fprintf(stderr, "kvd: --instance '%s': use 1..48 characters "
			"of [A-Za-z0-9_-]\n", cfg->instance);
		return -EINVAL;
	}
	if (!cfg->run_dir[0] &&
	    st_run_dir_default(cfg->instance, cfg->run_dir,
			       sizeof(cfg->run_dir)) < 0) {
		fprintf(stderr, "kvd: run directory path too long\n");
		return -EINVAL;
	}
	return 0;
}

/* True when pid is a running kvd (its pid file is not stale). */
static int is_live_kvd(int pid)
{
	char path[64], comm[32] = "";
	FILE *f;

	if (pid <= 0 || pid == getpid() || !st_pid_alive(pid))
		return 0;
	/* /proc files report size 0: read with stdio, not st_read_file */
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (!fgets(comm, sizeof(comm), f))
		comm[0] = 0;
	fclose(f);
	return !strcmp(comm, "kvd\n") || !strcmp(comm, "kvd");
}

int main(int argc, char **argv)
{
	struct kv_config cfg;
	struct kv_server *srv;
	struct st_diag diag = { { 0 } };
	int r, sigfd, pid, lock_fd = -1;

	st_log_set_name("kvd");
	r = parse_args(argc, argv, &cfg);
	if (r != 0)
		return r > 0 ? 0 : 2;
	r = st_run_dir_prepare(cfg.run_dir, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		return 1;
	}
	pid = st_pidfile_read(cfg.run_dir, "kvd");
	if (is_live_kvd(pid)) {
		st_err("kvd of instance %s is already running (pid %d, run "
		       "directory %s)", cfg.instance, pid, cfg.run_dir);
		return 1;
	}
	{
		char what[160];

		r = st_numa_daemon_setup(cfg.numa[0] ? cfg.numa : NULL,
					 &cfg.numa_policy, what, sizeof(what),
					 &diag);
		if (r < 0) {
			st_err("%s", diag.msg);
			return 1;
		}
		if (what[0])
			st_info("NUMA placement: %s", what);
	}
	if (cfg.memory_budget_bytes) {
		/* at start, not at the first DECLARE (when kvd joins the
		 * ledger): RAM, and a live expertd's other total */
		struct st_ledger_view lv;
		struct st_diag ld = { "" };
		char b1[32], b2[32];

		r = st_ledger_check_total(cfg.memory_budget_bytes, &diag);
		if (r == 0 && st_ledger_read(cfg.instance, &lv, &ld) == 0 &&
		    lv.total && lv.total != cfg.memory_budget_bytes &&
		    lv.side[ST_LEDGER_EXPERTS].live)
			r = st_diag_set(
				&diag, -ST_E_CONFIG,
				"instance '%s' shares %s between experts and "
				"KV (the running expertd, pid %d, has "
				"--memory-budget %llu); give kvd the same "
				"--memory-budget, not %s, or stop the instance "
				"first (strata down)", cfg.instance,
				st_format_bytes(lv.total, b1, sizeof(b1)),
				(int)lv.side[ST_LEDGER_EXPERTS].pid,
				(unsigned long long)lv.total,
				st_format_bytes(cfg.memory_budget_bytes, b2,
						sizeof(b2)));
		if (r < 0) {
			st_err("%s", diag.msg);
			return 1;
		}
	}
	/* held for our life: no other kvd of the instance checks or adopts
	 * its segments meanwhile (the pid file is no lock) */
	r = st_shm_lock(cfg.instance, "kvd", &lock_fd, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		return 1;
	}
	sigfd = st_stop_signals_open();
	if (sigfd < 0) {
		st_err("signalfd: %s", st_strerror(sigfd));
		st_shm_unlock(cfg.instance, "kvd", lock_fd);
		return 1;
	}
	srv = calloc(1, sizeof(*srv));
	if (!srv) {
		st_err("out of memory");
		st_shm_unlock(cfg.instance, "kvd", lock_fd);
		return 1;
	}
	r = kv_server_start(srv, &cfg, &diag);
	if (r < 0) {
		st_err("cannot start: %s", diag.msg[0] ? diag.msg :
			st_strerror(r));
		free(srv);
		close(sigfd);
		st_shm_unlock(cfg.instance, "kvd", lock_fd);
		return 1;
	}
	r = st_pidfile_write(cfg.run_dir, "kvd");
	if (r < 0) {
		/* nothing could find this kvd to stop it: do not serve */
		st_err("cannot write the pid file %s/kvd.pid: %s; free space "
		       "in the run directory's file system and start again",
		       cfg.run_dir, st_strerror(r));
		srv->keep_pool = 1; /* computed's pages, for the next kvd */
		kv_server_stop(srv);
		free(srv);
		close(sigfd);
		return 1;
	}
	st_info("serving instance %s in %s (%s %llu bytes, spill budget "
		"%llu bytes, %u sequences of up to %u rows)", cfg.instance,
		cfg.run_dir, cfg.memory_budget_bytes ? "memory budget" :
		"budget", (unsigned long long)kv_ledger_pool_budget(&cfg),
		(unsigned long long)cfg.spill_budget_bytes, cfg.max_seqs,
		cfg.max_rows_per_seq);
	if (cfg.remote.url[0])
		st_info("remote KV tier %s: TTL %u s, budget %llu bytes per "
			"TTL, timeout %u ms, private sequences %s", cfg.remote.url,
			cfg.remote.ttl_s,
			(unsigned long long)cfg.remote.budget_bytes,
			cfg.remote.timeout_ms,
			cfg.remote.share_private ? "shared" : "kept local");
	st_sd_notify_ready("serving KV pages");
	while (!kv_server_poll(srv))
		if (st_stop_signals_pending(sigfd)) {
			st_info("stop signal: shutting down");
			break;
		}
	st_sd_notify_stopping();
	kv_server_stop(srv);
	st_pidfile_remove(cfg.run_dir, "kvd");
	st_shm_unlock(cfg.instance, "kvd", lock_fd);
	free(srv);
	close(sigfd);
	return 0;
}
