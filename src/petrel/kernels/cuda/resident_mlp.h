// kernels/cuda: the decode step's MLP (gate/up, then down) in one launch whose blocks stream weights without a
// gap at the boundary between the two products (session 42; docs/RESIDENT_STEP.md, step 3 of its plan).
//
// In the five-launch step, down's blocks reach an SM only as gate/up's leave it, so the bytes in flight drop at
// gate/up's tail and down's first bytes wait for its launch. Here every block is resident for both products:
// each warp's ring of tensor-copy stages (gemv_tma.cu's stage, its arithmetic) is refilled in one sequence that
// runs from the block's gate/up stages straight into its down stages, while the block waits at the one grid-wide
// barrier between the products for the others' gate/up sums. Both products are cut into equal runs of stages
// per block (a run may cross a row tile), so that every SM streams the same bytes.
//
// Per channel 4-bit weights only; hidden a multiple of 256 up to 4096, intermediate a multiple of 256.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct ResidentMlpOptions {
  int stages = 2;  // 4 KB tensor-copy stages in flight a warp, 1 to kMaxResidentMlpStages
  int blocks_per_sm = 4;  // at most (fewer where shared memory allows fewer); every block must be resident at once
  bool overlap_previous = false;  // programmatic dependent launch (the stages asked for before the wait)
};

inline constexpr int kMaxResidentMlpStages = 4;

// OK when resident_mlp takes these three matrices (see the file comment).
Status resident_mlp_supports(const DeviceGptqMatrix& gate, const DeviceGptqMatrix& up, const DeviceGptqMatrix& down);

// residual[hidden] += down (SiLU(gate n) * (up n)), n = RMSNorm(residual) * norm.norm_weight (norm.input must be
// kRmsNorm), in one launch. gate_out and up_out [intermediate] must hold zeros (the gate/up sums are added into
// them); counters: 2 uint32 of device memory, zero before the first launch (each launch leaves them zero).
// norm.clear[0..1] and also `clear_also` are zeroed after the wait. Float atomics: the sums' order varies.
Status resident_mlp(const DeviceGptqMatrix& gate, const DeviceGptqMatrix& up, const DeviceGptqMatrix& down,
                    float* residual, const GemvFusion& norm, float* gate_out, float* up_out, uint32_t* counters,
                    int multiprocessors, Stream stream, const ResidentMlpOptions& options = {},
                    GemvFusion::Clear clear_also = {});

}  // namespace petrel::cuda
