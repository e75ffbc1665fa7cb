#!/bin/sh
# Engram tier benchmark (issue 11, item 4): a DeepSeek-V4.1-shaped Engram
# table with the real row size (256 E4M3 + 8 E8M0 = 264 B, 15 rows per
# 4 KiB block) larger than expertd's host cache; random lookups through
# expertd (48 rows per token = 2 Engram layers x 24, as V4.1-Flash), with
# and without one-token-ahead prefetch, next to raw O_DIRECT 4 KiB random
# reads of the same file in the same run (bench/bench_engram.c prints the
# definitions: lookups/s, hit rate, bytes read per lookup, block read
# latency p50/p99, reads/s as a multiple of raw IOPS).
#
# usage: scripts/bench-engram.sh [--table-gib 2] [--cache 256MiB]
#          [--seconds 5] [--dir DIR] [--rows-per-token 48]
# The generated checkpoint and its store are kept in DIR (default
# $STRATA_CACHE_DIR or .cache in the source tree) and reused.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${STRATA_BUILD_DIR:-$SRC/build}
GIB=2
CACHE=256MiB
SECS=5
ROWS=48
DIR=${STRATA_CACHE_DIR:-$SRC/.cache}
while [ $# -gt 0 ]; do
	case $1 in
	--table-gib) GIB=$2; shift 2 ;;
	--cache) CACHE=$2; shift 2 ;;
	--seconds) SECS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--rows-per-token) ROWS=$2; shift 2 ;;
	-h|--help) sed -n '2,15p' "$0"; exit 0 ;;
	*) echo "bench-engram.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
MODEL=$DIR/v41-engram-${GIB}g
STORE=$MODEL-store
INST=benchengram$$
RUN=$(mktemp -d)
mkdir -p "$DIR"
if [ ! -f "$MODEL/model.safetensors" ]; then
	/usr/bin/python3 "$SRC/scripts/gen-v41-engram-model.py" "$MODEL" \
		--table-gib "$GIB"
fi
if [ ! -f "$STORE/manifest.json" ]; then
	"$BUILD/cli/strata" convert --model "$MODEL" --out "$STORE"
fi
"$BUILD/expertd/expertd" --store "$STORE" --instance "$INST" \
	--run-dir "$RUN" --engram-cache "$CACHE" 2>"$RUN/expertd.log" &
EPID=$!
trap 'kill $EPID 2>/dev/null; wait $EPID 2>/dev/null; rm -rf "$RUN"' EXIT
i=0
while [ ! -S "$RUN/expertd.ctl" ] && [ $i -lt 100 ]; do
	sleep 0.1; i=$((i + 1))
done
grep -h "Engram tier" "$RUN/expertd.log" || true
"$BUILD/bench/strata-bench-engram" --store "$STORE" --instance "$INST" \
	--run-dir "$RUN" --seconds "$SECS" --rows-per-token "$ROWS"
