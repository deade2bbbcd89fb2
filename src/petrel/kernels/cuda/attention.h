// kernels/cuda: grouped-query attention of one new token (the token generator) over an fp16 KV cache on the
// device, split over the KV length. Layout, preconditions and tuning are in attention.cu.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct DecodeAttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // at most kMaxHeadDim
  int64_t context_length = 0;  // rows of the cache; bounds the number of splits
  int64_t split_positions = 0;  // KV positions per block; 0: decode_attention_split(context_length)
};

inline constexpr int64_t kMaxHeadDim = 256;

// The default KV positions per block for a cache of `context_length` positions.
int64_t decode_attention_split(int64_t context_length);

// Floats of scratch decode_attention needs for `shape` (per split and head: the max, the sum, head_dim values).
int64_t decode_attention_workspace_floats(const DecodeAttentionShape& shape);

// out[n_heads, head_dim] = softmax(q k^T / sqrt(head_dim)) v over cache positions 0 .. *position (inclusive;
// *position is a device int32), query head h reading KV head h / (n_heads / n_kv_heads), as ref::attention
// for the last row. q float32 [n_heads, head_dim]; key_cache, value_cache fp16 bits
// [context_length, n_kv_heads, head_dim]; workspace of decode_attention_workspace_floats(shape) floats.
Status decode_attention(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, const int32_t* position,
                        const DecodeAttentionShape& shape, float* workspace, float* out, Stream stream = nullptr);

}  // namespace petrel::cuda
