#!/bin/bash
# Device-side, for a session whose device time went on failed starts: ONE call of at most LIMIT seconds (default
# 500) that asks the two questions left open since session 40, each step cut to the time left. Run tool: command
# `LIMIT=380 bash scripts/cuda_lean_call.sh` (LIMIT under the call's limit_s), carry [".gl/pkg.tar.xz"], after
# `sh scripts/cuda_pack.sh build` (rebuild first: the package must hold HEAD's binaries).
#   On an H200 only: the step's default (tensor-copy q/k/v and gate/up; group 128 through gemv_tma's grouped build
#   since session 41, first run on an H200 in session 43; down too there since then) against the register GEMVs
#   (-tmaq0-tmag0 per channel, -tmad0-tmaq0-tmag0 at group 128; and -tmad0 alone), per channel and at group
#   128, and the per-channel block timeline of both (gemv_tma's stamps; timeline_report.py --blocks).
#   On any GPU: Nsight Compute on gemv_tma at gate/up's shape from memory and from L2 (--l2-hot), and on the
#   attention kernel inside the step: is the tensor-copy consumer's ~4.3 TB/s from L2 (session 42) its issue, its
#   stalls or the L2 (SpeedOfLight, WarpStateStats, SourceCounters)?
# Everything lands in $OUT/all.tgz (the run tool returns at most 8 files). Session 43 ran it once on an H200
# (docs/PERFORMANCE.md, session 43: the step's default +2.0% per channel and +4.2% at group 128 over the register
# GEMVs; from L2 gemv_tma is latency-bound at ~3.3 warps a scheduler). The sections print no stall breakdown: for
# one, pass ncu the smsp__average_warps_issue_stalled_* metrics as scripts/ncu_step_stalls.sh does.
set -u
t0=$(date +%s); LIMIT=${LIMIT:-500}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l - 5 : 1 )); }
. scripts/cuda_unpack.sh >/dev/null 2>&1
W=/tmp/lean; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"
if nvidia-smi -L | grep -q H200; then
  timeout $(cap 90) $D --group -1 --reps 3 --variants fused,fused-tmaq0-tmag0,fused,fused-tmaq0-tmag0 > $W/c_pc.md 2>&1; grep -E "device|copy|^. fused|unknown" $W/c_pc.md
  echo "== at $(( $(date +%s) - t0 )) s"
  timeout $(cap 80) $D --group 128 --reps 3 --variants fused,fused-tmad0-tmaq0-tmag0,fused-tmad0,fused > $W/c_g128.md 2>&1; grep -E "^. fused|unknown" $W/c_g128.md
  echo "== at $(( $(date +%s) - t0 )) s"
  timeout $(cap 60) $D --group -1 --reps 1 -n 16 --variants fused,fused-tmaq0-tmag0 --timeline $W/c_timeline_pc.csv > /dev/null 2>&1
  python3 scripts/timeline_report.py $W/c_timeline_pc.csv --blocks > $W/c_timeline_pc.md 2>&1; head -60 $W/c_timeline_pc.md
  echo "== at $(( $(date +%s) - t0 )) s"
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters --section InstructionStats"
[ $(left) -gt 40 ] && timeout $(cap 90) $NCU --clock-control none $SEC -k regex:gemv_tma --launch-skip 3 --launch-count 1 \
  $B/petrel_bench_gemv_cuda --reps 2 --calls 4 --tma 1 --shapes 28672x4096 > $W/ncu_dram.txt 2>&1
echo "== at $(( $(date +%s) - t0 )) s"
[ $(left) -gt 40 ] && timeout $(cap 90) $NCU --clock-control none --cache-control none $SEC -k regex:gemv_tma --launch-skip 3 --launch-count 1 \
  $B/petrel_bench_gemv_cuda --reps 2 --calls 4 --l2-hot --tma 1 --shapes 28672x2048 > $W/ncu_l2.txt 2>&1
echo "== at $(( $(date +%s) - t0 )) s"
[ $(left) -gt 40 ] && timeout $(cap 120) $NCU --clock-control none $SEC -k regex:attention_rope_warm --launch-skip 300 --launch-count 1 \
  $D --group -1 --reps 1 -n 16 --variants fused > $W/ncu_attn.txt 2>&1
echo "== at $(( $(date +%s) - t0 )) s"
for f in ncu_dram ncu_l2 ncu_attn; do [ -f $W/$f.txt ] && { echo "## $f"; grep -E "Duration|Throughput|Issue Slots|Issued Warp|Eligible|Achieved Occ|Registers Per|Warp Cycles Per Issued" $W/$f.txt | head -16; }; done
tar czf $OUT/all.tgz -C $W .
