// Throughput of the multiply-accumulate instructions the CPU kernels could be built on, on one core: 12
// independent accumulator chains per instruction (enough to hide latency), 2e8 instructions each. This is how the
// VNNI design of kernels/cpu/gptq_matmul.cc was chosen (docs/PERFORMANCE.md). x86-64 with AVX-512 only; each
// instruction runs only when the CPU reports its feature.
//
//   build/bench/petrel_bench_cpu_instructions
#include <immintrin.h>

// GCC 12 reports the deliberately undefined upper lanes inside its own AVX-512 reduce intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <chrono>
#include <cstdio>

namespace {

constexpr long kIterations = 200000000 / 12;

template <class F>
void report(const char* name, double macs_per_instruction, F run) {
  const auto t0 = std::chrono::steady_clock::now();
  const float sink = run();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double per_second = kIterations * 12.0 / s;
  std::printf("| %s | %.2f | %.1f | (%g) |\n", name, per_second / 1e9, per_second * macs_per_instruction / 1e9,
              static_cast<double>(sink));
}

#define PETREL_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f"))) float fma_ps() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(i * 1e-9f);
  const __m512 b = _mm512_set1_ps(0.5f), c = _mm512_set1_ps(0.25f);
  for (long k = 0; k < kIterations; ++k) {
#define PETREL_STEP(i) a[i] = _mm512_fmadd_ps(a[i], b, c);
    PETREL_REP12(PETREL_STEP)
#undef PETREL_STEP
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) float dpwssd() {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i b = _mm512_set1_epi16(3), c = _mm512_set1_epi16(5);
  for (long k = 0; k < kIterations; ++k) {
#define PETREL_STEP(i) a[i] = _mm512_dpwssd_epi32(a[i], b, c);
    PETREL_REP12(PETREL_STEP)
#undef PETREL_STEP
  }
  __m512i s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, a[i]);
  return static_cast<float>(_mm512_reduce_add_epi32(s));
}

__attribute__((target("avx512f,avx512vnni"))) float dpbusd() {
  __m512i a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_epi32(i);
  const __m512i b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(5);
  for (long k = 0; k < kIterations; ++k) {
#define PETREL_STEP(i) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
    PETREL_REP12(PETREL_STEP)
#undef PETREL_STEP
  }
  __m512i s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_epi32(s, a[i]);
  return static_cast<float>(_mm512_reduce_add_epi32(s));
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16() {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(i);
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (long k = 0; k < kIterations; ++k) {
#define PETREL_STEP(i) a[i] = _mm512_dpbf16_ps(a[i], b, c);
    PETREL_REP12(PETREL_STEP)
#undef PETREL_STEP
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512f")) {
    std::printf("no AVX-512 on this CPU: nothing to measure\n");
    return 0;
  }
  // Multiply-accumulates per instruction, counted as the kernels use them: VPDPBUSD's 64 byte products make 32
  // int16 x 4-bit products when each int16 activation is split into two bytes (gptq_matmul.cc).
  std::printf("| instruction | G instr/s | G MAC/s | |\n|---|---:|---:|---|\n");
  report("VFMADD231PS zmm (f32)", 16, fma_ps);
  if (__builtin_cpu_supports("avx512vnni")) {
    report("VPDPWSSD zmm (int16 pairs)", 32, dpwssd);
    report("VPDPBUSD zmm (u8 x s8, as int16 split in bytes)", 32, dpbusd);
  }
  if (__builtin_cpu_supports("avx512bf16")) report("VDPBF16PS zmm (bf16 pairs)", 32, dpbf16);
  return 0;
}
