// The token mask that JSON mode, forced tool calls and schemas share (json_constraint.h, json_schema.h): a
// template over their byte automata, which offer feed(byte) (state unchanged on failure), feed(bytes),
// complete() and in_plain_string().
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "petrel/runtime/json_constraint.h"
#include "petrel/util/parallel.h"

namespace petrel::detail {


inline constexpr float kNever = -std::numeric_limits<float>::infinity();

// Marks in allowed[id] the tokens that `state` (JsonPrefix, SchemaPrefix or CallShape) can take next (1) or not
// (0); false when none can. The token table's groups by first two bytes are walked (inside a plain string, only
// those of the tokens that are not plain: the plain ones all pass, copied from the table's mask); a pair the
// state refuses skips its group whole, so the work follows the tokens allowed rather than the vocabulary (a
// token that passes is stepped through from the state after its second byte). Needs no logits, so a decoding
// loop can run it while the GPU computes them (LogitConstraint::prepare).
template <typename Automaton>
bool allowed_tokens(const Automaton& state, const JsonTokenTable& table, std::vector<uint8_t>& allowed) {
  const int32_t n = table.size();
  if (state.complete()) {
    allowed.assign(static_cast<size_t>(n), 0);
    return false;
  }
  const bool plain = state.in_plain_string();
  std::array<bool, 256> first_ok;
  std::array<Automaton, 256> after_first;
  // Stepped by feed(bytes), which does not keep a copy to restore (a refused byte's state is not used again).
  for (int c = 0; c < 256; ++c) {
    const char byte = static_cast<char>(c);
    after_first[static_cast<size_t>(c)] = state;
    first_ok[static_cast<size_t>(c)] = after_first[static_cast<size_t>(c)].feed(std::string_view(&byte, 1));
  }
  // Inside a plain string every plain token passes: the table's mask of them, then the other tokens judged.
  if (plain) {
    allowed = table.plain_mask();
  } else {
    allowed.assign(static_cast<size_t>(n), 0);
  }
  std::atomic<bool> any_allowed{plain && table.any_plain()};
  // By the tokens' first two bytes: a group whose pair the state refuses is skipped whole.
  const auto& groups = plain ? table.other_groups() : table.groups();
  const auto& ids = plain ? table.other_by_bytes() : table.by_bytes();
  ThreadPool::global().parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t begin, int64_t end) {
    bool any = false;
    for (int64_t g = begin; g < end; ++g) {
      const JsonTokenTable::Group& group = groups[static_cast<size_t>(g)];
      if (!first_ok[group.first]) continue;
      if (group.second < 0) {  // one-byte tokens
        for (uint32_t i = group.begin; i < group.end; ++i) allowed[static_cast<size_t>(ids[i])] = 1;
        any = true;
        continue;
      }
      Automaton after_second = after_first[group.first];
      const char second = static_cast<char>(group.second);
      if (!after_second.feed(std::string_view(&second, 1))) continue;
      for (uint32_t i = group.begin; i < group.end; ++i) {
        const std::string_view bytes = table.bytes(ids[i]);
        if (bytes.size() > 2) {
          Automaton trial = after_second;
          if (!trial.feed(bytes.substr(2))) continue;
        }
        allowed[static_cast<size_t>(ids[i])] = 1;
        any = true;
      }
    }
    if (any) any_allowed.store(true, std::memory_order_relaxed);
  }, 64);
  return any_allowed.load();
}

// The end tokens may follow a complete text, or end one nothing can continue (which a byte-level vocabulary,
// spelling every byte, never leaves) rather than sampling from nothing.
inline void allow_ends(std::span<float> logits, const std::vector<std::pair<int32_t, float>>& ends) {
  const bool all_never = std::all_of(ends.begin(), ends.end(), [](const auto& e) { return e.second == kNever; });
  for (const auto& [id, value] : ends) logits[static_cast<size_t>(id)] = all_never ? 0.0f : value;
}

inline std::vector<std::pair<int32_t, float>> end_logits(std::span<const float> logits, const std::vector<int32_t>& end_ids) {
  std::vector<std::pair<int32_t, float>> ends;
  for (int32_t id : end_ids) {
    if (id >= 0 && static_cast<size_t>(id) < logits.size()) ends.emplace_back(id, logits[static_cast<size_t>(id)]);
  }
  return ends;
}


// PreparedMask (json_constraint.h) for the constraint's current state, unless it is ready.
template <typename Automaton>
void prepare_mask(const Automaton& state, const JsonTokenTable& table, PreparedMask& mask) {
  if (mask.ready) return;
  mask.any = allowed_tokens(state, table, mask.allowed);
  mask.ready = true;
}

// The constraint's write_bits(): the prepared mask as bits (bit i % 32 of bits[i / 32]: token i allowed); where
// no token is allowed, the end tokens. Ids past the tokenizer's table stay clear.
template <typename Automaton>
void write_mask_bits(const Automaton& state, const JsonTokenTable& table, const std::vector<int32_t>& end_ids,
                     PreparedMask& mask, std::span<uint32_t> bits) {
  prepare_mask(state, table, mask);
  std::fill(bits.begin(), bits.end(), 0u);
  const size_t n = std::min(mask.allowed.size(), bits.size() * 32);
  if (mask.any) {
    for (size_t id = 0; id < n; ++id) bits[id / 32] |= static_cast<uint32_t>(mask.allowed[id] != 0) << (id % 32);
    return;
  }
  for (int32_t id : end_ids) {
    if (id >= 0 && static_cast<size_t>(id) < bits.size() * 32) bits[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

// A constraint's mask() over its state: the logits of the tokens `state` cannot take (and of ids the tokenizer does
// not know) set to -infinity, from `mask` (prepared now if it was not); where none is left, only `end_ids` may
// follow, with their logits as they were.
template <typename Automaton>
void apply_mask(const Automaton& state, const JsonTokenTable& table, const std::vector<int32_t>& end_ids, PreparedMask& mask,
                std::span<float> logits) {
  const auto ends = end_logits(logits, end_ids);
  prepare_mask(state, table, mask);
  const size_t n = std::min(logits.size(), mask.allowed.size());
  std::atomic<bool> any{false};
  ThreadPool::global().parallel_for(static_cast<int64_t>(n), [&](int64_t begin, int64_t end) {
    bool part = false;
    for (int64_t id = begin; id < end; ++id) {
      const float v = mask.allowed[static_cast<size_t>(id)] ? logits[static_cast<size_t>(id)] : kNever;
      logits[static_cast<size_t>(id)] = v;
      part |= v != kNever;
    }
    if (part) any.store(true, std::memory_order_relaxed);
  }, 16384);
  std::fill(logits.begin() + static_cast<std::ptrdiff_t>(n), logits.end(), kNever);
  if (!any.load()) allow_ends(logits, ends);
}

}  // namespace petrel::detail

namespace petrel {

template <typename Automaton>
void AutomatonConstraint<Automaton>::prepare() {
  detail::prepare_mask(state_, *table_, mask_);
}

template <typename Automaton>
void AutomatonConstraint<Automaton>::mask(std::span<float> logits) {
  detail::apply_mask(state_, *table_, end_ids_, mask_, logits);
}

template <typename Automaton>
void AutomatonConstraint<Automaton>::write_bits(std::span<uint32_t> bits) {
  detail::write_mask_bits(state_, *table_, end_ids_, mask_, bits);
}

template <typename Automaton>
void AutomatonConstraint<Automaton>::accept(int32_t token) {
  mask_.ready = false;
  if (token < 0 || token >= table_->size() || table_->special(token)) return;
  state_.feed(table_->bytes(token));
}

}  // namespace petrel
