#!/bin/sh
# Prints the CUDA toolkit of an nvcc as two lines: its root (the folder
# with include/cuda_runtime.h) and its library folder (with libcudart.so
# and libcublas.so).  nvcc itself says where it lives (`nvcc --dryrun`
# prints TOP= and the -L folders it would link with), so a wrapper script
# such as /usr/local/bin/nvcc -> /usr/local/cuda-13.0/bin/nvcc finds the
# real toolkit; without that line the folder above nvcc's bin/ is taken.
# Usage: scripts/cuda-root.sh [NVCC]   (default: nvcc on PATH)
# Exit 1 (and nothing printed) when no toolkit with cudart is found.
set -u
NVCC=${1:-$(command -v nvcc || true)}
[ -n "$NVCC" ] && [ -x "$NVCC" ] || exit 1
tmp=$(mktemp -d /tmp/strata-cudaroot-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
: >"$tmp/x.cu"
dry=$(cd "$tmp" && "$NVCC" --dryrun -c x.cu 2>&1)
top=$(printf '%s\n' "$dry" | sed -n 's/^#\$ TOP=//p' | head -1)
[ -n "$top" ] || top=$(dirname "$(dirname "$NVCC")")
root=$(cd "$top" 2>/dev/null && pwd -P) || exit 1
# the -L folders nvcc links with (stubs excluded), then the usual places
libs=$(printf '%s\n' "$dry" | sed -n 's/^#\$ LIBRARIES=//p' | head -1 |
	tr ' ' '\n' | sed -n 's/^"*-L\([^"]*\)"*$/\1/p' | grep -v '/stubs$')
for d in $libs "$root/lib64" "$root/lib" "$root/targets/x86_64-linux/lib"; do
	if [ -e "$d/libcudart.so" ]; then
		printf '%s\n%s\n' "$root" "$(cd "$d" && pwd -P)"
		exit 0
	fi
done
exit 1
