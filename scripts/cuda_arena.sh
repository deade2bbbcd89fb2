#!/bin/bash
# Device-side, session 45: the weights in one allocation (CudaModelOptions::weight_arena, default) against one
# cudaMalloc a tensor (--no-arena), both as the CLI places them (--copy-gbs: no 2 GiB copy measurement first),
# and the arena after the copy measurement; then the GPU tests (GTEST_FILTER, default the CUDA suites).
# Run tool: command `bash scripts/cuda_arena.sh`, carry [".gl/pkg.tar.xz"], after `sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --variants fused"
for g in 128 -1; do
  for f in "--copy-gbs 3000 --no-arena" "--copy-gbs 3000" "--copy-gbs 3000 --no-arena" "--copy-gbs 3000" ""; do
    echo "group $g [$f]"
    timeout 60 $D --group $g $f 2>&1 | grep -E "^. fused|unknown|rror|usage"
  done
done
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-170} $B/petrel_tests --gtest_filter="${GTEST_FILTER:-*Cuda*}" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|SKIPPED \]" $OUT/tests.log | head -20
