#!/bin/sh
# check-bitident.sh — greedy token ids and logits bytes of every fixture
# model, saved once and compared after a change that must not change them
# (issue 21: a refactoring is bit-identical).
#
# Usage: scripts/check-bitident.sh save DIR     write the dumps into DIR
#        scripts/check-bitident.sh compare DIR  dump again into a temp dir,
#                                               compare with DIR byte for byte
#
# What is dumped (tests/tools/bitident_dump.c): for each prompt of a
# model's reference.json, the prompt and 12 free-running greedy ids, and
# the logits rows at prompt positions 0 and n-1 and at the first and last
# greedy step.  Models: tiny-qwen3moe, tiny-mixtral, kjv-moe (expert
# formats BF16 and MXFP4 in reference mode, MXFP4 in fast mode, through
# real expertd and kvd), tiny-deepseek-v4 (exact math, QAT, fast exact),
# tiny-deepseek-v41 (KV QAT, no QAT, fast KV QAT: flags set explicitly,
# not the load defaults, which issue 28 made the official math), and
# with numpy the generated
# models of scripts/gen-moe-model.py and gen-dsv4-model.py (fixed seeds).
# Needs a built tree (scripts/build.sh) and ../shared.
# Exit: 0 (compare: every file identical), 1 (a difference, a missing
# file, a failed dump), 77 without ../shared.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=${STRATA_BUILD_DIR:-$src/build}
shared=${STRATA_SHARED_DIR:-$src/../shared}
dump=$build/tests/tools/bitident_dump

usage() { echo "usage: $0 save|compare DIR" >&2; exit 1; }
[ $# -eq 2 ] || usage
mode=$1
dir=$2
case $mode in save|compare) ;; *) usage ;; esac
[ -d "$shared/fixtures/models" ] || { echo "SKIP: $shared/fixtures absent" >&2; exit 77; }
[ -x "$dump" ] || { echo "$dump missing: run scripts/build.sh" >&2; exit 1; }
export STRATA_SHARED_DIR="$shared" STRATA_SOURCE_DIR="$src" STRATA_BUILD_DIR="$build"
export STRATA_LOG=${STRATA_LOG:-warn}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-bitident.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ "$mode" = save ]; then
	mkdir -p "$dir"
	out=$dir
else
	[ -d "$dir" ] || { echo "$dir: no saved dumps" >&2; exit 1; }
	out=$tmp/now
	mkdir -p "$out"
fi

run() { # KIND MODEL_DIR NAME
	"$dump" "$1" "$2" "$out/$3" >"$tmp/log" 2>&1 || {
		cat "$tmp/log" >&2
		echo "FAIL: bitident_dump $1 $2" >&2
		exit 1
	}
	echo "dumped $3"
}

fx=$shared/fixtures/models
for m in tiny-qwen3moe tiny-mixtral; do
	for k in f32 mxfp4 fast; do
		run "moe-$k" "$fx/$m" "$m-$k"
	done
done
for k in f32 mxfp4 fast; do
	run "moe-$k" "$src/models/kjv-moe" "kjv-moe-$k"
done
for k in dsv4 dsv4-qat dsv4-fast; do
	run "$k" "$fx/tiny-deepseek-v4" "tiny-deepseek-v4-$k"
done
for k in dsv41 dsv41-noqat dsv41-fast; do
	run "$k" "$fx/tiny-deepseek-v41" "tiny-deepseek-v41-$k"
done
if /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
	/usr/bin/python3 "$src/scripts/gen-moe-model.py" --preset small \
		--out "$tmp/gen-moe" >/dev/null
	run moe-mxfp4 "$tmp/gen-moe" gen-moe-mxfp4
	/usr/bin/python3 "$src/scripts/gen-dsv4-model.py" --small \
		--out "$tmp/gen-dsv4" --tokenizer-from "$fx/tiny-deepseek-v4" >/dev/null
	run dsv4 "$tmp/gen-dsv4" gen-dsv4
else
	echo "generated models skipped: /usr/bin/python3 has no numpy"
fi

[ "$mode" = save ] && { echo "saved $(ls "$dir" | wc -l) files in $dir"; exit 0; }
same=0
differ=0
for f in "$dir"/*; do
	b=$(basename "$f")
	if cmp -s "$f" "$out/$b"; then
		same=$((same + 1))
	else
		differ=$((differ + 1))
		echo "DIFFERS: $b" >&2
	fi
done
for f in "$out"/*; do
	[ -e "$dir/$(basename "$f")" ] || { differ=$((differ + 1)); echo "NEW: $(basename "$f")" >&2; }
done
echo "$same files identical, $differ differ"
[ "$differ" -eq 0 ]
