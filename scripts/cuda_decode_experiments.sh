#!/bin/bash
# Device-side: decode-step experiments on the 8B shape (run tool: `bash scripts/cuda_decode_experiments.sh`,
# carry [".gl"], after `scripts/cuda_pack.sh build`): tg128 for attention splits of 16 to 512 positions a
# block (context 4096), and, where Nsight Compute is installed, its stall breakdown of the fused attention
# kernel and of the gate/up grouped GEMV.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
tar xJf .gl/pkg.tar.xz -C /tmp || exit 1
export LD_LIBRARY_PATH=/tmp/pkg/lib
. scripts/cuda_libs.sh
B=/tmp/pkg/bin
$B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 3 \
  --variants fused,fused-serial,fused-split16,fused-split64,fused-split128,fused-split512,unfused,unfused-split128 2>&1 |
  tail -11 | tee $OUT/splits.md
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout 150 $NCU --kernel-name regex:'attention_rope|gemv_gptq_tensor_core' --launch-skip 400 --launch-count 6 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    $B/petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 1 -n 8 --variants fused > $OUT/ncu.txt 2>&1
  echo "ncu rc $?"; grep -E "attention_rope|gemv_gptq|Duration|Stall|Achieved Occupancy|Memory Throughput|Registers" $OUT/ncu.txt | head -60
else
  echo "no ncu on this machine"
fi
