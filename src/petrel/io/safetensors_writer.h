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

// Writes a tensor list across shards of at most `max_shard_bytes` (save_pretrained's naming:
// model-0000K-of-0000N.safetensors plus model.safetensors.index.json, or a single model.safetensors).
// Tensors must be written whole and in the declared order; each shard is renamed into place when complete.
class ShardedSafetensorsWriter {
 public:
  static Result<std::unique_ptr<ShardedSafetensorsWriter>> create(const std::filesystem::path& dir,
                                                                  std::vector<TensorSpec> tensors,
                                                                  uint64_t max_shard_bytes);
  // Writes the next declared tensor; `name` must be that tensor's (a safety check on the caller's order).
  Status write_tensor(const std::string& name, const void* data, size_t size);
  // Checks every tensor was written and writes the index when sharded.
  Status finish();
  size_t shard_count() const { return shards_.size(); }

 private:
  ShardedSafetensorsWriter() = default;
  Status open_shard(size_t shard);

  std::filesystem::path dir_;
  std::vector<TensorSpec> tensors_;
  std::vector<std::vector<size_t>> shards_;  // tensor indices per shard
  std::vector<std::string> shard_names_;
  size_t next_tensor_ = 0;
  size_t current_shard_ = 0;
  size_t written_in_shard_ = 0;
  std::unique_ptr<SafetensorsWriter> writer_;
};

}  // namespace petrel
