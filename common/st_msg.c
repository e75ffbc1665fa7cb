/* st_msg.c — nanomsg wrapper, see st_msg.h. */
#include "st_msg.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <nanomsg/pubsub.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st_error.h"
#include "st_util.h"

int st_sock_open(struct st_sock *s, enum st_sock_kind kind, const char *path,
		 int send_timeout_ms, int recv_timeout_ms)
{
	/* the receive limit leaves room for the REQ/REP protocol header that
	 * nanomsg puts in front of our bytes, so every message st_sock_send
	 * accepts (<= ST_MSG_MAX_BYTES) is received (PITFALLS P16) */
	int proto, fd, maxsz = ST_MSG_MAX_BYTES + ST_MSG_PROTO_HEADROOM, r;

	s->fd = -1;
	s->kind = kind;
	switch (kind) {
	case ST_SOCK_REP: proto = NN_REP; break;
	case ST_SOCK_REQ: proto = NN_REQ; break;
	case ST_SOCK_PUB: proto = NN_PUB; break;
	case ST_SOCK_SUB: proto = NN_SUB; break;
	default: return -EINVAL;
	}
	if (snprintf(s->url, sizeof(s->url), "ipc://%s", path) >=
	    (int)sizeof(s->url))
		return -ENAMETOOLONG;
	fd = nn_socket(AF_SP, proto);
	if (fd < 0)
		return -ST_E_NOMSG;
	if (nn_setsockopt(fd, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz,
			  sizeof(maxsz)) < 0 ||
	    nn_setsockopt(fd, NN_SOL_SOCKET, NN_SNDTIMEO, &send_timeout_ms,
			  sizeof(int)) < 0 ||
	    nn_setsockopt(fd, NN_SOL_SOCKET, NN_RCVTIMEO, &recv_timeout_ms,
			  sizeof(int)) < 0) {
		nn_close(fd);
		return -ST_E_NOMSG;
	}
	if (kind == ST_SOCK_REQ) {
		/* nanomsg re-sends a request whose reply has not come within
		 * this interval (and after a reconnect).  Requests are
		 * idempotent (DESIGN.md section 4), but a slow handler (a long
		 * prefill) must not see its request twice, so the interval is
		 * long; callers have their own receive time-outs. */
		int ivl = 600000;

		nn_setsockopt(fd, NN_REQ, NN_REQ_RESEND_IVL, &ivl, sizeof(ivl));
	}
	if (kind == ST_SOCK_REP || kind == ST_SOCK_PUB)
		r = nn_bind(fd, s->url);
	else
		r = nn_connect(fd, s->url);
	if (r < 0) {
		int e = nn_errno();

		nn_close(fd);
		return e == EADDRINUSE ? -EADDRINUSE : -ST_E_NOMSG;
	}
	s->fd = fd;
	return 0;
}

void st_sock_close(struct st_sock *s)
{
	if (s && s->fd >= 0) {
		/* nanomsg drops messages still queued when a socket closes
		 * (NN_LINGER is not implemented): a PUB socket waits a moment
		 * so subscribers get its last event (shutting down). */
		if (s->kind == ST_SOCK_PUB)
			st_sleep_ns(100 * 1000000ull);
		nn_close(s->fd);
		s->fd = -1;
	}
}

int st_sock_send(struct st_sock *s, const void *buf, size_t len)
{
	if (len > ST_MSG_MAX_BYTES)
		return -ST_E_LIMIT;
	for (;;) {
		int r = nn_send(s->fd, buf, len, 0);

		if (r >= 0)
			return 0;
		if (nn_errno() == EINTR)
			continue;
		return nn_errno() == ETIMEDOUT ? -ST_E_TIMEOUT : -ST_E_NOMSG;
	}
}

int st_sock_recv(struct st_sock *s, void **ret_buf, size_t *ret_len)
{
	void *msg = NULL;
	void *copy;
	int r = nn_recv(s->fd, &msg, NN_MSG, 0);

	*ret_buf = NULL;
	*ret_len = 0;
	if (r < 0) {
		int e = nn_errno();

		if (e == ETIMEDOUT || e == EAGAIN)
			return -ST_E_TIMEOUT;
		if (e == EINTR)
			return -EINTR;
		return -ST_E_NOMSG;
	}
	copy = malloc(r ? (size_t)r : 1);
	if (!copy) {
		nn_freemsg(msg);
		return -ENOMEM;
	}
	memcpy(copy, msg, (size_t)r);
	nn_freemsg(msg);
	*ret_buf = copy;
	*ret_len = (size_t)r;
	return 0;
}

int st_sock_set_recv_timeout(struct st_sock *s, int timeout_ms)
{
	return nn_setsockopt(s->fd, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms,
			     sizeof(int)) < 0 ? -ST_E_NOMSG : 0;
}

int st_sock_subscribe_all(struct st_sock *s)
{
	return nn_setsockopt(s->fd, NN_SUB, NN_SUB_SUBSCRIBE, "", 0) < 0 ?
		       -ST_E_NOMSG : 0;
}

int st_rpc_call(struct st_sock *s, uint16_t type, uint64_t request_id,
		uint32_t client_id, const void *payload, size_t payload_len,
		void **ret_buf, const uint8_t **ret_payload,
		size_t *ret_payload_len)
{
	return st_rpc_call_watch(s, type, request_id, client_id, payload,
				 payload_len, -1, NULL, NULL, ret_buf,
				 ret_payload, ret_payload_len);
}

int st_rpc_call_watch(struct st_sock *s, uint16_t type, uint64_t request_id,
		      uint32_t client_id, const void *payload,
		      size_t payload_len, int timeout_ms,
		      int (*keep_waiting)(void *arg), void *arg, void **ret_buf,
		      const uint8_t **ret_payload, size_t *ret_payload_len)
{
	struct st_wbuf w;
	struct st_msg_header h;
	uint64_t deadline = 0;
	void *buf;
	size_t len;
	int r;

	*ret_buf = NULL;
	*ret_payload = NULL;
	*ret_payload_len = 0;
	st_wbuf_init(&w);
	r = st_proto_encode(&w, type, request_id, client_id, 0, payload,
			    payload_len);
	if (r == 0)
		r = st_sock_send(s, w.data, w.len);
	st_wbuf_fini(&w);
	if (r < 0)
		return r;
	if (keep_waiting) {
		deadline = st_now_ns() + (uint64_t)timeout_ms * 1000000ull;
		st_sock_set_recv_timeout(s, ST_RPC_POLL_MS);
	}
	for (;;) {
		r = st_sock_recv(s, &buf, &len);
		if (r == -EINTR)
			continue;
		if (r == -ST_E_TIMEOUT && keep_waiting) {
			r = keep_waiting(arg);
			if (r < 0)
				break;
			if (st_now_ns() < deadline)
				continue;
			r = -ST_E_TIMEOUT;
		}
		if (r < 0)
			break;
		r = st_proto_decode_header(buf, len, &h);
		if (r == 0 && (h.type != (type | ST_MSG_REPLY) ||
			       h.request_id != request_id))
			r = -ST_E_PROTO;
		if (r < 0)
			free(buf);
		break;
	}
	if (keep_waiting)
		st_sock_set_recv_timeout(s, timeout_ms);
	if (r < 0)
		return r;
	*ret_buf = buf;
	*ret_payload = (const uint8_t *)buf + ST_PROTO_HEADER_BYTES;
	*ret_payload_len = h.payload_len;
	return h.status;
}

int st_rpc_reply(struct st_sock *s, const struct st_msg_header *req,
		 int32_t status, const void *payload, size_t payload_len)
{
	struct st_wbuf w;
	int r;

	st_wbuf_init(&w);
	r = st_proto_encode(&w, (uint16_t)(req->type | ST_MSG_REPLY),
			    req->request_id, req->client_id, status, payload,
			    payload_len);
	if (r == 0)
		r = st_sock_send(s, w.data, w.len);
	st_wbuf_fini(&w);
	return r;
}
