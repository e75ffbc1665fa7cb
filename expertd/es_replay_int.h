/*
 * es_replay_int.h — internals of the replay engine shared by es_replay.c
 * (the pool simulation) and es_replay_policy.c (the policies' scores).
 *
 * Every policy is a score: each time an expert is touched (accessed, or
 * loaded by a prefetch) the policy computes a number that stays fixed until
 * the next touch, and the victim is the resident, unpinned expert with the
 * smallest score.  That holds for LRU (time of use), LRU-2, LFU, decayed
 * frequency (all counts decay at the same rate, so their order is fixed
 * between touches: LRFU's argument) and Belady (minus the next use), so one
 * lazy min-heap per pool serves them all.
 */
#ifndef ES_REPLAY_INT_H
#define ES_REPLAY_INT_H

#include <stddef.h>
#include <stdint.h>

#include "es_replay.h"

/* Per-expert state the policies keep; key = layer * n_experts + expert. */
struct es_rkey {
	double score;     /* current score (smaller: evicted first) */
	double last;      /* access clock at the last use */
	double last2;     /* access clock at the use before (LRU-2) */
	double crf;       /* log2 of the decayed use count (LFUD, LRFU) */
	double tok;       /* token time of the last use (fractional) */
	double ivl;       /* lstale: mean reuse interval in tokens (0: not
			   * reused since loaded) */
	uint64_t count;   /* uses (LFU; lstale: uses since loaded) */
	uint32_t next;    /* future: step of the next use, or UINT32_MAX */
};

struct es_rsim {
	const struct es_trace *t;
	enum es_replay_policy p;
	uint32_t n_keys;
	struct es_rkey *k;      /* [n_keys] */
	uint64_t clock;         /* accesses so far (LRU clock) */
	const uint32_t *next_use; /* Belady: per id of the trace, the next
				   * step that uses the same key, or UINT32_MAX */
	/* hist (es_replay_hist.c) */
	uint64_t *hist;         /* [n_keys] use bits of the last 64 visits */
	uint32_t *hist_seen, *hist_used; /* [n_layers][states] */
	int hist_h;             /* label horizon in visits */
	int window_tokens;      /* future: tokens seen ahead */
	/* 2q (es_replay_2q.c) */
	uint8_t *q_in_a1;       /* [n_keys] resident in A1in */
	uint64_t *q_ghost;      /* [n_keys] A1out push number, 0: none */
	double *q_ins;          /* [n_keys] clock at insertion */
	uint32_t *q_a1;         /* [pools] A1in entries */
	uint64_t *q_pushes;     /* [pools] A1out pushes so far */
	const uint32_t *q_cap;  /* [pools] slots */
};

/* Draft foresight (es_replay_draft.c): the window of believed routing a
 * policy knows at the current token.  A key is known while known[key] ==
 * stamp; pos[key] is the virtual step (token * n_layers + layer) at which
 * the draft says it is used first (farther: evicted first). */
struct es_rdraft {
	const struct es_trace *t;
	int len, per_step, no_wrong;
	double accept;
	uint64_t seed;
	uint32_t *known;        /* [n_keys] stamp */
	uint64_t *pos;          /* [n_keys] virtual step of first believed use */
	uint32_t stamp;
	uint32_t *tok_first;    /* [n_tokens] first step of each token */
	uint16_t *tok_n;        /* [n_tokens] its steps */
	/* the current draft: made at token g, A accepted, src[j] the token
	 * whose routing position j (1..len) shows (UINT32_MAX: none) */
	uint32_t g, a, next_g;
	uint32_t src[ES_REPLAY_MAX_DRAFT + 1];
	int have;               /* a draft has been made */
	/* the current token: known when an earlier draft showed it as
	 * accepted; then cur_step[layer] is its step at each layer (-1) */
	uint32_t cur;
	int cur_known;
	int32_t *cur_step;      /* [n_layers] */
};

/* Sets up d for trace t (zeroed first).  -EINVAL with a message when the
 * options are out of range or the trace is batched (a draft needs tokens in
 * order, each token's steps together), -ENOMEM. */
int es_rdraft_init(struct es_rdraft *d, const struct es_trace *t,
		   const struct es_replay_opts *o, uint32_t n_keys,
		   struct st_diag *diag);
void es_rdraft_fini(struct es_rdraft *d);

/* Called at the first step of `token`: notes whether an earlier draft
 * showed this token as accepted (then its routing at its later layers is
 * known), makes a new draft where the schedule says so (counted in st) and
 * rebuilds the known window of drafted tokens. */
void es_rdraft_token(struct es_rdraft *d, uint32_t token,
		     struct es_replay_stats *st);

/* Does the draft knowledge at step `layer` of the current token show key
 * used ahead?  1 with *ret_pos its virtual step (token * n_layers + layer;
 * the current token's own later layers first, then the drafted tokens),
 * else 0. */
int es_rdraft_lookup(const struct es_rdraft *d, uint32_t key, int layer,
		     uint64_t *ret_pos);

/* The step of the trace whose experts the draft shows for the token after
 * `token` at layer `layer`, or -1 (none known). */
long es_rdraft_next_step(const struct es_rdraft *d, uint32_t token,
			 int layer);

/* Computes and stores the new score of `key` touched at step `s`, id index
 * `occ` (index into t->ids) and token time `tok`; prefetch: loaded ahead,
 * not yet used (counts as recency, not as a use). */
void es_rpol_touch(struct es_rsim *m, uint32_t key, size_t s, size_t occ,
		   double tok, int prefetch);

/* Resets key's state when it is evicted (history-keeping policies keep
 * counts; see es_replay_policy.c). */
void es_rpol_evict(struct es_rsim *m, uint32_t key);

/* hist: allocates its tables (-1 on no memory), frees them; a visit of
 * `layer` using ids[0..n-1] (learns, then shifts the histories); the
 * current score of a key (smaller: evicted first). */
int es_rhist_init(struct es_rsim *m);
void es_rhist_fini(struct es_rsim *m);
void es_rhist_visit(struct es_rsim *m, int layer, const uint16_t *ids, int n);
double es_rhist_score(const struct es_rsim *m, uint32_t key);

/* 2q: allocates its state (-1 on no memory), frees it; a key loaded into
 * / evicted from pool; the current score of a resident key. */
int es_r2q_init(struct es_rsim *m, uint32_t n_pools, const uint32_t *cap);
void es_r2q_fini(struct es_rsim *m);
void es_r2q_insert(struct es_rsim *m, uint32_t key, uint32_t pool);
void es_r2q_evict(struct es_rsim *m, uint32_t key, uint32_t pool);
double es_r2q_score(const struct es_rsim *m, uint32_t key, uint32_t pool);

/* future: score of key at step `step`: above every hist score when its
 * next use falls within the window (farther: smaller), else its hist
 * score. */
double es_rpol_future_score(const struct es_rsim *m, uint32_t key,
			    size_t step);

#endif
