// Schema-constrained decoding (response_format json_schema, and a forced tool call's arguments against the tool's
// parameters): a JSON Schema compiled into a table of nodes, and a byte automaton (SchemaPrefix) that accepts
// exactly the prefixes of JSON texts the compiled schema allows, used by the same token mask as JSON mode
// (json_constraint.h).
//
// What a schema can say here (the common subset of tool and structured-output schemas, as OpenAI's strict mode):
//  - "type": object, array, string, number, integer, boolean, null, or a list of them; absent, it is read from
//    "properties" (object) or "items" (array), else any value;
//  - object: "properties" (at most 64), "required"; keys other than the properties are not generated (OpenAI
//    strict mode's additionalProperties false; a schema allowing them still gets a valid subset); an object with
//    no properties is any object;
//  - array: "items" (absent: any values), "minItems", "maxItems" (so that a weak model cannot repeat items until
//    max_tokens where the schema bounds them);
//  - string: "minLength", "maxLength" (in characters: code points, an escape one character, a surrogate pair's
//    two escapes one);
//  - string "format": "date", "time", "date-time" (RFC 3339: fields in range, not the calendar: Feb 30 passes),
//    "uuid", "duration" (RFC 3339's ISO 8601 grammar), "ipv4" (dotted quad, no leading zeros), "ipv6" (RFC
//    3986's grammar, no zone), "hostname" (RFC 1123 labels; the 253-character total is not checked), "email" (a
//    dot-atom local part @ a hostname with a dot; no quoted local parts or address literals): OpenAI's strict mode's
//    formats, as their exact shapes (built-in patterns, json_schema.cc), without escapes; others are not enforced;
//  - string "pattern": the ECMA-262 subset of regex_dfa.h, searched for in the value as JSON Schema says (anchor
//    it with ^...$ for a whole match); the value is then written without escapes, so a pattern that needs a
//    '"', a '\' or a control character cannot be met (the model is left no string to write);
//  - integer and number: "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" (draft 4's booleans too),
//    "multipleOf" (a finite decimal with at most 9 fraction digits, in exact decimal arithmetic: 0.3 is a multiple
//    of 0.1): a digit that no allowed value can begin with is refused where it comes. Such a number is written
//    without an exponent, with at most as many fraction digits as multipleOf has (9 without a multipleOf); a
//    bound is compared as validators do (the value read as a double) and is enforced up to 10^27 for integers
//    and values of integral multipleOf, 10^27 / 10^scale otherwise (beyond, that bound is left free); an anyOf
//    of several integer and number branches (up to 4 with bounds or multipleOf) allows what any of them allows;
//  - "enum" and "const" of strings, numbers, booleans and null (the values' exact JSON texts);
//  - "anyOf"/"oneOf" whose branches differ in type (at most one array branch), as a union; several object branches
//    with "properties" (pydantic's Union of models, at most 16) are one object whose keys are all of theirs: each
//    key and each value that differs between branches (an enum/const discriminator, a value's type) narrows the
//    branches still possible, and the object closes once one of them has its required keys. A property whose
//    branches give it different schemas of one type (other than enum/const texts) is refused: nothing written
//    tells which applies;
//  - "$ref" to any place of the same document ("#", "#/$defs/Name", "#/definitions/Name": what pydantic and
//    zod write), recursive ones included; "allOf" of one schema (pydantic v1's wrapper of a $ref) as that schema.
// Anything else that constrains (allOf of several, not, other formats, ...) is not enforced: the value
// is only checked to be valid JSON of the allowed types. Keys come out in any order, each at most once, and an
// object closes only when its required keys are there. The root must be an object. A recursive schema's values
// nest at most SchemaPrefix::kMaxDepth deep: past that, only a branch that is not an object or array is taken.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/runtime/json_constraint.h"
#include "petrel/runtime/regex_dfa.h"
#include "petrel/util/status.h"

namespace petrel {

class JsonSchema {
 public:
  enum Type : uint8_t {
    kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64,
    kAnyType = 127,
  };
  // Past every bound a numeric Node enforces (|bound| * 10^scale <= 10^27), and where SchemaPrefix's magnitudes
  // saturate.
  static constexpr __int128 kNoBound = [] {
    __int128 p = 1;
    for (int i = 0; i < 37; ++i) p *= 10;
    return p;
  }();
  static constexpr int kMaxScale = 9;  // a number's fraction digits when it has bounds but no multipleOf
  // An integer or number's bounds and multipleOf: the value is N / 10^scale for an integer N (written with at
  // most `scale` fraction digits, none at 0, and no exponent) with min_scaled <= N <= max_scaled (kNoBound: none)
  // and N a multiple of `multiple`.
  struct NumericRange {
    uint8_t scale = 0;
    int64_t multiple = 1;
    __int128 min_scaled = -kNoBound, max_scaled = kNoBound;
  };
  // Numeric branches of an anyOf whose bounds are enforced together (more: none is).
  static constexpr size_t kMaxNumericRanges = 4;
  struct Node {
    uint8_t types = kAnyType;
    bool any_object = false;                // an object with no properties: any keys and values
    std::vector<std::string> keys;          // object: property names as JSON string bodies (escaped), sorted
    std::vector<int32_t> key_nodes;         // their schemas
    uint64_t required = 0;                  // bit i: keys[i] is required
    int32_t items = -1;                     // array: the items' schema, -1 any
    uint32_t min_items = 0, max_items = UINT32_MAX;  // array: minItems, maxItems
    uint32_t min_length = 0, max_length = UINT32_MAX;  // string: minLength, maxLength
    // integer, number: the ranges a value must fall in one of (one per numeric branch of an anyOf, at most
    // kMaxNumericRanges); empty: any number of the node's types.
    std::vector<NumericRange> numeric;
    int32_t pattern = -1;                   // string: its "pattern" (JsonSchema::pattern), -1 none
    const RegexDfa* format = nullptr;       // string: its "format" as an automaton (json_schema.cc), null none
    std::vector<std::string> literals;      // enum/const: the allowed values' JSON texts, sorted; else empty
    // object, anyOf of several object schemas ("branches", at most kMaxBranches): `keys` are the union of theirs,
    // key_branches[k] the branches that have key k, branch_required[b] branch b's required keys (bits over `keys`).
    // A key whose value differs between branches narrows the branches still possible by the value's type
    // (key_type_branches[k][t], t a type bit's index; all ones where it does not narrow) or by which enum/const
    // text it is (key_literal_branches[k][i] for the key's node's literals[i]; empty where it does not). All empty
    // for one object schema.
    std::vector<uint16_t> key_branches;
    std::vector<uint64_t> branch_required;
    std::vector<std::array<uint16_t, 7>> key_type_branches;
    std::vector<std::vector<uint16_t>> key_literal_branches;
  };
  static constexpr size_t kMaxBranches = 16;

  // Compiles `schema`; kInvalidArgument naming the place ("properties.city.type: ...") for what cannot be used.
  static Result<std::shared_ptr<const JsonSchema>> compile(const nlohmann::json& schema);
  // Any JSON object (a tool without a parameters schema).
  static std::shared_ptr<const JsonSchema> any_object();

  const Node& node(int32_t i) const { return nodes_[static_cast<size_t>(i)]; }
  const RegexDfa& pattern(int32_t i) const { return patterns_[static_cast<size_t>(i)]; }
  int32_t root() const { return 0; }

 private:
  Result<int32_t> add(const nlohmann::json& schema, const std::string& where, int depth);
  Result<const nlohmann::json*> resolve(const nlohmann::json& schema, const std::string& where) const;
  // allOf of several schemas (or one beside other keywords) as one schema that every part allows, for the
  // keywords petrel reads; an anyOf beside other keywords distributed into its branches (json_schema.cc).
  Result<nlohmann::json> merge_all_of(const nlohmann::json& schema, const std::string& where, int depth);
  // Node `index` (being built in `node`) as the union of the object schemas `parts` (Node::key_branches...).
  Status add_object_union(const std::vector<const nlohmann::json*>& parts, const std::string& where, int depth,
                          int32_t index, Node& node);
  // A string's "pattern" and "format" (and allOf's further ones) as automata: a lone enforced format as
  // Node::format, else everything intersected into one automaton, Node::pattern.
  Status string_automata(const nlohmann::json& part, const std::string& where, Node& node);
  std::vector<Node> nodes_;
  std::vector<RegexDfa> patterns_;
  // While compiling: the whole document ($ref's target), and the node made for each schema object so far (so a
  // schema referenced twice is one node, and a recursive one a cycle of nodes).
  const nlohmann::json* document_ = nullptr;
  std::unordered_map<const nlohmann::json*, int32_t> compiled_;
  std::deque<nlohmann::json> synthetic_;  // schemas made while compiling (a union's property), alive as long as compiled_
};

// The automaton: the value of schema->root(), then nothing. Cheap to copy (a fixed-size stack of frames).
class SchemaPrefix {
 public:
  static constexpr int kMaxDepth = 12;  // nested objects and arrays the schema itself describes

  SchemaPrefix() = default;
  explicit SchemaPrefix(const JsonSchema* schema);
  bool feed(unsigned char c);         // false, state unchanged, when no allowed text continues this way
  bool feed(std::string_view bytes);  // false when a byte is rejected (state then unspecified)
  bool complete() const { return done_; }
  // In a string value where any plain token may come (none can reach its maxLength).
  bool in_plain_string() const {
    return value_ == Value::kScalar && free_.in_plain_string() && max_length_ - length_ >= JsonTokenTable::kMaxPlainBytes &&
           (!dfas_[0] || dfas_[0]->open(dfa_states_[0])) && (!dfas_[1] || dfas_[1]->open(dfa_states_[1]));
  }

 private:
  enum class Value : uint8_t { kNone, kScalar, kLiteral };  // what the value being read is
  enum class Mode : uint8_t {
    kValue,          // a value of `pending_node_` starts (or whitespace)
    kKeyOrClose,     // object: after '{'
    kKey,            // object: after ','
    kInKey,          // object: inside a key
    kColon,          // object: after a key
    kCommaOrClose,   // after a value in a container
    kValueOrClose,   // array: after '['
  };
  struct Frame {
    int32_t node = 0;
    bool array = false;
    uint8_t key = 0;         // object: the key whose value is being read
    uint16_t live = 0xFFFF;  // object of several schemas (Node::key_branches): the branches still possible
    uint64_t seen = 0;       // object: bit i, keys[i] given; array: items begun
  };
  // The frame's object may close: its required keys are given (for one of its live branches).
  bool may_close(const Frame& f, const JsonSchema::Node& node) const;
  // The value now starting in frame f (an object of several schemas; others pass) is of type bit `type`: false
  // when no live branch allows it; else the live branches narrowed to those that do.
  bool narrow(Frame& f, uint8_t type);
  template <typename A> friend bool feed_byte_restoring(A&, unsigned char);
  template <typename A> friend bool feed_bytes(A&, std::string_view);
  bool step(unsigned char c);
  bool start_value(unsigned char c);
  bool value_done();

  const JsonSchema* schema_ = nullptr;
  std::array<Frame, kMaxDepth> stack_{};
  uint8_t depth_ = 0;
  Mode mode_ = Mode::kValue;
  bool done_ = false;
  WhitespaceRun ws_;
  int32_t pending_node_ = 0;  // the schema of the value that starts next
  // A key being read: the properties still matching (sorted range) and bytes so far.
  uint32_t lo_ = 0, hi_ = 0, offset_ = 0;
  int32_t key_index_ = -1;  // the key just read
  // The value being read.
  Value value_ = Value::kNone;
  int32_t value_node_ = 0;
  JsonPrefix free_;  // kScalar: a string, number or literal, or any value of an untyped node
  bool integer_only_ = false;
  uint32_t length_ = 0;                                // a string value: its characters so far
  uint32_t min_length_ = 0, max_length_ = UINT32_MAX;  // and its bounds (none for other values)
  // A string value's pattern and format automata (regex_dfa.h; null: none) and their states.
  std::array<const RegexDfa*, 2> dfas_{};
  std::array<int32_t, 2> dfa_states_{};
  // A checked number (JsonSchema::Node::numeric; null: none): its sign, integer and fraction digits so far, all its
  // digits as one integer (saturating at JsonSchema::kNoBound), the node's ranges it may still fall in (bit r) and
  // that integer modulo each range's multiple.
  const JsonSchema::Node* numeric_ = nullptr;
  bool negative_ = false, fraction_ = false;
  uint8_t live_ranges_ = 0;
  uint32_t digits_ = 0, fraction_digits_ = 0;
  __int128 magnitude_ = 0;
  std::array<int64_t, JsonSchema::kMaxNumericRanges> remainders_{};
  bool number_byte(unsigned char c);  // a digit or '.': false when no allowed value begins this way
  bool number_reachable();            // some allowed value begins with what is written (or is it); drops the ranges none of whose values does
  bool number_complete() const;       // what is written is an allowed value
  bool range_reachable(size_t r) const;  // some value of range r begins with what is written
  // Some magnitude in [digits * 10^j, digits * 10^j + (range ? 10^j - 1 : 0)] is allowed by range r (digits: magnitude_).
  bool number_reaches(size_t r, int j, bool range) const;
};

extern template class AutomatonConstraint<SchemaPrefix>;  // json_schema.cc

// Structured outputs: the answer an object `schema` allows.
class JsonSchemaConstraint final : public AutomatonConstraint<SchemaPrefix> {
 public:
  JsonSchemaConstraint(std::shared_ptr<const JsonTokenTable> table, std::shared_ptr<const JsonSchema> schema,
                       std::vector<int32_t> end_ids)
      : AutomatonConstraint(std::move(table), std::move(end_ids), SchemaPrefix(schema.get())), schema_(std::move(schema)) {}

 private:
  std::shared_ptr<const JsonSchema> schema_;  // state_ points into it
};

// A forced tool call's shape (the server's tool_choice "required" or a named function): after the call's opener,
// the function name is one of `names` (skipped when starts_at_arguments: the opener already names it), then
// `after_name` (the closing quote and the arguments key: `", "arguments": `), the arguments as one JSON object,
// then `close` (the format's end: `}]</TOOLCALL>`), and nothing more. The arguments follow the named tool's
// parameter schema (SchemaPrefix).
// `arguments[i]` is names[i]'s parameter schema (JsonSchema::any_object() where a tool has none).
struct CallShapeSpec {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const JsonSchema>> arguments;
  std::string after_name;
  std::string close;
  bool starts_at_arguments = false;
};

// The byte automaton of a CallShapeSpec; cheap to copy (it points at the spec, which must outlive it).
class CallShape {
 public:
  CallShape() = default;
  explicit CallShape(const CallShapeSpec* spec);  // spec->names sorted, arguments in the same order
  bool feed(unsigned char c);          // false, state unchanged, when the shape cannot continue this way
  bool feed(std::string_view bytes);   // false when a byte is rejected (state then unspecified)
  bool complete() const { return part_ == Part::kDone; }
  bool in_plain_string() const { return part_ == Part::kArguments && arguments_.in_plain_string(); }

 private:
  enum class Part : uint8_t { kName, kAfterName, kArguments, kClose, kDone };
  template <typename A> friend bool feed_byte_restoring(A&, unsigned char);
  template <typename A> friend bool feed_bytes(A&, std::string_view);
  bool step(unsigned char c);
  bool literal_byte(const std::string& literal, unsigned char c, Part next);

  const CallShapeSpec* spec_ = nullptr;
  Part part_ = Part::kName;
  uint32_t lo_ = 0, hi_ = 0;  // kName: the names that still match
  uint32_t offset_ = 0;       // bytes of the name or literal so far
  SchemaPrefix arguments_;
};

extern template class AutomatonConstraint<CallShape>;  // json_schema.cc

// A forced tool call: the answer's call, as `spec` says.
class CallShapeConstraint final : public AutomatonConstraint<CallShape> {
 public:
  CallShapeConstraint(std::shared_ptr<const JsonTokenTable> table, CallShapeSpec spec, std::vector<int32_t> end_ids);

 private:
  std::unique_ptr<CallShapeSpec> spec_;  // sorted names (and their schemas); its address stays put for state_
};

}  // namespace petrel
