#!/bin/sh
# Chaos under `strata up` (issue 20): N kill -9s of each daemon (expertd,
# kvd, computed, in a random order) while greedy completions run over the
# HTTP API, with nothing typed in between:
#  - every request ends with the reference text (the same tokens as before
#    any kill) or a clear, retryable error (HTTP 503 with an OpenAI error
#    object: computed_restarting, expertd_down, ...); never a dropped
#    connection or other text;
#  - the supervisor brings the killed daemon back by itself: a new pid and
#    /health 200 again (computed PINGs all three) (the time is printed; asserted under
#    RECOVER_S seconds), and strata status and /metrics count exactly the
#    kills as restarts;
#  - `strata down` leaves no process (supervisor, any daemon pid seen) and
#    no /dev/shm/strata.<inst>.* segment.
# Usage: test_chaos.sh N [RESTART_LIMIT [RECOVER_S]] (a daemon killed
# again and again within 10 s of its start is restarted after a growing
# back-off, up to 8 s: long runs give a RECOVER_S above that).  STRATA_FAULT_SEED=S replays the
# order and the kill points.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
N=${1:-2}
LIMIT=${2:-5}
RECOVER_S=${3:-5}
MODEL="$FIXTURES/tiny-mixtral"
command -v curl >/dev/null || { echo "SKIP: curl not installed"; exit 77; }
seed=${STRATA_FAULT_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
echo "chaos: $N kills per daemon, seed $seed (STRATA_FAULT_SEED=$seed replays it)"
TMP=$(mktemp -d /tmp/strata-chaos-XXXXXX)
inst="chaos_$$"
run="$TMP/run"
fail=0
cleanup() {
	"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP PIPE

now_ms() { date +%s%3N; }

"$STRATA" convert --model "$MODEL" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
port=$(free_port)
"$STRATA" up --store "$TMP/store" --instance "$inst" --run-dir "$run" \
	--host-budget 50% --http-port "$port" --restart-limit "$LIMIT" \
	>"$TMP/up.out" 2>&1 || { echo "FAIL: strata up"; cat "$TMP/up.out"; exit 1; }
grep -q "listening on http://127.0.0.1:$port" "$TMP/up.out" ||
	{ echo "FAIL: up does not say where it listens"; cat "$TMP/up.out"; fail=1; }
sv=$(cat "$run/supervisor.pid")
seen="$sv"

# one greedy completion; prints "ok TEXT", "http CODE BODY" or "drop WHY"
cat >"$TMP/client.py" <<'PY'
import http.client, json, sys
port, out = int(sys.argv[1]), sys.argv[2]
body = json.dumps({"prompt": "And God said", "max_tokens": 160,
                   "temperature": 0})
try:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", body,
              {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    if r.status == 200:
        res = "ok " + json.loads(data)["choices"][0]["text"]
    else:
        res = "http %d %s" % (r.status, data.strip())
except Exception as e:
    res = "drop %r" % (e,)
open(out, "w").write(res)
PY
/usr/bin/python3 "$TMP/client.py" "$port" "$TMP/ref"
case "$(cat "$TMP/ref")" in
ok*) ;;
*) echo "FAIL: reference request: $(cat "$TMP/ref")"; exit 1 ;;
esac

# the kill order and points, from the seed
/usr/bin/python3 -c '
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(seed)
order = ["expertd", "kvd", "computed"] * n
r.shuffle(order)
for d in order:
    print(d, r.randint(20, 250))' "$N" "$seed" >"$TMP/plan"

n_ok=0 n_err=0 max_tier=0 max_cw=0 cycle=0
while read -r d delay_ms; do
	cycle=$((cycle + 1))
	pid=$(cat "$run/$d.pid" 2>/dev/null || echo 0)
	[ "$pid" -gt 0 ] || { echo "FAIL: cycle $cycle: no pid file for $d"; fail=1; break; }
	seen="$seen $pid"
	/usr/bin/python3 "$TMP/client.py" "$port" "$TMP/c1" & c1=$!
	/usr/bin/python3 "$TMP/client.py" "$port" "$TMP/c2" & c2=$!
	sleep "$(echo "$delay_ms" | awk '{ printf "%.3f", $1 / 1000 }')"
	kill -9 "$pid"
	t0=$(now_ms)
	# back by itself: a new pid that answers, and /health 200
	back=0
	while [ $(( $(now_ms) - t0 )) -lt $((RECOVER_S * 1000)) ]; do
		p=$(cat "$run/$d.pid" 2>/dev/null || echo 0)
		if [ "$p" != "$pid" ] && [ "$p" != 0 ] && alive "$p" &&
		   [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
			back=1
			break
		fi
		sleep 0.02
	done
	t=$(( $(now_ms) - t0 ))
	if [ $back = 0 ]; then
		echo "FAIL: cycle $cycle: $d not back within $RECOVER_S s"
		tail -5 "$run/supervisor.log"; tail -5 "$run/$d.log"; fail=1; break
	fi
	if [ "$d" = computed ]; then
		[ $t -gt $max_cw ] && max_cw=$t
	else
		[ $t -gt $max_tier ] && max_tier=$t
	fi
	seen="$seen $(cat "$run/$d.pid")"
	wait $c1 $c2
	for f in c1 c2; do
		res=$(cat "$TMP/$f")
		case "$res" in
		"$(cat "$TMP/ref")") n_ok=$((n_ok + 1)) ;;
		"http 503 "*'"code":"computed_restarting"'*|"http 503 "*'"code":"expertd_down"'*|\
		"http 503 "*'"code":"kvd_down"'*|"http 503 "*'"code":"tiers_down"'*)
			n_err=$((n_err + 1)) ;;
		*) echo "FAIL: cycle $cycle (kill -9 $d after ${delay_ms} ms): $res"; fail=1 ;;
		esac
	done
	[ $fail = 0 ] || break
done <"$TMP/plan"
echo "chaos: $cycle kills; $n_ok requests gave the reference tokens, $n_err a retryable 503; back after at most ${max_tier} ms (expertd, kvd), ${max_cw} ms (computed)"

# every kill counted as a restart, in status and in /metrics.  The
# supervisor records a restart when its start command returns, which can be
# a moment after the new daemon answers (what "back" above waited for): give
# it up to 10 s to settle before asserting.
want=$(awk '{ n[$1]++ } END { for (d in n) print d, n[d] }' "$TMP/plan")
settle=0
while [ $settle -lt 500 ]; do
	"$STRATA" status --instance "$inst" --run-dir "$run" >"$TMP/status" 2>&1 ||
		break
	settled=1
	while read -r d k; do
		grep -q "^  $d .* $k restarts\?, running," "$TMP/status" || settled=0
	done <<EOF2
$want
EOF2
	[ $settled = 1 ] && break
	settle=$((settle + 1))
	sleep 0.02
done
"$STRATA" status --instance "$inst" --run-dir "$run" >"$TMP/status" 2>&1 ||
	{ echo "FAIL: status after the kills"; cat "$TMP/status"; fail=1; }
curl -s "http://127.0.0.1:$port/metrics" >"$TMP/metrics"
for d in expertd kvd computed; do
	k=$(grep -c "^$d " "$TMP/plan")
	[ $fail = 0 ] || break
	grep -q "^  $d .* $k restarts\?, running, last exit signal-9" "$TMP/status" ||
		{ echo "FAIL: status does not count $k restarts of $d"; cat "$TMP/status"; fail=1; }
	grep -q "^strata_daemon_restarts_total{daemon=\"$d\"} $k\$" "$TMP/metrics" ||
		{ echo "FAIL: /metrics does not count $k restarts of $d"; grep restarts "$TMP/metrics"; fail=1; }
done
grep -c 'died (signal-9); restarting' "$run/supervisor.log" | grep -q "^$cycle\$" ||
	{ echo "FAIL: the supervisor's log does not record $cycle deaths"; cat "$run/supervisor.log"; fail=1; }

# down: supervisor first, nothing left
"$STRATA" down --instance "$inst" --run-dir "$run" >"$TMP/down" 2>&1 ||
	{ echo "FAIL: strata down"; cat "$TMP/down"; fail=1; }
for p in $seen; do
	alive "$p" && { echo "FAIL: process $p still runs after down"; fail=1; }
done
n=$(ls /dev/shm | grep -c "^strata\.$inst\." || true)
[ "$n" = 0 ] || { echo "FAIL: $n segment(s) left in /dev/shm"; fail=1; }
[ $fail = 0 ] && echo "ok: chaos, $cycle kills, all recovered"
exit $fail
