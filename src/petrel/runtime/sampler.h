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
  // Genie applies top-p to the temperature-1 distribution; OpenAI, vLLM and transformers to the distribution
  // after the temperature (the server sets this).
  bool top_p_after_temperature = false;

  bool is_greedy() const { return greedy || temperature <= 0.0f || top_k == 1; }
  bool penalizes() const { return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f; }
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

  // How many of the largest logits sample() needs when they are all it looks at: 1 when greedy, top_k when
  // top-k is on (0 < top_k < vocab); 0 when it needs every logit (penalties change logits by id; top-p alone
  // may keep any number). A backend that can pick them itself (the GPU) then sends only those.
  int32_t top_needed(int32_t vocab) const;
  // The pick sample() makes from the top_needed(vocab) largest logits alone: values descending, ids ascending
  // among equal values (the order of sample()'s own sort; cuda::top_k_logits gives them so), the same draw
  // from the same random state.
  int32_t sample_top(std::span<const float> values, std::span<const int32_t> ids);
  const SamplerConfig& config() const { return config_; }
  uint64_t seed() const { return seed_; }

 private:
  SamplerConfig config_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<float> adjusted_;                        // the logits after penalties, reused between calls
  std::vector<float> block_max_;                       // top-k's per-block maxima, reused between calls
  std::vector<std::pair<float, int32_t>> candidates_;  // (logit, id) survivors, reused between calls

  int32_t draw();  // top-p, temperature and the draw over candidates_ (sorted, cut to top-k)
};

// Index of the largest value, the lowest index on ties (as torch.argmax).
int32_t argmax(std::span<const float> values);

}  // namespace petrel
