#!/bin/sh
# scripts/gpu-check's build steps here, without a GPU (issue 27): what a
# GPU session runs first must not break unnoticed.  The bundle made from
# this build (--bundle), then gpu-check's bundle way end to end with the
# kernels compiled for one architecture (nvcc, the CPU sources of
# computed/meson.build, the links) and every CUDA test skipping (77) for
# want of a device, its summary and logs in an output folder (2 files);
# then the standalone way's build steps (--build-only), reusing the
# kernels.  On a machine with a device only the build steps run.
# Without nvcc: exit 77.
set -u
B=${STRATA_BUILD_DIR:?}
SRC=${STRATA_SOURCE_DIR:?}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { echo "SKIP: no nvcc (CUDA toolkit) here"; exit 77; }
TMP=$(mktemp -d /tmp/strata-gpucheck-XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM
fail=0
export NVCC GPU_CHECK_ARCH=sm_80 GPU_CHECK_JOBS=2 GPU_CHECK_DEADLINE=500
export GPU_CHECK_BUNDLE="$TMP/bundle"
unset OUT GPU_CHECK_OUT
check() { # file, pattern, what (the file's tail with the first failure)
	grep -q "$2" "$1" && return 0
	echo "FAIL: $3 (no '$2' in $(basename "$1"))"
	[ $fail -eq 0 ] && tail -15 "$1"
	fail=1
}
if [ -x "$B/tests/cuda/test_cuda_ipc" ]; then
	# the bundle from this (already built) CUDA build
	GPU_CHECK_BUILT=1 "$SRC/scripts/gpu-check" --bundle "$B" \
		>"$TMP/bundle.log" 2>&1 ||
		{ echo "FAIL: gpu-check --bundle"; cat "$TMP/bundle.log"; exit 1; }
	[ -x "$TMP/bundle/bin/expertd" ] && [ -f "$TMP/bundle/lib/libstrata_cw_cuda.so" ] ||
		{ echo "FAIL: the bundle lacks expertd or the CUDA module"; exit 1; }
	if "$B/tests/cuda/test_cuda_ipc" probe - -1 x >/dev/null 2>&1; then
		# a device: the build steps only (the tests belong to gpu-check)
		GPU_CHECK_WAY=bundle "$SRC/scripts/gpu-check" --build-only \
			"$TMP/gpu" >"$TMP/way-bundle.log" 2>&1 ||
			{ echo "FAIL: gpu-check --build-only (bundle way):"; tail -20 "$TMP/way-bundle.log"; exit 1; }
		check "$TMP/way-bundle.log" "build only: test_cuda_kernels bench_cuda_gemv" "bundle way build"
	else
		GPU_CHECK_WAY=bundle GPU_CHECK_OUT="$TMP/out" \
			"$SRC/scripts/gpu-check" "$TMP/gpu" >"$TMP/way-bundle.log" 2>&1
		rc=$?
		[ $rc -eq 0 ] || { echo "FAIL: gpu-check (bundle way) exit $rc:"; tail -30 "$TMP/way-bundle.log"; fail=1; }
		S="$TMP/out/gpu-check-summary.txt"
		[ -f "$S" ] || { echo "FAIL: no summary in the output folder"; exit 1; }
		check "$S" "way: bundle" "the bundle way"
		for t in cuda-kernels cuda-experts cuda-attn cuda-ipc cuda-restart kvdev-gpu; do
			check "$S" "$t: SKIPPED" "$t skipped without a device"
		done
		check "$S" "decode tokens/s: NOT MEASURED" "no decode figure"
		n=$(ls "$TMP/out" | wc -l)
		[ "$n" -eq 2 ] || { echo "FAIL: $n files in the output folder, want 2 (summary, logs)"; ls "$TMP/out"; fail=1; }
		tar -tzf "$TMP/out/gpu-check-logs.tar.gz" >"$TMP/tar.list" 2>&1 ||
			{ echo "FAIL: the logs tarball does not read"; fail=1; }
		for l in cuda-kernels.log cuda-restart.log link-test_cuda_kernels.log cw_cu_gemv.o.log; do
			check "$TMP/tar.list" "$l" "log $l in the tarball"
		done
	fi
else
	echo "note: $B is not a CUDA build: the standalone way only"
fi
# the standalone way's build steps (kernels reused when built above)
GPU_CHECK_WAY=standalone "$SRC/scripts/gpu-check" --build-only "$TMP/gpu" \
	>"$TMP/way-standalone.log" 2>&1 ||
	{ echo "FAIL: gpu-check --build-only (standalone way):"; tail -20 "$TMP/way-standalone.log"; fail=1; }
check "$TMP/way-standalone.log" "build only: test_cuda_kernels bench_cuda_gemv" "standalone build"
if [ -f /usr/include/xxhash.h ]; then
	check "$TMP/way-standalone.log" "bench_cuda_gemv test_cuda_ipc" "standalone IPC test build"
fi
[ $fail -eq 0 ] && echo "gpu-check: bundle and standalone ways build here; CUDA tests skip without a device"
exit $fail
