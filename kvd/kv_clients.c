/*
 * kv_clients.c — kvd's registry of clients: id, pid (watched through a pidfd
 * so that a dead client's sequences are released, DESIGN.md section 3), name,
 * and the last reply for idempotent re-sends (section 4).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kv_daemon.h"
#include "st_util.h"

static int pidfd_open_pid(int32_t pid)
{
#ifdef SYS_pidfd_open
	long fd = syscall(SYS_pidfd_open, (pid_t)pid, 0);

	return fd < 0 ? -1 : (int)fd;
#else
	(void)pid;
	return -1;
#endif
}

void kv_clients_init(struct kv_clients *cl)
{
	uint32_t seed = 0;

	memset(cl, 0, sizeof(*cl));
	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
		seed = (uint32_t)(st_now_ns() ^ ((uint64_t)getpid() << 16));
	/* leave room below 2^31 so ids stay readable and never wrap soon */
	cl->next_id = (seed & 0x3fffffffu) | 1u;
}

static void entry_fini(struct kv_client_entry *e)
{
	if (e->pidfd >= 0)
		close(e->pidfd);
	free(e->last_reply);
	memset(e, 0, sizeof(*e));
	e->pidfd = -1;
}

void kv_clients_fini(struct kv_clients *cl)
{
	for (uint32_t i = 0; i < cl->n; i++)
		entry_fini(&cl->v[i]);
	free(cl->v);
	memset(cl, 0, sizeof(*cl));
}

struct kv_client_entry *kv_clients_find(struct kv_clients *cl, uint32_t id)
{
	if (id == 0)
		return NULL;
	for (uint32_t i = 0; i < cl->n; i++)
		if (cl->v[i].id == id)
			return &cl->v[i];
	return NULL;
}

void kv_clients_bump_next(struct kv_clients *cl, uint32_t next_id)
{
	if (next_id > cl->next_id)
		cl->next_id = next_id;
}

int kv_clients_add(struct kv_clients *cl, int32_t pid, uint64_t start_ticks,
		   const char *name, uint32_t resume_id, uint32_t *ret_id)
{
	struct kv_client_entry *e = resume_id ? kv_clients_find(cl, resume_id)
					      : NULL;
	uint32_t id;

	if (e && e->pid == pid &&
	    (!e->start_ticks || !start_ticks || e->start_ticks == start_ticks)) {
		/* same process registering again (after a kvd restart) */
		snprintf(e->name, sizeof(e->name), "%s", name);
		*ret_id = e->id;
		return 0;
	}
	if (cl->n >= KV_MAX_CLIENTS)
		return -ST_E_LIMIT;
	if (cl->n == cl->cap) {
		uint32_t cap = cl->cap ? cl->cap * 2 : 16;
		struct kv_client_entry *v = realloc(cl->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		cl->v = v;
		cl->cap = cap;
	}
	if (resume_id && !e) {
		id = resume_id;
	} else {
		do {
			id = cl->next_id++;
			if (cl->next_id == 0)
				cl->next_id = 1;
		} while (id == 0 || kv_clients_find(cl, id));
	}
	e = &cl->v[cl->n++];
	memset(e, 0, sizeof(*e));
	e->id = id;
	e->pid = pid;
	e->start_ticks = start_ticks;
	e->pidfd = pidfd_open_pid(pid);
	/* checked once the pidfd is open, so that it names the process
	 * that started then: a reused pid is another process (dead owner) */
	if (e->pidfd >= 0 && !st_pid_alive_since(pid, start_ticks)) {
		close(e->pidfd);
		e->pidfd = -1;
	}
	snprintf(e->name, sizeof(e->name), "%s", name);
	*ret_id = id;
	return 0;
}

void kv_clients_remove(struct kv_clients *cl, uint32_t id)
{
	for (uint32_t i = 0; i < cl->n; i++)
		if (cl->v[i].id == id) {
			entry_fini(&cl->v[i]);
			cl->v[i] = cl->v[--cl->n];
			return;
		}
}

/* State letter of /proc/<pid>/stat ('Z' zombie, 'X' dead), 0 if absent. */
static char proc_state(int32_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
	return p && p[1] == ' ' ? p[2] : 0;
}

uint64_t kv_clients_demand(const struct kv_clients *cl, uint64_t now_ns,
			   uint32_t *ret_reqs, uint64_t *ret_grow)
{
	uint64_t n = 0, grow = 0;
	uint32_t reqs = 0;

	for (uint32_t i = 0; i < cl->n; i++) {
		const struct kv_client_entry *e = &cl->v[i];

		if (now_ns >= e->demand_ns &&
		    now_ns - e->demand_ns <= KV_DEMAND_STALE_NS) {
			n += e->demand_pages;
			reqs += e->demand_reqs;
			grow += e->demand_grow;
		}
	}
	*ret_reqs = reqs;
	*ret_grow = grow;
	return n;
}

int kv_clients_dead(const struct kv_client_entry *e)
{
	char st;

	if (e->pidfd >= 0) {
		struct pollfd pfd = { .fd = e->pidfd, .events = POLLIN };

		return poll(&pfd, 1, 0) > 0;
	}
	if (e->pid <= 0)
		return 1;
	if (kill(e->pid, 0) < 0 && errno == ESRCH)
		return 1;
	if (!st_pid_alive_since(e->pid, e->start_ticks))
		return 1;
	st = proc_state(e->pid);
	return st == 'Z' || st == 'X';
}

void kv_clients_cache_reply(struct kv_client_entry *e, uint64_t request_id,
			    uint16_t type, const void *reply, size_t len)
{
	uint8_t *copy = malloc(len ? len : 1);

	if (!copy)
		return; /* no cache: a re-sent request is handled again */
	memcpy(copy, reply, len);
	free(e->last_reply);
	e->last_reply = copy;
	e->last_reply_len = len;
	e->last_request_id = request_id;
	e->last_type = type;
}
