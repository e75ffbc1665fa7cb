/*
 * cw_dsv_streams.c — the KV streams a layer of the DeepSeek-V4 family
 * declares, for every revision (cw_dsv.h; DESIGN 3a; sizes:
 * MODEL_FAMILY_DEEPSEEK_V4.md 2.6 for V4, 3.7-3.8 for V4.1), their row
 * bytes in kvd, the declaration unrolled over the layers, and the byte
 * figures and planner view built on them.  The forward passes'
 * process-local states have exactly these streams.
 */
#include "cw_dsv.h"
#include "cw_dsv.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kv_pool.h"
#include "st_kvfmt_v41.h"
#include "st_plan.h"

/* V4: the window; at ratio m, the compressed rows and the compressor's
 * state, and for CSA (m = 4) the indexer's rows and state. */
static int streams_v4(const struct st_dsv_config *c, int layer,
		      struct cw_dsv_stream *out)
{
	int m = c->compress_ratio[layer], n = 0;

	out[n++] = (struct cw_dsv_stream){ CW_DSV_WINDOW, c->head_dim, 0,
					   c->sliding_window };
	if (!m)
		return n;
	out[n++] = (struct cw_dsv_stream){ CW_DSV_COMP_ROWS, c->head_dim, m,
					   0 };
	if (m == 4) {
		/* CSA: two series (a, b) of c and z per token, 2 windows */
		out[n++] = (struct cw_dsv_stream){ CW_DSV_COMP_STATE,
						   4 * c->head_dim, 0, 8 };
		out[n++] = (struct cw_dsv_stream){ CW_DSV_INDEX_ROWS,
						   c->index_head_dim, 4, 0 };
		out[n++] = (struct cw_dsv_stream){ CW_DSV_INDEX_STATE,
						   4 * c->index_head_dim, 0,
						   8 };
	} else {
		out[n++] = (struct cw_dsv_stream){ CW_DSV_COMP_STATE,
						   2 * c->head_dim, 0, m };
	}
	return n;
}

/* V4.1: the window; a KV source of ratio m its open group's raw c, z
 * inputs (m > 1), its compressed rows and its index keys. */
static int streams_v41(const struct st_dsv_config *c, int layer,
		       struct cw_dsv_stream *out)
{
	int m = c->compress_ratio[layer], n = 0;

	out[n++] = (struct cw_dsv_stream){ CW_DSV_WINDOW, c->head_dim, 0,
					   c->sliding_window };
	if (!c->kv_source[layer])
		return n;
	if (m < 1)
		return -EINVAL;
	if (m > 1)
		out[n++] = (struct cw_dsv_stream){ CW_DSV_COMP_STATE,
						   2 * c->head_dim, 0, m };
	out[n++] = (struct cw_dsv_stream){ CW_DSV_COMP_ROWS, c->head_dim, m,
					   0 };
	out[n++] = (struct cw_dsv_stream){ CW_DSV_INDEX_ROWS,
					   c->index_head_dim, m, 0 };
	return n;
}

int cw_dsv_streams(const struct st_dsv_config *c, int layer,
		   struct cw_dsv_stream *out)
{
	if (layer < 0 || layer >= c->n_layers)
		return -EINVAL;
	return c->revision == ST_DSV_REV_V41 ? streams_v41(c, layer, out) :
					       streams_v4(c, layer, out);
}

uint32_t cw_dsv_stream_row_bytes(const struct st_dsv_config *c,
				 const struct cw_dsv_stream *s, unsigned qat,
				 int elem_bytes)
{
	const size_t hd = (size_t)c->head_dim, Id = (size_t)c->index_head_dim;

	if (c->revision != ST_DSV_REV_V41)
		return (uint32_t)(s->row_elems * elem_bytes);
	switch (s->kind) {
	case CW_DSV_WINDOW:
		return (uint32_t)(qat & CW_DSV41_QAT_WINDOW_FP8 ?
				  st_kv41_fp8_row_bytes(hd) : hd * 4);
	case CW_DSV_COMP_ROWS:
		return (uint32_t)(qat & CW_DSV41_QAT_CROW_FP4 ?
				  st_kv41_crow_row_bytes(hd) : hd * 4);
	case CW_DSV_INDEX_ROWS:
		return (uint32_t)(qat & CW_DSV41_QAT_INDEX_FP4 ?
				  st_kv41_idx_row_bytes(Id) : Id * 4);
	default: /* the group's raw inputs: F32 */
		return (uint32_t)(s->row_elems * 4);
	}
}

int cw_dsv_kv_decl(const struct st_dsv_config *c, unsigned qat,
		   int elem_bytes, struct kv_stream_decl *out, int max)
{
	struct cw_dsv_stream st[CW_DSV_MAX_STREAMS];
	int n = 0;

	for (int l = 0; l < c->n_layers; l++) {
		int ns = cw_dsv_streams(c, l, st);

		if (ns < 0)
			return ns;
		for (int i = 0; i < ns; i++) {
			if (n >= max)
				return -ST_E_LIMIT;
			out[n++] = (struct kv_stream_decl){
				.row_bytes = cw_dsv_stream_row_bytes(
					c, &st[i], qat, elem_bytes),
				.tokens_per_row = st[i].rows_den ?
						  (uint32_t)st[i].rows_den : 1,
				.window_rows = st[i].rows_den ?
					       0 : (uint32_t)st[i].fixed_rows,
				.flags = 0,
			};
		}
	}
	return n;
}

double cw_dsv41_kv_bytes_per_token(const struct st_dsv_config *c)
{
	double b = 0.0;

	for (int l = 0; l < c->n_layers; l++)
		if (c->kv_source[l] && c->compress_ratio[l] > 0)
			b += (double)(st_kv41_crow_row_bytes(c->head_dim) +
				      st_kv41_idx_row_bytes(c->index_head_dim)) /
			     c->compress_ratio[l];
	return b;
}

double cw_dsv41_window_bytes(const struct st_dsv_config *c)
{
	return (double)c->n_layers * c->sliding_window *
	       st_kv41_fp8_row_bytes(c->head_dim);
}

static double sum_bytes(const struct st_dsv_config *c, int elem_bytes,
			int growing)
{
	struct cw_dsv_stream s[CW_DSV_MAX_STREAMS];
	double b = 0.0;

	for (int l = 0; l < c->n_layers; l++) {
		int n = cw_dsv_streams(c, l, s);

		for (int i = 0; i < n; i++) {
			double row = (double)s[i].row_elems * elem_bytes;

			if (growing && s[i].rows_den)
				b += row / s[i].rows_den;
			else if (!growing && !s[i].rows_den)
				b += row * s[i].fixed_rows;
		}
	}
	return b;
}

double cw_dsv4_kv_bytes_per_token(const struct st_dsv_config *c,
				  int elem_bytes)
{
	return sum_bytes(c, elem_bytes, 1);
}

double cw_dsv4_fixed_bytes(const struct st_dsv_config *c, int elem_bytes)
{
	return sum_bytes(c, elem_bytes, 0);
}

int cw_dsv4_plan_streams(const struct st_dsv_config *c,
			 struct st_plan_model *m)
{
	static const char *const kname[] = {
		[CW_DSV_WINDOW] = "window",
		[CW_DSV_COMP_ROWS] = "pooled",
		[CW_DSV_INDEX_ROWS] = "index",
		[CW_DSV_COMP_STATE] = "comp-state",
		[CW_DSV_INDEX_STATE] = "index-state",
	};
	struct st_plan_model t;
	struct cw_dsv_stream st[CW_DSV_MAX_STREAMS];

	t.n_streams = 0;
	for (int l = 0; l < c->n_layers; l++) {
		int ns = cw_dsv_streams(c, l, st);

		for (int i = 0; i < ns; i++) {
			uint32_t tpr = st[i].rows_den ? (uint32_t)st[i].rows_den : 1;
			uint32_t win = st[i].rows_den ? 0 :
						       (uint32_t)st[i].fixed_rows;
			char name[16];
			int j;

			if (st[i].kind == CW_DSV_WINDOW ||
			    st[i].kind == CW_DSV_INDEX_ROWS ||
			    st[i].kind == CW_DSV_INDEX_STATE)
				snprintf(name, sizeof(name), "%s",
					 kname[st[i].kind]);
			else
				snprintf(name, sizeof(name), "%s/%d",
					 kname[st[i].kind],
					 c->compress_ratio[l]);
			for (j = 0; j < t.n_streams; j++)
				if (!strcmp(t.streams[j].name, name))
					break;
			if (j == t.n_streams) {
				if (j == ST_PLAN_MAX_STREAMS)
					return -ST_E_LIMIT;
				memset(&t.streams[j], 0, sizeof(t.streams[j]));
				snprintf(t.streams[j].name,
					 sizeof(t.streams[j].name), "%s", name);
				t.streams[j].row_elems = (uint32_t)st[i].row_elems;
				t.streams[j].tokens_per_row = tpr;
				t.streams[j].window_rows = win;
				t.n_streams++;
			}
			t.streams[j].n_layers++;
		}
	}
	m->n_streams = t.n_streams;
	memcpy(m->streams, t.streams, sizeof(t.streams[0]) * t.n_streams);
	return 0;
}
