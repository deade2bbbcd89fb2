#include "petrel/quant/gptq.h"

#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <cmath>

#include "petrel/util/parallel.h"

namespace petrel::quant {

namespace {

QuantizedMatrix make_output(int64_t rows, int64_t cols, const QuantScheme& scheme) {
  QuantizedMatrix q;
  q.scheme = scheme;
  q.rows = rows;
  q.cols = cols;
  q.group_size = scheme.effective_group_size(cols);
  q.codes.resize(rows * cols);
  q.scales.resize(q.n_groups() * rows);
  q.zeros.resize(q.n_groups() * rows);
  return q;
}

void set_params(QuantizedMatrix& q, int64_t group, int64_t row, const GroupParams& p) {
  q.scales[group * q.rows + row] = f32_to_f16(p.scale);
  q.zeros[group * q.rows + row] = static_cast<uint8_t>(p.zero);
}

GroupParams get_params(const QuantizedMatrix& q, int64_t group, int64_t row) {
  return {f16_to_f32(q.scales[group * q.rows + row]), q.zeros[group * q.rows + row]};
}

}  // namespace

QuantizedMatrix quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme) {
  QuantizedMatrix q = make_output(rows, cols, scheme);
  const int64_t gs = q.group_size;
  ThreadPool::global().parallel_for(rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < q.n_groups(); ++g) {
        const int64_t c0 = g * gs, n = std::min(gs, cols - c0);
        const GroupParams p = find_group_params(w + r * cols + c0, n, scheme);
        set_params(q, g, r, p);
        for (int64_t c = c0; c < c0 + n; ++c) {
          q.codes[r * cols + c] = static_cast<uint8_t>(quantize_value(w[r * cols + c], p, scheme.max_code()));
        }
      }
    }
  });
  return q;
}

HessianAccumulator::HessianAccumulator(int64_t dim) : dim_(dim), upper_(dim * dim, 0.0f) {}

void HessianAccumulator::add(const float* x, int64_t n_rows) {
  if (n_rows <= 0) return;
  // upper += x^T x
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(dim_), static_cast<int>(n_rows), 1.0f, x,
              static_cast<int>(dim_), 1.0f, upper_.data(), static_cast<int>(dim_));
  rows_seen_ += n_rows;
}

std::vector<double> HessianAccumulator::to_matrix() const {
  std::vector<double> h(dim_ * dim_);
  for (int64_t i = 0; i < dim_; ++i) {
    for (int64_t j = i; j < dim_; ++j) {
      h[i * dim_ + j] = h[j * dim_ + i] = upper_[i * dim_ + j];
    }
  }
  return h;
}

Result<QuantizedMatrix> quantize_gptq(std::vector<float> w, int64_t rows, int64_t cols, std::vector<double> h,
                                      const QuantScheme& scheme, const GptqOptions& options, GptqReport* report) {
  if (static_cast<int64_t>(w.size()) != rows * cols || static_cast<int64_t>(h.size()) != cols * cols) {
    return invalid_argument("gptq: weight or Hessian size does not match [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  }
  PETREL_RETURN_IF_ERROR(validate_scheme(scheme, cols, "gptq"));
  // Inputs never seen in calibration: fix H's diagonal and zero the weights, as the reference does.
  int64_t dead = 0;
  for (int64_t i = 0; i < cols; ++i) {
    if (h[i * cols + i] == 0.0) {
      h[i * cols + i] = 1.0;
      for (int64_t r = 0; r < rows; ++r) w[r * cols + i] = 0.0f;
      ++dead;
    }
  }
  double mean_diag = 0;
  for (int64_t i = 0; i < cols; ++i) mean_diag += h[i * cols + i];
  mean_diag /= cols;

  // Hinv = H^-1 via Cholesky, then its upper Cholesky factor U (Hinv = U^T U). Retry with more damping if
  // H is not numerically positive definite.
  std::vector<double> hinv;
  double damp = options.damp_percent * mean_diag;
  const int n = static_cast<int>(cols);
  for (int attempt = 0;; ++attempt) {
    hinv = h;
    for (int64_t i = 0; i < cols; ++i) hinv[i * cols + i] += damp;
    int info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', n, hinv.data(), n);
    if (info == 0) info = LAPACKE_dpotri(LAPACK_ROW_MAJOR, 'L', n, hinv.data(), n);
    if (info == 0) {
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t j = 0; j < i; ++j) hinv[j * cols + i] = hinv[i * cols + j];
      info = LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'U', n, hinv.data(), n);
    }
    if (info == 0) break;
    if (attempt >= 6) return invalid_data("gptq: the Hessian is not positive definite even with damping " + std::to_string(damp));
    damp *= 10;
  }
  h.clear();
  h.shrink_to_fit();
  std::vector<float> u(cols * cols, 0.0f);  // upper factor in float, as the reference runs in float32
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = i; j < cols; ++j) u[i * cols + j] = static_cast<float>(hinv[i * cols + j]);
  hinv.clear();
  hinv.shrink_to_fit();
  if (report) {
    report->damp_used = damp;
    report->dead_columns = dead;
  }

  QuantizedMatrix q = make_output(rows, cols, scheme);
  const int64_t gs = q.group_size;
  const int max_code = scheme.max_code();
  if (scheme.group_size <= 0) {  // per-channel: parameters from the whole (original) row
    ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) set_params(q, 0, r, find_group_params(w.data() + r * cols, cols, scheme));
    });
  }
  const int64_t block = std::max<int64_t>(1, options.block_size);
  std::vector<float> err(rows * block);  // [rows, block]: scaled errors of this block
  for (int64_t i1 = 0; i1 < cols; i1 += block) {
    const int64_t i2 = std::min(cols, i1 + block), count = i2 - i1;
    ThreadPool::global().parallel_for(rows, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        float* wr = w.data() + r * cols;
        float* er = err.data() + r * block;
        for (int64_t c = i1; c < i2; ++c) {
          const int64_t g = c / gs;
          if (scheme.group_size > 0 && c % gs == 0) set_params(q, g, r, find_group_params(wr + c, std::min(gs, cols - c), scheme));
          const GroupParams p = get_params(q, g, r);
          const int code = quantize_value(wr[c], p, max_code);
          q.codes[r * cols + c] = static_cast<uint8_t>(code);
          const float dequant = p.scale * static_cast<float>(code - p.zero);
          const float e_c = (wr[c] - dequant) / u[c * cols + c];
          er[c - i1] = e_c;
          const float* uc = u.data() + c * cols;
          for (int64_t j = c + 1; j < i2; ++j) wr[j] -= e_c * uc[j];  // within-block update
        }
      }
    });
    if (i2 < cols) {
      // Lazy batch update of the remaining columns: W[:, i2:] -= Err[:, :count] * U[i1:i2, i2:].
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(cols - i2),
                  static_cast<int>(count), -1.0f, err.data(), static_cast<int>(block), u.data() + i1 * cols + i2,
                  static_cast<int>(cols), 1.0f, w.data() + i2, static_cast<int>(cols));
    }
  }
  return q;
}

double output_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& h) {
  const int64_t rows = q.rows, cols = q.cols;
  double total = 0;
  std::vector<double> d(cols), hd(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) d[c] = static_cast<double>(w[r * cols + c]) - q.dequantized(r, c);
    cblas_dsymv(CblasRowMajor, CblasUpper, static_cast<int>(cols), 1.0, h.data(), static_cast<int>(cols), d.data(), 1,
                0.0, hd.data(), 1);
    for (int64_t c = 0; c < cols; ++c) total += d[c] * hd[c];
  }
  return total;
}

}  // namespace petrel::quant
