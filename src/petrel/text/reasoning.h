// Reasoning ("thinking") models: turning reasoning on or off through the conversation, and splitting
// the model's output into its reasoning and its answer.
//
// The switch. Two conventions exist among Llama-based reasoning models:
//  - kSystemPromptSwitch (Llama-3.1-Nemotron-Nano v1 and its siblings): the system prompt must be exactly
//    "detailed thinking on" or "detailed thinking off". A system prompt the caller already had cannot
//    stay there, so apply_reasoning_mode() moves its text to the start of the first user message,
//    followed by a blank line ("<system text>\n\n<user text>"); with no user message, the text becomes a
//    user message right after the system message. With reasoning off, the model card recommends starting
//    the assistant turn with an empty reasoning block: set prefill_empty_thinking_when_off and append
//    ReasoningApplied::assistant_prefill ("<think>\n</think>") to the rendered prompt.
//  - kThinkFlag (Llama-3.3-Nemotron-Super v1.5): the template looks for "/think" or "/no_think" in the
//    system message. apply_reasoning_mode() removes any flag already there and appends the requested one
//    (after a space), adding a system message holding only the flag when there is none. The template
//    itself pre-fills the empty reasoning block when reasoning is off.
// ReasoningMode::kDefault leaves the messages alone.
//
// The splitter. ReasoningSplitter takes the model's output in chunks of any size (a tag may be split
// across chunks) and separates the text inside <think>...</think> from the answer:
//  - output that starts with "<think>" (after optional whitespace, which is dropped) opens reasoning;
//    output that starts with anything else has no reasoning, and all of it is the answer;
//  - with starts_in_reasoning (the prompt already ended in "<think>"), output begins inside reasoning;
//  - whitespace between "</think>" and the first answer character is dropped (templates strip it too
//    when the turn goes back into the history), so the answer starts at its first visible character;
//  - reasoning text is passed on verbatim (including newlines right after <think>);
//  - only the first </think> closes; later tags are answer text;
//  - finish() flushes text held back because it might have been the start of a tag; unterminated
//    reasoning stays reasoning;
//  - the split is byte-exact, and a delta never ends inside a UTF-8 sequence (an incomplete tail waits
//    for the next chunk or finish()).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel::text {

enum class ReasoningMode { kDefault, kOn, kOff };
enum class ReasoningStyle { kNone, kSystemPromptSwitch, kThinkFlag };

// "default", "on", "off".
Result<ReasoningMode> parse_reasoning_mode(std::string_view text);
// "none", "nemotron-v1" (kSystemPromptSwitch), "think-flag" (kThinkFlag).
Result<ReasoningStyle> parse_reasoning_style(std::string_view text);
const char* reasoning_style_name(ReasoningStyle style);

// kThinkFlag when the template mentions "/think" or "/no_think", kSystemPromptSwitch when it mentions
// "detailed thinking", else kNone (force a style when a template does not name its switch).
ReasoningStyle detect_reasoning_style(std::string_view template_source);

struct ReasoningSwitch {
  ReasoningMode mode = ReasoningMode::kDefault;
  ReasoningStyle style = ReasoningStyle::kNone;
  bool prefill_empty_thinking_when_off = false;  // kSystemPromptSwitch only
};

struct ReasoningApplied {
  nlohmann::ordered_json messages;
  std::string assistant_prefill;  // to append after the rendered generation prompt; often empty
};

// Applies the switch to an OpenAI-style message list (see the top of this file). Fails with
// kUnsupported for kOn/kOff when the style is kNone, and with kInvalidArgument when a message that
// must be edited has non-string content.
Result<ReasoningApplied> apply_reasoning_mode(const nlohmann::ordered_json& messages, const ReasoningSwitch& config);

struct ReasoningSplit {
  std::string reasoning;
  std::string answer;
};

class ReasoningSplitter {
 public:
  struct Options {
    bool starts_in_reasoning = false;
    std::string open_tag = "<think>";
    std::string close_tag = "</think>";
  };

  ReasoningSplitter() : ReasoningSplitter(Options{}) {}
  explicit ReasoningSplitter(Options options);

  // Returns the reasoning and answer text that became certain with this chunk.
  ReasoningSplit feed(std::string_view chunk);
  // Returns whatever was held back; the splitter then starts over.
  ReasoningSplit finish();
  bool in_reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kStart, kReasoning, kAfterClose, kAnswer };
  void emit(std::string& target, size_t length);

  Options options_;
  State state_;
  std::string pending_;
};

// The whole output at once.
ReasoningSplit split_reasoning(std::string_view output, const ReasoningSplitter::Options& options = {});

}  // namespace petrel::text
