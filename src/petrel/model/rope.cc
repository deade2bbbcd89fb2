#include "petrel/model/rope.h"

#include <cmath>
#include <numbers>

namespace petrel {

std::vector<float> rope_inverse_frequencies(const RopeConfig& rope, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  // inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim), evaluated in float32.
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(rope.theta), exponent);
  }
  if (rope.scaling == RopeScalingType::kLinear) {
    for (float& f : inv_freq) f = f / static_cast<float>(rope.factor);
  } else if (rope.scaling == RopeScalingType::kLlama3) {
    // Frequencies with wavelength above low_freq_wavelen are divided by `factor`, those below
    // high_freq_wavelen are kept, and the band between is interpolated smoothly.
    const float factor = static_cast<float>(rope.factor);
    const float low = static_cast<float>(rope.low_freq_factor);
    const float high = static_cast<float>(rope.high_freq_factor);
    const float old_context = static_cast<float>(rope.original_max_position_embeddings);
    const float low_freq_wavelen = old_context / low;
    const float high_freq_wavelen = old_context / high;
    for (float& f : inv_freq) {
      const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        const float smooth = (old_context / wavelen - low) / (high - low);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
  }
  return inv_freq;
}

void rope_cos_sin(const std::vector<float>& inv_freq, int64_t first_position, int64_t count, float* cos, float* sin) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  for (int64_t r = 0; r < count; ++r) {
    const float position = static_cast<float>(first_position + r);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];  // float32 product, as torch's matmul of the two
      cos[r * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin[r * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
}

}  // namespace petrel
