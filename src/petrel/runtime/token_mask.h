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
// (0); false when none can. Inside a plain string (most tokens allowed) the vocabulary is walked in id order:
// plain tokens pass at once, the others are judged by their first two bytes (verdicts kept per thread-pool part)
// and stepped through. Elsewhere the table's groups by first two bytes are walked: a refused pair skips its
// whole group, so the work follows the tokens allowed rather than the vocabulary. Needs no logits, so a decoding
// loop can run it while the GPU computes them (LogitConstraint::prepare).
template <typename Automaton>
bool allowed_tokens(const Automaton& state, const JsonTokenTable& table, std::vector<uint8_t>& allowed) {
  const int32_t n = table.size();
  allowed.assign(static_cast<size_t>(n), 0);
  if (state.complete()) return false;
  const bool plain = state.in_plain_string();
  std::array<bool, 256> first_ok;
  std::array<Automaton, 256> after_first;
  for (int c = 0; c < 256; ++c) {
    after_first[static_cast<size_t>(c)] = state;
    first_ok[static_cast<size_t>(c)] = after_first[static_cast<size_t>(c)].feed(static_cast<unsigned char>(c));
  }
  std::atomic<bool> any_allowed{false};
  if (!plain) {
    // By the tokens' first two bytes: a group whose pair the state refuses is skipped whole.
    const auto& groups = table.groups();
    const auto& ids = table.by_bytes();
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
        if (!after_second.feed(static_cast<unsigned char>(group.second))) continue;
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
  ThreadPool::global().parallel_for(n, [&](int64_t begin, int64_t end) {
    // second_ok[c0][c1]: 1 / 0 once stepped through, -1 not yet (a row is filled on first use, its entries when a
    // token asks: the vocabulary's pairs are far fewer than 256 a first byte, and a SchemaPrefix copy is 400 bytes).
    std::vector<std::array<int8_t, 256>> second_ok(256);
    std::array<bool, 256> second_ready{};
    bool any = false;
    for (int32_t id = static_cast<int32_t>(begin); id < static_cast<int32_t>(end); ++id) {
      if (table.special(id)) continue;
      if (!(plain && table.plain_string_content(id))) {
        const std::string_view bytes = table.bytes(id);
        const auto c0 = static_cast<unsigned char>(bytes[0]);
        if (!first_ok[c0]) continue;
        if (bytes.size() > 1) {
          if (!second_ready[c0]) {
            second_ok[c0].fill(-1);
            second_ready[c0] = true;
          }
          const auto c1 = static_cast<unsigned char>(bytes[1]);
          int8_t& ok = second_ok[c0][c1];
          if (ok < 0) {
            Automaton trial = after_first[c0];
            ok = trial.feed(c1) ? 1 : 0;
          }
          if (!ok) continue;
          Automaton trial = after_first[c0];
          if (!trial.feed(bytes.substr(1))) continue;
        }
      }
      allowed[static_cast<size_t>(id)] = 1;
      any = true;
    }
    if (any) any_allowed.store(true, std::memory_order_relaxed);
  }, 4096);
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
