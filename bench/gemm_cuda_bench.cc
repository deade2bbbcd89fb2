// petrel_bench_gemm_cuda: the CUDA W4A16 matrix-matrix product (kernels/cuda/gemm.h) on Llama-3.1-8B's layer
// shapes at prompt-processing batch sizes, each algorithm, against the device's copy bandwidth and cuBLAS's
// own fp16 rate measured in the same run.
//
//   petrel_bench_gemm_cuda [--sweep] [--reps N] [--max-m M] [--m LIST] [--shapes LIST] [--groups LIST] [--json FILE]
//
// For each shape (q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096, down 4096x14336), 4-bit per-channel and
// group 128, and m in 1, 8, 16, 29, 32, 64, 128, 256, 512: the median over --reps (>= 20) of the time per
// call, timed with CUDA events around back-to-back calls (enough calls for ~0.3 ms a repetition) launched on
// one stream and, separately, captured once into a CUDA graph and replayed (the GPU's time without the host's
// launch costs; rates are computed from it), rotating over enough copies of the weights (>= 3, >= 256 MB) that
// they come from device memory, not the 60 MB L2. Algorithms: the fused tensor-core kernel, dequantize + cuBLAS, and cuBLAS on weights
// already in fp16 (gemm_dense: what the dequantization costs on top). TFLOP/s counts 2 * rows * cols * m;
// weight GB/s the GPTQ bytes (qweight, scales, zeros). The tensor-core result is checked against the
// dequant + cuBLAS one (relative L2). Then each layer's 7 linears summed ("ms per layer") and the implied
// prompt tokens/s of 32 layers (linears only: no attention, norms or LM head).
// Up to 32 tokens the batch GEMV (gemv_gptq_batch) is timed too; --max-m skips the larger m, --m 29,32 times
// only those m. --shapes picks shapes by key (default qo,kv,gateup,down: the layer's linears); qkv (6144x4096)
// and gateup2 (28672x4096) are the prompt processor's one-launch groups (gemm_gptq_group plans q/k/v and
// gate+up as one matrix of all their rows), timed as that one matrix and left out of the layer sums.
// --groups (default -1,128: per channel and group 128) takes other group sizes dividing every shape's columns,
// e.g. 2048: the grouped kernel with almost no group changes, to tell the scale folding's cost from the
// group changes'.
// --sweep also times the fused kernel at fixed token tiles, warps, pipeline stages and splits (the 3 fastest
// printed, all in the JSON), to check the planner.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_bench_util.h"
#include "petrel/kernels/cuda/blas_check.h"
#include "petrel/kernels/cuda/cuda_check.h"
#include "petrel/kernels/cuda/device.h"
#include "petrel/kernels/cuda/gemm.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/util/dtype.h"

namespace {

using namespace petrel;
using petrel::bench::check;
using petrel::bench::copy_bandwidth_gbs;
using petrel::bench::median;
using petrel::bench::split_list;
using petrel::bench::take;
#define CHECK_CUDA PETREL_BENCH_CHECK_CUDA

struct Timing {
  double stream_us = 0;  // launched on a stream
  double graph_us = NAN;  // the same calls captured once into a CUDA graph and replayed: no host launch costs
};

// Median microseconds per call of `call(i)` (i counts calls, for rotating weight copies; it returns a Status),
// over `reps` repetitions of enough back-to-back calls for ~0.3 ms, on the stream and (with_graph) replayed
// from a graph.
template <typename Call>
Timing time_calls(cudaStream_t stream, int reps, Call call, bool with_graph = true) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  int counter = 0;
  auto elapsed_us = [&] {
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1000.0;
  };
  auto timed = [&](int calls) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int c = 0; c < calls; ++c) check(call(counter++), "call");
    CHECK_CUDA(cudaEventRecord(stop, stream));
    return elapsed_us() / calls;
  };
  timed(2);  // warm-up: module load, cuBLAS heuristics, first touch
  const double one = timed(3);
  const int calls = static_cast<int>(std::clamp(300.0 / std::max(one, 1e-3), 1.0, 50.0));
  Timing t;
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) samples.push_back(timed(calls));
  t.stream_us = median(samples);
  if (with_graph) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool captured = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int c = 0; captured && c < calls; ++c) captured = call(counter++).ok();
    const bool ended = cudaStreamEndCapture(stream, &graph) == cudaSuccess;
    if (captured && ended && graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess) {
      CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
      CHECK_CUDA(cudaStreamSynchronize(stream));
      samples.clear();
      for (int r = 0; r < reps; ++r) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        CHECK_CUDA(cudaGraphLaunch(exec, stream));
        CHECK_CUDA(cudaEventRecord(stop, stream));
        samples.push_back(elapsed_us() / calls);
      }
      t.graph_us = median(samples);
    } else {
      std::fprintf(stderr, "graph capture failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    }
    cudaGetLastError();
    if (exec) CHECK_CUDA(cudaGraphExecDestroy(exec));
    if (graph) CHECK_CUDA(cudaGraphDestroy(graph));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaGetLastError());
  return t;
}

struct Shape {
  const char* key;  // --shapes
  const char* name;
  int64_t rows, cols;
  int per_layer;  // how many of the 7 linears have this shape
};

// One GPTQ matrix in device memory, in `copies` copies.
struct GptqCopies {
  std::vector<cuda::DeviceBuffer> buffers;
  std::vector<cuda::DeviceGptqMatrix> views;
  int64_t weight_bytes = 0;
};

GptqCopies make_gptq(const Shape& s, int64_t group, std::mt19937& rng) {
  GptqCopies g;
  cuda::DeviceGptqMatrix v;
  v.bits = 4;
  v.rows = s.rows;
  v.cols = s.cols;
  v.group_size = group < 0 ? s.cols : group;
  v.zero_offset = 1;
  const int64_t groups = s.cols / v.group_size;
  std::vector<int32_t> qweight(s.cols / 8 * s.rows), qzeros(groups * s.rows / 8);
  std::vector<uint16_t> scales(groups * s.rows);
  std::uniform_int_distribution<uint32_t> word;
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  for (int32_t& w : qweight) w = static_cast<int32_t>(word(rng));
  for (int32_t& w : qzeros) w = static_cast<int32_t>(word(rng));
  for (uint16_t& h : scales) h = f32_to_f16(scale(rng));
  g.weight_bytes = v.weight_bytes();
  const int copies = static_cast<int>(std::clamp<int64_t>((int64_t{256} << 20) / g.weight_bytes + 1, 3, 64));
  for (int c = 0; c < copies; ++c) {
    auto upload = [&](const void* data, size_t bytes) {
      g.buffers.push_back(take(cuda::DeviceBuffer::allocate(bytes), "alloc weights"));
      check(g.buffers.back().upload(data, bytes), "upload weights");
      return g.buffers.back().data();
    };
    v.qweight = static_cast<const int32_t*>(upload(qweight.data(), qweight.size() * 4));
    v.scales = static_cast<const uint16_t*>(upload(scales.data(), scales.size() * 2));
    v.qzeros = static_cast<const int32_t*>(upload(qzeros.data(), qzeros.size() * 4));
    g.views.push_back(v);
  }
  return g;
}

const char* algorithm_name(cuda::GemmAlgorithm a) {
  switch (a) {
    case cuda::GemmAlgorithm::kAuto: return "auto";
    case cuda::GemmAlgorithm::kTensorCore: return "tensor core";
    case cuda::GemmAlgorithm::kDequantCublas: return "dequant+cuBLAS";
  }
  return "?";
}

std::string plan_string(const cuda::GemmPlan& p) {
  if (p.algorithm == cuda::GemmAlgorithm::kDequantCublas) return "slice " + std::to_string(p.slice_rows);
  return "tile " + std::to_string(p.token_tile) + " w" + std::to_string(p.warps) + " s" + std::to_string(p.stages) +
         " k" + std::to_string(p.k_splits);
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool sweep = false;
  int64_t max_tokens = 512;
  std::string json_path;
  std::vector<int64_t> only_m;
  std::vector<int64_t> groups = {-1, 128};
  std::vector<std::string> shape_keys = {"qo", "kv", "gateup", "down"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sweep") sweep = true;
    else if (arg == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (arg == "--max-m" && i + 1 < argc) max_tokens = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--m" && i + 1 < argc) {
      for (const std::string& item : split_list(argv[++i])) only_m.push_back(std::max(1, std::atoi(item.c_str())));
    } else if (arg == "--shapes" && i + 1 < argc) shape_keys = split_list(argv[++i]);
    else if (arg == "--groups" && i + 1 < argc) {
      groups.clear();
      for (const std::string& item : split_list(argv[++i])) groups.push_back(std::atoll(item.c_str()));
    }
    else {
      std::fprintf(stderr, "usage: %s [--sweep] [--reps N] [--max-m M] [--m LIST] [--shapes qo,kv,gateup,down,qkv,gateup2] [--groups -1,128] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  const cuda::DeviceInfo dev = petrel::bench::open_first_device();
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto ws = take(cuda::GemmWorkspace::create(), "workspace");
  auto gemv_ws = take(cuda::GemvWorkspace::create(int64_t{4} << 20), "gemv workspace");  // as CudaModel's prompt processor

  const double copy_gbs = copy_bandwidth_gbs(stream, 20);
  // The peer ceiling: cuBLAS fp16 x fp16 -> float32 (float32 compute), 4096x4096 weights, 512 tokens, and a
  // large square product.
  auto peer_tflops = [&](int64_t rows, int64_t cols, int64_t m) {
    auto a = take(cuda::DeviceBuffer::allocate(rows * cols * 2), "alloc");
    auto b = take(cuda::DeviceBuffer::allocate(m * cols * 2), "alloc");
    auto c = take(cuda::DeviceBuffer::allocate(m * rows * 4), "alloc");
    // Random fp16 data (not zeros: zeros run faster than real data).
    std::vector<uint16_t> host(std::max(rows, m) * cols);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (uint16_t& h : host) h = f32_to_f16(normal(rng));
    check(a.upload(host.data(), rows * cols * 2), "upload");
    check(b.upload(host.data(), m * cols * 2), "upload");
    check(ws.bind_blas(stream), "bind");
    const float one = 1, zero = 0;
    const double us = time_calls(stream, reps, [&](int) {
      return cuda::blas_status(
          cublasGemmEx(ws.blas().get(), CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(m), int(cols), &one, a.data(),
                       CUDA_R_16F, int(cols), b.data(), CUDA_R_16F, int(cols), &zero, c.data(), CUDA_R_32F, int(rows),
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    }, false).stream_us;
    return 2.0 * rows * cols * m / (us * 1e-6) / 1e12;
  };
  const double peer_4096 = peer_tflops(4096, 4096, 512);
  const double peer_8192 = peer_tflops(8192, 8192, 8192);
  std::printf("device: %s, %d SMs, %.0f MiB L2, CUDA runtime %s, driver %s\n", dev.name.c_str(), dev.multiprocessors,
              dev.l2_cache_bytes / double(1 << 20), cuda::runtime_version().c_str(), cuda::driver_version().c_str());
  std::printf("device-to-device cudaMemcpy (1 GiB, read + write): %.0f GB/s\n", copy_gbs);
  std::printf("cublasGemmEx fp16 in, f32 out/compute: 4096x4096 x 512 tokens %.0f TFLOP/s; 8192^3 %.0f TFLOP/s\n\n",
              peer_4096, peer_8192);

  const Shape all_shapes[] = {{"qo", "q/o_proj 4096x4096", 4096, 4096, 2},
                               {"kv", "k/v_proj 1024x4096", 1024, 4096, 2},
                               {"gateup", "gate/up 14336x4096", 14336, 4096, 2},
                               {"down", "down 4096x14336", 4096, 14336, 1},
                               {"qkv", "q/k/v one launch 6144x4096", 6144, 4096, 0},
                               {"gateup2", "gate+up one launch 28672x4096", 28672, 4096, 0}};
  std::vector<Shape> shapes;
  for (const std::string& key : shape_keys) {
    const Shape* found = nullptr;
    for (const Shape& s : all_shapes) found = key == s.key ? &s : found;
    if (!found) {
      std::fprintf(stderr, "--shapes: unknown shape '%s' (qo, kv, gateup, down, qkv, gateup2)\n", key.c_str());
      return 2;
    }
    shapes.push_back(*found);
  }
  std::vector<int64_t> ms = {1, 8, 16, 29, 32, 64, 128, 256, 512};
  if (!only_m.empty()) ms = only_m;
  const int64_t max_m = std::max<int64_t>(512, *std::max_element(ms.begin(), ms.end()));
  std::mt19937 rng(7);
  std::vector<float> x_host(max_m * 14336);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x_host) v = normal(rng);
  auto x_dev = take(cuda::DeviceBuffer::allocate(x_host.size() * 4), "alloc x");
  check(x_dev.upload(x_host.data(), x_host.size() * 4), "upload x");
  auto y_dev = take(cuda::DeviceBuffer::allocate(max_m * 28672 * 4), "alloc y");  // the most rows of any shape
  const float* x = x_dev.as<float>();
  float* y = y_dev.as<float>();

  nlohmann::json results = nlohmann::json::array();
  // [group][algorithm name][m] -> microseconds for one layer's 7 linears.
  // [group][algorithm][m] -> microseconds for one layer's 7 linears, on the stream and replayed from a graph.
  std::map<std::string, std::map<std::string, std::map<int64_t, Timing>>> layer_us;
  auto add_layer = [&](const std::string& group, const std::string& algorithm, int64_t m, const Timing& t, int count) {
    if (count == 0) return;  // the one-launch groups: not a linear of their own
    Timing& sum = layer_us[group][algorithm][m];
    if (sum.stream_us == 0) sum.graph_us = 0;
    sum.stream_us += t.stream_us * count;
    sum.graph_us += t.graph_us * count;  // NaN if a capture failed
  };
  std::printf("| shape | group | m | algorithm | plan | us/call (stream) | us/call (graph) | TFLOP/s | weight GB/s | "
              "rel L2 vs cuBLAS path |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t group : groups) {
    const std::string group_name = group < 0 ? "channel" : std::to_string(group);
    for (const Shape& s : shapes) {
      GptqCopies g = make_gptq(s, group, rng);
      // fp16 weights for the cuBLAS-only row: 3 copies of up to 117 MB.
      std::vector<cuda::DeviceBuffer> dense_buffers;
      {
        std::vector<uint16_t> w16(s.rows * s.cols);
        for (uint16_t& h : w16) h = f32_to_f16(0.01f * normal(rng));
        for (int c = 0; c < 3; ++c) {
          dense_buffers.push_back(take(cuda::DeviceBuffer::allocate(w16.size() * 2), "alloc dense"));
          check(dense_buffers.back().upload(w16.data(), w16.size() * 2), "upload dense");
        }
      }
      for (int64_t m : ms) {
        if (m > max_tokens) continue;
        const double flop = 2.0 * s.rows * s.cols * m;
        // Correctness of the fused kernel against the dequant + cuBLAS path on the same weights.
        std::vector<float> reference(m * s.rows), fused(m * s.rows);
        check(cuda::gemm_gptq(g.views[0], x, m, y, ws, stream, {cuda::GemmAlgorithm::kDequantCublas}), "gemm");
        CHECK_CUDA(cudaMemcpyAsync(reference.data(), y, reference.size() * 4, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        check(y_dev.fill_bytes(0xFF), "poison");
        check(cuda::gemm_gptq(g.views[0], x, m, y, ws, stream, {cuda::GemmAlgorithm::kTensorCore}), "gemm");
        CHECK_CUDA(cudaMemcpyAsync(fused.data(), y, fused.size() * 4, cudaMemcpyDeviceToHost, stream));
        CHECK_CUDA(cudaStreamSynchronize(stream));
        const double rel = relative_l2(fused, reference);

        auto report = [&](const std::string& algorithm, const std::string& plan, const Timing& t, double rel_l2) {
          const double us = std::isfinite(t.graph_us) ? t.graph_us : t.stream_us;  // rates from the GPU's own time
          const double tflops = flop / (us * 1e-6) / 1e12, gbs = g.weight_bytes / (us * 1e-6) / 1e9;
          char rel_text[32] = "";
          if (rel_l2 >= 0) std::snprintf(rel_text, sizeof rel_text, "%.2e", rel_l2);
          std::printf("| %s | %s | %lld | %s | %s | %.1f | %.1f | %.1f | %.0f | %s |\n", s.name, group_name.c_str(),
                      (long long)m, algorithm.c_str(), plan.c_str(), t.stream_us, t.graph_us, tflops, gbs, rel_text);
          std::fflush(stdout);
          results.push_back({{"shape", s.name}, {"rows", s.rows}, {"cols", s.cols}, {"group", group_name}, {"m", m},
                             {"algorithm", algorithm}, {"plan", plan}, {"stream_us", t.stream_us},
                             {"graph_us", t.graph_us}, {"tflops", tflops}, {"weight_gbs", gbs}, {"rel_l2", rel_l2}});
        };
        Timing best{INFINITY, INFINITY};
        for (auto algorithm : {cuda::GemmAlgorithm::kTensorCore, cuda::GemmAlgorithm::kDequantCublas,
                               cuda::GemmAlgorithm::kAuto}) {
          const cuda::GemmOptions options{algorithm};
          const cuda::GemmPlan plan = take(
              cuda::plan_gemm_gptq(g.views[0], m, ws.multiprocessors(), ws.capacity(), ws.counter_capacity(), options),
              "plan");
          const Timing t = time_calls(stream, reps, [&](int i) {
            return cuda::gemm_gptq(g.views[i % g.views.size()], x, m, y, ws, stream, options);
          });
          const std::string name = algorithm_name(algorithm);
          report(name, plan_string(plan), t, algorithm == cuda::GemmAlgorithm::kTensorCore ? rel : -1);
          add_layer(group_name, name, m, t, s.per_layer);
          if (algorithm != cuda::GemmAlgorithm::kAuto) {
            best.stream_us = std::min(best.stream_us, t.stream_us);
            best.graph_us = std::min(best.graph_us, t.graph_us);
          }
        }
        add_layer(group_name, "best of the two", m, best, s.per_layer);
        {
          const Timing t = time_calls(stream, reps, [&](int i) {
            const cuda::DeviceDenseMatrix dense{DType::kF16, s.rows, s.cols, dense_buffers[i % 3].data()};
            return cuda::gemm_dense(dense, x, m, y, ws, stream);
          });
          report("cuBLAS on fp16 W (no dequant)", "", t, -1);
          add_layer(group_name, "cuBLAS on fp16 W", m, t, s.per_layer);
        }
        if (m <= cuda::kMaxGemvTokens) {
          // The batch GEMV (gemv_gptq_batch: the token generator's kernel over up to 32 tokens), overlapping
          // the previous call as in the prompt processor; checked against the dequant + cuBLAS result.
          auto batch_plan = [&](const cuda::GemvOptions& options) {
            const cuda::GemvGroupMember member{&g.views[0], y};
            return cuda::plan_gemv_gptq_batch(std::span(&member, 1), m, gemv_ws.multiprocessors(),
                                              gemv_ws.partial_capacity(), options);
          };
          auto batch_string = [](const cuda::GemvPlan& p) {
            return "splits " + std::to_string(p.k_splits) + ", row tiles " + std::to_string(p.row_tiles);
          };
          auto batch_time = [&](const cuda::GemvOptions& options, int batch_reps) {
            return time_calls(stream, batch_reps, [&](int i) {
              const cuda::GemvGroupMember member{&g.views[i % g.views.size()], y};
              return cuda::gemv_gptq_batch(std::span(&member, 1), x, m, gemv_ws, stream, options);
            });
          };
          cuda::GemvOptions options;
          options.overlap_previous = true;
          std::vector<float> got(m * s.rows);
          check(y_dev.fill_bytes(0xFF), "poison");
          const cuda::GemvGroupMember member{&g.views[0], y};
          check(cuda::gemv_gptq_batch(std::span(&member, 1), x, m, gemv_ws, stream, options), "batch gemv");
          CHECK_CUDA(cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, stream));
          CHECK_CUDA(cudaStreamSynchronize(stream));
          const Timing t = batch_time(options, reps);
          report("batch gemv", batch_string(take(batch_plan(options), "batch plan")), t, relative_l2(got, reference));
          add_layer(group_name, "batch gemv", m, t, s.per_layer);
          if (sweep && (m == 8 || m == 16 || m == 29 || m == 32)) {
            struct Variant { Timing t; std::string plan; };
            std::vector<Variant> variants;
            for (int row_tiles : {1, 2, 4}) {
              for (int splits : {0, 1, 2, 4, 8, 16}) {
                cuda::GemvOptions o = options;
                o.row_tiles = row_tiles;
                o.k_splits = splits;
                auto plan = batch_plan(o);
                if (!plan.ok() || (splits > 0 && plan->k_splits != splits)) continue;
                const Timing vt = batch_time(o, std::max(5, reps / 2));
                variants.push_back({vt, batch_string(*plan) + (splits == 0 ? " (planned splits)" : "")});
                results.push_back({{"shape", s.name}, {"group", group_name}, {"m", m}, {"algorithm", "batch gemv sweep"},
                                   {"plan", variants.back().plan}, {"stream_us", vt.stream_us}, {"graph_us", vt.graph_us}});
              }
            }
            std::sort(variants.begin(), variants.end(),
                      [](const Variant& a, const Variant& b) { return a.t.graph_us < b.t.graph_us; });
            for (size_t i = 0; i < std::min<size_t>(4, variants.size()); ++i) {
              report("batch sweep #" + std::to_string(i + 1), variants[i].plan, variants[i].t, -1);
            }
          }
        }
        if (sweep && (m == 16 || m == 29 || m == 64 || m == 128 || m == 256 || m == 512)) {
          struct Variant { Timing t; std::string plan; };
          std::vector<Variant> variants;
          for (int tile : {16, 32, 64}) {
            for (int warps : {4, 8}) {
              for (int stages : {2, 3}) {
                for (int splits : {0, 1, 2, 4, 8}) {
                  const cuda::GemmOptions options{cuda::GemmAlgorithm::kTensorCore, tile, warps, splits, stages};
                  auto plan = cuda::plan_gemm_gptq(g.views[0], m, ws.multiprocessors(), ws.capacity(),
                                                   ws.counter_capacity(), options);
                  if (!plan.ok()) continue;
                  if (splits > 0 && plan->k_splits != splits) continue;
                  const Timing t = time_calls(stream, std::max(5, reps / 2), [&](int i) {
                    return cuda::gemm_gptq(g.views[i % g.views.size()], x, m, y, ws, stream, options);
                  });
                  variants.push_back({t, plan_string(*plan) + (splits == 0 ? " (planned splits)" : "")});
                  results.push_back({{"shape", s.name}, {"group", group_name}, {"m", m}, {"algorithm", "sweep"},
                                     {"plan", variants.back().plan}, {"stream_us", t.stream_us},
                                     {"graph_us", t.graph_us}, {"tflops", flop / (t.graph_us * 1e-6) / 1e12}});
                }
              }
            }
          }
          std::sort(variants.begin(), variants.end(),
                    [](const Variant& a, const Variant& b) { return a.t.graph_us < b.t.graph_us; });
          for (size_t i = 0; i < std::min<size_t>(3, variants.size()); ++i) {
            report("sweep #" + std::to_string(i + 1), variants[i].plan, variants[i].t, -1);
          }
        }
      }
    }
  }

  // Whole layers (only when all four layer shapes ran).
  int layer_shapes = 0;
  for (const Shape& s : shapes) layer_shapes += s.per_layer > 0;
  if (layer_shapes < 4) layer_us.clear();
  std::printf("\n## Llama-3.1-8B layer linears (q, k, v, o, gate, up, down), 4-bit; 32 layers for tok/s (linears only)\n\n");
  std::printf("| group | algorithm | m | us per layer (stream) | us per layer (graph) | TFLOP/s (graph) | "
              "tok/s, 32 layers (graph) |\n|---|---|---|---|---|---|---|\n");
  const double layer_weights = 2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 14336 * 4096;
  nlohmann::json layers = nlohmann::json::array();
  for (auto& [group_name, by_algorithm] : layer_us) {
    for (auto& [algorithm, by_m] : by_algorithm) {
      for (auto& [m, t] : by_m) {
        const double tflops = 2.0 * layer_weights * m / (t.graph_us * 1e-6) / 1e12;
        const double tok_s = m / (32.0 * t.graph_us * 1e-6);
        layers.push_back({{"group", group_name}, {"algorithm", algorithm}, {"m", m}, {"stream_us_per_layer", t.stream_us},
                          {"graph_us_per_layer", t.graph_us}, {"tflops_graph", tflops}, {"tok_s_32_layers_graph", tok_s}});
        if (m == 29 || m == 128 || m == 512) {
          std::printf("| %s | %s | %lld | %.1f | %.1f | %.1f | %.0f |\n", group_name.c_str(), algorithm.c_str(),
                      (long long)m, t.stream_us, t.graph_us, tflops, tok_s);
        }
      }
    }
  }
  if (!json_path.empty()) {
    nlohmann::json doc = {{"device", dev.name}, {"copy_gbs", copy_gbs}, {"peer_tflops_4096x4096x512", peer_4096},
                          {"peer_tflops_8192", peer_8192}, {"reps", reps}, {"results", results}, {"layers", layers}};
    std::ofstream(json_path) << doc.dump(2) << "\n";
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  return 0;
}
