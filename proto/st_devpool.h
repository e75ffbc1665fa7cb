/*
 * st_devpool.h — device pools (tier T0) shared by CUDA IPC (issue 10,
 * DESIGN.md sections 1, 3 and 6): the messages with which computed exports
 * its device expert-slot pool and device KV-page pool to expertd and kvd,
 * the leases that keep each side from freeing or rewriting device memory
 * the other may still read (PITFALLS P18), the importer's epoch handling,
 * and the device slot table that lives in shared memory.
 *
 * Roles.  computed (the *exporter*) cudaMallocs each pool, creates one
 * inter-process CUDA event per copy lane, and sends ST_MSG_DEV_EXPORT with
 * the cudaIpcMemHandle, the event handles and a fresh 64-bit *epoch* to
 * the daemon that fills the pool (expertd: expert slots; kvd: KV pages).
 * That daemon (the *importer*) opens the handles, registers its host pool
 * as pinned memory, and copies on its own stream; after each copy into
 * lane i it records event i, then publishes the slot READY in the device
 * slot table, so computed's stream waits on exactly that copy
 * (cudaStreamWaitEvent) and nothing else.
 *
 * Leases, the two directions (each side may be killed at any time):
 *   - importer -> exporter memory: an import is a lease on the exporter's
 *     allocation.  computed frees (or reuses) a pool only after every
 *     importer it offered that epoch has answered ST_MSG_DEV_REVOKE (its
 *     stream drained, its handles closed) or has died (its pid is gone, so
 *     its mappings are gone).  An offer without an answer counts as held:
 *     the importer may have opened the handles before the reply was lost.
 *     (struct st_devlease_table, exporter side.)
 *   - exporter reads -> importer writes: computed pins a device slot (the
 *     pin protocol of es_pool.h, on struct st_devslot) before its kernels
 *     read it and unpins only after its stream has passed those kernels;
 *     the importer never rewrites a pinned slot.
 *
 * Epochs.  An export epoch is chosen by the exporter per allocation
 * (st_devpool_epoch_new: 63 random bits, so no other allocation, of this
 * computed or a restarted one, gets the same) and names the allocation,
 * not the process.  An importer that receives another epoch for a kind, or
 * sees the exporter's pid die, drops its imported handles (after draining
 * its stream) before opening the new ones, and resets the device slot table
 * (all EMPTY, new generation), since the memory behind it is new
 * (struct st_devimport, importer side).
 *
 * Payloads (little-endian, fixed width; st_proto.h header):
 *   ST_MSG_DEV_EXPORT req: u32 pid, u32 kind, u64 epoch, char bus_id[32]
 *                          (PCI bus id of the device, NUL-padded, printable),
 *                          u64 pool_bytes, u64 slot_bytes, u32 n_slots,
 *                          u32 n_events, u8 mem_handle[64],
 *                          n_events x u8 event_handle[64]
 *                     rep: u64 epoch, u32 importer_pid, u32 handles_open,
 *                          u64 opened_total, u64 closed_total
 *   ST_MSG_DEV_REVOKE req: u32 pid, u32 kind, u64 epoch
 *                     rep: the same as EXPORT's reply (handles_open is 0
 *                          after a revoke of the epoch held; a revoke of
 *                          an epoch not held changes nothing: idempotent)
 * A receiver without CUDA answers both with -ST_E_UNSUPPORTED.
 */
#ifndef ST_DEVPOOL_H
#define ST_DEVPOOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "st_error.h"
#include "st_proto.h"

enum st_devpool_msg_type {
	ST_MSG_DEV_EXPORT = 0x0006,
	ST_MSG_DEV_REVOKE = 0x0007,
};

/* What a device pool holds (and so which daemon imports it). */
enum st_devpool_kind {
	ST_DEVPOOL_EXPERTS = 1, /* expert slots, imported by expertd */
	ST_DEVPOOL_KV = 2,      /* KV pages, imported by kvd */
};

#define ST_DEVPOOL_HANDLE_BYTES 64  /* sizeof(cudaIpc{Mem,Event}Handle_t) */
#define ST_DEVPOOL_BUSID_BYTES 32
/* Slots are 256-byte aligned in the pool (cudaMalloc's alignment, and
 * what the vectorised kernels want). */
#define ST_DEVPOOL_SLOT_ALIGN 256
/* Most events one export may carry (fits ST_MSG_MAX_BYTES many times). */
#define ST_DEVPOOL_MAX_EVENTS 8192
/* Events computed creates per pool (issue 27): slots share them as lanes
 * (slot % n_events), so a few suffice, and each is an inter-process event
 * the importer opens inside its EXPORT handler: thousands of them would
 * slow every export and press on per-process limits never exercised. */
#define ST_DEVPOOL_EVENT_LANES 128
#define ST_DEVPOOL_EXPORT_FIXED_BYTES (4 + 4 + 8 + ST_DEVPOOL_BUSID_BYTES + \
				       8 + 8 + 4 + 4 + ST_DEVPOOL_HANDLE_BYTES)
#define ST_DEVPOOL_REVOKE_BYTES (4 + 4 + 8)
#define ST_DEVPOOL_REP_BYTES (8 + 4 + 4 + 8 + 8)

/* An EXPORT request.  On decode, events points into the payload
 * (borrowed): n_events handles of ST_DEVPOOL_HANDLE_BYTES. */
struct st_devpool_export {
	uint32_t pid;
	uint32_t kind;
	uint64_t epoch;
	char bus_id[ST_DEVPOOL_BUSID_BYTES + 1];
	uint64_t pool_bytes;
	uint64_t slot_bytes;
	uint32_t n_slots;
	uint32_t n_events;
	uint8_t mem_handle[ST_DEVPOOL_HANDLE_BYTES];
	const uint8_t *events;
};

struct st_devpool_revoke {
	uint32_t pid;
	uint32_t kind;
	uint64_t epoch;
};

struct st_devpool_rep {
	uint64_t epoch;
	uint32_t importer_pid;
	uint32_t handles_open;   /* memory + event handles open now */
	uint64_t opened_total;   /* handles opened since the importer started */
	uint64_t closed_total;   /* and closed */
};

/* A fresh export epoch: st_random_id() (never 0), so no two allocations
 * share one, whatever the clock does (a realtime clock can step back). */
uint64_t st_devpool_epoch_new(void);

/* --- encoders: append the payload to w (errors sticky in w->err) --- */
/* events: e->n_events handles, contiguous. */
void st_devpool_export_encode(struct st_wbuf *w,
			      const struct st_devpool_export *e);
void st_devpool_revoke_encode(struct st_wbuf *w,
			      const struct st_devpool_revoke *r);
void st_devpool_rep_encode(struct st_wbuf *w, const struct st_devpool_rep *r);

/* --- decoders: 0 or -ST_E_PROTO with a message in diag --- */
/*
 * EXPORT: exact length (fixed part + 64 n_events), pid > 0, kind known,
 * epoch != 0, bus id printable and NUL-padded, slot_bytes > 0 and a
 * multiple of ST_DEVPOOL_SLOT_ALIGN, 1 <= n_slots, n_slots * slot_bytes <=
 * pool_bytes (no overflow), 1 <= n_events <= min(n_slots,
 * ST_DEVPOOL_MAX_EVENTS), the memory handle not all zero.
 */
int st_devpool_export_decode(const uint8_t *p, size_t len,
			     struct st_devpool_export *ret,
			     struct st_diag *diag);
/* REVOKE: exact length, pid > 0, kind known, epoch != 0. */
int st_devpool_revoke_decode(const uint8_t *p, size_t len,
			     struct st_devpool_revoke *ret,
			     struct st_diag *diag);
/* Reply: exact length, closed_total <= opened_total. */
int st_devpool_rep_decode(const uint8_t *p, size_t len,
			  struct st_devpool_rep *ret, struct st_diag *diag);

/* "experts" / "kv" / "?" */
const char *st_devpool_kind_name(uint32_t kind);

/* ------------------------------------------------------------------ */
/* Exporter side: leases held by importers on one exported allocation. */

#define ST_DEVLEASE_MAX 8

enum st_devlease_state {
	ST_DEVLEASE_FREE = 0,  /* table entry unused */
	ST_DEVLEASE_OFFERED,   /* EXPORT sent, no reply yet: counts as held */
	ST_DEVLEASE_HELD,      /* importer replied: it holds the handles */
	ST_DEVLEASE_RELEASED,  /* importer answered REVOKE: closed */
};

struct st_devlease {
	uint32_t state;
	int32_t pid;           /* importer pid (0 while OFFERED and unknown) */
	uint32_t kind;
	uint64_t epoch;
};

/* The exporter's view of who may still map its allocations (plain
 * memory; one per exporter, in its daemon struct). */
struct st_devlease_table {
	struct st_devlease e[ST_DEVLEASE_MAX];
};

/* Records that kind/epoch is being offered to an importer (before the
 * EXPORT is sent).  Returns the entry index, or -ST_E_LIMIT when the table
 * is full (every entry held). */
int st_devlease_offer(struct st_devlease_table *t, uint32_t kind,
		      uint64_t epoch);
/* The importer's reply to an offer arrived: entry idx is HELD by pid.
 * -EINVAL for a bad index or a reply for another epoch. */
int st_devlease_held(struct st_devlease_table *t, int idx, int32_t pid,
		     uint64_t epoch);
/* The importer answered REVOKE of kind/epoch (pid as replied): every
 * matching entry is RELEASED.  Returns how many entries changed. */
int st_devlease_released(struct st_devlease_table *t, uint32_t kind,
			 uint64_t epoch, int32_t pid);
/*
 * 1 when the allocation kind/epoch may be freed or reused: every entry of
 * it is RELEASED, or HELD by a pid that alive(pid, ctx) says is dead.  An
 * OFFERED entry (no reply, importer unknown) blocks it unless
 * forget_unanswered is set (the exporter has confirmed by other means that
 * the importer is gone, e.g. its pool segment's owner pid died).  Released
 * and dead entries are returned to FREE.  alive may be NULL (st_pid_alive).
 */
int st_devlease_may_free(struct st_devlease_table *t, uint32_t kind,
			 uint64_t epoch, int forget_unanswered,
			 int (*alive)(int32_t pid, void *ctx), void *ctx);
/* Entries of kind/epoch not yet FREE or RELEASED (for logs and tests). */
int st_devlease_count_held(const struct st_devlease_table *t, uint32_t kind,
			   uint64_t epoch);

/* ------------------------------------------------------------------ */
/* Importer side: what to do with an EXPORT, a REVOKE, a dead exporter.  */

enum st_devimport_action {
	ST_DEVIMPORT_KEEP = 0,        /* the same epoch again: nothing to do */
	ST_DEVIMPORT_OPEN = 1,        /* open the new handles */
	ST_DEVIMPORT_CLOSE = 2,       /* drain, close the old handles */
	ST_DEVIMPORT_CLOSE_OPEN = 3,  /* both, closing first */
};

/* One imported pool's bookkeeping (plain memory, in the importer's daemon
 * struct).  The handles themselves live with the CUDA code. */
struct st_devimport {
	uint32_t kind;
	int32_t exporter_pid;   /* 0: nothing imported */
	uint64_t epoch;         /* 0: nothing imported */
	uint32_t handles_open;
	uint64_t opened_total, closed_total;
	uint64_t imports, epoch_changes;
	uint64_t last_epoch;    /* the epoch last opened (kept after close) */
};

void st_devimport_init(struct st_devimport *s, uint32_t kind);
/* Decides what an EXPORT e means (e already validated; kind must match:
 * else -EINVAL).  Does not change s: call st_devimport_opened/closed as the
 * handles are opened and closed. */
int st_devimport_plan_export(const struct st_devimport *s,
			     const struct st_devpool_export *e);
/* What a REVOKE means: CLOSE when it names the epoch held, KEEP otherwise
 * (an old or unknown epoch: idempotent). */
int st_devimport_plan_revoke(const struct st_devimport *s,
			     const struct st_devpool_revoke *r);
/* CLOSE when an epoch is held and alive(exporter pid) says it is dead,
 * else KEEP.  alive may be NULL (st_pid_alive). */
int st_devimport_plan_peer(const struct st_devimport *s,
			   int (*alive)(int32_t pid, void *ctx), void *ctx);
/* n handles of epoch/pid were opened (the import is complete). */
void st_devimport_opened(struct st_devimport *s, int32_t pid, uint64_t epoch,
			 uint32_t n);
/* Every open handle was closed; nothing is imported any more. */
void st_devimport_closed(struct st_devimport *s);
/* The reply describing s. */
void st_devimport_rep(const struct st_devimport *s, uint32_t importer_pid,
		      struct st_devpool_rep *ret);

/* ------------------------------------------------------------------ */
/* The device slot table, in shared memory (importer-owned segment
 * /strata.<instance>.dev<kind>, after its st_shm header). */

enum st_devslot_state {
	ST_DEVSLOT_EMPTY = 0,
	ST_DEVSLOT_COPYING = 1, /* the importer is enqueuing the copy */
	ST_DEVSLOT_READY = 2,   /* copy enqueued and event recorded */
	ST_DEVSLOT_EVICTING = 3,
};

#define ST_DEVSLOT_TABLE_MAGIC 0x53564544u /* "DEVS" */
#define ST_DEVSLOT_TABLE_VERSION 2

struct st_devslot {
	_Atomic uint32_t state;
	_Atomic uint32_t pins;   /* exporter's pins (one reader: computed) */
	_Atomic uint64_t key;    /* importer's key (e.g. layer << 32 | expert) */
	_Atomic uint32_t gen;    /* bumped on every new key or reset */
	uint32_t event;          /* event lane recorded after the copy */
	/* KV pages (devkv table) only; 0 in the expert table: */
	_Atomic uint64_t bytes;  /* leading bytes of the page the device copy
				  * holds (importer, while COPYING; raised by
				  * the exporter's st_devslot_dirty_mark) */
	_Atomic uint64_t dirty;  /* device-written byte range not yet on the
				  * host: lo << 32 | hi, 0 = clean
				  * (st_devslot_dirty_*) */
	uint64_t reserved[3];
};

_Static_assert(sizeof(struct st_devslot) == 64, "st_devslot is 64 bytes");

/* Misses the exporter reports to the importer (a ring in the table). */
#define ST_DEVSLOT_WANT_RING 256

struct st_devslot_table {
	uint32_t magic, version;
	_Atomic uint64_t epoch;  /* the export epoch the slots belong to */
	uint32_t n_slots, n_events;
	uint64_t slot_bytes;
	/* want ring: keys the exporter found missing (st_devslot_want_push,
	 * computed alone writes want_head), the importer consumes them
	 * (st_devslot_want_pop, it alone writes want_tail): a miss asks for
	 * its own expert without a message, also when the host pool served
	 * it by the client's fast path */
	_Atomic uint32_t want_head, want_tail;
	uint64_t reserved[3];
	_Atomic uint64_t want_key[ST_DEVSLOT_WANT_RING];
	struct st_devslot slot[]; /* n_slots */
};

/* Device slot key of an expert (layer, expert): never 0 (0 = none). */
static inline uint64_t st_devkey(uint32_t layer, uint32_t expert)
{
	return (((uint64_t)layer << 32) | expert) + 1;
}

/*
 * Device slot key of a host KV page (kvd's devkv table): page id and the
 * page's allocation generation (kv_page_meta.generation), so a page freed
 * and allocated again (a spill, a restore into another page, a
 * copy-on-write) never matches its old device copy.  Never 0.
 */
static inline uint64_t st_devkv_key(uint32_t page, uint32_t generation)
{
	return (((uint64_t)generation << 32) | page) + 1;
}

/* The page id and generation of a devkv key (key != 0). */
static inline void st_devkv_key_split(uint64_t key, uint32_t *ret_page,
				      uint32_t *ret_gen)
{
	*ret_page = (uint32_t)(key - 1);
	*ret_gen = (uint32_t)((key - 1) >> 32);
}

/* Bytes of a table of n_slots slots. */
size_t st_devslot_table_bytes(uint32_t n_slots);
/*
 * (Re)initialises t for an export (all EMPTY, generations bumped when the
 * table was valid), epoch published last.  keep_pins: leave the pin
 * counts (an importer restarted under a live exporter, same epoch: the
 * exporter may hold pins and will drop them itself); else zero them (a new
 * epoch: the old exporter is gone, and the new one pins only after its
 * EXPORT was answered).  A slot that keeps pins stays EVICTING, never
 * claimable, until they drop to 0 (then st_devslot_claim takes it).
 */
void st_devslot_table_reset(struct st_devslot_table *t, uint64_t epoch,
			    uint32_t n_slots, uint32_t n_events,
			    uint64_t slot_bytes, int keep_pins);
/* Checks a table read from shared memory against bytes mapped: 0 or
 * -ST_E_BADMAGIC / -ST_E_VERSION / -ST_E_FORMAT with diag. */
int st_devslot_table_check(const struct st_devslot_table *t, size_t bytes,
			   struct st_diag *diag);

/*
 * Exporter (reader) pin: 1 and the slot pinned when it is READY with key
 * and the table is still at epoch (then *ret_event names the event lane to
 * wait on); else 0, not pinned.  The es_pool.h pin protocol: pin, then
 * read state, key, epoch (all seq_cst).
 */
int st_devslot_pin(struct st_devslot_table *t, uint32_t s, uint64_t key,
		   uint64_t epoch, uint32_t *ret_event);
/* Drops one pin taken by st_devslot_pin (after the reading stream has
 * passed the kernels that read the slot). */
void st_devslot_unpin(struct st_devslot_table *t, uint32_t s);
/*
 * Importer (writer): claims slot s for a new key.  EMPTY slots are claimed
 * directly; READY ones by CAS READY -> EVICTING, given up (READY again)
 * when any pin is held.  On success the slot is COPYING with the new key
 * and generation: 1.  0 when pinned or busy.
 */
int st_devslot_claim(struct st_devslot_table *t, uint32_t s, uint64_t key);
/* After the copy was enqueued and the event lane recorded: READY. */
void st_devslot_publish(struct st_devslot_table *t, uint32_t s,
			uint32_t event);
/* A claimed slot whose copy failed: EMPTY again. */
void st_devslot_abort(struct st_devslot_table *t, uint32_t s);

/*
 * Device-written KV rows (the devkv table).  The exporter, holding a pin
 * on slot s and after its stream has finished writing bytes [lo, hi) of
 * the device page (0 <= lo < hi <= 4 GiB), marks them dirty: the range is
 * merged into the slot's dirty range (one range: the union's hull) and the
 * slot's bytes raised to hi.  -EINVAL for an empty or out-of-range span.
 * The importer takes the range (st_devslot_dirty_take: the slot is clean
 * from then on) and copies it back to the host (D2H) before it reads the
 * host page (spill, copy-on-write, prefix publish), reuses the slot, or
 * refreshes it; rows marked while it copies make the slot dirty again
 * (the exporter writes before it marks), so it takes again until clean.
 * A copy that failed is marked again (st_devslot_dirty_mark).
 */
int st_devslot_dirty_mark(struct st_devslot_table *t, uint32_t s,
			  uint64_t lo, uint64_t hi);
/* Takes slot s's dirty range: 1 with *ret_lo, *ret_hi (the slot is clean
 * now), 0 when it was clean. */
int st_devslot_dirty_take(struct st_devslot_table *t, uint32_t s,
			  uint64_t *ret_lo, uint64_t *ret_hi);

/* Exporter (the one producer): reports key missing.  1 queued, 0 when the
 * ring is full (dropped: the importer is behind; the next miss asks
 * again). */
int st_devslot_want_push(struct st_devslot_table *t, uint64_t key);
/* Importer (the one consumer): the oldest reported key into *ret_key: 1,
 * or 0 when none.  The key comes from another process: validate it. */
int st_devslot_want_pop(struct st_devslot_table *t, uint64_t *ret_key);

#endif
