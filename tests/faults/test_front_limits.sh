#!/bin/sh
# strata up's HTTP options reach the server that enforces them (issue 20,
# sections 2 and 4, under the supervisor's HTTP front):
#  - computed runs behind the front with --http-max-client-conns 0 (every
#    client is 127.0.0.1 to it) and gets --http-idle-timeout and
#    --metrics-auth as given to strata up;
#  - the front limits connections per client address: with
#    --http-max-client-conns 3, a 4th idle connection is closed at once,
#    and once one of the 3 closes a new client is answered;
#  - an idle connection through the front is closed after
#    --http-idle-timeout, not held open;
#  - /metrics wants the key under --metrics-auth.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
TMP=$(mktemp -d /tmp/strata-front-XXXXXX)
inst="fl_$$"
run="$TMP/run"
fail=0
trap '"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE
"$STRATA" convert --model "$FIXTURES/tiny-mixtral" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
port=$(free_port)
export STRATA_API_KEY=front-key
"$STRATA" up --store "$TMP/store" --instance "$inst" --run-dir "$run" \
	--http-port "$port" --http-max-client-conns 3 --http-idle-timeout 3 \
	--metrics-auth >"$TMP/up.out" 2>&1 ||
	{ echo "FAIL: strata up"; cat "$TMP/up.out"; exit 1; }
cmdline=$(tr '\0' ' ' <"/proc/$(cat "$run/computed.pid")/cmdline")
echo "computed: $cmdline"
case "$cmdline" in *"--http-max-client-conns 0 "*) ;;
*) echo "FAIL: computed behind the front keeps a per-client limit"; fail=1;; esac
case "$cmdline" in *"--http-idle-timeout 3 "*) ;;
*) echo "FAIL: --http-idle-timeout not passed to computed"; fail=1;; esac
case "$cmdline" in *"--metrics-auth"*) ;;
*) echo "FAIL: --metrics-auth not passed to computed"; fail=1;; esac
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/metrics")
[ "$code" = 401 ] || { echo "FAIL: /metrics without the key under --metrics-auth: $code"; fail=1; }
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $STRATA_API_KEY" \
	"http://127.0.0.1:$port/metrics")
[ "$code" = 200 ] || { echo "FAIL: /metrics with the key: $code"; fail=1; }

/usr/bin/python3 - "$port" "$STRATA_API_KEY" <<'PY' || fail=1
import socket, sys, time
port, key = int(sys.argv[1]), sys.argv[2]
bad = 0

def closed_within(s, secs):
    """True when the peer closes s (EOF or reset) within secs."""
    s.settimeout(secs)
    try:
        return s.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True

def models(s):
    s.settimeout(10)
    s.sendall(("GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s"
               "\r\nConnection: close\r\n\r\n" % key).encode())
    out = b""
    while True:
        d = s.recv(65536)
        if not d:
            return out.decode("utf-8", "replace")
        out += d

held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
time.sleep(0.3)
extra = socket.create_connection(("127.0.0.1", port))
if not closed_within(extra, 1.5):
    print("FAIL: a 4th connection from one address was not closed")
    bad = 1
else:
    print("ok: 4th connection closed at once")
held.pop().close()
time.sleep(0.3)
s = socket.create_connection(("127.0.0.1", port))
r = models(s)
if not r.startswith("HTTP/1.1 200"):
    print("FAIL: after one closed, a new client got %r" % r[:80])
    bad = 1
else:
    print("ok: a new client answered once one closed")
# the held ones are idle: closed after --http-idle-timeout 3 s
t0 = time.monotonic()
if not closed_within(held[0], 10):
    print("FAIL: an idle connection through the front still open after 10 s")
    bad = 1
else:
    dt = time.monotonic() - t0
    print("ok: idle connection closed after %.1f s" % dt)
sys.exit(bad)
PY
[ $fail = 0 ] && echo "PASS"
exit $fail
