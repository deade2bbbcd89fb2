#!/bin/bash
# Device-side, session 44: ONE call of at most LIMIT seconds (default 400). Call 1 asked what the RMSNorm
# products' sum of squares costs the decode step, through a diagnostic -skip32 (each tensor-copy GEMV block read
# x over its slice only and took 1 / rms as 1: the bound on applying the norm's scale in the consumer): nothing
# on an H100 (docs/PERFORMANCE.md, session 44); that probe's code is gone again (`git show 074ab30 -- src bench`
# brings it back, with this script's call-1 variants $V,$S,...). Call 2 (this script as it is) asks whether
# gate/up's stages asked for after its x is staged (-tmag10 with f12cc24's CudaModelOptions::
# decode_tma_gate_up_prewait, since removed: without it -tmag10 sets every tensor-copy product's pre-wait stages;
# gate/up's blocks start only as o's leave, so its pre-wait stages are in flight while it reads x) pay: -1.4% on
# an H100.
# Run tool: command `LIMIT=400 bash scripts/cuda_norm_probe.sh`, carry [".gl/pkg.tar.xz"], after
# `ninja -C build && sh scripts/cuda_pack.sh build`. Everything lands in $OUT/all.tgz.
set -u
t0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ $l -gt $1 ] && echo $1 || echo $(( l > 5 ? l - 5 : 1 )); }
at() { echo "== at $(( $(date +%s) - t0 )) s"; }
. scripts/cuda_unpack.sh >/dev/null 2>&1
W=/tmp/probe; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout $(cap 60) $B/petrel_tests --gtest_filter='*GemvTma*:*FusedStep*:*TensorCopy*' > $W/tests.txt 2>&1
grep -E "FAILED|PASSED|Failure" $W/tests.txt | head; at
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0"
V=fused-tmaq1-tmag1
timeout $(cap 110) $D --group -1 --reps 3 --variants $V,fused-tmaq1-tmag10,$V,fused-tmaq1-tmag10 > $W/pc.md 2>&1
grep -E "device|copy|^. fused|unknown" $W/pc.md; at
timeout $(cap 100) $D --group 128 --reps 3 --variants $V,fused-tmaq1-tmag10,$V,fused-tmaq1-tmag10 > $W/g128.md 2>&1
grep -E "^. fused|unknown" $W/g128.md; at
timeout $(cap 60) $D --group -1 --reps 1 -n 16 --variants $V,fused-tmaq1-tmag10 --timeline $W/tl_pc.csv > /dev/null 2>&1
python3 scripts/timeline_report.py $W/tl_pc.csv --blocks > $W/tl_pc.md 2>&1
grep -E "^## |^\| (q/k/v|attention|o|gate/up|down) |sum of squares done|RMSNorm|  staged|  past the wait|  started|out of the loop [0-9]" $W/tl_pc.md | head -40; at
timeout $(cap 60) $D --group -1 --reps 2 -n 64 --depth 2000 --variants $V,fused-tmaq1-tmag10 > $W/depth.md 2>&1
grep -E "^. fused|unknown" $W/depth.md; at
tar czf $OUT/all.tgz -C $W .
