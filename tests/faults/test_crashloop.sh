#!/bin/sh
# The supervisor's crash-loop limit and its hand-over with `strata
# restart` (issue 20, section 1):
#  - up --restart-limit 1: kvd killed once is restarted; killed again
#    within 10 s of that start it is not (status: gave-up, /metrics
#    strata_daemon_gave_up{daemon="kvd"} 1, the log says crash loop);
#  - `strata restart kvd` then starts it and the supervisor takes it over:
#    killed once more it is restarted again (and counted);
#  - `strata restart computed` under the supervisor: one new computed, not
#    two (the supervisor adopts the one restart started); the supervisor
#    records the stop as "strata-restart", not as an exit-0 crash, and
#    status words a daemon in that state as being restarted by strata
#    restart (it used to say "0 restarts, restarting, last exit exit-0").
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
TMP=$(mktemp -d /tmp/strata-crashloop-XXXXXX)
inst="cl_$$"
run="$TMP/run"
fail=0
trap '"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE
"$STRATA" convert --model "$FIXTURES/tiny-mixtral" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
port=$(free_port)
"$STRATA" up --store "$TMP/store" --instance "$inst" --run-dir "$run" --host-budget 50% \
	--http-port "$port" --restart-limit 1 >"$TMP/up.out" 2>&1 ||
	{ echo "FAIL: strata up"; cat "$TMP/up.out"; exit 1; }
st() { "$STRATA" status --instance "$inst" --run-dir "$run" 2>&1 | grep "^  $1 "; }
# waits (up to 5 s) until daemon $1's status line matches $2
wait_st() {
	for i in $(seq 100); do
		st "$1" | grep -q -- "$2" && return 0
		sleep 0.05
	done
	return 1
}
p=$(cat "$run/kvd.pid")
kill -9 "$p"
wait_st kvd "running.*1 restart, running" || { echo "FAIL: kvd not restarted: $(st kvd)"; fail=1; }
p=$(cat "$run/kvd.pid")
kill -9 "$p"
wait_st kvd "not running.*gave-up" || { echo "FAIL: kvd restarted past the limit: $(st kvd)"; fail=1; }
sleep 0.5
st kvd | grep -q "not running" || { echo "FAIL: kvd came back past the limit"; fail=1; }
grep -q "crash loop" "$run/supervisor.log" || { echo "FAIL: no crash loop in the log"; fail=1; }
curl -s "http://127.0.0.1:$port/metrics" | grep -q '^strata_daemon_gave_up{daemon="kvd"} 1$' ||
	{ echo "FAIL: /metrics does not say the supervisor gave kvd up"; fail=1; }

"$STRATA" restart kvd --instance "$inst" --run-dir "$run" >"$TMP/r.out" 2>&1 ||
	{ echo "FAIL: strata restart kvd"; cat "$TMP/r.out"; fail=1; }
wait_st kvd "running" || { echo "FAIL: kvd after strata restart: $(st kvd)"; fail=1; }
sleep 11 # past the quick-death window: the next death is a fresh one
p=$(cat "$run/kvd.pid")
kill -9 "$p"
wait_st kvd "running.*2 restarts, running" ||
	{ echo "FAIL: the restarted kvd is not supervised: $(st kvd)"; fail=1; }

old=$(cat "$run/computed.pid")
"$STRATA" restart computed --instance "$inst" --run-dir "$run" >"$TMP/r.out" 2>&1 ||
	{ echo "FAIL: strata restart computed"; cat "$TMP/r.out"; fail=1; }
new=$(cat "$run/computed.pid")
sleep 1
n=$(pgrep -f -- "^computed .*--instance $inst " | wc -l)
[ "$n" = 1 ] && [ "$new" != "$old" ] && [ "$(cat "$run/computed.pid")" = "$new" ] ||
	{ echo "FAIL: after strata restart computed: $n computed, pid $old -> $new -> $(cat "$run/computed.pid")"; fail=1; }
grep -q "^computed $new 0 running strata-restart$" "$run/supervisor.state" ||
	{ echo "FAIL: the supervisor did not record a deliberate restart:"; cat "$run/supervisor.state"; fail=1; }
st computed | grep -q "exit-0" && { echo "FAIL: status after strata restart: $(st computed)"; fail=1; }
# the moment between the stop and the adoption, as the supervisor writes
# it: status's words for it (a run dir with only that state file)
mkdir "$TMP/fake"
printf 'expertd 0 0 running -\nkvd 0 2 running signal-9\ncomputed 0 0 restarting strata-restart\n' \
	>"$TMP/fake/supervisor.state"
"$STRATA" status --instance "fake_$$" --run-dir "$TMP/fake" >"$TMP/fake.out" 2>&1
grep -q "^  computed  not running; being restarted by strata restart (0 restarts after a crash)$" "$TMP/fake.out" &&
	grep -q "^  kvd       not running; 2 restarts, running, last exit signal-9$" "$TMP/fake.out" ||
	{ echo "FAIL: status of a daemon strata restart is restarting:"; cat "$TMP/fake.out"; fail=1; }
[ $fail = 0 ] && echo "ok: crash-loop limit, restart hand-over"
exit $fail
