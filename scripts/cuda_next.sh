#!/bin/bash
# Device-side, prepared in session 51 (one call, under the 10-minute limit; no machine was lent to run it):
#   1. the CudaModel suite and the GPU sessions (~1-2 min), among them CudaModel.StashedKvRowsComeBackExactly (new:
#      every layer's KV rows round-trip a stash exactly, also after it grew) and
#      Backend.GpuSessionsShareTheEngineInTurns;
#   2. what a Session switch costs on the 8B shape (petrel_bench_decode_cuda --stash N, 1,000 and 4,000
#      positions; session 50, a copy a layer: 0.352 / 0.368 and 0.552 / 0.550 ms on an H100). To A/B the strided
#      switch (one cudaMemcpy2DAsync for the keys, one for the values: 8cae7d9, reverted until a GPU has run it),
#      run this once as it is, then `git revert a3b5d8c`, build, pack and run it again;
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
