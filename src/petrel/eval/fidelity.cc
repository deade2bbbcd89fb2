#include "petrel/eval/fidelity.h"

#include <algorithm>
#include <cmath>

#include "petrel/kernels/ref/ops.h"

namespace petrel::eval {

void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  const double log_z = ref::log_sum_exp(logits);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_z;
}

void FidelityAccumulator::add(std::span<const float> reference, std::span<const float> model, int32_t next_token) {
  thread_local std::vector<double> lp_ref, lp_model;
  log_softmax(reference, lp_ref);
  log_softmax(model, lp_model);
  double kl = 0;
  size_t arg_ref = 0, arg_model = 0;
  for (size_t i = 0; i < lp_ref.size(); ++i) {
    kl += std::exp(lp_ref[i]) * (lp_ref[i] - lp_model[i]);
    if (reference[i] > reference[arg_ref]) arg_ref = i;
    if (model[i] > model[arg_model]) arg_model = i;
  }
  kl_.push_back(std::max(kl, 0.0));
  agree_ += arg_ref == arg_model;
  if (next_token >= 0 && static_cast<size_t>(next_token) < lp_ref.size()) {
    nll_ -= lp_model[next_token];
    reference_nll_ -= lp_ref[next_token];
    ++scored_;
  }
}

FidelitySummary FidelityAccumulator::summary() const {
  FidelitySummary s;
  s.positions = static_cast<int64_t>(kl_.size());
  if (kl_.empty()) return s;
  std::vector<double> sorted = kl_;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double v : sorted) total += v;
  s.kl_mean = total / sorted.size();
  s.kl_p99 = sorted[std::min(sorted.size() - 1, static_cast<size_t>(std::ceil(0.99 * sorted.size())) - 1)];
  s.kl_max = sorted.back();
  s.top1_agreement = static_cast<double>(agree_) / kl_.size();
  if (scored_ > 0) {
    s.perplexity = std::exp(nll_ / scored_);
    s.reference_perplexity = std::exp(reference_nll_ / scored_);
  }
  return s;
}

nlohmann::ordered_json FidelitySummary::to_json() const {
  return {{"positions", positions},          {"kl_mean", kl_mean},       {"kl_p99", kl_p99},
          {"kl_max", kl_max},                {"top1_agreement", top1_agreement}, {"perplexity", perplexity},
          {"reference_perplexity", reference_perplexity}};
}

}  // namespace petrel::eval
