#!/bin/bash
# Device-side, session 45, one call whatever GPU comes: the CLI's group-128 gap question (does the decode bench's
# 2 GiB copy-bandwidth measurement before the weights are placed make it faster than `petrel bench`? --copy-gbs
# skips it), then on an H200 scripts/cuda_h200_pipeline.sh. Run tool: command `bash scripts/cuda_session45.sh`,
# carry [".gl/pkg.tar.xz"], after `ninja -C build && sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3"
run() {  # group, then the flags
  echo "group $1 [${*:2}]"
  timeout 60 $D --group "$1" --variants fused "${@:2}" 2>&1 | grep -E "^. fused|unknown|rror|usage"
}
run 128 --copy-gbs 3000; run 128; run 128 --copy-gbs 3000; run 128
run -1 --copy-gbs 3000; run -1; run -1 --copy-gbs 3000
if nvidia-smi -L | grep -q H200; then bash scripts/cuda_h200_pipeline.sh; fi
