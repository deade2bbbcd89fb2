#include "petrel/kernels/cuda/uploader.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace petrel::cuda {

namespace {

// Below this a chunk piece is copied by the calling thread alone (a thread start costs ~20 us).
// Threads of its own rather than util's ThreadPool: that pool takes one caller at a time, and a model load
// must not contend with (or wait behind) CPU kernels another engine runs on it.
constexpr size_t kParallelCopyBytes = size_t{4} << 20;

// Source rows of `row_bytes`, `stride` bytes apart; offsets count in the rows' dense image.
struct Rows {
  const char* host;
  size_t row_bytes, stride;
  // Copies dense bytes [offset, offset + bytes) to dst.
  void gather(char* dst, size_t offset, size_t bytes) const {
    if (stride == row_bytes) {  // contiguous (copy(), a cuda bundle's tensors)
      std::memcpy(dst, host + offset, bytes);
      return;
    }
    while (bytes > 0) {
      const size_t row = offset / row_bytes, col = offset % row_bytes, take = std::min(bytes, row_bytes - col);
      std::memcpy(dst, host + row * stride + col, take);
      dst += take;
      offset += take;
      bytes -= take;
    }
  }
};

void parallel_gather(char* dst, const Rows& rows, size_t offset, size_t bytes, int threads) {
  if (threads <= 1 || bytes < kParallelCopyBytes) {
    rows.gather(dst, offset, bytes);
    return;
  }
  const size_t piece = (bytes + threads - 1) / threads;
  std::vector<std::thread> workers;
  workers.reserve(threads - 1);
  for (int t = 1; t < threads; ++t) {
    const size_t begin = std::min(bytes, t * piece), end = std::min(bytes, begin + piece);
    if (begin < end) workers.emplace_back([=, &rows] { rows.gather(dst + begin, offset + begin, end - begin); });
  }
  rows.gather(dst, offset, std::min(bytes, piece));
  for (std::thread& w : workers) w.join();
}

}  // namespace

Result<HostUploader> HostUploader::create(size_t chunk_bytes, int slots, int threads) {
  if (chunk_bytes == 0 || slots < 2) return invalid_argument("HostUploader: needs at least 2 slots of more than 0 bytes");
  HostUploader u;
  u.chunk_ = chunk_bytes;
  u.threads_ = std::max(threads, 1);
  PETREL_ASSIGN_OR_RETURN(u.stream_, CudaStream::create());
  u.slots_.resize(slots);
  for (Slot& s : u.slots_) {
    PETREL_ASSIGN_OR_RETURN(s.buffer, PinnedBuffer::allocate(chunk_bytes));
    PETREL_ASSIGN_OR_RETURN(s.done, CudaEvent::create());
  }
  return u;
}

Status HostUploader::close_slot() {
  Slot& s = slots_[current_];
  if (fill_ > 0) {
    PETREL_RETURN_IF_ERROR(s.done.record(stream_.get()));
    s.busy = true;
  }
  current_ = (current_ + 1) % static_cast<int>(slots_.size());
  fill_ = 0;
  Slot& next = slots_[current_];
  if (next.busy) {  // its copies must have left the buffer before the host overwrites it
    PETREL_RETURN_IF_ERROR(next.done.synchronize());
    next.busy = false;
  }
  return ok_status();
}

Status HostUploader::copy(void* device, const void* host, size_t bytes) { return copy_rows(device, host, bytes, bytes, 1); }

Status HostUploader::copy_rows(void* device, const void* host, size_t row_bytes, size_t stride, size_t rows) {
  const size_t bytes = row_bytes * rows;
  if (bytes > 0 && (!device || !host)) return invalid_argument("HostUploader::copy: null pointer");
  if (rows > 1 && stride < row_bytes) return invalid_argument("HostUploader::copy_rows: a stride shorter than a row");
  const Rows source{static_cast<const char*>(host), row_bytes, stride};
  size_t done = 0;
  while (done < bytes) {
    if (fill_ == chunk_) PETREL_RETURN_IF_ERROR(close_slot());
    Slot& s = slots_[current_];
    const size_t take = std::min(bytes - done, chunk_ - fill_);
    char* staged = s.buffer.as<char>() + fill_;
    parallel_gather(staged, source, done, take, threads_);
    PETREL_RETURN_IF_ERROR(copy_to_device(static_cast<char*>(device) + done, staged, take, stream_.get()));
    fill_ += take;
    done += take;
  }
  bytes_ += static_cast<int64_t>(bytes);
  return ok_status();
}

Status HostUploader::finish() {
  if (slots_.empty()) return ok_status();
  PETREL_RETURN_IF_ERROR(close_slot());
  PETREL_RETURN_IF_ERROR(stream_.synchronize());
  for (Slot& s : slots_) s.busy = false;
  return ok_status();
}

}  // namespace petrel::cuda
