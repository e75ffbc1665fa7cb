# fake_env.sh — sourced by the fake-device tests (test_devpool_fake.sh,
# test_kvattn_fake.sh): a temporary directory and run dir, cleanup of the
# daemons and of the fake device's segments, the kjv-moe store, gen (one
# `strata run` of $NTOK greedy tokens), the CPU reference in $TMP/ref,
# then STRATA_CUDA_FAKE=1 and expertd + kvd started on instance $I.
# The caller sets FAKE_TAG (temporary directory name and instance prefix)
# and NTOK before sourcing it.
set -u
B=${STRATA_BUILD_DIR:?}
SRC=${STRATA_SOURCE_DIR:?}
TMP=$(mktemp -d "/tmp/strata-$FAKE_TAG-XXXXXX")
I="${FAKE_TAG}$$"
R="$TMP/run"
mkdir -m 700 "$R"
pids=""
cleanup() {
	for p in $pids; do kill -9 "$p" 2>/dev/null; done
	for p in $pids; do rm -f /dev/shm/stfake."$p".* 2>/dev/null; done
	rm -f /dev/shm/strata."$I".* 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
[ -n "${KEEP_TMP:-}" ] && trap - EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
fail=0
PROMPT="And God said, Let there be light"
"$B/cli/strata" convert --model "$SRC/models/kjv-moe" --out "$TMP/store" \
	>"$TMP/convert.log" 2>&1 || { echo "FAIL: convert"; tail "$TMP/convert.log"; exit 1; }
gen() { # out, extra args
	out=$1; shift
	"$B/cli/strata" run --model "$SRC/models/kjv-moe" --store "$TMP/store" \
		--prompt "$PROMPT" --max-tokens "$NTOK" --ignore-eos --quiet "$@" \
		>"$out" 2>"$out.err" ||
		{ echo "FAIL: generation ($out)"; tail -5 "$out.err"; fail=1; }
}
# the CPU reference (no fake device: computed computes on the CPU)
gen "$TMP/ref" --instance "${I}ref" --run-dir "$TMP/runref"
[ -s "$TMP/ref" ] || { echo "FAIL: the CPU run produced nothing"; exit 1; }
export STRATA_CUDA_FAKE=1 STRATA_LOG=info
wait_pid() {
	i=0
	while [ ! -s "$R/$1.pid" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
	[ -s "$R/$1.pid" ]
}
"$B/expertd/expertd" --store "$TMP/store" --instance "$I" --run-dir "$R" \
	--host-budget 100% 2>"$TMP/expertd.log" & pids="$pids $!"
"$B/kvd/kvd" --instance "$I" --run-dir "$R" --budget 64MiB \
	2>"$TMP/kvd.log" & pids="$pids $!"
wait_pid expertd && wait_pid kvd || { echo "FAIL: expertd/kvd did not start"; exit 1; }
