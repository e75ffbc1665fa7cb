/*
 * st_ioq.h — one I/O queue with priorities for the NVMe tier, shared by
 * expertd (expert records, Engram rows) and kvd (KV spill and restore)
 * (DESIGN.md section "One I/O queue", issue 24 item 3).
 *
 * Classes, most urgent first: ST_IOQ_DEMAND (an expert or Engram row a
 * step waits for), ST_IOQ_KV_RESTORE (KV pages brought back: ahead of the
 * next step, or on a pin), ST_IOQ_PREFETCH (experts or Engram rows read
 * ahead of use), ST_IOQ_KV_SPILL (KV pages written out).
 *
 * Mechanism: a small POSIX shared-memory segment per instance,
 * "/strata.<instance>.ioq" (st_shm.h conventions: 0600, validated
 * header), with one slot per process (pid and its start time, so a
 * reused pid is not taken for the old process) holding per-class gauges
 * (waiting, in flight) and totals (I/Os, bytes, ns waited, ns of I/O) in
 * C11 atomics.  Before an I/O of class c > DEMAND, st_ioq_begin defers
 * while the classes above c have more than `depth` I/Os waiting or in
 * flight, summed over the live slots of every process (this one's other
 * threads included), polling every ST_IOQ_POLL_NS, but never longer than
 * `bound` ns per I/O: then it goes anyway (counted in bound_hits).
 *
 * Failure cases: a slot of a process that died (kill -9 mid-I/O leaves
 * its gauges up) is ignored by the arbiter once its pid is gone or is
 * another process's (pid + start ticks, checked at most every
 * ST_IOQ_LIVE_CHECK_NS per slot), and is taken over by the next process
 * that opens the queue, its totals moved into the segment's `retired`
 * totals first, so per-class totals never go down.  Until then the bound
 * caps what it can cost.  A segment that cannot be opened or made (another
 * user's, another layout held by a live process) leaves the daemon
 * without a queue (handle NULL: every call below is a no-op, I/O runs
 * unarbitrated); I/O never fails because of the queue.
 *
 * Switch: STRATA_IOQ=off in a daemon's environment turns its deferral off
 * (counting stays), for comparisons; STRATA_IOQ_BOUND_US (default 2000)
 * and STRATA_IOQ_DEPTH (default 0) set the bound and depth.  A value that
 * is none of these (STRATA_IOQ=bogus, STRATA_IOQ_BOUND_US=abc, -5 or above
 * the cap) is a warning naming the variable, its value and the default
 * used, as for STRATA_LOG: the daemon keeps its queue.  Each slot records
 * whether its process orders (flags), so that strata status and the run
 * summary can say "priorities off" (st_ioq_mode).
 */
#ifndef ST_IOQ_H
#define ST_IOQ_H

#include <stdatomic.h>
#include <stdint.h>

#include "st_error.h"
#include "st_shm.h"

enum st_ioq_class {
	ST_IOQ_DEMAND = 0,
	ST_IOQ_KV_RESTORE = 1,
	ST_IOQ_PREFETCH = 2,
	ST_IOQ_KV_SPILL = 3,
	ST_IOQ_N = 4,
};

#define ST_IOQ_KIND "ioq"
#define ST_IOQ_LAYOUT 1
#define ST_IOQ_SLOTS 16
#define ST_IOQ_DEFAULT_BOUND_NS 2000000ull  /* 2 ms per I/O at most */
#define ST_IOQ_MAX_BOUND_NS 20000000ull     /* STRATA_IOQ_BOUND_US cap */
#define ST_IOQ_POLL_NS 50000ull             /* re-check every 50 us */
#define ST_IOQ_LIVE_CHECK_NS 100000000ull   /* a peer's pid: every 100 ms */

/* The --help paragraph on the queue's environment (the daemons, strata
 * run and strata up: one text). */
#define ST_IOQ_ENV_HELP                                                       \
	"environment: NVMe reads and writes of expertd and kvd share one "   \
	"I/O queue per\ninstance (demand expert reads, then KV restores, "    \
	"prefetches, KV spills);\nSTRATA_IOQ=off counts them by class "       \
	"without ordering them, STRATA_IOQ_BOUND_US\n(default 2000, at most " \
	"20000) is the longest one I/O waits for more urgent\nones; a bad "   \
	"value is a warning and its default is used.\n"

/* st_ioq_slot.flags: the process runs with STRATA_IOQ=off. */
#define ST_IOQ_SLOT_UNORDERED 1u

/* st_ioq_mode: every live process orders its I/O (or none is live), none
 * does (STRATA_IOQ=off), some do. */
#define ST_IOQ_MODE_ORDERED 1
#define ST_IOQ_MODE_UNORDERED 2
#define ST_IOQ_MODE_MIXED 3

/* One class of one process (64 bytes). */
struct st_ioq_ctr {
	_Atomic uint64_t waiting;   /* gauge: in st_ioq_begin */
	_Atomic uint64_t inflight;  /* gauge: begun, not ended */
	_Atomic uint64_t ops;       /* I/Os ended */
	_Atomic uint64_t bytes;     /* bytes they moved */
	_Atomic uint64_t wait_ns;   /* time deferred by the arbiter */
	_Atomic uint64_t io_ns;     /* time from begin to end */
	_Atomic uint64_t deferred;  /* I/Os that waited at least once */
	_Atomic uint64_t bound_hits; /* I/Os that went at the bound */
};

struct st_ioq_slot {
	_Atomic int32_t pid;        /* 0: free */
	_Atomic uint32_t flags;     /* ST_IOQ_SLOT_* of the process */
	_Atomic uint64_t start_ticks; /* of pid (st_pid_start_ticks) */
	char name[16];              /* "expertd", "kvd" */
	uint8_t pad[32];
	struct st_ioq_ctr c[ST_IOQ_N];
};

/* The segment after its st_shm_header. */
struct st_ioq_seg {
	struct st_shm_header h;
	struct st_ioq_ctr retired[ST_IOQ_N]; /* totals of slots taken over */
	struct st_ioq_slot slot[ST_IOQ_SLOTS];
};

/* Per-class totals over the whole segment (live, dead and retired slots):
 * what the run summary prints. */
struct st_ioq_totals {
	uint64_t ops[ST_IOQ_N], bytes[ST_IOQ_N], wait_ns[ST_IOQ_N];
	uint64_t io_ns[ST_IOQ_N], deferred[ST_IOQ_N], bound_hits[ST_IOQ_N];
	unsigned ordered, unordered; /* live slots with deferral on / off */
};

struct st_ioq;

/* One I/O between st_ioq_begin and st_ioq_end (caller's storage). */
struct st_ioq_op {
	int cls;          /* what it is: its totals' class */
	int prio;         /* how urgent: the class it waits and counts as
			   * waiting / in flight for (st_ioq_begin_prio) */
	int state;        /* 0 none, 1 waiting, 2 in flight */
	int deferred;
	uint64_t t_queued, t_start;
};

/* "demand", "kv-restore", "prefetch", "kv-spill" (NULL for others). */
const char *st_ioq_class_name(int cls);

/*
 * Opens (making it when absent) the instance's queue and takes a slot for
 * this process, named `who` (up to 15 characters).  Reads STRATA_IOQ,
 * STRATA_IOQ_BOUND_US and STRATA_IOQ_DEPTH (a bad value: a warning on the
 * log naming it, and its default).  *ret gets a handle for every thread of the process (free with
 * st_ioq_close).  -ENOSPC when every slot belongs to a live process, the
 * st_shm_attach/st_shm_create codes otherwise; message in diag.  A
 * caller may go on without a queue (NULL handle) after logging it.
 */
int st_ioq_open(struct st_ioq **ret, const char *instance, const char *who,
		struct st_diag *diag);

/* Releases the slot (its totals move to `retired`) and unmaps; the
 * segment stays for the other daemon (strata down removes it).  NULL: no-op. */
void st_ioq_close(struct st_ioq *q);

/* Whether deferral is on (STRATA_IOQ not "off"); 0 for NULL. */
int st_ioq_enabled(const struct st_ioq *q);

/* The bound, ns (0 for NULL). */
uint64_t st_ioq_bound_ns(const struct st_ioq *q);

/*
 * Before one I/O of class `cls`: counts it waiting, defers it (sleeping,
 * ST_IOQ_POLL_NS at a time) while higher classes have more than `depth`
 * I/Os waiting or in flight in live processes, at most the bound, then
 * counts it in flight.  op is filled for st_ioq_end.  q NULL: only op.
 */
void st_ioq_begin(struct st_ioq *q, int cls, struct st_ioq_op *op);

/*
 * st_ioq_begin for an I/O of class cls (its totals) that is as urgent as
 * class prio (its deferral and the gauges others defer to): a KV spill a
 * step's pin waits for is a spill with the urgency of a restore.
 */
void st_ioq_begin_prio(struct st_ioq *q, int cls, int prio,
		       struct st_ioq_op *op);

/*
 * The same without sleeping, for an event loop: the first call counts op
 * waiting; each call returns 0 once it may go (op now in flight: end it
 * with st_ioq_end), or -EAGAIN while deferred (call again later, or
 * st_ioq_cancel).  The bound counts from the first call.
 */
int st_ioq_try_begin(struct st_ioq *q, int cls, struct st_ioq_op *op);

/* Drops a waiting op (st_ioq_try_begin returned -EAGAIN) uncounted. */
void st_ioq_cancel(struct st_ioq *q, struct st_ioq_op *op);

/* After the I/O of op: `bytes` moved (0 on failure), its time and wait
 * added to the class's totals. */
void st_ioq_end(struct st_ioq *q, struct st_ioq_op *op, uint64_t bytes);

/* Whether an I/O of class cls would be deferred now (no counting). */
int st_ioq_pressure(struct st_ioq *q, int cls);

/* ST_IOQ_MODE_* of t's live processes (ORDERED when none is live). */
int st_ioq_mode(const struct st_ioq_totals *t);

/* Totals of the segment q is attached to. */
void st_ioq_totals(const struct st_ioq *q, struct st_ioq_totals *t);

/*
 * Totals of instance's queue without taking a slot (computed's STATS,
 * strata status): opens it read-only, sums, unmaps.  -ENOENT when no
 * daemon made it yet (t zeroed), other st_shm_attach codes.
 */
int st_ioq_read_totals(const char *instance, struct st_ioq_totals *t,
		       struct st_diag *diag);

/* The segment q is attached to, and the index of q's slot in it (tests
 * and tools read the gauges there). */
struct st_ioq_seg *st_ioq_seg(const struct st_ioq *q);
int st_ioq_slot_index(const struct st_ioq *q);

#endif
