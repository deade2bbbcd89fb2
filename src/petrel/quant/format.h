// W4A16 weight formats: integer codes with per-output-channel or per-group scales (and zero points),
// and their packing into the GPTQ safetensors convention (see kernels/ref/ops.h GptqMatrix for the layout).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "petrel/kernels/ref/ops.h"
#include "petrel/util/status.h"

namespace petrel::quant {

struct QuantScheme {
  int bits = 4;                // 4 or 8
  int64_t group_size = -1;     // -1: one group per output channel (per-channel); else 32, 64, 128, ...
  bool symmetric = true;       // symmetric: zero point fixed at 2^(bits-1)
  bool clip_search = true;     // search a clipping ratio that minimises the group's squared error

  int max_code() const { return (1 << bits) - 1; }
  int64_t effective_group_size(int64_t cols) const { return group_size <= 0 ? cols : group_size; }
  std::string to_string() const;  // "w4 sym per-channel", "w4 asym g128"
};

Status validate_scheme(const QuantScheme& scheme, int64_t cols, const std::string& what);

// A quantized [rows, cols] matrix before packing: one code per weight and per-(group, row) parameters.
// Scales are already rounded to fp16, since that is how they are stored and dequantized.
struct QuantizedMatrix {
  QuantScheme scheme;
  int64_t rows = 0, cols = 0, group_size = 0;  // group_size resolved (cols for per-channel)
  std::vector<uint8_t> codes;   // [rows, cols]
  std::vector<uint16_t> scales; // fp16 [n_groups, rows]
  std::vector<uint8_t> zeros;   // [n_groups, rows], the real zero point
  int64_t n_groups() const { return (cols + group_size - 1) / group_size; }
  float dequantized(int64_t r, int64_t c) const;
};

// Per-(group,row) quantization parameters for a slice of columns of one row.
struct GroupParams {
  float scale = 1.0f;  // fp16-representable
  int zero = 0;
};
// Chooses scale and zero for `values[count]` under `scheme` (min/max, optionally with clipping search).
GroupParams find_group_params(const float* values, int64_t count, const QuantScheme& scheme);
// round-half-even(w / scale) + zero, clamped to [0, max_code] (torch.round semantics, as GPTQ).
// Adding and subtracting 1.5 * 2^23 rounds a float to the nearest even integer without a libm call, so the
// loops over groups vectorize; valid for |w / scale| < 2^22, far beyond any code range.
inline int quantize_value(float w, const GroupParams& p, int max_code) {
  constexpr float kMagic = 12582912.0f;
  float q = (w / p.scale + kMagic) - kMagic + static_cast<float>(p.zero);
  q = q < 0.0f ? 0.0f : (q > static_cast<float>(max_code) ? static_cast<float>(max_code) : q);
  return static_cast<int>(q);
}

// The GPTQ tensors of one linear layer, owned.
struct GptqTensors {
  int bits = 4;
  int64_t rows = 0, cols = 0, group_size = 0;
  int zero_offset = 1;             // 1: GPTQ v1 ("gptq"), stored zero = real zero - 1
  std::vector<int32_t> qweight;    // [cols * bits / 32, rows]
  std::vector<uint16_t> scales;    // [n_groups, rows] fp16
  std::vector<int32_t> qzeros;     // [n_groups, rows * bits / 32]
  std::vector<int32_t> g_idx;      // [cols]

  ref::GptqMatrix view() const;
};

// Packs codes and parameters into GPTQ v1 tensors. rows and cols must be multiples of 32 / bits.
Result<GptqTensors> pack_gptq(const QuantizedMatrix& m);

// Empty (zeroed) GPTQ tensors for a [rows, cols] matrix, to be filled slice by slice with pack_rows().
Result<GptqTensors> allocate_gptq(int64_t rows, int64_t cols, const QuantScheme& scheme);
// Packs `slice` (rows [first_row, first_row + slice.rows) of the whole matrix) into `t`.
// first_row and slice.rows must be multiples of 32 / bits.
Status pack_rows(const QuantizedMatrix& slice, int64_t first_row, GptqTensors& t);

}  // namespace petrel::quant
