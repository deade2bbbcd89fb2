#!/bin/bash
# Device-side, session 44: only on an H200 (exits at once elsewhere): the step's default at group 128 (down through
# the tensor copies there since session 43, 7260881, never run on a GPU before) against -tmad0, per channel and
# group 128 after 2,000 positions too, then the pipeline through the CLI (README's H200 CLI figure was session 34's):
# `FORMATS="pc g128" QUANTIZE_ARGS="--method rtn --no-clip-search" W4ONLY=0 RUNS=2 bash scripts/cuda_8b_bench.sh`.
# Run tool: command `bash scripts/cuda_h200_pipeline.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
nvidia-smi -L | grep -q H200 || { nvidia-smi -L; echo "not an H200: nothing run"; exit 0; }
. scripts/cuda_unpack.sh >/dev/null 2>&1
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"
timeout 70 $D --group 128 --reps 3 --variants fused,fused-tmad0,fused,fused-tmad0 > $OUT/g128.md 2>&1
grep -E "device|copy|^. fused|unknown" $OUT/g128.md
# The step as a fresh process places its weights (--copy-gbs: no copy measurement first; session 45: 1.2-2.5% slower
# on an H100 than the usual figure, the CLI's speed).
timeout 50 $D --group -1,128 --reps 3 --variants fused --copy-gbs 4800 > $OUT/fresh.md 2>&1
grep -E "^. fused|unknown" $OUT/fresh.md
timeout 50 $D --group -1,128 --reps 2 -n 64 --depth 2000 --variants fused,fused-tmad0 > $OUT/depth.md 2>&1
grep -E "^. fused|unknown" $OUT/depth.md
FORMATS="pc g128" QUANTIZE_ARGS="--method rtn --no-clip-search" W4ONLY=0 RUNS=2 timeout 400 bash scripts/cuda_8b_bench.sh > $OUT/pipeline.log 2>&1
grep -vE "^\| ---|^\| model" $OUT/pipeline.log | head -40
