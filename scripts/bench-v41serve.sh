#!/bin/sh
# DeepSeek-V4.1 through expertd's two tiers (issue 11): writes a
# V4.1-Flash-shaped model (scripts/gen-v41-engram-model.py --flash-layers:
# real per-layer shapes and formats, fewer layers and experts, Engram
# tables larger than the host Engram cache), converts it, runs
# strata-bench-dsv41 (decode tok/s at host budgets 100/50/25 %, expert and
# Engram bytes read per token, the I/O-bound limit from the raw O_DIRECT
# bandwidth measured in the same run) and deletes the model and its store.
#
# usage: scripts/bench-v41serve.sh [--layers 4] [--experts 24]
#          [--table-gib 2] [--cache 64MiB] [--tokens 6] [--prompt-tokens 4]
#          [--budgets 100,50,25] [--dir DIR] [--keep] [-- BENCH-ARGS]
# BENCH-ARGS go to strata-bench-dsv41 (e.g. --compute reference,
# --no-step-hints --no-overlap, --prefetch-depth 2); fast compute by default.
# Disk: about 2 x (1.1 GiB + layers x experts x 17.9 MiB + table-gib) in
# DIR (default: a temporary directory); the defaults use 9.6 GiB.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${STRATA_BUILD_DIR:-$SRC/build}
LAYERS=4
EXPERTS=24
GIB=2
CACHE=64MiB
TOKENS=6
PROMPT=4
BUDGETS=100,50,25
DIR=
KEEP=0
while [ $# -gt 0 ]; do
	case $1 in
	--layers) LAYERS=$2; shift 2 ;;
	--experts) EXPERTS=$2; shift 2 ;;
	--table-gib) GIB=$2; shift 2 ;;
	--cache) CACHE=$2; shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--prompt-tokens) PROMPT=$2; shift 2 ;;
	--budgets) BUDGETS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--keep) KEEP=1; shift ;;
	--) shift; break ;;
	-h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "bench-v41serve: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
BENCH=$BUILD/bench/strata-bench-dsv41
[ -x "$BENCH" ] || { echo "bench-v41serve: build first ($BENCH missing)" >&2; exit 1; }
if [ -z "$DIR" ]; then
	DIR=$(mktemp -d /tmp/strata-v41bench-XXXXXX)
fi
mkdir -p "$DIR"
if [ "$KEEP" = 0 ]; then
	trap 'rm -rf "$DIR/model" "$DIR/store"' EXIT
fi
if [ ! -f "$DIR/store/manifest.json" ]; then
	/usr/bin/python3 "$SRC/scripts/gen-v41-engram-model.py" "$DIR/model" \
		--flash-layers "$LAYERS" --experts "$EXPERTS" --table-gib "$GIB"
	"$BUILD/cli/strata" convert --model "$DIR/model" --out "$DIR/store"
	rm -rf "$DIR/model"
fi
"$BENCH" --store "$DIR/store" --budgets "$BUDGETS" --engram-cache "$CACHE" \
	--tokens "$TOKENS" --prompt-tokens "$PROMPT" "$@"
