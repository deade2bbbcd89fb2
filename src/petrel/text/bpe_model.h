// The byte-level BPE model: a vocabulary of byte strings, ranked merges, and the merge loop that turns one
// pre-token into ids. Internal to the text module; petrel/text/tokenizer.h is the public interface.
//
// Tokens are stored as the raw bytes they stand for, not in GPT-2's byte-to-unicode spelling ("Ġthe"), so
// encoding never converts the input and decoding is a concatenation.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace petrel::text_internal {

// GPT-2's reversible byte <-> printable code point table used by tokenizer.json byte-level vocabularies.
std::string bytes_to_byte_level(std::string_view bytes);
// nullopt when `text` has a character outside the table (so it is not a byte-level token).
std::optional<std::string> byte_level_to_bytes(std::string_view text);
// The same into `out` (replacing its contents; its capacity is reused); false, `out` unspecified, when `text`
// is not byte-level.
bool byte_level_to_bytes(std::string_view text, std::string& out);

uint64_t hash_bytes(std::string_view bytes);

class BpeCache;

class BpeModel {
 public:
  BpeModel();
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Building, in this order: tokens, finish_vocab, merges. The tokenizer.json reader reports the errors,
  // since it knows the JSON paths. add_token returns false when the id is negative or already taken.
  bool add_token(int32_t id, std::string bytes);
  // Builds the lookup table. Returns the bytes of a token that appears twice, if any.
  std::optional<std::string> finish_vocab();
  // Merges are ranked by the order they are added; a pair added again takes the later rank (as Hugging
  // Face's HashMap construction does).
  void add_merge(int32_t left, int32_t right, int32_t merged);
  void set_ignore_merges(bool ignore) { ignore_merges_ = ignore; }
  // The byte (0..255) that has no single-byte token, or -1 when all 256 are present.
  int missing_byte() const;

  // Appends the ids of one pre-token (raw bytes, non-empty).
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> find(std::string_view bytes) const;
  bool has_token(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < present_.size() && present_[static_cast<size_t>(id)];
  }
  std::string_view token_bytes(int32_t id) const { return tokens_[static_cast<size_t>(id)]; }
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }
  size_t merge_count() const { return merge_count_; }

 private:
  struct MergeSlot {
    uint64_t pair = kEmptyPair;  // left << 32 | right
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmptyPair = ~0ULL;
  static constexpr int32_t kNoRank = INT32_MAX;

  // Returns kNoRank when the pair does not merge.
  int32_t merge_rank(int32_t left, int32_t right, int32_t* merged) const;
  void grow_merge_table();
  void merge_short(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_long(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_uncached(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // by id; raw bytes
  std::vector<bool> present_;
  // Open addressing, linear probing. Each slot carries the token's first 8 bytes and its length, so a
  // lookup of a short token (most of them) touches one cache line and never the string itself.
  struct VocabSlot {
    uint64_t head = 0;  // the first min(8, length) bytes, zero padded
    uint32_t length = 0;
    int32_t id = -1;    // -1: empty
  };
  std::vector<VocabSlot> vocab_slots_;
  uint64_t vocab_mask_ = 0;
  std::vector<MergeSlot> merge_slots_;
  uint64_t merge_mask_ = 0;
  size_t merge_count_ = 0;
  int32_t next_rank_ = 0;
  int32_t byte_ids_[256];
  bool ignore_merges_ = false;
  std::unique_ptr<BpeCache> cache_;
};

}  // namespace petrel::text_internal
