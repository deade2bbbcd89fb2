#include "petrel/util/status.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "petrel/util/file.h"
#include "petrel/util/parallel.h"

namespace petrel {
namespace {

Result<int> half(int x) {
  if (x % 2) return invalid_argument("odd: " + std::to_string(x));
  return x / 2;
}

Status quarter(int x, int* out) {
  PETREL_ASSIGN_OR_RETURN(int h, half(x));
  PETREL_ASSIGN_OR_RETURN(int q, half(h));
  *out = q;
  return ok_status();
}

TEST(Status, PropagatesErrorsWithMessages) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = quarter(6, &out);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid argument: odd: 3");
  EXPECT_EQ(s.with_context("f.txt").message(), "f.txt: odd: 3");
}

TEST(AtomicFileWriter, LeavesNoFileWhenNotCommitted) {
  auto dir = std::filesystem::temp_directory_path() / "petrel_atomic_test";
  std::filesystem::create_directories(dir);
  auto path = dir / "out.bin";
  std::filesystem::remove(path);
  {
    auto w = AtomicFileWriter::create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->write("partial").ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
  ASSERT_TRUE(write_file_atomic(path, "complete").ok());
  auto text = read_text_file(path);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "complete");
  std::filesystem::remove_all(dir);
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(1001, 0);
  pool.parallel_for(1001, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (int h : hits) EXPECT_EQ(h, 1);
}

// Many short calls on pools larger than the machine: threads fall behind, wake late and take each other's
// chunks; every index must still be covered exactly once by each call, and a call must see the previous one's
// writes.
TEST(ThreadPool, BackToBackCallsOnMoreThreadsThanCoresCoverEveryIndexOnce) {
  for (int threads : {2, 3, 8, 16}) {
    ThreadPool pool(threads);
    for (int call = 0; call < 2000; ++call) {
      const int64_t n = 1 + call % 257, min_block = 1 + call % 7;
      std::vector<int> hits(static_cast<size_t>(n), 0);
      pool.parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)] += 1;
      }, min_block);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << threads << " threads, call " << call << ", index " << i;
    }
  }
}

}  // namespace
}  // namespace petrel
