#!/bin/bash
# Device-side: where the whole 8B decode step's warps stall, measured on the step as it runs (one CUDA graph
# launch per token, its kernels overlapped through programmatic dependent launch), not kernel by kernel:
# Nsight Compute's graph-level profiling (`--graph-profiling graph`) sums each metric over every kernel of one
# graph launch. Run tool: `bash scripts/ncu_step_stalls.sh`, carry [".gl"], after `scripts/cuda_pack.sh build`.
# FORMATS (default "-1 128"; not GROUPS, which bash sets) picks the formats, VARIANT (default fused) the step.
#
# What it answers (docs/PERFORMANCE.md, session 17): the step moves exactly its weight bytes (DRAM read 4.02 GB
# a token) yet idles the memory ~44% of the time, and its phases are latency chains. The stall reasons say
# which latency: `no_instruction` (instruction-cache misses: each GEMV build is 50-70 KB of code, attention's
# 58 KB, all fetched again by every launch if the SMs' instruction caches do not hold a layer's kernels; the
# session-14 probe that warmed attention's code took ~1 us off it), `imc_miss` (constant-cache misses on the
# kernels' parameters), `long_scoreboard` (global memory), `wait`/`math_pipe_throttle` (fixed-latency
# arithmetic), `barrier`, `membar`, `lg_throttle` (load queue full: blocks need 1.3-2.1 us to issue their
# pre-wait loads).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/pkg ] || tar xJf .gl/pkg.tar.xz -C /tmp || exit 1
export LD_LIBRARY_PATH=/tmp/pkg/lib
. scripts/cuda_libs.sh
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
stalls=""
for s in no_instruction imc_miss long_scoreboard short_scoreboard wait math_pipe_throttle barrier membar \
         lg_throttle mio_throttle not_selected selected branch_resolving dispatch_stall drain sleeping tex_throttle; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
metrics="gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,smsp__cycles_active.avg,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_per_inst_issued.ratio$stalls"
for g in ${FORMATS:--1 128}; do
  # --launch-skip passes the random weights' build kernels (a few hundred) and lands on the bench's graph launches.
  timeout 240 "$NCU" --graph-profiling graph --cache-control none --clock-control none --launch-skip 400 --launch-count 1 \
    --metrics "$metrics" /tmp/pkg/bin/petrel_bench_decode_cuda --preset llama-3.1-8b --group "$g" --reps 1 -n 32 \
    --prompt 0 --variants "${VARIANT:-fused}" > "$OUT/ncu_stalls_$g.txt" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || grep -q "Failed to find metric\|ERROR" "$OUT/ncu_stalls_$g.txt"; then
    # A metric name this ncu does not know: the section's own metrics, every raw value printed.
    timeout 240 "$NCU" --graph-profiling graph --cache-control none --clock-control none --launch-skip 400 --launch-count 1 \
      --section WarpStateStats --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum --page raw \
      /tmp/pkg/bin/petrel_bench_decode_cuda --preset llama-3.1-8b --group "$g" --reps 1 -n 32 --prompt 0 \
      --variants "${VARIANT:-fused}" > "$OUT/ncu_stalls_$g.txt" 2>&1
    rc=$?
  fi
  echo "== group $g: ncu rc $rc"
  grep -E "Profiling|gpu__time|dram__|inst_executed|cycles_active|warps_active|latency_per|stalled" "$OUT/ncu_stalls_$g.txt" |
    sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -40
done
