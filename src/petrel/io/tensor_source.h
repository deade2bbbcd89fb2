// Where a model's tensors come from: a safetensors checkpoint or an exported bundle. The model binds its
// weights by name through this interface and never knows which one it has.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "petrel/io/safetensors.h"
#include "petrel/util/status.h"

namespace petrel {

class Bundle;

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor, or a not-found error naming the source and the tensor.
  virtual Result<TensorView> tensor(const std::string& name) const = 0;
  virtual bool has(const std::string& name) const = 0;
  // "checkpoint /path" or "bundle /path", for error messages.
  virtual std::string describe() const = 0;
  // Lets a tensor's pages go from RSS after it has been consumed (a no-op where meaningless).
  virtual void release(const TensorView& view) const { (void)view; }

  // Like tensor(), and also checks the shape; a mismatch names both shapes.
  Result<TensorView> tensor(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  // Like tensor(), and also hands out a 2-D tensor whose rows are padded (a CPU bundle's GPTQ qweight, layout
  // "padded_rows"), with view.row_stride set; for consumers that read such strides (ref::GptqMatrix).
  virtual Result<TensorView> tensor_padded_rows(const std::string& name) const { return tensor(name); }
};

std::unique_ptr<TensorSource> make_tensor_source(SafetensorsCheckpoint checkpoint);
std::unique_ptr<TensorSource> make_tensor_source(std::unique_ptr<Bundle> bundle);

}  // namespace petrel
