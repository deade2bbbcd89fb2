#!/bin/bash
# Device-side: the Llama-3.1-8B-shaped pipeline on one GPU, end to end, from binaries packed here by
# `scripts/cuda_pack.sh build` (run tool: command `bash scripts/cuda_8b_bench.sh`, carry [".gl"]):
#   make-random (bf16, 16 GB) -> quantize (GPTQ on the GPU, timed with peak RSS) -> export --backend cuda
#   -> petrel run x3 (29-token prompt: init and TTFT from the Genie profile)
#   -> petrel bench --backend cuda -p 29,128,512 -n 128.
# FORMATS (default "pc g128"): pc = W4 per channel + 8-bit head (GPTQ on the GPU); g128 = W4 group 128
# (GPTQ on the GPU). QUANTIZE_ARGS adds flags to every quantize (e.g. "--method rtn --no-clip-search").
# Each format's pp512 is also benched with --prefill-f16-weights off (the dequantize-per-call path).
# VALIDATE=1 also runs `petrel validate` of the per-channel checkpoint against the float one (CPU, 1 window).
# KEEP=1 keeps /tmp/w8b (a warm machine reuses it: make-random and quantize are skipped when present).
# DEPTHS="2000,8000" also benches pp512 and tg128 after that many tokens in the cache (petrel bench -d).
# LOG=info prints each run's load line (where the init time went); SPEED=0 skips `petrel bench`; RUNS (3): runs;
# W4ONLY=0 skips the pp512 bench without the fp16 weight copies.
# Logs and profiles go to $OUT.
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
W=/tmp/w8b; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
if [ ! -f $W/random/config.json ]; then
  t0=$(date +%s)
  $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
  echo "make-random: $(( $(date +%s) - t0 )) s"
fi
printf '128000' > $W/p29.txt; for i in $(seq 1 28); do printf ' %d' $((1000 + 37 * i)); done >> $W/p29.txt
for fmt in ${FORMATS:-pc g128}; do
  case $fmt in pc) qargs="--group-size -1";; g128) qargs="--group-size 128";; esac
  echo "== $fmt"
  if [ ! -f $W/w4-$fmt/config.json ]; then
    /usr/bin/time -v $P quantize --checkpoint $W/random --out $W/w4-$fmt --device cuda $qargs ${QUANTIZE_ARGS:-} -q \
      > $OUT/quantize-$fmt.log 2>&1; echo "quantize rc $?"
    grep -E "Elapsed|Maximum resident" $OUT/quantize-$fmt.log
  fi
  $P export --checkpoint $W/w4-$fmt --out $W/bundle-$fmt --parts 5 --context-length 4096 --backend cuda --force -q 2>&1 | tail -2
  cat $W/bundle-$fmt/*.pte > /dev/null 2>&1; cat $W/bundle-$fmt/* > /dev/null 2>&1  # page cache
  for r in $(seq 1 ${RUNS:-3}); do
    $P run -c $W/bundle-$fmt/config.json --tokens_file $W/p29.txt -n 32 --profile $W/prof-$fmt-$r.json --log ${LOG:-error} \
      2>&1 > /dev/null | grep "loaded"
    cp $W/prof-$fmt-$r.json $OUT/ 2>/dev/null
    python3 - $W/prof-$fmt-$r.json <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
ev = {e["type"]: e for c in p["components"] for e in c["events"]}
g = lambda e, k: ev[e][k]["value"]
print("run: init %.3f s, TTFT %.2f ms, prompt %.0f tok/s, generation %.1f tok/s" % (g("GenieDialog_create", "init-time") / 1e6,
      g("GenieDialog_query", "time-to-first-token") / 1e3, g("GenieDialog_query", "prompt-processing-rate"),
      g("GenieDialog_query", "token-generation-rate")))
PY
  done
  [ "${SPEED:-1}" = 0 ] && { rm -rf $W/bundle-$fmt; continue; }
  $P bench $W/bundle-$fmt --backend cuda -p 29,128,512 -n 128 -r 5 2>&1 | tee $OUT/bench-$fmt.md
  # DEPTHS (e.g. "2000,8000"): tg128 and pp512 again after that many tokens in the cache (llama-bench's -d).
  [ -n "${DEPTHS:-}" ] && $P bench $W/bundle-$fmt --backend cuda -p 512 -n 128 -d "$DEPTHS" -r 3 2>&1 | tee $OUT/bench-$fmt-depth.md
  # The same prompts without the fp16 weight copies (--prefill-f16-weights auto turns them on for 8B on an H200).
  [ "${W4ONLY:-1}" = 1 ] && $P bench $W/bundle-$fmt --backend cuda -p 512 -n 0 -r 5 --prefill-f16-weights off 2>&1 | tail -1 | tee $OUT/bench-$fmt-w4only.md
  rm -rf $W/bundle-$fmt
  if [ "${VALIDATE:-0}" = 1 ]; then  # CPU kernels, all cores: one 256-token window through both paths
    t0=$(date +%s)
    timeout ${VALIDATE_TIMEOUT:-200} $P validate --checkpoint $W/w4-$fmt --reference $W/random --max-windows 1 \
      --report $OUT/validation-8b-$fmt.json -q 2>&1 | tail -4
    echo "validate rc $? in $(( $(date +%s) - t0 )) s"
  fi
done
[ "${KEEP:-0}" = 1 ] || rm -rf $W
