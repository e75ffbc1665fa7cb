/*
 * test_restarts.c — independent restarts of expertd and kvd while a
 * generation runs (DESIGN.md section 6; issue 7 item 7).
 *
 * This process plays computed: it links the same model and generation code
 * (cw_model, cw_gen) and talks to real expertd and kvd daemons of a private
 * instance, with a restart wait set on both clients as computed sets it.
 * A killer thread kill -9s a daemon at a random point of a generation (after
 * a random number of steps, plus a random fraction of a step), leaves it
 * down a random while and starts it again the way tests/test_daemons.c
 * does.  Every generation, in reference mode (F32 KV, BF16 experts), must
 * give logits bit-identical to an undisturbed run.  After each restart
 * (PITFALLS P17 while requests run): exactly one segment per pool, owned by
 * the new daemon, epoch bumped; expertd kept its experts.  At the end
 * nothing leaks: no pins, sequences, pages or extra clients in the daemons,
 * no file descriptor in this process, and after a clean stop no segment
 * and no socket or pid file.
 *
 * Then the edges of the kind: a restarted daemon of another protocol
 * version is refused with a clear error (and a good one is accepted again
 * by the same clients), and a daemon that does not come back within the
 * restart wait ends the generation with "did not come back within N s;
 * restart it with `strata restart ...`"; an expertd that comes back with a
 * new pool (it was stopped cleanly) is reported at once (restart computed).
 *
 * Usage: test_restarts FIXTURE N_KILLS [MAX_TOKENS [spill|spec]]
 *   N_KILLS kills of expertd, then as many of kvd (interleaved).  The seed
 *   is printed; STRATA_FAULT_SEED=N replays a run.  "spill": kvd runs with
 *   a spill budget, so computed pins and unpins its sequence every step
 *   (two more kvd requests per step for the kills to land in).  "spec":
 *   speculative decoding (prompt-lookup drafts, up to 4 per step): steps
 *   of several tokens and the roll-backs of rejected rows (SEQ_TRUNCATE)
 *   for the kills to land in; the undisturbed run speculates the same.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cw_gen.h"
#include "cw_model.h"
#include "es_client.h"
#include "es_pool.h"
#include "fault_util.h"
#include "kv_client.h"
#include "st_daemon.h"
#include "st_shm.h"
#include "st_tokenizer.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

#define PROMPT "In the beginning God created the heaven and the earth. " \
	       "And the earth was without form, and void"
#define RESTART_WAIT_MS 30000

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			if (n_fail < 40) {                                     \
				fprintf(stderr, "FAIL: " __VA_ARGS__);         \
				fputc('\n', stderr);                           \
			}                                                      \
			n_fail++;                                              \
		}                                                              \
	} while (0)

struct fx {
	struct st_test_inst inst;
	char tmp[4096], store[4200];
	const char *es_args[8], *kv_args[6];
	int spill;                /* kvd with a spill budget: computed pins
				   * its sequence around every step */
	int draft_max;            /* speculative decoding (0: off) */
	struct es_client *es;
	struct kv_client *kv;
	struct cw_model *model;
	struct st_tokenizer *tok;
	int vocab, max_tokens;
	float *ref_logits;        /* [max_tokens][vocab] of the undisturbed run */
	int32_t ref_tokens[256];
	_Atomic int step;         /* steps done by the running generation */
	_Atomic int gen_done;
};

/* The st_shm header of /dev/shm/strata.<inst>.<kind> (read with pread;
 * nothing mapped).  0, or -1 when there is no such segment. */
static int shm_header(const char *inst, const char *kind,
		      struct st_shm_header *ret)
{
	char name[256];
	int fd, ok;

	snprintf(name, sizeof(name), "/strata.%s.%s", inst, kind);
	fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	ok = pread(fd, ret, sizeof(*ret), 0) == (ssize_t)sizeof(*ret);
	close(fd);
	return ok ? 0 : -1;
}

/* READY slots and the sum of all pins of expertd's pool. */
static void pool_census(const char *inst, uint32_t *ret_ready,
			uint64_t *ret_pins)
{
	struct st_shm shm;
	struct es_pool_view v;
	struct st_diag diag = { "" };

	*ret_ready = 0;
	*ret_pins = 0;
	if (st_shm_attach(&shm, inst, ES_POOL_KIND, ES_POOL_LAYOUT_VERSION, 0,
			  &diag) < 0)
		return;
	if (es_pool_view_init(shm.base, shm.size, 0, &v, &diag) == 0)
		for (uint32_t s = 0; s < v.n_slots; s++) {
			*ret_ready += atomic_load(&v.slots[s].state) ==
				      ES_SLOT_READY;
			*ret_pins += es_slot_pin_sum(&v.slots[s]);
		}
	st_shm_detach(&shm);
}

/*
 * One generation of f->max_tokens greedy tokens.  compare: every step's
 * logits must equal the reference bit for bit (else they become it).
 * Returns 0, or the error of the step that failed (message in diag).
 */
static int run_gen(struct fx *f, int compare, const char *what,
		   struct st_diag *diag)
{
	struct cw_gen_params gp;
	struct cw_gen *g = NULL;
	enum cw_finish fin = CW_FINISH_NONE;
	char text[2048];
	int r, n = 0;

	memset(&gp, 0, sizeof(gp));
	gp.max_tokens = f->max_tokens;
	gp.sampler.temperature = 0.0f;
	gp.ignore_eos = 1;
	gp.prefix_cache = 0;
	gp.draft_max = f->draft_max;
	atomic_store(&f->step, 0);
	r = cw_gen_start(f->model, f->tok, f->kv, PROMPT, strlen(PROMPT), &gp,
			 &g, diag);
	while (r == 0 && fin == CW_FINISH_NONE) {
		int32_t tok;

		r = cw_gen_step(g, text, sizeof(text), &tok, &fin, diag);
		if (r < 0 || tok < 0)
			break;
		r = 0;
		if (compare) {
			CHECK(!memcmp(cw_gen_logits(g), f->ref_logits +
				      (size_t)n * f->vocab,
				      sizeof(float) * (size_t)f->vocab),
			      "%s: logits of step %d differ from the "
			      "undisturbed run", what, n);
			CHECK(tok == f->ref_tokens[n], "%s: token %d is %d, "
			      "undisturbed %d", what, n, tok,
			      f->ref_tokens[n]);
		} else {
			memcpy(f->ref_logits + (size_t)n * f->vocab,
			       cw_gen_logits(g),
			       sizeof(float) * (size_t)f->vocab);
			f->ref_tokens[n] = tok;
		}
		n++;
		atomic_store(&f->step, n);
	}
	if (r >= 0)
		r = 0;
	if (r == 0)
		CHECK(n == f->max_tokens, "%s: %d tokens of %d", what, n,
		      f->max_tokens);
	cw_gen_free(g);
	atomic_store(&f->gen_done, 1);
	return r;
}

struct killer {
	struct fx *f;
	const char *daemon;       /* "expertd" or "kvd" */
	int after_step;           /* kill once this many steps are done */
	uint64_t extra_ns;        /* ... and this much later */
	uint64_t down_ns;         /* left down this long */
	int graceful;             /* SHUTDOWN KEEP_POOL (strata restart) instead
				   * of SIGKILL */
	/* results */
	int killed_at_step;       /* -1: the generation ended first */
	int ok;
	char err[512];
};

static void *killer_main(void *arg)
{
	struct killer *k = arg;
	struct fx *f = k->f;
	int is_es = !strcmp(k->daemon, "expertd");
	const char *kind = is_es ? ES_POOL_KIND : "kv";
	int *pidp = is_es ? &f->inst.pid_expertd : &f->inst.pid_kvd;
	struct st_shm_header before, after;
	uint64_t deadline = st_now_ns() + 120000000000ull;
	int pid = *pidp, npid;

	k->killed_at_step = -1;
	while (atomic_load(&f->step) < k->after_step &&
	       !atomic_load(&f->gen_done) && st_now_ns() < deadline)
		st_sleep_ns(50000);
	st_sleep_ns(k->extra_ns);
	if (shm_header(f->inst.name, kind, &before) < 0) {
		snprintf(k->err, sizeof(k->err), "no %s segment before the "
			 "kill", kind);
		return NULL;
	}
	if (!atomic_load(&f->gen_done))
		k->killed_at_step = atomic_load(&f->step);
	if (k->graceful) {
		char ctl[4200];

		st_run_path(f->inst.run_dir, k->daemon, "ctl", ctl, sizeof(ctl));
		if (st_daemon_shutdown_keep_pool(ctl, 5000) < 0)
			kill(pid, SIGKILL);
	} else {
		kill(pid, SIGKILL);
	}
	waitpid(pid, NULL, 0);
	*pidp = 0;
	st_sleep_ns(k->down_ns);
	npid = st_test_daemon_start(&f->inst, k->daemon,
				    is_es ? f->es_args : f->kv_args, 30);
	if (npid < 0) {
		snprintf(k->err, sizeof(k->err), "%s did not restart",
			 k->daemon);
		return NULL;
	}
	/* P17 while requests run: one segment per pool, the new owner's,
	 * with a bumped epoch (experts, kv and the I/O queue) */
	if (st_test_count_segments(f->inst.name) != 3 ||
	    shm_header(f->inst.name, kind, &after) < 0) {
		snprintf(k->err, sizeof(k->err), "%d segments after restarting "
			 "%s (want 3)", st_test_count_segments(f->inst.name),
			 k->daemon);
		return NULL;
	}
	if (atomic_load(&after.owner_pid) != npid ||
	    atomic_load(&after.epoch) <= atomic_load(&before.epoch)) {
		snprintf(k->err, sizeof(k->err), "%s segment after restart: "
			 "owner %d (new %s is %d), epoch %" PRIu64 " (was %"
			 PRIu64 ")", kind, (int)atomic_load(&after.owner_pid),
			 k->daemon, npid, (uint64_t)atomic_load(&after.epoch),
			 (uint64_t)atomic_load(&before.epoch));
		return NULL;
	}
	if (is_es) {
		uint32_t ready;
		uint64_t pins;

		pool_census(f->inst.name, &ready, &pins);
		if (!ready) {
			snprintf(k->err, sizeof(k->err), "the restarted expertd "
				 "kept no expert of the pool");
			return NULL;
		}
	}
	k->ok = 1;
	return NULL;
}

static int setup(struct fx *f, const char *fixture)
{
	struct st_diag diag = { "" };
	struct cw_model_opts mo = { .kv_dtype = ST_DTYPE_F32, .page_rows = 16,
				    .n_threads = 1 };
	int r;

	st_test_tmpdir(f->tmp, sizeof(f->tmp));
	if (flt_convert(fixture, f->tmp, f->store, sizeof(f->store)) < 0)
		return -1;
	/* a quarter of the experts: misses and evictions every token, and
	 * slow loads, so kills land in ACQUIREs and loads in flight */
	f->es_args[0] = "--store";
	f->es_args[1] = f->store;
	f->es_args[2] = "--host-budget";
	f->es_args[3] = "25%";
	f->es_args[4] = "--test-load-delay-ms";
	f->es_args[5] = "1";
	f->es_args[6] = NULL;
	f->kv_args[0] = "--budget";
	f->kv_args[1] = "64MiB";
	f->kv_args[2] = NULL;
	if (f->spill) {
		f->kv_args[2] = "--spill-budget";
		f->kv_args[3] = "16MiB";
		f->kv_args[4] = NULL;
	}
	st_test_inst_init(&f->inst, "rst");
	if (st_test_daemon_start(&f->inst, "expertd", f->es_args, 30) < 0 ||
	    st_test_daemon_start(&f->inst, "kvd", f->kv_args, 30) < 0)
		return -1;
	r = es_client_open(f->inst.run_dir, f->inst.name, "computed", 10000,
			   &f->es, &diag);
	if (!r)
		r = kv_client_open(f->inst.run_dir, f->inst.name, "computed",
				   10000, &f->kv, &diag);
	if (!r)
		r = cw_model_open(f->store, f->es, f->kv, &mo, &f->model, &diag);
	if (!r)
		r = st_tokenizer_load(f->store, &f->tok, &diag);
	if (r < 0) {
		fprintf(stderr, "setup: %s (%s)\n", diag.msg, st_strerror(r));
		return -1;
	}
	es_client_set_restart_wait(f->es, RESTART_WAIT_MS);
	kv_client_set_restart_wait(f->kv, RESTART_WAIT_MS);
	f->vocab = cw_model_config(f->model)->vocab_size;
	f->ref_logits = malloc(sizeof(float) * (size_t)f->vocab *
			       (size_t)f->max_tokens);
	return f->ref_logits ? 0 : -1;
}

/* Kill cycles: n_kills of each daemon, interleaved; graceful: stopped
 * with SHUTDOWN KEEP_POOL (what a restart does) instead of SIGKILL. */
static void kill_cycles(struct fx *f, int n_kills, int graceful,
			uint64_t *rng, uint64_t step_ns)
{
	uint32_t es0 = es_client_reconnects(f->es);
	uint32_t kv0 = kv_client_reconnects(f->kv);
	const char *how = graceful ? "restarts" : "kills";
	int mid = 0;

	for (int i = 0; i < 2 * n_kills; i++) {
		struct killer k;
		struct st_diag diag = { "" };
		pthread_t th;
		char what[160];
		int r;

		memset(&k, 0, sizeof(k));
		k.f = f;
		k.daemon = i % 2 ? "kvd" : "expertd";
		k.graceful = graceful;
		k.after_step = (int)flt_rand(rng, (uint64_t)f->max_tokens - 1);
		k.extra_ns = flt_rand(rng, step_ns);
		k.down_ns = flt_rand(rng, 100000000ull);
		snprintf(what, sizeof(what), "cycle %d (%s %s after step %d + %"
			 PRIu64 " us, down %" PRIu64 " ms)", i,
			 graceful ? "restart" : "kill -9", k.daemon,
			 k.after_step, k.extra_ns / 1000, k.down_ns / 1000000);
		atomic_store(&f->gen_done, 0);
		atomic_store(&f->step, 0);
		pthread_create(&th, NULL, killer_main, &k);
		r = run_gen(f, 1, what, &diag);
		pthread_join(th, NULL);
		CHECK(r == 0, "%s: the generation failed: %s (%s)", what,
		      diag.msg, st_strerror(r));
		CHECK(k.ok, "%s: %s", what, k.err);
		mid += k.killed_at_step >= 0;
		if (n_fail)
			break;
	}
	printf("%d of %d %s landed while the generation ran; clients "
	       "re-connected %u times to expertd, %u times to kvd\n", mid,
	       2 * n_kills, how, es_client_reconnects(f->es) - es0,
	       kv_client_reconnects(f->kv) - kv0);
	/* a kill before the last step always lands in the generation (the
	 * killer waits for the step count); so the clients had to come back */
	CHECK(mid >= n_kills, "only %d of %d %s during a generation", mid,
	      2 * n_kills, how);
	CHECK(es_client_reconnects(f->es) > es0 &&
	      kv_client_reconnects(f->kv) > kv0,
	      "the clients never re-connected (%s missed the requests)", how);
}

/* Kills `daemon`, starts it with extra arguments (NULL: none) and returns
 * its pid (-1 on failure). */
static int restart_with(struct fx *f, const char *daemon, const char *a0,
			const char *a1)
{
	int is_es = !strcmp(daemon, "expertd");
	int *pidp = is_es ? &f->inst.pid_expertd : &f->inst.pid_kvd;
	const char *args[10];
	const char *const *base = is_es ? f->es_args : f->kv_args;
	int n = 0;

	if (*pidp > 0) {
		kill(*pidp, SIGKILL);
		waitpid(*pidp, NULL, 0);
		*pidp = 0;
	}
	while (base[n] && n < 7) {
		args[n] = base[n];
		n++;
	}
	if (a0)
		args[n++] = a0;
	if (a1)
		args[n++] = a1;
	args[n] = NULL;
	return st_test_daemon_start(&f->inst, daemon, args, 30);
}

/* A restarted daemon of another protocol version: refused, clearly; the
 * same clients go on once the right one is back. */
static void version_mismatch(struct fx *f)
{
	const char *ds[2] = { "expertd", "kvd" };

	for (int i = 0; i < 2; i++) {
		struct st_diag diag = { "" };
		uint64_t t0;
		int r;

		CHECK(restart_with(f, ds[i], "--test-proto-version", "99") > 0,
		      "%s with --test-proto-version did not start", ds[i]);
		t0 = st_now_ns();
		r = run_gen(f, 1, "version mismatch", &diag);
		printf("%s of protocol 99: %s\n", ds[i], diag.msg);
		CHECK(r == -ST_E_VERSION, "%s of another version: %s, want "
		      "-ST_E_VERSION", ds[i], st_strerror(r));
		CHECK(strstr(diag.msg, "protocol") && strstr(diag.msg, "99"),
		      "%s of another version: unclear message '%s'", ds[i],
		      diag.msg);
		CHECK(st_now_ns() - t0 < 10000000000ull, "%s of another "
		      "version: refused only after %.1f s", ds[i],
		      (double)(st_now_ns() - t0) / 1e9);
		CHECK(restart_with(f, ds[i], NULL, NULL) > 0,
		      "%s did not start again", ds[i]);
		r = run_gen(f, 1, "after the mismatch", &diag);
		CHECK(r == 0, "after the right %s is back: %s", ds[i], diag.msg);
	}
}

/* A daemon that stays down: the generation ends with a clear error once
 * the restart wait is over. */
static void stays_down(struct fx *f)
{
	const char *ds[2] = { "expertd", "kvd" };

	es_client_set_restart_wait(f->es, 1500);
	kv_client_set_restart_wait(f->kv, 1500);
	for (int i = 0; i < 2; i++) {
		int *pidp = i ? &f->inst.pid_kvd : &f->inst.pid_expertd;
		struct st_diag diag = { "" };
		char want[128];
		uint64_t t0 = st_now_ns(), dt;
		int r;

		kill(*pidp, SIGKILL);
		waitpid(*pidp, NULL, 0);
		*pidp = 0;
		r = run_gen(f, 1, "daemon down", &diag);
		dt = st_now_ns() - t0;
		printf("%s down: %s (after %.1f s)\n", ds[i], diag.msg,
		       (double)dt / 1e9);
		snprintf(want, sizeof(want), "%s did not come back within 2 s; "
			 "restart it with `strata restart %s`", ds[i], ds[i]);
		CHECK(r == -ST_E_PEERGONE, "%s down: %s, want -ST_E_PEERGONE",
		      ds[i], st_strerror(r));
		CHECK(strstr(diag.msg, want), "%s down: message '%s' lacks "
		      "'%s'", ds[i], diag.msg, want);
		CHECK(dt >= 1400000000ull && dt < 15000000000ull, "%s down: "
		      "gave up after %.1f s, not about 1.5 s", ds[i],
		      (double)dt / 1e9);
		CHECK(restart_with(f, ds[i], NULL, NULL) > 0,
		      "%s did not start again", ds[i]);
	}
	es_client_set_restart_wait(f->es, RESTART_WAIT_MS);
	kv_client_set_restart_wait(f->kv, RESTART_WAIT_MS);
}

/* expertd stopped cleanly (its pool removed) and started again makes a new
 * pool: the client maps the old one and must say so at once, not wait. */
static void new_pool(struct fx *f)
{
	struct st_diag diag = { "" };
	char ctl[4200];
	uint64_t t0;
	int r;

	st_run_path(f->inst.run_dir, "expertd", "ctl", ctl, sizeof(ctl));
	CHECK(st_daemon_shutdown(ctl, 5000) == 0, "SHUTDOWN of expertd");
	waitpid(f->inst.pid_expertd, NULL, 0);
	f->inst.pid_expertd = 0;
	CHECK(restart_with(f, "expertd", NULL, NULL) > 0,
	      "expertd did not start again");
	t0 = st_now_ns();
	r = run_gen(f, 1, "new pool", &diag);
	printf("expertd with a new pool: %s\n", diag.msg);
	CHECK(r == -ST_E_STALE && strstr(diag.msg, "new expert pool") &&
	      strstr(diag.msg, "strata restart computed"),
	      "a new expert pool: %s (%s), want -ST_E_STALE saying to restart "
	      "computed", st_strerror(r), diag.msg);
	CHECK(st_now_ns() - t0 < 10000000000ull, "a new expert pool was "
	      "noticed only after %.1f s", (double)(st_now_ns() - t0) / 1e9);
}

/* Nothing of this client is left in the daemons, no descriptor leaked. */
static void check_no_leaks(struct fx *f, int fds0, const char *when)
{
	struct es_stats es;
	struct kv_stats kv;
	uint32_t ready;
	uint64_t pins;

	CHECK(es_client_stats(f->es, &es) == 0, "%s: expertd stats", when);
	CHECK(es.n_clients == 1, "%s: expertd has %u clients, want 1", when,
	      es.n_clients);
	pool_census(f->inst.name, &ready, &pins);
	CHECK(pins == 0, "%s: %" PRIu64 " pins left in the expert pool", when,
	      pins);
	CHECK(kv_client_stats(f->kv, &kv) == 0, "%s: kvd stats", when);
	CHECK(kv.n_seqs == 0 && kv.pages_used == 0, "%s: kvd holds %" PRIu64
	      " sequences, %" PRIu64 " pages", when, kv.n_seqs, kv.pages_used);
	CHECK(kv.n_clients == 1, "%s: kvd has %u clients, want 1", when,
	      kv.n_clients);
	CHECK(st_test_count_segments(f->inst.name) == 3, "%s: %d segments",
	      when, st_test_count_segments(f->inst.name));
	CHECK(flt_count_fds() == fds0, "%s: %d file descriptors open, %d "
	      "after the first generation", when, flt_count_fds(), fds0);
}

int main(int argc, char **argv)
{
	struct fx f;
	struct st_diag diag = { "" };
	uint64_t rng, t0, gen_ns;
	int n_kills, fds0, r;

	if (argc < 3) {
		fprintf(stderr, "usage: test_restarts FIXTURE N_KILLS "
			"[MAX_TOKENS [spill]]\n");
		return 2;
	}
	st_test_shared_dir();
	memset(&f, 0, sizeof(f));
	n_kills = atoi(argv[2]);
	f.max_tokens = argc > 3 ? atoi(argv[3]) : 12;
	f.spill = argc > 4 && !strcmp(argv[4], "spill");
	f.draft_max = argc > 4 && !strcmp(argv[4], "spec") ? 4 : 0;
	if (n_kills < 1 || f.max_tokens < 3 || f.max_tokens > 256)
		return 2;
	rng = flt_seed();
	signal(SIGPIPE, SIG_IGN);
	if (setup(&f, argv[1]) < 0) {
		st_test_inst_stop(&f.inst);
		return 1;
	}
	t0 = st_now_ns();
	r = run_gen(&f, 0, "undisturbed", &diag);
	gen_ns = st_now_ns() - t0;
	if (r < 0) {
		fprintf(stderr, "undisturbed generation failed: %s\n", diag.msg);
		st_test_inst_stop(&f.inst);
		return 1;
	}
	printf("undisturbed: %d tokens in %.0f ms\n", f.max_tokens,
	       (double)gen_ns / 1e6);
	fds0 = flt_count_fds();
	check_no_leaks(&f, fds0, "undisturbed");

	kill_cycles(&f, n_kills, 0, &rng, gen_ns / (uint64_t)f.max_tokens + 1);
	check_no_leaks(&f, fds0, "after the kills");
	/* `strata restart` stops a daemon cleanly, keeping its pool */
	if (!n_fail) {
		kill_cycles(&f, n_kills > 12 ? n_kills / 4 : 3, 1, &rng,
			    gen_ns / (uint64_t)f.max_tokens + 1);
		check_no_leaks(&f, fds0, "after the restarts");
	}
	if (!n_fail) {
		version_mismatch(&f);
		stays_down(&f);
		r = run_gen(&f, 1, "at the end", &diag);
		CHECK(r == 0, "last generation: %s", diag.msg);
		check_no_leaks(&f, fds0, "at the end");
		new_pool(&f);
	}

	cw_model_close(f.model);
	st_tokenizer_free(f.tok);
	kv_client_close(f.kv);
	es_client_close(f.es);
	st_test_inst_stop(&f.inst);
	CHECK(st_test_count_segments(f.inst.name) == 0,
	      "segments left after the daemons stopped");
	CHECK(flt_count_run_files(f.inst.run_dir) == 0,
	      "sockets or pid files left in %s", f.inst.run_dir);
	free(f.ref_logits);
	if (!n_fail) {
		st_rm_rf(f.tmp);
		st_rm_rf(f.inst.run_dir);
	}
	printf("%s: %d failures\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
