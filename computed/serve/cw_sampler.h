/*
 * cw_sampler.h — choosing the next token from logits: greedy (argmax, ties
 * to the lower id), or temperature, then top-k, then top-p (nucleus) over a
 * seeded random stream, in the order llama.cpp and vLLM apply them.
 */
#ifndef CW_SAMPLER_H
#define CW_SAMPLER_H

#include <stdint.h>

struct cw_sampler_params {
	float temperature;   /* <= 0: greedy */
	int top_k;           /* <= 0: off */
	float top_p;         /* >= 1 or <= 0: off */
	uint64_t seed;
};

struct cw_sampler {
	struct cw_sampler_params p;
	uint64_t rng[4];     /* xoshiro256** state, from the seed via splitmix64 */
	int *idx;            /* scratch, owned */
	float *prob;         /* scratch, owned */
	int cap;
};

/* Initialises with params (copied).  0 or -EINVAL for NaN/negative values
 * that make no sense (temperature < 0 is treated as greedy). */
int cw_sampler_init(struct cw_sampler *s, const struct cw_sampler_params *p);
void cw_sampler_fini(struct cw_sampler *s);

/* Picks a token from logits[0..n).  Returns the id (>= 0) or -ENOMEM. */
int cw_sampler_sample(struct cw_sampler *s, const float *logits, int n);

/*
 * Speculative sampling of one position against a deterministic draft
 * token (Leviathan et al. 2023, "Fast Inference from Transformers via
 * Speculative Decoding", Algorithm 1; Chen et al. 2023): with p the
 * distribution cw_sampler_sample draws from (temperature, top-k, top-p
 * applied to logits[0..n)) and a draft that proposed `draft` with
 * probability 1 (q a point mass, as n-gram drafts are), the draft is
 * accepted with probability min(1, p(draft) / q(draft)) = p(draft); on a
 * rejection the token is drawn from the residual max(0, p - q)
 * renormalised, which is p with `draft` removed.  The token returned is
 * then distributed exactly as p.  Greedy (temperature <= 0): the argmax.
 * Returns the token (== draft when accepted) or -ENOMEM; -EINVAL for a
 * draft outside [0, n).
 */
int cw_sampler_verify(struct cw_sampler *s, const float *logits, int n,
		      int32_t draft);

/* Argmax with ties to the lower id. */
int cw_argmax(const float *logits, int n);

/* A uniform double in [0, 1) from the sampler's stream. */
double cw_sampler_uniform(struct cw_sampler *s);

#endif
