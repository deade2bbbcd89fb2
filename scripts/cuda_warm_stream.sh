#!/bin/bash
# Device-side, session 47 (any Hopper, ~5 min): on which stream the warm copies (CudaModelOptions::warm_copies)
# must run to give session 46's gain. Call 1 of session 47 (an H100) found the product's copies on the model's own
# stream worth nothing (group 128 509.4/510.1 against 509.3/509.8 without), while the bench's --warm copies on the
# bench's stream gave 517-518. Each row its own process (the state the copies set outlives them):
# -wsN = CudaModelOptions::warm_copies_stream (0 own stream destroyed after, 1 own kept, 2 the model's, 3 legacy).
# Then `petrel bench` on an RTN group-128 bundle with the default (session 45's CLI without copies: 503-507).
# Run tool: command `bash scripts/cuda_warm_stream.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build &&
# sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
timeout 60 $B/petrel_tests --gtest_filter="CudaModel.WarmCopies*" 2>&1 | tail -1
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --copy-gbs 3000"
for G in 128 -1; do
  for V in fused-wc0 fused-ws0 fused-ws1 fused-ws2 fused-ws3 fused-wc0 fused-ws0 fused-ws1 fused-ws3; do
    [ $G = -1 ] && case $V in *ws2|*ws3) continue;; esac
    timeout 60 $D --group $G --variants $V 2>&1 | grep -E "^. fused|rror|unknown" | sed "s/^/g$G /"
  done
done
# On an H200 the CLI runs next in scripts/cuda_h200_pipeline.sh.
nvidia-smi -L | grep -q H200 && exit 0
W=/tmp/w8b; mkdir -p $W
[ -f $W/random/config.json ] || $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
[ -f $W/w4/config.json ] || $P quantize --checkpoint $W/random --out $W/w4 --group-size 128 --method rtn --no-clip-search -q 2>&1 | tail -1
$P export --checkpoint $W/w4 --out $W/bundle --parts 5 --context-length 4096 --backend cuda --force -q 2>&1 | tail -1
for i in 1 2; do timeout 120 $P bench $W/bundle --backend cuda -p 0 -n 128 -r 5 2>&1 | tail -1; done
