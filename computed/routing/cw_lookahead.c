/*
 * cw_lookahead.c — gate look-ahead hints and routing reports to expertd
 * (cw_lookahead.h).
 */
#include "cw_lookahead.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cw_router.h"
#include "st_log.h"
#include "st_util.h"

/* Routing choices per ROUTE message (4 bytes each). */
#define CHUNK_CHOICES 65536

struct cw_lookahead {
	struct cw_model *m;          /* borrowed */
	struct es_client *es;        /* borrowed */
	int depth, measure, n_layers, n_experts, k;
	int span;                    /* layers probed ahead: max(depth, 3) */
	/* predictions for layer t made d layers earlier, per token:
	 * pred[((d-1) * n_layers + t) * cap * k ...]; valid for pred_pos0 */
	int *pred;
	uint32_t *pred_pos0;         /* [span * n_layers] */
	int *pred_n;                 /* [span * n_layers] tokens, 0 = none */
	int cap;                     /* tokens the arrays hold */
	int *hint_l, *hint_e;        /* [span * n_experts] */
	uint8_t *seen;               /* [span * n_experts] */
	cw_lookahead_oracle_fn oracle;
	void *oracle_arg;
	struct cw_lookahead_stats st;
};

int cw_lookahead_open(struct cw_model *m, struct es_client *es, int depth,
		      int measure, struct cw_lookahead **ret)
{
	const struct st_model_config *c = cw_model_config(m);
	struct cw_lookahead *la;

	*ret = NULL;
	if (depth < 0 || depth > CW_LOOKAHEAD_MAX_DEPTH)
		return -EINVAL;
	la = calloc(1, sizeof(*la));
	if (!la)
		return -ENOMEM;
	la->m = m;
	la->es = es;
	la->depth = depth;
	la->measure = measure;
	la->n_layers = c->n_layers;
	la->n_experts = c->n_experts;
	la->k = c->top_k;
	la->span = depth;
	if (measure && la->span < CW_LOOKAHEAD_MEASURE)
		la->span = CW_LOOKAHEAD_MEASURE;
	if (la->span) {
		size_t nl = (size_t)la->span * la->n_layers;

		la->pred_pos0 = calloc(nl, sizeof(uint32_t));
		la->pred_n = calloc(nl, sizeof(int));
		la->hint_l = calloc((size_t)la->span * la->n_experts,
				    sizeof(int));
		la->hint_e = calloc((size_t)la->span * la->n_experts,
				    sizeof(int));
		la->seen = calloc((size_t)la->span * la->n_experts, 1);
		if (!la->pred_pos0 || !la->pred_n || !la->hint_l ||
		    !la->hint_e || !la->seen) {
			cw_lookahead_close(la);
			return -ENOMEM;
		}
	}
	*ret = la;
	return 0;
}

void cw_lookahead_close(struct cw_lookahead *la)
{
	if (!la)
		return;
	free(la->pred);
	free(la->pred_pos0);
	free(la->pred_n);
	free(la->hint_l);
	free(la->hint_e);
	free(la->seen);
	free(la);
}

static int grow(struct cw_lookahead *la, int n)
{
	int *p;

	if (n <= la->cap)
		return 0;
	p = realloc(la->pred, sizeof(int) * (size_t)la->span * la->n_layers *
				      (size_t)n * la->k);
	if (!p)
		return -ENOMEM;
	la->pred = p;
	la->cap = n;
	/* the layout depends on cap: forget what was predicted */
	memset(la->pred_n, 0, sizeof(int) * (size_t)la->span * la->n_layers);
	return 0;
}

static int *pred_at(struct cw_lookahead *la, int d, int layer, int t)
{
	return la->pred + ((((size_t)(d - 1) * la->n_layers + layer) *
			    la->cap + t) * la->k);
}

/* Scores the predictions made for `layer` against its routing. */
static void score(struct cw_lookahead *la, int layer, uint32_t pos0, int n,
		  const int *experts)
{
	for (int d = 1; d <= la->span && d <= CW_LOOKAHEAD_MEASURE; d++) {
		size_t at = (size_t)(d - 1) * la->n_layers + layer;

		if (la->pred_n[at] != n || la->pred_pos0[at] != pos0)
			continue;
		for (int t = 0; t < n; t++) {
			const int *p = pred_at(la, d, layer, t);

			for (int i = 0; i < la->k; i++) {
				int e = experts[(size_t)t * la->k + i];

				la->st.pred[d - 1]++;
				for (int j = 0; j < la->k; j++)
					if (p[j] == e) {
						la->st.hit[d - 1]++;
						break;
					}
			}
		}
		la->pred_n[at] = 0;
	}
}

void cw_lookahead_layer_routed(void *arg, struct cw_model *m, int layer,
			       uint32_t pos0, int n, const float *h,
			       const int *experts, int k)
{
	struct cw_lookahead *la = arg;
	const int H = cw_model_config(m)->hidden_size;
	struct st_diag diag = { "" };
	int n_hint = 0, r;

	if (la->measure)
		score(la, layer, pos0, n, experts);
	if (la->span && grow(la, n) == 0) {
		memset(la->seen, 0, (size_t)la->span * la->n_experts);
		/* nearest layer first, then token order */
		for (int d = 1; d <= la->span; d++) {
			int t_layer = layer + d;
			size_t at = (size_t)(d - 1) * la->n_layers + t_layer;

			if (t_layer >= la->n_layers)
				break;
			for (int t = 0; t < n; t++) {
				int *p = pred_at(la, d, t_layer, t);

				if (!(la->oracle &&
				      la->oracle(la->oracle_arg, t_layer,
						 pos0 + (uint32_t)t, p, k)) &&
				    cw_model_route_probe(m, t_layer,
							 h + (size_t)t * H,
							 p) < 0)
					break;
				if (d > la->depth)
					continue;
				for (int i = 0; i < k; i++) {
					size_t si = (size_t)(d - 1) *
						    la->n_experts + p[i];

					if (la->seen[si])
						continue;
					la->seen[si] = 1;
					la->hint_l[n_hint] = t_layer;
					la->hint_e[n_hint++] = p[i];
				}
			}
			la->pred_n[at] = n;
			la->pred_pos0[at] = pos0;
		}
	}
	/* long prefills: the routing in several messages (each well under
	 * ST_MSG_MAX_BYTES), the hints with the last */
	r = 0;
	for (int t0 = 0; t0 < n && r == 0;) {
		int nt = ST_MIN(n - t0, CHUNK_CHOICES / k);
		int last = t0 + nt == n;

		r = es_client_route(la->es, layer, pos0 + (uint32_t)t0, nt, k,
				    experts + (size_t)t0 * k,
				    last ? n_hint : 0, la->hint_l, la->hint_e,
				    &diag);
		t0 += nt;
	}
	if (r < 0 && la->st.reports_failed++ == 0)
		st_warn("routing report to expertd failed: %s (statistics and "
			"prefetch degrade; results are unaffected)", diag.msg);
}

void cw_lookahead_set_oracle(struct cw_lookahead *la,
			     cw_lookahead_oracle_fn fn, void *arg)
{
	la->oracle = fn;
	la->oracle_arg = arg;
}

void cw_lookahead_stats(const struct cw_lookahead *la,
			struct cw_lookahead_stats *ret)
{
	*ret = la->st;
}
