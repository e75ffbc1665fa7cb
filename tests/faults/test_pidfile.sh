#!/bin/sh
# Failed pid-file writes (issue 20, section 4): a daemon that cannot write
# its pid file must not serve, since nothing could find it to stop it.
#  - <run_dir>/<daemon>.pid a link to /dev/full (every write: ENOSPC, as
#    on a full run-dir file system), for each daemon: `strata up` fails,
#    naming the pid file and the error, and leaves no process running;
#  - computed.pid a directory (unwritable, unreadable as a pid) under a
#    running instance: `strata restart computed` stops the old computed
#    (found through its socket), fails naming the pid file instead of
#    printing "pid 0", and `strata down` then leaves nothing running.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
MODEL="$FIXTURES/tiny-mixtral"
TMP=$(mktemp -d /tmp/strata-pidfile-XXXXXX)
inst="pidf_$$"
run="$TMP/run"
fail=0
trap '"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE
# pids of the instance's processes (their command lines name it)
procs() { pgrep -f -- "--instance $inst " || true; }

"$STRATA" convert --model "$MODEL" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
up() {
	"$STRATA" up --store "$TMP/store" --instance "$inst" --run-dir "$run" \
		--host-budget 50% >"$TMP/up.out" 2>&1
}

mkdir -m 700 -p "$run"
for d in expertd kvd computed; do
	ln -sf /dev/full "$run/$d.pid"
	if up; then
		echo "FAIL: strata up succeeded with $d.pid on a full file system"
		cat "$TMP/up.out"; fail=1
	else
		grep -q "$d.pid" "$TMP/up.out" && grep -q "No space left" "$TMP/up.out" ||
			{ echo "FAIL: up's error does not name $d.pid and ENOSPC"; cat "$TMP/up.out"; fail=1; }
	fi
	left=$(procs)
	[ -z "$left" ] || { echo "FAIL: processes left after the failed up ($d): $left"; fail=1; }
	"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1
	rm -f "$run/$d.pid"
done

up || { echo "FAIL: strata up"; cat "$TMP/up.out"; exit 1; }
old=$(cat "$run/computed.pid")
rm -f "$run/computed.pid"
mkdir "$run/computed.pid"
if "$STRATA" restart computed --instance "$inst" --run-dir "$run" >"$TMP/r.out" 2>&1; then
	echo "FAIL: restart computed succeeded without a pid file"; cat "$TMP/r.out"; fail=1
else
	grep -q "computed.pid" "$TMP/r.out" ||
		{ echo "FAIL: restart's error does not name computed.pid"; cat "$TMP/r.out"; fail=1; }
fi
grep -q "pid 0" "$TMP/r.out" && { echo "FAIL: restart printed pid 0"; fail=1; }
alive "$old" && { echo "FAIL: the old computed $old still runs"; fail=1; }
rmdir "$run/computed.pid"
"$STRATA" down --instance "$inst" --run-dir "$run" >"$TMP/down.out" 2>&1 ||
	{ echo "FAIL: strata down"; cat "$TMP/down.out"; fail=1; }
sleep 0.2
left=$(procs)
[ -z "$left" ] || { echo "FAIL: processes left after down: $left"; fail=1; }
[ $fail = 0 ] && echo "ok: failed pid-file writes refused by every daemon; restart and down find computed"
exit $fail
