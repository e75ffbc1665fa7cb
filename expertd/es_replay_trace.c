/*
 * es_replay_trace.c — readers of routing traces (es_replay_trace.h): the
 * strata JSONL format and the public traces of SOURCES.md (vLLM route logs,
 * the two speculative-moe layouts, moe-beyond CSV).  Every reader turns a
 * file into steps in execution order (token-major) with the model's layer
 * numbers; es_trace_read then renumbers layers densely.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <csv.h>
#include <jansson.h>

#include "es_replay_trace.h"
#include "st_util.h"

const char *es_trace_format_name(enum es_trace_format f)
{
	switch (f) {
	case ES_TRACE_STRATA: return "strata";
	case ES_TRACE_VLLM: return "A";
	case ES_TRACE_MARIO_PROC: return "B";
	case ES_TRACE_MARIO_RAW: return "C";
	case ES_TRACE_MOEBEYOND: return "D";
	}
	return "?";
}

int es_trace_push(struct es_trace *t, uint32_t token, int layer,
		  const uint16_t *ids, int n)
{
	if (n < 1 || n > ES_TRACE_MAX_K || layer < 0 ||
	    layer >= ES_TRACE_MAX_LAYERS)
		return -EINVAL;
	if (t->n_steps == t->cap_steps) {
		size_t cap = t->cap_steps ? 2 * t->cap_steps : 4096;
		void *p = realloc(t->steps, cap * sizeof(*t->steps));

		if (!p)
			return -ENOMEM;
		t->steps = p;
		t->cap_steps = cap;
	}
	if (t->n_ids + (size_t)n > t->cap_ids) {
		size_t cap = t->cap_ids ? 2 * t->cap_ids : 16384;
		void *p;

		while (cap < t->n_ids + (size_t)n)
			cap *= 2;
		p = realloc(t->ids, cap * sizeof(*t->ids));
		if (!p)
			return -ENOMEM;
		t->ids = p;
		t->cap_ids = cap;
	}
	t->steps[t->n_steps] = (struct es_trace_step){
		.token = token, .layer = (uint16_t)layer, .n = (uint8_t)n,
		.first = (uint32_t)t->n_ids };
	memcpy(t->ids + t->n_ids, ids, (size_t)n * sizeof(*ids));
	t->n_ids += (size_t)n;
	t->n_steps++;
	return 0;
}

void es_trace_seal(struct es_trace *t)
{
	int max_layer = -1, max_id = -1, k = 0;
	uint32_t max_tok = 0;

	for (size_t i = 0; i < t->n_steps; i++) {
		const struct es_trace_step *s = &t->steps[i];

		if (s->layer > max_layer)
			max_layer = s->layer;
		if (s->token + 1 > max_tok)
			max_tok = s->token + 1;
		if (s->n > k)
			k = s->n;
		for (int j = 0; j < s->n; j++)
			if (t->ids[s->first + j] > max_id)
				max_id = t->ids[s->first + j];
	}
	t->n_tokens = max_tok;
	if (!t->n_layers) {
		t->n_layers = max_layer + 1;
		for (int l = 0; l < t->n_layers; l++)
			t->layer_ids[l] = l;
	}
	if (t->n_experts < max_id + 1)
		t->n_experts = max_id + 1;
	t->top_k = k;
}

void es_trace_fini(struct es_trace *t)
{
	if (!t)
		return;
	free(t->steps);
	free(t->ids);
	memset(t, 0, sizeof(*t));
}

/* ---- one raw row while a file is read ---------------------------------- */

struct row {
	int64_t a, b;   /* ordering keys (meaning depends on the format) */
	int layer;      /* model layer number */
	int n;
	uint16_t ids[ES_TRACE_MAX_K];
};

struct rows {
	struct row *v;
	size_t n, cap;
};

static struct row *rows_add(struct rows *r)
{
	if (r->n == r->cap) {
		size_t cap = r->cap ? 2 * r->cap : 1024;
		void *p = realloc(r->v, cap * sizeof(*r->v));

		if (!p)
			return NULL;
		r->v = p;
		r->cap = cap;
	}
	memset(&r->v[r->n], 0, sizeof(r->v[0]));
	return &r->v[r->n++];
}

/* Checks and stores the expert ids of one row; n_experts 0 = unknown. */
static int row_set_ids(struct row *w, const long *ids, int n, int n_experts,
		       const char *path, int line, struct st_diag *diag)
{
	if (n < 1 || n > ES_TRACE_MAX_K)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s:%d: %d experts in a row; expected 1 to "
				   "%d", path, line, n, ES_TRACE_MAX_K);
	for (int j = 0; j < n; j++) {
		if (ids[j] < 0 || ids[j] >= ES_TRACE_MAX_EXPERTS ||
		    (n_experts > 0 && ids[j] >= n_experts))
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s:%d: expert id %ld out of range "
					   "[0, %d)", path, line, ids[j],
					   n_experts > 0 ? n_experts :
					   ES_TRACE_MAX_EXPERTS);
		for (int i = 0; i < j; i++)
			if (ids[i] == ids[j])
				return st_diag_set(diag, -ST_E_FORMAT,
						   "%s:%d: expert %ld listed "
						   "twice in one row", path,
						   line, ids[j]);
		w->ids[j] = (uint16_t)ids[j];
	}
	w->n = n;
	return 0;
}

/* ---- JSON lines --------------------------------------------------------- */

static int json_int(json_t *o, const char *key, long *ret)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		return -1;
	*ret = (long)json_integer_value(v);
	return 0;
}

static int json_ids(json_t *o, const char *key, long *ids, int *ret_n)
{
	json_t *a = json_object_get(o, key), *v;
	size_t i;

	if (!json_is_array(a) || json_array_size(a) > ES_TRACE_MAX_K)
		return -1;
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v))
			return -1;
		ids[i] = (long)json_integer_value(v);
	}
	*ret_n = (int)json_array_size(a);
	return 0;
}

static enum es_trace_format detect_json(json_t *o)
{
	json_t *type = json_object_get(o, "type");

	if (json_is_string(type))
		return ES_TRACE_VLLM;
	if (json_object_get(o, "token_pos"))
		return ES_TRACE_MARIO_RAW;
	if (json_object_get(o, "token_idx") && json_object_get(o, "problem_id"))
		return ES_TRACE_MARIO_PROC;
	if (json_object_get(o, "pos") && json_object_get(o, "experts"))
		return ES_TRACE_STRATA;
	return (enum es_trace_format)-1;
}

/* What a JSONL reader collected from one file. */
struct jfile {
	enum es_trace_format fmt;
	struct rows rows;
	int n_experts;     /* from a vLLM meta line, else 0 */
	int global_idx;    /* vLLM: token_idx never resets (A') */
};

/* Parses one JSON line of a known format into a row. */
static int json_row(struct jfile *f, json_t *o, const char *path, int line,
		    struct st_diag *diag)
{
	long ids[ES_TRACE_MAX_K], layer = -1, a = 0, b = 0;
	const char *idkey = "experts";
	struct row *w;
	int n = 0;

	switch (f->fmt) {
	case ES_TRACE_STRATA:
		if (json_int(o, "pos", &a) < 0)
			goto bad;
		if (json_object_get(o, "seq") && json_int(o, "seq", &b) < 0)
			goto bad;
		if (a < 0)
			goto bad;
		break;
	case ES_TRACE_VLLM: {
		const char *ty = json_string_value(json_object_get(o, "type"));

		if (ty && !strcmp(ty, "meta")) {
			long ne;

			if (json_int(o, "num_experts", &ne) == 0 && ne > 0)
				f->n_experts = (int)ne;
			return 0;
		}
		if (!ty || strcmp(ty, "route"))
			goto bad;
		if (json_int(o, "token_idx", &a) < 0)
			goto bad;
		idkey = "topk_ids";
		break;
	}
	case ES_TRACE_MARIO_PROC:
		if (json_int(o, "problem_id", &a) < 0 ||
		    json_int(o, "token_idx", &b) < 0)
			goto bad;
		break;
	case ES_TRACE_MARIO_RAW:
		if (json_int(o, "problem_id", &a) < 0 ||
		    json_int(o, "token_pos", &b) < 0)
			goto bad;
		break;
	default:
		goto bad;
	}
	if (json_int(o, "layer", &layer) < 0 || layer < 0 ||
	    layer >= ES_TRACE_MAX_LAYERS || json_ids(o, idkey, ids, &n) < 0)
		goto bad;
	w = rows_add(&f->rows);
	if (!w)
		return -ENOMEM;
	w->a = a;
	w->b = b;
	w->layer = (int)layer;
	return row_set_ids(w, ids, n, f->n_experts, path, line, diag);
bad:
	return st_diag_set(diag, -ST_E_FORMAT,
			   "%s:%d: not a %s trace record (see docs/REPLAY.md "
			   "for the formats strata replay reads)", path, line,
			   es_trace_format_name(f->fmt));
}

static int read_jsonl(const char *path, char *buf, size_t len,
		      struct jfile *f, struct st_diag *diag)
{
	char *p = buf, *end = buf + len;
	int line = 0, r;

	f->fmt = (enum es_trace_format)-1;
	while (p < end) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		json_error_t je;
		json_t *o;

		line++;
		if (n == 0 || (n == 1 && p[0] == '\r')) {
			p += n + 1;
			continue;
		}
		o = json_loadb(p, n, 0, &je);
		if (!o || !json_is_object(o)) {
			json_decref(o);
			return st_diag_set(diag, -ST_E_FORMAT,
					   "%s:%d: not a JSON object (%s)",
					   path, line, o ? "other value" :
					   je.text);
		}
		if ((int)f->fmt < 0) {
			f->fmt = detect_json(o);
			if ((int)f->fmt < 0) {
				json_decref(o);
				return st_diag_set(
					diag, -ST_E_FORMAT,
					"%s:%d: unknown trace format: a JSON "
					"line without the keys of any known "
					"format (strata: pos, layer, experts; "
					"vLLM: type, token_idx, topk_ids; see "
					"docs/REPLAY.md)", path, line);
			}
		}
		r = json_row(f, o, path, line, diag);
		json_decref(o);
		if (r < 0)
			return r;
		p += n + 1;
	}
	if ((int)f->fmt < 0 || !f->rows.n)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: no trace records", path);
	return 0;
}

/* ---- CSV (format D) ----------------------------------------------------- */

struct csvst {
	const char *path;
	int line, field, bad;
	long layer;
	char ids[512];
	struct rows *rows;
	long last_layer, row_in_layer;
	struct st_diag *diag;
	int err;
};

static void csv_field(void *s, size_t len, void *data)
{
	struct csvst *c = data;

	if (c->field == 0) {
		char tmp[32], *e;

		if (len == 0 || len >= sizeof(tmp)) {
			c->bad = 1;
		} else {
			memcpy(tmp, s, len);
			tmp[len] = 0;
			c->layer = strtol(tmp, &e, 10);
			if (*e)
				c->bad = 1;
		}
	} else if (c->field == 3) {
		if (len >= sizeof(c->ids))
			c->bad = 1;
		else {
			memcpy(c->ids, s, len);
			c->ids[len] = 0;
		}
	}
	c->field++;
}

static void csv_row(int ch, void *data)
{
	struct csvst *c = data;
	long ids[ES_TRACE_MAX_K];
	struct row *w;
	char *p, *e;
	int n = 0, r;

	c->line++;
	if (c->err)
		return;
	if (c->line == 1) { /* header */
		if (c->field != 4) {
			c->err = st_diag_set(c->diag, -ST_E_FORMAT,
					     "%s:1: unknown trace format: a "
					     "CSV header that is not moe-beyond's "
					     "'Layer ID,Batch Number,Token,"
					     "Activated Expert IDs'", c->path);
		}
		goto next;
	}
	if (c->field != 4 || c->bad || c->ids[0] != '[')
		goto bad;
	p = c->ids + 1;
	for (;;) {
		while (*p == ' ')
			p++;
		if (*p == ']')
			break;
		if (n == ES_TRACE_MAX_K)
			goto bad;
		ids[n++] = strtol(p, &e, 10);
		if (e == p)
			goto bad;
		p = e;
		while (*p == ' ')
			p++;
		if (*p == ',')
			p++;
		else if (*p != ']')
			goto bad;
	}
	if (c->layer < 0 || c->layer >= ES_TRACE_MAX_LAYERS)
		goto bad;
	if (c->layer != c->last_layer) {
		c->last_layer = c->layer;
		c->row_in_layer = 0;
	}
	w = rows_add(c->rows);
	if (!w) {
		c->err = -ENOMEM;
		goto next;
	}
	w->a = c->row_in_layer++;
	w->layer = (int)c->layer;
	r = row_set_ids(w, ids, n, 0, c->path, c->line, c->diag);
	if (r < 0)
		c->err = r;
	goto next;
bad:
	c->err = st_diag_set(c->diag, -ST_E_FORMAT,
			     "%s:%d: not a moe-beyond row (Layer ID, Batch "
			     "Number, Token, \"[ids]\")", c->path, c->line);
next:
	c->field = 0;
	c->bad = 0;
	c->ids[0] = 0;
}

static int read_csv(const char *path, char *buf, size_t len,
		    struct rows *rows, struct st_diag *diag)
{
	struct csvst c = { .path = path, .rows = rows, .last_layer = -1,
			   .diag = diag };
	struct csv_parser p;

	if (csv_init(&p, CSV_STRICT | CSV_STRICT_FINI) != 0)
		return -ENOMEM;
	if (csv_parse(&p, buf, len, csv_field, csv_row, &c) != len) {
		int e = csv_error(&p);

		csv_free(&p);
		if (c.err)
			return c.err;
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s:%d: CSV error: %s", path, c.line + 1,
				   csv_strerror(e));
	}
	csv_fini(&p, csv_field, csv_row, &c);
	csv_free(&p);
	if (c.err)
		return c.err;
	if (!rows->n)
		return st_diag_set(diag, -ST_E_FORMAT,
				   "%s: no trace records", path);
	return 0;
}

/* ---- ordering into steps ------------------------------------------------ */

static int cmp_ab_layer(const void *x, const void *y)
{
	const struct row *p = x, *q = y;

	if (p->a != q->a)
		return p->a < q->a ? -1 : 1;
	if (p->b != q->b)
		return p->b < q->b ? -1 : 1;
	return (p->layer > q->layer) - (p->layer < q->layer);
}

/* Pushes sorted rows; a new token starts whenever (a, b) changes. */
static int push_sorted(struct es_trace *t, struct rows *r, uint32_t tok0)
{
	uint32_t tok = tok0;

	for (size_t i = 0; i < r->n; i++) {
		struct row *w = &r->v[i];
		int e;

		if (i && (w->a != r->v[i - 1].a || w->b != r->v[i - 1].b))
			tok++;
		e = es_trace_push(t, tok, w->layer, w->ids, w->n);
		if (e < 0)
			return e;
	}
	return 0;
}

/* Format C: prefill block (layer by layer, token_pos 0..P-1) then decode
 * passes (token_pos 0, layers increasing; a new pass when the layer does not
 * increase).  Rewrites b so that sorting by (a, b, layer) gives token order:
 * prefill tokens keep b = pos, decode pass j gets b = P + j. */
static void mario_raw_order(struct rows *r)
{
	size_t i = 0;

	while (i < r->n) {
		size_t s = i, dec;
		int64_t maxpos = -1, pass;

		while (i < r->n && r->v[i].a == r->v[s].a)
			i++;
		/* decode starts at the first of two consecutive pos-0 rows */
		for (dec = s; dec + 1 < i; dec++)
			if (r->v[dec].b == 0 && r->v[dec + 1].b == 0)
				break;
		if (dec + 1 >= i)
			dec = i;
		for (size_t j = s; j < dec; j++)
			if (r->v[j].b > maxpos)
				maxpos = r->v[j].b;
		pass = maxpos + 1;
		for (size_t j = dec; j < i; j++) {
			if (j > dec && r->v[j].layer <= r->v[j - 1].layer)
				pass++;
			r->v[j].b = pass;
		}
	}
}

/* strata: cuts the rows into sequences and rewrites (a, b) = (sequence,
 * pos) so that sorting by (a, b, layer) gives token order.  A sequence ends
 * where "seq" changes or where a layer's pos does not increase (each layer
 * sees its positions in increasing order within one sequence, whether the
 * prefill was recorded token by token or layer by layer). */
static int strata_sequences(struct rows *r)
{
	int64_t *last = malloc(ES_TRACE_MAX_LAYERS * sizeof(*last));
	int64_t *stamp = calloc(ES_TRACE_MAX_LAYERS, sizeof(*stamp));
	int64_t seqno = 1, seq = r->n ? r->v[0].b : 0;

	if (!last || !stamp) {
		free(last);
		free(stamp);
		return -ENOMEM;
	}
	for (size_t i = 0; i < r->n; i++) {
		struct row *w = &r->v[i];

		if (w->b != seq || (stamp[w->layer] == seqno &&
				    w->a <= last[w->layer]))
			seqno++;
		seq = w->b;
		stamp[w->layer] = seqno;
		last[w->layer] = w->a;
		w->b = w->a;
		w->a = seqno;
	}
	free(last);
	free(stamp);
	return 0;
}

/* vLLM forwards of one file: [start, end) row ranges. */
struct fwd {
	size_t *start;
	size_t n;
};

/* Splits an A file into forwards and drops the leading profiling forwards
 * (every row the same ids).  A' (token_idx never resets): drops the leading
 * run of rows identical to the first.  Returns the index of the first real
 * row; fills *fw with the real forwards' starts. */
static int vllm_forwards(struct jfile *f, struct fwd *fw, size_t *ret_first)
{
	struct rows *r = &f->rows;
	size_t first = 0;
	int resets = 0;

	for (size_t i = 1; i < r->n; i++)
		if (r->v[i].a == 0)
			resets = 1;
	fw->start = calloc(r->n + 1, sizeof(*fw->start));
	if (!fw->start)
		return -ENOMEM;
	fw->n = 0;
	if (!resets) {
		while (first < r->n && r->v[first].n == r->v[0].n &&
		       !memcmp(r->v[first].ids, r->v[0].ids,
			       sizeof(r->v[0].ids)))
			first++;
		if (first == r->n)
			first = 0;
		fw->start[fw->n++] = first;
	} else {
		size_t i = 0;

		while (i < r->n) {
			size_t s = i;
			int same = 1;

			i++;
			while (i < r->n && r->v[i].a != 0)
				i++;
			for (size_t j = s + 1; j < i; j++)
				if (memcmp(r->v[j].ids, r->v[s].ids,
					   sizeof(r->v[s].ids)))
					same = 0;
			if (same && fw->n == 0 && i - s > 1) {
				first = i;
				continue;
			}
			fw->start[fw->n++] = s;
		}
	}
	fw->start[fw->n] = r->n;
	*ret_first = first;
	return 0;
}

static int single_layer(const struct rows *r, size_t from)
{
	for (size_t i = from + 1; i < r->n; i++)
		if (r->v[i].layer != r->v[from].layer)
			return 0;
	return 1;
}

/* Pushes a group of A files [g0, g1) either merged row by row (same
 * forwards, one distinct layer each) or one after the other. */
static int push_vllm(struct es_trace *t, struct jfile *jf, int g0, int g1,
		     int *ret_merged)
{
	struct fwd fw[64];
	size_t first[64];
	int merge = g1 - g0 > 1 && g1 - g0 <= 64, e = 0;
	uint32_t tok0 = t->n_steps ?
		t->steps[t->n_steps - 1].token + 1 : 0;

	memset(fw, 0, sizeof(fw));
	for (int g = g0; g < g1 && g - g0 < 64; g++) {
		e = vllm_forwards(&jf[g], &fw[g - g0], &first[g - g0]);
		if (e < 0)
			goto out;
	}
	for (int g = g0; g < g1 && merge; g++) {
		struct fwd *a = &fw[g - g0], *b = &fw[0];

		if (!single_layer(&jf[g].rows, first[g - g0]) ||
		    a->n != b->n)
			merge = 0;
		for (size_t i = 0; merge && i <= a->n; i++)
			if (a->start[i] - first[g - g0] !=
			    b->start[i] - first[0])
				merge = 0;
		for (int h = g0; merge && h < g; h++)
			if (jf[h].rows.v[first[h - g0]].layer ==
			    jf[g].rows.v[first[g - g0]].layer)
				merge = 0;
	}
	*ret_merged = merge;
	if (merge) {
		/* order files by layer, then forward, layer, row */
		int ord[64], n = g1 - g0;

		for (int i = 0; i < n; i++)
			ord[i] = i;
		for (int i = 1; i < n; i++)
			for (int j = i; j > 0 &&
			     jf[g0 + ord[j]].rows.v[first[ord[j]]].layer <
			     jf[g0 + ord[j - 1]].rows.v[first[ord[j - 1]]].layer;
			     j--) {
				int x = ord[j];

				ord[j] = ord[j - 1];
				ord[j - 1] = x;
			}
		for (size_t f = 0; f < fw[0].n && !e; f++)
			for (int i = 0; i < n && !e; i++) {
				struct fwd *w = &fw[ord[i]];
				struct rows *r = &jf[g0 + ord[i]].rows;

				for (size_t j = w->start[f];
				     j < w->start[f + 1] && !e; j++)
					e = es_trace_push(t, tok0 +
						(uint32_t)(j - first[ord[i]]),
						r->v[j].layer, r->v[j].ids,
						r->v[j].n);
			}
		goto out;
	}
	for (int g = g0; g < g1 && !e; g++) {
		struct rows *r = &jf[g].rows;
		struct fwd *w = &fw[g - g0];
		uint32_t tok = t->n_steps ?
			t->steps[t->n_steps - 1].token + 1 : 0;

		/* rows of one forward are tokens tok, tok+1, ...; a file with
		 * several layers repeats the row numbers per layer block */
		for (size_t f = 0; f < w->n && !e; f++) {
			size_t blk = w->start[f], most = 0;

			for (size_t j = w->start[f]; j < w->start[f + 1] && !e;
			     j++) {
				if (j > blk && r->v[j].layer != r->v[j - 1].layer)
					blk = j;
				if (j - blk + 1 > most)
					most = j - blk + 1;
				e = es_trace_push(t, tok + (uint32_t)(j - blk),
						  r->v[j].layer, r->v[j].ids,
						  r->v[j].n);
			}
			tok += (uint32_t)most;
		}
	}
out:
	for (int g = 0; g < 64; g++)
		free(fw[g].start);
	return e;
}

/* Renumbers layers densely (model layer numbers in increasing order). */
static void renumber_layers(struct es_trace *t)
{
	static const int none = -1;
	int map[ES_TRACE_MAX_LAYERS], n = 0;

	for (int l = 0; l < ES_TRACE_MAX_LAYERS; l++)
		map[l] = none;
	for (size_t i = 0; i < t->n_steps; i++)
		map[t->steps[i].layer] = 1;
	for (int l = 0; l < ES_TRACE_MAX_LAYERS; l++)
		if (map[l] != none) {
			t->layer_ids[n] = l;
			map[l] = n++;
		}
	t->n_layers = n;
	for (size_t i = 0; i < t->n_steps; i++)
		t->steps[i].layer = (uint16_t)map[t->steps[i].layer];
}

static void add_format(struct es_trace *t, const char *name)
{
	size_t len = strlen(t->formats);

	if (strstr(t->formats, name))
		return;
	snprintf(t->formats + len, sizeof(t->formats) - len, "%s%s",
		 len ? "," : "", name);
}

int es_trace_read(const char *const *paths, int n_paths, struct es_trace *t,
		  struct st_diag *diag)
{
	struct jfile *jf;
	int e = 0, n_experts = 0;

	memset(t, 0, sizeof(*t));
	jf = calloc((size_t)n_paths, sizeof(*jf));
	if (!jf)
		return -ENOMEM;
	for (int i = 0; i < n_paths && !e; i++) {
		char *buf = NULL;
		size_t len = 0, k = 0;

		e = st_read_file(paths[i], &buf, &len);
		if (e < 0) {
			st_diag_set(diag, e, "%s: cannot read: %s", paths[i],
				    st_strerror(e));
			break;
		}
		while (k < len && (buf[k] == ' ' || buf[k] == '\n' ||
				   buf[k] == '\r' || buf[k] == '\t'))
			k++;
		if (k < len && buf[k] == '{') {
			e = read_jsonl(paths[i], buf, len, &jf[i], diag);
		} else if (k < len && !strncmp(buf + k, "Layer ID,", 9)) {
			jf[i].fmt = ES_TRACE_MOEBEYOND;
			e = read_csv(paths[i], buf, len, &jf[i].rows, diag);
		} else {
			e = st_diag_set(diag, -ST_E_FORMAT,
					"%s:1: unknown trace format: neither "
					"JSON lines nor moe-beyond CSV (see "
					"docs/REPLAY.md for the formats strata "
					"replay reads)", paths[i]);
		}
		free(buf);
		if (jf[i].n_experts > n_experts)
			n_experts = jf[i].n_experts;
	}
	for (int i = 0; i < n_paths && !e;) {
		struct jfile *f = &jf[i];
		uint32_t tok0 = t->n_steps ?
			t->steps[t->n_steps - 1].token + 1 : 0;

		if (f->fmt == ES_TRACE_VLLM) {
			int j = i, merged = 0;

			/* at most 64 files per merge group */
			while (j < n_paths && jf[j].fmt == ES_TRACE_VLLM &&
			       j - i < 64)
				j++;
			e = push_vllm(t, jf, i, j, &merged);
			add_format(t, "A");
			t->batched = 1;
			i = j;
			continue;
		}
		if (f->fmt == ES_TRACE_STRATA) {
			e = strata_sequences(&f->rows);
			if (e < 0)
				break;
		}
		if (f->fmt != ES_TRACE_MARIO_RAW)
			qsort(f->rows.v, f->rows.n, sizeof(*f->rows.v),
			      cmp_ab_layer);
		if (f->fmt == ES_TRACE_MARIO_RAW) {
			mario_raw_order(&f->rows);
			qsort(f->rows.v, f->rows.n, sizeof(*f->rows.v),
			      cmp_ab_layer);
		}
		e = push_sorted(t, &f->rows, tok0);
		add_format(t, es_trace_format_name(f->fmt));
		i++;
	}
	for (int i = 0; i < n_paths; i++)
		free(jf[i].rows.v);
	free(jf);
	if (e < 0) {
		if (e == -ENOMEM)
			st_diag_set(diag, e, "out of memory reading traces");
		es_trace_fini(t);
		return e;
	}
	renumber_layers(t);
	t->n_experts = n_experts;
	es_trace_seal(t);
	return 0;
}
