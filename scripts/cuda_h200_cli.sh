#!/bin/bash
# Device-side, session 47 (meant for an H200, runs on any Hopper; ~6 min): the decode step with the warm copies on
# their own stream (525c4f1), each format as a fresh process like the CLI, then the 8B pipeline through the CLI
# (`petrel run` init/TTFT, `petrel bench` pp/tg) per channel and at group 128, RTN weights.
# Run tool: command `bash scripts/cuda_h200_cli.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --copy-gbs 4800"
for G in -1 128 -1 128; do timeout 50 $D --group $G --variants fused 2>&1 | grep -E "^. fused|rror" | sed "s/^/g$G /"; done
FORMATS="pc g128" QUANTIZE_ARGS="--method rtn --no-clip-search" W4ONLY=0 RUNS=1 timeout 420 bash scripts/cuda_8b_bench.sh > $OUT/pipeline.log 2>&1
grep -vE "^\| ---|^\| model" $OUT/pipeline.log | head -40
