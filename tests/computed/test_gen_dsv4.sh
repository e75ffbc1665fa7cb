#!/bin/sh
# test_gen_dsv4.sh — scripts/gen-dsv4-model.py --small writes a V4
# checkpoint in the official layout that strata convert stores, strata
# verify accepts, and cw_dsv loads and runs (test_dsv_fast v4 DIR: fast mode
# through a real expertd against reference mode, its tolerance); the same
# seed writes byte-identical files, another seed different ones; --layers /
# --experts / --fraction give the sizes they say (--dry-run).
#
# Usage: test_gen_dsv4.sh TEST_DSV_FAST STRATA
# Skips (77) without numpy or the tokenizer fixture, unless CI=true.
set -u

skip() {
	if [ "${CI:-}" = "true" ]; then
		echo "FAIL: $1 (required under CI)" >&2
		exit 1
	fi
	echo "SKIP: $1" >&2
	exit 77
}
fail() { echo "FAIL: $*" >&2; exit 1; }

test_fast=$1
strata=$2
src=${STRATA_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
shared=${STRATA_SHARED_DIR:-$src/../shared}
py=/usr/bin/python3
gen=$src/scripts/gen-dsv4-model.py
tokdir=$shared/fixtures/models/tiny-deepseek-v4

[ -x "$py" ] || skip "$py is absent"
"$py" -c 'import numpy' 2>/dev/null || skip "$py has no numpy"
[ -f "$tokdir/tokenizer.json" ] || skip "fixture $tokdir is absent"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-gendsv4.XXXXXX") || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too

"$py" "$gen" --small --out "$tmp/m" --tokenizer-from "$tokdir" ||
	fail "gen-dsv4-model.py --small"
"$py" "$gen" --small --out "$tmp/m2" --tokenizer-from "$tokdir" ||
	fail "gen-dsv4-model.py --small (again)"
cmp -s "$tmp/m/model.safetensors" "$tmp/m2/model.safetensors" ||
	fail "the same seed wrote different bytes"
"$py" "$gen" --small --out "$tmp/m3" --seed 7 --tokenizer-from "$tokdir" ||
	fail "gen-dsv4-model.py --seed 7"
cmp -s "$tmp/m/model.safetensors" "$tmp/m3/model.safetensors" &&
	fail "another seed wrote the same bytes"
rm -rf "$tmp/m2" "$tmp/m3"
"$py" "$gen" --small --out "$tmp/m" 2>/dev/null &&
	fail "an existing checkpoint was overwritten without --force"

# real shapes: 12.75 MiB per expert record; sizes as asked
out=$("$py" "$gen" --out "$tmp/x" --dry-run --layers 6 --experts 64 2>&1) ||
	fail "--dry-run"
echo "$out"
echo "$out" | grep -q "6 layers x 64 experts (384 routed experts, top-6), hidden 4096" ||
	fail "--layers 6 --experts 64: $out"
echo "$out" | grep -q "expert record 13369344 B (12.75 MiB)" ||
	fail "real expert record size: $out"
out=$("$py" "$gen" --out "$tmp/x" --dry-run --fraction 0.25 --layers 43 2>&1) ||
	fail "--fraction"
echo "$out" | grep -q "43 layers x 64 experts" || fail "--fraction 0.25 --layers 43: $out"

"$strata" convert --model "$tmp/m" --out "$tmp/store" >/dev/null ||
	fail "strata convert of the generated model"
"$strata" verify "$tmp/store" >/dev/null || fail "strata verify"
"$test_fast" v4 "$tmp/m" || fail "test_dsv_fast v4 on the generated model"
echo "ok: generated V4 checkpoint converts, verifies and runs"
