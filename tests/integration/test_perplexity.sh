#!/bin/sh
# `strata perplexity` through the three daemons on kjv-moe's valid-small.txt
# (the README's windowing rule): BF16 experts give the README's 25.5894 and
# MXFP4 experts 25.9751, within 1e-4 relative; against a saved BF16 base,
# the BF16 run itself has KL divergence 0 and 100 % same top-1, the MXFP4
# run a positive divergence and fewer same top-1 positions.  A file of
# fewer than 2 tokens (empty, one word) is refused with exit 1 before any
# conversion or daemon start (no run directory, no store in the cache; it
# used to start all three daemons first).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/strata-ppl-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
export STRATA_CACHE_DIR="$TMP/cache"
fail=0

run() { # name, args...
	name=$1; shift
	"$STRATA" perplexity --model "$KJV" --file "$KJV/valid-small.txt" \
		--json --instance "p$$$name" --run-dir "$TMP/run-$name" "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "FAIL: strata perplexity ($name) exited $rc"; cat "$TMP/$name.err"; fail=1
	fi
}
for t in "" "In"; do
	printf '%s' "$t" >"$TMP/short.txt"
	"$STRATA" perplexity --model "$KJV" --file "$TMP/short.txt" \
		--run-dir "$TMP/run-short" >/dev/null 2>"$TMP/short.err"
	rc=$?
	if [ $rc -ne 1 ] || ! grep -q "has fewer than 2 tokens" "$TMP/short.err" ||
	   [ -e "$TMP/run-short" ] || [ -e "$TMP/cache" ]; then
		echo "FAIL: perplexity of '$t': exit $rc, run dir or store made:"
		cat "$TMP/short.err"; ls "$TMP"; fail=1
	else
		echo "perplexity of '$t': refused before starting anything"
	fi
done
run bf16 --experts bf16 --save-kl-base "$TMP/base.bin"
run self --experts bf16 --kl-base "$TMP/base.bin"
run mxfp4 --experts mxfp4 --kl-base "$TMP/base.bin"
[ $fail -eq 0 ] || exit 1
$PY - "$TMP" <<'PY' || fail=1
import json, sys, math
d = sys.argv[1]
def get(n): return json.loads(open(f"{d}/{n}.out").read().strip().splitlines()[-1])
b, s, m = get("bf16"), get("self"), get("mxfp4")
ok = True
def bad(*a):
    global ok; ok = False; print("FAIL:", *a)
for r, want, name in ((b, 25.5894, "bf16"), (m, 25.9751, "mxfp4")):
    if r["scored_tokens"] != 2920: bad(name, "scored", r["scored_tokens"], "!= 2920")
    if abs(r["ppl"] - want) / want > 1e-4: bad(name, "ppl", r["ppl"], "vs README", want)
if s["kld"] != 0 or s["same_top1"] != 1.0: bad("self comparison", s["kld"], s["same_top1"])
if not (m["kld"] > 0.001 and m["same_top1"] < 0.99): bad("mxfp4 vs bf16", m["kld"], m["same_top1"])
print("valid-small: bf16 %.4f, mxfp4 %.4f, KLD(bf16||mxfp4) %.5f, same top-1 %.2f %%" %
      (b["ppl"], m["ppl"], m["kld"], 100 * m["same_top1"]))
sys.exit(0 if ok else 1)
PY
exit $fail
