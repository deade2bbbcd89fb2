// petrel doctor: what this machine offers petrel: CPU, SIMD features, threads, the kernel variant in use,
// the BLAS kernels GPTQ gets, and NVIDIA GPUs (through the CUDA backend when it is built).
#include <cblas.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "commands.h"
#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/kernels/cuda/device.h"

namespace petrel::cli {

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

int run_doctor() {
  std::printf("petrel %s\n", PETREL_VERSION);
  std::printf("cpu:             %s, %u hardware threads\n", cpu_model_name().c_str(), std::thread::hardware_concurrency());
#if defined(__x86_64__)
  std::printf("cpu features:   ");
  const std::pair<const char*, bool> features[] = {
      {"sse4.2", __builtin_cpu_supports("sse4.2")},         {"avx2", __builtin_cpu_supports("avx2")},
      {"fma", __builtin_cpu_supports("fma")},               {"avx512f", __builtin_cpu_supports("avx512f")},
      {"avx512bw", __builtin_cpu_supports("avx512bw")},     {"avx512vnni", __builtin_cpu_supports("avx512vnni")},
      {"avx512bf16", __builtin_cpu_supports("avx512bf16")}, {"avx512fp16", __builtin_cpu_supports("avx512fp16")}};
  for (auto [name, present] : features) std::printf(" %s%s", present ? "+" : "-", name);
  std::printf("\n");
#endif
  std::printf("kernels:         Highway target %s; W4A16 matmul: %s\n", cpu::best_target_name(),
              cpu::gptq_matmul_variant());
  const char* core = openblas_get_corename();
  std::printf("blas (GPTQ):     OpenBLAS %s kernels, %d threads%s\n", core ? core : "?", openblas_get_num_threads(),
              core && std::strcmp(core, "Prescott") == 0 ? " (generic: set OPENBLAS_CORETYPE=SkylakeX or Haswell)" : "");
  // GPUs: the CUDA runtime's view when the backend is built; otherwise what nvidia-smi says, so that a user
  // with a GPU learns that this build cannot use it.
  if (cuda::built_with_cuda()) {
    std::printf("cuda backend:    built (CUDA runtime %s, driver %s)\n", cuda::runtime_version().c_str(),
                cuda::driver_version().c_str());
    auto devices = cuda::list_devices();
    if (!devices.ok()) {
      std::printf("gpus:            error: %s\n", devices.status().to_string().c_str());
    } else if (devices->empty()) {
      std::printf("gpus:            none (%s)\n", cuda::no_device_reason().c_str());
    } else {
      std::printf("gpus:\n");
      for (const cuda::DeviceInfo& d : *devices) {
        std::printf("  gpu %d: %s, %.1f GiB, compute capability %d.%d, %d SMs, %.0f MiB L2", d.index, d.name.c_str(),
                    d.total_memory_bytes / double(1 << 30), d.compute_major, d.compute_minor, d.multiprocessors,
                    d.l2_cache_bytes / double(1 << 20));
        if (d.peak_memory_bandwidth > 0) std::printf(", %.2f TB/s peak memory bandwidth", d.peak_memory_bandwidth / 1e12);
        std::printf("\n");
      }
    }
    return 0;
  }
  std::FILE* smi = ::popen("nvidia-smi --query-gpu=index,name,memory.total,compute_cap --format=csv,noheader 2>/dev/null", "r");
  std::string gpus;
  if (smi) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, smi)) gpus += std::string("  gpu ") + buf;
    ::pclose(smi);
  }
  if (gpus.empty()) std::printf("gpus:            none found (no nvidia-smi or no NVIDIA driver)\n");
  else std::printf("gpus:\n%s", gpus.c_str());
  std::printf("cuda backend:    not built (configure with nvcc available, -DPETREL_CUDA=ON)\n");
  return 0;
}

}  // namespace

void add_doctor_command(CLI::App& app, CliContext& ctx) {
  CLI::App* cmd = app.add_subcommand("doctor", "Show the CPU features, kernel variant, BLAS kernels and GPUs petrel sees");
  cmd->callback([&ctx] { ctx.exit_code = run_doctor(); });
}

}  // namespace petrel::cli
