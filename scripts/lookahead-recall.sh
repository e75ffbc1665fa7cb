#!/bin/sh
# Gate look-ahead recall per look-ahead distance d = 1, 2, 3: the share of
# the experts the router of layer L+d chose that the look-ahead predicted
# when it applied that router to the hidden state at layer L (computed
# --lookahead-measure).  Measured by `strata perplexity` (teacher-forced
# text, windows of 256 tokens) on the trained kjv-moe fixture (real
# routing) and on the tiny random fixtures, with BF16 experts.
#
# usage: scripts/lookahead-recall.sh [BUILD_DIR] [TEXT]
#   BUILD_DIR default build; TEXT default models/kjv-moe/valid-small.txt
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$SRC/build}
TEXT=${2:-$SRC/models/kjv-moe/valid-small.txt}
SHARED=${STRATA_SHARED_DIR:-$SRC/../shared}
STRATA="$BUILD/cli/strata"
TMP=$(mktemp -d /tmp/strata-la-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export STRATA_CACHE_DIR="${STRATA_CACHE_DIR:-$TMP/cache}"

printf '%-16s %6s %6s  %-8s %-8s %-8s  %s\n' model layers experts "d=1" "d=2" \
	"d=3" "(top-k; random guess k/E)"
for m in "$SRC/models/kjv-moe" "$SHARED/fixtures/models/tiny-mixtral" \
	 "$SHARED/fixtures/models/tiny-qwen3moe"; do
	[ -d "$m" ] || { echo "skip $m (absent)"; continue; }
	name=$(basename "$m")
	"$STRATA" perplexity --model "$m" --experts bf16 --file "$TEXT" \
		--lookahead-measure --prefetch-depth 3 --json \
		>"$TMP/$name.json" 2>"$TMP/$name.err" ||
		{ echo "$name: strata perplexity failed:"; tail -5 "$TMP/$name.err"; continue; }
	/usr/bin/python3 - "$TMP/$name.json" "$m/config.json" "$name" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
c = json.load(open(sys.argv[2]))
E = c.get("num_local_experts", c.get("num_experts"))
k = c["num_experts_per_tok"]
la = j["tiers"]["lookahead_recall"]
f = lambda x: "%.1f%%" % (100 * x) if x is not None else "n/a"
print("%-16s %6d %6d  %-8s %-8s %-8s  (k=%d; %.1f%%)" % (sys.argv[3], c["num_hidden_layers"], E,
      f(la[0]), f(la[1]), f(la[2]), k, 100.0 * k / E))
PY
done
