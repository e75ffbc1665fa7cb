/*
 * cw_trace.c — reading routing traces for forced routing, and recording
 * computed's routing (cw_trace.h).  JSON through jansson.
 */
#include "cw_trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

struct cw_trace {
	int n_layers, k;
	uint32_t n_pos;
	int32_t *experts;    /* [n_pos][n_layers][k], -1 = no entry */
	float *weights;      /* [n_pos][n_layers][k] */
};

static int put(struct cw_trace *t, uint32_t pos, int layer, const int *e,
	       const float *w)
{
	if (pos >= t->n_pos) {
		uint32_t n = t->n_pos ? t->n_pos : 256;
		size_t old, cells;
		int32_t *ne;
		float *nw;

		while (n <= pos)
			n *= 2;
		cells = (size_t)n * t->n_layers * t->k;
		old = (size_t)t->n_pos * t->n_layers * t->k;
		ne = realloc(t->experts, cells * sizeof(int32_t));
		if (!ne)
			return -ENOMEM;
		t->experts = ne;
		nw = realloc(t->weights, cells * sizeof(float));
		if (!nw)
			return -ENOMEM;
		t->weights = nw;
		for (size_t i = old; i < cells; i++)
			ne[i] = -1;
		t->n_pos = n;
	}
	for (int i = 0; i < t->k; i++) {
		size_t at = ((size_t)pos * t->n_layers + layer) * t->k + i;

		t->experts[at] = e[i];
		t->weights[at] = w[i];
	}
	return 0;
}

int cw_trace_load(const char *path, int n_layers, int n_experts, int k,
		  struct cw_trace **ret, struct st_diag *diag)
{
	struct cw_trace *t;
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	long lineno = 0;
	uint32_t last = 0;
	int r = 0, any = 0;

	*ret = NULL;
	if (!f)
		return st_diag_set(diag, -errno, "cannot open routing trace "
				   "%s: %s", path, strerror(errno));
	t = calloc(1, sizeof(*t));
	if (!t) {
		fclose(f);
		return -ENOMEM;
	}
	t->n_layers = n_layers;
	t->k = k;
	while (!r && (len = getline(&line, &cap, f)) >= 0) {
		json_error_t je;
		json_t *j, *je_arr, *jw_arr, *jp, *jl;
		int e[64];
		float w[64];
		json_int_t pos, layer;

		lineno++;
		if (len <= 1)
			continue;
		j = json_loads(line, 0, &je);
		if (!j) {
			r = st_diag_set(diag, -ST_E_FORMAT, "%s:%ld: not JSON: "
					"%s", path, lineno, je.text);
			break;
		}
		jp = json_object_get(j, "pos");
		jl = json_object_get(j, "layer");
		je_arr = json_object_get(j, "experts");
		jw_arr = json_object_get(j, "weights");
		pos = json_is_integer(jp) ? json_integer_value(jp) : -1;
		layer = json_is_integer(jl) ? json_integer_value(jl) : -1;
		if (pos < 0 || pos >= (1 << 24) || layer < 0 ||
		    layer >= n_layers || !json_is_array(je_arr) ||
		    (int)json_array_size(je_arr) != k || k > 64 ||
		    (jw_arr && (!json_is_array(jw_arr) ||
				(int)json_array_size(jw_arr) != k))) {
			r = st_diag_set(diag, -ST_E_FORMAT, "%s:%ld: want "
					"{\"pos\": 0..2^24, \"layer\": 0..%d, "
					"\"experts\": [%d ids], optional "
					"\"weights\": [%d numbers]}", path,
					lineno, n_layers - 1, k, k);
			json_decref(j);
			break;
		}
		for (int i = 0; i < k && !r; i++) {
			json_t *x = json_array_get(je_arr, (size_t)i);
			json_int_t v = json_is_integer(x) ?
					       json_integer_value(x) : -1;

			if (v < 0 || v >= n_experts)
				r = st_diag_set(diag, -ST_E_FORMAT, "%s:%ld: "
						"expert id out of [0, %d)",
						path, lineno, n_experts);
			for (int q = 0; q < i && !r; q++)
				if (e[q] == (int)v)
					r = st_diag_set(diag, -ST_E_FORMAT,
							"%s:%ld: expert %d "
							"twice", path, lineno,
							(int)v);
			e[i] = (int)v;
			w[i] = jw_arr ? (float)json_number_value(
						json_array_get(jw_arr,
							       (size_t)i)) :
					1.0f / (float)k;
		}
		json_decref(j);
		if (!r)
			r = put(t, (uint32_t)pos, (int)layer, e, w);
		if (!r && (uint32_t)pos > last)
			last = (uint32_t)pos;
		any = 1;
	}
	free(line);
	fclose(f);
	if (!r && !any)
		r = st_diag_set(diag, -ST_E_FORMAT, "routing trace %s has no "
				"entries", path);
	if (r < 0) {
		cw_trace_free(t);
		return r;
	}
	t->n_pos = last + 1; /* arrays may be larger; only these count */
	*ret = t;
	return 0;
}

void cw_trace_free(struct cw_trace *t)
{
	if (!t)
		return;
	free(t->experts);
	free(t->weights);
	free(t);
}

uint32_t cw_trace_positions(const struct cw_trace *t)
{
	return t->n_pos;
}

int cw_trace_force(void *arg, int layer, uint32_t pos, int *experts,
		   float *weights, int k)
{
	struct cw_trace *t = arg;
	size_t at;

	if (k != t->k || layer < 0 || layer >= t->n_layers)
		return 0;
	at = ((size_t)(pos % t->n_pos) * t->n_layers + layer) * t->k;
	if (t->experts[at] < 0)
		return 0;
	for (int i = 0; i < k; i++) {
		experts[i] = t->experts[at + i];
		weights[i] = t->weights[at + i];
	}
	return 1;
}

int cw_trace_lookup(void *arg, int layer, uint32_t pos, int *ret_experts,
		    int k)
{
	float w[64];

	if (k > 64)
		return 0;
	return cw_trace_force(arg, layer, pos, ret_experts, w, k);
}

void cw_trace_record(void *arg, int layer, uint32_t pos, const int *experts,
		     const float *weights, int k)
{
	FILE *f = arg;

	fprintf(f, "{\"pos\": %u, \"layer\": %d, \"experts\": [", pos, layer);
	for (int i = 0; i < k; i++)
		fprintf(f, "%s%d", i ? ", " : "", experts[i]);
	fprintf(f, "], \"weights\": [");
	for (int i = 0; i < k; i++)
		fprintf(f, "%s%.6g", i ? ", " : "", (double)weights[i]);
	fprintf(f, "]}\n");
}
