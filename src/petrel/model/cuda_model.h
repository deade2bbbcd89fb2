// The token generator on an NVIDIA GPU: a LlamaModel's weights uploaded once to the device, its KV cache
// (fp16) on the device, and a forward pass of ONE token at a time whose logits come back to the host.
// No CUDA type appears here; the kernels are in kernels/cuda. In a build without the CUDA backend
// (PETREL_HAVE_CUDA unset) create() fails with "the CUDA backend is not built".
//
// Weights: GPTQ linears (4-bit layers, 8-bit LM head) go to the W4A16 GEMV (kernels/cuda/gemv_gptq.cu) in
// their checkpoint layout; act-order (g_idx) checkpoints and group sizes that GEMV does not read are refused
// with the tensor's name. Dense linears of float checkpoints (F32/F16/BF16, also a tied LM head and weights
// LlamaModel dequantized at load) are kept in their stored dtype and go through kernels/cuda/gemv_dense.cu.
// Norms and the embedding table stay in their stored dtype.
//
// The step, in the order of LlamaModel::forward: embedding; per layer RMSNorm (with the previous residual add
// fused), q/k/v GEMVs (side by side on three streams), RoPE + fp16 KV store, split-K decode attention, o_proj,
// residual add + RMSNorm, gate/up GEMVs (side by side), SiLU*up, down; final residual add + RMSNorm; LM head.
// With GPTQ decoder linears the step is fused by default (CudaModelOptions::fused_step): per layer a q/k/v
// grouped GEMV with the RMSNorm in its input staging, one RoPE + KV store + attention + combine kernel, the
// o_proj GEMV adding into the residual stream, a gate/up grouped GEMV with the RMSNorm, and the down GEMV with
// SiLU*up in and the residual add out: five launches (optionally each overlapping the one before it).
// Every kernel reads the token and the position from device memory, so the step is captured once in a CUDA
// graph and replayed: one graph per output (no LM head; the LM head with the logits written into pinned host
// memory; the LM head with its top-k chosen on the GPU), each a single launch a token with the token's input
// copied in by its first node.
//
// Numerics against the CPU (LlamaModel with an fp16 KV cache): same formulas; GPTQ GEMVs round activations
// to fp16 inside the matrix unit; float32 sums in other orders. Tests: tests/cuda_model_test.cc.
//
// Prompts (forward() with more than one token) go through the prompt processor: chunks of up to
// CudaModelOptions::prefill_chunk tokens, each layer's linears as one matrix-matrix product over the chunk
// (kernels/cuda/gemm.h: fused W4A16 tensor-core kernel for short chunks, dequantize + cuBLAS for long ones),
// RoPE and KV store of all rows at once, and causal attention over the cache with two batched cuBLAS products
// (kernels/cuda/attention_prefill.cu). Its logits agree with the token generator's to within fp16 rounding of
// the activations (tests/prefill_cuda_test.cc).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "petrel/io/hf_config.h"
#include "petrel/model/llama.h"
#include "petrel/util/status.h"

namespace petrel {

enum class PrefillF16Weights { kAuto, kOff, kOn };
// "auto", "off" or "on" (for the command line); kInvalidArgument otherwise.
Result<PrefillF16Weights> parse_prefill_f16_weights(const std::string& text);

struct CudaModelOptions {
  int device = 0;                 // as the CUDA runtime numbers GPUs
  int64_t context_length = 4096;  // KV cache positions on the device; clamped to max_position_embeddings
  bool use_graph = true;          // replay the step from a CUDA graph (false: launch kernel by kernel)
  int64_t attention_split = 0;    // KV positions per attention block; 0: chosen from the context length
  // The decode step's kernel sequence. true: for checkpoints whose decoder linears are all GPTQ, five launches
  // per layer, the element-wise steps fused into the GEMVs and attention around them (cuda_model.cc); false,
  // or a float checkpoint: the unfused sequence (eleven launches per layer, side streams), kept for comparison.
  bool fused_step = true;
  // In the fused step, each kernel may start while the one before it finishes (programmatic dependent launch;
  // Hopper and later GPUs, ignored on older ones). On since the attention kernel stages its KV chunks before it
  // waits (2026-12-03, H200, 8B tg128: 471.9 tok/s against 432.5 without per channel, 428.2 against 385.4 at
  // group 128); it had been off while it cost 2-4% (docs/PERFORMANCE.md).
  bool overlap_kernels = true;
  // With overlap_kernels on a GPU with the bulk copy engine (Hopper and later), the fused step runs the GEMVs
  // between two attention calls (o, gate/up, down, the next layer's q/k/v) as one launch of resident blocks
  // (cuda::ResidentGemvChains, kernels/cuda/resident_gemv.cu): two launches per layer instead of five. Where a
  // checkpoint's shapes do not fit it, the five-launch step runs. Off: not yet faster (8B per channel on an
  // H200, 2026-12-04: 341 with resident_tiled_copy against 496 tok/s; docs/RESIDENT_STEP.md says why and what
  // comes next).
  bool resident_step = false;
  // The resident step's input slices: at least this many steps of 4 packed words each (0: the fused step's
  // slices, and then its bits; cuda::ResidentGemvOptions::min_unit_steps).
  int resident_min_unit_steps = 32;
  // The resident step streams its weights from a tiled, bank-swizzled copy made on the GPU at load
  // (cuda::ResidentGemvOptions::tiled_copy: 14-17% faster chains, session 12; half a byte a weight more device
  // memory, and a repacking at load that a default path may not do: the issue wants the bundle's layout read
  // as written). Ignored without resident_step.
  bool resident_tiled_copy = false;
  // With overlap_kernels, steps of weights each GEMV block prefetches into L2 before it waits for the previous
  // kernel (cuda::GemvOptions::l2_prefetch_steps; 0: none). 16: a tie with 0 per channel, +1.4% at group 128;
  // 64 was 5% slower. Rechecked in session 13's step (H200): 16 beats 0 by 3% and 64 by 5%. The fused decode
  // step's products take decode_l2_prefetch (below) where it is set.
  int gemv_l2_prefetch_steps = 16;
  // The fused step's GEMVs reduce their split-K sums in thread-block clusters (cuda::GemvOptions::cluster_reduce).
  bool gemv_cluster_reduce = false;
  // The decode step's logits (decode(), decode_logits()) are written by the LM head straight into pinned host
  // memory mapped into the device (zero-copy: 513 KB a token for Llama-3.1-8B goes over the bus while the LM
  // head runs) instead of into device memory and then copied. Either way the token's input, the step, the LM
  // head and the logits' way to the host are one graph launch (the fused step also folds its final RMSNorm
  // into the LM head's staging). false: device buffer + copy (kept for comparison; docs/PERFORMANCE.md).
  bool logits_to_mapped_host = true;
  // The fused step's input splits per GEMV (cuda::GemvOptions::k_splits; 0: the planner's choice, which was
  // tuned on each matrix alone, not inside the step). Session 13 (H200) took o in 8 slices where the planner
  // takes 16 for Llama-3.1-8B's 4096 x 4096 (519.5 against 513.9 / 515.4 tok/s per channel); since session 32
  // the planner's 16 again: with decode_shared_carveout 60 (below) it gains 1.3% per channel and at group 128
  // over 8 slices without it (H100, three runs each), though alone it ties per channel (-0.7% to +0.1%) and
  // gains 0.4-1% at group 128 (docs/PERFORMANCE.md, session 32). Every other product's change lost there and
  // in session 13. The decode bench's "fused-splits-" variants.
  struct DecodeSplits {
    int qkv = 0, o = 0, gate_up = 0, down = 0;
  } decode_splits;
  // The fused step's L2 prefetch steps per product (cuda::GemvOptions::l2_prefetch_steps; -1:
  // gemv_l2_prefetch_steps); down_grouped is down's where its weights have groups
  // (group 128). Tuned per product in session 28 (8B on an H100, docs/PERFORMANCE.md; bench suffixes -pfqN,
  // -pfoN, -pfgN, -pfdN): q/k/v 0 and gate/up 8 instead of 16 gave +1.4% per channel and +1.6% at group 128,
  // down 0 a further +1.2% at group 128 (and -0.6% per channel); more prefetch lost everywhere (gate/up 64:
  // -5%), as did gate/up's last steps copied into shared memory before its wait (2-6%, commit 85cb910): bytes
  // asked for around the waits slow the latency chains the step waits on.
  struct DecodePrefetch {
    int qkv = 0, o = -1, gate_up = 8, down = -1, down_grouped = 0;
  } decode_l2_prefetch;
  // The fused step's RMSNorm products that keep three batches of weight loads in flight per channel
  // (cuda::GemvOptions::deep_batches); the decode bench's suffix "-shallowN" turns it off for mask N (1 q/k/v,
  // 2 gate/up). Two for both ("-shallow3") gain 0.3-1.0% on H100s but lose 1.5% on an H200 (session 34,
  // docs/PERFORMANCE.md; three gained 1.2% there in session 16): three stay the default, the H200 being the target.
  struct DecodeDeepBatches {
    bool qkv = true, gate_up = true;
  } decode_deep_batches;
  // How many of the per-channel RMSNorm products' batches of weight loads in flight go out after their wait,
  // behind their reads of x, instead of before it (cuda::GemvOptions::late_batches; 0 none, up to 2; group 128
  // ignores it). The decode bench's suffix "-lateQG" (one digit each: q/k/v, gate/up), e.g. fused-late00.
  // {1, 1}: on an H200 (session 34, docs/PERFORMANCE.md) tg128 +1.5% and +1.8% after 500 positions, but then -7%
  // after 1,000, which session 35 traced to the build's 128 registers (four blocks filling the register file);
  // capped at 120, on an H100: tg128 +0.1%, +1.4 to +1.7% after 500 and 1,000 positions, a tie after 2,000.
  struct DecodeLateBatches {
    int qkv = 1, gate_up = 1;
  } decode_late_batches;
  // The fused step's 4-bit GEMVs at group 128 (slices of several groups) whose zeros are all one value (a
  // symmetric grid, petrel's default) decode the zeros once instead of at every group change, with three batches
  // of weight loads in flight (cuda::GemvOptions::uniform_zeros): tg128 at group 128 +3.7% on an H200 (before the
  // 120-register cap), 0 to +1.1% on H100s (session 35, docs/PERFORMANCE.md). The decode bench's suffix "-uz0"
  // turns it off. Bitwise the same logits.
  bool decode_uniform_zeros = true;
  // The fused step's gate/up (and q/k/v, past layer 0) products through cuda::gemv_gptq_tma_grouped (weights
  // brought into shared memory by tensor copies, this many 4 KB stages in flight per warp) instead of the register
  // GEMV. With atomic split-K only, per channel or in groups of a multiple of 128 inputs with uniform zeros
  // (gemv_gptq_tma_supports); elsewhere, and at 0, the register GEMV. kTmaAuto (the default): one stage each on
  // devices with tensor copies for group-wise weights, and for per-channel weights where the device's peak memory
  // bandwidth is at least kTmaAutoMinBandwidth; else the register GEMV (resolve_tma_stages). Measured
  // (docs/PERFORMANCE.md, sessions 37, 40 and 41), 8B, tg128: per channel on an H200 (~4.9 TB/s peak, 4.2 copy)
  // one stage for both +1.8 to +2.4% in four A/Bs (alone, gate/up's GEMV 19.5 against the register kernel's 20.9
  // us), +2.2% after 1,000 positions, +3% after 2,000; two or three stages, down through it, other slices or
  // carveouts lose; on H100s (~3.35 TB/s) a tie to -2.4%. At group 128 (gemv_tma's grouped build, session 41) on
  // an H100 +3.2% in two A/Bs (507.3 -> 523.4), +3.3% after 2,000 positions; either product alone less. The
  // decode bench's suffixes "-tmagS" and "-tmaqS" (0: the register GEMV; "-tmagSP": P of them before the wait;
  // "-tmagSPD": D = 1, late_dependents).
  static constexpr int kTmaAuto = -1;
  static constexpr int64_t kTmaAutoMinBandwidth = 4'000'000'000'000;  // bytes/s: the H200 on, H100s off
  int decode_tma_gate_up_stages = kTmaAuto;
  int decode_tma_qkv_stages = kTmaAuto;
  // down likewise (SiLU * up input; "-tmadS"). kTmaAuto (the default): one stage for group-wise weights where the
  // peak memory bandwidth is at least kTmaAutoMinBandwidth, else the register GEMV (resolve_tma_down_stages).
  // Measured (docs/PERFORMANCE.md, sessions 38, 40, 41 and 43), 8B: at group 128 on an H200 +1.5% tg128 (581.3
  // against 572.2 / 573.7; with o's too, 588.4 / 589.2 against o's alone 583.0 / 582.0) and a tie after 2,000
  // positions (504.2 against 503.6 / 504.4); at group 128 on an H100 -0.5%; per channel it loses everywhere (H100
  // -5.7%, H200 -3 to -5%).
  int decode_tma_down_stages = kTmaAuto;
  int decode_tma_o_stages = 0;     // o likewise (added into the residual; "-tmaoS"; session 40)
  int decode_tma_prewait = -1;  // stages asked for before the wait (-1: all; GemvTmaOptions::prewait_stages)
  bool decode_tma_late_dependents = false;  // the next launch allowed after the loop (GemvTmaOptions::late_dependents)
  // The fused step's GEMVs (all but layer 0's q/k/v) add their split-K sums straight into their outputs with
  // float atomics (cuda::GemvOptions::atomic_reduce; the outputs zeroed by earlier launches of the step) instead
  // of the last block of each row range adding the slices in a fixed order. That takes each product's split-K
  // epilogue (1.7-3.1 us: partials, fence, counter, a second pass) off the step's critical path: 8B on an
  // H200, 2026-12-04, tg128 515 -> 569 tok/s per channel and 467 -> 513 at group 128 (docs/PERFORMANCE.md,
  // session 14). The sums' order then varies from run to run, so logits are not bitwise
  // reproducible (they agree to float32 rounding: relative L2 against the unfused step as before); false gives
  // the ordered sums and the same bits on every run.
  bool decode_atomic_reduce = true;
  // The shared-memory carveout (percent; -1: none asked, the driver picks one per kernel) that the decode
  // step's overlapped launches ask for (cuda::ScopedLaunchCarveout). With the driver's choice, in a timeline
  // (session 32, H100, o in 8 slices) 95% of gate/up's blocks (~25-29 KB of shared memory each) started only as
  // o's last blocks ended: on an SM running two o blocks (~1.5 KB each) none started though registers had room
  // for two, while on SMs that attention's blocks (tens of KB) had used three started beside o's one.
  // One carveout for every launch lets each kernel's blocks start beside the one before, as registers allow,
  // but the kernels it lets in early slow the ones running: 100% (every SM at 228 KB) gave gate/up its early
  // start (its share of a layer 25.8 -> 23.7 us) and cost attention, o and down more (-1.2% tg128); 40% (100
  // KB: three gate/up blocks an SM) -15%; 50% -1%; 80% a tie; 60% +0.5%, and +1.3% with o in 16 slices (8B
  // on an H100, session 32; docs/PERFORMANCE.md). The decode bench's "-carveN" suffix.
  int decode_shared_carveout = 60;
  // A carveout for one phase of the fused step's layers instead of decode_shared_carveout (-1: that one); each
  // launch asks for its own (the attribute is per launch). Session 33 (H100, docs/PERFORMANCE.md): o and gate/up
  // at 100% start gate/up 3.4 us sooner but slow o more, -1.9% with o in 8 slices, a tie in 16; not used by
  // default. The decode bench's "-carvesQ-A-O-G-D" suffix.
  struct DecodeCarveouts {
    int qkv = -1, attention = -1, o = -1, gate_up = -1, down = -1;
  } decode_phase_carveouts;
  // The fused decode attention's blocks per KV head at most (cuda::DecodeAttentionShape::fused_max_blocks; 0:
  // one per 32 positions of the cache, at most 32, cut to what fits on the GPU at once). Sessions 17-18: capping
  // it lower at a 4,096-position cache (so that o launches during q/k/v) measured a tie.
  int64_t decode_attention_blocks = 0;
  // The fused decode attention's scores and value sums on tensor cores (cuda::DecodeAttentionShape::tensor_cores;
  // q and the probabilities in fp16); false: the float32 build.
  bool decode_attention_tensor_cores = true;
  // The fused decode attention's tensor-core build with its warm pass before the wait
  // (cuda::DecodeAttentionShape::warm_code); false: without (bench suffix -acold).
  bool decode_attention_warm = true;
  // Diagnostic only (the step's outputs are then wrong): launches of the fused step left out, a bit per phase of
  // every layer (kSkipQkv ... kSkipDown). What the step loses without a phase is that phase's marginal cost in
  // the overlapped pipeline: the most that fusing it away or speeding it up could give (bench suffix -skipN;
  // docs/PERFORMANCE.md, session 19).
  uint32_t decode_skip_phases = 0;
  static constexpr uint32_t kSkipQkv = 1, kSkipAttention = 2, kSkipO = 4, kSkipGateUp = 8, kSkipDown = 16;
  // Time every decode step on the GPU (two timed events around its graph launch): last_step_device_ms().
  bool time_steps = false;
  // Constrained decoding (JSON mode, structured outputs, forced tool calls) with greedy or top-k sampling through
  // decode_top_masked: the constraint's mask applied on the GPU, k logits to the host instead of the vocabulary.
  // Off: the host masks the whole vocabulary's logits (EngineOptions::cuda_host_masks, `petrel serve --host-masks`).
  bool constraint_mask_on_device = true;
  // Tokens per prompt-processor chunk. 0 or 1: prompts run token by token through the decode step (the
  // token generator's numerics exactly). Larger chunks use more scratch (gpu_memory_need says how much).
  int64_t prefill_chunk = 512;
  // Prompt chunks of up to cuda::kMaxGemvTokens (32) tokens (a chat turn: the time to first token) run q/k/v
  // (one grouped launch) and o through the batch GEMV (cuda::gemv_gptq_batch: the weights read once and
  // dequantized once for all tokens) instead of the GEMM, on checkpoints whose decoder linears are all 4-bit
  // GPTQ. 8B, 29 tokens, H200 (2026-12-03): prompt 6.42 -> 5.71 ms per channel, 6.66 -> 5.99 ms at group 128
  // (then 5.41 / 5.66 with the prompt processor's kernels overlapping: overlap_kernels). Since session 7 q/k/v
  // take the grouped GEMM instead where prefill_qkv_gemm applies (below), so by default this is o's path.
  bool batch_prefill = true;
  // With batch_prefill, gate/up (one grouped launch) and down (SiLU*up fused into its staging) too. Off by
  // default: slower than the GEMM there (all three: 6.56 / 7.07 ms in the run above; gate/up alone 5.43 /
  // 6.06): every row tile re-reads all tokens' x from L2, and down, with 4096 output rows and 14336 inputs, has
  // few tiles and many splits (gemv_gptq.cu).
  bool batch_prefill_gate_up = false;
  bool batch_prefill_down = false;
  // The prompt processor's MLP, where its linears run the fused GEMM (up to 160 tokens; cuda::gemm_gptq_group):
  // the post-attention RMSNorm (with its residual add) rides in the staging of x for gate and up, staged once
  // for both, gate and up are one product launch, and SiLU(gate) * up rides in down's staging: 5 launches
  // instead of 8. 8B on an H200, 2026-12-03: prompt of 29 tokens 5.37 -> 5.09 ms per channel (5.92 -> 5.81 at
  // group 128), 128 tokens 11.46 -> 11.00 ms (the one launch is what pays; docs/PERFORMANCE.md, session 7).
  bool fused_prefill_inputs = true;
  // With fused_prefill_inputs, q/k/v too: one fused-GEMM launch for the three (cuda::gemm_gptq_group) with the
  // input RMSNorm and its residual add in the staging, instead of rms_norm + the batch GEMV (short chunks) or
  // three GEMMs with their own stagings (up to 48 tokens, where the GEMM takes k and v). 29 tokens: 5.10 ->
  // 4.83 ms per channel, 5.82 -> 5.48 at group 128 (same run as above).
  bool prefill_qkv_gemm = true;
  // Run a few prompts and one decode step in create() (then forget them), so that the one-time costs of the
  // first launches (module loading, cuBLAS's kernel choice, the decode graph's capture) count in the init
  // time, not in the first query's time to first token.
  bool warm_up = true;
  // Device-to-device copies of 1 MiB made at the end of create() (then freed; skipped unless 258 MiB are
  // free). Why they help is not known, but a process that has made ~20 such copies runs the decode step faster
  // ever after: H100, 8B tg128, group 128 511.3 -> 519.7 and per channel 536.2 -> 544.8 tokens/s (+1.6%; the
  // same copies of 1 GiB after the model's creation; 64 MiB ones before it gave as much, one copy nothing,
  // memsets part of it; docs/PERFORMANCE.md, session 46), provided they run on another stream than the model's
  // (session 47, an H100: 507.3 none, 515.0 on their own stream, 507.0 on the model's); 5 copies give all of it,
  // 2 a third (session 48); the count matters, not the size or the operation: 21 copies or memsets of 1 MiB give
  // as much as 21 copies of 64 MiB, one memset of 64 MiB nothing (session 49, H100: per channel 534.6 none, 542.7
  // 21 x 1 MiB copies, 542.6 21 x 64 MiB), so they are 1 MiB now (was 64: 2.8 GB of traffic, ~1 ms of the init
  // time; CudaInitTimes::warm_copies_ms). 0: none.
  int warm_copies = 21;
  // The stream the warm copies run on (any but the model's gives the gain, above): kWarmOwnStream a stream
  // created for them and destroyed after, kWarmKeptStream one created for them and kept as long as the model,
  // kWarmModelStream the model's stream, kWarmLegacyStream CUDA's legacy default stream. All but the default
  // are kept for the bench's -wsN, which recorded each (docs/PERFORMANCE.md, session 47).
  enum WarmStream : int { kWarmOwnStream = 0, kWarmKeptStream = 1, kWarmModelStream = 2, kWarmLegacyStream = 3 };
  int warm_copies_stream = kWarmOwnStream;
  // An fp16 copy of every GPTQ decoder linear (dequantized on the GPU in create(): 2 bytes a weight, 14 GB
  // for Llama-3.1-8B), read by the prompt processor's long chunks (where kernels/cuda/gemm.h would dequantize
  // on every call: ~30% of a 512-token chunk's time on the H200) as plain cuBLAS products; same numerics.
  // Short chunks (up to 160 tokens) and decode keep reading the 4-bit weights. kAuto: on when the copies take
  // at most half of the GPU memory that would be left free without them (an 8B model on an 80 GB or larger
  // GPU: yes; on a 24 GB one: no).
  PrefillF16Weights prefill_f16_weights = PrefillF16Weights::kAuto;
};

// Where CudaModel::create's time went, in milliseconds of wall time.
struct CudaInitTimes {
  double upload_ms = 0;     // streams, workspaces and the weights copied to the device
  double f16_copies_ms = 0;  // the prefill_f16_weights copies
  double buffers_ms = 0;    // KV cache, activations and scratch
  double warm_up_ms = 0;     // CudaModelOptions::warm_up: a prompt per prefill kernel family and a decode step
  double warm_copies_ms = 0;  // CudaModelOptions::warm_copies
};

// What create() allocates on the device, computed from the host model before anything is uploaded.
struct GpuMemoryNeed {
  int64_t weight_bytes = 0;    // as uploaded (GPTQ codes, scales and zeros; dense matrices in their dtype),
                               // plus the fp16 copies of prefill_f16_weights
  int64_t kv_cache_bytes = 0;  // fp16 keys and values for context_length positions
  int64_t scratch_bytes = 0;   // activations, workspaces and a fixed headroom
  int64_t context_length = 0;
  int64_t total() const { return weight_bytes + kv_cache_bytes + scratch_bytes; }
};
GpuMemoryNeed gpu_memory_need(const LlamaModel& model, int64_t context_length, int64_t prefill_chunk = 512,
                              bool prefill_f16_weights = false);
// Fails with kUnsupported when `need` does not fit in `free_bytes`, naming both numbers, e.g.
// "not enough GPU memory on CUDA device 0 (NVIDIA H200): the model needs 5.10 GiB (5476083712 bytes: weights
// 4.60 GiB + fp16 KV cache 0.50 GiB for 4096 positions + scratch 0.01 GiB), 2.00 GiB (2147483648 bytes) is
// free of 139.80 GiB". create() runs it with cudaMemGetInfo's numbers before it uploads anything.
Status check_gpu_memory(const GpuMemoryNeed& need, int64_t free_bytes, int64_t total_bytes, const std::string& device);
// The tensor-copy GEMV stages a product of the fused step gets (CudaModelOptions::decode_tma_qkv_stages,
// decode_tma_gate_up_stages): `requested` unless it is CudaModelOptions::kTmaAuto; auto, on a device with tensor
// copies (compute capability 9.0 or later): 1 for group-wise weights (`grouped_weights`), and for per-channel ones
// where the peak memory bandwidth (cuda::DeviceInfo::peak_memory_bandwidth, 0 unknown) is at least
// CudaModelOptions::kTmaAutoMinBandwidth; else 0 (the register GEMV).
int resolve_tma_stages(int requested, int64_t peak_memory_bandwidth, int compute_major, bool grouped_weights);
// The same for down (CudaModelOptions::decode_tma_down_stages): auto is 1 only for group-wise weights on a device
// with tensor copies whose peak memory bandwidth is at least kTmaAutoMinBandwidth (the H200); else 0.
int resolve_tma_down_stages(int requested, int64_t peak_memory_bandwidth, int compute_major, bool grouped_weights);

// A sequence's KV cache set aside on the GPU: what a Session keeps while another Session of the same engine runs
// on the one CudaModel (CudaModel::stash_kv / unstash_kv). Empty (position 0, no memory) until first stashed;
// its memory grows with the positions it holds and is freed with it.
class CudaKvStash {
 public:
  CudaKvStash();
  ~CudaKvStash();
  CudaKvStash(CudaKvStash&&) noexcept;
  CudaKvStash& operator=(CudaKvStash&&) noexcept;
  int64_t position() const { return position_; }  // the positions it holds
  int64_t device_bytes() const;

 private:
  friend class CudaModel;
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
  int64_t position_ = 0;
  int64_t capacity_ = 0;  // positions a layer the buffers hold
};

class CudaModel {
 public:
  // Uploads `model`'s weights to options.device, after checking that they, the KV cache and the scratch
  // buffers fit in the device's free memory (check_gpu_memory). The LlamaModel may be destroyed afterwards.
  static Result<std::unique_ptr<CudaModel>> create(const LlamaModel& model, const CudaModelOptions& options = {});
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const LlamaConfig& config() const;
  int64_t position() const;        // tokens in the KV cache; the next token goes here
  int64_t context_length() const;
  int64_t device_bytes() const;    // weights, KV cache and scratch on the GPU
  bool prefill_f16_weights() const;  // whether the fp16 copies for the prompt processor were made
  bool resident_step() const;        // whether the decode step runs resident (CudaModelOptions::resident_step)
  const CudaInitTimes& init_times() const;
  // With options.time_steps, the GPU time of the last decode step (the input's copy, the step, the LM head and
  // the logits' or top-k's way to the host) in milliseconds; 0 otherwise. The rest of a step's wall time is
  // the host's: launch, synchronization, the copy into a vector.
  double last_step_device_ms() const;
  void reset();                    // forget the sequence (memory is kept)
  void truncate(int64_t n);        // drop positions >= n

  // The KV cache's rows of positions [0, n) of one layer, keys or values: fp16 [n, n_kv_heads, head_dim], the
  // layout of the CPU backend's f16 cache (what Session::save writes, so a state saved on one backend restores on
  // the other). Ordered after the work queued so far; returns when the copy is done. Errors (kInvalidArgument)
  // for a layer out of range, n outside [0, context_length()] or a span of another size than n * kv_dim.
  Status read_kv(int64_t layer, bool values, int64_t n, std::span<uint16_t> out) const;
  // The reverse: positions [0, n) of one layer's keys or values from the host; then set_position(n) makes them
  // the sequence. Rows at or past position() are never read by a step, so stale ones need no clearing.
  Status write_kv(int64_t layer, bool values, int64_t n, std::span<const uint16_t> in);
  // position() := n, 0 <= n <= context_length() (kInvalidArgument otherwise, changing nothing): after write_kv
  // filled positions [0, n) of every layer's keys and values.
  Status set_position(int64_t n);
  // Copies positions [0, position()) of every layer's keys and values into `stash` on the GPU and records
  // position(); the cache itself is unchanged. Grows the stash's memory as needed (to at least twice what it
  // held, at most context_length() positions); when the GPU has no room the error names the bytes and the stash
  // keeps what it held. Returns when the copies are done.
  Status stash_kv(CudaKvStash& stash) const;
  // The reverse: the stash's positions into the cache, position() := stash.position().
  Status unstash_kv(const CudaKvStash& stash);

  // Runs `token` at position(), appends it to the cache and, when `logits` is not null, returns its logits
  // [vocab] on the host. Fails with kOutOfRange, changing nothing, when the cache is full.
  Status decode(int32_t token, std::vector<float>* logits);

  // decode() with the logits left where the step put them: a view of the model's pinned host buffer [vocab],
  // valid until the next call on this model (what llama.cpp's llama_get_logits gives; no copy into a vector).
  Result<std::span<const float>> decode_logits(int32_t token);

  // LlamaModel::forward's contract for the GPU (kLast: the last token's logits; kAll: every token's,
  // concatenated; kNone: none): more than one token go through the prompt processor in chunks of
  // options.prefill_chunk, a single token (or prefill_chunk <= 1) through decode(). Checks every id and the
  // space left before it runs anything.
  Status forward(std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>* logits);

  // decode() and forward(kLast) with only the k largest logits of the (last) token coming back (TopLogits:
  // values descending, ids ascending among equals, or every logit when the GPU could not choose, e.g. NaNs),
  // chosen on the GPU (kernels/cuda/top_k.h): k pairs cross to the host instead of the vocabulary. What the
  // sampler needs for greedy (k = 1) and top-k picks (Sampler::top_needed). 1 <= k <= max_top_k(config()).
  Status decode_top(int32_t token, int k, TopLogits* top);
  Status forward_top(std::span<const int32_t> tokens, int k, TopLogits* top);
  static int max_top_k(const LlamaConfig& config);  // 0 when the vocabulary is too large for the kernel
  bool constraint_mask_on_device() const;  // CudaModelOptions::constraint_mask_on_device
  // The options as create() resolved them: the context length clamped to the model's, kTmaAuto decided.
  const CudaModelOptions& options() const;
  // decode_top with a constraint's token mask (JSON mode) applied on the GPU before the choice: the step runs
  // without its LM head while `write_mask` fills the mask on the host (bit i % 32 of word i / 32: token i
  // allowed; (vocab + 31) / 32 words), then the LM head, the mask (disallowed logits -infinity) and the top-k
  // run as a second graph; k pairs come back instead of the vocabulary.
  Status decode_top_masked(int32_t token, int k, const std::function<void(std::span<uint32_t>)>& write_mask, TopLogits* top);

 private:
  struct State;
  explicit CudaModel(std::unique_ptr<State> state);
  Status warm_up();
  enum class StepOutput;
  Status start_decode(int32_t token, StepOutput output, int top_k = 0);
  Status finish_decode();
  Status check_top_request(int k, const TopLogits* top) const;
  Status run_forward(std::span<const int32_t> tokens, LogitsMode mode, std::vector<float>* logits, int top_k,
                     TopLogits* top);
  std::unique_ptr<State> state_;
};

}  // namespace petrel
