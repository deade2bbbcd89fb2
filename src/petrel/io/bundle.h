// A petrel bundle: a directory with config.json (bundle_config.h), part_1_of_N.bin ... (bundle_part.h),
// tokenizer.json, tokenizer_config.json and manifest.json. Bundle::open is what a runtime uses (everything
// validated, the first problem is the error); inspect_bundle is what `petrel inspect BUNDLE` uses (every
// part looked at, every problem listed, nothing stops at the first bad part). docs/BUNDLE_FORMAT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "petrel/io/bundle_config.h"
#include "petrel/io/bundle_part.h"
#include "petrel/util/status.h"

namespace petrel {

class ThreadPool;

// The Hugging Face config.json of the exported model, kept in the bundle so that the runtime parses exactly
// the config the checkpoint had (quantization_config included).
inline constexpr const char* kBundleModelConfig = "model_config.json";

// True when `path` is a bundle directory or a bundle's config.json (a config with a "dialog" object), as
// opposed to a Hugging Face checkpoint directory.
bool is_bundle_path(const std::filesystem::path& path);

class Bundle {
 public:
  // `config_json_or_dir`: BUNDLE/config.json or BUNDLE. Opens every ctx-bin in order and checks that part i
  // of the list says "part i of N" with N the list's length, and that no tensor name appears in two parts.
  static Result<Bundle> open(const std::filesystem::path& config_json_or_dir, BundleVerify verify = BundleVerify::kFull,
                             ThreadPool* pool = nullptr);

  const BundleConfig& config() const { return config_; }
  const std::vector<BundlePart>& parts() const { return parts_; }
  const BundleTensor* find(const std::string& name) const;
  // The tensor, or a not-found error naming the bundle and the tensor.
  Result<const BundleTensor*> tensor(const std::string& name) const;
  // The part holding `name`, nullptr when none does.
  const BundlePart* part_of(const std::string& name) const;
  std::vector<std::string> tensor_names() const;

 private:
  BundleConfig config_;
  std::vector<BundlePart> parts_;
  std::map<std::string, std::pair<size_t, size_t>> location_;  // name -> (part, tensor) indices
};

enum class ChecksumStatus { kOk, kMismatch, kNotChecked };
const char* checksum_status_name(ChecksumStatus status);  // "ok", "mismatch", "not checked"

struct BundlePartSummary {
  std::string name;  // as listed in ctx-bins, or the file name found in the directory
  std::filesystem::path path;
  bool exists = false;
  uint64_t file_size = 0;
  int part_index = 0;  // from the part's header; 0 when it could not be read
  int part_count = 0;
  size_t tensor_count = 0;
  std::map<std::string, size_t> layouts;  // tensors per layout ("plain", "padded_rows", ...)
  uint64_t data_bytes = 0;
  ChecksumStatus checksum = ChecksumStatus::kNotChecked;
  std::string error;  // why the part is unusable (missing, malformed, checksum mismatch, wrong position)
  bool ok() const { return error.empty(); }
};

struct BundleSummary {
  std::filesystem::path dir;
  std::optional<BundleConfig> config;
  std::string config_error;  // why config.json could not be used; the parts are then found by file name
  std::vector<BundlePartSummary> parts;
  std::vector<std::string> problems;  // every problem found, one line each (config, parts, leftovers)
  bool ok() const { return problems.empty(); }
  uint64_t total_bytes() const;
  size_t total_tensors() const;
  std::map<std::string, size_t> total_layouts() const;
};

// Looks at everything and reports all problems instead of stopping at the first. Errors only when the path is
// neither a directory nor a file. With kFull each part's data checksum is recomputed.
Result<BundleSummary> inspect_bundle(const std::filesystem::path& config_json_or_dir,
                                     BundleVerify verify = BundleVerify::kFull, ThreadPool* pool = nullptr);

}  // namespace petrel
