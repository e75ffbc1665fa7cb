#!/usr/bin/python3
"""computed's HTTP server against clients as they come (issue 20), on
kjv-moe with real daemons and raw sockets.  Checks, each on values that
could be wrong:
  - a client that half-closes (shutdown SHUT_WR) after its request gets
    the whole answer (HTTP/1.1 and 1.0) and the whole stream; one that
    closes for good mid-request is still cancelled (aborted + 1);
  - 256 slow connections (a header byte every 0.5 s) from one address
    cannot lock others out: beyond --http-max-client-conns they are
    refused, a client from another address is answered at once, and each
    is disconnected --http-request-timeout after it connected although it
    keeps sending; a connection that sends nothing goes the same way;
  - /metrics answers without the API key, with --metrics-auth only with
    it; GET /v1/models/{id} (404 model_not_found for another id);
  - stream usage only with stream_options.include_usage; stream_options
    without stream, tools and n > 1: 400 naming the field;
  - --chat-template chatml on kjv-moe (whose vocabulary lacks
    <|im_start|>) refused at start-up, naming the token.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import (BUILD, FAILS, Instance, check, convert,  # noqa
                           metrics, request, stream)

KEY = "clients-key"
REQ_TIMEOUT_S = 3


def raw_exchange(inst, body, version="1.1", shut_wr=True, path="/v1/completions"):
    """Sends one request (then SHUT_WR), reads until the server closes."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", inst.port), timeout=60)
    s.sendall(("POST %s HTTP/%s\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Content-Type: application/json\r\nContent-Length: %d\r\n"
               "Connection: close\r\n\r\n" % (path, version, KEY, len(data))
               ).encode() + data)
    if shut_wr:
        s.shutdown(socket.SHUT_WR)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError as e:
        out += ("<%r>" % e).encode()
    s.close()
    return out.decode("utf-8", "replace")


def final_json(resp):
    """The JSON body of the final (non-1xx) response of a raw exchange."""
    parts = [p for p in re.split(r"(?=HTTP/1\.[01] \d\d\d )", resp) if p]
    last = parts[-1] if parts else ""
    status = int(last.split(" ", 2)[1]) if last.startswith("HTTP/") else 0
    body = last.split("\r\n\r\n", 1)[1] if "\r\n\r\n" in last else ""
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def test_half_close(inst):
    # long enough (about 0.5 s) that the server polls the connection
    # while it generates
    body = {"prompt": "In the beginning", "max_tokens": 160, "temperature": 0}
    st, ref = request(inst, "POST", "/v1/completions", body)
    want = ref["choices"][0]["text"]
    for version in ("1.1", "1.0"):
        status, j = final_json(raw_exchange(inst, body, version))
        check(status == 200 and isinstance(j, dict) and
              j["choices"][0]["text"] == want,
              "half-closed HTTP/%s client gets the whole answer (%r)" %
              (version, j["choices"][0]["text"] if isinstance(j, dict) else j))
    resp = raw_exchange(inst, dict(body, stream=True))
    text = "".join(json.loads(m)["choices"][0]["text"] for m in
                   re.findall(r"data: (\{.*?\})\n", resp))
    check(resp.startswith("HTTP/1.1 200") and "data: [DONE]" in resp and
          text == want, "half-closed client gets the whole stream (%r)" % text)
    # a client gone for good is still cancelled (whole response)
    m0 = metrics(inst)
    ab0 = m0['strata_requests_finished_total{reason="aborted"}']
    s = socket.create_connection(("127.0.0.1", inst.port))
    data = json.dumps({"prompt": "x", "max_tokens": 250}).encode()
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
               "Bearer %s\r\nContent-Length: %d\r\n\r\n" % (KEY, len(data))
               ).encode() + data)
    t0 = time.time()
    while time.time() - t0 < 10 and metrics(inst)["strata_sequences_running"] < 1:
        time.sleep(0.01)
    s.close()
    t0 = time.time()
    while time.time() - t0 < 10:
        m = metrics(inst)
        if (m['strata_requests_finished_total{reason="aborted"}'] == ab0 + 1
                and m["strata_sequences_running"] == 0):
            break
        time.sleep(0.02)
    check(m['strata_requests_finished_total{reason="aborted"}'] == ab0 + 1 and
          m["strata_sequences_running"] == 0,
          "a client closed for good is still cancelled (aborted +1 after "
          "%.2f s)" % (time.time() - t0))


def slow_conn(addr, port, stop, closed_at, i):
    """Connects from addr and sends a request head one line per 0.5 s,
    never finishing it; records when the server ended the connection."""
    t0 = time.time()
    try:
        s = socket.socket()
        s.bind((addr, 0))
        s.settimeout(0.5)
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        while not stop.is_set():
            try:
                if s.recv(1024) == b"":
                    break
            except socket.timeout:
                pass
            s.sendall(b"X-Slow: a\r\n")
    except OSError:
        pass
    closed_at[i] = time.time() - t0


def test_slow_clients(store):
    n = 256
    inst = Instance(store, api_key=KEY, computed_args=[
        "--http-request-timeout", str(REQ_TIMEOUT_S),
        "--http-max-client-conns", "64"]).start()
    try:
        stop = threading.Event()
        closed_at = [None] * n
        ts = [threading.Thread(target=slow_conn, args=("127.0.0.2", inst.port,
                                                       stop, closed_at, i))
              for i in range(n)]
        for t in ts:
            t.start()
        time.sleep(0.5)
        t0 = time.time()
        try:
            st, j = request(inst, "POST", "/v1/completions",
                            {"prompt": "In the beginning", "max_tokens": 4},
                            timeout=10)
        except OSError as e:
            st, j = 0, repr(e)
        dt = time.time() - t0
        check(st == 200 and dt < REQ_TIMEOUT_S,
              "256 slow connections from 127.0.0.2: a client from 127.0.0.1 "
              "is answered in %.2f s (< %d s; status %s)" % (dt, REQ_TIMEOUT_S, st))
        refused = sum(1 for c in closed_at if c is not None and c < 1.0)
        check(refused >= n - 64,
              "beyond 64 connections per address the slow ones are refused "
              "(%d of %d at once)" % (refused, n))
        idle = socket.create_connection(("127.0.0.1", inst.port))
        idle.settimeout(REQ_TIMEOUT_S + 5)
        t_idle = time.time()
        for t in ts:
            t.join(REQ_TIMEOUT_S + 5)
        stop.set()
        late = [c for c in closed_at if c is not None and c >= 1.0]
        check(len(late) >= 1 and all(c is not None for c in closed_at) and
              all(REQ_TIMEOUT_S - 0.5 <= c <= REQ_TIMEOUT_S + 2 for c in late),
              "the accepted slow connections, still sending, are cut after "
              "--http-request-timeout %d s (%d of them, %.2f..%.2f s)" %
              (REQ_TIMEOUT_S, len(late), min(late or [0]), max(late or [0])))
        try:
            got = idle.recv(100)
        except OSError:
            got = b""
        dt = time.time() - t_idle
        check(got == b"" and REQ_TIMEOUT_S - 0.5 <= dt <= REQ_TIMEOUT_S + 2,
              "a connection that sends nothing is closed after %.2f s" % dt)
        idle.close()
        st, j = request(inst, "GET", "/v1/models")
        check(st == 200, "the server still answers afterwards")
    finally:
        inst.stop()
        shutil.rmtree(inst.tmp, ignore_errors=True)


def test_api(inst, model_id):
    st, text = request(inst, "GET", "/metrics", key="")
    check(st == 200 and "strata_requests_started_total" in text,
          "/metrics answers without the API key (as vLLM)")
    st, j = request(inst, "GET", "/v1/models", key="")
    check(st == 401, "/v1/models still wants the key (%d)" % st)
    st, j = request(inst, "GET", "/v1/models/" + model_id)
    check(st == 200 and j["id"] == model_id and j["object"] == "model" and
          j["max_model_len"] == 256, "GET /v1/models/%s: the model" % model_id)
    st, j = request(inst, "GET", "/v1/models/gpt-4")
    check(st == 404 and j["error"]["code"] == "model_not_found",
          "GET /v1/models/gpt-4: 404 model_not_found")
    body = {"prompt": "And God said", "max_tokens": 6, "temperature": 0,
            "stream": True}
    st, out = stream(inst, "/v1/completions", body)
    chunks = [json.loads(p) for p in out[:-1]]
    check(st == 200 and out[-1] == "[DONE]" and
          all("usage" not in c for c in chunks) and
          chunks[-1]["choices"][0]["finish_reason"] == "length",
          "stream without stream_options: no usage in any chunk")
    st, out = stream(inst, "/v1/completions",
                     dict(body, stream_options={"include_usage": True}))
    chunks = [json.loads(p) for p in out[:-1]]
    check(st == 200 and out[-1] == "[DONE]" and
          all(c.get("usage", "absent") is None for c in chunks[:-1]) and
          chunks[-1]["choices"] == [] and
          (chunks[-1].get("usage") or {}).get("completion_tokens") == 6 and
          chunks[-2]["choices"][0]["finish_reason"] == "length",
          "include_usage: usage null in each chunk, then one chunk with "
          "empty choices and the usage (%s)" % chunks[-1].get("usage"))
    for what, extra, param in (
            ("stream_options without stream",
             {"stream_options": {"include_usage": True}}, "stream_options"),
            ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]},
             "tools"),
            ("tool_choice required", {"tool_choice": "required"}, "tool_choice"),
            ("n = 3", {"n": 3}, "n")):
        st, j = request(inst, "POST", "/v1/chat/completions",
                        dict({"messages": [{"role": "user", "content": "Hi"}],
                              "max_tokens": 2}, **extra))
        err = j.get("error", {}) if isinstance(j, dict) else {}
        check(st == 400 and err.get("param") == param and
              param in err.get("message", ""),
              "%s: 400 naming '%s' (%d %s)" % (what, param, st, err.get("message")))
    st, j = request(inst, "POST", "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "Hi"}],
                     "max_tokens": 2, "n": 1, "tools": [], "tool_choice": "none"})
    check(st == 200, "n 1, empty tools, tool_choice none accepted")


def test_startup_refusal(store):
    tmp = tempfile.mkdtemp(prefix="strata-chat-")
    r = subprocess.run([os.path.join(BUILD, "computed", "computed"),
                        "--store", store, "--instance", "chat%d" % os.getpid(),
                        "--run-dir", tmp, "--http-port", "1",
                        "--chat-template", "chatml", "--connect-timeout", "1"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "<|im_start|>" in r.stderr and
          "--chat-template" in r.stderr,
          "--chat-template chatml on kjv-moe refused at start-up: %s" %
          r.stderr.strip().splitlines()[-1:])
    shutil.rmtree(tmp, ignore_errors=True)


def main():
    model = os.path.join(HERE, "..", "..", "models", "kjv-moe")
    tmp = tempfile.mkdtemp(prefix="strata-clients-")
    store = convert(model, os.path.join(tmp, "kjv-moe.strata"), "bf16")
    inst = Instance(store, api_key=KEY).start()
    try:
        test_half_close(inst)
        test_api(inst, "kjv-moe")
    finally:
        inst.stop()
        shutil.rmtree(inst.tmp, ignore_errors=True)
    inst = Instance(store, api_key=KEY, computed_args=["--metrics-auth"]).start()
    try:
        st, _ = request(inst, "GET", "/metrics", key="")
        st2, _ = request(inst, "GET", "/metrics")
        check(st == 401 and st2 == 200,
              "--metrics-auth: /metrics 401 without the key, 200 with it")
    finally:
        inst.stop()
        shutil.rmtree(inst.tmp, ignore_errors=True)
    test_slow_clients(store)
    test_startup_refusal(store)
    shutil.rmtree(tmp, ignore_errors=True)
    print("%d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
