#!/usr/bin/env bash
# Whole-file bits per weight against fidelity on tiny-llama31, for comparison with llama.cpp's curve in
# DESIGN.md (same protocol: last 10% of wiki.test.raw, 256-token windows, the second half scored). Each row:
# quantize with the given flags, validate against the float model, and report model.safetensors' size in bits
# over the float model's parameter count (llama.cpp's "bits per weight (whole file)").
# Usage: scripts/quantization_bpw_table.sh [petrel-binary] [work-dir]   (ROWS="name|flags;..." to choose rows)
set -euo pipefail
cd "$(dirname "$0")/.."
PETREL="${1:-build/petrel}"
WORK="${2:-/tmp/petrel-bpw-table}"
MODEL=tests/data/models/tiny-llama31
mkdir -p "$WORK"
DEFAULT_ROWS="gptq-pc|;\
gptq-g128|--group-size 128;\
gptq-g128-e8|--group-size 128 --embedding-bits 8;\
gptq-pc-e4g128|--embedding-bits 4 --embedding-group-size 128;\
gptq-g128-e4g128|--group-size 128 --embedding-bits 4 --embedding-group-size 128;\
gptq-g64-e4g64|--group-size 64 --embedding-bits 4 --embedding-group-size 64;\
gptq-g32-e4g32|--group-size 32 --embedding-bits 4 --embedding-group-size 32;\
gptq-g128-e4g128-h4g128|--group-size 128 --embedding-bits 4 --embedding-group-size 128 --lm-head-bits 4 --lm-head-group-size 128;\
gptq-g64-e4g64-h8g64|--group-size 64 --embedding-bits 4 --embedding-group-size 64 --lm-head-group-size 64;\
gptq-g128-e8-h4g128|--group-size 128 --embedding-bits 8 --lm-head-bits 4 --lm-head-group-size 128;\
gptq-g64-e8-h4g64|--group-size 64 --embedding-bits 8 --lm-head-bits 4 --lm-head-group-size 64;\
gptq-g64-e8g64-h4g64|--group-size 64 --embedding-bits 8 --embedding-group-size 64 --lm-head-bits 4 --lm-head-group-size 64;\
gptq-g32-e8-h4g32|--group-size 32 --embedding-bits 8 --lm-head-bits 4 --lm-head-group-size 32;\
gptq-g32-e4g32-h4g32|--group-size 32 --embedding-bits 4 --embedding-group-size 32 --lm-head-bits 4 --lm-head-group-size 32;\
gptq-g128-e4g128-h4g128-mvd|--group-size 128 --embedding-bits 4 --embedding-group-size 128 --lm-head-bits 4 --lm-head-group-size 128 --more-bits v_proj,down_proj;\
gptq-g128-e8-h4g128-mvd|--group-size 128 --embedding-bits 8 --lm-head-bits 4 --lm-head-group-size 128 --more-bits v_proj,down_proj;\
gptq-g64-e8-h4g64-mvd|--group-size 64 --embedding-bits 8 --lm-head-bits 4 --lm-head-group-size 64 --more-bits v_proj,down_proj"
ROWS="${ROWS:-$DEFAULT_ROWS}"
params=$(python3 - "$MODEL/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    header = json.loads(f.read(n))
total = 0
for name, t in header.items():
    if name == '__metadata__': continue
    count = 1
    for d in t['shape']: count *= d
    total += count
print(total)
PY
)
echo "float parameters: $params"
echo "| petrel | flags | whole-file bpw | KL mean (PP) | KL p99 | top-1 | perplexity | TG KL mean |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"
IFS=';' read -ra rows <<< "$ROWS"
for row in "${rows[@]}"; do
  name="${row%%|*}"
  flags="${row#*|}"
  out="$WORK/$name"
  # shellcheck disable=SC2086
  "$PETREL" quantize --checkpoint "$MODEL" --out "$out" --force -q $flags 2>"$WORK/$name.quantize.log"
  "$PETREL" validate --checkpoint "$out" --reference "$MODEL" -q --report "$WORK/$name.validation.json" >"$WORK/$name.validate.log" 2>&1 || true
  bytes=$(du -b "$out/model.safetensors" | cut -f1)
  python3 - "$WORK/$name.validation.json" "$name" "$flags" "$bytes" "$params" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
name, flags, size, params = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
pp, tg = r['prompt_processor'], r['token_generator']
print(f"| {name} | `{flags or '(defaults)'}` | {size * 8 / params:.2f} | {pp['kl_mean']:.5f} | {pp['kl_p99']:.3f} | "
      f"{100 * pp['top1_agreement']:.2f}% | {pp['perplexity']:.3f} | {tg['kl_mean']:.5f} |")
PY
done
