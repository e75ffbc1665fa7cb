/*
 * test_dsv_kv.c — the DeepSeek-V4 family's sequence state in a real kvd's
 * pages (cw_dsv_state_new_kv) against the process-local reference state,
 * one test for every revision (argv[1]: v4 or v41; argv[2] for v41: the
 * group plain, daemon or prefix; v4 runs every group):
 *  v4   ../shared tiny-deepseek-v4 (compress ratios 0,0,4,16,4,16, window
 *       16), F32 rows;
 *  v41  ../shared tiny-deepseek-v41 (compress ratios 0,0,2,2,2,2,1,1,1,1,
 *       KV sources 2, 4, 6, window 16; QAT on), in the V4.1 storage
 *       formats.
 *
 * The reference: every case of reference.json (prompt + greedy
 * continuation) through the process-local state in chunks of 16; an XXH3
 * of the logits of every position is kept.  Then, each required to give
 * bit-identical logits at every position it evaluates:
 *  decl      the declaration's streams and bytes against an independent
 *            count (V4: the planner's streams and cw_dsv4_kv_bytes_per_
 *            token / _fixed_bytes; V4.1: the st_kvfmt_v41.h row sizes);
 *  plain     every case in chunks of 7 at the revision's page sizes (V4:
 *            4, 6 and 16 tokens; 6: pages not aligned to the ratio-4
 *            windows; 4: ratio-16 rows complete in every fourth page only;
 *            V4.1: 3, 4 and 5, 3 and 5 cutting ratio-2 groups across
 *            pages), the pages held checked; P11: 8 tokens with B = 4
 *            hold 2 pages in every stream, 9 hold 3 (V4.1's partial-group
 *            streams, which keep 2 rows, 2: their first page is freed),
 *            freeing gives every page back; prefix mode publishes only
 *            rows of the prompt's own ids (V4);
 *            V4.1: QAT off (F32 rows, two cases against their own
 *            reference) and the CED prefill shortcut (exact) on a kvd
 *            state;
 *  daemon    the two longest cases with kvd killed (SIGKILL) and started
 *            again mid-sequence, the client re-registering (V4.1: at an
 *            odd position, a ratio-2 group open); six sequences of the
 *            longest case interleaved chunk by chunk with a kvd budget
 *            under half of the working set: pages must spill and come
 *            back;
 *  prefix    warm prefix cache: each case's prompt evaluated in prefix
 *            mode (its full pages published as it goes), then prompt +
 *            continuation started from the cache: exactly the expected
 *            rows are mapped, the rest is computed; P10 with page size B
 *            (V4: 4, 6, 8, 16, crossing the ratio-4 and ratio-16 windows;
 *            V4.1: 3, 4): prompts of B-1, B, B+1, 2B, 2B+1 tokens, each
 *            sent twice: the second maps exactly 0, 0, B, B, 2B rows and
 *            gives the same logits; generated tokens (a prompt, then its
 *            continuation fed one token per eval) published as decode
 *            crosses each page boundary: prompt + continuation maps every
 *            full page of them (B: the first P10 size and the prefix one);
 *            a private state (KV_PUBLISH_F_PRIVATE) publishes nothing to
 *            kvd's remote tier (a real redis-server; skipped without
 *            one), a plain one does;
 *            V4.1: SWA bounded replay on a prefix hit (swa_replay = W,
 *            the model's way): bit-identical to the process-local state
 *            that drops its window and replays the same tokens, and not
 *            to the full computation (at least one position differs);
 *            replaying the whole prefix: bit-identical to the full one;
 *  store     (V4) the model from a V4 store, routed experts through a
 *            real expertd, the state in kvd: two cases cold and warm.
 * Figures printed: streams, pages, bytes per token, rows reused.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
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
#include "kv_proto.h"
#include "../kvd/kv_test_util.h"
#include "st_config_dsv41.h"
#include "st_kvfmt_v41.h"
#include "st_plan.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

static int n_fail;

#define MAX_CASES 8
#define CHUNK_MAX 16

/* What differs between the revisions in these tests. */
struct rev {
	const char *name;          /* "v4", "v41": tags, the kvd client */
	const char *fixture;
	enum st_dsv_revision rev;
	int min_cases;
	unsigned qat;              /* the declared row formats */
	uint32_t plain_B[3];       /* page sizes of the plain runs */
	int restart_odd;           /* restart at an odd position */
	const char *spill_budget;  /* under half the spill working set */
	uint32_t prefix_B;
	int prefix_chunk;
	uint32_t p10_B[4];         /* 0: none */
	uint32_t p10_explicit[2];  /* B published explicitly, not by prefix
				    * mode */
	int p10_chunk;
	int p11_freed;             /* pages the 9th token frees */
};

static const struct rev k_v4 = {
	"v4", "tiny-deepseek-v4", ST_DSV_REV_V4, 3, 0, { 4, 6, 16 }, 0,
	"4MiB", 8, 16, { 4, 6, 8, 16 }, { 6, 16 }, 3, 0,
};
static const struct rev k_v41 = {
	"v41", "tiny-deepseek-v41", ST_DSV_REV_V41, 4, CW_DSV41_QAT_ALL,
	{ 3, 4, 5 }, 1, "2MiB", 5, 6, { 3, 4, 0, 0 }, { 3, 0 }, 2, 2,
};
static const struct rev *R;

/* cases[i].h: XXH3 of the logits of each position (reference) */
static struct dsvt_case cases[MAX_CASES];
static int n_cases, V;
static float *lbuf; /* [CHUNK_MAX][V] */
static struct cw_dsv_model *M;

/* A kvd instance with one client that declared M's streams. */
struct kvd {
	struct st_test_inst t;
	const char *args[10];
	struct kv_client *kv;
	uint32_t B;
};

static const char *kvd_remote; /* kvd_up: --remote-kv URL, or NULL */

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
	if (kvd_remote) {
		k->args[n++] = "--remote-kv";
		k->args[n++] = kvd_remote;
	}
	k->args[n] = NULL;
	st_test_inst_init(&k->t, tag);
	if (st_test_daemon_start(&k->t, "kvd", k->args, 30) < 0) {
		CHECK(0, "%s: kvd did not start", tag);
		return -1;
	}
	r = kv_client_open(k->t.run_dir, k->t.name, R->name[2] ? "dsv41" :
			   "dsv4", 20000, &k->kv, &d);
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

static int publish_each; /* run_span publishes after every chunk */

/* Evaluates positions [from, to) of case c on s in chunks of `chunk`,
 * each position's logits against the reference hashes h (NULL: c->h).
 * Returns 0, or -1 (eval failed or a position differed). */
static int run_span_h(struct cw_dsv_state *s, const struct dsvt_case *c,
		      const uint64_t *h, int from, int to, int chunk,
		      const char *what)
{
	struct st_diag d = { { 0 } };

	for (int p = from; p < to; p += chunk) {
		int k = to - p < chunk ? to - p : chunk;
		int r = cw_dsv_eval(M, s, c->ids + p, k, 1, lbuf, &d);

		CHECK(r == 0, "%s %s: eval at %d: %s", what, c->name, p,
		      d.msg);
		if (r)
			return -1;
		if (publish_each && cw_dsv_state_publish(s, c->ids, p + k,
							   &d) < 0) {
			CHECK(0, "%s %s: publish at %d: %s", what, c->name,
			      p + k, d.msg);
			return -1;
		}
		for (int t = 0; t < k; t++)
			if (st_xxh3(lbuf + (size_t)t * V, (size_t)V * 4) !=
			    (h ? h : c->h)[p + t]) {
				CHECK(0, "%s %s: logits differ at position %d",
				      what, c->name, p + t);
				return -1;
			}
	}
	return 0;
}

static int run_span(struct cw_dsv_state *s, const struct dsvt_case *c,
		    int from, int to, int chunk, const char *what)
{
	return run_span_h(s, c, NULL, from, to, chunk, what);
}

/* Hashes of every position's logits of case c through the process-local
 * state (chunks of 16) into h. */
static int reference_case(const struct dsvt_case *c, uint64_t *h)
{
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *s = NULL;
	int r = cw_dsv_state_new(M, c->n, &s);

	for (int p = 0; r == 0 && p < c->n; p += CHUNK_MAX) {
		int k = c->n - p < CHUNK_MAX ? c->n - p : CHUNK_MAX;

		r = cw_dsv_eval(M, s, c->ids + p, k, 1, lbuf, &d);
		for (int t = 0; r == 0 && t < k; t++)
			h[p + t] = st_xxh3(lbuf + (size_t)t * V, (size_t)V * 4);
	}
	CHECK(r == 0, "reference %s: %s", c->name, d.msg);
	cw_dsv_state_free(s);
	return r;
}

/* Pages a sequence of n tokens evaluated in chunks of `chunk` holds:
 * every row position of every stream, less a windowed stream's pages that
 * fell out of its window before the last chunk's reservation. */
static uint64_t expect_pages(uint32_t B, int n, int chunk)
{
	struct kv_stream_decl d[KV_MAX_STREAMS];
	int ns = cw_dsv_kv_decl(cw_dsv_config(M), R->qat, 4, d,
				KV_MAX_STREAMS);
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

/* The declaration kvd gets, the planner's streams and the bytes per token
 * are the same figures (cw_dsv_kv_decl, cw_dsv4_plan_streams,
 * cw_dsv4_kv_bytes_per_token, cw_dsv4_fixed_bytes). */
static void test_declaration_v4(const struct st_dsv_config *c)
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

/* Streams and bytes: the declaration against a count from the formats. */
static void test_declaration_v41(const struct st_dsv_config *c)
{
	struct kv_stream_decl d[KV_MAX_STREAMS];
	int n = cw_dsv_kv_decl(c, CW_DSV41_QAT_ALL, 4, d, KV_MAX_STREAMS);
	int want = c->n_layers, nf;
	double grow = 0, fixed = 0, g2 = 0, f2 = 0;
	const double hd = c->head_dim, Id = c->index_head_dim;

	for (int l = 0; l < c->n_layers; l++) {
		int mr = c->compress_ratio[l];

		/* window FP8: hd codes + hd/32 ue8m0 bytes, W rows */
		f2 += (hd + hd / 32) * c->sliding_window;
		if (!c->kv_source[l])
			continue;
		want += 2 + (mr > 1);
		/* FP4 row: hd/2 code bytes + hd/16 E4M3 scales; FP4 key:
		 * Id/2 + Id/32 ue8m0 */
		g2 += (hd / 2 + hd / 16 + Id / 2 + Id / 32) / mr;
		if (mr > 1)
			f2 += 2 * hd * 4 * mr;
	}
	CHECK(n == want, "%d streams declared, expected %d", n, want);
	for (int i = 0; i < n; i++) {
		CHECK(d[i].tokens_per_row == 1 || d[i].window_rows == 0,
		      "stream %d both pooled and windowed", i);
		if (d[i].window_rows)
			fixed += (double)d[i].row_bytes * d[i].window_rows;
		else
			grow += (double)d[i].row_bytes / d[i].tokens_per_row;
	}
	CHECK(grow == g2, "declared %.2f B per token, formats give %.2f",
	      grow, g2);
	CHECK(grow == cw_dsv41_kv_bytes_per_token(c), "declared %.2f B per "
	      "token, cw_dsv41_kv_bytes_per_token %.2f", grow,
	      cw_dsv41_kv_bytes_per_token(c));
	CHECK(fixed == f2, "declared %.0f B per sequence, expected %.0f",
	      fixed, f2);
	/* QAT off: F32 rows */
	nf = cw_dsv_kv_decl(c, 0, 4, d, KV_MAX_STREAMS);
	CHECK(nf == n && d[0].row_bytes == (uint32_t)(4 * c->head_dim),
	      "QAT off: %d streams, window row %u B", nf, d[0].row_bytes);
	CHECK(cw_dsv_kv_decl(c, CW_DSV41_QAT_ALL, 4, d, n - 1) == -ST_E_LIMIT,
	      "a too-small declaration array accepted");
	printf("declaration: %d kvd streams, %.2f B per token (FP4 compressed "
	       "rows, FP4 index keys) + %.0f B per sequence (FP8 windows, "
	       "F32 partial groups)\n", n, grow, fixed);
}

static void test_plain(uint32_t B)
{
	char tag[32];
	struct kvd k;
	struct kv_stats st;
	long pos = 0;

	snprintf(tag, sizeof(tag), "%sp%u", R->name, B);
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
				       "%llu B; %d tokens hold %llu pages, "
				       "%.0f B per token in kvd\n", B,
				       st.n_streams,
				       (unsigned long long)st.page_bytes,
				       cases[i].n,
				       (unsigned long long)st.pages_used,
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

/* QAT off: F32 rows in kvd, against the process-local state without QAT. */
static void test_noqat(void)
{
	struct kvd k;
	long pos = 0;
	const unsigned q0 = cw_dsv_qat(M); /* the load default */

	cw_dsv_set_qat(M, 0);
	if (kvd_up(&k, "v41nq", 5, "64MiB", NULL) < 0)
		goto out;
	for (int i = n_cases - 3; i < n_cases - 1; i++) {
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;
		uint64_t *h = calloc((size_t)cases[i].n, sizeof(uint64_t)),
			 *hq = cases[i].h;

		if (!h || reference_case(&cases[i], h) < 0) {
			free(h);
			break;
		}
		CHECK(h[cases[i].n - 1] != hq[cases[i].n - 1],
		      "QAT off gives the QAT logits (%s)", cases[i].name);
		CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d) == 0,
		      "new_kv: %s", d.msg);
		if (s && run_span_h(s, &cases[i], h, 0, cases[i].n, 6,
				    "noqat") == 0)
			pos += cases[i].n;
		cw_dsv_state_free(s);
		free(h);
	}
	printf("QAT off (F32 rows): %ld positions bit-identical\n", pos);
	{	/* QAT back on: the F32 declaration no longer fits */
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;

		cw_dsv_set_qat(M, q0);
		CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d) ==
			      -ST_E_CONFIG && !s,
		      "a state with other QAT flags than declared accepted");
	}
out:
	kvd_down(&k);
	cw_dsv_set_qat(M, q0);
}

/* The CED shortcut (EXACT) on a kvd state: the layers after the last KV
 * source write only their last window's rows; the prompt's last logits
 * and every decode step after it bit-identical to the reference. */
static void test_ced(void)
{
	struct kvd k;
	int ok = 0, n_run = 0;

	if (kvd_up(&k, "v41ced", 4, "64MiB", NULL) < 0)
		goto out;
	for (int i = n_cases - 2; i < n_cases; i++) {
		const struct dsvt_case *c = &cases[i];
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;
		int r = cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d);

		n_run++;
		if (r == 0)
			r = cw_dsv41_set_ced_shortcut(s, CW_DSV41_CED_EXACT);
		if (r == 0)
			r = cw_dsv_eval(M, s, c->ids, c->n_prompt, 0, lbuf,
					  &d);
		CHECK(r == 0, "CED %s: %s", c->name, d.msg);
		if (r == 0 && st_xxh3(lbuf, (size_t)V * 4) !=
				      c->h[c->n_prompt - 1]) {
			CHECK(0, "CED %s: last prompt logits differ", c->name);
			r = -1;
		}
		if (r == 0 && s)
			cw_dsv41_set_ced_shortcut(s, CW_DSV41_CED_OFF);
		if (r == 0 && run_span(s, c, c->n_prompt, c->n, 1, "CED") == 0)
			ok++;
		cw_dsv_state_free(s);
	}
	CHECK(ok == n_run, "CED: %d of %d cases", ok, n_run);
	printf("CED shortcut (exact) on a kvd state: %d prompts, last logits "
	       "and every decode step bit-identical\n", ok);
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
	char tag[32];
	struct kvd k;
	int done = 0;

	snprintf(tag, sizeof(tag), "%srs", R->name);
	if (kvd_up(&k, tag, 4, "64MiB", NULL) < 0)
		goto out;
	/* the two longest cases */
	for (int i = n_cases - 2; i < n_cases; i++) {
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *s = NULL;
		const struct dsvt_case *c = &cases[i];
		/* not on a page boundary; V4.1: odd, a ratio-2 group open */
		int half = R->restart_odd ? c->n / 2 | 1 : c->n / 2 + 1;

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
	char tag[32];
	struct cw_dsv_state *s[N_SPILL] = { 0 };
	const struct dsvt_case *c = &cases[n_cases - 1];
	struct st_diag d = { { 0 } };
	struct kv_stats st = { 0 };
	struct kvd k;
	int ok = 1;
	const int chunk = 8;
	uint64_t need = 0;

	/* B = 16; V4: pages of 16 KiB (16 rows of the CSA compressor
	 * state); the longest case has 13 pages per stream (the pool must
	 * give a sequence that many table positions: 13 x 18 streams =
	 * 234), the six hold more than twice the 256 pages of a 4 MiB
	 * budget */
	snprintf(tag, sizeof(tag), "%ssp", R->name);
	if (kvd_up(&k, tag, 16, R->spill_budget, "64MiB") < 0)
		goto out;
	for (int i = 0; i < N_SPILL; i++) {
		CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s[i], &d) ==
			      0, "new_kv: %s", d.msg);
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
/* Evaluates c's first publish_n ids on a new state (prefix mode unless
 * explicit: then published after every chunk) in chunks of `chunk`, then
 * its ids up to feed_n one per eval (decode: each sampled token fed once),
 * then c's first n ids on a second state from the cache.  Returns the rows
 * the second state mapped, or -1 (an eval failed or a logit differed). */
static int twice(struct kvd *k, const struct dsvt_case *c, int n, int publish_n,
		 int feed_n, int chunk, int explicit)
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
	if (r == 0)
		r = run_span(a, c, publish_n, feed_n, 1, "decode");
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
	const uint32_t B = R->prefix_B;
	char tag[32];

	snprintf(tag, sizeof(tag), "%spc", R->name);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	for (int i = 0; i < n_cases; i++) {
		const struct dsvt_case *c = &cases[i];
		int want = (int)((uint32_t)c->n_prompt / B * B);
		int got;

		if (want > c->n - 1)
			want = (c->n - 1) / (int)B * (int)B;
		got = twice(&k, c, c->n, c->n_prompt, c->n_prompt,
			    R->prefix_chunk, 0);
		CHECK(got == want, "prefix %s: %d rows mapped, expected %d",
		      c->name, got, want);
		if (got >= 0) {
			reused += got;
			computed += c->n - got;
		}
	}
	CHECK(kv_client_stats(k.kv, &st) == 0, "stats");
	printf("prefix cache (B = %u, window rows carried): %ld positions "
	       "from cached pages, %ld computed after them, all "
	       "bit-identical; kvd: %llu groups hit, %llu rows reused\n", B,
	       reused, computed, (unsigned long long)st.prefix_pages_hit,
	       (unsigned long long)st.prefix_rows_reused);
	CHECK(st.prefix_rows_reused == (uint64_t)reused,
	      "kvd counts %llu rows reused, the states %ld",
	      (unsigned long long)st.prefix_rows_reused, reused);
out:
	kvd_down(&k);
}

static void test_p10(uint32_t B)
{
	const struct dsvt_case *c = &cases[n_cases - 1];
	const int lens[5] = { (int)B - 1, (int)B, (int)B + 1, 2 * (int)B,
			      2 * (int)B + 1 };
	const int want[5] = { 0, 0, (int)B, (int)B, 2 * (int)B };
	char tag[32];
	struct kvd k;

	snprintf(tag, sizeof(tag), "%sp10b%u", R->name, B);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	printf("P10 B=%u: prompts", B);
	for (int i = 0; i < 5; i++) {
		int got;

		if (lens[i] < 1 || lens[i] > c->n)
			continue;
		got = twice(&k, c, lens[i], lens[i], lens[i], R->p10_chunk,
			    B == R->p10_explicit[0] || B == R->p10_explicit[1]);
		CHECK(got == want[i], "P10 B=%u, %d tokens: %d rows from the "
		      "cache, expected %d", B, lens[i], got, want[i]);
		printf(" %d (%d cached)", lens[i], got);
	}
	printf(": second answers bit-identical\n");
out:
	kvd_down(&k);
}

/* Prefix mode publishes the generated tokens' rows too: a state made for
 * the longest case's prompt, then fed its greedy continuation one token
 * per eval but the last (as a server does), publishes the full pages of
 * every token it was fed as decode crosses each page boundary (before the
 * next reservation frees their window rows); a second state for prompt +
 * continuation maps all of them (the chain unbroken: no window page was
 * freed unpublished) and gives the reference's logits after them. */
static void test_generated(uint32_t B)
{
	const struct dsvt_case *c = &cases[n_cases - 1];
	const int fed = c->n - 1;
	const int want = fed / (int)B * (int)B;
	struct kv_stats st;
	struct kvd k;
	char tag[32];
	int got;

	snprintf(tag, sizeof(tag), "%sgen%u", R->name, B);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	if (want <= c->n_prompt / (int)B * (int)B) {
		CHECK(0, "case %s: its continuation crosses no page boundary "
		      "at B = %u", c->name, B);
		goto out;
	}
	got = twice(&k, c, c->n, c->n_prompt, fed, R->prefix_chunk, 0);
	CHECK(got == want, "generated B=%u %s: %d rows mapped, expected %d "
	      "(%d prompt and %d generated tokens fed)", B, c->name, got,
	      want, c->n_prompt, fed - c->n_prompt);
	/* the first state's fed/B groups, then the second state's own past
	 * them: all n/B of c */
	CHECK(kv_client_stats(k.kv, &st) == 0 &&
	      st.prefix_published == (uint64_t)(c->n / (int)B),
	      "generated B=%u: %llu groups published, expected %d", B,
	      (unsigned long long)st.prefix_published, c->n / (int)B);
	printf("generated tokens published, B=%u: %s %d prompt + %d fed "
	       "tokens, the continuation mapped %d rows (prompt alone: %d), "
	       "bit-identical after them\n", B, c->name, c->n_prompt,
	       fed - c->n_prompt, got, c->n_prompt / (int)B * (int)B);
out:
	kvd_down(&k);
}

/* A private state (KV_PUBLISH_F_PRIVATE, the request field kv_private)
 * keeps its pages out of kvd's remote KV tier: a kvd with a real
 * redis-server as the tier; a state in prefix mode for one case, private,
 * fed its prompt and continuation, publishes its groups in the local cache
 * and none to the tier; then a plain one for another case publishes its
 * groups to both (the tier works). */
static void test_private(void)
{
	const struct dsvt_case *c = &cases[n_cases - 2], *o = &cases[n_cases - 1];
	const uint32_t B = R->prefix_B;
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *a = NULL, *b = NULL;
	struct kv_stats s0, s1, s2;
	struct kvt_redis redis;
	struct kvd k;
	char tag[32];

	if (kvt_redis_start(&redis) < 0) {
		printf("SKIP private: no redis-server (the remote tier's "
		       "check needs one)\n");
		return;
	}
	kvd_remote = redis.url;
	snprintf(tag, sizeof(tag), "%spv", R->name);
	if (kvd_up(&k, tag, B, "64MiB", NULL) < 0)
		goto out;
	CHECK(kv_client_stats(k.kv, &s0) == 0 && s0.remote_on == 1,
	      "kvd runs without the remote tier");
	CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, c->n_prompt, 0, &a, &d) ==
		      0 && cw_dsv_state_set_publish_flags(
				   a, KV_PUBLISH_F_PRIVATE) == 0,
	      "new (private): %s", d.msg);
	CHECK(cw_dsv_state_set_publish_flags(a, 0x80) == -EINVAL,
	      "an unknown publish flag accepted");
	if (a && run_span(a, c, 0, c->n_prompt, R->prefix_chunk,
			  "private") == 0)
		run_span(a, c, c->n_prompt, c->n - 1, 1, "private decode");
	CHECK(kv_client_stats(k.kv, &s1) == 0 &&
	      s1.prefix_published - s0.prefix_published ==
		      (uint64_t)((c->n - 1) / (int)B) &&
	      s1.remote_published == s0.remote_published,
	      "private: %llu groups published, %llu to the remote tier "
	      "(expected %d and 0)",
	      (unsigned long long)(s1.prefix_published - s0.prefix_published),
	      (unsigned long long)(s1.remote_published - s0.remote_published),
	      (c->n - 1) / (int)B);
	CHECK(cw_dsv_state_new_kv(M, k.kv, o->ids, o->n_prompt, 0, &b, &d) ==
		      0, "new: %s", d.msg);
	if (b)
		run_span(b, o, 0, o->n_prompt, R->prefix_chunk, "public");
	CHECK(kv_client_stats(k.kv, &s2) == 0 &&
	      s2.remote_published - s1.remote_published ==
		      (uint64_t)(o->n_prompt / (int)B) &&
	      s2.remote_published > s1.remote_published,
	      "not private: %llu groups to the remote tier, expected %d",
	      (unsigned long long)(s2.remote_published - s1.remote_published),
	      o->n_prompt / (int)B);
	printf("private state: %llu groups published locally, none to the "
	       "remote tier; a plain one: %llu to it\n",
	       (unsigned long long)(s1.prefix_published - s0.prefix_published),
	       (unsigned long long)(s2.remote_published - s1.remote_published));
	cw_dsv_state_free(a);
	cw_dsv_state_free(b);
out:
	kvd_down(&k);
	kvd_remote = NULL;
	kvt_redis_stop(&redis);
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
	char tag[32];

	snprintf(tag, sizeof(tag), "%spg", R->name);
	if (kvd_up(&k, tag, 4, "64MiB", NULL) < 0)
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
	char tag[32];

	snprintf(tag, sizeof(tag), "%sp11", R->name);
	if (kvd_up(&k, tag, 4, "64MiB", NULL) < 0)
		goto out;
	CHECK(cw_dsv_state_new_kv(M, k.kv, NULL, 0, 0, &s, &d) == 0,
	      "new: %s", d.msg);
	if (!s)
		goto out;
	CHECK(run_span(s, c, 0, 8, 8, "P11") == 0, "8 tokens");
	CHECK(kv_client_stats(k.kv, &st) == 0 &&
	      st.pages_used == 2ull * st.n_streams &&
	      expect_pages(4, 8, 8) == 2ull * st.n_streams,
	      "8 tokens, B = 4: %llu pages, expected 2 per stream x %u",
	      (unsigned long long)st.pages_used, st.n_streams);
	/* V4: a ratio-4 row per page, both complete; the ratio-16
	 * stream's rows are not there yet: row 0 completes at token 15
	 * (page 3) */
	CHECK(kv_client_seq_rows(k.kv, cw_dsv_state_seq(s)) == 8, "rows");
	CHECK(run_span(s, c, 8, 9, 1, "P11") == 0, "9th token");
	/* a third page in every stream, but V4.1's partial-group streams
	 * (the last 2 rows kept) freed their first page by now */
	CHECK(kv_client_stats(k.kv, &st) == 0 &&
	      st.pages_used == 3ull * st.n_streams - R->p11_freed &&
	      expect_pages(4, 9, 1) == st.pages_used,
	      "9 tokens, B = 4: %llu pages, expected 3 per stream x %u "
	      "less the %d partial-group streams' first page",
	      (unsigned long long)st.pages_used, st.n_streams, R->p11_freed);
	if (R->rev == ST_DSV_REV_V41) {
		/* the CED shortcut leaves window rows uncomputed: no
		 * publishing */
		cw_dsv41_set_ced_shortcut(s, CW_DSV41_CED_EXACT);
		CHECK(cw_dsv_state_publish(s, c->ids, 8, &d) == -EINVAL,
		      "a state with the CED shortcut on published");
	}
	cw_dsv_state_free(s);
	CHECK(kv_client_stats(k.kv, &st) == 0 && st.pages_used == 0,
	      "after free: %llu pages used", (unsigned long long)st.pages_used);
	printf("P11 B=4: 8 tokens -> 2 pages per stream, 9 -> 3 (partial "
	       "groups: %d), free -> 0\n", R->p11_freed);
out:
	kvd_down(&k);
}

/* Process-local model's way: prefill n_pre tokens, drop the window,
 * replay the last n_rep, then the rest; hashes into h[n_pre..n). */
static int local_replay(const struct dsvt_case *c, int n_pre, int n_rep,
			uint64_t *h)
{
	struct st_diag d = { { 0 } };
	struct cw_dsv_state *s = NULL;
	int r = cw_dsv_state_new(M, c->n, &s);

	if (r == 0)
		r = cw_dsv_eval(M, s, c->ids, n_pre, 0, NULL, &d);
	if (r == 0) {
		cw_dsv41_state_drop_window(s);
		r = cw_dsv41_replay(M, s, c->ids + n_pre - n_rep, n_rep, &d);
	}
	for (int p = n_pre; r == 0 && p < c->n; p += CHUNK_MAX) {
		int k = c->n - p < CHUNK_MAX ? c->n - p : CHUNK_MAX;

		r = cw_dsv_eval(M, s, c->ids + p, k, 1, lbuf, &d);
		for (int t = 0; r == 0 && t < k; t++)
			h[p + t] = st_xxh3(lbuf + (size_t)t * V, (size_t)V * 4);
	}
	CHECK(r == 0, "local replay %s: %s", c->name, d.msg);
	cw_dsv_state_free(s);
	return r;
}

static void test_replay(void)
{
	const int W = cw_dsv_config(M)->sliding_window;
	const uint32_t B = 4;
	struct kvd k;
	int n_ok = 0, n_differ = 0, n_whole = 0, n_run = 0;

	if (kvd_up(&k, "v41rp", B, "64MiB", NULL) < 0)
		goto out;
	for (int i = 0; i < n_cases; i++) {
		const struct dsvt_case *c = &cases[i];
		struct st_diag d = { { 0 } };
		struct cw_dsv_state *a = NULL, *b = NULL, *e = NULL;
		uint64_t *h = calloc((size_t)c->n, sizeof(uint64_t));
		int pre, differ = 0;

		/* a prompt whose cached part is longer than the window */
		if (!h || c->n_prompt / (int)B * (int)B <= W) {
			free(h);
			continue;
		}
		n_run++;
		/* publish the prompt's pages */
		CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, c->n_prompt, 0,
					    &a, &d) == 0, "new: %s", d.msg);
		if (a)
			run_span(a, c, cw_dsv_state_len(a), c->n_prompt, 16,
				 "replay-first");
		/* the model's way: window rebuilt from the last W tokens */
		CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, c->n, W, &b,
					    &d) == 0, "new (replay): %s", d.msg);
		pre = b ? cw_dsv_state_len(b) : 0;
		CHECK(pre == c->n_prompt / (int)B * (int)B,
		      "replay %s: %d rows from the cache", c->name, pre);
		if (b && local_replay(c, pre, W, h) == 0 &&
		    run_span_h(b, c, h, pre, c->n, 5, "replay") == 0)
			n_ok++;
		for (int p = pre; p < c->n; p++)
			differ += h[p] != c->h[p];
		n_differ += differ > 0;
		CHECK(cw_dsv_state_publish(b, c->ids, pre, &d) == -EINVAL,
		      "a replayed state published");
		/* replaying the whole prefix is exact */
		CHECK(cw_dsv_state_new_kv(M, k.kv, c->ids, c->n, c->n, &e,
					    &d) == 0, "new (whole): %s", d.msg);
		if (e && run_span(e, c, cw_dsv_state_len(e), c->n, 7,
				  "replay-whole") == 0)
			n_whole++;
		printf("SWA replay %s: %d cached, last %d replayed: %d of %d "
		       "positions differ from the full computation "
		       "(approximate), all bit-identical to the process-local "
		       "replay\n", c->name, pre, W, differ, c->n - pre);
		cw_dsv_state_free(a);
		cw_dsv_state_free(b);
		cw_dsv_state_free(e);
		free(h);
	}
	CHECK(n_run >= 2 && n_ok == n_run && n_whole == n_run,
	      "replay: %d cases, %d match the local replay, %d exact whole",
	      n_run, n_ok, n_whole);
	/* the window matters after a long prefix: the model's replay is
	 * not the exact computation on these cases */
	CHECK(n_differ > 0, "the replay of the last window never changed a "
	      "logit (the test would not see a wrong window)");
	printf("SWA replay on a prefix hit: %d cases (kvd = process-local), "
	       "whole-prefix replay exact in %d\n", n_ok, n_whole);
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
		struct cw_dsv_model *keep = M;

		M = sm;
		for (int i = 2; i <= 3 && i < n_cases; i++) {
			const struct dsvt_case *c = &cases[i];
			int got = twice(&k, c, c->n, c->n_prompt,
					c->n_prompt, 9, 0);

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

int main(int argc, char **argv)
{
	char dir[4096];
	struct st_diag diag = { { 0 } };
	const struct st_dsv_config *c;
	json_t *refj;
	const char *only = argc > 2 ? argv[2] : "all";
	int all;

	if (argc < 2 || (strcmp(argv[1], "v4") && strcmp(argv[1], "v41"))) {
		fprintf(stderr, "usage: %s v4|v41 [plain|daemon|prefix]\n",
			argv[0]);
		return 1;
	}
	R = strcmp(argv[1], "v4") ? &k_v41 : &k_v4;
	all = !strcmp(only, "all");
	st_test_fixture_model(R->fixture, dir, sizeof(dir));
	if (cw_dsv_load(dir, R->rev, CW_COMPUTE_REFERENCE, &M, &diag)) {
		fprintf(stderr, "cw_dsv_load: %s\n", diag.msg);
		return 1;
	}
	c = cw_dsv_config(M);
	V = c->vocab_size;
	refj = dsvt_load_json(dir, "reference.json");
	/* shortest first: restart, spill, P10, P11 use the last ones */
	n_cases = dsvt_cases_load(dsvt_cases(refj, "reference.json"),
				  MAX_CASES, cases);
	if (n_cases < 0)
		return 1;
	lbuf = malloc((size_t)CHUNK_MAX * V * sizeof(float));
	if (!lbuf || n_cases < R->min_cases) {
		fprintf(stderr, "setup: %d cases\n", n_cases);
		return 1;
	}
	if (R->rev == ST_DSV_REV_V4)
		test_declaration_v4(c);
	else
		test_declaration_v41(c);
	for (int i = 0; i < n_cases; i++)
		if (reference_case(&cases[i], cases[i].h) < 0)
			return 1;
	if (all || !strcmp(only, "plain")) {
		test_p11();
		if (R->rev == ST_DSV_REV_V4)
			test_publish_guard();
		for (int i = 0; i < 3; i++)
			test_plain(R->plain_B[i]);
		if (R->rev == ST_DSV_REV_V41) {
			test_noqat();
			test_ced();
		}
	}
	if (all || !strcmp(only, "daemon")) {
		test_restart();
		test_spill();
	}
	if (all || !strcmp(only, "prefix")) {
		test_prefix();
		for (int i = 0; i < 4 && R->p10_B[i]; i++)
			test_p10(R->p10_B[i]);
		test_generated(R->p10_B[0]);
		test_generated(R->prefix_B);
		test_private();
		if (R->rev == ST_DSV_REV_V41)
			test_replay();
	}
	if (all && R->rev == ST_DSV_REV_V4)
		test_store(dir);
	dsvt_cases_free(cases, n_cases);
	free(lbuf);
	json_decref(refj);
	cw_dsv_free(M);
	return dsvt_finish(n_fail);
}
