#!/usr/bin/python3
"""One memory budget vs fixed splits on a mixed workload (issue 24 item 2).

Starts expertd, kvd (spill on) and computed (--http-port) on a private
instance over the kjv-moe fixture (experts BF16, converted once into
$STRATA_CACHE_DIR) with M bytes of host memory for experts and KV
together, M below what both need (--share of the experts' records plus the
sessions' KV), and runs two phases back to back in the same instance:
  A  sessions: --sessions conversations at once, --turns turns each (a turn
     sends the whole conversation so far plus --turn-words new words and
     generates --turn-tokens tokens), --rounds times with new conversations:
     KV-heavy (many live sequences, their prefixes cached between turns);
  B  generation: --gens single long generations one after another
     (--gen-tokens tokens each): expert-heavy (one sequence, every layer's
     top-k experts, the store read for what the pool lacks).
Modes, interleaved --runs times: `shared` (expertd and kvd
--memory-budget M: the arbiter moves bytes by value) and `fixed:P` for each
P in --splits (expertd --host-budget P % of M, kvd --budget the rest).
Prints per run and phase: generated tokens/s (tokens over the phase's wall
time), expert bytes read from the store, KV bytes restored, each daemon's
CPU seconds, and for
`shared` the split at the phase's end and the moves; then medians, each
phase's best fixed split, shared / best per phase and overall (tokens over
both phases' time) against every fixed split, and the load average.
Prints figures, never asserts.

  scripts/bench-memory-budget.py [--runs 3] [--splits 20,35,50,65,80]
      [--budget-share 0.5] [--sessions 32] [--turns 4] [--rounds 3]
      [--gens 16] [--gen-tokens 200]
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "serve"))
os.environ.setdefault("STRATA_BUILD_DIR", os.path.join(HERE, "..", "build"))
from serve_harness import (WORDS, Instance, convert, fixture,  # noqa: E402
                           kv_bytes_per_token, metrics, request)


def expert_bytes(store):
    return sum(os.path.getsize(os.path.join(store, f))
               for f in os.listdir(store) if f.startswith("experts"))


def words(seed, n):
    return " ".join(WORDS[(seed * 7 + k) % len(WORDS)] for k in range(n))


def phase_sessions(inst, args):
    """Phase A: the sessions' turns; returns generated tokens."""
    got = []
    lock = threading.Lock()

    def session(s):
        conv, n = "%d %s" % (s, words(s, args.turn_words)), 0
        for t in range(args.turns):
            st, body = request(inst, "POST", "/v1/completions", {
                "prompt": conv, "max_tokens": args.turn_tokens,
                "temperature": 0, "ignore_eos": True}, timeout=1200)
            if st != 200:
                break
            n += body["usage"]["completion_tokens"]
            conv += body["choices"][0]["text"] + " " + \
                words(s * 31 + t, args.turn_words)
        with lock:
            got.append(n)

    for r in range(args.rounds):
        ts = [threading.Thread(target=session,
                               args=(r * args.sessions + s,))
              for s in range(args.sessions)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return sum(got)


def phase_generations(inst, args):
    """Phase B: long single generations one after another."""
    n = 0
    for g in range(args.gens):
        st, body = request(inst, "POST", "/v1/completions", {
            "prompt": "%d %s" % (1000 + g, words(g, 10)),
            "max_tokens": args.gen_tokens, "temperature": 0,
            "ignore_eos": True}, timeout=1200)
        if st == 200:
            n += body["usage"]["completion_tokens"]
    return n


DAEMONS = ("expertd", "kvd", "computed")


def cpu_s(pid):
    """User + system CPU seconds of a live process."""
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


def split_of(m):
    return (m.get('strata_memory_target_bytes{side="experts"}', 0),
            m.get('strata_memory_target_bytes{side="kv"}', 0),
            sum(v for k, v in m.items()
                if k.startswith("strata_memory_moves_total")))


def one_run(store, mode, args, budget):
    cargs = ["--threads", str(args.threads), "--compute", args.compute,
             "--max-running", str(args.sessions), "--max-queued", "1024"]
    # kvd's floor under a shared budget is one sequence of its longest:
    # kjv-moe's context (256) in every mode
    kargs = ["--spill-budget", str(256 << 20), "--max-rows-per-seq", "256"]
    if mode == "shared":
        eargs = ["--memory-budget", str(budget)]
        kargs += ["--memory-budget", str(budget)]
    else:
        p = float(mode.split(":")[1]) / 100.0
        eargs = ["--host-budget", str(int(budget * p))]
        kargs += ["--budget", str(int(budget * (1 - p)) // 4096 * 4096)]
    inst = Instance(store, tag="bmb", computed_args=cargs, kvd_args=kargs,
                    expertd_args=eargs)
    inst.start(timeout_s=300)
    out = {"mode": mode}
    try:
        for name, fn in (("A", phase_sessions), ("B", phase_generations)):
            m0 = metrics(inst)
            c0 = {d: cpu_s(inst.procs[d].pid) for d in DAEMONS}
            t0 = time.time()
            n = fn(inst, args)
            wall = time.time() - t0
            m1 = metrics(inst)
            cpu = {d: cpu_s(inst.procs[d].pid) - c0[d] for d in DAEMONS}

            def d(k):
                return m1.get(k, 0.0) - m0.get(k, 0.0)
            te, tk, mv = split_of(m1)
            out[name] = {
                "tokens": n, "wall_s": wall, "tok_s": n / wall,
                "expert_mib": d('strata_bytes_moved_total{link="nvme_to_host",'
                                'kind="expert"}') / 2**20,
                "kv_restore_mib": d('strata_bytes_moved_total{link='
                                    '"nvme_to_host",kind="kv"}') / 2**20,
                "experts_mib": te / 2**20, "kv_mib": tk / 2**20,
                "moves": mv - split_of(m0)[2],
                "cpu": cpu}
    finally:
        inst.stop()
    out["tok_s"] = (out["A"]["tokens"] + out["B"]["tokens"]) / \
        (out["A"]["wall_s"] + out["B"]["wall_s"])
    out["load1"] = os.getloadavg()[0]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--splits", default="20,35,50,65,80",
                    help="fixed splits: experts' %% of M")
    ap.add_argument("--budget-share", type=float, default=0.5,
                    help="M as a share of experts + sessions' KV")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="phase A: rounds of --sessions new conversations")
    ap.add_argument("--turn-words", type=int, default=20)
    ap.add_argument("--turn-tokens", type=int, default=30)
    ap.add_argument("--gens", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compute", default="fast",
                    choices=("reference", "fast"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model = fixture("kjv-moe")
    cache = os.environ.get("STRATA_CACHE_DIR",
                           os.path.expanduser("~/.cache/strata"))
    os.makedirs(cache, exist_ok=True)
    store = os.path.abspath(convert(model, os.path.join(
        cache, "kjv-moe-kvbench-bf16.strata"), "bf16"))
    ctx = args.turns * (int(args.turn_words * 1.3) + args.turn_tokens)
    kv = args.sessions * ctx * kv_bytes_per_token(model)
    ex = expert_bytes(store)
    budget = int((kv + ex) * args.budget_share) // 4096 * 4096
    print("experts %.1f MiB, sessions' KV %.1f MiB (%d x ~%d tokens), "
          "M = %.1f MiB" % (ex / 2**20, kv / 2**20, args.sessions, ctx,
                            budget / 2**20))
    modes = ["shared"] + ["fixed:%s" % p for p in args.splits.split(",")]
    rows = {m: [] for m in modes}
    print("%-9s %9s %9s %9s %8s %8s  %s" % (
        "mode", "A tok/s", "B tok/s", "all tok/s", "A moves", "B moves",
        "split at A's end / B's end (experts/kv MiB), store reads MiB A/B, "
        "KV restored MiB A/B, load1"))
    for _ in range(args.runs):
        for m in modes:
            r = one_run(store, m, args, budget)
            rows[m].append(r)
            print("%-9s %9.1f %9.1f %9.1f %8d %8d  %.1f/%.1f %.1f/%.1f, "
                  "%.1f/%.1f, %.1f/%.1f, %.2f" % (
                      m, r["A"]["tok_s"], r["B"]["tok_s"], r["tok_s"],
                      r["A"]["moves"], r["B"]["moves"],
                      r["A"]["experts_mib"], r["A"]["kv_mib"],
                      r["B"]["experts_mib"], r["B"]["kv_mib"],
                      r["A"]["expert_mib"], r["B"]["expert_mib"],
                      r["A"]["kv_restore_mib"], r["B"]["kv_restore_mib"],
                      r["load1"]), flush=True)
            print("%-9s CPU s A/B: %s" % ("", ", ".join(
                "%s %.2f/%.2f" % (d, r["A"]["cpu"][d], r["B"]["cpu"][d])
                for d in DAEMONS)), flush=True)
            if args.json:
                print(json.dumps(r), flush=True)
    med = {m: {"A": statistics.median(r["A"]["tok_s"] for r in rows[m]),
               "B": statistics.median(r["B"]["tok_s"] for r in rows[m]),
               "all": statistics.median(r["tok_s"] for r in rows[m])}
           for m in modes}
    print("medians over %d runs (load1 %.2f-%.2f):" % (
        args.runs, min(r["load1"] for m in modes for r in rows[m]),
        max(r["load1"] for m in modes for r in rows[m])))
    for m in modes:
        print("  %-9s A %.1f  B %.1f  all %.1f tok/s" % (
            m, med[m]["A"], med[m]["B"], med[m]["all"]))
    fixed = modes[1:]
    for ph in ("A", "B", "all"):
        best = max(fixed, key=lambda m: med[m][ph])
        print("  %s: best fixed %s %.1f tok/s; shared %.1f = %.3f of it" % (
            ph, best, med[best][ph], med["shared"][ph],
            med["shared"][ph] / med[best][ph]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
