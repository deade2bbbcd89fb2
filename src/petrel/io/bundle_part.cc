#include "petrel/io/bundle_part.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include "petrel/util/parallel.h"

namespace petrel {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Byte offsets of the header fields (docs/BUNDLE_FORMAT.md, "Header").
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffHeaderSize = 12;
constexpr size_t kOffPartIndex = 16;
constexpr size_t kOffPartCount = 20;
constexpr size_t kOffAlignment = 24;
constexpr size_t kOffTensorCount = 28;
constexpr size_t kOffFileSize = 32;
constexpr size_t kOffDataOffset = 40;
constexpr size_t kOffDataSize = 48;
constexpr size_t kOffTableOffset = 56;
constexpr size_t kOffTableSize = 64;
constexpr size_t kOffChunkSize = 72;
constexpr size_t kOffDataChecksum = 80;
// 88..119 reserved (zero)
constexpr size_t kOffHeaderChecksum = 120;

// A table larger than this is not a plausible part (the 8B model's tables are a few KB).
constexpr uint64_t kMaxTableBytes = 64ull << 20;
// attrs are meant to be small parameters, not data.
constexpr size_t kMaxAttrsBytes = 4096;
constexpr size_t kWriteBufferBytes = 4u << 20;

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string errno_text() { return std::strerror(errno); }

struct XxhStateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};
using XxhState = std::unique_ptr<XXH3_state_t, XxhStateDeleter>;

XxhState new_xxh_state() {
  XxhState s(XXH3_createState());
  if (s) XXH3_64bits_reset(s.get());
  return s;
}

// XXH3-64 of the first 120 header bytes followed by the table.
uint64_t header_checksum(const uint8_t* header, const uint8_t* table, uint64_t table_size) {
  XxhState s = new_xxh_state();
  XXH3_64bits_update(s.get(), header, kOffHeaderChecksum);
  if (table_size > 0) XXH3_64bits_update(s.get(), table, table_size);
  return XXH3_64bits_digest(s.get());
}

// The data checksum: XXH3-64 over the little-endian XXH3-64 hashes of consecutive chunk_size chunks.
uint64_t combine_chunk_hashes(const std::vector<uint64_t>& hashes) {
  std::vector<uint8_t> bytes(hashes.size() * 8);
  for (size_t i = 0; i < hashes.size(); ++i) put_u64(bytes.data() + 8 * i, hashes[i]);
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t hash_data_region(const uint8_t* data, uint64_t size, uint64_t chunk_size, ThreadPool& pool) {
  const uint64_t n = size == 0 ? 0 : (size + chunk_size - 1) / chunk_size;
  std::vector<uint64_t> hashes(n);
  pool.parallel_for(
      static_cast<int64_t>(n),
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const uint64_t off = static_cast<uint64_t>(i) * chunk_size;
          hashes[i] = XXH3_64bits(data + off, std::min(chunk_size, size - off));
        }
      },
      1);
  return combine_chunk_hashes(hashes);
}

uint64_t hash_bytes(const uint8_t* data, uint64_t size) {
  static const uint8_t kEmpty = 0;
  return XXH3_64bits(size ? data : &kEmpty, size);
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parse_hex16(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

// Element count of a shape, or nullopt on a negative dimension or an overflow of bytes = elements x 8.
std::optional<uint64_t> element_count(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const uint64_t dim = static_cast<uint64_t>(d);
    if (dim != 0 && n > std::numeric_limits<uint64_t>::max() / 8 / dim) return std::nullopt;
    n *= dim;
  }
  return n;
}

std::string printable(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f) {
      s += static_cast<char>(p[i]);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", p[i]);
      s += buf;
    }
  }
  return s;
}

Status write_all(int fd, const uint8_t* data, size_t size, const fs::path& temp_path, uint64_t position) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(temp_path.string() + ": write failed at byte " + std::to_string(position) + ": " + errno_text());
    }
    data += n;
    size -= static_cast<size_t>(n);
    position += static_cast<uint64_t>(n);
  }
  return ok_status();
}

}  // namespace

std::string checksum_hex(uint64_t checksum) { return "0x" + hex16(checksum); }

std::string bundle_part_file_name(int part_index, int part_count) {
  return "part_" + std::to_string(part_index) + "_of_" + std::to_string(part_count) + ".bin";
}

std::optional<std::pair<int, int>> parse_bundle_part_file_name(const std::string& name) {
  size_t pos = 0;
  auto expect = [&](std::string_view text) {
    if (name.compare(pos, text.size(), text) != 0) return false;
    pos += text.size();
    return true;
  };
  auto number = [&](int* out) {
    size_t start = pos;
    while (pos < name.size() && name[pos] >= '0' && name[pos] <= '9') ++pos;
    if (pos == start || pos - start > 9) return false;
    *out = std::stoi(name.substr(start, pos - start));
    return true;
  };
  int k = 0, n = 0;
  if (!expect("part_") || !number(&k) || !expect("_of_") || !number(&n) || !expect(".bin") || pos != name.size()) {
    return std::nullopt;
  }
  return std::pair{k, n};
}

BundleTensorSpec BundleTensorSpec::plain(std::string name, DType dtype, std::vector<int64_t> shape) {
  BundleTensorSpec spec;
  spec.name = std::move(name);
  spec.dtype = dtype;
  spec.shape = std::move(shape);
  spec.num_bytes = element_count(spec.shape).value_or(0) * dtype_size(dtype);
  return spec;
}

BundleTensorSpec BundleTensorSpec::padded_rows(std::string name, DType dtype, std::vector<int64_t> shape,
                                               int64_t row_stride) {
  BundleTensorSpec spec;
  spec.name = std::move(name);
  spec.dtype = dtype;
  spec.num_bytes = shape.size() == 2 && shape[0] >= 0 && row_stride >= 0
                       ? static_cast<uint64_t>(shape[0]) * static_cast<uint64_t>(row_stride) * dtype_size(dtype)
                       : 0;
  spec.shape = std::move(shape);
  spec.layout = std::string(kPaddedRowsLayout);
  spec.attrs = nlohmann::json{{"row_stride", row_stride}};
  return spec;
}

int64_t BundleTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TensorView BundleTensor::view() const {
  TensorView v;
  v.name = name;
  v.dtype = dtype;
  v.shape = shape;
  v.data = data;
  v.num_bytes = num_bytes;
  return v;
}

Result<TensorView> BundleTensor::padded_rows_view() const {
  if (is_plain()) return view();
  const std::string what = "tensor '" + name + "'";
  if (layout != kPaddedRowsLayout) {
    return unsupported(what + " has layout '" + layout + "', which this backend does not read");
  }
  const auto stride = attrs.find("row_stride");
  if (shape.size() != 2 || stride == attrs.end() || !stride->is_number_integer()) {
    return invalid_data(what + ": layout padded_rows needs a 2-D shape and an integer attrs.row_stride");
  }
  const int64_t row_stride = stride->get<int64_t>();
  const unsigned __int128 want = static_cast<unsigned __int128>(shape[0]) * static_cast<uint64_t>(row_stride) *
                                 dtype_size(dtype);
  if (row_stride < shape[1] || want != num_bytes) {
    return invalid_data(what + ": padded_rows " + shape_to_string(shape) + " with row_stride " +
                        std::to_string(row_stride) + " does not fit its " + std::to_string(num_bytes) +
                        " bytes (row_stride must be >= " + std::to_string(shape[1]) + ", size = rows x row_stride x " +
                        std::to_string(dtype_size(dtype)) + ")");
  }
  TensorView v = view();
  v.row_stride = row_stride;
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// Writer

struct BundlePartWriter::Impl {
  struct Entry {
    BundleTensorSpec spec;
    uint64_t offset = 0;  // within the data region
    uint64_t checksum = 0;
  };

  fs::path path;
  fs::path temp_path;
  int fd = -1;
  int part_index = 0;
  int part_count = 0;
  std::map<std::string, std::string> metadata;

  std::vector<uint8_t> buffer;  // bytes not yet handed to write(2)
  uint64_t pos = 0;             // file position including the buffer

  XxhState chunk_state;
  uint64_t chunk_filled = 0;
  std::vector<uint64_t> chunk_hashes;
  XxhState tensor_state;

  std::vector<Entry> entries;
  std::set<std::string> names;
  bool in_tensor = false;
  uint64_t tensor_written = 0;
  bool failed = false;
  bool finished = false;

  ~Impl() {
    if (fd >= 0) ::close(fd);
    if (!finished && !temp_path.empty()) ::unlink(temp_path.c_str());
  }

  std::string where() const { return path.string(); }
  Status fail(Status s) {
    failed = true;
    return s;
  }
  Status usable(const char* call) const {
    if (finished) return internal_error(where() + ": " + call + " after finish()");
    if (failed) return internal_error(where() + ": " + call + " after an earlier error; the part is abandoned");
    return ok_status();
  }

  Status flush() {
    if (buffer.empty()) return ok_status();
    Status s = write_all(fd, buffer.data(), buffer.size(), temp_path, pos - buffer.size());
    buffer.clear();
    return s;
  }

  Status raw_write(const void* data, size_t size) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    if (buffer.size() + size > kWriteBufferBytes) PETREL_RETURN_IF_ERROR(flush());
    if (size >= kWriteBufferBytes) {
      PETREL_RETURN_IF_ERROR(write_all(fd, p, size, temp_path, pos));
    } else {
      buffer.insert(buffer.end(), p, p + size);
    }
    pos += size;
    return ok_status();
  }

  // Bytes of the data region: hashed chunk by chunk as they pass.
  Status data_append(const void* data, size_t size) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    size_t left = size;
    while (left > 0) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(left, kBundleChecksumChunkSize - chunk_filled));
      XXH3_64bits_update(chunk_state.get(), p, take);
      chunk_filled += take;
      if (chunk_filled == kBundleChecksumChunkSize) {
        chunk_hashes.push_back(XXH3_64bits_digest(chunk_state.get()));
        XXH3_64bits_reset(chunk_state.get());
        chunk_filled = 0;
      }
      p += take;
      left -= take;
    }
    return raw_write(data, size);
  }

  Status pad_to_alignment() {
    static const uint8_t kZeros[kBundleTensorAlignment] = {};
    const uint64_t pad = (kBundleTensorAlignment - pos % kBundleTensorAlignment) % kBundleTensorAlignment;
    return data_append(kZeros, pad);
  }

  Status check_spec(const BundleTensorSpec& spec) const {
    const std::string what = where() + ": tensor '" + spec.name + "'";
    if (spec.name.empty()) return invalid_argument(where() + ": a tensor needs a name");
    if (names.count(spec.name)) return invalid_argument(what + " is written twice");
    if (dtype_name(spec.dtype) == "?") return invalid_argument(what + ": unknown dtype");
    auto elements = element_count(spec.shape);
    if (!elements) return invalid_argument(what + ": shape " + shape_to_string(spec.shape) + " has a negative dimension or overflows");
    if (spec.layout.empty()) return invalid_argument(what + ": empty layout (use \"plain\" for dense arrays)");
    if (!spec.attrs.is_object() && !spec.attrs.is_null()) {
      return invalid_argument(what + ": attrs must be a JSON object, found " + spec.attrs.type_name());
    }
    try {
      (void)json(spec.name).dump();
      (void)json(spec.layout).dump();
      if (spec.attrs.dump().size() > kMaxAttrsBytes) {
        return invalid_argument(what + ": attrs take more than " + std::to_string(kMaxAttrsBytes) +
                                " bytes of JSON; attrs are for small parameters, store data as a tensor");
      }
    } catch (const json::exception& e) {
      return invalid_argument(what + ": name, layout or attrs are not valid UTF-8 (" + e.what() + ")");
    }
    if (spec.layout == kPlainLayout) {
      const uint64_t expected = *elements * dtype_size(spec.dtype);
      if (spec.num_bytes != expected) {
        return invalid_argument(what + ": plain " + std::string(dtype_name(spec.dtype)) + " " +
                                shape_to_string(spec.shape) + " needs " + std::to_string(expected) +
                                " bytes, the spec declares " + std::to_string(spec.num_bytes));
      }
    }
    return ok_status();
  }
};

BundlePartWriter::BundlePartWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BundlePartWriter::~BundlePartWriter() = default;

Result<std::unique_ptr<BundlePartWriter>> BundlePartWriter::create(const fs::path& path, int part_index,
                                                                   int part_count,
                                                                   std::map<std::string, std::string> metadata) {
  const std::string where = path.string();
  if (part_count < 1 || part_index < 1 || part_index > part_count) {
    return invalid_argument(where + ": part " + std::to_string(part_index) + " of " + std::to_string(part_count) +
                            " is impossible (parts are numbered 1..N)");
  }
  if (auto named = parse_bundle_part_file_name(path.filename().string())) {
    if (named->first != part_index || named->second != part_count) {
      return invalid_argument(where + ": the file name says part " + std::to_string(named->first) + " of " +
                              std::to_string(named->second) + ", but part " + std::to_string(part_index) + " of " +
                              std::to_string(part_count) + " is being written");
    }
  }
  try {
    (void)json(metadata).dump();
  } catch (const json::exception& e) {
    return invalid_argument(where + ": metadata is not valid UTF-8 (" + e.what() + ")");
  }
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir.string() + ": output directory does not exist");

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->part_index = part_index;
  impl->part_count = part_count;
  impl->metadata = std::move(metadata);
  impl->chunk_state = new_xxh_state();
  impl->tensor_state = new_xxh_state();
  if (!impl->chunk_state || !impl->tensor_state) return internal_error(where + ": cannot allocate a hash state");
  impl->buffer.reserve(kWriteBufferBytes);

  static std::atomic<uint64_t> counter{0};
  // Same naming as AtomicFileWriter, so `petrel inspect` can recognize leftovers of a killed export.
  impl->temp_path = dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(counter.fetch_add(1)));
  impl->fd = ::open(impl->temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (impl->fd < 0) {
    const std::string e = errno_text();
    impl->temp_path.clear();  // not ours to remove
    return io_error(dir.string() + ": cannot create a temporary part file: " + e);
  }
  // The header is written last (it holds offsets and checksums); reserve its place.
  uint8_t placeholder[kBundlePartHeaderSize] = {};
  PETREL_RETURN_IF_ERROR(impl->raw_write(placeholder, sizeof placeholder));
  return std::unique_ptr<BundlePartWriter>(new BundlePartWriter(std::move(impl)));
}

Status BundlePartWriter::begin_tensor(const BundleTensorSpec& spec) {
  Impl& w = *impl_;
  PETREL_RETURN_IF_ERROR(w.usable("begin_tensor"));
  if (w.in_tensor) {
    return w.fail(internal_error(w.where() + ": begin_tensor('" + spec.name + "') while tensor '" +
                                 w.entries.back().spec.name + "' is still open (call end_tensor first)"));
  }
  Status valid = w.check_spec(spec);
  if (!valid.ok()) return w.fail(valid);
  Status padded = w.pad_to_alignment();
  if (!padded.ok()) return w.fail(padded);
  Impl::Entry entry;
  entry.spec = spec;
  if (entry.spec.attrs.is_null()) entry.spec.attrs = json::object();
  entry.offset = w.pos - kBundlePartHeaderSize;
  w.entries.push_back(std::move(entry));
  w.names.insert(spec.name);
  w.in_tensor = true;
  w.tensor_written = 0;
  XXH3_64bits_reset(w.tensor_state.get());
  return ok_status();
}

Status BundlePartWriter::write(const void* data, size_t size) {
  Impl& w = *impl_;
  PETREL_RETURN_IF_ERROR(w.usable("write"));
  if (!w.in_tensor) return w.fail(internal_error(w.where() + ": write() outside begin_tensor/end_tensor"));
  const BundleTensorSpec& spec = w.entries.back().spec;
  if (size > spec.num_bytes - w.tensor_written) {
    return w.fail(internal_error(w.where() + ": tensor '" + spec.name + "': " +
                                 std::to_string(w.tensor_written + size) + " bytes written, more than the declared " +
                                 std::to_string(spec.num_bytes)));
  }
  if (size == 0) return ok_status();
  XXH3_64bits_update(w.tensor_state.get(), data, size);
  Status s = w.data_append(data, size);
  if (!s.ok()) return w.fail(s);
  w.tensor_written += size;
  return ok_status();
}

Status BundlePartWriter::end_tensor() {
  Impl& w = *impl_;
  PETREL_RETURN_IF_ERROR(w.usable("end_tensor"));
  if (!w.in_tensor) return w.fail(internal_error(w.where() + ": end_tensor() without begin_tensor()"));
  Impl::Entry& entry = w.entries.back();
  if (w.tensor_written != entry.spec.num_bytes) {
    return w.fail(internal_error(w.where() + ": tensor '" + entry.spec.name + "': only " +
                                 std::to_string(w.tensor_written) + " of the declared " +
                                 std::to_string(entry.spec.num_bytes) + " bytes were written"));
  }
  entry.checksum = XXH3_64bits_digest(w.tensor_state.get());
  w.in_tensor = false;
  return ok_status();
}

Status BundlePartWriter::write_tensor(const BundleTensorSpec& spec, const void* data) {
  PETREL_RETURN_IF_ERROR(begin_tensor(spec));
  PETREL_RETURN_IF_ERROR(write(data, spec.num_bytes));
  return end_tensor();
}

Status BundlePartWriter::finish() {
  Impl& w = *impl_;
  PETREL_RETURN_IF_ERROR(w.usable("finish"));
  if (w.in_tensor) {
    return w.fail(internal_error(w.where() + ": finish() while tensor '" + w.entries.back().spec.name +
                                 "' is incomplete (" + std::to_string(w.tensor_written) + " of " +
                                 std::to_string(w.entries.back().spec.num_bytes) + " bytes)"));
  }
  const uint64_t data_offset = kBundlePartHeaderSize;
  const uint64_t data_size = w.pos - data_offset;
  if (w.chunk_filled > 0) {
    w.chunk_hashes.push_back(XXH3_64bits_digest(w.chunk_state.get()));
    w.chunk_filled = 0;
  }
  const uint64_t data_checksum = combine_chunk_hashes(w.chunk_hashes);

  std::string table;
  try {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const Impl::Entry& e : w.entries) {
      nlohmann::ordered_json t;
      t["name"] = e.spec.name;
      t["dtype"] = std::string(dtype_name(e.spec.dtype));
      t["shape"] = e.spec.shape;
      t["layout"] = e.spec.layout;
      t["attrs"] = nlohmann::ordered_json::parse(e.spec.attrs.dump());
      t["offset"] = e.offset;
      t["size"] = e.spec.num_bytes;
      t["xxh3"] = hex16(e.checksum);
      tensors.push_back(std::move(t));
    }
    nlohmann::ordered_json root;
    root["tensors"] = std::move(tensors);
    root["metadata"] = w.metadata;
    table = root.dump();
  } catch (const json::exception& e) {
    return w.fail(internal_error(w.where() + ": cannot serialize the tensor table: " + e.what()));
  }
  const uint64_t table_offset = w.pos;
  Status s = w.raw_write(table.data(), table.size());
  if (s.ok()) s = w.flush();
  if (!s.ok()) return w.fail(s);

  uint8_t header[kBundlePartHeaderSize] = {};
  std::memcpy(header + kOffMagic, kBundlePartMagic, 8);
  put_u32(header + kOffVersion, kBundlePartFormatVersion);
  put_u32(header + kOffHeaderSize, static_cast<uint32_t>(kBundlePartHeaderSize));
  put_u32(header + kOffPartIndex, static_cast<uint32_t>(w.part_index));
  put_u32(header + kOffPartCount, static_cast<uint32_t>(w.part_count));
  put_u32(header + kOffAlignment, static_cast<uint32_t>(kBundleTensorAlignment));
  put_u32(header + kOffTensorCount, static_cast<uint32_t>(w.entries.size()));
  put_u64(header + kOffFileSize, table_offset + table.size());
  put_u64(header + kOffDataOffset, data_offset);
  put_u64(header + kOffDataSize, data_size);
  put_u64(header + kOffTableOffset, table_offset);
  put_u64(header + kOffTableSize, table.size());
  put_u64(header + kOffChunkSize, kBundleChecksumChunkSize);
  put_u64(header + kOffDataChecksum, data_checksum);
  put_u64(header + kOffHeaderChecksum,
          header_checksum(header, reinterpret_cast<const uint8_t*>(table.data()), table.size()));

  size_t done = 0;
  while (done < sizeof header) {
    ssize_t n = ::pwrite(w.fd, header + done, sizeof header - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return w.fail(io_error(w.temp_path.string() + ": cannot write the part header: " + errno_text()));
    done += static_cast<size_t>(n);
  }
  if (::fsync(w.fd) != 0) return w.fail(io_error(w.temp_path.string() + ": fsync failed: " + errno_text()));
  const int fd = w.fd;
  w.fd = -1;
  if (::close(fd) != 0) return w.fail(io_error(w.temp_path.string() + ": close failed: " + errno_text()));
  if (::rename(w.temp_path.c_str(), w.path.c_str()) != 0) {
    return w.fail(io_error("cannot rename " + w.temp_path.string() + " to " + w.path.string() + ": " + errno_text()));
  }
  w.finished = true;
  // Make the rename itself durable; failing to is not an error of the part.
  const fs::path dir = w.path.has_parent_path() ? w.path.parent_path() : fs::path(".");
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return ok_status();
}

const fs::path& BundlePartWriter::path() const { return impl_->path; }
const fs::path& BundlePartWriter::temp_path() const { return impl_->temp_path; }
size_t BundlePartWriter::tensor_count() const { return impl_->entries.size(); }
uint64_t BundlePartWriter::bytes_written() const { return impl_->pos; }

// ---------------------------------------------------------------------------------------------------------
// Reader

Result<BundlePart> BundlePart::open(const fs::path& path, BundleVerify verify, ThreadPool* pool) {
  BundlePart part;
  PETREL_ASSIGN_OR_RETURN(part.map_, MappedFile::open(path));
  const std::string where = path.string();
  const uint64_t size = part.map_.size();
  const uint8_t* base = part.map_.data();

  if (size < kBundlePartHeaderSize) {
    return invalid_data(where + ": " + std::to_string(size) + " bytes, too short for a part header (" +
                        std::to_string(kBundlePartHeaderSize) + " bytes): truncated or not a petrel bundle part");
  }
  if (std::memcmp(base + kOffMagic, kBundlePartMagic, 8) != 0) {
    return invalid_data(where + ": not a petrel bundle part: magic is \"" + printable(base, 8) +
                        "\", expected \"PETRELPT\"");
  }
  const uint32_t version = get_u32(base + kOffVersion);
  if (version != kBundlePartFormatVersion) {
    return unsupported(where + ": part format version " + std::to_string(version) + ", this petrel reads version " +
                       std::to_string(kBundlePartFormatVersion) + " (re-export the bundle or update petrel)");
  }
  const uint64_t table_offset = get_u64(base + kOffTableOffset);
  const uint64_t table_size = get_u64(base + kOffTableSize);
  const uint64_t declared_size = get_u64(base + kOffFileSize);
  if (table_offset < kBundlePartHeaderSize || table_offset > size || table_size > size - table_offset) {
    return invalid_data(where + ": the tensor table [" + std::to_string(table_offset) + ", +" +
                        std::to_string(table_size) + ") lies outside the file of " + std::to_string(size) +
                        " bytes; the header says the part is " + std::to_string(declared_size) +
                        " bytes: truncated, or the header is corrupted");
  }
  if (table_size > kMaxTableBytes) {
    return invalid_data(where + ": tensor table of " + std::to_string(table_size) + " bytes exceeds the limit of " +
                        std::to_string(kMaxTableBytes) + " (corrupted header?)");
  }
  const uint64_t stored_header_checksum = get_u64(base + kOffHeaderChecksum);
  const uint64_t computed_header_checksum = header_checksum(base, base + table_offset, table_size);
  if (stored_header_checksum != computed_header_checksum) {
    return invalid_data(where + ": header checksum mismatch: header says " + checksum_hex(stored_header_checksum) +
                        ", computed " + checksum_hex(computed_header_checksum) +
                        " (the header or the tensor table is corrupted)");
  }
  // From here on the header and the table are what the writer wrote; what follows catches writer bugs and
  // hand-made files.
  if (declared_size != size) {
    return invalid_data(where + ": the header says the part is " + std::to_string(declared_size) +
                        " bytes, the file has " + std::to_string(size) + " (truncated or appended to)");
  }
  const uint32_t header_size = get_u32(base + kOffHeaderSize);
  if (header_size != kBundlePartHeaderSize) {
    return invalid_data(where + ": header size " + std::to_string(header_size) + ", expected " +
                        std::to_string(kBundlePartHeaderSize));
  }
  const uint32_t part_index = get_u32(base + kOffPartIndex);
  const uint32_t part_count = get_u32(base + kOffPartCount);
  if (part_count < 1 || part_index < 1 || part_index > part_count || part_count > 1000000) {
    return invalid_data(where + ": the header says part " + std::to_string(part_index) + " of " +
                        std::to_string(part_count) + ", which is impossible (parts are numbered 1..N)");
  }
  if (auto named = parse_bundle_part_file_name(path.filename().string())) {
    if (static_cast<uint32_t>(named->first) != part_index || static_cast<uint32_t>(named->second) != part_count) {
      return invalid_data(where + ": the header says part " + std::to_string(part_index) + " of " +
                          std::to_string(part_count) + ", but the file name says part " +
                          std::to_string(named->first) + " of " + std::to_string(named->second) +
                          " (renamed or mixed-up parts)");
    }
  }
  const uint32_t alignment = get_u32(base + kOffAlignment);
  if (alignment < kBundleTensorAlignment || (alignment & (alignment - 1)) != 0) {
    return invalid_data(where + ": tensor alignment " + std::to_string(alignment) +
                        ", expected a power of two >= " + std::to_string(kBundleTensorAlignment));
  }
  const uint64_t data_offset = get_u64(base + kOffDataOffset);
  const uint64_t data_size = get_u64(base + kOffDataSize);
  if (data_offset < kBundlePartHeaderSize || data_offset % alignment != 0 || data_offset > table_offset ||
      data_size > table_offset - data_offset) {
    return invalid_data(where + ": the data region [" + std::to_string(data_offset) + ", +" +
                        std::to_string(data_size) + ") must start after the header at a multiple of " +
                        std::to_string(alignment) + " and end before the tensor table at " +
                        std::to_string(table_offset));
  }
  const uint64_t chunk_size = get_u64(base + kOffChunkSize);
  if (chunk_size < 4096 || chunk_size > (1ull << 40)) {
    return invalid_data(where + ": checksum chunk size " + std::to_string(chunk_size) +
                        " is outside [4096, 2^40]");
  }
  part.part_index_ = static_cast<int>(part_index);
  part.part_count_ = static_cast<int>(part_count);
  part.data_offset_ = data_offset;
  part.data_size_ = data_size;
  part.chunk_size_ = chunk_size;
  part.data_checksum_ = get_u64(base + kOffDataChecksum);

  const char* table_begin = reinterpret_cast<const char*>(base + table_offset);
  json table = json::parse(table_begin, table_begin + table_size, nullptr, /*allow_exceptions=*/false);
  if (table.is_discarded() || !table.is_object()) return invalid_data(where + ": the tensor table is not a JSON object");
  auto jtensors = table.find("tensors");
  if (jtensors == table.end() || !jtensors->is_array()) {
    return invalid_data(where + ": the tensor table has no 'tensors' array");
  }
  if (auto jmeta = table.find("metadata"); jmeta != table.end() && !jmeta->is_null()) {
    if (!jmeta->is_object()) return invalid_data(where + ": table 'metadata' is not an object");
    for (auto m = jmeta->begin(); m != jmeta->end(); ++m) {
      if (!m.value().is_string()) return invalid_data(where + ": table metadata['" + m.key() + "'] is not a string");
      part.metadata_[m.key()] = m.value().get<std::string>();
    }
  }
  const uint32_t tensor_count = get_u32(base + kOffTensorCount);
  if (jtensors->size() != tensor_count) {
    return invalid_data(where + ": the header counts " + std::to_string(tensor_count) + " tensors, the table lists " +
                        std::to_string(jtensors->size()));
  }

  const uint8_t* data = base + data_offset;
  for (size_t i = 0; i < jtensors->size(); ++i) {
    const json& entry = (*jtensors)[i];
    std::string what = where + ": tensor table entry " + std::to_string(i);
    if (!entry.is_object()) return invalid_data(what + " is not an object");
    auto field = [&](const char* key) -> const json* {
      auto it = entry.find(key);
      return it == entry.end() ? nullptr : &*it;
    };
    const json* jname = field("name");
    if (!jname || !jname->is_string() || jname->get<std::string>().empty()) {
      return invalid_data(what + ": 'name' must be a non-empty string");
    }
    BundleTensor t;
    t.name = jname->get<std::string>();
    what = where + ": tensor '" + t.name + "'";
    if (part.index_.count(t.name)) return invalid_data(what + " is listed twice");
    const json* jdtype = field("dtype");
    if (!jdtype || !jdtype->is_string()) return invalid_data(what + ": 'dtype' must be a string");
    auto dtype = dtype_from_name(jdtype->get<std::string>());
    if (!dtype) return unsupported(what + ": dtype '" + jdtype->get<std::string>() + "' is not supported");
    t.dtype = *dtype;
    const json* jshape = field("shape");
    if (!jshape || !jshape->is_array()) return invalid_data(what + ": 'shape' must be an array");
    for (const json& d : *jshape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return invalid_data(what + ": shape " + jshape->dump() + " has a non-integer or negative dimension");
      }
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    auto elements = element_count(t.shape);
    if (!elements) return invalid_data(what + ": shape " + jshape->dump() + " overflows");
    const json* jlayout = field("layout");
    if (!jlayout || !jlayout->is_string() || jlayout->get<std::string>().empty()) {
      return invalid_data(what + ": 'layout' must be a non-empty string");
    }
    t.layout = jlayout->get<std::string>();
    if (const json* jattrs = field("attrs"); jattrs && !jattrs->is_null()) {
      if (!jattrs->is_object()) return invalid_data(what + ": 'attrs' must be an object, found " + jattrs->dump());
      t.attrs = *jattrs;
    }
    const json* joffset = field("offset");
    const json* jsize = field("size");
    if (!joffset || !joffset->is_number_unsigned() || !jsize || !jsize->is_number_unsigned()) {
      return invalid_data(what + ": 'offset' and 'size' must be non-negative integers");
    }
    t.offset = joffset->get<uint64_t>();
    t.num_bytes = jsize->get<uint64_t>();
    if (t.offset > data_size || t.num_bytes > data_size - t.offset) {
      return invalid_data(what + ": bytes [" + std::to_string(t.offset) + ", " + std::to_string(t.offset) + " + " +
                          std::to_string(t.num_bytes) + ") lie outside the data region of " +
                          std::to_string(data_size) + " bytes");
    }
    if ((data_offset + t.offset) % alignment != 0) {
      return invalid_data(what + ": starts at file offset " + std::to_string(data_offset + t.offset) +
                          ", not a multiple of " + std::to_string(alignment) +
                          " (memory-mapped pointers would be misaligned)");
    }
    if (t.is_plain()) {
      const uint64_t expected = *elements * dtype_size(t.dtype);
      if (t.num_bytes != expected) {
        return invalid_data(what + ": " + std::to_string(t.num_bytes) + " bytes stored, but plain " +
                            std::string(dtype_name(t.dtype)) + " " + shape_to_string(t.shape) + " needs " +
                            std::to_string(expected));
      }
    }
    const json* jsum = field("xxh3");
    std::optional<uint64_t> sum;
    if (jsum && jsum->is_string()) sum = parse_hex16(jsum->get<std::string>());
    if (!sum) return invalid_data(what + ": 'xxh3' must be 16 hexadecimal digits");
    t.checksum = *sum;
    t.data = data + t.offset;
    part.index_[t.name] = part.tensors_.size();
    part.tensors_.push_back(std::move(t));
  }
  std::vector<size_t> order(part.tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const BundleTensor& x = part.tensors_[a];
    const BundleTensor& y = part.tensors_[b];
    return x.offset != y.offset ? x.offset < y.offset : x.num_bytes < y.num_bytes;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const BundleTensor& prev = part.tensors_[order[i - 1]];
    const BundleTensor& cur = part.tensors_[order[i]];
    if (cur.offset < prev.offset + prev.num_bytes) {
      return invalid_data(where + ": tensors '" + prev.name + "' [" + std::to_string(prev.offset) + ", " +
                          std::to_string(prev.offset + prev.num_bytes) + ") and '" + cur.name + "' [" +
                          std::to_string(cur.offset) + ", " + std::to_string(cur.offset + cur.num_bytes) +
                          ") overlap");
    }
  }
  if (verify == BundleVerify::kFull) PETREL_RETURN_IF_ERROR(part.verify_data(pool));
  return part;
}

const BundleTensor* BundlePart::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status BundlePart::verify_data(ThreadPool* pool) const {
  ThreadPool& threads = pool ? *pool : ThreadPool::global();
  const uint8_t* data = map_.data() + data_offset_;
  const uint64_t computed = hash_data_region(data, data_size_, chunk_size_, threads);
  if (computed == data_checksum_) return ok_status();
  // Pin the damage on tensors, so the user knows what is lost.
  std::string culprits;
  int bad = 0;
  for (const BundleTensor& t : tensors_) {
    const uint64_t sum = hash_bytes(t.data, t.num_bytes);
    if (sum == t.checksum) continue;
    if (++bad <= 5) {
      culprits += std::string(bad > 1 ? "; " : "") + "tensor '" + t.name + "' fails its own checksum: stored " +
                  checksum_hex(t.checksum) + ", computed " + checksum_hex(sum);
    }
  }
  if (bad > 5) culprits += "; and " + std::to_string(bad - 5) + " more tensors";
  if (bad == 0) culprits = "every tensor matches its own checksum: the damage is in the padding between tensors";
  return invalid_data(path().string() + ": data checksum mismatch: header says " + checksum_hex(data_checksum_) +
                      ", computed " + checksum_hex(computed) + " (the file is corrupted; " + culprits + ")");
}

Status BundlePart::verify_tensor(const BundleTensor& tensor) const {
  const uint64_t sum = hash_bytes(tensor.data, tensor.num_bytes);
  if (sum == tensor.checksum) return ok_status();
  return invalid_data(path().string() + ": tensor '" + tensor.name + "': checksum mismatch: table says " +
                      checksum_hex(tensor.checksum) + ", computed " + checksum_hex(sum) + " (the file is corrupted)");
}

}  // namespace petrel
