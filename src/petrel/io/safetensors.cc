#include "petrel/io/safetensors.h"

#include <algorithm>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace petrel {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A header larger than this is not a plausible checkpoint (the 8B model's header is ~30 KB).
static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

float TensorView::element(int64_t i) const {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    default: return 0.0f;
  }
}

Result<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  SafetensorsFile file;
  PETREL_ASSIGN_OR_RETURN(file.map_, MappedFile::open(path));
  const std::string where = path.string();
  const uint64_t size = file.map_.size();
  if (size < 8) return invalid_data(where + ": " + std::to_string(size) + " bytes, too short for a safetensors header");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file.map_.data()[i];
  if (header_len > kMaxHeaderBytes || header_len > size - 8) {
    return invalid_data(where + ": header length " + std::to_string(header_len) + " exceeds the file (" +
                        std::to_string(size) + " bytes): truncated or not a safetensors file");
  }
  const char* header_begin = reinterpret_cast<const char*>(file.map_.data() + 8);
  json header = json::parse(header_begin, header_begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return invalid_data(where + ": header is not a JSON object");
  }
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_size = size - data_begin;
  const uint8_t* data = file.map_.data() + data_begin;

  struct Span {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return invalid_data(where + ": __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) return invalid_data(where + ": __metadata__['" + m.key() + "'] is not a string");
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = where + ": tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return invalid_data(what + ": entry needs dtype, shape and data_offsets");
    }
    const json& jdtype = entry["dtype"];
    const json& jshape = entry["shape"];
    const json& joffsets = entry["data_offsets"];
    if (!jdtype.is_string()) return invalid_data(what + ": dtype is not a string");
    auto dtype = dtype_from_name(jdtype.get<std::string>());
    if (!dtype) return unsupported(what + ": dtype " + jdtype.get<std::string>() + " is not supported");
    if (!jshape.is_array()) return invalid_data(what + ": shape is not an array");
    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    uint64_t elements = 1;
    for (const json& d : jshape) {
      if (!d.is_number_unsigned()) return invalid_data(what + ": shape " + jshape.dump() + " has a non-integer or negative dimension");
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / 8 / dim) {
        return invalid_data(what + ": shape " + jshape.dump() + " overflows");
      }
      elements *= dim;
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    if (!joffsets.is_array() || joffsets.size() != 2 || !joffsets[0].is_number_unsigned() ||
        !joffsets[1].is_number_unsigned()) {
      return invalid_data(what + ": data_offsets must be two non-negative integers");
    }
    uint64_t begin = joffsets[0].get<uint64_t>(), end = joffsets[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return invalid_data(what + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                          "] outside the data region of " + std::to_string(data_size) + " bytes (truncated file?)");
    }
    uint64_t expected = elements * dtype_size(*dtype);
    if (end - begin != expected) {
      return invalid_data(what + ": " + std::to_string(end - begin) + " bytes stored, but " +
                          std::string(dtype_name(*dtype)) + " " + shape_to_string(view.shape) + " needs " +
                          std::to_string(expected));
    }
    view.data = data + begin;
    view.num_bytes = end - begin;
    spans.push_back({begin, end, file.tensors_.size()});
    file.tensors_.push_back(std::move(view));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return invalid_data(where + ": tensors '" + file.tensors_[spans[i - 1].tensor].name + "' and '" +
                          file.tensors_[spans[i].tensor].name + "' overlap");
    }
  }
  for (size_t i = 0; i < file.tensors_.size(); ++i) file.index_[file.tensors_[i].name] = i;
  return file;
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// A shard name from an index must be a plain file name inside the checkpoint directory.
static bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name != "." && name != "..";
}

Result<SafetensorsCheckpoint> SafetensorsCheckpoint::open(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    if (fs::exists(dir, ec)) return invalid_argument(dir.string() + ": expected a checkpoint directory, found a file");
    return not_found(dir.string() + ": no such checkpoint directory");
  }
  SafetensorsCheckpoint ckpt;
  ckpt.dir_ = dir;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    PETREL_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
    json index = json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return invalid_data(index_path.string() + ": not a JSON object with a weight_map");
    }
    std::map<std::string, size_t> file_index;
    std::vector<std::pair<std::string, std::string>> entries;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) return invalid_data(index_path.string() + ": weight_map['" + it.key() + "'] is not a string");
      std::string shard = it.value().get<std::string>();
      if (!is_plain_file_name(shard)) {
        return invalid_data(index_path.string() + ": shard name '" + shard + "' leaves the checkpoint directory");
      }
      if (!file_index.count(shard)) {
        PETREL_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir / shard));
        file_index[shard] = ckpt.files_.size();
        ckpt.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
      }
      const SafetensorsFile& f = *ckpt.files_[file_index[shard]];
      const TensorView* view = f.find(it.key());
      if (!view) {
        return invalid_data(index_path.string() + ": tensor '" + it.key() + "' is mapped to " + shard +
                            ", which does not contain it");
      }
      ckpt.location_[it.key()] = view;
    }
    return ckpt;
  }
  fs::path single = dir / "model.safetensors";
  if (!fs::exists(single, ec)) {
    std::vector<fs::path> candidates;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") candidates.push_back(e.path());
    if (candidates.size() != 1) {
      return not_found(dir.string() + ": no model.safetensors or model.safetensors.index.json" +
                       (candidates.empty() ? std::string() : " (and several *.safetensors files without an index)"));
    }
    single = candidates[0];
  }
  PETREL_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single));
  ckpt.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
  for (const TensorView& view : ckpt.files_[0]->tensors()) ckpt.location_[view.name] = &view;
  return ckpt;
}

Result<TensorView> SafetensorsCheckpoint::tensor(const std::string& name) const {
  auto it = location_.find(name);
  if (it == location_.end()) return not_found(dir_.string() + ": tensor '" + name + "' is missing");
  return *it->second;
}

Result<TensorView> SafetensorsCheckpoint::tensor(const std::string& name,
                                                 const std::vector<int64_t>& expected_shape) const {
  PETREL_ASSIGN_OR_RETURN(TensorView view, tensor(name));
  if (view.shape != expected_shape) {
    return invalid_data(dir_.string() + ": tensor '" + name + "' has shape " + shape_to_string(view.shape) +
                        ", expected " + shape_to_string(expected_shape));
  }
  return view;
}

std::vector<std::string> SafetensorsCheckpoint::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, view] : location_) names.push_back(name);
  return names;
}

void SafetensorsCheckpoint::release(const TensorView& view) const {
  for (const auto& f : files_) f->map().release(view.data, view.num_bytes);
}

uint64_t SafetensorsCheckpoint::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, view] : location_) total += view->num_bytes;
  return total;
}

}  // namespace petrel
