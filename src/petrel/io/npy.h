// NumPy .npy files (format version 1.0/2.0), float32 and int32 little-endian, C order.
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "petrel/util/status.h"

namespace petrel {

struct NpyArray {
  std::string descr;  // "<f4" or "<i4"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t num_elements() const;
  const float* f32() const { return reinterpret_cast<const float*>(data.data()); }
};

// Writes float32 data of the given shape atomically.
Status write_npy_f32(const std::filesystem::path& path, const float* data, const std::vector<int64_t>& shape);

// Reads a C-order little-endian float32 or int32 array; anything else is refused with the reason.
Result<NpyArray> read_npy(const std::filesystem::path& path);

}  // namespace petrel
