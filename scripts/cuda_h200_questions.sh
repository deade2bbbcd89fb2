#!/bin/bash
# Device-side: the decode-step questions only an H200 answers (issue 6's tg128 target is set there, and since
# session 34 every call but a few got an H100). Run tool: command `bash scripts/cuda_h200_questions.sh`, carry
# [".gl/pkg.tar.xz"], after `sh scripts/cuda_pack.sh build`. On any GPU: the tensor-copy and fused-step tests. On
# an H200 only, by default:
#   A. the tensor-copy GEMV (gemv_tma) against the register GEMV, alone (--tma) and in the step (-tmagS, -tmaqS,
#      -tmadS); the 4-bit GEMV from L2 against from memory (--l2-hot); a block timeline of the default step;
#      session 35's capped builds (-late00-uz0) per channel and at group 128;
#   B. the step's knobs tuned on H100s in sessions 28-35 (carveout, L2 prefetch per product, splits, late batches)
#      swept per channel and at group 128, each against `fused` in the same run.
# Each section's output goes to $OUT (OUT as cuda_unpack.sh sets it) and is packed into $OUT/all.tgz at the end
# (the run tool returns at most 8 files). docs/PERFORMANCE.md, "session 39", says what each answer would decide.
#   C (any GPU, only when named: answered on an H100 in session 39, slower): gate/up's blocks resident during
#      attention and o (o in 8 slices, 100% carveout), with tensor-copy stages asked for before their wait.
# SECTIONS=AC (say) runs those sections (default AB); the H200 check applies to A and B.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
SECTIONS=${SECTIONS:-AB}
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
h200=0; nvidia-smi -L | grep -q H200 && h200=1
t0=$(date +%s)
at() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
DECODE="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"  # word-split on purpose below

$B/petrel_tests --gtest_filter='*GemvTma*:*FusedStep*' > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" $OUT/tests.log | head

if [ $h200 = 1 ] && [[ $SECTIONS == *A* ]]; then
  at "A: gemv alone"
  timeout 150 $B/petrel_bench_gemv_cuda --reps 10 --calls 40 --tma 1,2,3 --tma-splits 0,1 \
    --shapes 28672x4096,4096x14336,6144x4096 > $OUT/a_gemv_tma.md 2>&1; tail -20 $OUT/a_gemv_tma.md
  for hot in "" --l2-hot; do
    timeout 60 $B/petrel_bench_gemv_cuda --reps 10 --calls 40 $hot --shapes 28672x1024,28672x2048,28672x4096,4096x14336 2>&1 |
      tee -a $OUT/a_gemv_l2.md | grep -E "^. [0-9]|l2-hot|copy" | head -12
  done
  at "A: the step"
  timeout 200 $DECODE --group -1 --reps 3 --variants fused,fused-tmaq1-tmag1,fused-tmag1,fused-tmad1,fused-tmad1-tmaq1-tmag1,fused-carve100,fused-carve100-tmag2,fused,fused-tmaq1-tmag1 \
    > $OUT/a_step_tma.md 2>&1; tail -14 $OUT/a_step_tma.md
  timeout 60 $DECODE --group -1 --reps 1 -n 16 --variants fused --timeline $OUT/a_timeline.csv > /dev/null 2>&1
  python3 scripts/timeline_report.py $OUT/a_timeline.csv --blocks > $OUT/a_timeline.md 2>&1; head -40 $OUT/a_timeline.md
  timeout 150 $DECODE --group -1,128 --reps 3 --variants fused,fused-late00-uz0,fused,fused-late00-uz0 > $OUT/a_s35.md 2>&1
  tail -12 $OUT/a_s35.md
fi

if [[ $SECTIONS == *C* ]]; then
  at "C: gate/up resident during attention and o"
  timeout 200 $DECODE --group -1 --reps 2 --variants fused,fused-splits-0-8-0-0-carve100,fused-splits-0-8-0-0-carve100-tmag3,fused-splits-0-8-0-0-carve100-tmag2,fused-splits-0-8-0-0-carve100-tmag1,fused-carve100-tmag3,fused \
    > $OUT/c_resident.md 2>&1; tail -12 $OUT/c_resident.md
  timeout 60 $DECODE --group -1 --reps 1 -n 16 --variants fused,fused-splits-0-8-0-0-carve100 --timeline $OUT/c_timeline.csv > /dev/null 2>&1
  python3 scripts/timeline_report.py $OUT/c_timeline.csv > $OUT/c_timeline.md 2>&1; head -40 $OUT/c_timeline.md
fi

if [ $h200 = 1 ] && [[ $SECTIONS == *B* ]]; then
  at "B: knobs per channel"
  timeout 330 $DECODE --group -1 --reps 2 --variants fused,fused-carve100,fused-carve80,fused-pfg16,fused-pfg0,fused-pfq16,fused-pfo0,fused-pfd16,fused,fused-splits-0-8-0-0,fused-splits-8-0-0-0,fused-splits-0-0-0-8,fused-splits-0-0-0-32,fused-late00,fused-late10,fused-late01,fused \
    > $OUT/b_knobs_pc.md 2>&1; tail -22 $OUT/b_knobs_pc.md
  at "B: knobs at group 128"
  timeout 200 $DECODE --group 128 --reps 2 --variants fused,fused-carve100,fused-carve80,fused-pfg16,fused-pfg0,fused-pfq16,fused-splits-0-8-0-0,fused-splits-0-0-0-8,fused \
    > $OUT/b_knobs_g128.md 2>&1; tail -14 $OUT/b_knobs_g128.md
fi
at "done"
tar czf /tmp/all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/all.tgz "$OUT"/
