// Errors as values. Library code returns Status or Result<T>; only the CLI turns them into exit codes.
// Messages name the file, the tensor or key, what was expected and what was found.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace petrel {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something unusable (flags, shapes)
  kNotFound,         // a file, tensor or key is missing
  kInvalidData,      // a file exists but its contents are malformed or lie
  kUnsupported,      // well-formed, but petrel does not implement it
  kIo,               // the operating system refused (open, mmap, write)
  kOutOfRange,       // an index, position or size beyond a limit (e.g. the context)
  kAborted,          // stopped on request
  kInternal,         // a bug in petrel
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid data: model.safetensors: tensor 'x' ..." for logs and the CLI.
  std::string to_string() const;

  // Adds context in front of the message, e.g. the file being read.
  Status with_context(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status invalid_data(std::string m) { return {ErrorCode::kInvalidData, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIo, std::move(m)}; }
inline Status out_of_range(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
inline Status aborted(std::string m) { return {ErrorCode::kAborted, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = internal_error("Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace petrel

#define PETREL_CONCAT_INNER(a, b) a##b
#define PETREL_CONCAT(a, b) PETREL_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define PETREL_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::petrel::Status petrel_status_ = (expr);         \
    if (!petrel_status_.ok()) return petrel_status_;  \
  } while (0)

// `PETREL_ASSIGN_OR_RETURN(auto x, f());` declares x from a Result or returns its Status.
#define PETREL_ASSIGN_OR_RETURN(lhs, expr) \
  PETREL_ASSIGN_OR_RETURN_IMPL(PETREL_CONCAT(petrel_result_, __LINE__), lhs, expr)
#define PETREL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
