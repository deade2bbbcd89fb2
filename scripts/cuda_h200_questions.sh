#!/bin/bash
# Device-side: the decode-step questions only an H200 answers (issue 6's tg128 target is set there, and since
# session 34 most calls got an H100). Run tool: command `bash scripts/cuda_h200_questions.sh`, carry
# [".gl/pkg.tar.xz"], after `sh scripts/cuda_pack.sh build`. On any GPU: the tensor-copy and fused-step tests. On
# an H200 only, by default:
#   A. (session 40's open items; on an H100 session 41 answered the group-128 ones: +3.2%, now the default there)
#      group 128 through the tensor-copy GEMV (gemv_tma's grouped build): alone (--uniform-zeros --tma) and in the
#      step (the default, CudaModelOptions::kTmaAuto, against the register GEMVs, -tmad0-tmaq0-tmag0 at group
#      128); o through it (-tmao1) and down not through it (-tmad0: by tensor copies is the default there since
#      session 43); the per-channel default (tensor copies on an H200) against the register step; block
#      timelines at group 128 and per channel (gemv_tma stamps them since session 41: the default and the register
#      step side by side);
#   B. the step's knobs tuned on H100s in sessions 28-35 (carveout, L2 prefetch per product, splits, late batches)
#      swept per channel and at group 128, each against `fused` in the same run (answered in session 40: they
#      hold; rerun after a change to the step).
# Each section's output goes to $OUT (OUT as cuda_unpack.sh sets it) and is packed into $OUT/all.tgz at the end
# (the run tool returns at most 8 files). docs/PERFORMANCE.md, "session 40", says what each answer would decide;
# session 39's section A (the tensor-copy GEMV against the register one per channel) is answered there.
#   C (any GPU, only when named: answered on an H100 in session 39, slower): gate/up's blocks resident during
#      attention and o (o in 8 slices, 100% carveout), with tensor-copy stages asked for before their wait.
#   P (any GPU, only when named and .gl/l2.tar.xz is carried; answered on an H100 in session 42, slower): session
#      41's L2 prefetch past the tensor-copy ring.
#   L (any GPU, default): the GEMVs' consumer rate from L2 (--l2-hot) against the same shapes from memory.
# SECTIONS=AC (say) runs those sections (default A and L; B, C and P when named); the H200 check applies to A and B.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
SECTIONS=${SECTIONS:-AL}
nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
$P doctor 2>&1 | grep -A2 "^gpus"  # the peak memory bandwidth the tensor-copy default reads
h200=0; nvidia-smi -L | grep -q H200 && h200=1
t0=$(date +%s)
at() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
DECODE="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"  # word-split on purpose below

if [ "${QUESTIONS_NO_TESTS:-0}" != 1 ]; then  # QUESTIONS_NO_TESTS=1: the benches only
  $B/petrel_tests --gtest_filter='*GemvTma*:*FusedStep*:*TensorCopy*:*Timeline*' > $OUT/tests.log 2>&1
  echo "tests rc $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" $OUT/tests.log | head
fi

if [ $h200 = 1 ] && [[ $SECTIONS == *A* ]]; then
  # Session 40's open items: group 128 through the tensor-copy GEMV (alone, then in the step: the default since
  # session 41), o and down through it, and the per-channel default (tensor copies on an H200) against the register step.
  at "A: gemv alone at group 128"
  timeout 60 $B/petrel_bench_gemv_cuda --reps 10 --calls 40 --uniform-zeros --tma 1,2 \
    --shapes 28672x4096:128,6144x4096:128,4096x4096:128,4096x14336:128,4096x4096 > $OUT/a_gemv_g128.md 2>&1
  grep -E "^. [0-9]|copy" $OUT/a_gemv_g128.md
  at "A: the step"
  timeout 100 $DECODE --group 128 --reps 3 --variants fused,fused-tmad0-tmaq0-tmag0,fused-tmao1,fused-tmad0,fused,fused-tmad0-tmaq0-tmag0 \
    > $OUT/a_step_g128.md 2>&1; grep -E "^. fused|unknown" $OUT/a_step_g128.md
  timeout 90 $DECODE --group -1 --reps 3 --variants fused,fused-tmaq0-tmag0,fused-tmao1,fused,fused-tmaq0-tmag0 \
    > $OUT/a_step_pc.md 2>&1; grep -E "^. fused|unknown" $OUT/a_step_pc.md
  timeout 60 $DECODE --group 128 --reps 1 -n 16 --variants fused,fused-tmad0-tmaq0-tmag0 --timeline $OUT/a_timeline.csv > /dev/null 2>&1
  python3 scripts/timeline_report.py $OUT/a_timeline.csv --blocks > $OUT/a_timeline.md 2>&1; head -30 $OUT/a_timeline.md
  # The per-channel default (tensor copies; gemv_tma's stamps since session 41) against the register step.
  timeout 60 $DECODE --group -1 --reps 1 -n 16 --variants fused,fused-tmaq0-tmag0 --timeline $OUT/a_timeline_pc.csv > /dev/null 2>&1
  python3 scripts/timeline_report.py $OUT/a_timeline_pc.csv --blocks > $OUT/a_timeline_pc.md 2>&1; head -40 $OUT/a_timeline_pc.md
fi

if [[ $SECTIONS == *L* ]]; then
  # Session 42: the consumers' rate when memory is not the limit (one copy of the weights, read from L2 where it
  # fits): the marginal us between sizes says how fast each kernel eats bytes it does not wait for, i.e. whether
  # a step that streams weights ahead of its latency chains (docs/RESIDENT_STEP.md) has a consumer to feed.
  at "L: consumers from L2"
  timeout 120 $B/petrel_bench_gemv_cuda --reps 10 --calls 40 --l2-hot --tma 1,2 \
    --shapes 28672x512,28672x1024,28672x2048,28672x3072,4096x14336,4096x7168 > $OUT/l_gemv_l2hot.md 2>&1
  grep -E "^. [0-9]|copy|read" $OUT/l_gemv_l2hot.md
  timeout 120 $B/petrel_bench_gemv_cuda --reps 10 --calls 40 --tma 1,2 \
    --shapes 28672x512,28672x1024,28672x2048,28672x3072,4096x14336,4096x7168 > $OUT/l_gemv_dram.md 2>&1
  grep -E "^. [0-9]" $OUT/l_gemv_dram.md
fi

if [[ $SECTIONS == *P* ]] && [ -f .gl/l2.tar.xz ]; then
  # Session 41's L2 prefetch past the tensor-copy ring (2581f40 + 9dcbb8e, reverted on main): binaries built with
  # the two commits picked (`git cherry-pick -n 2581f40 9dcbb8e`, then the decode bench stripped into
  # .gl/l2.tar.xz as l2/). -tmalN: N stages a warp past the ring asked into L2 before the wait; -tmalN1: and kept
  # N ahead through the loop. On an H100 per channel the tensor copies are not the default: -tmaq1-tmag1 first.
  at "P: L2 prefetch past the ring"
  tar xJf .gl/l2.tar.xz -C /tmp
  pc=fused; [ $h200 = 1 ] || pc=fused-tmaq1-tmag1
  timeout 150 /tmp/l2/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --group -1 --reps 3 \
    --variants $pc,$pc-tmal2,$pc-tmal21,$pc,$pc-tmal21,$pc-tmal2,$pc-tmal4 > $OUT/p_pc.md 2>&1; grep -E "^. fused|unknown" $OUT/p_pc.md
  timeout 150 /tmp/l2/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --group 128 --reps 3 \
    --variants fused,fused-tmal2,fused-tmal21,fused,fused-tmal21,fused-tmal2 > $OUT/p_g128.md 2>&1; grep -E "^. fused|unknown" $OUT/p_g128.md
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
