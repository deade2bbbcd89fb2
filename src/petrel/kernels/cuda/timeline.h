// kernels/cuda: a block timeline of the token generator's kernels, for finding where a decode step's time goes
// (a diagnostic: nothing in the product turns it on; bench/decode_cuda_bench.cc's --timeline does).
//
// While a ring is installed (set_timeline), the launches that follow (the decode GEMVs and attention; CUDA
// graphs capture the choice) run instrumented builds of their kernels: thread 0 of every block reads the GPU's
// global nanosecond clock at up to nine points and, as the block ends, appends one 48-byte record to the ring. The
// product's kernels are separate instantiations without any of this (the GEMV's register schedule is fragile,
// gemv_gptq.cu), so installing nothing costs nothing.
//
// Record (12 x uint32): tag (the low 32 bits of the launch's first weight or KV pointer: one launch of a step),
// kind | smid << 16, block (blockIdx.y * gridDim.x + blockIdx.x, 16 bits) | steps << 16 (input steps of 4
// packed words the block reads: 2 KB of weights a step over its 128 rows), t0 (low 32 bits of %globaltimer
// at the block's start), then t1..t8 - t0 in ns: t1 after the wait for the previous kernel, t2 after the
// input is staged, t3 after the main loop, t8 at the end (a split-K reduction included); RMSNorm GEMVs also t4
// after the sum of squares (x read, reduced over the block); every GEMV t5 just before its wait (its weight
// loads, L2 prefetches and copies issued: session 17); t4..t7 for
// attention, whose t2 is "queries rotated, the token's key and value stored", t3 "the first round's KV chunks
// in shared memory", t4 "its scores and softmax done", t5 "its values summed", t6 "all rounds done", t7 "slots
// merged and written"; 0xFFFFFFFF for a point a block did not reach (attention blocks past the sequence return
// before the wait).
// Kinds: 0x10 * bits + GemvInput (0 plain, 1 RMSNorm, 2 SiLU*up) for the GEMVs, 0x100 for decode attention.
// scripts/timeline_report.py reads what the bench writes.
#pragma once

#include <cstdint>

namespace petrel::cuda {

struct TimelineRing {
  uint32_t* records = nullptr;  // device memory, capacity * kTimelineWords words
  uint32_t* count = nullptr;    // device memory: records appended (past capacity: dropped, still counted)
  uint32_t capacity = 0;
  // Diagnostic variants of the instrumented kernels (bits; 0 for the plain timeline). They change what the
  // kernels compute, so their outputs are wrong: for timing questions only (bench `-probeN` variants).
  //   kProbeNormSliceOnly: RMSNorm GEMVs sum the squares of their own input slice only, not all of x;
  //   kProbeNormNoWeight: RMSNorm GEMVs read no norm weights (1);
  //   kProbeTouchArgs: the GEMVs and attention read every parameter they use after the wait before it;
  //   kProbeAttentionStopAfterWait / AfterQueries / AfterChunks: decode attention's blocks return right after the
  //     wait, after the queries are rotated and the token's row stored, or after their chunks (no merge, no
  //     output), where a block holds every position (a short cache: one active block a KV head); so that the
  //     step's time without the rest of the chain says what that part costs in the overlapped step;
  //   kProbePlainGemvStopAfterWait: the 4-bit plain-input GEMVs (o) return right after the wait;
  //   kProbeNormFewReaders: in RMSNorm GEMVs only blocks with blockIdx.x % 8 == 0 read x from L2, the others
  //     take whatever their shared memory holds: the L2 traffic of x if a cluster of 8 blocks shared one copy;
  //   kProbeSiluAddsElsewhere: the SiLU*up GEMV (down) with atomic split-K adds its slices into the workspace's
  //     partials instead of its output (the residual x stays as it was);
  //   kProbeSiluStores: the same GEMV stores its slices' sums instead of adding them (wrong sums, no atomics);
  //   kProbeSiluFence: the same GEMV's threads fence (__threadfence) after their adds, before the block ends
  //     (the right sums: whether the adds' completion at the grid's end is what the next launch waits for).
  uint32_t probe = 0;
};
constexpr uint32_t kProbeNormSliceOnly = 1, kProbeNormNoWeight = 2, kProbeTouchArgs = 4, kProbeAttentionStopAfterWait = 8,
                   kProbeAttentionStopAfterQueries = 16, kProbeAttentionStopAfterChunks = 32,
                   kProbePlainGemvStopAfterWait = 64, kProbeNormFewReaders = 128,
                   kProbeSiluAddsElsewhere = 256, kProbeSiluStores = 512, kProbeSiluFence = 1024;
constexpr int kTimelineWords = 12;
constexpr int kTimelineStamps = 9;  // t0 .. t8
constexpr uint32_t kTimelineAttention = 0x100;

// Installs `ring` (copied) for the launches that follow, or removes it (nullptr). Not thread-safe: set it
// before the model's first step (its graphs are captured then).
void set_timeline(const TimelineRing* ring);
// The installed ring, or nullptr.
const TimelineRing* active_timeline();

}  // namespace petrel::cuda
