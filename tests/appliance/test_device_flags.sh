#!/bin/sh
# The GPU options of the launcher (issue 10): `strata up` and `strata run`
# pass --device-budget and --device-kv-budget through to computed, and
# refuse them, saying what to do, where they cannot be honoured.
#   - a malformed value is refused (exit 2) naming the option, before any
#     daemon starts;
#   - without the fake device: either the machine has a GPU (/dev/nvidia0)
#     and the run works, or the options are refused (exit 2) with the
#     reason (computed's words: "built without CUDA" / "no CUDA device")
#     and the way out (--device-budget 0, or leaving them out);
#   - CUDA builds, STRATA_CUDA_FAKE=1 (st_cuda.h's fake device): `strata
#     up --device-budget 25% --device-kv-budget 4MiB` gives computed
#     exactly those options (computed.args, kept for `strata restart`),
#     computed sets up the fake device pools, and `strata run` on that
#     instance and on a private one (--device-budget 100%) print the same
#     greedy tokens as a CPU run.
set -u
B=${STRATA_BUILD_DIR:?}
SRC=${STRATA_SOURCE_DIR:?}
STRATA="$B/cli/strata"
TMP=$(mktemp -d /tmp/strata-devflags-XXXXXX)
I="dfl$$"
R="$TMP/run"
fail=0
cleanup() {
	"$STRATA" down --instance "$I" --run-dir "$R" >/dev/null 2>&1
	"$STRATA" down --instance "${I}p" --run-dir "$TMP/runp" >/dev/null 2>&1
	"$STRATA" down --instance "${I}c" --run-dir "$TMP/runc" >/dev/null 2>&1
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE
PROMPT="And God said, Let there be light"
MODEL="$SRC/models/kjv-moe"

# malformed values: refused before anything starts
"$STRATA" run --model "$MODEL" --device-budget "12 apples" >/dev/null \
	2>"$TMP/e1"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--device-budget '12 apples'" "$TMP/e1" ||
	{ echo "FAIL: run --device-budget '12 apples': rc $rc"; cat "$TMP/e1"; fail=1; }
"$STRATA" up --model "$MODEL" --instance "$I" --run-dir "$R" \
	--device-kv-budget lots >/dev/null 2>"$TMP/e2"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--device-kv-budget" "$TMP/e2" ||
	{ echo "FAIL: up --device-kv-budget lots: rc $rc"; cat "$TMP/e2"; fail=1; }
[ -e "$R/computed.pid" ] && { echo "FAIL: a daemon started despite a bad option"; fail=1; }

"$STRATA" convert --model "$MODEL" --out "$TMP/store" >"$TMP/convert.log" 2>&1 ||
	{ echo "FAIL: convert"; tail "$TMP/convert.log"; exit 1; }
gen() { # out, extra args
	out=$1; shift
	"$STRATA" run --store "$TMP/store" --prompt "$PROMPT" --max-tokens 16 \
		--ignore-eos --quiet "$@" >"$out" 2>"$out.err"
}
# the CPU reference
(unset STRATA_CUDA_FAKE; gen "$TMP/ref" --device-budget 0 --instance "${I}r" \
	--run-dir "$TMP/runref") ||
	{ echo "FAIL: CPU run with --device-budget 0"; tail -5 "$TMP/ref.err"; exit 1; }

# a real device, or a refusal that says why and what to do
(unset STRATA_CUDA_FAKE; gen "$TMP/real" --device-budget 25% \
	--instance "${I}d" --run-dir "$TMP/rundev")
rc=$?
if [ $rc -eq 0 ]; then
	[ -e /dev/nvidia0 ] || { echo "FAIL: --device-budget accepted without a GPU"; fail=1; }
	echo "a device is present: strata run --device-budget 25% ran"
elif [ $rc -eq 2 ]; then
	grep -Eq "built without CUDA|no CUDA device" "$TMP/real.err" &&
	grep -q -- "--device-budget 0\|leave the --device-\* options out" "$TMP/real.err" ||
		{ echo "FAIL: the refusal does not say why and what to do:"; cat "$TMP/real.err"; fail=1; }
	sed 's/^/refused as expected: /' "$TMP/real.err"
else
	echo "FAIL: strata run --device-budget 25%: rc $rc"; tail -5 "$TMP/real.err"; fail=1
fi

# a configuration with the example's [device] section (budget = auto,
# kv_budget = the default 256MiB) starts anywhere: auto and the default
# pool ask for nothing a machine without a device must refuse (strata up
# --config docs/strata.conf.example used to stop at "--device-kv-budget:
# no CUDA device" on such a machine)
cat >"$TMP/dev.conf" <<CONF
[instance]
name = ${I}c
run_dir = $TMP/runc
[model]
store = $TMP/store
[device]
budget = auto
kv_budget = 256MiB
CONF
(unset STRATA_CUDA_FAKE; "$STRATA" up --config "$TMP/dev.conf" >"$TMP/upc.log" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
	echo "FAIL: up --config with the example's [device] section: rc $rc"; cat "$TMP/upc.log"; fail=1
else
	echo "up --config with device.budget auto, kv_budget 256MiB: started"
fi
"$STRATA" down --instance "${I}c" --run-dir "$TMP/runc" >/dev/null 2>&1
# another pool size is an explicit request: refused without a device
if [ ! -e /dev/nvidia0 ]; then
	sed -i 's/^kv_budget = 256MiB/kv_budget = 1GiB/' "$TMP/dev.conf"
	(unset STRATA_CUDA_FAKE; "$STRATA" up --config "$TMP/dev.conf" >"$TMP/upc2.log" 2>&1)
	rc=$?
	[ $rc -eq 2 ] && grep -q -- "--device-kv-budget" "$TMP/upc2.log" ||
		{ echo "FAIL: up --config kv_budget = 1GiB without a device: rc $rc"; cat "$TMP/upc2.log"; fail=1; }
	"$STRATA" down --instance "${I}c" --run-dir "$TMP/runc" >/dev/null 2>&1
fi

# pass-through, on the fake device (CUDA builds)
export STRATA_CUDA_FAKE=1 STRATA_LOG=info
if grep -q "built without CUDA" "$TMP/real.err" 2>/dev/null; then
	echo "no CUDA in this build: pass-through not checked"
	exit $fail
fi
"$STRATA" up --store "$TMP/store" --instance "$I" --run-dir "$R" \
	--device-budget 25% --device-kv-budget 4MiB >"$TMP/up.log" 2>&1 ||
	{ echo "FAIL: strata up with the device options"; tail -5 "$TMP/up.log"; exit 1; }
tr '\0' '\n' <"$R/computed.args" >"$TMP/args"
grep -A1 -x -- "--device-budget" "$TMP/args" | tail -1 | grep -qx "25%" ||
	{ echo "FAIL: computed was not given --device-budget 25%"; cat "$TMP/args"; fail=1; }
grep -A1 -x -- "--device-kv-budget" "$TMP/args" | tail -1 | grep -qx "4MiB" ||
	{ echo "FAIL: computed was not given --device-kv-budget 4MiB"; cat "$TMP/args"; fail=1; }
grep -q "fake device" "$R/computed.log" ||
	{ echo "FAIL: computed did not set up the device pools"; tail -5 "$R/computed.log"; fail=1; }
gen "$TMP/out1" --instance "$I" --run-dir "$R" ||
	{ echo "FAIL: run on the instance"; tail -5 "$TMP/out1.err"; fail=1; }
cmp -s "$TMP/ref" "$TMP/out1" || { echo "FAIL: tokens through strata up's device pools differ from the CPU run"; fail=1; }
"$STRATA" down --instance "$I" --run-dir "$R" >/dev/null 2>&1
gen "$TMP/out2" --device-budget 100% --device-kv-budget 4MiB \
	--instance "${I}p" --run-dir "$TMP/runp" --keep ||
	{ echo "FAIL: strata run --device-budget 100%"; tail -5 "$TMP/out2.err"; fail=1; }
cmp -s "$TMP/ref" "$TMP/out2" || { echo "FAIL: tokens of strata run --device-budget 100% differ from the CPU run"; fail=1; }
tr '\0' '\n' <"$TMP/runp/computed.args" 2>/dev/null | grep -A1 -x -- "--device-budget" |
	tail -1 | grep -qx "100%" || { echo "FAIL: strata run did not give computed --device-budget 100%"; fail=1; }
grep -q "fake device" "$TMP/runp/computed.log" 2>/dev/null ||
	{ echo "FAIL: strata run's computed did not set up the device pools"; fail=1; }
"$STRATA" down --instance "${I}p" --run-dir "$TMP/runp" >/dev/null 2>&1
[ $fail -eq 0 ] && echo "device options: refused with a reason where they cannot work, passed to computed by up and run, tokens equal the CPU run"
exit $fail
