// Streaming safetensors writer: the tensor list is declared up front (so the header can be written first),
// then each tensor's bytes are streamed in declaration order, in pieces of any size. Memory stays bounded
// by the caller's buffers. The file appears under its final name only on finish() (atomic rename).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "petrel/util/dtype.h"
#include "petrel/util/file.h"
#include "petrel/util/status.h"

namespace petrel {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  uint64_t num_bytes() const;
};

class SafetensorsWriter {
 public:
  static Result<std::unique_ptr<SafetensorsWriter>> create(const std::filesystem::path& path,
                                                           std::vector<TensorSpec> tensors,
                                                           const std::map<std::string, std::string>& metadata = {});
  // Appends bytes of the current tensor; moves to the next tensor when one is complete.
  Status write(const void* data, size_t size);
  // Checks that every declared byte was written, then renames the file into place.
  Status finish();

 private:
  SafetensorsWriter() = default;
  std::unique_ptr<AtomicFileWriter> file_;
  std::vector<TensorSpec> tensors_;
  uint64_t data_bytes_expected_ = 0;
  uint64_t data_bytes_written_ = 0;
};

}  // namespace petrel
