#!/bin/sh
# Operators' habits (issue 20, section 3): an instance is found by name
# whatever its run directory.
#  - `strata up --config FILE` whose run_dir is not the default one:
#    `strata status --instance NAME` and `strata ps` find it (URL, model,
#    pids), and `strata down --instance NAME` stops all of it (it used to
#    say "not running", exit 0 and leave three daemons running);
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
"$STRATA" up --config "$TMP/inst.conf" >"$TMP/up.out" 2>&1 ||
	{ echo "FAIL: strata up --config"; cat "$TMP/up.out"; exit 1; }
pids="$(cat "$run/supervisor.pid" "$run/expertd.pid" "$run/kvd.pid" "$run/computed.pid")"

"$STRATA" status --instance "$inst" >"$TMP/status" 2>&1 ||
	{ echo "FAIL: status --instance does not find the instance"; cat "$TMP/status"; fail=1; }
grep -q "run dir $run" "$TMP/status" && grep -q "listening on http://127.0.0.1:$port" "$TMP/status" ||
	{ echo "FAIL: status does not show the run dir and URL"; cat "$TMP/status"; fail=1; }
"$STRATA" ps >"$TMP/ps" 2>&1 || { echo "FAIL: strata ps"; fail=1; }
line=$(grep "^$inst " "$TMP/ps")
case "$line" in
*running*tinymix*"http://127.0.0.1:$port"*supervisor*expertd*kvd*computed*) ;;
*) echo "FAIL: strata ps: '$line'"; cat "$TMP/ps"; fail=1 ;;
esac

"$STRATA" down --instance "$inst" >"$TMP/down" 2>&1 ||
	{ echo "FAIL: down --instance"; cat "$TMP/down"; fail=1; }
grep -q "not running" "$TMP/down" && { echo "FAIL: down says not running"; cat "$TMP/down"; fail=1; }
sleep 0.2
for p in $pids; do
	alive "$p" && { echo "FAIL: process $p still runs after down --instance"; fail=1; }
done
"$STRATA" ps | grep -q "^$inst " && { echo "FAIL: ps still lists the instance"; fail=1; }
[ $fail = 0 ] && echo "ok: status, ps and down find an instance by name in another run dir"
exit $fail
