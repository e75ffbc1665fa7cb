/* cw_client.c — see cw_client.h. */
#include "cw_client.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_daemon.h"
#include "st_msg.h"

struct cw_client {
	struct st_sock sock;
	uint64_t next_req;
};

int cw_client_open(const char *run_dir, int timeout_ms, struct cw_client **ret,
		   struct st_diag *diag)
{
	struct cw_client *c = calloc(1, sizeof(*c));
	char path[4200];
	int r;

	if (!c)
		return -ENOMEM;
	st_run_path(run_dir, "computed", "ctl", path, sizeof(path));
	r = st_sock_open(&c->sock, ST_SOCK_REQ, path, 5000, timeout_ms);
	if (r < 0) {
		free(c);
		return st_diag_set(diag, r, "cannot connect to %s: %s", path,
				   st_strerror(r));
	}
	c->next_req = ((uint64_t)getpid() << 32) | 1;
	*ret = c;
	return 0;
}

void cw_client_close(struct cw_client *c)
{
	if (!c)
		return;
	st_sock_close(&c->sock);
	free(c);
}

/* Copies the message of an error reply into diag. */
static int err_msg(int status, const uint8_t *p, size_t n, struct st_diag *diag)
{
	struct st_rbuf r;
	char *msg = NULL;

	st_rbuf_init(&r, p, n);
	if (st_rbuf_str(&r, 4096, &msg) == 0) {
		st_diag_set(diag, status, "%s", msg);
		free(msg);
	} else {
		st_diag_set(diag, status, "%s", st_strerror(status));
	}
	return status;
}

int cw_client_ping(struct cw_client *c, int32_t *ret_pid)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = st_rpc_call(&c->sock, ST_MSG_PING, c->next_req++, 0, NULL, 0,
			    &buf, &p, &n);

	if (r == 0 && ret_pid && n >= 4)
		memcpy(ret_pid, p, 4);
	free(buf);
	return r;
}

int cw_client_gen_start(struct cw_client *c, const struct cw_gen_start_msg *m,
			uint32_t *ret_gen_id, uint32_t *ret_n_prompt,
			struct st_diag *diag)
{
	struct st_wbuf w;
	struct st_rbuf rb;
	void *buf;
	const uint8_t *p;
	size_t n;
	int r;

	st_wbuf_init(&w);
	cw_gen_start_msg_encode(&w, m);
	if (w.err) {
		st_wbuf_fini(&w);
		return -ENOMEM;
	}
	r = st_rpc_call(&c->sock, CW_MSG_GEN_START, c->next_req++, 0, w.data,
			w.len, &buf, &p, &n);
	st_wbuf_fini(&w);
	if (r < 0) {
		if (buf)
			err_msg(r, p, n, diag);
		else
			st_diag_set(diag, r, "computed: %s", st_strerror(r));
		free(buf);
		return r;
	}
	st_rbuf_init(&rb, p, n);
	if (st_rbuf_u32(&rb, ret_gen_id) < 0 || st_rbuf_u32(&rb, ret_n_prompt) < 0)
		r = st_diag_set(diag, -ST_E_PROTO, "malformed GEN_START reply");
	free(buf);
	return r;
}

int cw_client_gen_next(struct cw_client *c, uint32_t gen_id, int32_t *ret_token,
		       uint32_t *ret_finish, char **ret_text,
		       struct st_diag *diag)
{
	struct st_wbuf w;
	struct st_rbuf rb;
	void *buf;
	const uint8_t *p;
	size_t n;
	uint32_t n_gen;
	uint64_t ns;
	int r;

	*ret_text = NULL;
	st_wbuf_init(&w);
	st_wbuf_u32(&w, gen_id);
	r = st_rpc_call(&c->sock, CW_MSG_GEN_NEXT, c->next_req++, 0, w.data,
			w.len, &buf, &p, &n);
	st_wbuf_fini(&w);
	if (r < 0) {
		if (buf)
			err_msg(r, p, n, diag);
		else
			st_diag_set(diag, r, "computed: %s", st_strerror(r));
		free(buf);
		return r;
	}
	st_rbuf_init(&rb, p, n);
	if (st_rbuf_i32(&rb, ret_token) < 0 || st_rbuf_u32(&rb, ret_finish) < 0 ||
	    st_rbuf_u32(&rb, &n_gen) < 0 || st_rbuf_u64(&rb, &ns) < 0 ||
	    st_rbuf_str(&rb, 1 << 20, ret_text) < 0)
		r = st_diag_set(diag, -ST_E_PROTO, "malformed GEN_NEXT reply");
	free(buf);
	return r;
}

int cw_client_gen_end(struct cw_client *c, uint32_t gen_id)
{
	struct st_wbuf w;
	void *buf;
	const uint8_t *p;
	size_t n;
	int r;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, gen_id);
	r = st_rpc_call(&c->sock, CW_MSG_GEN_END, c->next_req++, 0, w.data,
			w.len, &buf, &p, &n);
	st_wbuf_fini(&w);
	free(buf);
	return r;
}

int cw_client_stats(struct cw_client *c, struct cw_stats_wire *ret)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = st_rpc_call(&c->sock, ST_MSG_STATS, c->next_req++, 0, NULL, 0,
			    &buf, &p, &n);

	if (r == 0)
		r = cw_stats_wire_decode(p, n, ret);
	free(buf);
	return r;
}

int cw_client_shutdown(struct cw_client *c)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = st_rpc_call(&c->sock, ST_MSG_SHUTDOWN, c->next_req++, 0, NULL,
			    0, &buf, &p, &n);

	free(buf);
	return r;
}

