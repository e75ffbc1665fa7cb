#!/bin/sh
# Configures (once) and builds strata into ./build: everything, the ninja
# targets given, or with --programs only strata, the three daemons and
# computed's CUDA module where the build has one (what scripts/main-job.sh
# runs; scripts/test.sh builds everything, the tests too).
set -eu
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
	meson setup build --buildtype=debugoptimized
fi
if [ "${1:-}" = --programs ]; then
	shift
	set -- cli/strata expertd/expertd kvd/kvd computed/computed "$@"
	if ninja -C build -t query computed/device/cuda/libstrata_cw_cuda.so >/dev/null 2>&1; then
		set -- "$@" computed/device/cuda/libstrata_cw_cuda.so
	fi
fi
ninja -C build "$@"
