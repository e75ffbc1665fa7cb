/*
 * cw_dsv4_int.h — the DeepSeek-V4 sequence state (private to cw_dsv4*.c;
 * the weights of every revision: cw_dsv_int.h).
 */
#ifndef CW_DSV4_INT_H
#define CW_DSV4_INT_H

#include <stdint.h>

#include "cw_dsv4.h"
#include "cw_dsv_int.h"

struct kv_client;

/*
 * Per-layer state, as the streams of DESIGN 3a (cw_dsv_streams), indexed
 * by enum cw_dsv_stream_kind:
 *  WINDOW       ring of the last W K=V rows (after norm and rope), row of
 *               position p at p mod W;
 *  COMP_STATE   compressor partial state: the raw inputs (c, then z with
 *               ape) of the last comp_ring(ratio) tokens, token p at p mod
 *               ring (CSA: the open window and the previous one's, 8
 *               tokens; HCA: the open window, ratio tokens);
 *  COMP_ROWS    compressed rows, one per ratio tokens (grows);
 *  INDEX_STATE, INDEX_ROWS  the same for the indexer's compressor (CSA).
 * Process-local: buf[k] holds them; kvd state (cw_dsv4_state_new_kv): rows
 * live in the sequence's pages, fixed (ring) streams as per-token windowed
 * streams, so row p of WINDOW is position p's row, not p mod W.
 */
struct cw_dsv4_lstate {
	float *buf[CW_DSV_MAX_STREAMS];  /* process-local; NULL if absent */
	int elems[CW_DSV_MAX_STREAMS];   /* floats per row */
	int ring[CW_DSV_MAX_STREAMS];    /* fixed streams: rows; else 0 */
	int kvs[CW_DSV_MAX_STREAMS];     /* kvd stream index, -1 absent */
};

struct cw_dsv4_state {
	int len, cap;
	struct cw_dsv4_lstate *ls;
	int n_layers;
	struct cw_dsv4_debug *dbg;
	struct cw_dsv_run run;  /* the FFN site's (cw_dsv_moe.c) */
	/* kvd state (cw_dsv4_state_new_kv): the sequence's rows are in kvd
	 * pages; q.kv NULL for the process-local state */
	struct cw_dsv_kvseq q;
	/* prefix mode (cw_dsv4_state_new_kv with a prompt) */
	struct cw_dsv_prompt pr;
	float *zero_row;  /* what a missing row reads (never used for a
			   * result: the eval fails) */
};

/* A state for at most max_tokens positions: process-local (kv NULL: the
 * streams in malloc'd arrays) or in kvd pages (kv: no arrays; the caller
 * sets seq).  -EINVAL, -ENOMEM. */
int cw_dsv4_state_init(const struct cw_dsv_model *m, int max_tokens,
		       struct kv_client *kv, struct cw_dsv4_state **ret);

#endif
