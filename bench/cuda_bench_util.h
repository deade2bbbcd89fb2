// What the CUDA benchmarks share: fail-fast checks, medians, and the device-to-device copy bandwidth that
// their "% of copy" columns compare against. Header-only; benchmarks only (exit on the first error).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "petrel/kernels/cuda/device.h"
#include "petrel/util/status.h"

#define PETREL_BENCH_CHECK_CUDA(call)                                                             \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace petrel::bench {

inline void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}

template <typename T>
T take(Result<T> r, const char* what) {
  check(r.status(), what);
  return std::move(r).value();
}

// "a,b,,c" -> {"a", "b", "c"}: the benchmarks' list flags (--groups, --variants, --shapes, --m).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over `reps` of the time `launch()` takes on `stream` (us, CUDA events), after one warm-up launch.
template <typename Launch>
double median_event_us(cudaStream_t stream, int reps, Launch&& launch) {
  cudaEvent_t start, stop;
  PETREL_BENCH_CHECK_CUDA(cudaEventCreate(&start));
  PETREL_BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  launch();  // warm-up: module load, first touch
  PETREL_BENCH_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    PETREL_BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    launch();
    PETREL_BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    PETREL_BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    PETREL_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(ms * 1000.0);
  }
  PETREL_BENCH_CHECK_CUDA(cudaEventDestroy(start));
  PETREL_BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return median(samples);
}

// GPU 0, made the current device; exits with "no CUDA device: <why>" when there is none.
inline cuda::DeviceInfo open_first_device() {
  auto devices = take(cuda::list_devices(), "list_devices");
  if (devices.empty()) {
    std::fprintf(stderr, "no CUDA device: %s\n", cuda::no_device_reason().c_str());
    std::exit(1);
  }
  check(cuda::set_device(0), "set_device");
  return devices[0];
}

// Device-to-device copy bandwidth, bytes read plus bytes written per second (GB/s), median of `reps` copies
// of 1 GiB after one warm-up copy.
inline double copy_bandwidth_gbs(cudaStream_t stream, int reps) {
  const size_t bytes = size_t{1} << 30;
  auto src = take(cuda::DeviceBuffer::allocate(bytes), "alloc");
  auto dst = take(cuda::DeviceBuffer::allocate(bytes), "alloc");
  check(src.fill_bytes(1), "memset");
  cudaEvent_t start, stop;
  PETREL_BENCH_CHECK_CUDA(cudaEventCreate(&start));
  PETREL_BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  PETREL_BENCH_CHECK_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    PETREL_BENCH_CHECK_CUDA(cudaEventRecord(start, stream));
    PETREL_BENCH_CHECK_CUDA(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
    PETREL_BENCH_CHECK_CUDA(cudaEventRecord(stop, stream));
    PETREL_BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    PETREL_BENCH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(2.0 * bytes / (ms * 1e-3) / 1e9);
  }
  PETREL_BENCH_CHECK_CUDA(cudaEventDestroy(start));
  PETREL_BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  return median(samples);
}

}  // namespace petrel::bench
