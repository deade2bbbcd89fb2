#!/bin/bash
# Device-side, session 44: ONE call of at most LIMIT seconds (default 540) on the zero-folded dequantization of the
# tensor-copy GEMV (GemvTmaOptions::fold_zeros 1: 5 instead of 9 instructions a packed word; 2: 7, every code
# under the smaller magic number). Run tool: command `LIMIT=540 bash scripts/cuda_fold_call.sh`, carry
# [".gl/pkg.tar.xz"], after `ninja -C build && sh scripts/cuda_pack.sh build`. Each step is cut to the time left:
#   1. the kernel and step tests (their worst relative L2 per fold printed);
#   2. gemv_tma alone, unfolded and both folds, from memory and from L2 (petrel_bench_gemv_cuda --tma-fold);
#   3. the decode step (tg128) per channel and at group 128 with each fold, and o / down through the tensor copies
#      with the fold; group 128's default (down by tensor copies on an H200) against -tmad0;
#   4. after 2,000 positions; 5. Nsight Compute's stall reasons for gemv_tma at gate/up's shape, fold 0 and 1.
# Everything lands in $OUT/all.tgz.
set -u
t0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l - 5 : 1 )); }
at() { echo "== at $(( $(date +%s) - t0 )) s"; }
. scripts/cuda_unpack.sh >/dev/null 2>&1
W=/tmp/fold; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout $(cap 150) $B/petrel_tests --gtest_filter='*GemvTma*:*CudaModelGptq*:*TensorCopy*:*FusedStep*' > $W/tests.txt 2>&1
grep -E "fold_zeros|zeros folded|FAILED|PASSED|tests ran|Failure|error" $W/tests.txt | head -30; at
G="$B/petrel_bench_gemv_cuda --reps 10 --calls 40 --tma 1 --tma-fold"
timeout $(cap 50) $G --shapes 28672x4096,6144x4096,4096x14336 > $W/gemv_mem.md 2>&1; grep -E "copy|tma|atomic" $W/gemv_mem.md | head -20
timeout $(cap 40) $G --l2-hot --shapes 28672x2048 > $W/gemv_l2.md 2>&1; grep -E "tma|atomic" $W/gemv_l2.md | head -8
timeout $(cap 40) $G --uniform-zeros --shapes 28672x4096:128,4096x14336:128 > $W/gemv_g128.md 2>&1; grep -E "tma|atomic" $W/gemv_g128.md | head -10; at
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"
timeout $(cap 130) $D --group -1 --reps 3 --variants fused,fused-fz1,fused-fz2,fused,fused-fz1,fused-fz2 > $W/step_pc.md 2>&1
grep -E "device|copy|^. fused|unknown" $W/step_pc.md; at
timeout $(cap 130) $D --group 128 --reps 3 --variants fused,fused-fz1,fused-fz2,fused-tmad0,fused,fused-fz1 > $W/step_g128.md 2>&1
grep -E "^. fused|unknown" $W/step_g128.md; at
timeout $(cap 90) $D --group -1 --reps 2 --variants fused-fz1,fused-tmad1-fz1,fused-tmao1-fz1,fused-tmao1-tmad1-fz1 > $W/step_pc_od.md 2>&1
grep -E "^. fused|unknown" $W/step_pc_od.md; at
timeout $(cap 90) $D --group -1,128 --reps 2 -n 64 --depth 2000 --variants fused,fused-fz1 > $W/step_depth.md 2>&1
grep -E "^. fused|unknown" $W/step_depth.md; at
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
stalls=""
for s in long_scoreboard short_scoreboard wait math_pipe_throttle barrier no_instruction lg_throttle mio_throttle not_selected selected branch_resolving dispatch_stall sleeping; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
M="gpu__time_duration.sum,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__issue_active.avg.per_cycle_active,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active$stalls"
for f in 0 1; do
  [ $(left) -gt 30 ] && timeout $(cap 60) $NCU --clock-control none --metrics $M --kernel-name-base demangled \
    -k "regex:gemv_tma_kernel<.*, $f, false>" --launch-skip 3 --launch-count 1 \
    $B/petrel_bench_gemv_cuda --reps 2 --calls 4 --tma 1 --tma-fold --shapes 28672x4096 > $W/ncu_fold$f.txt 2>&1
  echo "## ncu fold $f"; grep -E "gemv_tma_kernel|duration|dram__|inst_executed|issue_active|warps_|stalled" $W/ncu_fold$f.txt | sed 's/  */ /g' | head -24
done; at
tar czf $OUT/all.tgz -C $W .
