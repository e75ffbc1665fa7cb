/*
 * cli_memory.h — the shared host memory budget (`--memory-budget`,
 * common/st_ledger.h) in the strata CLI: checking the flag of `strata up`
 * and `strata run`, and showing the ledger (the split, its values, the
 * moves) in `strata status`, its --json and `strata run`'s summary.
 */
#ifndef CLI_MEMORY_H
#define CLI_MEMORY_H

#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "st_ledger.h"

/* Moves the text shows (the newest last); JSON has all the ring holds. */
#define CLI_MEMORY_TEXT_MOVES 5

/*
 * Checks `--memory-budget M` against the floors given with it: host_floor
 * (expertd's --host-budget: bytes, or a share of all experts that only
 * expertd can resolve, NULL or "": none) and kv_floor (kvd's --budget in
 * bytes, NULL or "": none).  M must be bytes (a share is refused: there
 * is no whole it could be a share of) above 0 (a size that means 0 bytes
 * is refused: leaving the option out is how to have no shared budget),
 * in any suffix st_parse_size takes (the message lists them).  When
 * both floors are bytes, M must hold their sum (the message names the
 * minimum).  *ret_bytes (may be NULL) gets M.  Returns 0, or 2 after a
 * message "who: --memory-budget ...: ..." on stderr.
 */
int cli_check_memory(const char *memory, const char *host_floor,
		     const char *kv_floor, const char *who,
		     uint64_t *ret_bytes);

/*
 * KV pages kvd may hold now: under a shared budget (v not NULL, its kv
 * side joined: unit, the page size, above 0) its share, the kv target in
 * whole pages (kvd's allowed pages, kv_pool_set_allowed), at most n_pages;
 * else the whole pool, n_pages.
 */
uint64_t cli_memory_kv_allowed(const struct st_ledger_view *v,
			       uint64_t n_pages);

/*
 * "KV pages used/allowed" for strata status: "0/1024", or under a shared
 * budget (v as cli_memory_kv_allowed) "0/512 (share 2.00 MiB of a pool
 * of 25600 pages made for 100.00 MiB)": the share is kvd's (the ledger's
 * kv target), the pool the sparse segment made for the whole budget.
 * ret: cap bytes.
 */
void cli_memory_kv_pages_text(const struct st_ledger_view *v, uint64_t used,
			      uint64_t n_pages, char *ret, size_t cap);

/*
 * One logged move as text relative to now_ns (st_now_ns's clock):
 * "12 s ago: 512 MiB kv -> experts, gain 3.1e+06 > loss 0 (value)"
 * ("gain G, loss L (flip)" for moves not made by value).  Cancelled moves
 * and grants say so.  ret: cap bytes.
 */
void cli_memory_move_text(const struct st_ledger_move *m, uint64_t now_ns,
			  char *ret, size_t cap);

/*
 * Prints the ledger v as the lines of a status or a run summary: the
 * total, each side's target / used / pinned / floor / cap with its gain
 * and loss (ns of stall per s per GiB) and its moves, a pending move, and
 * the last CLI_MEMORY_TEXT_MOVES moves (times relative to now_ns).
 * Lines start with `indent`; the first field is padded to the width of
 * the run summary's labels.
 */
void cli_memory_print(FILE *f, const char *indent,
		      const struct st_ledger_view *v, uint64_t now_ns);

/*
 * The same as a JSON object (new reference): {"budget_bytes", "step_bytes",
 * "moves", "pending": {...} or null, "sides": {"experts": {"live", "pid",
 * "target_bytes", "used_bytes", "pinned_bytes", "over_bytes",
 * "floor_bytes", "cap_bytes", "unit_bytes", "gain", "loss",
 * "moves_in", "moves_out", "bytes_in", "bytes_out", "cancelled"}, "kv":
 * {...}}, "log": [{"ago_s", "kind", "why", "from", "to", "bytes", "gain",
 * "loss", "target": {"experts", "kv"}}, ...] oldest first}.  NULL when out
 * of memory.
 */
json_t *cli_memory_json(const struct st_ledger_view *v, uint64_t now_ns);

#endif
