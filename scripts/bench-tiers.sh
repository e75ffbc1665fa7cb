#!/bin/sh
# Expert-tier benchmark (issue 3): decode tokens/s at host budgets 100 / 50 /
# 25 % with prefetch off and on, stall fraction, prefetch precision and
# recall, store bytes read per token, expertd's NVMe read bandwidth next to
# the raw O_DIRECT read bandwidth of the same store files measured in the
# same run, and the I/O-bound limit.
#
# Before every run the store's expert files are made cold: fsync, then
# posix_fadvise(POSIX_FADV_DONTNEED) on each (and, with --drop-caches as
# root, /proc/sys/vm/drop_caches, which affects the whole machine); the
# pages still cached are printed (fincore), so page-cache effects cannot
# flatter the figures.  expertd reads with O_DIRECT anyway.
#
# Definitions (printed with the table):
#   decode tok/s   strata run's decode rate (tokens after the first)
#   compute tok/s  the same prompt on a warm pool (all experts resident,
#                  no reads): the compute-bound rate
#   I/O limit      raw aggregate O_DIRECT bandwidth (as many streams as
#                  expertd has loader threads) / store bytes read per token;
#   limit          min(compute tok/s, I/O limit): what perfect overlap of
#                  reads and compute would give; "% of limit" = decode / limit
#   stall          time computed waited for experts / its compute time
#   read GB/s      expertd's bytes read / wall time with at least one read
#                  in flight, next to the raw GB/s of as many O_DIRECT
#                  streams as loader threads, request size = one record
#   bytes/token is over the whole run (prompt included; the prompt is short)
#
# usage: scripts/bench-tiers.sh [--model DIR] [--tokens N] [--budgets "100 50 25"]
#          [--trace JSONL] [--prompt TEXT] [--loader-threads N] [--drop-caches]
#          [--experts FMT] [--extra "strata run options"]
# The default model is bench-models/qwen3moe-large (a symlink to the large
# generated model, or make one with scripts/gen-moe-model.py); converted
# stores go to $STRATA_CACHE_DIR (default: .cache in the source tree).
# --trace forces the routing from a trace (e.g. the DeepSeek-V2-Lite trace
# converted by scripts/trace-moe-beyond.py for a dsv2lite-shape model).
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
MODEL=$SRC/bench-models/qwen3moe-large
TOKENS=32
BUDGETS="100 50 25"
TRACE=
PROMPT="The expert router sends every token to a few experts"
LOADERS=4
EXPERTS=mxfp4
DROP=0
EXTRA=
while [ $# -gt 0 ]; do
	case $1 in
	--model) MODEL=$2; shift 2 ;;
	--tokens) TOKENS=$2; shift 2 ;;
	--budgets) BUDGETS=$2; shift 2 ;;
	--trace) TRACE=$2; shift 2 ;;
	--experts) EXPERTS=$2; shift 2 ;;
	--prompt) PROMPT=$2; shift 2 ;;
	--loader-threads) LOADERS=$2; shift 2 ;;
	--drop-caches) DROP=1; shift ;;
	--extra) EXTRA=$2; shift 2 ;;
	-h|--help) sed -n 2,40p "$0"; exit 0 ;;
	*) echo "bench-tiers: unknown option $1 (see --help)" >&2; exit 2 ;;
	esac
done
export STRATA_CACHE_DIR=${STRATA_CACHE_DIR:-$SRC/.cache}
S=$SRC/build/cli/strata
TMP=$(mktemp -d /tmp/strata-bench-tiers-XXXXXX)
trap '$S down --instance bt-warm-$$ --run-dir "$TMP/run-warm" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
TR=
[ -n "$TRACE" ] && TR="--route-trace $TRACE"

# the store (converted once into the cache)
STORE=$(/usr/bin/python3 - "$MODEL" "$STRATA_CACHE_DIR" "$EXPERTS" <<'PY'
import os, sys, glob
name = os.path.basename(os.path.realpath(sys.argv[1]).rstrip("/"))
c = sorted(glob.glob(os.path.join(sys.argv[2], name + "-*-" + sys.argv[3] + ".strata")), key=os.path.getmtime)
print(c[-1] if c else "")
PY
)
if [ -z "$STORE" ]; then
	echo "bench-tiers: converting $MODEL (once) ..." >&2
	"$S" run --model "$MODEL" --experts "$EXPERTS" --prompt x --max-tokens 1 --quiet >/dev/null
	STORE=$(ls -dt "$STRATA_CACHE_DIR"/"$(basename "$(realpath "$MODEL")")"-*-"$EXPERTS".strata | head -1)
fi
echo "model $MODEL, store $STORE, $TOKENS tokens, loader threads $LOADERS${TRACE:+, forced routing from $TRACE}"
echo "(figures measured now are under whatever load the machine has; uptime: $(uptime | sed 's/.*load/load/'))"

cold() {
	sync
	[ $DROP -eq 1 ] && [ "$(id -u)" = 0 ] && echo 1 >/proc/sys/vm/drop_caches
	/usr/bin/python3 - "$STORE" <<'PY'
import os, sys, glob
for f in glob.glob(os.path.join(sys.argv[1], "experts-*.bin")):
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
	fincore -b -n -o RES "$STORE"/experts-*.bin 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

# raw O_DIRECT read bandwidth of the store files: 1 stream, and LOADERS
# streams over different files, request size = one record
raw() {
	/usr/bin/python3 - "$STORE" "$1" <<'PY'
import json, os, subprocess, sys, time, glob
store, streams = sys.argv[1], int(sys.argv[2])
man = json.load(open(os.path.join(store, "manifest.json")))
rb = man["experts"]["record_bytes"] if "record_bytes" in man.get("experts", {}) else 4 << 20
files = sorted(glob.glob(os.path.join(store, "experts-*.bin")))
t = time.time()
procs, total = [], 0
for i in range(streams):
    mine = files[i::streams]
    total += sum(os.path.getsize(f) for f in mine)
    procs.append(subprocess.Popen("for f in %s; do dd if=$f of=/dev/null bs=%d iflag=direct status=none; done"
                                  % (" ".join(mine), rb), shell=True))
for p in procs:
    p.wait()
print("%.3f" % (total / (time.time() - t) / 1e9))
PY
}

run() { # name budget args...
	name=$1; b=$2; shift 2
	c=$(cold)
	"$S" run --model "$MODEL" --store "$STORE" --prompt "$PROMPT" --max-tokens "$TOKENS" \
		--ignore-eos --json --quiet --host-budget "$b%" --loader-threads "$LOADERS" \
		$TR $EXTRA "$@" >"$TMP/$name.json" 2>"$TMP/$name.err" ||
		{ echo "bench-tiers: run $name failed:"; tail -5 "$TMP/$name.err"; exit 1; }
	echo "$c" >"$TMP/$name.cold"
}

c0=$(cold)
RAW1=$(raw 1)
c1=$(cold)
RAWN=$(raw "$LOADERS")
echo "raw O_DIRECT read of the store's expert files (cold: $c0 / $c1 bytes cached before): 1 stream $RAW1 GB/s, $LOADERS streams $RAWN GB/s"

# compute-bound rate: a second run on the warm pool of a kept instance
"$S" run --model "$MODEL" --store "$STORE" --prompt "$PROMPT" --max-tokens "$TOKENS" --ignore-eos \
	--json --quiet --instance bt-warm-$$ --run-dir "$TMP/run-warm" --keep --no-prefetch $TR $EXTRA \
	>/dev/null 2>"$TMP/warm1.err" || { tail -5 "$TMP/warm1.err"; exit 1; }
"$S" run --instance bt-warm-$$ --run-dir "$TMP/run-warm" --prompt "$PROMPT" --max-tokens "$TOKENS" \
	--ignore-eos --json --quiet >"$TMP/warm.json" 2>"$TMP/warm.err" || { tail -5 "$TMP/warm.err"; exit 1; }
"$S" down --instance bt-warm-$$ --run-dir "$TMP/run-warm" >/dev/null 2>&1 || true

MODES="off on"
[ -n "$TRACE" ] && MODES="off on oracle"
for b in $BUDGETS; do
	run "b$b-off" "$b" --no-prefetch
	run "b$b-on" "$b"
	[ -n "$TRACE" ] && run "b$b-oracle" "$b" --lookahead-oracle
done

/usr/bin/python3 - "$TMP" "$RAW1" "$RAWN" "$BUDGETS" "$MODES" <<'PY'
import json, sys
T, raw1, rawn, budgets = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split()
modes = sys.argv[5].split()
def load(n):
    return json.loads(open("%s/%s.json" % (T, n)).read().strip().splitlines()[-1])
warm = load("warm")
comp = warm["decode_tokens_per_s"]
print("compute-bound (warm pool, no reads): %.2f tok/s; warm run read %d bytes" %
      (comp, warm.get("tiers", {}).get("load_bytes", 0)))
hdr = ("budget", "prefetch", "tok/s", "limit", "%limit", "stall%", "prec%", "recall%",
       "KiB/tok", "rd GB/s", "%raw", "cold B")
print("%-6s %-8s %7s %7s %6s %6s %6s %7s %8s %7s %6s %6s" % hdr)
ids = None
for b in budgets:
    for pf in modes:
        name = "b%s-%s" % (b, pf)
        j = load(name)
        t = j["tiers"]
        if ids is None: ids = j["ids"]
        same = "" if j["ids"] == ids else "  (ids differ!)"
        bpt = t["bytes_per_token"]
        io_limit = rawn * 1e9 / bpt if bpt > 0 else float("inf")
        limit = min(comp, io_limit)
        cold = open("%s/%s.cold" % (T, name)).read().strip()
        print("%-6s %-8s %7.2f %7.2f %6.0f %6.1f %6.1f %7.1f %8.0f %7.3f %6.0f %6s%s" %
              (b + "%", pf, j["decode_tokens_per_s"], limit,
               100 * j["decode_tokens_per_s"] / limit if limit else 0,
               100 * t["stall_fraction"], 100 * t["prefetch_precision"], 100 * t["prefetch_recall"],
               bpt / 1024, t["read_gbps"],
               100 * t["read_gbps"] / rawn if rawn else 0, cold, same))
if "oracle" in modes:
    print("prefetch 'oracle': hints are the forced trace's own next layers (a perfect look-ahead);")
    print("'on' probes the model's routers, which cannot predict a forced trace")
print("targets: decode >= 80 % of the limit; stall <= 10 % with prefetch on; read GB/s >= 85 % of raw")
PY
