#!/bin/sh
# The V4.1 benchmark under its old name: scripts/bench-dsv.sh --model v41
# (its options and figures: bench-dsv.sh --help).
exec "$(dirname "$0")/bench-dsv.sh" --model v41 "$@"
