#!/usr/bin/python3
"""test-targets.py BUILD_DIR [--suite S]... [--no-suite S]... — prints, one
a line, the ninja outputs (relative to BUILD_DIR) that the tests meson test
would run with the same --suite / --no-suite options need: their
executables and the targets named in their `depends`; other arguments are
ignored.
scripts/test-sanitizers.sh builds only these, not the benchmarks and the
tests of other suites."""
import json
import os
import subprocess
import sys


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit("usage: test-targets.py BUILD_DIR [--suite S]... "
                 "[--no-suite S]...")
    build, want, skip = args[0], set(), set()
    rest = args[1:]
    # other meson test arguments (test names, --repeat) select nothing
    # here: building a little more than they need is harmless
    while rest:
        if rest[0] in ("--suite", "--no-suite") and len(rest) > 1:
            (want if rest[0] == "--suite" else skip).add(rest[1])
            rest = rest[2:]
        else:
            rest = rest[1:]
    info = json.loads(subprocess.check_output(
        ["meson", "introspect", build, "--tests", "--targets"]))
    files = {t["id"]: t["filename"] for t in info["targets"]}
    out = set()
    for t in info["tests"]:
        # suite names come as "project:suite"
        names = {s.split(":")[-1] for s in t["suite"]}
        if (want and not names & want) or names & skip:
            continue
        for dep in t.get("depends", []):
            for f in files.get(dep, []):
                out.add(os.path.relpath(f, os.path.abspath(build)))
    if not out:
        sys.exit("test-targets.py: no test selected")
    print("\n".join(sorted(out)))


main()
