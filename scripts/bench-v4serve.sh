#!/bin/sh
# DeepSeek-V4 served by the three daemons (issue 9): `strata run` greedy on a
# V4 checkpoint at several host budgets; prints TTFT, decode tokens/s and the
# expert pool's hits / misses / evictions and prefetch figures per budget.
# Reference mode (the only V4 mode): figures are of the exact forward pass.
#
# usage: scripts/bench-v4serve.sh [--model DIR] [--tokens N]
#          [--budgets "100 50 25"] [--prompt TEXT]
# The default model is ../shared's tiny-deepseek-v4 (random weights: the
# text is noise; the figures are what this measures).  Stores go to
# $STRATA_CACHE_DIR (default: a temporary directory, removed afterwards).
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
MODEL=${STRATA_SHARED_DIR:-$SRC/../shared}/fixtures/models/tiny-deepseek-v4
TOKENS=64
BUDGETS="100 50 25"
PROMPT="In the small harbour town, the morning ferry left at seven."
STRATA=${STRATA_BUILD_DIR:-$SRC/build}/cli/strata
while [ $# -gt 0 ]; do
	case $1 in
	--model) MODEL=$2; shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--budgets) BUDGETS=$2; shift 2 ;;
	--prompt) PROMPT=$2; shift 2 ;;
	-h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-v4serve: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ -x "$STRATA" ] || { echo "bench-v4serve: build first ($STRATA missing)" >&2; exit 1; }
[ -f "$MODEL/config.json" ] || { echo "bench-v4serve: no model at $MODEL" >&2; exit 1; }
TMP=$(mktemp -d /tmp/strata-v4bench-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export STRATA_CACHE_DIR="${STRATA_CACHE_DIR:-$TMP/cache}"
printf '%-7s %9s %9s %7s %7s %9s %9s %9s\n' budget "TTFT ms" "tok/s" hits \
	misses evictions "prefetch" "recall"
for b in $BUDGETS; do
	"$STRATA" run --model "$MODEL" --prompt "$PROMPT" --max-tokens "$TOKENS" \
		--ignore-eos --host-budget "$b%" --json --quiet \
		--instance "v4b$$" --run-dir "$TMP/run-$b" >"$TMP/$b.json" \
		2>"$TMP/$b.err" ||
		{ echo "bench-v4serve: strata run at $b% failed:" >&2; cat "$TMP/$b.err" >&2; exit 1; }
	/usr/bin/python3 - "$TMP/$b.json" "$b" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p, t = j["expert_pool"], j["tiers"]
rec = t.get("prefetch_recall")
print("%-7s %9.1f %9.1f %7d %7d %9d %9d %9s" % (
    sys.argv[2] + "%", j["ttft_ms"], j["decode_tokens_per_s"], p["hits"],
    p["misses"], p["evictions"], t.get("prefetch_loads", 0),
    "-" if rec is None else "%.2f" % rec))
PY
done
echo "(prompt of $(/usr/bin/python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])['prompt_tokens'])" "$TMP/$(echo $BUDGETS | cut -d' ' -f1).json") tokens, $TOKENS new, greedy, reference mode)"
