#!/bin/sh
# The V4 benchmark under its old name: scripts/bench-dsv.sh --model v4
# (its options and figures: bench-dsv.sh --help).
exec "$(dirname "$0")/bench-dsv.sh" --model v4 "$@"
