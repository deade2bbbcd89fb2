#!/bin/bash
# Device-side (session 46, for the next GPU call; any Hopper, ~4 min): the product's warm copies
# (CudaModelOptions::warm_copies, 148df22), which did not run on a GPU in the session that made them.
#   1. the two new GPU tests and the CudaModel suite;
#   2. the decode bench as fresh processes (--copy-gbs: no measurement first; one process a row) with the copies
#      (fused) and without (fused-wc0), group 128 and per channel: session 46 expects +1.6% on an H100 (511 -> 520, 536 -> 545);
#   3. `petrel bench` on an RTN group-128 bundle (the CLI: session 45's 503-507 on H100s without the copies) and the
#      decode bench `--model` on it.
# Run tool: command `bash scripts/cuda_warm_copies_check.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
timeout 120 $B/petrel_tests --gtest_filter='CudaModel.*:KernelsCuda.FailedAllocation*:Groups/CudaModelGptq.*' 2>&1 | tail -4
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --copy-gbs 3000"
# One process a row (session 47): whatever state the copies set outlives the buffers (session 46: copies before the
# model's creation gain as much as after), so a fused-wc0 after a fused in the same process would be warmed too.
for G in 128 -1; do
  for V in fused-wc0 fused fused-wc0 fused; do
    echo "group $G, $V (own process):"; timeout 60 $D --group $G --variants $V 2>&1 | grep -E "^. fused|rror|unknown"
  done
done
W=/tmp/w8b; mkdir -p $W
[ -f $W/random/config.json ] || $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
[ -f $W/w4/config.json ] || $P quantize --checkpoint $W/random --out $W/w4 --group-size 128 --method rtn --no-clip-search -q 2>&1 | tail -2
$P export --checkpoint $W/w4 --out $W/bundle --parts 5 --context-length 4096 --backend cuda --force -q 2>&1 | tail -2
timeout 120 $P bench $W/bundle --backend cuda -p 0 -n 128 -r 5 2>&1 | tail -2
for V in fused-wc0 fused; do
  timeout 120 $B/petrel_bench_decode_cuda --model $W/bundle --prompt 0 --reps 3 --copy-gbs 3000 --variants $V 2>&1 | grep -E "^. fused|rror"
done
