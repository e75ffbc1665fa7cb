/*
 * cw_dsv_state.h — the DeepSeek-V4 family's sequence state and forward
 * loop, every revision (private to computed/models/deepseek).
 *
 * One state type holds what any revision keeps per sequence; one loop
 * (cw_dsv_eval.c) runs a chunk of tokens layer by layer and, within a
 * layer, token by token, calling the revision's per-token layer function
 * (struct cw_dsv_rev: cw_dsv4.c for V4, cw_dsv41.c for V4.1).  What a
 * revision does differently — V4's multi-pass mHC and CSA/HCA
 * compressors, V4.1's single-pass mHC, CSA2 KV / index sources, FP4 main
 * KV rows, Engram and the CED shortcut — lives in its layer function and
 * the small files it calls; the state fields a revision does not use
 * stay zero / NULL.  A field a revision does not have is marked with it.
 */
#ifndef CW_DSV_STATE_H
#define CW_DSV_STATE_H

#include <stdint.h>

#include "cw_dsv.h"
#include "cw_dsv_int.h"

struct kv_client;
struct cw_steptime;

/* V4.1's streams of one layer, in declaration order (cw_dsv_kv_decl),
 * as indices of cw_dsv_lstate.kvs. */
enum {
	CW_DSV41_S_WINDOW = 0, /* K=V rows, per token, last W kept */
	CW_DSV41_S_GROUP,      /* KV source at ratio > 1: raw c, z inputs */
	CW_DSV41_S_CROW,       /* KV source: compressed rows, one per group */
	CW_DSV41_S_IKEY,       /* KV source: index keys, one per group */
	CW_DSV41_S_N
};

/*
 * Per-layer state.  kvs: the kvd stream index of each stream kind (V4:
 * enum cw_dsv_stream_kind; V4.1: CW_DSV41_S_*), -1 absent.
 * V4, the streams of DESIGN 3a (cw_dsv_streams), indexed by enum
 * cw_dsv_stream_kind:
 *  WINDOW       ring of the last W K=V rows (after norm and rope), row of
 *               position p at p mod W;
 *  COMP_STATE   compressor partial state: the raw inputs (c, then z with
 *               ape) of the last comp_ring(ratio) tokens, token p at p mod
 *               ring (CSA: the open window and the previous one's, 8
 *               tokens; HCA: the open window, ratio tokens);
 *  COMP_ROWS    compressed rows, one per ratio tokens (grows);
 *  INDEX_STATE, INDEX_ROWS  the same for the indexer's compressor (CSA).
 *  Process-local: buf[k] holds them; kvd state: rows live in the
 *  sequence's pages, fixed (ring) streams as per-token windowed streams,
 *  so row p of WINDOW is position p's row, not p mod W.
 * V4.1:
 *  kv    window ring: the last W K=V rows (after norm, rope, QAT), the
 *        row of position p at p mod W (kvd state: only when SWA replay is
 *        on, the replayed rows of the prefix, which live in shared pages);
 *  grp   KV source at ratio > 1: the open group's raw inputs (c then z),
 *        token p at p mod ratio (kvd state: 2 hd scratch floats);
 *  crow  KV source: compressed rows (after norm, rope, QAT), one per
 *        group (grows);
 *  ikey  KV source: index keys, one per group (grows);
 *  win_lo  first position whose window row is valid.
 */
struct cw_dsv_lstate {
	int kvs[CW_DSV_MAX_STREAMS];
	/* rows in buf even in a kvd state (V4's MTP block: its window ring
	 * is process-local, never in kvd pages) */
	int local;
	/* ---- V4 ---- */
	float *buf[CW_DSV_MAX_STREAMS];  /* process-local; NULL if absent */
	int elems[CW_DSV_MAX_STREAMS];   /* floats per row */
	int ring[CW_DSV_MAX_STREAMS];    /* fixed streams: rows; else 0 */
	/* ---- V4.1 ---- */
	int64_t win_lo;
	float *kv;
	float *grp;
	float *crow;
	float *ikey;
};

struct cw_dsv_rev;

struct cw_dsv_state {
	const struct cw_dsv_rev *rev;  /* the model's revision's functions */
	int len, cap;
	int hi;          /* one past the highest position evaluated (len,
			  * or more after cw_dsv_state_truncate) */
	int n_layers;
	int n_ls;        /* entries of ls: n_layers, + 1 with V4's MTP block */
	/* V4's MTP block (cw_dsv_mtp.c): its positions [0, mtp_len) hold
	 * current window rows; mtp_hi: one past the highest it wrote */
	int64_t mtp_len, mtp_hi;
	/* cw_dsv_mtp_follow: after each eval the block is run on the new
	 * positions (teacher-forced); [0, mtp_true) are so evaluated; the
	 * streams of the last eval's last rows (positions [keep_from,
	 * keep_from + keep_n), at most CW_DSV_ROLLBACK_MAX + 1) kept for
	 * cw_dsv_mtp_draft */
	int mtp_follow;
	/* the block's evaluations and LM-head rows since the last
	 * cw_dsv_mtp_take_counts */
	uint64_t mtp_evals, mtp_heads;
	int64_t mtp_true, keep_from;
	int keep_n;
	float *keep;
	/* cw_dsv_set_streams_out: the streams after the last layer of the
	 * next evals' tokens, [xout_rows][hc][D] by place in the chunk */
	float *xout;
	int xout_rows;
	int32_t *tokens; /* [tok_cap] the sequence's token ids (Engram) */
	int tok_cap;
	struct cw_dsv_lstate *ls;
	struct cw_dsv_debug *dbg;
	struct cw_steptime *tl;  /* borrowed, NULL: no step timeline */
	struct cw_dsv_run run;   /* the FFN site's (cw_dsv_moe.c) */
	/* kvd state (cw_dsv_state_new_kv): the sequence's rows are in kvd
	 * pages; q.kv NULL for the process-local state */
	struct cw_dsv_kvseq q;
	struct cw_dsv_prompt pr; /* prefix mode */
	float *zero_row;  /* kvd state: what a missing row reads (never used
			   * for a result: the eval fails) */
	unsigned qat;     /* the QAT flags the streams were declared with */
	/* ---- V4.1 ---- */
	int ced;          /* CW_DSV41_CED_* */
	int ov_lo, ov_hi; /* window rows of positions [ov_lo, ov_hi) come
			   * from the ls->kv rings (SWA replay, kvd state) */
	float *dec;       /* kvd decode scratch: [W + index_topk + 1][hd] */
	int prefetch_failed; /* store mode: Engram prefetches refused */
};

/*
 * What one eval shares between its layers: per token, the streams X, the
 * lagged pre P (V4.1: the previous site's pre; one-hot on stream 0 before
 * layer 0), and V4.1's index sources' selections and candidate blocks.
 */
struct cw_dsv_chunk {
	int n;           /* tokens */
	int64_t p0;      /* position of token 0 */
	int replay;      /* V4.1 SWA replay: no global-KV appends */
	const int32_t *ids; /* [n] the tokens (V4's hash routing) */
	float *X;        /* [n][hc][D] */
	float *P;        /* [n][hc] */
	int isx[ST_DSV_MAX_LAYERS]; /* index source layer -> slot, -1 */
	int *sel;        /* [index sources][n][index_topk] */
	int *nsel;       /* [index sources][n] */
	double *sc;      /* [positions] index scores (one query at a time) */
	int *cand;       /* [n][candidate_topk_blocks] */
	int *ncand;      /* [n] */
};

/*
 * A revision's part of the forward pass.
 *  state_init   allocates the revision's per-layer state and scratch of
 *               s (common fields set; s->q.kv says kvd or process-local,
 *               max_tokens the positions a process-local state holds);
 *               0 or -ENOMEM (s is then freed by the caller);
 *  before_eval  store mode, at the start of an eval (kvd pinned, token
 *               history written): the revision's prefetch hints for
 *               ids[0..n) (a hint changes no result);
 *  layer_token  layer l for token t of the chunk: reads and updates
 *               ck->X[t] (and ck->P[t]) and s's streams; 0 or a negative
 *               code with diag set;
 *  head         the logits row of one token from its streams X [hc][D]
 *               and lagged pre P [hc].
 */
struct cw_dsv_rev {
	int (*state_init)(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s, int max_tokens);
	void (*before_eval)(const struct cw_dsv_model *m,
			    struct cw_dsv_state *s, const int32_t *ids, int n);
	int (*layer_token)(const struct cw_dsv_model *m,
			   struct cw_dsv_state *s, int l, int t,
			   struct cw_dsv_chunk *ck, struct st_diag *diag);
	void (*head)(const struct cw_dsv_model *m, const float *X,
		     const float *P, float *logits);
};

extern const struct cw_dsv_rev cw_dsv4_rev;   /* cw_dsv4.c */

/* V4's layer l's K=V window row of position p alone (its mHC pre,
 * attn_norm, wkv, kv_norm, rope and QAT: what layer_token writes) from
 * the layer's input streams X [hc][D]: the row depends on p's own input
 * only.  The MTP block's catch-up over positions whose attention output
 * is not needed.  0, or -ST_E_STALE (a kvd row not mapped). */
int cw_dsv4_window_row(const struct cw_dsv_model *m, struct cw_dsv_state *s,
		       int l, int64_t p, const float *X);

/* V4's head on streams X [hc][D] with the given hc_head weights (fn
 * [hc][hc D], base [hc], scale [1]) and final norm [D]: sigmoid pre
 * weights (+ hc_eps) on the RMS-scaled mixes, the collapse, the norm and
 * the LM head into logits [vocab] (the model's head with its own
 * weights; the MTP block's with its own). */
void cw_dsv4_head_with(const struct cw_dsv_model *m, const float *fn,
		       const float *base, const float *scale,
		       const float *norm, const float *X, float *logits);

/* After a successful eval of positions [p0, p0 + n) with s->mtp_follow:
 * the MTP block teacher-forced on those positions but the last (x: their
 * streams, [n][hc][D]), the last rows' streams kept for cw_dsv_mtp_draft.
 * A failure (-ENOMEM, expertd's) turns following off, warned once: drafts
 * stop, the eval's results stand. */
void cw_dsv_mtp_after_eval(const struct cw_dsv_model *m,
			   struct cw_dsv_state *s, const float *x, int p0,
			   int n);

/* V4's MTP block's window ring in s (process-local even in a kvd
 * state): ls[n_layers], W + CW_DSV_ROLLBACK_MAX rows.  0 or -ENOMEM. */
int cw_dsv_mtp_state_init(const struct cw_dsv_model *m,
			  struct cw_dsv_state *s);
extern const struct cw_dsv_rev cw_dsv41_rev;  /* cw_dsv41.c */

/* A state for at most max_tokens positions: process-local (kv NULL: the
 * streams in malloc'd arrays) or in kvd pages (kv: no arrays; the caller
 * sets q.seq).  -EINVAL, -ENOMEM. */
int cw_dsv_state_init(const struct cw_dsv_model *m, int max_tokens,
		      struct kv_client *kv, struct cw_dsv_state **ret);

/* Runs tokens ids[0..n) at positions p0.. through every layer (V4.1: the
 * layers after the last KV source on the last tokens only when the CED
 * shortcut is on; replay: no appends to the global KV), then the head
 * (logits as cw_dsv_eval; skipped when a kvd row was missing).  0 or the
 * layer function's error. */
int cw_dsv_run(const struct cw_dsv_model *m, struct cw_dsv_state *s,
	       const int32_t *ids, int n, int64_t p0, int replay,
	       int all_positions, float *logits, struct st_diag *diag);

#endif
