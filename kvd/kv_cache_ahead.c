/*
 * kv_cache_ahead.c — restoring the cached prefixes of queued requests
 * ahead of their admission (KV_MSG_PREFIX_AHEAD, issue 24 item 1).
 *
 * computed's scheduler names, for the requests it will admit next, the
 * prefix-cache keys of their prompts (kv_prefix_keys, the keys a lookup
 * computes).  kvd restores the groups of those keys that were spilled,
 * between requests and after the sequences of the next step
 * (kv_ahead.c), and holds every group of the plan that is resident: one
 * reference per page, so that the lookup at admission maps it without
 * reading the spill file.  Unlike a restore ahead of a step, a prefix
 * restore never spills a sequence's page: the admission's time is not
 * known, the next step's sequences are.  It takes free pages and pages of
 * idle cached groups only and leaves the step's headroom available.
 * Holds go when the client's next plan leaves the key out, when the
 * client goes, and when kv_pool_make_room would otherwise fail.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_daemon.h"
#include "st_log.h"
#include "st_util.h"

/* Drops entry i's hold. */
static void release(struct kv_pool *p, uint32_t i)
{
	const uint32_t ns = p->lay.n_streams;
	struct kv_pfx_plan *pl = &p->pfx;

	if (pl->v[i].state != KV_PFX_HELD)
		return;
	for (uint32_t s = 0; s < ns; s++)
		kv_page_unref(p, pl->pages[(size_t)i * ns + s]);
	pl->v[i].state = KV_PFX_SKIPPED;
	pl->held_pages -= ns;
}

/* Marks the entries after i of the same chain skipped (not restored). */
static void skip_chain_rest(struct kv_pfx_plan *pl, uint32_t i)
{
	for (uint32_t j = i + 1; j < pl->n && !pl->v[j].first; j++)
		if (pl->v[j].state == KV_PFX_PENDING) {
			pl->v[j].state = KV_PFX_SKIPPED;
			pl->n_pending--;
		}
}

/* Removes the entries of client (holds already dropped), order kept. */
static void remove_client(struct kv_pfx_plan *pl, uint32_t ns,
			  uint32_t client)
{
	uint32_t k = 0;

	pl->n_pending = 0;
	for (uint32_t i = 0; i < pl->n; i++) {
		if (pl->v[i].client == client)
			continue;
		if (k != i) {
			pl->v[k] = pl->v[i];
			memcpy(pl->pages + (size_t)k * ns,
			       pl->pages + (size_t)i * ns,
			       sizeof(uint32_t) * ns);
		}
		pl->n_pending += pl->v[k].state == KV_PFX_PENDING;
		k++;
	}
	pl->n = k;
}

void kv_pfx_ahead_drop_client(struct kv_pool *p, uint32_t client)
{
	struct kv_pfx_plan *pl = &p->pfx;

	for (uint32_t i = 0; i < pl->n; i++)
		if (pl->v[i].client == client)
			release(p, i);
	remove_client(pl, p->lay.n_streams, client);
}

int kv_pfx_ahead_set(struct kv_pool *p, uint32_t client, uint32_t n_chains,
		     const uint32_t *chain_len, const uint64_t *keys,
		     uint32_t *ret_spilled, uint32_t *ret_held)
{
	const uint32_t ns = p->lay.n_streams;
	struct kv_pfx_plan *pl = &p->pfx;
	uint32_t n_keys = 0, old = pl->n, k = 0;

	*ret_spilled = *ret_held = 0;
	for (uint32_t c = 0; c < n_chains; c++)
		n_keys += chain_len[c];
	/* room for the old entries and the new ones side by side: the
	 * new ones take the old holds of their keys over */
	if (old + n_keys > pl->cap) {
		uint32_t cap = ST_MAX(old + n_keys, 2 * pl->cap);
		struct kv_pfx_entry *v = realloc(pl->v, sizeof(*v) * cap);
		uint32_t *pg;

		if (v)
			pl->v = v;
		pg = v ? realloc(pl->pages, sizeof(uint32_t) * cap * ns) :
			 NULL;
		if (!pg) {
			kv_pfx_ahead_drop_client(p, client);
			return -ENOMEM;
		}
		pl->pages = pg;
		pl->cap = cap;
	}
	for (uint32_t c = 0; c < n_chains; c++) {
		int broken = 0;

		for (uint32_t j = 0; j < chain_len[c]; j++, k++) {
			struct kv_pfx_entry *e = &pl->v[old + k];
			uint32_t *pages = pl->pages + (size_t)(old + k) * ns;
			int r = 0;

			*e = (struct kv_pfx_entry){ .key = keys[k],
						    .client = client,
						    .first = j == 0,
						    .state = KV_PFX_SKIPPED };
			if (broken)
				continue;
			/* held by the earlier plan: the hold moves here */
			for (uint32_t i = 0; i < old && !r; i++) {
				const uint32_t *held = pl->pages +
						       (size_t)i * ns;

				if (pl->v[i].client != client ||
				    pl->v[i].key != keys[k] ||
				    pl->v[i].state != KV_PFX_HELD)
					continue;
				memcpy(pages, held, sizeof(uint32_t) * ns);
				pl->v[i].state = KV_PFX_SKIPPED;
				pl->held_pages -= ns;
				r = 1;
			}
			if (!r)
				r = kv_cache_acquire(p, keys[k], pages);
			if (r == 1) {
				e->state = KV_PFX_HELD;
				pl->held_pages += ns;
				(*ret_held)++;
			} else if (r == 2) {
				e->state = KV_PFX_PENDING;
				(*ret_spilled)++;
			} else {
				broken = 1; /* a lookup stops here too */
			}
		}
	}
	/* the earlier plan's other holds go, then its entries */
	for (uint32_t i = 0; i < old; i++)
		if (pl->v[i].client == client)
			release(p, i);
	pl->n = old + n_keys;
	for (uint32_t i = 0; i < old; i++)
		if (pl->v[i].client == client)
			pl->v[i].client = UINT32_MAX; /* marks it for removal */
	remove_client(pl, ns, UINT32_MAX);
	return 0;
}

void kv_pfx_ahead_step(struct kv_pool *p, uint64_t head)
{
	const uint32_t ns = p->lay.n_streams;
	struct kv_pfx_plan *pl = &p->pfx;
	struct st_diag d = { "" };
	uint32_t q = 0, *pages;
	int r;

	while (q < pl->n && pl->v[q].state != KV_PFX_PENDING)
		q++;
	if (q == pl->n) {
		pl->n_pending = 0;
		return;
	}
	pages = pl->pages + (size_t)q * ns;
	pl->n_pending--;
	r = kv_cache_acquire(p, pl->v[q].key, pages);
	if (r == 2) {
		/* free pages and idle cached groups only, the headroom
		 * left over: never a sequence's page */
		if (kv_pool_avail_pages(p) < ns + head) {
			st_debug("prefix 0x%llx restored ahead given up: no "
				 "room without spilling a sequence",
				 (unsigned long long)pl->v[q].key);
			r = 0;
		} else if (kv_pool_free_pages(p) < ns &&
			   kv_pool_make_room(p, ns, 0, "restoring a queued "
					     "request's prefix ahead",
					     &d) < 0) {
			r = 0;
		} else {
			r = kv_cache_acquire_resident(p, pl->v[q].key, 0,
						      pages, &d);
			if (r == 1) {
				p->stats.pfx_ahead_groups++;
			} else if (r < 0) {
				st_debug("prefix 0x%llx restored ahead: %s",
					 (unsigned long long)pl->v[q].key,
					 d.msg);
			}
		}
	}
	if (r == 1) {
		pl->v[q].state = KV_PFX_HELD;
		pl->held_pages += ns;
	} else {
		/* gone, failed or no room: the lookup does the rest */
		pl->v[q].state = KV_PFX_SKIPPED;
		skip_chain_rest(pl, q);
	}
}

uint64_t kv_pfx_ahead_release_all(struct kv_pool *p)
{
	struct kv_pfx_plan *pl = &p->pfx;
	uint64_t before = pl->held_pages;

	for (uint32_t i = 0; i < pl->n; i++)
		if (pl->v[i].state == KV_PFX_HELD) {
			release(p, i);
			p->stats.pfx_released++;
		}
	return before - pl->held_pages;
}

void kv_pfx_ahead_fini(struct kv_pool *p)
{
	free(p->pfx.v);
	free(p->pfx.pages);
	memset(&p->pfx, 0, sizeof(p->pfx));
}
