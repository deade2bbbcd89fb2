// From messages to prompt tokens: the model's own chat template, the reasoning switch, and tokenization that
// keeps user- and tool-supplied text from becoming special tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/text/chat_template.h"
#include "petrel/text/reasoning.h"
#include "petrel/text/tokenizer.h"
#include "petrel/util/status.h"

namespace petrel {

struct ChatPromptOptions {
  text::ReasoningMode reasoning = text::ReasoningMode::kDefault;
  std::optional<text::ReasoningStyle> reasoning_style;  // unset: detected from the template
  bool prefill_empty_thinking_when_off = false;
  bool add_generation_prompt = true;
  // Transformers and vLLM let text inside messages become special tokens; petrel does not unless this is set.
  bool allow_special_tokens_in_content = false;
};

struct ChatPrompt {
  std::string text;            // the rendered prompt (with any assistant prefill)
  std::vector<int32_t> tokens;
  bool starts_in_reasoning = false;  // the prefill opened a <think> block the output continues
};

Result<ChatPrompt> build_chat_prompt(const Tokenizer& tokenizer, const text::ChatTemplateSet& templates,
                                     const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                                     const ChatPromptOptions& options);

}  // namespace petrel
