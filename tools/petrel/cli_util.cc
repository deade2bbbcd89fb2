#include "cli_util.h"

#include <cctype>
#include <charconv>

namespace petrel::cli {

Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != ',') ++j;
    int32_t value = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, value);
    if (ec != std::errc() || end != text.data() + j || value < 0) {
      return invalid_argument(what + ": '" + text.substr(i, j - i) + "' at offset " + std::to_string(i) +
                              " is not a token id (a non-negative integer)");
    }
    ids.push_back(value);
    i = j;
  }
  return ids;
}

}  // namespace petrel::cli
