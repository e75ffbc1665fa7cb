#!/bin/sh
# strata run on inputs a newcomer plausibly gives, on the embedded kjv-moe
# (no ../shared needed).  Checks:
#  - --max-tokens 0 ends at once (it used to hang: no scheduler step ever
#    picked the request up) with 0 generated tokens, finish "max tokens";
#  - --max-tokens beyond the GEN_START limit (2^24) or beyond a long is
#    refused by the CLI with exit 2 naming --max-tokens (it used to reach
#    computed as "malformed GEN_START message", or wrap around); so is a
#    --seed that is not a number (it used to become seed 0 silently);
#  - SIGKILL of expertd, then of kvd, while the run generates: strata run
#    exits 1 within 5 s naming the dead daemon and its log, computed not
#    SIGKILLed (it used to
#    wait computed's 60 s --restart-wait for a daemon nothing restarts);
#  - a damaged expert record: the error strata run prints keeps its whole
#    remedy ("re-run strata convert"; computed used to cut the message of
#    a failed generation at 255 bytes), with a long store path;
#  - a damaged store in strata's cache: exit 1 naming the cache directory
#    to remove (the daemons' remedy is "re-run strata convert"), and a
#    failed start quotes only its own log lines (the log is appended to);
#  - kvd's warning about a spill file on tmpfs (logged after computed
#    connects) is echoed by strata run;
#  - a KV budget too small for one (pinned, running) sequence, with a
#    spill budget: exit 1 saying one sequence needs more than the budget
#    lets it hold, the --kv-budget that fixes it (pages x page bytes as
#    stated) and no advice to raise --spill-budget (it used to give that,
#    with an empty spill file); a re-run at the --kv-budget named gets the
#    sequence past the rows it stopped at;
#  - a STRATA_CACHE_DIR that cannot be created: exit 1 naming the cache
#    and STRATA_CACHE_DIR (it used to blame the model directory);
#  - strata plan refuses "--context 4k" and the like (exit 2);
#  - strata plan --context 4096 on kjv-moe (max_position_embeddings 256)
#    warns naming both and plans KV for 256 tokens (JSON kv = 256 x
#    kv_per_token; it used to plan 4096 without a warning); --context 128
#    plans 128 without a warning;
#  - strata convert after a killed convert (SIGKILL leaves OUT.tmp-PID):
#    removes the dead pid's tmp dir, saying so on stderr with its path, and
#    keeps a live pid's; SIGTERM and SIGINT during a convert exit 130 and
#    leave no OUT.tmp-PID;
#  - a --prompt-file (or stdin) with a NUL byte: exit 1 at once naming the
#    file and the byte's offset, no daemon started (the prompt used to be
#    cut at the NUL without a word).
set -u
STRATA="$STRATA_BUILD_DIR/cli/strata"
KJV="$STRATA_SOURCE_DIR/models/kjv-moe"
PY=/usr/bin/python3
TMP=$(mktemp -d /tmp/strata-runerr-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
fail=0
STORE="$TMP/store"
"$STRATA" convert --model "$KJV" --out "$STORE" >/dev/null 2>"$TMP/conv.err" ||
	{ echo "FAIL: convert"; cat "$TMP/conv.err"; exit 1; }

# 1. --max-tokens 0
timeout 60 "$STRATA" run --store "$STORE" --prompt "And it came to pass" \
	--max-tokens 0 --json --instance "re0$$" --run-dir "$TMP/run0" \
	>"$TMP/out0" 2>"$TMP/err0"
rc=$?
if [ $rc -ne 0 ]; then
	echo "FAIL: --max-tokens 0 exited $rc (124: hung)"; cat "$TMP/err0"; fail=1
else
	$PY - "$TMP/out0" <<'PY' || fail=1
import json, sys
out = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
if out["generated_tokens"] != 0 or out["ids"] != [] or out["finish"] != "max tokens":
    print("FAIL: --max-tokens 0 gave", out["generated_tokens"], out["ids"], out["finish"]); sys.exit(1)
if out["prompt_tokens"] < 1:
    print("FAIL: prompt tokens", out["prompt_tokens"]); sys.exit(1)
print("max-tokens 0: 0 tokens, finish 'max tokens'")
PY
fi

# 2. out-of-range --max-tokens
for n in 16777217 99999999999 -1 12x; do
	"$STRATA" run --store "$STORE" --max-tokens "$n" >/dev/null 2>"$TMP/errn"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -q -- '--max-tokens wants' "$TMP/errn"; then
		echo "FAIL: --max-tokens $n: exit $rc:"; cat "$TMP/errn"; fail=1
	fi
done

for v in abc -1 12x; do
	"$STRATA" run --store "$STORE" --seed "$v" >/dev/null 2>"$TMP/errs"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -q -- '--seed wants' "$TMP/errs"; then
		echo "FAIL: --seed $v: exit $rc:"; cat "$TMP/errs"; fail=1
	fi
done

# word-valued tier options are checked before any daemon starts (expertd
# refused them only after the start, leaving a run directory behind)
for a in "--admit bogus" "--evict mru" "--admit="; do
	# shellcheck disable=SC2086
	"$STRATA" run --store "$STORE" $a --instance "rw$$" \
		--run-dir "$TMP/rw-run" >/dev/null 2>"$TMP/errw"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -q -- "must be" "$TMP/errw" ||
	   [ -e "$TMP/rw-run" ]; then
		echo "FAIL: strata run $a: exit $rc (or a run dir made):"
		cat "$TMP/errw"; fail=1
	fi
done

# 3. a tier daemon killed while strata run generates
for d in expertd kvd; do
	run="$TMP/run-$d"
	start=$(date +%s)
	"$STRATA" run --store "$STORE" --prompt "And it came to pass" \
		--max-tokens 240 --ignore-eos --host-budget 10% \
		--instance "rek$d$$" --run-dir "$run" >"$TMP/out-$d" 2>"$TMP/err-$d" &
	bp=$!
	pid=""
	for i in $(seq 500); do
		pid=$(cat "$run/$d.pid" 2>/dev/null)
		[ -n "$pid" ] && [ -s "$TMP/out-$d" ] && break
		sleep 0.02
	done
	if [ -z "$pid" ] || [ ! -s "$TMP/out-$d" ]; then
		echo "FAIL: $d: generation did not start"; cat "$TMP/err-$d"; fail=1
		wait $bp; continue
	fi
	kill -9 "$pid"
	wait $bp
	rc=$?
	el=$(( $(date +%s) - start ))
	if [ $rc -ne 1 ] || [ $el -gt 5 ] ||
	   ! grep -q "$d (pid $pid) died; its log is $run/$d.log" "$TMP/err-$d"; then
		echo "FAIL: $d killed: exit $rc after $el s:"; cat "$TMP/err-$d"; fail=1
	else
		echo "$d killed: strata run exited 1 after $el s naming it"
		grep -q "had to be killed" "$TMP/err-$d" &&
			{ echo "FAIL: $d killed: computed had to be killed"; fail=1; }
	fi
	if pgrep -f -- "--instance rek$d$$ " >/dev/null 2>&1; then
		echo "FAIL: a daemon of rek$d$$ still runs"; fail=1
	fi
done

# 4. damaged expert record under a long path: the remedy survives
LONG="$TMP/a-rather-long-directory-name-as-users-have/another-level-of-it/and-one-more-for-good-measure"
mkdir -p "$LONG"
cp -r "$STORE" "$LONG/store"
$PY - "$LONG/store/experts-001.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(1000); f.write(b"xxxxxxxx"); f.close()
PY
timeout 60 "$STRATA" run --store "$LONG/store" --prompt "And it came to pass" \
	--max-tokens 48 --ignore-eos --instance "red$$" --run-dir "$TMP/rund" \
	>/dev/null 2>"$TMP/errd"
rc=$?
if [ $rc -ne 1 ] || ! grep -q 'checksum mismatch.*the store is damaged: re-run strata convert' "$TMP/errd"; then
	echo "FAIL: damaged store: exit $rc:"; cat "$TMP/errd"; fail=1
else
	echo "damaged store: exit 1, message ends with its remedy"
fi

# 4b. a damaged store in strata's cache (made by strata run --model): the
# remedy names the cache directory to remove, and a second failed start in
# the same run dir quotes only its own log lines
CACHE2="$TMP/cache2"
STRATA_CACHE_DIR="$CACHE2" timeout 120 "$STRATA" run --model "$KJV" \
	--max-tokens 1 --instance "rcc$$" --run-dir "$TMP/runc" >/dev/null \
	2>"$TMP/errcc0" || { echo "FAIL: cache run"; cat "$TMP/errcc0"; fail=1; }
CST=$(ls -d "$CACHE2"/*.strata 2>/dev/null | head -1)
$PY - "$CST/dense.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(100); f.write(b"xxxxxxxx"); f.close()
PY
for i in 1 2; do
	STRATA_CACHE_DIR="$CACHE2" timeout 60 "$STRATA" run --model "$KJV" \
		--max-tokens 1 --instance "rcc$$" --run-dir "$TMP/runc" \
		>/dev/null 2>"$TMP/errcc"
	rc=$?
done
if [ $rc -ne 1 ] || [ -z "$CST" ] ||
   ! grep -qF "$CST is strata's cache of the model's store: remove it (rm -rf '$CST')" "$TMP/errcc"; then
	echo "FAIL: damaged cached store: exit $rc:"; cat "$TMP/errcc"; fail=1
elif [ "$(grep -c 'error: cannot open the model' "$TMP/errcc")" -ne 1 ]; then
	echo "FAIL: the second start quotes earlier starts' errors:"
	cat "$TMP/errcc"; fail=1
else
	echo "ok: damaged cached store: exit 1, names the cache to remove, one error quoted"
fi

# 4c. a warning kvd logs once computed has connected (its spill file on
# tmpfs) reaches strata run's stderr
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
	SHMRUN=$(mktemp -d /dev/shm/strata-runerr-XXXXXX)
	"$STRATA" run --store "$STORE" --prompt "And" --max-tokens 2 \
		--kv-spill-budget 1MiB --instance "rsh$$" --run-dir "$SHMRUN" \
		>/dev/null 2>"$TMP/errsh"
	rc=$?
	rm -rf "$SHMRUN"
	if [ $rc -ne 0 ] || ! grep -q "strata: kvd warns: spill file .* is on tmpfs" "$TMP/errsh"; then
		echo "FAIL: tmpfs spill warning not shown by strata run (rc $rc):"
		cat "$TMP/errsh"; fail=1
	else
		echo "ok: kvd's tmpfs spill warning reaches strata run"
	fi
else
	echo "SKIP (check 4c only): no writable /dev/shm"
fi

# 4d. a KV budget too small for one sequence (pinned while it runs): the
# advice follows the cause, and the budget it names is enough for it
"$STRATA" run --store "$STORE" --prompt "And it came to pass" --max-tokens 200 \
	--kv-budget 256KiB --kv-spill-budget 64MiB --instance "rkb$$" \
	--run-dir "$TMP/runkb" >/dev/null 2>"$TMP/errkb"
rc=$?
$PY - "$TMP/errkb" "$rc" <<'PY' >"$TMP/kbnext" || fail=1
import re, sys
err, rc = open(sys.argv[1]).read(), int(sys.argv[2])
m = re.search(r"KV budget too small for one sequence: a sequence of (\d+) rows "
              r"needs (\d+) pages per stream, (\d+) pages of (\d+) bytes in all "
              r".*raise kvd --budget \(strata: --kv-budget\) to at least (\d+) bytes", err)
if rc != 1 or not m:
    sys.stderr.write("FAIL: too small a KV budget: exit %d:\n%s" % (rc, err)); sys.exit(1)
rows, per, pages, pb, need = map(int, m.groups())
if "raise kvd --spill-budget" in err or pages * pb != need or need <= 256 * 1024:
    sys.stderr.write("FAIL: too small a KV budget: wrong advice or figures "
                     "(%d x %d != %d?):\n%s" % (pages, pb, need, err)); sys.exit(1)
print(rows, need)
PY
if [ -s "$TMP/kbnext" ]; then
	read -r kbrows kbneed <"$TMP/kbnext"
	"$STRATA" run --store "$STORE" --prompt "And it came to pass" --max-tokens 200 \
		--kv-budget "$kbneed" --kv-spill-budget 64MiB --instance "rkc$$" \
		--run-dir "$TMP/runkc" >/dev/null 2>"$TMP/errkc"
	rc=$?
	$PY - "$TMP/errkc" "$rc" "$kbrows" <<'PY' || fail=1
import re, sys
err, rc, rows = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
m = re.search(r"a sequence of (\d+) rows", err)
if rc != 0 and (not m or int(m.group(1)) <= rows):
    sys.stderr.write("FAIL: the --kv-budget named did not get past %d rows:\n%s" % (rows, err)); sys.exit(1)
print("ok: too small a KV budget: advice names --kv-budget (not --spill-budget); "
      "the budget named gets past %d rows (exit %d)" % (rows, rc))
PY
fi

# 5. an uncreatable store cache
touch "$TMP/afile"
STRATA_CACHE_DIR="$TMP/afile/cache" "$STRATA" run --model "$KJV" --max-tokens 2 \
	>/dev/null 2>"$TMP/errc"
rc=$?
if [ $rc -ne 1 ] || ! grep -q "cannot create the store cache directory of $TMP/afile/cache/.*STRATA_CACHE_DIR" "$TMP/errc"; then
	echo "FAIL: uncreatable cache: exit $rc:"; cat "$TMP/errc"; fail=1
else
	echo "uncreatable cache: exit 1 naming the cache directory"
fi

# 6. strata plan's whole-number options (atoi used to read "4k" as 4)
for a in "--batch four" "--context 4k" "--top-k 2x" "--page-rows 16rows"; do
	# shellcheck disable=SC2086
	"$STRATA" plan --model "$KJV" $a >/dev/null 2>"$TMP/errp"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -q "not a whole number" "$TMP/errp"; then
		echo "FAIL: plan $a: exit $rc:"; cat "$TMP/errp"; fail=1
	fi
done
for a in "--context 0" "--batch -1"; do
	# shellcheck disable=SC2086
	"$STRATA" plan --model "$KJV" $a >/dev/null 2>"$TMP/errp"
	rc=$?
	if [ $rc -ne 2 ] || ! grep -q "must be at least 1" "$TMP/errp"; then
		echo "FAIL: plan $a: exit $rc (usage errors exit 2):"; cat "$TMP/errp"; fail=1
	fi
done
for ctx in 4096 128; do
	"$STRATA" plan --model "$KJV" --context $ctx --json >"$TMP/plan.json" \
		2>"$TMP/errp"
	rc=$?
	want=$ctx; [ $ctx -gt 256 ] && want=256
	if [ $rc -ne 0 ]; then
		echo "FAIL: plan --context $ctx: exit $rc"; cat "$TMP/errp"; fail=1
	elif [ $ctx -gt 256 ] && ! grep -q "warning: --context 4096 is beyond the model's context of 256 tokens" "$TMP/errp"; then
		echo "FAIL: plan --context $ctx: no warning:"; cat "$TMP/errp"; fail=1
	elif [ $ctx -le 256 ] && grep -q "warning" "$TMP/errp"; then
		echo "FAIL: plan --context $ctx: a warning:"; cat "$TMP/errp"; fail=1
	else
		$PY - "$TMP/plan.json" $want $ctx <<'PY' || fail=1
import json, sys
j = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
if j["kv"] != want * j["kv_per_token"]:
    print("FAIL: plan --context", sys.argv[3], "kv", j["kv"], "!=", want, "x", j["kv_per_token"]); sys.exit(1)
print("plan --context %s: KV for %d tokens (%d B)" % (sys.argv[3], want, j["kv"]))
PY
	fi
done
# no --context: the default (4096) is capped to the model's 256 silently
"$STRATA" plan --model "$KJV" --json >"$TMP/plan.json" 2>"$TMP/errp"
rc=$?
if [ $rc -ne 0 ] || grep -q "warning" "$TMP/errp"; then
	echo "FAIL: plan without --context: exit $rc, or a warning:"
	cat "$TMP/errp"; fail=1
elif ! $PY - "$TMP/plan.json" "$KJV/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
# f32 KV by default, as strata run/up (it planned f16: half the bytes)
hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
want = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * 4
ok = j["kv"] == 256 * j["kv_per_token"] and j["kv_per_token"] == want
print("plan default: kv_per_token %d (f32 wants %d), kv %d" % (j["kv_per_token"], want, j["kv"]))
sys.exit(0 if ok else 1)
PY
then
	echo "FAIL: plan without --context: KV not planned for 256 tokens of f32 rows"; fail=1
else
	echo "ok: plan without --context: f32 KV for the model's 256 tokens, no warning"
fi
# 7. temporary directories of killed converts
CV="$TMP/cv"
mkdir -p "$CV"
sh -c 'exit 0' & dead=$!; wait $dead
mkdir -p "$CV/st.tmp-$dead/x" "$CV/st.tmp-$$"
"$STRATA" convert --model "$KJV" --out "$CV/st" >/dev/null 2>"$TMP/errcv"
rc=$?
if [ $rc -ne 0 ] || [ -e "$CV/st.tmp-$dead" ] || [ ! -d "$CV/st.tmp-$$" ] ||
   ! grep -q "removing $CV/st.tmp-$dead, left by a convert that died (pid $dead)" "$TMP/errcv"; then
	echo "FAIL: stale tmp dir: exit $rc:"; cat "$TMP/errcv"; ls "$CV"; fail=1
else
	echo "convert: removed the dead pid's tmp dir (said so), kept the live one's"
fi
rmdir "$CV/st.tmp-$$"
for sig in TERM INT; do
	# --scale-search mse: long enough (~0.5 s) to be signalled midway
	"$STRATA" convert --model "$KJV" --out "$CV/s$sig" --scale-search mse \
		>/dev/null 2>"$TMP/errcs" &
	cp=$!
	for i in $(seq 200); do
		ls -d "$CV/s$sig".tmp-* >/dev/null 2>&1 && break
		sleep 0.01
	done
	kill -$sig $cp
	wait $cp
	rc=$?
	if [ $rc -ne 130 ] || ls -d "$CV/s$sig".tmp-* >/dev/null 2>&1 ||
	   [ -e "$CV/s$sig" ]; then
		echo "FAIL: convert SIG$sig: exit $rc:"; cat "$TMP/errcs"; ls "$CV"; fail=1
	else
		echo "convert SIG$sig: exit 130, no tmp dir left"
	fi
done

# a prompt with a NUL byte, from a file and from stdin
printf 'In the\000beginning' >"$TMP/nul.txt"
for src in file stdin; do
	if [ $src = file ]; then
		timeout 30 "$STRATA" run --store "$STORE" --prompt-file "$TMP/nul.txt" \
			--max-tokens 1 --instance "nul$$" --run-dir "$TMP/runnul" \
			>/dev/null 2>"$TMP/errnul"
		rc=$?; want="$TMP/nul.txt"
	else
		timeout 30 "$STRATA" run --store "$STORE" --prompt-file - \
			--max-tokens 1 --instance "nul$$" --run-dir "$TMP/runnul" \
			<"$TMP/nul.txt" >/dev/null 2>"$TMP/errnul"
		rc=$?; want="standard input"
	fi
	if [ $rc -ne 1 ] || ! grep -q "prompt in $want has a NUL byte at offset 6" "$TMP/errnul" ||
	   [ -e "$TMP/runnul/expertd.pid" ] || [ -e "$TMP/runnul/expertd.log" ]; then
		echo "FAIL: NUL in the prompt ($src): exit $rc:"; cat "$TMP/errnul"; fail=1
	else
		echo "NUL in the prompt ($src): exit 1, names $want and offset 6, no daemon"
	fi
done
exit $fail
