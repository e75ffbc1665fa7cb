#!/bin/sh
# The DeepSeek-V4 family's benchmark, one revision a run (--model v4|v41).
#
#  v4   served by the three daemons (issue 9): `strata run` greedy on a V4
#       checkpoint at several host budgets; prints TTFT, decode tokens/s
#       and the expert pool's hits / misses / evictions and prefetch
#       figures per budget.  Reference mode: figures are of the exact
#       forward pass.  The default checkpoint is ../shared's
#       tiny-deepseek-v4 (random weights: the text is noise; the figures
#       are what this measures); --model DIR names another (a V4
#       checkpoint directory).  Stores go to $STRATA_CACHE_DIR (default: a
#       temporary directory, removed afterwards).
#  v41  through expertd's two tiers (issue 11): writes a V4.1-Flash-shaped
#       model (scripts/gen-v41-engram-model.py --flash-layers: real
#       per-layer shapes and formats, fewer layers and experts, Engram
#       tables larger than the host Engram cache), converts it, runs
#       strata-bench-dsv (decode tok/s at each host budget, expert and
#       Engram bytes read per token, the I/O-bound limit from the raw
#       O_DIRECT bandwidth measured in the same run) and deletes the model
#       and its store.  BENCH-ARGS go to strata-bench-dsv (e.g.
#       --compute reference, --no-step-hints --no-overlap,
#       --prefetch-depth 2); fast compute by default.  Disk: about
#       2 x (1.1 GiB + layers x experts x 17.9 MiB + table-gib) in DIR
#       (default: a temporary directory); the defaults use 9.6 GiB.
#
# usage: scripts/bench-dsv.sh --model v4 [--model DIR] [--tokens 64]
#          [--budgets "100 50 25"] [--prompt TEXT]
#        scripts/bench-dsv.sh --model v41 [--layers 4] [--experts 24]
#          [--table-gib 2] [--cache 64MiB] [--tokens 6] [--prompt-tokens 4]
#          [--budgets 100,50,25] [--dir DIR] [--keep] [-- BENCH-ARGS]
# Budgets are percent of the expert working set, separated by spaces or
# commas.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${STRATA_BUILD_DIR:-$SRC/build}
REV=
CKPT=${STRATA_SHARED_DIR:-$SRC/../shared}/fixtures/models/tiny-deepseek-v4
TOKENS=
BUDGETS="100 50 25"
PROMPT="In the small harbour town, the morning ferry left at seven."
LAYERS=4
EXPERTS=24
GIB=2
CACHE=64MiB
PROMPT_TOKENS=4
DIR=
KEEP=0
die() { echo "bench-dsv: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
	case $1 in
	--model)
		case $2 in
		v4|v41) REV=$2 ;;
		*) CKPT=$2; REV=${REV:-v4} ;;
		esac
		shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--budgets) BUDGETS=$2; shift 2 ;;
	--prompt) PROMPT=$2; shift 2 ;;
	--layers) LAYERS=$2; shift 2 ;;
	--experts) EXPERTS=$2; shift 2 ;;
	--table-gib) GIB=$2; shift 2 ;;
	--cache) CACHE=$2; shift 2 ;;
	--prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--) shift; break ;;
	-h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-dsv: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
[ -n "$REV" ] || die "--model v4 or --model v41 (see --help)"

bench_v4() {
	STRATA=$BUILD/cli/strata
	TOKENS=${TOKENS:-64}
	BUDGETS=$(echo "$BUDGETS" | tr ',' ' ')
	[ -x "$STRATA" ] || die "build first ($STRATA missing)"
	[ -f "$CKPT/config.json" ] || die "no model at $CKPT"
	TMP=$(mktemp -d /tmp/strata-v4bench-XXXXXX)
	trap 'rm -rf "$TMP"' EXIT
	export STRATA_CACHE_DIR="${STRATA_CACHE_DIR:-$TMP/cache}"
	printf '%-7s %9s %9s %7s %7s %9s %9s %9s\n' budget "TTFT ms" "tok/s" \
		hits misses evictions "prefetch" "recall"
	for b in $BUDGETS; do
		"$STRATA" run --model "$CKPT" --prompt "$PROMPT" \
			--max-tokens "$TOKENS" --ignore-eos --host-budget "$b%" \
			--json --quiet --instance "v4b$$" --run-dir "$TMP/run-$b" \
			>"$TMP/$b.json" 2>"$TMP/$b.err" ||
			{ cat "$TMP/$b.err" >&2; die "strata run at $b% failed"; }
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
}

bench_v41() {
	BENCH=$BUILD/bench/strata-bench-dsv
	[ -x "$BENCH" ] || die "build first ($BENCH missing)"
	if [ -z "$DIR" ]; then
		DIR=$(mktemp -d /tmp/strata-v41bench-XXXXXX)
	fi
	mkdir -p "$DIR"
	if [ "$KEEP" = 0 ]; then
		trap 'rm -rf "$DIR/model" "$DIR/store"' EXIT
	fi
	if [ ! -f "$DIR/store/manifest.json" ]; then
		/usr/bin/python3 "$SRC/scripts/gen-v41-engram-model.py" \
			"$DIR/model" --flash-layers "$LAYERS" \
			--experts "$EXPERTS" --table-gib "$GIB"
		"$BUILD/cli/strata" convert --model "$DIR/model" \
			--out "$DIR/store"
		rm -rf "$DIR/model"
	fi
	"$BENCH" --store "$DIR/store" \
		--budgets "$(echo "$BUDGETS" | tr ' ' ',')" \
		--engram-cache "$CACHE" --tokens "${TOKENS:-6}" \
		--prompt-tokens "$PROMPT_TOKENS" "$@"
}

case $REV in
v4) [ $# -eq 0 ] || die "BENCH-ARGS are for --model v41"; bench_v4 ;;
v41) bench_v41 "$@" ;;
esac
