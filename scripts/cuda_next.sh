#!/bin/bash
# Device-side, session 50's last call (one call, ~4 min): the two-warps-a-row-group build of the tensor-copy GEMV
# (GemvTmaOptions::warp_halves; docs/PERFORMANCE.md, session 50's reading: on the H200 the consumer's ~4.3 TB/s,
# latency-bound at ~3.3 warps a scheduler, sets the loops' rate):
#   1. its tests (KernelsCuda.GemvTmaMatchesReference, the fused step's variants);
#   2. the consumer's rate with and without it, from L2 (--l2-hot) and from memory;
#   3. the decode step with and without it as fresh processes: group 128 (tensor copies by default on Hopper) and
#      per channel with q/k/v and gate/up forced through tensor copies (the H200's default).
# Run tool: command `bash scripts/cuda_next.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
GTEST_FILTER='KernelsCuda.GemvTma*:Groups/CudaModelGptq.FusedStep*' BENCH=0 timeout 90 bash scripts/cuda_device_tests.sh 2>&1 | tail -5
. scripts/cuda_unpack.sh >/dev/null 2>&1
for H in --l2-hot ""; do
  timeout 60 $B/petrel_bench_gemv_cuda --reps 7 --calls 40 $H --tma 1 --tma-halves 1,2 \
    --shapes 28672x512,28672x2048,4096x14336 2>&1 | grep -E "tma|shape|GB/s" | head -20
done
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 2 --copy-gbs 3000"
for pass in 1 2; do
  for V in fused fused-tmah2; do timeout 40 $D --group 128 --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/g128 /"; done
  for V in fused-tmaq1-tmag1 fused-tmaq1-tmag1-tmah2; do timeout 40 $D --group -1 --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/pc /"; done
done
