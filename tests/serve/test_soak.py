#!/usr/bin/python3
"""Soak: 32 clients for DURATION seconds (default 600) against computed's
HTTP API on tiny-qwen3moe: streaming and whole completions and chats, stop
strings, sampled and greedy, and one request in ten closed by its client
after the first chunk.  Must end with zero errors (every request answered
200 with a well-formed response, or closed by us), no sequence running or
queued, no KV page used, aborted == the requests we closed, and flat
memory: computed's own RSS (anonymous pages; the shared KV and expert
pools are kvd's and expertd's, bounded by their budgets, and dense.bin's
file pages are the model, both printed apart), measured idle after a
warm-up (a tenth of the run, same load) and idle at the end, grows at most
1 %.

Usage: test_soak.py [DURATION_S]
"""
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Instance, convert, fixture, metrics, request, stream  # noqa

N_CLIENTS = 32


def main():
    duration = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
    model = fixture("tiny-qwen3moe")
    tmp = tempfile.mkdtemp(prefix="strata-soak-")
    store = convert(model, os.path.join(tmp, "st"), "bf16")
    inst = Instance(store, tag="soak", computed_args=["--max-running", "32"])
    inst.start()
    stats = {"ok": 0, "closed": 0, "errors": 0, "tokens": 0}
    lock = threading.Lock()
    stop_at = [0.0]

    def client(ci):
        rng = random.Random(ci + int(stop_at[0]))
        while time.time() < stop_at[0]:
            chat = rng.random() < 0.3
            path = "/v1/chat/completions" if chat else "/v1/completions"
            body = {"max_tokens": rng.randint(4, 48),
                    "temperature": rng.choice([0, 0.7]), "seed": rng.randint(0, 1 << 30)}
            words = " ".join("w%d" % rng.randint(0, 999) for _ in range(rng.randint(1, 60)))
            if chat:
                body["messages"] = [{"role": "user", "content": words}]
            else:
                body["prompt"] = words
            if rng.random() < 0.2:
                body["stop"] = ["e", "Doc"]
            close = rng.random() < 0.1
            if close:  # still running when closed: no stop, no chat EOS
                body = {"prompt": "w1 w2 w3", "max_tokens": 5000}
                path = "/v1/completions"
            try:
                if close or rng.random() < 0.6:
                    st, out = stream(inst, path, dict(
                        body, stream=True,
                        stream_options={"include_usage": True}),
                                     on_chunk=(lambda i, p, t: False) if close else None)
                    if close:
                        good = st == 200 and len(out) == 1
                        kind = "closed"
                        n = 0
                    else:
                        good = st == 200 and out[-1] == "[DONE]"
                        good = good and len(out) >= 3
                        usage = json.loads(out[-2]) if good else {}
                        last = json.loads(out[-3]) if good else {}
                        n = (usage.get("usage") or {}).get("completion_tokens", 0)
                        good = good and last["choices"][0]["finish_reason"] in ("stop", "length")
                        kind = "ok"
                else:
                    st, j = request(inst, "POST", path, body)
                    good = st == 200 and j["choices"][0]["finish_reason"] in ("stop", "length")
                    n = j["usage"]["completion_tokens"] if good else 0
                    kind = "ok"
            except Exception as e:  # noqa: BLE001 - counted as an error
                print("client %d: %r" % (ci, e))
                good, kind, n = False, "ok", 0
            with lock:
                if good:
                    stats[kind] += 1
                    stats["tokens"] += n
                else:
                    stats["errors"] += 1

    def phase(seconds, samples):
        stop_at[0] = time.time() + seconds
        ts = [threading.Thread(target=client, args=(i,)) for i in range(N_CLIENTS)]
        for t in ts:
            t.start()
        while time.time() < stop_at[0]:
            time.sleep(min(10, max(0.1, stop_at[0] - time.time())))
            samples.append(inst.rss_own_kib())
        for t in ts:
            t.join()
        time.sleep(0.5)  # idle: the last requests retired

    samples = []
    phase(duration / 10, [])
    rss0 = inst.rss_own_kib()
    shm0 = inst.rss_kib(field="RssShmem")
    file0 = inst.rss_kib(field="RssFile")
    phase(duration, samples)
    rss1 = inst.rss_own_kib()
    shm1 = inst.rss_kib(field="RssShmem")
    file1 = inst.rss_kib(field="RssFile")
    m = metrics(inst)
    inst.stop()
    growth = (rss1 - rss0) / rss0 * 100.0
    print("requests: %d ok, %d closed by the client, %d errors; %d tokens in "
          "%.0f s (%.1f tokens/s)" % (stats["ok"], stats["closed"], stats["errors"],
                                      stats["tokens"], duration * 1.1,
                                      stats["tokens"] / (duration * 1.1)))
    print("computed anonymous RSS idle after warm-up %d KiB, idle at the end %d KiB "
          "(%+.2f %%), max %d KiB; shared pool pages touched %d -> %d KiB; "
          "file pages %d -> %d KiB" % (rss0, rss1, growth,
                                        max(samples + [rss1]), shm0, shm1,
                                        file0, file1))
    fails = []
    if stats["errors"]:
        fails.append("%d errors" % stats["errors"])
    if stats["ok"] < N_CLIENTS:
        fails.append("too few requests completed")
    if growth > 1.0:
        fails.append("RSS grew %.2f %% (> 1 %%)" % growth)
    if m["strata_sequences_running"] or m["strata_requests_queued"]:
        fails.append("sequences left running or queued")
    if m['strata_kv_pages{tier="host",state="used"}']:
        fails.append("KV pages still used")
    if m['strata_requests_finished_total{reason="aborted"}'] != stats["closed"]:
        fails.append("aborted %d != closed %d" % (
            m['strata_requests_finished_total{reason="aborted"}'], stats["closed"]))
    print("anonymous RSS every 10 s under load (KiB):",
          " ".join(str(x) for x in samples))
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print("ok: soak")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
