// The attention KV cache of one sequence: keys (after RoPE) and values of every layer, positions-major, in
// float32 (the reference numerics), IEEE half (the default) or int8 with a scale per position and KV head.
#pragma once

#include <cstdint>
#include <vector>

#include "petrel/kernels/cpu/ops.h"

namespace petrel {

using cpu::KvType;

struct KvCache {
  KvType type = KvType::kF32;
  int64_t context_length = 0;  // positions the cache can hold
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t kv_dim = 0;  // n_kv_heads * head_dim
  int64_t n_past = 0;  // positions filled so far; the next token goes to position n_past
  std::vector<uint8_t> keys;    // [n_layers, context_length, kv_dim] elements of `type`
  std::vector<uint8_t> values;  // [n_layers, context_length, kv_dim]
  std::vector<float> key_scales, value_scales;  // kQ8: [n_layers, context_length, n_kv_heads]

  KvCache() = default;
  KvCache(int64_t context_length, int64_t n_layers, int64_t n_kv_heads, int64_t head_dim, KvType type = KvType::kF16)
      : type(type),
        context_length(context_length),
        n_layers(n_layers),
        n_kv_heads(n_kv_heads),
        head_dim(head_dim),
        kv_dim(n_kv_heads * head_dim),
        keys(static_cast<size_t>(n_layers * context_length * kv_dim * cpu::kv_element_bytes(type))),
        values(keys.size()),
        key_scales(type == KvType::kQ8 ? static_cast<size_t>(n_layers * context_length * n_kv_heads) : 0),
        value_scales(key_scales.size()) {}

  // Bytes of one layer's keys (or values) for `positions` positions, scales included.
  int64_t layer_bytes(int64_t positions) const {
    return positions * (kv_dim * cpu::kv_element_bytes(type) + (type == KvType::kQ8 ? n_kv_heads * 4 : 0));
  }
  int64_t total_bytes() const { return 2 * n_layers * layer_bytes(context_length); }

  cpu::KvLayer layer(int64_t l) {
    const int64_t elements = context_length * kv_dim * cpu::kv_element_bytes(type);
    cpu::KvLayer view;
    view.type = type;
    view.keys = keys.data() + l * elements;
    view.values = values.data() + l * elements;
    if (type == KvType::kQ8) {
      view.key_scales = key_scales.data() + l * context_length * n_kv_heads;
      view.value_scales = value_scales.data() + l * context_length * n_kv_heads;
    }
    view.n_kv_heads = n_kv_heads;
    view.head_dim = head_dim;
    return view;
  }

  int64_t remaining() const { return context_length - n_past; }
  // Forget everything; memory is kept.
  void reset() { n_past = 0; }
  // Drop positions >= n (e.g. to rewind to a shared prefix).
  void truncate(int64_t n) { if (n < n_past) n_past = n; }
};

}  // namespace petrel
