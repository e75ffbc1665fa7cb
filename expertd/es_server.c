/*
 * es_server.c — expertd's control plane (DESIGN.md section 4): the REP
 * socket <run_dir>/expertd.ctl and the PUB socket <run_dir>/expertd.evt.
 *
 * Every request is validated before use (header, exact payload length,
 * every field range, a registered client id whose pid matches); anything
 * malformed gets an error reply whose payload names the problem, and the
 * daemon keeps serving.  No handler blocks on I/O: a miss is answered at
 * once with the slot to wait on while a loader thread reads the record.
 * The loop also reaps dead clients every ES_REAP_INTERVAL_MS.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "es_daemon.h"
#include "es_engram_proto.h"
#include "es_devpool.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_util.h"

/* Sends an error reply (status < 0, payload: the message). */
static void reply_error(struct es_daemon *d, const struct st_msg_header *h,
			int status, const char *msg)
{
	struct st_wbuf w;
	int r;

	/* BUSY is ordinary back-pressure (clients retry): debug only. */
	st_log(status == -ST_E_BUSY ? ST_LOG_DEBUG : ST_LOG_INFO,
	       "%s request %" PRIu64 " from client %u refused: %s (%s)",
	       es_proto_type_name(h->type), h->request_id, h->client_id, msg,
	       st_strerror(status));
	st_wbuf_init(&w);
	es_error_encode(&w, msg);
	r = w.err ? w.err : st_rpc_reply(&d->rep, h, status, w.data, w.len);
	if (r < 0)
		st_warn("cannot send error reply: %s", st_strerror(r));
	st_wbuf_fini(&w);
}

static void reply_ok(struct es_daemon *d, const struct st_msg_header *h,
		     const struct st_wbuf *w)
{
	int r = w && w->err ? w->err :
			      st_rpc_reply(&d->rep, h, 0, w ? w->data : NULL,
					   w ? w->len : 0);

	if (r < 0)
		st_warn("cannot send %s reply: %s",
			es_proto_type_name(h->type), st_strerror(r));
}

static uint64_t epoch_of(const struct es_daemon *d)
{
	return atomic_load(&d->pool.v.shm->epoch);
}

static int no_payload(struct es_daemon *d, const struct st_msg_header *h)
{
	char msg[128];

	if (h->payload_len == 0)
		return 1;
	snprintf(msg, sizeof(msg), "%s takes no payload, got %u bytes",
		 es_proto_type_name(h->type), h->payload_len);
	reply_error(d, h, -ST_E_PROTO, msg);
	return 0;
}

static void handle_hello(struct es_daemon *d, const struct st_msg_header *h,
			 const uint8_t *p)
{
	struct st_diag diag = { "" };
	struct es_hello_req req;
	struct es_hello_rep rep;
	struct st_wbuf w;
	uint64_t start;
	uint32_t id;
	int r, c;

	r = es_hello_req_decode(p, h->payload_len, &req, &diag);
	if (r == 0 && d->opt.test_proto_version)
		/* testing only: play an expertd of another protocol version
		 * (the decoder's refusal, as such a build would send it) */
		r = st_diag_set(&diag, -ST_E_VERSION, "client speaks expertd "
				"protocol %u, this expertd speaks %d; use "
				"matching builds", req.version,
				d->opt.test_proto_version);
	if (r < 0) {
		reply_error(d, h, r, diag.msg);
		return;
	}
	r = st_peer_check((int32_t)req.pid, req.start_ticks, "expertd",
			  &start, &diag);
	if (r < 0) {
		reply_error(d, h, r, diag.msg);
		return;
	}
	es_clients_reap(&d->pool);
	/* A client reconnecting after a restart keeps its entry and pins
	 * when the adopted table still holds it for the same process. */
	c = req.resume_client_id ?
		es_clients_lookup(&d->pool, req.resume_client_id,
				  (int32_t)req.pid, NULL) : -1;
	if (c >= 0 && d->pool.v.clients[c].start_ticks == start) {
		id = req.resume_client_id;
		st_info("client %u '%s' (pid %u) reconnected", id, req.name,
			req.pid);
	} else {
		r = es_clients_register(&d->pool, (int32_t)req.pid, start,
					req.name, &id);
		if (r < 0) {
			snprintf(diag.msg, sizeof(diag.msg),
				 "expertd serves at most %d clients and all "
				 "are registered; close idle clients",
				 ES_MAX_CLIENTS);
			reply_error(d, h, r, diag.msg);
			return;
		}
		st_info("client %u '%s' (pid %u) registered", id, req.name,
			req.pid);
	}
	memset(&rep, 0, sizeof(rep));
	rep.client_id = id;
	rep.epoch = epoch_of(d);
	rep.pool_id = d->pool.v.shm->pool_id;
	rep.pid = (uint32_t)getpid();
	rep.pool_layout = ES_POOL_LAYOUT_VERSION;
	rep.store_id = d->pool.geom.store_id;
	rep.layout_hash = d->pool.layout.layout_hash;
	rep.n_layers = d->pool.geom.n_layers;
	rep.n_experts = d->pool.geom.n_experts;
	rep.n_slots = d->pool.geom.n_slots;
	rep.top_k = d->pool.geom.top_k;
	rep.record_bytes = d->pool.geom.record_bytes;
	st_wbuf_init(&w);
	es_hello_rep_encode(&w, &rep);
	reply_ok(d, h, &w);
	st_wbuf_fini(&w);
}

static void handle_bye(struct es_daemon *d, const struct st_msg_header *h)
{
	struct st_diag diag = { "" };
	int c;

	if (!no_payload(d, h))
		return;
	c = es_clients_lookup(&d->pool, h->client_id, 0, &diag);
	if (c < 0) {
		reply_error(d, h, c, diag.msg);
		return;
	}
	es_clients_unregister(&d->pool, c);
	reply_ok(d, h, NULL);
}

static void handle_ping(struct es_daemon *d, const struct st_msg_header *h)
{
	struct es_ping_rep rep = { (uint32_t)getpid(), epoch_of(d), 1 };
	struct st_wbuf w;

	if (!no_payload(d, h))
		return;
	st_wbuf_init(&w);
	es_ping_rep_encode(&w, &rep);
	reply_ok(d, h, &w);
	st_wbuf_fini(&w);
}

static void handle_stats(struct es_daemon *d, const struct st_msg_header *h)
{
	const struct es_pool_counters *c = &d->pool.v.hdr->c;
	struct es_stats_rep s;
	struct st_wbuf w;

	if (!no_payload(d, h))
		return;
	memset(&s, 0, sizeof(s));
	s.n_slots = d->pool.geom.n_slots;
	s.slots_used = es_pool_slots_used(&d->pool);
	s.record_bytes = d->pool.geom.record_bytes;
	s.pool_bytes = d->pool.shm.size;
	/* under --memory-budget: the slots the experts' share allows now */
	s.budget_bytes = d->pool.allowed ? (uint64_t)d->pool.allowed *
						   d->pool.geom.record_bytes :
					   d->pool.v.hdr->budget_bytes;
	s.hits = atomic_load(&c->hits);
	s.misses = atomic_load(&c->misses);
	s.evictions = atomic_load(&c->evictions);
	s.loads = atomic_load(&c->loads);
	s.load_bytes = atomic_load(&c->load_bytes);
	s.load_ns = atomic_load(&c->load_ns);
	s.checksum_failures = atomic_load(&c->checksum_failures);
	s.epoch = epoch_of(d);
	s.pid = (int32_t)getpid();
	s.n_clients = es_clients_count(&d->pool);
	st_wbuf_init(&w);
	es_stats_rep_encode(&w, &s);
	reply_ok(d, h, &w);
	st_wbuf_fini(&w);
}

/* SHUTDOWN [u32 flags]: ST_SHUTDOWN_F_KEEP_POOL leaves the pool for the
 * next expertd (a restart under a running computed). */
static void handle_shutdown(struct es_daemon *d, const struct st_msg_header *h,
			    const uint8_t *p)
{
	uint32_t flags = 0;

	if (h->payload_len == 4) {
		flags = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
			(uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
		if (flags & ~ST_SHUTDOWN_F_KEEP_POOL) {
			reply_error(d, h, -ST_E_PROTO, "SHUTDOWN: unknown "
				    "flags");
			return;
		}
	} else if (!no_payload(d, h)) {
		return;
	}
	st_info("SHUTDOWN requested by client %u%s", h->client_id,
		flags ? " (keeping the pool for the next expertd)" : "");
	reply_ok(d, h, NULL);
	d->keep_pool = !!(flags & ST_SHUTDOWN_F_KEEP_POOL);
	d->stop = 1;
}

/*
 * ACQUIRE: pins every listed expert for the client and answers at once,
 * per expert READY (use it now) or PENDING (wait for the slot to turn
 * READY).  If any expert cannot be served (no unpinned slot: -ST_E_BUSY;
 * its record failed to load: that error) the pins this request took are
 * given back and the whole request fails with a message naming the expert.
 * A repeated request id (nanomsg re-sent it, possibly to a restarted
 * expertd) does not pin what the first one already pinned.  The request
 * id is recorded before any pin is taken: an expertd killed half-way
 * leaves the id recorded, and the re-sent request then pins exactly the
 * slots where the client holds no pin (those the first one did not reach)
 * instead of pinning every slot a second time (a pin that would never be
 * given back).
 */
static void handle_acquire(struct es_daemon *d, const struct st_msg_header *h,
			   const uint8_t *p)
{
	struct es_pool *pool = &d->pool;
	struct es_pool_view *v = &pool->v;
	struct es_acquire_limits lim = { v->n_layers, v->n_experts,
					 v->n_slots };
	struct st_diag diag = { "" };
	struct es_acquire_req req;
	struct es_acquire_ent *ents;
	uint8_t *pinned;
	struct st_wbuf w;
	uint64_t now = st_now_ns();
	uint64_t prev_rid;
	int c, r = 0, replay;
	uint32_t i;

	r = es_acquire_req_decode(p, h->payload_len, &lim, &req, &diag);
	if (r < 0) {
		reply_error(d, h, r, diag.msg);
		return;
	}
	c = es_clients_lookup(pool, h->client_id, (int32_t)req.pid, &diag);
	if (c < 0) {
		reply_error(d, h, c, diag.msg);
		return;
	}
	prev_rid = atomic_load(&v->clients[c].last_request_id);
	replay = h->request_id != 0 && prev_rid == h->request_id;
	ents = calloc(req.n, sizeof(*ents));
	pinned = calloc(req.n, 1);
	if (!ents || !pinned) {
		free(ents);
		free(pinned);
		reply_error(d, h, -ENOMEM, "out of memory");
		return;
	}
	if (h->request_id && !replay)
		atomic_store(&v->clients[c].last_request_id, h->request_id);
	for (i = 0; i < req.n; i++) {
		uint32_t e = es_acquire_req_expert(&req, i);
		uint64_t key = es_key(req.layer, e);
		size_t ix = es_pool_index(v, req.layer, e);
		char fmsg[700];
		int32_t s;
		int evicted;

		r = es_loader_failure(d->loader, key, fmsg, sizeof(fmsg));
		if (r < 0) {
			st_diag_set(&diag, r, "layer %u expert %u cannot be "
				    "loaded: %s", req.layer, e, fmsg);
			break;
		}
		s = es_pool_slot_of(v, ix);
		if (s >= 0) {
			struct es_slot *sl = &v->slots[s];
			uint32_t st = atomic_load(&sl->state);

			if (!replay || atomic_load(&sl->pins[c]) == 0) {
				atomic_fetch_add(&sl->pins[c], 1);
				pinned[i] = 1;
			}
			atomic_store(&sl->last_use_ns, now);
			if (st == ES_SLOT_LOADING && d->protect && d->protect[s])
				es_loader_promote(d->loader, (uint32_t)s);
			es_tiers_used(d, (uint32_t)s);
			ents[i].status = st == ES_SLOT_READY ? ES_ACQ_READY :
							       ES_ACQ_PENDING;
			ents[i].slot = (uint32_t)s;
			ents[i].gen = atomic_load(&sl->gen);
			if (st == ES_SLOT_READY)
				atomic_fetch_add(&v->hdr->c.hits, 1);
			continue;
		}
		s = es_pool_alloc_slot(pool, 1, &evicted);
		if (s < 0) {
			r = s;
			st_diag_set(&diag, r, "layer %u expert %u: all %u "
				    "slots of the host pool are pinned or "
				    "loading; release experts first or raise "
				    "--host-budget", req.layer, e, v->n_slots);
			break;
		}
		if (evicted) {
			atomic_fetch_add(&v->hdr->c.evictions, 1);
			es_tiers_evicting(d, (uint32_t)s);
			es_pool_slot_clear(pool, (uint32_t)s);
		}
		if (d->protect)
			d->protect[s] = 0;
		es_pool_slot_assign(pool, (uint32_t)s, key);
		atomic_fetch_add(&v->slots[s].pins[c], 1);
		pinned[i] = 1;
		atomic_fetch_add(&v->hdr->c.misses, 1);
		ents[i].status = ES_ACQ_PENDING;
		ents[i].slot = (uint32_t)s;
		ents[i].gen = atomic_load(&v->slots[s].gen);
		r = es_loader_queue(d->loader, (uint32_t)s, key);
		if (r < 0) {
			/* Not reachable (one queue entry per slot); keep the
			 * slot consistent anyway. */
			es_pin_drop(&v->slots[s].pins[c]);
			pinned[i] = 0;
			es_pool_slot_publish(pool, (uint32_t)s, r);
			st_diag_set(&diag, r, "layer %u expert %u: load queue "
				    "full", req.layer, e);
			break;
		}
	}
	if (r < 0) {
		for (uint32_t j = 0; j < req.n; j++)
			if (pinned[j])
				es_pin_drop(&v->slots[ents[j].slot].pins[c]);
		/* nothing of it stays: a re-send is a new request */
		atomic_store(&v->clients[c].last_request_id, prev_rid);
		reply_error(d, h, r, diag.msg);
	} else {
		st_wbuf_init(&w);
		es_acquire_rep_encode(&w, req.n, ents);
		reply_ok(d, h, &w);
		st_wbuf_fini(&w);
		for (i = 0; i < req.n; i++) /* device tier (es_devpool.h) */
			es_devpool_want(d, c, req.layer,
					es_acquire_req_expert(&req, i), 0);
	}
	free(ents);
	free(pinned);
}

/* DEV_EXPORT / DEV_REVOKE: the device expert pool (es_devpool.h). */
static void handle_devpool(struct es_daemon *d, const struct st_msg_header *h,
			   const uint8_t *p)
{
	struct st_diag diag = { "" };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	r = es_devpool_handle(d, h->type, p, h->payload_len, &w, &diag);
	if (r < 0)
		reply_error(d, h, r, diag.msg);
	else
		reply_ok(d, h, &w);
	st_wbuf_fini(&w);
}

/* RELEASE: drops one pin of the client on each listed expert it holds
 * (the client library unpins with atomics; this is for clients without
 * the mapping).  Experts not pinned by the client are ignored. */
static void handle_release(struct es_daemon *d, const struct st_msg_header *h,
			   const uint8_t *p)
{
	struct es_pool_view *v = &d->pool.v;
	struct es_acquire_limits lim = { v->n_layers, v->n_experts,
					 v->n_slots };
	struct st_diag diag = { "" };
	struct es_acquire_req req;
	int c, r;

	r = es_acquire_req_decode(p, h->payload_len, &lim, &req, &diag);
	if (r < 0) {
		reply_error(d, h, r, diag.msg);
		return;
	}
	c = es_clients_lookup(&d->pool, h->client_id, (int32_t)req.pid, &diag);
	if (c < 0) {
		reply_error(d, h, c, diag.msg);
		return;
	}
	for (uint32_t i = 0; i < req.n; i++) {
		uint32_t e = es_acquire_req_expert(&req, i);
		int32_t s = es_pool_slot_of(v, es_pool_index(v, req.layer, e));

		if (s >= 0)
			es_pin_drop(&v->slots[s].pins[c]);
	}
	reply_ok(d, h, NULL);
}

/* ROUTE: a client's routing of one layer (activation statistics) and the
 * experts its gate look-ahead expects next (prefetch hint). */
static void handle_route(struct es_daemon *d, const struct st_msg_header *h,
			 const uint8_t *p)
{
	struct es_pool_view *v = &d->pool.v;
	struct es_acquire_limits lim = { v->n_layers, v->n_experts,
					 v->n_slots };
	struct st_diag diag = { "" };
	struct es_route_req req;
	int c, r;

	r = es_route_req_decode(p, h->payload_len, &lim, &req, &diag);
	if (r < 0) {
		reply_error(d, h, r, diag.msg);
		return;
	}
	c = es_clients_lookup(&d->pool, h->client_id, (int32_t)req.pid, &diag);
	if (c < 0) {
		reply_error(d, h, c, diag.msg);
		return;
	}
	/* answer first: the client does not wait for the prefetch starts */
	reply_ok(d, h, NULL);
	es_tiers_route(d, c, &req);
}

/* ENGRAM_OPEN / ENGRAM: es_engram.c does the work (queued, no I/O here). */
static void handle_engram(struct es_daemon *d, const struct st_msg_header *h,
			  const uint8_t *p)
{
	struct st_diag diag = { "" };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	r = es_engram_handle(d, h, p, &w, &diag);
	if (r < 0)
		reply_error(d, h, r, diag.msg);
	else
		reply_ok(d, h, &w);
	st_wbuf_fini(&w);
}

/* Reads a little-endian u16/u32/u64 of a raw (unvalidated) header. */
static uint64_t raw_le(const uint8_t *b, int n)
{
	uint64_t x = 0;

	for (int i = 0; i < n; i++)
		x |= (uint64_t)b[i] << (8 * i);
	return x;
}

void es_server_handle(struct es_daemon *d, const uint8_t *buf, size_t len)
{
	struct st_msg_header h;
	const uint8_t *payload = buf + ST_PROTO_HEADER_BYTES;
	char msg[256];
	int r = st_proto_decode_header(buf, len, &h);

	if (r < 0) {
		/* Answer in our own format, echoing what can be read. */
		memset(&h, 0, sizeof(h));
		if (len >= ST_PROTO_HEADER_BYTES) {
			h.type = (uint16_t)raw_le(buf + 6, 2);
			h.request_id = raw_le(buf + 8, 8);
			h.client_id = (uint32_t)raw_le(buf + 16, 4);
		}
		h.type &= (uint16_t)~ST_MSG_REPLY;
		if (r == -ST_E_BADMAGIC)
			snprintf(msg, sizeof(msg), "bad magic: not a strata "
				 "message");
		else if (r == -ST_E_VERSION)
			snprintf(msg, sizeof(msg), "wire protocol version %u, "
				 "expertd speaks %d; use matching builds",
				 (unsigned)raw_le(buf + 4, 2), ST_PROTO_VERSION);
		else if (len < ST_PROTO_HEADER_BYTES)
			snprintf(msg, sizeof(msg), "message of %zu bytes is "
				 "shorter than the %d-byte header", len,
				 ST_PROTO_HEADER_BYTES);
		else
			snprintf(msg, sizeof(msg), "header says %u payload "
				 "bytes, message has %zu (or reserved "
				 "field not 0)",
				 (unsigned)raw_le(buf + 24, 4),
				 len - ST_PROTO_HEADER_BYTES);
		reply_error(d, &h, r, msg);
		return;
	}
	switch (h.type) {
	case ST_MSG_HELLO: handle_hello(d, &h, payload); break;
	case ST_MSG_BYE: handle_bye(d, &h); break;
	case ST_MSG_PING: handle_ping(d, &h); break;
	case ST_MSG_STATS: handle_stats(d, &h); break;
	case ST_MSG_SHUTDOWN: handle_shutdown(d, &h, payload); break;
	case ES_MSG_ACQUIRE: handle_acquire(d, &h, payload); break;
	case ES_MSG_RELEASE: handle_release(d, &h, payload); break;
	case ES_MSG_ROUTE: handle_route(d, &h, payload); break;
	case ES_MSG_ENGRAM_OPEN:
	case ES_MSG_ENGRAM: handle_engram(d, &h, payload); break;
	case ST_MSG_DEV_EXPORT:
	case ST_MSG_DEV_REVOKE: handle_devpool(d, &h, payload); break;
	default:
		snprintf(msg, sizeof(msg), "unknown message type 0x%04x for "
			 "expertd", h.type);
		h.type &= (uint16_t)~ST_MSG_REPLY;
		reply_error(d, &h, -ST_E_PROTO, msg);
		break;
	}
}

int es_server_bind(struct es_daemon *d, struct st_diag *diag)
{
	int r;

	if (st_run_path(d->opt.run_dir, ES_DAEMON_NAME, "ctl", d->ctl_path,
			sizeof(d->ctl_path)) < 0 ||
	    st_run_path(d->opt.run_dir, ES_DAEMON_NAME, "evt", d->evt_path,
			sizeof(d->evt_path)) < 0)
		return st_diag_set(diag, -ENAMETOOLONG,
				   "run directory path too long: %s",
				   d->opt.run_dir);
	d->rep.fd = d->pub.fd = -1;
	/* A reply is never worth blocking for: 1 s send time-out. */
	r = st_sock_open(&d->rep, ST_SOCK_REP, d->ctl_path, 1000,
			 ES_REAP_INTERVAL_MS);
	if (r < 0)
		return st_diag_set(diag, r, "cannot bind %s: %s%s", d->ctl_path,
				   st_strerror(r),
				   r == -EADDRINUSE ? " (another expertd is "
				   "serving this run directory)" : "");
	r = st_sock_open(&d->pub, ST_SOCK_PUB, d->evt_path, 100, -1);
	if (r < 0) {
		st_sock_close(&d->rep);
		return st_diag_set(diag, r, "cannot bind %s: %s", d->evt_path,
				   st_strerror(r));
	}
	return 0;
}

void es_server_publish(struct es_daemon *d, uint16_t type)
{
	struct st_wbuf pl, msg;

	if (d->pub.fd < 0)
		return;
	st_wbuf_init(&pl);
	st_wbuf_init(&msg);
	es_event_encode(&pl, (uint32_t)getpid(), epoch_of(d));
	if (!pl.err && st_proto_encode(&msg, type, 0, 0, 0, pl.data, pl.len) ==
			       0)
		(void)st_sock_send(&d->pub, msg.data, msg.len);
	st_wbuf_fini(&pl);
	st_wbuf_fini(&msg);
}

int es_server_run(struct es_daemon *d)
{
	int wait_ms = ES_REAP_INTERVAL_MS;

	d->next_reap_ns = st_now_ns();
	while (!d->stop) {
		void *buf = NULL;
		size_t len = 0;
		uint64_t now;
		int r, want;

		r = st_sock_recv(&d->rep, &buf, &len);

		if (r == 0) {
			es_server_handle(d, buf, len);
			free(buf);
		} else if (r != -ST_E_TIMEOUT && r != -EINTR) {
			st_warn("receive on %s failed: %s", d->ctl_path,
				st_strerror(r));
			st_sleep_ns(10000000); /* do not spin on a broken socket */
		}
		if (st_stop_signals_pending(d->sig_fd)) {
			st_info("stop signal received");
			d->stop = 1;
		}
		now = st_now_ns();
		if (now >= d->next_reap_ns) {
			es_clients_reap(&d->pool);
			d->next_reap_ns = now + ES_REAP_INTERVAL_MS * 1000000ull;
		}
		/* prefetches waiting for a free loader: look again soon */
		want = es_tiers_tick(d);
		r = es_devpool_tick(d);
		if (r >= 0 && r < want)
			want = r;
		r = es_budget_tick(d); /* --memory-budget: obey, report */
		if (r < want)
			want = r;
		if (want != wait_ms && st_sock_set_recv_timeout(&d->rep,
								want) == 0)
			wait_ms = want;
	}
	return 0;
}

void es_server_close(struct es_daemon *d)
{
	st_sock_close(&d->rep);
	st_sock_close(&d->pub);
	if (d->ctl_path[0])
		unlink(d->ctl_path);
	if (d->evt_path[0])
		unlink(d->evt_path);
}
