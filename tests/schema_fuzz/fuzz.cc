// Random JSON Schemas (numeric bounds and multipleOf, unions of numeric ranges, patterns, enums, object unions, allOf
// of objects and of patterns, nesting) through
// JsonSchema::compile, random bytes through the automaton of each that compiles, and from wherever the bytes stopped a
// bounded search for a completion: an automaton that took a prefix must never leave the model without a way to
// finish. Built with AddressSanitizer and UndefinedBehaviorSanitizer (tests/CMakeLists.txt, scripts/schema_fuzz.sh).
//   petrel_schema_fuzz [SCHEMAS]   exits 1 if any walk reached a dead end (each printed with its schema)
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "petrel/runtime/json_schema.h"

namespace {

using njson = nlohmann::json;

std::mt19937_64 rng(1);

template <typename T>
T pick(const std::vector<T>& options) {
  return options[rng() % options.size()];
}

bool coin() { return rng() % 2 == 0; }

njson random_schema(int depth);

njson random_object(int depth, int max_properties, char first) {
  njson o = {{"type", "object"}, {"properties", njson::object()}};
  for (int i = static_cast<int>(rng() % max_properties); i >= 0; --i) {
    o["properties"][std::string(1, static_cast<char>(first + rng() % 5))] = random_schema(depth + 1);
  }
  if (coin()) o["required"] = {o["properties"].begin().key()};
  return o;
}

njson random_integer() {
  njson s = {{"type", "integer"}};
  if (coin()) s["minimum"] = static_cast<double>(static_cast<int64_t>(rng() % 2000) - 1000) + (coin() ? 0.0 : 0.5);
  if (coin()) s["maximum"] = static_cast<double>(static_cast<int64_t>(rng() % 2000) - 500);
  if (coin()) s["multipleOf"] = pick<double>({0.5, 3, 7, 1e-3, 1e20, 0.1});
  return s;
}

njson random_number() {
  njson s = {{"type", "number"}};
  if (coin()) s["exclusiveMinimum"] = std::ldexp(static_cast<double>(rng() % 1000) - 500, static_cast<int>(rng() % 80) - 40);
  if (coin()) s["maximum"] = std::ldexp(static_cast<double>(rng() % 1000), static_cast<int>(rng() % 80) - 40);
  if (rng() % 3 == 0) s["multipleOf"] = pick<double>({0.25, 0.01, 5, 1e-9, 1e-12, 2.5e-3});
  return s;
}

njson random_schema(int depth) {
  switch (rng() % (depth > 3 ? 6 : 10)) {
    case 0: return random_integer();
    case 1: return random_number();
    case 2: return {{"type", "string"}, {"pattern", pick<std::string>({"^a+$", "[0-9]{2}", "^(x|yz)*$", "b"})}};
    case 3: return {{"enum", {"a", "b", 1, nullptr}}};
    case 4: return {{"type", "boolean"}};
    case 5: return {{"const", std::string(1, static_cast<char>('a' + rng() % 3))}};
    case 6:
    case 7: return random_object(depth, 4, 'p');
    case 8: {  // a union of objects (pydantic's Union of models), sometimes with null; or of integers and numbers
      njson branches = njson::array();
      if (rng() % 3 == 0) {  // their ranges enforced together (up to JsonSchema::kMaxNumericRanges)
        for (int i = static_cast<int>(rng() % 4) + 1; i >= 0; --i) branches.push_back(coin() ? random_integer() : random_number());
        if (coin()) branches.push_back({{"type", "string"}});
        return {{"anyOf", branches}};
      }
      for (int i = static_cast<int>(rng() % 3) + 1; i >= 0; --i) branches.push_back(random_object(depth + 1, 3, 'p'));
      if (rng() % 3 == 0) branches.push_back({{"type", "null"}});
      return {{"anyOf", branches}};
    }
    default: {  // allOf of objects whose properties overlap, sometimes narrowing numbers or joining a union
      if (rng() % 4 == 0) {  // or of strings: their patterns (and a format) intersected
        const auto pattern = [&] { return pick<std::string>({"^a+$", "[0-9]{2}", "^(x|yz)*$", "b", "^[a-z0-9]{1,5}$", "^.{2,}$"}); };
        njson parts = njson::array({{{"type", "string"}, {"pattern", pattern()}}, {{"pattern", pattern()}}});
        if (coin()) parts.push_back({{"format", pick<std::string>({"date", "uuid", "email"})}});
        return {{"allOf", parts}};
      }
      njson parts = njson::array({random_object(depth + 1, 3, 'p'), random_object(depth + 1, 3, 'r')});
      if (coin()) parts.push_back({{"properties", {{"p", {{"type", "integer"}, {"minimum", static_cast<int>(rng() % 50)}}}}}});
      if (rng() % 3 == 0) parts.push_back({{"anyOf", {random_object(depth + 2, 2, 'p'), random_object(depth + 2, 2, 't')}}});
      return {{"allOf", parts}};
    }
  }
}

// Some completion of `p` ends the value (depth-first over the bytes a generator would write, a bounded search).
bool completes(const petrel::SchemaPrefix& p, int depth, long& budget) {
  if (p.complete()) return true;
  if (depth == 0 || --budget < 0) return false;
  static const std::string order = "}]\"0,:1-.23456789abcdefghijklmnopqrstuvwxyz[{ ";
  for (char c : order) {
    petrel::SchemaPrefix next = p;
    if (next.feed(static_cast<unsigned char>(c)) && completes(next, depth - 1, budget)) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const int schemas = argc > 1 ? std::atoi(argv[1]) : 20000;
  int compiled = 0, fed = 0, dead = 0;
  const std::string alphabet = "{}[]\":, -0123456789.eEtruefalsnabcpqrstxyz\\";
  for (int t = 0; t < schemas; ++t) {
    const njson root = {{"type", "object"}, {"properties", {{"r", random_schema(0)}, {"s", random_schema(1)}}}};
    auto schema = petrel::JsonSchema::compile(root);
    if (!schema.ok()) continue;
    ++compiled;
    for (int walk = 0; walk < 20; ++walk) {
      petrel::SchemaPrefix p(schema->get());
      std::string text = coin() ? "{\"r\": " : "{\"s\": ";
      p.feed(std::string_view(text));
      for (int i = 0; i < 40; ++i) {
        const char c = alphabet[rng() % alphabet.size()];
        if (p.feed(static_cast<unsigned char>(c))) {
          ++fed;
          text.push_back(c);
        }
      }
      long budget = 20000;
      if (!completes(p, 80, budget) && budget >= 0) {
        std::printf("no completion found (search exhausted) after %s for schema %s\n", text.c_str(), root.dump().c_str());
        ++dead;
      }
    }
  }
  std::printf("compiled %d of %d, bytes taken %d, dead ends %d\n", compiled, schemas, fed, dead);
  return dead > 0;
}
