#!/bin/sh
# Expert tiers through the CLI on kjv-moe (BF16 experts, greedy, reference
# mode):
#  - identical greedy tokens at host budgets 100 / 50 / 25 % with prefetch
#    on (depth 2 and 3), off, LRU and LFRU eviction and a pinned hot set;
#  - prefetch happens at 25 % (loads from hints, precision and recall in
#    (0, 1]) and not at all with --no-prefetch;
#  - activation statistics are saved in --state-dir, survive a restart
#    (the second run adds its tokens to the first's) and rank a hot set
#    that the restarted expertd pins (12 experts for 2 per layer);
#  - the routing recorder writes the real routing: on valid-small.txt it
#    equals the fixture's routing-valid-small.jsonl wherever the fixture's
#    gap is at least 1e-4, weights within 1e-3;
#  - expertd's start-up warnings reach strata run's stderr;
#  - forced routing: with --route-trace, the recorded routing is the
#    trace's, and the output changes; with --lookahead-oracle the
#    look-ahead predicts it exactly (recall 1 at d = 1..3).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
ROUTING="$SHARED/fixtures/models/kjv-moe/routing-valid-small.jsonl"
PY=/usr/bin/python3
if [ ! -f "$ROUTING" ]; then
	if [ -n "${CI:-}" ] && [ "${CI:-}" != "false" ]; then
		echo "FAIL: fixture $ROUTING missing"; exit 1
	fi
	echo "SKIP: $ROUTING not found (needs ../shared)"; exit 77
fi
TMP=$(mktemp -d /tmp/strata-tiers-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
export STRATA_CACHE_DIR="$TMP/cache"
PROMPT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'][4]['text'], end='')" "$KJV/reference.json")
fail=0

run() { # name, args...
	name=$1; shift
	"$STRATA" run --model "$KJV" --store "$TMP/kjv-bf16" --experts bf16 \
		--prompt "$PROMPT" --max-tokens 32 --ignore-eos --json \
		--instance "tt$$$name" --run-dir "$TMP/run-$name" "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "FAIL: strata run ($name) exited $rc"; cat "$TMP/$name.err"; fail=1
	fi
}
acts() { # output file
	"$STRATA" activations --state-dir "$TMP/state" --json >"$1" 2>"$1.err" ||
		{ echo "FAIL: strata activations"; cat "$1.err"; fail=1; }
}

run full --host-budget 100% --no-prefetch
run h50 --host-budget 50%
run h25 --host-budget 25% --prefetch-depth 2 --lookahead-measure
run h25np --host-budget 25% --no-prefetch
run h25lru --host-budget 25% --evict lru --prefetch-depth 3 \
	--state-dir "$TMP/state"
acts "$TMP/acts1"
# --png with a quote in the file name (gnuplot-nox is installed by
# scripts/setup-debian.sh): a PNG is written under exactly that name
png="$TMP/it's a map.png"
if "$STRATA" activations --state-dir "$TMP/state" --png "$png" \
	>"$TMP/png.out" 2>"$TMP/png.err" &&
   [ "$(head -c 4 "$png" | od -An -c | tr -d ' ')" = "211PNG" ]; then
	echo "ok: activations --png wrote a PNG named with a quote"
else
	echo "FAIL: activations --png '$png'"; cat "$TMP/png.err"; fail=1
fi
# a path that cannot be written: exit 1 naming it, and no PNG on stdout
# (gnuplot falls back to stdout when its output cannot be opened)
"$STRATA" activations --state-dir "$TMP/state" --png "$TMP/no/such/dir.png" \
	>"$TMP/png2.out" 2>"$TMP/png2.err"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "no/such/dir.png" "$TMP/png2.err" ||
   grep -q "PNG" "$TMP/png2.out"; then
	echo "FAIL: activations --png into a missing directory: rc $rc"
	cat "$TMP/png2.err"; fail=1
else
	echo "ok: activations --png into a missing directory: exit 1, no PNG on stdout"
fi
run h25hot --host-budget 25% --hot-experts 2 --state-dir "$TMP/state"
acts "$TMP/acts2"
# a hot set that does not fit: expertd's start-up warning reaches the user
# of strata run (it used to sit in expertd.log only)
run hotbig --host-budget 25% --hot-experts 64 --state-dir "$TMP/state"
if grep -q "strata: expertd warns: --hot-experts 64 per layer does not fit" \
	"$TMP/hotbig.err"; then
	echo "ok: strata run shows expertd's hot-set warning"
else
	echo "FAIL: no hot-set warning from strata run:"; cat "$TMP/hotbig.err"
	fail=1
fi
[ $fail -eq 0 ] || exit 1

# recorder against the fixture's real routing, and forced routing
"$STRATA" perplexity --model "$KJV" --store "$TMP/kjv-bf16" --experts bf16 \
	--file "$KJV/valid-small.txt" --host-budget 50% \
	--route-record "$TMP/rec.jsonl" --instance "tt$$ppl" \
	--run-dir "$TMP/run-ppl" >"$TMP/ppl.out" 2>"$TMP/ppl.err" ||
	{ echo "FAIL: strata perplexity --route-record"; cat "$TMP/ppl.err"; exit 1; }
# its tier lines count the scored tokens (they read 0 KiB/token when
# SCORE's tokens were not counted): loads > 0 and KiB/token > 0
if grep -q "^NVMe tier" "$TMP/ppl.out"; then
	grep "^NVMe tier" "$TMP/ppl.out" | grep -qv " 0 KiB/token" ||
		{ echo "FAIL: perplexity tier line: $(grep '^NVMe' "$TMP/ppl.out")"; fail=1; }
else
	echo "FAIL: perplexity printed no tier lines"; cat "$TMP/ppl.out"; fail=1
fi
$PY - "$ROUTING" "$TMP/forced.jsonl" <<'PY' || exit 1
import json, sys
# a routing no router would choose: expert (e + 5) % 16 for e of the fixture
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r["pos"] >= 64: break
        f.write(json.dumps({"pos": r["pos"], "layer": r["layer"],
                            "experts": [(e + 5) % 16 for e in r["experts"]],
                            "weights": r["weights"]}) + "\n")
PY
run forced --host-budget 25% --route-trace "$TMP/forced.jsonl" \
	--route-record "$TMP/forced-rec.jsonl" --lookahead-oracle --lookahead-measure

$PY - "$TMP" "$ROUTING" <<'PY' || fail=1
import json, sys
T, routing = sys.argv[1], sys.argv[2]
ok = True
def bad(*a):
    global ok; ok = False; print("FAIL:", *a)
def load(n):
    return json.loads(open("%s/%s.out" % (T, n)).read().strip().splitlines()[-1])
R = {n: load(n) for n in ["full", "h50", "h25", "h25np", "h25lru", "h25hot", "forced"]}
for n in ["h50", "h25", "h25np", "h25lru", "h25hot"]:
    if R[n]["ids"] != R["full"]["ids"]: bad(n, "greedy ids differ from the full budget")
t = R["h25"]["tiers"]
if not (t["prefetch_loads"] > 0 and t["hints"] > 0): bad("no prefetch at 25%", t)
if not (0 < t["prefetch_precision"] <= 1 and 0 < t["prefetch_recall"] <= 1): bad("precision/recall", t)
if R["h25"]["expert_pool"]["evictions"] <= 0: bad("no evictions at 25%")
la = t["lookahead_recall"]
if not all(x is not None and 0 < x <= 1 for x in la): bad("look-ahead recall", la)
n = R["h25np"]["tiers"]
if n["prefetch_loads"] != 0 or n["hints"] != 0: bad("--no-prefetch still prefetched", n)
if R["h25hot"]["tiers"]["hot_slots"] != 12: bad("hot set of", R["h25hot"]["tiers"]["hot_slots"], "not 12")
a1 = json.load(open(T + "/acts1")); a2 = json.load(open(T + "/acts2"))
per_run = R["full"]["prompt_tokens"] + R["full"]["generated_tokens"] - 1
if a1["tokens"] != per_run: bad("statistics after one run: %d tokens, expected %d" % (a1["tokens"], per_run))
if a2["tokens"] != 2 * per_run: bad("statistics did not survive the restart: %d tokens, expected %d" % (a2["tokens"], 2 * per_run))
if abs(sum(a1["counts"][0]) - sum(a1["counts"][5])) > 1e-9 or sum(a1["counts"][0]) <= 0: bad("layer totals", a1["counts"])
# recorder vs fixture: windows of 256 restart pos at 0
fix = {}
for line in open(routing):
    r = json.loads(line); fix[(r["pos"], r["layer"])] = r
win, last, n_cmp, n_diff = -1, None, 0, 0
seen = set()
for line in open(T + "/rec.jsonl"):
    r = json.loads(line)
    if r["pos"] == 0 and r["layer"] == 0 and (0, 0) in seen or win < 0:
        win += 1; seen = set()
    seen.add((r["pos"], r["layer"]))
    f = fix.get((256 * win + r["pos"], r["layer"]))
    if f is None: bad("recorded position", r, "not in the fixture"); break
    n_cmp += 1
    if sorted(r["experts"]) != sorted(f["experts"]):
        if f["gap"] >= 1e-4: n_diff += 1
        continue
    if max(abs(a - b) for a, b in zip(r["weights"], f["weights"])) > 1e-3 and r["experts"] == f["experts"]:
        bad("weights differ", r, f); break
if n_cmp != len(fix): bad("recorded %d routing decisions, fixture has %d" % (n_cmp, len(fix)))
if n_diff: bad("%d routing decisions differ from the fixture where its gap >= 1e-4" % n_diff)
# forced routing: the recorded routing is the trace's
forced = {}
for line in open(T + "/forced.jsonl"):
    r = json.loads(line); forced[(r["pos"], r["layer"])] = r["experts"]
n_forced = 0
for line in open(T + "/forced-rec.jsonl"):
    r = json.loads(line)
    want = forced.get((r["pos"], r["layer"]))
    if want is None: continue
    n_forced += 1
    if r["experts"] != want: bad("forced routing not applied at", r); break
if n_forced < 6 * 40: bad("only %d forced decisions recorded" % n_forced)
if R["forced"]["ids"] == R["full"]["ids"]: bad("forced routing did not change the output")
# the oracle look-ahead hints the trace itself: every prediction comes true
if R["forced"]["tiers"]["lookahead_recall"] != [1.0, 1.0, 1.0]:
    bad("oracle look-ahead recall", R["forced"]["tiers"]["lookahead_recall"], "not 1")
print("tiers: ids equal at 100/50/25%% (prefetch on/off, lru/lfru, hot set); 25%%: %d prefetch loads, "
      "precision %.2f recall %.2f, look-ahead recall d=1..3 %s; statistics %d -> %d tokens over a restart; "
      "recorder = fixture on %d decisions; %d forced decisions applied" %
      (t["prefetch_loads"], t["prefetch_precision"], t["prefetch_recall"],
       ["%.2f" % x for x in la], a1["tokens"], a2["tokens"], n_cmp, n_forced))
sys.exit(0 if ok else 1)
PY
exit $fail
