#!/usr/bin/python3
"""replay-table.py: turns `strata replay --json` output into the Markdown
table of docs/REPLAY.md: one row per policy, one column per pool split and
budget, each cell the policy's loads as a ratio of Belady's for that pool.

Usage: build/cli/strata replay TRACE... --json | scripts/replay-table.py
"""
import json
import sys


def main():
    d = json.load(sys.stdin)
    cols = []
    cells = {}
    online = {}
    order = []
    for r in d["results"]:
        if "budget_percent" in r:
            budget = "%g %%" % r["budget_percent"]
        else:
            budget = "%d slots" % r["slots"]
        col = "%s %s" % (r["split"], budget)
        if col not in cols:
            cols.append(col)
        if r["policy"] not in online:
            online[r["policy"]] = r["online"]
            order.append(r["policy"])
        cells[(r["policy"], col)] = r["ratio_to_belady"]
    print("| policy | sees | " + " | ".join(cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for p in order:
        row = []
        for c in cols:
            v = cells.get((p, c))
            row.append("" if v is None else "%.3f" % v)
        print("| %s | %s | %s |" % (p, online[p], " | ".join(row)))
    belady = [r for r in d["results"] if r["policy"] == "belady"]
    print()
    print("Belady's loads: " + ", ".join(
        "%s %s %d" % (r["split"], ("%g %%" % r["budget_percent"])
                      if "budget_percent" in r else "", r["loads"])
        for r in belady))


if __name__ == "__main__":
    main()
