"""The DeepSeek-V4 family served end to end, one test for both revisions
(argv[1]: v4 or v41), with real expertd, kvd and computed:

  v4   (issue 9) on ../shared tiny-deepseek-v4;
  v41  (issue 11) on ../shared tiny-deepseek-v41, expertd with an Engram
       cache of 500 rows (the tables have 1524).

Both revisions:
  - `strata run` (convert, start the three daemons, generate, summary) at
    host budgets 100 % and 25 %, prompt = BOS + the text (as the fixtures'
    READMEs say), in the exact math (--exact-math, issue 28: the strict
    references have no quantization round trip; the summary says which math
    ran): greedy ids equal the strict reference's greedy continuation (V4:
    reference.json; V4.1: reference_noqat.json, cases p1_window16 and
    p2_sliding, up to the first step whose top1_minus_top2 < 1e-3: its
    logits match within 3e-4); the state's
    bytes per token in kvd pages and in rows; the summary reports the
    expert pool (V4.1: and the Engram rows: lookups, hits, misses, bytes
    read, read latency, every position looking up its rows in each of the
    2 Engram layers, 6 rows each, once prefetched and once fetched);
  - `strata run --compute fast` (FP8 codes and the experts' slot bytes on
    the fast kernels, int8 expert activations) loads fast mode (computed's
    log says compute fast); it is not exact (dsv4-fast-tiny and
    dsv41-fast-tiny state its tolerance).  V4 at 50 %, exact math: the
    first greedy
    token and most of the continuation until the first divergence agree
    with the reference; V4.1 at 25 %, in the default official math (the
    summary and computed's log say so): every generated id equals fast mode's
    direct evaluation of the same store (test_dsv_fast v41 greedy:
    cw_dsv_load_store fast, process-local state, the prompt in one eval):
    the served path (kvd state in the V4.1 formats, the scheduler's
    chunking) changes nothing;
  - the HTTP API with expertd at 25 %, computed --exact-math:
    /v1/completions greedy text equals
    strata run's, every (V4.1: every decided) token's log-probability
    equals the reference's (top-1 logit minus log-sum-exp; V4 within the
    fixture's suggested tolerance, V4.1 within 1e-3, the fixture's median
    bound), and /metrics counts it.
V4 only, over HTTP: streaming gives the same text, a stop string cuts it,
chat with the DeepSeek-V3 template (detected from tokenizer_config.json)
reproduces the p3_chat case, two requests at once (one scheduler step for
both) give what each gives alone, every request asked kvd's prefix cache.
V4.1 only, over HTTP: /metrics has the Engram figures.

Figures (TTFT, decode tokens/s, expert and Engram hits/misses) are
printed.  test_dsv_kv_serve.py imports check, close, completion and
ref_logprobs from here.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (BUILD, FAILS, Instance, check, convert,  # noqa
                           fixture, metrics, request, stream)

# V4: the fixture's tolerance_suggested: logits 3e-4, log-sum-exp 2e-5
TOL = 3e-4 + 2e-5
ENGRAM_CACHE = "49000"  # 500 rows of 66 + 32 bytes: < 1524 rows
# what differs between the revisions' runs
REVS = {
    "v4": dict(fixture="tiny-deepseek-v4", tol=TOL, engram=[]),
    "v41": dict(fixture="tiny-deepseek-v41", tol=1e-3,
                engram=["--engram-cache", ENGRAM_CACHE]),
}


def ref_logprobs(case):
    return [s["top10"][0][1] - s["lse"] for s in case["continuation_steps"]]


def close(got, want, tol=TOL):
    return len(got) == len(want) and all(abs(a - b) <= tol
                                         for a, b in zip(got, want))


def decided(rev, case):
    """Steps of the greedy continuation compared: V4 all of them; V4.1
    those before the first close call of the strict reference (closer than
    1e-3: its logits match within 3e-4; the 0.1 rule is reference.json's,
    for QAT rounding flips)."""
    st = case["continuation_steps"]
    if rev == "v4":
        return len(case["greedy_continuation"])
    return next((i for i, s in enumerate(st) if s["top1_minus_top2"] < 1e-3),
                len(st))


def exact_math(rev, compute):
    """Whether a strata run uses --exact-math: every reference-mode run (the
    strict references), and V4's fast run (its tolerance is stated in the
    exact math); V4.1's fast run keeps the default official math, checked
    against fast mode's direct evaluation in the same math."""
    return compute == "reference" or rev == "v4"


def run_cli(rev, model, store, case, budget, n, compute, run_dir, tag):
    """strata run greedy for n tokens: (the process, its JSON summary or
    None after a failure)."""
    r = subprocess.run(
        [os.path.join(BUILD, "cli", "strata"), "run", "--model", model,
         "--store", store, "--prompt", case["text"], "--max-tokens", str(n),
         "--ignore-eos", "--host-budget", budget] + REVS[rev]["engram"] +
        ["--compute", compute, "--json"] +
        (["--exact-math"] if exact_math(rev, compute) else []) +
        ["--instance",
         "%s%d" % (tag, os.getpid()), "--run-dir", run_dir],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, STRATA_LOG="info"))
    if not check(r.returncode == 0, "strata run --host-budget %s%s exits 0"
                 % (budget, " --compute fast" if compute == "fast" else "")):
        print(r.stderr[-3000:])
        return r, None
    j = json.loads(r.stdout.strip().splitlines()[-1])
    math = "exact" if exact_math(rev, compute) else "official"
    check(j.get("math") == math and
          ("math               %s" % math) in r.stderr,
          "strata run%s: the summary says math %s (JSON %s)"
          % (" --exact-math" if math == "exact" else "", math, j.get("math")))
    return r, j


def fast_run(rev, model, store, tmp, case, budget):
    """strata run --compute fast (the header says what it must give)."""
    n = len(case["greedy_continuation"])
    run_dir = os.path.join(tmp, "run-fast-%s" % case["name"])
    r, j = run_cli(rev, model, store, case, budget, n, "fast", run_dir,
                   rev + "fast")
    if j is None:
        return
    log = open(os.path.join(run_dir, "computed.log")).read()
    says = "says" if "compute fast" in log else "does not say"
    if rev == "v41":
        check("official math" in log, "strata run without --exact-math: "
              "computed's log says official math")
    ref = case["greedy_continuation"]
    if rev == "v4":
        same = next((i for i, (a, b) in enumerate(zip(j["ids"], ref))
                     if a != b), len(ref))
        check(len(j["ids"]) == len(ref) and same >= 1 and
              "compute fast" in log,
              "strata run --compute fast: %d ids, %d of %d greedy ids equal "
              "the reference's before the first divergence; computed's log "
              "%s compute fast" % (len(j["ids"]), same, len(ref), says))
    else:
        d = subprocess.run(
            [os.path.join(BUILD, "tests", "computed", "test_dsv_fast"),
             "v41", "greedy", store, str(n)] + [str(i) for i in case["ids"]],
            capture_output=True, text=True, timeout=300)
        if not check(d.returncode == 0, "fast mode's direct evaluation runs"):
            print(d.stderr[-3000:])
            return
        want = json.loads(d.stdout.strip().splitlines()[-1])
        same = sum(a == b for a, b in zip(j["ids"], ref))
        check(j["prompt_tokens"] == case["n_prompt"] and len(want) == n and
              j["ids"] == want and "compute fast" in log,
              "strata run --compute fast --host-budget %s: the %d ids equal "
              "fast mode's direct evaluation (%s...; %d of them equal the "
              "reference's); computed's log %s compute fast"
              % (budget, n, j["ids"][:6], same, says))
    print("figures (strata run --compute fast, %s, %s, under load): TTFT "
          "%.1f ms, decode %.1f tokens/s" % (case["name"], budget,
                                              j["ttft_ms"],
                                              j["decode_tokens_per_s"]))


def strata_run(rev, model, store, tmp, case, budget):
    """strata run in reference mode (the header says what it must give);
    its JSON summary or None."""
    k = decided(rev, case)
    r, j = run_cli(rev, model, store, case, budget, k, "reference",
                   os.path.join(tmp, "run-%s-%s" % (case["name"],
                                                    budget[:-1])),
                   rev + "run")
    if j is None:
        return None
    check(j["prompt_tokens"] == case["n_prompt"],
          "strata run: prompt of %d tokens (BOS + text), reference %d"
          % (j["prompt_tokens"], case["n_prompt"]))
    check(k > 0 and j["ids"] == case["greedy_continuation"][:k],
          "strata run --host-budget %s: the %d decided greedy ids equal the "
          "reference's (%s: %s...)" % (budget, k, case["name"], j["ids"][:6]))
    kvb = j["kv_bytes_per_token"]
    check(0 < kvb["rows"] < kvb["pages"] and j["kv"]["pages_peak"] > 0 and
          "in kvd pages at the peak" in r.stderr,
          "strata run: %s KV bytes per token in kvd pages %d, in rows %d (%d "
          "pages at the peak)" % (rev, kvb["pages"], kvb["rows"],
                                  j["kv"]["pages_peak"]))
    pool, en = j["expert_pool"], j.get("engram", {})
    check(pool["hits"] + pool["misses"] > 0 and "expert pool" in r.stderr
          and "TTFT" in r.stderr and
          (rev == "v4" or "Engram rows" in r.stderr),
          "strata run: summary with the expert pool%s"
          % ("" if rev == "v4" else " and the Engram rows"))
    figs = ("figures (strata run, %s, %s, under load): TTFT %.1f ms, decode "
            "%.1f tokens/s, expert hits %d, misses %d, evictions %d, slots "
            "%d" % (case["name"], budget, j["ttft_ms"],
                    j["decode_tokens_per_s"], pool["hits"], pool["misses"],
                    pool["evictions"], pool["slots"]))
    if rev == "v41":
        n_pos = case["n_prompt"] + k - 1
        check(en.get("lookups") == 2 * n_pos * 2 * 6 and
              en.get("misses", 0) > 0 and en.get("read_bytes", 0) > 0 and
              0 <= en.get("hit_rate", -1) <= 1,
              "strata run: Engram lookups %s for %d positions x 2 layers x 6 "
              "rows x 2, misses and bytes read" % (en.get("lookups"), n_pos))
        figs += ("; Engram lookups %s, hit rate %s, %s bytes read, read p50 "
                 "%s us p99 %s us" % (en.get("lookups"), en.get("hit_rate"),
                                      en.get("read_bytes"),
                                      en.get("read_p50_us"),
                                      en.get("read_p99_us")))
    print(figs)
    return j


def completion(inst, case, **extra):
    body = dict({"prompt": case["text"], "temperature": 0, "logprobs": 1,
                 "max_tokens": len(case["greedy_continuation"])}, **extra)
    return request(inst, "POST", "/v1/completions", body)


def test_http(rev, inst, cases, run_text):
    p1 = cases["p1_window16"]
    k = decided(rev, p1)
    st, j = completion(inst, p1, max_tokens=k)
    if not check(st == 200, "POST /v1/completions: %s" % st):
        print(j)
        return
    ch = j["choices"][0]
    check(j["usage"]["prompt_tokens"] == p1["n_prompt"] and
          j["usage"]["completion_tokens"] == k,
          "completions usage %s" % j["usage"])
    check(run_text is not None and ch["text"] == run_text,
          "completions greedy text equals strata run's (whose ids are the "
          "reference's)")
    lp = ch["logprobs"]["token_logprobs"]
    want = ref_logprobs(p1)[:k]
    check(close(lp, want, REVS[rev]["tol"]),
          "completions: each decided token's log-probability equals the "
          "reference's within %.0e (max diff %.2e)"
          % (REVS[rev]["tol"], max(abs(a - b) for a, b in zip(lp, want))))
    if rev == "v4":
        http_v4(inst, cases, ch)
    else:
        http_v41(inst)


def http_v4(inst, cases, ch):
    """V4's further HTTP checks (the header)."""
    p1, p2, p3 = cases["p1_window16"], cases["p2_sliding"], cases["p3_chat"]
    whole = ch["text"]
    # streaming
    st, payloads = stream(inst, "/v1/completions",
                          {"prompt": p1["text"], "temperature": 0,
                           "max_tokens": 32, "stream": True})
    chunks = [json.loads(p) for p in payloads if p != "[DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    check(st == 200 and payloads[-1] == "[DONE]" and text == ch["text"],
          "streamed text equals the whole response (%d chunks)" % len(chunks))
    # a stop string: the text up to its first occurrence
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


def http_v41(inst):
    """V4.1's /metrics: the Engram figures, expert hits/misses and
    evictions at 25 %."""
    m = metrics(inst)
    lookups = m.get("strata_engram_lookups_total", 0)
    hit = m.get('strata_engram_rows_total{result="hit"}', -1)
    miss = m.get('strata_engram_rows_total{result="miss"}', -1)
    check(lookups > 0 and hit >= 0 and miss > 0 and
          m.get("strata_engram_read_bytes_total", 0) > 0 and
          0 <= m.get("strata_engram_hit_rate", -1) <= 1 and
          m.get('strata_engram_read_latency_seconds{quantile="0.99"}', 0) > 0,
          "/metrics: Engram lookups %d, hits %d, misses %d, hit rate %.3f, "
          "p99 %.6f s" % (lookups, hit, miss,
                          m.get("strata_engram_hit_rate", -1),
                          m.get('strata_engram_read_latency_seconds'
                                '{quantile="0.99"}', 0)))
    check(m['strata_expert_hits_total{tier="host"}'] +
          m['strata_expert_misses_total{tier="host"}'] > 0 and
          m["strata_expert_evictions_total"] > 0,
          "/metrics: expert hits/misses and evictions at 25 %")


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else ""
    if rev not in REVS:
        print("usage: test_dsv_serve.py v4|v41")
        sys.exit(2)
    model = fixture(REVS[rev]["fixture"])
    ref = json.load(open(os.path.join(model, "reference.json")))
    # the exact math's strict reference for the reference-mode and HTTP
    # runs (V4's reference.json is strict; V4.1's is QAT on, its strict one
    # reference_noqat.json); V4.1's fast run uses reference.json's
    # p4_harbour against fast mode's direct evaluation
    strict = ref if rev == "v4" else json.load(
        open(os.path.join(model, "reference_noqat.json")))
    cases = {c["name"]: c for c in strict["cases"]}
    tmp = tempfile.mkdtemp(prefix="strata-%sserve-" % rev)
    os.environ["STRATA_CACHE_DIR"] = os.path.join(tmp, "cache")
    store = convert(model, os.path.join(tmp, "store"), experts="mxfp4")
    p1 = cases["p1_window16"]
    strata_run(rev, model, store, tmp, p1, "100%")
    j = strata_run(rev, model, store, tmp, p1, "25%")
    if rev == "v4":
        fast_run(rev, model, store, tmp, p1, "50%")
    else:
        p4 = next(c for c in ref["cases"] if c["name"] == "p4_harbour")
        strata_run(rev, model, store, tmp, cases["p2_sliding"], "25%")
        fast_run(rev, model, store, tmp, p4, "25%")
    inst = Instance(store, tag=rev + "h",
                    expertd_args=["--host-budget", "25%"] +
                    REVS[rev]["engram"],
                    computed_args=["--exact-math"])
    try:
        inst.start()
        test_http(rev, inst, cases, j["text"] if j else None)
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
