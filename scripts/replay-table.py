#!/usr/bin/python3
"""replay-table.py: turns `strata replay --json` output into the Markdown
table of docs/REPLAY.md: one row per policy, one column per pool split and
budget, each cell the policy's loads as a ratio of Belady's for that pool.

Usage: build/cli/strata replay TRACE... --json | scripts/replay-table.py
       build/cli/strata replay TRACE... --draft LIST --json |
           scripts/replay-table.py --grid

--grid prints the draft rows instead, one table per pool split and budget:
a row per base policy, draft length and schedule, a column per acceptance.
"""
import json
import sys


def column(r):
    if "budget_percent" in r:
        budget = "%g %%" % r["budget_percent"]
    else:
        budget = "%d slots" % r["slots"]
    return "%s %s" % (r["split"], budget)


def grid(d):
    cols, accs, rows, cells = [], [], [], {}
    for r in d["results"]:
        if "draft_len" not in r:
            continue
        col = column(r)
        if col not in cols:
            cols.append(col)
        acc = r["draft_accept"]
        if acc not in accs:
            accs.append(acc)
        base = r["policy"].split("-")[1]
        row = (base, r["draft_len"], r["draft_schedule"])
        if row not in rows:
            rows.append(row)
        cells[(col, row, acc)] = r["ratio_to_belady"]
    accs.sort()
    rows.sort(key=lambda x: (x[0], x[2] != "token", x[1]))
    for col in cols:
        print("**%s** (loads / Belady's; columns: ACCEPT)" % col)
        print()
        print("| policy | LEN | schedule | " +
              " | ".join("%.2f" % a for a in accs) + " |")
        print("|---|---:|---|" + "---:|" * len(accs))
        for row in rows:
            vals = []
            for a in accs:
                v = cells.get((col, row, a))
                vals.append("" if v is None else "%.3f" % v)
            print("| %s | %d | %s | %s |" % (row[0], row[1], row[2],
                                             " | ".join(vals)))
        print()


def main():
    d = json.load(sys.stdin)
    if "--grid" in sys.argv[1:]:
        grid(d)
        return
    cols = []
    cells = {}
    online = {}
    order = []
    for r in d["results"]:
        col = column(r)
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
