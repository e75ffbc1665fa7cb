#!/bin/sh
# `strata up --kv-restore-ahead on|off` (issue 24 item 1) reaches computed:
#  - `strata up --help` lists and explains it; a bad value is refused
#    (exit 2) naming the option, before any daemon starts, and the message
#    (up's and computed's) lists the words accepted (st_parse_bool);
#  - `--kv-restore-ahead off` with a spill file: computed runs with
#    "--kv-restore-ahead off" (its /proc cmdline and computed.args, kept
#    for `strata restart`), and generates;
#  - the config key kv.restore_ahead = no gives computed "off" (computed
#    takes the same words); not given, computed gets no flag (its default on).
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
need_fixture tiny-mixtral
MODEL="$FIXTURES/tiny-mixtral"
TMP=$(mktemp -d /tmp/strata-rahead-XXXXXX)
I="rah$$"
R="$TMP/run"
fail=0
trap '"$STRATA" down --instance "$I" --run-dir "$R" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM HUP PIPE

"$STRATA" up --help 2>&1 | grep -q -- "--kv-restore-ahead on|off" ||
	{ echo "FAIL: strata up --help does not list --kv-restore-ahead"; fail=1; }
"$STRATA" up --help 2>&1 | grep -q -- "--kv-restore-ahead on|off (default on): " ||
	{ echo "FAIL: strata up --help does not explain --kv-restore-ahead"; fail=1; }
# the refusal lists what is accepted (st_parse_bool's words), in up and
# in computed alike
"$STRATA" up --model "$MODEL" --instance "$I" --run-dir "$R" \
	--kv-restore-ahead ON >/dev/null 2>"$TMP/e0"
rc=$?
[ $rc -eq 2 ] && grep -q "'ON' must be on or off (also true/false, yes/no, 1/0)" "$TMP/e0" ||
	{ echo "FAIL: strata up --kv-restore-ahead ON: rc $rc"; cat "$TMP/e0"; fail=1; }
"$STRATA_BUILD_DIR/computed/computed" --kv-restore-ahead ON >/dev/null 2>"$TMP/e0c"
rc=$?
[ $rc -ne 0 ] && grep -q "'ON': must be on or off (also true/false, yes/no, 1/0)" "$TMP/e0c" ||
	{ echo "FAIL: computed --kv-restore-ahead ON: rc $rc"; cat "$TMP/e0c"; fail=1; }
"$STRATA" up --model "$MODEL" --instance "$I" --run-dir "$R" \
	--kv-restore-ahead sometimes >/dev/null 2>"$TMP/e1"
rc=$?
[ $rc -eq 2 ] && grep -q "restore" "$TMP/e1" ||
	{ echo "FAIL: --kv-restore-ahead sometimes: rc $rc"; cat "$TMP/e1"; fail=1; }
[ -e "$R/computed.pid" ] && { echo "FAIL: a daemon started despite a bad value"; fail=1; }

"$STRATA" convert --model "$MODEL" --out "$TMP/store" >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }

# flag_of FILE: the value after --kv-restore-ahead in a NUL-separated argv
flag_of() { tr '\0' '\n' <"$1" | grep -A1 -x -- "--kv-restore-ahead" | tail -1; }

"$STRATA" up --store "$TMP/store" --instance "$I" --run-dir "$R" \
	--kv-spill-budget 4MiB --kv-restore-ahead off >"$TMP/up.log" 2>&1 ||
	{ echo "FAIL: strata up --kv-restore-ahead off"; tail -5 "$TMP/up.log"; exit 1; }
pid=$(cat "$R/computed.pid")
[ "$(flag_of "/proc/$pid/cmdline")" = off ] ||
	{ echo "FAIL: computed (pid $pid) does not run with --kv-restore-ahead off:"; tr '\0' ' ' <"/proc/$pid/cmdline"; echo; fail=1; }
[ "$(flag_of "$R/computed.args")" = off ] ||
	{ echo "FAIL: computed.args lacks --kv-restore-ahead off"; fail=1; }
"$STRATA" run --instance "$I" --run-dir "$R" --max-tokens 4 --quiet \
	>/dev/null 2>"$TMP/run.err" ||
	{ echo "FAIL: a generation on the instance"; tail -5 "$TMP/run.err"; fail=1; }
"$STRATA" down --instance "$I" --run-dir "$R" >/dev/null 2>&1

cat >"$TMP/inst.conf" <<CONF
[model]
store = $TMP/store
[kv]
spill_budget = 4MiB
restore_ahead = no
CONF
"$STRATA" up --config "$TMP/inst.conf" --instance "$I" --run-dir "$R" \
	>"$TMP/up2.log" 2>&1 ||
	{ echo "FAIL: strata up --config with restore_ahead = no"; tail -5 "$TMP/up2.log"; exit 1; }
[ "$(flag_of "/proc/$(cat "$R/computed.pid")/cmdline")" = off ] ||
	{ echo "FAIL: kv.restore_ahead = no did not give computed --kv-restore-ahead off"; fail=1; }
"$STRATA" down --instance "$I" --run-dir "$R" >/dev/null 2>&1

"$STRATA" up --store "$TMP/store" --instance "$I" --run-dir "$R" \
	>"$TMP/up3.log" 2>&1 ||
	{ echo "FAIL: strata up"; tail -5 "$TMP/up3.log"; exit 1; }
tr '\0' '\n' <"/proc/$(cat "$R/computed.pid")/cmdline" | grep -qx -- "--kv-restore-ahead" &&
	{ echo "FAIL: computed got --kv-restore-ahead though none was asked"; fail=1; }
[ $fail -eq 0 ] && echo "--kv-restore-ahead: listed, checked, passed to computed by the flag and the config"
exit $fail
