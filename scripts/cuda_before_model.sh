#!/bin/bash
# Device-side (session 45, for the next GPU call; any Hopper, ~90 s): why the decode bench's copy-bandwidth
# measurement before the model makes the step 1.2-2.5% faster (docs/PERFORMANCE.md, session 45). Every run places
# the weights as a fresh process does (--copy-gbs: no measurement), then --before does one half of what the
# measurement did to 2 GiB of device memory first: allocate and free untouched, allocate and keep, memset and
# free, copy and keep. The plain run (measurement first) and the bare one bracket them.
# Run tool: command `bash scripts/cuda_before_model.sh`, carry [".gl/pkg.tar.xz"], after `sh scripts/cuda_pack.sh build`.
set -u
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi -L
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3 --variants fused"
G=${GROUP:-128}
for f in "--copy-gbs 3000" "" "--copy-gbs 3000 --before alloc-free" "--copy-gbs 3000 --before alloc-keep" \
         "--copy-gbs 3000 --before memset-free" "--copy-gbs 3000 --before copy-keep" "--copy-gbs 3000" ""; do
  echo "group $G [$f]"
  timeout 40 $D --group $G $f 2>&1 | grep -E "^. fused|rror|unknown"
done
