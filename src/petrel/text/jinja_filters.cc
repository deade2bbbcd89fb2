// Jinja2 3.1's filters and tests, plus transformers' tojson. Where Jinja2 returns a generator (map,
// select, ...) petrel returns a list: printing such a generator directly is the only difference.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "petrel/text/jinja_builtins.h"
#include "petrel/text/jinja_operators.h"

namespace petrel::jinja {
namespace {

using FilterFunction = Result<Value> (*)(BuiltinContext&, const Value&, const CallValues&);
using TestFunction = Result<bool> (*)(BuiltinContext&, const Value&, const CallValues&);

const Value* arg(const CallValues& args, size_t index, std::string_view name) { return args.get(index, name); }

bool bool_arg(const CallValues& args, size_t index, std::string_view name, bool fallback) {
  const Value* v = arg(args, index, name);
  return v ? truthy(*v) : fallback;
}

Status check_undefined(const Value& v) {
  if (v.is_undefined()) return invalid_argument("UndefinedError: " + v.undefined_hint());
  return ok_status();
}

// A string filter's input: Jinja2 applies str() (soft_str) first.
TString as_text(const Value& v) { return to_tstring(v); }

// Taint for results that are hard to track byte by byte: all untrusted if any input was.
Value taint_whole(std::string text, bool tainted) {
  TString s(std::move(text));
  if (tainted) s.mark_all_untrusted();
  return Value::string(std::move(s));
}

// Jinja2's attribute paths ("a.b", "0"): item lookup per dotted part.
Result<Value> attribute_path(const Value& obj, std::string_view path) {
  Value current = obj;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string_view part = path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    Value key = Value::string(std::string(part));
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos) {
      key = Value::integer(std::strtoll(std::string(part).c_str(), nullptr, 10));
    }
    PETREL_ASSIGN_OR_RETURN(current, get_item(current, key));
    if (dot == std::string_view::npos) return current;
    start = dot + 1;
  }
}

Result<Value> attribute_argument(const Value& item, const Value* attribute) {
  if (attribute == nullptr || attribute->is_none()) return item;
  if (attribute->is_int()) return get_item(item, *attribute);
  return attribute_path(item, to_tstring(*attribute).text());
}

// Key for sort/unique/min/max: lowercased strings unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(change_case(v.as_tstring(), CaseMapping::kLower));
  return v;
}

Result<std::vector<Value>> sorted_values(BuiltinContext& ctx, std::vector<Value> items, bool reverse,
                                         bool case_sensitive, const Value* attribute) {
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size() * 4));
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) {
    PETREL_ASSIGN_OR_RETURN(Value key, attribute_argument(item, attribute));
    keyed.emplace_back(sort_key(key, case_sensitive), std::move(item));
  }
  Status failure = ok_status();
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto c = reverse ? compare_values(b.first, a.first) : compare_values(a.first, b.first);
    if (!c.ok()) {
      if (failure.ok()) failure = c.status();
      return false;
    }
    return *c < 0;
  });
  PETREL_RETURN_IF_ERROR(failure);
  std::vector<Value> out;
  for (auto& [key, item] : keyed) out.push_back(std::move(item));
  return out;
}

// ------------------------------------------------------------ filters

Result<Value> filter_abs(BuiltinContext&, const Value& v, const CallValues&) {
  if (!v.is_number()) return invalid_argument(std::string("TypeError: bad operand type for abs(): '") + python_type_name(v) + "'");
  if (v.is_float()) return Value::floating(std::fabs(v.as_float()));
  return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Result<Value> filter_attr(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* name = arg(args, 0, "name");
  if (name == nullptr || !name->is_string()) return invalid_argument("TypeError: attr() needs an attribute name");
  return get_attribute(v, name->as_string());
}

Result<Value> filter_batch(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  const Value* count = arg(args, 0, "linecount");
  if (count == nullptr || !count->is_int() || count->as_int() <= 0) return invalid_argument("batch() needs a positive count");
  const Value* fill = arg(args, 1, "fill_with");
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size()));
  std::vector<Value> batches, current;
  for (Value& item : items) {
    current.push_back(std::move(item));
    if (static_cast<int64_t>(current.size()) == count->as_int()) batches.push_back(Value::list(std::move(current))), current.clear();
  }
  if (!current.empty()) {
    if (fill && !fill->is_none()) {
      while (static_cast<int64_t>(current.size()) < count->as_int()) current.push_back(*fill);
    }
    batches.push_back(Value::list(std::move(current)));
  }
  return Value::list(std::move(batches));
}

Result<Value> filter_capitalize(BuiltinContext&, const Value& v, const CallValues&) {
  return Value::string(change_case(as_text(v), CaseMapping::kCapitalize));
}

Result<Value> filter_center(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  CallValues width;
  width.positional.push_back(arg(args, 0, "width") ? *arg(args, 0, "width") : Value::integer(80));
  return call_method(ctx, Value::string(as_text(v)), "center", width);
}

Result<Value> filter_default(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* fallback = arg(args, 0, "default_value");
  bool boolean = bool_arg(args, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return fallback ? *fallback : Value::string("");
  return v;
}

Result<Value> filter_dictsort(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  if (!v.is_dict()) return invalid_argument("TypeError: dictsort() needs a mapping");
  bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value* by = arg(args, 1, "by");
  bool by_value = by && by->is_string() && by->as_string() == "value";
  bool reverse = bool_arg(args, 2, "reverse", false);
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.as_dict().entries) pairs.push_back(Value::list({key, value}, true));
  Value position = Value::integer(by_value ? 1 : 0);
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> sorted, sorted_values(ctx, std::move(pairs), reverse, case_sensitive, &position));
  return Value::list(std::move(sorted));
}

Result<Value> filter_escape(BuiltinContext&, const Value& v, const CallValues&) {
  TString text = as_text(v);
  std::string out;
  for (char c : text.text()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return taint_whole(std::move(out), text.has_untrusted());
}

Result<Value> filter_first(BuiltinContext&, const Value& v, const CallValues&) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> filter_last(BuiltinContext&, const Value& v, const CallValues&) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

bool parse_python_float(std::string text, double& out) {
  text = strip_tstring(TString(text), nullptr, true, true).text();
  text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

Result<Value> filter_float(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* fallback = arg(args, 0, "default");
  if (v.is_number()) return Value::floating(v.as_float());
  double d;
  if (v.is_string() && parse_python_float(v.as_string(), d)) return Value::floating(d);
  return fallback ? *fallback : Value::floating(0.0);
}

Result<Value> filter_int(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* fallback = arg(args, 0, "default");
  int base = static_cast<int>(arg(args, 1, "base") ? arg(args, 1, "base")->as_int() : 10);
  if (v.is_float()) return Value::integer(static_cast<int64_t>(v.as_float()));
  if (v.is_number()) return Value::integer(v.as_int());
  if (v.is_string()) {
    std::string text = strip_tstring(v.as_tstring(), nullptr, true, true).text();
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    char* end = nullptr;
    errno = 0;
    long long n = text.empty() ? 0 : std::strtoll(text.c_str(), &end, base);
    if (!text.empty() && end == text.c_str() + text.size() && errno == 0) return Value::integer(n);
    double d;
    if (parse_python_float(text, d) && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
  }
  return fallback ? *fallback : Value::integer(0);
}

Result<Value> filter_format(BuiltinContext&, const Value& v, const CallValues& args) {
  Value tuple = Value::list(args.positional, true);
  return percent_format(as_text(v), tuple);
}

Result<Value> filter_indent(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* width = arg(args, 0, "width");
  std::string indentation = width == nullptr ? "    "
                            : width->is_string() ? width->as_string()
                                                 : std::string(static_cast<size_t>(std::max<int64_t>(width->as_int(), 0)), ' ');
  bool first = bool_arg(args, 1, "first", false);
  bool blank = bool_arg(args, 2, "blank", false);
  TString text = as_text(v);
  text.append("\n");  // Jinja2 appends a newline so that splitlines() keeps a trailing empty line
  std::vector<TString> lines = splitlines_tstring(text, false);
  TString out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out.append("\n");
    bool indent_line = i == 0 ? first : (blank || !lines[i].empty());
    if (indent_line) out.append(indentation);
    out.append(lines[i]);
  }
  return Value::string(std::move(out));
}

Result<Value> filter_items(BuiltinContext& ctx, const Value& v, const CallValues&) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) return invalid_argument("TypeError: Can only get item pairs from a mapping.");
  return call_method(ctx, v, "items", CallValues{});
}

Result<Value> filter_join(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  const Value* separator = arg(args, 0, "d");
  const Value* attribute = arg(args, 1, "attribute");
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  TString out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0 && separator) out.append(to_tstring(*separator));
    PETREL_ASSIGN_OR_RETURN(Value item, attribute_argument(items[i], attribute));
    if (!item.is_undefined()) out.append(to_tstring(item));
    PETREL_RETURN_IF_ERROR(ctx.check_size(out.size()));
  }
  return Value::string(std::move(out));
}

Result<Value> filter_length(BuiltinContext&, const Value& v, const CallValues&) {
  PETREL_ASSIGN_OR_RETURN(int64_t n, python_len(v));
  return Value::integer(n);
}

Result<Value> filter_list(BuiltinContext&, const Value& v, const CallValues&) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  return Value::list(std::move(items));
}

Result<Value> filter_lower(BuiltinContext&, const Value& v, const CallValues&) {
  return Value::string(change_case(as_text(v), CaseMapping::kLower));
}

Result<Value> filter_upper(BuiltinContext&, const Value& v, const CallValues&) {
  return Value::string(change_case(as_text(v), CaseMapping::kUpper));
}

Result<Value> filter_map(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size()));
  std::vector<Value> out;
  const Value* attribute = nullptr;
  for (const auto& [key, value] : args.keyword) {
    if (key == "attribute") attribute = &value;
  }
  if (attribute != nullptr) {
    const Value* fallback = nullptr;
    for (const auto& [key, value] : args.keyword) {
      if (key == "default") fallback = &value;
    }
    for (const Value& item : items) {
      PETREL_ASSIGN_OR_RETURN(Value mapped, attribute_argument(item, attribute));
      out.push_back(mapped.is_undefined() && fallback ? *fallback : mapped);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return invalid_argument("map() needs a filter name or attribute=");
  }
  std::string filter = args.positional[0].as_string();
  if (!is_known_filter(filter)) return invalid_argument("no filter named '" + filter + "'");
  CallValues rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    PETREL_ASSIGN_OR_RETURN(Value mapped, apply_filter(ctx, filter, item, rest));
    out.push_back(std::move(mapped));
  }
  return Value::list(std::move(out));
}

Result<Value> min_max(BuiltinContext& ctx, const Value& v, const CallValues& args, bool want_max) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> sorted,
                          sorted_values(ctx, std::move(items), false, bool_arg(args, 0, "case_sensitive", false),
                                        arg(args, 1, "attribute")));
  return want_max ? sorted.back() : sorted.front();
}

Result<Value> filter_max(BuiltinContext& ctx, const Value& v, const CallValues& args) { return min_max(ctx, v, args, true); }
Result<Value> filter_min(BuiltinContext& ctx, const Value& v, const CallValues& args) { return min_max(ctx, v, args, false); }

// select / reject / selectattr / rejectattr
Result<Value> select_items(BuiltinContext& ctx, const Value& v, const CallValues& args, bool with_attribute, bool keep) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size()));
  size_t next = 0;
  const Value* attribute = nullptr;
  if (with_attribute) {
    if (args.positional.empty()) return invalid_argument("TypeError: selectattr/rejectattr need an attribute");
    attribute = &args.positional[next++];
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return invalid_argument("TypeError: test name must be a string");
    test = args.positional[next++].as_string();
    if (!is_known_test(test)) return invalid_argument("no test named '" + test + "'");
  }
  CallValues test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<long>(next), args.positional.end());
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (attribute) {
      PETREL_ASSIGN_OR_RETURN(subject, attribute_argument(item, attribute));
    }
    bool passed;
    if (test.empty()) {
      passed = truthy(subject);
    } else {
      PETREL_ASSIGN_OR_RETURN(passed, apply_test(ctx, test, subject, test_args));
    }
    if (passed == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Result<Value> filter_select(BuiltinContext& ctx, const Value& v, const CallValues& a) { return select_items(ctx, v, a, false, true); }
Result<Value> filter_reject(BuiltinContext& ctx, const Value& v, const CallValues& a) { return select_items(ctx, v, a, false, false); }
Result<Value> filter_selectattr(BuiltinContext& ctx, const Value& v, const CallValues& a) { return select_items(ctx, v, a, true, true); }
Result<Value> filter_rejectattr(BuiltinContext& ctx, const Value& v, const CallValues& a) { return select_items(ctx, v, a, true, false); }

Result<Value> filter_replace(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  const Value* old_v = arg(args, 0, "old");
  const Value* new_v = arg(args, 1, "new");
  if (old_v == nullptr || new_v == nullptr) return invalid_argument("TypeError: replace() needs old and new");
  const Value* count = arg(args, 2, "count");
  TString result = replace_tstring(as_text(v), to_tstring(*old_v).text(), to_tstring(*new_v),
                                   count && count->is_int() ? count->as_int() : -1);
  PETREL_RETURN_IF_ERROR(ctx.check_size(result.size()));
  return Value::string(std::move(result));
}

Result<Value> filter_reverse(BuiltinContext&, const Value& v, const CallValues&) {
  if (v.is_string()) {
    std::vector<TString> chars = characters(v.as_tstring());
    TString out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out.append(*it);
    return Value::string(std::move(out));
  }
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Result<Value> filter_round(BuiltinContext&, const Value& v, const CallValues& args) {
  if (!v.is_number()) return invalid_argument(std::string("TypeError: type ") + python_type_name(v) + " doesn't define __round__ method");
  int64_t precision = arg(args, 0, "precision") ? arg(args, 0, "precision")->as_int() : 0;
  const Value* method_v = arg(args, 1, "method");
  std::string method = method_v && method_v->is_string() ? method_v->as_string() : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return invalid_argument("FilterArgumentError: method must be common, ceil or floor");
  }
  if (v.is_int() && method == "common") return v;
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value::floating(r / scale);
}

Result<Value> filter_safe(BuiltinContext&, const Value& v, const CallValues&) { return v; }

Result<Value> filter_sort(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> sorted,
                          sorted_values(ctx, std::move(items), bool_arg(args, 0, "reverse", false),
                                        bool_arg(args, 1, "case_sensitive", false), arg(args, 2, "attribute")));
  return Value::list(std::move(sorted));
}

Result<Value> filter_string(BuiltinContext&, const Value& v, const CallValues&) { return Value::string(as_text(v)); }

Result<Value> filter_sum(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  const Value* attribute = arg(args, 0, "attribute");
  Value total = arg(args, 1, "start") ? *arg(args, 1, "start") : Value::integer(0);
  for (const Value& item : items) {
    PETREL_ASSIGN_OR_RETURN(Value x, attribute_argument(item, attribute));
    PETREL_ASSIGN_OR_RETURN(total, binary_operator(ctx, BinaryOp::kAdd, total, x));
  }
  return total;
}

Result<Value> filter_title(BuiltinContext&, const Value& v, const CallValues&) {
  return Value::string(change_case(as_text(v), CaseMapping::kTitle));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Result<Value> filter_tojson(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  JsonFormat format;
  format.ensure_ascii = bool_arg(args, 0, "ensure_ascii", false);
  const Value* indent = arg(args, 1, "indent");
  if (indent && !indent->is_none()) {
    format.has_indent = true;
    if (indent->is_string()) format.indent = indent->as_string();
    else if (indent->is_int()) format.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent->as_int(), 0)), ' ');
    else return invalid_argument("TypeError: tojson indent must be an int or a string");
  }
  format.item_separator = format.has_indent ? "," : ", ";
  const Value* separators = arg(args, 2, "separators");
  if (separators && !separators->is_none()) {
    if (!separators->is_list() || separators->items().size() != 2 || !separators->items()[0].is_string() ||
        !separators->items()[1].is_string()) {
      return invalid_argument("TypeError: tojson separators must be a pair of strings");
    }
    format.item_separator = separators->items()[0].as_string();
    format.key_separator = separators->items()[1].as_string();
  }
  format.sort_keys = bool_arg(args, 3, "sort_keys", false);
  TString out;
  PETREL_RETURN_IF_ERROR(append_json(out, v, format));
  PETREL_RETURN_IF_ERROR(ctx.check_size(out.size()));
  return Value::string(std::move(out));
}

Result<Value> filter_trim(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* chars = arg(args, 0, "chars");
  std::string chars_text = chars && !chars->is_none() ? to_tstring(*chars).text() : std::string();
  return Value::string(strip_tstring(as_text(v), chars && !chars->is_none() ? &chars_text : nullptr, true, true));
}

Result<Value> filter_truncate(BuiltinContext&, const Value& v, const CallValues& args) {
  TString text = as_text(v);
  int64_t length = arg(args, 0, "length") ? arg(args, 0, "length")->as_int() : 255;
  bool killwords = bool_arg(args, 1, "killwords", false);
  std::string end = arg(args, 2, "end") ? to_tstring(*arg(args, 2, "end")).text() : "...";
  int64_t leeway = arg(args, 3, "leeway") && arg(args, 3, "leeway")->is_int() ? arg(args, 3, "leeway")->as_int() : 5;
  std::vector<size_t> offsets = codepoint_offsets(text.text());
  int64_t n = static_cast<int64_t>(offsets.size()) - 1;
  if (n <= length + leeway) return Value::string(text);
  int64_t keep = std::max<int64_t>(0, length - static_cast<int64_t>(codepoint_count(end)));
  TString out = text.substr(0, offsets[static_cast<size_t>(keep)]);
  if (!killwords) {
    size_t space = out.text().rfind(' ');
    if (space != std::string::npos) out = out.substr(0, space);
  }
  out.append(end);
  return Value::string(std::move(out));
}

Result<Value> filter_unique(BuiltinContext& ctx, const Value& v, const CallValues& args) {
  PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(v));
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size() * items.size() / 16 + items.size()));
  bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const Value* attribute = arg(args, 1, "attribute");
  std::vector<Value> seen, out;
  for (const Value& item : items) {
    PETREL_ASSIGN_OR_RETURN(Value key, attribute_argument(item, attribute));
    key = sort_key(key, case_sensitive);
    bool duplicate = false;
    for (const Value& s : seen) duplicate = duplicate || values_equal(s, key);
    if (!duplicate) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Result<Value> filter_wordcount(BuiltinContext&, const Value& v, const CallValues&) {
  const TString input = as_text(v);
  const std::string& text = input.text();
  int64_t words = 0;
  bool in_word = false;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = next_codepoint(text, i);
    bool word_char = (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_' ||
                     (cp >= 0x80 && !is_python_space(cp));
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::integer(words);
}

struct FilterEntry {
  const char* name;
  FilterFunction function;
};

const FilterEntry kFilters[] = {
    {"abs", filter_abs},           {"attr", filter_attr},         {"batch", filter_batch},
    {"capitalize", filter_capitalize}, {"center", filter_center}, {"count", filter_length},
    {"d", filter_default},         {"default", filter_default},   {"dictsort", filter_dictsort},
    {"e", filter_escape},          {"escape", filter_escape},     {"first", filter_first},
    {"float", filter_float},       {"forceescape", filter_escape}, {"format", filter_format},
    {"indent", filter_indent},     {"int", filter_int},           {"items", filter_items},
    {"join", filter_join},         {"last", filter_last},         {"length", filter_length},
    {"list", filter_list},         {"lower", filter_lower},       {"map", filter_map},
    {"max", filter_max},           {"min", filter_min},           {"reject", filter_reject},
    {"rejectattr", filter_rejectattr}, {"replace", filter_replace}, {"reverse", filter_reverse},
    {"round", filter_round},       {"safe", filter_safe},         {"select", filter_select},
    {"selectattr", filter_selectattr}, {"sort", filter_sort},     {"string", filter_string},
    {"sum", filter_sum},           {"title", filter_title},       {"tojson", filter_tojson},
    {"trim", filter_trim},         {"truncate", filter_truncate}, {"unique", filter_unique},
    {"upper", filter_upper},       {"wordcount", filter_wordcount},
};

// ------------------------------------------------------------ tests

Result<bool> compare_test(const Value& v, const CallValues& args, CompareOp op) {
  const Value* other = arg(args, 0, "other");
  if (other == nullptr) return invalid_argument("TypeError: comparison test needs an argument");
  return compare_operator(op, v, *other);
}

Result<bool> test_defined(BuiltinContext&, const Value& v, const CallValues&) { return !v.is_undefined(); }
Result<bool> test_undefined(BuiltinContext&, const Value& v, const CallValues&) { return v.is_undefined(); }
Result<bool> test_none(BuiltinContext&, const Value& v, const CallValues&) { return v.is_none(); }
Result<bool> test_boolean(BuiltinContext&, const Value& v, const CallValues&) { return v.is_bool(); }
Result<bool> test_false(BuiltinContext&, const Value& v, const CallValues&) { return v.is_bool() && !v.as_bool(); }
Result<bool> test_true(BuiltinContext&, const Value& v, const CallValues&) { return v.is_bool() && v.as_bool(); }
Result<bool> test_integer(BuiltinContext&, const Value& v, const CallValues&) { return v.is_int(); }
Result<bool> test_float(BuiltinContext&, const Value& v, const CallValues&) { return v.is_float(); }
Result<bool> test_number(BuiltinContext&, const Value& v, const CallValues&) { return v.is_number(); }
Result<bool> test_string(BuiltinContext&, const Value& v, const CallValues&) { return v.is_string(); }
Result<bool> test_mapping(BuiltinContext&, const Value& v, const CallValues&) { return v.is_dict(); }
Result<bool> test_iterable(BuiltinContext&, const Value& v, const CallValues&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
Result<bool> test_sequence(BuiltinContext&, const Value& v, const CallValues&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
Result<bool> test_callable(BuiltinContext&, const Value& v, const CallValues&) { return v.is_callable(); }
Result<bool> test_escaped(BuiltinContext&, const Value&, const CallValues&) { return false; }
Result<bool> test_lower(BuiltinContext&, const Value& v, const CallValues&) { return python_is_lower(to_tstring(v).text()); }
Result<bool> test_upper(BuiltinContext&, const Value& v, const CallValues&) { return python_is_upper(to_tstring(v).text()); }
Result<bool> test_odd(BuiltinContext&, const Value& v, const CallValues&) {
  if (!v.is_number() || v.is_float()) return invalid_argument("TypeError: odd test needs an integer");
  return (v.as_int() % 2) != 0;
}
Result<bool> test_even(BuiltinContext&, const Value& v, const CallValues&) {
  if (!v.is_number() || v.is_float()) return invalid_argument("TypeError: even test needs an integer");
  return (v.as_int() % 2) == 0;
}
Result<bool> test_divisibleby(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* n = arg(args, 0, "num");
  if (n == nullptr || !n->is_number() || n->is_float() || n->as_int() == 0 || !v.is_number() || v.is_float()) {
    return invalid_argument("TypeError: divisibleby needs non-zero integers");
  }
  return v.as_int() % n->as_int() == 0;
}
Result<bool> test_eq(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kEq); }
Result<bool> test_ne(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kNe); }
Result<bool> test_lt(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kLt); }
Result<bool> test_le(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kLe); }
Result<bool> test_gt(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kGt); }
Result<bool> test_ge(BuiltinContext&, const Value& v, const CallValues& a) { return compare_test(v, a, CompareOp::kGe); }
Result<bool> test_in(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* seq = arg(args, 0, "seq");
  if (seq == nullptr) return invalid_argument("TypeError: in test needs a sequence");
  return contains(*seq, v);
}
Result<bool> test_sameas(BuiltinContext&, const Value& v, const CallValues& args) {
  const Value* other = arg(args, 0, "other");
  if (other == nullptr) return invalid_argument("TypeError: sameas test needs an argument");
  if (v.kind() != other->kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool()) return v.as_bool() == other->as_bool();
  if (v.is_int()) return v.as_int() == other->as_int() && v.as_int() >= -5 && v.as_int() <= 256;  // CPython's small ints
  return v.object() && v.object() == other->object();
}
Result<bool> test_filter(BuiltinContext&, const Value& v, const CallValues&) { return v.is_string() && is_known_filter(v.as_string()); }
Result<bool> test_test(BuiltinContext&, const Value& v, const CallValues&) { return v.is_string() && is_known_test(v.as_string()); }

struct TestEntry {
  const char* name;
  TestFunction function;
};

const TestEntry kTests[] = {
    {"defined", test_defined},   {"undefined", test_undefined}, {"none", test_none},
    {"boolean", test_boolean},   {"false", test_false},         {"true", test_true},
    {"integer", test_integer},   {"float", test_float},         {"number", test_number},
    {"string", test_string},     {"mapping", test_mapping},     {"iterable", test_iterable},
    {"sequence", test_sequence}, {"callable", test_callable},   {"escaped", test_escaped},
    {"lower", test_lower},       {"upper", test_upper},         {"odd", test_odd},
    {"even", test_even},         {"divisibleby", test_divisibleby}, {"eq", test_eq},
    {"equalto", test_eq},        {"==", test_eq},               {"ne", test_ne},
    {"!=", test_ne},             {"lt", test_lt},               {"lessthan", test_lt},
    {"<", test_lt},              {"le", test_le},               {"<=", test_le},
    {"gt", test_gt},             {"greaterthan", test_gt},      {">", test_gt},
    {"ge", test_ge},             {">=", test_ge},               {"in", test_in},
    {"sameas", test_sameas},     {"filter", test_filter},       {"test", test_test},
};

FilterFunction find_filter(std::string_view name) {
  for (const FilterEntry& f : kFilters) {
    if (name == f.name) return f.function;
  }
  return nullptr;
}

TestFunction find_test(std::string_view name) {
  for (const TestEntry& t : kTests) {
    if (name == t.name) return t.function;
  }
  return nullptr;
}

}  // namespace

bool is_known_filter(std::string_view name) { return find_filter(name) != nullptr; }
bool is_known_test(std::string_view name) { return find_test(name) != nullptr; }

Result<Value> apply_filter(BuiltinContext& ctx, std::string_view name, const Value& input, const CallValues& args) {
  FilterFunction f = find_filter(name);
  if (f == nullptr) return invalid_argument("no filter named '" + std::string(name) + "'");
  // Most filters reject Undefined like Jinja2's strict paths; these accept it (Undefined is '' / empty).
  static const char* const kUndefinedFriendly[] = {"default", "d", "length", "count", "list", "items", "join",
                                                   "first", "last", "string", "trim", "lower", "upper", "capitalize",
                                                   "title", "escape", "e", "forceescape", "safe", "replace",
                                                   "indent", "int", "float", "select", "reject", "selectattr",
                                                   "rejectattr", "map", "unique", "sort", "reverse", "wordcount",
                                                   "center", "truncate", "format", "batch", "sum", "min", "max"};
  if (input.is_undefined()) {
    bool friendly = false;
    for (const char* n : kUndefinedFriendly) friendly = friendly || name == n;
    if (!friendly) return check_undefined(input);
  }
  return f(ctx, input, args);
}

Result<bool> apply_test(BuiltinContext& ctx, std::string_view name, const Value& input, const CallValues& args) {
  TestFunction t = find_test(name);
  if (t == nullptr) return invalid_argument("no test named '" + std::string(name) + "'");
  return t(ctx, input, args);
}

}  // namespace petrel::jinja
