#include "petrel/util/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace petrel {

namespace fs = std::filesystem;

static std::string errno_text() { return std::strerror(errno); }

Result<MappedFile> MappedFile::open(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(path.string() + ": no such file");
    return io_error(path.string() + ": cannot open: " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string e = errno_text();
    ::close(fd);
    return io_error(path.string() + ": cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path.string() + ": not a regular file");
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string e = errno_text();
      ::close(fd);
      return io_error(path.string() + ": cannot mmap " + std::to_string(file.size_) + " bytes: " + e);
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(other.data_), size_(other.size_), path_(std::move(other.path_)) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = other.data_;
    size_ = other.size_;
    path_ = std::move(other.path_);
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release(const void* ptr, size_t size) const {
  const uint8_t* p = static_cast<const uint8_t*>(ptr);
  if (!data_ || p < data_ || p + size > data_ + size_) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(p + size);
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> read_text_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(path.string() + ": no such file");
  if (fs::is_directory(path, ec)) return invalid_argument(path.string() + ": is a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path.string() + ": cannot open: " + errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error(path.string() + ": read failed");
  return ss.str();
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::create(const fs::path& path) {
  static std::atomic<uint64_t> counter{0};
  std::unique_ptr<AtomicFileWriter> w(new AtomicFileWriter());
  w->path_ = path;
  fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found(dir.string() + ": output directory does not exist");
  w->temp_path_ = dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                         std::to_string(counter.fetch_add(1)));
  w->file_ = std::fopen(w->temp_path_.c_str(), "wb");
  if (!w->file_) return io_error(w->temp_path_.string() + ": cannot create: " + errno_text());
  return w;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_) std::fclose(file_);
  if (!committed_ && !temp_path_.empty()) {
    std::error_code ec;
    fs::remove(temp_path_, ec);
  }
}

Status AtomicFileWriter::write(const void* data, size_t size) {
  if (!file_) return internal_error(path_.string() + ": write after commit");
  if (size == 0) return ok_status();
  if (std::fwrite(data, 1, size, file_) != size) {
    return io_error(temp_path_.string() + ": write failed after " + std::to_string(bytes_written_) +
                    " bytes: " + errno_text());
  }
  bytes_written_ += size;
  return ok_status();
}

Status AtomicFileWriter::commit() {
  if (!file_) return internal_error(path_.string() + ": commit called twice");
  if (std::fflush(file_) != 0) return io_error(temp_path_.string() + ": flush failed: " + errno_text());
  ::fsync(::fileno(file_));
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    return io_error(temp_path_.string() + ": close failed: " + errno_text());
  }
  file_ = nullptr;
  std::error_code ec;
  fs::rename(temp_path_, path_, ec);
  if (ec) return io_error("cannot rename " + temp_path_.string() + " to " + path_.string() + ": " + ec.message());
  committed_ = true;
  return ok_status();
}

Result<std::unique_ptr<StagingDirectory>> StagingDirectory::create(const fs::path& final_path) {
  std::unique_ptr<StagingDirectory> dir(new StagingDirectory());
  dir->final_path_ = final_path;
  dir->temp_path_ = final_path.parent_path() / ("." + final_path.filename().string() + ".tmp." + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(dir->temp_path_, ec);
  fs::create_directories(dir->temp_path_, ec);
  if (ec) return io_error(dir->temp_path_.string() + ": cannot create: " + ec.message());
  return dir;
}

StagingDirectory::~StagingDirectory() {
  std::error_code ec;
  if (!committed_) fs::remove_all(temp_path_, ec);
}

Status StagingDirectory::commit() {
  std::error_code ec;
  if (fs::exists(final_path_, ec)) fs::remove_all(final_path_, ec);
  fs::rename(temp_path_, final_path_, ec);
  if (ec) return io_error("cannot rename " + temp_path_.string() + " to " + final_path_.string() + ": " + ec.message());
  committed_ = true;
  return ok_status();
}

Status write_file_atomic(const fs::path& path, const std::string& contents) {
  PETREL_ASSIGN_OR_RETURN(auto writer, AtomicFileWriter::create(path));
  PETREL_RETURN_IF_ERROR(writer->write(contents));
  return writer->commit();
}

}  // namespace petrel
