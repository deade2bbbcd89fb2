#!/usr/bin/env bash
# Reproduces the table of docs/QUANTIZATION.md: RTN and GPTQ, per channel and group 128, on tiny-llama31,
# validated on held-out text (the last 10% of wiki.test.raw; calibration uses the first 90%).
# Usage: scripts/quantization_table.sh [petrel-binary] [work-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
PETREL="${1:-build/petrel}"
WORK="${2:-/tmp/petrel-quant-table}"
MODEL=tests/data/models/tiny-llama31
mkdir -p "$WORK"
for method in rtn gptq; do
  for group in -1 128; do
    name="$method-g$group"
    out="$WORK/$name"
    /usr/bin/time -f "$name quantize: %e s, peak RSS %M KB" "$PETREL" quantize --checkpoint "$MODEL" --out "$out" \
      --method "$method" --group-size "$group" --force -q
    "$PETREL" validate --checkpoint "$out" --reference "$MODEL" -q --report "$WORK/$name.validation.json" | sed "s/^/$name: /"
    echo "$name size: $(du -b "$out/model.safetensors" | cut -f1) bytes"
  done
done
