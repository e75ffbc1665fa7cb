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

/* Argmax with ties to the lower id. */
int cw_argmax(const float *logits, int n);

/* A uniform double in [0, 1) from the sampler's stream. */
double cw_sampler_uniform(struct cw_sampler *s);

#endif
