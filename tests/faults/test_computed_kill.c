/*
 * test_computed_kill.c — computed killed with SIGKILL while a generation
 * runs (DESIGN.md section 6: "computed restart").
 *
 * Real expertd, kvd and computed on a private instance; this process is
 * the client (computed's request socket, as the strata CLI uses it).
 *   1. an undisturbed greedy generation (the tokens to expect);
 *   1b. the real computed under a tier restart: kvd, then expertd, killed
 *      with SIGKILL in the middle of a generation and started again; the
 *      generation finishes with the same tokens (computed waited and went
 *      on: its log says so), and computed's next STATS reaches the new
 *      expertd;
 *   2. a long generation; after a few tokens a thread kill -9s computed
 *      while the client keeps asking for tokens: the client sees its
 *      request end (-ST_E_PEERGONE, the connection is gone), promptly;
 *   3. the tier daemons drop the dead computed's leases: its expertd
 *      client entry and pins, its kvd client, sequences and pages;
 *   4. a new computed attaches to the warm tiers; the retried generation
 *      gives the tokens of step 1, and the summary (computed's STATS, what
 *      `strata run` prints) shows every expert came from the host pool:
 *      expertd's loads did not move, its hits did.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cw_client.h"
#include "cw_gen.h"
#include "cw_proto.h"
#include "es_client.h"
#include "es_pool.h"
#include "fault_util.h"
#include "kv_client.h"
#include "st_shm.h"
#include "st_daemon.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

#define PROMPT "And God said, Let there be light: and there was light."
#define N_TOKENS 16

static int n_fail;

#define CHECK(cond, ...)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "FAIL: " __VA_ARGS__);                 \
			fputc('\n', stderr);                                   \
			n_fail++;                                              \
		}                                                              \
	} while (0)

struct fx {
	struct st_test_inst inst;
	char tmp[4096], store[4200];
	const char *cw_args[8];
	const char *es_args[4], *kv_args[4];
	const char *victim;       /* daemon the killer kills */
	struct es_client *es;     /* observer clients of the tiers */
	struct kv_client *kv;
	_Atomic int steps;
	_Atomic int killed;
	uint64_t kill_ns;         /* when the killer sent SIGKILL */
};

/* The client's watch: computed's process ended (the killer reaped it). */
static int computed_gone(void *arg)
{
	struct fx *f = arg;

	return atomic_load(&f->killed) ? -ST_E_PEERGONE : 0;
}

static int start_computed(struct fx *f)
{
	return st_test_daemon_start(&f->inst, "computed", f->cw_args, 60);
}

/* Greedy generation of up to max_tokens; tokens into out (may be NULL).
 * Returns the number of tokens, or the negative error of the call that
 * failed (message in diag). */
static int generate(struct cw_client *cw, struct fx *f, int max_tokens,
		    int32_t *out, struct st_diag *diag)
{
	struct cw_gen_start_msg m;
	uint32_t id, n_prompt, fin = CW_FINISH_NONE;
	int r, n = 0;

	memset(&m, 0, sizeof(m));
	m.max_tokens = (uint32_t)max_tokens;
	m.temperature = 0.0f;
	m.top_p = 1.0f;
	m.flags = CW_GEN_F_IGNORE_EOS;
	m.prompt = (char *)PROMPT;
	r = cw_client_gen_start(cw, &m, &id, &n_prompt, NULL, diag);
	if (r < 0)
		return r;
	while (fin == CW_FINISH_NONE) {
		int32_t tok;
		char *text = NULL;

		r = cw_client_gen_next(cw, id, &tok, &fin, &text, diag);
		free(text);
		if (r < 0)
			return r;
		if (tok >= 0) {
			if (out)
				out[n] = tok;
			n++;
			atomic_store(&f->steps, n);
		}
	}
	cw_client_gen_end(cw, id);
	return n;
}

/* Kills f->victim (expertd or kvd) after 3 tokens, starts it again. */
static void *tier_killer_main(void *arg)
{
	struct fx *f = arg;
	int is_es = !strcmp(f->victim, "expertd");
	int *pidp = is_es ? &f->inst.pid_expertd : &f->inst.pid_kvd;
	uint64_t deadline = st_now_ns() + 60000000000ull;

	while (atomic_load(&f->steps) < 3 && st_now_ns() < deadline)
		st_sleep_ns(100000);
	kill(*pidp, SIGKILL);
	waitpid(*pidp, NULL, 0);
	*pidp = 0;
	st_sleep_ns(100000000ull);
	st_test_daemon_start(&f->inst, f->victim, is_es ? f->es_args :
			     f->kv_args, 30);
	return NULL;
}

/* Number of lines of <run_dir>/<daemon>.log containing `what`. */
static int log_count(struct fx *f, const char *daemon, const char *what)
{
	char path[4200], *txt = NULL, *q;
	int n = 0;

	st_run_path(f->inst.run_dir, daemon, "log", path, sizeof(path));
	if (st_read_file(path, &txt, NULL) < 0)
		return 0;
	for (q = txt; (q = strstr(q, what)); q++)
		n++;
	free(txt);
	return n;
}

static void *killer_main(void *arg)
{
	struct fx *f = arg;
	uint64_t deadline = st_now_ns() + 60000000000ull;
	int pid = f->inst.pid_computed;

	while (atomic_load(&f->steps) < 3 && st_now_ns() < deadline)
		st_sleep_ns(100000);
	f->kill_ns = st_now_ns();
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	f->inst.pid_computed = 0;
	atomic_store(&f->killed, 1);
	return NULL;
}

/* Waits (up to 10 s) until the tiers hold nothing of a dead computed:
 * one client less than before (es0, kv0: the counts with computed), no
 * pins, no sequences or pages. */
static int leases_dropped(struct fx *f, uint32_t es0, uint32_t kv0,
			  struct es_stats *es, struct kv_stats *kv,
			  uint64_t *pins)
{
	uint64_t deadline = st_now_ns() + 10000000000ull;

	for (;;) {
		struct st_shm shm;
		struct es_pool_view v;
		struct st_diag d = { "" };

		*pins = UINT64_MAX;
		if (st_shm_attach(&shm, f->inst.name, ES_POOL_KIND,
				  ES_POOL_LAYOUT_VERSION, 0, &d) == 0) {
			if (es_pool_view_init(shm.base, shm.size, 0, &v,
					      &d) == 0) {
				*pins = 0;
				for (uint32_t s = 0; s < v.n_slots; s++)
					*pins += es_slot_pin_sum(&v.slots[s]);
			}
			st_shm_detach(&shm);
		}
		if (es_client_stats(f->es, es) == 0 &&
		    kv_client_stats(f->kv, kv) == 0 &&
		    es->n_clients == es0 - 1 && *pins == 0 &&
		    kv->n_clients == kv0 - 1 && kv->n_seqs == 0 &&
		    kv->pages_used == 0)
			return 1;
		if (st_now_ns() > deadline)
			return 0;
		st_sleep_ns(50000000ull);
	}
}

int main(void)
{
	struct fx f;
	struct st_diag diag = { "" };
	struct cw_client *cw = NULL;
	struct cw_stats_wire s0, s1;
	struct es_stats es;
	struct kv_stats kv;
	const char **es_args = f.es_args, **kv_args = f.kv_args;
	int32_t want[N_TOKENS], got[N_TOKENS];
	uint64_t pins, t_kill, loads_warm;
	uint32_t es_clients0, kv_clients0;
	pthread_t th;
	int r;

	st_test_shared_dir();
	memset(&f, 0, sizeof(f));
	signal(SIGPIPE, SIG_IGN);
	f.es_args[0] = "--store";
	f.kv_args[0] = "--budget";
	f.kv_args[1] = "64MiB";
	st_test_tmpdir(f.tmp, sizeof(f.tmp));
	if (flt_convert("tiny-mixtral", f.tmp, f.store, sizeof(f.store)) < 0)
		return 1;
	es_args[1] = f.store;
	f.cw_args[0] = "--store";
	f.cw_args[1] = f.store;
	f.cw_args[2] = "--kv-dtype";
	f.cw_args[3] = "f32";
	f.cw_args[4] = "--threads";
	f.cw_args[5] = "1";
	f.cw_args[6] = NULL;
	st_test_inst_init(&f.inst, "cwk");
	if (st_test_daemon_start(&f.inst, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&f.inst, "kvd", kv_args, 30) < 0 ||
	    start_computed(&f) < 0 ||
	    es_client_open(f.inst.run_dir, f.inst.name, "observer", 5000, &f.es,
			   &diag) < 0 ||
	    kv_client_open(f.inst.run_dir, f.inst.name, "observer", 5000, &f.kv,
			   &diag) < 0 ||
	    cw_client_open(f.inst.run_dir, 30000, &cw, &diag) < 0) {
		fprintf(stderr, "setup: %s\n", diag.msg);
		st_test_inst_stop(&f.inst);
		return 1;
	}
	cw_client_set_watch(cw, computed_gone, &f);

	/* 1. undisturbed */
	r = generate(cw, &f, N_TOKENS, want, &diag);
	CHECK(r == N_TOKENS, "undisturbed generation: %d (%s)", r, diag.msg);

	/* 1b. kvd, then expertd, killed and restarted mid-generation */
	for (int i = 0; i < 2; i++) {
		f.victim = i ? "expertd" : "kvd";
		atomic_store(&f.steps, 0);
		pthread_create(&th, NULL, tier_killer_main, &f);
		r = generate(cw, &f, N_TOKENS, got, &diag);
		pthread_join(th, NULL);
		CHECK(r == N_TOKENS && !memcmp(want, got, sizeof(want)),
		      "generation across a %s restart: %d tokens (%s), %s",
		      f.victim, r, diag.msg, r == N_TOKENS ? "different" :
		      "failed");
	}
	/* every step asks kvd for rows: computed had to wait for it */
	CHECK(log_count(&f, "computed", "re-connected to a restarted kvd") == 1,
	      "computed's log does not show it re-connected to kvd once");
	CHECK(cw_client_stats(cw, &s0) == 0 && s0.es_pid == f.inst.pid_expertd &&
	      s0.kv_pid == f.inst.pid_kvd, "computed's STATS do not reach the "
	      "restarted daemons (expertd %d vs %d, kvd %d vs %d)", s0.es_pid,
	      f.inst.pid_expertd, s0.kv_pid, f.inst.pid_kvd);

	CHECK(es_client_stats(f.es, &es) == 0 && kv_client_stats(f.kv, &kv) == 0,
	      "tier stats");
	es_clients0 = es.n_clients;
	kv_clients0 = kv.n_clients;
	CHECK(es_clients0 >= 1 && kv_clients0 >= 1, "computed is not a "
	      "client of the tiers (%u, %u)", es_clients0, kv_clients0);

	/* 2. kill -9 while requests run */
	atomic_store(&f.steps, 0);
	pthread_create(&th, NULL, killer_main, &f);
	r = generate(cw, &f, 1000, NULL, &diag);
	pthread_join(th, NULL);
	t_kill = f.kill_ns;
	printf("killed after %d tokens; the client got, %.2f s later: %s "
	       "(%s)\n", atomic_load(&f.steps),
	       (double)(st_now_ns() - t_kill) / 1e9, st_strerror(r), diag.msg);
	CHECK(st_now_ns() - t_kill < 5000000000ull, "the client noticed the "
	      "death of computed only after %.1f s",
	      (double)(st_now_ns() - t_kill) / 1e9);
	CHECK(r == -ST_E_PEERGONE, "the request in flight ended with %s, "
	      "want -ST_E_PEERGONE", r < 0 ? st_strerror(r) : "success");
	cw_client_close(cw);
	cw = NULL;

	/* 3. the tiers dropped the dead computed's leases */
	CHECK(leases_dropped(&f, es_clients0, kv_clients0, &es, &kv, &pins),
	      "leases of the dead computed kept: expertd %u clients (%u with "
	      "computed), %" PRIu64 " pins; kvd %u clients (%u with computed), %"
	      PRIu64 " sequences, %" PRIu64 " pages", es.n_clients, es_clients0,
	      pins, kv.n_clients, kv_clients0, kv.n_seqs, kv.pages_used);
	printf("leases dropped %.2f s after the kill\n",
	       (double)(st_now_ns() - t_kill) / 1e9);
	loads_warm = es.loads;
	CHECK(es.slots_used > 0, "expertd's pool is empty after computed "
	      "died");

	/* 4. a new computed on warm tiers; the client retries */
	atomic_store(&f.killed, 0);
	if (start_computed(&f) < 0 ||
	    cw_client_open(f.inst.run_dir, 30000, &cw, &diag) < 0) {
		fprintf(stderr, "restarting computed: %s\n", diag.msg);
		st_test_inst_stop(&f.inst);
		return 1;
	}
	cw_client_set_watch(cw, computed_gone, &f);
	CHECK(cw_client_stats(cw, &s0) == 0, "STATS of the new computed");
	r = generate(cw, &f, N_TOKENS, got, &diag);
	CHECK(r == N_TOKENS, "retried generation: %d (%s)", r, diag.msg);
	CHECK(r != N_TOKENS || !memcmp(want, got, sizeof(want)),
	      "the retried generation differs from the undisturbed one");
	CHECK(cw_client_stats(cw, &s1) == 0, "STATS after the retry");
	printf("summary of the new computed: expert pool hits %" PRIu64
	       " -> %" PRIu64 ", loads from the store %" PRIu64 " -> %" PRIu64
	       " (%" PRIu64 " before it started)\n", s0.es_hits, s1.es_hits,
	       s0.es_loads, s1.es_loads, loads_warm);
	CHECK(s1.n_generations == 1, "the new computed counts %" PRIu64
	      " generations", s1.n_generations);
	CHECK(s1.es_loads == loads_warm && s0.es_loads == loads_warm,
	      "experts were read from the store again (%" PRIu64 " loads, %"
	      PRIu64 " before)", s1.es_loads, loads_warm);
	CHECK(s1.es_hits > s0.es_hits, "no expert pool hits in the retry");

	cw_client_close(cw);
	kv_client_close(f.kv);
	es_client_close(f.es);
	st_test_inst_stop(&f.inst);
	CHECK(st_test_count_segments(f.inst.name) == 0,
	      "segments left after the daemons stopped");
	CHECK(flt_count_run_files(f.inst.run_dir) == 0,
	      "sockets or pid files left in %s", f.inst.run_dir);
	if (!n_fail) {
		st_rm_rf(f.tmp);
		st_rm_rf(f.inst.run_dir);
	}
	printf("%s: %d failures\n", n_fail ? "FAILED" : "ok", n_fail);
	return n_fail ? 1 : 0;
}
