#!/bin/bash
# Device-side (session 46; any Hopper, ~150 s): session 46's first call found the decode bench's gain from its
# copy-bandwidth measurement in the copies themselves (`--before copy-keep` 519.3 against 507.6 fresh; allocating,
# keeping or memsetting 2 GiB first gave nothing). Which copies, and does one at load (after the weights are
# placed) give it too: --warm OP:MIB:REPS:WHEN on a fresh-process step (--copy-gbs: no measurement), then per
# channel, then block timelines of the step with and without the measurement (which kernels slow down).
# Run tool: command `bash scripts/cuda_warm_copy.sh`, carry [".gl/pkg.tar.xz"], after `sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --variants fused --copy-gbs 3000"
G=${GROUP:-128}
for w in "" "--warm memcpy:1024:21:before" "--warm memcpy:1024:21:after" "--warm memcpy:1024:1:before" \
         "--warm memcpy:64:21:before" "--warm memset:1024:21:before" ""; do
  echo "group $G [$w]"
  timeout 40 $D --group $G $w 2>&1 | grep -E "^. fused|rror|unknown|warm"
done
for w in "" "--warm memcpy:1024:21:after"; do
  echo "per channel [$w]"
  timeout 40 $D --group -1 $w 2>&1 | grep -E "^. fused|rror|unknown|warm"
done
# Timelines, group 128: fresh (--copy-gbs) against the measurement first.
T="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 1 -n 16 --variants fused --group $G"
timeout 40 $T --copy-gbs 3000 --timeline $OUT/fresh.csv > /dev/null 2>&1
timeout 40 $T --timeline $OUT/copied.csv > /dev/null 2>&1
for f in fresh copied; do
  echo "timeline: $f"
  python3 scripts/timeline_report.py $OUT/$f.csv 2>&1 | head -30
done
cd $OUT && tar cJf timelines.tar.xz fresh.csv copied.csv && rm fresh.csv copied.csv
