/*
 * kv_server.c — kvd's request server: the pool segment's life (creation on
 * the first DECLARE, adoption after a killed kvd, removal on a clean stop),
 * the REP/PUB sockets, decoding and validating every request, and releasing
 * the sequences of clients that died (DESIGN.md sections 3, 4 and 6).
 *
 * A handler never blocks and never trusts a field: a malformed request gets
 * an error reply (status + text) and the loop goes on.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_ioq.h"
#include "kv_session.h"
#include "kv_devpool.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_util.h"

#define KV_REAP_INTERVAL_NS (100ull * 1000 * 1000)
#define KV_RECV_TIMEOUT_MS 100
#define KV_SEND_TIMEOUT_MS 1000

/* ---- events ------------------------------------------------------------ */

static void publish(struct kv_server *s, uint16_t type, const void *payload,
		    size_t len)
{
	struct st_wbuf w;

	if (s->pub.fd < 0)
		return;
	st_wbuf_init(&w);
	if (st_proto_encode(&w, type, 0, 0, 0, payload, len) == 0)
		st_sock_send(&s->pub, w.data, w.len); /* PUB never blocks */
	st_wbuf_fini(&w);
}

static uint64_t pool_epoch(const struct kv_server *s)
{
	return s->have_pool ? atomic_load(&st_shm_hdr(&s->shm)->epoch) : 0;
}

/* The pool's creation id (st_shm.h), 0 while there is none. */
static uint64_t pool_id(const struct kv_server *s)
{
	return s->have_pool ? st_shm_hdr(&s->shm)->pool_id : 0;
}

static void publish_epoch(struct kv_server *s)
{
	struct st_wbuf w;

	st_wbuf_init(&w);
	st_wbuf_u64(&w, pool_epoch(s));
	if (!w.err)
		publish(s, KV_EVT_EPOCH, w.data, w.len);
	st_wbuf_fini(&w);
}

/* ---- the pool segment -------------------------------------------------- */

/* The spill file: --spill-file, or <run_dir>/kvd.spill. */
static void spill_path(const struct kv_server *s, char *buf, size_t len)
{
	if (s->cfg.spill_file[0])
		snprintf(buf, len, "%s", s->cfg.spill_file);
	else
		snprintf(buf, len, "%s/kvd.spill", s->cfg.run_dir);
}

/* Saved sessions: --session-dir, or "sessions" beside the spill file. */
static void session_dir(const struct kv_server *s, char *buf, size_t len)
{
	char spill[4200], *slash;

	if (s->cfg.session_dir[0]) {
		snprintf(buf, len, "%s", s->cfg.session_dir);
		return;
	}
	spill_path(s, spill, sizeof(spill));
	slash = strrchr(spill, '/');
	if (slash)
		*slash = 0;
	snprintf(buf, len, "%s/sessions", slash ? spill : ".");
}

/* Registers, as clients, the owners of the sequences of an adopted pool, so
 * that their requests go on being served and their deaths noticed. */
static void clients_from_pool(struct kv_server *s)
{
	struct kv_pool *p = &s->pool;

	kv_clients_bump_next(&s->clients,
			     atomic_load(&p->info->counters.next_client_id));
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		const struct kv_seq_entry *e = &p->seqs[i];
		struct kv_client_entry *c;
		uint32_t id;

		if (atomic_load(&e->state) != KV_SEQ_LIVE ||
		    kv_clients_find(&s->clients, e->owner_client))
			continue;
		if (kv_clients_add(&s->clients, e->owner_pid, e->owner_start,
				   "(adopted)", e->owner_client, &id) < 0)
			continue; /* reaped as ownerless below */
		c = kv_clients_find(&s->clients, id);
		if (c)
			c->adopted = 1;
	}
	/* Sequences whose owner could not be registered are released. */
	for (uint32_t i = 0; i < p->lay.max_seqs; i++) {
		const struct kv_seq_entry *e = &p->seqs[i];

		if (atomic_load(&e->state) == KV_SEQ_LIVE &&
		    !kv_clients_find(&s->clients, e->owner_client))
			kv_seq_free_client(p, e->owner_client);
	}
	atomic_store(&p->info->counters.next_client_id, s->clients.next_id);
}

/*
 * Makes s->shm (just created or adopted by st_shm_open_owner: `adopted`)
 * the pool: formats a new one, or validates and adopts an old one.
 */
static int pool_take(struct kv_server *s, int adopted,
		     const struct kv_layout *lay,
		     const struct kv_stream_decl *streams, uint64_t hash,
		     struct st_diag *diag)
{
	struct kv_adopt_report rep;
	struct kv_stream_decl rs[KV_MAX_STREAMS];
	struct kv_layout rl;
	struct st_diag nd;
	int r;

	/* before formatting: the policy belongs to the shm object, so the
	 * pages computed writes first land on the node too */
	if (st_numa_bind_range(s->shm.base, s->shm.size,
			       &s->cfg.numa_policy, &nd) < 0)
		st_warn("kv pool stays where the kernel puts it: %s", nd.msg);
	if (!adopted) {
		r = kv_pool_format(&s->pool, s->shm.base, s->shm.size, lay,
				   streams);
		if (r < 0) {
			st_shm_destroy(&s->shm);
			return st_diag_set(diag, r, "kv pool: %s",
					   st_strerror(r));
		}
		atomic_store(&s->pool.info->counters.next_client_id,
			     s->clients.next_id);
	} else {
		/* Re-validate what we now own: it may have changed since
		 * the first look. */
		r = kv_layout_read(s->shm.base, s->shm.size, hash, &rl, rs,
				   diag);
		if (r < 0) {
			st_shm_destroy(&s->shm);
			return r;
		}
		r = kv_pool_adopt(&s->pool, s->shm.base, s->shm.size, &rl, rs,
				  &rep);
		if (r < 0) {
			st_shm_detach(&s->shm); /* keep it for the next kvd */
			return st_diag_set(diag, r, "kv pool: %s",
					   st_strerror(r));
		}
		st_info("adopted kv pool %s (epoch %llu): %u sequences kept, "
			"%u dropped, %u cut back, %u failed (spilled page "
			"records inconsistent), %llu stale table entries and "
			"%llu reference counts repaired, %llu prefix-cache "
			"groups and %llu spill slots kept (%llu freed)",
			s->shm.name,
			(unsigned long long)atomic_load(
				&st_shm_hdr(&s->shm)->epoch),
			rep.seqs_kept, rep.seqs_dropped, rep.seqs_truncated,
			rep.seqs_failed,
			(unsigned long long)rep.entries_dropped,
			(unsigned long long)rep.refcounts_fixed,
			(unsigned long long)rep.cache_groups,
			(unsigned long long)rep.slots_kept,
			(unsigned long long)rep.slots_freed);
		if (rl.spill_budget_bytes != s->cfg.spill_budget_bytes)
			st_warn("kv pool %s keeps its spill budget of %llu "
				"bytes until it is released (kvd stopped "
				"cleanly)", s->shm.name,
				(unsigned long long)rl.spill_budget_bytes);
		if (rl.budget_bytes != kv_ledger_pool_budget(&s->cfg) ||
		    rl.max_seqs != s->cfg.max_seqs ||
		    rl.max_rows_per_seq != s->cfg.max_rows_per_seq)
			st_warn("kv pool %s keeps the geometry it was made with "
				"(budget %llu bytes, %u sequences, %u rows "
				"each); the options given take effect once the "
				"pool is released (kvd stopped cleanly)",
				s->shm.name,
				(unsigned long long)rl.budget_bytes,
				rl.max_seqs, rl.max_rows_per_seq);
	}
	if (s->pool.lay.n_slots) {
		char path[4200];

		spill_path(s, path, sizeof(path));
		r = kv_spill_open(&s->pool, path, adopted, diag);
		if (r == 0) {
			/* spill and restore share the NVMe queue with
			 * expertd's reads (st_ioq.h); without it they run */
			struct st_diag qd = { "" };

			if (st_ioq_open(&s->pool.spill.ioq, s->cfg.instance,
					"kvd", &qd) < 0)
				st_warn("no I/O queue (spill and restore not "
					"ordered with expertd's reads): %s",
					qd.msg);
		}
		if (r < 0) {
			kv_pool_fini(&s->pool);
			if (adopted)
				st_shm_detach(&s->shm);
			else
				st_shm_destroy(&s->shm);
			return r;
		}
		st_info("spill file %s: %llu slots of %llu bytes%s", path,
			(unsigned long long)s->pool.lay.n_slots,
			(unsigned long long)s->pool.lay.slot_bytes,
			s->pool.spill.direct ? " (O_DIRECT)" :
					       " (buffered: no O_DIRECT here)");
	}
	s->have_pool = 1;
	s->layout_hash = hash;
	/* --memory-budget: the pool's share of host memory from the ledger */
	r = kv_ledger_join(s, diag);
	if (r < 0) {
		kv_pool_fini(&s->pool);
		s->have_pool = 0;
		if (adopted)
			st_shm_detach(&s->shm);
		else
			st_shm_destroy(&s->shm);
		return r;
	}
	/* device-written rows reach a page before kvd reads it */
	s->pool.page_sync = kv_devpool_page_sync;
	s->pool.page_sync_ctx = s;
	s->pool.remote = s->have_remote ? &s->remote : NULL;
	if (adopted)
		clients_from_pool(s);
	return 0;
}

/* At start-up: a pool segment left by a killed kvd is adopted; an invalid
 * or incompatible one is removed (unless its owner lives: -EBUSY). */
static int pool_adopt_existing(struct kv_server *s, struct st_diag *diag)
{
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	struct kv_layout lay;
	struct st_shm tmp;
	struct st_diag d;
	uint64_t hash;
	int32_t owner;
	int r;

	r = st_shm_attach(&tmp, s->cfg.instance, KV_POOL_KIND,
			  KV_POOL_LAYOUT_VERSION, 0, &d);
	if (r == -ENOENT)
		return 0;
	if (r == -EPERM)
		return st_diag_set(diag, r, "%s", d.msg);
	if (r < 0) {
		/* Not usable.  Remove it unless a live process owns it. */
		struct st_diag d2 = { "" };

		r = st_shm_remove_stale(s->cfg.instance, KV_POOL_KIND, &d2);
		if (r < 0)
			return st_diag_set(diag, r, "%s (it is unusable: %s)",
					   d2.msg, d.msg);
		if (r > 0)
			st_warn("discarded unusable kv segment of instance %s: "
				"%s", s->cfg.instance, d.msg);
		return 0;
	}
	owner = atomic_load(&st_shm_hdr(&tmp)->owner_pid);
	if (owner != getpid() && st_pid_alive(owner)) {
		st_shm_detach(&tmp);
		return st_diag_set(diag, -EBUSY,
				   "kv pool %s is owned by live process %d "
				   "(another kvd of instance %s?)", tmp.name,
				   owner, s->cfg.instance);
	}
	hash = st_shm_hdr(&tmp)->layout_hash;
	r = kv_layout_read(tmp.base, tmp.size, hash, &lay, streams, &d);
	if (r < 0) {
		st_shm_detach(&tmp);
		st_warn("discarding kv pool %s: %s", tmp.name, d.msg);
		r = st_shm_remove_stale(s->cfg.instance, KV_POOL_KIND, diag);
		return r < 0 ? r : 0;
	}
	st_shm_detach(&tmp);
	r = st_shm_open_owner(&s->shm, s->cfg.instance, KV_POOL_KIND,
			      KV_POOL_LAYOUT_VERSION, hash, lay.total_bytes,
			      diag);
	if (r < 0)
		return r;
	return pool_take(s, r == 1, &lay, streams, hash, diag);
}

/* The first DECLARE: computes the layout and creates the pool. */
static int pool_create(struct kv_server *s, const struct kv_msg_declare *m,
		       struct st_diag *diag)
{
	struct kv_layout lay;
	uint64_t hash;
	char b1[32], b2[32];
	int r;

	r = kv_layout_compute_spill(m->streams, m->n_streams, m->page_rows,
				    kv_ledger_pool_budget(&s->cfg),
				    s->cfg.spill_budget_bytes, s->cfg.max_seqs,
				    s->cfg.max_rows_per_seq, &lay, diag);
	if (r < 0)
		return r;
	hash = kv_layout_hash(&lay, m->streams);
	r = st_shm_open_owner(&s->shm, s->cfg.instance, KV_POOL_KIND,
			      KV_POOL_LAYOUT_VERSION, hash, lay.total_bytes,
			      diag);
	if (r < 0)
		return r;
	r = pool_take(s, r == 1, &lay, m->streams, hash, diag);
	if (r < 0)
		return r;
	st_info("kv pool %s: %u streams, %u rows per page, %llu pages of %llu "
		"bytes (budget %s), segment %s", s->shm.name, lay.n_streams,
		lay.page_rows, (unsigned long long)lay.n_pages,
		(unsigned long long)lay.page_bytes,
		st_format_bytes(lay.budget_bytes, b1, sizeof(b1)),
		st_format_bytes(lay.total_bytes, b2, sizeof(b2)));
	publish_epoch(s);
	return 0;
}

/* ---- requests ---------------------------------------------------------- */

/* What a handler gives back: status, and payload in w (or text in diag). */
struct kv_reply {
	int status;
	struct st_wbuf w;
	struct st_diag diag;
};

static int need_pool(struct kv_server *s, struct kv_reply *rp)
{
	if (s->have_pool)
		return 1;
	rp->status = st_diag_set(&rp->diag, -ST_E_PROTO,
				 "no KV streams declared yet: send DECLARE "
				 "first");
	return 0;
}

static void handle_hello(struct kv_server *s, const uint8_t *p, size_t len,
			 struct kv_reply *rp)
{
	struct kv_msg_hello m;
	struct kv_msg_hello_reply out;
	uint64_t start;
	int r = kv_proto_decode_hello(p, len, &m, &rp->diag);

	if (r == 0 && s->cfg.test_proto_version)
		/* testing only: play a kvd of another protocol version */
		r = st_diag_set(&rp->diag, -ST_E_VERSION, "HELLO: client "
				"speaks protocol version %u, kvd speaks %u",
				m.proto_version, s->cfg.test_proto_version);
	if (r < 0) {
		rp->status = r;
		return;
	}
	r = st_peer_check((int32_t)m.pid, m.start_ticks, "kvd", &start,
			  &rp->diag);
	if (r < 0) {
		rp->status = r;
		return;
	}
	r = kv_clients_add(&s->clients, (int32_t)m.pid, start, m.name,
			   m.resume_client_id, &out.client_id);
	if (r < 0) {
		rp->status = st_diag_set(&rp->diag, r,
					 "cannot register client %s: %s (at "
					 "most %d clients)", m.name,
					 st_strerror(r), KV_MAX_CLIENTS);
		return;
	}
	if (s->have_pool)
		atomic_store(&s->pool.info->counters.next_client_id,
			     s->clients.next_id);
	st_debug("client %u registered: %s, pid %u", out.client_id, m.name,
		 m.pid);
	out.epoch = pool_epoch(s);
	out.pool_id = pool_id(s);
	kv_proto_encode_hello_reply(&rp->w, &out);
}

/* The prefix-cache and spill figures of the STATS reply. */
static void stats_cache_spill(struct kv_pool *p, struct kv_msg_stats *m)
{
	const struct kv_pool_stats *st = &p->stats;

	pthread_mutex_lock(&p->lock);
	m->pages_cached = p->cache.idle_pages;
	m->cache_groups = p->cache.n_groups;
	pthread_mutex_unlock(&p->lock);
	m->prefix_lookups = atomic_load(&st->prefix_lookups);
	m->prefix_pages_hit = atomic_load(&st->prefix_pages_hit);
	m->prefix_rows_reused = atomic_load(&st->prefix_rows_reused);
	m->prefix_published = atomic_load(&st->prefix_published);
	m->cache_evictions = atomic_load(&st->cache_evictions);
	m->spill_budget_bytes = p->lay.spill_budget_bytes;
	m->slot_bytes = p->lay.slot_bytes;
	m->n_slots = p->lay.n_slots;
	m->pages_spilled = kv_spill_used_slots(p);
	m->spill_pages_total = st->spill_pages_total;
	m->spill_bytes_total = st->spill_bytes_total;
	m->spill_ns_total = st->spill_ns_total;
	m->restore_pages_total = st->restore_pages_total;
	m->restore_bytes_total = st->restore_bytes_total;
	m->restore_ns_total = st->restore_ns_total;
	m->restore_failures = st->restore_failures;
	m->prefix_ahead_groups = st->pfx_ahead_groups;
	m->prefix_ahead_bytes = st->pfx_ahead_groups * p->lay.n_streams *
				p->lay.slot_bytes;
	m->prefix_lookup_restores = st->pfx_lookup_restores;
	m->prefix_lookup_restore_ns = st->pfx_lookup_restore_ns;
	m->spill_direct = p->spill.fd >= 0 && p->spill.direct;
	for (uint32_t i = 0; i < p->lay.max_seqs; i++)
		if (atomic_load(&p->seqs[i].state) == KV_SEQ_LIVE &&
		    (atomic_load(&p->seqs[i].flags) & KV_SEQ_F_PINNED))
			m->n_pinned++;
}

static void handle_stats(struct kv_server *s, struct kv_reply *rp)
{
	struct kv_msg_stats m;

	memset(&m, 0, sizeof(m));
	m.budget_bytes = s->cfg.budget_bytes;
	m.spill_budget_bytes = s->cfg.spill_budget_bytes;
	m.max_seqs = s->cfg.max_seqs;
	m.max_rows_per_seq = s->cfg.max_rows_per_seq;
	if (s->have_pool) {
		const struct kv_layout *l = &s->pool.lay;
		const struct kv_pool_counters *c = &s->pool.info->counters;

		/* under a shared memory budget: the share the target
		 * allows now (n_pages stays the pool's) */
		m.budget_bytes = s->ledger ?
			(s->pool.allowed_pages + s->pool.over_pages) *
				l->page_bytes :
			l->budget_bytes;
		m.pool_bytes = s->shm.size;
		m.page_bytes = l->page_bytes;
		m.page_rows = l->page_rows;
		m.n_streams = l->n_streams;
		m.n_pages = l->n_pages;
		m.pages_used = atomic_load(&c->pages_used);
		m.pages_peak = atomic_load(&c->pages_peak);
		m.n_seqs = atomic_load(&c->n_seqs);
		m.pages_shared = atomic_load(&c->pages_shared);
		m.max_seqs = l->max_seqs;
		m.max_rows_per_seq = l->max_rows_per_seq;
		stats_cache_spill(&s->pool, &m);
	}
	m.epoch = pool_epoch(s);
	m.pool_id = pool_id(s);
	m.pid = (int32_t)getpid();
	m.n_clients = s->clients.n;
	if (s->have_remote) {
		const struct kv_remote_stats *rs = &s->remote.stats;

		m.remote_on = 1;
		m.remote_hits = rs->hits;
		m.remote_misses = rs->misses;
		m.remote_bytes_in = rs->bytes_in;
		m.remote_bytes_out = rs->bytes_out;
		m.remote_errors = rs->errors;
		m.remote_published = rs->published;
		m.remote_rejected = rs->rejected;
	}
	kv_proto_encode_stats(&rp->w, &m);
}

static void handle_declare(struct kv_server *s, const uint8_t *p, size_t len,
			   struct kv_reply *rp)
{
	struct kv_msg_declare *m = malloc(sizeof(*m));
	struct kv_msg_declare_reply out;
	int r;

	if (!m) {
		rp->status = -ENOMEM;
		return;
	}
	r = kv_proto_decode_declare(p, len, m, &rp->diag);
	if (r == 0 && !s->have_pool)
		r = pool_create(s, m, &rp->diag);
	else if (r == 0 &&
		 !kv_decl_equal(m->n_streams, m->streams, m->page_rows,
				s->pool.lay.n_streams, s->pool.streams,
				s->pool.lay.page_rows))
		r = st_diag_set(&rp->diag, -ST_E_CONFIG,
				"kvd of instance %s already holds a pool for "
				"another declaration (%u streams, %u rows per "
				"page; this one: %u streams, %u rows per "
				"page); stop kvd or use another instance",
				s->cfg.instance, s->pool.lay.n_streams,
				s->pool.lay.page_rows, m->n_streams,
				m->page_rows);
	free(m);
	if (r < 0) {
		rp->status = r;
		return;
	}
	out.layout_hash = s->layout_hash;
	out.epoch = pool_epoch(s);
	out.pool_bytes = s->shm.size;
	out.pool_id = pool_id(s);
	kv_proto_encode_declare_reply(&rp->w, &out);
}

static int handle_prefix(struct kv_server *s, const struct st_msg_header *h,
			 struct kv_client_entry *c, const uint8_t *p,
			 size_t len, struct kv_reply *rp)
{
	int publish = h->type == KV_MSG_SEQ_PUBLISH;
	struct kv_msg_prefix m;
	struct kv_msg_prefix_reply out;
	int r = kv_proto_decode_prefix(p, len, publish, &m, &rp->diag);

	if (r < 0)
		return r;
	if (publish) {
		r = kv_seq_publish_flags(&s->pool, c->id, m.seq, m.model_id,
					 m.ids, m.n_ids, m.flags, &rp->diag);
		if (r >= 0) {
			kv_proto_encode_u32(&rp->w, (uint32_t)r);
			r = 0;
		}
	} else {
		r = kv_seq_create_prefix(&s->pool, c->id, c->pid,
					 h->request_id, c->adopted, m.model_id,
					 m.ids, m.n_ids, &out.seq,
					 &out.n_cached, &rp->diag);
		if (r == 0)
			kv_proto_encode_prefix_reply(&rp->w, &out);
	}
	kv_msg_prefix_fini(&m);
	return r;
}

/* KV_MSG_SESSION (kv_session_proto.h): save, load, list, remove. */
static int handle_session(struct kv_server *s, const uint8_t *p, size_t len,
			  struct kv_reply *rp)
{
	struct kv_msg_session m;
	char dir[4300];
	uint32_t groups, rows, n_ids;
	int32_t *ids = NULL, replaced = -1;
	int r = kv_proto_decode_session(p, len, &m, &rp->diag);

	if (r < 0)
		return r;
	session_dir(s, dir, sizeof(dir));
	switch (m.op) {
	case KV_SESSION_SAVE:
		r = kv_session_save(&s->pool, dir, m.name, &m.ident, m.ids,
				    m.n_ids, &groups, &replaced, &rp->diag);
		if (r == 0) {
			st_info("session '%s' saved: %u page groups (%u "
				"rows) in %s%s", m.name, groups,
				groups * s->pool.lay.page_rows, dir,
				replaced >= 0 ? ", replacing the old one" : "");
			kv_proto_encode_u32(&rp->w, groups);
			kv_proto_encode_u32(&rp->w,
					    groups * s->pool.lay.page_rows);
			st_wbuf_i32(&rp->w, replaced);
		} else {
			st_warn("%s", rp->diag.msg);
		}
		break;
	case KV_SESSION_LOAD:
		r = kv_session_load(&s->pool, dir, m.name, &m.ident, &groups,
				    &rows, &ids, &n_ids, &rp->diag);
		if (r == 0) {
			st_info("session '%s' loaded: %u rows, %u page groups "
				"placed in the prefix cache", m.name, rows,
				groups);
			kv_proto_encode_u32(&rp->w, groups);
			kv_proto_encode_u32(&rp->w, rows);
			kv_proto_encode_u32(&rp->w, n_ids);
			for (uint32_t i = 0; i < n_ids; i++)
				st_wbuf_i32(&rp->w, ids[i]);
		} else {
			st_warn("%s", rp->diag.msg);
		}
		free(ids);
		break;
	case KV_SESSION_LIST: {
		struct kv_session_info *v =
			calloc(KV_SESSION_MAX_LIST, sizeof(*v));

		r = v ? kv_session_list(dir, v, KV_SESSION_MAX_LIST) : -ENOMEM;
		if (r >= 0) {
			kv_proto_encode_session_list(&rp->w, (uint32_t)r, v);
			r = 0;
		} else {
			st_diag_set(&rp->diag, r, "listing sessions in %s: %s",
				    dir, st_strerror(r));
		}
		free(v);
		break;
	}
	default:
		r = kv_session_remove(s->pool.remote, dir, m.name,
				      &rp->diag);
		break;
	}
	kv_msg_session_fini(&m);
	return r;
}

/* ---- background restores (KV_RESIDENCY_PREFETCH) ---------------------- */

/* Queues the client's sequences that have spilled pages; each gets status
 * 0, or its error (unknown, another client's, failed). */
static int prefetch_queue(struct kv_server *s, struct kv_client_entry *c,
			  uint32_t n, const uint32_t *seqs, int32_t *status,
			  struct st_diag *diag)
{
	struct kv_pool *p = &s->pool;
	int first = 0;

	for (uint32_t i = 0; i < n; i++) {
		int idx = kv_seq_check_owned(p, seqs[i], c->id, 1,
					     first ? NULL : diag);
		int r = idx < 0 ? idx : 0, dup = 0;

		status[i] = r;
		if (r < 0) {
			first = first ? first : r;
			continue;
		}
		if (p->seqs[idx].n_spilled == 0)
			continue;
		for (uint32_t q = 0; q < s->n_prefetch; q++)
			dup |= s->prefetch[q] == seqs[i];
		if (dup)
			continue;
		if (s->n_prefetch == s->cap_prefetch) {
			/* at most one entry per sequence (deduplicated) */
			uint32_t cap = ST_MIN(s->cap_prefetch ?
						      2 * s->cap_prefetch : 64,
					      p->lay.max_seqs);
			uint32_t *q;

			if (cap <= s->n_prefetch)
				continue; /* cannot happen */
			q = realloc(s->prefetch, sizeof(*q) * cap);
			if (!q)
				continue; /* the pin will restore it */
			s->prefetch = q;
			s->cap_prefetch = cap;
		}
		s->prefetch[s->n_prefetch++] = seqs[i];
	}
	return first;
}

/*
 * One turn of background restoring: the first queued sequence gets up to
 * KV_PREFETCH_STEP_BYTES of its spilled pages back, into pages that are
 * free (or idle cached) now; background restores never spill anything.
 * A sequence is dropped from the queue when it is whole, gone, failed, or
 * when no page is free (its pin will restore it, spilling if it must).
 */
static void prefetch_step(struct kv_server *s)
{
	struct kv_pool *p = &s->pool;
	uint32_t handle = s->prefetch[0], stamp, room, step;
	struct st_diag d;
	int idx = kv_seq_lookup(p, handle), done = 1;

	if (idx >= 0 && p->seqs[idx].n_spilled &&
	    !(atomic_load(&p->seqs[idx].flags) & KV_SEQ_F_FAILED)) {
		room = (uint32_t)ST_MIN(kv_pool_avail_pages(p),
					(uint64_t)UINT32_MAX);
		step = (uint32_t)ST_MAX(1u, KV_PREFETCH_STEP_BYTES /
						    p->lay.slot_bytes);
		if (room) {
			stamp = kv_mark_begin(p);
			p->mark[2 * (uint32_t)idx] = stamp;
			if (kv_seq_restore_some(p, (uint32_t)idx, stamp,
						ST_MIN(room, step), &d) < 0)
				st_debug("background restore of 0x%x: %s",
					 handle, d.msg);
			else
				done = p->seqs[idx].n_spilled == 0;
		}
	}
	if (done) {
		s->n_prefetch--;
		memmove(s->prefetch, s->prefetch + 1,
			sizeof(uint32_t) * s->n_prefetch);
	}
}

/* PREFIX_AHEAD: the client's plan of queued requests' prefixes
 * (kv_cache_ahead.c); the reply counts the groups to restore and held. */
static int handle_prefix_ahead(struct kv_server *s, struct kv_client_entry *c,
			       const uint8_t *p, size_t len,
			       struct kv_reply *rp)
{
	struct kv_msg_prefix_ahead m;
	uint32_t spilled, held;
	int r = kv_proto_decode_prefix_ahead(p, len, &m, &rp->diag);

	if (r < 0)
		return r;
	r = kv_pfx_ahead_set(&s->pool, c->id, m.n_chains, m.chain_len,
			     m.keys, &spilled, &held);
	kv_msg_prefix_ahead_fini(&m);
	if (r < 0)
		return st_diag_set(&rp->diag, r, "PREFIX_AHEAD: no memory "
				   "for the plan");
	kv_proto_encode_u32(&rp->w, spilled);
	kv_proto_encode_u32(&rp->w, held);
	return 0;
}

/* SEQ_RESIDENCY: the reply's status is 0 and it carries every sequence's
 * status and the text of the first failure. */
static int handle_residency(struct kv_server *s, struct kv_client_entry *c,
			    const uint8_t *p, size_t len, struct kv_reply *rp)
{
	struct kv_msg_residency m;
	int32_t *status;
	int r = kv_proto_decode_residency(p, len, &m, &rp->diag);

	if (r < 0)
		return r;
	status = calloc(m.n, sizeof(*status));
	if (!status) {
		free(m.seqs);
		return -ENOMEM;
	}
	if (m.op == KV_RESIDENCY_PREFETCH)
		r = prefetch_queue(s, c, m.n, m.seqs, status, &rp->diag);
	else if (m.op == KV_RESIDENCY_AHEAD)
		r = kv_ahead_queue(s, c->id, m.n, m.seqs, status, &rp->diag);
	else
		r = kv_seq_residency(&s->pool, c->id, m.op, m.n, m.seqs,
				     status, &rp->diag);
	if (r == -ST_E_CHECKSUM)
		st_warn("client %u (%s): %s", c->id, c->name, rp->diag.msg);
	kv_proto_encode_status_list(&rp->w, m.n, status,
				    r < 0 ? rp->diag.msg : NULL);
	free(status);
	free(m.seqs);
	return 0;
}

static void handle_seq(struct kv_server *s, const struct st_msg_header *h,
		       struct kv_client_entry *c, const uint8_t *p, size_t len,
		       struct kv_reply *rp)
{
	struct kv_reserve_entry *e = NULL;
	struct kv_msg_fork f;
	struct kv_msg_truncate t;
	uint32_t n, seq;
	int r;

	if (!need_pool(s, rp))
		return;
	switch (h->type) {
	case KV_MSG_SEQ_CREATE:
		r = kv_proto_decode_empty(p, len, &rp->diag);
		if (r == 0)
			r = kv_seq_create(&s->pool, c->id, c->pid,
					  h->request_id, c->adopted, &seq,
					  &rp->diag);
		if (r == 0)
			kv_proto_encode_seq(&rp->w, seq);
		break;
	case KV_MSG_SEQ_RESERVE:
		r = kv_proto_decode_reserve(p, len, &n, &e, &rp->diag);
		if (r == 0)
			r = kv_seq_reserve(&s->pool, c->id, n, e, &rp->diag);
		free(e);
		break;
	case KV_MSG_SEQ_FORK:
		r = kv_proto_decode_fork(p, len, &f, &rp->diag);
		if (r == 0)
			r = kv_seq_fork(&s->pool, c->id, c->pid, h->request_id,
					c->adopted, f.src, f.n_rows, &seq,
					&rp->diag);
		if (r == 0)
			kv_proto_encode_seq(&rp->w, seq);
		break;
	case KV_MSG_SEQ_FREE:
		r = kv_proto_decode_seq(p, len, &seq, &rp->diag);
		if (r == 0)
			r = kv_seq_free(&s->pool, c->id, seq, &rp->diag);
		break;
	case KV_MSG_SEQ_TRUNCATE:
		r = kv_proto_decode_truncate(p, len, &t, &rp->diag);
		if (r == 0)
			r = kv_seq_truncate(&s->pool, c->id, t.seq, t.n_rows,
					    &rp->diag);
		break;
	case KV_MSG_SEQ_CREATE_PREFIX:
	case KV_MSG_SEQ_PUBLISH:
		r = handle_prefix(s, h, c, p, len, rp);
		break;
	case KV_MSG_SEQ_RESIDENCY:
		r = handle_residency(s, c, p, len, rp);
		break;
	case KV_MSG_SESSION:
		r = handle_session(s, p, len, rp);
		break;
	case KV_MSG_PREFIX_AHEAD:
		r = handle_prefix_ahead(s, c, p, len, rp);
		break;
	case KV_MSG_DEMAND: {
		struct kv_msg_demand m;

		r = kv_proto_decode_demand(p, len, &m, &rp->diag);
		if (r == 0) {
			c->demand_pages = m.pages;
			c->demand_reqs = m.n_reqs;
			c->demand_grow = m.grow;
			c->demand_ns = st_now_ns();
		}
		break;
	}
	default:
		r = -ST_E_PROTO;
		break;
	}
	rp->status = r;
}

/* Sends the reply (an error carries its text) and caches it for client c. */
static void send_reply(struct kv_server *s, const struct st_msg_header *h,
		       struct kv_client_entry *c, struct kv_reply *rp)
{
	struct st_wbuf msg, text;
	const struct st_wbuf *body = &rp->w;
	int r;

	st_wbuf_init(&msg);
	st_wbuf_init(&text);
	if (rp->status < 0 || rp->w.err) {
		if (rp->status >= 0)
			rp->status = rp->w.err;
		kv_proto_encode_text(&text, rp->diag.msg[0] ?
						    rp->diag.msg :
						    st_strerror(rp->status));
		body = &text;
	}
	r = st_proto_encode(&msg, (uint16_t)(h->type | ST_MSG_REPLY),
			    h->request_id, h->client_id, rp->status,
			    body->data, body->len);
	if (r == 0)
		r = st_sock_send(&s->rep, msg.data, msg.len);
	if (r < 0)
		st_warn("reply to %s (client %u): %s",
			st_proto_type_name(h->type), h->client_id,
			st_strerror(r));
	else if (c)
		kv_clients_cache_reply(c, h->request_id, h->type, msg.data,
				       msg.len);
	st_wbuf_fini(&msg);
	st_wbuf_fini(&text);
}

/* Handles one received message and replies; never fails. */
static void handle(struct kv_server *s, const uint8_t *buf, size_t len)
{
	struct st_msg_header h;
	struct kv_client_entry *c = NULL;
	struct kv_reply rp;
	const uint8_t *p = buf + ST_PROTO_HEADER_BYTES;
	size_t plen;
	int r;

	memset(&rp, 0, sizeof(rp));
	st_wbuf_init(&rp.w);
	r = st_proto_decode_header(buf, len, &h);
	if (r < 0) {
		kv_proto_salvage_header(buf, len, &h);
		rp.status = st_diag_set(&rp.diag, r,
					"malformed message header (%zu bytes): "
					"%s", len, st_strerror(r));
		if (r == -ST_E_VERSION)
			st_diag_set(&rp.diag, r,
				    "protocol version %u, kvd speaks %u",
				    h.version, ST_PROTO_VERSION);
		goto reply;
	}
	plen = h.payload_len;
	if (h.type & ST_MSG_REPLY) {
		h.type &= (uint16_t)~ST_MSG_REPLY;
		rp.status = st_diag_set(&rp.diag, -ST_E_PROTO,
					"a reply was sent as a request");
		goto reply;
	}
	if (h.status != 0) {
		rp.status = st_diag_set(&rp.diag, -ST_E_PROTO,
					"a request must have status 0");
		goto reply;
	}
	switch (h.type) {
	case ST_MSG_HELLO:
		handle_hello(s, p, plen, &rp);
		goto reply;
	case ST_MSG_PING: {
		struct kv_msg_ping_reply out = { (uint32_t)getpid(),
						 pool_epoch(s), 1 };

		rp.status = kv_proto_decode_empty(p, plen, &rp.diag);
		if (rp.status == 0)
			kv_proto_encode_ping_reply(&rp.w, &out);
		goto reply;
	}
	case ST_MSG_STATS:
		rp.status = kv_proto_decode_empty(p, plen, &rp.diag);
		if (rp.status == 0)
			handle_stats(s, &rp);
		goto reply;
	case ST_MSG_SHUTDOWN:
		if (plen == 4) {
			/* [u32 flags]: KEEP_POOL leaves the pool (and the
			 * spill file) for the next kvd to adopt */
			uint32_t f = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
				     (uint32_t)p[2] << 16 |
				     (uint32_t)p[3] << 24;

			rp.status = f & ~ST_SHUTDOWN_F_KEEP_POOL ?
				st_diag_set(&rp.diag, -ST_E_PROTO, "SHUTDOWN: "
					    "unknown flags 0x%x", f) : 0;
			if (rp.status == 0 && (f & ST_SHUTDOWN_F_KEEP_POOL))
				s->keep_pool = 1;
		} else {
			rp.status = kv_proto_decode_empty(p, plen, &rp.diag);
		}
		if (rp.status == 0) {
			st_info("SHUTDOWN requested (client %u)%s",
				h.client_id, s->keep_pool ? "; the KV pool "
				"stays for the next kvd" : "");
			s->stop = 1;
		}
		goto reply;
	case ST_MSG_DEV_EXPORT: /* device KV pool (kv_devpool.h) */
	case ST_MSG_DEV_REVOKE:
		rp.status = kv_devpool_handle(s, h.type, p, plen, &rp.w,
					      &rp.diag);
		goto reply;
	default:
		break;
	}
	c = kv_clients_find(&s->clients, h.client_id);
	if (!c) {
		rp.status = st_diag_set(&rp.diag, -ST_E_STALE,
					"unknown client id %u: say HELLO first "
					"(kvd restarted?)", h.client_id);
		goto reply;
	}
	/* copies to the device read host pages: they finish before any
	 * request that may free, spill or move one */
	if (h.type != KV_MSG_SEQ_DEVICE)
		kv_devpool_quiesce(s);
	if (c->last_reply && c->last_request_id == h.request_id &&
	    c->last_type == h.type) {
		/* a re-sent request: the same answer, not a second effect */
		if (st_sock_send(&s->rep, c->last_reply, c->last_reply_len) < 0)
			st_warn("re-sending a reply to client %u failed",
				c->id);
		st_wbuf_fini(&rp.w);
		return;
	}
	switch (h.type) {
	case ST_MSG_BYE:
		rp.status = kv_proto_decode_empty(p, plen, &rp.diag);
		if (rp.status == 0) {
			int n = s->have_pool ?
					kv_seq_free_client(&s->pool, c->id) : 0;

			st_debug("client %u (%s) said BYE; %d sequences "
				 "released", c->id, c->name, n);
			kv_clients_remove(&s->clients, c->id);
			c = NULL;
		}
		break;
	case KV_MSG_DECLARE:
		handle_declare(s, p, plen, &rp);
		break;
	case KV_MSG_SEQ_CREATE:
	case KV_MSG_SEQ_RESERVE:
	case KV_MSG_SEQ_FORK:
	case KV_MSG_SEQ_FREE:
	case KV_MSG_SEQ_TRUNCATE:
	case KV_MSG_SEQ_CREATE_PREFIX:
	case KV_MSG_SEQ_PUBLISH:
	case KV_MSG_SEQ_RESIDENCY:
	case KV_MSG_SESSION:
	case KV_MSG_PREFIX_AHEAD:
	case KV_MSG_DEMAND:
		handle_seq(s, &h, c, p, plen, &rp);
		break;
	case KV_MSG_SEQ_DEVICE:
		if (need_pool(s, &rp))
			rp.status = kv_devpool_seq_device(s, c->id, p, plen,
							  &rp.w, &rp.diag);
		break;
	default:
		rp.status = st_diag_set(&rp.diag, -ST_E_PROTO,
					"unknown message type 0x%04x",
					h.type);
		break;
	}
reply:
	send_reply(s, &h, c, &rp);
	st_wbuf_fini(&rp.w);
}

/* Releases the sequences of clients whose process exited. */
static void reap_clients(struct kv_server *s)
{
	for (uint32_t i = s->clients.n; i-- > 0;) {
		struct kv_client_entry *c = &s->clients.v[i];
		int n = 0;

		if (!kv_clients_dead(c))
			continue;
		if (s->have_pool)
			n = kv_seq_free_client(&s->pool, c->id);
		st_info("client %u (%s, pid %d) is gone: %d sequences "
			"released", c->id, c->name, c->pid, n);
		kv_clients_remove(&s->clients, c->id);
	}
}

/* ---- life -------------------------------------------------------------- */

int kv_server_start(struct kv_server *s, const struct kv_config *cfg,
		    struct st_diag *diag)
{
	int r;

	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->recv_timeout_ms = KV_RECV_TIMEOUT_MS;
	s->rep.fd = -1;
	s->pub.fd = -1;
	kv_clients_init(&s->clients);
	if (st_run_path(cfg->run_dir, "kvd", "ctl", s->ctl_path,
			sizeof(s->ctl_path)) < 0 ||
	    st_run_path(cfg->run_dir, "kvd", "evt", s->evt_path,
			sizeof(s->evt_path)) < 0)
		return st_diag_set(diag, -ENAMETOOLONG, "run directory path "
				   "too long: %s", cfg->run_dir);
	if (cfg->remote.url[0]) {
		r = kv_remote_init(&s->remote, &cfg->remote, diag);
		if (r < 0) {
			kv_clients_fini(&s->clients);
			return r;
		}
		s->have_remote = 1;
	}
	r = pool_adopt_existing(s, diag);
	if (r < 0)
		goto fail;
	r = st_sock_open(&s->rep, ST_SOCK_REP, s->ctl_path, KV_SEND_TIMEOUT_MS,
			 KV_RECV_TIMEOUT_MS);
	if (r < 0) {
		st_diag_set(diag, r, "cannot bind %s: %s%s", s->ctl_path,
			    st_strerror(r),
			    r == -EADDRINUSE ? " (another kvd is serving "
					       "this run directory)" : "");
		goto fail;
	}
	r = st_sock_open(&s->pub, ST_SOCK_PUB, s->evt_path, KV_SEND_TIMEOUT_MS,
			 -1);
	if (r < 0) {
		st_diag_set(diag, r, "cannot bind %s: %s", s->evt_path,
			    st_strerror(r));
		st_sock_close(&s->rep);
		unlink(s->ctl_path);
		goto fail;
	}
	if (s->have_pool)
		publish_epoch(s);
	s->last_reap_ns = st_now_ns();
	return 0;
fail:
	/* An adopted pool stays for the next kvd: detach, never remove. */
	kv_ledger_leave(s);
	if (s->have_pool) {
		kv_pool_fini(&s->pool);
		st_shm_detach(&s->shm);
		s->have_pool = 0;
	}
	kv_remote_fini(&s->remote);
	kv_clients_fini(&s->clients);
	return r;
}

int kv_server_poll(struct kv_server *s)
{
	void *buf = NULL;
	size_t len = 0;
	uint64_t now;
	int r, want = s->n_prefetch || s->n_ahead_pending ||
			      (s->have_pool && s->pool.pfx.n_pending) ?
			      0 : KV_RECV_TIMEOUT_MS;

	/* background restores pending: look for a request, do not wait */
	if (want != s->recv_timeout_ms &&
	    st_sock_set_recv_timeout(&s->rep, want) == 0)
		s->recv_timeout_ms = want;
	r = st_sock_recv(&s->rep, &buf, &len);
	if (r == 0) {
		handle(s, buf, len);
		free(buf);
	} else if (r != -ST_E_TIMEOUT && r != -EINTR) {
		st_warn("receive on %s: %s", s->ctl_path, st_strerror(r));
		st_sleep_ns(10ull * 1000 * 1000);
	}
	/* between requests, no client waits: the spills these make are
	 * the I/O queue's least urgent class (kv_spill.background) */
	if (s->n_ahead_pending && s->have_pool) {
		kv_devpool_quiesce(s);
		s->pool.spill.background = 1;
		kv_ahead_step(s);
		s->pool.spill.background = 0;
	} else if (s->have_pool && s->pool.pfx.n_pending) {
		/* queued requests' prefixes: after the next step's
		 * sequences, never spilling a sequence's page */
		kv_devpool_quiesce(s);
		s->pool.spill.background = 1;
		kv_pfx_ahead_step(&s->pool, kv_ahead_headroom(&s->pool));
		s->pool.spill.background = 0;
	} else if (s->n_prefetch && s->have_pool) {
		kv_devpool_quiesce(s);
		s->pool.spill.background = 1;
		prefetch_step(s);
		s->pool.spill.background = 0;
	}
	now = st_now_ns();
	kv_ledger_tick(s, now);
	if (now - s->last_reap_ns >= KV_REAP_INTERVAL_NS) {
		kv_devpool_quiesce(s);
		reap_clients(s);
		kv_devpool_tick(s);
		s->last_reap_ns = now;
	}
	return s->stop;
}

void kv_server_stop(struct kv_server *s)
{
	publish(s, KV_EVT_SHUTDOWN, NULL, 0);
	kv_ledger_leave(s);
	kv_devpool_fini(s, !s->keep_pool);
	st_sock_close(&s->rep);
	st_sock_close(&s->pub);
	unlink(s->ctl_path);
	unlink(s->evt_path);
	if (s->have_pool && s->keep_pool) {
		/* SHUTDOWN KEEP_POOL: the next kvd adopts pool and spill file */
		kv_spill_close(&s->pool, 0);
		kv_pool_fini(&s->pool);
		st_shm_detach(&s->shm);
		s->have_pool = 0;
	} else if (s->have_pool) {
		/* the pool goes: what the spill file holds means nothing */
		kv_spill_close(&s->pool, 1);
		kv_pool_fini(&s->pool);
		st_shm_destroy(&s->shm);
		s->have_pool = 0;
	}
	kv_remote_fini(&s->remote);
	kv_clients_fini(&s->clients);
	free(s->prefetch);
	s->prefetch = NULL;
	s->n_prefetch = s->cap_prefetch = 0;
	kv_ahead_fini(s);
}
