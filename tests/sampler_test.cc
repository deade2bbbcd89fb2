#include "petrel/runtime/sampler.h"
#include "petrel/runtime/generate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace petrel {
namespace {

TEST(Sampler, GreedyWhenTemperatureZeroOrTopKOne) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f};
  SamplerConfig c;
  c.temperature = 0.0f;
  EXPECT_EQ(Sampler(c).sample(logits, {}), 1);
  c = SamplerConfig();
  c.temperature = 5.0f;
  c.top_k = 1;
  c.top_p = 1.0f;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Sampler(c).sample(logits, {}), 1);
}

TEST(Sampler, ArgmaxPicksLowestIndexOnTies) {
  std::vector<float> logits = {1.0f, 3.0f, 3.0f};
  EXPECT_EQ(argmax(logits), 1);
  EXPECT_EQ(Sampler(SamplerConfig::greedy_config()).sample(logits, {}), 1);
}

TEST(Sampler, ArgmaxMatchesAPlainScanOnTiesNansAndOddLengths) {
  std::mt19937 gen(5);
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{1000}, size_t{128256}}) {
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<float> v(n);
      for (auto& x : v) {
        x = static_cast<float>(static_cast<int>(gen() % 9) - 4);  // ties
        if (x == 0.0f && gen() % 2) x = -0.0f;                      // and zeros of both signs
      }
      if (trial == 1) v[gen() % n] = std::nanf("");
      if (trial == 2) v[0] = std::nanf("");
      int32_t expected = 0;
      for (size_t i = 1; i < n; ++i) {
        if (v[i] > v[expected]) expected = static_cast<int32_t>(i);
      }
      EXPECT_EQ(argmax(v), expected) << "n " << n << " trial " << trial;
    }
  }
}

TEST(Sampler, SameSeedSameSequence) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = 0.1f * (i % 7);
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_p = 1.0f;
  c.seed = 42;
  Sampler a(c), b(c);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits, {}), b.sample(logits, {}));
}

// The sampler's one-pass top-k against a plain reference (sort every (logit, id) pair, keep k, top-p, softmax
// at the temperature, draw with the same engine): the same ids, draw for draw, on logits full of ties.
int32_t reference_sample(const std::vector<float>& logits, const SamplerConfig& c, std::mt19937_64& rng) {
  std::vector<std::pair<float, int32_t>> all;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) all.push_back({logits[i], i});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (c.top_k > 0 && static_cast<size_t>(c.top_k) < all.size()) all.resize(c.top_k);
  if (c.top_p < 1.0f) {
    double total = 0.0, cumulative = 0.0;
    for (const auto& a : all) total += std::exp(static_cast<double>(a.first - all[0].first));
    size_t keep = 0;
    while (keep < all.size()) {
      cumulative += std::exp(static_cast<double>(all[keep].first - all[0].first)) / total;
      ++keep;
      if (cumulative >= c.top_p) break;
    }
    all.resize(std::max<size_t>(keep, 1));
  }
  std::vector<double> w;
  double total = 0.0;
  for (const auto& a : all) total += w.emplace_back(std::exp(static_cast<double>((a.first - all[0].first) * (1.0f / c.temperature))));
  double r = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (size_t i = 0; i < all.size(); ++i) {
    r -= w[i];
    if (r < 0) return all[i].second;
  }
  return all.back().second;
}

TEST(Sampler, TopKMatchesAFullSortReference) {
  std::mt19937 gen(3);
  std::vector<float> logits(5000);
  for (int k : {1 + 1, 7, 40, 4999, 5000, 0}) {
    for (auto& v : logits) v = 0.5f * static_cast<float>(gen() % 40);  // many ties
    SamplerConfig c;
    c.temperature = 0.7f;
    c.top_k = k;
    c.top_p = 0.9f;
    c.seed = 11;
    Sampler s(c);
    std::mt19937_64 rng(11);
    for (int draw = 0; draw < 50; ++draw) ASSERT_EQ(s.sample(logits, {}), reference_sample(logits, c, rng)) << "top_k " << k;
  }
}

// sample_top over the k largest logits (sorted as cuda::top_k_logits returns them, here by a full sort) draws
// what sample() draws over all of them, draw for draw; top_needed says when that holds.
TEST(Sampler, SampleTopOverTheKLargestDrawsAsSampleOverAll) {
  std::mt19937 gen(13);
  std::vector<float> logits(3000);
  std::vector<int32_t> order(logits.size());
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    bool greedy;
  };
  for (const Case& k : {Case{0.8f, 40, 0.95f, false}, Case{0.8f, 40, 1.0f, false}, Case{1.5f, 64, 0.5f, false},
                        Case{0.8f, 2, 0.9f, false}, Case{0.0f, 0, 0.8f, false}, Case{0.8f, 1, 0.8f, false},
                        Case{0.8f, 40, 0.95f, true}}) {
    SamplerConfig c;
    c.temperature = k.temperature;
    c.top_k = k.top_k;
    c.top_p = k.top_p;
    c.greedy = k.greedy;
    c.seed = 17;
    Sampler full(c), top(c);
    const int32_t needed = full.top_needed(static_cast<int32_t>(logits.size()));
    ASSERT_EQ(needed, c.is_greedy() ? 1 : c.top_k) << "top_k " << c.top_k;
    for (int draw = 0; draw < 40; ++draw) {
      for (auto& v : logits) v = 0.25f * static_cast<float>(gen() % 64) - 8.0f;  // ties
      if (draw % 5 == 0) logits[gen() % logits.size()] = -0.0f;
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      std::vector<float> values(needed);
      std::vector<int32_t> ids(order.begin(), order.begin() + needed);
      for (int32_t i = 0; i < needed; ++i) values[i] = logits[ids[i]];
      ASSERT_EQ(top.sample_top(values, ids), full.sample(logits, {})) << "top_k " << c.top_k << " draw " << draw;
    }
  }
  // Not from the largest alone: penalties (they change logits by id), top-p without top-k, top-k off or >= vocab.
  SamplerConfig c;
  c.top_k = 40;
  c.repetition_penalty = 1.1f;
  EXPECT_EQ(Sampler(c).top_needed(1000), 0);
  c = SamplerConfig();
  c.top_k = 0;
  c.top_p = 0.8f;
  EXPECT_EQ(Sampler(c).top_needed(1000), 0);
  c.top_k = 1000;
  EXPECT_EQ(Sampler(c).top_needed(1000), 0);
}

TEST(Sampler, TopKRestrictsToTheKBest) {
  std::vector<float> logits = {3.0f, 2.9f, 2.8f, 0.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 100.0f;  // nearly uniform among survivors
  c.top_k = 2;
  c.top_p = 1.0f;
  c.seed = 1;
  Sampler s(c);
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) counts[s.sample(logits, {})]++;
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[0], 800);
  EXPECT_GT(counts[1], 800);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities at temperature 1: about 0.665, 0.245, 0.090.
  std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 1.0f;
  c.top_p = 0.6f;  // the first token alone reaches 0.6
  c.seed = 3;
  Sampler s(c);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(logits, {}), 0);
  c.top_p = 0.8f;  // needs the first two
  Sampler s2(c);
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) counts[s2.sample(logits, {})]++;
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_GT(counts[1], 300);
}

TEST(Sampler, TemperatureIsAppliedAfterTopP) {
  // With top-p computed at temperature 1, a high temperature must not let token 2 back in.
  std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  SamplerConfig c;
  c.temperature = 50.0f;
  c.top_p = 0.8f;
  c.seed = 9;
  Sampler s(c);
  for (int i = 0; i < 500; ++i) EXPECT_NE(s.sample(logits, {}), 2);
}

TEST(Sampler, PenaltiesDiscourageRepeats) {
  std::vector<float> logits = {2.0f, 1.9f, -1.0f};
  std::vector<int32_t> history = {0, 0};
  SamplerConfig c = SamplerConfig::greedy_config();
  c.repetition_penalty = 1.1f;  // 2.0 / 1.1 = 1.82 < 1.9
  EXPECT_EQ(Sampler(c).sample(logits, history), 1);
  c = SamplerConfig::greedy_config();
  c.presence_penalty = 0.05f;  // 1.95 > 1.9: still 0
  EXPECT_EQ(Sampler(c).sample(logits, history), 0);
  c.presence_penalty = 0.0f;
  c.frequency_penalty = 0.06f;  // 2.0 - 0.12 = 1.88 < 1.9
  EXPECT_EQ(Sampler(c).sample(logits, history), 1);
  c.penalize_last_n = 1;  // only the last occurrence counts: 2.0 - 0.06 = 1.94
  EXPECT_EQ(Sampler(c).sample(logits, history), 0);
}

TEST(Sampler, NegativeLogitsGetMoreNegativeUnderRepetitionPenalty) {
  std::vector<float> logits = {-1.0f, -1.05f};
  SamplerConfig c = SamplerConfig::greedy_config();
  c.repetition_penalty = 1.2f;  // -1.0 * 1.2 = -1.2 < -1.05
  std::vector<int32_t> history = {0};
  EXPECT_EQ(Sampler(c).sample(logits, history), 1);
}

}  // namespace
}  // namespace petrel

namespace petrel {
namespace {

TEST(TokenLogprobs, LogSoftmaxWithTheMostLikelyFirstAndTiesByLowerId) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 3.0f, -INFINITY};
  const double log_z = std::log(std::exp(1.0) + std::exp(2.0) + 2 * std::exp(3.0));
  const TokenLogprobs lp = token_logprobs(logits, 1, 3);
  EXPECT_EQ(lp.token, 1);
  EXPECT_NEAR(lp.logprob, 2.0 - log_z, 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 2);
  EXPECT_EQ(lp.top[1].first, 3);
  EXPECT_EQ(lp.top[2].first, 1);
  EXPECT_NEAR(lp.top[0].second, 3.0 - log_z, 1e-6);
  EXPECT_TRUE(token_logprobs(logits, 4, 0).top.empty());
  EXPECT_EQ(token_logprobs(logits, 4, 0).logprob, -INFINITY);  // the API writes it as -9999
  EXPECT_EQ(token_logprobs(logits, 0, 99).top.size(), logits.size());
}

}  // namespace
}  // namespace petrel
