// kernels/cuda: a 4-bit GEMV whose weights reach shared memory through Hopper's tensor copies (TMA), per warp,
// instead of through registers (gemv_gptq.cu). Written (session 37) to answer whether a consumer fed from shared
// memory keeps a 4-bit product's loop at least as fast as the register GEMV, whose bytes in flight the register
// file bounds: on H100s a tie, on an H200 faster (gate/up alone 19.5 against 20.9 us; the decode step +1.8 to
// +2.4%, session 40), so the model's decode step uses it for q/k/v and gate/up per channel where the memory
// bandwidth is an H200's, and at group 128 on every Hopper (+3.2% on an H100, session 41; CudaModelOptions::kTmaAuto);
// down too at group 128 on an H200 (+1.5%, session 43).
// petrel_bench_gemv_cuda --tma times it beside the register kernel, and tests/kernels_cuda_test.cc checks it against
// ref::matmul. gemv_tma.cu has the layout and the reasons.
#pragma once

#include <cstdint>
#include <span>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct GemvTmaOptions {
  int k_splits = 0;  // input slices (blocks along the input); 0: what gemv_gptq's planner takes for the matrix
  int stages = 3;    // stages of 8 steps (4 KB) in flight per warp: 1 to kMaxGemvTmaStages
  int prewait_stages = -1;  // of those, asked for before the wait for the previous kernel (-1: all); the rest after x is staged
  bool overlap_previous = false;  // programmatic dependent launch, as GemvOptions::overlap_previous
  // The next kernel's launch allowed only after this one's main loop, not at its start. At 79 registers four of
  // these blocks leave room on an SM for the next kernel's blocks (the register GEMV's 107-120 fill the register
  // file with four); the question was whether their early loads hurt this loop: in the decode step a late launch
  // lost 11-13% (H100, session 37), so no.
  bool late_dependents = false;
};
inline constexpr int kMaxGemvTmaStages = 6;

// OK when gemv_gptq_tma reads `w`: 4-bit, per channel (one group) or in groups of a multiple of 128 inputs that
// divides cols, whose zeros are all one value (DeviceGptqMatrix::uniform_zero: a symmetric grid), rows a multiple
// of 4, cols a multiple of 32, qweight 16-byte aligned.
Status gemv_gptq_tma_supports(const DeviceGptqMatrix& w);

// y[w.rows] += dequant(W) x[w.cols] on `stream` (float atomic adds: y must hold zeros, or what the product is
// to be added to; the order of the slices' adds varies). x and y 16-byte aligned device pointers.
Status gemv_gptq_tma(const DeviceGptqMatrix& w, const float* x, float* y, int multiprocessors, Stream stream = nullptr,
                     const GemvTmaOptions& options = {});

// The same for up to kMaxGemvGroupMembers matrices that read one input (gemv_gptq_grouped's grid: every member's
// row tiles side by side), each adding into its y. fusion.input may be kPlain, kRmsNorm (the norm applied as x
// is staged, as gemv_gptq does) or kSiluMul (down's input); fusion.clear zeroes up to two vectors after
// the wait for the previous kernel; no residual (y accumulates already: pass the residual as y).
Status gemv_gptq_tma_grouped(std::span<const GemvGroupMember> members, const float* x, int multiprocessors,
                             Stream stream = nullptr, const GemvTmaOptions& options = {}, const GemvFusion& fusion = {});

}  // namespace petrel::cuda
