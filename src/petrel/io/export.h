// `petrel export`: a (quantized) checkpoint to a self-contained bundle (docs/BUNDLE_FORMAT.md):
//   config.json        Genie's dialog schema, with petrel's section (architecture, manifest path)
//   part_K_of_N.bin    decoder layers split into N parts of balanced bytes; the embedding in the first part,
//                      the final norm and LM head in the last; 64-byte aligned, checksummed
//   model_config.json  the checkpoint's own config.json (quantization_config included)
//   tokenizer.json, tokenizer_config.json (chat template)
//   manifest.json      petrel version, source fingerprint, recipe, validation summary, parts and checksums
// Written into a temporary directory and renamed into place when complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "petrel/io/bundle_config.h"
#include "petrel/util/status.h"

namespace petrel {

struct ExportOptions {
  int64_t context_length = 4096;
  int parts = 5;
  BundleBackend backend = BundleBackend::kCpu;
  bool force = false;  // export even without a passing validation.json, and replace an existing bundle
  bool show_progress = true;
  // Called after each part is complete (1-based index); tests use it to stop an export part-way.
  std::function<void(int part)> on_part_written;
};

struct ExportReport {
  uint64_t total_bytes = 0;
  std::vector<uint64_t> part_bytes;
  double seconds = 0;
};

Status export_bundle(const std::filesystem::path& checkpoint, const std::filesystem::path& out,
                     const ExportOptions& options, ExportReport* report = nullptr);

// Splits item sizes into `parts` contiguous groups minimising the largest group; returns each group's
// first item index. Fails when there are fewer items than parts.
Result<std::vector<size_t>> balance_parts(const std::vector<uint64_t>& item_bytes, int parts);

}  // namespace petrel
