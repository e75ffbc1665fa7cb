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
 *   es_budget.c   --memory-budget: the share of one host budget with kvd
 *                 (st_ledger.h), obeyed and valued (es_budget_value.c)
 *
 * Threads: one server thread (main) does every change of keys, the index,
 * the client table and the READY<->EVICTING transitions; N loader threads
 * only write the record of a LOADING slot and publish READY or FAILED.
 */
#ifndef ES_DAEMON_H
#define ES_DAEMON_H

#include <pthread.h>
#include <stdint.h>

#include "es_actstats.h"
#include "es_pool.h"
#include "es_proto.h"
#include "st_error.h"
#include "st_msg.h"
#include "st_shm.h"
#include "st_numa.h"
#include "st_store.h"

#define ES_DAEMON_NAME "expertd"
#define ES_DEFAULT_LOADER_THREADS 4
#define ES_MAX_LOADER_THREADS 64
/* How often registered clients' pids are checked (ms). */
#define ES_REAP_INTERVAL_MS 100

/* Eviction policies of the host tier (--evict). */
enum es_evict_policy {
	ES_EVICT_LRU = 0,   /* least recently used (last_use_ns) */
	ES_EVICT_LFRU = 1,  /* least decayed activation count (LRFU CRF,
			     * es_actstats.h), ties by last use */
};

/* How a look-ahead hint is admitted into a full pool under LFRU (--admit;
 * es_tiers.c admit()). */
enum es_admit_policy {
	ES_ADMIT_FREQUENCY = 0, /* the hinted expert's decayed count is above
				 * the victim's (TinyLFU; default) */
	ES_ADMIT_PRECISION = 1, /* the victim's per-token activation rate is
				 * below the hints' measured precision */
};

/* What the eviction choice may consult (es_policy.c).  Borrowed from the
 * daemon; every pointer may be NULL (then plain LRU). */
struct es_evict_ctx {
	enum es_evict_policy policy;
	const struct es_actstats *stats;
	const uint8_t *hot_key;     /* [n_layers * n_experts] 1 = hot set */
	const uint8_t *protect;     /* [n_slots] 1 = prefetched, not yet used */
	int strict;                 /* never fall back to hot/protected */
	uint64_t fresh_ns;          /* strict picks skip slots used at or after
				     * this time (0: none): the experts of the
				     * layer being computed */
};

#define ES_DEFAULT_PREFETCH_INFLIGHT 4
#define ES_DEFAULT_STATS_SAVE_S 60

/* Command-line options, resolved. */
struct es_opts {
	const char *store_dir;
	const char *instance;
	char run_dir[1024];
	const char *budget_text;      /* NULL: 100% */
	int loader_threads;
	int loader_nice;              /* --loader-nice: 0 = the daemon's */
	int test_load_delay_ms;       /* fault injection for tests, 0 = off */
	int test_shrink_delay_ms;     /* tests: sleep between a shrink's
				       * clear and its MADV_REMOVE, 0 = off */
	int test_proto_version;       /* tests: refuse HELLO as this version */
	int no_verify_adopted;        /* skip re-hashing READY slots on adopt */
	const char *numa;             /* --numa: NULL = no binding */
	enum es_evict_policy evict;   /* --evict */
	enum es_admit_policy admit;   /* --admit */
	int hot_experts;              /* --hot-experts N per layer (0 = none) */
	const char *hot_text;         /* --hot-experts as given (N or bytes) */
	double half_life;             /* --stats-half-life, tokens */
	const char *state_dir;        /* --state-dir (NULL: run dir) */
	int stats_save_s;             /* --stats-save-interval, s (0 = exit only) */
	int no_prefetch;              /* --no-prefetch: ignore hints */
	int prefetch_inflight;        /* --prefetch-inflight */
	int no_direct_io;             /* --no-direct-io: buffered reads */
	const char *engram_cache_text; /* --engram-cache (V4.1 stores) */
	const char *memory_budget_text; /* --memory-budget: NULL = none */
};

/* ---- es_pool.c ---- */

/* The daemon's handle on its pool segment. */
struct es_pool {
	struct st_shm shm;
	struct es_pool_view v;
	struct es_pool_geom geom;
	struct es_pool_layout layout;
	int adopted;                  /* 1 if taken over from a dead owner */
	int sparse;                   /* --memory-budget: sized for the cap,
				       * slots' pages given back when freed */
	uint32_t allowed;             /* slots the memory target allows
				       * (es_budget.c); 0: all n_slots */
	int went_over;                /* a demand load took a slot beyond
				       * `allowed` (every other was pinned or
				       * loading); es_budget.c clears it */
	const struct es_evict_ctx *ev; /* eviction inputs, NULL: LRU */
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
 * Creates the pool segment (sparse: without huge pages or pre-faulting,
 * for --memory-budget), or adopts the one a killed expertd of the same
 * store and geometry left (epoch bumped; LOADING/EVICTING/FAILED slots
 * discarded to EMPTY; READY slots kept when their record still matches the
 * store's checksum unless no_verify; dead clients' pins and entries
 * dropped).  Returns 0 (fresh) or 1 (adopted), -EBUSY when a live expertd
 * owns it, or another negative code, with diag.
 */
int es_pool_open(struct es_pool *p, const char *instance,
		 const struct es_pool_geom *g, const struct st_store *store,
		 int no_verify, int sparse, struct st_diag *diag);

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

/* Finds a slot for a new key: an EMPTY unpinned one while fewer than
 * p->allowed slots are in use (not EMPTY), else an unpinned FAILED one,
 * else the policy's eviction victim; when none of those exists and `need`
 * (a client waits for the expert) an EMPTY one beyond p->allowed (sets
 * p->went_over).  Returns the slot (EMPTY or EVICTING, not yet assigned;
 * *ret_evicted 1 when a READY record was evicted) or -ST_E_BUSY when
 * every slot is pinned or loading (or, without need, every slot that the
 * target allows). */
int es_pool_alloc_slot(struct es_pool *p, int need, int *ret_evicted);

/* Gives the memory of slot s's record back to the OS (MADV_REMOVE: the
 * shared tmpfs pages are freed, the range reads as zeros).  The slot must
 * be EMPTY (cleared first: an adopting successor keeps EVICTING slots'
 * records) and not assigned since.  Server thread.  0 or -errno. */
int es_pool_release_record(struct es_pool *p, uint32_t s);

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

/*
 * The policy's choice (ev->policy) among READY unpinned slots not in
 * skip[], preferring slots neither hot (ev->hot_key) nor protected
 * (ev->protect); only when every candidate is hot or protected is one of
 * those returned.  ev NULL: es_policy_pick_victim.  Returns the slot or -1;
 * *ret_hot 1 when the victim was hot or protected.
 */
int es_policy_pick(const struct es_evict_ctx *ev,
		   const struct es_pool_view *v, const uint8_t *skip,
		   int *ret_hot);

/*
 * Eviction order of the whole pool in one pass: the READY unpinned slots
 * in the order successive es_policy_pick calls would return them (neither
 * hot nor protected first, each group by the policy's score, then last
 * use; hot and protected ones left out under ev->strict; ev NULL: LRU),
 * at most max into ret[].  Returns how many, or -ENOMEM.  For evicting
 * many slots at once (es_budget.c) without a scan of the pool per victim.
 */
int es_policy_rank(const struct es_evict_ctx *ev,
		   const struct es_pool_view *v, int32_t *ret, uint32_t max);

/* Parses --evict NAME ("lru", "lfru").  0 or -EINVAL. */
int es_policy_parse(const char *name, enum es_evict_policy *ret);

/* ---- es_loader.c ---- */

struct es_loader;
struct st_ioq;

/*
 * Starts n_threads loader threads reading records of `store` into pool p
 * (both borrowed, must outlive the loader).  Opens every expert file, with
 * O_DIRECT when `direct` (records are 4 KiB-aligned in the file and in the
 * pool) falling back to buffered reads where the file system refuses it.
 * A record whose checksum fails is read once more before it is refused.
 * delay_ms > 0 sleeps that long before each read (tests only).  nice > 0:
 * each thread lowers its own priority by that much (setpriority on its
 * tid), so the compute threads of a small machine win the cores from the
 * loaders' checksums; a failure to do so is logged, not fatal.
 * ioq (borrowed, NULL: none): every record read goes through the
 * instance's I/O queue (st_ioq.h), class ST_IOQ_DEMAND for a demand miss,
 * ST_IOQ_PREFETCH for a prefetch, with the record's bytes.
 */
int es_loader_start(struct es_loader **ret, struct es_pool *p,
		    const struct st_store *store, int n_threads, int delay_ms,
		    int direct, int nice, struct st_ioq *ioq,
		    struct st_diag *diag);

/* Queues a load of `key` into LOADING slot s (a demand miss: served before
 * every prefetch).  Never blocks on I/O. */
int es_loader_queue(struct es_loader *l, uint32_t s, uint64_t key);

/* Queues a prefetch load (below demand misses).  Never blocks. */
int es_loader_queue_prefetch(struct es_loader *l, uint32_t s, uint64_t key);

/* A prefetch still waiting in the queue for slot s becomes a demand load
 * (a client now waits for it).  Returns 1 if one was moved. */
int es_loader_promote(struct es_loader *l, uint32_t s);

/* Prefetch loads queued or being read now. */
int es_loader_prefetch_inflight(struct es_loader *l);

/* 1 when the expert files are read with O_DIRECT (page cache bypassed). */
int es_loader_direct(const struct es_loader *l);

/* 0, or the error of a failed load of key (and its message into buf) so
 * that a later ACQUIRE is refused at once without re-reading. */
int es_loader_failure(struct es_loader *l, uint64_t key, char *buf,
		      size_t len);

/* Stops and joins the threads (queued loads are dropped: their slots stay
 * LOADING, which the next owner discards), closes files, frees.  NULL ok. */
void es_loader_stop(struct es_loader *l);

/* ---- es_clients.c ---- */

/* Registers a client: a free table entry gets pid, its start time
 * (st_peer_check: the pair names one process) and name; returns its
 * client id (> 0) or -ST_E_LIMIT when the table is full. */
int es_clients_register(struct es_pool *p, int32_t pid, uint64_t start_ticks,
			const char *name, uint32_t *ret_id);

/* Table index of a valid client id (entry in use with that generation and,
 * when pid > 0, that pid) or -ST_E_NOTFOUND / -EPERM with diag. */
int es_clients_lookup(struct es_pool *p, uint32_t id, int32_t pid,
		      struct st_diag *diag);

/* Frees entry c: drops its pins, bumps its generation. */
void es_clients_unregister(struct es_pool *p, int c);

/* Opens the pidfd of entry c's process (after registering or adopting),
 * when the process with that pid is still the one registered (same start
 * time); otherwise the entry reads as dead. */
void es_clients_watch(struct es_pool *p, int c);

/* True while entry c's process lives (pidfd, else kill(pid, 0), not a
 * zombie, and started at the recorded start time). */
int es_clients_alive(struct es_pool *p, int c);

/* Unregisters every client whose pid is gone.  Returns how many. */
int es_clients_reap(struct es_pool *p);

/* Number of registered clients. */
uint32_t es_clients_count(const struct es_pool *p);

/* ---- es_budget.c, es_budget_value.c (--memory-budget) ---- */

struct st_ledger;
struct es_daemon;

/* Time constant of the decayed token rate (s). */
#define ES_BUDGET_RATE_TAU_S 10.0
/* How often the server loop obeys the target and reports (ms), and how
 * often the values are recomputed (they sort every expert). */
#define ES_BUDGET_TICK_MS 50
#define ES_BUDGET_VALUE_MS 500

/* Tokens per second, decayed: tok_w and time_w are the tokens and seconds
 * of the past, each weighted by exp(-age / ES_BUDGET_RATE_TAU_S). */
struct es_budget_rate {
	double tok_w, time_w;
	uint64_t last_tokens, last_ns;
};

/* The daemon's share of one host memory budget (st_ledger.h). */
struct es_budget {
	struct st_ledger *l;       /* NULL: no --memory-budget */
	uint64_t total;            /* --memory-budget, bytes */
	uint64_t floor, cap;       /* bytes: whole slots */
	uint64_t target;           /* the ledger's, last seen */
	uint64_t next_tick_ns, next_value_ns;
	double gain, loss;         /* last computed, ns/s per GiB */
	double miss_ns;            /* demand-miss cost they used */
	struct es_budget_rate tps;
	double *rate;              /* [n_layers * n_experts] scratch */
	uint8_t *resident;         /* [n_layers * n_experts] scratch */
	uint64_t shrink_evictions; /* experts evicted to meet a target */
	int release_warned;        /* MADV_REMOVE failure logged once */
};

/*
 * Pool geometry under --memory-budget mem_text (a byte size): slots for
 * the cap, min(M, every expert's record); *ret_floor the bytes of
 * --host-budget host_text (a size or share of all experts; NULL: one
 * layer's top-k records), *ret_cap the cap's bytes (whole slots both).
 * Errors with diag: -EINVAL (a value that does not parse), -ST_E_BUDGET
 * (M below top-k records), -ST_E_CONFIG (floor above the cap), the codes
 * of es_pool_geom_from_budget.
 */
int es_budget_geom(const struct st_store *s, uint64_t store_id,
		   const char *mem_text, const char *host_text,
		   struct es_pool_geom *ret, uint64_t *ret_floor,
		   uint64_t *ret_cap, struct st_diag *diag);

/* Slots a target of `target` bytes allows: target / record_bytes, at
 * least top_k (a token's layer must fit), at most n_slots. */
uint32_t es_budget_slots(uint64_t target, uint64_t record_bytes,
			 uint32_t top_k, uint32_t n_slots);

/*
 * Joins the instance's ledger as ST_LEDGER_EXPERTS (after es_pool_open,
 * before the loaders start) when --memory-budget was given, else does
 * nothing: applies the target (d->pool.allowed) and gives back the memory
 * of every EMPTY slot (an adopted pool's discarded ones).  0 or the codes
 * of st_ledger_open with diag.
 */
int es_budget_open(struct es_daemon *d, uint64_t total, uint64_t floor,
		   uint64_t cap, struct st_diag *diag);

/*
 * The server loop's periodic work under --memory-budget (every
 * ES_BUDGET_TICK_MS): runs the ledger (st_ledger_tick), applies the
 * target, evicts unpinned experts until the slots in use fit it (pin
 * protocol; pinned and LOADING slots are never touched; their memory
 * given back), and reports used, pinned, over, gain and loss.  Returns
 * the ms until it wants to run again (INT32_MAX without a budget).
 */
int es_budget_tick(struct es_daemon *d);

/* Leaves the ledger (a clean exit) and frees.  No-op without a budget. */
void es_budget_close(struct es_daemon *d);

/* Updates the decayed token rate with the statistics' token count at
 * now_ns (st_now_ns).  A count below the last one restarts it. */
void es_budget_rate_update(struct es_budget_rate *r, uint64_t tokens,
			   uint64_t now_ns);

/* Tokens per second: tok_w / time_w (0 before two samples). */
double es_budget_rate_tps(const struct es_budget_rate *r);

/* Activations per second of every expert, rate[l * n_experts + e]: its
 * decayed count over the decayed token window (es_actstats_rate) times
 * tps, the decayed tokens per second. */
void es_budget_rates(const struct es_actstats *st, double tps, double *rate);

/*
 * Marginal value of expert memory, in ns of stall per second of wall
 * time per GiB (st_ledger.h's unit), for step_bytes more and less:
 *
 *   gain = sum of rate[] of the experts ranked n_free .. n_free + s - 1
 *          by rate among those not resident (the n_free free slots take
 *          the first n_free anyway)
 *          x miss_ns / (step_bytes / 2^30)
 *   loss = sum of rate[] of the s - min(s, n_free) least active resident
 *          experts (the free slots are given up first, at no cost)
 *          x miss_ns / (step_bytes / 2^30)
 *
 * rate[i]: activations per second of expert i (es_budget.c: its decayed
 * count / the decayed token window x the decayed tokens per second);
 * resident[i]: 1 when its key holds a slot; s: slots step_bytes holds
 * (step_bytes / record_bytes, at least 1); miss_ns: the measured time of
 * one demand read.  An activation of an expert outside the pool is a
 * demand miss costing miss_ns of stall, so rate x miss_ns is ns of stall
 * per second.  0 or -ENOMEM.
 */
int es_budget_value(const double *rate, const uint8_t *resident, size_t n,
		    uint64_t n_free, uint64_t s, double miss_ns,
		    uint64_t step_bytes, double *ret_gain, double *ret_loss);

/* ---- es_server.c ---- */

struct es_daemon {
	struct es_opts opt;
	struct st_numa_policy numa;   /* resolved --numa (OFF: none) */
	struct st_store *store;
	uint64_t store_id;
	struct es_pool pool;
	struct es_loader *loader;
	struct st_sock rep, pub;
	char ctl_path[1100], evt_path[1100];
	int sig_fd;
	int lock_fd;                 /* st_shm_lock("expertd"), -1 before */
	int stop;                 /* set by SHUTDOWN or a stop signal */
	int keep_pool;            /* SHUTDOWN KEEP_POOL: leave the segment */
	uint64_t next_reap_ns;
	/* tiers (es_tiers.c) */
	struct es_actstats stats;
	char stats_path[1200];
	uint64_t next_save_ns, next_rank_ns;
	uint64_t rank_tokens;          /* stats.tokens at the last re-rank */
	struct es_evict_ctx ev;
	uint8_t *hot_key;              /* [n_layers * n_experts] */
	uint8_t *protect;              /* [n_slots] prefetched, not yet used */
	uint32_t *pending;             /* [ES_ROUTE_MAX_HINT] hinted keys' ix */
	uint64_t *pending_step;        /* [ES_ROUTE_MAX_HINT] 0: look-ahead
					* hint, else its hint_pos + 1 */
	uint32_t n_pending, pending_next;
	uint64_t cur_pos;              /* latest ROUTE: position and layer */
	uint32_t cur_layer;
	uint64_t route_ns;             /* time of the latest routing ROUTE */
	double pf_used, pf_wasted;     /* prefetches used / unused,
					* decayed per event (admit()) */
	struct es_engram *engram;      /* V4.1 Engram tier, NULL: none */
	struct st_ioq *ioq;            /* the instance's I/O queue (st_ioq.h),
					* NULL: none (I/O unarbitrated) */
	struct es_devpool *dev;        /* device expert pool (es_devpool.h),
					* NULL until computed exports one */
	struct es_budget budget;       /* --memory-budget (es_budget.c) */
};

/* ---- es_engram.c (DeepSeek-V4.1 stores: the Engram tier) ---- */

/* Starts the Engram tier when the store is a V4.1 store (else does
 * nothing): the row cache (--engram-cache bytes, default 256 MiB, counting
 * rows and their index), engram.bin opened (O_DIRECT unless
 * --no-direct-io), io_uring or pread, the "engram" segment created or
 * adopted, the engine thread.  0, -ST_E_BUDGET (cache too small, message
 * with the minimum), -EINVAL, -errno, shm errors; diag says what. */
int es_engram_start(struct es_daemon *d, struct st_diag *diag);

/* Stops the engine thread, frees; destroy also unlinks the segment. */
void es_engram_stop(struct es_daemon *d, int destroy);

/* Handles ES_MSG_ENGRAM_OPEN / ES_MSG_ENGRAM (server thread): validates,
 * queues the rows for the engine and appends the reply payload to w.
 * Never blocks on I/O.  0 or a negative code with diag. */
int es_engram_handle(struct es_daemon *d, const struct st_msg_header *h,
		     const uint8_t *p, struct st_wbuf *w, struct st_diag *diag);

/* ---- es_tiers.c ---- */

/* Sets up statistics (loaded from the state directory when present), the
 * hot set and the prefetcher.  0 or negative with diag. */
int es_tiers_init(struct es_daemon *d, struct st_diag *diag);

/* Loads the hot set's experts that are not resident (start-up warm-up and
 * after a re-rank); never evicts a pinned or loading slot. */
void es_tiers_warm(struct es_daemon *d);

/* Handles a decoded ROUTE: statistics, prefetch usage, new hints. */
void es_tiers_route(struct es_daemon *d, int client,
		    const struct es_route_req *req);

/* A slot of key was acquired by a client (used): prefetch accounting. */
void es_tiers_used(struct es_daemon *d, uint32_t slot);

/* Slot s is being evicted (its key leaves the pool). */
void es_tiers_evicting(struct es_daemon *d, uint32_t slot);

/* Periodic work of the server loop: start queued prefetches, re-rank the
 * hot set, save statistics.  Returns the ms until it wants to run again. */
int es_tiers_tick(struct es_daemon *d);

/* Saves the statistics (shutdown) and frees. */
void es_tiers_fini(struct es_daemon *d);

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
