// kernels/cuda: the token generator's whole MLP in one launch, for one activation vector:
//   x += down(SiLU(gate(n)) * up(n)),  n = RMSNorm(x) (norm_weight, eps),
// with gate, up and down 4-bit GPTQ matrices read in place (the layout of gemv_gptq.h). It replaces the fused
// step's two launches (gate/up grouped GEMV with the RMSNorm in its staging, then down with SiLU*up in its
// staging and the residual add) by one whose blocks depend on nothing but the kernel before it: block j
// computes intermediate elements 32 j .. 32 j + 31 completely (their gate and up rows over the whole input),
// then adds down's columns 32 j .. 32 j + 31 times those 32 values into x with float atomics. So there is no
// wait between gate/up and down, no gate/up output in global memory and no second ramp and tail.
// mlp_fused.cu says how a block streams and why.
//
// Numerics: gate and up are bitwise the fused step's (the same fragments, promotions and, as its two input
// slices added into zeros, the same sums); SiLU*up as elementwise.cu, rounded to fp16 as down's staging does;
// down's sums are float32 per 32-input slice, added into x in an order that varies from run to run (as the
// fused step's atomic split-K). So x agrees with the two-launch path to float32 rounding.
#pragma once

#include <cstdint>

#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

struct MlpFusedWeights {
  const DeviceGptqMatrix* gate = nullptr;  // [intermediate, hidden]
  const DeviceGptqMatrix* up = nullptr;    // [intermediate, hidden]
  const DeviceGptqMatrix* down = nullptr;  // [hidden, intermediate]
  DeviceVector norm_weight;                // [hidden]: the post-attention RMSNorm
  float norm_eps = 0.0f;
};

// OK when decode_mlp_fused runs these shapes: 4-bit gate, up and down; gate and up of one shape and group size,
// per channel or groups of a multiple of 128 inputs; hidden a multiple of 128; intermediate a multiple of 32;
// down per channel or groups of a multiple of 32 inputs.
Status decode_mlp_fused_supports(const MlpFusedWeights& w);

// x[hidden] += down(SiLU(gate(RMSNorm(x))) * up(RMSNorm(x))), in place (16-byte aligned). `barrier`: two device
// uint32 counters, zero before the first launch; each launch leaves them zero (one pair per stream: launches
// that may run at once must not share one). `clear`: up to 3 buffers (16-byte aligned, counts multiples of 4)
// zeroed after the wait, as GemvFusion::clear. overlap_previous: programmatic dependent launch (gemv_gptq.h's
// GemvOptions::overlap_previous). Refused (unsupported) where the grid, intermediate / 32 blocks of 128
// threads, cannot be resident on the GPU at once.
inline constexpr uint32_t kMlpProbeNoAdds = 1, kMlpProbeNoDown = 2;
struct MlpFusedOptions {
  bool overlap_previous = false;
  // Before the wait, steps 8 .. 15 of each block's gate/up weights (the first 8 go into registers) asked into
  // L2, as gemv_gptq's default GemvOptions::l2_prefetch_steps does.
  bool l2_prefetch = true;
  // Diagnostic only (x is then wrong): kMlpProbeNoAdds computes down's sums but adds nothing into x;
  // kMlpProbeNoDown leaves down out (no loads, no sums). What the step loses with each is what it costs.
  uint32_t probe = 0;
  GemvFusion::Clear clear[3];
};
Status decode_mlp_fused(const MlpFusedWeights& w, float* x, uint32_t* barrier, Stream stream,
                        const MlpFusedOptions& options = {});

}  // namespace petrel::cuda
