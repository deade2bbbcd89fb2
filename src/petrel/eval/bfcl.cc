#include "petrel/eval/bfcl.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <unordered_map>

#include "petrel/text/utf8.h"

namespace petrel::eval {

namespace {

using ojson = nlohmann::ordered_json;

// ---- Python's view of JSON values ----

enum class PyType { kNone, kBool, kInt, kFloat, kStr, kList, kDict };

PyType py_type(const ojson& v) {
  if (v.is_boolean()) return PyType::kBool;
  if (v.is_number_integer()) return PyType::kInt;  // signed and unsigned
  if (v.is_number_float()) return PyType::kFloat;
  if (v.is_string()) return PyType::kStr;
  if (v.is_array()) return PyType::kList;
  if (v.is_object()) return PyType::kDict;
  return PyType::kNone;
}

const char* py_type_name(PyType t) {
  switch (t) {
    case PyType::kNone: return "NoneType";
    case PyType::kBool: return "bool";
    case PyType::kInt: return "int";
    case PyType::kFloat: return "float";
    case PyType::kStr: return "str";
    case PyType::kList: return "list";
    case PyType::kDict: return "dict";
  }
  return "?";
}

bool is_numeric(const ojson& v) { return v.is_boolean() || v.is_number(); }
double as_double(const ojson& v) { return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(); }

// Python's ==: bools, ints and floats compare as numbers; lists element by element; dicts by key set and values.
bool py_eq(const ojson& a, const ojson& b) {
  if (is_numeric(a) && is_numeric(b)) {
    if (a.is_number_integer() && b.is_number_integer()) {
      if (a.is_number_unsigned() != b.is_number_unsigned()) {  // one may exceed int64: compare signs first
        const ojson& u = a.is_number_unsigned() ? a : b;
        const ojson& i = a.is_number_unsigned() ? b : a;
        return i.get<int64_t>() >= 0 && static_cast<uint64_t>(i.get<int64_t>()) == u.get<uint64_t>();
      }
      return a.is_number_unsigned() ? a.get<uint64_t>() == b.get<uint64_t>() : a.get<int64_t>() == b.get<int64_t>();
    }
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_string()) return a.get_ref<const std::string&>() == b.get_ref<const std::string&>();
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!py_eq(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto other = b.find(it.key());
      if (other == b.end() || !py_eq(it.value(), *other)) return false;
    }
    return true;
  }
  return a.is_null() && b.is_null();
}

// `value in values` (values: a JSON array; a string "" stands for Python's "" in a list too).
bool py_in(const ojson& value, const ojson& values) {
  if (!values.is_array()) return false;
  for (const ojson& v : values) {
    if (py_eq(value, v)) return true;
  }
  return false;
}

bool is_empty_string(const ojson& v) { return v.is_string() && v.get_ref<const std::string&>().empty(); }

std::optional<PyType> schema_py_type(const std::string& name) {
  if (name == "string" || name == "any") return PyType::kStr;
  if (name == "integer") return PyType::kInt;
  if (name == "float") return PyType::kFloat;
  if (name == "boolean") return PyType::kBool;
  if (name == "array" || name == "tuple") return PyType::kList;
  if (name == "dict") return PyType::kDict;
  return std::nullopt;
}

// get_possible_answer_type: the type of the first acceptable value that is not "".
std::optional<PyType> possible_answer_type(const ojson& possible) {
  if (!possible.is_array()) return std::nullopt;
  for (const ojson& v : possible) {
    if (!is_empty_string(v)) return py_type(v);
  }
  return std::nullopt;
}

AstVerdict invalid(std::string type, std::string message) {
  AstVerdict v;
  v.error_type = std::move(type);
  v.error = std::move(message);
  return v;
}

AstVerdict valid() {
  AstVerdict v;
  v.valid = true;
  return v;
}

struct TypeCheck {
  bool valid = true;
  bool is_variable = false;
  std::string error_type, error;
};

// type_checker (one level of nesting, as BFCL's).
TypeCheck type_check(const std::string& param, const ojson& value, const ojson& possible, PyType expected,
                     std::optional<PyType> nested) {
  TypeCheck r;
  const std::optional<PyType> answer_type = possible_answer_type(possible);
  const bool is_variable = answer_type && *answer_type != expected;
  if (py_type(value) == expected) {
    if (!nested) {
      r.is_variable = is_variable;
      return r;
    }
    for (const ojson& item : possible.is_array() ? possible : ojson::array()) {
      bool flag = true;
      if (item.is_array()) {
        for (const ojson& value_item : value) {
          if (!type_check(param, value_item, item, *nested, std::nullopt).valid) {
            flag = false;
            break;
          }
        }
      }
      if (flag) {
        r.is_variable = is_variable;
        return r;
      }
    }
    // BFCL falls through to its variable check with the result already invalid: invalid either way, reported as
    // nested when the value has the answer's type and as simple otherwise.
    r.valid = false;
    r.error_type = answer_type == py_type(value) ? "type_error:nested" : "type_error:simple";
    r.error = "nested type check failed for parameter '" + param + "'";
    return r;
  }
  if (answer_type && py_type(value) == *answer_type) {
    r.is_variable = true;
    return r;
  }
  r.valid = false;
  r.error_type = "type_error:simple";
  r.error = "incorrect type for parameter '" + param + "': expected " + py_type_name(expected) + ", got " +
            py_type_name(py_type(value));
  return r;
}

// A value as BFCL compares it: strings standardised, anything else as it is.
ojson standardized(const ojson& v) { return v.is_string() ? ojson(bfcl_standardize(v.get<std::string>())) : v; }

AstVerdict string_check(const std::string& param, const ojson& value, const ojson& possible) {
  const std::string mine = bfcl_standardize(value.get<std::string>());
  for (const ojson& p : possible) {
    if (p.is_string() && bfcl_standardize(p.get<std::string>()) == mine) return valid();
  }
  return invalid("value_error:string", "invalid value for parameter '" + param + "': " + value.dump());
}

AstVerdict list_check(const std::string& param, const ojson& value, const ojson& possible) {
  ojson mine = ojson::array();
  for (const ojson& v : value) mine.push_back(standardized(v));
  for (const ojson& p : possible) {
    ojson theirs = ojson::array();  // BFCL iterates each answer: a list's items, a string's characters ("" -> [])
    if (p.is_array()) {
      for (const ojson& v : p) theirs.push_back(standardized(v));
    } else if (p.is_string()) {
      for (char c : p.get<std::string>()) theirs.push_back(bfcl_standardize(std::string_view(&c, 1)));
    } else {
      continue;
    }
    if (py_eq(mine, theirs)) return valid();
  }
  return invalid("value_error:list/tuple", "invalid value for parameter '" + param + "': " + value.dump());
}

AstVerdict dict_check(const std::string& param, const ojson& value, const ojson& possible) {
  AstVerdict result = invalid("dict_checker:unclear", "no acceptable dict for parameter '" + param + "'");
  for (const ojson& answer : possible) {
    if (is_empty_string(answer)) continue;
    result = invalid("dict_checker:unclear", "no acceptable dict for parameter '" + param + "'");
    if (!answer.is_object()) continue;
    bool flag = true;
    if (value.is_object()) {
      for (auto it = value.begin(); it != value.end(); ++it) {
        auto acceptable = answer.find(it.key());
        if (acceptable == answer.end()) {
          result = invalid("value_error:dict_key", "unexpected dict key '" + it.key() + "'");
          flag = false;
          break;
        }
        ojson standard = ojson::array();
        for (const ojson& a : acceptable->is_array() ? *acceptable : ojson::array()) standard.push_back(standardized(a));
        if (!py_in(standardized(it.value()), standard)) {
          result = invalid("value_error:dict_value", "invalid value for dict key '" + it.key() + "': " + it.value().dump());
          flag = false;
          break;
        }
      }
    }
    for (auto it = answer.begin(); it != answer.end(); ++it) {  // BFCL runs this even after a failure above
      const bool optional = it.value().is_array() && std::any_of(it.value().begin(), it.value().end(), is_empty_string);
      if (!(value.is_object() && value.contains(it.key())) && !optional) {
        result = invalid("value_error:dict_key", "missing dict key '" + it.key() + "'");
        flag = false;
        break;
      }
    }
    if (flag) return valid();
  }
  return result;
}

AstVerdict list_dict_check(const std::string& param, const ojson& value, const ojson& possible) {
  AstVerdict result = invalid("list_dict_checker:unclear", "no acceptable list of dicts for parameter '" + param + "'");
  for (const ojson& answer : possible) {
    const size_t answer_size = answer.is_array() ? answer.size() : (answer.is_string() ? answer.get<std::string>().size() : 0);
    if (value.size() != answer_size) {
      result = invalid("value_error:list_dict_count", "wrong number of dicts for parameter '" + param + "'");
      continue;
    }
    bool flag = true;
    for (size_t i = 0; i < value.size(); ++i) {
      result = dict_check(param, value[i], ojson::array({answer[i]}));
      if (!result.valid) {
        flag = false;
        break;
      }
    }
    if (flag) return valid();
  }
  return result;
}

std::string underscored(std::string name) {
  for (char& c : name) {
    if (c == '.') c = '_';
  }
  return name;
}

const ojson* find_function(const ojson& functions, const std::string& name) {
  for (const ojson& f : functions) {
    if (f.value("name", "") == name) return &f;
  }
  return nullptr;
}

// simple_function_checker. `call`: {name: {arg: value}}; `answer`: {name: {arg: [acceptable]}}.
AstVerdict simple_check(const ojson* function, const ojson& call, const ojson& answer) {
  if (!function) return invalid("simple_function_checker:unclear", "the expected function is not among the entry's functions");
  if (!answer.is_object() || answer.empty()) return invalid("simple_function_checker:unclear", "malformed ground truth");
  const ojson& possible = answer.begin().value();
  const std::string func_name = underscored(function->value("name", ""));
  if (!call.is_object() || !call.contains(func_name)) {
    return invalid("simple_function_checker:wrong_func_name", "function '" + func_name + "' not found in the model's output");
  }
  const ojson& params = call[func_name];
  if (!params.is_object()) return invalid("simple_function_checker:unclear", "the arguments are not an object");
  const ojson& schema = function->contains("parameters") ? (*function)["parameters"] : ojson::object();
  const ojson properties = schema.value("properties", ojson::object());
  for (const ojson& required : schema.value("required", ojson::array())) {
    if (required.is_string() && !params.contains(required.get<std::string>())) {
      return invalid("simple_function_checker:missing_required", "missing required parameter '" + required.get<std::string>() + "'");
    }
  }
  for (auto it = params.begin(); it != params.end(); ++it) {
    const std::string& param = it.key();
    if (!properties.contains(param) || !possible.contains(param)) {
      return invalid("simple_function_checker:unexpected_param", "unexpected parameter '" + param + "'");
    }
    const std::string type_name = properties[param].value("type", "");
    const std::optional<PyType> expected = schema_py_type(type_name);
    if (!expected) return invalid("simple_function_checker:unclear", "unknown schema type '" + type_name + "'");
    std::optional<PyType> nested;
    if (type_name == "array" || type_name == "tuple") {
      const std::string item_type = properties[param].contains("items") ? properties[param]["items"].value("type", "") : "";
      nested = schema_py_type(item_type);
      if (!nested) return invalid("simple_function_checker:unclear", "unknown item type '" + item_type + "'");
    }
    ojson value = it.value();
    if (type_name == "float" && value.is_number_integer()) value = static_cast<double>(value.get<int64_t>());
    const ojson& acceptable = possible[param];
    const TypeCheck tc = type_check(param, value, acceptable, *expected, nested);
    if (!tc.valid) return invalid(tc.error_type, tc.error);
    if (!tc.is_variable) {
      AstVerdict r;
      bool special = true;
      if (*expected == PyType::kDict) r = dict_check(param, value, acceptable);
      else if (*expected == PyType::kList && nested == PyType::kDict) r = list_dict_check(param, value, acceptable);
      else if (*expected == PyType::kStr) r = string_check(param, value, acceptable);
      else if (*expected == PyType::kList) r = list_check(param, value, acceptable);
      else special = false;
      if (special) {
        if (!r.valid) return r;
        continue;
      }
    }
    if (!py_in(value, acceptable)) {
      return invalid("value_error:others", "invalid value for parameter '" + param + "': " + value.dump());
    }
  }
  for (auto it = possible.begin(); it != possible.end(); ++it) {
    if (!params.contains(it.key()) && !std::any_of(it.value().begin(), it.value().end(), is_empty_string)) {
      return invalid("simple_function_checker:missing_optional", "optional parameter '" + it.key() + "' not provided");
    }
  }
  return valid();
}

}  // namespace

namespace {

// Python's str.lower() for the scripts BFCL's data uses: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
// capitals (other code points are kept as they are).
uint32_t lower_code_point(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x100 && c <= 0x137 && c % 2 == 0) return c + 1;
  if (c >= 0x139 && c <= 0x148 && c % 2 == 1) return c + 1;
  if (c >= 0x14A && c <= 0x177 && c % 2 == 0) return c + 1;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E && c % 2 == 1) return c + 1;
  if ((c >= 0x391 && c <= 0x3A9 && c != 0x3A2)) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

}  // namespace

std::string bfcl_standardize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) < 0x80) {
      ++i;
      switch (c) {
        case ' ': case ',': case '.': case '/': case '-': case '_': case '*': case '^': continue;
        case '\'': out += '"'; continue;
        default: out += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
      }
      continue;
    }
    const size_t start = i;
    const std::string_view rest = text.substr(i);
    if (utf8::find_invalid(rest.substr(0, std::min<size_t>(4, rest.size()))).value_or(4) == 0) {
      out += c;  // not UTF-8: kept as a byte
      ++i;
      continue;
    }
    const uint32_t code_point = utf8::decode_valid(text, i);
    if (i == start) ++i;
    utf8::append_code_point(lower_code_point(code_point), out);
  }
  return out;
}

AstVerdict check_ast(const ojson& functions, const ojson& output, const ojson& ground_truth, const std::string& category) {
  if (!output.is_array() || !ground_truth.is_array()) return invalid("ast_decoder:decoder_wrong_output_format", "not a list of calls");
  const bool parallel = category.find("parallel") != std::string::npos;
  const bool multiple = !parallel && category.find("multiple") != std::string::npos;
  const char* checker = parallel ? "parallel_function_checker_no_order" : multiple ? "multiple_function_checker" : "simple_function_checker";
  if (output.size() != ground_truth.size() || (!parallel && !multiple && output.size() != 1)) {
    return invalid(std::string(checker) + ":wrong_count", "wrong number of functions");
  }
  auto function_for = [&](const ojson& answer) -> const ojson* {
    if (!answer.is_object() || answer.empty()) return nullptr;
    return find_function(functions, answer.begin().key());
  };
  if (!parallel) {
    const ojson* function = multiple ? function_for(ground_truth[0]) : (functions.empty() ? nullptr : &functions[0]);
    return simple_check(function, output[0], ground_truth[0]);
  }
  std::vector<bool> matched(output.size(), false);
  for (size_t i = 0; i < ground_truth.size(); ++i) {
    const ojson* function = function_for(ground_truth[i]);
    bool found = false;
    for (size_t j = 0; j < output.size() && !found; ++j) {
      if (matched[j]) continue;
      if (simple_check(function, output[j], ground_truth[i]).valid) {
        matched[j] = true;
        found = true;
      }
    }
    if (!found) {
      return invalid("parallel_function_checker_no_order:cannot_find_match",
                     "no call in the output matches expected call " + std::to_string(i));
    }
  }
  return valid();
}

namespace {

// A BFCL parameter schema with JSON Schema's type names, recursively through properties and items.
ojson json_schema_of(const ojson& schema) {
  if (!schema.is_object()) return schema;
  ojson out = ojson::object();
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    if (it.key() == "type" && it.value().is_string()) {
      const std::string t = it.value().get<std::string>();
      out["type"] = t == "dict" ? "object" : t == "float" ? "number" : t == "tuple" ? "array" : t == "any" ? "string" : t;
    } else if (it.key() == "properties" && it.value().is_object()) {
      ojson props = ojson::object();
      for (auto p = it.value().begin(); p != it.value().end(); ++p) props[p.key()] = json_schema_of(p.value());
      out["properties"] = std::move(props);
    } else if (it.key() == "items") {
      out["items"] = json_schema_of(it.value());
    } else {
      out[it.key()] = it.value();
    }
  }
  return out;
}

}  // namespace

ojson bfcl_tool_from_function(const ojson& function) {
  ojson f = function;
  f["name"] = underscored(function.value("name", ""));
  if (function.contains("parameters")) f["parameters"] = json_schema_of(function["parameters"]);
  return {{"type", "function"}, {"function", std::move(f)}};
}

BfclKind bfcl_kind(const std::string& category) {
  if (category.find("irrelevance") != std::string::npos) return BfclKind::kIrrelevance;
  if (category.find("relevance") != std::string::npos) return BfclKind::kRelevance;
  return BfclKind::kAst;
}

namespace {

Result<std::vector<ojson>> read_jsonl(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return not_found(path.string() + ": cannot open (expected BFCL's JSON Lines file)");
  std::vector<ojson> rows;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ojson row = ojson::parse(line, nullptr, false);
    if (row.is_discarded() || !row.is_object() || !row.contains("id") || !row["id"].is_string()) {
      return invalid_data(path.string() + ":" + std::to_string(n) + ": not a JSON object with an \"id\"");
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

Result<std::vector<BfclEntry>> load_bfcl_category(const std::filesystem::path& data_dir, const std::string& category,
                                                  int64_t limit) {
  const std::filesystem::path questions = data_dir / ("BFCL_v4_" + category + ".json");
  PETREL_ASSIGN_OR_RETURN(std::vector<ojson> rows, read_jsonl(questions));
  std::unordered_map<std::string, ojson> answers;
  if (bfcl_kind(category) == BfclKind::kAst) {
    const std::filesystem::path path = data_dir / "possible_answer" / ("BFCL_v4_" + category + ".json");
    PETREL_ASSIGN_OR_RETURN(std::vector<ojson> answer_rows, read_jsonl(path));
    for (ojson& a : answer_rows) {
      if (!a.contains("ground_truth") || !a["ground_truth"].is_array()) {
        return invalid_data(path.string() + ": entry " + a["id"].get<std::string>() + " has no ground_truth list");
      }
      answers[a["id"].get<std::string>()] = std::move(a["ground_truth"]);
    }
  }
  std::vector<BfclEntry> entries;
  for (size_t i = 0; i < rows.size() && (limit < 0 || static_cast<int64_t>(entries.size()) < limit); ++i) {
    ojson& row = rows[i];
    BfclEntry e;
    e.id = row["id"].get<std::string>();
    if (!row.contains("question") || !row["question"].is_array() || row["question"].empty() || !row["question"][0].is_array()) {
      return invalid_data(questions.string() + ": entry " + e.id + ": \"question\" is not a list of turns");
    }
    if (!row.contains("function") || !row["function"].is_array()) {
      return invalid_data(questions.string() + ": entry " + e.id + ": \"function\" is not a list");
    }
    e.messages = row["question"][0];
    e.functions = row["function"];
    if (bfcl_kind(category) == BfclKind::kAst) {
      auto it = answers.find(e.id);
      if (it == answers.end()) return invalid_data(questions.string() + ": entry " + e.id + " has no possible answer");
      e.ground_truth = it->second;
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

namespace {

BfclAnswer answer_from_response(const ojson& response) {
  BfclAnswer a;
  if (!response.is_object()) {
    a.error = "the response is not a JSON object";
    return a;
  }
  if (response.contains("error")) {
    a.error = response["error"].is_object() ? response["error"].value("message", response["error"].dump()) : response["error"].dump();
    return a;
  }
  if (!response.contains("choices") || !response["choices"].is_array() || response["choices"].empty()) {
    a.error = "the response has no choices";
    return a;
  }
  const ojson& message = response["choices"][0].value("message", ojson::object());
  if (message.contains("content") && message["content"].is_string()) a.content = message["content"].get<std::string>();
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    for (const ojson& call : message["tool_calls"]) {
      const ojson f = call.value("function", ojson::object());
      a.calls.emplace_back(f.value("name", ""), f.contains("arguments") && f["arguments"].is_string()
                                                    ? f["arguments"].get<std::string>()
                                                    : f.value("arguments", ojson::object()).dump());
    }
  }
  if (response.contains("usage") && response["usage"].is_object()) {
    a.prompt_tokens = response["usage"].value("prompt_tokens", int64_t{0});
    a.completion_tokens = response["usage"].value("completion_tokens", int64_t{0});
  }
  a.ok = true;
  return a;
}

}  // namespace

BfclAnswer bfcl_answer_from_response(const ojson& response) {
  try {
    return answer_from_response(response);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type in someone else's answer
    BfclAnswer a;
    a.error = std::string("malformed response: ") + e.what();
    return a;
  }
}

BfclEntryResult score_bfcl_answer(const BfclEntry& entry, const std::string& category, const BfclAnswer& answer) {
  BfclEntryResult r;
  r.id = entry.id;
  if (!answer.ok) {
    r.outcome = "error";
    r.error = answer.error;
    return r;
  }
  // The decoded output: [{name: arguments}] (BFCL's function-calling decode); arguments that are not a JSON
  // object make the whole output undecodable.
  ojson output = ojson::array();
  bool decodable = true;
  for (const auto& [name, arguments] : answer.calls) {
    ojson args = ojson::parse(arguments, nullptr, false);
    if (!args.is_object()) decodable = false;
    output.push_back({{name, args.is_discarded() ? ojson(arguments) : args}});
  }
  r.output = answer.calls.empty() ? ojson(answer.content) : output;
  const bool blank = answer.calls.empty() && answer.content.find_first_not_of(" \t\r\n") == std::string::npos;
  switch (bfcl_kind(category)) {
    case BfclKind::kIrrelevance:
      r.correct = answer.calls.empty() && !blank;
      break;
    case BfclKind::kRelevance:
      r.correct = !answer.calls.empty();
      break;
    case BfclKind::kAst: {
      if (answer.calls.empty()) {
        r.error_type = "ast_decoder:decoder_failed";
        r.error = "no tool call";
        break;
      }
      if (!decodable) {
        r.error_type = "ast_decoder:decoder_wrong_output_format";
        r.error = "a call's arguments are not a JSON object";
        break;
      }
      const AstVerdict v = check_ast(entry.functions, output, entry.ground_truth, category);
      r.correct = v.valid;
      r.error_type = v.error_type;
      r.error = v.error;
      break;
    }
  }
  r.outcome = r.correct ? "correct" : blank ? "empty" : "wrong";
  return r;
}

BfclCategoryResult run_bfcl_category(const std::string& category, const std::vector<BfclEntry>& entries, const BfclAsk& ask,
                                     const BfclOptions& options, const std::function<void(int64_t, int64_t)>& progress) {
  BfclCategoryResult result;
  result.category = category;
  const auto start = std::chrono::steady_clock::now();
  for (const BfclEntry& entry : entries) {
    ojson tools = ojson::array();
    try {
      for (const ojson& f : entry.functions) tools.push_back(bfcl_tool_from_function(f));
    } catch (const nlohmann::json::exception&) {
      tools = entry.functions;  // sent as they are; the server will say what is wrong with them
    }
    ojson request = {{"model", options.model_name}, {"messages", entry.messages}, {"tools", tools},
                     {"max_tokens", options.max_tokens}};
    if (options.temperature) request["temperature"] = *options.temperature;
    if (options.extra_request.is_object()) {
      for (auto it = options.extra_request.begin(); it != options.extra_request.end(); ++it) request[it.key()] = it.value();
    }
    const BfclAnswer answer = ask(request);
    BfclEntryResult scored;
    try {
      scored = score_bfcl_answer(entry, category, answer);
    } catch (const nlohmann::json::exception& e) {  // a schema or ground truth of an unexpected shape
      scored.id = entry.id;
      scored.outcome = "error";
      scored.error = std::string("malformed entry: ") + e.what();
    }
    ++result.total;
    result.correct += scored.correct;
    result.empty += scored.outcome == "empty";
    result.errors += scored.outcome == "error";
    result.prompt_tokens += answer.prompt_tokens;
    result.completion_tokens += answer.completion_tokens;
    result.entries.push_back(std::move(scored));
    if (progress) progress(result.total, static_cast<int64_t>(entries.size()));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

ojson bfcl_report_json(const std::vector<BfclCategoryResult>& results, const ojson& meta) {
  ojson categories = ojson::array();
  int64_t total = 0, correct = 0;
  double accuracy_sum = 0;
  for (const BfclCategoryResult& r : results) {
    ojson entries = ojson::array();
    for (const BfclEntryResult& e : r.entries) {
      entries.push_back({{"id", e.id}, {"outcome", e.outcome}, {"error_type", e.error_type}, {"error", e.error}, {"output", e.output}});
    }
    categories.push_back({{"category", r.category}, {"total", r.total}, {"correct", r.correct}, {"accuracy", r.accuracy()},
                          {"empty", r.empty}, {"errors", r.errors}, {"seconds", r.seconds},
                          {"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.completion_tokens}, {"entries", entries}});
    total += r.total;
    correct += r.correct;
    accuracy_sum += r.accuracy();
  }
  return {{"meta", meta},
          {"summary", {{"entries", total}, {"correct", correct},
                       {"accuracy_overall", total ? static_cast<double>(correct) / total : 0.0},
                       {"accuracy_mean_of_categories", results.empty() ? 0.0 : accuracy_sum / results.size()}}},
          {"categories", categories}};
}

}  // namespace petrel::eval
