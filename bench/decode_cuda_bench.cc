// petrel_bench_decode_cuda: the GPU token generator (model/cuda_model.h), tokens per second of tg128 as
// llama-bench counts it (128 decode steps after an empty prompt, the logits of every step in host memory:
// CudaModel::decode_logits, as llama_get_logits reads llama.cpp's host buffer), for several variants of the
// decode step in one run, and (--kernels) each decode kernel alone. Beside it, the same 128 steps with the
// logits copied into a std::vector (CudaModel::decode), with only the 40 largest coming back (decode_top, what
// `petrel run` samples from) and with no LM head at all (decode without logits): where the host's share goes.
//
//   petrel_bench_decode_cuda [--preset llama-3.1-8b] [--layers N] [--group -1|128|-1,128] [--model DIR]
//                            [--reps N] [-n N] [--prompt N] [--depth N] [--kernels]
//                            [--variants unfused,fused-serial,...] [--timeline FILE] [--warm-up] [--untimed]
//                            [--copy-gbs X] [--before alloc-free|alloc-keep|memset-free|copy-keep]
//                            [--warm memcpy|memset:MIB:REPS:before|after] [--idle-ms N]
//
// Without --model the weights are random GPTQ tensors made in memory with the preset's exact shapes
// (4-bit decoder linears per-channel or group 128, 8-bit per-channel LM head, bf16 embedding and norms):
// speed does not depend on the values, and no 16 GB float checkpoint has to be written and quantized first.
// --depth N (llama-bench's "tg128 @ dN"): every timed run of decode steps starts after an untimed prompt of N
// tokens, so that attention reads an N-position cache (give the variant a cache that holds it, e.g. fused-ctx8192).
// --warm-up creates each variant's model as `petrel run` and `petrel bench` do (CudaModelOptions::warm_up: a
// prompt per prefill kernel family and a decode step at creation; "upload s" then includes them); --untimed
// leaves out the timing events around each step (CudaModelOptions::time_steps; "GPU ms/token" then reads 0).
// --copy-gbs X takes the device-to-device copy bandwidth as X GB/s instead of measuring it first (2 GiB of
// buffers allocated, copied and freed before the model's weights are placed). Its ~20 copies made the step
// 1.2-2.5% faster than in a process without them, as `petrel run` / `petrel bench` were (H100, session 45: per
// channel 544 against 538, group 128 519 against 505-512; session 46: the count of copies does it, why is not
// known). Since session 46 CudaModel::create makes such copies itself (CudaModelOptions::warm_copies; variant
// suffix -wc0: none), on a stream of their own since session 47 (on the model's stream they gain nothing), so the
// figure with and without --copy-gbs should agree (not yet compared in one run); -wc0 with --copy-gbs is the old CLI's.
// --before MODE, after the measurement (or its skip): which half of it does that, 2 GiB as two 1 GiB buffers
// allocated and freed untouched (alloc-free), allocated and kept to the end (alloc-keep), memset and freed
// (memset-free), or copied between as the measurement does (21 copies) and kept (copy-keep).
// --warm OP:MIB:REPS:WHEN (session 46, after copy-keep alone gave the gain on an H100): REPS device-to-device
// copies (memcpy) or memsets of MIB MiB, on two buffers freed afterwards, before anything (before) or right after
// each variant's model is created (after, as a warm-up at load in the product would be).
// --idle-ms N: the GPU left idle N ms before each timed run of decode steps (and its warm-up run), as a server's
// first request after a quiet spell finds it: whether the step's speed (the warm copies' gain included) survives.
// --prompt N (default 29, 0: none) also times the prompt processor on N tokens from an empty cache up to the
// last token's logits on the host (CudaModel::forward, LogitsMode::kLast): the time to first token as Genie
// counts it, less sampling; median of the reps; "top-40 ms" the same through CudaModel::forward_top (the 40
// largest logits chosen on the GPU, what `petrel run` does with a top-k 40 sampler); "after idle ms" one such
// prompt after 0.5 s with the GPU idle (a CLI query follows the load after a pause). The first timed prompt is bracketed by cudaProfilerStart/Stop:
//   ncu --profile-from-start off --metrics gpu__time_duration.sum --print-summary per-kernel
//       petrel_bench_decode_cuda --preset llama-3.1-8b --group -1 --reps 1 -n 1 --prompt 29 --variants fused
// lists each kernel of one prompt with its time (serialized by the profiler, at its locked clocks).
// "weight GB/s" is the bytes of weights read per token (all linears and the LM head, one embedding row) over
// the time per token; the floor is those bytes at the device-to-device copy bandwidth measured first.
//
// Variants (CudaModelOptions), all with the step replayed from a CUDA graph unless named "-nograph":
//   unfused           the unfused step: 11 launches per layer, k/v and up on side streams
//   fused             CudaModelOptions' defaults: the fused step (5 launches per layer), overlap, 16 steps of prefetch
//   resident          the resident step (2 launches per layer: the GEMVs between two attention calls in one
//                     launch of resident blocks, kernels/cuda/resident_gemv.cu; CudaModelOptions::resident_step)
//   resident-tiled    the same streaming a tiled copy of the weights (CudaModelOptions::resident_tiled_copy)
//   fused-serial      the fused step without overlap and without L2 prefetch, whatever the defaults
//   fused-overlap     the fused step, each kernel overlapping the one before it (programmatic dependent launch)
//   fused-prefetch    fused-overlap plus an L2 prefetch of 16 steps of each GEMV block's first weights
//   fused-prefetchN   the same with N steps of prefetch (e.g. fused-prefetch64)
//   fused-cluster     fused-prefetch with the GEMVs' split-K sums reduced in thread-block clusters
//   fused-gemm-prefill  the defaults, but prompt chunks of <= 32 tokens through the GEMM, not the batch GEMV
//                     (only the "prompt N ms" column differs)
//   fused-batch-mlp   the defaults, and the MLP of short prompt chunks through the batch GEMV too
//   fused-batch-gateup  only gate/up of the MLP
//   fused-separate-inputs  the defaults, but the prompt processor's MLP with its post-attention RMSNorm and
//                     SiLU*up as kernels of their own (CudaModelOptions::fused_prefill_inputs off)
//   fused-qkv-gemm    the defaults, and q/k/v of the prompt processor as one GEMM launch with the input
//                     RMSNorm in its staging (CudaModelOptions::prefill_qkv_gemm)
//   fused-copy-logits the defaults, but the logits written to device memory and copied to the host
//                     (CudaModelOptions::logits_to_mapped_host off)
//   fused-ordered...  any fused variant with "ordered" after "fused": split-K sums added by the last block of
//                     each row range in a fixed order, not with atomics (CudaModelOptions::decode_atomic_reduce
//                     off), e.g. fused-ordered, fused-ordered-splits-0-0-0-0
//   fused-splits-Q-O-G-D  the defaults with q/k/v, o, gate/up and down cut into Q, O, G and D input slices
//                     (0: the planner's; CudaModelOptions::decode_splits), e.g. fused-splits-0-4-0-0
//   unfused-nograph, fused-nograph: launched kernel by kernel
//   any of them with "-splitN" (before "-nograph"): N KV positions per attention block instead of the default
//   any of them with "-ctxN" (last, before "-nograph"): a KV cache of N positions instead of 4096 (the fused
//                     attention kernel's grid is min(N / 32, 32) blocks a KV head), e.g. fused-ctx256
//   any of them with "-tmagS" (before "-ctxN"): gate/up through the tensor-copy-fed GEMV (gemv_tma.h), S stages of
//                     4 KB in flight per warp (CudaModelOptions::decode_tma_gate_up_stages), e.g. fused-tmag3;
//                     "-tmagSP": P of them asked for before the wait, the rest once x is staged (P for every
//                     tensor-copy product, decode_tma_prewait), e.g. fused-tmag30;
//                     "-tmagSPD": D = 1 launches down only after gate/up's loop (late_dependents; every tensor-copy
//                     product's next launch likewise), e.g. fused-tmag221;
//                     "-tmaqS" (before "-tmagS"): q/k/v past layer 0 likewise, e.g. fused-tmaq1-tmag1; without them
//                     the device decides (CudaModelOptions::kTmaAuto: 1 and 1 on an H200, and at group 128 on any
//                     Hopper; the label says so), and
//                     "-tmaq0-tmag0" is the register GEMVs for them
//                     "-tmadS" (before "-tmaqS"): down likewise (SiLU * up input), e.g. fused-tmad1-tmag1; without
//                     it the device decides (1 at group 128 on an H200, else 0), so the register step everywhere
//                     is "fused-tmad0-tmaq0-tmag0"
//                     "-tmaoS" (before "-tmadS"): o likewise (added into the residual), e.g. fused-tmao1-tmaq1-tmag1
//   any of them with "-uz0" (before "-ctxN"): group 128's GEMVs load and decode every group's zeros even where all
//                     are one value (CudaModelOptions::decode_uniform_zeros off), e.g. fused-uz0
//   any of them with "-lateQG" (before "-uz0"): q/k/v and gate/up each with that many of its batches of weight
//                     loads sent after its wait, behind its reads of x (CudaModelOptions::decode_late_batches),
//                     e.g. fused-late00 (default {1, 1}: one each)
//   any of them with "-shallowN" (before "-lateQG"): the RMSNorm products of bit mask N (1 q/k/v, 2 gate/up) with two
//                     batches of weight loads in flight per channel, not three (CudaModelOptions::decode_deep_batches)
//   any of them with "-carveN" (before "-shallowN"): the decode step's overlapped launches ask for an N% shared-memory
//                     carveout (0 to 100; CudaModelOptions::decode_shared_carveout), e.g. fused-carve100
//   any of them with "-carvesQ-A-O-G-D" (before "-carveN"): a carveout per phase of the layers (q/k/v, attention,
//                     o, gate/up, down; -1 the step's; CudaModelOptions::decode_phase_carveouts), e.g.
//                     fused-carves-1--1-100-100--1
//   any of them with "-attnbN" (before "-carvesQ-A-O-G-D"): the fused attention kernel in at most N blocks a KV head
//                     (CudaModelOptions::decode_attention_blocks), e.g. fused-attnb2, fused-attnb4-ctx8192
//   any of them with "-skipN" (before "-attnbN"; diagnostic, wrong outputs): the fused step without the phases
//                     of bit mask N (1 q/k/v, 2 attention, 4 o, 8 gate/up, 16 down; CudaModelOptions::
//                     decode_skip_phases): a phase's marginal cost in the overlapped step, e.g. fused-skip2
//   any of them with "-acold" (before "-skipN"): the fused attention kernel's tensor-core build without its warm
//                     pass (CudaModelOptions::decode_attention_warm off), e.g. fused-acold
//   any of them with "-pfqN", "-pfoN", "-pfgN", "-pfdN" (before "-acold"): N steps of L2 prefetch for that product
//                     alone (q/k/v, o, gate/up, down in every format; CudaModelOptions::decode_l2_prefetch), e.g.
//                     fused-pfq16-pfg16-pfd16 (the defaults before session 28)
//   any of them with "-attnfp32" (before "-skipN"): the fused attention kernel's float32 build instead of its
//                     tensor-core one (CudaModelOptions::decode_attention_tensor_cores off), e.g. fused-attnfp32
// --timeline FILE installs a block timeline (kernels/cuda/timeline.h) before the models are made, so that every
// decode GEMV and attention launch runs its instrumented build (the t/s columns then include that cost), and
// after each variant's measurements records 3 single decode steps (positions 40, 41, 42 after a reset) into FILE
// as CSV, one row a block: scripts/timeline_report.py turns it into a per-layer picture of the step. With it, a
// variant may end in "-probeN": the instrumented kernels' diagnostic variants N (TimelineRing::probe: outputs
// wrong, times only).
// --kernels times each kernel of both steps alone on Llama-shaped operands: the median time per call of calls
// captured in one graph (weights rotating over copies of >= 256 MB so that they come from device memory;
// the KV cache and activations are small and stay in L2, as in the step), without overlap, and for the fused
// step's kernels also with each call overlapping the one before it.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_bench_util.h"
#include "petrel/io/hf_config.h"
#include "petrel/io/tensor_source.h"
#include "petrel/kernels/cuda/attention.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/elementwise.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/norm.h"
#include "petrel/kernels/cuda/rope.h"
#include "petrel/kernels/cuda/stream.h"
#include "petrel/kernels/cuda/timeline.h"
#include "petrel/model/cuda_model.h"
#include "petrel/model/llama.h"
#include "petrel/model/random_checkpoint.h"
#include "petrel/model/rope.h"
#include "petrel/quant/format.h"

namespace {

using namespace petrel;
using petrel::bench::check;
using petrel::bench::copy_bandwidth_gbs;
using petrel::bench::median;
using petrel::bench::split_list;
using petrel::bench::take;
#define CHECK_CUDA PETREL_BENCH_CHECK_CUDA

// Random GPTQ tensors held in memory, named as a GPTQ checkpoint names them.
class RandomGptqSource : public TensorSource {
 public:
  RandomGptqSource(const LlamaConfig& c, int64_t group) {
    const int64_t h = c.hidden_size;
    add_dense("model.embed_tokens.weight", {c.vocab_size, h}, false);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add_dense(p + "input_layernorm.weight", {h}, true);
      add_dense(p + "post_attention_layernorm.weight", {h}, true);
      add_gptq(p + "self_attn.q_proj", c.q_dim(), h, 4, group);
      add_gptq(p + "self_attn.k_proj", c.kv_dim(), h, 4, group);
      add_gptq(p + "self_attn.v_proj", c.kv_dim(), h, 4, group);
      add_gptq(p + "self_attn.o_proj", h, c.q_dim(), 4, group);
      add_gptq(p + "mlp.gate_proj", c.intermediate_size, h, 4, group);
      add_gptq(p + "mlp.up_proj", c.intermediate_size, h, 4, group);
      add_gptq(p + "mlp.down_proj", h, c.intermediate_size, 4, group);
    }
    add_dense("model.norm.weight", {h}, true);
    add_gptq("lm_head", c.vocab_size, h, 8, -1);
  }

  Result<TensorView> tensor(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return not_found("random GPTQ source: no tensor '" + name + "'");
    const Stored& s = it->second;
    TensorView view;
    view.name = name;
    view.dtype = s.dtype;
    view.shape = s.shape;
    view.data = s.bytes.data();
    view.num_bytes = s.bytes.size();
    return view;
  }
  bool has(const std::string& name) const override { return tensors_.count(name) != 0; }
  std::string describe() const override { return "random GPTQ weights"; }

 private:
  struct Stored {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };

  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

  std::vector<uint8_t>& make(const std::string& name, DType dtype, std::vector<int64_t> shape, size_t bytes) {
    Stored& s = tensors_[name];
    s.dtype = dtype;
    s.shape = std::move(shape);
    s.bytes.resize(bytes);
    return s.bytes;
  }

  // bf16: norms 1.0, other values +-[2^-7, 2^-6).
  void add_dense(const std::string& name, std::vector<int64_t> shape, bool ones) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& b = make(name, DType::kBF16, shape, static_cast<size_t>(n) * 2);
    uint16_t* v = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < n; i += 4) {
      const uint64_t r = next();
      for (int64_t j = 0; j < 4 && i + j < n; ++j) {
        const uint16_t bits = static_cast<uint16_t>(r >> (16 * j));
        v[i + j] = ones ? uint16_t{0x3F80} : static_cast<uint16_t>((bits & 0x8000) | 0x3C00 | (bits & 0x7F));
      }
    }
  }

  void add_gptq(const std::string& name, int64_t rows, int64_t cols, int bits, int64_t group) {
    const int64_t groups = group < 0 ? 1 : cols / group;
    auto& q = make(name + ".qweight", DType::kI32, {cols * bits / 32, rows}, static_cast<size_t>(cols * bits / 32 * rows) * 4);
    uint64_t* words = reinterpret_cast<uint64_t*>(q.data());
    for (size_t i = 0; i < q.size() / 8; ++i) words[i] = next();
    auto& s = make(name + ".scales", DType::kF16, {groups, rows}, static_cast<size_t>(groups * rows) * 2);
    uint16_t* scales = reinterpret_cast<uint16_t*>(s.data());
    for (int64_t i = 0; i < groups * rows; ++i) scales[i] = static_cast<uint16_t>(0x2000 | (next() & 0x3FF));  // ~2^-7
    auto& z = make(name + ".qzeros", DType::kI32, {groups, rows * bits / 32}, static_cast<size_t>(groups * rows * bits / 32) * 4);
    std::fill_n(reinterpret_cast<uint32_t*>(z.data()), z.size() / 4, bits == 4 ? 0x77777777u : 0x7F7F7F7Fu);  // v1 symmetric
  }

  uint64_t state_ = 42;
  std::map<std::string, Stored> tensors_;
};

struct Options {
  std::string preset = "llama-3.1-8b";
  int64_t layers = -1;
  std::vector<int64_t> groups = {-1};
  std::string model;
  int reps = 3;
  int n_gen = 128;
  int prompt = 29;
  int depth = 0;
  bool kernels = false;
  std::string timeline;  // CSV path, or empty
  bool warm_up = false;     // --warm-up: CudaModelOptions::warm_up on, as `petrel run` and `petrel bench` create it
  bool step_times = true;   // --untimed: no timing events around each step (CudaModelOptions::time_steps off)
  std::string warm;         // --warm OP:MIB:REPS:WHEN (see the header)
  std::string before;       // --before MODE: what happens to 2 GiB of device memory before the model (see main)
  double copy_gbs = 0;      // --copy-gbs X: the copy bandwidth taken as given, not measured (0: measured)
  int idle_ms = 0;          // --idle-ms N: the GPU idle N ms before each run of decode steps
  int stash = 0;            // --stash N: also time a session switch (CudaModel::stash_kv, unstash_kv) at N positions
  std::vector<std::string> variants = {"unfused", "fused-serial", "fused-ordered", "fused"};
};

// A suffix `tag` + N (1 to max_digits decimal digits) that ends `name`: N into *value and the suffix cut off.
// false (name unchanged) where the last `tag` is not followed by digits alone.
bool take_number_suffix(std::string& name, const std::string& tag, size_t max_digits, int64_t* value) {
  const size_t at = name.rfind(tag);
  if (at == std::string::npos) return false;
  const std::string digits = name.substr(at + tag.size());
  if (digits.empty() || digits.size() > max_digits || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *value = std::stoll(digits);
  name.resize(at);
  return true;
}

// "...-probeN" (with --timeline): the variant without the suffix, and N (the timeline's diagnostic kernel
// variants, TimelineRing::probe) in *probe (0 without the suffix).
std::string without_probe(std::string variant, uint32_t* probe) {
  int64_t n = 0;
  *probe = take_number_suffix(variant, "-probe", 4, &n) ? static_cast<uint32_t>(n) : 0u;
  return variant;
}

bool variant_options(const std::string& name, CudaModelOptions& o) {
  o.use_graph = name.find("-nograph") == std::string::npos;
  std::string base = o.use_graph ? name : name.substr(0, name.find("-nograph"));
  // "-ctxN": a KV cache of N positions (CudaModelOptions::context_length; default 4096). The fused attention
  // kernel's grid follows it (blocks per KV head = min(N / 32, 32)), and every one of its blocks must have
  // started before o's launch: at 4096, 256 blocks of 512 threads, most of them past the sequence.
  // "-wcN" (last of all): N warm copies at the end of create() (CudaModelOptions::warm_copies; default 21), e.g.
  // fused-wc0 for none (session 46: as a fresh process ran before them).
  // "-wsN" (after any -wcN): the warm copies' stream (CudaModelOptions::warm_copies_stream: 0 their own, 1 their own
  // kept, 2 the model's, 3 the legacy default stream), e.g. fused-ws2.
  if (int64_t ws = 0; take_number_suffix(base, "-ws", 1, &ws)) o.warm_copies_stream = static_cast<int>(ws);
  if (int64_t wc = 0; take_number_suffix(base, "-wc", 3, &wc)) o.warm_copies = static_cast<int>(wc);
  take_number_suffix(base, "-ctx", 6, &o.context_length);
  // "-tmagS" (after any "-ctxN", before "-uz0"): gate/up through the tensor-copy-fed GEMV with S stages a warp
  // (CudaModelOptions::decode_tma_gate_up_stages), e.g. fused-tmag3.
  // "-tmagSP": P of the S stages asked for before the wait, for every tensor-copy product
  // (CudaModelOptions::decode_tma_prewait), e.g. fused-tmag30; "-tmagSPD": D = 1, the next launch allowed after the
  // loop, likewise for every one (decode_tma_late_dependents). gate/up's alone with P = 0 (session 44, f12cc24,
  // since removed) lost 1.4% tg128 on an H100.
  if (const size_t at = base.rfind("-tmag"); at != std::string::npos) {
    const std::string digits = base.substr(at + 5);
    int64_t n = 0;
    if (!take_number_suffix(base, "-tmag", 3, &n)) return false;
    if (digits.size() == 3) {
      o.decode_tma_late_dependents = n % 10 == 1;
      n /= 10;
    }
    o.decode_tma_gate_up_stages = static_cast<int>(digits.size() >= 2 ? n / 10 : n);
    if (digits.size() >= 2) o.decode_tma_prewait = static_cast<int>(n % 10);
  }
  // "-tmaqS" (before any "-tmagS"): q/k/v past layer 0 likewise (CudaModelOptions::decode_tma_qkv_stages).
  if (int64_t stages = 0; take_number_suffix(base, "-tmaq", 1, &stages)) o.decode_tma_qkv_stages = static_cast<int>(stages);
  // "-tmadS" (before any "-tmaqS"): down likewise (CudaModelOptions::decode_tma_down_stages).
  if (int64_t stages = 0; take_number_suffix(base, "-tmad", 1, &stages)) o.decode_tma_down_stages = static_cast<int>(stages);
  // "-tmaoS" (before any "-tmadS"): o likewise (CudaModelOptions::decode_tma_o_stages).
  if (int64_t stages = 0; take_number_suffix(base, "-tmao", 1, &stages)) o.decode_tma_o_stages = static_cast<int>(stages);
  // "-uz0" / "-uz1" (after any "-ctxN"): group 128's uniform-zeros build off / on (CudaModelOptions::
  // decode_uniform_zeros; off: the general build, which loads and decodes every group's zeros), e.g. fused-uz0.
  if (int64_t uz = 0; take_number_suffix(base, "-uz", 1, &uz)) {
    if (uz > 1) return false;
    o.decode_uniform_zeros = uz == 1;
  }
  // "-lateQG" (after any "-shallowN", before "-ctxN"): q/k/v's and gate/up's batches of weight loads sent after
  // their wait (CudaModelOptions::decode_late_batches), e.g. fused-late02.
  if (int64_t late = 0; take_number_suffix(base, "-late", 2, &late)) {
    o.decode_late_batches.qkv = static_cast<int>(late / 10);
    o.decode_late_batches.gate_up = static_cast<int>(late % 10);
  }
  // "-shallowN" (after any "-carveN", before "-lateQG"): the RMSNorm products of mask N (1 q/k/v, 2 gate/up) with two
  // batches of weight loads in flight per channel, not three (CudaModelOptions::decode_deep_batches), e.g. fused-shallow2.
  if (int64_t shallow = 0; take_number_suffix(base, "-shallow", 1, &shallow)) {
    if (shallow > 3) return false;
    o.decode_deep_batches.qkv = !(shallow & 1);
    o.decode_deep_batches.gate_up = !(shallow & 2);
  }
  // "-carveN" (after any "-ctxN"): every overlapped launch of the decode step asks for an N% shared-memory
  // carveout (CudaModelOptions::decode_shared_carveout), e.g. fused-carve100.
  int64_t carveout = -1;
  if (take_number_suffix(base, "-carve", 3, &carveout)) {
    if (carveout > 100) return false;
    o.decode_shared_carveout = static_cast<int>(carveout);
  }
  // "-carvesQ-A-O-G-D" (before any "-carveN"): a carveout per phase of the layers, q/k/v, attention, o, gate/up,
  // down (-1: the step's; CudaModelOptions::decode_phase_carveouts), e.g. fused-carves-1--1-100-100--1.
  if (const size_t at = base.rfind("-carves"); at != std::string::npos) {
    CudaModelOptions::DecodeCarveouts& c = o.decode_phase_carveouts;
    char tail = 0;
    if (std::sscanf(base.c_str() + at + 7, "%d-%d-%d-%d-%d%c", &c.qkv, &c.attention, &c.o, &c.gate_up, &c.down, &tail) != 5) {
      return false;
    }
    for (const int v : {c.qkv, c.attention, c.o, c.gate_up, c.down}) {
      if (v < -1 || v > 100) return false;
    }
    base.resize(at);
  }
  // "-attnbN": the fused attention kernel in at most N blocks a KV head (CudaModelOptions::decode_attention_blocks).
  take_number_suffix(base, "-attnb", 2, &o.decode_attention_blocks);
  // "-skipN" (diagnostic: wrong outputs): the fused step without the phases of bit mask N
  // (CudaModelOptions::decode_skip_phases: 1 q/k/v, 2 attention, 4 o, 8 gate/up, 16 down), e.g. fused-skip2.
  int64_t skip = 0;
  if (take_number_suffix(base, "-skip", 2, &skip)) o.decode_skip_phases = static_cast<uint32_t>(skip);
  // "-acold": the fused attention kernel's tensor-core build without its warm pass
  // (CudaModelOptions::decode_attention_warm off), e.g. fused-acold.
  if (const size_t at = base.rfind("-acold"); at != std::string::npos && at + 6 == base.size()) {
    o.decode_attention_warm = false;
    base.resize(at);
  }
  // "-pfqN", "-pfoN", "-pfgN", "-pfdN" (in this order, after any "-attnfp32", before "-acold"): N steps of L2
  // prefetch for q/k/v, o, gate/up or down alone (CudaModelOptions::decode_l2_prefetch), e.g. fused-pfg8-pfd32.
  // Applied after the base name's options (below), which may set every product's prefetch alike.
  int64_t prefetch_down = -1, prefetch_gate_up = -1, prefetch_o = -1, prefetch_qkv = -1;
  take_number_suffix(base, "-pfd", 3, &prefetch_down);
  take_number_suffix(base, "-pfg", 3, &prefetch_gate_up);
  take_number_suffix(base, "-pfo", 3, &prefetch_o);
  take_number_suffix(base, "-pfq", 3, &prefetch_qkv);
  const auto per_product_prefetch = [&] {
    CudaModelOptions::DecodePrefetch& p = o.decode_l2_prefetch;
    if (prefetch_down >= 0) p.down = p.down_grouped = static_cast<int>(prefetch_down);
    if (prefetch_gate_up >= 0) p.gate_up = static_cast<int>(prefetch_gate_up);
    if (prefetch_o >= 0) p.o = static_cast<int>(prefetch_o);
    if (prefetch_qkv >= 0) p.qkv = static_cast<int>(prefetch_qkv);
    return true;
  };
  // "-attnfp32": the fused attention kernel's float32 build, not the tensor-core one
  // (CudaModelOptions::decode_attention_tensor_cores off).
  if (const size_t at = base.rfind("-attnfp32"); at != std::string::npos && at + 9 == base.size()) {
    o.decode_attention_tensor_cores = false;
    base.resize(at);
  }
  // "fused-ordered...": the same variant with split-K sums in a fixed order (CudaModelOptions::decode_atomic_reduce
  // off: the same bits on every run).
  if (base.rfind("fused-ordered", 0) == 0) {
    o.decode_atomic_reduce = false;
    base = "fused" + base.substr(13);
  }
  // "-splitN": N KV positions per attention block (CudaModelOptions::attention_split; "fused-splits-..." is not it).
  take_number_suffix(base, "-split", 9, &o.attention_split);
  // "fused-splits-Q-O-G-D": the fused step with q/k/v, o, gate/up and down cut into Q, O, G, D input slices
  // (0: the planner's choice; CudaModelOptions::decode_splits).
  if (base.rfind("fused-splits-", 0) == 0) {
    int q = 0, o_ = 0, g = 0, d = 0;
    char tail = 0;
    if (std::sscanf(base.c_str() + 13, "%d-%d-%d-%d%c", &q, &o_, &g, &d, &tail) != 4 || q < 0 || o_ < 0 || g < 0 || d < 0) return false;
    o.decode_splits = {q, o_, g, d};
    return per_product_prefetch();
  }
  // The variants below that name one prefetch for every GEMV: every product of the fused step takes it.
  const bool uniform_prefetch = base == "fused-serial" || base == "fused-overlap" || base == "fused-cluster" ||
                                base.rfind("fused-prefetch", 0) == 0;
  if (uniform_prefetch) o.decode_l2_prefetch = {-1, -1, -1, -1, -1};
  o.resident_step = base == "resident" || base == "resident-tiled";
  o.resident_tiled_copy = base == "resident-tiled";
  if (o.resident_step) {
  } else if (base == "unfused") {
    o.fused_step = false;
  } else if (base == "fused-serial") {
    o.overlap_kernels = false;
    o.gemv_l2_prefetch_steps = 0;
  } else if (base == "fused-overlap") {
    o.overlap_kernels = true;
    o.gemv_l2_prefetch_steps = 0;
  } else if (base == "fused-prefetch") {
    o.overlap_kernels = true;
    o.gemv_l2_prefetch_steps = 16;
  } else if (base == "fused-cluster") {
    o.overlap_kernels = true;
    o.gemv_l2_prefetch_steps = 16;
    o.gemv_cluster_reduce = true;
  } else if (base.rfind("fused-prefetch", 0) == 0 && base.size() > 14 &&
             base.find_first_not_of("0123456789", 14) == std::string::npos) {  // fused-prefetchN: N steps
    o.overlap_kernels = true;
    o.gemv_l2_prefetch_steps = std::stoi(base.substr(14));
  } else if (base == "fused-gemm-prefill") {
    o.batch_prefill = false;
  } else if (base == "fused-batch-mlp") {
    o.batch_prefill_gate_up = o.batch_prefill_down = true;
  } else if (base == "fused-batch-gateup") {
    o.batch_prefill_gate_up = true;
  } else if (base == "fused-separate-inputs") {
    o.fused_prefill_inputs = false;
  } else if (base == "fused-qkv-gemm") {
    o.prefill_qkv_gemm = true;
  } else if (base == "fused-copy-logits") {
    o.logits_to_mapped_host = false;
  } else if (base != "fused") {
    return false;
  }
  return per_product_prefetch();
}

// Median time per call (us) of `calls` launches captured in one CUDA graph, over `reps` replays.
double graph_us_per_call(cudaStream_t stream, int calls, int reps, const std::function<Status(int)>& launch) {
  check(cuda::CudaGraph::begin_capture(stream), "begin capture");
  Status enqueued = ok_status();
  for (int c = 0; c < calls && enqueued.ok(); ++c) enqueued = launch(c);
  auto graph = cuda::CudaGraph::end_capture(stream);
  check(enqueued, "kernel launch in capture");
  check(graph.status(), "end capture");
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  check(graph->launch(stream), "graph warm-up");
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    check(graph->launch(stream), "graph launch");
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms * 1000.0 / calls);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaGetLastError());
  return median(samples);
}

// Copies of one random GPTQ matrix in device memory, enough (>= 256 MB, at most 64) that calls rotating over
// them read device memory, not the L2 cache.
struct MatrixCopies {
  cuda::DeviceGptqWeights first;
  std::vector<cuda::DeviceBuffer> owned;
  std::vector<cuda::DeviceGptqMatrix> views;
  const cuda::DeviceGptqMatrix& at(int call) const { return views[call % views.size()]; }
  double bytes() const { return static_cast<double>(views[0].weight_bytes()); }
};

MatrixCopies make_copies(int64_t rows, int64_t cols, int bits, int64_t group, uint64_t& state) {
  auto next = [&state] {  // splitmix64
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  quant::GptqTensors t;
  t.bits = bits;
  t.rows = rows;
  t.cols = cols;
  t.group_size = group < 0 ? cols : group;
  const int64_t groups = cols / t.group_size;
  t.qweight.resize(cols * bits / 32 * rows);
  for (int32_t& w : t.qweight) w = static_cast<int32_t>(next());
  t.scales.assign(groups * rows, 0);
  for (uint16_t& h : t.scales) h = static_cast<uint16_t>(0x2000 | (next() & 0x3FF));
  t.qzeros.assign(groups * rows * bits / 32, bits == 4 ? 0x77777777 : 0x7F7F7F7F);
  MatrixCopies m;
  m.first = take(cuda::DeviceGptqWeights::upload(t.view()), "upload");
  const cuda::DeviceGptqMatrix& v0 = m.first.view();
  m.views.push_back(v0);
  const int n = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / v0.weight_bytes() + 1, 1, 64));
  const size_t qweight_bytes = cols * bits / 32 * rows * 4, scales_bytes = groups * rows * 2,
               qzeros_bytes = groups * rows * bits / 32 * 4;
  auto copy_of = [&](const void* src, size_t bytes) {
    m.owned.push_back(take(cuda::DeviceBuffer::allocate(bytes), "alloc copy"));
    CHECK_CUDA(cudaMemcpy(m.owned.back().data(), src, bytes, cudaMemcpyDeviceToDevice));
    return m.owned.back().data();
  };
  for (int c = 1; c < n; ++c) {
    cuda::DeviceGptqMatrix v = v0;
    v.qweight = static_cast<const int32_t*>(copy_of(v0.qweight, qweight_bytes));
    v.scales = static_cast<const uint16_t*>(copy_of(v0.scales, scales_bytes));
    v.qzeros = static_cast<const int32_t*>(copy_of(v0.qzeros, qzeros_bytes));
    m.views.push_back(v);
  }
  return m;
}

struct KernelTiming {
  std::string step;  // "unfused", "fused" or "both"
  std::string name;
  double bytes = 0;         // bytes the kernel must move at least: weights, KV rows, activations in and out
  int per_layer = 1;        // launches of it per layer (0: once per token)
  double serial_us = 0;     // per call, in a graph, no overlap
  double overlapped_us = -1;  // per call, each call overlapping the one before it (fused kernels)
};

// Each decode kernel alone on the config's shapes, 4-bit decoder linears of `group`, 8-bit LM head.
std::vector<KernelTiming> time_kernels(const LlamaConfig& c, int64_t group, double copy_gbs, cudaStream_t stream) {
  constexpr int kCalls = 64, kReps = 15;
  constexpr int32_t kPosition = 64;  // the middle of tg128
  uint64_t seed = 7;
  const int64_t h = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), inner = c.intermediate_size;
  MatrixCopies q = make_copies(qd, h, 4, group, seed), k = make_copies(kvd, h, 4, group, seed),
               v = make_copies(kvd, h, 4, group, seed), o = make_copies(h, qd, 4, group, seed),
               gate = make_copies(inner, h, 4, group, seed), up = make_copies(inner, h, 4, group, seed),
               down = make_copies(h, inner, 4, group, seed);
  auto floats = [](int64_t n, uint8_t fill) {
    auto b = take(cuda::DeviceBuffer::allocate(static_cast<size_t>(n) * 4), "alloc");
    check(b.fill_bytes(fill), "fill");
    return b;
  };
  // 0x3C: every float 0.0115 (not zeros, which can run faster than real data).
  cuda::DeviceBuffer x = floats(h, 0x3C), residual = floats(h, 0x3C), normed = floats(h, 0x3C), q_out = floats(qd, 0x3C),
                     k_out = floats(kvd, 0x3C), v_out = floats(kvd, 0x3C), attn = floats(qd, 0x3C),
                     gate_out = floats(inner, 0x3C), up_out = floats(inner, 0x3C);
  std::vector<uint16_t> ones(h, 0x3F80);  // bf16 1.0
  cuda::DeviceBuffer norm_storage = take(cuda::DeviceBuffer::allocate(h * 2), "alloc");
  check(norm_storage.upload(ones.data(), h * 2), "upload");
  const cuda::DeviceVector norm{DType::kBF16, h, norm_storage.data()};
  const std::vector<float> inv_freq_host = rope_inverse_frequencies(c.rope, c.head_dim);
  cuda::DeviceBuffer inv_freq = take(cuda::DeviceBuffer::allocate(inv_freq_host.size() * 4), "alloc");
  check(inv_freq.upload(inv_freq_host.data(), inv_freq_host.size() * 4), "upload");
  cuda::DeviceBuffer position = take(cuda::DeviceBuffer::allocate(4), "alloc");
  check(position.upload(&kPosition, 4), "upload");
  const int64_t context = std::min<int64_t>(4096, c.max_position_embeddings);
  const int kv_copies = 8;
  std::vector<cuda::DeviceBuffer> caches;
  for (int i = 0; i < 2 * kv_copies; ++i) {
    caches.push_back(take(cuda::DeviceBuffer::allocate(static_cast<size_t>(context * kvd) * 2), "alloc kv"));
    check(caches.back().fill_bytes(0x3C), "fill kv");
  }
  cuda::DecodeAttentionShape shape{c.num_attention_heads, c.num_key_value_heads, c.head_dim, context, 0};
  cuda::DeviceBuffer attention_workspace = floats(cuda::decode_attention_workspace_floats(shape), 0);
  cuda::DeviceBuffer attention_counters = floats(c.num_key_value_heads, 0);
  auto ws = take(cuda::GemvWorkspace::create(), "workspace");
  MatrixCopies lm_head = make_copies(c.vocab_size, h, 8, -1, seed);
  cuda::DeviceBuffer logits = floats(c.vocab_size, 0);
  const cuda::RopeShape rope{c.num_attention_heads, c.num_key_value_heads, c.head_dim};
  const float eps = static_cast<float>(c.rms_norm_eps);
  const double kv_bytes = 2.0 * (kPosition + 1) * kvd * 2;  // key and value rows read

  std::vector<KernelTiming> rows;
  auto measure = [&](KernelTiming t, const std::function<Status(int, bool)>& launch, bool overlappable) {
    t.serial_us = graph_us_per_call(stream, kCalls, kReps, [&](int call) { return launch(call, false); });
    if (overlappable) {
      t.overlapped_us = graph_us_per_call(stream, kCalls, kReps, [&](int call) { return launch(call, true); });
    }
    rows.push_back(t);
    const double gbs = t.bytes / (t.serial_us * 1e-6) / 1e9;
    std::fprintf(stderr, "  timed %s %s: %.2f us (%.0f GB/s)\n", t.step.c_str(), t.name.c_str(), t.serial_us, gbs);
  };
  auto gemv = [&](const MatrixCopies& m, const float* in, float* out, const cuda::GemvFusion& fusion = {}) {
    return [&m, in, out, fusion, &ws, stream](int call, bool overlap) {
      cuda::GemvOptions options;
      options.overlap_previous = overlap;
      return cuda::gemv_gptq(m.at(call), in, out, ws, stream, options, fusion);
    };
  };
  auto io = [](int64_t in, int64_t out) { return 4.0 * (in + out); };

  // The unfused step's kernels.
  measure({"unfused", "rms_norm + residual add", 2.0 * h * 4 + io(h, h), 2},
       [&](int, bool) { return cuda::rms_norm(x.as<float>(), residual.as<float>(), 1, h, norm, eps, normed.as<float>(), stream); },
       false);
  measure({"unfused", "q_proj", q.bytes() + io(h, qd)}, gemv(q, normed.as<float>(), q_out.as<float>()), false);
  measure({"unfused", "k_proj, v_proj (each)", k.bytes() + io(h, kvd), 2}, gemv(k, normed.as<float>(), k_out.as<float>()), false);
  measure({"unfused", "rope_store_kv", io(qd + 2 * kvd, qd) + 2.0 * kvd * 2},
       [&](int call, bool) {
         const int i = call % kv_copies;
         return cuda::rope_store_kv(q_out.as<float>(), k_out.as<float>(), v_out.as<float>(), rope, inv_freq.as<float>(),
                                    position.as<int32_t>(), caches[2 * i].as<uint16_t>(), caches[2 * i + 1].as<uint16_t>(), stream);
       },
       false);
  measure({"unfused", "decode_attention + combine (2 launches)", kv_bytes + io(qd, qd)},
       [&](int call, bool) {
         const int i = call % kv_copies;
         return cuda::decode_attention(q_out.as<float>(), caches[2 * i].as<uint16_t>(), caches[2 * i + 1].as<uint16_t>(),
                                       position.as<int32_t>(), shape, attention_workspace.as<float>(), attn.as<float>(), stream);
       },
       false);
  measure({"unfused", "o_proj", o.bytes() + io(qd, h)}, gemv(o, attn.as<float>(), x.as<float>()), false);
  measure({"unfused", "gate_proj, up_proj (each)", gate.bytes() + io(h, inner), 2},
       gemv(gate, normed.as<float>(), gate_out.as<float>()), false);
  measure({"unfused", "silu_mul", io(2 * inner, inner)},
       [&](int, bool) { return cuda::silu_mul(gate_out.as<float>(), up_out.as<float>(), inner, gate_out.as<float>(), stream); },
       false);
  measure({"unfused", "down_proj", down.bytes() + io(inner, h)}, gemv(down, gate_out.as<float>(), x.as<float>()), false);

  // The fused step's kernels.
  cuda::GemvFusion rms;
  rms.input = cuda::GemvInput::kRmsNorm;
  rms.norm_weight = norm;
  rms.norm_eps = eps;
  measure({"fused", "q/k/v grouped, RMSNorm in", q.bytes() + 2 * k.bytes() + io(h, qd + 2 * kvd) + 2.0 * h},
       [&](int call, bool overlap) {
         const cuda::GemvGroupMember members[] = {
             {&q.at(call), q_out.as<float>()}, {&k.at(call), k_out.as<float>()}, {&v.at(call), v_out.as<float>()}};
         cuda::GemvOptions options;
         options.overlap_previous = overlap;
         return cuda::gemv_gptq_grouped(members, x.as<float>(), ws, stream, options, rms);
       },
       true);
  measure({"fused", "RoPE + KV store + attention + combine", kv_bytes + io(qd + 2 * kvd, qd)},
       [&](int call, bool overlap) {
         const int i = call % kv_copies;
         return cuda::decode_attention_rope(q_out.as<float>(), k_out.as<float>(), v_out.as<float>(), inv_freq.as<float>(),
                                            position.as<int32_t>(), caches[2 * i].as<uint16_t>(),
                                            caches[2 * i + 1].as<uint16_t>(), shape, attention_workspace.as<float>(),
                                            attention_counters.as<uint32_t>(), attn.as<float>(), stream, overlap);
       },
       true);
  cuda::GemvFusion add;
  add.residual = x.as<float>();
  measure({"fused", "o_proj, residual add out", o.bytes() + io(qd + h, h)}, gemv(o, attn.as<float>(), x.as<float>(), add), true);
  measure({"fused", "gate/up grouped, RMSNorm in", gate.bytes() + up.bytes() + io(h, 2 * inner) + 2.0 * h},
       [&](int call, bool overlap) {
         const cuda::GemvGroupMember members[] = {{&gate.at(call), gate_out.as<float>()}, {&up.at(call), up_out.as<float>()}};
         cuda::GemvOptions options;
         options.overlap_previous = overlap;
         return cuda::gemv_gptq_grouped(members, x.as<float>(), ws, stream, options, rms);
       },
       true);
  cuda::GemvFusion silu_add;
  silu_add.input = cuda::GemvInput::kSiluMul;
  silu_add.up = up_out.as<float>();
  silu_add.residual = x.as<float>();
  measure({"fused", "down_proj, SiLU*up in, residual add out", down.bytes() + io(2 * inner + h, h)},
       gemv(down, gate_out.as<float>(), x.as<float>(), silu_add), true);

  // The fused GEMVs at fixed k_splits (the planner's choice is marked in the table above by its time), serial
  // and overlapped: printed here, to check the planner for grouped and fused launches.
  std::printf("\nFused GEMVs at fixed k_splits (%s), us per call serial / overlapped:\n\n",
              group < 0 ? "per-channel" : "g128");
  std::printf("| kernel | planned | 1 | 2 | 4 | 8 | 16 | 32 |\n|---|---|---|---|---|---|---|---|\n");
  struct Sweep {
    const char* name;
    std::vector<const MatrixCopies*> members;
    std::vector<float*> outputs;
    const float* in;
    cuda::GemvFusion fusion;
  };
  const Sweep sweeps[] = {
      {"q/k/v + RMSNorm", {&q, &k, &v}, {q_out.as<float>(), k_out.as<float>(), v_out.as<float>()}, x.as<float>(), rms},
      {"o_proj + residual", {&o}, {x.as<float>()}, attn.as<float>(), add},
      {"gate/up + RMSNorm", {&gate, &up}, {gate_out.as<float>(), up_out.as<float>()}, x.as<float>(), rms},
      {"down + SiLU*up + residual", {&down}, {x.as<float>()}, gate_out.as<float>(), silu_add},
  };
  for (const Sweep& sweep : sweeps) {
    std::vector<cuda::GemvGroupMember> probe;
    for (size_t i = 0; i < sweep.members.size(); ++i) probe.push_back({&sweep.members[i]->at(0), sweep.outputs[i]});
    const auto plan = cuda::plan_gemv_gptq_grouped(probe, ws.multiprocessors(), ws.partial_capacity());
    std::printf("| %s | %d |", sweep.name, plan.ok() ? plan->k_splits : -1);
    for (int k_splits : {1, 2, 4, 8, 16, 32}) {
      double us[2] = {0, 0};
      for (bool overlap : {false, true}) {
        us[overlap] = graph_us_per_call(stream, kCalls, kReps, [&](int call) {
          std::vector<cuda::GemvGroupMember> members;
          for (size_t i = 0; i < sweep.members.size(); ++i) members.push_back({&sweep.members[i]->at(call), sweep.outputs[i]});
          cuda::GemvOptions options;
          options.k_splits = k_splits;
          options.overlap_previous = overlap;
          cuda::GemvFusion fusion = sweep.fusion;
          if (members.size() > 1) fusion.residual = nullptr;
          return cuda::gemv_gptq_grouped(members, sweep.in, ws, stream, options, fusion);
        });
      }
      std::printf(" %.2f / %.2f |", us[0], us[1]);
    }
    std::printf("\n");
    std::fflush(stdout);
  }

  // Once per token, both steps.
  measure({"both", "final rms_norm", 2.0 * h + io(h, h), 0},
       [&](int, bool) { return cuda::rms_norm(x.as<float>(), nullptr, 1, h, norm, eps, normed.as<float>(), stream); }, false);
  measure({"both", "lm_head (8-bit)", lm_head.bytes() + io(h, c.vocab_size), 0}, gemv(lm_head, normed.as<float>(), logits.as<float>()),
       false);
  (void)copy_gbs;
  return rows;
}

void print_kernel_table(const std::vector<KernelTiming>& rows, const LlamaConfig& c, int64_t group, double copy_gbs) {
  std::printf("\nEach decode kernel alone (%s, %lld layers), time per call in a CUDA graph; %% copy = bytes / time "
              "against %.0f GB/s:\n\n",
              group < 0 ? "W4 per-channel" : ("W4 g" + std::to_string(group)).c_str(),
              static_cast<long long>(c.num_hidden_layers), copy_gbs);
  std::printf("| step | kernel | per layer | MB moved | floor us | us/call | GB/s | %% copy | us/call overlapped |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  double layer_us[2] = {0, 0}, layer_overlapped_us = 0, once_us = 0;
  for (const KernelTiming& t : rows) {
    const double gbs = t.bytes / (t.serial_us * 1e-6) / 1e9;
    const double floor_us = t.bytes / (copy_gbs * 1e9) * 1e6;
    char overlapped[32] = "";
    if (t.overlapped_us >= 0) std::snprintf(overlapped, sizeof overlapped, "%.2f", t.overlapped_us);
    std::printf("| %s | %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f%% | %s |\n", t.step.c_str(), t.name.c_str(),
                t.per_layer == 0 ? "once" : std::to_string(t.per_layer).c_str(), t.bytes / 1e6, floor_us, t.serial_us, gbs,
                100.0 * gbs / copy_gbs, overlapped);
    if (t.step == "unfused") layer_us[0] += t.per_layer * t.serial_us;
    if (t.step == "fused") {
      layer_us[1] += t.serial_us;
      layer_overlapped_us += t.overlapped_us;
    }
    if (t.step == "both") once_us += t.serial_us;
  }
  const double layers = static_cast<double>(c.num_hidden_layers);
  std::printf("\nSums: unfused layer %.1f us (kernels one after another; the step runs k/v and up beside q and gate), "
              "fused layer %.1f us serial, %.1f us overlapped; once per token %.1f us.\n",
              layer_us[0], layer_us[1], layer_overlapped_us, once_us);
  std::printf("Implied tg: unfused %.0f t/s, fused serial %.0f t/s, fused overlapped %.0f t/s (no host gap counted).\n",
              1e6 / (layers * layer_us[0] + once_us), 1e6 / (layers * layer_us[1] + once_us),
              1e6 / (layers * layer_overlapped_us + once_us));
}

std::unique_ptr<LlamaModel> random_model(const Options& o, int64_t group, std::string& name) {
  auto preset = random_checkpoint_preset_config(o.preset);
  check(preset.status(), "preset");
  nlohmann::json j = nlohmann::json::parse(preset->dump());
  if (o.layers > 0) j["num_hidden_layers"] = o.layers;
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", group}, {"sym", true},
                              {"desc_act", false}, {"lm_head", true}};
  auto config = parse_llama_config(j, o.preset);
  check(config.status(), "config");
  auto source = std::make_unique<RandomGptqSource>(*config, group);
  auto built = LlamaModel::from_source(*config, std::move(source));
  check(built.status(), "binding the random weights");
  name = o.preset + " (" + std::to_string(config->num_hidden_layers) + " layers) W4 " +
         (group < 0 ? "per-channel" : "g" + std::to_string(group)) + ", 8-bit head, random";
  return std::move(built).value();
}

// Bytes of weights one token reads: every linear, plus one embedding row.
double token_weight_bytes(const LlamaModel& model) {
  auto linear_bytes = [](const LinearWeight& w) -> double {
    if (w.kind == LinearWeight::Kind::kGptq) {
      const auto& g = w.gptq;
      return double(g.rows) * g.cols * g.bits / 8 + double(g.n_groups()) * g.rows * (2 + g.bits / 8.0);
    }
    return double(w.dense.rows) * w.dense.cols * dtype_size(w.dense.dtype);
  };
  double bytes = double(embedding_row_bytes(model.weights().embed_tokens));
  for (const LlamaLayerWeights& l : model.weights().layers) {
    for (const LinearWeight* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      bytes += linear_bytes(*w);
    }
  }
  return bytes + linear_bytes(model.weights().lm_head);
}

// The installed timeline ring (main, with --timeline) and the CSV it is written to.
cuda::TimelineRing timeline_ring;
FILE* timeline_csv = nullptr;

// Three decode steps of `gpu` (positions 40 to 42 after a reset), each recorded alone into timeline_csv with
// times relative to the step's first block start.
void record_timeline(CudaModel& gpu, const LlamaConfig& c, const std::string& label, int64_t group) {
  gpu.reset();
  for (int t = 0; t < 40; ++t) check(gpu.decode_logits(static_cast<int32_t>((t * 7919 + 1) % c.vocab_size)).status(), "decode");
  std::vector<uint32_t> words;
  for (int step = 0; step < 3; ++step) {
    CHECK_CUDA(cudaMemset(timeline_ring.count, 0, sizeof(uint32_t)));
    CHECK_CUDA(cudaDeviceSynchronize());
    check(gpu.decode_logits(static_cast<int32_t>((step * 31 + 5) % c.vocab_size)).status(), "decode");
    CHECK_CUDA(cudaDeviceSynchronize());
    uint32_t count = 0;
    CHECK_CUDA(cudaMemcpy(&count, timeline_ring.count, sizeof count, cudaMemcpyDeviceToHost));
    if (count > timeline_ring.capacity) {
      std::fprintf(stderr, "timeline: %u blocks, only %u recorded\n", count, timeline_ring.capacity);
      count = timeline_ring.capacity;
    }
    words.resize(size_t{count} * cuda::kTimelineWords);
    CHECK_CUDA(cudaMemcpy(words.data(), timeline_ring.records, words.size() * 4, cudaMemcpyDeviceToHost));
    constexpr int w = cuda::kTimelineWords;
    uint32_t t_min = count ? words[3] : 0;
    for (uint32_t i = 0; i < count; ++i) {  // the earliest start, modulo 2^32 ns (a step is milliseconds)
      if (static_cast<int32_t>(words[size_t{i} * w + 3] - t_min) < 0) t_min = words[size_t{i} * w + 3];
    }
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t* r = words.data() + size_t{i} * w;
      auto delta = [](uint32_t d) { return d == 0xFFFFFFFFu ? -1.0 : d / 1e3; };
      std::fprintf(timeline_csv, "%s,%lld,%d,%08x,%u,%u,%u,%u,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f\n",
                   label.c_str(), static_cast<long long>(group), step, r[0], r[1] & 0xFFFFu, r[1] >> 16, r[2] & 0xFFFFu,
                   r[2] >> 16, (r[3] - t_min) / 1e3, delta(r[4]), delta(r[5]), delta(r[6]), delta(r[11]), delta(r[7]),
                   delta(r[8]), delta(r[9]), delta(r[10]), gpu.last_step_device_ms());
    }
  }
  std::fflush(timeline_csv);
}

// --warm OP:MIB:REPS:WHEN, parsed; `when` empty where no --warm was given.
struct WarmSpec {
  std::string op, when;
  size_t mib = 0;
  int reps = 0;
};

bool parse_warm(const std::string& s, WarmSpec* w) {
  if (s.empty()) return true;
  std::vector<std::string> f;
  size_t at = 0;
  for (size_t c; (c = s.find(':', at)) != std::string::npos; at = c + 1) f.push_back(s.substr(at, c - at));
  f.push_back(s.substr(at));
  if (f.size() != 4 || (f[0] != "memcpy" && f[0] != "memset") || (f[3] != "before" && f[3] != "after")) return false;
  char* end = nullptr;
  const long mib = std::strtol(f[1].c_str(), &end, 10);
  if (*end || mib <= 0 || mib > 65536) return false;
  const long reps = std::strtol(f[2].c_str(), &end, 10);
  if (*end || reps <= 0 || reps > 10000) return false;
  *w = {f[0], f[3], static_cast<size_t>(mib), static_cast<int>(reps)};
  return true;
}

WarmSpec warm_spec;  // --warm, parsed in main
cudaStream_t warm_stream = nullptr;

void run_warm(const WarmSpec& w, cudaStream_t stream) {
  const size_t bytes = w.mib << 20;
  auto a = take(cuda::DeviceBuffer::allocate(bytes), "--warm: alloc");
  auto b = take(cuda::DeviceBuffer::allocate(bytes), "--warm: alloc");
  for (int r = 0; r < w.reps; ++r) {
    if (w.op == "memcpy") {
      CHECK_CUDA(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      CHECK_CUDA(cudaMemsetAsync(b.data(), r & 0xff, bytes, stream));
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(stream));
}

// What switching Sessions costs on the cuda backend (Session::take_gpu): the owner's rows set aside, the next one's
// brought back, at `positions` positions (rows of whatever the cache holds: only the bytes matter). Median of 11.
void time_stash(CudaModel& gpu, int positions, double copy_gbs) {
  check(gpu.set_position(positions), "set_position (--stash: at most the bench's context of 4096)");
  CudaKvStash stash;
  check(gpu.stash_kv(stash), "stash_kv");  // allocates
  std::vector<double> out_ms, in_ms;
  for (int rep = 0; rep < 11; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    check(gpu.stash_kv(stash), "stash_kv");
    const auto t1 = std::chrono::steady_clock::now();
    check(gpu.unstash_kv(stash), "unstash_kv");
    const auto t2 = std::chrono::steady_clock::now();
    out_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    in_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  const LlamaConfig& c = gpu.config();
  const double bytes = 2.0 * c.num_hidden_layers * positions * c.kv_dim() * sizeof(uint16_t);  // keys and values
  const double out = median(out_ms), in = median(in_ms);
  std::printf("session switch at %d positions (%.1f MB of keys and values each way): set aside %.3f ms, brought back %.3f ms "
              "(%.0f / %.0f GB/s read + write; the copy bandwidth %.0f)\n",
              positions, bytes / 1e6, out, in, 2 * bytes / (out * 1e6), 2 * bytes / (in * 1e6), copy_gbs);
  gpu.reset();
}

void run_tg(const LlamaModel& model, const std::string& name, const Options& o, double copy_gbs) {
  const LlamaConfig& c = model.config();
  const double token_bytes = token_weight_bytes(model);
  const double floor_ms = token_bytes / (copy_gbs * 1e9) * 1e3;
  std::printf("\nmodel: %s; weights read per token %.3f GB: floor %.3f ms/token (%.0f t/s) at the copy bandwidth\n\n",
              name.c_str(), token_bytes / 1e9, floor_ms, 1e3 / floor_ms);
  std::printf("| step | test | upload s | t/s | ms/token | weight GB/s | %% copy | t/s, vector | t/s, top-40 | t/s, no LM head | GPU ms/token | prompt %d ms | top-40 ms | after idle ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
              o.prompt);
  for (const std::string& variant : o.variants) {
    CudaModelOptions options;
    options.context_length = std::min<int64_t>(4096, c.max_position_embeddings);  // or the variant's -ctxN
    options.warm_up = o.warm_up;  // "upload s" is the upload (without --warm-up); rep -1 below warms up
    options.time_steps = o.step_times;  // "GPU ms/token": the steps' GPU time, the rest of ms/token is the host's
    const std::string base_variant = without_probe(variant, &timeline_ring.probe);
    if (timeline_csv) cuda::set_timeline(&timeline_ring);  // the probe, copied into the graphs captured next
    if (!variant_options(base_variant, options)) {
      std::fprintf(stderr, "unknown variant '%s'\n", variant.c_str());
      std::exit(2);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto gpu = CudaModel::create(model, options);
    check(gpu.status(), "CudaModel::create");
    if (warm_spec.when == "after") run_warm(warm_spec, warm_stream);
    const double upload_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string label = variant + (options.resident_step && !(*gpu)->resident_step() ? " (not resident: shapes or GPU)" : "");
    // The tensor-copy GEMVs the device's memory bandwidth chose (CudaModelOptions::kTmaAuto), where it chose any.
    const CudaModelOptions& used = (*gpu)->options();
    std::string chosen;
    for (const auto& [tag, asked, got] : {std::tuple{"tmaq", options.decode_tma_qkv_stages, used.decode_tma_qkv_stages},
                                          std::tuple{"tmag", options.decode_tma_gate_up_stages, used.decode_tma_gate_up_stages},
                                          std::tuple{"tmad", options.decode_tma_down_stages, used.decode_tma_down_stages}}) {
      if (asked == CudaModelOptions::kTmaAuto && got > 0) chosen += std::string(chosen.empty() ? "" : " ") + tag + std::to_string(got);
    }
    if (!chosen.empty()) label += " (auto: " + chosen + ")";
    if (o.stash > 0) time_stash(**gpu, o.stash, copy_gbs);
    std::vector<float> logits;
    // Mean tokens per second over the reps of n_gen steps, each step through `one` (token id, step index).
    std::vector<int32_t> depth_tokens(o.depth);
    for (int i = 0; i < o.depth; ++i) depth_tokens[i] = static_cast<int32_t>((i * 7919 + 5) % c.vocab_size);
    auto tg_rate = [&](const std::function<void(int32_t)>& one) {
      std::vector<double> rates;
      for (int rep = -1; rep < o.reps; ++rep) {  // rep -1: warm-up (graph capture, first touches)
        (*gpu)->reset();
        if (o.depth > 0) {
          check((*gpu)->forward(depth_tokens, LogitsMode::kLast, &logits), "--depth prompt");
        }
        if (o.idle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.idle_ms));
        const auto start = std::chrono::steady_clock::now();
        for (int t = 0; t < o.n_gen; ++t) one(static_cast<int32_t>((t * 7919 + 1) % c.vocab_size));
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rep >= 0) rates.push_back(o.n_gen / s);
      }
      double mean = 0;
      for (double r : rates) mean += r / rates.size();
      return mean;
    };
    float checksum = 0;  // reads the logits, as a caller would
    std::vector<double> device_ms;
    const double mean = tg_rate([&](int32_t token) {
      auto view = (*gpu)->decode_logits(token);
      check(view.status(), "decode_logits");
      checksum += (*view)[static_cast<size_t>(token)];
      device_ms.push_back((*gpu)->last_step_device_ms());
    });
    const double vector_rate = tg_rate([&](int32_t token) { check((*gpu)->decode(token, &logits), "decode"); });
    TopLogits top_step;
    const double top_rate = tg_rate([&](int32_t token) { check((*gpu)->decode_top(token, 40, &top_step), "decode_top"); });
    const double none_rate = tg_rate([&](int32_t token) { check((*gpu)->decode(token, nullptr), "decode"); });
    if (!std::isfinite(checksum)) std::fprintf(stderr, "note: non-finite logits in %s\n", variant.c_str());
    if (timeline_csv) {
      const LinearWeight& q0 = model.weights().layers.at(0).q_proj;  // the group size, for the CSV (-1: per channel)
      const int64_t group = q0.kind != LinearWeight::Kind::kGptq ? 0 : q0.gptq.group_size == q0.gptq.cols ? -1 : q0.gptq.group_size;
      record_timeline(**gpu, c, variant, group);
    }
    const double gbs = token_bytes * mean / 1e9;
    std::string prompt_ms = "- | - | -";
    if (o.prompt > 0) {
      std::vector<int32_t> tokens(o.prompt);
      for (int i = 0; i < o.prompt; ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 3) % c.vocab_size);
      // One prompt from an empty cache, in ms; `profile`: bracketed for a profiler started with capture off (ncu
      // --profile-from-start off: per-kernel times of one prompt; no effect otherwise).
      TopLogits top;
      auto prompt_once = [&](bool top_40, bool profile) {
        (*gpu)->reset();
        if (profile) cudaProfilerStart();
        const auto start = std::chrono::steady_clock::now();
        check(top_40 ? (*gpu)->forward_top(tokens, 40, &top) : (*gpu)->forward(tokens, LogitsMode::kLast, &logits),
              "prompt");
        const double ms = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e3;
        if (profile) cudaProfilerStop();
        return ms;
      };
      // Median of the reps after one untimed prompt (its one-time costs), through forward (kLast: every logit to
      // the host) and through forward_top (the 40 largest chosen on the GPU, as `petrel run` samples with the
      // export's top-k 40: the time to first token less the host sampler's few microseconds).
      auto median_ms = [&](bool top_40) {
        std::vector<double> times;
        for (int rep = -1; rep < std::max(o.reps, 5); ++rep) {
          const double ms = prompt_once(top_40, !top_40 && rep == 0);
          if (rep >= 0) times.push_back(ms);
        }
        std::sort(times.begin(), times.end());
        return times[times.size() / 2];
      };
      const double all_logits = median_ms(false), top_only = median_ms(true);
      // And once after half a second with the GPU idle, as `petrel run`'s one query follows the model's load
      // (its TTFT measured 0.14-0.21 ms above this bench's prompt figure in session 7).
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const double after_idle = prompt_once(true, false);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.2f | %.2f | %.2f", all_logits, top_only, after_idle);
      prompt_ms = buf;
    }
    const std::string test = "tg" + std::to_string(o.n_gen) + (o.depth > 0 ? " @ d" + std::to_string(o.depth) : "");
    std::printf("| %s | %s | %.2f | %.1f | %.3f | %.0f | %.0f%% | %.1f | %.1f | %.1f | %.3f | %s |\n", label.c_str(), test.c_str(),
                upload_s, mean, 1e3 / mean, gbs, 100.0 * gbs / copy_gbs, vector_rate, top_rate, none_rate, median(device_ms),
                prompt_ms.c_str());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--preset") o.preset = value();
    else if (a == "--layers") o.layers = std::stoll(value());
    else if (a == "--group") {
      o.groups.clear();
      for (const std::string& g : split_list(value())) o.groups.push_back(std::stoll(g));
    } else if (a == "--model") o.model = value();
    else if (a == "--reps") o.reps = std::stoi(value());
    else if (a == "-n") o.n_gen = std::stoi(value());
    else if (a == "--prompt") o.prompt = std::stoi(value());
    else if (a == "--depth") o.depth = std::stoi(value());
    else if (a == "--kernels") o.kernels = true;
    else if (a == "--variants") o.variants = split_list(value());
    else if (a == "--timeline") o.timeline = value();
    else if (a == "--warm-up") o.warm_up = true;
    else if (a == "--untimed") o.step_times = false;
    else if (a == "--copy-gbs") o.copy_gbs = std::stod(value());
    else if (a == "--before") o.before = value();
    else if (a == "--warm") o.warm = value();
    else if (a == "--idle-ms") o.idle_ms = std::stoi(value());
    else if (a == "--stash") o.stash = std::stoi(value());
    else {
      std::fprintf(stderr, "usage: petrel_bench_decode_cuda [--preset P] [--layers N] [--group -1|128|-1,128] [--model DIR] "
                           "[--reps N] [-n N] [--prompt N] [--depth N] [--kernels] [--variants LIST] [--timeline FILE] "
                           "[--warm-up] [--untimed] [--copy-gbs X] [--before alloc-free|alloc-keep|memset-free|copy-keep] "
                           "[--warm OP:MIB:REPS:WHEN] [--idle-ms N] [--stash N]\n");
      return 2;
    }
  }
  for (const std::string& v : o.variants) {
    CudaModelOptions unused;
    uint32_t probe = 0;
    if (!variant_options(without_probe(v, &probe), unused) || (probe && o.timeline.empty())) {
      std::fprintf(stderr, "unknown variant '%s'\n", v.c_str());
      return 2;
    }
  }
  if (!o.before.empty() && o.before != "alloc-free" && o.before != "alloc-keep" && o.before != "memset-free" &&
      o.before != "copy-keep") {
    std::fprintf(stderr, "--before: unknown mode '%s' (alloc-free, alloc-keep, memset-free or copy-keep)\n", o.before.c_str());
    return 2;
  }
  if (!parse_warm(o.warm, &warm_spec)) {
    std::fprintf(stderr, "--warm: '%s' is not OP:MIB:REPS:WHEN (OP memcpy or memset, WHEN before or after)\n", o.warm.c_str());
    return 2;
  }
  const cuda::DeviceInfo dev = petrel::bench::open_first_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  warm_stream = stream;
  if (warm_spec.when == "before") run_warm(warm_spec, stream);
  const double copy_gbs = o.copy_gbs > 0 ? o.copy_gbs : copy_bandwidth_gbs(stream, 20);
  std::vector<cuda::DeviceBuffer> held_before;  // --before alloc-keep / copy-keep: kept to the end
  if (!o.before.empty()) {
    const size_t gib = size_t{1} << 30;
    std::vector<cuda::DeviceBuffer> pair;
    for (int i = 0; i < 2; ++i) pair.push_back(take(cuda::DeviceBuffer::allocate(gib), "--before: alloc"));
    if (o.before == "memset-free" || o.before == "copy-keep") {
      for (cuda::DeviceBuffer& b : pair) check(b.fill_bytes(1), "--before: memset");
    }
    if (o.before == "copy-keep") {
      for (int r = 0; r < 21; ++r) {
        CHECK_CUDA(cudaMemcpyAsync(pair[1].data(), pair[0].data(), gib, cudaMemcpyDeviceToDevice, stream));
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
    }
    if (o.before == "alloc-keep" || o.before == "copy-keep") held_before = std::move(pair);  // else freed here
  }
  std::printf("device: %s, %d SMs, %.0f MiB L2, CUDA runtime %s, driver %s\n", dev.name.c_str(), dev.multiprocessors,
              dev.l2_cache_bytes / double(1 << 20), cuda::runtime_version().c_str(), cuda::driver_version().c_str());
  std::printf("device-to-device cudaMemcpy (1 GiB, read + write): %.0f GB/s%s\n", copy_gbs,
              o.copy_gbs > 0 ? " (given)"
                             : " (measured before the model; its copies speed the step as CudaModel's own warm copies do, "
                               "session 46; --copy-gbs X skips it)");
  std::fflush(stdout);
  if (!o.timeline.empty()) {
    timeline_csv = std::fopen(o.timeline.c_str(), "w");
    if (!timeline_csv) {
      std::fprintf(stderr, "cannot write %s\n", o.timeline.c_str());
      return 1;
    }
    std::fprintf(timeline_csv, "variant,group,step,tag,kind,sm,block,steps,t0_us,wait_us,staged_us,loop_us,end_us,t4_us,t5_us,"
                               "t6_us,t7_us,step_ms\n");
    timeline_ring.capacity = 1u << 18;
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&timeline_ring.records), size_t{timeline_ring.capacity} * cuda::kTimelineWords * 4));
    CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&timeline_ring.count), sizeof(uint32_t)));
    CHECK_CUDA(cudaMemset(timeline_ring.count, 0, sizeof(uint32_t)));
    cuda::set_timeline(&timeline_ring);
  }

  if (!o.model.empty()) {
    const auto t_load = std::chrono::steady_clock::now();
    auto loaded = LlamaModel::load(o.model);
    check(loaded.status(), "loading the model");
    std::printf("host load %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());
    run_tg(**loaded, o.model, o, copy_gbs);
    return 0;
  }
  for (int64_t group : o.groups) {
    std::string name;
    const auto t_build = std::chrono::steady_clock::now();
    std::unique_ptr<LlamaModel> model = random_model(o, group, name);
    std::printf("\n(host build of the random weights %.1f s)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_build).count());
    if (o.kernels) {
      const std::vector<KernelTiming> rows = time_kernels(model->config(), group, copy_gbs, stream);
      print_kernel_table(rows, model->config(), group, copy_gbs);
    }
    run_tg(*model, name, o, copy_gbs);
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
