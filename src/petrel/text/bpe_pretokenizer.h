// Pre-tokenization for byte-level BPE: the tokenizer.json pre_tokenizer pipeline (Split with a regex or a
// literal, ByteLevel, Sequence of those), compiled once with PCRE2 (UTF + UCP, JIT when available).
// Internal to the text module.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "petrel/util/status.h"

namespace petrel::text_internal {

// How a Split pre-tokenizer turns matches into pieces (tokenizer.json "behavior").
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One compiled pattern. Immutable after compile, so one instance serves all threads; the PCRE2 match
// state lives on the caller's stack for the duration of one split().
class RegexSplitter {
 public:
  // `literal`: the pattern is a plain string (tokenizer.json {"String": ...}), not a regex.
  // On failure the message says what PCRE2 disliked and where; the caller adds the file and JSON path.
  static Result<std::shared_ptr<const RegexSplitter>> compile(const std::string& pattern, bool literal,
                                                             SplitBehavior behavior, bool invert);
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  ~RegexSplitter();

  // Calls emit(begin, end) for each piece of `text` (byte offsets into it), in order, never empty.
  // `text` must be valid UTF-8 (it is not re-checked).
  Status split(std::string_view text, const std::function<void(size_t, size_t)>& emit) const;

 private:
  RegexSplitter() = default;
  // Calls on_match(begin, end) for every non-empty match, in order.
  Status for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so that pcre2.h stays out of the headers
  bool jit_ = false;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  bool invert_ = false;
};

// The pre_tokenizer pipeline of one tokenizer.json.
class PreTokenizer {
 public:
  struct Stage {
    std::shared_ptr<const RegexSplitter> splitter;  // null for a ByteLevel stage without regex
    bool add_prefix_space = false;                  // ByteLevel: prepend ' ' to pieces that lack one
  };

  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<Stage> stages) : stages_(std::move(stages)) {}

  // Calls emit(piece) for each pre-token of `text`, in order; pieces are never empty. Pieces are views
  // into `text` except where a stage prepended a space.
  Status run(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  std::vector<Stage> stages_;
};

}  // namespace petrel::text_internal
