/*
 * st_ledger.h — one host memory budget shared by expertd's expert slots and
 * kvd's KV pages (issue 24 item 2; DESIGN.md section "One memory budget").
 *
 * With `--memory-budget M` the two daemons of an instance share M bytes of
 * host memory (T1).  Each sizes its segment for its cap (the bytes it could
 * ever use: sparse shared memory, only the slots and pages holding data
 * cost RAM) and keeps the bytes of its slots or pages that hold data
 * ("used") at or below its **target**, the share the ledger gives it.  An
 * arbiter moves `step` bytes at a time from one side to the other by
 * measured marginal value: what `step` bytes more would save the receiver
 * (its "gain") against what `step` bytes less would cost the donor (its
 * "loss"), both in ns of stall per second of wall time per GiB, published
 * by each owner from its own statistics (expertd: the activation counts of
 * the experts just outside / just inside the pool times the measured cost
 * of a demand miss; kvd: the restore time of spilled pages of sequences
 * that run or wait).  A move needs the receiver's gain above the donor's
 * loss by the hysteresis factor, leaves both sides within their floors and
 * caps, and waits `dwell` after the previous move; a gain k times that bar
 * moves k steps at once (at most ST_LEDGER_MAX_STEPS).
 *
 * A move has two phases so the sum of what both sides hold never exceeds
 * M: the arbiter lowers the donor's target and notes the move as pending;
 * the donor frees units (evicts or spills unpinned ones, returning their
 * memory to the OS) until its used bytes are at or below its new target;
 * then the arbiter raises the receiver's target.  A donor that cannot free
 * enough within ST_LEDGER_MOVE_TIMEOUT_NS (its units are pinned) has the
 * move cancelled: its target goes back up.  Only a need that would
 * otherwise fail a step (every unit pinned, or a reservation larger than
 * what is left) lets an owner go over its target; it reports the excess
 * as `over`, and the arbiter then moves that much from the other side at
 * once (no dwell, no hysteresis).
 *
 * Mechanism: a small POSIX shared-memory segment per instance,
 * "/strata.<instance>.ledger" (st_shm.h conventions), shared by peers
 * (st_shm_attach_or_make).  One side record per daemon in C11 atomics;
 * the arbiter runs in whichever daemon's tick first finds it due
 * (every ST_LEDGER_INTERVAL_NS, under a non-blocking flock of the
 * segment's name, so two never decide at once and a killed one holds
 * nothing), so either daemon alone keeps the ledger moving; with both
 * gone the split stays as it was.  Every move (done or cancelled) goes
 * into a ring of the last ST_LEDGER_LOG moves and the side counters;
 * strata status, strata plan and computed's /metrics read them
 * (st_ledger_read).
 *
 * Failure cases: a side whose process died keeps its target (its segment
 * still holds its data for the successor's adoption); a pending move whose
 * donor died is cancelled at the timeout.  A daemon started with another
 * --memory-budget than the live peer's is refused (-ST_E_CONFIG, saying
 * both values); with no live peer the ledger is made anew.  The last
 * daemon to close cleanly removes the segment.
 *
 * Test switch: STRATA_LEDGER_FLIP_MS=N (N > 0) in a daemon's environment
 * makes its arbiter ignore the values and move `step` bytes back and forth
 * every N ms (within floors and caps): the budget oscillates (issue 24
 * item 4).  STRATA_LEDGER_STEP (bytes, or a percentage of M, default
 * 1/16 of M) and STRATA_LEDGER_DWELL_MS (default 250) tune the arbiter; a
 * bad value is a warning and its default is used.
 */
#ifndef ST_LEDGER_H
#define ST_LEDGER_H

#include <stdatomic.h>
#include <stdint.h>

#include "st_error.h"
#include "st_shm.h"

enum st_ledger_side {
	ST_LEDGER_EXPERTS = 0, /* expertd's host expert slots */
	ST_LEDGER_KV = 1,      /* kvd's host KV pages */
	ST_LEDGER_SIDES = 2,
};

#define ST_LEDGER_KIND "ledger"
#define ST_LEDGER_LAYOUT 1
#define ST_LEDGER_LOG 64                       /* moves kept in the ring */
#define ST_LEDGER_INTERVAL_NS 100000000ull     /* the arbiter: every 100 ms */
#define ST_LEDGER_DWELL_NS 250000000ull        /* between moves by value */
#define ST_LEDGER_MAX_STEPS 4  /* steps one move by value may take */
#define ST_LEDGER_MOVE_TIMEOUT_NS 5000000000ull /* a donor's time to shrink */
#define ST_LEDGER_STALE_NS 3000000000ull       /* values older: no move */
#define ST_LEDGER_HYSTERESIS 0.25  /* gain must beat loss by 25 % ... */
#define ST_LEDGER_MIN_GAIN 1e5     /* ... and by 1e5 ns/s per GiB (0.01 %) */

/* st_ledger_move.kind */
#define ST_LEDGER_MOVE_DONE 1      /* step bytes went from -> to */
#define ST_LEDGER_MOVE_CANCELLED 2 /* the donor could not shrink in time */
#define ST_LEDGER_MOVE_GRANT 3     /* unassigned bytes given to `to` */

/* st_ledger_move.why */
#define ST_LEDGER_WHY_VALUE 1      /* gain above loss (hysteresis) */
#define ST_LEDGER_WHY_OVER 2       /* the receiver went over its target */
#define ST_LEDGER_WHY_FLIP 3       /* STRATA_LEDGER_FLIP_MS (tests) */
#define ST_LEDGER_WHY_UNASSIGNED 4 /* bytes no side held */

/* One side of the budget (a cache line or two; owner writes all but
 * target, which the arbiter writes). */
struct st_ledger_rec {
	_Atomic int32_t pid;          /* owner; 0: never joined */
	uint32_t reserved;
	_Atomic uint64_t start_ticks; /* of pid (st_pid_start_ticks) */
	_Atomic uint64_t floor;       /* bytes: never given below this */
	_Atomic uint64_t cap;         /* bytes: never given above this */
	_Atomic uint64_t unit;        /* bytes of one slot / page */
	_Atomic uint64_t target;      /* bytes the owner may hold */
	_Atomic uint64_t used;        /* bytes of units holding data */
	_Atomic uint64_t pinned;      /* of those, bytes pinned now */
	_Atomic uint64_t over;        /* bytes held beyond target (need) */
	_Atomic uint64_t gain;        /* double bits: ns/s per GiB */
	_Atomic uint64_t loss;        /* double bits: ns/s per GiB */
	_Atomic uint64_t value_ns;    /* st_now_ns of the last report */
	_Atomic uint64_t moves_in, moves_out;   /* completed moves */
	_Atomic uint64_t bytes_in, bytes_out;   /* their bytes */
	_Atomic uint64_t cancelled;   /* moves from it that were cancelled */
	uint8_t pad[56];
};

/* One logged move. */
struct st_ledger_move {
	uint64_t t_ns;          /* st_now_ns (CLOCK_MONOTONIC) */
	uint32_t kind;          /* ST_LEDGER_MOVE_* */
	uint32_t why;           /* ST_LEDGER_WHY_* */
	uint32_t from, to;      /* sides (from unused for GRANT) */
	uint64_t bytes;
	double gain, loss;      /* receiver's gain, donor's loss (ns/s/GiB) */
	uint64_t target[ST_LEDGER_SIDES]; /* targets after it */
};

/* The segment after its st_shm_header. */
struct st_ledger_seg {
	struct st_shm_header h;
	_Atomic uint64_t total;        /* --memory-budget, bytes */
	_Atomic uint64_t step;         /* bytes per move */
	_Atomic uint64_t arb_ns;       /* last arbiter run */
	_Atomic uint64_t last_move_ns; /* last move started or granted */
	_Atomic uint64_t pending;      /* bytes taken from pend_from, not yet
					* given (0: no move under way) */
	_Atomic uint32_t pend_from;
	_Atomic uint32_t pend_why;
	_Atomic uint64_t pend_ns;      /* when it began */
	_Atomic uint64_t pend_gain, pend_loss; /* double bits */
	_Atomic uint64_t n_moves;      /* ever logged: log[n % LOG] next */
	_Atomic uint64_t n_flips;      /* test oscillation moves started */
	struct st_ledger_rec side[ST_LEDGER_SIDES];
	struct st_ledger_move log[ST_LEDGER_LOG];
};

/* What an owner reports each tick (st_ledger_report). */
struct st_ledger_report {
	uint64_t used;    /* bytes of its units holding data */
	uint64_t pinned;  /* of those, pinned (cannot be given up now) */
	uint64_t over;    /* bytes it holds beyond its target because a step
			   * would have failed otherwise (0 normally) */
	double gain;      /* value of `step` bytes more, ns/s per GiB */
	double loss;      /* value of its last `step` bytes, ns/s per GiB */
};

/* A copy of the ledger for readers and for st_ledger_decide. */
struct st_ledger_view {
	uint64_t total, step, last_move_ns, pending, pend_ns, n_moves;
	uint32_t pend_from;
	struct {
		int live;               /* its process runs now */
		int32_t pid;
		uint64_t floor, cap, unit, target, used, pinned, over;
		double gain, loss;
		uint64_t value_ns;
		uint64_t moves_in, moves_out, bytes_in, bytes_out, cancelled;
	} side[ST_LEDGER_SIDES];
	unsigned n_log;                       /* moves in log[], oldest first */
	struct st_ledger_move log[ST_LEDGER_LOG];
};

/* The arbiter's settings (st_ledger_params_default, then the env). */
struct st_ledger_params {
	uint64_t dwell_ns;     /* between moves by value */
	uint64_t timeout_ns;   /* a pending move's donor: time to shrink */
	uint64_t stale_ns;     /* values older than this: no move by value */
	uint64_t flip_ns;      /* > 0: oscillate every flip_ns (tests) */
	double hysteresis, min_gain;
};

/* What the arbiter does now (st_ledger_decide). */
enum st_ledger_act {
	ST_LEDGER_ACT_NONE = 0,
	ST_LEDGER_ACT_START,    /* lower from's target by bytes: pending */
	ST_LEDGER_ACT_COMPLETE, /* raise the receiver's by the pending bytes */
	ST_LEDGER_ACT_CANCEL,   /* give the pending bytes back to the donor */
	ST_LEDGER_ACT_GRANT,    /* give unassigned bytes to `to` */
};

struct st_ledger_action {
	enum st_ledger_act act;
	uint32_t from, to, why;
	uint64_t bytes;
	double gain, loss;
};

struct st_ledger;

/* "experts", "kv" (NULL for others). */
const char *st_ledger_side_name(int side);

/* The defaults above with the environment's STRATA_LEDGER_FLIP_MS and
 * STRATA_LEDGER_DWELL_MS (a bad value: a warning and the default). */
void st_ledger_params_default(struct st_ledger_params *p);

/*
 * The arbiter's decision, a pure function of a view (units: bytes, ns;
 * now_ns on st_now_ns's clock), in this order: a pending move completes
 * once its donor's used bytes are at or below its target, or is cancelled
 * after p->timeout_ns; unassigned bytes (total above the targets' sum) go
 * to the live side with the larger gain, up to its cap; a side over its
 * target gets that much (rounded up to step) from the other at once; after
 * p->dwell_ns (p->flip_ns in flip mode: back and forth, why FLIP) a move of
 * step bytes from the side whose loss is lowest to the side whose gain is
 * highest when gain > bar = loss * (1 + hysteresis) + min_gain (k steps,
 * k = floor(gain / bar) up to ST_LEDGER_MAX_STEPS, when the gain is k
 * times the bar: a split far from its balance gets there in fewer
 * moves), both sides live
 * with values fresher than p->stale_ns, the donor staying at or above its
 * floor and the receiver at or below its cap (the step is cut to fit;
 * less than one unit of either side: no move).  Fills *a (act NONE when
 * nothing is to be done).
 */
void st_ledger_decide(const struct st_ledger_view *v,
		      const struct st_ledger_params *p, uint64_t now_ns,
		      struct st_ledger_action *a);

/*
 * Checks a --memory-budget of `total` bytes against this machine's RAM
 * (sysconf: physical pages x page size): expert slots and KV pages both
 * live in RAM, so a total above it would end with the kernel killing a
 * daemon.  0, or -ST_E_BUDGET with diag naming both sizes.
 */
int st_ledger_check_total(uint64_t total, struct st_diag *diag);

/*
 * The target a side gets when it joins (st_ledger_open's rule, bytes):
 * `kept` when its previous owner left one (a restart; 0: none), else what
 * the other side leaves (total - other_target), or half of total when the
 * other side has not joined (other_cap 0); clamped to [floor, cap].  When
 * that and other_target add up to more than total, the other side gets
 * total minus it (the floors fit: st_ledger_open checks them).
 */
uint64_t st_ledger_join_target(uint64_t total, uint64_t floor, uint64_t cap,
			       uint64_t kept, uint64_t other_cap,
			       uint64_t other_target);

/*
 * Joins the instance's ledger as the owner of `side` (the daemon's start):
 * makes the segment when absent (total bytes; step from STRATA_LEDGER_STEP,
 * default total / 16), or attaches.  floor and cap (bytes) bound what the
 * side is ever given (cap: what its segment was sized for); unit is the
 * bytes of one of its slots / pages.  The side's target: kept from a
 * previous owner of the side (a restart), clamped to [floor, cap]; else
 * what the other side leaves (half of total when it has not joined),
 * clamped to [floor, cap], taking from the other side down to its floor
 * when its own floor needs it.  *ret gets the handle (st_ledger_close).
 * Errors, message in diag: -ST_E_CONFIG when a live peer runs with another
 * total (both values named) or floor > cap; -ST_E_BUDGET when the floors
 * of both sides add up to more than total; -EBUSY when a live process
 * already owns the side; st_shm codes.
 */
int st_ledger_open(struct st_ledger **ret, const char *instance, int side,
		   uint64_t total, uint64_t floor, uint64_t cap, uint64_t unit,
		   struct st_diag *diag);

/* Leaves the side (its target is kept for a successor); the last live
 * side to close removes the segment.  NULL: no-op. */
void st_ledger_close(struct st_ledger *l);

/* Bytes this side may hold now (the owner frees units down to it),
 * within the floor and cap it joined with (a segment written by anything
 * but the arbiter cannot give it more).  NULL: UINT64_MAX. */
uint64_t st_ledger_target(const struct st_ledger *l);

/* The segment's total and step (bytes); 0 for NULL. */
uint64_t st_ledger_total(const struct st_ledger *l);
uint64_t st_ledger_step(const struct st_ledger *l);

/* Publishes this side's gauges and values (at least every second; values
 * older than ST_LEDGER_STALE_NS stop moves by value).  NULL: no-op. */
void st_ledger_report(struct st_ledger *l, const struct st_ledger_report *r);

/*
 * The owner's periodic call (its server loop, at least every 100 ms): runs
 * the arbiter when due and no other process runs it now, applying
 * st_ledger_decide's action to the segment and logging a move (st_info:
 * a segment whose figures do not add up — another total than the one
 * joined, targets above it, a step of 0 or above it — is left as it is,
 * with one warning, so the split stays where it was:
 * "memory: 512 MiB kv -> experts (gain ... > loss ...)").  Returns 1 when
 * this call changed a target (*ret_move, may be NULL, gets the logged
 * move), else 0.  NULL: 0.
 */
int st_ledger_tick(struct st_ledger *l, uint64_t now_ns,
		   struct st_ledger_move *ret_move);

/* A copy of the segment l is attached to (live sides checked now). */
void st_ledger_view(const struct st_ledger *l, struct st_ledger_view *v);

/*
 * A copy of instance's ledger without joining it (strata status, plan,
 * computed's /metrics).  0, -ENOENT when the instance shares no budget
 * (no segment), other st_shm codes with diag.
 */
int st_ledger_read(const char *instance, struct st_ledger_view *v,
		   struct st_diag *diag);

#endif
