#include <cstdio>

#include "commands.h"

namespace petrel::cli {

void add_kv_type_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--kv-type", value, "KV cache element type: f16 (default), q8 (int8 + scale per position and head), "
                                      "f32 (reference numerics)")
      ->check(CLI::IsMember({"f16", "q8", "f32"}))
      ->capture_default_str();
}

void add_backend_option(CLI::App* cmd, std::string& value) {
  cmd->add_option("--backend", value,
                  "cpu or cuda (GPU 0); auto: what the bundle's config says (dialog.engine.backend.type), cpu for a "
                  "checkpoint")
      ->capture_default_str();
}

void add_deterministic_option(CLI::App* cmd, bool& value) {
  cmd->add_flag("--deterministic", value,
                "cuda: the same logits bit for bit on every run (the token generator's split-K sums in a fixed order "
                "instead of atomics; ~10% slower generation). The CPU backend always is");
}

cpu::KvType kv_type_of(const std::string& name) {
  return name == "f32" ? cpu::KvType::kF32 : name == "q8" ? cpu::KvType::kQ8 : cpu::KvType::kF16;
}

int report_error(const std::string& command, const Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "petrel %s: error: %s\n", command.c_str(), status.to_string().c_str());
  switch (status.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kOutOfRange: return 2;
    case ErrorCode::kInvalidData:
    case ErrorCode::kUnsupported: return 3;
    case ErrorCode::kIo: return 4;
    default: return 1;
  }
}

}  // namespace petrel::cli
