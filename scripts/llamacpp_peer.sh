#!/usr/bin/env bash
# Peer baseline: measures llama.cpp (llama-bench) on this CPU on a Llama-3.1-8B-shaped checkpoint, so that
# petrel's CPU numbers can be read side by side with it. Manual tool: not run by tests or CI.
#
# Usage: scripts/llamacpp_peer.sh HF_CHECKPOINT_DIR WORK_DIR [LLAMA_CPP_PYTHON_VERSION]
#   HF_CHECKPOINT_DIR  a Hugging Face Llama checkpoint (config.json, *.safetensors, tokenizer.json,
#                      tokenizer_config.json); random weights are fine, speed does not depend on values.
#   WORK_DIR           where the source, build, venv, GGUF files and logs go (needs ~25 GB free while the
#                      f16 GGUF exists; ~10 GB after it is deleted).
#   LLAMA_CPP_PYTHON_VERSION  default 0.3.36 (vendors ggml-org/llama.cpp@0c1e57098).
#
# Why this route: there is no network here except Debian apt and PyPI. llama.cpp is not packaged in
# Debian 12, but the PyPI sdist of llama-cpp-python vendors the whole llama.cpp tree (vendor/llama.cpp),
# convert script included. We build only llama.cpp's own tools from it, never the Python binding.
#
# Every compile, the conversion/quantization (heavy on CPU and disk) and every timing run is wrapped in
# `flock $LOCK` so that it never overlaps another engineer's build or benchmark on this 2-core machine.
# Steps whose output already exists are skipped, so the script can be re-run after a failure.
set -euo pipefail

HF_DIR="${1:?usage: $0 HF_CHECKPOINT_DIR WORK_DIR [LLAMA_CPP_PYTHON_VERSION]}"
WORK="${2:?usage: $0 HF_CHECKPOINT_DIR WORK_DIR [LLAMA_CPP_PYTHON_VERSION]}"
VERSION="${3:-0.3.36}"
LOCK="${PETREL_BUILD_LOCK:-/tmp/petrel-build.lock}"
JOBS="${JOBS:-2}"
THREADS="${THREADS:-$(nproc)}"
HF_DIR="$(cd "$HF_DIR" && pwd)"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
cd "$WORK"
locked() { flock "$LOCK" "$@"; }
stamp() { echo "[$(date -u +%H:%M:%S)] $*"; }
T0=$(date +%s)

# 1. Source: the llama-cpp-python sdist (never a wheel), unpacked; llama.cpp lives in vendor/llama.cpp.
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -d "$SRC" ]; then
  stamp "download llama-cpp-python==$VERSION sdist"
  pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
  tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi
# The sdist carries no git metadata, so llama.cpp's build-info would say "unknown". The llama.cpp commit
# is the first "update llama.cpp to ggml-org/llama.cpp@HASH" line under this version in the CHANGELOG.
COMMIT="$(awk -v v="## [$VERSION]" '$0==v{f=1;next} f&&/^## \[/{exit} f&&match($0,/llama\.cpp@[0-9a-f]+/){print substr($0,RSTART+10,RLENGTH-10);exit}' \
  "$WORK/llama_cpp_python-$VERSION/CHANGELOG.md")"
COMMIT="${COMMIT:-unknown}"
stamp "llama-cpp-python $VERSION -> llama.cpp $COMMIT"

# 2. Build: CPU only, Release, -march=native (GGML_NATIVE=ON: AVX-512/VNNI/BF16 where the CPU has them),
#    no libcurl, static, only the three tools we need.
BIN="$SRC/build/bin"
if [ ! -x "$BIN/llama-bench" ] || [ ! -x "$BIN/llama-quantize" ]; then
  stamp "configure + build (-j$JOBS)"
  locked cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMIT="$COMMIT" -DLLAMA_BUILD_NUMBER=0
  locked cmake --build "$SRC/build" --config Release -j"$JOBS" --target llama-bench llama-quantize llama-simple
fi

# 3. Python env for convert_hf_to_gguf.py (versions from its requirements file). PyPI's torch for Linux
#    is the CUDA build (~3 GB of nvidia-* wheels); the CPU-only index is not reachable here, and the
#    convert script imports torch unconditionally. gguf comes from the vendored gguf-py (the script puts
#    it on sys.path itself), so it matches the C++ side.
VENV="$WORK/venv"
if [ ! -x "$VENV/bin/python" ]; then
  stamp "python venv for conversion"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install "torch==2.11.0" "numpy~=2.2.6" safetensors "sentencepiece>=0.1.98,<0.3.0" \
    "transformers==4.57.6" "protobuf>=4.21.0,<5.0.0" pyyaml
fi

# 4. HF -> GGUF f16 (lazy: tensors are streamed, RAM stays a few GB), then f16 -> Q4_0 and Q4_K_M.
#    The f16 file (~16 GB) is deleted once both quantized files exist.
NAME="$(basename "$HF_DIR")"  # the GGUF files are named after the checkpoint's directory
F16="$WORK/$NAME-f16.gguf"
Q40="$WORK/$NAME-Q4_0.gguf"
Q4KM="$WORK/$NAME-Q4_K_M.gguf"
if { [ ! -f "$Q40" ] || [ ! -f "$Q4KM" ]; } && [ ! -f "$F16" ]; then
  stamp "convert to f16 GGUF"
  locked "$VENV/bin/python" "$SRC/convert_hf_to_gguf.py" "$HF_DIR" --outtype f16 --outfile "$F16.tmp"
  mv "$F16.tmp" "$F16"
fi
for pair in "Q4_0:$Q40" "Q4_K_M:$Q4KM"; do
  type="${pair%%:*}"; out="${pair#*:}"
  if [ ! -f "$out" ]; then
    stamp "quantize $type"
    locked "$BIN/llama-quantize" "$F16" "$out.tmp" "$type" "$THREADS"
    mv "$out.tmp" "$out"
  fi
done
rm -f "$F16"
ls -l "$Q40" "$Q4KM"

# 5. CPU features the build uses. llama-bench does not print llama_print_system_info(), so a 3-line probe
#    linked against the static libraries prints it (e.g. "AVX512 = 1 | AVX512_VNNI = 1 | ...").
if [ ! -x "$WORK/sysinfo" ]; then
  printf '%s\n' '#include "llama.h"' '#include <cstdio>' \
    'int main() { llama_backend_init(); std::printf("%s\n", llama_print_system_info()); return 0; }' > "$WORK/sysinfo.cpp"
  locked g++ -O2 -I"$SRC/include" -I"$SRC/ggml/include" "$WORK/sysinfo.cpp" -o "$WORK/sysinfo" \
    "$SRC/build/src/libllama.a" "$SRC/build/ggml/src/libggml.a" "$SRC/build/ggml/src/libggml-cpu.a" \
    "$SRC/build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl
fi
"$WORK/sysinfo" | tee "$WORK/sysinfo.txt"

# 6. Bench: prompt processing of 128 tokens (pp128) and generation of 32 tokens (tg32), 3 repetitions,
#    all cores; the md table ends with "build: COMMIT (0)". Then a tg-only and a pp-only run with 5
#    repetitions each, as a second sample when the first is noisy (-oe json adds cpu_info etc. on stderr).
for model in "$Q40" "$Q4KM"; do
  stamp "llama-bench $(basename "$model")"
  locked "$BIN/llama-bench" -m "$model" -p 128 -n 32 -t "$THREADS" -r 3 -o md | tee "$model.bench.md"
  locked "$BIN/llama-bench" -m "$model" -p 0 -n 32 -t "$THREADS" -r 5 -o md -oe json 2>"$model.tg.json" \
    | tee "$model.bench-tg.md"
  locked "$BIN/llama-bench" -m "$model" -p 128 -n 0 -t "$THREADS" -r 5 -o md -oe json 2>"$model.pp.json" \
    | tee "$model.bench-pp.md"
done
stamp "done in $(( $(date +%s) - T0 )) s"
