// Hugging Face chat templates, rendered natively and byte-for-byte like transformers does with
// Jinja2 (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its own tojson,
// raise_exception and strftime_now). The template language is a sandboxed Jinja subset
// (src/petrel/text/jinja_*): no file or network access, and hard limits on work, output and depth.
//
// Rendering tracks which output bytes came from the conversation (message contents, tool calls and
// results, tool definitions: every string read from `messages` or `tools`) so the tokenizer can keep
// user-typed text such as "<|eot_id|>" from becoming a special token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel::jinja {
struct Template;
}

namespace petrel::text {

// Exceeding any limit stops the render with ErrorCode::kOutOfRange and a message naming the limit.
struct RenderLimits {
  size_t max_output_bytes = 8u << 20;          // the prompt and every intermediate string
  uint64_t max_steps = 20'000'000;             // expression evaluations + statements
  uint64_t max_loop_iterations = 1'000'000;    // all for-loop iterations together
  int max_recursion_depth = 100;               // nested macro calls
  int max_nesting_depth = 256;                 // nesting of template syntax, input JSON and built values
};

struct RenderOptions {
  RenderLimits limits;
  // What strftime_now() formats; unset means the local time at render. Set it for reproducible output.
  std::optional<std::tm> now;
};

struct RenderedPrompt {
  std::string text;
  // Byte ranges [begin, end) of `text` that came from the conversation, sorted and disjoint.
  std::vector<std::pair<size_t, size_t>> untrusted_ranges;
};

class ChatTemplate {
 public:
  // Parses `source`. Syntax errors name `name`, the line and the column.
  static Result<ChatTemplate> parse(std::string source, std::string name, const RenderLimits& limits = {});

  // Renders the template with the variables transformers passes: `messages`, `tools` (None when
  // null), `add_generation_prompt`, `documents` (None), and every key of `extra_context` (special tokens
  // such as bos_token, date_string, ...; these are trusted). ordered_json keeps object keys in the
  // caller's order, which tojson output depends on.
  Result<RenderedPrompt> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json* tools,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra_context,
                                const RenderOptions& options = {}) const;
  // The same for nlohmann::json, whose objects are sorted by key (so tojson output is too).
  Result<RenderedPrompt> render(const nlohmann::json& messages, const nlohmann::json* tools,
                                bool add_generation_prompt, const nlohmann::json& extra_context,
                                const RenderOptions& options = {}) const;

  const std::string& name() const { return name_; }
  const std::string& source() const { return source_; }

 private:
  ChatTemplate() = default;
  std::string name_;
  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
};

// What a model directory provides for chat formatting.
struct ChatTemplateSet {
  ChatTemplate default_template;
  std::optional<ChatTemplate> tool_use_template;  // a template named "tool_use", when present
  // bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token (as strings; AddedToken
  // objects are reduced to their "content") and additional_special_tokens, ready for extra_context.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();

  // transformers uses the "tool_use" template when tools are given and it exists.
  const ChatTemplate& select(bool has_tools) const {
    return has_tools && tool_use_template ? *tool_use_template : default_template;
  }
};

// Reads dir/tokenizer_config.json: `chat_template` as a string or as a list of {name, template}
// ("default" is the default; "tool_use" is exposed), falling back to dir/chat_template.jinja.
Result<ChatTemplateSet> load_chat_template(const std::filesystem::path& dir, const RenderLimits& limits = {});

}  // namespace petrel::text
