// Values of petrel's Jinja subset, with Python semantics where byte equality with Jinja2 depends on them:
// str() and repr() of None/bools/ints/floats/containers, truthiness, equality and ordering, and
// json.dumps as transformers' tojson filter calls it.
//
// Strings are TStrings: text plus the byte ranges that came from untrusted input (message contents,
// tool definitions...). Every string operation carries those ranges along so that the rendered prompt
// can tell the tokenizer which bytes must never become special tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel::jinja {

struct ByteRange {
  size_t begin = 0;
  size_t end = 0;  // exclusive
};

// A string and the byte ranges of it that are untrusted (sorted, disjoint, never adjacent).
class TString {
 public:
  TString() = default;
  explicit TString(std::string text) : text_(std::move(text)) {}
  static TString untrusted(std::string text);

  const std::string& text() const { return text_; }
  size_t size() const { return text_.size(); }
  bool empty() const { return text_.empty(); }
  const std::vector<ByteRange>& untrusted_ranges() const { return untrusted_; }
  bool has_untrusted() const { return !untrusted_.empty(); }

  void append(std::string_view trusted_text) { text_.append(trusted_text); }
  void append(char c) { text_.push_back(c); }
  void append(const TString& other);
  // Appends source[begin, end) with its taint.
  void append_slice(const TString& source, size_t begin, size_t end);
  TString substr(size_t begin, size_t end) const;
  void mark_untrusted(size_t begin, size_t end);
  void mark_all_untrusted() { mark_untrusted(0, text_.size()); }
  // True when any byte of [begin, end) is untrusted.
  bool any_untrusted_in(size_t begin, size_t end) const;

 private:
  std::string text_;
  std::vector<ByteRange> untrusted_;
};

enum class ValueKind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // also tuples (ListObject::is_tuple), which differ only in repr()
  kDict,
  kCallable,
  kNamespace,
  kLoop,
};

struct HeapObject;
struct StringObject;
struct ListObject;
struct DictObject;
struct NamespaceObject;
struct CallableObject;
struct LoopObject;
struct Expr;  // jinja_ast.h
struct Node;  // jinja_ast.h

class Value {
 public:
  Value() = default;  // Undefined without a hint
  static Value undefined(std::string hint);
  static Value none() { return Value(ValueKind::kNone); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(TString s);
  static Value string(std::string trusted_text) { return string(TString(std::move(trusted_text))); }
  // Builds a list (or tuple); computes depth and taint from the items.
  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> entries);
  static Value namespace_object(std::vector<std::pair<std::string, Value>> attributes);
  static Value callable(std::shared_ptr<CallableObject> callable);
  static Value loop(std::shared_ptr<LoopObject> loop);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_bool() const { return kind_ == ValueKind::kBool; }
  bool is_int() const { return kind_ == ValueKind::kInt; }
  bool is_float() const { return kind_ == ValueKind::kFloat; }
  // int, float or bool (Python's bool is an int)
  bool is_number() const { return kind_ == ValueKind::kInt || kind_ == ValueKind::kFloat || kind_ == ValueKind::kBool; }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_list() const { return kind_ == ValueKind::kList; }
  bool is_dict() const { return kind_ == ValueKind::kDict; }
  bool is_callable() const { return kind_ == ValueKind::kCallable; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == ValueKind::kBool ? (scalar_.b ? 1 : 0) : scalar_.i; }
  double as_float() const;  // any number
  const TString& as_tstring() const;
  const std::string& as_string() const;
  const ListObject& as_list() const;
  const std::vector<Value>& items() const;
  const DictObject& as_dict() const;
  const CallableObject& as_callable() const;
  NamespaceObject& as_namespace() const;
  const LoopObject& as_loop() const;
  const std::shared_ptr<HeapObject>& object() const { return object_; }
  std::shared_ptr<const ListObject> list_object() const;
  // For Undefined: the message to use when it is misused.
  std::string undefined_hint() const;

  // Nesting depth of containers (0 for scalars and strings).
  int depth() const;
  // True when this is a string with untrusted bytes or a container holding one.
  bool tainted() const;

 private:
  explicit Value(ValueKind kind) : kind_(kind) {}
  ValueKind kind_ = ValueKind::kUndefined;
  union {
    bool b;
    int64_t i;
    double f;
  } scalar_{};
  std::shared_ptr<HeapObject> object_;
};

struct HeapObject {
  virtual ~HeapObject() = default;
};

struct StringObject final : HeapObject {
  explicit StringObject(TString s) : value(std::move(s)) {}
  TString value;
};

struct UndefinedObject final : HeapObject {
  explicit UndefinedObject(std::string h) : hint(std::move(h)) {}
  std::string hint;  // "'x' is undefined", used when the undefined value is misused
};

// Containers are immutable once built (ImmutableSandboxedEnvironment forbids list.append etc.), so
// Values share them freely. `depth` bounds recursion in repr/tojson/destruction; `tainted` says whether
// any string inside carries untrusted bytes.
struct ListObject final : HeapObject {
  std::vector<Value> items;
  bool is_tuple = false;
  bool tainted = false;
  int depth = 1;
};

struct DictObject final : HeapObject {
  std::vector<std::pair<Value, Value>> entries;  // insertion order, as Python dicts
  bool tainted = false;
  int depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};

// namespace(): the one mutable object templates may write to ({% set ns.x = ... %}).
struct NamespaceObject final : HeapObject {
  std::vector<std::pair<std::string, Value>> attributes;
};

enum class CallableKind : uint8_t { kMacro, kGlobalFunction, kMethod };

struct CallableObject final : HeapObject {
  CallableKind kind = CallableKind::kGlobalFunction;
  std::string name;              // function or method name
  std::shared_ptr<const Value> self;  // kMethod: the bound value
  const Node* macro = nullptr;   // kMacro: the macro definition (owned by the template)
};

// The `loop` variable inside a for loop. Updated in place on each iteration.
struct LoopObject final : HeapObject {
  std::shared_ptr<const ListObject> items;
  size_t index0 = 0;
};


inline const TString& Value::as_tstring() const { return static_cast<const StringObject&>(*object_).value; }
inline const std::string& Value::as_string() const { return as_tstring().text(); }
inline const ListObject& Value::as_list() const { return static_cast<const ListObject&>(*object_); }
inline const std::vector<Value>& Value::items() const { return as_list().items; }
inline const DictObject& Value::as_dict() const { return static_cast<const DictObject&>(*object_); }
inline const CallableObject& Value::as_callable() const { return static_cast<const CallableObject&>(*object_); }
inline NamespaceObject& Value::as_namespace() const { return static_cast<NamespaceObject&>(*object_); }
inline const LoopObject& Value::as_loop() const { return static_cast<const LoopObject&>(*object_); }
inline std::shared_ptr<const ListObject> Value::list_object() const {
  return std::static_pointer_cast<const ListObject>(object_);
}

// Python's type name, for error messages ("str", "NoneType", ...).
const char* python_type_name(const Value& v);

// Python truthiness; Undefined is false.
bool truthy(const Value& v);

// Python ==, never fails (1 == 1.0 == True; [1] != (1,)).
bool values_equal(const Value& a, const Value& b);

// Python <; fails with a TypeError message for unordered types. Returns -1, 0 or 1.
Result<int> compare_values(const Value& a, const Value& b);

// Python str(): strings as is (with taint), Undefined as "", everything else through repr.
TString to_tstring(const Value& v);
// Python repr(), appended to `out`; strings inside keep their taint.
void append_repr(TString& out, const Value& v);
// Python's float repr ("1.0", "1e-05", "1.5e+16", "inf").
std::string python_float_repr(double d);

struct JsonFormat {
  bool ensure_ascii = false;
  bool has_indent = false;
  std::string indent;            // the string put once per level
  std::string item_separator;    // Python default: ", " without indent, "," with indent
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) appended to `out`. Fails like Python for Undefined, callables and odd keys.
Status append_json(TString& out, const Value& v, const JsonFormat& format, int indent_level = 0);

// Converts parsed JSON into a Value. With `untrusted`, every string (keys included) is marked as
// untrusted. Fails when nesting exceeds max_depth.
Result<Value> value_from_json(const nlohmann::ordered_json& json, bool untrusted, int max_depth);

// --- UTF-8 and Python str helpers (codepoint-based like Python str) ---

// Decodes the codepoint at s[i] and advances i; invalid bytes decode as themselves (one byte each).
uint32_t next_codepoint(std::string_view s, size_t& i);
void append_utf8(std::string& out, uint32_t cp);
size_t codepoint_count(std::string_view s);
// Byte offsets of each codepoint start, plus s.size() at the end.
std::vector<size_t> codepoint_offsets(std::string_view s);
// Python str.isspace() for one codepoint.
bool is_python_space(uint32_t cp);
// Python str.isprintable() for one codepoint (an approximation; see jinja_value.cc).
bool is_python_printable(uint32_t cp);

}  // namespace petrel::jinja
