#!/bin/bash
# Device-side, the first call of the session after 49 (one call, under the 10-minute limit; session 49 got no
# machine, so this is session 48's plan with the GPU suite first):
#   1. the whole GPU suite (~1.5 min): unrun on a GPU since session 47; new since then the warm copies' timing
#      check (CudaModel.WarmCopiesChangeNoLogits, c4f2bee) and the GPU KV save/restore
#      (Backend.GpuSessionSavesAndRestoresItsKvCacheInTheCpusFormat, af2ba2b);
#   2. on an H200, the unmet criterion's figures (scripts/cuda_h200_cli.sh: the decode step as fresh processes per
#      channel and at group 128, then the 8B pipeline through the CLI, ~6 min) and the step without the warm copies
#      once (their gain on an H200); on any other GPU, scripts/cuda_idle_check.sh (~3 min: does the copies' gain
#      survive the GPU idling; clocks logged to $OUT/clocks.csv).
# Run tool: command `bash scripts/cuda_next.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
BENCH=0 timeout 120 bash scripts/cuda_device_tests.sh 2>&1 | tail -12
if nvidia-smi -L | grep -q H200; then
  timeout 380 bash scripts/cuda_h200_cli.sh
  . scripts/cuda_unpack.sh >/dev/null 2>&1
  timeout 50 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --copy-gbs 4800 --group -1 \
    --variants fused-wc0 2>&1 | grep -E "^. fused|rror" | sed "s/^/g-1 /"
else
  bash scripts/cuda_idle_check.sh
fi
