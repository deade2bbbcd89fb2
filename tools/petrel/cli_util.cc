#include "cli_util.h"

#include "petrel/quant/calibration.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/file.h"
#include "petrel/util/parallel.h"

#include <cctype>
#include <charconv>

namespace petrel::cli {

Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[i])) || text[i] == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j])) && text[j] != ',') ++j;
    int32_t value = 0;
    auto [end, ec] = std::from_chars(text.data() + i, text.data() + j, value);
    if (ec != std::errc() || end != text.data() + j || value < 0) {
      return invalid_argument(what + ": '" + text.substr(i, j - i) + "' at offset " + std::to_string(i) +
                              " is not a token id (a non-negative integer)");
    }
    ids.push_back(value);
    i = j;
  }
  return ids;
}

Result<std::shared_ptr<Engine>> load_engine(const std::string& model, const std::string& backend, int64_t context_length,
                                            bool deterministic, int threads, bool host_masks) {
  PETREL_ASSIGN_OR_RETURN(Backend parsed, parse_backend(backend));
  ThreadPool::set_global_threads(threads);
  EngineOptions options;
  options.backend = parsed;
  options.context_length = context_length;
  options.cuda_deterministic = deterministic;
  options.cuda_host_masks = host_masks;
  return Engine::load(model, options);
}

Result<HeldOutTokens> held_out_tokens(const std::string& model_dir, const std::string& text_path, double tail,
                                      std::optional<int32_t> config_bos) {
  PETREL_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(model_dir));
  return held_out_tokens(tokenizer, text_path, tail, config_bos);
}

Result<HeldOutTokens> held_out_tokens(const Tokenizer& tokenizer, const std::string& text_path, double tail,
                                      std::optional<int32_t> config_bos) {
  const bool default_text = text_path.empty();
  const std::string path = default_text ? PETREL_DEFAULT_CORPUS : text_path;
  auto text = default_text ? quant::read_text_fraction(path, 1.0 - tail, /*head=*/false) : read_text_file(path);
  if (!text.ok()) return text.status();
  auto ids = tokenizer.encode(*text, EncodeOptions{.add_special = false, .parse_special = false, .untrusted_ranges = {}});
  if (!ids.ok()) return ids.status().with_context(path);
  const std::optional<int32_t> bos = tokenizer.bos_id() ? tokenizer.bos_id() : config_bos;
  if (!bos) return invalid_data("the tokenizer and config.json name no BOS token");
  HeldOutTokens out;
  out.bos = *bos;
  out.tokens.push_back(*bos);
  out.tokens.insert(out.tokens.end(), ids->begin(), ids->end());
  out.description = default_text ? path + " (last " + std::to_string(static_cast<int>(tail * 100 + 0.5)) + "%)" : path;
  return out;
}

}  // namespace petrel::cli
