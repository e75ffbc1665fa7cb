#!/bin/sh
# strata run --timeline FILE (issue 25) on the kjv-moe fixture at a 50 %
# expert budget, greedy, 16 tokens with --ignore-eos: computed writes one
# TSV row per forward step (the prompt, then 15 decode steps).  Checks:
#  - 23 named columns, 16 rows (1 prefill + 15 decode);
#  - every time column >= 0, per step they never exceed the wall time,
#    and over the run they add up to it within 5 % ("other", what no
#    counter explains, is small);
#  - dense, experts and head took time in every step;
#  - at 50 % the first steps wait for demand loads: stall_demand > 0 and
#    expertd loaded records (loads > 0, loader CPU > 0) during the run;
#  - strata run says where the timeline is.
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
PY=/usr/bin/python3
MD="$SHARED/fixtures/models/kjv-moe"
[ -d "$MD" ] || { echo "SKIP: $MD not found (needs ../shared)"; exit 77; }
TMP=$(mktemp -d /tmp/strata-runtl-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
timeout 120 "$STRATA" run --model "$MD" --store "$TMP/store" \
	--prompt "In the beginning" --max-tokens 16 --ignore-eos \
	--host-budget 50% --timeline "$TMP/tl.tsv" \
	--instance "rtl$$" --run-dir "$TMP/run" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 0 ]; then
	echo "FAIL: strata run exited $rc"; cat "$TMP/err"; exit 1
fi
grep -q "step timeline of 16 steps in $TMP/tl.tsv" "$TMP/err" ||
	{ echo "FAIL: no note of the timeline"; tail -3 "$TMP/err"; exit 1; }
exec $PY - "$TMP/tl.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
head, rows = rows[0], rows[1:]
fail = 0
def bad(msg):
    global fail
    print("FAIL:", msg)
    fail = 1
if len(head) != 23 or head[:4] != ["run", "pass", "token", "wall_ms"]:
    bad("header %r" % head)
if len(rows) != 16:
    bad("%d rows, want 16" % len(rows))
tcols = ["dense_ms", "experts_ms", "head_ms", "stall_demand_ms",
         "stall_inflight_ms", "ipc_ms", "kv_ms"]
ix = {n: i for i, n in enumerate(head)}
for r in rows:
    if len(r) != len(head):
        bad("row %r" % r)
        continue
    v = {n: float(r[ix[n]]) for n in head[3:]}
    s = sum(v[n] for n in tcols)
    if any(v[n] < 0 for n in tcols):
        bad("step %s: a negative column %r" % (r[2], v))
    if s > v["wall_ms"] + 0.01 or v["other_ms"] < -0.01:
        bad("step %s: columns %.3f ms, wall %.3f ms, other %.3f ms"
            % (r[2], s, v["wall_ms"], v["other_ms"]))
    if min(v["dense_ms"], v["experts_ms"], v["head_ms"]) <= 0:
        bad("step %s: dense/experts/head %r" % (r[2], v))
passes = [r[1] for r in rows]
if passes[0] != "prefill" or set(passes[1:]) != {"decode"}:
    bad("passes %r" % passes)
tot = lambda n: sum(float(r[ix[n]]) for r in rows)
# within 5 % over the run (one step may lose a slice of CPU between its
# snapshot and its first phase on a loaded machine)
if tot("other_ms") > 0.05 * tot("wall_ms"):
    bad("other %.3f ms of %.3f ms" % (tot("other_ms"), tot("wall_ms")))
if tot("stall_demand_ms") <= 0 or tot("loads") <= 0 or \
   tot("loader_cpu_ms") <= 0:
    bad("at 50 %%: stall %.3f ms, loads %d, loader CPU %.3f ms"
        % (tot("stall_demand_ms"), tot("loads"), tot("loader_cpu_ms")))
print("%d steps: wall %.2f ms, other %.3f ms, demand stall %.2f ms, %d loads"
      % (len(rows), tot("wall_ms"), tot("other_ms"),
         tot("stall_demand_ms"), tot("loads")))
sys.exit(fail)
PY
