/*
 * es_client.c — client side of expertd (es_client.h): HELLO over the REQ
 * socket, the pool segment attached read-write (clients write only their
 * own pins, the last use of a slot they hit and the hit counter), fast-path
 * pins with atomics and one ACQUIRE message per call for the misses.
 *
 * Every pin this handle holds is recorded in a per-slot ledger (key,
 * generation, count) so that release and close give back exactly what was
 * taken.  The pin protocol and why it is race-free: proto/es_pool.h.
 *
 * Threads: calls on one handle may come from several threads; requests on
 * the socket are serialized (rpc_mu), the ledger has its own lock (mu), and
 * waiting for loads holds neither.
 */
#include "es_client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "es_client_int.h"
#include "es_pool.h"
#include "es_proto.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_util.h"

/* What this handle holds in one slot. */
struct es_ledger_ent {
	uint64_t key;
	uint32_t gen;
	uint32_t count;
};

struct es_client {
	char ctl_path[1100];
	char instance[64];
	int timeout_ms;
	pthread_mutex_t rpc_mu;     /* socket and request ids */
	struct st_sock sock;
	uint64_t next_request_id;
	uint32_t client_id;
	int cidx;                   /* client table index = pins[] index */
	struct st_shm shm;
	struct es_pool_view v;
	uint64_t store_id;
	uint64_t layout_hash;
	uint64_t epoch;             /* at open */
	uint32_t top_k;
	char name[ES_CLIENT_NAME_BYTES + 1];
	int restart_wait_ms;        /* 0: a dead expertd is an error at once */
	_Atomic int abort_wait;     /* es_client_abort_wait: stop waiting */
	int32_t peer_pid;           /* the expertd our last HELLO reached */
	_Atomic uint32_t reconnects;
	pthread_mutex_t mu;         /* ledger */
	struct es_ledger_ent *ledger; /* [n_slots] */
	struct es_client_engram *engram; /* es_client_engram.c, lazily */
	struct {                    /* es_client_timing (step timeline) */
		_Atomic uint64_t rpcs, rpc_ns, acquire_rpc_ns;
		_Atomic uint64_t wait_demand_ns, wait_inflight_ns;
		_Atomic uint64_t waits_demand, waits_inflight;
	} tm;
};

/* A pending or held pin of one acquire call. */
struct acq_item {
	int expert;
	uint64_t key;
	int32_t slot;    /* -1: not pinned yet */
	uint32_t gen;
	int ready;
};

#ifdef MADV_POPULATE_READ
#define ES_MADV_POPULATE_READ MADV_POPULATE_READ
#else
#define ES_MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

/*
 * Maps every page of the attached pool into this process's page tables
 * now.  expertd allocated them when it made the pool (es_pool.c), but each
 * process that maps a shared segment takes its own page fault on the first
 * touch of each page: without this, the first use of every slot cost the
 * compute thread one fault per few pages of the record (about 570 per
 * 17.9 MiB record, measured with the step timeline, issue 25), in the
 * middle of the expert's kernel.  Best effort: a kernel without
 * MADV_POPULATE_READ (before 5.14) faults them in on first use as before.
 */
static void map_pool_pages(struct es_client *c)
{
	char path[160];
	struct stat st;
	size_t head;

	/* A sparse pool (expertd --memory-budget) has pages only where a
	 * slot holds a record: a read fault on a hole of tmpfs would
	 * allocate it, so only the tables and the records in use are
	 * mapped; later loads fault in on first use.  (A record given back
	 * while this maps it gets pages again; expertd's sweep returns
	 * them, es_budget.c.) */
	if (snprintf(path, sizeof(path), "/dev/shm%s", c->shm.name) <
		    (int)sizeof(path) &&
	    stat(path, &st) == 0 &&
	    (uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size) {
		head = (size_t)(c->v.data - (uint8_t *)c->shm.base);
		if (madvise(c->shm.base, head, ES_MADV_POPULATE_READ) < 0)
			goto fail;
		for (uint32_t s = 0; s < c->v.n_slots; s++)
			if (atomic_load(&c->v.slots[s].state) ==
				    ES_SLOT_READY &&
			    madvise(es_pool_record(&c->v, s),
				    c->v.record_bytes,
				    ES_MADV_POPULATE_READ) < 0)
				goto fail;
		return;
	}
	if (madvise(c->shm.base, c->shm.size, ES_MADV_POPULATE_READ) < 0)
		goto fail;
	return;
fail:
	st_debug("cannot map the expert pool's pages ahead: %s",
		 strerror(errno));
}

/* The expertd process is alive (and not a zombie). */
static int peer_alive(int32_t pid)
{
	char path[64], *txt = NULL, *rp;
	int alive;

	if (pid <= 0 || !st_pid_alive(pid))
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (st_read_file(path, &txt, NULL) < 0)
		return 1;
	rp = strrchr(txt, ')');
	alive = !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
	free(txt);
	return alive;
}

/* expertd's pid as the segment header says (the segment is attached). */
/* Our start time for HELLO (0 when /proc cannot tell). */
static uint64_t self_start_ticks(void)
{
	uint64_t t = 0;

	return st_pid_start_ticks((int)getpid(), &t) == 0 ? t : 0;
}

static int32_t owner_pid(const struct es_client *c)
{
	return atomic_load(&st_shm_hdr(&c->shm)->owner_pid);
}

/* (Re)opens the REQ socket.  Receives wait in slices of at most 50 ms so
 * a dead expertd is noticed quickly (rpc_locked checks its pid between
 * slices). */
static int sock_reopen(struct es_client *c)
{
	st_sock_close(&c->sock);
	return st_sock_open(&c->sock, ST_SOCK_REQ, c->ctl_path, c->timeout_ms,
			    ST_MIN(c->timeout_ms, 50));
}

static int resume_locked(struct es_client *c, struct st_diag *diag);

/*
 * One request/reply on the REQ socket; the caller holds rpc_mu.  A dead or
 * silent expertd gives -ST_E_PEERGONE / -ST_E_TIMEOUT, and then the socket
 * is re-opened: nanomsg would otherwise re-send the abandoned request when
 * it reconnects (to a restarted expertd), which would act on it after we
 * gave up.  An error reply gives its status with the message in diag.  On
 * success *ret_buf (owned by the caller) holds the reply and *ret_p /
 * *ret_len its payload.
 */
static int rpc_locked_once(struct es_client *c, uint16_t type,
			   const struct st_wbuf *pl, void **ret_buf,
			   const uint8_t **ret_p, size_t *ret_len,
			   struct st_diag *diag)
{
	uint64_t id = c->next_request_id++;
	uint64_t deadline = st_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
	struct st_msg_header h;
	struct st_wbuf w;
	void *buf = NULL;
	size_t len = 0;
	int r;

	if (ret_buf)
		*ret_buf = NULL;
	if (c->shm.base && !peer_alive(owner_pid(c))) {
		r = -ST_E_PEERGONE;
		goto transport;
	}
	/* Another expertd adopted the pool since our last HELLO: say HELLO
	 * to it first (versions are checked again; it may refuse us). */
	if (type != ST_MSG_HELLO && type != ST_MSG_BYE && c->shm.base &&
	    c->peer_pid && owner_pid(c) != c->peer_pid) {
		r = resume_locked(c, diag);
		if (r < 0)
			return r;
		id = c->next_request_id++;
	}
	if (c->sock.fd < 0 && sock_reopen(c) < 0) {
		r = -ST_E_PEERGONE;
		goto transport;
	}
	st_wbuf_init(&w);
	r = st_proto_encode(&w, type, id, c->client_id, 0,
			    pl ? pl->data : NULL, pl ? pl->len : 0);
	if (r == 0)
		r = st_sock_send(&c->sock, w.data, w.len);
	st_wbuf_fini(&w);
	if (r < 0)
		goto transport;
	for (;;) {
		r = st_sock_recv(&c->sock, &buf, &len);
		if (r == 0) {
			if (st_proto_decode_header(buf, len, &h) == 0 &&
			    h.type == (type | ST_MSG_REPLY) &&
			    h.request_id == id)
				break;
			free(buf); /* a stale or foreign reply */
			buf = NULL;
			continue;
		}
		if (r == -EINTR)
			continue;
		if (r != -ST_E_TIMEOUT)
			goto transport;
		if (c->shm.base && !peer_alive(owner_pid(c))) {
			r = -ST_E_PEERGONE;
			goto transport;
		}
		if (st_now_ns() > deadline)
			goto transport;
	}
	if (h.status < 0) {
		char msg[ES_ERROR_MAX_BYTES + 1];

		es_error_decode((const uint8_t *)buf + ST_PROTO_HEADER_BYTES,
				h.payload_len, msg, sizeof(msg));
		free(buf);
		return st_diag_set(diag, h.status, "expertd refused %s: %s",
				   es_proto_type_name(type),
				   msg[0] ? msg : st_strerror(h.status));
	}
	if (ret_buf) {
		*ret_buf = buf;
		*ret_p = (const uint8_t *)buf + ST_PROTO_HEADER_BYTES;
		*ret_len = h.payload_len;
	} else {
		free(buf);
	}
	return 0;

transport:
	sock_reopen(c); /* drop the abandoned request (see above) */
	if (r == -ST_E_TIMEOUT && !c->shm.base)
		r = -ST_E_PEERGONE; /* nobody answered HELLO */
	if (r == -ST_E_PEERGONE || r == -ST_E_TIMEOUT)
		return st_diag_set(diag, r, "expertd at %s %s %s%s",
				   c->ctl_path,
				   r == -ST_E_TIMEOUT && c->shm.base ?
				   "did not answer in time:" : "is gone:",
				   es_proto_type_name(type),
				   r == -ST_E_PEERGONE ?
				   " (not running? start it with expertd "
				   "--store DIR)" : "");
	return st_diag_set(diag, r, "%s to expertd at %s failed: %s",
			   es_proto_type_name(type), c->ctl_path,
			   st_strerror(r));
}

/* rpc_locked_once, its round trip counted in c->tm (whatever the end). */
static int rpc_locked(struct es_client *c, uint16_t type,
		      const struct st_wbuf *pl, void **ret_buf,
		      const uint8_t **ret_p, size_t *ret_len,
		      struct st_diag *diag)
{
	uint64_t t0 = st_now_ns();
	int r = rpc_locked_once(c, type, pl, ret_buf, ret_p, ret_len, diag);

	atomic_fetch_add_explicit(&c->tm.rpcs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&c->tm.rpc_ns, st_now_ns() - t0,
				  memory_order_relaxed);
	return r;
}

static int rpc(struct es_client *c, uint16_t type, const struct st_wbuf *pl,
	       void **ret_buf, const uint8_t **ret_p, size_t *ret_len,
	       struct st_diag *diag)
{
	int r;

	pthread_mutex_lock(&c->rpc_mu);
	r = rpc_locked(c, type, pl, ret_buf, ret_p, ret_len, diag);
	pthread_mutex_unlock(&c->rpc_mu);
	return r;
}

/* ---- for es_client_engram.c (es_client_int.h) ---- */

int es_client_rpc(struct es_client *c, uint16_t type, const struct st_wbuf *pl,
		  void **ret_buf, const uint8_t **ret_p, size_t *ret_len,
		  struct st_diag *diag)
{
	return rpc(c, type, pl, ret_buf, ret_p, ret_len, diag);
}

const char *es_client_instance(const struct es_client *c)
{
	return c->instance;
}

int es_client_timeout_ms(const struct es_client *c)
{
	return c->timeout_ms;
}

struct es_client_engram **es_client_engram_ptr(struct es_client *c)
{
	return &c->engram;
}

/* ---- ledger (under c->mu) ---- */

static void ledger_add(struct es_client *c, int32_t s, uint64_t key,
		       uint32_t gen)
{
	struct es_ledger_ent *e = &c->ledger[s];

	if (e->count && (e->key != key || e->gen != gen)) {
		/* Our pins on s would have kept it from being reassigned, so
		 * the old entry no longer matches the segment (a restarted
		 * expertd cleared it); start over from what is there. */
		e->count = 0;
	}
	e->key = key;
	e->gen = gen;
	e->count++;
}

/* Gives back one pin of slot s (held by this handle).  Only while the
 * slot still holds the key and generation we pinned: else an expertd that
 * adopted the segment discarded it and zeroed its pins (es_pool.h), and
 * the pin there now is nobody's of ours. */
static void ledger_drop(struct es_client *c, int32_t s)
{
	struct es_ledger_ent *e = &c->ledger[s];
	struct es_slot *sl = &c->v.slots[s];

	if (!e->count)
		return;
	if (atomic_load(&sl->key) != e->key ||
	    atomic_load(&sl->gen) != e->gen) {
		e->count = 0;
		return;
	}
	e->count--;
	es_pin_drop(&sl->pins[c->cidx]);
}

/* Forgets our pins on slot s of generation gen without touching the
 * segment: a restarted expertd discarded that slot and cleared its pins. */
static void ledger_forget(struct es_client *c, int32_t s, uint32_t gen)
{
	if (c->ledger[s].gen == gen)
		c->ledger[s].count = 0;
}

/* Slot where this handle holds `key`, or -1. */
static int32_t ledger_find(struct es_client *c, uint32_t layer,
			   uint32_t expert)
{
	uint64_t key = es_key(layer, expert);
	int32_t s = atomic_load(&c->v.slot_of[es_pool_index(&c->v, layer,
							    expert)]);

	if (s >= 0 && (uint32_t)s < c->v.n_slots && c->ledger[s].count &&
	    c->ledger[s].key == key)
		return s;
	for (uint32_t i = 0; i < c->v.n_slots; i++)
		if (c->ledger[i].count && c->ledger[i].key == key)
			return (int32_t)i;
	return -1;
}

static void drop_items(struct es_client *c, struct acq_item *it, int n)
{
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < n; i++)
		if (it[i].slot >= 0) {
			ledger_drop(c, it[i].slot);
			it[i].slot = -1;
		}
	pthread_mutex_unlock(&c->mu);
}

/* ---- open / close ---- */

int es_client_open(const char *run_dir, const char *instance, const char *name,
		   int timeout_ms, struct es_client **ret, struct st_diag *diag)
{
	struct es_client *c;
	struct es_hello_rep rep;
	struct st_wbuf w;
	void *buf = NULL;
	const uint8_t *p;
	size_t len;
	char shm_name[128];
	int r;

	*ret = NULL;
	if (!run_dir || !instance || timeout_ms <= 0)
		return st_diag_set(diag, -EINVAL, "es_client_open: run_dir, "
				   "instance and a positive timeout needed");
	if (st_shm_name(instance, ES_POOL_KIND, shm_name, sizeof(shm_name)) < 0)
		return st_diag_set(diag, -EINVAL, "bad instance name '%s'",
				   instance);
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->sock.fd = -1;
	c->timeout_ms = timeout_ms;
	c->next_request_id = 1;
	snprintf(c->instance, sizeof(c->instance), "%s", instance);
	pthread_mutex_init(&c->rpc_mu, NULL);
	pthread_mutex_init(&c->mu, NULL);
	if (st_run_path(run_dir, "expertd", "ctl", c->ctl_path,
			sizeof(c->ctl_path)) < 0) {
		r = st_diag_set(diag, -ENAMETOOLONG, "run dir too long: %s",
				run_dir);
		goto fail;
	}
	if (!st_path_exists(c->ctl_path)) {
		r = st_diag_set(diag, -ST_E_PEERGONE,
				"no expertd socket at %s: start expertd "
				"(expertd --store DIR --instance %s --run-dir "
				"%s) first", c->ctl_path, instance, run_dir);
		goto fail;
	}
	r = sock_reopen(c);
	if (r < 0) {
		r = st_diag_set(diag, r, "cannot connect to %s: %s",
				c->ctl_path, st_strerror(r));
		goto fail;
	}
	st_wbuf_init(&w);
	es_hello_req_encode(&w, (uint32_t)getpid(), ES_PROTO_VERSION,
			    name ? name : "", self_start_ticks());
	r = w.err ? w.err : rpc(c, ST_MSG_HELLO, &w, &buf, &p, &len, diag);
	st_wbuf_fini(&w);
	if (r < 0)
		goto fail;
	r = es_hello_rep_decode(p, len, &rep, diag);
	free(buf);
	if (r < 0)
		goto fail;
	c->client_id = rep.client_id;
	c->cidx = (int)es_client_id_index(rep.client_id);
	c->store_id = rep.store_id;
	c->layout_hash = rep.layout_hash;
	c->peer_pid = (int32_t)rep.pid;
	c->top_k = rep.top_k;
	snprintf(c->name, sizeof(c->name), "%s", name ? name : "");
	if (rep.pool_layout != ES_POOL_LAYOUT_VERSION) {
		r = st_diag_set(diag, -ST_E_VERSION,
				"expertd's pool layout is version %u, this "
				"client uses %d; use matching builds",
				rep.pool_layout, ES_POOL_LAYOUT_VERSION);
		goto fail_bye;
	}
	r = st_shm_attach(&c->shm, instance, ES_POOL_KIND,
			  ES_POOL_LAYOUT_VERSION, rep.layout_hash, diag);
	if (r == -ENOENT)
		r = st_diag_set(diag, -ST_E_PEERGONE, "expertd answered but "
				"shm %s does not exist (instance '%s' vs the "
				"daemon's --instance?)", shm_name, instance);
	if (r < 0)
		goto fail_bye;
	r = es_pool_view_init(c->shm.base, c->shm.size, rep.store_id, &c->v,
			      diag);
	if (r == 0 && st_shm_hdr(&c->shm)->pool_id != rep.pool_id)
		r = st_diag_set(diag, -ST_E_STALE, "shm %s is another expert "
				"pool than the one expertd serves (it was "
				"made again meanwhile); try again", shm_name);
	if (r == 0 && (c->v.n_layers != rep.n_layers ||
		       c->v.n_experts != rep.n_experts ||
		       c->v.n_slots != rep.n_slots ||
		       c->v.record_bytes != rep.record_bytes))
		r = st_diag_set(diag, -ST_E_FORMAT, "shm %s: geometry differs "
				"from expertd's HELLO", shm_name);
	if (r < 0)
		goto fail_bye;
	map_pool_pages(c);
	c->epoch = atomic_load(&c->v.shm->epoch);
	c->ledger = calloc(c->v.n_slots, sizeof(*c->ledger));
	if (!c->ledger) {
		r = -ENOMEM;
		goto fail_bye;
	}
	*ret = c;
	return 0;

fail_bye:
	(void)rpc(c, ST_MSG_BYE, NULL, NULL, NULL, NULL, NULL);
fail:
	st_shm_detach(&c->shm);
	st_sock_close(&c->sock);
	pthread_mutex_destroy(&c->rpc_mu);
	pthread_mutex_destroy(&c->mu);
	free(c);
	return r;
}

void es_client_close(struct es_client *c)
{
	if (!c)
		return;
	if (c->ledger) {
		pthread_mutex_lock(&c->mu);
		for (uint32_t s = 0; s < c->v.n_slots; s++)
			while (c->ledger[s].count)
				ledger_drop(c, (int32_t)s);
		pthread_mutex_unlock(&c->mu);
	}
	if (c->shm.base && peer_alive(owner_pid(c))) {
		/* BYE should not make a closing process wait long. */
		pthread_mutex_lock(&c->rpc_mu);
		c->timeout_ms = ST_MIN(c->timeout_ms, 1000);
		(void)rpc_locked(c, ST_MSG_BYE, NULL, NULL, NULL, NULL, NULL);
		pthread_mutex_unlock(&c->rpc_mu);
	}
	es_client_engram_fini(c->engram);
	st_shm_detach(&c->shm);
	st_sock_close(&c->sock);
	pthread_mutex_destroy(&c->rpc_mu);
	pthread_mutex_destroy(&c->mu);
	free(c->ledger);
	free(c);
}

int es_client_n_layers(const struct es_client *c) { return (int)c->v.n_layers; }
int es_client_n_experts(const struct es_client *c) { return (int)c->v.n_experts; }
uint64_t es_client_record_bytes(const struct es_client *c) { return c->v.record_bytes; }
uint64_t es_client_store_id(const struct es_client *c) { return c->store_id; }
int es_client_n_slots(const struct es_client *c) { return (int)c->v.n_slots; }
int es_client_top_k(const struct es_client *c) { return (int)c->top_k; }
uint32_t es_client_id(const struct es_client *c) { return c->client_id; }

/* ---- acquire / release ---- */

/*
 * After an ACQUIRE whose reply never came (expertd died or timed out): pins
 * expertd may have taken for us on these experts are not in the ledger;
 * bring our pin count of each such slot back to what the ledger holds.
 * Called with rpc_mu held (no other ACQUIRE in flight) and takes mu (no
 * fast-path pin in progress).  If a slow but live expertd still handles
 * the abandoned request after this, its pins leak until close (the socket
 * was re-opened, so at least nanomsg does not re-send it).
 */
static void reconcile(struct es_client *c, int layer, const int *ids, int m)
{
	pthread_mutex_lock(&c->mu);
	for (int j = 0; j < m; j++) {
		uint64_t key = es_key((uint32_t)layer, (uint32_t)ids[j]);
		int32_t s = atomic_load(&c->v.slot_of[es_pool_index(
			&c->v, (uint32_t)layer, (uint32_t)ids[j])]);
		struct es_ledger_ent *e;
		_Atomic uint32_t *pin;
		uint32_t held, cur;

		if (s < 0 || (uint32_t)s >= c->v.n_slots)
			continue;
		e = &c->ledger[s];
		held = e->count && e->key == key &&
				       e->gen == atomic_load(&c->v.slots[s].gen) ?
			       e->count : 0;
		pin = &c->v.slots[s].pins[c->cidx];
		cur = atomic_load(pin);
		while (cur > held &&
		       !atomic_compare_exchange_weak(pin, &cur, held))
			;
	}
	pthread_mutex_unlock(&c->mu);
}

/* Sends one ACQUIRE for the items without a pin and records the pins
 * expertd took for us.  On error nothing of this request stays pinned. */
static int acquire_misses(struct es_client *c, int layer, struct acq_item *it,
			  int n, struct st_diag *diag)
{
	struct es_acquire_ent *ents;
	struct st_wbuf w;
	int ids[n > 0 ? n : 1], idx[n > 0 ? n : 1], m = 0;
	void *buf = NULL;
	const uint8_t *p;
	size_t len;
	uint64_t t0;
	int r;

	for (int i = 0; i < n; i++)
		if (it[i].slot < 0) {
			idx[m] = i;
			ids[m++] = it[i].expert;
		}
	if (!m)
		return 0;
	st_wbuf_init(&w);
	es_acquire_req_encode(&w, (uint32_t)getpid(), (uint32_t)layer,
			      (uint32_t)m, ids);
	/* rpc_mu stays held until the pins expertd took are in the ledger,
	 * so reconcile() below never mistakes another thread's fresh pins
	 * for leftovers. */
	pthread_mutex_lock(&c->rpc_mu);
	t0 = st_now_ns();
	r = w.err ? w.err :
		    rpc_locked(c, ES_MSG_ACQUIRE, &w, &buf, &p, &len, diag);
	atomic_fetch_add_explicit(&c->tm.acquire_rpc_ns, st_now_ns() - t0,
				  memory_order_relaxed);
	st_wbuf_fini(&w);
	if (r == -ST_E_PEERGONE || r == -ST_E_TIMEOUT)
		reconcile(c, layer, ids, m);
	if (r < 0) {
		pthread_mutex_unlock(&c->rpc_mu);
		return r;
	}
	ents = calloc((size_t)m, sizeof(*ents));
	if (!ents) {
		free(buf);
		pthread_mutex_unlock(&c->rpc_mu);
		return -ENOMEM;
	}
	r = es_acquire_rep_decode(p, len, (uint32_t)m, c->v.n_slots, ents,
				  diag);
	free(buf);
	pthread_mutex_lock(&c->mu);
	for (int j = 0; j < m && r == 0; j++) {
		struct acq_item *x = &it[idx[j]];

		x->slot = (int32_t)ents[j].slot;
		x->gen = ents[j].gen;
		x->ready = 0; /* re-checked in the wait loop */
		ledger_add(c, x->slot, x->key, x->gen);
	}
	pthread_mutex_unlock(&c->mu);
	if (r < 0)
		reconcile(c, layer, ids, m); /* a garbled reply */
	pthread_mutex_unlock(&c->rpc_mu);
	free(ents);
	return r;
}

/*
 * A load failed while we waited: expertd keeps the failure with its full
 * message (file and record), and refuses a new ACQUIRE of that expert at
 * once with it, without pinning or reading anything.  Ask, to hand the
 * caller that message; keep ours if the answer is anything else.
 */
static void failure_detail(struct es_client *c, int layer, int expert,
			   int err, struct st_diag *diag)
{
	struct st_diag d2 = { "" };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	es_acquire_req_encode(&w, (uint32_t)getpid(), (uint32_t)layer, 1,
			      &expert);
	pthread_mutex_lock(&c->rpc_mu);
	r = w.err ? w.err : rpc_locked(c, ES_MSG_ACQUIRE, &w, NULL, NULL, NULL,
				       &d2);
	if (r == 0) /* loads fine now (cannot happen today): give it back */
		reconcile(c, layer, &expert, 1);
	pthread_mutex_unlock(&c->rpc_mu);
	st_wbuf_fini(&w);
	if (r == err && diag)
		snprintf(diag->msg, sizeof(diag->msg), "%s", d2.msg);
}

/* Per-expert hand-over (es_client_acquire_each): fn(arg, idx[i], record)
 * for item i as soon as it is READY, fn(arg, -1, NULL) once the misses'
 * ACQUIRE is sent (or all were hits); done[i] marks items handed over. */
struct acq_each {
	es_acquire_fn fn;
	void *arg;
	const int *idx;
	uint8_t *done;
	int *idle_done;
	uint64_t *fn_ns;   /* time spent in fn (not waiting) */
};

static void each_ready(struct es_client *c, const struct acq_each *ea,
		       int i, int32_t slot)
{
	uint64_t t0;

	if (!ea || ea->done[i])
		return;
	ea->done[i] = 1;
	t0 = st_now_ns();
	ea->fn(ea->arg, ea->idx[i], es_pool_record(&c->v, (uint32_t)slot));
	*ea->fn_ns += st_now_ns() - t0;
}

static void each_idle(const struct acq_each *ea)
{
	if (ea && !*ea->idle_done) {
		uint64_t t0 = st_now_ns();

		*ea->idle_done = 1;
		ea->fn(ea->arg, -1, NULL);
		*ea->fn_ns += st_now_ns() - t0;
	}
}

static int acquire_once(struct es_client *c, int layer, int n,
			const int *experts, const uint8_t **ret_records,
			const struct acq_each *ea, struct st_diag *diag)
{
	struct acq_item *it;
	uint64_t t0 = st_now_ns(), deadline, next_alive_check;
	uint64_t sleep_ns = 0, t_slow = 0, fn0 = 0;
	int r = 0, n_ready = 0, failed_expert = -1, demand = -1;

	if (!c || !experts || (!ret_records && !ea) || layer < 0 ||
	    (uint32_t)layer >= c->v.n_layers || n <= 0 ||
	    (uint32_t)n > c->v.n_slots)
		return st_diag_set(diag, -EINVAL,
				   "es_client_acquire: layer %d (of %u), n %d "
				   "(1..%u slots)", layer, c ? c->v.n_layers : 0,
				   n, c ? c->v.n_slots : 0);
	for (int i = 0; i < n; i++) {
		if (experts[i] < 0 || (uint32_t)experts[i] >= c->v.n_experts)
			return st_diag_set(diag, -EINVAL, "es_client_acquire: "
					   "expert %d out of range (%u experts)",
					   experts[i], c->v.n_experts);
		for (int j = 0; j < i; j++)
			if (experts[j] == experts[i])
				return st_diag_set(diag, -EINVAL,
						   "es_client_acquire: expert "
						   "%d listed twice", experts[i]);
	}
	it = calloc((size_t)n, sizeof(*it));
	if (!it)
		return -ENOMEM;
	deadline = t0 + (uint64_t)c->timeout_ms * 1000000ull;
	next_alive_check = t0;

	/* Fast path: pin what is READY with atomics alone. */
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < n; i++) {
		it[i].expert = experts[i];
		it[i].key = es_key((uint32_t)layer, (uint32_t)experts[i]);
		it[i].slot = es_pool_try_pin(&c->v, c->cidx, (uint32_t)layer,
					     (uint32_t)experts[i], &it[i].gen);
		if (it[i].slot >= 0) {
			ledger_add(c, it[i].slot, it[i].key, it[i].gen);
			it[i].ready = 1;
			n_ready++;
			atomic_store_explicit(
				&c->v.slots[it[i].slot].last_use_ns, t0,
				memory_order_relaxed);
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (n_ready)
		atomic_fetch_add(&c->v.hdr->c.hits, (uint64_t)n_ready);
	/* per-expert hand-over: the resident ones first (READY was read with
	 * seq_cst when pinned) */
	for (int i = 0; ea && i < n; i++)
		if (it[i].ready)
			each_ready(c, ea, i, it[i].slot);

	/* Slow path: one message for every miss, then wait for READY.  The
	 * wait (less the caller's work in fn) is counted for the step
	 * timeline: as a demand wait when an expert had no slot yet, else
	 * as a wait for a load already in flight (a prefetch not ready). */
	if (n_ready < n) {
		demand = 0;
		for (int i = 0; i < n; i++)
			if (!it[i].ready &&
			    es_pool_slot_of(&c->v, es_pool_index(
					&c->v, (uint32_t)layer,
					(uint32_t)experts[i])) < 0)
				demand = 1;
		t_slow = st_now_ns();
		fn0 = ea ? *ea->fn_ns : 0;
	}
	while (n_ready < n) {
		int need_rpc = 0;

		for (int i = 0; i < n; i++)
			need_rpc |= it[i].slot < 0;
		if (need_rpc) {
			r = acquire_misses(c, layer, it, n, diag);
			if (r < 0)
				break;
		}
		/* the misses are loading: the caller's other work now */
		each_idle(ea);
		for (int i = 0; i < n; i++) {
			struct es_slot *sl;
			uint64_t key;
			uint32_t st, gen;

			if (it[i].ready || it[i].slot < 0)
				continue;
			sl = &c->v.slots[it[i].slot];
			if (es_slot_snapshot(sl, &key, &st, &gen) < 0)
				continue; /* a writer died mid-change: the
					   * time-out or the liveness check
					   * below ends the wait */
			if (key != it[i].key || gen != it[i].gen) {
				/* A restarted expertd discarded the half-done
				 * load and cleared its pins: forget ours and
				 * ask again. */
				pthread_mutex_lock(&c->mu);
				ledger_forget(c, it[i].slot, it[i].gen);
				pthread_mutex_unlock(&c->mu);
				it[i].slot = -1;
			} else if (st == ES_SLOT_READY) {
				it[i].ready = 1;
				n_ready++;
				each_ready(c, ea, i, it[i].slot);
				sleep_ns = 0;
			} else if (st == ES_SLOT_FAILED) {
				int e = atomic_load(&sl->error);

				r = st_diag_set(diag, e < 0 ? e : -EIO,
						"layer %d expert %d: expertd "
						"could not load its record: %s "
						"(expertd's log names the file; "
						"re-run strata convert)",
						layer, it[i].expert,
						st_strerror(e < 0 ? e : -EIO));
				failed_expert = it[i].expert;
				break;
			}
		}
		if (r < 0 || n_ready == n)
			break;
		if (st_now_ns() > deadline) {
			r = st_diag_set(diag, -ST_E_TIMEOUT, "layer %d: experts "
					"not loaded within %d ms", layer,
					c->timeout_ms);
			break;
		}
		if (st_now_ns() >= next_alive_check) {
			if (!peer_alive(owner_pid(c))) {
				r = st_diag_set(diag, -ST_E_PEERGONE,
						"expertd (pid %d) died while "
						"layer %d experts were loading",
						(int)owner_pid(c), layer);
				break;
			}
			next_alive_check = st_now_ns() + 5000000ull;
		}
		/* Loads take tens of microseconds to milliseconds: yield
		 * first, then sleep with a growing interval (max 500 us). */
		if (sleep_ns == 0) {
			sched_yield();
			sleep_ns = 10000;
		} else {
			st_sleep_ns(sleep_ns);
			sleep_ns = ST_MIN(sleep_ns * 2, 500000ull);
		}
	}
	if (demand >= 0) {
		uint64_t w = st_now_ns() - t_slow - (ea ? *ea->fn_ns - fn0 : 0);

		atomic_fetch_add_explicit(demand ? &c->tm.wait_demand_ns :
					  &c->tm.wait_inflight_ns, w,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(demand ? &c->tm.waits_demand :
					  &c->tm.waits_inflight, 1,
					  memory_order_relaxed);
	}
	if (r < 0) {
		drop_items(c, it, n);
		free(it);
		if (failed_expert >= 0)
			failure_detail(c, layer, failed_expert, r, diag);
		return r;
	}
	each_idle(ea); /* all were hits */
	/* READY was read with seq_cst in the snapshot: the record bytes the
	 * loader wrote before publishing are visible. */
	for (int i = 0; ret_records && i < n; i++)
		ret_records[i] = es_pool_record(&c->v, (uint32_t)it[i].slot);
	free(it);
	return 0;
}

/* ---- restarts ---- */

void es_client_abort_wait(struct es_client *c)
{
	if (c)
		atomic_store(&c->abort_wait, 1);
}

void es_client_set_restart_wait(struct es_client *c, int wait_ms)
{
	c->restart_wait_ms = wait_ms > 0 ? wait_ms : 0;
}

uint32_t es_client_reconnects(const struct es_client *c)
{
	return atomic_load(&c->reconnects);
}

/*
 * HELLO to a restarted expertd asking to keep our client id (and so our
 * pins, which the adopted table kept: es_pool.c pool_recover).  Caller
 * holds rpc_mu.  The new expertd must serve the segment we map (it adopted
 * it: same owner pid, store and layout), else -ST_E_STALE.  When it gave
 * us a new id (our entry was dropped, so were our pins) the ledger is
 * emptied: nothing is pinned for us any more.
 */
static int resume_locked(struct es_client *c, struct st_diag *diag)
{
	struct es_hello_rep rep;
	struct st_wbuf w;
	void *buf = NULL;
	const uint8_t *p;
	size_t len;
	int r;

	st_wbuf_init(&w);
	es_hello_req_encode_resume(&w, (uint32_t)getpid(), ES_PROTO_VERSION,
				   c->name, self_start_ticks(), c->client_id);
	r = w.err ? w.err : rpc_locked(c, ST_MSG_HELLO, &w, &buf, &p, &len,
				       diag);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	r = es_hello_rep_decode(p, len, &rep, diag);
	free(buf);
	if (r < 0)
		return r;
	if (rep.store_id != c->store_id || rep.layout_hash != c->layout_hash ||
	    rep.pool_id != st_shm_hdr(&c->shm)->pool_id ||
	    (int32_t)rep.pid != owner_pid(c))
		return st_diag_set(diag, -ST_E_STALE,
				   "expertd came back (pid %u) with another "
				   "expert pool than the one this process maps "
				   "(another store or --host-budget); restart "
				   "computed too (strata restart computed)",
				   rep.pid);
	if (rep.client_id != c->client_id) {
		pthread_mutex_lock(&c->mu);
		for (uint32_t s = 0; s < c->v.n_slots; s++)
			c->ledger[s].count = 0;
		c->client_id = rep.client_id;
		c->cidx = (int)es_client_id_index(rep.client_id);
		pthread_mutex_unlock(&c->mu);
		st_warn("expertd (pid %u) did not keep client %s's pins; "
			"registered again", rep.pid, c->name);
	}
	c->epoch = rep.epoch;
	c->peer_pid = (int32_t)rep.pid;
	atomic_fetch_add(&c->reconnects, 1);
	st_warn("re-connected to expertd (pid %u, pool epoch %llu) as client "
		"%u", rep.pid, (unsigned long long)rep.epoch, c->client_id);
	return 0;
}

/*
 * expertd is gone: waits until a restarted expertd answers our HELLO, at
 * most restart_wait_ms.  0, or -ST_E_PEERGONE (it did not come back: the
 * message says how to restart it), -ST_E_VERSION (it speaks another
 * protocol), -ST_E_STALE (it serves another pool).
 */
static int wait_back(struct es_client *c, struct st_diag *diag)
{
	uint64_t t0 = st_now_ns();
	uint64_t deadline = t0 + (uint64_t)c->restart_wait_ms * 1000000ull;
	int saved = c->timeout_ms;

	st_warn("expertd of instance %s is gone; waiting up to %d s for it "
		"to come back", c->instance, (c->restart_wait_ms + 999) / 1000);
	for (;;) {
		struct st_diag d2 = { "" };
		uint64_t now = st_now_ns();
		int r = -ST_E_PEERGONE;

		if (atomic_load(&c->abort_wait))
			return st_diag_set(diag, -ST_E_PEERGONE, "expertd is "
					   "gone and this process is stopping");

		pthread_mutex_lock(&c->rpc_mu);
		/* the owner pid in the segment is the new expertd's once it
		 * has adopted the pool; until then nobody can answer */
		if (peer_alive(owner_pid(c))) {
			uint64_t left_ms = deadline > now ?
				(deadline - now) / 1000000ull : 0;

			c->timeout_ms = (int)ST_MAX(ST_MIN((uint64_t)saved,
							   left_ms), 100);
			r = resume_locked(c, &d2);
			c->timeout_ms = saved;
		} else {
			int32_t pid = 0;

			/* an expertd that answers without having adopted our
			 * segment made a new pool (it was stopped cleanly, or
			 * has another store or budget): ours is orphaned */
			if (st_daemon_ping(c->ctl_path, 200, &pid) == 0 &&
			    pid > 0 && pid != owner_pid(c))
				r = st_diag_set(&d2, -ST_E_STALE, "expertd came "
						"back (pid %d) with a new expert "
						"pool; this process maps the old "
						"one: restart computed too "
						"(strata restart computed)",
						(int)pid);
		}
		pthread_mutex_unlock(&c->rpc_mu);
		if (r == 0) {
			st_warn("expertd (pid %d) is back after %.1f s; epoch "
				"%llu", (int)owner_pid(c),
				(double)(st_now_ns() - t0) / 1e9,
				(unsigned long long)c->epoch);
			return 0;
		}
		if (r != -ST_E_PEERGONE && r != -ST_E_TIMEOUT)
			return st_diag_set(diag, r, "%s", d2.msg);
		if (st_now_ns() >= deadline)
			return st_diag_set(diag, -ST_E_PEERGONE,
					   "expertd did not come back within "
					   "%d s; restart it with `strata "
					   "restart expertd`",
					   (c->restart_wait_ms + 999) / 1000);
		st_sleep_ns(50000000ull);
	}
}

int es_client_acquire(struct es_client *c, int layer, int n,
		      const int *experts, const uint8_t **ret_records,
		      struct st_diag *diag)
{
	for (;;) {
		int r = acquire_once(c, layer, n, experts, ret_records, NULL,
				     diag);

		/* nothing of a failed call stays pinned: ask again once a
		 * restarted expertd answers */
		if (r != -ST_E_PEERGONE || !c || c->restart_wait_ms <= 0)
			return r;
		r = wait_back(c, diag);
		if (r < 0)
			return r;
	}
}

int es_client_acquire_each(struct es_client *c, int layer, int n,
			   const int *experts, es_acquire_fn fn, void *arg,
			   struct st_diag *diag)
{
	int ids[n > 0 ? n : 1], idx[n > 0 ? n : 1];
	uint8_t done[n > 0 ? n : 1], all_done[n > 0 ? n : 1];
	int idle_done = 0;
	uint64_t fn_ns = 0;

	if (!fn || n <= 0 || n > ES_ACQUIRE_MAX_N)
		return st_diag_set(diag, -EINVAL, "es_client_acquire_each: n "
				   "%d or no function", n);
	memset(all_done, 0, (size_t)n);
	for (;;) {
		struct acq_each ea = { fn, arg, idx, done, &idle_done,
				       &fn_ns };
		int m = 0, r;

		for (int i = 0; i < n; i++)
			if (!all_done[i]) {
				idx[m] = i;
				ids[m++] = experts[i];
			}
		memset(done, 0, (size_t)m);
		r = m ? acquire_once(c, layer, m, ids, NULL, &ea, diag) : 0;
		for (int j = 0; j < m; j++)
			all_done[idx[j]] |= done[j];
		if (r != -ST_E_PEERGONE || !c || c->restart_wait_ms <= 0)
			return r;
		/* nothing of the failed call stays pinned: what was handed
		 * over is not asked for again */
		r = wait_back(c, diag);
		if (r < 0)
			return r;
	}
}

void es_client_release(struct es_client *c, int layer, int n,
		       const int *experts)
{
	if (!c || !experts || layer < 0 || (uint32_t)layer >= c->v.n_layers)
		return;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < n; i++) {
		int32_t s;

		if (experts[i] < 0 || (uint32_t)experts[i] >= c->v.n_experts)
			continue;
		s = ledger_find(c, (uint32_t)layer, (uint32_t)experts[i]);
		if (s >= 0)
			ledger_drop(c, s);
	}
	pthread_mutex_unlock(&c->mu);
}

int es_client_stats(struct es_client *c, struct es_stats *ret)
{
	struct es_stats_rep s;
	void *buf = NULL;
	const uint8_t *p;
	size_t len;
	int r;

	memset(ret, 0, sizeof(*ret));
	r = rpc(c, ST_MSG_STATS, NULL, &buf, &p, &len, NULL);
	if (r == -ST_E_PEERGONE && c->restart_wait_ms > 0) {
		r = wait_back(c, NULL);
		if (r == 0)
			r = rpc(c, ST_MSG_STATS, NULL, &buf, &p, &len, NULL);
	}
	if (r < 0)
		return r;
	r = es_stats_rep_decode(p, len, &s, NULL);
	free(buf);
	if (r < 0)
		return r;
	ret->n_slots = s.n_slots;
	ret->slots_used = s.slots_used;
	ret->record_bytes = s.record_bytes;
	ret->pool_bytes = s.pool_bytes;
	ret->budget_bytes = s.budget_bytes;
	ret->hits = s.hits;
	ret->misses = s.misses;
	ret->evictions = s.evictions;
	ret->loads = s.loads;
	ret->load_bytes = s.load_bytes;
	ret->load_ns = s.load_ns;
	ret->checksum_failures = s.checksum_failures;
	ret->epoch = s.epoch;
	ret->pid = s.pid;
	ret->n_clients = s.n_clients;
	return 0;
}

int es_client_shutdown(struct es_client *c)
{
	return rpc(c, ST_MSG_SHUTDOWN, NULL, NULL, NULL, NULL, NULL);
}

/* ---- tiers: routing reports, prefetch hints, tier counters ---- */

void es_client_tier_stats(struct es_client *c, struct es_tier_stats *ret)
{
	const struct es_pool_counters *k = &c->v.hdr->c;

	ret->prefetch_loads = atomic_load(&k->prefetch_loads);
	ret->prefetch_used = atomic_load(&k->prefetch_used);
	ret->prefetch_wasted = atomic_load(&k->prefetch_wasted);
	ret->hints = atomic_load(&k->hints);
	ret->hints_dropped = atomic_load(&k->hints_dropped);
	ret->step_hints = atomic_load(&k->step_hints);
	ret->routed = atomic_load(&k->routed);
	ret->rereads = atomic_load(&k->rereads);
	ret->hot_slots = atomic_load(&k->hot_slots);
	ret->direct_io = atomic_load(&k->direct_io);
	ret->io_busy_ns = atomic_load(&k->io_busy_ns);
	ret->hits = atomic_load(&k->hits);
	ret->misses = atomic_load(&k->misses);
	ret->evictions = atomic_load(&k->evictions);
	ret->loads = atomic_load(&k->loads);
	ret->load_bytes = atomic_load(&k->load_bytes);
	ret->load_ns = atomic_load(&k->load_ns);
	ret->checksum_failures = atomic_load(&k->checksum_failures);
	ret->loader_cpu_ns = atomic_load(&k->loader_cpu_ns);
	ret->checksum_ns = atomic_load(&k->checksum_ns);
	ret->loader_minflt = atomic_load(&k->loader_minflt);
	ret->loader_majflt = atomic_load(&k->loader_majflt);
}

void es_client_timing(const struct es_client *c, struct es_client_timing *ret)
{
	ret->rpcs = atomic_load(&c->tm.rpcs);
	ret->rpc_ns = atomic_load(&c->tm.rpc_ns);
	ret->acquire_rpc_ns = atomic_load(&c->tm.acquire_rpc_ns);
	ret->wait_demand_ns = atomic_load(&c->tm.wait_demand_ns);
	ret->wait_inflight_ns = atomic_load(&c->tm.wait_inflight_ns);
	ret->waits_demand = atomic_load(&c->tm.waits_demand);
	ret->waits_inflight = atomic_load(&c->tm.waits_inflight);
}

int32_t es_client_owner_pid(const struct es_client *c)
{
	return c && c->shm.base ? owner_pid(c) : 0;
}

int es_client_route(struct es_client *c, int layer, uint32_t pos,
		    int n_tokens, int k, const int *experts, int n_hint,
		    const int *hint_layer, const int *hint_expert,
		    struct st_diag *diag)
{
	struct st_wbuf w;
	int r;

	if (layer < 0 || n_tokens < 0 || k < 0 || n_hint < 0 ||
	    n_hint > ES_ROUTE_MAX_HINT || k > ES_ROUTE_MAX_K)
		return st_diag_set(diag, -EINVAL, "es_client_route: bad "
				   "arguments (layer %d, %d tokens, k %d, %d "
				   "hints)", layer, n_tokens, k, n_hint);
	st_wbuf_init(&w);
	es_route_req_encode(&w, (uint32_t)getpid(), (uint32_t)layer, pos,
			    (uint32_t)n_tokens, (uint32_t)k, experts,
			    (uint32_t)n_hint, hint_layer, hint_expert);
	r = w.err ? w.err : rpc(c, ES_MSG_ROUTE, &w, NULL, NULL, NULL, diag);
	st_wbuf_fini(&w);
	return r;
}

int es_client_hint_step(struct es_client *c, uint32_t pos, int n_hint,
			const int *hint_layer, const int *hint_expert,
			struct st_diag *diag)
{
	struct st_wbuf w;
	int r;

	if (!c || n_hint < 0 || n_hint > ES_ROUTE_MAX_HINT ||
	    (n_hint && (!hint_layer || !hint_expert)))
		return st_diag_set(diag, -EINVAL, "es_client_hint_step: bad "
				   "arguments (%d hints)", n_hint);
	if (!n_hint)
		return 0;
	st_wbuf_init(&w);
	es_route_req_encode(&w, (uint32_t)getpid(), 0, pos, 0, 0, NULL,
			    (uint32_t)n_hint, hint_layer, hint_expert);
	es_route_req_encode_hint_pos(&w, pos);
	r = w.err ? w.err : rpc(c, ES_MSG_ROUTE, &w, NULL, NULL, NULL, diag);
	st_wbuf_fini(&w);
	return r;
}
