#include "petrel/io/export.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <ctime>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "petrel/io/bundle.h"
#include "petrel/io/bundle_part.h"
#include "petrel/io/hf_config.h"
#include "petrel/io/safetensors.h"
#include "petrel/kernels/cpu/gptq_matmul.h"
#include "petrel/util/file.h"
#include "petrel/util/progress.h"

namespace petrel {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

Result<std::vector<size_t>> balance_parts(const std::vector<uint64_t>& item_bytes, int parts) {
  const size_t n = item_bytes.size();
  if (parts <= 0) return invalid_argument("--parts must be positive");
  if (static_cast<size_t>(parts) > n) {
    return invalid_argument("cannot split " + std::to_string(n) + " groups of tensors (embedding, each layer, head) into " +
                            std::to_string(parts) + " parts");
  }
  std::vector<uint64_t> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + item_bytes[i];
  // best[p][i]: the smallest possible largest part when the first i items form p parts.
  const uint64_t kInf = std::numeric_limits<uint64_t>::max();
  std::vector<std::vector<uint64_t>> best(parts + 1, std::vector<uint64_t>(n + 1, kInf));
  std::vector<std::vector<size_t>> cut(parts + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (int p = 1; p <= parts; ++p) {
    for (size_t i = p; i <= n; ++i) {
      for (size_t j = p - 1; j < i; ++j) {
        if (best[p - 1][j] == kInf) continue;
        const uint64_t cost = std::max(best[p - 1][j], prefix[i] - prefix[j]);
        if (cost < best[p][i]) {
          best[p][i] = cost;
          cut[p][i] = j;
        }
      }
    }
  }
  std::vector<size_t> starts(parts);
  size_t i = n;
  for (int p = parts; p >= 1; --p) {
    starts[p - 1] = cut[p][i];
    i = cut[p][i];
  }
  return starts;
}

namespace {

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Fingerprint of the source checkpoint: its config.json and every safetensors header (names, dtypes, shapes,
// offsets) and file size. Cheap, and changes whenever the tensors' layout or the config changes.
Result<std::string> checkpoint_fingerprint(const fs::path& dir, const SafetensorsCheckpoint& ckpt) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  PETREL_ASSIGN_OR_RETURN(std::string config, read_text_file(dir / "config.json"));
  XXH3_64bits_update(state, config.data(), config.size());
  std::vector<const SafetensorsFile*> files;
  for (const auto& f : ckpt.files()) files.push_back(f.get());
  std::sort(files.begin(), files.end(), [](auto* a, auto* b) { return a->path() < b->path(); });
  for (const SafetensorsFile* f : files) {
    const uint8_t* data = f->map().data();
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
    XXH3_64bits_update(state, data, 8 + header_len);
    const uint64_t size = f->file_size();
    XXH3_64bits_update(state, &size, sizeof size);
  }
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return "xxh3:" + hex64(digest);
}

// GPTQ qweight [words, rows] of a CPU bundle is written with its word rows padded to the stride the CPU
// kernels read fastest (cpu::preferred_word_row_stride: rows + 64 for Llama's 4 KiB-multiple sizes, up to 27%
// faster GEMVs); everything else, and everything of a CUDA bundle, as the checkpoint stores it.
Status write_bundle_tensor(BundlePartWriter& writer, const TensorView& v, BundleBackend backend) {
  const bool qweight = v.name.ends_with(".qweight") && v.dtype == DType::kI32 && v.shape.size() == 2;
  const int64_t stride = qweight && backend == BundleBackend::kCpu ? cpu::preferred_word_row_stride(v.shape[1]) : 0;
  if (!qweight || stride == v.shape[1] || stride <= 0) {
    return writer.write_tensor(BundleTensorSpec::plain(v.name, v.dtype, v.shape), v.data);
  }
  PETREL_RETURN_IF_ERROR(writer.begin_tensor(BundleTensorSpec::padded_rows(v.name, v.dtype, v.shape, stride)));
  const size_t row_bytes = static_cast<size_t>(v.shape[1]) * 4;
  const std::vector<char> zeros(static_cast<size_t>(stride - v.shape[1]) * 4, 0);
  for (int64_t k = 0; k < v.shape[0]; ++k) {
    PETREL_RETURN_IF_ERROR(writer.write(static_cast<const char*>(v.data) + k * row_bytes, row_bytes));
    PETREL_RETURN_IF_ERROR(writer.write(zeros.data(), zeros.size()));
  }
  return writer.end_tensor();
}

}  // namespace

Status export_bundle(const fs::path& checkpoint, const fs::path& out, const ExportOptions& options,
                     ExportReport* report) {
  const auto start = std::chrono::steady_clock::now();
  PETREL_ASSIGN_OR_RETURN(LlamaConfig c, load_llama_config(checkpoint));
  PETREL_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, SafetensorsCheckpoint::open(checkpoint));
  // The backend is recorded in dialog.engine.backend.type and picks the runtime's backend when none is asked
  // for. The CUDA GEMV reads GPTQ tensors in place (a CPU bundle's padded qweight rows are compacted as they
  // upload); it reads neither act-order (g_idx) checkpoints nor other bit widths than 4 (layers) and 8 (head).
  if (options.backend == BundleBackend::kCuda && c.quantization && c.quantization->desc_act) {
    return unsupported(checkpoint.string() + ": --backend cuda: the CUDA GEMV does not read act-order (desc_act) GPTQ "
                       "checkpoints; export it with --backend cpu");
  }
  if (options.context_length <= 0 || options.context_length > c.max_position_embeddings) {
    return invalid_argument("--context-length " + std::to_string(options.context_length) + " must be in [1, " +
                            std::to_string(c.max_position_embeddings) + "] (max_position_embeddings)");
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !options.force) return invalid_argument(out.string() + ": already exists (pass --force to replace it)");

  // Validation: a quantized checkpoint must carry a passing report from `petrel validate`.
  ojson validation;
  const fs::path validation_path = checkpoint / "validation.json";
  if (fs::exists(validation_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(validation_path));
    validation = ojson::parse(text, nullptr, false);
    if (validation.is_discarded()) return invalid_data(validation_path.string() + ": not valid JSON");
  }
  if (c.quantization && !options.force) {
    if (validation.is_null()) {
      return invalid_argument(checkpoint.string() + " has no validation.json: run `petrel validate --checkpoint " +
                              checkpoint.string() + " --reference FLOAT_DIR` first (or pass --force)");
    }
    if (!validation.value("passed", false)) {
      std::string why;
      for (const auto& f : validation.value("failures", ojson::array())) why += "\n  " + f.get<std::string>();
      return invalid_argument(checkpoint.string() + ": validation failed; refusing to export (pass --force to override):" + why);
    }
  }

  // Group tensors: embedding, one group per layer, then final norm and LM head.
  const int64_t n_layers = c.num_hidden_layers;
  std::vector<std::vector<std::string>> groups(n_layers + 2);
  for (const std::string& name : ckpt.tensor_names()) {
    if (name.rfind("model.embed_tokens.", 0) == 0) {  // the float table, or a quantized one's GPTQ tensors
      groups[0].push_back(name);
    } else if (name.rfind("model.layers.", 0) == 0) {
      const size_t dot = name.find('.', 13);
      int64_t layer = -1;
      try {
        layer = std::stoll(name.substr(13, dot - 13));
      } catch (...) {
      }
      if (layer < 0 || layer >= n_layers) return invalid_data(checkpoint.string() + ": tensor '" + name + "' names no layer of the model");
      groups[1 + layer].push_back(name);
    } else if (name == "model.norm.weight" || name.rfind("lm_head.", 0) == 0) {
      groups[n_layers + 1].push_back(name);
    } else {
      return invalid_data(checkpoint.string() + ": unexpected tensor '" + name + "' (not part of a Llama model)");
    }
  }
  std::vector<uint64_t> group_bytes;
  for (const auto& g : groups) {
    uint64_t bytes = 0;
    for (const auto& name : g) bytes += ckpt.tensor(name)->num_bytes;
    group_bytes.push_back(bytes);
  }
  PETREL_ASSIGN_OR_RETURN(std::vector<size_t> starts, balance_parts(group_bytes, options.parts));

  PETREL_ASSIGN_OR_RETURN(auto staging, StagingDirectory::create(out));
  const fs::path tmp = staging->path();

  uint64_t total = 0;
  for (uint64_t b : group_bytes) total += b;
  ProgressBar progress("export", static_cast<double>(total), options.show_progress);
  uint64_t done = 0;
  BundleConfig config;
  ojson parts_json = ojson::array();
  std::vector<uint64_t> part_bytes;
  const int n_parts = options.parts;
  for (int p = 0; p < n_parts; ++p) {
    const size_t first = starts[p], last = p + 1 < n_parts ? starts[p + 1] : groups.size();
    const std::string file = bundle_part_file_name(p + 1, n_parts);
    PETREL_ASSIGN_OR_RETURN(auto writer, BundlePartWriter::create(tmp / file, p + 1, n_parts,
                                                                  {{"petrel_version", PETREL_VERSION}}));
    size_t tensors = 0;
    for (size_t g = first; g < last; ++g) {
      for (const std::string& name : groups[g]) {
        PETREL_ASSIGN_OR_RETURN(TensorView v, ckpt.tensor(name));
        PETREL_RETURN_IF_ERROR(write_bundle_tensor(*writer, v, options.backend));
        ckpt.release(v);
        done += v.num_bytes;
        ++tensors;
        progress.update(static_cast<double>(done), file);
      }
    }
    PETREL_RETURN_IF_ERROR(writer->finish());
    const uint64_t size = fs::file_size(tmp / file, ec);
    part_bytes.push_back(size);
    parts_json.push_back({{"file", file}, {"bytes", size}, {"tensors", tensors},
                          {"groups", {{"first", first == 0 ? "embedding" : "layer " + std::to_string(first - 1)},
                                      {"last", last == groups.size() ? "lm_head" : "layer " + std::to_string(last - 2)}}}});
    config.ctx_bins.push_back(file);
    if (options.on_part_written) options.on_part_written(p + 1);
  }

  // Tokenizer files and the model's own config.
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!fs::exists(checkpoint / file, ec)) {
      if (std::string(file) == "tokenizer.json") return not_found((checkpoint / file).string() + ": the bundle needs the tokenizer");
      continue;
    }
    fs::copy_file(checkpoint / file, tmp / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return io_error("cannot copy " + (checkpoint / file).string() + ": " + ec.message());
  }
  fs::copy_file(checkpoint / "config.json", tmp / kBundleModelConfig, fs::copy_options::overwrite_existing, ec);
  if (ec) return io_error("cannot copy config.json: " + ec.message());

  config.context.size = options.context_length;
  config.context.n_vocab = c.vocab_size;
  config.context.bos_token = c.bos_token_id;
  config.context.eos_tokens = c.eos_token_ids;
  // Genie's Llama 3.1 8B sampler settings.
  config.sampler.seed = 42;
  config.sampler.temp = 0.8;
  config.sampler.top_k = 40;
  config.sampler.top_p = 0.95;
  config.tokenizer_path = "tokenizer.json";
  if (fs::exists(tmp / "tokenizer_config.json", ec)) config.tokenizer_config_path = "tokenizer_config.json";
  config.backend = options.backend;
  config.rope_dim = c.head_dim / 2;
  config.rope = c.rope;
  config.architecture = bundle_architecture_from(c);
  PETREL_RETURN_IF_ERROR(write_bundle_config(config, tmp));

  ojson manifest;
  manifest["petrel_version"] = PETREL_VERSION;
  manifest["created"] = utc_now();
  PETREL_ASSIGN_OR_RETURN(std::string fingerprint, checkpoint_fingerprint(checkpoint, ckpt));
  manifest["source"] = {{"checkpoint", fs::absolute(checkpoint).lexically_normal().string()}, {"fingerprint", fingerprint}};
  ojson recipe = c.quantization ? ojson::parse(c.quantization->raw.dump()) : ojson{{"quant_method", "none"}};
  manifest["recipe"] = recipe;
  manifest["validation"] = validation.is_null() ? ojson("not run") : validation;
  manifest["backend"] = bundle_backend_name(options.backend);
  manifest["layout"] = options.backend == BundleBackend::kCpu
                           ? "GPTQ v1 tensors (qweight/qzeros/scales/g_idx) and float tensors as stored in the checkpoint, "
                             "qweight with word rows padded for the CPU kernels (layout padded_rows) where that is faster"
                           : "plain: GPTQ v1 tensors (qweight/qzeros/scales/g_idx) and float tensors as stored in the "
                             "checkpoint (read in place)";
  manifest["context_length"] = options.context_length;
  manifest["parts"] = parts_json;
  PETREL_RETURN_IF_ERROR(write_file_atomic(tmp / "manifest.json", manifest.dump(2) + "\n"));

  PETREL_RETURN_IF_ERROR(staging->commit());
  progress.finish(out.string());
  if (report) {
    report->part_bytes = part_bytes;
    report->total_bytes = 0;
    for (uint64_t b : part_bytes) report->total_bytes += b;
    report->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return ok_status();
}

}  // namespace petrel
