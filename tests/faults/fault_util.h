/*
 * fault_util.h — helpers of the restart fault tests (tests/faults): a
 * converted fixture store, a seeded random source whose seed is printed
 * so a failure can be replayed, and leak counters (open file descriptors
 * of this process, strata files left in a run directory).
 */
#ifndef FAULT_UTIL_H
#define FAULT_UTIL_H

#include <stddef.h>
#include <stdint.h>

/*
 * Converts fixture model `fixture` (../shared/fixtures/models/NAME) with
 * BF16 experts (exact: reference mode) into DIR/store; store_dir gets the
 * path.  0, or -1 after printing the error.  Exits 77 when the fixtures
 * are missing (st_test_fixture_model).
 */
int flt_convert(const char *fixture, const char *dir, char *store_dir,
		size_t len);

/* The seed: $STRATA_FAULT_SEED when set, else from the clock; printed as
 * "seed N (replay with STRATA_FAULT_SEED=N)". */
uint64_t flt_seed(void);

/* xorshift64* step; uniform in [0, n) for n > 0. */
uint64_t flt_rand(uint64_t *state, uint64_t n);

/* Number of open file descriptors of this process (/proc/self/fd). */
int flt_count_fds(void);

/* Number of entries of run_dir named *.ctl, *.evt or *.pid. */
int flt_count_run_files(const char *run_dir);

#endif
