#!/bin/sh
# test_layers.sh — scripts/check-layers.sh passes on the source tree, and
# fails, naming the file, on a copy where a kernel includes a model's
# header, a device file a serving header, and expertd a kvd header.
# Usage: test_layers.sh SOURCE_DIR
set -u
src=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
check=$src/scripts/check-layers.sh

"$check" "$src" || fail "the source tree has layer violations (above)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-layers-test.XXXXXX") || fail mktemp
trap 'rm -rf "$tmp"' EXIT
for d in common proto expertd kvd computed cli bench; do
	cp -R "$src/$d" "$tmp/$d" || fail "copy $d"
done
"$check" "$tmp" >/dev/null || fail "the plain copy fails"
echo '#include "cw_model.h"' >>"$tmp/computed/kernels/cw_kern_c.c"
echo '#include "cw_sched.h"' >>"$tmp/computed/device/cw_kvdev.h"
echo '#include "kv_client.h"' >>"$tmp/expertd/es_main.c"
out=$("$check" "$tmp") && fail "violations not found: $out"
echo "$out"
for v in "computed/kernels/cw_kern_c.c: includes computed/models/cw_model.h" \
	 "computed/device/cw_kvdev.h: includes computed/serve/cw_sched.h" \
	 "expertd/es_main.c: includes kvd/kv_client.h" \
	 "3 violations"; do
	echo "$out" | grep -qF "$v" || fail "not reported: $v"
done
echo "ok: layers hold; three planted violations reported"
