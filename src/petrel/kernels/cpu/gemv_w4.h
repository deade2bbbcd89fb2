// kernels/cpu: SIMD kernels (Google Highway, compiled for every target and chosen at run time).
//
// gemv_w4_gptq: y[rows] = dequant(w) x for a 4-bit (or 8-bit: the LM head) GPTQ matrix read in place (no repacking), the token
// generator's shape. The GPTQ layout packs 8 input codes per int32 along the input dimension and lays words
// out [in/8, out], so consecutive output channels are consecutive words: the kernel vectorizes across output
// channels (one lane per channel), walks the input 8 codes at a time, and applies scale and zero once per group:
//   y[o] = sum_g scale[g,o] * (sum_{i in g} x[i] code[i,o] - zero[g,o] sum_{i in g} x[i]).
// Preconditions: bits 4 or 8, no act-order g_idx, group_size a multiple of the codes per word. Tested against
// ref::matmul(GptqMatrix) on every compiled target (tests/kernels_cpu_test.cc).
#pragma once

#include "petrel/kernels/ref/ops.h"

namespace petrel::cpu {

// True when gemv_w4_gptq handles `w`.
bool gemv_w4_gptq_supports(const ref::GptqMatrix& w);

// y[w.rows] = dequant(w) * x[w.cols]. Parallel over output channels with the global thread pool.
void gemv_w4_gptq(const float* x, const ref::GptqMatrix& w, float* y);

// The Highway target the dispatcher picks on this CPU ("AVX3", "AVX2", ...).
const char* best_target_name();

}  // namespace petrel::cpu
