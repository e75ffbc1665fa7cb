/*
 * cw_http.h — the OpenAI-compatible HTTP API of computed (libmicrohttpd,
 * one thread per connection; JSON with jansson).
 *
 *   POST /v1/completions       prompt -> text (stream: server-sent events)
 *   POST /v1/chat/completions  messages -> the model's chat template
 *   GET  /v1/models            the one model this instance serves
 *   GET  /v1/models/{id}       that model (404 model_not_found otherwise)
 *   GET  /health               200 when computed, expertd and kvd answer
 *   GET  /metrics              Prometheus text (cw_metrics.h)
 *
 * Requests become generations of the scheduler (cw_sched.h).  A client
 * that disconnects cancels its generation (its KV pages are freed before
 * the scheduler's next step); one that only half-closes (shutdown
 * SHUT_WR after its request) still gets its answer.  With an API key,
 * every endpoint but /health and /metrics (unless metrics_auth) wants
 * "Authorization: Bearer KEY".  Slow clients are bounded: per-address
 * connections, idle time and the time to send a request.  Bad input gets an OpenAI-style error
 * object with 400, 401, 404, 405 or 413; a full queue 429; a daemon that is
 * down or shutting down 503.
 */
#ifndef CW_HTTP_H
#define CW_HTTP_H

#include <stddef.h>

#include "cw_chat.h"
#include "cw_metrics.h"
#include "cw_sched.h"
#include "es_client.h"
#include "kv_client.h"

struct cw_http_opts {
	const char *bind_addr;     /* IPv4 address, default 127.0.0.1 */
	const char *instance;      /* for the I/O queue's totals (NULL:
				    * none in /metrics) */
	int port;                  /* TCP port (0: none) */
	const char *api_key;       /* NULL or "": no authentication */
	const char *model_name;    /* id in /v1/models and responses */
	size_t max_body_bytes;     /* larger request bodies get 413 */
	int max_connections;       /* open at once (MHD's limit) */
	int max_client_connections; /* per client IP address (0: 64;
				     * < 0: none, behind a front that
				     * limits) */
	int idle_timeout_s;        /* no bytes either way: closed (0: 60) */
	int request_timeout_s;     /* a whole request must arrive within
				    * this of the connection or the last
				    * response (0: 30) */
	int metrics_auth;          /* /metrics wants the API key too */
	enum cw_chat_template chat;
	const char *run_dir;       /* where expertd.ctl / kvd.ctl are */
	struct cw_sched_opts sched; /* limits, for /metrics */
};

struct cw_http;

/*
 * Starts the server.  Everything else is borrowed and must outlive it.
 * *ret owned by the caller (cw_http_stop).  Errors: -EADDRINUSE /
 * -EINVAL / -ENOMEM with diag.
 */
int cw_http_start(const struct cw_http_opts *o, struct cw_sched *sched,
		  struct cw_model *model, const struct st_tokenizer *tok,
		  struct es_client *es, struct kv_client *kv,
		  struct cw_metrics *metrics, struct cw_http **ret,
		  struct st_diag *diag);

/* Stops accepting, ends every connection (their generations are
 * cancelled) and frees the server.  NULL is fine. */
void cw_http_stop(struct cw_http *h);

#endif
