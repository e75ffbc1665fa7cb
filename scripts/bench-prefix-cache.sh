#!/bin/sh
# Prefix-cache benchmark (issue 4): N requests that share a long prefix
# (>= 1k tokens) through one running instance of the large generated model;
# prints TTFT with the cache cold (first request) and warm (the others), and
# the ratio.  Reference mode; experts MXFP4.
#   scripts/bench-prefix-cache.sh [MODEL_DIR] [N]
# MODEL_DIR defaults to bench-models/qwen3moe-large (make it with
# /usr/bin/python3 scripts/gen-moe-model.py --out bench-models/qwen3moe-large).
set -eu
cd "$(dirname "$0")/.."
MODEL=${1:-bench-models/qwen3moe-large}
N=${2:-4}
S=./build/cli/strata
INST=prefix-bench-$$
TMP=$(mktemp -d)
trap '$S down --instance $INST --run-dir "$TMP/run" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
# a shared prefix of about 1100 tokens, then a different question each time
/usr/bin/python3 - "$TMP" "$N" <<'PY'
import sys
words = ("the expert router sends every token to a few experts and the rest stay "
         "cold in host memory or on the drive while the model writes ").split()
prefix = " ".join(words[i % len(words)] for i in range(1000))
for i in range(int(sys.argv[2])):
    open(f"{sys.argv[1]}/p{i}.txt", "w").write(prefix + f" question {i}: why?")
PY
$S up --model "$MODEL" --instance $INST --run-dir "$TMP/run" --kv-budget 2GiB >/dev/null
for i in $(seq 0 $((N - 1))); do
	$S run --instance $INST --run-dir "$TMP/run" --prompt-file "$TMP/p$i.txt" --max-tokens 4 \
		--ignore-eos --json --quiet 2>/dev/null | tail -1 >"$TMP/r$i.json"
done
/usr/bin/python3 - "$TMP" "$N" <<'PY'
import json, sys, statistics
rs = [json.load(open(f"{sys.argv[1]}/r{i}.json")) for i in range(int(sys.argv[2]))]
cold = rs[0]["ttft_ms"]; warm = [r["ttft_ms"] for r in rs[1:]]
print(f"prompt {rs[0]['prompt_tokens']} tokens; prefix rows reused per warm request: "
      f"{[r['prefix_rows_reused'] for r in rs[1:]]}")
print(f"TTFT cold {cold:.1f} ms; warm median {statistics.median(warm):.1f} ms "
      f"({min(warm):.1f}..{max(warm):.1f}); cold/warm = {cold / statistics.median(warm):.1f}x")
PY
