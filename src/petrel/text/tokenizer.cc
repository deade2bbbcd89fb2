// petrel::Tokenizer: loading, the parts common to every model kind (added and special tokens, untrusted
// ranges, post-processing, validation) and decoding. The models themselves are in bpe_model.cc and
// tokenizer_sentencepiece.cc; tokenizer.json is read by tokenizer_json.cc.
#include "petrel/text/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "petrel/text/tokenizer_state.h"
#include "petrel/text/utf8.h"
#include "petrel/util/file.h"

namespace petrel {

namespace fs = std::filesystem;
using text_internal::AddedToken;
using text_internal::TokenizerState;
using Json = nlohmann::json;

namespace text_internal {

void TokenizerState::finish() {
  added_index_by_id.clear();
  added_id_by_content.clear();
  added_by_first_byte.assign(256, {});
  std::fill(std::begin(has_added_first_byte), std::end(has_added_first_byte), false);
  int32_t max_id = backend ? backend->vocab_size() - 1 : -1;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const AddedToken& token = added_tokens[i];
    added_index_by_id[token.id] = i;  // a later entry for the same id wins, as in Hugging Face
    added_id_by_content[token.content] = token.id;
    const uint8_t first = static_cast<uint8_t>(token.content[0]);
    added_by_first_byte[first].push_back(i);
    has_added_first_byte[first] = true;
    max_id = std::max(max_id, token.id);
  }
  for (auto& bucket : added_by_first_byte) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](size_t a, size_t b) {
      return added_tokens[a].content.size() > added_tokens[b].content.size();
    });
  }
  vocab_size = max_id + 1;
  std::sort(eos_ids.begin(), eos_ids.end());
  eos_ids.erase(std::unique(eos_ids.begin(), eos_ids.end()), eos_ids.end());
}

}  // namespace text_internal

namespace {

std::string json_quoted(std::string_view s) { return Json(std::string(s)).dump(); }

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// A word character for single_word added tokens: ASCII letters and digits, and any non-ASCII byte (an
// approximation of Hugging Face's Unicode alphanumeric test that errs towards not matching).
bool is_word_byte(char c) {
  const auto b = static_cast<uint8_t>(c);
  return b >= 0x80 || (b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
}

// The untrusted ranges, sorted and merged, for an overlap test in O(log n).
class RangeSet {
 public:
  explicit RangeSet(std::vector<std::pair<size_t, size_t>> ranges) {
    std::sort(ranges.begin(), ranges.end());
    for (const auto& [begin, end] : ranges) {
      if (begin >= end) continue;
      if (!ranges_.empty() && begin <= ranges_.back().second) {
        ranges_.back().second = std::max(ranges_.back().second, end);
      } else {
        ranges_.emplace_back(begin, end);
      }
    }
  }
  bool overlaps(size_t begin, size_t end) const {
    // The first range that ends after `begin` is the only candidate.
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), begin,
                               [](size_t value, const std::pair<size_t, size_t>& r) { return value < r.second; });
    return it != ranges_.end() && it->first < end;
  }

 private:
  std::vector<std::pair<size_t, size_t>> ranges_;
};

struct AddedMatch {
  size_t begin = 0;
  size_t end = 0;
  int32_t id = 0;
};

// Leftmost-longest match of an allowed added token in text[from..]. lstrip reaches back at most to `from`,
// the end of the previous match.
std::optional<AddedMatch> find_added_token(const TokenizerState& state, std::string_view text, size_t from,
                                           bool parse_special, const RangeSet& untrusted) {
  const size_t n = text.size();
  for (size_t pos = from; pos < n; ++pos) {
    if (!state.has_added_first_byte[static_cast<uint8_t>(text[pos])]) continue;
    for (size_t index : state.added_by_first_byte[static_cast<uint8_t>(text[pos])]) {
      const AddedToken& token = state.added_tokens[index];
      if (token.special && !parse_special) continue;
      if (text.compare(pos, token.content.size(), token.content) != 0) continue;
      AddedMatch match{pos, pos + token.content.size(), token.id};
      if (token.single_word && ((match.begin > 0 && is_word_byte(text[match.begin - 1])) ||
                                (match.end < n && is_word_byte(text[match.end])))) {
        continue;
      }
      if (token.special && untrusted.overlaps(match.begin, match.end)) continue;
      if (token.lstrip) {
        while (match.begin > from && is_ascii_space(text[match.begin - 1])) --match.begin;
      }
      if (token.rstrip) {
        while (match.end < n && is_ascii_space(text[match.end])) ++match.end;
      }
      return match;
    }
  }
  return std::nullopt;
}

// "bos_token": "<s>" or {"content": "<s>", ...} or null.
std::optional<std::string> token_name(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

Result<Json> parse_json_file_text(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too large
    return invalid_data(source + ": not valid JSON: " + e.what());
  }
}

std::optional<int32_t> lookup_token(const TokenizerState& state, std::string_view token) {
  for (const AddedToken& added : state.added_tokens) {
    if (added.content == token) return added.id;
  }
  return state.backend->token_to_id(token);
}

// tokenizer_config.json: names of bos/eos, and for SentencePiece whether encoding adds them.
Status apply_tokenizer_config(TokenizerState& state, std::string_view text, const std::string& source) {
  PETREL_ASSIGN_OR_RETURN(Json config, parse_json_file_text(text, source));
  if (!config.is_object()) return invalid_data(source + ": expected a JSON object");
  if (auto name = token_name(config, "bos_token")) {
    auto id = lookup_token(state, *name);
    if (!id) return invalid_data(source + ": bos_token: " + json_quoted(*name) + " is not a token of the vocabulary");
    state.bos_id = *id;
  }
  std::optional<int32_t> eos;
  if (auto name = token_name(config, "eos_token")) {
    eos = lookup_token(state, *name);
    if (!eos) return invalid_data(source + ": eos_token: " + json_quoted(*name) + " is not a token of the vocabulary");
    state.eos_ids.push_back(*eos);
  }
  if (std::string(state.backend->kind()) == "sentencepiece") {
    // The slow Llama tokenizer's switches; tokenizer.json files express the same in their post-processor.
    auto flag = [&](const char* key, bool fallback) {
      auto it = config.find(key);
      return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
    };
    state.prefix_ids.clear();
    state.suffix_ids.clear();
    if (flag("add_bos_token", true) && state.bos_id) state.prefix_ids.push_back(*state.bos_id);
    if (flag("add_eos_token", false) && eos) state.suffix_ids.push_back(*eos);
  }
  return ok_status();
}

// generation_config.json: eos_token_id, one id or a list.
Status apply_generation_config(TokenizerState& state, std::string_view text, const std::string& source) {
  PETREL_ASSIGN_OR_RETURN(Json config, parse_json_file_text(text, source));
  if (!config.is_object()) return invalid_data(source + ": expected a JSON object");
  auto it = config.find("eos_token_id");
  if (it == config.end() || it->is_null()) return ok_status();
  const Json list = it->is_array() ? *it : Json::array({*it});
  for (const Json& value : list) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      return invalid_data(source + ": eos_token_id: expected token ids, found " + it->dump());
    }
    state.eos_ids.push_back(static_cast<int32_t>(value.get<int64_t>()));
  }
  return ok_status();
}

// Chat-tuned Llama 3 ends a turn with <|eot_id|> and a tool call with <|eom_id|>, whichever single
// eos_token its config names, so a generation loop must stop on all of them.
void add_llama3_terminators(TokenizerState& state) {
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"}) {
    for (const AddedToken& token : state.added_tokens) {
      if (token.special && token.content == name) state.eos_ids.push_back(token.id);
    }
  }
}

void finish_state(TokenizerState& state) {
  if (!state.bos_id && !state.prefix_ids.empty()) state.bos_id = state.prefix_ids.front();
  add_llama3_terminators(state);
  state.finish();
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<TokenizerState> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Result<Tokenizer> Tokenizer::load(const fs::path& directory) {
  std::error_code ec;
  if (!fs::exists(directory, ec)) return not_found(directory.string() + ": no such directory");
  if (!fs::is_directory(directory, ec)) {
    return invalid_argument(directory.string() + ": expected a directory holding tokenizer.json or tokenizer.model");
  }
  const fs::path json_path = directory / "tokenizer.json";
  const fs::path model_path = directory / "tokenizer.model";
  std::unique_ptr<TokenizerState> state;
  if (fs::exists(json_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(json_path));
    auto from_json = text_internal::read_tokenizer_json(text, json_path.string());
    if (from_json.ok()) {
      state = std::move(from_json).value();
    } else if (from_json.status().code() == ErrorCode::kUnsupported && fs::exists(model_path, ec)) {
      // A Llama 2 checkpoint ships both; its tokenizer.json is SentencePiece-style BPE, which petrel
      // reads from tokenizer.model instead.
      PETREL_ASSIGN_OR_RETURN(state, text_internal::read_sentencepiece_model(model_path.string()));
    } else {
      return from_json.status();
    }
  } else if (fs::exists(model_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(state, text_internal::read_sentencepiece_model(model_path.string()));
  } else {
    return not_found(directory.string() + ": has neither tokenizer.json nor tokenizer.model");
  }
  const fs::path config_path = directory / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(config_path));
    PETREL_RETURN_IF_ERROR(apply_tokenizer_config(*state, text, config_path.string()));
  }
  const fs::path generation_path = directory / "generation_config.json";
  if (fs::exists(generation_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(generation_path));
    PETREL_RETURN_IF_ERROR(apply_generation_config(*state, text, generation_path.string()));
  }
  finish_state(*state);
  return Tokenizer(std::move(state));
}

Result<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                                       const std::string& source) {
  PETREL_ASSIGN_OR_RETURN(auto state, text_internal::read_tokenizer_json(tokenizer_json, source));
  if (!tokenizer_config_json.empty()) {
    PETREL_RETURN_IF_ERROR(apply_tokenizer_config(*state, tokenizer_config_json, "tokenizer_config.json"));
  }
  finish_state(*state);
  return Tokenizer(std::move(state));
}

Result<Tokenizer> Tokenizer::from_sentencepiece(const fs::path& model_file) {
  PETREL_ASSIGN_OR_RETURN(auto state, text_internal::read_sentencepiece_model(model_file.string()));
  finish_state(*state);
  return Tokenizer(std::move(state));
}

Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  if (auto bad = utf8::find_invalid(text)) {
    char byte_hex[8];
    std::snprintf(byte_hex, sizeof(byte_hex), "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(text[*bad])));
    return invalid_argument("text is not valid UTF-8: byte " + std::string(byte_hex) + " at offset " +
                            std::to_string(*bad) + " does not form a character");
  }
  for (const auto& [begin, end] : options.untrusted_ranges) {
    if (begin > end || end > text.size()) {
      return invalid_argument("untrusted range [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") does not lie within the text of " + std::to_string(text.size()) + " bytes");
    }
  }
  const RangeSet untrusted(options.untrusted_ranges);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + state_->prefix_ids.size() + state_->suffix_ids.size() + 4);
  if (options.add_special) ids.insert(ids.end(), state_->prefix_ids.begin(), state_->prefix_ids.end());
  size_t segment_begin = 0;
  while (segment_begin < text.size()) {
    auto match = find_added_token(*state_, text, segment_begin, options.parse_special, untrusted);
    const size_t segment_end = match ? match->begin : text.size();
    if (segment_end > segment_begin) {
      PETREL_RETURN_IF_ERROR(
          state_->backend->encode_segment(text.substr(segment_begin, segment_end - segment_begin), ids));
    }
    if (!match) break;
    ids.push_back(match->id);
    segment_begin = match->end;
  }
  if (options.add_special) ids.insert(ids.end(), state_->suffix_ids.begin(), state_->suffix_ids.end());
  return ids;
}

Status Tokenizer::append_decoded(int32_t id, bool skip_special, bool& at_start, std::string& out) const {
  if (const AddedToken* added = state_->find_added(id)) {
    if (!(added->special && skip_special)) out.append(added->content);
    return ok_status();
  }
  if (!state_->backend->append_token_bytes(id, at_start, out)) {
    return out_of_range("token id " + std::to_string(id) + " is not in the vocabulary (" +
                        std::to_string(state_->vocab_size) + " ids)");
  }
  at_start = false;
  return ok_status();
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size() * 4);
  bool at_start = true;
  for (int32_t id : ids) PETREL_RETURN_IF_ERROR(append_decoded(id, skip_special, at_start, out));
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = state_->added_id_by_content.find(std::string(token));
  if (it != state_->added_id_by_content.end()) return it->second;
  return state_->backend->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = state_->find_added(id)) return added->content;
  return state_->backend->id_to_token(id);
}

std::optional<std::string> Tokenizer::token_bytes(int32_t id) const {
  std::string out;
  bool at_start = false;
  if (!append_decoded(id, false, at_start, out).ok()) return std::nullopt;
  return out;
}

int32_t Tokenizer::vocab_size() const { return state_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return state_->bos_id; }
const std::vector<int32_t>& Tokenizer::eos_ids() const { return state_->eos_ids; }
const char* Tokenizer::kind() const { return state_->backend->kind(); }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = state_->find_added(id);
  return added && added->special;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

Result<std::string> StreamingDecoder::push(int32_t id) {
  PETREL_RETURN_IF_ERROR(tokenizer_->append_decoded(id, skip_special_, at_start_, pending_));
  const size_t complete = utf8::complete_prefix_length(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  at_start_ = true;
  return out;
}

}  // namespace petrel
