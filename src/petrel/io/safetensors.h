// Safetensors reading: memory-mapped and zero-copy, for one file and for sharded checkpoints
// (`model.safetensors.index.json`). The header is validated in full before any tensor is handed out:
// JSON syntax, known dtypes, every offset inside the file, byte size = dtype size x shape, no overlaps.
// Format: https://github.com/huggingface/safetensors (8-byte little-endian header length, JSON header,
// then the data region; offsets in the header are relative to the start of the data region).
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

std::string shape_to_string(const std::vector<int64_t>& shape);

// A read-only view of one stored tensor. `data` points into a memory map owned by the file or checkpoint,
// which must outlive the view.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t num_bytes = 0;
  // Elements from one row (first index) of a 2-D tensor to the next when its rows are padded (a bundle's
  // "padded_rows" layout, only from TensorSource::tensor_padded_rows); 0: dense, as safetensors always is.
  int64_t row_stride = 0;

  int64_t num_elements() const;
  int64_t dim(size_t i) const { return shape.at(i); }
  // Element i as float (F32, F16, BF16 only).
  float element(int64_t i) const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return map_.path(); }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(const std::string& name) const;
  size_t file_size() const { return map_.size(); }
  const MappedFile& map() const { return map_; }

 private:
  MappedFile map_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All safetensors of a Hugging Face checkpoint directory, single-file or sharded.
class SafetensorsCheckpoint {
 public:
  // Opens DIR/model.safetensors.index.json when present, else DIR/model.safetensors, else the only
  // *.safetensors file in DIR.
  static Result<SafetensorsCheckpoint> open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  // The tensor or a not-found error naming the checkpoint and the tensor.
  Result<TensorView> tensor(const std::string& name) const;
  // Like tensor(), and also checks the shape; a mismatch names both shapes.
  Result<TensorView> tensor(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  bool has(const std::string& name) const { return location_.count(name) > 0; }
  std::vector<std::string> tensor_names() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;
  // Lets the pages of a tensor go from RSS once it has been consumed (see MappedFile::release).
  void release(const TensorView& view) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> location_;
};

}  // namespace petrel
