#!/usr/bin/python3
"""Restore-ahead under heavy spill (issue 24 item 1) on kjv-moe (reference
mode): 16 greedy requests at once whose KV is about 4x kvd's budget, with
a spill file, give the same tokens and log-probabilities (printed with 17
digits: equal floats) with computed --kv-restore-ahead on and off as with
a budget that holds everything (no spill), and so they do with
restore-ahead on when kvd is killed (SIGKILL) 1 s into the run and started
again (it adopts the pool and the spill file; computed waits for it).
Checks, on values that could be wrong: the spilled runs did spill and
restore (bytes moved both ways); with restore-ahead on, sequences were
asked ahead of their step; with it off, none were; the killed kvd's
successor adopted the pool.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (Instance, check, finish, convert, greedy_batch,  # noqa
                           fixture, kv_bytes_per_token, metrics)

N = 16
PROMPT_WORDS = 20
MAX_TOKENS = 100


def run(store, budget, ahead, kill_after=None):
    cargs = ["--compute", "reference", "--threads", "1",
             "--max-running", str(N), "--restart-wait", "60"]
    if ahead:
        cargs += ["--kv-restore-ahead", ahead]
    kargs = ["--budget", str(budget)]
    if ahead:
        kargs += ["--spill-budget", str(64 << 20)]
    inst = Instance(store, tag="kra", computed_args=cargs, kvd_args=kargs)
    inst.start(timeout_s=120)
    try:
        out = greedy_batch(inst, N, PROMPT_WORDS, MAX_TOKENS,
                           "kvd" if kill_after else None, kill_after or 0)
        m = metrics(inst)
    finally:
        inst.stop()
    with open(os.path.join(inst.tmp, "kvd.log")) as f:
        log = f.read()
    return out, m, log


def main():
    model = fixture("kjv-moe")
    # the daemons' logs (files) say info: the adoption report is one
    os.environ["STRATA_LOG"] = "info"
    tmp = tempfile.mkdtemp(prefix="strata-kra-")
    store = convert(model, os.path.join(tmp, "kjv.strata"), "bf16")
    kv = N * (int(PROMPT_WORDS * 1.3) + 4 + MAX_TOKENS) * kv_bytes_per_token(model)
    small = kv // 4 // 4096 * 4096
    ref, _, _ = run(store, 64 << 20, None)
    check(all(r[2] > 0 for r in ref), "reference: every request generated")
    for mode in ("on", "off", "on+kill"):
        got, m, log = run(store, small, mode.split("+")[0],
                          1.0 if "kill" in mode else None)
        if "kill" in mode:
            adopt = [l for l in log.splitlines() if "adopted kv pool" in l]
            check(len(adopt) == 1 and " 0 failed" in adopt[0],
                  "on+kill: the new kvd adopted the pool, no sequence "
                  "failed: %s" % (adopt[0][-200:] if adopt else
                                  "(no adoption in %d bytes of log)" %
                                  len(log)))
        spill = m.get('strata_bytes_moved_total{link="host_to_nvme",kind="kv"}', 0)
        rest = m.get('strata_bytes_moved_total{link="nvme_to_host",kind="kv"}', 0)
        ahead = m.get("strata_kv_restore_ahead_seqs_total", -1)
        check(spill > kv / 2 and rest > kv / 2,
              "%s: KV spilled (%.1f MiB) and restored (%.1f MiB) under a "
              "budget of %.2f MiB" % (mode, spill / 2**20, rest / 2**20,
                                      small / 2**20))
        if mode.startswith("on"):
            check(ahead > 0, "%s: %d sequences asked ahead" % (mode, ahead))
        else:
            check(ahead == 0, "off: no sequence asked ahead (%d)" % ahead)
        same = [i for i in range(N) if got[i] == ref[i]]
        check(len(same) == N, "%s: %d of %d requests give the no-spill "
              "run's tokens and logprobs bit for bit%s" % (
                  mode, len(same), N, "" if len(same) == N else
                  " (first differing: %r vs %r)" % (
                      next(got[i] for i in range(N) if i not in same)[0][:80],
                      next(ref[i] for i in range(N) if i not in same)[0][:80])))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
