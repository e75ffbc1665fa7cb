#!/bin/sh
# Builds strata with ASan + UBSan into build-san and runs the unit and ipc
# suites there, less the suites of numerical comparisons on whole models
# (reference, fast, integration: each 5-7 times slower there, as long as
# the whole default run; the code they drive is reached by the unit, ipc,
# fault and serve tests); scripts/test.sh (CI) runs it after the default
# suites.
#
# -O1 -fno-inline: fast enough for CI (-O0 made the reference tests 5-14
# times slower than debugoptimized, over their timeouts), and like a debug
# build every helper not marked always_inline stays a call, so the ABI
# mismatch of a debug build (an out-of-line helper taking or returning a
# 256-bit vector, called from a target_clones kernel) shows here as wrong
# values in computed-units.  Only what the chosen tests run is built
# (scripts/test-targets.py: no benchmarks, no test of another suite).
#
# The build runs 2-7 times slower: meson's time limits are multiplied by 3
# here, the tests' own by STRATA_TIMEOUT_SCALE (3, set by tests/meson.build
# in a sanitizer build, which also sets STRATA_SANITIZED=1: RSS is not
# compared with the plan there).  Leaks inside a library, not strata's, are
# suppressed one by one in scripts/lsan.supp, each with its reason.
#
# Fails on a failed test and on any sanitizer report, also one from a
# daemon whose exit status its test does not look at: every report goes to
# a file under build-san/sanitizer-logs, printed at the end.  Prints one
# line "sanitizers: N passed, N failed, N skipped".  Extra arguments go to
# meson test (more --suite / --no-suite options: the build follows them).
#
# --models (first argument): runs instead the suites left out above
# (reference, fast, integration: whole models against their references;
# about an hour on 2 cores), the slow suite's `sanitizers-models`.
set -u
cd "$(dirname "$0")/.."
dir=build-san
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" --buildtype=debug -Doptimization=1 -Dcuda=disabled \
		-Db_sanitize=address,undefined \
		-Dc_args="-fno-inline -fno-sanitize-recover=all" \
		-Dc_link_args=-fno-sanitize-recover=all || exit 1
fi
# regenerate first (a changed meson.build) so the test list is current
ninja -C "$dir" build.ninja >/dev/null || exit 1
if [ "${1:-}" = --models ]; then
	shift
	suites="--suite reference --suite fast --suite integration
		--no-suite slow"
else
	suites="--suite unit --suite ipc --no-suite slow --no-suite reference
		--no-suite fast --no-suite integration"
fi
# shellcheck disable=SC2086  # one option a word
targets=$(./scripts/test-targets.py "$dir" $suites "$@") || exit 1
# shellcheck disable=SC2086  # one target a word
ninja -C "$dir" $targets || exit 1

logs=$PWD/$dir/sanitizer-logs
rm -rf "$logs" && mkdir -p "$logs" || exit 1
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
# shellcheck disable=SC2086
meson test -C "$dir" --no-rebuild $suites --timeout-multiplier 3 \
	--print-errorlogs --num-processes 2 "$@"
rc=$?
if [ -n "$(ls -A "$logs")" ]; then
	for f in "$logs"/*; do
		echo "==== sanitizer report $f"
		cat "$f"
	done
	echo "sanitizers: reports above (build-san/sanitizer-logs)"
	rc=1
fi
printf 'sanitizers: '
./scripts/test-summary.py "$dir/meson-logs/testlog.json"
exit $rc
