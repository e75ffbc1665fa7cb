/*
 * cli_proxy.h — the HTTP front the supervisor keeps in front of computed
 * (cli_superv.h): it owns the instance's public port and forwards each
 * connection byte for byte to computed's private port on 127.0.0.1, so
 * that a computed killed while a request runs does not just drop the
 * client's connection.  When computed's side of a connection ends while a
 * request waits for its response (no response byte sent yet), the client
 * gets `503` with `Retry-After` and an OpenAI error object (code
 * `computed_restarting`) it can retry.  A response already started can
 * only be cut, with one exception: an SSE stream (text/event-stream, 200)
 * that computed's side ends between two events before its end gets an SSE
 * error event in OpenAI's shape (`data: {"error": {..., "code":
 * "computed_restarting"}}` when computed died, "computed_stopping" when
 * the computed that took it lives: it stops, as under strata restart; no
 * `data: [DONE]`) and a clean end (the last chunk), so that a client (the
 * openai libraries raise APIError) sees an error, not a short answer; one
 * cut inside an event (rare: computed writes whole events) is only cut,
 * which HTTP clients report as an incomplete body.  A connection made
 * while computed is down gets the same 503 at once.  When the computed
 * that took the connection still lives, its closing it (time-outs,
 * limits) is passed on as it is.
 *
 * The proxy parses no request, and of a response only its head (status,
 * Content-Type, Transfer-Encoding) and an SSE stream's chunk and event
 * boundaries, forwarding every byte unchanged: "a request waits" means the client sent bytes after the last byte
 * computed sent.  Time-outs and the total connection limit stay
 * computed's (its side of each connection closes, and the proxy closes
 * the client's); the client address computed sees is 127.0.0.1, so the
 * per-client connection limit is the proxy's, and computed runs behind
 * it with none (--http-max-client-conns 0).
 */
#ifndef CLI_PROXY_H
#define CLI_PROXY_H

#include <stdint.h>

#include "st_error.h"

struct cli_proxy;

/*
 * Binds the public listener bind_addr:port (IPv4 or IPv6 literal, or
 * "localhost") and picks a free private port on 127.0.0.1 for computed
 * (*ret_private_port); run_dir: the instance's, where computed's pid file
 * tells whether the computed a connection reached still lives (then its
 * closing a connection is mirrored, not answered with 503);
 * max_per_client: connections open at once from one client address
 * (IPv4 and its v4-mapped IPv6 form count as one), more are closed at
 * once; <= 0: no limit.  Nothing runs yet.  0 with *ret (caller owns; see
 * cli_proxy_destroy), or negative with diag ("port in use" ...).
 */
int cli_proxy_create(const char *bind_addr, int port, const char *run_dir,
		     int max_per_client, struct cli_proxy **ret,
		     int *ret_private_port, struct st_diag *diag);

/* Starts forwarding in a thread of this process.  0 or negative. */
int cli_proxy_start(struct cli_proxy *p);

/* Connections the proxy answered with 503 because computed's side ended
 * before a response (for the supervisor's log).  Thread-safe. */
uint64_t cli_proxy_n_retry_errors(struct cli_proxy *p);

/* SSE streams ended with our error event because computed died or
 * stopped while they ran (for the supervisor's log).  Thread-safe. */
uint64_t cli_proxy_n_cut_streams(struct cli_proxy *p);

/* Stops the thread (if started), closes every connection and the
 * listener, frees p.  NULL is fine. */
void cli_proxy_destroy(struct cli_proxy *p);

#endif
