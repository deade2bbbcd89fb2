#!/bin/sh
# Random JSON Schemas (numeric bounds and multipleOf, object unions, patterns, enums, nesting) through
# JsonSchema::compile, random bytes through the automaton of each that compiles, and a bounded search for a
# completion from where they stopped (no dead ends: exits 1 naming the schema), under AddressSanitizer and
# UndefinedBehaviorSanitizer (~35 ms a schema on one core of the 2-core VM: 20,000 take ~12 min; session 25 found an
# out-of-range lookup in the union compiler this way). ctest runs 400 of them (SchemaFuzz.RandomSchemasUnderSanitizers).
#   sh scripts/schema_fuzz.sh [SEED_COUNT]
set -eu
cd "$(dirname "$0")/.."
out=${TMPDIR:-/tmp}/petrel_schema_fuzz
g++ -std=c++20 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -Isrc \
  tests/schema_fuzz/fuzz.cc tests/schema_fuzz/tokenizer_stub.cc src/petrel/runtime/json_schema.cc \
  src/petrel/runtime/regex_dfa.cc src/petrel/runtime/json_constraint.cc src/petrel/util/parallel.cc -o "$out" -lpthread
"$out" "${1:-20000}"
