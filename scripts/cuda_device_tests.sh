#!/bin/bash
# Device-side runner for the GPU machine (the `run` tool): the whole test suite and the 8B decode bench, from
# binaries packed here by `scripts/cuda_pack.sh build` into .gl/pkg.tar.xz (the GPU machine has no Debian dev
# packages). Usage from the run tool: command `bash scripts/cuda_device_tests.sh`, carry [".gl"]. $OUT receives
# tests.log and the bench logs. BENCH=0 skips the benches; GTEST_FILTER narrows the tests.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
nvidia-smi -L
t0=$(date +%s)
$B/petrel_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > $OUT/tests.log 2>&1; echo "tests rc $? in $(( $(date +%s) - t0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|SKIPPED \]" $OUT/tests.log | head -30
[ "${BENCH:-1}" = 0 ] && exit 0
$B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1,128 --reps 3 --kernels 2>&1 | tee $OUT/bench_decode_8b.log | tail -60
