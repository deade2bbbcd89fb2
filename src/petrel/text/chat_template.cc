#include "petrel/text/chat_template.h"

#include <ctime>

#include "petrel/text/jinja_evaluator.h"
#include "petrel/text/jinja_parser.h"
#include "petrel/util/file.h"

namespace petrel::text {

Result<ChatTemplate> ChatTemplate::parse(std::string source, std::string name, const RenderLimits& limits) {
  PETREL_ASSIGN_OR_RETURN(auto parsed, jinja::parse_template(source, name, limits.max_nesting_depth));
  ChatTemplate tpl;
  tpl.name_ = std::move(name);
  tpl.source_ = std::move(source);
  tpl.template_ = std::move(parsed);
  return tpl;
}

Result<RenderedPrompt> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                            const nlohmann::ordered_json* tools, bool add_generation_prompt,
                                            const nlohmann::ordered_json& extra_context,
                                            const RenderOptions& options) const {
  const int depth = options.limits.max_nesting_depth;
  std::vector<std::pair<std::string, jinja::Value>> variables;
  if (!extra_context.is_null()) {
    if (!extra_context.is_object()) return invalid_argument("chat template context must be a JSON object");
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      auto value = jinja::value_from_json(it.value(), /*untrusted=*/false, depth);
      if (!value.ok()) return value.status().with_context("chat template context '" + it.key() + "'");
      variables.emplace_back(it.key(), std::move(value).value());
    }
  }
  auto messages_value = jinja::value_from_json(messages, /*untrusted=*/true, depth);
  if (!messages_value.ok()) return messages_value.status().with_context("messages");
  variables.emplace_back("messages", std::move(messages_value).value());
  jinja::Value tools_value = jinja::Value::none();
  if (tools != nullptr && !tools->is_null()) {
    auto converted = jinja::value_from_json(*tools, /*untrusted=*/true, depth);
    if (!converted.ok()) return converted.status().with_context("tools");
    tools_value = std::move(converted).value();
  }
  variables.emplace_back("tools", std::move(tools_value));
  variables.emplace_back("documents", jinja::Value::none());
  variables.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));

  jinja::RenderSettings settings;
  settings.max_output_bytes = options.limits.max_output_bytes;
  settings.max_steps = options.limits.max_steps;
  settings.max_loop_iterations = options.limits.max_loop_iterations;
  settings.max_call_depth = options.limits.max_recursion_depth;
  settings.max_nesting_depth = depth;
  if (options.now) {
    settings.now = *options.now;
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &settings.now);
  }
  PETREL_ASSIGN_OR_RETURN(jinja::TString text, jinja::render_template(*template_, variables, settings));
  RenderedPrompt prompt;
  prompt.untrusted_ranges.reserve(text.untrusted_ranges().size());
  for (const jinja::ByteRange& r : text.untrusted_ranges()) prompt.untrusted_ranges.emplace_back(r.begin, r.end);
  prompt.text = text.text();
  return prompt;
}

Result<RenderedPrompt> ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json* tools,
                                            bool add_generation_prompt, const nlohmann::json& extra_context,
                                            const RenderOptions& options) const {
  nlohmann::ordered_json ordered_tools;
  if (tools != nullptr) ordered_tools = nlohmann::ordered_json::parse(tools->dump());
  return render(nlohmann::ordered_json::parse(messages.dump()), tools != nullptr ? &ordered_tools : nullptr,
                add_generation_prompt, nlohmann::ordered_json::parse(extra_context.dump()), options);
}

namespace {

// A special token in tokenizer_config.json is a string or an AddedToken object {"content": ...}.
std::optional<nlohmann::ordered_json> special_token_text(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value;
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"];
  return std::nullopt;
}

}  // namespace

Result<ChatTemplateSet> load_chat_template(const std::filesystem::path& dir, const RenderLimits& limits) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  PETREL_ASSIGN_OR_RETURN(std::string config_text, read_text_file(config_path));
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return invalid_data(config_path.string() + ": not a JSON object");
  }

  std::optional<ChatTemplate> default_template;
  std::optional<ChatTemplate> tool_use_template;
  const std::string where = config_path.string() + ": chat_template";
  auto parse_named = [&](const std::string& source, const std::string& name) -> Result<ChatTemplate> {
    return ChatTemplate::parse(source, name, limits);
  };
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& entry = config["chat_template"];
    if (entry.is_string()) {
      PETREL_ASSIGN_OR_RETURN(ChatTemplate t, parse_named(entry.get<std::string>(), where));
      default_template = std::move(t);
    } else if (entry.is_array()) {
      for (const auto& item : entry) {
        if (!item.is_object() || !item.contains("name") || !item.contains("template") || !item["name"].is_string() ||
            !item["template"].is_string()) {
          return invalid_data(where + ": list entries must be {\"name\": ..., \"template\": ...}");
        }
        const std::string name = item["name"].get<std::string>();
        if (name != "default" && name != "tool_use") continue;
        PETREL_ASSIGN_OR_RETURN(ChatTemplate t, parse_named(item["template"].get<std::string>(), where + "[" + name + "]"));
        (name == "default" ? default_template : tool_use_template) = std::move(t);
      }
      if (!default_template) return invalid_data(where + ": the list has no template named \"default\"");
    } else {
      return invalid_data(where + ": expected a string or a list of {name, template}");
    }
  } else {
    // Newer transformers versions save the template next to the config.
    const std::filesystem::path jinja_path = dir / "chat_template.jinja";
    if (!std::filesystem::exists(jinja_path)) {
      return not_found(config_path.string() + " has no chat_template and " + jinja_path.string() + " does not exist");
    }
    PETREL_ASSIGN_OR_RETURN(std::string source, read_text_file(jinja_path));
    PETREL_ASSIGN_OR_RETURN(ChatTemplate t, parse_named(source, jinja_path.string()));
    default_template = std::move(t);
  }

  ChatTemplateSet set{std::move(*default_template), std::move(tool_use_template), nlohmann::ordered_json::object()};
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    if (auto text = special_token_text(config[key])) set.special_tokens[key] = *text;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& token : config["additional_special_tokens"]) {
      if (auto text = special_token_text(token)) list.push_back(*text);
    }
    set.special_tokens["additional_special_tokens"] = list;
  }
  return set;
}

}  // namespace petrel::text
