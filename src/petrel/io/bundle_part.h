// Bundle part files (`part_K_of_N.bin`): the memory-mappable weight container of a petrel bundle.
//
//   [0, 128)                     fixed little-endian header (magic "PETRELPT", version, part K of N, offsets,
//                                checksums)
//   [data_offset, +data_size)    the data region; every tensor starts at a 64-byte aligned FILE offset, so a
//                                pointer into the memory map is 64-byte aligned
//   [table_offset, +table_size)  the tensor table (JSON): name, dtype, shape, layout, attrs, offset, size, xxh3
//
// The table is written after the data so that tensors can be streamed one by one without declaring them up
// front; the header, written last, points to it. Three kinds of XXH3-64 checksums: the header checksum covers
// the header and the table (checked on every open), the data checksum covers the whole data region in
// fixed-size chunks (parallel and deterministic), and each tensor has its own so a mismatch can be pinned on a
// tensor. The byte-exact specification is docs/BUNDLE_FORMAT.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/io/safetensors.h"
#include "petrel/util/dtype.h"
#include "petrel/util/file.h"
#include "petrel/util/status.h"

namespace petrel {

class ThreadPool;

inline constexpr char kBundlePartMagic[8] = {'P', 'E', 'T', 'R', 'E', 'L', 'P', 'T'};
inline constexpr uint32_t kBundlePartFormatVersion = 1;
inline constexpr uint64_t kBundlePartHeaderSize = 128;
// Every tensor starts at a multiple of this file offset (cache line; AVX-512 loads).
inline constexpr uint64_t kBundleTensorAlignment = 64;
// The data checksum hashes the data region in chunks of this size (recorded in each header).
inline constexpr uint64_t kBundleChecksumChunkSize = 16ull << 20;
// The one layout the container understands: a dense row-major array of `dtype` with `shape`, whose byte size
// must be dtype size x elements. Any other layout string is defined by the backend that reads it; the byte
// size is then what the writer declared.
inline constexpr std::string_view kPlainLayout = "plain";
// A 2-D array of `dtype` with `shape` [R, C] whose rows lie attrs.row_stride (>= C) elements apart, the
// padding zero: size = dtype size x R x row_stride. `petrel export --backend cpu` writes GPTQ qweight so,
// at cpu::preferred_word_row_stride (docs/BUNDLE_FORMAT.md).
inline constexpr std::string_view kPaddedRowsLayout = "padded_rows";

// "part_3_of_5.bin"
std::string bundle_part_file_name(int part_index, int part_count);
// (K, N) from "part_K_of_N.bin"; nullopt for any other name.
std::optional<std::pair<int, int>> parse_bundle_part_file_name(const std::string& file_name);

// What the writer is told about a tensor before its bytes are streamed.
struct BundleTensorSpec {
  std::string name;
  DType dtype = DType::kBF16;          // element type ("plain"), or the storage word of a packed layout
  std::vector<int64_t> shape;          // logical shape
  uint64_t num_bytes = 0;              // exactly what will be written between begin_tensor and end_tensor
  std::string layout = std::string(kPlainLayout);
  nlohmann::json attrs = nlohmann::json::object();  // small, backend-defined, e.g. {"bits": 4, "group_size": 128}

  // A plain tensor with num_bytes = dtype size x elements.
  static BundleTensorSpec plain(std::string name, DType dtype, std::vector<int64_t> shape);
  // A 2-D tensor in kPaddedRowsLayout: rows `row_stride` elements apart.
  static BundleTensorSpec padded_rows(std::string name, DType dtype, std::vector<int64_t> shape, int64_t row_stride);
};

// Streams one part file. Memory stays bounded (a 4 MiB write buffer) whatever the part size: each tensor's
// bytes arrive as any number of write() calls. The part is written under a temporary name in the same
// directory (".part_1_of_5.bin.tmp.PID.N") and renamed to its final name by finish(); destroying the writer
// before finish() (an error, a cancelled export) removes the temporary file, and a killed process leaves only
// the temporary name, never a partial file under the final one.
//
//   PETREL_ASSIGN_OR_RETURN(auto w, BundlePartWriter::create(dir / bundle_part_file_name(1, 5), 1, 5));
//   PETREL_RETURN_IF_ERROR(w->begin_tensor(spec));
//   PETREL_RETURN_IF_ERROR(w->write(bytes, n));   // as often as needed, num_bytes in total
//   PETREL_RETURN_IF_ERROR(w->end_tensor());
//   ...
//   PETREL_RETURN_IF_ERROR(w->finish());
//
// After any error the writer refuses further calls (the part is abandoned; create a new writer).
class BundlePartWriter {
 public:
  // part_index is 1-based. When the file name has the form part_K_of_N.bin, K and N must match.
  // `metadata` goes into the table (free-form strings, e.g. the producing petrel version).
  static Result<std::unique_ptr<BundlePartWriter>> create(const std::filesystem::path& path, int part_index,
                                                          int part_count,
                                                          std::map<std::string, std::string> metadata = {});
  ~BundlePartWriter();
  BundlePartWriter(const BundlePartWriter&) = delete;
  BundlePartWriter& operator=(const BundlePartWriter&) = delete;

  Status begin_tensor(const BundleTensorSpec& spec);
  Status write(const void* data, size_t size);
  Status end_tensor();
  // begin_tensor + write(data, spec.num_bytes) + end_tensor.
  Status write_tensor(const BundleTensorSpec& spec, const void* data);
  // Writes the table and the header, fsyncs, and renames the part to its final name.
  Status finish();

  const std::filesystem::path& path() const;
  const std::filesystem::path& temp_path() const;
  size_t tensor_count() const;
  uint64_t bytes_written() const;  // file bytes so far (header placeholder, data, padding)

 private:
  struct Impl;
  explicit BundlePartWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

enum class BundleVerify {
  kFull,        // header, table and every data checksum (reads the whole part)
  kHeaderOnly,  // header and table (checksum included), not the data region
};

// One tensor of an open part. `data` points into the part's memory map and is 64-byte aligned.
struct BundleTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::string layout;
  nlohmann::json attrs = nlohmann::json::object();
  uint64_t offset = 0;     // within the data region
  uint64_t num_bytes = 0;
  uint64_t checksum = 0;   // XXH3-64 of the tensor's bytes
  const uint8_t* data = nullptr;

  int64_t num_elements() const;
  bool is_plain() const { return layout == kPlainLayout; }
  // A safetensors-style view for code that consumes plain tensors (norms, embeddings).
  TensorView view() const;
  // The view of a plain or a kPaddedRowsLayout tensor (row_stride set for the latter), after checking the
  // padded layout's invariants (2-D, row_stride >= columns, size); an error names the tensor otherwise.
  Result<TensorView> padded_rows_view() const;
};

// A validated, memory-mapped part. Nothing is handed out before the header, the table and every tensor entry
// have been checked (sizes inside the file, alignment, no overlaps, plain sizes = dtype x shape, checksums).
// Move-only; tensor data pointers stay valid for the lifetime of the part, moves included.
class BundlePart {
 public:
  // `pool` parallelizes the data checksum (nullptr: ThreadPool::global()). ThreadPool::parallel_for is not
  // reentrant: do not call this from inside a task running on the same pool (pass another pool, or kHeaderOnly
  // and verify_data later).
  static Result<BundlePart> open(const std::filesystem::path& path, BundleVerify verify = BundleVerify::kFull,
                                 ThreadPool* pool = nullptr);

  const std::filesystem::path& path() const { return map_.path(); }
  int part_index() const { return part_index_; }  // 1-based
  int part_count() const { return part_count_; }
  uint64_t file_size() const { return map_.size(); }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t data_size() const { return data_size_; }
  uint64_t data_checksum() const { return data_checksum_; }
  const std::vector<BundleTensor>& tensors() const { return tensors_; }
  const BundleTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Recomputes the data checksum; on a mismatch the error names the part, both checksums and the tensors
  // that fail their own checksums.
  Status verify_data(ThreadPool* pool = nullptr) const;
  // Recomputes one tensor's checksum (e.g. before uploading it to a device).
  Status verify_tensor(const BundleTensor& tensor) const;

 private:
  MappedFile map_;
  int part_index_ = 0;
  int part_count_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t data_size_ = 0;
  uint64_t chunk_size_ = 0;
  uint64_t data_checksum_ = 0;
  std::vector<BundleTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// "0x0123456789abcdef"
std::string checksum_hex(uint64_t checksum);

}  // namespace petrel
