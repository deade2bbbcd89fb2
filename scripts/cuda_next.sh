#!/bin/bash
# Device-side, the first call of session 50 (one call, under the 10-minute limit):
#   1. the tests of what changed since the last whole GPU suite (session 49, 327 pass at 4041183): the CudaModel
#      suite and the GPU sessions, among them Backend.GpuSessionsShareTheEngineInTurns (01e641b: the engine's
#      Sessions take turns on the GPU) (~1-2 min);
#   2. what a session switch costs on the 8B shape (petrel_bench_decode_cuda --stash N: the owner's KV rows set
#      aside on the GPU and the next one's brought back, at 1,000 and 4,000 positions);
#   3. on an H200, the unmet criterion's figures (scripts/cuda_h200_cli.sh: the decode step as fresh processes per
#      channel and at group 128, then the 8B pipeline through the CLI, ~6 min); on any other GPU the whole GPU
#      suite (~3 min).
# Run tool: command `bash scripts/cuda_next.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
GTEST_FILTER='CudaModel*:Backend.Gpu*' BENCH=0 timeout 110 bash scripts/cuda_device_tests.sh 2>&1 | tail -6
. scripts/cuda_unpack.sh >/dev/null 2>&1
for N in 1000 4000; do
  timeout 45 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 1 -n 8 --group -1 --copy-gbs 4000 \
    --variants fused --stash $N 2>&1 | grep -E "session switch|rror"
done
if nvidia-smi -L | grep -q H200; then
  timeout 390 bash scripts/cuda_h200_cli.sh
else
  BENCH=0 timeout 240 bash scripts/cuda_device_tests.sh 2>&1 | tail -8
fi
