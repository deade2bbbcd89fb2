# Sourced by the device-side scripts (cuda_device_tests.sh, cuda_8b_bench.sh, cuda_json_bench.sh,
# cuda_cpu_bundle_on_gpu.sh, cuda_decode_experiments.sh), run from the repository root on the GPU machine: unpacks
# the binaries `scripts/cuda_pack.sh build` packed into .gl/pkg.tar.xz to /tmp/pkg, makes the checkout reachable
# at the path the tests were built with (/work/main: they find tests/data there) and build/petrel point at the
# packed CLI, puts the packed and the machine's CUDA libraries on LD_LIBRARY_PATH, and sets
#   OUT (default /tmp/out, created), B (the packed binaries' folder), P (the packed petrel).
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tar xJf .gl/pkg.tar.xz -C /tmp || exit 1
if [ ! -d /work/main/tests/data ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
if [ ! -e /work/main/build/petrel ] || [ -L /work/main/build/petrel ]; then mkdir -p /work/main/build && ln -sf /tmp/pkg/bin/petrel /work/main/build/petrel; fi
export LD_LIBRARY_PATH=/tmp/pkg/lib
. scripts/cuda_libs.sh
B=/tmp/pkg/bin
P=$B/petrel
