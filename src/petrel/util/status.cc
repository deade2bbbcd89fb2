#include "petrel/util/status.h"

namespace petrel {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kInvalidData: return "invalid data";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kAborted: return "aborted";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

}  // namespace petrel
