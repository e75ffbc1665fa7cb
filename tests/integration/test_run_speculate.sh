#!/bin/sh
# strata run --speculate (issue 22) through computed's scheduler, on
# kjv-moe quoting a passage it was given twice (needs ../shared): greedy
# ids identical with --speculate off, ngram:4 and --draft-max 2; with
# drafts, the JSON summary counts verify steps and accepted draft tokens
# (> 0: this prompt's continuation is found in it), tokens per step = 1 +
# accepted / decode steps, and the text summary prints the speculation
# line; --speculate auto:4 (the length priced in step time and expert
# bytes) gives the same ids, a mean draft limit within 0..4 and bytes per
# token of the steps it ran; without drafts every decode step is plain
# (limit 0) with its expert bytes counted; --speculate with a bad value is
# refused (exit 2).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
PY=/usr/bin/python3
MD="$SHARED/fixtures/models/kjv-moe"
[ -d "$MD" ] || { echo "SKIP: $MD not found (needs ../shared)"; exit 77; }
TMP=$(mktemp -d /tmp/strata-runspec-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
P="In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. In the beginning God created the"
fail=0
for sp in "--speculate off" "--speculate ngram:4" "--draft-max 2" \
	"--speculate auto:4"; do
	tag=$(echo "$sp" | tr -dc 'a-z0-9')
	# shellcheck disable=SC2086
	timeout 120 "$STRATA" run --model "$MD" --store "$TMP/store" \
		--prompt "$P" --max-tokens 40 --ignore-eos $sp --json \
		--instance "sp$tag$$" --run-dir "$TMP/run-$tag" \
		>"$TMP/out-$tag" 2>"$TMP/err-$tag"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "FAIL: $sp: strata run exited $rc"; cat "$TMP/err-$tag"
		fail=1
	fi
done
[ $fail -eq 0 ] && $PY - "$TMP" <<'PY' || fail=1
import json, sys
d = sys.argv[1]
def load(tag):
    return json.loads(open(f"{d}/out-{tag}").read().strip().splitlines()[-1])
off, on, k2 = load("speculateoff"), load("speculatengram4"), load("draftmax2")
au = load("speculateauto4")
bad = 0
sa, so = au["speculation"], off["speculation"]
if au["ids"] != off["ids"]:
    print("FAIL: auto:4: ids differ from --speculate off"); bad = 1
if not sa["priced"] or not 0 <= sa["draft_limit_mean"] <= 4:
    print(f"FAIL: auto:4: not priced or limit out of 0..4: {sa}"); bad = 1
if sa["verify_steps"] and sa["expert_bytes_per_token_verify"] <= 0:
    print(f"FAIL: auto:4: verify steps read no expert bytes: {sa}"); bad = 1
if so["off_steps"] != so["decode_steps"] or so["draft_limit_mean"] != 0:
    print(f"FAIL: off: steps with a draft limit: {so}"); bad = 1
if so["expert_bytes_per_token_plain"] <= 0:
    print(f"FAIL: off: plain steps read no expert bytes: {so}"); bad = 1
if on["speculation"]["draft_limit_mean"] < 1:
    print(f"FAIL: ngram:4: mean limit under 1: {on['speculation']}"); bad = 1
print(f"auto:4: {sa}")
for name, r in (("ngram:4", on), ("draft-max 2", k2)):
    if r["ids"] != off["ids"] or len(r["ids"]) != 40:
        print(f"FAIL: {name}: ids differ from --speculate off"); bad = 1
    s = r["speculation"]
    if s["verify_steps"] <= 0 or s["accepted_tokens"] <= 0:
        print(f"FAIL: {name}: no draft verified or accepted: {s}"); bad = 1
    if s["accepted_tokens"] > s["draft_tokens"]:
        print(f"FAIL: {name}: more accepted than drafted: {s}"); bad = 1
    want = 1 + s["accepted_tokens"] / s["decode_steps"]
    if abs(s["tokens_per_step"] - want) > 1e-3:
        print(f"FAIL: {name}: tokens_per_step {s['tokens_per_step']}, "
              f"want {want:.3f}"); bad = 1
    print(f"{name}: {s}")
if off["speculation"]["verify_steps"] != 0:
    print("FAIL: --speculate off verified drafts"); bad = 1
if "speculation " not in open(f"{d}/err-speculatengram4").read():
    print("FAIL: no speculation line in the summary"); bad = 1
sys.exit(bad)
PY
"$STRATA" run --model "$MD" --store "$TMP/store" --speculate ngram:99 \
	--prompt x >/dev/null 2>"$TMP/err-bad"
rc=$?
if [ $rc -ne 2 ] || ! grep -q -- "--speculate 'ngram:99'" "$TMP/err-bad"; then
	echo "FAIL: --speculate ngram:99: exit $rc"; cat "$TMP/err-bad"; fail=1
fi
[ $fail -eq 0 ] && echo OK
exit $fail
