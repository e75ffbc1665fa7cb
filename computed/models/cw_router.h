/*
 * cw_router.h — MoE routing: softmax over the router logits (float32), the
 * top-k experts by descending probability (ties to the lower expert id),
 * optionally renormalised to sum to 1 (`norm_topk_prob`).
 * Mixtral always renormalises; Qwen3-MoE reads the flag from config.json
 * (MODEL_FAMILIES.md 0.9; PITFALLS P4).
 */
#ifndef CW_ROUTER_H
#define CW_ROUTER_H

#define CW_MAX_EXPERTS 1024

/*
 * logits[n_experts] -> ret_experts[k] (expert ids, by descending weight) and
 * ret_weights[k].  n_experts <= CW_MAX_EXPERTS, 1 <= k <= n_experts.
 * Returns 0 or -EINVAL.
 */
int cw_route_topk(const float *logits, int n_experts, int k, int renormalise,
		  int *ret_experts, float *ret_weights);

#endif
