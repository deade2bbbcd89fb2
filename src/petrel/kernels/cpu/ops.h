// kernels/cpu: the element-wise and attention ops of the Llama forward, in Google Highway (one build per target,
// the best chosen at run time). Same signatures and semantics as kernels/ref, which they are tested against
// (tests/kernels_cpu_test.cc); only the float summation order differs, plus the rounding of a 16-bit or 8-bit
// KV cache, which the tests apply to the reference's inputs too.
#pragma once

#include <cstdint>

#include "petrel/kernels/ref/ops.h"

namespace petrel::cpu {

// Element type of the attention KV cache.
//  kF32: float32, the reference numerics (parity tests against transformers).
//  kF16: IEEE half, the default: half the memory and bandwidth; keys/values of Llama models are far inside its
//        range (|x| < 65504) and its 11-bit mantissa is the precision of the activations Genie's W4A16 uses.
//  kQ8:  int8 with one float scale per position and KV head (scale = max |x| / 127): a quarter of float32.
enum class KvType : int32_t { kF32 = 0, kF16 = 1, kQ8 = 2 };

const char* kv_type_name(KvType type);
// Bytes of one stored element.
int64_t kv_element_bytes(KvType type);

// One layer of a KV cache, positions-major: keys/values [positions, n_kv_heads, head_dim] of `type`;
// key_scales/value_scales [positions, n_kv_heads] for kQ8 (null otherwise).
struct KvLayer {
  KvType type = KvType::kF32;
  void* keys = nullptr;
  void* values = nullptr;
  float* key_scales = nullptr;
  float* value_scales = nullptr;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
};

// Writes n rows of keys and values (float [n, n_kv_heads, head_dim]) at positions first_pos .. first_pos+n-1.
void kv_store(const KvLayer& layer, int64_t first_pos, int64_t n, const float* keys, const float* values);
// Reads position `pos`, KV head `head` back as float (keys when `values` is false).
void kv_load(const KvLayer& layer, int64_t pos, int64_t head, bool values, float* out);

// Causal grouped-query attention, as ref::attention, reading the cache in its stored type. The query heads
// that share a KV head are processed together, so each cached row is read and widened once per group.
void attention(const float* q, const KvLayer& kv, int64_t n_rows, int64_t first_pos, int64_t n_heads,
               float* out);

// RMSNorm as ref::rms_norm (weight of any float dtype).
void rms_norm(const float* x, int64_t n_rows, int64_t dim, const ref::DenseMatrix& weight, float eps, float* out);
// Rotary embedding as ref::apply_rope.
void apply_rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin);
// out = silu(gate) * up, as ref::silu_mul.
void silu_mul(const float* gate, const float* up, int64_t n, float* out);
// x += y.
void add_in_place(float* x, const float* y, int64_t n);

}  // namespace petrel::cpu
