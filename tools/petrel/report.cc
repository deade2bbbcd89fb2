#include <cstdio>

#include "commands.h"

namespace petrel::cli {

int report_error(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "petrel %s: error: %s\n", command.c_str(), status.to_string().c_str());
  switch (status.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kOutOfRange: return 2;
    case ErrorCode::kInvalidData:
    case ErrorCode::kUnsupported: return 3;
    case ErrorCode::kIo: return 4;
    default: return 1;
  }
}

}  // namespace petrel::cli
