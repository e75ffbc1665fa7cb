#!/usr/bin/python3
"""Prints "N passed, N failed, N skipped" from a meson testlog.json."""
import json
import sys

counts = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "ERROR": 0,
          "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0}
try:
    for line in open(sys.argv[1]):
        line = line.strip()
        if line:
            r = json.loads(line).get("result", "ERROR")
            counts[r] = counts.get(r, 0) + 1
except OSError:
    pass
passed = counts["OK"] + counts["EXPECTEDFAIL"]
failed = (counts["FAIL"] + counts["TIMEOUT"] + counts["ERROR"]
          + counts["UNEXPECTEDPASS"])
print(f"{passed} passed, {failed} failed, {counts['SKIP']} skipped")
