"""Saved sessions (issue 23 item 4) with real expertd, kvd and computed
(HTTP API) on kjv-moe (models/kjv-moe, greedy, reference mode):

  - a conversation saved by the request field "session": {"save": NAME}
    (prompt and generated rows), then continued on the same instance (the
    uninterrupted run); the whole instance stopped (every daemon, kvd's
    pool gone) and started again with the same --session-dir: the same
    continuation with "session": {"load": NAME} maps the saved rows (the
    prefix-cache counter counts at least the prompt's full pages) and its
    greedy text and log-probabilities equal the uninterrupted run's bit
    for bit; without the load nothing is mapped; the same after kvd alone
    was restarted (a new, empty pool under a running computed);
  - GET /v1/sessions lists it (rows, bytes, model); POST
    /v1/sessions/NAME/load; POST /v1/sessions/NAME with a prompt saves its
    cached rows; DELETE removes it, a load then answers 404; saving a
    conversation nothing ran answers 404 saying to run it first;
  - strata session save (a computed prompt's cached pages), ls, rm, load
    on the running instance; strata up --kv-session-dir hands kvd the
    directory (session ls lists what is there);
  - refused by name with a 400 naming what differs: another served model
    name, another KV dtype (bf16), another page size (8); a corrupted copy
    of the file (checksum: nothing used); a name with a path in it.

  - computed alone restarted (SIGKILL) under the running expertd and
    kvd: the session loaded, the continuation equals the uninterrupted
    run's bit for bit;

  - DeepSeek-V4 and V4.1 (../shared tiny-deepseek-v4/v41; skipped where
    absent): the session of the first turn holds the full pages of its
    prompt and generated tokens (every stream of the state; the row count
    asserted); a second turn whose prompt carries the first turn's answer
    maps all of them; resumed after computed alone and after the whole
    instance restarted it gives the uninterrupted run's text and
    log-probabilities bit for bit, and so does the cold computation after
    kvd alone restarted (nothing mapped).

Figures printed: the saved files' bytes and rows.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Instance, convert, metrics, request  # noqa

SRC = os.environ.get("STRATA_SOURCE_DIR",
                     os.path.join(os.path.dirname(__file__), "..", ".."))
KJV = os.path.join(SRC, "models", "kjv-moe")
STRATA = os.path.join(os.environ.get("STRATA_BUILD_DIR", "build"), "cli",
                      "strata")
SHARED = os.environ.get("STRATA_SHARED_DIR", "../shared")
REUSED = "strata_prefix_cache_rows_reused_total"
PAGE_ROWS = 16
FAILS = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        FAILS.append(what)
    return cond


def complete(inst, prompt, n, **extra):
    """Greedy completion: (status, text, token log-probabilities, prompt
    tokens, rows the prefix cache gave it, the JSON)."""
    r0 = metrics(inst)[REUSED]
    body = dict({"prompt": prompt, "temperature": 0, "logprobs": 1,
                 "max_tokens": n}, **extra)
    st, j = request(inst, "POST", "/v1/completions", body)
    if st != 200:
        return st, None, None, 0, 0, j
    ch = j["choices"][0]
    return (st, ch["text"], ch["logprobs"]["token_logprobs"],
            j["usage"]["prompt_tokens"], metrics(inst)[REUSED] - r0, j)


def start(store, sdir, tag, computed_args=()):
    return Instance(store, tag=tag, kvd_args=["--session-dir", sdir],
                    computed_args=list(computed_args)).start()


def refused(inst, name, says, status=400):
    st, _, _, _, _, j = complete(inst, "And", 2, session={"load": name})
    msg = j.get("error", {}).get("message", "") if isinstance(j, dict) \
        else str(j)
    check(st == status and says in msg, "load refused (%d): %s" % (st, msg))


def main():
    tmp = tempfile.mkdtemp(prefix="strata-sess-")
    sdir = os.path.join(tmp, "sessions")
    store = convert(KJV, os.path.join(tmp, "kjv"))
    with open(os.path.join(KJV, "valid.txt")) as f:
        text = f.read()
    prompt = text[:360]
    more = "\nAnd the LORD said"
    insts = []
    try:
        a = start(store, sdir, "sesa")
        insts.append(a)
        st, t1, _, n1, _, j = complete(a, prompt, 24,
                                       session={"save": "conv-1"})
        if not check(st == 200, "the first turn, saved: %s" % st):
            print(j)
            return 1
        turn2 = prompt + t1 + more
        st, t2, lp2, n2, reused_a, _ = complete(a, turn2, 24)
        check(st == 200 and n2 > n1, "the second turn on the same "
              "instance (%d prompt tokens, %d rows reused)" % (n2, reused_a))
        st, ls = request(a, "GET", "/v1/sessions")
        ent = [e for e in ls.get("data", []) if e["id"] == "conv-1"] \
            if st == 200 else []
        rows = (n1 + 24 - 1) // PAGE_ROWS * PAGE_ROWS
        check(len(ent) == 1 and ent[0]["rows"] == rows and
              ent[0]["model"] == "kjv" and
              ent[0]["bytes"] == os.path.getsize(
                  os.path.join(sdir, "conv-1.kvs")),
              "GET /v1/sessions: conv-1 with %d rows (prompt and generated "
              "tokens' full pages): %s" % (rows, ent))
        print("figures: session conv-1: %d rows, %d bytes"
              % (rows, os.path.getsize(os.path.join(sdir, "conv-1.kvs"))))
        a.stop()
        insts.remove(a)

        # the whole instance again: a fresh kvd pool
        b = start(store, sdir, "sesb")
        insts.append(b)
        st, t2c, lp2c, _, reused_c, _ = complete(b, turn2, 24)
        check(st == 200 and reused_c == 0, "after the restart, without the "
              "session: nothing mapped (%d rows)" % reused_c)
        b.stop()
        insts.remove(b)
        b = start(store, sdir, "sesc")
        insts.append(b)
        st, t2r, lp2r, _, reused_r, j = complete(
            b, turn2, 24, session={"load": "conv-1"})
        if not check(st == 200, "the second turn after the restart with "
                     "the session loaded: %s" % st):
            print(j)
        check(reused_r >= n1 // PAGE_ROWS * PAGE_ROWS and
              reused_r % PAGE_ROWS == 0,
              "it mapped %d saved rows (at least the first turn's prompt "
              "pages, %d)" % (reused_r, n1 // PAGE_ROWS * PAGE_ROWS))
        check(t2r == t2 and lp2r == lp2, "resumed greedy text and "
              "log-probabilities equal the uninterrupted run's bit for bit")
        # kvd alone restarted (SIGTERM: its pool and cache are gone),
        # computed goes on: the session loads into the new pool
        b.procs["kvd"].send_signal(signal.SIGTERM)
        b.procs["kvd"].wait(15)
        b.start_daemon("kvd")
        st, t2k, lp2k, _, reused_k, j = complete(
            b, turn2, 24, session={"load": "conv-1"})
        check(st == 200 and reused_k == reused_r and t2k == t2 and
              lp2k == lp2, "after kvd alone restarted: the session's %d "
              "rows mapped, greedy text and log-probabilities equal the "
              "uninterrupted run's (%s)" % (reused_k, st))
        # computed alone restarted (SIGKILL: a crash) under the same
        # running expertd and kvd: the session loads, the continuation is
        # the uninterrupted one
        b.restart_computed()
        st, t2m, lp2m, _, reused_m, j = complete(
            b, turn2, 24, session={"load": "conv-1"})
        check(st == 200 and reused_m == reused_r and t2m == t2 and
              lp2m == lp2, "after computed alone restarted (SIGKILL): %d "
              "rows mapped, greedy text and log-probabilities equal the "
              "uninterrupted run's (%s)" % (reused_m, st))
        st, j = request(b, "POST", "/v1/sessions/conv-1/load")
        check(st == 200 and j.get("rows") == rows,
              "POST /v1/sessions/conv-1/load: %s %s" % (st, j))

        # the CLI on the running instance (computed's control socket)
        def cli(*args):
            r = subprocess.run([STRATA, "session"] + list(args) +
                               ["--instance", b.name, "--run-dir",
                                b.run_dir], capture_output=True, text=True,
                               timeout=60)
            return r.returncode, r.stdout + r.stderr
        rc, out = cli("save", "cli-1", "--prompt", turn2)
        want = n2 // PAGE_ROWS * PAGE_ROWS
        check(rc == 0 and "session 'cli-1' saved: %d rows" % want in out,
              "strata session save: the cached pages of a prompt the "
              "instance computed (%d rows): %s" % (want, out.strip()))
        st, j = request(b, "POST", "/v1/sessions/http-1", {"prompt": turn2})
        check(st == 200 and j.get("rows") == want,
              "POST /v1/sessions/http-1 with the prompt saves its %d "
              "cached rows: %s %s" % (want, st, j))
        st, j = request(b, "DELETE", "/v1/sessions/http-1")
        check(st == 200, "DELETE /v1/sessions/http-1: %s" % st)
        rc, out = cli("ls", "--json")
        ids = [e["id"] for e in json.loads(out)["data"]] if rc == 0 else []
        check(ids == ["cli-1", "conv-1"], "strata session ls: %s" % ids)
        rc, out = cli("rm", "cli-1")
        rc2, out2 = cli("load", "cli-1")
        check(rc == 0 and rc2 == 1 and "does not exist" in out2,
              "strata session rm, then load: %s" % out2.strip())

        # a corrupted copy: refused, nothing used
        data = bytearray(open(os.path.join(sdir, "conv-1.kvs"), "rb").read())
        data[-5] ^= 0x10
        open(os.path.join(sdir, "bad.kvs"), "wb").write(bytes(data))
        refused(b, "bad", "checksum mismatch")
        st, j = request(b, "POST", "/v1/completions",
                        {"prompt": "x", "max_tokens": 1,
                         "session": {"save": "../x"}})
        check(st == 400 and "session.save" in json_msg(j),
              "a name with a path refused: %s %s" % (st, json_msg(j)))
        st, j = request(b, "DELETE", "/v1/sessions/bad")
        check(st == 200 and j.get("deleted") is True, "DELETE: %s" % j)
        refused(b, "bad", "does not exist", 404)
        # saving a conversation nothing ran: 404 saying what to do
        st, j = request(b, "POST", "/v1/sessions/never",
                        {"prompt": text[2000:2400]})
        check(st == 404 and "run a completion of exactly this prompt" in
              json_msg(j) and '"session": {"save": "never"}' in json_msg(j),
              "saving a conversation never run: 404 with what to do "
              "(%s %s)" % (st, json_msg(j)))
        b.stop()
        insts.remove(b)

        # another model name, KV dtype, page size: refused by name
        for tag, args, says in (
                ("sesm", ["--model-name", "other"],
                 "is of model 'kjv'; this instance serves 'other'"),
                ("sesd", ["--kv-dtype", "bf16"],
                 "KV dtype F32; this instance uses BF16"),
                ("sesp", ["--page-rows", "8"],
                 "page size of 16 rows; this instance uses 8")):
            c = start(store, sdir, tag, args)
            insts.append(c)
            refused(c, "conv-1", says)
            c.stop()
            insts.remove(c)
        # strata up --kv-session-dir: kvd keeps them there
        name, rd = "sesu%d" % os.getpid(), os.path.join(tmp, "run-up")
        r = subprocess.run([STRATA, "up", "--store", store, "--instance",
                            name, "--run-dir", rd, "--kv-session-dir", sdir,
                            "--no-supervise"], capture_output=True,
                           text=True, timeout=120)
        if check(r.returncode == 0, "strata up --kv-session-dir: %d"
                 % r.returncode):
            r2 = subprocess.run([STRATA, "session", "ls", "--json",
                                 "--instance", name, "--run-dir", rd],
                                capture_output=True, text=True, timeout=60)
            check(r2.returncode == 0 and '"conv-1"' in r2.stdout,
                  "strata session ls on it lists conv-1: %s"
                  % (r2.stdout + r2.stderr).strip())
        else:
            print(r.stdout + r.stderr)
        subprocess.run([STRATA, "down", "--instance", name, "--run-dir",
                        rd], capture_output=True, timeout=60)

        for rev in ("v4", "v41"):
            test_dsv(rev, tmp, insts)
    finally:
        for i in insts:
            i.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


def test_dsv(rev, tmp, insts):
    """DeepSeek-V4 / V4.1: the session holds the full pages of the prompt
    and the generated tokens (every stream: compressed, indexer, window
    and compressor-input rows); a second turn whose prompt carries the
    first turn's answer maps them; resumed after computed alone and after
    the whole instance restarted, and computed cold after kvd alone
    restarted (nothing mapped), it equals the uninterrupted run bit for
    bit."""
    model = os.path.join(SHARED, "fixtures", "models",
                         "tiny-deepseek-" + rev)
    if not os.path.isdir(model):
        print("skip: %s: fixture %s not found (needs ../shared)"
              % (rev, model))
        return
    with open(os.path.join(model, "reference.json")) as f:
        case = {c["name"]: c for c in json.load(f)["cases"]}["p5_code"]
    sdir = os.path.join(tmp, "sessions-" + rev)
    store = convert(model, os.path.join(tmp, "store-" + rev),
                    experts="mxfp4")
    name, n_gen = rev + "-conv", 8
    a = start(store, sdir, rev + "sa")
    insts.append(a)
    st, t1, _, n1, _, j = complete(a, case["text"], n_gen,
                                   session={"save": name})
    if not check(st == 200, "%s: the first turn, saved: %s" % (rev, st)):
        print(j)
        return
    # every token fed: the prompt and the generated ones but the last
    rows = (n1 + n_gen - 1) // PAGE_ROWS * PAGE_ROWS
    st, ls = request(a, "GET", "/v1/sessions")
    ent = [e for e in ls.get("data", []) if e["id"] == name] \
        if st == 200 else []
    check(len(ent) == 1 and ent[0]["rows"] == rows and
          rows > n1 // PAGE_ROWS * PAGE_ROWS,
          "%s: the session holds %d rows, the full pages of %d prompt and "
          "%d generated tokens (the prompt's alone: %d): %s"
          % (rev, rows, n1, n_gen - 1, n1 // PAGE_ROWS * PAGE_ROWS, ent))
    print("figures: %s session: %s rows, %d bytes"
          % (rev, ent[0]["rows"] if ent else "?",
             os.path.getsize(os.path.join(sdir, name + ".kvs"))))
    turn2 = case["text"] + t1 + \
        "\n\n# merge_sorted([1, 3], [2]) == [1, 2, 3]\n"
    st, t2, lp2, _, reused_a, _ = complete(a, turn2, 16)
    check(st == 200 and reused_a == rows,
          "%s: the second turn (the first one's answer in its prompt) "
          "mapped %d rows: the prompt's and the answer's full pages, %d"
          % (rev, reused_a, rows))
    a.restart_computed()
    st, t2m, lp2m, _, reused_m, _ = complete(a, turn2, 16,
                                             session={"load": name})
    check(st == 200 and reused_m >= rows and t2m == t2 and lp2m == lp2,
          "%s: after computed alone restarted (SIGKILL): %d rows mapped, "
          "greedy text and log-probabilities equal the uninterrupted "
          "run's (%s)" % (rev, reused_m, st))
    a.stop()
    insts.remove(a)
    b = start(store, sdir, rev + "sb")
    insts.append(b)
    st, t2r, lp2r, _, reused_b, j = complete(b, turn2, 16,
                                             session={"load": name})
    check(st == 200 and reused_b == rows,
          "%s: after the restart the session gave %d rows (expected %d)"
          % (rev, reused_b, rows))
    check(t2r == t2 and lp2r == lp2, "%s: resumed greedy text and "
          "log-probabilities equal the uninterrupted run's bit for bit"
          % rev)
    # kvd alone restarted: an empty pool, nothing mapped; the cold
    # computation gives the same text and log-probabilities
    b.procs["kvd"].send_signal(signal.SIGTERM)
    b.procs["kvd"].wait(15)
    b.start_daemon("kvd")
    st, t2c, lp2c, _, reused_c, _ = complete(b, turn2, 16)
    check(st == 200 and reused_c == 0 and t2c == t2 and lp2c == lp2,
          "%s: computed cold after kvd alone restarted (%d rows mapped): "
          "the same greedy text and log-probabilities" % (rev, reused_c))
    b.stop()
    insts.remove(b)


def json_msg(j):
    return j.get("error", {}).get("message", "") if isinstance(j, dict) \
        else str(j)


if __name__ == "__main__":
    sys.exit(main())
