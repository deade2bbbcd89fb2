#include "petrel/text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace petrel::jinja {

// ---------------------------------------------------------------- TString

TString TString::untrusted(std::string text) {
  TString s(std::move(text));
  s.mark_all_untrusted();
  return s;
}

void TString::mark_untrusted(size_t begin, size_t end) {
  end = std::min(end, text_.size());
  if (begin >= end) return;
  // Ranges are appended in order almost always; merge with the last one when touching.
  if (untrusted_.empty() || begin > untrusted_.back().end) {
    untrusted_.push_back({begin, end});
    return;
  }
  if (begin >= untrusted_.back().begin) {  // overlaps or touches the last range
    untrusted_.back().end = std::max(untrusted_.back().end, end);
    return;
  }
  // General case: insert and re-merge.
  untrusted_.push_back({begin, end});
  std::sort(untrusted_.begin(), untrusted_.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : untrusted_) {
    if (!merged.empty() && r.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, r.end);
    } else {
      merged.push_back(r);
    }
  }
  untrusted_ = std::move(merged);
}

void TString::append(const TString& other) {
  size_t offset = text_.size();
  text_.append(other.text_);
  for (const ByteRange& r : other.untrusted_) mark_untrusted(offset + r.begin, offset + r.end);
}

void TString::append_slice(const TString& source, size_t begin, size_t end) {
  if (begin >= end) return;
  size_t offset = text_.size();
  text_.append(source.text_, begin, end - begin);
  for (const ByteRange& r : source.untrusted_) {
    if (r.end <= begin) continue;
    if (r.begin >= end) break;
    size_t b = std::max(r.begin, begin), e = std::min(r.end, end);
    mark_untrusted(offset + (b - begin), offset + (e - begin));
  }
}

TString TString::substr(size_t begin, size_t end) const {
  TString out;
  out.append_slice(*this, begin, std::min(end, text_.size()));
  return out;
}

bool TString::any_untrusted_in(size_t begin, size_t end) const {
  for (const ByteRange& r : untrusted_) {
    if (r.begin < end && r.end > begin) return true;
  }
  return false;
}

// ---------------------------------------------------------------- Value construction

Value Value::undefined(std::string hint) {
  Value v(ValueKind::kUndefined);
  v.object_ = std::make_shared<UndefinedObject>(std::move(hint));
  return v;
}

Value Value::boolean(bool b) {
  Value v(ValueKind::kBool);
  v.scalar_.b = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v(ValueKind::kInt);
  v.scalar_.i = i;
  return v;
}

Value Value::floating(double f) {
  Value v(ValueKind::kFloat);
  v.scalar_.f = f;
  return v;
}

Value Value::string(TString s) {
  Value v(ValueKind::kString);
  v.object_ = std::make_shared<StringObject>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  auto object = std::make_shared<ListObject>();
  object->is_tuple = is_tuple;
  for (const Value& item : items) {
    object->depth = std::max(object->depth, item.depth() + 1);
    object->tainted = object->tainted || item.tainted();
  }
  object->items = std::move(items);
  Value v(ValueKind::kList);
  v.object_ = std::move(object);
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> entries) {
  auto object = std::make_shared<DictObject>();
  for (const auto& [key, value] : entries) {
    object->depth = std::max({object->depth, key.depth() + 1, value.depth() + 1});
    object->tainted = object->tainted || key.tainted() || value.tainted();
  }
  object->entries = std::move(entries);
  Value v(ValueKind::kDict);
  v.object_ = std::move(object);
  return v;
}

Value Value::namespace_object(std::vector<std::pair<std::string, Value>> attributes) {
  auto object = std::make_shared<NamespaceObject>();
  object->attributes = std::move(attributes);
  Value v(ValueKind::kNamespace);
  v.object_ = std::move(object);
  return v;
}

Value Value::callable(std::shared_ptr<CallableObject> callable) {
  Value v(ValueKind::kCallable);
  v.object_ = std::move(callable);
  return v;
}

Value Value::loop(std::shared_ptr<LoopObject> loop) {
  Value v(ValueKind::kLoop);
  v.object_ = std::move(loop);
  return v;
}

double Value::as_float() const {
  switch (kind_) {
    case ValueKind::kFloat: return scalar_.f;
    case ValueKind::kInt: return static_cast<double>(scalar_.i);
    case ValueKind::kBool: return scalar_.b ? 1.0 : 0.0;
    default: return 0.0;
  }
}

std::string Value::undefined_hint() const {
  if (kind_ == ValueKind::kUndefined && object_) return static_cast<const UndefinedObject&>(*object_).hint;
  return "value is undefined";
}

int Value::depth() const {
  if (kind_ == ValueKind::kList) return as_list().depth;
  if (kind_ == ValueKind::kDict) return as_dict().depth;
  return 0;
}

bool Value::tainted() const {
  switch (kind_) {
    case ValueKind::kString: return as_tstring().has_untrusted();
    case ValueKind::kList: return as_list().tainted;
    case ValueKind::kDict: return as_dict().tainted;
    default: return false;
  }
}

const Value* DictObject::find(const Value& key) const {
  for (const auto& entry : entries) {
    if (values_equal(entry.first, key)) return &entry.second;
  }
  return nullptr;
}

const Value* DictObject::find(std::string_view key) const {
  for (const auto& entry : entries) {
    if (entry.first.is_string() && entry.first.as_string() == key) return &entry.second;
  }
  return nullptr;
}

// ---------------------------------------------------------------- Python semantics

const char* python_type_name(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined: return "Undefined";
    case ValueKind::kNone: return "NoneType";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return "str";
    case ValueKind::kList: return v.as_list().is_tuple ? "tuple" : "list";
    case ValueKind::kDict: return "dict";
    case ValueKind::kCallable: return "function";
    case ValueKind::kNamespace: return "Namespace";
    case ValueKind::kLoop: return "LoopContext";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone: return false;
    case ValueKind::kBool: return v.as_bool();
    case ValueKind::kInt: return v.as_int() != 0;
    case ValueKind::kFloat: return v.as_float() != 0.0;
    case ValueKind::kString: return !v.as_string().empty();
    case ValueKind::kList: return !v.items().empty();
    case ValueKind::kDict: return !v.as_dict().entries.empty();
    default: return true;
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone: return true;
    case ValueKind::kString: return a.as_string() == b.as_string();
    case ValueKind::kList: {
      const ListObject& x = a.as_list();
      const ListObject& y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!values_equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      const DictObject& x = a.as_dict();
      const DictObject& y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [key, value] : x.entries) {
        const Value* other = y.find(key);
        if (other == nullptr || !values_equal(value, *other)) return false;
      }
      return true;
    }
    default: return a.object() == b.object();
  }
}

Result<int> compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order equals codepoint order, which is Python's str order.
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return invalid_argument(std::string("TypeError: '<' not supported between instances of '") +
                          python_type_name(a) + "' and '" + python_type_name(b) + "'");
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0.0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout rules (repr switches to exponent form when the
  // decimal point position is <= -4 or > 16).
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), d, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int exponent = std::stoi(sci.substr(e_pos + 1));
  int decimal_point = exponent + 1;  // value = 0.DIGITS * 10^decimal_point
  if (decimal_point <= -4 || decimal_point > 16) {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    out.push_back('e');
    out.push_back(exponent < 0 ? '-' : '+');
    int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude < 10) out.push_back('0');
    out.append(std::to_string(magnitude));
  } else if (decimal_point <= 0) {
    out.append("0.");
    out.append(static_cast<size_t>(-decimal_point), '0');
    out.append(digits);
  } else if (static_cast<size_t>(decimal_point) >= digits.size()) {
    out.append(digits);
    out.append(static_cast<size_t>(decimal_point) - digits.size(), '0');
    out.append(".0");
  } else {
    out.append(digits, 0, static_cast<size_t>(decimal_point));
    out.push_back('.');
    out.append(digits, static_cast<size_t>(decimal_point), std::string::npos);
  }
  return out;
}

namespace {

void append_hex(std::string& out, uint32_t value, int width) {
  static const char* kHex = "0123456789abcdef";
  for (int shift = (width - 1) * 4; shift >= 0; shift -= 4) out.push_back(kHex[(value >> shift) & 0xF]);
}

// Appends one run of a string (all trusted or all untrusted) escaped by `escape_run`, marking the
// escaped bytes untrusted when the run was. Escaping works per codepoint, so taint boundaries survive.
template <typename EscapeRun>
void append_escaped_with_taint(TString& out, const TString& s, EscapeRun escape_run) {
  const std::string& text = s.text();
  std::string buffer;
  size_t cursor = 0;
  auto flush_run = [&](size_t begin, size_t end, bool untrusted) {
    if (begin >= end) return;
    buffer.clear();
    escape_run(buffer, std::string_view(text).substr(begin, end - begin));
    size_t start = out.size();
    out.append(buffer);
    if (untrusted) out.mark_untrusted(start, out.size());
  };
  for (const ByteRange& r : s.untrusted_ranges()) {
    flush_run(cursor, r.begin, false);
    flush_run(r.begin, r.end, true);
    cursor = r.end;
  }
  flush_run(cursor, text.size(), false);
}

void append_string_repr(TString& out, const TString& s) {
  const std::string& text = s.text();
  char quote = '\'';
  if (text.find('\'') != std::string::npos && text.find('"') == std::string::npos) quote = '"';
  out.append(quote);
  append_escaped_with_taint(out, s, [quote](std::string& buf, std::string_view run) {
    size_t i = 0;
    while (i < run.size()) {
      size_t start = i;
      uint32_t cp = next_codepoint(run, i);
      if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
        buf.push_back('\\');
        buf.push_back(static_cast<char>(cp));
      } else if (cp == '\t') {
        buf.append("\\t");
      } else if (cp == '\n') {
        buf.append("\\n");
      } else if (cp == '\r') {
        buf.append("\\r");
      } else if (cp < 0x20 || cp == 0x7f) {
        buf.append("\\x");
        append_hex(buf, cp, 2);
      } else if (cp < 0x7f || is_python_printable(cp)) {
        buf.append(run.substr(start, i - start));
      } else if (cp <= 0xff) {
        buf.append("\\x");
        append_hex(buf, cp, 2);
      } else if (cp <= 0xffff) {
        buf.append("\\u");
        append_hex(buf, cp, 4);
      } else {
        buf.append("\\U");
        append_hex(buf, cp, 8);
      }
    }
  });
  out.append(quote);
}

void append_json_string(TString& out, const TString& s, bool ensure_ascii) {
  out.append('"');
  append_escaped_with_taint(out, s, [ensure_ascii](std::string& buf, std::string_view run) {
    size_t i = 0;
    while (i < run.size()) {
      size_t start = i;
      uint32_t cp = next_codepoint(run, i);
      switch (cp) {
        case '"': buf.append("\\\""); continue;
        case '\\': buf.append("\\\\"); continue;
        case '\n': buf.append("\\n"); continue;
        case '\r': buf.append("\\r"); continue;
        case '\t': buf.append("\\t"); continue;
        case '\b': buf.append("\\b"); continue;
        case '\f': buf.append("\\f"); continue;
        default: break;
      }
      if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
        if (cp > 0xffff) {  // UTF-16 surrogate pair, as Python writes it
          uint32_t v = cp - 0x10000;
          buf.append("\\u");
          append_hex(buf, 0xd800 + (v >> 10), 4);
          buf.append("\\u");
          append_hex(buf, 0xdc00 + (v & 0x3ff), 4);
        } else {
          buf.append("\\u");
          append_hex(buf, cp, 4);
        }
      } else {
        buf.append(run.substr(start, i - start));
      }
    }
  });
  out.append('"');
}

}  // namespace

void append_repr(TString& out, const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined: return;
    case ValueKind::kNone: out.append("None"); return;
    case ValueKind::kBool: out.append(v.as_bool() ? "True" : "False"); return;
    case ValueKind::kInt: out.append(std::to_string(v.as_int())); return;
    case ValueKind::kFloat: out.append(python_float_repr(v.as_float())); return;
    case ValueKind::kString: append_string_repr(out, v.as_tstring()); return;
    case ValueKind::kList: {
      const ListObject& list = v.as_list();
      out.append(list.is_tuple ? '(' : '[');
      for (size_t i = 0; i < list.items.size(); ++i) {
        if (i > 0) out.append(", ");
        append_repr(out, list.items[i]);
      }
      if (list.is_tuple && list.items.size() == 1) out.append(',');
      out.append(list.is_tuple ? ')' : ']');
      return;
    }
    case ValueKind::kDict: {
      out.append('{');
      bool first = true;
      for (const auto& [key, value] : v.as_dict().entries) {
        if (!first) out.append(", ");
        first = false;
        append_repr(out, key);
        out.append(": ");
        append_repr(out, value);
      }
      out.append('}');
      return;
    }
    case ValueKind::kNamespace: {
      out.append("<Namespace {");
      bool first = true;
      for (const auto& [key, value] : v.as_namespace().attributes) {
        if (!first) out.append(", ");
        first = false;
        append_repr(out, Value::string(key));
        out.append(": ");
        append_repr(out, value);
      }
      out.append("}>");
      return;
    }
    case ValueKind::kCallable: out.append("<function " + v.as_callable().name + ">"); return;
    case ValueKind::kLoop: out.append("<LoopContext " + std::to_string(v.as_loop().index0 + 1) + ">"); return;
  }
}

TString to_tstring(const Value& v) {
  if (v.is_string()) return v.as_tstring();
  TString out;
  append_repr(out, v);
  return out;
}

Status append_json(TString& out, const Value& v, const JsonFormat& format, int indent_level) {
  auto newline_indent = [&](int level) {
    out.append('\n');
    for (int i = 0; i < level; ++i) out.append(format.indent);
  };
  switch (v.kind()) {
    case ValueKind::kNone: out.append("null"); return ok_status();
    case ValueKind::kBool: out.append(v.as_bool() ? "true" : "false"); return ok_status();
    case ValueKind::kInt: out.append(std::to_string(v.as_int())); return ok_status();
    case ValueKind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) out.append("NaN");
      else if (std::isinf(d)) out.append(d > 0 ? "Infinity" : "-Infinity");
      else out.append(python_float_repr(d));
      return ok_status();
    }
    case ValueKind::kString: append_json_string(out, v.as_tstring(), format.ensure_ascii); return ok_status();
    case ValueKind::kList: {
      const auto& items = v.items();
      if (items.empty()) {
        out.append("[]");
        return ok_status();
      }
      out.append('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out.append(format.item_separator);
        if (format.has_indent) newline_indent(indent_level + 1);
        PETREL_RETURN_IF_ERROR(append_json(out, items[i], format, indent_level + 1));
      }
      if (format.has_indent) newline_indent(indent_level);
      out.append(']');
      return ok_status();
    }
    case ValueKind::kDict: {
      const auto& entries = v.as_dict().entries;
      if (entries.empty()) {
        out.append("{}");
        return ok_status();
      }
      std::vector<const std::pair<Value, Value>*> order;
      order.reserve(entries.size());
      for (const auto& entry : entries) order.push_back(&entry);
      if (format.sort_keys) {
        for (const auto* entry : order) {
          if (!entry->first.is_string()) {
            return invalid_argument("TypeError: tojson(sort_keys=true) supports only string keys in petrel");
          }
        }
        std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
          return a->first.as_string() < b->first.as_string();
        });
      }
      out.append('{');
      bool first = true;
      for (const auto* entry : order) {
        if (!first) out.append(format.item_separator);
        first = false;
        if (format.has_indent) newline_indent(indent_level + 1);
        const Value& key = entry->first;
        // json.dumps converts int/float/bool/None keys to strings.
        switch (key.kind()) {
          case ValueKind::kString: append_json_string(out, key.as_tstring(), format.ensure_ascii); break;
          case ValueKind::kNone: out.append("\"null\""); break;
          case ValueKind::kBool: out.append(key.as_bool() ? "\"true\"" : "\"false\""); break;
          case ValueKind::kInt: out.append("\"" + std::to_string(key.as_int()) + "\""); break;
          case ValueKind::kFloat: out.append("\"" + python_float_repr(key.as_float()) + "\""); break;
          default:
            return invalid_argument(std::string("TypeError: keys must be str, int, float, bool or None, not ") +
                                    python_type_name(key));
        }
        out.append(format.key_separator);
        PETREL_RETURN_IF_ERROR(append_json(out, entry->second, format, indent_level + 1));
      }
      if (format.has_indent) newline_indent(indent_level);
      out.append('}');
      return ok_status();
    }
    default:
      return invalid_argument(std::string("TypeError: Object of type ") + python_type_name(v) +
                              " is not JSON serializable");
  }
}

Result<Value> value_from_json(const nlohmann::ordered_json& json, bool untrusted, int max_depth) {
  if (max_depth <= 0) return invalid_argument("JSON input is nested too deeply");
  auto make_string = [untrusted](const std::string& s) {
    return Value::string(untrusted ? TString::untrusted(s) : TString(s));
  };
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return make_string(json.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& element : json) {
        PETREL_ASSIGN_OR_RETURN(Value item, value_from_json(element, untrusted, max_depth - 1));
        items.push_back(std::move(item));
      }
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> entries;
      entries.reserve(json.size());
      for (auto it = json.begin(); it != json.end(); ++it) {
        PETREL_ASSIGN_OR_RETURN(Value item, value_from_json(it.value(), untrusted, max_depth - 1));
        entries.emplace_back(make_string(it.key()), std::move(item));
      }
      return Value::dict(std::move(entries));
    }
    default: return invalid_argument("unsupported JSON value (binary or discarded)");
  }
}

// ---------------------------------------------------------------- UTF-8

uint32_t next_codepoint(std::string_view s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  int length = (c >= 0xf0) ? 4 : (c >= 0xe0) ? 3 : (c >= 0xc0) ? 2 : 1;
  if (length == 1 || i + length > s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x7f >> length);
  for (int k = 1; k < length; ++k) {
    unsigned char next = static_cast<unsigned char>(s[i + k]);
    if ((next & 0xc0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (next & 0x3f);
  }
  i += length;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

size_t codepoint_count(std::string_view s) {
  size_t count = 0;
  for (size_t i = 0; i < s.size();) {
    next_codepoint(s, i);
    ++count;
  }
  return count;
}

std::vector<size_t> codepoint_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    offsets.push_back(i);
    next_codepoint(s, i);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool is_python_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

bool is_python_printable(uint32_t cp) {
  // Python's isprintable() is false for the categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs (except the
  // space). This covers controls, the separators, the common format characters (soft hyphen, zero
  // width and bidi marks, BOM, tags) and private use; unassigned codepoints are treated as printable.
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0)) return false;
  if (cp == 0xad || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f)) return false;
  if ((cp >= 0x205f && cp <= 0x2064) || (cp >= 0x2066 && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff) return false;
  if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e) return false;
  if ((cp >= 0xd800 && cp <= 0xf8ff) || (cp >= 0xfff9 && cp <= 0xfffb)) return false;
  if (cp == 0xe0001 || (cp >= 0xe0020 && cp <= 0xe007f) || cp >= 0xf0000) return false;
  return true;
}

}  // namespace petrel::jinja
