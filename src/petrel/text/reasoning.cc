#include "petrel/text/reasoning.h"

namespace petrel::text {

using nlohmann::ordered_json;

Result<ReasoningMode> parse_reasoning_mode(std::string_view text) {
  if (text == "default") return ReasoningMode::kDefault;
  if (text == "on") return ReasoningMode::kOn;
  if (text == "off") return ReasoningMode::kOff;
  return invalid_argument("reasoning mode must be on, off or default, not '" + std::string(text) + "'");
}

Result<ReasoningStyle> parse_reasoning_style(std::string_view text) {
  if (text == "none") return ReasoningStyle::kNone;
  if (text == "nemotron-v1") return ReasoningStyle::kSystemPromptSwitch;
  if (text == "think-flag") return ReasoningStyle::kThinkFlag;
  return invalid_argument("reasoning style must be none, nemotron-v1 or think-flag, not '" + std::string(text) + "'");
}

const char* reasoning_style_name(ReasoningStyle style) {
  switch (style) {
    case ReasoningStyle::kNone: return "none";
    case ReasoningStyle::kSystemPromptSwitch: return "nemotron-v1";
    case ReasoningStyle::kThinkFlag: return "think-flag";
  }
  return "none";
}

ReasoningStyle detect_reasoning_style(std::string_view source) {
  if (source.find("/no_think") != std::string_view::npos || source.find("/think") != std::string_view::npos) {
    return ReasoningStyle::kThinkFlag;
  }
  if (source.find("detailed thinking") != std::string_view::npos) return ReasoningStyle::kSystemPromptSwitch;
  return ReasoningStyle::kNone;
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string trim(std::string s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

void remove_all(std::string& s, std::string_view what) {
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at)) s.erase(at, what.size());
}

Result<std::string> string_content(const ordered_json& message, std::string_view role) {
  if (!message.contains("content") || message["content"].is_null()) return std::string();
  if (!message["content"].is_string()) {
    return invalid_argument("the reasoning switch must edit the " + std::string(role) +
                            " message, but its content is not a string");
  }
  return message["content"].get<std::string>();
}

bool is_system(const ordered_json& messages) {
  return !messages.empty() && messages[0].is_object() && messages[0].value("role", "") == "system";
}

Status apply_system_prompt_switch(ordered_json& messages, bool on) {
  const std::string switch_text = on ? "detailed thinking on" : "detailed thinking off";
  if (!is_system(messages)) {
    messages.insert(messages.begin(), ordered_json{{"role", "system"}, {"content", switch_text}});
    return ok_status();
  }
  PETREL_ASSIGN_OR_RETURN(std::string original, string_content(messages[0], "system"));
  messages[0]["content"] = switch_text;
  std::string moved = trim(original);
  if (moved.empty() || moved == "detailed thinking on" || moved == "detailed thinking off") return ok_status();
  for (size_t i = 1; i < messages.size(); ++i) {
    if (!messages[i].is_object() || messages[i].value("role", "") != "user") continue;
    PETREL_ASSIGN_OR_RETURN(std::string user_text, string_content(messages[i], "first user"));
    messages[i]["content"] = moved + "\n\n" + user_text;
    return ok_status();
  }
  messages.insert(messages.begin() + 1, ordered_json{{"role", "user"}, {"content", moved}});
  return ok_status();
}

Status apply_think_flag(ordered_json& messages, bool on) {
  const std::string flag = on ? "/think" : "/no_think";
  if (!is_system(messages)) {
    messages.insert(messages.begin(), ordered_json{{"role", "system"}, {"content", flag}});
    return ok_status();
  }
  PETREL_ASSIGN_OR_RETURN(std::string content, string_content(messages[0], "system"));
  remove_all(content, "/no_think");
  remove_all(content, "/think");
  content = trim(content);
  messages[0]["content"] = content.empty() ? flag : content + " " + flag;
  return ok_status();
}

// Length of the longest suffix of `text` that is a proper prefix of `tag` (text that may still become
// the tag when more arrives).
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  size_t longest = std::min(text.size(), tag.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// Length of `text` without an incomplete UTF-8 sequence at its end.
size_t complete_utf8_length(std::string_view text) {
  size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    size_t needed = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    return needed > back ? n - back : n;
  }
  return n;
}

}  // namespace

Result<ReasoningApplied> apply_reasoning_mode(const ordered_json& messages, const ReasoningSwitch& config) {
  if (!messages.is_array()) return invalid_argument("messages must be a JSON array");
  ReasoningApplied applied{messages, ""};
  if (config.mode == ReasoningMode::kDefault) return applied;
  const bool on = config.mode == ReasoningMode::kOn;
  switch (config.style) {
    case ReasoningStyle::kNone:
      return unsupported("this chat template has no known reasoning switch; choose a reasoning style explicitly");
    case ReasoningStyle::kSystemPromptSwitch:
      PETREL_RETURN_IF_ERROR(apply_system_prompt_switch(applied.messages, on));
      if (!on && config.prefill_empty_thinking_when_off) applied.assistant_prefill = "<think>\n</think>";
      return applied;
    case ReasoningStyle::kThinkFlag:
      PETREL_RETURN_IF_ERROR(apply_think_flag(applied.messages, on));
      return applied;
  }
  return internal_error("unknown reasoning style");
}

ReasoningSplitter::ReasoningSplitter(Options options)
    : options_(std::move(options)), state_(options_.starts_in_reasoning ? State::kReasoning : State::kStart) {}

void ReasoningSplitter::emit(std::string& target, size_t length) {
  target.append(pending_, 0, length);
  pending_.erase(0, length);
}

ReasoningSplit ReasoningSplitter::feed(std::string_view chunk) {
  pending_.append(chunk);
  ReasoningSplit out;
  while (true) {
    switch (state_) {
      case State::kStart: {
        size_t first = 0;
        while (first < pending_.size() && is_space(pending_[first])) ++first;
        if (first == pending_.size()) return out;  // only whitespace so far: undecided
        std::string_view rest = std::string_view(pending_).substr(first);
        const std::string& tag = options_.open_tag;
        if (rest.substr(0, tag.size()) == tag) {
          pending_.erase(0, first + tag.size());
          state_ = State::kReasoning;
          continue;
        }
        if (rest.size() < tag.size() && tag.compare(0, rest.size(), rest) == 0) return out;  // maybe the tag
        state_ = State::kAnswer;
        continue;
      }
      case State::kReasoning: {
        size_t close = pending_.find(options_.close_tag);
        if (close != std::string::npos) {
          emit(out.reasoning, close);
          pending_.erase(0, options_.close_tag.size());
          state_ = State::kAfterClose;
          continue;
        }
        size_t hold = partial_tag_suffix(pending_, options_.close_tag);
        emit(out.reasoning, complete_utf8_length(std::string_view(pending_).substr(0, pending_.size() - hold)));
        return out;
      }
      case State::kAfterClose: {
        size_t first = 0;
        while (first < pending_.size() && is_space(pending_[first])) ++first;
        pending_.erase(0, first);
        if (pending_.empty()) return out;
        state_ = State::kAnswer;
        continue;
      }
      case State::kAnswer:
        emit(out.answer, complete_utf8_length(pending_));
        return out;
    }
  }
}

ReasoningSplit ReasoningSplitter::finish() {
  ReasoningSplit out;
  switch (state_) {
    case State::kStart:
    case State::kAnswer: out.answer = std::move(pending_); break;
    case State::kReasoning: out.reasoning = std::move(pending_); break;
    case State::kAfterClose: break;
  }
  pending_.clear();
  state_ = options_.starts_in_reasoning ? State::kReasoning : State::kStart;
  return out;
}

ReasoningSplit split_reasoning(std::string_view output, const ReasoningSplitter::Options& options) {
  ReasoningSplitter splitter(options);
  ReasoningSplit all = splitter.feed(output);
  ReasoningSplit rest = splitter.finish();
  all.reasoning += rest.reasoning;
  all.answer += rest.answer;
  return all;
}

}  // namespace petrel::text
