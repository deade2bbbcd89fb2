// SentencePiece checkpoints (tokenizer.model, Llama 2 style) through libsentencepiece, behind the same
// TokenizerBackend as byte-level BPE. Control pieces (<s>, </s>) and <unk> become special added tokens,
// so parse_special and untrusted ranges work the same way for both kinds.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <filesystem>

#include "petrel/text/tokenizer_state.h"

namespace petrel::text_internal {

namespace {

constexpr std::string_view kWordBoundary = "\xE2\x96\x81";  // U+2581, SentencePiece's space

class SentencePieceBackend final : public TokenizerBackend {
 public:
  Status load(const std::string& path) {
    const auto status = processor_.Load(path);
    if (!status.ok()) return invalid_data(path + ": not a usable SentencePiece model: " + status.ToString());
    // The model's normalizer adds a dummy "▁" in front of the text when it encodes; decoding drops it
    // again. The spec is not exposed by the public header, so ask the model: does "a" start with "▁"?
    std::vector<std::string> pieces;
    if (processor_.Encode("a", &pieces).ok() && !pieces.empty()) {
      dummy_prefix_ = std::string_view(pieces[0]).substr(0, kWordBoundary.size()) == kWordBoundary;
    }
    return ok_status();
  }

  const sentencepiece::SentencePieceProcessor& processor() const { return processor_; }

  Status encode_segment(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) return internal_error("SentencePiece could not encode the text: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
    return ok_status();
  }

  bool append_token_bytes(int32_t id, bool at_start, std::string& out) const override {
    if (id < 0 || id >= processor_.GetPieceSize()) return false;
    if (processor_.IsControl(id)) return true;  // decodes to nothing, as in SentencePiece itself
    if (processor_.IsUnknown(id)) {
      out.append(" \xE2\x81\x87 ");  // SentencePiece's default surface for <unk>: " ⁇ "
      return true;
    }
    const std::string& piece = processor_.IdToPiece(id);
    if (processor_.IsByte(id)) {
      // "<0xAB>"
      if (piece.size() == 6) out.push_back(static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
      return true;
    }
    size_t pos = 0;
    bool first = true;
    while (pos < piece.size()) {
      if (piece.compare(pos, kWordBoundary.size(), kWordBoundary) == 0) {
        if (!(first && at_start && dummy_prefix_)) out.push_back(' ');
        pos += kWordBoundary.size();
      } else {
        out.push_back(piece[pos++]);
      }
      first = false;
    }
    return true;
  }

  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    // PieceToId answers unk_id for any piece it does not know.
    if (id < 0 || (id == processor_.unk_id() && processor_.IdToPiece(id) != token)) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || id >= processor_.GetPieceSize()) return std::nullopt;
    return processor_.IdToPiece(id);
  }
  int32_t vocab_size() const override { return processor_.GetPieceSize(); }
  const char* kind() const override { return "sentencepiece"; }

 private:
  sentencepiece::SentencePieceProcessor processor_;
  bool dummy_prefix_ = false;
};

}  // namespace

Result<std::unique_ptr<TokenizerState>> read_sentencepiece_model(const std::string& model_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec)) return not_found(model_path + ": no such file");
  auto backend = std::make_unique<SentencePieceBackend>();
  PETREL_RETURN_IF_ERROR(backend->load(model_path));
  const auto& sp = backend->processor();
  auto state = std::make_unique<TokenizerState>();
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    if (sp.IsControl(id) || sp.IsUnknown(id)) {
      AddedToken token;
      token.id = id;
      token.content = sp.IdToPiece(id);
      token.special = true;
      if (!token.content.empty()) state->added_tokens.push_back(std::move(token));
    }
  }
  if (sp.bos_id() >= 0) {
    state->bos_id = sp.bos_id();
    state->prefix_ids = {sp.bos_id()};  // Llama 2 adds BOS and no EOS; tokenizer_config.json may change it
  }
  if (sp.eos_id() >= 0) state->eos_ids.push_back(sp.eos_id());
  state->backend = std::move(backend);
  return state;
}

}  // namespace petrel::text_internal
