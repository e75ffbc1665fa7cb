/*
 * cw_devpool.c — computed's device pools: allocation, export, leases,
 * device slot pins (cw_devpool.h).  Written against st_cuda.h, so a build
 * without CUDA compiles it and cw_devpool_open says "no CUDA".
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cw_backend.h"
#include "cw_devpool.h"
#include "cw_kvdev.h"
#include "st_cuda.h"
#include "st_daemon.h"
#include "st_devimporter.h"
#include "st_devpool.h"
#include "st_log.h"
#include "st_msg.h"
#include "st_util.h"

struct pool_one {
	uint32_t kind;
	const char *daemon;           /* "expertd", "kvd" */
	struct st_cuda_export *x;     /* NULL: not allocated */
	struct st_devpool_export e;   /* as sent (events point into x) */
	int32_t importer_pid;         /* from the last reply, 0: none */
	int lease;                    /* entry in leases, -1: none */
	struct st_sock sock;
	int sock_open;
	uint64_t next_try_ns;
};

/* An expert cw_devpool_fake_fn queued until cw_devpool_fake_sync. */
struct fake_job {
	uint32_t slot;
	struct cw_wview dv[3];      /* views into the (host) device slot */
	int n;
	const float **x;            /* [n] token rows, then [n] outputs */
	float **out;
};

struct cw_devpool {
	pthread_mutex_t mu;
	struct cw_devpool_geom g;
	char run_dir[4096], instance[64];
	int timeout_ms;
	uint64_t request_id;
	struct st_devlease_table leases;
	struct pool_one pool[2];      /* [0] experts, [1] KV (optional) */
	int n_pool;
	struct st_shm tab_shm;
	struct st_devslot_table *tab;
	uint32_t tab_gen;             /* bumped on every re-attach */
	int32_t *guess;               /* [n_layers * n_experts] last slot */
	struct cw_devpool_stats st;
	/* the fake device's queue (forward-pass thread only) */
	struct fake_job *fjob;
	int n_fjob, cap_fjob;
	unsigned fail_every, n_fsync; /* STRATA_CUDA_FAKE_SYNC_FAIL */
};

int cw_devpool_slots(const struct cw_devpool_geom *g, const char *budget,
		     uint32_t *ret_n_slots, uint64_t *ret_slot_bytes,
		     struct st_diag *diag)
{
	uint64_t bytes = 0, slot, all = (uint64_t)g->n_layers * g->n_experts;
	uint64_t n;
	double pct = 0;

	if (!budget || st_parse_budget(budget, &bytes, &pct) < 0)
		return st_diag_set(diag, -EINVAL,
				   "--device-budget '%s': want a share of all "
				   "experts (\"25%%\") or bytes (\"8GiB\")",
				   budget ? budget : "");
	if (!g->record_bytes || !all)
		return st_diag_set(diag, -EINVAL, "device pool: empty model");
	slot = (g->record_bytes + ST_DEVPOOL_SLOT_ALIGN - 1) /
	       ST_DEVPOOL_SLOT_ALIGN * ST_DEVPOOL_SLOT_ALIGN;
	n = pct > 0 ? (uint64_t)(pct / 100.0 * (double)all + 0.5) :
		      bytes / slot;
	if (n > all)
		n = all;
	if (n < g->top_k || n == 0)
		return st_diag_set(diag, -ST_E_BUDGET,
				   "--device-budget %s gives %llu device "
				   "slots; one token needs top-k = %u (at "
				   "least %llu bytes)", budget,
				   (unsigned long long)n, g->top_k,
				   (unsigned long long)(g->top_k * slot));
	if (n > UINT32_MAX / 2)
		n = UINT32_MAX / 2;
	*ret_n_slots = (uint32_t)n;
	*ret_slot_bytes = slot;
	return 0;
}

/* Text of an error reply (u32 length + bytes), or a placeholder. */
static void reply_text(const uint8_t *p, size_t len, char *buf, size_t n)
{
	uint32_t k = 0;

	snprintf(buf, n, "(no message)");
	if (len < 4)
		return;
	memcpy(&k, p, 4); /* little-endian hosts only, like the rest */
	if (k > len - 4)
		k = (uint32_t)(len - 4);
	snprintf(buf, n, "%.*s", (int)k, (const char *)p + 4);
}

static void sock_drop(struct pool_one *o)
{
	if (o->sock_open)
		st_sock_close(&o->sock);
	o->sock_open = 0;
}

/* One request to o's daemon: 0 with the decoded reply, the importer's
 * error (diag), or a transport error (the socket is reopened next time). */
static int call(struct cw_devpool *p, struct pool_one *o, uint16_t type,
		const struct st_wbuf *w, struct st_devpool_rep *rep,
		struct st_diag *diag)
{
	char path[4200], text[600];
	const uint8_t *pl;
	size_t plen;
	void *buf = NULL;
	int r;

	if (!o->sock_open) {
		if (st_run_path(p->run_dir, o->daemon, "ctl", path,
				sizeof(path)) < 0)
			return st_diag_set(diag, -ENAMETOOLONG, "run dir too "
					   "long");
		r = st_sock_open(&o->sock, ST_SOCK_REQ, path, p->timeout_ms,
				 p->timeout_ms);
		if (r < 0)
			return st_diag_set(diag, r, "cannot connect to %s: %s",
					   path, st_strerror(r));
		o->sock_open = 1;
	}
	r = st_rpc_call(&o->sock, type, ++p->request_id, 0, w->data, w->len,
			&buf, &pl, &plen);
	if (r < 0 && !buf) {
		sock_drop(o);
		return st_diag_set(diag, r, "%s did not answer %s: %s",
				   o->daemon, st_proto_type_name(type),
				   st_strerror(r));
	}
	if (r < 0) {
		reply_text(pl, plen, text, sizeof(text));
		free(buf);
		return st_diag_set(diag, r, "%s refused %s: %s", o->daemon,
				   st_proto_type_name(type), text);
	}
	r = st_devpool_rep_decode(pl, plen, rep, diag);
	free(buf);
	return r;
}

/* Re-maps the device slot table expertd keeps. */
static int table_attach(struct cw_devpool *p, struct st_diag *diag)
{
	int r;

	/* a restarted expertd that adopted the segment and imported our
	 * epoch again keeps the table (and our pins in it): keep the
	 * mapping, so pins taken before stay balanced */
	if (p->tab && p->tab->magic == ST_DEVSLOT_TABLE_MAGIC &&
	    atomic_load(&p->tab->epoch) == p->pool[0].e.epoch)
		return 0;
	if (p->tab_shm.base)
		st_shm_detach(&p->tab_shm);
	p->tab = NULL;
	p->tab_gen++;
	r = st_shm_attach(&p->tab_shm, p->instance, "devexperts",
			  ST_DEVSLOT_SHM_VERSION, 0, diag);
	if (r < 0)
		return r;
	p->tab = (struct st_devslot_table *)((uint8_t *)p->tab_shm.base +
					     ST_SHM_HEADER_BYTES);
	r = st_devslot_table_check(p->tab, p->tab_shm.size -
				   ST_SHM_HEADER_BYTES, diag);
	if (r == 0 && atomic_load(&p->tab->epoch) != p->pool[0].e.epoch)
		r = st_diag_set(diag, -ST_E_STALE, "device slot table is at "
				"another epoch than the export");
	if (r < 0) {
		st_shm_detach(&p->tab_shm);
		p->tab = NULL;
	}
	return r;
}

/* Sends o's EXPORT (lease offered first, held once answered). */
static int export_one(struct cw_devpool *p, struct pool_one *o,
		      struct st_diag *diag)
{
	struct st_devpool_rep rep;
	struct st_wbuf w;
	uint64_t t0;
	int r, idx;

	if (o->lease < 0) {
		idx = st_devlease_offer(&p->leases, o->kind, o->e.epoch);
		if (idx < 0)
			return st_diag_set(diag, idx, "device pool: too many "
					   "leases outstanding");
		o->lease = idx;
	}
	st_wbuf_init(&w);
	st_devpool_export_encode(&w, &o->e);
	t0 = st_now_ns();
	r = w.err ? w.err : call(p, o, ST_MSG_DEV_EXPORT, &w, &rep, diag);
	st_wbuf_fini(&w);
	if (r < 0) {
		if (r != -ST_E_TIMEOUT && r != -ST_E_NOMSG && r != -ENOENT &&
		    r != -ECONNREFUSED) {
			/* an answered refusal: the importer closed what it
			 * may have opened */
			st_devlease_released(&p->leases, o->kind, o->e.epoch,
					     0);
			o->lease = -1;
		}
		return r;
	}
	if (rep.epoch != o->e.epoch)
		return st_diag_set(diag, -ST_E_PROTO, "%s answered the export "
				   "of epoch %llu with epoch %llu", o->daemon,
				   (unsigned long long)o->e.epoch,
				   (unsigned long long)rep.epoch);
	st_devlease_held(&p->leases, o->lease, (int32_t)rep.importer_pid,
			 o->e.epoch);
	o->importer_pid = (int32_t)rep.importer_pid;
	p->st.exports++;
	st_info("device %s pool exported to %s (pid %u): epoch %llu, %u "
		"slots of %llu bytes, %u events, %u handles open there; "
		"answered in %.1f ms", st_devpool_kind_name(o->kind), o->daemon,
		rep.importer_pid, (unsigned long long)o->e.epoch,
		o->e.n_slots, (unsigned long long)o->e.slot_bytes,
		o->e.n_events, rep.handles_open,
		(double)(st_now_ns() - t0) / 1e6);
	return 0;
}

static int alloc_one(struct cw_devpool *p, struct pool_one *o, uint32_t kind,
		     const char *daemon, uint32_t n_slots, uint64_t slot_bytes,
		     struct st_diag *diag)
{
	uint32_t n_events = n_slots < ST_DEVPOOL_EVENT_LANES ?
				    n_slots : ST_DEVPOOL_EVENT_LANES;
	int r;

	memset(o, 0, sizeof(*o));
	o->kind = kind;
	o->daemon = daemon;
	o->lease = -1;
	r = st_cuda_export_create(&o->x, (uint64_t)n_slots * slot_bytes,
				  n_events, diag);
	if (r < 0)
		return r;
	r = st_cuda_export_describe(o->x, &o->e, diag);
	if (r < 0)
		return r;
	o->e.pid = (uint32_t)getpid();
	o->e.kind = kind;
	o->e.epoch = st_devpool_epoch_new();
	o->e.slot_bytes = slot_bytes;
	o->e.n_slots = n_slots;
	p->n_pool++;
	return 0;
}

static void close_one(struct cw_devpool *p, struct pool_one *o,
		      int timeout_ms);

int cw_devpool_open(struct cw_devpool **ret, const struct cw_devpool_geom *g,
		    const struct cw_devpool_opts *o, struct st_diag *diag)
{
	struct cw_devpool *p;
	char reason[300], b1[32];
	uint64_t slot_bytes, kv_bytes = 256ull << 20, fr = 0, tot = 0;
	uint32_t n_slots;
	size_t nk = (size_t)g->n_layers * g->n_experts, i;
	int r;

	*ret = NULL;
	r = cw_devpool_slots(g, o->budget, &n_slots, &slot_bytes, diag);
	if (r < 0)
		return r;
	if (o->kv_budget && st_parse_size(o->kv_budget, &kv_bytes) < 0)
		return st_diag_set(diag, -EINVAL, "--device-kv-budget '%s': "
				   "want bytes (\"1GiB\", 0 = none)",
				   o->kv_budget);
	if (st_cuda_device_count(reason, sizeof(reason)) == 0)
		return st_diag_set(diag, -ST_E_UNSUPPORTED, "no CUDA device: "
				   "%s", reason);
	if (st_cuda_mem_info(&fr, &tot, NULL) == 0 &&
	    (uint64_t)n_slots * slot_bytes > fr)
		return st_diag_set(diag, -ST_E_BUDGET, "--device-budget %s "
				   "needs %s of device memory, %s free",
				   o->budget, st_format_bytes((uint64_t)n_slots *
				   slot_bytes, b1, sizeof(b1)),
				   st_format_bytes(fr, reason, 32));
	p = calloc(1, sizeof(*p));
	if (p)
		p->guess = malloc(nk * sizeof(*p->guess));
	if (!p || !p->guess) {
		if (p)
			free(p->guess);
		free(p);
		return st_diag_set(diag, -ENOMEM, "out of memory");
	}
	for (i = 0; i < nk; i++)
		p->guess[i] = -1;
	if (st_cuda_is_fake() && getenv("STRATA_CUDA_FAKE_SYNC_FAIL"))
		p->fail_every = (unsigned)strtoul(
			getenv("STRATA_CUDA_FAKE_SYNC_FAIL"), NULL, 10);
	pthread_mutex_init(&p->mu, NULL);
	p->g = *g;
	snprintf(p->run_dir, sizeof(p->run_dir), "%s", o->run_dir);
	snprintf(p->instance, sizeof(p->instance), "%s", o->instance);
	p->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
	r = alloc_one(p, &p->pool[0], ST_DEVPOOL_EXPERTS, "expertd", n_slots,
		      slot_bytes, diag);
	if (r == 0)
		r = export_one(p, &p->pool[0], diag);
	if (r == 0)
		r = table_attach(p, diag);
	if (r == 0 && g->kv_page_bytes && kv_bytes >= g->kv_page_bytes) {
		uint64_t pb = (g->kv_page_bytes + ST_DEVPOOL_SLOT_ALIGN - 1) /
			      ST_DEVPOOL_SLOT_ALIGN * ST_DEVPOOL_SLOT_ALIGN;
		uint64_t np = kv_bytes / pb;
		struct st_diag kd = { "" };
		int rk;

		rk = alloc_one(p, &p->pool[1], ST_DEVPOOL_KV, "kvd",
			       (uint32_t)(np > UINT32_MAX / 2 ? UINT32_MAX / 2 :
					  np), pb, &kd);
		if (rk == 0)
			rk = export_one(p, &p->pool[1], &kd);
		if (rk < 0) {
			/* attention then reads the host rows (cw_model.c):
			 * the expert pool alone is worth having */
			st_warn("device KV pool not used: %s", kd.msg);
			close_one(p, &p->pool[1], p->timeout_ms);
		}
	}
	if (r < 0) {
		cw_devpool_close(p, p->timeout_ms);
		return r;
	}
	p->st.n_slots = n_slots;
	p->st.slot_bytes = slot_bytes;
	p->st.epoch = p->pool[0].e.epoch;
	p->st.kv_pages = p->pool[1].x ? p->pool[1].e.n_slots : 0;
	*ret = p;
	return 0;
}

int cw_devpool_check(struct cw_devpool *p, struct st_diag *diag)
{
	uint64_t now = st_now_ns();
	int i, r = 0;

	if (!p)
		return 0;
	/* Only this (main) thread touches the sockets, leases and exports;
	 * the forward pass only pins and unpins, under p->mu, which is not
	 * held across the requests below (a slow expertd must not stall the
	 * step: its pins keep using the current table mapping). */
	for (i = 0; i < 2; i++) {
		struct pool_one *o = &p->pool[i];
		int rr;

		if (!o->x || (o->importer_pid && st_pid_alive(o->importer_pid)))
			continue;
		if (now < o->next_try_ns)
			continue;
		/* the importer died: its mappings died with it */
		if (o->lease >= 0 &&
		    st_devlease_may_free(&p->leases, o->kind, o->e.epoch, 0,
					 NULL, NULL))
			o->lease = -1;
		o->importer_pid = 0;
		sock_drop(o);
		rr = export_one(p, o, diag);
		if (rr == 0 && o->kind == ST_DEVPOOL_EXPERTS) {
			pthread_mutex_lock(&p->mu);
			rr = table_attach(p, diag);
			p->st.reexports++;
			memset(p->guess, 0xff, (size_t)p->g.n_layers *
			       p->g.n_experts * sizeof(*p->guess));
			pthread_mutex_unlock(&p->mu);
		}
		if (rr < 0) {
			o->importer_pid = 0; /* try again */
			o->next_try_ns = now + 1000000000ull;
			r = rr;
		}
	}
	return r;
}

int cw_devpool_pin(struct cw_devpool *p, uint32_t layer, uint32_t expert,
		   void *stream, const void **ret_ptr, uint32_t *ret_slot)
{
	uint64_t key = st_devkey(layer, expert);
	size_t ix = (size_t)layer * p->g.n_experts + expert;
	struct st_devslot_table *t;
	uint32_t ev = 0, s, n;
	int32_t gs;
	int found = 0;

	if (layer >= p->g.n_layers || expert >= p->g.n_experts)
		return 0;
	pthread_mutex_lock(&p->mu);
	t = p->tab;
	if (!t) {
		pthread_mutex_unlock(&p->mu);
		return 0;
	}
	n = t->n_slots < p->pool[0].e.n_slots ? t->n_slots :
						 p->pool[0].e.n_slots;
	gs = p->guess[ix];
	if (gs >= 0 && (uint32_t)gs < n &&
	    st_devslot_pin(t, (uint32_t)gs, key, p->pool[0].e.epoch, &ev)) {
		s = (uint32_t)gs;
		found = 1;
	}
	for (s = found ? s : 0; !found && s < n; s++)
		if (atomic_load(&t->slot[s].key) == key &&
		    st_devslot_pin(t, s, key, p->pool[0].e.epoch, &ev)) {
			found = 1;
			break;
		}
	if (!found) {
		/* ask expertd for it (no message): the next use may hit */
		st_devslot_want_push(t, key);
		p->st.misses++;
		pthread_mutex_unlock(&p->mu);
		return 0;
	}
	p->guess[ix] = (int32_t)s;
	if (ev >= p->pool[0].e.n_events ||
	    st_cuda_export_wait(p->pool[0].x, ev, stream, NULL) < 0) {
		st_devslot_unpin(t, s);
		p->st.misses++;
		pthread_mutex_unlock(&p->mu);
		return 0;
	}
	p->st.pins++;
	*ret_ptr = (const uint8_t *)st_cuda_export_base(p->pool[0].x) +
		   (uint64_t)s * p->pool[0].e.slot_bytes;
	*ret_slot = ((p->tab_gen & 0xffu) << 24) | s;
	pthread_mutex_unlock(&p->mu);
	return 1;
}

void cw_devpool_unpin(struct cw_devpool *p, uint32_t slot)
{
	pthread_mutex_lock(&p->mu);
	/* a pin of a table mapped before a re-attach died with it */
	if (p->tab && (slot >> 24) == (p->tab_gen & 0xffu))
		st_devslot_unpin(p->tab, slot & 0xffffffu);
	pthread_mutex_unlock(&p->mu);
}

int cw_devpool_kv(struct cw_devpool *p, struct cw_kvdev_pool *ret)
{
	struct pool_one *o;

	if (!p || !p->pool[1].x)
		return -ENODEV;
	o = &p->pool[1];
	memset(ret, 0, sizeof(*ret));
	ret->x = o->x;
	ret->epoch = o->e.epoch;
	ret->n_slots = o->e.n_slots;
	ret->n_events = o->e.n_events;
	ret->slot_bytes = o->e.slot_bytes;
	return 0;
}

void cw_devpool_stats(struct cw_devpool *p, struct cw_devpool_stats *ret)
{
	pthread_mutex_lock(&p->mu);
	*ret = p->st;
	pthread_mutex_unlock(&p->mu);
}

/* Revokes o and frees it when the leases allow. */
static void close_one(struct cw_devpool *p, struct pool_one *o,
		      int timeout_ms)
{
	struct st_devpool_revoke rv = { (uint32_t)getpid(), o->kind,
					o->e.epoch };
	struct st_devpool_rep rep;
	struct st_diag diag = { "" };
	uint64_t end = st_now_ns() + (uint64_t)timeout_ms * 1000000ull;
	struct st_wbuf w;

	if (!o->x)
		return;
	if (st_devlease_count_held(&p->leases, o->kind, o->e.epoch)) {
		st_wbuf_init(&w);
		st_devpool_revoke_encode(&w, &rv);
		for (;;) {
			int r = call(p, o, ST_MSG_DEV_REVOKE, &w, &rep, &diag);

			if (r == 0) {
				st_devlease_released(&p->leases, o->kind,
						     o->e.epoch,
						     (int32_t)rep.importer_pid);
				break;
			}
			if (st_devlease_may_free(&p->leases, o->kind,
						 o->e.epoch, 0, NULL, NULL) ||
			    st_now_ns() >= end)
				break;
			st_sleep_ns(50000000);
		}
		st_wbuf_fini(&w);
	}
	if (st_devlease_may_free(&p->leases, o->kind, o->e.epoch, 0, NULL,
				 NULL)) {
		st_cuda_export_destroy(o->x);
	} else {
		/* P18: never free under a possible reader; the driver
		 * reclaims it when computed exits */
		st_warn("device %s pool: %s neither released nor died (%s); "
			"leaving the memory to the driver",
			st_devpool_kind_name(o->kind), o->daemon,
			diag.msg[0] ? diag.msg : "no answer");
	}
	o->x = NULL;
	sock_drop(o);
}

void cw_devpool_close(struct cw_devpool *p, int timeout_ms)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	if (p->tab_shm.base)
		st_shm_detach(&p->tab_shm);
	p->tab = NULL;
	close_one(p, &p->pool[1], timeout_ms);
	close_one(p, &p->pool[0], timeout_ms);
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_destroy(&p->mu);
	for (int i = 0; i < p->n_fjob; i++)
		free(p->fjob[i].x);
	free(p->fjob);
	free(p->guess);
	free(p);
}

int cw_devpool_fake_fn(void *arg, int layer, int expert, const uint8_t *rec,
		       const struct cw_wview w[3], int n,
		       const float *const *x, float *const *out)
{
	struct cw_devpool *p = arg;
	const void *dev = NULL;
	struct fake_job *j;
	uint32_t slot;

	if (!st_cuda_is_fake() || n < 1 ||
	    !cw_devpool_pin(p, (uint32_t)layer, (uint32_t)expert, NULL, &dev,
			    &slot))
		return 0;
	if (p->n_fjob == p->cap_fjob) {
		int cap = p->cap_fjob ? 2 * p->cap_fjob : 64;
		struct fake_job *nj = realloc(p->fjob, sizeof(*nj) * cap);

		if (!nj) {
			cw_devpool_unpin(p, slot);
			return 0;
		}
		p->fjob = nj;
		p->cap_fjob = cap;
	}
	j = &p->fjob[p->n_fjob];
	j->x = malloc(sizeof(*j->x) * 2 * (size_t)n);
	if (!j->x) {
		cw_devpool_unpin(p, slot);
		return 0;
	}
	j->out = (float **)(j->x + n);
	j->slot = slot;
	j->n = n;
	for (int i = 0; i < 3; i++) {
		j->dv[i] = w[i];
		j->dv[i].data = (const uint8_t *)dev +
				((const uint8_t *)w[i].data - rec);
		j->dv[i].scales = w[i].scales ?
			(const uint8_t *)dev + (w[i].scales - rec) : NULL;
	}
	for (int t = 0; t < n; t++) {
		j->x[t] = x[t];
		j->out[t] = out[t];
	}
	p->n_fjob++;
	return 1;
}

int cw_devpool_fake_sync(void *arg)
{
	struct cw_devpool *p = arg;
	const struct cw_backend_ops *be = cw_backend_cpu();
	const int fail = p->fail_every && ++p->n_fsync % p->fail_every == 0;
	float *g = NULL;
	int r = 0, done = 0;

	for (int k = 0; k < p->n_fjob; k++) {
		struct fake_job *j = &p->fjob[k];
		const int64_t I = j->dv[0].rows, H = j->dv[2].rows;

		if (!fail && !r) {
			float *ng = realloc(g, sizeof(float) * (size_t)I * 3);

			if (ng)
				g = ng;
			else
				r = -ENOMEM;
		}
		for (int t = 0; t < j->n && !fail && !r; t++) {
			float *u = g + I, *a = u + I;

			be->matvec(&j->dv[0], j->x[t], g, 0, I);
			be->matvec(&j->dv[1], j->x[t], u, 0, I);
			cw_swiglu(g, u, (int)I, a);
			be->matvec(&j->dv[2], a, j->out[t], 0, H);
		}
		/* a failed sync leaves garbage, as a faulted device would */
		for (int t = 0; t < j->n && (fail || r); t++)
			for (int64_t i = 0; i < H; i++)
				j->out[t][i] = NAN;
		done += !fail && !r;
		cw_devpool_unpin(p, j->slot);
		free(j->x);
	}
	free(g);
	p->n_fjob = 0;
	pthread_mutex_lock(&p->mu);
	p->st.fake_experts += (uint64_t)done;
	if (fail)
		p->st.fake_failed_syncs++;
	pthread_mutex_unlock(&p->mu);
	return fail ? -ST_E_CUDA : r;
}
