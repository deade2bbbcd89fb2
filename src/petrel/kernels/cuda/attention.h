// kernels/cuda: grouped-query attention of one new token (the token generator) over an fp16 KV cache on the
// device, split over the KV length. Layout, preconditions and tuning are in attention.cu.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/blas.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct DecodeAttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // at most kMaxHeadDim
  int64_t context_length = 0;  // rows of the cache; bounds the number of splits
  int64_t split_positions = 0;  // KV positions per block; 0: decode_attention_split(context_length)
  // decode_attention_rope: blocks per KV head at most (each block then works through more chunks of 32
  // positions); 0: one per 32 positions of the cache, at most 32, and fewer where those would not all fit on
  // the GPU at once (decode_attention_one_wave_blocks). Its grid is fixed by the cache, not by the position,
  // and the next kernel of the token generator launches only once every block of it has started.
  int64_t fused_max_blocks = 0;
  // decode_attention_rope: scores and value sums on tensor cores (mma.sync, q and the probabilities rounded to
  // fp16) where the shape allows (head_dim 32, 64 or 128, at most 16 query heads a KV head); false: the float32 build.
  bool tensor_cores = true;
  // decode_attention_rope's tensor-core build with its warm pass (the default): registers capped so that its blocks
  // can start beside q/k/v's, its chunk and merge code run once on stale inputs before the wait (so that the real
  // pass after it runs from warm instruction caches), the next kernel let launch only after the wait. The same
  // results bit for bit; false: the build without (tok/s -0.5 to -0.9%, docs/PERFORMANCE.md session 27).
  bool warm_code = true;
};

inline constexpr int64_t kMaxHeadDim = 256;

// decode_attention_rope's default grid, cut to one wave: `blocks` a KV head where n_kv_heads x blocks fit on
// the GPU at once (sms x per_sm blocks, per_sm from the block's shared memory and threads), else as many as do
// (at least 1): each block then works through more chunks, double-buffered, instead of a second wave of blocks
// waiting for the first. Llama-3.1-8B on an H200 (8 KV heads, 132 SMs): a cache of 8,192 positions takes 2
// stage buffers a slot, one block an SM, so 32 blocks a KV head would be 2 waves; 16 measured tg64 after 8,000
// tokens 392 -> 406 tok/s (12: 367, 8: 335), and at 4,096 positions (2 blocks an SM) nothing is cut.
inline int64_t decode_attention_one_wave_blocks(int64_t n_kv_heads, int64_t blocks, int64_t sms, int64_t per_sm) {
  const int64_t resident = sms * (per_sm > 0 ? per_sm : 1);
  if (n_kv_heads <= 0 || n_kv_heads * blocks <= resident) return blocks;
  const int64_t fit = resident / n_kv_heads;
  return fit > 1 ? fit : 1;
}

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

// The token generator's fused attention step in ONE launch (attention.cu): RoPE of this token's query and key
// heads (rope_store_kv's angles and float32 expressions), the store of its key and value as fp16 at row
// *position of the caches, and the attention over positions 0 .. *position: up to 32 blocks per KV head,
// each an online softmax over whole 32-position chunks, combined by the last block of each KV head to finish
// (an arrival counter, as gemv_gptq's split-K); a lone block writes the output itself. split_positions is
// not used.
// q [n_heads, head_dim], k and v [n_kv_heads, head_dim]: the projections, not rotated (none is modified).
// workspace: decode_attention_workspace_floats(shape) floats; counters: n_kv_heads uint32 that are zero
// before the first call and left zero by every call. With overlap_previous the launch may overlap the kernel
// before it on the stream (programmatic dependent launch; see gemv_gptq.h's GemvOptions). *position must be
// in [0, context_length).
Status decode_attention_rope(const float* q, const float* k, const float* v, const float* inv_freq,
                             const int32_t* position, uint16_t* key_cache, uint16_t* value_cache,
                             const DecodeAttentionShape& shape, float* workspace, uint32_t* counters, float* out,
                             Stream stream = nullptr, bool overlap_previous = false);

// ---- Prefill (the prompt processor): attention_prefill.cu ----

struct PrefillAttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // even, at most kMaxHeadDim
};

// Bytes of workspace prefill_attention needs for n_tokens queries over kv_length = start + n_tokens positions.
int64_t prefill_attention_workspace_bytes(const PrefillAttentionShape& shape, int64_t n_tokens, int64_t kv_length);

// Causal grouped-query attention of n_tokens queries at positions start .. start + n_tokens - 1 over cache
// positions 0 .. start + t (query t), as ref::attention with first_pos = start: q float32 [n_tokens, n_heads,
// head_dim] (already rotated), key_cache / value_cache fp16 bits [>= start + n_tokens, n_kv_heads, head_dim]
// (the rows of the new tokens already stored), out float32 [n_tokens, n_heads, head_dim]. Uses cuBLAS
// (`blas`, whose stream is set to `stream`) and `workspace` (prefill_attention_workspace_bytes of it).
Status prefill_attention(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, int64_t start,
                         int64_t n_tokens, const PrefillAttentionShape& shape, BlasHandle& blas, void* workspace,
                         int64_t workspace_bytes, float* out, Stream stream = nullptr);

// The largest chunk (n_tokens) and the most positions (start + n_tokens) for which
// prefill_attention_short_preferred picks the short kernel.
inline constexpr int64_t kShortPrefillTokens = 64;
inline constexpr int64_t kShortPrefillPositions = 512;

// Whether prefill_attention_short is the better choice for n_tokens queries at `start`: short prompts (a chat
// turn), where prefill_attention's five launches (two through cuBLAS) cost more than the work. A block's
// positions are a serial chain of 32-position chunks, hence the bound on start + n_tokens.
bool prefill_attention_short_preferred(int64_t start, int64_t n_tokens);

// prefill_attention's contract (same operands, same result up to rounding) without cuBLAS or workspace, in one
// launch: one block per (KV head, token) runs decode_attention_rope's chunked online softmax over positions
// 0 .. start + t (serially, 32 positions at a time), so its time grows with start + n_tokens; for short prompts.
// q is not rounded to fp16 (closer to ref::attention than prefill_attention).
Status prefill_attention_short(const float* q, const uint16_t* key_cache, const uint16_t* value_cache, int64_t start,
                               int64_t n_tokens, const PrefillAttentionShape& shape, float* out, Stream stream = nullptr,
                               bool overlap_previous = false);  // as rms_norm's (norm.h)

}  // namespace petrel::cuda
