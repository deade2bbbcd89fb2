#include "petrel/runtime/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

namespace petrel {

int32_t argmax(std::span<const float> values) {
  int32_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = static_cast<int32_t>(i);
  return best;
}

Sampler::Sampler(SamplerConfig config)
    : config_(config),
      seed_(config.seed ? *config.seed
                        : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())),
      rng_(seed_) {}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  candidates_.resize(vocab);
  for (int32_t i = 0; i < vocab; ++i) candidates_[i] = {logits[i], i};

  // 1. Penalties over the recent history.
  const bool penalize = config_.repetition_penalty != 1.0f || config_.presence_penalty != 0.0f ||
                        config_.frequency_penalty != 0.0f;
  if (penalize && !history.empty()) {
    size_t n = history.size();
    if (config_.penalize_last_n > 0) n = std::min(n, static_cast<size_t>(config_.penalize_last_n));
    std::unordered_map<int32_t, int> counts;
    for (int32_t id : history.subspan(history.size() - n)) counts[id]++;
    for (auto [id, count] : counts) {
      if (id < 0 || id >= vocab) continue;
      float& logit = candidates_[id].first;
      if (config_.repetition_penalty != 1.0f) {
        logit = logit > 0 ? logit / config_.repetition_penalty : logit * config_.repetition_penalty;
      }
      logit -= config_.presence_penalty + config_.frequency_penalty * static_cast<float>(count);
    }
  }

  if (config_.is_greedy()) {
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; ++i)
      if (candidates_[i].first > candidates_[best].first) best = i;
    return best;
  }

  auto by_logit_desc = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  // 2. top-k.
  size_t kept = candidates_.size();
  if (config_.top_k > 0 && static_cast<size_t>(config_.top_k) < kept) {
    kept = static_cast<size_t>(config_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + kept, candidates_.end(), by_logit_desc);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit_desc);
  }
  candidates_.resize(kept);

  // 3. top-p on the temperature-1 distribution of the survivors.
  if (config_.top_p < 1.0f) {
    const float max_logit = candidates_.front().first;
    double total = 0.0;
    for (const auto& c : candidates_) total += std::exp(static_cast<double>(c.first - max_logit));
    double cumulative = 0.0;
    size_t keep = 0;
    while (keep < candidates_.size()) {
      cumulative += std::exp(static_cast<double>(candidates_[keep].first - max_logit)) / total;
      ++keep;
      if (cumulative >= config_.top_p) break;
    }
    candidates_.resize(std::max<size_t>(keep, 1));
  }

  // 4. softmax(logits / temperature) and 5. sample.
  const float inv_temp = 1.0f / config_.temperature;
  const float max_logit = candidates_.front().first;
  std::vector<double> weights(candidates_.size());
  double total = 0.0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    weights[i] = std::exp(static_cast<double>((candidates_[i].first - max_logit) * inv_temp));
    total += weights[i];
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng_);
  for (size_t i = 0; i < candidates_.size(); ++i) {
    r -= weights[i];
    if (r < 0) return candidates_[i].second;
  }
  return candidates_.back().second;
}

}  // namespace petrel
