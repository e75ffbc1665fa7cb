/*
 * es_replay.c — the pool simulation of the replay (model: es_replay.h;
 * scores: es_replay_policy.c).  One lazy min-heap of (score, key, version)
 * per pool: a touch pushes a new entry and bumps the key's version, so
 * older entries of that key are skipped when they surface; the heap is
 * rebuilt from the resident keys when stale entries pile up.  Policies whose
 * scores change with time (hist, 2q, future) scan the pool's resident list
 * instead.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "es_replay_int.h"

static const char *const policy_names[] = {
	"lru", "lru2", "lfu", "lfud", "lrfu", "hist", "2q", "lstale", "belady",
	"future",
};
_Static_assert(sizeof(policy_names) / sizeof(policy_names[0]) == ES_RP_N_BASE,
	       "one name per policy");

const char *es_replay_policy_name(enum es_replay_policy p)
{
	return (unsigned)p < ES_RP_N_BASE ? policy_names[p] : NULL;
}

int es_replay_policy_parse(const char *name)
{
	for (int i = 0; i < ES_RP_N_BASE; i++)
		if (!strcmp(name, policy_names[i]))
			return i;
	return -ST_E_NOTFOUND;
}

struct hent {
	double score;
	uint32_t key, ver;
};

struct heap {
	struct hent *v;
	size_t n, cap;
};

static int hless(const struct hent *a, const struct hent *b)
{
	return a->score < b->score || (a->score == b->score && a->key < b->key);
}

static int heap_push(struct heap *h, struct hent e)
{
	size_t i;

	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 256;
		void *p = realloc(h->v, cap * sizeof(*h->v));

		if (!p)
			return -ENOMEM;
		h->v = p;
		h->cap = cap;
	}
	i = h->n++;
	while (i && hless(&e, &h->v[(i - 1) / 2])) {
		h->v[i] = h->v[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->v[i] = e;
	return 0;
}

static struct hent heap_pop(struct heap *h)
{
	struct hent top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= h->n)
			break;
		if (c + 1 < h->n && hless(&h->v[c + 1], &h->v[c]))
			c++;
		if (!hless(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

struct sim {
	struct es_rsim m;
	const struct es_replay_opts *o;
	uint32_t n_pools;
	uint32_t *cap, *count;     /* per pool */
	struct heap *heaps;        /* per pool */
	uint8_t *resident;         /* per key */
	uint8_t *prefetched;       /* per key: loaded ahead, not yet used */
	uint32_t *ver;             /* per key */
	uint32_t *pin;             /* per key: step + 1 that pins it */
	uint32_t *vis;             /* per key: step + 1 that sees it ahead */
	uint8_t *vis_dist;         /* per key: layers ahead it is seen */
	int32_t *next_layer;       /* per step: same token's next step */
	int scan;                  /* victim by scanning the pool (scores
				    * that change with time: hist) */
	uint32_t *rlist, *rpos, *poff; /* scan: residents of pool p are
				    * rlist[poff[p] .. poff[p] + count[p]) */
	uint32_t *aside;           /* [n_slots] victim search scratch */
	struct hent *aside_ent;    /* [n_slots] */
	struct es_rdraft dr;       /* draft foresight (draft: 1) */
	int draft;
	uint32_t *pf_prev, *pf_cur; /* draft prefetches made during the
				    * previous / current token */
	uint32_t n_pf_prev, n_pf_cur, cap_pf;
	uint32_t *pf_for;          /* per key: the token it was prefetched
				    * for */
	struct es_replay_stats *st;
};

static uint32_t pool_of(const struct sim *s, uint32_t key)
{
	return s->o->per_layer ? key / (uint32_t)s->m.t->n_experts : 0;
}

static int touch(struct sim *s, uint32_t key, size_t step, size_t occ,
		 double tok, int prefetch)
{
	es_rpol_touch(&s->m, key, step, occ, tok, prefetch);
	s->ver[key]++;
	if (s->scan)
		return 0;
	return heap_push(&s->heaps[pool_of(s, key)],
			 (struct hent){ s->m.k[key].score, key, s->ver[key] });
}

/* Rebuilds pool p's heap from its resident keys (drops stale entries). */
static int heap_compact(struct sim *s, uint32_t p)
{
	struct heap *h = &s->heaps[p];
	size_t n = h->n;
	struct hent *old = h->v;
	int e = 0;

	h->v = NULL;
	h->n = h->cap = 0;
	for (size_t i = 0; i < n && !e; i++)
		if (s->resident[old[i].key] && old[i].ver == s->ver[old[i].key])
			e = heap_push(h, old[i]);
	free(old);
	return e;
}

/* Victim classes, in the order they are given up: a free key (by the
 * policy's score), then a key seen in the look-ahead window (the one seen
 * farthest ahead), then, for a demand miss only, a prefetched key not yet
 * used (its load has landed by then, but it is wasted).  A key the step pins
 * is never a victim (PITFALLS P12). */
enum { VC_PINNED = 0, VC_PENDING, VC_SEEN, VC_FREE };

static int victim_class(const struct sim *s, uint32_t key, size_t step)
{
	if (s->pin[key] == step + 1)
		return VC_PINNED;
	if (s->prefetched[key])
		return VC_PENDING;
	if (s->vis[key] == step + 1)
		return VC_SEEN;
	return VC_FREE;
}

/* The fallback among keys that are not free: -1 when none may go. */
static int fallback_victim(const struct sim *s, const uint32_t *keys,
			   size_t n, size_t step, int for_prefetch)
{
	int best = -1, pending = -1;

	for (size_t i = 0; i < n; i++) {
		int c = victim_class(s, keys[i], step);

		if (c == VC_SEEN && (best < 0 || s->vis_dist[keys[i]] >
				     s->vis_dist[keys[best]]))
			best = (int)i;
		if (c == VC_PENDING && pending < 0)
			pending = (int)i;
	}
	if (best >= 0)
		return (int)keys[best];
	if (pending >= 0 && !for_prefetch)
		return (int)keys[pending];
	return -1;
}

/* The base policy's current score of a resident key of pool p (smaller:
 * evicted first); the heap policies' scores are fixed between touches. */
static double base_score(const struct sim *s, uint32_t key, uint32_t p,
			 size_t step)
{
	switch (s->m.p) {
	case ES_RP_FUTURE:
		return es_rpol_future_score(&s->m, key, step);
	case ES_RP_2Q:
		return es_r2q_score(&s->m, key, p);
	case ES_RP_HIST:
		return es_rhist_score(&s->m, key);
	default:
		return s->m.k[key].score;
	}
}

/* scan policies: the free resident key of pool p with the smallest score
 * (ties: least recently used, then the smaller key, as the heap orders
 * them), else the fallback; -1 when none may go.
 * With draft foresight the keys the draft window shows rank above all
 * others (class 1), the one believed used farthest ahead first. */
static int scan_victim(struct sim *s, uint32_t p, size_t step,
		       int for_prefetch)
{
	double best_sc = 0, best_lru = 0;
	int best = -1, best_cls = 0;
	size_t n_aside = 0;

	for (uint32_t i = s->poff[p]; i < s->poff[p] + s->count[p]; i++) {
		uint32_t key = s->rlist[i];
		double sc, lru = s->m.k[key].score;
		uint64_t pos;
		int cls = 0;

		if (victim_class(s, key, step) != VC_FREE) {
			s->aside[n_aside++] = key;
			continue;
		}
		if (s->draft && es_rdraft_lookup(&s->dr, key,
						 s->m.t->steps[step].layer,
						 &pos)) {
			cls = 1;
			sc = -(double)pos;
		} else {
			sc = base_score(s, key, p, step);
		}
		if (best < 0 || cls < best_cls || (cls == best_cls &&
		    (sc < best_sc || (sc == best_sc && (lru < best_lru ||
		     (lru == best_lru && key < (uint32_t)best)))))) {
			best = (int)key;
			best_cls = cls;
			best_sc = sc;
			best_lru = lru;
		}
	}
	if (best >= 0)
		return best;
	return fallback_victim(s, s->aside, n_aside, step, for_prefetch);
}

static void rlist_del(struct sim *s, uint32_t p, uint32_t key)
{
	uint32_t last = s->poff[p] + s->count[p] - 1, i = s->rpos[key];

	s->rlist[i] = s->rlist[last];
	s->rpos[s->rlist[i]] = i;
}

/* heap policies: pops stale and non-free entries until a free key comes
 * up (the smallest score), else the fallback; the popped valid entries go
 * back.  -1 when none may go, or -ENOMEM. */
static int heap_victim(struct sim *s, uint32_t p, size_t step,
		       int for_prefetch)
{
	struct heap *h = &s->heaps[p];
	size_t n_aside = 0;
	int found = -1, e = 0;

	while (h->n) {
		struct hent x = heap_pop(h);

		if (!s->resident[x.key] || x.ver != s->ver[x.key])
			continue; /* stale */
		if (victim_class(s, x.key, step) != VC_FREE) {
			s->aside_ent[n_aside] = x;
			s->aside[n_aside++] = x.key;
			continue;
		}
		found = (int)x.key;
		break;
	}
	if (found < 0)
		found = fallback_victim(s, s->aside, n_aside, step,
					for_prefetch);
	for (size_t i = 0; i < n_aside && !e; i++)
		if ((int)s->aside[i] != found)
			e = heap_push(h, s->aside_ent[i]);
	return e ? e : found;
}

/* Picks and evicts pool p's victim at step `step` (classes above).
 * Returns 0, -ST_E_BUSY (nothing may go: every key pinned, or for a
 * prefetch, pinned, seen or awaiting use) or -ENOMEM. */
static int evict_one(struct sim *s, uint32_t p, size_t step, int for_prefetch)
{
	int found;

	if (s->scan) {
		found = scan_victim(s, p, step, for_prefetch);
		if (found < 0)
			return -ST_E_BUSY;
		rlist_del(s, p, (uint32_t)found);
	} else {
		found = heap_victim(s, p, step, for_prefetch);
		if (found == -ENOMEM)
			return found;
		if (found < 0)
			return -ST_E_BUSY;
	}
	if (s->pin[found] == step + 1)
		s->st->pinned_evicted = 1;
	s->resident[found] = 0;
	s->ver[found]++;
	s->count[p]--;
	s->st->evictions++;
	if (s->prefetched[found]) {
		s->prefetched[found] = 0;
		s->st->prefetch_wasted++;
	}
	es_rpol_evict(&s->m, (uint32_t)found);
	if (s->m.p == ES_RP_2Q)
		es_r2q_evict(&s->m, (uint32_t)found, p);
	return 0;
}

/* Makes key resident (a load), evicting first when its pool is full. */
static int load(struct sim *s, uint32_t key, size_t step, int for_prefetch)
{
	uint32_t p = pool_of(s, key);
	int e;

	if (s->count[p] >= s->cap[p]) {
		e = evict_one(s, p, step, for_prefetch);
		if (e < 0)
			return e;
	}
	s->resident[key] = 1;
	if (s->m.p == ES_RP_2Q)
		es_r2q_insert(&s->m, key, p);
	if (s->scan) {
		s->rpos[key] = s->poff[p] + s->count[p];
		s->rlist[s->rpos[key]] = key;
	}
	s->count[p]++;
	if (s->count[p] > s->cap[p])
		s->st->over_capacity = 1;
	if (s->count[p] > s->st->max_resident)
		s->st->max_resident = s->count[p];
	if (!s->scan && s->heaps[p].n > 8 * (size_t)s->cap[p] + 1024)
		return heap_compact(s, p);
	return 0;
}

/* Next-use table for Belady: for each id of the trace, the next step that
 * uses the same key, or UINT32_MAX. */
static uint32_t *build_next_use(const struct es_trace *t, uint32_t n_keys)
{
	uint32_t *next = malloc(t->n_ids * sizeof(*next));
	uint32_t *seen = malloc((size_t)n_keys * sizeof(*seen));

	if (!next || !seen) {
		free(next);
		free(seen);
		return NULL;
	}
	for (uint32_t i = 0; i < n_keys; i++)
		seen[i] = UINT32_MAX;
	for (size_t s = t->n_steps; s-- > 0;) {
		const struct es_trace_step *st = &t->steps[s];

		for (int j = 0; j < st->n; j++) {
			uint32_t key = (uint32_t)st->layer *
				(uint32_t)t->n_experts + t->ids[st->first + j];

			next[st->first + j] = seen[key];
		}
		for (int j = 0; j < st->n; j++)
			seen[(uint32_t)st->layer * (uint32_t)t->n_experts +
			     t->ids[st->first + j]] = (uint32_t)s;
	}
	free(seen);
	return next;
}

/* For each step, the index of the same token's step at the next layer
 * (trace order), or -1. */
static int32_t *build_next_layer(const struct es_trace *t)
{
	int32_t *nx = malloc(t->n_steps * sizeof(*nx));
	size_t *tok_last = NULL;

	if (!nx)
		goto fail;
	/* tokens are dense from 0: remember each token's latest step */
	tok_last = malloc((size_t)t->n_tokens * sizeof(*tok_last));
	if (!tok_last)
		goto fail;
	for (uint32_t i = 0; i < t->n_tokens; i++)
		tok_last[i] = SIZE_MAX;
	for (size_t s = 0; s < t->n_steps; s++) {
		uint32_t tk = t->steps[s].token;

		nx[s] = -1;
		if (tok_last[tk] != SIZE_MAX &&
		    t->steps[tok_last[tk]].layer < t->steps[s].layer)
			nx[tok_last[tk]] = (int32_t)s;
		tok_last[tk] = s;
	}
	free(tok_last);
	return nx;
fail:
	free(nx);
	free(tok_last);
	return NULL;
}

/* Draft prefetch at the end of step i: loads the experts the draft shows
 * for the next token at this step's layer (a load each, as for la-*; no
 * room without evicting a pinned or awaiting key: dropped). */
static int draft_prefetch(struct sim *s, size_t i, double tok)
{
	const struct es_trace *t = s->m.t;
	const struct es_trace_step *st = &t->steps[i];
	long x = es_rdraft_next_step(&s->dr, st->token, st->layer);
	int e = 0;

	if (x < 0)
		return 0;
	for (int j = 0; j < t->steps[x].n && !e; j++) {
		uint32_t key = (uint32_t)st->layer * (uint32_t)t->n_experts +
			t->ids[t->steps[x].first + j];

		if (s->resident[key])
			continue;
		e = load(s, key, i, 1);
		if (e == -ST_E_BUSY) {
			e = 0;
			continue;
		}
		if (e)
			break;
		s->st->prefetch_loads++;
		s->prefetched[key] = 1;
		if (s->n_pf_cur < s->cap_pf)
			s->pf_cur[s->n_pf_cur++] = key;
		s->pf_for[key] = st->token + 1;
		e = touch(s, key, i, t->steps[x].first + j, tok, 1);
	}
	return e;
}

/* At a token's first step: a draft prefetch made two tokens ago was for
 * the token that has just ended; if that token did not use it (a wrong or
 * late guess) its load has long landed and it becomes an ordinary resident
 * expert, no longer protected as loading (it is not counted as wasted: it
 * may still be used later). */
static void draft_prefetch_expire(struct sim *s, uint32_t token)
{
	uint32_t *tmp = s->pf_prev;

	for (uint32_t i = 0; i < s->n_pf_prev; i++) {
		uint32_t key = s->pf_prev[i];

		/* not if prefetched again since, for a later token */
		if (s->pf_for[key] < token)
			s->prefetched[key] = 0;
	}
	s->pf_prev = s->pf_cur;
	s->n_pf_prev = s->n_pf_cur;
	s->pf_cur = tmp;
	s->n_pf_cur = 0;
}

static void sim_free(struct sim *s)
{
	if (s->heaps)
		for (uint32_t p = 0; p < s->n_pools; p++)
			free(s->heaps[p].v);
	free(s->heaps);
	free(s->cap);
	free(s->count);
	free(s->resident);
	free(s->prefetched);
	free(s->ver);
	free(s->pin);
	free(s->vis);
	free(s->vis_dist);
	free(s->next_layer);
	free(s->m.k);
	free((void *)s->m.next_use);
	free(s->aside);
	free(s->pf_prev);
	free(s->pf_cur);
	free(s->pf_for);
	free(s->aside_ent);
	free(s->rlist);
	free(s->rpos);
	free(s->poff);
	es_rdraft_fini(&s->dr);
	es_rhist_fini(&s->m);
	es_r2q_fini(&s->m);
}

int es_replay_run(const struct es_trace *t, enum es_replay_policy p,
		  const struct es_replay_opts *o, struct es_replay_stats *ret,
		  struct st_diag *diag)
{
	struct sim s = { 0 };
	struct es_replay_opts oc = *o;
	int d = p == ES_RP_BELADY || p == ES_RP_FUTURE ? 0 : o->lookahead;
	int e = 0;
	uint32_t n_keys;

	memset(ret, 0, sizeof(*ret));
	if ((unsigned)p >= ES_RP_N_BASE)
		return st_diag_set(diag, -EINVAL, "unknown policy %d", (int)p);
	if (!t->n_steps || t->n_layers < 1 || t->n_experts < 1)
		return st_diag_set(diag, -EINVAL, "the trace has no steps");
	if (!o->n_slots)
		return st_diag_set(diag, -EINVAL, "a pool of 0 slots");
	if (o->draft_len && (p == ES_RP_BELADY || p == ES_RP_FUTURE ||
			     d > 0))
		return st_diag_set(diag, -EINVAL, "draft foresight goes with "
				   "an online policy without look-ahead");
	n_keys = (uint32_t)t->n_layers * (uint32_t)t->n_experts;
	if (oc.n_slots > n_keys)
		oc.n_slots = n_keys; /* more than every expert is pointless */
	o = &oc;
	s.m.t = t;
	s.m.p = p;
	s.m.n_keys = n_keys;
	s.o = o;
	s.st = ret;
	s.n_pools = o->per_layer ? (uint32_t)t->n_layers : 1;
	s.cap = calloc(s.n_pools, sizeof(*s.cap));
	s.count = calloc(s.n_pools, sizeof(*s.count));
	s.heaps = calloc(s.n_pools, sizeof(*s.heaps));
	s.resident = calloc(n_keys, 1);
	s.prefetched = calloc(n_keys, 1);
	s.ver = calloc(n_keys, sizeof(*s.ver));
	s.pin = calloc(n_keys, sizeof(*s.pin));
	s.vis = calloc(n_keys, sizeof(*s.vis));
	s.vis_dist = calloc(n_keys, 1);
	s.m.k = calloc(n_keys, sizeof(*s.m.k));
	s.aside = calloc(o->n_slots, sizeof(*s.aside));
	s.aside_ent = calloc(o->n_slots, sizeof(*s.aside_ent));
	if (!s.aside || !s.aside_ent || !s.cap || !s.count || !s.heaps ||
	    !s.resident || !s.prefetched || !s.ver || !s.pin || !s.vis ||
	    !s.vis_dist || !s.m.k) {
		e = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < n_keys; i++)
		s.m.k[i].crf = -INFINITY;
	ret->min_capacity = UINT32_MAX;
	for (uint32_t i = 0; i < s.n_pools; i++) {
		s.cap[i] = o->n_slots / s.n_pools +
			(i < o->n_slots % s.n_pools ? 1 : 0);
		if (s.cap[i] < ret->min_capacity)
			ret->min_capacity = s.cap[i];
	}
	if (ret->min_capacity < (uint32_t)t->top_k) {
		e = st_diag_set(diag, -ST_E_BUDGET,
				"%u slots %s give a pool of %u experts, fewer "
				"than the trace's top-%d that one step needs "
				"at once; use at least %u slots",
				o->n_slots, o->per_layer ? "split over the "
				"layers" : "in one pool", ret->min_capacity,
				t->top_k, (uint32_t)t->top_k * s.n_pools);
		goto out;
	}
	if (p == ES_RP_2Q && es_r2q_init(&s.m, s.n_pools, s.cap) < 0) {
		e = -ENOMEM;
		goto out;
	}
	if (o->draft_len) {
		e = es_rdraft_init(&s.dr, t, o, n_keys, diag);
		if (e < 0)
			goto out;
		s.draft = 1;
		if (o->draft_prefetch) {
			/* one token's prefetches: at most one step's
			 * experts per layer */
			s.cap_pf = (uint32_t)t->n_layers *
				(uint32_t)t->top_k;
			s.pf_prev = calloc(s.cap_pf, sizeof(*s.pf_prev));
			s.pf_cur = calloc(s.cap_pf, sizeof(*s.pf_cur));
			s.pf_for = calloc(n_keys, sizeof(*s.pf_for));
			if (!s.pf_prev || !s.pf_cur || !s.pf_for) {
				e = -ENOMEM;
				goto out;
			}
		}
	}
	if (p == ES_RP_HIST || p == ES_RP_FUTURE || p == ES_RP_2Q || s.draft) {
		s.scan = 1;
		s.rlist = calloc(o->n_slots, sizeof(*s.rlist));
		s.rpos = calloc(n_keys, sizeof(*s.rpos));
		s.poff = calloc(s.n_pools, sizeof(*s.poff));
		if (!s.rlist || !s.rpos || !s.poff || es_rhist_init(&s.m) < 0) {
			e = -ENOMEM;
			goto out;
		}
		for (uint32_t i = 1; i < s.n_pools; i++)
			s.poff[i] = s.poff[i - 1] + s.cap[i - 1];
	}
	s.m.window_tokens = o->window_tokens;
	if (p == ES_RP_BELADY || p == ES_RP_FUTURE) {
		s.m.next_use = build_next_use(t, n_keys);
		if (!s.m.next_use) {
			e = -ENOMEM;
			goto out;
		}
	}
	if (d > 0) {
		s.next_layer = build_next_layer(t);
		if (!s.next_layer) {
			e = -ENOMEM;
			goto out;
		}
	}
	for (size_t i = 0; i < t->n_steps && !e; i++) {
		const struct es_trace_step *st = &t->steps[i];
		uint32_t base = (uint32_t)st->layer * (uint32_t)t->n_experts;
		double tok = (double)st->token +
			(double)st->layer / (double)t->n_layers;

		for (int j = 0; j < st->n; j++)
			s.pin[base + t->ids[st->first + j]] = (uint32_t)i + 1;
		if (s.draft && (i == 0 || st->token != st[-1].token)) {
			es_rdraft_token(&s.dr, st->token, ret);
			if (o->draft_prefetch)
				draft_prefetch_expire(&s, st->token);
		}
		if (p == ES_RP_HIST || p == ES_RP_FUTURE)
			es_rhist_visit(&s.m, st->layer, t->ids + st->first,
				       st->n);
		if (d > 0) {
			int32_t x = s.next_layer[i];

			for (int a = 1; a <= d && x >= 0; a++) {
				const struct es_trace_step *nt = &t->steps[x];

				for (int j = 0; j < nt->n; j++) {
					uint32_t key = (uint32_t)nt->layer *
						(uint32_t)t->n_experts +
						t->ids[nt->first + j];

					if (s.vis[key] != i + 1) {
						s.vis[key] = (uint32_t)i + 1;
						s.vis_dist[key] = (uint8_t)a;
					}
				}
				x = s.next_layer[x];
			}
		}
		for (int j = 0; j < st->n && !e; j++) {
			uint32_t key = base + t->ids[st->first + j];

			ret->accesses++;
			if (s.resident[key]) {
				ret->hits++;
				if (s.prefetched[key]) {
					ret->prefetch_used++;
					s.prefetched[key] = 0;
				}
			} else {
				ret->misses++;
				e = load(&s, key, i, 0);
			}
			if (!e)
				e = touch(&s, key, i, st->first + j, tok, 0);
		}
		if (d > 0 && o->prefetch && !e) {
			int32_t x = s.next_layer[i];

			for (int a = 1; a <= d && x >= 0 && !e; a++) {
				const struct es_trace_step *nt = &t->steps[x];

				for (int j = 0; j < nt->n && !e; j++) {
					uint32_t key = (uint32_t)nt->layer *
						(uint32_t)t->n_experts +
						t->ids[nt->first + j];

					if (s.resident[key])
						continue;
					e = load(&s, key, i, 1);
					if (e == -ST_E_BUSY) {
						e = 0; /* no room: skip */
						continue;
					}
					if (e)
						break;
					ret->prefetch_loads++;
					s.prefetched[key] = 1;
					e = touch(&s, key, i, nt->first + j,
						  tok, 1);
				}
				x = s.next_layer[x];
			}
		}
		if (s.draft && o->draft_prefetch && !e)
			e = draft_prefetch(&s, i, tok);
	}
	if (e == -ST_E_BUSY)
		st_diag_set(diag, e, "every slot of a pool is pinned by one "
			    "step; the pool is smaller than the top-k");
	else if (e == -ENOMEM)
		st_diag_set(diag, e, "out of memory in the replay");
out:
	sim_free(&s);
	return e;
}
