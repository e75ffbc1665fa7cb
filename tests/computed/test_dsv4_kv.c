/*
 * test_dsv4_kv.c — the DeepSeek-V4 sequence state in a real kvd's pages
 * (cw_dsv_state_new_kv) against the process-local reference state, on
 * ../shared tiny-deepseek-v4 (compress ratios 0,0,4,16,4,16, window 16).
 *
 * The reference: every case of reference.json (prompt + greedy
 * continuation) through the process-local state in chunks of 16; an XXH3
 * of the logits of every position is kept.  Then, each required to give
 * bit-identical logits at every position it evaluates:
 *  plain     every case in chunks of 7, page sizes 4, 6 and 16 tokens
 *            (6: pages not aligned to the ratio-4 windows; 4: ratio-16
 *            rows complete in every fourth page only);
 *  restart   two cases with kvd killed (SIGKILL) and started again in the
 *            middle of the sequence, the client re-registering;
 *  spill     six sequences of the longest case interleaved chunk by chunk
 *            with a kvd budget under half of the working set: pages must
 *            spill and come back;
 *  prefix    warm prefix cache: each case's prompt evaluated in prefix
 *            mode (its full pages published as it goes), then prompt +
 *            continuation started from the cache: exactly the expected
 *            rows are mapped, the rest is computed; a state fed other
 *            ids than its prompt publishes nothing;
 *  P10       with page size B in {4, 6, 8, 16}: prompts of B-1, B, B+1,
 *            2B, 2B+1 tokens, each sent twice with the prefix cache on:
 *            the second maps exactly 0, 0, B, B, 2B rows (the last token is
 *            always computed) and gives the same logits; these lengths
 *            cross the ratio-4 windows (B = 4, 6, 8) and the ratio-16
 *            window (B = 8: 15..17, B = 16: 15..17 and 31..33);
 *  P11       8 tokens with B = 4: 2 pages in every stream (the last one
 *            full), 9 tokens: 3; freeing gives every page back;
 *  store     the model from a V4 store, routed experts through a real
 *            expertd, the state in kvd: two cases cold and warm.
 * Figures printed: streams, pages, bytes per token, rows reused.
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cw_dsv.h"
#include "dsv_test_util.h"
#include "es_client.h"
#include "es_convert.h"
#include "kv_client.h"
#include "kv_pool.h"
#include "st_plan.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define MAX_CASES 8
#define CHUNK_MAX 16

/* cases[i].h: XXH3 of the logits of each position (reference) */
static struct dsvt_case cases[MAX_CASES];
static int n_cases, V;
static float *lbuf; /* [CHUNK_MAX][V] */
static const struct cw_dsv_model *M;

/* A kvd instance with one client that declared M's streams. */
struct kvd {
	struct st_test_inst t;
	const char *args[10];
	struct kv_client *kv;
	uint32_t B;
};

static int kvd_up(struct kvd *k, const char *tag, uint32_t B,
		  const char *budget, const char *spill)
{
	struct st_diag d = { { 0 } };
	int n = 0, r;

	memset(k, 0, sizeof(*k));
	k->B = B;
	k->args[n++] = "--budget";
	k->args[n++] = budget;
	if (spill) {
		k->args[n++] = "--spill-budget";
		k->args[n++] = spill;
	}
	k->args[n] = NULL;
	st_test_inst_init(&k->t, tag);
	if (st_test_daemon_start(&k->t, "kvd", k->args, 30) < 0) {
		CHECK(0, "%s: kvd did not start", tag);
		return -1;
	}
	r = kv_client_open(k->t.run_dir, k->t.name, "dsv4", 20000, &k->kv, &d);
	if (r == 0)
		r = cw_dsv_kv_declare(M, k->kv, B, 0, &d);
	CHECK(r == 0, "%s: open/declare: %s", tag, d.msg);
	if (r == 0)
		kv_client_set_restart_wait(k->kv, 20000);
	return r;
}

static void kvd_down(struct kvd *k)
{
	kv_client_close(k->kv);
	k->kv = NULL;
	st_test_inst_stop(&k->t);
	st_rm_rf(k->t.run_dir);
}

/* Evaluates positions [from, to) of case c on state s in chunks of
 * `chunk`, comparing every position's logits with the reference.
 * Returns 0, or -1 (eval failed or a position differed). */
static int publish_each;  /* run_span publishes after every chunk */

static int run_span(struct cw_dsv_state *s, const struct dsvt_case *c, int from,
		    int to, int chunk, const char *what)
{
	struct st_diag d = { { 0 } };

	for (int p = from; p < to; p += chunk) {
		int k = to - p < chunk ? to - p : chunk;
		int r = cw_dsv_eval(M, s, c->ids + p, k, 1, lbuf, &d);

		CHECK(r == 0, "%s %s: eval at %d: %s", what, c->name, p,
		      d.msg);
		if (r)
			return -1;
		/* before the next eval frees the out-of-window pages */
		if (publish_each && cw_dsv_state_publish(s, c->ids, p + k,
							  &d) < 0) {
			CHECK(0, "%s %s: publish at %d: %s", what, c->name,
			      p + k, d.msg);
			return -1;
		}
		for (int t = 0; t < k; t++)
			if (st_xxh3(lbuf + (size_t)t * V, (size_t)V * 4) !=
			    c->h[p + t]) {
				CHECK(0, "%s %s: logits differ at position %d",
				      what, c->name, p + t);
				return -1;
			}
	}
	return 0;
}

static void reference(void)
{
	struct st_diag d = { { 0 } };

	for (int i = 0; i < n_cases; i++) {
		struct dsvt_case *c = &cases[i];
		struct cw_dsv_state *s = NULL;

		if (cw_dsv_state_new(M, c->n, &s) < 0) {
			CHECK(0, "state");
			return;
		}
		for (int p = 0; p < c->n; p += CHUNK_MAX) {
			int k = c->n - p < CHUNK_MAX ? c->n - p : CHUNK_MAX;

			if (cw_dsv_eval(M, s, c->ids + p, k, 1, lbuf, &d)) {
				CHECK(0, "reference %s: %s", c->name, d.msg);
				break;
			}
			for (int t = 0; t < k; t++)
				c->h[p + t] = st_xxh3(lbuf + (size_t)t * V,
						      (size_t)V * 4);
		}
		cw_dsv_state_free(s);
	}
}

/* Pages a sequence of n tokens evaluated in chunks of `chunk` holds:
 * every position of every stream, but a windowed stream's pages that fell
 * out of its window before the last chunk's reservation are freed. */
static uint64_t expect_pages(uint32_t B, int n, int chunk)
{
	struct kv_stream_decl d[KV_MAX_STREAMS];
	int ns = cw_dsv_kv_decl(cw_dsv_config(M), 0, 4, d, KV_MAX_STREAMS);
	uint32_t last = (uint32_t)((n - 1) / chunk * chunk);
	uint64_t pages = 0;

	for (int i = 0; i < ns; i++) {
		uint32_t dead = 0;

		if (d[i].window_rows && last > d[i].window_rows)
			dead = (last - d[i].window_rows) / B;
		pages += kv_pages_for_rows((uint32_t)n, B) - dead;
	}
	return pages;
}

static void test_plain(uint32_t B)
{
	char tag[32];
	struct kvd k;
	struct kv_stats st;
	long pos = 0;

	snprintf(tag, sizeof(tag), "v4p%u", B);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	for (int i = 0; i < n_cases; i++) {
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;
		int r = cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d);

		CHECK(r == 0, "new_kv: %s", d.msg);
		if (r)
			break;
		if (run_span(s, &cases[i], 0, cases[i].n, 7, tag) == 0)
			pos += cases[i].n;
		if (kv_client_stats(k.kv, &st) == 0) {
			uint64_t want = expect_pages(B, cases[i].n, 7);

			/* pages by token, window pages freed as they fall
			 * out (the independent count above) */
			CHECK(st.pages_used == want,
			      "B=%u, %s: %llu pages used, expected %llu", B,
			      cases[i].name, (unsigned long long)st.pages_used,
			      (unsigned long long)want);
			if (i == n_cases - 1)
				printf("page size %u tokens: %u streams, page "
				       "%llu bytes; %d tokens hold %llu pages "
				       "(%llu without the window freeing), "
				       "%.0f bytes per token in kvd\n", B,
				       st.n_streams,
				       (unsigned long long)st.page_bytes,
				       cases[i].n,
				       (unsigned long long)st.pages_used,
				       (unsigned long long)kv_pages_for_rows(
					       (uint32_t)cases[i].n, B) *
					       st.n_streams,
				       (double)st.pages_used * st.page_bytes /
					       cases[i].n);
		}
		cw_dsv_state_free(s);
	}
	CHECK(kv_client_stats(k.kv, &st) == 0 && st.pages_used == 0 &&
	      st.n_seqs == 0, "B=%u: pages or sequences left after free", B);
	printf("page size %u: %ld positions bit-identical to the "
	       "process-local state\n", B, pos);
out:
	kvd_down(&k);
}

static int restart_kvd(struct kvd *k)
{
	if (k->t.pid_kvd > 0) {
		kill(k->t.pid_kvd, SIGKILL);
		waitpid(k->t.pid_kvd, NULL, 0);
		k->t.pid_kvd = 0;
	}
	return st_test_daemon_start(&k->t, "kvd", k->args, 30) < 0 ? -1 : 0;
}

static void test_restart(void)
{
	struct kvd k;
	int done = 0;

	if (kvd_up(&k, "v4rs", 4, "64MiB", NULL) < 0)
		goto out;
	/* the two longest cases */
	for (int i = n_cases - 2; i < n_cases; i++) {
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;
		const struct dsvt_case *c = &cases[i];
		int half = c->n / 2 + 1; /* not on a page boundary */

		CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d) == 0,
		      "new_kv: %s", d.msg);
		if (!s)
			break;
		if (run_span(s, c, 0, half, 5, "restart") == 0 &&
		    restart_kvd(&k) == 0 &&
		    run_span(s, c, half, c->n, 5, "restart") == 0)
			done++;
		cw_dsv_state_free(s);
	}
	CHECK(done == 2, "restart: %d of 2 sequences went on", done);
	CHECK(kv_client_reconnects(k.kv) >= 2, "client reconnected %u times",
	      kv_client_reconnects(k.kv));
	printf("kvd killed and restarted mid-sequence twice: %d sequences "
	       "bit-identical (%u reconnects)\n", done,
	       kv_client_reconnects(k.kv));
out:
	kvd_down(&k);
}

#define N_SPILL 6

/* N_SPILL sequences of the longest case interleaved chunk by chunk (none
 * finishes before the others, so the least recently used one is always a
 * running one: spilled pages must come back). */
static void test_spill(void)
{
	struct cw_dsv_state *s[N_SPILL] = { 0 };
	const struct dsvt_case *c = &cases[n_cases - 1];
	struct st_diag d = { { 0 } };
	struct kv_stats st = { 0 };
	struct kvd k;
	int ok = 1;
	const int chunk = 8;
	uint64_t need = 0;

	/* B = 16: pages of 16 KiB (16 rows of the CSA compressor state);
	 * the longest case has 13 pages per stream (the pool must give a
	 * sequence that many table positions: 13 x 18 streams = 234), the
	 * six hold more than twice the 256 pages of a 4 MiB budget */
	if (kvd_up(&k, "v4sp", 16, "4MiB", "64MiB") < 0)
		goto out;
	for (int i = 0; i < N_SPILL; i++) {
		CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s[i], &d) == 0,
		      "new_kv: %s", d.msg);
		ok &= s[i] != NULL;
	}
	for (int p = 0; ok && p < c->n; p += chunk) {
		int to = p + chunk < c->n ? p + chunk : c->n;

		for (int i = 0; i < N_SPILL && ok; i++)
			ok = run_span(s[i], c, p, to, chunk, "spill") == 0;
	}
	CHECK(kv_client_stats(k.kv, &st) == 0, "stats");
	need = N_SPILL * expect_pages(16, c->n, chunk);
	printf("spill: %d sequences of %d tokens, working set %llu pages, "
	       "pool %llu pages; %llu pages spilled, %llu restored; %s\n",
	       N_SPILL, c->n, (unsigned long long)need,
	       (unsigned long long)st.n_pages,
	       (unsigned long long)st.spill_pages_total,
	       (unsigned long long)st.restore_pages_total,
	       ok ? "every position bit-identical" : "FAILED");
	CHECK(ok, "spill run failed");
	CHECK(st.n_pages * 2 < need, "the pool (%llu pages) is not small "
	      "against the working set (%llu)",
	      (unsigned long long)st.n_pages, (unsigned long long)need);
	CHECK(st.spill_pages_total > 0 && st.restore_pages_total > 0,
	      "nothing spilled and restored");
	for (int i = 0; i < N_SPILL; i++)
		cw_dsv_state_free(s[i]);
out:
	kvd_down(&k);
}

/* Prompt of n ids from case c, sent twice (second from the cache): the
 * first evaluates publish_n ids in chunks, its full pages published by
 * prefix mode (cw_dsv_state_new_kv with the prompt) or, explicit, by
 * cw_dsv_state_publish after each chunk of a state made without one.
 * Returns the rows mapped the second time, or -1. */
static int twice(struct kvd *k, const struct dsvt_case *c, int n, int publish_n,
		 int chunk, int explicit)
{
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *a = NULL, *b = NULL;
	int cached = -1, r;

	r = cw_dsv_state_new_kv(M, k->kv, explicit ? NULL : c->ids,
				 explicit ? 0 : publish_n, 0, &a, &d);
	CHECK(r == 0, "new_kv: %s", d.msg);
	if (r)
		return -1;
	publish_each = explicit;
	r = run_span(a, c, cw_dsv_state_len(a), publish_n, chunk, "first");
	publish_each = 0;
	if (r)
		goto out;
	r = cw_dsv_state_new_kv(M, k->kv, c->ids, n, 0, &b, &d);
	CHECK(r == 0, "new_kv (warm): %s", d.msg);
	if (r)
		goto out;
	r = cw_dsv_state_len(b);
	if (run_span(b, c, r, n, chunk, "warm") == 0)
		cached = r;
out:
	cw_dsv_state_free(a);
	cw_dsv_state_free(b);
	return cached;
}

static void test_prefix(void)
{
	struct kvd k;
	struct kv_stats st;
	long reused = 0, computed = 0;
	const uint32_t B = 8;

	if (kvd_up(&k, "v4pc", B, "64MiB", NULL) < 0)
		goto out;
	for (int i = 0; i < n_cases; i++) {
		const struct dsvt_case *c = &cases[i];
		int want = (int)((uint32_t)c->n_prompt / B * B);
		int got;

		if (want > c->n - 1)
			want = (c->n - 1) / (int)B * (int)B;
		got = twice(&k, c, c->n, c->n_prompt, 16, 0);
		CHECK(got == want, "prefix %s: %d rows mapped, expected %d",
		      c->name, got, want);
		if (got >= 0) {
			reused += got;
			computed += c->n - got;
		}
	}
	CHECK(kv_client_stats(k.kv, &st) == 0, "stats");
	printf("prefix cache (B = %u): %ld positions from cached pages, %ld "
	       "computed after them, all bit-identical; kvd: %llu groups "
	       "hit, %llu rows reused\n", B, reused, computed,
	       (unsigned long long)st.prefix_pages_hit,
	       (unsigned long long)st.prefix_rows_reused);
	CHECK(st.prefix_rows_reused == (uint64_t)reused,
	      "kvd counts %llu rows reused, the states %ld",
	      (unsigned long long)st.prefix_rows_reused, reused);
out:
	kvd_down(&k);
}

static void test_p10(uint32_t B)
{
	const struct dsvt_case *c = &cases[n_cases - 1]; /* the longest */
	const int lens[5] = { (int)B - 1, (int)B, (int)B + 1, 2 * (int)B,
			      2 * (int)B + 1 };
	const int want[5] = { 0, 0, (int)B, (int)B, 2 * (int)B };
	char tag[32];
	struct kvd k;

	snprintf(tag, sizeof(tag), "v4p10b%u", B);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	printf("P10 B=%u: prompts", B);
	for (int i = 0; i < 5; i++) {
		int got;

		if (lens[i] < 1 || lens[i] > c->n)
			continue;
		got = twice(&k, c, lens[i], lens[i], 3, B == 6 || B == 16);
		CHECK(got == want[i], "P10 B=%u, %d tokens: %d rows from the "
		      "cache, expected %d", B, lens[i], got, want[i]);
		printf(" %d (%d cached)", lens[i], got);
	}
	printf(": second answers bit-identical\n");
out:
	kvd_down(&k);
}

/* Prefix mode publishes only rows computed from the prompt's own ids: a
 * state made for one prompt but fed other ids publishes nothing, and a
 * later sequence with that prompt maps nothing. */
static void test_publish_guard(void)
{
	const struct dsvt_case *c = &cases[n_cases - 1], *o = &cases[n_cases - 2];
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *a = NULL, *b = NULL;
	struct kv_stats st;
	struct kvd k;

	if (kvd_up(&k, "v4pg", 4, "64MiB", NULL) < 0)
		goto out;
	CHECK(memcmp(c->ids + 1, o->ids + 1, 4 * sizeof(int32_t)) != 0,
	      "the two cases share their first tokens");
	CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, 12, 0, &a, &d) == 0,
	      "new: %s", d.msg);
	if (a)
		CHECK(run_span(a, o, 0, 12, 12, "guard") == 0, "other ids");
	CHECK(kv_client_stats(k.kv, &st) == 0 && st.prefix_published == 0,
	      "%llu groups published from ids that are not the prompt's",
	      (unsigned long long)st.prefix_published);
	CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, 12, 0, &b, &d) == 0 &&
	      cw_dsv_state_len(b) == 0, "the wrong rows were found");
	printf("prefix mode: rows of other ids than the prompt's are never "
	       "published\n");
	cw_dsv_state_free(a);
	cw_dsv_state_free(b);
out:
	kvd_down(&k);
}

static void test_p11(void)
{
	const struct dsvt_case *c = &cases[n_cases - 1];
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *s = NULL;
	struct kv_stats st;
	struct kvd k;

	if (kvd_up(&k, "v4p11", 4, "64MiB", NULL) < 0)
		goto out;
	CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d) == 0, "new: %s",
	      d.msg);
	if (!s)
		goto out;
	CHECK(run_span(s, c, 0, 8, 8, "P11") == 0, "8 tokens");
	CHECK(kv_client_stats(k.kv, &st) == 0 &&
	      st.pages_used == 2ull * st.n_streams,
	      "8 tokens, B = 4: %llu pages, expected 2 per stream x %u",
	      (unsigned long long)st.pages_used, st.n_streams);
	/* a ratio-4 row per page, both complete; the ratio-16 stream's
	 * rows are not there yet: row 0 completes at token 15 (page 3) */
	CHECK(kv_client_seq_rows(k.kv, cw_dsv_state_seq(s)) == 8, "rows");
	CHECK(run_span(s, c, 8, 9, 1, "P11") == 0, "9th token");
	CHECK(kv_client_stats(k.kv, &st) == 0 &&
	      st.pages_used == 3ull * st.n_streams,
	      "9 tokens, B = 4: %llu pages, expected 3 per stream x %u",
	      (unsigned long long)st.pages_used, st.n_streams);
	cw_dsv_state_free(s);
	CHECK(kv_client_stats(k.kv, &st) == 0 && st.pages_used == 0,
	      "after free: %llu pages used", (unsigned long long)st.pages_used);
	printf("P11 B=4: 8 tokens -> 2 pages per stream, 9 -> 3, free -> 0\n");
out:
	kvd_down(&k);
}

/* The serving combination: the model from a V4 store with its routed
 * experts from a real expertd (cw_dsv_load_store, half the experts in
 * the pool), the state in a real kvd of the same instance: two cases, each
 * evaluated and published chunk by chunk, then again from the warm prefix
 * cache, every position bit-identical to the reference. */
static void test_store(const char *model_dir)
{
	char tmp[4096], store[4200];
	const char *es_args[5] = { "--store", store, "--host-budget", "50%",
				   NULL };
	const char *kv_args[] = { "--budget", "64MiB", NULL };
	struct st_diag d = { { 0 } };
	struct es_convert_opts o;
	struct cw_dsv_model *sm = NULL;
	struct es_client *es = NULL;
	struct kvd k;
	long pos = 0;
	int r;

	memset(&k, 0, sizeof(k));
	k.B = 8;
	st_test_tmpdir(tmp, sizeof(tmp));
	snprintf(store, sizeof(store), "%s/store", tmp);
	es_convert_opts_init(&o);
	r = es_convert(model_dir, store, &o, &d);
	CHECK(r == 0, "convert: %s", d.msg);
	if (r)
		goto out;
	st_test_inst_init(&k.t, "v4st");
	if (st_test_daemon_start(&k.t, "expertd", es_args, 30) < 0 ||
	    st_test_daemon_start(&k.t, "kvd", kv_args, 30) < 0) {
		CHECK(0, "daemons did not start");
		goto out;
	}
	r = es_client_open(k.t.run_dir, k.t.name, "dsv4", 20000, &es, &d);
	if (r == 0)
		r = cw_dsv_load_store(store, es, ST_DSV_REV_V4,
				      CW_COMPUTE_REFERENCE, &sm, &d);
	if (r == 0)
		r = kv_client_open(k.t.run_dir, k.t.name, "dsv4", 20000, &k.kv,
				   &d);
	if (r == 0)
		r = cw_dsv_kv_declare(sm, k.kv, k.B, 0, &d);
	CHECK(r == 0, "store + expertd + kvd: %s", d.msg);
	if (r)
		goto out;
	/* the same model id as the checkpoint's model: the same rows */
	CHECK(cw_dsv_model_id(sm) == cw_dsv_model_id(M),
	      "store and checkpoint models have different ids");
	{
		const struct cw_dsv_model *keep = M;

		M = sm;
		for (int i = 2; i <= 3 && i < n_cases; i++) {
			const struct dsvt_case *c = &cases[i];
			int got = twice(&k, c, c->n, c->n_prompt, 9, 0);

			CHECK(got == c->n_prompt / 8 * 8, "store %s: %d rows "
			      "from the cache, expected %d", c->name, got,
			      c->n_prompt / 8 * 8);
			pos += c->n;
		}
		M = keep;
	}
	printf("store model, experts through expertd, state in kvd: %ld "
	       "positions (cold and warm) bit-identical\n", pos);
out:
	cw_dsv_free(sm);
	es_client_close(es);
	kvd_down(&k);
	st_rm_rf(tmp);
}

/* The declaration kvd gets, the planner's streams and the bytes per token
 * are the same figures (cw_dsv_kv_decl, cw_dsv4_plan_streams,
 * cw_dsv4_kv_bytes_per_token, cw_dsv4_fixed_bytes). */
static void test_declaration(const struct st_dsv_config *c)
{
	struct kv_stream_decl d[KV_MAX_STREAMS];
	struct st_plan_model pm;
	int n = cw_dsv_kv_decl(c, 0, 4, d, KV_MAX_STREAMS), n_csa = 0, n_hca = 0;
	double grow = 0, fixed = 0;

	for (int l = 0; l < c->n_layers; l++) {
		n_csa += c->compress_ratio[l] == 4;
		n_hca += c->compress_ratio[l] > 4;
	}
	/* a window per layer; CSA: rows, state, index rows, index state;
	 * HCA: rows and state */
	CHECK(n == c->n_layers + 4 * n_csa + 2 * n_hca, "%d streams", n);
	for (int i = 0; i < n; i++) {
		CHECK(d[i].tokens_per_row == 1 || d[i].window_rows == 0,
		      "stream %d both pooled and windowed", i);
		if (d[i].window_rows)
			fixed += (double)d[i].row_bytes * d[i].window_rows;
		else
			grow += (double)d[i].row_bytes / d[i].tokens_per_row;
	}
	CHECK(grow == cw_dsv4_kv_bytes_per_token(c, 4), "growing %.1f vs %.1f",
	      grow, cw_dsv4_kv_bytes_per_token(c, 4));
	CHECK(fixed == cw_dsv4_fixed_bytes(c, 4), "fixed %.0f vs %.0f", fixed,
	      cw_dsv4_fixed_bytes(c, 4));
	memset(&pm, 0, sizeof(pm));
	CHECK(cw_dsv4_plan_streams(c, &pm) == 0, "plan streams");
	/* 4096 tokens: every window full, every pooled row complete */
	CHECK((double)st_plan_kv_bytes(&pm, ST_DTYPE_F32, 4096) ==
		      4096 * grow + fixed,
	      "plan: %llu bytes for 4096 tokens, declaration %.0f",
	      (unsigned long long)st_plan_kv_bytes(&pm, ST_DTYPE_F32, 4096),
	      4096 * grow + fixed);
	printf("declaration: %d kvd streams, %.1f B per token (pooled rows, "
	       "index keys) + %.0f B per sequence (windows, compressor "
	       "states), F32; planner groups %d\n", n, grow, fixed,
	       pm.n_streams);
}

int main(void)
{
	char dir[4096];
	struct st_diag diag = { { 0 } };
	struct cw_dsv_model *m = NULL;
	const struct st_dsv_config *c;
	json_t *refj;

	st_test_fixture_model("tiny-deepseek-v4", dir, sizeof(dir));
	if (cw_dsv_load(dir, ST_DSV_REV_V4, CW_COMPUTE_REFERENCE, &m, &diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	M = m;
	c = cw_dsv_config(m);
	V = c->vocab_size;
	refj = dsvt_load_json(dir, "reference.json");
	/* shortest first: restart, spill, P10, P11 use the last ones */
	n_cases = dsvt_cases_load(dsvt_cases(refj, "reference.json"),
				  MAX_CASES, cases);
	if (n_cases < 0)
		return 1;
	lbuf = malloc((size_t)CHUNK_MAX * V * sizeof(float));
	if (!lbuf || n_cases < 3) {
		fprintf(stderr, "setup: %d cases\n", n_cases);
		return 1;
	}
	test_declaration(c);
	reference();
	test_p11();
	test_publish_guard();
	test_plain(4);
	test_plain(6);
	test_plain(16);
	test_restart();
	test_spill();
	test_prefix();
	test_p10(4);
	test_p10(6);
	test_p10(8);
	test_p10(16);
	test_store(dir);
	dsvt_cases_free(cases, n_cases);
	free(lbuf);
	json_decref(refj);
	cw_dsv_free(m);
	return dsvt_finish(n_fail);
}
