/*
 * cw_dsv41_st.h — the DeepSeek-V4.1 sequence state (private to cw_dsv41.c
 * and cw_dsv41_kv.c): process-local arrays, or the sequence's pages in kvd
 * (cw_dsv41_state_new_kv; design: docs/DESIGN.md 3a "DeepSeek-V4.1 in
 * kvd").
 */
#ifndef CW_DSV41_ST_H
#define CW_DSV41_ST_H

#include <stdint.h>

#include "cw_dsv41.h"
#include "cw_dsv_int.h"

struct kv_client;

/* The streams of one layer, in declaration order (cw_dsv_kv_decl). */
enum {
	CW_DSV41_S_WINDOW = 0, /* K=V rows, per token, last W kept */
	CW_DSV41_S_GROUP,      /* KV source at ratio > 1: raw c, z inputs */
	CW_DSV41_S_CROW,       /* KV source: compressed rows, one per group */
	CW_DSV41_S_IKEY,       /* KV source: index keys, one per group */
	CW_DSV41_S_N
};

/*
 * Per-layer state:
 *  kv    window ring: the last W K=V rows (after norm, rope, QAT), the
 *        row of position p at p mod W (kvd state: only when SWA replay is
 *        on, the replayed rows of the prefix, which live in shared pages);
 *  grp   KV source at ratio > 1: the open group's raw inputs (c then z),
 *        token p at p mod ratio (kvd state: 2 hd scratch floats);
 *  crow  KV source: compressed rows (after norm, rope, QAT), one per
 *        group (grows);
 *  ikey  KV source: index keys, one per group (grows).
 *  kvs   kvd stream index of each CW_DSV41_S_* kind (-1: absent).
 */
struct cw_dsv41_lstate {
	int64_t win_lo;  /* first position whose window row is valid */
	float *kv;
	float *grp;
	float *crow;
	float *ikey;
	int kvs[CW_DSV41_S_N];
};

struct cw_dsv41_state {
	int len, cap;
	int ced;         /* CW_DSV41_CED_* */
	int32_t *tokens; /* [tok_cap] the sequence's token ids (Engram) */
	int tok_cap;
	struct cw_dsv41_lstate *ls;
	int n_layers;
	struct cw_dsv41_debug *dbg;
	struct cw_steptime *tl;  /* borrowed, NULL: no step timeline */
	/* kvd state: q.kv NULL for the process-local one */
	struct cw_dsv_kvseq q;
	unsigned qat;     /* the QAT flags the streams were declared with */
	int ov_lo, ov_hi; /* window rows of positions [ov_lo, ov_hi) come
			   * from the ls->kv rings (SWA replay, kvd state) */
	float *dec;       /* decode scratch: [W + index_topk + 1][hd] */
	float *zero_row;  /* what a missing row reads */
	struct cw_dsv_prompt pr; /* prefix mode */
	struct cw_dsv_run run;  /* the FFN site's (cw_dsv_moe.c) */
	int prefetch_failed; /* store mode: Engram prefetches refused */
};

/* A state: process-local (kv NULL, arrays for max_tokens positions) or in
 * kvd pages (kv, qat: the declared formats; streams indexed as
 * cw_dsv_kv_decl; the caller sets seq).  -EINVAL, -ENOMEM. */
int cw_dsv41_state_init(const struct cw_dsv_model *m, int max_tokens,
			struct kv_client *kv, struct cw_dsv41_state **ret);

#endif
