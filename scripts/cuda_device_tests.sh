#!/bin/bash
# Device-side runner for the GPU machine (the `run` tool): the whole test suite and the 8B decode bench, from
# binaries packed here by `scripts/cuda_pack.sh build` into .gl/pkg.tar.xz (the GPU machine has no Debian dev
# packages). Usage from the run tool: command `bash scripts/cuda_device_tests.sh`, carry [".gl"]. $OUT receives
# tests.log and the bench logs.
set -u
tar xJf .gl/pkg.tar.xz -C /tmp || exit 1
if [ ! -d /work/main/tests/data ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
mkdir -p /work/main/build && ln -sf /tmp/pkg/bin/petrel /work/main/build/petrel
export LD_LIBRARY_PATH=/tmp/pkg/lib
. scripts/cuda_libs.sh
B=/tmp/pkg/bin
nvidia-smi -L
$B/petrel_tests 2>&1 > $OUT/tests.log; echo "tests rc $?"
grep -E "PASSED|FAILED|SKIPPED \]" $OUT/tests.log | head -20
$B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 3 2>&1 | tail -4 | tee $OUT/bench_8b.log
$B/petrel_bench_decode_cuda --preset llama-3.1-8b --group 128 --reps 3 2>&1 | tail -4 | tee $OUT/bench_8b_g128.log
