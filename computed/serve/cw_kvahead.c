/* cw_kvahead.c — KV page budget of a step and restores ahead; see
 * cw_kvahead.h. */
#include "cw_kvahead.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kv_client.h"
#include "st_log.h"
#include "st_util.h"

int cw_kvahead_init(struct cw_kvahead *a, struct kv_client *kv, int on,
		    int max_seqs)
{
	memset(a, 0, sizeof(*a));
	a->kv = kv;
	a->on = on;
	a->cap_pages = UINT64_MAX;
	a->cap_sent = max_seqs > 0 ? max_seqs : 1;
	a->sent = calloc((size_t)a->cap_sent, sizeof(*a->sent));
	return a->sent ? 0 : -ENOMEM;
}

void cw_kvahead_fini(struct cw_kvahead *a)
{
	free(a->sent);
	a->sent = NULL;
	a->n_sent = 0;
}

uint64_t cw_kvahead_cap(struct cw_kvahead *a)
{
	struct kv_stats st;
	uint64_t left, pages;

	if (!a->kv)
		return a->cap_pages;
	if (a->known && kv_client_reconnects(a->kv) == a->reconnects &&
	    (!a->shared || st_now_ns() < a->next_ns))
		return a->cap_pages;
	if (!a->known || kv_client_reconnects(a->kv) != a->reconnects) {
		a->n_sent = 0; /* a restarted kvd holds no list */
		a->pfx_sent = 0;
	}
	a->known = 0;
	a->cap_pages = UINT64_MAX;
	a->reconnects = kv_client_reconnects(a->kv);
	if (kv_client_stats(a->kv, &st) < 0 || st.n_pages == 0 ||
	    st.page_rows == 0 || st.n_streams == 0)
		return UINT64_MAX; /* not declared yet: ask again */
	a->known = 1;
	a->n_streams = st.n_streams;
	a->page_rows = st.page_rows;
	a->spill = st.spill_budget_bytes > 0;
	if (st.spill_budget_bytes == 0)
		return a->cap_pages; /* nothing ever leaves: no cap */
	pages = st.n_pages;
	a->shared = st.page_bytes &&
		    st.budget_bytes / st.page_bytes < st.n_pages;
	if (a->shared) {
		/* the share kvd's target allows now */
		pages = st.budget_bytes / st.page_bytes;
		a->next_ns = st_now_ns() + CW_KVAHEAD_SHARED_NS;
	}
	left = pages - kv_ahead_headroom_pages(pages, st.n_streams);
	if (left > pages)
		left = 0; /* a pool of a few pages */
	a->cap_pages = left / 2;
	return a->cap_pages;
}

uint64_t cw_kvahead_pages(const struct cw_kvahead *a, uint64_t n_rows)
{
	if (!a->page_rows)
		return 0;
	return (uint64_t)a->n_streams *
	       ((n_rows + a->page_rows - 1) / a->page_rows);
}

int cw_kvahead_room(struct cw_kvahead *a, uint64_t *ret_limit,
		    uint64_t *ret_used, uint64_t *ret_pool)
{
	struct kv_stats st;
	uint64_t limit;
	int r;

	(void)cw_kvahead_cap(a); /* geometry, spill budget */
	if (!a->kv || !a->known || a->spill)
		return 0;
	r = kv_client_stats(a->kv, &st);
	if (r < 0)
		return r;
	if (!st.n_pages || !st.page_bytes || st.spill_budget_bytes) {
		a->known = 0; /* a restarted kvd: read its geometry again */
		return 0;
	}
	limit = ST_MIN(st.n_pages, st.budget_bytes / st.page_bytes);
	*ret_limit = limit;
	*ret_used = st.pages_used;
	*ret_pool = st.n_pages;
	return 1;
}

int cw_kvahead_demand(struct cw_kvahead *a, uint64_t pages, uint32_t n_reqs,
		      uint64_t grow, struct st_diag *diag)
{
	uint64_t now = st_now_ns();
	int same, quiet, r;

	if (!a->kv || a->demand_off)
		return 0;
	if (!pages)
		n_reqs = 0;
	same = pages == a->demand_sent && n_reqs == a->demand_reqs;
	quiet = now - a->demand_ns < CW_KVAHEAD_DEMAND_NS;
	if (same && (grow == a->demand_grow || quiet) &&
	    (quiet || (!pages && !grow)))
		return 0;
	r = kv_client_demand(a->kv, pages, n_reqs, grow, diag);
	if (r == -ST_E_PROTO) {
		st_info("kvd does not take the KV demand of queued requests "
			"(%s); its share of a memory budget does not weigh "
			"it", diag->msg);
		a->demand_off = 1;
		return 0;
	}
	if (r < 0)
		return r;
	a->demand_sent = pages;
	a->demand_reqs = n_reqs;
	a->demand_grow = grow;
	a->demand_ns = now;
	return 0;
}

int cw_kvahead_ask(struct cw_kvahead *a, int n, const uint32_t *seqs,
		   struct st_diag *diag)
{
	int k = 0, r;

	if (!a->on || !a->kv || n <= 0 || n > a->cap_sent)
		return 0;
	if (n == a->n_sent && !memcmp(seqs, a->sent, sizeof(*seqs) * n))
		return 0;
	for (int i = 0; i < n; i++)
		k += kv_client_seq_resident(a->kv, seqs[i]) == 0;
	/* all of them: kvd keeps those already back from being spilled to
	 * make room for the others */
	r = kv_client_seq_restore_ahead(a->kv, n, seqs, NULL, diag);
	a->n_sent = 0;
	if (r < 0 && r != -ST_E_NOTFOUND && r != -ST_E_CHECKSUM)
		return r;
	/* kvd holds the list (a sequence unknown or failed is left out
	 * of it, the others kept) */
	memcpy(a->sent, seqs, sizeof(*seqs) * n);
	a->n_sent = n;
	return r < 0 ? r : k;
}

int cw_kvahead_ask_prefix(struct cw_kvahead *a, uint32_t n_chains,
			  const uint32_t *chain_len, const uint64_t *keys,
			  struct st_diag *diag)
{
	uint64_t h = 0, n_keys = 0;
	uint32_t spilled = 0;
	int r;

	if (!a->on || !a->kv || a->pfx_off)
		return 0;
	for (uint32_t i = 0; i < n_chains; i++)
		n_keys += chain_len[i];
	if (n_chains)
		h = (st_xxh3(chain_len, sizeof(*chain_len) * n_chains) ^
		     st_xxh3(keys, sizeof(*keys) * n_keys)) | 1;
	if (h == a->pfx_sent)
		return 0;
	r = kv_client_prefix_ahead(a->kv, n_chains, chain_len, keys,
				   &spilled, diag);
	if (r == -ST_E_PROTO) {
		st_info("kvd does not restore queued requests' prefixes ahead "
			"(%s); their admissions restore them", diag->msg);
		a->pfx_off = 1;
		return 0;
	}
	a->pfx_sent = r < 0 ? 0 : h;
	return r < 0 ? r : (int)spilled;
}
