#!/usr/bin/python3
"""KV restore-ahead benchmark (issue 24 item 1): many sequences whose KV is
several times kvd's page budget, spill on, all decoding at once.

Starts expertd, kvd (--budget B --spill-budget) and computed (--http-port)
on a private instance over the kjv-moe fixture (converted once into
$STRATA_CACHE_DIR), then runs --seqs greedy streaming /v1/completions
requests at once (distinct prompts of --prompt-words words, ~1.27 tokens each,
--max-tokens new tokens each) and prints per run: generated tokens/s over
the whole batch, the steps' wait for kvd pins and the part of it spent on
pins that had spilled pages to restore (the restore stall, from /metrics
strata_kv_restore_stall_seconds_total), KV bytes spilled and restored, and
the 1-minute load average.  Modes run interleaved, --runs times each, and
the medians are printed last:
  on     computed --kv-restore-ahead on (the default)
  off    computed --kv-restore-ahead off
  today  another computed binary (--today-computed PATH; e.g. one built
         from the commit before restore-ahead) with no such option
Each mode may run with the I/O queue's priorities on and off (issue 24
item 3, common/st_ioq.h): --ioq on,off runs every mode under STRATA_IOQ=on
and STRATA_IOQ=off (daemons' environment; off counts I/O by class without
ordering it), and --host-budget B makes expertd stream experts from the
store (a share of the experts, e.g. 50%), so that expert reads and KV
spill/restore share the device.  Each run prints the queue's per-class
bytes and wait (strata_io_bytes_total, strata_io_wait_seconds_total).
Queued requests that share spilled prefixes (restore ahead of admission):
--shared-prefixes K gives the requests K long prompt prefixes (request i
starts with prefix i mod K, then 4 words of its own) and --max-running R
below --seqs keeps requests in the queue; one request per prefix runs
first (max_tokens 1, not measured) so that every prefix is in kvd's
prefix cache, and with K above R idle prefixes spill while others run.
Each run then also prints kvd's prefix groups restored ahead of an
admission and those an admission had to restore itself, and the time
admissions waited for them (strata_kv_admission_restore_stall_seconds_total).
Prints figures, never asserts.

  scripts/bench-kv-restore.py [--seqs 32] [--prompt-words 20]
      [--max-tokens 200] [--kv-ratio 4] [--modes on,off] [--runs 3]
      [--today-computed PATH] [--ioq on|off|on,off] [--host-budget B]
      [--shared-prefixes K --max-running R]

The KV budget is the batch's KV bytes (--seqs x (prompt + max_tokens)
tokens x the model's bytes per token) / --kv-ratio.  kjv-moe holds 256
tokens of context, so 32 x ~225 tokens stand for the issue's
32 x 2,000: the ratio of KV to budget, not the length, is what spills.
Short prompts and long generations (the defaults) keep all the sequences
live at once, so their KV really is --kv-ratio times the budget; with long
prompts and few new tokens (e.g. --prompt-words 150 --max-tokens 48) the
scheduler's page cap lets sequences run to the end a few at a time and
little spills.
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
                           kv_bytes_per_token, metrics, stream)


class BenchInstance(Instance):
    """An Instance whose computed may be another binary."""

    def __init__(self, *a, computed_bin=None, **kw):
        super().__init__(*a, **kw)
        self.computed_bin = computed_bin

    def start_daemon(self, d):
        if d != "computed" or not self.computed_bin:
            return super().start_daemon(d)
        import subprocess
        log = open(os.path.join(self.tmp, d + ".log"), "a")
        self.procs[d] = subprocess.Popen(
            [self.computed_bin, "--instance", self.name, "--run-dir",
             self.run_dir] + self.args[d], stdout=log,
            stderr=subprocess.STDOUT)


def cpu_s(pid):
    """User + system CPU seconds of a live process."""
    with open("/proc/%d/stat" % pid) as f:
        v = f.read().rsplit(")", 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")


IOQ_CLASSES = ("demand", "kv-restore", "prefetch", "kv-spill")


def one_run(store, mode, args, budget, ioq="on"):
    cargs = ["--threads", str(args.threads), "--compute", args.compute,
             "--max-running", str(args.max_running or args.seqs),
             "--max-queued", "1024"]
    if mode in ("on", "off"):
        cargs += ["--kv-restore-ahead", mode]
    os.environ["STRATA_IOQ"] = ioq  # the daemons' environment
    inst = BenchInstance(store, tag="bkr", computed_args=cargs,
                         kvd_args=["--budget", str(budget),
                                   "--spill-budget", str(64 << 20)],
                         expertd_args=(["--host-budget", args.host_budget]
                                       if args.host_budget else []),
                         computed_bin=args.today_computed
                         if mode == "today" else None)
    inst.start(timeout_s=300)
    results = []
    lock = threading.Lock()

    def prompt_of(i):
        if not args.shared_prefixes:
            words = [WORDS[(i * 7 + k) % len(WORDS)]
                     for k in range(args.prompt_words)]
            return "%d %s" % (i, " ".join(words))
        k = i % args.shared_prefixes
        words = [WORDS[(k * 7 + j) % len(WORDS)]
                 for j in range(max(1, args.prompt_words - 4))]
        own = [WORDS[(i * 5 + j) % len(WORDS)] for j in range(4)]
        return "%d %s %d %s" % (k, " ".join(words), i, " ".join(own))

    def warm(k):
        stream(inst, "/v1/completions", {
            "prompt": prompt_of(k), "max_tokens": 1, "temperature": 0,
            "stream": True}, timeout=1200)

    def client(i):
        st, out = stream(inst, "/v1/completions", {
            "prompt": prompt_of(i), "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}, timeout=1200)
        n = pt = 0
        ok = st == 200 and out and out[-1] == "[DONE]"
        if ok:
            u = json.loads(out[-2]).get("usage", {})
            n, pt = u.get("completion_tokens", 0), u.get("prompt_tokens", 0)
        with lock:
            results.append((ok, n, pt))

    try:
        # every shared prefix in kvd's prefix cache first (not measured)
        ws = [threading.Thread(target=warm, args=(k,))
              for k in range(args.shared_prefixes)]
        for t in ws:
            t.start()
        for t in ws:
            t.join()
        m0 = metrics(inst)
        c0 = {d: cpu_s(inst.procs[d].pid) for d in ("kvd", "computed")}
        t0 = time.time()
        ts = [threading.Thread(target=client, args=(i,)) for i in range(args.seqs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.time() - t0
        m1 = metrics(inst)
        cpu = {d: cpu_s(inst.procs[d].pid) - c0[d] for d in c0}
    finally:
        inst.stop()

    def d(k):
        return m1.get(k, 0.0) - m0.get(k, 0.0)

    io = {}
    for c in IOQ_CLASSES:
        io[c + "_mib"] = d('strata_io_bytes_total{class="%s"}' % c) / 2**20
        io[c + "_wait_s"] = d('strata_io_wait_seconds_total{class="%s"}' % c)
        ops = d('strata_io_ops_total{class="%s"}' % c)
        io[c + "_io_ms"] = (1e3 * d('strata_io_seconds_total{class="%s"}' % c)
                            / ops if ops else 0.0)
    tokens = sum(r[1] for r in results)
    spill = d('strata_bytes_moved_total{link="host_to_nvme",kind="kv"}')
    rest = d('strata_bytes_moved_total{link="nvme_to_host",kind="kv"}')
    return {"mode": mode, "ioq": ioq, **io,
            "errors": sum(1 for r in results if not r[0]),
            "prompt_tokens": statistics.mean(r[2] for r in results),
            "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "steps": d("strata_steps_total"),
            "step_s": d("strata_step_seconds_total") or
            d("strata_step_seconds_sum"),
            "pin_s": d("strata_kv_pin_seconds_total"),
            "stall_s": d("strata_kv_restore_stall_seconds_total"),
            "stalls": d("strata_kv_restore_stalls_total"),
            "ahead_seqs": d("strata_kv_restore_ahead_seqs_total"),
            "spill_mib": spill / 2**20, "restore_mib": rest / 2**20,
            "cpu_kvd_s": cpu["kvd"], "cpu_computed_s": cpu["computed"],
            "deferred": d("strata_kv_restore_deferred_seqs_total"),
            "admit_stall_s":
            d("strata_kv_admission_restore_stall_seconds_total"),
            "admit_groups": d("strata_kv_admission_restore_groups_total"),
            "ahead_groups":
            d("strata_kv_prefix_restore_ahead_groups_total"),
            "load1": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=20,
                    help="prompt words (kjv-moe: ~1.27 tokens each)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--kv-ratio", type=float, default=4.0,
                    help="the batch's KV bytes / kvd's budget")
    ap.add_argument("--modes", default="on,off")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="computed --threads")
    ap.add_argument("--compute", default="fast", choices=("reference", "fast"))
    ap.add_argument("--today-computed", help="computed binary for mode today")
    ap.add_argument("--json", action="store_true", help="also print JSON lines")
    ap.add_argument("--ioq", default="on",
                    help="I/O queue priorities: on, off or on,off (each mode "
                    "under each)")
    ap.add_argument("--host-budget",
                    help="expertd --host-budget (default: all experts)")
    ap.add_argument("--shared-prefixes", type=int, default=0,
                    help="K long prompt prefixes shared by the requests "
                    "(0: distinct prompts)")
    ap.add_argument("--max-running", type=int, default=0,
                    help="computed --max-running (default: --seqs)")
    args = ap.parse_args()
    model = fixture("kjv-moe")
    cache = os.environ.get("STRATA_CACHE_DIR", os.path.expanduser("~/.cache/strata"))
    os.makedirs(cache, exist_ok=True)
    store = convert(model, os.path.join(cache, "kjv-moe-kvbench-bf16.strata"), "bf16")
    seq_tokens = int(args.prompt_words * 1.27) + args.max_tokens
    kv = args.seqs * seq_tokens * kv_bytes_per_token(model)
    budget = int(kv / args.kv_ratio) // 4096 * 4096
    modes = [(m, q) for m in args.modes.split(",")
             for q in args.ioq.split(",")]
    if any(q not in ("on", "off") for _, q in modes):
        ap.error("--ioq takes on, off or on,off")
    if any(m == "today" for m, _ in modes) and not args.today_computed:
        ap.error("mode today needs --today-computed PATH")
    print("%d sequences x ~%d tokens: KV %.1f MiB, kvd budget %.2f MiB (1/%.1f)"
          % (args.seqs, seq_tokens, kv / 2**20,
             budget / 2**20, args.kv_ratio))
    print("%-10s %6s %7s %8s %6s %8s %8s %8s %7s %9s %9s %7s %7s %6s %8s %6s %6s  %s" % (
        "mode/ioq", "errors", "tokens", "tok/s", "steps", "step s", "pin s",
        "stall s", "stalls", "spill MiB", "rest. MiB", "kvd cpu", "cw cpu",
        "load1", "adm st s", "adm g", "ahd g", "io MiB/wait s by class"))
    rows = {m: [] for m in modes}
    for _ in range(args.runs):
        for m in modes:
            r = one_run(os.path.abspath(store), m[0], args, budget, m[1])
            rows[m].append(r)
            print("%-10s %6d %7d %8.1f %6d %8.2f %8.3f %8.3f %7d %9.1f %9.1f %7.2f %7.2f %6.2f %8.3f %6d %6d  %s" % (
                "%s/%s" % m, r["errors"], r["tokens"], r["tok_s"], r["steps"],
                r["step_s"], r["pin_s"], r["stall_s"], r["stalls"],
                r["spill_mib"], r["restore_mib"], r["cpu_kvd_s"],
                r["cpu_computed_s"], r["load1"], r["admit_stall_s"],
                r["admit_groups"], r["ahead_groups"],
                " ".join("%s %.1f/%.3f" % (c, r[c + "_mib"], r[c + "_wait_s"])
                         for c in IOQ_CLASSES)), flush=True)
            if args.json:
                print(json.dumps(r), flush=True)
    print("medians over %d runs:" % args.runs)
    for m in modes:
        med = {k: statistics.median(r[k] for r in rows[m])
               for k in ("tok_s", "pin_s", "stall_s", "restore_mib",
                         "cpu_kvd_s", "cpu_computed_s", "load1",
                         "admit_stall_s", "admit_groups", "ahead_groups") +
               tuple(c + "_wait_s" for c in IOQ_CLASSES) +
               tuple(c + "_mib" for c in IOQ_CLASSES) +
               tuple(c + "_io_ms" for c in IOQ_CLASSES)}
        print("  %-10s tok/s %.1f  pin %.3f s  stall %.3f s  restored %.1f MiB  "
              "CPU kvd %.2f s computed %.2f s  load1 %.2f" % (
                  "%s/%s" % m, med["tok_s"], med["pin_s"], med["stall_s"],
                  med["restore_mib"], med["cpu_kvd_s"], med["cpu_computed_s"],
                  med["load1"]))
        print("  %-10s admissions: stall %.4f s, %d groups restored by "
              "them, %d ahead" % ("", med["admit_stall_s"],
                                  med["admit_groups"], med["ahead_groups"]))
        print("  %-10s io: %s" % ("", "; ".join(
            "%s %.1f MiB wait %.3f s, %.2f ms per I/O" % (
                c, med[c + "_mib"], med[c + "_wait_s"], med[c + "_io_ms"])
            for c in IOQ_CLASSES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
