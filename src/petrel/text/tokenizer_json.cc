// Reads a Hugging Face tokenizer.json holding a byte-level BPE (Llama 3.x, GPT-2 style) into a
// TokenizerState. Every refusal names the file and the JSON path of the offending value.
#include <nlohmann/json.hpp>

#include "petrel/text/bpe_model.h"
#include "petrel/text/bpe_pretokenizer.h"
#include "petrel/text/tokenizer_state.h"

namespace petrel::text_internal {

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer regex, which a ByteLevel pre-tokenizer with use_regex=true applies.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class BpeBackend final : public TokenizerBackend {
 public:
  BpeBackend(BpeModel model, PreTokenizer pre_tokenizer)
      : model_(std::move(model)), pre_tokenizer_(std::move(pre_tokenizer)) {}

  Status encode_segment(std::string_view text, std::vector<int32_t>& out) const override {
    return pre_tokenizer_.run(text, [&](std::string_view piece) { model_.encode(piece, out); });
  }
  bool append_token_bytes(int32_t id, bool, std::string& out) const override {
    if (!model_.has_token(id)) return false;
    out.append(model_.token_bytes(id));
    return true;
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto bytes = byte_level_to_bytes(token);
    if (!bytes) return std::nullopt;
    return model_.find(*bytes);
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (!model_.has_token(id)) return std::nullopt;
    return bytes_to_byte_level(model_.token_bytes(id));
  }
  int32_t vocab_size() const override { return model_.id_limit(); }
  const char* kind() const override { return "bpe"; }

 private:
  BpeModel model_;
  PreTokenizer pre_tokenizer_;
};

// Error messages: "<source>: <json path>: <what>".
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  Status bad(const std::string& path, const std::string& what) const {
    return invalid_data(source_ + ": " + path + ": " + what);
  }
  Status refuse(const std::string& path, const std::string& what) const {
    return unsupported(source_ + ": " + path + ": " + what);
  }

  // node[key] as a bool, `fallback` when absent or null.
  Result<bool> get_bool(const Json& node, const std::string& path, const char* key, bool fallback) const {
    auto it = node.find(key);
    if (it == node.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return bad(path + "." + key, "expected true or false, found " + std::string(it->type_name()));
    return it->get<bool>();
  }
  Result<std::string> get_string(const Json& node, const std::string& path, const char* key) const {
    auto it = node.find(key);
    if (it == node.end()) return bad(path + "." + key, "missing");
    if (!it->is_string()) return bad(path + "." + key, "expected a string, found " + std::string(it->type_name()));
    return it->get<std::string>();
  }
  Result<int32_t> to_id(const Json& value, const std::string& path) const {
    return to_id(value, [&] { return path; });
  }
  // The same with the path made only for an error (the vocabulary has 128K entries).
  template <typename PathFn>
  Result<int32_t> to_id(const Json& value, const PathFn& path) const {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > INT32_MAX) {
      return bad(path(), "expected a token id (a non-negative integer), found " + value.dump());
    }
    return static_cast<int32_t>(value.get<int64_t>());
  }

 private:
  const std::string& source_;
};

std::string json_quoted(std::string_view s) { return Json(std::string(s)).dump(); }

// The type tag of a component object ("BPE", "Split", ...), or "" when absent.
std::string type_of(const Json& node) {
  auto it = node.find("type");
  return it != node.end() && it->is_string() ? it->get<std::string>() : std::string();
}

struct PreTokenizerInfo {
  std::vector<PreTokenizer::Stage> stages;
  bool byte_level = false;
};

Status read_pre_tokenizer(const Reader& r, const Json& node, const std::string& path, PreTokenizerInfo& info) {
  if (node.is_null()) return ok_status();
  if (!node.is_object()) return r.bad(path, "expected an object, found " + std::string(node.type_name()));
  const std::string type = type_of(node);
  if (type == "Sequence") {
    auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array()) return r.bad(path + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      PETREL_RETURN_IF_ERROR(read_pre_tokenizer(r, (*it)[i], path + ".pretokenizers[" + std::to_string(i) + "]", info));
    }
    return ok_status();
  }
  if (type == "Split") {
    auto pattern_it = node.find("pattern");
    if (pattern_it == node.end() || !pattern_it->is_object()) {
      return r.bad(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    bool literal = false;
    std::string pattern;
    if (auto re = pattern_it->find("Regex"); re != pattern_it->end() && re->is_string()) {
      pattern = re->get<std::string>();
    } else if (auto s = pattern_it->find("String"); s != pattern_it->end() && s->is_string()) {
      pattern = s->get<std::string>();
      literal = true;
    } else {
      return r.bad(path + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    PETREL_ASSIGN_OR_RETURN(std::string behavior_name, r.get_string(node, path, "behavior"));
    SplitBehavior behavior;
    if (behavior_name == "Isolated") behavior = SplitBehavior::kIsolated;
    else if (behavior_name == "Removed") behavior = SplitBehavior::kRemoved;
    else if (behavior_name == "MergedWithPrevious") behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior_name == "MergedWithNext") behavior = SplitBehavior::kMergedWithNext;
    else if (behavior_name == "Contiguous") behavior = SplitBehavior::kContiguous;
    else return r.refuse(path + ".behavior", "unknown split behavior " + json_quoted(behavior_name));
    PETREL_ASSIGN_OR_RETURN(bool invert, r.get_bool(node, path, "invert", false));
    auto splitter = RegexSplitter::compile(pattern, literal, behavior, invert);
    if (!splitter.ok()) return r.bad(path + ".pattern", splitter.status().message());
    info.stages.push_back({std::move(splitter).value(), false});
    return ok_status();
  }
  if (type == "ByteLevel") {
    // Hugging Face's defaults when the fields are absent.
    PETREL_ASSIGN_OR_RETURN(bool add_prefix_space, r.get_bool(node, path, "add_prefix_space", true));
    PETREL_ASSIGN_OR_RETURN(bool use_regex, r.get_bool(node, path, "use_regex", true));
    PreTokenizer::Stage stage;
    stage.add_prefix_space = add_prefix_space;
    if (use_regex) {
      PETREL_ASSIGN_OR_RETURN(stage.splitter, RegexSplitter::compile(kGpt2Pattern, false, SplitBehavior::kIsolated, false));
    }
    if (stage.splitter || stage.add_prefix_space) info.stages.push_back(std::move(stage));
    info.byte_level = true;
    return ok_status();
  }
  return r.refuse(path + ".type", "pre-tokenizer " + json_quoted(type) +
                                      " is not supported (petrel reads Sequence, Split and ByteLevel)");
}

Status check_decoder(const Reader& r, const Json& node, const std::string& path, bool* byte_level) {
  if (node.is_null()) return ok_status();
  const std::string type = type_of(node);
  if (type == "ByteLevel") {
    *byte_level = true;
    return ok_status();
  }
  if (type == "Sequence") {
    auto it = node.find("decoders");
    if (it == node.end() || !it->is_array()) return r.bad(path + ".decoders", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      PETREL_RETURN_IF_ERROR(check_decoder(r, (*it)[i], path + ".decoders[" + std::to_string(i) + "]", byte_level));
    }
    return ok_status();
  }
  return r.refuse(path + ".type", "decoder " + json_quoted(type) + " is not supported (petrel decodes byte-level BPE)");
}

Status check_normalizer(const Reader& r, const Json& node, const std::string& path) {
  if (node.is_null()) return ok_status();
  if (type_of(node) == "Sequence") {
    auto it = node.find("normalizers");
    if (it != node.end() && it->is_array() && it->empty()) return ok_status();
  }
  return r.refuse(path + ".type", "normalizer " + json_quoted(type_of(node)) +
                                      " is not supported (byte-level BPE tokenizers have none)");
}

Result<BpeModel> read_model(const Reader& r, const Json& root) {
  auto model_it = root.find("model");
  if (model_it == root.end() || model_it->is_null()) return r.bad("model", "missing");
  const Json& model = *model_it;
  if (!model.is_object()) return r.bad("model", "expected an object, found " + std::string(model.type_name()));
  const std::string type = type_of(model);
  if (!type.empty() && type != "BPE") {
    return r.refuse("model.type", "model type " + json_quoted(type) +
                                      " is not supported (petrel reads BPE in tokenizer.json and SentencePiece "
                                      "in tokenizer.model)");
  }
  PETREL_ASSIGN_OR_RETURN(bool byte_fallback, r.get_bool(model, "model", "byte_fallback", false));
  if (byte_fallback) {
    return r.refuse("model.byte_fallback", "SentencePiece-style BPE (byte_fallback) is not supported in "
                                           "tokenizer.json; petrel reads such checkpoints from tokenizer.model");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    if (it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return r.refuse(std::string("model.") + key, "not supported for byte-level BPE");
    }
  }
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0)) {
    return r.refuse("model.dropout", "BPE dropout is not supported (it is for training)");
  }
  PETREL_ASSIGN_OR_RETURN(bool ignore_merges, r.get_bool(model, "model", "ignore_merges", false));

  BpeModel bpe;
  bpe.set_ignore_merges(ignore_merges);
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) return r.bad("model.vocab", "expected an object of token -> id");
  // Paths in error messages are built only when there is an error: 128K tokens and 280K merges.
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    auto path = [&] { return "model.vocab[" + json_quoted(it.key()) + "]"; };
    PETREL_ASSIGN_OR_RETURN(int32_t id, r.to_id(it.value(), path));
    auto bytes = byte_level_to_bytes(it.key());
    if (!bytes || bytes->empty()) {
      return r.refuse(path(), "not a byte-level token (a character outside GPT-2's byte alphabet); petrel reads "
                              "byte-level BPE vocabularies");
    }
    if (!bpe.add_token(id, std::move(*bytes))) return r.bad(path(), "id " + std::to_string(id) + " is used twice");
  }
  if (auto duplicate = bpe.finish_vocab()) {
    return r.bad("model.vocab", "token " + json_quoted(bytes_to_byte_level(*duplicate)) + " appears twice");
  }
  if (int missing = bpe.missing_byte(); missing >= 0) {
    return r.bad("model.vocab", "has no token for byte " + std::to_string(missing) + " (" +
                                    json_quoted(bytes_to_byte_level(std::string(1, static_cast<char>(missing)))) +
                                    "), so some text could not be encoded");
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) return r.bad("model.merges", "expected an array");
  // 280K merges in Llama 3's file: the strings are views into the JSON and the byte buffers are reused.
  std::string left_bytes, right_bytes, joined;
  for (size_t i = 0; i < merges_it->size(); ++i) {
    const Json& merge = (*merges_it)[i];
    auto path = [i] { return "model.merges[" + std::to_string(i) + "]"; };
    // Two spellings: "a b" (older files) and ["a", "b"] (tokenizers >= 0.20, which allows spaces).
    std::string_view left_text, right_text;
    if (merge.is_string()) {
      const std::string& s = merge.get_ref<const std::string&>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 >= s.size()) {
        return r.bad(path(), "expected \"left right\", found " + json_quoted(s));
      }
      left_text = std::string_view(s).substr(0, space);
      right_text = std::string_view(s).substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left_text = merge[0].get_ref<const std::string&>();
      right_text = merge[1].get_ref<const std::string&>();
    } else {
      return r.bad(path(), "expected \"left right\" or [\"left\", \"right\"], found " + merge.dump());
    }
    std::optional<int32_t> left = byte_level_to_bytes(left_text, left_bytes) ? bpe.find(left_bytes) : std::nullopt;
    std::optional<int32_t> right = byte_level_to_bytes(right_text, right_bytes) ? bpe.find(right_bytes) : std::nullopt;
    if (!left) return r.bad(path(), "token " + json_quoted(left_text) + " is not in model.vocab");
    if (!right) return r.bad(path(), "token " + json_quoted(right_text) + " is not in model.vocab");
    joined.assign(left_bytes).append(right_bytes);
    std::optional<int32_t> merged = bpe.find(joined);
    if (!merged) {
      return r.bad(path(), "the merged token " + json_quoted(std::string(left_text) + std::string(right_text)) +
                               " is not in model.vocab");
    }
    bpe.add_merge(*left, *right, *merged);
  }
  return bpe;
}

Status read_added_tokens(const Reader& r, const Json& root, TokenizerState& state) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return ok_status();
  if (!it->is_array()) return r.bad("added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& entry = (*it)[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (!entry.is_object()) return r.bad(path, "expected an object");
    AddedToken token;
    auto id_it = entry.find("id");
    if (id_it == entry.end()) return r.bad(path + ".id", "missing");
    PETREL_ASSIGN_OR_RETURN(token.id, r.to_id(*id_it, path + ".id"));
    PETREL_ASSIGN_OR_RETURN(token.content, r.get_string(entry, path, "content"));
    if (token.content.empty()) return r.bad(path + ".content", "empty");
    PETREL_ASSIGN_OR_RETURN(token.special, r.get_bool(entry, path, "special", false));
    PETREL_ASSIGN_OR_RETURN(token.lstrip, r.get_bool(entry, path, "lstrip", false));
    PETREL_ASSIGN_OR_RETURN(token.rstrip, r.get_bool(entry, path, "rstrip", false));
    PETREL_ASSIGN_OR_RETURN(token.single_word, r.get_bool(entry, path, "single_word", false));
    state.added_tokens.push_back(std::move(token));
  }
  return ok_status();
}

// Collects the ids the post-processor puts before and after a single sequence.
Status read_post_processor(const Reader& r, const Json& node, const std::string& path, TokenizerState& state) {
  if (node.is_null()) return ok_status();
  const std::string type = type_of(node);
  if (type == "ByteLevel") return ok_status();  // only trims offsets, which petrel does not report
  if (type == "Sequence") {
    auto it = node.find("processors");
    if (it == node.end() || !it->is_array()) return r.bad(path + ".processors", "expected an array");
    for (size_t i = 0; i < it->size(); ++i) {
      PETREL_RETURN_IF_ERROR(read_post_processor(r, (*it)[i], path + ".processors[" + std::to_string(i) + "]", state));
    }
    return ok_status();
  }
  if (type == "TemplateProcessing") {
    auto single_it = node.find("single");
    if (single_it == node.end() || !single_it->is_array()) return r.bad(path + ".single", "expected an array");
    auto specials_it = node.find("special_tokens");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single_it->size(); ++i) {
      const Json& piece = (*single_it)[i];
      const std::string piece_path = path + ".single[" + std::to_string(i) + "]";
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      auto special = piece.find("SpecialToken");
      if (special == piece.end() || !special->is_object()) {
        return r.bad(piece_path, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
      PETREL_ASSIGN_OR_RETURN(std::string name, r.get_string(*special, piece_path + ".SpecialToken", "id"));
      if (specials_it == node.end() || !specials_it->is_object() || !specials_it->contains(name)) {
        return r.bad(piece_path, "special token " + json_quoted(name) + " is not defined in " + path + ".special_tokens");
      }
      const Json& definition = (*specials_it)[name];
      const std::string ids_path = path + ".special_tokens[" + json_quoted(name) + "].ids";
      auto ids_it = definition.find("ids");
      if (ids_it == definition.end() || !ids_it->is_array()) return r.bad(ids_path, "expected an array of ids");
      for (size_t k = 0; k < ids_it->size(); ++k) {
        PETREL_ASSIGN_OR_RETURN(int32_t id, r.to_id((*ids_it)[k], ids_path + "[" + std::to_string(k) + "]"));
        (seen_sequence ? after : before).push_back(id);
      }
    }
    // A later processor wraps the result of an earlier one.
    state.prefix_ids.insert(state.prefix_ids.begin(), before.begin(), before.end());
    state.suffix_ids.insert(state.suffix_ids.end(), after.begin(), after.end());
    return ok_status();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = node.find(key);
      if (it == node.end() || !it->is_array() || it->size() != 2) {
        return r.bad(path + "." + key, "expected [token, id]");
      }
      PETREL_ASSIGN_OR_RETURN(int32_t id, r.to_id((*it)[1], path + "." + key + "[1]"));
      if (std::string(key) == "cls") state.prefix_ids.insert(state.prefix_ids.begin(), id);
      else state.suffix_ids.push_back(id);
    }
    return ok_status();
  }
  return r.refuse(path + ".type", "post-processor " + json_quoted(type) +
                                      " is not supported (petrel reads TemplateProcessing, ByteLevel, Sequence, "
                                      "BertProcessing, RobertaProcessing)");
}

Result<std::unique_ptr<TokenizerState>> read_root(const Reader& r, const Json& root) {
  if (!root.is_object()) return r.bad("(root)", "expected a JSON object, found " + std::string(root.type_name()));
  auto state = std::make_unique<TokenizerState>();
  const Json null_json;
  const auto member = [&](const char* key) -> const Json& {
    auto it = root.find(key);
    return it == root.end() ? null_json : *it;
  };
  PETREL_RETURN_IF_ERROR(check_normalizer(r, member("normalizer"), "normalizer"));
  PETREL_ASSIGN_OR_RETURN(BpeModel model, read_model(r, root));
  PreTokenizerInfo pre;
  PETREL_RETURN_IF_ERROR(read_pre_tokenizer(r, member("pre_tokenizer"), "pre_tokenizer", pre));
  bool byte_level_decoder = false;
  PETREL_RETURN_IF_ERROR(check_decoder(r, member("decoder"), "decoder", &byte_level_decoder));
  if (!pre.byte_level && !byte_level_decoder) {
    return r.refuse("pre_tokenizer", "neither the pre_tokenizer nor the decoder is ByteLevel; petrel reads "
                                     "byte-level BPE only");
  }
  PETREL_RETURN_IF_ERROR(read_added_tokens(r, root, *state));
  PETREL_RETURN_IF_ERROR(read_post_processor(r, member("post_processor"), "post_processor", *state));
  state->backend = std::make_unique<BpeBackend>(std::move(model), PreTokenizer(std::move(pre.stages)));
  return state;
}

}  // namespace

Result<std::unique_ptr<TokenizerState>> read_tokenizer_json(std::string_view json_text, const std::string& source) {
  const Reader reader(source);
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number too large
    // e.byte says where the JSON broke off (a truncated download shows up as "unexpected end of input").
    return invalid_data(source + ": not valid JSON: " + e.what());
  }
  try {
    return read_root(reader, root);
  } catch (const Json::exception& e) {
    // Every access above checks types first; this is a guard so that no exception leaves the library.
    return invalid_data(source + ": unexpected JSON structure: " + e.what());
  }
}

}  // namespace petrel::text_internal
