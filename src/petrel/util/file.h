// Files: read-only memory maps, whole-file reads, and atomic writes (temporary name, rename when complete).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "petrel/util/status.h"

namespace petrel {

// A read-only, private memory map of a whole file. Move-only; unmaps on destruction.
class MappedFile {
 public:
  static Result<MappedFile> open(const std::filesystem::path& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // Drops the pages of [ptr, ptr + size) from this process (madvise DONTNEED): they stay in the page cache
  // but stop counting towards RSS. For streaming a large file once in bounded memory.
  void release(const void* ptr, size_t size) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::filesystem::path path_;
};

Result<std::string> read_text_file(const std::filesystem::path& path);

// Writes a file under a temporary name in the same directory and renames it over `path` on commit().
// If the writer is destroyed without commit() (an error, an exception), the temporary file is removed,
// so a reader never sees a partial file under the final name.
class AtomicFileWriter {
 public:
  static Result<std::unique_ptr<AtomicFileWriter>> create(const std::filesystem::path& path);
  ~AtomicFileWriter();

  Status write(const void* data, size_t size);
  Status write(const std::string& s) { return write(s.data(), s.size()); }
  uint64_t bytes_written() const { return bytes_written_; }
  // Flushes, fsyncs and renames to the final name.
  Status commit();
  const std::filesystem::path& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter() = default;
  std::filesystem::path path_;
  std::filesystem::path temp_path_;
  std::FILE* file_ = nullptr;
  uint64_t bytes_written_ = 0;
  bool committed_ = false;
};

// A directory assembled under a temporary name beside its final path (".NAME.tmp.PID") and renamed into place
// by commit(), replacing whatever was there; removed if destroyed first. Readers never see a half-written
// directory under the final name. Callers decide beforehand whether replacing an existing one is allowed.
class StagingDirectory {
 public:
  static Result<std::unique_ptr<StagingDirectory>> create(const std::filesystem::path& final_path);
  ~StagingDirectory();
  const std::filesystem::path& path() const { return temp_path_; }
  std::filesystem::path operator/(const std::string& name) const { return temp_path_ / name; }
  Status commit();

 private:
  StagingDirectory() = default;
  std::filesystem::path final_path_, temp_path_;
  bool committed_ = false;
};

// Convenience: atomically replaces `path` with `contents`.
Status write_file_atomic(const std::filesystem::path& path, const std::string& contents);

}  // namespace petrel
