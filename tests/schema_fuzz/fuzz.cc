// Random schemas (numbers, unions, patterns) through compile and random bytes through the automaton, under ASan/UBSan.
#include "petrel/runtime/json_schema.h"
#include <random>
#include <cstdio>
#include <cstdlib>
using njson = nlohmann::json;
std::mt19937_64 rng(1);
njson rnd_schema(int depth) {
  switch (rng() % (depth > 3 ? 6 : 9)) {
    case 0: { njson s = {{"type", "integer"}}; if (rng()%2) s["minimum"] = (double)(int64_t)(rng()%2000) - 1000 + (rng()%2 ? 0.5 : 0);
              if (rng()%2) s["maximum"] = (double)(int64_t)(rng()%2000) - 500; if (rng()%2) s["multipleOf"] = std::vector<double>{0.5, 3, 7, 1e-3, 1e20, 0.1}[rng()%6]; return s; }
    case 1: { njson s = {{"type", "number"}}; if (rng()%2) s["exclusiveMinimum"] = std::ldexp((double)(rng()%1000) - 500, (int)(rng()%80) - 40);
              if (rng()%2) s["maximum"] = std::ldexp((double)(rng()%1000), (int)(rng()%80) - 40); if (rng()%3 == 0) s["multipleOf"] = std::vector<double>{0.25, 0.01, 5, 1e-9, 1e-12, 2.5e-3}[rng()%6]; return s; }
    case 2: return {{"type", "string"}, {"pattern", std::vector<std::string>{"^a+$", "[0-9]{2}", "^(x|yz)*$", "b"}[rng()%4]}};
    case 3: return {{"enum", {"a", "b", 1, nullptr}}};
    case 4: return {{"type", "boolean"}};
    case 5: return {{"const", std::string(1, (char)('a' + rng()%3))}};
    case 6: case 7: {
      njson o = {{"type", "object"}, {"properties", njson::object()}};
      for (int i = rng()%4; i >= 0; --i) o["properties"][std::string(1, (char)('p' + rng()%5))] = rnd_schema(depth + 1);
      if (rng()%2 && !o["properties"].empty()) o["required"] = {o["properties"].begin().key()};
      return o; }
    default: {
      njson a = njson::array();
      for (int i = rng()%3 + 1; i >= 0; --i) { njson o = {{"type", "object"}, {"properties", njson::object()}};
        for (int j = rng()%3; j >= 0; --j) o["properties"][std::string(1, (char)('p' + rng()%4))] = rnd_schema(depth + 2);
        a.push_back(o); }
      if (rng()%3 == 0) a.push_back({{"type", "null"}});
      return {{"anyOf", a}}; }
  }
}
// Some completion of `p` ends the value (depth-first over bytes a generator would write, a bounded search):
// an automaton that took a prefix must never leave the model without a way to finish.
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

int main(int argc, char** argv) {
  const int schemas = argc > 1 ? std::atoi(argv[1]) : 20000;
  int compiled = 0, fed = 0, dead = 0;
  const std::string alphabet = "{}[]\":, -0123456789.eEtruefalsnabcpqrstxyz\\";
  for (int t = 0; t < schemas; ++t) {
    njson root = {{"type", "object"}, {"properties", {{"r", rnd_schema(0)}, {"s", rnd_schema(1)}}}};
    auto s = petrel::JsonSchema::compile(root);
    if (!s.ok()) continue;
    ++compiled;
    for (int k = 0; k < 20; ++k) {
      petrel::SchemaPrefix p(s->get());
      std::string text = rng()%2 ? "{\"r\": " : "{\"s\": ";
      p.feed(std::string_view(text));
      for (int i = 0; i < 40; ++i) {
        const char c = alphabet[rng() % alphabet.size()];
        if (p.feed((unsigned char)c)) {
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
  std::printf("compiled %d, bytes taken %d, dead ends %d\n", compiled, fed, dead);
  return dead > 0;
}
