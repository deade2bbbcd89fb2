#!/bin/bash
# Device-side, session 45: why the CLI's group 128 runs 2.7% under the decode bench's random model on an H100
# (session 44: 507.8 against 520-522; per channel 0.7%). The same step on the same GPU, three ways:
#   A. petrel_bench_decode_cuda on random group-128 weights (what the decode bench figures are);
#   B. the same bench on the RTN-quantized 8B-shaped bundle the CLI runs (--model);
#   C. `petrel bench` on that bundle, with the prefill fp16 weight copies (auto, the CLI's default) and without.
# A vs B says whether the weights (their values, layout or upload) matter; B vs C whether the CLI's path does.
# Then A and B again with a block timeline (instrumented: pictures, not timings; TIMELINE=0: not), for
# scripts/timeline_report.py.
# On an H200 it first runs scripts/cuda_h200_pipeline.sh (its own figures). Run tool: command
# `bash scripts/cuda_g128_gap.sh`, carry [".gl/pkg.tar.xz"], after `ninja -C build && sh scripts/cuda_pack.sh build`.
set -u
if nvidia-smi -L | grep -q H200; then bash scripts/cuda_h200_pipeline.sh; fi
. scripts/cuda_unpack.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
W=/tmp/w8b; mkdir -p $W
G=${GROUP:-128}
t0=$(date +%s)
[ -f $W/random/config.json ] || $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
[ -f $W/w4/config.json ] || $P quantize --checkpoint $W/random --out $W/w4 --device cuda --group-size $G --method rtn --no-clip-search -q 2>&1 | tail -2
$P export --checkpoint $W/w4 --out $W/bundle --parts 5 --context-length 4096 --backend cuda --force -q 2>&1 | tail -2
cat $W/bundle/* > /dev/null
echo "prepared in $(( $(date +%s) - t0 )) s"
D="$B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 3"
echo "== A: random group $G"
timeout 90 $D --group $G --variants fused,fused-tmad0 > $OUT/A.md 2>&1; echo "rc $?"
grep -E "^. fused|error|unknown" $OUT/A.md
echo "== B: the bundle"
timeout 120 $D --model $W/bundle --variants fused,fused-tmad0 > $OUT/B.md 2>&1; echo "rc $?"
grep -E "^. fused|error|unknown|load" $OUT/B.md
echo "== C: petrel bench"
timeout 120 $P bench $W/bundle --backend cuda -p 29 -n 128 -r 5 2>&1 | tee $OUT/C.md | tail -2
timeout 120 $P bench $W/bundle --backend cuda -p 29 -n 128 -r 5 --prefill-f16-weights off 2>&1 | tee $OUT/C-off.md | tail -1
if [ "${TIMELINE:-1}" = 1 ]; then  # instrumented builds: pictures only, not timings
  timeout 60 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 1 -n 8 --group $G --variants fused --timeline $OUT/timeline-random.csv > $OUT/A-tl.md 2>&1
  timeout 90 $B/petrel_bench_decode_cuda --preset llama-3.1-8b --prompt 0 --reps 1 -n 8 --model $W/bundle --variants fused --timeline $OUT/timeline-bundle.csv > $OUT/B-tl.md 2>&1
  echo "timelines rc $?"
fi
cd $OUT && tar czf gap.tgz *.md *.csv 2>/dev/null; ls -la $OUT/gap.tgz
