#!/bin/sh
# PITFALLS P17 (shared memory after SIGKILL) for a whole instance through
# the strata CLI, every segment owner at once:
#  - ten cycles: kill -9 the supervisor, expertd, kvd and computed
#    together (a crashed instance), `strata up` again: exactly one segment per pool, owned by
#    the new daemon (owner pid in the segment header = its pid file), epoch
#    bumped, and the instance serves the same greedy text as before;
#  - a segment whose owner is alive is never removed: `strata down` of the
#    same instance name from another run directory leaves the live
#    segments (same owner, same epoch) and the instance still serves;
#  - after a last kill -9 of everything, `strata down` removes every
#    segment, socket and pid file.
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
MODEL="${STRATA_SHARED_DIR:-../shared}/fixtures/models/tiny-mixtral"
if [ ! -d "$MODEL" ]; then
	echo "fixture $MODEL missing"
	[ "${CI:-}" = true ] && exit 1
	exit 77
fi
TMP=$(mktemp -d /tmp/strata-p17-XXXXXX)
inst="p17_$$"
run="$TMP/run"
fail=0
trap 'kill -9 $(cat "$run"/*.pid 2>/dev/null) 2>/dev/null; "$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too

# owner pid and epoch of /dev/shm/strata.<inst>.<kind> (st_shm_header:
# owner_pid at byte 96, epoch at 104)
hdr() {
	python3 -c 'import struct,sys
b=open(sys.argv[1],"rb").read(112)
print(struct.unpack_from("<i",b,96)[0], struct.unpack_from("<Q",b,104)[0])' "/dev/shm/strata.$inst.$1"
}
nseg() { ls /dev/shm 2>/dev/null | grep -c "^strata\.$inst\." || true; }
gen() {
	"$STRATA" run --instance "$inst" --run-dir "$run" --prompt "And God said" \
		--max-tokens 8 --ignore-eos --quiet 2>"$TMP/run.err"
}

"$STRATA" convert --model "$MODEL" --out "$TMP/store" --experts bf16 >/dev/null 2>&1 ||
	{ echo "FAIL: convert"; exit 1; }
up() {
	STRATA_LOG=info "$STRATA" up --store "$TMP/store" --instance "$inst" --run-dir "$run" \
		--host-budget 50% >/dev/null 2>"$TMP/up.err" ||
		{ echo "FAIL: strata up"; cat "$TMP/up.err"; exit 1; }
}
up
want=$(gen) || { echo "FAIL: strata run"; cat "$TMP/run.err"; exit 1; }
[ -n "$want" ] || { echo "FAIL: no text"; exit 1; }

for i in 1 2 3 4 5 6 7 8 9 10; do
	set -- $(hdr experts) $(hdr kv)
	es_epoch=$2 kv_epoch=$4
	# the supervisor too: the whole instance crashed
	kill -9 $(cat "$run/supervisor.pid" "$run/expertd.pid" "$run/kvd.pid" "$run/computed.pid")
	sleep 0.1
	# experts, kv and the I/O queue (st_ioq.h)
	[ "$(nseg)" = 3 ] || { echo "FAIL: cycle $i: $(nseg) segments after kill -9"; fail=1; }
	up
	[ "$(nseg)" = 3 ] || { echo "FAIL: cycle $i: $(nseg) segments after restart"; fail=1; }
	set -- $(hdr experts) $(hdr kv)
	[ "$1" = "$(cat "$run/expertd.pid")" ] && [ "$3" = "$(cat "$run/kvd.pid")" ] ||
		{ echo "FAIL: cycle $i: segment owners $1 $3 are not the new daemons"; fail=1; }
	[ "$2" -gt "$es_epoch" ] && [ "$4" -gt "$kv_epoch" ] ||
		{ echo "FAIL: cycle $i: epochs $es_epoch $kv_epoch -> $2 $4 not bumped"; fail=1; }
	# each daemon logs to its file in the run directory: the new ones
	# say they adopted the pools
	grep -q 'adopted pool:' "$run/expertd.log" &&
	grep -q 'adopted kv pool' "$run/kvd.log" &&
	grep -q 'ready: store' "$run/computed.log" ||
		{ echo "FAIL: cycle $i: the daemons' logs do not show the adoptions"; fail=1; }
	got=$(gen) || { echo "FAIL: cycle $i: strata run"; cat "$TMP/run.err"; fail=1; }
	[ "$got" = "$want" ] || { echo "FAIL: cycle $i: text '$got' vs '$want'"; fail=1; }
	[ $fail = 0 ] || break
done

# a live owner's segments survive a `strata down` that does not own them
before="$(hdr experts) $(hdr kv)"
"$STRATA" down --instance "$inst" --run-dir "$TMP/other-run" >/dev/null 2>&1
[ "$(nseg)" = 3 ] && [ "$(hdr experts) $(hdr kv)" = "$before" ] ||
	{ echo "FAIL: a live owner's segment was touched by another down"; fail=1; }
got=$(gen) && [ "$got" = "$want" ] || { echo "FAIL: instance broken after the foreign down"; fail=1; }

# kill -9 everything; `strata down` cleans up the dead instance
kill -9 $(cat "$run/supervisor.pid" "$run/expertd.pid" "$run/kvd.pid" "$run/computed.pid")
sleep 0.1
"$STRATA" down --instance "$inst" --run-dir "$run" >/dev/null 2>&1
[ "$(nseg)" = 0 ] || { echo "FAIL: $(nseg) segments after strata down"; fail=1; }
left=$(ls "$run" 2>/dev/null | grep -E '\.(ctl|evt|pid)$' || true)
[ -z "$left" ] || { echo "FAIL: left in the run directory: $left"; fail=1; }

[ $fail = 0 ] && echo "ok: 10 kill -9 cycles of the whole instance"
exit $fail
