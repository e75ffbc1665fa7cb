#!/bin/sh
# test_layers.sh — scripts/check-layers.sh passes on the source tree, and
# fails, naming the file, on a copy where a kernel includes a model's
# header, a device file a serving header, expertd a kvd header, proto a
# header of common/ above common/base, and common/base a proto header.
# Usage: test_layers.sh SOURCE_DIR
set -u
src=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
check=$src/scripts/check-layers.sh

"$check" "$src" || fail "the source tree has layer violations (above)"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/strata-layers-test.XXXXXX") || fail mktemp
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM  # a killed test (meson's timeout) cleans up too
for d in common proto expertd kvd computed cli bench; do
	cp -R "$src/$d" "$tmp/$d" || fail "copy $d"
done
"$check" "$tmp" >/dev/null || fail "the plain copy fails"
echo '#include "cw_model.h"' >>"$tmp/computed/kernels/cw_kern_c.c"
echo '#include "cw_sched.h"' >>"$tmp/computed/device/cw_kvdev.h"
echo '#include "kv_client.h"' >>"$tmp/expertd/es_main.c"
echo '#include "st_store.h"' >>"$tmp/proto/st_proto.c"
echo '#include "st_proto.h"' >>"$tmp/common/base/st_util.h"
out=$("$check" "$tmp") && fail "violations not found: $out"
echo "$out"
for v in "computed/kernels/cw_kern_c.c: includes computed/models/cw_model.h" \
	 "computed/device/cw_kvdev.h: includes computed/serve/cw_sched.h" \
	 "expertd/es_main.c: includes kvd/kv_client.h" \
	 "proto/st_proto.c: includes common/st_store.h" \
	 "common/base/st_util.h: includes proto/st_proto.h" \
	 "5 violations"; do
	echo "$out" | grep -qF "$v" || fail "not reported: $v"
done
echo "ok: layers hold; five planted violations reported"
