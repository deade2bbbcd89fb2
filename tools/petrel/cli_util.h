// Small helpers shared by the CLI's command files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "petrel/util/status.h"

namespace petrel::cli {

// Parses "1,2,3", "1 2 3" or any mix of commas and whitespace into ids; names the bad item on error.
Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what);

}  // namespace petrel::cli
