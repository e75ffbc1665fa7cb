/*
 * cw_dsv41_int.h — DeepSeek-V4.1's parts of the forward pass, private to
 * its layer (cw_dsv41.c): the KV row formats and access (cw_dsv41_rows.c),
 * the CSA2 KV and index sources (cw_dsv41_csa2.c) and Engram
 * (cw_dsv41_engram.c).  Formulas: MODEL_FAMILY_DEEPSEEK_V4.md 3.3-3.8.
 */
#ifndef CW_DSV41_INT_H
#define CW_DSV41_INT_H

#include <stdint.h>

#include "cw_dsv_state.h"

/* ---- rows (cw_dsv41_rows.c) ---- */

/* Where row r of stream `kind` (CW_DSV41_S_*) of layer l is to be
 * computed: the array row (process-local; the window ring at r mod W), the
 * replay ring (kvd, window rows of a replayed prefix), or `scratch`
 * (kvd; head_dim or index_head_dim floats). */
float *cw_dsv41_row_begin(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s, int l, int kind, int64_t r,
			  float *scratch);
/* Stores row r computed at x (from cw_dsv41_row_begin): applies the
 * stream's QAT (in place when process-local) or writes the page row in
 * its format.  0, or -EINVAL (width not a multiple of the format's
 * block). */
int cw_dsv41_row_end(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		     int l, int kind, int64_t r, float *x);
/* Row r of `kind` of layer l for reading: the array row, or the page row
 * (F32 in place, or decoded into buf, as wide as the row).  A row kvd
 * does not map sets s->q.row_missing and reads zeros. */
const float *cw_dsv41_row_get(const struct cw_dsv_model *m,
			      struct cw_dsv_state *s, int l, int kind,
			      int64_t r, float *buf);
/* The group-input slot of position p of KV source l (2 head_dim floats):
 * process-local ring, or the page row (ratio > 1) / scratch (ratio 1);
 * write: the page row is to be written. */
float *cw_dsv41_grp_slot(const struct cw_dsv_model *m,
			 struct cw_dsv_state *s, int l, int64_t p, int write);

/* ---- CSA2 sources (cw_dsv41_csa2.c) ---- */

/* KV source l, token at position p (a = attn_norm input, [D]): stores
 * its group inputs and, when it closes group g, appends the group's
 * compressed row and index key (pooled, normed; the index key
 * k_norm(wk latent); both roped at g ratio, with their QAT).  0 or
 * cw_dsv41_row_end's -EINVAL. */
int cw_dsv41_kv_source(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		       int l, const float *a, int64_t p);
/* Index source l for token t of the chunk (position p; qr the query
 * latent [q_lora_rank]): scores of the visible entries of its KV source's
 * keys, the candidate blocks (the candidate source) or the candidate mask
 * (later index sources), and the top-k, into ck->sel / ck->nsel.  0 or
 * the indexer QAT's -EINVAL. */
int cw_dsv41_index_source(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s, int l, const float *a,
			  const float *qr, int64_t p, int t,
			  struct cw_dsv_chunk *ck);

/* ---- Engram (cw_dsv41_engram.c) ---- */

/* Engram before layer L's mixer for token t at position p: X (the token's
 * hc x D streams) += gate per stream times the value read from the table
 * rows of the n-grams ending at p (s->tokens).  0, or the hash's or the
 * provider's error with diag set. */
int cw_dsv41_engram(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		    const struct cw_dsv_layer *L, int64_t p, float *X, int t,
		    struct st_diag *diag);
/* Store mode: asks expertd for the Engram rows of positions p0 ..
 * p0 + n - 1 of every Engram layer (a hint: a refusal is warned once and
 * counted in s->prefetch_failed). */
void cw_dsv41_engram_prefetch(const struct cw_dsv_model *m,
			      struct cw_dsv_state *s, int p0, int n);

#endif
