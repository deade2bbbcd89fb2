#include "petrel/text/jinja_operators.h"

#include <cmath>
#include <cstdio>

namespace petrel::jinja {
namespace {

Status type_error(const char* symbol, const Value& a, const Value& b) {
  return invalid_argument(std::string("TypeError: unsupported operand type(s) for ") + symbol + ": '" +
                          python_type_name(a) + "' and '" + python_type_name(b) + "'");
}

Status overflow() {
  return invalid_argument("OverflowError: integer result does not fit in 64 bits (petrel's integers are 64-bit)");
}

Result<Value> repeat(BuiltinContext& ctx, const Value& sequence, int64_t count) {
  if (count < 0) count = 0;
  if (sequence.is_string()) {
    const TString& s = sequence.as_tstring();
    if (!s.empty() && static_cast<uint64_t>(count) > (UINT64_MAX / s.size())) {
      return ctx.check_size(SIZE_MAX);
    }
    PETREL_RETURN_IF_ERROR(ctx.check_size(s.size() * static_cast<size_t>(count)));
    TString out;
    for (int64_t i = 0; i < count; ++i) out.append(s);
    return Value::string(std::move(out));
  }
  const auto& items = sequence.items();
  PETREL_RETURN_IF_ERROR(ctx.count_steps(items.size() * static_cast<size_t>(count)));
  std::vector<Value> out;
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), sequence.as_list().is_tuple);
}

}  // namespace

Result<Value> unary_operator(bool negate, const Value& v) {
  if (v.is_undefined()) return invalid_argument("UndefinedError: " + v.undefined_hint());
  if (!v.is_number()) {
    return invalid_argument(std::string("TypeError: bad operand type for unary ") + (negate ? "-" : "+") + ": '" +
                            python_type_name(v) + "'");
  }
  if (v.is_float()) return Value::floating(negate ? -v.as_float() : v.as_float());
  if (negate && v.as_int() == INT64_MIN) return overflow();
  return Value::integer(negate ? -v.as_int() : v.as_int());
}

Result<Value> binary_operator(BuiltinContext& ctx, BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) return invalid_argument("UndefinedError: " + a.undefined_hint());
  if (b.is_undefined()) return invalid_argument("UndefinedError: " + b.undefined_hint());
  bool numbers = a.is_number() && b.is_number();
  bool floats = numbers && (a.is_float() || b.is_float());
  switch (op) {
    case BinaryOp::kAdd: {
      if (numbers) {
        if (floats) return Value::floating(a.as_float() + b.as_float());
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return overflow();
        return Value::integer(r);
      }
      if (a.is_string() && b.is_string()) {
        PETREL_RETURN_IF_ERROR(ctx.check_size(a.as_string().size() + b.as_string().size()));
        TString out = a.as_tstring();
        out.append(b.as_tstring());
        return Value::string(std::move(out));
      }
      if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
        std::vector<Value> items = a.items();
        items.insert(items.end(), b.items().begin(), b.items().end());
        return Value::list(std::move(items), a.as_list().is_tuple);
      }
      if (a.is_string() || a.is_list()) {
        return invalid_argument(std::string("TypeError: can only concatenate ") + python_type_name(a) + " (not \"" +
                                python_type_name(b) + "\") to " + python_type_name(a));
      }
      return type_error("+", a, b);
    }
    case BinaryOp::kSub: {
      if (!numbers) return type_error("-", a, b);
      if (floats) return Value::floating(a.as_float() - b.as_float());
      int64_t r;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return overflow();
      return Value::integer(r);
    }
    case BinaryOp::kMul: {
      if (numbers) {
        if (floats) return Value::floating(a.as_float() * b.as_float());
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return overflow();
        return Value::integer(r);
      }
      bool a_int = a.is_int() || a.is_bool(), b_int = b.is_int() || b.is_bool();
      if ((a.is_string() || a.is_list()) && b_int) return repeat(ctx, a, b.as_int());
      if ((b.is_string() || b.is_list()) && a_int) return repeat(ctx, b, a.as_int());
      return type_error("*", a, b);
    }
    case BinaryOp::kDiv: {
      if (!numbers) return type_error("/", a, b);
      if (b.as_float() == 0.0) return invalid_argument("ZeroDivisionError: division by zero");
      return Value::floating(a.as_float() / b.as_float());
    }
    case BinaryOp::kFloorDiv: {
      if (!numbers) return type_error("//", a, b);
      if (b.as_float() == 0.0) return invalid_argument("ZeroDivisionError: integer division or modulo by zero");
      if (floats) return Value::floating(std::floor(a.as_float() / b.as_float()));
      int64_t x = a.as_int(), y = b.as_int();
      if (x == INT64_MIN && y == -1) return overflow();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value::integer(q);
    }
    case BinaryOp::kMod: {
      if (a.is_string()) return percent_format(a.as_tstring(), b);
      if (!numbers) return type_error("%", a, b);
      if (b.as_float() == 0.0) return invalid_argument("ZeroDivisionError: integer division or modulo by zero");
      if (floats) {
        double r = std::fmod(a.as_float(), b.as_float());
        if (r != 0.0 && ((r < 0) != (b.as_float() < 0))) r += b.as_float();
        return Value::floating(r);
      }
      int64_t x = a.as_int(), y = b.as_int();
      if (y == -1) return Value::integer(0);
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value::integer(r);
    }
    case BinaryOp::kPow: {
      if (!numbers) return type_error("** or pow()", a, b);
      if (floats || b.as_int() < 0) return Value::floating(std::pow(a.as_float(), b.as_float()));
      int64_t base = a.as_int(), exponent = b.as_int(), r = 1;
      while (exponent > 0) {
        if (exponent & 1) {
          if (__builtin_mul_overflow(r, base, &r)) return overflow();
        }
        exponent >>= 1;
        if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) return overflow();
      }
      return Value::integer(r);
    }
  }
  return internal_error("unknown binary operator");
}

Result<bool> contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::kString:
      if (!item.is_string()) {
        return invalid_argument(std::string("TypeError: 'in <string>' requires string as left operand, not ") +
                                python_type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case ValueKind::kList:
      for (const Value& v : container.items()) {
        if (values_equal(v, item)) return true;
      }
      return false;
    case ValueKind::kDict: return container.as_dict().find(item) != nullptr;
    case ValueKind::kUndefined: return false;  // Undefined iterates as empty
    default:
      return invalid_argument(std::string("TypeError: argument of type '") + python_type_name(container) +
                              "' is not iterable");
  }
}

Result<bool> compare_operator(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq: return values_equal(a, b);
    case CompareOp::kNe: return !values_equal(a, b);
    case CompareOp::kIn: return contains(b, a);
    case CompareOp::kNotIn: {
      PETREL_ASSIGN_OR_RETURN(bool inside, contains(b, a));
      return !inside;
    }
    default: break;
  }
  auto ordered = compare_values(a, b);
  if (!ordered.ok()) {
    const char* symbol = op == CompareOp::kLt ? "<" : op == CompareOp::kLe ? "<=" : op == CompareOp::kGt ? ">" : ">=";
    return invalid_argument(std::string("TypeError: '") + symbol + "' not supported between instances of '" +
                            python_type_name(a) + "' and '" + python_type_name(b) + "'");
  }
  int c = *ordered;
  switch (op) {
    case CompareOp::kLt: return c < 0;
    case CompareOp::kLe: return c <= 0;
    case CompareOp::kGt: return c > 0;
    default: return c >= 0;
  }
}

Result<Value> percent_format(const TString& format, const Value& args) {
  std::vector<Value> values;
  if (args.is_list() && args.as_list().is_tuple) values = args.items();
  else values.push_back(args);
  const std::string& f = format.text();
  TString out;
  size_t next_value = 0;
  size_t literal_start = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') continue;
    out.append_slice(format, literal_start, i);
    size_t j = i + 1;
    std::string spec = "%";
    while (j < f.size() && std::string_view("-+ #0").find(f[j]) != std::string_view::npos) spec += f[j++];
    while (j < f.size() && f[j] >= '0' && f[j] <= '9') spec += f[j++];
    if (j < f.size() && f[j] == '.') {
      spec += f[j++];
      while (j < f.size() && f[j] >= '0' && f[j] <= '9') spec += f[j++];
    }
    if (j >= f.size()) return invalid_argument("ValueError: incomplete format");
    char type = f[j];
    literal_start = j + 1;
    i = j;
    if (type == '%') {
      out.append('%');
      continue;
    }
    if (next_value >= values.size()) return invalid_argument("TypeError: not enough arguments for format string");
    const Value& v = values[next_value++];
    char buffer[512];
    switch (type) {
      case 's':
      case 'r': {
        TString text;
        if (type == 's') text = to_tstring(v);
        else append_repr(text, v);
        if (spec == "%") {
          out.append(text);
        } else {
          std::snprintf(buffer, sizeof(buffer), (spec + "s").c_str(), text.text().c_str());
          TString formatted(buffer);
          if (text.has_untrusted()) formatted.mark_all_untrusted();
          out.append(formatted);
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!v.is_number()) {
          return invalid_argument(std::string("TypeError: %") + type + " format: a real number is required, not " +
                                  python_type_name(v));
        }
        long long n = v.is_float() ? static_cast<long long>(v.as_float()) : v.as_int();
        std::snprintf(buffer, sizeof(buffer), (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
        out.append(buffer);
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v.is_number()) {
          return invalid_argument(std::string("TypeError: must be real number, not ") + python_type_name(v));
        }
        std::snprintf(buffer, sizeof(buffer), (spec + type).c_str(), v.as_float());
        out.append(buffer);
        break;
      }
      default: return invalid_argument(std::string("ValueError: unsupported format character '") + type + "'");
    }
  }
  out.append_slice(format, literal_start, f.size());
  if (next_value < values.size()) {
    return invalid_argument("TypeError: not all arguments converted during string formatting");
  }
  return Value::string(std::move(out));
}

}  // namespace petrel::jinja
