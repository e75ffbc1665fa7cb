/*
 * cw_kvdev.c — computed's device KV pages: request, pin, wait, mark
 * written, release (cw_kvdev.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cw_kvdev.h"
#include "kv_client.h"
#include "kv_devpage.h"
#include "st_cuda.h"
#include "st_devimporter.h"
#include "st_devpool.h"
#include "st_log.h"
#include "st_shm.h"
#include "st_util.h"

struct cw_kvdev {
	struct kv_client *kv;
	struct cw_kvdev_pool pool;
	char instance[64];
	struct st_shm shm;
	struct st_devslot_table *tab; /* NULL: not attached */
	uint32_t tab_gen;             /* bumped on every attach */
	uint32_t outstanding;         /* steps not released */
	int hung;                     /* a step's stream never finished */
	struct cw_kvdev_stats st;
};

int cw_kvdev_open(struct cw_kvdev **ret, struct kv_client *kv,
		  const struct cw_kvdev_pool *pool, const char *instance,
		  struct st_diag *diag)
{
	struct cw_kvdev *k;

	*ret = NULL;
	if (!pool || !pool->x)
		return st_diag_set(diag, -ENODEV, "no device KV pool: "
				   "attention reads the host pages");
	k = calloc(1, sizeof(*k));
	if (!k)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	k->kv = kv;
	k->pool = *pool;
	snprintf(k->instance, sizeof(k->instance), "%s", instance);
	*ret = k;
	return 0;
}

/* Maps kvd's table when not mapped, or when the mapping is no longer the
 * live one (its owner died: a new kvd made a new segment) or is at
 * another epoch.  Only between steps (no pins outstanding). */
static int table_attach(struct cw_kvdev *k, struct st_diag *diag)
{
	int r;

	if (k->tab && st_pid_alive(atomic_load(&st_shm_hdr(&k->shm)->
						owner_pid)) &&
	    atomic_load(&k->tab->epoch) == k->pool.epoch)
		return 0;
	if (k->outstanding)
		return k->tab ? 0 : st_diag_set(diag, -ST_E_STALE,
						"device KV table not mapped");
	if (k->shm.base)
		st_shm_detach(&k->shm);
	k->tab = NULL;
	k->tab_gen++;
	r = st_shm_attach(&k->shm, k->instance, "devkv",
			  ST_DEVSLOT_SHM_VERSION, 0, diag);
	if (r < 0)
		return r;
	k->tab = (struct st_devslot_table *)((uint8_t *)k->shm.base +
					     ST_SHM_HEADER_BYTES);
	r = st_devslot_table_check(k->tab, k->shm.size - ST_SHM_HEADER_BYTES,
				   diag);
	if (r == 0 && atomic_load(&k->tab->epoch) != k->pool.epoch)
		r = st_diag_set(diag, -ST_E_STALE, "device KV table is at "
				"epoch %llu, the pool's is %llu",
				(unsigned long long)atomic_load(&k->tab->epoch),
				(unsigned long long)k->pool.epoch);
	if (r < 0) {
		st_shm_detach(&k->shm);
		k->tab = NULL;
	}
	return r;
}

static void step_free(struct cw_kvdev_step *st)
{
	free(st->pages);
	free(st->ptr);
	free(st->first);
	memset(st, 0, sizeof(*st));
}

int cw_kvdev_acquire(struct cw_kvdev *k, int n,
		     const struct kv_reserve_entry *e, void *stream,
		     struct cw_kvdev_step *st, struct st_diag *diag)
{
	uint8_t *base = st_cuda_export_base(k->pool.x);
	uint64_t want, epoch = 0;
	uint32_t np, i;
	int r;

	memset(st, 0, sizeof(*st));
	want = n > 0 ? kv_client_device_pages(k->kv, n, e) : 0;
	if (want > KV_DEVPAGE_MAX_PAGES)
		return st_diag_set(diag, -ST_E_LIMIT, "%llu device pages in "
				   "one step, at most %d",
				   (unsigned long long)want,
				   (int)KV_DEVPAGE_MAX_PAGES);
	st->n_seqs = n > 0 ? (uint32_t)n : 0;
	st->n_streams = 0;
	st->page_rows = kv_client_page_rows(k->kv);
	for (int s = 0; kv_client_row_bytes(k->kv, s); s++)
		st->n_streams++;
	st->pages = calloc(want ? want : 1, sizeof(*st->pages));
	st->ptr = calloc(want ? want : 1, sizeof(*st->ptr));
	st->first = calloc(st->n_seqs + 1, sizeof(*st->first));
	if (!st->pages || !st->ptr || !st->first) {
		step_free(st);
		return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	r = kv_client_seq_device(k->kv, n, e, &epoch, st->pages, want, diag);
	if (r == 0 && epoch != k->pool.epoch)
		r = st_diag_set(diag, -ST_E_STALE, "kvd placed the pages in "
				"device pool epoch %llu, ours is %llu",
				(unsigned long long)epoch,
				(unsigned long long)k->pool.epoch);
	if (r == 0)
		r = table_attach(k, diag);
	if (r < 0) {
		step_free(st);
		return r;
	}
	st->n_pages = (uint32_t)want;
	for (i = 0, np = 0; i < st->n_seqs; i++) {
		st->first[i] = np;
		np += st->n_streams *
		      ((e[i].n_rows + st->page_rows - 1) / st->page_rows);
	}
	st->first[st->n_seqs] = np;
	st->tab_gen = k->tab_gen;
	k->outstanding++;
	k->st.steps++;
	for (i = 0; i < st->n_pages; i++) {
		struct kv_devpage *d = &st->pages[i];
		uint32_t ev = 0;

		k->st.pages++;
		if (d->slot == KV_DEVPAGE_NO_SLOT)
			continue;
		if (d->slot >= k->pool.n_slots ||
		    !st_devslot_pin(k->tab, d->slot, d->key, k->pool.epoch,
				    &ev)) {
			/* taken back meanwhile (kvd reset): the host page */
			k->st.pin_misses++;
			d->slot = KV_DEVPAGE_NO_SLOT;
			continue;
		}
		if (ev >= k->pool.n_events ||
		    st_cuda_export_wait(k->pool.x, ev, stream, NULL) < 0) {
			st_devslot_unpin(k->tab, d->slot);
			k->st.pin_misses++;
			d->slot = KV_DEVPAGE_NO_SLOT;
			continue;
		}
		st->ptr[i] = base + (uint64_t)d->slot * k->pool.slot_bytes;
		st->on_device++;
	}
	k->st.on_device += st->on_device;
	return 0;
}

int cw_kvdev_rows(const struct cw_kvdev_step *st, uint32_t i, uint32_t s,
		  const struct kv_stream_decl *decl, uint32_t r0, uint32_t n,
		  const uint8_t **ret_rows)
{
	uint32_t np;

	if (i >= st->n_seqs || s >= st->n_streams || !decl ||
	    !decl->tokens_per_row || !st->page_rows)
		return -EINVAL;
	np = (st->first[i + 1] - st->first[i]) / st->n_streams;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t r = r0 + k;
		uint32_t p = kv_stream_row_page(decl, st->page_rows, r);
		const uint8_t *pg;

		if (r < r0 || p >= np)
			return -EINVAL;
		pg = st->ptr[cw_kvdev_index(st, i, s, p)];
		if (!pg)
			return -ENOENT;
		ret_rows[k] = pg + (uint64_t)kv_stream_row_slot(
				decl, st->page_rows, r) * decl->row_bytes;
	}
	return 0;
}

int cw_kvdev_mark_written(struct cw_kvdev *k, const struct cw_kvdev_step *st,
			  uint32_t idx, uint64_t lo, uint64_t hi)
{
	if (idx >= st->n_pages || !st->ptr[idx] || st->tab_gen != k->tab_gen ||
	    !k->tab || hi > k->pool.slot_bytes)
		return -EINVAL;
	/* a restarted kvd reset its table: the slot no longer stands for
	 * the page, and rows only on the device would never reach it */
	if (atomic_load(&k->tab->slot[st->pages[idx].slot].key) !=
	    st->pages[idx].key)
		return -ST_E_STALE;
	return st_devslot_dirty_mark(k->tab, st->pages[idx].slot, lo, hi);
}

void cw_kvdev_release(struct cw_kvdev *k, struct cw_kvdev_step *st,
		      void *stream)
{
	if (!st->pages)
		return;
	/* a stream that never finishes (issue 27: it waits on a copy event
	 * of a kvd that died mid-copy) may still read this step's pages:
	 * they stay pinned.  Later steps queue no reads on it (the device
	 * attention turned itself off), so their pages are unpinned without
	 * waiting again. */
	if (stream && !k->hung &&
	    st_cuda_stream_wait(stream, ST_CUDA_STREAM_TIMEOUT_MS, NULL) < 0) {
		k->hung = 1;
		st_warn("device KV pages: the attention stream did not "
			"finish; the step's %u pages stay pinned",
			st->n_pages);
	} else {
		/* pins of a table mapped before a re-attach died with it */
		for (uint32_t i = 0; i < st->n_pages; i++)
			if (st->ptr[i] && k->tab && st->tab_gen == k->tab_gen)
				st_devslot_unpin(k->tab, st->pages[i].slot);
	}
	if (k->outstanding)
		k->outstanding--;
	step_free(st);
}

void cw_kvdev_stats(const struct cw_kvdev *k, struct cw_kvdev_stats *ret)
{
	*ret = k->st;
}

void cw_kvdev_close(struct cw_kvdev *k)
{
	if (!k)
		return;
	if (k->shm.base)
		st_shm_detach(&k->shm);
	free(k);
}
