#!/usr/bin/python3
"""The official `openai` npm client against computed's HTTP API on the
demo model kjv-moe (no chat template of its own: the plain template).
Installs the client (tests/serve/openai-client/package-lock.json: npm ci
from the npm registry into the build dir); skips (77) when node or npm is
missing or the install fails.  Checks, each on values that could be wrong:
  - models.list / models.retrieve give the served id; an unknown id 404;
  - completions, whole and streamed: the client's greedy text equals a raw
    HTTP request's; no usage in a stream that did not ask for it;
  - chat, whole and streamed with stream_options.include_usage: the text
    equals a raw /v1/completions of the documented plain template's
    rendering (with its stop "\\nUser:"); the stream's text and usage equal
    the whole answer's; exactly one usage chunk, with empty choices;
  - tools and n = 2 answered 400 (the client raises BadRequestError).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_harness import (BUILD, FAILS, Instance, check, convert,  # noqa: E402
                           request, usage_counts)

KEY = "openai-client-key"



def skip(msg):
    print("SKIP:", msg)
    sys.exit(77)


def install_client():
    """npm ci of the pinned client into BUILD/openai-client; its dir."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        skip("node and npm are needed for the openai npm client "
             "(scripts/setup-debian.sh installs nodejs and npm)")
    dest = os.path.abspath(os.path.join(BUILD, "openai-client"))
    os.makedirs(dest, exist_ok=True)
    for f in ("package.json", "package-lock.json", "client.mjs"):
        shutil.copy(os.path.join(HERE, "openai-client", f), dest)
    if not os.path.exists(os.path.join(dest, "node_modules", "openai",
                                       "package.json")):
        try:
            r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"],
                               cwd=dest, capture_output=True, text=True,
                               timeout=240)
        except subprocess.TimeoutExpired:
            skip("npm ci of the openai client timed out (no registry?)")
        if r.returncode != 0:
            skip("cannot install the openai npm client (npm ci: %s)" %
                 (r.stderr.strip().splitlines() or ["?"])[-1])
    return dest


def main():
    dest = install_client()
    model = os.path.join(HERE, "..", "..", "models", "kjv-moe")
    tmp = tempfile.mkdtemp(prefix="strata-openai-")
    store = convert(model, os.path.join(tmp, "kjv.strata"), "bf16")
    inst = Instance(store, api_key=KEY,
                    computed_args=["--model-name", "kjv-moe"]).start()
    try:
        env = dict(os.environ, STRATA_BASE_URL="http://%s/v1" % inst.url,
                   STRATA_API_KEY=KEY, STRATA_MODEL="kjv-moe")
        r = subprocess.run(["node", os.path.join(dest, "client.mjs")],
                           env=env, capture_output=True, text=True,
                           timeout=240)
        print(r.stderr[-2000:])
        try:
            o = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            o = {"fatal": r.stdout[-2000:]}
        if not check(r.returncode == 0 and "fatal" not in o,
                     "the openai client ran every call (%s)" % o.get("fatal")):
            return 1
        check(o["models"] == ["kjv-moe"] and o["model"]["id"] == "kjv-moe"
              and o["model"]["object"] == "model",
              "models.list and models.retrieve: kjv-moe (%s)" % o["models"])
        check(isinstance(o["missing_model"], dict) and
              o["missing_model"]["status"] == 404,
              "models.retrieve of an unknown id: 404 (%s)" % o["missing_model"])
        st, raw = request(inst, "POST", "/v1/completions",
                          {"prompt": "In the beginning God", "max_tokens": 16,
                           "temperature": 0})
        c, cs = o["completion"], o["completion_stream"]
        check(st == 200 and c["text"] == raw["choices"][0]["text"] and
              usage_counts(c["usage"]) == usage_counts(raw["usage"]) and
              c["usage"]["completion_tokens"] == 16,
              "completion: the client's greedy text equals a raw request's "
              "(%r)" % c["text"])
        check(cs["text"] == c["text"] and cs["usage"] is None and
              cs["chunks"] >= 2,
              "streamed completion: same text, no usage without "
              "stream_options (%d chunks)" % cs["chunks"])
        plain = ("System: Answer as the scripture does.\n\n"
                 "User: Who created the heaven and the earth?\n\nAssistant:")
        st, raw = request(inst, "POST", "/v1/completions",
                          {"prompt": plain, "max_tokens": 24,
                           "temperature": 0, "stop": ["\nUser:"]})
        ch, cst = o["chat"], o["chat_stream"]
        check(st == 200 and ch["role"] == "assistant" and ch["text"] and
              ch["text"] == raw["choices"][0]["text"] and
              ch["finish"] == raw["choices"][0]["finish_reason"] and
              usage_counts(ch["usage"]) == usage_counts(raw["usage"]),
              "chat on kjv-moe: the answer equals the plain template's "
              "rendering completed raw (%r, %s)" % (ch["text"], ch["usage"]))
        check(cst["text"] == ch["text"] and usage_counts(cst["usage"]) == usage_counts(ch["usage"]) and
              cst["usage_chunks"] == 1 and o["usage_chunk_choices"] == 0 and
              cst["roles"] == 1,
              "streamed chat with include_usage: same text and usage, one "
              "usage chunk with empty choices (%s)" % cst)
        for what in ("tools", "n2"):
            e = o[what]
            check(isinstance(e, dict) and e["status"] == 400 and
                  ("tools" if what == "tools" else "'n'") in e["message"],
                  "%s: 400 from the client (%s)" % (what, e))
    finally:
        inst.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(inst.tmp, ignore_errors=True)
    print("%d failed" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
