/*
 * es_main.c — expertd, the expert store daemon (DESIGN.md section 2).
 *
 * main() reads top to bottom: parse the command line, open the store, size
 * the host pool from the budget, create or adopt the pool segment, start
 * the loaders, bind the sockets, serve until SIGTERM/SIGINT or SHUTDOWN,
 * tear everything down (segment, sockets and pid file removed).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "es_daemon.h"
#include "st_ledger.h"
#include "es_devpool.h"
#include "st_build_config.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_numa.h"
#include "st_sdnotify.h"
#include "st_ioq.h"
#include "st_store_id.h"
#include "st_util.h"

/* One row per option (table-driven, like Redis' config table). */
struct es_optdef {
	const char *name;
	int short_name;
	const char *arg;      /* NULL: a flag */
	const char *help;
};

enum {
	OPT_TEST_LOAD_DELAY = 1000,
	OPT_TEST_PROTO_VERSION,
	OPT_NO_VERIFY_ADOPTED,
	OPT_VERSION,
	OPT_NUMA,
	OPT_EVICT,
	OPT_ADMIT,
	OPT_HOT,
	OPT_HALF_LIFE,
	OPT_STATE_DIR,
	OPT_SAVE_S,
	OPT_NO_PREFETCH,
	OPT_PF_INFLIGHT,
	OPT_NO_DIRECT,
	OPT_ENGRAM_CACHE,
	OPT_LOADER_NICE,
	OPT_MEMORY_BUDGET,
	OPT_TEST_SHRINK_DELAY,
};

static const struct es_optdef es_optdefs[] = {
	{ "store", 's', "DIR",
	  "store written by `strata convert` (required)" },
	{ "instance", 'i', "NAME",
	  "instance name, [A-Za-z0-9_-]{1,48}; the pool is\n"
	  "/dev/shm/strata.NAME.experts (default: " ST_DEFAULT_INSTANCE ")" },
	{ "run-dir", 'r', "DIR",
	  "where expertd.ctl/.evt/.pid live (default:\n"
	  "$STRATA_RUN_DIR, /run/strata/NAME as root,\n"
	  "$XDG_RUNTIME_DIR/strata/NAME, else\n"
	  "/tmp/strata-UID/NAME)" },
	{ "host-budget", 'b', "BYTES|N%",
	  "host memory for experts: a size (64GiB,\n"
	  "512MiB, 1048576) or a share of all experts\n"
	  "(25%); must hold one layer's top-k experts\n"
	  "(default: 100%); with --memory-budget: the\n"
	  "experts' floor (default: top-k experts)" },
	{ "memory-budget", OPT_MEMORY_BUDGET, "BYTES",
	  "host memory shared with kvd (e.g. 6GiB): an\n"
	  "arbiter moves it between expert slots and KV\n"
	  "pages by measured value; the pool is sized for\n"
	  "min(BYTES, all experts) and holds at most the\n"
	  "experts' share, giving evicted slots' memory\n"
	  "back (default: none, --host-budget is fixed)" },
	{ "loader-threads", 't', "N",
	  "threads reading the store: reads in flight\n"
	  "(default: 4, max 64)" },
	{ "loader-nice", OPT_LOADER_NICE, "N",
	  "lower the loader threads' priority by N (1..19):\n"
	  "compute threads win the cores from their checksums\n"
	  "(default 0: the daemon's priority)" },
	{ "evict", OPT_EVICT, "lru|lfru",
	  "eviction policy of unpinned slots: least\n"
	  "recently used, or least decayed activation\n"
	  "count (LRFU: recency and frequency; default)" },
	{ "admit", OPT_ADMIT, "frequency|precision",
	  "lfru: when a look-ahead prefetch may evict:\n"
	  "the hinted expert's count is above the victim's\n"
	  "(default), or the victim's activations per token\n"
	  "are below the hints' measured precision" },
	{ "hot-experts", OPT_HOT, "N|BYTES",
	  "pin the N most activated experts of each layer\n"
	  "(or as many as BYTES hold, e.g. 2GiB) in the\n"
	  "pool, re-ranked as traffic shifts (default 0)" },
	{ "stats-half-life", OPT_HALF_LIFE, "TOKENS",
	  "half-life of the activation counts (default 1024)" },
	{ "state-dir", OPT_STATE_DIR, "DIR",
	  "where activations.bin is kept across restarts\n"
	  "(default: the run directory)" },
	{ "stats-save-interval", OPT_SAVE_S, "SEC",
	  "save the statistics every SEC s as well as at\n"
	  "exit (default 60, 0 = at exit only)" },
	{ "no-prefetch", OPT_NO_PREFETCH, NULL,
	  "ignore the clients' prefetch hints" },
	{ "prefetch-inflight", OPT_PF_INFLIGHT, "N",
	  "prefetch loads queued or reading at once\n"
	  "(default 4)" },
	{ "no-direct-io", OPT_NO_DIRECT, NULL,
	  "read the store through the page cache (default:\n"
	  "O_DIRECT, so the NVMe tier is measured as is)" },
	{ "engram-cache", OPT_ENGRAM_CACHE, "BYTES",
	  "DeepSeek-V4.1 stores: host cache of Engram rows\n"
	  "in front of the store's engram.bin (default\n"
	  "256MiB; rows and their index)" },
	{ "no-verify-adopted", OPT_NO_VERIFY_ADOPTED, NULL,
	  "after a crash, keep the pool's experts without\n"
	  "re-hashing them (faster restart)" },
	{ "test-proto-version", OPT_TEST_PROTO_VERSION, "N",
	  "testing only: refuse clients as an expertd of\n"
	  "protocol version N would" },
	{ "test-load-delay-ms", OPT_TEST_LOAD_DELAY, "MS",
	  "testing only: sleep MS before each record read" },
	{ "test-shrink-delay-ms", OPT_TEST_SHRINK_DELAY, "MS",
	  "testing only: sleep MS in each eviction of a\n"
	  "shrink to the memory target (kills land in it)" },
	{ "numa", OPT_NUMA, "auto|N|interleave",
	  "bind threads to a NUMA node's cores and the\n"
	  "pool to its memory (default: no binding)" },
	{ "version", OPT_VERSION, NULL, "print the version and exit" },
	{ "help", 'h', NULL, "print this help and exit" },
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: expertd --store DIR [--instance NAME] [options]\n"
		"\n"
		"expertd keeps the experts of a strata store in a host-memory "
		"pool shared with\ncomputed (POSIX shm), reads them from the "
		"store with O_DIRECT on demand or ahead\nof use when computed "
		"hints them (checksums verified), and evicts unpinned ones\n"
		"by activation statistics (or recency) when the budget is "
		"full.\n"
		"\noptions:\n");
	for (size_t i = 0; i < ST_ARRAY_SIZE(es_optdefs); i++) {
		const struct es_optdef *o = &es_optdefs[i];
		char left[64];
		const char *h = o->help;

		if (o->short_name < 128)
			snprintf(left, sizeof(left), "-%c, --%s%s%s",
				 o->short_name, o->name, o->arg ? " " : "",
				 o->arg ? o->arg : "");
		else
			snprintf(left, sizeof(left), "    --%s%s%s", o->name,
				 o->arg ? " " : "", o->arg ? o->arg : "");
		fprintf(f, "  %-29s ", left);
		while (*h) {
			const char *nl = strchr(h, '\n');
			int n = nl ? (int)(nl - h) : (int)strlen(h);

			fprintf(f, "%.*s\n", n, h);
			h += n;
			if (*h == '\n') {
				h++;
				fprintf(f, "  %-29s ", "");
			}
		}
	}
	fprintf(f,
		"\nexamples:\n"
		"  expertd --store /srv/models/mixtral.strata --instance gpu0 "
		"--host-budget 64GiB\n"
		"  expertd -s ./store -i test -b 25%% -t 4\n"
		"\nexpertd exits 0 on SIGTERM/SIGINT or a SHUTDOWN request, "
		"after removing its\nsegment, sockets and pid file; after "
		"SIGKILL the next expertd of the same\ninstance and store "
		"adopts the segment and keeps its experts.\n\n"
		ST_IOQ_ENV_HELP);
}

static int parse_int(const char *opt, const char *text, int lo, int hi,
		     int *ret)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(text, &end, 10);
	if (errno || end == text || *end || v < lo || v > hi) {
		fprintf(stderr, "expertd: --%s '%s' must be an integer in "
			"[%d, %d]\n", opt, text, lo, hi);
		return -EINVAL;
	}
	*ret = (int)v;
	return 0;
}

/* Parses argv into *o.  Returns 0, 1 (help/version printed: exit 0) or
 * -EINVAL (message printed). */
static int parse_args(int argc, char **argv, struct es_opts *o)
{
	struct option lopts[ST_ARRAY_SIZE(es_optdefs) + 1];
	char shorts[64];
	size_t ns = 0;
	const char *run_dir = NULL;
	int ch;

	memset(o, 0, sizeof(*o));
	o->instance = ST_DEFAULT_INSTANCE;
	o->loader_threads = ES_DEFAULT_LOADER_THREADS;
	o->evict = ES_EVICT_LFRU;
	o->admit = ES_ADMIT_FREQUENCY;
	o->half_life = ES_ACTSTATS_DEFAULT_HALF_LIFE;
	o->stats_save_s = ES_DEFAULT_STATS_SAVE_S;
	o->prefetch_inflight = ES_DEFAULT_PREFETCH_INFLIGHT;
	for (size_t i = 0; i < ST_ARRAY_SIZE(es_optdefs); i++) {
		const struct es_optdef *d = &es_optdefs[i];

		lopts[i] = (struct option){ d->name,
					    d->arg ? required_argument :
						     no_argument,
					    NULL, d->short_name };
		if (d->short_name < 128) {
			shorts[ns++] = (char)d->short_name;
			if (d->arg)
				shorts[ns++] = ':';
		}
	}
	lopts[ST_ARRAY_SIZE(es_optdefs)] = (struct option){ 0 };
	shorts[ns] = 0;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, shorts, lopts, NULL)) != -1) {
		switch (ch) {
		case 's': o->store_dir = optarg; break;
		case 'i': o->instance = optarg; break;
		case 'r': run_dir = optarg; break;
		case 'b': o->budget_text = optarg; break;
		case OPT_MEMORY_BUDGET: o->memory_budget_text = optarg; break;
		case 't':
			if (parse_int("loader-threads", optarg, 1,
				      ES_MAX_LOADER_THREADS,
				      &o->loader_threads) < 0)
				return -EINVAL;
			break;
		case OPT_LOADER_NICE:
			if (parse_int("loader-nice", optarg, 0, 19,
				      &o->loader_nice) < 0)
				return -EINVAL;
			break;
		case OPT_TEST_LOAD_DELAY:
			if (parse_int("test-load-delay-ms", optarg, 0, 60000,
				      &o->test_load_delay_ms) < 0)
				return -EINVAL;
			break;
		case OPT_TEST_SHRINK_DELAY:
			if (parse_int("test-shrink-delay-ms", optarg, 0, 60000,
				      &o->test_shrink_delay_ms) < 0)
				return -EINVAL;
			break;
		case OPT_TEST_PROTO_VERSION:
			if (parse_int("test-proto-version", optarg, 1, 65535,
				      &o->test_proto_version) < 0)
				return -EINVAL;
			break;
		case OPT_NO_VERIFY_ADOPTED: o->no_verify_adopted = 1; break;
		case OPT_NUMA: o->numa = optarg; break;
		case OPT_EVICT:
			if (es_policy_parse(optarg, &o->evict) < 0) {
				fprintf(stderr, "expertd: --evict must be lru "
					"or lfru, not '%s'\n", optarg);
				return -EINVAL;
			}
			break;
		case OPT_ADMIT:
			if (!strcmp(optarg, "precision"))
				o->admit = ES_ADMIT_PRECISION;
			else if (!strcmp(optarg, "frequency"))
				o->admit = ES_ADMIT_FREQUENCY;
			else {
				fprintf(stderr, "expertd: --admit must be "
					"precision or frequency, not '%s'\n",
					optarg);
				return -EINVAL;
			}
			break;
		case OPT_HOT: o->hot_text = optarg; break;
		case OPT_HALF_LIFE: {
			char *end;

			o->half_life = strtod(optarg, &end);
			if (end == optarg || *end || !(o->half_life >= 1) ||
			    o->half_life > 1e12) {
				fprintf(stderr, "expertd: --stats-half-life "
					"wants a number of tokens >= 1\n");
				return -EINVAL;
			}
			break;
		}
		case OPT_STATE_DIR: o->state_dir = optarg; break;
		case OPT_SAVE_S:
			if (parse_int("stats-save-interval", optarg, 0, 86400,
				      &o->stats_save_s) < 0)
				return -EINVAL;
			break;
		case OPT_NO_PREFETCH: o->no_prefetch = 1; break;
		case OPT_PF_INFLIGHT:
			if (parse_int("prefetch-inflight", optarg, 1, 4096,
				      &o->prefetch_inflight) < 0)
				return -EINVAL;
			break;
		case OPT_NO_DIRECT: o->no_direct_io = 1; break;
		case OPT_ENGRAM_CACHE: o->engram_cache_text = optarg; break;
		case OPT_VERSION: printf("expertd %s\n", ST_VERSION); return 1;
		case 'h': usage(stdout); return 1;
		default:
			if (optopt)
				fprintf(stderr, "expertd: option -%c: unknown "
					"or missing its argument\n", optopt);
			else
				fprintf(stderr, "expertd: unknown option or "
					"missing argument: %s\n",
					argv[optind - 1]);
			fprintf(stderr, "run 'expertd --help' for the "
				"options\n");
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "expertd: unexpected argument '%s'; run "
			"'expertd --help'\n", argv[optind]);
		return -EINVAL;
	}
	if (!o->store_dir) {
		fprintf(stderr, "expertd: --store DIR is required (a store "
			"written by `strata convert`); run 'expertd --help'\n");
		return -EINVAL;
	}
	{
		char name[128];

		if (st_shm_name(o->instance, ES_POOL_KIND, name,
				sizeof(name)) < 0) {
			fprintf(stderr, "expertd: --instance '%s' must be 1 "
				"to 48 characters of [A-Za-z0-9_-]\n",
				o->instance);
			return -EINVAL;
		}
	}
	if (run_dir) {
		if (snprintf(o->run_dir, sizeof(o->run_dir), "%s", run_dir) >=
		    (int)sizeof(o->run_dir)) {
			fprintf(stderr, "expertd: --run-dir too long\n");
			return -EINVAL;
		}
	} else if (st_run_dir_default(o->instance, o->run_dir,
				      sizeof(o->run_dir)) < 0) {
		fprintf(stderr, "expertd: default run directory too long; "
			"give --run-dir\n");
		return -EINVAL;
	}
	return 0;
}

/* XXH3-64 of the store's manifest.json: the id of the model a pool holds. */
/*
 * A POSIX shm segment lives in tmpfs (/dev/shm): ftruncate succeeds beyond
 * its free space, and the first write to a page that does not fit kills
 * the process with SIGBUS.  So refuse a pool that cannot fit up front.
 * The pages of a segment left by a crashed expertd count as available.
 */
static int check_shm_space(const char *instance, uint64_t need,
			   struct st_diag *diag)
{
	char name[128], path[160], b1[32], b2[32];
	struct statvfs vfs;
	struct stat st;
	uint64_t avail;

	if (statvfs("/dev/shm", &vfs) < 0)
		return 0; /* not Linux-like; nothing to check */
	avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	if (st_shm_name(instance, ES_POOL_KIND, name, sizeof(name)) == 0) {
		snprintf(path, sizeof(path), "/dev/shm%s", name);
		if (stat(path, &st) == 0)
			avail += (uint64_t)st.st_blocks * 512;
	}
	if (avail >= need)
		return 0;
	return st_diag_set(diag, -ST_E_BUDGET,
			   "the expert pool needs %s of /dev/shm but only %s "
			   "is free; lower --host-budget or enlarge /dev/shm "
			   "(mount -o remount,size=...)",
			   st_format_bytes(need, b1, sizeof(b1)),
			   st_format_bytes(avail, b2, sizeof(b2)));
}

/* Tears down what start-up built, in reverse order.  destroy_pool: unlink
 * the segment (clean exit, or a fresh segment nobody used). */
/* --hot-experts: N per layer, or a size whose records it holds. */
static int resolve_hot(struct es_daemon *d, struct st_diag *diag)
{
	const char *t = d->opt.hot_text;
	uint64_t bytes, per;
	char *end;
	long n;

	if (!t)
		return 0;
	n = strtol(t, &end, 10);
	if (end != t && !*end && n >= 0 && n <= 65536) {
		d->opt.hot_experts = (int)n;
		return 0;
	}
	if (st_parse_size(t, &bytes) < 0)
		return st_diag_set(diag, -EINVAL, "--hot-experts '%s' is "
				   "neither a count per layer nor a size "
				   "(2GiB)", t);
	per = d->pool.geom.record_bytes * d->pool.geom.n_layers;
	d->opt.hot_experts = (int)ST_MIN(bytes / per, 65536);
	return 0;
}

static void daemon_fini(struct es_daemon *d, int destroy_pool)
{
	es_loader_stop(d->loader);
	d->loader = NULL;
	es_engram_stop(d, destroy_pool);
	st_ioq_close(d->ioq); /* after every thread that reads */
	d->ioq = NULL;
	es_tiers_fini(d);
	es_budget_close(d);
	es_devpool_fini(d, destroy_pool);
	if (d->pool.shm.base)
		es_pool_close(&d->pool, destroy_pool);
	es_server_close(d);
	st_store_close(d->store);
	d->store = NULL;
	if (d->sig_fd >= 0)
		close(d->sig_fd);
	st_shm_unlock(d->opt.instance, ES_DAEMON_NAME, d->lock_fd);
	d->lock_fd = -1;
}

int main(int argc, char **argv)
{
	struct es_daemon d;
	struct es_pool_geom geom;
	uint64_t mem_floor = 0, mem_cap = 0, mem_total = 0;
	struct st_diag diag = { "" };
	char b1[32], b2[32];
	int r, other;

	memset(&d, 0, sizeof(d));
	d.rep.fd = d.pub.fd = d.sig_fd = d.lock_fd = -1;
	st_log_set_name(ES_DAEMON_NAME);
	r = parse_args(argc, argv, &d.opt);
	if (r)
		return r > 0 ? 0 : 2;

	/* Stop signals go to a signalfd; block them before any thread. */
	d.sig_fd = st_stop_signals_open();
	if (d.sig_fd < 0) {
		st_err("cannot set up signal handling: %s",
		       st_strerror(d.sig_fd));
		return 1;
	}

	{
		char what[160];

		r = st_numa_daemon_setup(d.opt.numa, &d.numa, what,
					 sizeof(what), &diag);
		if (r < 0) {
			st_err("%s", diag.msg);
			daemon_fini(&d, 0);
			return 1;
		}
		if (what[0])
			st_info("NUMA placement: %s", what);
	}

	r = st_store_open(d.opt.store_dir, &d.store, &diag);
	if (r < 0) {
		st_err("cannot open the store: %s", diag.msg);
		daemon_fini(&d, 0);
		return 1;
	}
	r = st_store_id(d.store, &d.store_id, &diag);
	if (r == 0 && d.opt.memory_budget_text &&
	    st_parse_size(d.opt.memory_budget_text, &mem_total) == 0)
		r = st_ledger_check_total(mem_total, &diag);
	if (r == 0 && d.opt.memory_budget_text) {
		/* one budget with kvd: the pool sized for the experts' cap */
		r = es_budget_geom(d.store, d.store_id,
				   d.opt.memory_budget_text, d.opt.budget_text,
				   &geom, &mem_floor, &mem_cap, &diag);
		if (r == 0)
			(void)st_parse_size(d.opt.memory_budget_text,
					    &mem_total);
	} else if (r == 0) {
		r = es_pool_geom_from_budget(d.store, d.store_id,
					     d.opt.budget_text, &geom, &diag);
	}
	if (r < 0) {
		st_err("%s", diag.msg);
		daemon_fini(&d, 0);
		return 1;
	}

	r = st_run_dir_prepare(d.opt.run_dir, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		daemon_fini(&d, 0);
		return 1;
	}
	other = st_pidfile_read(d.opt.run_dir, ES_DAEMON_NAME);
	if (other > 0 && other != getpid() && st_pid_alive(other)) {
		st_err("expertd (pid %d) is already serving run directory %s; "
		       "stop it first (kill %d, or strata down) or use another "
		       "--run-dir", other, d.opt.run_dir, other);
		daemon_fini(&d, 0);
		return 1;
	}
	/* held for our life: no other expertd of the instance checks or
	 * adopts its segments meanwhile (the pid file is no lock) */
	r = st_shm_lock(d.opt.instance, ES_DAEMON_NAME, &d.lock_fd, &diag);
	if (r < 0) {
		st_err("%s", diag.msg);
		daemon_fini(&d, 0);
		return 1;
	}

	{
		struct es_pool_layout lay;

		r = es_pool_layout_compute(&geom, &lay);
		if (r == 0)
			r = check_shm_space(d.opt.instance, lay.total_bytes,
					    &diag);
		if (r < 0) {
			st_err("%s", diag.msg[0] ? diag.msg :
			       "expert pool geometry impossible");
			daemon_fini(&d, 0);
			return 1;
		}
	}
	r = es_pool_open(&d.pool, d.opt.instance, &geom, d.store,
			 d.opt.no_verify_adopted, d.opt.memory_budget_text != NULL,
			 &diag);
	if (r < 0) {
		if (r == -EBUSY)
			st_err("%s: another expertd is serving instance '%s'; "
			       "stop it first (strata down) or use another "
			       "--instance", diag.msg, d.opt.instance);
		else
			st_err("cannot set up the expert pool: %s", diag.msg);
		daemon_fini(&d, 0);
		return 1;
	}

	if (st_numa_bind_range(d.pool.shm.base, d.pool.shm.size, &d.numa,
			       &diag) < 0)
		st_warn("expert pool stays where the kernel puts it: %s",
			diag.msg);

	/* expert and Engram reads share the NVMe queue with kvd's spill
	 * and restore (st_ioq.h); without it they just run */
	{
		struct st_diag qd = { "" };

		if (st_ioq_open(&d.ioq, d.opt.instance, ES_DAEMON_NAME,
				&qd) < 0)
			st_warn("no I/O queue (reads not ordered with kvd's): "
				"%s", qd.msg);
	}
	/* the ledger's target before anything loads (warm-up obeys it) */
	r = es_budget_open(&d, mem_total, mem_floor, mem_cap, &diag);
	if (r < 0) {
		st_err("cannot join the memory budget: %s", diag.msg);
		daemon_fini(&d, !d.pool.adopted);
		return 1;
	}
	r = resolve_hot(&d, &diag);
	if (r == 0)
		r = es_tiers_init(&d, &diag);
	if (r == 0)
		r = es_loader_start(&d.loader, &d.pool, d.store,
				    d.opt.loader_threads,
				    d.opt.test_load_delay_ms,
				    !d.opt.no_direct_io, d.opt.loader_nice,
				    d.ioq, &diag);
	if (r == 0)
		r = es_engram_start(&d, &diag);
	if (r == 0)
		r = es_server_bind(&d, &diag);
	if (r == 0 && (r = st_pidfile_write(d.opt.run_dir, ES_DAEMON_NAME)) < 0)
		st_diag_set(&diag, r, "cannot write the pid file %s/%s.pid (free "
			    "space in the run directory's file system)",
			    d.opt.run_dir, ES_DAEMON_NAME);
	if (r < 0) {
		st_err("cannot start: %s (%s)", diag.msg, st_strerror(r));
		/* An adopted pool keeps its experts for the next try. */
		daemon_fini(&d, !d.pool.adopted);
		return 1;
	}

	if (d.opt.admit == ES_ADMIT_PRECISION && d.opt.evict != ES_EVICT_LFRU)
		st_warn("--admit precision applies under --evict lfru only; "
			"with --evict lru every hint is admitted");
	es_tiers_warm(&d);
	if (d.pool.adopted)
		es_server_publish(&d, ES_EVT_EPOCH);
	es_server_publish(&d, ES_EVT_READY);
	st_info("serving store %s (%u layers x %u experts, top-k %u) on %s: "
		"%u slots of %s = %s%s, epoch %" PRIu64 "; evict %s%s, hot %d "
		"per layer, reads %s",
		d.store->dir, geom.n_layers, geom.n_experts, geom.top_k,
		d.ctl_path, geom.n_slots,
		st_format_bytes(geom.record_bytes, b1, sizeof(b1)),
		st_format_bytes(d.pool.layout.data_bytes, b2, sizeof(b2)),
		d.pool.adopted ? " (adopted after a crash)" : "",
		atomic_load(&d.pool.v.shm->epoch),
		d.opt.evict == ES_EVICT_LFRU ? "lfru" : "lru",
		d.opt.evict != ES_EVICT_LFRU ? "" :
		d.opt.admit == ES_ADMIT_PRECISION ? " (admit by precision)" :
						     " (admit by frequency)",
		d.opt.hot_experts,
		es_loader_direct(d.loader) ? "O_DIRECT" : "buffered");

	st_sd_notify_ready("serving experts");
	es_server_run(&d);

	st_info("shutting down");
	st_sd_notify_stopping();
	es_server_publish(&d, ES_EVT_SHUTDOWN);
	st_sleep_ns(20000000); /* let the event leave before closing */
	st_pidfile_remove(d.opt.run_dir, ES_DAEMON_NAME);
	daemon_fini(&d, !d.keep_pool);
	return 0;
}
