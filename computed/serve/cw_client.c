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
	int timeout_ms;
	int (*watch)(void *arg);
	void *watch_arg;
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
	c->timeout_ms = timeout_ms;
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

void cw_client_set_watch(struct cw_client *c, int (*watch)(void *arg),
			 void *arg)
{
	c->watch = watch;
	c->watch_arg = arg;
}

/*
 * One round trip.  On a reply with status < 0 its message goes to diag; on
 * a transport failure diag says what failed.  *ret_buf owned by the caller
 * (NULL on transport failure).
 */
static int call(struct cw_client *c, uint16_t type, const struct st_wbuf *w,
		void **ret_buf, const uint8_t **ret_p, size_t *ret_n,
		struct st_diag *diag)
{
	int r;

	if (w && w->err)
		return -ENOMEM;
	r = st_rpc_call_watch(&c->sock, type, c->next_req++, 0,
			      w ? w->data : NULL, w ? w->len : 0,
			      c->timeout_ms, c->watch, c->watch_arg, ret_buf,
			      ret_p, ret_n);
	if (r < 0 && *ret_buf) {
		struct st_rbuf rb;
		char *msg = NULL;

		st_rbuf_init(&rb, *ret_p, *ret_n);
		if (st_rbuf_str(&rb, 4096, &msg) == 0) {
			st_diag_set(diag, r, "%s", msg);
			free(msg);
		} else {
			st_diag_set(diag, r, "%s", st_strerror(r));
		}
	} else if (r < 0) {
		st_diag_set(diag, r, "computed: %s", st_strerror(r));
	}
	return r;
}

int cw_client_ping(struct cw_client *c, int32_t *ret_pid)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = call(c, ST_MSG_PING, NULL, &buf, &p, &n, NULL);

	if (r == 0 && ret_pid && n >= 4)
		memcpy(ret_pid, p, 4);
	free(buf);
	return r;
}

int cw_client_gen_start(struct cw_client *c, const struct cw_gen_start_msg *m,
			uint32_t *ret_gen_id, uint32_t *ret_n_prompt,
			uint32_t *ret_max_tokens, struct st_diag *diag)
{
	struct st_wbuf w;
	struct st_rbuf rb;
	void *buf;
	const uint8_t *p;
	size_t n;
	int r;

	st_wbuf_init(&w);
	cw_gen_start_msg_encode(&w, m);
	r = call(c, CW_MSG_GEN_START, &w, &buf, &p, &n, diag);
	st_wbuf_fini(&w);
	if (r == 0) {
		uint32_t mt;

		st_rbuf_init(&rb, p, n);
		if (st_rbuf_u32(&rb, ret_gen_id) < 0 ||
		    st_rbuf_u32(&rb, ret_n_prompt) < 0 ||
		    st_rbuf_u32(&rb, &mt) < 0)
			r = st_diag_set(diag, -ST_E_PROTO,
					"malformed GEN_START reply");
		else if (ret_max_tokens)
			*ret_max_tokens = mt;
	}
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
	r = call(c, CW_MSG_GEN_NEXT, &w, &buf, &p, &n, diag);
	st_wbuf_fini(&w);
	if (r == 0) {
		st_rbuf_init(&rb, p, n);
		if (st_rbuf_i32(&rb, ret_token) < 0 ||
		    st_rbuf_u32(&rb, ret_finish) < 0 ||
		    st_rbuf_u32(&rb, &n_gen) < 0 || st_rbuf_u64(&rb, &ns) < 0 ||
		    st_rbuf_str(&rb, 1 << 20, ret_text) < 0)
			r = st_diag_set(diag, -ST_E_PROTO,
					"malformed GEN_NEXT reply");
	}
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
	r = call(c, CW_MSG_GEN_END, &w, &buf, &p, &n, NULL);
	st_wbuf_fini(&w);
	free(buf);
	return r;
}

int cw_client_score(struct cw_client *c, const int32_t *ids, uint32_t n,
		    const char *dump_name, double *ret_nll,
		    uint32_t *ret_argmax, struct st_diag *diag)
{
	struct st_wbuf w;
	struct st_rbuf rb;
	void *buf;
	const uint8_t *p;
	size_t len;
	uint32_t ns;
	int r;

	st_wbuf_init(&w);
	st_wbuf_u32(&w, dump_name ? CW_SCORE_F_DUMP : 0);
	st_wbuf_str(&w, dump_name ? dump_name : "");
	st_wbuf_u32(&w, n);
	for (uint32_t i = 0; i < n; i++)
		st_wbuf_i32(&w, ids[i]);
	r = call(c, CW_MSG_SCORE, &w, &buf, &p, &len, diag);
	st_wbuf_fini(&w);
	if (r == 0) {
		st_rbuf_init(&rb, p, len);
		if (st_rbuf_f64(&rb, ret_nll) < 0 || st_rbuf_u32(&rb, &ns) < 0 ||
		    ns != n - 1)
			r = st_diag_set(diag, -ST_E_PROTO, "malformed SCORE reply");
		for (uint32_t i = 0; r == 0 && i < ns; i++)
			if (st_rbuf_u32(&rb, &ret_argmax[i]) < 0)
				r = st_diag_set(diag, -ST_E_PROTO,
						"malformed SCORE reply");
	}
	free(buf);
	return r;
}

int cw_client_stats(struct cw_client *c, struct cw_stats_wire *ret)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = call(c, ST_MSG_STATS, NULL, &buf, &p, &n, NULL);

	if (r == 0)
		r = cw_stats_wire_decode(p, n, ret);
	free(buf);
	return r;
}

int cw_client_session(struct cw_client *c, uint32_t op, const char *name,
		      uint32_t flags, const char *prompt, char **ret_json,
		      struct st_diag *diag)
{
	struct st_wbuf w;
	struct st_rbuf rb;
	void *buf = NULL;
	const uint8_t *p;
	size_t n;
	int r;

	*ret_json = NULL;
	st_wbuf_init(&w);
	st_wbuf_u32(&w, op);
	st_wbuf_str(&w, name);
	st_wbuf_u32(&w, flags);
	st_wbuf_str(&w, prompt);
	r = call(c, CW_MSG_SESSION, &w, &buf, &p, &n, diag);
	st_wbuf_fini(&w);
	if (r == 0) {
		st_rbuf_init(&rb, p, n);
		if (st_rbuf_str(&rb, 16u << 20, ret_json) < 0)
			r = st_diag_set(diag, -ST_E_PROTO, "computed: "
					"malformed SESSION reply");
	}
	free(buf);
	return r;
}

int cw_client_shutdown(struct cw_client *c)
{
	void *buf;
	const uint8_t *p;
	size_t n;
	int r = call(c, ST_MSG_SHUTDOWN, NULL, &buf, &p, &n, NULL);

	free(buf);
	return r;
}
