#!/bin/bash
# Device-side, session 48 (~3 min): does the decode step's speed, the warm copies' +1.5% included, survive the GPU
# idling between runs (a server's first request after a quiet spell)? The decode bench per channel with and
# without the warm copies (-wc0), the GPU idle 0, 300 and 2,000 ms before each run of 128 steps (--idle-ms), with
# the SM and memory clocks, power and performance state logged every 100 ms meanwhile ($OUT/clocks.csv).
# Then memsets in place of the copies (--warm memset:64:21:after). On an H200 it runs scripts/cuda_h200_short.sh
# first (the unmet criterion's figures).
# Run tool: command `bash scripts/cuda_idle_check.sh`, carry [".gl/pkg.tar.xz"].
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
if nvidia-smi -L | grep -q H200; then bash scripts/cuda_h200_short.sh 2>&1 | grep -v "^GPU"; fi
nvidia-smi --query-gpu=clocks.max.sm,clocks.max.mem,power.limit --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,utilization.gpu --format=csv,noheader -lms 100 \
  > "$OUT/clocks.csv" 2>&1 &
LOGGER=$!
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 2 --copy-gbs 3000 --group -1"
for I in 0 300 2000; do
  for V in fused-wc0 fused; do
    echo "$(date +%T.%N | cut -c1-12) start idle $I $V"
    timeout 120 $D --idle-ms $I --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/idle $I /"
  done
done
# The mechanism: memsets instead of copies, on the bench's stream (not the model's), against the same copies there.
for W in memset:64:21:after memcpy:64:21:after; do
  echo "$(date +%T.%N | cut -c1-12) start warm $W"
  timeout 60 $D --variants fused-wc0 --warm $W 2>&1 | grep -E "^. fused|rror" | sed "s/^/warm $W /"
done
kill $LOGGER
awk -F', ' '{print $2, $3, $5}' "$OUT/clocks.csv" | sort | uniq -c | sort -rn | head -12
