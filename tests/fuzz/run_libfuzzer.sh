#!/bin/sh
# run_libfuzzer.sh TARGET — fuzzes tests/fuzz/fuzz_TARGET with libFuzzer,
# ASan and UBSan for STRATA_FUZZ_RUNS executions (default 10000000), from
# the seed corpus in tests/fuzz/corpus/TARGET (read only: new inputs go to
# BUILD/fuzz-libfuzzer/corpus-TARGET).  Builds, once, a clang tree of its
# own in BUILD/fuzz-libfuzzer (meson -Dlibfuzzer=true, every file compiled
# with -fsanitize=fuzzer-no-link so libFuzzer sees the parsers' coverage).
# Prints libFuzzer's final stats (number_of_executed_units); fails on any
# crash, leak, sanitizer report or FUZZ_CHECK, keeping the input as
# BUILD/fuzz-libfuzzer/crash-TARGET-*.  Exit 77 without clang's libFuzzer.
# STRATA_FUZZ_JOBS=N (default 1) runs libFuzzer's fork mode with N worker
# processes sharing one corpus; the runs count is then their total.
# STRATA_FUZZ_MAX_LEN=N caps an input's length in bytes (libFuzzer's
# -max_len; unset, libFuzzer's own default, 4096 for a small corpus).
set -u
t=${1:?usage: run_libfuzzer.sh TARGET}
src=${STRATA_SOURCE_DIR:?STRATA_SOURCE_DIR not set (run through meson test)}
build=${STRATA_BUILD_DIR:?STRATA_BUILD_DIR not set}/fuzz-libfuzzer
runs=${STRATA_FUZZ_RUNS:-10000000}
cc=${STRATA_FUZZ_CC:-clang}
jobs=${STRATA_FUZZ_JOBS:-1}
case $jobs in
''|*[!0-9]*|0) echo "STRATA_FUZZ_JOBS must be a positive integer, not '$jobs'"; exit 1 ;;
esac
fork=
[ "$jobs" -gt 1 ] && fork=-fork=$jobs
maxlen=${STRATA_FUZZ_MAX_LEN:-}
case $maxlen in
'') ;;
*[!0-9]*|0) echo "STRATA_FUZZ_MAX_LEN must be a positive integer, not '$maxlen'"; exit 1 ;;
*) maxlen=-max_len=$maxlen ;;
esac

if ! command -v "$cc" >/dev/null 2>&1; then
	echo "SKIP: $cc not found; libFuzzer runs need clang (apt-get install clang)"
	exit 77
fi
mkdir -p "$build" || exit 1
probe=$build/probe
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n)\n{ return 0; }\n' \
	> "$probe.c" || exit 1
if ! "$cc" -fsanitize=fuzzer,address,undefined "$probe.c" -o "$probe" \
	>/dev/null 2>&1; then
	echo "SKIP: $cc cannot link -fsanitize=fuzzer,address,undefined (libFuzzer runtime missing)"
	exit 77
fi

# one configure and build at a time (the four tests may be run in parallel)
(
	flock 9 || exit 1
	if [ ! -f "$build/tree/build.ninja" ]; then
		CC=$cc meson setup "$build/tree" "$src" --buildtype=debugoptimized \
			-Dlibfuzzer=true -Dcuda=disabled \
			-Db_sanitize=address,undefined -Db_lundef=false \
			-Dc_args=-fsanitize=fuzzer-no-link >"$build/setup.log" 2>&1 ||
			{ cat "$build/setup.log"; exit 1; }
	fi
	ninja -C "$build/tree" "tests/fuzz/fuzz_$t" >"$build/build-$t.log" 2>&1 ||
		{ tail -40 "$build/build-$t.log"; exit 1; }
) 9>"$build/lock" || exit 1

mkdir -p "$build/corpus-$t" || exit 1
# UBSan reports are findings: make them abort, like ASan's
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
echo "fuzz_$t: $runs runs from $src/tests/fuzz/corpus/$t${fork:+ ($jobs worker processes)}${maxlen:+ ($maxlen)}"
log=$build/run-$t.log
# shellcheck disable=SC2086 # $fork and $maxlen are empty or one word
"$build/tree/tests/fuzz/fuzz_$t" $fork $maxlen -runs="$runs" -print_final_stats=1 \
	-rss_limit_mb=4096 -timeout=30 -artifact_prefix="$build/crash-$t-" \
	"$build/corpus-$t" "$src/tests/fuzz/corpus/$t" >"$log" 2>&1
rc=$?
# the progress lines are many: keep the start, the end and any report
grep -v '^#[0-9]*\(	NEW\|	REDUCE\|	pulse\|: cov\)' "$log" | tail -60
# fork mode: its last progress line has the total of executions
[ -n "$fork" ] && grep '^#[0-9]*: cov' "$log" | tail -1
exit $rc
