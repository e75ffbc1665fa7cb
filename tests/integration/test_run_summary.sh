#!/bin/sh
# strata run's summary on the DeepSeek-V4 and V4.1 fixtures (needs
# ../shared): the figures these models produce are not printed as zeros.
# It used to say "dense 0 B, LM head 0 B", "expert stall 0.0%" despite
# misses, and on V4.1 "prefetch 0 loads from 0 hints" (its step-named
# hints were not counted).  Checks, for each model, greedy, 8 tokens with
# --ignore-eos (so 8 evaluations: the prompt, then 7 decode steps, each
# making the logits of one position):
#  - LM head bytes = 8 x vocab x hidden x 4 (reference mode keeps the head
#    in F32), vocab and hidden from config.json, within the summary's
#    rounding (0.01 MiB);
#  - dense bytes > 0;
#  - with misses > 0: expert stall > 0 ms/token;
#  - hints > 0 (V4: hash-routed layers; V4.1: step-named hints).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
PY=/usr/bin/python3
[ -d "$SHARED/fixtures/models/tiny-deepseek-v41" ] ||
	{ echo "SKIP: $SHARED/fixtures not found (needs ../shared)"; exit 77; }
TMP=$(mktemp -d /tmp/strata-runsum-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
fail=0
for m in v4 v41; do
	MD="$SHARED/fixtures/models/tiny-deepseek-$m"
	extra=""
	[ $m = v41 ] && extra="--engram-cache 1MiB"
	# shellcheck disable=SC2086
	timeout 120 "$STRATA" run --model "$MD" --store "$TMP/store-$m" \
		--prompt "Hello world" --max-tokens 8 --ignore-eos $extra \
		--instance "rs$m$$" --run-dir "$TMP/run-$m" \
		>"$TMP/out-$m" 2>"$TMP/err-$m"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "FAIL: $m: strata run exited $rc"; cat "$TMP/err-$m"; fail=1
		continue
	fi
	$PY - "$MD/config.json" "$TMP/err-$m" "$m" <<'PY' || fail=1
import json, re, sys
cfg = json.load(open(sys.argv[1]))
cfg = cfg.get("text_config", cfg)  # V4.1 nests it
txt = open(sys.argv[2]).read()
name = sys.argv[3]
units = {"B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}
def size(s):
    v, u = s.split()
    return float(v) * units[u]
w = re.search(r"weights read +experts (\S+ \S+), dense (\S+ \S+), LM head (\S+ \S+)", txt)
pool = re.search(r"expert pool +hits (\d+), misses (\d+)", txt)
st = re.search(r"expert stall +([\d.]+)% of compute time, ([\d.]+) ms/token", txt)
pf = re.search(r"prefetch +(\d+) loads from (\d+) hints", txt)
if not (w and pool and st and pf):
    print("FAIL:", name, "summary lines missing:\n" + txt); sys.exit(1)
bad = 0
head = size(w.group(3))
want = 8 * cfg["vocab_size"] * cfg["hidden_size"] * 4
if abs(head - want) > 0.01 * (1 << 20):
    print("FAIL: %s: LM head %s, want %d B" % (name, w.group(3), want)); bad = 1
if size(w.group(2)) <= 0:
    print("FAIL: %s: dense %s" % (name, w.group(2))); bad = 1
if int(pool.group(2)) > 0 and float(st.group(2)) <= 0:
    print("FAIL: %s: %s misses but expert stall %s ms/token" %
          (name, pool.group(2), st.group(2))); bad = 1
if int(pf.group(2)) <= 0:
    print("FAIL: %s: prefetch hints %s" % (name, pf.group(2))); bad = 1
print("%s: dense %s, LM head %s (want %d B), misses %s, stall %s ms/token, "
      "%s hints" % (name, w.group(2), w.group(3), want, pool.group(2),
                    st.group(2), pf.group(2)))
sys.exit(bad)
PY
done

# --prefetch-depth reaches V4.1's gate look-ahead (it was dropped for
# DeepSeek stores): the same run with depth 2 hints strictly more experts
# than the default (0: step-named hints only)
MD="$SHARED/fixtures/models/tiny-deepseek-v41"
if timeout 120 "$STRATA" run --model "$MD" --store "$TMP/store-v41" \
	--prompt "Hello world" --max-tokens 8 --ignore-eos \
	--engram-cache 1MiB --prefetch-depth 2 --instance "rsd$$" \
	--run-dir "$TMP/run-d2" >"$TMP/out-d2" 2>"$TMP/err-d2"; then
	h0=$(sed -n 's/.*prefetch *[0-9]* loads from \([0-9]*\) hints.*/\1/p' "$TMP/err-v41")
	h2=$(sed -n 's/.*prefetch *[0-9]* loads from \([0-9]*\) hints.*/\1/p' "$TMP/err-d2")
	if [ -z "$h0" ] || [ -z "$h2" ] || [ "$h2" -le "$h0" ]; then
		echo "FAIL: v41 --prefetch-depth 2: $h2 hints, default $h0 (want more)"
		fail=1
	else
		echo "v41: $h2 hints with --prefetch-depth 2, $h0 without"
	fi
else
	echo "FAIL: strata run --prefetch-depth 2 on V4.1 failed"; cat "$TMP/err-d2"
	fail=1
fi
exit $fail
