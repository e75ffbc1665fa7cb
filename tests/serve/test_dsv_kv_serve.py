"""The DeepSeek-V4 family served with its state in kvd pages, one test for
both revisions (argv[1]: v4 or v41; issue 9: prefix cache, kvd restart
and spill in the daemon; issue 11: the same in the V4.1 formats), with
real expertd (V4.1: experts and the Engram tier), kvd and computed (HTTP
API).

v4, on ../shared tiny-deepseek-v4:

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

v41, on ../shared tiny-deepseek-v41:

  - prefix cache: p5_code cold (no rows reused), then p5_code plus a tail
    (it maps whole pages of p5_code's prompt: a multiple of the page size,
    at least 9 pages), then p5_code again (every full page before its last
    token reused, the count asserted exactly) and the longer prompt again
    (the same, exactly): each warm run's greedy text and log-probabilities
    equal the earlier run's of the same prompt, bit for bit (the Engram
    hash reads the previous token ids: the mapped prefix's history must be
    the prompt's);
  - kvd killed with SIGKILL during a streamed 128-token generation and
    started again: computed re-connects, the generation completes with the
    text and log-probabilities of an undisturbed run;
  - kvd with a pool smaller than two concurrent V4.1 sequences and a
    spill file: pages are spilled and restored, and both requests give
    the texts and log-probabilities of their runs in the large pool;
  - a request that cannot fit a small pool fails (the pool's error) in a
    step it shares with a decoding V4.1 sequence: the step is retried one
    request at a time (the decoding run is a replay, skipped) and the
    other generation completes with its undisturbed text and
    log-probabilities.

Figures printed: kvd pages per token of the V4.1 state (under load).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (FAILS, Instance, check, convert, fixture,  # noqa
                           metrics, stream)
from test_dsv_serve import close, completion, ref_logprobs  # noqa

PAGE_ROWS = 16  # computed's default --page-rows
REUSED = "strata_prefix_cache_rows_reused_total"
SPILLED = 'strata_bytes_moved_total{link="host_to_nvme",kind="kv"}'
RESTORED = 'strata_bytes_moved_total{link="nvme_to_host",kind="kv"}'
TAIL = "\n\n# merge_sorted([1, 3], [2]) == [1, 2, 3]\n"


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


def test_prefix_v4(inst, p5):
    """Returns p5_code's greedy text (None when the first run failed)."""
    t_cold, lp_cold, n_long, reused = run(inst, p5, p5["text"] + TAIL)
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
    t_warm, lp_warm, _, reused_warm = run(inst, p5, p5["text"] + TAIL)
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


def test_prefix_v41(inst, p5, p4):
    """Returns {case name: (text, log-probabilities)} of the runs."""
    t5, lp5, n5, reused = run(inst, p5)
    if t5 is None:
        return {}
    check(reused == 0 and n5 == p5["n_prompt"], "p5_code cold: %d prompt "
          "tokens, no rows reused (%d)" % (n5, reused))
    t_long, lp_long, n_long, reused = run(inst, p5, p5["text"] + TAIL)
    check(reused % PAGE_ROWS == 0 and 9 * PAGE_ROWS <= reused < n5,
          "p5_code plus a tail after p5_code: %d of its %d prompt rows "
          "reused (whole pages of the shared prefix)" % (reused, n_long))
    t5w, lp5w, _, reused = run(inst, p5)
    want = (n5 - 1) // PAGE_ROWS * PAGE_ROWS
    check(reused == want, "p5_code again: %d rows reused, every full page "
          "before its last token (%d)" % (reused, want))
    check(t5w == t5 and lp5w == lp5, "p5_code with %d reused rows: greedy "
          "text and log-probabilities equal its cold run's exactly" % reused)
    t_lw, lp_lw, _, reused = run(inst, p5, p5["text"] + TAIL)
    want = (n_long - 1) // PAGE_ROWS * PAGE_ROWS
    check(reused == want, "the longer prompt again: %d rows reused (%d)"
          % (reused, want))
    check(t_lw == t_long and lp_lw == lp_long, "the longer prompt again: "
          "greedy text and log-probabilities equal its first run's exactly")
    t4, lp4, n4, _ = run(inst, p4)
    m = metrics(inst)
    toks = n5 * 2 + n_long * 2 + n4 + 5 * 32
    print("figures (kvd, V4.1 state, under load): %d pages of %d bytes at "
          "the peak for 5 requests (%d tokens, cached prefixes kept)"
          % (m['strata_kv_pages{tier="host",state="peak"}'],
             m["strata_kv_page_bytes"], toks))
    return {"p5_code": (t5, lp5), "p4_harbour": (t4, lp4)}


def test_kvd_restart(inst, p5, text5):
    """kvd kill -9 after the 4th streamed token of a long generation (V4:
    160 tokens, V4.1: 128; computed runs at most 64 events ahead of the
    reader), started again at once.  text5: V4's 32-token greedy text of
    p5_code (None for V4.1)."""
    n_gen = 160 if REV == "v4" else 128
    st, j = completion(inst, p5, max_tokens=n_gen)
    if not check(st == 200, "a %d-token %s generation: %s"
                 % (n_gen, NAME, st)):
        print(j)
        return
    want_text = j["choices"][0]["text"]
    want_lp = j["choices"][0]["logprobs"]["token_logprobs"]
    if text5 is not None:
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
    text, lps, n_chunks = stream_text(payloads)
    # computed talked to the new kvd before the generation ended: the
    # kill landed in it
    check(bool(killed) and "re-connected to a restarted kvd" in
          inst.log("computed"), "kvd killed (SIGKILL) during the %s "
          "generation and computed re-connected to the new one" % NAME)
    check(st == 200 and payloads and payloads[-1] == "[DONE]" and
          text == want_text and lps == want_lp, "after a kvd kill -9 + "
          "restart the %s generation completes with the undisturbed run's "
          "text and log-probabilities (%d chunks, %d tokens)"
          % (NAME, n_chunks, len(lps)))
    if REV != "v4":
        return
    check(close(lps[:32], ref_logprobs(p5)), "after the kvd restart: the "
          "first 32 tokens' log-probabilities equal the reference's")
    st, j = completion(inst, p5)
    check(st == 200 and j["choices"][0]["text"] == text5,
          "a request after the restart (pages adopted from the old kvd) "
          "gives the same text")


def stream_text(payloads):
    """A streamed completion's text, token log-probabilities and chunk
    count."""
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks
                   if "choices" in c)
    lps = [x for c in chunks if "choices" in c and c["choices"][0]["logprobs"]
           for x in c["choices"][0]["logprobs"]["token_logprobs"]]
    return text, lps, len(chunks)


def test_spill(store, want):
    """Two sequences at once in a pool smaller than both.  want: {case
    name: (text, log-probabilities)} each must give (V4: the reference's
    log-probabilities and, text not None, the cold text; V4.1: the text
    and log-probabilities of its run in the large pool, exactly)."""
    pool = "4MiB" if REV == "v4" else \
        os.environ.get("STRATA_TEST_V41_POOL", "2MiB")
    inst = Instance(store, tag=REV + "sp", computed_args=exact(),
                    kvd_args=["--budget", pool, "--spill-budget", "64MiB"])
    try:
        inst.start()
        res = {}

        def one(name):
            res[name] = completion(inst, CASES[name])

        th = [threading.Thread(target=one, args=(n,)) for n in want]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for name, (t, lp) in want.items():
            st, j = res[name]
            ok = st == 200
            if ok and REV == "v4":
                ch = j["choices"][0]
                ok = close(ch["logprobs"]["token_logprobs"],
                           ref_logprobs(CASES[name]))
                ok = ok and (t is None or ch["text"] == t)
            elif ok:
                ch = j["choices"][0]
                ok = ch["text"] == t and \
                    ch["logprobs"]["token_logprobs"] == lp
            else:
                print(j)
            check(ok, "spill: %s at once with the other gives %s" % (
                name, "the reference's log-probabilities and the cold text"
                if REV == "v4" else "the text and log-probabilities of its "
                "run in the large pool"))
        m = metrics(inst)
        check(m[SPILLED] > 0 and m[RESTORED] > 0,
              "kvd spilled %d and restored %d bytes of %s pages (pool of "
              "%d pages of %d bytes)"
              % (m[SPILLED], m[RESTORED], NAME,
                 m['strata_kv_pages{tier="host",state="total"}'],
                 m["strata_kv_page_bytes"]))
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "spill instance: %s\n%s" % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])


def test_step_failure(store):
    """A request that cannot fit the pool fails in a step it shares with a
    decoding one: the scheduler retries the step's requests one at a time,
    the decoding sequence's run is a replay (a state cannot evaluate a
    position twice) and its generation goes on unchanged."""
    p2, p5 = CASES["p2_sliding"], CASES["p5_code"]
    # V4: kvd counts ceil(rows / 16) pages in each of the 18 streams for a
    # reservation: 128 pages hold 112 rows (p2: 39 + 64; p5: 169 + 32)
    n_gen = 64
    pool = "2MiB" if REV == "v4" else \
        os.environ.get("STRATA_TEST_V41_SMALL_POOL", "1MiB")
    label = "a 2 MiB pool" if REV == "v4" else "the small pool"
    inst = Instance(store, tag=REV + "sf", computed_args=exact(),
                    kvd_args=["--budget", pool])
    try:
        inst.start()
        st, j = completion(inst, p2, max_tokens=n_gen)
        if not check(st == 200, "p2_sliding alone in %s: %s" % (label, st)):
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
        text, lps, _ = stream_text(payloads)
        bst, bj = big[0] if big else (0, {})
        msg = bj.get("error", {}).get("message", "") \
            if isinstance(bj, dict) else ""
        check(bst >= 400 and "KV budget too small for one sequence" in msg,
              "p5_code in %s fails with the pool's error (%s: %s)"
              % (label, bst, msg[:120]))
        check("retrying them one by one" in inst.log("computed"),
              "the shared step failed and was retried one request at a time")
        check(st == 200 and text == want_text and lps == want_lp and
              (REV != "v4" or close(lps[:32], ref_logprobs(p2))),
              "p2_sliding, whose step failed with p5_code's, completes with "
              "its undisturbed text and log-probabilities (%d tokens)"
              % len(lps))
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "step-failure instance: %s\n%s"
              % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])


CASES = {}
REV = "v4"


def exact():
    """computed's math: V4 compares with the strict reference (the exact
    math, --exact-math, issue 28); V4.1 with its own cold runs, in the
    default official math."""
    return ["--exact-math"] if REV == "v4" else []
NAME = "V4"


def main():
    global REV, NAME
    if len(sys.argv) != 2 or sys.argv[1] not in ("v4", "v41"):
        sys.exit("usage: test_dsv_kv_serve.py v4|v41")
    REV = sys.argv[1]
    NAME = "V4" if REV == "v4" else "V4.1"
    model = fixture("tiny-deepseek-" + REV)
    ref = json.load(open(os.path.join(model, "reference.json")))
    CASES.update({c["name"]: c for c in ref["cases"]})
    tmp = tempfile.mkdtemp(prefix="strata-%skv-" % REV)
    os.environ["STRATA_CACHE_DIR"] = os.path.join(tmp, "cache")
    store = convert(model, os.path.join(tmp, "store"), experts="mxfp4")
    p5, p4 = CASES["p5_code"], CASES["p4_harbour"]
    want = {}
    inst = Instance(store, tag=REV + "kv", computed_args=exact())
    try:
        inst.start()
        if REV == "v4":
            t5 = test_prefix_v4(inst, p5)
            if t5 is not None:
                test_kvd_restart(inst, p5, t5)
            # the reference's log-probabilities; p5_code's cold text
            want = {"p4_harbour": (None, None), "p5_code": (t5, None)}
        else:
            want = test_prefix_v41(inst, p5, p4)
            if want:
                test_kvd_restart(inst, p5, None)
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "%s on kvd: %s\n%s" % (NAME, e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", inst.tmp])
    if REV == "v4" or (want and all(t is not None
                                    for t, _ in want.values())):
        test_spill(store, want)
    test_step_failure(store)
    subprocess.run(["rm", "-rf", tmp])
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)


if __name__ == "__main__":
    main()
