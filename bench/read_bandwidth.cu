// The read ceiling for petrel_bench_gemv_cuda: a kernel that streams a buffer with 16-byte loads, four
// independent loads in flight per thread, a grid of 8 blocks of 256 threads per SM. Bytes read over time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void __launch_bounds__(256) stream_read(const uint4* data, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(data + i), b = __ldcs(data + i + stride), c = __ldcs(data + i + 2 * stride),
                d = __ldcs(data + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(data + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads; practically never true
}

// The GEMV's access pattern without its arithmetic, over a [words, rows] int32 matrix: block (x, y) owns rows
// 128x .. and steps y * steps_per_split ..; thread (warp, quad_row, quad_col) reads the 16 bytes of rows
// row .. row + 3 at word 4 step + quad_col, kInFlight steps in flight.
template <int kInFlight>
__global__ void __launch_bounds__(128) gptq_pattern_read(const int32_t* q, int64_t rows, int64_t words,
                                                         int steps_per_split, unsigned* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * 128 + warp * 32 + 4 * (lane / 4);
  const int64_t first_word = int64_t{blockIdx.y} * steps_per_split * 4;
  const int64_t left = (words - first_word) / 4;
  const int steps = static_cast<int>(left < steps_per_split ? left : steps_per_split);
  const int32_t* p = q + (first_word + lane % 4) * rows + row;
  uint32_t acc = 0;
  if (row < rows) {
    for (int s = 0; s < steps; s += kInFlight) {
      uint4 v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) v[u] = s + u < steps ? __ldcs(reinterpret_cast<const uint4*>(p + (s + u) * 4 * rows)) : uint4{};
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

// The same grid and bytes, but each block's data contiguous (a tiled layout: [row block][step][128 x 16 B]).
__global__ void __launch_bounds__(128) tiled_pattern_read(const uint4* q, int steps_per_split, int steps_total,
                                                          unsigned* sink) {
  const int64_t first_step = int64_t{blockIdx.y} * steps_per_split;
  const int64_t left = steps_total - first_step;
  const int steps = static_cast<int>(left < steps_per_split ? left : steps_per_split);
  const uint4* p = q + (int64_t{blockIdx.x} * steps_total + first_step) * 128 + threadIdx.x;
  uint32_t acc = 0;
  for (int s = 0; s < steps; s += 8) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) v[u] = s + u < steps ? __ldcs(p + (s + u) * 128) : uint4{};
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

double read_bandwidth_gbs(const void* data, size_t bytes, int multiprocessors, cudaStream_t stream, int reps) {
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  const size_t n = bytes / 16;
  const int blocks = multiprocessors * 8;
  stream_read<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(data), n, sink);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start, stream), "record");
    stream_read<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(data), n, sink);
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    samples.push_back(bytes / (ms * 1e-3) / 1e9);
  }
  check(cudaGetLastError(), "stream_read");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(sink);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// GB/s of the GEMV's access pattern (tiled = false; in_flight 8 or 16 loads a thread) or of a tiled layout
// (true; 8 in flight) for a [rows, 32 * words / bits] matrix of rows * words * 4 bytes cut into `splits`
// slices, rotating over the windows of a larger buffer so that reads come from device memory.
double pattern_read_gbs(const void* buffer, size_t buffer_bytes, int64_t rows, int64_t words, int splits, bool tiled,
                        int in_flight, cudaStream_t stream, int reps, int calls) {
  unsigned* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc");
  const size_t matrix_bytes = static_cast<size_t>(rows * words * 4);
  const int windows = static_cast<int>(std::max<size_t>(1, buffer_bytes / matrix_bytes));
  const int steps_total = static_cast<int>((words + 3) / 4);
  const int steps_per_split = (steps_total + splits - 1) / splits;
  const dim3 grid(static_cast<unsigned>((rows + 127) / 128), static_cast<unsigned>((steps_total + steps_per_split - 1) / steps_per_split));
  auto launch = [&](int call) {
    const char* base = static_cast<const char*>(buffer) + (call % windows) * matrix_bytes;
    if (tiled) tiled_pattern_read<<<grid, 128, 0, stream>>>(reinterpret_cast<const uint4*>(base), steps_per_split, steps_total, sink);
    else if (in_flight == 16) gptq_pattern_read<16><<<grid, 128, 0, stream>>>(reinterpret_cast<const int32_t*>(base), rows, words, steps_per_split, sink);
    else gptq_pattern_read<8><<<grid, 128, 0, stream>>>(reinterpret_cast<const int32_t*>(base), rows, words, steps_per_split, sink);
  };
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  for (int c = 0; c < calls; ++c) launch(c);
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(start, stream), "record");
    for (int c = 0; c < calls; ++c) launch(c);
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    samples.push_back(matrix_bytes / (ms * 1e-3 / calls) / 1e9);
  }
  check(cudaGetLastError(), "pattern read");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(sink);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}
