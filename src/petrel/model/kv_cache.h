// The attention KV cache of one sequence, float32 in the reference path.
#pragma once

#include <cstdint>
#include <vector>

namespace petrel {

struct KvCache {
  int64_t context_length = 0;  // positions the cache can hold
  int64_t n_layers = 0;
  int64_t kv_dim = 0;  // n_kv_heads * head_dim
  int64_t n_past = 0;  // positions filled so far; the next token goes to position n_past
  std::vector<float> keys;    // [n_layers, context_length, kv_dim], after RoPE
  std::vector<float> values;  // [n_layers, context_length, kv_dim]

  KvCache() = default;
  KvCache(int64_t context_length, int64_t n_layers, int64_t kv_dim)
      : context_length(context_length),
        n_layers(n_layers),
        kv_dim(kv_dim),
        keys(static_cast<size_t>(n_layers * context_length * kv_dim)),
        values(static_cast<size_t>(n_layers * context_length * kv_dim)) {}

  float* layer_keys(int64_t layer) { return keys.data() + layer * context_length * kv_dim; }
  float* layer_values(int64_t layer) { return values.data() + layer * context_length * kv_dim; }
  int64_t remaining() const { return context_length - n_past; }
  // Forget everything; memory is kept.
  void reset() { n_past = 0; }
  // Drop positions >= n (e.g. to rewind to a shared prefix).
  void truncate(int64_t n) { if (n < n_past) n_past = n; }
};

}  // namespace petrel
