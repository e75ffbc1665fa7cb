/*
 * kv_truncate.c — cutting a sequence back to fewer rows (issue 22:
 * speculative decoding writes the rows of draft tokens, and the rows of
 * rejected drafts are rolled back).  The sequence's n_rows becomes the new
 * length and every page past its last row is given back, so nothing of a
 * rejected token stays allocated; rows past the length in the kept partial
 * last page are garbage the next reservation's writes replace.  A
 * windowed stream frees the pages before n - W when the sequence grows
 * from n rows, so a cut is possible only while the pages of the last W
 * rows before the new length are still there: a cut back to at least the
 * length before the last growth (what a verified draft step does) always
 * is.
 */
#include <errno.h>

#include "kv_daemon.h"

/* A page published to the prefix cache (keyed or in a group). */
static int page_published(const struct kv_pool *p, uint32_t page)
{
	return page < p->lay.n_pages &&
	       (p->cache.page_group[page] != UINT32_MAX ||
		atomic_load(&p->pages[page].key) != 0);
}

int kv_seq_truncate(struct kv_pool *p, uint32_t client, uint32_t seq,
		    uint32_t n_rows, struct st_diag *diag)
{
	const uint32_t B = p->lay.page_rows;
	int idx = kv_seq_lookup(p, seq);
	uint32_t have, keep, rows;
	int r;

	if (idx < 0)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "truncate: sequence 0x%x is unknown or was "
				   "freed", seq);
	if (p->seqs[idx].owner_client != client)
		return st_diag_set(diag, -EPERM,
				   "truncate: sequence 0x%x belongs to another "
				   "client", seq);
	if (atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED)
		return st_diag_set(diag, -ST_E_CHECKSUM,
				   "truncate: sequence 0x%x failed earlier (a "
				   "spilled page of it was lost)", seq);
	rows = atomic_load(&p->seqs[idx].n_rows);
	if (n_rows > rows)
		return st_diag_set(diag, -ST_E_LIMIT,
				   "truncate: sequence 0x%x holds %u rows, "
				   "fewer than %u", seq, rows, n_rows);
	if (n_rows == rows)
		return 0;
	/* a sliding window freed pages as the sequence grew: the window
	 * of the shorter sequence must still be there */
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = kv_window_dead_pages(&p->streams[s], B,
							n_rows);
		     p->streams[s].window_rows &&
		     pi < kv_pages_for_rows(n_rows, B); pi++)
			if (kv_table_get(p, (uint32_t)idx, s, pi) ==
			    KV_PAGE_NONE)
				return st_diag_set(
					diag, -ST_E_LIMIT,
					"truncate: sequence 0x%x to %u rows: "
					"stream %u keeps a window of %u rows "
					"and the rows of page %u were freed "
					"as it grew; cut back at most to its "
					"length before its last growth", seq,
					n_rows, s, p->streams[s].window_rows,
					pi);
	have = kv_pages_for_rows(rows, B);
	keep = kv_pages_for_rows(n_rows, B);
	/* rows past n_rows must not be in the prefix cache: the pages
	 * from the one holding row n_rows on */
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = n_rows / B; pi < have; pi++)
			if (page_published(p, kv_table_get(p, (uint32_t)idx, s,
							  pi)))
				return st_diag_set(
					diag, -EPERM,
					"truncate: sequence 0x%x published "
					"rows at or past %u (page %u of "
					"stream %u); a published row cannot "
					"be rolled back", seq, n_rows, pi, s);
	kv_seq_touch(p, (uint32_t)idx);
	/* spilled pages past the cut would keep their slots: restore the
	 * sequence first (a computing sequence is pinned, so resident) */
	if (p->seqs[idx].n_spilled) {
		r = kv_seq_restore_idx(p, (uint32_t)idx, kv_mark_begin(p),
				       diag);
		if (r < 0)
			return r;
	}
	/* n_rows first: a kvd killed before the pages below are given back
	 * adopts the pool with the entries past n_rows dropped and the
	 * reference counts recounted (kv_pool_adopt) */
	atomic_store_explicit(&p->seqs[idx].n_rows, n_rows,
			      memory_order_release);
	for (uint32_t s = 0; s < p->lay.n_streams; s++)
		for (uint32_t pi = keep; pi < have; pi++) {
			uint32_t page = kv_table_get(p, (uint32_t)idx, s, pi);

			if (page == KV_PAGE_NONE)
				continue;
			kv_table_set(p, (uint32_t)idx, s, pi, KV_PAGE_NONE);
			if (page < p->lay.n_pages)
				kv_page_unref(p, page);
		}
	return 0;
}
