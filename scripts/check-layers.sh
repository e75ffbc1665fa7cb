#!/bin/sh
# check-layers.sh — no source file includes a header of a higher layer
# (docs/DESIGN.md section 10 "Layout").  Layers, lowest first; a folder
# may include its own headers and those of lower layers only, and two
# folders of the same rank are peers that include neither's headers:
#   0 common/base (errors, logging, utilities, shared memory)
#   1 proto   2 common (the rest)   3 expertd, kvd (peers)
#   4 computed/kernels   5 computed/device (with device/cuda)
#   6 computed/models (with models/deepseek)   7 computed/routing
#   8 computed/serve   9 cli   10 bench
# Headers are found by the name in the #include (every header name is
# unique in these folders); includes of a name found nowhere here
# (system headers, tests' own) are ignored.  There are no exceptions.
#
# Usage: scripts/check-layers.sh [ROOT]   (default: the source tree)
# Exit: 0, or 1 listing every violation as "file: includes X (layer)".
set -eu
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

dirs="common proto expertd kvd computed cli bench"
# one pass: "header folder" lines, then "file: include" lines, into awk
{
	find $dirs -name '*.h' | sed 's|^\(.*\)/\([^/]*\)$|H \2 \1|'
	find $dirs \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -print0 |
		xargs -0 grep -H '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' |
		sed 's|^\([^:]*\):[^"]*"\([^"]*\)".*|I \1 \2|'
} | awk '
function layer(d) {
	if (d ~ /^common\/base(\/|$)/) return "0 common/base"
	if (d ~ /^proto(\/|$)/) return "1 proto"
	if (d ~ /^common(\/|$)/) return "2 common"
	if (d ~ /^expertd(\/|$)/) return "3 expertd"
	if (d ~ /^kvd(\/|$)/) return "3 kvd"
	if (d ~ /^computed\/kernels(\/|$)/) return "4 computed/kernels"
	if (d ~ /^computed\/device(\/|$)/) return "5 computed/device"
	if (d ~ /^computed\/models(\/|$)/) return "6 computed/models"
	if (d ~ /^computed\/routing(\/|$)/) return "7 computed/routing"
	if (d ~ /^computed\/serve(\/|$)/) return "8 computed/serve"
	if (d ~ /^cli(\/|$)/) return "9 cli"
	if (d ~ /^bench(\/|$)/) return "10 bench"
	return ""
}
$1 == "H" { hdir[$2] = $3; next }
$1 == "I" {
	f = $2; b = $3; sub(/.*\//, "", b)
	if (!(b in hdir)) next
	dir = f; sub(/\/[^\/]*$/, "", dir)
	lf = layer(dir); lh = layer(hdir[b])
	if (lf == "" || lh == "") next
	n_inc++
	split(lf, F, " "); split(lh, T, " ")
	if (T[2] == F[2] || T[1] + 0 < F[1] + 0) next
	printf "%s: includes %s/%s (layer %s, above or beside %s)\n", f, hdir[b], b, lh, lf
	n_bad++
}
END {
	printf "%d includes between layers\047 folders checked, %d violations\n", n_inc, n_bad
	exit n_bad > 0
}'
