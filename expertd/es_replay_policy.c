/*
 * es_replay_policy.c — the residency policies of the replay as scores
 * (es_replay_int.h): smaller score = evicted first.
 *
 *   lru     time of the last use
 *   lru2    time of the second-last use (LRU-K, K = 2: O'Neil, O'Neil and
 *           Weikum, SIGMOD 1993); one use only: minus infinity plus its
 *           last use, so single-use experts go first, oldest first
 *   lfu     uses since the start of the trace (history kept across
 *           evictions: "perfect LFU"); ties by last use
 *   lfud    uses decayed by 2^(-dt / 128 tokens)
 *   lrfu    uses decayed by 2^(-dt / 4 tokens) (LRFU: Lee et al., IEEE
 *           Trans. Computers 2001; between LRU and LFU)
 *   hist    learned probability of use soon (es_replay_hist.c; scanned)
 *   2q      2Q's two lists (es_replay_2q.c; scanned)
 *   lstale  Least-Stale (Hoang, Jaiswal, Samragh and Cho, "SpecMD: A
 *           Comprehensive Study On Speculative Expert Prefetching", arXiv
 *           2602.03921, 2026): evicts the expert whose predicted next use
 *           is farthest, predicted next use = last use + its mean reuse
 *           interval (at least 1 token).  The paper's own text was not
 *           readable here (only its abstract); the details are those two
 *           independent public replays attribute to it, and are guesses:
 *           the interval is an exponential average, 3/4 old + 1/4 new,
 *           seeded by the first interval; time is the token number; an
 *           expert not reused since it was loaded counts an interval of 1
 *           (predicted next use: the next token); its history is dropped
 *           when it is evicted; ties go to the smaller (layer, expert).
 *   belady  minus the step of the next use (never used again: -inf)
 *
 * Decayed counts are kept in log2: C(t) = 1 + C(t0) 2^(-(t - t0)/H); the
 * score log2 C(t0) + t0/H orders experts as C(now) does for any common now,
 * so it stays valid between touches.
 */
#include <math.h>

#include "es_replay_int.h"

#define LFUD_HALF_LIFE_TOKENS 128.0
#define LRFU_HALF_LIFE_TOKENS 4.0

/* log2(2^a + 2^b) without overflow. */
static double log2_add(double a, double b)
{
	double hi = a > b ? a : b, lo = a > b ? b : a;

	if (lo == -INFINITY)
		return hi;
	return hi + log2(1.0 + exp2(lo - hi));
}

static double decayed(struct es_rkey *k, double tok, double half_life,
		      int use)
{
	/* crf holds log2 C at time k->tok */
	double c = k->crf == -INFINITY ? -INFINITY :
		k->crf - (tok - k->tok) / half_life;

	if (use)
		c = log2_add(c, 0.0);
	k->crf = c;
	k->tok = tok;
	return c + tok / half_life;
}

void es_rpol_touch(struct es_rsim *m, uint32_t key, size_t s, size_t occ,
		   double tok, int prefetch)
{
	struct es_rkey *k = &m->k[key];
	double now = (double)++m->clock;

	switch (m->p) {
	case ES_RP_LRU:
		k->score = now;
		break;
	case ES_RP_2Q:
		if (!prefetch)
			k->last = now;
		k->score = now;
		break;
	case ES_RP_LRU2:
		if (!prefetch) {
			k->last2 = k->last;
			k->last = now;
		}
		/* last2 0 = one use: before every expert with two uses */
		k->score = k->last2 > 0 ? k->last2 : k->last - 1e15;
		break;
	case ES_RP_LFU:
		if (!prefetch)
			k->count++;
		k->score = (double)k->count * 1e13 + now;
		break;
	case ES_RP_LFUD:
		k->score = decayed(k, tok, LFUD_HALF_LIFE_TOKENS, !prefetch);
		break;
	case ES_RP_LRFU:
		k->score = decayed(k, tok, LRFU_HALF_LIFE_TOKENS, !prefetch);
		break;
	case ES_RP_LSTALE:
		if (!prefetch) {
			if (k->count) {
				double iv = tok - k->tok;

				k->ivl = k->ivl > 0 ? 0.75 * k->ivl + 0.25 * iv
						    : iv;
			}
			k->count++;
			k->tok = tok;
		} else if (!k->count) {
			k->tok = tok; /* loaded ahead: its load is its age */
		}
		k->score = -(k->tok + (k->ivl > 1.0 ? k->ivl : 1.0));
		break;
	case ES_RP_FUTURE:
		k->next = m->next_use[occ];
		k->score = now; /* recency, for ties */
		break;
	case ES_RP_BELADY:
		k->score = m->next_use[occ] == UINT32_MAX ? -INFINITY :
			-(double)m->next_use[occ];
		break;
	default:
		k->score = now;
		break;
	}
	(void)s;
}

double es_rpol_future_score(const struct es_rsim *m, uint32_t key,
			    size_t step)
{
	const struct es_rkey *k = &m->k[key];
	const struct es_trace *t = m->t;

	if (k->next != UINT32_MAX &&
	    t->steps[k->next].token <= t->steps[step].token +
	    (uint32_t)m->window_tokens)
		return 3.0 - (double)k->next / (double)t->n_steps;
	return es_rhist_score(m, key);
}

void es_rpol_evict(struct es_rsim *m, uint32_t key)
{
	/* LFU and the decayed counts keep their history across evictions
	 * (an expert's popularity does not reset because the pool dropped
	 * it); LRU-2 keeps its last two uses likewise.  Least-Stale keeps its
	 * reuse interval only while the expert is resident. */
	if (m->p == ES_RP_LSTALE) {
		m->k[key].count = 0;
		m->k[key].ivl = 0;
	}
}
