/*
 * es_devpool.c — expertd's device expert pool: import, staging copies,
 * device slot victims (es_devpool.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "es_daemon.h"
#include "es_devpool.h"
#include "st_devimporter.h"
#include "st_log.h"

struct es_dev_want {
	uint32_t ix;  /* es_pool_index of (layer, expert) */
	int client;
	uint32_t tries; /* ticks it waited (host slot not READY, device
			 * slots all pinned); dropped at ES_DEV_WANT_TRIES */
};

/* Wake-up period of the server loop while a device pool is imported (the
 * latency of a miss reported through the slot table's want ring). */
#define ES_DEV_POLL_MS 2

/* Server-loop turns a wanted expert may wait (about 1 ms each). */
#define ES_DEV_WANT_TRIES 2000

struct es_devpool {
	struct st_devimporter imp;
	int32_t *dev_of;                /* [n_layers * n_experts]: slot or -1 */
	uint32_t hand;                  /* clock over device slots */
	struct es_dev_want *want;       /* FIFO, demand first */
	uint32_t n_want;
	struct es_dev_want *flight;     /* host slots pinned by copies */
	uint32_t *flight_slot;
	uint32_t n_flight;
	uint64_t copies, copy_bytes, copy_errors;
};

static int dev_create(struct es_daemon *d, struct st_diag *diag)
{
	struct es_pool_view *v = &d->pool.v;
	size_t nk = (size_t)v->n_layers * v->n_experts, i;
	struct es_devpool *p = calloc(1, sizeof(*p));

	if (p) {
		p->dev_of = malloc(nk * sizeof(*p->dev_of));
		p->want = calloc(ES_DEV_WANT_MAX, sizeof(*p->want));
		p->flight = calloc(ES_DEV_WANT_MAX, sizeof(*p->flight));
		p->flight_slot = calloc(ES_DEV_WANT_MAX,
					sizeof(*p->flight_slot));
	}
	if (!p || !p->dev_of || !p->want || !p->flight || !p->flight_slot) {
		if (p) {
			free(p->dev_of);
			free(p->want);
			free(p->flight);
			free(p->flight_slot);
		}
		free(p);
		return st_diag_set(diag, -ENOMEM, "device pool: out of memory");
	}
	for (i = 0; i < nk; i++)
		p->dev_of[i] = -1;
	/* the host pool's records, registered as pinned at the first import;
	 * not a sparse pool (--memory-budget): pinning would fault in every
	 * slot, and a record whose pages are given back (MADV_REMOVE) would
	 * stay pinned in the driver, which would then copy the stale pages;
	 * its copies go through pageable memory (correct, slower) */
	st_devimporter_init(&p->imp, ST_DEVPOOL_EXPERTS, d->opt.instance,
			    d->pool.sparse ? NULL : v->data,
			    d->pool.sparse ? 0 :
			    (uint64_t)v->n_slots * v->record_bytes);
	d->dev = p;
	return 0;
}

static void forget_map(struct es_daemon *d)
{
	struct es_pool_view *v = &d->pool.v;
	size_t nk = (size_t)v->n_layers * v->n_experts, i;

	for (i = 0; i < nk; i++)
		d->dev->dev_of[i] = -1;
	d->dev->n_want = 0;
	d->dev->hand = 0;
}

/* Drops the host pins of finished copies (all, once the stream is idle). */
static void flights_done(struct es_daemon *d, int wait)
{
	struct es_devpool *p = d->dev;
	struct es_pool_view *v = &d->pool.v;
	struct st_diag diag = { "" };
	uint32_t i;

	if (!p->n_flight)
		return;
	if (p->imp.cu) {
		int r = wait ? st_cuda_import_drain(p->imp.cu, &diag) :
			       st_cuda_import_idle(p->imp.cu, &diag);

		if (r == 0 && !wait)
			return;
		if (r < 0) {
			p->copy_errors++;
			st_warn("device expert copies: %s", diag.msg);
		}
	}
	for (i = 0; i < p->n_flight; i++) {
		_Atomic uint32_t *pin =
			&v->slots[p->flight_slot[i]].pins[p->flight[i].client];
		uint32_t cur = atomic_load(pin);

		/* the client may have been reaped (pins zeroed) meanwhile */
		while (cur > 0 &&
		       !atomic_compare_exchange_weak(pin, &cur, cur - 1))
			;
	}
	p->n_flight = 0;
}

int es_devpool_handle(struct es_daemon *d, uint16_t type,
		      const uint8_t *payload, size_t len, struct st_wbuf *rep,
		      struct st_diag *diag)
{
	int r, reset = 0;

	if (!d->dev && (r = dev_create(d, diag)) < 0)
		return r;
	d->dev->imp.min_slot_bytes = d->pool.v.record_bytes;
	if (type == ST_MSG_DEV_REVOKE || type == ST_MSG_DEV_EXPORT)
		flights_done(d, 1); /* a close drains anyway: pins first */
	r = st_devimporter_handle(&d->dev->imp, type, payload, len, rep,
				  &reset, diag);
	if (reset)
		forget_map(d);
	return r;
}

void es_devpool_want(struct es_daemon *d, int c, uint32_t layer,
		     uint32_t expert, int prefetch)
{
	struct es_devpool *p = d->dev;
	struct es_pool_view *v = &d->pool.v;
	uint32_t ix, i;

	if (!p || !st_devimporter_active(&p->imp))
		return;
	ix = (uint32_t)es_pool_index(v, layer, expert);
	for (i = 0; i < p->n_want; i++)
		if (p->want[i].ix == ix)
			return;
	if (p->n_want == ES_DEV_WANT_MAX) {
		/* full: the oldest goes */
		memmove(p->want, p->want + 1,
			(ES_DEV_WANT_MAX - 1) * sizeof(*p->want));
		p->n_want--;
	}
	if (!prefetch) {
		/* demand before every queued hint */
		memmove(p->want + 1, p->want, p->n_want * sizeof(*p->want));
		p->want[0].ix = ix;
		p->want[0].client = c;
		p->want[0].tries = 0;
	} else {
		p->want[p->n_want].ix = ix;
		p->want[p->n_want].client = c;
		p->want[p->n_want].tries = 0;
	}
	p->n_want++;
}

/* Whether ix is already READY on the device. */
static int on_device(struct es_devpool *p, uint32_t ix, uint64_t key)
{
	int32_t ds = p->dev_of[ix];

	return ds >= 0 &&
	       atomic_load(&p->imp.tab->slot[ds].key) == key &&
	       atomic_load(&p->imp.tab->slot[ds].state) == ST_DEVSLOT_READY;
}

/* Claims a device slot for key by the clock; -1 when every slot is pinned
 * or busy. */
static int32_t claim_slot(struct es_daemon *d, uint64_t key)
{
	struct es_devpool *p = d->dev;
	struct st_devslot_table *t = p->imp.tab;
	uint32_t n = t->n_slots, i;

	for (i = 0; i < n; i++) {
		uint32_t ds = (p->hand + i) % n;
		uint64_t old = atomic_load(&t->slot[ds].key);

		if (!st_devslot_claim(t, ds, key))
			continue;
		/* the slot's previous expert is no longer on the device */
		if (old && ((old - 1) >> 32) < d->pool.v.n_layers &&
		    (uint32_t)(old - 1) < d->pool.v.n_experts) {
			uint32_t oix = (uint32_t)(((old - 1) >> 32) *
						  d->pool.v.n_experts +
						  (uint32_t)(old - 1));

			if (p->dev_of[oix] == (int32_t)ds)
				p->dev_of[oix] = -1;
		}
		p->hand = (ds + 1) % n;
		return (int32_t)ds;
	}
	return -1;
}

/* Starts the copy of want w; 1 started or nothing to do (drop it), 0
 * not yet (host slot not READY, device full: keep it), < 0 error (drop). */
static int stage(struct es_daemon *d, const struct es_dev_want *w)
{
	struct es_devpool *p = d->dev;
	struct es_pool_view *v = &d->pool.v;
	uint32_t layer = w->ix / v->n_experts, expert = w->ix % v->n_experts;
	uint64_t key = st_devkey(layer, expert);
	struct st_diag diag = { "" };
	uint32_t gen, ev;
	int32_t hs, ds;
	int r;

	if (on_device(p, w->ix, key))
		return 1;
	if (p->n_flight == ES_DEV_WANT_MAX || !st_devimporter_host_ready(&p->imp))
		return 0; /* kept: the host pool is still being pinned */
	/* pin the host record for the copy (es_pool.h pin protocol) */
	hs = es_pool_try_pin(v, w->client, layer, expert, &gen);
	if (hs < 0)
		return 0;
	ds = claim_slot(d, key);
	if (ds < 0) {
		es_pin_drop(&v->slots[hs].pins[w->client]);
		return 0;
	}
	ev = (uint32_t)ds % p->imp.n_events;
	r = st_cuda_import_h2d(p->imp.cu, (uint64_t)ds * p->imp.slot_bytes,
			       es_pool_record(v, (uint32_t)hs),
			       v->record_bytes, ev, &diag);
	if (r < 0) {
		st_devslot_abort(p->imp.tab, (uint32_t)ds);
		es_pin_drop(&v->slots[hs].pins[w->client]);
		p->copy_errors++;
		st_warn("device copy of layer %u expert %u: %s", layer, expert,
			diag.msg);
		return r;
	}
	st_devslot_publish(p->imp.tab, (uint32_t)ds, ev);
	p->dev_of[w->ix] = ds;
	p->flight[p->n_flight] = *w;
	p->flight_slot[p->n_flight++] = (uint32_t)hs;
	p->copies++;
	p->copy_bytes += v->record_bytes;
	return 1;
}

/* The client table entry of the exporter (computed), whose pins hold
 * host records during copies; -1 when it has none. */
static int exporter_client(struct es_daemon *d)
{
	int32_t pid = d->dev->imp.st.exporter_pid;

	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		if (pid && atomic_load(&d->pool.v.clients[c].pid) == pid)
			return c;
	return -1;
}

/* Keys computed found missing (the table's want ring), validated. */
static void want_misses(struct es_daemon *d)
{
	struct es_pool_view *v = &d->pool.v;
	uint64_t key;
	int c = -1, n = 0;

	while (n++ < ST_DEVSLOT_WANT_RING &&
	       st_devslot_want_pop(d->dev->imp.tab, &key)) {
		uint64_t k = key - 1;

		if (!key || (k >> 32) >= v->n_layers ||
		    (uint32_t)k >= v->n_experts)
			continue; /* not an expert of this store */
		if (c < 0 && (c = exporter_client(d)) < 0)
			return;
		es_devpool_want(d, c, (uint32_t)(k >> 32), (uint32_t)k, 0);
	}
}

int es_devpool_tick(struct es_daemon *d)
{
	struct es_devpool *p = d->dev;
	uint32_t i, keep = 0;

	if (!p)
		return -1;
	if (st_devimporter_tick(&p->imp)) {
		flights_done(d, 1);
		forget_map(d);
	}
	flights_done(d, 0);
	if (!st_devimporter_active(&p->imp))
		return -1;
	want_misses(d);
	for (i = 0; i < p->n_want; i++) {
		int r = stage(d, &p->want[i]);

		/* not yet: keep it a while (a load in flight), not forever
		 * (evicted from the host pool, device slots all pinned) */
		if (r == 0 && ++p->want[i].tries < ES_DEV_WANT_TRIES)
			p->want[keep++] = p->want[i];
	}
	p->n_want = keep;
	/* while a pool is imported, look at computed's miss ring often: a
	 * client served by the host pool's fast path sends no message that
	 * would wake this loop */
	return p->n_want || p->n_flight ? 1 : ES_DEV_POLL_MS;
}

void es_devpool_fini(struct es_daemon *d, int destroy_table)
{
	struct es_devpool *p = d->dev;

	if (!p)
		return;
	flights_done(d, 1);
	st_devimporter_fini(&p->imp, destroy_table);
	free(p->dev_of);
	free(p->want);
	free(p->flight);
	free(p->flight_slot);
	free(p);
	d->dev = NULL;
}
