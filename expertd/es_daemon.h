/*
 * es_daemon.h — expertd's internal interfaces (not installed, not used by
 * clients).  One struct holds the daemon's whole state (STYLE.md); each
 * file owns one part of it:
 *
 *   es_main.c     command line, start-up and tear-down (reads top to bottom)
 *   es_pool.c     the host expert pool segment: create/adopt, slot states
 *   es_policy.c   which slot to give a new expert (eviction choice)
 *   es_loader.c   loader threads: store record -> slot, checksum verified
 *   es_clients.c  the client table: register, look up, reap dead clients
 *   es_server.c   the REP loop and message handlers, events on PUB
 *
 * Threads: one server thread (main) does every change of keys, the index,
 * the client table and the READY<->EVICTING transitions; N loader threads
 * only write the record of a LOADING slot and publish READY or FAILED.
 */
#ifndef ES_DAEMON_H
#define ES_DAEMON_H

#include <pthread.h>
#include <stdint.h>

#include "es_pool.h"
#include "es_proto.h"
#include "st_error.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_store.h"

#define ES_DAEMON_NAME "expertd"
#define ES_DEFAULT_LOADER_THREADS 2
#define ES_MAX_LOADER_THREADS 64
/* How often registered clients' pids are checked (ms). */
#define ES_REAP_INTERVAL_MS 100

/* Command-line options, resolved. */
struct es_opts {
	const char *store_dir;
	const char *instance;
	char run_dir[1024];
	const char *budget_text;      /* NULL: 100% */
	int loader_threads;
	int test_load_delay_ms;       /* fault injection for tests, 0 = off */
	int test_proto_version;       /* tests: refuse HELLO as this version */
	int no_verify_adopted;        /* skip re-hashing READY slots on adopt */
};

/* ---- es_pool.c ---- */

/* The daemon's handle on its pool segment. */
struct es_pool {
	struct st_shm shm;
	struct es_pool_view v;
	struct es_pool_geom geom;
	struct es_pool_layout layout;
	int adopted;                  /* 1 if taken over from a dead owner */
	/* pidfd of each registered client (-1: none; then kill(pid, 0) and
	 * /proc decide).  Unlike a pid, a pidfd sees a zombie as dead and is
	 * never confused by pid reuse. */
	int pidfd[ES_MAX_CLIENTS];
};

/* Geometry of the pool for a store and a budget: n_slots = bytes /
 * record_bytes, or percent of all experts; capped at n_layers * n_experts.
 * -ST_E_BUDGET (message with the minimum in bytes) when n_slots < top_k,
 * -EINVAL for a budget that does not parse. */
int es_pool_geom_from_budget(const struct st_store *s, uint64_t store_id,
			     const char *budget_text, struct es_pool_geom *ret,
			     struct st_diag *diag);

/*
 * Creates the pool segment, or adopts the one a killed expertd of the same
 * store and geometry left (epoch bumped; LOADING/EVICTING/FAILED slots
 * discarded to EMPTY; READY slots kept when their record still matches the
 * store's checksum unless no_verify; dead clients' pins and entries
 * dropped).  Returns 0 (fresh) or 1 (adopted), -EBUSY when a live expertd
 * owns it, or another negative code, with diag.
 */
int es_pool_open(struct es_pool *p, const char *instance,
		 const struct es_pool_geom *g, const struct st_store *store,
		 int no_verify, struct st_diag *diag);

/* Unmaps; with destroy also unlinks the segment (clean shutdown). */
void es_pool_close(struct es_pool *p, int destroy);

/* Gives slot s (EMPTY with no pins, or EVICTING won by the caller) the key
 * and state LOADING with a new generation; indexes it.  Server thread. */
void es_pool_slot_assign(struct es_pool *p, uint32_t s, uint64_t key);

/* Unindexes slot s (if it is the index entry of its key) and makes it
 * EMPTY with a new generation.  Server thread; the slot must not be
 * LOADING and its pins must sum to 0 (or it is being discarded on adopt). */
void es_pool_slot_clear(struct es_pool *p, uint32_t s);

/* Loader: LOADING -> READY (err 0) or FAILED (err < 0). */
void es_pool_slot_publish(struct es_pool *p, uint32_t s, int err);

/*
 * Evictor half of the pin protocol (es_pool.h): CAS READY -> EVICTING,
 * then sum the pins.  Returns 0 with the slot EVICTING (ours), or -EBUSY
 * with the slot back to READY (someone pinned it) or untouched (not READY).
 */
int es_pool_slot_try_evict(struct es_pool *p, uint32_t s);

/* Finds a slot for a new key: an EMPTY unpinned one, else an unpinned
 * FAILED one, else the policy's eviction victim.  Returns the slot (EMPTY
 * or EVICTING, not yet assigned; *ret_evicted 1 when a READY record was
 * evicted) or -ST_E_BUSY when every slot is pinned or loading. */
int es_pool_alloc_slot(struct es_pool *p, int *ret_evicted);

/* Drops every pin of client table entry c (BYE or death). */
void es_pool_clear_pins(struct es_pool *p, int c);

/* Number of slots not EMPTY. */
uint64_t es_pool_slots_used(const struct es_pool *p);

/* ---- es_policy.c ---- */

/*
 * Eviction choice: the least recently used READY slot whose pins sum to 0,
 * skipping slots marked in skip[] (may be NULL).  Returns the slot or -1.
 * The caller runs the pin protocol on it (it may lose the race).
 */
int es_policy_pick_victim(const struct es_pool_view *v, const uint8_t *skip);

/* ---- es_loader.c ---- */

struct es_loader;

/*
 * Starts n_threads loader threads reading records of `store` into pool p
 * (both borrowed, must outlive the loader).  Opens every expert file.
 * delay_ms > 0 sleeps that long before each read (tests only).
 */
int es_loader_start(struct es_loader **ret, struct es_pool *p,
		    const struct st_store *store, int n_threads, int delay_ms,
		    struct st_diag *diag);

/* Queues a load of `key` into LOADING slot s.  Never blocks on I/O. */
int es_loader_queue(struct es_loader *l, uint32_t s, uint64_t key);

/* 0, or the error of a failed load of key (and its message into buf) so
 * that a later ACQUIRE is refused at once without re-reading. */
int es_loader_failure(struct es_loader *l, uint64_t key, char *buf,
		      size_t len);

/* Stops and joins the threads (queued loads are dropped: their slots stay
 * LOADING, which the next owner discards), closes files, frees.  NULL ok. */
void es_loader_stop(struct es_loader *l);

/* ---- es_clients.c ---- */

/* Registers a client: a free table entry gets pid and name; returns its
 * client id (> 0) or -ST_E_LIMIT when the table is full. */
int es_clients_register(struct es_pool *p, int32_t pid, const char *name,
			uint32_t *ret_id);

/* Table index of a valid client id (entry in use with that generation and,
 * when pid > 0, that pid) or -ST_E_NOTFOUND / -EPERM with diag. */
int es_clients_lookup(struct es_pool *p, uint32_t id, int32_t pid,
		      struct st_diag *diag);

/* Frees entry c: drops its pins, bumps its generation. */
void es_clients_unregister(struct es_pool *p, int c);

/* Opens the pidfd of entry c's process (after registering or adopting). */
void es_clients_watch(struct es_pool *p, int c);

/* True while entry c's process lives (pidfd, else kill(pid, 0) and not a
 * zombie). */
int es_clients_alive(struct es_pool *p, int c);

/* Unregisters every client whose pid is gone.  Returns how many. */
int es_clients_reap(struct es_pool *p);

/* Number of registered clients. */
uint32_t es_clients_count(const struct es_pool *p);

/* ---- es_server.c ---- */

struct es_daemon {
	struct es_opts opt;
	struct st_store *store;
	uint64_t store_id;
	struct es_pool pool;
	struct es_loader *loader;
	struct st_sock rep, pub;
	char ctl_path[1100], evt_path[1100];
	int sig_fd;
	int stop;                 /* set by SHUTDOWN or a stop signal */
	int keep_pool;            /* SHUTDOWN KEEP_POOL: leave the segment */
	uint64_t next_reap_ns;
};

/* Binds the REP and PUB sockets of the daemon.  0 or negative with diag. */
int es_server_bind(struct es_daemon *d, struct st_diag *diag);

/* Publishes an event (ES_EVT_*) on the PUB socket; failures are ignored
 * (events are hints). */
void es_server_publish(struct es_daemon *d, uint16_t type);

/* Serves requests until a stop signal or SHUTDOWN.  Returns 0. */
int es_server_run(struct es_daemon *d);

/* Handles one received message (buf, len bytes) and sends the reply.
 * Never fails on bad input: the sender gets an error reply. */
void es_server_handle(struct es_daemon *d, const uint8_t *buf, size_t len);

/* Closes the sockets and removes their files. */
void es_server_close(struct es_daemon *d);

#endif
