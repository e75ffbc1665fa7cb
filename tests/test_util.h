/*
 * test_util.h — helpers shared by strata's tests.
 *
 * Fixtures: st_test_shared_dir() returns ../shared (from STRATA_SHARED_DIR,
 * set by meson).  When it is absent the test exits 77 (skip) with a message,
 * except under CI (CI=true), where a missing fixture is a failure (exit 1).
 */
#ifndef ST_TEST_UTIL_H
#define ST_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit code meson reads as "skipped". */
#define ST_TEST_SKIP 77

/* ST_TEST_CHECK(cond): when cond is false, prints "FAIL file:line: cond"
 * to stdout and counts one failure in the including file's
 * `static int failures` (plain-main tests; cmocka ones assert). */
#define ST_TEST_CHECK(c)                                                  \
	do {                                                              \
		if (!(c)) {                                               \
			printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);  \
			failures++;                                       \
		}                                                         \
	} while (0)

/* Path of ../shared, or exits 77 (1 under CI) naming what is missing. */
const char *st_test_shared_dir(void);

/* Path of a fixture model directory ../shared/fixtures/models/<name> into
 * buf; exits like st_test_shared_dir when it is missing. */
const char *st_test_fixture_model(const char *name, char *buf, size_t len);

/* The project source and build roots (from the environment meson sets). */
const char *st_test_source_dir(void);
const char *st_test_build_dir(void);

/* A fresh private temporary directory (mkdtemp under $TMPDIR or /tmp) into
 * buf; aborts the test on failure. */
const char *st_test_tmpdir(char *buf, size_t len);

/* A unique instance name for daemons started by a test ("t<pid>_<tag>"). */
const char *st_test_instance(const char *tag, char *buf, size_t len);

/* The factor a test multiplies its own time limits by (waits for a daemon
 * to start or stop, deadlines on replies): STRATA_TIMEOUT_SCALE, an integer
 * in [1, 20], set by meson to 3 in a sanitizer build (ASan + UBSan run the
 * daemons 2-3 times slower); 1 when unset or not a number in range. */
int st_test_timeout_scale(void);

/* Deterministic test data: one xorshift64 step (Marsaglia 2003, shifts
 * 13/7/17) of *state, the upper bits as a 32-bit value. *state must not
 * be 0; the caller owns it (one per test file, so sequences stay fixed). */
uint32_t st_test_rnd(uint64_t *state);

/* A roughly normal float (mean 0, sd about 1: the sum of four uniform
 * [-1, 1] draws of st_test_rnd, times 0.866). */
float st_test_rndf(uint64_t *state);

#endif
