// kernels/cuda: rotary position embedding (rotate-half, transformers' apply_rotary_pos_emb) of one token's
// query and key heads, fused with writing its key and value into an fp16 KV cache. See rope.cu.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct RopeShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // even
};

// For the token at position *position (a device int32, read at run time so that a captured graph serves
// every step):
//   q[n_heads, head_dim] is rotated in place;
//   k[n_kv_heads, head_dim] rotated and v[n_kv_heads, head_dim] are rounded to fp16 (round to nearest) and
//   stored at row *position of key_cache / value_cache ([context_length, n_kv_heads, head_dim] fp16 bits).
// cos/sin of angle = float(position) * inv_freq[i] (float32 product, then cos/sin in double rounded to
// float), exactly as model/rope.cc's rope_cos_sin; inv_freq[head_dim / 2] is on the device.
// *position must be in [0, context_length): the caller checks it before writing it.
Status rope_store_kv(float* q, const float* k, const float* v, const RopeShape& shape, const float* inv_freq,
                     const int32_t* position, uint16_t* key_cache, uint16_t* value_cache, Stream stream = nullptr);

// The prompt processor's form: n_tokens consecutive tokens at positions start .. start + n_tokens - 1 (a host
// value: prompts are not replayed from a graph). q [n_tokens, n_heads, head_dim] is rotated in place; row t of
// k and v [n_tokens, n_kv_heads, head_dim] goes to cache row start + t, as rope_store_kv does for one token.
// The caller checks start + n_tokens <= context_length; n_tokens <= 65535.
Status rope_store_kv_rows(float* q, const float* k, const float* v, int64_t n_tokens, int64_t start,
                          const RopeShape& shape, const float* inv_freq, uint16_t* key_cache, uint16_t* value_cache,
                          Stream stream = nullptr, bool overlap_previous = false);

}  // namespace petrel::cuda
