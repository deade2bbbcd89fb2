#include "petrel/io/tensor_source.h"

#include "petrel/io/bundle.h"

namespace petrel {

Result<TensorView> TensorSource::tensor(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  PETREL_ASSIGN_OR_RETURN(TensorView view, tensor(name));
  if (view.shape != expected_shape) {
    return invalid_data(describe() + ": tensor '" + name + "' has shape " + shape_to_string(view.shape) +
                        ", expected " + shape_to_string(expected_shape));
  }
  return view;
}

namespace {

class CheckpointSource final : public TensorSource {
 public:
  explicit CheckpointSource(SafetensorsCheckpoint ckpt) : ckpt_(std::move(ckpt)) {}
  Result<TensorView> tensor(const std::string& name) const override { return ckpt_.tensor(name); }
  bool has(const std::string& name) const override { return ckpt_.has(name); }
  std::string describe() const override { return ckpt_.dir().string(); }
  void release(const TensorView& view) const override { ckpt_.release(view); }

 private:
  SafetensorsCheckpoint ckpt_;
};

class BundleSource final : public TensorSource {
 public:
  explicit BundleSource(std::unique_ptr<Bundle> bundle) : bundle_(std::move(bundle)) {}
  Result<TensorView> tensor(const std::string& name) const override {
    PETREL_ASSIGN_OR_RETURN(const BundleTensor* t, bundle_->tensor(name));
    if (!t->is_plain()) {
      return unsupported(describe() + ": tensor '" + name + "' has layout '" + t->layout + "', where a dense array is read");
    }
    return t->view();
  }
  Result<TensorView> tensor_padded_rows(const std::string& name) const override {
    PETREL_ASSIGN_OR_RETURN(const BundleTensor* t, bundle_->tensor(name));
    Result<TensorView> view = t->padded_rows_view();
    if (!view.ok()) return view.status().with_context(describe());
    return view;
  }
  bool has(const std::string& name) const override { return bundle_->find(name) != nullptr; }
  std::string describe() const override { return bundle_->config().bundle_dir.string(); }

 private:
  std::unique_ptr<Bundle> bundle_;
};

}  // namespace

std::unique_ptr<TensorSource> make_tensor_source(SafetensorsCheckpoint checkpoint) {
  return std::make_unique<CheckpointSource>(std::move(checkpoint));
}

std::unique_ptr<TensorSource> make_tensor_source(std::unique_ptr<Bundle> bundle) {
  return std::make_unique<BundleSource>(std::move(bundle));
}

}  // namespace petrel
