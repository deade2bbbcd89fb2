#!/bin/bash
# Device-side, the first call of the session after 49 (one call, under the 10-minute limit):
#   1. the tests of what changed since the last whole GPU suite (session 49, 327 pass at 4041183): the CudaModel
#      suite (the warm copies are 1 MiB since 3bad4f8) and the GPU sessions (~1 min);
#   2. on an H200, the unmet criterion's figures (scripts/cuda_h200_cli.sh: the decode step as fresh processes per
#      channel and at group 128, then the 8B pipeline through the CLI, ~6 min); on any other GPU, the product's 1 MiB
#      warm copies against none as fresh processes, per channel and at group 128 (session 49, an H100: +1.3 to
#      +2.3%), then the whole GPU suite (~3 min).
# Run tool: command `bash scripts/cuda_next.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
GTEST_FILTER='CudaModel*:Backend.Gpu*' BENCH=0 timeout 120 bash scripts/cuda_device_tests.sh 2>&1 | tail -6
if nvidia-smi -L | grep -q H200; then
  timeout 400 bash scripts/cuda_h200_cli.sh
else
  . scripts/cuda_unpack.sh >/dev/null 2>&1
  D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 2 --copy-gbs 3000"
  for G in -1 128 -1 128; do
    for V in fused-wc0 fused; do timeout 60 $D --group $G --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/g$G /"; done
  done
  BENCH=0 timeout 240 bash scripts/cuda_device_tests.sh 2>&1 | tail -8
fi
