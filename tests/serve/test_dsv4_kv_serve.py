"""DeepSeek-V4 served with its state in kvd pages (issue 9: prefix cache,
kvd restart and spill in the daemon), on ../shared tiny-deepseek-v4 with
real expertd, kvd and computed (HTTP API):

  - prefix cache: a prompt (p5_code plus a tail) computed cold, then
    p5_code alone (it shares the first pages: rows reused, a multiple of
    the page size, at least 9 pages; its greedy text and log-probabilities
    equal the reference's), then the first prompt again (every full page
    of its prompt but the last token reused: the count is asserted
    exactly; text and log-probabilities equal its cold run's, bit for bit);
  - kvd killed with SIGKILL during a streamed 160-token V4 generation
    and started again: computed re-connects, the generation completes with
    the text and log-probabilities of an undisturbed run, the first 32
    equal to the reference's (p5_code);
  - kvd with a budget smaller than two concurrent V4 sequences plus their
    cached pages and a spill file: pages are spilled and restored, and
    both requests give the reference's log-probabilities and the texts of
    the cold runs;
  - a request that cannot fit a 2 MiB pool fails (the pool's error) in a
    step it shares with a decoding V4 sequence: the step is retried one
    request at a time (the decoding run is a replay) and the other
    generation completes unchanged.

Figures printed: kvd pages per token of the V4 state (under load).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Instance, convert, fixture, metrics, stream  # noqa
from test_dsv4_serve import (FAILS, check, close, completion,  # noqa
                             ref_logprobs)

PAGE_ROWS = 16  # computed's default --page-rows
REUSED = "strata_prefix_cache_rows_reused_total"
SPILLED = 'strata_bytes_moved_total{link="host_to_nvme",kind="kv"}'
RESTORED = 'strata_bytes_moved_total{link="nvme_to_host",kind="kv"}'


def run(inst, case, text=None, **extra):
    """A greedy completion: (text, token log-probabilities, prompt tokens,
    prompt rows the prefix cache gave it)."""
    r0 = metrics(inst)[REUSED]
    c = dict(case, text=text or case["text"])
    st, j = completion(inst, c, **extra)
    if not check(st == 200, "POST /v1/completions (%s): %s"
                 % (case["name"], st)):
        print(j)
        return None, None, 0, 0
    ch = j["choices"][0]
    return (ch["text"], ch["logprobs"]["token_logprobs"],
            j["usage"]["prompt_tokens"], metrics(inst)[REUSED] - r0)


def test_prefix(inst, p5):
    tail = "\n\n# merge_sorted([1, 3], [2]) == [1, 2, 3]\n"
    t_cold, lp_cold, n_long, reused = run(inst, p5, p5["text"] + tail)
    if t_cold is None:
        return None
    check(reused == 0 and n_long > p5["n_prompt"],
          "cold: %d prompt tokens, no rows reused (%d)" % (n_long, reused))
    t5, lp5, n5, reused5 = run(inst, p5)
    check(reused5 % PAGE_ROWS == 0 and 9 * PAGE_ROWS <= reused5 < n5,
          "p5_code after the longer prompt: %d of its %d prompt rows reused "
          "(whole pages of the shared prefix)" % (reused5, n5))
    check(lp5 is not None and close(lp5, ref_logprobs(p5)),
          "p5_code with reused rows: log-probabilities equal the reference's")
    t_warm, lp_warm, _, reused_warm = run(inst, p5, p5["text"] + tail)
    want = (n_long - 1) // PAGE_ROWS * PAGE_ROWS
    check(reused_warm == want, "the longer prompt again: %d rows reused, "
          "every full page before its last token (%d)" % (reused_warm, want))
    check(t_warm == t_cold and lp_warm == lp_cold,
          "the longer prompt again: greedy text and log-probabilities equal "
          "its cold run's exactly")
    m = metrics(inst)
    toks = n_long * 2 + n5 + 3 * 32
    print("figures (kvd, V4 state, under load): %d pages of %d bytes at the "
          "peak for 3 requests (%d tokens, cached prefixes kept)"
          % (m['strata_kv_pages{tier="host",state="peak"}'],
             m["strata_kv_page_bytes"], toks))
    return t5


def test_kvd_restart(inst, p5, text5):
    """kvd kill -9 after the 4th streamed token of a 160-token generation
    (computed runs at most 64 events ahead of the reader), started again
    at once."""
    n_gen = 160
    st, j = completion(inst, p5, max_tokens=n_gen)
    if not check(st == 200, "a %d-token V4 generation: %s" % (n_gen, st)):
        print(j)
        return
    want_text = j["choices"][0]["text"]
    want_lp = j["choices"][0]["logprobs"]["token_logprobs"]
    check(want_text.startswith(text5), "its first 32 tokens are the "
          "32-token generation's")
    killed = []

    def on_chunk(i, payload, t):
        if i == 4 and not killed:
            kvd = inst.procs["kvd"]
            kvd.kill()
            kvd.wait()
            killed.append(kvd.pid)
            time.sleep(0.3)
            inst.start_daemon("kvd")
        return True

    st, payloads = stream(inst, "/v1/completions",
                          {"prompt": p5["text"], "temperature": 0,
                           "max_tokens": n_gen, "stream": True,
                           "logprobs": 1}, on_chunk=on_chunk)
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks
                   if "choices" in c)
    lps = [x for c in chunks if "choices" in c and c["choices"][0]["logprobs"]
           for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    # computed talked to the new kvd before the generation ended: the
    # kill landed in it
    check(bool(killed) and "re-connected to a restarted kvd" in
          inst.log("computed"), "kvd killed (SIGKILL) during the V4 "
          "generation and computed re-connected to the new one")
    check(st == 200 and payloads[-1] == "[DONE]" and text == want_text and
          lps == want_lp, "after a kvd kill -9 + restart the V4 generation "
          "completes with the undisturbed run's text and log-probabilities "
          "(%d chunks, %d tokens)" % (len(chunks), len(lps)))
    check(close(lps[:32], ref_logprobs(p5)), "after the kvd restart: the "
          "first 32 tokens' log-probabilities equal the reference's")
    st, j = completion(inst, p5)
    check(st == 200 and j["choices"][0]["text"] == text5,
          "a request after the restart (pages adopted from the old kvd) "
          "gives the same text")


def test_spill(store, cases, texts):
    """Two V4 sequences at once in a pool smaller than both."""
    p4, p5 = cases["p4_harbour"], cases["p5_code"]
    inst = Instance(store, tag="v4sp", kvd_args=[
        "--budget", "4MiB", "--spill-budget", "64MiB"])
    try:
        inst.start()
        res = {}

        def one(case):
            res[case["name"]] = completion(inst, case)

        th = [threading.Thread(target=one, args=(c,)) for c in (p4, p5)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for c in (p4, p5):
            st, j = res[c["name"]]
            ok = st == 200
            if ok:
                ch = j["choices"][0]
                ok = close(ch["logprobs"]["token_logprobs"], ref_logprobs(c))
                ok = ok and (c["name"] not in texts or
                             ch["text"] == texts[c["name"]])
            else:
                print(j)
            check(ok, "spill: %s at once with the other gives the reference's "
                  "log-probabilities and the cold text" % c["name"])
        m = metrics(inst)
        check(m[SPILLED] > 0 and m[RESTORED] > 0,
              "kvd spilled %d and restored %d bytes of V4 pages (pool of %d "
              "pages)" % (m[SPILLED], m[RESTORED],
                          m['strata_kv_pages{tier="host",state="total"}']))
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "spill instance: %s\n%s" % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])


def test_step_failure(store, cases):
    """A V4 request that cannot fit the pool fails in a step it shares
    with a decoding one: the scheduler retries the step's requests one at
    a time, the decoding sequence's run is a replay (a V4 state cannot
    evaluate a position twice) and its generation goes on unchanged."""
    p2, p5 = cases["p2_sliding"], cases["p5_code"]
    # kvd counts ceil(rows / 16) pages in each of the 18 streams for a
    # reservation: 128 pages hold 112 rows (p2: 39 + 64; p5: 169 + 32)
    n_gen = 64
    inst = Instance(store, tag="v4sf", kvd_args=["--budget", "2MiB"])
    try:
        inst.start()
        st, j = completion(inst, p2, max_tokens=n_gen)
        if not check(st == 200, "p2_sliding alone in a 2 MiB pool: %s"
                     % st):
            print(j)
            return
        want_text = j["choices"][0]["text"]
        want_lp = j["choices"][0]["logprobs"]["token_logprobs"]
        big = []

        def on_chunk(i, payload, t):
            # p2 decodes (computed runs ahead of this reader); p5's
            # prompt joins its steps and does not fit
            if i == 1 and not big:
                big.append(completion(inst, p5))
            return True

        st, payloads = stream(inst, "/v1/completions",
                              {"prompt": p2["text"], "temperature": 0,
                               "max_tokens": n_gen, "stream": True,
                               "logprobs": 1}, on_chunk=on_chunk)
        chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks
                       if "choices" in c)
        lps = [x for c in chunks
               if "choices" in c and c["choices"][0]["logprobs"]
               for x in c["choices"][0]["logprobs"]["token_logprobs"]]
        bst, bj = big[0] if big else (0, {})
        msg = bj.get("error", {}).get("message", "") \
            if isinstance(bj, dict) else ""
        check(bst >= 400 and "KV pool exhausted" in msg,
              "p5_code in a 2 MiB pool fails with the pool's error (%s: %s)"
              % (bst, msg[:120]))
        check("retrying them one by one" in inst.log("computed"),
              "the shared step failed and was retried one request at a time")
        check(st == 200 and text == want_text and lps == want_lp and
              close(lps[:32], ref_logprobs(p2)),
              "p2_sliding, whose step failed with p5_code's, completes with "
              "its undisturbed text and log-probabilities (%d tokens)"
              % len(lps))
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "step-failure instance: %s\n%s"
              % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])


def main():
    model = fixture("tiny-deepseek-v4")
    ref = json.load(open(os.path.join(model, "reference.json")))
    cases = {c["name"]: c for c in ref["cases"]}
    tmp = tempfile.mkdtemp(prefix="strata-v4kv-")
    os.environ["STRATA_CACHE_DIR"] = os.path.join(tmp, "cache")
    store = convert(model, os.path.join(tmp, "store"), experts="mxfp4")
    p5 = cases["p5_code"]
    texts = {}
    inst = Instance(store, tag="v4kv")
    try:
        inst.start()
        t5 = test_prefix(inst, p5)
        if t5 is not None:
            texts["p5_code"] = t5
            test_kvd_restart(inst, p5, t5)
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "V4 on kvd: %s\n%s" % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])
    test_spill(store, cases, texts)
    test_step_failure(store, cases)
    subprocess.run(["rm", "-rf", tmp])
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)


if __name__ == "__main__":
    main()
