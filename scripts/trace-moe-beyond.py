#!/usr/bin/python3
"""Convert a moe-beyond routing trace (DeepSeek-V2-Lite, CSV with header
`Layer ID,Batch Number,Token,Activated Expert IDs`, layers 1..26, rows of a
layer in token order; see shared/fixtures/traces/SOURCES.md format D) into
strata's routing-trace JSONL, one line per token per layer:
  {"pos": P, "layer": L, "experts": [...]}
with L = Layer ID - 1 (the dense layer 0 of V2-Lite is not in the trace, so
MoE layer 1 becomes layer 0 of a 26-layer model), P the row index within the
layer, and no weights (computed then weighs the forced experts 1/k each).

usage: trace-moe-beyond.py CSV [CSV...] > trace.jsonl
Several CSV files are concatenated (positions continue), so prompts form one
long token stream.  With --longest, only the CSV with the most tokens is used.
"""
import argparse
import csv
import json
import sys


def read(path):
    layers = {}
    with open(path, newline="") as f:
        r = csv.reader(f)
        head = next(r)
        if [h.strip() for h in head[:2]] != ["Layer ID", "Batch Number"]:
            sys.exit("%s: not a moe-beyond trace (header %r)" % (path, head))
        for row in r:
            ids = json.loads(row[3])
            layers.setdefault(int(row[0]) - 1, []).append(ids)
    n = {len(v) for v in layers.values()}
    if len(n) != 1:
        sys.exit("%s: layers have different token counts %r" % (path, sorted(n)))
    return layers, n.pop()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", nargs="+")
    p.add_argument("--longest", action="store_true")
    a = p.parse_args()
    files = [(f,) + read(f) for f in a.csv]
    if a.longest:
        files = [max(files, key=lambda x: x[2])]
    pos0 = 0
    for path, layers, n in files:
        for t in range(n):
            for l in sorted(layers):
                sys.stdout.write(json.dumps({"pos": pos0 + t, "layer": l,
                                             "experts": layers[l][t]}) + "\n")
        pos0 += n
    sys.stderr.write("trace-moe-beyond: %d files, %d tokens, %d layers\n"
                     % (len(files), pos0, len(files[0][1])))


main()
