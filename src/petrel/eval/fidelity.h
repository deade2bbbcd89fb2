// Fidelity of a model's logits against a reference's at the same positions: KL divergence (reference ||
// model), top-1 agreement and perplexity, accumulated position by position.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

namespace petrel::eval {

struct FidelitySummary {
  int64_t positions = 0;
  double kl_mean = 0, kl_p99 = 0, kl_max = 0;
  double top1_agreement = 0;  // share of positions with the same argmax
  double perplexity = 0;      // of the model on the scored next tokens (0 when no targets were given)
  double reference_perplexity = 0;
  nlohmann::ordered_json to_json() const;
};

class FidelityAccumulator {
 public:
  // One position: the reference's and the model's logits over the vocabulary, and the next token
  // (-1 when there is none to score perplexity with).
  void add(std::span<const float> reference, std::span<const float> model, int32_t next_token);
  FidelitySummary summary() const;

 private:
  std::vector<double> kl_;
  int64_t agree_ = 0;
  double nll_ = 0, reference_nll_ = 0;
  int64_t scored_ = 0;
};

// log-softmax of logits into out (double for exact KL on near-identical distributions).
void log_softmax(std::span<const float> logits, std::vector<double>& out);

}  // namespace petrel::eval
