/*
 * kv_client.c — the client side of kvd (see kv_client.h): a REQ socket to
 * kvd.ctl for the slow path, and the pool segment mapped after DECLARE for
 * kv_client_row.  Everything read from the segment is bounds-checked against
 * a layout this client validated when it attached.
 */
#include "kv_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv_proto.h"
#include "st_daemon.h"
#include "st_log.h"
#include "st_msg.h"
#include "kv_devpage.h"
#include "st_shm.h"
#include "st_util.h"

struct kv_client {
	pthread_mutex_t lock;          /* one request at a time */
	struct st_sock req;
	char ctl_path[4200];
	char instance[64];
	char name[KV_PROTO_NAME_BYTES + 1];
	int timeout_ms;
	int restart_wait_ms;           /* 0: a dead kvd is an error at once */
	_Atomic int abort_wait;        /* kv_client_abort_wait: stop waiting */
	uint32_t reconnects;
	uint32_t id;
	uint64_t next_request_id;

	/* the declaration (kept to attach again after a new pool) */
	int declared;
	uint64_t epoch;                /* of the pool when we last said HELLO */
	struct kv_msg_declare decl;
	uint64_t model_id;             /* prefix-cache model, 0 = none */

	/* the pool, once attached */
	int attached;
	struct st_shm shm;
	uint64_t layout_hash;
	struct kv_layout lay;
	struct kv_stream_decl streams[KV_MAX_STREAMS];
	const struct kv_seq_entry *seqs;
	const struct kv_page_meta *pages;
	const uint32_t *table;
	uint8_t *data;
};

static void detach(struct kv_client *c)
{
	if (c->attached)
		st_shm_detach(&c->shm);
	c->attached = 0;
	c->seqs = NULL;
	c->pages = NULL;
	c->table = NULL;
	c->data = NULL;
}

/* Maps the pool and checks it against the declaration kvd accepted. */
static int attach(struct kv_client *c, uint64_t layout_hash,
		  struct st_diag *diag)
{
	struct st_shm shm;
	struct kv_layout lay;
	int r;

	r = st_shm_attach(&shm, c->instance, KV_POOL_KIND,
			  KV_POOL_LAYOUT_VERSION, layout_hash, diag);
	if (r == -ENOENT)
		return st_diag_set(diag, -ST_E_PEERGONE,
				   "kv pool of instance %s does not exist "
				   "(kvd stopped?)", c->instance);
	if (r < 0)
		return r;
	r = kv_layout_read(shm.base, shm.size, layout_hash, &lay, c->streams,
			   diag);
	if (r == 0 &&
	    !kv_decl_equal(lay.n_streams, c->streams, lay.page_rows,
			   c->decl.n_streams, c->decl.streams,
			   c->decl.page_rows))
		r = st_diag_set(diag, -ST_E_CONFIG,
				"kv pool %s holds another declaration than the "
				"one kvd accepted", shm.name);
	if (r < 0) {
		st_shm_detach(&shm);
		return r;
	}
	detach(c);
	c->shm = shm;
	c->lay = lay;
	c->layout_hash = layout_hash;
	c->seqs = (const struct kv_seq_entry *)((uint8_t *)shm.base +
						lay.seqs_off);
	c->pages = (const struct kv_page_meta *)((uint8_t *)shm.base +
						 lay.pages_off);
	c->table = (const uint32_t *)((uint8_t *)shm.base + lay.table_off);
	c->data = (uint8_t *)shm.base + lay.data_off;
	c->attached = 1;
	c->epoch = atomic_load(&st_shm_hdr(&shm)->epoch);
	return 0;
}

/* While a reply is awaited: give up at once when the kvd that owns the
 * mapped pool has died, instead of waiting out the whole time-out. */
static int kvd_alive(void *arg)
{
	struct kv_client *c = arg;

	if (c->attached &&
	    !st_pid_alive(atomic_load(&st_shm_hdr(&c->shm)->owner_pid)))
		return -ST_E_PEERGONE;
	return 0;
}

static int rpc_raw(struct kv_client *c, uint16_t type, uint64_t rid,
		   const struct st_wbuf *w, void **ret_buf,
		   const uint8_t **ret_p, size_t *ret_len, struct st_diag *diag)
{
	int r;

	if (w && w->err)
		return w->err;
	r = st_rpc_call_watch(&c->req, type, rid, c->id, w ? w->data : NULL,
			      w ? w->len : 0, c->timeout_ms, kvd_alive, c,
			      ret_buf, ret_p, ret_len);
	if (!*ret_buf)
		return st_diag_set(diag, r == -ST_E_PROTO ? r : -ST_E_PEERGONE,
				   "kvd at %s %s (%s)", c->ctl_path,
				   r == -ST_E_PROTO ? "sent a malformed reply" :
				   r == -ST_E_PEERGONE ? "died" :
							 "did not answer",
				   st_strerror(r));
	if (r < 0) {
		if (kv_proto_decode_text(*ret_p, *ret_len, diag) < 0)
			st_diag_set(diag, r, "kvd: %s", st_strerror(r));
		free(*ret_buf);
		*ret_buf = NULL;
	}
	return r;
}

static int declare_locked(struct kv_client *c, struct st_diag *diag);

/* kvd reports the epoch and creation id (pool_id, 0 = not reported) of its
 * pool: when they are not those of the segment we map, that segment was
 * removed (kvd stopped cleanly and a new one made a new pool, whose epoch
 * may well be the same): drop the mapping; the next sequence request maps
 * the new one. */
static void check_epoch(struct kv_client *c, uint64_t epoch, uint64_t pool_id)
{
	if (c->attached &&
	    (atomic_load(&st_shm_hdr(&c->shm)->epoch) != epoch ||
	     (pool_id && st_shm_hdr(&c->shm)->pool_id != pool_id)))
		detach(c);
}

/* HELLO (again, under our old id when we have one). */
static int hello(struct kv_client *c, struct st_diag *diag)
{
	struct kv_msg_hello m;
	struct kv_msg_hello_reply out;
	struct st_wbuf w;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	memset(&m, 0, sizeof(m));
	m.pid = (uint32_t)getpid();
	if (st_pid_start_ticks((int)m.pid, &m.start_ticks) < 0)
		m.start_ticks = 0;
	m.proto_version = ST_PROTO_VERSION;
	memcpy(m.name, c->name, sizeof(m.name));
	m.resume_client_id = c->id;
	st_wbuf_init(&w);
	kv_proto_encode_hello(&w, &m);
	c->id = 0;
	r = rpc_raw(c, ST_MSG_HELLO, ++c->next_request_id, &w, &buf, &p, &len,
		    diag);
	st_wbuf_fini(&w);
	if (r == -ST_E_VERSION) {
		char msg[sizeof(diag->msg)];

		snprintf(msg, sizeof(msg), "%s", diag ? diag->msg : "");
		st_diag_set(diag, r, "kvd at %s refused HELLO (%s); use "
			    "matching builds of strata", c->ctl_path, msg);
	}
	if (r < 0) {
		c->id = m.resume_client_id;
		return r;
	}
	r = kv_proto_decode_hello_reply(p, len, &out);
	free(buf);
	if (r < 0) {
		c->id = m.resume_client_id;
		return st_diag_set(diag, r, "kvd: malformed HELLO reply");
	}
	c->id = out.client_id;
	check_epoch(c, out.epoch, out.pool_id);
	c->epoch = out.epoch;
	return 0;
}


/*
 * kvd died: waits (at most until deadline_ns) for a restarted kvd to answer
 * HELLO on a fresh socket (the old one would re-send the abandoned request
 * by itself), under our old id; the protocol version is checked again
 * there.  0, or -ST_E_PEERGONE naming how to restart kvd, or kvd's refusal
 * (-ST_E_VERSION ...).  Caller holds the lock.
 */
static int wait_back(struct kv_client *c, uint64_t t0, uint64_t deadline_ns,
		     struct st_diag *diag)
{
	int saved = c->timeout_ms;

	for (;;) {
		struct st_diag d2 = { "" };
		uint64_t now = st_now_ns();
		int r = -ST_E_PEERGONE;

		if (st_path_exists(c->ctl_path) &&
		    (!c->attached ||
		     st_pid_alive(atomic_load(&st_shm_hdr(&c->shm)->owner_pid)))) {
			uint64_t left_ms = deadline_ns > now ?
				(deadline_ns - now) / 1000000ull : 0;

			st_sock_close(&c->req);
			r = st_sock_open(&c->req, ST_SOCK_REQ, c->ctl_path,
					 saved, saved);
			if (r == 0) {
				c->timeout_ms = (int)ST_MAX(ST_MIN(
					(uint64_t)saved, left_ms), 100);
				r = hello(c, &d2);
				c->timeout_ms = saved;
			} else {
				r = -ST_E_PEERGONE;
			}
		}
		if (r == 0) {
			c->reconnects++;
			st_warn("re-connected to a restarted kvd (pool epoch "
				"%llu) as client %u after %.1f s",
				(unsigned long long)c->epoch, c->id,
				(double)(st_now_ns() - t0) / 1e9);
			return 0;
		}
		if (r != -ST_E_PEERGONE && r != -ST_E_TIMEOUT)
			return st_diag_set(diag, r, "%s", d2.msg);
		if (atomic_load(&c->abort_wait))
			return st_diag_set(diag, -ST_E_PEERGONE, "kvd is gone "
					   "and this process is stopping");
		if (st_now_ns() >= deadline_ns)
			return st_diag_set(diag, -ST_E_PEERGONE,
					   "kvd did not come back within %d s; "
					   "restart it with `strata restart "
					   "kvd`", (c->restart_wait_ms + 999) /
					   1000);
		st_sleep_ns(50000000ull);
	}
}

/*
 * One request: on success *ret_buf (caller frees) holds the reply payload
 * at *ret_p.  When kvd does not know us (it was restarted), registers again
 * and re-sends the same request (same request id, so kvd can recognise a
 * request it already carried out).  With a restart wait, a dead kvd is
 * waited for (wait_back) and the request re-sent the same way.
 */
static int rpc(struct kv_client *c, uint16_t type, const struct st_wbuf *w,
	       void **ret_buf, const uint8_t **ret_p, size_t *ret_len,
	       struct st_diag *diag)
{
	uint64_t rid = ++c->next_request_id;
	const uint8_t *p = NULL;
	size_t len = 0;
	void *buf = NULL;
	int r;

	if (!ret_p)
		ret_p = &p;
	if (!ret_len)
		ret_len = &len;
	/* A restarted kvd adopted the pool (its epoch moved) since our last
	 * HELLO: say HELLO to it first (versions are checked again). */
	if (c->attached && type != ST_MSG_HELLO && type != ST_MSG_BYE &&
	    atomic_load(&st_shm_hdr(&c->shm)->epoch) != c->epoch &&
	    st_pid_alive(atomic_load(&st_shm_hdr(&c->shm)->owner_pid))) {
		r = hello(c, diag);
		if (r < 0)
			return r;
		c->reconnects++;
		st_warn("re-connected to a restarted kvd (pool epoch %llu) as "
			"client %u", (unsigned long long)c->epoch, c->id);
	}
	if (!c->attached && c->declared && (type & 0xff00) == ST_MSG_KV_FIRST &&
	    type != KV_MSG_DECLARE) {
		/* the pool we mapped is gone (see check_epoch): map the
		 * current one before touching sequences */
		r = declare_locked(c, diag);
		if (r < 0)
			return r;
	}
	r = rpc_raw(c, type, rid, w, &buf, ret_p, ret_len, diag);
	if (r == -ST_E_PEERGONE && c->restart_wait_ms > 0 &&
	    type != ST_MSG_BYE && type != ST_MSG_HELLO) {
		uint64_t t0 = st_now_ns();
		uint64_t deadline = t0 +
			(uint64_t)c->restart_wait_ms * 1000000ull;

		st_warn("kvd of instance %s is gone; waiting up to %d s for it "
			"to come back", c->instance,
			(c->restart_wait_ms + 999) / 1000);
		while (r == -ST_E_PEERGONE) {
			r = wait_back(c, t0, deadline, diag);
			if (r == 0 && !c->attached && c->declared &&
			    type != KV_MSG_DECLARE)
				r = declare_locked(c, diag);
			if (r == 0)
				r = rpc_raw(c, type, rid, w, &buf, ret_p,
					    ret_len, diag);
			if (r == -ST_E_PEERGONE &&
			    (st_now_ns() >= deadline ||
			     atomic_load(&c->abort_wait)))
				break;
		}
	}
	if (r == -ST_E_STALE) {
		r = hello(c, diag);
		if (r == 0 && !c->attached && c->declared &&
		    type != KV_MSG_DECLARE)
			r = declare_locked(c, diag);
		if (r == 0)
			r = rpc_raw(c, type, rid, w, &buf, ret_p, ret_len,
				    diag);
	}
	if (ret_buf)
		*ret_buf = buf;
	else
		free(buf);
	return r;
}

int kv_client_open(const char *run_dir, const char *instance, const char *name,
		   int timeout_ms, struct kv_client **ret, struct st_diag *diag)
{
	struct kv_client *c;
	char shm_name[128];
	int r;

	*ret = NULL;
	if (!run_dir || !instance || !name ||
	    st_shm_name(instance, KV_POOL_KIND, shm_name, sizeof(shm_name)) < 0)
		return st_diag_set(diag, -EINVAL, "kv client: bad instance "
				   "name '%s'", instance ? instance : "(null)");
	if (strlen(name) > KV_PROTO_NAME_BYTES)
		return st_diag_set(diag, -EINVAL, "kv client: name '%s' longer "
				   "than %d", name, KV_PROTO_NAME_BYTES);
	for (const char *q = name; *q; q++)
		if (*q < 0x20 || *q > 0x7e)
			return st_diag_set(diag, -EINVAL, "kv client: name "
					   "must be printable ASCII");
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	pthread_mutex_init(&c->lock, NULL);
	c->req.fd = -1;
	c->timeout_ms = timeout_ms;
	snprintf(c->instance, sizeof(c->instance), "%s", instance);
	snprintf(c->name, sizeof(c->name), "%s", name);
	if (st_run_path(run_dir, "kvd", "ctl", c->ctl_path,
			sizeof(c->ctl_path)) < 0) {
		r = st_diag_set(diag, -ENAMETOOLONG, "run directory path too "
				"long");
		goto fail;
	}
	r = st_sock_open(&c->req, ST_SOCK_REQ, c->ctl_path, timeout_ms,
			 timeout_ms);
	if (r < 0) {
		st_diag_set(diag, r, "cannot connect to %s: %s", c->ctl_path,
			    st_strerror(r));
		goto fail;
	}
	r = hello(c, diag);
	if (r < 0)
		goto fail;
	*ret = c;
	return 0;
fail:
	st_sock_close(&c->req);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return r;
}

void kv_client_close(struct kv_client *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->lock);
	if (c->id && c->req.fd >= 0) {
		void *buf = NULL;
		const uint8_t *p;
		size_t len;

		/* BYE releases our sequences; a kvd that is gone already
		 * releases them when it sees our pid exit. */
		rpc_raw(c, ST_MSG_BYE, ++c->next_request_id, NULL, &buf, &p,
			&len, NULL);
		free(buf);
	}
	st_sock_close(&c->req);
	detach(c);
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static int declare_locked(struct kv_client *c, struct st_diag *diag)
{
	struct kv_msg_declare_reply out;
	struct st_wbuf w;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	st_wbuf_init(&w);
	kv_proto_encode_declare(&w, &c->decl);
	r = rpc(c, KV_MSG_DECLARE, &w, &buf, &p, &len, diag);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	r = kv_proto_decode_declare_reply(p, len, &out);
	free(buf);
	if (r < 0)
		return st_diag_set(diag, r, "kvd: malformed DECLARE reply");
	if (c->attached && c->layout_hash == out.layout_hash &&
	    atomic_load(&st_shm_hdr(&c->shm)->epoch) == out.epoch &&
	    st_shm_hdr(&c->shm)->pool_id == out.pool_id)
		return 0;
	r = attach(c, out.layout_hash, diag);
	/* the name may already hold a pool made after kvd answered */
	if (r == 0 && st_shm_hdr(&c->shm)->pool_id != out.pool_id) {
		detach(c);
		r = st_diag_set(diag, -ST_E_STALE, "kv pool of instance %s was "
				"made again while attaching; try again",
				c->instance);
	}
	return r;
}

int kv_client_declare_streams(struct kv_client *c, int n_streams,
			      const struct kv_stream_decl *streams,
			      uint32_t page_rows, struct st_diag *diag)
{
	int r;

	if (n_streams <= 0 || n_streams > KV_MAX_STREAMS || !streams)
		return st_diag_set(diag, -EINVAL, "kv declare: %d streams, "
				   "must be 1..%d", n_streams, KV_MAX_STREAMS);
	pthread_mutex_lock(&c->lock);
	memset(&c->decl, 0, sizeof(c->decl));
	c->decl.n_streams = (uint32_t)n_streams;
	c->decl.page_rows = page_rows;
	memcpy(c->decl.streams, streams, sizeof(*streams) * (size_t)n_streams);
	r = declare_locked(c, diag);
	c->declared = r == 0;
	pthread_mutex_unlock(&c->lock);
	return r;
}

int kv_client_declare_model(struct kv_client *c, int n_streams,
			    const struct kv_stream_decl *streams,
			    uint32_t page_rows, uint64_t model_id,
			    struct st_diag *diag)
{
	int r;

	if (model_id == 0)
		return st_diag_set(diag, -EINVAL, "kv declare: model id 0 is "
				   "not a model");
	r = kv_client_declare_streams(c, n_streams, streams, page_rows, diag);
	if (r == 0) {
		pthread_mutex_lock(&c->lock);
		c->model_id = model_id;
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}

int kv_client_declare(struct kv_client *c, int n_streams,
		      const uint32_t *row_bytes, uint32_t page_rows,
		      struct st_diag *diag)
{
	struct kv_stream_decl s[KV_MAX_STREAMS];

	if (n_streams <= 0 || n_streams > KV_MAX_STREAMS || !row_bytes)
		return st_diag_set(diag, -EINVAL, "kv declare: %d streams, "
				   "must be 1..%d", n_streams, KV_MAX_STREAMS);
	memset(s, 0, sizeof(s));
	for (int i = 0; i < n_streams; i++) {
		s[i].row_bytes = row_bytes[i];
		s[i].tokens_per_row = 1;
	}
	return kv_client_declare_streams(c, n_streams, s, page_rows, diag);
}

/* A request whose reply is one sequence handle. */
static int seq_request(struct kv_client *c, uint16_t type,
		       const struct st_wbuf *w, uint32_t *ret_seq,
		       struct st_diag *diag)
{
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	pthread_mutex_lock(&c->lock);
	r = rpc(c, type, w, &buf, &p, &len, diag);
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	r = kv_proto_decode_seq(p, len, ret_seq, diag);
	free(buf);
	return r;
}

int kv_client_seq_create(struct kv_client *c, uint32_t *ret_seq,
			 struct st_diag *diag)
{
	return seq_request(c, KV_MSG_SEQ_CREATE, NULL, ret_seq, diag);
}

int kv_client_seq_reserve(struct kv_client *c, int n, const uint32_t *seqs,
			  const uint32_t *n_rows, struct st_diag *diag)
{
	struct st_wbuf w;
	int r;

	if (n <= 0 || n > KV_PROTO_MAX_RESERVE)
		return st_diag_set(diag, n <= 0 ? -EINVAL : -ST_E_LIMIT,
				   "kv reserve: %d entries, must be 1..%d", n,
				   KV_PROTO_MAX_RESERVE);
	st_wbuf_init(&w);
	st_wbuf_u32(&w, (uint32_t)n);
	for (int i = 0; i < n; i++) {
		st_wbuf_u32(&w, seqs[i]);
		st_wbuf_u32(&w, n_rows[i]);
	}
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_RESERVE, &w, NULL, NULL, NULL, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	return r;
}

int kv_client_seq_fork(struct kv_client *c, uint32_t src, uint32_t n_rows,
		       uint32_t *ret_dst, struct st_diag *diag)
{
	struct kv_msg_fork m = { src, n_rows };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	kv_proto_encode_fork(&w, &m);
	r = seq_request(c, KV_MSG_SEQ_FORK, &w, ret_dst, diag);
	st_wbuf_fini(&w);
	return r;
}

int kv_client_seq_truncate(struct kv_client *c, uint32_t seq,
			   uint32_t n_rows, struct st_diag *diag)
{
	struct kv_msg_truncate m = { seq, n_rows };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	kv_proto_encode_truncate(&w, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_TRUNCATE, &w, NULL, NULL, NULL, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	return r;
}

int kv_client_demand(struct kv_client *c, uint64_t pages, uint32_t n_reqs,
		     uint64_t grow, struct st_diag *diag)
{
	struct kv_msg_demand m = { pages, n_reqs, grow };
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	kv_proto_encode_demand(&w, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_DEMAND, &w, NULL, NULL, NULL, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	return r;
}

int kv_client_seq_free(struct kv_client *c, uint32_t seq)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	kv_proto_encode_seq(&w, seq);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_FREE, &w, NULL, NULL, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	return r;
}

static int need_model(const struct kv_client *c, const char *what,
		      struct st_diag *diag)
{
	if (c->model_id)
		return 0;
	return st_diag_set(diag, -EINVAL, "%s: no model id declared (use "
			   "kv_client_declare_model)", what);
}

int kv_client_seq_create_prefix(struct kv_client *c, const int32_t *ids,
				uint32_t n_ids, uint32_t *ret_seq,
				uint32_t *ret_n_cached, struct st_diag *diag)
{
	struct kv_msg_prefix m = {
		.model_id = c->model_id,
		.n_ids = ST_MIN(n_ids, (uint32_t)KV_PROTO_MAX_IDS),
		.ids = (int32_t *)ids };
	struct kv_msg_prefix_reply out;
	struct st_wbuf w;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r = need_model(c, "kv create_prefix", diag);

	if (r < 0)
		return r;
	if (n_ids == 0 || !ids)
		return st_diag_set(diag, -EINVAL, "kv create_prefix: no token "
				   "ids");
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 0, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_CREATE_PREFIX, &w, &buf, &p, &len, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	r = kv_proto_decode_prefix_reply(p, len, &out);
	free(buf);
	if (r < 0)
		return st_diag_set(diag, r, "kvd: malformed CREATE_PREFIX "
				   "reply");
	*ret_seq = out.seq;
	*ret_n_cached = out.n_cached;
	return 0;
}

int kv_client_seq_publish(struct kv_client *c, uint32_t seq,
			  const int32_t *ids, uint32_t n_ids,
			  struct st_diag *diag)
{
	return kv_client_seq_publish_flags(c, seq, ids, n_ids, 0, diag);
}

int kv_client_seq_publish_flags(struct kv_client *c, uint32_t seq,
				const int32_t *ids, uint32_t n_ids,
				uint32_t flags, struct st_diag *diag)
{
	struct kv_msg_prefix m = { seq, c->model_id,
				   ST_MIN(n_ids, (uint32_t)KV_PROTO_MAX_IDS),
				   (int32_t *)ids, flags };
	struct st_wbuf w;
	const uint8_t *p;
	uint32_t n = 0;
	void *buf;
	size_t len;
	int r = need_model(c, "kv publish", diag);

	if (r < 0)
		return r;
	if (n_ids == 0 || !ids)
		return 0;
	st_wbuf_init(&w);
	kv_proto_encode_prefix(&w, 1, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_PUBLISH, &w, &buf, &p, &len, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	r = kv_proto_decode_u32(p, len, &n);
	free(buf);
	if (r < 0 || n > INT32_MAX)
		return st_diag_set(diag, -ST_E_PROTO, "kvd: malformed PUBLISH "
				   "reply");
	return (int)n;
}

int kv_client_prefix_keys(struct kv_client *c, const int32_t *ids,
			  uint32_t n_ids, uint64_t *ret_keys, uint32_t cap)
{
	uint32_t B, n;
	int r;

	pthread_mutex_lock(&c->lock);
	B = c->attached ? c->lay.page_rows : 0;
	/* what kv_seq_create_prefix maps at most: the ids sent, the last
	 * one computed again, within a sequence's pages and rows */
	n = ST_MIN(n_ids, (uint32_t)KV_PROTO_MAX_IDS);
	n = B && n ? (n - 1) / B : 0;
	if (B) {
		n = ST_MIN(n, c->lay.max_pages_per_seq);
		n = ST_MIN(n, c->lay.max_rows_per_seq / B);
	}
	pthread_mutex_unlock(&c->lock);
	n = ST_MIN(n, cap);
	if (!c->model_id || n == 0)
		return 0;
	r = kv_prefix_keys(ids, B, c->model_id, n, ret_keys);
	return r < 0 ? r : (int)n;
}

int kv_client_prefix_ahead(struct kv_client *c, uint32_t n_chains,
			   const uint32_t *chain_len, const uint64_t *keys,
			   uint32_t *ret_spilled, struct st_diag *diag)
{
	struct kv_msg_prefix_ahead m = { n_chains, (uint32_t *)chain_len, 0,
					 (uint64_t *)keys };
	struct st_wbuf w;
	const uint8_t *p;
	uint32_t spilled = 0, held = 0;
	struct st_rbuf rb;
	void *buf;
	size_t len;
	int r;

	for (uint32_t i = 0; i < n_chains; i++)
		m.n_keys += chain_len[i];
	if (m.n_keys > KV_PROTO_MAX_AHEAD_KEYS)
		return st_diag_set(diag, -ST_E_LIMIT, "kv prefix ahead: %u "
				   "keys, at most %d", m.n_keys,
				   KV_PROTO_MAX_AHEAD_KEYS);
	st_wbuf_init(&w);
	kv_proto_encode_prefix_ahead(&w, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_PREFIX_AHEAD, &w, &buf, &p, &len, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	st_rbuf_init(&rb, p, len);
	r = st_rbuf_u32(&rb, &spilled) || st_rbuf_u32(&rb, &held) ||
	    st_rbuf_left(&rb);
	free(buf);
	if (r)
		return st_diag_set(diag, -ST_E_PROTO, "kvd: malformed "
				   "PREFIX_AHEAD reply");
	if (ret_spilled)
		*ret_spilled = spilled;
	return (int)ST_MIN(held, (uint32_t)INT32_MAX);
}

/* One KV_MSG_SESSION round trip; the reply payload in *ret_buf/p/len. */
static int session_rpc(struct kv_client *c, uint32_t op, const char *name,
		       const struct kv_session_ident *id, const int32_t *ids,
		       uint32_t n_ids, void **ret_buf, const uint8_t **ret_p,
		       size_t *ret_len, struct st_diag *diag)
{
	struct kv_msg_session m = { .op = op, .n_ids = n_ids,
				    .ids = (int32_t *)ids };
	struct st_wbuf w;
	int r;

	if (name && !kv_session_name_ok(name, diag))
		return -EINVAL;
	snprintf(m.name, sizeof(m.name), "%s", name ? name : "");
	if (id)
		m.ident = *id;
	st_wbuf_init(&w);
	kv_proto_encode_session(&w, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SESSION, &w, ret_buf, ret_p, ret_len, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	return r;
}

int kv_client_session_save(struct kv_client *c, const char *name,
			   const struct kv_session_ident *id,
			   const int32_t *ids, uint32_t n_ids,
			   uint32_t *ret_groups, int32_t *ret_replaced,
			   struct st_diag *diag)
{
	const uint8_t *p;
	void *buf;
	size_t len;
	struct st_rbuf rb;
	uint32_t rows;
	int32_t replaced = -1;
	int r;

	*ret_groups = 0;
	if (ret_replaced)
		*ret_replaced = -1;
	if (n_ids == 0 || n_ids > KV_PROTO_MAX_IDS)
		return st_diag_set(diag, -ST_E_LIMIT, "session save: %u token "
				   "ids (1 to %d)", n_ids,
				   (int)KV_PROTO_MAX_IDS);
	r = session_rpc(c, KV_SESSION_SAVE, name, id, ids, n_ids, &buf, &p,
			&len, diag);
	if (r < 0)
		return r;
	st_rbuf_init(&rb, p, len);
	if (st_rbuf_u32(&rb, ret_groups) || st_rbuf_u32(&rb, &rows) ||
	    st_rbuf_i32(&rb, &replaced) || st_rbuf_left(&rb))
		r = st_diag_set(diag, -ST_E_PROTO, "kvd: malformed SESSION "
				"reply");
	else if (ret_replaced)
		*ret_replaced = replaced;
	free(buf);
	return r;
}

int kv_client_session_load(struct kv_client *c, const char *name,
			   const struct kv_session_ident *id,
			   uint32_t *ret_placed, uint32_t *ret_rows,
			   int32_t **ret_ids, uint32_t *ret_n_ids,
			   struct st_diag *diag)
{
	const uint8_t *p;
	void *buf;
	size_t len;
	struct st_rbuf rb;
	uint32_t n = 0;
	int32_t *ids = NULL;
	int r;

	*ret_placed = *ret_rows = *ret_n_ids = 0;
	*ret_ids = NULL;
	r = session_rpc(c, KV_SESSION_LOAD, name, id, NULL, 0, &buf, &p, &len,
			diag);
	if (r < 0)
		return r;
	st_rbuf_init(&rb, p, len);
	if (st_rbuf_u32(&rb, ret_placed) || st_rbuf_u32(&rb, ret_rows) ||
	    st_rbuf_u32(&rb, &n) || n > KV_PROTO_MAX_IDS ||
	    st_rbuf_left(&rb) != (size_t)n * 4) {
		free(buf);
		return st_diag_set(diag, -ST_E_PROTO, "kvd: malformed SESSION "
				   "reply");
	}
	ids = malloc(sizeof(int32_t) * (n ? n : 1));
	if (!ids) {
		free(buf);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		st_rbuf_i32(&rb, &ids[i]);
	free(buf);
	*ret_ids = ids;
	*ret_n_ids = n;
	return 0;
}

int kv_client_session_list(struct kv_client *c, uint32_t cap,
			   struct kv_session_info *ret, uint32_t *ret_n,
			   struct st_diag *diag)
{
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	*ret_n = 0;
	r = session_rpc(c, KV_SESSION_LIST, NULL, NULL, NULL, 0, &buf, &p,
			&len, diag);
	if (r < 0)
		return r;
	r = kv_proto_decode_session_list(p, len, cap, ret, ret_n);
	free(buf);
	if (r < 0)
		return st_diag_set(diag, r, "kvd: malformed SESSION LIST "
				   "reply (or more than %u sessions)", cap);
	return 0;
}

int kv_client_session_remove(struct kv_client *c, const char *name,
			     struct st_diag *diag)
{
	return session_rpc(c, KV_SESSION_REMOVE, name, NULL, NULL, 0, NULL,
			   NULL, NULL, diag);
}

static int residency(struct kv_client *c, uint32_t op, int n,
		     const uint32_t *seqs, int32_t *ret_status,
		     struct st_diag *diag)
{
	struct kv_msg_residency m = { op, (uint32_t)n, (uint32_t *)seqs };
	int32_t *status;
	struct st_wbuf w;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	if (n <= 0 || n > KV_PROTO_MAX_RESERVE || !seqs)
		return st_diag_set(diag, n <= 0 ? -EINVAL : -ST_E_LIMIT,
				   "kv restore/pin: %d sequences, must be "
				   "1..%d", n, KV_PROTO_MAX_RESERVE);
	status = ret_status ? ret_status : malloc(sizeof(int32_t) * (size_t)n);
	if (!status)
		return -ENOMEM;
	st_wbuf_init(&w);
	kv_proto_encode_residency(&w, &m);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_RESIDENCY, &w, &buf, &p, &len, diag);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	if (r == 0) {
		r = kv_proto_decode_status_list(p, len, (uint32_t)n, status,
						diag);
		free(buf);
		if (r < 0) {
			r = st_diag_set(diag, -ST_E_PROTO, "kvd: malformed "
					"SEQ_RESIDENCY reply");
		} else {
			for (int i = 0; i < n && r == 0; i++)
				r = status[i];
		}
	}
	if (status != ret_status)
		free(status);
	return r;
}

int kv_client_seq_restore(struct kv_client *c, int n, const uint32_t *seqs,
			  int32_t *ret_status, struct st_diag *diag)
{
	return residency(c, KV_RESIDENCY_RESTORE, n, seqs, ret_status, diag);
}

int kv_client_seq_pin(struct kv_client *c, int n, const uint32_t *seqs,
		      int32_t *ret_status, struct st_diag *diag)
{
	return residency(c, KV_RESIDENCY_PIN, n, seqs, ret_status, diag);
}

int kv_client_seq_unpin(struct kv_client *c, int n, const uint32_t *seqs,
			struct st_diag *diag)
{
	return residency(c, KV_RESIDENCY_UNPIN, n, seqs, NULL, diag);
}

int kv_client_seq_prefetch(struct kv_client *c, int n, const uint32_t *seqs,
			   int32_t *ret_status, struct st_diag *diag)
{
	return residency(c, KV_RESIDENCY_PREFETCH, n, seqs, ret_status, diag);
}

int kv_client_seq_restore_ahead(struct kv_client *c, int n,
				const uint32_t *seqs, int32_t *ret_status,
				struct st_diag *diag)
{
	return residency(c, KV_RESIDENCY_AHEAD, n, seqs, ret_status, diag);
}

uint64_t kv_client_device_pages(const struct kv_client *c, int n,
				const struct kv_reserve_entry *e)
{
	uint64_t t = 0;

	if (!c->attached || !c->lay.page_rows)
		return 0;
	for (int i = 0; i < n; i++)
		t += (uint64_t)c->lay.n_streams *
		     kv_pages_for_rows(e[i].n_rows, c->lay.page_rows);
	return t;
}

int kv_client_seq_device(struct kv_client *c, int n,
			 const struct kv_reserve_entry *e, uint64_t *ret_epoch,
			 struct kv_devpage *ret_pages, uint64_t cap,
			 struct st_diag *diag)
{
	struct st_wbuf w;
	const uint8_t *p;
	uint64_t want;
	void *buf;
	size_t len;
	int r;

	if (n <= 0 || n > KV_PROTO_MAX_RESERVE || !e)
		return st_diag_set(diag, n <= 0 ? -EINVAL : -ST_E_LIMIT,
				   "kv device pages: %d sequences, must be "
				   "1..%d", n, KV_PROTO_MAX_RESERVE);
	st_wbuf_init(&w);
	kv_devpage_encode_req(&w, (uint32_t)n, e);
	pthread_mutex_lock(&c->lock);
	r = rpc(c, KV_MSG_SEQ_DEVICE, &w, &buf, &p, &len, diag);
	/* the geometry is read under the lock: a re-declaration in rpc may
	 * have mapped a new pool */
	want = kv_client_device_pages(c, n, e);
	pthread_mutex_unlock(&c->lock);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	if (want > KV_DEVPAGE_MAX_PAGES || want > cap)
		r = st_diag_set(diag, -ST_E_PROTO, "kvd answered SEQ_DEVICE "
				"for %llu pages", (unsigned long long)want);
	else
		r = kv_devpage_decode_rep(p, len, (uint32_t)want, ret_epoch,
					  ret_pages, diag);
	free(buf);
	return r;
}

/* Index of a live handle in the mapped pool, or -1. */
static int64_t seq_index(const struct kv_client *c, uint32_t seq)
{
	uint32_t idx = kv_seq_index(seq), gen = kv_seq_gen(seq);
	const struct kv_seq_entry *e;

	if (!c->attached || idx >= c->lay.max_seqs || gen == 0)
		return -1;
	e = &c->seqs[idx];
	if (atomic_load_explicit(&e->state, memory_order_acquire) !=
		    KV_SEQ_LIVE ||
	    atomic_load_explicit(&e->generation, memory_order_relaxed) != gen)
		return -1;
	return idx;
}

uint8_t *kv_client_row(struct kv_client *c, uint32_t seq, int stream,
		       uint32_t row)
{
	const struct kv_layout *l = &c->lay;
	int64_t idx = seq_index(c, seq);
	uint32_t pi, page;

	if (idx < 0 || stream < 0 || (uint32_t)stream >= l->n_streams)
		return NULL;
	pi = kv_stream_row_page(&c->streams[stream], l->page_rows, row);
	if (pi >= l->max_pages_per_seq)
		return NULL;
	page = __atomic_load_n(&c->table[kv_table_index(l, (uint32_t)idx,
							(uint32_t)stream, pi)],
			       __ATOMIC_ACQUIRE);
	if (page >= l->n_pages)
		return NULL;
	return c->data + (uint64_t)page * l->page_bytes +
	       (uint64_t)kv_stream_row_slot(&c->streams[stream], l->page_rows,
					    row) *
		       c->streams[stream].row_bytes;
}

int kv_client_seq_resident(struct kv_client *c, uint32_t seq)
{
	int64_t idx = seq_index(c, seq);

	if (idx < 0)
		return -ST_E_NOTFOUND;
	if (atomic_load(&c->seqs[idx].flags) & KV_SEQ_F_FAILED)
		return -ST_E_CHECKSUM;
	return __atomic_load_n(&c->seqs[idx].n_spilled, __ATOMIC_ACQUIRE) == 0;
}

uint8_t *kv_client_row_writable(struct kv_client *c, uint32_t seq, int stream,
				uint32_t row)
{
	const struct kv_layout *l = &c->lay;
	uint8_t *ptr = kv_client_row(c, seq, stream, row);
	uint64_t page;

	if (!ptr)
		return NULL;
	page = (uint64_t)(ptr - c->data) / l->page_bytes;
	if (atomic_load(&c->pages[page].refcount) != 1 ||
	    atomic_load(&c->pages[page].key) != 0)
		return NULL;
	return ptr;
}

int64_t kv_client_seq_rows(struct kv_client *c, uint32_t seq)
{
	int64_t idx = seq_index(c, seq);

	if (idx < 0)
		return c->attached ? -ST_E_NOTFOUND : -ST_E_PROTO;
	return atomic_load(&c->seqs[idx].n_rows);
}

uint32_t kv_client_page_rows(const struct kv_client *c)
{
	return c->attached ? c->lay.page_rows : 0;
}

uint32_t kv_client_row_bytes(const struct kv_client *c, int stream)
{
	if (!c->attached || stream < 0 || (uint32_t)stream >= c->lay.n_streams)
		return 0;
	return c->streams[stream].row_bytes;
}

void kv_client_abort_wait(struct kv_client *c)
{
	if (c)
		atomic_store(&c->abort_wait, 1);
}

void kv_client_set_restart_wait(struct kv_client *c, int wait_ms)
{
	pthread_mutex_lock(&c->lock);
	c->restart_wait_ms = wait_ms > 0 ? wait_ms : 0;
	pthread_mutex_unlock(&c->lock);
}

uint32_t kv_client_reconnects(struct kv_client *c)
{
	uint32_t n;

	pthread_mutex_lock(&c->lock);
	n = c->reconnects;
	pthread_mutex_unlock(&c->lock);
	return n;
}

uint32_t kv_client_id(const struct kv_client *c)
{
	return c->id;
}

int kv_client_ping(struct kv_client *c, int32_t *ret_pid,
		   uint64_t *ret_epoch)
{
	struct kv_msg_ping_reply out;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	pthread_mutex_lock(&c->lock);
	r = rpc(c, ST_MSG_PING, NULL, &buf, &p, &len, NULL);
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	r = kv_proto_decode_ping_reply(p, len, &out);
	free(buf);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	check_epoch(c, out.epoch, 0); /* PING does not carry the pool id */
	pthread_mutex_unlock(&c->lock);
	if (ret_pid)
		*ret_pid = (int32_t)out.pid;
	if (ret_epoch)
		*ret_epoch = out.epoch;
	return 0;
}

int kv_client_stats(struct kv_client *c, struct kv_stats *ret)
{
	struct kv_msg_stats m;
	const uint8_t *p;
	void *buf;
	size_t len;
	int r;

	pthread_mutex_lock(&c->lock);
	r = rpc(c, ST_MSG_STATS, NULL, &buf, &p, &len, NULL);
	pthread_mutex_unlock(&c->lock);
	if (r < 0)
		return r;
	r = kv_proto_decode_stats(p, len, &m);
	free(buf);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	check_epoch(c, m.epoch, m.pool_id);
	pthread_mutex_unlock(&c->lock);
	memset(ret, 0, sizeof(*ret));
	ret->budget_bytes = m.budget_bytes;
	ret->pool_bytes = m.pool_bytes;
	ret->page_bytes = m.page_bytes;
	ret->page_rows = m.page_rows;
	ret->n_streams = m.n_streams;
	ret->n_pages = m.n_pages;
	ret->pages_used = m.pages_used;
	ret->pages_peak = m.pages_peak;
	ret->n_seqs = m.n_seqs;
	ret->pages_shared = m.pages_shared;
	ret->epoch = m.epoch;
	ret->pool_id = m.pool_id;
	ret->pid = m.pid;
	ret->n_clients = m.n_clients;
	ret->max_seqs = m.max_seqs;
	ret->max_rows_per_seq = m.max_rows_per_seq;
	ret->pages_cached = m.pages_cached;
	ret->cache_groups = m.cache_groups;
	ret->prefix_lookups = m.prefix_lookups;
	ret->prefix_pages_hit = m.prefix_pages_hit;
	ret->prefix_rows_reused = m.prefix_rows_reused;
	ret->prefix_published = m.prefix_published;
	ret->cache_evictions = m.cache_evictions;
	ret->spill_budget_bytes = m.spill_budget_bytes;
	ret->slot_bytes = m.slot_bytes;
	ret->n_slots = m.n_slots;
	ret->pages_spilled = m.pages_spilled;
	ret->spill_pages_total = m.spill_pages_total;
	ret->spill_bytes_total = m.spill_bytes_total;
	ret->spill_ns_total = m.spill_ns_total;
	ret->restore_pages_total = m.restore_pages_total;
	ret->restore_bytes_total = m.restore_bytes_total;
	ret->restore_ns_total = m.restore_ns_total;
	ret->restore_failures = m.restore_failures;
	ret->spill_direct = m.spill_direct;
	ret->n_pinned = m.n_pinned;
	ret->remote_on = m.remote_on;
	ret->remote_hits = m.remote_hits;
	ret->remote_misses = m.remote_misses;
	ret->remote_bytes_in = m.remote_bytes_in;
	ret->remote_bytes_out = m.remote_bytes_out;
	ret->remote_errors = m.remote_errors;
	ret->remote_published = m.remote_published;
	ret->remote_rejected = m.remote_rejected;
	ret->prefix_ahead_groups = m.prefix_ahead_groups;
	ret->prefix_ahead_bytes = m.prefix_ahead_bytes;
	ret->prefix_lookup_restores = m.prefix_lookup_restores;
	ret->prefix_lookup_restore_ns = m.prefix_lookup_restore_ns;
	return 0;
}

int kv_client_shutdown(struct kv_client *c)
{
	int r;

	pthread_mutex_lock(&c->lock);
	r = rpc(c, ST_MSG_SHUTDOWN, NULL, NULL, NULL, NULL, NULL);
	pthread_mutex_unlock(&c->lock);
	return r;
}

uint64_t kv_client_model_id(const struct kv_client *c)
{
	return c->model_id;
}
