// Compiled once per Highway target via foreach_target.h; see gptq_matmul.h for the layout and the math.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "petrel/kernels/cpu/gptq_matmul.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/util/parallel.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif
// GCC 12 reports the deliberately undefined upper lanes inside its own AVX-512 cast intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#ifndef PETREL_GEMV_ROWS
#define PETREL_GEMV_ROWS 16
#endif
#ifndef PETREL_GEMV_PREFETCH
#define PETREL_GEMV_PREFETCH 256
#endif
#ifndef PETREL_GPTQ_MATMUL_SHARED
#define PETREL_GPTQ_MATMUL_SHARED
namespace petrel::cpu::detail {

// Largest int16 code: |q| <= 32639 keeps the high byte of q = 256 hi + lo (lo in [-128, 127]) within int8.
constexpr int kMaxCode = 32639;
constexpr int64_t kMaxBlock = 128;  // input columns per activation scale
constexpr int64_t kTileRows = 4;    // rows per GEMM register tile
constexpr int64_t kPanel = 128;     // output channels per GEMM task
constexpr int64_t kMaddPanel = 64;  // output channels per GEMM task of the int16 path

// Activations quantized for the VNNI kernels (see gptq_matmul.h). Rows are grouped in tiles of `tile_rows`;
// per tile and packed input word, `tile_rows` x `slots` int32 of four int8 each, zero for padding rows:
//   4-bit words (codes 8r..8r+7): slots {hi of codes 0,2,4,6}, {hi of 1,3,5,7}, {lo of 0,2,4,6}, {lo of 1,3,5,7}
//   8-bit words (codes 4r..4r+3): slots {hi of 0,1,2,3}, {lo of 0,1,2,3}
struct PackedActs {
  const int32_t* words = nullptr;  // [tiles, cols / codes_per_word, tile_rows, slots]
  const float* scale = nullptr;    // [rows, n_blocks]: value = scale * q
  const float* qsum = nullptr;     // [rows, n_blocks]: sum of q over the block (for zero points)
  const int16_t* q = nullptr;      // [rows, cols]: the codes, for the scalar tail channels
  int64_t rows = 0, cols = 0, tile_rows = 1, n_blocks = 0, block = 0;
};

// Activations for the int16 kernels (targets without VNNI): per row, per packed input word, the int16 codes in
// the pairs the weights are unpacked into, each pair one int32 (low half first):
//   4-bit words (codes 8k..8k+7): (q0, q4), (q1, q5), (q2, q6), (q3, q7)
//   8-bit words (codes 4k..4k+3): (q0, q2), (q1, q3)
struct PairedActs {
  const int32_t* pairs = nullptr;  // [rows, cols / 2]
  const float* scale = nullptr;    // [rows, n_blocks]: value = scale * q
  const float* qsum = nullptr;     // [rows, n_blocks]: sum of q over the block (for zero points)
  const int16_t* q = nullptr;      // [rows, cols]: the codes, for the scalar tail channels
  int64_t rows = 0, cols = 0, n_blocks = 0, block = 0;
};

// y[row, o] for channels past the last whole vector, from the same int16 codes as the vector paths (PackedActs
// or PairedActs): the same integers, the same fold.
template <typename Acts>
void ScalarChannels(const Acts& a, const ref::GptqMatrix& w, int64_t row, int64_t o_begin, int64_t o_end, float* y_row) {
  const int16_t* q = a.q + row * a.cols;
  for (int64_t o = o_begin; o < o_end; ++o) {
    float sum = 0;
    for (int64_t b = 0; b < a.n_blocks; ++b) {
      const int64_t c0 = b * a.block, g = c0 / w.group_size;
      int32_t dot = 0;
      for (int64_t c = c0; c < c0 + a.block; ++c) dot += w.code(o, c) * q[c];
      sum += w.scale(g, o) * a.scale[row * a.n_blocks + b] *
             (static_cast<float>(dot) - static_cast<float>(w.zero(g, o)) * a.qsum[row * a.n_blocks + b]);
    }
    y_row[o] = sum;
  }
}

}  // namespace petrel::cpu::detail
#endif  // PETREL_GPTQ_MATMUL_SHARED

HWY_BEFORE_NAMESPACE();
namespace petrel::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using detail::PackedActs;
using detail::PairedActs;

// ------------------------------------------------------------------------------------------------
// Int16 path (every target without VNNI: AVX2, AVX-512 without VNNI, SSE4, NEON, ...).
//
// The codes of a word are unpacked into int16 pairs, one pair per 32-bit lane (one lane per output channel):
// (w >> 4j) & 0x000F000F holds codes j and j + 4 of a 4-bit word, (w >> 8j) & 0x00FF00FF codes j and j + 2 of an
// 8-bit one; ReorderWidenMulAccumulate (VPMADDWD on x86) multiplies them with the activations' pair of the same
// codes and adds both products into the lane's int32: 16 multiply-adds per AVX2 instruction, exact. A block of
// 128 columns sums to at most 128 * 255 * 32639 < 2^31. Per block the int32 sums are folded into y as
//     y[o] += scale[g, o] * act_scale[b] * (dot_b[o] - zero[g, o] * sum_b(q)),
// the VNNI path's formula. kRows rows x kVecs vectors of channels of accumulators live across up to 16 word rows
// of a block (4 x 2 for the GEMM's tiles: 8 of AVX2's 16 registers; 1 x 2 for the GEMV), which are read as 16
// sequential streams (the GEMV: what the hardware prefetchers follow; software prefetch measured slower, and a
// single stream through int32 sums in L1 too: docs/PERFORMANCE.md). The GEMM reads a contiguous copy of each
// panel of 64 channels, which stays in L2 across the tiles of 4 rows.

#if HWY_TARGET != HWY_SCALAR  // one lane cannot hold a pair: the scalar target takes MaddTail for every channel
using DI = hn::ScalableTag<int32_t>;
using DF = hn::RebindToFloat<DI>;
using DI16 = hn::Repartition<int16_t, DI>;
using VI = hn::Vec<DI>;
// Word rows per sweep of a block's channels: 16 sequential streams, as many as the hardware prefetchers follow
// (8-bit blocks of 32 word rows are swept in two halves, their partial sums folded one after the other).
constexpr int64_t kMaxStreams = 16;

// An empty asm that takes v in a register and gives it back, so that the compiler adds a tile's products into
// its accumulator one by one. Without it GCC 12 sums each word's 4 products per accumulator as a tree first
// (integer adds reassociate), which keeps 32 products live in the 4 x 2 tile and spilled them to the stack on
// AVX2 (16 registers): MaddTile<4, 4, 2>'s inner loop had ~40 stack loads and stores a word, now none.
template <class V>
HWY_INLINE void KeepInOrder(V& v) {
#if HWY_ARCH_X86 && defined(__GNUC__) && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#else
  (void)v;
#endif
}

// Scales and zero points of the lanes' channels [o, o + lanes) of group g, as float.
HWY_INLINE hn::Vec<DF> MaddScales(const ref::GptqMatrix& w, int64_t g, int64_t o) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(w.scales + g * w.rows + o)));
}
template <int kBits>
HWY_INLINE hn::Vec<DF> MaddZeros(const ref::GptqMatrix& w, int64_t g, int64_t o) {
  const DI di;
  constexpr int kLog2PerWord = kBits == 4 ? 3 : 2;  // log2(codes per word)
  const VI channel = hn::Add(hn::Set(di, static_cast<int32_t>(o)), hn::Iota(di, 0));
  const VI words = hn::GatherIndex(di, w.qzeros + g * (w.rows * kBits / 32), hn::ShiftRight<kLog2PerWord>(channel));
  const VI shift = hn::ShiftLeft<kBits == 4 ? 2 : 3>(hn::And(channel, hn::Set(di, (1 << kLog2PerWord) - 1)));
  const VI zero = hn::And(hn::Shr(words, shift), hn::Set(di, (1 << kBits) - 1));
  return hn::ConvertTo(DF(), hn::Add(zero, hn::Set(di, w.zero_offset)));
}

// y[row0 + r, o .. o_end) for r < n_rows (<= kRows), added into y (the caller zeroes it). Channels in steps of
// kVecs vectors; o_end - o_begin a multiple of that. Channel o's word k is words[k * stride + o - o_base]: the
// matrix itself (stride w.stride()) or a contiguous copy of a panel's columns.
template <int kBits, int kRows, int kVecs>
void MaddTile(const PairedActs& a, const ref::GptqMatrix& w, const int32_t* words_base, int64_t stride,
              int64_t o_base, int64_t row0, int64_t n_rows, int64_t o_begin, int64_t o_end, float* y) {
  constexpr int kPairs = 16 / kBits;  // int32 pairs per word: 4 (4-bit) or 2 (8-bit)
  const DI di;
  const DF df;
  const DI16 d16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(di)), words_per_block = a.block * kBits / 32;
  const VI mask = hn::Set(di, kBits == 4 ? 0x000F000F : 0x00FF00FF);
  const int32_t* pairs[kRows];
  for (int r = 0; r < kRows; ++r) {  // rows past n_rows repeat the last (computed, not stored)
    pairs[r] = a.pairs + (row0 + std::min<int64_t>(r, n_rows - 1)) * (a.cols / 2);
  }
  const int64_t sweeps_per_block = (words_per_block + kMaxStreams - 1) / kMaxStreams;
  for (int64_t sweep = 0; sweep < a.n_blocks * sweeps_per_block; ++sweep) {
    const int64_t b = sweep / sweeps_per_block, g = b * a.block / w.group_size;
    const int64_t k0 = b * words_per_block + sweep % sweeps_per_block * kMaxStreams;
    const int64_t k1 = std::min((b + 1) * words_per_block, k0 + kMaxStreams);
    const bool first = sweep % sweeps_per_block == 0;  // the zero-point term once per block
    for (int64_t o = o_begin; o < o_end; o += kVecs * lanes) {
      VI acc[kRows][kVecs], acc1[kRows][kVecs];
      #pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        #pragma GCC unroll 16
        for (int v = 0; v < kVecs; ++v) acc[r][v] = acc1[r][v] = hn::Zero(di);
      }
      const int32_t* wk = words_base + k0 * stride + (o - o_base);
      for (int64_t k = k0; k < k1; ++k, wk += stride) {
        VI words[kVecs];
        #pragma GCC unroll 16
        for (int v = 0; v < kVecs; ++v) words[v] = hn::LoadU(di, wk + v * lanes);
        #pragma GCC unroll 16
        for (int j = 0; j < kPairs; ++j) {
          VI codes[kVecs];
          #pragma GCC unroll 16
          for (int v = 0; v < kVecs; ++v) codes[v] = hn::And(hn::ShiftRightSame(words[v], j * kBits), mask);
          #pragma GCC unroll 16
          for (int r = 0; r < kRows; ++r) {
            const auto x = hn::BitCast(d16, hn::Set(di, pairs[r][k * kPairs + j]));
            #pragma GCC unroll 16
            for (int v = 0; v < kVecs; ++v) {
              acc[r][v] = hn::ReorderWidenMulAccumulate(di, hn::BitCast(d16, codes[v]), x, acc[r][v], acc1[r][v]);
              if constexpr (kRows > 1) KeepInOrder(acc[r][v]);  // the GEMV's 2 accumulators do not spill
            }
          }
        }
      }
      #pragma GCC unroll 16
      for (int v = 0; v < kVecs; ++v) {
        const int64_t ov = o + v * lanes;
        const auto scale = MaddScales(w, g, ov), zero = MaddZeros<kBits>(w, g, ov);
        for (int r = 0; r < n_rows && r < kRows; ++r) {
          const int64_t row = row0 + r;
          const auto dot = hn::ConvertTo(df, hn::RearrangeToOddPlusEven(acc[r][v], acc1[r][v]));
          const auto qsum = hn::Set(df, first ? a.qsum[row * a.n_blocks + b] : 0.0f);
          const auto centered = hn::NegMulAdd(zero, qsum, dot);
          const auto s = hn::Mul(scale, hn::Set(df, a.scale[row * a.n_blocks + b]));
          float* dst = y + row * w.rows + ov;
          hn::StoreU(hn::MulAdd(centered, s, hn::LoadU(df, dst)), df, dst);
        }
      }
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// Channels past the last whole vector, one at a time (detail::ScalarChannels).
void MaddTail(const PairedActs& a, const ref::GptqMatrix& w, int64_t row0, int64_t n_rows, int64_t o_begin,
              int64_t o_end, float* y) {
  for (int64_t row = row0; row < row0 + n_rows; ++row) detail::ScalarChannels(a, w, row, o_begin, o_end, y + row * w.rows);
}

// Channels [o_begin, o_end) of rows [row0, row0 + n_rows): tiles of kRows rows, kVecs vectors, then one vector,
// then the scalar tail. y's range is overwritten.
template <int kBits, int kRows, int kVecs>
void MaddRange(const PairedActs& a, const ref::GptqMatrix& w, const int32_t* words, int64_t stride, int64_t o_base,
               int64_t row0, int64_t n_rows, int64_t o_begin, int64_t o_end, float* y) {
#if HWY_TARGET == HWY_SCALAR
  MaddTail(a, w, row0, n_rows, o_begin, o_end, y);
#else
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(DI()));
  const int64_t wide_end = o_begin + (o_end - o_begin) / (kVecs * lanes) * (kVecs * lanes);
  const int64_t vec_end = o_begin + (o_end - o_begin) / lanes * lanes;
  for (int64_t row = row0; row < row0 + n_rows; ++row) std::fill(y + row * w.rows + o_begin, y + row * w.rows + vec_end, 0.0f);
  for (int64_t r = row0; r < row0 + n_rows; r += kRows) {
    const int64_t rows_here = std::min<int64_t>(kRows, row0 + n_rows - r);
    MaddTile<kBits, kRows, kVecs>(a, w, words, stride, o_base, r, rows_here, o_begin, wide_end, y);
    MaddTile<kBits, kRows, 1>(a, w, words, stride, o_base, r, rows_here, wide_end, vec_end, y);
  }
  MaddTail(a, w, row0, n_rows, vec_end, o_end, y);
#endif
}

// The GEMV (one row) over channels [o_begin, o_end).
void MaddGemv(const PairedActs& a, const ref::GptqMatrix& w, int64_t o_begin, int64_t o_end, float* y) {
  constexpr int kVecs = 2;
  if (w.bits == 4) MaddRange<4, 1, kVecs>(a, w, w.qweight, w.stride(), 0, 0, 1, o_begin, o_end, y);
  else MaddRange<8, 1, kVecs>(a, w, w.qweight, w.stride(), 0, 0, 1, o_begin, o_end, y);
}

// The GEMM: all rows, channel panels [p_begin, p_end) of kMaddPanel channels. A panel's columns are copied
// into a contiguous strip first and stay in L2 while the row tiles go by: read in place, its word rows lie a
// multiple of 4 KiB apart (out * 4 bytes) and evict each other from the same cache sets.
void MaddGemm(const PairedActs& a, const ref::GptqMatrix& w, int64_t p_begin, int64_t p_end, float* y) {
  thread_local std::vector<int32_t> strip;
  const int64_t words_per_row = w.cols * w.bits / 32;
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t o0 = p * detail::kMaddPanel, o1 = std::min(w.rows, o0 + detail::kMaddPanel), width = o1 - o0;
    strip.resize(static_cast<size_t>(words_per_row * width));
    for (int64_t k = 0; k < words_per_row; ++k) {
      std::memcpy(strip.data() + k * width, w.qweight + k * w.stride() + o0, static_cast<size_t>(width) * sizeof(int32_t));
    }
    if (w.bits == 4) MaddRange<4, 4, 2>(a, w, strip.data(), width, o0, 0, a.rows, o0, o1, y);
    else MaddRange<8, 4, 2>(a, w, strip.data(), width, o0, 0, a.rows, o0, o1, y);
  }
}

// ------------------------------------------------------------------------------------------------
// VNNI path (AVX3_DL only).
#if HWY_TARGET == HWY_AVX3_DL
#pragma GCC push_options
#pragma GCC target("avx512vnni")  // Highway's AVX3_DL target string names only the VEX form (avxvnni)

bool HasVnni() { return true; }

// Scales and zero points of the 16 channels [o, o + 16) of group g, as float.
inline __m512 Scales16(const ref::GptqMatrix& w, int64_t g, int64_t o) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.scales + g * w.rows + o)));
}
template <int kBits>
inline __m512 Zeros16(const ref::GptqMatrix& w, int64_t g, int64_t o) {
  __m512i z;
  if constexpr (kBits == 4) {
    const int32_t* p = w.qzeros + g * (w.rows / 8) + o / 8;
    const __m512i two_words = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m512i spread = _mm512_permutexvar_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                                    two_words);
    const __m512i shifts = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    z = _mm512_and_si512(_mm512_srlv_epi32(spread, shifts), _mm512_set1_epi32(15));
  } else {
    const int32_t* p = w.qzeros + g * (w.rows / 4) + o / 4;
    z = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  return _mm512_cvtepi32_ps(_mm512_add_epi32(z, _mm512_set1_epi32(w.zero_offset)));
}

// y += scale * act_scale * (dot - zero * qsum) for one vector of 16 channels; dot = 256 hi + lo.
inline void Flush(__m512i hi, __m512i lo, __m512 scale, __m512 zero, float act_scale, float qsum, float* y) {
  const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
  const __m512 centered = _mm512_fnmadd_ps(zero, _mm512_set1_ps(qsum), dot);
  const __m512 s = _mm512_mul_ps(scale, _mm512_set1_ps(act_scale));
  _mm512_storeu_ps(y, _mm512_fmadd_ps(centered, s, _mm512_loadu_ps(y)));
}

// One step of a word row for C vectors of channels: the weights' bytes times the activation bytes.
template <int kBits, int C>
inline void MulWords(const int32_t* wrow, const int32_t* act, __m512i (&hi)[C][2], __m512i (&lo)[C][2]) {
  if constexpr (kBits == 4) {
    const __m512i mask = _mm512_set1_epi32(0x0F0F0F0F);
    const __m512i he = _mm512_set1_epi32(act[0]), ho = _mm512_set1_epi32(act[1]);
    const __m512i le = _mm512_set1_epi32(act[2]), lo_ = _mm512_set1_epi32(act[3]);
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const __m512i words = _mm512_loadu_si512(wrow + 16 * c);
      const __m512i even = _mm512_and_si512(words, mask);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(words, 4), mask);
      hi[c][0] = _mm512_dpbusd_epi32(hi[c][0], even, he);
      hi[c][1] = _mm512_dpbusd_epi32(hi[c][1], odd, ho);
      lo[c][0] = _mm512_dpbusd_epi32(lo[c][0], even, le);
      lo[c][1] = _mm512_dpbusd_epi32(lo[c][1], odd, lo_);
    }
  } else {
    const __m512i h = _mm512_set1_epi32(act[0]), l = _mm512_set1_epi32(act[1]);
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const __m512i words = _mm512_loadu_si512(wrow + 16 * c);
      hi[c][0] = _mm512_dpbusd_epi32(hi[c][0], words, h);
      lo[c][0] = _mm512_dpbusd_epi32(lo[c][0], words, l);
    }
  }
}

constexpr int64_t kPrefetchWords = PETREL_GEMV_PREFETCH;

// GEMV over C vectors of channels at o, word rows [r_begin, r_end) of one block.
template <int kBits, int C>
inline void GemvStep(const PackedActs& a, const ref::GptqMatrix& w, int64_t o, int64_t r_begin, int64_t r_end,
                     int64_t b, bool subtract_zero, float* y) {
  constexpr int kSlots = kBits == 4 ? 4 : 2;
  __m512i hi[C][2], lo[C][2];
  #pragma GCC unroll 16
  for (int c = 0; c < C; ++c) hi[c][0] = hi[c][1] = lo[c][0] = lo[c][1] = _mm512_setzero_si512();
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int32_t* wrow = w.qweight + r * w.stride() + o;
    // Software prefetch kPrefetchWords ahead in each row's stream: the streams cross a 4 KiB page every 16
    // steps, where the hardware prefetchers stop and restart.
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) _mm_prefetch(reinterpret_cast<const char*>(wrow + kPrefetchWords + 16 * c), _MM_HINT_T0);
    MulWords<kBits, C>(wrow, a.words + r * kSlots, hi, lo);
  }
  const int64_t g = b * a.block / w.group_size;
  const float act_scale = a.scale[b], qsum = subtract_zero ? a.qsum[b] : 0.0f;
  #pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    Flush(_mm512_add_epi32(hi[c][0], hi[c][1]), _mm512_add_epi32(lo[c][0], lo[c][1]), Scales16(w, g, o + 16 * c),
          Zeros16<kBits>(w, g, o + 16 * c), act_scale, qsum, y + o + 16 * c);
  }
}

// Row 0 of `a` times channels [o_begin, o_end) (o_begin a multiple of 16).
template <int kBits>
void VnniGemvRange(const PackedActs& a, const ref::GptqMatrix& w, int64_t o_begin, int64_t o_end, int64_t b_begin,
                   int64_t b_end, float* y) {
  constexpr int64_t kPerWord = 32 / kBits;
  constexpr int64_t kMaxRowsInFlight = PETREL_GEMV_ROWS;  // sequential weight streams per thread
  const int64_t vec_end = o_begin + (o_end - o_begin) / 16 * 16;
  std::fill(y + o_begin, y + vec_end, 0.0f);
  const int64_t words_per_block = a.block / kPerWord;
  for (int64_t b = b_begin; b < b_end; ++b) {
    for (int64_t r0 = b * words_per_block; r0 < (b + 1) * words_per_block; r0 += kMaxRowsInFlight) {
      const int64_t r1 = std::min((b + 1) * words_per_block, r0 + kMaxRowsInFlight);
      const bool first = r0 == b * words_per_block;  // subtract the zero-point term once per block
      int64_t o = o_begin;
      for (; o + 64 <= vec_end; o += 64) GemvStep<kBits, 4>(a, w, o, r0, r1, b, first, y);
      for (; o < vec_end; o += 16) GemvStep<kBits, 1>(a, w, o, r0, r1, b, first, y);
    }
  }
  if (b_begin == 0 && b_end == a.n_blocks) detail::ScalarChannels(a, w, 0, vec_end, o_end, y);
}

// Channels [o_begin, o_end) over input blocks [b_begin, b_end), written (not added) to y.
void VnniGemv(const PackedActs& a, const ref::GptqMatrix& w, int64_t o_begin, int64_t o_end, int64_t b_begin,
              int64_t b_end, float* y) {
  if (w.bits == 4) VnniGemvRange<4>(a, w, o_begin, o_end, b_begin, b_end, y);
  else VnniGemvRange<8>(a, w, o_begin, o_end, b_begin, b_end, y);
}

// GEMM register tile: kTileRows rows x C vectors of channels at o, over word rows of block b.
template <int kBits, int C>
// `strip`: this tile's 16 * C channels of every word row, contiguous (a copy made by VnniGemmPanels).
inline void GemmTile(const PackedActs& a, const ref::GptqMatrix& w, const int32_t* strip, int64_t tile, int64_t o,
                     int64_t b, float* y) {
  constexpr int64_t kPerWord = 32 / kBits, kSlots = kBits == 4 ? 4 : 2, T = detail::kTileRows;
  const int64_t words_per_row = a.cols / kPerWord, words_per_block = a.block / kPerWord;
  // One high and one low accumulator per row and vector (16 zmm for 4 x 2): plenty of independent chains,
  // and room for the weights and broadcasts without spilling.
  __m512i hi[T][C], lo[T][C];
  #pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c) hi[t][c] = lo[t][c] = _mm512_setzero_si512();
  }
  const int32_t* act = a.words + (tile * words_per_row + b * words_per_block) * T * kSlots;
  const int32_t* wrow = strip + b * words_per_block * 16 * C;
  for (int64_t r = 0; r < words_per_block; ++r, act += T * kSlots, wrow += 16 * C) {
    __m512i even[C], odd[C];
    #pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const __m512i words = _mm512_loadu_si512(wrow + 16 * c);
      if constexpr (kBits == 4) {
        even[c] = _mm512_and_si512(words, _mm512_set1_epi32(0x0F0F0F0F));
        odd[c] = _mm512_and_si512(_mm512_srli_epi32(words, 4), _mm512_set1_epi32(0x0F0F0F0F));
      } else {
        even[c] = odd[c] = words;
      }
    }
    #pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const int32_t* x = act + t * kSlots;
      #pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        if constexpr (kBits == 4) {
          hi[t][c] = _mm512_dpbusd_epi32(hi[t][c], even[c], _mm512_set1_epi32(x[0]));
          hi[t][c] = _mm512_dpbusd_epi32(hi[t][c], odd[c], _mm512_set1_epi32(x[1]));
          lo[t][c] = _mm512_dpbusd_epi32(lo[t][c], even[c], _mm512_set1_epi32(x[2]));
          lo[t][c] = _mm512_dpbusd_epi32(lo[t][c], odd[c], _mm512_set1_epi32(x[3]));
        } else {
          hi[t][c] = _mm512_dpbusd_epi32(hi[t][c], even[c], _mm512_set1_epi32(x[0]));
          lo[t][c] = _mm512_dpbusd_epi32(lo[t][c], even[c], _mm512_set1_epi32(x[1]));
        }
      }
    }
  }
  const int64_t g = b * a.block / w.group_size;
  const int64_t rows = std::min<int64_t>(T, a.rows - tile * T);
  #pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    const __m512 scale = Scales16(w, g, o + 16 * c), zero = Zeros16<kBits>(w, g, o + 16 * c);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {  // compile-time indices keep the accumulators in registers
      if (t >= rows) break;
      const int64_t row = tile * T + t;
      Flush(hi[t][c], lo[t][c], scale, zero, a.scale[row * a.n_blocks + b], a.qsum[row * a.n_blocks + b],
            y + row * w.rows + o + 16 * c);
    }
  }
}

// Panels [p_begin, p_end) of detail::kPanel channels, every row of `a`.
template <int kBits>
void VnniGemmPanels(const PackedActs& a, const ref::GptqMatrix& w, int64_t p_begin, int64_t p_end, float* y) {
  const int64_t T = detail::kTileRows, tiles = (a.rows + T - 1) / T;
  const int64_t o_begin = p_begin * detail::kPanel, o_end = std::min(w.rows, p_end * detail::kPanel);
  const int64_t vec_end = o_begin + (o_end - o_begin) / 16 * 16;
  for (int64_t row = 0; row < a.rows; ++row) std::fill(y + row * w.rows + o_begin, y + row * w.rows + vec_end, 0.0f);
  constexpr int kWide = 2;  // vectors per register tile
  // The panel's words, copied strip by strip (16 * kWide channels of every word row, contiguous). Read in place,
  // a strip's rows sit out * 4 bytes apart, a power-of-two multiple for most Llama shapes, so they all map to
  // the same few L1/L2 sets and are evicted before the next tile reuses them; the copy costs one pass.
  const int64_t words_per_row = a.cols / (32 / kBits);
  thread_local std::vector<int32_t> panel;
  panel.resize(words_per_row * detail::kPanel);
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t po_begin = p * detail::kPanel, po_end = std::min(vec_end, po_begin + detail::kPanel);
    if (po_end <= po_begin) break;
    // Row by row, so that each row's panel (512 bytes) is read contiguously, with the rows 16 ahead prefetched:
    // a row is a new page, which the hardware prefetchers do not follow.
    for (int64_t r = 0; r < words_per_row; ++r) {
      if (r + 16 < words_per_row) {
        const char* ahead = reinterpret_cast<const char*>(w.qweight + (r + 16) * w.stride() + po_begin);
        for (int64_t line = 0; line < (po_end - po_begin) * 4; line += 64) __builtin_prefetch(ahead + line);
      }
      for (int64_t o = po_begin; o < po_end;) {
        const int64_t width = o + 16 * kWide <= po_end ? 16 * kWide : 16;
        int32_t* strip = panel.data() + (o - po_begin) * words_per_row;
        std::memcpy(strip + r * width, w.qweight + r * w.stride() + o, width * sizeof(int32_t));
        o += width;
      }
    }
    for (int64_t tile = 0; tile < tiles; ++tile) {
      int64_t o = po_begin;
      for (; o + 16 * kWide <= po_end; o += 16 * kWide) {
        const int32_t* strip = panel.data() + (o - po_begin) * words_per_row;
        for (int64_t b = 0; b < a.n_blocks; ++b) GemmTile<kBits, kWide>(a, w, strip, tile, o, b, y);
      }
      for (; o < po_end; o += 16) {
        const int32_t* strip = panel.data() + (o - po_begin) * words_per_row;
        for (int64_t b = 0; b < a.n_blocks; ++b) GemmTile<kBits, 1>(a, w, strip, tile, o, b, y);
      }
    }
  }
  for (int64_t row = 0; row < a.rows; ++row) detail::ScalarChannels(a, w, row, vec_end, o_end, y + row * w.rows);
}

void VnniGemm(const PackedActs& a, const ref::GptqMatrix& w, int64_t p_begin, int64_t p_end, float* y) {
  if (w.bits == 4) VnniGemmPanels<4>(a, w, p_begin, p_end, y);
  else VnniGemmPanels<8>(a, w, p_begin, p_end, y);
}

#pragma GCC pop_options
#else   // not AVX3_DL: never called (HasVnni is false)
bool HasVnni() { return false; }
void VnniGemv(const PackedActs&, const ref::GptqMatrix&, int64_t, int64_t, int64_t, int64_t, float*) {}
void VnniGemm(const PackedActs&, const ref::GptqMatrix&, int64_t, int64_t, float*) {}
#endif  // HWY_TARGET == HWY_AVX3_DL

}  // namespace HWY_NAMESPACE
}  // namespace petrel::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace petrel::cpu {

HWY_EXPORT(MaddGemv);
HWY_EXPORT(MaddGemm);
HWY_EXPORT(HasVnni);
HWY_EXPORT(VnniGemv);
HWY_EXPORT(VnniGemm);

namespace {

int64_t activation_block(const ref::GptqMatrix& w) { return std::gcd(w.group_size, detail::kMaxBlock); }

// Per-thread scratch for the packed activations: no allocation per call once warm.
struct Scratch {
  std::vector<int32_t> words;
  std::vector<float> scale, qsum;
  std::vector<int16_t> q;
  std::vector<int8_t> hi, lo;  // one row's codes split into bytes, before packing
};

inline uint32_t pack4(int a, int b, int c, int d) {
  return static_cast<uint8_t>(a) | static_cast<uint32_t>(static_cast<uint8_t>(b)) << 8 |
         static_cast<uint32_t>(static_cast<uint8_t>(c)) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(d)) << 24;
}

// Activations quantized to int16 per block of `block` columns: q[rows, cols], scale and qsum [rows, n_blocks].
void quantize_activations(const float* x, int64_t n_rows, int64_t cols, int64_t block, Scratch& s) {
  const int64_t n_blocks = cols / block;
  s.q.resize(n_rows * cols);
  s.scale.resize(n_rows * n_blocks);
  s.qsum.resize(n_rows * n_blocks);
  for (int64_t row = 0; row < n_rows; ++row) {
    const float* xr = x + row * cols;
    int16_t* q = s.q.data() + row * cols;
    for (int64_t b = 0; b < n_blocks; ++b) {
      float amax = 0;
      for (int64_t c = b * block; c < (b + 1) * block; ++c) amax = std::max(amax, std::fabs(xr[c]));
      const float scale = amax > 0 ? amax / detail::kMaxCode : 1.0f, inv = 1.0f / scale;
      int32_t sum = 0;
      for (int64_t c = b * block; c < (b + 1) * block; ++c) {
        // Round to nearest even by adding 1.5 * 2^23 (exact for |x * inv| <= 32639 < 2^22); vectorizes, unlike
        // nearbyint, which is a libm call under GCC's default -fmath-errno.
        const float shifted = xr[c] * inv + 12582912.0f;
        const int v = std::clamp(std::bit_cast<int32_t>(shifted) - 0x4B400000, -detail::kMaxCode, detail::kMaxCode);
        q[c] = static_cast<int16_t>(v);
        sum += v;
      }
      s.scale[row * n_blocks + b] = scale;
      s.qsum[row * n_blocks + b] = static_cast<float>(sum);
    }
  }
}

detail::PackedActs pack_activations(const float* x, int64_t n_rows, const ref::GptqMatrix& w, int64_t tile_rows,
                                    Scratch& s) {
  detail::PackedActs a;
  a.rows = n_rows;
  a.cols = w.cols;
  a.tile_rows = tile_rows;
  a.block = activation_block(w);
  a.n_blocks = w.cols / a.block;
  quantize_activations(x, n_rows, w.cols, a.block, s);
  const int per_word = 32 / w.bits, slots = w.bits == 4 ? 4 : 2;
  const int64_t words_per_row = w.cols / per_word, tiles = (n_rows + tile_rows - 1) / tile_rows;
  s.words.assign(tiles * words_per_row * tile_rows * slots, 0);
  s.hi.resize(w.cols);
  s.lo.resize(w.cols);
  int8_t* hi = s.hi.data();
  int8_t* lo = s.lo.data();
  for (int64_t row = 0; row < n_rows; ++row) {
    const int16_t* q = s.q.data() + row * w.cols;
    for (int64_t c = 0; c < w.cols; ++c) {
      const int h = (q[c] + 128) >> 8;  // arithmetic: floor((v + 128) / 256)
      hi[c] = static_cast<int8_t>(h);
      lo[c] = static_cast<int8_t>(q[c] - 256 * h);
    }
    const int64_t tile = row / tile_rows, t = row % tile_rows;
    for (int64_t r = 0; r < words_per_row; ++r) {
      uint32_t* dst = reinterpret_cast<uint32_t*>(s.words.data()) + ((tile * words_per_row + r) * tile_rows + t) * slots;
      const int64_t c = r * per_word;
      if (w.bits == 4) {
        dst[0] = pack4(hi[c], hi[c + 2], hi[c + 4], hi[c + 6]);
        dst[1] = pack4(hi[c + 1], hi[c + 3], hi[c + 5], hi[c + 7]);
        dst[2] = pack4(lo[c], lo[c + 2], lo[c + 4], lo[c + 6]);
        dst[3] = pack4(lo[c + 1], lo[c + 3], lo[c + 5], lo[c + 7]);
      } else {
        dst[0] = pack4(hi[c], hi[c + 1], hi[c + 2], hi[c + 3]);
        dst[1] = pack4(lo[c], lo[c + 1], lo[c + 2], lo[c + 3]);
      }
    }
  }
  a.words = s.words.data();
  a.scale = s.scale.data();
  a.qsum = s.qsum.data();
  a.q = s.q.data();
  return a;
}

inline int32_t pair16(int16_t low, int16_t high) {
  return static_cast<int32_t>(static_cast<uint16_t>(low) | static_cast<uint32_t>(static_cast<uint16_t>(high)) << 16);
}

detail::PairedActs pair_activations(const float* x, int64_t n_rows, const ref::GptqMatrix& w, Scratch& s) {
  detail::PairedActs a;
  a.rows = n_rows;
  a.cols = w.cols;
  a.block = activation_block(w);
  a.n_blocks = w.cols / a.block;
  quantize_activations(x, n_rows, w.cols, a.block, s);
  s.words.resize(n_rows * w.cols / 2);
  const int per_word = 32 / w.bits;
  for (int64_t row = 0; row < n_rows; ++row) {
    const int16_t* q = s.q.data() + row * w.cols;
    int32_t* dst = s.words.data() + row * w.cols / 2;
    for (int64_t c = 0; c < w.cols; c += per_word) {
      if (w.bits == 4) {
        for (int j = 0; j < 4; ++j) *dst++ = pair16(q[c + j], q[c + j + 4]);
      } else {
        for (int j = 0; j < 2; ++j) *dst++ = pair16(q[c + j], q[c + j + 2]);
      }
    }
  }
  a.pairs = s.words.data();
  a.scale = s.scale.data();
  a.qsum = s.qsum.data();
  a.q = s.q.data();
  return a;
}

// The token generator's GEMV with the input blocks split between the threads, so that each thread streams whole
// rows of words (out * 4 bytes each, contiguous) rather than a 1/threads slice of every row: longer sequential
// streams read measurably faster here (k/v projections: 196 -> 106 us). Thread 0 writes y, the others a partial
// sum added at the end (out floats per thread, a few microseconds). Several matrices that read the same input
// (q/k/v, gate/up) go through one dispatch.
bool input_split_applies(const detail::PackedActs& a, const ref::GptqMatrix& w, int64_t threads) {
  return threads > 1 && w.rows % 16 == 0 && a.n_blocks >= 2 * threads;
}

void gemv_split_input(const detail::PackedActs& a, std::span<const ref::GptqMatrix* const> ws, std::span<float* const> ys) {
  ThreadPool& pool = ThreadPool::global();
  const int64_t threads = pool.size();
  int64_t total_rows = 0;
  for (const ref::GptqMatrix* w : ws) total_rows += w->rows;
  thread_local std::vector<float> partial;
  partial.resize((threads - 1) * total_rows);
  float* parts = partial.data();
  pool.parallel_for(threads, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t b0 = a.n_blocks * t / threads, b1 = a.n_blocks * (t + 1) / threads;
      int64_t offset = 0;
      for (size_t m = 0; m < ws.size(); ++m) {
        float* out = t == 0 ? ys[m] : parts + (t - 1) * total_rows + offset;
        HWY_DYNAMIC_DISPATCH(VnniGemv)(a, *ws[m], 0, ws[m]->rows, b0, b1, out);
        offset += ws[m]->rows;
      }
    }
  });
  int64_t offset = 0;
  for (size_t m = 0; m < ws.size(); ++m) {
    for (int64_t t = 1; t < threads; ++t) {
      const float* p = parts + (t - 1) * total_rows + offset;
      for (int64_t o = 0; o < ws[m]->rows; ++o) ys[m][o] += p[o];
    }
    offset += ws[m]->rows;
  }
}

}  // namespace

bool gptq_matmul_supports(const ref::GptqMatrix& w) {
  if ((w.bits != 4 && w.bits != 8) || w.g_idx != nullptr || w.group_size <= 0) return false;
  const int per_word = 32 / w.bits;
  const int64_t block = activation_block(w);
  return w.group_size % per_word == 0 && w.cols % per_word == 0 && w.cols % block == 0 && w.rows % per_word == 0 &&
         w.stride() >= w.rows;
}

int64_t preferred_word_row_stride(int64_t rows) {
  // The GEMVs sweep 16 word rows at once. Their start addresses modulo a 4 KiB page decide the L1 sets (and the
  // DRAM banks) the 16 streams share: with rows * 4 a multiple of 4 KiB they all share one. Accept a stride
  // whose 16 offsets are at least 256 bytes apart around the page (rows + 64 for the Llama shapes: 4096,
  // 14336, ...); padding in steps of 16 words keeps word rows 64-byte aligned, and at most rows / 8 of it.
  constexpr int64_t kStreams = 16, kPage = 4096, kMinGap = 256;
  const auto spread = [&](int64_t stride) {
    std::array<int64_t, kStreams> offsets;
    for (int64_t k = 0; k < kStreams; ++k) offsets[k] = k * stride * 4 % kPage;
    std::sort(offsets.begin(), offsets.end());
    int64_t gap = kPage - offsets.back() + offsets.front();
    for (int64_t k = 1; k < kStreams; ++k) gap = std::min(gap, offsets[k] - offsets[k - 1]);
    return gap >= kMinGap;
  };
  if (rows <= 0 || spread(rows)) return rows;
  for (int64_t stride = (rows + 15) / 16 * 16; stride - rows <= rows / 8; stride += 16) {
    if (spread(stride)) return stride;
  }
  return rows;
}

void gptq_matmul(const float* x, int64_t n_rows, const ref::GptqMatrix& w, float* y) {
  if (!HWY_DYNAMIC_DISPATCH(HasVnni)()) {
    thread_local Scratch scratch;
    const detail::PairedActs a = pair_activations(x, n_rows, w, scratch);
    if (n_rows == 1) {
      constexpr int64_t kUnit = 64;  // channels per scheduling unit
      const int64_t units = (w.rows + kUnit - 1) / kUnit;
      ThreadPool::global().parallel_for(units, [&](int64_t b, int64_t e) {
        HWY_DYNAMIC_DISPATCH(MaddGemv)(a, w, b * kUnit, std::min(w.rows, e * kUnit), y);
      });
    } else {
      const int64_t panels = (w.rows + detail::kMaddPanel - 1) / detail::kMaddPanel;
      ThreadPool::global().parallel_for(panels, [&](int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(MaddGemm)(a, w, b, e, y); });
    }
    return;
  }
  thread_local Scratch scratch;
  if (n_rows == 1) {
    const detail::PackedActs a = pack_activations(x, 1, w, 1, scratch);
    ThreadPool& pool = ThreadPool::global();
    const int64_t threads = pool.size();
    if (input_split_applies(a, w, threads)) {
      const ref::GptqMatrix* ws[] = {&w};
      float* ys[] = {y};
      gemv_split_input(a, ws, ys);
      return;
    }
    constexpr int64_t kUnit = 64;  // channels per scheduling unit: one 4-vector step
    const int64_t units = (w.rows + kUnit - 1) / kUnit;
    pool.parallel_for(units, [&](int64_t b, int64_t e) {
      HWY_DYNAMIC_DISPATCH(VnniGemv)(a, w, b * kUnit, std::min(w.rows, e * kUnit), 0, a.n_blocks, y);
    });
    return;
  }
  const detail::PackedActs a = pack_activations(x, n_rows, w, detail::kTileRows, scratch);
  const int64_t panels = (w.rows + detail::kPanel - 1) / detail::kPanel;
  ThreadPool::global().parallel_for(panels, [&](int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(VnniGemm)(a, w, b, e, y); });
}

void gptq_matmul_shared_input(const float* x, int64_t n_rows, std::span<const ref::GptqMatrix* const> ws,
                              std::span<float* const> ys) {
  bool fuse = n_rows == 1 && !ws.empty() && HWY_DYNAMIC_DISPATCH(HasVnni)();
  for (const ref::GptqMatrix* w : ws) {
    fuse = fuse && w->cols == ws[0]->cols && w->bits == ws[0]->bits &&
           activation_block(*w) == activation_block(*ws[0]);
  }
  if (fuse) {
    thread_local Scratch scratch;
    const detail::PackedActs a = pack_activations(x, 1, *ws[0], 1, scratch);
    const int64_t threads = ThreadPool::global().size();
    for (const ref::GptqMatrix* w : ws) fuse = fuse && input_split_applies(a, *w, threads);
    if (fuse) {
      gemv_split_input(a, ws, ys);
      return;
    }
  }
  for (size_t m = 0; m < ws.size(); ++m) gptq_matmul(x, n_rows, *ws[m], ys[m]);
}

const char* best_target_name() {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  return targets.empty() ? "none" : hwy::TargetName(targets.front());
}

const char* gptq_matmul_variant() {
  return HWY_DYNAMIC_DISPATCH(HasVnni)() ? "AVX-512 VNNI, int16 activations (VPDPBUSD on split bytes)"
                                         : "int16 activations (VPMADDWD-style pair products, Highway)";
}

}  // namespace petrel::cpu
#endif  // HWY_ONCE
