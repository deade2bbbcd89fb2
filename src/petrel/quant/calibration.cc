#include "petrel/quant/calibration.h"

#include <random>

#include "petrel/util/file.h"

namespace petrel::quant {

Result<std::string> read_text_fraction(const std::filesystem::path& path, double fraction, bool head) {
  if (fraction <= 0 || fraction > 1) return invalid_argument("text fraction must be in (0, 1], got " + std::to_string(fraction));
  PETREL_ASSIGN_OR_RETURN(std::string raw, read_text_file(path));
  // Universal newlines, as Python's open() reads text: \r\n and \r become \n.
  std::string text;
  text.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      text += '\n';
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      text += raw[i];
    }
  }
  if (fraction >= 1) return head ? text : std::string();
  // Cut at code point floor(n * fraction), as Python's text[int(len(text) * fraction):] does.
  size_t code_points = 0;
  for (unsigned char ch : text) code_points += (ch & 0xC0) != 0x80;
  const size_t target = static_cast<size_t>(static_cast<double>(code_points) * fraction);
  size_t seen = 0, cut = text.size();
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      if (seen == target) {
        cut = i;
        break;
      }
      ++seen;
    }
  }
  return head ? text.substr(0, cut) : text.substr(cut);
}

Result<std::vector<std::vector<int32_t>>> load_calibration_samples(const Tokenizer& tokenizer,
                                                                   const CalibrationOptions& options) {
  if (options.files.empty()) return invalid_argument("calibration: no text files given");
  if (options.num_samples <= 0 || options.seq_len < 2) {
    return invalid_argument("calibration: need at least one sample of at least 2 tokens");
  }
  std::vector<int32_t> tokens;
  for (const auto& file : options.files) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_fraction(file, options.fraction, /*head=*/true));
    auto ids = tokenizer.encode(text, EncodeOptions{.add_special = false, .parse_special = false, .untrusted_ranges = {}});
    if (!ids.ok()) return ids.status().with_context(file.string());
    tokens.insert(tokens.end(), ids->begin(), ids->end());
  }
  const std::optional<int32_t> bos = tokenizer.bos_id();
  const int64_t body = options.seq_len - (bos ? 1 : 0);
  if (static_cast<int64_t>(tokens.size()) < body + 1) {
    return invalid_argument("calibration: the text has " + std::to_string(tokens.size()) + " tokens, fewer than one " +
                            std::to_string(options.seq_len) + "-token sample");
  }
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<int64_t> offset(0, static_cast<int64_t>(tokens.size()) - body);
  std::vector<std::vector<int32_t>> samples;
  for (int64_t s = 0; s < options.num_samples; ++s) {
    const int64_t start = offset(rng);
    std::vector<int32_t> sample;
    if (bos) sample.push_back(*bos);
    sample.insert(sample.end(), tokens.begin() + start, tokens.begin() + start + body);
    samples.push_back(std::move(sample));
  }
  return samples;
}

}  // namespace petrel::quant
