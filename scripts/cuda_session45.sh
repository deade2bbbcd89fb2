#!/bin/bash
# Device-side, session 45, one call whatever GPU comes: the CLI's group-128 gap question (does the decode bench's
# 2 GiB copy-bandwidth measurement before the weights are placed make it faster than `petrel bench`? --copy-gbs
# skips it), then on an H200 scripts/cuda_h200_pipeline.sh. Run tool: command `bash scripts/cuda_session45.sh`,
# carry [".gl/pkg.tar.xz"], after `ninja -C build && sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3"
for g in 128 -1; do
  for f in "--copy-gbs 3000" "" "--copy-gbs 3000" ""; do
    [ $g = -1 ] && [ -z "$f" ] && [ "${pc_done:-0}" = 1 ] && continue
    [ $g = -1 ] && [ -z "$f" ] && pc_done=1
    echo "group $g [$f]"
    timeout 60 $D --group $g --variants fused $f 2>&1 | grep -E "^. fused|unknown|rror|usage"
  done
done
if nvidia-smi -L | grep -q H200; then bash scripts/cuda_h200_pipeline.sh; fi
