#include "petrel/runtime/json_schema.h"

#include <algorithm>
#include <bit>
#include <map>
#include <optional>
#include <set>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "petrel/runtime/token_mask.h"

namespace petrel {

using njson = nlohmann::json;

namespace {

constexpr int kMaxSchemaDepth = 16;

Result<uint8_t> type_bit(const njson& name, const std::string& where) {
  if (name.is_string()) {
    const std::string t = name.get<std::string>();
    if (t == "object") return uint8_t{JsonSchema::kObject};
    if (t == "array") return uint8_t{JsonSchema::kArray};
    if (t == "string") return uint8_t{JsonSchema::kString};
    if (t == "number") return uint8_t{JsonSchema::kNumber | JsonSchema::kInteger};
    if (t == "integer") return uint8_t{JsonSchema::kInteger};
    if (t == "boolean") return uint8_t{JsonSchema::kBoolean};
    if (t == "null") return uint8_t{JsonSchema::kNull};
  }
  return invalid_argument(where + "type: " + name.dump() + " is not a JSON Schema type");
}

// A value's JSON text as a literal: strings with their quotes and escapes, numbers as written.
Result<std::string> literal_text(const njson& v, const std::string& where) {
  if (v.is_object() || v.is_array()) return invalid_argument(where + ": enum and const values must be strings, numbers, booleans or null");
  return v.dump();
}

using i128 = __int128;
constexpr i128 kNoBound = JsonSchema::kNoBound;

// 10^j, saturating at kNoBound (10^37).
constexpr std::array<i128, 38> kPowers10 = [] {
  std::array<i128, 38> p{};
  p[0] = 1;
  for (size_t i = 1; i < p.size(); ++i) p[i] = p[i - 1] * 10;
  return p;
}();
i128 pow10_saturating(int j) { return j >= 37 ? kNoBound : kPowers10[static_cast<size_t>(j)]; }

std::string i128_text(i128 v) {
  if (v == 0) return "0";
  std::string out;
  const bool negative = v < 0;
  for (; v != 0; v /= 10) out.push_back(static_cast<char>('0' + static_cast<int>(negative ? -(v % 10) : v % 10)));
  if (negative) out.push_back('-');
  return {out.rbegin(), out.rend()};
}

// N / 10^scale as a JSON Schema validator reads the decimal it writes: the nearest double.
double scaled_value(i128 n, int scale) { return std::strtod((i128_text(n) + "e-" + std::to_string(scale)).c_str(), nullptr); }

// A bound as the smallest (lower) or largest (upper) N whose N / 10^scale keeps to it as validators read it (the
// nearest double); kNoBound-signed "none" for a bound past what is enforced (|bound| * 10^scale > 10^27). The values
// that read as a double keeping to the bound begin (or end) halfway between it and the double beside it.
i128 scaled_bound(double bound, bool exclusive, bool lower, int scale) {
  const double beside = std::nextafter(bound, lower != exclusive ? -HUGE_VAL : HUGE_VAL);
  const long double edge = (static_cast<long double>(bound) + static_cast<long double>(beside)) / 2;  // exact
  const long double scaled = edge * static_cast<long double>(pow10_saturating(scale));
  if (!(std::fabs(scaled) <= 1e27L)) return lower ? -kNoBound : kNoBound;
  const auto keeps = [&](i128 n) {
    const double v = scaled_value(n, scale);
    return lower ? (exclusive ? v > bound : v >= bound) : (exclusive ? v < bound : v <= bound);
  };
  // Then nudged past the product's rounding and a tie at the edge (round half to even).
  i128 n = static_cast<i128>(lower ? std::ceil(scaled) : std::floor(scaled));
  const int step = lower ? 1 : -1;
  for (int i = 0; i < 64 && keeps(n - step); ++i) n -= step;
  for (int i = 0; i < 64 && !keeps(n); ++i) n += step;
  return n;
}

// A multiple of m in [lo, hi]?
bool has_multiple(i128 lo, i128 hi, i128 m) {
  if (lo > hi) return false;
  i128 q = lo / m;
  if (q * m < lo) ++q;
  return q * m <= hi;
}

// A positive JSON number as digits * 10^-k exactly, from its shortest decimal text ("0.25": 25, 2; "3e2": 300, 0);
// none when that takes more than 18 digits or k is negative beyond them.
std::optional<std::pair<int64_t, int>> decimal_of(const njson& number) {
  const std::string text = number.dump();
  std::string digits;
  int exponent = 0, fraction = 0;
  bool dot = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits.push_back(c);
      if (dot) ++fraction;
    } else if (c == '.') {
      dot = true;
    } else if (c == 'e' || c == 'E') {
      exponent = std::atoi(text.c_str() + i + 1);
      break;
    }
  }
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  int k = fraction - exponent;
  while (k < 0 && digits.size() < 19) {
    digits.push_back('0');
    ++k;
  }
  while (k > 0 && digits.size() > 1 && digits.back() == '0') {
    digits.pop_back();
    --k;
  }
  if (digits.empty() || digits.size() > 18 || k < 0) return std::nullopt;
  return std::make_pair(static_cast<int64_t>(std::stoll(digits)), k);
}

// A number or integer schema's minimum / maximum / exclusiveMinimum / exclusiveMaximum (numbers; draft 4's boolean
// exclusiveMinimum/Maximum too) and multipleOf, as a scaled-integer range (JsonSchema::NumericRange) in *range;
// nullopt where it constrains nothing. Bounds that no value meets are an error, or, with `unmet` (a branch of a
// union, which JSON Schema then just never matches), *unmet = the error's text and OK.
Status numeric_constraint(const njson& part, bool integer_only, const std::string& where,
                          std::optional<JsonSchema::NumericRange>* range, std::string* unmet = nullptr) {
  *range = std::nullopt;
  const auto no_value = [&](std::string message) -> Status {
    if (!unmet) return invalid_argument(message);
    *unmet = std::move(message);
    return ok_status();
  };
  const auto number = [&](const char* key, double& v) -> Result<bool> {
    if (!part.contains(key) || part[key].is_boolean()) return false;
    if (!part[key].is_number()) return invalid_argument(where + key + ": expected a number");
    v = part[key].get<double>();
    if (!std::isfinite(v)) return invalid_argument(where + key + ": expected a finite number");
    return true;
  };
  const auto flag = [&](const char* key) { return part.contains(key) && part[key].is_boolean() && part[key].get<bool>(); };
  // multipleOf as digits * 10^-scale, from its shortest decimal text.
  int64_t multiple = 1;
  int scale = integer_only ? 0 : -1;  // -1: no multipleOf yet
  bool multiple_enforced = false;
  if (part.contains("multipleOf")) {
    double m = 0;
    PETREL_ASSIGN_OR_RETURN(bool has, number("multipleOf", m));
    if (!has || !(m > 0)) return invalid_argument(where + "multipleOf: expected a number greater than 0");
    const std::optional<std::pair<int64_t, int>> decimal = decimal_of(part["multipleOf"]);
    if (decimal && decimal->second <= JsonSchema::kMaxScale) {
      const int k = decimal->second;
      multiple_enforced = true;
      multiple = decimal->first;
      if (integer_only) {  // an integer v with v * 10^k a multiple of `multiple`
        for (int i = 0; i < k; ++i) multiple /= std::gcd(multiple, int64_t{10});
      } else {
        scale = k;
      }
    }  // else not enforced (header)
  }
  double lo = 0, hi = 0;
  PETREL_ASSIGN_OR_RETURN(bool has_min, number("minimum", lo));
  PETREL_ASSIGN_OR_RETURN(bool has_max, number("maximum", hi));
  double xlo = 0, xhi = 0;
  PETREL_ASSIGN_OR_RETURN(bool has_xmin, number("exclusiveMinimum", xlo));
  PETREL_ASSIGN_OR_RETURN(bool has_xmax, number("exclusiveMaximum", xhi));
  if (!has_min && !has_max && !has_xmin && !has_xmax && (!multiple_enforced || (integer_only && multiple == 1))) return ok_status();
  if (scale < 0) scale = JsonSchema::kMaxScale;
  i128 min_n = -kNoBound, max_n = kNoBound;
  if (has_min) min_n = std::max(min_n, scaled_bound(lo, flag("exclusiveMinimum"), true, scale));
  if (has_xmin) min_n = std::max(min_n, scaled_bound(xlo, true, true, scale));
  if (has_max) max_n = std::min(max_n, scaled_bound(hi, flag("exclusiveMaximum"), false, scale));
  if (has_xmax) max_n = std::min(max_n, scaled_bound(xhi, true, false, scale));
  const char* what = integer_only || scale == 0 ? "integer" : "number";
  // Bounds that no value meets, or none that is a multiple (for a number, the multiple's places are its scale).
  if (min_n > max_n && !(multiple_enforced && !integer_only)) return no_value(where + "minimum: no " + what + " lies between the bounds");
  if (multiple_enforced && min_n > -kNoBound && max_n < kNoBound && !has_multiple(min_n, max_n, multiple)) {
    return no_value(where + "multipleOf: no multiple of " + part["multipleOf"].dump() + " lies between the bounds");
  }
  *range = JsonSchema::NumericRange{static_cast<uint8_t>(scale), multiple, min_n, max_n};
  return ok_status();
}

// The string formats enforced (OpenAI strict mode's list) as regular expressions written from their grammars:
// RFC 3339 section 5.6 (full-date, full-time: seconds up to 60, an optional fraction, Z or an offset; fields in
// range, not the calendar) and appendix A (duration), RFC 4122's 8-4-4-4-12 hex (uuid), RFC 3986 section 3.2.2
// (IPv6address, dec-octet), RFC 1123 (host labels), RFC 5322's dot-atom (email's local part). Compiled once, on
// first use; null for a format not enforced.
std::string ipv6_regex() {
  const std::string h16 = "[0-9A-Fa-f]{1,4}", dec = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
  const std::string v4 = "(" + dec + "\\.){3}" + dec, ls32 = "(" + h16 + ":" + h16 + "|" + v4 + ")";
  auto words = [&](int n) { return "(" + h16 + ":){" + std::to_string(n) + "}"; };
  auto left = [&](int most) { return "((" + h16 + ":){0," + std::to_string(most) + "}" + h16 + ")?"; };
  return "^(" + words(6) + ls32 + "|::" + words(5) + ls32 + "|(" + h16 + ")?::" + words(4) + ls32 + "|" + left(1) +
         "::" + words(3) + ls32 + "|" + left(2) + "::" + words(2) + ls32 + "|" + left(3) + "::" + h16 + ":" + ls32 +
         "|" + left(4) + "::" + ls32 + "|" + left(5) + "::" + h16 + "|" + left(6) + "::)$";
}

const RegexDfa* format_dfa(const std::string& name) {
  static const std::map<std::string, RegexDfa>* const dfas = [] {
    const std::string dec = "(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)";
    const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    const std::string atom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
    const std::string date = "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])";
    const std::string time = "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)";
    const std::string hex = "[0-9A-Fa-f]";
    const std::pair<const char*, std::string> sources[] = {
        {"date", "^" + date + "$"},
        {"time", "^" + time + "$"},
        {"date-time", "^" + date + "[Tt]" + time + "$"},
        {"uuid", "^" + hex + "{8}-" + hex + "{4}-" + hex + "{4}-" + hex + "{4}-" + hex + "{12}$"},
        {"duration", "^P(((\\d+D|\\d+M(\\d+D)?|\\d+Y(\\d+M(\\d+D)?)?)(T(\\d+H(\\d+M(\\d+S)?)?|\\d+M(\\d+S)?|\\d+S))?)"
                     "|T(\\d+H(\\d+M(\\d+S)?)?|\\d+M(\\d+S)?|\\d+S)|\\d+W)$"},
        {"ipv4", "^(" + dec + "\\.){3}" + dec + "$"},
        {"ipv6", ipv6_regex()},
        {"hostname", "^" + label + "(\\." + label + ")*$"},
        {"email", "^" + atom + "(\\." + atom + ")*@" + label + "(\\." + label + ")+$"},
    };
    auto* out = new std::map<std::string, RegexDfa>;
    for (const auto& [format, regex] : sources) {
      Result<RegexDfa> dfa = RegexDfa::compile(regex);
      if (dfa.ok()) out->emplace(format, std::move(dfa).value());  // tested: every one compiles
    }
    return out;
  }();
  const auto it = dfas->find(name);
  return it == dfas->end() ? nullptr : &it->second;
}

// The types a schema object allows: "type", else read from "properties" / "items", else any.
Result<uint8_t> schema_types(const njson& part, const std::string& where) {
  uint8_t types = 0;
  if (part.is_object() && part.contains("type")) {
    const njson& t = part["type"];
    for (const njson& name : t.is_array() ? t : njson::array({t})) {
      PETREL_ASSIGN_OR_RETURN(uint8_t bit, type_bit(name, where));
      types |= bit;
    }
  } else if (part.is_object() && part.contains("properties")) {
    types = JsonSchema::kObject;
  } else if (part.is_object() && part.contains("items")) {
    types = JsonSchema::kArray;
  } else {
    types = JsonSchema::kAnyType;  // untyped (or a keyword petrel does not read): any value
  }
  return types;
}

// Keywords that describe a value without constraining it.
bool is_annotation(const std::string& k) {
  return k == "title" || k == "description" || k == "examples" || k == "default" || k == "$comment" || k == "deprecated" ||
         k == "readOnly" || k == "writeOnly" || k == "$schema" || k == "$id";
}

// A schema without its annotations (is_annotation), at every level: two branches' properties that differ only in
// those are the same schema.
njson without_annotations(const njson& schema) {
  if (schema.is_array()) {
    njson out = njson::array();
    for (const njson& v : schema) out.push_back(without_annotations(v));
    return out;
  }
  if (!schema.is_object()) return schema;
  njson out = njson::object();
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string& k = it.key();
    if (is_annotation(k)) continue;
    if ((k == "properties" || k == "$defs" || k == "definitions") && it.value().is_object()) {
      njson named = njson::object();  // names here are not keywords: a property may be called "title"
      for (auto p = it.value().begin(); p != it.value().end(); ++p) named[p.key()] = without_annotations(p.value());
      out[k] = std::move(named);
    } else {
      out[k] = without_annotations(it.value());
    }
  }
  return out;
}


// Keywords that say nothing about which values are allowed (annotations, and the places schemas are kept).
bool is_annotation_key(const std::string& k) { return is_annotation(k) || k == "$defs" || k == "definitions"; }

// Whether `s` has a keyword besides `except` that constrains values.
bool constrains_besides(const njson& s, const char* except) {
  if (!s.is_object()) return false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (it.key() != except && !is_annotation_key(it.key())) return true;
  }
  return false;
}

// A schema with an allOf that compile merges (JsonSchema::merge_all_of): several parts, or one beside other
// constraining keywords. A lone part beside annotations (pydantic v1's wrapper of a $ref) is followed by resolve().
bool merges_all_of(const njson& s) {
  if (!s.is_object()) return false;
  const auto all = s.find("allOf");
  return all != s.end() && all->is_array() && !all->empty() && (all->size() > 1 || constrains_besides(s, "allOf"));
}

std::vector<std::string> type_names(const njson& t) {
  std::vector<std::string> names;
  for (const njson& n : t.is_array() ? t : njson::array({t})) {
    if (n.is_string()) names.push_back(n.get<std::string>());
  }
  return names;
}

// `into` narrowed by the keywords of `part` (both schema objects), for allOf: types intersected (an integer is a
// number), properties joined (a property in both: its two schemas merged by `both`), required joined, enum and
// const intersected, the tighter of two bounds and lengths, items merged by `both`, additionalProperties false if
// either says so; two different patterns or formats both kept (the later ones under kMorePatterns / kMoreFormats,
// whose automata compile() intersects with the first's); two multipleOf: their least common multiple. Other keywords
// that both give: the first's stays (the second's is not enforced; docs/SERVER.md).
// `both(a, b)` merges two schemas of one property or of the items (JsonSchema::merge_all_of, so that a union sees
// the merged property's const or type).
using MergeTwo = std::function<Result<njson>(const njson&, const njson&)>;
// Where allOf's merge keeps a second (third, ...) pattern or format of one string: keys no schema of JSON Schema's
// vocabulary uses; compile() reads them as more of the same keyword.
constexpr const char* kMorePatterns = "$petrel:allOf patterns";
constexpr const char* kMoreFormats = "$petrel:allOf formats";
Status merge_into(njson& into, const njson& part, const std::string& where, const MergeTwo& both) {
  static const std::set<std::string> kLower = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"};
  static const std::set<std::string> kUpper = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"};
  for (auto it = part.begin(); it != part.end(); ++it) {
    const std::string& k = it.key();
    const njson& v = it.value();
    if (is_annotation_key(k)) continue;
    if (k == "enum" || k == "const") {
      const njson theirs = k == "const" ? njson::array({v}) : v;
      if (!theirs.is_array()) return invalid_argument(where + "allOf: enum must be an array");
      if (!into.contains("enum") && !into.contains("const")) {
        into[k] = v;
        continue;
      }
      const njson mine = into.contains("const") ? njson::array({into["const"]}) : into["enum"];
      njson common = njson::array();
      for (const njson& x : mine.is_array() ? mine : njson::array()) {
        if (std::find(theirs.begin(), theirs.end(), x) != theirs.end()) common.push_back(x);
      }
      if (common.empty()) return invalid_argument(where + "allOf: the parts' enum/const values have none in common");
      into.erase("const");
      into["enum"] = std::move(common);
      continue;
    }
    if (!into.contains(k)) {
      into[k] = v;
      continue;
    }
    njson& mine = into[k];
    if (k == "type") {
      const std::vector<std::string> a = type_names(mine), b = type_names(v);
      auto has = [](const std::vector<std::string>& names, const char* n) {
        return std::find(names.begin(), names.end(), n) != names.end();
      };
      njson common = njson::array();
      for (const std::string& t : a) {
        std::string kept;
        if (has(b, t.c_str())) kept = t;
        else if ((t == "integer" && has(b, "number")) || (t == "number" && has(b, "integer"))) kept = "integer";
        if (!kept.empty() && std::find(common.begin(), common.end(), kept) == common.end()) common.push_back(kept);
      }
      if (common.empty()) return invalid_argument(where + "allOf: its parts allow no type in common");
      mine = common.size() == 1 ? common[0] : common;
    } else if (k == "properties" && mine.is_object() && v.is_object()) {
      for (auto p = v.begin(); p != v.end(); ++p) {
        if (!mine.contains(p.key())) {
          mine[p.key()] = p.value();
        } else if (without_annotations(mine[p.key()]) != without_annotations(p.value())) {
          PETREL_ASSIGN_OR_RETURN(mine[p.key()], both(mine[p.key()], p.value()));
        }
      }
    } else if (k == "required" && mine.is_array() && v.is_array()) {
      for (const njson& name : v) {
        if (std::find(mine.begin(), mine.end(), name) == mine.end()) mine.push_back(name);
      }
    } else if (kLower.count(k) && mine.is_number() && v.is_number()) {
      if (v.get<double>() > mine.get<double>()) mine = v;
    } else if (kUpper.count(k) && mine.is_number() && v.is_number()) {
      if (v.get<double>() < mine.get<double>()) mine = v;
    } else if (k == "items") {
      if (without_annotations(mine) != without_annotations(v)) {
        PETREL_ASSIGN_OR_RETURN(mine, both(mine, v));
      }
    } else if (k == "additionalProperties") {
      if (v.is_boolean() && !v.get<bool>()) mine = false;
    } else if (k == "multipleOf" && mine.is_number() && v.is_number() && mine != v) {
      // A multiple of both: their least common multiple, exactly in decimal (0.5 and 0.3: 1.5); where that takes
      // more than 15 digits, the first's stays (the second's is not enforced).
      const auto a = decimal_of(mine), b = decimal_of(v);
      if (a && b && a->first > 0 && b->first > 0) {
        const int scale = std::max(a->second, b->second);
        auto widened = [&](std::pair<int64_t, int> d) -> std::optional<int64_t> {
          int64_t x = d.first;
          for (int i = d.second; i < scale; ++i) {
            if (x > INT64_MAX / 10) return std::nullopt;
            x *= 10;
          }
          return x;
        };
        const std::optional<int64_t> x = widened(*a), y = widened(*b);
        if (x && y) {
          const int64_t g = std::gcd(*x, *y);
          if (*x / g <= int64_t{999999999999999} / *y) {  // 15 digits: exact through a double
            const int64_t l = *x / g * *y;
            // l * 10^-scale as its decimal text, read back as a JSON number (the shortest form of that double).
            std::string text = std::to_string(l);
            if (scale > 0) {
              if (static_cast<int>(text.size()) <= scale) text.insert(0, static_cast<size_t>(scale + 1 - text.size()), '0');
              text.insert(text.size() - static_cast<size_t>(scale), ".");
            }
            mine = njson::parse(text);
          }
        }
      }
    } else if ((k == "pattern" || k == "format") && v.is_string() && mine != v) {
      njson& more = into[k == "pattern" ? kMorePatterns : kMoreFormats];
      if (!more.is_array()) more = njson::array();
      if (std::find(more.begin(), more.end(), v) == more.end()) more.push_back(v);
    }
  }
  // A part's own merged patterns and formats (a nested allOf) join this one's.
  for (const char* key : {kMorePatterns, kMoreFormats}) {
    if (!part.contains(key) || !part[key].is_array()) continue;
    njson& more = into[key];
    if (!more.is_array()) more = njson::array();
    for (const njson& v : part[key]) {
      if (std::find(more.begin(), more.end(), v) == more.end()) more.push_back(v);
    }
  }
  return ok_status();
}
}  // namespace

Status JsonSchema::string_automata(const njson& part, const std::string& where, Node& node) {
  // The keyword's value (one string) and allOf's further ones, in order.
  auto values = [&](const char* key, const char* more, std::vector<std::string>& out) -> Status {
    if (part.contains(key)) {
      if (!part[key].is_string()) return invalid_argument(where + key + ": expected a string");
      out.push_back(part[key].get<std::string>());
    }
    if (part.contains(more) && part[more].is_array()) {
      for (const njson& v : part[more]) {
        if (v.is_string()) out.push_back(v.get<std::string>());
      }
    }
    return ok_status();
  };
  std::vector<std::string> pattern_texts, format_names;
  PETREL_RETURN_IF_ERROR(values("pattern", kMorePatterns, pattern_texts));
  PETREL_RETURN_IF_ERROR(values("format", kMoreFormats, format_names));
  std::vector<const RegexDfa*> formats;  // the enforced ones (format_dfa: null for a format not enforced)
  for (const std::string& name : format_names) {
    const RegexDfa* f = format_dfa(name);
    if (f && std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  }
  if (pattern_texts.empty() && formats.size() <= 1) {  // one format alone: its shared automaton
    node.format = formats.empty() ? nullptr : formats[0];
    return ok_status();
  }
  // Else one automaton for all of them (so that a string the pattern allows but the format cannot finish is dead
  // at once, not a dead end).
  std::optional<RegexDfa> dfa;
  for (const std::string& text : pattern_texts) {
    Result<RegexDfa> next = RegexDfa::compile(text);
    if (!next.ok()) return invalid_argument(where + next.status().message());
    if (dfa) next = RegexDfa::intersect(*dfa, *next);
    if (!next.ok()) return invalid_argument(where + next.status().message());
    dfa = std::move(next).value();
  }
  for (const RegexDfa* f : formats) {
    Result<RegexDfa> next = dfa ? RegexDfa::intersect(*dfa, *f) : Result<RegexDfa>(*f);
    if (!next.ok()) return invalid_argument(where + next.status().message());
    dfa = std::move(next).value();
  }
  // A schema may hold many patterns: their automata together are bounded like one (a request's compile time).
  int64_t states = dfa->state_count();
  for (const RegexDfa& other : patterns_) states += other.state_count();
  if (states > 4 * int64_t{RegexDfa::kMaxStates}) {
    return invalid_argument(where + "pattern: the schema's patterns need more than " +
                            std::to_string(4 * RegexDfa::kMaxStates) + " automaton states in all");
  }
  patterns_.push_back(std::move(*dfa));
  node.pattern = static_cast<int32_t>(patterns_.size() - 1);
  return ok_status();
}

Status JsonSchema::add_object_union(const std::vector<const njson*>& parts, const std::string& where, int depth,
                                    int32_t index, Node& node) {
  const size_t n_branches = parts.size();
  if (n_branches > kMaxBranches) {
    return invalid_argument(where + "anyOf: more than " + std::to_string(kMaxBranches) + " object branches");
  }
  // Each branch's properties (escaped names) and required names.
  std::vector<std::map<std::string, const njson*>> props(n_branches);
  std::vector<std::vector<std::string>> required(n_branches);
  std::set<std::string> all_keys;
  for (size_t b = 0; b < n_branches; ++b) {
    const njson& o = *parts[b];
    const njson& p = o["properties"];
    if (!p.is_object()) return invalid_argument(where + "anyOf: properties: expected an object");
    for (auto it = p.begin(); it != p.end(); ++it) {
      const std::string escaped = njson(it.key()).dump();
      props[b].emplace(escaped.substr(1, escaped.size() - 2), &it.value());
      all_keys.insert(escaped.substr(1, escaped.size() - 2));
    }
    if (o.contains("required")) {
      if (!o["required"].is_array()) return invalid_argument(where + "anyOf: required: expected an array of names");
      for (const njson& r : o["required"]) {
        if (!r.is_string()) return invalid_argument(where + "anyOf: required: expected an array of names");
        const std::string escaped = njson(r.get<std::string>()).dump();
        const std::string key = escaped.substr(1, escaped.size() - 2);
        if (!props[b].count(key)) return invalid_argument(where + "anyOf: required: '" + r.get<std::string>() + "' is not among the properties");
        required[b].push_back(key);
      }
    }
  }
  if (all_keys.size() > 64) return invalid_argument(where + "anyOf: the object branches have more than 64 properties in all");
  node.keys.assign(all_keys.begin(), all_keys.end());
  const auto key_at = [&](const std::string& key) { return std::lower_bound(node.keys.begin(), node.keys.end(), key) - node.keys.begin(); };
  node.key_branches.assign(node.keys.size(), 0);
  node.branch_required.assign(n_branches, 0);
  node.key_type_branches.assign(node.keys.size(), {});
  node.key_literal_branches.assign(node.keys.size(), {});
  for (size_t b = 0; b < n_branches; ++b) {
    for (const auto& [key, sub] : props[b]) node.key_branches[static_cast<size_t>(key_at(key))] |= static_cast<uint16_t>(1u << b);
    for (const std::string& key : required[b]) node.branch_required[b] |= uint64_t{1} << key_at(key);
  }
  nodes_[static_cast<size_t>(index)] = node;  // the children are appended after this node
  for (size_t k = 0; k < node.keys.size(); ++k) {
    const std::string& key = node.keys[k];
    const std::string at = where + "anyOf.properties." + key + ".";
    node.key_type_branches[k].fill(0xFFFF);
    // The branches' schemas for this key, resolved; one schema (up to annotations) is one child, no narrowing.
    std::vector<std::pair<size_t, const njson*>> mine;
    for (size_t b = 0; b < n_branches; ++b) {
      if (const auto it = props[b].find(key); it != props[b].end()) {
        PETREL_ASSIGN_OR_RETURN(const njson* r, resolve(*it->second, at));
        mine.emplace_back(b, r);
      }
    }
    const njson first = without_annotations(*mine[0].second);
    bool same = true;
    for (size_t i = 1; i < mine.size() && same; ++i) same = without_annotations(*mine[i].second) == first;
    if (same) {
      PETREL_ASSIGN_OR_RETURN(int32_t child, add(*mine[0].second, at, depth + 1));
      node.key_nodes.push_back(child);
      continue;
    }
    const auto is_literal = [](const njson* s) { return s->is_object() && (s->contains("enum") || s->contains("const")); };
    const size_t literals = static_cast<size_t>(std::count_if(mine.begin(), mine.end(), [&](const auto& m) { return is_literal(m.second); }));
    if (literals == mine.size()) {
      // A discriminator: the union of the values, each with the branches that allow it.
      std::map<std::string, uint16_t> texts;
      for (const auto& [b, s] : mine) {
        const njson values = s->contains("const") ? njson::array({(*s)["const"]}) : (*s)["enum"];
        if (!values.is_array() || values.empty()) return invalid_argument(at + "enum: expected a non-empty array");
        for (const njson& v : values) {
          PETREL_ASSIGN_OR_RETURN(std::string text, literal_text(v, at + "enum"));
          texts[text] |= static_cast<uint16_t>(1u << b);
        }
      }
      Node lit;
      lit.types = 0;
      for (const auto& [text, branches] : texts) {
        lit.literals.push_back(text);
        node.key_literal_branches[k].push_back(branches);
      }
      nodes_.push_back(std::move(lit));
      node.key_nodes.push_back(static_cast<int32_t>(nodes_.size() - 1));
      continue;
    }
    if (literals > 0) {
      return invalid_argument(at + ": the anyOf branches give it both enum/const values and types; petrel cannot tell them apart while generating");
    }
    // Different types: a union (add's own checks refuse one type twice), narrowed by the value's type.
    njson& joined = synthetic_.emplace_back(njson{{"anyOf", njson::array()}});
    std::vector<njson> distinct;  // branches that agree (up to annotations) give one union member
    uint8_t seen_types = 0;
    node.key_type_branches[k].fill(0);
    for (const auto& [b, s] : mine) {
      PETREL_ASSIGN_OR_RETURN(uint8_t types, schema_types(*s, at));
      for (int t = 0; t < 7; ++t) {
        if (types & (1u << t)) node.key_type_branches[k][static_cast<size_t>(t)] |= static_cast<uint16_t>(1u << b);
      }
      njson plain = without_annotations(*s);
      if (std::find(distinct.begin(), distinct.end(), plain) != distinct.end()) continue;
      distinct.push_back(std::move(plain));
      joined["anyOf"].push_back(*s);
      // Two schemas that allow one type (integer and number, two object shapes, ...): the value's first byte
      // does not say which branch it keeps, and a branch a discriminator chose could take the other's values.
      if (types & seen_types) {
        return invalid_argument(at + ": the anyOf branches give it different schemas of the same type; petrel cannot tell them apart while generating");
      }
      seen_types |= types;
    }
    PETREL_ASSIGN_OR_RETURN(int32_t child, add(joined, at, depth + 1));
    node.key_nodes.push_back(child);
  }
  return ok_status();
}

Result<njson> JsonSchema::merge_all_of(const njson& schema, const std::string& where, int depth) {
  if (depth > kMaxSchemaDepth) {
    return invalid_argument(where + "allOf: its parts merge deeper than " + std::to_string(kMaxSchemaDepth) +
                            " levels (two different recursive schemas cannot be merged)");
  }
  njson merged = schema;
  merged.erase("allOf");
  const MergeTwo both = [&](const njson& a, const njson& b) -> Result<njson> {
    return merge_all_of(njson{{"allOf", njson::array({a, b})}}, where, depth + 1);
  };
  // Parts with additionalProperties false allow only their own properties, whatever the other parts list.
  std::vector<std::set<std::string>> closed;
  auto note_closed = [&](const njson& part) {
    const auto extra = part.find("additionalProperties");
    if (extra == part.end() || !extra->is_boolean() || extra->get<bool>()) return;
    std::set<std::string>& keys = closed.emplace_back();
    if (const auto props = part.find("properties"); props != part.end() && props->is_object()) {
      for (auto p = props->begin(); p != props->end(); ++p) keys.insert(p.key());
    }
  };
  note_closed(merged);
  for (const njson& written : schema["allOf"]) {
    PETREL_ASSIGN_OR_RETURN(const njson* part, resolve(written, where + "allOf."));
    if (part->is_boolean()) {
      if (part->get<bool>()) continue;
      return invalid_argument(where + "allOf: a part is false, so nothing is allowed");
    }
    if (!part->is_object()) return invalid_argument(where + "allOf: a part must be a schema, not " + part->dump());
    njson inner;
    if (merges_all_of(*part)) {
      PETREL_ASSIGN_OR_RETURN(inner, merge_all_of(*part, where, depth + 1));
      part = &inner;
    }
    note_closed(*part);
    PETREL_RETURN_IF_ERROR(merge_into(merged, *part, where, both));
  }
  if (!closed.empty() && merged.contains("properties") && merged["properties"].is_object()) {
    njson kept = njson::object();
    for (auto p = merged["properties"].begin(); p != merged["properties"].end(); ++p) {
      const bool everywhere = std::all_of(closed.begin(), closed.end(), [&](const std::set<std::string>& keys) { return keys.count(p.key()) > 0; });
      if (everywhere) {
        kept[p.key()] = p.value();
      } else if (merged.contains("required") && merged["required"].is_array() &&
                 std::find(merged["required"].begin(), merged["required"].end(), p.key()) != merged["required"].end()) {
        return invalid_argument(where + "allOf: '" + p.key() + "' is required, but a part with additionalProperties false does not allow it");
      }
    }
    merged["properties"] = std::move(kept);
  }
  // An anyOf beside other keywords (a base object and a union of its variants): each branch narrowed by them, as
  // allOf distributes over anyOf; the compiler then sees a union of whole schemas.
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!merged.contains(key) || !merged[key].is_array() || !constrains_besides(merged, key)) continue;
    njson base = merged;
    base.erase(key);
    njson branches = njson::array();
    for (const njson& branch : merged[key]) {
      PETREL_ASSIGN_OR_RETURN(njson narrowed, merge_all_of(njson{{"allOf", njson::array({base, branch})}}, where, depth + 1));
      branches.push_back(std::move(narrowed));
    }
    return njson{{"anyOf", std::move(branches)}};
  }
  return merged;
}

Result<const njson*> JsonSchema::resolve(const njson& schema, const std::string& where) const {
  const njson* s = &schema;
  for (int hops = 0; s->is_object(); ++hops) {
    if (hops > 64) return invalid_argument(where + "$ref: more than 64 references in a row (a cycle of $refs?)");
    if (const auto ref = s->find("$ref"); ref != s->end()) {
      if (!ref->is_string()) return invalid_argument(where + "$ref: expected a string");
      const std::string r = ref->get<std::string>();
      if (r.empty() || r[0] != '#') {
        return invalid_argument(where + "$ref: '" + r + "' is not a place in this schema (only '#...' references are read)");
      }
      try {
        const njson::json_pointer pointer(r.substr(1));
        if (!document_->contains(pointer)) return invalid_argument(where + "$ref: '" + r + "' names nothing in the schema");
        s = &document_->at(pointer);
      } catch (const njson::exception& e) {
        return invalid_argument(where + "$ref: '" + r + "' is not a JSON pointer (" + e.what() + ")");
      }
      continue;
    }
    if (const auto all = s->find("allOf"); all != s->end() && all->is_array() && all->size() == 1 && !merges_all_of(*s)) {
      s = &(*all)[0];
      continue;
    }
    break;
  }
  return s;
}

Result<int32_t> JsonSchema::add(const njson& written, const std::string& where, int depth) {
  if (depth > kMaxSchemaDepth) return invalid_argument(where + ": nested deeper than " + std::to_string(kMaxSchemaDepth));
  PETREL_ASSIGN_OR_RETURN(const njson* resolved, resolve(written, where));
  if (const auto known = compiled_.find(resolved); known != compiled_.end()) return known->second;
  const int32_t index = static_cast<int32_t>(nodes_.size());
  nodes_.emplace_back();
  compiled_.emplace(resolved, index);  // before merging: a recursive reference to it finds this node
  const njson* source = resolved;
  if (merges_all_of(*resolved)) {  // allOf: compiled as the one schema its parts make together
    PETREL_ASSIGN_OR_RETURN(njson merged, merge_all_of(*resolved, where, 0));
    synthetic_.push_back(std::move(merged));
    source = &synthetic_.back();
  }
  const njson& schema = *source;
  if (schema.is_boolean() || (schema.is_object() && schema.empty())) return index;  // true / {}: anything
  if (!schema.is_object()) return invalid_argument(where + ": a schema must be an object, not " + schema.dump());
  Node node;
  if (schema.contains("enum") || schema.contains("const")) {
    const njson values = schema.contains("const") ? njson::array({schema["const"]}) : schema["enum"];
    if (!values.is_array() || values.empty()) return invalid_argument(where + "enum: expected a non-empty array");
    for (const njson& v : values) {
      PETREL_ASSIGN_OR_RETURN(std::string text, literal_text(v, where + "enum"));
      node.literals.push_back(std::move(text));
    }
    std::sort(node.literals.begin(), node.literals.end());
    node.literals.erase(std::unique(node.literals.begin(), node.literals.end()), node.literals.end());
    node.types = 0;
    nodes_[static_cast<size_t>(index)] = std::move(node);
    return index;
  }
  // Types: "type" (one or a list), a union of "anyOf"/"oneOf" branches, or read from the keywords.
  const njson* branches = schema.contains("anyOf") ? &schema["anyOf"] : schema.contains("oneOf") ? &schema["oneOf"] : nullptr;
  std::vector<const njson*> parts = {&schema};
  if (branches) {
    if (!branches->is_array() || branches->empty()) return invalid_argument(where + "anyOf: expected a non-empty array");
    parts.clear();
    for (const njson& b : *branches) {
      PETREL_ASSIGN_OR_RETURN(const njson* branch, resolve(b, where + "anyOf."));
      parts.push_back(branch);
    }
  }
  node.types = 0;
  const njson* object_part = nullptr;
  const njson* array_part = nullptr;
  const njson* string_part = nullptr;
  std::vector<std::pair<const njson*, uint8_t>> numeric_parts;  // integer and number branches, with their types
  std::vector<const njson*> object_parts;  // object schemas with properties; several: a union (add_object_union)
  bool loose_object = false;
  std::vector<uint8_t> part_types;  // parts[i]'s types
  for (const njson* part : parts) {
    PETREL_ASSIGN_OR_RETURN(uint8_t types, schema_types(*part, where));
    part_types.push_back(types);
    // Objects with properties may repeat: their keys tell them apart as they are written.
    const bool keyed_object = types == kObject && part->is_object() && part->contains("properties");
    const uint8_t shared = node.types & types & ~(kNumber | kInteger);
    if (branches && shared != 0 && types != kAnyType && !(keyed_object && shared == kObject && !object_parts.empty())) {
      return invalid_argument(where + "anyOf: branches of the same type cannot be told apart while generating");
    }
    node.types |= types;
    if (types & kObject) {
      object_part = part;
      if (part->is_object() && part->contains("properties")) object_parts.push_back(part);
      else loose_object = true;  // untyped, or an object without properties: any object
    }
    if (types & kArray) array_part = part;
    if (types & kString) string_part = part;
    if (types & kInteger) numeric_parts.emplace_back(part, types);
  }
  // minItems/maxItems, minLength/maxLength: non-negative integer bounds, the lower at most the upper.
  const auto bounds = [&](const njson* part, const char* low, const char* high, uint32_t& lo, uint32_t& hi) -> Status {
    if (!part || !part->is_object()) return Status::ok_status();
    for (const char* bound : {low, high}) {
      if (!part->contains(bound)) continue;
      const njson& v = (*part)[bound];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > int64_t{UINT32_MAX} - 1) {
        return invalid_argument(where + bound + ": expected a non-negative integer");
      }
      (bound == low ? lo : hi) = static_cast<uint32_t>(v.get<int64_t>());
    }
    if (lo > hi) return invalid_argument(where + low + ": more than " + high);
    return Status::ok_status();
  };
  if (node.types & kString) PETREL_RETURN_IF_ERROR(bounds(string_part, "minLength", "maxLength", node.min_length, node.max_length));
  if ((node.types & kString) && string_part && string_part->is_object()) PETREL_RETURN_IF_ERROR(string_automata(*string_part, where, node));
  // Integers and numbers: each branch's range; a value must fall in one. A branch that constrains nothing allows any
  // number of its type: for a number branch, no range is needed at all; an integer branch beside others is the
  // range of all integers. More than kMaxNumericRanges ranges: none enforced (the header says so).
  // In a union, a branch whose bounds no number meets matches nothing and is left out (its other types stay); a
  // union of which no branch is left matches nothing: an error, as such bounds in a lone schema are.
  std::vector<NumericRange> ranges;
  bool any_number = false;
  std::vector<const njson*> unmet_parts;
  std::string unmet;
  for (const auto& [part, types] : numeric_parts) {
    const bool integer_only = (types & kNumber) == 0;
    std::optional<NumericRange> range;
    std::string why;
    if (part->is_object()) PETREL_RETURN_IF_ERROR(numeric_constraint(*part, integer_only, where, &range, branches ? &why : nullptr));
    if (!why.empty()) {
      unmet_parts.push_back(part);
      if (unmet.empty()) unmet = why;
      continue;
    }
    if (!range && !integer_only) any_number = true;
    if (!range && integer_only && numeric_parts.size() > 1) range = NumericRange{};
    if (range) ranges.push_back(*range);
  }
  if (!unmet_parts.empty()) {
    node.types = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const bool met = std::find(unmet_parts.begin(), unmet_parts.end(), parts[i]) == unmet_parts.end();
      node.types |= met ? part_types[i] : part_types[i] & ~(kNumber | kInteger);
    }
    if (node.types == 0) return invalid_argument(unmet + " (and no other branch of the anyOf is left)");
  }
  if (!any_number && ranges.size() <= kMaxNumericRanges) node.numeric = std::move(ranges);
  if ((node.types & kObject) && loose_object && !object_parts.empty()) {
    node.any_object = true;  // a branch that allows any object allows the others' too
  } else if ((node.types & kObject) && object_parts.size() > 1) {
    PETREL_RETURN_IF_ERROR(add_object_union(object_parts, where, depth, index, node));
  } else if ((node.types & kObject) && object_part) {
    const njson& o = *object_part;
    if (o.is_object() && o.contains("properties")) {
      const njson& props = o["properties"];
      if (!props.is_object()) return invalid_argument(where + "properties: expected an object");
      if (props.size() > 64) return invalid_argument(where + "properties: more than 64");
      std::vector<std::pair<std::string, const njson*>> keyed;
      for (auto it = props.begin(); it != props.end(); ++it) {
        const std::string escaped = njson(it.key()).dump();  // with quotes
        keyed.emplace_back(escaped.substr(1, escaped.size() - 2), &it.value());
      }
      std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [key, sub] : keyed) node.keys.push_back(key);
      if (o.contains("required")) {
        if (!o["required"].is_array()) return invalid_argument(where + "required: expected an array of names");
        for (const njson& r : o["required"]) {
          if (!r.is_string()) return invalid_argument(where + "required: expected an array of names");
          const std::string escaped = njson(r.get<std::string>()).dump();
          const auto at = std::lower_bound(node.keys.begin(), node.keys.end(), escaped.substr(1, escaped.size() - 2));
          if (at == node.keys.end() || *at != escaped.substr(1, escaped.size() - 2)) {
            return invalid_argument(where + "required: '" + r.get<std::string>() + "' is not among the properties");
          }
          node.required |= uint64_t{1} << (at - node.keys.begin());
        }
      }
      nodes_[static_cast<size_t>(index)] = node;  // the children are appended after this node
      for (const auto& [key, sub] : keyed) {
        PETREL_ASSIGN_OR_RETURN(int32_t child, add(*sub, where + "properties." + key + ".", depth + 1));
        node.key_nodes.push_back(child);
      }
    } else {
      node.any_object = true;
    }
  }
  if ((node.types & kArray) && array_part && array_part->is_object()) {
    PETREL_RETURN_IF_ERROR(bounds(array_part, "minItems", "maxItems", node.min_items, node.max_items));
    if (array_part->contains("items")) {
      nodes_[static_cast<size_t>(index)] = node;
      PETREL_ASSIGN_OR_RETURN(node.items, add((*array_part)["items"], where + "items.", depth + 1));
    }
  }
  nodes_[static_cast<size_t>(index)] = std::move(node);
  return index;
}

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const njson& schema) {
  auto compiled = std::make_shared<JsonSchema>();
  compiled->document_ = &schema;
  auto root_or = compiled->add(schema, "", 0);
  compiled->document_ = nullptr;
  compiled->compiled_.clear();
  compiled->synthetic_.clear();
  PETREL_ASSIGN_OR_RETURN(int32_t root, std::move(root_or));
  const Node& r = compiled->nodes_[static_cast<size_t>(root)];
  if (r.types != kObject) return invalid_argument("the schema's root must be an object (\"type\": \"object\")");
  return std::shared_ptr<const JsonSchema>(std::move(compiled));
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  auto schema = std::make_shared<JsonSchema>();
  Node node;
  node.types = kObject;
  node.any_object = true;
  schema->nodes_.push_back(node);
  return schema;
}

// ---- the automaton ----

SchemaPrefix::SchemaPrefix(const JsonSchema* schema) : schema_(schema), pending_node_(schema->root()) {}

bool SchemaPrefix::value_done() {
  value_ = Value::kNone;
  if (depth_ == 0) {
    done_ = true;
    return true;
  }
  mode_ = Mode::kCommaOrClose;
  return true;
}

bool SchemaPrefix::start_value(unsigned char c) {
  if (pending_node_ < 0) {  // array items with no schema: any value
    integer_only_ = false;
    numeric_ = nullptr;
    length_ = min_length_ = 0;
    dfas_ = {};
    max_length_ = UINT32_MAX;
    free_ = JsonPrefix::any_value();
    if (!free_.feed(c)) return false;
    value_ = Value::kScalar;
    return free_.complete() ? value_done() : true;
  }
  const JsonSchema::Node& node = schema_->node(pending_node_);
  value_node_ = pending_node_;
  if (!node.literals.empty()) {  // enum/const: one of the texts
    lo_ = 0;
    hi_ = static_cast<uint32_t>(node.literals.size());
    offset_ = 0;
    value_ = Value::kLiteral;
    return step(c);
  }
  const bool structured = node.types != JsonSchema::kAnyType;
  if (c == '{' && (node.types & JsonSchema::kObject) && structured && !node.any_object) {
    if (depth_ >= kMaxDepth) return false;
    if (depth_ > 0 && !narrow(stack_[depth_ - 1], JsonSchema::kObject)) return false;
    stack_[depth_++] = Frame{.node = pending_node_, .array = false};
    mode_ = Mode::kKeyOrClose;
    return true;
  }
  if (c == '[' && (node.types & JsonSchema::kArray) && structured) {
    if (depth_ >= kMaxDepth) return false;
    if (depth_ > 0 && !narrow(stack_[depth_ - 1], JsonSchema::kArray)) return false;
    stack_[depth_++] = Frame{.node = pending_node_, .array = true};
    mode_ = Mode::kValueOrClose;
    return true;
  }
  // A string, number, boolean or null, or any value of an untyped node (or any object): JsonPrefix reads it.
  uint8_t need = 0;
  if (c == '"') need = JsonSchema::kString;
  else if (c == '-' || (c >= '0' && c <= '9')) need = JsonSchema::kInteger;  // integers are numbers too
  else if (c == 't' || c == 'f') need = JsonSchema::kBoolean;
  else if (c == 'n') need = JsonSchema::kNull;
  else if (c == '{') need = JsonSchema::kObject;
  else if (c == '[') need = JsonSchema::kArray;
  else return false;
  if (!(node.types & need)) return false;
  if (depth_ > 0 && !narrow(stack_[depth_ - 1], need)) return false;
  integer_only_ = (node.types & (JsonSchema::kNumber | JsonSchema::kInteger)) == JsonSchema::kInteger;
  numeric_ = need == JsonSchema::kInteger && !node.numeric.empty() ? &node : nullptr;
  if (numeric_) {
    negative_ = c == '-';
    fraction_ = false;
    live_ranges_ = static_cast<uint8_t>((1u << node.numeric.size()) - 1);
    digits_ = fraction_digits_ = 0;
    magnitude_ = 0;
    remainders_ = {};
    if (negative_ ? !number_reachable() : !number_byte(c)) return false;
  }
  length_ = 0;
  min_length_ = c == '"' ? node.min_length : 0;
  max_length_ = c == '"' ? node.max_length : UINT32_MAX;
  dfas_ = {c == '"' && node.pattern >= 0 ? &schema_->pattern(node.pattern) : nullptr, c == '"' ? node.format : nullptr};
  dfa_states_ = {};
  free_ = JsonPrefix::any_value();
  if (!free_.feed(c)) return false;
  value_ = Value::kScalar;
  if (free_.complete()) return value_done();
  return true;
}

bool SchemaPrefix::step(unsigned char c) {
  if (done_) return false;
  if (value_ == Value::kScalar) {
    if (integer_only_ && free_.in_number() && (c == '.' || c == 'e' || c == 'E')) return false;
    if (numeric_ && free_.in_number()) {  // feed() restores the state when this refuses the byte
      if ((c >= '0' && c <= '9') || c == '.') return number_byte(c) && free_.feed(c);
      if (c == 'e' || c == 'E' || !number_complete()) return false;  // any other byte ends the number (or is refused below)
    }
    // A string's length: a byte other than the closing quote at a character boundary begins a character.
    const bool boundary = free_.in_plain_string();
    if (boundary && c == '"' && length_ < min_length_) return false;
    if (boundary && c != '"' && length_ >= max_length_) return false;
    for (size_t k = 0; k < dfas_.size(); ++k) {  // each byte of the value (a backslash would begin an escape: none)
      if (!dfas_[k]) continue;
      if (boundary && c == '"') {
        if (!dfas_[k]->accepting(dfa_states_[k])) return false;
      } else if (boundary && c == '\\') {
        return false;
      } else {
        const int32_t next = dfas_[k]->next(dfa_states_[k], c);
        if (next == RegexDfa::kDead) return false;
        dfa_states_[k] = next;
      }
    }
    if (free_.feed(c)) {
      if (boundary && c != '"') ++length_;
      return free_.complete() ? value_done() : true;
    }
    if (!free_.can_end()) return false;
    value_done();  // a number ended by what follows it
    return step(c);
  }
  if (value_ == Value::kLiteral) {
    const auto& lits = schema_->node(value_node_).literals;
    auto byte_at = [&](uint32_t i) { return lits[i].size() > offset_ ? static_cast<int>(static_cast<unsigned char>(lits[i][offset_])) : -1; };
    uint32_t lo = lo_;
    while (lo < hi_ && byte_at(lo) < static_cast<int>(c)) ++lo;
    uint32_t end = lo;
    while (end < hi_ && byte_at(end) == static_cast<int>(c)) ++end;
    // In an object of several schemas, a text some live branch allows must still match.
    const std::vector<uint16_t>* branches = nullptr;
    if (depth_ > 0 && !stack_[depth_ - 1].array) {
      const JsonSchema::Node& parent = schema_->node(stack_[depth_ - 1].node);
      if (!parent.key_literal_branches.empty() && !parent.key_literal_branches[stack_[depth_ - 1].key].empty()) {
        branches = &parent.key_literal_branches[stack_[depth_ - 1].key];
      }
    }
    const auto live = [&](uint32_t i) { return !branches || ((*branches)[i] & stack_[depth_ - 1].live) != 0; };
    if (lo < end) {
      bool any = false;
      for (uint32_t i = lo; i < end && !any; ++i) any = live(i);
      if (!any) return false;
      lo_ = lo;
      hi_ = end;
      ++offset_;
      // Complete once a text is matched that no other matching text extends (a string's closing quote).
      if (lits[lo_].size() == offset_ && hi_ - lo_ == 1) {
        if (branches) stack_[depth_ - 1].live &= (*branches)[lo_];
        return value_done();
      }
      return true;
    }
    if (lits[lo_].size() != offset_ || !live(lo_)) return false;  // not one of the texts
    if (branches) stack_[depth_ - 1].live &= (*branches)[lo_];
    value_done();  // a number literal ended by what follows it
    return step(c);
  }
  const bool ws = c == ' ' || c == '\t' || c == '\n' || c == '\r';
  if (mode_ == Mode::kInKey) {
    const JsonSchema::Node& node = schema_->node(stack_[depth_ - 1].node);
    bool continues = false;  // an escaped quote inside a key (keys are kept escaped): '"' goes on with it
    for (uint32_t i = lo_; i < hi_ && !continues; ++i) continues = node.keys[i].size() > offset_ && node.keys[i][offset_] == '"';
    const Frame& f = stack_[depth_ - 1];
    const auto may_give = [&](uint32_t i) {  // not yet given, and in a live branch
      return !(f.seen & (uint64_t{1} << i)) && (node.key_branches.empty() || (node.key_branches[i] & f.live) != 0);
    };
    if (c == '"' && !continues) {  // the key ends: it must be a property not yet given
      if (lo_ >= hi_ || node.keys[lo_].size() != offset_) return false;
      if (!may_give(lo_)) return false;
      key_index_ = static_cast<int32_t>(lo_);
      mode_ = Mode::kColon;
      return true;
    }
    auto byte_at = [&](uint32_t i) { return node.keys[i].size() > offset_ ? static_cast<int>(static_cast<unsigned char>(node.keys[i][offset_])) : -1; };
    uint32_t lo = lo_;
    while (lo < hi_ && byte_at(lo) < static_cast<int>(c)) ++lo;
    uint32_t end = lo;
    while (end < hi_ && byte_at(end) == static_cast<int>(c)) ++end;
    // A key already given may not be started again: some key not yet given must go on this way.
    bool open = false;
    for (uint32_t i = lo; i < end && !open; ++i) open = may_give(i);
    if (!open) return false;
    lo_ = lo;
    hi_ = end;
    ++offset_;
    return true;
  }
  if (ws) return ws_.take(c, JsonPrefix::kMaxWhitespaceRun);
  ws_.reset();
  switch (mode_) {
    case Mode::kValue: return start_value(c);
    case Mode::kValueOrClose: {
      Frame& f = stack_[depth_ - 1];
      const JsonSchema::Node& node = schema_->node(f.node);
      if (c == ']') {
        if (node.min_items > 0) return false;
        --depth_;
        return value_done();
      }
      if (node.max_items == 0) return false;
      f.seen = 1;
      pending_node_ = node.items;
      return start_value(c);
    }
    case Mode::kKeyOrClose:
    case Mode::kKey: {
      Frame& f = stack_[depth_ - 1];
      const JsonSchema::Node& node = schema_->node(f.node);
      if (c == '}' && mode_ == Mode::kKeyOrClose) {
        if (!may_close(f, node)) return false;
        --depth_;
        return value_done();
      }
      if (c != '"') return false;
      mode_ = Mode::kInKey;
      lo_ = 0;
      hi_ = static_cast<uint32_t>(node.keys.size());
      offset_ = 0;
      return hi_ > 0;
    }
    case Mode::kColon: {
      if (c != ':') return false;
      Frame& f = stack_[depth_ - 1];
      const JsonSchema::Node& node = schema_->node(f.node);
      f.seen |= uint64_t{1} << key_index_;
      f.key = static_cast<uint8_t>(key_index_);
      if (!node.key_branches.empty()) f.live &= node.key_branches[static_cast<size_t>(key_index_)];
      pending_node_ = node.key_nodes[static_cast<size_t>(key_index_)];
      mode_ = Mode::kValue;
      return true;
    }
    case Mode::kCommaOrClose: {
      Frame& f = stack_[depth_ - 1];
      const JsonSchema::Node& node = schema_->node(f.node);
      if (f.array) {  // f.seen: the items so far
        if (c == ',') {
          if (f.seen >= node.max_items) return false;
          ++f.seen;
          mode_ = Mode::kValue;
          pending_node_ = node.items;
          return true;
        }
        if (c == ']') {
          if (f.seen < node.min_items) return false;
          --depth_;
          return value_done();
        }
        return false;
      }
      if (c == ',') {
        uint64_t all = node.keys.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << node.keys.size()) - 1;
        for (size_t k = 0; k < node.key_branches.size(); ++k) {  // the live branches' keys
          if (!(node.key_branches[k] & f.live)) all &= ~(uint64_t{1} << k);
        }
        if ((f.seen & all) == all) return false;  // no property left to give
        mode_ = Mode::kKey;
        return true;
      }
      if (c == '}') {
        if (!may_close(f, node)) return false;
        --depth_;
        return value_done();
      }
      return false;
    }
    default: return false;
  }
}

bool SchemaPrefix::may_close(const Frame& f, const JsonSchema::Node& node) const {
  if (node.branch_required.empty()) return (f.seen & node.required) == node.required;
  for (size_t b = 0; b < node.branch_required.size(); ++b) {
    if ((f.live >> b & 1) && (f.seen & node.branch_required[b]) == node.branch_required[b]) return true;
  }
  return false;
}

bool SchemaPrefix::narrow(Frame& f, uint8_t type) {
  if (f.array) return true;
  const JsonSchema::Node& node = schema_->node(f.node);
  if (node.key_type_branches.empty()) return true;
  const uint16_t allow = node.key_type_branches[f.key][static_cast<size_t>(std::countr_zero(type))];
  if (!(allow & f.live)) return false;
  f.live &= allow;
  return true;
}

bool SchemaPrefix::number_byte(unsigned char c) {
  const std::vector<JsonSchema::NumericRange>& ranges = numeric_->numeric;
  if (c == '.') {
    if (fraction_) return false;
    for (size_t r = 0; r < ranges.size(); ++r) {
      if (ranges[r].scale == 0) live_ranges_ &= static_cast<uint8_t>(~(1u << r));  // no fraction digits there
    }
    fraction_ = true;
    return number_reachable();
  }
  const int d = c - '0';
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (!(live_ranges_ >> r & 1)) continue;
    if (fraction_ && fraction_digits_ >= ranges[r].scale) {  // a fraction digit past the range's places
      live_ranges_ &= static_cast<uint8_t>(~(1u << r));
      continue;
    }
    remainders_[r] = static_cast<int64_t>((static_cast<i128>(remainders_[r]) * 10 + d) % ranges[r].multiple);
  }
  magnitude_ = std::min(kNoBound, magnitude_ * 10 + d);
  if (fraction_) ++fraction_digits_;
  else if (digits_ < UINT32_MAX) ++digits_;
  return number_reachable();
}

bool SchemaPrefix::number_reachable() {
  for (size_t r = 0; r < numeric_->numeric.size(); ++r) {
    if ((live_ranges_ >> r & 1) && !range_reachable(r)) live_ranges_ &= static_cast<uint8_t>(~(1u << r));
  }
  return live_ranges_ != 0;
}

bool SchemaPrefix::number_complete() const {
  if (digits_ == 0 || (fraction_ && fraction_digits_ == 0)) return false;
  for (size_t r = 0; r < numeric_->numeric.size(); ++r) {
    if ((live_ranges_ >> r & 1) && number_reaches(r, numeric_->numeric[r].scale - static_cast<int>(fraction_digits_), false)) {
      return true;
    }
  }
  return false;
}

bool SchemaPrefix::range_reachable(size_t r) const {
  const JsonSchema::NumericRange& n = numeric_->numeric[r];
  const int scale = n.scale;
  // In the fraction: the digits still to come fill the last scale - f places of N.
  if (fraction_) return number_reaches(r, scale - static_cast<int>(fraction_digits_), true);
  // In the integer part: e more integer digits (then any fraction) put N in [M * 10^(e+scale), (M+1) * 10^(e+scale));
  // a leading 0 takes no more digits, a lone '-' at least one.
  const bool grows = !(digits_ == 1 && magnitude_ == 0);
  const i128 hi_m = negative_ ? -n.min_scaled : n.max_scaled;  // the magnitude's bound
  for (int e = digits_ > 0 ? 0 : 1; e <= 40; ++e) {
    if (e > 0 && !grows) break;
    if (number_reaches(r, scale + e, true)) return true;
    if (magnitude_ > 0 && hi_m < kNoBound && magnitude_ * pow10_saturating(scale + e) > hi_m) break;  // only larger
  }
  return false;
}

bool SchemaPrefix::number_reaches(size_t r, int j, bool range) const {
  const JsonSchema::NumericRange& n = numeric_->numeric[r];
  const i128 m = n.multiple;
  const i128 width = range ? pow10_saturating(j) : 1;  // kNoBound: wider than every bound
  const i128 p = pow10_saturating(j);
  const i128 low = magnitude_ == 0 ? 0 : (magnitude_ >= kNoBound || p >= kNoBound || magnitude_ > kNoBound / p) ? kNoBound : std::min(kNoBound, magnitude_ * p);
  // The bounds on the magnitude for this sign; magnitudes past kNoBound are allowed when that side has no bound.
  const i128 lo_m = std::max<i128>(0, negative_ ? -n.max_scaled : n.min_scaled);
  const i128 hi_m = negative_ ? -n.min_scaled : n.max_scaled;
  const bool beyond = hi_m >= kNoBound;
  if (low < kNoBound) {
    const i128 high = width >= kNoBound ? kNoBound : low + width - 1;  // exact: both below 10^37
    if (has_multiple(std::max(low, lo_m), std::min({high, hi_m, kNoBound - 1}), m)) return true;
    if (!beyond || high < kNoBound) return false;
    return width >= kNoBound || has_multiple(kNoBound, high, m);
  }
  // Past every bound, only the remainder tells: the magnitudes begin at digits * 10^j, whose remainder is known.
  if (!beyond) return false;
  if (width >= m) return true;
  i128 rem = remainders_[r];
  for (int i = 0; i < j; ++i) rem = rem * 10 % m;
  return (m - rem) % m < width;
}

bool SchemaPrefix::feed(unsigned char c) { return feed_byte_restoring(*this, c); }

bool SchemaPrefix::feed(std::string_view bytes) { return feed_bytes(*this, bytes); }

template class AutomatonConstraint<SchemaPrefix>;

bool CallShape::literal_byte(const std::string& literal, unsigned char c, Part next) {
  if (offset_ >= literal.size() || static_cast<unsigned char>(literal[offset_]) != c) return false;
  if (++offset_ == literal.size()) {
    part_ = next;
    offset_ = 0;
  }
  return true;
}

bool CallShape::step(unsigned char c) {
  switch (part_) {
    case Part::kName: {
      if (lo_ >= hi_) return false;
      // The name so far is names[lo_, hi_)'s common prefix of length offset_ (names sorted); the closing quote,
      // the first byte of after_name, may come once one of them is complete.
      if (c == static_cast<unsigned char>(spec_->after_name[0]) && spec_->names[lo_].size() == offset_) {
        arguments_ = SchemaPrefix(spec_->arguments[lo_].get());
        part_ = Part::kAfterName;
        offset_ = 1;
        if (spec_->after_name.size() == 1) {
          part_ = Part::kArguments;
          offset_ = 0;
        }
        return true;
      }
      const auto& names = spec_->names;
      auto byte_at = [&](uint32_t i) { return names[i].size() > offset_ ? static_cast<int>(static_cast<unsigned char>(names[i][offset_])) : -1; };
      uint32_t lo = lo_, hi = hi_;
      while (lo < hi && byte_at(lo) < static_cast<int>(c)) ++lo;
      uint32_t end = lo;
      while (end < hi && byte_at(end) == static_cast<int>(c)) ++end;
      if (lo == end) return false;
      lo_ = lo;
      hi_ = end;
      ++offset_;
      return true;
    }
    case Part::kAfterName: return literal_byte(spec_->after_name, c, Part::kArguments);
    case Part::kArguments:
      if (!arguments_.feed(c)) return false;
      if (arguments_.complete()) part_ = spec_->close.empty() ? Part::kDone : Part::kClose;
      return true;
    case Part::kClose: return literal_byte(spec_->close, c, Part::kDone);
    case Part::kDone: return false;
  }
  return false;
}

bool CallShape::feed(unsigned char c) { return feed_byte_restoring(*this, c); }

bool CallShape::feed(std::string_view bytes) { return feed_bytes(*this, bytes); }

CallShape::CallShape(const CallShapeSpec* spec) : spec_(spec) {
  hi_ = static_cast<uint32_t>(spec->names.size());
  part_ = spec->starts_at_arguments ? Part::kArguments : Part::kName;
  if (spec->starts_at_arguments && !spec->arguments.empty()) arguments_ = SchemaPrefix(spec->arguments[0].get());
}

CallShapeConstraint::CallShapeConstraint(std::shared_ptr<const JsonTokenTable> table, CallShapeSpec spec,
                                         std::vector<int32_t> end_ids)
    : AutomatonConstraint(std::move(table), std::move(end_ids), CallShape()),
      spec_(std::make_unique<CallShapeSpec>(std::move(spec))) {
  std::vector<size_t> order(spec_->names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spec_->names[a] < spec_->names[b]; });
  CallShapeSpec sorted = *spec_;
  sorted.arguments.assign(spec_->names.size(), nullptr);
  for (size_t i = 0; i < order.size(); ++i) {
    sorted.names[i] = spec_->names[order[i]];
    sorted.arguments[i] = order[i] < spec_->arguments.size() && spec_->arguments[order[i]] ? spec_->arguments[order[i]]
                                                                                          : JsonSchema::any_object();
  }
  *spec_ = std::move(sorted);
  state_ = CallShape(spec_.get());
}

template class AutomatonConstraint<CallShape>;

}  // namespace petrel
