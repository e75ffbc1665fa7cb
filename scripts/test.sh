#!/bin/sh
# Runs every default test suite on a fresh Debian 12 machine (what CI
# runs): installs packages, builds, runs `meson test` (everything but the
# `slow` suite) and prints one line "N passed, N failed, N skipped".  Then
# it builds the unit and ipc suites (less the whole-model numerical ones)
# with ASan + UBSan (scripts/test-sanitizers.sh, build-san), runs them and
# fails on any failure or sanitizer report ("sanitizers: N passed, ...");
# that step takes about 0.65 times as long as the default suites (measured
# side by side on 2 cores).  STRATA_SANITIZERS=0 leaves it out (a quick
# local run).
# Extra arguments go to both meson test runs (e.g. --suite unit).
set -u
cd "$(dirname "$0")/.."
./scripts/setup-debian.sh || exit 1
./scripts/build.sh || exit 1
meson test -C build --no-suite slow --print-errorlogs --num-processes 2 "$@"
rc=$?
./scripts/test-summary.py build/meson-logs/testlog.json
if [ "${STRATA_SANITIZERS:-1}" != 0 ]; then
	./scripts/test-sanitizers.sh "$@" || rc=1
fi
exit $rc
