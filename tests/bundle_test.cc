// The bundle container: part files (bundle_part.h), config.json (bundle_config.h), whole-bundle checks
// (bundle.h). Corrupt and hand-made parts are built byte by byte from docs/BUNDLE_FORMAT.md, independently of
// the writer, so these tests also check that the document describes what the code does.
#include "petrel/io/bundle.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>

#include "petrel/util/parallel.h"
#include "test_util.h"

namespace petrel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::TempDir;

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void flip_byte(const fs::path& path, uint64_t offset) {
  std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_LT(offset, bytes.size());
  bytes[offset] ^= 0x5a;
  write_bytes(path, bytes);
}

struct TestTensor {
  BundleTensorSpec spec;
  std::vector<uint8_t> bytes;
};

TestTensor plain_tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  TestTensor t;
  t.spec = BundleTensorSpec::plain(name, dtype, std::move(shape));
  t.bytes = pattern(t.spec.num_bytes, seed);
  return t;
}

TestTensor packed_tensor(const std::string& name, std::vector<int64_t> shape, size_t bytes, uint32_t seed) {
  TestTensor t;
  t.spec.name = name;
  t.spec.dtype = DType::kU8;
  t.spec.shape = std::move(shape);
  t.spec.num_bytes = bytes;
  t.spec.layout = "w4-per-group-k-major";
  t.spec.attrs = {{"bits", 4}, {"group_size", 128}};
  t.bytes = pattern(bytes, seed);
  return t;
}

// Writes a part, each tensor in uneven spans (1, 7, then the rest) to exercise streaming.
Status write_part(const fs::path& path, int k, int n, const std::vector<TestTensor>& tensors) {
  PETREL_ASSIGN_OR_RETURN(auto w, BundlePartWriter::create(path, k, n, {{"producer", "bundle_test"}}));
  for (const TestTensor& t : tensors) {
    PETREL_RETURN_IF_ERROR(w->begin_tensor(t.spec));
    size_t done = 0;
    for (size_t span : {size_t{1}, size_t{7}, t.bytes.size()}) {
      size_t take = std::min(span, t.bytes.size() - done);
      PETREL_RETURN_IF_ERROR(w->write(t.bytes.data() + done, take));
      done += take;
    }
    PETREL_RETURN_IF_ERROR(w->end_tensor());
  }
  return w->finish();
}

// ---- A part built from the format document, without the writer -----------------------------------------

void put32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct CraftedPart {
  uint32_t part_index = 1;
  uint32_t part_count = 1;
  uint32_t alignment = 64;
  uint64_t data_offset = 128;
  uint64_t chunk_size = 16ull << 20;
  std::vector<uint8_t> data;  // the data region
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  std::optional<uint32_t> tensor_count;  // default: the table's

  // An entry whose checksum is computed from the data region when the range lies inside it.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, uint64_t offset,
           uint64_t size, const std::string& layout = "plain") {
    uint64_t sum = offset + size <= data.size() ? XXH3_64bits(data.data() + offset, size) : 0;
    nlohmann::ordered_json entry;
    entry["name"] = name;
    entry["dtype"] = dtype;
    entry["shape"] = shape;
    entry["layout"] = layout;
    entry["attrs"] = nlohmann::ordered_json::object();
    entry["offset"] = offset;
    entry["size"] = size;
    entry["xxh3"] = hex16(sum);
    tensors.push_back(entry);
  }

  std::vector<uint8_t> bytes(const std::string& table_override = "") const {
    nlohmann::ordered_json root;
    root["tensors"] = tensors;
    root["metadata"] = nlohmann::ordered_json::object();
    const std::string table = table_override.empty() ? root.dump() : table_override;
    std::vector<uint8_t> file(data_offset, 0);
    file.insert(file.end(), data.begin(), data.end());
    const uint64_t table_offset = file.size();
    file.insert(file.end(), table.begin(), table.end());
    std::memcpy(file.data(), "PETRELPT", 8);
    put32(file, 8, 1);
    put32(file, 12, 128);
    put32(file, 16, part_index);
    put32(file, 20, part_count);
    put32(file, 24, alignment);
    put32(file, 28, tensor_count.value_or(static_cast<uint32_t>(tensors.size())));
    put64(file, 32, file.size());
    put64(file, 40, data_offset);
    put64(file, 48, data.size());
    put64(file, 56, table_offset);
    put64(file, 64, table.size());
    put64(file, 72, chunk_size);
    // Data checksum: XXH3-64 of the little-endian XXH3-64 hashes of the chunks.
    std::vector<uint8_t> chunk_hashes;
    for (uint64_t off = 0; off < data.size(); off += chunk_size) {
      std::vector<uint8_t> h(8);
      put64(h, 0, XXH3_64bits(data.data() + off, std::min<uint64_t>(chunk_size, data.size() - off)));
      chunk_hashes.insert(chunk_hashes.end(), h.begin(), h.end());
    }
    put64(file, 80, XXH3_64bits(chunk_hashes.data(), chunk_hashes.size()));
    // Header checksum: XXH3-64 of header bytes [0, 120) followed by the table.
    std::vector<uint8_t> covered(file.begin(), file.begin() + 120);
    covered.insert(covered.end(), table.begin(), table.end());
    put64(file, 120, XXH3_64bits(covered.data(), covered.size()));
    return file;
  }
};

// ---- Part files ------------------------------------------------------------------------------------------

TEST(BundlePart, FileNames) {
  EXPECT_EQ(bundle_part_file_name(3, 5), "part_3_of_5.bin");
  EXPECT_EQ(parse_bundle_part_file_name("part_3_of_5.bin"), (std::pair{3, 5}));
  EXPECT_FALSE(parse_bundle_part_file_name("part_3_of_5.bin.tmp"));
  EXPECT_FALSE(parse_bundle_part_file_name("part_x_of_5.bin"));
  EXPECT_FALSE(parse_bundle_part_file_name("weights.bin"));
}

TEST(BundlePart, RoundTripsTensorsAcrossPartsWithOddSizesAndAlignedPointers) {
  TempDir dir("bundle_roundtrip");
  std::vector<std::vector<TestTensor>> parts = {
      {plain_tensor("embed", DType::kBF16, {13, 7}, 1), plain_tensor("odd", DType::kU8, {3}, 2)},
      {plain_tensor("norm", DType::kF32, {5}, 3), packed_tensor("layers.0.wq", {96, 65}, 3121, 4),
       plain_tensor("empty", DType::kF16, {0, 4}, 5), plain_tensor("one", DType::kI8, {1, 1, 1}, 6)},
      // Larger than the 4 MiB write buffer and than one 16 MiB checksum chunk, odd-sized.
      {plain_tensor("big", DType::kU8, {(17 << 20) + 3}, 7), plain_tensor("tail", DType::kI32, {11}, 8)},
  };
  for (size_t p = 0; p < parts.size(); ++p) {
    Status s = write_part(dir / bundle_part_file_name(p + 1, 3), p + 1, 3, parts[p]);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }
  for (size_t p = 0; p < parts.size(); ++p) {
    auto part = BundlePart::open(dir / bundle_part_file_name(p + 1, 3), BundleVerify::kFull);
    ASSERT_TRUE(part.ok()) << part.status().to_string();
    EXPECT_EQ(part->part_index(), static_cast<int>(p + 1));
    EXPECT_EQ(part->part_count(), 3);
    EXPECT_EQ(part->metadata().at("producer"), "bundle_test");
    ASSERT_EQ(part->tensors().size(), parts[p].size());
    for (const TestTensor& expected : parts[p]) {
      const BundleTensor* t = part->find(expected.spec.name);
      ASSERT_NE(t, nullptr) << expected.spec.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % 64, 0u) << t->name;
      EXPECT_EQ(t->dtype, expected.spec.dtype);
      EXPECT_EQ(t->shape, expected.spec.shape);
      EXPECT_EQ(t->layout, expected.spec.layout);
      EXPECT_EQ(t->attrs, expected.spec.attrs);
      ASSERT_EQ(t->num_bytes, expected.bytes.size());
      EXPECT_TRUE(std::equal(expected.bytes.begin(), expected.bytes.end(), t->data)) << t->name;
      EXPECT_TRUE(part->verify_tensor(*t).ok());
    }
  }
  // Moving a part keeps its tensors' pointers valid (the mapping does not move).
  auto part = BundlePart::open(dir / "part_2_of_3.bin");
  ASSERT_TRUE(part.ok());
  const uint8_t* before = part->find("norm")->data;
  BundlePart moved = std::move(part).value();
  EXPECT_EQ(moved.find("norm")->data, before);
  EXPECT_EQ(moved.find("norm")->view().num_bytes, 20u);
  EXPECT_EQ(moved.find("norm")->view().data, before);
  EXPECT_EQ(moved.find("missing"), nullptr);
}

TEST(BundlePart, WriterOutputMatchesTheFormatDocumentByteForByte) {
  TempDir dir("bundle_spec");
  auto a = plain_tensor("a", DType::kF32, {2, 3}, 11);
  auto b = plain_tensor("b", DType::kU8, {5}, 12);
  auto w = BundlePartWriter::create(dir / "x.bin", 1, 1);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->write_tensor(a.spec, a.bytes.data()).ok());
  ASSERT_TRUE((*w)->write_tensor(b.spec, b.bytes.data()).ok());
  ASSERT_TRUE((*w)->finish().ok());

  CraftedPart c;
  c.data = a.bytes;                 // a at 0 (file offset 128)
  c.data.resize(64, 0);             // zero padding up to the next 64-byte file offset
  c.data.insert(c.data.end(), b.bytes.begin(), b.bytes.end());  // b at 64
  c.add("a", "F32", {2, 3}, 0, 24);
  c.add("b", "U8", {5}, 64, 5);
  EXPECT_EQ(read_bytes(dir / "x.bin"), c.bytes());
}

TEST(BundlePart, WriterDestroyedBeforeFinishLeavesNoFile) {
  TempDir dir("bundle_killed");
  const fs::path path = dir / "part_1_of_1.bin";
  {
    auto w = BundlePartWriter::create(path, 1, 1);
    ASSERT_TRUE(w.ok());
    auto t = plain_tensor("w", DType::kF32, {1000}, 1);
    ASSERT_TRUE((*w)->begin_tensor(t.spec).ok());
    ASSERT_TRUE((*w)->write(t.bytes.data(), 100).ok());
    EXPECT_TRUE(fs::exists((*w)->temp_path()));
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_TRUE(fs::is_empty(dir.path())) << "the temporary file was left behind";
}

TEST(BundlePart, WriterRefusesMisuseAndAbandonsThePart) {
  TempDir dir("bundle_misuse");
  const fs::path path = dir / "part_1_of_1.bin";
  {
    auto w = BundlePartWriter::create(path, 1, 1);
    ASSERT_TRUE(w.ok());
    auto t = plain_tensor("w", DType::kF32, {4}, 1);
    ASSERT_TRUE((*w)->begin_tensor(t.spec).ok());
    std::vector<uint8_t> too_many(17);
    Status s = (*w)->write(too_many.data(), too_many.size());
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("declared 16"), std::string::npos) << s.message();
    EXPECT_FALSE((*w)->finish().ok());  // abandoned after an error
  }
  EXPECT_FALSE(fs::exists(path));

  auto w = BundlePartWriter::create(path, 1, 1);
  ASSERT_TRUE(w.ok());
  BundleTensorSpec bad = BundleTensorSpec::plain("x", DType::kBF16, {3, 5});
  bad.num_bytes = 28;
  Status s = (*w)->begin_tensor(bad);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs 30 bytes"), std::string::npos) << s.message();

  auto w2 = BundlePartWriter::create(dir / "other.bin", 1, 1);
  ASSERT_TRUE(w2.ok());
  auto t = plain_tensor("t", DType::kU8, {8}, 1);
  ASSERT_TRUE((*w2)->write_tensor(t.spec, t.bytes.data()).ok());
  EXPECT_NE((*w2)->write_tensor(t.spec, t.bytes.data()).message().find("written twice"), std::string::npos);

  auto w3 = BundlePartWriter::create(dir / "third.bin", 1, 1);
  ASSERT_TRUE(w3.ok());
  ASSERT_TRUE((*w3)->begin_tensor(t.spec).ok());
  ASSERT_TRUE((*w3)->write(t.bytes.data(), 3).ok());
  Status early = (*w3)->finish();
  EXPECT_NE(early.message().find("incomplete (3 of 8 bytes)"), std::string::npos) << early.message();

  EXPECT_FALSE(BundlePartWriter::create(dir / "part_2_of_3.bin", 1, 3).ok());  // name and index disagree
  EXPECT_FALSE(BundlePartWriter::create(dir / "p.bin", 4, 3).ok());
  EXPECT_FALSE(BundlePartWriter::create(dir / "no_such_dir" / "p.bin", 1, 1).ok());
}

class BundleCorruptPartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("bundle_corrupt");
    path_ = dir_->path() / "part_1_of_2.bin";
    tensors_ = {plain_tensor("first", DType::kF32, {3, 3}, 1), plain_tensor("second", DType::kBF16, {100}, 2)};
    ASSERT_TRUE(write_part(path_, 1, 2, tensors_).ok());
    auto part = BundlePart::open(path_);
    ASSERT_TRUE(part.ok()) << part.status().to_string();
    second_offset_ = part->data_offset() + part->find("second")->offset;
    file_ = read_bytes(path_);
  }
  Status open(BundleVerify verify = BundleVerify::kFull) { return BundlePart::open(path_, verify).status(); }

  std::unique_ptr<TempDir> dir_;
  fs::path path_;
  std::vector<TestTensor> tensors_;
  uint64_t second_offset_ = 0;
  std::vector<uint8_t> file_;
};

TEST_F(BundleCorruptPartTest, FlippedDataByteFailsNamingThePartTheChecksumAndTheTensor) {
  flip_byte(path_, second_offset_ + 17);
  Status s = open();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("part_1_of_2.bin"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("data checksum mismatch: header says 0x"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("computed 0x"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("tensor 'second' fails its own checksum"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("'first'"), std::string::npos) << s.message();
  // The structure is intact: a header-only open works, and the tensor check pins the damage.
  auto part = BundlePart::open(path_, BundleVerify::kHeaderOnly);
  ASSERT_TRUE(part.ok()) << part.status().to_string();
  EXPECT_TRUE(part->verify_tensor(*part->find("first")).ok());
  EXPECT_FALSE(part->verify_tensor(*part->find("second")).ok());
}

TEST_F(BundleCorruptPartTest, FlippedPaddingByteIsCaughtByTheDataChecksum) {
  flip_byte(path_, 128 + 36 + 5);  // after 'first' (36 bytes), before 'second' at 64
  Status s = open();
  EXPECT_NE(s.message().find("data checksum mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("padding"), std::string::npos) << s.message();
}

TEST_F(BundleCorruptPartTest, FlippedTableOrHeaderByteFailsTheHeaderChecksum) {
  flip_byte(path_, file_.size() - 20);  // inside the table
  Status s = open(BundleVerify::kHeaderOnly);
  EXPECT_NE(s.message().find("part_1_of_2.bin: header checksum mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("header or the tensor table is corrupted"), std::string::npos) << s.message();

  write_bytes(path_, file_);
  flip_byte(path_, 20);  // part count
  s = open(BundleVerify::kHeaderOnly);
  EXPECT_NE(s.message().find("header checksum mismatch"), std::string::npos) << s.message();

  write_bytes(path_, file_);
  flip_byte(path_, 80);  // the data checksum itself
  s = open(BundleVerify::kHeaderOnly);
  EXPECT_NE(s.message().find("header checksum mismatch"), std::string::npos) << s.message();

  write_bytes(path_, file_);
  flip_byte(path_, 2);  // magic
  s = open();
  EXPECT_NE(s.message().find("not a petrel bundle part: magic"), std::string::npos) << s.message();
}

TEST_F(BundleCorruptPartTest, TruncatedOrExtendedPartIsRejected) {
  std::vector<uint8_t> cut(file_.begin(), file_.end() - 10);
  write_bytes(path_, cut);
  Status s = open();
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();

  write_bytes(path_, std::vector<uint8_t>(file_.begin(), file_.begin() + 50));
  s = open();
  EXPECT_NE(s.message().find("too short"), std::string::npos) << s.message();

  std::vector<uint8_t> longer = file_;
  longer.push_back(0);
  write_bytes(path_, longer);
  s = open();
  EXPECT_NE(s.message().find("the file has " + std::to_string(longer.size())), std::string::npos) << s.message();
}

TEST_F(BundleCorruptPartTest, RenamedPartDisagreesWithItsName) {
  fs::rename(path_, dir_->path() / "part_2_of_2.bin");
  Status s = BundlePart::open(dir_->path() / "part_2_of_2.bin").status();
  EXPECT_NE(s.message().find("the header says part 1 of 2, but the file name says part 2 of 2"), std::string::npos)
      << s.message();
}

// Hand-made parts with valid checksums: the structural checks must catch what the checksums cannot.
TEST(BundlePart, HandMadePartWithTheDocumentedLayoutOpens) {
  TempDir dir("bundle_crafted_ok");
  CraftedPart c;
  c.data = pattern(200, 1);
  c.add("x", "BF16", {4, 4}, 0, 32);
  c.add("y", "U8", {7}, 64, 7, "my-packing");
  c.add("z", "F32", {2}, 128, 8);
  write_bytes(dir / "p.bin", c.bytes());
  auto part = BundlePart::open(dir / "p.bin");
  ASSERT_TRUE(part.ok()) << part.status().to_string();
  EXPECT_EQ(part->tensors().size(), 3u);
}

Status open_crafted(const TempDir& dir, const CraftedPart& c, const std::string& table = "") {
  write_bytes(dir / "p.bin", c.bytes(table));
  return BundlePart::open(dir / "p.bin").status();
}

TEST(BundlePart, RejectsTensorOutsideTheDataRegion) {
  TempDir dir("bundle_crafted_outside");
  CraftedPart c;
  c.data = pattern(128, 1);
  c.add("x", "U8", {100}, 64, 100);
  Status s = open_crafted(dir, c);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidData);
  EXPECT_NE(s.message().find("tensor 'x': bytes [64, 64 + 100) lie outside the data region of 128 bytes"),
            std::string::npos)
      << s.message();
}

TEST(BundlePart, RejectsOverlappingTensors) {
  TempDir dir("bundle_crafted_overlap");
  CraftedPart c;
  c.data = pattern(256, 1);
  c.add("a", "F32", {32}, 0, 128);
  c.add("b", "U8", {64}, 64, 64);
  Status s = open_crafted(dir, c);
  EXPECT_NE(s.message().find("tensors 'a' [0, 128) and 'b' [64, 128) overlap"), std::string::npos) << s.message();
}

TEST(BundlePart, RejectsMisalignedTensor) {
  TempDir dir("bundle_crafted_misaligned");
  CraftedPart c;
  c.data = pattern(256, 1);
  c.add("a", "U8", {10}, 0, 10);
  c.add("b", "U8", {10}, 72, 10);
  Status s = open_crafted(dir, c);
  EXPECT_NE(s.message().find("tensor 'b': starts at file offset 200, not a multiple of 64"), std::string::npos)
      << s.message();
}

TEST(BundlePart, RejectsPlainSizeThatDisagreesWithDtypeAndShape) {
  TempDir dir("bundle_crafted_size");
  CraftedPart c;
  c.data = pattern(64, 1);
  c.add("a", "BF16", {3, 3}, 0, 16);
  Status s = open_crafted(dir, c);
  EXPECT_NE(s.message().find("tensor 'a': 16 bytes stored, but plain BF16 [3, 3] needs 18"), std::string::npos)
      << s.message();
  // A packed layout keeps the size the writer declared.
  CraftedPart packed;
  packed.data = pattern(64, 1);
  packed.add("a", "BF16", {3, 3}, 0, 16, "backend-packed");
  EXPECT_TRUE(open_crafted(dir, packed).ok());
}

TEST(BundlePart, RejectsMalformedTables) {
  TempDir dir("bundle_crafted_table");
  CraftedPart c;
  c.data = pattern(64, 1);
  EXPECT_NE(open_crafted(dir, c, "{not json").message().find("tensor table is not a JSON object"), std::string::npos);
  EXPECT_NE(open_crafted(dir, c, R"({"x": 1})").message().find("no 'tensors' array"), std::string::npos);
  c.tensor_count = 1;
  Status s = open_crafted(dir, c, R"({"tensors":[{"name":"a","dtype":"Q4","shape":[2],"layout":"plain",)"
                                  R"("offset":0,"size":1,"xxh3":"0000000000000000"}]})");
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("tensor 'a': dtype 'Q4'"), std::string::npos) << s.message();
  s = open_crafted(dir, c, R"({"tensors":[{"name":"a","dtype":"U8","shape":[-2],"layout":"plain",)"
                           R"("offset":0,"size":1,"xxh3":"0000000000000000"}]})");
  EXPECT_NE(s.message().find("negative dimension"), std::string::npos) << s.message();
  s = open_crafted(dir, c, R"({"tensors":[{"name":"a","dtype":"U8","shape":[1],"layout":"plain",)"
                           R"("offset":0,"size":1,"xxh3":"xyz"}]})");
  EXPECT_NE(s.message().find("'xxh3' must be 16 hexadecimal digits"), std::string::npos) << s.message();

  CraftedPart counted;
  counted.data = pattern(64, 1);
  counted.add("a", "U8", {4}, 0, 4);
  counted.tensor_count = 2;
  EXPECT_NE(open_crafted(dir, counted).message().find("header counts 2 tensors, the table lists 1"), std::string::npos);

  CraftedPart dup;
  dup.data = pattern(128, 1);
  dup.add("a", "U8", {4}, 0, 4);
  dup.add("a", "U8", {4}, 64, 4);
  EXPECT_NE(open_crafted(dir, dup).message().find("tensor 'a' is listed twice"), std::string::npos);
}

TEST(BundlePart, RejectsImpossibleHeaderFields) {
  TempDir dir("bundle_crafted_header");
  CraftedPart c;
  c.data = pattern(64, 1);
  c.part_index = 3;
  c.part_count = 2;
  EXPECT_NE(open_crafted(dir, c).message().find("part 3 of 2, which is impossible"), std::string::npos);
  CraftedPart unaligned;
  unaligned.data_offset = 130;
  EXPECT_NE(open_crafted(dir, unaligned).message().find("data region [130"), std::string::npos);
  CraftedPart version;
  std::vector<uint8_t> bytes = version.bytes();
  put32(bytes, 8, 2);
  write_bytes(dir / "p.bin", bytes);
  Status s = BundlePart::open(dir / "p.bin").status();
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("part format version 2"), std::string::npos) << s.message();
}

// ---- Config ----------------------------------------------------------------------------------------------

BundleConfig llama31_8b_config(int parts) {
  BundleConfig c;
  c.context.size = 4096;
  c.context.n_vocab = 128256;
  c.context.bos_token = 128000;
  c.context.eos_tokens = {128001, 128008, 128009};
  c.sampler.seed = 42;
  c.sampler.temp = 0.8;
  c.sampler.top_k = 40;
  c.sampler.top_p = 0.95;
  c.n_threads = 3;
  c.backend = BundleBackend::kCpu;
  for (int k = 1; k <= parts; ++k) c.ctx_bins.push_back(bundle_part_file_name(k, parts));
  c.rope_dim = 64;
  c.rope.theta = 500000.0;
  c.rope.scaling = RopeScalingType::kLlama3;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position_embeddings = 8192;
  c.tokenizer_config_path = "tokenizer_config.json";
  c.architecture = {"llama", 4096, 32, 32, 8, 128, 14336, 128256, 1e-5, false};
  return c;
}

// Writes `j` as DIR/config.json and loads it.
Status load_json(const TempDir& dir, const json& j) {
  std::ofstream(dir / "config.json") << j.dump(2);
  return load_bundle_config(dir.path()).status();
}

json config_json(int parts = 2) { return json::parse(bundle_config_to_json(llama31_8b_config(parts)).dump()); }

TEST(BundleConfig, RoundTripsThroughConfigJsonWithGenieKeys) {
  TempDir dir("bundle_config_rt");
  BundleConfig c = llama31_8b_config(5);
  c.stop_sequence = {"<|eot_id|>"};
  c.max_num_tokens = 512;
  c.sampler.greedy = false;
  c.sampler.token_penalty = BundleTokenPenalty{1.1, 0.5, 0.25, 32};
  c.backend_options = {{"kv-layout", "head-major"}};
  Status w = write_bundle_config(c, dir.path());
  ASSERT_TRUE(w.ok()) << w.to_string();

  json j = json::parse(*read_text_file(dir / "config.json"));
  EXPECT_EQ(j["dialog"]["context"]["n-vocab"], 128256);
  EXPECT_EQ(j["dialog"]["context"]["eos-token"], json({128001, 128008, 128009}));
  EXPECT_EQ(j["dialog"]["sampler"]["top-k"], 40);
  EXPECT_EQ(j["dialog"]["tokenizer"]["path"], "tokenizer.json");
  EXPECT_EQ(j["dialog"]["engine"]["backend"]["type"], "petrel-cpu");
  EXPECT_EQ(j["dialog"]["engine"]["model"]["binary"]["ctx-bins"][4], "part_5_of_5.bin");
  const json& pe = j["dialog"]["engine"]["model"]["positional-encoding"];
  EXPECT_EQ(pe["rope-dim"], 64);
  EXPECT_EQ(pe["rope-scaling"]["rope-type"], "llama3");
  EXPECT_EQ(pe["rope-scaling"]["original-max-position-embeddings"], 8192);
  EXPECT_EQ(j["petrel"]["architecture"]["n-kv-heads"], 8);

  for (const fs::path& where : {dir.path(), dir / "config.json"}) {
    auto r = load_bundle_config(where);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->bundle_dir, dir.path());
    EXPECT_EQ(r->context.size, 4096);
    EXPECT_EQ(r->context.bos_token, 128000);
    EXPECT_EQ(r->context.eos_tokens, c.context.eos_tokens);
    EXPECT_EQ(r->sampler.seed, 42u);
    EXPECT_DOUBLE_EQ(r->sampler.temp, 0.8);
    EXPECT_EQ(r->sampler.top_k, 40);
    EXPECT_DOUBLE_EQ(r->sampler.top_p, 0.95);
    EXPECT_EQ(r->sampler.greedy, false);
    ASSERT_TRUE(r->sampler.token_penalty);
    EXPECT_DOUBLE_EQ(r->sampler.token_penalty->repetition_penalty, 1.1);
    EXPECT_EQ(r->sampler.token_penalty->penalize_last_n, 32);
    EXPECT_EQ(r->stop_sequence, c.stop_sequence);
    EXPECT_EQ(r->max_num_tokens, 512);
    EXPECT_EQ(r->n_threads, 3);
    EXPECT_EQ(r->backend, BundleBackend::kCpu);
    EXPECT_EQ(r->backend_options, c.backend_options);
    EXPECT_EQ(r->ctx_bins, c.ctx_bins);
    EXPECT_EQ(r->rope_dim, 64);
    EXPECT_DOUBLE_EQ(r->rope.theta, 500000.0);
    EXPECT_EQ(r->rope.scaling, RopeScalingType::kLlama3);
    EXPECT_DOUBLE_EQ(r->rope.factor, 8.0);
    EXPECT_DOUBLE_EQ(r->rope.high_freq_factor, 4.0);
    EXPECT_EQ(r->rope.original_max_position_embeddings, 8192);
    EXPECT_EQ(r->manifest_path, "manifest.json");
    EXPECT_EQ(r->tokenizer_config_path, "tokenizer_config.json");
    EXPECT_EQ(r->architecture.hidden_size, 4096);
    EXPECT_EQ(r->architecture.ffn_size, 14336);
    EXPECT_DOUBLE_EQ(r->architecture.rms_norm_eps, 1e-5);
    EXPECT_EQ(r->ctx_bin_path(1), dir / "part_2_of_5.bin");
  }
  // Unset seed is written as Genie's -1 and read back as unset.
  c.sampler.seed.reset();
  ASSERT_TRUE(write_bundle_config(c, dir.path()).ok());
  EXPECT_EQ(json::parse(*read_text_file(dir / "config.json"))["dialog"]["sampler"]["seed"], -1);
  EXPECT_FALSE(load_bundle_config(dir.path())->sampler.seed);
}

TEST(BundleConfig, RejectsPathsThatLeaveTheBundle) {
  TempDir dir("bundle_config_paths");
  fs::create_directories(dir / "bundle");
  fs::create_directories(dir / "outside");
  std::ofstream(dir / "outside" / "secret.bin") << "x";
  TempDir& d = dir;
  auto load_with = [&](const std::function<void(json&)>& edit) {
    json j = config_json();
    edit(j);
    std::ofstream(d / "bundle" / "config.json") << j.dump(2);
    return load_bundle_config(d / "bundle").status();
  };
  auto bins = [](json& j) -> json& { return j["dialog"]["engine"]["model"]["binary"]["ctx-bins"]; };

  Status s = load_with([&](json& j) { bins(j)[0] = "../x.bin"; });
  EXPECT_NE(s.message().find("dialog.engine.model.binary.ctx-bins[0] '../x.bin' contains '..'"), std::string::npos)
      << s.message();
  s = load_with([&](json& j) { bins(j)[1] = "sub/../../x.bin"; });
  EXPECT_NE(s.message().find("ctx-bins[1] 'sub/../../x.bin'"), std::string::npos) << s.message();
  s = load_with([](json& j) { j["dialog"]["tokenizer"]["path"] = "/etc/passwd"; });
  EXPECT_NE(s.message().find("dialog.tokenizer.path '/etc/passwd' is an absolute path"), std::string::npos)
      << s.message();
  s = load_with([](json& j) { j["petrel"]["manifest"] = ""; });
  EXPECT_NE(s.message().find("petrel.manifest is an empty path"), std::string::npos) << s.message();

  fs::create_symlink(dir / "outside" / "secret.bin", dir / "bundle" / "link.bin");
  s = load_with([&](json& j) { bins(j) = {"link.bin"}; });
  EXPECT_NE(s.message().find("ctx-bins[0] 'link.bin' resolves to"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("outside the bundle directory"), std::string::npos) << s.message();

  fs::create_directory_symlink(dir / "outside", dir / "bundle" / "tok");
  s = load_with([](json& j) { j["dialog"]["tokenizer"]["path"] = "tok/tokenizer.json"; });
  EXPECT_NE(s.message().find("dialog.tokenizer.path 'tok/tokenizer.json' resolves to"), std::string::npos)
      << s.message();

  fs::create_symlink(dir / "nowhere" / "gone.json", dir / "bundle" / "dangling.json");
  s = load_with([](json& j) { j["petrel"]["manifest"] = "dangling.json"; });
  EXPECT_NE(s.message().find("petrel.manifest 'dangling.json'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("dangling symbolic link"), std::string::npos) << s.message();

  // A link that stays inside the bundle, and a subdirectory, are fine.
  fs::create_directories(dir / "bundle" / "weights");
  std::ofstream(dir / "bundle" / "weights" / "real.bin") << "x";
  fs::create_symlink("weights/real.bin", dir / "bundle" / "inside.bin");
  s = load_with([&](json& j) { bins(j) = {"inside.bin", "weights/./other.bin"}; });
  EXPECT_TRUE(s.ok()) << s.to_string();

  // The writer refuses them too.
  BundleConfig c = llama31_8b_config(2);
  c.ctx_bins[0] = "../part_1_of_2.bin";
  Status w = write_bundle_config(c, dir / "bundle");
  EXPECT_NE(w.message().find("'../part_1_of_2.bin'"), std::string::npos) << w.message();
}

TEST(BundleConfig, RejectsBadKeysWithTheirPath) {
  TempDir dir("bundle_config_keys");
  auto expect_error = [&](const std::function<void(json&)>& edit, const std::string& needle) {
    json j = config_json();
    edit(j);
    Status s = load_json(dir, j);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  expect_error([](json& j) { j["dialog"]["sampler"]["top_k"] = 5; }, "dialog.sampler.top_k is not a known key");
  expect_error([](json& j) { j["dialog"]["sampler"]["top-k"] = -3; }, "dialog.sampler.top-k must be an integer >= 0, found -3");
  expect_error([](json& j) { j["dialog"]["sampler"]["top-p"] = 1.5; }, "dialog.sampler.top-p must be in (0, 1]");
  expect_error([](json& j) { j["dialog"]["context"]["size"] = 0; }, "dialog.context.size must be an integer >= 1, found 0");
  expect_error([](json& j) { j["dialog"]["context"].erase("n-vocab"); }, "missing required key dialog.context.n-vocab");
  expect_error([](json& j) { j["dialog"]["context"]["eos-token"] = {128001, 999999}; }, "eos-token 999999 is outside n-vocab");
  expect_error([](json& j) { j["dialog"]["context"]["version"] = 2; }, "dialog.context.version is 2");
  expect_error([](json& j) { j["dialog"]["engine"]["backend"]["type"] = "QnnHtp"; }, "'QnnHtp' is not a petrel backend");
  expect_error([](json& j) { j["dialog"]["engine"]["model"]["positional-encoding"]["rope-dim"] = 128; },
               "rope-dim is 128, expected head-dim / 2 = 64");
  expect_error([](json& j) { j["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"].erase("factor"); },
               "missing required key dialog.engine.model.positional-encoding.rope-scaling.factor");
  expect_error([](json& j) { j["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = json::array(); },
               "ctx-bins must be a non-empty list");
  expect_error([](json& j) { j["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = {"part_2_of_2.bin", "part_1_of_2.bin"}; },
               "ctx-bins[0] is 'part_2_of_2.bin', but position 1 of 2 must hold part 1 of 2");
  expect_error([](json& j) { j["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = {"part_1_of_3.bin", "part_2_of_3.bin"}; },
               "position 1 of 2 must hold part 1 of 2");
  expect_error([](json& j) { j["petrel"]["version"] = 7; }, "petrel.version is 7");
  expect_error([](json& j) { j["petrel"]["architecture"]["vocab-size"] = 32000; }, "n-vocab is 128256, but petrel.architecture.vocab-size is 32000");
  expect_error([](json& j) { j.erase("petrel"); }, "missing required key petrel");

  std::ofstream(dir / "config.json") << "{\"dialog\": ";
  EXPECT_NE(load_bundle_config(dir.path()).status().message().find("not valid JSON"), std::string::npos);
  EXPECT_EQ(load_bundle_config(dir / "nope").status().code(), ErrorCode::kNotFound);
}

TEST(BundleConfig, WriterRefusesAConfigTheReaderWouldReject) {
  TempDir dir("bundle_config_write");
  BundleConfig c = llama31_8b_config(2);
  c.context.size = 0;  // the "zero buffer size written into the config" failure
  Status s = write_bundle_config(c, dir.path());
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dialog.context.size must be an integer >= 1, found 0"), std::string::npos) << s.message();
  EXPECT_FALSE(fs::exists(dir / "config.json"));
}

// ---- Whole bundles ---------------------------------------------------------------------------------------

// A 3-part bundle with config.json; returns the tensors of each part.
std::vector<std::vector<TestTensor>> make_bundle(const fs::path& dir) {
  std::vector<std::vector<TestTensor>> parts = {
      {plain_tensor("embed", DType::kBF16, {33, 8}, 1)},
      {plain_tensor("layers.0.norm", DType::kF32, {8}, 2), packed_tensor("layers.0.wq", {8, 8}, 37, 3)},
      {plain_tensor("norm", DType::kF32, {8}, 4), plain_tensor("lm_head", DType::kBF16, {33, 8}, 5)},
  };
  for (size_t p = 0; p < parts.size(); ++p) {
    EXPECT_TRUE(write_part(dir / bundle_part_file_name(p + 1, 3), p + 1, 3, parts[p]).ok());
  }
  BundleConfig c = llama31_8b_config(3);
  EXPECT_TRUE(write_bundle_config(c, dir).ok());
  return parts;
}

TEST(BundleTest, OpensAWholeBundleAndFindsTensorsInAnyPart) {
  TempDir dir("bundle_open");
  auto parts = make_bundle(dir.path());
  for (const fs::path& where : {dir.path(), dir / "config.json"}) {
    auto bundle = Bundle::open(where);
    ASSERT_TRUE(bundle.ok()) << bundle.status().to_string();
    EXPECT_EQ(bundle->parts().size(), 3u);
    EXPECT_EQ(bundle->tensor_names().size(), 5u);
    const BundleTensor* head = bundle->find("lm_head");
    ASSERT_NE(head, nullptr);
    EXPECT_TRUE(std::equal(parts[2][1].bytes.begin(), parts[2][1].bytes.end(), head->data));
    EXPECT_EQ(bundle->part_of("layers.0.wq")->part_index(), 2);
    EXPECT_EQ(bundle->find("layers.0.wq")->attrs["group_size"], 128);
    EXPECT_EQ(bundle->tensor("nope").status().code(), ErrorCode::kNotFound);
  }
}

TEST(BundleTest, RejectsPartsThatDisagreeWithTheirPositionInTheConfig) {
  TempDir dir("bundle_positions");
  auto a = plain_tensor("a", DType::kU8, {4}, 1);
  auto b = plain_tensor("b", DType::kU8, {4}, 2);
  ASSERT_TRUE(write_part(dir / "first.bin", 2, 2, {a}).ok());
  ASSERT_TRUE(write_part(dir / "second.bin", 1, 2, {b}).ok());
  BundleConfig c = llama31_8b_config(2);
  c.ctx_bins = {"first.bin", "second.bin"};
  ASSERT_TRUE(write_bundle_config(c, dir.path()).ok());
  Status s = Bundle::open(dir.path()).status();
  EXPECT_NE(s.message().find("ctx-bins[0] 'first.bin' holds part 2 of 2 (its header says so), expected part 1 of 2"),
            std::string::npos)
      << s.message();

  // Parts of a 3-part export listed as a 2-part bundle.
  ASSERT_TRUE(write_part(dir / "first.bin", 1, 3, {a}).ok());
  ASSERT_TRUE(write_part(dir / "second.bin", 2, 3, {b}).ok());
  s = Bundle::open(dir.path()).status();
  EXPECT_NE(s.message().find("holds part 1 of 3 (its header says so), expected part 1 of 2"), std::string::npos)
      << s.message();

  // The same tensor in two parts.
  ASSERT_TRUE(write_part(dir / "first.bin", 1, 2, {a}).ok());
  ASSERT_TRUE(write_part(dir / "second.bin", 2, 2, {a}).ok());
  s = Bundle::open(dir.path()).status();
  EXPECT_NE(s.message().find("tensor 'a' is stored in both first.bin and second.bin"), std::string::npos) << s.message();
}

TEST(BundleTest, CorruptedPartFailsTheOpenNamingThePartAndTheChecksum) {
  TempDir dir("bundle_open_corrupt");
  make_bundle(dir.path());
  auto part = BundlePart::open(dir / "part_3_of_3.bin");
  ASSERT_TRUE(part.ok());
  const uint64_t at = part->data_offset() + part->find("lm_head")->offset + 100;
  part = BundlePart::open(dir / "part_1_of_3.bin");  // unmap before rewriting
  flip_byte(dir / "part_3_of_3.bin", at);
  Status s = Bundle::open(dir.path()).status();
  EXPECT_NE(s.message().find("part_3_of_3.bin: data checksum mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'lm_head'"), std::string::npos) << s.message();
  EXPECT_TRUE(Bundle::open(dir.path(), BundleVerify::kHeaderOnly).ok());
}

TEST(BundleInspect, ReportsEveryPartWithoutStoppingAtTheFirstBadOne) {
  TempDir dir("bundle_inspect");
  make_bundle(dir.path());
  auto clean = inspect_bundle(dir.path());
  ASSERT_TRUE(clean.ok()) << clean.status().to_string();
  EXPECT_TRUE(clean->ok()) << (clean->problems.empty() ? "" : clean->problems[0]);
  ASSERT_EQ(clean->parts.size(), 3u);
  EXPECT_EQ(clean->total_tensors(), 5u);
  for (const BundlePartSummary& p : clean->parts) EXPECT_EQ(p.checksum, ChecksumStatus::kOk) << p.name;

  // Part 1 corrupted in its data, part 2 missing, and a leftover of an interrupted export.
  flip_byte(dir / "part_1_of_3.bin", 128 + 10);
  fs::remove(dir / "part_2_of_3.bin");
  std::ofstream(dir / ".part_2_of_3.bin.tmp.123.0") << "partial";
  auto summary = inspect_bundle(dir / "config.json");
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  ASSERT_EQ(summary->parts.size(), 3u);
  EXPECT_FALSE(summary->ok());
  EXPECT_EQ(summary->parts[0].checksum, ChecksumStatus::kMismatch);
  EXPECT_NE(summary->parts[0].error.find("checksum mismatch"), std::string::npos) << summary->parts[0].error;
  EXPECT_EQ(summary->parts[0].tensor_count, 1u);
  EXPECT_FALSE(summary->parts[1].exists);
  EXPECT_NE(summary->parts[1].error.find("missing"), std::string::npos);
  EXPECT_EQ(summary->parts[2].checksum, ChecksumStatus::kOk);
  EXPECT_TRUE(summary->parts[2].ok());
  EXPECT_EQ(summary->parts[2].tensor_count, 2u);
  ASSERT_EQ(summary->problems.size(), 3u);
  EXPECT_NE(summary->problems[2].find("leftover temporary file"), std::string::npos) << summary->problems[2];

  // Header-only inspection does not read the data.
  auto quick = inspect_bundle(dir.path(), BundleVerify::kHeaderOnly);
  ASSERT_TRUE(quick.ok());
  EXPECT_EQ(quick->parts[0].checksum, ChecksumStatus::kNotChecked);
  EXPECT_TRUE(quick->parts[0].ok());
}

TEST(BundleInspect, FallsBackToThePartFilesWhenTheConfigIsBroken) {
  TempDir dir("bundle_inspect_noconfig");
  make_bundle(dir.path());
  std::ofstream(dir / "config.json") << "{";
  fs::remove(dir / "part_2_of_3.bin");
  auto summary = inspect_bundle(dir.path());
  ASSERT_TRUE(summary.ok());
  EXPECT_FALSE(summary->config);
  EXPECT_NE(summary->config_error.find("not valid JSON"), std::string::npos);
  ASSERT_EQ(summary->parts.size(), 2u);
  EXPECT_EQ(summary->parts[0].name, "part_1_of_3.bin");
  EXPECT_EQ(summary->parts[1].name, "part_3_of_3.bin");
  bool reported_missing = false;
  for (const std::string& p : summary->problems) reported_missing |= p.find("part_2_of_3.bin is missing") != std::string::npos;
  EXPECT_TRUE(reported_missing);
  EXPECT_EQ(inspect_bundle(dir / "nope").status().code(), ErrorCode::kNotFound);
}

// ---- Throughput (not a unit test; run explicitly) --------------------------------------------------------
// build/tests/petrel_tests --gtest_also_run_disabled_tests --gtest_filter='BundleBenchmark.*'
// Writes a 1 GiB part from 1 MiB spans produced on the fly, then times header-only open, the data checksum
// with the pool and with one thread, and reports the writer's peak RSS.

long peak_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

TEST(BundleBenchmark, DISABLED_ChecksumThroughput1GiB) {
  TempDir dir("bundle_bench");
  const fs::path path = dir / "part_1_of_1.bin";
  const size_t span = 1 << 20;
  const int tensors = 8;
  const size_t per_tensor = 128 * span;  // 8 x 128 MiB = 1 GiB
  std::vector<uint8_t> buffer(span);
  const long rss_before = peak_rss_kib();
  auto t0 = std::chrono::steady_clock::now();
  {
    auto w = BundlePartWriter::create(path, 1, 1);
    ASSERT_TRUE(w.ok());
    uint32_t x = 1;
    for (int t = 0; t < tensors; ++t) {
      BundleTensorSpec spec = BundleTensorSpec::plain("t" + std::to_string(t), DType::kU8, {int64_t(per_tensor)});
      ASSERT_TRUE((*w)->begin_tensor(spec).ok());
      for (size_t done = 0; done < per_tensor; done += span) {
        for (size_t i = 0; i < span; i += 4) {
          x = x * 1664525u + 1013904223u;
          std::memcpy(&buffer[i], &x, 4);
        }
        ASSERT_TRUE((*w)->write(buffer.data(), span).ok());
      }
      ASSERT_TRUE((*w)->end_tensor().ok());
    }
    ASSERT_TRUE((*w)->finish().ok());
  }
  auto t1 = std::chrono::steady_clock::now();
  const long rss_after = peak_rss_kib();
  const double gib = double(per_tensor) * tensors / double(1ull << 30);
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("write (incl. generating data, fsync): %.2f s, %.2f GiB/s; peak RSS %ld KiB before, %ld KiB after\n",
              seconds(t0, t1), gib / seconds(t0, t1), rss_before, rss_after);

  auto part = BundlePart::open(path, BundleVerify::kHeaderOnly);
  ASSERT_TRUE(part.ok()) << part.status().to_string();
  ThreadPool one(1);
  for (int round = 0; round < 3; ++round) {
    auto a = std::chrono::steady_clock::now();
    ASSERT_TRUE(part->verify_data().ok());
    auto b = std::chrono::steady_clock::now();
    ASSERT_TRUE(part->verify_data(&one).ok());
    auto c = std::chrono::steady_clock::now();
    std::printf("data checksum of %.2f GiB: %d threads %.2f GiB/s, 1 thread %.2f GiB/s\n", gib,
                ThreadPool::global().size(), gib / seconds(a, b), gib / seconds(b, c));
  }
  auto a = std::chrono::steady_clock::now();
  auto full = BundlePart::open(path, BundleVerify::kFull);
  auto b = std::chrono::steady_clock::now();
  ASSERT_TRUE(full.ok());
  std::printf("open kFull: %.3f s (%.2f GiB/s)\n", seconds(a, b), gib / seconds(a, b));
}

}  // namespace
}  // namespace petrel
