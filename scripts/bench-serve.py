#!/usr/bin/python3
"""Load benchmark of computed's HTTP API with continuous batching.

Starts expertd, kvd and computed (--http-port) on a private instance over a
converted store, then for each concurrency level runs that many streaming
clients at once (each sends --requests greedy /v1/completions requests one
after the other, distinct prompts, --max-tokens new tokens each) and prints
per level: aggregate generated tokens/s, median and p99 TTFT and TPOT, the
mean tokens per forward step (from /metrics), and the speed-up over one
client.  Prints figures, never asserts.

  scripts/bench-serve.py --store STORE [--clients 1,4,16,32] [--threads 2]
                         [--compute fast]   # computed --compute (default
                                            # fast: the fast CPU kernels)
  scripts/bench-serve.py --model bench-models/qwen3moe-large   # converts
                                   # once into $STRATA_CACHE_DIR (mxfp4)
"""
import argparse
import os
import random
import sys
import threading
import time
import json

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serve"))
os.environ.setdefault("STRATA_BUILD_DIR", os.path.join(HERE, "..", "build"))
from serve_harness import Instance, convert, metrics, stream  # noqa: E402

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet "
         "kilo lima mike november oscar papa quebec romeo sierra tango "
         "uniform victor whiskey xray yankee zulu").split()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def one_level(inst, n_clients, args, rng):
    results = []
    lock = threading.Lock()

    def client(ci):
        for r in range(args.requests):
            prompt = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
            prompt = "%d %d %s" % (ci, r, prompt)
            times = []
            t0 = time.time()
            st, out = stream(inst, "/v1/completions", {
                "prompt": prompt, "max_tokens": args.max_tokens,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}},
                on_chunk=lambda i, p, t: times.append(t))
            ok = st == 200 and out and out[-1] == "[DONE]"
            n_tok = 0
            if ok:
                last = json.loads(out[-2])
                n_tok = last.get("usage", {}).get("completion_tokens", 0)
                ok = n_tok > 0
            with lock:
                # token chunks: neither the usage chunk nor [DONE]
                results.append((ok, t0, times[:-2], n_tok))

    m0 = metrics(inst)
    t_start = time.time()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t_start
    m1 = metrics(inst)
    errors = sum(1 for r in results if not r[0])
    tokens = sum(r[3] for r in results)
    ttft = [(r[2][0] - r[1]) * 1e3 for r in results if r[0] and r[2]]
    tpot = [(r[2][-1] - r[2][0]) * 1e3 / (r[3] - 1)
            for r in results if r[0] and len(r[2]) > 1 and r[3] > 1]
    steps = m1["strata_steps_total"] - m0["strata_steps_total"]
    step_tokens = m1["strata_step_tokens_total"] - m0["strata_step_tokens_total"]
    return {"clients": n_clients, "requests": len(results), "errors": errors,
            "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "tpot_p50": pct(tpot, 50), "tpot_p99": pct(tpot, 99),
            "tokens_per_step": step_tokens / steps if steps else 0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", help="a converted store (strata convert)")
    ap.add_argument("--model", help="a checkpoint to convert (mxfp4) first")
    ap.add_argument("--clients", default="1,4,16,32")
    ap.add_argument("--requests", type=int, default=2,
                    help="requests per client, one after the other")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2, help="computed --threads")
    ap.add_argument("--compute", default="fast", choices=("reference", "fast"),
                    help="computed --compute (default fast)")
    ap.add_argument("--max-running", type=int, default=32)
    ap.add_argument("--json", action="store_true", help="also print JSON lines")
    args = ap.parse_args()
    store = args.store
    if not store:
        if not args.model:
            ap.error("give --store STORE or --model DIR")
        if not os.path.isfile(os.path.join(args.model, "config.json")):
            ap.error("%s has no config.json; generate the benchmark model "
                     "first: /usr/bin/python3 scripts/gen-moe-model.py --out %s"
                     % (args.model, args.model))
        cache = os.environ.get("STRATA_CACHE_DIR",
                               os.path.expanduser("~/.cache/strata"))
        os.makedirs(cache, exist_ok=True)
        name = os.path.basename(os.path.normpath(args.model)) + "-serve-mxfp4.strata"
        print("converting %s (once) ..." % args.model, file=sys.stderr)
        store = convert(args.model, os.path.join(cache, name), "mxfp4")
    inst = Instance(os.path.abspath(store), tag="bsv", computed_args=[
        "--threads", str(args.threads), "--compute", args.compute,
        "--max-running", str(args.max_running),
        "--max-queued", "1024"])
    print("starting daemons on %s ..." % store, file=sys.stderr)
    inst.start(timeout_s=300)
    rng = random.Random(1)
    rows = []
    try:
        one_level(inst, 1, argparse.Namespace(**dict(vars(args), requests=1)), rng)  # warm-up
        print("%7s %8s %6s %7s %9s %9s %9s %9s %9s %8s %7s" % (
            "clients", "requests", "errors", "tokens", "tokens/s", "TTFT p50",
            "TTFT p99", "TPOT p50", "TPOT p99", "tok/step", "speedup"))
        for c in [int(x) for x in args.clients.split(",")]:
            r = one_level(inst, c, args, rng)
            rows.append(r)
            base = rows[0]["tok_s"]
            print("%7d %8d %6d %7d %9.2f %7.0fms %7.0fms %7.0fms %7.0fms %8.1f %6.2fx" % (
                r["clients"], r["requests"], r["errors"], r["tokens"], r["tok_s"],
                r["ttft_p50"], r["ttft_p99"], r["tpot_p50"], r["tpot_p99"],
                r["tokens_per_step"], r["tok_s"] / base if base else 0), flush=True)
            if args.json:
                print(json.dumps(r), flush=True)
    finally:
        inst.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
