#!/bin/sh
# The device pools end to end without a GPU (STRATA_CUDA_FAKE=1: device
# memory is host shared memory, st_cuda.h): real expertd, kvd and computed
# --device-budget 25% on kjv-moe.  computed exports its pools, expertd and
# kvd import them, expertd copies acquired and look-ahead experts into
# device slots and publishes them in the slot table, computed pins them and
# computes those experts from the slot bytes (CPU reference backend):
#   - greedy tokens equal the CPU-only run's (reference mode, bit-exact:
#     the slot bytes must be exactly the expert's record);
#   - experts really came from device slots (pins > 0);
#   - computed kill -9: expertd and kvd drop the dead exporter's handles;
#     a new computed (budget 100%) exports a new epoch, both re-import, the
#     tokens are the same again; a clean stop revokes (nothing left to the
#     driver) and leaves no segment behind.
#   - the layer-batched protocol (cw_expert_fn queues, one sync per layer)
#     and its fallback: the second computed runs with
#     STRATA_CUDA_FAKE_SYNC_FAIL=3 (every 3rd sync fails and leaves NaN
#     outputs); the model recomputes those experts on the CPU, so the
#     tokens must still equal the CPU run's, and some syncs must have
#     failed.
#   - the restarted expertd pins its host pool slowly (3 s on the fake
#     device): computed's re-export is answered at once all the same (the
#     pinning runs in the background; issue 27).
FAKE_TAG=df
NTOK=24
. "$(dirname "$0")/fake_env.sh"
start_computed() { # log, budget [fail every N-th sync]
	STRATA_CUDA_FAKE_SYNC_FAIL=${3:-0} "$B/computed/computed" --store "$TMP/store" --instance "$I" \
		--run-dir "$R" --device-budget "$2" --device-kv-budget 4MiB \
		2>"$1" &
	CPID=$!
	pids="$pids $CPID"
	i=0
	while ! grep -q "ready:" "$1" && kill -0 $CPID 2>/dev/null &&
	      [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
	kill -0 $CPID 2>/dev/null || { echo "FAIL: computed did not start"; tail -5 "$1"; exit 1; }
	grep -q "fake device" "$1" || { echo "FAIL: computed did not set up the device pools"; tail -5 "$1"; exit 1; }
}
start_computed "$TMP/computed1.log" 25%
gen "$TMP/out1" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out1" || { echo "FAIL: tokens through the device slots differ from the CPU run"; fail=1; }
n=$(grep -c "imported epoch" "$TMP/expertd.log")
[ "$n" -eq 1 ] || { echo "FAIL: expertd imported $n times, want 1"; fail=1; }
n=$(grep -c "imported epoch" "$TMP/kvd.log")
[ "$n" -eq 1 ] || { echo "FAIL: kvd imported $n times, want 1"; fail=1; }
# slots share their copy events as lanes: the 512 KV pages of 4 MiB come
# with 128 events (ST_DEVPOOL_EVENT_LANES), not one each (issue 27)
l=$(grep -m1 "imported epoch" "$TMP/kvd.log")
ns=$(echo "$l" | sed -n 's/.*(\([0-9]*\) slots of.*/\1/p')
ne=$(echo "$l" | sed -n 's/.* \([0-9]*\) events,.*/\1/p')
[ "${ns:-0}" -gt 128 ] && [ "${ne:-0}" -eq 128 ] ||
	{ echo "FAIL: kvd imported ${ns:-?} slots with ${ne:-?} events, want more than 128 slots on 128 events"; fail=1; }
kill -9 $CPID
wait $CPID 2>/dev/null # reaped: its pid is gone, not a zombie
for d in expertd kvd; do
	i=0
	while ! grep -q "died; dropping epoch" "$TMP/$d.log" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	grep -q "died; dropping epoch" "$TMP/$d.log" || { echo "FAIL: $d kept the dead computed's handles"; fail=1; }
done
start_computed "$TMP/computed2.log" 100% 3
gen "$TMP/out2" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out2" || { echo "FAIL: tokens differ after the computed restart"; fail=1; }
for d in expertd kvd; do
	n=$(grep -c "imported epoch" "$TMP/$d.log")
	[ "$n" -eq 2 ] || { echo "FAIL: $d imported $n times, want 2"; fail=1; }
done
# expertd kill -9 and restart under the live computed: it adopts its host
# pool, computed exports the same epoch again, expertd imports it again
EPID=$(cat "$R/expertd.pid")
kill -9 "$EPID"
wait "$EPID" 2>/dev/null # gone before the next one adopts its pool
STRATA_CUDA_FAKE_PIN_MS=3000 "$B/expertd/expertd" --store "$TMP/store" \
	--instance "$I" --run-dir "$R" \
	--host-budget 100% 2>"$TMP/expertd2.log" & pids="$pids $!"
i=0
while ! grep -q "imported epoch" "$TMP/expertd2.log" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "imported epoch" "$TMP/expertd2.log" || { echo "FAIL: the restarted expertd was not sent the device pool again"; fail=1; }
e1=$(grep "imported epoch" "$TMP/expertd.log" | tail -1 | sed 's/.*imported epoch \([0-9]*\).*/\1/')
e2=$(grep "imported epoch" "$TMP/expertd2.log" | tail -1 | sed 's/.*imported epoch \([0-9]*\).*/\1/')
[ -n "$e1" ] && [ "$e1" = "$e2" ] || { echo "FAIL: re-export after an expertd restart changed the epoch ($e1 -> $e2)"; fail=1; }
ms=$(grep "exported to expertd" "$TMP/computed2.log" | tail -1 | sed -n 's/.*answered in \([0-9]*\)\..*/\1/p')
[ -n "$ms" ] && [ "$ms" -lt 1000 ] ||
	{ echo "FAIL: the export to an expertd pinning its host pool for 3 s was answered in ${ms:-?} ms (want < 1000: pinning in the background)"; fail=1; }
gen "$TMP/out3" --instance "$I" --run-dir "$R"
cmp -s "$TMP/ref" "$TMP/out3" || { echo "FAIL: tokens differ after the expertd restart"; fail=1; }
kill -TERM $CPID
wait $CPID 2>/dev/null
grep "device pools:" "$TMP/computed2.log" | sed 's/.*device pools/computed: device pools/'
fx=$(sed -n 's/.* \([0-9]*\) experts through the fake device.*/\1/p' "$TMP/computed2.log")
[ "${fx:-0}" -gt 0 ] || { echo "FAIL: no expert was computed from a device slot"; fail=1; }
fs=$(sed -n 's/.*(\([0-9]*\) failed syncs).*/\1/p' "$TMP/computed2.log")
[ "${fs:-0}" -gt 0 ] || { echo "FAIL: STRATA_CUDA_FAKE_SYNC_FAIL=3 failed no sync (the fallback was not exercised)"; fail=1; }
grep -q "leaving the memory to the driver" "$TMP/computed2.log" && { echo "FAIL: computed freed without a revoke"; fail=1; }
grep -q "released" "$TMP/expertd2.log" || { echo "FAIL: the restarted expertd did not release the epoch at computed's stop"; fail=1; }
# a CUDA module that cannot be loaded (or created): computed warns, gives
# the pools back and computes on the CPU instead of exiting (issue 27)
STRATA_CUDA_MODULE="$TMP/no-such-module.so" "$B/computed/computed" \
	--store "$TMP/store" --instance "$I" --run-dir "$R" \
	--device-budget 25% 2>"$TMP/computed3.log" &
CPID=$!
pids="$pids $CPID"
i=0
while ! grep -q "ready:" "$TMP/computed3.log" && kill -0 $CPID 2>/dev/null &&
      [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $CPID 2>/dev/null; then
	grep -q "CUDA expert path unavailable.*computing on the CPU" "$TMP/computed3.log" ||
		{ echo "FAIL: no fallback warning for a missing CUDA module"; fail=1; }
	gen "$TMP/out4" --instance "$I" --run-dir "$R"
	cmp -s "$TMP/ref" "$TMP/out4" || { echo "FAIL: tokens of the CPU fallback differ from the CPU run"; fail=1; }
	kill -TERM $CPID
	wait $CPID 2>/dev/null
else
	echo "FAIL: computed exited when its CUDA module could not be loaded:"; tail -3 "$TMP/computed3.log"; fail=1
fi
[ $fail -eq 0 ] && echo "fake device: tokens equal the CPU run at 25 % and 100 % (with ${fs} failed syncs recomputed on the CPU), re-import after computed and expertd kill -9, CPU fallback without the CUDA module"
exit $fail
