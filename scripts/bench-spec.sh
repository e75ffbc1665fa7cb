#!/bin/sh
# Speculative decoding benchmark (issue 22 §3-§5): kjv-moe (a trained
# model, so prompt-lookup drafts get accepted) quoting a passage of
# Genesis it was given twice; strata run with --speculate off and SPEC
# (default auto:4, the length priced in step time and expert bytes; or
# ngram:K, or a bare K for ngram:K) at host budgets 100/50/25 % of the
# experts, N interleaved pairs per budget (each run its own private
# instance: a cold expert pool, the store in the page cache after the
# first).  Prints per budget the medians of decode tokens/s, expert bytes
# read per decode token, tokens per decode step, the acceptance, the
# draft length chosen (mean per decode step, and the share of steps off),
# expert bytes per token of steps with drafts and without, and the load
# average before and after.  Fails (exit 1) unless greedy ids are
# identical in every run, off and on.
# Expert bytes per decode token: (reads - the prompt's) / (tokens - 1).
# Reference mode, experts MXFP4.
#   scripts/bench-spec.sh [N] [SPEC] [MAX_TOKENS]
set -eu
cd "$(dirname "$0")/.."
N=${1:-5}
SPEC=${2:-auto:4}
case $SPEC in [0-9]*) SPEC="ngram:$SPEC" ;; esac
MAXT=${3:-128}
S=./build/cli/strata
SHARED=${STRATA_SHARED_DIR:-../shared}
MODEL=$SHARED/fixtures/models/kjv-moe
[ -d "$MODEL" ] || { echo "bench-spec: $MODEL is absent" >&2; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/prompt.txt" <<'TXT'
In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: and there was light.
In the beginning God created the heaven and the earth. And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God said, Let there be light: and there was light.
In the beginning God created the heaven
TXT
$S convert --model "$MODEL" --out "$TMP/kjv.strata" >/dev/null 2>&1 ||
	$S run --model "$MODEL" --store "$TMP/kjv.strata" --prompt x \
		--max-tokens 1 --quiet >/dev/null 2>&1
# the prompt's expert reads alone (one token: the prefill's sample), to
# price decode tokens (reads are counted per matvec, at any budget)
$S run --store "$TMP/kjv.strata" --prompt-file "$TMP/prompt.txt" \
	--max-tokens 1 --json --quiet 2>/dev/null | tail -1 >"$TMP/prefill.json"
cut -d' ' -f1-3 /proc/loadavg >"$TMP/load0"
for b in 100% 50% 25%; do
	for i in $(seq 1 "$N"); do
		for sp in off "$SPEC"; do
			tag=$(echo "$b-$sp-$i" | tr -d '%:')
			$S run --store "$TMP/kjv.strata" --prompt-file "$TMP/prompt.txt" \
				--max-tokens "$MAXT" --ignore-eos --host-budget "$b" \
				--speculate "$sp" --json --quiet 2>/dev/null |
				tail -1 >"$TMP/$tag.json"
			[ -s "$TMP/$tag.json" ] || { echo "bench-spec: strata run" \
				"--host-budget $b --speculate $sp failed" >&2; exit 1; }
		done
	done
done
cut -d' ' -f1-3 /proc/loadavg >"$TMP/load1"
/usr/bin/python3 - "$TMP" "$N" "$SPEC" <<'PY'
import json, statistics as st, sys
d, n, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tag_on = spec.replace(":", "")
med = st.median
pre = json.load(open(f"{d}/prefill.json"))["expert_bytes_read"]
def dec_bytes(r):
    return (r["expert_bytes_read"] - pre) / max(1, r["generated_tokens"] - 1)
print(f"kjv-moe, prompt {json.load(open(f'{d}/100-off-1.json'))['prompt_tokens']} "
      f"tokens, greedy, off vs {spec}, {n} interleaved pairs per budget, "
      f"medians; load average {open(f'{d}/load0').read().strip()} before, "
      f"{open(f'{d}/load1').read().strip()} after")
print("budget  mode      tok/s   expert B/decode tok  tok/step  accepted  "
      "limit  off%   B/tok verify  B/tok plain  ids")
ref = json.load(open(f"{d}/100-off-1.json"))["ids"]
all_same = True
for b in ("100", "50", "25"):
    rows = {}
    for sp in ("off", tag_on):
        rs = [json.load(open(f"{d}/{b}-{sp}-{i}.json")) for i in range(1, n + 1)]
        rows[sp] = rs
    same = all(r["ids"] == ref for sp in rows for r in rows[sp])
    all_same = all_same and same
    for sp, rs in rows.items():
        s = [r["speculation"] for r in rs]
        acc = sum(x["accepted_tokens"] for x in s)
        dr = sum(x["draft_tokens"] for x in s)
        steps = sum(x["decode_steps"] for x in s)
        off_share = sum(x["off_steps"] for x in s) / steps if steps else 0
        print(f"{b:>5}%  {sp:8} {med(r['decode_tokens_per_s'] for r in rs):7.1f} "
              f"{med(dec_bytes(r) for r in rs):20.0f} "
              f"{med(x['tokens_per_step'] for x in s):9.2f} "
              f"{(acc / dr if dr else 0):9.2f} "
              f"{med(x['draft_limit_mean'] for x in s):6.2f} "
              f"{100 * off_share:5.0f} "
              f"{med(x['expert_bytes_per_token_verify'] for x in s):14.0f} "
              f"{med(x['expert_bytes_per_token_plain'] for x in s):12.0f}  "
              f"{'same' if same else 'DIFFER'}")
    on, off = rows[tag_on], rows["off"]
    print(f"        on/off tokens/s = "
          f"{med(r['decode_tokens_per_s'] for r in on) / med(r['decode_tokens_per_s'] for r in off):.2f}x")
if not all_same:
    print("bench-spec: greedy ids differ between runs", file=sys.stderr)
    sys.exit(1)
PY
