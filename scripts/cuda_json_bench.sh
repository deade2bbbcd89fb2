#!/bin/bash
# Device-side: what constrained decoding costs on the GPU through the server, from binaries packed here by
# `scripts/cuda_pack.sh build` (run tool: command `bash scripts/cuda_json_bench.sh`, carry [".gl"]):
#   make-random (8B shape) -> quantize (RTN per channel on the GPU) -> export --backend cuda -> petrel serve --backend cuda
#   -> chat requests at temperature 0, plain / response_format json_object / json_schema (and json_object sampled
#   with top_k 8), 8 and 200 tokens each, with the masks on the GPU and with --host-masks,
#   timed by curl: ms a token = (t(200) - t(8)) / 192 (docs/PERFORMANCE.md, session 22).
# TESTS=1 first runs the GPU tests of the constrained paths (CudaModel.*, Json*).
set -u
. scripts/cuda_unpack.sh  # OUT, B, P; the packed binaries and CUDA libraries on the paths
if [ "${TESTS:-0}" = 1 ]; then
  $B/petrel_tests --gtest_filter='CudaModel.*:Json*' > $OUT/tests.log 2>&1; echo "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" $OUT/tests.log | head -20
fi
W=/tmp/w8b; mkdir -p $W
[ -f $W/random/config.json ] || $P make-random --preset llama-3.1-8b --out $W/random --tokenizer tests/data/tokenizers/llama-3.1 2>&1 | tail -1
[ -f $W/q/config.json ] || $P quantize --checkpoint $W/random --out $W/q --device cuda --group-size -1 --method rtn --no-clip-search -q \
  > $OUT/quantize.log 2>&1
$P export --checkpoint $W/q --out $W/b --parts 5 --context-length 4096 --backend cuda --force -q 2>&1 | tail -1
req() {  # $1 max_tokens, $2 extra request fields
  curl -s -o $OUT/resp.json -w '%{time_total}' http://127.0.0.1:18080/v1/chat/completions -H 'Content-Type: application/json' \
    -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Give me a JSON object describing a cat.\"}],\"max_tokens\":$1,\"temperature\":0$2}"
  echo " $(python3 -c 'import json,sys;d=json.load(open(sys.argv[1]));print(d.get("usage",{}).get("completion_tokens"), d["choices"][0]["finish_reason"], repr(d["choices"][0]["message"].get("content",""))[:60])' $OUT/resp.json 2>&1)"
}
SCHEMA=',"response_format":{"type":"json_schema","json_schema":{"name":"cat","schema":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age","tags"]}}}'
# MASKS: the server's mask paths compared (gpu: the default, constraint masks on the GPU; host: --host-masks).
for where in ${MASKS:-gpu host}; do
  masks=""; [ "$where" = host ] && masks=--host-masks
  echo "== serve, masks on the $where"
  $P serve $W/b --backend cuda --port 18080 --max-tokens 512 $masks > $OUT/serve$masks.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do grep -q listening $OUT/serve$masks.log && break; sleep 0.5; done
  for mode in "" ',"response_format":{"type":"json_object"}' "$SCHEMA" ',"top_k":8,"temperature":0.7,"seed":3,"response_format":{"type":"json_object"}'; do
    echo "mode: ${mode:-plain}" | cut -c1-80
    for mt in 8 200 8 200; do echo -n "  max_tokens $mt: "; req $mt "$mode"; done
  done
  kill $SP; wait $SP 2>/dev/null
done
