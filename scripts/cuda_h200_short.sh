#!/bin/bash
# Device-side, session 47 (~1.5 min): on an H200, the decode step (warm copies on their own stream, 525c4f1) per
# channel and at group 128 as fresh processes; on any other GPU (~3 min), how many warm copies it takes (-wcN, own
# stream), and whether the driver's work queues or lazy module loading are the mechanism.
# Run tool: command `bash scripts/cuda_h200_short.sh`, carry [".gl/pkg.tar.xz"].
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --copy-gbs 4800"
if nvidia-smi -L | grep -q H200; then
  for G in -1 128 -1 128; do timeout 50 $D --group $G --variants fused 2>&1 | grep -E "^. fused|rror" | sed "s/^/g$G /"; done
  timeout 50 $D --group -1 --variants fused-wc0 2>&1 | grep -E "^. fused|rror" | sed "s/^/g-1 /"
else
  for V in fused-wc0 fused-wc2 fused-wc5 fused-wc10 fused fused-wc100; do
    timeout 50 $D --group 128 --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/g128 /"
  done
  # The mechanism, by the driver's knobs (no code): the number of hardware work queues streams are spread over
  # (CUDA_DEVICE_MAX_CONNECTIONS, default 8) and lazy module loading, each without and with the warm copies.
  for E in CUDA_DEVICE_MAX_CONNECTIONS=1 CUDA_DEVICE_MAX_CONNECTIONS=2 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER; do
    for V in fused-wc0 fused; do
      env $E timeout 50 $D --group 128 --variants $V 2>&1 | grep -E "^. fused|rror" | sed "s/^/g128 $E /"
    done
  done
fi
