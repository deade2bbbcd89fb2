// The resident GEMV chain (kernels/cuda/resident_gemv.cu) alone: one decode layer's products between two
// attention calls (o, gate/up, down, the next q/k/v) as one resident launch against the fused step's four
// grouped GEMV launches (programmatic dependent launch, 16 steps of L2 prefetch), each replayed from a CUDA
// graph of --calls chains over --layers distinct layers' weights (so that L2 does not hold them), and the
// resident chain with parts of its work left out (ResidentGemvChains::Probe), at 2 to 4 blocks an SM and with
// several input slicings (ResidentGemvOptions::min_unit_steps).
//   petrel_bench_resident_cuda [--hidden 4096 --kv 1024 --inner 14336] [--group 128|-1] [--layers 3]
//                              [--calls 15] [--reps 15] [--chains 0123,12,1,...]
// --chains: which products make a chain, as digits into o (0), gate/up (1), down (2), q/k/v (3), in order;
// each set is timed as resident launches against as many grouped launches (every probe row for 0123 only).
// Random codes, scales and zeros: the timing does not depend on the values.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_bench_util.h"
#include "petrel/kernels/cuda/gemv_gptq.h"
#include "petrel/kernels/cuda/resident_gemv.h"
#include "petrel/kernels/cuda/stream.h"

using namespace petrel;
using namespace petrel::bench;

namespace {

struct Matrix {
  cuda::DeviceBuffer qweight, scales, qzeros;
  cuda::DeviceGptqMatrix view;
};

Matrix random_matrix(std::mt19937& rng, int64_t rows, int64_t cols, int64_t group) {
  Matrix m;
  m.view.bits = 4;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.group_size = group > 0 ? group : cols;
  const int64_t groups = m.view.n_groups();
  std::vector<uint32_t> words(static_cast<size_t>(cols / 8 * rows));
  for (uint32_t& w : words) w = rng();
  std::vector<uint16_t> scales(static_cast<size_t>(groups * rows), 0x211F);  // fp16 ~0.01
  std::vector<uint32_t> zeros(static_cast<size_t>(groups * rows / 8), 0x77777777u);
  m.qweight = take(cuda::DeviceBuffer::allocate(words.size() * 4), "alloc");
  m.scales = take(cuda::DeviceBuffer::allocate(scales.size() * 2), "alloc");
  m.qzeros = take(cuda::DeviceBuffer::allocate(zeros.size() * 4), "alloc");
  check(m.qweight.upload(words.data(), words.size() * 4), "upload");
  check(m.scales.upload(scales.data(), scales.size() * 2), "upload");
  check(m.qzeros.upload(zeros.data(), zeros.size() * 4), "upload");
  m.view.qweight = m.qweight.as<int32_t>();
  m.view.scales = m.scales.as<uint16_t>();
  m.view.qzeros = m.qzeros.as<int32_t>();
  return m;
}

struct Layer {
  Matrix q, k, v, o, gate, up, down;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t hidden = 4096, kv = 1024, inner = 14336, group = 128;
  int layers = 3, calls = 15, reps = 15;
  std::vector<std::string> sets = {"0123"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--hidden") hidden = next();
    else if (a == "--kv") kv = next();
    else if (a == "--inner") inner = next();
    else if (a == "--group") group = next();
    else if (a == "--layers") layers = static_cast<int>(std::max<int64_t>(1, next()));
    else if (a == "--calls") calls = static_cast<int>(std::max<int64_t>(1, next()));
    else if (a == "--reps") reps = static_cast<int>(std::max<int64_t>(3, next()));
    else if (a == "--chains" && i + 1 < argc) {
      sets.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const std::string set = list.substr(at, comma - at);
        if (set.empty() || set.size() > 4 || set.find_first_not_of("0123") != std::string::npos) {
          std::fprintf(stderr, "--chains: '%s' is not a list of products 0-3 (o, gate/up, down, q/k/v)\n", set.c_str());
          return 2;
        }
        sets.push_back(set);
        at = comma + 1;
      }
    }
    else {
      std::fprintf(stderr, "usage: petrel_bench_resident_cuda [--hidden N --kv N --inner N] [--group G|-1] [--layers N] "
                           "[--calls N] [--reps N] [--chains 0123,12,...]\n");
      return 2;
    }
  }
  const cuda::DeviceInfo info = open_first_device();
  std::mt19937 rng(7);
  std::vector<Layer> w(static_cast<size_t>(layers));
  for (Layer& l : w) {
    l.q = random_matrix(rng, hidden, hidden, group);
    l.k = random_matrix(rng, kv, hidden, group);
    l.v = random_matrix(rng, kv, hidden, group);
    l.o = random_matrix(rng, hidden, hidden, group);
    l.gate = random_matrix(rng, inner, hidden, group);
    l.up = random_matrix(rng, inner, hidden, group);
    l.down = random_matrix(rng, hidden, inner, group);
  }
  auto floats = [](int64_t n) {
    cuda::DeviceBuffer b = take(cuda::DeviceBuffer::allocate(static_cast<size_t>(n) * 4), "alloc");
    check(b.fill_bytes(0), "fill");
    return b;
  };
  cuda::DeviceBuffer x = floats(hidden), q = floats(hidden), k = floats(kv), v = floats(kv), gate = floats(inner),
                     up = floats(inner), norm = floats(hidden);
  std::vector<float> ones(static_cast<size_t>(hidden), 1.0f), x0(static_cast<size_t>(hidden), 0.01f);
  check(norm.upload(ones.data(), ones.size() * 4), "upload");
  check(x.upload(x0.data(), x0.size() * 4), "upload");
  cuda::GemvFusion normed, add, silu_add;
  normed.input = cuda::GemvInput::kRmsNorm;
  normed.norm_weight = cuda::DeviceVector{DType::kF32, hidden, norm.data()};
  normed.norm_eps = 1e-5f;
  add.residual = x.as<float>();
  silu_add.input = cuda::GemvInput::kSiluMul;
  silu_add.up = up.as<float>();
  silu_add.residual = x.as<float>();
  cuda::GemvWorkspace workspace = take(cuda::GemvWorkspace::create(), "workspace");
  cuda::CudaStream stream = take(cuda::CudaStream::create(), "stream");
  const double copy_gbs = copy_bandwidth_gbs(stream.get(), 5);
  std::printf("device: %s, %d SMs; layers of [%lld hidden, %lld kv, %lld inner], group %lld; copy %.0f GB/s\n",
              info.name.c_str(), info.multiprocessors, static_cast<long long>(hidden), static_cast<long long>(kv),
              static_cast<long long>(inner), static_cast<long long>(group), copy_gbs);
  const char* const product_names[4] = {"o", "gate-up", "down", "qkv"};
  for (const std::string& set : sets) {
    // The chain: the products of `set` (digits into o, gate/up, down, q/k/v), in that order.
    std::vector<std::vector<cuda::ResidentGemv>> chains;
    int64_t chain_bytes = 0;
    std::string names;
    for (const Layer& l : w) {
      cuda::ResidentGemv all[4] = {
          {{{&l.o.view, x.as<float>()}}, q.as<float>(), add},
          {{{&l.gate.view, gate.as<float>()}, {&l.up.view, up.as<float>()}}, x.as<float>(), normed},
          {{{&l.down.view, x.as<float>()}}, gate.as<float>(), silu_add},
          {{{&l.q.view, q.as<float>()}, {&l.k.view, k.as<float>()}, {&l.v.view, v.as<float>()}}, x.as<float>(), normed}};
      std::vector<cuda::ResidentGemv> chain;
      chain_bytes = 0;
      names.clear();
      for (char d : set) {
        const int p = d - '0';
        chain.push_back(all[p]);
        names += (names.empty() ? "" : "/") + std::string(product_names[p]);
        for (const cuda::GemvGroupMember& m : all[p].members) chain_bytes += m.w->weight_bytes();
      }
      chains.push_back(chain);
    }
    const int n_products = static_cast<int>(set.size());
    std::printf("\n### chain %s: %.1f MB, floor %.2f us a chain\n\n", names.c_str(), chain_bytes / 1e6,
                chain_bytes / copy_gbs / 1e3);
    std::printf("| variant | us a chain | GB/s | %% of copy |\n|---|---:|---:|---:|\n");
    auto time_graph = [&](const std::function<Status(int)>& enqueue) {
      check(cuda::CudaGraph::begin_capture(stream.get()), "capture");
      Status enqueued = ok_status();
      for (int c = 0; c < calls && enqueued.ok(); ++c) enqueued = enqueue(c);
      auto graph = cuda::CudaGraph::end_capture(stream.get());
      check(enqueued, "enqueue");
      check(graph.status(), "end capture");
      return median_event_us(stream.get(), reps, [&] { check(graph->launch(stream.get()), "graph launch"); }) / calls;
    };
    auto row = [&](const std::string& name, double us) {
      const double gbs = chain_bytes / us / 1e3;
      std::printf("| %s | %.2f | %.0f | %.0f%% |\n", name.c_str(), us, gbs, 100.0 * gbs / copy_gbs);
      std::fflush(stdout);
    };
    cuda::GemvOptions options;
    options.overlap_previous = true;
    const double launches = time_graph([&](int c) -> Status {
      for (const cuda::ResidentGemv& g : chains[static_cast<size_t>(c % layers)]) {
        PETREL_RETURN_IF_ERROR(cuda::gemv_gptq_grouped(g.members, g.x, workspace, stream.get(), options, g.fusion));
      }
      return ok_status();
    });
    row(std::to_string(n_products) + " grouped GEMV launches (the fused step's)", launches);
    const bool all_rows = set == "0123";
    // order 0: slices outermost (the default), 1: tiles outermost, 2: slices outermost from the tiled copy.
    for (int order : {2, 0, 1}) {
    for (int unit_steps : {32, 0, 8, 16, 64}) {
    for (int per_sm : {4, 3, 2}) {
      if (unit_steps != 32 && per_sm != 4) continue;
      if ((order == 1 || !all_rows) && per_sm != 4) continue;
      if (!all_rows && order == 1) continue;
      cuda::ResidentGemvOptions ro;
      ro.max_blocks_per_sm = per_sm;
      ro.min_unit_steps = unit_steps;
      ro.slices_outermost = order != 1;
      ro.tiled_copy = order == 2;
      auto created = cuda::ResidentGemvChains::create(chains, workspace.partial_capacity(), ro);
      if (!created.ok()) {
        std::printf("| (%s) | | | |\n", created.status().to_string().c_str());
        continue;
      }
      cuda::ResidentGemvChains resident = std::move(created).value();
      std::string splits;
      for (int p = 0; p < n_products; ++p) splits += (p ? "/" : "") + std::to_string(resident.k_splits(0, p));
      struct ProbeRow { int flags; const char* what; };
      const ProbeRow probes[] = {{0, ""},
                                 {cuda::ResidentGemvChains::kSkipWaits, ", no waits"},
                                 {cuda::ResidentGemvChains::kSkipMath, ", no arithmetic"},
                                 {cuda::ResidentGemvChains::kSkipStaging, ", no staging of x"},
                                 {7, ", weights only"},
                                 {7 | cuda::ResidentGemvChains::kSkipParams, ", weights only, no scales and zeros"},
                                 {7 | cuda::ResidentGemvChains::kSkipEpilogue, ", weights only, no epilogue"},
                                 {31, ", weights only, neither"}};
      for (const ProbeRow& p : probes) {
        // Every probe row at the default grid and slicing of the whole chain; weights only (with and without
        // the per-unit work) at its other slicings too, which shows how the per-unit costs scale with the
        // number of units; other chains: the full kernel and no waits.
        if (all_rows) {
          if (per_sm != 4 && p.flags != 0) continue;
          if (unit_steps != 32 && p.flags != 0 && p.flags != 7 && p.flags != 31) continue;
        } else if (p.flags != 0 && !(p.flags == 1 && unit_steps == 32)) {
          continue;
        }
        resident.set_probe(p.flags);
        const double us = time_graph([&](int c) { return resident.enqueue(c % layers, stream.get(), true); });
        const char* kind[3] = {"resident", "resident (tiles outermost)", "resident (tiled copy)"};
        row(std::string(kind[order]) + ", " + std::to_string(resident.grid_blocks()) +
                " blocks, splits " + splits + p.what,
            us);
      }
    }
    }
    }
  }
  return 0;
}
