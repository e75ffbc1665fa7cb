/* cw_router.c — see cw_router.h. */
#include "cw_router.h"

#include <errno.h>
#include <math.h>

int cw_route_topk(const float *logits, int n_experts, int k, int renormalise,
		  int *ret_experts, float *ret_weights)
{
	float p[CW_MAX_EXPERTS], mx = -INFINITY;
	unsigned char used[CW_MAX_EXPERTS] = { 0 };
	double sum = 0.0, wsum = 0.0;

	if (n_experts < 1 || n_experts > CW_MAX_EXPERTS || k < 1 ||
	    k > n_experts)
		return -EINVAL;
	for (int e = 0; e < n_experts; e++)
		if (logits[e] > mx)
			mx = logits[e];
	for (int e = 0; e < n_experts; e++) {
		p[e] = expf(logits[e] - mx);
		sum += p[e];
	}
	for (int e = 0; e < n_experts; e++)
		p[e] = (float)(p[e] / sum);
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < n_experts; e++)
			if (!used[e] && (best < 0 || p[e] > p[best]))
				best = e;
		used[best] = 1;
		ret_experts[j] = best;
		ret_weights[j] = p[best];
		wsum += p[best];
	}
	if (renormalise)
		for (int j = 0; j < k; j++)
			ret_weights[j] = (float)(ret_weights[j] / wsum);
	return 0;
}
