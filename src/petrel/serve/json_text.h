// JSON as the server writes it into prompts and checks it from requests.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace petrel::serve {

// JSON as transformers' `tojson` writes it (Python's json.dumps with ensure_ascii=False: ", " and ": " separators,
// non-ASCII as it is, keys in their order): how NVIDIA's templates write tool schemas and calls, so the tags
// petrel writes for a template without tools read the same.
// Values nested deeper than 256 are written as null (requests are checked for depth first: json_depth_within).
std::string tojson_text(const nlohmann::ordered_json& value);

// Whether no array or object in `value` is nested deeper than `max_depth` (checked without recursion).
bool json_depth_within(const nlohmann::ordered_json& value, int max_depth);

}  // namespace petrel::serve
