#!/bin/sh
# Integration test of the main job: `strata run` converts a fixture, starts
# expertd, kvd and computed on a private instance, generates, stops them.
# Checks (reference mode, experts kept BF16, greedy):
#  - the generated ids equal the fixture's greedy reference (tiny-mixtral
#    greedy_f32 of prompt 0; kjv-moe greedy_ids of prompt 5);
#  - nothing is left behind: no /dev/shm/strata.<instance>.* segment, no
#    socket or pid file in the run dir, no daemon process;
#  - with a host budget of 25 % of the experts (kjv-moe) the output is
#    identical to the full budget, evictions happen, the host pool segment
#    stays within the budget (plus its tables, a few KiB) and computed's
#    peak RSS shrinks by at least half of the expert bytes the smaller pool
#    leaves out (computed reads experts only from the pool).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
PY=/usr/bin/python3
if [ ! -d "$SHARED/fixtures/models/tiny-mixtral" ]; then
	if [ -n "${CI:-}" ] && [ "${CI:-}" != "false" ]; then
		echo "FAIL: fixture $SHARED/fixtures/models/tiny-mixtral missing"; exit 1
	fi
	echo "SKIP: $SHARED/fixtures not found (needs ../shared)"; exit 77
fi
TMP=$(mktemp -d /tmp/strata-int-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
fail=0

check_clean() { # instance run_dir
	n=$(ls /dev/shm 2>/dev/null | grep -c "^strata\.$1\." || true)
	if [ "$n" != "0" ]; then echo "FAIL: $n shm segment(s) left for $1"; fail=1; fi
	for f in "$2"/*.ctl "$2"/*.evt "$2"/*.pid; do
		[ -e "$f" ] && { echo "FAIL: left behind: $f"; fail=1; }
	done
	if pgrep -f -- "--instance $1 " >/dev/null 2>&1; then
		echo "FAIL: a daemon of instance $1 still runs"; fail=1
	fi
}

# 1. tiny-mixtral: text generated through the three daemons equals the reference
inst="ti$$"
PROMPT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'][0]['text'], end='')" "$SHARED/fixtures/models/tiny-mixtral/reference.json")
"$STRATA" run --model "$SHARED/fixtures/models/tiny-mixtral" --store "$TMP/mix-bf16" \
	--experts bf16 --prompt "$PROMPT" --max-tokens 32 --ignore-eos --json \
	--instance "$inst" --run-dir "$TMP/run1" >"$TMP/out1" 2>"$TMP/err1"
rc=$?
if [ $rc -ne 0 ]; then echo "FAIL: strata run exited $rc"; cat "$TMP/err1"; exit 1; fi
$PY - "$TMP/out1" "$SHARED/fixtures/models/tiny-mixtral/reference.json" <<'PY' || fail=1
import json, sys
out = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
ref = json.load(open(sys.argv[2]))["prompts"][0]
want = ref["greedy_f32"]
if out["ids"] != want:
    print("FAIL: tiny-mixtral ids", out["ids"], "!= reference", want); sys.exit(1)
if out["prompt_tokens"] != len(ref["ids"]):
    print("FAIL: prompt tokens", out["prompt_tokens"], "!=", len(ref["ids"])); sys.exit(1)
print("tiny-mixtral: 32 greedy ids equal the reference; TTFT %.1f ms, %.1f tokens/s" %
      (out["ttft_ms"], out["decode_tokens_per_s"]))
PY
check_clean "$inst" "$TMP/run1"

# 2. kjv-moe at full and quarter host budget, experts BF16
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
PROMPT=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'][4]['text'], end='')" "$KJV/reference.json")
for b in 100% 25%; do
	inst="tk$$b${b%\%}"
	"$STRATA" run --model "$KJV" --store "$TMP/kjv-bf16" --experts bf16 \
		--prompt "$PROMPT" --max-tokens 48 --ignore-eos --json --host-budget "$b" \
		--instance "$inst" --run-dir "$TMP/run-$inst" >"$TMP/kjv-$b" 2>"$TMP/kjv-err-$b"
	rc=$?
	if [ $rc -ne 0 ]; then echo "FAIL: strata run (budget $b) exited $rc"; cat "$TMP/kjv-err-$b"; exit 1; fi
	check_clean "$inst" "$TMP/run-$inst"
done
$PY - "$TMP/kjv-100%" "$TMP/kjv-25%" "$KJV/reference.json" "$TMP/kjv-bf16/manifest.json" <<'PY' || fail=1
import json, sys
full = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
q = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
ref = json.load(open(sys.argv[3]))["prompts"][4]
man = json.load(open(sys.argv[4]))
ok = True
def bad(*a):
    global ok; ok = False; print("FAIL:", *a)
if full["ids"] != ref["greedy_ids"]: bad("kjv ids differ from the reference greedy_ids")
if q["ids"] != full["ids"]: bad("25% budget output differs from the full budget")
if q["text"] != full["text"]: bad("25% budget text differs")
if q["expert_pool"]["evictions"] <= 0: bad("no evictions at 25% budget")
if full["expert_pool"]["evictions"] != 0: bad("evictions at full budget")
rec = man["experts"]["record_bytes"] if "record_bytes" in man.get("experts", {}) else None
n_all = 6 * 16
slots = q["expert_pool"]["slots"]
if slots > n_all // 4: bad("25%% budget gave %d slots of %d" % (slots, n_all))
budget = q["expert_pool"]["budget_bytes"]
pool = q["expert_pool"]["pool_bytes"]
# the segment holds the slots (within the budget) plus its tables (a few KiB)
if pool > budget + 64 * 1024: bad("pool segment %d bytes > budget %d + 64 KiB of tables" % (pool, budget))
expert_bytes = full["expert_pool"]["pool_bytes"] - pool
rss_full = full["peak_rss_bytes"]["computed"]; rss_q = q["peak_rss_bytes"]["computed"]
if rss_full - rss_q < expert_bytes // 2:
    bad("computed peak RSS %d (full) vs %d (25%%): shrank by less than half of %d expert bytes" % (rss_full, rss_q, expert_bytes))
print("kjv-moe: full budget ids = reference; 25%%: %d slots, %d evictions, pool %d bytes (budget %d), computed peak RSS %.1f MiB vs %.1f MiB at full budget" %
      (slots, q["expert_pool"]["evictions"], pool, budget, rss_q / 2**20, rss_full / 2**20))
sys.exit(0 if ok else 1)
PY
# `strata info` shows the store's policy and each layer's expert format
"$STRATA" info "$TMP/kjv-bf16" >"$TMP/info" 2>&1 || { echo "FAIL: strata info"; fail=1; }
grep -q "policy: default bf16" "$TMP/info" && grep -q "layer   5  gate bf16, up bf16, down bf16" "$TMP/info" &&
	[ "$(grep -c '^  layer ' "$TMP/info")" = 6 ] || { echo "FAIL: strata info output"; cat "$TMP/info"; fail=1; }

# 3. prefix cache (issue 4): the same long prompt three times through one
# running instance: the second and third reuse the first's full pages and
# give exactly the same tokens as the first and as a run without the cache
inst="tp$$"
# (through a file: the prompt ends with a newline, which $(...) would drop)
$PY -c "import json,sys; open(sys.argv[2], 'w').write(json.load(open(sys.argv[1]))['prompts'][5]['text'])" "$KJV/reference.json" "$TMP/p5.txt"
"$STRATA" up --model "$KJV" --store "$TMP/kjv-bf16" --experts bf16 \
	--instance "$inst" --run-dir "$TMP/run-$inst" >/dev/null 2>"$TMP/up.err" || { echo "FAIL: strata up"; cat "$TMP/up.err"; exit 1; }
for k in 1 2 nocache; do
	extra=""
	[ "$k" = nocache ] && extra=--no-prefix-cache
	"$STRATA" run --instance "$inst" --run-dir "$TMP/run-$inst" --prompt-file "$TMP/p5.txt" \
		--max-tokens 24 --ignore-eos --json $extra >"$TMP/pc-$k" 2>"$TMP/pc-err-$k" || {
		echo "FAIL: strata run (prefix $k)"; cat "$TMP/pc-err-$k"; fail=1; }
done
"$STRATA" down --instance "$inst" --run-dir "$TMP/run-$inst" >/dev/null
check_clean "$inst" "$TMP/run-$inst"
$PY - "$TMP" "$KJV/reference.json" <<'PY' || fail=1
import json, sys
d = sys.argv[1]
def get(n): return json.loads(open(f"{d}/pc-{n}").read().strip().splitlines()[-1])
a, b, n = get("1"), get("2"), get("nocache")
ref = json.load(open(sys.argv[2]))["prompts"][5]["greedy_ids"][:24]
ok = True
def bad(*x):
    global ok; ok = False; print("FAIL:", *x)
if a["ids"] != ref: bad("first run differs from the reference greedy ids")
if b["ids"] != a["ids"] or n["ids"] != a["ids"]: bad("prefix-cache runs differ", a["ids"], b["ids"], n["ids"])
if a["prefix_rows_reused"] != 0: bad("first run reused", a["prefix_rows_reused"])
# 159-token prompt, 16-row pages: 9 full pages (144 rows) are reusable
if b["prefix_rows_reused"] != 144: bad("second run reused", b["prefix_rows_reused"], "rows, expected 144")
if n["prefix_rows_reused"] != 0: bad("--no-prefix-cache reused rows")
print("prefix cache: 144 of 159 prompt rows reused, identical tokens; TTFT %.1f ms cold, %.1f ms warm" % (a["ttft_ms"], b["ttft_ms"]))
sys.exit(0 if ok else 1)
PY
# 4. spill through the CLI (issue 4): a 1 MiB KV pool with a spill file;
# prompt A's cached pages spill while prompt B runs, and come back (verified)
# for A's second run, which reuses them and gives the same tokens
inst="ts$$"
head -c 700 "$KJV/valid-small.txt" >"$TMP/b.txt"
"$STRATA" up --model "$KJV" --store "$TMP/kjv-bf16" --experts bf16 --kv-budget 1MiB \
	--kv-spill-budget 4MiB --instance "$inst" --run-dir "$TMP/run-$inst" >/dev/null 2>"$TMP/up2.err" ||
	{ echo "FAIL: strata up (spill)"; cat "$TMP/up2.err"; exit 1; }
for k in a b a2; do
	f="$TMP/p5.txt"; [ "$k" = b ] && f="$TMP/b.txt"
	"$STRATA" run --instance "$inst" --run-dir "$TMP/run-$inst" --prompt-file "$f" \
		--max-tokens 8 --ignore-eos --json >"$TMP/sp-$k" 2>"$TMP/sp-err-$k" || {
		echo "FAIL: strata run (spill $k)"; cat "$TMP/sp-err-$k"; fail=1; }
done
"$STRATA" down --instance "$inst" --run-dir "$TMP/run-$inst" >/dev/null
check_clean "$inst" "$TMP/run-$inst"
$PY - "$TMP" <<'PY' || fail=1
import json, sys
d = sys.argv[1]
def get(n): return json.loads(open(f"{d}/sp-{n}").read().strip().splitlines()[-1])
a, b, a2 = get("a"), get("b"), get("a2")
ok = True
def bad(*x):
    global ok; ok = False; print("FAIL:", *x)
if a2["ids"] != a["ids"]: bad("tokens differ after spill/restore")
if b["kv_pages_spilled"] + a2["kv_pages_spilled"] == 0: bad("nothing spilled")
if a2["kv_pages_restored"] == 0 or a2["prefix_rows_reused"] != 144: bad("no restore/reuse", a2)
print("spill: %d pages spilled, %d restored, 144 cached rows reused, same tokens" %
      (b["kv_pages_spilled"] + a2["kv_pages_spilled"], a2["kv_pages_restored"]))
sys.exit(0 if ok else 1)
PY
exit $fail
