#include "petrel/runtime/prompt.h"

namespace petrel {

Result<ChatPrompt> build_chat_prompt(const Tokenizer& tokenizer, const text::ChatTemplateSet& templates,
                                     const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                                     const ChatPromptOptions& options) {
  const text::ChatTemplate& tpl = templates.select(tools != nullptr);
  text::ReasoningSwitch reasoning;
  reasoning.mode = options.reasoning;
  reasoning.style = options.reasoning_style ? *options.reasoning_style : text::detect_reasoning_style(tpl.source());
  reasoning.prefill_empty_thinking_when_off = options.prefill_empty_thinking_when_off;
  PETREL_ASSIGN_OR_RETURN(text::ReasoningApplied applied, text::apply_reasoning_mode(messages, reasoning));
  PETREL_ASSIGN_OR_RETURN(text::RenderedPrompt rendered,
                          tpl.render(applied.messages, tools, options.add_generation_prompt, templates.special_tokens));
  ChatPrompt prompt;
  prompt.text = rendered.text;
  if (options.add_generation_prompt) prompt.text += applied.assistant_prefill;
  EncodeOptions encode;
  encode.add_special = false;  // chat templates write BOS themselves
  encode.parse_special = true;
  if (!options.allow_special_tokens_in_content) encode.untrusted_ranges = rendered.untrusted_ranges;
  PETREL_ASSIGN_OR_RETURN(prompt.tokens, tokenizer.encode(prompt.text, encode));
  const std::string& prefill = applied.assistant_prefill;
  prompt.starts_in_reasoning = prefill.find("<think>") != std::string::npos && prefill.find("</think>") == std::string::npos;
  return prompt;
}

}  // namespace petrel
