#include "petrel/io/bundle_config.h"

#include <algorithm>
#include <limits>
#include <set>

#include "petrel/io/bundle_part.h"
#include "petrel/util/file.h"

namespace petrel {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

const char* bundle_backend_name(BundleBackend backend) {
  switch (backend) {
    case BundleBackend::kCpu: return "petrel-cpu";
    case BundleBackend::kCuda: return "petrel-cuda";
  }
  return "?";
}

std::optional<BundleBackend> bundle_backend_from_name(std::string_view name) {
  if (name == "petrel-cpu") return BundleBackend::kCpu;
  if (name == "petrel-cuda") return BundleBackend::kCuda;
  return std::nullopt;
}

BundleArchitecture bundle_architecture_from(const LlamaConfig& c) {
  BundleArchitecture a;
  a.family = c.model_type.empty() ? "llama" : c.model_type;
  a.hidden_size = c.hidden_size;
  a.n_layers = c.num_hidden_layers;
  a.n_heads = c.num_attention_heads;
  a.n_kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.ffn_size = c.intermediate_size;
  a.vocab_size = c.vocab_size;
  a.rms_norm_eps = c.rms_norm_eps;
  a.tie_word_embeddings = c.tie_word_embeddings;
  return a;
}

namespace {

// One JSON object of the config: typed accessors that name the source and the dotted key path
// ("dialog.sampler.top-k") in every error, and remember which keys were read so unknown ones are refused.
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string path, const std::string& source)
      : j_(j), path_(std::move(path)), source_(source) {}

  std::string key_path(const std::string& key) const {
    if (key.empty()) return path_;
    return path_.empty() ? key : path_ + "." + key;
  }
  const std::string& source() const { return source_; }
  Status error(const std::string& key, const std::string& message) const {
    return invalid_data(source_ + ": " + key_path(key) + " " + message);
  }

  // nullptr when absent (null counts as absent for optional keys).
  const json* find(const char* key) {
    used_.insert(key);
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  Result<const json*> require(const char* key) {
    const json* v = find(key);
    if (!v) return invalid_data(source_ + ": missing required key " + key_path(key));
    return v;
  }

  Result<ObjectReader> object(const char* key, bool required) {
    const json* v = find(key);
    if (!v) {
      if (required) return invalid_data(source_ + ": missing required key " + key_path(key));
      return ObjectReader(kEmpty(), "", source_);
    }
    if (!v->is_object()) return error(key, "must be an object, found " + v->dump());
    return ObjectReader(*v, key_path(key), source_);
  }
  bool has(const char* key) const {
    used_.insert(key);
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }

  // Genie puts "version": 1 in each of its objects.
  Status version() {
    PETREL_ASSIGN_OR_RETURN(const json* v, require("version"));
    if (!v->is_number_integer()) return error("version", "must be the integer 1, found " + v->dump());
    if (v->get<int64_t>() != 1) {
      return unsupported(source_ + ": " + key_path("version") + " is " + v->dump() + ", petrel reads version 1");
    }
    return ok_status();
  }

  Status integer(const char* key, int64_t* out, bool required, int64_t min, int64_t max = std::numeric_limits<int64_t>::max()) {
    const json* v = find(key);
    if (!v) return required ? invalid_data(source_ + ": missing required key " + key_path(key)) : ok_status();
    const std::string range = max == std::numeric_limits<int64_t>::max()
                                  ? ">= " + std::to_string(min)
                                  : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return error(key, "must be an integer " + range + ", found " + v->dump());
    }
    const int64_t x = v->get<int64_t>();
    if (x < min || x > max) return error(key, "must be an integer " + range + ", found " + v->dump());
    *out = x;
    return ok_status();
  }
  Status number(const char* key, double* out, bool required) {
    const json* v = find(key);
    if (!v) return required ? invalid_data(source_ + ": missing required key " + key_path(key)) : ok_status();
    if (!v->is_number()) return error(key, "must be a number, found " + v->dump());
    *out = v->get<double>();
    return ok_status();
  }
  Status boolean(const char* key, bool* out, bool required) {
    const json* v = find(key);
    if (!v) return required ? invalid_data(source_ + ": missing required key " + key_path(key)) : ok_status();
    if (!v->is_boolean()) return error(key, "must be true or false, found " + v->dump());
    *out = v->get<bool>();
    return ok_status();
  }
  Status string(const char* key, std::string* out, bool required) {
    const json* v = find(key);
    if (!v) return required ? invalid_data(source_ + ": missing required key " + key_path(key)) : ok_status();
    if (!v->is_string()) return error(key, "must be a string, found " + v->dump());
    *out = v->get<std::string>();
    return ok_status();
  }
  // A token id, or a list of them.
  Status token_ids(const char* key, std::vector<int32_t>* out) {
    const json* v = find(key);
    if (!v) return ok_status();
    auto add = [&](const json& x) -> Status {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return error(key, "must hold non-negative integer token ids, found " + v->dump());
      }
      out->push_back(static_cast<int32_t>(x.get<int64_t>()));
      return ok_status();
    };
    if (v->is_array()) {
      for (const json& x : *v) PETREL_RETURN_IF_ERROR(add(x));
      return ok_status();
    }
    return add(*v);
  }

  // Refuses keys that were never asked for: a misspelt key ("top_k") must not be silently ignored.
  Status no_unknown_keys() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (used_.count(it.key())) continue;
      std::string known;
      for (const std::string& k : used_) known += (known.empty() ? "" : ", ") + k;
      return error(it.key(), "is not a known key (known here: " + known + ")");
    }
    return ok_status();
  }

 private:
  static const json& kEmpty() {
    static const json empty = json::object();
    return empty;
  }
  const json& j_;
  std::string path_;
  const std::string& source_;
  mutable std::set<std::string> used_;
};

// The checks that need no file system: relative, no "..", no NUL.
Status check_relative_path(const std::string& relative, const std::string& key, const std::string& source) {
  const std::string what = source + ": " + key + " '" + relative + "'";
  if (relative.empty()) return invalid_data(source + ": " + key + " is an empty path");
  if (relative.find('\0') != std::string::npos) return invalid_data(what + " contains a NUL character");
  const fs::path p(relative);
  if (p.is_absolute() || p.has_root_directory() || p.has_root_name()) {
    return invalid_data(what + " is an absolute path; paths in a bundle config are relative to the bundle directory "
                               "and may not leave it");
  }
  for (const fs::path& component : p) {
    if (component == "..") {
      return invalid_data(what + " contains '..'; paths in a bundle config may not leave the bundle directory");
    }
  }
  return ok_status();
}

Status parse_rope_scaling(ObjectReader& r, RopeConfig* rope) {
  std::string type;
  PETREL_RETURN_IF_ERROR(r.string("rope-type", &type, true));
  if (type == "default" || type == "none") {
    rope->scaling = RopeScalingType::kNone;
  } else if (type == "llama3") {
    rope->scaling = RopeScalingType::kLlama3;
    PETREL_RETURN_IF_ERROR(r.number("factor", &rope->factor, true));
    PETREL_RETURN_IF_ERROR(r.number("low-freq-factor", &rope->low_freq_factor, true));
    PETREL_RETURN_IF_ERROR(r.number("high-freq-factor", &rope->high_freq_factor, true));
    PETREL_RETURN_IF_ERROR(
        r.integer("original-max-position-embeddings", &rope->original_max_position_embeddings, true, 1));
    if (rope->factor <= 0 || rope->low_freq_factor <= 0 || rope->high_freq_factor <= rope->low_freq_factor) {
      return r.error("", "llama3 scaling needs factor > 0 and 0 < low-freq-factor < high-freq-factor");
    }
  } else if (type == "linear") {
    rope->scaling = RopeScalingType::kLinear;
    PETREL_RETURN_IF_ERROR(r.number("factor", &rope->factor, true));
    if (rope->factor <= 0) return r.error("factor", "must be > 0");
  } else {
    return unsupported(r.source() + ": " + r.key_path("rope-type") + " '" + type + "' is not supported (llama3, linear or default)");
  }
  return r.no_unknown_keys();
}

}  // namespace

Result<BundleConfig> parse_bundle_config(const json& j, const std::string& source) {
  if (!j.is_object()) return invalid_data(source + ": not a JSON object");
  BundleConfig c;
  ObjectReader root(j, "", source);

  // dialog
  PETREL_ASSIGN_OR_RETURN(ObjectReader dialog, root.object("dialog", true));
  PETREL_RETURN_IF_ERROR(dialog.version());
  PETREL_RETURN_IF_ERROR(dialog.string("type", &c.dialog_type, true));
  if (c.dialog_type != "basic") {
    return unsupported(source + ": dialog.type '" + c.dialog_type + "' is not supported (only \"basic\")");
  }
  if (const json* stop = dialog.find("stop-sequence")) {
    if (stop->is_string()) {
      c.stop_sequence.push_back(stop->get<std::string>());
    } else if (stop->is_array() && std::all_of(stop->begin(), stop->end(), [](const json& s) { return s.is_string(); })) {
      for (const json& s : *stop) c.stop_sequence.push_back(s.get<std::string>());
    } else {
      return dialog.error("stop-sequence", "must be a string or a list of strings, found " + stop->dump());
    }
  }
  if (dialog.has("max-num-tokens")) {
    int64_t n = 0;
    PETREL_RETURN_IF_ERROR(dialog.integer("max-num-tokens", &n, true, 1));
    c.max_num_tokens = n;
  }

  // dialog.context
  PETREL_ASSIGN_OR_RETURN(ObjectReader context, dialog.object("context", true));
  PETREL_RETURN_IF_ERROR(context.version());
  PETREL_RETURN_IF_ERROR(context.integer("size", &c.context.size, true, 1));
  PETREL_RETURN_IF_ERROR(context.integer("n-vocab", &c.context.n_vocab, true, 1));
  std::vector<int32_t> bos;
  PETREL_RETURN_IF_ERROR(context.token_ids("bos-token", &bos));
  if (bos.size() > 1) return context.error("bos-token", "must be one token id");
  if (!bos.empty()) c.context.bos_token = bos[0];
  PETREL_RETURN_IF_ERROR(context.token_ids("eos-token", &c.context.eos_tokens));
  for (int32_t id : bos) {
    if (id >= c.context.n_vocab) return context.error("bos-token", std::to_string(id) + " is outside n-vocab " + std::to_string(c.context.n_vocab));
  }
  for (int32_t id : c.context.eos_tokens) {
    if (id >= c.context.n_vocab) return context.error("eos-token", std::to_string(id) + " is outside n-vocab " + std::to_string(c.context.n_vocab));
  }
  PETREL_RETURN_IF_ERROR(context.no_unknown_keys());

  // dialog.sampler (optional: Genie's defaults)
  if (dialog.has("sampler")) {
    PETREL_ASSIGN_OR_RETURN(ObjectReader sampler, dialog.object("sampler", true));
    PETREL_RETURN_IF_ERROR(sampler.version());
    BundleSamplerConfig& s = c.sampler;
    if (const json* seed = sampler.find("seed")) {
      if (seed->is_number_unsigned()) {
        s.seed = seed->get<uint64_t>();
      } else if (!(seed->is_number_integer() && seed->get<int64_t>() == -1)) {
        return sampler.error("seed", "must be -1 (from the clock) or a non-negative integer, found " + seed->dump());
      }
    }
    PETREL_RETURN_IF_ERROR(sampler.number("temp", &s.temp, false));
    if (s.temp < 0) return sampler.error("temp", "must be >= 0, found " + std::to_string(s.temp));
    PETREL_RETURN_IF_ERROR(sampler.integer("top-k", &s.top_k, false, 0));
    PETREL_RETURN_IF_ERROR(sampler.number("top-p", &s.top_p, false));
    if (!(s.top_p > 0 && s.top_p <= 1)) return sampler.error("top-p", "must be in (0, 1], found " + std::to_string(s.top_p));
    if (sampler.has("greedy")) {
      bool greedy = false;
      PETREL_RETURN_IF_ERROR(sampler.boolean("greedy", &greedy, true));
      s.greedy = greedy;
    }
    if (sampler.has("token-penalty")) {
      PETREL_ASSIGN_OR_RETURN(ObjectReader penalty, sampler.object("token-penalty", true));
      BundleTokenPenalty p;
      PETREL_RETURN_IF_ERROR(penalty.number("repetition-penalty", &p.repetition_penalty, false));
      if (p.repetition_penalty <= 0) return penalty.error("repetition-penalty", "must be > 0");
      PETREL_RETURN_IF_ERROR(penalty.number("presence-penalty", &p.presence_penalty, false));
      PETREL_RETURN_IF_ERROR(penalty.number("frequency-penalty", &p.frequency_penalty, false));
      PETREL_RETURN_IF_ERROR(penalty.integer("penalize-last-n", &p.penalize_last_n, false, 0));
      PETREL_RETURN_IF_ERROR(penalty.no_unknown_keys());
      s.token_penalty = p;
    }
    PETREL_RETURN_IF_ERROR(sampler.no_unknown_keys());
  }

  // dialog.tokenizer
  PETREL_ASSIGN_OR_RETURN(ObjectReader tokenizer, dialog.object("tokenizer", true));
  PETREL_RETURN_IF_ERROR(tokenizer.version());
  PETREL_RETURN_IF_ERROR(tokenizer.string("path", &c.tokenizer_path, true));
  PETREL_RETURN_IF_ERROR(check_relative_path(c.tokenizer_path, tokenizer.key_path("path"), source));
  PETREL_RETURN_IF_ERROR(tokenizer.no_unknown_keys());

  // dialog.engine
  PETREL_ASSIGN_OR_RETURN(ObjectReader engine, dialog.object("engine", true));
  PETREL_RETURN_IF_ERROR(engine.version());
  if (engine.has("n-threads")) {
    int64_t n = 0;
    PETREL_RETURN_IF_ERROR(engine.integer("n-threads", &n, true, 1, 4096));
    c.n_threads = n;
  }
  PETREL_ASSIGN_OR_RETURN(ObjectReader backend, engine.object("backend", true));
  PETREL_RETURN_IF_ERROR(backend.version());
  std::string backend_type;
  PETREL_RETURN_IF_ERROR(backend.string("type", &backend_type, true));
  auto backend_kind = bundle_backend_from_name(backend_type);
  if (!backend_kind) {
    return unsupported(source + ": " + backend.key_path("type") + " '" + backend_type +
                       "' is not a petrel backend (petrel-cpu or petrel-cuda); Qualcomm backends such as QnnHtp "
                       "need Qualcomm's runtime");
  }
  c.backend = *backend_kind;
  if (const json* options = backend.find(backend_type.c_str())) {
    if (!options->is_object()) return backend.error(backend_type, "must be an object, found " + options->dump());
    c.backend_options = *options;
  }
  PETREL_RETURN_IF_ERROR(backend.no_unknown_keys());

  PETREL_ASSIGN_OR_RETURN(ObjectReader model, engine.object("model", true));
  PETREL_RETURN_IF_ERROR(model.version());
  std::string model_type;
  PETREL_RETURN_IF_ERROR(model.string("type", &model_type, true));
  if (model_type != "binary") {
    return unsupported(source + ": " + model.key_path("type") + " '" + model_type + "' is not supported (only \"binary\")");
  }
  PETREL_ASSIGN_OR_RETURN(ObjectReader binary, model.object("binary", true));
  PETREL_RETURN_IF_ERROR(binary.version());
  PETREL_ASSIGN_OR_RETURN(const json* bins, binary.require("ctx-bins"));
  if (!bins->is_array() || bins->empty()) {
    return binary.error("ctx-bins", "must be a non-empty list of part file names, found " + bins->dump());
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < bins->size(); ++i) {
    const std::string key = binary.key_path("ctx-bins") + "[" + std::to_string(i) + "]";
    const json& b = (*bins)[i];
    if (!b.is_string()) return invalid_data(source + ": " + key + " must be a string, found " + b.dump());
    std::string name = b.get<std::string>();
    PETREL_RETURN_IF_ERROR(check_relative_path(name, key, source));
    if (!seen.insert(fs::path(name).lexically_normal().string()).second) {
      return invalid_data(source + ": " + key + " '" + name + "' is listed twice");
    }
    if (auto named = parse_bundle_part_file_name(fs::path(name).filename().string())) {
      if (named->first != static_cast<int>(i) + 1 || named->second != static_cast<int>(bins->size())) {
        return invalid_data(source + ": " + key + " is '" + name + "', but position " + std::to_string(i + 1) +
                            " of " + std::to_string(bins->size()) + " must hold part " + std::to_string(i + 1) +
                            " of " + std::to_string(bins->size()) + " (parts listed out of order, or missing)");
      }
    }
    c.ctx_bins.push_back(std::move(name));
  }
  PETREL_RETURN_IF_ERROR(binary.no_unknown_keys());

  PETREL_ASSIGN_OR_RETURN(ObjectReader pe, model.object("positional-encoding", true));
  if (pe.has("version")) PETREL_RETURN_IF_ERROR(pe.version());
  std::string pe_type;
  PETREL_RETURN_IF_ERROR(pe.string("type", &pe_type, true));
  if (pe_type != "rope") return unsupported(source + ": " + pe.key_path("type") + " '" + pe_type + "' is not supported (only \"rope\")");
  PETREL_RETURN_IF_ERROR(pe.integer("rope-dim", &c.rope_dim, true, 1));
  PETREL_RETURN_IF_ERROR(pe.number("rope-theta", &c.rope.theta, true));
  if (c.rope.theta <= 0) return pe.error("rope-theta", "must be > 0");
  if (pe.has("rope-scaling")) {
    PETREL_ASSIGN_OR_RETURN(ObjectReader scaling, pe.object("rope-scaling", true));
    PETREL_RETURN_IF_ERROR(parse_rope_scaling(scaling, &c.rope));
  }
  PETREL_RETURN_IF_ERROR(pe.no_unknown_keys());
  PETREL_RETURN_IF_ERROR(model.no_unknown_keys());
  PETREL_RETURN_IF_ERROR(engine.no_unknown_keys());
  PETREL_RETURN_IF_ERROR(dialog.no_unknown_keys());

  // petrel
  PETREL_ASSIGN_OR_RETURN(ObjectReader petrel, root.object("petrel", true));
  int64_t version = 0;
  PETREL_RETURN_IF_ERROR(petrel.integer("version", &version, true, 1));
  if (version != kBundleConfigVersion) {
    return unsupported(source + ": petrel.version is " + std::to_string(version) + ", this petrel reads bundle version " +
                       std::to_string(kBundleConfigVersion) + " (re-export the bundle or update petrel)");
  }
  PETREL_RETURN_IF_ERROR(petrel.string("manifest", &c.manifest_path, false));
  PETREL_RETURN_IF_ERROR(check_relative_path(c.manifest_path, "petrel.manifest", source));
  if (petrel.has("tokenizer-config")) {
    std::string path;
    PETREL_RETURN_IF_ERROR(petrel.string("tokenizer-config", &path, true));
    PETREL_RETURN_IF_ERROR(check_relative_path(path, "petrel.tokenizer-config", source));
    c.tokenizer_config_path = path;
  }
  PETREL_ASSIGN_OR_RETURN(ObjectReader arch, petrel.object("architecture", true));
  BundleArchitecture& a = c.architecture;
  PETREL_RETURN_IF_ERROR(arch.string("family", &a.family, true));
  if (a.family != "llama") {
    return unsupported(source + ": petrel.architecture.family '" + a.family + "' is not supported (only \"llama\")");
  }
  PETREL_RETURN_IF_ERROR(arch.integer("hidden-size", &a.hidden_size, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("n-layers", &a.n_layers, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("n-heads", &a.n_heads, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("n-kv-heads", &a.n_kv_heads, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("head-dim", &a.head_dim, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("ffn-size", &a.ffn_size, true, 1));
  PETREL_RETURN_IF_ERROR(arch.integer("vocab-size", &a.vocab_size, true, 1));
  PETREL_RETURN_IF_ERROR(arch.number("rms-norm-eps", &a.rms_norm_eps, true));
  if (a.rms_norm_eps <= 0) return arch.error("rms-norm-eps", "must be > 0");
  PETREL_RETURN_IF_ERROR(arch.boolean("tie-word-embeddings", &a.tie_word_embeddings, true));
  PETREL_RETURN_IF_ERROR(arch.no_unknown_keys());
  PETREL_RETURN_IF_ERROR(petrel.no_unknown_keys());
  PETREL_RETURN_IF_ERROR(root.no_unknown_keys());

  // Consistency between Genie's keys and the architecture.
  if (a.n_heads % a.n_kv_heads != 0) {
    return invalid_data(source + ": petrel.architecture.n-heads (" + std::to_string(a.n_heads) +
                        ") is not a multiple of n-kv-heads (" + std::to_string(a.n_kv_heads) + ")");
  }
  if (c.rope_dim * 2 != a.head_dim) {
    return invalid_data(source + ": dialog.engine.model.positional-encoding.rope-dim is " + std::to_string(c.rope_dim) +
                        ", expected head-dim / 2 = " + std::to_string(a.head_dim / 2) +
                        " (petrel.architecture.head-dim is " + std::to_string(a.head_dim) + ")");
  }
  if (c.context.n_vocab != a.vocab_size) {
    return invalid_data(source + ": dialog.context.n-vocab is " + std::to_string(c.context.n_vocab) +
                        ", but petrel.architecture.vocab-size is " + std::to_string(a.vocab_size));
  }
  return c;
}

ordered_json bundle_config_to_json(const BundleConfig& c) {
  ordered_json context;
  context["version"] = 1;
  context["size"] = c.context.size;
  context["n-vocab"] = c.context.n_vocab;
  if (c.context.bos_token) context["bos-token"] = *c.context.bos_token;
  context["eos-token"] = c.context.eos_tokens;

  ordered_json sampler;
  sampler["version"] = 1;
  if (c.sampler.seed) sampler["seed"] = *c.sampler.seed;
  else sampler["seed"] = -1;
  sampler["temp"] = c.sampler.temp;
  sampler["top-k"] = c.sampler.top_k;
  sampler["top-p"] = c.sampler.top_p;
  if (c.sampler.greedy) sampler["greedy"] = *c.sampler.greedy;
  if (c.sampler.token_penalty) {
    const BundleTokenPenalty& p = *c.sampler.token_penalty;
    sampler["token-penalty"] = {{"repetition-penalty", p.repetition_penalty},
                                {"presence-penalty", p.presence_penalty},
                                {"frequency-penalty", p.frequency_penalty},
                                {"penalize-last-n", p.penalize_last_n}};
  }

  ordered_json backend;
  backend["version"] = 1;
  backend["type"] = bundle_backend_name(c.backend);
  if (c.backend_options.is_object() && !c.backend_options.empty()) {
    backend[bundle_backend_name(c.backend)] = ordered_json::parse(c.backend_options.dump());
  }

  ordered_json pe;
  pe["type"] = "rope";
  pe["rope-dim"] = c.rope_dim;
  pe["rope-theta"] = c.rope.theta;
  if (c.rope.scaling == RopeScalingType::kLlama3) {
    pe["rope-scaling"] = {{"rope-type", "llama3"},
                          {"factor", c.rope.factor},
                          {"low-freq-factor", c.rope.low_freq_factor},
                          {"high-freq-factor", c.rope.high_freq_factor},
                          {"original-max-position-embeddings", c.rope.original_max_position_embeddings}};
  } else if (c.rope.scaling == RopeScalingType::kLinear) {
    pe["rope-scaling"] = {{"rope-type", "linear"}, {"factor", c.rope.factor}};
  }

  ordered_json model;
  model["version"] = 1;
  model["type"] = "binary";
  model["binary"] = {{"version", 1}, {"ctx-bins", c.ctx_bins}};
  model["positional-encoding"] = std::move(pe);

  ordered_json engine;
  engine["version"] = 1;
  if (c.n_threads) engine["n-threads"] = *c.n_threads;
  engine["backend"] = std::move(backend);
  engine["model"] = std::move(model);

  ordered_json dialog;
  dialog["version"] = 1;
  dialog["type"] = c.dialog_type;
  if (!c.stop_sequence.empty()) dialog["stop-sequence"] = c.stop_sequence;
  if (c.max_num_tokens) dialog["max-num-tokens"] = *c.max_num_tokens;
  dialog["context"] = std::move(context);
  dialog["sampler"] = std::move(sampler);
  dialog["tokenizer"] = {{"version", 1}, {"path", c.tokenizer_path}};
  dialog["engine"] = std::move(engine);

  const BundleArchitecture& a = c.architecture;
  ordered_json arch;
  arch["family"] = a.family;
  arch["hidden-size"] = a.hidden_size;
  arch["n-layers"] = a.n_layers;
  arch["n-heads"] = a.n_heads;
  arch["n-kv-heads"] = a.n_kv_heads;
  arch["head-dim"] = a.head_dim;
  arch["ffn-size"] = a.ffn_size;
  arch["vocab-size"] = a.vocab_size;
  arch["rms-norm-eps"] = a.rms_norm_eps;
  arch["tie-word-embeddings"] = a.tie_word_embeddings;

  ordered_json petrel;
  petrel["version"] = kBundleConfigVersion;
  petrel["manifest"] = c.manifest_path;
  if (c.tokenizer_config_path) petrel["tokenizer-config"] = *c.tokenizer_config_path;
  petrel["architecture"] = std::move(arch);

  ordered_json root;
  root["dialog"] = std::move(dialog);
  root["petrel"] = std::move(petrel);
  return root;
}

Result<fs::path> resolve_bundle_path(const fs::path& bundle_dir, const std::string& relative, const std::string& key,
                                     const std::string& source) {
  PETREL_RETURN_IF_ERROR(check_relative_path(relative, key, source));
  const std::string what = source + ": " + key + " '" + relative + "'";
  std::error_code ec;
  fs::path root = fs::weakly_canonical(bundle_dir, ec);
  if (ec) return io_error(source + ": cannot resolve the bundle directory " + bundle_dir.string() + ": " + ec.message());
  if (!root.has_filename() && root.has_parent_path() && root != root.root_path()) root = root.parent_path();
  // A dangling symbolic link on the way cannot be resolved by weakly_canonical; refuse it rather than trust it.
  fs::path walk = bundle_dir;
  for (const fs::path& component : fs::path(relative)) {
    walk /= component;
    if (fs::is_symlink(fs::symlink_status(walk, ec)) && !fs::exists(walk, ec)) {
      return invalid_data(what + ": " + walk.string() + " is a dangling symbolic link (to " +
                          fs::read_symlink(walk, ec).string() + ")");
    }
  }
  fs::path target = fs::weakly_canonical(bundle_dir / relative, ec);
  if (ec) return invalid_data(what + " cannot be resolved: " + ec.message());
  auto [r, t] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  if (r != root.end() || t == target.end()) {
    return invalid_data(what + " resolves to " + target.string() + ", outside the bundle directory " + root.string() +
                        " (a symbolic link?); paths in a bundle config may not leave the bundle");
  }
  return bundle_dir / relative;
}

namespace {

Status resolve_all_paths(const BundleConfig& c, const fs::path& dir, const std::string& source) {
  PETREL_RETURN_IF_ERROR(resolve_bundle_path(dir, c.tokenizer_path, "dialog.tokenizer.path", source).status());
  for (size_t i = 0; i < c.ctx_bins.size(); ++i) {
    PETREL_RETURN_IF_ERROR(resolve_bundle_path(dir, c.ctx_bins[i],
                                               "dialog.engine.model.binary.ctx-bins[" + std::to_string(i) + "]", source)
                               .status());
  }
  PETREL_RETURN_IF_ERROR(resolve_bundle_path(dir, c.manifest_path, "petrel.manifest", source).status());
  if (c.tokenizer_config_path) {
    PETREL_RETURN_IF_ERROR(resolve_bundle_path(dir, *c.tokenizer_config_path, "petrel.tokenizer-config", source).status());
  }
  return ok_status();
}

}  // namespace

Result<BundleConfig> load_bundle_config(const fs::path& config_json_or_dir) {
  std::error_code ec;
  fs::path file, dir;
  if (fs::is_directory(config_json_or_dir, ec)) {
    dir = config_json_or_dir;
    file = dir / kBundleConfigFileName;
  } else {
    file = config_json_or_dir;
    dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  }
  if (!fs::exists(file, ec)) {
    return not_found(file.string() + ": no such file (expected a bundle directory or its config.json)");
  }
  PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(file));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_data(file.string() + ": not valid JSON: " + e.what());
  }
  PETREL_ASSIGN_OR_RETURN(BundleConfig config, parse_bundle_config(j, file.string()));
  PETREL_RETURN_IF_ERROR(resolve_all_paths(config, dir, file.string()));
  config.bundle_dir = dir;
  return config;
}

Status write_bundle_config(const BundleConfig& config, const fs::path& bundle_dir) {
  const fs::path file = bundle_dir / kBundleConfigFileName;
  std::string text;
  json reparsed;
  try {
    text = bundle_config_to_json(config).dump(2) + "\n";
    reparsed = json::parse(text);
  } catch (const json::exception& e) {
    return invalid_argument(file.string() + ": cannot serialize the bundle config: " + e.what());
  }
  // Whatever petrel writes, petrel must read back: refuse to write a config the reader would reject.
  Result<BundleConfig> check = parse_bundle_config(reparsed, file.string());
  if (!check.ok()) return invalid_argument("refusing to write an invalid bundle config: " + check.status().message());
  PETREL_RETURN_IF_ERROR(resolve_all_paths(*check, bundle_dir, file.string()));
  return write_file_atomic(file, text);
}

}  // namespace petrel
