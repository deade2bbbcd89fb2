// Filters, tests, global functions and the methods of str/dict/list that templates may call, with
// the semantics of Jinja2 3.1 and Python 3 (see jinja_filters.cc, jinja_methods.cc).
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "petrel/text/jinja_value.h"
#include "petrel/util/status.h"

namespace petrel::jinja {

// Evaluated call arguments.
struct CallValues {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`; nullptr when absent.
  const Value* get(size_t index, std::string_view name) const;
};

// What builtins need from the renderer: limits, the clock, and calling back into filters/tests.
class BuiltinContext {
 public:
  virtual ~BuiltinContext() = default;
  // Fails when a string of `bytes` would exceed the output limit.
  virtual Status check_size(size_t bytes) = 0;
  // Counts loop-like work done inside builtins (sorting, mapping) against the step limit.
  virtual Status count_steps(size_t steps) = 0;
  virtual const std::tm& now() const = 0;
  virtual int max_nesting_depth() const = 0;
};

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

Result<Value> apply_filter(BuiltinContext& ctx, std::string_view name, const Value& input, const CallValues& args);
Result<bool> apply_test(BuiltinContext& ctx, std::string_view name, const Value& input, const CallValues& args);

// Global functions: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::string> global_function_names();
Result<Value> call_global_function(BuiltinContext& ctx, std::string_view name, const CallValues& args);

// `obj.name`: a dict key, a bound method (str.strip, dict.items, ...), a namespace attribute or a
// loop attribute; Undefined when none exists. Fails only for Undefined `obj` (Jinja2's UndefinedError).
Result<Value> get_attribute(const Value& obj, std::string_view name);
// `obj[key]`: item lookup first, then attributes for string keys; Undefined when missing.
Result<Value> get_item(const Value& obj, const Value& key);
// obj[start:stop:step]; null pointers for absent parts.
Result<Value> get_slice(BuiltinContext& ctx, const Value& obj, const Value* start, const Value* stop,
                        const Value* step);
Result<Value> call_method(BuiltinContext& ctx, const Value& self, std::string_view name, const CallValues& args);

// Python len(); fails for values without a length.
Result<int64_t> python_len(const Value& v);
// Iterates like Python: list items, dict keys, string characters; Undefined is empty.
Result<std::vector<Value>> iterate_values(const Value& v);

// --- Python str operations that keep taint (jinja_strings.cc) ---

// str.strip()/lstrip()/rstrip(); `chars` null means Unicode whitespace.
TString strip_tstring(const TString& s, const std::string* chars, bool left, bool right);
enum class CaseMapping { kUpper, kLower, kTitle, kCapitalize, kSwapCase };
// Case mapping of ASCII, Latin-1, Greek and Cyrillic letters (other scripts are left as they are).
TString change_case(const TString& s, CaseMapping mapping);
// str.replace(old, new, count); count < 0 replaces all.
TString replace_tstring(const TString& s, const std::string& old_text, const TString& new_text, int64_t count);
// str.split(sep, maxsplit) / rsplit; `sep` null splits on runs of whitespace.
std::vector<TString> split_tstring(const TString& s, const std::string* sep, int64_t maxsplit, bool from_right);
// str.splitlines(keepends)
std::vector<TString> splitlines_tstring(const TString& s, bool keep_ends);
// The codepoints of s as one-character strings.
std::vector<TString> characters(const TString& s);
bool python_is_lower(std::string_view s);
bool python_is_upper(std::string_view s);

}  // namespace petrel::jinja
