#!/usr/bin/env bash
# Builds .deps/cuda/lib/stubs/libcuda.so: a link-time stand-in for the CUDA
# driver library, which is not on PyPI (it ships with the NVIDIA driver).
# candle links cudarc "dynamic-linking", so the linker must find libcuda.so;
# the binary records only its soname (libcuda.so.1) and, on the GPU machine,
# loads the driver's real one. This is what the CUDA toolkit's own
# lib64/stubs/libcuda.so is: every driver API symbol, no code behind it.
set -euo pipefail
cuda="${1:-.deps/cuda}"
out="$cuda/lib/stubs/libcuda.so"
[ -f "$out" ] && [ "$out" -nt "$cuda/include/cuda.h" ] && exit 0
mkdir -p "$cuda/lib/stubs"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# After the preprocessor, the versioned macros (cuCtxCreate → cuCtxCreate_v4)
# are resolved, so the names are the symbols callers link against.
gcc -E -P -I"$cuda/include" "$cuda/include/cuda.h" \
    | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d '( \t' | sort -u \
    | awk '{print "void " $1 "(void) {}"}' > "$tmp/stub.c"
n=$(wc -l < "$tmp/stub.c")
[ "$n" -gt 300 ] || { echo "cuda_stub: only $n driver symbols found in $cuda/include/cuda.h" >&2; exit 1; }
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$out.tmp" "$tmp/stub.c"
mv "$out.tmp" "$out"
echo "cuda_stub: $out ($n symbols, soname libcuda.so.1)"
