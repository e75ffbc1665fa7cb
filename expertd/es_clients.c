/*
 * es_clients.c — the client table of the expert pool (es_pool.h): pins are
 * leases held by registered clients; a client that says BYE or whose
 * process dies loses its entry and every pin (DESIGN.md section 3).  Entries
 * are reused only with a new generation, so a stale client id is refused.
 * Server thread only.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "es_daemon.h"
#include "st_log.h"
#include "st_util.h"

/* 1 if /proc says pid is a zombie (exited, not yet reaped). */
static int pid_is_zombie(int32_t pid)
{
	char path[64], *txt = NULL, *rp;
	int z = 0;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (st_read_file(path, &txt, NULL) < 0)
		return 0;
	rp = strrchr(txt, ')'); /* the command name may hold spaces */
	if (rp && rp[1] == ' ')
		z = rp[2] == 'Z' || rp[2] == 'X';
	free(txt);
	return z;
}

void es_clients_watch(struct es_pool *p, int c)
{
	int32_t pid = atomic_load(&p->v.clients[c].pid);

	if (p->pidfd[c] >= 0)
		close(p->pidfd[c]);
	p->pidfd[c] = -1;
#ifdef SYS_pidfd_open
	if (pid > 0)
		p->pidfd[c] = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
	if (p->pidfd[c] < 0)
		p->pidfd[c] = -1;
#endif
	/* checked after the pidfd is open, so it names the process that
	 * started then: a pid reused since (an expertd restart in between)
	 * is another process, and the entry is dead */
	if (p->pidfd[c] >= 0 &&
	    !st_pid_alive_since(pid, p->v.clients[c].start_ticks)) {
		close(p->pidfd[c]);
		p->pidfd[c] = -1;
	}
}

int es_clients_alive(struct es_pool *p, int c)
{
	int32_t pid = atomic_load(&p->v.clients[c].pid);

	if (pid <= 0)
		return 0;
	if (p->pidfd[c] >= 0) {
		struct pollfd pf = { .fd = p->pidfd[c], .events = POLLIN };

		/* readable once the process has terminated */
		return poll(&pf, 1, 0) == 0;
	}
	return st_pid_alive_since(pid, p->v.clients[c].start_ticks) &&
	       !pid_is_zombie(pid);
}

int es_clients_register(struct es_pool *p, int32_t pid, uint64_t start_ticks,
			const char *name, uint32_t *ret_id)
{
	for (int c = 0; c < ES_MAX_CLIENTS; c++) {
		struct es_pool_client *e = &p->v.clients[c];
		uint32_t gen;

		if (atomic_load(&e->pid) != 0)
			continue;
		gen = atomic_load(&e->generation) & 0xffffffu;
		if (gen == 0)
			gen = 1;
		atomic_store(&e->generation, gen);
		/* A free entry has no pins (cleared when it was freed); clear
		 * again in case the table came from a corrupted segment. */
		es_pool_clear_pins(p, c);
		memset(e->name, 0, sizeof(e->name));
		snprintf(e->name, sizeof(e->name), "%s", name);
		e->registered_ns = st_now_ns();
		e->start_ticks = start_ticks;
		atomic_store(&e->last_request_id, 0);
		atomic_store(&e->pid, pid);
		es_clients_watch(p, c);
		*ret_id = es_client_id_make((uint32_t)c, gen);
		return 0;
	}
	return -ST_E_LIMIT;
}

int es_clients_lookup(struct es_pool *p, uint32_t id, int32_t pid,
		      struct st_diag *diag)
{
	uint32_t c = es_client_id_index(id);
	struct es_pool_client *e;
	int32_t epid;

	if (c >= ES_MAX_CLIENTS)
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "unknown client id %u (send HELLO first)", id);
	e = &p->v.clients[c];
	epid = atomic_load(&e->pid);
	if (epid <= 0 || es_client_id_gen(id) !=
				 (atomic_load(&e->generation) & 0xffffffu))
		return st_diag_set(diag, -ST_E_NOTFOUND,
				   "unknown client id %u (never registered, or "
				   "it said BYE or died; send HELLO again)", id);
	if (pid > 0 && pid != epid)
		return st_diag_set(diag, -EPERM,
				   "client id %u belongs to pid %d, not %d", id,
				   epid, pid);
	return (int)c;
}

void es_clients_unregister(struct es_pool *p, int c)
{
	struct es_pool_client *e = &p->v.clients[c];
	uint32_t gen;

	/* Pins first, then the entry: a new client of this index must never
	 * inherit a pin. */
	es_pool_clear_pins(p, c);
	gen = (atomic_load(&e->generation) + 1) & 0xffffffu;
	atomic_store(&e->generation, gen ? gen : 1);
	atomic_store(&e->last_request_id, 0);
	atomic_store(&e->pid, 0);
	if (p->pidfd[c] >= 0)
		close(p->pidfd[c]);
	p->pidfd[c] = -1;
}

int es_clients_reap(struct es_pool *p)
{
	int n = 0;

	for (int c = 0; c < ES_MAX_CLIENTS; c++) {
		struct es_pool_client *e = &p->v.clients[c];
		int32_t pid = atomic_load(&e->pid);

		if (pid > 0 && !es_clients_alive(p, c)) {
			st_info("client %d '%.*s' (pid %d) died; releasing its "
				"pins", c, (int)sizeof(e->name), e->name, pid);
			es_clients_unregister(p, c);
			n++;
		}
	}
	return n;
}

uint32_t es_clients_count(const struct es_pool *p)
{
	uint32_t n = 0;

	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		n += atomic_load(&p->v.clients[c].pid) > 0;
	return n;
}
