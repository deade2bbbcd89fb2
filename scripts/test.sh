#!/usr/bin/env bash
# Builds petrel and runs the whole test suite (what CI runs). Usage: scripts/test.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
scripts/setup.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j"$(nproc)"
# The official OpenAI client and the jsonschema validator (PyPI) for the server's protocol test, in a venv of the
# build; the test is skipped when they cannot be installed (no network).
if [ ! -x "$BUILD_DIR/pyenv/bin/python" ] || ! "$BUILD_DIR/pyenv/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
  (python3 -m venv "$BUILD_DIR/pyenv" && "$BUILD_DIR/pyenv/bin/pip" install -q openai jsonschema) ||
    echo "test.sh: could not install the openai client; its test will be skipped"
fi
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
