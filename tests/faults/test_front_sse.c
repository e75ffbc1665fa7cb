/*
 * test_front_sse.c — the supervisor's HTTP front (cli/cli_proxy.h) on a
 * response cut by its backend's end, against a fake backend on the
 * front's private port (no computed pid file: the backend counts as gone,
 * as after a kill -9).  Each case scripts computed's response, sends it in
 * pieces (one case byte by byte, so that the front reads every boundary
 * split), closes, and compares what the client got:
 *  - an SSE stream (chunked, or close-delimited) cut between events: the
 *    bytes sent, then one chunk holding `data: {"error": {...,
 *    "code":"computed_restarting"}}` and the last chunk (close-delimited:
 *    the event alone); no "data: [DONE]";
 *  - cut inside an event, inside a chunk, a stream already complete (last
 *    chunk sent), a JSON response: the bytes sent, nothing added;
 *  - an interim "100 Continue" before the stream: the event still added;
 *  - with a computed pid file naming a live process (this one): the
 *    computed that took the stream lives and ended it (it stops): the
 *    event says computed_stopping instead;
 *  - computed gone between a client's connect and its request (the
 *    chaos test's BrokenPipeError): the request goes to the computed
 *    listening when it comes, or gets a 503 computed_restarting when none
 *    does; never a reset connection;
 *  - a client connected while no computed listened, its request sent
 *    once one listens again: the request reaches it (not a 503).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli_proxy.h"
#include "st_daemon.h"
#include "st_util.h"
#include "test_util.h"

static int failures;

#define HEAD_CHUNKED                                                       \
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"           \
	"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
#define EV1 "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
#define EV2 "data: {\"choices\":[{\"text\":\"b\"}]}\n\n: keep-alive\n\n"

struct tcase {
	const char *name;
	const char *resp;   /* what the fake computed sends, then closes */
	int byte_by_byte;
	int want;           /* 0: nothing added; 1: chunked event; 2: bare;
			     * 3: chunked, computed_stopping */
};

static int port_of(int fd)
{
	struct sockaddr_in a;
	socklen_t l = sizeof(a);

	return getsockname(fd, (struct sockaddr *)&a, &l) < 0 ? -1 :
	       ntohs(a.sin_port);
}

static int listen_on(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(fd, 8) < 0) {
		perror("listen");
		exit(1);
	}
	return fd;
}

static int connect_to(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		perror("connect");
		exit(1);
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Reads fd until EOF (or 10 s) into buf; the length. */
static size_t read_all(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&p, 1, 10000) <= 0)
			break;
		r = read(fd, buf + n, cap - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = 0;
	return n;
}

/* accept(2) on lfd within 5 s; -1 when nothing came. */
static int accept_within(int lfd)
{
	struct pollfd p = { .fd = lfd, .events = POLLIN };

	if (poll(&p, 1, 5000) <= 0)
		return -1;
	return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* The request the gone-computed cases send, and the fake computed's
 * answer to it. */
static const char k_req[] =
	"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
	"Content-Length: 2\r\n\r\n{}";
static const char k_resp[] =
	"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	"Content-Length: 2\r\nConnection: close\r\n\r\n{}";

/* A fake computed on lfd takes one connection within 5 s, reads k_req
 * from it, answers k_resp and closes.  1 when it read all of k_req. */
static int backend_answer(int lfd)
{
	char tmp[4096];
	size_t rl = 0;
	int b = accept_within(lfd);

	while (b >= 0 && rl < sizeof(k_req) - 1) {
		ssize_t r = read(b, tmp, sizeof(tmp));

		if (r <= 0)
			break;
		rl += (size_t)r;
	}
	if (b >= 0 && write(b, k_resp, sizeof(k_resp) - 1) < 0)
		perror("write");
	if (b >= 0)
		close(b);
	return b >= 0 && rl == sizeof(k_req) - 1;
}

/* A client connects, computed (the fake backend) ends before the request
 * comes; then the request.  relisten: a computed listens again (it must
 * get the request and its answer reach the client), else none (the
 * client must get our 503).  Closes *lfd when !relisten. */
static void run_gone_before_request(int front_port, int *lfd, int relisten)
{
	char got[8192];
	int c = connect_to(front_port), b = accept_within(*lfd), bad;
	size_t n;

	ST_TEST_CHECK(b >= 0);
	if (!relisten) {
		close(*lfd); /* no computed listens now */
		*lfd = -1;
	}
	close(b); /* computed's end, as a kill -9 with no request */
	st_sleep_ns(100000000ull);
	if (send(c, k_req, sizeof(k_req) - 1, MSG_NOSIGNAL) !=
	    (ssize_t)sizeof(k_req) - 1) {
		printf("FAIL: gone before the request (%s): send: %s\n",
		       relisten ? "a computed again" : "none", strerror(errno));
		failures++;
		close(c);
		return;
	}
	if (relisten) {
		int served = backend_answer(*lfd);

		n = read_all(c, got, sizeof(got));
		bad = !served || n != sizeof(k_resp) - 1 ||
		      memcmp(got, k_resp, n);
	} else {
		n = read_all(c, got, sizeof(got));
		bad = strncmp(got, "HTTP/1.1 503 ", 13) ||
		      !strstr(got, "\"code\":\"computed_restarting\"");
	}
	close(c);
	printf("%s: computed gone before the request came, %s (%zu bytes "
	       "got)\n", bad ? "FAIL" : "ok",
	       relisten ? "a computed listens again: it answers" :
			  "none listens: 503 computed_restarting", n);
	if (bad) {
		printf("  got: %.*s\n", (int)ST_MIN(n, 1200), got);
		failures++;
	}
}

/* A client connects while no computed listens (between a kill and the
 * restart), then a computed listens on the private port again, then the
 * request comes: it must reach that computed and its answer the client
 * (before: the front had fixed a 503 at the connect).  Opens *lfd. */
static void run_connect_while_down(int front_port, int priv, int *lfd)
{
	char got[8192];
	int c = connect_to(front_port), served, bad;
	size_t n;

	st_sleep_ns(100000000ull); /* the front's connect is refused */
	*lfd = listen_on(priv);    /* a restarted computed */
	if (send(c, k_req, sizeof(k_req) - 1, MSG_NOSIGNAL) !=
	    (ssize_t)sizeof(k_req) - 1) {
		printf("FAIL: connect while down: send: %s\n",
		       strerror(errno));
		failures++;
		close(c);
		return;
	}
	served = backend_answer(*lfd);
	n = read_all(c, got, sizeof(got));
	close(c);
	bad = !served || n != sizeof(k_resp) - 1 || memcmp(got, k_resp, n);
	printf("%s: connected while no computed listened, the request came "
	       "once one did: it answers (%zu bytes got)\n",
	       bad ? "FAIL" : "ok", n);
	if (bad) {
		printf("  got: %.*s\n", (int)ST_MIN(n, 1200), got);
		failures++;
	}
}

static void run_case(int front_port, int backend_lfd, const struct tcase *t)
{
	char got[65536], tmp[4096];
	size_t n, sent = strlen(t->resp), rl = 0;
	int c = connect_to(front_port), b, one = 1, bad = 0;

	if (write(c, k_req, sizeof(k_req) - 1) != (ssize_t)sizeof(k_req) - 1) {
		perror("write");
		exit(1);
	}
	b = accept4(backend_lfd, NULL, NULL, SOCK_CLOEXEC);
	setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	while (rl < sizeof(k_req) - 1) { /* the request, as the front passed it */
		ssize_t r = read(b, tmp, sizeof(tmp));

		if (r <= 0)
			break;
		rl += (size_t)r;
	}
	for (size_t off = 0; off < sent;) {
		size_t k = t->byte_by_byte ? 1 : ST_MIN(sent - off, 40);

		if (write(b, t->resp + off, k) != (ssize_t)k) {
			perror("write");
			exit(1);
		}
		off += k;
		st_sleep_ns(t->byte_by_byte ? 300000ull : 2000000ull);
	}
	close(b);
	n = read_all(c, got, sizeof(got));
	close(c);
	if (n < sent || memcmp(got, t->resp, sent)) {
		bad = 1;
	} else if (t->want == 0) {
		bad = n != sent;
	} else {
		const char *a = got + sent, *ev = a;
		char *end = NULL;
		unsigned long len = strtoul(a, &end, 16);

		const char *code = t->want == 3 ?
			"\"code\":\"computed_stopping\"" :
			"\"code\":\"computed_restarting\"";

		if (t->want != 2) {
			/* "<hex>\r\n<event>\r\n0\r\n\r\n" */
			bad = !end || strncmp(end, "\r\n", 2);
			ev = bad ? a : end + 2;
			bad = bad || (size_t)(ev - got) + len + 7 != n ||
			      strcmp(ev + len, "\r\n0\r\n\r\n");
		} else {
			len = n - sent;
		}
		bad = bad || strncmp(ev, "data: {\"error\":{", 16) ||
		      strncmp(ev + len - 4, "}}\n\n", 4) ||
		      !memmem(ev, len, code, strlen(code)) ||
		      !memmem(ev, len, "\"type\":\"server_error\"", 21) ||
		      memmem(got, n, "[DONE]", 6);
	}
	printf("%s: %s (%zu bytes sent, %zu got)\n", bad ? "FAIL" : "ok",
	       t->name, sent, n);
	if (bad) {
		printf("  got: %.*s\n", (int)ST_MIN(n, 1200), got);
		failures++;
	}
}

int main(void)
{
	char run_dir[4096];
	struct st_diag diag = { "" };
	struct cli_proxy *p = NULL;
	int tmpfd = listen_on(0), front_port = port_of(tmpfd), priv = 0, lfd;
	static const struct tcase cases[] = {
		{ "chunked SSE cut between events",
		  HEAD_CHUNKED "22\r\n" EV1 "\r\n30\r\n" EV2 "\r\n", 0, 1 },
		{ "the same, read byte by byte",
		  HEAD_CHUNKED "22\r\n" EV1 "\r\n30\r\n" EV2 "\r\n", 1, 1 },
		{ "an event split over two chunks, cut after both",
		  HEAD_CHUNKED "9\r\ndata: {\"c\r\ne\r\nhoices\":[1]}\n\n\r\n",
		  1, 1 },
		{ "cut inside an event (chunk boundary)",
		  HEAD_CHUNKED "22\r\n" EV1 "\r\n9\r\ndata: {\"c\r\n", 1, 0 },
		{ "cut inside a chunk",
		  HEAD_CHUNKED "22\r\n" EV1 "\r\n30\r\ndata: {\"cho", 0, 0 },
		{ "stream complete (last chunk) before the close",
		  HEAD_CHUNKED "22\r\n" EV1 "\r\ne\r\ndata: [DONE]\n\n\r\n"
		  "0\r\n\r\n", 0, 0 },
		{ "a JSON response cut at a chunk boundary",
		  "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
		  "Transfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n", 0, 0 },
		{ "close-delimited SSE cut between events",
		  "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
		  "Connection: close\r\n\r\n" EV1 EV2, 1, 2 },
		{ "100 Continue, then a chunked SSE cut between events",
		  "HTTP/1.1 100 Continue\r\n\r\n" HEAD_CHUNKED "22\r\n" EV1
		  "\r\n", 0, 1 },
	};

	close(tmpfd);
	st_test_tmpdir(run_dir, sizeof(run_dir));
	/* no computed.pid in run_dir: a closed backend is a gone computed */
	if (cli_proxy_create("127.0.0.1", front_port, run_dir, 0, &p, &priv,
			     &diag) < 0 || cli_proxy_start(p) < 0) {
		printf("FAIL: the front: %s\n", diag.msg);
		return 1;
	}
	lfd = listen_on(priv);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		run_case(front_port, lfd, &cases[i]);
	{
		/* computed's pid file names a live process (us) */
		static const struct tcase live = {
			"a live computed ended the stream between events",
			HEAD_CHUNKED "22\r\n" EV1 "\r\n", 1, 3 };

		ST_TEST_CHECK(st_pidfile_write(run_dir, "computed") == 0);
		run_case(front_port, lfd, &live);
		st_pidfile_remove(run_dir, "computed");
	}
	run_gone_before_request(front_port, &lfd, 1);
	run_gone_before_request(front_port, &lfd, 0);
	run_connect_while_down(front_port, priv, &lfd);
	ST_TEST_CHECK(cli_proxy_n_cut_streams(p) == 6);
	printf("streams ended with the error event: %llu (want 6)\n",
	       (unsigned long long)cli_proxy_n_cut_streams(p));
	cli_proxy_destroy(p);
	if (lfd >= 0)
		close(lfd);
	rmdir(run_dir);
	printf("%d failed\n", failures);
	return failures ? 1 : 0;
}
