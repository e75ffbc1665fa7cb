#!/usr/bin/python3
"""test-targets.py BUILD_DIR SUITE... — prints, one a line, the ninja
outputs (relative to BUILD_DIR) that the tests of the given suites need:
their executables and the targets named in their `depends`, tests of the
`slow` suite left out.  scripts/test-sanitizers.sh builds only these, not
the benchmarks and the tests of other suites."""
import json
import os
import subprocess
import sys

if len(sys.argv) < 3:
    sys.exit("usage: test-targets.py BUILD_DIR SUITE...")
build, suites = sys.argv[1], set(sys.argv[2:])
info = json.loads(subprocess.check_output(
    ["meson", "introspect", build, "--tests", "--targets"]))
files = {t["id"]: t["filename"] for t in info["targets"]}
out = set()
for t in info["tests"]:
    # suite names come as "project:suite"
    names = {s.split(":")[-1] for s in t["suite"]}
    if not names & suites or "slow" in names:
        continue
    for dep in t.get("depends", []):
        for f in files.get(dep, []):
            out.add(os.path.relpath(f, os.path.abspath(build)))
if not out:
    sys.exit("test-targets.py: no test in suites " + " ".join(sorted(suites)))
print("\n".join(sorted(out)))
