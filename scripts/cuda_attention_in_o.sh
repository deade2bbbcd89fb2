#!/bin/bash
# Device-side: the attention inside o's launch (CudaModelOptions::decode_attention_in_o, kernels/cuda/
# gemv_attention.cuh; docs/PERFORMANCE.md session 30): its GPU tests, then tg128 against the default step on the
# 8B shape (per channel and group 128), then a few positions past 900 (several chunks a block). Run tool: `bash
# scripts/cuda_attention_in_o.sh`, carry [".gl"], after `sh scripts/cuda_pack.sh build`. ~5 minutes; logs in $OUT.
# TIMELINE=1 also records a block timeline of both steps and prints scripts/timeline_report.py's tables.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 150 $B/petrel_tests --gtest_filter='KernelsCuda.GemvAttention*:Groups/CudaModelGptq.Fused*' > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|SKIPPED \]|worst|attention in o|Failure|Expected|Which is|actual" $OUT/tests.log | head -40
t0=$(date +%s)
timeout 240 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1,128 --reps 3 --prompt 0 \
  --variants fused,fused-ain8,fused-ain4,fused,fused-ain8 > $OUT/ab.log 2>&1
echo "tg128 rc $? in $(( $(date +%s) - t0 )) s"
grep -E "copy|^\| *fused" $OUT/ab.log | cut -c1-110
t0=$(date +%s)
timeout 100 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 2 -n 64 --prompt 0 --depth 900 \
  --variants fused,fused-ain8 > $OUT/depth.log 2>&1
echo "tg64 after 900 rc $? in $(( $(date +%s) - t0 )) s"
grep -E "^\| *fused" $OUT/depth.log | cut -c1-110
if [ "${TIMELINE:-0}" = 1 ]; then
  timeout 120 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 1 -n 16 --prompt 0 \
    --variants fused,fused-ain8 --timeline $OUT/timeline.csv > $OUT/timeline.log 2>&1
  python3 scripts/timeline_report.py $OUT/timeline.csv --layer-bins 20
fi
