#include "petrel/text/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "petrel/text/utf8.h"

namespace petrel::text_internal {

namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes keep their code point, the other 68 bytes are
// shifted to U+0100.. in byte order, so every byte has a visible, unambiguous character.
struct ByteLevelTable {
  uint32_t code_point_of_byte[256];
  int16_t byte_of_code_point[512];  // -1 when the code point is not in the table

  ByteLevelTable() {
    std::fill(std::begin(byte_of_code_point), std::end(byte_of_code_point), int16_t{-1});
    uint32_t next_shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      code_point_of_byte[b] = printable ? b : next_shifted++;
      byte_of_code_point[code_point_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

inline uint64_t mix64(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return h;
}

inline uint64_t head_bytes(std::string_view bytes) {
  uint64_t head = 0;
  std::memcpy(&head, bytes.data(), std::min<size_t>(8, bytes.size()));
  return head;
}

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Pre-tokens longer than this go through the heap-based merge loop; shorter ones through a rescan of an
// array on the stack, which is faster for the few symbols a word has.
constexpr size_t kShortPieceLimit = 48;
// Longer pre-tokens are not cached: they rarely repeat and would crowd out words that do.
constexpr size_t kMaxCachedPieceBytes = 128;

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  const auto& table = byte_level_table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8::append_code_point(table.code_point_of_byte[static_cast<uint8_t>(c)], out);
  return out;
}

bool byte_level_to_bytes(std::string_view text, std::string& out) {
  out.clear();
  if (utf8::find_invalid(text)) return false;
  const auto& table = byte_level_table();
  size_t pos = 0;
  while (pos < text.size()) {
    const uint32_t cp = utf8::decode_valid(text, pos);
    if (cp >= 512 || table.byte_of_code_point[cp] < 0) return false;
    out.push_back(static_cast<char>(table.byte_of_code_point[cp]));
  }
  return true;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  if (!byte_level_to_bytes(text, out)) return std::nullopt;
  return out;
}

uint64_t hash_bytes(std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  h = (h ^ tail) * 0x94d049bb133111ebULL;
  return mix64(h);
}

// pre-token bytes -> ids, shared by all threads that encode with one tokenizer. Sharded so concurrent
// encoders rarely wait on the same lock; each shard is cleared when full, which bounds memory without
// the bookkeeping of an LRU (the next lookups refill it with the words that matter).
class BpeCache {
 public:
  static constexpr size_t kShards = 16;
  static constexpr size_t kEntriesPerShard = 4096;

  bool lookup(std::string_view key, uint64_t hash, std::vector<int32_t>& out) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.map.find(key);
    if (it == shard.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t count) {
    Shard& shard = shards_[hash % kShards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.map.size() >= kEntriesPerShard) shard.map.clear();
    shard.map.emplace(std::string(key), std::vector<int32_t>(ids, ids + count));
  }

 private:
  struct TransparentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return hash_bytes(s); }
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, TransparentHash, std::equal_to<>> map;
  };
  Shard shards_[kShards];
};

BpeModel::BpeModel() : cache_(std::make_unique<BpeCache>()) { std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1); }
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

bool BpeModel::add_token(int32_t id, std::string bytes) {
  if (id < 0) return false;
  const size_t index = static_cast<size_t>(id);
  if (index >= tokens_.size()) {
    tokens_.resize(index + 1);
    present_.resize(index + 1, false);
  }
  if (present_[index]) return false;
  present_[index] = true;
  tokens_[index] = std::move(bytes);
  return true;
}

std::optional<std::string> BpeModel::finish_vocab() {
  size_t count = 0;
  for (bool p : present_) count += p;
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  vocab_slots_.assign(capacity, VocabSlot{});
  vocab_mask_ = capacity - 1;
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!present_[id]) continue;
    const std::string& token = tokens_[id];
    if (find(token)) return token;
    uint64_t slot = hash_bytes(token) & vocab_mask_;
    while (vocab_slots_[slot].id >= 0) slot = (slot + 1) & vocab_mask_;
    vocab_slots_[slot] = VocabSlot{head_bytes(token), static_cast<uint32_t>(token.size()), static_cast<int32_t>(id)};
    if (token.size() == 1) byte_ids_[static_cast<uint8_t>(token[0])] = static_cast<int32_t>(id);
  }
  return std::nullopt;
}

int BpeModel::missing_byte() const {
  for (int b = 0; b < 256; ++b) {
    if (byte_ids_[b] < 0) return b;
  }
  return -1;
}

std::optional<int32_t> BpeModel::find(std::string_view bytes) const {
  if (vocab_slots_.empty()) return std::nullopt;
  const uint64_t head = head_bytes(bytes);
  const size_t length = bytes.size();
  for (uint64_t slot = hash_bytes(bytes) & vocab_mask_;; slot = (slot + 1) & vocab_mask_) {
    const VocabSlot& s = vocab_slots_[slot];
    if (s.id < 0) return std::nullopt;
    if (s.head == head && s.length == length &&
        (length <= 8 || std::memcmp(tokens_[static_cast<size_t>(s.id)].data() + 8, bytes.data() + 8, length - 8) == 0)) {
      return s.id;
    }
  }
}

void BpeModel::grow_merge_table() {
  std::vector<MergeSlot> old = std::move(merge_slots_);
  const size_t capacity = old.empty() ? 1024 : old.size() * 2;
  merge_slots_.assign(capacity, MergeSlot{});
  merge_mask_ = capacity - 1;
  for (const MergeSlot& s : old) {
    if (s.pair == kEmptyPair) continue;
    uint64_t slot = mix64(s.pair) & merge_mask_;
    while (merge_slots_[slot].pair != kEmptyPair) slot = (slot + 1) & merge_mask_;
    merge_slots_[slot] = s;
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t merged) {
  if ((merge_count_ + 1) * 2 > merge_slots_.size()) grow_merge_table();
  const uint64_t key = pair_key(left, right);
  const int32_t rank = next_rank_++;
  uint64_t slot = mix64(key) & merge_mask_;
  while (merge_slots_[slot].pair != kEmptyPair) {
    if (merge_slots_[slot].pair == key) {
      merge_slots_[slot].rank = rank;
      merge_slots_[slot].merged = merged;
      return;
    }
    slot = (slot + 1) & merge_mask_;
  }
  merge_slots_[slot] = MergeSlot{key, rank, merged};
  ++merge_count_;
}

int32_t BpeModel::merge_rank(int32_t left, int32_t right, int32_t* merged) const {
  if (merge_slots_.empty()) return kNoRank;
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix64(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& s = merge_slots_[slot];
    if (s.pair == key) {
      *merged = s.merged;
      return s.rank;
    }
    if (s.pair == kEmptyPair) return kNoRank;
  }
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  // Llama 3 sets ignore_merges: a pre-token that is a token is emitted whole, whatever the merges say.
  // It is also the most common case by far (frequent words are tokens), so it is checked before the cache.
  if (ignore_merges_) {
    if (auto id = find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  if (piece.size() > kMaxCachedPieceBytes) {
    merge_uncached(piece, out);
    return;
  }
  const uint64_t h = hash_bytes(piece);
  if (cache_->lookup(piece, h, out)) return;
  const size_t start = out.size();
  merge_uncached(piece, out);
  cache_->insert(piece, h, out.data() + start, out.size() - start);
}

void BpeModel::merge_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() <= kShortPieceLimit) {
    merge_short(piece, out);
  } else {
    merge_long(piece, out);
  }
}

// Repeatedly merges the lowest-ranked adjacent pair, leftmost first on ties, exactly as Hugging Face's
// BPE does; ranks[i] caches the rank of the pair (ids[i], ids[i+1]).
void BpeModel::merge_short(std::string_view piece, std::vector<int32_t>& out) const {
  int32_t ids[kShortPieceLimit];
  int32_t ranks[kShortPieceLimit];
  int32_t merged[kShortPieceLimit];
  size_t count = piece.size();
  for (size_t i = 0; i < count; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  for (size_t i = 0; i + 1 < count; ++i) ranks[i] = merge_rank(ids[i], ids[i + 1], &merged[i]);
  while (count > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoRank) break;
    ids[best] = merged[best];
    // Remove symbol best+1 and the pair that started at it.
    std::memmove(&ids[best + 1], &ids[best + 2], (count - best - 2) * sizeof(int32_t));
    if (best + 2 < count) {
      std::memmove(&ranks[best + 1], &ranks[best + 2], (count - best - 3) * sizeof(int32_t));
      std::memmove(&merged[best + 1], &merged[best + 2], (count - best - 3) * sizeof(int32_t));
    }
    --count;
    if (best + 1 < count) ranks[best] = merge_rank(ids[best], ids[best + 1], &merged[best]);
    if (best > 0) ranks[best - 1] = merge_rank(ids[best - 1], ids[best], &merged[best - 1]);
  }
  out.insert(out.end(), ids, ids + count);
}

// The same merges for long pre-tokens (a CJK sentence, a run of symbols): a doubly linked list of symbols
// and a min-heap of candidate pairs, so the work is O(n log n) instead of O(n^2).
void BpeModel::merge_long(std::string_view piece, std::vector<int32_t>& out) const {
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::vector<int32_t> prev(static_cast<size_t>(n));
  std::vector<int32_t> next(static_cast<size_t>(n));
  std::vector<bool> alive(static_cast<size_t>(n), true);
  for (int32_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = byte_ids_[static_cast<uint8_t>(piece[static_cast<size_t>(i)])];
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int32_t pos;  // the left symbol
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> storage;
  storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(std::greater<>(), std::move(storage));
  const auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    int32_t merged = 0;
    const int32_t rank = merge_rank(ids[static_cast<size_t>(left)], ids[static_cast<size_t>(right)], &merged);
    if (rank != kNoRank) heap.push({rank, left, ids[static_cast<size_t>(left)], ids[static_cast<size_t>(right)], merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const size_t left = static_cast<size_t>(c.pos);
    if (!alive[left] || ids[left] != c.left_id) continue;  // stale: the symbol changed since
    const int32_t right_pos = next[left];
    if (right_pos < 0 || ids[static_cast<size_t>(right_pos)] != c.right_id) continue;
    const size_t right = static_cast<size_t>(right_pos);
    ids[left] = c.merged;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = c.pos;
    push_pair(prev[left]);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) out.push_back(ids[static_cast<size_t>(i)]);
}

}  // namespace petrel::text_internal
