#!/bin/sh
# The remote KV tier's faults landing while requests are in flight (issue 23
# item 2: "kill it, pause it, fill it and corrupt values during
# generation").  tests/kvd/test_kv_remote.sh injects each fault between
# requests; here one running kjv-moe instance M (--kv-remote) answers
# several greedy requests at once while Redis is killed, paused (SIGSTOP,
# then SIGCONT), filled (maxmemory, noeviction), flushed or has every value
# corrupted at a seeded random moment.  Each round:
#  - a publisher instance P (the tier on, another run directory and kvd
#    pool: another node) answers the "hit" prompts first, so their shared
#    400-character prefixes are in Redis and not in M's local cache;
#  - M gets REQS requests started STAGGER ms apart (even ones share a
#    prefix P published: prefill looks the chain up and restores it; odd
#    ones have a new prefix: prefill misses, then publishes), so when the
#    fault lands after a seeded delay some are in prefill, some publishing
#    and some decoding;
#  - right after the fault two more requests start (one hit prompt, one
#    new): they meet the fault for certain, so kvd's error counter must
#    move (kill, pause, fill, corrupt; a flush is a plain miss);
#  - every request's greedy ids equal those of an instance without the
#    tier: the protocol has no other outcome (a remote failure is never a
#    request error, only a local recompute), so no request may fail;
#  - paused: the TTFT of every request of the round stays under
#    PAUSE_TTFT_MS more than the longest of the flush round, the same
#    requests with a working Redis measured in the same run (so a loaded
#    machine's queueing counts on both sides; --remote-kv-timeout 100 ms
#    bounds each Redis call and the first failure backs off 1 s, so kvd
#    never waits on a stopped Redis for long);
#  - after the round M answers a plain request at once (kvd responsive),
#    and within its back-off its tier looks up again with no new error;
#  - in all, M restored groups from Redis and published (/metrics), so the
#    faults met both paths.
# The fault moments come from a seed, printed; STRATA_FAULT_SEED=S replays
# a run.  An argument ROUNDS (default 1: each fault once) repeats them (the slow
# suite's soak).
# Skips (77) where redis-server is not installed.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
. "$STRATA_SOURCE_DIR/tests/kvd/redis_testlib.sh"
need_redis
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
PY=/usr/bin/python3
SEED=${STRATA_FAULT_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
ROUNDS=${1:-1}
REQS=6            # requests started before the fault
STAGGER=40        # ms between their starts
TOKENS=96         # each: ~145 prompt tokens, 96 decoded (context 256)
PAUSE_MS=1500     # how long a SIGSTOPped Redis stays stopped
# 10x --remote-kv-timeout: two timed-out calls and load; times the
# project's timeout scale (3 under the sanitizers, tests/meson.build); over
# the flush round's longest TTFT (base_ttft, the same run's queueing)
PAUSE_TTFT_MS=$((1000 * ${STRATA_TIMEOUT_SCALE:-1}))
base_ttft=0
TMP=$(mktemp -d /tmp/strata-kvinflight-XXXXXX)
I=ki$$
cleanup() {
	for n in ref pub m; do
		"$STRATA" down --instance "$I$n" --run-dir "$TMP/run-$n" \
			>/dev/null 2>&1
	done
	redis_stop
	rm -rf "$TMP"
}
trap cleanup EXIT
# meson's time limit (SIGTERM) or ^C: exit, so the instances go down too
trap 'exit 1' INT TERM
export STRATA_CACHE_DIR="$TMP/cache"
fail=0
echo "seed $SEED (STRATA_FAULT_SEED=$SEED replays it), $ROUNDS round(s) of flush, fill, corrupt, pause, kill"

redis_start "$TMP" || exit 1
URL=$REDIS_URL
# up NAME [options]: a running instance of kjv-moe in its own run directory
up() {
	n=$1; shift
	"$STRATA" up --model "$KJV" --store "$TMP/kjv" --experts bf16 \
		--instance "$I$n" --run-dir "$TMP/run-$n" "$@" \
		>"$TMP/up-$n.out" 2>&1 ||
		{ echo "FAIL: strata up ($n)"; cat "$TMP/up-$n.out"; exit 1; }
}
up ref
up pub --kv-remote "$URL"
MPORT=$(free_port)
up m --kv-remote "$URL" --http-port "$MPORT"

# prompt OFFSET SUFFIX-OFFSET: 400 characters of valid.txt (the shared
# prefix, about 110 tokens: 6 full page groups) and 100 of another place
prompt() {
	$PY -c 'import sys; t = open(sys.argv[1]).read(); a, b = int(sys.argv[2]), int(sys.argv[3]); print(t[a:a + 400] + t[b:b + 100])' \
		"$KJV/valid.txt" "$1" "$2"
}
# ask INSTANCE OUT PROMPT: one greedy request; its JSON summary in OUT
ask() {
	"$STRATA" run --instance "$I$1" --run-dir "$TMP/run-$1" \
		--prompt "$3" --max-tokens "$TOKENS" --ignore-eos --json \
		>"$2" 2>"$2.err"
	echo $? >"$2.rc"
}
jget() { # FILE EXPR (d: the JSON summary)
	$PY -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print($2)" "$1" 2>/dev/null
}
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }  # MS -> seconds
lookups() { # hits + misses
	curl -s "http://127.0.0.1:$MPORT/metrics" |
		sed -n 's/^strata_kv_remote_lookups_total{result="[a-z]*"} //p' |
		awk '{ n += $1 } END { print n + 0 }'
}
errors() {
	curl -s "http://127.0.0.1:$MPORT/metrics" |
		sed -n 's/^strata_kv_remote_errors_total //p'
}
# delays: one seeded random fault moment per round (ms after the first
# request started), within the span of the staggered starts
DELAYS=$($PY -c 'import random, sys; r = random.Random(int(sys.argv[1])); print(" ".join(str(r.randint(0, int(sys.argv[2]))) for _ in range(5 * int(sys.argv[3]))))' \
	"$SEED" $(( REQS * STAGGER )) "$ROUNDS")

round=0
set -- $DELAYS
for r in $(seq 1 "$ROUNDS"); do
for fault in flush fill corrupt pause kill; do
	round=$((round + 1)); delay=$1; shift
	D="$TMP/r$round"; mkdir -p "$D"
	# REQS + 2 prompts, each with its own 400-character prefix region
	# (new to M); even ones are published by P first
	base=$(( round * 6000 ))
	nreq=$((REQS + 2))
	for i in $(seq 0 $((nreq - 1))); do
		prompt $((base + i * 600)) $((200000 + round * 3000 + i * 300)) \
			>"$D/p$i"
	done
	for i in $(seq 0 $((nreq - 1))); do
		ask ref "$D/ref$i" "$(cat "$D/p$i")"
		if [ $((i % 2)) -eq 0 ]; then
			# P: the same prefix, another suffix
			ask pub "$D/pub$i" "$(prompt $((base + i * 600)) $((100000 + round * 3000 + i * 300)))"
		fi
	done
	e0=$(errors)
	# the fault, $delay ms after the first start, from a subshell while
	# the requests start; it notes how many were in flight then
	(
		sleep "$(secs "$delay")"
		case $fault in
		kill)  kill "$REDIS_PID" ;;
		pause) kill -STOP "$REDIS_PID" ;;
		fill)  used=$(rcli info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
		       rcli config set maxmemory-policy noeviction >/dev/null
		       rcli config set maxmemory $((used + 4096)) >/dev/null ;;
		flush) rcli flushall >/dev/null ;;
		corrupt) rcli eval "for _, k in ipairs(redis.call('keys', 'strata:kv:*')) do local n = redis.call('strlen', k); redis.call('setrange', k, n - 8, 'XXXXXXXX') end return 0" 0 >/dev/null ;;
		esac
		n=0
		for i in $(seq 0 $((REQS - 1))); do
			[ -e "$D/m$i.start" ] && [ ! -e "$D/m$i.rc" ] && n=$((n + 1))
		done
		echo $n >"$D/inflight"
	) &
	fpid=$!
	i=0
	pids=""
	while [ $i -lt $REQS ]; do
		touch "$D/m$i.start"
		ask m "$D/m$i" "$(cat "$D/p$i")" &
		pids="$pids $!"
		i=$((i + 1))
		[ $i -lt $REQS ] && sleep "$(secs "$STAGGER")"
	done
	wait $fpid
	[ "$fault" = kill ] && redis_stop  # reaps it
	# two requests that meet the fault for certain
	ask m "$D/m$REQS" "$(cat "$D/p$REQS")" &
	pids="$pids $!"
	ask m "$D/m$((REQS + 1))" "$(cat "$D/p$((REQS + 1))")" &
	pids="$pids $!"
	if [ "$fault" = pause ]; then
		sleep "$(secs "$PAUSE_MS")"
		kill -CONT "$REDIS_PID"
	fi
	# (not a bare wait: a restarted redis-server is a child too)
	wait $pids
	e1=$(errors)
	bad=0
	for i in $(seq 0 $((nreq - 1))); do
		if [ "$(cat "$D/m$i.rc")" != 0 ]; then
			echo "FAIL: $fault: request $i failed: $(cat "$D/m$i.err")"
			bad=1; continue
		fi
		if [ "$(jget "$D/m$i" "d['ids']")" != "$(jget "$D/ref$i" "d['ids']")" ]; then
			echo "FAIL: $fault: request $i: ids differ from the instance without the tier"
			bad=1
		fi
	done
	[ $bad -eq 0 ] && echo "ok: $fault at $delay ms ($(cat "$D/inflight") of the first $REQS requests in flight): all $nreq requests gave the reference ids"
	[ $bad -eq 0 ] || fail=1
	if [ "$fault" = flush ]; then
		echo "ok: flush: kvd errors $e0 -> $e1 (a miss is no error)"
	elif [ "${e1:-0}" -gt "${e0:-0}" ]; then
		echo "ok: $fault: kvd's remote error counter moved ($e0 -> $e1)"
	else
		echo "FAIL: $fault: kvd's remote error counter did not move ($e0 -> $e1)"
		fail=1
	fi
	t=0 # the round's longest TTFT
	for i in $(seq 0 $((nreq - 1))); do
		ti=$(jget "$D/m$i" "int(d['ttft_ms'])")
		[ "${ti:-999999}" -gt "$t" ] && t=${ti:-999999}
	done
	[ "$fault" = flush ] && base_ttft=$t
	if [ "$fault" = pause ]; then
		if [ "$t" -lt $((base_ttft + PAUSE_TTFT_MS)) ]; then
			echo "ok: pause: the longest TTFT of the round's $nreq requests $t ms < $PAUSE_TTFT_MS ms over the flush round's $base_ttft ms"
		else
			echo "FAIL: pause: the longest TTFT of the round's requests $t ms (bound: the flush round's $base_ttft ms + $PAUSE_TTFT_MS ms)"
			fail=1
		fi
	fi
	# back to a working Redis for the next round
	case $fault in
	kill) REDIS_PORT_WANT=$REDIS_PORT; redis_start "$TMP" || exit 1
	      REDIS_PORT_WANT=
	      # P's connection died with Redis: its next call fails and backs
	      # off 1 s; spend that now, so P publishes the next round's
	      # prefixes (kill comes last in a round of faults for the same
	      # reason)
	      if [ "$round" -lt $((5 * ROUNDS)) ]; then
		      ask pub "$D/prime" "$(prompt $((base + 5400)) 310000)"
		      sleep 1.1
	      fi ;;
	fill) rcli config set maxmemory 0 >/dev/null ;;
	esac
	rcli flushall >/dev/null
	# kvd responsive: it answers at once; then, after its back-off, its
	# tier works again (a lookup counted, no new error) before the next
	# round, whose faults must meet a live tier; each try a new prefix
	e2=$(errors); k=0; back=no
	while [ $k -lt 16 ]; do
		l0=$(lookups)
		ask m "$D/after$k" "$(prompt $((base + 5000 + k * 50)) 300000)"
		if [ "$(cat "$D/after$k.rc")" != 0 ]; then
			echo "FAIL: $fault: M did not answer after the fault"
			fail=1; break
		fi
		[ $k -eq 0 ] && echo "ok: $fault: M answers after the fault ($(jget "$D/after0" "d['ttft_ms']") ms TTFT)"
		if [ "$(lookups)" -gt "$l0" ] && [ "$(errors)" = "$e2" ]; then
			back=yes; break
		fi
		e2=$(errors); k=$((k + 1)); sleep 0.5
	done
	if [ $back = yes ]; then
		echo "ok: $fault: M's tier back after $k tries"
	else
		echo "FAIL: $fault: M's tier not back after the fault"; fail=1
	fi
done
done
# the paths the faults were meant to hit were taken: M restored groups from
# Redis (hits) and published (bytes out)
M=$(curl -s "http://127.0.0.1:$MPORT/metrics")
hits=$(echo "$M" | sed -n 's/^strata_kv_remote_lookups_total{result="hit"} //p')
out=$(echo "$M" | sed -n 's/^strata_kv_remote_bytes_total{dir="out"} //p')
if [ "${hits:-0}" -gt 0 ] && [ "${out:-0}" -gt 0 ]; then
	echo "ok: M restored $hits page groups from Redis and published $out bytes in all"
else
	echo "FAIL: M restored ${hits:-?} groups and published ${out:-?} bytes"; fail=1
fi
[ $fail -eq 0 ] && echo "all in-flight fault checks passed"
exit $fail
