/*
 * cw_dsv41_ops.c — the numeric pieces of the DeepSeek-V4.1 forward pass
 * that V4 does not have (cw_dsv_ops.h; formulas:
 * MODEL_FAMILY_DEEPSEEK_V4.md 3.3 and 3.5).  The shared ones (RMSNorm,
 * rope, mHC mixer, router, SwiGLU, pooling, sink attention) are V4's, in
 * cw_dsv_ops.c.
 */
#include "cw_dsv.h"
#include "cw_dsv_ops.h"

#include <math.h>
#include <string.h>

int cw_dsv41_n_visible(int64_t p, int m)
{
	return m > 0 ? (int)((p + 1) / m) : 0;
}

int cw_dsv41_select(const double *sc, int n_vis, int top_k, int *sel)
{
	unsigned char used[n_vis > 0 ? n_vis : 1];
	int k = top_k < n_vis ? top_k : n_vis, n = 0;

	memset(used, 0, sizeof(used));
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < n_vis; e++)
			if (!used[e] && (best < 0 || sc[e] > sc[best]))
				best = e;
		if (best < 0 || sc[best] == -INFINITY)
			break;
		used[best] = 1;
	}
	for (int e = 0; e < n_vis; e++)
		if (used[e])
			sel[n++] = e;
	return n;
}

int cw_dsv41_candidate_blocks(const double *sc, int n_vis, int block_size,
			      int topk_blocks, int *blocks)
{
	int nb = (n_vis + block_size - 1) / block_size;
	double bs[nb > 0 ? nb : 1];

	for (int b = 0; b < nb; b++) {
		bs[b] = -INFINITY;
		for (int e = b * block_size;
		     e < n_vis && e < (b + 1) * block_size; e++)
			if (sc[e] > bs[b])
				bs[b] = sc[e];
	}
	if (nb > 0)
		bs[nb - 1] = INFINITY; /* the newest block is pinned */
	{
		unsigned char used[nb > 0 ? nb : 1];
		int k = topk_blocks < nb ? topk_blocks : nb, n = 0;

		memset(used, 0, sizeof(used));
		for (int j = 0; j < k; j++) {
			int best = -1;

			for (int b = 0; b < nb; b++)
				if (!used[b] && (best < 0 || bs[b] > bs[best]))
					best = b;
			used[best] = 1;
		}
		for (int b = 0; b < nb; b++)
			if (used[b])
				blocks[n++] = b;
		return n;
	}
}

double cw_dsv41_engram_gate(const float *x, const float *qk, const float *key,
			    int D, double eps)
{
	double dot = 0.0, sx = 0.0, sk = 0.0;

	for (int j = 0; j < D; j++) {
		dot += (double)x[j] * qk[j] * key[j];
		sx += (double)x[j] * x[j];
		sk += (double)key[j] * key[j];
	}
	dot = dot / sqrt(sx / D + eps) / sqrt(sk / D + eps) / sqrt((double)D);
	{
		double a = fabs(dot) > 1e-6 ? fabs(dot) : 1e-6;
		double g = (dot > 0 ? 1.0 : dot < 0 ? -1.0 : 0.0) * sqrt(a);

		return 1.0 / (1.0 + exp(-g));
	}
}

void cw_dsv41_hc_site(const float *X, int n, int D, const float *lag_pre,
		      const float *fn, const float *base, const float *scale,
		      int iters, double eps, double rms_eps, float *u,
		      float *pre, float *post, float *comb)
{
	cw_dsv_hc_pre(X, n, D, fn, base, scale, iters, eps, rms_eps, pre,
		       post, comb);
	cw_dsv_collapse(X, lag_pre, n, D, u);
}
