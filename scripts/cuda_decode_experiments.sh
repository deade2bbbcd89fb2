#!/bin/bash
# Device-side: decode-step experiments on the 8B shape (run tool: `bash scripts/cuda_decode_experiments.sh`,
# carry [".gl"], after `scripts/cuda_pack.sh build`): tg128 and the 29-token prompt time for the fused step's
# variants (serial, the defaults, cluster split-K) and the unfused one with attention splits (the fused
# attention kernel ignores splits), the GEMV sweep (fixed k_splits, cluster reduction, loads-only reads with 8
# and 16 loads in flight), and, where Nsight Compute is installed, its stall breakdown of the fused attention
# kernel and of the grouped GEMVs.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
$B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 3 \
  --variants fused-serial,fused,fused-cluster,unfused,unfused-split16,unfused-split128 2>&1 |
  tail -9 | tee $OUT/variants.md
timeout 200 $B/petrel_bench_gemv_cuda --sweep --reps 10 > $OUT/gemv_sweep.md 2>&1
grep -E "^\| [0-9]+ x|auto" $OUT/gemv_sweep.md | head -30
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 150 $NCU --kernel-name regex:'attention_rope|gemv_gptq_tensor_core' --launch-skip 400 --launch-count 6 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    $B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 1 -n 8 --variants fused > $OUT/ncu.txt 2>&1
  echo "ncu rc $?"; grep -E "attention_rope|gemv_gptq|Duration|Stall|Achieved Occupancy|Memory Throughput|Registers" $OUT/ncu.txt | head -60
else
  echo "no ncu on this machine"
fi
