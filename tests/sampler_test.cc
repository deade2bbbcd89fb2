#include "petrel/runtime/sampler.h"

#include <gtest/gtest.h>

#include <map>

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
