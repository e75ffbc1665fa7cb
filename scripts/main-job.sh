#!/bin/sh
# The main job end to end on a fresh Debian 12 machine: installs packages,
# builds, converts the embedded kjv-moe model to a store with MXFP4 experts
# (first time only), starts expertd, kvd and computed on a private instance,
# generates text, prints the metrics summary and stops the daemons.
# Extra arguments go to `strata run` (see build/cli/strata run --help).
set -eu
cd "$(dirname "$0")/.."
./scripts/setup-debian.sh >&2
./scripts/build.sh >&2
exec ./build/cli/strata run --model models/kjv-moe \
	--prompt "And it came to pass, when the king heard" --max-tokens 48 "$@"
