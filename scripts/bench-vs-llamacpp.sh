#!/bin/sh
# bench-vs-llamacpp.sh — strata against llama.cpp on the same weights, side by
# side (../shared/PEERS.md has the method): generates the model, converts it for
# both (strata: experts MXFP4, attention + LM head FP8; llama.cpp: MXFP4_MOE, and
# the formats named by --llama-formats), then runs --pairs N interleaved pairs,
# odd pairs strata first, even pairs llama.cpp first, each pair with the
# read-bandwidth probe (strata-membw, 1 and 2 threads) before the benches.
# Prints per pair and at the end one line of medians:
#   vs llama.cpp: tg t1 R1x t2 R2x; pp t1 R3x t2 R4x; bw t1 P1% t2 P2%
# (tg/pp: strata tokens/s over llama.cpp MXFP4_MOE's; bw: strata's decode
# weight stream over the same pair's probe).  Not in CI: minutes per pair.
#
# Usage: scripts/bench-vs-llamacpp.sh [--pairs N] [--preset large|small]
#          [--llama-formats LIST] [--runs N] [--work DIR] [--build DIR]
set -eu
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
pairs=5 preset=large formats=MXFP4_MOE runs=3 work=bench-models B=build
usage() {
	cat <<EOF
Usage: scripts/bench-vs-llamacpp.sh [--pairs N] [--preset large|small]
         [--llama-formats LIST] [--runs N] [--work DIR] [--build DIR]
strata vs llama.cpp on the same generated Qwen3-MoE weights (PEERS.md).
  --pairs N           interleaved pairs, odd ones strata first (default 5)
  --preset P          gen-moe-model.py preset (default large)
  --llama-formats L   llama.cpp quantizations, comma-separated; the first
                      is the one the ratios use (default MXFP4_MOE; Q8_0,
                      Q4_0 also run, reported with their bytes per token)
  --runs N            repetitions inside each bench (default 3)
  --work DIR          models, stores and logs (default bench-models)
  --build DIR         strata's build folder (default build; another one,
                      e.g. a copy of an older build, gets its own store:
                      before/after comparisons)
llama.cpp: \$LLAMA_BIN, else ~/.cache/strata-peers/llama.cpp/build/bin, else
built with ../shared/peers/build-llamacpp.sh.
EOF
}
while [ $# -gt 0 ]; do
	case "$1" in
	--pairs) pairs=$2; shift 2 ;;
	--preset) preset=$2; shift 2 ;;
	--llama-formats) formats=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--work) work=$2; shift 2 ;;
	--build) B=${2%/}; shift 2 ;;
	-h|--help) usage; exit 0 ;;
	*) echo "bench-vs-llamacpp: unknown argument '$1'; see --help" >&2; exit 2 ;;
	esac
done
case "$pairs$runs" in *[!0-9]*|'') echo "bench-vs-llamacpp: --pairs and --runs want numbers" >&2; exit 2 ;; esac

L=${LLAMA_BIN:-$HOME/.cache/strata-peers/llama.cpp/build/bin}
if [ ! -x "$L/llama-bench" ]; then
	if [ -x ../shared/peers/build-llamacpp.sh ]; then
		../shared/peers/build-llamacpp.sh
	else
		echo "bench-vs-llamacpp: no llama-bench in $L and no ../shared/peers/build-llamacpp.sh; set LLAMA_BIN" >&2
		exit 1
	fi
fi
[ -x "$B/bench/strata-bench-decode" ] || [ "$B" != build ] || ./scripts/build.sh
[ -x "$B/bench/strata-bench-decode" ] || { echo "bench-vs-llamacpp: no $B/bench/strata-bench-decode" >&2; exit 1; }
$PY -c 'import numpy' 2>/dev/null || { echo "bench-vs-llamacpp: $PY needs numpy (apt-get install python3-numpy)" >&2; exit 1; }

model=$work/qwen3moe-$preset
store=$model.strata-mxfp4-fp8
[ "$B" = build ] || store=$store-$(basename "$B")
# a store of another store version (common/st_store.h) is made again
want=$(sed -n 's/^#define ST_STORE_VERSION \([0-9]*\).*/\1/p' common/st_store.h)
if [ "$B" = build ] && [ -f "$store/manifest.json" ] &&
   ! grep -q "\"version\": $want," "$store/manifest.json"; then
	rm -rf "$store"
fi
logs=$work/vs-llamacpp-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$work" "$logs"
[ -f "$model/config.json" ] || $PY scripts/gen-moe-model.py --preset "$preset" --out "$model"
[ -d "$store" ] || "$B/cli/strata" convert --model "$model" --out "$store" --experts mxfp4 --dense fp8
[ -f "$model-BF16.gguf" ] || $PY ../shared/peers/hf2gguf.py "$model" "$model-BF16.gguf"
for f in $(echo "$formats" | tr , ' '); do
	[ -f "$model-$f.gguf" ] || "$L/llama-quantize" "$model-BF16.gguf" "$model-$f.gguf" "$f" >"$logs/quantize-$f.log" 2>&1
done

run_strata() {
	"$B/bench/strata-bench-decode" --model "$model" --store "$store" --dense fp8 \
		--compute fast --threads 1,2 --runs "$runs" >"$logs/strata-$1.txt" 2>&1
}
run_llama() {
	for f in $(echo "$formats" | tr , ' '); do
		"$L/llama-bench" -m "$model-$f.gguf" -t 1,2 -p 128 -n 64 -r "$runs" -o json \
			>"$logs/llama-$f-$1.json" 2>"$logs/llama-$f-$1.err"
	done
}
i=1
while [ "$i" -le "$pairs" ]; do
	uptime >"$logs/load-$i.txt"
	for t in 1 2; do
		"$B/bench/strata-membw" --threads $t --bytes 1GiB --passes 5 >"$logs/membw-$t-$i.txt"
	done
	if [ $((i % 2)) -eq 1 ]; then run_strata $i; run_llama $i; else run_llama $i; run_strata $i; fi
	uptime >>"$logs/load-$i.txt"
	echo "pair $i of $pairs done ($(tail -1 "$logs/load-$i.txt" | sed 's/.*load average/load average/'))"
	i=$((i + 1))
done

$PY - "$logs" "$pairs" "$formats" "$model" <<'EOF'
import glob, json, os, re, statistics as st, sys
sys.path.insert(0, os.path.join(os.environ.get("LLAMA_CPP_DIR", os.path.expanduser("~/.cache/strata-peers/llama.cpp")), "gguf-py"))
logs, pairs, formats, model = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
med = lambda v: st.median(v) if v else float("nan")
S = {}  # (t) -> lists
for i in range(1, pairs + 1):
    txt = open(f"{logs}/strata-{i}.txt").read()
    for m in re.finditer(r"^\| fast \| (\d) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) .*?\| ([\d.]+) \| ([\d.]+) \|", txt, re.M):
        t = int(m.group(1)); bw = float(re.search(r"read bandwidth: ([\d.]+)", open(f"{logs}/membw-{t}-{i}.txt").read()).group(1))
        d = S.setdefault(t, {"pp": [], "tg": [], "gbs": [], "bwp": [], "mb": []})
        d["pp"].append(float(m.group(2))); d["tg"].append(float(m.group(3))); d["mb"].append(float(m.group(4)))
        d["gbs"].append(float(m.group(5))); d["bwp"].append(100 * float(m.group(5)) / bw)
    for f in formats:
        for r in json.load(open(f"{logs}/llama-{f}-{i}.json")):
            k = "pp" if r["n_prompt"] and not r["n_gen"] else "tg"
            S.setdefault((f, r["n_threads"]), {"pp": [], "tg": []})[k].append(r["avg_ts"])
def bytes_per_token(path):
    try:
        import gguf
        rd = gguf.GGUFReader(path)
        kv = {f.name: f for f in rd.fields.values()}
        E = int(kv["qwen3moe.expert_count"].parts[-1][0]); K = int(kv["qwen3moe.expert_used_count"].parts[-1][0])
        tot = 0
        for t in rd.tensors:
            n = int(t.n_bytes)
            if "_exps" in t.name: tot += n * K / E
            elif t.name == "token_embd.weight": tot += n / t.shape[-1]
            else: tot += n
        return tot / 1e6
    except Exception as e:  # gguf-py missing or another layout
        return float("nan")
print("\n| threads | strata pp128 | strata tg | strata MB/token | strata GB/s | % of probe | " +
      " | ".join(f"llama {f} pp128 | llama {f} tg64" for f in formats) + " |")
for t in (1, 2):
    d = S.get(t, {"pp": [], "tg": [], "mb": [], "gbs": [], "bwp": []})
    row = [t, med(d["pp"]), med(d["tg"]), med(d["mb"]), med(d["gbs"]), med(d["bwp"])]
    for f in formats:
        l = S.get((f, t), {"pp": [], "tg": []}); row += [med(l["pp"]), med(l["tg"])]
    print("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |")
for f in formats:
    print(f"llama.cpp {f}: {bytes_per_token(f'{model}-{f}.gguf'):.1f} MB read per decoded token")
f0 = formats[0]
def ratio(k, t):
    a = med(S.get(t, {}).get(k, [])); b = med(S.get((f0, t), {}).get(k, []))
    return a / b if b else float("nan")
print(f"(medians of {pairs} pairs; logs in {logs}; load averages in load-*.txt)")
print("vs llama.cpp: tg t1 %.2fx t2 %.2fx; pp t1 %.2fx t2 %.2fx; bw t1 %.0f%% t2 %.0f%%" % (
    ratio("tg", 1), ratio("tg", 2), ratio("pp", 1), ratio("pp", 2),
    med(S.get(1, {}).get("bwp", [])), med(S.get(2, {}).get("bwp", []))))
EOF
