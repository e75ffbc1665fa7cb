/*
 * st_msg.h — the one door to nanomsg.
 *
 * Control-plane sockets (DESIGN.md section 4): each daemon binds a REP socket
 * ipc://<run_dir>/<daemon>.ctl and a PUB socket ipc://<run_dir>/<daemon>.evt;
 * clients connect a REQ (and optionally SUB) socket.  Every socket gets an
 * explicit receive-size limit (ST_MSG_MAX_BYTES, PITFALLS P16) and
 * send/receive time-outs.  Messages are built with st_proto.h.
 */
#ifndef ST_MSG_H
#define ST_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "st_proto.h"

enum st_sock_kind { ST_SOCK_REP, ST_SOCK_REQ, ST_SOCK_PUB, ST_SOCK_SUB };

/* A socket (nanomsg descriptor wrapped so callers never see nn_* calls). */
struct st_sock {
	int fd;               /* nanomsg socket, -1 when closed */
	enum st_sock_kind kind;
	char url[512];
};

/*
 * Opens a socket of `kind` and binds (REP, PUB) or connects (REQ, SUB) it to
 * the ipc socket file `path` (a filesystem path; "ipc://" is added here).
 * Sets NN_RCVMAXSIZE to ST_MSG_MAX_BYTES and the given time-outs (ms, -1 =
 * infinite).  Returns 0 or -ST_E_NOMSG/-errno; logs nothing.
 */
int st_sock_open(struct st_sock *s, enum st_sock_kind kind, const char *path,
		 int send_timeout_ms, int recv_timeout_ms);

/* Closes the socket (safe on a closed or zeroed one). */
void st_sock_close(struct st_sock *s);

/* Sends `len` bytes.  -ST_E_LIMIT if len > ST_MSG_MAX_BYTES (checked here,
 * before nanomsg could silently drop it on the receiver), -ST_E_TIMEOUT,
 * -ST_E_NOMSG. */
int st_sock_send(struct st_sock *s, const void *buf, size_t len);

/*
 * Receives one message into a new malloc'd buffer (*ret_buf owned by the
 * caller).  Returns 0, -ST_E_TIMEOUT when the receive time-out expired,
 * -EINTR when interrupted by a signal, -ST_E_NOMSG otherwise.
 */
int st_sock_recv(struct st_sock *s, void **ret_buf, size_t *ret_len);

/* Changes the receive time-out (ms, -1 infinite).  0 or -ST_E_NOMSG. */
int st_sock_set_recv_timeout(struct st_sock *s, int timeout_ms);

/* Subscribes a SUB socket to every topic.  0 or -ST_E_NOMSG. */
int st_sock_subscribe_all(struct st_sock *s);

/*
 * One request/reply round trip on a REQ socket: sends a message of `type`
 * with the payload, waits for the reply, validates its header (magic,
 * version, type == type|ST_MSG_REPLY, request_id echoed).
 * On success returns the reply's status (0 or negative st_error code) and
 * gives the reply payload in *ret_buf / *ret_payload / *ret_payload_len
 * (*ret_buf owned by the caller; *ret_payload points into it).  Transport
 * failures return -ST_E_TIMEOUT / -ST_E_NOMSG / -ST_E_PROTO with *ret_buf NULL.
 */
int st_rpc_call(struct st_sock *s, uint16_t type, uint64_t request_id,
		uint32_t client_id, const void *payload, size_t payload_len,
		void **ret_buf, const uint8_t **ret_payload,
		size_t *ret_payload_len);

/* Slice of a watched wait (st_rpc_call_watch), ms. */
#define ST_RPC_POLL_MS 200

/*
 * st_rpc_call that waits for the reply at most timeout_ms, in slices of
 * ST_RPC_POLL_MS, calling keep_waiting(arg) after each empty slice: a
 * negative return stops the wait with that code (e.g. the peer's pid died:
 * -ST_E_PEERGONE; a stop signal: -EINTR).  The socket's receive time-out is
 * set to timeout_ms afterwards.  A request abandoned this way is cancelled
 * by the next request on the same REQ socket.
 */
int st_rpc_call_watch(struct st_sock *s, uint16_t type, uint64_t request_id,
		      uint32_t client_id, const void *payload,
		      size_t payload_len, int timeout_ms,
		      int (*keep_waiting)(void *arg), void *arg, void **ret_buf,
		      const uint8_t **ret_payload, size_t *ret_payload_len);

/*
 * Sends a reply on a REP socket for a request with header `req`: status and
 * payload.  Returns 0 or a negative error from st_sock_send.
 */
int st_rpc_reply(struct st_sock *s, const struct st_msg_header *req,
		 int32_t status, const void *payload, size_t payload_len);

#endif
