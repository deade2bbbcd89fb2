// Compiled once per Highway target via foreach_target.h; see gemv_w4.h for the layout and the math.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "petrel/kernels/cpu/gemv_w4.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <vector>

#include "petrel/kernels/cpu/gemv_w4.h"
#include "petrel/util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace petrel::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Output channels [o_begin, o_end) of y, for 4- or 8-bit codes.
//
// Loop order: for each packed input row k, stream across this thread's whole range of output channels, whose
// words are contiguous in memory ([in / codes_per_word, out] layout), accumulating into a per-channel buffer
// that stays in L1/L2. Walking k innermost instead would touch a new 4 KiB page on every load (the row stride is
// out * 4 bytes) and run at a fraction of the memory bandwidth.
template <int kBits>
void GemvRange(const float* x, const ref::GptqMatrix& w, const float* group_sums, int64_t o_begin, int64_t o_end,
               float* y) {
  constexpr int kPerWord = 32 / kBits;
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::RebindToUnsigned<decltype(df)> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t n = o_end - o_begin, n_vec = n / lanes * lanes;
  const int64_t rows = w.rows, groups = w.n_groups(), words_per_group = w.group_size / kPerWord;
  const auto mask = hn::Set(di, (1 << kBits) - 1);
  std::vector<float> acc(n_vec), total(n_vec, 0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const int64_t k_begin = g * words_per_group, k_end = std::min(w.cols / kPerWord, k_begin + words_per_group);
    for (int64_t k = k_begin; k < k_end; ++k) {
      const int32_t* row = w.qweight + k * rows + o_begin;
      const float* xk = x + kPerWord * k;
      for (int64_t o = 0; o < n_vec; o += lanes) {
        const auto words = hn::LoadU(di, row + o);
        auto a = hn::LoadU(df, acc.data() + o);
        if constexpr (kBits == 4) {
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(words, mask)), hn::Set(df, xk[0]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<4>(words), mask)), hn::Set(df, xk[1]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<8>(words), mask)), hn::Set(df, xk[2]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<12>(words), mask)), hn::Set(df, xk[3]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<16>(words), mask)), hn::Set(df, xk[4]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<20>(words), mask)), hn::Set(df, xk[5]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<24>(words), mask)), hn::Set(df, xk[6]), a);
          // The top code: a logical shift, so that bit 31 does not sign-extend.
          const auto top = hn::BitCast(di, hn::ShiftRight<28>(hn::BitCast(du, words)));
          a = hn::MulAdd(hn::ConvertTo(df, top), hn::Set(df, xk[7]), a);
        } else {
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(words, mask)), hn::Set(df, xk[0]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<8>(words), mask)), hn::Set(df, xk[1]), a);
          a = hn::MulAdd(hn::ConvertTo(df, hn::And(hn::ShiftRight<16>(words), mask)), hn::Set(df, xk[2]), a);
          const auto top = hn::BitCast(di, hn::ShiftRight<24>(hn::BitCast(du, words)));
          a = hn::MulAdd(hn::ConvertTo(df, top), hn::Set(df, xk[3]), a);
        }
        hn::StoreU(a, df, acc.data() + o);
      }
    }
    // total += scale * (acc - zero * sum(x of the group)), per channel.
    for (int64_t o = 0; o < n_vec; ++o) {
      const int64_t channel = o_begin + o;
      total[o] += w.scale(g, channel) * (acc[o] - static_cast<float>(w.zero(g, channel)) * group_sums[g]);
    }
  }
  std::copy(total.begin(), total.end(), y + o_begin);
  for (int64_t channel = o_begin + n_vec; channel < o_end; ++channel) {  // channels past the last whole vector
    float sum = 0;
    for (int64_t g = 0; g < groups; ++g) {
      float dot = 0;
      const int64_t c_begin = g * w.group_size, c_end = std::min(w.cols, c_begin + w.group_size);
      for (int64_t c = c_begin; c < c_end; ++c) dot += x[c] * static_cast<float>(w.code(channel, c));
      sum += w.scale(g, channel) * (dot - static_cast<float>(w.zero(g, channel)) * group_sums[g]);
    }
    y[channel] = sum;
  }
}

void GemvW4Range(const float* x, const ref::GptqMatrix& w, const float* group_sums, int64_t o_begin, int64_t o_end,
                 float* y) {
  GemvRange<4>(x, w, group_sums, o_begin, o_end, y);
}

void GemvW8Range(const float* x, const ref::GptqMatrix& w, const float* group_sums, int64_t o_begin, int64_t o_end,
                 float* y) {
  GemvRange<8>(x, w, group_sums, o_begin, o_end, y);
}

size_t VectorLanes() { return hn::Lanes(hn::ScalableTag<float>()); }

}  // namespace HWY_NAMESPACE
}  // namespace petrel::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace petrel::cpu {

HWY_EXPORT(GemvW4Range);
HWY_EXPORT(GemvW8Range);
HWY_EXPORT(VectorLanes);

bool gemv_w4_gptq_supports(const ref::GptqMatrix& w) {
  const int per_word = w.bits == 4 ? 8 : 4;
  return (w.bits == 4 || w.bits == 8) && w.g_idx == nullptr && w.group_size % per_word == 0 && w.cols % per_word == 0;
}

void gemv_w4_gptq(const float* x, const ref::GptqMatrix& w, float* y) {
  std::vector<float> group_sums(w.n_groups(), 0.0f);
  for (int64_t c = 0; c < w.cols; ++c) group_sums[c / w.group_size] += x[c];
  const int64_t lanes = static_cast<int64_t>(HWY_DYNAMIC_DISPATCH(VectorLanes)());
  // Blocks of whole vectors per thread; each block reads its channels' words for every input row.
  const int64_t blocks = (w.rows + lanes - 1) / lanes;
  ThreadPool::global().parallel_for(blocks, [&](int64_t b, int64_t e) {
    if (w.bits == 4) HWY_DYNAMIC_DISPATCH(GemvW4Range)(x, w, group_sums.data(), b * lanes, std::min(w.rows, e * lanes), y);
    else HWY_DYNAMIC_DISPATCH(GemvW8Range)(x, w, group_sums.data(), b * lanes, std::min(w.rows, e * lanes), y);
  });
}

const char* best_target_name() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

}  // namespace petrel::cpu
#endif  // HWY_ONCE
