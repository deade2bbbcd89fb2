// Token sampling with Qualcomm Genie's semantics (sampler config of genie_config.json):
//   penalties (repetition, presence, frequency over the last `penalize_last_n` tokens)
//   -> top-k -> top-p -> softmax(logits / temperature) -> sample.
// Greedy (argmax, lowest id on ties) when temperature <= 0, top_k == 1 or `greedy` is set.
// top-p keeps the smallest set of most likely tokens whose probability (at temperature 1, since Genie applies
// the temperature after top-p) reaches p; at least one token always survives.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace petrel {

struct SamplerConfig {
  // Genie's sampler defaults.
  std::optional<uint64_t> seed;  // unset: seeded from the clock (Genie's seed -1)
  float temperature = 0.1f;
  int32_t top_k = 0;    // 0: off
  float top_p = 0.8f;   // 1: off
  bool greedy = false;  // force argmax
  float repetition_penalty = 1.0f;  // 1: off; > 1 discourages repeats (CTRL-style: divide positive logits)
  float presence_penalty = 0.0f;    // subtracted once from every token seen
  float frequency_penalty = 0.0f;   // subtracted per occurrence
  int32_t penalize_last_n = 64;     // how much history the penalties see; 0: all of it

  bool is_greedy() const { return greedy || temperature <= 0.0f || top_k == 1; }
  static SamplerConfig greedy_config() {
    SamplerConfig c;
    c.greedy = true;
    return c;
  }
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig config);

  // Picks the next token from logits[vocab]; `history` holds the tokens so far (prompt and output).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplerConfig& config() const { return config_; }
  uint64_t seed() const { return seed_; }

 private:
  SamplerConfig config_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<float> adjusted_;                        // the logits after penalties, reused between calls
  std::vector<float> block_max_;                       // top-k's per-block maxima, reused between calls
  std::vector<std::pair<float, int32_t>> candidates_;  // (logit, id) survivors, reused between calls
};

// Index of the largest value, the lowest index on ties (as torch.argmax).
int32_t argmax(std::span<const float> values);

}  // namespace petrel
