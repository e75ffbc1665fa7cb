#!/bin/sh
# The main job end to end on a fresh Debian 12 machine: installs packages,
# builds what it runs (strata and the three daemons; the tests are built by
# scripts/test.sh), converts the embedded kjv-moe model to a store with
# MXFP4 experts (first time only), starts expertd, kvd and computed on a
# private instance, generates text, prints the metrics summary and stops
# the daemons.
# The demo samples (temperature 0.8, top-p 0.95, seed 1: the same text each
# time): greedy decoding of this small model repeats itself within a line
# ("to the king of Babylon, and to the king of Babylon, ...").  Extra
# arguments go to `strata run` and win (--temperature 0 for greedy; see
# build/cli/strata run --help).
set -eu
cd "$(dirname "$0")/.."
./scripts/setup-debian.sh >&2
./scripts/build.sh --programs >&2
exec ./build/cli/strata run --model models/kjv-moe \
	--prompt "And it came to pass, when the king heard" --max-tokens 48 \
	--temperature 0.8 --top-p 0.95 --seed 1 "$@"
