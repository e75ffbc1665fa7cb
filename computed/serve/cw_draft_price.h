/*
 * cw_draft_price.h — the draft length of speculative decoding priced in
 * step time and expert bytes (issue 22 §3), per generation.
 *
 * Cost model.  A decode step that verifies k drafts produces 1 + a tokens,
 * a the accepted drafts.  With a per-token acceptance p (each draft is
 * accepted with probability p given the ones before it were), the
 * expected accepted count is
 *     E[a | k, p] = sum_{i=1..k} p^i = p (1 - p^k) / (1 - p)
 * (Leviathan et al., "Fast Inference from Transformers via Speculative
 * Decoding", ICML 2023, eq. 1, and Chen et al., "Accelerating Large
 * Language Model Decoding with Speculative Sampling", 2023, where the
 * i.i.d. acceptance is the same assumption).  The step's cost is its wall
 * time T(k): on strata it grows with k mostly through the expert bytes
 * the extra tokens route to (a window's tokens read the union of their
 * experts, served from the host pool or, at a small budget, loaded from
 * the store: the price of a byte depends on the budget), plus their
 * compute.  T(k) is measured, not assumed: the step times seen at each k
 * (EWMA), and for a k not seen yet a weighted least-squares line through
 * the ones seen.  The length chosen maximises the expected tokens per
 * second
 *     k* = argmax_{k = 0..K} (1 + E[a | k, p]) / T(k)
 * (the "optimal gamma" of Leviathan et al. §3.5 with the measured cost
 * in place of their constant cost ratio c), and k* = 0 turns drafts off.
 * p is estimated from the steps seen: a step that verified k drafts and
 * accepted a < k gives a successes and one failure, a = k gives k
 * successes (the maximum-likelihood estimate of a truncated geometric),
 * with a prior of one each and a decay (CW_PRICE_DECAY) so that it follows
 * the text.  The expert bytes per k are kept alongside (the figures; the
 * extra bytes each verified token costs).
 *
 * Probes: while off, one step in CW_PRICE_PROBE_STEPS verifies
 * CW_PRICE_PROBE_K drafts (does it pay again?); while on, a step without
 * drafts is run when none was seen in CW_PRICE_PROBE0_STEPS steps (the
 * price of a plain step drifts as the expert cache warms).
 *
 * The choice depends on measured time: with a seed, sampled output may
 * differ between runs (greedy output never does: verification keeps it).
 */
#ifndef CW_DRAFT_PRICE_H
#define CW_DRAFT_PRICE_H

#include <stdint.h>

#include "cw_draft_ngram.h"

#define CW_PRICE_PROBE_STEPS 16   /* off: a probe every this many steps */
#define CW_PRICE_PROBE0_STEPS 64  /* on: a plain step at least this often */
#define CW_PRICE_PROBE_K 2        /* drafts of a probe (at most K) */
#define CW_PRICE_EWMA 0.125       /* weight of a new step time / bytes */
#define CW_PRICE_DECAY 0.97       /* per verify step, of the acceptance
				   * counts */

struct cw_draft_price {
	int k_max;                        /* K: 1..CW_DRAFT_MAX */
	double t_ns[CW_DRAFT_MAX + 1];    /* EWMA step time at k drafts */
	double bytes[CW_DRAFT_MAX + 1];   /* EWMA expert bytes at k drafts */
	uint32_t n[CW_DRAFT_MAX + 1];     /* steps seen at k drafts */
	double acc, fail;                 /* decayed acceptance counts */
	int since_plain;                  /* steps since one without drafts */
	int since_probe;                  /* steps off since the last probe */
	int k_best;                       /* the last argmax */
};

/* Starts the model for up to k_max drafts (1..CW_DRAFT_MAX): nothing
 * measured, p = 1/2.  0 or -EINVAL. */
int cw_draft_price_init(struct cw_draft_price *pr, int k_max);

/*
 * Records a decode step that verified k drafts (0..k_max; 0 a plain step)
 * of which `accepted` (0..k) were accepted, taking step_ns of wall time
 * and reading expert_bytes (cw_read_stats.expert_bytes of the step; in a
 * batched step, the whole step's: it is the step the tokens waited for).
 * Out-of-range k or accepted: -EINVAL, nothing recorded.
 */
int cw_draft_price_note(struct cw_draft_price *pr, int k, int accepted,
			uint64_t step_ns, uint64_t expert_bytes);

/* The per-token acceptance estimate p (0..1). */
double cw_draft_price_p(const struct cw_draft_price *pr);

/* E[a | k, p] = sum_{i=1..k} p^i (k >= 0; 0 for k = 0). */
double cw_draft_price_expected(int k, double p);

/*
 * The time model T(k) in ns for k = 0..k_max: the EWMA where k was seen,
 * else the weighted (by min(n, 8)) least-squares line through the k seen
 * (one k seen: flat).  -1 when nothing was seen.
 */
double cw_draft_price_time(const struct cw_draft_price *pr, int k);

/*
 * The pure choice: argmax over k = 0..k_max of (1 + E[a|k,p]) / t_ns[k]
 * (t_ns[k] > 0 for every k; ties go to the smaller k).  Tests give it
 * p and costs directly.
 */
int cw_draft_price_argmax(int k_max, double p, const double *t_ns);

/*
 * The draft limit of the next step (0..k_max), counting the step as
 * taken: k_max while no plain and no draft step were both seen (then the
 * first steps measure both: a step without a match is a plain one), else
 * the argmax of the model, with the probes described above.
 */
int cw_draft_price_next(struct cw_draft_price *pr);

#endif
