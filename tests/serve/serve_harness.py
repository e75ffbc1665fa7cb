"""Helpers for the serving tests and the load benchmark: start real
expertd, kvd and computed (with its HTTP API) on a private instance, talk
HTTP to it, read /metrics; the tests' check()/FAILS, the prompt words
(WORDS, GENESIS) and kv_bytes_per_token().  Used by the Python tests in
tests/serve/ and by scripts/bench-serve.py, scripts/bench-kv-restore.py and
scripts/bench-memory-budget.py."""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BUILD = os.environ.get("STRATA_BUILD_DIR", "build")
SHARED = os.environ.get("STRATA_SHARED_DIR", "../shared")

# Genesis 1:1-2 (KJV), lower case, no punctuation: the words prompts are
# made of.  Prompts index these tuples modulo their length, so the length
# is part of every prompt (and of its token count): do not extend them.
GENESIS = tuple(("in the beginning god created the heaven and the earth "
                 "and the earth was without form and void and darkness was "
                 "upon the face of the deep and the spirit of god moved "
                 "upon the face of the waters").split())
# its first 27 words, to "the deep": the KV restore and memory budget
# tests' and benchmarks' vocabulary
WORDS = GENESIS[:27]

# Failed checks of this process, in order (check() appends; a test's
# main() ends with `return finish()`).  One list per process:
# a test importing another test's functions shares it.
FAILS = []


def check(cond, what):
    """Records one test check: prints "ok: WHAT" or "FAIL: WHAT" on stdout
    and appends WHAT to FAILS when cond is false.  Returns cond (truthy or
    not, unchanged) so that a caller can skip what depends on it.  Safe
    from several threads (list.append)."""
    print("ok:" if cond else "FAIL:", what)
    if not cond:
        FAILS.append(what)
    return cond


def finish():
    """A test main()'s exit status: 1 after printing how many checks
    failed, 0 when none did."""
    if FAILS:
        print("%d checks failed" % len(FAILS))
        return 1
    return 0


def kv_bytes_per_token(model_dir):
    """KV bytes of one token in computed's default --kv-dtype (f32): K and
    V rows of every layer, num_hidden_layers x 2 x num_key_value_heads x
    head_dim x 4, from model_dir's config.json (head_dim, else hidden_size
    / num_attention_heads).  Raises OSError / KeyError / ValueError on a
    missing or malformed config.json."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * hd * 4


def skip_or_fail(msg):
    """Missing fixture: skip (77), or fail under CI."""
    if os.environ.get("CI", "false") not in ("", "false"):
        print("FAIL:", msg)
        sys.exit(1)
    print("SKIP:", msg)
    sys.exit(77)


def fixture(name):
    d = os.path.join(SHARED, "fixtures", "models", name)
    if not os.path.isdir(d):
        skip_or_fail("fixture %s not found (needs ../shared)" % d)
    return d


def convert(model_dir, out, experts="bf16"):
    """strata convert, unless out already holds a store."""
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    r = subprocess.run([os.path.join(BUILD, "cli", "strata"), "convert",
                        "--model", model_dir, "--out", out, "--experts",
                        experts], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("strata convert failed: " + r.stderr)
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Instance:
    """expertd + kvd + computed --http-port on a private instance."""

    def __init__(self, store, tag="srv", computed_args=(), kvd_args=(),
                 expertd_args=(), api_key=None):
        self.tmp = tempfile.mkdtemp(prefix="strata-serve-")
        self.run_dir = os.path.join(self.tmp, "run")
        os.mkdir(self.run_dir, 0o700)
        self.name = "%s%d" % (tag, os.getpid())
        self.store = store
        self.port = free_port()
        self.url = "127.0.0.1:%d" % self.port
        self.api_key = api_key
        self.procs = {}
        self.args = {"expertd": ["--store", store] + list(expertd_args),
                     "kvd": list(kvd_args),
                     "computed": ["--store", store, "--http-port",
                                  str(self.port)] + list(computed_args)}

    def start_daemon(self, d):
        log = open(os.path.join(self.tmp, d + ".log"), "a")
        env = dict(os.environ)
        if d == "computed" and self.api_key:
            env["STRATA_API_KEY"] = self.api_key
        self.procs[d] = subprocess.Popen(
            [os.path.join(BUILD, d, d), "--instance", self.name,
             "--run-dir", self.run_dir] + self.args[d],
            stdout=log, stderr=subprocess.STDOUT, env=env)

    def start(self, timeout_s=60):
        for d in ("expertd", "kvd", "computed"):
            self.start_daemon(d)
            if d != "computed":
                ctl = os.path.join(self.run_dir, d + ".ctl")
                t0 = time.time()
                while not os.path.exists(ctl) and time.time() - t0 < timeout_s:
                    time.sleep(0.05)
        return self.wait_ready(timeout_s)

    def restart_computed(self, sig=signal.SIGKILL, timeout_s=60):
        """computed alone stopped (SIGKILL: a crash) and started again
        under the running expertd and kvd; returns once it serves."""
        p = self.procs["computed"]
        p.send_signal(sig)
        p.wait(15)
        self.start_daemon("computed")
        return self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s=60):
        """Waits for computed's GET /health to answer 200."""
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            try:
                st, _ = request(self, "GET", "/health", timeout=2)
                if st == 200:
                    return self
            except OSError:
                pass
            if self.procs["computed"].poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("computed did not become ready:\n" + self.log("computed"))

    def log(self, d):
        try:
            return open(os.path.join(self.tmp, d + ".log")).read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        for d in ("computed", "kvd", "expertd"):
            p = self.procs.get(d)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        # a daemon killed by a test (SIGKILL) leaves its segment for a
        # successor to adopt; none comes: remove this instance's segments
        # (the name carries our pid: they are ours)
        prefix = "strata.%s." % self.name
        for f in os.listdir("/dev/shm"):
            if f.startswith(prefix):
                try:
                    os.unlink(os.path.join("/dev/shm", f))
                except OSError:
                    pass

    def rss_kib(self, d="computed", field="VmRSS"):
        """A /proc/PID/status memory field in KiB (VmRSS, RssAnon,
        RssFile, RssShmem)."""
        with open("/proc/%d/status" % self.procs[d].pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def rss_own_kib(self, d="computed"):
        """The process's own memory: anonymous RSS.  Not counted: shared
        memory (the KV and expert pools are kvd's and expertd's segments,
        bounded by their budgets; computed's RSS counts the pool pages it
        has touched, which grows until every page was used once).  dense.bin
        is read whole into computed's own memory at start (st_hugemem), so
        it is in the baseline and does not grow."""
        return self.rss_kib(d, "RssAnon")


def headers_for(inst, key=None, extra=None):
    h = {"Content-Type": "application/json"}
    k = key if key is not None else (inst.api_key if inst else None)
    if k:
        h["Authorization"] = "Bearer " + k
    if extra:
        h.update(extra)
    return h


def request(inst, method, path, body=None, key=None, timeout=120,
            raw=None, headers=None):
    """One request; returns (status, parsed JSON or text)."""
    c = http.client.HTTPConnection(inst.url, timeout=timeout)
    data = raw if raw is not None else (json.dumps(body).encode()
                                        if body is not None else None)
    c.request(method, path, body=data, headers=headers_for(inst, key, headers))
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(text)
    except ValueError:
        return r.status, text


def stream(inst, path, body, key=None, timeout=300, on_chunk=None):
    """A streaming request: returns (status, [data payload strings]).
    on_chunk(i, payload, t) may return False to close the connection."""
    c = http.client.HTTPConnection(inst.url, timeout=timeout)
    c.request("POST", path, body=json.dumps(body).encode(),
              headers=headers_for(inst, key))
    r = c.getresponse()
    if r.status != 200:
        text = r.read().decode()
        c.close()
        return r.status, [text]
    out = []
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.decode("utf-8")
        if not line.startswith("data: "):
            continue
        payload = line[6:].rstrip("\n")
        out.append(payload)
        if on_chunk and on_chunk(len(out) - 1, payload, time.time()) is False:
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            return r.status, out
        if payload == "[DONE]":
            break
    c.close()
    return r.status, out


def usage_counts(u):
    """The token counts of a usage object, without
    prompt_tokens_details.cached_tokens (what the prefix cache gave: a
    repeated prompt maps rows the first run left, so it differs between
    runs of the same request); that one checked within [0, prompt_tokens].
    """
    if not isinstance(u, dict):
        return u
    c = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    ok = isinstance(c, int) and 0 <= c <= u.get("prompt_tokens", 0)
    return dict({k: u.get(k) for k in ("prompt_tokens", "completion_tokens",
                                        "total_tokens")},
                cached_ok=ok)


def metrics(inst):
    """/metrics as {'name{labels}': value}."""
    st, text = request(inst, "GET", "/metrics")
    assert st == 200, (st, text)
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def greedy_batch(inst, n, prompt_words, max_tokens, kill=None,
                 kill_after=1.0, alone=False):
    """n greedy /v1/completions at once (request i: "i" and prompt_words
    words of WORDS from 7 i on), logprobs 1; with kill ("kvd", "expertd")
    that daemon is killed (SIGKILL) kill_after s in and started again;
    alone: the same requests one after another instead (no kill).
    Returns per request (text, logprobs as sorted JSON, completion tokens),
    or ("HTTP <status> <body>", "", 0) for a failed one."""
    out = [None] * n

    def client(i):
        prompt = "%d %s" % (i, " ".join(WORDS[(i * 7 + k) % len(WORDS)]
                                        for k in range(prompt_words)))
        st, body = request(inst, "POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 1}, timeout=300)
        if st == 200:
            ch = body["choices"][0]
            out[i] = (ch["text"], json.dumps(ch["logprobs"], sort_keys=True),
                      body["usage"]["completion_tokens"])
        else:
            out[i] = ("HTTP %d %s" % (st, body), "", 0)

    if alone:
        for i in range(n):
            client(i)
        return out
    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    if kill:
        time.sleep(kill_after)
        inst.procs[kill].kill()
        inst.procs[kill].wait()
        inst.start_daemon(kill)
    for t in ts:
        t.join()
    return out
