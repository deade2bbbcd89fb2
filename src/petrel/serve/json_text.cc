#include "petrel/serve/json_text.h"

#include <utility>
#include <vector>

namespace petrel::serve {

namespace {

void dump(const nlohmann::ordered_json& v, std::string& out, int depth) {
  if (depth > 256) {
    out += "null";
    return;
  }
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += nlohmann::ordered_json(it.key()).dump(-1, ' ', /*ensure_ascii=*/false);
      out += ": ";
      dump(it.value(), out, depth + 1);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dump(v[i], out, depth + 1);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', /*ensure_ascii=*/false);
  }
}

}  // namespace

std::string tojson_text(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out, 0);
  return out;
}

bool json_depth_within(const nlohmann::ordered_json& value, int max_depth) {
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack{{&value, 0}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_structured()) continue;
    if (depth >= max_depth) return false;
    for (const auto& child : *v) stack.push_back({&child, depth + 1});
  }
  return true;
}

}  // namespace petrel::serve
