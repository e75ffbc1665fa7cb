/* cli_proxy.c — see cli_proxy.h.
 *
 * One thread, one epoll set, level-triggered.  Each connection pairs the
 * client's socket with one to computed; each side has one buffer that is
 * filled only when empty (so a slow reader holds its writer back: no
 * unbounded buffering).  A connection whose reply is a 503 of ours reads
 * and drops what the client still sends, answers once some request bytes
 * came, then closes its writing side and lingers until the client closes
 * (or LINGER_MS), so that the client reads the answer instead of a reset.
 * When computed goes (or is not there) before the client sent a byte, the
 * connection stays: its request is passed to the computed listening when
 * it comes; one without a request is closed after PX_RECONNECT_IDLE_MS. */
#include "cli_proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "st_daemon.h"
#include "st_log.h"
#include "st_util.h"

#define PX_BUF 16384
#define PX_LINGER_MS 2000
/* A connection whose computed went before its request came waits this
 * long for the request, then is closed as idle (no computed times it) */
#define PX_RECONNECT_IDLE_MS 10000
#define PX_MAX_CONNS 4096
#define PX_TAIL 512 /* room after a full buffer for our SSE error event */

static const char k_body[] =
	"{\"error\":{\"message\":\"computed (the compute worker) stopped "
	"while this request ran or is starting again; retry the request in "
	"a moment\",\"type\":\"server_error\",\"param\":null,"
	"\"code\":\"computed_restarting\"}}\n";

/* The SSE event a stream cut by computed's end gets (OpenAI's shape of
 * an error in a stream: the openai clients raise it as an APIError);
 * no "data: [DONE]" follows, so the stream does not look complete.
 * [0]: computed died (kill -9, a crash; the supervisor restarts it);
 * [1]: the computed that took the connection lives and closed the stream
 * before its end, which it does only when it stops (strata restart,
 * strata down; a request deadline never applies to a stream). */
static const char *const k_sse_event[2] = {
	"data: {\"error\":{\"message\":\"computed (the compute worker) "
	"stopped while this stream ran and restarted: the response is cut "
	"short; retry the request\",\"type\":\"server_error\",\"param\":"
	"null,\"code\":\"computed_restarting\"}}\n\n",
	"data: {\"error\":{\"message\":\"computed (the compute worker) is "
	"stopping (strata restart or strata down) and ended this stream "
	"before its end: the response is cut short; retry the request\","
	"\"type\":\"server_error\",\"param\":null,\"code\":"
	"\"computed_stopping\"}}\n\n",
};

struct px_side {
	int fd;
	size_t len, off; /* bytes read from fd, waiting for the other side */
	int eof;         /* fd read returned 0 */
	char buf[PX_BUF + PX_TAIL]; /* reads fill at most PX_BUF */
};

/* How far computed's current response went, read from its bytes as they
 * pass (nothing is changed): enough to know whether an SSE stream is at
 * an event boundary, where an event of ours can be added. */
enum px_rstate { PR_NONE, PR_HEAD, PR_SSE, PR_OTHER };
enum px_cstate { PC_SIZE, PC_EXT, PC_DATA, PC_DATA_END, PC_LAST };

struct px_resp {
	enum px_rstate state;
	int status;           /* of the head being read, 0 before its line */
	int sse, chunked;     /* text/event-stream; Transfer-Encoding chunked */
	char line[128];       /* a head line's start (enough to match) */
	size_t line_len;
	enum px_cstate cs;    /* chunked framing (PR_SSE with chunked) */
	int size_digits;      /* hex digits read of the chunk-size line */
	uint64_t chunk_left;  /* data bytes left in this chunk */
	int ev_open;          /* SSE: a line of an undispatched event came */
	int line_start;       /* SSE: at the start of a line */
};

struct px_conn {
	struct px_side c, b; /* client; computed (backend) */
	int connecting;      /* backend connect(2) in progress */
	int awaiting;        /* client bytes came after computed's last */
	int requested;       /* some client bytes came on this connection */
	int reconnect;       /* computed went (or was not there) before
			      * any request came: connect again when one
			      * comes */
	uint64_t idle_ns;    /* reconnect: close at this time (idle) */
	int answer;          /* we answer 503 (computed gone or down) */
	int cw_pid;          /* computed's pid when the client came */
	int closing;         /* close once c's pending bytes are written */
	uint64_t linger_ns;  /* after our answer: close at this time */
	uint32_t ev_c, ev_b; /* epoll interest now */
	uint8_t peer[16];    /* the client's address (IPv4 as v4-mapped) */
	struct px_resp resp; /* computed's response under way */
	struct px_conn *prev, *next;
};

struct cli_proxy {
	int lfd, efd, stopfd, private_port;
	int max_per_client;  /* connections at once per client address */
	char run_dir[4096];  /* computed's pid file is there */
	pthread_t thread;
	int started;
	struct px_conn *conns;
	int n_conns;
	_Atomic uint64_t n_retry;
	_Atomic uint64_t n_cut;
};

/* epoll data: the connection pointer, its low bit = backend side */
static void *tag(struct px_conn *c, int backend)
{
	return (void *)((uintptr_t)c | (uintptr_t)backend);
}

static void set_ev(struct cli_proxy *p, int fd, uint32_t *cur, uint32_t want,
		   void *data)
{
	struct epoll_event ev = { .events = want, .data.ptr = data };

	if (fd < 0 || *cur == want)
		return;
	/* no interest: out of the set, or a hang-up (always reported)
	 * would wake us for ever while the other side drains */
	if (!want)
		epoll_ctl(p->efd, EPOLL_CTL_DEL, fd, NULL);
	else
		epoll_ctl(p->efd, *cur ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd,
			  &ev);
	*cur = want;
}

static void resp_begin(struct px_resp *r)
{
	memset(r, 0, sizeof(*r));
	r->state = PR_HEAD;
	r->line_start = 1;
}

/* A head line (no line end): the status line, or the two headers that
 * matter; a blank line ends the head. */
static void resp_head_line(struct px_resp *r)
{
	const char *l = r->line;

	if (r->line_len == 0) {
		if (r->status >= 100 && r->status < 200) {
			resp_begin(r); /* an interim response: the real follows */
			return;
		}
		r->state = r->sse && r->status == 200 ? PR_SSE : PR_OTHER;
		return;
	}
	if (!r->status) {
		if (r->line_len >= 12 && !strncmp(l, "HTTP/1.", 7))
			r->status = atoi(l + 9);
		if (r->status <= 0)
			r->state = PR_OTHER; /* not HTTP as we know it */
		return;
	}
	if (!strncasecmp(l, "content-type:", 13))
		r->sse = strstr(l + 13, "text/event-stream") != NULL;
	else if (!strncasecmp(l, "transfer-encoding:", 18))
		r->chunked = strstr(l + 18, "chunked") != NULL;
}

/* One byte of the event stream itself (CR ignored: LF ends lines). */
static void resp_sse_byte(struct px_resp *r, char ch)
{
	if (ch == '\r')
		return;
	if (ch == '\n') {
		if (r->line_start)
			r->ev_open = 0; /* a blank line dispatches the event */
		r->line_start = 1;
	} else {
		r->line_start = 0;
		r->ev_open = 1;
	}
}

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch = (char)(ch | 0x20);
	return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Reads n bytes computed sent (as the client will get them). */
static void resp_feed(struct px_resp *r, const char *b, size_t n)
{
	for (size_t i = 0; i < n && r->state != PR_OTHER &&
			   r->state != PR_NONE; i++) {
		char ch = b[i];

		if (r->state == PR_HEAD) {
			if (ch == '\n') {
				resp_head_line(r);
				r->line_len = 0;
			} else if (ch != '\r' &&
				   r->line_len < sizeof(r->line) - 1) {
				r->line[r->line_len++] = ch;
				r->line[r->line_len] = 0;
			}
			continue;
		}
		if (!r->chunked) { /* close-delimited: all bytes are the body */
			resp_sse_byte(r, ch);
			continue;
		}
		switch (r->cs) {
		case PC_SIZE:
		case PC_EXT:
			if (ch == '\n') {
				r->cs = r->chunk_left ? PC_DATA : PC_LAST;
				r->size_digits = 0;
			} else if (r->cs == PC_SIZE && hexval(ch) >= 0 &&
				   r->size_digits < 15) {
				r->chunk_left = r->chunk_left * 16 +
						(uint64_t)hexval(ch);
				r->size_digits++;
			} else if (ch != '\r') {
				r->cs = PC_EXT; /* extensions: ignored */
				r->size_digits++;
			}
			break;
		case PC_DATA: {
			size_t k = n - i < r->chunk_left ? n - i :
				   (size_t)r->chunk_left;

			for (size_t j = 0; j < k; j++)
				resp_sse_byte(r, b[i + j]);
			r->chunk_left -= k;
			i += k - 1;
			if (!r->chunk_left)
				r->cs = PC_DATA_END;
			break;
		}
		case PC_DATA_END:
			if (ch == '\n')
				r->cs = PC_SIZE;
			break;
		case PC_LAST: /* the last chunk came: the stream is whole */
			r->state = PR_OTHER;
			break;
		}
	}
}

/* 1 when the response is an SSE stream cut at an event boundary (and a
 * chunk boundary): an event of ours can follow and end it cleanly. */
static int resp_cut_clean(const struct px_resp *r)
{
	return r->state == PR_SSE && !r->ev_open && r->line_start &&
	       (!r->chunked || (r->cs == PC_SIZE && r->size_digits == 0));
}

static void conn_close(struct cli_proxy *p, struct px_conn *c)
{
	if (c->c.fd >= 0)
		close(c->c.fd);
	if (c->b.fd >= 0)
		close(c->b.fd);
	if (c->prev)
		c->prev->next = c->next;
	else
		p->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	p->n_conns--;
	free(c);
}

static void drop_backend(struct cli_proxy *p, struct px_conn *c)
{
	(void)p;
	if (c->b.fd >= 0)
		close(c->b.fd); /* close removes it from the epoll set */
	c->b.fd = -1;
	c->ev_b = 0;
	c->b.len = c->b.off = 0;
}

/* Computed is gone (or was never reached): answer 503 when a request
 * waits (or when one comes), else close once the client has all it got. */
static void backend_gone(struct cli_proxy *p, struct px_conn *c,
			 int never_reached)
{
	size_t pending = c->b.len - c->b.off;
	int cw = never_reached ? 0 : st_pidfile_read(p->run_dir, "computed");
	int same = !never_reached && c->cw_pid > 0 && cw == c->cw_pid &&
		   st_pid_alive(cw);

	if (!c->requested && !pending && !same) {
		/* computed went (killed), or was not there, while the client
		 * had not sent a byte yet, e.g. between its connect and its
		 * request: the request goes to the computed that runs when
		 * it comes (or gets our 503), instead of a reset connection
		 * or a 503 fixed at the connect */
		drop_backend(p, c);
		c->reconnect = 1;
		c->idle_ns = st_now_ns() + PX_RECONNECT_IDLE_MS * 1000000ull;
		return;
	}
	if (!never_reached && !c->awaiting && resp_cut_clean(&c->resp)) {
		/* an SSE stream computed's end cut between events: what it
		 * sent, then our error event and the stream's end, so that
		 * the client sees an error, not a short answer */
		const char *ev = k_sse_event[same];

		memmove(c->b.buf, c->b.buf + c->b.off, pending);
		c->b.off = 0;
		c->b.len = pending;
		if (c->resp.chunked)
			c->b.len += (size_t)snprintf(
				c->b.buf + pending, sizeof(c->b.buf) - pending,
				"%zx\r\n%s\r\n0\r\n\r\n", strlen(ev), ev);
		else
			c->b.len += (size_t)snprintf(
				c->b.buf + pending, sizeof(c->b.buf) - pending,
				"%s", ev);
		c->resp.state = PR_OTHER;
		close(c->b.fd);
		c->b.fd = -1;
		c->ev_b = 0;
		c->closing = 1;
		atomic_fetch_add(&p->n_cut, 1);
		return;
	}
	if (pending || same) {
		/* a response under way can only be cut; and when the same
		 * computed lives, it closed the connection on purpose (a
		 * time-out, a limit): so do we, after what it sent */
		memmove(c->b.buf, c->b.buf + c->b.off, pending);
		c->b.off = 0;
		c->b.len = pending;
		close(c->b.fd);
		c->b.fd = -1;
		c->ev_b = 0;
		c->closing = 1;
		return;
	}
	drop_backend(p, c);
	if (c->awaiting || never_reached) {
		c->answer = 1;
		c->c.len = c->c.off = 0; /* the request goes nowhere now */
	} else {
		c->closing = 1;
	}
}

/* Queues our 503 on the client side once request bytes came. */
static void queue_answer(struct cli_proxy *p, struct px_conn *c)
{
	int n;

	if (!c->answer || !c->awaiting || c->linger_ns || c->b.len)
		return;
	n = snprintf(c->b.buf, sizeof(c->b.buf),
		     "HTTP/1.1 503 Service Unavailable\r\n"
		     "Content-Type: application/json\r\n"
		     "Retry-After: 2\r\nConnection: close\r\n"
		     "Content-Length: %zu\r\n\r\n%s",
		     sizeof(k_body) - 1, k_body);
	c->b.off = 0;
	c->b.len = (size_t)n;
	c->linger_ns = st_now_ns() + PX_LINGER_MS * 1000000ull;
	atomic_fetch_add(&p->n_retry, 1);
}

static void update(struct cli_proxy *p, struct px_conn *c);

/* Computed's side ended: backend_gone, our answer queued, and the
 * connection closed when nothing is left to send.  1 when closed. */
static int gone(struct cli_proxy *p, struct px_conn *c, int never_reached)
{
	backend_gone(p, c, never_reached);
	queue_answer(p, c);
	if (c->closing && c->b.len == 0) {
		conn_close(p, c);
		return 1;
	}
	update(p, c);
	return 0;
}

static void update(struct cli_proxy *p, struct px_conn *c)
{
	uint32_t ec = 0, eb = 0;

	if (!c->c.eof && (c->answer ? 1 : c->c.len == 0) && !c->closing)
		ec |= EPOLLIN;
	if (c->b.len > c->b.off)
		ec |= EPOLLOUT;
	if (c->b.fd >= 0) {
		if (c->connecting || c->c.len > c->c.off)
			eb |= EPOLLOUT;
		if (!c->connecting && !c->b.eof && c->b.len == 0)
			eb |= EPOLLIN;
	}
	set_ev(p, c->c.fd, &c->ev_c, ec, tag(c, 0));
	set_ev(p, c->b.fd, &c->ev_b, eb, tag(c, 1));
}

/* The 16-byte key of a client address: IPv6 as it is, IPv4 as
 * v4-mapped IPv6 (so that a dual-stack listener counts one client once). */
static void peer_key(const struct sockaddr_storage *ss, uint8_t key[16])
{
	memset(key, 0, 16);
	if (ss->ss_family == AF_INET6) {
		memcpy(key, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
	} else if (ss->ss_family == AF_INET) {
		key[10] = key[11] = 0xff;
		memcpy(key + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
	}
}

/* Connections open now from the address key (a linear scan: at most
 * PX_MAX_CONNS, and only when a connection arrives). */
static int conns_of(const struct cli_proxy *p, const uint8_t key[16])
{
	int n = 0;

	for (const struct px_conn *c = p->conns; c; c = c->next)
		n += !memcmp(c->peer, key, 16);
	return n;
}

/* Starts c's connection to computed's private port (non-blocking); one
 * refused at once is a computed that is not there (backend_gone). */
static void backend_connect(struct cli_proxy *p, struct px_conn *c)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int r;

	c->cw_pid = st_pidfile_read(p->run_dir, "computed");
	a.sin_port = htons((uint16_t)p->private_port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	c->b.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	r = c->b.fd < 0 ? -1 : connect(c->b.fd, (struct sockaddr *)&a, sizeof(a));
	if (r < 0 && c->b.fd >= 0 && errno == EINPROGRESS)
		c->connecting = 1;
	else if (r < 0)
		backend_gone(p, c, 1);
}

static void new_conn(struct cli_proxy *p)
{
	struct sockaddr_storage peer;
	socklen_t plen = sizeof(peer);
	struct px_conn *c;
	uint8_t key[16];
	int fd = accept4(p->lfd, (struct sockaddr *)&peer, &plen,
			 SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	peer_key(&peer, key);
	/* computed behind the front sees every client as 127.0.0.1, so the
	 * per-client limit is the front's (closed at once, as
	 * libmicrohttpd does past its per-IP limit) */
	if (p->n_conns >= PX_MAX_CONNS ||
	    (p->max_per_client > 0 && conns_of(p, key) >= p->max_per_client) ||
	    !(c = calloc(1, sizeof(*c)))) {
		close(fd);
		return;
	}
	c->c.fd = fd;
	memcpy(c->peer, key, 16);
	c->next = p->conns;
	if (p->conns)
		p->conns->prev = c;
	p->conns = c;
	p->n_conns++;
	backend_connect(p, c);
	update(p, c);
}

/* Writes side s's pending bytes to fd.  0, or -1 when fd failed. */
static int flush(struct px_side *s, int fd)
{
	while (s->len > s->off) {
		ssize_t w = send(fd, s->buf + s->off, s->len - s->off,
				 MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return errno == EAGAIN ? 0 : -1;
		s->off += (size_t)w;
	}
	s->len = s->off = 0;
	return 0;
}

static void on_client(struct cli_proxy *p, struct px_conn *c, uint32_t ev)
{
	if (ev & EPOLLOUT) {
		if (flush(&c->b, c->c.fd) < 0) {
			conn_close(p, c);
			return;
		}
		if (c->b.len == 0 && c->linger_ns)
			shutdown(c->c.fd, SHUT_WR); /* our answer is out */
		if (c->b.len == 0 && c->closing) {
			conn_close(p, c);
			return;
		}
	}
	if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
	    (c->answer || c->c.len == 0)) {
		char drop[PX_BUF];
		int answering = c->answer;
		ssize_t n = read(c->c.fd, answering ? drop : c->c.buf, PX_BUF);

		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			goto out;
		if (n <= 0) {
			c->c.eof = 1;
			if (n < 0 || answering || c->b.fd < 0) {
				conn_close(p, c);
				return;
			}
			if (c->c.len == 0 && !c->connecting)
				shutdown(c->b.fd, SHUT_WR); /* half-close on */
			goto out;
		}
		c->awaiting = 1;
		c->requested = 1;
		if (!answering) {
			c->c.len = (size_t)n;
			c->c.off = 0;
		}
		if (c->reconnect) {
			c->reconnect = 0;
			backend_connect(p, c); /* refused: our 503 below */
		}
		queue_answer(p, c);
	}
out:
	update(p, c);
}

static void on_backend(struct cli_proxy *p, struct px_conn *c, uint32_t ev)
{
	if (c->connecting && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
		int err = 0;
		socklen_t l = sizeof(err);

		getsockopt(c->b.fd, SOL_SOCKET, SO_ERROR, &err, &l);
		c->connecting = 0;
		if (err) {
			gone(p, c, 1);
			return;
		}
		if (c->c.eof && c->c.len == 0)
			shutdown(c->b.fd, SHUT_WR);
	}
	if ((ev & EPOLLOUT) && c->c.len > c->c.off) {
		if (flush(&c->c, c->b.fd) < 0) {
			gone(p, c, 0);
			return;
		}
		if (c->c.len == 0 && c->c.eof)
			shutdown(c->b.fd, SHUT_WR);
	}
	if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) && c->b.len == 0 &&
	    c->b.fd >= 0) {
		ssize_t n = read(c->b.fd, c->b.buf, PX_BUF);

		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			update(p, c);
			return;
		}
		if (n <= 0) {
			gone(p, c, 0);
			return;
		}
		c->b.len = (size_t)n;
		c->b.off = 0;
		/* a response starts (after an interim 100 the tracker
		 * already waits for the next head: not reset mid-head) */
		if (c->awaiting && c->resp.state != PR_HEAD)
			resp_begin(&c->resp);
		resp_feed(&c->resp, c->b.buf, (size_t)n);
		/* an interim "100 Continue" does not start the response */
		if (!(n >= 12 && !memcmp(c->b.buf, "HTTP/1.1 100", 12)))
			c->awaiting = 0;
	}
	update(p, c);
}

static void *px_thread(void *arg)
{
	struct cli_proxy *p = arg;
	struct epoll_event evs[64];

	for (;;) {
		int n = epoll_wait(p->efd, evs, 64, 200);
		uint64_t now;

		for (int i = 0; i < n; i++) {
			void *d = evs[i].data.ptr;

			if (d == (void *)p) {
				new_conn(p);
			} else if (d == (void *)&p->stopfd) {
				return NULL;
			} else {
				struct px_conn *c = (struct px_conn *)
					((uintptr_t)d & ~(uintptr_t)1);

				/* an earlier event of this batch may have
				 * closed it: look it up */
				struct px_conn *k = p->conns;

				while (k && k != c)
					k = k->next;
				if (!k)
					continue;
				if ((uintptr_t)d & 1)
					on_backend(p, c, evs[i].events);
				else
					on_client(p, c, evs[i].events);
			}
		}
		now = st_now_ns();
		for (struct px_conn *c = p->conns, *nx; c; c = nx) {
			nx = c->next;
			if ((c->linger_ns && now > c->linger_ns) ||
			    (c->reconnect && now > c->idle_ns))
				conn_close(p, c);
		}
	}
}

/* A free port on 127.0.0.1 (bound and released: computed binds it next;
 * another process taking it meanwhile makes computed's start fail
 * loudly, and the supervisor tries again). */
static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -errno;

	if (fd < 0)
		return port;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &l) < 0)
		port = -errno;
	else
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

int cli_proxy_create(const char *bind_addr, int port, const char *run_dir,
		     int max_per_client, struct cli_proxy **ret,
		     int *ret_private_port, struct st_diag *diag)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV | AI_PASSIVE };
	struct epoll_event ev = { .events = EPOLLIN };
	struct cli_proxy *p = calloc(1, sizeof(*p));
	struct addrinfo *ai = NULL;
	char ps[16];
	int one = 1, r;

	if (!p)
		return st_diag_set(diag, -ENOMEM, "out of memory");
	p->lfd = p->efd = p->stopfd = -1;
	p->max_per_client = max_per_client;
	snprintf(p->run_dir, sizeof(p->run_dir), "%s", run_dir);
	snprintf(ps, sizeof(ps), "%d", port);
	r = getaddrinfo(bind_addr, ps, &hints, &ai);
	if (r) {
		free(p);
		return st_diag_set(diag, -EINVAL, "--http-bind %s: %s",
				   bind_addr, gai_strerror(r));
	}
	p->lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
			0);
	if (p->lfd < 0 ||
	    setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(p->lfd, ai->ai_addr, ai->ai_addrlen) < 0 ||
	    listen(p->lfd, 512) < 0) {
		r = -errno;
		freeaddrinfo(ai);
		cli_proxy_destroy(p);
		return st_diag_set(diag, r, "cannot listen on %s port %d: %s%s",
				   bind_addr, port, strerror(-r),
				   r == -EADDRINUSE ? " (another process uses "
				   "it: choose another --http-port)" : "");
	}
	freeaddrinfo(ai);
	p->private_port = free_port();
	p->efd = epoll_create1(EPOLL_CLOEXEC);
	p->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (p->private_port < 0 || p->efd < 0 || p->stopfd < 0) {
		r = p->private_port < 0 ? p->private_port : -errno;
		cli_proxy_destroy(p);
		return st_diag_set(diag, r, "HTTP front: %s", st_strerror(r));
	}
	ev.data.ptr = p;
	epoll_ctl(p->efd, EPOLL_CTL_ADD, p->lfd, &ev);
	ev.data.ptr = &p->stopfd;
	epoll_ctl(p->efd, EPOLL_CTL_ADD, p->stopfd, &ev);
	*ret_private_port = p->private_port;
	*ret = p;
	return 0;
}

int cli_proxy_start(struct cli_proxy *p)
{
	int r = pthread_create(&p->thread, NULL, px_thread, p);

	if (r)
		return -r;
	p->started = 1;
	return 0;
}

uint64_t cli_proxy_n_retry_errors(struct cli_proxy *p)
{
	return p ? atomic_load(&p->n_retry) : 0;
}

uint64_t cli_proxy_n_cut_streams(struct cli_proxy *p)
{
	return p ? atomic_load(&p->n_cut) : 0;
}

void cli_proxy_destroy(struct cli_proxy *p)
{
	if (!p)
		return;
	if (p->started) {
		uint64_t one = 1;

		if (write(p->stopfd, &one, sizeof(one)) == sizeof(one))
			pthread_join(p->thread, NULL);
	}
	while (p->conns)
		conn_close(p, p->conns);
	if (p->lfd >= 0)
		close(p->lfd);
	if (p->efd >= 0)
		close(p->efd);
	if (p->stopfd >= 0)
		close(p->stopfd);
	free(p);
}
