#!/bin/sh
# Configures (once) and builds strata into ./build.
set -eu
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
	meson setup build --buildtype=debugoptimized
fi
ninja -C build
