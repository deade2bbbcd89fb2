#!/bin/bash
# Device-side: GPTQ of a Llama-3.1-8B-shaped checkpoint on one GPU, timed, with the peak host RSS
# (issue #6: at most 15 minutes and 24 GiB). From binaries packed here by `scripts/cuda_pack.sh build`;
# run tool: command `bash scripts/gptq_8b_cuda.sh`, carry [".gl"], timeout_s 600.
#   make-random --preset llama-3.1-8b (bf16, 16 GB, real Llama-3.1 tokenizer) into /tmp
#   -> petrel quantize --device cuda (default recipe: W4 sym per channel, 8-bit head, GPTQ, 128 x 256
#      calibration tokens) under /usr/bin/time -v (or a getrusage wrapper when the image has no GNU time).
# Environment: MAX_LAYERS=N for a timing run of the first N layers (nothing written), QUANTIZE_ARGS for more
# flags, TESTS='GptqCuda*' to run those tests first, PKG (default .gl/pkg.tar.xz) or PETREL (a petrel binary
# already there). Logs go to $OUT; the progress lines (every 10%) in quantize.log show the pace.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -z "${PETREL:-}" ]; then
  tar xJf "${PKG:-.gl/pkg.tar.xz}" -C /tmp || exit 1
  export LD_LIBRARY_PATH=/tmp/pkg/lib
  PETREL=/tmp/pkg/bin/petrel
fi
. scripts/cuda_libs.sh
if [ ! -d /work/main/tests/data ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
W=/tmp/gptq8b; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu.txt
echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/{print $2}') GiB" | tee -a $OUT/gpu.txt

if [ -n "${TESTS:-}" ]; then
  "$(dirname "$PETREL")/petrel_tests" --gtest_filter="$TESTS" > $OUT/tests.log 2>&1
  echo "tests rc $?"; grep -E "^\[ gptq|PASSED|FAILED|SKIPPED" $OUT/tests.log | head -40
fi

t0=$(date +%s)
[ -f $W/random/config.json ] || $PETREL make-random --preset llama-3.1-8b --out $W/random \
  --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
echo "make-random: $(( $(date +%s) - t0 )) s"

args="--checkpoint $W/random --out $W/w4 --force --device cuda ${QUANTIZE_ARGS:-}"
[ -n "${MAX_LAYERS:-}" ] && args="$args --max-layers $MAX_LAYERS"
# GPU memory in use, once a second, beside the run.
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 1 > $OUT/gpu_memory.log 2>/dev/null &
smi=$!
if [ -x /usr/bin/time ]; then
  /usr/bin/time -v $PETREL quantize $args > $OUT/quantize.log 2>&1; rc=$?
else
  python3 - $PETREL quantize $args > $OUT/quantize.log 2>&1 <<'PY'; rc=$?
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.call(sys.argv[1:])
print("\tElapsed (wall clock) time (seconds): %.1f" % (time.monotonic() - t))
print("\tMaximum resident set size (kbytes): %d" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)
PY
fi
kill $smi 2>/dev/null
echo "quantize rc $rc"
grep -E "quantize|Elapsed|Maximum resident|error" $OUT/quantize.log | tail -20
echo "peak GPU memory used: $(sort -n $OUT/gpu_memory.log | tail -1) MiB"
du -sh $W/w4 2>/dev/null
