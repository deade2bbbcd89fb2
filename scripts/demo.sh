#!/usr/bin/env bash
# The main job on the small model shipped in the repo: quantize (GPTQ, W4 per channel, 8-bit LM head),
# validate both deployment paths against the float model, export a 5-part bundle, generate from the bundle.
# Usage: scripts/demo.sh [build-dir] [work-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
WORK="${2:-demo-out}"
PETREL="$BUILD/petrel"
MODEL=tests/data/models/tiny-llama31
mkdir -p "$WORK"

echo "== inspect"
"$PETREL" inspect "$MODEL"
echo "== quantize (GPTQ, calibration: first 90% of the shipped WikiText-2 corpus)"
"$PETREL" quantize --checkpoint "$MODEL" --out "$WORK/tiny-w4" --force
echo "== validate (held-out: the last 10% of the corpus; prompt processor and token generator)"
"$PETREL" validate --checkpoint "$WORK/tiny-w4" --reference "$MODEL" --max-windows 40
echo "== export"
"$PETREL" export --checkpoint "$WORK/tiny-w4" --out "$WORK/tiny-bundle" --context-length 2048 --parts 5 --force
"$PETREL" inspect "$WORK/tiny-bundle"
echo "== generate from the bundle, through the chat template"
"$PETREL" generate --model "$WORK/tiny-bundle/config.json" --chat --prompt "Tell me about the history of the city." \
  -n 48 --greedy
echo "== run it like genie-t2t-run, with a profile"
rm -f "$WORK/profile.json"
"$PETREL" run -c "$WORK/tiny-bundle/config.json" -p '<|begin_of_text|>The history of the city' -n 48 \
  --profile "$WORK/profile.json"
echo "profile: $WORK/profile.json"
"$PETREL" bench "$WORK/tiny-bundle" -p 128 -n 32 -r 3
