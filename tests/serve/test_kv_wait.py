#!/usr/bin/python3
"""KV pressure without spilling queues requests instead of failing them
(issue 24): on kjv-moe (reference mode), 8 greedy requests at once against
a kvd without a spill file whose pool holds about 3 of them (prompt +
max_tokens each):
  pressure     kvd --budget of 3 sequences: every request answers 200 with
               the tokens and log-probabilities of the same request run
               alone (on a kvd that holds everything), and the queue was
               used (/metrics strata_kv_admission_waits_total > 0);
  shared       --memory-budget M for expertd and kvd, KV's half of M
               about 3 sequences: the same, and the ledger moved memory
               from experts to KV by value while requests waited (the
               move log of `strata status --json`: why "value", kv's
               gain above experts' loss).
  too-big      a kvd holding one request: one whose prompt and max_tokens
               not even the empty pool holds is answered 503 at once,
               naming the pages it needs and the pool's, while a request
               that fits, sent beside it, answers 200 as run alone;
               once kvd's pool is known such a request is refused at
               submission, a stream too (HTTP 503, not 200 and an SSE
               error event).
  boundary     a kvd of exactly 5 pages a stream (80 rows): a request
               whose prompt and max_tokens - 1 fill the 80 rows (the last
               sampled token is never evaluated, so its row never
               written) answers 200 with all its tokens; one more
               max_token is refused at once.  Before the fix the first
               was refused too (its last token counted as a row).  A chat
               without max_tokens (the rest of the context, more than
               the pool) is served up to what the pool holds; one whose
               prompt fills the pool exactly gets its one token
               (before: refused).
Before the fix the pressure run failed requests with HTTP 503 "KV pool
exhausted" (STRATA_BUILD_DIR pointing at an older build shows it).
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (BUILD, WORDS, Instance, check, finish,  # noqa
                           convert, fixture, greedy_batch,
                           kv_bytes_per_token, metrics, request)

N = 8
PROMPT_WORDS = 20
MAX_TOKENS = 100
PAGE_ROWS = 16      # computed's default --page-rows
FIT = 3             # sequences the pool holds


def ledger_log(inst):
    """The ledger's move log (strata status --json: memory.log), [] when
    there is none."""
    r = subprocess.run([os.path.join(BUILD, "cli", "strata"), "status",
                        "--json", "--instance", inst.name, "--run-dir",
                        inst.run_dir], capture_output=True, text=True)
    try:
        return json.loads(r.stdout).get("memory", {}).get("log", [])
    except ValueError:
        print("info: strata status --json: rc %d, %s" % (r.returncode,
                                                        r.stderr[-300:]))
        return []


def run(store, kvd_args, expertd_args=(), alone=False):
    """The N requests; returns (results, /metrics, ledger move log)."""
    inst = Instance(store, tag="kvw", kvd_args=kvd_args,
                    expertd_args=expertd_args,
                    computed_args=["--compute", "reference", "--threads",
                                   "1", "--max-running", str(N)])
    inst.start(timeout_s=120)
    try:
        out = greedy_batch(inst, N, PROMPT_WORDS, MAX_TOKENS, alone=alone)
        m = metrics(inst)
        log = ledger_log(inst)
    finally:
        inst.stop()
    return out, m, log


def compare(mode, got, ref):
    bad = [i for i in range(N) if got[i] != ref[i]]
    http = [got[i][0][:160] for i in bad if got[i][0].startswith("HTTP")]
    check(not http, "%s: every request answered 200%s" % (
        mode, "" if not http else " (%d did not; first: %s)" % (
            len(http), http[0])))
    check(not bad, "%s: %d of %d requests give the tokens and logprobs of "
          "the request run alone" % (mode, N - len(bad), N))


def too_big(store, seq, ref):
    """A kvd holding one request of ours: request 0 (as greedy_batch
    makes it) and, beside it, one asking for 230 tokens (~256 rows: 2x the
    pool)."""
    inst = Instance(store, tag="kvw", kvd_args=["--budget", str(seq)],
                    computed_args=["--compute", "reference", "--threads",
                                   "1", "--max-running", str(N)])
    inst.start(timeout_s=120)
    out = {}

    def big():
        out["big"] = request(inst, "POST", "/v1/completions", {
            "prompt": "big " + " ".join(WORDS[:20]), "max_tokens": 230,
            "temperature": 0}, timeout=60)
    try:
        t = threading.Thread(target=big)
        t.start()
        small = greedy_batch(inst, 1, PROMPT_WORDS, MAX_TOKENS)
        t.join()
        # kvd's pool known by now: a stream is refused at submission,
        # with the HTTP status (before: 200, then an SSE error event)
        sst, sbody = request(inst, "POST", "/v1/completions", {
            "prompt": "big " + " ".join(WORDS[:20]), "max_tokens": 230,
            "temperature": 0, "stream": True}, timeout=60)
    finally:
        inst.stop()
    check(sst == 503 and "KV pool exhausted" in json.dumps(sbody),
          "too-big: a stream is answered HTTP 503 naming the pages, not "
          "200 and an error event (HTTP %d: %s)" % (
              sst, json.dumps(sbody)[:200]))
    st, body = out["big"]
    msg = json.dumps(body)
    check(st == 503 and "KV pool exhausted" in msg and "pages" in msg and
          "max_tokens" in msg, "too-big: a request the empty pool cannot "
          "hold is refused, naming its pages and the pool's (HTTP %d: %s)"
          % (st, msg[:300]))
    check(small[0] == ref[0], "too-big: the request beside it answers as "
          "run alone (%s)" % small[0][0][:80])


def boundary(store, model):
    """A kvd pool of exactly 5 pages a stream: max_tokens that fill its
    80 rows with the prompt (less the last, unwritten token) is served;
    one more is refused at once, naming the pages."""
    rows = 5 * PAGE_ROWS
    inst = Instance(store, tag="kvw", kvd_args=[
        "--budget", str(rows * kv_bytes_per_token(model))],
        computed_args=["--compute", "reference", "--threads", "1"])
    inst.start(timeout_s=120)
    prompt = " ".join(WORDS[:PROMPT_WORDS])
    try:
        st, body = request(inst, "POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "temperature": 0})
        n = body["usage"]["prompt_tokens"] if st == 200 else 0
        check(st == 200 and 0 < n < rows, "boundary: the probe answers "
              "(HTTP %d, prompt of %d tokens)" % (st, n))
        mt = rows - n + 1
        st, body = request(inst, "POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": mt, "temperature": 0})
        got = body["usage"]["completion_tokens"] if st == 200 else 0
        check(st == 200 and got == mt, "boundary: %d prompt tokens and "
              "max_tokens %d (%d rows written) in a pool of %d rows a "
              "stream answer 200 with every token (HTTP %d, %d tokens: "
              "%s)" % (n, mt, n + mt - 1, rows, st, got,
                       json.dumps(body)[:200]))
        st, body = request(inst, "POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": mt + 1, "temperature": 0})
        msg = json.dumps(body)
        check(st == 503 and "KV pool exhausted" in msg and
              "max_tokens (%d)" % (mt + 1) in msg, "boundary: one more "
              "max_token (%d rows) is refused at once (HTTP %d: %s)" % (
                  n + mt, st, msg[:300]))
        # a chat without max_tokens asks for the rest of the context
        # (256 rows), more than the pool's 80: served up to what the pool
        # holds, as with a shorter context (before: refused)
        st, body = request(inst, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0})
        u = body.get("usage", {}) if st == 200 else {}
        fin = body["choices"][0]["finish_reason"] if st == 200 else None
        nc, got = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
        check(st == 200 and 0 < got <= rows - nc + 1 and
              (fin != "length" or got == rows - nc + 1),
              "boundary: a chat without max_tokens is served up to the "
              "pool's %d rows (HTTP %d, %d prompt + %d tokens, finish "
              "%s: %s)" % (rows, st, nc, got, fin, json.dumps(body)[:300]))
        exact_chat(inst, rows)
    finally:
        inst.stop()


def exact_chat(inst, rows):
    """A chat without max_tokens whose prompt fills the pool's rows a
    stream exactly: one token fits (its row is never written), served
    with finish "length" (before: refused as a prompt the pool cannot
    hold); a prompt one row longer is refused, the message naming the
    prompt (before: "lower max_tokens", which cannot help)."""
    words = (WORDS * 8)
    seen = {}

    def prompt_of(text):
        st, body = request(inst, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1, "temperature": 0})
        if st == 200:
            return body["usage"]["prompt_tokens"]
        # past the pool: the refusal names the prompt's tokens
        m = re.search(r"the prompt \((\d+) tokens\)", json.dumps(body))
        return int(m.group(1)) if st == 503 and m else None
    # the shortest text whose chat prompt reaches rows (prompt tokens
    # grow with the words), then texts around it for rows exactly
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi) // 2
        n = prompt_of(" ".join(words[:mid]))
        if n is not None:
            seen[n] = " ".join(words[:mid])
        if n is not None and n < rows:
            lo = mid + 1
        else:
            hi = mid
    for k in range(max(lo - 2, 1), lo + 4):
        for tail in ("", ".", " i", " i."):
            text = " ".join(words[:k]) + tail
            n = prompt_of(text)
            if n is not None:
                seen.setdefault(n, text)
    check(rows in seen, "boundary: a chat text of exactly %d prompt tokens "
          "found (got %s)" % (rows, sorted(seen)[:20]))
    if rows not in seen:
        return
    st, body = request(inst, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": seen[rows]}],
        "temperature": 0})
    u = body.get("usage", {}) if st == 200 else {}
    fin = body["choices"][0]["finish_reason"] if st == 200 else None
    check(st == 200 and u.get("prompt_tokens") == rows and
          u.get("completion_tokens") == 1 and fin == "length",
          "boundary: a chat without max_tokens whose prompt fills the "
          "pool's %d rows is served one token, finish length (HTTP %d: "
          "%s)" % (rows, st, json.dumps(body)[:300]))
    if rows + 1 in seen:
        st, body = request(inst, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": seen[rows + 1]}],
            "temperature": 0})
        msg = json.dumps(body)
        check(st == 503 and "KV pool exhausted" in msg and
              "alone" in msg and "shorten the prompt" in msg,
              "boundary: a chat prompt of %d tokens (one past the pool) "
              "is refused as a prompt too long for the pool, not with "
              "advice to lower max_tokens (HTTP %d: %s)" % (
                  rows + 1, st, msg[:300]))


def main():
    model = fixture("kjv-moe")
    os.environ["STRATA_LOG"] = "info"
    tmp = tempfile.mkdtemp(prefix="strata-kvw-")
    store = convert(model, os.path.join(tmp, "kjv.strata"), "bf16")
    # one request's rows, page-rounded, at most: its prompt ("i" and the
    # words, ~1.3 tokens a word, BOS) and max_tokens
    rows = int(PROMPT_WORDS * 1.3) + 4 + MAX_TOKENS
    rows = -(-rows // PAGE_ROWS) * PAGE_ROWS
    seq = rows * kv_bytes_per_token(model)
    ref, _, _ = run(store, ["--budget", str(64 << 20)], alone=True)
    check(all(r[2] > 0 for r in ref), "alone: every request generated")

    got, m, _ = run(store, ["--budget", str(FIT * seq)])
    compare("pressure", got, ref)
    waits = m.get("strata_kv_admission_waits_total", 0)
    check(waits > 0, "pressure: %d requests waited in the queue for KV "
          "pages (kvd holds %d of %d)" % (waits, FIT, N))

    # kvd's floor is one sequence of its longest (kjv-moe: 256 rows, ~2
    # of ours); KV joins second and gets what expertd leaves, half of M
    shared = 2 * FIT * seq // 4096 * 4096
    got, m, log = run(store, ["--memory-budget", str(shared),
                              "--max-rows-per-seq", "256"],
                      ["--memory-budget", str(shared)])
    compare("shared", got, ref)
    e2k = [x for x in log if x.get("from") == "experts" and
           x.get("to") == "kv" and x.get("why") == "value" and
           x.get("kind") == "move"]
    check(e2k and all(x["gain"] > x["loss"] for x in e2k),
          "shared: the ledger moved memory from experts to KV by value "
          "while requests waited (%d such moves of %d logged%s; M = %.2f "
          "MiB)" % (len(e2k), len(log), "" if not e2k else
                    ", first: %.2f MiB, kv gain %.3g > experts loss %.3g" % (
                        e2k[0]["bytes"] / 2**20, e2k[0]["gain"],
                        e2k[0]["loss"]), shared / 2**20))
    print("info: shared: %d requests waited for KV pages" %
          m.get("strata_kv_admission_waits_total", 0))
    too_big(store, seq, ref)
    boundary(store, model)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
