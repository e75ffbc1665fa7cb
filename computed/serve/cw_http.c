/*
 * cw_http.c — the HTTP server of computed: libmicrohttpd plumbing
 * (connections, bodies, authentication, routing, SSE streaming); the
 * OpenAI request and response objects are in cw_http_api.c.  See
 * cw_http.h.
 */
#include "cw_http.h"
#include "cw_session.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cw_http_api.h"
#include "st_daemon.h"
#include "st_ioq.h"
#include "st_log.h"
#include "st_util.h"

#define CW_HTTP_PING_NS (2ull * 1000000000ull) /* SSE keep-alive comment */
#define CW_HTTP_POLL_MS 50  /* checks for a disconnected client */
#define CW_HTTP_DRAIN_BYTES (64ull << 20) /* oversized bodies read, dropped */
#define CW_HTTP_PROBE_NS (1000000000ull) /* half-closed client: probe period */
#define CW_HTTP_WATCH_MS 200 /* request-deadline checks */

/*
 * One TCP connection, from accept to close (MHD's socket context): the
 * request-time watchdog ends a connection whose request (head and body)
 * has not fully arrived CW_HTTP request_timeout_s after the connection
 * opened or its previous response ended, so slow clients (a byte every
 * few seconds, which resets any idle timer) cannot hold every slot.
 */
struct sock {
	struct sock *prev, *next;        /* cw_http.socks, under socks_mu */
	int fd;
	int receiving;                   /* a request is being received */
	int cut;                         /* the watchdog shut it down */
	uint64_t deadline_ns;            /* ... by then */
};

struct cw_http {
	struct cw_http_opts o;
	char bind_addr[64], api_key[256], model_name[256], run_dir[4096];
	struct MHD_Daemon *mhd;
	struct cw_api api;               /* what the API handlers need */
	struct cw_sched *sched;
	struct es_client *es;
	struct kv_client *kv;
	struct cw_metrics *metrics;
	volatile int stopping;           /* cw_http_stop: end the waits */
	pthread_mutex_t socks_mu;
	struct sock *socks;              /* open connections */
	pthread_t watch;
	int watch_started;
};

/* Per connection: the request body as it arrives. */
struct conn {
	char *body;
	size_t len, cap;
	int too_large;
	int http11;                      /* HTTP/1.1: interim 1xx allowed */
	uint64_t probe_ns;               /* last half-close probe */
};

/* A streaming response: SSE bytes produced from the request's events. */
struct stream {
	struct cw_http *h;
	struct MHD_Connection *conn;
	struct cw_api_gen g;             /* request, state, ids */
	char *pend;                      /* bytes not yet handed to MHD */
	size_t pend_len, pend_off;
	int ended;                       /* [DONE] queued */
	uint64_t last_out_ns;
};

/*
 * 1 when the client is gone: its connection was reset or failed.  A FIN
 * alone (POLLRDHUP) is not that: a client may half-close after sending
 * its request (shutdown(SHUT_WR), as `nc -N` does) and still read the
 * answer.  A client that closed for good is told apart by sending it
 * bytes, which its kernel answers with a reset (POLLERR/POLLHUP on a
 * later poll): cs given (a whole response still to come on an HTTP/1.1
 * connection), an interim "100 Continue", which HTTP/1.1 clients skip
 * (RFC 9110 section 15.2), is sent once a second while the FIN stands;
 * a stream (cs NULL) probes with its own events and keep-alive comments.
 */
static int client_gone(struct MHD_Connection *c, struct conn *cs)
{
	static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct pollfd p;

	if (!ci)
		return 0;
	p.fd = ci->connect_fd;
	p.events = POLLRDHUP;
	p.revents = 0;
	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLHUP | POLLERR | POLLNVAL))
		return 1;
	if ((p.revents & POLLRDHUP) && cs && cs->http11 &&
	    st_now_ns() - cs->probe_ns >= CW_HTTP_PROBE_NS) {
		cs->probe_ns = st_now_ns();
		if (send(p.fd, probe, sizeof(probe) - 1,
			 MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
			return 1;
	}
	return 0;
}

static enum MHD_Result queue_text(struct cw_http *h, struct MHD_Connection *c,
				  enum cw_metrics_endpoint ep, int status,
				  const char *type, const char *text,
				  const char *retry_after)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", type);
	if (retry_after)
		MHD_add_response_header(r, "Retry-After", retry_after);
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	ret = MHD_queue_response(c, (unsigned)status, r);
	MHD_destroy_response(r);
	cw_metrics_response(h->metrics, ep, status);
	return ret;
}

static enum MHD_Result queue_json(struct cw_http *h, struct MHD_Connection *c,
				  enum cw_metrics_endpoint ep, int status,
				  json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	enum MHD_Result r;

	json_decref(j);
	if (!s)
		return MHD_NO;
	r = queue_text(h, c, ep, status, "application/json", s,
		       status == 429 || status == 503 ? "1" : NULL);
	free(s);
	return r;
}

static enum MHD_Result queue_error(struct cw_http *h, struct MHD_Connection *c,
				   enum cw_metrics_endpoint ep,
				   const struct cw_api_error *e)
{
	return queue_json(h, c, ep, e->status, cw_api_error_json(e));
}

static enum MHD_Result simple_error(struct cw_http *h,
				    struct MHD_Connection *c,
				    enum cw_metrics_endpoint ep, int status,
				    const char *type, const char *msg)
{
	struct cw_api_error e = { .status = status };

	snprintf(e.type, sizeof(e.type), "%s", type);
	snprintf(e.message, sizeof(e.message), "%s", msg);
	return queue_error(h, c, ep, &e);
}

/* The two tier daemons answer a PING within 500 ms. */
static void tiers_up(struct cw_http *h, int *ret_es, int *ret_kv)
{
	char path[4200];

	st_run_path(h->run_dir, "expertd", "ctl", path, sizeof(path));
	*ret_es = st_daemon_ping(path, 500, NULL) == 0;
	st_run_path(h->run_dir, "kvd", "ctl", path, sizeof(path));
	*ret_kv = st_daemon_ping(path, 500, NULL) == 0;
}

static enum MHD_Result do_health(struct cw_http *h, struct MHD_Connection *c)
{
	int es, kv;
	json_t *j;

	tiers_up(h, &es, &kv);
	j = json_pack("{s:s,s:s,s:s,s:s}", "status", es && kv ? "ok" :
		      "unavailable", "computed", "up", "expertd",
		      es ? "up" : "down", "kvd", kv ? "up" : "down");
	return queue_json(h, c, CW_EP_HEALTH, es && kv ? 200 : 503, j);
}

static enum MHD_Result do_metrics(struct cw_http *h, struct MHD_Connection *c)
{
	struct cw_metrics_ext x = { 0 };
	struct cw_read_stats rs;
	struct es_stats es;
	struct kv_stats kv;
	char *text = NULL;
	enum MHD_Result r;

	cw_sched_counts(h->sched, &x.running, &x.queued);
	x.max_running = h->o.sched.max_running;
	x.max_queued = h->o.sched.max_queued;
	tiers_up(h, &x.es_ok, &x.kv_ok);
	if (x.es_ok && es_client_stats(h->es, &es) == 0) {
		x.es_hits = es.hits;
		x.es_misses = es.misses;
		x.es_evictions = es.evictions;
		x.es_loads = es.loads;
		x.es_load_bytes = es.load_bytes;
		x.es_slots = es.n_slots;
		x.es_slots_used = es.slots_used;
		x.es_pool_bytes = es.pool_bytes;
		x.es_epoch = es.epoch;
	}
	if (x.es_ok) {
		struct es_tier_stats t;

		es_client_tier_stats(h->es, &t);
		x.es_prefetch_loads = t.prefetch_loads;
		x.es_prefetch_used = t.prefetch_used;
		x.es_prefetch_wasted = t.prefetch_wasted;
		x.es_hints = t.hints;
		x.es_hints_dropped = t.hints_dropped;
	}
	if (x.kv_ok && kv_client_stats(h->kv, &kv) == 0) {
		x.kv_pages_used = kv.pages_used;
		x.kv_pages_total = kv.n_pages;
		x.kv_pages_peak = kv.pages_peak;
		x.kv_page_bytes = kv.page_bytes;
		x.kv_spilled_pages = kv.pages_spilled;
		x.kv_spill_total = kv.spill_pages_total;
		x.kv_restore_total = kv.restore_pages_total;
		x.kv_prefix_lookups = kv.prefix_lookups;
		x.kv_prefix_rows_reused = kv.prefix_rows_reused;
		x.kv_prefix_ahead_groups = kv.prefix_ahead_groups;
		x.kv_prefix_ahead_bytes = kv.prefix_ahead_bytes;
		x.kv_admit_restores = kv.prefix_lookup_restores;
		x.kv_admit_restore_ns = kv.prefix_lookup_restore_ns;
		x.kv_epoch = kv.epoch;
		x.kv_remote_on = kv.remote_on != 0;
		x.kv_remote_hits = kv.remote_hits;
		x.kv_remote_misses = kv.remote_misses;
		x.kv_remote_bytes_in = kv.remote_bytes_in;
		x.kv_remote_bytes_out = kv.remote_bytes_out;
		x.kv_remote_errors = kv.remote_errors;
	}
	if (h->o.instance) {
		struct st_diag d = { { 0 } };

		x.io_on = st_ioq_read_totals(h->o.instance, &x.io, &d) == 0;
		x.mem_on = st_ledger_read(h->o.instance, &x.mem, &d) == 0;
	}
	cw_model_read_stats(h->api.model, &rs);
	x.expert_bytes = rs.expert_bytes;
	x.dense_bytes = rs.dense_bytes;
	x.lm_head_bytes = rs.lm_head_bytes;
	x.expert_stall_ns = rs.expert_stall_ns;
	if (x.es_ok && cw_model_is_dsv41(h->api.model)) {
		struct es_engram_stats en;
		struct st_diag d = { { 0 } };

		if (es_client_engram_stats(h->es, &en, &d) == 0) {
			x.engram_ok = 1;
			x.en_lookups = en.lookups;
			x.en_hits = en.hits;
			x.en_merged = en.merged;
			x.en_misses = en.misses;
			x.en_reads = en.reads;
			x.en_read_bytes = en.read_bytes;
			x.en_lat_p50_ns = en.lat_p50_ns;
			x.en_lat_p99_ns = en.lat_p99_ns;
		}
	}
	if (cw_metrics_render(h->metrics, &x, &text) < 0)
		return MHD_NO;
	r = queue_text(h, c, CW_EP_METRICS, 200,
		       "text/plain; version=0.0.4; charset=utf-8", text, NULL);
	free(text);
	return r;
}

static void stream_append(struct stream *s, const char *data, size_t n)
{
	if (s->pend_off == s->pend_len)
		s->pend_off = s->pend_len = 0;
	{
		char *p = realloc(s->pend, s->pend_len + n);

		if (!p)
			return; /* the client sees a truncated stream */
		s->pend = p;
	}
	memcpy(s->pend + s->pend_len, data, n);
	s->pend_len += n;
}

static void stream_data(struct stream *s, json_t *j)
{
	char *t = json_dumps(j, JSON_COMPACT);

	json_decref(j);
	if (!t)
		return;
	stream_append(s, "data: ", 6);
	stream_append(s, t, strlen(t));
	stream_append(s, "\n\n", 2);
	free(t);
}

/* MHD asks for more of the body: SSE events as the scheduler produces
 * them.  Blocks (this connection's own thread) in short waits so that a
 * client that went away is noticed within about one step. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct stream *s = cls;

	(void)pos;
	for (;;) {
		struct cw_sched_event ev;

		if (s->pend_off < s->pend_len) {
			size_t n = ST_MIN(max, s->pend_len - s->pend_off);

			memcpy(buf, s->pend + s->pend_off, n);
			s->pend_off += n;
			s->last_out_ns = st_now_ns();
			return (ssize_t)n;
		}
		if (s->ended)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (s->h->stopping || client_gone(s->conn, NULL)) {
			cw_sched_cancel(s->g.req);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (cw_sched_next_event(s->g.req, CW_HTTP_POLL_MS, &ev)) {
			json_t *chunk = cw_api_stream_event(&s->h->api, &s->g,
							    &ev);

			free(ev.text);
			if (chunk)
				stream_data(s, chunk);
			if (s->g.finished) {
				json_t *u = cw_api_stream_usage(&s->h->api,
								&s->g);

				if (u)
					stream_data(s, u);
				stream_append(s, "data: [DONE]\n\n", 14);
				s->ended = 1;
			}
			continue;
		}
		if (st_now_ns() - s->last_out_ns > CW_HTTP_PING_NS) {
			/* an SSE comment: keeps proxies from timing out and
			 * finds a closed connection while queued */
			stream_append(s, ": keep-alive\n\n", 14);
		}
	}
}

static void stream_free(void *cls)
{
	struct stream *s = cls;

	cw_sched_release(s->g.req);
	cw_api_gen_fini(&s->g);
	free(s->pend);
	free(s);
}

/*
 * A tier daemon known down (st_daemon_down: its process is gone, as
 * /health would report): fills *e with a 503 naming it and its remedy and
 * returns 1, so a new request is answered at once (queue_json adds
 * Retry-After) instead of after computed's restart wait; 0 when both run.
 */
static int tier_down(struct cw_http *h, struct cw_api_error *e)
{
	int es = st_daemon_down(h->run_dir, "expertd", 200);
	int kv = st_daemon_down(h->run_dir, "kvd", 200);

	if (!es && !kv)
		return 0;
	e->status = 503;
	snprintf(e->type, sizeof(e->type), "server_error");
	e->param[0] = 0;
	snprintf(e->code, sizeof(e->code), "%s", es && kv ? "tiers_down" :
		 es ? "expertd_down" : "kvd_down");
	if (es && kv)
		snprintf(e->message, sizeof(e->message), "expertd and kvd are "
			 "down (see /health): restart them with `strata "
			 "restart expertd` and `strata restart kvd`, then "
			 "retry");
	else
		snprintf(e->message, sizeof(e->message), "%s is down (see "
			 "/health): restart it with `strata restart %s`, then "
			 "retry", es ? "expertd" : "kvd", es ? "expertd" : "kvd");
	st_warn("http: %s", e->message);
	return 1;
}

/* POST /v1/completions and /v1/chat/completions. */
static enum MHD_Result do_generate(struct cw_http *h, struct MHD_Connection *c,
				   struct conn *cs, int chat)
{
	const enum cw_metrics_endpoint ep = chat ? CW_EP_CHAT : CW_EP_COMPLETIONS;
	struct cw_api_error err = { 0 };
	struct cw_api_gen g;
	int r;

	if (tier_down(h, &err))
		return queue_error(h, c, ep, &err);
	r = cw_api_gen_start(&h->api, h->sched, chat, cs->body, cs->len, &g,
			     &err);
	if (r < 0)
		return queue_error(h, c, ep, &err);
	if (g.stream) {
		struct stream *s = calloc(1, sizeof(*s));
		struct MHD_Response *resp;
		enum MHD_Result ret;

		if (!s) {
			cw_sched_release(g.req);
			cw_api_gen_fini(&g);
			return MHD_NO;
		}
		s->h = h;
		s->conn = c;
		s->g = g;
		s->last_out_ns = st_now_ns();
		resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
							 stream_read, s,
							 stream_free);
		if (!resp) {
			stream_free(s);
			return MHD_NO;
		}
		MHD_add_response_header(resp, "Content-Type",
					"text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		ret = MHD_queue_response(c, 200, resp);
		MHD_destroy_response(resp);
		cw_metrics_response(h->metrics, ep, 200);
		return ret;
	}
	/* whole response: wait for the end, watching the connection (also
	 * while events keep coming: a fast decode never leaves the wait
	 * idle for a whole poll period) */
	for (uint64_t checked_ns = st_now_ns();;) {
		struct cw_sched_event ev;
		int got = cw_sched_next_event(g.req, CW_HTTP_POLL_MS, &ev);

		if (got) {
			cw_api_collect_event(&h->api, &g, &ev);
			free(ev.text);
			if (g.finished)
				break;
			if (st_now_ns() - checked_ns <
			    (uint64_t)CW_HTTP_POLL_MS * 1000000ull)
				continue;
		}
		checked_ns = st_now_ns();
		if (h->stopping || client_gone(c, cs)) {
			cw_sched_release(g.req);
			cw_api_gen_fini(&g);
			cw_metrics_response(h->metrics, ep, 499);
			return MHD_NO;
		}
	}
	{
		json_t *j = NULL;

		r = cw_api_final_json(&h->api, &g, &j, &err);
		cw_sched_release(g.req);
		cw_api_gen_fini(&g);
		if (r < 0)
			return queue_error(h, c, ep, &err);
		return queue_json(h, c, ep, 200, j);
	}
}

/* GET /v1/models and /v1/models/{id}. */
static enum MHD_Result do_models(struct cw_http *h, struct MHD_Connection *c,
				 const char *url)
{
	struct cw_api_error err;
	json_t *j;

	if (!url[10])
		return queue_json(h, c, CW_EP_MODELS, 200,
				  cw_api_models_json(&h->api));
	j = cw_api_model_json(&h->api, url + 11, &err);
	return j ? queue_json(h, c, CW_EP_MODELS, 200, j) :
		   queue_error(h, c, CW_EP_MODELS, &err);
}

/* POST /v1/sessions/NAME: saves the cached KV of the conversation in the
 * body ({"prompt": ...} or {"messages": [...]}). */
static enum MHD_Result session_save(struct cw_http *h, struct MHD_Connection *c,
				    const struct conn *cs, const char *name)
{
	struct cw_api_error err;
	struct st_diag d = { "" };
	json_t *b = cs->body ? json_loads(cs->body, 0, NULL) : NULL, *j;
	int32_t *ids = NULL;
	size_t n = 0;
	int status;

	if (!json_is_object(b)) {
		json_decref(b);
		return simple_error(h, c, CW_EP_OTHER, 400,
				    "invalid_request_error", "the body must "
				    "be a JSON object with the conversation: "
				    "'prompt' or 'messages'");
	}
	if (cw_api_encode_conversation(&h->api, b, &ids, &n, &err) < 0) {
		json_decref(b);
		return queue_error(h, c, CW_EP_OTHER, &err);
	}
	json_decref(b);
	j = cw_session_save_ids(h->kv, h->o.sched.session, name, ids, (int)n,
				&status, &d);
	free(ids);
	if (j)
		return queue_json(h, c, CW_EP_OTHER, 200, j);
	return simple_error(h, c, CW_EP_OTHER, status,
			    status >= 500 ? "server_error" :
					    "invalid_request_error", d.msg);
}

/* /v1/sessions (GET), /v1/sessions/NAME (POST: save; DELETE),
 * /v1/sessions/NAME/load (POST): cw_session.h. */
static enum MHD_Result do_sessions(struct cw_http *h, struct MHD_Connection *c,
				   const struct conn *cs, const char *url,
				   const char *method)
{
	char name[80] = "";
	struct st_diag d = { "" };
	int load = 0, status;
	json_t *j;

	if (url[12] == '/') {
		const char *n = url + 13, *slash = strchr(n, '/');
		size_t len = slash ? (size_t)(slash - n) : strlen(n);

		if (len >= sizeof(name) || (slash && strcmp(slash, "/load")))
			return simple_error(h, c, CW_EP_OTHER, 404,
					    "invalid_request_error",
					    "no such endpoint; see "
					    "/v1/sessions");
		memcpy(name, n, len);
		name[len] = 0;
		load = slash != NULL;
	}
	if (!h->kv || !h->o.sched.session)
		return simple_error(h, c, CW_EP_OTHER, 503, "server_error",
				    "sessions need kvd (computed runs "
				    "without it)");
	if (url[12] == '/' && !load && !strcmp(method, "POST"))
		return session_save(h, c, cs, name);
	j = cw_session_http(h->kv, h->o.sched.session, method,
			    url[12] == '/' ? name : NULL, load, &status, &d);
	if (j)
		return queue_json(h, c, CW_EP_OTHER, 200, j);
	return simple_error(h, c, CW_EP_OTHER, status,
			    status >= 500 ? "server_error" :
					    "invalid_request_error", d.msg);
}

/* Constant-time comparison of the bearer token with the key. */
static int auth_ok(const struct cw_http *h, struct MHD_Connection *c)
{
	const char *a;
	size_t n, k;
	unsigned diff = 0;

	if (!h->api_key[0])
		return 1;
	a = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
					MHD_HTTP_HEADER_AUTHORIZATION);
	if (!a || strncasecmp(a, "Bearer ", 7) != 0)
		return 0;
	a += 7;
	n = strlen(a);
	k = strlen(h->api_key);
	diff = n != k;
	for (size_t i = 0; i < n && i < k; i++)
		diff |= (unsigned)(a[i] ^ h->api_key[i]);
	return diff == 0;
}

/* The connection's watchdog record (MHD's socket context), or NULL. */
static struct sock *sock_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* receiving 0: the request on c is complete, no deadline while it is
 * answered; 1: c waits for a (next) request, which must arrive within
 * request_timeout_s. */
static void request_state(struct cw_http *h, struct MHD_Connection *c,
			  int receiving)
{
	struct sock *k = sock_of(c);

	if (!k)
		return;
	pthread_mutex_lock(&h->socks_mu);
	k->receiving = receiving;
	k->deadline_ns = st_now_ns() +
			 (uint64_t)h->o.request_timeout_s * 1000000000ull;
	pthread_mutex_unlock(&h->socks_mu);
}

/* MHD: a connection opened (record it, deadline set) or closed. */
static void on_connection(void *cls, struct MHD_Connection *c,
			  void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct cw_http *h = cls;
	struct sock *k = *socket_context;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
			c, MHD_CONNECTION_INFO_CONNECTION_FD);

		k = calloc(1, sizeof(*k));
		if (!k || !ci) {
			free(k);
			return; /* unwatched: the idle timeout still holds */
		}
		k->fd = ci->connect_fd;
		k->receiving = 1;
		k->deadline_ns = st_now_ns() +
				 (uint64_t)h->o.request_timeout_s * 1000000000ull;
		pthread_mutex_lock(&h->socks_mu);
		k->next = h->socks;
		if (h->socks)
			h->socks->prev = k;
		h->socks = k;
		pthread_mutex_unlock(&h->socks_mu);
		*socket_context = k;
		return;
	}
	if (!k)
		return;
	pthread_mutex_lock(&h->socks_mu);
	if (k->prev)
		k->prev->next = k->next;
	else
		h->socks = k->next;
	if (k->next)
		k->next->prev = k->prev;
	pthread_mutex_unlock(&h->socks_mu);
	free(k);
	*socket_context = NULL;
}

/* The request-time watchdog: shuts down (both ways) each connection
 * past its deadline; MHD's thread of that connection then reads the end
 * and closes it.  The fd stays open until then, so it is never another
 * connection's. */
static void *watch_main(void *arg)
{
	struct cw_http *h = arg;

	while (!h->stopping) {
		uint64_t now = st_now_ns();
		int n_cut = 0;

		pthread_mutex_lock(&h->socks_mu);
		for (struct sock *k = h->socks; k; k = k->next)
			if (k->receiving && !k->cut && now > k->deadline_ns) {
				shutdown(k->fd, SHUT_RDWR);
				k->cut = 1;
				n_cut++;
			}
		pthread_mutex_unlock(&h->socks_mu);
		if (n_cut)
			st_info("http: closed %d connection(s) that did not "
				"send a whole request within %d s "
				"(--http-request-timeout)", n_cut,
				h->o.request_timeout_s);
		poll(NULL, 0, CW_HTTP_WATCH_MS);
	}
	return NULL;
}

static enum cw_metrics_endpoint endpoint_of(const char *url)
{
	if (!strcmp(url, "/v1/completions"))
		return CW_EP_COMPLETIONS;
	if (!strcmp(url, "/v1/chat/completions"))
		return CW_EP_CHAT;
	if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", 11))
		return CW_EP_MODELS;
	if (!strcmp(url, "/health"))
		return CW_EP_HEALTH;
	if (!strcmp(url, "/metrics"))
		return CW_EP_METRICS;
	return CW_EP_OTHER;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct cw_http *h = cls;
	struct conn *cs = *con_cls;
	const enum cw_metrics_endpoint ep = endpoint_of(url);
	const int post = !strcmp(method, "POST");

	if (!cs) {
		const char *cl;

		cs = calloc(1, sizeof(*cs));
		if (!cs)
			return MHD_NO;
		*con_cls = cs;
		cs->http11 = !strcmp(version, MHD_HTTP_VERSION_1_1);
		/* an announced oversized body: refused before it is sent when
		 * the client waits for "100 Continue" or the body is absurd;
		 * else read and dropped, so that the client, still sending,
		 * gets to read the 413 */
		cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						 MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (!cl || strtoull(cl, NULL, 10) <= h->o.max_body_bytes)
			return MHD_YES;
		cs->too_large = 1;
		if (!MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						 MHD_HTTP_HEADER_EXPECT) &&
		    strtoull(cl, NULL, 10) <= CW_HTTP_DRAIN_BYTES)
			return MHD_YES;
	}
	if (*upload_size) {
		if (!cs->too_large && cs->len + *upload_size > h->o.max_body_bytes)
			cs->too_large = 1;
		if (!cs->too_large) {
			if (cs->len + *upload_size + 1 > cs->cap) {
				size_t cap = (cs->len + *upload_size + 1) * 2;
				char *p = realloc(cs->body, cap);

				if (!p)
					return MHD_NO;
				cs->body = p;
				cs->cap = cap;
			}
			memcpy(cs->body + cs->len, upload, *upload_size);
			cs->len += *upload_size;
			cs->body[cs->len] = 0;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	/* the whole request is in: the request-time watchdog lets go */
	request_state(h, c, 0);
	if (cs->too_large) {
		char msg[128];

		snprintf(msg, sizeof(msg), "request body larger than %zu bytes "
			 "(computed --max-body)", h->o.max_body_bytes);
		return simple_error(h, c, ep, 413, "invalid_request_error", msg);
	}
	if (ep != CW_EP_HEALTH && (ep != CW_EP_METRICS || h->o.metrics_auth) &&
	    !auth_ok(h, c))
		return simple_error(h, c, ep, 401, "invalid_request_error",
				    "missing or wrong API key: send "
				    "'Authorization: Bearer KEY'");
	if (!strcmp(url, "/v1/sessions") || !strncmp(url, "/v1/sessions/", 13))
		return do_sessions(h, c, cs, url, method);
	switch (ep) {
	case CW_EP_COMPLETIONS:
	case CW_EP_CHAT:
		if (!post)
			return simple_error(h, c, ep, 405,
					    "invalid_request_error",
					    "use POST for this endpoint");
		return do_generate(h, c, cs, ep == CW_EP_CHAT);
	case CW_EP_MODELS:
	case CW_EP_HEALTH:
	case CW_EP_METRICS:
		if (strcmp(method, "GET") && strcmp(method, "HEAD"))
			return simple_error(h, c, ep, 405,
					    "invalid_request_error",
					    "use GET for this endpoint");
		if (ep == CW_EP_MODELS)
			return do_models(h, c, url);
		return ep == CW_EP_HEALTH ? do_health(h, c) : do_metrics(h, c);
	default:
		return simple_error(h, c, ep, 404, "invalid_request_error",
				    "no such endpoint; see /v1/completions, "
				    "/v1/chat/completions, /v1/models, "
				    "/v1/sessions, "
				    "/health, /metrics");
	}
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct conn *cs = *con_cls;

	(void)toe;
	if (cs) {
		free(cs->body);
		free(cs);
		*con_cls = NULL;
	}
	/* a keep-alive connection: its next request has its own time */
	if (c)
		request_state(cls, c, 1);
}

int cw_http_start(const struct cw_http_opts *o, struct cw_sched *sched,
		  struct cw_model *model, const struct st_tokenizer *tok,
		  struct es_client *es, struct kv_client *kv,
		  struct cw_metrics *metrics, struct cw_http **ret,
		  struct st_diag *diag)
{
	struct cw_http *h = calloc(1, sizeof(*h));
	struct sockaddr_in sa = { 0 };

	if (!h)
		return -ENOMEM;
	h->o = *o;
	snprintf(h->bind_addr, sizeof(h->bind_addr), "%s",
		 o->bind_addr && o->bind_addr[0] ? o->bind_addr : "127.0.0.1");
	snprintf(h->api_key, sizeof(h->api_key), "%s",
		 o->api_key ? o->api_key : "");
	snprintf(h->model_name, sizeof(h->model_name), "%s",
		 o->model_name ? o->model_name : "strata");
	snprintf(h->run_dir, sizeof(h->run_dir), "%s", o->run_dir);
	if (!h->o.max_body_bytes)
		h->o.max_body_bytes = 1 << 20;
	if (h->o.max_connections <= 0)
		h->o.max_connections = 256;
	if (h->o.idle_timeout_s <= 0)
		h->o.idle_timeout_s = 60;
	if (h->o.request_timeout_s <= 0)
		h->o.request_timeout_s = 30;
	if (h->o.max_client_connections == 0)
		h->o.max_client_connections = 64;
	h->sched = sched;
	h->es = es;
	h->kv = kv;
	h->metrics = metrics;
	h->api.model = model;
	h->api.tok = tok;
	h->api.chat = o->chat;
	h->api.model_name = h->model_name;
	h->api.created = (long)time(NULL);
	h->api.id_prefix = st_random_id();
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)o->port);
	if (inet_pton(AF_INET, h->bind_addr, &sa.sin_addr) != 1) {
		free(h);
		return st_diag_set(diag, -EINVAL, "--http-bind '%s' is not an "
				   "IPv4 address", o->bind_addr);
	}
	pthread_mutex_init(&h->socks_mu, NULL);
	if (pthread_create(&h->watch, NULL, watch_main, h)) {
		pthread_mutex_destroy(&h->socks_mu);
		free(h);
		return st_diag_set(diag, -EAGAIN, "cannot start the HTTP "
				   "request watchdog thread");
	}
	h->watch_started = 1;
	/* bounds against slow or idle clients, as production servers
	 * have: no bytes for idle_timeout_s (MHD closes), the request not
	 * in after request_timeout_s (watch_main), at most
	 * max_client_connections per client address */
	h->mhd = MHD_start_daemon(
		MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
		MHD_USE_POLL | MHD_USE_ERROR_LOG, (uint16_t)o->port, NULL, NULL,
		on_request, h,
		MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->o.max_connections,
		MHD_OPTION_PER_IP_CONNECTION_LIMIT,
		(unsigned)(h->o.max_client_connections < 0 ? 0 :
			   h->o.max_client_connections), /* 0: none */
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->o.idle_timeout_s,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
		MHD_OPTION_END);
	if (!h->mhd) {
		h->stopping = 1;
		pthread_join(h->watch, NULL);
		pthread_mutex_destroy(&h->socks_mu);
		free(h);
		return st_diag_set(diag, -EADDRINUSE,
				   "cannot listen on %s:%d (in use, or not "
				   "allowed); choose another --http-port",
				   o->bind_addr ? o->bind_addr : "127.0.0.1",
				   o->port);
	}
	*ret = h;
	return 0;
}

void cw_http_stop(struct cw_http *h)
{
	if (!h)
		return;
	h->stopping = 1;
	MHD_stop_daemon(h->mhd);
	if (h->watch_started)
		pthread_join(h->watch, NULL);
	pthread_mutex_destroy(&h->socks_mu);
	free(h);
}
