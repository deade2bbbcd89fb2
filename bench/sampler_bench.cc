// petrel_bench_sampler: Sampler::sample on a Llama-3 vocabulary (128,256 logits, normal with sd 3), greedy and
// Genie's default top-k 40 / top-p 0.95 / temperature 0.8, beside the partial_sort of every (logit, id) pair
// that the top-k step used before (runtime/sampler.cc). Median of --reps calls, microseconds.
//
//   petrel_bench_sampler [--reps N] [--vocab N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "petrel/runtime/sampler.h"

using petrel::bench::median_us;

int main(int argc, char** argv) {
  int reps = 200;
  int vocab = 128256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--vocab" && i + 1 < argc) vocab = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: petrel_bench_sampler [--reps N] [--vocab N]\n");
      return 2;
    }
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(vocab);
  for (float& v : logits) v = normal(gen);
  volatile int32_t sink = 0;

  petrel::SamplerConfig genie;
  genie.temperature = 0.8f;
  genie.top_k = 40;
  genie.top_p = 0.95f;
  genie.seed = 42;
  petrel::Sampler sampler(genie), greedy(petrel::SamplerConfig::greedy_config());
  std::vector<std::pair<float, int32_t>> pairs(vocab);
  const auto by_logit_desc = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };

  std::printf("| case (vocab %d) | median us |\n|---|---:|\n", vocab);
  std::printf("| sample(), top-k 40, top-p 0.95, temp 0.8 | %.1f |\n", median_us(reps, [&] { sink = sampler.sample(logits, {}); }));
  std::printf("| sample(), greedy | %.1f |\n", median_us(reps, [&] { sink = greedy.sample(logits, {}); }));
  std::printf("| the previous top-k step alone: pairs + partial_sort of 40 | %.1f |\n", median_us(reps, [&] {
                for (int32_t i = 0; i < vocab; ++i) pairs[i] = {logits[i], i};
                std::partial_sort(pairs.begin(), pairs.begin() + 40, pairs.end(), by_logit_desc);
                sink = pairs[0].second;
              }));
  (void)sink;
  return 0;
}
