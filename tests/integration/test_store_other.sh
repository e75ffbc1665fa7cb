#!/bin/sh
# `--model A --store S` where S holds another model's store (issue 20,
# section 4): strata run and strata up refuse, naming both models and
# --force, and leave S as it was (they used to delete it and convert A in
# its place); with --force, run replaces it; a store of A itself is used.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-qwen3moe tiny-mixtral
A="$FIXTURES/tiny-qwen3moe" B="$FIXTURES/tiny-mixtral"
TMP=$(mktemp -d /tmp/strata-storeother-XXXXXX)
inst="sto_$$"
trap '"$STRATA" down --instance "$inst" --run-dir "$TMP/run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE
fail=0
S="$TMP/store"
"$STRATA" convert --model "$B" --out "$S" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
sum=$(cat "$S"/* | md5sum)

"$STRATA" run --model "$A" --store "$S" --prompt "In" --max-tokens 1 --quiet \
	>/dev/null 2>"$TMP/err" && { echo "FAIL: run replaced another model's store"; fail=1; }
grep -q "MixtralForCausalLM" "$TMP/err" && grep -q "Qwen3MoeForCausalLM" "$TMP/err" &&
	grep -q -- "--force" "$TMP/err" ||
	{ echo "FAIL: run's refusal does not name both models and --force:"; cat "$TMP/err"; fail=1; }
"$STRATA" up --model "$A" --store "$S" --instance "$inst" --run-dir "$TMP/run" \
	>/dev/null 2>"$TMP/err" && { echo "FAIL: up replaced another model's store"; fail=1; }
grep -q "holds another model" "$TMP/err" ||
	{ echo "FAIL: up's refusal:"; cat "$TMP/err"; fail=1; }
[ "$(cat "$S"/* | md5sum)" = "$sum" ] || { echo "FAIL: the store changed"; fail=1; }

# a store of the model itself is used as it is
"$STRATA" run --model "$B" --store "$S" --prompt "In" --max-tokens 1 --quiet \
	>/dev/null 2>"$TMP/err" || { echo "FAIL: run on the model's own store"; cat "$TMP/err"; fail=1; }
# --force replaces it
"$STRATA" run --model "$A" --store "$S" --force --experts bf16 --prompt "In" \
	--max-tokens 1 --quiet >/dev/null 2>"$TMP/err" ||
	{ echo "FAIL: run --force"; cat "$TMP/err"; fail=1; }
grep -q Qwen3MoeForCausalLM "$S/manifest.json" ||
	{ echo "FAIL: run --force did not convert A into the store"; fail=1; }
[ $fail = 0 ] && echo "ok: another model's store refused by run and up, replaced with --force"
exit $fail
