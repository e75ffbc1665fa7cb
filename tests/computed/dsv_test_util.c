/* dsv_test_util.c — see dsv_test_util.h. */
#include "dsv_test_util.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cw_dsv.h"
#include "es_client.h"
#include "es_convert.h"
#include "st_util.h"
#include "test_daemons.h"
#include "test_util.h"

void dsvt_fail(int *n_fail, const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	if ((*n_fail)++ >= DSVT_MAX_PRINTED)
		return;
	fprintf(stderr, "FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int dsvt_finish(int n_fail)
{
	if (n_fail)
		fprintf(stderr, "%d failure(s)\n", n_fail);
	return n_fail ? 1 : 0;
}

json_t *dsvt_load_json(const char *dir, const char *file)
{
	char path[4300];
	json_error_t e;
	json_t *j;

	snprintf(path, sizeof(path), "%s/%s", dir, file);
	j = json_load_file(path, 0, &e);
	if (!j) {
		fprintf(stderr, "%s: %s\n", path, e.text);
		exit(1);
	}
	return j;
}

const json_t *dsvt_cases(const json_t *ref, const char *what)
{
	const json_t *c = json_object_get(ref, "cases");

	if (!json_is_array(c)) {
		fprintf(stderr, "%s: no cases\n", what);
		exit(1);
	}
	return c;
}

int32_t *dsvt_case_ids(const json_t *cs, int with_greedy, int *n,
		       int *n_prompt)
{
	const json_t *a = json_object_get(cs, "ids");
	const json_t *g = json_object_get(cs, "greedy_continuation");
	int np = (int)json_array_size(a);
	int ng = with_greedy ? (int)json_array_size(g) : 0;
	int32_t *ids = malloc((size_t)(np + ng) * sizeof(int32_t) + 4);

	if (!ids)
		return NULL;
	for (int i = 0; i < np; i++)
		ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
	for (int i = 0; i < ng; i++)
		ids[np + i] = (int32_t)json_integer_value(
			json_array_get(g, (size_t)i));
	*n = np + ng;
	if (n_prompt)
		*n_prompt = np;
	return ids;
}

int dsvt_cases_load(const json_t *cases, int max, struct dsvt_case *ret)
{
	const json_t *jc;
	size_t ci;
	int n = 0;

	json_array_foreach(cases, ci, jc) {
		struct dsvt_case *t = &ret[n];

		if (n == max)
			break;
		memset(t, 0, sizeof(*t));
		t->name = json_string_value(json_object_get(jc, "name"));
		t->ids = dsvt_case_ids(jc, 1, &t->n, &t->n_prompt);
		t->h = calloc((size_t)t->n + 1, sizeof(uint64_t));
		n++;
		if (!t->ids || !t->h) {
			dsvt_cases_free(ret, n);
			return -1;
		}
	}
	/* shortest first */
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (ret[j].n < ret[i].n) {
				struct dsvt_case x = ret[i];

				ret[i] = ret[j];
				ret[j] = x;
			}
	return n;
}

void dsvt_cases_free(struct dsvt_case *c, int n)
{
	for (int i = 0; i < n; i++) {
		free(c[i].ids);
		free(c[i].h);
		c[i].ids = NULL;
		c[i].h = NULL;
	}
}

double dsvt_lse(const float *x, int n)
{
	double mx = -INFINITY, s = 0.0;

	for (int i = 0; i < n; i++)
		if (x[i] > mx)
			mx = x[i];
	for (int i = 0; i < n; i++)
		s += exp((double)x[i] - mx);
	return mx + log(s);
}

int dsvt_argmax(const float *x, int n)
{
	int b = 0;

	for (int i = 1; i < n; i++)
		if (x[i] > x[b])
			b = i;
	return b;
}

void dsvt_dist_err(const json_t *rec, const float *lg, int V, double *dl,
		   double *ds)
{
	const json_t *top = json_object_get(rec, "top10"), *e;
	size_t i;

	*dl = 0.0;
	json_array_foreach(top, i, e) {
		int id = (int)json_integer_value(json_array_get(e, 0));
		double d = fabs(lg[id] - json_number_value(json_array_get(e, 1)));

		if (!(d <= *dl)) /* NaN sticks */
			*dl = d;
	}
	*ds = fabs(dsvt_lse(lg, V) -
		   json_number_value(json_object_get(rec, "lse")));
}

int dsvt_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double dsvt_median(const double *v, int n)
{
	double *c = malloc((size_t)n * sizeof(double)), m;

	if (!c)
		abort();
	memcpy(c, v, (size_t)n * sizeof(double));
	qsort(c, (size_t)n, sizeof(double), dsvt_cmp_double);
	m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
	free(c);
	return m;
}

double dsvt_share_within(const double *v, int n, double tol)
{
	int k = 0;

	for (int i = 0; i < n; i++)
		k += v[i] <= tol;
	return n ? (double)k / n : 0.0;
}

double dsvt_max_abs_diff(const float *a, const float *b, size_t n,
			 size_t *at)
{
	double m = 0.0;
	size_t w = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);

		if (!(d <= m)) { /* NaN sticks */
			m = d;
			w = i;
		}
	}
	if (at)
		*at = w;
	return m;
}

float dsvt_prand(unsigned *st)
{
	*st = *st * 1103515245u + 12345u;
	return (float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f;
}

char *dsvt_fixture_config(const char *fixture)
{
	char dir[4096], path[4200], *buf = NULL;
	size_t len;

	st_test_fixture_model(fixture, dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/config.json", dir);
	if (st_read_file(path, &buf, &len) < 0) {
		fprintf(stderr, "cannot read %s\n", path);
		exit(1);
	}
	return buf;
}

int dsvt_expertd_open(struct st_test_inst *inst, const char *const *args,
		      struct es_client **ret_es, char *msg, size_t cap)
{
	struct st_diag diag = { "" };

	*ret_es = NULL;
	if (st_test_daemon_start(inst, "expertd", args, 30) < 0) {
		snprintf(msg, cap, "expertd did not start");
		return -1;
	}
	if (es_client_open(inst->run_dir, inst->name, "test", 10000, ret_es,
			   &diag)) {
		snprintf(msg, cap, "es_client_open: %s", diag.msg);
		return -1;
	}
	return 0;
}

void dsvt_compare_pos(struct dsvt_cmp *c, const float *a, const float *b,
		      int V)
{
	double mean = 0.0, var = 0.0, md = 0.0;
	int ta = dsvt_argmax(a, V);

	for (int i = 0; i < V; i++)
		mean += a[i];
	mean /= V;
	for (int i = 0; i < V; i++) {
		double d = fabs((double)a[i] - b[i]);

		var += (a[i] - mean) * (a[i] - mean);
		if (!(d <= md))
			md = d;
	}
	var /= V;
	if (!(md / sqrt(var) <= c->worst_rel))
		c->worst_rel = md / sqrt(var);
	if (c->n_pos < DSVT_CMP_MAX) {
		c->rel[c->n_pos] = md / sqrt(var);
		c->dlp[c->n_pos] = fabs((a[ta] - dsvt_lse(a, V)) -
					(b[ta] - dsvt_lse(b, V)));
	}
	c->top1_same += ta == dsvt_argmax(b, V);
	c->identical += !memcmp(a, b, (size_t)V * sizeof(float));
	c->n_pos++;
}

int dsvt_fragile_before(const json_t *cs, int p, int reach, double fragile)
{
	const json_t *fr = json_object_get(cs, "fragile_positions"), *e;
	int best = -1;
	size_t i;

	json_array_foreach(fr, i, e) {
		int q = (int)json_integer_value(json_array_get(e, 0));

		if (q <= p && p - q <= reach && q > best &&
		    json_number_value(json_array_get(e, 1)) < fragile)
			best = q;
	}
	return best;
}

int dsvt_top1_ok(const json_t *rec, const float *lg, int V, double gap,
		 int *ret_argmax)
{
	const json_t *top = json_object_get(rec, "top10");
	int am = dsvt_argmax(lg, V);
	int id0 = (int)json_integer_value(json_array_get(json_array_get(top, 0), 0));
	int id1 = (int)json_integer_value(json_array_get(json_array_get(top, 1), 0));
	double l0 = json_number_value(json_array_get(json_array_get(top, 0), 1));
	double l1 = json_number_value(json_array_get(json_array_get(top, 1), 1));

	if (ret_argmax)
		*ret_argmax = am;
	if (json_array_size(top) < 2)
		return 0;
	return am == id0 || (l0 - l1 < gap && am == id1);
}

int dsvt_copy_without(const char *dir, const char *file, const char *key,
		      char *ret_dir, size_t cap)
{
	char src[4400], dst[4400];
	struct dirent *e;
	json_t *j;
	DIR *d;

	st_test_tmpdir(ret_dir, cap);
	d = opendir(dir);
	if (!d) {
		perror(dir);
		return -1;
	}
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || !strcmp(e->d_name, file))
			continue;
		snprintf(src, sizeof(src), "%s/%s", dir, e->d_name);
		snprintf(dst, sizeof(dst), "%s/%s", ret_dir, e->d_name);
		if (symlink(src, dst) < 0) {
			perror(dst);
			closedir(d);
			return -1;
		}
	}
	closedir(d);
	j = dsvt_load_json(dir, file);
	json_object_del(j, key);
	snprintf(dst, sizeof(dst), "%s/%s", ret_dir, file);
	if (json_dump_file(j, dst, JSON_COMPACT) < 0) {
		fprintf(stderr, "%s: cannot write\n", dst);
		json_decref(j);
		return -1;
	}
	json_decref(j);
	return 0;
}

int dsvt_convert_tmp(const char *dir, char *tmp, size_t tcap, char *store,
		     size_t scap)
{
	struct st_diag diag = { { 0 } };
	struct es_convert_opts o;

	st_test_tmpdir(tmp, tcap);
	snprintf(store, scap, "%s/store", tmp);
	es_convert_opts_init(&o);
	if (es_convert(dir, store, &o, &diag)) {
		fprintf(stderr, "convert %s: %s\n", dir, diag.msg);
		return -1;
	}
	return 0;
}

void dsvt_layer_hint_pass(int *n_fail, struct cw_dsv_model *fm,
			  struct es_client *es, const int32_t *ids, int n,
			  int hinted)
{
	const struct st_dsv_config *c = cw_dsv_config(fm);
	const int V = c->vocab_size;
	float *out[2] = { malloc((size_t)n * V * sizeof(float)),
			  malloc((size_t)n * V * sizeof(float)) };
	uint64_t hints[2] = { 0, 0 };
	struct st_diag d = { { 0 } };
	int same;

	for (int pass = 0; pass < 2 && out[0] && out[1]; pass++) {
		struct cw_dsv_state *s = NULL;
		struct es_tier_stats t0, t1;
		int r;

		cw_dsv_set_layer_hints(fm, pass);
		r = cw_dsv_state_new(fm, n, &s);
		es_client_tier_stats(es, &t0);
		for (int i = 0; r == 0 && i < n; i++)
			r = cw_dsv_eval(fm, s, ids + i, 1, 1,
					out[pass] + (size_t)i * V, &d);
		es_client_tier_stats(es, &t1);
		if (r != 0)
			dsvt_fail(n_fail, __FILE__, __LINE__,
				  "layer-hint pass %d: %s", pass, d.msg);
		hints[pass] = t1.step_hints - t0.step_hints;
		cw_dsv_state_free(s);
	}
	cw_dsv_set_layer_hints(fm, 1);
	if (!out[0] || !out[1]) {
		dsvt_fail(n_fail, __FILE__, __LINE__, "out of memory");
		goto out;
	}
	same = !memcmp(out[0], out[1], (size_t)n * V * sizeof(float));
	printf("layer-start hints off vs on: %d tokens one per eval, logits "
	       "bit-identical: %s; step-named hint entries %llu vs %llu\n",
	       n, same ? "yes" : "no", (unsigned long long)hints[0],
	       (unsigned long long)hints[1]);
	if (!same)
		dsvt_fail(n_fail, __FILE__, __LINE__,
			  "logits with layer-start hints off and on differ");
	if (hints[1] - hints[0] !=
	    (uint64_t)n * (uint64_t)hinted * (uint64_t)c->top_k)
		dsvt_fail(n_fail, __FILE__, __LINE__,
			  "layer-start hint entries: %llu more with them on, "
			  "expected %d x %d x %d",
			  (unsigned long long)(hints[1] - hints[0]), n, hinted,
			  c->top_k);
out:
	free(out[0]);
	free(out[1]);
}

int dsvt_free_greedy(const struct cw_dsv_model *m, const int32_t *ids, int n,
		     const json_t *greedy, const json_t *steps,
		     double gap_rule, float *row, int *ret_same,
		     int *ret_diff, int32_t *ret_tok, struct st_diag *diag)
{
	const int V = cw_dsv_config(m)->vocab_size;
	const int ng = (int)json_array_size(steps ? steps : greedy);
	struct cw_dsv_state *s = NULL;
	int r, i;

	*ret_same = 0;
	*ret_diff = -1;
	r = cw_dsv_state_new(m, n + ng + 1, &s);
	if (r == 0)
		r = cw_dsv_eval(m, s, ids, n, 0, row, diag);
	for (i = 0; r == 0 && i < ng; i++) {
		int32_t tok = dsvt_argmax(row, V);
		int32_t want = (int32_t)json_integer_value(
			json_array_get(greedy, i));

		if (tok == want) {
			++*ret_same;
		} else if (*ret_diff < 0) {
			*ret_diff = i;
			*ret_tok = tok;
		}
		if (steps && (tok != want ||
			      json_number_value(json_object_get(
				      json_array_get(steps, i),
				      "top1_minus_top2")) < gap_rule)) {
			i++;
			break;
		}
		if (i + 1 < ng)
			r = cw_dsv_eval(m, s, &tok, 1, 0, row, diag);
	}
	cw_dsv_state_free(s);
	return r < 0 ? r : i;
}

int dsvt_eval_chunked(const struct cw_dsv_model *m, const int32_t *ids,
		      int n, const int *cuts, int n_cuts, int all_positions,
		      float *out, struct st_diag *diag)
{
	const int V = cw_dsv_config(m)->vocab_size;
	struct cw_dsv_state *s;
	int r, done = 0, ci = 0;

	if ((r = cw_dsv_state_new(m, n, &s)) < 0)
		return st_diag_set(diag, r, "state of %d tokens", n);
	while (done < n && r == 0) {
		int k = cuts[ci < n_cuts ? ci : n_cuts - 1];

		ci++;
		if (k > n - done)
			k = n - done;
		r = cw_dsv_eval(m, s, ids + done, k, all_positions,
				out + (all_positions ? (size_t)done * V : 0),
				diag);
		done += k;
	}
	cw_dsv_state_free(s);
	return r;
}
