#!/bin/sh
# Packs the CUDA build's test and benchmark binaries with the shared libraries they need (those not in a bare
# CUDA image: no Debian dev packages there) into .gl/pkg.tar.xz, for a GPU machine that runs them from the
# repository root:
#   tar xJf .gl/pkg.tar.xz -C /tmp && LD_LIBRARY_PATH=/tmp/pkg/lib /tmp/pkg/bin/petrel_tests --gtest_filter='*Cuda*'
# cuBLAS and cuSOLVER (hundreds of MB) are not packed: scripts/cuda_libs.sh finds the GPU machine's own.
# The tests find tests/data at the absolute path they were built with; link the checkout there if it differs.
set -eu
build=${1:-build-cuda}
rm -rf .gl/pkg && mkdir -p .gl/pkg/bin .gl/pkg/lib
for b in "$build/tests/petrel_tests" "$build/petrel" "$build"/bench/petrel_bench_*; do
  [ -x "$b" ] && strip -o ".gl/pkg/bin/$(basename "$b")" "$b"
done
ldd "$build/tests/petrel_tests" "$build/petrel" | awk '/=>/{print $3}' | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink)\.so' | while read -r lib; do cp -L "$lib" .gl/pkg/lib/; done
tar cJf .gl/pkg.tar.xz -C .gl pkg
rm -rf .gl/pkg
ls -la .gl/pkg.tar.xz
