#!/bin/sh
# Runs every default test suite on a fresh Debian 12 machine: installs
# packages, builds, runs `meson test` (everything but the `slow` suite) and
# prints one line "N passed, N failed, N skipped".
# Extra arguments go to meson test (e.g. --suite unit).
set -u
cd "$(dirname "$0")/.."
./scripts/setup-debian.sh || exit 1
./scripts/build.sh || exit 1
meson test -C build --no-suite slow --print-errorlogs --num-processes 2 "$@"
rc=$?
/usr/bin/python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "ERROR": 0, "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0}
try:
    for line in open(sys.argv[1]):
        line = line.strip()
        if line:
            r = json.loads(line).get("result", "ERROR")
            counts[r] = counts.get(r, 0) + 1
except OSError:
    pass
passed = counts["OK"] + counts["EXPECTEDFAIL"]
failed = counts["FAIL"] + counts["TIMEOUT"] + counts["ERROR"] + counts["UNEXPECTEDPASS"]
print(f"{passed} passed, {failed} failed, {counts['SKIP']} skipped")
PY
exit $rc
