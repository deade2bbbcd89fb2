// Compiled once per Highway target via foreach_target.h; see ops.h.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "petrel/kernels/cpu/ops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "petrel/kernels/cpu/ops.h"
#include "petrel/util/dtype.h"
#include "petrel/util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace petrel::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

// sum_i a[i] * b[i].
inline float Dot(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), hn::LoadU(df, b + i + lanes), acc1);
  }
  for (; i + lanes <= n; i += lanes) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += a * x[i].
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

// One cached row (a KV head of one position) widened to float.
inline void LoadRow(const KvLayer& kv, int64_t pos, int64_t head, bool values, float* out) {
  const int64_t offset = (pos * kv.n_kv_heads + head) * kv.head_dim, n = kv.head_dim;
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const void* base = values ? kv.values : kv.keys;
  int64_t i = 0;
  switch (kv.type) {
    case KvType::kF32:
      std::memcpy(out, static_cast<const float*>(base) + offset, n * sizeof(float));
      return;
    case KvType::kF16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const hwy::float16_t* src = static_cast<const hwy::float16_t*>(base) + offset;
      for (; i + lanes <= n; i += lanes) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, src + i)), df, out + i);
      const uint16_t* bits = static_cast<const uint16_t*>(base) + offset;
      for (; i < n; ++i) out[i] = f16_to_f32(bits[i]);
      return;
    }
    case KvType::kQ8: {
      const float scale = (values ? kv.value_scales : kv.key_scales)[pos * kv.n_kv_heads + head];
      const int8_t* src = static_cast<const int8_t*>(base) + offset;
      const hn::Rebind<int8_t, DF> d8;
      const hn::Rebind<int32_t, DF> di;
      const auto vs = hn::Set(df, scale);
      for (; i + lanes <= n; i += lanes) {
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, src + i))), vs), df, out + i);
      }
      for (; i < n; ++i) out[i] = static_cast<float>(src[i]) * scale;
      return;
    }
  }
}

void KvLoad(const KvLayer& kv, int64_t pos, int64_t head, bool values, float* out) {
  LoadRow(kv, pos, head, values, out);
}

void KvStore(const KvLayer& kv, int64_t first_pos, int64_t n, const float* keys, const float* values) {
  const int64_t width = kv.n_kv_heads * kv.head_dim;
  for (int which = 0; which < 2; ++which) {
    const float* src = which == 0 ? keys : values;
    void* base = which == 0 ? kv.keys : kv.values;
    float* scales = which == 0 ? kv.key_scales : kv.value_scales;
    switch (kv.type) {
      case KvType::kF32:
        std::memcpy(static_cast<float*>(base) + first_pos * width, src, n * width * sizeof(float));
        break;
      case KvType::kF16: {
        const DF df;
        const hn::Rebind<hwy::float16_t, DF> dh;
        const int64_t lanes = static_cast<int64_t>(hn::Lanes(df)), total = n * width;
        hwy::float16_t* dst = static_cast<hwy::float16_t*>(base) + first_pos * width;
        int64_t i = 0;
        for (; i + lanes <= total; i += lanes) hn::StoreU(hn::DemoteTo(dh, hn::LoadU(df, src + i)), dh, dst + i);
        uint16_t* bits = static_cast<uint16_t*>(base) + first_pos * width;
        for (; i < total; ++i) bits[i] = f32_to_f16(src[i]);
        break;
      }
      case KvType::kQ8:
        for (int64_t r = 0; r < n * kv.n_kv_heads; ++r) {  // one scale per position and head
          const float* row = src + r * kv.head_dim;
          float amax = 0;
          for (int64_t i = 0; i < kv.head_dim; ++i) amax = std::max(amax, std::fabs(row[i]));
          const float scale = amax > 0 ? amax / 127.0f : 1.0f, inv = 1.0f / scale;
          int8_t* dst = static_cast<int8_t*>(base) + first_pos * width + r * kv.head_dim;
          for (int64_t i = 0; i < kv.head_dim; ++i) {
            dst[i] = static_cast<int8_t>(std::clamp(std::lrint(row[i] * inv), -127L, 127L));
          }
          scales[first_pos * kv.n_kv_heads + r] = scale;
        }
        break;
    }
  }
}

// exp(x[i] - max) in place, returning the sum; the usual numerically safe softmax numerator.
inline float ExpShiftedSum(float* x, int64_t n, float max_value) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto vmax = hn::Set(df, max_value);
  auto sum = hn::Zero(df);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vmax));
    hn::StoreU(e, df, x + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(df, sum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    total += x[i];
  }
  return total;
}

// Query rows [job_begin, job_end) of (row, kv head) pairs.
void AttentionJobs(const float* q, const KvLayer& kv, int64_t first_pos, int64_t n_heads, int64_t job_begin,
                   int64_t job_end, float* out) {
  const int64_t hd = kv.head_dim, group = n_heads / kv.n_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  thread_local std::vector<float> scores, row;
  row.resize(hd);
  for (int64_t job = job_begin; job < job_end; ++job) {
    const int64_t r = job / kv.n_kv_heads, kv_head = job % kv.n_kv_heads;
    const int64_t n_keys = first_pos + r + 1;  // causal: keys at positions <= this query's
    scores.resize(group * n_keys);
    const float* qg = q + (r * n_heads + kv_head * group) * hd;  // the group's query heads are adjacent
    for (int64_t p = 0; p < n_keys; ++p) {
      LoadRow(kv, p, kv_head, false, row.data());
      for (int64_t g = 0; g < group; ++g) scores[g * n_keys + p] = Dot(qg + g * hd, row.data(), hd) * scale;
    }
    for (int64_t g = 0; g < group; ++g) {
      float* s = scores.data() + g * n_keys;
      const float inv = 1.0f / ExpShiftedSum(s, n_keys, *std::max_element(s, s + n_keys));
      for (int64_t p = 0; p < n_keys; ++p) s[p] *= inv;
      std::fill_n(out + (r * n_heads + kv_head * group + g) * hd, hd, 0.0f);
    }
    for (int64_t p = 0; p < n_keys; ++p) {
      LoadRow(kv, p, kv_head, true, row.data());
      for (int64_t g = 0; g < group; ++g) {
        Axpy(scores[g * n_keys + p], row.data(), out + (r * n_heads + kv_head * group + g) * hd, hd);
      }
    }
  }
}

void RmsNormRows(const float* x, int64_t n_rows, int64_t dim, const float* weight, float eps, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    const float inv_rms = 1.0f / std::sqrt(Dot(xr, xr, dim) / static_cast<float>(dim) + eps);
    const auto vinv = hn::Set(df, inv_rms);
    int64_t i = 0;
    for (; i + lanes <= dim; i += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(df, weight + i), hn::Mul(hn::LoadU(df, xr + i), vinv)), df, yr + i);
    }
    for (; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv_rms);
  }
}

void Rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df)), half = head_dim / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos + r * half;
    const float* s = sin + r * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      int64_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const auto a = hn::LoadU(df, v + i), b = hn::LoadU(df, v + i + half);
        const auto vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
        hn::StoreU(hn::NegMulAdd(b, vs, hn::Mul(a, vc)), df, v + i);  // a cos - b sin
        hn::StoreU(hn::MulAdd(a, vs, hn::Mul(b, vc)), df, v + i + half);  // b cos + a sin
      }
      for (; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(df, gate + i);
    const auto silu = hn::Div(g, hn::Add(one, hn::Exp(df, hn::Neg(g))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void AddInPlace(float* x, const float* y, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, x + i);
  for (; i < n; ++i) x[i] += y[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace petrel::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace petrel::cpu {

HWY_EXPORT(KvLoad);
HWY_EXPORT(KvStore);
HWY_EXPORT(AttentionJobs);
HWY_EXPORT(RmsNormRows);
HWY_EXPORT(Rope);
HWY_EXPORT(SiluMul);
HWY_EXPORT(AddInPlace);

const char* kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kF16: return "f16";
    case KvType::kQ8: return "q8";
  }
  return "?";
}

int64_t kv_element_bytes(KvType type) { return type == KvType::kF32 ? 4 : type == KvType::kF16 ? 2 : 1; }

void kv_store(const KvLayer& layer, int64_t first_pos, int64_t n, const float* keys, const float* values) {
  HWY_DYNAMIC_DISPATCH(KvStore)(layer, first_pos, n, keys, values);
}

void kv_load(const KvLayer& layer, int64_t pos, int64_t head, bool values, float* out) {
  HWY_DYNAMIC_DISPATCH(KvLoad)(layer, pos, head, values, out);
}

void attention(const float* q, const KvLayer& kv, int64_t n_rows, int64_t first_pos, int64_t n_heads, float* out) {
  ThreadPool::global().parallel_for(n_rows * kv.n_kv_heads, [&](int64_t begin, int64_t end) {
    HWY_DYNAMIC_DISPATCH(AttentionJobs)(q, kv, first_pos, n_heads, begin, end, out);
  });
}

void rms_norm(const float* x, int64_t n_rows, int64_t dim, const ref::DenseMatrix& weight, float eps, float* out) {
  thread_local std::vector<float> w;
  w.resize(dim);
  weight.row_to_f32(0, w.data());
  HWY_DYNAMIC_DISPATCH(RmsNormRows)(x, n_rows, dim, w.data(), eps, out);
}

void apply_rope(float* x, int64_t n_rows, int64_t n_heads, int64_t head_dim, const float* cos, const float* sin) {
  HWY_DYNAMIC_DISPATCH(Rope)(x, n_rows, n_heads, head_dim, cos, sin);
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SiluMul)(gate, up, n, out);
}

void add_in_place(float* x, const float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddInPlace)(x, y, n); }

}  // namespace petrel::cpu
#endif  // HWY_ONCE
