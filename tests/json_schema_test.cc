// Schema-constrained decoding (runtime/json_schema.h): what compiles, what the automaton accepts and refuses,
// random instances of a schema (written by nlohmann::json, keys in any order) accepted whole, and constrained
// sampling on tiny-llama31 giving objects the schema allows. tests/openai_client_test.py checks the server's
// answers with Python's jsonschema, an independent validator.
#include "petrel/runtime/json_schema.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/runtime/session.h"
#include "petrel/runtime/token_mask.h"
#include "test_util.h"

namespace petrel {
namespace {

using njson = nlohmann::json;

const char* kWeatherSchema = R"({
  "type": "object",
  "properties": {
    "city": {"type": "string", "description": "where"},
    "days": {"type": "integer"},
    "unit": {"enum": ["c", "f"]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "extra": {"type": ["number", "null"]},
    "nested": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"const": 1}}, "required": ["x"]},
    "free": {},
    "we\"ird": {"type": "boolean"}
  },
  "required": ["city"]
})";

std::shared_ptr<const JsonSchema> weather() {
  auto schema = JsonSchema::compile(njson::parse(kWeatherSchema));
  EXPECT_TRUE(schema.ok()) << schema.status().to_string();
  return schema.ok() ? *schema : nullptr;
}

bool accepts(const JsonSchema& schema, const std::string& text) {
  SchemaPrefix p(&schema);
  for (unsigned char c : text) {
    if (!p.feed(c)) return false;
  }
  return p.complete();
}

TEST(JsonSchema, CompilesTheSubsetAndNamesWhatItCannot) {
  ASSERT_NE(weather(), nullptr);
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type": "string"})", "root must be an object"},
      {R"({"type": "object", "properties": {"a": {"type": "text"}}})", "properties.a.type"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "'b' is not among the properties"},
      {R"({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "string"}]}}})", "anyOf"},
      {R"({"type": "object", "properties": {"a": {"enum": []}}})", "enum"},
  };
  for (const auto& [text, what] : bad) {
    auto schema = JsonSchema::compile(njson::parse(text));
    ASSERT_FALSE(schema.ok()) << text;
    EXPECT_NE(schema.status().message().find(what), std::string::npos) << schema.status().message();
  }
}

TEST(JsonSchema, AcceptsWhatTheSchemaAllowsAndNothingElse) {
  auto schema = weather();
  ASSERT_NE(schema, nullptr);
  for (const char* ok : {R"({"city": "Paris"})", R"({"days": 3, "city": "x", "unit": "f"})",
                         R"({"city":"a","tags":["x","y"],"extra":null,"nested":{"x":true}})",
                         R"({"city":"a","extra":-1.5e3, "nested": {"y": 1, "x": false}})", R"({"city":"a","tags":[]})",
                         R"({"city":"a","free":{"any":[1,{"b":null}]}})", R"({"city":"a","free":-0.5})",
                         R"({"we\"ird": true, "city": "\u00e9"})", R"( { "city" : "a" , "days" : -0 } )"}) {
    std::string text = ok;
    while (text.back() == ' ') text.pop_back();  // nothing may follow the object
    EXPECT_TRUE(accepts(*schema, text)) << text;
  }
  for (const char* bad : {"{}", R"({"city": 1})", R"({"city":"a","days":1.5})", R"({"city":"a","days":1e3})",
                          R"({"city":"a","unit":"k"})", R"({"city":"a","unit":"cc"})", R"({"city":"a","city":"b"})",
                          R"({"city":"a","zzz":1})", R"({"city":"a","nested":{}})", R"({"city":"a","nested":{"y":2,"x":true}})",
                          R"({"city":"a","tags":[1]})", R"({"city":"a","tags":["x",]})", R"({"city":"a",})",
                          R"({"city":"a","extra":"s"})", R"({"city":"a","weird":true})", R"(["city"])",
                          R"({"city":"a"} )", R"({"city":"a","free":})"}) {
    EXPECT_FALSE(accepts(*schema, bad)) << bad;
  }
  // Dead ends are refused where they start: a key already given cannot be begun again.
  SchemaPrefix again(schema.get());
  EXPECT_FALSE(again.feed(std::string_view(R"({"city":"a","ci)"))) << "a key already given cannot be begun again";
  SchemaPrefix fresh(schema.get());
  EXPECT_TRUE(fresh.feed(std::string_view(R"({"city":"a","da)")));
}

// minItems / maxItems: arrays with as many items as allowed, and the comma or bracket that would leave the range
// refused where it comes; random arrays written by nlohmann::json judged by their length.
TEST(JsonSchema, ArraysKeepToMinItemsAndMaxItems) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
          "any": {"type": "array", "maxItems": 1}, "none": {"type": "array", "maxItems": 0}}, "required": ["tags"]})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  for (const char* ok : {R"({"tags":["a"]})", R"({"tags":["a","b"]})", R"({"tags":[ "a" , "b" ]})", R"({"tags":["a"],"any":[]})",
                         R"({"tags":["a"],"any":[{"x":[1,2,3]}]})", R"({"tags":["a"],"none":[]})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"tags":[]})", R"({"tags":["a","b","c"]})", R"({"tags":["a"],"any":[1,2]})",
                          R"({"tags":["a"],"none":[1]})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
  SchemaPrefix third(schema->get());
  EXPECT_FALSE(third.feed(std::string_view(R"({"tags":["a","b",)"))) << "a third item's comma";
  SchemaPrefix empty(schema->get());
  EXPECT_FALSE(empty.feed(std::string_view(R"({"tags":[])"))) << "an empty tags array's bracket";
  std::mt19937 rng(9);
  for (int trial = 0; trial < 500; ++trial) {
    njson o = {{"tags", njson::array()}};
    const unsigned n = rng() % 5;
    for (unsigned i = 0; i < n; ++i) o["tags"].push_back(std::string(rng() % 3, 'x'));
    const std::string written = o.dump(rng() % 2 ? 1 : -1);
    EXPECT_EQ(accepts(**schema, written), n >= 1 && n <= 2) << written;
  }
  for (const char* bad : {R"({"type": "object", "properties": {"a": {"type": "array", "minItems": -1}}})",
                          R"({"type": "object", "properties": {"a": {"type": "array", "maxItems": "2"}}})",
                          R"({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 2}}})"}) {
    auto refused = JsonSchema::compile(njson::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("properties.a.m"), std::string::npos) << refused.status().message();
  }
}

// $ref into $defs / definitions (pydantic v2 and v1, zod), recursive ones, a one-schema allOf and a $ref as the
// root: followed; references that lead nowhere refused naming the place.
const char* kRefSchema = R"({
  "$defs": {
    "Item": {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["name"]},
    "Tree": {"type": "object", "properties": {
      "label": {"type": "string"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}},
      "next": {"anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "null"}]}}, "required": ["label"]}
  },
  "definitions": {"Old": {"enum": ["a", "b"]}},
  "type": "object",
  "properties": {
    "item": {"$ref": "#/$defs/Item", "description": "a sibling of $ref is ignored"},
    "old": {"allOf": [{"$ref": "#/definitions/Old"}], "description": "v1"},
    "tree": {"$ref": "#/$defs/Tree"}
  },
  "required": ["item"]
})";

TEST(JsonSchema, RefsAreFollowedRecursiveOnesToo) {
  auto schema = JsonSchema::compile(njson::parse(kRefSchema));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  for (const char* ok : {R"({"item":{"name":"x"}})", R"({"item":{"qty":2,"name":"x"},"old":"b"})",
                         R"({"item":{"name":"x"},"tree":{"label":"r","kids":[{"label":"c","kids":[]},{"label":"d"}],"next":{"label":"n","next":null}}})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"item":{"qty":2}})", R"({"item":{"name":"x"},"old":"c"})", R"({"item":{"name":"x"},"tree":{"kids":[]}})",
                          R"({"item":{"name":"x"},"tree":{"label":"r","next":1}})", R"({"item":{"name":"x"},"tree":{"label":"r","kids":[{"kids":[]}]}})",
                          R"({"item":{"name":"x","zz":1}})", R"({"old":"a"})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
  // Random trees written by nlohmann::json: accepted down to the automaton's depth; past it the chain must end in
  // null ('{' refused where it would go deeper, so generation cannot run away).
  std::mt19937 rng(5);
  std::function<njson(int)> tree = [&](int depth) {
    njson t = {{"label", std::string(rng() % 3, 'q')}};
    if (depth > 0 && rng() % 2) {
      t["kids"] = njson::array();
      for (unsigned i = rng() % 3; i > 0; --i) t["kids"].push_back(tree(depth - 1));
    }
    if (rng() % 2) t["next"] = depth > 0 && rng() % 2 ? tree(depth - 1) : njson(nullptr);
    return t;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const njson o = {{"item", {{"name", "n"}}}, {"tree", tree(static_cast<int>(rng() % 6))}};
    ASSERT_TRUE(accepts(**schema, o.dump(rng() % 2 ? 1 : -1))) << o.dump();
  }
  std::string deep = R"({"item":{"name":"x"},"tree":)";
  for (int d = 1; d < SchemaPrefix::kMaxDepth; ++d) deep += R"({"label":"a","next":)";
  SchemaPrefix at_limit(schema->get());
  ASSERT_TRUE(at_limit.feed(std::string_view(deep)));
  SchemaPrefix deeper = at_limit;
  EXPECT_FALSE(deeper.feed('{'));
  EXPECT_TRUE(at_limit.feed(std::string_view("null")));

  // The root may be a $ref; its target's errors name the place that refers to it.
  auto rooted = JsonSchema::compile(njson::parse(R"({"$ref": "#/$defs/Item", "$defs": {"Item": {"type": "object", "properties": {"a": {"type": "boolean"}}}}})"));
  ASSERT_TRUE(rooted.ok()) << rooted.status().to_string();
  EXPECT_TRUE(accepts(**rooted, R"({"a":true})"));
  EXPECT_FALSE(accepts(**rooted, R"({"a":1})"));
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}})", "properties.a.$ref: 'other.json#/x' is not a place in this schema"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}})", "properties.a.$ref: '#/$defs/Missing' names nothing"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#$defs"}}})", "is not a JSON pointer"},
      {R"({"type": "object", "properties": {"a": {"$ref": 3}}})", "properties.a.$ref: expected a string"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/A"}}})", "a cycle of $refs"},
      {R"({"type": "object", "properties": {"a": {"$ref": "#/$defs/S"}}, "$defs": {"S": {"type": "text"}}})", "properties.a.type"},
  };
  for (const auto& [text, what] : bad) {
    auto refused = JsonSchema::compile(njson::parse(text));
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_NE(refused.status().message().find(what), std::string::npos) << refused.status().message();
  }
}

// allOf: the parts merged into one schema (properties and required joined, types, enums and bounds intersected,
// a union beside a base object narrowed branch by branch); parts with nothing in common are a 400 naming allOf.
TEST(JsonSchema, AllOfAllowsWhatEveryPartAllows) {
  auto merged = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {
      "pet": {"allOf": [
          {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "string"]}}, "required": ["name"]},
          {"$ref": "#/$defs/Aged"},
          {"properties": {"name": {"maxLength": 3}}, "title": "annotations are no constraint"}]},
      "size": {"allOf": [{"enum": ["s", "m", "l"]}, {"enum": ["m", "l", "xl"]}]},
      "n": {"allOf": [{"type": "number", "minimum": 2}, {"type": "integer", "maximum": 5}, {"minimum": 3}]}},
    "$defs": {"Aged": {"properties": {"age": {"type": "number", "minimum": 1}}, "required": ["age"]}}})"));
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  for (const char* ok : {R"({"pet":{"name":"Rex","age":3}})", R"({"pet":{"age":1,"name":""}})", R"({"size":"m","n":3})",
                         R"({"n":5,"size":"l"})"}) {
    EXPECT_TRUE(accepts(**merged, ok)) << ok;
  }
  for (const char* bad : {R"({"pet":{"name":"Rex"}})", R"({"pet":{"age":3}})", R"({"pet":{"name":"Rexy","age":3}})",
                          R"({"pet":{"name":"R","age":"3"}})", R"({"pet":{"name":"R","age":0}})", R"({"pet":{"name":"R","age":1.5}})",
                          R"({"size":"s"})", R"({"size":"xl"})", R"({"n":2})", R"({"n":6})", R"({"n":3.5})"}) {
    EXPECT_FALSE(accepts(**merged, bad)) << bad;
  }
  // A base object and a union of its variants (allOf distributes over anyOf): each variant with the base's keys.
  auto variants = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"shape": {"allOf": [
      {"type": "object", "properties": {"kind": {"type": "string"}, "id": {"type": "integer"}}, "required": ["kind", "id"]},
      {"anyOf": [{"properties": {"kind": {"const": "circle"}, "r": {"type": "number"}}, "required": ["r"]},
                 {"properties": {"kind": {"const": "square"}, "side": {"type": "number"}}}]}]}}})"));
  ASSERT_TRUE(variants.ok()) << variants.status().to_string();
  for (const char* ok : {R"({"shape":{"kind":"circle","id":1,"r":2}})", R"({"shape":{"id":1,"kind":"square"}})",
                         R"({"shape":{"kind":"square","side":1.5,"id":2}})"}) {
    EXPECT_TRUE(accepts(**variants, ok)) << ok;
  }
  for (const char* bad : {R"({"shape":{"kind":"circle","id":1}})", R"({"shape":{"kind":"square","r":2,"id":1}})",
                          R"({"shape":{"kind":"triangle","id":1}})", R"({"shape":{"kind":"square"}})"}) {
    EXPECT_FALSE(accepts(**variants, bad)) << bad;
  }
  // A part with additionalProperties false allows only its own keys: the other parts' optional ones are dropped.
  auto closed = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"o": {"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "additionalProperties": false},
      {"properties": {"b": {"minimum": 2}, "c": {"type": "integer"}}}]}}})"));
  ASSERT_TRUE(closed.ok()) << closed.status().to_string();
  EXPECT_TRUE(accepts(**closed, R"({"o":{"a":1,"b":2}})"));
  EXPECT_FALSE(accepts(**closed, R"({"o":{"a":1,"c":2}})"));
  EXPECT_FALSE(accepts(**closed, R"({"o":{"b":1}})"));
  // A recursive schema narrowed by allOf: its references stay references (one node for the recursion).
  auto recursive = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {
      "n": {"allOf": [{"$ref": "#/$defs/Node"}, {"required": ["v"]}]}},
    "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/$defs/Node"}}}}})"));
  ASSERT_TRUE(recursive.ok()) << recursive.status().to_string();
  EXPECT_TRUE(accepts(**recursive, R"({"n":{"v":1,"next":{"next":{}}}})"));
  EXPECT_FALSE(accepts(**recursive, R"({"n":{"next":{}}})"));
  // Two patterns, or a pattern and a format: a string must match both (their automata intersected); two
  // multipleOf: a multiple of their least common multiple.
  auto strings = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {
      "id": {"allOf": [{"type": "string", "pattern": "^[a-z0-9]+$"}, {"pattern": "^.{3}$"}, {"pattern": "[0-9]"}]},
      "day": {"allOf": [{"type": "string", "format": "date"}, {"pattern": "^2024-"}]},
      "both": {"allOf": [{"allOf": [{"pattern": "^a"}, {"pattern": "b$"}]}, {"type": "string", "pattern": "^.{2,4}$"}]},
      "year": {"type": "string", "format": "date", "pattern": "^19"},
      "dozen": {"allOf": [{"type": "integer", "multipleOf": 4}, {"multipleOf": 6}]},
      "step": {"allOf": [{"type": "number", "multipleOf": 0.5}, {"multipleOf": 0.3}]}}})"));
  ASSERT_TRUE(strings.ok()) << strings.status().to_string();
  for (const char* ok : {R"({"id":"ab1"})", R"({"id":"9zz"})", R"({"day":"2024-02-29"})", R"({"both":"ab"})", R"({"both":"axxb"})",
                         R"({"year":"1999-12-31"})", R"({"dozen":24})", R"({"dozen":-12})", R"({"step":1.5})", R"({"step":3})"}) {
    EXPECT_TRUE(accepts(**strings, ok)) << ok;
  }
  for (const char* bad : {R"({"id":"abc"})", R"({"id":"ab12"})", R"({"id":"Ab1"})", R"({"day":"2023-02-28"})",
                          R"({"day":"2024-13-01"})", R"({"both":"ba"})", R"({"both":"axxxb"})", R"({"both":"a"})",
                          R"({"year":"2001-01-01"})", R"({"year":"19"})", R"({"dozen":8})", R"({"dozen":18})", R"({"step":0.5})",
                          R"({"step":0.9})", R"({"step":2})"}) {
    EXPECT_FALSE(accepts(**strings, bad)) << bad;
  }
  // A pattern beside a format in one schema is one automaton: "19" followed by what no date has dies at once.
  SchemaPrefix year(strings->get());
  EXPECT_TRUE(year.feed(std::string_view(R"({"year":"19)")));
  EXPECT_FALSE(year.feed(static_cast<unsigned char>('a')));
  // A lone allOf part beside other keywords is merged too (before, the keywords beside it were dropped).
  auto beside = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"x": {"allOf": [{"$ref": "#/$defs/N"}], "maximum": 9}}, "$defs": {"N": {"type": "integer"}}})"));
  ASSERT_TRUE(beside.ok()) << beside.status().to_string();
  EXPECT_TRUE(accepts(**beside, R"({"x":9})"));
  EXPECT_FALSE(accepts(**beside, R"({"x":10})"));
  const std::pair<const char*, const char*> bad[] = {
      {R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}}})", "allOf: its parts allow no type in common"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"enum": [1, 2]}, {"const": 3}]}}})", "allOf: the parts' enum/const values have none in common"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, false]}}})", "allOf: a part is false"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, 3]}}})", "allOf: a part must be a schema"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"type": "string", "pattern": "^x+$"}, {"pattern": "^y"}]}}})", "no string matches both"},
      {R"({"type": "object", "properties": {"m": {"allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}}, "$defs": {
          "A": {"type": "object", "properties": {"a": {"type": "integer"}, "next": {"$ref": "#/$defs/A"}}},
          "B": {"type": "object", "properties": {"b": {"type": "integer"}, "next": {"$ref": "#/$defs/B"}}}}})",
       "properties.m.allOf: its parts merge deeper than 16 levels (two different recursive schemas cannot be merged)"},
      {R"({"type": "object", "properties": {"a": {"allOf": [{"properties": {"b": {}}, "additionalProperties": false},
          {"properties": {"c": {}}, "required": ["c"]}]}}})", "allOf: 'c' is required, but a part with additionalProperties false"},
  };
  for (const auto& [text, what] : bad) {
    auto refused = JsonSchema::compile(njson::parse(text));
    ASSERT_FALSE(refused.ok()) << text;
    EXPECT_NE(refused.status().message().find(what), std::string::npos) << refused.status().message();
  }
}

// Characters of a string as JSON Schema counts them (code points) from its UTF-8 bytes: the bytes that do not
// continue a character.
size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// minLength / maxLength in characters: escapes, multi-byte characters and surrogate pairs counted as nlohmann::json
// parses them; the byte that would pass maxLength, and a closing quote before minLength, refused where they come.
TEST(JsonSchema, StringsKeepToMinLengthAndMaxLength) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"code": {"type": ["string", "null"], "minLength": 2, "maxLength": 3},
          "long": {"type": "string", "maxLength": 100}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  for (const char* ok : {R"({"code":"ab"})", R"({"code":"abc"})", "{\"code\":\"\xC3\xA9\xF0\x9F\x98\x80\"}", R"({"code":"\u00e9\n"})",
                         R"({"code":"\ud83d\ude00x"})", R"({"code":null})", R"({"code":"\"\\/"})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"code":"a"})", R"({"code":"abcd"})", R"({"code":""})", R"({"code":"\n\n\n\n"})",
                          "{\"code\":\"\xF0\x9F\x98\x80\"}", R"({"code":"\ud83d\ude00\ud83d\ude00\ud83d\ude00\ud83d\ude00"})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
  SchemaPrefix full(schema->get());
  ASSERT_TRUE(full.feed(std::string_view(R"({"code":"abc)")));
  SchemaPrefix more = full;
  EXPECT_FALSE(more.feed('d'));
  more = full;
  EXPECT_FALSE(more.feed('\\'));
  EXPECT_TRUE(full.feed('"'));
  // A plain token (at most kMaxPlainBytes characters) may come anywhere only while it cannot pass maxLength.
  SchemaPrefix lng(schema->get());
  ASSERT_TRUE(lng.feed(std::string_view(R"({"long":")")));
  EXPECT_TRUE(lng.in_plain_string());
  ASSERT_TRUE(lng.feed(std::string_view(std::string(40, 'x'))));
  EXPECT_FALSE(lng.in_plain_string());

  std::mt19937 rng(3);
  const std::vector<std::string> pieces = {"a", " ", "\xC3\xA9", "\"", "\\", "\n", "\xF0\x9F\x98\x80", "\x01"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string value;
    for (unsigned i = rng() % 6; i > 0; --i) value += pieces[rng() % pieces.size()];
    const njson o = {{"code", value}};
    const std::string written = o.dump(-1, ' ', rng() % 2 == 0);  // half the time \u escapes (surrogate pairs)
    const size_t n = code_points(value);
    EXPECT_EQ(accepts(**schema, written), n >= 2 && n <= 3) << written;
  }
  for (const char* bad : {R"({"type": "object", "properties": {"a": {"type": "string", "minLength": -1}}})",
                          R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 2}}})"}) {
    auto refused = JsonSchema::compile(njson::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find("properties.a.minLength"), std::string::npos) << refused.status().message();
  }
}

// minimum / maximum / exclusive bounds of integers: random integers written by nlohmann::json accepted exactly when
// in bounds, and a digit no integer in bounds can begin with refused where it comes.
TEST(JsonSchema, IntegersKeepToTheirBounds) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 120},
          "x": {"type": ["integer", "null"], "exclusiveMinimum": 0, "exclusiveMaximum": 10}, "big": {"type": "integer", "minimum": 1000},
          "old": {"type": "integer", "minimum": 2.5, "exclusiveMaximum": true, "maximum": 4}, "f": {"type": "number", "minimum": 0}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  const auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  std::mt19937 rng(13);
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t v = trial < 400 ? trial - 200 : static_cast<int64_t>(rng() % 4001) - 2000;
    for (const auto& [key, lo, hi] : {std::tuple<const char*, int64_t, int64_t>{"n", -5, 120}, {"x", 1, 9}, {"big", 1000, INT64_MAX}, {"old", 3, 3}}) {
      const std::string written = njson{{key, v}}.dump(rng() % 2 ? 1 : -1);
      EXPECT_EQ(accepts(**schema, written), in(v, lo, hi)) << written;
    }
  }
  for (const char* ok : {R"({"x":null})", R"({"f":1.5})", R"({"f":0.000000001})", R"({"big":99999999999999999999})", R"({"n":-0})", R"({"n":0})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  // A bounded number: no exponent, at most JsonSchema::kMaxScale fraction digits.
  for (const char* bad : {R"({"f":-1.5})", R"({"f":1e3})", R"({"f":0.0000000001})"}) EXPECT_FALSE(accepts(**schema, bad)) << bad;
  for (const auto& [prefix, next, allowed] : {std::tuple<const char*, char, bool>{R"({"n":-)", '6', false}, {R"({"n":-)", '5', true},
                                              {R"({"n":1)", '2', true}, {R"({"n":13)", '0', false}, {R"({"n":12)", '0', true},
                                              {R"({"big":)", '0', false}, {R"({"big":)", '9', true}, {R"({"x":)", '-', false},
                                              {R"({"n":)", '-', true}, {R"({"n":1)", '.', false}}) {
    SchemaPrefix state(schema->get());
    ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
    EXPECT_EQ(state.feed(static_cast<unsigned char>(next)), allowed) << prefix << next;
  }
  for (const auto& [bad, what] : {std::pair<const char*, const char*>{R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": "1"}}})", "properties.a.minimum: expected a number"},
                                  {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 4}}})", "properties.a.minimum: no integer"},
                                  {R"({"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}}})", "no integer"}}) {
    auto refused = JsonSchema::compile(njson::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find(what), std::string::npos) << refused.status().message();
  }
}

// A JSON number's text as JSON Schema validators judge it against bounds and multipleOf, written here apart from
// the automaton: the grammar by hand, the bounds on the nearest double (strtod), multipleOf in exact decimals;
// plus petrel's subset (no exponent, at most `scale` fraction digits, none for integers).
struct NumberSpec {
  bool integer = false;
  int scale = 0;                         // fraction digits the automaton writes at most
  int64_t multiple = 0;                  // multipleOf = multiple / 10^multiple_scale; 0: none
  int multiple_scale = 0;
  double lo = -1e300, hi = 1e300;
  bool lo_exclusive = false, hi_exclusive = false;
};

bool number_allowed(const std::string& s, const NumberSpec& spec) {
  size_t i = s[0] == '-' ? 1 : 0;
  const size_t int_start = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  const size_t int_digits = i - int_start;
  if (int_digits == 0 || (int_digits > 1 && s[int_start] == '0')) return false;
  size_t fraction = 0;
  if (i < s.size() && s[i] == '.') {
    const size_t f0 = ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    fraction = i - f0;
    if (fraction == 0) return false;
  }
  if (i != s.size() || (spec.integer && fraction > 0) || static_cast<int>(fraction) > spec.scale) return false;
  const double v = std::strtod(s.c_str(), nullptr);
  if (spec.lo_exclusive ? !(v > spec.lo) : !(v >= spec.lo)) return false;
  if (spec.hi_exclusive ? !(v < spec.hi) : !(v <= spec.hi)) return false;
  if (spec.multiple == 0) return true;
  // value / multipleOf = (D / 10^f) / (m / 10^k) = D * 10^k / (m * 10^f), D all the digits
  __int128 d = 0, num_scale = 1, den = spec.multiple;
  for (char c : s) {
    if (std::isdigit(static_cast<unsigned char>(c))) d = d * 10 + (c - '0');
  }
  for (int k = 0; k < spec.multiple_scale; ++k) num_scale *= 10;
  for (size_t k = 0; k < fraction; ++k) den *= 10;
  return d * num_scale % den == 0;
}

// Every prefix of every text `spec` allows with at most 4 fraction digits and a value within 1 of its bounds: a
// witness for every live prefix of up to 5 characters (the bounds finite).
void add_allowed_prefixes(const NumberSpec& spec, std::set<std::string>& prefixes) {
  const int gen_scale = std::min(spec.scale, 4);
  double p = 1;
  for (int k = 0; k < gen_scale; ++k) p *= 10;
  const auto add = [&](const std::string& text) {
    if (!number_allowed(text, spec)) return;
    for (size_t n = 1; n <= text.size(); ++n) prefixes.insert(text.substr(0, n));
  };
  for (int64_t n = static_cast<int64_t>(std::floor(spec.lo - 1) * p); n <= static_cast<int64_t>(std::ceil(spec.hi + 1) * p); ++n) {
    const int64_t magnitude = n < 0 ? -n : n;
    const std::string int_part = std::to_string(magnitude / static_cast<int64_t>(p));
    std::string frac = gen_scale == 0 ? "" : std::to_string(magnitude % static_cast<int64_t>(p));
    frac = std::string(static_cast<size_t>(gen_scale) - frac.size(), '0') + frac;
    for (int f = 0; f <= gen_scale; ++f) {
      const std::string body = f == 0 ? int_part : int_part + "." + frac.substr(0, static_cast<size_t>(f));
      if (f < gen_scale && frac.substr(static_cast<size_t>(f)).find_first_not_of('0') != std::string::npos) continue;
      add(body);
      add("-" + body);  // -0 forms too
    }
  }
}

// Every text of up to 5 characters over "-0123456789." as the value of "v" in `schema`: the automaton takes it as a
// prefix exactly when live(text), and as a whole value exactly when allowed(text).
void check_number_texts(const JsonSchema& schema, const std::string& what, const std::function<bool(const std::string&)>& live,
                        const std::function<bool(const std::string&)>& allowed) {
  const std::string alphabet = "-0123456789.";
  SchemaPrefix start(&schema);
  ASSERT_TRUE(start.feed(std::string_view(R"({"v":)")));
  std::string s;
  std::function<void(SchemaPrefix)> walk = [&](SchemaPrefix state) {
    for (char ch : alphabet) {
      s.push_back(ch);
      SchemaPrefix next = state;
      const bool taken = next.feed(static_cast<unsigned char>(ch));
      ASSERT_EQ(taken, live(s)) << what << ": prefix " << s;
      if (taken) {
        SchemaPrefix closed = next;
        EXPECT_EQ(closed.feed('}') && closed.complete(), allowed(s)) << what << ": value " << s;
        if (s.size() < 5) walk(next);
      }
      s.pop_back();
    }
  };
  walk(start);
}

// minimum / maximum / exclusive bounds and multipleOf on integers and numbers: every text of up to 5 characters
// over "-0123456789." accepted as a value exactly when a validator allows it, and as a prefix exactly when some
// allowed text begins with it (the allowed texts enumerated from the bounds); the bounds compared as doubles
// (0.29 <= maximum 0.29), multipleOf in exact decimals (0.3 is a multiple of 0.1, which a float quotient misses).
TEST(JsonSchema, NumbersKeepToBoundsAndMultiples) {
  struct Case {
    const char* schema;
    NumberSpec spec;
  };
  const Case cases[] = {
      {R"({"type": "integer", "minimum": -50, "maximum": 50, "multipleOf": 3})", {true, 0, 3, 0, -50, 50}},
      {R"({"type": "number", "minimum": -2.5, "maximum": 7.25, "multipleOf": 0.25})", {false, 2, 25, 2, -2.5, 7.25}},
      {R"({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 12, "multipleOf": 5})", {false, 0, 5, 0, -1, 12, true, true}},
      {R"({"type": "integer", "minimum": 2.5, "maximum": 40, "multipleOf": 0.5})", {true, 0, 5, 1, 2.5, 40}},
      {R"({"type": "number", "minimum": 0.29, "maximum": 0.31, "multipleOf": 0.01})", {false, 2, 1, 2, 0.29, 0.31}},
      {R"({"type": "number", "minimum": 0.1, "maximum": 0.7, "multipleOf": 0.1})", {false, 1, 1, 1, 0.1, 0.7}},
      {R"({"type": ["number", "null"], "minimum": -0.5, "exclusiveMaximum": 0.75})", {false, JsonSchema::kMaxScale, 0, 0, -0.5, 0.75, false, true}},
      {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 3, "multipleOf": 1.5e-1})", {false, 2, 15, 2, 0, 3, true, false}},
  };
  for (const Case& c : cases) {
    auto schema = JsonSchema::compile(njson::parse(std::string(R"({"type": "object", "properties": {"v": )") + c.schema + "}}"));
    ASSERT_TRUE(schema.ok()) << c.schema << ": " << schema.status().to_string();
    std::set<std::string> prefixes;
    add_allowed_prefixes(c.spec, prefixes);
    check_number_texts(
        **schema, c.schema, [&](const std::string& text) { return prefixes.count(text) > 0; },
        [&](const std::string& text) { return number_allowed(text, c.spec); });
  }
}

// anyOf of integer and number branches: a value is allowed when one branch allows it, and a prefix is live when some
// branch's value begins with it. Every text of up to 5 characters, as above; a branch's texts are those it allows
// (an unbounded integer branch: every integer text). An unbounded number branch allows every number (nothing to
// enforce); more than JsonSchema::kMaxNumericRanges bounded branches leave the bounds free.
TEST(JsonSchema, NumericBranchesOfAnAnyOfKeepToTheirUnion) {
  struct Case {
    const char* schema;
    std::vector<NumberSpec> branches;
    bool any_integer = false;  // a branch of all integers too
  };
  const Case cases[] = {
      {R"({"anyOf": [{"type": "integer", "minimum": -5, "maximum": 5}, {"type": "integer", "minimum": 40, "maximum": 60, "multipleOf": 10}]})",
       {{true, 0, 0, 0, -5, 5}, {true, 0, 10, 0, 40, 60}}},
      {R"({"anyOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "number", "minimum": -1.5, "maximum": -0.5, "multipleOf": 0.25}, {"type": "null"}]})",
       {{true, 0, 0, 0, 0, 20}, {false, 2, 25, 2, -1.5, -0.5}}},
      {R"({"oneOf": [{"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.9, "multipleOf": 0.1}, {"type": "integer", "minimum": 7, "exclusiveMaximum": 9}, {"type": "number", "minimum": 300, "maximum": 302}]})",
       {{false, 1, 1, 1, 0.5, 0.9, true, false}, {true, 0, 0, 0, 7, 9, false, true}, {false, JsonSchema::kMaxScale, 0, 0, 300, 302}}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "number", "minimum": 0.1, "maximum": 0.3, "multipleOf": 0.1}]})",
       {{false, 1, 1, 1, 0.1, 0.3}}, true},
  };
  const auto integer_prefix = [](const std::string& s) {  // -?(0|[1-9][0-9]*), or its beginning
    const size_t i = s[0] == '-' ? 1 : 0;
    if (i == s.size()) return true;
    if (s.find_first_not_of("0123456789", i) != std::string::npos) return false;
    return s[i] != '0' || s.size() == i + 1;
  };
  for (const Case& c : cases) {
    auto schema = JsonSchema::compile(njson::parse(std::string(R"({"type": "object", "properties": {"v": )") + c.schema + "}}"));
    ASSERT_TRUE(schema.ok()) << c.schema << ": " << schema.status().to_string();
    std::set<std::string> prefixes;
    for (const NumberSpec& spec : c.branches) add_allowed_prefixes(spec, prefixes);
    const auto allowed = [&](const std::string& text) {
      if (c.any_integer && integer_prefix(text) && text != "-") return true;
      for (const NumberSpec& spec : c.branches) {
        if (number_allowed(text, spec)) return true;
      }
      return false;
    };
    check_number_texts(
        **schema, c.schema,
        [&](const std::string& text) { return prefixes.count(text) > 0 || (c.any_integer && integer_prefix(text)); }, allowed);
  }
  // Nothing to enforce: an unbounded number branch, or more bounded branches than are tracked.
  for (const char* loose : {R"({"anyOf": [{"type": "number"}, {"type": "integer", "minimum": 5, "maximum": 6}]})",
                            R"({"anyOf": [{"type": "integer", "maximum": 1}, {"type": "integer", "minimum": 3, "maximum": 3},
                                          {"type": "integer", "minimum": 5, "maximum": 5}, {"type": "integer", "minimum": 7, "maximum": 7},
                                          {"type": "integer", "minimum": 9}]})"}) {
    auto schema = JsonSchema::compile(njson::parse(std::string(R"({"type": "object", "properties": {"v": )") + loose + "}}"));
    ASSERT_TRUE(schema.ok()) << loose << ": " << schema.status().to_string();
    EXPECT_TRUE(accepts(**schema, R"({"v": 4})")) << loose;
  }
  // A branch no number meets matches nothing (JSON Schema), so it is left out, its other types kept; a union
  // left with no branch is an error naming the bounds, as for one schema.
  const auto object_of = [](const std::string& v) {
    return JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"v": )" + v + "}}"));
  };
  auto unmet = object_of(R"({"anyOf": [{"type": "integer", "minimum": 3, "maximum": 2}, {"type": "integer", "minimum": 7, "maximum": 9}]})");
  ASSERT_TRUE(unmet.ok()) << unmet.status().to_string();
  EXPECT_TRUE(accepts(**unmet, R"({"v": 8})"));
  EXPECT_FALSE(accepts(**unmet, R"({"v": 2})"));
  EXPECT_FALSE(accepts(**unmet, R"({"v": 3})"));
  auto strings_left = object_of(R"({"anyOf": [{"type": "number", "minimum": 1, "maximum": 2, "multipleOf": 5}, {"type": "string"}]})");
  ASSERT_TRUE(strings_left.ok()) << strings_left.status().to_string();
  EXPECT_TRUE(accepts(**strings_left, R"({"v": "x"})"));
  EXPECT_FALSE(accepts(**strings_left, R"({"v": 1})"));
  auto mixed = object_of(R"({"anyOf": [{"type": ["number", "string"], "minimum": 5, "maximum": 4}, {"type": "null"}]})");
  ASSERT_TRUE(mixed.ok()) << mixed.status().to_string();
  EXPECT_TRUE(accepts(**mixed, R"({"v": "x"})"));
  EXPECT_TRUE(accepts(**mixed, R"({"v": null})"));
  EXPECT_FALSE(accepts(**mixed, R"({"v": 4})"));
  auto none_left = object_of(R"({"anyOf": [{"type": "integer", "minimum": 3, "maximum": 2}, {"type": "number", "exclusiveMinimum": 1, "maximum": 1}]})");
  ASSERT_FALSE(none_left.ok());
  EXPECT_NE(none_left.status().to_string().find("minimum: no integer lies between the bounds"), std::string::npos)
      << none_left.status().to_string();
  EXPECT_FALSE(object_of(R"({"type": "integer", "minimum": 3, "maximum": 2})").ok());  // a lone schema: as before
}

// One-sided bounds and values past every bound: random integers judged as a validator does, and every prefix of
// an allowed one (up to 60 digits) live.
TEST(JsonSchema, LongNumbersKeepToOneSidedBoundsAndMultiples) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"i": {"type": "integer", "minimum": 1000, "multipleOf": 7},
          "n": {"type": "number", "maximum": -2.5, "multipleOf": 0.5}, "cents": {"type": "number", "multipleOf": 0.01},
          "whole": {"type": "number", "multipleOf": 1}, "huge": {"type": "integer", "minimum": 1e26, "maximum": 1e300}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  std::mt19937_64 rng(29);
  const auto mod = [](const std::string& digits, int m) {
    int r = 0;
    for (char c : digits) r = (r * 10 + (c - '0')) % m;
    return r;
  };
  for (int trial = 0; trial < 4000; ++trial) {
    const size_t length = 1 + rng() % 60;
    std::string digits(1, static_cast<char>('1' + rng() % 9));
    while (digits.size() < length) digits.push_back(static_cast<char>('0' + rng() % 10));
    const bool negative = rng() % 2;
    const std::string text = (negative ? "-" : "") + digits;
    const bool big = length > 4 || std::stoi(digits) >= 1000;
    const bool i_ok = !negative && big && mod(digits, 7) == 0;
    EXPECT_EQ(accepts(**schema, R"({"i":)" + text + "}"), i_ok) << text;
    // n <= -2.5 and a multiple of 0.5: -3, -2.5, -1000.5, ...; written with at most one fraction digit.
    const std::string half = text + (rng() % 2 ? ".5" : ".0");
    const bool n_ok = negative && (length > 1 || digits[0] >= '3' || (digits[0] == '2' && half.back() == '5'));
    EXPECT_EQ(accepts(**schema, R"({"n":)" + half + "}"), n_ok) << half;
    if (i_ok) {
      SchemaPrefix state(schema->get());
      ASSERT_TRUE(state.feed(std::string_view(R"({"i":)")));
      for (char c : text) ASSERT_TRUE(state.feed(static_cast<unsigned char>(c))) << text;
    }
  }
  // multipleOf alone: the places it has, no more (and no exponent).
  for (const auto& [text, ok] : {std::pair<const char*, bool>{R"({"cents":12.34})", true}, {R"({"cents":-0.5})", true}, {R"({"cents":7})", true},
                                 {R"({"cents":1.234})", false}, {R"({"cents":1e2})", false}, {R"({"whole":-12})", true}, {R"({"whole":1.0})", false},
                                 {R"({"huge":100000000000000000000000000})", true}, {R"({"huge":99999999999999900000000000})", false},
                                 {R"({"huge":5000000000000000000000000000000000000000000})", true}}) {
    EXPECT_EQ(accepts(**schema, text), ok) << text;
  }
  // Extreme keywords compile at once and leave values free where they cannot be enforced.
  for (const char* extreme : {R"({"type": "number", "minimum": -1e300, "maximum": 1e300, "multipleOf": 1e-300})",
                              R"({"type": "number", "multipleOf": 1e300, "exclusiveMinimum": 9007199254740993})",
                              R"({"type": "integer", "minimum": 1e27, "maximum": 1e27})", R"({"type": "number", "maximum": 5e-324})",
                              R"({"type": "integer", "multipleOf": 123456789012345678, "minimum": -1.7976931348623157e308})"}) {
    auto compiled = JsonSchema::compile(njson::parse(std::string(R"({"type": "object", "properties": {"a": )") + extreme + "}}"));
    ASSERT_TRUE(compiled.ok()) << extreme << ": " << compiled.status().to_string();
    SchemaPrefix state(compiled->get());
    EXPECT_TRUE(state.feed(std::string_view(R"({"a":)"))) << extreme;
  }
  for (const auto& [bad, what] : {std::pair<const char*, const char*>{R"({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 0}}})", "properties.a.multipleOf: expected a number greater than 0"},
                                  {R"({"type": "object", "properties": {"a": {"type": "number", "multipleOf": "2"}}})", "properties.a.multipleOf: expected a number"},
                                  {R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5}}})", "properties.a.multipleOf: no multiple of 5"},
                                  {R"({"type": "object", "properties": {"a": {"type": "number", "minimum": 0.11, "maximum": 0.19, "multipleOf": 0.1}}})", "no multiple of 0.1"}}) {
    auto refused = JsonSchema::compile(njson::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find(what), std::string::npos) << refused.status().message();
  }
}

// anyOf of several object schemas (pydantic's Union of models): the keys and the values that differ between the
// branches (a const discriminator, a value's type) choose among them as they are written. Random objects in random
// key order, accepted exactly when a hand-written judge of the same schema (with additionalProperties false, as
// OpenAI's strict mode writes it) allows them.
const char* kPetSchema = R"({"$defs": {
    "Cat": {"type": "object", "title": "Cat", "additionalProperties": false, "required": ["kind", "lives"],
            "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer", "minimum": 0, "maximum": 9},
                           "name": {"type": "string", "description": "the cat's name"}}},
    "Dog": {"type": "object", "additionalProperties": false, "required": ["kind"],
            "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}, "name": {"type": "string"}}},
    "Fish": {"type": "object", "additionalProperties": false, "required": ["fins", "water"],
             "properties": {"fins": {"type": "integer"}, "name": {"type": "integer"}, "water": {"enum": ["salt", "fresh"]}}}},
  "type": "object", "additionalProperties": false, "required": ["pet"],
  "properties": {"pet": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Fish"}]},
                 "tag": {"anyOf": [{"type": "object", "additionalProperties": false, "properties": {"a": {"type": "string"}}},
                                   {"type": "object", "additionalProperties": false, "required": ["b"],
                                    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "integer"}}}},
                                   {"type": "null"}]}}})";

bool pet_schema_allows(const njson& o) {
  const auto only = [](const njson& v, std::initializer_list<const char*> keys) {
    if (!v.is_object()) return false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (std::find_if(keys.begin(), keys.end(), [&](const char* k) { return it.key() == k; }) == keys.end()) return false;
    }
    return true;
  };
  const auto is_int = [](const njson& v) { return v.is_number_integer(); };
  const auto pet = [&](const njson& p) {
    const bool cat = only(p, {"kind", "lives", "name"}) && p.contains("kind") && p["kind"] == "cat" && p.contains("lives") &&
                     is_int(p["lives"]) && p["lives"].get<int64_t>() >= 0 && p["lives"].get<int64_t>() <= 9 &&
                     (!p.contains("name") || p["name"].is_string());
    const bool dog = only(p, {"kind", "good", "name"}) && p.contains("kind") && p["kind"] == "dog" &&
                     (!p.contains("good") || p["good"].is_boolean()) && (!p.contains("name") || p["name"].is_string());
    const bool fish = only(p, {"fins", "name", "water"}) && p.contains("fins") && is_int(p["fins"]) && p.contains("water") &&
                      (p["water"] == "salt" || p["water"] == "fresh") && (!p.contains("name") || is_int(p["name"]));
    return cat || dog || fish;
  };
  const auto tag = [&](const njson& t) {
    if (t.is_null()) return true;
    const bool first = only(t, {"a"}) && (!t.contains("a") || t["a"].is_string());
    bool second = only(t, {"a", "b"}) && t.contains("b") && t["b"].is_array() && (!t.contains("a") || is_int(t["a"]));
    if (second) {
      for (const njson& x : t["b"]) second = second && is_int(x);
    }
    return first || second;
  };
  return only(o, {"pet", "tag"}) && o.contains("pet") && pet(o["pet"]) && (!o.contains("tag") || tag(o["tag"]));
}

TEST(JsonSchema, ObjectUnionsFollowTheBranchTheKeysAndValuesChoose) {
  auto schema = JsonSchema::compile(njson::parse(kPetSchema));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  std::mt19937 rng(31);
  const std::vector<std::pair<const char*, std::vector<njson>>> pet_values = {
      {"kind", {"cat", "dog", "fish"}}, {"lives", {-1, 0, 5, 9, 10, "x"}}, {"name", {"Tom", 7, nullptr}},
      {"good", {true, false, "yes"}}, {"fins", {2, "x", 1.5}}, {"water", {"salt", "fresh", "lake"}}};
  const std::vector<njson> tags = {nullptr, njson::object(), njson{{"a", "s"}}, njson{{"a", 3}}, njson{{"a", 3}, {"b", {1, 2}}},
                                   njson{{"a", "s"}, {"b", {1}}}, njson{{"b", njson::array()}}, njson{{"b", {"x"}}}, njson{{"c", 1}}};
  const auto shuffled = [&](const njson& o) {  // an ordered_json with o's keys in a random order, nested objects too
    std::function<nlohmann::ordered_json(const njson&)> go = [&](const njson& v) -> nlohmann::ordered_json {
      if (!v.is_object()) return nlohmann::ordered_json::parse(v.dump());
      std::vector<std::string> keys;
      for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
      std::shuffle(keys.begin(), keys.end(), rng);
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const std::string& k : keys) out[k] = go(v[k]);
      return out;
    };
    return go(o);
  };
  int allowed = 0;
  for (int trial = 0; trial < 6000; ++trial) {
    njson pet = njson::object();
    switch (rng() % 4) {  // one branch's shape, then perhaps changed; or any keys
      case 0: pet = {{"kind", "cat"}, {"lives", rng() % 10}}; break;
      case 1: pet = {{"kind", "dog"}}; break;
      case 2: pet = {{"fins", rng() % 4}, {"water", rng() % 2 ? "salt" : "fresh"}}; break;
      default: break;
    }
    for (const auto& [key, values] : pet_values) {
      if (rng() % (pet.empty() ? 2 : 5) == 0) pet[key] = values[rng() % values.size()];
    }
    njson o = {{"pet", pet}};
    if (rng() % 2) o["tag"] = tags[rng() % tags.size()];
    if (rng() % 16 == 0) o.erase("pet");
    const std::string text = shuffled(o).dump(rng() % 2 ? 1 : -1);
    const bool judged = pet_schema_allows(o);
    allowed += judged;
    EXPECT_EQ(accepts(**schema, text), judged) << text;
  }
  EXPECT_GT(allowed, 300);  // the judge allows a fair share: the test sees both sides
  // A branch that allows any object (untyped, or an object without properties) absorbs the object branches.
  auto loose = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"u": {"anyOf": [
      {"type": "object", "properties": {"x": {"type": "string"}}}, {"type": "object", "properties": {"y": {"type": "integer"}}}, {"enum": ["a", 1]}]}}})"));
  ASSERT_TRUE(loose.ok()) << loose.status().to_string();
  EXPECT_TRUE(accepts(**loose, R"({"u": {"x": 1, "z": [true]}})"));
  // What cannot be told apart while generating is refused by name.
  for (const auto& [bad, what] : {std::pair<const char*, const char*>{R"({"type": "object", "properties": {"u": {"anyOf": [
        {"type": "object", "properties": {"x": {"type": "string", "maxLength": 2}}}, {"type": "object", "properties": {"x": {"type": "string"}}}]}}})",
        "properties.u.anyOf.properties.x.: the anyOf branches give it different schemas of the same type"},
      {R"({"type": "object", "properties": {"u": {"anyOf": [{"type": "object", "properties": {"k": {"const": 1}, "x": {"type": "integer"}}},
        {"type": "object", "properties": {"k": {"const": 2}, "x": {"type": "number"}}}]}}})", "properties.u.anyOf.properties.x.: the anyOf branches give it different schemas of the same type"},
      {R"({"type": "object", "properties": {"u": {"anyOf": [{"type": "object", "properties": {"x": {"type": "object", "properties": {"a": {"type": "string"}}}}},
        {"type": "object", "properties": {"x": {"type": "object", "properties": {"b": {"type": "string"}}}}}]}}})", "properties.u.anyOf.properties.x.: the anyOf branches give it different schemas of the same type"},
      {R"({"type": "object", "properties": {"u": {"anyOf": [{"type": "object", "properties": {"x": {"const": 1}}},
        {"type": "object", "properties": {"x": {"type": "string"}}}]}}})", "properties.u.anyOf.properties.x.: the anyOf branches give it both"}}) {
    auto refused = JsonSchema::compile(njson::parse(bad));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.status().message().find(what), std::string::npos) << refused.status().message();
  }
}

// "format": date, time, date-time and uuid strings written by snprintf from random fields accepted; malformed ones
// (a field out of range, a missing part, an escape, lowercase/uppercase where RFC 3339 allows both) judged as the
// RFC says; other formats left free.
TEST(JsonSchema, StringFormatsKeepTheirShape) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"}, "t": {"type": "string", "format": "time"},
          "dt": {"type": ["string", "null"], "format": "date-time"}, "u": {"type": "string", "format": "uuid"},
          "e": {"type": "string", "format": "uri"}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  std::mt19937 rng(17);
  char buf[96];
  for (int trial = 0; trial < 2000; ++trial) {
    const unsigned y = rng() % 10000, mo = 1 + rng() % 12, d = 1 + rng() % 31, h = rng() % 24, mi = rng() % 60, se = rng() % 61;
    std::snprintf(buf, sizeof buf, "%04u-%02u-%02u", y, mo, d);
    const std::string date = buf;
    std::snprintf(buf, sizeof buf, "%02u:%02u:%02u", h, mi, se);
    std::string time = buf;
    if (rng() % 2) time += "." + std::to_string(rng() % 100000);
    if (rng() % 3 == 0) {
      time += rng() % 2 ? "Z" : "z";
    } else {
      std::snprintf(buf, sizeof buf, "%c%02u:%02u", rng() % 2 ? '+' : '-', static_cast<unsigned>(rng() % 24), static_cast<unsigned>(rng() % 60));
      time += buf;
    }
    std::snprintf(buf, sizeof buf, "%08x-%04x-%04X-%04x-%012llx", static_cast<unsigned>(rng()), static_cast<unsigned>(rng() % 65536),
                  static_cast<unsigned>(rng() % 65536), static_cast<unsigned>(rng() % 65536), static_cast<unsigned long long>(rng()) << 16);
    const std::string uuid = buf;
    const njson o = {{"d", date}, {"t", time}, {"dt", date + (rng() % 2 ? "T" : "t") + time}, {"u", uuid}};
    ASSERT_TRUE(accepts(**schema, o.dump())) << o.dump();
  }
  for (const char* ok : {R"({"dt":null})", R"({"e":"not a uri at all"})", R"({"t":"23:59:60Z"})", R"({"d":"0000-01-01"})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"d":"2024-13-01"})", R"({"d":"2024-00-10"})", R"({"d":"2024-02-32"})", R"({"d":"2024-2-03"})",
                          R"({"d":"2024-02-03T"})", R"({"d":"24-02-03"})", R"({"t":"24:00:00Z"})", R"({"t":"12:60:00Z"})",
                          R"({"t":"12:00:61Z"})", R"({"t":"12:00:00"})", R"({"t":"12:00:00.Z"})", R"({"t":"12:00:00+1:00"})",
                          R"({"dt":"2024-02-03 12:00:00Z"})", R"({"u":"123e4567-e89b-12d3-a456-42661417400"})",
                          R"({"u":"123e4567-e89b-12d3-a456-4266141740000"})", R"({"u":"g23e4567-e89b-12d3-a456-426614174000"})",
                          R"({"d":"2024\u002d02-03"})", R"({"d":""})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
  auto refused = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"a": {"type": "string", "format": 3}}})"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("properties.a.format: expected a string"), std::string::npos) << refused.status().message();
}

// References for the formats enforced through regular expressions, written from their grammars again here
// (glibc's inet_pton for the IP addresses): the automaton must agree with them on every sampled string.
bool is_label(const std::string& l) {
  if (l.empty() || l.size() > 63 || l.front() == '-' || l.back() == '-') return false;
  return std::all_of(l.begin(), l.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; });
}
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts(1);
  for (char c : s) {
    if (c == sep) parts.emplace_back();
    else parts.back() += c;
  }
  return parts;
}
bool is_hostname(const std::string& s) {
  const auto labels = split(s, '.');
  return std::all_of(labels.begin(), labels.end(), is_label);
}
bool is_email(const std::string& s) {
  const size_t at = s.find('@');
  if (at == std::string::npos || s.find('@', at + 1) != std::string::npos) return false;
  const std::string local = s.substr(0, at), domain = s.substr(at + 1);
  const std::string atext = "!#$%&'*+/=?^_`{|}~-";
  for (const std::string& atom : split(local, '.')) {
    if (atom.empty()) return false;
    for (char c : atom) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && atext.find(c) == std::string::npos) return false;
    }
  }
  return domain.find('.') != std::string::npos && is_hostname(domain);
}
// RFC 3339 appendix A's duration, by recursive descent.
bool is_duration(const std::string& s) {
  size_t i = 0;
  auto num = [&](char unit) {  // 1*DIGIT unit
    const size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (i == start || i >= s.size() || s[i] != unit) {
      i = start;
      return false;
    }
    ++i;
    return true;
  };
  auto time = [&] {  // "T" (dur-hour / dur-minute / dur-second)
    if (i >= s.size() || s[i] != 'T') return false;
    ++i;
    if (num('H')) {
      if (num('M')) num('S');
      return true;
    }
    if (num('M')) {
      num('S');
      return true;
    }
    return num('S');
  };
  if (s.empty() || s[0] != 'P') return false;
  i = 1;
  bool ok = false;
  if (num('W')) {
    ok = true;
  } else if (num('D')) {
    ok = true;
    if (i < s.size()) ok = time();
  } else if (num('M')) {
    num('D');
    ok = true;
    if (i < s.size()) ok = time();
  } else if (num('Y')) {
    if (num('M')) num('D');
    ok = true;
    if (i < s.size()) ok = time();
  } else {
    ok = time();
  }
  return ok && i == s.size();
}

TEST(JsonSchema, RegexFormatsAgreeWithReferences) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"v4": {"type": "string", "format": "ipv4"}, "v6": {"type": "string", "format": "ipv6"},
          "host": {"type": "string", "format": "hostname"}, "mail": {"type": "string", "format": "email"},
          "dur": {"type": "string", "format": "duration"}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  std::mt19937 rng(31);
  auto pick = [&](const std::string& chars, int max_len) {
    std::string s;
    for (int n = static_cast<int>(rng() % static_cast<unsigned>(max_len + 1)); n > 0; --n) s += chars[rng() % chars.size()];
    return s;
  };
  struct Case {
    const char* key;
    std::function<bool(const std::string&)> reference;
    std::function<std::string()> sample;
  };
  char buf[64];
  const std::vector<Case> cases = {
      {"v4", [](const std::string& s) { in_addr a; return inet_pton(AF_INET, s.c_str(), &a) == 1; },
       [&] {
         if (rng() % 2) return pick("0123456789.", 16);
         std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", static_cast<unsigned>(rng() % 300), static_cast<unsigned>(rng() % 256),
                       static_cast<unsigned>(rng() % 256), static_cast<unsigned>(rng() % 260));
         return std::string(rng() % 5 ? "" : "0") + buf;
       }},
      {"v6", [](const std::string& s) { in6_addr a; return inet_pton(AF_INET6, s.c_str(), &a) == 1; },
       [&] {
         if (rng() % 4 == 0) return pick("0123456789abcdefABCDEF:.", 24);
         in6_addr a;
         for (auto& b : a.s6_addr) b = static_cast<uint8_t>(rng() % 3 ? 0 : rng());  // zero runs to compress
         char text[INET6_ADDRSTRLEN];
         inet_ntop(AF_INET6, &a, text, sizeof text);
         std::string s = text;
         if (rng() % 3 == 0 && !s.empty()) s.erase(rng() % s.size(), 1);  // a mutation
         return s;
       }},
      {"host", is_hostname, [&] { return pick("abz09-.", 14); }},
      {"mail", is_email, [&] { return pick("ab1.-@+_", 6) + (rng() % 2 ? "@ex.com" : "@x-y.a.b"); }},
      {"dur", is_duration, [&] {
         if (rng() % 2) return "P" + pick("0123456789YMWDTHS", 8);
         std::string s = "P";  // units in order, each there or not, sometimes out of order or with a gap
         for (const char* unit : {"Y", "M", "D", "T", "H", "M", "S"}) {
           if (rng() % 2) s += *unit == 'T' ? std::string("T") : std::to_string(rng() % 100) + unit;
         }
         if (rng() % 4 == 0 && s.size() > 1) std::swap(s[1 + rng() % (s.size() - 1)], s[1 + rng() % (s.size() - 1)]);
         return s;
       }},
  };
  for (const Case& c : cases) {
    int yes = 0;
    for (int i = 0; i < 4000; ++i) {
      const std::string value = c.sample();
      const bool want = c.reference(value);
      yes += want;
      const std::string text = njson{{c.key, value}}.dump();
      ASSERT_EQ(accepts(**schema, text), want) << text;
    }
    EXPECT_GT(yes, 200) << c.key << ": too few valid samples to prove much";
  }
  for (const char* ok : {R"({"v6":"::"})", R"({"v6":"::ffff:192.0.2.1"})", R"({"v6":"2001:db8::8a2e:370:7334"})",
                         R"({"dur":"P3Y6M4DT12H30M5S"})", R"({"dur":"PT0S"})", R"({"dur":"P1W"})", R"({"mail":"a.b+c@example.org"})",
                         R"({"host":"example"})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"v6":"1::2::3"})", R"({"v6":"12345::"})", R"({"dur":"P"})", R"({"dur":"PT"})", R"({"dur":"P1H"})",
                          R"({"mail":"a..b@example.org"})", R"({"mail":"a@example"})", R"({"host":"-a.b"})", R"({"v4":"1.2.3"})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
}

// A string's "pattern" (runtime/regex_dfa.h, tested against PCRE2 in regex_dfa_test.cc): the value keeps to it
// byte by byte, the closing quote only where it matches, no escapes; searched for when not anchored.
TEST(JsonSchema, StringPatternsKeepTheValueToTheRegex) {
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{2,3}$"},
          "word": {"type": ["string", "integer"], "pattern": "日+"}, "short": {"type": "string", "pattern": "^a+$", "maxLength": 3},
          "when": {"type": "string", "format": "date", "pattern": "^2024-"}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  for (const char* ok : {R"({"code":"AB-12"})", R"({"code":"ZZ-999"})", R"({"word":"x日y"})", R"({"word":"日日"})",
                         R"({"word":12})", R"({"short":"aaa"})", R"({"when":"2024-02-03"})"}) {
    EXPECT_TRUE(accepts(**schema, ok)) << ok;
  }
  for (const char* bad : {R"({"code":"AB-1"})", R"({"code":"AB-1234"})", R"({"code":"ab-12"})", R"({"code":"AB12"})",
                          R"({"code":"AB\u002d12"})", R"({"word":"xy"})", R"({"word":"\u65e5"})", R"({"short":"aaaa"})",
                          R"({"short":""})", R"({"when":"2023-02-03"})", R"({"when":"2024-13-03"})"}) {
    EXPECT_FALSE(accepts(**schema, bad)) << bad;
  }
  // Refused at the first byte that no matching value continues with, not at the end.
  SchemaPrefix p(schema->get());
  ASSERT_TRUE(p.feed(std::string_view(R"({"code":"A)")));
  EXPECT_FALSE(p.feed('1'));
  EXPECT_FALSE(p.feed('"'));
  EXPECT_TRUE(p.feed('B'));
  EXPECT_FALSE(p.in_plain_string());  // every token is checked against the pattern
  auto refused = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}})"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("properties.a.pattern at offset 2: missing ')'"), std::string::npos)
      << refused.status().message();
  refused = JsonSchema::compile(njson::parse(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": 7}}})"));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("properties.a.pattern: expected a string"), std::string::npos) << refused.status().message();
}

// The token mask against brute force: at each state, the tokens allowed are exactly those whose bytes the
// automaton takes from that state (the mask judges most by their first two bytes and lets plain tokens through
// wholesale inside strings: this checks both shortcuts), on the Llama 3.1 vocabulary.
template <typename Automaton>
void expect_mask_is_brute_force(const Automaton& state, const JsonTokenTable& table, const std::string& where) {
  std::vector<uint8_t> allowed;
  detail::allowed_tokens(state, table, allowed);
  int wrong = 0;
  for (int32_t id = 0; id < table.size() && wrong < 5; ++id) {
    Automaton trial = state;
    const bool takes = !table.special(id) && !table.bytes(id).empty() && trial.feed(table.bytes(id));
    if (takes != (allowed[static_cast<size_t>(id)] != 0)) {
      ++wrong;
      ADD_FAILURE() << where << ": token " << id << " " << njson(std::string(table.bytes(id))).dump() << " allowed " << int(allowed[static_cast<size_t>(id)])
                    << ", the automaton " << (takes ? "takes" : "refuses") << " it";
    }
  }
}

TEST(TokenMask, AllowsExactlyTheTokensTheAutomatonTakes) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(engine->model().config().vocab_size));
  for (const char* prefix : {"", "{\"a\": \"x", "{\"a\": \"\\ud83d", "{\"a\": \"\\ud83d\\ude00", "{\"a\": [1, \"", "{\"a\": 12"}) {
    JsonPrefix state;
    ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
    expect_mask_is_brute_force(state, *table, std::string("JSON after ") + prefix);
  }
  auto schema = JsonSchema::compile(njson::parse(
      R"({"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 3},
          "long": {"type": "string", "maxLength": 70}, "tree": {"$ref": "#"}, "n": {"type": "integer", "minimum": -5, "maximum": 120},
          "when": {"type": "string", "format": "date-time"}, "id": {"type": "string", "pattern": "^[a-f0-9]{4}-(x|yz)$"},
          "note": {"type": "string", "pattern": "[a-z]{2}", "maxLength": 90}}})"));
  ASSERT_TRUE(schema.ok()) << schema.status().to_string();
  for (const std::string& prefix : std::vector<std::string>{"{\"code\": \"", "{\"code\": \"a", "{\"code\": \"ab", "{\"code\": \"abc", "{\"long\": \"",
                             "{\"long\": \"" + std::string(10, 'y'), "{\"tree\": {\"tree\": {\"co", "{\"long\": \"\\ud83d", "{\"n\": 1", "{\"n\": -", "{\"n\": 12", "{\"when\": \"2024-0", "{\"when\": \"2024-02-03T12:00:00",
                             "{\"id\": \"", "{\"id\": \"ab1", "{\"id\": \"ab12-", "{\"id\": \"ab12-y",
                             "{\"note\": \"", "{\"note\": \"1a", "{\"note\": \"1ab" + std::string(20, 'q')}) {
    SchemaPrefix state(schema->get());
    ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
    expect_mask_is_brute_force(state, *table, "schema after " + prefix);
  }
  // An object of several schemas: keys and literals of the live branches only.
  auto pets = JsonSchema::compile(njson::parse(kPetSchema));
  ASSERT_TRUE(pets.ok()) << pets.status().to_string();
  for (const std::string& prefix : std::vector<std::string>{"{\"pet\": {", "{\"pet\": {\"", "{\"pet\": {\"kind\": \"", "{\"pet\": {\"name\": 3, \"",
                                                            "{\"pet\": {\"kind\": \"dog\"", "{\"pet\": {\"water\": \"salt\", \"",
                                                            "{\"pet\": {\"good\": true, \"kind\": \"", "{\"pet\": {\"kind\": \"cat\", \"lives\": 3, "}) {
    SchemaPrefix state(pets->get());
    ASSERT_TRUE(state.feed(std::string_view(prefix))) << prefix;
    expect_mask_is_brute_force(state, *table, "union schema after " + prefix);
  }
}

// Random instances of the schema, serialized by nlohmann::json with random key order and spacing: all accepted.
TEST(JsonSchema, AcceptsRandomInstancesWrittenByAnotherLibrary) {
  auto schema = weather();
  ASSERT_NE(schema, nullptr);
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"a", "b", " ", "\xC3\xA9", "\"", "\\", "/", "\n", "\xF0\x9F\x98\x80"};
  auto text = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
    return s;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    njson o = njson::object();
    o["city"] = text(static_cast<int>(rng() % 6));
    if (rng() % 2) o["days"] = static_cast<int>(rng() % 2000) - 1000;
    if (rng() % 2) o["unit"] = rng() % 2 ? "c" : "f";
    if (rng() % 2) {
      o["tags"] = njson::array();
      for (unsigned i = rng() % 3; i > 0; --i) o["tags"].push_back(text(2));
    }
    if (rng() % 2) o["extra"] = rng() % 2 ? njson(nullptr) : njson(std::ldexp(static_cast<double>(rng() % 1000) - 500, static_cast<int>(rng() % 40) - 20));
    if (rng() % 2) o["nested"] = rng() % 2 ? njson{{"x", true}} : njson{{"y", 1}, {"x", false}};
    if (rng() % 2) o["free"] = njson{{"k", {1, "two", nullptr}}};
    // Key order: nlohmann::json sorts keys; reverse them half the time through an ordered_json copy.
    std::string written;
    if (rng() % 2) {
      nlohmann::ordered_json reversed = nlohmann::ordered_json::object();
      for (auto it = o.rbegin(); it != o.rend(); ++it) reversed[it.key()] = it.value();
      written = reversed.dump(rng() % 2 ? 1 : -1);
    } else {
      written = o.dump(rng() % 2 ? 2 : -1);
    }
    ASSERT_TRUE(accepts(*schema, written)) << written;
  }
}

// Constrained sampling on tiny-llama31: every answer that ends is an object the schema allows.
TEST(JsonSchemaConstraint, SampledAnswersFollowTheSchema) {
  auto engine = testing::tiny_engine();
  ASSERT_NE(engine, nullptr);
  auto schema = JsonSchema::compile(njson::parse(
      R"({"$defs": {"Name": {"enum": ["Ann", "Bob"]}}, "type": "object", "properties": {"name": {"$ref": "#/$defs/Name"},
          "age": {"type": "integer", "minimum": 0, "maximum": 120}, "ok": {"type": "boolean"}, "pet": {"enum": ["cat", "dog", null]},
          "nick": {"type": "string", "minLength": 1, "maxLength": 4}, "born": {"type": "string", "format": "date"},
          "kids": {"type": "array", "items": {"enum": ["Cy", "Di"]}, "maxItems": 2}}, "required": ["name", "age", "born"]})"));
  ASSERT_TRUE(schema.ok());
  auto table = JsonTokenTable::build(*engine->tokenizer(), static_cast<int32_t>(engine->model().config().vocab_size));
  int finished = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto session = Session::create(engine, 512);
    ASSERT_TRUE(session.ok());
    JsonSchemaConstraint constraint(table, *schema, engine->model().config().eos_token_ids);
    GenerationConfig config;
    config.sampler.temperature = 1.0f;
    config.sampler.seed = seed;
    config.max_new_tokens = 400;  // the story model spends many tokens on whitespace (up to 16 in a row)
    config.constraint = &constraint;
    auto result = (*session)->query(nlohmann::ordered_json{{{"role", "user"}, {"content", "A person, as JSON."}}}, config);
    ASSERT_TRUE(result.ok()) << result.status().to_string();
    if (result->reason != StopReason::kEndOfSequence) {
      std::printf("[ json ] seed %d cut: %s\n", static_cast<int>(seed), njson(result->text).dump().substr(0, 300).c_str());
      continue;
    }
    ++finished;
    const njson o = njson::parse(result->text, nullptr, false);
    ASSERT_TRUE(o.is_object()) << njson(result->text).dump() << " " << njson(result->tokens).dump();
    EXPECT_TRUE(o.contains("name") && (o["name"] == "Ann" || o["name"] == "Bob")) << result->text;
    EXPECT_TRUE(o.contains("age") && o["age"].is_number_integer() && o["age"] >= 0 && o["age"] <= 120) << result->text;
    for (auto it = o.begin(); it != o.end(); ++it) {
      EXPECT_TRUE(it.key() == "name" || it.key() == "age" || it.key() == "ok" || it.key() == "pet" || it.key() == "kids" ||
                  it.key() == "nick" || it.key() == "born") << it.key();
    }
    // RFC 3339's full-date, as a regular expression (std::regex, not the automaton's code).
    static const std::regex kDate(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))");
    EXPECT_TRUE(o.contains("born") && o["born"].is_string() && std::regex_match(o["born"].get<std::string>(), kDate)) << result->text;
    if (o.contains("nick")) {
      EXPECT_TRUE(o["nick"].is_string()) << result->text;
      const size_t n = code_points(o["nick"].get<std::string>());
      EXPECT_TRUE(n >= 1 && n <= 4) << result->text;
    }
    if (o.contains("ok")) {
      EXPECT_TRUE(o["ok"].is_boolean());
    }
    if (o.contains("kids")) {
      EXPECT_TRUE(o["kids"].is_array() && o["kids"].size() <= 2) << result->text;
    }
    if (o.contains("pet")) {
      EXPECT_TRUE(o["pet"] == "cat" || o["pet"] == "dog" || o["pet"].is_null()) << result->text;
    }
  }
  std::printf("[ json ] %d of 6 schema-constrained answers closed within 400 tokens\n", finished);
  EXPECT_GT(finished, 0);
}

}  // namespace
}  // namespace petrel
