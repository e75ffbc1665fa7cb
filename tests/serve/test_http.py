#!/usr/bin/python3
"""computed's HTTP API against real daemons on tiny-qwen3moe (reference
mode: experts BF16, KV F32), with real HTTP clients (curl and Python's
http.client).  Checks, each on values that could be wrong:
  - every endpoint: /health, /v1/models, /metrics, /v1/completions,
    /v1/chat/completions (whole and streamed);
  - the SSE chunk format (data: lines of OpenAI chunks, one id, role first
    in chat, finish_reason and usage in the last chunk, then [DONE]);
  - usage counts (PITFALLS P14): streamed and whole runs of the same greedy
    and of the same seeded request report the same counts, equal to the
    tokens returned (logprobs entries);
  - stop sequences across tokens (P13): spanning 2-3 tokens, at the very
    start (nothing streamed), several stops (earliest wins), inside one
    token, never matched; streamed text never contains a stop's start;
  - batched == alone: a greedy request's tokens and logprobs are
    bit-identical alone and with 15 other requests running (printed with 17
    digits, so equal floats);
  - cancellation (P15): a stream closed after its first chunk, a whole
    request abandoned, a queued request abandoned: the scheduler drops
    them, KV pages used return to the baseline, aborted counts them; a
    request that finished is never counted as aborted;
  - completion ids: "cmpl-"/"chatcmpl-" and hex, unique within a run and
    across a computed restart (kill -9 and start again);
  - errors: 400 for each malformed or invalid body (never 500), 401 without
    or with a wrong API key (no generation started), 404, 405, 413 (by
    Content-Length and chunked), 429 when the queue is full, 503 /health
    when kvd is down.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import (BUILD, FAILS, Instance, check, convert,  # noqa
                           fixture, metrics, request, stream, usage_counts)

KEY = "test-key-123"


def curl(inst, *args):
    r = subprocess.run(["curl", "-s", "-o", "-", "-w", "\n%{http_code}",
                        "http://" + inst.url + args[0]] + list(args[1:]),
                       capture_output=True, text=True, timeout=120)
    body, code = r.stdout.rsplit("\n", 1)
    return int(code), body


def parse_stream(payloads):
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]


def test_endpoints(inst, cfg):
    code, body = curl(inst, "/health")
    check(code == 200 and json.loads(body)["status"] == "ok",
          "GET /health 200 ok without a key (curl)")
    code, body = curl(inst, "/v1/models", "-H", "Authorization: Bearer " + KEY)
    j = json.loads(body)
    check(code == 200 and j["object"] == "list" and len(j["data"]) == 1 and
          j["data"][0]["max_model_len"] == cfg["max_position_embeddings"],
          "GET /v1/models lists the model with its context (curl)")
    code, body = curl(inst, "/metrics", "-H", "Authorization: Bearer " + KEY)
    check(code == 200 and 'strata_kv_pages{tier="host",state="total"}' in body
          and "strata_time_to_first_token_seconds_bucket" in body,
          "GET /metrics: Prometheus text with KV pages and TTFT histogram")
    code, body = curl(inst, "/v1/completions", "-H", "Authorization: Bearer " + KEY,
                      "-H", "Content-Type: application/json", "-d",
                      json.dumps({"prompt": "Hello", "max_tokens": 5,
                                  "temperature": 0}))
    j = json.loads(body)
    check(code == 200 and j["object"] == "text_completion" and
          j["usage"]["completion_tokens"] == 5 and
          j["choices"][0]["finish_reason"] == "length",
          "POST /v1/completions (curl): 5 tokens, finish length")
    # strata status counts HTTP generations too (it once counted only
    # those of strata run / the REQ/REP API)
    st = subprocess.run([os.path.join(BUILD, "cli", "strata"), "status",
                         "--instance", inst.name, "--run-dir", inst.run_dir],
                        capture_output=True, text=True)
    m = re.search(r"generations (\d+), prompt tokens (\d+), generated (\d+)",
                  st.stdout)
    started = metrics(inst)["strata_requests_started_total"]
    check(m is not None and int(m.group(1)) == started >= 1 and
          int(m.group(3)) >= 5,
          "strata status counts the HTTP generations (%s; %d started)" %
          (m.group(0) if m else st.stdout + st.stderr, started))
    code, body = curl(inst, "/v1/chat/completions", "-H",
                      "Authorization: Bearer " + KEY, "-d",
                      json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                  "max_tokens": 3, "temperature": 0}))
    j = json.loads(body)
    check(code == 200 and j["object"] == "chat.completion" and
          j["choices"][0]["message"]["role"] == "assistant" and
          j["usage"]["completion_tokens"] == 3,
          "POST /v1/chat/completions (curl)")


def test_stream_format_and_usage(inst):
    for chat in (0, 1):
        path = "/v1/chat/completions" if chat else "/v1/completions"
        for req in ({"temperature": 0}, {"temperature": 0.9, "seed": 1234,
                                         "top_p": 0.95, "top_k": 40}):
            body = dict(req, max_tokens=12, logprobs=True if chat else 2)
            if chat:
                body["messages"] = [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Tell me"}]
                body["top_logprobs"] = 2
            else:
                body["prompt"] = "The quick brown fox"
            st, whole = request(inst, "POST", path, body)
            st2, payloads = stream(inst, path, dict(
                body, stream=True, stream_options={"include_usage": True}))
            chunks = parse_stream(payloads)
            usage = chunks.pop()  # include_usage: the extra last chunk
            what = "%s %s" % (path, "greedy" if req["temperature"] == 0 else "seeded")
            ok = st == 200 and st2 == 200
            ok = ok and len({c["id"] for c in chunks}) == 1
            ok = ok and all(c["object"] == ("chat.completion.chunk" if chat else
                                            "text_completion") for c in chunks)
            ok = ok and all(c["choices"][0]["finish_reason"] is None
                            for c in chunks[:-1])
            ok = ok and all(c["usage"] is None for c in chunks)
            ok = ok and usage["choices"] == [] and usage["id"] == chunks[0]["id"]
            last = chunks[-1]
            ok = ok and last["choices"][0]["finish_reason"] == "length"
            if chat:
                ok = ok and chunks[0]["choices"][0]["delta"].get("role") == "assistant"
                ok = ok and all("role" not in c["choices"][0]["delta"]
                                for c in chunks[1:])
                text = "".join(c["choices"][0]["delta"].get("content", "")
                               for c in chunks)
                wtext = whole["choices"][0]["message"]["content"]
                n_lp = sum(len(c["choices"][0]["logprobs"]["content"])
                           for c in chunks if c["choices"][0]["logprobs"])
                wn_lp = len(whole["choices"][0]["logprobs"]["content"])
            else:
                text = "".join(c["choices"][0]["text"] for c in chunks)
                wtext = whole["choices"][0]["text"]
                n_lp = sum(len(c["choices"][0]["logprobs"]["tokens"])
                           for c in chunks if c["choices"][0]["logprobs"])
                wn_lp = len(whole["choices"][0]["logprobs"]["tokens"])
            check(ok, "stream chunk format: " + what)
            check(text == wtext, "streamed text equals the whole response: " + what)
            u, wu = usage["usage"], whole["usage"]
            check(usage_counts(u) == usage_counts(wu) and usage_counts(u)["cached_ok"] and
                  u["completion_tokens"] == 12 == n_lp == wn_lp and
                  u["total_tokens"] == u["prompt_tokens"] + 12,
                  "P14 usage equal streamed/whole and equal to tokens "
                  "returned: %s (%s vs %s)" % (what, u, wu))


def test_stop(inst):
    base = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
            "logprobs": 0}
    st, j = request(inst, "POST", "/v1/completions", base)
    text = j["choices"][0]["text"]
    toks = j["choices"][0]["logprobs"]["tokens"]
    check(st == 200 and "".join(toks) == text and len(toks) == 24,
          "greedy base text for the stop tests (%d tokens)" % len(toks))
    # stops by construction from the token pieces
    k = next(i for i in range(2, 20) if toks[i] and toks[i + 1] and toks[i + 2])
    cases = [
        ("spanning 3 tokens", [toks[k][-1:] + toks[k + 1] + toks[k + 2][:1]]),
        ("spanning 2 tokens", [toks[k + 1][-1:] + toks[k + 2]]),
        ("at the very start", ["".join(toks[:3])]),
        ("several, earliest wins", [toks[k + 2], toks[k + 1]]),
        ("inside one token", [toks[k + 1][:max(1, len(toks[k + 1]) // 2)]]),
        ("never matched", ["\u2603never\u2603"]),
    ]
    for what, stops in cases:
        idx = [text.find(s) for s in stops if text.find(s) >= 0]
        want = text[:min(idx)] if idx else text
        want_fin = "stop" if idx else "length"
        body = dict(base, stop=stops if len(stops) > 1 else stops[0])
        del body["logprobs"]
        st, j = request(inst, "POST", "/v1/completions", body)
        st2, payloads = stream(inst, "/v1/completions", dict(
            body, stream=True, stream_options={"include_usage": True}))
        chunks = parse_stream(payloads)
        usage = chunks.pop()["usage"]
        stext = "".join(c["choices"][0]["text"] for c in chunks)
        check(st == 200 and j["choices"][0]["text"] == want and
              j["choices"][0]["finish_reason"] == want_fin,
              "P13 stop %s: whole text %r (want %r)" % (
                  what, j["choices"][0]["text"][-20:], want[-20:]))
        check(stext == want and chunks[-1]["choices"][0]["finish_reason"] == want_fin
              and usage_counts(usage) == usage_counts(j["usage"]),
              "P13 stop %s: streamed text and usage equal" % what)
        if what == "at the very start":
            check(all(c["choices"][0]["text"] == "" for c in chunks),
                  "P13 stop at the start: nothing streamed")


def test_batched_equals_alone(inst):
    ref = {"prompt": "In the beginning was", "max_tokens": 16,
           "temperature": 0, "logprobs": 5}
    st, alone = request(inst, "POST", "/v1/completions", ref)
    before = metrics(inst)
    results = [None] * 16
    prompts = ["Number %d of many prompts " % i * (1 + i % 5) for i in range(15)]

    def other(i):
        body = {"prompt": prompts[i], "max_tokens": 20 + i,
                "temperature": 0 if i % 2 else 0.8, "seed": i}
        if i % 3 == 0:
            results[i] = stream(inst, "/v1/completions", dict(body, stream=True))
        else:
            results[i] = request(inst, "POST", "/v1/completions", body)

    def target():
        time.sleep(0.05)  # lands while the others run
        results[15] = request(inst, "POST", "/v1/completions", ref)

    ts = [threading.Thread(target=other, args=(i,)) for i in range(15)]
    ts.append(threading.Thread(target=target))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    after = metrics(inst)
    st2, batched = results[15]
    check(st == 200 and st2 == 200 and all(r[0] == 200 for r in results),
          "16 concurrent requests all 200")
    check(alone["choices"][0] == batched["choices"][0],
          "batched == alone: greedy text and top-5 logprobs (17 digits) "
          "bit-identical with 15 others running")
    b = lambda m, le: m['strata_step_batch_tokens_bucket{le="%s"}' % le]
    small = b(after, "4") - b(before, "4")
    steps = after["strata_step_batch_tokens_count"] - before["strata_step_batch_tokens_count"]
    check(steps > small, "steps batched more than 4 tokens at once "
          "(%d of %d steps)" % (steps - small, steps))
    hints = lambda m: m['strata_expert_hints_total{state="all"}']
    pf = lambda m, o: m['strata_expert_prefetch_total{outcome="%s"}' % o]
    prec = after["strata_expert_prefetch_precision"]
    check(hints(after) > hints(before) and
          pf(after, "used") <= pf(after, "loaded") and 0 <= prec <= 1 and
          (pf(after, "loaded") == 0 or
           abs(prec - pf(after, "used") / pf(after, "loaded")) < 1e-9),
          "/metrics: look-ahead hints counted (%d new), prefetch used <= "
          "loaded, precision = used / loaded" % (hints(after) - hints(before)))


def kv_used(inst):
    return metrics(inst)['strata_kv_pages{tier="host",state="used"}']


def wait_for(fn, timeout_s=5.0):
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if fn():
            return time.time() - t0
        time.sleep(0.02)
    return None


def test_cancel(inst):
    m0 = metrics(inst)
    base_used = m0['strata_kv_pages{tier="host",state="used"}']
    aborted0 = m0['strata_requests_finished_total{reason="aborted"}']
    t_close = []

    def first_chunk(i, payload, t):
        t_close.append(t)
        return False  # close right after the first chunk
    st, out = stream(inst, "/v1/completions", {
        "prompt": "A long story " * 40, "max_tokens": 20000,
        "temperature": 0.7, "stream": True}, on_chunk=first_chunk)

    def gone():
        m = metrics(inst)
        return (m["strata_sequences_running"] == 0 and
                m['strata_kv_pages{tier="host",state="used"}'] == base_used and
                m['strata_requests_finished_total{reason="aborted"}'] == aborted0 + 1)
    dt = wait_for(gone)
    check(st == 200 and len(out) == 1 and dt is not None,
          "P15 stream closed after the first chunk: request gone, KV pages "
          "back to baseline %d, aborted +1 (after %s s)" % (
              base_used, "%.3f" % dt if dt is not None else "never"))
    # a whole (non-streamed) request abandoned by its client
    import http.client
    # (the client closes only once the request runs: a close before
    # the server admitted it would be a refused connection, not a
    # cancellation, and a slow machine makes that race likely)
    c = http.client.HTTPConnection(inst.url, timeout=30)
    c.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "Another story", "max_tokens": 20000}).encode(),
        headers={"Authorization": "Bearer " + KEY})
    running = wait_for(lambda: metrics(inst)["strata_sequences_running"] >= 1)
    check(running is not None, "P15 the abandoned whole request was "
          "admitted and runs before its client leaves")
    c.close()
    dt = wait_for(lambda: metrics(inst)["strata_sequences_running"] == 0 and
                  kv_used(inst) == base_used)
    m = metrics(inst)
    check(dt is not None and
          m['strata_requests_finished_total{reason="aborted"}'] == aborted0 + 2,
          "P15 whole request abandoned: cancelled, pages freed, aborted +1")
    # a request that finishes normally is not aborted
    st, j = request(inst, "POST", "/v1/completions",
                    {"prompt": "Short", "max_tokens": 3})
    m2 = metrics(inst)
    check(st == 200 and
          m2['strata_requests_finished_total{reason="aborted"}'] == aborted0 + 2
          and m2['strata_kv_pages{tier="host",state="used"}'] == base_used,
          "P15 a finished request is not counted as aborted; pages freed")


def test_ids_across_restart(inst):
    """Completion ids stay unique when computed starts again (its counter
    starts over; the random per-start prefix does not repeat)."""
    body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2, "temperature": 0}
    ids = []
    for _ in range(2):
        for path, b, pre in (("/v1/completions", body, "cmpl-"),
                             ("/v1/chat/completions", chat, "chatcmpl-")):
            st, j = request(inst, "POST", path, b)
            i = j.get("id", "") if st == 200 and isinstance(j, dict) else ""
            check(re.fullmatch(re.escape(pre) + "[0-9a-f]{17,}", i) is not None,
                  "%s id %r has the shape %s<hex>" % (path, i, pre))
            ids.append(i.split("-", 1)[-1])
        inst.restart_computed()
    check(len(set(ids)) == len(ids),
          "completion ids unique across a computed restart: %s" % ids)


def test_errors(inst, cfg):
    bad = [
        ("malformed JSON", b"{\"prompt\": \"x\",", "/v1/completions"),
        ("not an object", b"[1,2]", "/v1/completions"),
        ("empty body", b"", "/v1/completions"),
        ("prompt a number", {"prompt": 5}, "/v1/completions"),
        ("no prompt", {"max_tokens": 3}, "/v1/completions"),
        ("temperature 5", {"prompt": "x", "temperature": 5}, "/v1/completions"),
        ("temperature a string", {"prompt": "x", "temperature": "hot"}, "/v1/completions"),
        ("top_p 0", {"prompt": "x", "top_p": 0}, "/v1/completions"),
        ("max_tokens 0", {"prompt": "x", "max_tokens": 0}, "/v1/completions"),
        ("max_tokens -3", {"prompt": "x", "max_tokens": -3}, "/v1/completions"),
        ("max_tokens 1.5", {"prompt": "x", "max_tokens": 1.5}, "/v1/completions"),
        ("n 2", {"prompt": "x", "n": 2}, "/v1/completions"),
        ("two prompts", {"prompt": ["x", "y"]}, "/v1/completions"),
        ("presence_penalty 1", {"prompt": "x", "presence_penalty": 1}, "/v1/completions"),
        ("frequency_penalty 0.5", {"prompt": "x", "frequency_penalty": 0.5},
         "/v1/completions"),
        ("logit_bias", {"prompt": "x", "logit_bias": {"5": 100}}, "/v1/completions"),
        ("suffix", {"prompt": "x", "suffix": "end"}, "/v1/completions"),
        ("5 stop strings", {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "/v1/completions"),
        ("empty stop", {"prompt": "x", "stop": [""]}, "/v1/completions"),
        ("stop a number", {"prompt": "x", "stop": 7}, "/v1/completions"),
        ("logprobs 9", {"prompt": "x", "logprobs": 9}, "/v1/completions"),
        ("stream a string", {"prompt": "x", "stream": "yes"}, "/v1/completions"),
        ("token id out of range", {"prompt": [1, 2, cfg["vocab_size"]]}, "/v1/completions"),
        ("negative token id", {"prompt": [-1]}, "/v1/completions"),
        ("empty prompt", {"prompt": ""}, "/v1/completions"),
        ("prompt beyond the context", {"prompt": [5] * (cfg["max_position_embeddings"] + 1)},
         "/v1/completions"),
        ("duplicate keys", b"{\"prompt\":\"a\",\"prompt\":\"b\"}", "/v1/completions"),
        ("no messages", {"max_tokens": 2}, "/v1/chat/completions"),
        ("empty messages", {"messages": []}, "/v1/chat/completions"),
        ("unknown role", {"messages": [{"role": "wizard", "content": "x"}]},
         "/v1/chat/completions"),
        ("content a number", {"messages": [{"role": "user", "content": 3}]},
         "/v1/chat/completions"),
        ("message not an object", {"messages": ["hi"]}, "/v1/chat/completions"),
        ("top_logprobs without logprobs",
         {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
         "/v1/chat/completions"),
    ]
    started0 = metrics(inst)["strata_requests_started_total"]
    for what, body, path in bad:
        raw = body if isinstance(body, bytes) else None
        st, j = request(inst, "POST", path, None if raw is not None else body, raw=raw)
        ok = st == 400 and isinstance(j, dict) and isinstance(j.get("error"), dict) \
            and j["error"]["type"] == "invalid_request_error" and j["error"]["message"]
        check(ok, "400 for %s (got %s %s)" % (what, st, str(j)[:120]))
    st, j = request(inst, "POST", "/v1/completions",
                    {"prompt": ["x", "y"], "max_tokens": 1})
    check("one prompt per request" in j["error"]["message"],
          "several prompts: the error says one prompt per request (%s)" %
          j["error"]["message"])
    j = request(inst, "POST", "/v1/completions",
                {"prompt": [5] * (cfg["max_position_embeddings"] + 1)})[1]
    check(j["error"]["code"] == "context_length_exceeded",
          "context overflow has code context_length_exceeded")
    check(j["error"]["param"] == "prompt",
          "a completion's context overflow names 'prompt' (got %r)" % j["error"]["param"])
    check(metrics(inst)["strata_requests_started_total"] == started0,
          "no generation started for any invalid request")
    name = request(inst, "GET", "/v1/models")[1]["data"][0]["id"]
    st, j = request(inst, "POST", "/v1/completions",
                    {"model": name + "-other", "prompt": "x", "max_tokens": 1})
    check(st == 404 and j["error"]["code"] == "model_not_found" and
          name in j["error"]["message"],
          "404 model_not_found for another model's name, naming %r (got %s %s)"
          % (name, st, str(j)[:160]))
    st, j = request(inst, "POST", "/v1/chat/completions",
                    {"model": 7, "messages": [{"role": "user", "content": "x"}]})
    check(st == 400 and j["error"]["param"] == "model",
          "400 for a model that is not a string (got %s)" % st)
    st, j = request(inst, "POST", "/v1/completions",
                    {"model": name, "prompt": "x", "max_tokens": 1})
    check(st == 200 and j["model"] == name,
          "the served model's name is accepted (got %s)" % st)
    check(metrics(inst)["strata_requests_started_total"] == started0 + 1,
          "no generation started for a wrong model name")
    started0 += 1  # the accepted one
    st, j = request(inst, "GET", "/v1/nothing")
    check(st == 404 and "error" in j, "404 for an unknown path")
    st, j = request(inst, "GET", "/v1/completions")
    check(st == 405 and "error" in j, "405 for GET /v1/completions")
    st, j = request(inst, "DELETE", "/v1/models")
    check(st == 405, "405 for DELETE /v1/models")
    big = json.dumps({"prompt": "a" * (1 << 20)}).encode()
    st, j = request(inst, "POST", "/v1/completions", raw=big)
    check(st == 413 and j["error"]["message"], "413 for a body over 1 MiB (Content-Length)")
    with tempfile.NamedTemporaryFile() as f:
        f.write(big)
        f.flush()
        code, body = curl(inst, "/v1/completions", "-H", "Authorization: Bearer " + KEY,
                          "-H", "Expect: 100-continue", "--data-binary", "@" + f.name)
    check(code == 413 and json.loads(body)["error"]["message"],
          "413 before the body is sent with Expect: 100-continue (curl)")
    with tempfile.NamedTemporaryFile() as f:
        f.write(big)
        f.flush()
        code, body = curl(inst, "/v1/completions", "-H", "Authorization: Bearer " + KEY,
                          "-H", "Transfer-Encoding: chunked", "--data-binary", "@" + f.name)
    check(code == 413, "413 for a chunked body over 1 MiB (got %d)" % code)
    # API key
    for what, key in (("no key", ""), ("wrong key", "nope"),
                      ("key as prefix", KEY + "x"), ("key truncated", KEY[:-1])):
        st, j = request(inst, "POST", "/v1/completions",
                        {"prompt": "x", "max_tokens": 2}, key=key)
        check(st == 401 and j["error"]["message"], "401 with %s" % what)
        st, j = request(inst, "GET", "/v1/models", key=key)
        check(st == 401, "401 for /v1/models with %s" % what)
        st, j = request(inst, "GET", "/metrics", key=key)
        check(st == 200, "/metrics answers with %s (no --metrics-auth)" % what)
    code, _ = curl(inst, "/v1/models", "-H", "Authorization: Basic " + KEY)
    check(code == 401, "401 for a non-Bearer scheme (curl)")
    check(metrics(inst)["strata_requests_started_total"] == started0,
          "no generation started without the key")
    m = metrics(inst)
    n500 = sum(v for k, v in m.items() if k.startswith("strata_http_responses_total")
               and 'code="5' in k)
    check(n500 == 0, "no 5xx answered for bad input")
    st, j = request(inst, "POST", "/v1/completions",
                    {"prompt": "x", "max_tokens": 1, "presence_penalty": 0,
                     "frequency_penalty": 0.0, "logit_bias": {}, "suffix": None})
    check(st == 200, "penalties 0, empty logit_bias, null suffix are accepted")


def test_queue_full(store):
    inst = Instance(store, tag="srvq", computed_args=[
        "--max-running", "1", "--max-queued", "1"]).start()
    try:
        closers = []
        threads = []
        stop = threading.Event()

        def long_req():
            def cb(i, p, t):
                return not stop.is_set()
            stream(inst, "/v1/completions", {"prompt": "Go on", "max_tokens": 20000,
                                             "stream": True}, on_chunk=cb)
        for _ in range(2):
            t = threading.Thread(target=long_req)
            t.start()
            threads.append(t)
            time.sleep(0.2)
        ok = wait_for(lambda: metrics(inst)["strata_sequences_running"] == 1 and
                      metrics(inst)["strata_requests_queued"] == 1)
        check(ok is not None, "1 running and 1 queued")
        import http.client
        c = http.client.HTTPConnection(inst.url, timeout=10)
        c.request("POST", "/v1/completions", body=b'{"prompt":"x"}',
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        j = json.loads(r.read())
        check(r.status == 429 and j["error"]["code"] == "queue_full" and
              r.getheader("Retry-After") == "1",
              "429 queue_full with Retry-After when the queue is full")
        c.close()
        stop.set()  # both clients close: the running and the queued one
        for t in threads:
            t.join(30)
        dt = wait_for(lambda: metrics(inst)["strata_sequences_running"] == 0 and
                      metrics(inst)["strata_requests_queued"] == 0, 10)
        m = metrics(inst)
        check(dt is not None and m['strata_kv_pages{tier="host",state="used"}'] == 0,
              "P15 closing a queued and a running stream: none left, no KV "
              "pages used")
        closers.clear()
        # /health is 503 when kvd is down
        inst.procs["kvd"].kill()
        inst.procs["kvd"].wait()
        st, j = request(inst, "GET", "/health")
        check(st == 503 and j["kvd"] == "down", "/health 503 with kvd down")
        # a new request while kvd (then both tiers) is down: 503 at once
        # (it used to wait computed's 60 s restart wait), Retry-After, an
        # OpenAI error object naming the daemon and its remedy
        for dead, code in (("kvd", "kvd_down"), ("expertd", "tiers_down")):
            if dead == "expertd":
                inst.procs["expertd"].kill()
                inst.procs["expertd"].wait()
            c = http.client.HTTPConnection(inst.url, timeout=30)
            t0 = time.time()
            c.request("POST", "/v1/completions",
                      body=b'{"prompt":"x","max_tokens":2}',
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            dt = time.time() - t0
            j = json.loads(r.read())
            c.close()
            e = j.get("error", {})
            check(r.status == 503 and dt < 2 and
                  r.getheader("Retry-After") == "1" and
                  e.get("type") == "server_error" and e.get("code") == code and
                  "strata restart " + dead in e.get("message", ""),
                  "%s down: POST 503 %s in %.2f s (< 2), Retry-After 1, "
                  "names `strata restart %s`: %s" % (dead, code, dt, dead, j))
    finally:
        inst.stop()


def main():
    model = fixture("tiny-qwen3moe")
    cfg = json.load(open(os.path.join(model, "config.json")))
    tmp = tempfile.mkdtemp(prefix="strata-http-")
    store = convert(model, os.path.join(tmp, "st"), "bf16")
    inst = Instance(store, computed_args=["--max-running", "16"], api_key=KEY)
    inst.start()
    try:
        test_endpoints(inst, cfg)
        test_stream_format_and_usage(inst)
        test_stop(inst)
        test_batched_equals_alone(inst)
        test_cancel(inst)
        test_ids_across_restart(inst)
        test_errors(inst, cfg)
    finally:
        inst.stop()
    test_queue_full(store)
    subprocess.run(["rm", "-rf", tmp, inst.tmp])
    print("%d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
