/*
 * cw_engram_es.c — the Engram row provider over expertd (cw_engram_es.h).
 */
#include "cw_engram_es.h"

#include <stdlib.h>

int cw_engram_es_get_rows(void *ctx, int ei, const int64_t *row_ids, int n,
			  float *out, struct st_diag *diag)
{
	return es_client_engram_fetch((struct es_client *)ctx, ei, n, row_ids,
				      out, diag);
}

int cw_engram_es_prefetch_token(struct es_client *es,
				const struct st_engram_hash *h,
				const int32_t *tokens, int p, int first_ei,
				struct st_diag *diag)
{
	int64_t rows[64];
	int nl = st_engram_hash_n_layers(h), r = 0;

	if (st_engram_hash_rows_per_pos(h) > 64)
		return st_diag_set(diag, -ST_E_LIMIT, "Engram prefetch: %d rows "
				   "per position (at most 64)",
				   st_engram_hash_rows_per_pos(h));
	for (int ei = first_ei < 0 ? 0 : first_ei; ei < nl && !r; ei++) {
		int n = st_engram_hash_rows(h, ei, tokens, p, rows);

		if (n < 0)
			return st_diag_set(diag, n, "Engram prefetch: position "
					   "%d: a token id outside the map", p);
		r = es_client_engram_prefetch(es, ei, n, rows, diag);
	}
	return r;
}
