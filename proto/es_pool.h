/*
 * es_pool.h — layout of expertd's host expert pool, the shared-memory
 * segment /strata.<instance>.experts (DESIGN.md section 3).
 *
 * The segment, all offsets from its start, every region 64-byte aligned:
 *
 *   0                      struct st_shm_header (256 bytes, st_shm.h)
 *   ES_POOL_HEADER_OFFSET  struct es_pool_header (geometry, store id, counters)
 *   clients_offset         struct es_pool_client[ES_MAX_CLIENTS]
 *   index_offset           _Atomic int32_t slot_of[n_layers * n_experts]
 *                          (slot holding (layer, expert), -1 = not resident)
 *   slots_offset           struct es_slot[n_slots]
 *   data_offset            n_slots records of record_bytes; slot i's record at
 *                          data_offset + i * record_bytes; 2 MiB aligned
 *                          when at least 64 MiB, else 4 KiB (st_shm.h)
 *
 * The segment is sized exactly from the geometry (es_pool_layout_compute),
 * so its size is n_slots * record_bytes plus the tables rounded to 2 MiB.
 * Readers (es_client.c) map it with es_pool_view_init(), which re-computes
 * the layout from the geometry in the header and refuses any mismatch.
 *
 * Who writes what:
 *   - expertd's server thread: slot keys, the index, slot state transitions
 *     EMPTY -> LOADING, READY <-> EVICTING, FAILED/EMPTY reclaim; client
 *     table entries; pins on a client's behalf (in ES_MSG_ACQUIRE).
 *   - expertd's loader threads: record bytes of a LOADING slot, then
 *     LOADING -> READY or FAILED.
 *   - a client c: only pins[c] of any slot (fast-path pin/unpin), the
 *     last_use_ns of a slot it hits, and the hit counter.
 *
 * PIN PROTOCOL (PITFALLS P12).  All accesses to `state` and `pins` are
 * sequentially consistent.
 *   client pin:   pins[c] += 1;  s = state;  k = key;
 *                 hit iff s == READY && k == wanted key; else pins[c] -= 1.
 *   evictor:      CAS state READY -> EVICTING;  sum = sum of pins[*];
 *                 if sum != 0: state = READY (give up); else the slot is ours.
 * Invariant: a slot whose pins sum is non-zero, or whose state is LOADING,
 * is never given a new key and its record bytes are never written.
 * Why: in the single total order of seq_cst operations either the client's
 * pin increment comes before the evictor's read of that pin (the evictor sees
 * it and restores READY), or the evictor's CAS comes before the client's
 * state read (the client sees EVICTING, LOADING, or a later READY whose key
 * was stored before that READY, hence a different key, and unpins).  The key
 * is read after the state for this reason.  LOADING slots are never CASed
 * (the CAS only accepts READY), so a load in flight is never stolen.
 * A client never reads a LOADING slot: it only uses a slot after seeing
 * READY, which the loader publishes after the bytes are written.
 *
 * Pins are leases: pins[c] belongs to client table entry c.  It is raised by
 * client c itself or by expertd on c's behalf (the ACQUIRE reply names the
 * slot), lowered only by client c, and zeroed by expertd only when c said
 * BYE or its pid died (an entry is reused only with a new generation), or
 * when an expertd adopting the segment after a crash discards a half-done
 * (LOADING or FAILED) slot: no client has read such a slot, and a client
 * waiting on it sees the generation change and forgets its pin.
 *
 * Slot identity: `gen` is bumped each time a slot is given a new key or
 * discarded, so (slot, gen) is a handle that detects reuse.  `version` is a
 * seqlock over (key, state, gen): odd while the server changes them together,
 * and +2 after each single-field state change, so a reader can take a
 * consistent snapshot (es_slot_snapshot).
 */
#ifndef ES_POOL_H
#define ES_POOL_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_shm.h"

#define ES_POOL_KIND "experts"
#define ES_POOL_LAYOUT_VERSION 2 /* 2: pool_id, client start time */
#define ES_POOL_MAGIC 0x4c4f4f5053455f31ULL /* "1_ESPOOL" */
#define ES_MAX_CLIENTS 32
#define ES_CLIENT_NAME_BYTES 32
#define ES_POOL_HEADER_OFFSET ST_SHM_HEADER_BYTES
#define ES_POOL_HEADER_BYTES 768
#define ES_POOL_TABLE_ALIGN 64u
#define ES_KEY_NONE UINT64_MAX

/* Slot states. */
enum es_slot_state {
	ES_SLOT_EMPTY = 0,    /* no key; free if its pins sum to 0 */
	ES_SLOT_LOADING = 1,  /* key set, loader writing the record */
	ES_SLOT_READY = 2,    /* record valid, pinnable */
	ES_SLOT_EVICTING = 3, /* evictor checking pins (transient) */
	ES_SLOT_FAILED = 4,   /* load failed (error), key kept for waiters */
};

/* Counters of the pool (monotonic over the segment's life, restarts
 * included).  Times in ns. */
struct es_pool_counters {
	_Atomic uint64_t hits;
	_Atomic uint64_t misses;
	_Atomic uint64_t evictions;
	_Atomic uint64_t loads;
	_Atomic uint64_t load_bytes;
	_Atomic uint64_t load_ns;
	_Atomic uint64_t checksum_failures;
	/* tiers (expertd's server thread and loaders) */
	_Atomic uint64_t prefetch_loads;   /* loads started by a hint */
	_Atomic uint64_t prefetch_used;    /* of those, used before eviction */
	_Atomic uint64_t prefetch_wasted;  /* of those, not used by the routing
					    * of their layer, or evicted unused */
	_Atomic uint64_t hints;            /* hinted (layer, expert) entries */
	_Atomic uint64_t hints_dropped;    /* stale or superseded, not loaded */
	_Atomic uint64_t routed;           /* (token, layer, expert) choices
					    * reported by clients */
	_Atomic uint64_t rereads;          /* checksum failures re-read */
	_Atomic uint64_t hot_slots;        /* gauge: slots of the hot set */
	_Atomic uint64_t direct_io;        /* gauge: 1 when reads bypass the
					    * page cache (O_DIRECT) */
	_Atomic uint64_t io_busy_ns;       /* wall time with >= 1 read in
					    * flight: load_bytes / io_busy_ns
					    * is the tier's read bandwidth */
	_Atomic uint64_t step_hints;       /* step-named hinted entries (ROUTE
					    * with hint_pos; not in hints) */
	/* the loader threads' own cost (step timeline, issue 25) */
	_Atomic uint64_t loader_cpu_ns;    /* CPU time of the loader threads
					    * in loads (CLOCK_THREAD_CPUTIME_ID:
					    * what they take from compute) */
	_Atomic uint64_t checksum_ns;      /* wall time verifying records
					    * (XXH3), part of load_ns */
	_Atomic uint64_t loader_minflt;    /* page faults the loader threads
					    * took in loads (RUSAGE_THREAD) */
	_Atomic uint64_t loader_majflt;
};

struct es_pool_header {
	uint64_t magic;             /* ES_POOL_MAGIC */
	uint32_t n_layers;
	uint32_t n_experts;
	uint32_t n_slots;
	uint32_t top_k;
	uint64_t record_bytes;      /* multiple of 4096 */
	uint64_t store_id;          /* XXH3-64 of the store's manifest.json */
	uint64_t budget_bytes;      /* n_slots * record_bytes */
	uint64_t clients_offset;
	uint64_t index_offset;
	uint64_t slots_offset;
	uint64_t data_offset;
	uint64_t data_bytes;        /* n_slots * record_bytes */
	uint32_t max_clients;       /* ES_MAX_CLIENTS */
	uint32_t slot_bytes;        /* sizeof(struct es_slot) */
	uint8_t pad0[32];
	struct es_pool_counters c;  /* at offset 128 */
	uint8_t pad1[ES_POOL_HEADER_BYTES - 128 -
		     sizeof(struct es_pool_counters)];
};

_Static_assert(sizeof(struct es_pool_header) == ES_POOL_HEADER_BYTES,
	       "pool header size is part of the layout");
_Static_assert(offsetof(struct es_pool_header, c) == 128,
	       "counters start at offset 128 of the pool header");

/* One registered client.  pid 0 = free entry. */
struct es_pool_client {
	_Atomic int32_t pid;
	_Atomic uint32_t generation;        /* bumped when the entry is freed */
	_Atomic uint64_t last_request_id;   /* last ACQUIRE applied (replay) */
	uint64_t registered_ns;             /* CLOCK_MONOTONIC of expertd */
	char name[ES_CLIENT_NAME_BYTES];
	uint64_t start_ticks;               /* of pid (st_pid_start_ticks):
					     * a reused pid is not this client */
};

_Static_assert(sizeof(struct es_pool_client) == 64, "client entry size");

struct es_slot {
	_Atomic uint64_t key;          /* es_key(layer, expert) or ES_KEY_NONE */
	_Atomic uint32_t state;        /* enum es_slot_state */
	_Atomic uint32_t version;      /* seqlock, see top of file */
	_Atomic uint32_t gen;          /* bumped on every new key / discard */
	_Atomic int32_t error;         /* FAILED: negative st_error code */
	_Atomic uint64_t last_use_ns;  /* CLOCK_MONOTONIC of the last pin */
	_Atomic uint32_t pins[ES_MAX_CLIENTS];
	uint8_t pad[192 - 32 - 4 * ES_MAX_CLIENTS];
};

_Static_assert(sizeof(struct es_slot) == 192, "slot entry size");

/* Sizes and offsets of a pool, from its geometry. */
struct es_pool_layout {
	uint64_t clients_offset;
	uint64_t index_offset;
	uint64_t slots_offset;
	uint64_t data_offset;
	uint64_t data_bytes;
	uint64_t total_bytes;  /* rounded up by st_shm_round like st_shm_create */
	uint64_t layout_hash;  /* for st_shm_header.layout_hash */
};

/* Geometry of a pool. */
struct es_pool_geom {
	uint32_t n_layers, n_experts, n_slots, top_k;
	uint64_t record_bytes;
	uint64_t store_id;
};

/* Pointers into a mapped pool (borrowed from the mapping). */
struct es_pool_view {
	struct st_shm_header *shm;
	struct es_pool_header *hdr;
	struct es_pool_client *clients;  /* [ES_MAX_CLIENTS] */
	_Atomic int32_t *slot_of;        /* [n_layers * n_experts] */
	struct es_slot *slots;           /* [n_slots] */
	uint8_t *data;
	uint32_t n_layers, n_experts, n_slots;
	uint64_t record_bytes;
};

/*
 * Computes the layout of a pool with geometry g.  Returns 0, or -EINVAL
 * when the geometry is impossible (zero sizes, record_bytes not a multiple
 * of 4096, n_slots above n_layers * n_experts, sizes overflowing).
 */
int es_pool_layout_compute(const struct es_pool_geom *g,
			   struct es_pool_layout *ret);

/*
 * Fills the pool header of a fresh segment (base, size bytes) with geometry
 * g and layout l, marks every slot EMPTY and every index entry -1.  The
 * segment must be zero-filled.  Returns 0 or -EINVAL.
 */
int es_pool_format(void *base, size_t size, const struct es_pool_geom *g,
		   const struct es_pool_layout *l);

/*
 * Validates the pool header of a mapped segment (base, size bytes; the
 * st_shm header already validated by st_shm_attach) and fills *ret with
 * pointers into it.  The layout is re-computed from the header's geometry
 * and must match exactly; store_id must equal expect_store_id unless that
 * is 0.  Errors: -ST_E_BADMAGIC (no pool magic), -ST_E_FORMAT (inconsistent
 * geometry or offsets), -ST_E_STALE (store id differs), message in diag.
 */
int es_pool_view_init(void *base, size_t size, uint64_t expect_store_id,
		      struct es_pool_view *ret, struct st_diag *diag);

/* (layer, expert) -> key. */
static inline uint64_t es_key(uint32_t layer, uint32_t expert)
{
	return ((uint64_t)layer << 32) | expert;
}

static inline uint32_t es_key_layer(uint64_t key) { return (uint32_t)(key >> 32); }
static inline uint32_t es_key_expert(uint64_t key) { return (uint32_t)key; }

/* Index position of (layer, expert); the caller checks the ranges. */
static inline size_t es_pool_index(const struct es_pool_view *v,
				   uint32_t layer, uint32_t expert)
{
	return (size_t)layer * v->n_experts + expert;
}

/* Record of slot s (record_bytes bytes). */
static inline uint8_t *es_pool_record(const struct es_pool_view *v,
				      uint32_t s)
{
	return v->data + (size_t)s * v->record_bytes;
}

/* Slot holding index entry ix, or -1: not resident, or a value outside
 * [0, n_slots) (slot_of lies in a segment clients map writable: it is
 * input, never an index as it stands). */
static inline int32_t es_pool_slot_of(const struct es_pool_view *v,
				      size_t ix)
{
	int32_t s = atomic_load(&v->slot_of[ix]);

	return s >= 0 && (uint32_t)s < v->n_slots ? s : -1;
}

/*
 * Drops one pin of *pin unless it is 0 already (CAS loop): an expertd that
 * adopted the segment may have zeroed it meanwhile (it discarded the slot,
 * see "Pins are leases"), and a blind decrement would wrap it to
 * 0xffffffff, a pin that never goes away.  1 when a pin was dropped.
 */
static inline int es_pin_drop(_Atomic uint32_t *pin)
{
	uint32_t cur = atomic_load(pin);

	while (cur > 0)
		if (atomic_compare_exchange_weak(pin, &cur, cur - 1))
			return 1;
	return 0;
}

/* Sum of the pins of slot s over all clients (seq_cst loads). */
static inline uint64_t es_slot_pin_sum(struct es_slot *sl)
{
	uint64_t sum = 0;

	for (int c = 0; c < ES_MAX_CLIENTS; c++)
		sum += atomic_load(&sl->pins[c]);
	return sum;
}

/*
 * Fast-path pin by client c of the slot holding `key` (PIN PROTOCOL above).
 * Returns the slot index (>= 0) with one pin of client c taken, or -1 on a
 * miss (nothing pinned).  *ret_gen receives the slot's generation.
 */
static inline int32_t es_pool_try_pin(const struct es_pool_view *v, int c,
				      uint32_t layer, uint32_t expert,
				      uint32_t *ret_gen)
{
	uint64_t key = es_key(layer, expert);
	int32_t s = es_pool_slot_of(v, es_pool_index(v, layer, expert));
	struct es_slot *sl;

	if (s < 0)
		return -1;
	sl = &v->slots[s];
	atomic_fetch_add(&sl->pins[c], 1);
	if (atomic_load(&sl->state) == ES_SLOT_READY &&
	    atomic_load(&sl->key) == key) {
		*ret_gen = atomic_load(&sl->gen);
		return s;
	}
	es_pin_drop(&sl->pins[c]);
	return -1;
}

/* Seqlock reads of es_slot_snapshot before it gives up. */
#define ES_SNAPSHOT_TRIES 100000

/* A consistent snapshot of a slot's key, state and generation (seqlock
 * read).  Retries while the server is changing them (a few instructions),
 * at most ES_SNAPSHOT_TRIES times: a version left odd by an expertd killed
 * mid-change stays odd until the next expertd adopts the segment, so an
 * unbounded spin would hang the reader.  0, or -EAGAIN (nothing read:
 * ask again later; the caller's time-out and liveness checks decide). */
static inline int es_slot_snapshot(struct es_slot *sl, uint64_t *ret_key,
				   uint32_t *ret_state, uint32_t *ret_gen)
{
	for (int i = 0; i < ES_SNAPSHOT_TRIES; i++) {
		uint32_t v1 = atomic_load(&sl->version);

		if (v1 & 1)
			continue;
		*ret_key = atomic_load(&sl->key);
		*ret_state = atomic_load(&sl->state);
		*ret_gen = atomic_load(&sl->gen);
		if (atomic_load(&sl->version) == v1)
			return 0;
	}
	return -EAGAIN;
}

#endif
