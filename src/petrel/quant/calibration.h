// Calibration data for GPTQ: token windows drawn from text files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "petrel/text/tokenizer.h"
#include "petrel/util/status.h"

namespace petrel::quant {

struct CalibrationOptions {
  std::vector<std::filesystem::path> files;
  // Only the first `fraction` of each file (by characters) is used, so that the rest can serve
  // as held-out text: the default corpus is WikiText-2's test split, whose last 10% is validation text.
  double fraction = 0.9;
  int64_t num_samples = 128;
  int64_t seq_len = 256;  // tokens per sample, BOS included
  uint64_t seed = 0;
};

// `num_samples` windows of `seq_len` tokens at seeded random offsets of the tokenized text, each starting
// with BOS when the tokenizer has one. Fails clearly when the text is too short.
Result<std::vector<std::vector<int32_t>>> load_calibration_samples(const Tokenizer& tokenizer,
                                                                   const CalibrationOptions& options);

// Reads the first or last part of a text file, with universal newlines, cut by characters exactly as
// Python's text[:int(len(text) * fraction)] / text[int(len(text) * fraction):] (the protocol DESIGN.md's
// llama.cpp numbers use).
Result<std::string> read_text_fraction(const std::filesystem::path& path, double fraction, bool head);

}  // namespace petrel::quant
