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
  - refused by name with a 400 naming what differs (once): another served
    model name, another KV dtype (bf16), another page size (8); a
    corrupted copy of the file (checksum: nothing used); a name with a
    path in it;
  - a save that cannot be done (too few rows) leaves the completion whole,
    streamed or not, the failed save reported beside it ("session"); a
    save is confirmed there, saving over a name says it replaced it (CLI
    and POST); usage.prompt_tokens_details.cached_tokens equals the rows
    the prefix cache gave (the metric);
  - ls (GET and CLI) lists a cut file and a symbolic link as corrupt
    (WHY), a load of the link is a 500 (not followed);
  - kvd's session directory a regular file: saves fail naming it (the
    completion still 200), POST save, load and list are 500 server_error
    naming it; strata up refuses such a --kv-session-dir.

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
from serve_harness import (FAILS, Instance, check, convert, metrics,  # noqa
                           request, stream)

SRC = os.environ.get("STRATA_SOURCE_DIR",
                     os.path.join(os.path.dirname(__file__), "..", ".."))
KJV = os.path.join(SRC, "models", "kjv-moe")
STRATA = os.path.join(os.environ.get("STRATA_BUILD_DIR", "build"), "cli",
                      "strata")
SHARED = os.environ.get("STRATA_SHARED_DIR", "../shared")
REUSED = "strata_prefix_cache_rows_reused_total"
PAGE_ROWS = 16


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
    """A load refused with status, its message saying `says` once (a
    4xx an invalid_request_error on 'session', a 5xx a server_error)."""
    st, _, _, _, _, j = complete(inst, "And", 2, session={"load": name})
    err = j.get("error", {}) if isinstance(j, dict) else {}
    msg = err.get("message", str(j))
    kind = "server_error" if status >= 500 else "invalid_request_error"
    check(st == status and msg.count(says) == 1 and err.get("type") == kind,
          "load refused (%d %s): %s" % (st, err.get("type"), msg))


def cached(j):
    """usage.prompt_tokens_details.cached_tokens of a response (None when
    absent)."""
    return j.get("usage", {}).get("prompt_tokens_details",
                                  {}).get("cached_tokens")


def tiny_save(inst, sdir):
    """A save that cannot be done (3 or so ids fill no page) does not take
    the completion away: 200, text and finish_reason, the failed save
    beside it; streamed, the last token and the finish chunk (carrying
    the same outcome) come before [DONE], no error event."""
    body = {"prompt": "hi", "max_tokens": 2, "temperature": 0,
            "session": {"save": "tiny"}}
    st, j = request(inst, "POST", "/v1/completions", body)
    ch = j["choices"][0] if st == 200 else {}
    ses = j.get("session", {}) if st == 200 else {}
    check(st == 200 and ch.get("finish_reason") in ("length", "stop") and
          j["usage"]["completion_tokens"] >= 1 and
          ses.get("name") == "tiny" and ses.get("saved") is False and
          "fill no page" in ses.get("error", "") and
          not os.path.exists(os.path.join(sdir, "tiny.kvs")),
          "a save that cannot be done: the completion whole (%s, %r, %s), "
          "the save's outcome beside it: %s" % (st, ch.get("text"),
                                               ch.get("finish_reason"), ses))
    st, chunks = stream(inst, "/v1/completions", dict(body, stream=True))
    objs = [json.loads(c) for c in chunks if c != "[DONE]"]
    fin = [o for o in objs if o.get("choices") and
           o["choices"][0].get("finish_reason")]
    text = "".join(o["choices"][0]["text"] for o in objs
                   if o.get("choices"))
    check(st == 200 and chunks[-1:] == ["[DONE]"] and
          not any("error" in o for o in objs) and len(fin) == 1 and
          fin[0].get("session", {}).get("saved") is False and
          "fill no page" in fin[0]["session"].get("error", "") and
          text == ch.get("text"),
          "streamed: the whole text (%r), the finish chunk with the save's "
          "outcome, then [DONE]: %s" % (text, fin[-1:]))


def bad_dir(store, tmp, prompt):
    """kvd's --session-dir a regular file: the completion still comes back
    (its save reported failed, naming the directory); saves, loads and
    lists are 500 server_error naming it; strata up refuses such a
    --kv-session-dir at start."""
    path = os.path.join(tmp, "not-a-dir")
    open(path, "w").write("x")
    c = start(store, path, "sesf")
    try:
        st, _, _, _, _, j = complete(c, prompt, 2, session={"save": "s"})
        ses = j.get("session", {}) if st == 200 else {}
        check(st == 200 and ses.get("saved") is False and
              path in ses.get("error", "") and
              "not a directory" in ses.get("error", ""),
              "session dir a file: the completion (%s), its save failed "
              "naming the directory: %s" % (st, ses))
        st, j = request(c, "POST", "/v1/sessions/s", {"prompt": prompt})
        err = j.get("error", {}) if isinstance(j, dict) else {}
        check(st == 500 and err.get("type") == "server_error" and
              path in err.get("message", ""),
              "session dir a file: POST /v1/sessions/s: %s %s" % (st, err))
        st, j = request(c, "GET", "/v1/sessions")
        err = j.get("error", {}) if isinstance(j, dict) else {}
        check(st == 500 and path in err.get("message", ""),
              "session dir a file: GET /v1/sessions: %s %s" % (st, err))
        refused(c, "s", path, 500)
    finally:
        c.stop()
    r = subprocess.run([STRATA, "up", "--store", store, "--instance",
                        "sesx%d" % os.getpid(), "--run-dir",
                        os.path.join(tmp, "run-x"), "--kv-session-dir",
                        path, "--no-supervise"], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2 and "is not a directory" in r.stderr and
          path in r.stderr, "strata up --kv-session-dir FILE refused: %d %s"
          % (r.returncode, r.stderr.strip()))
    if r.returncode == 0:  # it came up: take it down again
        subprocess.run([STRATA, "down", "--instance", "sesx%d" % os.getpid(),
                        "--run-dir", os.path.join(tmp, "run-x")],
                       capture_output=True, timeout=60)


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
        rows = (n1 + 24 - 1) // PAGE_ROWS * PAGE_ROWS
        check(j.get("session") == {"name": "conv-1", "saved": True,
                                   "rows": rows, "replaced": False} and
              cached(j) == 0,
              "the save confirmed beside the completion: %s, cached_tokens "
              "%s" % (j.get("session"), j["usage"]))
        tiny_save(a, sdir)
        turn2 = prompt + t1 + more
        st, t2, lp2, n2, reused_a, j = complete(a, turn2, 24)
        check(st == 200 and n2 > n1 and reused_a > 0 and
              cached(j) ==
              reused_a, "the second turn on the same instance (%d prompt "
              "tokens, %d rows reused = usage's cached_tokens)"
              % (n2, reused_a))
        st, ls = request(a, "GET", "/v1/sessions")
        ent = [e for e in ls.get("data", []) if e["id"] == "conv-1"] \
            if st == 200 else []
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
        check(cached(j) ==
              reused_r, "usage.prompt_tokens_details.cached_tokens %s: the "
              "rows the loaded session gave (%d)" % (j["usage"], reused_r))
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
        check(rc == 0 and "session 'cli-1' saved: %d rows\n" % want == out,
              "strata session save: the cached pages of a prompt the "
              "instance computed (%d rows): %s" % (want, out.strip()))
        rc, out = cli("save", "cli-1", "--prompt", turn2)
        check(rc == 0 and "saved: %d rows (replaced the old session of %d "
              "rows)" % (want, want) in out,
              "strata session save again says it replaced: %s" % out.strip())
        st, j = request(b, "POST", "/v1/sessions/http-1", {"prompt": turn2})
        check(st == 200 and j.get("rows") == want and
              j.get("replaced") is False,
              "POST /v1/sessions/http-1 with the prompt saves its %d "
              "cached rows: %s %s" % (want, st, j))
        st, j = request(b, "POST", "/v1/sessions/http-1", {"prompt": turn2})
        check(st == 200 and j.get("replaced") is True and
              j.get("replaced_rows") == want,
              "POST /v1/sessions/http-1 again: replaced, %d old rows: %s"
              % (want, j))
        st, j = request(b, "DELETE", "/v1/sessions/http-1")
        check(st == 200, "DELETE /v1/sessions/http-1: %s" % st)
        rc, out = cli("ls", "--json")
        ids = [e["id"] for e in json.loads(out)["data"]] if rc == 0 else []
        check(ids == ["cli-1", "conv-1"], "strata session ls: %s" % ids)
        rc, out = cli("rm", "cli-1")
        rc2, out2 = cli("load", "cli-1")
        check(rc == 0 and rc2 == 1 and "does not exist" in out2,
              "strata session rm, then load: %s" % out2.strip())

        # ls checks each file: a cut one and a link (never followed) are
        # listed as what they are, not as sessions
        data = open(os.path.join(sdir, "conv-1.kvs"), "rb").read()
        open(os.path.join(sdir, "cut.kvs"), "wb").write(
            data[:len(data) // 2])
        os.symlink("/etc/passwd", os.path.join(sdir, "link.kvs"))
        st, ls = request(b, "GET", "/v1/sessions")
        ent = {e["id"]: e for e in ls.get("data", [])} if st == 200 else {}
        cut, lnk = ent.get("cut", {}), ent.get("link", {})
        check(cut.get("corrupt") == "size %d, header says %d"
              % (len(data) // 2, len(data)) and cut.get("rows") == 0 and
              "symbolic link" in lnk.get("corrupt", "") and
              lnk.get("rows") == 0 and "corrupt" not in ent.get("conv-1", {}),
              "GET /v1/sessions lists a cut file and a link as corrupt: "
              "%s %s" % (cut, lnk))
        rc, out = cli("ls")
        check(rc == 0 and "corrupt (size %d, header says %d)"
              % (len(data) // 2, len(data)) in out and
              "corrupt (a symbolic link" in out,
              "strata session ls shows them as corrupt (WHY): %s" % out)
        refused(b, "link", "symbolic link", 500)
        refused(b, "cut", "size %d, header says %d (corrupt file)"
                % (len(data) // 2, len(data)))
        os.remove(os.path.join(sdir, "cut.kvs"))
        os.remove(os.path.join(sdir, "link.kvs"))

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

        bad_dir(store, tmp, prompt)
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
