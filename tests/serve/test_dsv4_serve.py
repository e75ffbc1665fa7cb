"""DeepSeek-V4 served end to end (issue 9) on ../shared tiny-deepseek-v4,
with real expertd, kvd and computed:

  - `strata run` (convert, start the three daemons, generate, summary) at
    host budgets 100 % and 25 %: greedy ids equal reference.json's greedy
    continuation (prompt = BOS + the text, as the fixture's README says),
    and the summary reports expert pool hits/misses;
  - the HTTP API with expertd at 25 %: /v1/completions greedy text equals
    strata run's, every token's log-probability equals the reference's
    (top-1 logit minus log-sum-exp, within the fixture's suggested
    tolerance), streaming gives the same text, a stop string cuts it,
    chat with the DeepSeek-V3 template (detected from tokenizer_config.json)
    reproduces the p3_chat case, two requests at once (one scheduler step
    for both) give what each gives alone, and /metrics counts it all.

Figures (TTFT, decode tokens/s, expert hits/misses) are printed.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (BUILD, Instance, convert, fixture, metrics,  # noqa
                           request, stream)

FAILS = []
# the fixture's tolerance_suggested: logits 3e-4, log-sum-exp 2e-5
TOL = 3e-4 + 2e-5


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS.append(what)
    return cond


def ref_logprobs(case):
    return [s["top10"][0][1] - s["lse"] for s in case["continuation_steps"]]


def close(got, want):
    return len(got) == len(want) and all(abs(a - b) <= TOL
                                         for a, b in zip(got, want))


def strata_run(model, store, tmp, case, budget, compute="reference"):
    r = subprocess.run(
        [os.path.join(BUILD, "cli", "strata"), "run", "--model", model,
         "--store", store, "--prompt", case["text"], "--max-tokens",
         str(len(case["greedy_continuation"])), "--ignore-eos",
         "--host-budget", budget, "--compute", compute, "--json",
         "--exact-math", "--instance",
         "v4run%d" % os.getpid(), "--run-dir", os.path.join(tmp, "run-" +
                                                            budget[:-1])],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, STRATA_LOG="info"))
    if not check(r.returncode == 0, "strata run --host-budget %s exits 0"
                 % budget):
        print(r.stderr[-3000:])
        return None
    j = json.loads(r.stdout.strip().splitlines()[-1])
    # the strict reference is the exact math (issue 28: --exact-math;
    # the default is the official code's round trips)
    check(j.get("math") == "exact" and
          "math               exact" in r.stderr,
          "strata run --exact-math: the summary says math exact (JSON %s)"
          % j.get("math"))
    if compute == "fast":
        # fast mode (int8 activations on the FP8/MXFP4 kernels) is not
        # exact: dsv4-fast-tiny states its tolerance per position; here the
        # served path must load it and agree on the first greedy token
        # and most of the continuation until the first divergence
        ref = case["greedy_continuation"]
        same = next((i for i, (a, b) in enumerate(zip(j["ids"], ref))
                     if a != b), len(ref))
        log = open(os.path.join(tmp, "run-" + budget[:-1],
                                "computed.log")).read()
        check(len(j["ids"]) == len(ref) and same >= 1 and
              "compute fast" in log,
              "strata run --compute fast: %d ids, %d of %d greedy ids equal "
              "the reference's before the first divergence; computed's log "
              "%s compute fast" % (len(j["ids"]), same, len(ref),
                                   "says" if "compute fast" in log
                                   else "does not say"))
        return j
    check(j["prompt_tokens"] == case["n_prompt"],
          "strata run: prompt of %d tokens (BOS + text), reference %d"
          % (j["prompt_tokens"], case["n_prompt"]))
    check(j["ids"] == case["greedy_continuation"],
          "strata run --host-budget %s: greedy ids equal the reference's "
          "(%s: %s...)" % (budget, case["name"], j["ids"][:6]))
    kvb = j["kv_bytes_per_token"]
    check(0 < kvb["rows"] < kvb["pages"] and j["kv"]["pages_peak"] > 0,
          "strata run: V4 KV bytes per token in kvd pages %d, in rows %d "
          "(%d pages at the peak)" % (kvb["pages"], kvb["rows"],
                                      j["kv"]["pages_peak"]))
    pool = j["expert_pool"]
    check(pool["hits"] + pool["misses"] > 0 and "expert pool" in r.stderr
          and "TTFT" in r.stderr, "strata run: summary with the expert pool")
    print("figures (strata run, %s, %s, under load): TTFT %.1f ms, decode "
          "%.1f tokens/s, expert hits %d, misses %d, evictions %d, slots %d"
          % (case["name"], budget, j["ttft_ms"], j["decode_tokens_per_s"],
             pool["hits"], pool["misses"], pool["evictions"], pool["slots"]))
    return j


def completion(inst, case, **extra):
    body = dict({"prompt": case["text"], "temperature": 0, "logprobs": 1,
                 "max_tokens": len(case["greedy_continuation"])}, **extra)
    return request(inst, "POST", "/v1/completions", body)


def test_http(inst, cases, run_text):
    p1, p2, p3 = cases["p1_window16"], cases["p2_sliding"], cases["p3_chat"]
    st, j = completion(inst, p1)
    if not check(st == 200, "POST /v1/completions: %s" % st):
        print(j)
        return
    ch = j["choices"][0]
    check(j["usage"]["prompt_tokens"] == p1["n_prompt"] and
          j["usage"]["completion_tokens"] == 32,
          "completions usage %s" % j["usage"])
    check(ch["text"] == run_text, "completions greedy text equals strata "
          "run's (whose ids are the reference's)")
    lp = ch["logprobs"]["token_logprobs"]
    check(close(lp, ref_logprobs(p1)), "completions: each token's "
          "log-probability equals the reference's within %.0e (max diff "
          "%.2e)" % (TOL, max(abs(a - b) for a, b in
                              zip(lp, ref_logprobs(p1)))))
    # streaming
    st, payloads = stream(inst, "/v1/completions",
                          {"prompt": p1["text"], "temperature": 0,
                           "max_tokens": 32, "stream": True})
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    check(st == 200 and payloads[-1] == "[DONE]" and text == ch["text"],
          "streamed text equals the whole response (%d chunks)" % len(chunks))
    # a stop string: the text up to its first occurrence
    whole = ch["text"]
    cut = next((i for i in range(4, len(whole) - 4)
                if whole.find(whole[i:i + 3]) == i and
                whole[i:i + 3].strip()), None)
    if check(cut is not None, "a stop string in the greedy text"):
        stop = whole[cut:cut + 3]
        st, j = completion(inst, p1, stop=[stop])
        c = j["choices"][0] if st == 200 else {}
        check(st == 200 and c.get("text") == whole[:cut] and
              c.get("finish_reason") == "stop",
              "stop %r: text cut before it, finish_reason stop (%r)"
              % (stop, c.get("finish_reason")))
    # chat with the DeepSeek-V3 template: BOS <User>content<Assistant>
    content = p3["text"].split("\uff5cUser\uff5c>", 1)[1].rsplit(
        "<\uff5cAssistant\uff5c>", 1)[0]
    st, j = request(inst, "POST", "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": content}],
                     "temperature": 0, "max_tokens": 32, "logprobs": True})
    if check(st == 200, "POST /v1/chat/completions: %s" % st):
        got = [t["logprob"] for t in j["choices"][0]["logprobs"]["content"]]
        check(j["usage"]["prompt_tokens"] == p3["n_prompt"] and
              close(got, ref_logprobs(p3)),
              "chat (DeepSeek-V3 template) reproduces %s: prompt %d tokens, "
              "log-probabilities within %.0e" % (p3["name"],
                                                 j["usage"]["prompt_tokens"],
                                                 TOL))
    # two at once: one scheduler step holds both sequences
    res = {}

    def one(case):
        res[case["name"]] = completion(inst, case)

    th = [threading.Thread(target=one, args=(c,)) for c in (p1, p2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ok = all(res[c["name"]][0] == 200 for c in (p1, p2))
    ok = ok and res[p1["name"]][1]["choices"][0]["text"] == whole
    ok = ok and close(res[p2["name"]][1]["choices"][0]["logprobs"]
                      ["token_logprobs"], ref_logprobs(p2))
    check(ok, "two concurrent requests give what each gives alone / the "
          "reference")
    m = metrics(inst)
    hits = m['strata_expert_hits_total{tier="host"}']
    misses = m['strata_expert_misses_total{tier="host"}']
    hints = m['strata_expert_hints_total{state="all"}']
    check(m["strata_requests_started_total"] >= 6 and
          m["strata_generation_tokens_total"] >= 5 * 32 and
          hits + misses > 0 and m["strata_expert_evictions_total"] > 0 and
          hints > 0,
          "/metrics: requests %d, tokens %d, expert hits %d misses %d "
          "evictions %d, hints %d" % (m["strata_requests_started_total"],
                                      m["strata_generation_tokens_total"],
                                      hits, misses,
                                      m["strata_expert_evictions_total"],
                                      hints))
    # every V4 request asked kvd's prefix cache (its state is in kvd
    # pages); prompts of at most one full page (p1: 16 tokens, pages of
    # 16) leave nothing to reuse: the last prompt token is always computed
    # (reuse itself: test_dsv_kv_serve.py)
    check(m["strata_prefix_cache_lookups_total"] >= 6 and
          m["strata_prefix_cache_rows_reused_total"] <= 16,
          "/metrics: %d prefix-cache lookups for V4, %d rows reused"
          % (m["strata_prefix_cache_lookups_total"],
             m["strata_prefix_cache_rows_reused_total"]))


def main():
    model = fixture("tiny-deepseek-v4")
    ref = json.load(open(os.path.join(model, "reference.json")))
    cases = {c["name"]: c for c in ref["cases"]}
    tmp = tempfile.mkdtemp(prefix="strata-v4serve-")
    os.environ["STRATA_CACHE_DIR"] = os.path.join(tmp, "cache")
    store = convert(model, os.path.join(tmp, "store"), experts="mxfp4")
    p1 = cases["p1_window16"]
    strata_run(model, store, tmp, p1, "100%")
    j = strata_run(model, store, tmp, p1, "25%")
    strata_run(model, store, tmp, p1, "50%", compute="fast")
    inst = Instance(store, tag="v4h", expertd_args=["--host-budget", "25%"],
                    computed_args=["--exact-math"])
    try:
        inst.start()
        test_http(inst, cases, j["text"] if j else None)
    except Exception as e:  # noqa: a daemon that did not come up
        check(False, "HTTP serving: %s\n%s" % (e, inst.log("computed")))
    finally:
        inst.stop()
        subprocess.run(["rm", "-rf", tmp, inst.tmp])
    if FAILS:
        print("%d failure(s)" % len(FAILS))
        sys.exit(1)


if __name__ == "__main__":
    main()
