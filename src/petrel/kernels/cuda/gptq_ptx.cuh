// kernels/cuda: the PTX helpers of the W4A16 kernels (gemv_gptq.cu, gemm_gptq.cu): fp16x2 arithmetic, the
// m16n8k16 tensor-core product and the magic-number dequantization of packed 4- and 8-bit codes.
//
// Dequantization (gemv_gptq.cu explains the fragment mapping around it): (w & 0x000F000F) | 0x64006400 is the
// half2 {1024 + c0, 1024 + c4}; one sub.f16x2 (or, for the codes in bits 4..7 of each half, which read as
// 16 c + 1024, one fma.f16x2 by 1/16) removes 1024 and the zero. code - zero is a small integer, exact in fp16.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace petrel::cuda::ptx {

__device__ __forceinline__ uint32_t sub_f16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// {lo, hi} as an fp16 pair, lo in the low half (the first element of an mma register).
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d[0..3] += A(16x16, f16) * B(16x8, f16), float32 accumulation.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr uint32_t kHalf1024x2 = 0x64006400u;       // fp16 1024 in both halves: the magic exponent
constexpr uint32_t kHalfSixteenthx2 = 0x2C002C00u;  // fp16 1/16 in both halves

// (w & kMask) | 0x64006400 in one LOP3 (lookup table 0xEA = (a & b) | c). Written as C++, the two immediates
// make the compiler emit two logic instructions per extraction (a LOP3 takes one immediate): 13 instead of 9
// instructions per 4-bit word, on the GEMV's hot path.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t mask_or_magic(uint32_t w) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(w), "n"(kMask), "r"(kHalf1024x2));
  return d;
}

// The dequantization biases of 4 rows whose zeros (stored zero + offset) are `zeros`' 4- or 8-bit fields 0..3
// (`zeros` already shifted to this thread's rows): {1024 + z} x2 (bias_low) and {-(64 + z)} x2 (bias_high,
// 4-bit only), one IMAD each with the offset folded into the constants (computed once by zero_bias_bases).
// The group change of the grouped kernels runs this every group (every 4 steps at group 128): written as
// (0x6400 + zero) * 0x10001 with the offset added per row it took twice the instructions.
struct ZeroBiasBases {
  uint32_t low, high;
};
__device__ __forceinline__ ZeroBiasBases zero_bias_bases(int zero_offset) {
  const uint32_t offset = static_cast<uint32_t>(zero_offset);
  return {0x64006400u + offset * 0x00010001u, 0xD400D400u + offset * 0x00100010u};
}
template <int kBits>
__device__ __forceinline__ void zero_biases(uint32_t zeros, ZeroBiasBases bases, uint32_t (&bias_low)[4],
                                            uint32_t (&bias_high)[4]) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const uint32_t stored = (zeros >> (kBits * r)) & ((1u << kBits) - 1);
    bias_low[r] = stored * 0x00010001u + bases.low;
    bias_high[r] = stored * 0x00100010u + bases.high;
  }
}

// fp16 number `half` (0: bits 0..15, 1: bits 16..31) of `packed` in both halves of the result (one PRMT).
__device__ __forceinline__ uint32_t broadcast_half(uint32_t packed, int half) {
  return __byte_perm(packed, 0u, half ? 0x3232u : 0x1010u);
}

// The 8 codes of a 4-bit word as four fp16 pairs of (code - zero): {c0, c4}, {c1, c5}, {c2, c6}, {c3, c7}.
// bias_low = {1024 + z} x2; bias_high = {-(64 + z)} x2, since a code in bits 4..7 of a half reads 16 c + 1024.
__device__ __forceinline__ void dequant_word4(uint32_t w, uint32_t bias_low, uint32_t bias_high, uint32_t (&v)[4]) {
  const uint32_t w8 = w >> 8;
  v[0] = sub_f16x2(mask_or_magic<0x000F000Fu>(w), bias_low);
  v[1] = fma_f16x2(mask_or_magic<0x00F000F0u>(w), kHalfSixteenthx2, bias_high);
  v[2] = sub_f16x2(mask_or_magic<0x000F000Fu>(w8), bias_low);
  v[3] = fma_f16x2(mask_or_magic<0x00F000F0u>(w8), kHalfSixteenthx2, bias_high);
}

// One step of the 4-bit vector kernels' tensor-core product (gemv_gptq.cu has the fragment mapping): this
// thread's 16 bytes `w` (word quad_col of rows row .. row + 3, per row's biases) dequantized and multiplied with
// its x fragment `xf` ({x0,x4},{x1,x5},{x2,x6},{x3,x7} of that word) into the accumulators of rows (row, row + 1)
// and (row + 2, row + 3).
__device__ __forceinline__ void mma_step4(float (&acc01)[4], float (&acc23)[4], const uint4& w, const uint4& xf,
                                          const uint32_t (&bias_low)[4], const uint32_t (&bias_high)[4]) {
  uint32_t v0[4], v1[4], v2[4], v3[4];
  dequant_word4(w.x, bias_low[0], bias_high[0], v0);
  dequant_word4(w.y, bias_low[1], bias_high[1], v1);
  dequant_word4(w.z, bias_low[2], bias_high[2], v2);
  dequant_word4(w.w, bias_low[3], bias_high[3], v3);
  mma_m16n8k16(acc01, v0[0], v1[0], v0[1], v1[1], xf.x, xf.y);
  mma_m16n8k16(acc01, v0[2], v1[2], v0[3], v1[3], xf.z, xf.w);
  mma_m16n8k16(acc23, v2[0], v3[0], v2[1], v3[1], xf.x, xf.y);
  mma_m16n8k16(acc23, v2[2], v3[2], v2[3], v3[3], xf.z, xf.w);
}

// The vector kernels' promotion: the accumulators of mma_step4 (every column holds the same sums: one of each
// row's) times the rows' scales added into float32 totals, and cleared (the tensor cores' float32 accumulation
// truncates: its sums are kept short).
__device__ __forceinline__ void promote4(float (&total)[4], const float (&scale)[4], float (&acc01)[4], float (&acc23)[4]) {
  total[0] += scale[0] * acc01[0];
  total[1] += scale[1] * acc01[2];
  total[2] += scale[2] * acc23[0];
  total[3] += scale[3] * acc23[2];
#pragma unroll
  for (int i = 0; i < 4; ++i) acc01[i] = acc23[i] = 0.0f;
}

// The 4 codes of an 8-bit word as two fp16 pairs of (code - zero): {c0, c2}, {c1, c3}.
__device__ __forceinline__ void dequant_word8(uint32_t w, uint32_t bias_low, uint32_t (&v)[2]) {
  v[0] = sub_f16x2(mask_or_magic<0x00FF00FFu>(w), bias_low);
  v[1] = sub_f16x2(mask_or_magic<0x00FF00FFu>(w >> 8), bias_low);
}

// The raw scales (4 fp16 at `scales_at`: 4 consecutive rows of one group) of a thread's rows; zeros when not
// `wanted`. Read-only path: the W4A16 kernels read them once per group.
__device__ __forceinline__ uint2 load_raw_scales(const uint16_t* scales_at, bool wanted) {
  return wanted ? __ldg(reinterpret_cast<const uint2*>(scales_at)) : make_uint2(0, 0);
}

// The 4 rows' fp16 scales of load_raw_scales (two packed words) as floats.
__device__ __forceinline__ void decode_scales(uint2 raw, float (&scale)[4]) {
  const uint32_t packed[2] = {raw.x, raw.y};
#pragma unroll
  for (int r = 0; r < 4; ++r) scale[r] = __half2float(__ushort_as_half(static_cast<unsigned short>(packed[r / 2] >> (16 * (r % 2)))));
}

// The raw scales as load_raw_scales, and the zeros word (at `zeros_at`) of a thread's rows; zeros when not `wanted`.
__device__ __forceinline__ void load_raw_params(const uint16_t* scales_at, const int32_t* zeros_at, bool wanted,
                                                uint2& scales, uint32_t& zeros) {
  scales = make_uint2(0, 0);
  zeros = 0;
  if (wanted) {
    scales = __ldg(reinterpret_cast<const uint2*>(scales_at));
    zeros = static_cast<uint32_t>(__ldg(zeros_at));
  }
}

}  // namespace petrel::cuda::ptx
