#!/bin/sh
# The launcher end to end on a private instance (kjv-moe store):
#  - `strata up --config FILE` with --numa 0 from the file: three daemons
#    answer, the run directory is 0700 with one log per daemon, each log
#    says where its daemon was placed, and `strata status` reports every
#    resident page of both segments on node 0 (move_pages);
#  - expert-tier flags of up (--evict, --admit, --stats-half-life) reach
#    expertd as given;
#  - `strata restart kvd|expertd|computed`: the daemon gets a new pid, the
#    other two keep theirs, all three answer again;
#  - the HTTP model id: the store's name with --store, the checkpoint
#    directory's name with --model, --model-name's when given;
#  - `strata down` leaves nothing behind: no /dev/shm/strata.<inst>.*
#    segment, no socket, pid or args file in the run dir, no process.
set -u
# what a daemon touches in production: no malloc perturbation (meson sets
# MALLOC_PERTURB_, which writes every allocation and so makes it resident)
unset MALLOC_PERTURB_
STRATA="$STRATA_BUILD_DIR/cli/strata"
SHARED="${STRATA_SHARED_DIR:-../shared}"
MODEL="$SHARED/fixtures/models/kjv-moe"
if [ ! -d "$MODEL" ]; then
	if [ -n "${CI:-}" ] && [ "${CI:-}" != "false" ]; then
		echo "FAIL: fixture $MODEL missing"; exit 1
	fi
	echo "SKIP: $MODEL not found (needs ../shared)"; exit 77
fi
TMP=$(mktemp -d /tmp/strata-updown-XXXXXX)
inst="ud$$"
RUN="$TMP/run"
fail=0
cleanup() {
	"$STRATA" down --instance "$inst" --run-dir "$RUN" >/dev/null 2>&1
	"$STRATA" down --instance "${inst}m" --run-dir "$TMP/runm" >/dev/null 2>&1
	rm -rf "$TMP"
}
trap cleanup EXIT
# a test killed (time-out, ^C) still stops its daemons
trap 'exit 1' INT TERM HUP PIPE

pid_of() { cat "$RUN/$1.pid" 2>/dev/null || echo 0; }
# alive PID: runs and is not a zombie (where init does not reap the
# daemons `strata up` left behind, a stopped one stays a zombie)
alive() { [ -r "/proc/$1/stat" ] && ! sed 's/.*) //' "/proc/$1/stat" | grep -q '^[ZX]'; }
# the placement lines are info messages
export STRATA_LOG=info

# a port for the HTTP API of this instance (free now, very likely still
# free a moment later)
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$TMP/inst.conf" <<CONF
# test instance
[instance]
name = $inst
run_dir = $RUN
numa = 0
[model]
path = $MODEL
store = $TMP/store
[experts]
host_budget = 50%
loader_threads = 1
# the old name of prefetch_depth, still read
prefetch_distance = 1
hot_experts = 2
[kv]
budget = 64MiB
page_rows = 16
[compute]
threads = 1
[serve]
http_port = $port
max_running = 4
chat_template = none
CONF

"$STRATA" topo >"$TMP/topo" 2>&1 || { echo "FAIL: strata topo"; cat "$TMP/topo"; fail=1; }
grep -q '^node 0: ' "$TMP/topo" || { echo "FAIL: strata topo lists no node 0"; cat "$TMP/topo"; fail=1; }
grep -q '^instance placement: --numa [0-9]' "$TMP/topo" ||
	{ echo "FAIL: strata topo names no node to use"; fail=1; }

# while another start holds the run directory, strata up starts nothing
if command -v flock >/dev/null; then
	mkdir -m 700 -p "$RUN"
	flock "$RUN/up.lock" "$STRATA" up --config "$TMP/inst.conf" >"$TMP/up3.out" 2>&1 &&
		{ echo "FAIL: strata up ran while another start held the run dir"; fail=1; }
	grep -q "being started by another" "$TMP/up3.out" ||
		{ echo "FAIL: concurrent up: no 'being started'"; cat "$TMP/up3.out"; fail=1; }
	ls "$RUN"/*.pid >/dev/null 2>&1 && { echo "FAIL: a refused up started daemons"; fail=1; }
fi
"$STRATA" up --config "$TMP/inst.conf" --evict lru --admit precision \
	--stats-half-life 100 >"$TMP/up.out" 2>"$TMP/up.err" || {
	echo "FAIL: strata up"; cat "$TMP/up.err"; exit 1; }
mode=$(stat -c %a "$RUN")
[ "$mode" = "700" ] || { echo "FAIL: run dir mode $mode, not 700"; fail=1; }
for d in expertd kvd computed; do
	[ -s "$RUN/$d.log" ] || { echo "FAIL: no log $RUN/$d.log"; fail=1; }
	grep -q "NUMA placement: node 0" "$RUN/$d.log" ||
		{ echo "FAIL: $d.log does not report node 0"; cat "$RUN/$d.log"; fail=1; }
	[ -s "$RUN/$d.args" ] || { echo "FAIL: no $d.args"; fail=1; }
done
grep -q -- "--threads" "$RUN/computed.args" ||
	{ echo "FAIL: compute.threads not passed to computed"; fail=1; }
grep -q -- "64MiB" "$RUN/kvd.args" ||
	{ echo "FAIL: kv.budget not passed to kvd"; fail=1; }
# the tier keys of the file reach the daemons intact (they once pointed
# into the freed config: strata up crashed or passed garbage)
tr '\0' ' ' <"$RUN/computed.args" | grep -q -- "--prefetch-depth 1 " ||
	{ echo "FAIL: experts.prefetch_distance not passed to computed"; fail=1; }
tr '\0' ' ' <"$RUN/expertd.args" | grep -q -- "--hot-experts 2 " ||
	{ echo "FAIL: experts.hot_experts not passed to expertd"; fail=1; }
# expert-tier flags of up reach expertd as given (their getopt codes once
# collided with the flag table's: --evict set serve.max_queued, --admit
# crashed strata up)
for a in "--evict lru " "--admit precision " "--stats-half-life 100 "; do
	tr '\0' ' ' <"$RUN/expertd.args" | grep -q -- "$a" ||
		{ echo "FAIL: up's '$a' not passed to expertd: $(tr '\0' ' ' <"$RUN/expertd.args")"; fail=1; }
done

# the [serve] keys reach computed, and its HTTP API answers
# (computed serves a private port behind the supervisor's HTTP front,
# which owns the configured one)
grep -q "^listening on http://127.0.0.1:$port\$" "$TMP/up.out" ||
	{ echo "FAIL: up does not print where it listens"; cat "$TMP/up.out"; fail=1; }
tr '\0' ' ' <"$RUN/computed.args" | grep -q -- "--http-port [0-9]* --http-bind 127.0.0.1 .*--max-running 4 .*--chat-template none" ||
	{ echo "FAIL: [serve] keys not passed to computed: $(tr '\0' ' ' <"$RUN/computed.args")"; fail=1; }
# the model id: a given --store serves under the store's name ...
curl -s "http://127.0.0.1:$port/v1/models" | grep -q '"id": *"store"' ||
	{ echo "FAIL: /v1/models does not list the store's name 'store'"; fail=1; }
code=$(curl -s -o "$TMP/health" -w '%{http_code}' "http://127.0.0.1:$port/health")
[ "$code" = 200 ] && grep -q '"ok"' "$TMP/health" ||
	{ echo "FAIL: /health on port $port from the config: $code $(cat "$TMP/health")"; fail=1; }

# a second up of the running instance fails without touching its daemons
pids0="$(pid_of expertd) $(pid_of kvd) $(pid_of computed)"
"$STRATA" up --config "$TMP/inst.conf" >"$TMP/up2.out" 2>&1 &&
	{ echo "FAIL: a second strata up succeeded"; fail=1; }
grep -q "already running" "$TMP/up2.out" ||
	{ echo "FAIL: second up: no 'already running'"; cat "$TMP/up2.out"; fail=1; }
[ "$(pid_of expertd) $(pid_of kvd) $(pid_of computed)" = "$pids0" ] ||
	{ echo "FAIL: a refused strata up changed the daemons"; fail=1; }
for p in $pids0; do
	alive "$p" || { echo "FAIL: a refused strata up stopped pid $p"; fail=1; }
done

"$STRATA" status --instance "$inst" --run-dir "$RUN" >"$TMP/status" 2>&1 || {
	echo "FAIL: status says not all running"; cat "$TMP/status"; fail=1; }
cat "$TMP/status"
for seg in experts kv; do
	line=$(grep "segment $seg " "$TMP/status")
	case "$line" in
	*"node0 "*) ;;
	*) echo "FAIL: segment $seg not reported on node 0: $line"; fail=1 ;;
	esac
	case "$line" in
	*node[1-9]*) echo "FAIL: segment $seg has pages off node 0: $line"; fail=1 ;;
	esac
done

for d in kvd expertd computed; do
	before_e=$(pid_of expertd); before_k=$(pid_of kvd); before_c=$(pid_of computed)
	old=$(pid_of $d)
	"$STRATA" restart "$d" --instance "$inst" --run-dir "$RUN" >"$TMP/r.out" 2>&1 || {
		echo "FAIL: restart $d"; cat "$TMP/r.out"; tail -5 "$RUN/$d.log"; fail=1; continue; }
	new=$(pid_of $d)
	[ "$new" != "$old" ] && [ "$new" != 0 ] ||
		{ echo "FAIL: $d pid $old -> $new"; fail=1; }
	for o in expertd kvd computed; do
		[ "$o" = "$d" ] && continue
		eval b=\$before_$(echo $o | cut -c1)
		[ "$(pid_of $o)" = "$b" ] ||
			{ echo "FAIL: restarting $d changed $o's pid"; fail=1; }
	done
	"$STRATA" status --instance "$inst" --run-dir "$RUN" >/dev/null 2>&1 || {
		echo "FAIL: not all daemons answer after restarting $d"; fail=1; }
	alive "$old" && { echo "FAIL: old $d ($old) still runs"; fail=1; }
done
grep -c "NUMA placement" "$RUN/kvd.log" | grep -q '^2$' ||
	{ echo "FAIL: kvd.log not appended to on restart"; fail=1; }

# computed started with an API key is not restarted without it (the key
# lives in the environment only; restarting without it opened the API)
STRATA_API_KEY=k1 "$STRATA" restart computed --instance "$inst" --run-dir "$RUN" \
	>"$TMP/r.out" 2>&1 || { echo "FAIL: restart computed with a key"; cat "$TMP/r.out"; fail=1; }
old=$(pid_of computed)
if env -u STRATA_API_KEY "$STRATA" restart computed --instance "$inst" --run-dir "$RUN" \
	>"$TMP/r.out" 2>&1; then
	echo "FAIL: computed restarted without its API key"; fail=1
else
	grep -q 'API key' "$TMP/r.out" || { echo "FAIL: refusal does not name the API key"; cat "$TMP/r.out"; fail=1; }
	[ "$(pid_of computed)" = "$old" ] || { echo "FAIL: computed stopped by a refused restart"; fail=1; }
fi

pids="$(pid_of expertd) $(pid_of kvd) $(pid_of computed)"
"$STRATA" down --instance "$inst" --run-dir "$RUN" >/dev/null 2>&1 ||
	{ echo "FAIL: strata down"; fail=1; }
n=$(ls /dev/shm | grep -c "^strata\.$inst\." || true)
[ "$n" = 0 ] || { echo "FAIL: $n segment(s) left in /dev/shm"; ls /dev/shm | grep "$inst"; fail=1; }
for f in "$RUN"/*.ctl "$RUN"/*.evt "$RUN"/*.pid "$RUN"/*.args "$RUN"/*.apikey; do
	[ -e "$f" ] && { echo "FAIL: left behind: $f"; fail=1; }
done
for p in $pids; do
	alive "$p" && { echo "FAIL: process $p still runs"; fail=1; }
done

# ... --model DIR serves under the directory's name (not the cached store's
# kjv-moe-<hash>-mxfp4, which the README's client example cannot know), and
# --model-name wins
for want in kjv-moe kjv; do
	extra=""; [ "$want" = kjv ] && extra="--model-name kjv"
	# shellcheck disable=SC2086
	STRATA_CACHE_DIR="$TMP/cache" "$STRATA" up --model "$MODEL" \
		--instance "${inst}m" --run-dir "$TMP/runm" --http-port "$port" \
		$extra >"$TMP/upm.out" 2>&1 ||
		{ echo "FAIL: strata up --model $extra"; cat "$TMP/upm.out"; fail=1; }
	id=$(curl -s "http://127.0.0.1:$port/v1/models" |
		/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
	[ "$id" = "$want" ] || { echo "FAIL: up --model $extra serves '$id', not '$want'"; fail=1; }
	"$STRATA" down --instance "${inst}m" --run-dir "$TMP/runm" >/dev/null 2>&1
done
[ $fail = 0 ] && echo "up, status, restart x3, down, model ids: ok"
exit $fail
