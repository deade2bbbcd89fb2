#!/bin/bash
# Device-side: a CPU-exported bundle (padded qweight rows) against a cuda bundle of the same checkpoint on the GPU:
# the uploader's tests, then init (`petrel run --log info`) and, with --deterministic, the same text. From binaries packed
# here by `scripts/cuda_pack.sh build` (run tool: command `bash scripts/cuda_cpu_bundle_on_gpu.sh`, carry [".gl"]).
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
$B/petrel_tests --gtest_filter='KernelsCuda.HostUploader*:Backend.Gpu*' > $OUT/tests.log 2>&1; echo "tests rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" $OUT/tests.log | head; grep -A8 Failure $OUT/tests.log | head -30
W=/tmp/w8c; mkdir -p $W
if [ ! -f $W/q/config.json ]; then
  $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
  $P quantize --checkpoint $W/random --out $W/q --device cuda --group-size -1 --method rtn --no-clip-search -q > /dev/null 2>&1; echo q $?
fi
for b in cuda cpu; do [ -f $W/$b/config.json ] || $P export --checkpoint $W/q --out $W/$b --parts 5 --context-length 4096 --backend $b --force -q 2>&1 | tail -1; done
cat $W/cuda/* $W/cpu/* > /dev/null
printf '128000' > $W/p29.txt; for i in $(seq 1 28); do printf ' %d' $((1000 + 37 * i)); done >> $W/p29.txt
for r in $(seq 1 ${RUNS:-3}); do for b in cuda cpu; do
  rm -f $W/prof.json; $P run -c $W/$b/config.json --backend cuda --deterministic --tokens_file $W/p29.txt -n 32 --profile $W/prof.json --log info 2>&1 >$W/out-$b.txt | grep -iE "loaded|error" | cut -c1-260
done; done
[ -s $W/out-cuda.txt ] && cmp $W/out-cuda.txt $W/out-cpu.txt && echo "same text (deterministic): $(wc -c < $W/out-cuda.txt) bytes"
