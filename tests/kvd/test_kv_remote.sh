#!/bin/sh
# kvd's remote KV tier on a real redis-server (issue 23): failure is never
# wrong tokens.  Every run is a fresh strata instance of kjv-moe (greedy,
# reference mode) with its own run directory and kvd pool, so a prefix hit
# in a new instance can only come from Redis (two nodes, one cache).
#  - the greedy ids with the tier equal those without it; the first run
#    publishes (bytes out, one key per full page group), a second instance
#    restores every group (hits = rows reused / page_rows) and reads bytes;
#  - another KV dtype on the same Redis: other keys, no hit, no error;
#  - a valid value of another prefix copied under a key: rejected (key);
#  - corrupted value bytes, another value format under our key, a foreign
#    value: each rejected (error counter, a kvd log line), the same ids, and
#    the rejected key deleted, so the next publish replaces it (the run
#    after hits it, then meets the next corrupted value);
#  - a private prompt (--kv-private): nothing published;
#  - Redis flushed: misses, no error, same ids;
#  - a running instance (strata up): /metrics counts the hits and bytes;
#    the HTTP request field "kv_private": true publishes nothing;
#    Redis restarted under kvd's open connection: an error and the same ids,
#    then a reconnect after the back-off (a miss, published, no error);
#  - Redis full (maxmemory + noeviction): the publish is refused (error,
#    log line), same ids;
#  - Redis paused (SIGSTOP): the lookup times out within --remote-kv's
#    bound (error, log line), same ids, and the run is not held up for long;
#  - Redis killed: connect refused (error, log line), same ids.
# Skips (77) where redis-server is not installed.
set -u
. "$STRATA_SOURCE_DIR/tests/instance_env.sh"
. "$STRATA_SOURCE_DIR/tests/kvd/redis_testlib.sh"
need_redis
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/strata-kvremote-XXXXXX)
trap '"$STRATA" down --instance "kr$$m" --run-dir "$TMP/run-m" >/dev/null 2>&1; redis_stop; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
export STRATA_CACHE_DIR="$TMP/cache"
# about 150 tokens: 9 full pages of 16 rows, and room for 24 more tokens in
# kjv-moe's 256-token context
PROMPT=$(head -c 520 "$KJV/valid.txt")
fail=0
n=0

# run NAME [strata run options...]: a fresh instance; output in $TMP/NAME.*
run() {
	name=$1; shift
	"$STRATA" run --model "$KJV" --store "$TMP/kjv" --experts bf16 \
		--prompt "$PROMPT" --max-tokens 24 --ignore-eos --json \
		--instance "kr$$$name" --run-dir "$TMP/run-$name" "$@" \
		>"$TMP/$name.out" 2>"$TMP/$name.err"
	rc=$?
	if [ $rc -ne 0 ]; then
		echo "FAIL: strata run ($name) exited $rc"; cat "$TMP/$name.err"
		fail=1
	fi
}
# jget NAME EXPR: a field of run NAME's JSON summary (its last line), d =
# the summary; prints the Python value
jget() {
	$PY -c "import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]); print($2)" "$TMP/$1.out"
}
same_ids() { # NAME
	if [ "$(jget "$1" "d['ids']")" = "$IDS0" ]; then
		echo "ok: $1: the same greedy ids as without the tier"
	else
		echo "FAIL: $1: ids differ from the run without the tier"
		echo "  without: $IDS0"; echo "  $1: $(jget "$1" "d['ids']")"
		fail=1
	fi
}
check() { # NAME DESCRIPTION PYTHON-CONDITION
	if [ "$(jget "$1" "bool($3)")" = True ]; then
		echo "ok: $1: $2"
	else
		echo "FAIL: $1: $2 ($3; kv_remote: $(jget "$1" "d.get('kv_remote')"), rows reused $(jget "$1" "d['prefix_rows_reused']"))"
		fail=1
	fi
}
logged() { # NAME PATTERN
	if grep -q "$2" "$TMP/run-$1/kvd.log"; then
		echo "ok: $1: kvd logged '$2'"
	else
		echo "FAIL: $1: no '$2' in kvd's log"; cat "$TMP/run-$1/kvd.log"
		fail=1
	fi
}

# two other prompts of about the same length, for the running instance
PROMPT=$(tail -c +3001 "$KJV/valid.txt" | head -c 520)
run base2
IDS2=$(jget base2 "d['ids']")
PROMPT=$(tail -c +6001 "$KJV/valid.txt" | head -c 520)
run base3
IDS3=$(jget base3 "d['ids']")
PROMPT=$(head -c 520 "$KJV/valid.txt")
run base
IDS0=$(jget base "d['ids']")
NP=$(jget base "d['prompt_tokens']")
G=$(( (NP - 1) / 16 ))   # groups a later prompt can map (P10: last token)
echo "prompt: $NP tokens, $G full page groups to share"
[ "$G" -ge 4 ] || { echo "FAIL: prompt too short ($NP tokens)"; exit 1; }

redis_start "$TMP" || exit 1
URL=$REDIS_URL
run a --kv-remote "$URL"
same_ids a
check a "published (bytes out), nothing to restore" \
	"d['kv_remote']['bytes_out'] > 0 and d['kv_remote']['hits'] == 0 and d['kv_remote']['errors'] == 0"
KEYS=$(rcli --scan --pattern 'strata:kv:1:*' | wc -l)
if [ "$KEYS" -ge "$G" ]; then echo "ok: $KEYS keys in Redis"; else
	echo "FAIL: $KEYS keys in Redis, expected at least $G"; fail=1; fi

run b --kv-remote "$URL"
same_ids b
check b "every group restored from Redis" \
	"d['kv_remote']['hits'] == $G and d['prefix_rows_reused'] == $G * 16 and d['kv_remote']['bytes_in'] > 0 and d['kv_remote']['errors'] == 0"

# a valid value of another prefix under a key (owner/key check): copied
set -- $(rcli --scan --pattern 'strata:kv:1:*' | head -n 2)
rcli copy "$1" "$2" replace >/dev/null
run keyswap --kv-remote "$URL"
same_ids keyswap
check keyswap "another prefix's value rejected, the chain cut there" \
	"d['kv_remote']['errors'] == 1 and d['kv_remote']['hits'] < $G and d['prefix_rows_reused'] == 16 * d['kv_remote']['hits']"
logged keyswap "prefix key differs"

# another KV dtype (f16 rows: another model id and row size) on the same
# Redis: other keys, so no hit and nothing rejected; its own ids
run base16 --kv-dtype f16
run dtype16 --kv-dtype f16 --kv-remote "$URL"
if [ "$(jget dtype16 "d['ids']")" = "$(jget base16 "d['ids']")" ]; then
	echo "ok: dtype16: the same ids as f16 without the tier"
else echo "FAIL: dtype16: ids differ from f16 without the tier"; fail=1; fi
check dtype16 "f32 pages never mapped into an f16 pool" \
	"d['kv_remote']['hits'] == 0 and d['kv_remote']['errors'] == 0 and d['prefix_rows_reused'] == 0"

# corrupted bytes at the end of every value (page data: checksum)
for k in $(rcli --scan --pattern 'strata:kv:1:*'); do
	len=$(rcli strlen "$k")
	rcli setrange "$k" $((len - 8)) "XXXXXXXX" >/dev/null
done
run corrupt --kv-remote "$URL"
same_ids corrupt
check corrupt "the corrupted value rejected, counted as an error" \
	"d['kv_remote']['hits'] == 0 and d['kv_remote']['errors'] >= 1 and d['prefix_rows_reused'] == 0"
logged corrupt "rejected (checksum mismatch)"
run repaired --kv-remote "$URL"
same_ids repaired
# the rejected (first) value was deleted and published again; the second
# is still corrupted: one hit, then that one is rejected in turn
check repaired "the deleted key was published again: a hit, then the next bad value rejected" \
	"d['kv_remote']['hits'] == 1 and d['kv_remote']['errors'] == 1 and d['prefix_rows_reused'] == 16"

# another value format under our key (a future strata's format 2)
FIRST=$(rcli --scan --pattern 'strata:kv:1:*' | head -n 1)
for k in $(rcli --scan --pattern 'strata:kv:1:*'); do
	printf '\002' | rcli -x setrange "$k" 8 >/dev/null
done
run format --kv-remote "$URL"
same_ids format
check format "a value of another format rejected" \
	"d['kv_remote']['hits'] == 0 and d['kv_remote']['errors'] >= 1"
logged format "another value format"

# a foreign value (not strata's) under every key
for k in $(rcli --scan --pattern 'strata:kv:1:*'); do
	rcli set "$k" "not a KV page" >/dev/null
done
run foreign --kv-remote "$URL"
same_ids foreign
check foreign "a foreign value rejected" \
	"d['kv_remote']['hits'] == 0 and d['kv_remote']['errors'] >= 1"
logged foreign "not a strata KV value"

# a private prompt (--kv-private, KV_PUBLISH_F_PRIVATE): nothing published
rcli flushall >/dev/null
run private --kv-remote "$URL" --kv-private
same_ids private
check private "a private prompt's pages stay local" \
	"d['kv_remote']['bytes_out'] == 0 and d['kv_remote']['errors'] == 0"
KEYS=$(rcli --scan --pattern 'strata:kv:1:*' | wc -l)
if [ "$KEYS" -eq 0 ]; then echo "ok: private: no key in Redis"; else
	echo "FAIL: private: $KEYS keys in Redis"; fail=1; fi

# flushed: a plain miss
rcli flushall >/dev/null
run flushed --kv-remote "$URL"
same_ids flushed
check flushed "a miss, no error" \
	"d['kv_remote']['hits'] == 0 and d['kv_remote']['misses'] >= 1 and d['kv_remote']['errors'] == 0"

# a running instance (strata up): /metrics carries the tier's counters;
# Redis restarted under its open connection: the first call fails (an
# error, same ids), the next one after the back-off reconnects
PORT=$(free_port)
"$STRATA" up --model "$KJV" --store "$TMP/kjv" --experts bf16 \
	--instance "kr$$m" --run-dir "$TMP/run-m" --http-port "$PORT" \
	--kv-remote "$URL" >"$TMP/up.out" 2>&1 ||
	{ echo "FAIL: strata up --kv-remote"; cat "$TMP/up.out"; fail=1; }
ask() { # NAME: the running instance, $PROMPT
	"$STRATA" run --instance "kr$$m" --run-dir "$TMP/run-m" \
		--prompt "$PROMPT" --max-tokens 24 --ignore-eos --json \
		>"$TMP/$1.out" 2>"$TMP/$1.err" ||
		{ echo "FAIL: strata run ($1) on the running instance"
		  cat "$TMP/$1.err"; fail=1; }
}
ask served
same_ids served
check served "hits through a running instance" "d['kv_remote']['hits'] == $G"
M=$(curl -s "http://127.0.0.1:$PORT/metrics")
if echo "$M" | grep -q "^strata_kv_remote_lookups_total{result=\"hit\"} $G\$" &&
   echo "$M" | grep -q '^strata_kv_remote_bytes_total{dir="in"} [1-9]' &&
   echo "$M" | grep -q '^strata_kv_remote_errors_total 0$'; then
	echo "ok: /metrics: $G remote hits, bytes in, no error"
else
	echo "FAIL: /metrics lacks the remote tier's counters"
	echo "$M" | grep kv_remote; fail=1
fi
# the HTTP request field kv_private: its prompt publishes nothing, a plain
# one does (bytes out on /metrics)
out_bytes() {
	curl -s "http://127.0.0.1:$PORT/metrics" |
		sed -n 's/^strata_kv_remote_bytes_total{dir="out"} //p'
}
complete() { # TEXT-OFFSET PRIVATE(true|false)
	body=$($PY -c 'import json,sys; print(json.dumps({"prompt": open(sys.argv[1]).read()[int(sys.argv[2]):int(sys.argv[2]) + 520], "max_tokens": 2, "kv_private": sys.argv[3] == "true"}))' "$KJV/valid.txt" "$1" "$2")
	curl -s -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
		-d "$body" "http://127.0.0.1:$PORT/v1/completions"
}
o0=$(out_bytes)
c1=$(complete 9000 true)
o1=$(out_bytes)
c2=$(complete 12000 false)
o2=$(out_bytes)
if [ "$c1" = 200 ] && [ "$c2" = 200 ] && [ "$o1" = "$o0" ] &&
   [ "${o2:-0}" -gt "${o1:-0}" ]; then
	echo "ok: HTTP kv_private: nothing published ($o0 -> $o1 bytes out), a plain prompt published ($o2)"
else
	echo "FAIL: HTTP kv_private: status $c1/$c2, bytes out $o0 -> $o1 -> $o2"
	fail=1
fi

REDIS_PORT_WANT=$REDIS_PORT
redis_stop
redis_start "$TMP" || exit 1
REDIS_PORT_WANT=
PROMPT=$(tail -c +3001 "$KJV/valid.txt" | head -c 520)
ask restarted
if [ "$(jget restarted "d['ids']")" = "$IDS2" ]; then
	echo "ok: restarted: the same ids as without the tier"
else echo "FAIL: restarted: ids differ"; fail=1; fi
check restarted "the broken connection counted as an error" \
	"d['kv_remote']['errors'] >= 1 and d['kv_remote']['hits'] == 0"
logged m "connection lost\|remote KV tier 127.0.0.1"
sleep 1.2  # past the first back-off
PROMPT=$(tail -c +6001 "$KJV/valid.txt" | head -c 520)
ask reconnected
if [ "$(jget reconnected "d['ids']")" = "$IDS3" ]; then
	echo "ok: reconnected: the same ids as without the tier"
else echo "FAIL: reconnected: ids differ"; fail=1; fi
check reconnected "reconnected after the back-off: a miss, published, no new error" \
	"d['kv_remote']['errors'] == 0 and d['kv_remote']['misses'] >= 1 and d['kv_remote']['bytes_out'] > 0"
"$STRATA" down --instance "kr$$m" --run-dir "$TMP/run-m" >/dev/null 2>&1
PROMPT=$(head -c 520 "$KJV/valid.txt")

# full: maxmemory just above what Redis uses now, no eviction
rcli flushall >/dev/null
used=$(rcli info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
rcli config set maxmemory $((used + 16384)) >/dev/null
rcli config set maxmemory-policy noeviction >/dev/null
run full --kv-remote "$URL"
same_ids full
check full "the refused publish counted as an error" \
	"d['kv_remote']['errors'] >= 1 and d['kv_remote']['bytes_out'] == 0"
logged full "OOM"
rcli config set maxmemory 0 >/dev/null

# paused: every call times out after --remote-kv-timeout (100 ms)
kill -STOP "$REDIS_PID"
t0=$(date +%s%N)
run paused --kv-remote "$URL"
t1=$(date +%s%N)
kill -CONT "$REDIS_PID"
same_ids paused
check paused "the lookup timed out: an error, a local recompute" \
	"d['kv_remote']['errors'] >= 1 and d['kv_remote']['hits'] == 0 and d['ttft_ms'] < 5000"
logged paused "timed out"
echo "paused run: $(( (t1 - t0) / 1000000 )) ms wall (strata run, start to stop)"

# killed: connect refused
redis_stop
run killed --kv-remote "$URL"
same_ids killed
check killed "Redis gone: an error, a local recompute" \
	"d['kv_remote']['errors'] >= 1 and d['kv_remote']['hits'] == 0"
logged killed "remote KV tier 127.0.0.1"

[ $fail -eq 0 ] && echo "all remote KV tier checks passed"
exit $fail
