/*
 * cli_proxy.h — the HTTP front the supervisor keeps in front of computed
 * (cli_superv.h): it owns the instance's public port and forwards each
 * connection byte for byte to computed's private port on 127.0.0.1, so
 * that a computed killed while a request runs does not just drop the
 * client's connection.  When computed's side of a connection ends while a
 * request waits for its response (no response byte sent yet), the client
 * gets `503` with `Retry-After` and an OpenAI error object (code
 * `computed_restarting`) it can retry; a response already started (an SSE
 * stream) can only be cut, as HTTP allows nothing else.  A connection made
 * while computed is down gets the same 503 at once.  When the computed
 * that took the connection still lives, its closing it (time-outs,
 * limits) is passed on as it is.
 *
 * The proxy does not parse HTTP beyond the first bytes of a response:
 * "a request waits" means the client sent bytes after the last byte
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

/* Stops the thread (if started), closes every connection and the
 * listener, frees p.  NULL is fine. */
void cli_proxy_destroy(struct cli_proxy *p);

#endif
