#!/bin/sh
# Attention reads KV rows from the device pages (issue 10), end to end
# without a GPU (STRATA_CUDA_FAKE=1: device memory is host shared memory,
# st_cuda.h): real expertd, kvd and computed on kjv-moe.  Every step
# computed asks kvd (KV_MSG_SEQ_DEVICE) to place each sequence's rows older
# than the step in the device KV pool, and its attention reads them from
# there (the CPU attention reading the fake device's memory); the step's
# own rows and pages kvd could not place come from the host rows.
#   (a) --device-kv-budget 4MiB (every page fits): greedy tokens equal the
#       CPU-only run's bit for bit, rows were read from device pages;
#   (b) --device-kv-budget of 3 pages (most pages stay on the host): the
#       same tokens, rows read from device pages and from host rows;
#   (c) kvd kill -9 while a generation runs (the new kvd adopts the pool,
#       is sent the device pool again and rebuilds its slot table): the
#       generation completes with the CPU run's tokens, device rows read
#       again after the restart;
#   (d) computed kill -9 and a new computed (new epoch): the same tokens,
#       device rows read.
# Figures: the "device KV attention:" line computed logs at its stop.
FAKE_TAG=ka
NTOK=200
. "$(dirname "$0")/fake_env.sh"
start_computed() { # log, KV budget
	"$B/computed/computed" --store "$TMP/store" --instance "$I" \
		--run-dir "$R" --device-budget 25% --device-kv-budget "$2" \
		2>"$1" &
	CPID=$!
	pids="$pids $CPID"
	i=0
	while ! grep -q "ready:" "$1" 2>/dev/null && kill -0 $CPID 2>/dev/null &&
	      [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
	kill -0 $CPID 2>/dev/null || { echo "FAIL: computed did not start"; tail -5 "$1"; exit 1; }
	grep -q "attention reads the KV rows kvd places" "$1" || { echo "FAIL: computed did not set up device KV attention"; tail -5 "$1"; exit 1; }
}
stop_computed() { # log -> DEV HOST (rows read from device pages / host)
	kill -TERM $CPID
	wait $CPID 2>/dev/null
	line=$(grep "device KV attention:" "$1" | tail -1)
	echo "$1: ${line#*device KV attention: }" | sed "s|$TMP/||"
	DEV=$(echo "$line" | sed -n 's/.*: \([0-9]*\) rows read from device pages, \([0-9]*\) from host rows.*/\1/p')
	HOST=$(echo "$line" | sed -n 's/.*: \([0-9]*\) rows read from device pages, \([0-9]*\) from host rows.*/\2/p')
	DEV=${DEV:-0}
	HOST=${HOST:-0}
}
# (a) every page fits
start_computed "$TMP/computed_a.log" 4MiB
gen "$TMP/out_a" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out_a" || { echo "FAIL: (a) tokens with device KV pages differ from the CPU run"; fail=1; }
stop_computed "$TMP/computed_a.log"
[ "$DEV" -gt 0 ] || { echo "FAIL: (a) no attention row was read from a device page"; fail=1; }
DEV_A=$DEV
# every page fits: the host rows are exactly the steps' own rows.  L
# layers, T positions computed (L * T (T + 1) / 2 rows read in all), a
# prompt of P = T - NTOK + 1 tokens prefilled in one step (P (P + 1) / 2
# own rows a layer) and NTOK - 1 decode steps (one own row each)
L=$(sed -n 's/.*"num_hidden_layers": *\([0-9]*\).*/\1/p' "$SRC/models/kjv-moe/config.json")
want=$(awk -v t=$((DEV + HOST)) -v l="$L" -v n=$NTOK 'BEGIN {
	T = int((sqrt(1 + 8 * t / l) - 1) / 2 + 0.5); P = T - n + 1
	if (l * T * (T + 1) / 2 != t) print -1; else print l * (P * (P + 1) / 2 + n - 1) }')
[ "$HOST" -eq "$want" ] || { echo "FAIL: (a) $HOST rows read from host rows, want $want (the steps' own rows only)"; fail=1; }
# (b) three pages: most stay on the host (mixed per row)
PB=$(sed -n 's/.*device KV pool: [0-9]* pages of \([0-9]*\) bytes.*/\1/p' "$TMP/kvd.log" | head -1)
[ -n "$PB" ] || PB=8192
start_computed "$TMP/computed_b.log" $((PB * 3))
grep -q " 3 KV pages" "$TMP/computed_b.log" || echo "note: (b) pool is not 3 pages: $(grep 'KV pages' "$TMP/computed_b.log" | head -1)"
gen "$TMP/out_b" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out_b" || { echo "FAIL: (b) tokens with a small device KV pool differ from the CPU run"; fail=1; }
stop_computed "$TMP/computed_b.log"
[ "$DEV" -gt 0 ] || { echo "FAIL: (b) no attention row was read from a device page"; fail=1; }
[ "$HOST" -gt "$DEV" ] || { echo "FAIL: (b) host rows ($HOST) not the majority with 3 device pages (device $DEV)"; fail=1; }
[ "$DEV" -lt "$DEV_A" ] || { echo "FAIL: (b) as many device rows ($DEV) as with every page on the device ($DEV_A)"; fail=1; }
# (c) kvd kill -9 mid-generation
start_computed "$TMP/computed_c.log" 4MiB
gen "$TMP/out_c" --instance "$I" --run-dir "$R" &
GPID=$!
i=0 # the first tokens out: the sequence has rows on the device
while [ ! -s "$TMP/out_c" ] && kill -0 $GPID 2>/dev/null && [ $i -lt 200 ]; do
	sleep 0.01; i=$((i + 1))
done
KPID=$(cat "$R/kvd.pid")
kill -0 $GPID 2>/dev/null && mid=1 || mid=0
kill -9 "$KPID"
wait "$KPID" 2>/dev/null
"$B/kvd/kvd" --instance "$I" --run-dir "$R" --budget 64MiB \
	2>"$TMP/kvd2.log" & pids="$pids $!"
wait $GPID
[ $mid -eq 1 ] || { echo "FAIL: (c) the generation ended before kvd was killed (not mid-generation)"; fail=1; }
cmp -s "$TMP/ref" "$TMP/out_c" || { echo "FAIL: (c) tokens across a kvd kill -9 differ from the CPU run"; fail=1; }
i=0
while ! grep -q "imported epoch" "$TMP/kvd2.log" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "imported epoch" "$TMP/kvd2.log" || { echo "FAIL: (c) the restarted kvd was not sent the device KV pool again"; fail=1; }
# after the re-import the device pages are read again
gen "$TMP/out_c2" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out_c2" || { echo "FAIL: (c) tokens after the kvd restart differ from the CPU run"; fail=1; }
stop_computed "$TMP/computed_c.log"
grep -q "device KV pages in use again" "$TMP/computed_c.log" || { echo "FAIL: (c) computed did not go back to the device pages after the kvd restart"; fail=1; }
[ "$DEV" -gt "$DEV_A" ] || { echo "FAIL: (c) device rows ($DEV) not more than one generation's ($DEV_A): the pages were not read from the device after the kvd restart"; fail=1; }
# (d) computed kill -9, a new computed exports a new epoch
start_computed "$TMP/computed_d.log" 4MiB
kill -9 $CPID
wait $CPID 2>/dev/null
i=0
while ! grep -q "died; dropping epoch" "$TMP/kvd2.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
start_computed "$TMP/computed_e.log" 4MiB
gen "$TMP/out_e" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out_e" || { echo "FAIL: (d) tokens after a computed restart differ from the CPU run"; fail=1; }
stop_computed "$TMP/computed_e.log"
[ "$DEV" -gt 0 ] || { echo "FAIL: (d) no attention row was read from a device page after the computed restart"; fail=1; }
[ $fail -eq 0 ] && echo "device KV attention on the fake device: $NTOK tokens equal the CPU run with every page, 3 pages, across kvd kill -9 mid-generation and a computed restart"
exit $fail
