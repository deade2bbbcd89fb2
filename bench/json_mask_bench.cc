// petrel_bench_json_mask: JSON mode's per-token cost (runtime/json_constraint.h) on the Llama 3.1 tokenizer
// (128,256 tokens): a constraint's mask at the states a JSON answer passes through, prepared (from the state
// alone) and applied (to the logits), beside a plain copy of the logits for scale. Median of --reps calls, microseconds. Building the token table is timed once.
//
//   petrel_bench_json_mask [--tokenizer DIR] [--reps N] [--threads N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "petrel/runtime/json_constraint.h"
#include "petrel/runtime/json_schema.h"
#include "petrel/util/parallel.h"

using petrel::bench::median_us;

int main(int argc, char** argv) {
  std::string dir = PETREL_BENCH_TOKENIZER_DIR;
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) dir = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) petrel::ThreadPool::set_global_threads(std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: petrel_bench_json_mask [--tokenizer DIR] [--reps N] [--threads N]\n");
      return 2;
    }
  }
  auto tokenizer = petrel::Tokenizer::load(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().to_string().c_str());
    return 1;
  }
  const int32_t vocab = tokenizer->vocab_size();
  const auto start = std::chrono::steady_clock::now();
  auto table = petrel::JsonTokenTable::build(*tokenizer, vocab);
  std::printf("token table: %d tokens in %.1f ms\n", vocab,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3);
  std::vector<float> logits(static_cast<size_t>(vocab), 1.0f), work(logits.size());
  const std::pair<const char*, const char*> states[] = {
      {"start", ""}, {"after '{'", "{"}, {"in a key", "{\"na"}, {"after ':'", "{\"name\": "},
      {"in a string value", "{\"name\": \"Par"}, {"in a number", "{\"n\": 12"}, {"after a value", "{\"n\": 12, \"a\": true"}};
  // One row: the constraint after `text`; timed, its mask computed from the state (prepare(), which the decoding
  // loop runs during a GPU step) on a fresh copy each time, and the prepared mask applied to the logits (mask()).
  std::printf("| state (text so far) | prepare us | apply us | tokens allowed |\n|---|---:|---:|---:|\n");
  auto row = [&](auto& constraint, const char* name, const char* text) {
    auto ids = tokenizer->encode(text, petrel::EncodeOptions{.add_special = false, .parse_special = false, .untrusted_ranges = {}});
    for (int32_t id : *ids) constraint.accept(id);
    const double prepare_us = median_us(reps, [&] {
      auto fresh = constraint;
      fresh.prepare();
    });
    constraint.prepare();
    const double apply_us = median_us(reps, [&] {
      work = logits;
      constraint.mask(work);
    });
    const auto allowed = std::count_if(work.begin(), work.end(), [](float v) { return v > -1e30f; });
    std::printf("| %s (`%s`) | %.0f | %.0f | %lld |\n", name, text, prepare_us, apply_us, static_cast<long long>(allowed));
  };
  for (const auto& [name, text] : states) {
    petrel::JsonObjectConstraint constraint(table, {128009});
    row(constraint, name, text);
  }
  // Rows under a schema (json_schema.h): one constraint a state, after its text.
  using States = std::vector<std::pair<const char*, const char*>>;
  auto schema_rows = [&](const char* schema_text, const States& schema_states) {
    auto schema = petrel::JsonSchema::compile(nlohmann::json::parse(schema_text));
    if (!schema.ok()) {
      std::fprintf(stderr, "%s\n", schema.status().to_string().c_str());
      return false;
    }
    for (const auto& [name, text] : schema_states) {
      petrel::JsonSchemaConstraint constraint(table, *schema, {128009});
      row(constraint, name, text);
    }
    return true;
  };
  // A tool's parameter schema: object keys from a list, typed values.
  if (!schema_rows(R"({"type": "object", "properties": {"location": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                      "days": {"type": "integer"}}, "required": ["location"]})",
                   {{"schema: start", ""}, {"schema: a key", "{\"lo"}, {"schema: a string value", "{\"location\": \"Par"},
                    {"schema: an enum value", "{\"location\": \"Paris\", \"unit\": \"cel"}, {"schema: after a value", "{\"days\": 3"}})) {
    return 1;
  }
  // A string with a "pattern" (regex_dfa.h): every token stepped through the pattern's automaton.
  if (!schema_rows(R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{4}$"},
                      "note": {"type": "string", "pattern": "[a-z]+"}}})",
                   {{"schema: a pattern's value", "{\"code\": \"AB"}, {"schema: an unanchored pattern's value", "{\"note\": \"ab"},
                    {"schema: the same before its match", "{\"note\": \"12"}})) {
    return 1;
  }
  // Bounded numbers (minimum / maximum / multipleOf): each digit token checked against the bounds.
  if (!schema_rows(R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120},
                      "price": {"type": "number", "minimum": 0, "multipleOf": 0.01}, "days": {"type": "integer"}}})",
                   {{"schema: an unbounded integer", "{\"days\": 1"}, {"schema: a bounded integer", "{\"age\": 1"},
                    {"schema: a number, multipleOf 0.01", "{\"price\": 12.3"}})) {
    return 1;
  }
  std::printf("| copy of the logits alone | | %.0f | |\n", median_us(reps, [&] { work = logits; }));
  return 0;
}
