/*
 * es_actstats.h — activation statistics of the experts: per (layer, expert)
 * a count of routing choices with exponential decay, half-life in tokens
 * (so an expert chosen once h tokens ago counts 1/2, 2h ago 1/4).  This is
 * the "combined recency and frequency" value of LRFU (Lee et al., IEEE
 * Trans. Computers 50(12), 2001: CRF = sum over past uses of 2^(-lambda
 * (now - t_use)), here lambda = 1/half_life per token).
 *
 * Decay is applied lazily: an activation adds `inc`, and every token
 * multiplies `inc` by 2^(1/h); values are count / inc.  All counts are
 * rescaled when inc grows large, so nothing overflows.
 *
 * expertd updates them from ROUTE reports (server thread only: no
 * locking), ranks the hot set from them, and saves them in the instance's
 * state directory (never in the store, which may be read-only) so that a
 * restarted expertd warms the same hot set.  `strata activations` reads
 * the saved file.
 *
 * File (little-endian): "STACTS1\0", u32 version 1, u32 n_layers,
 * u32 n_experts, u32 0, f64 half_life, u64 tokens, u64 store_id,
 * f64 value[n_layers * n_experts], u64 XXH3-64 of all bytes before it.
 */
#ifndef ES_ACTSTATS_H
#define ES_ACTSTATS_H

#include <stddef.h>
#include <stdint.h>

#include "st_error.h"

#define ES_ACTSTATS_FILE "activations.bin"
#define ES_ACTSTATS_DEFAULT_HALF_LIFE 1024.0

struct es_actstats {
	uint32_t n_layers, n_experts;
	double half_life;      /* tokens */
	double step;           /* 2^(1/half_life) */
	double inc;            /* weight of one activation now */
	double *count;         /* [n_layers * n_experts], owned, scaled by inc */
	uint64_t tokens;       /* tokens counted since the statistics began */
	uint64_t store_id;
};

/* Allocates zeroed statistics.  half_life in tokens (> 0).  0, -EINVAL or
 * -ENOMEM. */
int es_actstats_init(struct es_actstats *s, uint32_t n_layers,
		     uint32_t n_experts, double half_life, uint64_t store_id);
void es_actstats_fini(struct es_actstats *s);

/* n more tokens went by: decays every count by 2^(-n / half_life). */
void es_actstats_tokens(struct es_actstats *s, uint64_t n);

/* One routing choice of expert e at layer l (ranges checked by caller). */
void es_actstats_add(struct es_actstats *s, uint32_t l, uint32_t e);

/* Decayed count of (l, e) as of now. */
double es_actstats_value(const struct es_actstats *s, uint32_t l, uint32_t e);

/* Decayed number of tokens counted: sum over i < tokens of
 * 2^(-i / half_life) (geometric series), the denominator of a rate. */
double es_actstats_mass(const struct es_actstats *s);

/* Per-token activation rate of (l, e): its decayed count over the decayed
 * number of tokens counted, sum over i < tokens of 2^(-i / half_life)
 * (geometric series; same decay as the counts, so a constant rate r gives
 * r).  In [0, 1] when every token routes to an expert of a layer at most
 * once; 0 before the first token. */
double es_actstats_rate(const struct es_actstats *s, uint32_t l, uint32_t e);

/* The n experts of layer l with the largest counts (ties: lower id first)
 * into ret[n]; n <= n_experts. */
void es_actstats_top(const struct es_actstats *s, uint32_t l, uint32_t n,
		     uint32_t *ret);

/* Writes the statistics to path atomically (temporary file + rename).
 * 0 or negative errno with diag. */
int es_actstats_save(const struct es_actstats *s, const char *path,
		     struct st_diag *diag);

/*
 * Reads statistics saved by es_actstats_save into s (already initialised).
 * When expect_geometry is set the file must have s's n_layers, n_experts
 * and store_id (else -ST_E_STALE: another model); otherwise s is
 * re-initialised with the file's geometry (half-life of s kept).
 * Errors: -ENOENT, -ST_E_BADMAGIC, -ST_E_FORMAT (truncated), -ST_E_CHECKSUM,
 * -ST_E_STALE, each with diag.
 */
int es_actstats_load(struct es_actstats *s, const char *path,
		     int expect_geometry, struct st_diag *diag);

#endif
