/*
 * dsv_test_util.h — scaffolding shared by the DeepSeek-V4 and V4.1 tests
 * (tests/computed/test_dsv4*.c, test_dsv41_{reference,units,kv,store,fast,
 * perplexity}.c): the failure counter macro, the fixtures' reference.json
 * (cases: prompt ids and greedy continuations; {top10, lse} records), the
 * log-sum-exp / argmax / median arithmetic the comparisons use, and the
 * fixture's config.json text, and starting expertd with a client.
 *
 * Nothing here knows a model: the tests keep their own forward-pass calls
 * and every assertion; this only removes the copies of the plumbing.
 */
#ifndef DSV_TEST_UTIL_H
#define DSV_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/*
 * CHECK(cond, fmt, ...): when cond is false, counts a failure in the
 * including file's `static int n_fail` and prints "FAIL file:line: msg"
 * to stderr (the first DSVT_MAX_PRINTED failures only; all are counted).
 */
#define DSVT_MAX_PRINTED 30
#define CHECK(cond, ...)                                                   \
	do {                                                               \
		if (!(cond))                                               \
			dsvt_fail(&n_fail, __FILE__, __LINE__, __VA_ARGS__); \
	} while (0)

/* Counts one failure in *n_fail and prints it (see CHECK). */
void dsvt_fail(int *n_fail, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The exit status of a CHECK-based test: 0 when n_fail is 0, else 1 after
 * printing "N failure(s)". */
int dsvt_finish(int n_fail);

/* dir/file parsed as JSON; on failure prints the path and jansson's
 * message and exits 1 (a fixture file the test needs).  Caller decrefs. */
json_t *dsvt_load_json(const char *dir, const char *file);

/* The "cases" array of a reference.json (borrowed from ref); prints and
 * exits 1 when it is missing. */
const json_t *dsvt_cases(const json_t *ref, const char *what);

/*
 * A case's token ids (malloc'd, caller frees, 4 spare bytes so n may be
 * 0): its "ids" (the prompt, BOS first), followed by its
 * "greedy_continuation" when with_greedy.  *n: the count; *n_prompt (may
 * be NULL): the prompt's.  NULL on ENOMEM.
 */
int32_t *dsvt_case_ids(const json_t *cs, int with_greedy, int *n,
		       int *n_prompt);

/* One reference case as the KV tests keep it. */
struct dsvt_case {
	const char *name;  /* borrowed from the JSON */
	int n, n_prompt;   /* prompt + greedy continuation; prompt */
	int32_t *ids;      /* [n], owned */
	uint64_t *h;       /* [n], owned, zeroed: per-position logit hashes */
};

/*
 * The first `max` cases of a reference.json "cases" array into ret[],
 * sorted by length, shortest first (the tests use the last ones as the
 * longest).  Returns the count, or -1 (ENOMEM; nothing to free).
 */
int dsvt_cases_load(const json_t *cases, int max, struct dsvt_case *ret);
/* Frees what dsvt_cases_load allocated for n cases. */
void dsvt_cases_free(struct dsvt_case *c, int n);

/* log(sum(exp(x[i]))) over n floats, in double, max-shifted. */
double dsvt_lse(const float *x, int n);
/* Index of the largest of n floats (the first on ties). */
int dsvt_argmax(const float *x, int n);

/*
 * One {top10: [[id, logit]...], lse} record of a reference.json against a
 * logits row of V floats: *dl = max |logit[id] - ref| over the ten ids
 * (a NaN logit makes it NaN), *ds = |lse(row) - ref lse|.
 */
void dsvt_dist_err(const json_t *rec, const float *lg, int V, double *dl,
		   double *ds);

/* Median of n doubles (n >= 1; the mean of the middle two when n is
 * even); v is not changed. */
double dsvt_median(const double *v, int n);
/* Share of the n values <= tol (0 when n is 0). */
double dsvt_share_within(const double *v, int n, double tol);
/* qsort comparator of doubles, ascending. */
int dsvt_cmp_double(const void *a, const void *b);
/* max |a[i] - b[i]| over n floats; *at (may be NULL) its index. */
double dsvt_max_abs_diff(const float *a, const float *b, size_t n,
			 size_t *at);

/* A deterministic pseudo-random value in [-1, 1) (LCG state *st). */
float dsvt_prand(unsigned *st);

/* Positions a comparison keeps figures of (dsvt_compare_pos). */
#define DSVT_CMP_MAX 4096

/* Accumulated comparison figures of two models' logits (zero it to
 * start; large: allocate it). */
struct dsvt_cmp {
	long n_pos, top1_same, identical, evals;
	double worst_rel;          /* max over positions of max|d| / std(a) */
	double dlp[DSVT_CMP_MAX];  /* |delta log p(a's top-1)| per position */
	double rel[DSVT_CMP_MAX];  /* max|d| / std(a) per position */
};

/*
 * Adds one position's logits rows a (the reference) and b (V floats each)
 * to c: top-1 agreement, bit-identical rows, max |a - b| over the
 * standard deviation of a (a NaN difference makes it NaN, so it fails any
 * bound), and |delta log p| of a's top-1 token.  Past DSVT_CMP_MAX
 * positions only the counters and worst_rel grow.
 */
void dsvt_compare_pos(struct dsvt_cmp *c, const float *a, const float *b,
		      int V);

struct st_test_inst;
struct es_client;

/*
 * Starts expertd for inst (st_test_inst_init done by the caller) with
 * args (NULL-terminated, as st_test_daemon_start) and opens the client
 * "test" on it into *ret_es (caller closes; st_test_inst_stop stops the
 * daemon).  0, or -1 with what failed in msg[cap].
 */
int dsvt_expertd_open(struct st_test_inst *inst, const char *const *args,
		      struct es_client **ret_es, char *msg, size_t cap);

/* The config.json text of ../shared fixture `fixture` (malloc'd, caller
 * frees); exits 77 without ../shared (st_test_fixture_model), 1 when the
 * file cannot be read. */
char *dsvt_fixture_config(const char *fixture);

/*
 * Prompt-position argmax against a {top10, lse} record: 1 when the
 * argmax of lg[V] is the reference's top-1 id, or, where the reference's
 * top-1 leads its top-2 by less than gap (a near tie the tolerance may
 * flip), its top-2 id; else 0.  *ret_argmax (may be NULL): the argmax.
 */
int dsvt_top1_ok(const json_t *rec, const float *lg, int V, double gap,
		 int *ret_argmax);

/*
 * The rule by which float32 logits are held to scripts/dsv-oracle.py's
 * float64 ones (test_dsv_reference.c, mode oracle, says why and what was
 * measured): each top-10 logit and the lse within TIGHT until a first
 * divergence, which must lie at most REACH positions after a knife edge
 * of margin below FRAGILE; after it within AFTER_LOGIT / AFTER_LSE;
 * greedy ids compared while the oracle's top-2 gap is at least GAP.
 */
#define DSVT_ORACLE_TIGHT 1e-4
#define DSVT_ORACLE_FRAGILE 1e-6
#define DSVT_ORACLE_REACH 2
#define DSVT_ORACLE_AFTER_LOGIT 5.0
#define DSVT_ORACLE_AFTER_LSE 0.3
#define DSVT_ORACLE_GAP 0.02

/*
 * The latest position q in [p - reach, p] of an oracle case's
 * "fragile_positions" ([position, margin] pairs: scripts/dsv-oracle.py)
 * whose margin is below `fragile`, or -1: a rounding knife edge float32
 * may decide the other way, at or shortly before position p.
 */
int dsvt_fragile_before(const json_t *cs, int p, int reach, double fragile);

/*
 * A temp copy of the model directory dir in which `file` (JSON) lacks
 * the top-level key `key` (the reference files' optional blocks): every
 * other entry of dir is a symlink to the original.  The copy's path into
 * ret_dir[cap] (remove it with st_rm_rf).  0, or -1 with the reason
 * printed.
 */
int dsvt_copy_without(const char *dir, const char *file, const char *key,
		      char *ret_dir, size_t cap);

/*
 * Converts the checkpoint in dir with the default options into a store
 * at <tmp>/store, tmp a new temp directory (its path into tmp[tcap], the
 * store's into store[scap]; remove tmp with st_rm_rf).  0, or -1 with
 * the converter's message printed.
 */
int dsvt_convert_tmp(const char *dir, char *tmp, size_t tcap, char *store,
		     size_t scap);

struct cw_dsv_model;
struct st_diag;

/*
 * Layer-start hints (cw_dsv_set_layer_hints) off, then on, over ids[0..n)
 * evaluated one token per eval on a fresh state of fm (a store model
 * served by expertd es), every position's logits kept: both passes'
 * logits bit-identical (a hint never changes a result), and expertd's
 * step-named hint entries with them on exceed those with them off by
 * exactly n x hinted x top_k (hinted: the layers that send a layer-start
 * hint per token).  Failures counted in *n_fail (as CHECK); the figures
 * printed.  Leaves the hints on.
 */
/*
 * Free-running greedy generation on m (the DeepSeek reference tests; as
 * the other families' tests do): prefill ids[0..n), then the model's own
 * argmax fed back, each step's id compared with the reference's greedy
 * ids greedy[i] (a JSON array), for every step of greedy or, steps not
 * NULL (the reference's continuation_steps), up to the first step whose
 * top1_minus_top2 is below gap_rule (included) or the first id that
 * differs.  row: vocab_size floats of scratch.  Returns the steps
 * compared (*ret_same: how many equal; *ret_diff: the first that
 * differs, -1 if none; *ret_tok there: the model's id), or a negative
 * code with diag when an eval failed.
 */
int dsvt_free_greedy(const struct cw_dsv_model *m, const int32_t *ids, int n,
		     const json_t *greedy, const json_t *steps,
		     double gap_rule, float *row, int *ret_same,
		     int *ret_diff, int32_t *ret_tok, struct st_diag *diag);

/*
 * Evaluates ids[0..n) on a new state of m in chunks of cuts[0], cuts[1],
 * ... (the last repeated; a chunk cut to what is left): the chunking the
 * reference tests hold bit-identical to a one-shot prefill.  out: with
 * all_positions every position's logits [n][vocab_size], else the last
 * position's [vocab_size].  0 or the eval's negative code with diag.
 */
int dsvt_eval_chunked(const struct cw_dsv_model *m, const int32_t *ids,
		      int n, const int *cuts, int n_cuts, int all_positions,
		      float *out, struct st_diag *diag);

void dsvt_layer_hint_pass(int *n_fail, struct cw_dsv_model *fm,
			  struct es_client *es, const int32_t *ids, int n,
			  int hinted);

#endif
