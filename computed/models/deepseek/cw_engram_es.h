/*
 * cw_engram_es.h — DeepSeek-V4.1 Engram rows from expertd's Engram tier
 * (the NVMe tier behind a host row cache, es_client.h) for the forward
 * pass's Engram row provider.
 *
 * cw_engram_es_get_rows has exactly the signature of the provider's
 * get_rows (struct cw_dsv41_engram_provider in cw_dsv.h: fn pointer +
 * ctx), with ctx a struct es_client *:
 *     struct cw_dsv41_engram_provider p = { cw_engram_es_get_rows, es };
 *     cw_dsv41_set_engram_provider(model, &p);
 * cw_engram_es_prefetch_token sends the row ids of a position to expertd
 * as soon as its token is known (the hash depends only on token ids), so
 * that the later layers' Engram lookups find their rows in the cache.
 */
#ifndef CW_ENGRAM_ES_H
#define CW_ENGRAM_ES_H

#include <stdint.h>

#include "es_client.h"
#include "st_engram_hash.h"
#include "st_error.h"

/*
 * Fills out[n][dim] (dim = engram_head_dim floats per row, dequantized
 * E4M3 x 2^(E8M0 - 127) per 32 columns) with rows row_ids[0..n) of the
 * table of Engram layer index ei (0 .. n_engram-1; table-local ids, the
 * hash's offsets added), fetched from expertd (ctx: struct es_client *,
 * borrowed).  Returns 0 or es_client_engram_fetch's codes with diag.
 */
int cw_engram_es_get_rows(void *ctx, int ei, const int64_t *row_ids, int n,
			  float *out, struct st_diag *diag);

/*
 * Asks expertd to prefetch the rows of position p (tokens[0..p], as for
 * st_engram_hash_rows) for Engram layer indexes first_ei .. n_layers-1
 * (pass 1 to skip the first Engram layer, which is needed at once).
 * Returns 0 or a negative code (a prefetch is a hint: callers may ignore
 * failures).
 */
int cw_engram_es_prefetch_token(struct es_client *es,
				const struct st_engram_hash *h,
				const int32_t *tokens, int p, int first_ei,
				struct st_diag *diag);

#endif
