/*
 * es_client.h — the client side of expertd, linked into computed (and
 * tests).  It registers with expertd over nanomsg, attaches the host expert
 * pool segment (/strata.<instance>.experts) and gives the caller read-only
 * pointers to expert records that stay valid while pinned.
 *
 * Fast path (no message): look the (layer, expert) key up in the pool's
 * index, pin the slot with atomics, re-check key, state READY and the
 * slot's version; a hit.  Slow path: one ES_MSG_ACQUIRE for all missing
 * experts of the call, then wait for their slots to turn READY (expertd
 * pins them for this client before loading, so they cannot be evicted).
 * expertd never evicts a pinned or loading slot (PITFALLS P12).
 *
 * Threads: a handle may be used from several threads at once (requests on
 * its socket are serialized; waiting for loads is not).  Pins are counted
 * per handle: acquiring an expert twice needs two releases.
 * Restarts: if expertd is killed and restarted on the same instance and
 * store, it adopts the pool and this handle keeps working (its pins and
 * client id survive); while no expertd runs, calls that need it return
 * -ST_E_PEERGONE (experts already READY still hit on the fast path), or,
 * after es_client_set_restart_wait, wait for a restarted expertd: they
 * re-connect, say HELLO again asking to keep their client id (the protocol
 * version is checked again: a mismatch is refused with -ST_E_VERSION) and
 * retry.  If expertd comes back with another store or budget (a new
 * segment), close the handle and open a new one.
 */
#ifndef ES_CLIENT_H
#define ES_CLIENT_H

#include <stdint.h>

#include "st_error.h"

struct es_client;

/* Pool and traffic counters (from the pool header and expertd). */
struct es_stats {
	uint64_t n_slots;          /* records the host budget holds */
	uint64_t slots_used;       /* slots not EMPTY */
	uint64_t record_bytes;
	uint64_t pool_bytes;       /* whole segment size */
	uint64_t budget_bytes;     /* --host-budget as resolved */
	uint64_t hits;             /* acquires served from a READY slot */
	uint64_t misses;           /* acquires that needed a load */
	uint64_t evictions;
	uint64_t loads;            /* records read from the store */
	uint64_t load_bytes;
	uint64_t load_ns;          /* time spent reading + verifying */
	uint64_t checksum_failures;
	uint64_t epoch;
	int32_t pid;               /* expertd's pid */
	uint32_t n_clients;
};

/*
 * Connects to expertd of the instance whose run directory is run_dir,
 * registers as `name` (HELLO), attaches the pool.  timeout_ms bounds every
 * request.  *ret owned by the caller (es_client_close).
 * Errors: -ST_E_PEERGONE (no expertd answering), -ST_E_VERSION, shm errors.
 */
int es_client_open(const char *run_dir, const char *instance, const char *name,
		   int timeout_ms, struct es_client **ret, struct st_diag *diag);

/* Releases every pin, says BYE, detaches.  NULL is fine. */
void es_client_close(struct es_client *c);

/* Geometry of the pool's store. */
int es_client_n_layers(const struct es_client *c);
int es_client_n_experts(const struct es_client *c);
uint64_t es_client_record_bytes(const struct es_client *c);
/* XXH3 of the store's manifest.json: identifies the model the pool holds. */
uint64_t es_client_store_id(const struct es_client *c);
/* Number of slots (records the budget holds). */
int es_client_n_slots(const struct es_client *c);
/* The model's top-k (experts per token of one layer). */
int es_client_top_k(const struct es_client *c);
/* This handle's client id (index in the pool's client table in the low 8
 * bits, generation above). */
uint32_t es_client_id(const struct es_client *c);

/*
 * Pins experts[0..n) of `layer` (distinct ids, n <= es_client_n_slots)
 * and returns a pointer to each record (record_bytes bytes, layout in
 * st_store.h) in ret_records[i].  Blocks until all are READY, at most the
 * handle's timeout_ms.  The pointers stay valid until es_client_release of
 * the same experts.  On any error nothing of this call stays pinned.
 * Errors: -EINVAL (layer/expert out of range, repeated id, n out of
 * [1, n_slots]), -ST_E_BUSY (not enough unpinned slots right now: retry
 * after releasing), -ST_E_CHECKSUM (the record on disk is corrupt; every
 * later acquire of it fails at once until expertd restarts), -ST_E_PEERGONE,
 * -ST_E_TIMEOUT; diag says which expert.
 */
int es_client_acquire(struct es_client *c, int layer, int n,
		      const int *experts, const uint8_t **ret_records,
		      struct st_diag *diag);

/* Hand-over function of es_client_acquire_each: i is the index into the
 * caller's experts[] and record its bytes (valid until release), or i =
 * -1 and record NULL once: the misses are loading (or all were hits). */
typedef void (*es_acquire_fn)(void *arg, int i, const uint8_t *record);

/*
 * es_client_acquire that hands each expert over as soon as ITS slot is
 * READY instead of after all n: fn(arg, i, record) for the resident ones
 * first, then fn(arg, -1, NULL) once after the misses' ACQUIRE is sent
 * (work that needs no expert overlaps their reads), then each miss as its
 * load completes; fn runs on the calling thread, one call at a time.  On
 * return 0 every expert was handed over exactly once and is pinned:
 * es_client_release them as usual.  Errors as es_client_acquire (some
 * experts may have been handed over before the error; none stays pinned).
 * After a restarted expertd (set_restart_wait) only the experts not yet
 * handed over are asked for again; those handed over are then no longer
 * pinned (their use was over when fn returned).
 */
int es_client_acquire_each(struct es_client *c, int layer, int n,
			   const int *experts, es_acquire_fn fn, void *arg,
			   struct st_diag *diag);

/*
 * wait_ms > 0: a call that finds expertd dead (es_client_acquire,
 * es_client_stats) waits up to wait_ms for a restarted expertd that
 * adopted the pool, re-registers under the same client id (its pins kept),
 * and retries.  Waiting longer ends in -ST_E_PEERGONE with "expertd did not
 * come back within N s; restart it with `strata restart expertd`"; a
 * restarted expertd of another protocol version gives -ST_E_VERSION, one
 * serving another pool -ST_E_STALE.  0 (the default): -ST_E_PEERGONE at
 * once.  Set it before sharing the handle between threads.
 */
void es_client_set_restart_wait(struct es_client *c, int wait_ms);

/*
 * Ends the restart wait: a call waiting for a restarted expertd (and any
 * later one) fails with -ST_E_PEERGONE ("expertd is gone and this process
 * is stopping") at its next check (within 50 ms).  Safe from any thread
 * while another waits (no lock taken); for a process that is stopping
 * (computed on SIGTERM or SHUTDOWN), so it does not wait out the restart
 * wait first.  c may be NULL.
 */
void es_client_abort_wait(struct es_client *c);

/* Times this handle re-connected to a restarted expertd. */
uint32_t es_client_reconnects(const struct es_client *c);

/* Unpins experts acquired with es_client_acquire. */
void es_client_release(struct es_client *c, int layer, int n,
		       const int *experts);

/* Reads counters.  0 or a negative code. */
int es_client_stats(struct es_client *c, struct es_stats *ret);

/* Tier counters read from the pool segment (no message): they live in the
 * pool header and survive expertd restarts that adopt the segment. */
struct es_tier_stats {
	uint64_t prefetch_loads;   /* loads started by a hint */
	uint64_t prefetch_used;    /* of those, used before eviction */
	uint64_t prefetch_wasted;  /* of those, passed over by their layer's
				    * routing or evicted unused */
	uint64_t hints;            /* hinted (layer, expert) entries */
	uint64_t hints_dropped;    /* stale or superseded (both kinds) */
	uint64_t step_hints;       /* step-named hinted entries (not in
				    * hints): es_client_hint_step */
	uint64_t routed;           /* routing choices reported */
	uint64_t rereads;          /* records read twice (checksum) */
	uint64_t hot_slots;        /* hot set size (experts) */
	uint64_t direct_io;        /* 1: reads bypass the page cache */
	uint64_t io_busy_ns;       /* wall time with a read in flight */
	uint64_t hits, misses, evictions, loads, load_bytes, load_ns;
	uint64_t checksum_failures;
	/* the loader threads' own cost (issue 25): CPU time (ns) and page
	 * faults taken in loads, wall ns verifying checksums (in load_ns) */
	uint64_t loader_cpu_ns, checksum_ns, loader_minflt, loader_majflt;
};

/* Fills *ret from the mapped pool header.  Never fails. */
void es_client_tier_stats(struct es_client *c, struct es_tier_stats *ret);

/* Where this handle's time went (monotonic over its life, all threads;
 * ns of CLOCK_MONOTONIC; the step timeline of issue 25). */
struct es_client_timing {
	uint64_t rpcs;             /* request/reply round trips, all kinds */
	uint64_t rpc_ns;           /* their time, from send to reply */
	uint64_t acquire_rpc_ns;   /* of rpc_ns: ACQUIREs of misses (also in
				    * the waits below) */
	uint64_t wait_demand_ns;   /* acquires that had to ask for an expert
				    * with no slot: the whole wait, the
				    * ACQUIRE round trip included, less the
				    * caller's work during it (acquire_each) */
	uint64_t wait_inflight_ns; /* acquires whose missing experts all had
				    * a slot already (a load in flight, e.g.
				    * a prefetch not ready yet) */
	uint64_t waits_demand, waits_inflight; /* acquires of each kind */
};

/* Copies the handle's timing counters into *ret.  Never fails. */
void es_client_timing(const struct es_client *c, struct es_client_timing *ret);

/* The pid of the expertd that owns the mapped pool (its header), 0 when
 * c is NULL or not attached. */
int32_t es_client_owner_pid(const struct es_client *c);

/*
 * Reports the routing of `layer` for tokens pos .. pos+n_tokens-1
 * (experts[n_tokens * k]) and hints the experts the gate look-ahead
 * expects next (n_hint pairs hint_layer[i], hint_expert[i], nearest layer
 * first) in one ES_MSG_ROUTE.  expertd updates its activation statistics
 * and prefetches.  0 or a negative code (-ST_E_PEERGONE, -ST_E_PROTO ...).
 */
int es_client_route(struct es_client *c, int layer, uint32_t pos,
		    int n_tokens, int k, const int *experts, int n_hint,
		    const int *hint_layer, const int *hint_expert,
		    struct st_diag *diag);

/*
 * Step-named prefetch hint: the experts (n_hint pairs hint_layer[i],
 * hint_expert[i], nearest first) that the token at position pos will use,
 * known exactly before it is evaluated (e.g. a DeepSeek-V4 hash-routed
 * layer's experts, from the token id as soon as it is sampled).  One hint-
 * only ES_MSG_ROUTE with hint_pos = pos: expertd keeps these hints across
 * later routing reports until the client reaches that position and layer,
 * instead of dropping them as stale (es_tiers.c).  0 or a negative code.
 */
int es_client_hint_step(struct es_client *c, uint32_t pos, int n_hint,
			const int *hint_layer, const int *hint_expert,
			struct st_diag *diag);

/* ---- Engram tier (DeepSeek-V4.1 stores; es_client_engram.c) ---- */

#define ES_ENGRAM_INFO_MAX_LAYERS 16

/* The Engram tables expertd serves and its cache. */
struct es_engram_info {
	int n_layers;                          /* Engram layers */
	int layer_id[ES_ENGRAM_INFO_MAX_LAYERS]; /* model layer of each */
	int dim[ES_ENGRAM_INFO_MAX_LAYERS];      /* floats per row */
	int64_t rows[ES_ENGRAM_INFO_MAX_LAYERS]; /* table rows */
	uint32_t row_bytes[ES_ENGRAM_INFO_MAX_LAYERS]; /* stored bytes per row */
	int max_rows;                          /* rows per FETCH message */
	uint64_t cache_rows, cache_bytes;      /* expertd's row cache */
	int io_uring;                          /* 1: io_uring, 0: pread */
	int direct;                            /* 1: O_DIRECT */
};

/* Counters of the Engram tier (from its segment; no message). */
struct es_engram_stats {
	uint64_t lookups;      /* rows asked for, FETCH and PREFETCH */
	uint64_t hits;         /* served from the cache */
	uint64_t merged;       /* joined a read already in flight */
	uint64_t misses;       /* needed a read */
	uint64_t prefetch_rows;
	uint64_t reads;        /* 4 KiB block reads done */
	uint64_t read_bytes;
	uint64_t read_errors, rereads, evictions;
	uint64_t cache_used;   /* rows held now */
	uint64_t lat_p50_ns, lat_p99_ns; /* block read latency (+-6 %) */
	uint64_t lat_hist[256]; /* es_engram_proto.h buckets */
};

/*
 * Attaches the Engram tier of expertd (first use does ENGRAM_OPEN and maps
 * the "engram" segment) and describes it.  Errors: -ST_E_UNSUPPORTED (the
 * store has no Engram tables), -ST_E_PEERGONE, shm errors; diag says what.
 */
int es_client_engram_info(struct es_client *c, struct es_engram_info *ret,
			  struct st_diag *diag);

/*
 * Fills out[n][dim] with rows row_ids[0..n) of Engram layer index li
 * (0 .. n_layers-1; table-local ids, the hash's offsets added),
 * dequantized: e4m3 * 2^(e8m0 - 127) per 32 columns, exactly.  Any n >= 1
 * (split into FETCHes of max_rows).  Blocks until expertd has delivered
 * them (read from the cache or the store), at most the handle's time-out
 * per FETCH.  One call at a time per handle is served (calls from several
 * threads are serialized).  Errors: -EINVAL (li, n or an id out of range),
 * -ST_E_CHECKSUM (a damaged engram.bin block; message says re-run strata
 * convert), -ST_E_TIMEOUT, -ST_E_PEERGONE, -ST_E_UNSUPPORTED.
 */
int es_client_engram_fetch(struct es_client *c, int li, int n,
			   const int64_t *row_ids, float *out,
			   struct st_diag *diag);

/* As es_client_engram_fetch, but the stored bytes (row_bytes[li] each:
 * dim E4M3 bytes then dim/32 E8M0 bytes) into out. */
int es_client_engram_fetch_raw(struct es_client *c, int li, int n,
			       const int64_t *row_ids, uint8_t *out,
			       struct st_diag *diag);

/* Asks expertd to read rows row_ids[0..n) of li into its cache ahead of
 * a FETCH (the hash depends only on the token ids: send them as soon as
 * the token is known).  Returns at once.  0 or a negative code. */
int es_client_engram_prefetch(struct es_client *c, int li, int n,
			      const int64_t *row_ids, struct st_diag *diag);

/* Reads the Engram tier's counters.  0 or as es_client_engram_info. */
int es_client_engram_stats(struct es_client *c, struct es_engram_stats *ret,
			   struct st_diag *diag);

/* Asks expertd to exit cleanly.  0 or a negative code. */
int es_client_shutdown(struct es_client *c);

#endif
