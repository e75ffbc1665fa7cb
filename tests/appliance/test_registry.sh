#!/bin/sh
# Operators' habits (issue 20, section 3): an instance is found by name
# whatever its run directory.
#  - `strata up --config FILE` whose run_dir is not the default one:
#    `strata status --instance NAME` and `strata ps` find it (URL, model,
#    pids), and `strata down --instance NAME` stops all of it (it used to
#    say "not running", exit 0 and leave three daemons running);
#  - `strata run --instance NAME` uses it there (the registry), starting
#    nothing and making no run directory in the default place; a start
#    that fails (no registry entry: a second set of daemons for a served
#    instance) removes the run directory it made;
#  - started with STRATA_IOQ=off: status's io line says "priorities off",
#    /metrics has strata_io_ordered 0;
#  - `strata up --instance OTHER --run-dir <this instance's run dir>`
#    fails naming this instance as the holder of the folder (it used to
#    say "instance 'OTHER' is already running");
#  - kill -9 of the supervisor: status and ps say "supervisor dead" (not
#    "listening on", not "running") and what to run; down still stops it.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
MODEL="$FIXTURES/tiny-mixtral"
TMP=$(mktemp -d /tmp/strata-registry-XXXXXX)
export STRATA_REGISTRY_DIR="$TMP/registry"
inst="reg_$$"
run="$TMP/elsewhere/run"
fail=0
trap '"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE

"$STRATA" convert --model "$MODEL" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
port=$(free_port)
cat >"$TMP/inst.conf" <<CONF
[instance]
name = $inst
run_dir = $run
[model]
store = $TMP/store
[experts]
host_budget = 50%
[serve]
http_port = $port
model_name = tinymix
CONF
STRATA_IOQ=off "$STRATA" up --config "$TMP/inst.conf" >"$TMP/up.out" 2>&1 ||
	{ echo "FAIL: strata up --config"; cat "$TMP/up.out"; exit 1; }
pids="$(cat "$run/supervisor.pid" "$run/expertd.pid" "$run/kvd.pid" "$run/computed.pid")"

"$STRATA" status --instance "$inst" >"$TMP/status" 2>&1 ||
	{ echo "FAIL: status --instance does not find the instance"; cat "$TMP/status"; fail=1; }
grep -q "run dir $run" "$TMP/status" && grep -q "listening on http://127.0.0.1:$port" "$TMP/status" ||
	{ echo "FAIL: status does not show the run dir and URL"; cat "$TMP/status"; fail=1; }
# STRATA_IOQ=off (the daemons' environment): the io line says so
grep -q "^io  *priorities off (STRATA_IOQ=off: counted, not ordered); demand .*(wait: total over the class's I/Os)$" "$TMP/status" ||
	{ echo "FAIL: status does not say the I/O priorities are off"; cat "$TMP/status"; fail=1; }
/usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
	"http://127.0.0.1:$port/metrics" >"$TMP/metrics" 2>&1
grep -q "^strata_io_ordered 0$" "$TMP/metrics" && grep -q "^strata_io_bytes_total{class=\"demand\"} " "$TMP/metrics" ||
	{ echo "FAIL: /metrics lacks strata_io_ordered 0 or the io series"; grep "strata_io\|rror" "$TMP/metrics"; fail=1; }
"$STRATA" ps >"$TMP/ps" 2>&1 || { echo "FAIL: strata ps"; fail=1; }
line=$(grep "^$inst " "$TMP/ps")
case "$line" in
*running*tinymix*"http://127.0.0.1:$port"*supervisor*expertd*kvd*computed*) ;;
*) echo "FAIL: strata ps: '$line'"; cat "$TMP/ps"; fail=1 ;;
esac

other="other_$$"
"$STRATA" up --instance "$other" --run-dir "$run" --store "$TMP/store" \
	--http-port "$(free_port)" >"$TMP/up2.out" 2>&1 &&
	{ echo "FAIL: up of $other in $inst's run dir succeeded"; fail=1; }
grep -q "run dir $run is held by instance '$inst'" "$TMP/up2.out" &&
	! grep -q "'$other' is already running" "$TMP/up2.out" ||
	{ echo "FAIL: up in another instance's run dir does not name it"; cat "$TMP/up2.out"; fail=1; }
STRATA_RUN_DIR="$TMP/default-run" "$STRATA" run --instance "$inst" \
	--max-tokens 2 --quiet >/dev/null 2>"$TMP/run.err" ||
	{ echo "FAIL: strata run --instance $inst"; cat "$TMP/run.err"; fail=1; }
grep -q "using running instance '$inst'" "$TMP/run.err" ||
	{ echo "FAIL: strata run did not use the running instance"; cat "$TMP/run.err"; fail=1; }
[ -e "$TMP/default-run" ] &&
	{ echo "FAIL: strata run --instance made $TMP/default-run"; fail=1; }
STRATA_REGISTRY_DIR="$TMP/no-registry" STRATA_RUN_DIR="$TMP/fail-run" \
	"$STRATA" run --instance "$inst" --store "$TMP/store" --max-tokens 2 \
	--quiet >/dev/null 2>"$TMP/run2.err" &&
	{ echo "FAIL: a second set of daemons for $inst started"; fail=1; }
grep -q "another expertd is serving" "$TMP/run2.err" ||
	{ echo "FAIL: the failed start does not say why"; cat "$TMP/run2.err"; fail=1; }
[ -e "$TMP/fail-run" ] &&
	{ echo "FAIL: the failed strata run left $TMP/fail-run behind"; ls "$TMP/fail-run"; fail=1; }

svpid=$(cat "$run/supervisor.pid")
kill -9 "$svpid"
i=0
while alive "$svpid" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
"$STRATA" status --instance "$inst" >"$TMP/status2" 2>&1
grep -q "supervisor dead (pid $svpid)" "$TMP/status2" &&
	grep -q "strata down --instance $inst && strata up" "$TMP/status2" &&
	grep -q "not answering on http://127.0.0.1:$port" "$TMP/status2" ||
	{ echo "FAIL: status after kill -9 of the supervisor"; cat "$TMP/status2"; fail=1; }
grep -q "listening on" "$TMP/status2" &&
	{ echo "FAIL: status says listening with the supervisor dead"; fail=1; }
"$STRATA" ps >"$TMP/ps2" 2>&1
grep -q "^$inst  *sv-dead " "$TMP/ps2" &&
	grep -q "^$inst: supervisor dead (pid $svpid)" "$TMP/ps2" ||
	{ echo "FAIL: ps after kill -9 of the supervisor"; cat "$TMP/ps2"; fail=1; }

"$STRATA" down --instance "$inst" >"$TMP/down" 2>&1 ||
	{ echo "FAIL: down --instance"; cat "$TMP/down"; fail=1; }
grep -q "not running" "$TMP/down" && { echo "FAIL: down says not running"; cat "$TMP/down"; fail=1; }
sleep 0.2
for p in $pids; do
	alive "$p" && { echo "FAIL: process $p still runs after down --instance"; fail=1; }
done
"$STRATA" ps | grep -q "^$inst " && { echo "FAIL: ps still lists the instance"; fail=1; }
[ $fail = 0 ] && echo "ok: status, ps, run and down find an instance by name in another run dir; a dead supervisor is said"
exit $fail
