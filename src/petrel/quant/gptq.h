// Weight quantization methods: round-to-nearest (RTN) and GPTQ (Frantar et al. 2022, "GPTQ: Accurate
// Post-Training Quantization for Generative Pre-trained Transformers", Algorithm 1 with lazy batch updates and
// the Cholesky reformulation; the reference implementation's `fasterquant` is what this follows).
#pragma once

#include <cstdint>
#include <vector>

#include "petrel/quant/format.h"
#include "petrel/util/status.h"

namespace petrel::quant {

// Round-to-nearest: each (group, row) gets its scale/zero from its own values.
// w: [rows, cols] row-major float32.
QuantizedMatrix quantize_rtn(const float* w, int64_t rows, int64_t cols, const QuantScheme& scheme);

// Accumulates H = sum over calibration rows of x x^T for one linear layer's input (x: [cols]).
// GPTQ's 2/n factor is irrelevant: the damping is relative to the mean diagonal.
class HessianAccumulator {
 public:
  explicit HessianAccumulator(int64_t dim);
  // x: [n_rows, dim] row-major.
  void add(const float* x, int64_t n_rows);
  int64_t dim() const { return dim_; }
  int64_t rows_seen() const { return rows_seen_; }
  // The full symmetric matrix [dim, dim] in float64.
  std::vector<double> to_matrix() const;

 private:
  int64_t dim_;
  int64_t rows_seen_ = 0;
  std::vector<float> upper_;  // [dim, dim], upper triangle valid (cblas_ssyrk)
};

struct GptqOptions {
  double damp_percent = 0.01;  // lambda = damp_percent * mean(diag(H)), raised x10 if H is not positive definite
  int64_t block_size = 128;    // columns per lazy batch update
};

struct GptqReport {
  double damp_used = 0;
  int64_t dead_columns = 0;  // inputs that were always zero in calibration
};

// GPTQ on w [rows, cols] (consumed as the working copy) with the input Hessian h [cols, cols] (consumed).
Result<QuantizedMatrix> quantize_gptq(std::vector<float> w, int64_t rows, int64_t cols, std::vector<double> h,
                                      const QuantScheme& scheme, const GptqOptions& options = {},
                                      GptqReport* report = nullptr);

// tr((W - Q) H (W - Q)^T): the proxy loss GPTQ minimises (the summed squared output error on calibration).
double output_error(const float* w, const QuantizedMatrix& q, const std::vector<double>& h);

}  // namespace petrel::quant
