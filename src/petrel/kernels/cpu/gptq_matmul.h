// kernels/cpu: the W4A16 matrix products of the token generator (one row, GEMV) and the prompt processor
// (a chunk of rows, GEMM), on GPTQ matrices read in place (4-bit layers, the 8-bit LM head). Google Highway
// compiles the file once per x86/ARM target and picks the best one at run time.
//
// Two implementations, one per kind of target:
//
//  * AVX-512 VNNI (Highway's AVX3_DL target: Ice Lake, Sapphire/Emerald Rapids, Zen 4 and later).
//    Activations are quantized per row to int16 with one float scale per block of `block` input columns
//    (block = gcd(group size, 128)), i.e. 16-bit activations with ~1.5e-5 of the block's max as the step,
//    tighter than fp16 for all but the block's largest values. Each int16 is split into a signed high and low
//    byte (q = 256 hi + lo) so that VPDPBUSD (u8 x s8 -> int32, 64 products per instruction) multiplies the
//    unsigned 4-bit codes straight out of the GPTQ words: per 32-bit word, (w & 0x0F0F0F0F) holds codes 0,2,4,6
//    and (w >> 4 & 0x0F0F0F0F) codes 1,3,5,7 as bytes; the activations are packed in that order once per call.
//    Integer dot products per block are exact; per block and output channel
//        y[o] += scale[g, o] * act_scale[b] * (dot_b[o] - zero[g, o] * sum_b(q)),
//    which covers per-channel (one group) and grouped weights alike. The 8-bit LM head's words already hold
//    four byte codes. One lane per output channel (consecutive channels are consecutive words in GPTQ's
//    [in / codes_per_word, out] layout).
//    GEMV: for each block, sweep the thread's output range with 16 rows of words in flight (16 sequential
//    streams), 64 channels per step, accumulating into y.  GEMM: panels of 128 channels per task; for each tile
//    of 6 rows, 32 channels x 6 rows of int32 accumulators (24 zmm) live across a block; the panel's weights
//    stay in L2 across the tiles.
//  * Every other target (AVX2, AVX-512 without VNNI, SSE4, NEON): the same int16 activations in pairs, and
//    ReorderWidenMulAccumulate (VPMADDWD on x86: int16 x int16 -> int32, two products a lane) on pairs of codes
//    unpacked with one shift and one mask each ((w >> 4j) & 0x000F000F: codes j and j + 4 of a 4-bit word);
//    same per-block formula. GEMV: 2 vectors of channels x up to 16 word rows per sweep (16 sequential
//    streams); GEMM: panels of 64 channels copied contiguous (in place, their word rows may lie a multiple of
//    4 KiB apart and share cache sets), tiles of 4 rows x 2 vectors whose 8 accumulators stay in registers.
//    Details in gptq_matmul.cc.
//
// Preconditions (gptq_matmul_supports): bits 4 or 8, no act-order g_idx, in-features a multiple of
// gcd(group size, 128) and of the codes per word; qweight's word rows may be padded (GptqMatrix::stride()).
// Tested against ref::matmul(GptqMatrix) on every compiled target with random and awkward shapes and strides
// (tests/kernels_cpu_test.cc).
#pragma once

#include <cstdint>
#include <span>

#include "petrel/kernels/ref/ops.h"

namespace petrel::cpu {

// True when gptq_matmul handles `w`.
bool gptq_matmul_supports(const ref::GptqMatrix& w);

// The qweight word-row stride (int32 words, >= rows) at which these kernels read a matrix of `rows` output
// channels fastest: `petrel export --backend cpu` pads qweight to it (bundle layout "padded_rows"). `rows`
// itself when no padding of at most rows / 8 helps. AVX2 EPYC, GEMV on 4096 x 4096 4-bit: 15.2 GB/s at stride
// 4096, 19.6 at 4160 (docs/PERFORMANCE.md, session 24).
int64_t preferred_word_row_stride(int64_t rows);

// y[n_rows, w.rows] = x[n_rows, w.cols] * dequant(w)^T. Parallel over output channels with the global pool.
void gptq_matmul(const float* x, int64_t n_rows, const ref::GptqMatrix& w, float* y);

// ys[m][n_rows, ws[m]->rows] = x * dequant(*ws[m])^T for matrices that read the same input (q/k/v, gate/up):
// the activations are packed once and, for one row, all the GEMVs run in a single dispatch of the thread pool.
// Each w must be supported (gptq_matmul_supports) and have the same in-features.
void gptq_matmul_shared_input(const float* x, int64_t n_rows, std::span<const ref::GptqMatrix* const> ws,
                              std::span<float* const> ys);

// The Highway target the dispatcher picks on this CPU ("AVX3_DL", "AVX2", ...).
const char* best_target_name();

// What gptq_matmul runs on this CPU, in words (for `petrel doctor` and bench labels).
const char* gptq_matmul_variant();

}  // namespace petrel::cpu
