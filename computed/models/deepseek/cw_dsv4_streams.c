/*
 * cw_dsv4_streams.c — the KV streams a DeepSeek-V4 layer declares
 * (DESIGN 3a; sizes: MODEL_FAMILY_DEEPSEEK_V4.md 2.6).  cw_dsv4.c's
 * process-local state has exactly these streams.
 */
#include "cw_dsv4.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kv_pool.h"
#include "st_plan.h"

int cw_dsv4_streams(const struct st_dsv4_config *c, int layer,
		    struct cw_dsv4_stream *out)
{
	int m, n = 0;

	if (layer < 0 || layer >= c->n_layers)
		return -EINVAL;
	m = c->compress_ratio[layer];
	out[n++] = (struct cw_dsv4_stream){ CW_DSV4_WINDOW, c->head_dim, 0,
					    c->sliding_window };
	if (!m)
		return n;
	out[n++] = (struct cw_dsv4_stream){ CW_DSV4_COMP_ROWS, c->head_dim, m,
					    0 };
	if (m == 4) {
		/* CSA: two series (a, b) of c and z per token, 2 windows */
		out[n++] = (struct cw_dsv4_stream){ CW_DSV4_COMP_STATE,
						    4 * c->head_dim, 0, 8 };
		out[n++] = (struct cw_dsv4_stream){ CW_DSV4_INDEX_ROWS,
						    c->index_head_dim, 4, 0 };
		out[n++] = (struct cw_dsv4_stream){ CW_DSV4_INDEX_STATE,
						    4 * c->index_head_dim, 0,
						    8 };
	} else {
		out[n++] = (struct cw_dsv4_stream){ CW_DSV4_COMP_STATE,
						    2 * c->head_dim, 0, m };
	}
	return n;
}

static double sum_bytes(const struct st_dsv4_config *c, int elem_bytes,
			int growing)
{
	struct cw_dsv4_stream s[CW_DSV4_MAX_STREAMS];
	double b = 0.0;

	for (int l = 0; l < c->n_layers; l++) {
		int n = cw_dsv4_streams(c, l, s);

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

double cw_dsv4_kv_bytes_per_token(const struct st_dsv4_config *c,
				  int elem_bytes)
{
	return sum_bytes(c, elem_bytes, 1);
}

double cw_dsv4_fixed_bytes(const struct st_dsv4_config *c, int elem_bytes)
{
	return sum_bytes(c, elem_bytes, 0);
}

int cw_dsv4_kv_decl(const struct st_dsv4_config *c, int elem_bytes,
		    struct kv_stream_decl *out, int max)
{
	struct cw_dsv4_stream st[CW_DSV4_MAX_STREAMS];
	int n = 0;

	for (int l = 0; l < c->n_layers; l++) {
		int ns = cw_dsv4_streams(c, l, st);

		for (int i = 0; i < ns; i++) {
			if (n >= max)
				return -ST_E_LIMIT;
			out[n++] = (struct kv_stream_decl){
				.row_bytes = (uint32_t)(st[i].row_elems *
							elem_bytes),
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

int cw_dsv4_plan_streams(const struct st_dsv4_config *c,
			 struct st_plan_model *m)
{
	static const char *const kname[] = {
		[CW_DSV4_WINDOW] = "window",
		[CW_DSV4_COMP_ROWS] = "pooled",
		[CW_DSV4_INDEX_ROWS] = "index",
		[CW_DSV4_COMP_STATE] = "comp-state",
		[CW_DSV4_INDEX_STATE] = "index-state",
	};
	struct st_plan_model t;
	struct cw_dsv4_stream st[CW_DSV4_MAX_STREAMS];

	t.n_streams = 0;
	for (int l = 0; l < c->n_layers; l++) {
		int ns = cw_dsv4_streams(c, l, st);

		for (int i = 0; i < ns; i++) {
			uint32_t tpr = st[i].rows_den ? (uint32_t)st[i].rows_den : 1;
			uint32_t win = st[i].rows_den ? 0 :
						       (uint32_t)st[i].fixed_rows;
			char name[16];
			int j;

			if (st[i].kind == CW_DSV4_WINDOW ||
			    st[i].kind == CW_DSV4_INDEX_ROWS ||
			    st[i].kind == CW_DSV4_INDEX_STATE)
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
