/*
 * cw_kvahead.h — the scheduler's view of kvd's page budget when kvd may
 * spill (issue 24 item 1).
 *
 * With a spill file, the sequences a step pins must fit kvd's pool, and
 * the sequences of the next step must fit beside them so that kvd can
 * restore them while the step computes (kv_client_seq_restore_ahead).
 * cw_sched therefore caps the KV pages of one step at half of what kvd
 * leaves to steps (its pool less the headroom a restore ahead keeps free,
 * kv_client.h), rotates the running sequences through the steps, and, with
 * restore-ahead on, names the next step's sequences to kvd before it
 * evaluates the current one.  The cap is the same with restore-ahead off,
 * so that the two differ only in when pages come back.
 *
 * Without a spill file there is no step cap: cw_sched admits a queued
 * request only when kvd's pool holds its prompt and max_tokens beside
 * the running ones' (cw_kvahead_room), and names the waiting demand to
 * kvd (cw_kvahead_demand) for its share of a shared memory budget.
 *
 * Scheduler thread only.
 */
#ifndef CW_KVAHEAD_H
#define CW_KVAHEAD_H

#include <stdint.h>

#include "st_error.h"

struct kv_client;

struct cw_kvahead {
	struct kv_client *kv;      /* borrowed */
	int on;                    /* restore ahead (--kv-restore-ahead) */
	int known;                 /* kvd's geometry read (after DECLARE) */
	uint32_t reconnects;       /* kv_client_reconnects when read */
	uint64_t cap_pages;        /* KV pages of one step; UINT64_MAX: none */
	uint32_t n_streams, page_rows;
	uint32_t *sent;            /* the list kvd holds (cap_sent entries) */
	int n_sent, cap_sent;
	/* queued requests' prefixes (kv_client_prefix_ahead) */
	uint64_t pfx_sent;         /* hash of the plan kvd holds; 0: none */
	int pfx_off;               /* kvd predates PREFIX_AHEAD */
	/* under a shared memory budget (DESIGN.md 3d) kvd's share moves:
	 * the cap is read again every CW_KVAHEAD_SHARED_NS */
	int shared;
	uint64_t next_ns;
	/* admission by pages without spilling (cw_kvahead_room) and the
	 * demand waiting for them named to kvd (cw_kvahead_demand) */
	int spill;                 /* kvd has a spill budget */
	uint64_t demand_sent;      /* pages last named; 0: none */
	uint32_t demand_reqs;      /* requests last named */
	uint64_t demand_grow;      /* running requests' growth last named */
	uint64_t demand_ns;        /* when */
	int demand_off;            /* kvd predates KV_MSG_DEMAND */
};

#define CW_KVAHEAD_SHARED_NS 200000000ull
/* the demand is named to kvd at most this often while only the running
 * requests' growth changes, and again after it while not 0 (kvd forgets
 * a client's demand after KV_DEMAND_STALE_NS, kv_daemon.h) */
#define CW_KVAHEAD_DEMAND_NS 100000000ull

/* Sets a up over kv (borrowed; NULL: no kvd, no cap) for lists of at
 * most max_seqs sequences; on: restore ahead.  0 or -ENOMEM. */
int cw_kvahead_init(struct cw_kvahead *a, struct kv_client *kv, int on,
		    int max_seqs);

/* Frees what init allocated; a zeroed a is fine. */
void cw_kvahead_fini(struct cw_kvahead *a);

/*
 * KV pages one step may pin: (n_pages - n_pages / 8 - n_streams) / 2 of
 * kvd's pool (kv_client_seq_restore_ahead's headroom, then room for the
 * next step beside this one), or UINT64_MAX when kvd has no spill budget
 * (everything stays in the pool: no cap) or cannot tell.  Asks kvd (one
 * STATS) until it has a declared pool, then again only after the client
 * reconnected to a restarted kvd (whose budget may differ).  Under a
 * shared memory budget (kvd's STATS budget_bytes below its pool's pages:
 * the share its target allows) n_pages is that share, read again every
 * CW_KVAHEAD_SHARED_NS as the arbiter moves it.
 */
uint64_t cw_kvahead_cap(struct cw_kvahead *a);

/* KV pages of a sequence holding n_rows rows (tokens) in every stream:
 * n_streams x ceil(n_rows / page_rows).  0 before the geometry is known. */
uint64_t cw_kvahead_pages(const struct cw_kvahead *a, uint64_t n_rows);

/*
 * The admission budget when kvd never spills (issue 24: requests wait in
 * the queue instead of failing with "KV pool exhausted"): one STATS; on
 * success *ret_limit = the pages kvd's pool may hold now (n_pages, or
 * under a shared memory budget the share its target allows: STATS
 * budget_bytes / page_bytes), *ret_used = pages referenced by sequences
 * (idle cached pages are not: kvd evicts them for room) and *ret_pool =
 * the pool's pages (what the share may grow to), and returns 1.  Returns 0 when admission by pages does not apply (no kvd,
 * geometry unknown, kvd may spill: the spill path's cap governs), or a
 * negative code (kvd gone: the caller admits as before, kvd's own error
 * then speaks).
 */
int cw_kvahead_room(struct cw_kvahead *a, uint64_t *ret_limit,
		    uint64_t *ret_used, uint64_t *ret_pool);

/*
 * Names to kvd the KV pages n_reqs queued requests wait for (pages 0: none)
 * and the pages the running requests may still take (grow: their prompt
 * and max_tokens less what they hold), the demand kvd's share of a shared
 * memory budget weighs (KV_MSG_DEMAND: kv_budget_wait_gain; grow counts
 * as working set in its loss).  Sent when the waiting figures change, when
 * only grow does at most every CW_KVAHEAD_DEMAND_NS, and again after it
 * while not all 0; a no-op without kvd and from the first -ST_E_PROTO on
 * (a kvd that predates the message: logged once).  0, or a negative code
 * with diag (kvd gone: ignorable).
 */
int cw_kvahead_demand(struct cw_kvahead *a, uint64_t pages, uint32_t n_reqs,
		      uint64_t grow, struct st_diag *diag);

/*
 * Asks kvd to restore seqs[0..n) (n at most max_seqs) ahead of the step
 * that will run them (a no-op when off; replaces the earlier list): kvd
 * restores those with spilled pages and keeps those already back.  The
 * same list as the last one sent is not sent again (a request would wait
 * behind kvd's background restoring).  Returns the number that had spilled
 * pages when sent (0 when not sent), or a negative code with diag (kvd
 * gone; the step's pin will say it again, so the caller may ignore it).
 */
int cw_kvahead_ask(struct cw_kvahead *a, int n, const uint32_t *seqs,
		   struct st_diag *diag);

/*
 * Asks kvd to restore ahead, and hold, the prefix-cache chains of the
 * queued requests the scheduler will admit next (chain_len[0..n_chains),
 * keys from kv_client_prefix_keys; n_chains 0: none any more).  A no-op
 * when off, when the plan is the one kvd holds, and from the first
 * -ST_E_PROTO on (a kvd that predates the message: logged once).
 * Returns the groups kvd found spilled (0 when not sent), or a negative
 * code with diag (kvd gone: the admission's lookup restores them).
 */
int cw_kvahead_ask_prefix(struct cw_kvahead *a, uint32_t n_chains,
			  const uint32_t *chain_len, const uint64_t *keys,
			  struct st_diag *diag);

#endif
