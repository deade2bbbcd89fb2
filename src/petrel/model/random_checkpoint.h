// Random-weight Hugging Face checkpoints with the exact shapes and config.json keys of the models people
// deploy, for benchmarks and scale tests (speed does not depend on the weight values). Written tensor by
// tensor in bounded memory, sharded like save_pretrained, into a temporary directory renamed at the end.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel {

// Names of the built-in presets ("llama-3.1-8b", "llama-3.2-1b", ...).
std::vector<std::string> random_checkpoint_presets();
// The preset's config.json, as the real model ships it.
Result<nlohmann::ordered_json> random_checkpoint_preset_config(const std::string& preset);

struct RandomCheckpointOptions {
  std::string preset = "llama-3.1-8b";
  std::optional<int64_t> num_layers;  // shrink (or grow) the layer count
  uint64_t seed = 0;
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default "5GB"
  std::optional<std::filesystem::path> tokenizer_dir;  // tokenizer files to copy alongside, if given
  bool overwrite = false;
  // Keys merged into the preset's config.json (e.g. {"hidden_size": 256} for a small test model).
  nlohmann::ordered_json config_overrides = nlohmann::ordered_json::object();
};

// progress(bytes_done, bytes_total) is called as data is written.
Status write_random_checkpoint(const std::filesystem::path& out_dir, const RandomCheckpointOptions& options,
                               const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace petrel
