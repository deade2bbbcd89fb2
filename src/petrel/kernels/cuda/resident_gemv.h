// kernels/cuda: a chain of the token generator's GEMVs (the products between two attention calls: o, gate/up,
// down, and the next layer's q/k/v) in ONE launch whose blocks stay resident, stream every product's weights
// through a shared-memory ring filled by Hopper's bulk copy engine, and wait for each other through counters
// instead of kernel boundaries. resident_gemv.cu says how and why (docs/RESIDENT_STEP.md has the plan).
//
// Each product ("phase") is gemv_gptq_grouped's: the same members, fused input (RMSNorm, SiLU*up) and
// residual, cut into the same row tiles and into the input slices of plan_gemv_gptq_grouped's plan with
// GemvOptions::k_splits = ResidentGemvChains::k_splits (for the given multiprocessor count and partial
// capacity), and summed in the same order, so every output is bitwise what the chain of gemv_gptq_grouped
// launches with those k_splits writes (tests/kernels_cuda_test.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/status.h"

namespace petrel::cuda {

// One product of a chain: y_i = W_i op(x) (+ residual), as gemv_gptq_grouped(members, x, ..., fusion).
struct ResidentGemv {
  std::vector<GemvGroupMember> members;  // 1 to kMaxGemvGroupMembers
  const float* x = nullptr;
  GemvFusion fusion;
};

inline constexpr int kMaxResidentPhases = 4;

struct ResidentGemvOptions {
  // Blocks of 128 threads per SM: 0 for as many as fit (at most 4); tests use 1 to give each block many units.
  int max_blocks_per_sm = 0;
  // Input slices of each product: the fewest (a power of two) that leave at most 256 packed words a slice and
  // at least this many steps of 4 words (a unit's first stage, parameters and epilogue are fixed costs);
  // 0: gemv_gptq_grouped's own plan (many more, smaller slices: its blocks do not stream across products).
  int min_unit_steps = 32;
  // The order units are handed out in within a product. Slices outermost: every row tile's first slice, then
  // every tile's second, ...: blocks that take units at about the same time read neighbouring row tiles of the
  // same packed words, as the grouped GEMV's blocks do (DRAM pages read while open). Tiles outermost: a tile's
  // slices one after another (session 11's order). Same sums, same bits either way.
  bool slices_outermost = true;
  // Experiment (session 12): stream each member's weights from a tiled copy made on the GPU in create()
  // (every 128-row tile's 16-word stages as contiguous 8 KB: one 1D bulk copy a stage instead of a 2D tensor
  // copy of 16 runs of 512 bytes; 4 bits a weight more device memory). Same arithmetic, same bits.
  bool tiled_copy = false;
};

// OK when a chain can run resident: 1 to kMaxResidentPhases products, each accepted by gemv_gptq_grouped, with
// 4-bit weights, cols a multiple of 32, and a slice of x (as planned) of at most 256 packed words.
Status resident_gemv_supports(std::span<const ResidentGemv> chain, int multiprocessors, int64_t partial_capacity,
                              const ResidentGemvOptions& options = {});

// The resident chains of a decode step, planned once (launch plans, device descriptors, counters and partial
// sums of their own) and launched each step in order; one per stream. Created on the current device.
class ResidentGemvChains {
 public:
  // `partial_capacity` is the GemvWorkspace capacity whose plans the chains reproduce.
  static Result<ResidentGemvChains> create(std::span<const std::vector<ResidentGemv>> chains, int64_t partial_capacity,
                                           const ResidentGemvOptions& options = {});
  ResidentGemvChains();  // no chains
  ResidentGemvChains(ResidentGemvChains&&) noexcept;
  ResidentGemvChains& operator=(ResidentGemvChains&&) noexcept;
  ~ResidentGemvChains();

  int size() const;
  // Launches chain `index`. overlap_previous: it may start while the kernel before it finishes (programmatic
  // dependent launch): its blocks request their first weights before they wait for that kernel.
  Status enqueue(int index, Stream stream, bool overlap_previous) const;
  // Blocks of each launch (all resident together) and the weight bytes a chain reads (the benchmark's floor).
  int grid_blocks() const;
  // The input slices product `product` of chain `chain` is cut into (GemvOptions::k_splits for the same bits).
  int k_splits(int chain, int product) const;
  // Benchmark only (bench/resident_cuda_bench.cc): leave parts of the work out to see what each costs. The
  // outputs are then wrong. kSkipEpilogue counts no tile final, so it needs kSkipWaits.
  enum Probe { kSkipWaits = 1, kSkipMath = 2, kSkipStaging = 4, kSkipParams = 8, kSkipEpilogue = 16 };
  void set_probe(int flags);
  int64_t weight_bytes(int index) const;

 private:
  struct Impl;
  explicit ResidentGemvChains(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace petrel::cuda
