// Attribute and item access, slicing, the whitelisted methods of str/dict/list/loop, and the global
// functions. Anything not listed here does not exist for templates: that is the sandbox (no
// attribute starting with '_', no mutating list/dict methods, no I/O).
#include <algorithm>
#include <cstring>
#include <ctime>

#include "petrel/text/jinja_builtins.h"
#include "petrel/text/jinja_operators.h"

namespace petrel::jinja {

const Value* CallValues::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

namespace {

const char* const kStringMethods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
    "title", "capitalize", "swapcase", "replace", "join", "find", "rfind", "index", "rindex", "count",
    "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "format", "center", "ljust", "rjust",
    "zfill", "removeprefix", "removesuffix", "partition", "rpartition"};
const char* const kDictMethods[] = {"items", "keys", "values", "get"};
const char* const kListMethods[] = {"index", "count"};

template <size_t N>
bool listed(const char* const (&names)[N], std::string_view name) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

Value bound_method(const Value& self, std::string_view name) {
  auto callable = std::make_shared<CallableObject>();
  callable->kind = CallableKind::kMethod;
  callable->name = std::string(name);
  callable->self = std::make_shared<const Value>(self);
  return Value::callable(std::move(callable));
}

std::string object_name(const Value& v) { return std::string(python_type_name(v)) + " object"; }

Value missing_attribute(const Value& obj, std::string_view name) {
  return Value::undefined("'" + object_name(obj) + "' has no attribute '" + std::string(name) + "'");
}

Status argument_error(std::string_view method, std::string_view what) {
  return invalid_argument("TypeError: " + std::string(method) + "() " + std::string(what));
}

Result<const std::string*> string_argument(const CallValues& args, size_t index, std::string_view name,
                                           std::string_view method, bool optional) {
  const Value* v = args.get(index, name);
  if (v == nullptr || (optional && v->is_none())) {
    if (optional) return static_cast<const std::string*>(nullptr);
    return argument_error(method, "missing required argument '" + std::string(name) + "'");
  }
  if (!v->is_string()) {
    return argument_error(method, std::string("argument '") + std::string(name) + "' must be str, not " +
                                      python_type_name(*v));
  }
  return &v->as_string();
}

int64_t int_argument(const CallValues& args, size_t index, std::string_view name, int64_t fallback) {
  const Value* v = args.get(index, name);
  if (v == nullptr || !v->is_number() || v->is_float()) return fallback;
  return v->as_int();
}

Value string_list(std::vector<TString> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (TString& p : parts) items.push_back(Value::string(std::move(p)));
  return Value::list(std::move(items));
}

// Python's slice index normalization (PySlice_AdjustIndices).
void adjust_slice(int64_t length, const Value* start_v, const Value* stop_v, int64_t step, int64_t& start,
                  int64_t& stop) {
  auto clamp = [&](const Value* v, int64_t fallback) -> int64_t {
    if (v == nullptr) return fallback;
    int64_t i = v->as_int();
    if (i < 0) {
      i += length;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= length) {
      i = step < 0 ? length - 1 : length;
    }
    return i;
  };
  start = clamp(start_v, step < 0 ? length - 1 : 0);
  stop = clamp(stop_v, step < 0 ? -1 : length);
}

Result<Value> string_method(BuiltinContext& ctx, const Value& self, std::string_view name, const CallValues& args) {
  const TString& s = self.as_tstring();
  const std::string& text = s.text();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    PETREL_ASSIGN_OR_RETURN(const std::string* chars, string_argument(args, 0, "chars", name, true));
    return Value::string(strip_tstring(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    PETREL_ASSIGN_OR_RETURN(const std::string* sep, string_argument(args, 0, "sep", name, true));
    if (sep != nullptr && sep->empty()) return invalid_argument("ValueError: empty separator");
    return string_list(split_tstring(s, sep, int_argument(args, 1, "maxsplit", -1), name == "rsplit"));
  }
  if (name == "splitlines") {
    const Value* keep = args.get(0, "keepends");
    return string_list(splitlines_tstring(s, keep != nullptr && truthy(*keep)));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* affix = args.get(0, name == "startswith" ? "prefix" : "suffix");
    if (affix == nullptr) return argument_error(name, "takes at least 1 argument (0 given)");
    std::vector<Value> candidates;
    if (affix->is_list() && affix->as_list().is_tuple) candidates = affix->items();
    else candidates.push_back(*affix);
    for (const Value& c : candidates) {
      if (!c.is_string()) {
        return invalid_argument(std::string("TypeError: ") + std::string(name) +
                                " first arg must be str or a tuple of str, not " + python_type_name(c));
      }
      const std::string& a = c.as_string();
      bool match = name == "startswith" ? text.compare(0, a.size(), a) == 0 && text.size() >= a.size()
                                        : text.size() >= a.size() && text.compare(text.size() - a.size(), a.size(), a) == 0;
      if (match) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper") return Value::string(change_case(s, CaseMapping::kUpper));
  if (name == "lower") return Value::string(change_case(s, CaseMapping::kLower));
  if (name == "title") return Value::string(change_case(s, CaseMapping::kTitle));
  if (name == "capitalize") return Value::string(change_case(s, CaseMapping::kCapitalize));
  if (name == "swapcase") return Value::string(change_case(s, CaseMapping::kSwapCase));
  if (name == "replace") {
    const Value* old_v = args.get(0, "old");
    const Value* new_v = args.get(1, "new");
    if (old_v == nullptr || new_v == nullptr || !old_v->is_string() || !new_v->is_string()) {
      return argument_error(name, "takes two str arguments");
    }
    int64_t count = int_argument(args, 2, "count", -1);
    TString result = replace_tstring(s, old_v->as_string(), new_v->as_tstring(), count);
    PETREL_RETURN_IF_ERROR(ctx.check_size(result.size()));
    return Value::string(std::move(result));
  }
  if (name == "join") {
    const Value* iterable = args.get(0, "iterable");
    if (iterable == nullptr) return argument_error(name, "takes exactly one argument (0 given)");
    PETREL_ASSIGN_OR_RETURN(std::vector<Value> items, iterate_values(*iterable));
    TString out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return invalid_argument("TypeError: sequence item " + std::to_string(i) + ": expected str instance, " +
                                python_type_name(items[i]) + " found");
      }
      if (i > 0) out.append(s);
      out.append(items[i].as_tstring());
      PETREL_RETURN_IF_ERROR(ctx.check_size(out.size()));
    }
    return Value::string(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    PETREL_ASSIGN_OR_RETURN(const std::string* sub, string_argument(args, 0, "sub", name, false));
    if (name == "count") {
      if (sub->empty()) return Value::integer(static_cast<int64_t>(codepoint_count(text) + 1));
      int64_t n = 0;
      for (size_t p = text.find(*sub); p != std::string::npos; p = text.find(*sub, p + sub->size())) ++n;
      return Value::integer(n);
    }
    size_t found = (name == "find" || name == "index") ? text.find(*sub) : text.rfind(*sub);
    if (found == std::string::npos) {
      if (name == "index" || name == "rindex") return invalid_argument("ValueError: substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(codepoint_count(std::string_view(text).substr(0, found))));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace") {
    if (text.empty()) return Value::boolean(false);
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = next_codepoint(text, i);
      bool digit = cp >= '0' && cp <= '9';
      bool alpha = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= 0x80 && !is_python_space(cp));
      bool ok = name == "isdigit" ? digit : name == "isalpha" ? alpha : name == "isalnum" ? (digit || alpha)
                                                                                        : is_python_space(cp);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (name == "isupper") return Value::boolean(python_is_upper(text));
  if (name == "islower") return Value::boolean(python_is_lower(text));
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    int64_t width = int_argument(args, 0, "width", 0);
    PETREL_RETURN_IF_ERROR(ctx.check_size(static_cast<size_t>(std::max<int64_t>(width, 0))));
    std::string fill = " ";
    if (name == "zfill") fill = "0";
    else if (const Value* f = args.get(1, "fillchar"); f != nullptr && f->is_string()) fill = f->as_string();
    int64_t length = static_cast<int64_t>(codepoint_count(text));
    if (width <= length) return self;
    int64_t pad = width - length;
    int64_t left = name == "ljust" ? 0 : name == "center" ? pad / 2 + (pad & width & 1) : pad;
    TString out;
    auto repeat_fill = [&](int64_t n) {
      for (int64_t k = 0; k < n; ++k) out.append(fill);
    };
    if (name == "zfill" && !text.empty() && (text[0] == '-' || text[0] == '+')) {
      out.append_slice(s, 0, 1);
      repeat_fill(pad);
      out.append_slice(s, 1, text.size());
      return Value::string(std::move(out));
    }
    repeat_fill(left);
    out.append(s);
    repeat_fill(pad - left);
    return Value::string(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    PETREL_ASSIGN_OR_RETURN(const std::string* affix, string_argument(args, 0, "affix", name, false));
    if (name == "removeprefix" && text.compare(0, affix->size(), *affix) == 0 && text.size() >= affix->size()) {
      return Value::string(s.substr(affix->size(), text.size()));
    }
    if (name == "removesuffix" && !affix->empty() && text.size() >= affix->size() &&
        text.compare(text.size() - affix->size(), affix->size(), *affix) == 0) {
      return Value::string(s.substr(0, text.size() - affix->size()));
    }
    return self;
  }
  if (name == "partition" || name == "rpartition") {
    PETREL_ASSIGN_OR_RETURN(const std::string* sep, string_argument(args, 0, "sep", name, false));
    if (sep->empty()) return invalid_argument("ValueError: empty separator");
    size_t found = name == "partition" ? text.find(*sep) : text.rfind(*sep);
    if (found == std::string::npos) {
      if (name == "partition") return Value::list({self, Value::string(""), Value::string("")}, true);
      return Value::list({Value::string(""), Value::string(""), self}, true);
    }
    return Value::list({Value::string(s.substr(0, found)), Value::string(s.substr(found, found + sep->size())),
                        Value::string(s.substr(found + sep->size(), text.size()))},
                       true);
  }
  if (name == "format") {
    // str.format with {} / {0} / {name} fields and no format specs.
    TString out;
    size_t auto_index = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      char c = text[i];
      if ((c == '{' || c == '}') && i + 1 < text.size() && text[i + 1] == c) {
        out.append(c);
        ++i;
        continue;
      }
      if (c == '}') return invalid_argument("ValueError: Single '}' encountered in format string");
      if (c != '{') {
        out.append_slice(s, i, i + 1);
        continue;
      }
      size_t close = text.find('}', i);
      if (close == std::string::npos) return invalid_argument("ValueError: Single '{' encountered in format string");
      std::string field = text.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        return invalid_argument("format fields with conversions or specs are not supported by petrel");
      }
      const Value* value = nullptr;
      if (field.empty()) {
        value = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (field.find_first_not_of("0123456789") == std::string::npos) {
        size_t index = std::stoul(field);
        value = index < args.positional.size() ? &args.positional[index] : nullptr;
      } else {
        for (const auto& [key, v] : args.keyword) {
          if (key == field) value = &v;
        }
      }
      if (value == nullptr) return invalid_argument("IndexError: format field '" + field + "' has no argument");
      out.append(to_tstring(*value));
      i = close;
    }
    return Value::string(std::move(out));
  }
  return invalid_argument("str has no method '" + std::string(name) + "'");
}

Value item_pairs(const Value& dict) {
  std::vector<Value> pairs;
  pairs.reserve(dict.as_dict().entries.size());
  for (const auto& [key, value] : dict.as_dict().entries) pairs.push_back(Value::list({key, value}, true));
  return Value::list(std::move(pairs));
}

}  // namespace

Result<Value> get_attribute(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case ValueKind::kUndefined: return invalid_argument("UndefinedError: " + obj.undefined_hint());
    case ValueKind::kDict:
      // Jinja2 tries getattr first, so `d.items` is the method even when the dict has a key "items".
      if (listed(kDictMethods, name)) return bound_method(obj, name);
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return missing_attribute(obj, name);
    case ValueKind::kString:
      if (listed(kStringMethods, name)) return bound_method(obj, name);
      return missing_attribute(obj, name);
    case ValueKind::kList:
      if (listed(kListMethods, name)) return bound_method(obj, name);
      return missing_attribute(obj, name);
    case ValueKind::kNamespace:
      for (const auto& [key, value] : obj.as_namespace().attributes) {
        if (key == name) return value;
      }
      return missing_attribute(obj, name);
    case ValueKind::kLoop: {
      const LoopObject& loop = obj.as_loop();
      const auto& items = loop.items->items;
      int64_t length = static_cast<int64_t>(items.size());
      int64_t index0 = static_cast<int64_t>(loop.index0);
      if (name == "index") return Value::integer(index0 + 1);
      if (name == "index0") return Value::integer(index0);
      if (name == "revindex") return Value::integer(length - index0);
      if (name == "revindex0") return Value::integer(length - index0 - 1);
      if (name == "first") return Value::boolean(index0 == 0);
      if (name == "last") return Value::boolean(index0 == length - 1);
      if (name == "length") return Value::integer(length);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem") {
        if (index0 == 0) return Value::undefined("there is no previous item");
        return items[loop.index0 - 1];
      }
      if (name == "nextitem") {
        if (index0 + 1 >= length) return Value::undefined("there is no next item");
        return items[loop.index0 + 1];
      }
      if (name == "cycle") return bound_method(obj, name);
      return missing_attribute(obj, name);
    }
    default: return missing_attribute(obj, name);
  }
}

Result<Value> get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case ValueKind::kUndefined: return invalid_argument("UndefinedError: " + obj.undefined_hint());
    case ValueKind::kDict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case ValueKind::kList:
    case ValueKind::kString:
      if (key.is_int() || key.is_bool()) {
        int64_t length = obj.is_list() ? static_cast<int64_t>(obj.items().size())
                                       : static_cast<int64_t>(codepoint_count(obj.as_string()));
        int64_t index = key.as_int();
        if (index < 0) index += length;
        if (index < 0 || index >= length) {
          return Value::undefined("'" + object_name(obj) + "' has no element " + std::to_string(key.as_int()));
        }
        if (obj.is_list()) return obj.items()[static_cast<size_t>(index)];
        std::vector<size_t> offsets = codepoint_offsets(obj.as_string());
        return Value::string(obj.as_tstring().substr(offsets[index], offsets[index + 1]));
      }
      break;
    default: break;
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value::undefined("'" + object_name(obj) + "' has no element " + to_tstring(key).text());
}

Result<Value> get_slice(BuiltinContext& ctx, const Value& obj, const Value* start, const Value* stop,
                        const Value* step_value) {
  for (const Value* part : {start, stop, step_value}) {
    if (part != nullptr && !(part->is_int() || part->is_bool())) {
      return invalid_argument("TypeError: slice indices must be integers or None");
    }
  }
  int64_t step = step_value ? step_value->as_int() : 1;
  if (step == 0) return invalid_argument("ValueError: slice step cannot be zero");
  if (obj.is_list()) {
    const auto& items = obj.items();
    int64_t begin, end;
    adjust_slice(static_cast<int64_t>(items.size()), start, stop, step, begin, end);
    std::vector<Value> out;
    for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) out.push_back(items[static_cast<size_t>(i)]);
    PETREL_RETURN_IF_ERROR(ctx.count_steps(out.size()));
    return Value::list(std::move(out), obj.as_list().is_tuple);
  }
  if (obj.is_string()) {
    const TString& s = obj.as_tstring();
    std::vector<size_t> offsets = codepoint_offsets(s.text());
    int64_t length = static_cast<int64_t>(offsets.size()) - 1;
    int64_t begin, end;
    adjust_slice(length, start, stop, step, begin, end);
    if (step == 1) return Value::string(s.substr(offsets[begin], offsets[std::max(begin, end)]));
    TString out;
    for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) {
      out.append_slice(s, offsets[static_cast<size_t>(i)], offsets[static_cast<size_t>(i) + 1]);
    }
    return Value::string(std::move(out));
  }
  return invalid_argument(std::string("TypeError: '") + python_type_name(obj) + "' object is not subscriptable");
}

Result<Value> call_method(BuiltinContext& ctx, const Value& self, std::string_view name, const CallValues& args) {
  if (self.is_string()) return string_method(ctx, self, name, args);
  if (self.is_dict()) {
    if (name == "items") return item_pairs(self);
    std::vector<Value> out;
    if (name == "keys" || name == "values") {
      for (const auto& [key, value] : self.as_dict().entries) out.push_back(name == "keys" ? key : value);
      return Value::list(std::move(out));
    }
    if (name == "get") {
      const Value* key = args.get(0, "key");
      if (key == nullptr) return argument_error(name, "expected at least 1 argument, got 0");
      if (const Value* v = self.as_dict().find(*key)) return *v;
      const Value* fallback = args.get(1, "default");
      return fallback ? *fallback : Value::none();
    }
  }
  if (self.is_list()) {
    const Value* x = args.get(0, "value");
    if (x == nullptr) return argument_error(name, "takes at least 1 argument (0 given)");
    const auto& items = self.items();
    if (name == "count") {
      return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& v) { return values_equal(v, *x); }));
    }
    for (size_t i = 0; i < items.size(); ++i) {
      if (values_equal(items[i], *x)) return Value::integer(static_cast<int64_t>(i));
    }
    return invalid_argument("ValueError: value is not in list");
  }
  if (self.kind() == ValueKind::kLoop && name == "cycle") {
    if (args.positional.empty()) return invalid_argument("TypeError: no items for cycling given");
    return args.positional[self.as_loop().index0 % args.positional.size()];
  }
  return invalid_argument(std::string("TypeError: '") + python_type_name(self) + "' object has no method '" +
                          std::string(name) + "'");
}

Result<int64_t> python_len(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kString: return static_cast<int64_t>(codepoint_count(v.as_string()));
    case ValueKind::kList: return static_cast<int64_t>(v.items().size());
    case ValueKind::kDict: return static_cast<int64_t>(v.as_dict().entries.size());
    case ValueKind::kUndefined: return 0;
    default:
      return invalid_argument(std::string("TypeError: object of type '") + python_type_name(v) + "' has no len()");
  }
}

Result<std::vector<Value>> iterate_values(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kList: return v.items();
    case ValueKind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& entry : v.as_dict().entries) keys.push_back(entry.first);
      return keys;
    }
    case ValueKind::kString: {
      std::vector<Value> out;
      for (TString& c : characters(v.as_tstring())) out.push_back(Value::string(std::move(c)));
      return out;
    }
    case ValueKind::kUndefined: return std::vector<Value>{};
    default:
      return invalid_argument(std::string("TypeError: '") + python_type_name(v) + "' object is not iterable");
  }
}

std::vector<std::string> global_function_names() {
  return {"range", "namespace", "dict", "raise_exception", "strftime_now"};
}

Result<Value> call_global_function(BuiltinContext& ctx, std::string_view name, const CallValues& args) {
  if (name == "raise_exception") {
    const Value* message = args.get(0, "message");
    return invalid_argument("TemplateError: " + (message ? to_tstring(*message).text() : std::string()));
  }
  if (name == "strftime_now") {
    const Value* format = args.get(0, "format");
    if (format == nullptr || !format->is_string()) return invalid_argument("TypeError: strftime_now() needs a format string");
    if (format->as_string().empty()) return Value::string("");
    std::string buffer(256 + format->as_string().size() * 16, '\0');
    size_t n = std::strftime(buffer.data(), buffer.size(), format->as_string().c_str(), &ctx.now());
    buffer.resize(n);
    return Value::string(std::move(buffer));
  }
  if (name == "range") {
    std::vector<int64_t> bounds;
    for (const Value& v : args.positional) {
      if (!(v.is_int() || v.is_bool())) {
        return invalid_argument(std::string("TypeError: '") + python_type_name(v) +
                                "' object cannot be interpreted as an integer");
      }
      bounds.push_back(v.as_int());
    }
    if (bounds.empty() || bounds.size() > 3) return invalid_argument("TypeError: range expected 1 to 3 arguments");
    int64_t start = bounds.size() == 1 ? 0 : bounds[0];
    int64_t stop = bounds.size() == 1 ? bounds[0] : bounds[1];
    int64_t step = bounds.size() == 3 ? bounds[2] : 1;
    if (step == 0) return invalid_argument("ValueError: range() arg 3 must not be zero");
    __int128 count = 0;
    if (step > 0 && stop > start) count = ((__int128)stop - start + step - 1) / step;
    if (step < 0 && stop < start) count = ((__int128)start - stop - step - 1) / (-step);
    constexpr int64_t kMaxRange = 100000;  // Jinja2's sandbox refuses larger ranges too (MAX_RANGE)
    if (count > kMaxRange) {
      return out_of_range("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    PETREL_RETURN_IF_ERROR(ctx.count_steps(static_cast<size_t>(count)));
    std::vector<Value> items;
    items.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) items.push_back(Value::integer(start + i * step));
    return Value::list(std::move(items));
  }
  if (name == "namespace" || name == "dict") {
    if (!args.positional.empty()) {
      if (args.positional.size() != 1 || !args.positional[0].is_dict()) {
        return invalid_argument(std::string("TypeError: ") + std::string(name) + "() takes a dict or keyword arguments");
      }
    }
    std::vector<std::pair<std::string, Value>> attributes;
    if (!args.positional.empty()) {
      for (const auto& [key, value] : args.positional[0].as_dict().entries) {
        attributes.emplace_back(to_tstring(key).text(), value);
      }
    }
    for (const auto& [key, value] : args.keyword) attributes.emplace_back(key, value);
    if (name == "namespace") return Value::namespace_object(std::move(attributes));
    std::vector<std::pair<Value, Value>> entries;
    for (auto& [key, value] : attributes) entries.emplace_back(Value::string(key), std::move(value));
    return Value::dict(std::move(entries));
  }
  return invalid_argument("unknown global function '" + std::string(name) + "'");
}

}  // namespace petrel::jinja
